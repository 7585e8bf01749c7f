#!/usr/bin/env python3
"""Load test of a running `deskfs serve` (the /v1 API), for tests/e2e/98l-serve-load.sh.

usage: serve_load.py BASE_URL TOKEN SERVER_PID [--agent alice] [--seconds 25]
                     [--min-rounds 4] [--max-rounds 30] [--max-rss-mib 256]
                     [--leak-margin-mib 48] [--figures FILE]

TOKEN is a read-write token of desk AGENT (alice), whose files this test owns: it writes
seed/, w/, mv/, del/, dirs/, execout/ and counter there. SERVER_PID is the server
process, whose memory is sampled from /proc/SERVER_PID/status every 50 ms.

Round 1 fires 200 requests at once (each thread connects first, then all wait on one
barrier and send together), mixed as below; then the same round runs again and again
for --seconds (at least --min-rounds rounds in all) at the same concurrency, to see the
server's memory settle. Every response must be the one expected (2xx; the 412 of an
If-Match conflict, which is retried; the 404 of a path the worker itself removed): any
other status, a broken connection, a torn read, a lost write or a lost update fails the
run and prints the request and the response. After every round: each counter increment
the server acknowledged is in the counter (no lost update), every exec's file has its
content, every exec is in the desk's journal; at the end every file written has exactly
its last content and no temporary file is left.

Memory: peak RSS (the kernel's VmHWM, and the 50 ms samples) must stay under
--max-rss-mib; and RSS after the last round must not exceed RSS after round 2 by more than
--leak-margin-mib (a leak makes every round add to it; comparing two rounds of the same
shape after the same work cannot fail by timing, only by memory the rounds left behind).
Nothing is timed: the figures (requests, wall time, requests/s, latency p50/p95/p99 per
kind, RSS) are printed, never asserted. Exit status 0 when everything held, 1 otherwise.
"""
import argparse
import hashlib
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("base")
ap.add_argument("token")
ap.add_argument("pid", type=int)
ap.add_argument("--agent", default="alice")
ap.add_argument("--seconds", type=float, default=25.0, help="run repeated rounds for this long")
ap.add_argument("--min-rounds", type=int, default=4)
ap.add_argument("--max-rounds", type=int, default=30)
ap.add_argument("--max-rss-mib", type=float, default=256.0)
ap.add_argument("--leak-margin-mib", type=float, default=48.0)
ap.add_argument("--figures", help="also write the figures table to this file")
ARGS = ap.parse_args()

URL = urllib.parse.urlsplit(ARGS.base)
HOST, PORT = URL.hostname, URL.port or 80
D = f"/v1/desks/{ARGS.agent}"
RUN_ID = "%08x" % random.getrandbits(32)  # in exec markers: this run's journal entries only
TIMEOUT = 120  # per request: a hung server fails the run instead of hanging it

# The mix of one round: 200 requests, each the first of a worker's chain.
#  - 100 reads: an agent reads far more than it writes (files, listings, its resume,
#    status and journal at the start of each session), so reads are half.
#  - 70 writes: 40 writers replace a file of their own and read it back (the common
#    write), 15 read-modify-write one shared counter under If-Match (the conflicting
#    write: where updates get lost), 5 each mkdir, move and delete chains.
#  - 30 execs: each starts a bubblewrap sandbox (a few processes, namespaces), by far the
#    heaviest request; 30 at once is already more than an agent host runs in parallel,
#    and keeps a round within a few seconds on a 2-core machine.
READS = {"get": 25, "range": 20, "torn": 10, "counter": 5, "stat": 12, "list": 10,
         "resume": 6, "status": 6, "journal": 6}
WRITES = {"own": 40, "bump": 15, "mkdir": 5, "move": 5, "delete": 5}
EXECS = {"write": 20, "read": 10}
N_READ, N_WRITE, N_EXEC = sum(READS.values()), sum(WRITES.values()), sum(EXECS.values())
N = N_READ + N_WRITE + N_EXEC
assert (N_READ, N_WRITE, N_EXEC) == (100, 70, 30)

