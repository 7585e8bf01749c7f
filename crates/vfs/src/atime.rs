//! Access times, as ext4 keeps them under `relatime` (the Linux default mount option).
//!
//! FUSE leaves `atime` to the file system: the kernel marks every FUSE inode `S_NOATIME`
//! and only drops its cached atime after a read or a `readdir`
//! (`fuse_invalidate_atime`), expecting the daemon to have updated it. deskfs updates it
//! by the `relatime` rule of Linux (`relatime_need_update` in `fs/inode.c`): an access
//! moves `atime` to now when `atime` is not later than `mtime` or `ctime`, or is at least
//! [`RELATIME_PERIOD`] old. So `atime` tells whether a file was read since it was last
//! changed (what mail readers and tmp cleaners ask) at one update per change or per day,
//! not one per read.
//!
//! Where deskfs differs from ext4, and why:
//! - The access is counted when a file is opened for reading (not `O_WRONLY`, not
//!   `O_NOATIME`), not at its first `read`: reads served from the kernel's page cache or
//!   through FUSE passthrough never reach the daemon. A directory's access is its first
//!   `readdir` page.
//! - Updates are lazy, like ext4's `lazytime`: queued in memory and committed in one
//!   batch per feed tick ([`crate::feed::FEED_POLL`]), and at unmount. A crash loses at
//!   most the updates of that last tick; `stat` shows queued ones at once.
//! - An `atime`-only change is not uploaded: the object's `x-amz-meta-atime` is the
//!   access time as of the content's last upload.
//!
//! `deskfs mount --atime noatime` turns updates off (as `mount -o noatime`).

use std::collections::HashMap;
use std::sync::Mutex;

use deskfs_meta::{AttrUpdate, MetaError, Op};

use crate::{Ino, Vfs};

/// Age of an access time past which `relatime` updates it whatever mtime and ctime say,
/// ns: one day (Linux `relatime_need_update`).
pub const RELATIME_PERIOD_NS: i64 = 24 * 3600 * 1_000_000_000;

/// [`RELATIME_PERIOD_NS`] as a duration (for docs and status).
pub const RELATIME_PERIOD: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Access-time updates per batch.
const BATCH: usize = 512;

/// When accesses move `atime` (the mount's `--atime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// By the `relatime` rule (see the module docs).
    #[default]
    Relatime,
    /// Never (`noatime`): only `utimensat` and `touch -a` set it.
    Off,
}

impl std::fmt::Display for AtimeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AtimeMode::Relatime => "relatime",
            AtimeMode::Off => "noatime",
        })
    }
}

impl std::str::FromStr for AtimeMode {
    type Err = String;

    /// `relatime` or `noatime`; anything else is refused with a message naming both.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "relatime" => Ok(AtimeMode::Relatime),
            "noatime" => Ok(AtimeMode::Off),
            other => Err(format!(
                "unknown atime mode {other:?}: use `relatime` (reads move atime once after each change or once a day, as ext4 by default) or `noatime` (never)"
            )),
        }
    }
}

/// The `relatime` rule: whether an access at `now` moves an access time `atime` of an
/// inode last modified at `mtime` and changed at `ctime` (all ns).
pub fn relatime_due(atime: i64, mtime: i64, ctime: i64, now: i64) -> bool {
    atime <= mtime || atime <= ctime || now.saturating_sub(atime) >= RELATIME_PERIOD_NS
}

/// The access times queued for the database, and the order between their commit and
/// explicit `atime` changes.
#[derive(Default)]
pub(crate) struct AccessTimes {
    mode: AtimeMode,
    /// Inode → access time to commit, ns.
    pending: Mutex<HashMap<Ino, i64>>,
    /// Held while a batch is committed and while an explicit `atime` is set, so a queued
    /// access time taken before the explicit change never lands after it.
    order: Mutex<()>,
    /// Access times committed since the mount (for status).
    committed: std::sync::atomic::AtomicU64,
}

impl AccessTimes {
    pub(crate) fn new(mode: AtimeMode) -> AccessTimes {
        AccessTimes {
            mode,
            ..AccessTimes::default()
        }
    }

    /// An access at `now` of inode `ino` whose current times are `atime`, `mtime` and
    /// `ctime` (ns): queued when the mode's rule says so. Returns whether it was.
    pub(crate) fn accessed(&self, ino: Ino, atime: i64, mtime: i64, ctime: i64, now: i64) -> bool {
        if self.mode == AtimeMode::Off {
            return false;
        }
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let atime = p.get(&ino).copied().unwrap_or(atime).max(atime);
        if !relatime_due(atime, mtime, ctime, now) {
            return false;
        }
        p.insert(ino, now.max(atime));
        true
    }

    /// The queued access time of `ino`, if any (what `stat` shows before the commit).
    pub(crate) fn pending(&self, ino: Ino) -> Option<i64> {
        if self.mode == AtimeMode::Off {
            return None;
        }
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.get(&ino).copied()
    }

