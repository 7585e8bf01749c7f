#!/usr/bin/env bash
# 66-desk-session: a scripted agent session on a desk on a real deskfs mount.
# A desk is created under desks/ of the only mounted workspace, a repo (with a
# .worktreeinclude naming an ignored .env) is cloned into repos/, two tasks are started in
# parallel worktrees (both at once), one gets a commit made inside `deskfs exec --task`,
# the other uncommitted and untracked changes. Then a running `deskfs exec` (sleeping in the
# task) and the mount daemon are both killed with SIGKILL; the dead mount is cleared, the
# workspace remounted, and `deskfs resume` (text and --json) must report both tasks with
# their true state (1 ahead and clean; 1 modified + 1 untracked). The same workspace is then
# mounted at a second mount point: git works in the task there, from the repo and from
# inside exec at /desk (relative worktree links; locked registrations survive
# `git worktree prune`). Both tasks are finished (the dirty one is refused first), and
# `desk tidy` finds nothing stale from the crash: only the merged branch of the finished
# task without commits, and nothing on a second run.
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd git bwrap

NAME=desk
ws_format "$NAME"
ws_mount "$NAME" "$MNT"

# ---------------------------------------------------------------- desk and repo
out=$(dfs desk create alice 2>&1) || fail "desk create failed: $out"
[[ $out == "created desk alice at $MNT/desks/alice" ]] || fail "desk create said: $out"
[[ $out != *warning* ]] || fail "a desk on a deskfs mount must not warn: $out"
DESK=$MNT/desks/alice
for d in repos notes tasks tools/bin .cache/cargo .cache/npm .cache/pip .cache/uv .cache/go; do
  [[ -d $DESK/$d ]] || fail "new desk lacks $d/"
done
[[ $(readlink "$DESK/CLAUDE.md") == AGENTS.md ]] || fail "CLAUDE.md is not a link to AGENTS.md"
grep -q '^<!-- deskfs:manual:begin' "$DESK/AGENTS.md" || fail "AGENTS.md has no machine part"

SRC=$T/src
git init -q -b main "$SRC"
printf 'hello\n' > "$SRC/README"
printf '.env\nbuild/\n' > "$SRC/.gitignore"
printf '# ignored files a task needs\n.env\n' > "$SRC/.worktreeinclude"
git -C "$SRC" add -A && git -C "$SRC" commit -qm "first"
printf 'one\n' > "$SRC/lib.txt"
git -C "$SRC" add -A && git -C "$SRC" commit -qm "second"
git clone -q "$SRC" "$DESK/repos/app"
# The agent's identity lives in the repo (inside exec, HOME is /desk and /tmp is private).
git -C "$DESK/repos/app" config user.name "alice (agent)"
git -C "$DESK/repos/app" config user.email alice@deskfs.invalid
printf 'API_TOKEN=s3cret\n' > "$DESK/repos/app/.env"
mkdir -p "$DESK/repos/app/build" && echo obj > "$DESK/repos/app/build/out.o"

# ---------------------------------------------------------------- two tasks at once
dfs task start alice feat --repo app > "$T/start-feat.out" 2>&1 & P1=$!
dfs task start alice fix --repo app > "$T/start-fix.out" 2>&1 & P2=$!
wait "$P1" || fail "task start feat failed: $(cat "$T/start-feat.out")"
wait "$P2" || fail "task start fix failed: $(cat "$T/start-fix.out")"
for t in feat fix; do
  W=$DESK/tasks/$t
  assert_eq "gitdir: ../../repos/app/.git/worktrees/$t" "$(cat "$W/.git")" "relative .git link of $t"
  assert_eq "API_TOKEN=s3cret" "$(cat "$W/.env")" ".env copied into $t by .worktreeinclude"
  [[ ! -e $W/build ]] || fail "build/ is ignored but not in .worktreeinclude: must not be copied"
  assert_eq "$t" "$(git -C "$W" symbolic-ref --short HEAD)" "branch of $t"
done
grep -q "copied .env" "$T/start-feat.out" || fail "task start does not report the copied .env: $(cat "$T/start-feat.out")"
assert_eq 3 "$(git -C "$DESK/repos/app" worktree list | wc -l)" "worktrees (main + 2 tasks)"

# ---------------------------------------------------------------- work in the tasks
dfs_ok exec alice --task feat -- sh -c 'echo feature > feature.txt && git add feature.txt && git commit -qm "add feature" && test "$(pwd)" = /desk/tasks/feat'
dfs_ok exec alice --task fix -- sh -c 'echo "one, fixed" > lib.txt'

