#!/usr/bin/env python3
"""The confinement suite of `deskfs serve` and `deskfs mcp` (tests/e2e/98c-serve-confine.sh):
every escape through every interface, every token that must not open a desk, every
write a read-only token attempts, and races between check and use. 0 escapes.

usage: confine_check.py DESKFS ROOT BASE_URL OUTSIDE TOKENS_JSON
  DESKFS       the deskfs binary (for `deskfs mcp` over stdio and `deskfs token`)
  ROOT         the desk root, with desks alice and bob (alice has repos/app, a git repo)
  BASE_URL     http://127.0.0.1:PORT of a running `deskfs serve --root ROOT`
  OUTSIDE      an empty directory outside ROOT (canaries are put there)
  TOKENS_JSON  {"rw": alice, "ro": alice read-only, "bob": bob's, "expired": alice's
               expired, "revoked": alice's revoked}

The script plants the agent's side itself: canary files outside the desk (OUTSIDE, a
directory next to ROOT on the same mount, desk bob), symlinks in alice pointing out
(a directory link and a file link, absolute and relative, into bob, to the desk root, a
link to a link, a /proc magic link) and links in alice's memories/.

Every case is one request through one interface (HTTP /v1, MCP over streamable HTTP, MCP
over stdio, the memory tool over HTTP and MCP) with one escape, and is classified:
  REFUSED     an error with a stable code (HTTP JSON error, MCP `Error [code]:`, a memory
              tool error string), nothing changed
  ALLOWED     succeeded where success is harmless (an operation on a planted link itself:
              lstat, delete or rename of the link), nothing changed
  ESCAPE      outside content came back (a canary's marker, /etc/passwd) or anything
              outside changed (canaries' inode, size, mtime, mode; a new or missing entry)
  UNEXPECTED  succeeded where a refusal was expected (nothing leaked)
  ODD         neither: a 5xx, an `io` error, a transport failure
  PENDING     (the `record` cases only) a write into the desk's record `.desk/` that was
              not refused: a failure, unless CONFINE_DESK_RECORD_PENDING=1 (for a build
              from before `.desk/` was read-only to agents: then listed as
              DESK_RECORD_CASES_PENDING and reported, not failed)
  KNOWN       an ODD answer listed in KNOWN_ODD (nothing leaked or changed): reported
Besides the cases, races: threads keep swapping a directory for a link out (RENAME_EXCHANGE)
while requests of every interface go through it; every answer is checked for outside
content and the canaries afterwards (the requests are counted apart from the cases).
Prints one line per failure (with its exact request), a matrix summary per interface and
operation, and ends with "confine_check: N cases (and R requests in races), E escapes, F
other failures"; exits 1 on any ESCAPE, UNEXPECTED, ODD (or PENDING, see above).
"""

import asyncio
import collections
import ctypes
import http.client
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import threading
import time
import urllib.parse

DESKFS, ROOT, BASE, OUTSIDE, TOKENS = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
ALICE = os.path.join(ROOT, "alice")
BOB = os.path.join(ROOT, "bob")
MNTOUT = os.path.join(os.path.dirname(ROOT), "outside-mnt")  # same mount, outside the desk root
HOSTPORT = urllib.parse.urlsplit(BASE).netloc

# Writes into the desk's record (`.desk/`: task records, the task journal) are refused
# (`read_only_path`; inside exec `.desk` is a read-only mount). A build from before that
# is checked with CONFINE_DESK_RECORD_PENDING=1: such writes are then listed as pending
# instead of failing.
DESK_RECORD_READ_ONLY = os.environ.get("CONFINE_DESK_RECORD_PENDING") != "1"

MARK = secrets.token_hex(8)          # in every canary outside alice's desk (content and names)
DESK_MARK = secrets.token_hex(8)     # in alice's files outside memories/ (memory tool cases)
CANARY = f"CANARY-{MARK}"
OUT_MARKERS = [MARK, "root:x:0:0"]
INSIDE_F = "EDITME\nINSIDE\n"

# ------------------------------------------------------------------ fixture

OUTSIDE_FILES = {
    "secret.txt": f"EDITME\nsecret {CANARY}\n",
    "racedir/f": f"EDITME\nrace {CANARY}\n",
    f"leak-{MARK}.txt": f"EDITME\nname {CANARY}\n",
    "sub/f": f"EDITME\nsub {CANARY}\n",
}
MNTOUT_FILES = {
    "secret.txt": f"EDITME\nmount {CANARY}\n",
    f"leak-{MARK}.txt": f"EDITME\nmount name {CANARY}\n",
    "sub/f": f"EDITME\nmount sub {CANARY}\n",
}
BOB_FILES = {
    "notes/a.txt": f"EDITME\nbob a {CANARY}\n",
    "notes/canary.txt": f"EDITME\nbob {CANARY}\n",
    "notes/f": f"EDITME\nbob f {CANARY}\n",
    f"notes/leak-{MARK}.txt": f"EDITME\nbob name {CANARY}\n",
    "memories/canary.md": f"EDITME\nbob memory {CANARY}\n",
}
ALICE_FILES = {
    "notes/a.txt": "EDITME\ninside a\n",
    "notes/f": f"EDITME\ndesk {DESK_MARK}\n",
    "notes/desk-only.txt": f"EDITME\ndesk only {DESK_MARK}\n",
    "memoriesX/secret.txt": f"EDITME\nsibling {DESK_MARK}\n",
    "memories/notes.md": "EDITME\nmemory\n",
    "memories/sub/keep.md": "EDITME\nkept\n",
    ".desk/journal/canary.jsonl": "",
}
ALICE_LINKS = {
    "out": OUTSIDE,                              # a directory link out (absolute)
    "outfile": OUTSIDE + "/secret.txt",          # a file link out (absolute)
    "outrel": "../../outside-mnt",               # a directory link out (relative, same mount)
    "bobdir": "../bob",                          # into another desk
    "bobfile": "../bob/notes/canary.txt",        # a file of another desk
    "up": "..",                                  # the desk root
    "hop": "out",                                # a link inside to a link out
    "magic": "/proc/self/root" + OUTSIDE,        # through /proc's magic link
    "jl": ".desk/journal",                       # inside, into the desk's record
    "jf": ".desk/journal/x.jsonl",               # inside, a new file of the record
    "memories/out": OUTSIDE,
    "memories/outfile": OUTSIDE + "/secret.txt",
    "memories/bob": "../../bob/notes",
    "memories/up": "..",                         # out of /memories, inside the desk
    "memories/inlink": "sub",                    # inside /memories (not followed either)
    "memories/jl": "../.desk/journal",
}
# Directories of alice whose extra entries a case may leave (removed between cases).
ALICE_TIDY = ["", "notes", "memories", "memories/sub", ".desk/journal", "race", "memories/race"]
REPLANT = True
BASELINE = {}


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def remove(path):
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    else:
        shutil.rmtree(path)


def plant_files(base, files):
    changed = False
    for rel, text in files.items():
        p = os.path.join(base, rel)
        try:
            ok = not os.path.islink(p) and open(p).read() == text
        except OSError:
            ok = False
        if not ok:
            if os.path.lexists(p):
                remove(p)
            write(p, text)
            changed = True
    return changed


def plant_outside():
    """The canaries outside alice's desk (rewritten after an escape changed them)."""
    for base, files in [(OUTSIDE, OUTSIDE_FILES), (MNTOUT, MNTOUT_FILES), (BOB, BOB_FILES)]:
        plant_files(base, files)
    invalidate()


def replant():
    """Puts alice's fixture back: files, links, and nothing else in ALICE_TIDY's dirs."""
    if not REPLANT:
        return
    changed = plant_files(ALICE, ALICE_FILES)
    for rel, target in ALICE_LINKS.items():
        p = os.path.join(ALICE, rel)
        if os.path.islink(p) and os.readlink(p) == target:
            continue
        if os.path.lexists(p):
            remove(p)
        os.symlink(target, p)
        changed = True
    for d in ALICE_TIDY:
        p = os.path.join(ALICE, d)
        if d in BASELINE and os.path.isdir(p) and not os.path.islink(p):
            for n in os.listdir(p):
                if n not in BASELINE[d] and n != "_desk.jsonl":
                    remove(os.path.join(p, n))
                    changed = True
    if changed:
        invalidate(*ALICE_SCOPES)


def tidy_baseline():
    for d in ALICE_TIDY:
        p = os.path.join(ALICE, d)
        if os.path.isdir(p):
            BASELINE[d] = set(os.listdir(p))


# ------------------------------------------------------------------ snapshots

def walk(top, skip=(), depth=None, dir_times=True):
    """{relative path: what it is} of everything under `top` (links not followed)."""
    out = {}

    def rec(p, rel, lvl):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", st.st_ino, st.st_mtime_ns if dir_times else 0, st.st_mode)
            if depth is not None and lvl >= depth:
                return
            try:
                names = sorted(os.listdir(p))
            except OSError as e:
                out[rel + "/"] = ("unlistable", str(e))
                return
            for n in names:
                r = f"{rel}/{n}" if rel else n
                if r not in skip:
                    rec(os.path.join(p, n), r, lvl + 1)
        else:
            out[rel] = ("file", st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)

    rec(top, "", 0)
    return out


