#!/usr/bin/env python3
"""faultys3.py — an HTTP/1.1 proxy in front of an S3 server that injects the faults object
stores show: 500 InternalError, 503 SlowDown, connection resets, stalls, truncated
response bodies and slow answers — at random, and in bursts.

    faultys3.py --listen 127.0.0.1:0 --to 127.0.0.1:3900 [--rate 0.1]
                [--kinds 500,503,reset,stall,truncate,slow] [--stall-s 3] [--seed N]
                [--control FILE] [--stats FILE]

Every request from a client is read whole and, unless a fault is drawn for it, forwarded
on a connection of its own to --to, and the answer relayed. The Host header is forwarded
unchanged, so SigV4 signatures made for the proxy's address verify at the server. Per
request, with probability --rate, one of --kinds happens instead:

  500, 503   an S3 error answer (InternalError, SlowDown), the request never forwarded;
  reset      the client's connection is closed with RST before anything is forwarded;
  stall      --stall-s seconds of silence, then the request is forwarded;
  truncate   forwarded, then the answer cut after half its body (connection reset) —
             only answers with a body of at least 2 bytes, else forwarded whole;
  slow       forwarded, the answer held 0.3 s.

--control FILE, re-read every 0.2 s when it changes, is JSON that overrides the above:
{"rate": 0.3} changes the rate, {"kinds": ["503", "reset"]} the kinds drawn (unknown
ones ignored; none known: --kinds), {"burst": "503"} makes every request get that fault
until the file says otherwise, {"stall_s": 60} changes --stall-s, {"rate": 0} turns faults
off. --stats FILE is rewritten
every 0.5 s with {"requests": N, "faults": {"503": n, ...}}. The draws follow --seed.

Output: "HOST:PORT" of the listener alone on the first line of stdout; a summary of the
faults on stderr at exit. SIGTERM/SIGINT: stops and exits 0. Bad arguments: one error
line, exit 2.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import struct
import sys

KINDS = ("500", "503", "reset", "stall", "truncate", "slow")
ERRORS = {
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


class Faults:
    def __init__(self, rate, kinds, seed, control):
        self.rate = rate
        self.base_rate = rate
        self.kinds = kinds
        self.base_kinds = kinds
        self.rng = random.Random(seed)
        self.control = control
        self.burst = None
        self.stall_s = None
        self.mtime = None
        self.requests = 0
        self.counts = {k: 0 for k in KINDS}

    def reload(self):
        if not self.control:
            return
        try:
            m = os.stat(self.control).st_mtime_ns
        except FileNotFoundError:
            return
        if m == self.mtime:
            return
        self.mtime = m
        try:
            with open(self.control) as f:
                c = json.load(f)
        except (OSError, ValueError) as e:
            print(f"faultys3: control file unreadable, kept the old settings: {e}", file=sys.stderr)
            return
        self.rate = float(c.get("rate", self.base_rate))
        k = [x for x in c.get("kinds", self.base_kinds) if x in KINDS]
        self.kinds = tuple(k) or self.base_kinds
        b = c.get("burst")
        self.burst = b if b in KINDS else None
        st = c.get("stall_s")
        self.stall_s = float(st) if isinstance(st, (int, float)) and st >= 0 else None

    def draw(self):
        self.requests += 1
        if self.burst:
            kind = self.burst
        elif self.rng.random() < self.rate:
            kind = self.rng.choice(self.kinds)
        else:
            return None
        self.counts[kind] += 1
        return kind


def header(head, name):
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name:
            return v.strip()
    return None


async def read_body(reader, head, is_response, method):
    """The body of the message whose header block is `head`, as it came on the wire."""
    if is_response:
        status = int(head.split(b" ", 2)[1])
        if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
            return b""
    te = header(head, b"transfer-encoding")
    if te and b"chunked" in te.lower():
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            out += size_line
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                # Trailers, then the empty line.
                while True:
                    line = await reader.readuntil(b"\r\n")
                    out += line
                    if line == b"\r\n":
                        return bytes(out)
            out += await reader.readexactly(size + 2)
    cl = header(head, b"content-length")
    if cl is not None:
        return await reader.readexactly(int(cl))
    return await reader.read() if is_response else b""


def error_answer(kind, method):
    status, reason, code, message = ERRORS[kind]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
    ).encode()
    return head + (b"" if method == b"HEAD" else body)


def reset(writer):
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def serve(faults, to, stall_s, creader, cwriter):
    try:
        while True:
            try:
                head = await creader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            method = head.split(b" ", 1)[0]
            body = await read_body(creader, head, False, method)
            kind = faults.draw()
            if kind == "reset":
                reset(cwriter)
                return
            if kind in ERRORS:
                cwriter.write(error_answer(kind, method))
                await cwriter.drain()
                continue
            if kind == "stall":
                await asyncio.sleep(faults.stall_s if faults.stall_s is not None else stall_s)
            ureader, uwriter = await asyncio.open_connection(*to)
            try:
                uwriter.write(head + body)
                await uwriter.drain()
                rhead = await ureader.readuntil(b"\r\n\r\n")
                rbody = await read_body(ureader, rhead, True, method)
            finally:
                uwriter.close()
            if kind == "truncate" and len(rbody) >= 2:
                cwriter.write(rhead + rbody[: len(rbody) // 2])
                await cwriter.drain()
                reset(cwriter)
                return
            if kind == "truncate":
                faults.counts["truncate"] -= 1
            if kind == "slow":
                await asyncio.sleep(0.3)
            cwriter.write(rhead + rbody)
            await cwriter.drain()
            if header(rhead, b"connection") == b"close":
                return
    except (ConnectionError, asyncio.IncompleteReadError, OSError):
        return
    finally:
        if not cwriter.transport.is_closing():
            cwriter.close()


async def housekeeping(faults, stats):
    n = 0
    while True:
        faults.reload()
        if stats and n % 3 == 0:
            tmp = stats + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"requests": faults.requests, "faults": faults.counts}, f)
            os.replace(tmp, stats)
        n += 1
        await asyncio.sleep(0.2)


def hostport(s, what):
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what} must be HOST:PORT, got {s!r}")
    return host, int(port)


async def main(args):
    faults = Faults(args.rate, args.kinds, args.seed, args.control)
    faults.reload()
    to = args.to
    server = await asyncio.start_server(
        lambda r, w: serve(faults, to, args.stall_s, r, w), *args.listen
    )
    host, port = server.sockets[0].getsockname()[:2]
    print(f"{host}:{port}", flush=True)
    print(
        f"faultys3: {host}:{port} -> {to[0]}:{to[1]}, rate {args.rate}, kinds {','.join(args.kinds)}, seed {args.seed}",
        file=sys.stderr,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    hk = asyncio.create_task(housekeeping(faults, args.stats))
    await stop.wait()
    hk.cancel()
    server.close()
    if args.stats:
        with open(args.stats, "w") as f:
            json.dump({"requests": faults.requests, "faults": faults.counts}, f)
    print(f"faultys3: {faults.requests} requests, faults {faults.counts}", file=sys.stderr)


def parse(argv):
    p = argparse.ArgumentParser(description="S3 fault-injecting proxy")
    p.add_argument("--listen", required=True)
    p.add_argument("--to", required=True)
    p.add_argument("--rate", type=float, default=0.1)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--stall-s", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--control")
    p.add_argument("--stats")
    a = p.parse_args(argv)
    try:
        a.listen = hostport(a.listen, "--listen")
        a.to = hostport(a.to.split("://", 1)[-1].rstrip("/"), "--to")
        a.kinds = [k for k in a.kinds.split(",") if k]
        bad = [k for k in a.kinds if k not in KINDS]
        if bad or not a.kinds:
            raise ValueError(f"--kinds: unknown {bad or 'none given'}; use some of {','.join(KINDS)}")
        if not 0 <= a.rate <= 1:
            raise ValueError(f"--rate must be within 0..1, got {a.rate}")
    except ValueError as e:
        print(f"faultys3: {e}", file=sys.stderr)
        sys.exit(2)
    return a


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
    # Connections still stalled are dropped with the process: letting asyncio cancel
    # them only prints a CancelledError traceback per connection.
    sys.stderr.flush()
    os._exit(0)