# A long-running exec in the fix task, killed with SIGKILL mid-task.
MARK=3171
setsid "$DESKFS" exec alice --task fix -- sh -c "echo partial > wip.txt; exec sleep $MARK" > "$T/exec-kill.out" 2>&1 < /dev/null &
EXEC_PID=$!
register_pid "$EXEC_PID"
wait_for 30 test -e "$DESK/tasks/fix/wip.txt" || fail "the sandboxed command did not start: $(cat "$T/exec-kill.out")"
sleep_running() { # is "sleep $MARK" running anywhere (no procps needed)
  local f
  for f in /proc/[0-9]*/cmdline; do
    [[ $(tr '\0' ' ' 2> /dev/null < "$f") == "sleep $MARK " ]] && return 0
  done
  return 1
}
sleep_running || fail "sleep $MARK is not running inside exec"

DAEMON=$(dfs status "$NAME" --json | python3 -c 'import json,sys; v=json.load(sys.stdin); v=v[0] if isinstance(v,list) else v; print(v["mounts"][0]["pid"])')
[[ $DAEMON =~ ^[0-9]+$ ]] || fail "no daemon pid from deskfs status --json: $DAEMON"
log "kill -9 of the mount daemon $DAEMON and of deskfs exec $EXEC_PID"
kill -KILL "$DAEMON"
kill -KILL "$EXEC_PID"
wait_for 15 eval '! sleep_running' || fail "the sandboxed sleep survived kill -9 of deskfs exec"
wait_for 15 eval '! pid_running "$DAEMON"' || fail "daemon $DAEMON still running after kill -9"
force_unmount "$MNT" || fail "cannot clear the dead mount at $MNT"
ws_mount "$NAME" "$MNT"

# ---------------------------------------------------------------- resume after the crash
dfs manual repo alice app --test-cmd 'make test' --build-cmd 'make' > /dev/null || fail "manual repo failed"
dfs resume alice > "$T/resume.txt" 2> "$T/resume.err" || fail "resume failed: $(cat "$T/resume.err")"
grep -qF 'repo app: test `make test`, build `make`' "$T/resume.txt" \
  || fail "resume does not tell how to test and build the repo: $(cat "$T/resume.txt")"
grep -q "^feat  repo app  branch feat  1 ahead, 0 behind origin/main  clean$" "$T/resume.txt" \
  || fail "resume does not show feat as 1 ahead and clean: $(cat "$T/resume.txt")"
grep -q "^fix  repo app  branch fix  0 ahead, 0 behind origin/main  1 uncommitted, 1 untracked$" "$T/resume.txt" \
  || fail "resume does not show fix's uncommitted + untracked changes: $(cat "$T/resume.txt")"
grep -q "^! task fix has 2 uncommitted or untracked file(s)" "$T/resume.txt" || fail "resume does not warn about the dirty task: $(cat "$T/resume.txt")"
grep -q "# Desk manual: alice" "$T/resume.txt" || fail "resume does not show the manual"
dfs resume alice --json > "$T/resume.json" || fail "resume --json failed"
python3 - "$T/resume.json" <<'PY' || fail "resume --json does not report the true task state"
import json, sys
r = json.load(open(sys.argv[1]))
t = {x["name"]: x for x in r["tasks"]}
assert set(t) == {"feat", "fix"}, t.keys()
f, x = t["feat"]["state"], t["fix"]["state"]
assert (f["branch"], f["ahead"], f["behind"], f["uncommitted"], f["untracked"]) == ("feat", 1, 0, 0, 0), f
assert (x["branch"], x["ahead"], x["uncommitted"], x["untracked"]) == ("fix", 0, 1, 1), x
assert sorted(x["changed_paths"]) == ["lib.txt", "wip.txt"], x
kinds = sorted(w["kind"] for w in r["warnings"])
assert kinds == ["dirty-task"], r["warnings"]
assert "deskfs:manual:begin" not in r["manual"]
PY

