# scripts/server-lib.sh — what the test servers' control scripts share (s3-server.sh,
# azurite.sh, gcs-server.sh): logging, the pid file, waiting for the port, stopping.
# Sourced by them; the functions read SERVER_NAME (the log prefix), PIDFILE, PORT and
# LOG (the server's log file) when they are called.

log() { echo "$SERVER_NAME: $*" >&2; }
die() { echo "$SERVER_NAME: error: $*" >&2; exit 1; }

# locked LOCKFILE CMD...: runs CMD in a subshell holding an exclusive flock on LOCKFILE
# (waits up to 15 min). Two tests may start a server at once (scripts/test.sh runs e2e
# lanes): one installs it, the other waits here and then finds it installed. The lock's fd
# is closed when the subshell ends, so a server started afterwards never inherits it.
locked() {
  local lock=$1
  shift
  (
    exec 8> "$lock"
    flock -w 900 8 || die "waited 15 min for $lock (another install of $SERVER_NAME?)"
    "$@"
  ) || exit 1
}

# running: the pid file names a live process.
running() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid
  pid="$(cat "$PIDFILE")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2> /dev/null
}

# port_busy PORT: something accepts connections on 127.0.0.1:PORT.
port_busy() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }

# wait_port [SECONDS] [PIDFILE LOGFILE]: until something answers on $PORT (default 20 s);
# dies when the process of PIDFILE (default $PIDFILE) exits first, quoting the last line
# of LOGFILE (default $LOG), or when nothing answers in time.
wait_port() {
  local i secs=${1:-20} pidfile=${2:-$PIDFILE} logfile=${3:-$LOG}
  for i in $(seq 1 $((secs * 5))); do
    port_busy "$PORT" && return 0
    if ! PIDFILE=$pidfile running; then
      die "$SERVER_NAME exited during startup ($(tail -n 1 "$logfile" 2> /dev/null)), see $logfile"
    fi
    sleep 0.2
  done
  die "$SERVER_NAME did not open 127.0.0.1:$PORT within ${secs}s, see $logfile"
}

# stop_server: SIGTERM to the pid file's process, SIGKILL after 10 s; removes the pid file.
stop_server() {
  if running; then
    local pid i
    pid="$(cat "$PIDFILE")"
    kill -TERM "$pid" 2> /dev/null || true
    for i in $(seq 1 50); do
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.2
    done
    kill -0 "$pid" 2> /dev/null && kill -KILL "$pid" 2> /dev/null || true
    log "stopped pid $pid"
  else
    log "not running"
  fi
  rm -f "$PIDFILE"
}
