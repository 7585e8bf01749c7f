#!/usr/bin/env bash
# 86h-paused-mount-hosts: 86s-paused-mount across hosts. Two "hosts" (network namespaces
# h1, h2 of tests/hosts.sh), each with its own deskfs daemon, DESKFS_HOME and cache dir,
# share one workspace on PostgreSQL (a private server on the bridge) and Garage, --lease 3.
# A 40 MiB file written on h2 is uploaded; a reader (root namespace) opens it through h1's
# mount and reads 4 KiB in its middle (the rest is only in the bucket); h1's daemon is
# stopped (SIGSTOP) past its lease; h2 expires h1's session (its log says so, and its
# `deskfs status` lists the held session), then unlinks the file; h1 resumes: it finds
# itself fenced, registers anew, and the reader reads the whole file with the right
# sha256 — as on ext4, an unlinked file lives while it is open, and across hosts a pause
# is not taken for a death. After the reader closes and both mounts are gone, the bucket
# holds only the files still named (the orphan was purged) and fsck is clean.
# e2e-timeout: 300
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../hosts.sh"
need_deskfs
need_hosts
need_pg
need_s3
need_cmd python3

WS=paused
LEASE=3
declare -A HHOME HMNT HLOG HPID

# hd HOST ARGS...: deskfs inside HOST (its network and UTS namespaces, its DESKFS_HOME)
hd() {
  local h=$1
  shift
  host_run "$h" env DESKFS_HOME="${HHOME[$h]}" timeout -k 5 120 "$DESKFS" "$@" < /dev/null
}
hd_ok() {
  local h=$1 out rc=0
  shift
  out=$(hd "$h" "$@" 2>&1) || rc=$?
  ((rc == 0)) || fail "deskfs $* on $h failed (exit $rc): $out"
}
# hmount HOST ARGS...: mounts the workspace in HOST; sets HPID[HOST] and HLOG[HOST]
hmount() {
  local h=$1 out=$T/mount.$1.out
  shift
  mkdir -p "${HMNT[$h]}"
  register_mount "${HMNT[$h]}"
  hd "$h" mount "$WS" "${HMNT[$h]}" --cache-dir "$T/cache-$h" --lease "$LEASE" "$@" > "$out" 2>&1 ||
    fail "deskfs mount on $h failed: $(head -c 2000 "$out")"
  wait_for 5 is_mounted "${HMNT[$h]}" || fail "${HMNT[$h]} is not mounted after deskfs mount on $h"
  HPID[$h]=$(sed -n 's/.*daemon pid \([0-9]*\).*/\1/p' "$out")
  HLOG[$h]=$(sed -n 's/.*, log \(.*\))$/\1/p' "$out")
  [[ -n ${HPID[$h]} && -n ${HLOG[$h]} ]] || fail "no daemon pid and log in the output of deskfs mount on $h: $(cat "$out")"
  grep -qx "${HPID[$h]}" <<< "$(host_pids "$h")" || fail "the daemon of $h (pid ${HPID[$h]}) does not run in $h's network namespace"
  register_pid "${HPID[$h]}"
  log "$h: mounted ${HMNT[$h]} (daemon pid ${HPID[$h]})"
}

hosts_up 2
hosts_pg_private
HOST_URL=$(hosts_pg_url "$(pg_fresh_db paused)")
re='^postgres://([^:@/]+)(:[^@/]*)?@([^/]+)/([^?]+)'
[[ $HOST_URL =~ $re ]] || fail "cannot parse the PostgreSQL URL for the hosts: ${HOST_URL%%:*}://…"
META="postgres://${BASH_REMATCH[1]}@${BASH_REMATCH[3]}/${BASH_REMATCH[4]}?schema=ws&op_timeout=5"
for h in h1 h2; do
  HHOME[$h]=$T/home-$h
  HMNT[$h]=$T/m-$h
  mkdir -p "${HHOME[$h]}"
done
A=${HMNT[h1]} B=${HMNT[h2]}
hd_ok h1 format "$WS" --meta "$META" --bucket "$(s3_url)" --endpoint "$(hosts_s3_endpoint)" --region "$BENCH_S3_REGION"
hd_ok h2 attach "$WS" --meta "$META"
hmount h1
hmount h2 --expired-open-grace 600
APID=${HPID[h1]}
on_exit "kill -CONT $APID 2>/dev/null || true"

head -c $((40 << 20)) /dev/urandom > "$T/big"
want=$(sha "$T/big")
cp "$T/big" "$B/big"
echo keep > "$B/keep"
hd_ok h2 sync "$WS"
wait_for 20 test -e "$A/big" || fail "h1 does not see the file written on h2"

# The reader (tests/tools/held_reader.py): reads 4 KiB in the middle of big through A,
# says "ready", waits for a line on the fifo, then reads the whole file.
mkfifo "$T/go"
python3 "$LIB_DIR/tools/held_reader.py" "$A/big" "$T/go" > "$T/reader.out" 2>&1 &
READER=$!
register_pid "$READER"
wait_for 30 grep -q ready "$T/reader.out" || fail "the reader on h1's mount did not start: $(cat "$T/reader.out")"

kill -STOP "$APID"
log "h1's daemon (pid $APID) stopped"
wait_for 40 grep -q "mount session expired" "${HLOG[h2]}" \
  || fail "h2 did not expire the paused mount's session within 40 s: $(tail -n 5 "${HLOG[h2]}")"
log "h2 expired h1's session: $(grep "mount session expired" "${HLOG[h2]}" | tail -n 1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200)"
rm "$B/big"
[[ ! -e $B/big ]] || fail "big still has its name after rm on h2"
sleep 2 # h2's heartbeats and purges run meanwhile
hd h2 status "$WS" > "$T/status.paused" 2>&1 || fail "status on h2 failed: $(cat "$T/status.paused")"
grep -q "held opens    session [0-9]* (pid $APID on .*) expired .* its open files are kept for it, released in [0-9]" "$T/status.paused" \
  || fail "h2's status does not list the paused mount's held open files: $(grep -v '^ *$' "$T/status.paused" | tr -s ' ' | tail -n 25 | tr '\n' '|')"
log "h2 status: $(grep "held opens" "$T/status.paused" | tr -s ' ' | head -n 1)"

kill -CONT "$APID"
log "h1 resumed"
echo go > "$T/go"
wait_for 60 grep -qE '^(sha|error)' "$T/reader.out" || fail "the resumed reader did not finish: $(cat "$T/reader.out")"
got=$(grep -E "^(sha|error)" "$T/reader.out")
[[ $got == *"sha $want"* ]] || fail "the paused host's reader of the file unlinked on h2 got '$got', expected sha $want"
log "the resumed reader on h1 read all 40 MiB right"
wait_for 20 grep -q "session lease was lost" "${HLOG[h1]}" || fail "h1's log does not say it was fenced"
wait "$READER" || true

log "both mounts gone: only named files in the bucket, fsck clean"
for h in h2 h1; do
  out=$(hd "$h" umount "${HMNT[$h]}" 2>&1) || fail "deskfs umount on $h failed: $out"
  wait_for 10 not_mounted "${HMNT[$h]}" || fail "${HMNT[$h]} still mounted after deskfs umount on $h"
done
objects=$(rc lsf -R --files-only "$(rc_path "$S3_PREFIX")" --exclude '.deskfs/**' 2>&1 | sort | tr '\n' ' ')
assert_eq "keep " "$objects" "objects in the bucket (the orphan purged)"
out=$(hd h1 fsck "$WS" 2>&1) || fail "fsck failed: $out"
log "fsck: $(tail -n 1 <<< "$out")"
log "PASS"
