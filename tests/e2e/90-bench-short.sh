#!/usr/bin/env bash
# 90-bench-short: the benchmark (scripts/bench.sh --short: local directory + deskfs over the
# test's S3 server, small sizes) runs to the end and writes its JSON and Markdown. Nothing
# about speed is asserted; the test fails only when a workload errors out or hangs (its
# child hits the wall limit), a command in it fails (git, cargo, tar, fio, dd) or an
# operation returns an error or wrong data. The PNG is drawn only if matplotlib is there.
# e2e-cost: 114
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3
need_cmd git tar dd cargo

export DESKFS_BIN=$DESKFS
export DESKFS_BENCH_STATE=$T/bench
export DESKFS_BENCH_NO_PIP=1          # no network installs from a test
OUT=$T/out
# the bench's mount and daemon, for lib.sh's cleanup if the run dies half-way
register_mount "$DESKFS_BENCH_STATE/mnt/deskfs"
on_exit 'if [[ -f $DESKFS_BENCH_STATE/run/deskfs.pid ]]; then read -r p s < "$DESKFS_BENCH_STATE/run/deskfs.pid"; _pid_is_ours "$p" "$s" && kill -TERM "$p"; fi'

log "scripts/bench.sh --short (S3 $BENCH_S3_ENDPOINT, bucket $BENCH_S3_BUCKET)"
rc=0
timeout -k 10 840 bash "$ROOT/scripts/bench.sh" --short --no-build --targets local,deskfs --out "$OUT" \
  > "$T/bench.out" 2> "$T/bench.log" < /dev/null || rc=$?
cat "$T/bench.out" >&2
if ((rc != 0)); then
  tail -n 40 "$T/bench.log" >&2
  fail "scripts/bench.sh --short exited with status $rc"
fi
[[ -s $OUT/bench-short.json ]] || fail "no $OUT/bench-short.json"
[[ -s $OUT/bench-short.md ]] || fail "no $OUT/bench-short.md"
grep -q '^| workload ' "$OUT/bench-short.md" || fail "bench-short.md has no table"
[[ -s $OUT/bench-short.png ]] && log "chart written" || log "no chart (matplotlib missing)"

problems=$(python3 - "$OUT/bench-short.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bad = []
for t in ("local", "deskfs"):
    info = r["targets"].get(t)
    if not info or not info.get("mounted"):
        bad.append(f"{t}: not run ({(info or {}).get('error', 'missing')})")
seen = set()
for x in r["records"]:
    tw = f"{x['target']}/{x['workload']}"
    if x["metric"] == "_status":
        seen.add((x["target"], x["workload"]))
        if x["value"] != "ok":
            bad.append(f"{tw}: {x['value']}")
        continue
    if x.get("rc") not in (None, 0):
        bad.append(f"{tw}.{x['metric']}: rc={x['rc']}")
    if x.get("errors"):
        bad.append(f"{tw}.{x['metric']}: {x['errors']} failed operations")
    if x["metric"] in ("size_ok", "ok") and x["value"] is not True:
        bad.append(f"{tw}.{x['metric']}: {x['value']}")
    if x.get("integrity") not in (None, "ok") or x.get("clean") is False:
        bad.append(f"{tw}.{x['metric']}: {x}")
for t in ("local", "deskfs"):
    for w in ("smallfiles", "untar", "git", "cargo", "npm", "lsdir", "sqlite", "seq", "fio", "durable", "scale"):
        if (t, w) not in seen and r["targets"].get(t, {}).get("mounted"):
            bad.append(f"{t}/{w}: did not run")
print("\n".join(bad))
PY
) || fail "could not read bench-short.json"
[[ -z $problems ]] || fail "benchmark run had errors: $(tr '\n' ';' <<< "$problems")"
log "benchmark short run complete"