ALICE_SKIP = {".desk/locks", ".desk/journal/_desk.jsonl", "repos/app/.git", ".memories-parked"}
SCOPES = {
    "outside": lambda: walk(OUTSIDE),
    "mntout": lambda: walk(MNTOUT),
    "bob": lambda: walk(BOB),
    # the desk root and the mount's top: no new entry, the token store untouched
    "root": lambda: walk(ROOT, skip={"alice", "bob"}, depth=1),
    "mount": lambda: walk(os.path.dirname(ROOT), skip={os.path.basename(ROOT), "outside-mnt"}, depth=1),
    # alice outside memories/ (memory tool cases) and all of alice (read-only tokens)
    "alice_rest": lambda: walk(ALICE, skip=ALICE_SKIP | {"memories"}),
    "alice_all": lambda: walk(ALICE, skip=ALICE_SKIP),
    # the record: what an agent could forge (the system's own exec entries left out)
    "record": lambda: walk(os.path.join(ALICE, ".desk"), skip={"locks", "journal/_desk.jsonl"}, dir_times=False),
}
GLOBAL = ("outside", "mntout", "bob", "root", "mount")
ALICE_SCOPES = ("alice_rest", "alice_all", "record")
LAST = {}   # the last snapshot of each scope (the "before" of the next case that uses it)


def snap(scopes):
    return {s: SCOPES[s]() for s in scopes}


def snap_before(scopes):
    return {s: LAST[s] if s in LAST else SCOPES[s]() for s in scopes}


def invalidate(*scopes):
    for s in scopes or list(LAST):
        LAST.pop(s, None)


def remember(after, scopes):
    """Keeps `after` as the next "before"; alice's scopes a case did not watch may have
    changed (a legitimate write), so they are taken afresh next time."""
    LAST.update(after)
    invalidate(*[s for s in ALICE_SCOPES if s not in scopes])


def diff(before, after):
    out = []
    for s in before:
        b, a = before[s], after[s]
        for k in sorted(set(b) | set(a)):
            if b.get(k) != a.get(k):
                what = "new" if k not in b else "gone" if k not in a else "changed"
                out.append(f"{s}:{k or '.'} {what}")
    return out


# ------------------------------------------------------------------ results and tally

class Res:
    def __init__(self, kind, code, text, req):
        self.kind, self.code, self.text, self.req = kind, code, text, req  # kind: ok|refused|odd


def memory_kind(t):
    for needle, k in [("via symlink", "symlink_out"), ("goes through a symlink", "symlink_inside"),
                      ("Path must start with /memories", "prefix"), ("would escape /memories", "escape"),
                      ("NUL byte", "nul"), ("name longer than 255", "name_too_long"),
                      ("longer than 4096", "path_too_long"), ("read-only", "read_only"),
                      ("does not exist", "not_found"), ("already exists", "exists"),
                      ("Cannot delete the /memories", "root"), ("Cannot rename the /memories", "root")]:
        if needle in t:
            return "mem:" + k
    return "mem:other"


FAILS = []
KNOWN = []
# Known ODD answers that are no confinement failure (nothing leaked or changed, but the
# refusal is a 500): (interface and operation, escape, why); listed, not failed. Remove an
# entry when it is fixed.
KNOWN_ODD = [
    # (operation regex, request regex, why): ODD answers known to be harmless; none now.
]
ROWS = collections.OrderedDict()     # (iface, op) -> Counter of outcomes
CODES = collections.OrderedDict()    # (iface, op) -> Counter of refusal codes
PENDING = []
CASES = 0
NOTES = []


def tally(iface, op, outcome, code=None):
    ROWS.setdefault((iface, op), collections.Counter())[outcome] += 1
    if code:
        CODES.setdefault((iface, op), collections.Counter())[code] += 1


def judge(iface, op, esc, expect, res, before, after, markers, record=None, effect_only=False):
    """Classifies one case; `record` (before, after) of `.desk/` for DESK_RECORD_CASES;
    `effect_only`: a command that runs either way (exec), judged by what it changed."""
    global CASES
    CASES += 1
    leaked = [m for m in markers if m in res.text]
    changed = diff(before, after)
    if record is not None and effect_only and res.kind == "ok" and not diff(*record):
        res.kind = "refused"
        res.code = "in the sandbox: " + ("read-only file system" if "Read-only file system" in res.text else "nothing changed")
    if leaked or changed:
        outcome = "ESCAPE"
    elif record is not None and (res.kind == "ok" or diff(*record)):
        outcome = "PENDING"
    elif res.kind == "refused":
        outcome = "REFUSED"
    elif res.kind == "ok":
        outcome = "ALLOWED" if expect == "any" else "UNEXPECTED"
    else:
        outcome = "ODD"
        why = [w for a, b, w in KNOWN_ODD if re.search(a, f"{iface} {op}") and re.search(b, esc)]
        if why:
            outcome = "KNOWN"
    tally(iface, op, outcome, res.code if outcome in ("REFUSED", "KNOWN") else None)
    line = (f"{outcome}: {iface} {op} [{esc}]: request {res.req}; got {res.kind} {res.code}"
            + (f"; leaked {leaked}" if leaked else "") + (f"; changed {changed[:6]}" if changed else "")
            + f"; response {res.text[:240]!r}")
    if outcome == "KNOWN":
        KNOWN.append(line[:300] + f" -- known: {why[0]}")
    if outcome == "PENDING":
        PENDING.append(line)
        if DESK_RECORD_READ_ONLY:
            FAILS.append(line)
            print(line, flush=True)
    elif outcome in ("ESCAPE", "UNEXPECTED", "ODD"):
        FAILS.append(line)
        print(line, flush=True)
    if outcome == "ESCAPE":
        plant_outside()
    replant()
    return outcome


def case(iface, op, esc, expect, fn, scopes=GLOBAL, markers=OUT_MARKERS, record=False, effect_only=False):
    before = snap_before(scopes)
    rb = SCOPES["record"]() if record else None
    try:
        res = fn()
    except Exception as e:  # a transport failure: not a refusal
        res = Res("odd", f"exception {type(e).__name__}", str(e), f"{iface} {op} {esc}")
    after = snap(scopes)
    remember(after, scopes)
    rec = ({"r": rb}, {"r": SCOPES["record"]()}) if record else None
    return judge(iface, op, esc, expect, res, before, after, markers, rec, effect_only)


async def acase(iface, op, esc, expect, coro_fn, scopes=GLOBAL, markers=OUT_MARKERS, record=False, effect_only=False):
    before = snap_before(scopes)
    rb = SCOPES["record"]() if record else None
    try:
        res = await asyncio.wait_for(coro_fn(), 60)
    except Exception as e:
        res = Res("odd", f"exception {type(e).__name__}", str(e), f"{iface} {op} {esc}")
    after = snap(scopes)
    remember(after, scopes)
    rec = ({"r": rb}, {"r": SCOPES["record"]()}) if record else None
    return judge(iface, op, esc, expect, res, before, after, markers, rec, effect_only)


# ------------------------------------------------------------------ HTTP

def tok(t):
    return TOKENS.get(t, t)


