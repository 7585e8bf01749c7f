#!/usr/bin/env bash
# pg-server.sh — a private PostgreSQL server on 127.0.0.1 for tests and benchmarks
# (modeled on scripts/s3-server.sh).
#
#   pg-server.sh start         install if missing, initdb (first time), start (idempotent:
#                              when already running it only prints the env), create the
#                              role and the database, print the env
#   pg-server.sh stop          stop the server started by `start` (pg_ctl stop -m fast on its
#                              data dir; fallback: the recorded postmaster PID)
#   pg-server.sh status        exit 0 if running (prints pid and port), 1 otherwise
#   pg-server.sh env           print the `export ...` lines (same as the output of `start`)
#   pg-server.sh psql ARGS...  psql as the superuser `postgres` over the private Unix socket
#                              (default database `postgres`; -d DB / -c SQL / -f FILE as usual)
#
# What `start` sets up:
#   * the Debian `postgresql` package when /usr/lib/postgresql/*/bin has no server
#     (apt-get, DEBIAN_FRONTEND=noninteractive). The package's own cluster ("main", whatever
#     port it takes) is never used or touched; the port choice below simply skips it.
#   * a cluster in $PG_STATE/data (initdb, owned by the OS user `postgres`: root cannot run
#     the server; every server command runs through `runuser -u postgres`). Every directory
#     above $PG_STATE must be searchable (x bit) by `postgres`.
#   * authentication: `trust` for the superuser `postgres` on the Unix socket only (the socket
#     dir $PG_STATE/run is mode 0700, so only root and postgres reach it), `scram-sha-256`
#     for everything else (TCP from any address it listens on, other users on the socket).
#   * settings: fsync and synchronous_commit ON (tests check durability), max_connections
#     200, shared_buffers 128MB, listen on 127.0.0.1 plus PG_LISTEN.
#   * a role `deskfs` (LOGIN CREATEDB) with a random password kept in $PG_STATE/password
#     (stable across restarts), and a database `deskfs_test` owned by it.
#   * waits until the server accepts password logins over TCP on every listen address.
#   * records the postmaster PID (and its start time) in $PG_STATE/server.pid.
#
# Output of start/env (eval it):
#   export PGHOST=127.0.0.1 PGPORT=… PGUSER=deskfs PGPASSWORD=… PGDATABASE=deskfs_test
#   export DESKFS_TEST_PG_URL=postgres://deskfs:PASSWORD@127.0.0.1:PORT/deskfs_test
#   export DESKFS_TEST_PG_ADMIN='host=$PG_STATE/run port=PORT user=postgres dbname=postgres'
#          (a libpq conninfo for superuser psql: psql "$DESKFS_TEST_PG_ADMIN" -c …; append
#          " dbname=OTHER" to reach another database)
#   export PG_STATE=…
#
# Env knobs:
#   PG_STATE   state dir (default ${BENCH_STATE:-/tmp/fsbench}/pg): data/, run/ (socket),
#              server.log, server.pid, password, port, env.sh
#   PG_PORT    TCP port (default: the port recorded in $PG_STATE if free, else 5432 if free,
#              else the first free of 5442, 5452, ...)
#   PG_LISTEN  extra listen addresses, comma-separated (e.g. the bridge IP of a test's network
#              namespaces, see tests/hosts.sh); each must exist on this machine already
#
# Examples:
#   eval "$(PG_STATE=/tmp/my-pg bash scripts/pg-server.sh start)"
#   psql "$DESKFS_TEST_PG_URL" -c 'SELECT 1'
#   PG_STATE=/tmp/my-pg bash scripts/pg-server.sh psql -c 'SELECT datname FROM pg_database'
#   PG_STATE=/tmp/my-pg bash scripts/pg-server.sh stop
set -euo pipefail

STATE="${PG_STATE:-${BENCH_STATE:-/tmp/fsbench}/pg}"
PG_OS_USER=postgres
ROLE=deskfs
DB=deskfs_test

