#!/usr/bin/env bash
# Copied from shared/bench/s3-server.sh (the lead's Garage script) so that a clone without
# shared/ beside it can still run the suite. One change: the "layout already assigned?"
# check reads `garage layout show` into a variable first. Piped into `grep -q`, garage
# aborts on the closed pipe (SIGPIPE -> exit 134) whenever grep matches early, pipefail
# turns the match into "not assigned", and a restart on existing state then fails with
# "ApplyClusterLayout ... Invalid new layout version" (seen in about half the restarts).
# s3-server.sh — a real S3-compatible server on 127.0.0.1 for benchmarks and tests.
#
#   s3-server.sh start    install if missing, start (idempotent), create bucket+key, print env
#   s3-server.sh stop     stop the server started by `start` (by recorded PID only)
#   s3-server.sh status   exit 0 if running, 1 otherwise
#   s3-server.sh env      print the `export ...` lines (same as the tail of `start`)
#   s3-server.sh wipe     stop and delete all server state (data, keys)
#
# Backends (BENCH_S3_BACKEND): garage (default) | s3s-fs | moto.
#   garage : `cargo install garage --locked` (first install ~20 min on 2 cores), single node,
#            replication_factor=1, sqlite metadata, compression off.
#   s3s-fs : `cargo install s3s-fs --features binary --locked`, serves a directory.
#   moto   : `pip install 'moto[server]'` into a venv under the state dir.
# Env knobs: BENCH_STATE (default /tmp/fsbench), BENCH_S3_PORT (default 3900; garage also
# uses PORT+1 for RPC and PORT+3 for admin), BENCH_S3_BUCKET (default bench).
set -euo pipefail

STATE="${BENCH_STATE:-/tmp/fsbench}"
S3DIR="$STATE/s3"
BACKEND="${BENCH_S3_BACKEND:-garage}"
PORT="${BENCH_S3_PORT:-3900}"
BUCKET="${BENCH_S3_BUCKET:-bench}"
REGION="garage"
PIDFILE="$S3DIR/server.pid"
ENVFILE="$S3DIR/env.sh"
LOG="$S3DIR/server.log"
export PATH="$HOME/.cargo/bin:$PATH"

SERVER_NAME=s3-server
# shellcheck source=scripts/server-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-lib.sh"


gen_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

# ---------- credentials (stable across restarts) ----------
ensure_creds() {
  mkdir -p "$S3DIR"
  if [[ ! -f "$S3DIR/creds" ]]; then
    # Garage key ids are GK + 24 hex chars, secrets 64 hex chars; fine for the others too.
    echo "ACCESS=GK$(gen_hex 12)" > "$S3DIR/creds"
    echo "SECRET=$(gen_hex 32)" >> "$S3DIR/creds"
    echo "RPC_SECRET=$(gen_hex 32)" >> "$S3DIR/creds"
    echo "ADMIN_TOKEN=$(gen_hex 16)" >> "$S3DIR/creds"
  fi
  # shellcheck disable=SC1091
  source "$S3DIR/creds"
}

write_env() {
  cat > "$ENVFILE" <<EOF
export BENCH_S3_BACKEND=$BACKEND
export BENCH_S3_ENDPOINT=http://127.0.0.1:$PORT
export BENCH_S3_REGION=$REGION
export BENCH_S3_ACCESS_KEY=$ACCESS
export BENCH_S3_SECRET_KEY=$SECRET
export BENCH_S3_BUCKET=$BUCKET
export AWS_ACCESS_KEY_ID=$ACCESS
export AWS_SECRET_ACCESS_KEY=$SECRET
export AWS_REGION=$REGION
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT
EOF
}

# ---------- garage ----------
garage_install() {
  command -v garage >/dev/null && return 0
  command -v cargo >/dev/null || die "cargo not found; install Rust (rustup) or use BENCH_S3_BACKEND=moto"
  log "installing garage with cargo (this takes ~20 min on 2 cores; log: $S3DIR/install.log)"
  local t0=$SECONDS
  cargo install garage --locked >"$S3DIR/install.log" 2>&1 || die "cargo install garage failed, see $S3DIR/install.log"
  log "garage installed in $((SECONDS - t0))s"
}

garage_cfg() {
  cat > "$S3DIR/garage.toml" <<EOF
metadata_dir = "$S3DIR/garage-meta"
data_dir = "$S3DIR/garage-data"
db_engine = "sqlite"
replication_factor = 1
compression_level = "none"
rpc_bind_addr = "127.0.0.1:$((PORT + 1))"
rpc_public_addr = "127.0.0.1:$((PORT + 1))"
rpc_secret = "$RPC_SECRET"

[s3_api]
s3_region = "$REGION"
api_bind_addr = "127.0.0.1:$PORT"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$((PORT + 3))"
admin_token = "$ADMIN_TOKEN"
EOF
}