def req(method, path, token="rw", body=None, headers=None, timeout=60):
    """(status, lower-case headers, body bytes) of one request; the path goes out as is."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = "Bearer " + tok(token)
    data = body
    if isinstance(body, (dict, list)):
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection(HOSTPORT, timeout=timeout)
    try:
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def http_res(method, path, token="rw", body=None, headers=None):
    shown = f"{method} {path}" + (f" {json.dumps(body)[:300]}" if isinstance(body, dict) else "")
    if token != "rw":
        shown += f" (token {token if token in TOKENS or token is None else 'given'})"
    st, hd, b = req(method, path, token, body, headers)
    text = b.decode("utf-8", "replace")
    if 200 <= st < 300:
        if hd.get("x-deskfs-tool-error") == "true":
            return Res("refused", memory_kind(text), text, shown)
        return Res("ok", str(st), text, shown)
    try:
        code = json.loads(b)["error"]["code"]
    except Exception:
        return Res("odd", f"{st} (not a JSON error)", text, shown)
    if 400 <= st < 500 and code != "io":
        return Res("refused", code, text, shown)
    return Res("odd", f"{st} {code}", text, shown)


def q(p):
    return urllib.parse.quote(p, safe="/")


class Esc:
    """One escape: `path` names something existing through it, `new` something to create,
    `dir` a directory; `url*` their URL-path forms (for the HTTP endpoints with the path in
    the URL); `kind` text (refused as text), through (through a planted link), self (the
    planted link itself is the last component)."""

    def __init__(self, id, path, new=None, dir=None, kind="text", url=None, url_new=None, url_dir=None, reads_only=False):
        self.id, self.path, self.kind, self.reads_only = id, path, kind, reads_only
        self.new = new if new is not None else path
        self.dir = dir if dir is not None else path
        self.url = url if url is not None else (q(path) if path is not None else None)
        self.url_new = url_new if url_new is not None else (q(self.new) if self.new is not None else None)
        self.url_dir = url_dir if url_dir is not None else (q(self.dir) if self.dir is not None else None)


LONG_PATH = "d/" * 2049 + "x"   # 4,099 bytes of short names
ESCAPES = [
    Esc("dotdot", "../bob/notes/canary.txt", "../bob/notes/pwned.txt", "../bob/notes"),
    Esc("dotdot_deep", "../" * 24 + OUTSIDE[1:] + "/secret.txt", "../" * 24 + OUTSIDE[1:] + "/pwned.txt", "../" * 24 + OUTSIDE[1:]),
    Esc("dotdot_etc", "../../../../../../../etc/passwd", None, "../../../../../../../etc", reads_only=True),
    Esc("dotdot_mid", "notes/../../bob/notes/canary.txt", "notes/../../bob/notes/pwned.txt", "notes/../../bob/notes"),
    Esc("dotdot_dot", "./../bob/notes/a.txt", "./../bob/notes/pwned.txt", "./../bob"),
    Esc("dotdot_bare", "..", "../pwned-dir", ".."),
    Esc("abs_etc", "/etc/passwd", None, "/etc", reads_only=True),
    Esc("abs_outside", OUTSIDE + "/secret.txt", OUTSIDE + "/pwned.txt", OUTSIDE),
    Esc("abs_bob", BOB + "/notes/canary.txt", BOB + "/notes/pwned.txt", BOB + "/notes"),
    Esc("nul", "notes/a.txt\0/../../bob", "notes/pw\0ned", "notes\0/../.."),
    Esc("name_too_long", "n" * 256, "n" * 256, "n" * 256),
    Esc("path_too_long", LONG_PATH, LONG_PATH, LONG_PATH),
    Esc("link_dir_abs", "out/secret.txt", "out/pwned.txt", "out/sub", "through"),
    Esc("link_dir_rel", "outrel/secret.txt", "outrel/pwned.txt", "outrel/sub", "through"),
    Esc("link_into_bob", "bobdir/notes/canary.txt", "bobdir/notes/pwned.txt", "bobdir/notes", "through"),
    Esc("link_to_root", "up/bob/notes/canary.txt", "up/bob/notes/pwned.txt", "up/bob", "through"),
    Esc("link_to_link", "hop/secret.txt", "hop/pwned.txt", "hop/sub", "through"),
    Esc("link_magic", "magic/secret.txt", "magic/pwned.txt", "magic/sub", "through"),
    Esc("link_self_dir", "out", "out", "out", "self"),
    Esc("link_self_file", "outfile", "outfile", "outfile", "self"),
    Esc("link_self_bobfile", "bobfile", "bobfile", "bobdir", "self"),
    Esc("link_self_root", "up", "up", "up", "self"),
]
# Only where the path is in the URL: percent-encoded forms the server decodes.
URL_ESCAPES = [
    Esc("enc_dotdot", None, url="..%2Fbob%2Fnotes%2Fcanary.txt", url_new="..%2Fbob%2Fnotes%2Fpwned.txt", url_dir="..%2Fbob%2Fnotes"),
    Esc("enc_dots", None, url="%2e%2e/bob/notes/canary.txt", url_new="%2e%2e/bob/notes/pwned.txt", url_dir="%2e%2e/bob/notes"),
    Esc("enc_all", None, url="%2E%2E%2F" * 24 + q(OUTSIDE[1:] + "/secret.txt").replace("/", "%2F"),
        url_new="%2E%2E%2F" * 24 + q(OUTSIDE[1:] + "/pwned.txt").replace("/", "%2F"), url_dir="%2E%2E%2F" * 24 + q(OUTSIDE[1:]).replace("/", "%2F")),
    Esc("enc_etc", None, url="..%2F..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd", url_dir="..%2F..%2F..%2F..%2F..%2F..%2F..%2Fetc", reads_only=True),
    Esc("enc_mid", None, url="notes/..%2F..%2Fbob/notes/canary.txt", url_new="notes/..%2F..%2Fbob/notes/pwned.txt", url_dir="notes/..%2F..%2Fbob"),
    Esc("enc_abs", None, url=q(OUTSIDE + "/secret.txt").replace("/", "%2F"), url_new=q(OUTSIDE + "/pwned.txt").replace("/", "%2F"),
        url_dir=q(OUTSIDE).replace("/", "%2F")),
    Esc("enc_abs_etc", None, url="%2Fetc%2Fpasswd", url_dir="%2Fetc", reads_only=True),
    Esc("enc_abs_bob", None, url=q(BOB + "/notes/canary.txt").replace("/", "%2F"),
        url_new=q(BOB + "/notes/pwned.txt").replace("/", "%2F"), url_dir=q(BOB).replace("/", "%2F")),
    Esc("enc_nul", None, url="notes%2Fa.txt%00%2F..%2F..", url_new="notes%2Fpw%00ned", url_dir="notes%00"),
    Esc("double_enc", None, url="%252e%252e/bob/notes/canary.txt", url_new="%252e%252e/bob/notes/pwned.txt", url_dir="%252e%252e/bob"),
    Esc("enc_link", None, url="out%2Fsecret.txt", url_new="out%2Fpwned.txt", url_dir="out%2Fsub", kind="through"),
]
# MCP paths are under /desk or relative to it.
MCP_ESCAPES = [
    Esc("desk_dotdot", "/desk/../bob/notes/canary.txt", "/desk/../bob/notes/pwned.txt", "/desk/../bob/notes"),
    Esc("desk_sibling", "/deskX/notes/a.txt", "/deskX/pwned.txt", "/deskX"),
    Esc("desks_path", "/desks/bob/notes/canary.txt", "/desks/bob/notes/pwned.txt", "/desks/bob"),
    Esc("desk_slash_dotdot", "/desk//../bob/notes/canary.txt", "/desk//../bob/notes/pwned.txt", "/desk//../bob"),
    Esc("desk_root_dotdot", "/desk/..", "/desk/../pwned", "/desk/.."),
    Esc("desk_link", "/desk/out/secret.txt", "/desk/out/pwned.txt", "/desk/out/sub", "through"),
    Esc("encoded_literal", "..%2Fbob%2Fnotes%2Fcanary.txt", "..%2Fbob%2Fnotes%2Fpwned.txt", "..%2Fbob", "literal"),
]

EXEC_SHELL = "pwd -P; for f in * .*; do [ -f \"$f\" ] && head -c 300 \"$f\"; done 2>&1; ls -a 2>&1; echo PWNED > pwned-exec 2>&1"


def expect_for(op_follows, esc):
    """refuse, or any where the op acts on a planted link itself (lstat, unlink, rename)."""
    if esc.kind == "self" and not op_follows:
        return "any"
    if esc.kind == "literal":
        return "any"   # a legal file name inside the desk (no decoding on this interface)
    return "refuse"


SEQ = [0]


def seq():
    SEQ[0] += 1
    return SEQ[0]


def http_ops():
    """(op, follows the last component, uses, fn(esc) -> Res); uses: url|json."""
    A = "/v1/desks/alice"
    return [
        ("GET file", True, "url", lambda e: http_res("GET", f"{A}/files/{e.url}")),
        ("Range GET", True, "url", lambda e: http_res("GET", f"{A}/files/{e.url}", headers={"Range": "bytes=0-99"})),
        ("stat", False, "url", lambda e: http_res("GET", f"{A}/stat/{e.url}")),
        ("list", True, "url", lambda e: http_res("GET", f"{A}/list/{e.url_dir}")),
        ("PUT", True, "url", lambda e: http_res("PUT", f"{A}/files/{e.url_new}", body=b"EDITME\nPWNED\n")),
        ("DELETE", False, "url", lambda e: http_res("DELETE", f"{A}/files/{e.url}?recursive=true")),
        ("mkdir", True, "json", lambda e: http_res("POST", f"{A}/mkdir", body={"path": e.new})),
        ("mkdir -p", True, "json", lambda e: http_res("POST", f"{A}/mkdir", body={"path": e.new + "/deeper", "parents": True})),
        ("move from", False, "json", lambda e: http_res("POST", f"{A}/move", body={"from": e.path, "to": f"notes/moved-{seq()}"})),
        ("move to", True, "json", lambda e: http_res("POST", f"{A}/move", body={"from": "notes/a.txt", "to": e.new, "overwrite": True})),
        ("exec cwd", True, "json", lambda e: http_res("POST", f"{A}/exec", body={"shell": EXEC_SHELL, "cwd": e.dir, "timeout_secs": 10})),
    ]


READ_OPS = {"GET file", "Range GET", "stat", "list", "read_text_file", "read_multiple_files", "list_directory",
            "list_directory_with_sizes", "directory_tree", "search_files", "get_file_info", "view", "view range"}


def http_matrix():
    for op, follows, uses, fn in http_ops():
        for e in ESCAPES + URL_ESCAPES:
            if uses == "json" and e.path is None or e.reads_only and op not in READ_OPS:
                continue
            ex = expect_for(follows, e)
            if op == "move to" and e.kind == "self":
                ex = "any"   # overwrite: the link is replaced, its target untouched
            case("HTTP", op, e.id, ex, lambda fn=fn, e=e: fn(e))
    # The agent name is a path segment too.
    for url in ["/v1/desks/alice%2F..%2Fbob/files/notes/a.txt", "/v1/desks/..%2Fbob/files/notes/a.txt",
                "/v1/desks/alice/../bob/files/notes/a.txt", "/v1/desks/bob%00/files/notes/a.txt",
                "/v1/desks/%2e%2e/files/bob/notes/a.txt", "/v1/desks/alice/files/../../bob/files/notes/a.txt"]:
        for method in ["GET", "PUT", "DELETE"]:
            case("HTTP", "agent segment", url, "refuse",
                 lambda url=url, method=method: http_res(method, url, body=b"PWNED" if method == "PUT" else None))


# ------------------------------------------------------------------ memory tool

MEM_ESCAPES = [
    ("dotdot", "/memories/../notes/desk-only.txt", "/memories/../pwned.md"),
    ("dotdot_deep", "/memories/../../bob/notes/canary.txt", "/memories/../../bob/notes/pwned.md"),
    ("dotdot_mid", "/memories/sub/../../notes/desk-only.txt", "/memories/sub/../../pwned.md"),
    ("dotdot_end", "/memories/..", "/memories/../x/.."),
    ("dot_dotdot", "/memories/./../desk.toml", "/memories/./../pwned.md"),
    ("abs_etc", "/etc/passwd", None),
    ("abs_outside", OUTSIDE + "/secret.txt", OUTSIDE + "/pwned.md"),
    ("prefix_sibling", "/memoriesX/secret.txt", "/memoriesX/pwned.md"),
    ("prefix_dots", "/memories../notes/desk-only.txt", "/memories../pwned.md"),
    ("no_slash", "memories/notes.md", "memories/pwned.md"),
    ("double_slash", "//memories/../notes/desk-only.txt", "//memories/../pwned.md"),
    ("root", "/", "/pwned.md"),
    ("empty", "", ""),
    ("link_dir_out", "/memories/out/secret.txt", "/memories/out/pwned.md"),
    ("link_file_out", "/memories/outfile", "/memories/outfile"),
    ("link_into_bob", "/memories/bob/canary.txt", "/memories/bob/pwned.md"),
    ("link_out_of_memories", "/memories/up/notes/desk-only.txt", "/memories/up/pwned.md"),
    ("link_inside", "/memories/inlink/keep.md", "/memories/inlink/pwned.md"),
    ("link_record", "/memories/jl/canary.jsonl", "/memories/jl/x.jsonl"),
    ("nul", "/memories/notes.md\0/../../desk.toml", "/memories/pw\0ned.md"),
    ("name_too_long", "/memories/" + "n" * 256, "/memories/" + "n" * 256),
    ("path_too_long", "/memories/" + LONG_PATH, "/memories/" + LONG_PATH),
]


def mem_inputs(path, new):
    n = seq()
    return [
        ("view", {"command": "view", "path": path}),
        ("view range", {"command": "view", "path": path, "view_range": [1, 2]}),
        ("create", {"command": "create", "path": new, "file_text": "EDITME\nPWNED\n"}),
        ("str_replace", {"command": "str_replace", "path": path, "old_str": "EDITME", "new_str": "PWNED"}),
        ("insert", {"command": "insert", "path": path, "insert_line": 0, "insert_text": "PWNED\n"}),
        ("delete", {"command": "delete", "path": path}),
        ("rename from", {"command": "rename", "old_path": path, "new_path": f"/memories/moved-{n}"}),
        ("rename to", {"command": "rename", "old_path": "/memories/notes.md", "new_path": new}),
    ]


def mem_markers():
    toml = open(os.path.join(ALICE, "desk.toml")).read()
    lines = [ln for ln in toml.splitlines() if "created" in ln]
    return OUT_MARKERS + [DESK_MARK] + lines


MEM_SCOPES = GLOBAL + ("alice_rest",)


def http_memory(input, token="rw", agent="alice"):
    return http_res("POST", f"/v1/desks/{agent}/memory", token=token, body=input)


MEMORIES_LINK_TARGETS = [("memories_link_out", OUTSIDE), ("memories_link_bob", "../bob/memories"),
                         ("memories_link_root", "..")]


def memories_link_cases():
    """(escape, target, op, input): alice's memories/ itself a link (out of the desk, into
    bob's memories, to the root of all desks), every command on it and through it."""
    todo = []
    for eid, target in MEMORIES_LINK_TARGETS:
        for path, new in [("/memories", "/memories/pwned.md"), ("/memories/secret.txt", "/memories/pwned.md"),
                          ("/memories/canary.md", "/memories/sub/pwned.md"), ("/memories/bob/notes/canary.txt", "/memories/desk.toml")]:
            for op, inp in mem_inputs(path, new):
                todo.append((eid, target, op, inp))
    return todo


