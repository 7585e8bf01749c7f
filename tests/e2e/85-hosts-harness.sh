#!/usr/bin/env bash
# 85-hosts-harness: the multi-host test harness (tests/hosts.sh, scripts/pg-server.sh,
# tests/tools/tcpproxy.py) works, with what deskfs does today.
#  * 3 hosts (network namespaces on a bridge): hostnames h1/h2/h3 inside host_run, the
#    root namespace's hostname unchanged
#  * from each host, psql reaches the test PostgreSQL at the bridge address (a fresh
#    database from pg_fresh_db, forwarded by hosts_pg_url): SELECT 1; a row written from h1 is
#    read from h2; the hosts' own 127.0.0.1 has no PostgreSQL; hosts_pg_private: a private
#    server on the bridge address sees each host's own address as client_addr
#  * from each host, an HTTP GET of hosts_s3_endpoint gets an HTTP answer from Garage (any
#    status); without an S3 server (only outside scripts/test.sh) a local HTTP server stands in
#  * an embedded-default workspace mounted by `deskfs mount` run inside h2 (own DESKFS_HOME):
#    the daemon lives in h2's network and UTS namespaces, the mount is visible and usable
#    from the root namespace (write, read, rename, mkdir, ls) and from h1, unmounts cleanly,
#    the bucket dir holds the files
#  * host_partition h3: psql from h3 fails within a few seconds (connect_timeout), h1 still
#    works; host_heal h3: works again
#  * tcpproxy.py in front of PostgreSQL: 200 SELECT 1 round trips with --delay-ms 0 and 1;
#    the median per-query time differs by about 2 ms (accepted: 1.5 .. 4.5 ms)
#  * cleanup: a child test that brings up 2 hosts, a forwarder, a process and a deskfs mount
#    inside a host, then is killed with SIGTERM, leaves no namespace, link, socat, process
#    or mount behind; and hosts_down here removes everything this test made
# e2e-timeout: 300
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../hosts.sh"
need_deskfs
need_hosts
need_pg
need_cmd psql

# ---------------------------------------------------------------- hosts
hosts_up 3
assert_eq "h1 h2 h3" "${HOSTS_NAMES[*]}" "host names"
[[ $HOSTS_BRIDGE_IP =~ ^10\.[0-9]+\.[0-9]+\.1$ ]] || fail "bridge address $HOSTS_BRIDGE_IP is not 10.A.B.1"
grep -q "inet $HOSTS_BRIDGE_IP/24" <<< "$(ip -o addr show dev "$HOSTS_BRIDGE")" || fail "bridge $HOSTS_BRIDGE has no $HOSTS_BRIDGE_IP/24"
for h in "${HOSTS_NAMES[@]}"; do
  [[ -e /run/netns/$(host_netns "$h") ]] || fail "no network namespace for $h"
done
TAG_NS=$(host_netns h1)
TAG_NS=${TAG_NS%-h1}   # deskfs-<tag>

log "hostnames"
root_hostname=$(hostname)
for h in "${HOSTS_NAMES[@]}"; do
  assert_eq "$h" "$(host_run "$h" hostname)" "hostname inside $h"
  assert_eq "$(host_ip "$h")" "$(host_run "$h" ip -o -4 addr show dev eth0 | awk '{ split($4, a, "/"); print a[1] }')" "address of $h"
done
assert_eq "$root_hostname" "$(hostname)" "root namespace hostname after host_run"
[[ $root_hostname != h[123] ]] || fail "the root namespace's hostname is $root_hostname (like a host)"

# ---------------------------------------------------------------- PostgreSQL from the hosts
log "PostgreSQL from the hosts"
DB_URL=$(pg_fresh_db hosts)
HOST_URL=$(hosts_pg_url "$DB_URL")
[[ $HOST_URL == *"@$HOSTS_BRIDGE_IP:"* ]] || fail "hosts_pg_url did not put the bridge address in the URL: ${HOST_URL##*@}"
hpsql() { # HOST SQL: psql from HOST with a 5 s connect timeout
  host_run "$1" env PGCONNECT_TIMEOUT=5 psql -X -q -t -A -v ON_ERROR_STOP=1 "$HOST_URL" -c "$2"
}
for h in "${HOSTS_NAMES[@]}"; do
  assert_eq 1 "$(hpsql "$h" 'SELECT 1')" "SELECT 1 from $h"
