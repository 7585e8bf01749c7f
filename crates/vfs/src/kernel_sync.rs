//! Feed invalidations the kernel no longer needs, because an `open` already sent one.
//!
//! An `open` that finds another mount's newer content drops the kernel's cached size,
//! attributes and pages of the inode before it answers (`inval_inode`), and the process
//! then reads the new attributes (`stat`, or the read's own size check). The change feed
//! delivers an `inval_inode` for that same change a little later (within
//! [`FEED_POLL`](crate::feed::FEED_POLL)). When that late invalidation lands while the
//! kernel is refreshing the inode's attributes, the kernel discards the fresh reply (its
//! `attr_version` moved on: fs/fuse `fuse_change_attributes`) and keeps the size it cached
//! before, which the read then uses: a file shrunk elsewhere read back with a tail of
//! zeros, one grown elsewhere read as empty. (Seen in e2e 86: ~1 round in 10,000 on two
//! mounts rewriting one file in turn.)
//!
//! So the open records what it invalidated for ([`KernelSyncs::synced`]: when its row
//! read began, and the attributes it read), and the feed leaves out an inode's
//! invalidation when the open's already covered every change in the batch
//! ([`Coverage::deliver`]): either the open's read began after the batch was read
//! (every change in it was committed before), or the inode's row is still exactly what
//! the open read (no change came after that read; any change alters ctime, size, mtime,
//! link count or content version, which the stamp holds). Everything else is delivered as
//! before: a change made after the open's read reaches the kernel at once — but one of the
//! access time alone, which shows once the kernel's attributes expire (1 s while shared):
//! other mounts' reads move it all the time, and its invalidation raced the same way.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deskfs_meta::{InodeRow, MetaEngine};

use crate::Ino;

/// The attributes of a row the kernel caches, but the access time, and the content version
/// (what a feed entry for the inode can change; see the engines' change triggers). The
/// access time is left out: reads move it (this mount's own, queued at the very open that
/// recorded the stamp, and other mounts' reads), and an access-time change right after an
/// open then shows in `stat` only once the kernel's attributes expire (1 s while shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttrStamp {
    size: u64,
    data_version: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    nlink: u32,
    perm: u32,
    uid: u32,
    gid: u32,
}

impl AttrStamp {
    /// A stamp of content `version` (size the same) changed at `ctime_ns`, for tests.
    #[cfg(test)]
    pub(crate) fn for_test(version: u64, ctime_ns: i64) -> AttrStamp {
        AttrStamp {
            size: version,
            data_version: version,
            mtime_ns: 0,
            ctime_ns,
            nlink: 1,
            perm: 0o644,
            uid: 0,
            gid: 0,
        }
    }

    /// The stamp of `row`.
    pub(crate) fn of(row: &InodeRow) -> AttrStamp {
        AttrStamp {
            size: row.size,
            data_version: row.data_version,
            mtime_ns: row.mtime_ns,
            ctime_ns: row.ctime_ns,
            nlink: row.nlink,
            perm: row.perm,
            uid: row.uid,
            gid: row.gid,
        }
    }
}

/// One open's invalidation: when the row read it was based on began, and that row's
/// stamp.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Synced {
    /// When the row read began.
    pub(crate) read_began: Instant,
    /// The row read.
    pub(crate) stamp: AttrStamp,
}

/// How long a record can cover a feed entry: longer than the feed ever lags behind a
/// commit in practice (it polls every 50 ms); an older record is dropped and the entry
/// delivered, which is always safe.
const SYNC_KEEP: Duration = Duration::from_secs(10);

/// Records beyond which those older than half of [`SYNC_KEEP`] go, and all of them if that
/// is not enough (memory bound: ~64 B each).
const SYNCS_MAX: usize = 1 << 14;

/// The last invalidation an open (or a lock's revalidation) sent, per inode.
#[derive(Default)]
pub(crate) struct KernelSyncs {
    map: Mutex<HashMap<Ino, Synced>>,
}

