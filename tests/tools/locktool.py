#!/usr/bin/env python3
"""locktool.py: small lock actors for the lock tests (tests/e2e/83-*).

KIND is flock (flock(2)), posix (fcntl F_SETLK/F_SETLKW/F_GETLK, per-process byte ranges)
or ofd (fcntl F_OFD_SETLK=37 / F_OFD_SETLKW=38 / F_OFD_GETLK=36, per open file description).
RANGE is START LEN (posix/ofd only; default 0 0 = the whole file). --shared takes a read
(shared) lock instead of a write (exclusive) one.

  hold  KIND PATH [START LEN] [--shared]  lock (blocking), print "LOCKED <pid>", hold; SIGUSR1
                                          unlocks (prints "UNLOCKED"); runs until killed
  try   KIND PATH [START LEN] [--shared]  non-blocking attempt: exit 0 "GOT" (released again),
                                          1 "WOULDBLOCK <errno name>", 2 other error
  wait  KIND PATH [START LEN] [--shared] [--timeout S]
                                          blocking lock: prints "WAITING", then "GOT <secs>"
                                          once granted and exits 0 (releasing it);
                                          exit 3 "TIMEOUT" after S seconds
  getlk KIND PATH START LEN [--shared]    prints "UNLCK" or "WRLCK|RDLCK <start> <len> <pid>"
  ofd-pair PATH                           two open file descriptions in ONE process: an OFD
                                          write lock on 0-9 through the first must block the
                                          second (prints and exits 0 if it does, 1 if not)
  counter PATH N [LOG [LABEL]] [--lock K] N times: open, lock (K: flock LOCK_EX, the default;
                                          posix: fcntl F_SETLKW write lock on the whole file;
                                          ofd: F_OFD_SETLKW; none: no lock at all, to show
                                          that the check can fail), read the 20-digit
                                          counter, write it + 1, close (close-to-open);
                                          LOG (local disk) gets "t0 t1 pid value-read LABEL"
  counter-report LOG                      overlapping critical sections / stale reads in LOG

Options added for the multi-host tests (tests/e2e/87-*), off by default:
  wait ... --epoch                        "GOT <secs> epoch=<time.time()>" (wall clock of the
                                          grant, to measure against an event in the test)
"""
import errno
import fcntl
import os
import signal
import struct
import sys
import time

F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 36, 37, 38
FLOCK_FMT = "hhqqi4x"  # struct flock on Linux x86_64/aarch64: type, whence, start, len, pid
WOULDBLOCK = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


def parse(argv):
    shared = "--shared" in argv
    argv = [a for a in argv if a not in ("--shared", "--epoch")]
    timeout = None
    if "--timeout" in argv:
        i = argv.index("--timeout")
        timeout = float(argv[i + 1])
        del argv[i:i + 2]
    kind, path = argv[0], argv[1]
    start, ln = (int(argv[2]), int(argv[3])) if len(argv) >= 4 else (0, 0)
    if kind not in ("flock", "posix", "ofd"):
        sys.exit(f"locktool: unknown kind {kind}")
    return kind, path, start, ln, shared, timeout


def open_for(path, shared):
    return os.open(path, os.O_RDONLY if shared else os.O_RDWR)


def lock(fd, kind, start, ln, shared, block):
    if kind == "flock":
        op = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if block else fcntl.LOCK_NB)
        fcntl.flock(fd, op)
        return
    typ = fcntl.F_RDLCK if shared else fcntl.F_WRLCK
    arg = struct.pack(FLOCK_FMT, typ, os.SEEK_SET, start, ln, 0)
    if kind == "posix":
        cmd = fcntl.F_SETLKW if block else fcntl.F_SETLK
    else:
        cmd = F_OFD_SETLKW if block else F_OFD_SETLK
    fcntl.fcntl(fd, cmd, arg)


def unlock(fd, kind, start, ln):
    if kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_UN)
        return
    arg = struct.pack(FLOCK_FMT, fcntl.F_UNLCK, os.SEEK_SET, start, ln, 0)
    fcntl.fcntl(fd, fcntl.F_SETLK if kind == "posix" else F_OFD_SETLK, arg)


def say(*a):
    print(*a, flush=True)


def cmd_hold(argv):
    kind, path, start, ln, shared, _ = parse(argv)
    fd = open_for(path, shared)
    lock(fd, kind, start, ln, shared, block=True)

    def on_usr1(_s, _f):
        unlock(fd, kind, start, ln)
        say("UNLOCKED")
    signal.signal(signal.SIGUSR1, on_usr1)
    say(f"LOCKED {os.getpid()}")
    while True:
        time.sleep(3600)


def cmd_try(argv):
    kind, path, start, ln, shared, _ = parse(argv)
    fd = open_for(path, shared)
    try:
        lock(fd, kind, start, ln, shared, block=False)
    except OSError as e:
        if e.errno in WOULDBLOCK:
            say(f"WOULDBLOCK {errno.errorcode.get(e.errno, e.errno)}")
            return 1
        say(f"ERROR {errno.errorcode.get(e.errno, e.errno)} {e.strerror}")
        return 2
    unlock(fd, kind, start, ln)
    os.close(fd)
    say("GOT")
    return 0


class Timeout(Exception):
    pass


