#!/usr/bin/env bash
# 82l-power-loss: power cuts under a running workload, on the power-loss file system
# (crates/lossfs: every write not made durable by fsync/fdatasync/fsyncdir is kept in
# memory and thrown away at a cut). deskfs's home (metadata database and its logs) and
# cache dir live on it; the bucket (file://) lives on the real disk, as a remote bucket
# would survive the machine. Each iteration:
#   mount --foreground -> powerload.py work (fsynced files, closed files, atomic
#   replacements with a directory fsync; journaled on the real disk after each promise)
#   -> random sleep -> kill -9 of the daemon -> the dead mount removed -> power cut
#   (odd iterations `cut`, even ones `cut --reorder SEED`: a random prefix of the pending
#   namespace operations and random pages of unsynced data survive, as a disk may keep
#   them) -> mount again -> powerload.py check (every fsynced file exact, every replaced
#   target one of its journaled versions, every file readable, nothing unknown) ->
#   deskfs fsck: 0 problems.
# Between the start of the workload and the kill, each iteration also takes crash images
# (`deskfs-lossfs ctl image`: what a power cut at that instant would leave of the disk,
# with the bucket dir as it was then, copied under the model's lock while the workload
# goes on) at random 10-50 ms intervals. After the iteration's own cut and check, each
# image is restored into the backing directory, mounted (uploads held back, so the
# bucket copy stays as it was), checked against the journal as it stood when the image
# was taken, unmounted without uploading, and fsck'd; then the cut's own state is put
# back and the next iteration goes on from it. A crash image is a power cut with the
# daemon alive (the cut kills it): the same promises hold.
# At the end: a normal mount, `deskfs sync`, and every fsynced file is in the bucket dir
# with its content.
#   DESKFS_POWER_ITERS   kill-and-cut iterations (default 20)
#   DESKFS_POWER_IMAGES  crash images per iteration (default 14: 20 + 280 = 300 cut points
#                        per run, ~7.5 min here: an iteration costs ~7 s besides its
#                        images, an image ~0.8-1.5 s; `scripts/test.sh --long` runs 50 x 60:
#                        3,050). A cut point's check reads the whole tree: the workload
#                        removes iterations older than the last two, so it stays bounded
#                        (~450 files); a check costs 1.1-1.5 s there (restore by moving
#                        the image into place, mount, check, unmount, fsck).
#   DESKFS_POWER_SEED    seed of the run (default random; printed)
# e2e-cost: 500
# e2e-timeout: 1200
# e2e-long-timeout: 43200
source "$(dirname "$0")/../lib.sh"
need_deskfs

PL=$ROOT/tests/tools/powerload.py
ITERS=${DESKFS_POWER_ITERS:-20}
IMAGES=${DESKFS_POWER_IMAGES:-14}
SEED=${DESKFS_POWER_SEED:-$((RANDOM * 32768 + RANDOM))}
RANDOM=$SEED
log "seed $SEED, $ITERS power cuts + $((ITERS * IMAGES)) crash images (replay: DESKFS_POWER_SEED=$SEED DESKFS_POWER_ITERS=$ITERS DESKFS_POWER_IMAGES=$IMAGES)"

JOURNAL=$T/journal    # real disk
lossfs_start          # $T/disk survives a cut; $LFS is the power-loss file system over it
ctl() { lossfs_ctl "$@"; }

export DESKFS_HOME=$LFS/home
mkdir -p "$DESKFS_HOME"
NAME=power
ws_format "$NAME" --bucket "file://$T/bucket"
ctl sync > /dev/null || fail "lossfs sync failed"   # the formatted workspace is the starting disk
CACHE=$LFS/cache

remove_dead_mount() {
  is_mounted "$MNT" || return 0
  timeout 20 fusermount3 -u "$MNT" > /dev/null 2>&1 || force_unmount "$MNT" || fail "cannot remove the dead mount $MNT"
}

check_tree() { # WHEN [PROMISED_BYTES JOURNAL_BYTES]
  local rc=0
  timeout -k 5 300 python3 "$PL" check --mnt "$MNT" --journal "$JOURNAL" ${2:+--promised-bytes "$2"} ${3:+--journal-bytes "$3"} > "$T/check.out" 2>&1 || rc=$?
  ((rc == 0)) || fail "$1: the tree breaks a promise (seed $SEED): $(head -c 2500 "$T/check.out")"
  log "$1: $(head -n 1 "$T/check.out")"
}

fsck_clean() { # WHEN
  local out rc=0
  out=$(DFS_TIMEOUT=300 dfs fsck "$NAME" 2>&1) || rc=$?
  ((rc == 0)) && grep -q '\b0 problems' <<< "$out" || fail "$1: deskfs fsck (exit $rc): $(head -c 1500 <<< "$out")"
}

sleep_ms() { sleep "$(($1 / 1000)).$(printf '%03d' $(($1 % 1000)))"; }

IMG=$T/images
# take_image NAME: a crash image now, with the journal's length before it (every line
# in it is a promise made before the image) and after it (lines in between may or may
# not have happened at the image's instant).
take_image() {
  local before out
  before=$(stat -c %s "$JOURNAL")
  out=$(ctl image "$IMG/$1" "$T/bucket") || fail "lossfs image failed: $out"
  [[ $out == ok* ]] || fail "lossfs image: $out"
  echo "$before $(stat -c %s "$JOURNAL")" > "$IMG/$1.jlen"
}

