#!/usr/bin/env python3
"""Checks a running `deskfs serve` (the /v1 API) end to end, for tests/e2e/98-serve-http.sh.

usage: serve_check.py BASE_URL DESKS_DIR OUTSIDE_FILE TOKENS_JSON

TOKENS_JSON names tokens: {"rw": alice read-write, "ro": alice read-only, "bob": bob's,
"expired": alice's expired, "revoked": alice's revoked}. The desk of alice exists under
DESKS_DIR with a symlink `out` planted to OUTSIDE_FILE's directory and `outfile` to
OUTSIDE_FILE itself. Every check prints one line; the first failure exits 1 with what
differed. Ends with "serve_check: N checks passed".
"""
import concurrent.futures
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

BASE, DESKS, OUTSIDE, TOKENS = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
DESK = os.path.join(DESKS, "alice")
passed = 0


def call(method, path, token="rw", body=None, headers=None, raw=False):
    """(status, headers, body bytes) of one request; never raises on HTTP errors."""
    h = dict(headers or {})
    if token:
        h["Authorization"] = "Bearer " + TOKENS.get(token, token)
    data = body
    if isinstance(body, (dict, list)):
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def ok(cond, what):
    global passed
    if not cond:
        print(f"serve_check: FAILED: {what}", flush=True)
        sys.exit(1)
    passed += 1


def expect_error(resp, status, code, what):
    st, _, body = resp
    try:
        err = json.loads(body)["error"]
    except Exception:
        ok(False, f"{what}: status {st}, body not an error JSON: {body[:200]!r}")
    ok(st == status and err.get("code") == code and isinstance(err.get("message"), str)
       and "\n" not in err["message"] and err["message"],
       f"{what}: want {status} {code}, got {st} {err}")


def j(resp, status, what):
    st, hd, body = resp
    ok(st == status, f"{what}: want {status}, got {st} {body[:300]!r}")
    return json.loads(body) if body else None


# ---------------------------------------------------------------- the document, desks
doc = j(call("GET", "/v1/openapi.json", token=None), 200, "openapi document")
ok(doc["openapi"].startswith("3.1") and "/v1/desks/{agent}/files/{path}" in doc["paths"], "openapi paths")
desks = j(call("GET", "/v1/desks"), 200, "list desks")
ok([d["agent"] for d in desks["desks"]] == ["alice"], f"a token sees only its desk: {desks}")
show = j(call("GET", "/v1/desks/alice"), 200, "show desk")
ok(show["agent"] == "alice" and "repos" in show and "tasks" in show, f"show: {show}")
expect_error(call("POST", "/v1/desks", body={"agent": "alice"}), 409, "exists", "create an existing desk")
expect_error(call("POST", "/v1/desks", body={"agent": "carol"}), 403, "token_scope", "create another agent's desk")
expect_error(call("GET", "/v1/nope"), 404, "not_found", "unknown endpoint")
expect_error(call("DELETE", "/v1/desks/alice/list"), 405, "method_not_allowed", "a method an endpoint does not take")
expect_error(call("GET", "/v1/desks/alice/files/%FF"), 400, "bad_request", "a path that is not UTF-8")
expect_error(call("POST", "/v1/desks/alice/mkdir", body={"path": "d", "parentz": True}), 400, "bad_request", "an unknown field")
st, _, _ = call("GET", "/v1/desks/alice/stat", token=None, headers={"Authorization": "bearer " + TOKENS["rw"]})
ok(st == 200, "the bearer scheme is case-insensitive")

# ---------------------------------------------------------------- files
st, hd, body = call("PUT", "/v1/desks/alice/files/notes/hello.txt", body=b"hello world\n")
ok(st == 201 and hd.get("etag"), f"create a file: {st} {body[:200]!r}")
etag1 = hd["etag"]
ok(open(os.path.join(DESK, "notes/hello.txt"), "rb").read() == b"hello world\n", "the file is on the mount")
st, hd, body = call("GET", "/v1/desks/alice/files/notes/hello.txt", token="ro")
ok(st == 200 and body == b"hello world\n" and hd.get("etag") == etag1, "read with a read-only token")
st, hd, body = call("GET", "/v1/desks/alice/files/notes/hello.txt", headers={"Range": "bytes=6-10"})
ok(st == 206 and body == b"world" and hd.get("content-range") == "bytes 6-10/12", f"range: {st} {body!r} {hd}")
st, hd, body = call("GET", "/v1/desks/alice/files/notes/hello.txt", headers={"Range": "bytes=-3"})
ok(st == 206 and body == b"ld\n", "suffix range")
expect_error(call("GET", "/v1/desks/alice/files/notes/hello.txt", headers={"Range": "bytes=50-"}),
             416, "range_not_satisfiable", "range past the end")
