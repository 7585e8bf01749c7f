# tests/backend.sh — the basic-ops workload each backend's e2e test runs (21 Azure, 22
# GCS), sourced after lib.sh. The test sets PREFIX (the workspace's key prefix) and
# defines two hooks on its own client of the store:
#   obj_get KEY            the object's bytes on stdout (non-zero when there is none)
#   obj_present REL KIND   the object of REL (KIND: file or dir, its marker) exists
# and calls, in order: backend_write_tree M; ws_sync; backend_check_tree;
# backend_change_tree M (it syncs); backend_check_changed; backend_cold_remount NAME M DIR.

# obj_eq REL FILE: the object of workspace path REL holds FILE's bytes, else fail.
obj_eq() {
  local key=$PREFIX/$1
  obj_get "$key" > "$T/obj.got" || fail "object $key is not in the store"
  [[ $(sha "$T/obj.got") == "$(sha "$2")" ]] ||
    fail "object $key differs from $2 ($(stat -c %s "$T/obj.got") bytes in the store, $(stat -c %s "$2") expected)"
}

# backend_write_tree M: nested dirs, an empty dir and an empty file, a Unicode name, a
# 20 MB file (multipart) and a 300 KB one, names to rename and delete, an exact mtime.
backend_write_tree() {
  local m=$1
  log "writing files"
  head -c 20000000 /dev/urandom > "$T/big.bin"
  head -c 300000 /dev/urandom > "$T/mid.bin"
  mkdir -p "$m/a/b" "$m/emptydir" "$m/renamedir/x"
  echo "top level" > "$m/top.txt"
  echo "nested c" > "$m/a/b/c.txt"
  cp "$T/big.bin" "$m/a/big.bin"
  cp "$T/mid.bin" "$m/mid.bin"
  : > "$m/zero.txt"
  echo "unicode" > "$m/héllo wörld.txt"
  echo "in renamed dir" > "$m/renamedir/x/r.txt"
  echo "before rename" > "$m/a/old-name.txt"
  echo "to be deleted" > "$m/a/deleted.txt"
  touch -d '2001-02-03 04:05:06.123456789' "$m/a/b/c.txt"
  assert_eq "nested c" "$(cat "$m/a/b/c.txt")" "read back through the mount"
}

# backend_check_tree: the synced tree's objects hold their files' bytes.
backend_check_tree() {
  echo "top level" > "$T/e.top"
  echo "nested c" > "$T/e.c"
  echo "unicode" > "$T/e.uni"
  obj_eq top.txt "$T/e.top"
  obj_eq a/b/c.txt "$T/e.c"
  obj_eq a/big.bin "$T/big.bin"
  obj_eq mid.bin "$T/mid.bin"
  obj_eq "héllo wörld.txt" "$T/e.uni"
}

# backend_change_tree M: a file and a directory renamed, a file deleted, two overwritten
# (one with an 18 MB file), then synced.
backend_change_tree() {
  local m=$1
  log "rename + delete + overwrite, then sync"
  mv "$m/a/old-name.txt" "$m/a/new-name.txt"
  mv "$m/renamedir" "$m/renamed"
  rm "$m/a/deleted.txt"
  echo "changed content" > "$m/top.txt"
  head -c 18000000 /dev/urandom > "$T/big2.bin"
  cp "$T/big2.bin" "$m/a/big.bin"
  ws_sync "$NAME"
}

# backend_check_changed: the renamed and overwritten objects hold the new bytes; the old
# names (files and directory markers) are gone.
backend_check_changed() {
  echo "before rename" > "$T/e.ren"
  echo "in renamed dir" > "$T/e.rd"
  echo "changed content" > "$T/e.top2"
  obj_eq a/new-name.txt "$T/e.ren"
  obj_eq renamed/x/r.txt "$T/e.rd"
  obj_eq top.txt "$T/e.top2"
  obj_eq a/big.bin "$T/big2.bin"
  local gone
  for gone in a/old-name.txt:file a/deleted.txt:file renamedir/x/r.txt:file renamedir/x:dir renamedir:dir; do
    ! obj_present "${gone%:*}" "${gone#*:}" || fail "${gone%:*} still in the store after rename/delete + sync"
  done
}

# backend_cold_remount NAME M DIR: unmounts M, mounts NAME at DIR with a new cache dir,
# checks the tree is exactly what M showed (the empty dir included), unmounts DIR.
backend_cold_remount() {
  local name=$1 m=$2 dir=$3
  tree_manifest "$m" > "$T/manifest.before"
  ws_umount "$m"
  log "cold remount (new cache dir)"
  ws_mount "$name" "$dir" --cache-dir "$T/cache2"
  assert_same_tree "$T/manifest.before" "$dir" "after cold remount"
  [[ -d $dir/emptydir ]] || fail "emptydir is not a directory after the remount"
  ws_umount "$dir"
}

# backend_no_failing_uploads: after a sync, status lists no failing upload.
backend_no_failing_uploads() {
  local st
  st=$(dfs status "$NAME" 2>&1) || fail "deskfs status failed: $st"
  grep -q "uploads .*0 failing" <<< "$st" || fail "status shows failing uploads after sync: $(grep -A2 uploads <<< "$st")"
}

# backend_prefill_files: $T/x.txt and $T/y.bin, the files another client puts into a
# prefix before deskfs mounts it.
backend_prefill_files() {
  echo "from another client" > "$T/x.txt"
  head -c 100000 /dev/urandom > "$T/y.bin"
}