impl KernelSyncs {
    /// The kernel's caches of `ino` were invalidated after the row read `sync` names.
    pub(crate) fn synced(&self, ino: Ino, sync: Synced) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= SYNCS_MAX {
            let now = Instant::now();
            m.retain(|_, s| now.duration_since(s.read_began) < SYNC_KEEP / 2);
            if m.len() >= SYNCS_MAX {
                m.clear();
            }
        }
        m.insert(ino, sync);
    }

    /// The coverage of a feed batch whose read returned at `batch_read` and changed
    /// `inos`: reads, in one transaction, the current rows of those with a record older
    /// than the batch (compared with the record's stamp at delivery).
    pub(crate) fn coverage<'a>(
        &'a self,
        meta: &'a dyn MetaEngine,
        inos: impl IntoIterator<Item = Ino>,
        batch_read: Instant,
    ) -> Coverage<'a> {
        // A batch names an inode once per change (up to `FEED_BATCH`): each is looked at
        // once; with no record at all (alone, or no stale open lately) nothing is.
        let check: Vec<Ino> = {
            let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
            if m.is_empty() {
                Vec::new()
            } else {
                let distinct: std::collections::HashSet<Ino> = inos.into_iter().collect();
                distinct
                    .into_iter()
                    .filter(|ino| m.get(ino).is_some_and(|s| s.read_began < batch_read))
                    .collect()
            }
        };
        let rows = Self::stamps(meta, &check);
        Coverage {
            syncs: self,
            meta,
            batch_read,
            rows,
        }
    }

    /// The current stamps of `inos` (`None`: gone), read in one transaction; empty on an
    /// error (then nothing is taken as covered).
    fn stamps(meta: &dyn MetaEngine, inos: &[Ino]) -> HashMap<Ino, Option<AttrStamp>> {
        if inos.is_empty() {
            return HashMap::new();
        }
        let rows = deskfs_meta::read(meta, |t| {
            inos.iter()
                .map(|ino| Ok((*ino, t.get_inode(*ino)?.as_ref().map(AttrStamp::of))))
                .collect::<deskfs_meta::Result<HashMap<_, _>>>()
        });
        rows.unwrap_or_else(|e| {
            // Each taken as changed: delivered, and not read again for this batch.
            tracing::debug!(error = %e, "cannot read rows to leave out covered invalidations; delivering them");
            inos.iter().map(|ino| (*ino, None)).collect()
        })
    }
}

/// What one feed batch may leave out (see [`KernelSyncs::coverage`]).
pub(crate) struct Coverage<'a> {
    syncs: &'a KernelSyncs,
    meta: &'a dyn MetaEngine,
    batch_read: Instant,
    rows: HashMap<Ino, Option<AttrStamp>>,
}

impl Coverage<'_> {
    /// Runs `deliver` (the invalidation of `ino` for a change in the batch) unless an open
    /// covered it. Decided and delivered under the records' lock: an open records after
    /// its own invalidation and before it answers, so an invalidation delivered here
    /// while no record exists reaches the kernel before that open's answer, never during
    /// the refresh that follows it. Returns whether it was delivered.
    pub(crate) fn deliver(&mut self, ino: Ino, deliver: impl FnOnce()) -> bool {
        let mut m = self.syncs.map.lock().unwrap_or_else(|p| p.into_inner());
        let covered = match m.get(&ino).copied() {
            None => false,
            Some(s) if s.read_began.elapsed() >= SYNC_KEEP => {
                m.remove(&ino);
                false
            }
            Some(s) if s.read_began >= self.batch_read => true,
            Some(s) => {
                // Recorded after the batch's rows were read: read this one now (rare: an
                // open between the batch's read and its delivery).
                if !self.rows.contains_key(&ino) {
                    let now = KernelSyncs::stamps(self.meta, &[ino]);
                    self.rows.extend(now);
                }
                self.rows.get(&ino).copied().flatten() == Some(s.stamp)
            }
        };
        if !covered {
            deliver();
        }
        !covered
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn stamp(v: u64) -> AttrStamp {
        AttrStamp::for_test(v, 0)
    }

    #[test]
    fn a_record_made_after_the_batch_was_read_covers_it_without_a_row_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = deskfs_meta::sqlite::SqliteEngine::create(&dir.path().join("m.db"), 0, 0, 1)
            .expect("create db");
        let s = KernelSyncs::default();
        let batch_read = Instant::now();
        let sync = Synced {
            read_began: Instant::now(),
            stamp: stamp(1),
        };
        s.synced(7, sync);
        let mut cov = s.coverage(&db, [7, 8], batch_read);
        assert!(!cov.deliver(7, || ()), "covered by the time rule");
        assert!(cov.deliver(8, || ()), "no record: delivered");
        // A record begun before the batch was read needs the stamp comparison: inode 7
        // is in no database row, so its change is delivered.
        let mut cov = s.coverage(&db, [7], Instant::now());
        let mut ran = false;
        assert!(cov.deliver(7, || ran = true));
        assert!(ran);
    }
}
