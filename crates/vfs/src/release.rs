//! Releases finished off the request path.
//!
//! FUSE sends `release` after `close(2)` has returned (the kernel does not wait for the
//! answer), but a release still holds one of the daemon's request threads while it runs.
//! On a mount that is not alone, a release with nothing to commit still has database
//! work: removing the open's record from the open-file table (other mounts purge an
//! unlinked inode only when no mount has it open) and, for the last handle, reading the
//! row to see whether the inode lost its last name meanwhile (then this mount purges it).
//! Neither has to happen before the reply: an open record that outlives its handle for a
//! moment only delays another mount's purge, and the purge only frees space. So such a
//! release is answered at once and its database work is queued here; the feed thread
//! applies the queue in one batch per tick (every [`crate::feed::FEED_POLL`] at most),
//! and unmount applies what is left before the session ends.
//!
//! Whatever touches the inode afterwards is re-checked under its lock when the batch's
//! answer comes back: a file opened or written again since is neither purged nor marked
//! evictable.

use std::sync::Mutex;

use deskfs_meta::{Op, OpOut};

use crate::{Ino, Vfs};

/// Releases applied per batch.
const BATCH: usize = 256;

/// One release's database work, queued.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueuedRelease {
    /// The inode.
    pub(crate) ino: Ino,
    /// Session whose open record goes (`None`: the open was never recorded).
    pub(crate) unrecord: Option<u64>,
    /// Set when this was the inode's last handle here: its row is read afterwards (purge
    /// an orphan, let a clean staging file be evicted).
    pub(crate) last: Option<LastHandle>,
}

/// The inode as its last handle here left it (a later open or write changes it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastHandle {
    /// Content version.
    pub(crate) version: u64,
    /// Size, bytes.
    pub(crate) size: u64,
}

/// The queue of releases whose database work is still to do.
#[derive(Default)]
pub(crate) struct ReleaseQueue {
    q: Mutex<Vec<QueuedRelease>>,
}

impl ReleaseQueue {
    pub(crate) fn push(&self, r: QueuedRelease) {
        self.q.lock().unwrap_or_else(|p| p.into_inner()).push(r);
    }

    fn take(&self) -> Vec<QueuedRelease> {
        std::mem::take(&mut *self.q.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts back work whose batch failed (tried again at the next tick).
    fn put_back(&self, mut r: Vec<QueuedRelease>) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        r.append(&mut q);
        *q = r;
    }
}

impl Vfs {
    /// Applies the queued releases (see the module docs). A batch the database refuses
    /// stays queued for the next call.
    pub(crate) fn flush_releases(&self) {
        let all = self.releases.take();
        let mut rest = all.as_slice();
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(BATCH));
            rest = tail;
            let mut ops = Vec::with_capacity(chunk.len() * 2);
            let mut reads = Vec::with_capacity(chunk.len());
            for r in chunk {
                if let Some(session) = r.unrecord {
                    ops.push(Op::AddOpen {
                        ino: r.ino,
                        session,
                        delta: -1,
                    });
                }
                if let Some(last) = r.last {
                    reads.push((ops.len(), r.ino, last));
                    ops.push(Op::GetInode(r.ino));
                }
            }
            match self.meta.apply(&ops) {
                Ok(out) => {
                    for (i, ino, last) in reads {
                        if let Some(row) = out.get(i).and_then(OpOut::row) {
                            self.settle_released(ino, last, row);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, n = chunk.len() + rest.len(), "cannot record releases yet; retrying");
                    let mut back = chunk.to_vec();
                    back.extend_from_slice(rest);
                    self.releases.put_back(back);
                    return;
                }
            }
        }
    }

    /// After a queued last release: purge the inode if it lost its last name, or let its
    /// clean staging file be evicted — unless it was opened or written again since.
    fn settle_released(&self, ino: Ino, last: LastHandle, row: &deskfs_meta::InodeRow) {
        // Checked without loading a state (no state: nothing here holds the inode).
        let st = self
            .inodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ino)
            .cloned();
        let untouched = match st {
            None => true,
            Some(st) => st
                .lock()
                .map(|s| s.open_count == 0 && !s.uncommitted && s.version == last.version)
                .unwrap_or(false),
        };
        if !untouched {
            return;
        }
        if row.nlink == 0 {
            self.release_orphan(ino);
        } else if row.local == self.here() && !row.dirty {
            self.cache.staging_clean(ino, last.size);
        }
    }
}
