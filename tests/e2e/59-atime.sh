#!/usr/bin/env bash
# 59-atime: access times as ext4 keeps them under relatime (docs/SEMANTICS.md, "atime").
#   - reading a file written since its last read moves atime to now (`stat` after `cat`
#     shows it at once, warm or through passthrough); a second read does not move it;
#   - a write, then a read, moves it again; an atime older than a day moves at the next
#     read whatever mtime says;
#   - a listing moves a changed directory's atime;
#   - O_NOATIME reads and opens for writing only leave it;
#   - `touch -a -d` sets it and stands, even just after a read queued an update;
#   - it survives unmount and mount;
#   - `--atime noatime` never moves it; `--atime strictatime` is refused with one line.
# e2e-timeout: 300
source "$(dirname "$0")/../lib.sh"
need_deskfs

NAME=atime
ws_format "$NAME"
ws_mount "$NAME" "$MNT"

# atime and mtime of a path, ns, as `stat` sees them (the kernel's answer).
at() { python3 -c "import os,sys; print(os.stat(sys.argv[1]).st_atime_ns)" "$1"; }
mt() { python3 -c "import os,sys; print(os.stat(sys.argv[1]).st_mtime_ns)" "$1"; }
read_noatime() { python3 -c "
import os,sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOATIME)
os.read(fd, 1 << 20)
os.close(fd)" "$1"; }
live() { dfs status "$NAME" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['mounts'][0]['live']['$1'])"; }

F=$MNT/f
echo first > "$F"
a0=$(at "$F") m0=$(mt "$F")
sleep 1.1
cat "$F" > /dev/null
a1=$(at "$F")
((a1 > a0 && a1 > m0)) || fail "a read after a write left atime at $a1 (was $a0, mtime $m0)"
log "read after write: atime moved by $(((a1 - a0) / 1000000)) ms"

sleep 1.1
cat "$F" > /dev/null
assert_eq "$(at "$F")" "$a1" "atime after a second read (relatime: read since the last change)"

echo more >> "$F"
sleep 1.1
cat "$F" > /dev/null
a2=$(at "$F") m2=$(mt "$F")
((a2 > m2)) || fail "a read after an append left atime ($a2) not later than mtime ($m2)"

touch -a -d '3 days ago' "$F"
old=$(at "$F")
((old < a2 - 86400 * 1000000000)) || fail "touch -a -d '3 days ago' gave atime $old"
cat "$F" > /dev/null
a3=$(at "$F")
((a3 > a2)) || fail "an atime 3 days old did not move at a read ($a3)"

log "O_NOATIME reads and write-only opens leave atime"
echo again >> "$F"
sleep 1.1
a4=$(at "$F")
read_noatime "$F"
echo more >> "$F"
assert_eq "$(at "$F")" "$a4" "atime after an O_NOATIME read and an append"

log "an explicit atime stands over a read queued just before it"
for i in $(seq 1 10); do
  echo "$i" >> "$F"
  cat "$F" > /dev/null
  touch -a -d '2020-01-02 03:04:05' "$F"
done
sleep 0.5
assert_eq "$(at "$F")" "$(date -d '2020-01-02 03:04:05' +%s)000000000" "atime after touch -a -d just after reads"

log "a listing moves a changed directory's atime"
mkdir "$MNT/d"
touch "$MNT/d/x"
da0=$(at "$MNT/d") dm0=$(mt "$MNT/d")
sleep 1.1
ls "$MNT/d" > /dev/null
da1=$(at "$MNT/d")
((da1 > da0 && da1 > dm0)) || fail "ls of a changed directory left its atime at $da1 (was $da0, mtime $dm0)"

log "cold and warm files from a new mount"
head -c 3000000 /dev/urandom > "$MNT/big"
ws_umount "$MNT"
ws_mount "$NAME" "$MNT"
assert_eq "$(at "$MNT/d")" "$da1" "directory atime after unmount and mount"
assert_eq "$(at "$F")" "$(date -d '2020-01-02 03:04:05' +%s)000000000" "file atime after unmount and mount"
b0=$(at "$MNT/big")
sleep 1.1
sha "$MNT/big" > /dev/null
b1=$(at "$MNT/big")
((b1 > b0)) || fail "a cold read of a file never read left its atime at $b1"
committed=$(live atime_committed)
((committed >= 1)) || fail "status counts $committed committed access times"
grep -q "atime         relatime" <<< "$(dfs status "$NAME")" || fail "status has no atime line: $(dfs status "$NAME")"
ws_umount "$MNT"

log "reads from the kernel's page cache (no passthrough) show the new atime at once"
ws_mount "$NAME" "$MNT" --no-passthrough
for i in 1 2 3; do
  echo "page cache $i" >> "$MNT/pc"
  cat "$MNT/pc" > /dev/null   # pages now in the kernel's cache
  p0=$(at "$MNT/pc") pm=$(mt "$MNT/pc")
  sleep 1.1
  at "$MNT/pc" > /dev/null    # attributes cached again
  cat "$MNT/pc" > /dev/null
  echo x >> "$MNT/pc"; sleep 1.1; at "$MNT/pc" > /dev/null
  cat "$MNT/pc" > /dev/null
  p1=$(at "$MNT/pc") pm1=$(mt "$MNT/pc")
  ((p1 > pm1)) || fail "after a read served from the page cache, stat shows atime $p1 not later than mtime $pm1"
done
ws_umount "$MNT"

log "--atime noatime"
ws_mount "$NAME" "$MNT" --atime noatime
n0=$(at "$F")
echo changed >> "$F"
sleep 1.1
cat "$F" > /dev/null
ls "$MNT/d" > /dev/null
assert_eq "$(at "$F")" "$n0" "atime under noatime after a write and a read"
assert_eq "$(at "$MNT/d")" "$da1" "directory atime under noatime after ls"
grep -q "atime         noatime" <<< "$(dfs status "$NAME")" || fail "status does not say noatime: $(dfs status "$NAME")"
ws_umount "$MNT"

log "bad --atime: one line, non-zero, nothing mounted"
rc=0
dfs mount "$NAME" "$MNT" --atime strictatime > "$T/bad.out" 2>&1 || rc=$?
((rc != 0)) || fail "--atime strictatime was accepted"
grep -q "relatime" "$T/bad.out" || fail "the refusal does not name the accepted modes: $(cat "$T/bad.out")"
not_mounted "$MNT" || fail "a refused --atime left a mount"
log "refused: $(grep -m1 -i error "$T/bad.out")"
log "PASS"