def with_memories_link(target):
    real, parked = os.path.join(ALICE, "memories"), os.path.join(ALICE, ".memories-parked")
    os.rename(real, parked)
    os.symlink(target, real)
    invalidate()


def restore_memories():
    real, parked = os.path.join(ALICE, "memories"), os.path.join(ALICE, ".memories-parked")
    if os.path.islink(real):
        os.unlink(real)
    if os.path.isdir(parked):
        os.rename(parked, real)
    invalidate()


def run_memories_link_sync(iface, call, mk):
    global REPLANT
    cur = None
    REPLANT = False
    try:
        for eid, target, op, inp in memories_link_cases():
            if cur != target:
                restore_memories()
                with_memories_link(target)
                cur = target
            case(iface, op, eid, "refuse", lambda inp=inp: call(inp), MEM_SCOPES, mk)
    finally:
        restore_memories()
        REPLANT = True
        replant()


async def run_memories_link_async(iface, call, mk):
    global REPLANT
    cur = None
    REPLANT = False
    try:
        for eid, target, op, inp in memories_link_cases():
            if cur != target:
                restore_memories()
                with_memories_link(target)
                cur = target
            await acase(iface, "memory " + op, eid, "refuse", lambda inp=inp: call(inp), MEM_SCOPES, mk)
    finally:
        restore_memories()
        REPLANT = True
        replant()


def memory_matrix_http_all():
    mk = mem_markers()
    for eid, path, new in MEM_ESCAPES:
        for op, inp in mem_inputs(path, new):
            if new is None and op not in READ_OPS:
                continue
            case("memory/HTTP", op, eid, "refuse", lambda inp=inp: http_memory(inp), MEM_SCOPES, mk)
    run_memories_link_sync("memory/HTTP", http_memory, mk)


# ------------------------------------------------------------------ MCP

def text_of(r):
    return "".join(getattr(c, "text", "") for c in r.content)


def mcp_res(r, shown):
    t = text_of(r)
    full = t + (json.dumps(r.structured_content) if r.structured_content else "")
    if r.is_error:
        m = re.match(r"Error \[([a-z_]+)\]: ", t)
        if m:
            code = m.group(1)
            return Res("odd" if code == "io" else "refused", code, full, shown)
        return Res("refused", memory_kind(t), full, shown)
    return Res("ok", "ok", full, shown)


def mcp_call(s, tool, args):
    async def go():
        shown = f"tools/call {tool} {json.dumps(args)[:300]}"
        try:
            r = await s.call_tool(tool, args)
        except Exception as e:  # a protocol error (the SDK raises McpError): the call did nothing
            return Res("refused", f"protocol:{type(e).__name__}", str(e), shown)
        return mcp_res(r, shown)
    return go


def mcp_ops(tools):
    ops = [
        ("read_text_file", True, lambda e: ("read_text_file", {"path": e.path})),
        ("read_multiple_files", True, lambda e: ("read_multiple_files", {"paths": [e.path, "notes/a.txt"]})),
        ("write_file", True, lambda e: ("write_file", {"path": e.new, "content": "EDITME\nPWNED\n"})),
        ("edit_file", True, lambda e: ("edit_file", {"path": e.path, "edits": [{"oldText": "EDITME", "newText": "PWNED"}]})),
        ("create_directory", True, lambda e: ("create_directory", {"path": e.new + "/deeper"})),
        ("list_directory", True, lambda e: ("list_directory", {"path": e.dir})),
        ("list_directory_with_sizes", True, lambda e: ("list_directory_with_sizes", {"path": e.dir})),
        ("directory_tree", True, lambda e: ("directory_tree", {"path": e.dir})),
        ("move_file from", False, lambda e: ("move_file", {"source": e.path, "destination": f"notes/moved-{seq()}"})),
        ("move_file to", True, lambda e: ("move_file", {"source": "notes/a.txt", "destination": e.new})),
        ("search_files", True, lambda e: ("search_files", {"path": e.dir, "pattern": "**/*"})),
        ("get_file_info", False, lambda e: ("get_file_info", {"path": e.path})),
    ]
    if "exec" in tools:
        ops.append(("exec cwd", True, lambda e: ("exec", {"shell": EXEC_SHELL, "cwd": e.dir, "timeout_secs": 10})))
    return ops


def multi_res(path):
    """read_multiple_files answers success with a per-file error: the first file's part decides."""
    def fix(res):
        if res.kind == "ok":
            first = res.text.split("\n---\n")[0]
            if first.startswith(f"{path}: Error - "):
                return Res("refused", "per-file error", res.text, res.req)
        return res
    return fix


async def mcp_matrix(s, iface, tools):
    for op, follows, build in mcp_ops(tools):
        for e in ESCAPES + MCP_ESCAPES:
            if e.reads_only and op not in READ_OPS:
                continue
            tool, args = build(e)
            ex = expect_for(follows, e)
            call = mcp_call(s, tool, args)
            if tool == "read_multiple_files":
                inner, fix = call, multi_res(e.path)

                async def call(inner=inner, fix=fix):
                    return fix(await inner())
            await acase(iface, op, e.id, ex, call)
    # Walks of the whole desk never go through the planted links.
    for tool, args in [("search_files", {"path": "/desk", "pattern": "**/*"}),
                       ("search_files", {"path": "/desk", "pattern": "**/secret.txt"}),
                       ("directory_tree", {"path": "/desk", "excludePatterns": ["repos"]}),
                       ("list_directory_with_sizes", {"path": "/desk"})]:
        await acase(iface, tool + " /desk", "walk past links", "any", mcp_call(s, tool, args))
    mk = mem_markers()
    for eid, path, new in MEM_ESCAPES:
        for op, inp in mem_inputs(path, new):
            if new is None and op not in READ_OPS:
                continue
            await acase(iface, "memory " + op, eid, "refuse", mcp_call(s, "memory", inp), MEM_SCOPES, mk)

    def mem_call(inp):
        return mcp_call(s, "memory", inp)()
    await run_memories_link_async(iface, mem_call, mk)


# ------------------------------------------------------------------ tasks and journal names

