#!/usr/bin/env bash
# 67-desk-bad-input: bad input to the desk commands on a real deskfs mount. Each case:
# a non-zero exit, exactly one `deskfs: error:` line naming the problem, and nothing
# half-created (the desk tree is compared before and after). Cases: unknown agent, unknown
# task, invalid agent and task names ("a..b", "x/y", "-x", ...), a bad --branch, a repo that
# is not a git repository, a duplicate desk, `desk rm` without a terminal or --yes,
# concurrent `task start` of the same task (exactly one of two wins, three rounds), several
# mounted workspaces and none (no default root), a desk root that is not on a deskfs mount
# (allowed, one warning line), git's special refs as task or branch names (FETCH_HEAD,
# orig_head, ...), bad repo names for `manual repo`, a repo whose .git (or itself) is a
# symlink out of the desk (refused; tidy warns and touches nothing outside), a branch
# committing a symlink that a .worktreeinclude copy would go through (skipped with a
# warning), and manual drift (a tool recorded from tools/bin, then
# removed: `manual check` reports it and exits 1; the human part of AGENTS.md is kept byte
# for byte by `manual record`).
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd git

NAME=bad
ws_format "$NAME"
ws_mount "$NAME" "$MNT"
dfs_ok desk create bob
DESK=$MNT/desks/bob

SRC=$T/src
git init -q -b main "$SRC"
echo hi > "$SRC/README" && git -C "$SRC" add -A && git -C "$SRC" commit -qm one
git clone -q "$SRC" "$DESK/repos/app"
mkdir -p "$DESK/repos/plain" && echo "not a repo" > "$DESK/repos/plain/file"

# expect_error PATTERN ARGS...: deskfs ARGS fails with one error line matching PATTERN
# (a glob) and no other output than desk-root warnings; the desk root is unchanged.
expect_error() {
  local pat=$1; shift
  tree_manifest "$MNT/desks" > "$T/before"
  local out rc=0
  out=$(dfs "$@" 2> "$T/err") || rc=$?
  ((rc != 0)) || fail "deskfs $* succeeded; expected an error like '$pat' (stdout: $out)"
  ((rc != 124)) || fail "deskfs $* timed out"
  grep -v '^deskfs: warning: ' "$T/err" > "$T/err.lines" || true
  [[ $(wc -l < "$T/err.lines") == 1 ]] || fail "deskfs $*: expected one error line, got: $(cat "$T/err")"
  local line
  line=$(cat "$T/err.lines")
  [[ $line == "deskfs: error: "* ]] || fail "deskfs $*: not a deskfs error line: $line"
  # shellcheck disable=SC2053
  [[ $line == $pat ]] || fail "deskfs $*: error '$line' does not match '$pat'"
  [[ -z $out ]] || fail "deskfs $*: unexpected stdout on error: $out"
  assert_same_tree "$T/before" "$MNT/desks" "deskfs $* must leave nothing behind"
}

# ---------------------------------------------------------------- unknown things
expect_error '*no desk for agent "nobody"*known: bob*' desk show nobody
expect_error '*no desk for agent "nobody"*' task start nobody t1 --repo app
expect_error '*no desk for agent "nobody"*' resume nobody
expect_error '*no task "nope" on desk "bob"*' task finish bob nope
expect_error '*no task "nope" on desk "bob"*' exec bob --task nope -- true
expect_error '*no repo "nope"*known: app, plain*' task start bob t1 --repo nope
expect_error '*invalid repo name "../app": a repo name is one directory under repos/*' task start bob t1 --repo ../app

# ---------------------------------------------------------------- invalid names
expect_error '*invalid agent name ".hidden"*' desk create .hidden
expect_error '*invalid agent name "a/b"*' desk create a/b
expect_error '*invalid task name "a..b": it cannot contain '"'..'"'*' task start bob a..b --repo app
expect_error '*invalid task name "x/y": a task name is one path component*' task start bob x/y --repo app
expect_error '*invalid task name "-x": it cannot start with '"'-'"'*' task start bob --repo app -- -x
expect_error '*invalid task name "t.lock"*' task start bob t.lock --repo app
expect_error '*invalid task name "a b"*' task start bob "a b" --repo app
expect_error '*invalid branch name "b~1"*' task start bob t1 --repo app --branch 'b~1'
# git's special refs (a branch of that name is shadowed by the pseudoref), any case.
expect_error '*invalid task name "FETCH_HEAD": FETCH_HEAD is one of git'"'"'s special refs*pick another name*' task start bob FETCH_HEAD --repo app
expect_error '*invalid task name "orig_head": ORIG_HEAD is one of git'"'"'s special refs*' task start bob orig_head --repo app
expect_error '*invalid task name "HEAD"*special refs*' task start bob HEAD --repo app
expect_error '*invalid branch name "MERGE_HEAD"*special refs*' task start bob t1 --repo app --branch MERGE_HEAD
expect_error '*invalid task name "a*b": it cannot contain*' task start bob "$(printf 'a\001b')" --repo app
# Repo names of `manual repo`: one existing directory under repos/.
expect_error '*invalid repo name "../app": a repo name is one directory under repos/*' manual repo bob ../app --test-cmd 'make test'
expect_error '*invalid repo name "a/b"*' manual repo bob a/b --test-cmd 'make test'
expect_error '*invalid repo name ".hidden": it cannot start with '"'.'"'*' manual repo bob .hidden --test-cmd 'make test'
expect_error '*invalid repo name "-x": it cannot start with '"'-'"'*' manual repo bob --test-cmd 'make test' -- -x
expect_error '*invalid repo name "": it is empty*' manual repo bob '' --test-cmd 'make test'
expect_error '*invalid repo name "rrr*": longer than 255 bytes*' manual repo bob "$(printf 'r%.0s' {1..256})" --test-cmd 'make test'
expect_error '*no repo "nope"*known: app, plain*' manual repo bob nope --test-cmd 'make test'

