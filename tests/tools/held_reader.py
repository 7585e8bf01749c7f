#!/usr/bin/env python3
"""held_reader.py FILE FIFO — a process holding FILE open across a pause of its mount.

Opens FILE, reads 4 KiB at 20 MiB (a random read: no readahead and no whole-file fill,
so the rest of a cold file stays in the bucket), prints "ready", waits for a line on
FIFO, then reads the whole file from its start and prints "sha HEX" (sha256), or
"error ERRNO NAME" when a read fails. Used by e2e/86s-paused-mount.sh and
e2e/86h-paused-mount-hosts.sh. Bad arguments: one line, exit 2.
"""
import hashlib
import os
import sys

if len(sys.argv) != 3:
    print("usage: held_reader.py FILE FIFO", file=sys.stderr)
    sys.exit(2)
f = open(sys.argv[1], "rb", buffering=0)
f.seek(20 << 20)
f.read(4096)
print("ready", flush=True)
open(sys.argv[2]).readline()
h = hashlib.sha256()
try:
    f.seek(0)
    while True:
        b = f.read(1 << 20)
        if not b:
            break
        h.update(b)
    print("sha", h.hexdigest(), flush=True)
except OSError as e:
    print("error", e.errno, os.strerror(e.errno), flush=True)
