//! The deskfs VFS core: POSIX semantics over the metadata engine, the local cache and the
//! bucket. Usable in-process without a kernel mount (tests drive it directly); the FUSE
//! adapter only translates requests into calls on [`Vfs`].
//!
//! Data path: writes go to the inode's **staging file** (the local journal); `close`
//! (flush/release) commits size, mtime and a new content version to the metadata engine
//! and marks the inode's paths pending; `fsync` also fdatasyncs the staging file and makes
//! the metadata commit durable. The [`uploader`] reconciles pending paths with the bucket
//! in the background. Reads come from the staging file when the content is local, else
//! from the block cache, filled by ranged GETs with sequential readahead.

pub mod atime;
pub mod buffers;
pub mod change_ring;
mod changes;
pub mod coherence;
mod crash_adopt;
mod data;
mod datasync;
pub mod durability;
pub mod error;
pub mod external;
pub mod feed;
mod fill;
mod flush_failures;
pub mod fsck;
mod handles;
mod hints;
mod importer;
mod kernel_refs;
mod kernel_sync;
pub mod locks;
mod meta_flush;
mod mount_marker;
mod namespace;
mod open_gate;
mod passthrough;
pub mod paths;
mod release;
pub mod remote;
mod session;
mod status;
pub mod types;
pub mod uploader;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deskfs_bucket::Bucket;
use deskfs_cache::Cache;
use deskfs_meta::{InodeRow, Local, MetaEngine, Op};

pub use atime::AtimeMode;
pub use change_ring::{Change, ChangeKind, ChangesPage};
pub use coherence::Peers;
pub use durability::Durability;
pub use error::{Result, VfsError};
pub use feed::Invalidation;
pub use flush_failures::FlushFailure;
pub use locks::{LockInfo, LockType};
pub use session::hostname;
pub use status::{FailedPath, PendingSummary, VfsStatus};
pub use types::*;

use handles::{Handle, InodeState};

/// Empty staging files kept ready (inode allocation in the cache file system stays off
/// the request path: a burst of up to this many new files — an untar, a clone, an
/// install — takes ready ones; the reserve outlives the mount). 8,192 empty inodes,
/// no data blocks.
const STAGING_POOL: usize = 8192;

/// Tunables of one mounted workspace.
#[derive(Clone, Debug)]
pub struct VfsConfig {
    /// Delay between a file's last commit (close) and its upload, coalescing rewrites.
    pub upload_delay: Duration,
    /// How long without a change ends a burst of request-path changes, during which
    /// uploads wait (at most `uploader::BURST_DEFER`); at least `upload_delay`.
    pub burst_quiet: Duration,
    /// How long a directory listing imported from the bucket stays fresh before `readdir`
    /// lists the bucket again (changes made by other tools appear after this).
    pub list_ttl: Duration,
    /// A directory with at least this many entries is refreshed from the bucket in the
    /// background: the `opendir` that finds its listing older than `list_ttl` is served
    /// the known entries at once, and what the refresh finds shows from the next
    /// `readdir` on (a bucket listing of 100,000 objects takes over a second).
    pub background_relist_min: u64,
    /// How long the `opendir` that refreshes a smaller directory waits for the bucket's
    /// listing; a bucket slower than this (an outage retried with backoff) leaves the
    /// refresh to the background and the open served the known entries. A local
    /// `opendir` (SQLite opens a database's directory to fsync it) never waits on the
    /// bucket longer than this.
    pub relist_wait: Duration,
    /// Blocks fetched ahead of a sequential reader.
    pub readahead_blocks: u64,
    /// Concurrent bucket operations of the uploader.
    pub upload_workers: usize,
    /// Bytes all block fetches and upload buffers may hold in memory together (see
    /// [`buffers`]).
    pub buffer_limit: u64,
    /// Owner of objects imported from the bucket without POSIX metadata.
    pub default_uid: u32,
    /// Group of objects imported from the bucket without POSIX metadata.
    pub default_gid: u32,
    /// Session lease: a mount that misses its heartbeats this long is expired by the
    /// others (its locks freed, its opens forgotten); a mount that finds itself expired
    /// is fenced. Heartbeats run every sixth of it.
    pub lease: Duration,
    /// How long an `open` waits for content that only another mount's cache holds (that
    /// mount is asked to upload it at once) before failing with `EIO`.
    pub remote_wait: Duration,
    /// When `close`/`fsync` are acknowledged (see [`durability`]).
    pub durability: Durability,
    /// Under [`Durability::Bucket`]: how long a `close`/`fsync`/`fsyncdir` waits for the
    /// bucket before failing with `EIO` (the data stays in the local journal).
    pub bucket_wait: Duration,
    /// Serve open files whose content is local through FUSE passthrough when the kernel
    /// allows it (see [`Vfs::set_passthrough`]).
    pub passthrough: bool,
    /// When reads move `atime` (see [`atime`]).
    pub atime: AtimeMode,
    /// How long the open files of a mount expired for missing its lease (perhaps only
    /// paused) stay unpurged, so that mount still reads them when it resumes (see
    /// the `session` module).
    pub expired_open_grace: Duration,
    /// An object the bucket holds as long as it is this workspace's bucket (the daemon
    /// names the format record, `.deskfs/format.json`). Objects missing from a listing
    /// are taken as deleted by another tool only while it is there: a bucket dir whose
    /// disk is not mounted, or a bucket emptied or swapped under a live mount, empties no
    /// directory. `None`: every listing is trusted.
    pub bucket_marker: Option<String>,
}

