#!/usr/bin/env bash
# 91-bucket-convergence: the bucket converges to the namespace whatever order uploads,
# mmap write-backs and deletes arrive in. Two mounts of one workspace on one host (own
# cache dirs, a short upload delay so uploads race the namespace) run seeded random
# create/write/append/truncate/mmap-write/rename/delete/mkdir/rmdir/symlink workloads
# (tests/tools/converge.py, each op through a random mount) while a SQLite WAL workload
# on the first mount ends by removing its directory; then `deskfs sync`, and the bucket —
# listed with tests/s3.py, not through deskfs — equals the namespace exactly: no extra
# object, none missing, every content equal (sha256), directory markers only for
# directories and one for every empty directory. Both mounts unmount (no rmdir retried
# for ever). Then the same on the embedded default (file:// bucket dir).
# e2e-cost: 53
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3
need_cmd python3

CONV="python3 $LIB_DIR/tools/converge.py"
SEEDS=${CONVERGE_SEEDS:-"11 22 33"}
OPS=${CONVERGE_OPS:-250}

# run_round NAME M1 M2 CHECKARGS...: every seed's workloads, sync, check
run_round() {
  local name=$1 m1=$2 m2=$3; shift 3
  local seed
  for seed in $SEEDS; do
    log "seed $seed: random workload on two mounts + SQLite WAL on one"
    timeout -k 5 300 $CONV sqlite --rows 1500 "$m1/sq$seed" > "$T/sqlite.$seed.out" 2>&1 &
    local sq=$!
    timeout -k 5 300 $CONV workload --seed "$seed" --ops "$OPS" --root "w$seed" "$m1" "$m2" \
      || fail "workload seed $seed failed"
    wait "$sq" || fail "sqlite workload (seed $seed) failed: $(cat "$T/sqlite.$seed.out")"
    cat "$T/sqlite.$seed.out" >&2
  done
  ws_sync "$name"
  local out rc=0
  out=$($CONV check "$m1" "$@" 2>&1) || rc=$?
  ((rc == 0)) || fail "after sync: $out"
  log "$out"
  [[ ! -e $m1/sq${SEEDS%% *} ]] || fail "the SQLite directory is still there"
}

log "S3 (Garage): two mounts, separate cache dirs"
NAME=conv
ws_format "$NAME" --bucket "$(s3_url)"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache1" --upload-delay-ms 20
ws_mount "$NAME" "$MNT2" --cache-dir "$T/cache2" --upload-delay-ms 20
run_round "$NAME" "$MNT" "$MNT2" --s3-prefix "$S3_PREFIX"
for s in $SEEDS; do
  ! s3_exists "$(s3_key "sq$s/app.db-shm")" || fail "a deleted sq$s/app.db-shm is still in the bucket"
done
DESKFS_UMOUNT_TIMEOUT=60 ws_umount "$MNT2"
DESKFS_UMOUNT_TIMEOUT=60 ws_umount "$MNT"

log "embedded default (file:// bucket dir): two mounts"
NAME=convlocal
ws_format "$NAME"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache3" --upload-delay-ms 20
ws_mount "$NAME" "$MNT2" --cache-dir "$T/cache4" --upload-delay-ms 20
run_round "$NAME" "$MNT" "$MNT2" --bucket-dir "$DESKFS_HOME/workspaces/$NAME/bucket"
DESKFS_UMOUNT_TIMEOUT=60 ws_umount "$MNT2"
DESKFS_UMOUNT_TIMEOUT=60 ws_umount "$MNT"

log "PASS"
