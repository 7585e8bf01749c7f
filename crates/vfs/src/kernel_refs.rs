//! The kernel's references to inodes (the FUSE lookup count) and the orphans kept alive
//! for them.
//!
//! Every reply that hands the kernel an inode (lookup, create, mknod, mkdir, symlink,
//! link, each readdirplus entry) adds one to the inode's lookup count; `FORGET` takes
//! them back (FUSE protocol, `fuse_forget_one`). While the kernel holds an inode, a
//! process that resolved a path to it may still open it — on ext4 it can, even when the
//! name was unlinked or renamed over in between. So an inode whose last name goes away
//! while this mount's kernel (or one of its open files) still holds it is not purged: it
//! stays as an orphan (`nlink == 0`) until the last reference goes, and is purged then.
//! A mount that dies with orphans kept is cleaned up by the next mount's recovery.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deskfs_meta::Ino;

/// Lookup counts and kept orphans of one mount.
#[derive(Default)]
pub(crate) struct KernelRefs {
    counts: Mutex<HashMap<Ino, u64>>,
    orphans: Mutex<HashSet<Ino>>,
    /// Orphans to purge, with when they were queued: purged together by the feed thread
    /// (a `FORGET` costs no round trip of its own), after a grace period while other
    /// mounts are live (see [`crate::namespace::ORPHAN_GRACE`]).
    queue: Mutex<Vec<(Ino, Instant)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Counts survive a panic elsewhere; losing them would purge inodes still in use.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KernelRefs {
    /// The kernel got a reference to `ino` (one entry reply).
    pub(crate) fn looked_up(&self, ino: Ino) {
        *lock(&self.counts).entry(ino).or_insert(0) += 1;
    }

    /// The kernel dropped `n` references to `ino`. Returns true when it holds none any
    /// more and `ino` is an orphan kept for it (then the caller purges it if no handle
    /// holds it either).
    pub(crate) fn forget(&self, ino: Ino, n: u64) -> bool {
        let mut m = lock(&self.counts);
        let gone = match m.get_mut(&ino) {
            Some(c) if *c > n => {
                *c -= n;
                false
            }
            Some(_) => {
                m.remove(&ino);
                true
            }
            None => true,
        };
        drop(m);
        gone && lock(&self.orphans).contains(&ino)
    }

    /// Whether the kernel holds `ino`.
    pub(crate) fn held(&self, ino: Ino) -> bool {
        lock(&self.counts).contains_key(&ino)
    }

    /// `ino` lost its last name while held here: keep it until released.
    pub(crate) fn keep_orphan(&self, ino: Ino) {
        lock(&self.orphans).insert(ino);
    }

    /// Whether `ino` is an orphan this mount keeps.
    pub(crate) fn is_kept_orphan(&self, ino: Ino) -> bool {
        lock(&self.orphans).contains(&ino)
    }

    /// `ino` was purged (or is not an orphan any more).
    pub(crate) fn drop_orphan(&self, ino: Ino) {
        lock(&self.orphans).remove(&ino);
    }

    /// Queues orphan `ino` for purging.
    pub(crate) fn queue_purge(&self, ino: Ino) {
        lock(&self.queue).push((ino, Instant::now()));
    }

    /// Takes the queued orphans queued at least `grace` ago.
    pub(crate) fn take_due(&self, grace: Duration) -> Vec<Ino> {
        let mut q = lock(&self.queue);
        let (due, wait): (Vec<_>, Vec<_>) = q.drain(..).partition(|(_, t)| t.elapsed() >= grace);
        *q = wait;
        due.into_iter().map(|(i, _)| i).collect()
    }

    /// Number of inodes the kernel holds (status).
    pub(crate) fn held_count(&self) -> usize {
        lock(&self.counts).len()
    }

    /// Number of orphans kept (status).
    pub(crate) fn orphan_count(&self) -> usize {
        lock(&self.orphans).len()
    }
}

/// Opens the kernel repeats after an `ESTALE`, per process.
///
/// Our `ESTALE` for an inode another mount replaced makes the kernel look the path up
/// again (`LOOKUP_REVAL`) and repeat the open — once. If the name is replaced again
/// between that fresh lookup and the repeated open (a writer renaming in a loop), the
/// inode the lookup returned is served anyway: the open and the rename overlapped, and
/// either order is a valid outcome (ext4 serves it too). Without this, a fast renamer
/// could make another mount's open fail with `ESTALE`.
#[derive(Default)]
pub(crate) struct StaleRetries {
    /// pid -> (when we answered `ESTALE`, the inode our next lookup for it returned).
    map: Mutex<HashMap<u32, (Instant, Option<Ino>)>>,
}

/// How long after an `ESTALE` the kernel's retry is recognised.
const RETRY_WINDOW: Duration = Duration::from_secs(2);

impl StaleRetries {
    /// We answered `ESTALE` to process `pid`.
    pub(crate) fn staled(&self, pid: u32) {
        let mut m = lock(&self.map);
        if m.len() > 1024 {
            m.retain(|_, (t, _)| t.elapsed() < RETRY_WINDOW);
        }
        m.insert(pid, (Instant::now(), None));
    }