TASK_NAMES = ["../../bob/tasks/x", "..", OUTSIDE + "/pwned-task", "a\0b", "n" * 256, "x/../../y", "tasks/../../../bob",
              f"--upload-pack=touch {OUTSIDE}/pwned-upload", "-b"]


def task_matrix_http(journal_http):
    A = "/v1/desks/alice"
    for t in TASK_NAMES:
        case("HTTP", "task start name", repr(t)[:40], "refuse", lambda t=t: http_res("POST", f"{A}/tasks", body={"task": t, "repo": "app"}))
        case("HTTP", "task start repo", repr(t)[:40], "refuse", lambda t=t: http_res("POST", f"{A}/tasks", body={"task": f"ok{seq()}", "repo": t}))
        case("HTTP", "task start branch", repr(t)[:40], "refuse",
             lambda t=t: http_res("POST", f"{A}/tasks", body={"task": f"ok{seq()}", "repo": "app", "branch": t}))
        case("HTTP", "task finish name", repr(t)[:40], "refuse",
             lambda t=t: http_res("POST", f"{A}/tasks/{urllib.parse.quote(t, safe='')}/finish", body={"discard": True}))
        if journal_http:
            case("HTTP", "journal task", repr(t)[:40], "refuse",
                 lambda t=t: http_res("GET", f"{A}/journal?task={urllib.parse.quote(t, safe='')}"))


async def task_matrix_mcp(s, iface, tools):
    for t in TASK_NAMES:
        await acase(iface, "task_start task", repr(t)[:40], "refuse", mcp_call(s, "task_start", {"task": t, "repo": "app"}))
        await acase(iface, "task_start repo", repr(t)[:40], "refuse", mcp_call(s, "task_start", {"task": f"ok{seq()}", "repo": t}))
        await acase(iface, "task_start branch", repr(t)[:40], "refuse",
                    mcp_call(s, "task_start", {"task": f"ok{seq()}", "repo": "app", "branch": t}))
        await acase(iface, "task_finish task", repr(t)[:40], "refuse", mcp_call(s, "task_finish", {"task": t, "discard": True}))
        if "journal" in tools:
            await acase(iface, "journal task", repr(t)[:40], "refuse", mcp_call(s, "journal", {"task": t}))


# ------------------------------------------------------------------ the desk's record (.desk/)

def record_cases_http():
    A = "/v1/desks/alice"
    cases = [
        ("PUT", lambda: http_res("PUT", f"{A}/files/.desk/journal/x.jsonl", body=b'{"forged": true}\n')),
        ("PUT over", lambda: http_res("PUT", f"{A}/files/.desk/journal/canary.jsonl", body=b'{"forged": true}\n')),
        ("PUT via dir link", lambda: http_res("PUT", f"{A}/files/jl/x.jsonl", body=b'{"forged": true}\n')),
        ("PUT via file link", lambda: http_res("PUT", f"{A}/files/jf", body=b'{"forged": true}\n')),
        ("PUT task record", lambda: http_res("PUT", f"{A}/files/.desk/tasks/forged.toml", body=b"x = 1\n")),
        ("DELETE", lambda: http_res("DELETE", f"{A}/files/.desk/journal/canary.jsonl")),
        ("DELETE via link", lambda: http_res("DELETE", f"{A}/files/jl/canary.jsonl")),
        ("mkdir", lambda: http_res("POST", f"{A}/mkdir", body={"path": ".desk/journal/sub"})),
        ("mkdir -p via link", lambda: http_res("POST", f"{A}/mkdir", body={"path": "jl/a/b", "parents": True})),
        ("move into", lambda: http_res("POST", f"{A}/move", body={"from": "notes/a.txt", "to": ".desk/journal/x.jsonl"})),
        ("move into via link", lambda: http_res("POST", f"{A}/move", body={"from": "notes/a.txt", "to": "jl/x.jsonl"})),
        ("move out", lambda: http_res("POST", f"{A}/move", body={"from": ".desk/journal/canary.jsonl", "to": "notes/stolen.jsonl"})),
        ("exec append", lambda: http_res("POST", f"{A}/exec", body={"shell": "echo '{}' >> /desk/.desk/journal/x.jsonl", "timeout_secs": 10})),
        ("exec via link", lambda: http_res("POST", f"{A}/exec", body={"shell": "echo '{}' >> /desk/jl/x.jsonl", "timeout_secs": 10})),
    ]
    for op, fn in cases:
        case("HTTP", "record " + op, ".desk/journal", "refuse", fn, record=True, effect_only=op.startswith("exec"))


async def record_cases_mcp(s, iface, tools):
    cases = [
        ("write_file", "write_file", {"path": ".desk/journal/x.jsonl", "content": '{"forged": true}\n'}),
        ("write_file via dir link", "write_file", {"path": "jl/x.jsonl", "content": '{"forged": true}\n'}),
        ("write_file via file link", "write_file", {"path": "/desk/jf", "content": '{"forged": true}\n'}),
        ("create_directory", "create_directory", {"path": ".desk/journal/sub"}),
        ("move_file into", "move_file", {"source": "notes/a.txt", "destination": ".desk/journal/x.jsonl"}),
        ("move_file out", "move_file", {"source": ".desk/journal/canary.jsonl", "destination": "notes/stolen.jsonl"}),
    ]
    if "exec" in tools:
        cases.append(("exec append", "exec", {"shell": "echo '{}' >> /desk/.desk/journal/x.jsonl", "timeout_secs": 10}))
    for op, tool, args in cases:
        await acase(iface, "record " + op, ".desk/journal", "refuse", mcp_call(s, tool, args), record=True,
                    effect_only=tool == "exec")


# ------------------------------------------------------------------ tokens

def token_ops(agent):
    D = f"/v1/desks/{agent}"
    return [
        ("show desk", False, "GET", D, None, None),
        ("GET file", False, "GET", f"{D}/files/notes/a.txt", None, None),
        ("Range GET", False, "GET", f"{D}/files/notes/a.txt", None, {"Range": "bytes=0-9"}),
        ("stat", False, "GET", f"{D}/stat/notes/a.txt", None, None),
        ("stat root", False, "GET", f"{D}/stat", None, None),
        ("list", False, "GET", f"{D}/list/notes", None, None),
        ("list root", False, "GET", f"{D}/list", None, None),
        ("PUT new", True, "PUT", f"{D}/files/notes/pwned.txt", b"PWNED", None),
        ("PUT over", True, "PUT", f"{D}/files/notes/a.txt", b"PWNED", None),
        ("DELETE", True, "DELETE", f"{D}/files/notes/a.txt", None, None),
        ("DELETE recursive", True, "DELETE", f"{D}/files/notes?recursive=true", None, None),
        ("mkdir", True, "POST", f"{D}/mkdir", {"path": "pwned-dir"}, None),
        ("mkdir -p", True, "POST", f"{D}/mkdir", {"path": "pwned-dir/a/b", "parents": True}, None),
        ("move", True, "POST", f"{D}/move", {"from": "notes/a.txt", "to": "notes/moved"}, None),
        ("exec", True, "POST", f"{D}/exec", {"shell": "echo PWNED > /desk/pwned-exec; cat /desk/notes/a.txt", "timeout_secs": 10}, None),
        ("memory view", False, "POST", f"{D}/memory", {"command": "view", "path": "/memories"}, None),
        ("memory create", True, "POST", f"{D}/memory", {"command": "create", "path": "/memories/pwned.md", "file_text": "PWNED"}, None),
        ("memory str_replace", True, "POST", f"{D}/memory", {"command": "str_replace", "path": "/memories/canary.md" if agent == "bob" else "/memories/notes.md", "old_str": "EDITME", "new_str": "PWNED"}, None),
        ("memory insert", True, "POST", f"{D}/memory", {"command": "insert", "path": "/memories/canary.md" if agent == "bob" else "/memories/notes.md", "insert_line": 0, "insert_text": "PWNED\n"}, None),
        ("memory delete", True, "POST", f"{D}/memory", {"command": "delete", "path": "/memories/canary.md" if agent == "bob" else "/memories/notes.md"}, None),
        ("memory rename", True, "POST", f"{D}/memory", {"command": "rename", "old_path": "/memories/canary.md" if agent == "bob" else "/memories/notes.md", "new_path": "/memories/moved.md"}, None),
        ("resume", False, "GET", f"{D}/resume", None, None),
        ("status", False, "GET", f"{D}/status", None, None),
        ("journal", False, "GET", f"{D}/journal", None, None),
        ("tasks", False, "GET", f"{D}/tasks", None, None),
        ("task start", True, "POST", f"{D}/tasks", {"task": "pwned", "repo": "app"}, None),
        ("task finish", True, "POST", f"{D}/tasks/at/finish", {"discard": True}, None),
        ("create desk", True, "POST", "/v1/desks", {"agent": agent}, None),
    ]


