#!/usr/bin/env bash
# 70-cases: every real-world case script of shared/cases/*.sh (each reproduces a workload
# that broke on some bucket-backed/FUSE filesystem) run against a deskfs mount of an S3
# workspace (the embedded default when there is no S3 server). Cases whose usage line
# takes two mounts get a second mount of the same workspace. Each case reports PASS, FAIL
# or SKIP; this test fails if any case fails (or kills the mount).
#   DESKFS_CASES_DIR     where the cases are (default: <repo>/../shared/cases)
#   DESKFS_CASES_FILTER  run only cases whose file name contains this string
# e2e-cost: 42
# e2e-timeout: 1200
source "$(dirname "$0")/../lib.sh"
need_deskfs

CASES_DIR=${DESKFS_CASES_DIR:-$SHARED_DIR/cases}
[[ -d $CASES_DIR ]] || skip "no cases dir $CASES_DIR (shared/ must sit beside the repo)"
mapfile -t CASES < <(find "$CASES_DIR" -maxdepth 1 -name '*.sh' -type f | sort)
((${#CASES[@]})) || skip "no *.sh in $CASES_DIR"

NAME=cases
if have_s3; then
  ws_format "$NAME" --bucket "$(s3_url)"
  KIND="S3 workspace $(s3_url)"
else
  [[ ${DESKFS_TEST_STRICT:-0} != 1 ]] || fail "no S3 server"
  ws_format "$NAME"
  KIND="embedded workspace"
fi
log "running ${#CASES[@]} cases from $CASES_DIR on a $KIND"

SECOND_OK=0
mount_both() {
  # both mounts use the workspace's default cache dir (a workspace records one cache dir)
  ws_mount "$NAME" "$MNT"
  SECOND_OK=0
  local rc=0
  mkdir -p "$MNT2"
  register_mount "$MNT2"
  timeout -k 5 60 "$DESKFS" mount "$NAME" "$MNT2" > "$T/mount2.out" 2>&1 < /dev/null || rc=$?
  if ((rc == 0)) && wait_for 5 is_alive "$MNT2"; then
    SECOND_OK=1
  else
    log "second mount of the same workspace failed (exit $rc): $(head -c 500 "$T/mount2.out")"
  fi
}
mount_both

n_pass=0 n_fail=0 n_skip=0
SUMMARY=()
for c in "${CASES[@]}"; do
  cname=$(basename "$c" .sh)
  [[ -z ${DESKFS_CASES_FILTER:-} || $cname == *"$DESKFS_CASES_FILTER"* ]] || continue
  usage=$(sed -n 's/^# Usage: *//p' "$c" | sed -n 1p)
  nargs=$(wc -w <<< "$usage")
  args=("$MNT")
  if ((nargs >= 3)); then
    args+=("$MNT2")
    if ((!SECOND_OK)); then
      res="FAIL: needs a second mount of the same workspace, and it could not be mounted: $(head -c 200 "$T/mount2.out" | tr '\n' ' ')"
      n_fail=$((n_fail + 1)); SUMMARY+=("$cname: $res"); echo "  case $cname: $res" >&2
      continue
    fi
  fi
  t0=$SECONDS
  run_shared_case "$T/case.out" "$c" "${args[@]}"
  res=$CASE_RESULT
  # a case must not take the mount down with it
  for m in "$MNT" $( ((SECOND_OK)) && echo "$MNT2"); do
    if ! is_alive "$m"; then
      if [[ $res == FAIL* ]]; then res="$res [and the mount $m died]"; else res="FAIL: the mount $m died (the case said: $res)"; fi
      log "mount $m is dead after $cname: remounting for the next cases"
      force_unmount "$MNT"; force_unmount "$MNT2"
      mount_both
      break
    fi
  done
  case "$res" in
    PASS*) n_pass=$((n_pass + 1)) ;;
    SKIP*) n_skip=$((n_skip + 1)) ;;
    *) n_fail=$((n_fail + 1)); sed 's/^/      | /' "$T/case.out" | tail -n 15 >&2 ;;
  esac
  SUMMARY+=("$cname: $res ($((SECONDS - t0))s)")
  echo "  case $cname: $res ($((SECONDS - t0))s)" >&2
done

((SECOND_OK)) && ws_umount "$MNT2"
ws_umount "$MNT"

echo "cases: $n_pass passed, $n_fail failed, $n_skip skipped" >&2
printf '  %s\n' "${SUMMARY[@]}" >&2
((n_fail == 0)) || fail "$n_fail of ${#SUMMARY[@]} cases failed"
log "PASS"