# Files of 8 MiB (a seed ten readers fetch at once, two writers' files each written and
# read back) make a server that holds whole bodies in memory instead of streaming them
# show in the peak RSS: up to 14 x 8 MiB at once at the barrier.
BIG = 8 << 20
SEED_SIZES = [1, 777, 1000, 4096, 30000, 65536, 100003, 200000, 262144, 524288, BIG]


def own_size(i):
    """The size of writer i's file: 0 bytes to 128 KiB; one of 1 MiB, two of 8 MiB."""
    return {7: BIG, 23: BIG, 11: 1 << 20}.get(i, (i * 7919) % (128 << 10))


def seed_data(k):
    return random.Random(f"seed{k}").randbytes(SEED_SIZES[k])


SEEDS = [seed_data(k) for k in range(len(SEED_SIZES))]
SEED_SHA = [hashlib.sha256(s).hexdigest() for s in SEEDS]


def content(name, rnd, size):
    """Self-checking content: a header line naming the writer, the round, the length and
    the SHA-256 of the payload that follows it. A reader racing a writer can tell a whole
    version from a torn one without knowing which version it got."""
    payload = random.Random(f"{name}/{rnd}").randbytes(size)
    head = f"deskfs-load {name} round {rnd} len {size} sha256 {hashlib.sha256(payload).hexdigest()}\n"
    return head.encode() + payload


def whole_version(data):
    """(name, round) of self-checking content when it is whole, else None."""
    head, nl, payload = data.partition(b"\n")
    if not nl:
        return None
    f = head.decode(errors="replace").split(" ")
    if len(f) != 8 or f[0] != "deskfs-load" or f[4] != "len" or f[6] != "sha256":
        return None
    if int(f[5]) != len(payload) or hashlib.sha256(payload).hexdigest() != f[7]:
        return None
    return f[1], int(f[3])


# ---------------------------------------------------------------- bookkeeping
class Failed(Exception):
    """A chain stops at its first failure (already recorded)."""


LOCK = threading.Lock()
FAILURES = []          # one line per failure: the request and the response
FAILED_IN = {}         # phase -> failures
LAT = {}               # (phase, kind) -> [seconds]
COUNTS = {}            # phase -> requests
RETRIES_412 = [0]
INCREMENTS = [0]       # counter increments the server acknowledged (200 to If-Match PUT)
INFLIGHT = [0, 0]      # now, most at once (client side)
PHASE = ["setup"]


def note_failure(msg):
    with LOCK:
        FAILURES.append(msg)
        FAILED_IN[PHASE[0]] = FAILED_IN.get(PHASE[0], 0) + 1


def fail(msg):
    note_failure(msg)
    raise Failed()


def short(b, n=300):
    if b is None:
        return "-"
    if isinstance(b, (bytes, bytearray)):
        s = repr(bytes(b[:n]))
        return s + (f"...({len(b)} bytes)" if len(b) > n else "")
    return (str(b)[:n] + "...") if len(str(b)) > n else str(b)


