#!/usr/bin/env bash
# 95-lose-the-machine: the bucket holds the whole workspace. A workspace with every kind of
# entry (files, empty and sparse files, empty dirs, symlinks incl. dangling, hard links, a
# FIFO, setuid/setgid/sticky modes, owners, ns times, xattrs, odd and non-UTF-8 names, a
# path longer than an S3 key, a git repo, a python venv) is synced, the machine's deskfs
# home and cache are destroyed (rm -rf), and `deskfs attach NAME --bucket URL` on a fresh
# home rebuilds it: a full tree comparison (content, type, mode, owner, mtime to the ns,
# link identity, xattrs) finds no difference, `git fsck` is clean, the venv's python runs.
# While the workspace is mounted, attach elsewhere is refused. Then the same without
# `sync`, after a kill -9: everything that had reached the bucket is back, the rest is
# reported as lost, never half-applied; attach refuses the live lease until --take-over.
# Runs on the embedded default engine with a local bucket dir (outside the home: a volume
# that survives the machine) and on Garage (S3).
# e2e-cost: 37
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd git python3

SNAP=$ROOT/tests/tools/treesnap.py

build_tree() { # DIR: every kind of entry
  local d=$1
  python3 - "$d" <<'PY'
import os, sys
d = os.fsencode(sys.argv[1])
j = lambda *p: os.path.join(d, *[os.fsencode(x) if isinstance(x, str) else x for x in p])
def put(p, data, mode=None):
    with open(j(p), "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(j(p), mode)
os.makedirs(j("docs", "deep", "er"))
os.makedirs(j("empty-dir"))
os.makedirs(j("empty-parent", "empty-child"))
put("docs/readme.md", b"# hello\n" * 100)
put("docs/deep/er/data.bin", os.urandom(300_000))
put("empty-file", b"")
with open(j("sparse"), "wb") as f:
    f.truncate(10 << 20)
    f.seek(5 << 20)
    f.write(b"middle")
os.symlink("docs/readme.md", j("link-to-readme"))
os.symlink("does/not/exist", j("dangling"))
os.symlink("../docs", j("docs", "deep", "up-link"))
put("hard-a", b"same inode\n")
os.link(j("hard-a"), j("docs", "hard-b"))
os.link(j("hard-a"), j("empty-parent", "hard-c"))
os.mkfifo(j("fifo"), 0o640)
put("setuid-tool", b"#!/bin/sh\necho hi\n", 0o4755)
put("setgid-tool", b"#!/bin/sh\n", 0o2750)
os.makedirs(j("sticky"))
os.chmod(j("sticky"), 0o1777)
put("private", b"secret\n", 0o600)
os.chmod(j("docs", "deep"), 0o750)
put("owned", b"by someone else\n")
os.chown(j("owned"), 1234, 5678)
os.lchown(j("dangling"), 4321, 8765)
put("with-xattrs", b"x\n")
os.setxattr(j("with-xattrs"), "user.mime_type", b"text/plain")
os.setxattr(j("with-xattrs"), "user.bin", bytes(range(256)))
os.setxattr(j("docs"), "user.dir-note", b"kept")
for name in [b"new\nline", b"tab\there", "ünï cødé ✓".encode(), b"\xff\xfe not utf-8",
             b" leading space", b"trailing space ", b"n" * 255, b"percent%20and+plus",
             b"question?mark", b"back\\slash"]:
    put(name, name + b"\n")
# a path longer than an S3 key (1,024 bytes): kept under an escaped key
p = d
for i in range(6):
    p = os.path.join(p, (f"level{i}-" + "d" * 190).encode())
    os.mkdir(p)
with open(os.path.join(p, b"deep-file"), "wb") as f:
    f.write(b"far down\n")
# ns times last (children first): files, symlinks, dirs
t = 1_234_567_890_123_456_789
for dp, dns, fns in os.walk(d, topdown=False):
    for n in fns + dns:
        t += 1_000_000_007
        os.utime(os.path.join(dp, n), ns=(t, t), follow_symlinks=False)
PY
  git -C "$d" init -q repo
  for i in 1 2 3; do
    echo "line $i" >> "$d/repo/file.txt"
    git -C "$d/repo" add file.txt
    git -C "$d/repo" commit -qm "commit $i"
  done
  git -C "$d/repo" checkout -qb feature
  python3 -m venv --without-pip "$d/venv"
}

compare() { # BEFORE DIR WHAT
  python3 "$SNAP" "$2" > "$T/after.manifest"
  if ! diff -u "$1" "$T/after.manifest" > "$T/manifest.diff"; then
    fail "$3: the rebuilt tree differs (- before, + after):
$(head -n 30 "$T/manifest.diff")"
  fi
}

daemon_pid() { dfs status "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0]["pid"])'; }

run_case() { # KIND URL FORMAT_ARGS...
  local kind=$1 url=$2; shift 2
  local name=lost-$kind out rc
  export DESKFS_HOME=$T/home-$kind-1
  ws_format "$name" --bucket "$url" "$@"
  ws_mount "$name" "$MNT"
  build_tree "$MNT"
  python3 "$SNAP" "$MNT" > "$T/before.manifest"
  grep -q $'\tl\t' "$T/before.manifest" || fail "$kind: the manifest has no symlink (tool broken?)"
  ws_sync "$name"
  # Formatting over it is not the way to use it elsewhere: the error says what is.
  rc=0
  out=$(DESKFS_HOME=$T/home-$kind-f dfs format "$name" --bucket "$url" "$@" 2>&1) || rc=$?
  ((rc != 0)) && [[ $out == *"deskfs attach $name --bucket"* ]] || fail "$kind: format over a workspace did not point to attach: $out"

  log "$kind: attach from another machine while mounted: refused"
  rc=0
  out=$(DESKFS_HOME=$T/home-$kind-x dfs attach "$name" --bucket "$url" 2>&1) || rc=$?
  ((rc != 0)) || fail "$kind: attach succeeded while the workspace is mounted elsewhere: $out"
  [[ $out == *"mounted on host"*"--take-over"* ]] || fail "$kind: unclear refusal: $out"
  [[ $(wc -l <<< "$out") == 1 ]] || fail "$kind: refusal is not one line: $out"
  [[ ! -e $T/home-$kind-x/workspaces/$name ]] || fail "$kind: refused attach left a workspace dir behind"

  ws_umount "$MNT"
  log "$kind: the machine is lost (rm -rf of its deskfs home and cache)"
  # Moved away rather than removed: it plays the old machine coming back at the end.
  mv "$DESKFS_HOME" "$T/home-$kind-1.away"
  export DESKFS_HOME=$T/home-$kind-2
  out=$(dfs attach "$name" --bucket "$url" 2>&1) || fail "$kind: attach failed: $out"
  log "$out"
  [[ $out != *LOST* ]] || fail "$kind: attach after sync reports lost files: $out"
  ws_mount "$name" "$MNT"
  compare "$T/before.manifest" "$MNT" "$kind: after sync + loss + attach"
  git -C "$MNT/repo" fsck --strict 2> "$T/fsck.err" || fail "$kind: git fsck: $(cat "$T/fsck.err")"
  [[ $(git -C "$MNT/repo" rev-list --count HEAD) == 3 ]] || fail "$kind: git history changed"
  [[ -z $(git -C "$MNT/repo" status --porcelain) ]] || fail "$kind: git status not clean: $(git -C "$MNT/repo" status --porcelain)"
  [[ $("$MNT/venv/bin/python" -c 'import sys; print(sys.prefix)') == "$MNT/venv" ]] || fail "$kind: the venv's python does not run as a venv"

  log "$kind: more work, no sync, kill -9"
  uploaded() { dfs status "$name" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["pending_uploads"] == 0 else 1)'; }
  backed_up() { dfs status "$name" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); b=d["backup"]; sys.exit(0 if b["changes_not_backed_up"] == 0 and b["generation"] else 1)'; }
  # The rebuilt database's first backup is a new generation's snapshot; what follows
  # goes into deltas.
  wait_for 30 backed_up || fail "$kind: no backup of the rebuilt workspace within 30 s"
  python3 - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
os.makedirs(os.path.join(m, "after"), exist_ok=True)
for i in range(20):
    with open(os.path.join(m, "after", f"f{i}"), "wb") as f:
        f.write(f"after {i}\n".encode() * (i + 1))
os.rename(os.path.join(m, "docs/readme.md"), os.path.join(m, "after/readme-moved.md"))
os.unlink(os.path.join(m, "private"))
os.chmod(os.path.join(m, "hard-a"), 0o640)
os.setxattr(os.path.join(m, "after/f3"), "user.late", b"yes")
PY
  # Wait until uploads are done and the keeper flushed a backup after them (no `sync`).
  local pid
  pid=$(daemon_pid "$name")
  wait_for 60 uploaded || fail "$kind: uploads did not finish"
  wait_for 30 backed_up || fail "$kind: the keeper did not back the changes up within 30 s"
  python3 "$SNAP" "$MNT" > "$T/reached.manifest"
  head -c 100000 /dev/urandom > "$MNT/late-file"   # closed, not yet uploaded when killed
  kill -KILL "$pid"
  wait_for 10 bash -c "! kill -0 $pid 2>/dev/null" || fail "$kind: daemon survived kill -9"
  force_unmount "$MNT" || true
  rm -rf "$DESKFS_HOME"
  export DESKFS_HOME=$T/home-$kind-3
  rc=0
  out=$(dfs attach "$name" --bucket "$url" 2>&1) || rc=$?
  ((rc != 0)) || fail "$kind: attach succeeded although the dead machine's lease is live: $out"
  [[ $out == *"--take-over"* ]] || fail "$kind: refusal does not name --take-over: $out"
  [[ ! -e $DESKFS_HOME/workspaces/$name ]] || fail "$kind: refused attach left a workspace dir behind"
  out=$(dfs attach "$name" --bucket "$url" --take-over 2>&1) || fail "$kind: attach --take-over failed: $out"
  log "$out"
  [[ $out =~ \(\+([0-9]+)\ deltas ]] && ((BASH_REMATCH[1] >= 1)) || fail "$kind: the changes after the snapshot were not restored from deltas: $out"
  ws_mount "$name" "$MNT"
  python3 "$SNAP" "$MNT" > "$T/restored.manifest"
  # Everything that had reached the bucket is back exactly; the late file is either back
  # whole (its upload won the race) or absent, and then reported as lost if the backup
  # knew it. Never a torn or resized file.
  grep -v $'^late-file\t' "$T/restored.manifest" > "$T/restored.nolate" || true
  diff -u "$T/reached.manifest" "$T/restored.nolate" > "$T/kill.diff" \
    || fail "$kind: after kill -9 + loss + attach --take-over, what reached the bucket differs:
$(head -n 30 "$T/kill.diff")"
  if [[ -e $MNT/late-file ]]; then
    [[ $(stat -c %s "$MNT/late-file") == 100000 ]] || fail "$kind: late-file came back torn ($(stat -c %s "$MNT/late-file") bytes)"
    log "$kind: late-file had reached the bucket and is back whole"
  else
    log "$kind: late-file had not reached the bucket: absent$([[ $out == *late-file* ]] && echo ", reported as lost")"
  fi
  ws_umount "$MNT"
  log "$kind: --durability bucket: the machine lost right after fsync and close returned"
  ws_mount "$name" "$MNT" --durability bucket --upload-delay-ms 600000
  pid=$(daemon_pid "$name")
  python3 - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
d = os.path.join(m, "durable")
os.makedirs(d)
p = os.path.join(d, "fsynced")
fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o600)
os.write(fd, b"fsynced bytes\n" * 50)
os.fchmod(fd, 0o710)
os.setxattr(p, "user.tag", b"durable")
os.utime(p, ns=(1_111_111_111_222_333_444, 1_111_111_111_222_333_444))
os.fsync(fd)
os.close(fd)
with open(os.path.join(d, "closed"), "wb") as f:
    f.write(b"closed bytes\n" * 70)
dfd = os.open(d, os.O_RDONLY)
os.fsync(dfd)
os.close(dfd)
PY
  kill -KILL "$pid"
  wait_for 10 bash -c "! kill -0 $pid 2>/dev/null" || fail "$kind: daemon survived kill -9"
  force_unmount "$MNT" || true
  rm -rf "$DESKFS_HOME"
  export DESKFS_HOME=$T/home-$kind-4
  out=$(dfs attach "$name" --bucket "$url" --take-over 2>&1) || fail "$kind: attach after the durable phase failed: $out"
  ws_mount "$name" "$MNT"
  python3 - "$MNT" <<'PY' || fail "$kind: --durability bucket lost something the machine acknowledged"
import os, stat, sys
m = sys.argv[1]
p = os.path.join(m, "durable", "fsynced")
errs = []
if open(p, "rb").read() != b"fsynced bytes\n" * 50:
    errs.append("fsynced: content")
st = os.stat(p)
if stat.S_IMODE(st.st_mode) != 0o710:
    errs.append(f"fsynced: mode {stat.S_IMODE(st.st_mode):o}")
if st.st_mtime_ns != 1_111_111_111_222_333_444:
    errs.append(f"fsynced: mtime {st.st_mtime_ns}")
if os.getxattr(p, "user.tag") != b"durable":
    errs.append("fsynced: xattr")
if open(os.path.join(m, "durable", "closed"), "rb").read() != b"closed bytes\n" * 70:
    errs.append("closed: content")
if errs:
    print("; ".join(errs), file=sys.stderr)
    sys.exit(1)
PY
  ws_umount "$MNT"
  log "$kind: the old machine comes back: its stale copy cannot mount"
  rc=0
  mv "$T/home-$kind-1.away" "$T/home-$kind-1"
  mkdir -p "$MNT2"
  out=$(DESKFS_HOME=$T/home-$kind-1 timeout 60 "$DESKFS" mount "$name" "$MNT2" 2>&1 < /dev/null) || rc=$?
  ((rc != 0)) || { register_mount "$MNT2"; fail "$kind: the stale copy mounted: $out"; }
  [[ $out == *"stale"*"deskfs attach"* ]] || fail "$kind: unclear refusal of a stale copy: $out"
  not_mounted "$MNT2" || fail "$kind: $MNT2 is mounted after the refusal"
}

bad() { # WHAT EXPECTED_SUBSTRING ARGS...: one clear line, non-zero exit, nothing created
  local what=$1 want=$2; shift 2
  local out rc=0
  out=$(DESKFS_HOME=$T/home-bad dfs "$@" 2>&1) || rc=$?
  ((rc != 0)) || fail "bad input ($what) accepted: $out"
  [[ $(wc -l <<< "$out") == 1 ]] || fail "bad input ($what): not one line: $out"
  [[ $out == *"$want"* ]] || fail "bad input ($what): message lacks '$want': $out"
  [[ ! -e $T/home-bad/workspaces/w ]] || fail "bad input ($what) left a workspace behind"
}
mkdir -p "$T/volume" "$T/not-a-workspace"
bad "attach without a source" "--bucket URL" attach w
bad "attach an empty dir" "holds no deskfs workspace" attach w --bucket "file://$T/not-a-workspace"
bad "attach a missing dir" "$T/missing" attach w --bucket "file://$T/missing"
bad "attach a relative file URL" "file://" attach w --bucket "file://relative/dir"

run_case local "file://$T/volume/bucket"
if have_s3; then
  mapfile -t S3A < <(s3_args)
  run_case s3 "$(s3_url)" "${S3A[@]}"
else
  skip_or_fail "no S3 server: the local-bucket case passed, the Garage case did not run"
fi
log "PASS"
