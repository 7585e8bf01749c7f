#!/usr/bin/env python3
"""crashload.py: workload + checker for crash-consistency tests (tests/e2e/82-*).

  crashload.py work  --mnt DIR --journal FILE --iter N --seed S
  crashload.py check --mnt DIR --journal FILE [--final]
  crashload.py expect --journal FILE      (prints "sha256 relpath" of every known file)

`work` runs until it is killed, doing random operations on DIR and appending a line to
the journal (a file on LOCAL disk, O_APPEND, one write() per line) only after the
operation returned:
  begin NAME                       before creating a write-once file
  fsynced NAME SHA                 after fsync of the complete file returned
  closed NAME SHA                  after close of the complete file returned
  tbegin TMP TARGET VER            before writing a temp file for an atomic replace
  tmpsynced TMP TARGET VER SHA     after fsync of the complete temp file returned
  renamed TMP TARGET VER SHA       after rename(TMP, TARGET) returned
  moving OLD NEW / moved OLD NEW   before / after rename of a complete file to a new name
  deleting NAME / deleted NAME     before / after unlink of a complete file
`check` adds: resolved-move OLD NEW AT, adopt NAME SHA, adopt-atomic TARGET VER SHA,
kept NAME, forget NAME, deleting/deleted NAME (half-written files), checked N.
Every file has self-verifying content: a header line
  "DESKFS-CRASH name=<name> ver=<ver> len=<payload length> sha=<sha256 of payload>\\n"
then the payload; SHA in the journal is the sha256 of the whole file.

`check` reads the journal, checks the tree against it, and then resolves what the crash
left uncertain (appending adopt/deleted/resolved lines, deleting half-written files), so
that after it the journal describes the tree exactly:
  * every fsynced and every closed file has exactly its journaled content;
  * every atomically replaced target holds one complete version (header verifies) whose
    version is >= the last journaled one (equal version => equal content);
  * a fsynced temp file is still there, or its target already holds that version or newer;
  * a file being moved exists at exactly one of old/new (at new if "moved" was journaled);
  * a file being deleted is gone, or still has its content if "deleted" was not journaled;
  * no other file exists anywhere, and every file passes its self-check except files that
    were being written at the crash (begun, never journaled complete).
Exit status 0 = consistent, 1 = problems (listed), 2 = usage / setup error.
"""
import argparse
import hashlib
import os
import random
import sys
import time

MAGIC = b"DESKFS-CRASH "
NDIRS = 6
NTARGETS = 8


def jwrite(jfd, line):
    os.write(jfd, (line + "\n").encode())


def make_content(name, ver, payload):
    h = hashlib.sha256(payload).hexdigest()
    head = f"DESKFS-CRASH name={name} ver={ver} len={len(payload)} sha={h}\n".encode()
    return head + payload


def self_check(data):
    """(ok, ver or None, reason)"""
    nl = data.find(b"\n")
    if not data.startswith(MAGIC) or nl < 0:
        return False, None, f"no header ({len(data)} bytes: {data[:40]!r})"
    try:
        fields = dict(kv.split("=", 1) for kv in data[len(MAGIC):nl].decode().split(" "))
        ver, ln, h = int(fields["ver"]), int(fields["len"]), fields["sha"]
    except Exception as e:  # noqa: BLE001
        return False, None, f"bad header {data[:nl][:120]!r}: {e}"
    payload = data[nl + 1:]
    if len(payload) != ln:
        return False, ver, f"payload is {len(payload)} bytes, header says {ln}"
    if hashlib.sha256(payload).hexdigest() != h:
        return False, ver, "payload sha256 does not match the header"
    return True, ver, ""


def sha(data):
    return hashlib.sha256(data).hexdigest()


