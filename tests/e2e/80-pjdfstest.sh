#!/usr/bin/env bash
# 80-pjdfstest: the POSIX conformance suite (Rust pjdfstest 0.2.2, crate `pjdfstest`) against
# a deskfs mount of the embedded default workspace, mounted with --allow-other (the suite
# switches to the dummy users nobody/nogroup, tests/tests, pjdfstest/pjdfstest and the kernel
# must let them in). Opt-in features: posix_fallocate, rename_ctime, utime_now, utimensat;
# naptime 0.1 s. Prints the summary (passed/failed/skipped) and the failed tests; the test
# fails if any pjdfstest test fails, if there is no summary line, or if the mount is dead
# afterwards.
#   DESKFS_PJD_FILTER    run only pjdfstest tests whose name contains this string
#   DESKFS_PJD_TIMEOUT   time limit for the pjdfstest run in seconds (default 900)
# e2e-timeout: 1200
source "$(dirname "$0")/../lib.sh"
need_deskfs

PJD=$(command -v pjdfstest || true)
[[ -n $PJD ]] || skip_or_fail "pjdfstest is not installed (cargo install pjdfstest --version 0.2.2 --locked)"
log "pjdfstest: $PJD ($("$PJD" --version 2>/dev/null | head -n 1))"

# The dummy users must exist (root can create them; otherwise the suite's user-switching
# tests would fail for a reason that is not deskfs's).
if ((EUID == 0)); then
  for u in tests pjdfstest; do
    id "$u" > /dev/null 2>&1 && continue
    useradd -r -M -U -s /usr/sbin/nologin "$u" || fail "useradd $u failed"
    log "created system user $u for pjdfstest"
  done
else
  skip_or_fail "pjdfstest needs root (it switches to the dummy users and changes owners)"
fi
for u in nobody tests pjdfstest; do
  id "$u" > /dev/null 2>&1 || skip_or_fail "user $u is missing"
done
NOGROUP=nogroup
getent group nogroup > /dev/null || NOGROUP=nobody

FEATURES=(posix_fallocate rename_ctime utime_now utimensat)
KNOWN=$("$PJD" -l 2>/dev/null | cut -d: -f1)
CFG=$T/pjdfstest.toml
{
  echo "[features]"
  for f in "${FEATURES[@]}"; do
    grep -qxF "$f" <<< "$KNOWN" || fail "this pjdfstest does not know the feature $f (want 0.2.2)"
    echo "$f = {}"
  done
  echo
  echo "[settings]"
  echo "naptime = 0.1"
  echo "allow_remount = false"
  echo
  echo "[dummy_auth]"
  echo "entries = [[\"nobody\", \"$NOGROUP\"], [\"tests\", \"tests\"], [\"pjdfstest\", \"pjdfstest\"]]"
} > "$CFG"

# The mountpoint is NOT under $T: the suite binds unix sockets at
# <mnt>/w-pjdfstest/.tmpXXXXXX/.tmpXXXXXX/<name> (sun_path holds at most 107 bytes, $T can be
# longer than that), and the dummy users must be able to search every directory on the way
# (scripts/test.sh's run dir is 0700). So: a short 0755 directory directly under /tmp,
# unmounted and removed at exit.
PMNT=$(mktemp -d /tmp/dfs80.XXXXXX)
chmod 0755 "$PMNT"
cleanup_pmnt() {
  if is_mounted "$PMNT"; then
    timeout -k 2 20 "$DESKFS" umount --no-wait "$PMNT" > /dev/null 2>&1 < /dev/null
    force_unmount "$PMNT" || log "cleanup: could not unmount $PMNT"
  fi
  is_mounted "$PMNT" || rmdir "$PMNT" 2> /dev/null
  return 0
}
on_exit cleanup_pmnt
MNT=$PMNT

NAME=pjd
ws_format "$NAME"
ws_mount "$NAME" "$MNT" --allow-other
WORK=$MNT/w-pjdfstest
mkdir "$WORK"
chmod 0755 "$WORK"
assert_eq 755 "$(stat -c %a "$WORK")" "mode of the pjdfstest work dir"

LOGF=$T/pjdfstest.log
PJD_ARGS=(-c "$CFG" -p "$WORK")
[[ -n ${DESKFS_PJD_FILTER:-} ]] && PJD_ARGS+=("$DESKFS_PJD_FILTER")
log "running pjdfstest ${PJD_ARGS[*]} (full log $LOGF)"
t0=$SECONDS
rc=0
(cd "$WORK" && NO_COLOR=1 CLICOLOR=0 RUST_BACKTRACE=0 \
  timeout -k 10 "${DESKFS_PJD_TIMEOUT:-900}" "$PJD" "${PJD_ARGS[@]}") > "$LOGF" 2>&1 < /dev/null || rc=$?
secs=$((SECONDS - t0))
# strip colours (NO_COLOR is not honoured by every build)
sed -i 's/\x1b\[[0-9;]*m//g' "$LOGF"

alive=1
timeout -k 1 10 ls "$MNT" > /dev/null 2>&1 || alive=0

summary=$(grep -E 'Summary: [0-9]+ failed, [0-9]+ skipped, [0-9]+ passed' "$LOGF" | tail -n 1 || true)
mapfile -t FAILED < <(awk '$NF == "FAILED" { print $1 }' "$LOGF")
passed=$(awk '$NF == "ok" { n++ } END { print n + 0 }' "$LOGF")
skipped=$(awk '$NF == "skipped" { n++ } END { print n + 0 }' "$LOGF")
log "pjdfstest exit status $rc after ${secs}s"
if [[ -n $summary ]]; then
  log "$summary"
  passed=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<< "$summary")
  skipped=$(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<< "$summary")
else
  log "no summary line; counted from the log: $passed passed, ${#FAILED[@]} failed, $skipped skipped"
fi
echo "pjdfstest: $passed passed, ${#FAILED[@]} failed, $skipped skipped (${secs}s)" >&2
if ((${#FAILED[@]})); then
  echo "failed pjdfstest tests:" >&2
  printf '  %s\n' "${FAILED[@]}" >&2
  # the assertion messages of the failures, for the reader
  grep -n -A 6 -E ' FAILED$' "$LOGF" | head -n 200 >&2 || true
fi

((alive)) || fail "the mount is dead after pjdfstest (exit $rc): $(tail -n 5 "$LOGF" | tr '\n' ' ')"
((rc != 124 && rc != 137)) || fail "pjdfstest timed out after ${DESKFS_PJD_TIMEOUT:-900}s ($passed passed, ${#FAILED[@]} failed so far)"
[[ -n $summary ]] || fail "pjdfstest printed no summary line (exit $rc; crashed?): $(tail -n 5 "$LOGF" | tr '\n' ' ')"
nfail=$(sed -E 's/.*Summary: ([0-9]+) failed.*/\1/' <<< "$summary")
((nfail == 0 && ${#FAILED[@]} == 0)) || fail "$nfail pjdfstest tests failed: ${FAILED[*]}"
((rc == 0)) || fail "pjdfstest exited with status $rc although no test failed"
((passed > 0)) || fail "pjdfstest passed no test at all"

rm -rf "$WORK"
ws_umount "$MNT"
log "PASS"