class Client:
    """One keep-alive connection (one worker's)."""

    def __init__(self):
        self.conn = http.client.HTTPConnection(HOST, PORT, timeout=TIMEOUT)

    def connect(self):
        self.conn.connect()

    def close(self):
        self.conn.close()

    def _send(self, method, path, body, headers):
        h = {"Authorization": "Bearer " + ARGS.token}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        with LOCK:
            INFLIGHT[0] += 1
            INFLIGHT[1] = max(INFLIGHT[1], INFLIGHT[0])
        self.conn.request(method, path, body=body, headers=h)
        return body, h

    def _done(self, kind, t0):
        dt = time.monotonic() - t0
        with LOCK:
            INFLIGHT[0] -= 1
            LAT.setdefault((PHASE[0], kind), []).append(dt)
            COUNTS[PHASE[0]] = COUNTS.get(PHASE[0], 0) + 1

    def call(self, kind, method, path, body=None, headers=None, expect=(200,)):
        """(status, lower-case headers, body) of one request; anything but a status in
        `expect` is a failure."""
        t0 = time.monotonic()
        sent = None
        try:
            sent, _ = self._send(method, path, body, headers)
            r = self.conn.getresponse()
            data = r.read()
        except Exception as e:
            with LOCK:
                INFLIGHT[0] -= 1
            self.conn.close()
            fail(f"{method} {path} (headers {headers}, body {short(sent)}): no response: {type(e).__name__}: {e}")
        self._done(kind, t0)
        hd = {k.lower(): v for k, v in r.getheaders()}
        if r.status not in expect:
            fail(f"{method} {path} (headers {headers}, body {short(sent)}): want {expect}, got {r.status} {short(data)}")
        return r.status, hd, data

    def exec(self, shell):
        """Runs `shell` through POST .../exec: (stdout, stderr, exit event) once the
        stream ended; anything but a 200 stream ending in one `exit` is a failure."""
        path, req = f"{D}/exec", {"shell": shell, "timeout_secs": 120}
        t0 = time.monotonic()
        out, err, end, names = b"", b"", None, []
        try:
            self._send("POST", path, req, None)
            r = self.conn.getresponse()
            if r.status != 200 or not r.getheader("content-type", "").startswith("text/event-stream"):
                data = r.read()
                with LOCK:
                    INFLIGHT[0] -= 1
                fail(f"POST {path} {req}: want a 200 event stream, got {r.status} {r.getheader('content-type')} {short(data)}")
            ev, lines = None, []
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode().rstrip("\r\n")
                if line == "":
                    if lines:
                        d = json.loads("\n".join(lines))
                        names.append(ev)
                        if ev == "stdout":
                            out += d["text"].encode() if "text" in d else __import__("base64").b64decode(d["base64"])
                        elif ev == "stderr":
                            err += d["text"].encode() if "text" in d else __import__("base64").b64decode(d["base64"])
                        else:
                            end = (ev, d)
                    ev, lines = None, []
                elif not line.startswith(":"):
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "event":
                        ev = value
                    elif field == "data":
                        lines.append(value)
        except Failed:
            raise
        except Exception as e:
            with LOCK:
                INFLIGHT[0] -= 1
            self.conn.close()
            fail(f"POST {path} {req}: the stream broke: {type(e).__name__}: {e} (events so far {names})")
        self._done("exec", t0)
        if end is None or end[0] != "exit" or names[-1] != "exit":
            fail(f"POST {path} {req}: the stream did not end with one exit: events {names}, last {end}, "
                 f"stdout {short(out)}, stderr {short(err)}")
        return out, err, end[1]


def check(cond, what):
    if not cond:
        fail(what)


def error_code(data):
    try:
        return json.loads(data)["error"]["code"]
    except Exception:
        return None


# ---------------------------------------------------------------- the workers
class Round:
    """What one round's workers did, for the checks after it."""

    def __init__(self, rnd):
        self.rnd = rnd
        self.exec_files = {}   # path -> content an exec wrote
        self.exec_tags = []


def tag_of(rnd, kind, i):
    """A marker no other command's line contains (the dots end each number)."""
    return f"load.{RUN_ID}.r{rnd}.{kind}{i}."


