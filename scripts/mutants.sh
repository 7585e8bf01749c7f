#!/usr/bin/env bash
# scripts/mutants.sh — mutation testing of deskfs's rules with cargo-mutants: every
# mutant (a function body replaced, an operator flipped, a condition negated) of the
# named area is built and the area's tests run against it; a mutant the tests do not
# notice ("missed") is a rule no test holds.
#
#   bash scripts/mutants.sh [--list] [--shard K/N] [--iterate] AREA...
#
# AREA: locks (crates/vfs/src/locks.rs, 158 mutants), namespace (namespace.rs, 370), data
# (data.rs, 445), desk (crates/desk/src, 823 of 1,147: see `excl` below). Tests: for the
# VFS areas the package's library tests (`cargo test -p deskfs-vfs --lib`, built with
# `--lib` too: the plain library and its doc tests are not built; the VFS tests run on
# SQLite), for desk all of the package's tests (its library's and
# crates/desk/tests), in the dev profile without debug info (optimized at level 1 and
# incrementally built: ~10 s per mutant) and 6 test threads (RUST_TEST_THREADS; the VFS
# tests mostly wait: 29 s on 2 threads, 11 s on 6), ~25 s per VFS mutant on 2 CPUs.
# Results in target/mutants/AREA/mutants.out (caught.txt, missed.txt, timeout.txt,
# unviable.txt, outcomes.json) and a summary line per area. --list prints the mutants
# only; --shard K/N runs the K-th of N slices (for spreading a long area over runs);
# --iterate skips the mutants an earlier run in the same output directory caught.
# Hours for the big areas (each mutant is an incremental build and a test run): not in
# CI. cargo-mutants is installed when missing (cargo install --locked).
# Exit: 0 when every area ran (missed mutants are reported, not failures), 1 when
# cargo-mutants failed to run, 2 on bad arguments.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MUTANTS_VERSION=${MUTANTS_VERSION:-27.1.0}

usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
list=0 shard=() iterate=() areas=()
while (($#)); do
  case $1 in
    --list) list=1 ;;
    --shard)
      [[ ${2:-} =~ ^[0-9]+/[0-9]+$ ]] || { echo "mutants.sh: --shard needs K/N, e.g. --shard 0/4" >&2; exit 2; }
      shard=(--shard "$2")
      shift
      ;;
    --iterate) iterate=(--iterate) ;;
    -h | --help) usage; exit 0 ;;
    locks | namespace | data | desk) areas+=("$1") ;;
    *) echo "mutants.sh: unknown area or option '$1' (areas: locks namespace data desk; see --help)" >&2; exit 2 ;;
  esac
  shift
done
((${#areas[@]})) || { echo "mutants.sh: name at least one area: locks namespace data desk (see --help)" >&2; exit 2; }

if ! cargo mutants --version > /dev/null 2>&1; then
  echo "mutants.sh: installing cargo-mutants $MUTANTS_VERSION (cargo install --locked)" >&2
  cargo install cargo-mutants --version "$MUTANTS_VERSION" --locked >&2
fi

cd "$ROOT"
rc=0
for area in "${areas[@]}"; do
  case $area in
    locks) pkg=deskfs-vfs files=(crates/vfs/src/locks.rs) targs=(--cargo-arg=--lib) excl=() ;;
    namespace) pkg=deskfs-vfs files=(crates/vfs/src/namespace.rs) targs=(--cargo-arg=--lib) excl=() ;;
    data) pkg=deskfs-vfs files=(crates/vfs/src/data.rs) targs=(--cargo-arg=--lib) excl=() ;;
    # utc_parts's body replaced by each constant 6-tuple of 0, 1 and -1 (324 mutants): a
    # constant gives the three dates of fsutil's utc_iso test the same text, so every one
    # of them is caught by that test; they are left out, the operator mutants stay.
    desk) pkg=deskfs-desk files=('crates/desk/src/**') targs=() \
      excl=(--exclude-re 'replace utc_parts -> \(i64, u32, u32, i64, i64, i64\) with \(') ;;
  esac
  fargs=()
  for f in "${files[@]}"; do fargs+=(-f "$f"); done
  if ((list)); then
    cargo mutants -p "$pkg" "${fargs[@]}" "${excl[@]}" --list
    continue
  fi
  out=target/mutants/$area
  mkdir -p "$out"
  echo "mutants.sh: $area: $(cargo mutants -p "$pkg" "${fargs[@]}" "${excl[@]}" --list | wc -l) mutants of ${files[*]} (package $pkg) -> $out" >&2
  CARGO_PROFILE_DEV_DEBUG=0 RUST_TEST_THREADS=${RUST_TEST_THREADS:-6} \
    cargo mutants -p "$pkg" "${fargs[@]}" "${excl[@]}" "${shard[@]}" "${iterate[@]}" --test-package "$pkg" \
    --output "$out" --timeout-multiplier 3 "${targs[@]}" || {
    r=$?
    # 2: missed mutants, 3: timeouts — results, not a failure of the run
    ((r == 2 || r == 3)) || { echo "mutants.sh: $area: cargo mutants failed (exit $r)" >&2; rc=1; }
  }
  m=$out/mutants.out
  n() { [[ -f $m/$1.txt ]] && wc -l < "$m/$1.txt" || echo 0; }
  echo "mutants.sh: $area: $(n caught) caught, $(n missed) missed, $(n timeout) timeouts, $(n unviable) unviable (missed: $m/missed.txt)"
done
exit $rc