# restore_image NAME: the image becomes the disk (and the bucket dir); lossfs reloads it.
# Each image is restored once, so its files are moved into place, not copied (the bucket
# dir's objects are the image's hard links: they keep their inode numbers and times,
# which file:// ETags are made of; objects are replaced by rename, never changed in
# place). What they replace is removed in the background.
restore_image() {
  local old=$T/old.$1
  mkdir -p "$old"
  find "$T/disk" -mindepth 1 -maxdepth 1 -exec mv -t "$old" {} +
  find "$IMG/$1/disk" -mindepth 1 -maxdepth 1 -exec mv -t "$T/disk" {} +
  mv "$T/bucket" "$old/bucket"
  mv "$IMG/$1/bucket" "$T/bucket"
  rm -rf "$old" &
  local out
  out=$(ctl cut) || fail "lossfs reload of image $1 failed: $out"
}

# check_image NAME: mount what the image holds, check it against the journal as it stood
# then, unmount without uploading, fsck.
check_image() {
  restore_image "$1"
  local before after
  read -r before after < "$IMG/$1.jlen"
  ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE" --upload-delay-ms 3600000 > /dev/null 2>&1
  check_tree "image $1" "$before" "$after"
  DFS_TIMEOUT=60 dfs_ok umount "$MNT" --no-wait > /dev/null
  wait "$FG_PID" 2> /dev/null || true
  remove_dead_mount
  fsck_clean "image $1"
}

touch "$JOURNAL"
REORDERED=0
CHECKED_IMAGES=0
for ((i = 1; i <= ITERS; i++)); do
  ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
  DAEMON=$FG_PID
  check_tree "cut $((i - 1))"
  # Iterations older than the last two are removed (journaled): the tree, and each cut
  # point's check, stays the same size however long the run.
  python3 "$PL" work --mnt "$MNT" --journal "$JOURNAL" --iter "$i" --seed "$((SEED * 1000 + i))" --keep-iters 2 > "$T/work.$i.out" 2>&1 &
  WL=$!
  register_pid "$WL"
  wait_for 30 grep -q READY "$T/work.$i.out" || fail "cut $i: workload not ready: $(tail -n 5 "$T/work.$i.out")"
  rm -rf "$IMG" && mkdir -p "$IMG"
  for ((j = 1; j <= IMAGES; j++)); do
    sleep_ms $((10 + RANDOM % 40))
    take_image "$i.$j"
  done
  delay_ms=$((50 + RANDOM % (IMAGES > 0 ? 450 : 950)))
  sleep_ms "$delay_ms"
  pid_running "$WL" || fail "cut $i: the workload died before the cut: $(tail -n 15 "$T/work.$i.out")"
  kill -KILL "$DAEMON"
  wait "$DAEMON" 2> /dev/null || true
  kill -KILL "$WL" 2> /dev/null || true
  wait "$WL" 2> /dev/null || true
  remove_dead_mount
  if ((i % 2 == 0)); then
    out=$(ctl cut --reorder "$((SEED + i))") || fail "cut $i: lossfs cut --reorder failed: $out"
    REORDERED=$((REORDERED + 1))
  else
    out=$(ctl cut) || fail "cut $i: lossfs cut failed: $out"
  fi
  log "cut $i after ${delay_ms} ms: $(grep -c . "$JOURNAL") journal lines; ${out:0:160}"
  fsck_clean "after cut $i"
  if ((IMAGES > 0)); then
    # The cut's own state is kept aside while the images are looked at, then put back.
    take_image "$i.cut"
    for ((j = 1; j <= IMAGES; j++)); do
      check_image "$i.$j"
      CHECKED_IMAGES=$((CHECKED_IMAGES + 1))
    done
    restore_image "$i.cut"
    log "cut $i: $IMAGES crash images taken during its workload checked"
  fi
done
rm -rf "$IMG"

log "final: mount, check, sync, bucket"
ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
check_tree "after the last cut"
ws_sync "$NAME"
n=0
retired=$(awk '$1 == "retired" {print $2}' "$JOURNAL")
while read -r kind rel h; do
  [[ $kind == fsynced ]] || continue
  grep -qxF "${rel%%/*}" <<< "$retired" && continue   # removed with its iteration's dir
  [[ -f $T/bucket/$rel ]] || fail "after sync: fsynced $rel is missing in the bucket dir"
  [[ $(sha "$T/bucket/$rel") == "$h" ]] || fail "after sync: the bucket's $rel is not its fsynced content"
  n=$((n + 1))
done < "$JOURNAL"
for d in $retired; do
  [[ ! -e $T/bucket/$d ]] || fail "after sync: the removed directory $d is still in the bucket dir"
done
kill -TERM "$FG_PID"
wait "$FG_PID" 2> /dev/null || true
log "PASS: $ITERS power cuts ($REORDERED reordered) and $CHECKED_IMAGES crash images: $((ITERS + CHECKED_IMAGES)) cut points (seed $SEED), $n fsynced files exact in the bucket, fsck clean after every one"
