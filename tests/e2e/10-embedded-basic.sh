#!/usr/bin/env bash
# 10-embedded-basic: the embedded default workspace (local bucket dir + SQLite).
# format (no --bucket) -> mount -> files, dirs, empty dir, symlink, hard link, chmod,
# rename (file and dir), delete -> umount -> the bucket dir holds plain files with the
# right content at their paths -> remount shows exactly the same tree. `umount --no-wait`
# exits without uploading what waits (the file is in the journal, then in the bucket
# after the next mount and `deskfs sync`).
source "$(dirname "$0")/../lib.sh"
need_deskfs

NAME=emb
WS=$DESKFS_HOME/workspaces/$NAME
BUCKET_DIR=$WS/bucket

ws_format "$NAME"
[[ -d $BUCKET_DIR ]] || fail "format did not create the local bucket dir $BUCKET_DIR"
[[ -f $WS/meta.db ]] || fail "format did not create the metadata database $WS/meta.db"

ws_mount "$NAME" "$MNT"
M=$MNT

log "writing files"
head -c 300000 /dev/urandom > "$T/blob.bin"
mkdir -p "$M/dir/sub" "$M/emptydir" "$M/todir/inner"
echo "hello deskfs" > "$M/dir/sub/file.txt"
cp "$T/blob.bin" "$M/dir/blob.bin"
: > "$M/zero.txt"
printf '#!/bin/sh\necho script-ran\n' > "$M/script.sh"
chmod 0755 "$M/script.sh"
chmod 0640 "$M/dir/sub/file.txt"
ln -s sub/file.txt "$M/dir/link"
ln -s /nonexistent/target "$M/dangling"
ln "$M/dir/blob.bin" "$M/dir/blob.hard"
echo "old name" > "$M/dir/old.txt"
mv "$M/dir/old.txt" "$M/dir/new.txt"
echo "inner" > "$M/todir/inner/i.txt"
mv "$M/todir" "$M/moved"
echo "to delete" > "$M/deleted.txt"
rm "$M/deleted.txt"
echo "v1" > "$M/overwritten.txt"
echo "version two" > "$M/overwritten.txt"

log "checking the live mount"
assert_eq "hello deskfs" "$(cat "$M/dir/link")" "read through symlink"
assert_eq "sub/file.txt" "$(readlink "$M/dir/link")" "symlink target"
assert_eq "/nonexistent/target" "$(readlink "$M/dangling")" "dangling symlink target"
assert_eq 2 "$(stat -c %h "$M/dir/blob.bin")" "nlink of hard-linked file"
assert_eq "$(stat -c %i "$M/dir/blob.bin")" "$(stat -c %i "$M/dir/blob.hard")" "hard links share the inode"
assert_eq 640 "$(stat -c %a "$M/dir/sub/file.txt")" "mode after chmod 0640"
assert_eq "script-ran" "$("$M/script.sh")" "running an executable from the mount"
[[ ! -e $M/dir/old.txt && ! -e $M/todir && ! -e $M/deleted.txt ]] || fail "renamed/deleted names still visible in the mount"
assert_not_listed "$M" .deskfs
[[ ! -e $M/.deskfs ]] || fail "$M/.deskfs exists in the mount (must be hidden)"

tree_manifest "$M" > "$T/manifest.before"
log "manifest: $(wc -l < "$T/manifest.before") entries"

ws_umount "$M"

log "checking the bucket dir $BUCKET_DIR"
check_plain() { # RELPATH EXPECTED_FILE
  [[ -f $BUCKET_DIR/$1 && ! -L $BUCKET_DIR/$1 ]] || fail "bucket dir: $1 is not a plain file ($(ls -la "$BUCKET_DIR/$1" 2>&1))"
  assert_file_eq "$2" "$BUCKET_DIR/$1" "bucket dir object $1"
}
echo "hello deskfs" > "$T/exp.file"
echo "old name" > "$T/exp.new"
echo "inner" > "$T/exp.inner"
echo "version two" > "$T/exp.over"
check_plain dir/sub/file.txt "$T/exp.file"
check_plain dir/blob.bin "$T/blob.bin"
check_plain dir/blob.hard "$T/blob.bin"
check_plain dir/new.txt "$T/exp.new"
check_plain moved/inner/i.txt "$T/exp.inner"
check_plain overwritten.txt "$T/exp.over"
[[ -f $BUCKET_DIR/zero.txt ]] || fail "bucket dir: zero.txt missing"
assert_eq 0 "$(stat -c %s "$BUCKET_DIR/zero.txt")" "bucket dir zero.txt size"
for gone in dir/old.txt todir/inner/i.txt deleted.txt; do
  [[ ! -e $BUCKET_DIR/$gone ]] || fail "bucket dir: $gone is still there after rename/delete and umount"
done

log "remount"
ws_mount "$NAME" "$MNT2"
assert_same_tree "$T/manifest.before" "$MNT2" "after remount"
assert_eq 2 "$(stat -c %h "$MNT2/dir/blob.bin")" "nlink of hard-linked file after remount"
assert_eq "$(stat -c %i "$MNT2/dir/blob.bin")" "$(stat -c %i "$MNT2/dir/blob.hard")" "hard links share the inode after remount"
assert_eq "hello deskfs" "$(cat "$MNT2/dir/link")" "read through symlink after remount"
assert_eq "script-ran" "$("$MNT2/script.sh")" "running an executable after remount"
# the hard link is still one inode: a write through one name shows through the other
echo "appended" >> "$MNT2/dir/blob.hard"
assert_eq "appended" "$(tail -c 9 "$MNT2/dir/blob.bin")" "write through one hard link seen through the other"
ws_umount "$MNT2"

log "umount --no-wait: what is not uploaded stays in the journal (no upload drain at exit)"
ws_mount "$NAME" "$MNT2" --upload-delay-ms 3600000
echo "closed, not uploaded" > "$MNT2/nowait.txt"
ws_umount "$MNT2" --no-wait
[[ ! -e $BUCKET_DIR/nowait.txt ]] || fail "umount --no-wait uploaded nowait.txt before exiting (it waited for uploads)"
ws_mount "$NAME" "$MNT2"
assert_eq "closed, not uploaded" "$(cat "$MNT2/nowait.txt")" "the file left in the journal, after remount"
ws_sync "$NAME"
[[ -f $BUCKET_DIR/nowait.txt ]] || fail "nowait.txt is not in the bucket dir after deskfs sync"
assert_file_eq "$MNT2/nowait.txt" "$BUCKET_DIR/nowait.txt" "bucket dir object nowait.txt"
if [[ $(id -u) == 0 ]]; then
  # root unmounts with umount(2) itself: fuse3's fusermount3 is not needed (a machine
  # that mounted as root without fuse3 installed must be able to unmount too)
  log "deskfs umount as root with no fusermount3 on PATH"
  mkdir -p "$T/emptybin"
  out=$(PATH=$T/emptybin "$DESKFS" umount "$MNT2" 2>&1) || fail "umount without fusermount3 on PATH failed: $out"
  wait_for 10 not_mounted "$MNT2" || fail "umount without fusermount3 returned 0 but $MNT2 is still mounted"
else
  ws_umount "$MNT2"
fi

log "PASS"
