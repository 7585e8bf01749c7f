#!/usr/bin/env bash
# 82s-soak: mixed agent workloads for a fixed time under every fault at once: random
# kill -9 of the daemon, power cuts, clean unmounts, and a faulty S3 bucket.
# One workspace on Garage, reached through tests/tools/faultys3.py (each cycle draws a
# fault rate of 0, 5 % or 15 %, or a burst in which every request gets 503 SlowDown);
# its home (metadata database) and cache dir on the power-loss file system (crates/lossfs).
# Each cycle: mount --foreground -> three workloads at once, each journaling its promises
# to the real disk only after the call returned:
#   * tests/tools/agentload.py: rounds of `tar -x` of an npm-style tree, `git clone` and
#     a commit; SQLite transactions (WAL, synchronous=FULL) on one database kept for the
#     whole run;
#   * tests/tools/crashload.py: write-once files (fsynced, closed, held open), atomic
#     replacements, renames, deletes;
#   * tests/tools/powerload.py: fsynced files and atomic replacements with a directory
#     fsync;
# -> 2-12 s -> one event, drawn at random:
#   kill   (45 %) kill -9 of the daemon: what was closed survives (crashload and
#          agentload hold the tree to it: whole tar trees, `git fsck --strict`, every
#          closed file exact);
#   power  (35 %) kill -9 and a power cut (`lossfs cut`, every other one with reordered
#          survivors): what was fsynced survives (powerload: every fsynced file and
#          replacement exact; agentload: every returned SQLite commit present,
#          integrity_check ok; crashload starts over in a new directory after `rm -r` of
#          the old one, which must succeed);
#   umount (20 %) the workloads stopped, then `deskfs umount --no-wait`: as kill;
# -> the dead mount removed -> `deskfs fsck`: 0 problems -> the next cycle mounts and
# checks. At the end: faults off, a mount, the checks, `deskfs sync`, and every file of
# the mount is in Garage with its content (read straight from Garage, not through the
# proxy), nothing else is; then every fault kind of the proxy happened.
#   DESKFS_SOAK_SECS   how long the cycles run (default 120; 1800 with
#                      DESKFS_TEST_LONG=1, i.e. `scripts/test.sh --long`)
#   DESKFS_SOAK_SEED   seed of the run (default random; printed; replays the draws, not
#                      the exact moments)
# Printed at the end: cycles, events by kind, bursts, journal lines checked, SQLite rows,
# the daemon's peak RSS over all cycles.
# e2e-cost: 188
# e2e-timeout: 900
# e2e-long-timeout: 3600
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3
need_cmd git tar

if [[ ${DESKFS_TEST_LONG:-0} == 1 ]]; then SECS=${DESKFS_SOAK_SECS:-1800}; else SECS=${DESKFS_SOAK_SECS:-120}; fi
SEED=${DESKFS_SOAK_SEED:-$((RANDOM * 32768 + RANDOM))}
RANDOM=$SEED
log "seed $SEED, $SECS s of cycles (replay: DESKFS_SOAK_SEED=$SEED DESKFS_SOAK_SECS=$SECS)"

AL=$ROOT/tests/tools/agentload.py
CL=$ROOT/tests/tools/crashload.py
PL=$ROOT/tests/tools/powerload.py
SRC=$T/src
python3 "$AL" prepare --src "$SRC" || fail "agentload prepare failed"

echo '{"rate": 0}' > "$T/proxy.ctl"
python3 "$LIB_DIR/tools/faultys3.py" --listen 127.0.0.1:0 --to "$BENCH_S3_ENDPOINT" \
  --rate 0 --seed "$SEED" --control "$T/proxy.ctl" --stats "$T/proxy.stats" \
  > "$T/proxy.addr" 2> "$T/proxy.log" &
register_pid $!
wait_for 10 test -s "$T/proxy.addr" || fail "the fault proxy did not start: $(cat "$T/proxy.log")"
EP=http://$(head -n 1 "$T/proxy.addr")
faults() { echo "$1" > "$T/proxy.ctl.tmp" && mv "$T/proxy.ctl.tmp" "$T/proxy.ctl"; }

lossfs_start
ctl() { lossfs_ctl "$@"; }
export DESKFS_HOME=$LFS/home
mkdir -p "$DESKFS_HOME"
NAME=soak
ws_format "$NAME" --bucket "$(s3_url)" --endpoint "$EP" --region "$BENCH_S3_REGION"
ctl sync > /dev/null || fail "lossfs sync failed"
CACHE=$LFS/cache

AJ=$T/agent.journal PJ=$T/power.journal
touch "$AJ" "$PJ"
GEN=1   # crashload's generation: a power cut starts a new one (closed files are not promised)
CJ=$T/crash.1.journal
touch "$CJ"

remove_dead_mount() {
  is_mounted "$MNT" || return 0
  timeout 20 fusermount3 -u "$MNT" > /dev/null 2>&1 || force_unmount "$MNT" || fail "cannot remove the dead mount $MNT"
}

