//! `fdatasync` with one device flush.
//!
//! An `fsync` makes two things durable: the staging file's data and the metadata commit
//! that names it (size, times, content version), which costs a second device flush (the
//! metadata log). `fdatasync(2)` promises less (POSIX: the data and what is needed to
//! read it back, not the times), and the crash recovery of a dirty inode already takes
//! its staging file as the truth — a new content version of the staging file's length
//! (`Vfs::recover`). So once the inode's row is *durably* dirty, the data flush alone
//! suffices: after a power loss the row comes back dirty, and recovery adopts exactly the
//! bytes `fdatasync` made durable. What must never happen is a durable clean row over
//! newer bytes; so every clean mark of the uploader is taken under the inode's state
//! lock, and forgets what this mount knew.
//!
//! ```text
//!   Unknown ──commit leaving the row dirty──▶ Committed(at)
//!   Committed(at) ──a metadata flush that began after `at` completed──▶ Durable
//!   any ──the uploader marks the row clean──▶ Unknown
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::{Ino, Result, Vfs};

/// The staging file's `fdatasync`, running on the runtime's blocking pool: started by
/// `fsync` before its metadata commit (the data's flush does not depend on the commit),
/// waited for after the metadata flush. Its result is always taken by [`DataSync::wait`]:
/// a writeback error is reported once per file (`errseq`), so one dropped here would be
/// lost for good.
#[derive(Debug)]
pub(crate) struct DataSync(std::sync::mpsc::Receiver<std::io::Result<()>>);

/// `fdatasync(2)` of a staging file: the one call every data flush of an `fsync` goes
/// through, counted in `count` (`deskfs status`: `data_flushes`). Errors: the flush's
/// (`EIO`, `ENOSPC`).
pub(crate) fn flush_data(f: &std::fs::File, count: &AtomicU64) -> std::io::Result<()> {
    count.fetch_add(1, Ordering::Relaxed);
    f.sync_data()
}

impl DataSync {
    /// Starts [`flush_data`] of `f` on `rt`'s blocking pool, counted in `count`.
    pub(crate) fn start(
        rt: &tokio::runtime::Handle,
        f: Arc<std::fs::File>,
        count: Arc<AtomicU64>,
    ) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn_blocking(move || {
            let _ = tx.send(flush_data(&f, &count));
        });
        DataSync(rx)
    }

    /// Waits for the flush. Errors: the flush's (`EIO`, `ENOSPC`), or `EIO` when it never
    /// ran (the runtime is shutting down).
    pub(crate) fn wait(self) -> Result<()> {
        self.0.recv().map_err(|_| {
            crate::VfsError::Io(std::io::Error::other(
                "the staging file's fdatasync never ran (the runtime is shutting down)",
            ))
        })??;
        Ok(())
    }
}

/// What this mount knows of the inode's row being dirty in the durable metadata log,
/// within one alone period of the mount (`Coherence::alone_period`): while other mounts
/// are live, their uploaders may mark rows clean, so nothing is known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum DirtyMark {
    /// Nothing known (a fresh state, the row was marked clean since, or other mounts
    /// were live).
    #[default]
    Unknown,
    /// This mount committed the row dirty during alone period `period`; the commit had
    /// returned at `at`, and no clean mark came since.
    Committed { at: Instant, period: u64 },
    /// Dirty in the durable log since alone period `period`, and no clean mark since.
    Durable { period: u64 },
}

impl DirtyMark {
    /// A commit that leaves the row dirty returned just now, in alone period `period`
    /// (`None`: shared). The earliest one of a period counts.
    pub(crate) fn committed(&mut self, period: Option<u64>) {
        let Some(period) = period else {
            *self = DirtyMark::Unknown;
            return;
        };
        if self.period() != Some(period) {
            *self = DirtyMark::Committed {
                at: Instant::now(),
                period,
            };
        }
    }

    /// The uploader marked the row clean.
    pub(crate) fn cleaned(&mut self) {
        *self = DirtyMark::Unknown;
    }

