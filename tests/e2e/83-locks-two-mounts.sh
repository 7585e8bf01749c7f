#!/usr/bin/env bash
# 83-locks-two-mounts: locks and close-to-open between two mounts of one workspace
# (embedded default, same DESKFS_HOME, mountpoints A=$T/mnt and B=$T/mnt2), with the lock
# actors of tests/tools/locktool.py:
#   * flock: a holder in A makes LOCK_NB fail from B (exclusive and shared) and from another
#     process in A; a blocking waiter in B gets the lock when the holder unlocks, and when
#     the holder process is killed (kill -9 of the holder, not of a daemon);
#   * fcntl byte ranges: exclusive 0-9 held in A blocks 0-9 (and a read lock on 5) from B,
#     10-19 is free, F_GETLK from B reports the conflicting range and type; read locks are
#     shared across mounts; a blocking F_SETLKW waiter in B gets the lock at unlock;
#   * OFD locks (F_OFD_SETLK=37, F_OFD_GETLK=36): the same, plus two open file descriptions
#     in one process conflict;
#   * a counter incremented 4 x 200 times by 4 processes (2 on A, 2 on B) under flock,
#     opening and closing the file each time, ends exact;
#   * close-to-open: written+closed in A (new file, overwrite in place at the same size,
#     truncate, append) is read with the new content in B, and back (<= 1.5 s allowed for
#     the kernel attribute cache);
#   * lock owner death through its daemon: flock + fcntl locks taken through a third mount C
#     (--foreground), kill -9 of C's daemon: from A the locks become available within the
#     lease (<= 35 s; the holder process itself stays alive until then).
# e2e-timeout: 600
# shellcheck disable=SC2016  # the close-to-open steps pass shell snippets that expand $W later
source "$(dirname "$0")/../lib.sh"
need_deskfs

LT=$ROOT/tests/tools/locktool.py
[[ -f $LT ]] || fail "missing $LT"
A=$MNT B=$MNT2 C=$T/mnt3
NAME=locks
ws_format "$NAME"
ws_mount "$NAME" "$A"
ws_mount "$NAME" "$B"

lt() { timeout -k 5 60 python3 "$LT" "$@" < /dev/null; }

# soft_fail MESSAGE: the test fails at the end, the remaining sections still run
SOFT_FAILS=()
soft_fail() {
  printf 'FAILED CHECK: %s\n' "$*" >&2
  SOFT_FAILS+=("$*")
}

# lt_expect RC WHAT locktool-args...: run a one-shot locktool command, its exit status must be RC
lt_expect() {
  local want=$1 what=$2 rc=0 out
  shift 2
  out=$(lt "$@" 2>&1) || rc=$?
  ((rc == want)) || fail "$what: locktool $* exited $rc (expected $want): $out"
  log "ok: $what -> $out"
}

# bg_actor VAR locktool-args...: start a locktool actor in the background, output in
# $T/actor.N.out; VAR gets its PID, VAR_OUT its output file
_actor=0
bg_actor() {
  local var=$1
  shift
  _actor=$((_actor + 1))
  local out=$T/actor.$_actor.out
  python3 "$LT" "$@" > "$out" 2>&1 < /dev/null &
  local pid=$!
  register_pid "$pid"
  # no "Killed" job notices for the actors the test kills on purpose (counters are waited for)
  [[ $1 == counter ]] || disown "$pid"
  printf -v "$var" '%s' "$pid"
  printf -v "${var}_OUT" '%s' "$out"
}

# wait_out FILE PATTERN SECS WHAT: the actor printed PATTERN within SECS
wait_out() {
  wait_for "$3" grep -q -- "$2" "$1" || fail "$4: no '$2' within $3 s (actor output: $(head -c 500 "$1"))"
}

stop_actor() { # PID: kill it and wait until it is gone
  kill -KILL "$1" 2> /dev/null || true
  wait_for 10 eval '! pid_running '"$1" || fail "actor $1 does not die"
}

# a waiter must still be waiting (not granted) after a second
still_waiting() { # OUTFILE WHAT
  sleep 1
  grep -q WAITING "$1" || fail "$2: waiter did not start: $(head -c 300 "$1")"
  ! grep -qE 'GOT|ERROR|TIMEOUT' "$1" || fail "$2: waiter was not blocked while the lock was held: $(cat "$1")"
}