done
hpsql h1 "CREATE TABLE hello (host text, name text); INSERT INTO hello SELECT 'h1', current_setting('server_version')" > /dev/null
assert_eq h1 "$(hpsql h2 'SELECT host FROM hello')" "row written from h1, read from h2"
# the hosts' own loopback is theirs: nothing listens there
if host_run h1 env PGCONNECT_TIMEOUT=3 psql -X -q -t -A "${DB_URL}" -c 'SELECT 1' > /dev/null 2>&1; then
  fail "psql to 127.0.0.1 inside h1 reached a server (the host's loopback must be its own)"
fi

# a private server listening on the bridge too: it sees each host's own address
log "private PostgreSQL on the bridge (hosts_pg_private)"
SHARED_PG_URL=$DESKFS_TEST_PG_URL
hosts_pg_private
[[ $DESKFS_TEST_PG_URL != "$SHARED_PG_URL" ]] || fail "hosts_pg_private did not switch DESKFS_TEST_PG_URL to the private server"
PRIV_URL=$(hosts_pg_url "$(pg_fresh_db private)")
for h in "${HOSTS_NAMES[@]}"; do
  assert_eq "$(host_ip "$h")" "$(host_run "$h" env PGCONNECT_TIMEOUT=5 psql -X -q -t -A "$PRIV_URL" -c 'SELECT host(inet_client_addr())')" "client address of $h seen by the private server"
