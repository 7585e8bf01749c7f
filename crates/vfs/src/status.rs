//! What `deskfs status` reports about a live workspace.

use serde::Serialize;

use deskfs_meta::MetaEngine;

use crate::{Result, Vfs};

/// A path whose upload keeps failing.
#[derive(Clone, Debug, Serialize)]
pub struct FailedPath {
    /// Workspace path (lossy UTF-8).
    pub path: String,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Last error message.
    pub error: String,
}

/// Snapshot of a workspace's state.
#[derive(Clone, Debug, Serialize)]
pub struct VfsStatus {
    /// Metadata engine description.
    pub meta: String,
    /// Bucket URL.
    pub bucket: String,
    /// Cache directory.
    pub cache_dir: String,
    /// When this mount acknowledges `close`/`fsync`: `local` or `bucket`.
    pub durability: crate::Durability,
    /// Bytes in the block cache.
    pub cache_block_bytes: u64,
    /// Bytes of clean, evictable staging files.
    pub cache_clean_bytes: u64,
    /// Cache size cap, bytes.
    pub cache_capacity: u64,
    /// Bytes the cache dir's file system lacks of its free-space reserve (clean data is
    /// being evicted; writes come through the daemon): 0 normally.
    pub cache_space_short: u64,
    /// Writes that found the cache dir's file system full and evicted clean data first.
    pub cache_space_evictions: u64,
    /// Empty files ready for new staging files (see `deskfs_cache`'s pool).
    pub cache_reserve_files: u64,
    /// Files being assembled whole from the bucket now (see `fill`), and the bytes they
    /// span.
    pub cache_fills: u64,
    /// Their bytes.
    pub cache_fill_bytes: u64,
    /// Whole-file fills made clean local copies so far (their next opens use passthrough).
    pub cache_fills_adopted: u64,
    /// Inodes in the namespace.
    pub inodes: u64,
    /// Sum of file sizes, bytes.
    pub bytes: u64,
    /// Files whose content is not in the bucket yet.
    pub dirty_files: u64,
    /// Their bytes.
    pub dirty_bytes: u64,
    /// Paths waiting for the uploader.
    pub pending_uploads: u64,
    /// Of those, failing ones.
    pub failing_uploads: u64,
    /// The most recent failures.
    pub failures: Vec<FailedPath>,
    /// Files whose staging file's flush failed: every `fsync` of them fails with `EIO`
    /// until they are truncated to zero or removed (see `flush_failures`).
    pub flush_failures: Vec<crate::FlushFailure>,
    /// Open files in this mount.
    pub open_files: usize,
    /// This mount's session id in the metadata engine.
    pub session: u64,
    /// Who else is live (see `coherence`).
    pub peers: crate::coherence::Peers,
    /// How often this mount lost its session lease, and the last time.
    pub fences: crate::coherence::FenceReport,
    /// Inodes the kernel holds references to (lookup counts).
    pub kernel_inodes: usize,
    /// Orphans (no name left) kept while this mount holds them.
    pub kept_orphans: usize,
    /// Opens waiting for content only another mount's cache holds (close-to-open).
    pub waiting_for: Vec<crate::remote::RemoteWait>,
    /// The metadata engine's counters (round trips, commits, retries, refused batches).
    pub engine: deskfs_meta::EngineCounters,
    /// Device flushes of the metadata log this mount ran (fsync, deletes, evictions;
    /// `fdatasync` of a durably dirty file needs none).
    pub meta_flushes: u64,
    /// Device flushes of staging files this mount ran (`fsync`, `fdatasync`: one each).
    pub data_flushes: u64,
    /// FUSE passthrough is used for opens now.
    pub passthrough: bool,
    /// Directories being refreshed from the bucket now, mostly in the background (large
    /// ones, and those the bucket did not answer for within
    /// [`crate::VfsConfig::relist_wait`]).
    pub background_relists: usize,
    /// Directories whose last refresh from the bucket failed: their known entries are
    /// served, and the refresh is tried again after `list_ttl`.
    pub failed_relists: usize,
    /// Memory held by block fetches and upload buffers, and its budget (see
    /// [`crate::buffers`]).
    pub buffers: crate::buffers::BufferStats,
    /// Opens served through passthrough so far.
    pub passthrough_opens: u64,
    /// Bucket reads (GET, HEAD, LIST) tried again after a transient failure, and those
    /// that failed after their last try (see `deskfs_bucket::read_retry`).
    pub bucket_reads: deskfs_bucket::ReadCounters,
    /// Of those, opens given a complete whole-file fill (a file just read whole).
    pub passthrough_fill_opens: u64,
    /// When accesses move atime: `relatime` or `noatime` (see [`crate::atime`]).
    pub atime: String,
    /// Access times queued for the database (committed within a feed tick).
    pub atime_queued: usize,
    /// Access times committed since the mount.
    pub atime_committed: u64,
    /// The bucket lacked its marker at the last look (see
    /// [`crate::VfsConfig::bucket_marker`]): deletions seen in listings are not applied.
    pub bucket_marker_missing: bool,
    /// Blocks of bucket-backed files readers got from this cache, since the mount.
    pub block_hits: u64,
    /// Blocks readers waited for from the bucket, since the mount.
    pub block_misses: u64,
    /// Bytes block fetches brought from the bucket (readers' and readahead's).
    pub block_fetched_bytes: u64,
    /// Blocking lock requests that had to wait, since the mount.
    pub lock_waits: u64,
    /// Blocking lock requests waiting now.
    pub lock_waiting: u64,
    /// While other mounts are live: ms since this mount last read the change feed to its
    /// end (what other mounts changed reaches this mount's kernel caches that late, at
    /// most); `None` while alone (nothing to read).
    pub feed_lag_ms: Option<u64>,
    /// How long (ms) a burst of request-path changes has held the uploads that are due
    /// (they go after `VfsConfig::burst_quiet` without a change, or once
    /// `uploader::BURST_DEFER` past due); `None` when no burst holds them.
    pub uploads_held_ms: Option<u64>,
    /// The longest a burst holds an upload, ms (`uploader::BURST_DEFER`).
    pub burst_defer_ms: u64,
    /// Requests this mount made to the bucket, by kind and answer (see
    /// `deskfs_bucket::RequestCounters`).
    pub bucket_requests: Vec<deskfs_bucket::RequestCount>,
    /// Expired mount sessions whose open files are held for them (a paused daemon may
    /// come back and read on; see `session`), oldest first.
    pub held_sessions: Vec<HeldSession>,
}

