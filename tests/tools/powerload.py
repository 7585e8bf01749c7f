#!/usr/bin/env python3
"""powerload.py: workload + checker for the power-loss test (tests/e2e/82l-power-loss.sh).

  powerload.py work  --mnt DIR --journal FILE --iter N --seed S [--keep-iters K]
  powerload.py check --mnt DIR --journal FILE [--promised-bytes N] [--journal-bytes M]

`work` runs until it is killed, making files on DIR and appending a line to the journal
(a file on the real disk, never on the mount or the power-loss file system) only after
the call that makes a promise returned (and a `begin NAME` line before it creates a file):
  fsynced NAME SHA          a new file written whole, fsync returned (then closed)
  replacing TARGET SHA      before the rename of a fsynced temp file over TARGET
  replaced TARGET SHA       after rename + fsync of the directory returned
  closed NAME               a new file written whole and closed, never fsynced: after a
                            power cut it may be absent, short, zeros or whole (POSIX)
  retiring DIR / retired DIR  with --keep-iters K, at the start of `work`: before and
                            after the removal (rm -r, then fsync of the mount's root) of an
                            iteration's directory more than K iterations old; once
                            retired, nothing under it may exist, while retiring its files
                            may be gone (the tree, and each check's cost, stays bounded)
Every file has self-verifying content: a header line
  "DESKFS-POWER name=<name> len=<payload length> sha=<sha256 of payload>\\n" + payload;
SHA in the journal is the sha256 of the whole file.

`check` (after a power cut and a remount) holds deskfs to what it promises:
  * every fsynced file exists with exactly its content;
  * every replaced TARGET holds exactly the content of its last "replaced" line, or of a
    later "replacing" line (the crash came between rename and the directory's fsync);
  * every file of the tree can be read (no EIO), and the only files that exist are
    journaled ones (begun ones included: a file being written at the cut may be there, in
    any state) and the temp files of replacements (the tree holds nothing else).
With --promised-bytes N (a crash image: the journal's length when the image began), only
the lines within the first N bytes are promises; later lines (written while the image was
taken) only widen what may be there: their fsynced/closed files may exist in any state,
their replaced targets may hold that content. With --journal-bytes M (the journal's
length when the image ended), only the whole lines within its first M bytes are read.
Exit status 0 = as promised, 1 = problems (listed), 2 = usage error.
"""
import argparse
import hashlib
import os
import random
import shutil
import sys

MAGIC = b"DESKFS-POWER "
NTARGETS = 4


def jwrite(jfd, line):
    os.write(jfd, (line + "\n").encode())


def make_content(name, rng):
    payload = rng.randbytes(rng.choice([0, 1, 100, 4095, 4096, 5000, 20000, 70000]))
    h = hashlib.sha256(payload).hexdigest()
    return f"DESKFS-POWER name={name} len={len(payload)} sha={h}\n".encode() + payload


def write_file(path, data, rng, sync):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        off = 0
        while off < len(data):
            n = rng.randint(1, max(1, len(data) - off))
            os.pwrite(fd, data[off:off + n], off)
            off += n
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def retire(a, jfd):
    """Removes the directories of iterations more than `--keep-iters` before this one,
    so the tree (and every check's cost) stays bounded."""
    if a.keep_iters is None:
        return
    for name in sorted(os.listdir(a.mnt)):
        if not (name.startswith("i") and name[1:].isdigit()):
            continue
        if int(name[1:]) > a.iter - 1 - a.keep_iters:
            continue
        jwrite(jfd, f"retiring {name}")
        shutil.rmtree(os.path.join(a.mnt, name))
        fsync_dir(a.mnt)
        jwrite(jfd, f"retired {name}")


