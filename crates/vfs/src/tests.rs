//! In-process tests of the VFS core: every operation driven directly on [`Vfs`] (no kernel
//! mount), over a SQLite metadata engine, a local-directory bucket and a cache dir in a
//! temp dir. Bucket fidelity is checked by reading the bucket directory directly.
//!
//! Layout: this file holds the [`Harness`] and helpers; the submodules in `tests/` hold
//! the tests, one module per area.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deskfs_bucket::{Bucket, BucketSpec};
use deskfs_cache::Cache;
use deskfs_meta::postgres::PgEngine;
use deskfs_meta::sqlite::SqliteEngine;
use deskfs_meta::{InodeRow, MetaEngine};

use crate::{now_ns, Attr, Ctx, DirEntry, Ino, Kind, Result, Vfs, VfsConfig, ROOT_INO};

mod bucket;
mod change_ring;
mod converge;
mod data;
mod durability;
mod feed;
mod fill;
mod fsck;
mod import;
mod links;
mod locks;
mod namespace;
mod passthrough;
mod persist;
mod readdir;
mod remote;
mod rename;
mod setattr;
mod unlink;
mod xattr;

/// The caller of every request in these tests (not root, so ownership is visible).
pub(crate) const CTX: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 4242,
};

/// How long `sync` may wait for the uploader in a test.
pub(crate) const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// The configuration tests use unless they need another: a short coalescing delay.
pub(crate) fn test_cfg() -> VfsConfig {
    VfsConfig {
        upload_delay: Duration::from_millis(10),
        burst_quiet: Duration::ZERO,
        ..Default::default()
    }
}

/// The metadata database of a test workspace: SQLite (`meta.db` in the temp dir), or —
/// with `DESKFS_TEST_META=postgres` — a fresh schema in the PostgreSQL database of
/// `DESKFS_TEST_PG_URL`, dropped at the end. So every VFS test runs against either engine.
pub(crate) enum MetaDb {
    /// SQLite file.
    Sqlite(PathBuf),
    /// PostgreSQL URL with its `schema=` parameter.
    Postgres(String),
}

impl MetaDb {
    /// A new, empty database for the engine the environment selects.
    fn create(dir: &Path) -> (MetaDb, Arc<dyn MetaEngine>) {
        if std::env::var("DESKFS_TEST_META").as_deref() == Ok("postgres") {
            let base = std::env::var("DESKFS_TEST_PG_URL")
                .expect("DESKFS_TEST_META=postgres needs DESKFS_TEST_PG_URL");
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let schema = format!(
                "vt_{}_{}_{}",
                std::process::id(),
                N.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                now_ns() % 1_000_000
            );
            let sep = if base.contains('?') { '&' } else { '?' };
            let url = format!("{base}{sep}schema={schema}");
            let e = PgEngine::create(&url, 0, 0, now_ns()).expect("create PostgreSQL workspace");
            (MetaDb::Postgres(url), Arc::new(e))
        } else {
            let p = dir.join("meta.db");
            let e = SqliteEngine::create(&p, 0, 0, now_ns()).expect("create meta db");
            // As the mount daemon runs it: commit windows while alone.
            assert!(e
                .enable_commit_window(deskfs_meta::sqlite::WindowConfig::default())
                .expect("commit windows"));
            (MetaDb::Sqlite(p), Arc::new(e))
        }
    }

    /// Another connection to the same database (a tool, or a second mount).
    pub(crate) fn open(&self) -> Arc<dyn MetaEngine> {
        match self {
            MetaDb::Sqlite(p) => Arc::new(SqliteEngine::open(p).expect("reopen meta db")),
            MetaDb::Postgres(u) => Arc::new(PgEngine::open(u).expect("reopen PostgreSQL")),
        }
    }

    /// The database as a restarted mount daemon opens it (SQLite: with commit windows).
    pub(crate) fn open_mount(&self) -> Arc<dyn MetaEngine> {
        match self {
            MetaDb::Sqlite(p) => {
                let e = SqliteEngine::open(p).expect("reopen meta db");
                assert!(e
                    .enable_commit_window(deskfs_meta::sqlite::WindowConfig::default())
                    .expect("commit windows"));
                Arc::new(e)
            }
            MetaDb::Postgres(u) => Arc::new(PgEngine::open(u).expect("reopen PostgreSQL")),
        }
    }
}

impl Drop for MetaDb {
    fn drop(&mut self) {
        if let MetaDb::Postgres(u) = self {
            let _ = PgEngine::destroy(u);
        }
    }
}

