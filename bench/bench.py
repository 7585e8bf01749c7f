#!/usr/bin/env python3
"""deskfs benchmark driver (python3 stdlib; matplotlib only for the chart).

    bench.py [--short] [--targets local,floor,floor-pt,deskfs,juicefs,rclone,s3fs] [--out DIR] [--workloads a,b]
    bench.py --child WORKLOAD TARGET RUN_ID      (internal: one workload, JSON lines on stdout)

Runs the same agent-like workloads on every target, one target after the other, each
workload in a child process with a hard wall limit (a hung mount is reported as `timeout`
and recycled); every timed phase stops after the phase cap and reports what it finished,
marked partial. S3 targets need BENCH_S3_* in the environment (scripts/bench.sh sets them).
Workloads check their own results where they can (content read back, entry counts, `tar
--compare`, `git status` clean, sqlite integrity, `cmp` of the big file): a record with
`check: false` is shown as "check failed" by the report. The FUSE requests of the checks are
left out of the workload's request counts.
Workload structure follows the project's shared fsbench harness (shared/bench/lib/bench.py).
"""
import argparse
import bisect
import json
import multiprocessing
import os
import platform
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import targets as T  # noqa: E402
import report  # noqa: E402

STATE = T.STATE
SRC = os.path.join(STATE, "src")
# Cold 4 KiB files whose time to first byte is measured after the fresh-cache remount.
TTFB_SAMPLES = 5

WORKLOADS = ["smallfiles", "untar", "git", "cargo", "npm", "lsdir", "sqlite", "seq", "fio", "durable", "scale"]
SHORT = os.environ.get("DESKFS_BENCH_SHORT") == "1"

# sizes: (full, short)
SIZES = {
    "SMALL_N": (5000, 300), "SMALL_DIRS": (50, 10),
    "TREE_FILES": (5000, 200), "GIT_COMMITS": (50, 10),
    "NPM_PKGS": (300, 25), "LSDIR_N": (10000, 1000),
    "SQLITE_TX": (2000, 200), "SEQ_MB": (1024, 64),
    "FIO_MB": (256, 32), "FIO_SECONDS": (20, 5),
    "PHASE_LIMIT": (60, 30), "DURABLE_N": (1000, 100),
    "SCALE_N": (1000000, 20000), "SCALE_LS_N": (100000, 5000), "SCALE_CREATE_LIMIT": (900, 40),
    "SCALE_WORKERS": (4, 4), "SCALE_STATS": (2000, 2000), "SCALE_OPS": (1000, 1000),
}


def size(k):
    v = os.environ.get(f"BENCH_{k}")
    return int(v) if v else SIZES[k][1 if SHORT else 0]


PHASE = size("PHASE_LIMIT")
LIMITS = {  # hard wall limit of one workload child (s), setup + cleanup included
    "smallfiles": 5 * PHASE + 60, "untar": 4 * PHASE + 60, "git": 5 * PHASE + 60,
    "cargo": 4 * PHASE + 60, "npm": 3 * PHASE + 60, "lsdir": 4 * PHASE + 60,
    "sqlite": 2 * PHASE + 60, "seq": 3 * PHASE + 600, "durable": 4 * PHASE + 240, "fio": 2 * size("FIO_SECONDS") + 4 * PHASE + 300,
    # creation cap + per point (1k, 100k, N): remount, stats, creates, unlinks + ls -l twice
    "scale": size("SCALE_CREATE_LIMIT") + 3 * (4 * PHASE + 240) + 2 * PHASE + 300,
}


# ---------------------------------------------------------------- output
class Emitter:
    def __init__(self, target, workload):
        self.target, self.workload = target, workload

    def __call__(self, metric, value, unit="", **extra):
        rec = {"target": self.target, "workload": self.workload, "metric": metric,
               "value": value, "unit": unit}
        rec.update(extra)
        sys.stdout.write(json.dumps(rec) + "\n")
        sys.stdout.flush()
        T.log(f"{self.target} {self.workload}.{metric} = {value} {unit}"
              + (f" {extra}" if extra else ""))


