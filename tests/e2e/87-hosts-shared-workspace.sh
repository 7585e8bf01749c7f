#!/usr/bin/env bash
# 87-hosts-shared-workspace: one workspace shared by three "hosts" (network namespaces h1,
# h2, h3 of tests/hosts.sh), each with its own deskfs daemon, DESKFS_HOME, cache dir and
# mount point, reaching PostgreSQL (a private server on the bridge, hosts_pg_private, so a
# partition really cuts the TCP connections) and Garage (hosts_forward) only through its
# veth. File I/O runs in the root namespace on the hosts' mount points (FUSE mounts live
# in the root mount namespace; only the daemons live in the hosts).
#   1. format on h1 (--meta postgres://USER@BRIDGE:PORT/DB?schema=ws&op_timeout=5, password
#      from PGPASSWORD, an S3 bucket), attach on h2 and h3, mount on all three (--lease 8
#      --remote-wait 6); no password in any workspace.toml; status peers = OtherHosts; a
#      file written on h1 is read on h2 and h3
#   2. coherence across hosts (tests/tools/coherence.py): close-to-open (writer h1, readers
#      h2+h3, 160 rounds of grow/shrink/append/replace/delete: never stale or torn),
#      trunc-rewrite (h2/h3; then four at once, h3/h2), handover (h2 -> h1), git-refs (h3 -> h1), sqlite (rollback
#      journal, writers on h1 and h2), rename-storm (writer h1, readers on h1, h2, h3); no
#      healthy mount was fenced meanwhile
#   3. locks: one counter process per host mount, all at once, 40 increments each under
#      flock, then under fcntl (POSIX) locks: the count is exactly 120 through every mount;
#      still no mount fenced
#   4. kill -9 of h2's daemon while a process on h2's mount holds an flock: a blocked waiter
#      on h1 gets it within lease + lease/6 + 4 s (measured, printed); the dead mount is
#      cleaned up (force_unmount) and h2 mounts again
#   5. partition of h3 (remounted with --upload-delay-ms 3600000): h3 holds an flock on L,
#      has a closed-but-unuploaded file D and files F and G open with unclosed writes.
#      Cut off: a blocked flock waiter on h1 gets L after about the lease (not before h3's
#      lease ran out: 8 s after its last renewal, read from ws.sessions; not later than
#      lease + lease/6 + 4 s after the cut); an open of D on h1 fails with EIO after
#      remote-wait (-1 s .. +4 s), listed (D's inode) in h1's status waiting_for meanwhile;
#      h1 rewrites F. Healed: h3 reports the fence (status fences.count >= 1, "session lease
#      was lost" in its log); closing F on h3 leaves F with h1's bytes and
#      F.deskfs-conflict-h3-UNIXTIME with h3's bytes; G (changed by nobody else) gets h3's
#      bytes and no conflict copy; D becomes readable on h1 with h3's bytes (deskfs sync on
#      h3 if asking h3 is not enough); h3's old flock holder holds nothing, and its exit
#      does not release a new holder's lock
#   6. every mount unmounts cleanly (deskfs umount in its host); no process is left in the
#      hosts; the workspace's sessions, locks, open-file records, upload requests and
#      pending uploads are empty in the database; the bucket holds F, G, D and the conflict
#      copy with the right bytes
# Checks that fail are reported as "FAILED CHECK: ..." and the test goes on (later parts
# do not depend on them); it fails at the end with the list. Figures printed (MEASURED):
# lock takeover after kill -9 and after the partition, the EIO wait.
# e2e-cost: 99
# e2e-timeout: 600
# shellcheck disable=SC2016
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../hosts.sh"
need_deskfs
need_hosts
need_pg
need_s3
need_cmd psql git python3

COH=$ROOT/tests/tools/coherence.py
LT=$ROOT/tests/tools/locktool.py
[[ -f $COH && -f $LT ]] || fail "missing $COH or $LT"

# Why these values:
#  LEASE=8: a dead or cut-off host's locks come free after 8 s (the default 30 s would make
#    parts 4 and 5 take minutes); heartbeats then run every 8/6 = 1.33 s, so a healthy
#    daemon is expired only if it misses six of them in a row (part 2 checks none was).
#  REMOTE_WAIT=6: an open waits at most 6 s for content only another host's journal holds.
#    A healthy holder uploads a file of a few MiB to Garage well within that; and it is
#    shorter than the lease, so the EIO of part 5 comes while h3's session still counts as
#    alive: what is measured is the wait for an unreachable holder, not an expiry.
#  op_timeout=5 (in the URL): every database call of the cut-off h3 fails after 5 s
#    instead of 30 s, so its daemon keeps answering and recovers quickly after the heal.
#  SLACK=4: the bound for a lock takeover is lease + lease/6 + 4 s (waking the waiter
#    through NOTIFY on a loaded 2-core machine); the EIO must come within remote-wait + 4 s.
#  --upload-delay-ms 3600000 for h3 in part 5: D stays only in h3's journal.
LEASE=8
REMOTE_WAIT=6
SLACK=4
HB=$(awk -v l=$LEASE 'BEGIN { printf "%.2f", l / 6 }')
BOUND=$(awk -v l=$LEASE -v h="$HB" -v s=$SLACK 'BEGIN { printf "%.2f", l + h + s }')
WS=ws
HOSTS=(h1 h2 h3)
declare -A HHOME HMNT HCACHE HLOG HPID

