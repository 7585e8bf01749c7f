#!/usr/bin/env python3
"""tcpproxy.py — a TCP forwarder that adds a fixed one-way delay to each direction.

    tcpproxy.py --listen HOST:PORT --to HOST:PORT [--delay-ms MS]

Accepts connections on --listen and connects each one to --to. Every chunk read from one
side is written to the other side MS milliseconds after it was read (default 0), in order;
so a request/response round trip through the proxy costs about 2 x MS more than without
the proxy's delay (plus the proxy's own small, constant hop cost). Chunks that arrive
while earlier ones wait are not held up further: the delay is a pipe's latency, not a
per-chunk serialization. Half-closes (EOF) are forwarded after the data before them.

Output: the listening address as "HOST:PORT" alone on the first line of stdout (with
--listen 127.0.0.1:0 the kernel picks the port; read it from there), a description on
stderr. SIGTERM or SIGINT: closes the listener and every connection, exits 0.

Use it to emulate a slower network in front of a local server, e.g. PostgreSQL:
    python3 tests/tools/tcpproxy.py --listen 127.0.0.1:0 --to 127.0.0.1:5432 --delay-ms 0.25

Timer precision: each forwarding thread lowers its timer slack to 1 us (prctl), so sleeps
of a fraction of a millisecond are honoured (the default slack is 50 us). What remains is
the kernel's wake-up latency, about 0.05-0.1 ms per direction on a 2-core VM: measured
here, --delay-ms 1 added 2.0-2.2 ms per PostgreSQL `SELECT 1` round trip and --delay-ms 0.25
added 0.5-0.56 ms. Bad arguments: one error line, exit 2.
"""

import argparse
import ctypes
import queue
import signal
import socket
import sys
import threading
import time

PR_SET_TIMERSLACK = 29
_EOF = object()


def _low_timer_slack():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except Exception:
        pass


def parse_addr(text, what):
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what}: expected HOST:PORT, got {text!r}")
    host = host.strip("[]")
    try:
        port = int(port)
    except ValueError:
        raise ValueError(f"{what}: port {port!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{what}: port {port} is out of range")
    return host, port


class Pipe:
    """One direction of one connection: a reader thread and a delayed writer thread."""

    def __init__(self, conn, src, dst, delay):
        self.conn, self.src, self.dst, self.delay = conn, src, dst, delay
        self.q = queue.SimpleQueue()

    def start(self):
        threading.Thread(target=self.read_loop, daemon=True).start()
        threading.Thread(target=self.write_loop, daemon=True).start()

    def read_loop(self):
        try:
            while True:
                data = self.src.recv(65536)
                now = time.monotonic()
                if not data:
                    self.q.put((now + self.delay, _EOF))
                    return
                self.q.put((now + self.delay, data))
        except OSError:
            self.q.put((0, None))  # reset/closed: tear the connection down

    def write_loop(self):
        _low_timer_slack()
        try:
            while True:
                due, data = self.q.get()
                if data is None:
                    self.conn.close()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if data is _EOF:
                    try:
                        self.dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    self.conn.half_closed()
                    return
                self.dst.sendall(data)
        except OSError:
            self.conn.close()


class Conn:
    def __init__(self, proxy, client, server):
        self.proxy, self.client, self.server = proxy, client, server
        self.lock = threading.Lock()
        self.halves = 0
        self.closed = False

    def half_closed(self):
        with self.lock:
            self.halves += 1
            done = self.halves == 2
        if done:
            self.close()

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.server):
            try:
                s.close()
            except OSError:
                pass
        self.proxy.forget(self)


class Proxy:
    def __init__(self, listen, to, delay):
        self.to, self.delay = to, delay
        self.conns = set()
        self.lock = threading.Lock()
        fam = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self.lsock = socket.socket(fam, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(listen)
        self.lsock.listen(128)

    def forget(self, conn):
        with self.lock:
            self.conns.discard(conn)

    def serve(self):
        while True:
            client, _ = self.lsock.accept()
            threading.Thread(target=self.connect, args=(client,), daemon=True).start()

    def connect(self, client):
        try:
            server = socket.create_connection(self.to, timeout=10)
            server.settimeout(None)
        except OSError as e:
            print(f"tcpproxy: cannot connect to {self.to[0]}:{self.to[1]}: {e}", file=sys.stderr)
            client.close()
            return
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Conn(self, client, server)
        with self.lock:
            self.conns.add(conn)
        Pipe(conn, client, server, self.delay).start()
        Pipe(conn, server, client, self.delay).start()

    def shutdown(self):
        try:
            self.lsock.close()
        except OSError:
            pass
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            c.close()


class Stop(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"tcpproxy: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def main():
    ap = Parser(description="TCP forwarder with a fixed one-way delay per direction")
    ap.add_argument("--listen", required=True, help="HOST:PORT to listen on (PORT 0: any free port)")
    ap.add_argument("--to", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per direction in ms (default 0)")
    args = ap.parse_args()
    try:
        listen = parse_addr(args.listen, "--listen")
        to = parse_addr(args.to, "--to")
        if to[1] == 0:
            raise ValueError("--to: port 0 is not a destination")
        if not (args.delay_ms >= 0 and args.delay_ms < 60000):
            raise ValueError(f"--delay-ms must be between 0 and 60000, got {args.delay_ms}")
    except ValueError as e:
        print(f"tcpproxy: error: {e}", file=sys.stderr)
        return 2
    try:
        proxy = Proxy(listen, to, args.delay_ms / 1000.0)
    except OSError as e:
        print(f"tcpproxy: error: cannot listen on {args.listen}: {e}", file=sys.stderr)
        return 1

    def on_signal(signum, frame):
        raise Stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    host, port = proxy.lsock.getsockname()[:2]
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    print(shown, flush=True)
    print(f"tcpproxy: listening on {shown} -> {to[0]}:{to[1]}, one-way delay {args.delay_ms} ms", file=sys.stderr, flush=True)
    try:
        proxy.serve()
    except Stop:
        pass
    finally:
        proxy.shutdown()
    print("tcpproxy: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
