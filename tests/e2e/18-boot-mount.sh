#!/usr/bin/env bash
# 18-boot-mount: deskfs mounted the ways a machine mounts at boot.
#   - fstab: `/sbin/mount.fuse.deskfs` (a symlink to deskfs, made here when missing and
#     removed after) lets mount(8) mount a line of type fuse.deskfs — `mount -T FSTAB DIR`
#     with a test fstab (options cache_dir=, home=, noatime, _netdev, nofail,
#     x-systemd.requires=): mounted with type fuse.deskfs in the mount table (`findmnt -t fuse.deskfs`), written,
#     `umount DIR` unmounts and the daemon exits;
#     mounted again, the file is there; `mount -t fuse.deskfs NAME DIR -o …` likewise; a
#     line with an unknown option fails with one line naming it, nothing mounted;
#   - systemd: `deskfs systemd-unit` prints a unit (checked by systemd-analyze verify when
#     the machine has it); its ExecStart runs with NOTIFY_SOCKET set and says READY=1
#     once the mount is up; ExecStop unmounts (the ExecStart process exits 0); started
#     again (a restart) the written file is there.
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd mount umount python3

HELPER=/sbin/mount.fuse.deskfs
if [[ ! -e $HELPER ]]; then
  ln -s "$DESKFS" "$HELPER" || skip_or_fail "cannot install $HELPER (need root)"
  on_exit "rm -f '$HELPER'"
elif [[ $(readlink -f "$HELPER") != $(readlink -f "$DESKFS") ]]; then
  log "note: $HELPER is another deskfs ($(readlink -f "$HELPER")); using it"
fi