impl Default for VfsConfig {
    fn default() -> Self {
        VfsConfig {
            upload_delay: Duration::from_millis(500),
            burst_quiet: uploader::BURST_QUIET,
            list_ttl: Duration::from_secs(30),
            background_relist_min: 10_000,
            relist_wait: Duration::from_millis(500),
            readahead_blocks: 32,
            upload_workers: 8,
            buffer_limit: buffers::DEFAULT_LIMIT,
            default_uid: 0,
            default_gid: 0,
            lease: Duration::from_secs(30),
            remote_wait: Duration::from_secs(30),
            durability: Durability::Local,
            bucket_wait: Duration::from_secs(30),
            passthrough: true,
            atime: AtimeMode::Relatime,
            expired_open_grace: Duration::from_secs(24 * 3600),
            bucket_marker: None,
        }
    }
}

/// One workspace, live: the namespace, open files, cache and the background uploader.
pub struct Vfs {
    pub(crate) meta: Arc<dyn MetaEngine>,
    pub(crate) bucket: Bucket,
    pub(crate) cache: Arc<Cache>,
    pub(crate) cfg: VfsConfig,
    pub(crate) rt: tokio::runtime::Handle,
    /// In-memory state of inodes with open handles (or in the middle of an operation).
    pub(crate) inodes: Mutex<HashMap<u64, Arc<Mutex<InodeState>>>>,
    pub(crate) handles: Mutex<HashMap<u64, Arc<Handle>>>,
    pub(crate) next_fh: AtomicU64,
    pub(crate) uploader: uploader::UploaderShared,
    /// One bucket-conflict save at a time in this mount (see [`external`]).
    pub(crate) external_lock: tokio::sync::Mutex<()>,
    /// Sync barriers currently waiting (the uploader ignores coalescing delays meanwhile).
    pub(crate) urgent: AtomicUsize,
    pub(crate) fetches: data::Inflight,
    /// Memory of block fetches and upload buffers, bounded together (see [`buffers`]).
    pub(crate) buffers: buffers::BufferBudget,
    /// Writes that found the cache dir's file system full and evicted clean data.
    pub(crate) space_evictions: AtomicU64,
    /// Held for a whole eviction pass ([`Vfs::evict`]): passes run one at a time, so a
    /// write that found the file system full waits for a pass already removing files
    /// (two passes pick the same victims; the second found them taken and freed nothing).
    pub(crate) evicting: Mutex<()>,
    /// Files being assembled whole from the bucket for passthrough (see [`fill`]).
    pub(crate) fills: fill::Fills,
    /// Who else is live, this mount's session, feed position, fencing (see [`coherence`]).
    pub(crate) coherence: coherence::Coherence,
    /// Delivers invalidations to the kernel (set by the FUSE adapter's owner).
    pub(crate) invalidator: std::sync::OnceLock<feed::Invalidator>,
    /// Under bucket durability, run after an `fsync`/`fsyncdir`'s content reached the
    /// bucket: puts the namespace facts objects cannot carry there too (see
    /// [`Vfs::set_namespace_barrier`]).
    pub(crate) namespace_barrier: std::sync::OnceLock<durability::NamespaceBarrier>,
    /// Invalidations queued for the feed thread (see [`feed`]).
    pub(crate) deferred: Mutex<Vec<Invalidation>>,
    /// Releases whose database work is still to do (see [`release`]).
    pub(crate) releases: release::ReleaseQueue,
    /// Access times queued for the database (see [`atime`]).
    pub(crate) atimes: atime::AccessTimes,
    /// Shared device flushes of the metadata log (see [`meta_flush`]).
    pub(crate) meta_flush: meta_flush::MetaFlush,
    /// Device flushes of staging files (`fsync`/`fdatasync`) run so far.
    pub(crate) data_flushes: Arc<std::sync::atomic::AtomicU64>,
    /// Inodes whose staging file's flush failed: their `fsync`s fail from then on.
    pub(crate) flush_failures: flush_failures::FlushFailures,
    /// When the request path last queued work for the uploader or served a request, ns
    /// (burst detection: uploads wait for a quiet moment).
    pub(crate) last_mark_ns: std::sync::atomic::AtomicI64,
    /// Inodes on which this mount may hold locks, and waiters' wake-ups (see `locks`).
    pub(crate) locks: locks::LocalLocks,
    /// Content versions the kernel's page cache holds (keep_cache decisions).
    pub(crate) kernel_pages: feed::KernelPages,
    /// The last invalidation each open sent, so the feed leaves out the ones it covers.
    pub(crate) kernel_syncs: kernel_sync::KernelSyncs,
    /// Concurrent opens of one inode share one kernel invalidation (`open_gate`).
    pub(crate) open_gates: open_gate::OpenGates,
    /// Opens may use FUSE passthrough now (see [`passthrough`]).
    pub(crate) passthrough: std::sync::atomic::AtomicBool,
    /// When the change feed was last read to its end (ns since the epoch; 0: never).
    pub(crate) feed_caught_up_ns: std::sync::atomic::AtomicI64,
    /// Block cache hits and misses of readers, bytes fetched (see `status`).
    pub(crate) blocks: status::BlockCounters,
    /// The last look for [`VfsConfig::bucket_marker`] found it missing.
    pub(crate) marker_missing: std::sync::atomic::AtomicBool,
    /// Feed entries already turned into invalidations.
    pub(crate) feed_seen: feed::SeenChanges,
    /// Lookup counts of the kernel and the orphans kept for them.
    pub(crate) refs: kernel_refs::KernelRefs,
    /// Opens the kernel repeats after an `ESTALE`.
    pub(crate) retries: kernel_refs::StaleRetries,
    /// Facts remembered between requests (guarded by expectations when used).
    pub(crate) hints: hints::Hints,
    /// Inode numbers reserved from the engine, handed out by creates.
    pub(crate) free_inos: Mutex<std::ops::Range<u64>>,
    /// Content this mount waits for from other caches (see [`remote`]).
    pub(crate) remote: remote::RemoteWaits,
    /// This mount's clean-shutdown marker in the cache dir (see [`mount_marker`]).
    pub(crate) marker: Mutex<Option<mount_marker::MountMarker>>,
    /// Process id this mount's session is registered under (a session of this host whose
    /// process is gone, or this very process's earlier one, is expired at start).
    pub(crate) pid: u32,
    /// This mount's recent namespace and content changes (see [`change_ring`]).
    pub(crate) ring: change_ring::ChangeRing,
    /// Directory refreshes running in the background (see [`importer`]).
    pub(crate) relists: importer::BackgroundRelists,
    /// This VFS itself, for work it hands to threads of its own.
    pub(crate) this: std::sync::Weak<Vfs>,
}

