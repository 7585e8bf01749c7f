#!/usr/bin/env bash
# 96-rebuild-from-bucket: `deskfs fsck NAME --rebuild-from-bucket` with the metadata backup
# deleted from the bucket rebuilds the namespace from the objects and their s3fs-style
# attributes alone: contents, modes, owners, ns mtimes, symlinks, empty dirs come back
# (Garage); what objects cannot carry — hard-link identity, xattrs — is reported, not
# guessed (the two names of a hard link become two files with the same bytes; no xattr
# appears). The old database is kept beside the new one. Refused while files are not yet
# uploaded (nothing discarded) and on a mounted workspace. With the backup present, the
# same command restores it exactly (links, xattrs). A damaged backup file is refused whole:
# the rebuild falls back to the previous generation or the objects, never half-applies it.
# e2e-timeout: 400
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3
need_cmd python3

SNAP=$ROOT/tests/tools/treesnap.py
NAME=rb
mapfile -t S3A < <(s3_args)
ws_format "$NAME" --bucket "$(s3_url)" "${S3A[@]}"
ws_mount "$NAME" "$MNT"
python3 - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
j = lambda *p: os.path.join(m, *p)
os.makedirs(j("dir", "sub"))
os.makedirs(j("empty"))
with open(j("dir", "a.txt"), "wb") as f:
    f.write(b"alpha\n" * 1000)
with open(j("exec.sh"), "wb") as f:
    f.write(b"#!/bin/sh\necho hi\n")
os.chmod(j("exec.sh"), 0o751)
os.chmod(j("dir", "sub"), 0o700)
with open(j("owned"), "wb") as f:
    f.write(b"o\n")
os.chown(j("owned"), 1234, 5678)
os.symlink("dir/a.txt", j("link"))
with open(j("hard1"), "wb") as f:
    f.write(b"linked\n")
os.link(j("hard1"), j("dir", "hard2"))
with open(j("x"), "wb") as f:
    f.write(b"with xattr\n")
os.setxattr(j("x"), "user.k", b"v")
t = 1_500_000_000_987_654_321
for p in ["dir/a.txt", "exec.sh", "owned", "hard1", "x"]:
    os.utime(j(p), ns=(t, t))
PY
python3 "$SNAP" "$MNT" > "$T/before.manifest"
ws_sync "$NAME"

log "refused while mounted"
out=$(dfs fsck "$NAME" --rebuild-from-bucket 2>&1) && fail "fsck --rebuild-from-bucket ran on a mounted workspace: $out"
[[ $out == *"is mounted"* ]] || fail "unclear refusal on a mounted workspace: $out"
ws_umount "$MNT"

log "with the backup: exact"
out=$(dfs fsck "$NAME" --rebuild-from-bucket 2>&1) || fail "rebuild with the backup failed: $out"
log "$out"
ls "$DESKFS_HOME/workspaces/$NAME"/meta.db.before-rebuild-* > /dev/null || fail "the old database was not kept"
ws_mount "$NAME" "$MNT"
python3 "$SNAP" "$MNT" > "$T/with-backup.manifest"
diff -u "$T/before.manifest" "$T/with-backup.manifest" > "$T/d1" || fail "rebuild with the backup differs: $(head -n 20 "$T/d1")"

log "not uploaded yet: refused, nothing discarded"
echo "unsynced" > "$MNT/unsynced"
DAEMON=$(dfs status "$NAME" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0]["pid"])')
# kill -9 right after close: the file is in the journal, not in the bucket
kill -KILL "$DAEMON"
wait_for 10 bash -c "! kill -0 $DAEMON 2>/dev/null" || fail "daemon survived kill -9"
force_unmount "$MNT" || true
rc=0
out=$(dfs fsck "$NAME" --rebuild-from-bucket 2>&1) || rc=$?
((rc != 0)) && [[ $out == *"not in the bucket yet"*"deskfs sync"* ]] || fail "rebuild with unuploaded files not refused clearly: $out"
[[ $(wc -l <<< "$out") == 1 ]] || fail "refusal is not one line: $out"
ws_sync "$NAME"

log "the backup deleted: rebuild from the objects alone"
s3py rmprefix "$S3_PREFIX/.deskfs/meta/" > /dev/null
s3_exists "$S3_PREFIX/.deskfs/format.json" || fail "format record gone"
out=$(dfs fsck "$NAME" --rebuild-from-bucket 2>&1) || fail "rebuild from the objects failed: $out"
log "$out"
[[ $out == *"no metadata backup"*"hard-link identity"*"extended attributes"* ]] || fail "the rebuild does not report what it cannot know: $out"
ws_mount "$NAME" "$MNT"
python3 "$SNAP" "$MNT" > "$T/objects.manifest"
python3 - "$T/before.manifest" "$T/objects.manifest" <<'PY'
import sys
def load(p):
    rows = {}
    for line in open(p, encoding="utf-8"):
        f = line.rstrip("\n").split("\t")
        rows[f[0]] = f
    return rows
before, after = load(sys.argv[1]), load(sys.argv[2])
errs = []
if set(after) != set(before) | {"unsynced"}:
    errs.append(f"paths differ: missing {sorted(set(before) - set(after))}, extra {sorted(set(after) - set(before) - {'unsynced'})}")
for p, b in before.items():
    a = after.get(p)
    if not a:
        continue
    # path type mode uid gid size mtime content link xattrs
    for i, what in [(1, "type"), (2, "mode"), (3, "uid"), (4, "gid"), (5, "size"), (7, "content")]:
        if a[i] != b[i]:
            errs.append(f"{p}: {what} {b[i]} -> {a[i]}")
    if b[1] != "d" and a[6] != b[6]:
        errs.append(f"{p}: mtime {b[6]} -> {a[6]}")
    if a[8] != "-":
        errs.append(f"{p}: a hard link was guessed ({a[8]})")
    if a[9] != "-":
        errs.append(f"{p}: an xattr was guessed ({a[9]})")
if after.get("unsynced", [""] * 8)[7] == "-":
    errs.append("unsynced: missing content")
if errs:
    print("\n".join(errs))
    sys.exit(1)
PY
[[ $(cat "$MNT/unsynced") == unsynced ]] || fail "the file synced after the kill is wrong"
[[ $(stat -c %h "$MNT/hard1") == 1 && $(cat "$MNT/dir/hard2") == linked ]] || fail "hard link names not two files with the same bytes"
ws_umount "$MNT"

log "a damaged backup file is refused whole"
ws_mount "$NAME" "$MNT"
echo more > "$MNT/more"
ws_sync "$NAME"
ws_umount "$MNT"
key=$(s3_keys "$S3_PREFIX/.deskfs/meta/" | awk -F'\t' '{print $2}' | grep 'snapshot.dbk' | tail -n 1)
[[ -n $key ]] || fail "no snapshot written after the rebuild"
s3_get "$key" > "$T/snap"
python3 - "$T/snap" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0xFF
open(p, "wb").write(b)
PY
s3py put "$key" "$T/snap" > /dev/null
out=$(dfs fsck "$NAME" --rebuild-from-bucket 2>&1) || fail "rebuild with a damaged snapshot failed: $out"
log "$out"
[[ $out == *"damaged"* || $out == *"checksum"* ]] || fail "the damaged snapshot is not reported: $out"
ws_mount "$NAME" "$MNT"
[[ $(cat "$MNT/more") == more && $(cat "$MNT/dir/a.txt" | wc -l) == 1000 ]] || fail "after a damaged snapshot the tree is wrong"
ws_umount "$MNT"
log "PASS"
