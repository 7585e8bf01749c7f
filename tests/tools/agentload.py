#!/usr/bin/env python3
"""agentload.py: an agent's day as a workload + checker, for the soak test (tests/e2e/82s-soak.sh).

  agentload.py prepare --src DIR            make DIR/src.git (a bare repo: 60 files in
                                            12 dirs, 3 commits) and DIR/pkg.tar (an
                                            npm-style package tree: 100 small files)
  agentload.py work  --mnt DIR --journal FILE --src DIR --seed S
  agentload.py check --mnt DIR --journal FILE --src DIR --after kill|power

`work` runs until it is killed. Two threads, each appending a line to the journal (a
file on the real disk, never on the mount; one O_APPEND write per line) only after the
call that makes the promise returned:
  * rounds, one after the other, each in DIR/rounds/rNNNN: `tar -xf pkg.tar`, `git clone`
    of src.git, a commit in the clone (`git add -A && git commit`), then
      done rNNNN              the round's tools all exited 0 (every file closed)
    and rounds older than the last two are removed:
      removing rNNNN / removed rNNNN   before / after `rm -r` of the round returned
  * SQLite transactions on DIR/db/soak.db (WAL, synchronous=FULL: a commit returns after
    the WAL's fsync): one row per transaction, n = 1, 2, 3, ... in order,
      dbready                 the database and its table exist, the file and its
                              directory fsynced (SQLite does not fsync the directory of a
                              new database file itself)
      begin N                 before the transaction inserting row N starts (rows above
                              the highest N begun cannot exist)
      commit N                COMMIT of row N returned
`check` holds the mount to what deskfs promises for what happened (`--after`):
  * kill (the daemon was killed with SIGKILL, or unmounted; the machine stayed up): what
    was closed survives. Every round journaled done and not being removed is whole:
    `tar --compare` against pkg.tar finds no difference, `git fsck --strict` of the clone
    passes, its log has the 4 commits and its work tree is clean. Rounds not done, and
    rounds being removed, are removed now (`rm -r` must succeed on whatever is left) and
    journaled removed.
  * power (a power cut: only what was fsynced survives): rounds were never fsynced, so
    nothing about their content is promised, and a removed round may be back (its `rm -r`
    was never fsynced either); every file left in any round must still read without an
    error, and `rm -r` of each must succeed (all are removed and journaled).
  * both: once dbready was journaled, the database passes `PRAGMA integrity_check`, and
    its rows are exactly 1..M with M >= the last journaled commit (a commit that returned
    survives kill -9 and power loss) and M <= the highest row begun (a COMMIT under way
    at the event may have landed; the next cycle then goes on from it, so the rows can
    run more than one ahead of the last returned commit).
Exit status 0 = as promised, 1 = problems (listed), 2 = usage error.
"""
import argparse
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time

KEEP_ROUNDS = 2
COMMITS = 4  # 3 in src.git + the round's own


def jwrite(jfd, line):
    os.write(jfd, (line + "\n").encode())


