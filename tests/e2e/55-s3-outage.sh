#!/usr/bin/env bash
# 55-s3-outage: the bucket goes away while uploads are pending (DESIGN: "Bucket down: reads
# of cached data and all writes keep working; uploads retry with backoff; deskfs status
# shows what is pending and why"). The store is DESKFS_E2E_STORE (tests/store.sh; S3 by
# default, 55z/55g on Azure/GCS emulators). Files are written (the first three of 20 MiB:
# multipart uploads, in flight or queued when the store goes), the store is stopped at once
# (store_ctl stop: Garage; Azurite, its blobs kept in its state dir; GCS: the XML shim all
# of deskfs's requests go through, the in-memory emulator and its objects stay), more files
# are written (three of 18 MiB)/overwritten/renamed (every operation must succeed
# quickly), cached data stays readable, `deskfs status` reports pending/failing work,
# `deskfs sync` does not claim success while the server is down; the server is started
# again (same state and keys), `deskfs sync` finishes, every file is in the bucket with
# its content, and status shows nothing pending.
# Stops and starts only the server scripts/test.sh started (DESKFS_TEST_S3_OWNED=1) or the
# test's private emulator.
# e2e-cost: 39
# e2e-alone: stops the shared Garage (store_ctl stop), which every S3 test of the run uses
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_store
store_ctl_allowed || skip "the S3 server is not owned by this run (run through scripts/test.sh)"

NAME=outage
ws_format "$NAME" --bucket "$(store_url)"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache"
M=$MNT
EXP=$T/expected
mkdir -p "$EXP"

cat > "$T/status-check.py" <<'PY'
# status-check.py busy|idle < status.json
#   busy: some pending/dirty/queued/failed/retry/error figure is non-zero (or non-empty)
#   idle: every pending/dirty/queued figure is zero (failure counters may be cumulative)
import json, re, sys
mode = sys.argv[1]
try:
    data = json.load(sys.stdin)
except ValueError as e:
    print(f"not valid JSON: {e}")
    sys.exit(2)
busy_re = re.compile(r"pending|dirty|queue|fail|retr|error|unuploaded|backlog", re.I)
idle_re = re.compile(r"pending|dirty|queue|unuploaded|backlog", re.I)
found = []
def walk(o, path):
    key = path[-1] if path else ""
    if isinstance(o, dict):
        for k, v in o.items():
            walk(v, path + [str(k)])
    elif isinstance(o, list):
        found.append((".".join(path), len(o)))
        for i, v in enumerate(o):
            walk(v, path + [str(i)])
    elif isinstance(o, bool) or o is None:
        pass
    elif isinstance(o, (int, float)):
        found.append((".".join(path), o))
    elif isinstance(o, str):
        found.append((".".join(path), 1 if o.strip() else 0))
walk(data, [])
def last_key(p):
    parts = [x for x in p.split(".") if not x.isdigit()]
    return parts[-1] if parts else ""
if mode == "busy":
    hits = [(p, v) for p, v in found if busy_re.search(last_key(p)) and v]
    print("non-zero:", hits)
    sys.exit(0 if hits else 1)
hits = [(p, v) for p, v in found if idle_re.search(last_key(p)) and v]
seen = [p for p, v in found if idle_re.search(last_key(p))]
print("non-zero:", hits, "checked:", seen)
sys.exit(0 if (seen and not hits) else 1)
PY
status_is() { # busy|idle
  dfs status "$NAME" --json > "$T/status.json" 2> "$T/status.err" || return 1
  python3 "$T/status-check.py" "$1" < "$T/status.json" > "$T/status-check.out" 2>&1
}

echo "baseline" > "$M/base.txt"
ws_sync "$NAME"

