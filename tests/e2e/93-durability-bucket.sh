#!/usr/bin/env bash
# 93-durability-bucket: `deskfs mount --durability bucket` acknowledges close and fsync
# only once the content is in the bucket (DESIGN: "Durability choice per mount").
# Run on Garage S3 and on the embedded default (a local bucket dir), each mounted with
# uploads held back (--upload-delay-ms 600000: nothing reaches the bucket in the
# background during the test, only what a durability wait uploads):
#   1. files written and closed (0 B, 1 B, 100 kB, 3 MiB): each object is in the bucket
#      with its exact content right after close returned (read with an S3 client / from
#      the bucket dir, not through deskfs); kill -9 of the daemon, rm -rf of its cache dir,
#      remount: every file reads back exactly;
#   2. files fsynced (and fdatasynced) while still open: in the bucket right after fsync
#      returned; kill -9 with them open, rm -rf the cache dir, remount: exact;
#   3. a rename and a delete in a directory, then fsync of the directory: the new key
#      holds the content, the old and the deleted keys are gone; kill -9, rm -rf the cache
#      dir, remount: the new name reads back, the old names are gone;
#   4. the contrast: the same workspace mounted --durability local (the default), a file
#      closed, checked at once: NOT in the bucket (so the checks above can fail); it is
#      after `deskfs sync`.
# `deskfs status --json` reports each mount's durability. Bad input: `--durability foo` is
# refused with one line naming both choices, nothing mounted.
# The metadata database stays (it lives in DESKFS_HOME; rebuilding a lost machine's
# metadata from the bucket is `deskfs attach --bucket`'s job, not tested here).
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd python3

HOLD=(--upload-delay-ms 600000)

log "bad input: --durability foo"
mkdir -p "$MNT"
rc=0
out=$("$DESKFS" mount nows "$MNT" --durability foo 2>&1 < /dev/null) || rc=$?
((rc != 0)) || fail "mount --durability foo succeeded"
(($(printf '%s\n' "$out" | wc -l) == 1)) || fail "mount --durability foo: not one line: $out"
grep -q 'foo' <<< "$out" && grep -q 'local' <<< "$out" && grep -q 'bucket' <<< "$out" ||
  fail "mount --durability foo: the message does not name the value and the choices: $out"
not_mounted "$MNT" || fail "mount --durability foo left something mounted"
log "refused: $out"

cat > "$T/w.py" <<'PY'
# w.py close MNT EXP REL SIZE...   write+close files REL.0, REL.1, ... of the given sizes
# w.py fsync MNT EXP REL SIZE      write, fsync (fdatasync for odd sizes), print READY, stay open
# w.py rename MNT EXP DIR          DIR/a -> DIR/b, unlink DIR/gone, fsync(DIR)
import os, sys, time
mode, mnt, exp = sys.argv[1], sys.argv[2], sys.argv[3]
def keep(rel, data):
    p = os.path.join(exp, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data)