def read_worker(c, rnd, kind, i):
    rng = random.Random(f"read/{rnd}/{kind}/{i}")
    k = rng.randrange(len(SEEDS) - 1)
    if kind == "get" and i % 5 in (0, 1) or kind == "range" and i % 4 == 0:
        k = len(SEEDS) - 1  # the big one
    if kind == "get":
        _, hd, data = c.call("read", "GET", f"{D}/files/seed/s{k}")
        check(data == SEEDS[k] and hd.get("etag"), f"GET seed/s{k}: {len(data)} bytes, sha256 "
              f"{hashlib.sha256(data).hexdigest()[:12]}, want {len(SEEDS[k])} bytes {SEED_SHA[k][:12]}; etag {hd.get('etag')}")
    elif kind == "range":
        size = len(SEEDS[k])
        form = i % 3
        if form == 0:
            a = rng.randrange(size)
            b = min(size - 1, a + rng.randrange(65536))
            spec, lo, hi = f"bytes={a}-{b}", a, b
        elif form == 1:
            n = 1 + rng.randrange(min(size, 4096))
            spec, lo, hi = f"bytes=-{n}", size - n, size - 1
        else:
            a = rng.randrange(size)
            spec, lo, hi = f"bytes={a}-", a, size - 1
        _, hd, data = c.call("read", "GET", f"{D}/files/seed/s{k}", headers={"Range": spec}, expect=(206,))
        check(data == SEEDS[k][lo:hi + 1] and hd.get("content-range") == f"bytes {lo}-{hi}/{size}",
              f"GET seed/s{k} Range {spec}: {len(data)} bytes, Content-Range {hd.get('content-range')}, "
              f"want bytes {lo}-{hi}/{size}, same bytes: {data == SEEDS[k][lo:hi + 1]}")
    elif kind == "torn":
        # A file a writer is replacing right now: the old version or the new, whole.
        w = rng.randrange(WRITES["own"])
        _, _, data = c.call("read", "GET", f"{D}/files/w/f{w}")
        v = whole_version(data)
        check(v is not None and v[0] == f"w/f{w}" and v[1] in (rnd - 1, rnd),
              f"GET w/f{w} while its writer replaces it: not a whole version of round {rnd - 1} or {rnd}: "
              f"{v} {short(data, 120)}")
    elif kind == "counter":
        _, _, data = c.call("read", "GET", f"{D}/files/counter")
        check(data.isdigit(), f"GET counter: {short(data)}")
    elif kind == "stat":
        if i % 4 == 0:
            _, _, data = c.call("read", "GET", f"{D}/stat")
            check(json.loads(data).get("kind") == "dir", f"stat of the desk: {short(data)}")
        else:
            _, _, data = c.call("read", "GET", f"{D}/stat/seed/s{k}")
            st = json.loads(data)
            check(st.get("kind") == "file" and st.get("size") == len(SEEDS[k]), f"stat seed/s{k}: {st}")
    elif kind == "list":
        if i % 3 == 0:
            _, _, data = c.call("read", "GET", f"{D}/list")
            names = {e["path"] for e in json.loads(data)["entries"]}
            check({"seed", "w", "counter"} <= names, f"list of the desk: {sorted(names)}")
        else:
            _, _, data = c.call("read", "GET", f"{D}/list/seed")
            names = sorted(e["path"] for e in json.loads(data)["entries"])
            check(names == sorted(f"seed/s{j}" for j in range(len(SEEDS))), f"list seed: {names}")
    elif kind == "resume":
        _, _, data = c.call("read", "GET", f"{D}/resume")
        check(isinstance(json.loads(data), dict), f"resume: {short(data)}")
    elif kind == "status":
        _, _, data = c.call("read", "GET", f"{D}/status")
        v = json.loads(data)
        check(isinstance(v.get("usage"), dict) and v.get("exec", {}).get("available") is True,
              f"status: {short(data, 500)}")
    elif kind == "journal":
        _, _, data = c.call("read", "GET", f"{D}/journal?limit=50")
        check(isinstance(json.loads(data).get("entries"), list), f"journal: {short(data)}")


