#!/usr/bin/env python3
"""holdfiles.py FIFO LOG — a process that holds files open and acts on them on command,
one command at a time, so a test can keep descriptors open across a partition of their
mount's host and write, fsync, read or close through them at chosen moments.

Commands, one per line on FIFO (opened read-write by this process: writers never block):
  SEQ open KEY PATH MODE      MODE r | rw | rwc (O_CREAT|O_EXCL) | rwt (O_TRUNC)
  SEQ pwrite KEY OFF SRC      the bytes of the (local) file SRC at offset OFF
  SEQ pread KEY OFF LEN       LEN bytes at OFF (answers their count)
  SEQ read KEY                the whole file from offset 0 (answers size and sha256)
  SEQ fsync KEY
  SEQ close KEY
  SEQ quit
Each is answered by one line appended to LOG: "SEQ OK [RESULT] SECS" or
"SEQ ERR ERRNAME SECS" (SECS: how long the call took). Used by e2e/86n-partition-hosts.sh.
"""
import errno
import hashlib
import os
import sys
import time

if len(sys.argv) != 3:
    print("usage: holdfiles.py FIFO LOG", file=sys.stderr)
    sys.exit(2)
fifo, log = sys.argv[1], sys.argv[2]
inp = os.fdopen(os.open(fifo, os.O_RDWR), "r")
out = open(log, "a", buffering=1)
fds = {}
MODES = {"r": os.O_RDONLY, "rw": os.O_RDWR, "rwc": os.O_RDWR | os.O_CREAT | os.O_EXCL,
         "rwt": os.O_RDWR | os.O_TRUNC}


def do(cmd, args):
    if cmd == "open":
        fds[args[0]] = os.open(args[1], MODES[args[2]], 0o644)
        return ""
    if cmd == "pwrite":
        with open(args[2], "rb") as f:
            data = f.read()
        return str(os.pwrite(fds[args[0]], data, int(args[1])))
    if cmd == "pread":
        return str(len(os.pread(fds[args[0]], int(args[2]), int(args[1]))))
    if cmd == "read":
        h, off = hashlib.sha256(), 0
        while True:
            b = os.pread(fds[args[0]], 1 << 20, off)
            if not b:
                return "%d %s" % (off, h.hexdigest())
            h.update(b)
            off += len(b)
    if cmd == "fsync":
        os.fsync(fds[args[0]])
        return ""
    if cmd == "close":
        os.close(fds.pop(args[0]))
        return ""
    raise ValueError("unknown command " + cmd)


for line in inp:
    parts = line.split()
    if len(parts) < 2:
        continue
    seq, cmd, args = parts[0], parts[1], parts[2:]
    if cmd == "quit":
        out.write("%s OK quit 0\n" % seq)
        break
    t0 = time.monotonic()
    try:
        res = do(cmd, args)
        out.write("%s OK %s %.2f\n" % (seq, res, time.monotonic() - t0))
    except OSError as e:
        out.write("%s ERR %s %.2f\n" % (seq, errno.errorcode.get(e.errno, e.errno), time.monotonic() - t0))
    except Exception as e:  # a bad command: the test reads it as a failure
        out.write("%s ERR %s %.2f\n" % (seq, type(e).__name__, time.monotonic() - t0))
