#!/usr/bin/env bash
# 16-doctor: `deskfs doctor` on this machine and with pieces missing.
#   - this machine (the test suite installed fuse3 and bubblewrap): every machine check
#     passes, exit 0; a workspace adds its metadata, bucket and cache dir checks, all ok;
#   - PATH without fusermount3 and bwrap: exactly two FAIL lines, one per missing piece,
#     each naming the package to install; exit 1 with one error line on stderr;
#   - a workspace whose bucket dir and metadata database are gone: a FAIL line for each,
#     naming the path; `--json` counts the failures the text shows;
#   - a cache dir on tmpfs: a warning (not a failure) saying what a reboot loses;
#   - an unknown workspace: one line naming the known ones, exit 1.
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd python3

doctor() { # ARGS... -> $T/doc.out, $T/doc.err, DRC
  DRC=0
  "$DESKFS" doctor "$@" > "$T/doc.out" 2> "$T/doc.err" < /dev/null || DRC=$?
}

doctor
((DRC == 0)) || fail "doctor on this machine: exit $DRC: $(cat "$T/doc.out" "$T/doc.err")"
for what in "fuse device" fusermount3 allow_other "fuse passthrough" bubblewrap; do
  grep -Eq "^(ok  |warn)  $what " "$T/doc.out" || fail "doctor does not pass '$what': $(cat "$T/doc.out")"
done
log "this machine: $(tr '\n' '|' < "$T/doc.out")"

ws_format doc
doctor doc
((DRC == 0)) || fail "doctor doc: exit $DRC: $(cat "$T/doc.out" "$T/doc.err")"
for what in metadata bucket "cache dir"; do
  grep -q "^ok    workspace doc: $what " "$T/doc.out" || fail "doctor doc does not check its $what: $(cat "$T/doc.out")"
done

# Missing helpers: the checks find them on PATH, as deskfs itself does.
DRC=0
env PATH=/var/empty "$DESKFS" doctor > "$T/doc.out" 2> "$T/doc.err" < /dev/null || DRC=$?
((DRC == 1)) || fail "doctor without fusermount3 and bwrap: exit $DRC (want 1)"
assert_eq 2 "$(grep -c '^FAIL' "$T/doc.out")" "FAIL lines with fusermount3 and bwrap missing"
grep -q "^FAIL  fusermount3 .*not on PATH: install fuse3" "$T/doc.out" || fail "no FAIL line naming fuse3: $(cat "$T/doc.out")"
grep -q "^FAIL  bubblewrap .*not on PATH: install it (apt-get install -y bubblewrap)" "$T/doc.out" || fail "no FAIL line naming bubblewrap: $(cat "$T/doc.out")"
assert_eq 1 "$(grep -c . "$T/doc.err")" "lines on stderr"
grep -q "2 check(s) failed" "$T/doc.err" || fail "stderr does not count the failures: $(cat "$T/doc.err")"

# A workspace whose bucket dir and database are gone (SQLite only: a PostgreSQL
# workspace's database is not a file here).
if ! meta_is_pg; then
  ws_format gone
  W=$DESKFS_HOME/workspaces/gone
  rm -rf "$W/bucket"
  mv "$W/meta.db" "$T/meta.db.aside"
  doctor gone
  ((DRC == 1)) || fail "doctor of a workspace without bucket and database: exit $DRC"
  grep -q "^FAIL  workspace gone: bucket .*bucket directory $W/bucket does not exist" "$T/doc.out" || fail "no FAIL line for the missing bucket dir: $(cat "$T/doc.out")"
  grep -q "^FAIL  workspace gone: metadata .*$W/meta.db is missing" "$T/doc.out" || fail "no FAIL line for the missing database: $(cat "$T/doc.out")"
  "$DESKFS" doctor gone --json > "$T/doc.json" 2> /dev/null || true
  python3 - "$T/doc.json" << 'PY' || fail "doctor --json does not match its text"
import json, sys
d = json.load(open(sys.argv[1]))
fails = [c["what"] for c in d["checks"] if c["verdict"] == "fail"]
assert d["failed"] == len(fails) == 2, d
assert fails == ["workspace gone: metadata", "workspace gone: bucket"], fails
PY
fi

# A cache dir on tmpfs: warned, not failed.
ws_format tmpc
mkdir -p "$DESKFS_HOME/workspaces/tmpc/cache"
mount -t tmpfs -o size=64m deskfs-doctor-test "$DESKFS_HOME/workspaces/tmpc/cache"
on_exit "umount '$DESKFS_HOME/workspaces/tmpc/cache' 2> /dev/null || true"
doctor tmpc
umount "$DESKFS_HOME/workspaces/tmpc/cache"
((DRC == 0)) || fail "doctor with a cache dir on tmpfs: exit $DRC: $(cat "$T/doc.out")"
grep -q "^warn  workspace tmpc: cache dir .* is on tmpfs .*lost with a reboot" "$T/doc.out" || fail "no tmpfs warning: $(cat "$T/doc.out")"

doctor nosuch
((DRC == 1)) || fail "doctor of an unknown workspace: exit $DRC"
grep -q 'no workspace named "nosuch"' "$T/doc.err" || fail "unknown workspace not named: $(cat "$T/doc.err")"
log "PASS"