impl std::fmt::Debug for Vfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vfs")
            .field("meta", &self.meta.describe())
            .field("bucket", &self.bucket)
            .finish()
    }
}

/// Now, ns since the Unix epoch.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub(crate) fn attr_of(row: &InodeRow) -> Attr {
    Attr {
        ino: row.ino,
        kind: row.kind,
        perm: row.perm,
        nlink: row.nlink,
        uid: row.uid,
        gid: row.gid,
        rdev: row.rdev,
        size: row.size,
        blocks: row.size.div_ceil(512),
        atime_ns: row.atime_ns,
        mtime_ns: row.mtime_ns,
        ctime_ns: row.ctime_ns,
        btime_ns: row.btime_ns,
    }
}

impl Vfs {
    /// Opens a workspace for serving: recovers state left by a previous run (orphans from
    /// open-unlinked files, interrupted downloads, clean staging files to index), then
    /// starts the background uploader on `rt`, which resumes every pending upload.
    ///
    /// Errors: [`VfsError::Meta`] when the database cannot be read,
    /// [`VfsError::Cache`] when the cache dir cannot be scanned.
    pub fn new(
        meta: Arc<dyn MetaEngine>,
        bucket: Bucket,
        cache: Arc<Cache>,
        cfg: VfsConfig,
        rt: tokio::runtime::Handle,
    ) -> Result<Arc<Vfs>> {
        Self::new_as(meta, bucket, cache, cfg, rt, std::process::id())
    }