/// One workspace in a temp dir: the metadata database ([`MetaDb`]), `bucket/` (the local
/// bucket), `cache/`, plus the tokio runtime the VFS runs its background work on. Derefs
/// to the live [`Vfs`].
pub(crate) struct Harness {
    vfs: Option<Arc<Vfs>>,
    rt: Option<tokio::runtime::Runtime>,
    pub(crate) db: MetaDb,
    pub(crate) tmp: tempfile::TempDir,
    pub(crate) cfg: VfsConfig,
    /// The cache's cap, bytes (64 MiB unless [`Harness::with_cache_capacity`]).
    cache_cap: u64,
}

impl Deref for Harness {
    type Target = Vfs;
    fn deref(&self) -> &Vfs {
        self.vfs.as_ref().expect("vfs is mounted")
    }
}

/// Polls `f` every 5 ms until it is true or `timeout` passes; returns its last value.
pub(crate) fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The errno of a result that must be an error.
#[track_caller]
pub(crate) fn errno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.errno(),
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), distinct per seed.
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

impl Harness {
    /// A fresh, empty workspace with [`test_cfg`].
    pub(crate) fn new() -> Harness {
        Harness::build(test_cfg(), |_| {})
    }

    /// A fresh workspace whose uploader waits an hour before it uploads a change: files
    /// stay dirty, their only copy the staging file, until a test syncs.
    pub(crate) fn uploads_held() -> Harness {
        Harness::with_config(VfsConfig {
            upload_delay: Duration::from_secs(3600),
            ..test_cfg()
        })
    }

    /// A fresh workspace with `cfg`.
    pub(crate) fn with_config(cfg: VfsConfig) -> Harness {
        Harness::build(cfg, |_| {})
    }

    /// A fresh workspace whose cache holds at most `cap` bytes (1: every clean file is
    /// over the cap).
    pub(crate) fn with_cache_capacity(cap: u64) -> Harness {
        let mut h = Harness::new();
        h.cache_cap = cap;
        h.remount();
        h
    }

    /// A workspace whose bucket directory is first filled by `fill` (objects written by
    /// "another tool" before the first mount), then formatted and mounted.
    pub(crate) fn build(cfg: VfsConfig, fill: impl FnOnce(&Path)) -> Harness {
        let tmp = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(tmp.path().join("bucket")).unwrap();
        fill(&tmp.path().join("bucket"));
        let (db, meta) = MetaDb::create(tmp.path());
        let rt = runtime();
        let cache_cap = 64 << 20;
        let vfs = Self::open_vfs(tmp.path(), meta, &cfg, cache_cap, rt.handle());
        Harness {
            tmp,
            db,
            rt: Some(rt),
            vfs: Some(vfs),
            cfg,
            cache_cap,
        }
    }

    fn open_vfs(
        dir: &Path,
        meta: Arc<dyn MetaEngine>,
        cfg: &VfsConfig,
        cache_cap: u64,
        rt: &tokio::runtime::Handle,
    ) -> Arc<Vfs> {
        let url = format!("file://{}", dir.join("bucket").display());
        let spec = BucketSpec::parse(&url).expect("bucket url");
        let bucket = Bucket::open(&spec, true).expect("open bucket");
        let cache = Cache::open(&dir.join("cache"), cache_cap, 1 << 20).expect("open cache");
        Vfs::new(meta, bucket, Arc::new(cache), cfg.clone(), rt.clone()).expect("Vfs::new")
    }

    /// A second mount of this workspace with a cache dir of its own (`cache_dir` under
    /// the temp dir, 64 MiB): same metadata database (a connection of its own), same bucket,
    /// its own uploader on this runtime. Stopped when the returned guard drops.
    pub(crate) fn second_mount(&self, cache_dir: &str) -> OtherMount {
        self.second_mount_with(cache_dir, 64 << 20)
    }

    /// [`Harness::second_mount`] with a cache of `capacity` bytes.
    pub(crate) fn second_mount_with(&self, cache_dir: &str, capacity: u64) -> OtherMount {
        let url = format!("file://{}", self.bucket_dir().display());
        let spec = BucketSpec::parse(&url).expect("bucket url");
        let bucket = Bucket::open(&spec, true).expect("open bucket");
        let cache = Cache::open(&self.tmp.path().join(cache_dir), capacity, 1 << 20)
            .expect("open second cache");
        let rt = self.rt.as_ref().expect("runtime").handle();
        // Registered as another daemon would be: a live process of this host (init).
        let cfg = self.cfg.clone();
        let vfs = Vfs::new_as(self.db.open(), bucket, Arc::new(cache), cfg, rt.clone(), 1)
            .expect("second Vfs::new");
        OtherMount(vfs)
    }

