#!/usr/bin/env bash
# 50-crash-kill9: durability across kill -9 of the daemon (DESIGN: "what fsync acknowledged
# survives kill -9 of the daemon; what close returned survives kill -9 of the daemon").
# A workspace on the test's store (DESKFS_E2E_STORE, tests/store.sh: S3 by default; 50z/50g
# on Azure/GCS emulators) is mounted with --foreground (its PID is the daemon); a writer creates
# files that are fsynced and still open, fsynced and closed, only closed, overwritten,
# appended, in new subdirs; right after the writer reports, the daemon gets SIGKILL (no
# grace time for uploads). The dead mount is removed with fusermount3 -u, the workspace is
# remounted with the same cache dir: every such file has its exact content; after
# `deskfs sync` the bucket has them all (store_obj_eq: rclone cat on S3).
# On SQLite the first daemon runs with a 60 s commit window, and the writer's last
# burst (60 closed files, a rename, an unlink, a chmod) comes after its last fsync: at the
# kill those requests exist only in the metadata redo log (checked: `<db>-redo` is not
# empty), so the remount shows that replaying it loses nothing close returned.
# e2e-cost: 51
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_store

NAME=crash
CACHE=$T/cache
ws_format "$NAME" --bucket "$(store_url)"
REDO=$DESKFS_HOME/workspaces/$NAME/meta.db-redo
export DESKFS_COMMIT_WINDOW_MS=60000
# uploads held back (sync still drives them): no upload's delete barrier commits the window
ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE" --upload-delay-ms 3600000
unset DESKFS_COMMIT_WINDOW_MS
DAEMON=$FG_PID
log "daemon pid $DAEMON"

# a file uploaded long before the crash, to check that nothing old is lost either
echo "written before" > "$MNT/old.txt"
ws_sync "$NAME"

EXP=$T/expected
mkdir -p "$EXP"
cat > "$T/writer.py" <<'PY'
import os, sys, time
mnt, exp = sys.argv[1], sys.argv[2]
held = []
def put(rel, data, fsync, close=True):
    for root in (mnt, exp):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    fd = os.open(os.path.join(mnt, rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(data)
    while view:                      # several write() calls for the big ones
        n = os.write(fd, view[:256 * 1024])
        view = view[n:]
    if fsync:
        os.fsync(fd)
    if close:
        os.close(fd)
    else:
        held.append(fd)
    with open(os.path.join(exp, rel), "wb") as f:
        f.write(data)
sizes = [0, 1, 4096, 100_000, 1 << 20, 5 << 20]
for i, sz in enumerate(sizes):
    put(f"fsync-open/f{i}.bin", os.urandom(sz), fsync=True, close=False)
    put(f"fsync-closed/f{i}.bin", os.urandom(sz), fsync=True)
    put(f"closed/f{i}.bin", os.urandom(sz), fsync=False)
for i in range(50):
    put(f"closed/many/small{i:02d}.txt", f"small file {i}\n".encode() * (i + 1), fsync=False)
# overwritten: the last closed version must win
put("closed/overwritten.txt", b"first version\n" * 1000, fsync=False)
put("closed/overwritten.txt", b"second version\n", fsync=False)
# appended after close
put("closed/appended.txt", b"line 1\n", fsync=False)
with open(os.path.join(mnt, "closed/appended.txt"), "ab") as f:
    f.write(b"line 2\n")
with open(os.path.join(exp, "closed/appended.txt"), "ab") as f:
    f.write(b"line 2\n")
# fsynced directory entry in a new deep dir
put("fsync-closed/deep/er/dir/file.txt", b"deep\n", fsync=True)
dfd = os.open(os.path.join(mnt, "fsync-closed/deep/er/dir"), os.O_RDONLY)
os.fsync(dfd)
os.close(dfd)
# after the last fsync: requests only a commit window (and its redo log) holds at the kill
for i in range(60):
    put(f"closed/burst/b{i:02d}.txt", f"burst {i}\n".encode() * (i + 1), fsync=False)
os.rename(os.path.join(mnt, "closed/burst/b00.txt"), os.path.join(mnt, "closed/burst/renamed.txt"))
os.rename(os.path.join(exp, "closed/burst/b00.txt"), os.path.join(exp, "closed/burst/renamed.txt"))
os.unlink(os.path.join(mnt, "closed/burst/b01.txt"))
os.unlink(os.path.join(exp, "closed/burst/b01.txt"))
os.chmod(os.path.join(mnt, "closed/burst/b02.txt"), 0o600)
print("READY", flush=True)
time.sleep(3600)   # keep the fsync-open files open until killed
PY
python3 "$T/writer.py" "$MNT" "$EXP" > "$T/writer.out" 2> "$T/writer.log" &
WRITER=$!
register_pid "$WRITER"
writer_done() { grep -q READY "$T/writer.out" || ! pid_running "$WRITER"; }
wait_for 300 writer_done || fail "writer did not finish within 300 s: $(tail -n 20 "$T/writer.log")"
grep -q READY "$T/writer.out" || fail "writer failed on the mount: $(tail -n 20 "$T/writer.log")"
echo "written before" > "$EXP/old.txt"

if [[ ${DESKFS_E2E_META:-sqlite} == sqlite ]]; then
  [[ -s $REDO ]] || fail "the burst after the last fsync is not in the metadata redo log $REDO (commit windows off?)"
  log "redo log before the kill: $(stat -c %s "$REDO") bytes"
fi
log "kill -9 of the daemon $DAEMON"
kill -KILL "$DAEMON"
wait "$DAEMON" 2> /dev/null || true
kill -KILL "$WRITER" 2> /dev/null || true
wait "$WRITER" 2> /dev/null || true

is_mounted "$MNT" || log "note: $MNT vanished from the mount table by itself"
if is_mounted "$MNT"; then
  timeout 20 fusermount3 -u "$MNT" > "$T/fusermount.out" 2>&1 || {
    log "fusermount3 -u of the dead mount failed ($(cat "$T/fusermount.out")), forcing"
    force_unmount "$MNT" || fail "cannot remove the dead mount $MNT"
  }
fi

log "remount with the same cache dir"
ws_mount "$NAME" "$MNT" --cache-dir "$CACHE"
n=0
while IFS= read -r -d '' f; do
  rel=${f#"$EXP"/}
  [[ -f $MNT/$rel ]] || fail "after kill -9 + remount: $rel is missing"
  assert_file_eq "$f" "$MNT/$rel" "after kill -9 + remount: $rel"
  n=$((n + 1))
done < <(find "$EXP" -type f -print0)
log "all $n files intact after kill -9 + remount"
[[ -e $MNT/closed/burst/b00.txt || -e $MNT/closed/burst/b01.txt ]] && fail "after kill -9 + remount: the burst's rename or unlink was undone"
[[ $(stat -c %a "$MNT/closed/burst/b02.txt") == 600 ]] || fail "after kill -9 + remount: the burst's chmod was lost (mode $(stat -c %a "$MNT/closed/burst/b02.txt"))"

ws_sync "$NAME"
log "checking the bucket"
store_keys > "$T/keys"
while IFS= read -r -d '' f; do
  rel=${f#"$EXP"/}
  if [[ -s $f ]]; then
    store_obj_eq "$rel" "$f"
  else
    grep -qxF "0	$(store_key "$rel")" "$T/keys" || fail "zero-length object $(store_key "$rel") missing"
  fi
done < <(find "$EXP" -type f -print0)
ws_umount "$MNT"

log "PASS"
