# tests/hosts.sh — several "hosts" on this machine, as Linux network namespaces, for
# multi-host e2e tests. Source it after tests/lib.sh:
#
#   source "$(dirname "$0")/../lib.sh"
#   source "$(dirname "$0")/../hosts.sh"
#   need_hosts                       # root, ip, nsenter, unshare, socat, hostname (else skip/fail)
#   hosts_up 3                       # h1 h2 h3
#   host_run h2 hostname             # -> h2
#   url=$(hosts_pg_url)              # PostgreSQL as the hosts reach it
#   ep=$(hosts_s3_endpoint)          # Garage as the hosts reach it
#   host_run h1 psql "$url" -c 'SELECT 1'
#   host_partition h3; ...; host_heal h3
#   (hosts_down runs by itself at exit)
#
# Functions (exact signatures):
#   need_hosts                  skip (fail under DESKFS_TEST_STRICT=1) unless root and ip,
#                               nsenter, unshare, socat, hostname, python3 exist
#   hosts_up N                  N = 1..50. Creates, in the root network namespace, a bridge
#                               with address $HOSTS_BRIDGE_IP/24, and N network namespaces,
#                               each with lo up and one veth pair: "eth0" inside with
#                               address .11, .12, ... and a default route via the bridge
#                               address; the other end on the bridge. Returns once every host
#                               reaches the bridge address. Call it in the test's main shell
#                               (not inside $(...)): it sets the variables below.
#   hosts_down                  removes everything hosts_up/hosts_forward made (idempotent;
#                               registered with lib.sh's on_exit, so it runs at exit by
#                               itself). First unmounts the test's registered mounts if a
#                               process inside a host holds /dev/fuse (a FUSE daemon started
#                               there), then TERM/KILLs the processes left inside the hosts'
#                               namespaces (only processes this test put there can be
#                               there), stops the forwarders, deletes veths, namespaces and
#                               the bridge.
#   host_run H CMD [ARGS...]    runs CMD in host H's network namespace and in a new UTS
#                               namespace whose hostname is H, but in the ROOT mount
#                               namespace (nsenter --net + unshare --uts, not `ip netns
#                               exec`): a FUSE mount made by a daemon started this way is
#                               visible to the test. CMD is an executable (use `bash -c` for
#                               shell code); environment, cwd and fds are inherited; exec'd,
#                               so `host_run h1 CMD &` gives CMD's PID in $!.
#   host_ip H                   prints H's address (e.g. 10.164.39.12)
#   host_pids H                 prints the PIDs of the processes in H's network namespace
#   has_fuse_fd PID             exit 0 if PID holds /dev/fuse open (a FUSE daemon)
#   host_netns H                prints H's namespace name (for `ip -n NAME ...`)
#   host_partition H            takes H's link down from the root side (the bridge end of
#                               its veth): H reaches neither PostgreSQL nor S3 nor the other
#                               hosts; connections hang (no reset), new ones time out
#   host_heal H                 brings the link up again and waits (<= 10 s) until H
#                               reaches the bridge address (a TCP connect answered)
#   host_block H PORT [WHICH]   cuts H off from one service only, HOSTS_BRIDGE_IP:PORT (e.g.
#                               the bucket but not PostgreSQL), with tc on both ends of H's
#                               veth (htb + a u32 filter into a pfifo of limit 0: the packets
#                               are dropped, connections hang, new ones time out; no
#                               iptables needed). WHICH: both (default); replies (only what
#                               PORT sends to H is dropped: H's requests arrive and are acted
#                               on, their answers never come back); requests (only what H
#                               sends to PORT). Several ports may be blocked at once.
#   host_throttle H PORT RATE   what H sends to PORT goes at most at RATE (tc rate, e.g.
#                               4mbit): an upload to the bucket then takes a while
#   host_unblock H              removes every rule host_block and host_throttle put on H
#   host_reaches H [PORT]       exit 0 if a TCP connect from H to HOSTS_BRIDGE_IP:PORT
#                               (default 9, where nothing listens) is answered (accepted or
#                               refused) within 1 s
#   hosts_forward PORT...       makes 127.0.0.1:PORT of the root namespace reachable from
#                               the hosts at $HOSTS_BRIDGE_IP:PORT (socat, forking, bound to
#                               the bridge address only; PIDs recorded, stopped by
#                               hosts_down). Idempotent per port; works inside $(...).
#   hosts_pg_url [URL]          prints URL (default $DESKFS_TEST_PG_URL; host must be
#                               127.0.0.1 or localhost) with its host replaced by
#                               $HOSTS_BRIDGE_IP, and forwards its port (hosts_forward)
#                               unless it is the port of hosts_pg_private's server.
#                               E.g. host_url=$(hosts_pg_url "$(pg_fresh_db mytest)")
#   hosts_s3_endpoint           prints http://$HOSTS_BRIDGE_IP:PORT for $BENCH_S3_ENDPOINT
#                               (Garage on 127.0.0.1:PORT) and forwards PORT
#   hosts_pg_private            see "PostgreSQL for hosts" below
#
# Variables set by hosts_up:
#   HOSTS_NAMES=(h1 ... hN)   host names (also their hostnames inside host_run)
#   HOSTS_BRIDGE_IP           the bridge address (10.A.B.1), the hosts' default gateway
#                             (exported)
#   HOSTS_SUBNET              10.A.B.0/24 (exported)
#   HOSTS_BRIDGE              the bridge's interface name
#
# Naming and addresses, unique per run: TAG = the test's PID in hex ($$), plus a letter if
# names with that tag exist already (a leftover). Bridge "dk<TAG>b", bridge ends of the veths
# "dk<TAG>v<i>" (<= 15 chars, IFNAMSIZ), namespaces "deskfs-<TAG>-h<i>". The subnet is a
# 10.A.B.0/24 with A in 100..227 derived from the PID, the first one that overlaps no address
# or route of the root namespace; picking it and adding the bridge address happens under
# a lock (/run/deskfs-hosts.lock), so two runs never take the same one. IPv6 is disabled on
# every interface made here (no router solicitations, no DAD traffic).
#
# Traffic: hosts reach the bridge address (services of the root namespace bound to it:
# the forwarders, or a PostgreSQL started with PG_LISTEN=$HOSTS_BRIDGE_IP) and each other.
# IP forwarding in the root namespace is never turned on, so nothing from a host leaves the
# machine. (Packets from a host to another local address of the root namespace, e.g. its
# eth0 address, are delivered locally like any packet to the bridge address: address only
# $HOSTS_BRIDGE_IP in tests.)
#
# PostgreSQL for hosts: hosts_pg_url forwards the PostgreSQL port of the test server
# (scripts/pg-server.sh, started by scripts/test.sh on 127.0.0.1) with socat, so the shared
# server and pg_fresh_db work unchanged. What that means: the server sees every host's
# connections as coming from 127.0.0.1 (tell hosts apart by application_name, not by
# client_addr), and a partitioned host's server-side sessions stay open (socat's connection
# to the server is healthy) until the host's side is closed. A test that needs the server to
# see the hosts themselves (client_addr, server-side TCP keepalives) calls hosts_pg_private
# after hosts_up: a private server for this test, listening on the bridge address too.
#   hosts_pg_private            starts scripts/pg-server.sh with PG_STATE=$T/pg,
#                               PG_LISTEN=$HOSTS_BRIDGE_IP (chmod 0711 $T so the OS user
#                               postgres reaches it), exports its env (DESKFS_TEST_PG_URL,
#                               DESKFS_TEST_PG_ADMIN, PG*, PG_STATE: pg_fresh_db then creates
#                               databases there), stops it at exit; from then on
#                               hosts_pg_url gives URLs that reach it directly (no socat).
#                               Main shell only.
#
# Records (for scripts/test.sh's cleanup if the test is killed before its EXIT trap):
# "link NAME" / "netns NAME" lines in $T/hosts.net and $DESKFS_TEST_RUN_DIR/net; forwarder
# PIDs with lib.sh's register_pid (and in $T/hosts.fwd).
# shellcheck shell=bash

