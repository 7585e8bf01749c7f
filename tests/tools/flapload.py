#!/usr/bin/env python3
"""flapload.py — a writer and its checker for mounts whose host is cut off now and then.

flapload.py run TAG MOUNT JOURNAL SECONDS SEED
    writes on one host's mount for SECONDS: overwrites (O_TRUNC, 30 % of them fsynced) of
    its own files TAG-0..TAG-5, atomic saves (TAG-i.tmp written, closed, renamed over
    TAG-i), unlinks of its own files, overwrites of the shared files S0..S2; 10 KB..2 MB
    each. Every op and its outcome (OK, or ERR at open/write/fsync/close/rename with the
    errno) is one JSON line of JOURNAL. The bytes of op N of TAG are content(TAG, N, size).

flapload.py check MOUNT JOURNAL...
    the tree of MOUNT against the journals: each file holds a state the journals allow
    (the last acknowledged one, or what a later failed op may have left: its bytes, a
    prefix of them, or an empty file; a shared file any write's bytes); a file the
    journals say exists is there; a NAME.deskfs-conflict-* copy holds the bytes (or a
    prefix) of a write to NAME; a file that cannot be read is a problem. One line per
    problem, then "checked N ops, M files"; exit 1 on any problem.
Used by e2e/86n-partition-hosts.sh.
"""
import errno, hashlib, json, os, random, sys, time


def content(tag, n, size):
    return random.Random("%s-%d" % (tag, n)).randbytes(size)


def run(tag, mount, journal, seconds, seed):
    rnd = random.Random(seed)
    jf = open(journal, "a", buffering=1)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        r = rnd.random()
        size = rnd.choice([10_000, 60_000, 300_000, 1_000_000, 2_000_000])
        own = "%s-%d" % (tag, rnd.randrange(6))
        rec = {"tag": tag, "n": n, "size": size, "t": time.time()}
        if r < 0.45 or r >= 0.8:
            path = own if r < 0.45 else "S%d" % rnd.randrange(3)
            rec.update(op="write", path=path)
            sync = rnd.random() < 0.3
            stage = "open"
            try:
                fd = os.open(os.path.join(mount, path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    stage = "write"
                    data = content(tag, n, size)
                    off = 0
                    while off < len(data):
                        off += os.write(fd, data[off:])
                    if sync:
                        stage = "fsync"
                        os.fsync(fd)
                except OSError:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                    raise
                stage = "close"
                os.close(fd)
                rec["res"] = "OK"
            except OSError as e:
                rec["res"] = "ERR"
                rec["stage"] = stage
                rec["errno"] = errno.errorcode.get(e.errno, str(e.errno))
        elif r < 0.65:
            tmp = own + ".tmp"
            rec.update(op="save", path=own, tmp=tmp)
            stage = "open"
            try:
                fd = os.open(os.path.join(mount, tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                stage = "write"
                try:
                    data = content(tag, n, size)
                    off = 0
                    while off < len(data):
                        off += os.write(fd, data[off:])
                finally:
                    stage = "close"
                    os.close(fd)
                stage = "rename"
                os.rename(os.path.join(mount, tmp), os.path.join(mount, own))
                rec["res"] = "OK"
            except OSError as e:
                rec["res"] = "ERR"
                rec["stage"] = stage
                rec["errno"] = errno.errorcode.get(e.errno, str(e.errno))
        else:
            rec.update(op="unlink", path=own)
            try:
                os.unlink(os.path.join(mount, own))
                rec["res"] = "OK"
            except OSError as e:
                rec["res"] = "ERR"
                rec["errno"] = errno.errorcode.get(e.errno, str(e.errno))
        jf.write(json.dumps(rec) + "\n")
    print("done %d ops" % n, flush=True)


def check(mount, journals):
    ops = []
    for j in journals:
        for line in open(j):
            line = line.strip()
            if line:
                ops.append(json.loads(line))
    ops.sort(key=lambda o: o["t"])
    # allowed[path] = set of states: ("absent",), ("full", tag, n, size), ("maybe", tag, n, size)
    # ("maybe": the op's content, empty, or a prefix of it)
    allowed = {}
    written = {}  # path -> [(tag, n, size)] every write ever aimed at it (conflict copies)

    def cur(p):
        return allowed.get(p, {("absent",)})

    for o in ops:
        key = (o["tag"], o["n"], o["size"])
        if o["op"] == "write":
            p = o["path"]
            written.setdefault(p, []).append(key)
            if o["res"] == "OK":
                new = {("full",) + key}
            elif o["stage"] == "open":
                new = cur(p) | {("empty",)}
            else:
                new = cur(p) | {("maybe",) + key}
            if p.startswith("S"):
                # shared: the hosts' ops interleave; what any of them wrote stays allowed
                new = new | cur(p)
            allowed[p] = new
        elif o["op"] == "save":
            p, tmp = o["path"], o["tmp"]
            written.setdefault(tmp, []).append(key)
            written.setdefault(p, []).append(key)
            if o["res"] == "OK":
                allowed[p] = {("full",) + key}
                allowed[tmp] = {("absent",)}
            elif o["stage"] == "rename":
                # the rename may or may not have happened
                allowed[p] = cur(p) | {("full",) + key}
                allowed[tmp] = {("absent",), ("full",) + key}
            else:
                allowed[tmp] = cur(tmp) | {("maybe",) + key, ("empty",)}
        elif o["op"] == "unlink":
            p = o["path"]
            if o["res"] == "OK":
                allowed[p] = {("absent",)}
            elif o["errno"] == "ENOENT":
                pass
            else:
                allowed[p] = cur(p) | {("absent",)}
    problems = []
    seen = set()
    for dp, dns, fns in os.walk(mount):
        dns[:] = [d for d in dns if not (dp == mount and d == ".deskfs")]
        for f in fns:
            rel = os.path.relpath(os.path.join(dp, f), mount)
            seen.add(rel)
            try:
                data = open(os.path.join(dp, f), "rb").read()
            except OSError as e:
                problems.append("%s: unreadable (%s)" % (rel, errno.errorcode.get(e.errno)))
                continue
            base = rel.split(".deskfs-conflict-")[0]
            if base not in allowed and base not in written:
                continue  # not a file of these writers
            if ".deskfs-conflict-" in rel:
                ok = any(data == content(*k)[: len(data)] and len(data) > 0 for k in written.get(base, []))
                if not ok:
                    problems.append("%s: a conflict copy holding no write to %s (%d bytes, sha %s)" % (rel, base, len(data), hashlib.sha256(data).hexdigest()[:12]))
                continue
            states = cur(rel)
            ok = False
            for s in states:
                if s[0] == "full" and data == content(*s[1:]):
                    ok = True
                elif s[0] == "maybe" and data == content(*s[1:])[: len(data)]:
                    ok = True
                elif s[0] == "empty" and not data:
                    ok = True
            if not ok:
                problems.append("%s: %d bytes (sha %s) is none of the allowed states %s" % (
                    rel, len(data), hashlib.sha256(data).hexdigest()[:12], sorted(states)[:6]))
    for p, states in allowed.items():
        if p not in seen and ("absent",) not in states:
            problems.append("%s: missing, but the journals allow only %s" % (p, sorted(states)[:6]))
    for p in problems:
        print(p)
    print("checked %d ops, %d files" % (len(ops), len(seen)))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] not in ("run", "check") or (sys.argv[1] == "run" and len(sys.argv) != 7):
        print("usage: flapload.py run TAG MOUNT JOURNAL SECONDS SEED | check MOUNT JOURNAL...", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6]))
    else:
        sys.exit(check(sys.argv[2], sys.argv[3:]))