    /// The live VFS, for moving into other threads.
    pub(crate) fn arc(&self) -> Arc<Vfs> {
        self.vfs.clone().expect("vfs is mounted")
    }

    /// Stops the VFS (`shutdown(false)`: commit open files, stop the uploader without
    /// waiting for uploads) and waits until its uploader task released it.
    fn unmount(&mut self) {
        let Some(vfs) = self.vfs.take() else { return };
        vfs.shutdown(false, Duration::from_secs(10))
            .expect("shutdown");
        let stopped = wait_until(Duration::from_secs(20), || Arc::strong_count(&vfs) == 1);
        assert!(
            stopped,
            "the uploader still holds the VFS 20 s after shutdown"
        );
        drop(vfs);
    }

    /// Simulates a restart: shuts the VFS down and opens a new one on the same database,
    /// bucket and cache directory. Open handles of the old mount are gone.
    pub(crate) fn remount(&mut self) {
        let cfg = self.cfg.clone();
        self.remount_with(cfg);
    }

    /// [`Harness::remount`] with another configuration.
    pub(crate) fn remount_with(&mut self, cfg: VfsConfig) {
        self.cfg = cfg;
        self.remount_after(|_, _| {});
    }

    /// Simulates `kill -9` of the daemon and a restart: the runtime (uploader included) is
    /// torn down and the VFS dropped without `shutdown`, so nothing is committed or
    /// flushed on the way out; only what reached the database and the cache dir remains.
    pub(crate) fn crash_and_remount(&mut self) {
        self.crash_and_remount_after(|_, _| {});
    }

    /// [`Harness::crash_and_remount`], running `f` on the temp dir between the crash and
    /// the restart (e.g. to take away what a power cut would, or to run `fsck`).
    pub(crate) fn crash_and_remount_after(&mut self, f: impl FnOnce(&Path, &MetaDb)) {
        let vfs = self.vfs.take().expect("vfs is mounted");
        let rt = self.rt.take().expect("runtime");
        rt.shutdown_timeout(Duration::from_secs(10));
        let released = wait_until(Duration::from_secs(10), || Arc::strong_count(&vfs) == 1);
        assert!(
            released,
            "background tasks still hold the VFS after the runtime stopped"
        );
        drop(vfs);
        f(self.tmp.path(), &self.db);
        let rt = runtime();
        let vfs = Self::open_vfs(
            self.tmp.path(),
            self.db.open_mount(),
            &self.cfg,
            self.cache_cap,
            rt.handle(),
        );
        self.rt = Some(rt);
        self.vfs = Some(vfs);
    }

    /// Shuts down, runs `f` on the temp dir (e.g. to wipe the cache), then remounts.
    pub(crate) fn remount_after(&mut self, f: impl FnOnce(&Path, &MetaDb)) {
        self.unmount();
        f(self.tmp.path(), &self.db);
        let vfs = Self::open_vfs(
            self.tmp.path(),
            self.db.open_mount(),
            &self.cfg,
            self.cache_cap,
            self.rt.as_ref().unwrap().handle(),
        );
        self.vfs = Some(vfs);
    }

    // ---- direct views of the directories (not through deskfs) ----

    /// The local bucket directory.
    pub(crate) fn bucket_dir(&self) -> PathBuf {
        self.tmp.path().join("bucket")
    }

    /// The content of the object at workspace path `path`, read from the bucket directory
    /// directly; `None` if there is no such regular file.
    pub(crate) fn bucket_file(&self, path: &str) -> Option<Vec<u8>> {
        let p = self.bucket_dir().join(path);
        if p.is_file() {
            Some(std::fs::read(&p).expect("read bucket object"))
        } else {
            None
        }
    }

    /// Whether the bucket directory has a directory (marker) at `path`.
    pub(crate) fn bucket_is_dir(&self, path: &str) -> bool {
        self.bucket_dir().join(path).is_dir()
    }