def run(cmd, timeout, cwd=None, shell=False, env=None):
    """Run a command; returns (seconds, returncode | 'timeout', stdout)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, errors="replace", env=env,
                         start_new_session=True, executable="/bin/bash" if shell else None)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        try:  # a process that left the group (or hangs in the filesystem) may hold the pipes
            p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            for f in (p.stdout, p.stderr):
                f.close()
            p.wait()
        return time.monotonic() - t0, "timeout", ""
    if p.returncode != 0:
        T.log(f"command failed rc={p.returncode}: {cmd}: {err.strip()[-500:]}")
    return time.monotonic() - t0, p.returncode, out


def rm_rf(path, timeout):
    if not os.path.lexists(path):
        return 0.0, 0
    return run(["rm", "-rf", path], timeout)[:2]


def r2(x):
    return None if x is None else round(x, 3 if x < 10 else 2)


# ---------------------------------------------------------------- inputs (built once in STATE/src)
def prepare_tree():
    """The untar workload's input: the first TREE_FILES regular files of /usr/include as a
    tarball in STATE/src (built once). Returns {"tree": {...}, "tree_tar": path}."""
    os.makedirs(SRC, exist_ok=True)
    meta = {}
    tree_src = os.environ.get("BENCH_TREE_SRC", "/usr/include")
    maxf = size("TREE_FILES")
    tag = f"{maxf}"
    tar_p = os.path.join(SRC, f"tree-{tag}.tar")
    meta_p = os.path.join(SRC, f"tree-{tag}.json")
    if not os.path.exists(meta_p):
        files = []
        for root, dirs, fs in os.walk(tree_src):
            dirs.sort()
            for f in sorted(fs):
                p = os.path.join(root, f)
                if os.path.isfile(p) and not os.path.islink(p):
                    files.append(os.path.relpath(p, tree_src))
        files = files[:maxf]
        lst = os.path.join(SRC, f"tree-{tag}.list")
        with open(lst, "w") as f:
            f.write("\n".join(files) + "\n")
        subprocess.run(["tar", "cf", tar_p, "-C", tree_src, "--files-from", lst], check=True)
        nbytes = sum(os.path.getsize(os.path.join(tree_src, f)) for f in files)
        m = {"src": tree_src, "files": len(files), "bytes": nbytes,
             "dirs": len({os.path.dirname(f) for f in files})}
        json.dump(m, open(meta_p, "w"))
    meta["tree"] = json.load(open(meta_p))
    meta["tree_tar"] = tar_p
    return meta


def prepare_sources():
    meta = prepare_tree()
    tag = f"{size('TREE_FILES')}"
    tar_p = meta["tree_tar"]
    # 2. a git repository of that tree with history
    commits = size("GIT_COMMITS")
    repo = os.path.join(SRC, f"repo-{tag}-{commits}")
    if not os.path.isdir(os.path.join(repo, ".git")):
        tmp = repo + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        subprocess.run(["tar", "xf", tar_p, "-C", tmp], check=True)
        g = ["git", "-C", tmp, "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
        subprocess.run(g + ["init", "-q", "-b", "main"], check=True)
        subprocess.run(g + ["add", "-A"], check=True)
        subprocess.run(g + ["commit", "-q", "-m", "import tree"], check=True)
        tracked = subprocess.run(g + ["ls-files"], capture_output=True, text=True).stdout.split()
        for i in range(commits):
            with open(os.path.join(tmp, tracked[(i * 37) % len(tracked)]), "a") as fh:
                fh.write(f"\n/* bench change {i} */\n")
            subprocess.run(g + ["commit", "-q", "-am", f"change {i}"], check=True)
        subprocess.run(g + ["gc", "-q"], check=True)
        os.rename(tmp, repo)
    meta["repo"] = repo
    # 3. a real small crate without dependencies, from the local cargo registry (offline)
    crate = os.path.join(SRC, "crate")
    if not os.path.exists(os.path.join(crate, "Cargo.toml")):
        make_crate(crate)
    meta["crate"] = crate
    meta["crate_name"] = open(os.path.join(crate, ".bench-name")).read().strip()
    # 4. incompressible data for sequential / random I/O
    mb = size("SEQ_MB")
    rnd = os.path.join(SRC, f"rand-{mb}M")
    if not os.path.exists(rnd) or os.path.getsize(rnd) != mb << 20:
        subprocess.run(["dd", "if=/dev/urandom", f"of={rnd}.tmp", "bs=1M", f"count={mb}", "status=none"],
                       check=True)
        os.rename(rnd + ".tmp", rnd)
    meta["rand"] = rnd
    return meta


def make_crate(dst):
    """Copy regex-syntax (no required dependencies) from ~/.cargo/registry/src with its
    manifest stripped of optional deps, benches and tests, so `cargo build --offline` works.
    Without it, generate a small dependency-free crate."""
    home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    want = os.environ.get("BENCH_CRATE", "regex-syntax")
    cands = []
    reg = os.path.join(home, "registry", "src")
    if os.path.isdir(reg):
        for idx in os.listdir(reg):
            for d in os.listdir(os.path.join(reg, idx)):
                mm = re.fullmatch(re.escape(want) + r"-(\d+)\.(\d+)\.(\d+)", d)
                if mm:
                    cands.append((tuple(map(int, mm.groups())), os.path.join(reg, idx, d)))
    tmp = dst + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if cands:
        src = max(cands)[1]
        shutil.copytree(src, tmp)
        out, skip = [], False
        for line in open(os.path.join(tmp, "Cargo.toml")):
            if line.startswith("["):
                skip = bool(re.match(r"\[\[?(bench|test|example|bin)\]?\]|\[(dev-|build-)?dependencies"
                                     r"|\[target\.", line))
            if skip or "dep:" in line:
                continue
            out.append(line)
        open(os.path.join(tmp, "Cargo.toml"), "w").write("".join(out))
        name = os.path.basename(src)
    else:
        os.makedirs(os.path.join(tmp, "src"))
        open(os.path.join(tmp, "Cargo.toml"), "w").write(
            '[package]\nname = "benchcrate"\nversion = "0.1.0"\nedition = "2021"\n')
        mods = []
        for i in range(40):
            mods.append(f"pub mod m{i};")
            body = "\n".join(
                f"pub fn f{j}(x: u64) -> u64 {{ let mut v = x; for k in 0..{j + 3} {{ v = v.wrapping_mul(31).wrapping_add(k); }} v }}"
                for j in range(60))
            open(os.path.join(tmp, "src", f"m{i}.rs"), "w").write(body + "\n")
        open(os.path.join(tmp, "src", "lib.rs"), "w").write("\n".join(mods) + "\n")
        name = "generated benchcrate (40 modules)"
    shutil.rmtree(os.path.join(tmp, "target"), ignore_errors=True)
    open(os.path.join(tmp, ".bench-name"), "w").write(name + "\n")
    os.rename(tmp, dst)


# ---------------------------------------------------------------- workloads (in a child)
class Ctx:
    def __init__(self, target, emit, meta):
        self.t, self.emit, self.meta = target, emit, meta
        self.mnt = target.mnt()
        self.files = None   # files the workload made (for FUSE requests per file)
        self.excluded = {}  # FUSE requests of the workload's checks, left out of its counts

    def uncounted(self, fn):
        """fn() — a check of the workload's result, untimed — with the FUSE requests it
        causes left out of the workload's request counts."""
        r0 = self.t.requests()
        try:
            return fn()
        finally:
            r1 = self.t.requests()
            if r0 is not None and r1 is not None:
                for op, v in r1.items():
                    e = self.excluded.setdefault(op, [0, 0, 0])
                    for i in range(3):
                        e[i] += (v[i] or 0) - (r0.get(op, [0, 0, 0])[i] or 0)

    def dir(self, name):
        p = os.path.join(self.mnt, f"w-{name}")
        if os.path.lexists(p):
            rm_rf(p, 300)
        os.makedirs(p, exist_ok=True)
        return p