class Model:
    """State replayed from the journal."""

    def __init__(self, path):
        self.exact = {}       # name -> sha        (complete files that must be there)
        self.atomic = {}      # target -> (ver, sha)
        self.begun = {}       # name -> iter        (write-once files not yet journaled complete)
        self.tbegun = {}      # tmp -> (target, ver)
        self.tmpsynced = {}   # tmp -> (target, ver, sha)
        self.moving = {}      # old -> new          (rename started, not journaled done)
        self.deleting = set()
        self.iters = 0
        self.lines = 0
        self.maxver = 0
        if not os.path.exists(path):
            return
        with open(path) as f:
            for ln in f:
                self.apply(ln.split())

    def apply(self, w):
        if not w:
            return
        self.lines += 1
        op = w[0]
        if op == "iter":
            self.iters = max(self.iters, int(w[1]))
        elif op == "begin":
            self.begun[w[1]] = True
        elif op in ("fsynced", "closed", "adopt"):
            self.begun.pop(w[1], None)
            self.exact[w[1]] = w[2]
        elif op == "tbegin":
            self.tbegun[w[1]] = (w[2], int(w[3]))
            self.maxver = max(self.maxver, int(w[3]))
        elif op == "tmpsynced":
            self.tmpsynced[w[1]] = (w[2], int(w[3]), w[4])
        elif op == "renamed":
            self.tbegun.pop(w[1], None)
            self.tmpsynced.pop(w[1], None)
            self.atomic[w[2]] = (int(w[3]), w[4])
        elif op == "adopt-atomic":
            self.atomic[w[1]] = (int(w[2]), w[3])
        elif op == "moving":
            self.moving[w[1]] = w[2]
        elif op in ("moved", "resolved-move"):
            old, new = w[1], w[2]
            at = w[3] if op == "resolved-move" else new
            self.moving.pop(old, None)
            if at == new and old in self.exact:
                self.exact[new] = self.exact.pop(old)
        elif op == "deleting":
            self.deleting.add(w[1])
        elif op == "kept":
            self.deleting.discard(w[1])
        elif op in ("deleted", "forget"):
            self.deleting.discard(w[1])
            self.exact.pop(w[1], None)
            self.begun.pop(w[1], None)
            self.tbegun.pop(w[1], None)
            self.tmpsynced.pop(w[1], None)
        elif op in ("checked", "note"):
            pass
        else:
            raise ValueError(f"unknown journal line {' '.join(w)!r}")


# ------------------------------------------------------------------ workload

def payload_size(rng):
    r = rng.random()
    if r < 0.1:
        return 0
    if r < 0.75:
        return rng.randint(1, 16384)
    if r < 0.97:
        return rng.randint(16384, 256 << 10)
    return rng.randint(1 << 20, 2 << 20)


def write_all(fd, data, rng):
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:rng.choice((4096, 65536, 262144))])
        view = view[n:]


