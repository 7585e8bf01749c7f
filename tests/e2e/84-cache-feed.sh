#!/usr/bin/env bash
# 84-cache-feed: long kernel caches stay honest. A mount that is alone lets the kernel
# cache entries and attributes for 60 s and remember missing names (negative entries) for
# 30 s; file pages survive re-opens. When a second mount of the workspace appears, the
# first one learns of it and everything the second one changes reaches the first one's
# kernel through the change feed (inval_entry / inval_inode) within a fraction of a
# second - far below those TTLs:
#   * A: stat of a missing name (negative entry), ls -l of a dir, cat of a file (pages)
#   * B mounted; B creates the missing name, renames a file, rewrites and appends to the
#     cached file, chmods another, removes one
#   * A sees every change within 2 s (the TTLs would hide them for 30-60 s)
#   * and the reverse direction (A changes, B sees), and warm re-reads in A are right.
source "$(dirname "$0")/../lib.sh"
need_deskfs

A=$MNT B=$MNT2
NAME=feed
ws_format "$NAME"
ws_mount "$NAME" "$A"

mkdir -p "$A/d"
echo "one" > "$A/d/f.txt"
echo "keep" > "$A/d/mode.txt"
echo "bye" > "$A/d/gone.txt"
echo "old" > "$A/d/old-name.txt"
printf 'page-cached content v1\n' > "$A/cached.txt"

# Fill A's kernel caches while it is alone.
[[ ! -e $A/d/new.txt ]] || fail "new.txt exists before it was created"
ls -l "$A/d" > /dev/null
assert_eq "page-cached content v1" "$(cat "$A/cached.txt")" "first read in A"
assert_eq "page-cached content v1" "$(cat "$A/cached.txt")" "warm re-read in A"
stat -c %a "$A/d/mode.txt" > /dev/null

ws_mount "$NAME" "$B"
# B's own view is fresh.
assert_eq "page-cached content v1" "$(cat "$B/cached.txt")" "B reads A's file"

echo "created in B" > "$B/d/new.txt"
mv "$B/d/old-name.txt" "$B/d/new-name.txt"
printf 'page-cached content v2 (rewritten in B)\n' > "$B/cached.txt"
chmod 600 "$B/d/mode.txt"
rm "$B/d/gone.txt"

seen() { # seen DESCRIPTION COMMAND...: waits up to 2 s
  local what=$1; shift
  wait_for 2 "$@" || fail "A does not see B's change within 2 s: $what"
}
seen "new file (negative entry in A)" test -e "$A/d/new.txt"
assert_eq "created in B" "$(cat "$A/d/new.txt")" "content of B's new file read in A"
seen "rename: new name" test -e "$A/d/new-name.txt"
seen "rename: old name gone" test ! -e "$A/d/old-name.txt"
seen "unlink" test ! -e "$A/d/gone.txt"
mode_is_600() { [[ $(stat -c %a "$A/d/mode.txt") == 600 ]]; }
seen "chmod" mode_is_600
content_is_v2() { [[ $(cat "$A/cached.txt") == "page-cached content v2 (rewritten in B)" ]]; }
seen "rewritten content (cached pages and size in A)" content_is_v2
listing() { ls "$A/d" | tr '\n' ' '; }
assert_eq "f.txt mode.txt new-name.txt new.txt " "$(listing)" "A's listing after B's changes"

# Append in B: A's cached size must grow.
printf 'appended in B\n' >> "$B/cached.txt"
appended() { [[ $(tail -n 1 "$A/cached.txt") == "appended in B" ]]; }
seen "append (cached size in A)" appended

# And back: A changes, B sees.
echo "from A" > "$A/d/back.txt"
mv "$A/d/f.txt" "$A/d/f-moved.txt"
wait_for 2 test -e "$B/d/back.txt" || fail "B does not see A's new file within 2 s"
wait_for 2 test ! -e "$B/d/f.txt" || fail "B still sees A's renamed file after 2 s"
assert_eq "one" "$(cat "$B/d/f-moved.txt")" "B reads A's renamed file"

# B leaves: A is alone again and keeps working.
ws_umount "$B"
echo "after B left" > "$A/d/after.txt"
assert_eq "after B left" "$(cat "$A/d/after.txt")" "A alone again"
ws_umount "$A"
log "PASS"