cat > "$T/writer.py" <<'PY'
import os, sys
mnt, exp, tag, n, big = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
for i in range(n):
    rel = f"{tag}/file{i:02d}.bin"
    data = os.urandom(big if i < 3 else 1000 + i)
    for root in (mnt, exp):
        os.makedirs(os.path.join(root, tag), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
PY

log "batch A, then stop the store ($STORE) at once"
timeout 120 python3 "$T/writer.py" "$M" "$EXP" batch-a 20 $((20 << 20)) || fail "writing batch A failed (server still up)"
# shellcheck disable=SC2016  # expanded when run, at exit
on_exit 'store_ctl start > /dev/null 2>&1 || log "could not restart the store ($STORE)"'
store_ctl stop > "$T/s3-stop.log" 2>&1 || fail "stopping the store ($STORE) failed: $(cat "$T/s3-stop.log")"
! store_port_open || fail "harness error: the store's port still answers after stop"
DOWN_AT=$SECONDS

log "writing while the server is down"
timeout 60 python3 "$T/writer.py" "$M" "$EXP" batch-b 30 $((18 << 20)) || fail "writing batch B while the store is down failed or took > 60 s"
echo "overwritten while down" > "$M/base.txt" || fail "overwrite while the store is down failed"
echo "overwritten while down" > "$EXP/base.txt"
timeout 20 mkdir -p "$M/newdir/sub" || fail "mkdir while the store is down failed"
echo "in new dir" > "$M/newdir/sub/n.txt"
mkdir -p "$EXP/newdir/sub"
echo "in new dir" > "$EXP/newdir/sub/n.txt"
timeout 20 mv "$M/batch-a/file10.bin" "$M/batch-a/renamed10.bin" || fail "rename while the store is down failed"
mv "$EXP/batch-a/file10.bin" "$EXP/batch-a/renamed10.bin"
assert_eq "overwritten while down" "$(timeout 20 cat "$M/base.txt")" "read while the store is down"
assert_file_eq "$EXP/batch-a/file00.bin" "$M/batch-a/file00.bin" "cached read of batch A while the store is down"
log "all writes succeeded $((SECONDS - DOWN_AT)) s into the outage"

log "deskfs status while down"
DFS_TIMEOUT=20 dfs status "$NAME" > "$T/status.txt" 2>&1 || fail "deskfs status $NAME failed while the store is down: $(cat "$T/status.txt")"
sed 's/^/    status: /' "$T/status.txt" >&2
wait_for 60 status_is busy || fail "deskfs status --json does not show pending/failing uploads while the store is down: $(cat "$T/status-check.out" "$T/status.err" 2>/dev/null | head -c 1500) json: $(head -c 1500 "$T/status.json")"
log "status --json: $(cat "$T/status-check.out")"

log "deskfs sync while down must not report success"
timeout -k 5 400 "$DESKFS" sync "$NAME" < /dev/null > "$T/sync-bg.out" 2>&1 &
SYNC_PID=$!
register_pid "$SYNC_PID"
sleep 8
EARLY_SYNC=running
if ! pid_running "$SYNC_PID"; then
  src=0
  wait "$SYNC_PID" || src=$?
  ((src != 0)) || fail "deskfs sync returned 0 while the store was down (nothing can have reached the bucket): $(cat "$T/sync-bg.out")"
  EARLY_SYNC="exited $src"
  log "sync while down exited with $src (allowed): $(head -c 300 "$T/sync-bg.out")"
fi

log "start the store ($STORE) again (down for $((SECONDS - DOWN_AT)) s)"
store_ctl start > /dev/null 2> "$T/s3-start.log" || fail "restarting the store ($STORE) failed: $(cat "$T/s3-start.log")"
if [[ $EARLY_SYNC == running ]]; then
  src=0
  wait "$SYNC_PID" || src=$?
  ((src == 0)) || fail "deskfs sync started during the outage failed after the server came back (exit $src): $(cat "$T/sync-bg.out")"
  log "the sync started during the outage finished after the restart"
fi
ws_sync "$NAME"

log "checking the bucket"
store_keys > "$T/keys"
n=0
while IFS= read -r -d '' f; do
  store_obj_eq "${f#"$EXP"/}" "$f"
  n=$((n + 1))
done < <(find "$EXP" -type f -print0)
log "$n objects with the right content"
! store_exists "$(store_key batch-a/file10.bin)" || fail "old name batch-a/file10.bin still in the bucket after rename + sync"
wait_for 30 status_is idle || fail "deskfs status --json still shows pending work after sync: $(cat "$T/status-check.out") json: $(head -c 1500 "$T/status.json")"
ws_umount "$M"

log "PASS"
