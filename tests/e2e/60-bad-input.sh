#!/usr/bin/env bash
# 60-bad-input: every wrong use gives a one-line error on stderr (no panic, no backtrace),
# a non-zero exit within 60 s, and leaves nothing half-done:
#   format: bad URL scheme, the file system root (or a path climbing to it) as a file://
#           bucket, unreachable endpoint, no S3 credentials, wrong credentials
#           (Garage), same name twice
#           -> no workspace dir left behind; the existing workspace is untouched
#   mount:  missing mountpoint dir, busy mountpoint (already mounted), a --buffer-memory
#           below 4M or not a size, --threads 0, 100000 or not a number, unknown workspace,
#           corrupt metadata database, metadata database from a newer version
#           -> nothing mounted, the database file is left exactly as it was
#           another cache dir while files written through the first wait for upload
#           -> refused, naming the cache dir to use; nothing mounted
#           the cache dir of another workspace (recorded in it, or from before records;
#           also for `fsck --repair --cache-dir`; fsck without --cache-dir checks the
#           last mount's),
#           a cache dir inside the mount point or the mount point inside it (also through
#           a symlink, a relative path, or the same dir), a mount point holding the
#           workspace's data dir or its SQLite database (format --meta), a file://
#           bucket dir overlapping the cache dir or the mount point
#           -> refused, naming both places; nothing mounted, nothing created in them;
#           two mounts of one workspace on one cache dir keep working
#   format: a file:// bucket that resolves to the root through a symlink, an empty
#           file:// path, a dir on a deskfs mount, the deskfs home (or a dir containing it, or inside it), a dir
#           inside a cache dir; a bucket location equal to, inside or containing another
#           workspace's of this home (file://, also through a symlink, and S3 prefixes),
#           also for attach -> refused, naming the other workspace; no workspace dir or
#           bucket dir left behind. A location holding another home's workspace: refused
#           (format record), pointing to attach.
#   mount:  a bucket without the workspace's format record (an empty dir: a disk not
#           mounted there) or with another workspace's -> refused naming it (and the
#           same swap under a live mount removes nothing; status names it); nothing
#           written into it; the workspace mounts again once its bucket is back. Two
#           mounts of one mount point started together: one refused as busy, never
#           stacked.
#   umount: a mount whose daemon is stopped (SIGSTOP) -> refused at once naming the pid
#           and `kill -CONT`; pending uploads whose cache dir was removed -> exit 3 and a
#           message saying their content is lost, naming fsck --rebuild-from-bucket.
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
# A file:// bucket on a deskfs mount (its own or another workspace's): refused.
expect_error "format with a bucket dir on a deskfs mount" "bucket directory $MNT/b lies on a deskfs mount .deskfs:dup at $MNT.: " \
  "$DESKFS" format onmount --bucket "file://$MNT/b"
no_workspace onmount "format with a bucket dir on a deskfs mount"
[[ ! -e $MNT/b ]] || fail "the refused format made its bucket dir on the mount"
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
# The same workspace again at the same place: said as such (it was "busy: something").
out=$("$DESKFS" mount dup "$MNT" 2>&1 < /dev/null) && fail "a second mount of dup on $MNT succeeded"
grep -q "workspace dup is already mounted at $MNT" <<< "$out" || fail "a second mount of dup on $MNT does not say it is already mounted there: $out"
assert_eq 1 "$(mount_count "$MNT")" "mounts stacked on $MNT after the refused second mount"
assert_eq "keep me" "$(timeout 10 cat "$MNT/keep.txt")" "first mount still works after the refused second mount"
ws_umount "$MNT"

mkdir -p "$T/m-buf"
register_mount "$T/m-buf"
expect_error "mount with a buffer memory below 4M" 'buffer.memory.*(at least 4M|too small)' \
  "$DESKFS" mount dup "$T/m-buf" --buffer-memory 1M
expect_error "mount with a buffer memory that is not a size" 'buffer.memory.*(size|number)' \
  "$DESKFS" mount dup "$T/m-buf" --buffer-memory lots