# ---------------------------------------------------------------- helpers
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }
fle() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }   # a <= b (decimals)

# bad MESSAGE: a failed check; the test goes on and fails at the end
BAD=()
bad() {
  printf 'FAILED CHECK: %s\n' "$*" >&2
  BAD+=("$*")
}

# hd HOST ARGS...: deskfs inside HOST (its network and UTS namespaces, its DESKFS_HOME)
hd() {
  local h=$1
  shift
  host_run "$h" env DESKFS_HOME="${HHOME[$h]}" timeout -k 5 "${DFS_TIMEOUT:-120}" "$DESKFS" "$@" < /dev/null
}
hd_ok() {
  local h=$1 out rc=0
  shift
  out=$(hd "$h" "$@" 2>&1) || rc=$?
  ((rc == 0)) || fail "deskfs $* on $h failed (exit $rc): $out"
  [[ -z $out ]] || printf '%s\n' "$out" | sed "s/^/    [$h] /" >&2
}

# hmount HOST [ARGS...]: deskfs mount inside HOST; sets HPID[HOST] (daemon) and HLOG[HOST]
hmount() {
  local h=$1 out=$T/mount.$1.out pid
  shift
  mkdir -p "${HMNT[$h]}"
  register_mount "${HMNT[$h]}"
  log "$h: deskfs mount $WS ${HMNT[$h]} --cache-dir ${HCACHE[$h]} --lease $LEASE --remote-wait $REMOTE_WAIT $*"
  hd "$h" mount "$WS" "${HMNT[$h]}" --cache-dir "${HCACHE[$h]}" --lease "$LEASE" --remote-wait "$REMOTE_WAIT" "$@" > "$out" 2>&1 ||
    fail "deskfs mount on $h failed: $(head -c 2000 "$out")"
  wait_for 5 is_mounted "${HMNT[$h]}" || fail "deskfs mount on $h returned 0 but ${HMNT[$h]} is not mounted"
  is_alive "${HMNT[$h]}" || fail "${HMNT[$h]} (mounted by $h) does not answer stat within 5 s"
  pid=$(sed -n 's/.*daemon pid \([0-9]*\).*/\1/p' "$out")
  HLOG[$h]=$(sed -n 's/.*, log \(.*\))$/\1/p' "$out")
  [[ -n $pid && -n ${HLOG[$h]} ]] || fail "cannot find the daemon pid and log in the output of deskfs mount on $h: $(cat "$out")"
  grep -qx "$pid" <<< "$(host_pids "$h")" || fail "the daemon of $h (pid $pid) does not run in $h's network namespace"
  HPID[$h]=$pid
  register_pid "$pid"
}

# hlive HOST PYEXPR: PYEXPR evaluated on `l`, the `live` object of HOST's only mount in
# `deskfs status --json` (run inside HOST); prints "status-failed: ..." and returns 1 if
# status fails
hlive() {
  local h=$1
  DFS_TIMEOUT=30 hd "$h" status "$WS" --json > "$T/status.$h.json" 2> "$T/status.$h.err" ||
    { echo "status-failed: $(head -c 300 "$T/status.$h.err")"; return 1; }
  python3 - "$T/status.$h.json" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
live = [m["live"] for m in d.get("mounts", []) if m.get("live")]
if len(live) != 1:
    print("status-failed: %d live mounts" % len(live))
    sys.exit(1)
l = live[0]
print(eval(sys.argv[2]))
PY
}