def cmd_wait(argv):
    kind, path, start, ln, shared, timeout = parse(argv)
    fd = open_for(path, shared)

    def on_alarm(_s, _f):
        raise Timeout()
    signal.signal(signal.SIGALRM, on_alarm)
    if timeout:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    t0 = time.monotonic()
    say("WAITING")
    try:
        lock(fd, kind, start, ln, shared, block=True)
    except Timeout:
        say(f"TIMEOUT after {time.monotonic() - t0:.2f}")
        return 3
    except OSError as e:
        say(f"ERROR {errno.errorcode.get(e.errno, e.errno)} {e.strerror}")
        return 2
    signal.setitimer(signal.ITIMER_REAL, 0)
    if "--epoch" in argv:
        say(f"GOT {time.monotonic() - t0:.2f} epoch={time.time():.3f}")
    else:
        say(f"GOT {time.monotonic() - t0:.2f}")
    unlock(fd, kind, start, ln)
    os.close(fd)
    return 0


def cmd_getlk(argv):
    kind, path, start, ln, shared, _ = parse(argv)
    if kind == "flock":
        sys.exit("locktool: getlk is for posix/ofd")
    fd = open_for(path, shared)
    typ = fcntl.F_RDLCK if shared else fcntl.F_WRLCK
    arg = struct.pack(FLOCK_FMT, typ, os.SEEK_SET, start, ln, 0)
    res = fcntl.fcntl(fd, fcntl.F_GETLK if kind == "posix" else F_OFD_GETLK, arg)
    rtyp, _wh, rstart, rlen, rpid = struct.unpack(FLOCK_FMT, res)
    names = {fcntl.F_UNLCK: "UNLCK", fcntl.F_WRLCK: "WRLCK", fcntl.F_RDLCK: "RDLCK"}
    if rtyp == fcntl.F_UNLCK:
        say("UNLCK")
    else:
        say(f"{names.get(rtyp, rtyp)} {rstart} {rlen} {rpid}")
    return 0


def cmd_ofd_pair(argv):
    path = argv[0]
    a = os.open(path, os.O_RDWR)
    b = os.open(path, os.O_RDWR)
    lock(a, "ofd", 0, 10, False, block=False)
    try:
        lock(b, "ofd", 0, 10, False, block=False)
    except OSError as e:
        if e.errno in WOULDBLOCK:
            say(f"OK: second open file description blocked ({errno.errorcode[e.errno]})")
            return 0
        raise
    say("BAD: two open file descriptions of one process both got an OFD write lock on 0-9")
    return 1


def cmd_counter(argv):
    kind = "flock"
    if "--lock" in argv:
        i = argv.index("--lock")
        kind = argv[i + 1]
        del argv[i:i + 2]
        if kind not in ("flock", "posix", "ofd", "none"):
            sys.exit(f"locktool: counter --lock {kind}: expected flock, posix, ofd or none")
    path, n = argv[0], int(argv[1])
    log = os.open(argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if len(argv) > 2 else None
    label = argv[3] if len(argv) > 3 else "-"
    for _ in range(n):
        fd = os.open(path, os.O_RDWR)
        if kind != "none":
            lock(fd, kind, 0, 0, False, block=True)
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        raw = os.pread(fd, 64, 0)
        try:
            v = int(raw)
        except ValueError:
            say(f"BAD counter content {raw!r}")
            return 1
        os.pwrite(fd, b"%020d\n" % (v + 1), 0)
        t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if log is not None:  # one write() per line on local disk: the critical section
            os.write(log, f"{t0} {t1} {os.getpid()} {v} {label}\n".encode())
        os.close(fd)  # flush, then the flock goes away
    say(f"DONE {n}")
    return 0


def cmd_counter_report(argv):
    """Explains a counter log: critical sections that overlapped (the lock let two
    processes in) and reads that returned a value older than the last write (stale data)."""
    rows = []
    for ln in open(argv[0]):
        w = ln.split()
        if w:
            rows.append((int(w[0]), int(w[1]), int(w[2]), int(w[3]), w[4] if len(w) > 4 else "-"))
    rows.sort()
    overlaps = [(a, b) for a, b in zip(rows, rows[1:]) if b[0] < a[1]]
    stale = [(a, b) for a, b in zip(rows, rows[1:]) if b[0] >= a[1] and b[3] != a[3] + 1]
    # a stale read that returns exactly the last value written through the reader's own
    # mount: the mounts hold diverging copies of the file
    last_by = {}
    own = 0
    for a, b in zip(rows, rows[1:]):
        last_by[a[4]] = a[3] + 1
        if b[0] >= a[1] and b[3] != a[3] + 1 and a[4] != b[4] and last_by.get(b[4]) == b[3]:
            own += 1
    cross = sum(1 for a, b in stale if a[4] != b[4])
    say(f"{len(rows)} increments logged, {len(overlaps)} overlapping critical sections, "
        f"{len(stale)} stale reads ({cross} across mounts, {own} of them returned the last "
        f"value written through the reader's own mount)")
    for a, b in overlaps[:3]:
        say(f"  overlap: pid {a[2]} ({a[4]}) held the lock {a[0]}..{a[1]} ns (read {a[3]}), "
            f"pid {b[2]} ({b[4]}) entered at {b[0]} (read {b[3]})")
    for a, b in stale[:3]:
        say(f"  stale: pid {a[2]} ({a[4]}) wrote {a[3] + 1} and closed/unlocked; pid {b[2]} "
            f"({b[4]}) then opened, locked and read {b[3]} ({(b[0] - a[1]) / 1e6:.1f} ms later)")
    return 0 if not overlaps and not stale else 1


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, argv = sys.argv[1], sys.argv[2:]
    fn = {"hold": cmd_hold, "try": cmd_try, "wait": cmd_wait, "getlk": cmd_getlk,
          "ofd-pair": cmd_ofd_pair, "counter": cmd_counter,
          "counter-report": cmd_counter_report}.get(cmd)
    if fn is None:
        sys.exit(f"locktool: unknown command {cmd}")
    return fn(argv)


if __name__ == "__main__":
    sys.exit(main())
