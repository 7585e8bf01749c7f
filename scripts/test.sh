#!/usr/bin/env bash
# scripts/test.sh — THE test command of deskfs (`.ci/run` calls it).
#
#   bash scripts/test.sh [OPTIONS] [FILTER...]
#
# Steps: install missing Debian packages (apt, only when missing) -> install Garage and
# pjdfstest (cargo install, each only when not on PATH) -> cargo build --release -p deskfs
# -> start a private Garage S3 server -> start a private PostgreSQL server
# (scripts/pg-server.sh; its env, DESKFS_TEST_PG_URL etc., is exported to cargo test and the
# e2e tests) -> cargo test --workspace --release -> the VFS library tests again on
# PostgreSQL (the same test binary, DESKFS_TEST_META=postgres) -> every tests/e2e/*.sh
# (exit 0 pass, 77 skip, anything else fail) -> summary, ending with the line
#   N passed, N failed, N skipped
# The exit status is non-zero when anything failed. "cargo build" and "cargo test" count as
# one result each, next to one per e2e script; a server that does not start is one FAIL
# result (s3-server, pg-server).
#
# Options:
#   --no-deps        do not check/install apt packages, Garage or pjdfstest
#                    (pg-server.sh still installs postgresql if its server is missing)
#   --no-build       do not run cargo build (use the existing target/release/deskfs)
#   --no-cargo-test  skip cargo test
#   --e2e-only       = --no-deps --no-build --no-cargo-test
#   --keep           keep every test's temp dir (DESKFS_TEST_KEEP=1)
#   --long           the slow runs CI leaves out (hours): the power-loss test with 3,050
#                    cut points (DESKFS_POWER_ITERS=50, DESKFS_POWER_IMAGES=60); a test's
#                    "# e2e-long-timeout: SECONDS" line replaces its limit; the fuzz
#                    targets 600 s each (tests/e2e/68-fuzz.sh); the soak of every fault
#                    at once 1,800 s (tests/e2e/82s-soak.sh)
#   --jobs N         run the e2e tests in N lanes at once (default 2 on a machine with 2
#                    or more CPUs, else 1; DESKFS_E2E_JOBS): each lane takes the next test
#                    from one queue, longest first (a test's "# e2e-cost: SECONDS" line);
#                    a test with an "# e2e-alone: REASON" line runs before the lanes, alone
#   FILTER...        run only the e2e tests whose file name contains one of these strings
# Environment:
#   DESKFS_TEST_S3_PORT  Garage S3 port (default: 3900 if 3900/3901/3903 are free, else the
#                        first free of 3910, 3920, ...)
#   DESKFS_TEST_PG_PORT  PostgreSQL port (default: 5432 if free, else the first free of
#                        5442, 5452, ...)
#   GARAGE_VERSION       version for `cargo install garage` (default 2.5.0)
#   PJDFSTEST_VERSION    version for `cargo install pjdfstest` (default 0.2.2)
#   DESKFS_BIN           binary the e2e tests run (default target/release/deskfs)
#   DESKFS_TEST_LOGDIR   where logs go (default target/test-logs; emptied at the start)
#   DESKFS_E2E_TIMEOUT   default per-test time limit in seconds (default 600); a test can
#                        raise its own with a "# e2e-timeout: SECONDS" line
#
# Everything the run starts lives under one temp dir (Garage and PostgreSQL state,
# DESKFS_HOMEs, mountpoints); the EXIT trap unmounts what the tests mounted there, kills
# only PIDs the tests recorded, removes the network namespaces/links the tests recorded
# (tests/hosts.sh), and stops only the Garage and PostgreSQL servers this run started (by
# their data dir / recorded PID).
# Logs: target/test-logs/ (one file per step and per e2e test).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