    /// A lookup by `pid` returned `ino`.
    pub(crate) fn looked_up(&self, pid: u32, ino: Ino) {
        let mut m = lock(&self.map);
        if let Some(e) = m.get_mut(&pid) {
            if e.0.elapsed() < RETRY_WINDOW {
                e.1 = Some(ino);
            }
        }
    }

    /// Whether a request for `ino` by `pid` belongs to the kernel's retry through a fresh
    /// lookup, without using the retry up (a `getattr` of the path walk before the
    /// repeated `open`).
    pub(crate) fn in_retry(&self, pid: u32, ino: Ino) -> bool {
        matches!(lock(&self.map).get(&pid),
            Some((t, Some(i))) if *i == ino && t.elapsed() < RETRY_WINDOW)
    }

    /// Whether an open of `ino` by `pid` is the kernel's retry through a fresh lookup.
    /// The first open by `pid` after the `ESTALE` is the retry's, whatever it names: a
    /// later open is a new request, not the retry (its lookup may have found an inode
    /// that another mount has deleted since — serving it handed a process another
    /// mount's deleted SQLite journal, e2e 86).
    pub(crate) fn is_retry(&self, pid: u32, ino: Ino) -> bool {
        match lock(&self.map).remove(&pid) {
            Some((t, Some(i))) => i == ino && t.elapsed() < RETRY_WINDOW,
            _ => false,
        }
    }

    /// `pid`'s path walk ended without an open to retry: its fresh lookup found no
    /// entry (the open fails with `ENOENT`, or creates a new file), or it created one.
    pub(crate) fn ended(&self, pid: u32) {
        lock(&self.map).remove(&pid);
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn counts_and_orphans() {
        let r = KernelRefs::default();
        r.looked_up(7);
        r.looked_up(7);
        assert!(r.held(7));
        assert!(!r.forget(7, 1), "not an orphan");
        r.keep_orphan(7);
        assert!(r.forget(7, 1), "last reference of a kept orphan");
        assert!(!r.held(7));
        r.drop_orphan(7);
        assert!(!r.is_kept_orphan(7));
        // Retries: ESTALE, then a lookup by the same process, then its open.
        let s = StaleRetries::default();
        assert!(!s.is_retry(5, 9));
        s.looked_up(5, 9);
        assert!(!s.is_retry(5, 9), "a lookup without an ESTALE before");
        s.staled(5);
        s.looked_up(6, 9);
        assert!(!s.is_retry(6, 9), "another process");
        s.looked_up(5, 9);
        assert!(s.is_retry(5, 9));
        assert!(!s.is_retry(5, 9), "once");
        // The first open after the ESTALE is the retry's, whatever it names.
        s.staled(5);
        s.looked_up(5, 9);
        assert!(!s.is_retry(5, 8), "another inode");
        assert!(!s.is_retry(5, 9), "a later open is not the retry");
        // A fresh lookup that found nothing ends the retry: later lookups by the same
        // process are no retry's.
        s.staled(5);
        s.ended(5);
        s.looked_up(5, 9);
        assert!(!s.is_retry(5, 9), "after a negative lookup");
        // A forget of more than was counted does not underflow.
        r.looked_up(8);
        assert!(!r.forget(8, 5));
        assert!(!r.held(8));
    }
}