st, _, body = call("GET", "/v1/desks/alice/files/notes/hello.txt", headers={"Range": "items=0-1"})
ok(st == 200 and body == b"hello world\n", "a Range of another unit is ignored")
st, _, body = call("GET", "/v1/desks/alice/files/notes/hello.txt", headers={"Range": "bytes=6-99999999999999999999999"})
ok(st == 206 and body == b"world\n", "a Range end past 2^64 is clamped")
st, _, _ = call("GET", "/v1/desks/alice/files/notes/hello.txt", headers={"If-None-Match": etag1})
ok(st == 304, "If-None-Match with the current ETag: 304")
st, _, _ = call("GET", "/v1/desks/alice/files/notes/hello.txt", headers={"If-None-Match": '"x", W/' + etag1})
ok(st == 304, "If-None-Match with a list holding the weak form of the ETag: 304")
st, hd, body = call("PUT", "/v1/desks/alice/files/notes/hello.txt", body=b"v2\n", headers={"If-Match": etag1})
ok(st == 200 and hd["etag"] != etag1, f"replace with the right ETag: {st} {body[:200]!r}")
etag2 = hd["etag"]
expect_error(call("PUT", "/v1/desks/alice/files/notes/hello.txt", body=b"lost\n", headers={"If-Match": etag1}),
             412, "etag_mismatch", "replace with a stale ETag")
ok(open(os.path.join(DESK, "notes/hello.txt"), "rb").read() == b"v2\n", "a refused write changes nothing")
expect_error(call("PUT", "/v1/desks/alice/files/notes/hello.txt", body=b"x", headers={"If-None-Match": "*"}),
             409, "exists", "create-only over an existing file")
expect_error(call("PUT", "/v1/desks/alice/files/nodir/x", body=b"x"), 404, "not_found", "write into a missing dir")
big = os.urandom(5 * 1024 * 1024 + 7)
st, hd, _ = call("PUT", "/v1/desks/alice/files/big.bin", body=big)
ok(st == 201, "a 5 MiB file")
st, _, body = call("GET", "/v1/desks/alice/files/big.bin")
ok(body == big, "the 5 MiB file reads back whole")
st, _, body = call("GET", "/v1/desks/alice/files/big.bin", headers={"Range": "bytes=4194300-4194310"})
ok(st == 206 and body == big[4194300:4194311], "a range inside a large file")
stat = j(call("GET", "/v1/desks/alice/stat/notes/hello.txt"), 200, "stat")
ok(stat["kind"] == "file" and stat["size"] == 3 and stat["etag"] == etag2, f"stat: {stat}")
root = j(call("GET", "/v1/desks/alice/stat"), 200, "stat of the root")
ok(root["kind"] == "dir" and root["path"] == "", f"root stat: {root}")
made = j(call("POST", "/v1/desks/alice/mkdir", body={"path": "work/a/b", "parents": True}), 201, "mkdir -p")
ok(made["kind"] == "dir", "mkdir made a dir")
expect_error(call("POST", "/v1/desks/alice/mkdir", body={"path": "work/a/b"}), 409, "exists", "mkdir of an existing dir")
expect_error(call("POST", "/v1/desks/alice/mkdir", body={"nope": 1}), 400, "bad_request", "mkdir with a bad body")
moved = j(call("POST", "/v1/desks/alice/move", body={"from": "notes/hello.txt", "to": "work/a/hello.txt"}), 200, "move")
ok(moved["path"] == "work/a/hello.txt", f"move: {moved}")
ok(not os.path.exists(os.path.join(DESK, "notes/hello.txt")), "moved away")
call("PUT", "/v1/desks/alice/files/work/other", body=b"o")
expect_error(call("POST", "/v1/desks/alice/move", body={"from": "work/other", "to": "work/a/hello.txt"}),
             409, "exists", "move over an existing file without overwrite")
j(call("POST", "/v1/desks/alice/move", body={"from": "work/other", "to": "work/a/hello.txt", "overwrite": True}), 200, "move with overwrite")
lst = j(call("GET", "/v1/desks/alice/list/work/a"), 200, "list")
ok([e["path"] for e in lst["entries"]] == ["work/a/b", "work/a/hello.txt"], f"list: {lst}")
top = j(call("GET", "/v1/desks/alice/list"), 200, "list the root")
ok(any(e["path"] == "AGENTS.md" for e in top["entries"]), "the root lists the desk")
expect_error(call("POST", "/v1/desks/alice/move", body={"from": "work", "to": "work/a/inside"}), 400, "bad_request",
             "move a directory into itself")
expect_error(call("DELETE", "/v1/desks/alice/files/work"), 409, "not_empty", "delete a non-empty dir")
st, _, _ = call("DELETE", "/v1/desks/alice/files/work?recursive=true")
ok(st == 204 and not os.path.exists(os.path.join(DESK, "work")), "recursive delete")
expect_error(call("DELETE", "/v1/desks/alice/files/work"), 404, "not_found", "delete a missing path")
expect_error(call("GET", "/v1/desks/alice/files/notes"), 409, "is_dir", "read a directory")

