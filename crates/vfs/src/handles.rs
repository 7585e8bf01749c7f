//! Open file handles and the in-memory state of open inodes.

use std::fs::File;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// One open file description (what `open(2)` returned, as the kernel's `fh`).
#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) ino: u64,
    /// Opened for writing (O_WRONLY / O_RDWR).
    pub(crate) write: bool,
    /// Opened for reading.
    pub(crate) read: bool,
    /// O_APPEND: every write goes to the end of the file.
    pub(crate) append: bool,
    /// Is a directory handle.
    pub(crate) dir: bool,
    /// End offset of the last read (sequential-read detection for readahead).
    pub(crate) last_read_end: AtomicU64,
    /// Current readahead window, blocks: starts small (the first byte should not wait
    /// behind a wall of prefetches), doubles with each sequential read up to the
    /// configured maximum, drops to 0 on a random read.
    pub(crate) ra_blocks: AtomicU64,
    /// Lock owners that took locks through this open file (dropped at its release).
    pub(crate) lock_owners: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Whether this open is recorded in the metadata engine's open-file table (for other
    /// mounts): [`OPEN_UNRECORDED`], [`OPEN_RECORDED`] or [`OPEN_CLOSED`]. Moves only by
    /// compare-and-swap inside the transaction that adds the record, so an open is
    /// counted once and uncounted once.
    pub(crate) recorded: std::sync::atomic::AtomicU8,
}

impl Handle {
    /// Inside a metadata transaction: records this open in the open-file table for
    /// `session`, unless it already is or was released (compare-and-swap, so an open is
    /// counted once however many callers race).
    pub(crate) fn record_open(
        &self,
        t: &mut dyn deskfs_meta::MetaTxn,
        session: u64,
    ) -> deskfs_meta::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        if self
            .recorded
            .compare_exchange(OPEN_UNRECORDED, OPEN_RECORDED, SeqCst, SeqCst)
            .is_ok()
        {
            t.add_open(self.ino, session, 1)?;
        }
        Ok(())
    }
}

/// The open is not in the open-file table (this mount was alone when it was opened).
pub(crate) const OPEN_UNRECORDED: u8 = 0;
/// The open is counted in the open-file table.
pub(crate) const OPEN_RECORDED: u8 = 1;
/// Released.
pub(crate) const OPEN_CLOSED: u8 = 2;

/// In-memory state of an inode that is open (or being operated on). Guarded by its own
/// mutex; the metadata engine stays the truth for everything committed.
#[derive(Debug, Default)]
pub(crate) struct InodeState {
    /// Open handles on this inode in this mount.
    pub(crate) open_count: u32,
    /// The staging file, once the content is local.
    pub(crate) staging: Option<Arc<File>>,
    /// Writes (or a truncate) not yet committed to the metadata engine.
    pub(crate) uncommitted: bool,
    /// Current size including uncommitted writes, bytes (valid when `loaded`).
    pub(crate) size: u64,
    /// Current mtime including uncommitted writes, ns.
    pub(crate) mtime_ns: i64,
    /// Current ctime including uncommitted writes, ns.
    pub(crate) ctime_ns: i64,
    /// `size`/`mtime_ns` were loaded from the metadata engine.
    pub(crate) loaded: bool,
    /// Bumped by every write; the uploader compares it around an upload.
    pub(crate) write_gen: u64,
    /// Time of the first uncommitted write, ns (bounds upload deferral).
    pub(crate) dirty_since_ns: i64,
    /// Committed content version the in-memory values belong to.
    pub(crate) version: u64,
    /// Removed from the state table: whoever locks it must fetch the current state.
    pub(crate) detached: bool,
}

impl InodeState {
    /// Records a content change at `now` (ns): mtime and ctime, the start of the
    /// uncommitted period, and a new write generation.
    pub(crate) fn note_change(&mut self, now: i64) {
        self.mtime_ns = now;
        self.ctime_ns = now;
        if !self.uncommitted {
            self.uncommitted = true;
            self.dirty_since_ns = now;
        }
        self.write_gen += 1;
    }
}