! is_mounted "$T/m-buf" || fail "a mount with a bad --buffer-memory got mounted"
for n in 0 100000 many; do
  expect_error "mount with --threads $n" "threads.*give 1 to 256" \
    "$DESKFS" mount dup "$T/m-buf" --threads "$n"
done
! is_mounted "$T/m-buf" || fail "a mount with a bad --threads got mounted"

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

# ---------------------------------------------------------------- places that overlap
# state DIR: every entry of DIR with its type and size, and every file's sha256
state() { (cd "$1" && find . -printf '%y %p %s\n' | sort && find . -type f -print0 | sort -z | xargs -0 -r sha256sum); }
# b_refused_on_shared WHAT PATTERN: a mount of workspace B on cache-shared is refused
# with PATTERN, nothing is mounted, and the cache dir is left exactly as it was.
b_refused_on_shared() {
  state "$T/cache-shared" > "$T/cs.before"
  expect_error "mount of workspace B with $1" "$2" \
    "$DESKFS" mount cacheb "$T/m-cb" --cache-dir "$T/cache-shared"
  ! is_mounted "$T/m-cb" || fail "workspace B got mounted on $1"
  state "$T/cache-shared" > "$T/cs.after"
  diff "$T/cs.before" "$T/cs.after" > "$T/cs.diff" || fail "the refused mount changed the cache dir: $(cat "$T/cs.diff")"
}

# Two workspaces on one cache dir: its files are named by inode number, so workspace B
# would take A's staging files and blocks for its own. Refused while A uses it and after.
ws_format cachea
ws_format cacheb
ws_mount cachea "$T/m-ca" --cache-dir "$T/cache-shared"
echo "written through a" > "$T/m-ca/a.txt"
[[ -s $T/cache-shared/workspace.json ]] || fail "the cache dir does not record its workspace"
# A second mount of the same workspace on the same cache dir: fine.
ws_mount cachea "$T/m-ca2" --cache-dir "$T/cache-shared"
assert_eq "written through a" "$(cat "$T/m-ca2/a.txt")" "the file through a second mount of the same workspace and cache dir"
mkdir -p "$T/m-cb"
register_mount "$T/m-cb"
expect_error "mount of workspace B with the cache dir workspace A uses" \
  "cache dir $T/cache-shared belongs to workspace \"cachea\", not \"cacheb\".*another --cache-dir" \
  "$DESKFS" mount cacheb "$T/m-cb" --cache-dir "$T/cache-shared"
! is_mounted "$T/m-cb" || fail "workspace B got mounted on A's cache dir"
ws_umount "$T/m-ca2"
ws_umount "$T/m-ca"
b_refused_on_shared "the cache dir workspace A used" \
  "cache dir $T/cache-shared belongs to workspace \"cachea\", not \"cacheb\""
# A cache dir from before the record (cache-id only): refused when its id is not one of
# B's and it holds files; A (whose metadata knows the id) takes it again and records itself.
rm "$T/cache-shared/workspace.json"
b_refused_on_shared "A's cache dir from before the record" \
  "cache dir $T/cache-shared holds the cache of another workspace.*another --cache-dir"
ws_mount cachea "$T/m-ca" --cache-dir "$T/cache-shared"
assert_eq "written through a" "$(cat "$T/m-ca/a.txt")" "A's file with its cache dir from before the record"
ws_umount "$T/m-ca"
grep -q '"cachea"' "$T/cache-shared/workspace.json" || fail "A did not record itself in its cache dir"
ws_mount cacheb "$T/m-cb" --cache-dir "$T/cache-b-own"
ws_umount "$T/m-cb"
# fsck of B given A's cache dir: refused before anything is checked or repaired.
state "$T/cache-shared" > "$T/cs.before"
expect_error "fsck --repair of workspace B with A's cache dir" \
  "cache dir $T/cache-shared belongs to workspace \"cachea\", not \"cacheb\"" \
  "$DESKFS" fsck cacheb --repair --cache-dir "$T/cache-shared"