done
PRIV_PORT=${PRIV_URL##*"$HOSTS_BRIDGE_IP":}
PRIV_PORT=${PRIV_PORT%%/*}
! awk -v p="$PRIV_PORT" '$3 == p { f = 1 } END { exit !f }' "$T/hosts.fwd" || fail "hosts_pg_url forwarded the private server's port $PRIV_PORT"

# ---------------------------------------------------------------- S3 (HTTP) from the hosts
log "S3 endpoint from the hosts"
if have_s3; then
  EP=$(hosts_s3_endpoint)
  what="Garage"
elif [[ ${DESKFS_TEST_STRICT:-0} == 1 ]]; then
  fail "no S3 server (scripts/test.sh starts Garage)"
else
  log "no S3 server: checking the forwarder against a local HTTP server instead"
  mkdir -p "$T/www"
  echo "stand-in" > "$T/www/index.html"
  python3 -u -m http.server 0 --bind 127.0.0.1 --directory "$T/www" > "$T/http.log" 2>&1 &
  register_pid $!
  wait_for 10 grep -q 'Serving HTTP' "$T/http.log" || fail "python http.server did not start: $(cat "$T/http.log")"
  WWW_PORT=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$T/http.log" | head -n 1)
  EP=$(BENCH_S3_ENDPOINT=http://127.0.0.1:$WWW_PORT hosts_s3_endpoint)
  what="a local HTTP server (stand-in for Garage)"
fi
[[ $EP == "http://$HOSTS_BRIDGE_IP:"* ]] || fail "hosts_s3_endpoint printed $EP"
for h in "${HOSTS_NAMES[@]}"; do
  status=$(host_run "$h" python3 -c '
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=10)
    print(r.status, r.headers.get("Server", ""), r.read(200)[:60])
except urllib.error.HTTPError as e:  # an HTTP answer all the same (S3 says 403 without a signature)
    print(e.code, e.headers.get("Server", ""), e.read(200)[:60])
' "$EP/") || fail "no HTTP answer from $EP inside $h"
  [[ $status =~ ^[1-5][0-9][0-9]\  ]] || fail "no HTTP status from $EP inside $h: $status"
  log "$h: GET $EP/ -> $status ($what)"
done

# ---------------------------------------------------------------- a deskfs mount made inside h2
log "deskfs mount inside h2"
H2HOME=$T/home-h2
mkdir -p "$H2HOME"
DESKFS_HOME=$H2HOME ws_format hw
register_mount "$MNT"
mkdir -p "$MNT"
rc=0
host_run h2 env DESKFS_HOME="$H2HOME" timeout -k 5 60 "$DESKFS" mount hw "$MNT" > "$T/h2-mount.out" 2>&1 < /dev/null || rc=$?
((rc == 0)) || fail "deskfs mount inside h2 failed (exit $rc): $(head -c 2000 "$T/h2-mount.out")"
wait_for 5 is_mounted "$MNT" || fail "deskfs mount in h2 returned 0 but $MNT is not mounted in the root mount namespace"
is_alive "$MNT" || fail "$MNT is mounted but does not answer stat"
DAEMON=""
for pid in $(host_pids h2); do
  if has_fuse_fd "$pid"; then DAEMON=$pid; fi
done
[[ -n $DAEMON ]] || fail "no FUSE daemon found in h2's network namespace"
register_pid "$DAEMON"
assert_eq "$(readlink "/proc/$DAEMON/ns/net")" "$(stat -L -c 'net:[%i]' "/run/netns/$(host_netns h2)")" "network namespace of the daemon"
[[ "$(readlink "/proc/$DAEMON/ns/uts")" != "$(readlink /proc/self/ns/uts)" ]] || fail "the daemon runs in the root UTS namespace"
assert_eq "$(readlink /proc/self/ns/mnt)" "$(readlink "/proc/$DAEMON/ns/mnt")" "mount namespace of the daemon (must be the root one)"

head -c 200000 /dev/urandom > "$T/blob"
mkdir -p "$MNT/dir/sub"
cp "$T/blob" "$MNT/dir/blob"
echo "written from the root namespace" > "$MNT/dir/sub/note.txt"
mv "$MNT/dir/sub/note.txt" "$MNT/dir/note.txt"
assert_file_eq "$T/blob" "$MNT/dir/blob" "file written through the h2 mount, read back in the root namespace"
assert_eq "blob
note.txt
sub" "$(ls "$MNT/dir")" "ls of the mount from the root namespace"
assert_eq "written from the root namespace" "$(host_run h1 cat "$MNT/dir/note.txt")" "file read from h1 (other host, same mount namespace)"
assert_eq "$(sha "$T/blob")" "$(host_run h2 sha256sum "$MNT/dir/blob" | cut -d' ' -f1)" "file read from h2"
DESKFS_HOME=$H2HOME ws_umount "$MNT"
wait_for 10 eval '! pid_running '"$DAEMON" || fail "the daemon (pid $DAEMON) still runs after deskfs umount"
assert_file_eq "$T/blob" "$H2HOME/workspaces/hw/bucket/dir/blob" "dir/blob in the bucket dir after the umount"

# ---------------------------------------------------------------- partition and heal
log "partition h3"
host_partition h3
t0=$SECONDS
if host_run h3 env PGCONNECT_TIMEOUT=3 psql -X -q -t -A "$HOST_URL" -c 'SELECT 1' > "$T/h3-part.out" 2>&1; then
  fail "psql from the partitioned h3 succeeded"
fi
took=$((SECONDS - t0))
((took <= 8)) || fail "psql from the partitioned h3 took ${took}s to fail (connect_timeout=3)"
log "h3 partitioned: psql failed after ${took}s: $(head -n 1 "$T/h3-part.out")"
assert_eq 1 "$(hpsql h1 'SELECT 1')" "SELECT 1 from h1 while h3 is partitioned"
host_heal h3
assert_eq 1 "$(hpsql h3 'SELECT 1')" "SELECT 1 from h3 after host_heal"

# ---------------------------------------------------------------- tcpproxy.py round trips
log "tcpproxy.py delay check (200 x SELECT 1 through the proxy, delay 0 and 1 ms)"
{ echo '\timing on'; for _ in $(seq 1 200); do echo 'SELECT 1;'; done; } > "$T/select1.sql"
proxy_median() { # DELAY_MS: the median psql time (ms) of SELECT 1 through the proxy -> $T/median.DELAY_MS
  local out=$T/proxy.$1.out pid addr
  python3 "$LIB_DIR/tools/tcpproxy.py" --listen 127.0.0.1:0 --to "127.0.0.1:$PGPORT_OF_URL" --delay-ms "$1" > "$out" 2> "$T/proxy.$1.err" &
  pid=$!
  register_pid "$pid"
  wait_for 10 test -s "$out" || fail "tcpproxy.py did not print its address: $(cat "$T/proxy.$1.err")"
  addr=$(head -n 1 "$out")
  timeout -k 5 120 psql -X -q "${DB_URL%%@*}@$addr/${DB_URL##*/}" -f "$T/select1.sql" > "$T/psql.$1.out" 2>&1 ||
    fail "psql through tcpproxy.py (delay $1) failed: $(tail -n 3 "$T/psql.$1.out")"
  kill -TERM "$pid"
  local prc=0
  wait "$pid" || prc=$?
  ((prc == 0)) || fail "tcpproxy.py exited with $prc on SIGTERM (expected 0)"
  python3 -c '
import re, statistics, sys
v = [float(x) for x in re.findall(r"^Time: ([0-9.]+) ms", open(sys.argv[1]).read(), re.M)]
if len(v) != 200: sys.exit(f"expected 200 timings, got {len(v)}")
print(f"{statistics.median(v):.3f}")' "$T/psql.$1.out" > "$T/median.$1" 2> "$T/median.err" ||
    fail "psql through tcpproxy.py (delay $1): $(cat "$T/median.err")"
}
PGPORT_OF_URL=${DB_URL##*@127.0.0.1:}
PGPORT_OF_URL=${PGPORT_OF_URL%%/*}
proxy_median 0
proxy_median 1
m0=$(cat "$T/median.0")
m1=$(cat "$T/median.1")
diff_ms=$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.3f}")' "$m0" "$m1")
log "median per SELECT 1: delay 0 -> $m0 ms, delay 1 ms -> $m1 ms, difference $diff_ms ms (expected about 2)"
python3 -c 'import sys; sys.exit(0 if 1.5 <= float(sys.argv[1]) <= 4.5 else 1)' "$diff_ms" ||
  fail "tcpproxy.py --delay-ms 1 added $diff_ms ms per round trip (expected about 2 ms)"

# ---------------------------------------------------------------- cleanup at exit, when killed
pgrp_alive() { # PGID: some process of that process group exists
  python3 -c '
import os, sys
g = int(sys.argv[1])
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if os.getpgid(int(p)) == g:
                sys.exit(0)
        except OSError:
            pass
sys.exit(1)' "$1"
}
log "cleanup of a killed test (child: 2 hosts, a forwarder, a process and a mount inside h1)"
cat > "$T/child-hosts.sh" <<EOF
source "$ROOT/tests/lib.sh"
source "$ROOT/tests/hosts.sh"
hosts_up 2
hosts_forward $PGPORT_OF_URL
mkdir -p "\$MNT"
register_mount "\$MNT"
ws_format cw
host_run h1 env DESKFS_HOME="\$DESKFS_HOME" "\$DESKFS" mount cw "\$MNT" > "\$T/m.out" 2>&1 < /dev/null
wait_for 5 is_mounted "\$MNT" || fail "child: not mounted"
echo hi > "\$MNT/x"
host_run h2 sleep 300 &
{ echo "T \$T"; echo "MNT \$MNT"; echo "BR \$HOSTS_BRIDGE"; echo "NS \$(host_netns h1) \$(host_netns h2)"
  echo "FWD \$(cut -d' ' -f1 "\$T/hosts.fwd")"; } > "$T/child.info"
sleep 300 &
wait \$!
EOF
DESKFS_TEST_TMPDIR=$T bash "$T/child-hosts.sh" > "$T/child.log" 2>&1 &
CHILD=$!
register_pid "$CHILD"
wait_for 60 test -s "$T/child.info" || fail "the child test did not get its hosts up: $(tail -n 20 "$T/child.log")"
sleep 0.5
C_MNT=$(awk '$1 == "MNT" { print $2 }' "$T/child.info")
C_BR=$(awk '$1 == "BR" { print $2 }' "$T/child.info")
read -r -a C_NS <<< "$(awk '$1 == "NS" { $1 = ""; print }' "$T/child.info")"
C_FWD=$(awk '$1 == "FWD" { print $2 }' "$T/child.info")
is_mounted "$C_MNT" || fail "the child's mount $C_MNT is not there before the kill"
[[ -n $(ip netns pids "${C_NS[1]}" 2> /dev/null) ]] || fail "the child's process in h2 is not there before the kill"
kill -TERM "$CHILD"
crc=0
wait "$CHILD" || crc=$?
((crc == 143)) || fail "the child exited with $crc after SIGTERM (expected 143): $(tail -n 20 "$T/child.log")"
not_mounted "$C_MNT" || fail "the child's mount $C_MNT is left after its exit"
! ip link show "$C_BR" > /dev/null 2>&1 || fail "the child's bridge $C_BR is left"
for ns in "${C_NS[@]}"; do [[ ! -e /run/netns/$ns ]] || fail "the child's namespace $ns is left"; done
! pid_running "$C_FWD" || fail "the child's socat (pid $C_FWD) still runs"
! pgrp_alive "$C_FWD" || fail "processes of the child's socat (process group $C_FWD) still run"

# ---------------------------------------------------------------- hosts_down leaves nothing
log "hosts_down"
FWD_PIDS=$(cut -d' ' -f1 "$T/hosts.fwd")
BR=$HOSTS_BRIDGE
hosts_down
! ip link show "$BR" > /dev/null 2>&1 || fail "bridge $BR is left after hosts_down"
left=$(ip netns list | awk -v p="$TAG_NS-" 'index($1, p) == 1 { print $1 }')
[[ -z $left ]] || fail "namespaces left after hosts_down: $left"
left=$(ip -o link show | awk -F': ' '{ print $2 }' | grep -c "^${BR%b}v" || true)
[[ $left == 0 ]] || fail "$left veth(s) ${BR%b}v* left after hosts_down"
for pid in $FWD_PIDS; do
  ! pid_running "$pid" || fail "socat pid $pid still runs after hosts_down"
done
not_mounted "$MNT" || fail "$MNT is still mounted"
log "hosts harness OK"
