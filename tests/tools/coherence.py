#!/usr/bin/env python3
"""Coherence checks between mounts of one workspace (same host or other hosts).

Every check takes the paths of the same directory seen through two or more mounts
(e.g. /mnt/a/work and /mnt/b/work). It exits 0 and prints one summary line when the
check held, else prints `FAIL: ...` and exits 1.

  coherence.py trunc-rewrite A B          O_TRUNC without writes on A, rewrite on B: A reads B's bytes
  coherence.py close-to-open W R... [--rounds N]
        writer on W grows/shrinks/replaces (rename)/deletes a file; after each close the
        readers on R... open it and must read exactly the writer's last bytes (or ENOENT
        after a delete): never stale, never torn
  coherence.py rename-storm W R... [--seconds S]
        a writer renames fresh files over one name on W while readers on every path open,
        read and stat it: never ENOENT, never a torn or foreign content
  coherence.py handover A B [--rounds N]  a poller on B waits for results that A hands over
        by rename (tmp -> result): the result never vanishes once seen, each is whole
  coherence.py git-refs A B [--rounds N]  `git update-ref` on A, `git rev-parse` on B at once
  coherence.py sqlite A B [--rows N]      two processes (one per mount) write one SQLite
        database in rollback-journal mode: every row lands, integrity_check ok
"""
import argparse
import hashlib
import multiprocessing as mp
import os
import random
import sqlite3
import struct
import subprocess
import sys
import time

MAGIC = b"DKCO"


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def blob(version, size, seed):
    """A self-describing content: header (magic, version, size, sha256 of body) + body."""
    rnd = random.Random(seed * 1000003 + version)
    body = rnd.randbytes(max(0, size))
    head = MAGIC + struct.pack("<QQ", version, len(body)) + hashlib.sha256(body).digest()
    return head + body


def parse(data):
    """(version, ok) of a blob read back; ok False = torn / foreign / truncated."""
    if len(data) < 4 + 16 + 32 or data[:4] != MAGIC:
        return None, False
    version, n = struct.unpack("<QQ", data[4:20])
    body = data[52:]
    if len(body) != n or hashlib.sha256(body).digest() != data[20:52]:
        return version, False
    return version, True


