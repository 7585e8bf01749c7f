#!/usr/bin/env bash
# scripts/fuzz.sh — builds and runs the cargo-fuzz targets of deskfs (fuzz/).
#
#   bash scripts/fuzz.sh [--seconds N] [TARGET...]
#
# Targets (default: all): bucket_keys (name escaping and bucket-key mapping),
# format_record (the bucket's format record), meta_backup (metadata-backup files and
# keys), agents_manual (the AGENTS.md machine block), path_confine (desk path
# confinement); fuzz/fuzz_targets/*.rs say what each one checks.
#
# Steps: `cargo install cargo-fuzz --locked` when cargo-fuzz is missing -> `cargo fuzz
# build` (release, debug assertions, AddressSanitizer; RUSTC_BOOTSTRAP=1 lets the stable
# toolchain take cargo-fuzz's -Z flags) -> each target for N seconds (default 20) on a copy
# of its seed corpus fuzz/corpus/TARGET (new inputs go to a temp dir: the committed corpus
# is never changed) with -rss_limit_mb=1024 and a 30 s limit per input -> one line per
# target: runs, runs/s, coverage (libFuzzer's cov = edges, ft = features), corpus size,
# result. A crash, a leak, an out-of-memory or a hang is a FAIL: its input is copied to
# fuzz/artifacts/TARGET/ (with libFuzzer's log beside it, .txt) and the command that
# replays it printed, with the panic message or the sanitizer's report.
# Exit status: 0 when every target ran clean, 1 when one failed, 2 on a usage or build error.
#
# Environment:
#   DESKFS_FUZZ_LOGDIR   where libFuzzer logs go (default fuzz/target/fuzz-logs)
#   DESKFS_FUZZ_TARGET_DIR  cargo's target dir for the fuzz build (default fuzz/target;
#                        tests/e2e/68-fuzz.sh keeps one in ~/.cache so that runs from
#                        fresh clones rebuild only the deskfs crates)
#   CARGO_FUZZ_VERSION   version for `cargo install cargo-fuzz` (default 0.13.2)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ=$ROOT/fuzz
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
ALL=()
for f in "$FUZZ"/fuzz_targets/*.rs; do ALL+=("$(basename "$f" .rs)"); done
SECONDS_EACH=20
TARGETS=()
while (($#)); do
  case "$1" in
    --seconds) SECONDS_EACH=${2:-}; shift ;;
    --seconds=*) SECONDS_EACH=${1#--seconds=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) TARGETS+=("$1") ;;
  esac
  shift
done
[[ $SECONDS_EACH =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds takes a positive number of seconds" >&2; exit 2; }
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target $t (targets: ${ALL[*]})" >&2; exit 2; }
done

LOGDIR=${DESKFS_FUZZ_LOGDIR:-$FUZZ/target/fuzz-logs}
TARGET_DIR=${DESKFS_FUZZ_TARGET_DIR:-$FUZZ/target}
mkdir -p "$LOGDIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/deskfs-fuzz.XXXXXX") || exit 2
# Scratch space of the targets that touch files (path_confine builds desks there).
SCRATCH=$(mktemp -d /dev/shm/deskfs-fuzz.XXXXXX 2> /dev/null) || SCRATCH=$WORK/scratch
mkdir -p "$SCRATCH"
export DESKFS_FUZZ_SCRATCH=$SCRATCH
trap 'rm -rf "$WORK" "$SCRATCH"' EXIT

# ------------------------------------------------------------ cargo-fuzz
if ! cargo fuzz --version > /dev/null 2>&1; then
  v=${CARGO_FUZZ_VERSION:-0.13.2}
  echo "fuzz.sh: cargo-fuzz missing: cargo install cargo-fuzz --version $v --locked (log $LOGDIR/cargo-fuzz-install.log)"
  t0=$SECONDS
  if ! cargo install cargo-fuzz --version "$v" --locked > "$LOGDIR/cargo-fuzz-install.log" 2>&1; then
    tail -n 20 "$LOGDIR/cargo-fuzz-install.log"
    echo "fuzz.sh: installing cargo-fuzz failed" >&2
    exit 2
  fi
  echo "fuzz.sh: cargo-fuzz installed in $((SECONDS - t0)) s"
fi

# ------------------------------------------------------------ build
export RUSTC_BOOTSTRAP=1
t0=$SECONDS
for t in "${TARGETS[@]}"; do
  if ! (cd "$FUZZ" && cargo fuzz build --target-dir "$TARGET_DIR" "$t") > "$LOGDIR/build-$t.log" 2>&1; then
    grep -E -A 8 '^error' "$LOGDIR/build-$t.log" | head -n 40
    tail -n 15 "$LOGDIR/build-$t.log"
    echo "fuzz.sh: building $t failed (log $LOGDIR/build-$t.log)" >&2
    exit 2
  fi
done
echo "fuzz.sh: built ${TARGETS[*]} in $((SECONDS - t0)) s; ${SECONDS_EACH} s each"
BIN=$TARGET_DIR/x86_64-unknown-linux-gnu/release

# ------------------------------------------------------------ run
nfail=0
final_stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -n 1; }
failed=0
printf '%-14s %10s %8s %7s %7s %7s  %s\n' target runs runs/s cov ft corpus result
for t in "${TARGETS[@]}"; do
  log=$LOGDIR/$t.log
  mkdir -p "$WORK/corpus/$t" "$WORK/artifacts/$t"
  cp -r "$FUZZ/corpus/$t/." "$WORK/corpus/$t/" 2> /dev/null
  rc=0
  timeout -k 10 $((SECONDS_EACH + 120)) "$BIN/$t" "$WORK/corpus/$t" \
    -max_total_time="$SECONDS_EACH" -rss_limit_mb=1024 -timeout=30 -print_final_stats=1 \
    -artifact_prefix="$WORK/artifacts/$t/" > "$log" 2>&1 < /dev/null || rc=$?
  runs=$(final_stat number_of_executed_units)
  speed=$(final_stat average_exec_per_sec)
  last=$(grep -E '^#[0-9]+' "$log" | grep ' cov: ' | tail -n 1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<< "$last")
  found=$(find "$WORK/artifacts/$t" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'oom-*' -o -name 'timeout-*' \) | head -n 1)
  if ((rc == 0)) && [[ -z $found ]]; then
    result=ok
  else
    failed=1
    nfail=$((nfail + 1))
    result="FAIL (exit $rc)"
    if [[ -n $found ]]; then
      mkdir -p "$FUZZ/artifacts/$t"
      cp "$found" "$FUZZ/artifacts/$t/"
      cp "$log" "$FUZZ/artifacts/$t/$(basename "$found").txt"
      result="FAIL: fuzz/artifacts/$t/$(basename "$found")"
    fi
  fi
  printf '%-14s %10s %8s %7s %7s %7s  %s\n' "$t" "${runs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
  if [[ $result != ok ]]; then
    echo "---- $log:"
    if grep -q 'panicked at' "$log"; then
      grep -m 1 -A 12 'panicked at' "$log" | sed '/^stack backtrace:/,$d' | cut -c1-400
    else
      grep -E -m 8 -A 4 '==[0-9]+==ERROR|^ERROR: libFuzzer|ALARM|out-of-memory' "$log" | head -n 24 | cut -c1-400
    fi
    grep -m 1 '^SUMMARY' "$log"
    if [[ -n $found ]]; then
      echo "---- input ($(wc -c < "$found") bytes, first 512 shown):"
      head -c 512 "$found" | od -An -c | head -n 20
      echo "---- reproduce: $BIN/$t fuzz/artifacts/$t/$(basename "$found")"
      echo "     (or: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $t artifacts/$t/$(basename "$found"))"
    fi
    echo "----"
  fi
done
echo "fuzz.sh: ${#TARGETS[@]} targets, $nfail failed"
exit "$failed"
