#!/usr/bin/env bash
# 81-fsx: randomized file-operation test (tests/tools/fsx.py, after fsx): thousands of random
# ops (pwrite at random offsets incl. past EOF, O_APPEND writes, ftruncate/truncate shrink and
# extend, pread, mmap shared write + msync, mmap read, posix_fallocate, close/reopen,
# fsync/fdatasync, rename among a few names (replacing an open file), create/unlink) on
# files in a deskfs mount (embedded default) and in a local reference dir, compared after
# every op (touched range + size) and in full every 50 ops and at the end. Several seeds:
# the first unmounts and remounts the workspace in the middle and compares everything, the
# third and later run on a mount with a 1 MiB cache cap (evicted blocks come back from the
# bucket). After the final unmount the bucket dir holds exactly the reference files, and a
# remount shows them.
# Every seed is printed; a failure prints the seed, the op index and the last 20 ops.
#   DESKFS_FSX_SEEDS   space-separated seeds (default: 4 random ones)
#   DESKFS_FSX_OPS     ops per seed (default 6000)
# Replay one seed by hand on any directory pair:
#   python3 tests/tools/fsx.py --seed SEED --ops 6000 --dir MOUNT/sub --ref /tmp/ref
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_deskfs

FSX=$ROOT/tests/tools/fsx.py
[[ -f $FSX ]] || fail "missing $FSX"
OPS=${DESKFS_FSX_OPS:-6000}
read -r -a SEEDS <<< "${DESKFS_FSX_SEEDS:-$((RANDOM * 32768 + RANDOM)) $((RANDOM * 32768 + RANDOM)) $((RANDOM * 32768 + RANDOM)) $((RANDOM * 32768 + RANDOM))}"
((${#SEEDS[@]})) || fail "no seeds"
log "fsx: ${#SEEDS[@]} seeds (${SEEDS[*]}) x $OPS ops; seed ${SEEDS[0]} remounts at op $((OPS / 2))"

NAME=fsx
ws_format "$NAME"
ws_mount "$NAME" "$MNT"

# remount command for fsx (run with every descriptor closed): deskfs umount, deskfs mount
cat > "$T/remount.sh" <<EOF
#!/usr/bin/env bash
set -u
timeout -k 5 300 "$DESKFS" umount "$MNT" < /dev/null || { echo "remount: deskfs umount failed" >&2; exit 1; }
for _ in \$(seq 1 50); do awk -v p="$MNT" '\$5 == p { f = 1 } END { exit !f }' /proc/self/mountinfo || break; sleep 0.2; done
timeout -k 5 60 "$DESKFS" mount "$NAME" "$MNT" > "$T/remount.out" 2>&1 < /dev/null || { echo "remount: deskfs mount failed: \$(head -c 1000 $T/remount.out)" >&2; exit 1; }
for _ in \$(seq 1 25); do timeout 5 stat "$MNT" > /dev/null 2>&1 && exit 0; sleep 0.2; done
echo "remount: $MNT does not answer" >&2
exit 1
EOF
chmod +x "$T/remount.sh"

total=0
t0=$SECONDS
for i in "${!SEEDS[@]}"; do
  seed=${SEEDS[$i]}
  args=(--seed "$seed" --ops "$OPS" --dir "$MNT/run$i" --ref "$T/ref$i")
  ((i == 0)) && args+=(--remount-at $((OPS / 2)) --remount-cmd "$T/remount.sh")
  if ((i == 2)); then
    # from the third seed on: a 1 MiB block cache, so uploaded (clean) blocks get evicted
    # and are read back from the bucket
    ws_umount "$MNT"
    ws_mount "$NAME" "$MNT" --cache-size 1M
    log "remounted with --cache-size 1M"
  fi
  log "fsx run $i: seed $seed"
  rc=0
  (cd "$T" && timeout -k 10 600 python3 "$FSX" "${args[@]}") > "$T/fsx$i.out" 2>&1 || rc=$?
  cat "$T/fsx$i.out" >&2
  if ((rc != 0)); then
    ((rc == 124 || rc == 137)) && fail "fsx seed $seed timed out after 600 s"
    fail "fsx seed $seed failed (exit $rc): $(grep -E '^fsx: (MISMATCH|UNEXPECTED)' "$T/fsx$i.out" | head -c 600)"
  fi
  total=$((total + OPS))
  is_alive "$MNT" || fail "mount dead after fsx seed $seed"
done
log "fsx: ${#SEEDS[@]} seeds, $total ops in total, all matched the reference ($((SECONDS - t0))s)"

# what is on the mount must also survive a final unmount/remount, and the unmount (which
# waits for the uploads) leaves the same files in the bucket dir of the workspace
for i in "${!SEEDS[@]}"; do tree_manifest "$T/ref$i" > "$T/ref$i.manifest"; done
ws_umount "$MNT"
BUCKET_DIR=$DESKFS_HOME/workspaces/$NAME/bucket
for i in "${!SEEDS[@]}"; do
  for f in "$T/ref$i"/*; do
    [[ -e $f ]] || continue
    assert_file_eq "$f" "$BUCKET_DIR/run$i/${f##*/}" "bucket dir object run$i/${f##*/} (seed ${SEEDS[$i]}) after umount"
  done
  for f in "$BUCKET_DIR/run$i"/*; do
    [[ -e $f ]] || continue
    [[ -e $T/ref$i/${f##*/} ]] || fail "bucket dir has run$i/${f##*/}, which fsx (seed ${SEEDS[$i]}) deleted or renamed away"
  done
done
log "bucket dir matches the reference"
ws_mount "$NAME" "$MNT"
for i in "${!SEEDS[@]}"; do assert_same_tree "$T/ref$i.manifest" "$MNT/run$i" "fsx run $i (seed ${SEEDS[$i]}) after the final remount"; done
ws_umount "$MNT"
log "PASS"