[[ -n ${T:-} && $(type -t register_pid) == function ]] || { echo "tests/hosts.sh: source tests/lib.sh first" >&2; exit 1; }

HOSTS_NAMES=()
HOSTS_BRIDGE=""
HOSTS_BRIDGE_IP=""
HOSTS_SUBNET=""
declare -gA _HOSTS_NS=() _HOSTS_VETH=() _HOSTS_IP=()
_HOSTS_NET=$T/hosts.net     # "link NAME" / "netns NAME", in creation order
_HOSTS_FWD=$T/hosts.fwd     # "PID STARTTIME PORT" of each forwarder
_HOSTS_LOCK=/run/deskfs-hosts.lock

need_hosts() {
  ((EUID == 0)) || skip_or_fail "multi-host tests need root (network namespaces)"
  need_cmd ip nsenter unshare socat hostname python3 ss
}

_hosts_record() { # KIND NAME
  echo "$1 $2" >> "$_HOSTS_NET"
  [[ -n ${DESKFS_TEST_RUN_DIR:-} ]] && echo "$1 $2" >> "$DESKFS_TEST_RUN_DIR/net"
  return 0
}

_hosts_host() { # H: validates a host name
  [[ -n ${1:-} && -n ${_HOSTS_NS[$1]:-} ]] || fail "unknown host '${1:-}' (hosts: ${HOSTS_NAMES[*]:-none, call hosts_up first})"
}