def write_file(path, data, fsync=False):
    with open(path, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def workdirs(paths, tag):
    """A fresh directory `tag.PID` created through the first path; the others see it."""
    name = "%s.%d.%d" % (tag, os.getpid(), random.randrange(1 << 30))
    os.mkdir(os.path.join(paths[0], name))
    dirs = [os.path.join(p, name) for p in paths]
    deadline = time.time() + 5
    for d in dirs[1:]:
        while not os.path.isdir(d):
            if time.time() > deadline:
                fail("directory %s created on one mount never appeared at %s" % (name, d))
            time.sleep(0.01)
    return dirs


def cmd_trunc_rewrite(a):
    A, B = workdirs([a.paths[0], a.paths[1]], "trunc")
    fa, fb = os.path.join(A, "f"), os.path.join(B, "f")
    for r in range(a.rounds):
        write_file(fa, b"hello %d\n" % r)
        got = read_file(fb)
        if got != b"hello %d\n" % r:
            fail("round %d: B does not read A's first write: got %r (then %r)" % (r, got[:80], read_file(fb)[:80]))
        fd = os.open(fa, os.O_WRONLY | os.O_TRUNC)
        os.close(fd)
        want = b"world data %d, longer than before\n" % r
        write_file(fb, want)
        got = read_file(fa)
        if got != want:
            fail("round %d: after O_TRUNC on A and a rewrite on B, A reads %r, want %r" % (r, got[:80], want))
        if os.stat(fa).st_size != len(want):
            fail("round %d: A's stat size %d, want %d" % (r, os.stat(fa).st_size, len(want)))
    print("trunc-rewrite: %d rounds, A always read B's bytes" % a.rounds)


def cmd_close_to_open(a):
    dirs = workdirs(a.paths, "c2o")
    W, readers = dirs[0], dirs[1:]
    name = "f"
    rnd = random.Random(a.seed)
    present = False
    want = None
    stats = {"grow": 0, "shrink": 0, "replace": 0, "delete": 0, "append": 0}
    for r in range(1, a.rounds + 1):
        op = rnd.choice(["grow", "shrink", "replace", "delete", "append"] if present else ["grow", "replace"])
        p = os.path.join(W, name)
        if op == "grow" or op == "shrink":
            size = rnd.randrange(4096, 3 << 20) if op == "grow" else rnd.randrange(0, 300)
            want = blob(r, size, a.seed)
            write_file(p, want)
            present = True
        elif op == "append":
            # Append a whole new blob after truncating: in place, through O_APPEND.
            want = blob(r, rnd.randrange(0, 200000), a.seed)
            with open(p, "r+b") as f:
                f.truncate(0)
            fd = os.open(p, os.O_WRONLY | os.O_APPEND)
            os.write(fd, want)
            os.close(fd)
        elif op == "replace":
            want = blob(r, rnd.randrange(0, 1 << 20), a.seed)
            tmp = os.path.join(W, ".tmp-%d" % r)
            write_file(tmp, want)
            os.rename(tmp, p)
            present = True
        else:
            os.unlink(p)
            present = False
            want = None
        stats[op] += 1
        for R in readers:
            q = os.path.join(R, name)
            try:
                got = read_file(q)
            except FileNotFoundError:
                if present:
                    fail("round %d (%s): %s is missing after the writer's close" % (r, op, q))
                continue
            if not present:
                fail("round %d: %s still exists after the writer deleted it" % (r, q))
            if got != want:
                v, ok = parse(got)
                fail("round %d (%s): %s read %d bytes (version %s, whole=%s), want version %d, %d bytes"
                     % (r, op, q, len(got), v, ok, r, len(want)))
    print("close-to-open: %d rounds %s, %d readers: never stale or torn" % (a.rounds, stats, len(readers)))


def storm_reader(path, stop_at, q):
    enoent = torn = reads = 0
    versions = set()
    while time.time() < stop_at:
        step = "stat"
        try:
            os.stat(path)
            step = "open/read"
            data = read_file(path)
        except FileNotFoundError:
            enoent += 1
            continue
        except OSError as e:
            q.put(("error", "%s (%s): %s" % (path, step, e)))
            return
        v, ok = parse(data)
        reads += 1
        if not ok:
            torn += 1
        else:
            versions.add(v)
    q.put(("done", path, enoent, torn, reads, len(versions)))


def cmd_rename_storm(a):
    dirs = workdirs(a.paths, "storm")
    W = dirs[0]
    name = "target"
    write_file(os.path.join(W, name), blob(0, 100, a.seed))
    for d in dirs:
        deadline = time.time() + 5
        while not os.path.exists(os.path.join(d, name)):
            if time.time() > deadline:
                fail("initial file never appeared at %s" % d)
            time.sleep(0.01)
    stop_at = time.time() + a.seconds
    q = mp.Queue()
    procs = []
    for d in dirs:
        for _ in range(2):
            pr = mp.Process(target=storm_reader, args=(os.path.join(d, name), stop_at, q))
            pr.start()
            procs.append(pr)
    n = 0
    while time.time() < stop_at:
        n += 1
        tmp = os.path.join(W, ".w-%d" % n)
        write_file(tmp, blob(n, random.randrange(0, 5000), a.seed))
        os.rename(tmp, os.path.join(W, name))
    results = [q.get(timeout=60) for _ in procs]
    for pr in procs:
        pr.join()
    total_enoent = total_torn = total_reads = 0
    for r in results:
        if r[0] == "error":
            fail("reader error: " + r[1])
        _, path, enoent, torn, reads, nv = r
        total_enoent += enoent
        total_torn += torn
        total_reads += reads
    if total_enoent or total_torn:
        fail("rename storm: %d renames, %d reads: %d ENOENT, %d torn (must both be 0)"
             % (n, total_reads, total_enoent, total_torn))
    print("rename-storm: %d renames over one name, %d reads by %d readers on %d mounts: 0 ENOENT, 0 torn"
          % (n, total_reads, len(procs), len(dirs)))


def handover_poller(path, done, final, q):
    """Polls `path` until the writer is done and its last version was read."""
    seen = 0
    last = -1
    deadline = time.time() + 240
    while time.time() < deadline:
        if done.is_set() and last == final.value:
            q.put("ok %d" % seen)
            return
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
        except FileNotFoundError:
            if last >= 0:
                q.put("result vanished after version %d was seen" % last)
                return
            time.sleep(0.001)
            continue
        except OSError as e:
            q.put("reading the result failed after version %d: %s" % (last, e))
            return
        v, ok = parse(data)
        if not ok:
            q.put("torn result (version %s; inode %d, st_size %d, read %d bytes)" % (v, st.st_ino, st.st_size, len(data)))
            return
        if v < last:
            q.put("went back from version %d to %d" % (last, v))
            return
        if v != last:
            seen += 1
            last = v
    q.put("the poller never read the last result (version %d) within 240 s; saw up to %d" % (final.value, last))


def cmd_handover(a):
    A, B = workdirs([a.paths[0], a.paths[1]], "hand")
    q = mp.Queue()
    done = mp.Event()
    final = mp.Value("q", -1)
    pr = mp.Process(target=handover_poller, args=(os.path.join(B, "result"), done, final, q))
    pr.start()
    for r in range(a.rounds):
        tmp = os.path.join(A, ".result.tmp")
        write_file(tmp, blob(r, random.randrange(0, 20000), a.seed))
        os.rename(tmp, os.path.join(A, "result"))
        final.value = r
        time.sleep(0.005)
    done.set()
    try:
        res = q.get(timeout=300)
    except Exception:  # noqa: BLE001 - the poller hung
        pr.kill()
        fail("handover: the poller gave no answer within 300 s")
    pr.join()
    if not res.startswith("ok"):
        fail("handover: " + res)
    print("handover: %d results handed over by rename; the poller on the other mount saw %s of them, never missing, torn or older" % (a.rounds, res.split()[1]))


def git(cwd, *args):
    return subprocess.run(["git", "-C", cwd] + list(args), check=True, capture_output=True, text=True).stdout.strip()


def cmd_git_refs(a):
    A, B = workdirs([a.paths[0], a.paths[1]], "git")
    git(A, "init", "-q")
    git(A, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "0")
    commits = []
    for i in range(a.rounds):
        c = git(A, "-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", "HEAD^{tree}", "-m", str(i))
        commits.append(c)
    for i, c in enumerate(commits):
        git(A, "update-ref", "refs/heads/x", c)
        try:
            got = git(B, "rev-parse", "refs/heads/x")
        except subprocess.CalledProcessError as e:
            fail("round %d: rev-parse on the other mount failed: %s" % (i, e.stderr.strip()))
        if got != c:
            fail("round %d: the other mount sees %s, want %s" % (i, got, c))
    print("git-refs: %d ref updates on one mount, each seen at once on the other" % len(commits))


def sqlite_writer(db, wid, rows, q):
    try:
        con = sqlite3.connect(db, timeout=60, isolation_level=None)
        con.execute("PRAGMA journal_mode=DELETE")
        for i in range(rows):
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT INTO t(w, i) VALUES(?, ?)", (wid, i))
            con.execute("COMMIT")
        con.close()
        q.put("ok")
    except Exception as e:  # noqa: BLE001 - reported as the failure
        # SQLite's extended code says which call failed (IOERR_DELETE, _FSYNC, _LOCK, ...).
        q.put("writer %d: %s (%s)" % (wid, e, getattr(e, "sqlite_errorname", "?")))


def cmd_sqlite(a):
    A, B = workdirs([a.paths[0], a.paths[1]], "sql")
    db_a, db_b = os.path.join(A, "app.db"), os.path.join(B, "app.db")
    con = sqlite3.connect(db_a, isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("CREATE TABLE t(w INTEGER, i INTEGER)")
    con.close()
    q = mp.Queue()
    procs = [mp.Process(target=sqlite_writer, args=(db, w, a.rows, q)) for w, db in enumerate([db_a, db_b, db_a, db_b])]
    for p in procs:
        p.start()
    res = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    bad = [r for r in res if r != "ok"]
    if bad:
        fail("sqlite: " + "; ".join(bad))
    con = sqlite3.connect(db_b, isolation_level=None)
    n = con.execute("SELECT count(*) FROM t").fetchone()[0]
    ic = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    if n != a.rows * len(procs) or ic != "ok":
        fail("sqlite: %d rows (want %d), integrity %s" % (n, a.rows * len(procs), ic))
    print("sqlite: %d writers on 2 mounts, %d rows exact, integrity ok (rollback journal)" % (len(procs), n))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in [("trunc-rewrite", cmd_trunc_rewrite), ("close-to-open", cmd_close_to_open),
                     ("rename-storm", cmd_rename_storm), ("handover", cmd_handover),
                     ("git-refs", cmd_git_refs), ("sqlite", cmd_sqlite)]:
        p = sub.add_parser(name)
        p.add_argument("paths", nargs="+")
        p.add_argument("--rounds", type=int, default=50)
        p.add_argument("--seconds", type=float, default=5)
        p.add_argument("--rows", type=int, default=50)
        p.add_argument("--seed", type=int, default=1)
        p.set_defaults(fn=fn)
    a = ap.parse_args()
    if len(a.paths) < 2:
        fail("%s needs at least two paths (the same directory through two mounts)" % a.cmd)
    for p in a.paths:
        if not os.path.isdir(p):
            fail("not a directory: %s" % p)
    random.seed(a.seed)
    a.fn(a)


if __name__ == "__main__":
    main()
