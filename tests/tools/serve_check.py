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