def timed_loop(items, fn):
    """Apply fn to items until PHASE seconds pass; (done, seconds, errors)."""
    t0, k, bad = time.monotonic(), 0, 0
    for it in items:
        if time.monotonic() - t0 > PHASE:
            break
        try:
            if fn(it) is False:
                bad += 1
        except OSError as e:
            bad += 1
            if bad <= 3:
                T.log(f"error: {e}")
        k += 1
    return k, time.monotonic() - t0, bad


def w_smallfiles(c):
    n, nd = size("SMALL_N"), size("SMALL_DIRS")
    base = c.dir("small")
    data = os.urandom(4096)
    for d in range(nd):
        os.mkdir(os.path.join(base, f"d{d:02d}"))
    paths = [os.path.join(base, f"d{i % nd:02d}", f"f{i:05d}") for i in range(n)]

    def create(p):
        with open(p, "wb") as f:
            f.write(data)

    def read(p):
        with open(p, "rb") as f:
            return f.read() == data

    r0 = c.t.requests()
    k, dt, bad = timed_loop(paths, create)
    c.emit("create", round(k / dt, 1), "ops/s", n=k, seconds=r2(dt), partial=k < n, errors=bad,
           req=phase_requests(r0, c.t.requests(), k))
    c.files = k
    paths = paths[:k]
    if os.environ.get("BENCH_SMALL_SETTLE") == "1":
        # (experiment) the later phases with no upload backlog: wait for the bucket first
        c.uncounted(c.t.sync_all)
    T.drop_caches()
    for name, fn in (("stat", lambda p: os.stat(p).st_size == 4096), ("read", read),
                     ("delete", os.unlink)):
        r0 = c.t.requests()
        k, dt, bad = timed_loop(paths, fn)
        c.emit(name, round(k / dt, 1) if dt else None, "ops/s", n=k, seconds=r2(dt),
               partial=k < len(paths), errors=bad, req=phase_requests(r0, c.t.requests(), k))
    rm_rf(base, PHASE)


def phase_requests(r0, r1, n):
    """The FUSE requests of one phase of n operations, per kind: [per operation, daemon µs
    per request] (None when the target has no counters)."""
    if r0 is None or r1 is None or not n:
        return None
    out = {}
    for op, v in r1.items():
        cnt = (v[0] or 0) - (r0.get(op, [0, 0, 0])[0] or 0)
        ns = (v[1] or 0) - (r0.get(op, [0, 0, 0])[1] or 0)
        if cnt > 0:
            out[op] = [round(cnt / n, 3), round(ns / cnt / 1000, 1)]
    return out


def tree_entries(tar_p):
    """Entries `tar x` of the tree's tarball makes: its files and every directory above them."""
    files = open(tar_p[:-len(".tar")] + ".list").read().splitlines()
    files = [f for f in files if f]
    dirs = set()
    for f in files:
        d = os.path.dirname(f)
        while d and d not in dirs:
            dirs.add(d)
            d = os.path.dirname(d)
    return len(files) + len(dirs)


def w_untar(c):
    m = c.meta["tree"]
    base = c.dir("untar")
    dt, rc, _ = run(["tar", "xf", c.meta["tree_tar"], "-C", base], 2 * PHASE)
    # check (untimed): tar --compare reads every file back against the archive (content,
    # size, mode, mtime)
    ok = rc == 0 and c.uncounted(lambda: run(["tar", "--compare", "-f", c.meta["tree_tar"], "-C", base],
                                              2 * PHASE)[1] == 0)
    c.emit("untar", r2(dt), "s", files=m["files"], bytes=m["bytes"], rc=rc, check=ok)
    c.files = m["files"]
    if rc != 0:
        rm_rf(base, PHASE)
        return
    T.drop_caches()
    dt, rc, out = run(f"find {base} | wc -l", PHASE, shell=True)
    n = int(out.strip() or 0) - 1 if rc == 0 else None
    c.emit("find", r2(dt), "s", entries=n, rc=rc, check=n == tree_entries(c.meta["tree_tar"]))
    dt, rc = rm_rf(base, PHASE)
    c.emit("rm_rf", r2(dt), "s", rc=rc, check=not os.path.lexists(base))