DO_DEPS=1 DO_BUILD=1 DO_CARGO_TEST=1
FILTERS=()
LONG=0
E2E_JOBS=${DESKFS_E2E_JOBS-}
JOBS_GIVEN=$([[ -n ${DESKFS_E2E_JOBS+set} ]] && echo 1 || echo 0)
while (($#)); do
  case "$1" in
    --no-deps) DO_DEPS=0 ;;
    --no-build) DO_BUILD=0 ;;
    --no-cargo-test) DO_CARGO_TEST=0 ;;
    --e2e-only) DO_DEPS=0 DO_BUILD=0 DO_CARGO_TEST=0 ;;
    --keep) export DESKFS_TEST_KEEP=1 ;;
    --long) LONG=1 ;;
    --jobs) (($# >= 2)) || { echo "test.sh: --jobs needs a number of e2e lanes, e.g. --jobs 2" >&2; exit 2; }
      E2E_JOBS=$2 JOBS_GIVEN=1; shift ;;
    --jobs=*) E2E_JOBS=${1#--jobs=} JOBS_GIVEN=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "test.sh: unknown option $1" >&2; exit 2 ;;
    *) FILTERS+=("$1") ;;
  esac
  shift
done

if ((!JOBS_GIVEN)); then
  E2E_JOBS=$(($(nproc 2>/dev/null || echo 1) >= 2 ? 2 : 1))
elif ! [[ $E2E_JOBS =~ ^[1-9][0-9]?$ ]]; then
  echo "test.sh: --jobs (or DESKFS_E2E_JOBS) wants a number of e2e lanes from 1 to 99, not '$E2E_JOBS'" >&2
  exit 2
fi
if ((LONG)); then
  export DESKFS_TEST_LONG=1
  export DESKFS_POWER_ITERS=${DESKFS_POWER_ITERS:-50} DESKFS_POWER_IMAGES=${DESKFS_POWER_IMAGES:-60}
fi

MCP_SDK_VERSION=${MCP_SDK_VERSION:-2.3.0}
PROM_CLIENT_VERSION=${PROM_CLIENT_VERSION:-0.21.1}
TEST_VENV=${DESKFS_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/deskfs-test-venv}
export DESKFS_TEST_PY=$TEST_VENV/bin/python   # a python with the mcp SDK (made in step 1)
APT_PACKAGES=(fuse3 libfuse3-dev pkg-config git sqlite3 python3-venv rclone fio bubblewrap make inotify-tools jq
  postgresql socat iproute2 util-linux)
GARAGE_VERSION=${GARAGE_VERSION:-2.5.0}
PJDFSTEST_VERSION=${PJDFSTEST_VERSION:-0.2.2}
S3_SCRIPT=$ROOT/scripts/s3-server.sh
PG_SCRIPT=$ROOT/scripts/pg-server.sh
LOGDIR=${DESKFS_TEST_LOGDIR:-$ROOT/target/test-logs}
T0=$SECONDS

RUN=$(mktemp -d "${TMPDIR:-/tmp}/deskfs-test.XXXXXX") || { echo "test.sh: mktemp failed" >&2; exit 1; }
RUN=$(realpath "$RUN")
chmod 0711 "$RUN"   # the OS user postgres must reach $RUN/pg (nothing is listable)
rm -rf "$LOGDIR"
mkdir -p "$LOGDIR"
for ((l = 1; l <= E2E_JOBS; l++)); do   # each e2e lane's records and temp dirs (step 5)
  mkdir -p "$RUN/lane$l/tmp"
  : > "$RUN/lane$l/mounts"
  : > "$RUN/lane$l/pids"
  : > "$RUN/lane$l/net"
  : > "$RUN/lane$l/current"
done

say() { printf '\n=== %s [%ds]\n' "$*" $((SECONDS - T0)); }
note() { printf 'test.sh: %s\n' "$*"; }

# ------------------------------------------------------------ results
R_NAMES=() R_STATUS=() R_SECS=() R_DETAIL=()
record_quietly() { # NAME STATUS(PASS|FAIL|SKIP) SECONDS DETAIL (for the summary only)
  R_NAMES+=("$1") R_STATUS+=("$2") R_SECS+=("$3") R_DETAIL+=("$4")
}
record() { # NAME STATUS SECONDS DETAIL: recorded and printed
  record_quietly "$@"
  printf '%-4s %s (%ss)%s\n' "$2" "$1" "$3" "${4:+ — $4}"
}

SUMMARY_DONE=0
summary() {
  local i p=0 f=0 s=0
  SUMMARY_DONE=1
  echo
  echo "=== summary (total $((SECONDS - T0))s, logs in ${LOGDIR#"$ROOT"/})"
  for i in "${!R_NAMES[@]}"; do
    printf '  %-4s %-28s %5ss  %s\n' "${R_STATUS[$i]}" "${R_NAMES[$i]}" "${R_SECS[$i]}" "${R_DETAIL[$i]}"
    case "${R_STATUS[$i]}" in PASS) p=$((p + 1)) ;; FAIL) f=$((f + 1)) ;; *) s=$((s + 1)) ;; esac
  done
  if [[ -s $LOGDIR/failure-details ]]; then
    # What failed and why, again at the very end (where a CI tail shows it).
    echo
    echo "=== failure details"
    head -c 6000 "$LOGDIR/failure-details"
  fi
  echo "$p passed, $f failed, $s skipped"
  ((f == 0))
}