# granted_within OUTFILE SECS WHAT: the waiter got the lock within SECS of now; prints latency
granted_within() {
  local t0=$EPOCHREALTIME
  wait_for "$2" grep -qE '^(GOT|ERROR|TIMEOUT)' "$1" || fail "$3: waiter not granted within $2 s after the release: $(cat "$1")"
  grep -q '^GOT' "$1" || fail "$3: waiter failed: $(cat "$1")"
  log "ok: $3: waiter granted $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') s after the release"
}

echo "lock file" > "$A/f"
echo "lock file 2" > "$A/g"
wait_for 5 test -f "$B/f" || fail "B does not see $A/f"

# ------------------------------------------------------------ flock
log "--- flock"
bg_actor H hold flock "$A/f"
wait_out "$H_OUT" LOCKED 10 "flock holder in A"
lt_expect 1 "flock LOCK_EX|LOCK_NB from B while A holds it" try flock "$B/f"
lt_expect 1 "flock LOCK_SH|LOCK_NB from B while A holds it" try flock "$B/f" --shared
lt_expect 1 "flock LOCK_NB from another process in A" try flock "$A/f"
lt_expect 0 "flock of another file from B" try flock "$B/g"
bg_actor W wait flock "$B/f" --timeout 40
still_waiting "$W_OUT" "blocking flock waiter in B"
kill -USR1 "$H"
wait_out "$H_OUT" UNLOCKED 10 "flock holder unlock"
granted_within "$W_OUT" 15 "flock: blocking waiter in B after LOCK_UN in A"
stop_actor "$H"; stop_actor "$W"

bg_actor H hold flock "$A/f"
wait_out "$H_OUT" LOCKED 10 "second flock holder in A"
bg_actor W wait flock "$B/f" --timeout 40
still_waiting "$W_OUT" "blocking flock waiter in B (holder to be killed)"
kill -KILL "$H"
granted_within "$W_OUT" 15 "flock: blocking waiter in B after kill -9 of the holder process in A"
stop_actor "$H"; stop_actor "$W"
lt_expect 0 "flock free again from A" try flock "$A/f"

# ------------------------------------------------------------ fcntl byte ranges (posix, ofd)
for kind in posix ofd; do
  log "--- fcntl $kind locks"
  bg_actor H hold "$kind" "$A/f" 0 10
  wait_out "$H_OUT" LOCKED 10 "$kind holder of 0-9 in A"
  lt_expect 1 "$kind write lock 0-9 from B while A holds 0-9" try "$kind" "$B/f" 0 10
  lt_expect 1 "$kind read lock on byte 5 from B while A holds 0-9" try "$kind" "$B/f" 5 1 --shared
  lt_expect 1 "$kind write lock 9-10 (overlapping) from B" try "$kind" "$B/f" 9 2
  lt_expect 0 "$kind write lock 10-19 from B (free)" try "$kind" "$B/f" 10 10
  lt_expect 1 "$kind write lock 0-9 from another process in A" try "$kind" "$A/f" 0 10
  got=$(lt getlk "$kind" "$B/f" 0 10)
  read -r gtype gstart glen gpid <<< "$got"
  [[ $gtype == WRLCK && $gstart == 0 && $glen == 10 ]] || fail "$kind F_GETLK from B for 0-9: expected a WRLCK on 0 len 10, got '$got'"
  log "ok: $kind F_GETLK from B for 0-9 -> $got (holder pid $H)"
  got=$(lt getlk "$kind" "$B/f" 5 100)
  read -r gtype gstart glen gpid <<< "$got"
  [[ $gtype == WRLCK && $gstart == 0 && $glen == 10 ]] || fail "$kind F_GETLK from B for 5-104: expected a WRLCK on 0 len 10, got '$got'"
  got=$(lt getlk "$kind" "$B/f" 10 10)
  [[ $got == UNLCK ]] || fail "$kind F_GETLK from B for 10-19: expected UNLCK, got '$got'"
  log "ok: $kind F_GETLK from B for 10-19 -> $got"
  bg_actor W wait "$kind" "$B/f" 0 10 --timeout 40
  still_waiting "$W_OUT" "$kind blocking waiter (F_SETLKW) in B"
  kill -USR1 "$H"
  wait_out "$H_OUT" UNLOCKED 10 "$kind holder unlock"
  granted_within "$W_OUT" 15 "$kind: blocking waiter in B after unlock in A"
  stop_actor "$H"; stop_actor "$W"

  bg_actor H hold "$kind" "$A/f" 0 10 --shared
  wait_out "$H_OUT" LOCKED 10 "$kind read-lock holder of 0-9 in A"
  lt_expect 0 "$kind read lock 0-9 from B while A holds a read lock (shared)" try "$kind" "$B/f" 0 10 --shared
  lt_expect 1 "$kind write lock 0-9 from B while A holds a read lock" try "$kind" "$B/f" 0 10
  got=$(lt getlk "$kind" "$B/f" 0 10)
  read -r gtype gstart glen gpid <<< "$got"
  [[ $gtype == RDLCK && $gstart == 0 && $glen == 10 ]] || fail "$kind F_GETLK (write) from B vs a read lock: expected RDLCK 0 10, got '$got'"
  bg_actor W wait "$kind" "$B/f" 0 10 --timeout 40
  still_waiting "$W_OUT" "$kind waiter in B (holder to be killed)"
  kill -KILL "$H"
  granted_within "$W_OUT" 15 "$kind: blocking waiter in B after kill -9 of the holder process in A"
  stop_actor "$H"; stop_actor "$W"
