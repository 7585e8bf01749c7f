#!/usr/bin/env python3
"""converge.py - bucket convergence workloads and the check that the bucket equals the
namespace (tests/e2e/91-bucket-convergence.sh).

    converge.py workload --seed N --ops K --root SUB MOUNT [MOUNT...]
        seeded random create/write/append/truncate/mmap-write/rename/delete/mkdir/rmdir/
        symlink ops on MOUNT/SUB, each op through a randomly chosen mount point (all of
        one workspace), with uploads racing them. Prints a summary line.
    converge.py sqlite --rows N DIR
        a SQLite WAL workload in DIR (created): inserts, updates, checkpoints, a second
        connection, then closes and removes DIR entirely (db, -wal, -shm).
    converge.py check MOUNT (--s3-prefix PREFIX | --bucket-dir DIR)
        compares the namespace under MOUNT with the bucket listed without deskfs (tests/
        s3.py's client for S3, the directory itself for file://): every file's and
        symlink's object exists with equal content (sha256; a symlink's object holds its
        target), no object without a path, `.deskfs/` ignored, a directory marker for
        every empty directory and none for a path that is not a directory. Exit 1 with
        the differences listed.
"""
import argparse
import hashlib
import mmap
import os
import random
import sqlite3
import sys


def sha(b):
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------- workload

def workload(a):
    rnd = random.Random(a.seed)
    mounts = a.mounts
    files, dirs, links = set(), {""}, set()
    counts = {}

    def p(m, rel):
        return os.path.join(m, a.root, rel) if rel else os.path.join(m, a.root)

    for m in mounts[:1]:
        os.makedirs(p(m, ""), exist_ok=True)

    def pick_dir():
        return rnd.choice(sorted(dirs))

    def new_name(d, prefix):
        return (d + "/" if d else "") + f"{prefix}{rnd.randrange(10**6)}"

    def children(d):
        pre = d + "/" if d else ""
        return [x for x in files | dirs | links if x != d and x.startswith(pre)]

    def data(n):
        return rnd.randbytes(n)

    for _ in range(a.ops):
        m = rnd.choice(mounts)
        op = rnd.choices(
            ["create", "write", "append", "truncate", "mmap", "rename", "delete",
             "mkdir", "rmdir", "symlink", "rename_dir"],
            weights=[14, 10, 8, 6, 6, 10, 10, 6, 5, 4, 2])[0]
        try:
            if op == "create" or (not files and op in ("write", "append", "truncate", "mmap", "rename", "delete")):
                op = "create"
                f = new_name(pick_dir(), "f")
                with open(p(m, f), "wb") as fh:
                    fh.write(data(rnd.choice([0, 1, 100, 4096, 70000, 300000])))
                files.add(f)
            elif op == "write":
                f = rnd.choice(sorted(files))
                with open(p(m, f), "r+b") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    fh.seek(rnd.randrange(size + 1))
                    fh.write(data(rnd.randrange(1, 20000)))
            elif op == "append":
                f = rnd.choice(sorted(files))
                with open(p(m, f), "ab") as fh:
                    fh.write(data(rnd.randrange(1, 50000)))
            elif op == "truncate":
                f = rnd.choice(sorted(files))
                os.truncate(p(m, f), rnd.randrange(0, 200000))
            elif op == "mmap":
                f = rnd.choice(sorted(files))
                with open(p(m, f), "r+b") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size == 0:
                        fh.truncate(8192)
                        size = 8192
                    mm = mmap.mmap(fh.fileno(), size)
                    off = rnd.randrange(size)
                    n = min(size - off, rnd.randrange(1, 8192))
                    mm[off:off + n] = data(n)
                    if rnd.random() < 0.5:
                        mm.flush()
                    mm.close()
            elif op == "rename":
                f = rnd.choice(sorted(files | links))
                if rnd.random() < 0.3 and len(files) > 1:
                    dst = rnd.choice(sorted(files - {f}))  # replace another file
                else:
                    dst = new_name(pick_dir(), "r")
                os.rename(p(m, f), p(m, dst))
                kind = files if f in files else links
                kind.discard(f)
                files.discard(dst)
                links.discard(dst)
                kind.add(dst)
            elif op == "delete":
                f = rnd.choice(sorted(files | links))
                os.unlink(p(m, f))
                files.discard(f)
                links.discard(f)
            elif op == "mkdir":
                d = new_name(pick_dir(), "d")
                os.mkdir(p(m, d))
                dirs.add(d)
            elif op == "rmdir":
                cands = [d for d in dirs if d and not children(d)]
                if not cands:
                    continue
                d = rnd.choice(sorted(cands))
                os.rmdir(p(m, d))
                dirs.discard(d)
            elif op == "rename_dir":
                cands = sorted(d for d in dirs if d)
                if not cands:
                    continue
                d = rnd.choice(cands)
                parent = rnd.choice([x for x in sorted(dirs) if x != d and not x.startswith(d + "/")])
                dst = new_name(parent, "m")
                os.rename(p(m, d), p(m, dst))
                pre = d + "/"

                def mv(x):
                    return dst + x[len(d):] if x == d or x.startswith(pre) else x
                files = {mv(x) for x in files}
                links = {mv(x) for x in links}
                dirs = {mv(x) for x in dirs}
            elif op == "symlink":
                s = new_name(pick_dir(), "s")
                os.symlink(rnd.choice(["target", "../x", "a/b/c", "f" * 50]), p(m, s))
                links.add(s)
        except OSError as e:
            sys.exit(f"converge.py: {op} through {m}: {e}")
        counts[op] = counts.get(op, 0) + 1
    print(f"workload seed {a.seed}: {a.ops} ops through {len(mounts)} mounts "
          f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}); "
          f"{len(files)} files, {len(dirs) - 1} dirs, {len(links)} symlinks left")


