#!/usr/bin/env bash
# 20-s3-basic: an S3 workspace on the test Garage server (explicit --endpoint/--region/
# --access-key/--secret-key flags). After `deskfs sync` every file is the object
# <prefix>/<path> with its full content (checked with rclone and an exact-key client, not
# through deskfs), an empty dir is a `dir/` marker object, `.deskfs/` exists in the bucket
# but is hidden from the mount; renames and deletes reach the bucket; a cold remount
# (fresh cache dir) shows the same tree. A second workspace takes its keys, region and
# endpoint from the AWS shared files alone (`~/.aws/credentials` + `~/.aws/config`, profile
# from AWS_PROFILE, the default profile's keys wrong): format, mount, write, sync, object
# exact; AWS_PROFILE naming no profile, and the default profile's wrong keys, fail in one
# line with no workspace left.
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3

NAME=s3basic
mapfile -t S3ARGS < <(s3_args)
# the explicit flags must be enough: no AWS_* from the environment
log "deskfs format $NAME --bucket $(s3_url) (explicit credentials, AWS_* unset)"
out=$(env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_REGION -u AWS_ENDPOINT_URL \
  timeout -k 5 120 "$DESKFS" format "$NAME" --bucket "$(s3_url)" "${S3ARGS[@]}" 2>&1 < /dev/null) \
  || fail "deskfs format with explicit S3 flags failed: $out"

[[ -n "$(s3_keys "$S3_PREFIX/.deskfs/")" ]] || fail "format wrote nothing under $S3_PREFIX/.deskfs/ (format record expected)"

ws_mount "$NAME" "$MNT" --cache-dir "$T/cache1"
M=$MNT

log "writing files"
head -c 3000000 /dev/urandom > "$T/blob.bin"
mkdir -p "$M/a/b" "$M/emptydir" "$M/renamedir/x"
echo "top level" > "$M/top.txt"
echo "nested c" > "$M/a/b/c.txt"
cp "$T/blob.bin" "$M/a/blob.bin"
: > "$M/zero.txt"
echo "space" > "$M/with space.txt"
echo "unicode" > "$M/héllo-wörld.txt"
echo "in renamed dir" > "$M/renamedir/x/r.txt"
echo "before rename" > "$M/a/old-name.txt"
echo "to be deleted" > "$M/a/deleted.txt"

assert_not_listed "$M" .deskfs
[[ ! -e $M/.deskfs ]] || fail "$M/.deskfs is reachable through the mount (must be hidden)"

ws_sync "$NAME"
log "checking the bucket after sync"
s3_keys > "$T/keys.1"
echo "top level" > "$T/e.top"
echo "nested c" > "$T/e.c"
echo "space" > "$T/e.space"
echo "unicode" > "$T/e.uni"
assert_obj_eq top.txt "$T/e.top"
assert_obj_eq a/b/c.txt "$T/e.c"
assert_obj_eq a/blob.bin "$T/blob.bin"
assert_obj_eq "with space.txt" "$T/e.space"
assert_obj_eq "héllo-wörld.txt" "$T/e.uni"
grep -qxF "0	$S3_PREFIX/zero.txt" "$T/keys.1" || fail "zero-length object $S3_PREFIX/zero.txt missing (keys: $(cut -f2 "$T/keys.1" | head -20 | tr '\n' ' '))"
s3_exists "$S3_PREFIX/emptydir/" || fail "no directory marker object $S3_PREFIX/emptydir/ for the empty dir"
rc lsf "$(rc_path "$S3_PREFIX/")" > "$T/lsf.1"
for e in top.txt a/ emptydir/ zero.txt "with space.txt" "héllo-wörld.txt"; do
  grep -qxF "$e" "$T/lsf.1" || fail "rclone lsf of the prefix does not list '$e' (got: $(tr '\n' ' ' < "$T/lsf.1"))"
done
rc lsf -R --files-only "$(rc_path "$S3_PREFIX/a/")" > "$T/lsf.a"
assert_eq "$(printf '%s\n' b/c.txt blob.bin deleted.txt old-name.txt | sort)" "$(sort "$T/lsf.a")" "rclone lsf -R of a/"

log "rename + delete, then sync"
mv "$M/a/old-name.txt" "$M/a/new-name.txt"
mv "$M/renamedir" "$M/renamed"
rm "$M/a/deleted.txt"
echo "changed content" > "$M/top.txt"
ws_sync "$NAME"
echo "before rename" > "$T/e.ren"
echo "in renamed dir" > "$T/e.rd"
echo "changed content" > "$T/e.top2"
assert_obj_eq a/new-name.txt "$T/e.ren"
assert_obj_eq renamed/x/r.txt "$T/e.rd"
assert_obj_eq top.txt "$T/e.top2"
for gone in a/old-name.txt a/deleted.txt renamedir/x/r.txt; do
  ! s3_exists "$(s3_key "$gone")" || fail "object $(s3_key "$gone") still in the bucket after rename/delete + sync"
done

tree_manifest "$M" > "$T/manifest.before"
ws_umount "$M"