coh() { # coherence.py ARGS...
  log "coherence.py $*"
  local out rc=0 t0=$SECONDS
  out=$(timeout -k 5 150 python3 "$COH" "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | sed 's/^/    /' >&2
  if ((rc != 0)); then
    local why
    why=$(printf '%s\n' "$out" | grep -E '^FAIL' | tail -n 1) || true
    [[ -n $why ]] || why=$(printf '%s\n' "$out" | grep -v '^\s*$' | tail -n 1) || true   # a traceback: its last line
    bad "coherence.py $1 across hosts: $why$( ((rc == 124)) && echo " (timed out after 150 s)")"
  fi
  log "  ($1: $((SECONDS - t0)) s)"
}

# coh_together N ARGS...: N coherence.py runs of ARGS at once (each makes a directory of
# its own), each a check of its own.
coh_together() {
  local n=$1 i pids=() t0=$SECONDS
  shift
  log "coherence.py $* (x$n at once)"
  for ((i = 0; i < n; i++)); do
    timeout -k 5 150 python3 "$COH" "$@" > "$T/together.$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      sed 's/^/    /' "$T/together.$i.out" >&2
      bad "coherence.py $1 across hosts (run $i of $n at once): $(grep -E '^FAIL' "$T/together.$i.out" | tail -n 1)"
    fi
  done
  log "  ($1 x$n: $((SECONDS - t0)) s)"
}

lt() { timeout -k 5 60 python3 "$LT" "$@" < /dev/null; }
lt_check() { # RC WHAT locktool-args...: the one-shot locktool command must exit RC
  local want=$1 what=$2 rc=0 out
  shift 2
  out=$(lt "$@" 2>&1) || rc=$?
  if ((rc == want)); then log "ok: $what -> $out"; else bad "$what: locktool $* exited $rc (expected $want): $out"; fi
}
_actor=0
bg_actor() { # VAR locktool-args...: background actor, VAR=pid, VAR_OUT=output file
  local var=$1
  shift
  _actor=$((_actor + 1))
  local out=$T/actor.$_actor.out
  python3 "$LT" "$@" > "$out" 2>&1 < /dev/null &
  local pid=$!
  register_pid "$pid"
  disown "$pid"
  printf -v "$var" '%s' "$pid"
  printf -v "${var}_OUT" '%s' "$out"
}
wait_out() { # FILE PATTERN SECS WHAT (hard: what follows depends on it)
  wait_for "$3" grep -q -- "$2" "$1" || fail "$4: no '$2' within $3 s (output: $(head -c 500 "$1"))"
}
stop_pid() { kill -KILL "$1" 2> /dev/null || true; wait_for 10 eval '! pid_running '"$1" || fail "process $1 does not die"; }
still_waiting() { # OUTFILE WHAT
  sleep 1
  grep -q WAITING "$1" || fail "$2: the waiter did not start: $(head -c 300 "$1")"
  ! grep -qE 'GOT|ERROR|TIMEOUT' "$1" || fail "$2: the waiter was not blocked while the lock was held: $(cat "$1")"
}
got_epoch() { sed -n 's/^GOT .* epoch=\([0-9.]*\).*/\1/p' "$1"; }

# A writer that keeps the file open (root namespace): writes SRC into PATH (O_RDWR, at
# offset 0, no truncation), prints WRITTEN, closes at SIGUSR1 and prints CLOSED or
# CLOSE-ERROR <errno>. A timed open+read: "OK <size> <sha256> <secs>" or "ERR <errno> <secs>".
cat > "$T/hold_write.py" <<'PY'
import errno, os, signal, sys, time
path, src = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()
go = []
signal.signal(signal.SIGUSR1, lambda *_: go.append(1))
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, data, 0)
print("WRITTEN %d" % len(data), flush=True)
while not go:
    time.sleep(0.05)
try:
    os.close(fd)
    print("CLOSED", flush=True)
except OSError as e:
    print("CLOSE-ERROR %s %s" % (errno.errorcode.get(e.errno, e.errno), e.strerror), flush=True)
PY
cat > "$T/timed_read.py" <<'PY'
import errno, hashlib, sys, time
t0 = time.monotonic()
try:
    with open(sys.argv[1], "rb") as f:
        d = f.read()
    print("OK %d %s %.2f" % (len(d), hashlib.sha256(d).hexdigest(), time.monotonic() - t0), flush=True)
except OSError as e:
    print("ERR %s %.2f" % (errno.errorcode.get(e.errno, e.errno), time.monotonic() - t0), flush=True)
PY
timed_read() { timeout -k 5 120 python3 "$T/timed_read.py" "$1"; }
# whose FILE: which of the test's contents FILE holds (for messages)
whose() {
  local got f
  got=$(timeout -k 5 60 cat "$1" 2> /dev/null | sha256sum | cut -d' ' -f1) || true
  for f in F.v0 F.h1 F.h3 G.h3 D.h3; do
    [[ -f $T/$f && $(sha "$T/$f") == "$got" ]] && { echo "the bytes of $f"; return 0; }
  done
  echo "other bytes ($(stat -c %s "$1" 2>&1), sha256 ${got:0:12})"
}
# check_bytes FILE REF WHAT: FILE holds exactly REF's bytes
check_bytes() {
  local got
  got=$(timed_read "$1") || got="timed out: $got"
  if [[ $got == "OK "* && $(cut -d' ' -f3 <<< "$got") == "$(sha "$2")" ]]; then
    log "ok: $3"
  elif [[ $got == "OK "* ]]; then
    bad "$3: $1 holds $(whose "$1"), expected the bytes of ${2##*/}"
  else
    bad "$3: reading $1 failed: $got"
  fi
}
# pgq SQL: a query on the workspace's database, as the superuser (root namespace)
pgq() { PGCONNECT_TIMEOUT=10 timeout -k 5 60 psql -X -q -t -A -v ON_ERROR_STOP=1 "$DESKFS_TEST_PG_ADMIN dbname=$DB_NAME" -c "$1"; }

