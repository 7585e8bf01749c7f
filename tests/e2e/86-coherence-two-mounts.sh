#!/usr/bin/env bash
# 86-coherence-two-mounts: what one mount does is what another mount of the workspace on
# the same host sees, with no missing names and no stale or torn content
# (tests/tools/coherence.py), for two mounts sharing a cache dir (A, B) and for a mount
# with a cache dir of its own (C: content only A's journal holds is uploaded on request):
#   * trunc-rewrite: open(O_TRUNC) with no write on A, a rewrite with data on B: A reads
#     B's bytes (the kernel's cached size of A is dropped); also four at once, 200 rounds
#     each, where the change feed's late invalidations made ~1 round in 10,000 see the old
#     size (a tail of zeros, or nothing) before the fix (vfs kernel_sync)
#   * close-to-open: grow/shrink/append/replace-by-rename/delete on A, read on B and C
#     right after each close: exact bytes or ENOENT after a delete
#   * rename-storm: fresh files renamed over one name on A while readers on A, B and C
#     open, stat and read it: never ENOENT, never torn (ext4 never shows a missing name)
#   * handover: a poller on B waits for results A hands over by rename: never vanishes
#   * git-refs: `git update-ref` on A, `rev-parse` on B at once, every time
#   * sqlite: 4 writers on two mounts, one database in rollback-journal mode: rows exact
# e2e-cost: 80
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd python3
need_cmd git

TOOL=$ROOT/tests/tools/coherence.py
A=$MNT B=$MNT2 C=$T/mnt3
NAME=coh
ws_format "$NAME"
ws_mount "$NAME" "$A"

run() {
  log "coherence.py $*"
  local out rc=0
  out=$(timeout -k 5 300 python3 "$TOOL" "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | sed 's/^/    /' >&2
  ((rc == 0)) || fail "coherence.py $1: $(printf '%s' "$out" | grep -E '^FAIL' | tail -n 1)"
}

# run_together N ARGS...: N coherence.py runs of ARGS at once (each in a directory of its
# own); fails if any does.
run_together() {
  local n=$1 i rc=0 pids=()
  shift
  log "coherence.py $* (x$n at once)"
  for ((i = 0; i < n; i++)); do
    timeout -k 5 300 python3 "$TOOL" "$@" > "$T/together.$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      rc=1
      sed 's/^/    /' "$T/together.$i.out" >&2
    fi
  done
  ((rc == 0)) || fail "coherence.py $1 (x$n at once): $(cat "$T"/together.*.out | grep -E '^FAIL' | tail -n 1)"
}

# One mount alone first (its kernel caches are long): readers and the renamer in one mount.
run rename-storm "$A" "$A" --seconds 3
ws_mount "$NAME" "$B"
ws_mount "$NAME" "$C" --cache-dir "$T/cache-c"
run trunc-rewrite "$A" "$B" --rounds 30
run_together 4 trunc-rewrite "$A" "$B" --rounds 200
run trunc-rewrite "$A" "$C" --rounds 30
run close-to-open "$A" "$B" "$C" --rounds 120 --seed 7
run close-to-open "$C" "$A" --rounds 60 --seed 8
run handover "$A" "$B" --rounds 100
run handover "$A" "$C" --rounds 300
run git-refs "$A" "$B" --rounds 40
run git-refs "$B" "$C" --rounds 20
run sqlite "$A" "$B" --rows 40
run sqlite "$A" "$C" --rows 20
run rename-storm "$A" "$A" --seconds 3
run rename-storm "$A" "$B" --seconds 4
run rename-storm "$A" "$C" --seconds 4

for m in "$A" "$B" "$C"; do is_alive "$m" || fail "mount $m died"; done
ws_umount "$C"
ws_umount "$B"
ws_umount "$A"
log "PASS"