# ---------------------------------------------------------------- tasks and resume
started = j(call("POST", "/v1/desks/alice/tasks", body={"task": "t1", "repo": "app"}), 201, "start a task")
ok(started["branch"] == "t1", f"task start: {started}")
tasks = j(call("GET", "/v1/desks/alice/tasks", token="ro"), 200, "list tasks")
ok([t["name"] for t in tasks["tasks"]] == ["t1"], f"tasks: {tasks}")
res = j(call("GET", "/v1/desks/alice/resume", token="ro"), 200, "resume")
ok("t1" in json.dumps(res), "resume shows the open task")
expect_error(call("POST", "/v1/desks/alice/tasks", body={"task": "t1", "repo": "app"}), 409, "exists", "start a task twice")
expect_error(call("POST", "/v1/desks/alice/tasks", body={"task": "FETCH HEAD", "repo": "app"}), 400, "bad_request", "bad task name")
expect_error(call("POST", "/v1/desks/alice/tasks", body={"task": "t2", "repo": "nope"}), 404, "not_found", "unknown repo")
expect_error(call("POST", "/v1/desks/alice/tasks", token="ro", body={"task": "t3", "repo": "app"}), 403, "read_only_token", "read-only task start")
call("PUT", "/v1/desks/alice/files/tasks/t1/wip.txt", body=b"work in progress")
expect_error(call("POST", "/v1/desks/alice/tasks/t1/finish", body={}), 409, "conflict", "finish with uncommitted work")
fin = j(call("POST", "/v1/desks/alice/tasks/t1/finish", body={"discard": True, "note": "via http"}), 200, "finish with discard")
ok(not os.path.exists(os.path.join(DESK, "tasks/t1")), f"the worktree is gone: {fin}")
expect_error(call("POST", "/v1/desks/alice/tasks/t1/finish", body={}), 404, "not_found", "finish a finished task")

# ---------------------------------------------------------------- exec (streamed) and status
def exec_open(body, token="rw", timeout=20):
    """POST .../exec: (status, headers, the open response) for a stream, else (status, headers, body)."""
    h = {"Authorization": "Bearer " + TOKENS.get(token, token), "Content-Type": "application/json"}
    req = urllib.request.Request(BASE + "/v1/desks/alice/exec", data=json.dumps(body).encode(), method="POST", headers=h)
    try:
        r = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
    return r.status, {k.lower(): v for k, v in r.headers.items()}, r


def sse_events(r):
    """(event, JSON data) of an SSE response, each as soon as its blank line arrives."""
    ev, data = None, []
    while True:
        line = r.readline()
        if not line:
            return
        line = line.decode().rstrip("\r\n")
        if line == "":
            if data:
                yield ev or "message", json.loads("\n".join(data))
            ev, data = None, []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                ev = value
            elif field == "data":
                data.append(value)


def chunk_bytes(d):
    return d["text"].encode() if "text" in d else __import__("base64").b64decode(d["base64"])


def exec_all(body, token="rw"):
    """Runs a command to its end: (stdout bytes, stderr bytes, exit or error event data, event names)."""
    st, hd, r = exec_open(body, token)
    ok(st == 200 and hd.get("content-type", "").startswith("text/event-stream"), f"exec {body}: {st} {hd} {r if isinstance(r, bytes) else ''}")
    out, err, end, names = b"", b"", None, []
    for ev, d in sse_events(r):
        names.append(ev)
        if ev == "stdout":
            out += chunk_bytes(d)
        elif ev == "stderr":
            err += chunk_bytes(d)
        elif ev in ("exit", "error"):
            end = (ev, d)
    r.close()
    ok(end is not None and names[-1] in ("exit", "error"), f"the stream ends with exit or error: {names}")
    return out, err, end


def sleepers(marker):
    """Processes on this host running `sleep MARKER` (the server runs here)."""
    n = 0
    for pid in os.listdir("/proc"):
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read() == b"sleep\0" + marker.encode() + b"\0":
                n += 1
        except OSError:
            pass
    return n


# Output arrives before the command ends, proven without timing: the command says "ready",
# then waits (bounded) for /desk/go, which this script makes over HTTP only after reading
# "ready"; the exit code says whether /desk/go existed when the command ended.
st, hd, r = exec_open({"shell": "echo ready; i=0; while [ ! -e /desk/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
                                "echo done; [ -e /desk/go ]", "timeout_secs": 60})
ok(st == 200 and hd.get("content-type", "").startswith("text/event-stream"), f"exec opens an event stream: {st} {hd}")
evs = sse_events(r)
try:
    first = next(evs)
except Exception as e:  # a server that holds output back until the end: the read times out
    first = ("nothing within 20 s", repr(e))
ok(first == ("stdout", {"text": "ready\n"}), f"the first output arrives while the command runs: {first}")
st, _, _ = call("PUT", "/v1/desks/alice/files/go", body=b"")
ok(st == 201, "make /desk/go while the command runs")
rest = list(evs)
r.close()
ok(rest[0] == ("stdout", {"text": "done\n"}) and rest[-1][0] == "exit", f"then the rest: {rest}")
x = rest[-1][1]
ok(x["code"] == 0 and x["timed_out"] is False and x["killed"] is False and x["stdout_bytes"] == 11
   and isinstance(x["duration_ms"], int), f"the command saw /desk/go before it ended: {x}")