# ---------------------------------------------------------------- 1. hosts, format, attach, mount
hosts_up 3
hosts_pg_private
DB_URL=$(pg_fresh_db shared)
HOST_URL=$(hosts_pg_url "$DB_URL")
re='^postgres://([^:@/]+)(:[^@/]*)?@([^/]+)/([^?]+)'
[[ $HOST_URL =~ $re ]] || fail "cannot parse the PostgreSQL URL for the hosts: ${HOST_URL%%:*}://…"
DB_NAME=${BASH_REMATCH[4]}
# no password in the URL: deskfs reads PGPASSWORD (exported by hosts_pg_private)
META="postgres://${BASH_REMATCH[1]}@${BASH_REMATCH[3]}/$DB_NAME?schema=ws&op_timeout=5"
[[ -n ${PGPASSWORD:-} ]] || fail "PGPASSWORD is not set after hosts_pg_private"
EP=$(hosts_s3_endpoint)
log "metadata $META, S3 endpoint $EP, bucket $(s3_url)"
for h in "${HOSTS[@]}"; do
  HHOME[$h]=$T/home-$h
  HMNT[$h]=$T/m-$h
  HCACHE[$h]=$T/cache-$h
  mkdir -p "${HHOME[$h]}"
done
M1=${HMNT[h1]} M2=${HMNT[h2]} M3=${HMNT[h3]}
hd_ok h1 format "$WS" --meta "$META" --bucket "$(s3_url)" --endpoint "$EP" --region "$BENCH_S3_REGION"
hd_ok h2 attach "$WS" --meta "$META"
hd_ok h3 attach "$WS" --meta "$META"
for h in "${HOSTS[@]}"; do
  cfg=${HHOME[$h]}/workspaces/$WS/workspace.toml
  grep -q '^meta = "postgres://' "$cfg" || fail "$h: $cfg does not name the PostgreSQL database: $(cat "$cfg")"
  ! grep -qF "$PGPASSWORD" "$cfg" || fail "$h: the database password is stored in $cfg"
done
for h in "${HOSTS[@]}"; do hmount "$h"; done
for h in "${HOSTS[@]}"; do
  p=$(hlive "$h" 'l["peers"]') || fail "status on $h: $p"
  [[ $p == OtherHosts ]] || bad "status of $h's mount says peers=$p (expected OtherHosts)"
done
echo "written on h1" > "$M1/hello"
for h in h2 h3; do check_bytes "${HMNT[$h]}/hello" "$M1/hello" "a file written on h1 read through $h's mount"; done

# ---------------------------------------------------------------- 2. coherence across hosts
log "=== 2. coherence across hosts"
coh close-to-open "$M1" "$M2" "$M3" --rounds 160 --seed 87
coh trunc-rewrite "$M2" "$M3" --rounds 20
# Four at once: the feed's invalidations of one host's rewrites land while the other's
# opens refresh the kernel's attributes (design 0023), here across hosts on PostgreSQL.
coh_together 4 trunc-rewrite "$M3" "$M2" --rounds 25
coh handover "$M2" "$M1" --rounds 60
coh git-refs "$M3" "$M1" --rounds 25
coh sqlite "$M1" "$M2" --rows 25
coh rename-storm "$M1" "$M2" "$M3" --seconds 4
for h in "${HOSTS[@]}"; do
  is_alive "${HMNT[$h]}" || fail "the mount of $h died during the coherence checks"
  f=$(hlive "$h" 'l["fences"]["count"]') || fail "status on $h: $f"
  [[ $f == 0 ]] || bad "$h's mount was fenced $f time(s) during parts 1-2 although no host was cut off (status fences: $(hlive "$h" 'l["fences"]'))"
done

