#!/usr/bin/env bash
# 97-passthrough: FUSE passthrough on a real mount over S3. A lone mount serves local
# content through passthrough: random writes, an append, a shared mmap write and reads
# reach no daemon handler (the daemon's own request counters say so), yet `stat` shows
# the new size before close, close commits, and the bucket gets the exact bytes. Then
# kill -9 of the daemon while a process holds a passthrough file open for writing and
# writes after the crash, while a new mount of the workspace syncs: once the holder
# closed it, what the mount shows and what the bucket holds are the same bytes (no clean
# row over changed content). A file read whole from the bucket after a remount with an
# empty cache becomes a local copy: read again (page cache dropped), no read request
# reaches the daemon. A second mount of the workspace makes new opens go through the daemon.
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3

NAME=pt
CACHE=$T/cache
ws_format "$NAME" --bucket "$(s3_url)"
ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
DAEMON=$FG_PID

# requests KIND...: how many requests of these kinds the daemon served so far.
requests() {
  dfs status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
live = [m["live"] for w in d["workspaces"] for m in w["mounts"] if m.get("live")]
kinds = set(sys.argv[1:])
print(sum(r["count"] for l in live for r in l["requests"] if r["op"] in kinds))' "$@"
}
passthrough_on() {
  dfs status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(any(m["live"].get("passthrough") for w in d["workspaces"] for m in w["mounts"] if m.get("live")))'
}
[[ $(passthrough_on) == True ]] || fail "passthrough is not on for a lone mount as root (status: $(dfs status --json | head -c 600))"