call("DELETE", "/v1/desks/alice/files/go")

out, err, end = exec_all({"shell": "echo to-out; echo to-err >&2; exit 3"})
ok(out == b"to-out\n" and err == b"to-err\n", f"stdout and stderr arrive apart: {out!r} {err!r}")
ok(end[0] == "exit" and end[1]["code"] == 3 and end[1]["signal"] is None
   and end[1]["stdout_bytes"] == 7 and end[1]["stderr_bytes"] == 7, f"exit 3: {end}")
out, _, end = exec_all({"command": ["sh", "-c", "kill -TERM $$"]})
ok(end[1]["code"] == 143 and end[1]["signal"] == 15, f"a signal: {end}")
out, _, end = exec_all({"command": ["printf", "%s|", "a b", "$HOME"], "cwd": "repos/app", "env": {"MY_VAR": "v"}})
ok(out == b"a b|$HOME|" and end[1]["code"] == 0, f"argv is not split or expanded: {out!r}")
out, _, end = exec_all({"shell": "pwd; echo $MY_VAR", "cwd": "repos/app", "env": {"MY_VAR": "v"}})
ok(out == b"/desk/repos/app\nv\n", f"cwd and env: {out!r}")
out, _, end = exec_all({"shell": "printf '\\377\\376'"})
ok(out == b"\xff\xfe", f"binary output comes back exact: {out!r}")
out, _, end = exec_all({"shell": f"cat {OUTSIDE} /desk/out/{os.path.basename(OUTSIDE)} ../bob/AGENTS.md"})
ok(open(OUTSIDE, "rb").read() not in out and end[1]["code"] != 0, f"the sandbox shows nothing outside the desk: {out!r}")

# A timeout kills the command and everything it started, and the stream ends.
marker = f"3599.{os.getpid()}"
st, hd, r = exec_open({"shell": f"setsid sleep {marker} </dev/null >/dev/null 2>&1 & exec sleep 60", "timeout_secs": 2}, timeout=30)
ok(st == 200, f"exec with a timeout: {st}")
try:
    evs = list(sse_events(r))
except Exception as e:  # the command still running 30 s on: no event, the read timed out
    evs = [("nothing within 30 s", {"read": repr(e)})]
r.close()
x = evs[-1][1] if evs else {}
ok(evs and evs[-1][0] == "exit" and x["timed_out"] is True and x["killed"] is True and x["code"] == 137
   and x["signal"] == 9 and 2000 <= x["duration_ms"] < 20000, f"timeout_secs 2 on sleep 60: {evs}")
# SIGKILL to the sandbox's processes is delivered at once; their exit may lag the report.
deadline = time.time() + 10
while sleepers(marker) and time.time() < deadline:
    time.sleep(0.05)
ok(sleepers(marker) == 0, "the command's background child died with it")

# A client that goes away: the command is killed (found by the keep-alive within seconds).
marker = f"3598.{os.getpid()}"
st, hd, r = exec_open({"shell": f"echo started; exec sleep {marker}"})
evs = sse_events(r)
first = next(evs)
# "started" is written before the shell execs sleep: wait (bounded) for the sleep to show.
deadline = time.time() + 20
while sleepers(marker) == 0 and time.time() < deadline:
    time.sleep(0.05)
ok(first == ("stdout", {"text": "started\n"}) and sleepers(marker) == 1, f"a long command runs: {first} {sleepers(marker)}")
st_running = j(call("GET", "/v1/desks/alice/status", token="ro"), 200, "status while a command runs")
ok(st_running["exec"]["running"] == 1, f"status counts the running command: {st_running['exec']}")
r.close()
del evs
deadline = time.time() + 30
while sleepers(marker) and time.time() < deadline:
    time.sleep(0.1)
ok(sleepers(marker) == 0, "closing the connection killed the command")
while j(call("GET", "/v1/desks/alice/status"), 200, "status")["exec"]["running"] and time.time() < deadline:
    time.sleep(0.1)

# Refusals before anything runs: JSON errors with stable codes.
expect_error(exec_open({"shell": "touch /desk/ro-exec"}, token="ro"), 403, "read_only_token", "exec with a read-only token")
ok(not os.path.exists(os.path.join(DESK, "ro-exec")), "a read-only token ran nothing")
expect_error(exec_open({"shell": "true"}, token="bob"), 403, "token_scope", "exec with bob's token")
for cwd, status, code in [("..", 403, "outside_desk"), ("../bob", 403, "outside_desk"), ("/etc", 403, "outside_desk"),
                          ("out", 409, "not_dir"), ("out/x", 403, "outside_desk"), ("nope", 404, "not_found")]:
    expect_error(exec_open({"shell": "pwd", "cwd": cwd}), status, code, f"exec with cwd {cwd!r}")
