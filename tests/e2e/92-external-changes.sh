#!/usr/bin/env bash
# 92-external-changes: changes another S3 client (tests/s3.py, not deskfs) makes in the
# bucket reach a mounted workspace on Garage within the listing TTL (`deskfs mount
# --list-ttl 2`): a new object appears, a replaced object's new content is read, a
# deleted object disappears, and so does a directory whose objects are all deleted. A
# file with unuploaded local writes (mount with a long upload delay) whose object another
# client replaces keeps both versions: the local one at the path, the bucket's beside it
# as NAME.deskfs-conflict-bucket-UNIXTIME — found at a re-listing for one file and at
# upload time (no re-listing) for another — and `deskfs status` (text and --json) lists
# both conflicts. A file with unuploaded writes whose object another client deletes
# stays, and its local version reaches the bucket.
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_s3

TTL=2
NAME=extchg
ws_format "$NAME" --bucket "$(s3_url)"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache" --list-ttl "$TTL"
M=$MNT

put() { printf '%s' "$2" > "$T/put.body"; s3py put "$(s3_key "$1")" "$T/put.body" > /dev/null || fail "s3.py put $1 failed"; }
# within_ttl DESC CMD...: CMD (after an `ls` of the tree) true within TTL + 3 s
within_ttl() {
  local desc=$1; shift
  local end=$((SECONDS + TTL + 3))
  until ls -R "$M" > /dev/null 2>&1; "$@"; do
    ((SECONDS < end)) || fail "$desc: not seen within the listing TTL ($TTL s) + 3 s"
    sleep 0.3
  done
}

log "files written through the mount, in the bucket"
mkdir -p "$M/d/sub"
echo "will be replaced" > "$M/d/replaced.txt"
echo "will be deleted" > "$M/d/deleted.txt"
echo "stays" > "$M/d/kept.txt"
echo "x" > "$M/d/sub/x"
echo "y" > "$M/d/sub/y"
ws_sync "$NAME"
ls -R "$M" > /dev/null

log "another client adds, replaces and deletes objects"
put d/new.txt "added by another tool"
sleep 1.1 # a later mtime, whatever the store's ETag
put d/replaced.txt "replaced by another tool, longer"
s3py rm "$(s3_key d/deleted.txt)" > /dev/null || fail "s3.py rm failed"
s3py rm "$(s3_key d/sub/x)" > /dev/null
s3py rm "$(s3_key d/sub/y)" > /dev/null
s3py rm "$(s3_key d/sub/)" > /dev/null || true

within_ttl "new object d/new.txt" test -f "$M/d/new.txt"
assert_eq "added by another tool" "$(cat "$M/d/new.txt")" "new object's content"
within_ttl "replaced object d/replaced.txt" \
  bash -c '[[ $(cat "$1") == "replaced by another tool, longer" ]]' _ "$M/d/replaced.txt"
within_ttl "deleted object d/deleted.txt" test ! -e "$M/d/deleted.txt"
within_ttl "directory d/sub whose objects are all deleted" test ! -e "$M/d/sub"
assert_eq "stays" "$(cat "$M/d/kept.txt")" "untouched file"
ws_umount "$M"

log "conflicts: unuploaded local writes (upload delay 1 h) while another client replaces the object"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache" --list-ttl "$TTL" --upload-delay-ms 3600000
mkdir -p "$M/c1" "$M/c2"
ls "$M/c1" "$M/c2" > /dev/null
echo "base one" > "$M/c1/listed.txt"
echo "base two" > "$M/c2/uploaded.txt"
echo "base three" > "$M/c2/gone.txt"
ws_sync "$NAME"
ls "$M/c1" "$M/c2" > /dev/null
echo "local edit one" > "$M/c1/listed.txt"
echo "local edit two" > "$M/c2/uploaded.txt"
echo "local edit three" > "$M/c2/gone.txt"
sleep 1.1
put c1/listed.txt "bucket edit one"
put c2/uploaded.txt "bucket edit two"
s3py rm "$(s3_key c2/gone.txt)" > /dev/null
# c1 is re-listed (conflict found at listing); c2 is not looked at until the upload.
# (A refresh the bucket does not answer within 500 ms goes on in the background: its
# conflict copy shows at a later listing, so the listing is repeated, within TTL + 3 s.)
sleep $((TTL + 1))
end=$((SECONDS + TTL + 3))
until c1=$(cd "$M/c1" && ls | grep '^listed\.txt\.deskfs-conflict-bucket-[0-9]*$'); do
  ((SECONDS < end)) || fail "no conflict copy beside c1/listed.txt after a re-listing: $(ls "$M/c1" | tr '\n' ' ')"
  sleep 0.3
done
assert_eq "local edit one" "$(cat "$M/c1/listed.txt")" "local version at the path (c1)"
assert_eq "bucket edit one" "$(cat "$M/c1/$c1")" "bucket's version beside it (c1)"
ws_sync "$NAME"
c2=$(cd "$M/c2" && ls | grep '^uploaded\.txt\.deskfs-conflict-bucket-[0-9]*$' || true)
[[ -n $c2 ]] || fail "no conflict copy beside c2/uploaded.txt after the upload: $(ls "$M/c2" | tr '\n' ' ')"
assert_eq "local edit two" "$(cat "$M/c2/uploaded.txt")" "local version at the path (c2)"
assert_eq "bucket edit two" "$(cat "$M/c2/$c2")" "bucket's version beside it (c2)"
assert_eq "local edit three" "$(cat "$M/c2/gone.txt")" "a file with local writes whose object was deleted stays"
for p in "c1/listed.txt:local edit one" "c1/$c1:bucket edit one" "c2/uploaded.txt:local edit two" \
         "c2/$c2:bucket edit two" "c2/gone.txt:local edit three"; do
  assert_eq "${p#*:}" "$(s3_get "$(s3_key "${p%%:*}")")" "bucket object ${p%%:*}"
done

log "deskfs status lists the conflicts"
st=$(dfs status "$NAME" --json) || fail "deskfs status --json failed"
n=$(printf '%s' "$st" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["bucket_conflicts"]))')
assert_eq 2 "$n" "bucket_conflicts in deskfs status --json"
printf '%s' "$st" | python3 -c '
import json, sys
c = {x["path"]: x["saved_as"] for x in json.load(sys.stdin)["bucket_conflicts"]}
assert c.get("c1/listed.txt") == "c1/" + sys.argv[1], c
assert c.get("c2/uploaded.txt") == "c2/" + sys.argv[2], c
' "$c1" "$c2" || fail "deskfs status --json does not name both conflicts: $st"
txt=$(dfs status "$NAME") || fail "deskfs status failed"
grep -q "c1/listed.txt: the bucket's version is kept as c1/$c1" <<< "$txt" || fail "deskfs status text lacks the c1 conflict: $txt"
grep -q "c2/uploaded.txt: the bucket's version is kept as c2/$c2" <<< "$txt" || fail "deskfs status text lacks the c2 conflict: $txt"
grep -q "deskfs-conflict-bucket" "$DESKFS_HOME/workspaces/$NAME/logs/"*.log \
  || fail "no warning in the mount log"
ws_umount "$M"
log "PASS"
