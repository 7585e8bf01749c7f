#!/usr/bin/env bash
# 89-hosts-cases: the real-world cases of shared/cases/*.sh on a workspace shared by two
# hosts through PostgreSQL. Two hosts h1, h2 (network namespaces, tests/hosts.sh); a fresh
# database of a private PostgreSQL server listening on the bridge (hosts_pg_private: no
# forwarder hop on metadata round trips), reached at the bridge address (hosts_pg_url), Garage
# forwarded to the bridge (hosts_s3_endpoint). Inside h1 (own DESKFS_HOME): `deskfs format
# NAME --meta postgres://deskfs@BRIDGE:PORT/DB?schema=S --bucket s3://… --endpoint
# http://BRIDGE:PORT --region …`; inside h2 (own DESKFS_HOME): `deskfs attach NAME --meta
# URL`; each host then runs `deskfs mount NAME` with its own cache dir. The daemons live in
# their hosts' network namespaces, the FUSE mounts in the root mount namespace, where the
# case scripts run.
#  * the setup itself: no password in either host's workspace.toml, each daemon in its
#    host's network namespace, the sessions table lists hosts h1 and h2, a file written on
#    h1's mount is read on h2's and back
#  * every case whose "# Usage:" line takes two mounts (as 70-cases decides: 3 or more
#    words) runs with MOUNT_A = h1's mount point and MOUNT_B = h2's
#  * every single-mount case runs once on h1's mount (h2's stays mounted), so every case
#    runs on a PostgreSQL-backed mount at least once
#  * each case reports PASS, FAIL or SKIP (like 70-cases); a case that kills a mount is a
#    FAIL (both are remounted for the next ones)
#  * after the cases every upload finishes (no pending mark left in the workspace within
#    180 s; stuck ones are printed with their last error), both hosts unmount with
#    `deskfs umount`, and `deskfs fsck NAME` run on h1 reports 0 problems
# The test fails if any case fails. Cases 25 and 26 fetch packages from the npm registry
# and PyPI (they SKIP when those are not reachable), as in 70-cases.
#   DESKFS_CASES_DIR     where the cases are (default: <repo>/../shared/cases)
#   DESKFS_CASES_FILTER  run only cases whose file name contains this string
# e2e-cost: 105
# e2e-alone: the shared cases have hard time limits: case 26 (pip install + compileall, 58 s) took 32 s alone and 50 s beside the power-loss test, on two hosts sharing a workspace through PostgreSQL (2 CPUs)
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../hosts.sh"
need_deskfs
need_hosts
need_pg
need_s3
need_cmd psql
pg_export_password   # deskfs on the hosts reads PGPASSWORD