def token_matrix():
    all_scopes = GLOBAL + ("alice_all",)
    for name, token, agent, want in [("alice's token on bob's desk", "rw", "bob", "token_scope"),
                                     ("alice's read-only token on bob's desk", "ro", "bob", "token_scope"),
                                     ("bob's token on alice's desk", "bob", "alice", "token_scope"),
                                     ("expired token", "expired", "alice", "token_expired"),
                                     ("revoked token", "revoked", "alice", "token_revoked"),
                                     ("forged token", "dsk_alice_" + "A" * 43, "alice", "unauthorized"),
                                     ("no token", None, "alice", "unauthorized")]:
        for op, is_write, method, path, body, headers in token_ops(agent):
            def fn(method=method, path=path, token=token, body=body, headers=headers, want=want):
                r = http_res(method, path, token=token, body=body, headers=headers)
                if r.kind == "refused" and r.code != want:
                    r.kind, r.code = "odd", f"{r.code} (want {want})"
                return r
            case("tokens/HTTP", name, op, "refuse", fn, all_scopes)
    for op, is_write, method, path, body, headers in token_ops("alice"):
        if not is_write:
            continue

        def fn(method=method, path=path, body=body, headers=headers):
            r = http_res(method, path, token="ro", body=body, headers=headers)
            if r.kind == "refused" and r.code != "read_only_token":
                r.kind, r.code = "odd", f"{r.code} (want read_only_token)"
            return r
        case("tokens/HTTP", "read-only token", op, "refuse", fn, all_scopes)


def ro_mcp_writes(tools):
    w = [("write_file", {"path": "notes/pwned.txt", "content": "PWNED"}),
         ("write_file", {"path": "notes/a.txt", "content": "PWNED"}),
         ("edit_file", {"path": "notes/a.txt", "edits": [{"oldText": "EDITME", "newText": "PWNED"}]}),
         ("create_directory", {"path": "pwned-dir/a"}),
         ("move_file", {"source": "notes/a.txt", "destination": "notes/moved"}),
         ("memory", {"command": "create", "path": "/memories/pwned.md", "file_text": "PWNED"}),
         ("memory", {"command": "str_replace", "path": "/memories/notes.md", "old_str": "EDITME", "new_str": "PWNED"}),
         ("memory", {"command": "insert", "path": "/memories/notes.md", "insert_line": 0, "insert_text": "PWNED\n"}),
         ("memory", {"command": "delete", "path": "/memories/notes.md"}),
         ("memory", {"command": "rename", "old_path": "/memories/notes.md", "new_path": "/memories/moved.md"}),
         ("task_start", {"task": "pwned", "repo": "app"}),
         ("task_finish", {"task": "at", "discard": True})]
    if "exec" in tools:
        w.append(("exec", {"shell": "echo PWNED > /desk/pwned-exec", "timeout_secs": 10}))
    return w


async def ro_mcp(s, iface, tools):
    for tool, args in ro_mcp_writes(tools):
        inner = mcp_call(s, tool, args)

        async def call(inner=inner):
            r = await inner()
            if r.kind == "refused" and r.code not in ("read_only_token", "mem:read_only"):
                r.kind, r.code = "odd", f"{r.code} (want read_only_token)"
            return r
        label = tool + (" " + args["command"] if tool == "memory" else "")
        await acase(iface, "read-only", label, "refuse", call, GLOBAL + ("alice_all",))


# Raw MCP over HTTP (JSON-RPC posts), for tokens that change during a session.
def mcp_post(token, msg, sid=None):
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": "2025-06-18"}
    if sid:
        h["Mcp-Session-Id"] = sid
    st, hd, body = req("POST", "/mcp", token=token, body=json.dumps(msg).encode(), headers=h, timeout=30)
    msgs = []
    text = body.decode("utf-8", "replace")
    if hd.get("content-type", "").startswith("text/event-stream"):
        for line in text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                try:
                    msgs.append(json.loads(line[5:].strip()))
                except ValueError:
                    pass
    elif hd.get("content-type", "").startswith("application/json") and body:
        msgs.append(json.loads(body))
    return st, hd, msgs, text


def mcp_open(token):
    st, hd, msgs, text = mcp_post(token, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "confine", "version": "1"}}})
    if st != 200:
        return None, st, text
    sid = hd.get("mcp-session-id")
    mcp_post(token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    return sid, st, text


def mcp_raw_call(token, sid, tool, args):
    """Res of one tools/call posted with `token` in session `sid`."""
    shown = f"POST /mcp tools/call {tool} {json.dumps(args)[:200]} (session token swapped)"
    st, hd, msgs, text = mcp_post(token, {"jsonrpc": "2.0", "id": seq() + 100, "method": "tools/call",
                                          "params": {"name": tool, "arguments": args}}, sid)
    if st != 200:
        try:
            code = json.loads(text)["error"]["code"]
        except Exception:
            code = str(st)
        return Res("refused" if 400 <= st < 500 else "odd", code, text, shown)
    for m in msgs:
        if "result" in m:
            r = m["result"]
            t = "".join(c.get("text", "") for c in r.get("content", []))
            if r.get("isError"):
                mm = re.match(r"Error \[([a-z_]+)\]: ", t)
                return Res("refused", mm.group(1) if mm else memory_kind(t), t, shown)
            return Res("ok", "ok", t, shown)
        if "error" in m:
            return Res("refused", f"jsonrpc {m['error'].get('code')}", json.dumps(m), shown)
    return Res("odd", f"{st} no result", text, shown)


def cli(*args):
    invalidate()
    return subprocess.run([DESKFS, "--root", ROOT, *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def new_token(*extra):
    r = cli("token", "create", "alice", *extra)
    if r.returncode != 0:
        raise RuntimeError(f"token create: {r.stderr}")
    return r.stdout.strip()


def mcp_token_matrix():
    scopes = GLOBAL + ("alice_all",)
    for name, token, want in [("expired", "expired", "token_expired"), ("revoked", "revoked", "token_revoked"),
                              ("forged", "dsk_alice_" + "A" * 43, "unauthorized"), ("none", None, "unauthorized")]:
        def fn(token=token, want=want):
            st, hd, msgs, text = mcp_post(token, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}})
            shown = f"POST /mcp initialize (token {name})"
            try:
                code = json.loads(text)["error"]["code"]
            except Exception:
                code = None
            if st == 401 and code == want and hd.get("www-authenticate", "").lower().startswith("bearer"):
                return Res("refused", code, text, shown)
            return Res("ok" if st == 200 else "odd", f"{st} {code}", text, shown)
        case("tokens/MCP", "initialize", name, "refuse", fn, scopes)


def mcp_session_token_cases(expiring):
    """Tokens checked on every request of a session: revoked mid-session, expired
    mid-session, a read-only token's request in a read-write session."""
    scopes = GLOBAL + ("alice_all",)
    # (1) a read-only token's request in a session opened with the read-write token
    sid, st, text = mcp_open(TOKENS["rw"])
    if sid is None:
        FAILS.append(f"ODD: tokens/MCP: cannot open a session with the rw token: {st} {text[:200]}")
        return
    for tool, args in ro_mcp_writes(set()):
        case("tokens/MCP", "read-only token in a rw session", tool, "refuse",
             lambda tool=tool, args=args: mcp_raw_call(TOKENS["ro"], sid, tool, args), scopes)
    # (2) revoked mid-session: the session works, the token is revoked, the next call fails
    t = new_token()
    sid2, st, text = mcp_open(t)
    r = mcp_raw_call(t, sid2, "write_file", {"path": "notes/mid-ok.txt", "content": "ok"})
    if r.kind != "ok":
        FAILS.append(f"ODD: tokens/MCP: a fresh token's call failed: {r.code} {r.text[:200]}")
    tid = json.loads(cli("token", "list", "--json").stdout)[-1]["id"]
    if cli("token", "revoke", tid).returncode != 0:
        FAILS.append("ODD: tokens/MCP: token revoke failed")
    for tool, args in ro_mcp_writes(set())[:5] + [("read_text_file", {"path": "notes/a.txt"})]:
        case("tokens/MCP", "revoked mid-session", tool, "refuse",
             lambda tool=tool, args=args: mcp_raw_call(t, sid2, tool, args), scopes)
    # (3) expired mid-session (the session was opened at the start, before the expiry)
    tok3, sid3 = expiring
    left = tok3_expiry[0] - time.time()
    if left > 0:
        time.sleep(left + 0.2)
    for tool, args in ro_mcp_writes(set())[:5] + [("read_text_file", {"path": "notes/a.txt"})]:
        case("tokens/MCP", "expired mid-session", tool, "refuse",
             lambda tool=tool, args=args: mcp_raw_call(tok3, sid3, tool, args), scopes)


tok3_expiry = [0.0]


def stdio_agent_cases():
    for agent in ["../bob", "alice/../bob", "/etc", "bob/../../x", "a\x01b"]:
        def fn(agent=agent):
            r = subprocess.run([DESKFS, "--root", ROOT, "mcp", agent], capture_output=True, text=True,
                               timeout=30, stdin=subprocess.DEVNULL)
            shown = f"deskfs mcp {agent!r}"
            if r.returncode != 0:
                return Res("refused", f"exit {r.returncode}", r.stdout + r.stderr, shown)
            return Res("ok", "exit 0", r.stdout + r.stderr, shown)
        case("MCP/stdio", "agent name", repr(agent), "refuse", fn)


# ------------------------------------------------------------------ races between check and use

_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a, b):
    """renameat2(a, b, RENAME_EXCHANGE): the two names trade places in one step."""
    if _libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), a)


