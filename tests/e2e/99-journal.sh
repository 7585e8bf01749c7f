#!/usr/bin/env bash
# 99-journal: the task journal, written by the system, on a real FUSE mount of the
# embedded default. Desk alice on the mount (DESKFS_ROOT=$MNT/desks), with files b, c, f
# prepared; then
#   * `deskfs exec alice -- sh -c 'echo hi > a; echo x >> b; rm c; mkdir d; touch d/e;
#     mv f g'` is one line of .desk/journal/_desk.jsonl, and `deskfs journal alice --json`
#     shows exactly: created a, d/, d/e, g; changed b; deleted c, f; exit 0, a duration,
#     the argv, the cwd, output "not captured" (the CLI passes its stdio through);
#   * a file made and removed inside one exec is in no list; a tmp-file-then-rename over
#     an existing file is "changed"; a directory tree removed (rm -r) lists its files;
#   * an exec making more changes than the ring holds is marked changes_overflowed;
#   * a failing exec (exit 3) and one killed by a signal (128+9) are recorded with their
#     status; changes made outside the exec window are not attributed to it;
#   * an exec in a task worktree goes to .desk/journal/TASK.jsonl with cwd tasks/TASK;
#     `deskfs journal alice --task T` shows it, `deskfs resume alice` (text and --json)
#     shows the last entries of the open task;
#   * a desk on a plain directory (--root outside the mount): the entry says the changes
#     are unknown (files null with the reason), never an empty list;
#   * bad inputs: unknown agent, unknown task, invalid task name, --limit 0: one line on
#     stderr, non-zero exit; a torn last line in a journal is skipped by the reader.
# e2e-cost: 41
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd bwrap python3 git
"$DESKFS" journal --help > /dev/null 2>&1 || skip "deskfs journal is not in $DESKFS"

NAME=jrn$RANDOM
ws_format "$NAME"
ws_mount "$NAME" "$MNT"
export DESKFS_ROOT=$MNT/desks
dfs_ok desk create alice
A=$DESKFS_ROOT/alice
J=$A/.desk/journal

ex() { # deskfs exec ARGS... (stdin closed); sets RC
  RC=0
  timeout -k 5 120 "$DESKFS" exec "$@" > "$T/ex.out" 2> "$T/ex.err" < /dev/null || RC=$?
}

# jq-less JSON checks: py EXPR-FILE-ARGS; the journal JSON is on stdin.
check_last() { # PYTHON (gets `e`, the newest entry of `deskfs journal alice --json ARGS`) ARGS...
  local code=$1; shift
  dfs journal alice --json "$@" > "$T/j.json" || fail "deskfs journal alice --json $* failed"
  python3 - "$T/j.json" "$code" <<'EOF' || fail "journal check failed: $code (journal: $(head -c 3000 "$T/j.json"))"
import json, sys
entries = json.load(open(sys.argv[1]))
assert entries, "no entries"
e = entries[-1]
ok = eval(sys.argv[2], {"e": e, "entries": entries})
if not ok:
    print(json.dumps(e, indent=1), file=sys.stderr)
    sys.exit(1)
EOF
}

# ---------------------------------------------------------------- the main case
printf 'b\n' > "$A/b"
printf 'c\n' > "$A/c"
printf 'f\n' > "$A/f"
ex alice -- sh -c 'echo hi > a; echo x >> b; rm c; mkdir d; touch d/e; mv f g'
assert_eq 0 "$RC" "exit of the main exec (stderr: $(cat "$T/ex.err"))"
[[ -f $J/_desk.jsonl ]] || fail "no $J/_desk.jsonl after an exec outside tasks"
assert_eq 1 "$(wc -l < "$J/_desk.jsonl")" "journal lines after one exec"
check_last 'e["files"] == {"created": ["a", "d/", "d/e", "g"], "changed": ["b"], "deleted": ["c", "f"]}'
check_last 'e["exit_code"] == 0 and e["signal"] is None and not e["timed_out"] and not e["changes_overflowed"]'
check_last 'e["command"] == ["sh", "-c", "echo hi > a; echo x >> b; rm c; mkdir d; touch d/e; mv f g"]'
check_last 'e["cwd"] == "" and e["task"] is None and e["via"] == "cli" and isinstance(e["duration_ms"], int)'
check_last 'e["output_captured"] is False and "not captured" in e["output_note"] and e["start"].endswith("Z")'
log "main exec recorded: $(tail -c 400 "$J/_desk.jsonl")"

# Human output: the counts and the command.
out=$(dfs journal alice) || fail "deskfs journal alice failed"
[[ $out == *"exit 0"*"+4 ~1 -2"*"sh -c"* ]] || fail "journal table lacks exit/counts/command: $out"
out=$(dfs journal alice --files) || fail "deskfs journal alice --files failed"
[[ $out == *"+ d/e"* && $out == *"~ b"* && $out == *"- c"* ]] || fail "journal --files lacks the paths: $out"

# ---------------------------------------------------------------- netting
printf 'keep\n' > "$A/keep"
mkdir -p "$A/tree/sub" && printf '1\n' > "$A/tree/sub/one" && printf '2\n' > "$A/tree/two"
ex alice -- sh -c 'echo t > tmp1; rm tmp1; echo new > keep.tmp; mv keep.tmp keep; rm -r tree'
assert_eq 0 "$RC" "exit of the netting exec (stderr: $(cat "$T/ex.err"))"
check_last 'e["files"] == {"created": [], "changed": ["keep"], "deleted": ["tree/", "tree/sub/", "tree/sub/one", "tree/two"]}'

