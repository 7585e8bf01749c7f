#!/usr/bin/env bash
# 60-bad-input: every wrong use gives a one-line error on stderr (no panic, no backtrace),
# a non-zero exit within 60 s, and leaves nothing half-done:
#   format: bad URL scheme, the file system root (or a path climbing to it) as a file://
#           bucket, unreachable endpoint, no S3 credentials, wrong credentials
#           (Garage), same name twice
#           -> no workspace dir left behind; the existing workspace is untouched
#   mount:  missing mountpoint dir, busy mountpoint (already mounted), unknown workspace,
#           corrupt metadata database, metadata database from a newer version
#           -> nothing mounted, the database file is left exactly as it was
#           another cache dir while files written through the first wait for upload
#           -> refused, naming the cache dir to use; nothing mounted
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd sqlite3

WSD=$DESKFS_HOME/workspaces

# expect_error WHAT ERE CMD...: CMD fails cleanly; ERE (case-insensitive) must match its message
expect_error() {
  local what=$1 pat=$2 rc=0 lines
  shift 2
  env -u RUST_LOG -u RUST_BACKTRACE -u DESKFS_LOG timeout -k 5 60 "$@" > "$T/err.out" 2> "$T/err.err" < /dev/null || rc=$?
  ((rc != 0)) || fail "$what: exited 0 (stdout: $(head -c 300 "$T/err.out"); stderr: $(head -c 300 "$T/err.err"))"
  ((rc != 124 && rc != 137)) || fail "$what: no answer within 60 s (a bad input must fail fast)"
  ((rc < 128)) || fail "$what: killed by signal $((rc - 128))"
  ! grep -q 'panicked at' "$T/err.err" || fail "$what: panicked: $(head -c 600 "$T/err.err")"
  lines=$(grep -c . "$T/err.err" || true)
  [[ $lines == 1 ]] || fail "$what: expected a one-line error on stderr, got $lines lines: $(head -c 800 "$T/err.err")"
  grep -Eqi -- "$pat" "$T/err.err" || fail "$what: the error does not say what is wrong (expected /$pat/): $(cat "$T/err.err")"
  log "ok ($what, exit $rc): $(cat "$T/err.err")"
}

no_workspace() { # NAME WHAT
  [[ ! -e $WSD/$1 ]] || fail "$2: left a workspace dir behind: $(find "$WSD/$1" | head -n 10 | tr '\n' ' ')"
}

# ---------------------------------------------------------------- format
expect_error "format with ftp:// URL" 'ftp|scheme|url|unsupported' \
  "$DESKFS" format badscheme --bucket ftp://x
no_workspace badscheme "format with ftp:// URL"

expect_error "format with the file system root as bucket" 'root|own' \
  "$DESKFS" format rootbucket --bucket file:///
no_workspace rootbucket "format with the file system root as bucket"
expect_error "format with a bucket dir that climbs to the root" "'\\.\\.'|segment" \
  "$DESKFS" format dotdotbucket --bucket file:///tmp/..
no_workspace dotdotbucket "format with a bucket dir that climbs to the root"

expect_error "format with unreachable endpoint" 'connect|reach|refused|endpoint|127\.0\.0\.1:1' \
  "$DESKFS" format unreachable --bucket s3://deskfs-e2e/unreachable --endpoint http://127.0.0.1:1 \
  --region garage --access-key GK0123456789abcdef01234567 --secret-key 0000000000000000000000000000000000000000000000000000000000000000
no_workspace unreachable "format with unreachable endpoint"

# No credentials at all for an S3-compatible endpoint: refused at once, naming the
# variables (never a wait on the EC2 instance metadata service, 169.254.169.254).
expect_error "format with no S3 credentials" 'AWS_ACCESS_KEY_ID' \
  env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_PROFILE -u AWS_WEB_IDENTITY_TOKEN_FILE \
  -u AWS_CONTAINER_CREDENTIALS_RELATIVE_URI -u AWS_CONTAINER_CREDENTIALS_FULL_URI \
  "$DESKFS" format nocreds --bucket s3://deskfs-e2e/nocreds --endpoint http://127.0.0.1:1 --region garage
no_workspace nocreds "format with no S3 credentials"

if have_s3; then
  expect_error "format with wrong credentials" 'access|denied|credential|forbidden|403|key|signature|auth' \
    "$DESKFS" format wrongcreds --bucket "$(s3_url)" --endpoint "$BENCH_S3_ENDPOINT" --region "$BENCH_S3_REGION" \
    --access-key GK0123456789abcdef01234567 --secret-key 1111111111111111111111111111111111111111111111111111111111111111
  no_workspace wrongcreds "format with wrong credentials"
  assert_eq "" "$(s3_keys)" "objects written under the prefix by a format with wrong credentials"
else
  [[ ${DESKFS_TEST_STRICT:-0} != 1 ]] || fail "no S3 server for the wrong-credentials case"
  log "no S3 server: wrong-credentials case not run"
fi

ws_format dup
ws_mount dup "$MNT"
echo "keep me" > "$MNT/keep.txt"
ws_umount "$MNT"
(cd "$WSD/dup" && find . -type f ! -name '*-shm' -print0 | sort -z | xargs -0 sha256sum) > "$T/dup.before"
expect_error "format of an existing name" 'exist|already' "$DESKFS" format dup
(cd "$WSD/dup" && find . -type f ! -name '*-shm' -print0 | sort -z | xargs -0 sha256sum) > "$T/dup.after"
diff "$T/dup.before" "$T/dup.after" > "$T/dup.diff" || fail "the refused second format changed the workspace: $(cat "$T/dup.diff")"

