#!/usr/bin/env bash
# 17-metrics: `deskfs mount --metrics 127.0.0.1:PORT` serves Prometheus text at /metrics,
# parsed with the Prometheus client's own parser (prometheus_client) during a workload:
#   - every family has a type; histograms are cumulative, `+Inf` equals `_count`;
#   - counters move as they should: create/write/lookup requests grow with the workload,
#     an `ENOTEMPTY` and an `ENODATA` reply are counted by errno, a cold read of a file put into
#     the bucket dir counts block misses and fetched bytes, its second read a hit, a
#     blocking flock that waits counts a lock wait; dirty files and pending uploads show
#     the unuploaded work, and go to 0 after `deskfs sync`;
#   - `deskfs status --json` has the same figures (the mount's live object);
#   - `--log-format json`: every line of the daemon's log is a JSON object;
#   - bad input: a --metrics address that is not one, and one already in use -> one line,
#     nothing mounted.
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd curl flock
PY=${DESKFS_TEST_PY:-python3}
"$PY" -c "import prometheus_client" 2> /dev/null || skip_or_fail "no prometheus_client for $PY (scripts/test.sh installs it)"

NAME=met
PORT=$(free_port metrics)

ws_format "$NAME"
BD=$DESKFS_HOME/workspaces/$NAME/bucket
# Put by another tool before the mount: read cold through the mount.
head -c $((3 * 1024 * 1024)) /dev/urandom > "$BD/cold.bin"
ws_mount "$NAME" "$MNT" --metrics "127.0.0.1:$PORT" --upload-delay-ms 600000 --log-format json

scrape() { # OUT: the exposition, parsed and checked; values in OUT.json
  curl -sf "http://127.0.0.1:$PORT/metrics" > "$1" || fail "scrape of http://127.0.0.1:$PORT/metrics failed"
  "$PY" - "$1" << 'PY' || fail "the exposition does not parse or is inconsistent: $(head -c 2000 "$1")"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(open(sys.argv[1]).read()):
    assert fam.type in ("counter", "gauge", "histogram"), (fam.name, fam.type)
    assert fam.name.startswith("deskfs_"), fam.name
    if fam.type == "histogram":
        by_op = {}
        for s in fam.samples:
            by_op.setdefault(s.labels.get("op"), []).append(s)
        for op, ss in by_op.items():
            buckets = [s for s in ss if s.name.endswith("_bucket")]
            vals = [s.value for s in buckets]
            assert vals == sorted(vals), (op, "buckets not cumulative", vals)
            inf = [s.value for s in buckets if s.labels["le"] == "+Inf"]
            count = [s.value for s in ss if s.name.endswith("_count")]
            assert inf == count, (op, inf, count)
            out[f"{fam.name}_count/{op}"] = count[0]
    else:
        for s in fam.samples:
            key = s.name + "".join(f"/{v}" for v in s.labels.values())
            out[key] = s.value
json.dump(out, open(sys.argv[1] + ".json", "w"))
PY
}
val() { # FILE KEY -> the value (0 when absent)
  "$PY" -c 'import json,sys; print(int(json.load(open(sys.argv[1]+".json")).get(sys.argv[2], 0)))' "$1" "$2"
}

scrape "$T/m1"
for i in $(seq 1 20); do echo "file $i" > "$MNT/f$i"; done
mkdir "$MNT/d"
echo x > "$MNT/d/x"
# Errors only the daemon can answer (the kernel answers EEXIST, ENOENT from its dentries).
rmdir "$MNT/d" 2> /dev/null && fail "rmdir of a non-empty dir succeeded"
python3 -c 'import os, sys; os.getxattr(sys.argv[1], "user.none")' "$MNT/f1" 2> /dev/null && fail "getxattr of a missing attribute succeeded"
# The middle block of the cold file, twice (not from the start: not made a local copy;
# O_DIRECT: past the kernel's page cache): a miss, then a hit.
dd if="$MNT/cold.bin" of=/dev/null bs=1M skip=1 count=1 iflag=direct status=none
sleep 0.5
dd if="$MNT/cold.bin" of=/dev/null bs=1M skip=1 count=1 iflag=direct status=none
# A blocking flock that has to wait for another holder.
flock "$MNT/f1" sleep 2 &
holder=$!
sleep 0.5
flock "$MNT/f1" true
wait "$holder"
scrape "$T/m2"

