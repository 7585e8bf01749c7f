//! Open file handles and the in-memory state of open inodes.

use std::fs::File;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU64, AtomicU8};
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
    /// The first read began near offset 0 and no read jumped since (a whole-file reader:
    /// see [`crate::fill`]).
    pub(crate) from_start: std::sync::atomic::AtomicBool,
    /// Lock owners that took locks through this open file (dropped at its release).
    pub(crate) lock_owners: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Whether this open is counted in the metadata engine's open-file table (for other
    /// mounts); see [`OpenRecord`]. Moved only by compare-and-swap, outside transactions,
    /// so an open is counted once and uncounted once however recording, publishing and
    /// release race.
    pub(crate) record: AtomicU8,
    /// Served by FUSE passthrough (see `passthrough`); cleared when the kernel was not
    /// given the backing file after all.
    pub(crate) passthrough: std::sync::atomic::AtomicBool,
}

/// The states of a handle's open-file record.
///
/// ```text
/// Unrecorded --claim--> Recording --finish--> Recorded --release--> Closed
///      ^                    |  abandon (the record's transaction failed)
///      +--------------------+
/// Unrecorded/Recording --release--> Closed   (a Recording one is taken back by its recorder)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpenRecord {
    /// Not in the open-file table (opened while the mount was alone).
    Unrecorded = 0,
    /// Being added to the table by someone now.
    Recording = 1,
    /// Counted in the table.
    Recorded = 2,
    /// Released.
    Closed = 3,
}

impl OpenRecord {
    fn from_u8(v: u8) -> OpenRecord {
        match v {
            0 => OpenRecord::Unrecorded,
            1 => OpenRecord::Recording,
            2 => OpenRecord::Recorded,
            _ => OpenRecord::Closed,
        }
    }
}

impl Handle {
    /// A new handle on `ino` whose open-file record starts in state `record`.
    pub(crate) fn new(
        ino: u64,
        read: bool,
        write: bool,
        append: bool,
        dir: bool,
        record: OpenRecord,
    ) -> Handle {
        Handle {
            ino,
            write,
            read,
            append,
            dir,
            last_read_end: AtomicU64::new(u64::MAX),
            ra_blocks: AtomicU64::new(0),
            from_start: std::sync::atomic::AtomicBool::new(false),
            lock_owners: Default::default(),
            record: AtomicU8::new(record as u8),
            passthrough: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Claims the recording of an unrecorded open (true: the caller must add the record,
    /// then call [`Handle::finish_record`] or [`Handle::abandon_record`]).
    pub(crate) fn claim_record(&self) -> bool {
        self.record
            .compare_exchange(
                OpenRecord::Unrecorded as u8,
                OpenRecord::Recording as u8,
                SeqCst,
                SeqCst,
            )
            .is_ok()
    }

    /// The record was committed. Returns [`OpenRecord::Closed`] when the handle was
    /// released meanwhile: then the caller removes the record again.
    pub(crate) fn finish_record(&self) -> OpenRecord {
        match self.record.compare_exchange(
            OpenRecord::Recording as u8,
            OpenRecord::Recorded as u8,
            SeqCst,
            SeqCst,
        ) {
            Ok(_) => OpenRecord::Recorded,
            Err(v) => OpenRecord::from_u8(v),
        }
    }

    /// The record's transaction failed: the open is unrecorded again (unless released).
    pub(crate) fn abandon_record(&self) {
        let _ = self.record.compare_exchange(
            OpenRecord::Recording as u8,
            OpenRecord::Unrecorded as u8,
            SeqCst,
            SeqCst,
        );
    }

    /// Marks the handle released; returns whether its record must be removed (it was
    /// [`OpenRecord::Recorded`]). A `Recording` one is removed by its recorder.
    pub(crate) fn close_record(&self) -> bool {
        OpenRecord::from_u8(self.record.swap(OpenRecord::Closed as u8, SeqCst))
            == OpenRecord::Recorded
    }

    /// The session the record was in is gone (fenced): the open counts as unrecorded.
    pub(crate) fn unrecord(&self) {
        let _ = self.record.compare_exchange(
            OpenRecord::Recorded as u8,
            OpenRecord::Unrecorded as u8,
            SeqCst,
            SeqCst,
        );
    }
}

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
    /// Bytes were written (a write, `fallocate`, a copy, kernel writes through a backing
    /// file) since the last commit — not only a truncation or a ctime: what a lost lease
    /// keeps as a conflict copy (see `Vfs::commit_after_fence`).
    pub(crate) wrote: bool,
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
    /// The mount session the uncommitted writes began under (a commit under another one
    /// means they were made while the lease was lost: see `Vfs::commit_after_fence`).
    pub(crate) dirty_session: u64,
    /// Committed content version the in-memory values belong to.
    pub(crate) version: u64,
    /// Removed from the state table: whoever locks it must fetch the current state.
    pub(crate) detached: bool,
    /// The content version that was uploaded while the file was open: its staging file
    /// becomes evictable at the last close if nothing was written since.
    pub(crate) clean_at_close: Option<u64>,
    /// Created by this mount for writing and not written yet (since when, ns): its row is
    /// dirty from birth and the writer lock is held from the create, so no uploader can
    /// mark it clean before the first write — which then needs no look at the row. Ends
    /// at the first commit or `flush`, or when this mount's uploader stops waiting.
    pub(crate) create_guard: Option<i64>,
    /// Handles served by FUSE passthrough and their backing file (see `passthrough`).
    pub(crate) pt: crate::passthrough::Passthrough,
    /// Whether the row is known dirty in the durable metadata log (`fdatasync` then
    /// needs no flush of it: see `datasync`).
    pub(crate) dirty_mark: crate::datasync::DirtyMark,
    /// The staging file's flush an `fsync` started before its commit, for
    /// `Vfs::flush_devices` to wait for.
    pub(crate) data_sync: Option<crate::datasync::DataSync>,
}

/// Whether `f` could be locked exclusively right now (`flock(LOCK_EX | LOCK_NB)`, released
/// at once): false while a mount sharing this cache dir holds the staging file's writer
/// lock ([`InodeState::hold_writer_lock`]), i.e. has writes to it not yet committed.
/// Errors: an `flock` failure other than `EWOULDBLOCK`.
pub(crate) fn no_uncommitted_writers(f: &File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscalls on an open fd owned by `f`.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Ok(false),
            _ => Err(e),
        };
    }
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
    Ok(true)
}