def work(a):
    rng = random.Random(a.seed)
    m = Model(a.journal)
    jfd = os.open(a.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    it = a.iter
    for d in [f"d{k}" for k in range(NDIRS)] + ["atomic"]:
        os.makedirs(os.path.join(a.mnt, d), exist_ok=True)
    exact = dict(m.exact)
    held = []
    seq = 0
    ver = max(m.maxver, max((v for v, _ in m.atomic.values()), default=0))
    jwrite(jfd, f"iter {it} seed {a.seed}")
    print("READY", flush=True)
    while True:
        seq += 1
        r = rng.random()
        if len(exact) > 400 and rng.random() < 0.5:
            r = 1.0  # delete: keeps the workspace (and each check) bounded
        if r < 0.5:  # write-once file
            name = f"d{rng.randrange(NDIRS)}/i{it}-{seq}.dat"
            data = make_content(name, 0, rng.randbytes(payload_size(rng)))
            h = sha(data)
            jwrite(jfd, f"begin {name}")
            fd = os.open(os.path.join(a.mnt, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            write_all(fd, data, rng)
            if rng.random() < 0.5:
                os.fsync(fd)
                jwrite(jfd, f"fsynced {name} {h}")
                if rng.random() < 0.3:
                    held.append(fd)  # stays open until the kill
                else:
                    os.close(fd)
                    jwrite(jfd, f"closed {name} {h}")
            else:
                os.close(fd)
                jwrite(jfd, f"closed {name} {h}")
            exact[name] = h
        elif r < 0.68:  # atomic replace
            target = f"atomic/t{rng.randrange(NTARGETS)}"
            ver += 1
            tmp = f"atomic/.tmp-{target[7:]}-{ver}"
            data = make_content(target, ver, rng.randbytes(payload_size(rng)))
            h = sha(data)
            jwrite(jfd, f"tbegin {tmp} {target} {ver}")
            fd = os.open(os.path.join(a.mnt, tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            write_all(fd, data, rng)
            os.fsync(fd)
            jwrite(jfd, f"tmpsynced {tmp} {target} {ver} {h}")
            os.close(fd)
            os.rename(os.path.join(a.mnt, tmp), os.path.join(a.mnt, target))
            jwrite(jfd, f"renamed {tmp} {target} {ver} {h}")
        elif r < 0.85:  # move a complete file to a new name
            if not exact:
                continue
            old = rng.choice(sorted(exact))
            new = f"d{rng.randrange(NDIRS)}/m{it}-{seq}.dat"
            jwrite(jfd, f"moving {old} {new}")
            os.rename(os.path.join(a.mnt, old), os.path.join(a.mnt, new))
            jwrite(jfd, f"moved {old} {new}")
            exact[new] = exact.pop(old)
        else:  # delete a complete file (keeps the workspace from growing without bound)
            if len(exact) < 20:
                continue
            name = rng.choice(sorted(exact))
            jwrite(jfd, f"deleting {name}")
            os.unlink(os.path.join(a.mnt, name))
            jwrite(jfd, f"deleted {name}")
            del exact[name]


# ------------------------------------------------------------------ checker

def walk(root):
    out = {}
    for dp, dns, fns in os.walk(root):
        for n in fns:
            p = os.path.join(dp, n)
            out[os.path.relpath(p, root)] = p
    return out


def check(a):
    m = Model(a.journal)
    files = walk(a.mnt)

    def read(rel):
        with open(files[rel], "rb") as f:
            return f.read()

    problems = []
    resolutions = []   # journal lines to append (resolve the crash's uncertainty)
    deletions = []     # files to delete (half-written, stale temp files)
    accounted = set()

    # moves in flight: exactly one of old/new
    for old, new in sorted(m.moving.items()):
        at_old, at_new = old in files, new in files
        if old not in m.exact:
            problems.append(f"journal: moving {old} which is not a known complete file")
            continue
        if at_old and at_new:
            problems.append(f"move {old} -> {new} (interrupted): the file exists at BOTH names")
            accounted |= {old, new}
            continue
        if not at_old and not at_new:
            problems.append(f"move {old} -> {new} (interrupted): the file exists at NEITHER name")
            continue
        at = old if at_old else new
        resolutions.append(f"resolved-move {old} {new} {at}")
        if at == new:
            m.exact[new] = m.exact.pop(old)

    # deletes in flight: gone, or still complete
    for name in sorted(m.deleting):
        if name in m.exact and name not in files:
            resolutions.append(f"deleted {name}")
            m.exact.pop(name)
        else:
            resolutions.append(f"kept {name}")

    # complete files: exact content
    for name, h in sorted(m.exact.items()):
        accounted.add(name)
        if name not in files:
            problems.append(f"{name}: MISSING (journaled complete, sha {h[:12]})")
            continue
        data = read(name)
        if sha(data) != h:
            ok, _, why = self_check(data)
            problems.append(f"{name}: content differs from the journaled one ({len(data)} bytes, "
                            f"self-check {'passes' if ok else 'FAILS: ' + why})")

    # atomic targets
    begun_vers = {}
    for tmp, (target, ver) in m.tbegun.items():
        begun_vers.setdefault(target, {})[ver] = m.tmpsynced.get(tmp, (None, None, None))[2]
    targets = set(m.atomic) | set(begun_vers) | {f for f in files if f.startswith("atomic/t")}
    for target in sorted(targets):
        accounted.add(target)
        jver, jsha = m.atomic.get(target, (0, None))
        if target not in files:
            if jsha is not None:
                problems.append(f"{target}: MISSING (atomically replaced, journaled version {jver})")
            continue
        data = read(target)
        ok, ver, why = self_check(data)
        if not ok:
            problems.append(f"{target}: atomically replaced target is not one complete version: {why}")
            continue
        if ver < jver:
            problems.append(f"{target}: holds version {ver}, older than the journaled {jver}")
        elif ver == jver:
            if sha(data) != jsha:
                problems.append(f"{target}: version {ver} content differs from the journaled one")
        else:
            cands = begun_vers.get(target, {})
            if ver not in cands:
                problems.append(f"{target}: holds version {ver}, which no unfinished replace wrote "
                                f"(journaled {jver})")
            elif cands[ver] is not None and cands[ver] != sha(data):
                problems.append(f"{target}: version {ver} differs from its fsynced temp file")
            else:
                resolutions.append(f"adopt-atomic {target} {ver} {sha(data)}")
    # fsynced temp files whose rename was not journaled: still there, or renamed
    for tmp, (target, ver, h) in sorted(m.tmpsynced.items()):
        if tmp in files:
            if sha(read(tmp)) != h:
                problems.append(f"{tmp}: fsynced temp file has other content than journaled")
        else:
            tver = -1
            if target in files:
                ok, v, _ = self_check(read(target))
                tver = v if ok else -1
            if tver < ver:
                problems.append(f"{tmp}: fsynced temp file (version {ver}) vanished and {target} "
                                f"holds version {tver}")
    for tmp in sorted(m.tbegun):
        if tmp in files:
            accounted.add(tmp)
            deletions.append(tmp)
        else:
            resolutions.append(f"forget {tmp}")

    # write-once files that were being written at the crash
    for name in sorted(m.begun):
        if name not in files:
            resolutions.append(f"forget {name}")
            continue
        accounted.add(name)
        data = read(name)
        ok, _, why = self_check(data)
        if ok:
            resolutions.append(f"adopt {name} {sha(data)}")
        else:
            deletions.append(name)

    # nothing else anywhere
    for rel in sorted(files):
        if rel not in accounted:
            data = read(rel)
            ok, _, why = self_check(data)
            problems.append(f"{rel}: UNEXPECTED file ({len(data)} bytes, self-check "
                            f"{'passes' if ok else 'fails: ' + why})")

    nfiles = len(files)
    nbytes = sum(os.stat(p).st_size for p in files.values())
    print(f"crashload check: {nfiles} files ({nbytes} bytes), journal {m.lines} lines, "
          f"{len(m.exact)} complete files, {len(targets)} atomic targets, "
          f"{len(m.moving)} moves / {len(m.deleting)} deletes / {len(m.begun)} writes / "
          f"{len(m.tbegun)} replaces interrupted; {len(deletions)} half-written files to remove",
          flush=True)
    if problems:
        print(f"crashload check: {len(problems)} PROBLEMS:")
        for p in problems[:60]:
            print("   ", p)
        if len(problems) > 60:
            print(f"    ... and {len(problems) - 60} more")
        return 1
    # resolve: from here on the journal describes the tree exactly
    jfd = os.open(a.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for ln in resolutions:
        jwrite(jfd, ln)
    for rel in deletions:
        jwrite(jfd, f"deleting {rel}")
        os.unlink(os.path.join(a.mnt, rel))
        jwrite(jfd, f"deleted {rel}")
    jwrite(jfd, f"checked {m.iters}")
    os.close(jfd)
    return 0


def expect(a):
    m = Model(a.journal)
    if m.moving or m.deleting or m.begun or m.tbegun:
        print("journal has unresolved entries: run check first", file=sys.stderr)
        return 2
    for name, h in sorted(m.exact.items()):
        print(h, name)
    for target, (_, h) in sorted(m.atomic.items()):
        print(h, target)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["work", "check", "expect"])
    p.add_argument("--mnt")
    p.add_argument("--journal", required=True)
    p.add_argument("--iter", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.mode == "work":
        return work(a)
    if a.mode == "check":
        return check(a)
    return expect(a)


if __name__ == "__main__":
    sys.exit(main())