def w_git(c):
    base = c.dir("git")
    dst = os.path.join(base, "repo")
    g = ["git", "-C", dst, "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    dt, rc, _ = run(["git", "clone", "-q", f"file://{c.meta['repo']}", dst], 2 * PHASE)
    c.emit("clone", r2(dt), "s", files=c.meta["tree"]["files"], rc=rc)
    c.files = c.meta["tree"]["files"]
    if rc == 0:
        T.drop_caches()
        dt, rc, out = run(g + ["status", "--porcelain"], PHASE)
        clean = rc == 0 and out.strip() == ""
        c.emit("status", r2(dt), "s", rc=rc, clean=clean, check=clean)
        dt, rc, out = run(g + ["log", "--stat", "--oneline"], PHASE)
        c.emit("log", r2(dt), "s", rc=rc, lines=len(out.splitlines()))
        tracked = subprocess.run(g + ["ls-files"], capture_output=True, text=True).stdout.split()
        t0 = time.monotonic()
        for f in tracked[:10]:
            with open(os.path.join(dst, f), "a") as fh:
                fh.write("/* edited by bench */\n")
        _, rc1, _ = run(g + ["add", "-A"], PHASE)
        _, rc2, _ = run(g + ["commit", "-q", "-m", "bench edit"], PHASE)
        dt = time.monotonic() - t0
        # check (untimed): the commit holds the 10 edits and the tree is clean again
        def check():
            _, rc3, out = run(g + ["diff", "--name-only", "HEAD~1", "HEAD"], PHASE)
            _, rc4, st = run(g + ["status", "--porcelain"], PHASE)
            return rc3 == 0 and len(out.split()) == 10 and rc4 == 0 and st.strip() == ""
        ok = c.uncounted(check)
        c.emit("commit", r2(dt), "s", rc=rc2 if rc1 == 0 else rc1, files_changed=10, check=ok)
    rm_rf(base, PHASE)


def w_cargo(c):
    base = c.dir("cargo")
    dst = os.path.join(base, "crate")
    shutil.copytree(c.meta["crate"], dst)
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(base, "target"), CARGO_TERM_COLOR="never",
               CARGO_INCREMENTAL="1")
    env.pop("RUSTC_WRAPPER", None)
    T.drop_caches()
    dt, rc, _ = run(["cargo", "build", "--offline", "-q"], 3 * PHASE, cwd=dst, env=env)
    c.emit("build", r2(dt), "s", rc=rc, crate=c.meta["crate_name"])
    if rc == 0:
        lib = os.path.join(dst, "src", "lib.rs")
        with open(lib, "a") as f:
            f.write("\n// touched by bench\n")
        dt, rc, _ = run(["cargo", "build", "--offline", "-q"], PHASE, cwd=dst, env=env)
        c.emit("rebuild", r2(dt), "s", rc=rc, note="after appending to src/lib.rs (incremental)")
    rm_rf(base, PHASE)


def npm_packages(n):
    """Deterministic synthetic package set: (name, {relpath: bytes}, has_bin)."""
    rng = random.Random(42)
    pkgs = []
    for i in range(n):
        name = f"@scope{i % 7}/pkg{i:04d}" if i % 5 == 0 else f"pkg{i:04d}"
        files = {"package.json": json.dumps({"name": name, "version": f"1.{i}.0", "main": "index.js",
                                             "bin": {f"cli{i}": "bin/cli.js"} if i % 4 == 0 else {}},
                                            indent=2).encode(),
                 "index.js": os.urandom(rng.randint(500, 3000)).hex().encode()[:2000],
                 "README.md": b"# " + name.encode() + b"\n" + b"docs " * rng.randint(100, 900),
                 "LICENSE": b"MIT License\n" * 80}
        for j in range(rng.randint(4, 14)):
            files[f"lib/{'sub/' if j % 3 == 0 else ''}m{j}.js"] = b"module.exports = %d;\n" % j * rng.randint(20, 200)
        if i % 4 == 0:
            files["bin/cli.js"] = b"#!/usr/bin/env node\nrequire('../index.js');\n"
        if i % 6 == 0:  # a nested dependency
            files[f"node_modules/dep{i}/package.json"] = b'{"name": "dep%d"}\n' % i
            files[f"node_modules/dep{i}/index.js"] = b"module.exports = {};\n" * 30
        pkgs.append((name, files, i % 4 == 0))
    return pkgs


def w_npm(c):
    n = size("NPM_PKGS")
    pkgs = npm_packages(n)
    nfiles = sum(len(f) for _, f, _ in pkgs)
    base = c.dir("npm")
    nm = os.path.join(base, "node_modules")
    staging = os.path.join(nm, ".staging")
    binp = os.path.join(nm, ".bin")

    def install(pkg):
        name, files, has_bin = pkg
        tmp = os.path.join(staging, name.replace("/", "+") + f"-{os.getpid()}")
        for rel, data in files.items():
            p = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
            if rel.startswith("bin/"):
                os.chmod(p, 0o755)
        final = os.path.join(nm, name)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.rename(tmp, final)
        if has_bin:
            os.symlink(os.path.join("..", name, "bin", "cli.js"), os.path.join(binp, name.split("/")[-1]))

    t0 = time.monotonic()
    os.makedirs(staging)
    os.makedirs(binp)
    k, _, bad = timed_loop(pkgs, install)
    lock = os.path.join(base, "package-lock.json")
    with open(lock + ".tmp", "w") as f:
        json.dump({"packages": {p[0]: {"version": "1"} for p in pkgs[:k]}}, f)
    os.rename(lock + ".tmp", lock)
    os.rmdir(staging)
    dt = time.monotonic() - t0
    c.emit("install", r2(dt), "s", n=k, packages=n, files=nfiles, partial=k < n, errors=bad)
    c.files = sum(len(f) for _, f, _ in pkgs[:k])
    T.drop_caches()
    # resolve every bin link and read every package.json, as `npm ls` / node's resolver would
    t0 = time.monotonic()
    bad = 0
    for name, _, has_bin in pkgs[:k]:
        try:
            json.load(open(os.path.join(nm, name, "package.json")))
            if has_bin:
                os.stat(os.path.join(binp, name.split("/")[-1]))
        except (OSError, ValueError):
            bad += 1
    c.emit("resolve", r2(time.monotonic() - t0), "s", errors=bad)
    dt, rc = rm_rf(nm, PHASE)
    c.emit("rm_rf", r2(dt), "s", rc=rc)
    rm_rf(base, PHASE)


def w_lsdir(c):
    n = size("LSDIR_N")
    base = c.dir("lsdir")
    names = [os.path.join(base, f"entry-{i:05d}.txt") for i in range(n)]

    def mk(p):
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))

    k, dt, bad = timed_loop(names, mk)
    c.emit("create_empty", round(k / dt, 1), "ops/s", n=k, partial=k < n, errors=bad)
    c.files = k
    T.drop_caches()
    for label in ("ls_l_cold", "ls_l_warm"):
        dt, rc, out = run(["ls", "-l", base], PHASE)
        n = max(len(out.splitlines()) - 1, 0)
        c.emit(label, r2(dt), "s", rc=rc, entries=n, check=n == k)
    rm_rf(base, 2 * PHASE)