log() { echo "pg-server: $*" >&2; }
die() { echo "pg-server: error: $*" >&2; exit 1; }
usage_err() { echo "pg-server: error: $* (usage: pg-server.sh start|stop|status|env|psql [ARGS...])" >&2; exit 2; }

CMD="${1:-}"
case "$CMD" in
  start|stop|status|env|psql) shift ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") usage_err "no command given" ;;
  *) usage_err "unknown command '$CMD'" ;;
esac
[[ $CMD == psql ]] || (($# == 0)) || die "'$CMD' takes no arguments (got: $*)"

[[ $STATE == /* ]] || STATE="$PWD/$STATE"
STATE="$(realpath -m "$STATE")"
DATA="$STATE/data"
SOCK="$STATE/run"
LOG="$STATE/server.log"
PIDFILE="$STATE/server.pid"
PWFILE="$STATE/password"
PORTFILE="$STATE/port"
LISTENFILE="$STATE/listen"
ENVFILE="$STATE/env.sh"

if [[ -n ${PG_PORT:-} ]]; then
  [[ $PG_PORT =~ ^[0-9]+$ ]] && ((PG_PORT >= 1 && PG_PORT <= 65535)) || die "PG_PORT must be a port number 1..65535 (got '$PG_PORT')"
fi
EXTRA_LISTEN=()
if [[ -n ${PG_LISTEN:-} ]]; then
  IFS=, read -r -a EXTRA_LISTEN <<< "$PG_LISTEN"
  for a in "${EXTRA_LISTEN[@]}"; do
    [[ $a =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ || $a =~ ^[0-9a-fA-F:]+$ ]] || die "PG_LISTEN: '$a' is not an IP address (comma-separated list expected)"
  done
fi

# ---------- helpers ----------
proc_start() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }

recorded_pid() { # prints the recorded postmaster PID if that very process still runs
  [[ -f $PIDFILE ]] || return 1
  local pid st
  read -r pid st < "$PIDFILE" || true
  [[ -n ${pid:-} && -n ${st:-} ]] || return 1
  [[ "$(proc_start "$pid" 2>/dev/null)" == "$st" ]] || return 1
  local s; s=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1; s=${s##*) }
  [[ ${s:0:1} != Z ]] || return 1   # a zombie has exited already
  echo "$pid"
}

running() { recorded_pid > /dev/null; }

find_bindir() { # the newest /usr/lib/postgresql/N/bin that has a server (numeric order)
  local d v
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x $d/postgres && -x $d/initdb && -x $d/pg_ctl && -x $d/psql ]] || continue
    v=${d#/usr/lib/postgresql/}
    echo "${v%/bin} $d"
  done | sort -n | tail -n 1 | cut -d' ' -f2- | grep .
}

as_pg() { (cd / && runuser -u "$PG_OS_USER" -- "$@"); }   # from /: the caller's cwd may be closed to postgres

port_busy() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_port() {
  local p
  if [[ -n ${PG_PORT:-} ]]; then echo "$PG_PORT"; return 0; fi
  if [[ -f $PORTFILE ]]; then
    p=$(cat "$PORTFILE")
    if [[ $p =~ ^[0-9]+$ ]] && ! port_busy "$p" && [[ ! -e $SOCK/.s.PGSQL.$p ]]; then echo "$p"; return 0; fi
  fi
  port_busy 5432 || { echo 5432; return 0; }
  for ((p = 5442; p <= 6432; p += 10)); do
    port_busy "$p" || { echo "$p"; return 0; }
  done
  return 1
}

listen_list() { local IFS=,; echo "127.0.0.1${EXTRA_LISTEN[*]:+,${EXTRA_LISTEN[*]}}"; }

write_env() {
  local port pw
  port=$(cat "$PORTFILE") pw=$(cat "$PWFILE")
  cat > "$ENVFILE" <<EOF
export PGHOST=127.0.0.1
export PGPORT=$port
export PGUSER=$ROLE
export PGPASSWORD=$pw
export PGDATABASE=$DB
export DESKFS_TEST_PG_URL=postgres://$ROLE:$pw@127.0.0.1:$port/$DB
export DESKFS_TEST_PG_ADMIN='host=$SOCK port=$port user=postgres dbname=postgres'
export PG_STATE=$STATE
EOF
  chmod 0600 "$ENVFILE"
}

superuser_psql() { # ARGS...: psql as postgres over the socket, no psqlrc, stop on errors
  env -u PGPASSWORD -u PGSERVICE -u PGOPTIONS PGHOST="$SOCK" PGPORT="$(cat "$PORTFILE")" PGUSER=postgres \
    PGDATABASE=postgres PGCONNECT_TIMEOUT=10 "$BINDIR/psql" -X "$@"
}

install_postgresql() {
  command -v apt-get > /dev/null || die "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/postgres) and there is no apt-get to install it"
  ((EUID == 0)) || die "PostgreSQL is not installed and installing it needs root (apt-get install postgresql)"
  mkdir -p "$STATE"
  log "PostgreSQL server not found: apt-get install postgresql (log: $STATE/install.log)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql > "$STATE/install.log" 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update >> "$STATE/install.log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql >> "$STATE/install.log" 2>&1 \
      || die "apt-get install postgresql failed, see $STATE/install.log"
  fi
}

check_reachable() { # the postgres user must be able to reach the state dir
  local d
  d=$(dirname "$STATE")
  as_pg test -x "$d" 2> /dev/null || die "the OS user '$PG_OS_USER' cannot reach $d (a directory above it lacks the x bit for others: chmod o+x it, or use another PG_STATE)"
}

init_cluster() {
  if [[ -d $DATA && ! -f $DATA/PG_VERSION ]]; then
    log "removing the unfinished cluster in $DATA (no PG_VERSION: an interrupted initdb)"
    rm -rf --one-file-system "$DATA"
  fi
  [[ -f $DATA/PG_VERSION ]] && return 0
  log "initdb $DATA"
  install -d -o "$PG_OS_USER" -g "$PG_OS_USER" -m 0700 "$DATA"
  as_pg "$BINDIR/initdb" -D "$DATA" -U postgres -E UTF8 --locale=C --auth-local=trust \
    --auth-host=scram-sha-256 > "$STATE/initdb.log" 2>&1 || die "initdb failed, see $STATE/initdb.log"
  cat > "$DATA/pg_hba.conf" <<'EOF'
# written by scripts/pg-server.sh
# TYPE  DATABASE  USER      ADDRESS     METHOD
local   all       postgres              trust
local   all       all                   scram-sha-256
host    all       all       0.0.0.0/0   scram-sha-256
host    all       all       ::/0        scram-sha-256
EOF
  cat >> "$DATA/postgresql.conf" <<'EOF'

# ---- scripts/pg-server.sh: test settings (port/listen/socket in deskfs-net.conf)
max_connections = 200
shared_buffers = 128MB
fsync = on
synchronous_commit = on
full_page_writes = on
password_encryption = 'scram-sha-256'
log_line_prefix = '%m [%p] %q%u@%d '
log_min_messages = warning
log_connections = off
dynamic_shared_memory_type = posix
include_if_exists = 'deskfs-net.conf'
EOF
  chown "$PG_OS_USER:$PG_OS_USER" "$DATA/pg_hba.conf" "$DATA/postgresql.conf"
}

accepts_tcp() { # ADDR: a password login over TCP works
  PGPASSWORD="$(cat "$PWFILE")" PGCONNECT_TIMEOUT=3 "$BINDIR/psql" -X -q -t -A \
    "host=$1 port=$(cat "$PORTFILE") user=$ROLE dbname=$DB" -c 'SELECT 1' 2> /dev/null | grep -qx 1
}

STARTING=0
start_cleanup() {
  local rc=$?
  trap - EXIT
  if ((STARTING)) && ((rc != 0)); then
    log "start failed or was interrupted: stopping the server again"
    as_pg "$BINDIR/pg_ctl" stop -D "$DATA" -m fast -w -t 30 -s > /dev/null 2>&1 || true
    rm -f "$PIDFILE"
  fi
  exit "$rc"
}

cmd_start() {
  BINDIR=$(find_bindir) || true
  if [[ -z $BINDIR ]]; then
    install_postgresql
    BINDIR=$(find_bindir) || die "apt-get install postgresql did not bring /usr/lib/postgresql/*/bin/postgres"
  fi
  id -u "$PG_OS_USER" > /dev/null 2>&1 || die "the OS user '$PG_OS_USER' does not exist (it comes with the postgresql-common package)"
  ((EUID == 0)) || die "must run as root (it runs the server as the OS user '$PG_OS_USER' with runuser)"
  mkdir -p "$STATE"
  chmod 0711 "$STATE"
  check_reachable
  if [[ ! -f $PWFILE ]]; then
    (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$PWFILE.tmp") && mv "$PWFILE.tmp" "$PWFILE"
  fi
  if running; then
    log "already running (pid $(recorded_pid), port $(cat "$PORTFILE"), listening on $(cat "$LISTENFILE" 2>/dev/null))"
    if [[ -n ${PG_LISTEN:-} && "$(listen_list)" != "$(cat "$LISTENFILE" 2>/dev/null)" ]]; then
      log "warning: running with listen addresses $(cat "$LISTENFILE" 2>/dev/null), not $(listen_list) (stop it first to change them)"
    fi
    [[ -z ${PG_PORT:-} || $PG_PORT == "$(cat "$PORTFILE")" ]] || log "warning: running on port $(cat "$PORTFILE"), not PG_PORT=$PG_PORT (stop it first to change it)"
    write_env
    cat "$ENVFILE"
    return 0
  fi
  if [[ -f $DATA/PG_VERSION ]] && as_pg "$BINDIR/pg_ctl" status -D "$DATA" > /dev/null 2>&1; then
    # our data dir, so our server, but unrecorded: left by an interrupted start
    log "a server runs on $DATA without a recorded PID (an interrupted start?): stopping it first"
    as_pg "$BINDIR/pg_ctl" stop -D "$DATA" -m fast -w -t 60 -s > /dev/null 2>&1 || die "pg_ctl stop -D $DATA failed"
  fi
  local port
  port=$(pick_port) || die "no free port for PostgreSQL (tried 5432, 5442 ... 6432)"
  if [[ -n ${PG_PORT:-} ]] && port_busy "$port"; then die "PG_PORT=$port is already in use on 127.0.0.1"; fi
  local sockpath="$SOCK/.s.PGSQL.$port"
  ((${#sockpath} <= 100)) || die "socket path $sockpath is too long for a Unix socket (${#sockpath} > 100 bytes): use a shorter PG_STATE"
  for a in "${EXTRA_LISTEN[@]}"; do
    ip -o addr show 2> /dev/null | awk -v a="$a" '{ split($4, x, "/"); if (x[1] == a) f = 1 } END { exit !f }' || die "PG_LISTEN: $a is not an address of this machine (create it first)"
  done
  echo "$port" > "$PORTFILE"
  init_cluster
  install -d -o "$PG_OS_USER" -g "$PG_OS_USER" -m 0700 "$SOCK"
  touch "$LOG"
  chown "$PG_OS_USER:$PG_OS_USER" "$LOG"
  listen_list > "$LISTENFILE"
  cat > "$DATA/deskfs-net.conf" <<EOF
# written by scripts/pg-server.sh at every start
listen_addresses = '$(listen_list)'
port = $port
unix_socket_directories = '$SOCK'
EOF
  chown "$PG_OS_USER:$PG_OS_USER" "$DATA/deskfs-net.conf"
  # From here until success, a failure or an interrupt stops the server again: a start
  # either completes or leaves nothing running.
  STARTING=1
  trap 'start_cleanup' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  log "starting PostgreSQL $("$BINDIR/postgres" --version | awk '{print $3}') on $(listen_list) port $port (data $DATA, log $LOG)"
  # pg_ctl puts the postmaster in its own session, stdin /dev/null, output to the log.
  if ! as_pg "$BINDIR/pg_ctl" start -D "$DATA" -l "$LOG" -w -t 60 -s > "$STATE/pg_ctl.log" 2>&1; then
    tail -n 20 "$LOG" >&2 || true
    die "pg_ctl start failed, see $LOG"
  fi
  local pid
  pid=$(head -n 1 "$DATA/postmaster.pid" 2> /dev/null) || true
  [[ $pid =~ ^[0-9]+$ ]] || die "server started but $DATA/postmaster.pid has no PID"
  echo "$pid $(proc_start "$pid")" > "$PIDFILE"
  # role + database (idempotent; the password goes through stdin, not the command line)
  superuser_psql -q -v ON_ERROR_STOP=1 > /dev/null <<EOF || die "creating role $ROLE failed"
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$ROLE') THEN CREATE ROLE $ROLE; END IF;
END \$\$;
ALTER ROLE $ROLE WITH LOGIN CREATEDB PASSWORD '$(cat "$PWFILE")';
EOF
  if [[ "$(superuser_psql -q -t -A -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]]; then
    superuser_psql -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB OWNER $ROLE" > /dev/null || die "CREATE DATABASE $DB failed"
  fi
  local addr _i
  for addr in 127.0.0.1 "${EXTRA_LISTEN[@]}"; do
    for _i in $(seq 1 50); do accepts_tcp "$addr" && break; sleep 0.2; done
    accepts_tcp "$addr" || die "server runs but $addr:$port does not accept password logins (see $LOG)"
  done
  log "started pid $pid on port $port"
  STARTING=0
  write_env
  cat "$ENVFILE"
}

cmd_stop() {
  BINDIR=$(find_bindir) || true
  local pid=""
  pid=$(recorded_pid) || pid=""
  if [[ -n $BINDIR && -f $DATA/PG_VERSION ]] && as_pg "$BINDIR/pg_ctl" status -D "$DATA" > /dev/null 2>&1; then
    as_pg "$BINDIR/pg_ctl" stop -D "$DATA" -m fast -w -t 60 -s > /dev/null 2>&1 || log "pg_ctl stop failed"
    # pg_ctl returns once postmaster.pid is gone; the process itself exits a moment later
    local _j
    for _j in $(seq 1 50); do running || break; sleep 0.1; done
  fi
  if [[ -n $pid ]] && running; then # fallback: signal the recorded postmaster ourselves
    log "signalling the recorded postmaster pid $pid (fast shutdown)"
    kill -INT "$pid" 2> /dev/null || true
    local _i
    for _i in $(seq 1 50); do running || break; sleep 0.2; done
    if running; then kill -QUIT "$pid" 2> /dev/null || true; sleep 1; fi
    if running; then kill -KILL "$pid" 2> /dev/null || true; fi
  fi
  if [[ -n $pid ]]; then log "stopped pid $pid"; else log "not running"; fi
  rm -f "$PIDFILE"
}

case "$CMD" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status)
    if running; then echo "running pid $(recorded_pid) port $(cat "$PORTFILE") listen $(cat "$LISTENFILE" 2>/dev/null) state $STATE"
    else echo "stopped"; exit 1; fi ;;
  env) [[ -f $ENVFILE ]] || die "not started yet (no $ENVFILE)"; cat "$ENVFILE" ;;
  psql)
    running || die "not running (start it first: $0 start)"
    BINDIR=$(find_bindir) || die "PostgreSQL is not installed"
    superuser_psql "$@" ;;
esac