for what, body in [("no command", {}), ("empty argv", {"command": []}), ("both forms", {"command": ["true"], "shell": "true"}),
                   ("a credential variable", {"shell": "true", "env": {"AWS_SECRET_ACCESS_KEY": "x"}}),
                   ("a deskfs variable", {"shell": "true", "env": {"DESKFS_HOME": "/"}}),
                   ("timeout 0", {"shell": "true", "timeout_secs": 0}), ("timeout too long", {"shell": "true", "timeout_secs": 86400}),
                   ("an unknown field", {"shell": "true", "timout_secs": 3})]:
    expect_error(exec_open(body), 400, "bad_request", f"exec refused: {what}")

# The status: the desk, exec, the workspace; no host path, no other desk.
st, _, raw = call("GET", "/v1/desks/alice/status", token="ro")
stat = json.loads(raw)
ok(st == 200 and stat["agent"] == "alice" and "app" in stat["repos"] and isinstance(stat["tasks"], list)
   and stat["usage"]["files"] > 0 and stat["usage"]["bytes"] > 0 and stat["exec"] == {"available": True, "running": 0},
   f"status: {stat}")
on_mount = any(l.split(" - ")[1].startswith("fuse") and os.path.realpath(DESKS).startswith(l.split()[4])
               for l in open("/proc/self/mountinfo") if " - " in l and l.split()[4] != "/")
if on_mount:
    w = stat["workspace"]
    ok(isinstance(w, dict) and w.get("mounted") is True and all(isinstance(w.get(k), int) for k in
       ("dirty_files", "dirty_bytes", "pending_uploads", "failing_uploads")), f"the workspace's status: {w}")
else:
    ok(stat["workspace"] is None, f"not on a mount: no workspace: {stat['workspace']}")
ok(os.path.realpath(DESKS) not in raw.decode() and DESKS not in raw.decode() and "bob" not in raw.decode(),
   f"the status names no host path and no other desk: {raw[:500]!r}")
expect_error(call("GET", "/v1/desks/bob/status"), 403, "token_scope", "status of another desk")

# ---------------------------------------------------------------- the task journal
# Every command run over HTTP is in the journal before its exit event is sent, with the
# files it created, changed and deleted as the mount recorded them (on a plain directory
# the changes are "unknown", never an empty list); killed ones are recorded as killed.
for name in ("j-edit", "j-del"):
    j(call("PUT", f"/v1/desks/alice/files/{name}", body=b"before\n"), 201, f"PUT {name}")
script = "echo new > j-new; echo more >> j-edit; rm j-del; mkdir j-dir; echo done"
out, _, end = exec_all({"shell": script})
jid = end[1].get("journal_id")
ok(end[0] == "exit" and end[1]["code"] == 0 and isinstance(jid, str) and jid, f"the exit names its journal entry: {end}")
entries = j(call("GET", "/v1/desks/alice/journal?task=_desk&limit=5", token="ro"), 200, "journal")["entries"]
e = [x for x in entries if x["id"] == jid]
ok(len(e) == 1, f"the entry {jid} is in the journal at once: {[x['id'] for x in entries]}")
e = e[0]
ok(e["via"] == "http" and e["command"] == ["sh", "-c", script] and e["cwd"] == "" and e["task"] is None
   and e["exit_code"] == 0 and not e["killed"] and e["output_captured"] is True and e["output"] == "done\n"
   and e["stdout_bytes"] == 5 and e["stderr_bytes"] == 0 and isinstance(e["duration_ms"], int), f"the entry: {e}")
if on_mount:
    ok(e["files"] == {"created": ["j-dir/", "j-new"], "changed": ["j-edit"], "deleted": ["j-del"]}
       and e.get("changes_unknown") is None, f"the entry's files are the command's own: {e['files']} {e.get('changes_unknown')}")
else:
    ok(e["files"] is None and "not on a deskfs mount" in e["changes_unknown"], f"plain directory: files unknown: {e}")
allj = j(call("GET", "/v1/desks/alice/journal?limit=1000"), 200, "journal of every task")["entries"]
killed = [x for x in allj if "3599." in " ".join(x["command"])]
ok(len(killed) == 1 and killed[0]["timed_out"] and killed[0]["killed"] and killed[0]["signal"] == 9,
   f"the timed-out command is journaled as such: {killed}")
deadline = time.time() + 30
gone = []
while not gone and time.time() < deadline:
    gone = [x for x in j(call("GET", "/v1/desks/alice/journal?limit=1000"), 200, "journal")["entries"]
            if "3598." in " ".join(x["command"])]
    time.sleep(0.1)
ok(len(gone) == 1 and gone[0]["killed"] and not gone[0]["timed_out"] and gone[0]["output"] == "started\n",
   f"the command whose client went away is journaled as killed: {gone}")