def w_sqlite(c):
    n = size("SQLITE_TX")
    base = c.dir("sqlite")
    con = sqlite3.connect(os.path.join(base, "bench.db"), isolation_level=None, timeout=30)
    jm = con.execute("pragma journal_mode").fetchone()[0]
    con.execute("create table t(id integer primary key, v blob)")
    k, dt, bad = timed_loop(range(n), lambda i: con.execute("insert into t(v) values (?)", (os.urandom(100),)))
    rows = con.execute("select count(*) from t").fetchone()[0]
    ok = con.execute("pragma integrity_check").fetchone()[0]
    con.close()
    c.emit("insert_tx", round(k / dt, 1), "tx/s", n=k, seconds=r2(dt), partial=k < n, journal_mode=jm,
           rows=rows, integrity=ok, check=ok == "ok" and rows == k - bad)
    rm_rf(base, 120)


def w_durable(c):
    """The cost of --durability bucket: small files created and closed, and one 4 KiB
    rewrite + fsync after another, under each durability (deskfs is remounted with it; a
    local directory has no choice, its figures stand for both rows)."""
    n = size("DURABLE_N")
    data = os.urandom(4096)
    modes = ["local", "bucket"] if isinstance(c.t, T.Deskfs) else [None]
    for mode in modes:
        if mode:
            c.t.remount(extra=["--durability", mode])
        base = c.dir("durable")
        paths = [os.path.join(base, f"f{i:05d}") for i in range(n)]

        def create(p):
            with open(p, "wb") as f:
                f.write(data)

        k1, dt1, bad1 = timed_loop(paths, create)
        c.files = (c.files or 0) + k1
        fd = os.open(os.path.join(base, "fsynced"), os.O_WRONLY | os.O_CREAT, 0o644)

        def rewrite(_):
            os.pwrite(fd, data, 0)
            os.fsync(fd)

        k2, dt2, bad2 = timed_loop(range(n), rewrite)
        os.close(fd)
        for m in ([mode] if mode else ["local", "bucket"]):
            c.emit(f"create_close_{m}", round(k1 / dt1, 1), "ops/s", n=k1, seconds=r2(dt1),
                   partial=k1 < n, errors=bad1)
            c.emit(f"fsync_{m}", round(k2 / dt2, 1), "ops/s", n=k2, seconds=r2(dt2),
                   partial=k2 < n, errors=bad2)
        rm_rf(base, PHASE)
    if modes[0]:
        c.t.remount(extra=[])


def ttfb(path):
    t0 = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    b = os.read(fd, 1)
    dt = time.monotonic() - t0
    os.close(fd)
    return dt, len(b) == 1