grows() { # KEY MIN: grew by at least MIN between the two scrapes
  local a b
  a=$(val "$T/m1" "$1")
  b=$(val "$T/m2" "$1")
  ((b - a >= $2)) || fail "$1 grew by $((b - a)) (want >= $2)"
}
grows "deskfs_fuse_request_duration_seconds_count/create" 20
grows "deskfs_fuse_request_duration_seconds_count/release" 20   # (writes go through passthrough)
grows "deskfs_fuse_request_duration_seconds_count/lookup" 1
grows "deskfs_fuse_errors_total/ENOTEMPTY" 1
grows "deskfs_fuse_errors_total/ENODATA" 1
grows "deskfs_cache_block_misses_total" 1
grows "deskfs_cache_block_hits_total" 1
grows "deskfs_bucket_fetched_bytes_total" $((1024 * 1024))
grows "deskfs_lock_waits_total" 1
((
  $(val "$T/m2" deskfs_dirty_files) >= 21 && $(val "$T/m2" deskfs_uploads_pending) >= 21
)) || fail "dirty files / pending uploads do not show the 21 unuploaded files: $(grep -E '^deskfs_(dirty|uploads)' "$T/m2")"
# status --json: the same figures.
"$DESKFS" status "$NAME" --json > "$T/st.json"
"$PY" - "$T/st.json" << 'PY' || fail "status --json lacks the metrics' figures: $(head -c 1500 "$T/st.json")"
import json, sys
d = json.load(open(sys.argv[1]))
live = d["mounts"][0]["live"]
for k in ("block_hits", "block_misses", "block_fetched_bytes", "lock_waits", "lock_waiting", "dirty_files", "pending_uploads", "requests", "errors"):
    assert k in live, k
assert live["errors"].get("ENOTEMPTY", 0) >= 1, live["errors"]
PY
"$DESKFS" sync "$NAME" > /dev/null 2>&1 || fail "deskfs sync failed"
scrape "$T/m3"
assert_eq 0 "$(val "$T/m3" deskfs_uploads_pending)" "pending uploads after sync"
assert_eq 0 "$(val "$T/m3" deskfs_dirty_files)" "dirty files after sync"

# --log-format json: every line of the daemon's log is one JSON object.
LOGF=$(ls -t "$DESKFS_HOME/workspaces/$NAME/logs"/mount-*.log | head -n 1)
"$PY" - "$LOGF" "$PORT" << 'PY' || fail "the daemon's log is not JSON lines: $(head -c 1500 "$LOGF")"
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
assert lines, "empty log"
objs = [json.loads(l) for l in lines]
assert all("level" in o and "fields" in o for o in objs), objs[:3]
assert any(f"127.0.0.1:{sys.argv[2]}/metrics" in o["fields"].get("message", "") for o in objs), objs[:5]
PY

# Bad --metrics addresses: one line, nothing mounted.
mkdir -p "$T/m-bad"
register_mount "$T/m-bad"
rc=0
"$DESKFS" mount "$NAME" "$T/m-bad" --metrics nowhere > /dev/null 2> "$T/bad.err" || rc=$?
((rc != 0)) && grep -q "invalid value 'nowhere' for '--metrics <ADDR>'" "$T/bad.err" || fail "a bad --metrics address: exit $rc: $(cat "$T/bad.err")"
rc=0
"$DESKFS" mount "$NAME" "$T/m-bad" --metrics "127.0.0.1:$PORT" > /dev/null 2> "$T/busy.err" || rc=$?
((rc != 0)) && grep -q "cannot listen for --metrics on 127.0.0.1:$PORT" "$T/busy.err" || fail "a --metrics address in use: exit $rc: $(cat "$T/busy.err")"
not_mounted "$T/m-bad" || fail "a mount with a bad --metrics address got mounted"
ws_umount "$MNT"
log "PASS"