# The failed tests of a cargo test log: their names on one line, and (appended to
# $LOGDIR/failure-details) each one's panic message, for the end of the summary.
cargo_failures() { # LOG LABEL
  local names
  names=$(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$1" | tr '\n' ' ')
  {
    echo "--- $2: ${names:-no failed test named (build error or crash?)}"
    awk '/^---- .* stdout ----$/ { n = 12 } n > 0 { print; n-- }' "$1" | cut -c1-300 | head -n 60
  } >> "$LOGDIR/failure-details"
  printf '%s' "${names:-see the log}"
}

# ------------------------------------------------------------ cleanup (EXIT trap)
is_mounted() { awk -v p="$1" '$5 == p { f = 1 } END { exit !f }' /proc/self/mountinfo; }
mounted_under() { awk -v p="$1/" 'index($5, p) == 1 { f = 1 } END { exit !f }' /proc/self/mountinfo; } # DIR

proc_start() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }

cleanup_leftovers() { # DIR: unmount what tests mounted under DIR, kill the PIDs they recorded in DIR/pids, remove what they recorded in DIR/net
  local dir=$1 m pid st dev
  # every mount under our run dir is ours (mountpoints are created inside it)
  while IFS= read -r m; do
    [[ -n $m ]] || continue
    note "unmounting leftover mount $m"
    timeout -k 2 20 "${DESKFS_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/deskfs}" umount --no-wait "$m" >/dev/null 2>&1 < /dev/null
    is_mounted "$m" && timeout -k 2 15 fusermount3 -u "$m" >/dev/null 2>&1
    is_mounted "$m" && timeout -k 2 15 umount "$m" >/dev/null 2>&1
    if is_mounted "$m"; then
      dev=$(awk -v p="$m" '$5 == p { split($3, a, ":"); d = a[2] } END { print d }' /proc/self/mountinfo)
      [[ -n $dev && -w /sys/fs/fuse/connections/$dev/abort ]] && echo 1 > "/sys/fs/fuse/connections/$dev/abort"
      timeout -k 2 15 fusermount3 -u "$m" >/dev/null 2>&1
    fi
    if is_mounted "$m"; then
      note "lazy unmount of $m (last resort)"
      fusermount3 -uz "$m" >/dev/null 2>&1 || umount -l "$m" >/dev/null 2>&1
    fi
  done < <(awk -v p="$dir/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r | uniq)
  while read -r pid st; do
    [[ -n $pid ]] || continue
    [[ "$(proc_start "$pid")" == "$st" ]] || continue
    note "killing leftover test process $pid ($(tr '\0' ' ' < "/proc/$pid/cmdline" | cut -c1-80))"
    kill -TERM "$pid" 2>/dev/null
    sleep 1
    [[ "$(proc_start "$pid")" == "$st" ]] && kill -KILL "$pid" 2>/dev/null
  done < <(cat "$dir/pids" 2>/dev/null)
  [[ -e $dir/pids ]] && : > "$dir/pids"
  # network namespaces and links recorded by tests/hosts.sh (a test killed before its own
  # EXIT trap ran); newest first: veths before their namespace, the bridge last
  local kind name npids
  while read -r kind name; do
    case $kind in
      netns)
        [[ -e /run/netns/$name ]] || continue
        npids=$(ip netns pids "$name" 2>/dev/null)
        if [[ -n $npids ]]; then
          note "killing processes left in network namespace $name: $(echo $npids)"
          kill -KILL $npids 2>/dev/null
          sleep 0.5
        fi
        note "removing leftover network namespace $name"
        ip netns del "$name" 2>/dev/null ;;
      link)
        ip link show "$name" >/dev/null 2>&1 || continue
        note "removing leftover network link $name"
        ip link del "$name" 2>/dev/null ;;
    esac
  done < <(tac "$dir/net" 2>/dev/null)
  [[ -e $dir/net ]] && : > "$dir/net"
}

PG_STARTED=0
pgctl() { PG_STATE=$RUN/pg PG_PORT=${PG_PORT_SEL:-} PG_LISTEN='' bash "$PG_SCRIPT" "$@"; }

S3_STARTED=0
s3ctl() { BENCH_STATE=$RUN/s3state BENCH_S3_PORT=$S3_PORT BENCH_S3_BUCKET=deskfs-e2e bash "$S3_SCRIPT" "$@"; }