/// Blocks of files whose content is in the bucket, as readers asked for them: answered
/// from this cache (the block cache or a file being assembled whole) or waited for from
/// the bucket; and the bytes block fetches brought (readers' and readahead's).
#[derive(Default, Debug)]
pub(crate) struct BlockCounters {
    pub(crate) hits: std::sync::atomic::AtomicU64,
    pub(crate) misses: std::sync::atomic::AtomicU64,
    pub(crate) fetched_bytes: std::sync::atomic::AtomicU64,
}

impl BlockCounters {
    pub(crate) fn hit(&self) {
        self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub(crate) fn miss(&self) {
        self.misses
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub(crate) fn fetched(&self, bytes: u64) {
        self.fetched_bytes
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One expired session whose open-file records are held (design record 0018).
#[derive(Clone, Debug, Serialize)]
pub struct HeldSession {
    /// Its session id.
    pub session: u64,
    /// Its daemon's process id, on `host`.
    pub pid: u32,
    /// Its host name.
    pub host: String,
    /// Since when its open files are held (expired), ns since the epoch (database clock).
    pub since_ns: i64,
    /// Seconds until the grace (`--expired-open-grace`) runs out and they are released
    /// (negative: due at the next heartbeat).
    pub release_in_s: i64,
}

impl Vfs {
    /// Current status (cache, dirty data, pending and failing uploads).
    pub fn status(&self) -> Result<VfsStatus> {
        let (lock_waits, lock_waiting) = self.locks.wait_counts();
        // The inode scan off the engine's connection (see `MetaEngine::usage`).
        let usage = self.meta.usage()?;
        let (pending, failed, held) = deskfs_meta::read(&*self.meta, |t| {
            Ok::<_, crate::VfsError>((
                t.pending_stats()?,
                t.failed_pending(10)?,
                t.kv_with_prefix(deskfs_meta::HELD_OPENS_PREFIX)?,
            ))
        })?;
        let c = self.cache.stats();
        let (fills, fill_bytes) = self.fills.usage();
        Ok(VfsStatus {
            meta: self.meta.describe(),
            bucket: self.bucket.spec().url.clone(),
            cache_dir: self.cache.root().display().to_string(),
            durability: self.cfg.durability,
            cache_block_bytes: c.block_bytes,
            cache_clean_bytes: c.clean_staging_bytes,
            cache_capacity: c.capacity,
            cache_space_short: self.cache.space_short(),
            cache_space_evictions: self
                .space_evictions
                .load(std::sync::atomic::Ordering::Relaxed),
            cache_reserve_files: c.reserve_files,
            cache_fills: fills,
            cache_fill_bytes: fill_bytes,
            cache_fills_adopted: self
                .fills
                .adopted
                .load(std::sync::atomic::Ordering::Relaxed),
            inodes: usage.inodes,
            bytes: usage.bytes,
            dirty_files: usage.dirty_inodes,
            dirty_bytes: usage.dirty_bytes,
            pending_uploads: pending.pending,
            failing_uploads: pending.failing,
            failures: failed
                .into_iter()
                .map(|f| FailedPath {
                    path: String::from_utf8_lossy(&f.path).into_owned(),
                    attempts: f.attempts,
                    error: f.last_error.unwrap_or_default(),
                })
                .collect(),
            flush_failures: self.flush_failures_with_paths(),
            open_files: self.handles.lock().map(|h| h.len()).unwrap_or(0),
            session: self.coherence.session(),
            peers: self.coherence.peers(),
            fences: self.coherence.fence_report(),
            kernel_inodes: self.refs.held_count(),
            kept_orphans: self.refs.orphan_count(),
            waiting_for: self.remote.list(),
            engine: self.meta.counters(),
            meta_flushes: self.meta_flush.count(),
            data_flushes: self.data_flushes.load(std::sync::atomic::Ordering::Relaxed),
            passthrough: self.passthrough_on(),
            background_relists: self.relists.running(),
            failed_relists: self.relists.failing(),
            buffers: self.buffers.stats(),
            bucket_reads: self.bucket.read_counters(),
            passthrough_opens: self
                .fills
                .passthrough_opens
                .load(std::sync::atomic::Ordering::Relaxed),
            passthrough_fill_opens: self
                .fills
                .fill_opens
                .load(std::sync::atomic::Ordering::Relaxed),
            atime: self.cfg.atime.to_string(),
            atime_queued: self.atimes.queued(),
            atime_committed: self.atimes.committed(),
            block_hits: self.blocks.hits.load(std::sync::atomic::Ordering::Relaxed),
            block_misses: self
                .blocks
                .misses
                .load(std::sync::atomic::Ordering::Relaxed),
            block_fetched_bytes: self
                .blocks
                .fetched_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            feed_lag_ms: self.shared().then(|| {
                let at = self
                    .feed_caught_up_ns
                    .load(std::sync::atomic::Ordering::Relaxed);
                u64::try_from(crate::now_ns().saturating_sub(at) / 1_000_000).unwrap_or(0)
            }),
            uploads_held_ms: {
                let since = self
                    .uploader
                    .burst_since_ns
                    .load(std::sync::atomic::Ordering::Relaxed);
                (since != 0).then(|| {
                    u64::try_from(crate::now_ns().saturating_sub(since) / 1_000_000).unwrap_or(0)
                })
            },
            burst_defer_ms: crate::uploader::BURST_DEFER.as_millis() as u64,
            bucket_requests: self.bucket.request_counts(),
            lock_waits,
            lock_waiting,
            bucket_marker_missing: self
                .marker_missing
                .load(std::sync::atomic::Ordering::SeqCst),
            held_sessions: self.held_sessions(&held),
        })
    }

    /// The held-session records `held` (`kv` rows) as [`HeldSession`]s, oldest first.
    fn held_sessions(&self, held: &[(String, String)]) -> Vec<HeldSession> {
        let now = crate::now_ns();
        let grace = i64::try_from(self.cfg.expired_open_grace.as_nanos()).unwrap_or(i64::MAX);
        let mut out: Vec<HeldSession> = held
            .iter()
            .filter_map(|(k, v)| {
                let session = deskfs_meta::held_opens_session(k)?;
                let h = deskfs_meta::HeldOpens::parse(v)?;
                Some(HeldSession {
                    session,
                    pid: h.pid,
                    host: h.host,
                    since_ns: h.since_ns,
                    release_in_s: h
                        .since_ns
                        .saturating_add(grace)
                        .saturating_sub(now)
                        .div_euclid(1_000_000_000),
                })
            })
            .collect();
        out.sort_by_key(|h| h.since_ns);
        out
    }
}

/// What is still waiting for the bucket, for progress lines and timeout messages of
/// `deskfs sync` / `umount`: counts and a few paths, failing ones first.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PendingSummary {
    /// Paths waiting for the uploader.
    pub pending: u64,
    /// Of those, failing ones.
    pub failing: u64,
    /// Up to the requested number of them (`attempts` 0 and an empty `error`: not tried
    /// yet or in progress).
    pub first: Vec<FailedPath>,
}

/// Longest error text a [`PendingSummary`] line shows per path, characters.
const ERROR_SHOWN: usize = 120;

impl Vfs {
    /// The recorded flush failures, each with one of its paths (best effort: a failed
    /// read leaves the path empty).
    fn flush_failures_with_paths(&self) -> Vec<crate::FlushFailure> {
        let mut v = self.flush_failures.list();
        for f in &mut v {
            let paths = deskfs_meta::read(&*self.meta, |t| {
                Ok::<_, crate::VfsError>(t.paths_of(f.ino)?)
            });
            if let Some(p) = paths.ok().and_then(|p| p.into_iter().next()) {
                f.path = String::from_utf8_lossy(&p).into_owned();
            }
        }
        v
    }
}

impl PendingSummary {
    /// Reads the summary from the metadata engine: up to `limit` paths, failing first.
    /// Errors: the engine's.
    pub fn read(meta: &dyn MetaEngine, limit: usize) -> Result<PendingSummary> {
        let (stats, failed, due) = deskfs_meta::read(meta, |t| {
            Ok::<_, crate::VfsError>((
                t.pending_stats()?,
                t.failed_pending(limit)?,
                t.due_pending(i64::MAX, limit)?,
            ))
        })?;
        let mut first: Vec<FailedPath> = Vec::new();
        for r in failed.into_iter().chain(due) {
            // NUL-led paths name no file (orphans' uploads).
            let path =
                String::from_utf8_lossy(r.path.strip_prefix(b"\0").unwrap_or(&r.path)).into_owned();
            if first.len() >= limit || first.iter().any(|f| f.path == path) {
                continue;
            }
            first.push(FailedPath {
                path,
                attempts: r.attempts,
                error: r.last_error.unwrap_or_default(),
            });
        }
        Ok(PendingSummary {
            pending: stats.pending,
            failing: stats.failing,
            first,
        })
    }
}

impl std::fmt::Display for PendingSummary {
    /// `3 upload(s): a/b.db-shm (attempt 5: not found), c.txt (in progress), …`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} upload(s)", self.pending)?;
        for (i, p) in self.first.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { ", " })?;
            if p.attempts > 0 {
                let line = p.error.lines().next().unwrap_or("");
                let mut e: String = line.chars().take(ERROR_SHOWN).collect();
                if e.len() < line.len() {
                    e.push('…');
                }
                write!(f, "{} (attempt {}: {e})", p.path, p.attempts)?;
            } else {
                write!(f, "{} (in progress)", p.path)?;
            }
        }
        if (self.first.len() as u64) < self.pending {
            f.write_str(", …")?;
        }
        Ok(())
    }
}