    /// Access times queued, not yet committed.
    pub(crate) fn queued(&self) -> usize {
        self.pending.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Access times committed since the mount.
    pub(crate) fn committed(&self) -> u64 {
        self.committed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `f` (an explicit change of `ino`'s `atime`) after dropping the access time
    /// queued for it and with no batch in flight: the explicit value stands.
    pub(crate) fn explicit<T>(&self, ino: Ino, f: impl FnOnce() -> T) -> T {
        let _order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino);
        f()
    }

    /// The queued access times (they stay queued, and shown by `stat`, until committed).
    fn snapshot(&self) -> Vec<(Ino, i64)> {
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.iter().map(|(i, t)| (*i, *t)).collect()
    }

    /// Drops the queued times of `done` that were committed (a newer access queued
    /// meanwhile stays for the next batch).
    fn settle(&self, done: &[(Ino, i64)]) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (ino, t) in done {
            if p.get(ino) == Some(t) {
                p.remove(ino);
            }
        }
    }
}

impl Vfs {
    /// Commits the queued access times: one batch per [`BATCH`] inodes. An inode removed
    /// meanwhile fails its batch's precondition; the batch is then applied one inode at
    /// a time and the gone ones are dropped. On any other error the times stay queued
    /// for the next tick (logged).
    pub(crate) fn flush_access_times(&self) {
        let at = &self.atimes;
        let _order = at.order.lock().unwrap_or_else(|e| e.into_inner());
        let all = at.snapshot();
        for chunk in all.chunks(BATCH) {
            let ops: Vec<Op> = chunk.iter().map(|&(ino, t)| atime_op(ino, t)).collect();
            let done = match self.meta.apply(&ops) {
                Ok(_) => Ok(chunk.len()),
                Err(MetaError::Precondition { .. }) => self.apply_one_by_one(chunk),
                Err(e) => Err(e),
            };
            match done {
                Ok(n) => {
                    at.committed
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    for (ino, _) in chunk {
                        self.hints.forget_attrs(*ino);
                    }
                    at.settle(chunk);
                }
                Err(e) => {
                    tracing::warn!(error = %e, n = at.queued(), "cannot commit access times yet; retrying");
                    return;
                }
            }
        }
    }

    /// Applies the access times of `chunk` one inode at a time; returns how many
    /// inodes still existed.
    fn apply_one_by_one(&self, chunk: &[(Ino, i64)]) -> Result<usize, MetaError> {
        let mut n = 0;
        for &(ino, t) in chunk {
            match self.meta.apply(&[atime_op(ino, t)]) {
                Ok(_) => n += 1,
                Err(MetaError::Precondition { .. }) => {} // gone: nothing to keep
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// An open for reading, or a listing, of `ino` at `now`, given its current times:
    /// queued by the mount's rule (see the module docs).
    /// Returns whether it was queued; the caller then drops the kernel's cached
    /// attributes of `ino` (see [`Vfs::accessed_file`](crate::Vfs)): reads from its page
    /// cache or through passthrough tell the kernel nothing, so its next `stat` would show
    /// the old atime for the attribute TTL. (After a `readdir`, and a read the daemon
    /// served, the kernel drops them itself: `fuse_invalidate_atime`.)
    pub(crate) fn accessed(&self, ino: Ino, atime: i64, mtime: i64, ctime: i64, now: i64) -> bool {
        self.atimes.accessed(ino, atime, mtime, ctime, now)
    }
}

/// The update that sets `ino`'s access time to `t` (ns), nothing else: ctime stays (an
/// access is not a change) and the inode is not marked for upload.
fn atime_op(ino: Ino, t: i64) -> Op {
    Op::SetAttrs {
        ino,
        set: AttrUpdate {
            atime_ns: Some(t),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn relatime_rule_matches_linux() {
        let now = 100 * 24 * 3600 * S;
        // Read since the last change: no update.
        assert!(!relatime_due(now - 10 * S, now - 20 * S, now - 20 * S, now));
        // Changed since the last read (mtime or ctime not older than atime): update.
        assert!(relatime_due(now - 20 * S, now - 10 * S, now - 30 * S, now));
        assert!(relatime_due(now - 20 * S, now - 30 * S, now - 10 * S, now));
        assert!(relatime_due(now - 20 * S, now - 20 * S, now - 30 * S, now));
        // A day old: update even when unchanged.
        assert!(relatime_due(now - 24 * 3600 * S, 0, 0, now));
        assert!(!relatime_due(now - 24 * 3600 * S + 1, 0, 0, now));
    }

    #[test]
    fn queue_keeps_one_time_per_inode_and_explicit_changes_win() {
        let at = AccessTimes::new(AtimeMode::Relatime);
        let now = 10 * 24 * 3600 * S;
        assert!(at.accessed(7, now - 5 * S, now - 4 * S, now - 4 * S, now));
        // The queued time counts as the current atime: a second read does not queue.
        assert!(!at.accessed(7, now - 5 * S, now - 4 * S, now - 4 * S, now + S));
        assert_eq!(at.pending(7), Some(now));
        assert_eq!(at.queued(), 1);
        at.explicit(7, || ());
        assert_eq!(at.pending(7), None);
        let off = AccessTimes::new(AtimeMode::Off);
        assert!(!off.accessed(7, 0, now, now, now));
        assert_eq!(off.pending(7), None);
    }

    #[test]
    fn mode_parses_and_refuses_unknown() {
        assert_eq!("relatime".parse::<AtimeMode>(), Ok(AtimeMode::Relatime));
        assert_eq!("noatime".parse::<AtimeMode>(), Ok(AtimeMode::Off));
        let e = "strictatime".parse::<AtimeMode>().unwrap_err();
        assert!(e.contains("relatime") && e.contains("noatime"), "{e}");
    }
}