def w_seq(c):
    mb = size("SEQ_MB")
    src = c.meta["rand"]
    base = c.dir("seq")
    dst = os.path.join(base, "big")
    # Several cold small files: the first read after a remount also pays for the daemon's
    # first request (its connection to the server, its metadata pages), the others show a
    # cold file on a running daemon; the figure is their median, every sample recorded.
    smalls = [os.path.join(base, f"small-4k-{i}") for i in range(TTFB_SAMPLES)]
    for p in smalls:
        with open(p, "wb") as f:
            f.write(os.urandom(4096))
    subprocess.run(["cat", src], stdout=subprocess.DEVNULL, timeout=300)  # source into page cache
    dt, rc, _ = run(["dd", f"if={src}", f"of={dst}", "bs=4M", "conv=fsync", "status=none"], 2 * PHASE + 240)
    c.emit("write", round(mb / dt, 1) if rc == 0 else None, "MiB/s", seconds=r2(dt), rc=rc, mib=mb)
    if rc != 0:
        return
    if c.t.s3:
        st = c.t.settle("w-seq/big", mb << 20, timeout=600)
        c.emit("upload_settle", r2(st), "s", note="after dd returned, until the object is complete in the bucket")
        for i in range(TTFB_SAMPLES):
            c.t.settle(f"w-seq/small-4k-{i}", 4096, timeout=60)
    # Wait for every upload before the remount deletes the cache (which holds what is
    # not uploaded yet); settle above only sees sizes.
    c.t.sync_all(600)
    t0 = time.monotonic()
    c.t.remount(fresh_cache=True)
    if c.t.daemon and c.t.persistent:
        c.emit("remount", r2(time.monotonic() - t0), "s", note="unmount + mount with an empty cache")
    samples = [ttfb(p) for p in smalls]
    ms = sorted(round(dt * 1000, 2) for dt, _ in samples)
    c.emit("ttfb_small", ms[len(ms) // 2], "ms", ok=all(ok for _, ok in samples),
           samples=[round(dt * 1000, 2) for dt, _ in samples],
           note=f"open+read 1 byte of a cold 4 KiB file, median of {len(ms)} files read one after another after the remount (the first pays for the daemon's first request)")
    dt, ok = ttfb(dst)
    c.emit("ttfb_big", round(dt * 1000, 2), "ms", ok=ok, note=f"open+read 1 byte of the {mb} MiB file, cold")
    for label in ("read_cold", "read_warm", "read_warm_later"):
        if label == "read_warm_later":
            # The same read 10 s on: what an agent re-reading the file later gets (deskfs:
            # the local copy made from the cold read is flushed and in place by then).
            time.sleep(10)
        dt, rc, _ = run(["dd", f"if={dst}", "of=/dev/null", "bs=4M", "status=none"], 2 * PHASE + 240)
        extra = {}
        if label == "read_warm_later":  # check (untimed): the big file is the source, byte for byte
            extra["check"] = c.uncounted(lambda: run(["cmp", "-s", src, dst], 2 * PHASE + 240)[1] == 0)
        c.emit(label, round(mb / dt, 1) if rc == 0 else None, "MiB/s", seconds=r2(dt), rc=rc, **extra)
    c.emit("size_ok", os.path.getsize(dst) == mb << 20, "")
    rm_rf(base, 120)


def _fio(c, f, rw, extra):
    mb, rt = size("FIO_MB"), size("FIO_SECONDS")
    cmd = ["fio", "--name=" + rw, f"--filename={f}", f"--size={mb}M", "--bs=4k", f"--rw={rw}",
           "--ioengine=psync", f"--runtime={rt}", "--time_based", "--output-format=json",
           "--invalidate=1", "--randrepeat=1", "--thread"] + extra  # --thread: no setsid'ed job process
    dt, rc, out = run(cmd, rt + 2 * PHASE + 60)
    if rc != 0:
        c.emit(rw, None, "IOPS", rc=rc, seconds=r2(dt))
        return False
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if rw == "randread" else j["write"]
    p99 = side.get("clat_ns", {}).get("percentile", {}).get("99.000000")
    c.emit(rw, round(side["iops"], 1), "IOPS", mib_s=round(side["bw"] / 1024, 2),
           p99_us=round(p99 / 1000, 1) if p99 else None, file_mib=mb, runtime_s=rt, wall_s=r2(dt))
    return True


def w_fio(c):
    if not shutil.which("fio"):
        c.emit("randwrite", None, "IOPS", note="fio not installed")
        return
    base = c.dir("fio")
    f = os.path.join(base, "file")
    mb = size("FIO_MB")
    run(["dd", f"if={c.meta['rand']}", f"of={f}", "bs=1M", f"count={mb}", "conv=fsync", "status=none"], 300)
    if os.environ.get("BENCH_FIO_SETTLE") == "1":
        # (experiment) random writes with no upload of the file just laid out running beside
        c.uncounted(c.t.sync_all)
    _fio(c, f, "randwrite", ["--end_fsync=1"])
    if c.t.s3:
        c.t.settle("w-fio/file", mb << 20, timeout=120)
    # The rewritten blocks change no size: wait for the upload itself before the remount
    # deletes the cache (it would take the only copy of the new content with it).
    c.t.sync_all(600)
    c.t.remount(fresh_cache=True)
    _fio(c, f, "randread", [])
    rm_rf(base, 120)


# ---------------------------------------------------------------- scale
SCALE_PER_DIR = 1000
SCALE_CHUNK = 250   # files per job of a creating worker


def _scale_create(job):
    """In a worker process: create empty files d/f<j> for j in [j0, j1) (open O_CREAT|O_EXCL +
    close) until the deadline; (dir, j0, attempted, errors, first error)."""
    d, j0, j1, deadline = job
    done = bad = 0
    err = None
    for j in range(j0, j1):
        if time.monotonic() > deadline:
            break
        try:
            os.close(os.open(f"{d}/f{j:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except OSError as e:
            bad += 1
            err = err or str(e)
        done += 1
    return d, j0, done, bad, err


class ScaleTree:
    """The scale workload's tree under `root`: directories of 1,000 empty files (d000000 is the
    1k point), and in the last stage one directory `big` of SCALE_LS_N files (for ls -l)."""

    def __init__(self, root):
        self.root = root
        self.ndirs = 0
        self.ranges = []   # (dir, j0, attempted) in creation order
        self.cum = []      # running totals of `ranges`
        self.total = 0

    def plan(self, count, big=0):
        segs = []
        if big:
            segs.append((os.path.join(self.root, "big"), big))
            count -= big
        while count > 0:
            k = min(SCALE_PER_DIR, count)
            segs.append((os.path.join(self.root, f"d{self.ndirs:06d}"), k))
            self.ndirs += 1
            count -= k
        return segs

    def grow(self, pool, segs, deadline):
        """Create `segs` with the pool's workers; (attempted, errors, seconds, capped)."""
        t0 = time.monotonic()
        for d, _ in segs:
            os.makedirs(d, exist_ok=True)
        jobs = [(d, j0, min(j0 + SCALE_CHUNK, k), deadline) for d, k in segs for j0 in range(0, k, SCALE_CHUNK)]
        want = sum(k for _, k in segs)
        got = bad = 0
        for d, j0, done, b, err in pool.imap_unordered(_scale_create, jobs):
            if done:
                self.ranges.append((d, j0, done))
                self.total += done
                self.cum.append(self.total)
            got += done
            bad += b
            if err and bad <= 3:
                T.log(f"scale: create error: {err}")
        return got, bad, time.monotonic() - t0, got < want

    def sample(self, rng, k):
        """k distinct files of the tree, at random."""
        out = []
        for x in rng.sample(range(self.total), min(k, self.total)):
            i = bisect.bisect_right(self.cum, x)
            d, j0, done = self.ranges[i]
            out.append(f"{d}/f{j0 + x - (self.cum[i] - done):06d}")
        return out


def latencies(items, fn):
    """fn(item) timed one by one until PHASE seconds pass; (µs list, errors)."""
    t0, us, bad = time.monotonic(), [], 0
    for it in items:
        if time.monotonic() - t0 > PHASE:
            break
        a = time.perf_counter_ns()
        try:
            fn(it)
        except OSError as e:
            bad += 1
            if bad <= 3:
                T.log(f"error: {e}")
        us.append((time.perf_counter_ns() - a) / 1000)
    return us, bad


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def w_scale(c):
    """A tree of SCALE_N empty files made through the mount by SCALE_WORKERS processes; at 1k,
    100k and N files: unmount + mount, stat latency (cold, warm), create and unlink latency;
    at the end ls -l of one SCALE_LS_N-entry directory, cold and warm. Runs last: the tree is
    left for the target's teardown."""
    n, ls_n, workers = size("SCALE_N"), size("SCALE_LS_N"), size("SCALE_WORKERS")
    ls_n = min(ls_n, max(n - SCALE_PER_DIR, 0))
    root = c.dir("scale")
    tree = ScaleTree(root)
    marks = [m for m in (1000, 100000) if m < n] + [n]
    tags = {1000: "1k", 100000: "100k"}
    budget = size("SCALE_CREATE_LIMIT")   # seconds of creating (the measurements do not count)
    rng = random.Random(7)
    peak = [c.t.hwm_mib()]
    pool = multiprocessing.get_context("fork").Pool(workers)
    c_got = c_bad = 0
    c_dt = 0.0
    prev = 0
    try:
        for mark in marks:
            tag = tags.get(mark, "n")
            last = mark == n
            segs = tree.plan(mark - prev, big=min(ls_n, mark - prev) if last else 0)
            got, bad, dt, capped = tree.grow(pool, segs, time.monotonic() + budget - c_dt)
            prev = mark
            c_got, c_bad, c_dt = c_got + got, c_bad + bad, c_dt + dt
            if not got:
                break
            c.emit(f"create_{tag}", round(got / dt, 1) if dt else None, "ops/s", n=got, seconds=r2(dt),
                   files=tree.total, partial=capped, errors=bad, workers=workers)
            scale_point(c, tree, tag, mark, rng, peak)
            if capped:
                T.log(f"scale: creation cap of {size('SCALE_CREATE_LIMIT')} s reached at {tree.total} files")
                break
    finally:
        pool.close()
        pool.join()
    c.files = tree.total
    c.emit("create", round(c_got / c_dt, 1) if c_dt else None, "ops/s", n=c_got, seconds=r2(c_dt),
           partial=c_got < n, errors=c_bad, workers=workers,
           note=f"{workers} processes, open(O_CREAT|O_EXCL)+close of empty files, dirs of {SCALE_PER_DIR}")
    big = os.path.join(root, "big")
    in_big = sum(done for d, _, done in tree.ranges if d == big)
    if in_big:
        T.drop_caches()
        for label in ("ls_l_cold", "ls_l_warm"):
            dt, rc, out = run(["ls", "-l", big], 2 * PHASE)
            c.emit(label, r2(dt), "s", rc=rc, entries=max(len(out.splitlines()) - 1, 0),
                   **({"short_of": size("SCALE_LS_N"), "files": in_big} if in_big < size("SCALE_LS_N") else {}))
    peak.append(c.t.hwm_mib())
    peak = [x for x in peak if x is not None]
    if peak:
        c.emit("peak_rss", max(peak), "MiB", files=tree.total,
               note="max VmHWM of the mount daemons during the scale workload (read before each unmount)")


def scale_point(c, tree, tag, mark, rng, peak):
    files = tree.total
    at = {"short_of": mark} if files < mark else {}   # the creation cap stopped the tree short
    if c.t.daemon and c.t.persistent:
        hwm = c.t.hwm_mib()
        peak.append(hwm)
        pend = None
        if isinstance(c.t, T.Deskfs):
            live = c.t.live_status() or {}
            pend = live.get("pending_uploads")
        t0 = time.monotonic()
        c.t.umount(nowait=True)
        du = time.monotonic() - t0
        T.drop_caches()
        t0 = time.monotonic()
        c.t.mount(poll=0.005)
        while True:
            try:
                os.stat(c.mnt)
                break
            except OSError:
                if time.monotonic() - t0 > 120:
                    raise
                time.sleep(0.005)
        dm = time.monotonic() - t0
        c.emit(f"umount_{tag}", r2(du), "s", files=files, **at, pending_uploads=pend,
               note="unmount (deskfs: --no-wait) until the daemon has exited")
        c.emit(f"mount_{tag}", r2(dm), "s", files=files, **at, hwm_mib_before=hwm,
               note="mount command start to the mountpoint answering stat")
    T.drop_caches()
    sample = tree.sample(rng, size("SCALE_STATS"))
    for label in ("cold", "warm"):
        us, bad = latencies(sample, os.stat)
        c.emit(f"stat_{label}_p50_{tag}", r2(pct(us, 50)), "µs", n=len(us), files=files, **at, errors=bad,
               partial=len(us) < len(sample))
        c.emit(f"stat_{label}_p99_{tag}", r2(pct(us, 99)), "µs", n=len(us), files=files, **at)
    lat = os.path.join(tree.root, f"lat-{tag}")
    os.mkdir(lat)
    paths = [os.path.join(lat, f"x{i:05d}") for i in range(size("SCALE_OPS"))]
    us, bad = latencies(paths, lambda p: os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)))
    c.emit(f"create_us_{tag}", r2(sum(us) / len(us)) if us else None, "µs", n=len(us), files=files, **at, errors=bad,
           p50=r2(pct(us, 50)), p99=r2(pct(us, 99)), partial=len(us) < len(paths))
    us, bad = latencies(paths[:len(us)], os.unlink)
    c.emit(f"unlink_us_{tag}", r2(sum(us) / len(us)) if us else None, "µs", n=len(us), files=files, **at, errors=bad,
           p50=r2(pct(us, 50)), p99=r2(pct(us, 99)))
    rm_rf(lat, PHASE)


def child_main(workload, tname, run_id):
    os.environ.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
    meta = json.load(open(os.path.join(T.RUN, "inputs.json")))
    t = T.make(tname, run_id)
    emit = Emitter(tname, workload)
    t0 = time.monotonic()
    req0 = t.requests()
    ctx = Ctx(t, emit, meta)
    globals()["w_" + workload](ctx)
    wall = time.monotonic() - t0
    req1 = t.requests()
    if req0 is not None and req1 is not None:
        delta = {op: [v[i] - req0.get(op, [0, 0, 0])[i] - ctx.excluded.get(op, [0, 0, 0])[i] for i in range(3)]
                 for op, v in req1.items()}
        emit("_requests", {op: v for op, v in delta.items() if v[0] > 0}, "", files=ctx.files,
             note="FUSE requests served during the workload: [count, daemon ns, database round trips] per kind")
    emit("wall", r2(wall), "s")


# ---------------------------------------------------------------- orchestration
def machine_info():
    mem = None
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = round(int(line.split()[1]) / 1024 / 1024, 1)
    cpu = ""
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    disk = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", STATE],
                          capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "mem_gib": mem, "cpu": cpu, "kernel": platform.release(),
            "state_disk": disk, "python": platform.python_version(),
            "drop_caches": os.access("/proc/sys/vm/drop_caches", os.W_OK)}


