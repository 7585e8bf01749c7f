#!/usr/bin/env bash
# demo.sh — set up deskfs on a fresh Debian machine and run the main job:
# format a workspace on the embedded default (local bucket directory + SQLite),
# mount it, work in it, and show the files landing in the bucket directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v pkg-config >/dev/null || need+=(pkg-config)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== building deskfs (release; about 10 min on 2 CPUs the first time, cargo shows its progress)"
cargo build --release -p deskfs
D="${CARGO_TARGET_DIR:-$PWD/target}/release/deskfs"

export DESKFS_HOME="${DESKFS_HOME:-$(mktemp -d /tmp/deskfs-demo.XXXXXX)}"
MNT="$DESKFS_HOME/mnt"
mkdir -p "$MNT"
cleanup() { "$D" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u "$MNT" 2>/dev/null || true; }
trap cleanup EXIT

echo "== deskfs format demo   (DESKFS_HOME=$DESKFS_HOME)"
"$D" format demo
echo "== deskfs mount demo $MNT"
"$D" mount demo "$MNT"

echo "== working in the mount"
mkdir -p "$MNT/notes" "$MNT/repos"
echo "remember: tests run with make check" > "$MNT/notes/todo.md"
printf 'int main(void){return 0;}\n' > "$MNT/repos/main.c"
mv "$MNT/notes/todo.md" "$MNT/notes/plan.md"
ln -s notes/plan.md "$MNT/latest"
ls -lR "$MNT"

echo "== deskfs sync demo   (returns once everything is in the bucket)"
"$D" sync demo
"$D" status demo

BUCKET="$DESKFS_HOME/workspaces/demo/bucket"
echo "== the bucket directory, read without deskfs: $BUCKET"
(cd "$BUCKET" && find . -path ./.deskfs -prune -o -print | sort)
echo "-- notes/plan.md in the bucket:"
cat "$BUCKET/notes/plan.md"

echo "== unmount, remount: everything is still there"
"$D" umount "$MNT"
"$D" mount demo "$MNT"
cat "$MNT/notes/plan.md"
"$D" umount "$MNT"
trap - EXIT
echo "== done (workspace data kept in $DESKFS_HOME)"