g() { garage -c "$S3DIR/garage.toml" "$@"; }

garage_start() {
  garage_install
  garage_cfg
  mkdir -p "$S3DIR/garage-meta" "$S3DIR/garage-data"
  # At a lower CPU priority: the server stands in for a remote object store, whose
  # CPU a real deployment does not share with the filesystem and its workload (on a
  # 2-core machine it otherwise competes with the requests it is not part of).
  setsid nice -n 10 garage -c "$S3DIR/garage.toml" server >>"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  wait_port
  # single-node layout (only once)
  local i node=""
  for i in $(seq 1 50); do
    node="$(g node id -q 2>/dev/null | cut -d@ -f1)" && [[ -n "$node" ]] && break
    sleep 0.2
  done
  [[ -n "$node" ]] || die "garage node id failed, see $LOG"
  local layout
  layout="$(g layout show 2>/dev/null || true)"
  if ! grep -q "${node:0:16}.*dc1" <<< "$layout"; then
    g layout assign -z dc1 -c 10G "$node" >/dev/null
    g layout apply --version 1 >/dev/null
  fi
  # wait until the layout is live
  for i in $(seq 1 50); do g bucket list >/dev/null 2>&1 && break; sleep 0.2; done
  g key info "$ACCESS" >/dev/null 2>&1 || g key import --yes -n bench-key "$ACCESS" "$SECRET" >/dev/null
  g bucket info "$BUCKET" >/dev/null 2>&1 || g bucket create "$BUCKET" >/dev/null
  g bucket allow --read --write --owner "$BUCKET" --key "$ACCESS" >/dev/null
}

# ---------- s3s-fs ----------
s3sfs_start() {
  if ! command -v s3s-fs >/dev/null; then
    log "installing s3s-fs with cargo (log: $S3DIR/install.log)"
    cargo install s3s-fs --features binary --locked >"$S3DIR/install.log" 2>&1 || die "cargo install s3s-fs failed"
  fi
  mkdir -p "$S3DIR/s3s-root/$BUCKET"
  setsid s3s-fs --host 127.0.0.1 --port "$PORT" --access-key "$ACCESS" --secret-key "$SECRET" \
    "$S3DIR/s3s-root" >>"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  wait_port
}

# ---------- moto ----------
moto_start() {
  local venv="$S3DIR/moto-venv"
  if [[ ! -x "$venv/bin/moto_server" ]]; then
    log "installing moto[server] into $venv"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q 'moto[server]' >"$S3DIR/install.log" 2>&1 \
      || die "pip install moto[server] failed"
  fi
  setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$PORT" >>"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  wait_port
  # moto accepts any credentials; create the bucket with a signed-less PUT
  python3 - "$PORT" "$BUCKET" <<'EOF'
import sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/{sys.argv[2]}", method="PUT")
try: urllib.request.urlopen(req).read()
except Exception as e: print("bucket create:", e, file=sys.stderr)
EOF
}

cmd_start() {
  mkdir -p "$S3DIR"
  ensure_creds
  if running; then
    log "already running (pid $(cat "$PIDFILE"), backend $(cat "$S3DIR/backend" 2>/dev/null))"
    BACKEND="$(cat "$S3DIR/backend" 2>/dev/null || echo "$BACKEND")"
  else
    case "$BACKEND" in
      garage) garage_start ;;
      s3s-fs) s3sfs_start ;;
      moto) moto_start ;;
      *) die "unknown BENCH_S3_BACKEND=$BACKEND (garage|s3s-fs|moto)" ;;
    esac
    echo "$BACKEND" > "$S3DIR/backend"
    log "started $BACKEND on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
  fi
  write_env
  cat "$ENVFILE"
}


case "${1:-}" in
  start) cmd_start ;;
  stop) stop_server ;;
  status) if running; then echo "running pid $(cat "$PIDFILE") backend $(cat "$S3DIR/backend")"; else echo "stopped"; exit 1; fi ;;
  env) [[ -f "$ENVFILE" ]] || die "not started yet"; cat "$ENVFILE" ;;
  wipe) stop_server; rm -rf "$S3DIR"; log "wiped $S3DIR" ;;
  *) echo "usage: $0 start|stop|status|env|wipe" >&2; exit 2 ;;
esac