# ---------------------------------------------------------------- another mount point
ws_umount "$MNT"
ws_mount "$NAME" "$MNT2"
D2=$MNT2/desks/alice
assert_eq "" "$(git -C "$D2/tasks/feat" status --porcelain)" "git status of feat at the second mount point"
assert_eq "add feature" "$(git -C "$D2/tasks/feat" log -1 --format=%s)" "feat's commit at the second mount point"
echo more > "$D2/tasks/feat/more.txt"
git -C "$D2/tasks/feat" add more.txt
git -C "$D2/tasks/feat" -c user.name=t -c user.email=t@x commit -qm "second mount commit"
# prune must keep the registrations (from the repo and from a task) though the back
# links still name the first mount point.
git -C "$D2/repos/app" worktree prune
git -C "$D2/tasks/fix" worktree prune
[[ -d $D2/repos/app/.git/worktrees/feat && -d $D2/repos/app/.git/worktrees/fix ]] || fail "git worktree prune dropped a task registration"
grep -q "tasks/feat .* \[feat\] locked" <<< "$(git -C "$D2/repos/app" worktree list)" || fail "worktree list: $(git -C "$D2/repos/app" worktree list)"
# The first deskfs command at the new place repairs the back links.
dfs_ok task list alice
assert_eq "$D2/tasks/feat/.git" "$(cat "$D2/repos/app/.git/worktrees/feat/gitdir")" "back link repaired to the second mount point"
grep -q "^$D2/tasks/fix " <<< "$(git -C "$D2/repos/app" worktree list)" || fail "worktree list after repair: $(git -C "$D2/repos/app" worktree list)"
# Inside exec the desk is at /desk.
out=$(dfs exec alice --task feat -- sh -c 'git status --porcelain; git log -1 --format=%s; git -C /desk/repos/app worktree list | wc -l; git worktree prune; test -d /desk/repos/app/.git/worktrees/feat && echo kept') \
  || fail "git inside exec failed: $out"
assert_eq $'second mount commit\n3\nkept' "$out" "git status/log/worktree list/prune inside exec"

# ---------------------------------------------------------------- finish and tidy
out=$(dfs task finish alice fix 2>&1) && fail "finishing a dirty task must fail: $out"
[[ $(wc -l <<< "$out") == 1 && $out == "deskfs: error: task \"fix\" has 2 uncommitted or untracked file(s)"* ]] || fail "dirty finish error: $out"
[[ -d $D2/tasks/fix && -f $D2/tasks/fix/wip.txt ]] || fail "a refused finish must keep the task"
out=$(dfs task finish alice fix --discard 2>&1) || fail "finish --discard failed: $out"
[[ $out == *"2 uncommitted change(s) discarded"* ]] || fail "finish --discard said: $out"
out=$(dfs task finish alice feat --note "ready for review" 2>&1) || fail "finish feat failed: $out"
[[ $out == "finished task feat: 2 commit(s) on branch feat; worktree removed; note $D2/notes/"*"-task-feat.md" ]] || fail "finish feat said: $out"
note=$(ls "$D2"/notes/*-task-feat.md)
grep -q "^# Task feat finished: 2 commit(s) on branch feat (repo app)" "$note" || fail "note: $(cat "$note")"
grep -q "add feature" "$note" && grep -q "ready for review" "$note" || fail "note lacks commits or text: $(cat "$note")"
[[ ! -e $D2/tasks/feat && ! -e $D2/tasks/fix ]] || fail "finished tasks left their directories"
assert_eq 1 "$(git -C "$D2/repos/app" worktree list | wc -l)" "worktrees after finishing"
git -C "$D2/repos/app" rev-parse -q --verify refs/heads/feat > /dev/null || fail "finish must keep the branch with the work"

dfs desk tidy alice --dry-run > "$T/tidy-dry.txt" || fail "tidy --dry-run failed"
dfs desk tidy alice > "$T/tidy.txt" || fail "tidy failed: $(cat "$T/tidy.txt")"
grep -v '^1 item' "$T/tidy.txt" > "$T/tidy-items.txt"
[[ $(wc -l < "$T/tidy-items.txt") == 1 ]] && grep -q "^removed	merged-branch	app:fix	" "$T/tidy-items.txt" \
  || fail "tidy must find only the merged branch of the finished task fix (nothing stale): $(cat "$T/tidy.txt")"
grep -q "^would remove	merged-branch	app:fix	" "$T/tidy-dry.txt" || fail "tidy --dry-run: $(cat "$T/tidy-dry.txt")"
assert_eq "desk alice: nothing to tidy" "$(dfs desk tidy alice)" "second tidy"
dfs resume alice --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["tasks"] == [] and r["warnings"] == [], r
assert [n["first_line"].split(":")[0] for n in r["notes"]] in (["Task feat finished", "Task fix finished"], ["Task fix finished", "Task feat finished"]), r["notes"]
' || fail "resume after finishing is not clean"
ws_umount "$MNT2"
log "ok"