ok([x["start_ms"] for x in allj] == sorted(x["start_ms"] for x in allj), "entries come oldest first")
ok(len(j(call("GET", "/v1/desks/alice/journal?limit=2"), 200, "journal limit")["entries"]) == 2, "limit is kept")
for q, status, code in [("limit=0", 400, "bad_request"), ("limit=1001", 400, "bad_request"), ("limit=x", 400, "bad_request"),
                        ("lmit=3", 400, "bad_request"), ("task=..%2Fbob", 400, "bad_request"),
                        ("task=no-such-task", 404, "not_found")]:
    expect_error(call("GET", f"/v1/desks/alice/journal?{q}"), status, code, f"journal?{q}")
expect_error(call("GET", "/v1/desks/alice/journal", token="bob"), 403, "token_scope", "journal with bob's token")
expect_error(call("GET", "/v1/desks/alice/journal", token=None), 401, "unauthorized", "journal without a token")

# ---------------------------------------------------------------- tokens
expect_error(call("GET", "/v1/desks/alice/list", token=None), 401, "unauthorized", "no token")
expect_error(call("GET", "/v1/desks/alice/list", token="dsk_alice_forged"), 401, "unauthorized", "a forged token")
expect_error(call("GET", "/v1/desks/alice/list", token="expired"), 401, "token_expired", "an expired token")
expect_error(call("GET", "/v1/desks/alice/list", token="revoked"), 401, "token_revoked", "a revoked token")
expect_error(call("GET", "/v1/desks/alice/list", token="bob"), 403, "token_scope", "bob's token on alice's desk")
expect_error(call("GET", "/v1/desks/bob/list"), 403, "token_scope", "alice's token on bob's desk")
for what, req in [("PUT", ("PUT", "/v1/desks/alice/files/ro.txt", b"x")),
                  ("DELETE", ("DELETE", "/v1/desks/alice/files/big.bin", None)),
                  ("mkdir", ("POST", "/v1/desks/alice/mkdir", {"path": "rodir"})),
                  ("move", ("POST", "/v1/desks/alice/move", {"from": "big.bin", "to": "b2"}))]:
    expect_error(call(req[0], req[1], token="ro", body=req[2]), 403, "read_only_token", f"read-only token: {what}")
ok(os.path.exists(os.path.join(DESK, "big.bin")) and not os.path.exists(os.path.join(DESK, "ro.txt")),
   "read-only tokens changed nothing")

# ---------------------------------------------------------------- confinement
secret = open(OUTSIDE, "rb").read()
escapes = [
    ("GET", "/v1/desks/alice/files/out/" + os.path.basename(OUTSIDE), 403, "outside_desk", "read through a symlink out"),
    ("GET", "/v1/desks/alice/files/outfile", 403, "outside_desk", "read a symlink to a file outside"),
    ("GET", "/v1/desks/alice/files/..%2F..%2Fetc%2Fpasswd", 403, "outside_desk", "encoded .."),
    ("GET", "/v1/desks/alice/files/a/..%2F..%2Fbob%2FAGENTS.md", 403, "outside_desk", "encoded .. into another desk"),
    ("GET", "/v1/desks/alice/files/%2Fetc%2Fpasswd", 403, "outside_desk", "absolute path"),
    ("GET", "/v1/desks/alice/files/a%00b", 400, "bad_path", "NUL byte"),
    ("GET", "/v1/desks/alice/files/" + "n" * 256, 400, "name_too_long", "over-long name"),
    ("GET", "/v1/desks/alice/list/out", 403, "outside_desk", "list through a symlink out"),
    ("GET", "/v1/desks/alice/stat/out/" + os.path.basename(OUTSIDE), 403, "outside_desk", "stat through a symlink out"),
    ("PUT", "/v1/desks/alice/files/out/planted", 403, "outside_desk", "write through a symlink out"),
    ("DELETE", "/v1/desks/alice/files/out/" + os.path.basename(OUTSIDE), 403, "outside_desk", "delete through a symlink out"),
]
for method, path, status, code, what in escapes:
    expect_error(call(method, path, body=b"pwned" if method == "PUT" else None), status, code, what)
for what, body in [("mkdir through a symlink out", {"path": "out/newdir"}),
                   ("mkdir with ..", {"path": "../escape"})]:
    expect_error(call("POST", "/v1/desks/alice/mkdir", body=body), 403, "outside_desk", what)
for what, body in [("move out of the desk", {"from": "big.bin", "to": "../stolen"}),
                   ("move into a symlink out", {"from": "big.bin", "to": "out/stolen"}),
                   ("move from outside", {"from": "out/" + os.path.basename(OUTSIDE), "to": "got"})]:
    expect_error(call("POST", "/v1/desks/alice/move", body=body), 403, "outside_desk", what)
expect_error(call("POST", "/v1/desks/alice/mkdir", body={"path": "out/x/y", "parents": True}), 409, "exists",
             "mkdir -p finds a link out in the way")
