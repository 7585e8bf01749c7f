//! What `deskfs status` reports about a live workspace.

use serde::Serialize;

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
}

impl Vfs {
    /// Current status (cache, dirty data, pending and failing uploads).
    pub fn status(&self) -> Result<VfsStatus> {
        let (usage, pending, failed) = deskfs_meta::read(&*self.meta, |t| {
            Ok::<_, crate::VfsError>((t.usage()?, t.pending_stats()?, t.failed_pending(10)?))
        })?;
        let c = self.cache.stats();
        Ok(VfsStatus {
            meta: self.meta.describe(),
            bucket: self.bucket.spec().url.clone(),
            cache_dir: self.cache.root().display().to_string(),
            durability: self.cfg.durability,
            cache_block_bytes: c.block_bytes,
            cache_clean_bytes: c.clean_staging_bytes,
            cache_capacity: c.capacity,
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
            open_files: self.handles.lock().map(|h| h.len()).unwrap_or(0),
            session: self.coherence.session(),
            peers: self.coherence.peers(),
            fences: self.coherence.fence_report(),
            kernel_inodes: self.refs.held_count(),
            kept_orphans: self.refs.orphan_count(),
            waiting_for: self.remote.list(),
            engine: self.meta.counters(),
        })
    }
}
