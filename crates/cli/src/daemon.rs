//! `deskfs mount` / `umount` / `sync` and the mount daemon itself.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use deskfs_bucket::{Bucket, BucketError};
use deskfs_cache::Cache;
use deskfs_meta::MetaEngine;
use deskfs_vfs::{Vfs, VfsConfig};
use serde_json::json;

use crate::home::{self, is_mountpoint, mounts_of, ws_dir, MountRecord, WorkspaceConfig};
use crate::keeper::LastBackup;

/// Arguments of `deskfs mount`.
#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// Workspace name.
    pub name: String,
    /// Existing directory to mount on (empty: files already in it are hidden while
    /// mounted, with a warning).
    pub mountpoint: PathBuf,
    /// Cache directory (staging files + block cache). Default: the workspace's data dir.
    /// Must stay the same while unuploaded data exists.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Cap on evictable cached data (blocks, clean copies), e.g. 10G. Dirty data is never evicted.
    #[arg(long, default_value = "10G", value_parser = crate::size::parse_size)]
    pub cache_size: u64,
    /// Stay in the foreground (logs to stderr; Ctrl-C unmounts).
    #[arg(long)]
    pub foreground: bool,
    /// Let other users access the mount (FUSE allow_other; kernel permission checks apply).
    #[arg(long)]
    pub allow_other: bool,
    /// Memory all block fetches and upload buffers may hold together, e.g. 64M (at
    /// least 4M): past it readahead is skipped and other fetches and uploads wait.
    #[arg(long, default_value = "64M", value_parser = parse_buffer_memory)]
    pub buffer_memory: u64,
    /// FUSE worker threads (1..=256): requests served at once.
    #[arg(long, default_value_t = 4, value_parser = parse_threads)]
    pub threads: usize,
    /// Metadata URL of a shared workspace not yet attached on this host
    /// (postgres://…): attaches it first, as `deskfs attach NAME --meta URL` would.
    #[arg(long)]
    pub meta: Option<String>,
    /// Session lease, seconds: a mount silent this long (crashed, paused, cut off) is
    /// expired by the others, which then take over its locks; a mount that finds itself
    /// expired is fenced and re-registers.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub lease: u64,
    /// How long an open waits, seconds, for content that only another mount's cache holds
    /// (that mount is asked to upload it at once) before failing with EIO.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub remote_wait: u64,
    /// When close and fsync return: `local` (once the data is on this machine's disk) or
    /// `bucket` (once it is in the bucket, for machines that may vanish with their disk).
    #[arg(long, default_value = "local", value_name = "local|bucket")]
    pub durability: deskfs_vfs::Durability,
    /// With --durability bucket: how long close/fsync wait for the bucket, seconds,
    /// before failing with EIO (the data stays in the local journal and is uploaded later).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub bucket_wait: u64,
    /// Delay between a file's last close and its upload, ms (coalesces rewrites).
    #[arg(long, default_value_t = 500, hide = true)]
    pub upload_delay_ms: u64,
    /// How long a directory listing from the bucket stays fresh, seconds: objects other
    /// tools add, replace or delete show up at the next `readdir` after this.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub list_ttl: u64,
    /// Never use FUSE passthrough (by default, files whose content is in the local cache
    /// are read and written by the kernel straight from it, on Linux >= 6.9 as root).
    #[arg(long)]
    pub no_passthrough: bool,
    /// When reading moves a file's access time: `relatime` (once after each change, or
    /// once a day, as ext4 by default) or `noatime` (never).
    #[arg(long, default_value = "relatime", value_name = "relatime|noatime")]
    pub atime: deskfs_vfs::AtimeMode,
    /// How long, seconds, the files a mount expired for missing its lease had open stay
    /// readable for it (it may only be paused): their inodes are not purged meanwhile.
    #[arg(long, default_value_t = 86400, hide = true, value_parser = clap::value_parser!(u64).range(1..=30 * 86400))]
    pub expired_open_grace: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): requests
    /// by kind with latency histograms, errors by errno, cache, uploads, bucket, locks.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// The daemon's log lines: `text`, or `json` (one JSON object per line, for log
    /// collectors).
    #[arg(long, default_value = "text", value_name = "text|json", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// `--buffer-memory`: a size (see [`crate::size::parse_size`]) of at least 4 MiB.
fn parse_buffer_memory(s: &str) -> Result<u64, String> {
    let n = crate::size::parse_size(s)?;
    if n < 4 << 20 {
        return Err(format!(
            "{s:?} is too small for the buffer memory: give at least 4M (a few 1 MiB block fetches)"
        ));
    }
    Ok(n)
}

/// `--threads`: 1 to 256 FUSE worker threads (each holds a request buffer of about
/// 1 MiB; the kernel queues requests past them).
fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ 1..=256) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of FUSE worker threads: give 1 to 256 (default 4)"
        )),
    }
}

/// Arguments of `deskfs umount`.
#[derive(Args, Debug)]
pub struct UmountArgs {
    /// Mount point to unmount.
    pub mountpoint: PathBuf,
    /// Do not wait for pending uploads (they resume at the next mount or `deskfs sync`).
    #[arg(long)]
    pub no_wait: bool,
    /// Longest wait for pending uploads, seconds; then it unmounts anyway (exit status 3)
    /// and the uploads resume at the next mount or `deskfs sync`.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub timeout: u64,
}

/// `deskfs umount` unmounted, but uploads were still pending (exit status 3): they are
/// safe in the local journal and resume at the next mount or `deskfs sync`.
#[derive(Debug)]
pub struct UnmountedWithPending(pub String);

impl std::fmt::Display for UnmountedWithPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UnmountedWithPending {}

/// Longest time a daemon whose mount went away keeps uploading before it exits (what is
/// left stays in the journal for the next mount or `deskfs sync`).
const EXIT_DRAIN: Duration = Duration::from_secs(3);

/// Set by `deskfs umount --no-wait` (control command `commit` with `"exit": "now"`): at
/// the unmount the daemon commits and exits without the upload drain, as asked (what is
/// not uploaded stays in the local journal for the next mount or `deskfs sync`).
pub(crate) static EXIT_WITHOUT_DRAIN: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether `deskfs umount --no-wait` asked for an exit without the upload drain.
fn no_drain() -> bool {
    EXIT_WITHOUT_DRAIN.load(std::sync::atomic::Ordering::SeqCst)
}