    /// Every regular file in the bucket (relative paths, sorted), `.deskfs/` included.
    pub(crate) fn bucket_files(&self) -> Vec<String> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(root, &p, out);
                } else {
                    out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.bucket_dir(), &self.bucket_dir(), &mut out);
        out.sort();
        out
    }

    /// Whether the cache has a staging file for `ino`.
    pub(crate) fn staging_exists(&self, ino: Ino) -> bool {
        self.tmp
            .path()
            .join("cache")
            .join("staging")
            .join(ino.to_string())
            .exists()
    }

    /// Makes the database refuse every update of `column` in `table` (a SQLite trigger
    /// raising an abort: a real failure of the transaction, as an engine that cannot commit
    /// gives), until [`Refusal::lift`]. `None` on PostgreSQL: the caller skips.
    pub(crate) fn refuse_updates(&self, table: &str, column: &str) -> Option<Refusal> {
        let MetaDb::Sqlite(db) = &self.db else {
            eprintln!("skipped: the failure is injected with a SQLite trigger");
            return None;
        };
        Some(refuse_updates_in(db, table, column))
    }

    /// The SQLite database file of this workspace (`None` on PostgreSQL).
    pub(crate) fn sqlite_path(&self) -> Option<PathBuf> {
        match &self.db {
            MetaDb::Sqlite(p) => Some(p.clone()),
            MetaDb::Postgres(_) => None,
        }
    }

    /// The committed metadata row of `ino` (what the engine holds, without overlay).
    pub(crate) fn row(&self, ino: Ino) -> Option<InodeRow> {
        deskfs_meta::read(&**self.meta(), |t| t.get_inode(ino)).expect("meta read")
    }

    /// The kernel drops every lookup reference it has to `ino` (`FORGET`), and the
    /// purge this may queue is done.
    pub(crate) fn kernel_forgets(&self, ino: Ino) {
        self.forget(ino, u64::MAX);
        self.flush_purges();
    }

    // ---- convenience wrappers over the VFS API ----

    /// Waits until everything written so far is in the bucket.
    pub(crate) fn sync_all(&self) {
        self.sync(SYNC_TIMEOUT).expect("sync");
    }

    /// `lookup` of `parent/name`.
    pub(crate) fn lk(&self, parent: Ino, name: &str) -> Result<Attr> {
        self.lookup(&CTX, parent, name.as_bytes())
    }

    /// Resolves a `/`-separated path from the root by successive lookups.
    pub(crate) fn walk(&self, path: &str) -> Result<Attr> {
        let mut cur = self.getattr(ROOT_INO)?;
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            cur = self.lookup(&CTX, cur.ino, seg.as_bytes())?;
        }
        Ok(cur)
    }

    /// `mkdir` with mode 0777 and umask 022.
    pub(crate) fn dir(&self, parent: Ino, name: &str) -> Attr {
        self.mkdir(&CTX, parent, name.as_bytes(), 0o777, 0o022)
            .expect("mkdir")
    }

    /// `create` (O_RDWR, mode 0666, umask 022): the new file's attributes and handle.
    pub(crate) fn create_rw(&self, parent: Ino, name: &str) -> (Attr, u64) {
        let (a, o) = self
            .create(&CTX, parent, name.as_bytes(), 0o666, 0o022, libc::O_RDWR)
            .expect("create");
        (a, o.fh)
    }

    /// Creates `parent/name` holding `data` (create, write, flush, release).
    pub(crate) fn file(&self, parent: Ino, name: &str, data: &[u8]) -> Attr {
        let (a, fh) = self.create_rw(parent, name);
        self.put(a.ino, fh, 0, data);
        self.flush(a.ino, fh).expect("flush");
        self.release(a.ino, fh).expect("release");
        self.getattr(a.ino).expect("getattr after create")
    }

    /// Writes all of `data` at `off` through `fh` (in 256 KiB requests, like the kernel).
    pub(crate) fn put(&self, ino: Ino, fh: u64, off: u64, data: &[u8]) {
        let mut done = 0usize;
        for chunk in data.chunks(256 << 10) {
            let n = self
                .write(ino, fh, off + done as u64, chunk)
                .expect("write");
            assert_eq!(n as usize, chunk.len(), "short write");
            done += chunk.len();
        }
    }

    /// `open` with `flags`; returns the handle.
    pub(crate) fn op(&self, ino: Ino, flags: i32) -> u64 {
        self.open(&CTX, ino, flags).expect("open").fh
    }

    /// Reads through `fh` from `off` to end of file, in `chunk`-byte requests.
    pub(crate) fn read_to_end(&self, ino: Ino, fh: u64, off: u64, chunk: u32) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let d = self
                .read(ino, fh, off + out.len() as u64, chunk)
                .expect("read");
            if d.is_empty() {
                return out;
            }
            assert!(d.len() <= chunk as usize);
            out.extend_from_slice(&d);
        }
    }

    /// The whole content of `ino` (open read-only, read, release).
    pub(crate) fn cat(&self, ino: Ino) -> Vec<u8> {
        let fh = self.op(ino, libc::O_RDONLY);
        let out = self.read_to_end(ino, fh, 0, 128 << 10);
        self.release(ino, fh).expect("release");
        out
    }

    /// The whole content of the file at `path`.
    pub(crate) fn cat_path(&self, path: &str) -> Vec<u8> {
        let a = self
            .walk(path)
            .unwrap_or_else(|e| panic!("lookup {path}: {e}"));
        self.cat(a.ino)
    }

    /// Full listing of directory `ino` (see [`entries_on`]).
    pub(crate) fn ls_entries(&self, ino: Ino, plus: bool) -> Vec<DirEntry> {
        entries_on(self, ino, plus)
    }

    /// Sorted names in directory `ino`, without `.` and `..` (see [`names_on`]).
    pub(crate) fn ls(&self, ino: Ino) -> Vec<String> {
        names_on(self, ino)
    }
}