log "writes, an append, an mmap write and reads through passthrough"
before=$(requests read write)
python3 - "$MNT" "$T" <<'PY' || fail "passthrough workload failed"
import mmap, os, random, sys
mnt, t = sys.argv[1], sys.argv[2]
rnd = random.Random(97)
data = bytearray(os.urandom(1 << 20))
fd = os.open(f"{mnt}/rand.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, data)
for _ in range(500):
    off = rnd.randrange(0, len(data) - 4096)
    blk = os.urandom(4096)
    os.pwrite(fd, blk, off)
    data[off:off + 4096] = blk
assert os.pread(fd, len(data), 0) == bytes(data), "read back through the same fd"
os.pwrite(fd, b"tail", len(data))          # grows the file before close
data += b"tail"
size = os.stat(f"{mnt}/rand.bin").st_size
assert size == len(data), f"stat before close: {size} != {len(data)}"
os.fsync(fd)
os.close(fd)
with open(f"{mnt}/log.txt", "a") as f:
    f.write("line 1\n")
with open(f"{mnt}/log.txt", "a") as f:
    f.write("line 2\n")
fd = os.open(f"{mnt}/mapped.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, 8192)
m = mmap.mmap(fd, 8192)
m[100:105] = b"hello"
m.flush()
m.close()
os.close(fd)
open(f"{t}/rand.exp", "wb").write(bytes(data))
open(f"{t}/log.exp", "w").write("line 1\nline 2\n")
exp = bytearray(8192); exp[100:105] = b"hello"
open(f"{t}/mapped.exp", "wb").write(bytes(exp))
PY
after=$(requests read write)
assert_eq "$((after - before))" 0 "read/write requests the daemon served for passthrough files"
for f in rand log mapped; do
  ext=bin; [[ $f == log ]] && ext=txt
  assert_file_eq "$T/$f.exp" "$MNT/$f.$ext" "content through the mount"
done
ws_sync "$NAME"
assert_obj_eq rand.bin "$T/rand.exp"
assert_obj_eq log.txt "$T/log.exp"
assert_obj_eq mapped.bin "$T/mapped.exp"

log "kill -9 of the daemon while a process holds a passthrough file open for writing"
python3 - "$MNT" "$T" > "$T/holder.out" 2> "$T/holder.err" <<'PY' &
import os, sys, time
mnt, t = sys.argv[1], sys.argv[2]
fd = os.open(f"{mnt}/held.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"A" * 10000)
os.fsync(fd)
print("READY", flush=True)
while not os.path.exists(f"{t}/remounted"):
    time.sleep(0.05)
time.sleep(1)                              # the new mount's sync is under way
try:
    os.pwrite(fd, b"B" * 100, 0)           # the daemon died; the kernel still writes
    print("LATE-WRITE-OK", flush=True)
except OSError as e:
    print(f"LATE-WRITE-{e.errno}", flush=True)
time.sleep(0.5)
os.close(fd)
PY
HOLDER=$!
register_pid "$HOLDER"
wait_for 30 grep -q READY "$T/holder.out" || fail "holder did not start: $(cat "$T/holder.err")"
kill -KILL "$DAEMON"
wait "$DAEMON" 2> /dev/null || true
if is_mounted "$MNT"; then
  # (busy: the holder keeps a file of it open) detached, as an operator would
  timeout 20 fusermount3 -u "$MNT" > /dev/null 2>&1 || timeout 20 fusermount3 -uz "$MNT" > /dev/null 2>&1 \
    || force_unmount "$MNT" || fail "cannot remove the dead mount"
fi
ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
DAEMON=$FG_PID
# The holder writes through the dead mount's backing file while this sync runs: the
# staging file must not be taken as final (and marked clean) before the holder closes it.
: > "$T/remounted"
ws_sync "$NAME"
wait "$HOLDER" 2> /dev/null || true
log "holder: $(tr '\n' ' ' < "$T/holder.out")"
cp "$MNT/held.bin" "$T/held.now"
head -c 100 "$T/held.now" | tr -d 'AB' | wc -c | grep -qx 0 || fail "held.bin holds bytes nobody wrote"
if grep -q LATE-WRITE-OK "$T/holder.out"; then
  [[ $(head -c 1 "$T/held.now") == B ]] || fail "the write made after the crash is not in held.bin"
fi
[[ $(stat -c %s "$T/held.now") == 10000 ]] || fail "held.bin is $(stat -c %s "$T/held.now") bytes, not 10000"
ws_sync "$NAME"
assert_obj_eq held.bin "$T/held.now"
assert_obj_eq rand.bin "$T/rand.exp"

log "a file read whole from the bucket: later opens are served through passthrough"
head -c $((8 << 20)) /dev/urandom > "$T/big.exp"
cp "$T/big.exp" "$MNT/big.bin"
ws_sync "$NAME"
ws_umount "$MNT"
ws_mount_fg "$NAME" "$MNT" --cache-dir "$T/cache-cold"
DAEMON=$FG_PID
adopted() {
  dfs status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(sum(m["live"].get("cache_fills_adopted", 0) for w in d["workspaces"] for m in w["mounts"] if m.get("live")))'
}
one_adopted() { (( $(adopted) >= 1 )); }
before=$(requests read)
cat "$MNT/big.bin" > "$T/big.got"
cmp -s "$T/big.exp" "$T/big.got" || fail "big.bin read cold differs from what was written"
(( $(requests read) > before )) || fail "the cold read did not go through the daemon"
wait_for 30 one_adopted || fail "the file read whole did not become a local copy (status: $(dfs status --json | head -c 800))"
sync; echo 3 > /proc/sys/vm/drop_caches   # no page cache left to serve the next read
before=$(requests read)
cmp -s "$T/big.exp" "$MNT/big.bin" || fail "big.bin read again differs"
assert_eq "$(( $(requests read) - before ))" 0 "read requests the daemon served for a file read whole before"

log "a second mount: new opens are served by the daemons"
ws_mount "$NAME" "$T/mnt2" --cache-dir "$T/cache2"
before=$(requests write)
printf 'shared\n' > "$MNT/shared.txt"
after=$(requests write)
((after > before)) || fail "with a second mount live, a write did not reach the daemon (passthrough while shared)"
assert_eq "$(cat "$T/mnt2/shared.txt")" "shared" "close-to-open to the second mount"
ws_umount "$T/mnt2"
ws_umount "$MNT"
log "PASS"
