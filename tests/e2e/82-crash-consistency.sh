#!/usr/bin/env bash
# 82-crash-consistency: repeated kill -9 of the daemon in the middle of a random workload,
# on one embedded workspace that accumulates across iterations. Each iteration:
#   mount --foreground (daemon PID recorded) -> check the tree against the journal of every
#   earlier iteration (tests/tools/crashload.py check) -> start the workload (crashload.py
#   work: write-once files with self-verifying content, some fsynced, some only closed, some
#   held open; atomic replace = write tmp + fsync + rename over a target; renames to new
#   names; deletes), which journals each op to a file on LOCAL disk only after the syscall
#   returned -> random sleep 0.2-2 s -> kill -9 of the daemon, then of the workload ->
#   fusermount3 -u of the dead mount -> `deskfs fsck NAME` must report 0 problems (skipped
#   with a note while deskfs has no fsck command).
# The check (see crashload.py): fsynced and closed files have exactly their journaled
# content; atomically replaced targets hold one complete version, at least the last
# journaled one; moved files exist at exactly one of old/new (new if journaled); deleted
# files stay deleted; no other file exists and no file fails its self-check except files
# being written at the kill (those are removed before the next workload).
# At the end: a normal mount, the same check, `deskfs sync`, the bucket dir holds every
# expected file with the expected content, and after umount nothing else.
#   DESKFS_CRASH_ITERS   iterations (default 15)
#   DESKFS_CRASH_SEED    seed of the whole run (default random; printed; replays the
#                        workload and kill delays, not the exact kill moment)
# e2e-cost: 32
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs

CL=$ROOT/tests/tools/crashload.py
[[ -f $CL ]] || fail "missing $CL"
ITERS=${DESKFS_CRASH_ITERS:-15}
SEED=${DESKFS_CRASH_SEED:-$((RANDOM * 32768 + RANDOM))}
RANDOM=$SEED
log "seed $SEED, $ITERS iterations (replay: DESKFS_CRASH_SEED=$SEED DESKFS_CRASH_ITERS=$ITERS)"

NAME=crashc
JOURNAL=$T/journal   # local disk, never on the mount
ws_format "$NAME"
BUCKET_DIR=$DESKFS_HOME/workspaces/$NAME/bucket

HAVE_FSCK=0
if "$DESKFS" fsck --help > /dev/null 2>&1; then HAVE_FSCK=1; else log "NOTE: deskfs has no fsck command yet: the fsck checks are SKIPPED"; fi
FSCK_RUNS=0

run_fsck() { # WHEN
  ((HAVE_FSCK)) || return 0
  local out rc=0
  out=$(DFS_TIMEOUT=300 dfs fsck "$NAME" 2>&1) || rc=$?
  printf '%s\n' "$out" > "$T/fsck.$FSCK_RUNS.out"
  FSCK_RUNS=$((FSCK_RUNS + 1))
  if ((rc != 0)) || ! grep -q '\b0 problems' <<< "$out"; then
    # recorded, not fatal at once: the crash checks of the following iterations still run
    log "$1: deskfs fsck $NAME reports problems (exit $rc; copy of the metadata in $T/fsck.$FSCK_RUNS.meta/):"
    ws_meta_snapshot "$NAME" "$T/fsck.$FSCK_RUNS.meta"   # meta.db* (SQLite) or a pg_dump (PostgreSQL)
    local n
    n=$(wc -l <<< "$out")
    if ((n <= 14)); then
      printf '%s\n' "$out" >&2
    else
      head -n 12 <<< "$out" >&2
      echo "    ... ($((n - 13)) more lines)" >&2
      tail -n 1 <<< "$out" >&2
    fi
    FSCK_FAILS+=("$1: exit $rc: $(grep -m1 -E 'problems' <<< "$out"); kinds: $(grep -oE '^PROBLEM +\[[a-z-]+\]' <<< "$out" | sort | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? ", " : ""), $3, $1}')")
    return 0
  fi
  log "$1: fsck: $(grep -m1 '0 problems' <<< "$out")"
}
FSCK_FAILS=()

check_tree() { # WHEN
  local rc=0
  timeout -k 5 600 python3 "$CL" check --mnt "$MNT" --journal "$JOURNAL" > "$T/check.out" 2>&1 || rc=$?
  cat "$T/check.out" >&2
  ((rc == 0)) || fail "$1: the tree does not match the journal (seed $SEED): $(grep -A 8 PROBLEMS "$T/check.out" | head -c 2500)"
}