# ---------------------------------------------------------------- mount
register_mount "$T/no/such/dir"   # so that cleanup unmounts it should a mount wrongly succeed
expect_error "mount on a missing dir" 'exist|no such|not found|mount ?point|director' \
  "$DESKFS" mount dup "$T/no/such/dir"
[[ ! -e $T/no ]] || fail "mount on a missing dir created it"

ws_mount dup "$MNT"
expect_error "mount on a busy mountpoint" 'already|busy|mounted|in use' "$DESKFS" mount dup "$MNT"
assert_eq 1 "$(mount_count "$MNT")" "mounts stacked on $MNT after the refused second mount"
assert_eq "keep me" "$(timeout 10 cat "$MNT/keep.txt")" "first mount still works after the refused second mount"
ws_umount "$MNT"

mkdir -p "$T/m-unknown"
register_mount "$T/m-unknown"
expect_error "mount of an unknown workspace" 'nosuchws|unknown|not found|no such|exist' "$DESKFS" mount nosuchws "$T/m-unknown"
! is_mounted "$T/m-unknown" || fail "an unknown workspace got mounted"
[[ ! -e $WSD/nosuchws ]] || fail "mount of an unknown workspace created $WSD/nosuchws"

ws_format corrupt
[[ -f $WSD/corrupt/meta.db ]] || fail "no meta.db in $WSD/corrupt"
rm -f "$WSD/corrupt/meta.db-wal" "$WSD/corrupt/meta.db-shm"
head -c 65536 /dev/urandom > "$WSD/corrupt/meta.db"
sum_before=$(sha "$WSD/corrupt/meta.db")
mkdir -p "$T/m-corrupt"
register_mount "$T/m-corrupt"
expect_error "mount with a corrupt meta.db" 'corrupt|not a database|malformed|damaged|meta|database' \
  "$DESKFS" mount corrupt "$T/m-corrupt"
! is_mounted "$T/m-corrupt" || fail "a workspace with a corrupt meta.db got mounted"
assert_eq "$sum_before" "$(sha "$WSD/corrupt/meta.db")" "corrupt meta.db must be left as it was (sha256)"

ws_format newer
sqlite3 "$WSD/newer/meta.db" 'PRAGMA user_version=99'
assert_eq 99 "$(sqlite3 "$WSD/newer/meta.db" 'PRAGMA user_version')" "harness: user_version set"
mkdir -p "$T/m-newer"
register_mount "$T/m-newer"
expect_error "mount with a newer meta.db version" 'version|newer|upgrade' "$DESKFS" mount newer "$T/m-newer"
! is_mounted "$T/m-newer" || fail "a workspace with a newer meta.db version got mounted"
assert_eq 99 "$(sqlite3 "$WSD/newer/meta.db" 'PRAGMA user_version')" "user_version after the refused mount"

assert_eq "corrupt dup newer" "$(ls "$WSD" | sort | tr '\n' ' ' | sed 's/ $//')" "workspaces left in DESKFS_HOME"

# A non-empty mount point: allowed (like mount(8)), with a one-line warning; the files
# come back at unmount.
ws_format nonempty
mkdir -p "$T/m-nonempty"
echo "underneath" > "$T/m-nonempty/under.txt"
register_mount "$T/m-nonempty"
"$DESKFS" mount nonempty "$T/m-nonempty" > "$T/ne.out" 2> "$T/ne.err" < /dev/null || fail "mount on a non-empty dir failed: $(cat "$T/ne.err")"
grep -q "warning: mount point .* is not empty" "$T/ne.err" || fail "no warning for a non-empty mount point: $(cat "$T/ne.err")"
[[ ! -e $T/m-nonempty/under.txt ]] || fail "the mounted workspace shows the files underneath"
ws_umount "$T/m-nonempty"
assert_eq underneath "$(cat "$T/m-nonempty/under.txt")" "files under the mount point after unmount"

# Another cache dir while files written through the first are not uploaded yet: refused,
# naming the cache dir to use (found from the metadata's index of dirty inodes by cache,
# without reading the dirty rows); with that one, the file is there.
ws_format twocaches
mkdir -p "$T/m-caches"
ws_mount_fg twocaches "$T/m-caches" --cache-dir "$T/cache-a" --upload-delay-ms 3600000
echo "only in cache a" > "$T/m-caches/f"
# kill -9: the file stays in cache a's journal only (a clean unmount would upload it).
# The kernel caches the mount point's attributes (a lone mount's long TTL)...
stat "$T/m-caches" > /dev/null
kill -KILL "$FG_PID"
wait "$FG_PID" 2> /dev/null || true
# ...so `stat` still answers after the kill; a mount on top of the dead one is refused as
# dead (not "busy"), naming the cleanup.
stat "$T/m-caches" > /dev/null 2>&1 && log "stat of the dead mount point answered from the kernel's cache"
expect_error "mount over a dead mount of a killed daemon" \
  "dead FUSE mount.*deskfs umount $T/m-caches" \
  "$DESKFS" mount twocaches "$T/m-caches" --cache-dir "$T/cache-a"
if is_mounted "$T/m-caches"; then
  timeout 20 fusermount3 -u "$T/m-caches" || force_unmount "$T/m-caches" || fail "cannot remove the dead mount"
fi
expect_error "mount with another cache dir while files wait for upload in the first" \
  "not yet uploaded.*--cache-dir $T/cache-a" \
  "$DESKFS" mount twocaches "$T/m-caches" --cache-dir "$T/cache-b"
! is_mounted "$T/m-caches" || fail "the refused mount with another cache dir got mounted"
ws_mount twocaches "$T/m-caches" --cache-dir "$T/cache-a"
assert_eq "only in cache a" "$(cat "$T/m-caches/f")" "the file after mounting its cache dir again"
ws_umount "$T/m-caches"
log "PASS"