state "$T/cache-shared" > "$T/cs.after"
diff "$T/cs.before" "$T/cs.after" > "$T/cs.diff" || fail "the refused fsck changed A's cache dir: $(cat "$T/cs.diff")"
dfs_ok fsck cachea --cache-dir "$T/cache-shared" > /dev/null
# Without --cache-dir, fsck checks the cache dir the workspace was last mounted with here
# (it checked the default one: every file whose only copy that cache holds looked lost).
dfs fsck cachea > "$T/fsck-last.out" 2>&1 || fail "fsck cachea without --cache-dir failed: $(cat "$T/fsck-last.out")"
grep -q "^fsck cachea (cache dir $T/cache-shared): .* 0 problems" "$T/fsck-last.out" \
  || fail "fsck without --cache-dir did not check the cache dir of the last mount: $(cat "$T/fsck-last.out")"

# A cache dir inside the mount point, or the mount point inside the cache dir.
ws_format places
mkdir -p "$T/m-pl"
register_mount "$T/m-pl"
expect_error "cache dir inside the mount point" \
  "cache dir $T/m-pl/cache lies inside mount point $T/m-pl.*outside" \
  "$DESKFS" mount places "$T/m-pl" --cache-dir "$T/m-pl/cache"
ln -s "$T/m-pl" "$T/m-pl-link"
expect_error "cache dir inside the mount point, through a symlink" \
  "cache dir $T/m-pl/c/d lies inside mount point $T/m-pl" \
  "$DESKFS" mount places "$T/m-pl" --cache-dir "$T/m-pl-link/c/d"
expect_error "cache dir inside the mount point, relative" \
  "cache dir $T/m-pl/rel lies inside mount point $T/m-pl" \
  sh -c 'cd "$1" && exec "$2" mount places . --cache-dir rel' sh "$T/m-pl" "$DESKFS"
expect_error "cache dir that is the mount point" "cache dir $T/m-pl is the mount point" \
  "$DESKFS" mount places "$T/m-pl" --cache-dir "$T/m-pl"
! is_mounted "$T/m-pl" || fail "a mount with its cache dir inside the mount point got mounted"
assert_eq "" "$(ls -A "$T/m-pl")" "entries made in the mount point by the refused mounts"
mkdir -p "$T/cache-out/mnt"
register_mount "$T/cache-out/mnt"
expect_error "mount point inside the cache dir" \
  "mount point $T/cache-out/mnt lies inside cache dir $T/cache-out" \
  "$DESKFS" mount places "$T/cache-out/mnt" --cache-dir "$T/cache-out"
! is_mounted "$T/cache-out/mnt" || fail "a mount point inside its cache dir got mounted"
assert_eq "mnt" "$(ls -A "$T/cache-out")" "entries made in the cache dir by the refused mount"
register_mount "$DESKFS_HOME"
expect_error "mount point holding the workspace's data dir" \
  "mount point $DESKFS_HOME holds workspace \"places\"'s data dir" \
  "$DESKFS" mount places "$DESKFS_HOME" --cache-dir "$T/cache-pl"
! is_mounted "$DESKFS_HOME" || fail "the deskfs home got mounted over"
[[ ! -e $T/cache-pl ]] || fail "the refused mount created its cache dir"
# A SQLite database kept outside the home (format --meta), under the mount point.
mkdir -p "$T/mdb"
ws_format mdbw --meta "sqlite://$T/mdb/meta.db"
register_mount "$T/mdb"
expect_error "mount point holding the workspace's metadata database" \
  "mount point $T/mdb holds workspace \"mdbw\"'s metadata database $T/mdb/meta.db" \
  "$DESKFS" mount mdbw "$T/mdb" --cache-dir "$T/cache-mdb"
! is_mounted "$T/mdb" || fail "a mount over its own metadata database got mounted"
[[ -f $T/mdb/meta.db ]] || fail "the refused mount touched the metadata database"
# A file:// bucket dir and the cache dir or the mount point.
ws_format fbw --bucket "file://$T/fb/bucket"
expect_error "cache dir inside the file:// bucket dir" \
  "bucket directory $T/fb/bucket and cache dir $T/fb/bucket/cache overlap" \
  "$DESKFS" mount fbw "$T/m-pl" --cache-dir "$T/fb/bucket/cache"
