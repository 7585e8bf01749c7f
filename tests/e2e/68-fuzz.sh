#!/usr/bin/env bash
# 68-fuzz: the cargo-fuzz targets (fuzz/, run by scripts/fuzz.sh) — name escaping and
# bucket-key mapping (bucket_keys), the bucket's format record (format_record), metadata
# backup files and keys (meta_backup), the AGENTS.md machine block (agents_manual), desk
# path confinement (path_confine); fuzz/fuzz_targets/*.rs state what each one checks.
# Each target runs DESKFS_FUZZ_SECONDS (default 6 s; 600 s with DESKFS_TEST_LONG=1, i.e.
# `scripts/test.sh --long`) on a copy of its seed corpus fuzz/corpus/TARGET. Fails when a
# target fails: a panic or a broken property, a sanitizer report, a leak, more than 1 GiB
# of memory, one input running over 30 s; the input is kept in fuzz/artifacts/TARGET/
# and shown. cargo-fuzz is installed when missing (about 1.5 min on 2 cores); the build
# (AddressSanitizer, RUSTC_BOOTSTRAP=1 on the stable toolchain) goes to
# ~/.cache/deskfs-fuzz-target (DESKFS_FUZZ_TARGET_DIR), so a run from a fresh clone
# rebuilds only the deskfs crates (about 3 min cold on 2 cores, under 1 min after).
# e2e-cost: 250
# e2e-timeout: 900
# e2e-long-timeout: 4500
source "$(dirname "$0")/../lib.sh"
need_cmd cargo

if [[ ${DESKFS_TEST_LONG:-0} == 1 ]]; then
  secs=${DESKFS_FUZZ_SECONDS:-600}
else
  secs=${DESKFS_FUZZ_SECONDS:-6}
fi
cache=${DESKFS_FUZZ_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/deskfs-fuzz-target}
# Each fresh clone adds its own copies of the deskfs crates and the 5 binaries: start over
# past 6 GB.
if [[ -d $cache ]] && (($(du -sm "$cache" | cut -f1) > 6000)); then
  log "fuzz build cache $cache is over 6 GB: removing it"
  rm -rf "$cache"
fi
export DESKFS_FUZZ_TARGET_DIR=$cache DESKFS_FUZZ_LOGDIR=$T/logs

log "scripts/fuzz.sh --seconds $secs (build in $cache)"
rc=0
bash "$ROOT/scripts/fuzz.sh" --seconds "$secs" > "$T/fuzz.out" 2>&1 < /dev/null || rc=$?
cat "$T/fuzz.out" >&2
# The summary above says it all; lib.sh would print the end of every *.log at a failure.
find "$T/logs" -name '*.log' -exec sh -c 'mv "$1" "$1.txt"' _ {} \;
case $rc in
  0) ;;
  1) fail "$(sed -n 's/^fuzz.sh: .* targets, \([0-9]*\) failed$/\1/p' "$T/fuzz.out") fuzz target(s) failed (above); their inputs are in fuzz/artifacts/" ;;
  *) fail "scripts/fuzz.sh could not install, build or run the targets (status $rc)" ;;
esac
for f in "$ROOT"/fuzz/fuzz_targets/*.rs; do
  t=$(basename "$f" .rs)
  grep -qE "^$t +[0-9]+ .* ok\$" "$T/fuzz.out" || fail "no clean run of $t reported"
done
log "every fuzz target ran $secs s without a failure"
