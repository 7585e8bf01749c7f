#!/usr/bin/env bash
# 58-faulty-bucket: a workspace whose S3 server misbehaves, through tests/tools/faultys3.py
# in front of Garage: 500 InternalError, 503 SlowDown, connection resets, 3 s stalls,
# bodies cut in half and slow answers on a random share of requests (15 %, seed printed),
# then a burst in which every request gets 503 SlowDown.
#   - imports and reads converge: a prefilled prefix (300 small objects, one of 24 MiB,
#     put there by rclone straight into Garage) lists whole and every file reads back
#     right, cold, through the faults; then 120 more cold files read back right while 40 %
#     of requests fail fast (more than the HTTP client's own retries absorb: deskfs tries
#     each read again, and status counts those retries);
#   - uploads converge and nothing acknowledged is lost: 200 small files, two of 20 MiB
#     (multipart), renames and deletes made under faults and during the burst are, after
#     `deskfs sync`, exactly what Garage holds (checked straight at Garage, not through
#     the proxy);
#   - during the burst `deskfs status` shows the failing uploads with what the server
#     answered ("the server answered 503 SlowDown …"), attempts counted; after it they
#     succeed;
#   - a bucket that stops answering (every request stalls): `deskfs umount --timeout 3`
#     exits 3, the daemon exits within 30 s although its last metadata backup still waits
#     on a PUT, without a panic; remounted with the faults off, the file written during
#     the stall reaches the bucket;
#   - every fault kind happened at least once (the proxy's counts).
# e2e-cost: 86
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3

SEED=${FAULTY_S3_SEED:-$((RANDOM * 32768 + RANDOM))}
RATE=${FAULTY_S3_RATE:-0.15}
log "fault seed $SEED (FAULTY_S3_SEED=$SEED repeats the draws), rate $RATE"
echo '{"rate": 0}' > "$T/proxy.ctl"
python3 "$LIB_DIR/tools/faultys3.py" --listen 127.0.0.1:0 --to "$BENCH_S3_ENDPOINT" \
  --rate "$RATE" --seed "$SEED" --control "$T/proxy.ctl" --stats "$T/proxy.stats" \
  > "$T/proxy.addr" 2> "$T/proxy.log" &
register_pid $!
wait_for 10 test -s "$T/proxy.addr" || fail "the fault proxy did not start: $(cat "$T/proxy.log")"
EP=http://$(head -n 1 "$T/proxy.addr")
faults() { echo "$1" > "$T/proxy.ctl.tmp" && mv "$T/proxy.ctl.tmp" "$T/proxy.ctl"; sleep 0.5; log "faults: $1"; }

PRE=$T/prefill
mkdir -p "$PRE/many"
python3 - "$PRE/many" <<'PY'
import os, sys
for i in range(300):
    with open(os.path.join(sys.argv[1], f"f{i:03d}.txt"), "wb") as f:
        f.write(os.urandom(100 + i * 37))
PY
head -c $((24 << 20)) /dev/urandom > "$PRE/big.bin"
STORM=$T/storm-prefill
mkdir -p "$STORM"
python3 - "$STORM" <<'PY'
import os, sys
for i in range(120):
    with open(os.path.join(sys.argv[1], f"r{i:03d}.bin"), "wb") as f:
        f.write(os.urandom(2000 + i * 61))
PY
(cd "$STORM" && find . -type f -printf '%P\0' | sort -z | xargs -0 sha256sum) > "$T/storm.sha"
rc copy --transfers 16 --checkers 16 "$STORM" "$(rc_path "$S3_PREFIX/storm")" >> "$T/rclone.log" 2>&1 \
  || fail "rclone copy of the storm prefix failed: $(tail -n 20 "$T/rclone.log")"
(cd "$PRE" && find . -type f -printf '%P\0' | sort -z | xargs -0 sha256sum) > "$T/pre.sha"
rc copy --transfers 16 --checkers 16 "$PRE" "$(rc_path "$S3_PREFIX/pre")" > "$T/rclone.log" 2>&1 \
  || fail "rclone copy failed: $(tail -n 20 "$T/rclone.log")"