# ---------------------------------------------------------------- 3. counters under locks
counter_run() { # KIND N FILE
  local kind=$1 n=$2 f=$3 h p rc v ok=1 t0=$SECONDS
  local -A pid_of=()
  log "=== 3. counter: 3 hosts x $n increments under $kind locks, one process per host mount, at once"
  printf '%020d\n' 0 > "$M1/$f"
  for h in h2 h3; do wait_for 5 grep -q '^0*$' "${HMNT[$h]}/$f" || fail "$h does not see the new counter file $f"; done
  : > "$T/$f.log"
  for h in "${HOSTS[@]}"; do
    python3 "$LT" counter "${HMNT[$h]}/$f" "$n" "$T/$f.log" "$h" --lock "$kind" > "$T/$f.$h.out" 2>&1 < /dev/null &
    pid_of[$h]=$!
    register_pid "${pid_of[$h]}"
  done
  for h in "${HOSTS[@]}"; do
    p=${pid_of[$h]}
    rc=0
    if ! wait_for 120 eval '! pid_running '"$p"; then
      kill -KILL "$p" 2> /dev/null || true
      bad "$kind counter process on $h still running after 120 s (killed): $(tail -c 300 "$T/$f.$h.out")"
      ok=0
    fi
    wait "$p" || rc=$?
    if ((rc != 0 && ok)); then
      bad "$kind counter process on $h failed (exit $rc): $(grep -v '^DONE' "$T/$f.$h.out" | tail -n 3 | tr '\n' ' ' | tail -c 400)"
      ok=0
    fi
  done
  ((ok)) || return 0
  for h in "${HOSTS[@]}"; do
    v=$(tr -d '\n' < "${HMNT[$h]}/$f" 2>&1) || v="unreadable: $v"
    if [[ ! $v =~ ^[0-9]+$ ]] || ((10#$v != 3 * n)); then
      lt counter-report "$T/$f.log" >&2 || true
      bad "$kind counter read through $h's mount: '$v' after 3 x $n increments under $kind locks on 3 hosts (expected $((3 * n)))"
      return 0
    fi
  done
  log "ok: $kind counter = $((3 * n)) through every host's mount ($((SECONDS - t0)) s)"
}
counter_run flock 40 counter-flock
counter_run posix 40 counter-posix
for h in "${HOSTS[@]}"; do
  f=$(hlive "$h" 'l["fences"]["count"]') || fail "status on $h: $f"
  [[ $f == 0 ]] || bad "$h's mount was fenced $f time(s) by the end of part 3 although no host was cut off (status fences: $(hlive "$h" 'l["fences"]'))"
done

# ---------------------------------------------------------------- 4. kill -9 of h2's daemon
log "=== 4. kill -9 of h2's daemon while a process on h2's mount holds an flock"
echo "K" > "$M1/K"
wait_for 5 test -f "$M2/K" || fail "h2 does not see K"
bg_actor HK hold flock "$M2/K"
wait_out "$HK_OUT" LOCKED 15 "flock holder on h2"
lt_check 1 "flock of K from h1 while a process on h2 holds it" try flock "$M1/K"
bg_actor WK wait flock "$M1/K" --timeout 60 --epoch
still_waiting "$WK_OUT" "flock waiter on h1 (K held on h2)"
log "kill -9 of h2's daemon (pid ${HPID[h2]}); the holder process $HK stays alive"
t_kill=$EPOCHREALTIME
kill -KILL "${HPID[h2]}"
TAKE_KILL=none
if ! wait_for 60 grep -qE '^(GOT|ERROR|TIMEOUT)' "$WK_OUT"; then
  bad "the flock waiter on h1 got nothing 60 s after kill -9 of h2's daemon (the lock held through it stays taken)"
elif ! grep -q '^GOT' "$WK_OUT"; then
  bad "the flock waiter on h1 failed after kill -9 of h2's daemon: $(cat "$WK_OUT")"
else
  TAKE_KILL=$(fsub "$(got_epoch "$WK_OUT")" "$t_kill")
  log "MEASURED: flock takeover after kill -9 of the holder host's daemon: $TAKE_KILL s (bound: lease $LEASE + heartbeat $HB + slack $SLACK = $BOUND s)"
  fle "$TAKE_KILL" "$BOUND" || bad "the flock held through h2's killed daemon came free on h1 only after $TAKE_KILL s (bound $BOUND s = lease + lease/6 + $SLACK s)"
fi
stop_pid "$HK"
stop_pid "$WK"
force_unmount "$M2" || fail "cannot clean up the dead mount of h2 at $M2"
wait_for 10 eval '! pid_running '"${HPID[h2]}" || fail "h2's killed daemon ${HPID[h2]} is still there"
hmount h2
echo "h2 is back" > "$M2/h2-back"
check_bytes "$M1/h2-back" "$M2/h2-back" "a file written on the remounted h2, read on h1"
lt_check 0 "flock of K from h2 after its remount" try flock "$M2/K"

# ---------------------------------------------------------------- 5. partition of h3
log "=== 5. partition of h3"
log "remounting h3 with --upload-delay-ms 3600000 (closed files stay only in h3's journal)"
# --no-wait: what h3 has not uploaded yet stays in its journal (same cache dir) and is
# uploaded by the next mount; part 6 checks a waiting umount
DFS_TIMEOUT=60 hd_ok h3 umount "$M3" --no-wait
wait_for 10 not_mounted "$M3" || fail "h3's mount is still there after deskfs umount"
wait_for 30 eval '! pid_running '"${HPID[h3]}" || fail "h3's daemon (pid ${HPID[h3]}) still runs 30 s after deskfs umount"
hmount h3 --upload-delay-ms 3600000
head -c 150000 /dev/urandom > "$T/F.v0"
head -c 200000 /dev/urandom > "$T/F.h3"   # longer than F.v0 (written at offset 0 over it)
head -c 170000 /dev/urandom > "$T/F.h1"
head -c 180000 /dev/urandom > "$T/G.h3"   # longer than F.v0: the pwrite at 0 covers it all
head -c 250000 /dev/urandom > "$T/D.h3"
echo "L" > "$M1/L"
cp "$T/F.v0" "$M1/F"
cp "$T/F.v0" "$M1/G"
for f in L F G; do wait_for 5 test -f "$M3/$f" || fail "h3 does not see $f"; done
check_bytes "$M3/F" "$T/F.v0" "F read on h3 before the partition"
check_bytes "$M3/G" "$T/F.v0" "G read on h3 before the partition"
# D: written and closed on h3: only in h3's journal
cp "$T/D.h3" "$M3/D"
D_INO=$(stat -c %i "$M3/D")
sleep 1
! s3_exists "$(s3_key D)" || fail "D is in the bucket already (h3 was mounted with --upload-delay-ms 3600000)"
# F and G: open on h3, written, not closed
python3 "$T/hold_write.py" "$M3/F" "$T/F.h3" > "$T/holdF.out" 2>&1 < /dev/null &
HF=$!
register_pid "$HF"
python3 "$T/hold_write.py" "$M3/G" "$T/G.h3" > "$T/holdG.out" 2>&1 < /dev/null &
HG=$!
register_pid "$HG"
wait_out "$T/holdF.out" WRITTEN 15 "writer of F on h3"
wait_out "$T/holdG.out" WRITTEN 15 "writer of G on h3"
# L: held by a process on h3, a blocked waiter on h1
bg_actor HL hold flock "$M3/L"
wait_out "$HL_OUT" LOCKED 15 "flock holder of L on h3"
lt_check 1 "flock of L from h1 while h3 holds it" try flock "$M1/L"
bg_actor WL wait flock "$M1/L" --timeout 90 --epoch
still_waiting "$WL_OUT" "flock waiter for L on h1"

t_part=$EPOCHREALTIME
host_partition h3
# h3's last lease renewal (database clock, ns): its lease runs out LEASE s after it
hb3=$(pgq "SELECT max(heartbeat) FROM ws.sessions WHERE host = 'h3'") || fail "cannot read h3's session"
[[ $hb3 =~ ^[0-9]+$ ]] || fail "no session of h3 in ws.sessions right after the partition ('$hb3')"
hb3=$(awk -v n="$hb3" 'BEGIN { printf "%.3f", n / 1e9 }')
log "h3's last lease renewal: $(fsub "$t_part" "$hb3") s before the partition"
# an open of D on h1 while h3 is cut off: waits for h3 (status waiting_for), then EIO
timed_read "$M1/D" > "$T/readD.out" 2>&1 &
RD=$!
register_pid "$RD"
seen_wait=""
while pid_running "$RD"; do
  w=$(hlive h1 "[w for w in l['waiting_for'] if w['ino'] == $D_INO]" 2> /dev/null) || w=""
  if [[ $w == \[\{* ]]; then seen_wait=$w; break; fi
  sleep 0.3
done
wait "$RD" || true
read -r rstat rerr rsecs < "$T/readD.out" || true
EIO_WAIT=none
log "MEASURED: open of D on h1 while h3 is cut off: $(cat "$T/readD.out") (remote-wait $REMOTE_WAIT s); h1's status waiting_for meanwhile: ${seen_wait:-nothing seen}"
if [[ $rstat == ERR && $rerr == EIO ]]; then
  EIO_WAIT=$rsecs
  fle "$(fsub "$REMOTE_WAIT" 1)" "$EIO_WAIT" || bad "the open of D on h1 failed after $EIO_WAIT s: it did not wait for h3 (remote-wait $REMOTE_WAIT s)"
  fle "$EIO_WAIT" "$((REMOTE_WAIT + SLACK))" || bad "the open of D on h1 failed only after $EIO_WAIT s (remote-wait $REMOTE_WAIT s + slack $SLACK s)"
else
  bad "open+read of D on h1 while h3 (the only holder of its content) is cut off: expected EIO after about $REMOTE_WAIT s, got '$(cat "$T/readD.out")'"
fi
[[ -n $seen_wait ]] || bad "deskfs status on h1 never listed the open of D (inode $D_INO) in waiting_for while it waited (last: $(hlive h1 'l["waiting_for"]' 2>&1 | cut -c1-300))"
# the waiter for L gets it once h3's lease is over, and not before
TAKE_PART=none
if ! wait_for 60 grep -qE '^(GOT|ERROR|TIMEOUT)' "$WL_OUT"; then
  bad "the flock waiter for L on h1 got nothing 60 s after h3 was cut off"
elif ! grep -q '^GOT' "$WL_OUT"; then
  bad "the flock waiter for L on h1 failed: $(cat "$WL_OUT")"
else
  TAKE_PART=$(fsub "$(got_epoch "$WL_OUT")" "$t_part")
  since_hb=$(fsub "$(got_epoch "$WL_OUT")" "$hb3")
  log "MEASURED: flock takeover from the cut-off h3: $TAKE_PART s after the partition, $since_hb s after h3's last lease renewal (accepted: >= lease $LEASE s after the renewal, <= $BOUND s after the partition)"
  # not before h3's lease ran out (0.2 s for the two clocks' reading: same machine)
  fle "$(fsub "$LEASE" 0.2)" "$since_hb" || bad "h1 got L $since_hb s after h3's last lease renewal: before h3's lease ($LEASE s) ran out, while h3 may still hold it"
  fle "$TAKE_PART" "$BOUND" || bad "h1 got L only $TAKE_PART s after h3 was cut off (bound $BOUND s = lease + lease/6 + $SLACK s)"
fi
# h1 rewrites F meanwhile (newer content)
cp "$T/F.h1" "$M1/F"
check_bytes "$M1/F" "$T/F.h1" "F on h1 after h1 rewrote it while h3 was cut off"
check_bytes "$M2/F" "$T/F.h1" "F on h2 after h1 rewrote it while h3 was cut off"
check_bytes "$M1/G" "$T/F.v0" "G on h1 while h3 was cut off (h3's writes are not closed)"

t_heal=$EPOCHREALTIME
host_heal h3
log "waiting for h3 to notice that its lease was lost"
fenced=0 f=""
for _ in $(seq 1 60); do
  f=$(hlive h3 'l["fences"]["count"]' 2> /dev/null) || f=""
  if [[ $f =~ ^[0-9]+$ ]] && ((f >= 1)); then fenced=$f; break; fi
  sleep 0.5
done
if ((fenced >= 1)); then
  log "ok: h3 status fences: $(hlive h3 'l["fences"]'), $(fsub "$EPOCHREALTIME" "$t_heal") s after the heal"
else
  bad "h3 does not report the fence: its status fences.count is '$f' 30 s after the heal"
fi
if grep -q "session lease was lost" "${HLOG[h3]}"; then
  log "ok: h3's log: $(grep -m1 'session lease was lost' "${HLOG[h3]}" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160)..."
else
  bad "h3's log (${HLOG[h3]}) has no 'session lease was lost' line"
fi
# close F and G on h3
kill -USR1 "$HF" "$HG"
wait_out "$T/holdF.out" 'CLOSED\|CLOSE-ERROR' 60 "close of F on h3 after the heal"
wait_out "$T/holdG.out" 'CLOSED\|CLOSE-ERROR' 60 "close of G on h3 after the heal"
log "closed on h3 after the fence: F: $(tail -n 1 "$T/holdF.out"), G: $(tail -n 1 "$T/holdG.out")"
conflict=""
for _ in $(seq 1 25); do
  conflict=$(cd "$M1" && compgen -G 'F.deskfs-conflict-*') || conflict=""
  [[ -n $conflict ]] && break
  sleep 0.2
done
check_bytes "$M1/F" "$T/F.h1" "F on h1 after h3 closed its writes made under the lost lease (the newer content stays)"
check_bytes "$M3/F" "$T/F.h1" "F on h3 after it closed its writes made under the lost lease"
if [[ -z $conflict ]]; then
  bad "no F.deskfs-conflict-* beside F after h3 closed F (written under the lost lease, changed by h1 meanwhile): h3's bytes are $( [[ $(whose "$M1/F") == *F.h3* ]] && echo "in F, h1's newer bytes are lost" || echo "lost"); ls on h1: $(ls "$M1" | tr '\n' ' ')"
elif [[ $(wc -l <<< "$conflict") != 1 ]]; then
  bad "more than one conflict copy of F: $(tr '\n' ' ' <<< "$conflict")"
else
  [[ $conflict =~ ^F\.deskfs-conflict-h3-([0-9]+)$ ]] || bad "conflict copy name '$conflict' is not F.deskfs-conflict-h3-UNIXTIME"
  stamp=${BASH_REMATCH[1]:-0}
  ((stamp >= ${t_part%.*} - 5 && stamp <= $(date +%s) + 5)) || bad "conflict copy time $stamp is not between the partition (${t_part%.*}) and now"
  check_bytes "$M1/$conflict" "$T/F.h3" "conflict copy $conflict read on h1 (h3's bytes)"
  check_bytes "$M3/$conflict" "$T/F.h3" "conflict copy $conflict read on h3"
fi
check_bytes "$M1/G" "$T/G.h3" "G on h1 after h3 closed it (nobody else changed G: h3's writes commit normally)"
gconf=$(cd "$M1" && compgen -G 'G.deskfs-conflict-*') || gconf=""
[[ -z $gconf ]] || bad "a conflict copy of G was made ($gconf), but nobody else changed G"
# D: h3's bytes become readable on h1
dres=""
for _ in 1 2 3; do
  dres=$(timed_read "$M1/D") || true
  [[ $dres == OK* ]] && break
  log "open of D on h1 after the heal: $dres; again"
done
if [[ $dres != OK* ]]; then
  log "NOTE: D still not readable on h1 after 3 opens: deskfs sync on h3"
  out=$(DFS_TIMEOUT=100 hd h3 sync "$WS" --timeout 90 2>&1) || bad "deskfs sync on h3 after the heal failed: $out"
  dres=$(timed_read "$M1/D") || true
fi
if [[ $dres == OK* ]]; then
  log "open of D on h1 after the heal: $dres"
  check_bytes "$M1/D" "$T/D.h3" "D (closed on h3, only in its journal during the partition) read on h1 after the heal"
else
  bad "D (h3's closed file) is not readable on h1 after the heal: $dres"
fi
# L: h3's old holder holds nothing any more
lt_check 0 "flock of L from h1 after the heal (h3's old holder $HL still runs)" try flock "$M1/L"
lt_check 0 "flock of L from another process on h3 after the fence" try flock "$M3/L"
bg_actor NL hold flock "$M1/L"
wait_out "$NL_OUT" LOCKED 15 "new flock holder of L on h1"
lt_check 1 "flock of L from h3 while h1's new holder has it" try flock "$M3/L"
stop_pid "$HL"   # the old holder's exit (its unlock) must not release h1's lock
sleep 1
lt_check 1 "flock of L from h2 after h3's old holder exited (h1's new holder keeps it)" try flock "$M2/L"
stop_pid "$NL"
stop_pid "$WL"

for h in h1 h2; do
  f=$(hlive "$h" 'l["fences"]["count"]') || f="($f)"
  [[ $f == 0 ]] || bad "$h's mount was fenced ($f) although only h3 was cut off"
done

# ---------------------------------------------------------------- 6. unmount, nothing left
log "=== 6. unmount"
for h in h3 h2 h1; do
  # a clean umount waits for the uploads; 60 s is ample for what is pending here
  if ! out=$(DFS_TIMEOUT=60 hd "$h" umount "${HMNT[$h]}" 2>&1); then
    bad "deskfs umount on $h failed or did not finish within 60 s: $out (pending uploads: $(pgq "SELECT convert_from(path, 'UTF8') || ' attempts=' || attempts || ' ' || coalesce(last_error, '') FROM ws.pending LIMIT 3" | tr '\n' ' ' | cut -c1-400))"
    DFS_TIMEOUT=60 hd "$h" umount "${HMNT[$h]}" --no-wait > /dev/null 2>&1 || force_unmount "${HMNT[$h]}" || true
  fi
  wait_for 10 not_mounted "${HMNT[$h]}" || fail "${HMNT[$h]} still mounted after deskfs umount on $h"
  wait_for 30 eval '! pid_running '"${HPID[$h]}" || bad "the daemon of $h (pid ${HPID[$h]}) still runs 30 s after deskfs umount"
done
for h in "${HOSTS[@]}"; do
  left=$(host_pids "$h")
  [[ -z $left ]] || bad "processes left in $h after the unmounts: $(ps -o pid=,args= -p "$(tr -s ' \n' ',,' <<< "$left" | sed 's/,$//')" 2> /dev/null | head -c 500)"
done
for t in sessions locks open_files wanted pending; do
  n=$(pgq "SELECT count(*) FROM ws.$t") || fail "cannot query ws.$t"
  [[ $n == 0 ]] || bad "ws.$t holds $n row(s) after every mount was unmounted: $(pgq "SELECT * FROM ws.$t LIMIT 5" | tr '\n' ' ' | cut -c1-400)$([[ $t == wanted ]] && echo " (caches: $(pgq "SELECT key || '=' || value FROM ws.kv WHERE key LIKE 'cache.%'" | tr '\n' ' '))")"
done
# the bucket, read without deskfs
for pair in "F F.h1" "G G.h3" "D D.h3" ${conflict:+"$conflict F.h3"}; do
  read -r obj ref <<< "$pair"
  if s3_get "$(s3_key "$obj")" > "$T/obj.$ref" 2> /dev/null; then
    [[ $(sha "$T/obj.$ref") == "$(sha "$T/$ref")" ]] || bad "object $obj in the bucket holds $(whose "$T/obj.$ref"), expected the bytes of $ref"
  else
    bad "object $obj is not in the bucket after the unmounts"
  fi
done

log "MEASURED (summary): flock takeover after kill -9: $TAKE_KILL s; after the partition: $TAKE_PART s; EIO after $EIO_WAIT s (lease $LEASE s, heartbeat $HB s, remote-wait $REMOTE_WAIT s)"
if ((${#BAD[@]})); then
  printf '  failed: %s\n' "${BAD[@]}" >&2
  fail "${#BAD[@]} check(s) failed; first: ${BAD[0]}"
fi
log "PASS"