register_mount "$T/fb"
expect_error "mount point containing the file:// bucket dir" \
  "bucket directory $T/fb/bucket and mount point $T/fb overlap" \
  "$DESKFS" mount fbw "$T/fb" --cache-dir "$T/cache-fb"
! is_mounted "$T/m-pl" && ! is_mounted "$T/fb" || fail "a mount overlapping its bucket dir got mounted"
[[ ! -e $T/fb/bucket/cache && ! -e $T/cache-fb ]] || fail "a refused mount created its cache dir"

# file:// buckets that are obviously wrong: no workspace dir, no bucket dir left behind.
ln -s / "$T/rootlink"
expect_error "format with a symlink to the root as bucket" "resolves to the file system root" \
  "$DESKFS" format rootlink --bucket "file://$T/rootlink"
no_workspace rootlink "format with a symlink to the root as bucket"
expect_error "format with an empty file:// path" "absolute path" \
  "$DESKFS" format emptyfile --bucket "file://"
no_workspace emptyfile "format with an empty file:// path"
expect_error "format with the deskfs home as bucket" "bucket directory $DESKFS_HOME is the deskfs home" \
  "$DESKFS" format homebucket --bucket "file://$DESKFS_HOME"
no_workspace homebucket "format with the deskfs home as bucket"
expect_error "format with a bucket dir containing the deskfs home" "bucket directory $T contains the deskfs home $DESKFS_HOME" \
  "$DESKFS" format abovehome --bucket "file://$T"
no_workspace abovehome "format with a bucket dir containing the deskfs home"
expect_error "format with a bucket dir inside the deskfs home" "bucket directory $WSD/cachea/x lies inside the deskfs home" \
  "$DESKFS" format inhome --bucket "file://$WSD/cachea/x"
no_workspace inhome "format with a bucket dir inside the deskfs home"
[[ ! -e $WSD/cachea/x ]] || fail "the refused format made its bucket dir"
expect_error "format with a bucket dir inside a cache dir" "bucket directory $T/cache-shared/b lies inside the deskfs cache dir $T/cache-shared" \
  "$DESKFS" format incache --bucket "file://$T/cache-shared/b"
no_workspace incache "format with a bucket dir inside a cache dir"
[[ ! -e $T/cache-shared/b ]] || fail "the refused format made its bucket dir"

