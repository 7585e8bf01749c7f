#!/usr/bin/env python3
"""fsx.py: an fsx-style randomized file-operation tester (after Apple/BSD fsx).

The same random operations are applied to files in a directory on the filesystem under
test (--dir) and in a reference directory on a local filesystem (--ref), and the results
are compared after every operation: the touched range and the size cheaply after each op,
every file in full every --full-every ops and at the end.

Operations (each chosen at random, applied to one of --names file names):
  write       pwrite at a random offset (often past EOF, leaving a hole)
  append      write through a separate O_APPEND descriptor, then close it
  truncate    ftruncate shrink or extend (sometimes truncate(2) by path)
  read        pread a random range (sometimes past EOF) and compare
  mapwrite    mmap MAP_SHARED, change a range, msync, munmap
  mapread     mmap read of a range and compare
  fallocate   posix_fallocate of a range (extends the file when past EOF)
  reopen      close the file's descriptor and open it again
  fsync       fsync (or fdatasync) the file's descriptor
  rename      rename to another of the names (replacing it if it exists; an open
              descriptor of the replaced file must still read its old content)
  create      create a missing name (O_CREAT|O_EXCL), sometimes unlink an existing one
Errors count too: an op must fail with the same errno on both sides.

Usage:
  fsx.py --dir MOUNTDIR --ref LOCALDIR [--seed N] [--ops N] [--names N] [--maxlen BYTES]
         [--full-every N] [--remount-at OP --remount-cmd 'SHELL COMMAND']
The seed (random unless given) is printed first; a run replays exactly with the same
arguments. On a mismatch: the seed, the op index, what differs and the last 20 ops are
printed and the exit status is 1. Exit 0 when everything matched. --remount-at closes
every descriptor at that op, runs the command (e.g. unmount + mount of DIR), then compares
everything before going on.
"""
import argparse
import collections
import errno
import mmap
import os
import random
import subprocess
import sys
import time

PAGE = mmap.PAGESIZE


class Mismatch(Exception):
    pass