def run(cmd, **kw):
    """Run a tool; raise with its stderr when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-500:]}")
    return p.stdout


GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="soak", GIT_AUTHOR_EMAIL="soak@localhost",
               GIT_COMMITTER_NAME="soak", GIT_COMMITTER_EMAIL="soak@localhost",
               GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")


def prepare(a):
    rng = random.Random(7)
    work = os.path.join(a.src, "src.work")
    os.makedirs(work)
    run(["git", "init", "-q", "-b", "main", work], env=GIT_ENV)
    for c in range(3):
        for i in range(20):
            d = os.path.join(work, f"mod{(c * 20 + i) % 12:02d}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"f{c}_{i}.rs"), "w") as f:
                f.write(f"// commit {c} file {i}\n" + "x" * rng.randrange(10, 3000) + "\n")
        run(["git", "-C", work, "add", "-A"], env=GIT_ENV)
        run(["git", "-C", work, "commit", "-q", "-m", f"commit {c}"], env=GIT_ENV)
    run(["git", "clone", "-q", "--bare", work, os.path.join(a.src, "src.git")], env=GIT_ENV)
    shutil.rmtree(work)
    pkg = os.path.join(a.src, "pkg")
    for i in range(100):
        d = os.path.join(pkg, "node_modules", f"dep{i % 30:02d}", "lib" if i % 3 else "")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"m{i:03d}.js"), "w") as f:
            f.write(f"module.exports = {i};\n" + "/*" + "y" * rng.randrange(0, 8000) + "*/\n")
    run(["tar", "-cf", os.path.join(a.src, "pkg.tar"), "-C", pkg, "."])
    shutil.rmtree(pkg)


def fsync_path(path, flags=os.O_RDONLY):
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rounds_loop(a, jfd, first):
    base = os.path.join(a.mnt, "rounds")
    os.makedirs(base, exist_ok=True)
    r = first
    while True:
        name = f"r{r:04d}"
        d = os.path.join(base, name)
        t0 = time.monotonic()
        os.makedirs(d)
        run(["tar", "-xf", os.path.join(a.src, "pkg.tar"), "-C", d])
        clone = os.path.join(d, "clone")
        run(["git", "clone", "-q", os.path.join(a.src, "src.git"), clone], env=GIT_ENV)
        with open(os.path.join(clone, "ROUND"), "w") as f:
            f.write(name + "\n")
        run(["git", "-C", clone, "add", "-A"], env=GIT_ENV)
        run(["git", "-C", clone, "commit", "-q", "-m", name], env=GIT_ENV)
        jwrite(jfd, f"done {name}")
        print(f"{name} done in {time.monotonic() - t0:.1f} s", flush=True)
        old = r - KEEP_ROUNDS
        if old >= first:
            oname = f"r{old:04d}"
            jwrite(jfd, f"removing {oname}")
            shutil.rmtree(os.path.join(base, oname))
            jwrite(jfd, f"removed {oname}")
        r += 1


def db_loop(a, jfd, rng):
    ddir = os.path.join(a.mnt, "db")
    path = os.path.join(ddir, "soak.db")
    fresh = not os.path.exists(path)
    os.makedirs(ddir, exist_ok=True)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    if fresh:
        con.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY, payload BLOB)")
        fsync_path(path)
        fsync_path(ddir, os.O_RDONLY | os.O_DIRECTORY)
        jwrite(jfd, "dbready")
    n = con.execute("SELECT coalesce(max(n), 0) FROM t").fetchone()[0]
    while True:
        n += 1
        jwrite(jfd, f"begin {n}")
        t0 = time.monotonic()
        con.execute("BEGIN")
        con.execute("INSERT INTO t VALUES (?, ?)", (n, rng.randbytes(rng.randrange(10, 3000))))
        con.execute("COMMIT")
        jwrite(jfd, f"commit {n}")
        took = time.monotonic() - t0
        if took > 0.5:
            print(f"slow: the transaction of row {n} took {took * 1000:.0f} ms", flush=True)
        time.sleep(rng.random() * 0.02)


def work(a):
    jfd = os.open(a.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    j = read_journal(a.journal)
    first = max([int(r[1:]) for r in j["rounds"]] + [0]) + 1
    rng = random.Random(a.seed)

    def guard(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # reported, then the whole workload stops
            print(f"ERROR {fn.__name__}: {e!r}", flush=True)
            os._exit(1)

    threads = [threading.Thread(target=guard, args=(rounds_loop, a, jfd, first), daemon=True),
               threading.Thread(target=guard, args=(db_loop, a, jfd, rng), daemon=True)]
    for t in threads:
        t.start()
    print("READY", flush=True)
    for t in threads:
        t.join()


def read_journal(path):
    j = {"rounds": {}, "dbready": False, "commit": 0, "begin": 0}
    if not os.path.exists(path):
        return j
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) == 1 and w[0] == "dbready":
                j["dbready"] = True
            elif len(w) == 2 and w[0] in ("commit", "begin"):
                j[w[0]] = max(j[w[0]], int(w[1]))
            elif len(w) == 2 and w[0] in ("done", "removing", "removed"):
                j["rounds"][w[1]] = w[0]
    return j


def read_all(top, problems):
    """Read every file under top; an error is a problem. Returns how many files."""
    n = 0
    for root, dirs, files in os.walk(top, onerror=lambda e: problems.append(f"walk: {e}")):
        for name in files:
            p = os.path.join(root, name)
            try:
                if os.path.islink(p):
                    os.readlink(p)
                else:
                    with open(p, "rb") as f:
                        while f.read(1 << 20):
                            pass
                n += 1
            except OSError as e:
                problems.append(f"{os.path.relpath(p, top)}: unreadable: {e}")
    return n


def describe(top):
    """The first 12 entries under top (path, kind, size), for a problem's line."""
    out = []
    for root, dirs, files in os.walk(top):
        for n in dirs + files:
            p = os.path.join(root, n)
            try:
                st = os.lstat(p)
                out.append(f"{os.path.relpath(p, top)}{'/' if n in dirs else ''} {st.st_size}")
            except OSError as e:
                out.append(f"{os.path.relpath(p, top)} ({e.strerror})")
            if len(out) >= 12:
                return ", ".join(out) + ", ..."
    return ", ".join(out) if out else "empty"