/// How long a daemon told to stop waits for the kernel to end its FUSE session after
/// detaching the mount (files still open there keep it alive); then it exits anyway.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Why the daemon stops serving.
enum Stop {
    /// The FUSE session ended (unmounted, also lazily with nothing left open).
    Unmounted(std::io::Result<()>),
    /// SIGTERM or SIGINT.
    Signal(&'static str),
}

/// Arguments of `deskfs sync`.
#[derive(Args, Debug)]
pub struct SyncArgs {
    /// Workspace name.
    pub name: String,
    /// Give up after this many seconds (exit status 1).
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
}

pub(crate) struct Opened {
    pub(crate) cfg: WorkspaceConfig,
    pub(crate) meta: Arc<dyn MetaEngine>,
    pub(crate) bucket: Bucket,
}

/// Opens a workspace's database and bucket. `mount`: for the mount daemon itself, whose
/// SQLite engine batches requests in commit windows while it is alone (every other
/// opener — checks, offline sync — commits each request).
fn open_workspace(name: &str, mount: bool) -> Result<Opened> {
    let cfg = WorkspaceConfig::load(name)?;
    let url = crate::metadb::MetaUrl::parse(&cfg.meta)?;
    let meta = if mount {
        url.open_for_mount()?
    } else {
        url.open()?
    };
    // The database must be this workspace's, with the bucket the config names.
    if let Some(rec) = crate::metadb::Record::read(&*meta)? {
        if rec.name != name {
            bail!(
                "metadata database {} holds workspace {:?}, not {name:?}; fix `meta` in {}",
                url.display(),
                rec.name,
                ws_dir(name).join("workspace.toml").display()
            );
        }
        let configured = deskfs_bucket::BucketSpec::parse(&cfg.bucket)?.url;
        if configured != rec.bucket {
            bail!(
                "workspace {name:?} is configured with bucket {configured}, but its metadata database records bucket {}; fix `bucket` in {}",
                rec.bucket,
                ws_dir(name).join("workspace.toml").display()
            );
        }
    }
    let bucket = Bucket::open(&cfg.bucket_spec()?, false)?;
    Ok(Opened { cfg, meta, bucket })
}

/// Held from a mount point's checks until the FUSE mount is in place, so two mounts of
/// one mount point started together cannot both find it free and stack (the later would
/// hide the earlier). An exclusive `flock` on `<home>/run/mountpoint-<hash>.lock`, the
/// hash (FNV-1a, 64 bits) of the resolved mount point; released when dropped or when the
/// daemon dies. Errors: the lock file cannot be made or locked.
struct MountPointLock(#[allow(dead_code)] std::fs::File);

impl MountPointLock {
    fn take(mnt: &Path) -> Result<MountPointLock> {
        let resolved = crate::home::resolve(mnt);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in resolved.as_os_str().as_encoded_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let dir = crate::home::home().join("run");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("mountpoint-{h:016x}.lock"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        f.lock()
            .with_context(|| format!("cannot lock {}", path.display()))?;
        Ok(MountPointLock(f))
    }
}

/// Refuses a mount point that cannot take workspace `name`: missing, not a directory,
/// holding a dead FUSE mount, or with something mounted there (this workspace already,
/// another workspace, or another file system: each named as such).
fn check_mountpoint(mnt: &Path, name: &str) -> Result<()> {
    let md = std::fs::metadata(mnt).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow!(
                "mount point {} does not exist; create it with `mkdir -p {}`",
                mnt.display(),
                mnt.display()
            )
        } else if e.raw_os_error() == Some(libc::ENOTCONN) {
            dead_mount_error(mnt)
        } else {
            anyhow!("cannot use mount point {}: {e}", mnt.display())
        }
    })?;
    if !md.is_dir() {
        bail!("mount point {} is not a directory", mnt.display());
    }
    if is_mountpoint(mnt) {
        if dead_fuse_mount(mnt) {
            return Err(dead_mount_error(mnt));
        }
        return Err(busy_error(mnt, name, deskfs_fuse::mountinfo::top_at(mnt)));
    }
    Ok(())
}

/// The one line for a mount point that something is mounted at (`top`: the mount table's
/// top line there, when it could be read).
fn busy_error(
    mnt: &Path,
    name: &str,
    top: Option<deskfs_fuse::mountinfo::MountLine>,
) -> anyhow::Error {
    let m = mnt.display();
    match top {
        Some(t) if t.is_deskfs() && t.source == format!("deskfs:{name}") => anyhow!(
            "workspace {name} is already mounted at {m}; use it there, or `deskfs umount {m}` first"
        ),
        Some(t) if t.is_deskfs() => {
            let other = t.source.strip_prefix("deskfs:").unwrap_or(&t.source);
            anyhow!("mount point {m} is busy: workspace {other} is mounted there (`deskfs umount {m}` first)")
        }
        Some(t) => anyhow!(
            "mount point {m} is busy: {} ({}) is mounted there (unmount it first)",
            t.source,
            t.fstype
        ),
        None => anyhow!(
            "mount point {m} is busy: something is already mounted there (unmount it first)"
        ),
    }
}

/// Warns (one line on stderr) when mount point `mnt` is not empty: allowed, as mount(8)
/// allows it, but what is there disappears from view. After every check, so that a
/// refused mount says one thing only.
fn warn_if_not_empty(mnt: &Path) {
    if std::fs::read_dir(mnt).is_ok_and(|mut rd| rd.next().is_some()) {
        eprintln!(
            "deskfs: warning: mount point {} is not empty: its files are hidden while the workspace is mounted there",
            mnt.display()
        );
    }
}

fn dead_mount_error(mnt: &Path) -> anyhow::Error {
    anyhow!(
        "mount point {} holds a dead FUSE mount (its daemon was killed); clean it with `deskfs umount {}` first",
        mnt.display(),
        mnt.display()
    )
}

/// Whether the mount at `mnt` is a FUSE mount whose daemon is gone: the kernel answers
/// `ENOTCONN`. `statfs` asks, because it always reaches the daemon (FUSE_STATFS), where a
/// `stat` of the mount point may be answered from attributes the kernel still caches. A
/// mount that gives no answer within 2 s (a stopped daemon) counts as live: busy.
fn dead_fuse_mount(mnt: &Path) -> bool {
    let p = mnt.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    // Detached: a hung mount may keep it blocked; the process ends soon after anyway.
    let _ = std::thread::Builder::new()
        .name("deskfs-probe".into())
        .spawn(move || {
            let _ = tx.send(nix::sys::statvfs::statvfs(&p));
        });
    matches!(
        rx.recv_timeout(std::time::Duration::from_secs(2)),
        Ok(Err(nix::errno::Errno::ENOTCONN))
    )
}

/// The kv key naming the cache dir the workspace was last mounted with on `host`
/// (`cache.last.<host>` = its absolute path; written at every mount, read by `fsck`).
pub(crate) fn last_cache_key(host: &str) -> String {
    format!("cache.last.{host}")
}

/// Where the cache dir of cache `id` is (kv `cache.<id>` = `HOST:PATH`).
fn cache_location(meta: &dyn MetaEngine, id: u64) -> Result<Option<(String, PathBuf)>> {
    let v = deskfs_meta::read(meta, |t| t.get_kv(&format!("cache.{id}")))?;
    let legacy = if id == 1 {
        // Caches from before ids: the workspace recorded one cache dir.
        deskfs_meta::read(meta, |t| t.get_kv("cache_dir"))?
            .map(|p| format!("{}:{p}", deskfs_vfs::hostname()))
    } else {
        None
    };
    Ok(v.or(legacy).and_then(|s| {
        s.split_once(':')
            .map(|(h, p)| (h.to_string(), PathBuf::from(p)))
    }))
}