def describe_diff(a, b, base=0):
    """Where two byte strings first differ, for the report."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    if i == n and len(a) == len(b):
        return "identical"
    lo = max(0, i - 8)
    return (f"first difference at offset {base + i} (lengths {len(a)} vs {len(b)}); "
            f"test bytes [{base + lo}:{base + i + 16}] = {a[lo:i + 16].hex()} ; "
            f"reference = {b[lo:i + 16].hex()}")


class Side:
    """One directory (the filesystem under test, or the reference) and its open fds."""

    def __init__(self, root):
        self.root = root
        self.fds = {}  # name -> fd (O_RDWR)

    def path(self, name):
        return os.path.join(self.root, name)

    def fd(self, name):
        if name not in self.fds:
            self.fds[name] = os.open(self.path(name), os.O_RDWR)
        return self.fds[name]

    def close(self, name):
        fd = self.fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def close_all(self):
        for n in list(self.fds):
            self.close(n)


def run_both(fn_test, fn_ref):
    """Run an op on both sides; both must succeed with equal results or fail alike."""
    res = []
    for fn in (fn_test, fn_ref):
        try:
            res.append(("ok", fn()))
        except OSError as e:
            res.append(("err", e.errno))
    (kt, vt), (kr, vr) = res
    if kt != kr or (kt == "err" and vt != vr):
        def show(k, v):
            return f"errno {v} ({errno.errorcode.get(v, '?')})" if k == "err" else f"success ({v!r:.60})"
        raise Mismatch(f"outcome differs: test {show(kt, vt)}, reference {show(kr, vr)}")
    if kt == "ok" and vt != vr:
        if isinstance(vt, bytes):
            raise Mismatch("result differs: " + describe_diff(vt, vr))
        raise Mismatch(f"result differs: test {vt!r:.200}, reference {vr!r:.200}")
    return kt == "ok", vt


class Fsx:
    def __init__(self, a):
        self.a = a
        self.seed = a.seed
        self.rng = random.Random(a.seed)
        self.test = Side(a.dir)
        self.ref = Side(a.ref)
        self.names = [f"fsx{i}.bin" for i in range(a.names)]
        self.history = collections.deque(maxlen=20)
        self.counts = collections.Counter()
        self.opno = 0

    # ------------------------------------------------------------ helpers
    def exists(self, name):
        return os.path.lexists(self.ref.path(name))

    def size(self, name):
        return os.fstat(self.ref.fd(name)).st_size

    def data(self, n):
        return self.rng.randbytes(n)

    def length(self):
        r = self.rng.random()
        if r < 0.4:
            return self.rng.randint(1, 512)
        if r < 0.8:
            return self.rng.randint(1, 16384)
        if r < 0.97:
            return self.rng.randint(1, 131072)
        return self.rng.randint(1, 1 << 20)

    def offset(self, name, n):
        size = self.size(name)
        r = self.rng.random()
        if r < 0.1:  # straddling a block (1 MiB) or page boundary
            unit = self.rng.choice([1 << 20, 1 << 20, PAGE, 65536])
            k = self.rng.randint(1, max(1, self.a.maxlen // unit))
            off = max(0, k * unit - self.rng.randint(0, min(n, 4096)))
        elif r < 0.25 or size == 0:  # past EOF (hole)
            off = size + self.rng.randint(0, 65536)
        elif r < 0.25:  # just at EOF
            off = size
        else:
            off = self.rng.randint(0, size)
        return min(off, max(0, self.a.maxlen - n))

    def check_range(self, name, off, n):
        """Size (fstat + stat by path) and the bytes [off, off+n) equal on both sides."""
        st = os.fstat(self.test.fd(name)).st_size
        sr = os.fstat(self.ref.fd(name)).st_size
        if st != sr:
            raise Mismatch(f"{name}: size {st} (fstat), reference {sr}" + self.second_look(name, off, n))
        sp = os.stat(self.test.path(name)).st_size
        if sp != sr:
            raise Mismatch(f"{name}: size {sp} (stat by path), reference {sr}" + self.second_look(name, off, n))
        if n <= 0:
            return
        bt = os.pread(self.test.fd(name), n, off)
        br = os.pread(self.ref.fd(name), n, off)
        if bt != br:
            raise Mismatch(f"{name}: range [{off}, {off + n}) differs: " + describe_diff(bt, br, off))

    def second_look(self, name, off, n):
        """After a size mismatch: what the test side says 0.3 s later (a transient answer
        of the attributes, or a lost write), for the failure message."""
        time.sleep(0.3)
        try:
            st = os.fstat(self.test.fd(name)).st_size
            sp = os.stat(self.test.path(name)).st_size
            same = n <= 0 or os.pread(self.test.fd(name), n, off) == os.pread(self.ref.fd(name), n, off)
            return (f"; 0.3 s later: fstat {st}, stat by path {sp}, bytes [{off}, {off + n}) "
                    + ("match the reference" if same else "differ from the reference"))
        except OSError as e:
            return f"; 0.3 s later: {e}"

    def full_check(self, why):
        lt = sorted(n for n in os.listdir(self.test.root))
        lr = sorted(n for n in os.listdir(self.ref.root))
        if lt != lr:
            raise Mismatch(f"{why}: directory listing differs: test {lt}, reference {lr}")
        for name in lr:
            # a fresh descriptor, not the op descriptor: what a new reader sees
            with open(self.test.path(name), "rb") as f:
                bt = f.read()
            with open(self.ref.path(name), "rb") as f:
                br = f.read()
            if bt != br:
                raise Mismatch(f"{why}: {name} differs (fresh open): " + describe_diff(bt, br))
            if name in self.test.fds:
                if os.fstat(self.test.fds[name]).st_size != len(br):
                    raise Mismatch(f"{why}: {name}: fstat size of the open fd "
                                   f"{os.fstat(self.test.fds[name]).st_size}, expected {len(br)}")
        self.counts["full-compare"] += 1

    # ------------------------------------------------------------ ops
    def op_write(self, name):
        n = self.length()
        off = self.offset(name, n)
        buf = self.data(n)
        self.note(f"write {name} off={off} len={n}")
        run_both(lambda: os.pwrite(self.test.fd(name), buf, off),
                 lambda: os.pwrite(self.ref.fd(name), buf, off))
        self.check_range(name, max(0, off - 16), n + 32)

    def op_append(self, name):
        n = self.length()
        before = self.size(name)
        if before + n > self.a.maxlen:
            return self.op_truncate(name)
        buf = self.data(n)
        self.note(f"append {name} len={n} (size before {before})")

        def app(side):
            fd = os.open(side.path(name), os.O_WRONLY | os.O_APPEND)
            try:
                w = os.write(fd, buf)
                pos = os.lseek(fd, 0, os.SEEK_CUR)
            finally:
                os.close(fd)
            return (w, pos)
        run_both(lambda: app(self.test), lambda: app(self.ref))
        self.check_range(name, max(0, before - 16), n + 32)

    def op_truncate(self, name):
        size = self.size(name)
        if self.rng.random() < 0.5 and size > 0:
            new = self.rng.randint(0, size)
        else:
            new = min(self.a.maxlen, size + self.rng.randint(0, self.rng.choice([4096, 200000, 1 << 20])))
        bypath = self.rng.random() < 0.25
        self.note(f"truncate {name} {size} -> {new}{' (by path)' if bypath else ''}")
        if bypath:
            run_both(lambda: os.truncate(self.test.path(name), new),
                     lambda: os.truncate(self.ref.path(name), new))
        else:
            run_both(lambda: os.ftruncate(self.test.fd(name), new),
                     lambda: os.ftruncate(self.ref.fd(name), new))
        lo = max(0, min(size, new) - 4096)
        self.check_range(name, lo, abs(new - size) + 8192)

    def op_read(self, name):
        size = self.size(name)
        n = self.length()
        off = self.rng.randint(0, size + 4096)
        self.note(f"read {name} off={off} len={n} (size {size})")
        run_both(lambda: os.pread(self.test.fd(name), n, off),
                 lambda: os.pread(self.ref.fd(name), n, off))

    def _map(self, side, name, size):
        return mmap.mmap(side.fd(name), size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def op_mapwrite(self, name):
        size = self.size(name)
        if size == 0:
            return self.op_write(name)
        n = min(self.length(), size)
        off = self.rng.randint(0, size - n)
        buf = self.data(n)
        self.note(f"mapwrite {name} off={off} len={n} (size {size}) + msync")

        def mw(side):
            m = self._map(side, name, size)
            try:
                m[off:off + n] = buf
                m.flush()  # msync(MS_SYNC) of the whole mapping
            finally:
                m.close()
        run_both(lambda: mw(self.test), lambda: mw(self.ref))
        self.check_range(name, off, n)

    def op_mapread(self, name):
        size = self.size(name)
        if size == 0:
            return self.op_read(name)
        n = min(self.length(), size)
        off = self.rng.randint(0, size - n)
        self.note(f"mapread {name} off={off} len={n} (size {size})")

        def mr(side):
            m = mmap.mmap(side.fd(name), size, mmap.MAP_SHARED, mmap.PROT_READ)
            try:
                return m[off:off + n]
            finally:
                m.close()
        run_both(lambda: mr(self.test), lambda: mr(self.ref))

    def op_fallocate(self, name):
        size = self.size(name)
        n = self.length()
        off = self.rng.randint(0, size + 65536)
        off = min(off, max(0, self.a.maxlen - n))
        self.note(f"fallocate {name} off={off} len={n} (size {size})")
        run_both(lambda: os.posix_fallocate(self.test.fd(name), off, n),
                 lambda: os.posix_fallocate(self.ref.fd(name), off, n))
        self.check_range(name, max(0, min(off, size) - 16), n + (off - min(off, size)) + 32)

    def op_reopen(self, name):
        self.note(f"reopen {name}")
        self.test.close(name)
        self.ref.close(name)
        self.check_range(name, 0, 0)

    def op_fsync(self, name):
        data_only = self.rng.random() < 0.3
        self.note(f"{'fdatasync' if data_only else 'fsync'} {name}")
        f = os.fdatasync if data_only else os.fsync
        run_both(lambda: f(self.test.fd(name)), lambda: f(self.ref.fd(name)))

    def op_rename(self, name):
        dst = self.rng.choice([n for n in self.names if n != name])
        replaced = self.exists(dst)
        self.note(f"rename {name} -> {dst}{' (replacing it)' if replaced else ''}")
        # the replaced file stays open on both sides: its content must survive the unlink
        orphans = (self.test.fds.pop(dst, None), self.ref.fds.pop(dst, None))
        run_both(lambda: os.rename(self.test.path(name), self.test.path(dst)),
                 lambda: os.rename(self.ref.path(name), self.ref.path(dst)))
        for side in (self.test, self.ref):
            if name in side.fds:  # the descriptor follows the inode
                side.fds[dst] = side.fds.pop(name)
        ot, orf = orphans
        if ot is not None and orf is not None:
            size = os.fstat(orf).st_size
            bt, br = os.pread(ot, size + 1, 0), os.pread(orf, size + 1, 0)
            os.close(ot)
            os.close(orf)
            if bt != br:
                raise Mismatch(f"open descriptor of the replaced {dst} reads differently: " + describe_diff(bt, br))
        else:
            for fd in orphans:
                if fd is not None:
                    os.close(fd)
        self.check_range(dst, 0, 0)
        if os.path.lexists(self.test.path(name)):
            raise Mismatch(f"{name} still exists after rename to {dst}")

    def op_create(self, name):
        # name is a missing name here
        self.note(f"create {name}")

        def cr(side):
            fd = os.open(side.path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            side.fds[name] = fd
        run_both(lambda: cr(self.test), lambda: cr(self.ref))
        self.check_range(name, 0, 0)

    def op_unlink(self, name):
        self.note(f"unlink {name}")
        self.test.close(name)
        self.ref.close(name)
        run_both(lambda: os.unlink(self.test.path(name)), lambda: os.unlink(self.ref.path(name)))
        if os.path.lexists(self.test.path(name)):
            raise Mismatch(f"{name} still exists after unlink")

    OPS = [("write", 30), ("append", 6), ("truncate", 8), ("read", 12), ("mapwrite", 8),
           ("mapread", 6), ("fallocate", 5), ("reopen", 6), ("fsync", 6), ("rename", 5),
           ("unlink", 1)]

    def note(self, s):
        self.history.append(f"op {self.opno}: {s}")

    def step(self):
        existing = [n for n in self.names if self.exists(n)]
        missing = [n for n in self.names if n not in existing]
        if not existing or (missing and self.rng.random() < 0.03):
            name = self.rng.choice(missing)
            self.counts["create"] += 1
            return self.op_create(name)
        name = self.rng.choice(existing)
        ops, weights = zip(*self.OPS)
        op = self.rng.choices(ops, weights)[0]
        if op == "unlink" and len(existing) < 2:
            op = "write"
        self.counts[op] += 1
        getattr(self, "op_" + op)(name)

    def remount(self):
        self.note(f"remount: close all, run {self.a.remount_cmd!r}")
        self.test.close_all()
        self.ref.close_all()
        t0 = time.monotonic()
        r = subprocess.run(self.a.remount_cmd, shell=True)
        if r.returncode != 0:
            raise Mismatch(f"remount command failed with status {r.returncode}")
        print(f"fsx: remounted at op {self.opno} in {time.monotonic() - t0:.1f}s", flush=True)
        self.full_check("after remount")
        self.counts["remount"] += 1

    def run(self):
        a = self.a
        # initial files: empty
        for n in self.names[:2]:
            self.op_create(n)
        t0 = time.monotonic()
        for self.opno in range(1, a.ops + 1):
            if a.remount_at and self.opno == a.remount_at:
                self.remount()
            self.step()
            if self.opno % a.full_every == 0:
                self.full_check(f"full compare at op {self.opno}")
        self.test.close_all()
        self.ref.close_all()
        self.full_check("final full compare (all closed)")
        return time.monotonic() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="directory on the filesystem under test (must be empty)")
    p.add_argument("--ref", required=True, help="reference directory on a local filesystem (must be empty)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ops", type=int, default=3000)
    p.add_argument("--names", type=int, default=4, help="how many file names the ops share")
    p.add_argument("--maxlen", type=int, default=4 << 20, help="files never grow beyond this")
    p.add_argument("--full-every", type=int, default=50)
    p.add_argument("--remount-at", type=int, default=0)
    p.add_argument("--remount-cmd", default="")
    a = p.parse_args()
    if a.seed is None:
        a.seed = int.from_bytes(os.urandom(4), "little")
    if a.remount_at and not a.remount_cmd:
        p.error("--remount-at needs --remount-cmd")
    print(f"fsx: seed {a.seed}, {a.ops} ops, {a.names} names, maxlen {a.maxlen}, dir {a.dir}"
          f"{f', remount at op {a.remount_at}' if a.remount_at else ''}", flush=True)
    for d in (a.dir, a.ref):
        os.makedirs(d, exist_ok=True)
        if os.listdir(d):
            p.error(f"{d} is not empty")
    f = Fsx(a)
    try:
        secs = f.run()
    except (Mismatch, OSError) as e:
        kind = "MISMATCH" if isinstance(e, Mismatch) else "UNEXPECTED ERROR"
        print(f"fsx: {kind} with seed {a.seed} at op {f.opno}: {e}", flush=True)
        print(f"fsx: replay: {sys.argv[0]} --seed {a.seed} --ops {a.ops} --names {a.names} "
              f"--maxlen {a.maxlen} --full-every {a.full_every}"
              f"{f' --remount-at {a.remount_at}' if a.remount_at else ''} --dir DIR --ref REFDIR")
        print("fsx: last ops:")
        for h in f.history:
            print("   ", h)
        return 1
    ops = " ".join(f"{k}={v}" for k, v in sorted(f.counts.items()))
    print(f"fsx: seed {a.seed}: {a.ops} ops OK in {secs:.1f}s ({ops})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