NAME=faulty
ws_format "$NAME" --bucket "$(s3_url)" --endpoint "$EP" --region "$BENCH_S3_REGION"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache"
faults "{\"rate\": $RATE}"

log "import and cold reads through the faults"
(cd "$MNT/pre" && sha256sum --quiet -c "$T/pre.sha") > "$T/pre.check" 2>&1 \
  || fail "the prefilled prefix does not read back right through the faults: $(head -n 10 "$T/pre.check")"
assert_eq 301 "$(find "$MNT/pre" -type f | wc -l)" "files imported from the prefilled prefix"

# 40 % of requests failing fast: one request in 16 fails three times in a row, which is
# all the HTTP client retries, so without deskfs's own read retries some of these 121
# reads (a listing and 120 cold files) would reach the reader as EIO.
log "a storm of read faults: 40 % of requests answered 500/503, reset or cut short"
faults '{"rate": 0.4, "kinds": ["500", "503", "reset", "truncate"]}'
(cd "$MNT/storm" && sha256sum --quiet -c "$T/storm.sha") > "$T/storm.check" 2>&1 \
  || fail "cold reads did not converge through the storm of faults: $(head -n 10 "$T/storm.check")"
faults "{\"rate\": $RATE}"
dfs status "$NAME" > "$T/status.storm.txt" || fail "status failed after the storm"
grep -qE "bucket reads +[1-9][0-9]* tried again after a transient failure, 0 failed" "$T/status.storm.txt" \
  || fail "status does not show the bucket reads tried again (and none failed): $(grep -E 'bucket reads' "$T/status.storm.txt" || echo 'no bucket reads line')"
log "status after the storm: $(grep -E 'bucket reads' "$T/status.storm.txt" | tr -s ' ')"

log "writes, renames and deletes through the faults"
W=$T/want
mkdir -p "$W/small" "$W/big"
python3 - "$W/small" <<'PY'
import os, sys
for i in range(200):
    with open(os.path.join(sys.argv[1], f"s{i:03d}.dat"), "wb") as f:
        f.write(os.urandom(50 + i * 53))
PY
head -c $((20 << 20)) /dev/urandom > "$W/big/one.bin"
head -c $((20 << 20)) /dev/urandom > "$W/big/two.bin"
cp -r "$W/small" "$W/big" "$MNT/" || fail "writing through the faults failed"
for i in $(seq -w 0 9); do
  mv "$MNT/small/s00$i.dat" "$MNT/small/renamed-$i.dat" && mv "$W/small/s00$i.dat" "$W/small/renamed-$i.dat"
done
for i in $(seq 150 159); do
  rm "$MNT/small/s$i.dat" && rm "$W/small/s$i.dat"
done