CASES_DIR=${DESKFS_CASES_DIR:-$SHARED_DIR/cases}
[[ -d $CASES_DIR ]] || skip "no cases dir $CASES_DIR (shared/ must sit beside the repo)"
mapfile -t ALL_CASES < <(find "$CASES_DIR" -maxdepth 1 -name '*.sh' -type f | sort)
((${#ALL_CASES[@]})) || skip "no *.sh in $CASES_DIR"
TWO=() ONE=()
for c in "${ALL_CASES[@]}"; do
  cname=$(basename "$c" .sh)
  [[ -z ${DESKFS_CASES_FILTER:-} || $cname == *"$DESKFS_CASES_FILTER"* ]] || continue
  usage=$(sed -n 's/^# Usage: *//p' "$c" | sed -n 1p)
  if (($(wc -w <<< "$usage") >= 3)); then TWO+=("$c"); else ONE+=("$c"); fi
done
log "${#TWO[@]} two-mount cases ($(for c in "${TWO[@]}"; do printf '%s ' "$(basename "$c" .sh)"; done)), ${#ONE[@]} single-mount cases"

# ---------------------------------------------------------------- hosts, PostgreSQL, S3
hosts_up 2
# A private server on the bridge: the hosts reach it directly, without a user-space
# forwarder's extra hop on every metadata round trip (the cases have time limits).
hosts_pg_private
EP=$(hosts_s3_endpoint)
META_LOCAL=$(pg_meta_url hosts_cases)   # postgres://deskfs@127.0.0.1:PORT/DB?schema=S
META=$(hosts_pg_url "$META_LOCAL")      # the same database at the bridge address
log "metadata $META, bucket $(s3_url), endpoint $EP"
[[ $META =~ ^postgres://[^:@/]+@${HOSTS_BRIDGE_IP//./\\.}:[0-9]+/ ]] ||
  fail "expected postgres://USER@$HOSTS_BRIDGE_IP:PORT/… (no password) for the hosts, got: $META"

NAME=hcases
declare -A HOME_OF=([h1]=$T/home-h1 [h2]=$T/home-h2)
declare -A CACHE_OF=([h1]=$T/cache-h1 [h2]=$T/cache-h2)
declare -A MNT_OF=([h1]=$MNT [h2]=$MNT2)
mkdir -p "${HOME_OF[h1]}" "${HOME_OF[h2]}" "${CACHE_OF[h1]}" "${CACHE_OF[h2]}"

# hdfs H ARGS...: deskfs ARGS inside host H with H's DESKFS_HOME. The hosts get the S3 keys
# (AWS_*) and PGPASSWORD from the environment like any host would, but not the root
# namespace's AWS_ENDPOINT_URL (127.0.0.1 is each host's own loopback).
hdfs() {
  local h=$1
  shift
  host_run "$h" env -u AWS_ENDPOINT_URL DESKFS_HOME="${HOME_OF[$h]}" \
    AWS_ACCESS_KEY_ID="$BENCH_S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$BENCH_S3_SECRET_KEY" \
    timeout -k 5 "${DFS_TIMEOUT:-120}" "$DESKFS" "$@" < /dev/null
}
hdfs_ok() {
  local h=$1 out rc=0
  shift
  out=$(hdfs "$h" "$@" 2>&1) || rc=$?
  ((rc == 0)) || fail "deskfs $* inside $h failed (exit $rc$( ((rc == 124)) && echo ", timed out")): $out"
  [[ -n $out ]] && printf '%s\n' "$out" >&2
  return 0
}

log "h1: deskfs format $NAME --meta $META --bucket $(s3_url) --endpoint $EP --region $BENCH_S3_REGION"
hdfs_ok h1 format "$NAME" --meta "$META" --bucket "$(s3_url)" --endpoint "$EP" --region "$BENCH_S3_REGION"
log "h2: deskfs attach $NAME --meta $META"
hdfs_ok h2 attach "$NAME" --meta "$META"
for h in h1 h2; do
  cfg=${HOME_OF[$h]}/workspaces/$NAME/workspace.toml
  [[ -f $cfg ]] || fail "$h: no $cfg after format/attach"
  [[ -z ${PGPASSWORD:-} ]] || ! grep -qF -- "$PGPASSWORD" "$cfg" || fail "$h: the PostgreSQL password is stored in $cfg"
  grep -qF -- "$META" "$cfg" || fail "$h: $cfg does not record the metadata URL $META: $(cat "$cfg")"
done

# hmount H: deskfs mount inside host H at MNT_OF[H] with its own cache dir; the daemon is
# recorded (register_pid) and must run in H's network namespace. 1 if it did not mount.
declare -A DAEMON_OF=()
hmount() {
  local h=$1 dir=${MNT_OF[$1]} rc=0 pid
  mkdir -p "$dir"
  register_mount "$dir"
  log "$h: deskfs mount $NAME $dir --cache-dir ${CACHE_OF[$h]}"
  DFS_TIMEOUT=60 hdfs "$h" mount "$NAME" "$dir" --cache-dir "${CACHE_OF[$h]}" > "$T/mount-$h.out" 2>&1 || rc=$?
  if ((rc != 0)); then
    log "$h: deskfs mount failed (exit $rc): $(head -c 1000 "$T/mount-$h.out")"
    return 1
  fi
  wait_for 5 is_mounted "$dir" || { log "$h: deskfs mount returned 0 but $dir is not mounted"; return 1; }
  is_alive "$dir" || { log "$h: $dir is mounted but does not answer"; return 1; }
  DAEMON_OF[$h]=""
  for pid in $(host_pids "$h"); do
    if has_fuse_fd "$pid"; then DAEMON_OF[$h]=$pid; register_pid "$pid"; fi
  done
  [[ -n ${DAEMON_OF[$h]} ]] || { log "$h: no FUSE daemon in $h's network namespace"; return 1; }
  [[ "$(readlink "/proc/${DAEMON_OF[$h]}/ns/net")" == "$(stat -L -c 'net:[%i]' "/run/netns/$(host_netns "$h")")" ]] ||
    { log "$h: the daemon (pid ${DAEMON_OF[$h]}) is not in $h's network namespace"; return 1; }
  return 0
}
mount_both() {
  hmount h1 || fail "the mount on h1 failed: $(head -c 1000 "$T/mount-h1.out")"
  hmount h2 || fail "the mount on h2 failed: $(head -c 1000 "$T/mount-h2.out")"
}
mount_both

# the two mounts are one workspace, seen from two hosts
hosts_seen=$(DESKFS_HOME=${HOME_OF[h1]} ws_meta_psql "$NAME" -q -t -A -c 'SELECT host FROM sessions ORDER BY host' | paste -sd ' ')
assert_eq "h1 h2" "$hosts_seen" "hosts in the sessions table while both are mounted"
echo "from h1 $$" > "$MNT/hello-from-h1"
wait_for 10 grep -qx "from h1 $$" "$MNT2/hello-from-h1" 2> /dev/null ||
  fail "a file written on h1's mount is not readable on h2's within 10 s"
echo "from h2 $$" > "$MNT2/hello-from-h2"
wait_for 10 grep -qx "from h2 $$" "$MNT/hello-from-h2" 2> /dev/null ||
  fail "a file written on h2's mount is not readable on h1's within 10 s"
rm -f "$MNT/hello-from-h1" "$MNT2/hello-from-h2"
log "h1 ($(host_ip h1), daemon ${DAEMON_OF[h1]}) at $MNT and h2 ($(host_ip h2), daemon ${DAEMON_OF[h2]}) at $MNT2 share $NAME"

# ---------------------------------------------------------------- the cases
n_pass=0 n_fail=0 n_skip=0
SUMMARY=()
run_case() { # CASE_FILE WHERE MOUNT...
  local c=$1 where=$2 cname res t0 m dead=""
  shift 2
  cname=$(basename "$c" .sh)
  t0=$SECONDS
  hdfs h1 status "$NAME" --json > "$T/req-before.json" 2> /dev/null || true
  run_shared_case "$T/case.out" "$c" "$@"
  res=$CASE_RESULT
  # where the case spent its time on h1 (the daemon's request counters)
  hdfs h1 status "$NAME" --json > "$T/req-after.json" 2> /dev/null || true
  # a case must not take either mount down with it
  for m in "$MNT" "$MNT2"; do is_alive "$m" || dead="$dead $m"; done
  if [[ -n $dead ]]; then
    if [[ $res == FAIL* ]]; then res="$res [and the mount(s)$dead died]"; else res="FAIL: the mount(s)$dead died (the case said: $res)"; fi
    log "mount(s)$dead dead after $cname: remounting both for the next cases"
    force_unmount "$MNT2"
    force_unmount "$MNT"
    mount_both
  fi
  case "$res" in
    PASS*) n_pass=$((n_pass + 1)) ;;
    SKIP*) n_skip=$((n_skip + 1)) ;;
    *) n_fail=$((n_fail + 1)); sed 's/^/      | /' "$T/case.out" | tail -n 15 >&2 ;;
  esac
  SUMMARY+=("$cname [$where]: $res ($((SECONDS - t0))s)")
  echo "  case $cname [$where]: $res ($((SECONDS - t0))s)" >&2
  echo "      h1 $(python3 "$ROOT/tests/tools/reqdelta.py" "$T/req-before.json" "$T/req-after.json" 2> /dev/null)" >&2
}

for c in "${TWO[@]}"; do run_case "$c" "A=h1 B=h2" "$MNT" "$MNT2"; done
for c in "${ONE[@]}"; do run_case "$c" "h1" "$MNT"; done

# ---------------------------------------------------------------- uploads, unmount, fsck
# Every upload must finish (pending marks of the whole workspace, as `deskfs status` on h1
# reports them) before the unmounts; a stuck one is shown with its last error.
END_FAILS=()
pending_now() {
  hdfs h1 status "$NAME" --json 2> /dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["pending_uploads"])' 2> /dev/null
}
t0=$SECONDS
while :; do
  n=$(pending_now) || n=""
  [[ $n == 0 ]] && { log "all uploads done $((SECONDS - t0))s after the last case"; break; }
  if ((SECONDS - t0 >= ${DESKFS_UPLOAD_WAIT:-180})); then
    log "uploads stuck: ${n:-?} pending marks ${DESKFS_UPLOAD_WAIT:-180}s after the last case; the oldest ones:"
    DESKFS_HOME=${HOME_OF[h1]} ws_meta_psql "$NAME" -q -P pager=off -c \
      "SELECT encode(path, 'escape') AS path, recursive, attempts, last_error FROM pending ORDER BY seq LIMIT 15" >&2 || true
    for h in h1 h2; do
      echo "  $h's log, last upload errors:" >&2
      sed 's/\x1b\[[0-9;]*m//g' "${HOME_OF[$h]}/workspaces/$NAME/logs/"*.log 2> /dev/null | grep -E 'WARN|ERROR' | tail -n 5 | cut -c1-400 >&2 || true
    done
    END_FAILS+=("uploads stuck: ${n:-?} pending marks ${DESKFS_UPLOAD_WAIT:-180}s after the last case")
    break
  fi
  sleep 3
done
for h in h2 h1; do
  log "$h: deskfs umount ${MNT_OF[$h]}"
  rc=0
  out=$(DFS_TIMEOUT=${DESKFS_UMOUNT_TIMEOUT:-120} hdfs "$h" umount "${MNT_OF[$h]}" 2>&1) || rc=$?
  if ((rc != 0)); then
    END_FAILS+=("$h: deskfs umount ${MNT_OF[$h]} failed (exit $rc$( ((rc == 124)) && echo ", timed out after ${DESKFS_UMOUNT_TIMEOUT:-120}s")): $(head -c 300 <<< "$out")")
    log "${END_FAILS[-1]}; unmounting it by force"
    force_unmount "${MNT_OF[$h]}" || true
  fi
  wait_for 10 not_mounted "${MNT_OF[$h]}" || fail "$h: ${MNT_OF[$h]} is still mounted after deskfs umount and force_unmount"
done
if ((${#END_FAILS[@]} == 0)); then
  rc=0
  out=$(DFS_TIMEOUT=300 hdfs h1 fsck "$NAME" 2>&1) || rc=$?
  if ((rc != 0)) || ! grep -q '\b0 problems' <<< "$out"; then
    printf '%s\n' "$out" | head -n 30 >&2
    END_FAILS+=("deskfs fsck $NAME on h1 after both unmounts: exit $rc: $(grep -m1 problems <<< "$out" || tail -n 1 <<< "$out")")
  else
    log "fsck on h1: $(grep -m1 '0 problems' <<< "$out")"
  fi
else
  log "fsck not run (the unmounts did not finish cleanly)"
fi

echo "cases on two hosts (PostgreSQL metadata): $n_pass passed, $n_fail failed, $n_skip skipped" >&2
printf '  %s\n' "${SUMMARY[@]}" >&2
((${#END_FAILS[@]} == 0)) || printf '  after the cases: %s\n' "${END_FAILS[@]}" >&2
((n_fail == 0)) || fail "$n_fail of ${#SUMMARY[@]} cases failed${END_FAILS[0]:+; also: ${END_FAILS[0]}}"
((${#END_FAILS[@]} == 0)) || fail "${END_FAILS[0]}"
log "PASS"