FSCKS=0
fsck_clean() { # WHEN
  local out rc=0
  FSCKS=$((FSCKS + 1))
  out=$(DFS_TIMEOUT=300 dfs fsck "$NAME" 2>&1) || rc=$?
  printf '%s\n' "$out" > "$T/fsck.$FSCKS.out"
  ((rc == 0)) && grep -q '\b0 problems' <<< "$out" \
    || fail "$1: deskfs fsck (exit $rc, seed $SEED; all of it in $T/fsck.$FSCKS.out): $(grep -v '^note' <<< "$out" | head -c 2000)"
}

# check_all WHEN kill|power: every workload's checker against its journal.
check_all() {
  local rc=0 out
  out=$(timeout -k 5 600 python3 "$AL" check --mnt "$MNT/agent" --journal "$AJ" --src "$SRC" --after "$2" 2>&1) || rc=$?
  ((rc == 0)) || fail "$1: agentload check (seed $SEED): $(head -c 2500 <<< "$out")"
  local a=$out
  out=$(timeout -k 5 600 python3 "$PL" check --mnt "$MNT/power" --journal "$PJ" 2>&1) || rc=$?
  ((rc == 0)) || fail "$1: powerload check (seed $SEED): $(head -c 2500 <<< "$out")"
  local p=$out
  if [[ $2 == power ]]; then
    # closed-only files were never promised across a power cut: crashload starts over
    if [[ -e $MNT/crash.$GEN ]]; then
      rm -r "$MNT/crash.$GEN" 2> "$T/rm.err" || fail "$1: rm -r of crashload's directory after the power cut failed: $(head -c 500 "$T/rm.err")"
    fi
    GEN=$((GEN + 1))
    CJ=$T/crash.$GEN.journal
    touch "$CJ"
  fi
  mkdir -p "$MNT/crash.$GEN"
  out=$(timeout -k 5 600 python3 "$CL" check --mnt "$MNT/crash.$GEN" --journal "$CJ" 2>&1) || rc=$?
  if ((rc != 0)); then
    printf '%s\n' "$out" > "$T/crashload-check.$GEN.out"
    # its PROBLEMS section, or (a crash of the checker, a timeout) the end of its output
    local why
    why=$(grep -A 8 PROBLEMS <<< "$out" | head -c 2500)
    [[ -n $why ]] || why="exit $rc, no PROBLEMS section; last lines: $(tail -n 15 <<< "$out" | tail -c 2500)"
    fail "$1: crashload check (seed $SEED; all of it in $T/crashload-check.$GEN.out): $why"
  fi
  log "$1: agent: $(tail -n 1 <<< "$a"); power: $(head -n 1 <<< "$p"); crash: $(tail -n 1 <<< "$out")"
}

WLS=()
start_workloads() { # CYCLE
  local c=$1
  setsid python3 "$AL" work --mnt "$MNT/agent" --journal "$AJ" --src "$SRC" --seed "$((SEED * 1000 + c))" > "$T/agent.$c.out" 2>&1 < /dev/null &
  WLS=($!)
  setsid python3 "$CL" work --mnt "$MNT/crash.$GEN" --journal "$CJ" --iter "$c" --seed "$((SEED * 1000 + c))" > "$T/crash.$c.out" 2>&1 < /dev/null &
  WLS+=($!)
  setsid python3 "$PL" work --mnt "$MNT/power" --journal "$PJ" --iter "$c" --seed "$((SEED * 1000 + c))" --keep-iters 2 > "$T/power.$c.out" 2>&1 < /dev/null &
  WLS+=($!)
  local p
  for p in "${WLS[@]}"; do register_pid "$p"; done
  for f in agent crash power; do
    wait_for 60 grep -q READY "$T/$f.$c.out" || fail "cycle $c: $f workload not ready: $(tail -n 5 "$T/$f.$c.out")"
  done
}

# workloads_running CYCLE: each must still be running (a workload stops only on an error
# from the mount); checked before the event, which makes them fail.
workloads_running() {
  local f i=0
  for f in agent crash power; do
    pid_running "${WLS[i]}" || fail "cycle $1: the $f workload died before the event: $(tail -n 8 "$T/$f.$1.out")"
    i=$((i + 1))
  done
}

# stop_workloads: each one's whole process group is killed (git, tar and sqlite with it).
stop_workloads() {
  local p
  for p in "${WLS[@]}"; do kill -KILL -- "-$p" 2> /dev/null || true; done
  for p in "${WLS[@]}"; do wait "$p" 2> /dev/null || true; done
}

sleep_ms() { sleep "$(($1 / 1000)).$(printf '%03d' $(($1 % 1000)))"; }

