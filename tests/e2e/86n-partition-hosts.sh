#!/usr/bin/env bash
# 86n-partition-hosts: network partitions between the hosts of one workspace. Three "hosts"
# (network namespaces h1, h2, h3 of tests/hosts.sh), each with its own daemon, DESKFS_HOME,
# cache dir and mount point, share a workspace on PostgreSQL (a private server on the
# bridge, op_timeout=2 in the URL) and Garage; --lease 3, --remote-wait 4. Files are written
# in the root namespace through the mounts; tests/tools/holdfiles.py holds descriptors open
# across the cuts. h3 is the host that gets cut off.
#   1. One partition with files open for writing on h3: unclosed writes in A, B, C (files
#      of h1) and in a new file N, and U (3 MB, in the bucket) held open for reading. h3 is
#      cut off (link down): it keeps writing into A, B, N (its journal); its fsync of C
#      fails with EIO within op_timeout + 3 s; its close of B fails. Meanwhile h1 rewrites
#      A and B, writes new files, removes E, renames the tree T (20 files) to T2; h2
#      removes U. h1 expires h3 (lease), h3 heals, notices the fence, writes more into A
#      and closes everything. Then A and B hold h1's bytes, each with one
#      NAME.deskfs-conflict-h3-UNIXTIME holding all of h3's writes; C and N hold h3's
#      bytes, no conflict copy. Also P: h3 mounts first, alone, and opens P for writing
#      through FUSE passthrough (its writes bypass the daemon) before the others join; P
#      must end as A does (its writes under the lost lease, first seen after h3
#      registered anew, were committed over h1's content before the last look's session
#      counted). DESKFS_PART_PASSTHROUGH=0 leaves P out.
#   2. An ambiguous commit: h3 closes a new file F while PostgreSQL's replies to h3 are
#      dropped (host_block ... replies): the commit is applied, h3's close gets EIO; then h3
#      is cut off from PostgreSQL until its lease is lost, and healed. F holds h3's bytes
#      on h1, no conflict copy is made (the newer version is h3's own), F uploads.
#   3. Flapping: tests/tools/flapload.py writes on h1 and on h3 for 16 s (own files
#      overwritten, fsynced, saved by rename, removed; shared files written by both; up to
#      2 MB: uploads are in flight at the cuts) while h3 is cut off 4 times (3.8, 1.0, 4.5,
#      1.2 s: two past the lease). h3 still holds U (removed in part 1) and reads it whole
#      afterwards: its open stayed recorded through every fence, so no mount purged it.
#      `deskfs sync` finishes on every host and flapload.py check passes on every mount:
#      each file holds what its writer last had acknowledged (or what a later failed op
#      may have left), conflict copies hold real writes, nothing unreadable.
#   4. h3 cut off from the bucket only (host_block on Garage's port; PostgreSQL reachable,
#      no fence) while its upload of X (3 MB, throttled to 2 Mbit/s) is in flight: h3
#      closes Y, removes K, renames dir D; an open of X on h1 fails with EIO after about
#      remote-wait; h1 replaces X. After the heal the bucket holds h1's X (the late put of
#      h3's X is not the last word), Y, D2, no K.
#   5. All mounts sync: the three trees are equal and equal what the bucket holds (key by
#      key, sha256); every fence of h3 was an expiry by another mount (h3's fences count
#      equals the expiries h1 and h2 logged, and h3 never expired a session of its own:
#      two threads finding the session gone must not both register one); every mount
#      unmounts; the sessions, locks, open-file records and pending uploads are empty;
#      `deskfs fsck --check-bucket` with each host's cache dir finds 0 problems.
# Checks that fail are reported as "FAILED CHECK: ..." and the test goes on; it fails at
# the end with the list. Seed of part 3: DESKFS_PART_SEED (printed).
# e2e-cost: 70
# e2e-timeout: 600
# shellcheck disable=SC2016
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../hosts.sh"
need_deskfs
need_hosts
need_pg
need_s3
need_cmd psql python3 tc