log "cold remount (new cache dir)"
ws_mount "$NAME" "$MNT2" --cache-dir "$T/cache2"
assert_same_tree "$T/manifest.before" "$MNT2" "after cold remount"
[[ ! -e $MNT2/.deskfs ]] || fail ".deskfs reachable after remount"
ws_umount "$MNT2"

log "credentials, region and endpoint from the AWS shared files (aws configure), AWS_* unset"
mkdir -p "$T/awshome/.aws" "$T/m-prof"
cat > "$T/awshome/.aws/credentials" << EOF
# the default profile's keys are wrong: the named one must be the one used
[default]
aws_access_key_id = WRONGKEY
aws_secret_access_key = wrongsecret

[e2e]
aws_access_key_id = $BENCH_S3_ACCESS_KEY
aws_secret_access_key = $BENCH_S3_SECRET_KEY
EOF
cat > "$T/awshome/.aws/config" << EOF
[default]
region = nowhere-1

[profile e2e]
region = $BENCH_S3_REGION
endpoint_url = $BENCH_S3_ENDPOINT
s3 =
  addressing_style = path
EOF
# AWS_EC2_METADATA_DISABLED: should the files not be read, deskfs refuses at once (no
# keys, no endpoint) rather than asking AWS or its metadata service.
noaws() {
  env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_REGION \
    -u AWS_DEFAULT_REGION -u AWS_ENDPOINT_URL -u AWS_ENDPOINT_URL_S3 -u AWS_ENDPOINT \
    -u AWS_SHARED_CREDENTIALS_FILE -u AWS_CONFIG_FILE HOME="$T/awshome" \
    AWS_EC2_METADATA_DISABLED=true "$@" < /dev/null
}
PROF_URL="s3://$S3_BUCKET/$S3_PREFIX-prof"
out=$(noaws AWS_PROFILE=e2e timeout -k 5 120 "$DESKFS" format prof --bucket "$PROF_URL" 2>&1) ||
  fail "format with the credentials of profile e2e in ~/.aws failed: $out"
register_mount "$T/m-prof"
out=$(noaws AWS_PROFILE=e2e timeout -k 5 60 "$DESKFS" mount prof "$T/m-prof" --cache-dir "$T/cache-prof" 2>&1) ||
  fail "mount with the credentials of profile e2e in ~/.aws failed: $out"
echo "through a profile" > "$T/e.prof"
cp "$T/e.prof" "$T/m-prof/p.txt"
out=$(noaws timeout -k 5 120 "$DESKFS" sync prof 2>&1) || fail "sync of the profile workspace failed: $out"
s3_exists "$S3_PREFIX-prof/p.txt" || fail "object $S3_PREFIX-prof/p.txt is not in the bucket"
rc cat "$(rc_path "$S3_PREFIX-prof/p.txt")" > "$T/got.prof" || fail "rclone cat of $S3_PREFIX-prof/p.txt failed"
assert_file_eq "$T/e.prof" "$T/got.prof" "the object written through the profile's workspace"
out=$(noaws timeout -k 5 120 "$DESKFS" umount "$T/m-prof" 2>&1) || fail "umount failed: $out"
# a profile name that is in neither file, and the default profile's wrong keys: one line
# each, non-zero, no workspace left
bad_profile() { # WHAT PATTERN ENV...
  local what=$1 pat=$2 rc=0
  shift 2
  noaws "$@" timeout -k 5 60 "$DESKFS" format badprof --bucket "s3://$S3_BUCKET/$S3_PREFIX-bad" > "$T/bp.out" 2>&1 || rc=$?
  ((rc != 0 && rc != 124)) || fail "$what: format exit $rc: $(head -c 400 "$T/bp.out")"
  grep -q -- "$pat" "$T/bp.out" || fail "$what: the error does not say '$pat': $(head -c 400 "$T/bp.out")"
  assert_eq 1 "$(grep -c . "$T/bp.out")" "$what: lines of the error"
  [[ ! -e $DESKFS_HOME/workspaces/badprof ]] || fail "$what: a workspace dir was left behind"
  log "ok ($what, exit $rc): $(cat "$T/bp.out")"
}
# the endpoint of the profile names the server: a prefix inside s3basic's (made with
# --endpoint) is the same store, refused
rc=0
noaws AWS_PROFILE=e2e timeout -k 5 60 "$DESKFS" format inner --bucket "$(s3_url inner)" > "$T/inner.out" 2>&1 || rc=$?
((rc != 0)) && grep -q 'lies inside the bucket of workspace "s3basic"' "$T/inner.out" ||
  fail "format inside s3basic's prefix with the profile's endpoint: exit $rc: $(head -c 400 "$T/inner.out")"
bad_profile "AWS_PROFILE names no profile" "AWS_PROFILE=nosuch: no profile \[nosuch\]" AWS_PROFILE=nosuch
bad_profile "the default profile's keys are wrong" "access denied\|InvalidAccessKeyId\|403" AWS_ENDPOINT_URL="$BENCH_S3_ENDPOINT" AWS_REGION="$BENCH_S3_REGION"

log "PASS"
