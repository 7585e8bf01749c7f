#!/usr/bin/env bash
# 86s-paused-mount: a mount paused (SIGSTOP) past its lease, with a file open that another
# mount unlinks meanwhile, still reads that file whole when it resumes (as on ext4: an
# unlinked file lives while it is open). Two mounts of one workspace on this host, each
# with its own cache dir, --lease 3:
#   1. B writes a 40 MiB file and it is uploaded; a reader on A opens it and reads 4 KiB
#      in its middle (the rest is only in the bucket); A's daemon is stopped; B expires A's session
#      (its log says so: locks released, open files held; `deskfs status` lists the held
#      session and when its hold ends); B unlinks the file; A resumes:
#      it finds itself fenced, registers anew, and the reader reads the whole file with
#      the right sha256. After the reader closes, the orphan is purged: once both mounts
#      are gone the bucket holds only the files still named, and fsck is clean.
#   2. The hold is bounded: B mounted again with --expired-open-grace 3; the same pause
#      and unlink; B releases the held records after the grace (log) and purges the
#      orphan; A's reader, resumed, gets an error (EIO/ESTALE), never other bytes.
# e2e-timeout: 300
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd python3

NAME=paused
A=$MNT B=$MNT2
ws_format "$NAME"
BUCKET=$DESKFS_HOME/workspaces/$NAME/bucket
LOGS=$DESKFS_HOME/workspaces/$NAME/logs

ws_mount_fg "$NAME" "$A" --lease 3 --cache-dir "$T/cache-a"
APID=$FG_PID
on_exit "kill -CONT $APID 2>/dev/null || true"
ws_mount "$NAME" "$B" --lease 3 --cache-dir "$T/cache-b" --expired-open-grace 600

# reader FILE TAG: tests/tools/held_reader.py on FILE (on A): reads 4 KiB in its middle,
# says "ready", waits for a line on the fifo $T/go.TAG, then reads the whole file and
# prints "sha HEX" (or "error ERRNO NAME") into $T/reader.TAG.
reader() {
  mkfifo "$T/go.$2"
  python3 "$LIB_DIR/tools/held_reader.py" "$1" "$T/go.$2" > "$T/reader.$2" 2>&1 &
  READER=$!
  register_pid "$READER"
  wait_for 30 grep -q ready "$T/reader.$2" || fail "the reader of $1 did not start: $(cat "$T/reader.$2")"
}

# pause_and_unlink FILE: stops A's daemon, waits until B expired its session, unlinks FILE
# on B.
pause_and_unlink() {
  local before
  before=$(cat "$LOGS"/mount-*.log 2>/dev/null | grep -c "mount session expired" || true)
  kill -STOP "$APID"
  log "A's daemon (pid $APID) stopped"
  wait_for 30 eval '(( $(cat "$LOGS"/mount-*.log | grep -c "mount session expired" || true) > '"$before"' ))' \
    || fail "B did not expire the paused mount's session within 30 s"
  log "B expired A's session: $(cat "$LOGS"/mount-*.log | grep "mount session expired" | tail -n 1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200)"
  rm "$B/$1"
  [[ ! -e $B/$1 ]] || fail "$1 still has its name after rm"
}

log "part 1: a paused mount's open file survives another mount's unlink"
head -c $((40 << 20)) /dev/urandom > "$T/big"
want=$(sha "$T/big")
cp "$T/big" "$B/big"
echo keep > "$B/keep"
ws_sync "$NAME"
reader "$A/big" 1
pause_and_unlink big
sleep 2   # B's heartbeats and purges run meanwhile
# (the paused daemon does not answer: status gives up on it after 10 s and asks B)
dfs status "$NAME" > "$T/status.paused"
grep -q "held opens    session [0-9]* (pid $APID on .*) expired .* its open files are kept for it, released in [0-9]" "$T/status.paused" \
  || fail "status does not list the paused mount's held open files: $(grep -v '^ *$' "$T/status.paused" | tr -s ' ' | tail -n 25 | tr '\n' '|')"
log "status: $(grep "held opens" "$T/status.paused" | tr -s ' ' | head -n 1)"
kill -CONT "$APID"
log "A resumed"
echo go > "$T/go.1"
wait_for 60 grep -qE '^(sha|error)' "$T/reader.1" || fail "the resumed reader did not finish: $(cat "$T/reader.1")"
got=$(grep -E "^(sha|error)" "$T/reader.1")
[[ $got == *"sha $want"* ]] || fail "the paused mount's reader of the unlinked file got '$got', expected sha $want"
log "the resumed reader read all 40 MiB right"
wait_for 20 grep -q "session lease was lost" "$T"/mount-fg.*.log || fail "A's log does not say it was fenced"
wait "$READER" || true

log "part 2: the hold ends after the grace"
ws_umount "$B"
ws_mount "$NAME" "$B" --lease 3 --cache-dir "$T/cache-b" --expired-open-grace 3
cp "$T/big" "$B/big2"
ws_sync "$NAME"
reader "$A/big2" 2
pause_and_unlink big2
wait_for 30 eval 'grep -q "released the open files held" "$LOGS"/mount-*.log' \
  || fail "B did not release the held open files after the 3 s grace"
bucket_keys() { (cd "$BUCKET" && find . -type f ! -path './.deskfs*' | sort | tr '\n' ' '); }
wait_for 30 eval '[[ $(bucket_keys) == "./keep " ]]' || fail "the orphan's object is still in the bucket: $(bucket_keys)"
kill -CONT "$APID"
echo go > "$T/go.2"
wait_for 60 grep -qE '^(sha|error)' "$T/reader.2" || fail "the resumed reader did not finish: $(cat "$T/reader.2")"
got=$(grep -E "^(sha|error)" "$T/reader.2")
[[ $got == error* ]] || fail "past the grace the resumed reader should fail (its file was purged), got '$got'"
log "past the grace: the resumed reader got '$got' (no other bytes)"
wait "$READER" || true

log "both mounts gone: only named files in the bucket, fsck clean"
ws_umount "$B"
ws_umount "$A"
assert_eq "$(bucket_keys)" "./keep " "objects in the bucket"
dfs_ok fsck "$NAME" > "$T/fsck.out"
log "fsck: $(tail -n 1 "$T/fsck.out")"
log "PASS"