# Bucket locations that overlap another workspace's of this home.
ws_format ova --bucket "file://$T/ov/x"
ln -s "$T/ov" "$T/ovlink"
for c in "inside:file://$T/ov/x/y:lies inside" "contains:file://$T/ov:contains" \
  "same:file://$T/ov/x:is also" "symlink:file://$T/ovlink/x/z:lies inside"; do
  what=${c%%:*} rel=${c##*:} url=${c#*:}
  url=${url%:*}
  expect_error "format with a bucket dir that $rel workspace ova's ($what)" \
    "bucket $url $rel the bucket of workspace \"ova\" \\(file://$T/ov/x\\)" \
    "$DESKFS" format "ov$what" --bucket "$url"
  no_workspace "ov$what" "format with an overlapping bucket dir ($what)"
done
[[ ! -e $T/ov/x/y && ! -e $T/ov/x/z ]] || fail "a refused format made its bucket dir"
expect_error "attach of workspace ova's bucket under another name" \
  "bucket file://$T/ov/x is also the bucket of workspace \"ova\"" \
  "$DESKFS" attach ovtwin --bucket "file://$T/ov/x"
no_workspace ovtwin "attach of an overlapping bucket"
# Another home knows nothing of ova: its format record refuses, pointing to attach.
expect_error "format over a bucket holding a workspace (another home)" "already holds a deskfs workspace.*deskfs attach" \
  env DESKFS_HOME="$T/home2" "$DESKFS" format ova2 --bucket "file://$T/ov/x"
[[ ! -e $T/home2/workspaces/ova2 ]] || fail "the refused format left a workspace dir in the other home"
if have_s3; then
  ws_format s3a --bucket "$(s3_url agents)"
  expect_error "format with an S3 prefix inside workspace s3a's" \
    "bucket $(s3_url agents/work) lies inside the bucket of workspace \"s3a\"" \
    "$DESKFS" format s3b --bucket "$(s3_url agents/work)"
  no_workspace s3b "format with an overlapping S3 prefix"
  expect_error "format with an S3 prefix containing workspace s3a's" \
    "bucket $(s3_url) contains the bucket of workspace \"s3a\"" \
    "$DESKFS" format s3c --bucket "$(s3_url)"
  no_workspace s3c "format with an overlapping S3 prefix"
  assert_eq "" "$(s3_keys "$S3_PREFIX/agents/work/")" "objects under the refused prefix"
  ws_format s3d --bucket "$(s3_url agents2)"
else
  [[ ${DESKFS_TEST_STRICT:-0} != 1 ]] || fail "no S3 server for the overlapping-prefix cases"
  log "no S3 server: overlapping S3 prefix cases not run"
fi

# A bucket that answers without this workspace's format record is refused at mount: an
# empty one (a disk not mounted at the file:// path) would have every file taken as
# deleted by another tool; another workspace's would mix two workspaces.
ws_format ebw --bucket "file://$T/eb/x"
mkdir -p "$T/mnt-eb"
ws_mount ebw "$T/mnt-eb"
echo "kept" > "$T/mnt-eb/f"
ws_umount "$T/mnt-eb"
mv "$T/eb/x" "$T/eb/x.real"
mkdir "$T/eb/x"
expect_error "mount on an empty bucket dir (a disk not mounted there)" \
  "bucket file://$T/eb/x holds no deskfs format record .*: it is empty or not workspace \"ebw\"'s bucket" \
  "$DESKFS" mount ebw "$T/mnt-eb"
not_mounted "$T/mnt-eb" || fail "the refused mount is mounted"
assert_eq "" "$(ls -A "$T/eb/x")" "what the refused mount wrote into the empty bucket dir"
rmdir "$T/eb/x"
cp -a "$T/ov/x" "$T/eb/x"
expect_error "mount on another workspace's bucket" \
  "bucket file://$T/eb/x holds another deskfs workspace \(id [^)]+\) than \"ebw\"" \
  "$DESKFS" mount ebw "$T/mnt-eb"
not_mounted "$T/mnt-eb" || fail "the refused mount is mounted"
rm -rf "$T/eb/x"
mv "$T/eb/x.real" "$T/eb/x"
ws_mount ebw "$T/mnt-eb" --list-ttl 0
assert_eq "kept" "$(cat "$T/mnt-eb/f")" "the file, once the right bucket is back"
# The same swap while mounted (the disk unmounted under a live mount): listings of the
# empty bucket take nothing out of the namespace, and status says what is wrong.
mkdir "$T/mnt-eb/d" && echo "two" > "$T/mnt-eb/d/g"
"$DESKFS" sync ebw > /dev/null 2>&1 || fail "deskfs sync ebw failed"
ls "$T/mnt-eb/d" > /dev/null
mv "$T/eb/x" "$T/eb/x.real"
mkdir "$T/eb/x"
for _ in 1 2 3; do ls "$T/mnt-eb" "$T/mnt-eb/d" > /dev/null; sleep 1.1; done
assert_eq "d f" "$(ls "$T/mnt-eb" | tr '\n' ' ' | sed 's/ $//')" "the root listed while the bucket dir was empty"
assert_eq "g" "$(ls "$T/mnt-eb/d")" "a directory listed while the bucket dir was empty"
"$DESKFS" status ebw > "$T/eb-status.out" 2>&1 || true
grep -q "BUCKET NOT THIS WORKSPACE'S  file://$T/eb/x holds no format record" "$T/eb-status.out" ||
  fail "status does not say the bucket lost its format record: $(cat "$T/eb-status.out")"
rmdir "$T/eb/x"
mv "$T/eb/x.real" "$T/eb/x"
assert_eq "two" "$(cat "$T/mnt-eb/d/g")" "the file, once the bucket is back"
ws_umount "$T/mnt-eb"

# umount of a mount whose daemon is stopped (SIGSTOP): refused at once with one line
# naming the pid and the way out; the mount is untouched and unmounts once resumed.
ws_format stopw
ws_mount stopw "$T/m-stop"
echo "while stopped" > "$T/m-stop/f"
spid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$WSD"/stopw/run/*.json | head -n 1)
[[ $spid =~ ^[0-9]+$ ]] || fail "no daemon pid in the mount record of stopw"
kill -STOP "$spid"
expect_error "umount of a mount whose daemon is stopped" \
  "daemon serving $T/m-stop \(pid $spid\) is stopped.*kill -CONT $spid" \
  "$DESKFS" umount "$T/m-stop"
is_mounted "$T/m-stop" || fail "the refused umount unmounted the stopped daemon's mount"
kill -CONT "$spid"
assert_eq "while stopped" "$(cat "$T/m-stop/f")" "the file once the daemon was resumed"
ws_umount "$T/m-stop"

# umount while uploads are pending and the cache dir that holds them was removed: the
# message says their content is lost with it and names the way to the bucket's versions,
# not "safe in the local journal".
ws_format lostcw
ws_mount lostcw "$T/m-lostc" --cache-dir "$T/cache-lostc" --upload-delay-ms 600000
echo "never uploaded" > "$T/m-lostc/f"
# (Moved away in one step: the live daemon may be writing into it.)
mv "$T/cache-lostc" "$T/cache-lostc.gone"
rc=0
"$DESKFS" umount "$T/m-lostc" --timeout 3 > "$T/lostc.out" 2> "$T/lostc.err" || rc=$?
((rc == 3)) || fail "umount with pending uploads and no cache dir: exit $rc (want 3): $(cat "$T/lostc.err")"
grep -q "cache dir $T/cache-lostc that held them is gone: their unuploaded content is lost.*deskfs fsck lostcw --rebuild-from-bucket" "$T/lostc.err" ||
  fail "the umount message does not say the cache dir is gone: $(cat "$T/lostc.err")"
! grep -q "safe in the local journal" "$T/lostc.err" || fail "umount claims the content is safe after the cache dir was removed"
not_mounted "$T/m-lostc" || fail "$T/m-lostc is still mounted"

# Two mounts of one mount point started at the same moment: one mounts, the other is
# refused as busy; they never stack (the later would hide the earlier).
ws_format racea
ws_format raceb
mkdir -p "$T/m-race"
register_mount "$T/m-race"
for round in 1 2 3 4 5; do
  "$DESKFS" mount racea "$T/m-race" > "$T/race-a.out" 2>&1 < /dev/null &
  pa=$!
  "$DESKFS" mount raceb "$T/m-race" > "$T/race-b.out" 2>&1 < /dev/null &
  pb=$!
  ra=0 rb=0
  wait $pa || ra=$?
  wait $pb || rb=$?
  assert_eq 1 "$(mount_count "$T/m-race")" "mounts on one mount point after two started together (round $round)"
  (((ra == 0) != (rb == 0))) || fail "round $round: exits $ra and $rb (one mount must succeed, one be refused): $(cat "$T/race-a.out" "$T/race-b.out")"
  loser=$T/race-a.out
  ((ra == 0)) && loser=$T/race-b.out
  grep -q "mount point $T/m-race is busy" "$loser" || fail "round $round: the refused mount does not say the mount point is busy: $(cat "$loser")"
  ws_umount "$T/m-race"
done

# ---------------------------------------------------------------- mount points spelled otherwise
# A trailing `/`, `/.` or a symlink: the mount used to wait forever on itself (the path was
# resolved through the new mount before the kernel's INIT was answered); the record holds
# the resolved path, and `deskfs umount` finds it under any of those spellings.
ws_format spell
mkdir -p "$T/m-spell"
ln -s m-spell "$T/m-link"
register_mount "$T/m-spell"
for how in "$T/m-spell/" "$T/m-spell/." "$T/m-link" "$T/m-link/"; do
  DESKFS_MOUNT_TIMEOUT=30 ws_mount spell "$how"
  is_mounted "$T/m-spell" || fail "mounted as $how, but $T/m-spell is not a mount point"
  assert_eq "$T/m-spell" "$(findmnt -n -o TARGET -t fuse.deskfs "$T/m-spell")" "the mount point in the table (mounted as $how)"
  echo "via $how" > "$T/m-spell/f" || fail "writing through the mount made as $how failed"
  ws_umount "$how"
done
# ---------------------------------------------------------------- another file system over a mount
# `umount2` takes off whatever is on top of a mount point: with a bind mount over the
# workspace, `deskfs umount` used to remove the bind mount (and SIGTERM detached it),
# leaving its own mount behind. It refuses now, before any wait, and unmounts once the
# mount over it is gone. A mount point elsewhere whose name is not UTF-8 is in the table
# meanwhile: it used to blind every mount-table check.
mkdir -p "$T/bad"$'\xff' "$T/other"
mount -t tmpfs e2e-bad "$T/bad"$'\xff' || fail "cannot mount a tmpfs at a non-UTF-8 path"
register_mount "$T/bad"$'\xff'
ws_format under
mkdir -p "$T/m-under"
ws_mount under "$T/m-under"
echo "under" > "$T/m-under/u.txt"
rc=0
"$DESKFS" mount spell "$T/m-under" > "$T/stack.out" 2>&1 < /dev/null || rc=$?
((rc != 0)) || fail "a second workspace mounted over a live mount (the non-UTF-8 mount point blinded the check)"
grep -q "is busy: workspace under is mounted there" "$T/stack.out" || fail "the stacked mount was not refused as busy, naming the workspace there: $(cat "$T/stack.out")"
mount --bind "$T/other" "$T/m-under" || fail "bind mount over the workspace failed"
rc=0
DFS_TIMEOUT=60 dfs umount "$T/m-under" > "$T/covered.out" 2>&1 || rc=$?
((rc != 0)) || fail "deskfs umount of a covered mount succeeded: $(cat "$T/covered.out")"
grep -q "not this deskfs mount: something was mounted over it" "$T/covered.out" ||
  fail "deskfs umount of a covered mount does not say so: $(cat "$T/covered.out")"
assert_eq 2 "$(mount_count "$T/m-under")" "mounts at $T/m-under after the refused umount (deskfs + the bind mount)"
log "ok (umount of a covered mount, exit $rc): $(cat "$T/covered.out")"
umount "$T/m-under" || fail "removing the bind mount failed"
assert_eq "under" "$(cat "$T/m-under/u.txt")" "the workspace after the bind mount is gone"
ws_umount "$T/m-under"
assert_eq 0 "$(mount_count "$T/m-under")" "mounts at $T/m-under after deskfs umount"
# SIGTERM with a bind mount over the workspace: the daemon exits without detaching it.
ws_mount under "$T/m-under"
PID=$(python3 -c 'import json,glob,sys; r=[json.load(open(p)) for p in glob.glob(sys.argv[1] + "/*.json")]; print(r[0]["pid"] if r else "")' "$DESKFS_HOME/workspaces/under/run")
mount --bind "$T/other" "$T/m-under" || fail "bind mount over the workspace failed"
kill -TERM "$PID"
wait_for 20 eval '! pid_running "$PID"' || fail "daemon $PID did not exit on SIGTERM"
[[ $(findmnt -n -o FSTYPE --mountpoint "$T/m-under" | tail -n 1) != fuse.deskfs ]] || fail "harness: the top mount is deskfs"
assert_eq 2 "$(mount_count "$T/m-under")" "mounts at $T/m-under after SIGTERM (the bind mount kept, deskfs's dead mount under it)"
umount "$T/m-under" || fail "removing the bind mount failed"
DFS_TIMEOUT=60 dfs umount "$T/m-under" > "$T/dead.out" 2>&1 || fail "deskfs umount of the dead mount left by SIGTERM failed: $(cat "$T/dead.out")"
assert_eq 0 "$(mount_count "$T/m-under")" "mounts at $T/m-under at the end"
umount "$T/bad"$'\xff'
log "PASS"