def tool_versions():
    out = {}
    for name, cmd in (("git", ["git", "--version"]), ("cargo", ["cargo", "--version"]),
                      ("fio", ["fio", "--version"]), ("sqlite", ["python3", "-c", "import sqlite3; print(sqlite3.sqlite_version)"]),
                      ("s3_server", None)):
        if cmd is None:
            out[name] = os.environ.get("BENCH_S3_SERVER_VERSION", "")
            continue
        try:
            out[name] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            out[name] = ""
    return out


def run_child(workload, t, run_id, records):
    limit = LIMITS[workload]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, t.name, run_id]
    T.log(f"--- {t.name}: {workload} (limit {limit}s)")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    got = []
    try:
        out, _ = p.communicate(timeout=limit)
        status = "ok" if p.returncode == 0 else f"error rc={p.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.stdout.close()
            p.wait()
            out = ""
        status = "timeout"
    for line in (out or "").splitlines():
        try:
            got.append(json.loads(line))
        except ValueError:
            pass
    records.extend(got)
    records.append({"target": t.name, "workload": workload, "metric": "_status", "value": status,
                    "unit": "", "limit_s": limit})
    if status != "ok":
        T.log(f"{t.name} {workload}: {status}; recycling the mount")
        try:
            t.umount(wait=60)
            t.mount()
        except Exception as e:  # noqa: BLE001
            T.log(f"{t.name}: remount after {status} failed: {e}")
            return False
    return True