/// The cache dir's record of the workspace it belongs to. Its files are named by inode
/// number (`staging/<ino>`, `blocks/…/<ino>.<version>.<index>`), so a cache dir serves
/// one workspace only: another workspace's mount would take them for its own inodes.
const CACHE_OWNER: &str = "workspace.json";

/// The workspace a cache dir belongs to (`<cache>/workspace.json`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct CacheOwner {
    /// Workspace name (for messages).
    workspace: String,
    /// The workspace's id (its record's, made at format), or `bucket:<URL>` for a
    /// workspace from before records.
    id: String,
}

impl CacheOwner {
    /// The owner record of workspace `cfg` (database `meta`).
    fn of(cfg: &WorkspaceConfig, meta: &dyn MetaEngine) -> Result<CacheOwner> {
        let id = crate::metadb::Record::read(meta)?
            .map(|r| r.id)
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| format!("bucket:{}", cfg.bucket));
        Ok(CacheOwner {
            workspace: cfg.name.clone(),
            id,
        })
    }

    /// The record in cache dir `dir`, if it has one.
    fn read(dir: &Path) -> Result<Option<CacheOwner>> {
        let path = dir.join(CACHE_OWNER);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                anyhow!(
                    "{} is not a deskfs cache owner record ({e}); is {} a deskfs cache dir? give another --cache-dir",
                    path.display(),
                    dir.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow!("cannot read {}: {e}", path.display())),
        }
    }

    /// Records `self` as the owner of cache dir `dir` (created if missing) unless it has
    /// an owner already: written under a temp name, flushed and linked into place, so two
    /// mounts claiming a fresh dir at once agree on the first one, and a power cut never
    /// leaves the name over an empty file. Errors: `dir` belongs to another workspace.
    fn claim(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create cache dir {}", dir.display()))?;
        if CacheOwner::read(dir)?.is_none() {
            let tmp = dir.join(format!(".{CACHE_OWNER}.{}", std::process::id()));
            let write = || -> std::io::Result<()> {
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(serde_json::to_string(self)?.as_bytes())?;
                f.sync_all()
            };
            let linked = write().and_then(|()| std::fs::hard_link(&tmp, dir.join(CACHE_OWNER)));
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .with_context(|| format!("cannot flush cache dir {}", dir.display()))?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(anyhow!(
                        "cannot write {}: {e}",
                        dir.join(CACHE_OWNER).display()
                    ))
                }
            }
        }
        self.check(dir, CacheOwner::read(dir)?.as_ref())
    }

    /// Refuses cache dir `dir` whose owner record names another workspace than `self`.
    fn check(&self, dir: &Path, owner: Option<&CacheOwner>) -> Result<()> {
        match owner {
            Some(o) if o.id != self.id && o.workspace == self.workspace => bail!(
                "cache dir {} belongs to an earlier format of workspace {:?} (before `deskfs format --force`): its files name that workspace's inodes; remove it or mount with another --cache-dir",
                dir.display(),
                self.workspace
            ),
            Some(o) if o.id != self.id => bail!(
                "cache dir {} belongs to workspace {:?}, not {:?}: two workspaces cannot share a cache dir (its files are named by inode number); mount {} with another --cache-dir",
                dir.display(),
                o.workspace,
                self.workspace,
                self.workspace
            ),
            _ => Ok(()),
        }
    }
}