daemon_gone() { # NAME: no live daemon of the workspace is recorded
  local f
  for f in "$DESKFS_HOME/workspaces/$1/run"/*.json; do
    [[ -e $f ]] || continue
    kill -0 "$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$f")" 2> /dev/null && return 1
  done
  return 0
}

# ---- fstab
ws_format fst
mkdir -p "$T/m-fst"
register_mount "$T/m-fst"
echo "fst $T/m-fst fuse.deskfs defaults,_netdev,nofail,x-systemd.requires=network-online.target,cache_dir=$T/cache-fst,home=$DESKFS_HOME,noatime 0 0" > "$T/fstab"
mount -T "$T/fstab" "$T/m-fst" || fail "mount -T fstab $T/m-fst failed"
is_alive "$T/m-fst" || fail "the fstab mount does not answer"
grep -q "^deskfs:fst $T/m-fst fuse.deskfs " /proc/self/mounts || fail "not a mount of type fuse.deskfs: $(grep m-fst /proc/self/mounts)"
assert_eq "$T/m-fst" "$(findmnt -n -o TARGET -t fuse.deskfs "$T/m-fst")" "findmnt -t fuse.deskfs"
[[ -d $T/cache-fst/staging ]] || fail "cache_dir= was not used"
echo "from fstab" > "$T/m-fst/f"
umount "$T/m-fst" || fail "umount $T/m-fst failed"
not_mounted "$T/m-fst" || fail "still mounted after umount"
wait_for 30 daemon_gone fst || fail "the daemon did not exit after umount"
mount -T "$T/fstab" "$T/m-fst" || fail "the second mount -T failed"
assert_eq "from fstab" "$(cat "$T/m-fst/f")" "the file after umount and mount"
umount "$T/m-fst"
wait_for 30 daemon_gone fst || fail "the daemon did not exit after the second umount"
# mount -t with -o
mount -t fuse.deskfs fst "$T/m-fst" -o "cache_dir=$T/cache-fst,home=$DESKFS_HOME" || fail "mount -t fuse.deskfs failed"
assert_eq "from fstab" "$(cat "$T/m-fst/f")" "the file through mount -t"
umount "$T/m-fst"
wait_for 30 daemon_gone fst || fail "the daemon did not exit after the third umount"
# A bad option: one line naming it, nothing mounted.
echo "fst $T/m-fst fuse.deskfs cachedir=$T/x,home=$DESKFS_HOME 0 0" > "$T/fstab-bad"
rc=0
mount -T "$T/fstab-bad" "$T/m-fst" > "$T/bad.out" 2>&1 || rc=$?
((rc != 0)) || fail "a line with an unknown option mounted"
grep -q "unknown mount option 'cachedir=$T/x'" "$T/bad.out" || fail "the bad option is not named: $(cat "$T/bad.out")"
not_mounted "$T/m-fst" || fail "mounted despite the bad option"

# ---- systemd
ws_format sysd
mkdir -p "$T/m-sysd"
register_mount "$T/m-sysd"
"$DESKFS" systemd-unit sysd "$T/m-sysd" -- --cache-dir "$T/cache-sysd" > "$T/deskfs-sysd.service" ||
  fail "deskfs systemd-unit failed"
log "unit: $(tr '\n' '|' < "$T/deskfs-sysd.service")"
if command -v systemd-analyze > /dev/null; then
  systemd-analyze verify "$T/deskfs-sysd.service" > "$T/verify.out" 2>&1 ||
    fail "systemd-analyze verify: $(cat "$T/verify.out")"
fi
unit_line() { sed -n "s/^$1=//p" "$T/deskfs-sysd.service" | sed 's/%%/%/g; s/\$\$/$/g'; }
[[ $(unit_line Type) == notify ]] || fail "the unit is not Type=notify"
START=$(unit_line ExecStart)
STOP=$(unit_line ExecStop)
ENVL=$(unit_line Environment)
[[ $ENVL == "DESKFS_HOME=$DESKFS_HOME" ]] || fail "Environment= is not this home: $ENVL"

# A stand-in for systemd's notification socket: prints what it receives.
notify_listener() { # SOCKET OUT
  python3 - "$1" "$2" << 'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(120)
with open(sys.argv[2], "a") as out:
    while True:
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            break
        out.write(msg.replace("\n", " ") + "\n")
        out.flush()
        if "STOPPING=1" in msg:
            break
PY
  LISTENER=$!
  register_pid "$LISTENER"
}
run_unit() { # ROUND: ExecStart in the background with NOTIFY_SOCKET, READY awaited
  local sock=$T/notify-$1.sock
  notify_listener "$sock" "$T/notify-$1.out"
  wait_for 5 test -S "$sock" || fail "the notify listener did not start"
  (eval "set -- $START"; exec env "$ENVL" NOTIFY_SOCKET="$sock" "$@") > "$T/unit-$1.log" 2>&1 &
  UNIT_PID=$!
  register_pid "$UNIT_PID"
  wait_for 60 grep -q "READY=1" "$T/notify-$1.out" || fail "no READY=1 from ExecStart (round $1): $(tail -n 5 "$T/unit-$1.log")"
  is_mounted "$T/m-sysd" || fail "READY=1 before the mount was up (round $1)"
}
stop_unit() { # ROUND: ExecStop; the ExecStart process exits 0
  (eval "set -- $STOP"; exec env "$ENVL" "$@") > "$T/stop-$1.log" 2>&1 || fail "ExecStop failed (round $1): $(cat "$T/stop-$1.log")"
  not_mounted "$T/m-sysd" || fail "still mounted after ExecStop (round $1)"
  local rc=0
  wait "$UNIT_PID" || rc=$?
  ((rc == 0)) || fail "ExecStart exited $rc after ExecStop (round $1): $(tail -n 5 "$T/unit-$1.log")"
  wait "$LISTENER" 2> /dev/null || true
  grep -q "STOPPING=1" "$T/notify-$1.out" || fail "no STOPPING=1 (round $1)"
}
run_unit 1
echo "from the unit" > "$T/m-sysd/f"
stop_unit 1
run_unit 2
assert_eq "from the unit" "$(cat "$T/m-sysd/f")" "the file after a restart of the unit"
stop_unit 2
log "PASS"