def orchestrate(args):
    os.makedirs(T.RUN, exist_ok=True)
    names = [x for x in args.targets.split(",") if x]
    wls = [w for w in (args.workloads.split(",") if args.workloads else WORKLOADS)]
    for w in wls:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r} ({','.join(WORKLOADS)})")
    # scale runs last: its tree is left for the teardown (purge of the prefix / directory)
    wls = [w for w in wls if w != "scale"] + (["scale"] if "scale" in wls else [])
    for n in names:
        if T.CLASSES.get(n, T.Target).s3 and not T.have_s3():
            raise SystemExit("S3 targets need BENCH_S3_* (run through scripts/bench.sh)")
    t_start = time.time()
    run_id = time.strftime("%Y%m%d-%H%M%S")
    T.log(f"preparing inputs in {SRC}")
    meta = prepare_sources()
    json.dump(meta, open(os.path.join(T.RUN, "inputs.json"), "w"))
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "run_id": run_id,
        "mode": "short" if SHORT else "full", "machine": machine_info(), "tools": tool_versions(),
        "sizes": {k: size(k) for k in SIZES}, "inputs": {"tree": meta["tree"], "crate": meta["crate_name"]},
        "s3": {"endpoint": os.environ.get("BENCH_S3_ENDPOINT"), "bucket": os.environ.get("BENCH_S3_BUCKET")},
        "targets": {}, "records": [],
        # targets scripts/bench.sh left out (peer not installed / not installable): name -> why
        "not_run": dict(x.split("=", 1) for x in os.environ.get("BENCH_NOT_RUN", "").split(";") if "=" in x),
    }
    recs = results["records"]
    for n in names:
        t = T.make(n, run_id)
        info = {"version": "", "mounted": False, "seconds": None}
        results["targets"][n] = info
        t0 = time.monotonic()
        try:
            t.setup()
            info["version"] = t.version()
            t.mount()
            info["mounted"] = True
        except Exception as e:  # noqa: BLE001
            T.log(f"{n}: setup/mount failed: {e}")
            info["error"] = str(e)[-500:]
            try:
                t.teardown()
            except Exception:  # noqa: BLE001
                pass
            continue
        try:
            for w in wls:
                if not run_child(w, t, run_id, recs):
                    info["error"] = f"mount lost after {w}"
                    break
        finally:
            t.record_rss()
            try:
                t.teardown()
            except Exception as e:  # noqa: BLE001
                T.log(f"{n}: teardown: {e}")
            info["seconds"] = round(time.monotonic() - t0, 1)
            rss = t.peak_rss_mib()
            if rss is not None:
                recs.append({"target": n, "workload": "daemon", "metric": "peak_rss", "value": rss,
                             "unit": "MiB", "note": "max VmHWM of the mount daemon, read before each unmount"})
        T.log(f"{n}: done in {info['seconds']}s")
    results["total_seconds"] = round(time.time() - t_start, 1)
    results["why"] = report.why(results)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"bench-{results['mode']}")
    json.dump(results, open(stem + ".json", "w"), indent=1)
    md = report.markdown(results)
    open(stem + ".md", "w").write(md)
    print(report.text_table(results))
    png = report.chart(results, stem + ".png")
    T.log(f"wrote {stem}.json, {stem}.md" + (f", {png}" if png else " (no PNG: matplotlib missing)"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=3, metavar=("WORKLOAD", "TARGET", "RUN_ID"))
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--targets", default=None)
    ap.add_argument("--workloads", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.child:
        child_main(*args.child)
        return
    if args.short and not SHORT:  # sizes and limits are read at import: restart in short mode
        os.environ["DESKFS_BENCH_SHORT"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    if args.targets is None:
        args.targets = "local,deskfs" if SHORT else "local,deskfs,juicefs,rclone,s3fs"
    if args.out is None:
        args.out = os.path.join(STATE, "results") if SHORT else os.path.join(T.ROOT, "bench", "results")
    orchestrate(args)


if __name__ == "__main__":
    main()