HOLD=$ROOT/tests/tools/holdfiles.py
FLAP=$ROOT/tests/tools/flapload.py
[[ -f $HOLD && -f $FLAP ]] || fail "missing $HOLD or $FLAP"
# Why these values: a lease of 3 s (heartbeat 0.5 s) makes a cut of 4 s lose it; a
# database call of a cut-off host fails after 2 s (op_timeout) so its daemon keeps
# answering; an open waits 4 s for content only another host holds.
LEASE=3
REMOTE_WAIT=4
OPT=2
WS=part
HOSTS=(h1 h2 h3)
SEED=${DESKFS_PART_SEED:-$RANDOM}
PT_CASE=${DESKFS_PART_PASSTHROUGH:-1}
declare -A HHOME HMNT HCACHE HLOG HPID
T_START=$SECONDS

BAD=()
bad() {
  printf 'FAILED CHECK: %s\n' "$*" >&2
  BAD+=("$*")
}

# ---------------------------------------------------------------- helpers
hd() { # HOST ARGS...: deskfs inside HOST
  local h=$1
  shift
  host_run "$h" env DESKFS_HOME="${HHOME[$h]}" timeout -k 5 "${DFS_TIMEOUT:-120}" "$DESKFS" "$@" < /dev/null
}
hd_ok() {
  local h=$1 out rc=0
  shift
  out=$(hd "$h" "$@" 2>&1) || rc=$?
  ((rc == 0)) || fail "deskfs $* on $h failed (exit $rc): $out"
}
hmount() { # HOST: mounts the workspace in HOST; sets HPID and HLOG
  local h=$1 out=$T/mount.$1.out
  mkdir -p "${HMNT[$h]}"
  register_mount "${HMNT[$h]}"
  hd "$h" mount "$WS" "${HMNT[$h]}" --cache-dir "${HCACHE[$h]}" --lease "$LEASE" --remote-wait "$REMOTE_WAIT" > "$out" 2>&1 ||
    fail "deskfs mount on $h failed: $(head -c 2000 "$out")"
  wait_for 5 is_mounted "${HMNT[$h]}" || fail "${HMNT[$h]} is not mounted after deskfs mount on $h"
  HPID[$h]=$(sed -n 's/.*daemon pid \([0-9]*\).*/\1/p' "$out")
  HLOG[$h]=$(sed -n 's/.*, log \(.*\))$/\1/p' "$out")
  [[ -n ${HPID[$h]} && -n ${HLOG[$h]} ]] || fail "no daemon pid and log in the output of deskfs mount on $h: $(cat "$out")"
  register_pid "${HPID[$h]}"
}
hlive() { # HOST PYEXPR: PYEXPR on `l`, the live mount of HOST's `deskfs status --json`
  DFS_TIMEOUT=30 hd "$1" status "$WS" --json > "$T/status.$1.json" 2> "$T/status.$1.err" ||
    { echo "status-failed: $(head -c 300 "$T/status.$1.err")"; return 1; }
  python3 - "$T/status.$1.json" "$2" <<'PY'
import json, sys
live = [m["live"] for m in json.load(open(sys.argv[1])).get("mounts", []) if m.get("live")]
if len(live) != 1:
    print("status-failed: %d live mounts" % len(live))
    sys.exit(1)
l = live[0]
print(eval(sys.argv[2]))
PY
}
pgq() { PGCONNECT_TIMEOUT=10 timeout -k 5 60 psql -X -q -t -A -v ON_ERROR_STOP=1 "$DESKFS_TEST_PG_ADMIN dbname=$DB_NAME" -c "$1"; }
plain() { sed 's/\x1b\[[0-9;]*m//g' "$@"; }
# expiries: how many sessions of h3 h1 and h2 expired for a missed lease (from their logs)
expiries() { plain "${HLOG[h1]}" "${HLOG[h2]}" | grep -c 'mount session expired (missed its lease).*host=h3' || true; }
fences() { hlive h3 'l["fences"]["count"]' 2> /dev/null || echo "?"; }
# await_fence N: h3 reports at least N fences (30 s)
await_fence() {
  local f
  for _ in $(seq 1 60); do
    f=$(fences)
    [[ $f =~ ^[0-9]+$ ]] && ((f >= $1)) && return 0
    sleep 0.5
  done
  bad "h3 does not report fence $1 (status fences.count: $f)"
}
rnd() { head -c "$2" /dev/urandom > "$T/$1"; }
# compose OUT BASE|- OFF SRC [OFF SRC...]: BASE with the SRC files written at OFF
compose() {
  python3 - "$@" <<'PY'
import sys
out, base, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
d = bytearray(open(base, "rb").read()) if base != "-" else bytearray()
for i in range(0, len(rest), 2):
    off, src = int(rest[i]), open(rest[i + 1], "rb").read()
    d.extend(b"\0" * max(0, off + len(src) - len(d)))
    d[off:off + len(src)] = src
open(out, "wb").write(d)
PY
}
# is_bytes FILE REF WHAT: FILE (on a mount) holds exactly REF's bytes
is_bytes() {
  local got
  got=$(timeout -k 5 60 sha256sum < "$1" 2>&1 | cut -c1-64) || got="unreadable: $got"
  [[ $got == "$(sha "$2")" ]] || bad "$3: $1 holds ${got:0:80}, expected the bytes of ${2##*/}"
}
# conflict_of NAME REF WHAT: exactly one NAME.deskfs-conflict-h3-UNIXTIME on h1, with REF's bytes
conflict_of() {
  local c
  c=$(cd "$M1" && compgen -G "$1.deskfs-conflict-*") || c=""
  if [[ -z $c ]]; then
    bad "$3: no $1.deskfs-conflict-* on h1 ($(ls "$M1" | tr '\n' ' '))"
  elif [[ $(wc -l <<< "$c") != 1 || ! $c =~ ^$1\.deskfs-conflict-h3-[0-9]+$ ]]; then
    bad "$3: conflict copies '$(tr '\n' ' ' <<< "$c")' (expected one $1.deskfs-conflict-h3-UNIXTIME)"
  else
    is_bytes "$M1/$c" "$2" "$3 (conflict copy $c)"
  fi
}
no_conflict_of() {
  local c
  c=$(cd "$M1" && compgen -G "$1.deskfs-conflict-*") || c=""
  [[ -z $c ]] || bad "$2: a conflict copy $c was made"
}
# holdfiles.py on h3's mount: h3c CMD... (answer in $ANS)
H3N=0
h3c() {
  H3N=$((H3N + 1))
  echo "$H3N $*" > "$T/hold.fifo"
  if wait_for 60 grep -q "^$H3N " "$T/hold.log"; then
    ANS=$(grep "^$H3N " "$T/hold.log" | cut -d' ' -f2-)
  else
    ANS="no answer in 60 s"
  fi
}
h3c_ok() { # CMD...: must answer OK
  h3c "$@"
  [[ $ANS == OK* ]] || bad "on h3: $* -> $ANS"
}
tree() { # DIR: "path size sha256" per file, sorted (.deskfs left out)
  python3 - "$1" <<'PY'
import hashlib, os, sys
root, out = sys.argv[1], []
for dp, dns, fns in os.walk(root):
    dns[:] = [d for d in dns if not (dp == root and d == ".deskfs")]
    for f in fns:
        p = os.path.join(dp, f)
        try:
            d = open(p, "rb").read()
            out.append("%s %d %s" % (os.path.relpath(p, root), len(d), hashlib.sha256(d).hexdigest()))
        except OSError as e:
            out.append("%s unreadable %d" % (os.path.relpath(p, root), e.errno))
print("\n".join(sorted(out)))
PY
}
bucket_tree() { # the same from the bucket (tests/s3.py; directory markers left out)
  local k rel
  s3_keys | while IFS=$'\t' read -r _ k; do
    rel=${k#"$S3_PREFIX"/}
    [[ $rel == .deskfs/* || $rel == */ ]] && continue
    s3_get "$k" > "$T/obj" || { echo "$rel get-failed"; continue; }
    echo "$rel $(stat -c %s "$T/obj") $(sha "$T/obj")"
  done | sort
}

# ---------------------------------------------------------------- hosts, format, attach
hosts_up 3
hosts_pg_private
HOST_URL=$(hosts_pg_url "$(pg_fresh_db part)")
re='^postgres://([^:@/]+)(:[^@/]*)?@([^/]+)/([^?]+)'
[[ $HOST_URL =~ $re ]] || fail "cannot parse the PostgreSQL URL for the hosts: ${HOST_URL%%:*}://…"
DB_NAME=${BASH_REMATCH[4]}
PG_PORT_H=${BASH_REMATCH[3]##*:}
META="postgres://${BASH_REMATCH[1]}@${BASH_REMATCH[3]}/$DB_NAME?schema=ws&op_timeout=$OPT"
EP=$(hosts_s3_endpoint)
S3_PORT_H=${EP##*:}
for h in "${HOSTS[@]}"; do
  HHOME[$h]=$T/home-$h HMNT[$h]=$T/m-$h HCACHE[$h]=$T/cache-$h
  mkdir -p "${HHOME[$h]}"
done
M1=${HMNT[h1]} M2=${HMNT[h2]} M3=${HMNT[h3]}
hd_ok h3 format "$WS" --meta "$META" --bucket "$(s3_url)" --endpoint "$EP" --region "$BENCH_S3_REGION"
hd_ok h1 attach "$WS" --meta "$META"
hd_ok h2 attach "$WS" --meta "$META"
mkfifo "$T/hold.fifo"
: > "$T/hold.log"
python3 "$HOLD" "$T/hold.fifo" "$T/hold.log" > "$T/hold.err" 2>&1 < /dev/null &
register_pid $!

# ---------------------------------------------------------------- 1. one partition, open writers
log "=== 1. h3 cut off with files open for writing"
for f in P0 A0 B0 C0 E0 K0 P3a A3a B3a C3a N3a P3b A3b B3b N3b A3c P1 A1 B1 R3; do rnd "$f" $((100000 + RANDOM % 50000)); done
rnd U0 3000000
hmount h3
PF=(A B)
if ((PT_CASE)); then
  PF+=(P)
  cp "$T/P0" "$M3/P"
  hd_ok h3 sync "$WS"   # (else h1's O_TRUNC open of P would wait for h3 to upload P0)
  h3c_ok open P "$M3/P" rw
  h3c_ok pwrite P 0 "$T/P3a"
  PT=$(hlive h3 'l.get("passthrough_opens", 0)') || PT=0
  [[ $PT =~ ^[1-9] ]] || log "NOTE: P was not opened through passthrough (passthrough_opens=$PT): its check is an ordinary one"
fi
hmount h1
hmount h2
for f in A B C E K U; do cp "$T/${f}0" "$M1/$f"; done
mkdir "$M1/T" "$M1/D"
for i in $(seq 1 20); do echo "tree file $i" > "$M1/T/f$i"; done
for i in 1 2 3; do echo "dir file $i" > "$M1/D/g$i"; done
hd_ok h1 sync "$WS"
for f in A B C U; do wait_for 5 test -e "$M3/$f" || fail "h3 does not see $f"; done
h3c_ok open A "$M3/A" rw
h3c_ok pwrite A 0 "$T/A3a"
h3c_ok open B "$M3/B" rw
h3c_ok pwrite B 0 "$T/B3a"
h3c_ok open C "$M3/C" rw
h3c_ok pwrite C 0 "$T/C3a"
h3c_ok open N "$M3/N" rwc
h3c_ok pwrite N 0 "$T/N3a"
h3c_ok open U "$M3/U" r
h3c_ok pread U 1000000 4096
host_partition h3
for f in "${PF[@]}" N; do h3c_ok pwrite "$f" 200000 "$T/${f}3b"; done
h3c fsync C
[[ $ANS =~ ^ERR\ EIO\ ([0-9.]+)$ ]] && awk -v t="${BASH_REMATCH[1]}" -v m=$((OPT + 3)) 'BEGIN { exit !(t <= m) }' ||
  bad "fsync of C on the cut-off h3: '$ANS' (expected EIO within op_timeout $OPT s + 3 s)"
h3c close B
log "close of B on the cut-off h3: $ANS"
for f in "${PF[@]}"; do cp "$T/${f}1" "$M1/$f" || bad "h1 cannot rewrite $f while h3 is cut off"; done
for i in 1 2 3; do echo "h1 file $i" > "$M1/new$i"; done
rm "$M1/E"
mv "$M1/T" "$M1/T2"
rm "$M2/U"
echo "h2 file" > "$M2/new-h2"
wait_for 20 eval '(($(expiries) >= 1))' || bad "neither h1 nor h2 expired h3's session within 20 s of the cut"
host_heal h3
await_fence 1
h3c_ok pwrite A 250000 "$T/A3c"
for f in A C N; do h3c_ok close "$f"; done
if ((PT_CASE)); then h3c_ok close P; fi
cp "$T/R3" "$M3/R3"
compose "$T/A3" "$T/A0" 0 "$T/A3a" 200000 "$T/A3b" 250000 "$T/A3c"
compose "$T/B3" "$T/B0" 0 "$T/B3a" 200000 "$T/B3b"
compose "$T/C3" "$T/C0" 0 "$T/C3a"
compose "$T/N3" - 0 "$T/N3a" 200000 "$T/N3b"
if ((PT_CASE)); then compose "$T/P3" "$T/P0" 0 "$T/P3a" 200000 "$T/P3b"; fi
# (B's close failed while h3 was cut off: its commit is retried every 2 s)
for f in "${PF[@]}"; do wait_for 10 eval 'compgen -G "$M1/$f.deskfs-conflict-*" > /dev/null' || true; done
for f in "${PF[@]}"; do
  is_bytes "$M1/$f" "$T/${f}1" "$f after the heal (h1 rewrote it while h3's lease was lost)"
  conflict_of "$f" "$T/${f}3" "$f: h3's writes made under the lost lease"
done
is_bytes "$M1/C" "$T/C3" "C after the heal (changed by nobody else: h3's writes commit)"
no_conflict_of C "C (changed by nobody else)"
is_bytes "$M1/N" "$T/N3" "N (created by h3, written while it was cut off)"
[[ ! -e $M1/E && ! -e $M1/T && $(ls "$M1/T2" | wc -l) == 20 ]] || bad "E, T, T2 on h1 after the heal: $(ls "$M1" | tr '\n' ' ')"
log "part 1: $((SECONDS - T_START)) s"

# ---------------------------------------------------------------- 2. an ambiguous commit
log "=== 2. h3 closes F while PostgreSQL's replies to it are dropped"
rnd F3 300000
h3c_ok open F "$M3/F" rwc
h3c_ok pwrite F 0 "$T/F3"
F_INO=$(stat -c %i "$M3/F")
e0=$(expiries)
host_block h3 "$PG_PORT_H" replies
h3c close F
# then h3's requests too (no gap: a commit retried in between would succeed)
host_block h3 "$PG_PORT_H" requests
t_block=$SECONDS
row=$(pgq "SELECT size FROM ws.inodes WHERE ino = $F_INO")
log "close of F on h3 without replies: $ANS; F's size in the database: $row"
[[ $ANS == ERR* && $row == 300000 ]] || log "NOTE: the close was not an ambiguous commit (answer $ANS, size $row): part 2 proves less"
wait_for 20 eval '(($(expiries) > e0))' || bad "h3 cut off from PostgreSQL was not expired within 20 s"
# Every request h3 sent meanwhile must have timed out before the heal: a reply PostgreSQL
# sends again after it would still arrive, and the commit succeed.
sleep $((OPT + 2 - (SECONDS - t_block) > 0 ? OPT + 2 - (SECONDS - t_block) : 0))
# (what h3 sent while only the replies were dropped was applied too: its release's commit)
v_heal=$(pgq "SELECT data_version FROM ws.inodes WHERE ino = $F_INO")
log "F before the heal: version $v_heal"
host_unblock h3
await_fence 2
# h3 commits the writes of the failed close again (every 2 s), now under its new session
wait_for 15 eval '(($(pgq "SELECT data_version FROM ws.inodes WHERE ino = $F_INO") > v_heal)) || compgen -G "$M1/F.deskfs-conflict-*" > /dev/null' ||
  bad "h3 did not commit F's writes again within 15 s of the heal (F's row: $(pgq "SELECT data_version, dirty FROM ws.inodes WHERE ino = $F_INO"))"
no_conflict_of F "F (written by h3 alone; the newer version is h3's own commit)"
is_bytes "$M1/F" "$T/F3" "F on h1 (closed on h3 by a commit whose answer was lost, then fenced)"
is_bytes "$M3/F" "$T/F3" "F on h3 (closed there by a commit whose answer was lost, then fenced)"
log "part 2: $((SECONDS - T_START)) s"

# ---------------------------------------------------------------- 3. flapping
log "=== 3. flapping: h3 cut off 4 times while h1 and h3 write (seed $SEED)"
python3 "$FLAP" run h1 "$M1" "$T/j.h1" 16 "$SEED" > "$T/flap.h1.out" 2>&1 &
F1=$!
python3 "$FLAP" run h3 "$M3" "$T/j.h3" 16 "$((SEED + 1))" > "$T/flap.h3.out" 2>&1 &
F3=$!
register_pid $F1
register_pid $F3
for cut in "1.5 3.8" "1.5 1.0" "2.0 4.5" "1.5 1.2"; do
  read -r gap len <<< "$cut"
  sleep "$gap"
  host_partition h3
  sleep "$len"
  host_heal h3
done
wait "$F1" || bad "flapload on h1 failed: $(tail -n 3 "$T/flap.h1.out")"
wait "$F3" || bad "flapload on h3 failed: $(tail -n 3 "$T/flap.h3.out")"
for h in h1 h3; do
  log "$h: $(cat "$T/flap.$h.out"): $(python3 -c '
import collections, json, sys
c = collections.Counter()
for l in open(sys.argv[1]):
    o = json.loads(l)
    c["%s %s%s" % (o["op"], o["res"], "/" + o["stage"] if "stage" in o else "")] += 1
print(", ".join("%s %d" % kv for kv in sorted(c.items())))' "$T/j.$h")"
done
h3c read U
[[ $ANS == "OK 3000000 $(sha "$T/U0") "* ]] ||
  bad "U (held open on h3 since part 1, removed by h2 while h3 was cut off) read after the flapping: $ANS"
h3c_ok close U
for h in h1 h2 h3; do
  out=$(DFS_TIMEOUT=50 hd "$h" sync "$WS" --timeout 40 2>&1) || bad "deskfs sync on $h after the flapping: $(tail -n 1 <<< "$out")"
done
for h in h1 h2 h3; do
  out=$(timeout -k 5 120 python3 "$FLAP" check "${HMNT[$h]}" "$T/j.h1" "$T/j.h3" 2>&1) ||
    bad "flapload check of $h's mount: $(grep -v '^checked' <<< "$out" | head -n 3 | tr '\n' ' ')"
  log "flapload check $h: $(tail -n 1 <<< "$out")"
done
log "part 3: $((SECONDS - T_START)) s"

# ---------------------------------------------------------------- 4. cut off from the bucket only
log "=== 4. h3 cut off from the bucket only, an upload in flight"
rnd X3 3000000
rnd X1 200000
rnd Y3 150000
f0=$(fences)
host_throttle h3 "$S3_PORT_H" 2mbit
cp "$T/X3" "$M3/X"
sleep 2
host_block h3 "$S3_PORT_H"
t_cut=$SECONDS
cp "$T/Y3" "$M3/Y" || bad "close of Y on h3 (cut off from the bucket only) failed"
rm "$M3/K" || bad "rm K on h3 (cut off from the bucket only) failed"
mv "$M3/D" "$M3/D2" || bad "mv D D2 on h3 (cut off from the bucket only) failed"
r=$(python3 -c '
import errno, sys, time
t = time.monotonic()
try:
    open(sys.argv[1], "rb").read()
    print("OK %.1f" % (time.monotonic() - t))
except OSError as e:
    print("%s %.1f" % (errno.errorcode.get(e.errno), time.monotonic() - t))' "$M1/X")
[[ $r =~ ^EIO\ ([0-9.]+)$ ]] && awk -v t="${BASH_REMATCH[1]}" -v a=$((REMOTE_WAIT - 1)) -v b=$((REMOTE_WAIT + 6)) 'BEGIN { exit !(t >= a && t <= b) }' ||
  bad "open of X on h1 while its only holder h3 cannot reach the bucket: '$r' (expected EIO after about $REMOTE_WAIT s)"
rm "$M1/X"
cp "$T/X1" "$M1/X"
out=$(DFS_TIMEOUT=50 hd h1 sync "$WS" --timeout 40 2>&1) || bad "deskfs sync on h1 while h3 cannot reach the bucket: $(tail -n 1 <<< "$out")"
sleep $((8 - (SECONDS - t_cut) > 0 ? 8 - (SECONDS - t_cut) : 0))
host_unblock h3
[[ $(fences) == "$f0" ]] || bad "h3 was fenced while only the bucket was cut off (fences $f0 -> $(fences))"
log "part 4: $((SECONDS - T_START)) s"

# ---------------------------------------------------------------- 5. everything converges
log "=== 5. sync, compare, unmount, fsck"
for h in h3 h1 h2; do
  out=$(DFS_TIMEOUT=70 hd "$h" sync "$WS" --timeout 60 2>&1) || bad "deskfs sync on $h: $(tail -n 1 <<< "$out")"
done
is_bytes "$M1/X" "$T/X1" "X on h1 (h1 replaced it while h3's upload was held)"
is_bytes "$M1/Y" "$T/Y3" "Y (closed on h3 while it could not reach the bucket)"
[[ ! -e $M1/K && ! -e $M1/D && -f $M1/D2/g3 ]] || bad "K, D, D2 after h3's remove and rename without the bucket: $(ls "$M1" | tr '\n' ' ')"
for h in h1 h2 h3; do tree "${HMNT[$h]}" > "$T/tree.$h"; done
for h in h2 h3; do
  diff "$T/tree.h1" "$T/tree.$h" > "$T/diff.$h" 2>&1 || bad "the trees of h1 and $h differ: $(head -n 6 "$T/diff.$h" | tr '\n' ' ')"
done
bucket_tree > "$T/tree.bucket"
diff "$T/tree.h1" "$T/tree.bucket" > "$T/diff.bucket" 2>&1 ||
  bad "the bucket does not hold exactly the files of the mounts: $(head -n 8 "$T/diff.bucket" | tr '\n' ' ')"
log "$(wc -l < "$T/tree.h1") files, $(grep -c deskfs-conflict "$T/tree.h1") conflict copies, the same in the bucket"
nf=$(fences) ne=$(expiries)
self=$(plain "${HLOG[h3]}" | grep -c "mount session expired (its daemon is gone).*host=h3" || true)
# A registration whose answer a cut dropped may have been applied: the retry expires it as
# "its daemon is gone" (same host and pid). Only those may be expired by h3 itself.
failed=$(plain "${HLOG[h3]}" | grep -c "cannot register a new session" || true)
log "h3: $nf fences; sessions of h3 expired by h1 and h2: $ne; expired by h3 itself: $self; registrations failed: $failed"
[[ $nf == "$ne" && $self -le $failed ]] ||
  bad "h3 registered more sessions than it lost: $nf fences for $ne expiries, $self of its own sessions expired by h3 itself ('its daemon is gone') after $failed failed registrations: two threads re-registered at once"
for h in h3 h2 h1; do
  out=$(DFS_TIMEOUT=60 hd "$h" umount "${HMNT[$h]}" 2>&1) || bad "deskfs umount on $h: $out"
  wait_for 10 not_mounted "${HMNT[$h]}" || { bad "${HMNT[$h]} still mounted after deskfs umount on $h"; force_unmount "${HMNT[$h]}" || true; }
done
for t in sessions locks open_files pending; do
  n=$(pgq "SELECT count(*) FROM ws.$t") || n="?"
  if [[ $t == open_files && $n != 0 ]]; then
    # Known leak (not checked): an open counted while h3's session was already expired
    # (between the expiry and h3 noticing it) stays recorded under that dead session.
    log "NOTE: ws.open_files keeps $n record(s) of sessions that are gone: $(pgq "SELECT ino || ' session ' || session FROM ws.open_files LIMIT 3" | tr '\n' ' ')"
    n=$(pgq "SELECT count(*) FROM ws.open_files WHERE session <= 0 OR session IN (SELECT id FROM ws.sessions)") || n="?"
  fi
  [[ $n == 0 ]] || bad "ws.$t holds $n row(s) after every mount was unmounted: $(pgq "SELECT * FROM ws.$t LIMIT 3" | tr '\n' ' ' | cut -c1-300) (held opens: $(pgq "SELECT key || '=' || value FROM ws.kv WHERE key LIKE 'held_opens.%'" | tr '\n' ' '))"
done
for h in h1 h2 h3; do
  out=$(hd "$h" fsck "$WS" --cache-dir "${HCACHE[$h]}" --check-bucket 2>&1) || bad "deskfs fsck on $h: $(grep -v '^note' <<< "$out" | tail -n 3 | tr '\n' ' ')"
  log "fsck $h: $(tail -n 1 <<< "$out")"
done
log "runtime $((SECONDS - T_START)) s"
if ((${#BAD[@]})); then
  printf '  failed: %s\n' "${BAD[@]}" >&2
  fail "${#BAD[@]} check(s) failed; first: ${BAD[0]}"
fi
log "PASS"
