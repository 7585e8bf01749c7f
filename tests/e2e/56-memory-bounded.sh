#!/usr/bin/env bash
# 56-memory-bounded: the daemon's memory stays bounded under many cold readers. 50 files of
# 32 MiB sit in the S3 bucket (put there by rclone, not through deskfs); a fresh mount with
# an empty cache has 50 readers read them whole at once. Each reader's readahead would keep
# up to 32 block fetches (1 MiB each) in flight; the global buffer budget (--memory-mib,
# default 64) caps what all of them hold together. Checks: every reader gets the right
# bytes (sha256), the daemon's peak RSS (VmHWM) stays under 256 MiB, and `deskfs status
# --json` reports the budget it held (`buffers.peak_bytes` within the budget,
# `buffers.limit_bytes` as set). Nothing is timed.
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3

READERS=${MEMORY_TEST_READERS:-50}
FILE_MIB=${MEMORY_TEST_FILE_MIB:-32}
MAX_RSS_MIB=${MEMORY_TEST_MAX_RSS_MIB:-256}
BUF_MIB=${MEMORY_TEST_BUFFER_MIB:-}   # unset: the default budget (64 MiB) is what is tested

PRE=$T/prefill
mkdir -p "$PRE"
head -c $((FILE_MIB * 1024 * 1024)) /dev/urandom > "$T/one.bin"
want=$(sha "$T/one.bin")
# Hard links: 50 objects in the bucket, one copy on the local disk.
for i in $(seq -w 1 "$READERS"); do ln "$T/one.bin" "$PRE/f$i.bin"; done
log "uploading $READERS objects of $FILE_MIB MiB with rclone"
rc copy --transfers 8 --checkers 16 "$PRE" "$(rc_path "$S3_PREFIX/big")" > "$T/rclone.log" 2>&1 \
  || fail "rclone copy failed: $(tail -n 20 "$T/rclone.log")"

NAME=membound
ws_format "$NAME" --bucket "$(s3_url)"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache" ${BUF_MIB:+--buffer-memory "${BUF_MIB}M"}
daemon_pid() { dfs status "$NAME" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0]["pid"])'; }
PID=$(daemon_pid)
[[ $PID =~ ^[0-9]+$ ]] || fail "no daemon pid in status: $PID"
rss_mib() { awk -v k="$2:" '$1 == k {print int($2 / 1024)}' "/proc/$1/status"; }
log "daemon $PID: RSS before the readers $(rss_mib "$PID" VmRSS) MiB"

ls "$MNT/big" > /dev/null
pids=()
for i in $(seq -w 1 "$READERS"); do
  (sha "$MNT/big/f$i.bin" > "$T/got.$i") &
  pids+=($!)
done
# While they read: status answers and shows the budget in use.
dfs status "$NAME" --json > "$T/status.during.json" || fail "status failed while the readers ran"
for p in "${pids[@]}"; do wait "$p" || fail "a reader failed"; done
for i in $(seq -w 1 "$READERS"); do
  assert_eq "$want" "$(cat "$T/got.$i")" "content of big/f$i.bin"
done
peak=$(rss_mib "$PID" VmHWM)
log "daemon peak RSS with $READERS cold readers of $FILE_MIB MiB: $peak MiB (limit $MAX_RSS_MIB)"
dfs status "$NAME" --json > "$T/status.after.json"
python3 - "$T/status.after.json" "${BUF_MIB:-64}" <<'PY' || fail "status --json buffers: $(cat "$T/status.after.json" | head -c 1500)"
import json, sys
s = json.load(open(sys.argv[1]))
b = s["mounts"][0]["live"]["buffers"]
assert b["limit_bytes"] == int(sys.argv[2]) << 20, b
assert 0 < b["peak_bytes"] <= b["limit_bytes"], b
assert b["held_bytes"] == 0, b
print(f"buffers: peak {b['peak_bytes'] >> 20} MiB of {b['limit_bytes'] >> 20} MiB, waits {b['waits']}, readahead skipped {b['readahead_skipped']}", file=sys.stderr)
PY
((peak < MAX_RSS_MIB)) || fail "daemon peak RSS $peak MiB with $READERS cold readers, limit $MAX_RSS_MIB MiB"
ws_umount "$MNT"
log "ok"