impl InodeState {
    /// Takes the writer lock of the staging file `f` (a shared `flock`, held until the
    /// writes are committed): uploaders of every mount sharing the cache dir see that the
    /// file holds uncommitted writes and do not upload it as the committed version. Waits
    /// only while an uploader probes (an instant). Errors: `flock` failures (`EIO`).
    pub(crate) fn hold_writer_lock(&mut self, f: &File) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: plain syscall on an open fd owned by `f`.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) };
            if rc == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }

    /// The uncommitted writes are committed (or set aside): the writer lock goes.
    pub(crate) fn writes_settled(&mut self) {
        self.uncommitted = false;
        self.wrote = false;
        self.create_guard = None;
        if let Some(f) = &self.staging {
            use std::os::fd::AsRawFd;
            // SAFETY: plain syscall on an open fd owned by `f`.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        }
    }

    /// Loads size, times and content version from a committed row.
    pub(crate) fn fill(&mut self, row: &deskfs_meta::InodeRow) {
        self.size = row.size;
        self.mtime_ns = row.mtime_ns;
        self.ctime_ns = row.ctime_ns;
        self.version = row.data_version;
        self.loaded = true;
    }

    /// An attribute change that only moves ctime (a chown to the same owner), carried
    /// by the next commit as writes are.
    pub(crate) fn note_ctime(&mut self, now: i64, session: u64) {
        self.ctime_ns = now;
        if !self.uncommitted {
            self.uncommitted = true;
            self.dirty_since_ns = now;
            self.dirty_session = session;
        }
    }

    /// Records bytes written at `now` (ns) by a mount whose session is `session`:
    /// mtime and ctime, the start of the uncommitted period (and the session it began
    /// under), a new write generation, and [`InodeState::wrote`].
    pub(crate) fn note_change(&mut self, now: i64, session: u64) {
        self.note_size_change(now, session);
        self.wrote = true;
    }

    /// [`InodeState::note_change`] for a truncation: the content changes (a new write
    /// generation, mtime, ctime) but no byte is written.
    pub(crate) fn note_size_change(&mut self, now: i64, session: u64) {
        self.mtime_ns = now;
        self.ctime_ns = now;
        if !self.uncommitted {
            self.uncommitted = true;
            self.dirty_since_ns = now;
            self.dirty_session = session;
        }
        self.write_gen += 1;
    }
}