def check_round(a, name, problems):
    d = os.path.join(a.mnt, "rounds", name)
    if not os.path.isdir(d):
        problems.append(f"{name}: journaled done, but its directory is missing")
        return
    p = subprocess.run(["tar", "--compare", "-f", os.path.join(a.src, "pkg.tar"), "-C", d],
                       capture_output=True, text=True)
    if p.returncode != 0:
        problems.append(f"{name}: tar --compare: {(p.stdout + p.stderr).strip()[:600]}")
    clone = os.path.join(d, "clone")
    try:
        run(["git", "-C", clone, "fsck", "--strict", "--no-progress"], env=GIT_ENV)
        count = int(run(["git", "-C", clone, "rev-list", "--count", "HEAD"], env=GIT_ENV))
        if count != COMMITS:
            problems.append(f"{name}: the clone has {count} commits, not {COMMITS}")
        st = run(["git", "-C", clone, "status", "--porcelain"], env=GIT_ENV)
        if st.strip():
            problems.append(f"{name}: the clone's work tree is not clean: {st[:300]}")
    except (RuntimeError, ValueError) as e:
        problems.append(f"{name}: git: {e}")


def check_db(a, j, problems):
    path = os.path.join(a.mnt, "db", "soak.db")
    if not j["dbready"]:
        return "no database yet"
    if not os.path.exists(path):
        problems.append("db: journaled dbready, but soak.db is missing")
        return "missing"
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        ic = con.execute("PRAGMA integrity_check").fetchall()
        if ic != [("ok",)]:
            problems.append(f"db: integrity_check: {ic[:5]}")
        cnt, lo, hi = con.execute("SELECT count(*), coalesce(min(n),0), coalesce(max(n),0) FROM t").fetchone()
        con.close()
    except sqlite3.Error as e:
        problems.append(f"db: {e!r}")
        return "unreadable"
    want = j["commit"]
    if cnt != hi or (cnt and lo != 1):
        problems.append(f"db: rows are not 1..M: {cnt} rows, {lo}..{hi}")
    if hi < want:
        problems.append(f"db: {hi} rows, but commit {want} returned (a committed transaction is lost)")
    begun = max(j["begin"], want)
    if hi > begun:
        problems.append(f"db: {hi} rows, but no transaction above row {begun} was begun")
    return f"{hi} rows (last returned commit {want}, last begun {begun})"


def check(a):
    j = read_journal(a.journal)
    jfd = os.open(a.journal, os.O_WRONLY | os.O_APPEND)
    problems = []
    base = os.path.join(a.mnt, "rounds")
    present = sorted(os.listdir(base)) if os.path.isdir(base) else []
    whole = 0
    files = 0
    for name in sorted(set(present) | set(j["rounds"])):
        state = j["rounds"].get(name)
        if state == "removed" and name not in present:
            continue
        if state == "removed" and a.after == "kill":
            problems.append(f"{name}: journaled removed, but it exists: {describe(os.path.join(base, name))}")
            continue
        if a.after == "kill" and state == "done":
            check_round(a, name, problems)
            whole += 1
            continue
        d = os.path.join(base, name)
        if name in present:
            files += read_all(d, problems)
            try:
                shutil.rmtree(d)
            except OSError as e:
                problems.append(f"{name}: rm -r of what the crash left failed: {e}")
                continue
        jwrite(jfd, f"removed {name}")
    db = check_db(a, j, problems)
    if problems:
        print(f"PROBLEMS ({len(problems)}):")
        for p in problems[:40]:
            print("  " + p)
        return 1
    print(f"ok after {a.after}: {whole} whole rounds checked, {files} files of unfinished "
          f"rounds read and removed; db {db}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["prepare", "work", "check"])
    ap.add_argument("--mnt")
    ap.add_argument("--journal")
    ap.add_argument("--src", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--after", choices=["kill", "power"])
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a)
        return 0
    if not a.mnt or not a.journal:
        ap.error("work and check need --mnt and --journal")
    if a.cmd == "work":
        work(a)
        return 1
    if not a.after:
        ap.error("check needs --after kill|power")
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