/// Whether cache dir `dir` may serve workspace `o` (it records its owner, see
/// [`CacheOwner`]). A dir without a record is this workspace's when it is new, when its
/// cache id is one the workspace's metadata knows, or when it holds no cached file (made
/// by an offline command); one from before records with another id and files in it is
/// refused (another workspace's, or left from an earlier format).
pub(crate) fn check_cache_owner(
    cfg: &WorkspaceConfig,
    meta: &dyn MetaEngine,
    dir: &Path,
) -> Result<()> {
    let me = &CacheOwner::of(cfg, meta)?;
    if let Some(owner) = CacheOwner::read(dir)? {
        return me.check(dir, Some(&owner));
    }
    let Some(id) = std::fs::read_to_string(dir.join("cache-id"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    else {
        // New (or an unreadable id, which opening the cache reports).
        return Ok(());
    };
    if cache_location(meta, id)?.is_some() {
        return Ok(());
    }
    let has_files =
        |sub: &str| std::fs::read_dir(dir.join(sub)).is_ok_and(|mut rd| rd.next().is_some());
    if has_files("staging") || has_files("blocks") {
        bail!(
            "cache dir {} holds the cache of another workspace (its cache id {id} is not one of workspace {:?}): two workspaces cannot share a cache dir (its files are named by inode number); mount {} with another --cache-dir",
            dir.display(),
            cfg.name,
            cfg.name
        );
    }
    Ok(())
}

/// The cache dir to mount with. Refused: another cache dir of this host that holds
/// files not yet uploaded, while the mount would use a different one (they would wait
/// for an upload nobody does); a cache dir of another workspace (see [`CacheOwner`]).
fn cache_dir_for(o: &Opened, requested: Option<&Path>) -> Result<PathBuf> {
    let dir = requested
        .map(crate::absolute)
        .unwrap_or_else(|| ws_dir(&o.cfg.name).join("cache"));
    check_cache_owner(&o.cfg, &*o.meta, &dir)?;
    // The caches holding unuploaded files: a few index seeks, not the dirty rows (a
    // million at scale).
    let caches = deskfs_meta::read(&*o.meta, |t| t.dirty_caches())?;
    let host = deskfs_vfs::hostname();
    // A cache dir a live mount of this host uses is in good hands: its mount uploads.
    let served: Vec<PathBuf> = mounts_of(&o.cfg.name)
        .into_iter()
        .map(|m| m.cache_dir)
        .collect();
    for id in caches {
        if let Some((h, p)) = cache_location(&*o.meta, id)? {
            if h == host && p != dir && p.join("cache-id").exists() && !served.contains(&p) {
                let in_use = std::fs::read_to_string(dir.join("cache-id"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    == Some(id);
                if !in_use {
                    let n = deskfs_meta::read(&*o.meta, |t| t.dirty_in_cache(id))?;
                    bail!("workspace {} has {n} file(s) not yet uploaded whose data is in cache dir {} on this host; mount with --cache-dir {} (or run `deskfs sync {}` with it) before changing the cache dir", o.cfg.name, p.display(), p.display(), o.cfg.name);
                }
            }
        }
    }
    Ok(dir)
}

/// Refuses a mount whose places overlap (compared resolved: symlinks followed, a cache
/// dir not made yet taken at the place it will have): the cache dir and the mount point
/// (one inside the other: the cache would be written through the mount it serves, or be
/// hidden under it), the workspace's data dir inside the mount point (its database,
/// control socket and logs), and for a `file://` bucket, its directory and either the
/// mount point or the cache dir.
fn check_places(o: &Opened, mnt: &Path, cache_dir: &Path) -> Result<()> {
    let m = home::resolve(mnt);
    let c = home::resolve(cache_dir);
    if c == m {
        bail!(
            "cache dir {} is the mount point: the cache would be written through the mount it serves; give a --cache-dir outside {}",
            c.display(),
            m.display()
        );
    }
    if c.starts_with(&m) {
        bail!(
            "cache dir {} lies inside mount point {}: the cache would be written through the mount it serves; give a --cache-dir outside it",
            c.display(),
            m.display()
        );
    }
    if m.starts_with(&c) {
        bail!(
            "mount point {} lies inside cache dir {}: the mount would hide the cache it serves; mount elsewhere or give another --cache-dir",
            m.display(),
            c.display()
        );
    }
    let data = home::resolve(&ws_dir(&o.cfg.name));
    if data.starts_with(&m) {
        bail!(
            "mount point {} holds workspace {:?}'s data dir {} (its database, control socket and logs would be hidden under the mount); mount elsewhere",
            m.display(),
            o.cfg.name,
            data.display()
        );
    }
    if let Ok(crate::metadb::MetaUrl::Sqlite(db)) = crate::metadb::MetaUrl::parse(&o.cfg.meta) {
        let db = home::resolve(&db);
        if db.starts_with(&m) {
            bail!(
                "mount point {} holds workspace {:?}'s metadata database {} (the mount would hide it from every other process: status, fsck, a second mount; and its files would be reached through the mount they serve); mount elsewhere",
                m.display(),
                o.cfg.name,
                db.display()
            );
        }
    }
    let spec = o.cfg.bucket_spec()?;
    if spec.scheme == Some(deskfs_bucket::Scheme::Local) {
        let b = home::resolve(Path::new(&spec.bucket));
        for (what, p) in [("mount point", &m), ("cache dir", &c)] {
            if home::nested(&b, p) {
                bail!(
                    "bucket directory {} and {what} {} overlap (one is, or lies inside, the other): the bucket's objects and the {what}'s files would mix; give a {what} apart from the bucket directory",
                    b.display(),
                    p.display()
                );
            }
        }
    }
    Ok(())
}

/// `deskfs mount`: validates, then runs the daemon (in the foreground, or detached and
/// waiting for its readiness line).
pub fn mount(mut a: MountArgs) -> Result<()> {
    // Resolved (symlinks, `.`, `..`, a trailing `/`) before anything is mounted there:
    // the record, the mount table and `umount` then name one path.
    let mnt =
        std::fs::canonicalize(&a.mountpoint).unwrap_or_else(|_| crate::absolute(&a.mountpoint));
    a.mountpoint = mnt.clone();
    if let Some(meta) = &a.meta {
        if !ws_dir(&a.name).join("workspace.toml").exists() {
            crate::format::attach(crate::format::AttachArgs {
                name: a.name.clone(),
                meta: Some(meta.clone()),
                bucket: None,
                take_over: false,
                endpoint: None,
                region: None,
                access_key: None,
                secret_key: None,
            })?;
        }
    }
    let o = open_workspace(&a.name, false)?;
    check_mountpoint(&mnt, &a.name)?;
    let cache_dir = cache_dir_for(&o, a.cache_dir.as_deref())?;
    check_places(&o, &mnt, &cache_dir)?;
    warn_if_not_empty(&mnt);
    drop(o);
    if a.foreground {
        return run_daemon(a);
    }
    let logs = ws_dir(&a.name).join("logs");
    std::fs::create_dir_all(&logs)?;
    let log_path = logs.join(format!("mount-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path)?;
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("daemon")
        .arg(&a.name)
        .arg(&mnt)
        .arg("--cache-size")
        .arg(a.cache_size.to_string())
        .arg("--threads")
        .arg(a.threads.to_string())
        .arg("--buffer-memory")
        .arg(a.buffer_memory.to_string())
        .arg("--atime")
        .arg(a.atime.to_string())
        .arg("--expired-open-grace")
        .arg(a.expired_open_grace.to_string())
        .arg("--lease")
        .arg(a.lease.to_string())
        .arg("--remote-wait")
        .arg(a.remote_wait.to_string())
        .arg("--upload-delay-ms")
        .arg(a.upload_delay_ms.to_string())
        .arg("--list-ttl")
        .arg(a.list_ttl.to_string())
        .arg("--durability")
        .arg(a.durability.to_string())
        .arg("--bucket-wait")
        .arg(a.bucket_wait.to_string())
        .args(a.no_passthrough.then_some("--no-passthrough"))
        .env("DESKFS_DAEMON_LOG", &log_path)
        .env("DESKFS_DAEMON_READY", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    if let Some(c) = &a.cache_dir {
        cmd.arg("--cache-dir").arg(crate::absolute(c));
    }
    if a.allow_other {
        cmd.arg("--allow-other");
    }
    if let Some(m) = a.metrics {
        cmd.arg("--metrics").arg(m.to_string());
    }
    cmd.arg("--log-format").arg(&a.log_format);
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the mount daemon")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no daemon stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() == "READY" {
        println!(
            "mounted workspace {} at {} (daemon pid {}, log {})",
            a.name,
            mnt.display(),
            child.id(),
            log_path.display()
        );
        return Ok(());
    }
    let _ = child.wait();
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let last = log_text
        .lines()
        .rev()
        .find(|l| l.contains("error"))
        .unwrap_or_else(|| log_text.lines().last().unwrap_or("daemon exited"))
        .trim()
        .trim_start_matches("deskfs: error: ")
        .to_string();
    bail!("mount failed: {last} (log {})", log_path.display())
}

/// The mount daemon: serves FUSE until unmounted, then drains uploads briefly.
/// Refuses a bucket that answers without this workspace's format record
/// (`.deskfs/format.json`, written by `deskfs format`): an empty one (a disk not mounted
/// at a `file://` path, a wrong prefix) or another workspace's. Mounting on it would
/// take every file it does not list as deleted by another tool. A record that cannot be
/// read now (the bucket failing) is not a refusal: the mount works offline.
fn check_bucket_is_this_workspaces(o: &Opened, rt: &tokio::runtime::Runtime) -> Result<()> {
    let Some(rec) = crate::metadb::Record::read(&*o.meta)? else {
        return Ok(());
    };
    match crate::format::bucket_workspace(&o.bucket, rt) {
        Ok(None) => bail!(
            "bucket {} holds no deskfs format record ({}): it is empty or not workspace {:?}'s bucket (a disk not mounted there, a wrong prefix?); mounting would take every file as deleted. Check the bucket URL in {}",
            o.cfg.bucket,
            crate::format::FORMAT_RECORD,
            o.cfg.name,
            crate::home::ws_dir(&o.cfg.name).join("workspace.toml").display()
        ),
        Ok(Some(found)) => match found.id {
            Some(id) if !rec.id.is_empty() && id != rec.id => bail!(
                "bucket {} holds another deskfs workspace (id {id}) than {:?} (id {}); check the bucket URL in {}",
                o.cfg.bucket,
                o.cfg.name,
                rec.id,
                crate::home::ws_dir(&o.cfg.name).join("workspace.toml").display()
            ),
            _ => Ok(()),
        },
        Err(e) => {
            tracing::warn!("cannot read the bucket's format record now ({e}); mounting anyway");
            Ok(())
        }
    }
}

pub fn run_daemon(a: MountArgs) -> Result<()> {
    limit_malloc_arenas();
    let mnt = crate::absolute(&a.mountpoint);
    let o = open_workspace(&a.name, true)?;
    let mount_point_lock = MountPointLock::take(&mnt)?;
    check_mountpoint(&mnt, &a.name)?;
    let cache_dir = cache_dir_for(&o, a.cache_dir.as_deref())?;
    check_places(&o, &mnt, &cache_dir)?;
    // (`deskfs mount` warned of a non-empty mount point.)
    CacheOwner::of(&o.cfg, &*o.meta)?.claim(&cache_dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .thread_name("deskfs-io")
        .build()?;
    match rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), o.bucket.check()).await })
    {
        Ok(Ok(())) => check_bucket_is_this_workspaces(&o, &rt)?,
        Ok(Err(BucketError::Unreachable(e))) | Ok(Err(BucketError::Other(e))) => {
            tracing::warn!("bucket not reachable now ({e}); mounting anyway: cached data and all writes work, uploads wait")
        }
        Ok(Err(e)) => return Err(anyhow!(e).context(format!("cannot use bucket {}", o.cfg.bucket))),
        Err(_) => {
            tracing::warn!("bucket did not answer within 10 s; mounting anyway, uploads wait")
        }
    }
    let keeper = crate::keeper::for_workspace(&o, rt.handle())?;
    let cache = Arc::new(Cache::open(
        &cache_dir,
        a.cache_size,
        deskfs_cache::DEFAULT_BLOCK_SIZE,
    )?);
    let loc = format!("{}:{}", deskfs_vfs::hostname(), cache_dir.display());
    let key = format!("cache.{}", cache.id());
    let last = last_cache_key(&deskfs_vfs::hostname());
    let dir_text = cache_dir.display().to_string();
    deskfs_meta::txn(&*o.meta, |t| {
        t.set_kv(&key, &loc)?;
        t.set_kv(&last, &dir_text)
    })?;
    let cfg = VfsConfig {
        default_uid: nix::unistd::getuid().as_raw(),
        default_gid: nix::unistd::getgid().as_raw(),
        lease: Duration::from_secs(a.lease),
        remote_wait: Duration::from_secs(a.remote_wait),
        upload_delay: Duration::from_millis(a.upload_delay_ms),
        list_ttl: Duration::from_secs(a.list_ttl),
        durability: a.durability,
        bucket_wait: Duration::from_secs(a.bucket_wait),
        passthrough: !a.no_passthrough,
        buffer_limit: a.buffer_memory,
        atime: a.atime,
        expired_open_grace: Duration::from_secs(a.expired_open_grace),
        // Workspaces formatted with a format record (all but the oldest): the bucket must
        // keep it for listings to count as deletions.
        bucket_marker: crate::metadb::Record::read(&*o.meta)?
            .map(|_| crate::format::FORMAT_RECORD.to_string()),
        ..VfsConfig::default()
    };
    let meta: Arc<dyn MetaEngine> = o.meta.clone();
    let vfs = Vfs::new(meta, o.bucket.clone(), cache, cfg, rt.handle().clone())?;
    if let Some(addr) = a.metrics {
        crate::metrics::serve(addr, vfs.clone(), &rt)?;
    }
    let opts = deskfs_fuse::MountOptions {
        allow_other: a.allow_other,
        threads: a.threads,
        fsname: format!("deskfs:{}", a.name),
        ..Default::default()
    };
    let handle = deskfs_fuse::mount(vfs.clone(), &mnt, &opts)
        .with_context(|| format!("cannot mount FUSE at {}", mnt.display()))?;
    drop(mount_point_lock);
    let own_dev = handle.device();
    let own_mount = own_dev.map_or(Expect::AnyDeskfs, Expect::Dev);
    let inval = std::sync::Mutex::new(handle.invalidator());
    vfs.set_invalidator(Box::new(move |inv| {
        if let Ok(i) = inval.lock() {
            let _ = match inv {
                // offset 0, len 0: drop cached attributes and every cached page.
                deskfs_vfs::Invalidation::Inode(ino) => i.inval_inode(*ino, 0, 0),
                // offset -1: attributes only, no page is touched.
                deskfs_vfs::Invalidation::Attrs(ino) => i.inval_inode(*ino, -1, 0),
                deskfs_vfs::Invalidation::Entry { parent, name } => i.inval_entry(*parent, name),
            };
        }
    }));
    let pid = std::process::id();
    let run_dir = ws_dir(&a.name).join("run");
    std::fs::create_dir_all(&run_dir)?;
    let sock = control_socket_path(&run_dir, pid)?;
    if let Some(k) = &keeper {
        // Under --durability bucket, fsync/fsyncdir also wait for the metadata backup.
        let k = k.clone();
        vfs.set_namespace_barrier(Box::new(move || {
            k.flush().map(|_| ()).map_err(|e| e.to_string())
        }));
    }
    crate::control::serve(&sock, vfs.clone(), keeper.clone())?;
    let keeper_thread = match &keeper {
        Some(k) => Some(k.start()?),
        None => None,
    };
    let rec = MountRecord {
        workspace: a.name.clone(),
        pid,
        mountpoint: mnt.clone(),
        socket: sock.clone(),
        cache_dir: cache_dir.clone(),
        log: std::env::var_os("DESKFS_DAEMON_LOG").map(PathBuf::from),
        dev: own_dev,
    };
    let rec_path = MountRecord::path(&a.name, pid);
    std::fs::write(&rec_path, serde_json::to_string_pretty(&rec)?)?;
    // The session's end and stop signals both end serving (see `Stop`).
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<Stop>();
    let tx = stop_tx.clone();
    rt.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install SIGTERM/SIGINT handlers");
            return;
        };
        let name = tokio::select! { _ = term.recv() => "SIGTERM", _ = int.recv() => "SIGINT" };
        let _ = tx.send(Stop::Signal(name));
    });
    tracing::info!(workspace = %a.name, mountpoint = %mnt.display(), "mounted");
    crate::systemd_cmd::notify(&format!("READY=1\nSTATUS=mounted at {}", mnt.display()));
    if std::env::var_os("DESKFS_DAEMON_READY").is_some() {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "READY");
        let _ = out.flush();
        // Detach stdout from the parent's pipe.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            use std::os::fd::AsRawFd;
            // SAFETY: dup2 onto fd 1 with a valid open fd; no Rust object owns fd 1.
            unsafe {
                libc::dup2(null.as_raw_fd(), 1);
            }
        }
    } else {
        eprintln!(
            "mounted workspace {} at {} (Ctrl-C to unmount)",
            a.name,
            mnt.display()
        );
    }
    std::thread::Builder::new()
        .name("deskfs-session".into())
        .spawn(move || {
            let _ = stop_tx.send(Stop::Unmounted(handle.join()));
        })
        .context("cannot start the session thread")?;
    let stop = stop_rx.recv();
    crate::systemd_cmd::notify("STOPPING=1");
    let res = match stop {
        Ok(Stop::Unmounted(res)) => {
            if no_drain() {
                tracing::info!("unmounted with --no-wait; committing and exiting, pending uploads stay in the local journal");
                if let Err(e) = vfs.shutdown(false, Duration::ZERO) {
                    tracing::warn!(error = %e, "cannot commit open files at exit");
                }
            } else {
                tracing::info!(
                    "unmounted; committing and uploading for up to {} s",
                    EXIT_DRAIN.as_secs()
                );
                if let Err(e) = vfs.shutdown(true, EXIT_DRAIN) {
                    tracing::debug!(error = %e, "drain at exit incomplete");
                }
            }
            res
        }
        Ok(Stop::Signal(name)) => {
            tracing::info!(
                "{name} received: detaching {} and exiting; pending uploads stay in the local journal",
                mnt.display()
            );
            if let Err(e) = unmount(&mnt, true, own_mount) {
                tracing::warn!(error = %e, "lazy unmount at stop");
            }
            // Files still open under the detached tree keep the session alive: they get
            // ENOTCONN once this process exits.
            match stop_rx.recv_timeout(STOP_GRACE) {
                Ok(Stop::Unmounted(_)) => {}
                _ => tracing::warn!(
                    "the FUSE session is still in use (files open under the detached mount); exiting anyway"
                ),
            }
            if let Err(e) = vfs.shutdown(false, Duration::ZERO) {
                tracing::warn!(error = %e, "cannot commit open files at stop");
            }
            Ok(())
        }
        Err(_) => Ok(()),
    };
    log_left_pending(&vfs);
    let _ = std::fs::remove_file(&rec_path);
    let _ = std::fs::remove_file(&sock);
    let last_backup = match &keeper {
        Some(k) => {
            let others = mounts_of(&a.name).iter().any(|m| m.pid != pid);
            k.finish(keeper_thread, others, KEEPER_LIMIT)
        }
        None => LastBackup::Ended,
    };
    drop(vfs);
    // Uploads still in flight are abandoned (each is redone from the journal); after a
    // drain they get a moment to finish, after --no-wait none.
    let in_flight = if no_drain() {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(2)
    };
    last_backup.shut_down(rt, in_flight);
    res.context("FUSE session ended with an error")
}