/// Full listing of directory `ino` through mount `v` (opendir, readdir until empty,
/// releasedir).
pub(crate) fn entries_on(v: &Vfs, ino: Ino, plus: bool) -> Vec<DirEntry> {
    let fh = v.opendir(ino).expect("opendir");
    let mut out: Vec<DirEntry> = Vec::new();
    let mut off = 0;
    loop {
        let batch = v.readdir(ino, fh, off, plus).expect("readdir");
        let Some(last) = batch.last() else { break };
        off = last.offset;
        out.extend(batch);
    }
    v.releasedir(ino, fh).expect("releasedir");
    out
}

/// Sorted names in directory `ino` as mount `v` lists it, without `.` and `..`.
pub(crate) fn names_on(v: &Vfs, ino: Ino) -> Vec<String> {
    let mut names: Vec<String> = entries_on(v, ino, false)
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    names.sort();
    names
}

/// A second mount made by [`Harness::second_mount`]; derefs to its [`Vfs`], shuts it down
/// when dropped.
pub(crate) struct OtherMount(Arc<Vfs>);

impl Deref for OtherMount {
    type Target = Arc<Vfs>;
    fn deref(&self) -> &Arc<Vfs> {
        &self.0
    }
}

impl Drop for OtherMount {
    fn drop(&mut self) {
        let _ = self.0.shutdown(false, Duration::from_secs(5));
        wait_until(Duration::from_secs(10), || Arc::strong_count(&self.0) == 1);
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(vfs) = self.vfs.take() {
            let _ = vfs.shutdown(false, Duration::from_secs(5));
            wait_until(Duration::from_secs(10), || Arc::strong_count(&vfs) == 1);
            drop(vfs);
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// Sanity of the harness itself: an empty workspace, a working remount.
#[test]
fn harness_mounts_and_remounts() {
    let mut h = Harness::new();
    let root = h.getattr(ROOT_INO).unwrap();
    assert_eq!(root.kind, Kind::Dir);
    assert_eq!(root.nlink, 2);
    assert!(h.ls(ROOT_INO).is_empty());
    h.file(ROOT_INO, "x", b"1");
    h.remount();
    assert_eq!(h.cat_path("x"), b"1");
    h.sync_all();
    assert_eq!(h.bucket_file("x").as_deref(), Some(&b"1"[..]));
}

/// [`Harness::refuse_updates`] on the SQLite database at `db`.
pub(crate) fn refuse_updates_in(db: &Path, table: &str, column: &str) -> Refusal {
    refuse_in(
        db,
        &format!("refuse_{table}_{column}"),
        &format!("BEFORE UPDATE OF {column} ON {table}"),
    )
}

/// Makes the SQLite database at `db` refuse the statements `when` names (a trigger
/// `name` raising an abort, e.g. `BEFORE INSERT ON sessions`), until [`Refusal::lift`].
pub(crate) fn refuse_in(db: &Path, name: &str, when: &str) -> Refusal {
    let conn = rusqlite::Connection::open(db).expect("open the test's database");
    conn.busy_timeout(Duration::from_secs(30))
        .expect("busy timeout");
    conn.execute_batch(&format!(
        "CREATE TRIGGER {name} {when} BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
    ))
    .expect("create the refusing trigger");
    Refusal {
        conn,
        name: name.to_string(),
    }
}

/// A refusal made by [`Harness::refuse_updates`].
pub(crate) struct Refusal {
    conn: rusqlite::Connection,
    name: String,
}

impl Refusal {
    /// The database takes the updates again.
    pub(crate) fn lift(self) {
        self.conn
            .execute_batch(&format!("DROP TRIGGER {}", self.name))
            .expect("drop the refusing trigger");
    }
}
