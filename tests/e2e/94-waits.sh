#!/usr/bin/env bash
# 94-waits: waits never hang and daemons stop when told, with the bucket down.
# A private Garage (own state dir and ports, started and stopped by this test only) serves
# the workspace. With Garage stopped and files written:
#   - `deskfs sync --timeout 6` fails and names what it waits for (a written path and its
#     failed attempt) while waiting and in its error;
#   - `deskfs umount --timeout 5` returns within the bound plus a margin with exit status 3
#     and a message saying the data stays in the local journal; the mount is gone and the
#     daemon has exited;
#   - a lazy unmount (`fusermount3 -uz`) with nothing open there: the daemon exits by
#     itself within seconds (it used to drain uploads for 30 s);
#   - a lazy unmount while a process still has a file open there, then SIGTERM: the daemon
#     exits within seconds (it used to ignore SIGTERM: its handler only tried to unmount);
# after each, Garage is started again, the workspace mounted and `deskfs sync`ed: every
# file written while the bucket was down is in the bucket with its exact content.
# e2e-cost: 68
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd python3 fusermount3

# ---- a private Garage: own state dir, a free port triple (PORT, +1, +3)
GARAGE_STATE=$T/garage
port_free() { ! (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }
PORT=
for _ in $(seq 1 50); do
  p=$((20000 + RANDOM % 20000))
  if port_free "$p" && port_free $((p + 1)) && port_free $((p + 3)); then PORT=$p; break; fi
done
[[ -n $PORT ]] || fail "no free port triple for a private Garage"
garage_ctl() { BENCH_STATE=$GARAGE_STATE BENCH_S3_PORT=$PORT BENCH_S3_BACKEND=garage bash "$ROOT/scripts/s3-server.sh" "$@"; }
on_exit 'garage_ctl stop > /dev/null 2>&1'
log "starting a private Garage on 127.0.0.1:$PORT"
garage_ctl start > "$T/garage-env.sh" 2> "$T/garage-start.log" ||
  skip_or_fail "cannot start a private Garage: $(tail -n 5 "$T/garage-start.log")"
# shellcheck disable=SC1091
source "$T/garage-env.sh"
S3_BUCKET=$BENCH_S3_BUCKET
have_s3 || fail "the private Garage does not answer on 127.0.0.1:$PORT"
garage_down() { garage_ctl stop > /dev/null 2>&1 || fail "stopping the private Garage failed"; ! s3_port_open || fail "Garage still answers after stop"; }
garage_up() { garage_ctl start > /dev/null 2> "$T/garage-start.log" || fail "restarting the private Garage failed: $(tail -n 5 "$T/garage-start.log")"; }

NAME=waits
CACHE=$T/cache
EXP=$T/expected
mkdir -p "$EXP"
ws_format "$NAME" --bucket "$(s3_url)"
ws_mount "$NAME" "$MNT" --cache-dir "$CACHE"
echo "before the outage" > "$MNT/base.txt"
echo "before the outage" > "$EXP/base.txt"
mkdir -p "$MNT/sub" "$EXP/sub"
ws_sync "$NAME"

put() { # REL CONTENT: the same file on the mount and in the expected tree
  mkdir -p "$(dirname "$MNT/$1")" "$(dirname "$EXP/$1")"
  printf '%s' "$2" > "$MNT/$1" || fail "writing $1 while the bucket is down failed"
  printf '%s' "$2" > "$EXP/$1"
}
daemon_pid() { python3 -c 'import json,glob,sys; r=[json.load(open(p)) for p in glob.glob(sys.argv[1] + "/*.json")]; print(r[0]["pid"] if r else "")' "$DESKFS_HOME/workspaces/$NAME/run"; }
gone() { ! pid_running "$1"; }
check_bucket() { # WHEN: every expected file is in the bucket, exact
  local f n=0
  while IFS= read -r -d '' f; do
    assert_obj_eq "${f#"$EXP"/}" "$f"
    n=$((n + 1))
  done < <(find "$EXP" -type f -print0)
  log "$1: all $n objects exact"
}
recover() { # WHEN: Garage up, mount, sync, bucket complete, unmount
  garage_up
  ws_mount "$NAME" "$MNT" --cache-dir "$CACHE"
  ws_sync "$NAME"
  check_bucket "$1"
}

log "1. sync and umount --timeout with the bucket down"
garage_down
for i in 1 2 3; do put "down1/w$i.txt" "written while down $i"; done
put sub/deep.txt "deep while down"
rc=0
DFS_TIMEOUT=60 dfs sync "$NAME" --timeout 6 > "$T/sync.out" 2>&1 || rc=$?
((rc != 0 && rc != 124)) || fail "deskfs sync --timeout 6 with the bucket down: exit $rc: $(cat "$T/sync.out")"
grep -q 'down1/w[123].txt\|sub/deep.txt' "$T/sync.out" && grep -q 'attempt [0-9]' "$T/sync.out" ||
  fail "deskfs sync does not name what it waits for (a path and its attempt): $(cat "$T/sync.out")"
log "sync said: $(head -c 400 "$T/sync.out")"

PID=$(daemon_pid)
[[ -n $PID ]] || fail "no mount record with the daemon's pid"
start=$SECONDS
rc=0
DFS_TIMEOUT=120 dfs umount "$MNT" --timeout 5 > "$T/umount.out" 2>&1 || rc=$?
took=$((SECONDS - start))
log "umount --timeout 5: exit $rc after $took s: $(head -c 600 "$T/umount.out")"
((rc == 3)) || fail "deskfs umount --timeout 5 with uploads pending: exit $rc, expected 3: $(cat "$T/umount.out")"
((took <= 30)) || fail "deskfs umount --timeout 5 took $took s"
grep -q 'local journal' "$T/umount.out" || fail "umount does not say the data stays in the local journal: $(cat "$T/umount.out")"
grep -q 'down1/w[123].txt\|sub/deep.txt' "$T/umount.out" || fail "umount does not name what it waited for: $(cat "$T/umount.out")"
not_mounted "$MNT" || fail "$MNT is still mounted after umount --timeout"
wait_for 10 gone "$PID" || fail "daemon $PID still running after umount --timeout"
recover "after umount --timeout and a remount"
ws_umount "$MNT"

log "2. lazy unmount with nothing open: the daemon exits by itself"
ws_mount "$NAME" "$MNT" --cache-dir "$CACHE"
garage_down
put down2/a.txt "lazy, nothing open"
PID=$(daemon_pid)
fusermount3 -uz "$MNT" || fail "fusermount3 -uz failed"
wait_for 15 gone "$PID" || fail "daemon $PID still running 15 s after a lazy unmount with nothing open (bucket down)"
log "daemon exited after the lazy unmount: $(grep -o 'exiting with.*' "$DESKFS_HOME"/workspaces/$NAME/logs/*.log | tail -n 1 | head -c 300)"
recover "after a lazy unmount"
ws_umount "$MNT"

log "3. lazy unmount while a file is open there, then SIGTERM"
ws_mount "$NAME" "$MNT" --cache-dir "$CACHE"
garage_down
put down3/b.txt "lazy, file open, SIGTERM"
sleep 3600 < "$MNT/down3/b.txt" &
HOLDER=$!
register_pid "$HOLDER"
PID=$(daemon_pid)
fusermount3 -uz "$MNT" || fail "fusermount3 -uz failed"
sleep 2
pid_running "$PID" || fail "harness: the daemon exited although a file was still open under the detached mount"
kill -TERM "$PID"
wait_for 15 gone "$PID" || fail "daemon $PID still running 15 s after SIGTERM (lazily unmounted, a file open, bucket down)"
kill -KILL "$HOLDER" 2> /dev/null || true
wait "$HOLDER" 2> /dev/null || true
grep -q 'SIGTERM received' "$DESKFS_HOME"/workspaces/$NAME/logs/*.log || fail "the daemon did not log the SIGTERM"
recover "after SIGTERM"
ws_umount "$MNT"
# Every stop above ended with the last metadata backup failing on the stopped bucket: the
# daemons exited without a panic (a bucket that stalls past the backup's limit instead is
# e2e 58's last step).
if grep -h -A2 'panicked' "$DESKFS_HOME"/workspaces/$NAME/logs/*.log > "$T/panics.txt"; then
  fail "a daemon panicked while exiting: $(head -c 1500 "$T/panics.txt")"
fi

log "PASS"