    /// A metadata flush that began after every commit of this state completed, in alone
    /// period `period`: a row committed dirty is durably dirty now.
    pub(crate) fn flushed(&mut self, period: Option<u64>) {
        if let (Some(p), Some(now)) = (self.period(), period) {
            if p == now {
                *self = DirtyMark::Durable { period: p };
                return;
            }
        }
        *self = DirtyMark::Unknown;
    }

    fn period(&self) -> Option<u64> {
        match self {
            DirtyMark::Unknown => None,
            DirtyMark::Committed { period, .. } | DirtyMark::Durable { period } => Some(*period),
        }
    }

    /// For alone period `period` (`None`: shared): `None` when the row is not known
    /// dirty; `Some(None)` when it is durably dirty; `Some(Some(at))` when it is dirty
    /// in the durable log once a flush that began at or after `at` completed.
    pub(crate) fn needs_flush_after(&self, period: Option<u64>) -> Option<Option<Instant>> {
        match *self {
            DirtyMark::Committed { at, period: p } if Some(p) == period => Some(Some(at)),
            DirtyMark::Durable { period: p } if Some(p) == period => Some(None),
            _ => None,
        }
    }
}

impl Vfs {
    /// Runs `txn` — a transaction that may mark `ino` clean — under the inode's state
    /// lock when it has a state (no `fdatasync` decides meanwhile), and forgets the
    /// state's dirty mark when `cleaned` says it did. Blocks on the lock: call it on a
    /// blocking thread, never on a runtime worker. Errors: `txn`'s.
    pub(crate) fn clean_locked<T>(
        &self,
        ino: Ino,
        txn: impl FnOnce() -> Result<T>,
        cleaned: impl FnOnce(&T) -> bool,
    ) -> Result<T> {
        let st = self.inodes.lock().ok().and_then(|m| m.get(&ino).cloned());
        let mut guard = st
            .as_ref()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()));
        let out = txn()?;
        if cleaned(&out) {
            if let Some(g) = guard.as_mut() {
                g.dirty_mark.cleaned();
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    /// A started flush reports its outcome; one that never ran (its runtime gone) is an
    /// error, not a success: an fsync must not return 0 without its data flush.
    #[test]
    fn a_data_sync_reports_its_flush_and_one_that_never_ran_fails() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::sync::Arc::new(std::fs::File::create(dir.path().join("f")).unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let h = rt.handle().clone();
        let n = Arc::new(AtomicU64::new(0));
        DataSync::start(&h, f.clone(), n.clone())
            .wait()
            .expect("flushed");
        assert_eq!(n.load(Ordering::Relaxed), 1);
        rt.shutdown_background();
        let never = DataSync::start(&h, f, n);
        assert!(
            matches!(never.wait(), Err(crate::VfsError::Io(_))),
            "a flush that never ran counted as done"
        );
    }

    #[test]
    fn the_earliest_dirty_commit_of_an_alone_period_counts_and_a_clean_mark_forgets_it() {
        let mut m = DirtyMark::default();
        assert_eq!(m.needs_flush_after(Some(1)), None);
        m.committed(Some(1));
        let Some(Some(first)) = m.needs_flush_after(Some(1)) else {
            panic!("committed");
        };
        std::thread::sleep(std::time::Duration::from_millis(2));
        m.committed(Some(1));
        assert_eq!(
            m.needs_flush_after(Some(1)),
            Some(Some(first)),
            "earliest stands"
        );
        assert_eq!(
            m.needs_flush_after(None),
            None,
            "nothing known while shared"
        );
        assert_eq!(
            m.needs_flush_after(Some(2)),
            None,
            "nor after a shared spell"
        );
        m.flushed(Some(1));
        assert_eq!(m.needs_flush_after(Some(1)), Some(None));
        m.committed(Some(1));
        assert_eq!(m.needs_flush_after(Some(1)), Some(None), "still durable");
        m.cleaned();
        assert_eq!(m.needs_flush_after(Some(1)), None);
        m.committed(None);
        m.flushed(None);
        assert_eq!(m, DirtyMark::Unknown, "shared: nothing is learnt");
    }
}