done
lt_expect 0 "OFD: two open file descriptions in one process conflict (A)" ofd-pair "$A/g"
lt_expect 0 "posix lock of 0-9 free again" try posix "$B/f" 0 10

# ------------------------------------------------------------ counter under flock
log "--- counter: 4 processes x 200 increments under flock, 2 on A, 2 on B"
printf '%020d\n' 0 > "$A/counter"
wait_for 5 grep -q '^0*$' "$B/counter" || fail "B does not see the counter file"
pids=()
for m in "$A" "$A" "$B" "$B"; do
  bg_actor P counter "$m/counter" 200 "$T/counter.log" "${m##*/}"
  pids+=("$P")
done
for p in "${pids[@]}"; do
  rc=0
  wait_for 300 eval '! pid_running '"$p" || fail "counter process $p still running after 300 s"
  wait "$p" || rc=$?
  ((rc == 0)) || fail "counter process $p failed (exit $rc): $(cat "$T"/actor.*.out | grep -v DONE | head -c 500)"
done
for m in "$A" "$B"; do
  v=$((10#$(tr -d '\n' < "$m/counter")))
  if ((v != 800)); then
    report=$(lt counter-report "$T/counter.log" || true)
    printf '%s\n' "$report" >&2
    soft_fail "counter read through ${m##*/}: $v after 4 x 200 increments under flock (expected 800): $(head -n 1 <<< "$report")"
    break
  fi
done
((v == 800)) && log "ok: counter = 800 through both mounts"

# ------------------------------------------------------------ close-to-open
log "--- close-to-open"
# sees_within SECS FILE EXPECTED_FILE: FILE (opened anew each time) has EXPECTED's content
now_us() { local t=${EPOCHREALTIME/./}; echo $((10#$t)); }
sees_within() {
  local t0 end
  t0=$(now_us)
  end=$((t0 + ${1/./} * 100000))   # SECS with one decimal
  until cmp -s "$2" "$3"; do
    (($(now_us) < end)) || return 1
    sleep 0.05
  done
  log "ok: ${2#"$T"/} has the new content after $(( ($(now_us) - t0) / 1000 )) ms"
}
c2o_step() { # WHAT WRITER_DIR READER_DIR SHELL-COMMAND-ON-$W: apply, then the reader must see it
  local what=$1 w=$2 r=$3
  W=$w bash -c "$4"
  cp "$w/c2o" "$T/c2o.expected"
  if ! sees_within 1.5 "$r/c2o" "$T/c2o.expected"; then
    cp "$r/c2o" "$T/c2o.got"
    soft_fail "close-to-open: $what: 1.5 s after close in ${w##*/}, ${r##*/} still reads other content ($(stat -c %s "$T/c2o.got") bytes, sha256 $(sha "$T/c2o.got" | cut -c1-12), starts '$(head -c 24 "$T/c2o.got" | tr -c '[:print:]' '.')'; expected $(stat -c %s "$T/c2o.expected") bytes, sha256 $(sha "$T/c2o.expected" | cut -c1-12), starts '$(head -c 24 "$T/c2o.expected" | tr -c '[:print:]' '.')')"
  fi
}
# read the file in B first, so B has it cached
echo "version 1 of the file" > "$A/c2o"
wait_for 5 test -f "$B/c2o"
cat "$B/c2o" > /dev/null
c2o_step "new content (rewrite)" "$A" "$B" 'printf "version 2 of the file\n" > "$W/c2o"'
cat "$B/c2o" > /dev/null
c2o_step "overwrite in place, same size" "$A" "$B" 'python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_WRONLY); os.pwrite(fd, b\"VERSION 3\", 0); os.close(fd)" "$W/c2o"'
c2o_step "truncate to 7 bytes" "$A" "$B" 'truncate -s 7 "$W/c2o"'
c2o_step "append" "$A" "$B" 'printf "appended line\n" >> "$W/c2o"'
c2o_step "1 MiB rewrite" "$A" "$B" 'head -c 1048576 /dev/urandom > "$W/c2o"'
c2o_step "overwrite 4 KiB in the middle" "$A" "$B" 'head -c 4096 /dev/urandom | dd of="$W/c2o" bs=4096 seek=100 conv=notrunc status=none'
c2o_step "B -> A: rewrite in B" "$B" "$A" 'printf "written in B\n" > "$W/c2o"'
c2o_step "B -> A: overwrite in place in B" "$B" "$A" 'python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_WRONLY); os.pwrite(fd, b\"WRITTEN\", 0); os.close(fd)" "$W/c2o"'

# ------------------------------------------------------------ owner death through its daemon
log "--- lock owner death: locks taken through mount C, kill -9 of C's daemon"
echo "d1" > "$A/d1"
echo "d2" > "$A/d2"
ws_mount_fg "$NAME" "$C"
DC=$FG_PID
bg_actor HC1 hold flock "$C/d1"
bg_actor HC2 hold posix "$C/d2" 0 0
wait_out "$HC1_OUT" LOCKED 10 "flock holder in C"
wait_out "$HC2_OUT" LOCKED 10 "posix holder in C"
lt_expect 1 "flock from A while C's process holds it" try flock "$A/d1"
lt_expect 1 "posix lock from A while C's process holds it" try posix "$A/d2"
log "kill -9 of C's daemon $DC (the holder processes $HC1 $HC2 stay alive)"
kill -KILL "$DC"
wait "$DC" 2> /dev/null || true
t0=$SECONDS
free1=0 free2=0
while ((SECONDS - t0 <= 36)); do
  ((free1)) || { lt try flock "$A/d1" > /dev/null 2>&1 && free1=$((SECONDS - t0 + 1)); } || true
  ((free2)) || { lt try posix "$A/d2" > /dev/null 2>&1 && free2=$((SECONDS - t0 + 1)); } || true
  ((free1 && free2)) && break
  sleep 0.5
done
((free1)) || fail "flock held through C stays locked from A more than 35 s after kill -9 of C's daemon"
((free2)) || fail "posix lock held through C stays locked from A more than 35 s after kill -9 of C's daemon"
log "ok: after kill -9 of C's daemon, A got the flock within ${free1} s and the posix lock within ${free2} s"
if ((free1 > 10 || free2 > 10)); then
  log "NOTE: that is lease expiry (30 s), not the same-host rule (a dead daemon on this host is noticed at the next heartbeat, every 5 s)"
fi
stop_actor "$HC1"; stop_actor "$HC2"
is_mounted "$C" && { timeout 20 fusermount3 -u "$C" > /dev/null 2>&1 || force_unmount "$C" || fail "cannot remove the dead mount $C"; }
lt_expect 0 "flock through A after C is gone" try flock "$A/d1"
lt_expect 0 "flock through B after C is gone" try flock "$B/d1"

ws_umount "$B"
ws_umount "$A"
if ((${#SOFT_FAILS[@]})); then
  printf '  failed: %s\n' "${SOFT_FAILS[@]}" >&2
  fail "${#SOFT_FAILS[@]} checks failed; first: ${SOFT_FAILS[0]}"
fi
log "PASS"