# ---------------------------------------------------------------- not a repo, duplicates
expect_error '*repos/plain is not a git repository*' task start bob t1 --repo plain
expect_error '*desk "bob" already exists at*' desk create bob
expect_error '*refusing to remove desk bob without confirmation*--yes*' desk rm bob
[[ -d $DESK/repos/app ]] || fail "desk rm without --yes removed something"

# A branch checked out in another task: git's refusal, and the start is rolled back.
dfs_ok task start bob first --repo app
expect_error '*already used by worktree*' task start bob second --repo app --branch first
[[ ! -e $DESK/tasks/second && ! -e $DESK/.desk/tasks/second.toml ]] || fail "a failed start left files"
expect_error '*task "first" already exists*' task start bob first --repo app

# ---------------------------------------------------------------- concurrent starts
for round in 1 2 3; do
  t=race$round
  pids=()
  for i in 1 2; do
    dfs task start bob "$t" --repo app > "$T/race.$round.$i.out" 2>&1 &
    pids+=($!)
  done
  wins=0
  for i in 1 2; do
    if wait "${pids[$((i - 1))]}"; then
      wins=$((wins + 1))
    else
      err=$(grep -v '^deskfs: warning: ' "$T/race.$round.$i.out")
      [[ $(wc -l <<< "$err") == 1 ]] || fail "losing start of $t: not one line: $err"
      [[ $err == *"task \"$t\" is busy"* || $err == *"task \"$t\" already exists"* ]] || fail "losing start of $t: unexpected error: $err"
    fi
  done
  assert_eq 1 "$wins" "concurrent starts of $t that succeeded"
  assert_eq 1 "$(git -C "$DESK/repos/app" worktree list | grep -c "/tasks/$t ")" "worktrees of $t"
  [[ -f $DESK/.desk/tasks/$t.toml ]] || fail "the winning start of $t has no record"
done
[[ -z $(find "$DESK/.desk/locks" -name 'task-*.lock') ]] || fail "task locks left behind: $(ls "$DESK/.desk/locks")"
out=$(dfs resume bob --json) || fail "resume failed"
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["warnings"]==[], r["warnings"]; assert len(r["tasks"])==4, r["tasks"]' "$out" \
  || fail "resume after the races is not clean: $out"

# ---------------------------------------------------------------- desk roots
# Not a deskfs mount: allowed, with one warning line.
dfs --root "$T/plain-root" desk create carol > "$T/plain.out" 2> "$T/plain.err" || fail "desk on a plain dir failed: $(cat "$T/plain.err")"
[[ $(wc -l < "$T/plain.err") == 1 ]] && grep -q "^deskfs: warning: desk root $T/plain-root is not on a deskfs mount" "$T/plain.err" \
  || fail "expected one warning line for a non-deskfs root, got: $(cat "$T/plain.err")"
[[ -f $T/plain-root/carol/desk.toml ]] || fail "the desk on a plain dir was not created"
grep -q "^carol	" <<< "$(DESKFS_ROOT=$T/plain-root dfs desk list 2> /dev/null)" || fail "DESKFS_ROOT is not honoured"

# Two workspaces mounted: the default root is ambiguous.
ws_format other
ws_mount other "$MNT2"
expect_error "*several deskfs workspaces are mounted*$MNT*$MNT2*--root*" desk list
grep -q "^bob	" <<< "$(dfs desk --root "$MNT/desks" list)" || fail "--root does not pick the desk root"
ws_umount "$MNT2"