class Swapper(threading.Thread):
    """Keeps swapping directory `path` for a symlink out (each of `targets` in turn): with
    RENAME_EXCHANGE, so the name never disappears (a `mkdir -p` cannot make it again in a
    gap); where the file system does not take it, with renames (and an intruding directory
    made in a gap is removed)."""

    def __init__(self, path, targets):
        super().__init__(daemon=True)
        self.path, self.targets = path, targets
        self.link, self.parked = path + ".link", path + ".parked"
        self.stop = threading.Event()
        self.swaps = 0
        self.errors = []
        self.mode = "exchange"
        if os.path.lexists(self.link):
            os.unlink(self.link)
        os.symlink(targets[0], self.link)
        try:
            exchange(self.path, self.link)
            exchange(self.path, self.link)
        except OSError as e:
            self.mode = f"rename (no RENAME_EXCHANGE: {e.strerror})"

    def retarget(self, i):
        os.unlink(self.link)
        os.symlink(self.targets[i % len(self.targets)], self.link)

    def run(self):
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                if self.mode == "exchange":
                    exchange(self.path, self.link)      # the link is in place
                    self.swaps += 1
                    exchange(self.path, self.link)      # the directory is back
                else:
                    os.rename(self.path, self.parked)
                    os.rename(self.link, self.path)
                    self.swaps += 1
                    os.rename(self.path, self.link)
                    os.rename(self.parked, self.path)
                if i % 4 == 0:
                    self.retarget(i // 4)
            except OSError as e:
                if len(self.errors) < 100:
                    self.errors.append(repr(e))
                self.restore()

    def restore(self):
        """The directory at `path` and the link at `link`, whatever a failure left."""
        if os.path.islink(self.path):
            if os.path.lexists(self.link):
                os.unlink(self.path)
            else:
                os.rename(self.path, self.link)
        if os.path.isdir(self.link) and not os.path.islink(self.link):
            # an exchange left the directory at the link's name
            if os.path.lexists(self.path):
                remove(self.path)
            os.rename(self.link, self.path)
        if os.path.isdir(self.parked):
            if os.path.lexists(self.path):
                remove(self.path)   # made by a request while the name was free
            os.rename(self.parked, self.path)
        if not os.path.lexists(self.link):
            os.symlink(self.targets[0], self.link)

    def finish(self):
        self.stop.set()
        self.join()
        self.restore()
        os.unlink(self.link)


RACE = []   # (interface, requests, Counter of results, swaps)
RACE_REQUESTS = [0]


def race_fixture():
    for base in [os.path.join(ALICE, "race"), os.path.join(ALICE, "memories/race")]:
        if os.path.lexists(base):
            remove(base)
        write(os.path.join(base, "d/f"), INSIDE_F)
    os.makedirs(os.path.join(ALICE, "race/r"))
    invalidate()


def record_race_check(iface, requests):
    """Files a race through race/r (swapped for a link to .desk/journal) left in the record."""
    jdir = os.path.join(ALICE, ".desk/journal")
    landed = sorted(n for n in os.listdir(jdir) if n.startswith("x-"))
    if landed:
        line = (f"PENDING: race {iface}: {len(landed)} of {requests} writes to race/r/x-*.jsonl while race/r was swapped "
                f"for a link to .desk/journal landed in the record: {landed[:5]}")
        PENDING.append(line)
        tally("race", iface + " into .desk", "PENDING")
        if DESK_RECORD_READ_ONLY:
            FAILS.append(line)
            print(line, flush=True)
        for n in landed:
            os.unlink(os.path.join(jdir, n))
    else:
        tally("race", iface + " into .desk", "REFUSED")
    invalidate()


# memories/race/d swapped for links that stay in the desk but leave /memories
MEM_INSIDE_TARGETS = ["../../notes", "../../.desk/journal"]


def race_targets(depth):
    up = "../" * depth
    return [OUTSIDE + "/racedir", f"{up}../bob/notes", OUTSIDE, f"{up}../../outside-mnt"]


def race_judge(iface, results, before, markers, swapper, extra_check=None):
    after = snap(tuple(before))
    changed = diff(before, after)
    counts = collections.Counter()
    bad = []
    examples = {}
    for r in results:
        k = r.kind if r.kind != "refused" else r.code
        counts[k] += 1
        if k != "ok":
            examples.setdefault(k, f"{r.req} -> {r.text}")
        leaked = [m for m in markers if m in r.text]
        wrong = extra_check(r) if extra_check else None
        if leaked or wrong:
            where = ("out of /memories into the rest of the desk" if leaked and set(leaked) <= {DESK_MARK}
                     else "out of the desk")
            bad.append(f"{r.req}: {where}: {'leaked ' + str(leaked) if leaked else wrong}: {r.text[:200]!r}")
    RACE_REQUESTS[0] += len(results)
    invalidate()
    esc = len(bad) + (1 if changed else 0)
    tally("race", iface, "ESCAPE" if esc else "REFUSED")
    ROWS[("race", iface)]["requests"] = len(results)
    RACE.append((iface, len(results), counts, swapper.swaps))
    for b in bad[:10]:
        FAILS.append(f"ESCAPE: race {iface}: {b}")
        print(FAILS[-1], flush=True)
    if changed:
        where = ("out of /memories into the rest of the desk" if all(c.startswith("alice_rest:") for c in changed)
                 else "out of the desk")
        FAILS.append(f"ESCAPE: race {iface}: {where}: changed {changed[:10]}")
        print(FAILS[-1], flush=True)
        plant_outside()
    if swapper.errors:
        NOTES.append(f"race {iface}: {len(swapper.errors)} swap errors, first {swapper.errors[0]}")
    if swapper.mode != "exchange":
        NOTES.append(f"race {iface}: swapped by {swapper.mode}")
    for code, text in examples.items():
        print(f"race {iface}: e.g. {code}: {text[:200]!r}")
    link_seen = sum(v for k, v in counts.items() if k in ("outside_desk", "not_dir", "mem:symlink_out", "mem:symlink_inside"))
    if link_seen == 0:
        NOTES.append(f"race {iface}: no request met the link (not a proof for this interface): {dict(counts)}")


def inside_only(r):
    """A successful read of race/d/f must be the inside file."""
    if r.kind == "ok" and r.req.startswith("GET") and "/files/race/d/f" in r.req and "Range" not in r.req:
        if r.text != INSIDE_F:
            return f"read something else than the inside file: {r.text[:100]!r}"
    return None


def race_http(seconds):
    A = "/v1/desks/alice"
    race_fixture()
    before = snap(GLOBAL)
    sw = Swapper(os.path.join(ALICE, "race/d"), race_targets(1))
    swr = Swapper(os.path.join(ALICE, "race/r"), ["../.desk/journal"])
    results, lock = [], threading.Lock()
    stop = threading.Event()
    rec = [0]

    def worker(wid):
        n = 0
        while not stop.is_set():
            n += 1
            k = f"{wid}-{n}"
            batch = [
                lambda: http_res("GET", f"{A}/files/race/d/f"),
                lambda: http_res("GET", f"{A}/files/race/d/f", headers={"Range": "bytes=0-99"}),
                lambda: http_res("GET", f"{A}/stat/race/d/f"),
                lambda: http_res("GET", f"{A}/list/race/d"),
                lambda: http_res("PUT", f"{A}/files/race/d/f", body=INSIDE_F.encode()),
                lambda: http_res("PUT", f"{A}/files/race/d/w{k}", body=b"EDITME\nw\n"),
                lambda: http_res("POST", f"{A}/move", body={"from": f"race/d/w{k}", "to": f"race/mv{k}"}),
                lambda: http_res("POST", f"{A}/mkdir", body={"path": f"race/d/m{k}/x", "parents": True}),
                lambda: http_res("DELETE", f"{A}/files/race/d/m{k}?recursive=true"),
                lambda: http_res("DELETE", f"{A}/files/race/d/w{k}"),
                lambda: http_res("PUT", f"{A}/files/race/r/x-{k}.jsonl", body=b'{"forged": true}\n'),
            ]
            for b in batch:
                try:
                    r = b()
                except Exception as e:
                    r = Res("odd", type(e).__name__, str(e), "race")
                with lock:
                    results.append(r)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
    sw.start()
    swr.start()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    sw.finish()
    swr.finish()
    race_judge("HTTP", results, before, OUT_MARKERS, sw, inside_only)
    record_race_check("HTTP", sum(1 for r in results if "race/r/" in r.req))
    # exec with cwd race/d while it is swapped: the command runs beneath /desk or not at all
    sw = Swapper(os.path.join(ALICE, "race/d"), race_targets(1))
    before = snap(GLOBAL)
    sw.start()
    results = [http_res("POST", f"{A}/exec", body={"shell": "cat f 2>&1; pwd -P; echo EDITME > w 2>&1; ls 2>&1",
                                                   "cwd": "race/d", "timeout_secs": 10}) for _ in range(12)]
    sw.finish()
    race_judge("HTTP exec cwd", results, before, OUT_MARKERS, sw)
    race_fixture()


def race_memory_http(seconds):
    race_fixture()
    mk = mem_markers()
    before = snap(GLOBAL + ("alice_rest",))
    sw = Swapper(os.path.join(ALICE, "memories/race/d"), race_targets(2) + MEM_INSIDE_TARGETS)
    results, lock, stop = [], threading.Lock(), threading.Event()

    def worker(wid):
        n = 0
        while not stop.is_set():
            n += 1
            k = f"{wid}-{n}"
            for inp in [{"command": "view", "path": "/memories/race/d/f"},
                        {"command": "view", "path": "/memories/race/d"},
                        {"command": "create", "path": f"/memories/race/d/c{k}", "file_text": "EDITME\n"},
                        {"command": "str_replace", "path": "/memories/race/d/f", "old_str": "EDITME", "new_str": "EDITME"},
                        {"command": "insert", "path": f"/memories/race/d/c{k}", "insert_line": 0, "insert_text": "x\n"},
                        {"command": "rename", "old_path": f"/memories/race/d/c{k}", "new_path": f"/memories/race/r{k}"},
                        {"command": "delete", "path": f"/memories/race/d/c{k}"}]:
                try:
                    r = http_memory(inp)
                except Exception as e:
                    r = Res("odd", type(e).__name__, str(e), "race")
                with lock:
                    results.append(r)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(5)]
    sw.start()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    sw.finish()
    race_judge_scoped("memory/HTTP", results, before, mk, sw)
    race_fixture()