/// glibc's allocator gives each thread that allocates concurrently an arena of its own
/// (up to 8 per core) and keeps what each one freed for it: with the FUSE workers, the
/// uploader's runtime and its blocking pool, the daemon's resident memory grew well past
/// what it held live (113 MiB resident for 200,000 files created; 97 MiB with two arenas).
/// Two arenas keep the contention low for the handful of threads that allocate on the
/// request path. Called before any thread starts; a value set in `MALLOC_ARENA_MAX`
/// wins. No effect with other C libraries.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; no threads exist yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// How long a stopping daemon (or an offline sync) waits for the last metadata backup.
const KEEPER_LIMIT: Duration = Duration::from_secs(5);

/// Logs what the daemon leaves pending at exit (safe in the journal for the next mount).
fn log_left_pending(vfs: &Vfs) {
    match deskfs_vfs::PendingSummary::read(&**vfs.meta(), 5) {
        Ok(p) if p.pending > 0 => tracing::warn!(
            "exiting with {p} left in the local journal; they upload at the next mount or `deskfs sync`"
        ),
        Ok(_) => tracing::info!("exiting with nothing left to upload"),
        Err(e) => tracing::warn!(error = %e, "cannot read what is left to upload"),
    }
}

/// Where the control socket goes: `run/PID.sock` in the workspace dir, or, when that path
/// is too long for a Unix socket (108 bytes, `sun_path`), a private directory under the
/// temp dir (`deskfs-UID/`, mode 0700) with a name derived from the workspace dir.
fn control_socket_path(run_dir: &Path, pid: u32) -> Result<PathBuf> {
    let p = run_dir.join(format!("{pid}.sock"));
    if p.as_os_str().len() < 100 {
        return Ok(p);
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    run_dir.hash(&mut h);
    let dir = std::env::temp_dir().join(format!("deskfs-{}", nix::unistd::getuid().as_raw()));
    std::fs::create_dir_all(&dir)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir.join(format!("{:016x}-{pid}.sock", h.finish())))
}

