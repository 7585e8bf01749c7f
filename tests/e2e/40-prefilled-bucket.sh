#!/usr/bin/env bash
# 40-prefilled-bucket: an existing bucket prefix, written by another tool (rclone on S3,
# the emulator's client on Azure/GCS: DESKFS_E2E_STORE, tests/store.sh; no directory
# markers except one explicit marker of an empty dir in the store's own form: `dir/` on
# S3 and GCS, a blob `dir` with hdi_isfolder=true on Azure), mounts as-is: nested dirs, a
# 1,000-object directory, a 64 MiB random object, a zero-length object. `deskfs format`
# must accept the non-empty prefix (it has no .deskfs/ record) and must not change or
# delete any existing object; the mount shows every file with the right size (stat) and
# content (sha256), also after a cold remount.
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_store

PRE=$T/prefill
log "building the local tree"
mkdir -p "$PRE/a/b/c/d" "$PRE/docs/guide" "$PRE/many" "$PRE/data"
echo "deep file" > "$PRE/a/b/c/d/deep.txt"
echo "level a" > "$PRE/a/a.txt"
echo "# readme" > "$PRE/docs/README.md"
head -c 12345 /dev/urandom > "$PRE/docs/guide/chapter1.bin"
: > "$PRE/docs/empty-file"
python3 - "$PRE/many" <<'PY'
import os, sys
d = sys.argv[1]
for i in range(1000):
    with open(os.path.join(d, f"f{i:04d}.txt"), "w") as f:
        f.write(f"object number {i}\n" * (1 + i % 7))
PY
head -c $((64 * 1024 * 1024)) /dev/urandom > "$PRE/data/big.bin"
(cd "$PRE" && find . -type f -printf '%P\t%s\n' | sort) > "$T/expected.sizes"
(cd "$PRE" && find . -type f -printf '%P\0' | sort -z | xargs -0 sha256sum) > "$T/expected.sha"
NFILES=$(wc -l < "$T/expected.sizes")

log "uploading $NFILES files to $(store_url) ($STORE)"
store_put_tree "$PRE" "$STORE_PREFIX" > "$T/put-tree.log" 2>&1 \
  || fail "uploading the tree failed: $(tail -n 20 "$T/put-tree.log")"
store_put_dir emptydir   # an explicit directory marker
store_keys > "$T/keys.before"
assert_eq $((NFILES + 1)) "$(wc -l < "$T/keys.before")" "objects in the prefilled prefix"
! grep -q "	$STORE_PREFIX/\.deskfs/" "$T/keys.before" || fail "harness error: .deskfs/ present before format"

NAME=prefilled
ws_format "$NAME" --bucket "$(store_url)"
store_keys > "$T/keys.after-format"
grep -v "	$STORE_PREFIX/\.deskfs/" "$T/keys.after-format" > "$T/keys.after-format.user" || true
diff "$T/keys.before" "$T/keys.after-format.user" > "$T/keys.diff" || fail "format changed existing objects: $(head -n 20 "$T/keys.diff")"

ws_mount "$NAME" "$MNT" --cache-dir "$T/cache1"
check_tree() { # DIR WHAT
  local d=$1 what=$2
  (cd "$d" && find . -type f -printf '%P\t%s\n' | sort) > "$T/got.sizes"
  diff "$T/expected.sizes" "$T/got.sizes" > "$T/sizes.diff" || fail "$what: file list/sizes differ (< expected, > mount): $(head -n 20 "$T/sizes.diff")"
  assert_eq 1000 "$(find "$d/many" -mindepth 1 | wc -l)" "$what: entries in the 1,000-object directory"
  assert_eq $((64 * 1024 * 1024)) "$(stat -c %s "$d/data/big.bin")" "$what: stat size of the 64 MiB object"
  [[ -d $d/emptydir ]] || fail "$what: directory from the marker object emptydir/ missing"
  assert_eq "" "$(ls -A "$d/emptydir")" "$what: emptydir contents"
  assert_eq "d" "$(stat -c %F "$d/a/b/c" | cut -c1)" "$what: implicit directory a/b/c (no marker) type"
  (cd "$d" && sha256sum --quiet -c "$T/expected.sha") > "$T/sha.out" 2>&1 || fail "$what: content differs: $(head -n 10 "$T/sha.out")"
}
log "checking the mount"
check_tree "$MNT" "first mount"
assert_not_listed "$MNT" .deskfs
ws_umount "$MNT"

store_keys | grep -v "	$STORE_PREFIX/\.deskfs/" > "$T/keys.after-umount" || true
diff "$T/keys.before" "$T/keys.after-umount" > "$T/keys.diff2" || fail "reading through the mount changed objects in the bucket: $(head -n 20 "$T/keys.diff2")"

log "cold remount"
ws_mount "$NAME" "$MNT2" --cache-dir "$T/cache2"
check_tree "$MNT2" "cold remount"
ws_umount "$MNT2"

log "PASS"