def write_worker(c, rnd, kind, i):
    if kind == "own":
        name = f"w/f{i}"
        data = content(name, rnd, own_size(i))
        _, hd, body = c.call("write", "PUT", f"{D}/files/{name}", body=data, expect=(200, 201))
        etag = hd.get("etag")
        check(etag and json.loads(body).get("size") == len(data), f"PUT {name}: etag {etag}, {short(body)}")
        _, hd2, back = c.call("read", "GET", f"{D}/files/{name}")
        check(back == data, f"GET {name} after its PUT: {len(back)} bytes, want {len(data)}; "
              f"version {whole_version(back)}, want ({name!r}, {rnd})")
        check(hd2.get("etag") == etag, f"GET {name}: etag {hd2.get('etag')}, its PUT gave {etag}")
    elif kind == "bump":
        for _ in range(1000):
            _, hd, data = c.call("read", "GET", f"{D}/files/counter")
            st, _, body = c.call("write", "PUT", f"{D}/files/counter", body=str(int(data) + 1).encode(),
                                 headers={"If-Match": hd["etag"]}, expect=(200, 412))
            if st == 200:
                with LOCK:
                    INCREMENTS[0] += 1
                return
            check(error_code(body) == "etag_mismatch", f"PUT counter If-Match: 412 {short(body)}")
            with LOCK:
                RETRIES_412[0] += 1
        fail("counter increment: 1000 conflicts in a row")
    elif kind == "mkdir":
        d = f"dirs/d{i}"
        _, _, body = c.call("write", "POST", f"{D}/mkdir", body={"path": f"{d}/sub", "parents": True}, expect=(201,))
        check(json.loads(body).get("kind") == "dir", f"mkdir {d}/sub: {short(body)}")
        data = content(f"{d}/sub/f", rnd, 100 + i)
        c.call("write", "PUT", f"{D}/files/{d}/sub/f", body=data, expect=(201,))
        _, _, body = c.call("read", "GET", f"{D}/list/{d}/sub")
        names = [e["path"] for e in json.loads(body)["entries"]]
        check(names == [f"{d}/sub/f"], f"list {d}/sub: {names}")
        c.call("write", "DELETE", f"{D}/files/{d}?recursive=true", expect=(204,))
        _, _, body = c.call("read", "GET", f"{D}/stat/{d}", expect=(404,))
        check(error_code(body) == "not_found", f"stat {d} after its delete: {short(body)}")
    elif kind == "move":
        src, dst = f"mv/src{i}", f"mv/dst{i}"
        data = content(dst, rnd, 1000 * i)
        c.call("write", "PUT", f"{D}/files/{src}", body=data, expect=(201,))
        _, _, body = c.call("write", "POST", f"{D}/move", body={"from": src, "to": dst, "overwrite": True})
        check(json.loads(body).get("size") == len(data), f"move {src} {dst}: {short(body)}")
        _, _, back = c.call("read", "GET", f"{D}/files/{dst}")
        check(back == data, f"GET {dst} after the move: {whole_version(back)}, want ({dst!r}, {rnd})")
        _, _, body = c.call("read", "GET", f"{D}/stat/{src}", expect=(404,))
        check(error_code(body) == "not_found", f"stat {src} after it moved: {short(body)}")
    elif kind == "delete":
        p = f"del/x{i}"
        c.call("write", "PUT", f"{D}/files/{p}", body=content(p, rnd, 10 * i), expect=(201,))
        c.call("write", "DELETE", f"{D}/files/{p}", expect=(204,))
        _, _, body = c.call("read", "GET", f"{D}/files/{p}", expect=(404,))
        check(error_code(body) == "not_found", f"GET {p} after its delete: {short(body)}")


def exec_worker(c, rnd, kind, i, rs):
    tag = tag_of(rnd, kind, i)
    if kind == "write":
        path = f"execout/e{i}"
        text = f"{tag} " * (1 + i * 5)
        shell = (f"mkdir -p execout && printf '%s' '{text}' > {path} && echo 'out {tag}' "
                 f"&& echo 'err {tag}' >&2")
        out, err, ex = c.exec(shell)
        check(ex.get("code") == 0 and out == f"out {tag}\n".encode() and err == f"err {tag}\n".encode(),
              f"exec {shell!r}: exit {ex}, stdout {short(out)}, stderr {short(err)}")
        with LOCK:
            rs.exec_files[path] = text.encode()
            rs.exec_tags.append((tag, path))
    else:
        k = i % len(SEEDS)
        shell = f"sha256sum seed/s{k} | cut -c1-64; echo '{tag}' >&2"
        out, err, ex = c.exec(shell)
        check(ex.get("code") == 0 and out == f"{SEED_SHA[k]}\n".encode() and err == f"{tag}\n".encode(),
              f"exec {shell!r}: exit {ex}, stdout {short(out)}, stderr {short(err)}")
        with LOCK:
            rs.exec_tags.append((tag, None))


def plan(rnd, rs):
    jobs = []
    for kind, n in READS.items():
        jobs += [lambda c, kind=kind, i=i: read_worker(c, rnd, kind, i) for i in range(n)]
    for kind, n in WRITES.items():
        jobs += [lambda c, kind=kind, i=i: write_worker(c, rnd, kind, i) for i in range(n)]
    for kind, n in EXECS.items():
        jobs += [lambda c, kind=kind, i=i: exec_worker(c, rnd, kind, i, rs) for i in range(n)]
    random.Random(f"order{rnd}").shuffle(jobs)  # kinds interleaved in the send order
    assert len(jobs) == N
    return jobs