/// Unmounts the FUSE mount at `mnt` (`lazy`: detach now, finish when the last user goes):
/// as root with `umount2(2)` itself, as another user through `fusermount3 -u` (the setuid
/// helper of fuse3, the only way an unprivileged user may unmount).
/// Which mount [`unmount`] may take off a mount point.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The deskfs mount with this device number (a daemon's own, from its record).
    Dev((u32, u32)),
    /// Any deskfs mount (one whose daemon is gone or never recorded its device).
    AnyDeskfs,
}

/// Refuses when the top mount at `mnt` is not the one `expect` names: `umount2` and
/// fusermount3 take off whatever was mounted last, which may be a bind mount or another
/// file system mounted over the workspace.
fn check_top(mnt: &Path, expect: Expect) -> Result<()> {
    let Some(top) = deskfs_fuse::mountinfo::top_at(mnt) else {
        bail!("{} is not a mount point", mnt.display());
    };
    let ours = match expect {
        Expect::Dev(d) => top.dev == d,
        Expect::AnyDeskfs => top.is_deskfs(),
    };
    if !ours {
        bail!(
            "the mount on top of {} is {} ({}), not this deskfs mount: something was mounted over it; unmount that first (`umount {}`), then retry",
            mnt.display(),
            top.source,
            top.fstype,
            mnt.display()
        );
    }
    Ok(())
}

fn unmount(mnt: &Path, lazy: bool, expect: Expect) -> Result<()> {
    check_top(mnt, expect)?;
    if nix::unistd::geteuid().is_root() {
        let flags = if lazy {
            nix::mount::MntFlags::MNT_DETACH
        } else {
            nix::mount::MntFlags::empty()
        };
        return nix::mount::umount2(mnt, flags).map_err(|e| anyhow::anyhow!("{e}"));
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg(mnt)
        .output()
        .context("cannot run fusermount3 (apt-get install fuse3)")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        bail!("{err}");
    }
    Ok(())
}