declare -A EVENTS=([kill]=0 [power]=0 [umount]=0)
BURSTS=0 PEAK_KB=0 REORDERED=0
RATES=(0 0.05 0.15)
AFTER=kill
START=$SECONDS
c=0
mkdir -p "$MNT"
while ((SECONDS - START < SECS)); do
  c=$((c + 1))
  ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
  DAEMON=$FG_PID
  mkdir -p "$MNT/agent" "$MNT/power"
  check_all "cycle $c (after $AFTER)" "$AFTER"
  draw=$((RANDOM % 100))
  if ((draw < 10)); then
    fault='{"burst": "503"}'
    BURSTS=$((BURSTS + 1))
  else
    fault="{\"rate\": ${RATES[draw % 3]}}"
  fi
  faults "$fault"
  start_workloads "$c"
  run_ms=$((2000 + RANDOM % 10000))
  sleep_ms "$run_ms"
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$DAEMON/status" 2> /dev/null || echo 0)
  ((hwm > PEAK_KB)) && PEAK_KB=$hwm
  draw=$((RANDOM % 100))
  if ((draw < 45)); then ev=kill; elif ((draw < 80)); then ev=power; else ev=umount; fi
  faults "{\"rate\": 0.05}"
  workloads_running "$c"
  case $ev in
    kill | power)
      kill -KILL "$DAEMON"
      wait "$DAEMON" 2> /dev/null || true
      stop_workloads
      ;;
    umount)
      stop_workloads
      DFS_TIMEOUT=120 dfs_ok umount "$MNT" --no-wait > /dev/null
      wait "$DAEMON" 2> /dev/null || true
      ;;
  esac
  remove_dead_mount
  detail=
  if [[ $ev == power ]]; then
    if ((RANDOM % 2)); then
      out=$(ctl cut --reorder "$((SEED + c))") || fail "cycle $c: lossfs cut --reorder failed: $out"
      REORDERED=$((REORDERED + 1))
    else
      out=$(ctl cut) || fail "cycle $c: lossfs cut failed: $out"
    fi
    detail="; ${out:0:100}"
    AFTER=power
  else
    AFTER=kill
  fi
  EVENTS[$ev]=$((EVENTS[$ev] + 1))
  log "cycle $c: faults $fault, $ev after $run_ms ms (daemon peak RSS $((hwm / 1024)) MiB)$detail"
  fsck_clean "after cycle $c"
done

log "final: faults off, mount, checks, sync, bucket"
faults '{"rate": 0}'
ws_mount_fg "$NAME" "$MNT" --cache-dir "$CACHE"
mkdir -p "$MNT/agent" "$MNT/power"
check_all "final (after $AFTER)" "$AFTER"
ws_sync "$NAME"
(cd "$MNT" && find . -type f -printf '%P\0' | sort -z | xargs -0 -r sha256sum) > "$T/mnt.sha" || fail "reading the mount's files failed"
mkdir -p "$T/got"
rc copy --transfers 16 --checkers 16 "$(rc_path "$S3_PREFIX")" "$T/got" --exclude '.deskfs/**' > "$T/rclone-get.log" 2>&1 \
  || fail "rclone copy back from Garage failed: $(tail -n 20 "$T/rclone-get.log")"
(cd "$T/got" && find . -type f -printf '%P\0' | sort -z | xargs -0 -r sha256sum) > "$T/got.sha"
diff "$T/mnt.sha" "$T/got.sha" > "$T/bucket.diff" \
  || fail "after sync, Garage differs from the mount (< mount, > Garage): $(head -n 20 "$T/bucket.diff")"
nfiles=$(wc -l < "$T/mnt.sha")
kill -TERM "$FG_PID"
wait "$FG_PID" 2> /dev/null || true
remove_dead_mount
python3 - "$T/proxy.stats" <<'PY' || fail "not every fault kind happened: $(cat "$T/proxy.stats")"
import json, sys
s = json.load(open(sys.argv[1]))
missing = [k for k, n in s["faults"].items() if n == 0]
print(f"proxy: {s['requests']} requests, faults {s['faults']}", file=sys.stderr)
sys.exit(1 if missing else 0)
PY
rows=$(awk '$1 == "commit" {n = $2} END {print n + 0}' "$AJ")
rounds=$(awk '$1 == "done"' "$AJ" | wc -l)
jl=$(($(wc -l < "$AJ") + $(wc -l < "$PJ") + $(cat "$T"/crash.*.journal | wc -l)))
log "PASS: $c cycles in $((SECONDS - START)) s (seed $SEED): ${EVENTS[kill]} kill -9, ${EVENTS[power]} power cuts ($REORDERED reordered), ${EVENTS[umount]} unmounts; $BURSTS 503 bursts; $rounds agent rounds (tar + git clone + commit), $rows SQLite commits, $jl journal lines held to their promises; $FSCKS fsck runs clean; $nfiles files in Garage exactly as on the mount; daemon peak RSS $((PEAK_KB / 1024)) MiB"