ok(open(OUTSIDE, "rb").read() == secret, "the outside file is untouched")
outdir = os.path.dirname(OUTSIDE)
ok(sorted(os.listdir(outdir)) == [os.path.basename(OUTSIDE)], f"nothing was made outside: {os.listdir(outdir)}")
# A write to the planted link is refused; its target and the link stay.
expect_error(call("PUT", "/v1/desks/alice/files/outfile", body=b"mine"), 403, "outside_desk", "write to a link pointing out")
ok(open(OUTSIDE, "rb").read() == secret and os.path.islink(os.path.join(DESK, "outfile")), "link and target untouched")
expect_error(call("POST", "/v1/desks/alice/mkdir", body={"path": "outfile/x", "parents": True}), 409, "exists",
             "mkdir -p does not look through a link")
# A link inside the desk: a write lands on its target under the ETag a read gave.
st, hd, body = call("GET", "/v1/desks/alice/files/CLAUDE.md")
ok(st == 200, "read CLAUDE.md")
st, _, b2 = call("PUT", "/v1/desks/alice/files/CLAUDE.md", body=body + b"\nedited over HTTP\n", headers={"If-Match": hd["etag"]})
ok(st == 200 and os.path.islink(os.path.join(DESK, "CLAUDE.md"))
   and open(os.path.join(DESK, "AGENTS.md"), "rb").read().endswith(b"edited over HTTP\n"),
   f"a write through CLAUDE.md reaches AGENTS.md: {st} {b2[:200]!r}")
# Not a regular file: refused at once, not a hung request.
os.mkfifo(os.path.join(DESK, "fifo"))
expect_error(call("GET", "/v1/desks/alice/files/fifo"), 409, "conflict", "read a FIFO")
os.unlink(os.path.join(DESK, "fifo"))

# ---------------------------------------------------------------- memory tool (memory_20250818)
def mem(body, token="rw"):
    """(status, X-Deskfs-Tool-Error, content type, text) of one memory command."""
    st, hd, b = call("POST", "/v1/desks/alice/memory", token=token, body=body)
    return st, hd.get("x-deskfs-tool-error"), hd.get("content-type", ""), b.decode()


def mem_ok(body, want, what, token="rw"):
    st, err, ctype, text = mem(body, token)
    ok(st == 200 and err == "false" and ctype.startswith("text/plain") and text == want,
       f"memory {what}: {st} {err} {ctype} {text[:300]!r}, want {want[:300]!r}")


def mem_err(body, want, what, token="rw"):
    st, err, _, text = mem(body, token)
    ok(st == 200 and err == "true" and text == want, f"memory {what}: {st} {err} {text[:300]!r}, want {want!r}")


ok("/v1/desks/{agent}/memory" in doc["paths"], "openapi has the memory endpoint")
ok("/v1/desks/{agent}/journal" in doc["paths"] and "too_many_commands" in
   doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"],
   "openapi has the journal endpoint and every error code")
MEMS = os.path.join(DESK, "memories")
st, err, _, text = mem({"command": "view", "path": "/memories"})
ok(st == 200 and err == "false" and text.startswith(
    "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:\n")
   and text.split("\n")[1].endswith("\t/memories"), f"memory view of /memories: {st} {err} {text[:300]!r}")
mem_ok({"command": "create", "path": "/memories/notes.txt", "file_text": "Hello World\nThis is line two"},
       "File created successfully at: /memories/notes.txt", "create")
ok(open(os.path.join(MEMS, "notes.txt")).read() == "Hello World\nThis is line two", "memory create wrote the file")
mem_err({"command": "create", "path": "/memories/notes.txt", "file_text": "x"},
        "Error: File /memories/notes.txt already exists", "create of an existing file")
mem_ok({"command": "view", "path": "/memories/notes.txt"},
       "Here's the content of /memories/notes.txt with line numbers:\n     1\tHello World\n     2\tThis is line two",
       "view of a file")
mem_ok({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "line two", "new_str": "line 2"},
       "The memory file has been edited. Here is the snippet showing the change (with line numbers):\n"
       "     1\tHello World\n     2\tThis is line 2", "str_replace")
mem_err({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "l", "new_str": "L"},
        "No replacement was performed. Multiple occurrences of old_str `l` in lines: 1, 2. Please ensure it is unique",
        "str_replace of a text found twice")
mem_ok({"command": "insert", "path": "/memories/notes.txt", "insert_line": 1, "insert_text": "inserted\n"},
       "The file /memories/notes.txt has been edited.", "insert")
mem_err({"command": "insert", "path": "/memories/notes.txt", "insert_line": 9, "insert_text": "x"},
        "Error: Invalid `insert_line` parameter: 9. It should be within the range of lines of the file: [0, 3]",
        "insert past the end")
mem_ok({"command": "rename", "old_path": "/memories/notes.txt", "new_path": "/memories/done/notes.txt"},
       "Successfully renamed /memories/notes.txt to /memories/done/notes.txt", "rename")