pub(crate) fn spinner(msg: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new_spinner();
    // One line, cut at the terminal's width (the message names paths and errors).
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {wide_msg}") {
        pb.set_style(style);
    }
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// How often a wait that is not on a terminal logs what it waits for.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(5);

/// Shows what a wait waits for while it lasts, read from the metadata database: on a
/// terminal a progress line (updated 4 times a second), otherwise a line on stderr every
/// [`WAIT_LOG_EVERY`]. Stops when `pb` is finished.
fn watch_pending(cfg: &WorkspaceConfig, pb: indicatif::ProgressBar) -> std::thread::JoinHandle<()> {
    use std::io::IsTerminal;
    let url = crate::metadb::MetaUrl::parse(&cfg.meta);
    let tty = std::io::stderr().is_terminal();
    std::thread::spawn(move || {
        let Ok(meta) = url.and_then(|u| u.open()) else {
            return;
        };
        let start = Instant::now();
        let mut last_log = Instant::now();
        while !pb.is_finished() {
            if let Ok(p) = deskfs_vfs::PendingSummary::read(&*meta, 3) {
                let line = format!("waiting for {p}");
                if tty {
                    pb.set_message(line);
                } else if p.pending > 0 && last_log.elapsed() >= WAIT_LOG_EVERY {
                    last_log = Instant::now();
                    eprintln!("deskfs: {line} ({} s so far)", start.elapsed().as_secs());
                }
            }
            // Short sleeps: the wait ends as soon as the caller finishes `pb`.
            for _ in 0..5 {
                if pb.is_finished() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    })
}

/// A spinner that draws only on a terminal (elsewhere `watch_pending` logs lines).
pub(crate) fn wait_spinner(msg: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        spinner(msg)
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// The paths a mount point given to `umount` may be recorded under, the first the one
/// to name in messages: as given (made absolute), with its parent resolved, and what a
/// symlink there points to. The mount point itself is never resolved through a stat: a
/// stopped daemon's mount would not answer.
fn mount_point_spellings(given: &Path) -> Vec<PathBuf> {
    let abs = crate::absolute(given);
    let mut out = vec![abs.clone()];
    if let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) {
        if let Ok(p) = std::fs::canonicalize(parent) {
            let resolved = p.join(name);
            // A mount point is no symlink; only a path that is not one is read as a
            // link (reading a mount point would ask its file system).
            if deskfs_fuse::mountinfo::top_at(&resolved).is_none() {
                if let Ok(target) = std::fs::read_link(&resolved) {
                    if let Ok(t) = std::fs::canonicalize(p.join(target)) {
                        out.push(t);
                    }
                }
            }
            out.push(resolved);
        }
    }
    out
}

/// `deskfs umount`.
pub fn umount(a: UmountArgs) -> Result<()> {
    let spellings = mount_point_spellings(&a.mountpoint);
    let mnt = spellings[0].clone();
    let rec = home::all_mounts()
        .into_iter()
        .find(|r| spellings.contains(&r.mountpoint));
    let mnt = rec.as_ref().map_or(mnt, |r| r.mountpoint.clone());
    let Some(rec) = rec else {
        if is_mountpoint(&mnt) {
            unmount(&mnt, false, Expect::AnyDeskfs)
                .with_context(|| format!("cannot unmount {}", mnt.display()))?;
            println!(
                "unmounted {} (no live deskfs daemon was serving it)",
                mnt.display()
            );
            return Ok(());
        }
        bail!("{} is not a deskfs mount point", mnt.display());
    };
    if home::pid_stopped(rec.pid) {
        bail!(
            "the deskfs daemon serving {} (pid {}) is stopped (SIGSTOP or a debugger): it can neither upload nor unmount; resume it with `kill -CONT {}` and retry, or end it with `kill {}` (what it committed is kept; the next mount recovers the rest)",
            mnt.display(),
            rec.pid,
            rec.pid,
            rec.pid
        );
    }
    let expect = rec.dev.map_or(Expect::AnyDeskfs, Expect::Dev);
    // Before any wait: the unmount at the end would take off another file system.
    check_top(&mnt, expect)?;
    // `Some(what)` when uploads were still pending as the wait ended.
    let mut left: Option<String> = None;
    if a.no_wait {
        crate::control::request(
            &rec.socket,
            json!({"cmd": "commit", "exit": "now"}),
            Some(Duration::from_secs(60)),
        )?;
    } else {
        let pb = wait_spinner("waiting for uploads");
        let cfg = WorkspaceConfig::load(&rec.workspace)?;
        let w = watch_pending(&cfg, pb.clone());
        let r = crate::control::request(
            &rec.socket,
            json!({"cmd": "sync", "timeout": a.timeout}),
            // The daemon answers at its own timeout; a daemon that cannot answer at all
            // (stuck) must not hold the unmount either.
            Some(Duration::from_secs(a.timeout + 15)),
        );
        pb.finish_and_clear();
        let _ = w.join();
        let backup_only = r.as_ref().err().and_then(|e| {
            e.downcast_ref::<crate::control::DaemonError>()
                .filter(|d| d.stage == Some(crate::control::Stage::Backup))
        });
        if let Some(d) = backup_only {
            // Every upload landed; only the record of the namespace did not. The change
            // marks stay in the database: the next mount or `deskfs sync` writes them.
            eprintln!(
                "deskfs: every upload reached the bucket, but the metadata backup did not: {}",
                d.msg
            );
            left = Some("the metadata backup of the latest changes".to_string());
        } else if let Err(e) = r {
            // Commit what is open (the sync did, unless the daemon did not answer).
            let _ = crate::control::request(
                &rec.socket,
                json!({"cmd": "commit"}),
                Some(Duration::from_secs(10)),
            );
            let what = match crate::metadb::MetaUrl::parse(&cfg.meta)
                .and_then(|u| u.open())
                .and_then(|m| Ok(deskfs_vfs::PendingSummary::read(&*m, 3)?))
            {
                Ok(p) => p.to_string(),
                Err(_) => format!("uploads ({e:#})"),
            };
            if e.downcast_ref::<crate::control::DaemonError>().is_some() {
                eprintln!(
                    "deskfs: uploads did not finish within {} s (waiting for {what}); unmounting anyway",
                    a.timeout
                );
            } else {
                eprintln!(
                    "deskfs: the daemon (pid {}) did not answer the sync request ({e:#}); unmounting anyway (left: {what})",
                    rec.pid
                );
            }
            left = Some(what);
        }
    }
    unmount(&mnt, false, expect).map_err(|e| {
        anyhow!(
            "cannot unmount {}: {e}; close the files and shells using it, then retry",
            mnt.display()
        )
    })?;
    let start = Instant::now();
    while home::pid_alive(rec.pid) {
        if start.elapsed() > Duration::from_secs(30) {
            bail!(
                "unmounted {}, but daemon {} is still running",
                mnt.display(),
                rec.pid
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(what) = left {
        if !rec.cache_dir.join("staging").is_dir() {
            return Err(UnmountedWithPending(format!(
                "unmounted {}, but {what} did not reach the bucket, and cache dir {} that held them is gone: their unuploaded content is lost (the next mount makes those files empty); `deskfs fsck {} --rebuild-from-bucket --force` takes the bucket's versions instead",
                mnt.display(),
                rec.cache_dir.display(),
                rec.workspace
            ))
            .into());
        }
        return Err(UnmountedWithPending(format!(
            "unmounted {}, but {what} did not reach the bucket yet: they are safe in the local journal (cache dir {}) and upload at the next mount or `deskfs sync {}`",
            mnt.display(),
            rec.cache_dir.display(),
            rec.workspace
        ))
        .into());
    }
    println!("unmounted {}", mnt.display());
    Ok(())
}

/// `deskfs sync`.
pub fn sync(a: SyncArgs) -> Result<()> {
    let mounts = mounts_of(&a.name);
    let cfg = WorkspaceConfig::load(&a.name)?;
    let timeout = Duration::from_secs(a.timeout);
    let pb = wait_spinner("waiting for uploads");
    let w = watch_pending(&cfg, pb.clone());
    let res = if !mounts.is_empty() {
        let mut r = Ok(());
        for m in &mounts {
            if let Err(e) = crate::control::request(
                &m.socket,
                json!({"cmd": "sync", "timeout": a.timeout}),
                None,
            ) {
                r = Err(e);
            }
        }
        r
    } else {
        offline_sync(&a.name, timeout)
    };
    pb.finish_and_clear();
    let _ = w.join();
    res?;
    println!("workspace {} is in sync with its bucket", a.name);
    Ok(())
}

fn offline_sync(name: &str, timeout: Duration) -> Result<()> {
    let o = open_workspace(name, false)?;
    // The cache dir of this host that holds unuploaded files, else the default.
    let host = deskfs_vfs::hostname();
    let dirty = deskfs_meta::read(&*o.meta, |t| t.dirty_inodes())?;
    let mut cache_dir = ws_dir(name).join("cache");
    for r in &dirty {
        if let deskfs_meta::Local::At(c) = r.local {
            if let Some((h, p)) = cache_location(&*o.meta, c)? {
                if h == host {
                    cache_dir = p;
                    break;
                }
            }
        }
    }
    let me = CacheOwner::of(&o.cfg, &*o.meta)?;
    check_cache_owner(&o.cfg, &*o.meta, &cache_dir)?;
    me.claim(&cache_dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let cache = Arc::new(Cache::open(
        &cache_dir,
        10 << 30,
        deskfs_cache::DEFAULT_BLOCK_SIZE,
    )?);
    let meta: Arc<dyn MetaEngine> = o.meta.clone();
    let vfs = Vfs::new(
        meta,
        o.bucket.clone(),
        cache,
        VfsConfig::default(),
        rt.handle().clone(),
    )?;
    let r = vfs.shutdown(true, timeout);
    drop(vfs);
    let (r, last) = match r {
        Err(e) => (Err(anyhow::Error::from(e)), LastBackup::Ended),
        // After the uploads, the metadata backup: a new machine rebuilds this state.
        Ok(()) => {
            let rth = rt.handle().clone();
            let keeper = std::thread::spawn(move || -> (Result<()>, LastBackup) {
                let k = match crate::keeper::for_workspace(&o, &rth) {
                    Ok(Some(k)) => k,
                    Ok(None) => return (Ok(()), LastBackup::Ended),
                    Err(e) => return (Err(e), LastBackup::Ended),
                };
                let r = k.flush().map(|_| ());
                let last = k.finish(None, !mounts_of(&o.cfg.name).is_empty(), KEEPER_LIMIT);
                (r, last)
            });
            keeper.join().unwrap_or_else(|_| {
                (
                    Err(anyhow!("metadata backup thread panicked")),
                    LastBackup::Ended,
                )
            })
        }
    };
    last.shut_down(rt, Duration::from_secs(2));
    r
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_busy_mount_point_names_what_is_mounted_there() {
        let line = |fstype: &str, source: &str| deskfs_fuse::mountinfo::MountLine {
            dev: (0, 50),
            point: PathBuf::from("/m"),
            fstype: fstype.into(),
            source: source.into(),
        };
        let msg = |top| busy_error(Path::new("/m"), "work", top).to_string();
        assert_eq!(
            msg(Some(line("fuse.deskfs", "deskfs:work"))),
            "workspace work is already mounted at /m; use it there, or `deskfs umount /m` first"
        );
        let other = msg(Some(line("fuse.deskfs", "deskfs:workshop")));
        assert!(
            other.contains("busy: workspace workshop is mounted there"),
            "{other}"
        );
        let tmpfs = msg(Some(line("tmpfs", "scratch")));
        assert!(
            tmpfs.contains("busy: scratch (tmpfs) is mounted there"),
            "{tmpfs}"
        );
        assert!(msg(None).contains("busy: something is already mounted there"));
    }

    fn owner(name: &str, id: &str) -> CacheOwner {
        CacheOwner {
            workspace: name.to_string(),
            id: id.to_string(),
        }
    }

    #[test]
    fn a_cache_dir_serves_the_workspace_that_claimed_it_only() {
        let t = crate::home::test_dir("cache-owner");
        let dir = t.join("cache");
        let a = owner("a", "id-a");
        a.claim(&dir).unwrap();
        assert_eq!(CacheOwner::read(&dir).unwrap(), Some(a.clone()));
        // The same workspace again (a second mount, a later one): fine.
        a.claim(&dir).unwrap();
        a.check(&dir, CacheOwner::read(&dir).unwrap().as_ref())
            .unwrap();
        // Another workspace: refused, naming both; the record is unchanged.
        let e = owner("b", "id-b").claim(&dir).unwrap_err().to_string();
        assert!(e.contains("belongs to workspace \"a\", not \"b\""), "{e}");
        assert!(e.contains("another --cache-dir"), "{e}");
        // The same name formatted again (another id): refused as an earlier format.
        let e = owner("a", "id-a2").claim(&dir).unwrap_err().to_string();
        assert!(e.contains("earlier format of workspace \"a\""), "{e}");
        assert_eq!(CacheOwner::read(&dir).unwrap(), Some(a));
        // A damaged record is reported, never taken over.
        std::fs::write(dir.join(CACHE_OWNER), b"").unwrap();
        let e = owner("b", "id-b").claim(&dir).unwrap_err().to_string();
        assert!(e.contains("not a deskfs cache owner record"), "{e}");
        let _ = std::fs::remove_dir_all(&t);
    }
}
