#!/usr/bin/env bash
# 82f-fsync-errors: a failed device flush is never swallowed ("fsyncgate"). deskfs's home
# and cache dir live on the power-loss file system (crates/lossfs), which can make the
# next N fsyncs of matching files fail with EIO and drop their unsynced data, as Linux
# does after a writeback error (a later fsync then succeeds without that data).
#   1. A staging file's fdatasync fails: the fsync gets EIO, and so does every later fsync
#      of that file, through the same and through a new descriptor (lossfs would answer
#      them with success); `deskfs status` names the file; other files fsync as usual;
#      the file stays dirty. Truncated to zero and rewritten, it fsyncs again.
#   2. The metadata log's flush fails: that fsync gets EIO; the next one commits and
#      flushes the database's WAL instead, and succeeds.
#   3. kill -9 + power cut: every fsync that returned 0 kept its content.
# e2e-timeout: 300
source "$(dirname "$0")/../lib.sh"
need_deskfs

lossfs_start
ctl() { lossfs_ctl "$@"; }

export DESKFS_HOME=$LFS/home
mkdir -p "$DESKFS_HOME"
NAME=fsyncerr
ws_format "$NAME" --bucket "file://$T/bucket"
ctl sync > /dev/null || fail "lossfs sync failed"
CACHE=$LFS/cache
# Uploads would mark files clean under the test's feet: held back.
ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE" --upload-delay-ms 3600000
DAEMON=$FG_PID

# fsync_rc FILE MODE DATA: writes DATA to FILE (MODE: a = append, t = truncate) and
# fsyncs; prints the errno (0 on success).
fsync_rc() {
  python3 - "$1" "$2" "$3" << 'EOF'
import os, sys
path, mode, data = sys.argv[1], sys.argv[2], sys.argv[3].encode()
flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
fd = os.open(path, flags, 0o644)
try:
    os.write(fd, data)
    os.fsync(fd)
    print(0)
except OSError as e:
    print(e.errno)
finally:
    os.close(fd)
EOF
}

# 1. A staging file's flush fails.
assert_eq "$(fsync_rc "$MNT/a.txt" t 'one ')" 0 "the first fsync of a.txt"
ctl fail-fsync 'cache/staging/*' 1 > /dev/null || fail "lossfs fail-fsync"
assert_eq "$(fsync_rc "$MNT/a.txt" a 'two ')" 5 "the fsync whose staging flush failed"
python3 - "$MNT/a.txt" << 'EOF' || fail "a later fsync of a.txt through the same descriptor succeeded"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
os.write(fd, b"three ")
for i in range(2):
    try:
        os.fsync(fd)
        sys.exit(f"fsync {i} returned 0")
    except OSError as e:
        assert e.errno == 5, e
os.close(fd)
EOF
assert_eq "$(fsync_rc "$MNT/a.txt" a 'four ')" 5 "a later fsync of a.txt through a new descriptor"
assert_eq "$(fsync_rc "$MNT/b.txt" t 'bee')" 0 "another file's fsync"
st=$(dfs status)
grep -q "FSYNC FAILED  a.txt" <<< "$st" || fail "status does not name a.txt's failed flush: $st"
dfs status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
f = [x for w in d["workspaces"] for m in w["mounts"] for x in (m.get("live") or {}).get("flush_failures", [])]
assert [x["path"] for x in f] == ["a.txt"], f
assert f[0]["refused"] == 4, f
assert sum(w["dirty_files"] for w in d["workspaces"]) >= 2, "a.txt and b.txt stay dirty"
' || fail "status --json: the flush failure or the dirty files are missing"
# Truncated to zero and rewritten: nothing of the lost data is part of it any more.
assert_eq "$(fsync_rc "$MNT/a.txt" t 'five')" 0 "an fsync after the truncate to zero"
grep -q "FSYNC FAILED" <<< "$(dfs status)" && fail "status still lists a.txt after its truncate"
log "staging flush failure: EIO to that fsync and 3 later ones, status names the file; after O_TRUNC it fsyncs"

# 2. The metadata log's flush fails (the redo log or the WAL, whichever this fsync uses).
ctl fail-fsync 'home/*meta.db-*' 1 > /dev/null || fail "lossfs fail-fsync"
assert_eq "$(fsync_rc "$MNT/c.txt" t 'sea')" 5 "the fsync whose metadata flush failed"
assert_eq "$(fsync_rc "$MNT/c.txt" a '-more')" 0 "the next fsync (commits and flushes the WAL)"
assert_eq "$(fsync_rc "$MNT/d.txt" t 'dee')" 0 "a new file's fsync after that"
log "metadata flush failure: EIO to that fsync; the next ones commit through the WAL"

# 3. What returned 0 survives kill -9 and a power cut.
kill -KILL "$DAEMON"
wait "$DAEMON" 2> /dev/null || true
timeout 20 fusermount3 -u "$MNT" > /dev/null 2>&1 || force_unmount "$MNT" || fail "cannot remove the dead mount"
out=$(ctl cut) || fail "lossfs cut failed: $out"
rc=0
out=$(DFS_TIMEOUT=120 dfs fsck "$NAME" 2>&1) || rc=$?
((rc == 0)) && grep -q '\b0 problems' <<< "$out" || fail "deskfs fsck after the cut (exit $rc): $(head -c 1500 <<< "$out")"
ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
assert_eq "$(cat "$MNT/a.txt")" "five" "a.txt after the power cut"
assert_eq "$(cat "$MNT/b.txt")" "bee" "b.txt after the power cut"
assert_eq "$(cat "$MNT/c.txt")" "sea-more" "c.txt after the power cut"
assert_eq "$(cat "$MNT/d.txt")" "dee" "d.txt after the power cut"
kill -TERM "$FG_PID"
wait "$FG_PID" 2> /dev/null || true
log "PASS: failed flushes reach the caller as EIO and stay failed; fsynced files survive a power cut"