def work(a):
    rng = random.Random(a.seed)
    jfd = os.open(a.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    retire(a, jfd)
    d = os.path.join(a.mnt, f"i{a.iter:04d}")
    os.makedirs(d, exist_ok=True)
    print("READY", flush=True)
    k = 0
    while True:
        k += 1
        op = rng.random()
        if op < 0.45:
            rel = f"i{a.iter:04d}/f{k:05d}"
            data = make_content(rel, rng)
            jwrite(jfd, f"begin {rel}")
            write_file(os.path.join(a.mnt, rel), data, rng, True)
            jwrite(jfd, f"fsynced {rel} {hashlib.sha256(data).hexdigest()}")
        elif op < 0.75:
            rel = f"i{a.iter:04d}/c{k:05d}"
            jwrite(jfd, f"begin {rel}")
            write_file(os.path.join(a.mnt, rel), make_content(rel, rng), rng, False)
            jwrite(jfd, f"closed {rel}")
        else:
            target = f"t{rng.randrange(NTARGETS)}"
            tmp = f"{target}.tmp{a.iter:04d}.{k}"
            data = make_content(target, rng)
            jwrite(jfd, f"begin {tmp}")
            write_file(os.path.join(a.mnt, tmp), data, rng, True)
            h = hashlib.sha256(data).hexdigest()
            jwrite(jfd, f"replacing {target} {h} {tmp}")
            os.rename(os.path.join(a.mnt, tmp), os.path.join(a.mnt, target))
            fsync_dir(a.mnt)
            jwrite(jfd, f"replaced {target} {h}")


def check(a):
    fsynced, closed, replaced, pending, tmps, begun = {}, set(), {}, {}, set(), set()
    retiring, retired = set(), set()
    promised = a.promised_bytes if a.promised_bytes is not None else float("inf")
    at = 0
    with open(a.journal, "rb") as f:
        data = f.read() if a.journal_bytes is None else f.read(a.journal_bytes)
    # (A partial last line was being written at the image's end: not in the journal then.)
    for raw in data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]:
        line = raw.decode()
        at += len(raw) + 1
        p = line.split()
        if not p:
            continue
        if at > promised:
            # Written after the crash image began: the call it records may have
            # returned before or after the instant of the image, so the line only
            # widens what may be there.
            if p[0] in ("fsynced", "closed"):
                p = ["begin", p[1]]
            elif p[0] == "replaced":
                p = ["replacing", p[1], p[2], ""]
            elif p[0] == "retired":
                p = ["retiring", p[1]]
        if p[0] == "retiring":
            retiring.add(p[1])
        elif p[0] == "retired":
            retired.add(p[1])
        elif p[0] == "begin":
            begun.add(p[1])
        elif p[0] == "fsynced":
            fsynced[p[1]] = p[2]
        elif p[0] == "closed":
            closed.add(p[1])
        elif p[0] == "replacing":
            pending.setdefault(p[1], set()).add(p[2])
            if p[3]:
                tmps.add(p[3])
        elif p[0] == "replaced":
            replaced[p[1]] = p[2]
            pending[p[1]] = set()
    problems = []

    shas = {}

    def sha_of(rel):
        # Each file is read once (the walk below reads every file again otherwise); an
        # error is not kept, so the walk meets it again and reports it.
        if rel not in shas:
            with open(os.path.join(a.mnt, rel), "rb") as f:
                shas[rel] = hashlib.sha256(f.read()).hexdigest()
        return shas[rel]

    def top(rel):
        return rel.split("/", 1)[0]

    for rel, h in sorted(fsynced.items()):
        if top(rel) in retired:
            continue
        try:
            got = sha_of(rel)
        except FileNotFoundError:
            if top(rel) in retiring:
                continue  # removed with its directory, the removal not yet promised
            problems.append(f"fsynced file {rel}: missing")
            continue
        except OSError as e:
            problems.append(f"fsynced file {rel}: {e}")
            continue
        if got != h:
            problems.append(f"fsynced file {rel}: content {got[:12]}, fsynced {h[:12]}")
    for t in sorted(set(replaced) | set(pending)):
        ok = set(pending.get(t, set()))
        if t in replaced:
            ok.add(replaced[t])
        try:
            got = sha_of(t)
        except FileNotFoundError:
            if t in replaced:
                problems.append(f"replaced target {t} is missing")
            continue
        except OSError as e:
            problems.append(f"replaced target {t}: {e}")
            continue
        if got not in ok:
            problems.append(f"replaced target {t}: content {got[:12]} is none of {sorted(x[:12] for x in ok)}")
    known = set(fsynced) | closed | set(replaced) | set(pending) | tmps | begun
    seen = 0
    for root, _dirs, files in os.walk(a.mnt):
        for n in files:
            rel = os.path.relpath(os.path.join(root, n), a.mnt)
            seen += 1
            try:
                sha_of(rel)
            except OSError as e:
                problems.append(f"{rel}: cannot be read: {e}")
            if top(rel) in retired:
                problems.append(f"{rel}: its directory was removed and the removal fsynced")
            elif rel not in known:
                problems.append(f"{rel}: a file nobody made")
    print(f"checked: {len(fsynced)} fsynced, {len(replaced)} replaced targets, {seen} files in the tree")
    if problems:
        print("PROBLEMS:")
        for p in problems[:40]:
            print("  " + p)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["work", "check"])
    ap.add_argument("--mnt", required=True)
    ap.add_argument("--journal", required=True)
    ap.add_argument("--iter", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--promised-bytes", type=int, default=None)
    ap.add_argument("--keep-iters", type=int, default=None)
    ap.add_argument("--journal-bytes", type=int, default=None)
    a = ap.parse_args()
    if a.cmd == "work":
        work(a)
        return 0
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