_hosts_pick_subnet() { # PID: prints "A B" of a free 10.A.B.0/24
  python3 - "$1" <<'PY'
import ipaddress, json, subprocess, sys
pid = int(sys.argv[1])
used = []
for args in (["ip", "-j", "-4", "route", "show", "table", "all"], ["ip", "-j", "-4", "addr", "show"]):
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout or "[]")
    for r in out:
        if "addr_info" in r:
            for a in r["addr_info"]:
                used.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
        else:
            d = r.get("dst", "")
            if d in ("", "default"):
                continue
            used.append(ipaddress.ip_network(d if "/" in d else d + "/32", strict=False))
for k in range(32768):
    n = (pid + k * 97) % 32768
    net = ipaddress.ip_network(f"10.{100 + (n >> 8)}.{n & 255}.0/24")
    if not any(net.overlaps(u) for u in used):
        print(100 + (n >> 8), n & 255)
        sys.exit(0)
sys.exit("no free 10.x.y.0/24")
PY
}

_hosts_no_ipv6() { # [NETNS] IFACE|default|all
  local f
  if (($# == 2)); then
    nsenter --net="/run/netns/$1" -- sh -c "f=/proc/sys/net/ipv6/conf/$2/disable_ipv6; [ ! -e \$f ] || echo 1 > \$f"
  else
    f=/proc/sys/net/ipv6/conf/$1/disable_ipv6
    [[ ! -e $f ]] || echo 1 > "$f"
  fi
}

hosts_up() {
  (($# == 1)) && [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= 50)) || fail "hosts_up: expected one argument N = 1..50, got '$*'"
  [[ -z $HOSTS_BRIDGE ]] || fail "hosts_up: hosts are already up (call hosts_down first)"
  ((BASH_SUBSHELL == 0)) || fail "hosts_up must run in the test's main shell, not in a subshell or \$(...)"
  need_hosts
  local n=$1 tag sfx="" i a b ns veth lockfd
  tag=$(printf '%x' $$)
  for sfx in "" a b c d e f g h i j k l m n o p q r s t u v w x y z; do
    ip link show "dk$tag${sfx}b" > /dev/null 2>&1 || [[ -e /run/netns/deskfs-$tag$sfx-h1 ]] || break
  done
  tag=$tag$sfx
  exec {lockfd}> "$_HOSTS_LOCK"
  flock -w 60 "$lockfd" || fail "hosts_up: could not lock $_HOSTS_LOCK within 60 s"
  read -r a b < <(_hosts_pick_subnet $$) || { exec {lockfd}>&-; fail "hosts_up: no free 10.x.y.0/24 subnet"; }
  [[ -n ${a:-} && -n ${b:-} ]] || { exec {lockfd}>&-; fail "hosts_up: no free 10.x.y.0/24 subnet"; }
  HOSTS_BRIDGE=dk${tag}b
  HOSTS_BRIDGE_IP=10.$a.$b.1
  HOSTS_SUBNET=10.$a.$b.0/24
  export HOSTS_BRIDGE_IP HOSTS_SUBNET
  _hosts_record link "$HOSTS_BRIDGE"
  ip link add "$HOSTS_BRIDGE" type bridge stp_state 0 forward_delay 0 || { exec {lockfd}>&-; fail "hosts_up: ip link add $HOSTS_BRIDGE type bridge failed"; }
  _hosts_no_ipv6 "$HOSTS_BRIDGE"
  ip addr add "$HOSTS_BRIDGE_IP/24" dev "$HOSTS_BRIDGE"
  ip link set "$HOSTS_BRIDGE" up
  exec {lockfd}>&-
  log "hosts: bridge $HOSTS_BRIDGE $HOSTS_BRIDGE_IP/24"
  for ((i = 1; i <= n; i++)); do
    ns=deskfs-$tag-h$i
    veth=dk${tag}v$i
    _hosts_record netns "$ns"
    ip netns add "$ns"
    _hosts_no_ipv6 "$ns" default
    _hosts_no_ipv6 "$ns" all
    ip -n "$ns" link set lo up
    _hosts_record link "$veth"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    _hosts_no_ipv6 "$veth"
    ip link set "$veth" master "$HOSTS_BRIDGE"
    ip link set "$veth" up
    ip -n "$ns" addr add "10.$a.$b.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$HOSTS_BRIDGE_IP"
    HOSTS_NAMES+=("h$i")
    _HOSTS_NS[h$i]=$ns
    _HOSTS_VETH[h$i]=$veth
    _HOSTS_IP[h$i]=10.$a.$b.$((10 + i))
  done
  local h
  for h in "${HOSTS_NAMES[@]}"; do
    wait_for 10 host_reaches "$h" || fail "hosts_up: $h (${_HOSTS_IP[$h]}) does not reach the bridge $HOSTS_BRIDGE_IP"
  done
  log "hosts: ${HOSTS_NAMES[*]} up (${HOSTS_SUBNET}, namespaces deskfs-$tag-h1..h$n)"
}

# has_fuse_fd PID: the process holds /dev/fuse open (a FUSE daemon)
has_fuse_fd() {
  local f
  for f in "/proc/$1/fd/"*; do
    [[ "$(readlink "$f" 2> /dev/null)" == /dev/fuse ]] && return 0
  done
  return 1
}

# host_pids H: PIDs of the processes inside H's network namespace
host_pids() { _hosts_host "${1:-}"; ip netns pids "${_HOSTS_NS[$1]}" 2> /dev/null || true; }

host_ip() { _hosts_host "${1:-}"; echo "${_HOSTS_IP[$1]}"; }
host_netns() { _hosts_host "${1:-}"; echo "${_HOSTS_NS[$1]}"; }

host_run() {
  _hosts_host "${1:-}"
  local h=$1
  shift
  (($#)) || fail "host_run $h: no command given"
  nsenter --net="/run/netns/${_HOSTS_NS[$h]}" -- unshare --uts -- \
    /bin/sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

host_reaches() {
  _hosts_host "${1:-}"
  local port=${2:-9}
  host_run "$1" python3 -c '
import socket, sys
s = socket.socket()
s.settimeout(1.0)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
except ConnectionRefusedError:
    pass  # an answer: reachable
except OSError:
    sys.exit(1)
' "$HOSTS_BRIDGE_IP" "$port" 2> /dev/null
}

host_partition() {
  _hosts_host "${1:-}"
  log "hosts: partitioning $1 (link ${_HOSTS_VETH[$1]} down)"
  ip link set "${_HOSTS_VETH[$1]}" down
}

host_heal() {
  _hosts_host "${1:-}"
  log "hosts: healing $1 (link ${_HOSTS_VETH[$1]} up)"
  ip link set "${_HOSTS_VETH[$1]}" up
  wait_for 10 host_reaches "$1" || fail "host_heal $1: still does not reach $HOSTS_BRIDGE_IP 10 s after the link came up"
}

# _hosts_tc H in|out ARGS...: tc ARGS on the end of H's veth where what H sends (in: the
# host's eth0) or what it receives (out: the bridge end) leaves; @DEV@ in ARGS is that device
_hosts_tc() {
  local h=$1 side=$2
  shift 2
  if [[ $side == in ]]; then
    tc -n "${_HOSTS_NS[$h]}" "${@//@DEV@/eth0}"
  else
    tc "${@//@DEV@/${_HOSTS_VETH[$h]}}"
  fi
}

# _hosts_tc_root H in|out: an htb root there (once): class 1:10 passes (default), 1:20 drops
# (the show is read whole before it is matched: under pipefail, `tc ... | grep -q` fails when
# grep's early exit ends tc with SIGPIPE, and an existing root was then added again)
_hosts_tc_root() {
  local shown
  shown=$(_hosts_tc "$1" "$2" qdisc show dev @DEV@)
  [[ $shown =~ (^|$'\n')'qdisc htb 1: root' ]] && return 0
  { _hosts_tc "$1" "$2" qdisc add dev @DEV@ root handle 1: htb default 10 &&
    _hosts_tc "$1" "$2" class add dev @DEV@ parent 1: classid 1:10 htb rate 100gbit &&
    _hosts_tc "$1" "$2" class add dev @DEV@ parent 1: classid 1:20 htb rate 100gbit &&
    _hosts_tc "$1" "$2" qdisc add dev @DEV@ parent 1:20 handle 20: pfifo limit 0; } 2> "$T/tc.err" ||
    fail "hosts: cannot set up tc for $1 (htb, u32 and pfifo are needed): $(head -n 1 "$T/tc.err")"
}

host_block() {
  _hosts_host "${1:-}"
  [[ ${2:-} =~ ^[0-9]+$ ]] || fail "host_block: expected H PORT [both|replies|requests], got '$*'"
  need_cmd tc
  local h=$1 p=$2 which=${3:-both}
  [[ $which =~ ^(both|replies|requests)$ ]] || fail "host_block: WHICH is both, replies or requests, not '$which'"
  if [[ $which != replies ]]; then
    _hosts_tc_root "$h" in
    _hosts_tc "$h" in filter add dev @DEV@ parent 1: protocol ip prio 1 u32 \
      match ip dst "$HOSTS_BRIDGE_IP/32" match ip dport "$p" 0xffff flowid 1:20
  fi
  if [[ $which != requests ]]; then
    _hosts_tc_root "$h" out
    _hosts_tc "$h" out filter add dev @DEV@ parent 1: protocol ip prio 1 u32 \
      match ip src "$HOSTS_BRIDGE_IP/32" match ip sport "$p" 0xffff flowid 1:20
  fi
  log "hosts: $h cut off from $HOSTS_BRIDGE_IP:$p ($which)"
}

host_throttle() {
  _hosts_host "${1:-}"
  [[ ${2:-} =~ ^[0-9]+$ && -n ${3:-} ]] || fail "host_throttle: expected H PORT RATE, got '$*'"
  need_cmd tc
  local h=$1 p=$2
  _hosts_tc_root "$h" in
  _hosts_tc "$h" in class replace dev @DEV@ parent 1: classid 1:30 htb rate "$3" ceil "$3"
  _hosts_tc "$h" in filter add dev @DEV@ parent 1: protocol ip prio 2 u32 \
    match ip dst "$HOSTS_BRIDGE_IP/32" match ip dport "$p" 0xffff flowid 1:30
  log "hosts: $h sends to $HOSTS_BRIDGE_IP:$p at most at $3"
}

host_unblock() {
  _hosts_host "${1:-}"
  _hosts_tc "$1" in qdisc del dev @DEV@ root 2> /dev/null || true
  _hosts_tc "$1" out qdisc del dev @DEV@ root 2> /dev/null || true
  log "hosts: $1's tc rules removed"
}

_hosts_fwd_pid() { # PORT: prints the PID of a live forwarder of PORT
  [[ -f $_HOSTS_FWD ]] || return 1
  local pid st p
  while read -r pid st p; do
    [[ $p == "$1" ]] && _pid_is_ours "$pid" "$st" && { echo "$pid"; return 0; }
  done < "$_HOSTS_FWD"
  return 1
}

_hosts_listening() { # ADDR PORT
  ss -Hltn 2> /dev/null | awk -v a="$1:$2" '$4 == a { f = 1 } END { exit !f }'
}

hosts_forward() {
  [[ -n $HOSTS_BRIDGE_IP ]] || fail "hosts_forward: no hosts (call hosts_up first)"
  (($#)) || fail "hosts_forward: expected PORT..."
  need_cmd socat ss
  local p pid out
  for p in "$@"; do
    [[ $p =~ ^[0-9]+$ ]] && ((p >= 1 && p <= 65535)) || fail "hosts_forward: '$p' is not a port number"
    _hosts_fwd_pid "$p" > /dev/null && continue
    out=$T/socat.$p.log
    setsid socat -d "TCP4-LISTEN:$p,bind=$HOSTS_BRIDGE_IP,fork,reuseaddr,nodelay" "TCP4:127.0.0.1:$p,nodelay" \
      > "$out" 2>&1 < /dev/null &
    pid=$!
    register_pid "$pid"
    echo "$pid $(_proc_start "$pid") $p" >> "$_HOSTS_FWD"
    local end=$((SECONDS + 10))
    until _hosts_listening "$HOSTS_BRIDGE_IP" "$p"; do
      pid_running "$pid" || fail "hosts_forward: socat for port $p exited: $(tail -n 5 "$out")"
      ((SECONDS < end)) || fail "hosts_forward: socat does not listen on $HOSTS_BRIDGE_IP:$p after 10 s"
      sleep 0.1
    done
    log "hosts: forwarding $HOSTS_BRIDGE_IP:$p -> 127.0.0.1:$p (socat pid $pid)"
  done
}

_HOSTS_PG_DIRECT_PORT=""
hosts_pg_private() {
  [[ -n $HOSTS_BRIDGE_IP ]] || fail "hosts_pg_private: no hosts (call hosts_up first)"
  ((BASH_SUBSHELL == 0)) || fail "hosts_pg_private must run in the test's main shell"
  [[ -z $_HOSTS_PG_DIRECT_PORT ]] || fail "hosts_pg_private: already started"
  chmod 0711 "$T"
  log "hosts: starting a private PostgreSQL on 127.0.0.1 and $HOSTS_BRIDGE_IP (state $T/pg)"
  on_exit _hosts_pg_private_stop
  PG_STATE=$T/pg PG_LISTEN=$HOSTS_BRIDGE_IP PG_PORT='' bash "$ROOT/scripts/pg-server.sh" start \
    > "$T/pg-private.env" 2> "$T/pg-private.log" ||
    fail "hosts_pg_private: scripts/pg-server.sh start failed: $(tail -n 1 "$T/pg-private.log")"
  register_pid "$(cut -d' ' -f1 "$T/pg/server.pid")"   # scripts/test.sh's cleanup, if we are killed
  # shellcheck disable=SC1091
  source "$T/pg-private.env"
  _HOSTS_PG_DIRECT_PORT=$PGPORT
}

_hosts_pg_private_stop() {
  [[ -f $T/pg/server.pid ]] || return 0
  PG_STATE=$T/pg bash "$ROOT/scripts/pg-server.sh" stop >> "$T/pg-private.log" 2>&1 ||
    log "hosts: stopping the private PostgreSQL failed, see $T/pg-private.log"
}

hosts_pg_url() {
  local url=${1:-${DESKFS_TEST_PG_URL:-}}
  [[ -n $url ]] || fail "hosts_pg_url: no URL given and DESKFS_TEST_PG_URL is not set (need_pg first)"
  [[ -n $HOSTS_BRIDGE_IP ]] || fail "hosts_pg_url: no hosts (call hosts_up first)"
  local re='^(postgres(ql)?://)([^@/]*@)?(127\.0\.0\.1|localhost)(:([0-9]+))?(/.*)?$'
  [[ $url =~ $re ]] || fail "hosts_pg_url: expected postgres://[user[:password]@]127.0.0.1[:port]/db, got '$url'"
  local scheme=${BASH_REMATCH[1]} user=${BASH_REMATCH[3]} port=${BASH_REMATCH[6]:-5432} rest=${BASH_REMATCH[7]}
  [[ $port == "$_HOSTS_PG_DIRECT_PORT" ]] || hosts_forward "$port" >&2
  echo "$scheme$user$HOSTS_BRIDGE_IP:$port$rest"
}

hosts_s3_endpoint() {
  [[ -n ${BENCH_S3_ENDPOINT:-} ]] || fail "hosts_s3_endpoint: BENCH_S3_ENDPOINT is not set (need_s3 first)"
  [[ -n $HOSTS_BRIDGE_IP ]] || fail "hosts_s3_endpoint: no hosts (call hosts_up first)"
  local re='^http://(127\.0\.0\.1|localhost):([0-9]+)/?$'
  [[ $BENCH_S3_ENDPOINT =~ $re ]] || fail "hosts_s3_endpoint: expected BENCH_S3_ENDPOINT=http://127.0.0.1:PORT, got '$BENCH_S3_ENDPOINT'"
  local port=${BASH_REMATCH[2]}
  hosts_forward "$port" >&2
  echo "http://$HOSTS_BRIDGE_IP:$port"
}

_hosts_ns_pids() { # prints the PIDs inside our namespaces
  local kind name
  [[ -f $_HOSTS_NET ]] || return 0
  while read -r kind name; do
    [[ $kind == netns && -e /run/netns/$name ]] && ip netns pids "$name" 2> /dev/null
  done < "$_HOSTS_NET"
  return 0
}

hosts_down() {
  local kind name pid st p fuse=0 pids
  # 1. FUSE daemons inside a host: unmount the test's mounts while the network still works
  pids=$(_hosts_ns_pids)
  for pid in $pids; do
    if has_fuse_fd "$pid"; then fuse=1; fi
  done
  if ((fuse)); then
    log "hosts_down: a FUSE daemon runs in a host: unmounting the test's mounts first"
    unmount_registered
  fi
  # 2. processes left inside the hosts (only this test can have put them there)
  pids=$(_hosts_ns_pids)
  if [[ -n $pids ]]; then
    log "hosts_down: stopping processes left in the hosts: $(echo $pids)"
    kill -TERM $pids 2> /dev/null || true
    for _ in $(seq 1 30); do [[ -z $(_hosts_ns_pids) ]] && break; sleep 0.1; done
    pids=$(_hosts_ns_pids)
    [[ -z $pids ]] || kill -KILL $pids 2> /dev/null || true
  fi
  # 3. forwarders (each leads its process group: its forked children go too)
  if [[ -f $_HOSTS_FWD ]]; then
    while read -r pid st p; do
      _pid_is_ours "$pid" "$st" || continue
      kill -TERM -- "-$pid" 2> /dev/null || kill -TERM "$pid" 2> /dev/null || true
      # (an exited socat stays a zombie until the test's shell reaps it: pid_running)
      for _ in $(seq 1 20); do _pid_is_ours "$pid" "$st" && pid_running "$pid" || break; sleep 0.1; done
      if _pid_is_ours "$pid" "$st" && pid_running "$pid"; then
        kill -KILL -- "-$pid" 2> /dev/null || kill -KILL "$pid" 2> /dev/null || true
      fi
    done < "$_HOSTS_FWD"
    rm -f "$_HOSTS_FWD"
  fi
  # 4. veths, namespaces, bridge (reverse creation order)
  if [[ -f $_HOSTS_NET ]]; then
    while read -r kind name; do
      case $kind in
        link) ! ip link show "$name" > /dev/null 2>&1 || ip link del "$name" 2> /dev/null || log "hosts_down: ip link del $name failed" ;;
        netns) [[ ! -e /run/netns/$name ]] || ip netns del "$name" 2> /dev/null || log "hosts_down: ip netns del $name failed" ;;
      esac
    done < <(tac "$_HOSTS_NET")
    rm -f "$_HOSTS_NET"
    log "hosts: down"
  fi
  HOSTS_NAMES=()
  HOSTS_BRIDGE=""
  HOSTS_BRIDGE_IP=""
  HOSTS_SUBNET=""
  _HOSTS_NS=() _HOSTS_VETH=() _HOSTS_IP=()
  return 0
}

on_exit hosts_down
