#!/usr/bin/env bash
# 57-full-disk: the cache dir on a small file system (a 64 MiB tmpfs) that fills up.
#   - clean cached data makes room first: with 40 MiB of clean local copies (written,
#     then `deskfs sync`ed) on it, a 30 MiB write succeeds, evicting them;
#   - what cannot fit fails with ENOSPC ("No space left on device"), never EIO, and the
#     daemon keeps serving;
#   - nothing acknowledged is touched: every file written before reads back whole (the
#     evicted ones from the bucket), also fsynced again;
#   - when space returns (the half-written file removed) writes work again, and after
#     `deskfs sync` the bucket holds every file; `deskfs fsck` finds nothing.
# The metadata database stays on the normal disk (the workspace dir); the cache's
# free-space reserve on a 64 MiB file system is its 10 % minimum clamp (6.4 MiB).
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_deskfs

SMALL=$T/small
mkdir -p "$SMALL"
mount -t tmpfs -o size=64m deskfs-e2e-small "$SMALL" || skip "cannot mount a tmpfs (needs root)"
on_exit "umount -l '$SMALL'"

NAME=fulldisk
ws_format "$NAME"
# No upload before `deskfs sync`: dirty data stays dirty until the test says so.
ws_mount "$NAME" "$MNT" --cache-dir "$SMALL/cache" --upload-delay-ms 3600000
BUCKET=$DESKFS_HOME/workspaces/$NAME/bucket
free_mib() { df -m --output=avail "$SMALL" | tail -n 1 | tr -d ' '; }
live() { dfs status "$NAME" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['mounts'][0]['live']['$1'])"; }

for f in a:24 b:16 c:30 d:40 e:8; do
  head -c $((${f#*:} * 1024 * 1024)) /dev/urandom > "$T/${f%:*}"
done

log "24 + 16 MiB written and uploaded: clean local copies"
cp "$T/a" "$MNT/a"
cp "$T/b" "$MNT/b"
ws_sync "$NAME"
clean=$(live cache_clean_bytes)
((clean >= 40 << 20)) || fail "expected >= 40 MiB of clean local copies after sync, status says $clean bytes"
log "free on the cache file system: $(free_mib) MiB"

log "a 30 MiB write: room is made by evicting clean copies"
dd if="$T/c" of="$MNT/c" bs=1M conv=fsync status=none 2> "$T/dd-c.err" \
  || fail "the 30 MiB write failed although clean copies could be evicted: $(cat "$T/dd-c.err")"
assert_eq "$(sha "$T/c")" "$(sha "$MNT/c")" "content of c"
# Made by the uploader's eviction pass (every 100 ms while short of the reserve) or by a
# write that found the file system full (counted in cache_space_evictions): either way
# the clean copies went.
clean=$(live cache_clean_bytes)
((clean < 40 << 20)) || fail "the clean copies are all still there ($clean bytes) although the write needed their room"
log "free now: $(free_mib) MiB; clean copies left: $((clean >> 20)) MiB; writes that evicted: $(live cache_space_evictions)"

log "a 40 MiB write beside 30 MiB dirty: ENOSPC"
rc=0
dd if="$T/d" of="$MNT/d" bs=1M conv=fsync status=none 2> "$T/dd-d.err" || rc=$?
((rc != 0)) || fail "a 40 MiB write fitted on a 64 MiB file system holding 30 MiB of dirty data"
grep -q "No space left on device" "$T/dd-d.err" || fail "the write that did not fit failed otherwise than with ENOSPC: $(cat "$T/dd-d.err")"
! grep -qi "input/output" "$T/dd-d.err" || fail "EIO on a full disk: $(cat "$T/dd-d.err")"
log "refused as it should be: $(head -n 1 "$T/dd-d.err")"

log "everything acknowledged is intact; the mount keeps serving"
for f in a b c; do
  assert_eq "$(sha "$T/$f")" "$(sha "$MNT/$f")" "content of $f with the cache file system full"
done
python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDWR); os.fsync(fd); os.close(fd)' "$MNT/c" \
  || fail "fsync of c failed with the cache file system full"
out=$(dfs status "$NAME") || fail "status failed with the cache file system full"
log "status: $(grep -E '^ +(disk|cache) ' <<< "$out" | tr -s ' ')"

log "space returns: the half-written file removed, writes work again"
rm -f "$MNT/d"
freed() { (($(free_mib) >= 20)); }
wait_for 10 freed || fail "removing d freed no space: $(free_mib) MiB free"
cp "$T/e" "$MNT/e" || fail "a write after space returned failed"
ws_sync "$NAME"
for f in a b c e; do
  assert_eq "$(sha "$T/$f")" "$(sha "$BUCKET/$f")" "bucket object $f"
  assert_eq "$(sha "$T/$f")" "$(sha "$MNT/$f")" "content of $f at the end"
done
[[ ! -e $BUCKET/d ]] || fail "the removed half-written file reached the bucket"
ws_umount "$MNT"
out=$(dfs fsck "$NAME" --cache-dir "$SMALL/cache" 2>&1) || fail "fsck after a full disk: $out"
log "fsck: $(tail -n 1 <<< "$out")"
log "ok"