    /// [`Vfs::new`] with the session registered under process id `pid` (tests run a
    /// second mount in one process under another live pid, as a second daemon would).
    pub(crate) fn new_as(
        meta: Arc<dyn MetaEngine>,
        bucket: Bucket,
        cache: Arc<Cache>,
        cfg: VfsConfig,
        rt: tokio::runtime::Handle,
        pid: u32,
    ) -> Result<Arc<Vfs>> {
        let budget = buffers::BufferBudget::new(cfg.buffer_limit);
        let atimes = atime::AccessTimes::new(cfg.atime);
        let vfs = Arc::new_cyclic(|this| Vfs {
            meta,
            bucket,
            cache,
            cfg,
            rt,
            inodes: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            uploader: uploader::UploaderShared::default(),
            external_lock: tokio::sync::Mutex::new(()),
            urgent: AtomicUsize::new(0),
            fetches: data::Inflight::default(),
            buffers: budget,
            space_evictions: AtomicU64::new(0),
            evicting: Mutex::new(()),
            fills: fill::Fills::default(),
            coherence: coherence::Coherence::default(),
            invalidator: std::sync::OnceLock::new(),
            namespace_barrier: std::sync::OnceLock::new(),
            deferred: Mutex::new(Vec::new()),
            releases: release::ReleaseQueue::default(),
            atimes,
            meta_flush: meta_flush::MetaFlush::default(),
            data_flushes: Default::default(),
            flush_failures: Default::default(),
            last_mark_ns: std::sync::atomic::AtomicI64::new(0),
            locks: locks::LocalLocks::default(),
            kernel_pages: feed::KernelPages::default(),
            kernel_syncs: kernel_sync::KernelSyncs::default(),
            open_gates: open_gate::OpenGates::default(),
            passthrough: std::sync::atomic::AtomicBool::new(false),
            marker_missing: std::sync::atomic::AtomicBool::new(false),
            blocks: Default::default(),
            feed_caught_up_ns: std::sync::atomic::AtomicI64::new(0),
            feed_seen: feed::SeenChanges::default(),
            refs: kernel_refs::KernelRefs::default(),
            retries: kernel_refs::StaleRetries::default(),
            hints: hints::Hints::default(),
            free_inos: Mutex::new(0..0),
            remote: remote::RemoteWaits::default(),
            marker: Mutex::new(None),
            pid,
            ring: change_ring::ChangeRing::default(),
            relists: importer::BackgroundRelists::default(),
            this: this.clone(),
        });
        let (marker, found) = mount_marker::MountMarker::claim(vfs.cache.root())?;
        *vfs.marker.lock().map_err(|_| poisoned())? = Some(marker);
        vfs.start_session()?;
        vfs.await_peer_acks(feed::JOIN_WAIT);
        vfs.recover(found)?;
        index_staging_later(&vfs);
        vfs.cache.start_pool(STAGING_POOL);
        uploader::start(&vfs);
        feed::start(&vfs);
        Ok(vfs)
    }

    /// This mount's cache id ([`Local::At`] of content held here).
    pub(crate) fn here(&self) -> Local {
        Local::At(self.cache.id())
    }