def run_round(rnd):
    """One round: N workers, connected first, released together by a barrier."""
    rs = Round(rnd)
    jobs = plan(rnd, rs)
    barrier = threading.Barrier(N + 1)

    def worker(job):
        c = Client()
        try:
            c.connect()
        except Exception as e:
            c = None
            note_failure(f"connect to {HOST}:{PORT}: {type(e).__name__}: {e}")
        try:
            barrier.wait(timeout=TIMEOUT)
        except threading.BrokenBarrierError:
            return
        if c is None:
            return
        try:
            job(c)
        except Failed:
            pass
        except Exception as e:  # a bug here, or a body that is not what the API documents
            note_failure(f"round {rnd}: {type(e).__name__}: {e}")
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(j,), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    barrier.wait(timeout=TIMEOUT)
    t0 = time.monotonic()
    for t in threads:
        t.join()
    return rs, time.monotonic() - t0


def after_round(c, rs):
    """The checks after a round: no lost update, the execs' files and journal entries."""
    _, _, data = c.call("check", "GET", f"{D}/files/counter")
    check(int(data) == INCREMENTS[0],
          f"lost update: the counter is {int(data)} after {INCREMENTS[0]} acknowledged increments (round {rs.rnd})")
    for path, want in sorted(rs.exec_files.items()):
        _, _, got = c.call("check", "GET", f"{D}/files/{path}")
        check(got == want, f"{path} written by an exec in round {rs.rnd}: {short(got, 80)}, want {short(want, 80)}")
    _, _, data = c.call("check", "GET", f"{D}/journal?task=_desk&limit=200")
    entries = json.loads(data)["entries"]
    by_tag = {}
    for e in entries:
        for tag, _ in rs.exec_tags:
            if tag in " ".join(e.get("command", [])):
                by_tag.setdefault(tag, []).append(e)
    for tag, path in rs.exec_tags:
        es = by_tag.get(tag, [])
        check(len(es) == 1, f"journal: {len(es)} entries of the exec {tag}, want 1")
        e = es[0]
        check(e.get("via") == "http" and e.get("exit_code") == 0, f"journal entry of {tag}: {short(json.dumps(e), 500)}")
        f = e.get("files")
        if path and f is not None and not e.get("changes_overflowed") and not f.get("totals"):
            check(path in f.get("created", []) + f.get("changed", []),
                  f"journal entry of {tag} does not name {path} among its changes: {short(json.dumps(f), 500)}")


def final_checks(c, last):
    for i in range(WRITES["own"]):
        name = f"w/f{i}"
        _, _, got = c.call("check", "GET", f"{D}/files/{name}")
        check(got == content(name, last, own_size(i)),
              f"{name} at the end: version {whole_version(got)}, want ({name!r}, {last})")
    for i in range(WRITES["move"]):
        dst = f"mv/dst{i}"
        _, _, got = c.call("check", "GET", f"{D}/files/{dst}")
        check(got == content(dst, last, 1000 * i), f"{dst} at the end: version {whole_version(got)}")
    for d, want in (("del", []), ("dirs", []), ("mv", sorted(f"mv/dst{i}" for i in range(WRITES["move"])))):
        _, _, data = c.call("check", "GET", f"{D}/list/{d}")
        names = sorted(e["path"] for e in json.loads(data)["entries"])
        check(names == want, f"list {d} at the end: {names}, want {want}")
    for d in ("", "/w", "/execout", "/seed"):
        _, _, data = c.call("check", "GET", f"{D}/list{d}")
        tmp = [e["path"] for e in json.loads(data)["entries"] if e["path"].rsplit("/", 1)[-1].startswith(".deskfs-put")]
        check(not tmp, f"temporary files left in {d or '/'}: {tmp}")


# ---------------------------------------------------------------- memory
def proc_status():
    """VmRSS, VmHWM, RssAnon (KiB) and Threads of the server, from /proc."""
    v = {}
    with open(f"/proc/{ARGS.pid}/status") as f:
        for line in f:
            k, _, rest = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "Threads"):
                v[k] = int(rest.split()[0])
    return v