# ---------------------------------------------------------------- sqlite

def sqlite_workload(a):
    os.makedirs(a.dir, exist_ok=True)
    db = os.path.join(a.dir, "app.db")
    c = sqlite3.connect(db)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    c2 = sqlite3.connect(db)
    for i in range(a.rows):
        c.execute("INSERT INTO t(v) VALUES(?)", (os.urandom(200),))
        if i % 50 == 0:
            c.commit()
            c2.execute("SELECT count(*) FROM t").fetchone()
        if i % 200 == 0:
            c.execute("UPDATE t SET v=? WHERE id%7=0", (os.urandom(100),))
            c.commit()
            c.execute("PRAGMA wal_checkpoint(PASSIVE)")
    c.commit()
    n = c2.execute("SELECT count(*) FROM t").fetchone()[0]
    if n != a.rows:
        sys.exit(f"converge.py sqlite: {n} rows, expected {a.rows}")
    c2.close()
    c.close()
    for name in sorted(os.listdir(a.dir)):
        os.unlink(os.path.join(a.dir, name))
    os.rmdir(a.dir)
    print(f"sqlite WAL workload: {a.rows} rows, directory removed")


# ---------------------------------------------------------------- check

def namespace(mount):
    """{path: ("f", sha) | ("l", sha of target) | ("d", empty?)} under mount."""
    out = {}
    for dp, dn, fn in os.walk(mount):
        rel = os.path.relpath(dp, mount)
        rel = "" if rel == "." else rel
        if rel:
            out[rel] = ("d", not dn and not fn)
        for n in dn[:]:
            full = os.path.join(dp, n)
            if os.path.islink(full):
                dn.remove(n)
                fn.append(n)
        for n in fn:
            full = os.path.join(dp, n)
            r = os.path.join(rel, n) if rel else n
            if os.path.islink(full):
                out[r] = ("l", sha(os.readlink(full).encode()))
            else:
                with open(full, "rb") as f:
                    out[r] = ("f", sha(f.read()))
    return out


def bucket_s3(prefix):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))
    import s3  # tests/s3.py
    objs, markers = {}, set()
    for key in s3.list_keys(prefix.rstrip("/") + "/"):
        k = key[0] if isinstance(key, tuple) else key
        rel = k[len(prefix.rstrip("/")) + 1:]
        if rel.startswith(".deskfs/") or rel == ".deskfs/":
            continue
        if rel.endswith("/"):
            markers.add(rel[:-1])
            continue
        st, _, body = s3.request("GET", k)
        if st != 200:
            sys.exit(f"converge.py: GET {k}: HTTP {st}")
        objs[rel] = sha(body)
    return objs, markers


def bucket_dir(root):
    objs, markers = {}, set()
    for dp, dn, fn in os.walk(root):
        rel = os.path.relpath(dp, root)
        rel = "" if rel == "." else rel
        if rel == ".deskfs" or rel.startswith(".deskfs/"):
            dn[:] = []
            continue
        if rel:
            markers.add(rel)
        for n in fn:
            r = os.path.join(rel, n) if rel else n
            with open(os.path.join(dp, n), "rb") as f:
                objs[r] = sha(f.read())
    return objs, markers


def check(a):
    ns = namespace(a.mount)
    objs, markers = bucket_s3(a.s3_prefix) if a.s3_prefix else bucket_dir(a.bucket_dir)
    bad = []
    for path, (kind, v) in sorted(ns.items()):
        if kind in ("f", "l"):
            if path not in objs:
                bad.append(f"missing object for {'file' if kind == 'f' else 'symlink'} {path}")
            elif objs[path] != v:
                bad.append(f"object {path} differs from the {'file' if kind == 'f' else 'symlink target'}")
        elif kind == "d" and v and path not in markers:
            bad.append(f"no directory marker for empty directory {path}")
    for path in sorted(objs):
        if path not in ns or ns[path][0] == "d":
            bad.append(f"object {path} has no file or symlink in the namespace")
    for path in sorted(markers):
        if ns.get(path, ("?",))[0] != "d":
            bad.append(f"directory marker {path}/ names no directory in the namespace")
    nfiles = sum(1 for k, _ in ns.values() if k != "d")
    if bad:
        print(f"bucket differs from the namespace ({len(bad)} differences, {nfiles} files/symlinks, "
              f"{len(objs)} objects):")
        for b in bad[:50]:
            print("  " + b)
        sys.exit(1)
    print(f"bucket equals the namespace: {nfiles} files/symlinks, {len(markers)} directory markers, "
          f"{sum(1 for k, e in ns.values() if k == 'd' and e)} empty dirs")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("workload")
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--ops", type=int, default=400)
    w.add_argument("--root", required=True)
    w.add_argument("mounts", nargs="+")
    s = sub.add_parser("sqlite")
    s.add_argument("--rows", type=int, default=1000)
    s.add_argument("dir")
    c = sub.add_parser("check")
    c.add_argument("mount")
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--s3-prefix")
    g.add_argument("--bucket-dir")
    a = ap.parse_args()
    {"workload": workload, "sqlite": sqlite_workload, "check": check}[a.cmd](a)


if __name__ == "__main__":
    main()