remove_dead_mount() {
  is_mounted "$MNT" || return 0
  timeout 20 fusermount3 -u "$MNT" > "$T/fusermount.out" 2>&1 || {
    log "fusermount3 -u of the dead mount failed ($(cat "$T/fusermount.out")), forcing"
    force_unmount "$MNT" || fail "cannot remove the dead mount $MNT"
  }
}

declare -A KILLED_IN=()
for ((i = 1; i <= ITERS; i++)); do
  ws_mount_fg "$NAME" "$MNT"
  DAEMON=$FG_PID
  check_tree "iteration $i (after the crash of iteration $((i - 1)))"
  if ((HAVE_FSCK && i == 1)); then
    rc=0
    out=$(DFS_TIMEOUT=60 dfs fsck "$NAME" 2>&1) || rc=$?
    ((rc != 0)) || fail "deskfs fsck $NAME ran (exit 0) while the workspace is mounted at $MNT: $(head -c 500 <<< "$out")"
    log "ok: deskfs fsck refuses while mounted (exit $rc): $(head -n 1 <<< "$out")"
  fi
  wseed=$((SEED * 100 + i))
  delay_ms=$((200 + RANDOM % 1801))
  python3 "$CL" work --mnt "$MNT" --journal "$JOURNAL" --iter "$i" --seed "$wseed" > "$T/work.$i.out" 2>&1 &
  WL=$!
  register_pid "$WL"
  wait_for 30 grep -q READY "$T/work.$i.out" || fail "iteration $i: workload not ready: $(tail -n 5 "$T/work.$i.out")"
  lines0=$(wc -l < "$JOURNAL")
  sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
  pid_running "$WL" || fail "iteration $i: the workload died before the kill (deskfs returned an error?): $(tail -n 15 "$T/work.$i.out")"
  kill -KILL "$DAEMON"
  wait "$DAEMON" 2> /dev/null || true
  kill -KILL "$WL" 2> /dev/null || true
  wait "$WL" 2> /dev/null || true
  nlines=$(($(wc -l < "$JOURNAL") - lines0))
  last=$(tail -n 1 "$JOURNAL" | cut -d' ' -f1)
  KILLED_IN[$last]=$((${KILLED_IN[$last]:-0} + 1))
  log "iteration $i: workload seed $wseed, kill -9 after ${delay_ms} ms, $nlines journal lines, last journaled op '$last'"
  remove_dead_mount
  run_fsck "iteration $i"
done
log "$ITERS iterations done (last journaled op at the kills: $(for k in "${!KILLED_IN[@]}"; do printf '%s=%s ' "$k" "${KILLED_IN[$k]}"; done))"

log "final: normal mount, check, sync, bucket"
ws_mount "$NAME" "$MNT"
check_tree "final check after $ITERS crashes"
python3 "$CL" expect --journal "$JOURNAL" > "$T/expected" || fail "crashload expect failed"
nexp=$(wc -l < "$T/expected")
ws_sync "$NAME"
checked=0
while read -r h rel; do
  [[ -f $BUCKET_DIR/$rel ]] || fail "after sync: $rel is missing in the bucket dir"
  got=$(sha "$BUCKET_DIR/$rel")
  [[ $got == "$h" ]] || fail "after sync: bucket dir $rel has other content (sha256 ${got:0:12}, expected ${h:0:12})"
  checked=$((checked + 1))
done < "$T/expected"
log "bucket dir: all $checked expected files have their content after sync"
ws_umount "$MNT"
(cd "$BUCKET_DIR" && find . -path ./.deskfs -prune -o -type f -print | sed 's|^\./||' | sort) > "$T/bucket.list"
cut -d' ' -f2 "$T/expected" | sort > "$T/expected.list"
if ! diff "$T/expected.list" "$T/bucket.list" > "$T/bucket.diff"; then
  fail "after umount the bucket dir has other files than the workspace (< expected only, > bucket only): $(head -n 20 "$T/bucket.diff")"
fi
run_fsck "after the final umount"
if ((${#FSCK_FAILS[@]})); then
  printf '  fsck: %s\n' "${FSCK_FAILS[@]}" >&2
  fail "deskfs fsck reported problems ${#FSCK_FAILS[@]} of $FSCK_RUNS times (the crash checks themselves passed, seed $SEED): ${FSCK_FAILS[0]}"
fi
log "PASS: $ITERS kill -9 iterations (seed $SEED), $nexp files checked, fsck $( ((HAVE_FSCK)) && echo "ran $FSCK_RUNS times" || echo "SKIPPED (not implemented)")"