    /// A fresh inode number (reserved from the engine in batches of 64).
    pub(crate) fn alloc_ino(&self) -> Result<u64> {
        let mut r = self.free_inos.lock().map_err(|_| poisoned())?;
        if r.is_empty() {
            *r = self.meta.alloc_inos(64)?;
        }
        r.next()
            .ok_or_else(|| VfsError::Io(std::io::Error::other("inode allocation returned nothing")))
    }

    /// Crash recovery at mount. Orphans of dead mounts are purged; after a crash (a
    /// mount of this cache dir ended without committing everything: see
    /// [`mount_marker`]), dirty staging files are adopted as new content versions, and
    /// the block cache is emptied unless another mount uses the cache dir now. The
    /// staging files' index (clean ones evictable, stale ones removed) is built in the
    /// background ([`Vfs::index_staging`]): serving needs none of it.
    fn recover(&self, found: mount_marker::Found) -> Result<()> {
        // Orphans: inodes whose last name went away while open, then the process died.
        // Still open through another live mount: that mount purges it at its last close.
        let orphans = deskfs_meta::read(&*self.meta, |t| t.orphan_inodes())?;
        if !orphans.is_empty() {
            let ops: Vec<Op> = orphans.iter().map(|i| Op::Purge(*i)).collect();
            let out = self.meta.apply(&ops)?;
            for (ino, o) in orphans.iter().zip(out) {
                if o == deskfs_meta::OpOut::Purged(true) {
                    // A copy of its content another mount uploaded for it goes too.
                    self.forget_earlier_orphan_object(*ino);
                    self.cache.remove_staging(*ino)?;
                    self.cache.drop_blocks(*ino);
                }
            }
        }
        if !found.after_crash {
            return Ok(());
        }
        // Cached blocks were written without a flush: after a power loss one may be short
        // or zeros. They are only copies of bucket objects, fetched again on demand. (A
        // mount still live on this cache dir means the machine did not go down.)
        let dropped = match found.others_live {
            true => 0,
            false => self.cache.drop_all_blocks()?,
        };
        if dropped > 0 {
            tracing::info!(
                blocks = dropped,
                "the last mount did not end cleanly: cached blocks dropped (they may be torn)"
            );
        }
        let here = self.here();
        // Dirty inodes held here: their staging file is the truth. Writes that reached it
        // after the last commit (the daemon died before close) are adopted as a new
        // version, so the file is never left with local content that differs from what
        // gets uploaded.
        let dirty = deskfs_meta::read(&*self.meta, |t| t.dirty_inodes())?;
        for r in dirty {
            if r.kind != deskfs_meta::Kind::File || r.local != here {
                continue;
            }
            let adopted = crash_adopt::adopt_staging(&*self.meta, &self.cache, here, &r)?;
            if let crash_adopt::Adopted::Emptied { lost } = adopted {
                if lost != 0 {
                    tracing::error!(
                        ino = r.ino,
                        size = lost,
                        cache = %self.cache.root().display(),
                        "after a crash a file's unuploaded content is not in its cache dir (it was never fsynced): the file is now empty"
                    );
                }
            }
        }
        Ok(())
    }