ok(open(os.path.join(MEMS, "done/notes.txt")).read() == "Hello World\ninserted\nThis is line 2\n", "memory edits landed")
mem_err({"command": "view", "path": "/memories/notes.txt"},
        "The path /memories/notes.txt does not exist. Please provide a valid path.", "view of a missing file")
# Escapes: `..`, a sibling of /memories, a path outside it, a link planted in memories/ pointing out.
mem_err({"command": "view", "path": "/memories/../desk.toml"},
        "Path /memories/../desk.toml would escape /memories directory", "view of /memories/../desk.toml")
mem_err({"command": "create", "path": "/memoriesX/a", "file_text": "x"},
        "Path /memoriesX/a would escape /memories directory", "create in /memoriesX")
mem_err({"command": "delete", "path": "/etc/passwd"}, "Path must start with /memories, got: /etc/passwd", "delete /etc/passwd")
os.symlink(os.path.dirname(OUTSIDE), os.path.join(MEMS, "out"))
for body in [{"command": "create", "path": "/memories/out/planted", "file_text": "pwned"},
             {"command": "view", "path": "/memories/out/" + os.path.basename(OUTSIDE)},
             {"command": "delete", "path": "/memories/out/" + os.path.basename(OUTSIDE)},
             {"command": "rename", "old_path": "/memories/done", "new_path": "/memories/out/stolen"}]:
    mem_err(body, "Path would escape /memories directory via symlink", f"{body['command']} through a link out")
ok(open(OUTSIDE, "rb").read() == secret and sorted(os.listdir(outdir)) == [os.path.basename(OUTSIDE)],
   f"memory: nothing changed outside: {os.listdir(outdir)}")
os.unlink(os.path.join(MEMS, "out"))
# A read-only token views but changes nothing; a body that is not JSON is a request error.
mem_ok({"command": "view", "path": "/memories/done/notes.txt"},
       "Here's the content of /memories/done/notes.txt with line numbers:\n"
       "     1\tHello World\n     2\tinserted\n     3\tThis is line 2\n     4\t", "read-only view", token="ro")
expect_error(call("POST", "/v1/desks/alice/memory", token="ro", body={"command": "delete", "path": "/memories/done"}),
             403, "read_only_token", "read-only memory delete")
ok(os.path.exists(os.path.join(MEMS, "done/notes.txt")), "the read-only delete changed nothing")
expect_error(call("POST", "/v1/desks/alice/memory", body=b"{not json", headers={"Content-Type": "application/json"}),
             400, "bad_request", "memory body not JSON")
mem_ok({"command": "delete", "path": "/memories/done"}, "Successfully deleted /memories/done", "delete")
ok(not os.path.exists(os.path.join(MEMS, "done")), "memory delete removed the directory")

# ---------------------------------------------------------------- load: 200 at once
N = 200
counter = "/v1/desks/alice/files/counter"
call("PUT", counter, body=b"0")
errors = []
lock = threading.Lock()


def bump(i):
    """Read-modify-write of the counter under If-Match, retried on 412: none may be lost."""
    for _ in range(1000):
        st, hd, body = call("GET", counter)
        if st != 200:
            return f"get {st}"
        st2, _, b2 = call("PUT", counter, body=str(int(body) + 1).encode(), headers={"If-Match": hd["etag"]})
        if st2 == 200:
            return None
        if st2 != 412:
            return f"put {st2} {b2[:100]!r}"
    return "gave up"


def mixed(i):
    """A file of its own, written and read back; a listing; every 10th a read-only GET."""
    data = f"writer {i}\n".encode() * (i + 1)
    st, _, b = call("PUT", f"/v1/desks/alice/files/load/f{i:03d}", body=data)
    if st != 201:
        return f"put {i}: {st} {b[:100]!r}"
    st, _, body = call("GET", f"/v1/desks/alice/files/load/f{i:03d}", token="ro" if i % 10 == 0 else "rw")
    if st != 200 or body != data:
        return f"get {i}: {st}"
    st, _, _ = call("GET", "/v1/desks/alice/list/load")
    return None if st == 200 else f"list {st}"


j(call("POST", "/v1/desks/alice/mkdir", body={"path": "load"}), 201, "mkdir load")
with concurrent.futures.ThreadPoolExecutor(max_workers=N) as ex:
    futs = [ex.submit(mixed, i) for i in range(N)] + [ex.submit(bump, i) for i in range(40)]
    results = [f.result() for f in futs]
bad = [r for r in results if r]
ok(not bad, f"{len(bad)} of {len(results)} concurrent requests failed: {bad[:5]}")
ok(open(os.path.join(DESK, "counter")).read() == "40", f"no lost update: counter {open(os.path.join(DESK, 'counter')).read()}")
ok(len(os.listdir(os.path.join(DESK, "load"))) == N, "every concurrent write landed")
leftovers = [n for n in os.listdir(DESK) if n.startswith(".deskfs-put")]
ok(not leftovers, f"no temporary files left: {leftovers}")
print(f"serve_check: {passed} checks passed", flush=True)
