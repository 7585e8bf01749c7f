#!/usr/bin/env bash
# azurite.sh — Azurite (Microsoft's Azure Storage emulator) serving Blob storage on
# 127.0.0.1, for tests of az:// workspaces. Modelled on scripts/s3-server.sh.
#
#   azurite.sh start    install if missing, start (idempotent), print the `export ...` lines
#   azurite.sh stop     stop the server started by `start` (by its recorded PID only)
#   azurite.sh status   exit 0 if running, 1 otherwise
#   azurite.sh env      print the `export ...` lines (same as the tail of `start`)
#   azurite.sh wipe     stop and delete all server state (blobs, account key)
#
# Install: `npm install azurite@$AZURITE_VERSION` into a cache dir (no global install, no
# root): $AZURITE_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/deskfs/azurite-$AZURITE_VERSION;
# skipped when its bin/azurite-blob is already there.
# Only the blob service is started (azurite-blob), bound to 127.0.0.1, with
#   --location   its state dir (blobs and metadata survive a restart)
#   --debug      $AZDIR/debug.log (every request and Azurite's answer, for diagnosis)
#   --skipApiVersionCheck  Azurite refuses request versions newer than it knows with 400;
#                clients (object_store, the Python SDK) move faster than Azurite releases
#   (not --loose: deskfs must work against strict Azure semantics, which is the point)
# The account is not the well-known devstoreaccount1: AZURITE_ACCOUNTS defines one account
# with a key generated at the first start (kept in $AZDIR/creds), so a wrong key is
# refused as it would be by Azure.
#
# Env knobs: AZURITE_STATE (default /tmp/deskfs-azurite), AZURITE_PORT (default 10000 when
# free, else the first free of 10010, 10020, ...; kept across restarts), AZURITE_CONTAINER
# (default deskfs), AZURITE_VERSION (default 3.37.0), AZURITE_CACHE (install dir).
#
# Exported by `start`/`env`: AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY,
# AZURE_STORAGE_ENDPOINT (http://127.0.0.1:PORT/ACCOUNT, path-style as Azurite wants),
# AZURE_STORAGE_CONNECTION_STRING, AZURITE_CONTAINER, AZURITE_BLOB_PORT, AZURITE_STATE.
set -euo pipefail

STATE="${AZURITE_STATE:-/tmp/deskfs-azurite}"
AZDIR="$STATE/azurite"
VERSION="${AZURITE_VERSION:-3.37.0}"
CACHE="${AZURITE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deskfs/azurite-$VERSION}"
CONTAINER="${AZURITE_CONTAINER:-deskfs}"
ACCOUNT="deskfsacct"
PIDFILE="$AZDIR/server.pid"
PORTFILE="$AZDIR/port"
ENVFILE="$AZDIR/env.sh"
LOG="$AZDIR/server.log"
DEBUGLOG="$AZDIR/debug.log"
BIN="$CACHE/node_modules/.bin/azurite-blob"

SERVER_NAME=azurite
# shellcheck source=scripts/server-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-lib.sh"

pick_port() {
  if [[ -n "${AZURITE_PORT:-}" ]]; then echo "$AZURITE_PORT"; return; fi
  if [[ -f "$PORTFILE" ]] && ! port_busy "$(cat "$PORTFILE")"; then cat "$PORTFILE"; return; fi
  local p
  for p in 10000 10010 10020 10030 10040 10050 10060 10070 10080 10090; do
    port_busy "$p" || { echo "$p"; return; }
  done
  die "no free port for Azurite (tried 10000..10090); set AZURITE_PORT"
}


ensure_creds() {
  mkdir -p "$AZDIR"
  if [[ ! -f "$AZDIR/creds" ]]; then
    # Azure account keys are 64 random bytes, base64.
    echo "KEY=$(head -c 64 /dev/urandom | base64 -w0)" > "$AZDIR/creds"
  fi
  # shellcheck disable=SC1091
  source "$AZDIR/creds"
}