log "a burst: every request answered 503 SlowDown"
faults '{"burst": "503"}'
mkdir -p "$W/burst" "$MNT/burst"
for i in $(seq -w 1 20); do
  head -c $((1000 + 10#$i * 100)) /dev/urandom > "$W/burst/b$i.dat"
  cp "$W/burst/b$i.dat" "$MNT/burst/" || fail "a write during the burst failed (writes go to the local journal)"
done
seen=
for _ in $(seq 1 40); do
  dfs status "$NAME" --json > "$T/status.burst.json" || fail "status failed during the burst"
  if python3 - "$T/status.burst.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
fails = s.get("failures") or []
ok = s["failing_uploads"] > 0 and any(
    f["attempts"] > 0 and ("SlowDown" in f["error"] or "503" in f["error"]) for f in fails)
sys.exit(0 if ok else 1)
PY
  then seen=1; break; fi
  sleep 0.5
done
[[ -n $seen ]] || fail "during the burst, status never showed a failing upload with the server's error: $(head -c 2000 "$T/status.burst.json")"
dfs status "$NAME" > "$T/status.burst.txt" || fail "status failed during the burst"
grep -q "the server answered 503 SlowDown" "$T/status.burst.txt" \
  || fail "status does not say what the server answered: $(grep -iE 'fail' "$T/status.burst.txt" | head -n 3)"
log "status during the burst: $(grep -iE 'fail|pending' "$T/status.burst.txt" | head -n 3 | tr -s ' ' | tr '\n' ' ')"
faults "{\"rate\": $RATE}"

log "deskfs sync converges"
ws_sync "$NAME"
faults '{"rate": 0}'
(cd "$MNT" && sha256sum --quiet -c <(cd "$W" && find . -type f -printf '%P\0' | sort -z | xargs -0 sha256sum)) \
  > "$T/mnt.check" 2>&1 || fail "the mount does not hold what was written: $(head -n 10 "$T/mnt.check")"

log "Garage holds exactly what was written (checked straight at Garage)"
mkdir -p "$T/got"
rc copy --transfers 16 "$(rc_path "$S3_PREFIX")" "$T/got" --exclude '.deskfs/**' > "$T/rclone-get.log" 2>&1 \
  || fail "rclone copy back failed: $(tail -n 20 "$T/rclone-get.log")"
(cd "$W" && find . -type f -printf '%P\0' | sort -z | xargs -0 sha256sum) > "$T/want.sha"
(cd "$T/got" && find . \( -path ./pre -o -path ./storm \) -prune -o -type f -printf '%P\0' | sort -z | xargs -0 sha256sum) > "$T/got.sha"
diff "$T/want.sha" "$T/got.sha" > "$T/bucket.diff" || fail "the bucket differs from what was written (< written, > bucket): $(head -n 20 "$T/bucket.diff")"

ws_umount "$MNT"

log "a bucket that stops answering (every request stalls 120 s): umount and exit stay bounded"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache"
PID=$(python3 -c 'import json,glob,sys; r=[json.load(open(p)) for p in glob.glob(sys.argv[1] + "/*.json")]; print(r[0]["pid"] if r else "")' "$DESKFS_HOME/workspaces/$NAME/run")
[[ -n $PID ]] || fail "no run record of the mount's daemon"
faults '{"burst": "stall", "stall_s": 120}'
head -c 3000 /dev/urandom > "$W/stalled.bin"
cp "$W/stalled.bin" "$MNT/stalled.bin" || fail "a write while the bucket stalls failed (writes go to the local journal)"
rc=0
t0=$SECONDS
DFS_TIMEOUT=60 dfs umount "$MNT" --timeout 3 > "$T/umount.stall.out" 2>&1 || rc=$?
((rc == 3)) || fail "umount --timeout 3 with the bucket stalled: exit $rc after $((SECONDS - t0)) s, expected 3: $(head -c 600 "$T/umount.stall.out")"
wait_for 30 not_mounted "$MNT" || fail "the mount is still there after umount --timeout 3 (bucket stalled)"
wait_for 30 eval '! pid_running "$PID"' || fail "daemon $PID still runs 30 s after umount --timeout 3 (bucket stalled)"
log "umount --timeout 3: exit 3 after $((SECONDS - t0)) s, daemon gone after $((SECONDS - t0)) s"
DLOG=$(ls -t "$DESKFS_HOME"/workspaces/$NAME/logs/*.log | head -n 1)
# The last metadata backup still waits on a stalled PUT when the daemon exits: its thread
# must not panic when the runtime it runs on shuts down.
grep -q 'last metadata backup did not finish within' "$DLOG" ||
  fail "harness: the last metadata backup of daemon $PID did not wait past its limit (no stall?): $(grep -i backup "$DLOG" | tail -n 3)"
if grep -h -A3 'panicked' "$DLOG" > "$T/panics.txt"; then
  fail "the daemon panicked while exiting with the bucket stalled: $(head -c 1500 "$T/panics.txt")"
fi
faults '{"rate": 0, "stall_s": 3}'
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache"
ws_sync "$NAME"
assert_obj_eq stalled.bin "$W/stalled.bin"
ws_umount "$MNT"

python3 - "$T/proxy.stats" <<'PY' || fail "not every fault kind happened: $(cat "$T/proxy.stats")"
import json, sys
s = json.load(open(sys.argv[1]))
missing = [k for k, n in s["faults"].items() if n == 0]
print(f"proxy: {s['requests']} requests, faults {s['faults']}", file=sys.stderr)
sys.exit(1 if missing else 0)
PY
log "ok"