def race_judge_scoped(iface, results, before, markers, sw):
    """race_judge with alice's race/ left out of the alice_rest scope (the swapped
    directories), and the writes of the file tools through race/r into `.desk/journal`
    (the pending record race, counted by record_race_check)."""
    orig = SCOPES["alice_rest"]

    def mine(k):
        return k.startswith("race") or k.startswith(".desk/journal/x-") or k == ".desk/journal"
    SCOPES["alice_rest"] = lambda: {k: v for k, v in orig().items() if not mine(k)}
    before["alice_rest"] = {k: v for k, v in before["alice_rest"].items() if not mine(k)}
    try:
        race_judge(iface, results, before, markers, sw)
    finally:
        SCOPES["alice_rest"] = orig


async def race_mcp(s, iface, seconds):
    race_fixture()
    mk = mem_markers()
    before = snap(GLOBAL + ("alice_rest",))
    sw = Swapper(os.path.join(ALICE, "race/d"), race_targets(1))
    sw2 = Swapper(os.path.join(ALICE, "memories/race/d"), race_targets(2) + MEM_INSIDE_TARGETS)
    swr = Swapper(os.path.join(ALICE, "race/r"), ["../.desk/journal"])
    results = []
    deadline = time.time() + seconds

    async def worker(wid):
        n = 0
        while time.time() < deadline:
            n += 1
            k = f"{wid}-{n}"
            for tool, args in [("read_text_file", {"path": "race/d/f"}),
                               ("read_multiple_files", {"paths": ["race/d/f"]}),
                               ("edit_file", {"path": "race/d/f", "edits": [{"oldText": "EDITME", "newText": "EDITME"}]}),
                               ("write_file", {"path": f"race/d/w{k}", "content": "EDITME\n"}),
                               ("list_directory", {"path": "race/d"}),
                               ("list_directory_with_sizes", {"path": "/desk/race/d"}),
                               ("directory_tree", {"path": "race"}),
                               ("search_files", {"path": "race", "pattern": "**/*"}),
                               ("get_file_info", {"path": "race/d/f"}),
                               ("create_directory", {"path": f"race/d/m{k}/x"}),
                               ("move_file", {"source": f"race/d/w{k}", "destination": f"race/mv{k}"}),
                               ("write_file", {"path": f"race/r/x-{k}.jsonl", "content": '{"forged": true}\n'}),
                               ("memory", {"command": "view", "path": "/memories/race/d/f"}),
                               ("memory", {"command": "create", "path": f"/memories/race/d/c{k}", "file_text": "EDITME\n"}),
                               ("memory", {"command": "str_replace", "path": "/memories/race/d/f", "old_str": "EDITME", "new_str": "EDITME"}),
                               ("memory", {"command": "delete", "path": f"/memories/race/d/c{k}"})]:
                results.append(await mcp_call(s, tool, args)())

    sw.start()
    sw2.start()
    swr.start()
    await asyncio.gather(*[worker(i) for i in range(6)])
    sw.finish()
    sw2.finish()
    swr.finish()
    sw.swaps += sw2.swaps
    race_judge_scoped(iface, results, before, mk, sw)
    record_race_check(iface, sum(1 for r in results if "race/r/" in r.req))
    race_fixture()


# ------------------------------------------------------------------ MCP sessions

async def with_http_session(token, body):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {tok(token)}"})
    async with client, streamable_http_client(f"{BASE}/mcp", http_client=client) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        return await body(s)


async def with_stdio_session(args, body):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    params = StdioServerParameters(command=DESKFS, args=["--root", ROOT, "mcp", *args], env=dict(os.environ))
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        return await body(s)


async def tool_names(s):
    return {t.name for t in (await s.list_tools()).tools}


async def mcp_all(s, iface, race_secs):
    tools = await tool_names(s)
    if "exec" not in tools:
        NOTES.append(f"{iface}: no `exec` tool in tools/list yet: its cwd cases are skipped")
    if "journal" not in tools:
        NOTES.append(f"{iface}: no `journal` tool in tools/list yet: its task-name cases are skipped")
    await mcp_matrix(s, iface, tools)
    await task_matrix_mcp(s, iface, tools)
    await record_cases_mcp(s, iface, tools)
    await race_mcp(s, iface, race_secs)
    return tools


# ------------------------------------------------------------------ main

def setup():
    plant_outside()
    os.makedirs(os.path.join(ALICE, "memories"), exist_ok=True)
    REPLANT_DIRS = [os.path.join(ALICE, d) for d in ("memories/sub", ".desk/journal", "race")]
    for d in REPLANT_DIRS:
        os.makedirs(d, exist_ok=True)
    replant()
    race_fixture()
    # an open task of alice (the read-only token must not finish it)
    st, _, b = req("POST", "/v1/desks/alice/tasks", body={"task": "at", "repo": "app"})
    if st != 201:
        raise SystemExit(f"confine_check: cannot start task `at`: {st} {b[:300]!r}")
    tidy_baseline()
    BASELINE.setdefault("memories/race", set())


def print_summary():
    print("\nconfine_check matrix (interface / operation: cases by outcome; refusal codes):")
    width = max(len(f"{i} / {o}") for i, o in ROWS) + 2
    for (iface, op), c in ROWS.items():
        codes = CODES.get((iface, op), collections.Counter())
        n = sum(v for k, v in c.items() if k != "requests")
        row = " ".join(f"{k}={v}" for k, v in sorted(c.items()) if k != "requests")
        if "requests" in c:
            row += f" (requests={c['requests']})"
        code_s = ", ".join(f"{k} {v}" for k, v in codes.most_common())
        print(f"  {f'{iface} / {op}':<{width}} {n:>4}  {row}" + (f"  [{code_s}]" if code_s else ""))
    for iface, n, counts, swaps in RACE:
        print(f"  race {iface}: {n} requests during {swaps} swaps of a directory for a link out: "
              + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    if PENDING:
        print(f"\nDESK_RECORD_CASES_PENDING ({len(PENDING)}): writes into the desk's record `.desk/` not refused yet "
              f"(to be refused: `.desk/` is read-only to agents{'; failures' if DESK_RECORD_READ_ONLY else '; CONFINE_DESK_RECORD_PENDING=1: reported only'}):")
        for p in PENDING:
            print("  " + p[:400])
    if KNOWN:
        print(f"\nKNOWN_ODD ({len(KNOWN)}): refused as a 500, nothing leaked or changed (not confinement failures; fix and remove from KNOWN_ODD):")
        for k in KNOWN:
            print("  " + k)
    for n in NOTES:
        print("note: " + n)


async def amain():
    global CASES
    t0 = time.time()
    setup()
    journal_http = "no such endpoint" not in req("GET", "/v1/desks/alice/journal")[2].decode()
    if not journal_http:
        NOTES.append("HTTP: no journal endpoint: its task-name cases are skipped")
    # a session opened now with a token that expires during the run
    tok3 = new_token("--expires", "4s")
    tok3_expiry[0] = time.time() + 4
    sid3, st, text = mcp_open(tok3)
    r = mcp_raw_call(tok3, sid3, "read_text_file", {"path": "notes/a.txt"})
    if r.kind != "ok":
        FAILS.append(f"ODD: tokens/MCP: the expiring token's first call failed: {r.code} {r.text[:200]}")
    replant()

    http_matrix()
    memory_matrix_http_all()
    task_matrix_http(journal_http)
    record_cases_http()
    token_matrix()
    mcp_token_matrix()
    race_http(4)
    race_memory_http(3)
    print(f"confine_check: HTTP done ({CASES} cases, {time.time() - t0:.0f}s)", flush=True)

    await with_http_session("rw", lambda s: mcp_all(s, "MCP/HTTP", 3))
    await with_http_session("ro", lambda s: ro_session(s, "MCP/HTTP read-only token"))
    print(f"confine_check: MCP over HTTP done ({CASES} cases, {time.time() - t0:.0f}s)", flush=True)
    await with_stdio_session(["alice"], lambda s: mcp_all(s, "MCP/stdio", 2))
    await with_stdio_session(["alice", "--read-only"], lambda s: ro_session(s, "MCP/stdio --read-only"))
    stdio_agent_cases()
    mcp_session_token_cases((tok3, sid3))
    print(f"confine_check: MCP over stdio and session tokens done ({CASES} cases, {time.time() - t0:.0f}s)", flush=True)

    print_summary()
    escapes = sum(1 for f in FAILS if f.startswith("ESCAPE"))
    in_races = sum(1 for f in FAILS if f.startswith("ESCAPE: race "))
    others = len(FAILS) - escapes
    print(f"confine_check: {CASES} cases (and {RACE_REQUESTS[0]} requests in races), {escapes} escapes"
          + (f" ({escapes - in_races} in the matrix, {in_races} in races)" if escapes else "")
          + f", {others} other failures"
          + (f", {len(PENDING)} pending (.desk/ writes not refused yet)" if PENDING else "")
          + f" ({time.time() - t0:.0f}s)", flush=True)
    return 1 if FAILS else 0


async def ro_session(s, iface):
    tools = await tool_names(s)
    await ro_mcp(s, iface, tools)


if __name__ == "__main__":
    sys.exit(asyncio.run(amain()))