install() {
  [[ -x "$BIN" ]] && return 0
  command -v npm >/dev/null || die "npm not found; install Node.js (apt-get install nodejs npm)"
  mkdir -p "$CACHE"
  log "installing azurite@$VERSION with npm into $CACHE (log: $AZDIR/install.log)"
  npm install --prefix "$CACHE" --no-audit --no-fund --omit=dev "azurite@$VERSION" \
    >"$AZDIR/install.log" 2>&1 || die "npm install azurite@$VERSION failed, see $AZDIR/install.log"
  [[ -x "$BIN" ]] || die "npm install gave no $BIN, see $AZDIR/install.log"
}

write_env() {
  local ep="http://127.0.0.1:$PORT/$ACCOUNT"
  cat > "$ENVFILE" <<EOF
export AZURE_STORAGE_ACCOUNT_NAME=$ACCOUNT
export AZURE_STORAGE_ACCOUNT_KEY=$KEY
export AZURE_STORAGE_ENDPOINT=$ep
export AZURE_STORAGE_CONNECTION_STRING='DefaultEndpointsProtocol=http;AccountName=$ACCOUNT;AccountKey=$KEY;BlobEndpoint=$ep;'
export AZURITE_CONTAINER=$CONTAINER
export AZURITE_BLOB_PORT=$PORT
export AZURITE_STATE=$STATE
EOF
}

# Creates the container with a SharedKey-signed request (python stdlib only).
create_container() {
  python3 - "$PORT" "$ACCOUNT" "$KEY" "$CONTAINER" <<'EOF'
import base64, hashlib, hmac, sys, urllib.request, urllib.error
from email.utils import formatdate
port, account, key, container = sys.argv[1:5]
date = formatdate(usegmt=True)
version = "2021-12-02"
canon_headers = f"x-ms-date:{date}\nx-ms-version:{version}\n"
canon_res = f"/{account}/{account}/{container}\nrestype:container"
ctype = "application/octet-stream"
to_sign = "PUT\n" + "\n" * 4 + ctype + "\n" * 7 + canon_headers + canon_res
sig = base64.b64encode(hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()).decode()
req = urllib.request.Request(
    f"http://127.0.0.1:{port}/{account}/{container}?restype=container", method="PUT", data=b"",
    headers={"x-ms-date": date, "x-ms-version": version, "Authorization": f"SharedKey {account}:{sig}", "Content-Length": "0", "Content-Type": ctype})
try:
    urllib.request.urlopen(req, timeout=30).read()
except urllib.error.HTTPError as e:
    if e.code != 409:  # 409 ContainerAlreadyExists
        sys.exit(f"create container {container}: {e.code} {e.read()[:300]!r}")
EOF
}

cmd_start() {
  mkdir -p "$AZDIR"
  ensure_creds
  if running; then
    PORT="$(cat "$PORTFILE")"
    log "already running (pid $(cat "$PIDFILE"), 127.0.0.1:$PORT)"
  else
    mkdir -p "$CACHE"
    locked "$CACHE/.install.lock" install
    PORT="$(pick_port)"
    port_busy "$PORT" && die "127.0.0.1:$PORT is in use"
    mkdir -p "$AZDIR/data"
    # At a lower CPU priority, like the S3 server: it stands in for a remote store.
    AZURITE_ACCOUNTS="$ACCOUNT:$KEY" setsid nice -n 10 "$BIN" \
      --blobHost 127.0.0.1 --blobPort "$PORT" --location "$AZDIR/data" \
      --debug "$DEBUGLOG" --skipApiVersionCheck \
      >>"$LOG" 2>&1 </dev/null &
    echo $! > "$PIDFILE"
    echo "$PORT" > "$PORTFILE"
    wait_port 30
    log "started azurite on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"), state $AZDIR)"
  fi
  create_container || die "creating container $CONTAINER failed"
  write_env
  cat "$ENVFILE"
}


case "${1:-}" in
  start) cmd_start ;;
  stop) stop_server ;;
  status) if running; then echo "running pid $(cat "$PIDFILE") port $(cat "$PORTFILE")"; else echo "stopped"; exit 1; fi ;;
  env) [[ -f "$ENVFILE" ]] || die "not started yet"; cat "$ENVFILE" ;;
  wipe) stop_server; rm -rf "$AZDIR"; log "wiped $AZDIR" ;;
  *) echo "usage: $0 start|stop|status|env|wipe" >&2; exit 2 ;;
esac