# ---------------------------------------------------------------- manual drift
cat > "$DESK/tools/bin/mytool" <<'SH'
#!/bin/sh
echo "mytool 1.2.3"
SH
chmod +x "$DESK/tools/bin/mytool"
printf '\n## Quirks\n- the build needs  two spaces\t(tab)  \n' >> "$DESK/AGENTS.md"
human() { awk '/^<!-- deskfs:manual:begin/{skip=1} !skip{print} /^<!-- deskfs:manual:end -->/{skip=0}' "$1"; }
human "$DESK/AGENTS.md" > "$T/human.before"
out=$(dfs manual record bob mytool 2>&1) || fail "manual record failed: $out"
assert_eq "recorded tool mytool: mytool 1.2.3 (\`mytool --version\`)" "$out" "manual record output"
human "$DESK/AGENTS.md" > "$T/human.after"
cmp -s "$T/human.before" "$T/human.after" || fail "manual record changed the human part: $(diff "$T/human.before" "$T/human.after")"
grep -q '^version = "mytool 1.2.3"$' "$DESK/AGENTS.md" || fail "the machine part lacks the version: $(cat "$DESK/AGENTS.md")"
assert_eq "manual of desk bob matches the desk" "$(dfs manual check bob)" "manual check before the drift"
expect_error '*version command "nosuch --version" of tool "nosuch" failed*' manual record bob nosuch
rm "$DESK/tools/bin/mytool"
rc=0
dfs manual check bob > "$T/check.out" 2> "$T/check.err" || rc=$?
((rc == 1)) || fail "manual check with a removed tool must exit 1, got $rc"
grep -q '^drift: tool mytool: `mytool --version` failed (exit 127' "$T/check.out" || fail "manual check report: $(cat "$T/check.out")"
[[ $(wc -l < "$T/check.err") == 1 ]] && grep -q "^deskfs: error: the manual of desk bob has 1 drift item" "$T/check.err" \
  || fail "manual check error line: $(cat "$T/check.err")"
grep -q "^! manual drift: tool mytool" <<< "$(dfs resume bob)" || fail "resume does not warn about the drift"

# ---------------------------------------------------------------- symlinks out of the desk
# A repo whose .git is a symlink to a repository outside the desk: refused by task start
# (one line) and left alone by tidy (one warning line; nothing outside is touched).
OUT=$T/outside-repo
git clone -q "$SRC" "$OUT"
: > "$OUT/.git/index.lock"
touch -d '3 hours ago' "$OUT/.git/index.lock"
mkdir "$DESK/repos/evil" && ln -s "$OUT/.git" "$DESK/repos/evil/.git"
expect_error '*refusing to act on repo "evil": its .git is a symlink*' task start bob t9 --repo evil
ln -s "$OUT" "$DESK/repos/linked"
expect_error '*refusing to act on repo "linked": repos/linked is a symlink*' task start bob t9 --repo linked
dfs desk tidy bob > "$T/tidy.out" 2> "$T/tidy.err" || fail "tidy with a refused repo failed: $(cat "$T/tidy.err")"
[[ $(grep -c '^deskfs: warning: refusing to act on repo "evil": its .git is a symlink' "$T/tidy.err") == 1 ]] \
  || fail "tidy: expected one warning line for repos/evil, got: $(cat "$T/tidy.err")"
[[ -e $OUT/.git/index.lock ]] || fail "tidy removed a git lock file outside the desk: $(cat "$T/tidy.out")"
rm -rf "$DESK/repos/evil" "$DESK/repos/linked"

# A branch that commits a directory as a symlink out of the desk: the .worktreeinclude
# file under it is not copied through it (one warning line), the task starts.
INC=$DESK/repos/inc
git clone -q "$SRC" "$INC"
printf 'config/*.toml\n' > "$INC/.worktreeinclude"
printf 'config/local.toml\n' > "$INC/.gitignore"
git -C "$INC" add -A && git -C "$INC" -c user.name=t -c user.email=t@x commit -qm include
mkdir -p "$T/outside-dir"
git -C "$INC" checkout -q -b evil
ln -s "$T/outside-dir" "$INC/config"
git -C "$INC" add config && git -C "$INC" -c user.name=t -c user.email=t@x commit -qm link
git -C "$INC" checkout -q main
mkdir "$INC/config" && echo 'secret = 1' > "$INC/config/local.toml"
dfs task start bob evil --repo inc > "$T/inc.out" 2> "$T/inc.err" || fail "task start on the evil branch failed: $(cat "$T/inc.err")"
[[ $(wc -l < "$T/inc.err") == 1 ]] && grep -q '^deskfs: warning: .worktreeinclude: skipped config/local.toml: a part of its path in the task worktree is a symlink' "$T/inc.err" \
  || fail "expected one warning line for the skipped copy, got: $(cat "$T/inc.err")"
[[ ! -e $T/outside-dir/local.toml ]] || fail "task start copied a .worktreeinclude file out of the desk"

# ---------------------------------------------------------------- no workspace mounted
ws_umount "$MNT"
expect_error '*no deskfs workspace is mounted*--root*' desk list
log "ok"