SAMPLES = []   # (seconds since start, VmRSS KiB, Threads)
STOP = threading.Event()
T_START = time.monotonic()


def sampler():
    while not STOP.is_set():
        try:
            s = proc_status()
        except OSError as e:
            note_failure(f"the server (pid {ARGS.pid}) is gone: {e}")
            return
        SAMPLES.append((time.monotonic() - T_START, s["VmRSS"], s["Threads"]))
        STOP.wait(0.05)


def mib(kib):
    return kib / 1024.0


def pct(xs, p):
    """The p-th percentile (nearest rank) in ms."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return 1000.0 * s[max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))]


# ---------------------------------------------------------------- main
def setup():
    c = Client()
    for d in ("seed", "w", "mv", "del", "dirs", "execout"):
        c.call("setup", "POST", f"{D}/mkdir", body={"path": d, "parents": True}, expect=(201,))
    for k, s in enumerate(SEEDS):
        c.call("setup", "PUT", f"{D}/files/seed/s{k}", body=s, expect=(200, 201))
    for i in range(WRITES["own"]):  # round 0: the version the first round's readers may see
        c.call("setup", "PUT", f"{D}/files/w/f{i}", body=content(f"w/f{i}", 0, own_size(i)), expect=(200, 201))
    c.call("setup", "PUT", f"{D}/files/counter", body=b"0", expect=(200, 201))
    c.close()


def main():
    try:
        proc_status()
    except OSError as e:
        print(f"serve_load: FAILED: no server process {ARGS.pid}: {e}", flush=True)
        return 1
    setup_ok = True
    try:
        setup()
    except Failed:
        setup_ok = False
    if not setup_ok or FAILURES:
        print("serve_load: FAILED in setup:\n  " + "\n  ".join(FAILURES), flush=True)
        return 1
    time.sleep(0.5)
    before = proc_status()
    threading.Thread(target=sampler, daemon=True).start()
    rounds = []      # (round, wall seconds, requests, VmRSS KiB after)
    t_rep = None
    rnd = 0
    while True:
        rnd += 1
        PHASE[0] = "burst" if rnd == 1 else "repeated"
        n0 = COUNTS.get(PHASE[0], 0)
        rs, wall = run_round(rnd)
        n1 = COUNTS.get(PHASE[0], 0)
        if not FAILURES:
            PHASE[0] = "check"
            c = Client()  # a fresh connection: one idle through a round may have been closed
            try:
                after_round(c, rs)
            except Failed:
                pass
            c.close()
        ps = proc_status()
        rss = ps["VmRSS"]
        rounds.append((rnd, wall, n1 - n0, rss))
        print(f"serve_load: round {rnd}: {n1 - n0} requests in {wall:.2f} s, server VmRSS {mib(rss):.1f} MiB "
              f"(RssAnon {mib(ps['RssAnon']):.1f}), {ps['Threads']} threads"
              f"{', FAILED' if FAILURES else ''}", flush=True)
        if FAILURES:
            break
        if rnd == 1:
            t_rep = time.monotonic()
            continue
        if rnd >= ARGS.max_rounds or (rnd >= ARGS.min_rounds and time.monotonic() - t_rep >= ARGS.seconds):
            break
    if not FAILURES:
        PHASE[0] = "check"
        c = Client()
        try:
            final_checks(c, rnd)
        except Failed:
            pass
        c.close()
    time.sleep(1.0)
    STOP.set()
    end = proc_status()
    peak_sampled = max((s[1] for s in SAMPLES), default=0)
    peak = max(end["VmHWM"], peak_sampled)

    # ---- the figures
    rep = [r for r in rounds if r[0] > 1]
    lines = [f"serve_load figures: {N} concurrent requests per round ({N_READ} reads, {N_WRITE} writes, "
             f"{N_EXEC} execs; each the first of a chain), round 1 alone, then {len(rep)} rounds back to back",
             f"{'':34}{'round 1':>14}{('rounds 2..' + str(rnd)) if rnd > 1 else '-':>16}"]

    def row(name, a, b):
        lines.append(f"{name:34}{a:>14}{b:>16}")

    row("requests (HTTP, all kinds)", str(COUNTS.get("burst", 0)), str(COUNTS.get("repeated", 0)))
    row("errors (with the checks after)", str(FAILED_IN.get("burst", 0) + (FAILED_IN.get("check", 0) if rnd == 1 else 0)),
        str(FAILED_IN.get("repeated", 0) + (FAILED_IN.get("check", 0) if rnd > 1 else 0)))
    w1 = rounds[0][1] if rounds else 0
    wr = sum(r[1] for r in rep)
    row("wall time, s", f"{w1:.2f}", f"{wr:.2f}")
    row("requests/s", f"{COUNTS.get('burst', 0) / w1:.0f}" if w1 else "-",
        f"{COUNTS.get('repeated', 0) / wr:.0f}" if wr else "-")
    for kind in ("read", "write", "exec"):
        a, b = LAT.get(("burst", kind), []), LAT.get(("repeated", kind), [])
        row(f"{kind} requests", str(len(a)), str(len(b)))
        row(f"  {kind} latency p50/p95/p99, ms",
            f"{pct(a, 50):.0f}/{pct(a, 95):.0f}/{pct(a, 99):.0f}",
            f"{pct(b, 50):.0f}/{pct(b, 95):.0f}/{pct(b, 99):.0f}" if b else "-")
    lines.append(f"most requests in flight at once (client side): {INFLIGHT[1]}; 412 retries of the counter: "
                 f"{RETRIES_412[0]}; counter increments: {INCREMENTS[0]}")
    lines.append(f"server memory: VmRSS before {mib(before['VmRSS']):.1f} MiB (RssAnon {mib(before['RssAnon']):.1f}), "
                 f"peak {mib(peak):.1f} MiB (VmHWM {mib(end['VmHWM']):.1f}, highest 50 ms sample "
                 f"{mib(peak_sampled):.1f}, {len(SAMPLES)} samples), after {mib(end['VmRSS']):.1f} MiB "
                 f"(RssAnon {mib(end['RssAnon']):.1f}); threads before {before['Threads']}, "
                 f"most {max((s[2] for s in SAMPLES), default=0)}, after {end['Threads']}")
    lines.append("VmRSS after each round, MiB: " + " ".join(f"{mib(r[3]):.1f}" for r in rounds))
    if len(rounds) >= 3:
        growth = mib(rounds[-1][3] - rounds[1][3])
        lines.append(f"VmRSS after round {rounds[-1][0]} - after round 2: {growth:+.1f} MiB "
                     f"(limit +{ARGS.leak_margin_mib:.0f}); peak limit {ARGS.max_rss_mib:.0f} MiB")

    # ---- the memory checks (only figures above; these are the bounds)
    if peak > ARGS.max_rss_mib * 1024:
        FAILURES.append(f"memory not bounded: the server's peak RSS {mib(peak):.1f} MiB is over "
                        f"--max-rss-mib {ARGS.max_rss_mib:.0f}")
    if len(rounds) >= 3 and rounds[-1][3] - rounds[1][3] > ARGS.leak_margin_mib * 1024:
        FAILURES.append(f"memory keeps growing: VmRSS {mib(rounds[1][3]):.1f} MiB after round 2, "
                        f"{mib(rounds[-1][3]):.1f} MiB after round {rounds[-1][0]} (more than "
                        f"--leak-margin-mib {ARGS.leak_margin_mib:.0f} MiB more)")
    if not FAILURES and len(rounds) < 3:
        FAILURES.append(f"only {len(rounds)} rounds ran: the leak check needs 3")
    text = "\n".join(lines)
    print(text, flush=True)
    if ARGS.figures:
        with open(ARGS.figures, "w") as f:
            f.write(text + "\n")
    if FAILURES:
        print(f"serve_load: FAILED ({len(FAILURES)} failures; the first 10):", flush=True)
        for m in FAILURES[:10]:
            print("  " + m, flush=True)
        return 1
    print(f"serve_load: passed: {sum(COUNTS.get(p, 0) for p in ('burst', 'repeated'))} requests in "
          f"{len(rounds)} rounds, no error, no lost write or update, peak RSS {mib(peak):.1f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