def write(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:256 * 1024]):]
if mode == "close":
    rel = sys.argv[4]
    for i, sz in enumerate(int(s) for s in sys.argv[5:]):
        data = os.urandom(sz)
        os.makedirs(os.path.dirname(os.path.join(mnt, rel)), exist_ok=True)
        fd = os.open(os.path.join(mnt, f"{rel}.{i}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        write(fd, data)
        os.close(fd)            # under --durability bucket: returns once in the bucket
        keep(f"{rel}.{i}", data)
elif mode == "fsync":
    rel, sz = sys.argv[4], int(sys.argv[5])
    held = []
    for i, sync in enumerate((os.fsync, os.fdatasync)):
        data = os.urandom(sz + i)
        os.makedirs(os.path.dirname(os.path.join(mnt, rel)), exist_ok=True)
        fd = os.open(os.path.join(mnt, f"{rel}.{i}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        write(fd, data)
        sync(fd)
        held.append(fd)
        keep(f"{rel}.{i}", data)
    print("READY", flush=True)
    time.sleep(3600)
elif mode == "rename":
    d = sys.argv[4]
    os.rename(os.path.join(mnt, d, "a"), os.path.join(mnt, d, "b"))
    os.rename(os.path.join(exp, d, "a"), os.path.join(exp, d, "b"))
    os.unlink(os.path.join(mnt, d, "gone"))
    os.unlink(os.path.join(exp, d, "gone"))
    dfd = os.open(os.path.join(mnt, d), os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)               # under --durability bucket: returns once the bucket follows
    os.close(dfd)
PY

# ---- per-backend helpers (set by run_backend)
KIND=
BUCKET_DIR=
obj_get() { # REL > FILE: the object of workspace path REL, read around deskfs
  if [[ $KIND == s3 ]]; then s3_get "$(s3_key "$1")"; else cat "$BUCKET_DIR/$1"; fi
}
obj_exists() {
  if [[ $KIND == s3 ]]; then s3_exists "$(s3_key "$1")"; else [[ -f $BUCKET_DIR/$1 ]]; fi
}
assert_in_bucket() { # REL WHEN: the object equals $EXP/REL
  obj_exists "$1" || fail "[$KIND] $2: object $1 is not in the bucket"
  obj_get "$1" > "$T/obj" || fail "[$KIND] $2: cannot read object $1"
  [[ $(sha "$T/obj") == "$(sha "$EXP/$1")" ]] ||
    fail "[$KIND] $2: object $1 differs ($(stat -c %s "$T/obj") bytes in the bucket, $(stat -c %s "$EXP/$1") written)"
}
assert_tree() { # WHEN: every file of $EXP reads back exactly through the mount
  local f rel n=0
  while IFS= read -r -d '' f; do
    rel=${f#"$EXP"/}
    [[ -f $MNT/$rel ]] || fail "[$KIND] $1: $rel is missing"
    assert_file_eq "$f" "$MNT/$rel" "[$KIND] $1: $rel"
    n=$((n + 1))
  done < <(find "$EXP" -type f -print0)
  log "[$KIND] $1: all $n files exact"
}

DAEMON=
mount_fg() { # DURABILITY: mount in the foreground (DAEMON = its PID)
  ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE" --durability "$1" "${HOLD[@]}"
  DAEMON=$FG_PID
}
lose_machine() { # kill -9 of the daemon, rm -rf of its cache dir, remount (bucket durability)
  log "[$KIND] kill -9 of daemon $DAEMON, rm -rf $CACHE"
  kill -KILL "$DAEMON"
  wait "$DAEMON" 2> /dev/null || true
  if is_mounted "$MNT"; then force_unmount "$MNT" || fail "cannot remove the dead mount $MNT"; fi
  rm -rf "$CACHE"
  mount_fg bucket
}

run_backend() { # KIND NAME [FORMAT ARGS...]
  KIND=$1 NAME=$2
  shift 2
  CACHE=$T/cache-$NAME
  EXP=$T/exp-$NAME
  mkdir -p "$EXP"
  ws_format "$NAME" "$@"
  if [[ $KIND == file ]]; then
    BUCKET_DIR=$(sed -n 's/^bucket *= *"file:\/\/\(.*\)"/\1/p' "$DESKFS_HOME/workspaces/$NAME/workspace.toml")
    [[ -d $BUCKET_DIR ]] || fail "embedded bucket dir not found in workspace.toml: '$BUCKET_DIR'"
  fi
  mount_fg bucket
  dfs status "$NAME" --json > "$T/status.json" || fail "deskfs status failed"
  python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["mounts"]; assert [x["durability"] for x in m]==["bucket"], m' "$T/status.json" ||
    fail "[$KIND] deskfs status --json does not report durability bucket: $(head -c 600 "$T/status.json")"

  log "[$KIND] 1. close"
  timeout 120 python3 "$T/w.py" close "$MNT" "$EXP" closed/f 0 1 100000 $((3 << 20)) || fail "[$KIND] writer (close) failed"
  for i in 0 1 2 3; do assert_in_bucket "closed/f.$i" "right after close"; done
  lose_machine
  assert_tree "after close, kill -9, rm -rf cache, remount"

  log "[$KIND] 2. fsync/fdatasync without close"
  python3 "$T/w.py" fsync "$MNT" "$EXP" fsynced/g 200000 > "$T/fsync.out" 2> "$T/fsync.err" &
  local writer=$!
  register_pid "$writer"
  wait_for 120 grep -q READY "$T/fsync.out" || fail "[$KIND] writer (fsync) did not report: $(cat "$T/fsync.err")"
  assert_in_bucket fsynced/g.0 "right after fsync (file still open)"
  assert_in_bucket fsynced/g.1 "right after fdatasync (file still open)"
  lose_machine
  kill -KILL "$writer" 2> /dev/null || true
  wait "$writer" 2> /dev/null || true
  assert_tree "after fsync, kill -9, rm -rf cache, remount"

  log "[$KIND] 3. rename + unlink + fsync of the directory"
  timeout 60 python3 "$T/w.py" close "$MNT" "$EXP" dir/x 10 || fail "[$KIND] writer failed"
  printf 'renamed content\n' > "$MNT/dir/a"
  printf 'renamed content\n' > "$EXP/dir/a"
  printf 'deleted\n' > "$MNT/dir/gone"
  printf 'deleted\n' > "$EXP/dir/gone"
  assert_in_bucket dir/a "before the rename"
  timeout 60 python3 "$T/w.py" rename "$MNT" "$EXP" dir || fail "[$KIND] rename + fsyncdir failed"
  assert_in_bucket dir/b "right after fsync of the directory"
  ! obj_exists dir/a || fail "[$KIND] old name dir/a still in the bucket after fsync of the directory"
  ! obj_exists dir/gone || fail "[$KIND] deleted dir/gone still in the bucket after fsync of the directory"
  lose_machine
  assert_tree "after rename + fsyncdir, kill -9, rm -rf cache, remount"
  [[ ! -e $MNT/dir/a && ! -e $MNT/dir/gone ]] || fail "[$KIND] an old name came back after the remount"

  log "[$KIND] 4. contrast: --durability local"
  ws_umount "$MNT"
  mount_fg local
  printf 'local durability\n' > "$MNT/local.txt"
  printf 'local durability\n' > "$EXP/local.txt"
  ! obj_exists local.txt || fail "[$KIND] --durability local: local.txt is in the bucket right after close (uploads were held back: the checks above could not fail)"
  ws_sync "$NAME"
  assert_in_bucket local.txt "after deskfs sync"
  ws_umount "$MNT"
}

run_backend file dura-file
if have_s3; then
  need_cmd rclone
  run_backend s3 dura-s3 --bucket "$(s3_url)"
else
  skip_or_fail "no S3 server (run through scripts/test.sh): the embedded half passed, the Garage half cannot run"
fi

log "PASS"