# Changes outside the exec window are not its own.
printf 'outside\n' > "$A/outside-before"
ex alice -- true
printf 'outside\n' > "$A/outside-after"
check_last 'e["files"] == {"created": [], "changed": [], "deleted": []}'

# ---------------------------------------------------------------- ring overflow
# 33,000 files made and removed: 66,000 changes, more than the ring's 65,536. The entry
# must say it is incomplete, never claim "nothing changed".
ex alice -- python3 -c 'import os
for i in range(33000):
    open(f"o{i}", "w").close(); os.unlink(f"o{i}")
open("after", "w").close()'
assert_eq 0 "$RC" "exit of the overflowing exec (stderr: $(cat "$T/ex.err"))"
check_last 'e["changes_overflowed"] is True and "after" in e["files"]["created"]'
out=$(dfs journal alice --limit 1) || fail "journal --limit 1"
[[ $out == *"(incomplete)"* ]] || fail "journal table does not mark the overflow: $out"

# ---------------------------------------------------------------- exit statuses
ex alice -- sh -c 'echo oops > failed.txt; exit 3'
assert_eq 3 "$RC" "exit code passed through"
check_last 'e["exit_code"] == 3 and e["files"]["created"] == ["failed.txt"]'
ex alice -- sh -c 'kill -9 $$'
assert_eq 137 "$RC" "a signal death passed through as 128+9"
check_last 'e["exit_code"] == 137'
out=$(dfs journal alice --limit 2) || fail "journal --limit 2"
[[ $out == *"exit 3"* && $out == *"exit 137"* ]] || fail "journal table lacks the failing execs: $out"

# ---------------------------------------------------------------- a task
git init -q -b main "$A/repos/app"
git -C "$A/repos/app" commit -q --allow-empty -m first
dfs_ok task start alice fix-1 --repo app
ex alice --task fix-1 -- sh -c 'echo code > main.c'
assert_eq 0 "$RC" "exec in a task (stderr: $(cat "$T/ex.err"))"
[[ -f $J/fix-1.jsonl ]] || fail "no $J/fix-1.jsonl after an exec in task fix-1"
check_last 'e["task"] == "fix-1" and e["cwd"] == "tasks/fix-1" and e["files"]["created"] == ["tasks/fix-1/main.c"]' --task fix-1
check_last 'len(entries) == 1' --task fix-1
check_last 'e["exit_code"] == 137 and e["task"] is None' --task _desk
out=$(dfs resume alice) || fail "resume"
[[ $out == *"last execs"*"fix-1"*"exit 0"*"+1 ~0 -0"*"echo code > main.c"* ]] || fail "resume does not show the task's last exec: $out"
dfs resume alice --json > "$T/resume.json" || fail "resume --json"
python3 - "$T/resume.json" <<'EOF' || fail "resume --json lacks the journal: $(head -c 2000 "$T/resume.json")"
import json, sys
r = json.load(open(sys.argv[1]))
tails = {j["task"]: j["entries"] for j in r["journal"]}
assert tails["fix-1"][-1]["files"]["created"] == ["tasks/fix-1/main.c"], tails
assert len(tails["_desk"]) == 3, tails["_desk"]
assert tails["_desk"][-1]["exit_code"] == 137, tails["_desk"]
EOF

# ---------------------------------------------------------------- not on a mount
PLAIN=$T/plain-root
mkdir -p "$PLAIN"
DESKFS_ROOT=$PLAIN dfs_ok desk create bob
RC=0
DESKFS_ROOT=$PLAIN timeout -k 5 60 "$DESKFS" exec bob -- sh -c 'echo x > y' > /dev/null 2>&1 < /dev/null || RC=$?
assert_eq 0 "$RC" "exec on a plain-directory desk"
DESKFS_ROOT=$PLAIN dfs journal bob --json > "$T/bob.json" || fail "journal of bob"
python3 - "$T/bob.json" <<'EOF' || fail "a plain-directory desk's entry: $(cat "$T/bob.json")"
import json, sys
e = json.load(open(sys.argv[1]))[-1]
assert e["files"] is None and "not on a deskfs mount" in e["changes_unknown"], e
EOF

# ---------------------------------------------------------------- a torn last line
printf '{"id":"torn","via":"cl' >> "$J/fix-1.jsonl"
check_last 'len(entries) == 1' --task fix-1
ex alice --task fix-1 -- true
check_last 'len(entries) == 2 and e["command"] == ["true"]' --task fix-1

# ---------------------------------------------------------------- bad inputs
bad() { # EXPECTED-TEXT ARGS...
  local want=$1; shift
  local rc=0
  timeout -k 5 30 "$DESKFS" "$@" > "$T/bad.out" 2> "$T/bad.err" < /dev/null || rc=$?
  ((rc != 0)) || fail "deskfs $* succeeded"
  assert_eq 1 "$(wc -l < "$T/bad.err")" "lines on stderr of deskfs $* ($(cat "$T/bad.err"))"
  grep -q -- "$want" "$T/bad.err" || fail "deskfs $*: expected '$want' in: $(cat "$T/bad.err")"
}
bad 'no desk for agent "nobody"' journal nobody
bad 'no task "nope"' journal alice --task nope
bad 'invalid task name' journal alice --task 'a/b'
bad 'limit' journal alice --limit 0
bad 'invalid task name' task start alice _desk --repo app

ws_umount "$MNT"
log "ok"