LANE_PIDS=()
stop_running_tests() { # the e2e lanes, then the test each one runs now (timeout leads its own process group)
  local pid pids=() i
  ((${#LANE_PIDS[@]})) && kill -TERM "${LANE_PIDS[@]}" 2>/dev/null
  for ((l = 1; l <= E2E_JOBS; l++)); do
    pid=$(cat "$RUN/lane$l/current" 2>/dev/null)
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || continue
    note "stopping the running test of lane $l (pid $pid)"
    kill -TERM "$pid" 2>/dev/null
    pids+=("$pid")
  done
  ((${#pids[@]})) || return 0
  for i in $(seq 1 40); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.5; done
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  wait 2>/dev/null
}

# bg_wait LOG CMD...: runs CMD in the background, its output to LOG, and waits for it, so
# that an INT/TERM/HUP trap runs at once (bash runs a trap only after a foreground command
# ends: a SIGTERM during `cargo test` waited for the whole run); on_exit stops it by FG_PID.
# CMD is a `timeout` (its own process group, which it signals whole) or a plain command.
# The redirection is CMD's, not the call's: a trap running inside this function would
# write the summary into LOG.
FG_PID=
bg_wait() {
  local log=$1 rc=0
  shift
  "$@" > "$log" 2>&1 &
  FG_PID=$!
  wait "$FG_PID" || rc=$?
  FG_PID=
  return "$rc"
}

on_exit() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if [[ -n $FG_PID ]]; then
    kill -TERM "$FG_PID" 2>/dev/null
    wait "$FG_PID" 2>/dev/null
  fi
  stop_running_tests
  for ((l = 1; l <= E2E_JOBS; l++)); do cleanup_leftovers "$RUN/lane$l"; done
  if ((!SUMMARY_DONE)); then
    record "(run interrupted)" FAIL $((SECONDS - T0)) "test.sh exited early (status $rc)"
    summary
  fi
  if ((S3_STARTED)); then
    s3ctl stop > "$LOGDIR/s3-stop.log" 2>&1 || note "stopping Garage failed, see $LOGDIR/s3-stop.log"
    cp "$RUN/s3state/s3/server.log" "$LOGDIR/garage-server.log" 2>/dev/null
  fi
  if ((PG_STARTED)); then
    pgctl stop > "$LOGDIR/pg-stop.log" 2>&1 || note "stopping PostgreSQL failed, see $LOGDIR/pg-stop.log"
    cp "$RUN/pg/server.log" "$LOGDIR/pg-server.log" 2>/dev/null
  fi
  if [[ ${DESKFS_TEST_KEEP:-0} == 1 ]]; then
    note "kept $RUN"
  elif mounted_under "$RUN"; then
    note "something is still mounted under $RUN: not deleting it"
  else
    rm -rf --one-file-system "$RUN"
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'echo "test.sh: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ------------------------------------------------------------ 1. dependencies
as_root() { if ((EUID == 0)); then "$@"; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi; }

# cargo_tool NAME VERSION HOW_LONG: `cargo install NAME --version VERSION --locked` unless
# NAME is already on PATH (the install is cached in ~/.cargo/bin).
cargo_tool() {
  local name=$1 version=$2 how_long=$3 t
  if command -v "$name" >/dev/null; then
    note "$name: $(command -v "$name") ($("$name" --version 2>/dev/null | head -n 1))"
    return
  fi
  note "$name not on PATH: cargo install $name --version $version --locked ($how_long; log target/test-logs/$name-install.log)"
  t=$SECONDS
  if cargo install "$name" --version "$version" --locked > "$LOGDIR/$name-install.log" 2>&1; then
    record "$name-install" PASS $((SECONDS - t)) "$name $version into ${CARGO_HOME:-$HOME/.cargo}/bin"
  else
    tail -n 30 "$LOGDIR/$name-install.log"
    record "$name-install" FAIL $((SECONDS - t)) "cargo install $name failed, see target/test-logs/$name-install.log"
  fi
}

if ((DO_DEPS)); then
  say "dependencies"
  if command -v dpkg-query >/dev/null; then
    missing=()
    for p in "${APT_PACKAGES[@]}"; do
      [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" == installed ]] || missing+=("$p")
    done
    if ((${#missing[@]})); then
      note "installing missing packages: ${missing[*]}"
      t=$SECONDS
      if as_root env DEBIAN_FRONTEND=noninteractive apt-get update > "$LOGDIR/apt.log" 2>&1 &&
         as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >> "$LOGDIR/apt.log" 2>&1; then
        record "apt-install" PASS $((SECONDS - t)) "${missing[*]}"
      else
        tail -n 20 "$LOGDIR/apt.log"
        record "apt-install" FAIL $((SECONDS - t)) "apt-get install ${missing[*]} failed (need root or sudo), see target/test-logs/apt.log"
      fi
    else
      note "all apt packages present"
    fi
  else
    note "no dpkg-query: not a Debian system, not installing packages (${APT_PACKAGES[*]} expected)"
  fi
  cargo_tool garage "$GARAGE_VERSION" "about 13 min on 2 cores"
  cargo_tool pjdfstest "$PJDFSTEST_VERSION" "a few minutes"
  # The official MCP Python SDK, for the MCP conformance checks (tests/tools/mcp_check.py),
  # and the Prometheus client's text parser, for the metrics endpoint (e2e/17-metrics.sh).
  if ! "$TEST_VENV/bin/python" -c "import mcp, prometheus_client" > /dev/null 2>&1; then
    note "installing the MCP Python SDK (mcp==$MCP_SDK_VERSION) and prometheus-client==$PROM_CLIENT_VERSION into $TEST_VENV"
    t=$SECONDS
    if python3 -m venv "$TEST_VENV" > "$LOGDIR/pip-mcp.log" 2>&1 &&
       "$TEST_VENV/bin/pip" install -q "mcp==$MCP_SDK_VERSION" "prometheus-client==$PROM_CLIENT_VERSION" >> "$LOGDIR/pip-mcp.log" 2>&1; then
      record "pip-install mcp" PASS $((SECONDS - t)) ""
    else
      tail -n 20 "$LOGDIR/pip-mcp.log"
      record "pip-install mcp" FAIL $((SECONDS - t)) "pip install mcp==$MCP_SDK_VERSION failed, see target/test-logs/pip-mcp.log"
    fi
  fi
  if [[ ! -e /dev/fuse ]]; then
    as_root modprobe fuse > /dev/null 2>&1
    [[ -e /dev/fuse ]] || note "WARNING: /dev/fuse is missing: mount tests will fail"
  fi
fi

# ------------------------------------------------------------ 2. build
BUILD_OK=1
if ((DO_BUILD)); then
  say "cargo build --release -p deskfs -p deskfs-lossfs"
  t=$SECONDS
  if bg_wait "$LOGDIR/cargo-build.log" cargo build --release -p deskfs -p deskfs-lossfs; then
    grep -E '^warning' "$LOGDIR/cargo-build.log" | sort | uniq -c | sort -rn | head -n 10
    record "cargo build" PASS $((SECONDS - t)) ""
  else
    grep -E -A 6 '^error' "$LOGDIR/cargo-build.log" | head -n 60
    tail -n 40 "$LOGDIR/cargo-build.log"
    record "cargo build" FAIL $((SECONDS - t)) "see target/test-logs/cargo-build.log"
    BUILD_OK=0
  fi
fi
export DESKFS_BIN=${DESKFS_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/deskfs}
if [[ ! -x $DESKFS_BIN ]]; then
  BUILD_OK=0
  note "$DESKFS_BIN does not exist"
fi

# ------------------------------------------------------------ 3. S3 server (Garage)
port_busy() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
  local p
  for p in 3900 3910 3920 3930 3940 3950 3960 3970 3980 3990 4910 4920 4930; do
    port_busy "$p" || port_busy $((p + 1)) || port_busy $((p + 3)) || { echo "$p"; return 0; }
  done
  return 1
}
say "S3 server"
S3_PORT=${DESKFS_TEST_S3_PORT:-$(pick_port)}
if [[ -z $S3_PORT ]]; then
  record "s3-server" FAIL 0 "no free port for Garage (tried 3900..3990)"
elif ! command -v garage >/dev/null; then
  record "s3-server" FAIL 0 "garage is not installed"
else
  t=$SECONDS
  S3_STARTED=1   # from here on the trap stops it (by the PID the script records)
  if s3ctl start > "$RUN/s3.env" 2> "$LOGDIR/s3-start.log"; then
    # shellcheck disable=SC1091
    source "$RUN/s3.env"
    export BENCH_STATE=$RUN/s3state BENCH_S3_PORT=$S3_PORT
    export DESKFS_TEST_S3_OWNED=1 DESKFS_TEST_S3_CTL=$S3_SCRIPT
    note "Garage on $BENCH_S3_ENDPOINT (pid $(cat "$RUN/s3state/s3/server.pid"), bucket $BENCH_S3_BUCKET, state $BENCH_STATE)"
  else
    cat "$LOGDIR/s3-start.log"
    tail -n 20 "$RUN/s3state/s3/server.log" 2>/dev/null
    record "s3-server" FAIL $((SECONDS - t)) "Garage did not start, see target/test-logs/s3-start.log"
  fi
fi

# ------------------------------------------------------------ 3b. PostgreSQL
say "PostgreSQL server"
t=$SECONDS
PG_PORT_SEL=${DESKFS_TEST_PG_PORT:-}
PG_STARTED=1   # from here on the trap stops it (pg_ctl stop on $RUN/pg/data, else the recorded PID)
if pgctl start > "$RUN/pg.env" 2> "$LOGDIR/pg-start.log"; then
  # shellcheck disable=SC1091
  source "$RUN/pg.env"   # export PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE DESKFS_TEST_PG_URL DESKFS_TEST_PG_ADMIN PG_STATE
  PG_PORT_SEL=$PGPORT    # a restart keeps the port
  export DESKFS_TEST_PG_OWNED=1 DESKFS_TEST_PG_CTL=$PG_SCRIPT
  note "PostgreSQL on 127.0.0.1:$PGPORT (pid $(cut -d' ' -f1 "$RUN/pg/server.pid"), database $PGDATABASE, state $PG_STATE)"
else
  cat "$LOGDIR/pg-start.log"
  tail -n 20 "$RUN/pg/server.log" 2>/dev/null
  record "pg-server" FAIL $((SECONDS - t)) "PostgreSQL did not start, see target/test-logs/pg-start.log"
fi

# ------------------------------------------------------------ 4. cargo test
if ((DO_CARGO_TEST)); then
  say "cargo test --workspace --release"
  t=$SECONDS
  if ((BUILD_OK == 0 && DO_BUILD == 1)); then
    record "cargo test" SKIP 0 "not run: cargo build failed"
  elif bg_wait "$LOGDIR/cargo-test.log" env DESKFS_TEST_STRICT=$([[ -n ${DESKFS_TEST_PG_URL:-} ]] && echo 1 || echo 0) \
       timeout -k 30 1800 cargo test --workspace --release --no-fail-fast; then
    grep -E '^test result:' "$LOGDIR/cargo-test.log" | awk '{p += $4; f += $6; i += $8} END {printf "unit/integration tests: %d passed, %d failed, %d ignored\n", p, f, i}'
    record "cargo test" PASS $((SECONDS - t)) "$(grep -E '^test result:' "$LOGDIR/cargo-test.log" | awk '{p += $4; i += $8} END {printf "%d tests, %d ignored", p, i}')"
  else
    grep -E '^(test .* FAILED|failures:|---- |error(\[|:))' "$LOGDIR/cargo-test.log" | head -n 60
    tail -n 20 "$LOGDIR/cargo-test.log"
    record "cargo test" FAIL $((SECONDS - t)) "failed: $(cargo_failures "$LOGDIR/cargo-test.log" "cargo test") (target/test-logs/cargo-test.log)"
  fi
  # The VFS tests again, every one of them on the PostgreSQL engine (fresh schema each):
  # the library test binary the workspace run built, run directly (`cargo test -p
  # deskfs-vfs` would unify features over that one package and rebuild ~30 crates).
  vfs_test_binary() {
    cargo test --workspace --release --no-run --message-format=json 2>> "$LOGDIR/cargo-test-vfs-postgres.log" |
      jq -r 'select(.reason == "compiler-artifact" and .target.name == "deskfs_vfs" and .profile.test == true and (.target.kind | index("lib"))) | .executable' |
      awk 'NF && !f { print; f = 1 } END { exit !f }'
  }
  t=$SECONDS
  if ((BUILD_OK == 0 && DO_BUILD == 1)); then
    record "cargo test vfs@postgres" SKIP 0 "not run: cargo build failed"
  elif [[ -z ${DESKFS_TEST_PG_URL:-} ]]; then
    record "cargo test vfs@postgres" FAIL 0 "no PostgreSQL server (pg-server failed)"
  elif ! vfs_bin=$(vfs_test_binary); then
    record "cargo test vfs@postgres" FAIL $((SECONDS - t)) "no deskfs-vfs test binary (cargo test --no-run), see target/test-logs/cargo-test-vfs-postgres.log"
  elif bg_wait "$LOGDIR/cargo-test-vfs-postgres.log" env -C crates/vfs DESKFS_TEST_META=postgres timeout -k 30 1800 "$vfs_bin"; then
    record "cargo test vfs@postgres" PASS $((SECONDS - t)) "$(grep -E '^test result:' "$LOGDIR/cargo-test-vfs-postgres.log" | awk '{p += $4; i += $8} END {printf "%d tests, %d ignored", p, i}')"
  else
    grep -E '^(test .* FAILED|failures:|---- )' "$LOGDIR/cargo-test-vfs-postgres.log" | head -n 40
    record "cargo test vfs@postgres" FAIL $((SECONDS - t)) "failed: $(cargo_failures "$LOGDIR/cargo-test-vfs-postgres.log" "cargo test vfs@postgres") (target/test-logs/cargo-test-vfs-postgres.log)"
  fi
fi

# ------------------------------------------------------------ 5. e2e tests
# Lanes: E2E_JOBS workers take the tests from one queue, longest first (a test's
# "# e2e-cost: SECONDS" line, 20 when absent), so the long ones start early and the short
# ones fill in. A test with an "# e2e-alone: REASON" line runs before the lanes start, with
# nothing beside it (55-s3-outage stops the Garage every S3 test uses). Each lane has its
# own run dir ($RUN/laneN: the mounts, PIDs and network links its tests record, and their
# temp dirs), so cleaning up after a test of one lane never touches the other's.
say "e2e tests (tests/e2e), $E2E_JOBS lane(s)"
export DESKFS_TEST_STRICT=1
note "deskfs under test: $DESKFS_BIN"

selected() {
  local n=$1 f
  ((${#FILTERS[@]} == 0)) && return 0
  for f in "${FILTERS[@]}"; do [[ $n == *"$f"* ]] && return 0; done
  return 1
}

header() { sed -n "s/^# $2: *\([0-9A-Za-z].*\)/\1/p" "$1" | head -n 1; } # FILE KEY

# run_e2e PATH LANE_DIR: runs one test, writes "STATUS SECS DETAIL" to $RUN/results/NAME
# (and the last lines of a failing test's log to $RUN/results/NAME.fail).
run_e2e() {
  local t_path=$1 lane=$2 name limit long_limit log t pid trc tailpid= secs reason status detail
  name=$(basename "$t_path" .sh)
  (
    flock 9
    if ((S3_STARTED)) && ! s3ctl status > /dev/null 2>&1; then
      note "Garage is not running before $name: restarting it"
      s3ctl start > /dev/null 2>> "$LOGDIR/s3-start.log" || note "Garage restart failed"
    fi
    if ((PG_STARTED)) && [[ -s $RUN/pg.env ]] && ! pgctl status > /dev/null 2>&1; then
      note "PostgreSQL is not running before $name: restarting it"
      pgctl start > /dev/null 2>> "$LOGDIR/pg-start.log" || note "PostgreSQL restart failed"
    fi
  ) 9> "$RUN/servers.lock"
  limit=$(header "$t_path" e2e-timeout)
  if ((LONG)); then
    long_limit=$(header "$t_path" e2e-long-timeout)
    limit=${long_limit:-$limit}
  fi
  limit=${limit:-${DESKFS_E2E_TIMEOUT:-600}}
  log=$LOGDIR/$name.log
  t=$SECONDS
  # Output goes to a file, never a pipe (a daemon keeping an inherited fd would hang a
  # pipe). With one lane, tail follows the file until the test exits (the file exists
  # before tail starts, else tail may look before the redirection made it and show
  # nothing); with more, a test's lines would interleave with the other lane's: each
  # test prints one line when it ends, and a failing one its last lines.
  : > "$log"
  if ((E2E_JOBS == 1)); then
    echo "--- $name (limit ${limit}s)"
  else
    echo "--- $name started in lane ${lane##*lane} (limit ${limit}s) [$((SECONDS - T0))s]"
  fi
  DESKFS_TEST_RUN_DIR=$lane DESKFS_TEST_TMPDIR=$lane/tmp \
    timeout -k 30 "$limit" bash "$t_path" > "$log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" > "$lane/current"   # for stop_running_tests
  if ((E2E_JOBS == 1)); then
    tail -n +1 -f --pid="$pid" "$log" 2>/dev/null | sed -u 's/^/    /' &
    tailpid=$!
  fi
  wait "$pid"   # (wait, unlike a foreground pipeline, lets the INT/TERM traps run at once)
  trc=$?
  [[ -n $tailpid ]] && wait "$tailpid"
  : > "$lane/current"
  secs=$((SECONDS - t))
  reason=$(grep -E '^(FAIL|SKIP): ' "$log" | tail -n 1 | sed -E 's/^(FAIL|SKIP): [^:]*: //')
  case $trc in
    0) status=PASS detail="" ;;
    77) status=SKIP detail="${reason:-skipped}" ;;
    124) status=FAIL detail="timed out after ${limit}s${reason:+; $reason}" ;;
    # timeout(1) exits 137 when its SIGKILL (after -k 30) ended the test; a test killed
    # by anything else before its limit (the OOM killer, a stray kill) is said as such.
    137) status=FAIL
      if ((secs >= limit)); then
        detail="timed out after ${limit}s${reason:+; $reason}"
      else
        detail="killed by SIGKILL after ${secs}s (out of memory? see dmesg)${reason:+; $reason}"
      fi ;;
    129|1[3-9][0-9]) status=FAIL detail="killed by signal $((trc - 128)) after ${secs}s${reason:+; $reason}" ;;
    *) status=FAIL detail="${reason:-exit status $trc}" ;;
  esac
  printf '%s %s %s\n' "$status" "$secs" "$detail" > "$RUN/results/$name"
  if [[ $status == FAIL ]]; then
    { echo "--- $name: last lines of its log"; tail -n 12 "$log" | cut -c1-300; } > "$RUN/results/$name.fail"
    ((E2E_JOBS == 1)) || tail -n 30 "$log" | cut -c1-300 | sed 's/^/    /'
  fi
  printf '%-4s %s (%ss)%s\n' "$status" "$name" "$secs" "${detail:+ — $detail}"
  if mounted_under "$lane" || [[ -s $lane/pids || -s $lane/net ]]; then
    cleanup_leftovers "$lane"
  fi
  : > "$lane/mounts"
}

# next_test: prints the next queued test (and takes it off the queue); fails when none is left
next_test() {
  (
    flock 9
    local line
    line=$(head -n 1 "$RUN/e2e-queue" 2>/dev/null)
    [[ -n $line ]] || exit 1
    sed -i 1d "$RUN/e2e-queue"
    echo "$line"
  ) 9> "$RUN/e2e-queue.lock"
}

e2e_lane() { # LANE_DIR: runs queued tests until the queue is empty
  local t_path
  while t_path=$(next_test); do run_e2e "$t_path" "$1"; done
}

E2E_ORDER=() ALONE=() QUEUED=()
mkdir -p "$RUN/results"
for t_path in "$ROOT"/tests/e2e/[0-9]*.sh; do
  [[ -e $t_path ]] || continue
  name=$(basename "$t_path" .sh)
  selected "$name" || continue
  E2E_ORDER+=("$name")
  if ((BUILD_OK == 0)); then
    printf 'SKIP 0 not run: no deskfs binary (cargo build failed)\n' > "$RUN/results/$name"
  elif [[ -n $(header "$t_path" e2e-alone) ]]; then
    ALONE+=("$t_path")
  else
    cost=$(header "$t_path" e2e-cost)
    cost=${cost%%[!0-9]*}
    QUEUED+=("${cost:-20} $t_path")
  fi
done
((${#QUEUED[@]})) && printf '%s\n' "${QUEUED[@]}" | sort -k1,1nr -k2 | awk 'NF == 2 { print $2 }' > "$RUN/e2e-queue"

for t_path in "${ALONE[@]}"; do
  note "$(basename "$t_path" .sh) runs alone: $(header "$t_path" e2e-alone)"
  run_e2e "$t_path" "$RUN/lane1"
done
LANE_PIDS=()
if ((E2E_JOBS == 1)); then
  e2e_lane "$RUN/lane1"
else
  for ((l = 1; l <= E2E_JOBS; l++)); do
    e2e_lane "$RUN/lane$l" &
    LANE_PIDS+=("$!")
  done
  wait "${LANE_PIDS[@]}"
  LANE_PIDS=()
fi

for name in "${E2E_ORDER[@]}"; do
  if [[ -s $RUN/results/$name ]]; then
    read -r status secs detail < "$RUN/results/$name"
    record_quietly "$name" "$status" "$secs" "$detail"
    [[ -s $RUN/results/$name.fail ]] && cat "$RUN/results/$name.fail" >> "$LOGDIR/failure-details"
  else
    record_quietly "$name" FAIL 0 "no result (its lane stopped)"
  fi
done

summary