    /// Commits every open file's writes, then blocks until everything written before the
    /// call is in the bucket (the `deskfs sync` barrier) — but for paths whose content
    /// only another mount's cache holds: that mount uploads them. Returns `Ok` once no pending
    /// path older than the barrier remains; while the bucket fails it keeps waiting up to
    /// `timeout` and then returns [`VfsError::Io`] (`TimedOut`) naming what is stuck.
    pub fn sync(&self, timeout: Duration) -> Result<()> {
        self.commit_all()?;
        let running = self.uploader.uploads_now();
        let barrier = deskfs_meta::read(&*self.meta, |t| {
            Ok::<_, crate::VfsError>(t.pending_last_seq()?)
        })?;
        self.urgent.fetch_add(1, Ordering::SeqCst);
        self.uploader.kick();
        let start = std::time::Instant::now();
        let res = loop {
            // Uploads running at the barrier first: what they find is marked before they
            // end, under their own marks' numbers (at most `barrier`).
            let settled = !self.uploader.any_running(&running) && {
                let more = deskfs_meta::read(&*self.meta, |t| t.pending_upto(barrier))?;
                !more || self.only_others_pending(barrier)?
            };
            if settled {
                break Ok(());
            }
            if start.elapsed() > timeout {
                let left = PendingSummary::read(&*self.meta, 3)?;
                break Err(VfsError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("sync timed out after {} s with {left}", timeout.as_secs()),
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.urgent.fetch_sub(1, Ordering::SeqCst);
        res
    }

    /// Whether every pending path older than `barrier` holds content only other mounts'
    /// caches have (their uploaders do those): found so by this mount's uploader at the
    /// row's present state (see [`uploader::UploaderShared::is_elsewhere`]), so content
    /// that came here since is waited for.
    fn only_others_pending(&self, barrier: u64) -> Result<bool> {
        const LOOK: usize = 1024;
        let rows = deskfs_meta::read(&*self.meta, |t| t.due_pending(i64::MAX, LOOK))?;
        Ok(rows.len() < LOOK
            && rows
                .iter()
                .filter(|r| r.seq <= barrier)
                .all(|r| self.uploader.is_elsewhere(r)))
    }

    /// Commits all open files' writes (as `close` would) without waiting for uploads, and
    /// the engine's commit window ([`deskfs_meta::MetaEngine::settle`]).
    pub fn commit_all(&self) -> Result<()> {
        let states: Vec<(u64, Arc<Mutex<InodeState>>)> = self
            .inodes
            .lock()
            .map_err(|_| poisoned())?
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (ino, st) in states {
            let mut st = st.lock().map_err(|_| poisoned())?;
            self.commit_locked(ino, &mut st, crate::data::CommitSync::Commit)?;
        }
        // For the processes that read the database file next (`deskfs umount`, `status`,
        // `sync`'s waits): nothing acknowledged stays in a commit window.
        Ok(self.meta.settle()?)
    }

    /// Stops the background uploader after committing open files. With `wait`, first
    /// waits (up to `timeout`) until every pending upload is done.
    pub fn shutdown(&self, wait: bool, timeout: Duration) -> Result<()> {
        self.commit_all()?;
        let res = if wait { self.sync(timeout) } else { Ok(()) };
        self.uploader.stop();
        self.coherence.stop();
        self.flush_releases();
        self.flush_access_times();
        self.flush_purges_after(Duration::ZERO);
        self.end_session();
        // Other processes (the next mount, the metadata backup's final flush) read the
        // database file: nothing may stay in a commit window.
        if let Err(e) = self.meta.settle() {
            tracing::warn!(error = %e, "cannot commit the last commit window at stop; the redo log keeps it for the next open");
        }
        // Everything written is committed: once it is also on disk (the metadata here,
        // the staging files in `ended_cleanly`), the next mount needs no crash recovery.
        // Without the flushes a power loss could keep the marker's removal and lose the
        // commits or staging bytes that recovery would have reconciled.
        let marker = self.marker.lock().ok().and_then(|mut m| m.take());
        if let Some(m) = marker {
            let ended = self
                .flush_for_clean_end()
                .and_then(|()| m.ended_cleanly().map_err(VfsError::Io));
            if let Err(e) = ended {
                tracing::warn!(error = %e, "cannot flush the last commits or remove the mount marker; the next mount recovers in full");
            }
        }
        res
    }

    /// Puts on disk what crash recovery would otherwise reconcile, before the clean-end
    /// marker goes: every staging file of a dirty file held here (`fdatasync`: the
    /// uploader flushes a file before its row says clean, so only dirty ones can be
    /// behind), then the metadata log. One flush per file left dirty (none after a
    /// `umount` that waited for its uploads). Errors: the first failed flush (`EIO`,
    /// `ENOSPC`) or the engine's; the marker then stays.
    fn flush_for_clean_end(&self) -> Result<()> {
        let here = self.here();
        let dirty = deskfs_meta::read(&*self.meta, |t| t.dirty_inodes())?;
        for r in dirty {
            if r.kind == deskfs_meta::Kind::File && r.local == here {
                self.cache.sync_staging(r.ino)?;
            }
        }
        Ok(self.meta.make_durable()?)
    }

    /// Indexes the staging files of the cache dir: clean ones holding their inode's
    /// current content become evictable; stale copies (another cache holds a newer
    /// version, or the inode is gone) are removed — under the staging-area lock, with the
    /// row read again, so a download adopted meanwhile is never removed. Runs in the
    /// background at mount. The rows are read [`INDEX_BATCH`] at a time in inode order,
    /// one read snapshot per batch, with a pause between batches: a cache of a million
    /// staging files must not hold the engine (and the CPU) away from the requests
    /// served meanwhile (one read per file kept lookups at ~350 µs for half a minute
    /// after such a mount). Errors: the engine's or the cache dir's; the index then
    /// stays partial (files are only not evicted).
    pub(crate) fn index_staging(&self) -> Result<()> {
        let here = self.here();
        let since = std::time::Instant::now();
        let mut inos = self.cache.staging_inodes()?;
        inos.sort_unstable();
        for batch in inos.chunks(INDEX_BATCH) {
            if self.coherence.stopped() {
                break;
            }
            let rows = deskfs_meta::read(&*self.meta, |t| {
                batch
                    .iter()
                    .map(|&ino| {
                        Ok((
                            ino,
                            t.get_inode(ino)?
                                .map(|r| (r.local == here, r.dirty, r.size)),
                        ))
                    })
                    .collect::<Result<Vec<_>>>()
            })?;
            for (ino, row) in rows {
                match row {
                    Some((true, dirty, size)) => {
                        if !dirty && !self.is_open(ino) {
                            self.cache.staging_clean(ino, size);
                        }
                    }
                    _ => self.remove_stale_staging(ino, here)?,
                }
            }
            std::thread::sleep(INDEX_PAUSE);
        }
        tracing::info!(
            files = inos.len(),
            seconds = since.elapsed().as_secs_f64(),
            "staging files indexed"
        );
        Ok(())
    }

    /// Removes the staging file of `ino` when, read again under the staging-area lock,
    /// its row is gone or names another cache as holding the content, and no handle has
    /// it open. Errors: the engine's or the cache dir's.
    fn remove_stale_staging(&self, ino: Ino, here: deskfs_meta::Local) -> Result<()> {
        let _lock = self.cache.local_lock()?;
        let still_stale = self.meta.get_inode(ino)?.is_none_or(|r| r.local != here);
        if still_stale && !self.is_open(ino) {
            self.cache.remove_staging(ino)?;
        }
        Ok(())
    }

    /// The object key of workspace path `path` in this workspace's bucket.
    pub fn key_for(&self, path: &[u8]) -> String {
        let b = &self.bucket;
        paths::key_of_with(path, b.spec().prefix.len(), |k| b.key_storable(k))
    }

    /// The metadata engine (for status/fsck tooling).
    pub fn meta(&self) -> &Arc<dyn MetaEngine> {
        &self.meta
    }

    /// The bucket.
    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }
}

pub(crate) fn poisoned() -> VfsError {
    VfsError::Io(std::io::Error::other("internal lock poisoned"))
}

#[cfg(test)]
mod tests;

/// Staging files whose rows [`Vfs::index_staging`] reads in one snapshot.
const INDEX_BATCH: usize = 128;
/// Pause of [`Vfs::index_staging`] between two batches (lets waiting requests take the
/// engine: a thread that unlocks a mutex and locks it again at once usually wins).
const INDEX_PAUSE: std::time::Duration = std::time::Duration::from_micros(300);

/// Starts [`Vfs::index_staging`] on a thread of its own (holding the VFS weakly).
fn index_staging_later(vfs: &Arc<Vfs>) {
    let weak = Arc::downgrade(vfs);
    let spawned = std::thread::Builder::new()
        .name("deskfs-staging-index".into())
        .spawn(move || {
            // Nothing waits for the index: spare CPU only, so the requests served while
            // it runs keep theirs (a batch's engine lock is short; a waiting request
            // blocks and leaves the CPU to it). A failure leaves the default priority.
            // SAFETY: plain syscalls on this thread's own id.
            unsafe {
                let tid = libc::gettid();
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
            }
            let Some(vfs) = weak.upgrade() else { return };
            if let Err(e) = vfs.index_staging() {
                tracing::warn!(error = %e, "indexing the staging files failed; some clean files will not be evicted");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the staging index thread");
    }
}
