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
# At the end: a normal mount, `deskfs sync`, and every fsynced file is in the bucket dir
# with its content.
#   DESKFS_POWER_ITERS  cut points (default 24)
#   DESKFS_POWER_SEED   seed of the run (default random; printed)
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs

PL=$ROOT/tests/tools/powerload.py
ITERS=${DESKFS_POWER_ITERS:-24}
SEED=${DESKFS_POWER_SEED:-$((RANDOM * 32768 + RANDOM))}
RANDOM=$SEED
log "seed $SEED, $ITERS power cuts (replay: DESKFS_POWER_SEED=$SEED DESKFS_POWER_ITERS=$ITERS)"

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

check_tree() { # WHEN
  local rc=0
  timeout -k 5 300 python3 "$PL" check --mnt "$MNT" --journal "$JOURNAL" > "$T/check.out" 2>&1 || rc=$?
  ((rc == 0)) || fail "$1: the tree breaks a promise (seed $SEED): $(head -c 2500 "$T/check.out")"
  log "$1: $(head -n 1 "$T/check.out")"
}

fsck_clean() { # WHEN
  local out rc=0
  out=$(DFS_TIMEOUT=300 dfs fsck "$NAME" 2>&1) || rc=$?
  ((rc == 0)) && grep -q '\b0 problems' <<< "$out" || fail "$1: deskfs fsck (exit $rc): $(head -c 1500 <<< "$out")"
}

touch "$JOURNAL"
REORDERED=0
for ((i = 1; i <= ITERS; i++)); do
  ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
  DAEMON=$FG_PID
  check_tree "cut $((i - 1))"
  python3 "$PL" work --mnt "$MNT" --journal "$JOURNAL" --iter "$i" --seed "$((SEED * 1000 + i))" > "$T/work.$i.out" 2>&1 &
  WL=$!
  register_pid "$WL"
  wait_for 30 grep -q READY "$T/work.$i.out" || fail "cut $i: workload not ready: $(tail -n 5 "$T/work.$i.out")"
  delay_ms=$((100 + RANDOM % 900))
  sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
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
done

log "final: mount, check, sync, bucket"
ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
check_tree "after the last cut"
ws_sync "$NAME"
n=0
while read -r kind rel h; do
  [[ $kind == fsynced ]] || continue
  [[ -f $T/bucket/$rel ]] || fail "after sync: fsynced $rel is missing in the bucket dir"
  [[ $(sha "$T/bucket/$rel") == "$h" ]] || fail "after sync: the bucket's $rel is not its fsynced content"
  n=$((n + 1))
done < "$JOURNAL"
kill -TERM "$FG_PID"
wait "$FG_PID" 2> /dev/null || true
log "PASS: $ITERS power cuts ($REORDERED reordered; seed $SEED), $n fsynced files exact in the bucket, fsck clean after every cut"
