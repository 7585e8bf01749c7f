//! What this mount remembers about the namespace between requests — hints, never truth.
//!
//! A namespace change is planned from facts (which inode a name names, an inode's type,
//! a directory's group) and applied as one batch whose expectations guard every fact it
//! used ([`deskfs_meta::Op`]). Facts the kernel just handed us (the lookup before an
//! `unlink`, the `getattr` before a `chown`) are remembered here so that the batch needs
//! no read round trip first. A stale hint costs one refused batch and a fresh read, never
//! a wrong answer. An inode's type never changes, so that part is exact.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use deskfs_meta::{Ino, InodeRow, Kind};

/// Entries kept per table before it is emptied (a hint table is a cache, not a record).
const HINTS_MAX: usize = 1 << 18;

/// A directory entry: `(parent, name)`.
type EntryKey = (Ino, Vec<u8>);

/// The decision-relevant attributes of an inode as last seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InoHint {
    /// Type (exact: never changes).
    pub(crate) kind: Kind,
    /// Permission bits.
    pub(crate) perm: u32,
    /// Owner.
    pub(crate) uid: u32,
    /// Group.
    pub(crate) gid: u32,
}

/// The hint tables of one mount.
#[derive(Default)]
pub(crate) struct Hints {
    /// `(parent, name)` → the inode it names, or `None`: known to be free.
    entries: Mutex<HashMap<EntryKey, Option<Ino>>>,
    inodes: Mutex<HashMap<Ino, InoHint>>,
    /// Directories known to be listed from the bucket (a listing never becomes undone).
    listed: Mutex<HashSet<Ino>>,
    /// Rows read back by this mount's own batches, with when: `getattr` answers from
    /// them while they are young (an invalidation of the inode drops them).
    fresh: Mutex<HashMap<Ino, (InodeRow, std::time::Instant)>>,
    /// Inodes known to have no extended attributes, with since when: created by this
    /// mount, or read with none ([`Hints::note_no_xattrs`]). An xattr set or removed
    /// through this mount, and another mount's change of the inode (its invalidation),
    /// drop the entry.
    xattrless: Mutex<Xattrless>,
    /// Per inode, the ticket of the last batch begun that changes its row
    /// ([`Hints::begin_change`]); its lock is held while a read-back row is noted.
    changing: Mutex<HashMap<Ino, u64>>,
    /// The last ticket given out.
    tickets: AtomicU64,
}

/// Buckets of inodes whose drops are counted together (a drop refuses the notes of its
/// bucket's inodes only).
const DROP_BUCKETS: usize = 64;

/// Where the drops stood when a read began ([`Hints::xattr_stamp`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct XattrStamp([u64; DROP_BUCKETS]);

fn bucket(ino: Ino) -> usize {
    (ino % DROP_BUCKETS as u64) as usize
}

/// The inodes known to have no extended attributes, and how many times an entry was
/// dropped, per bucket of inodes: a read that began before a drop may have read what the
/// dropped change replaced, so it notes nothing ([`Hints::note_no_xattrs`]).
struct Xattrless {
    since: HashMap<Ino, std::time::Instant>,
    /// Drops so far (bumped under the same lock as the map).
    drops: [u64; DROP_BUCKETS],
}

impl Default for Xattrless {
    fn default() -> Self {
        Xattrless {
            since: HashMap::new(),
            drops: [0; DROP_BUCKETS],
        }
    }
}

impl Xattrless {
    fn drop_entry(&mut self, ino: Ino) {
        self.since.remove(&ino);
        self.drops[bucket(ino)] += 1;
    }
}

fn insert_capped<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>, k: K, v: V) {
    if m.len() >= HINTS_MAX {
        m.clear();
    }
    m.insert(k, v);
}

impl Hints {
    /// Remembers what `row` says (and that a directory is listed, when it is).
    pub(crate) fn note_row(&self, row: &InodeRow) {
        let h = InoHint {
            kind: row.kind,
            perm: row.perm,
            uid: row.uid,
            gid: row.gid,
        };
        insert_capped(&mut lock(&self.inodes), row.ino, h);
        if row.kind == Kind::Dir && row.listed_ns != 0 {
            self.set_listed(row.ino);
        }
    }

    /// Remembers that `parent/name` names `ino`.
    pub(crate) fn note_entry(&self, parent: Ino, name: &[u8], ino: Ino) {
        insert_capped(&mut lock(&self.entries), (parent, name.to_vec()), Some(ino));
    }

    /// Remembers that `parent/name` names nothing (a lookup missed).
    pub(crate) fn note_absent(&self, parent: Ino, name: &[u8]) {
        insert_capped(&mut lock(&self.entries), (parent, name.to_vec()), None);
    }

    /// What `parent/name` named when last seen: `Some(None)` = nothing.
    pub(crate) fn entry(&self, parent: Ino, name: &[u8]) -> Option<Option<Ino>> {
        lock(&self.entries).get(&(parent, name.to_vec())).copied()
    }

    /// The attributes of `ino` as last seen.
    pub(crate) fn inode(&self, ino: Ino) -> Option<InoHint> {
        lock(&self.inodes).get(&ino).copied()
    }

    /// The type of `ino`, if ever seen (exact).
    pub(crate) fn kind(&self, ino: Ino) -> Option<Kind> {
        self.inode(ino).map(|h| h.kind)
    }

    /// A batch that changes the rows of `inos` is about to be applied: its ticket, for
    /// [`Hints::note_read_back`].
    pub(crate) fn begin_change(&self, inos: impl IntoIterator<Item = Ino>) -> u64 {
        let mut m = lock(&self.changing);
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed) + 1;
        for ino in inos {
            insert_capped(&mut m, ino, ticket);
        }
        ticket
    }

    /// Remembers `row`, read back by the batch of `ticket` in its commit, as fresh —
    /// unless another batch changing the same row began since: the two may commit in
    /// either order (two creates in one directory), so the one whose answer comes last
    /// may hold the older row; then no copy of it is fresh.
    pub(crate) fn note_read_back(&self, row: &InodeRow, ticket: u64) {
        self.note_row(row);
        let m = lock(&self.changing);
        let mut fresh = lock(&self.fresh);
        if m.get(&row.ino) == Some(&ticket) {
            insert_capped(
                &mut fresh,
                row.ino,
                (row.clone(), std::time::Instant::now()),
            );
        } else {
            fresh.remove(&row.ino);
        }
    }

    /// The row of `ino` if this mount read it at most `max_age` ago.
    pub(crate) fn fresh(&self, ino: Ino, max_age: std::time::Duration) -> Option<InodeRow> {
        let m = lock(&self.fresh);
        m.get(&ino)
            .filter(|(_, t)| t.elapsed() <= max_age)
            .map(|(r, _)| r.clone())
    }

    /// Where the xattr hints stand, taken before a read (or a create) whose answer may be
    /// noted with [`Hints::note_no_xattrs`].
    pub(crate) fn xattr_stamp(&self) -> XattrStamp {
        XattrStamp(lock(&self.xattrless).drops)
    }

    /// A read that began at `stamp` ([`Hints::xattr_stamp`]) found no extended attribute
    /// on `ino` (or a create that began then made it). Noted only when no entry of its
    /// bucket was dropped since: an xattr change through this mount, or an invalidation
    /// from another mount, that landed while the read ran may have come after what the
    /// read saw.
    pub(crate) fn note_no_xattrs(&self, ino: Ino, stamp: &XattrStamp) {
        let mut x = lock(&self.xattrless);
        if x.drops[bucket(ino)] == stamp.0[bucket(ino)] {
            insert_capped(&mut x.since, ino, std::time::Instant::now());
        }
    }

    /// Whether `ino` is known to have no extended attributes (known for at most
    /// `max_age`, none set since).
    pub(crate) fn no_xattrs(&self, ino: Ino, max_age: std::time::Duration) -> bool {
        lock(&self.xattrless)
            .since
            .get(&ino)
            .is_some_and(|t| t.elapsed() <= max_age)
    }

    /// An extended attribute of `ino` was set or removed through this mount (called
    /// after the change is applied).
    pub(crate) fn forget_xattrs(&self, ino: Ino) {
        lock(&self.xattrless).drop_entry(ino);
    }

    /// `ino`'s row changed: the fresh copy goes.
    pub(crate) fn forget_fresh(&self, ino: Ino) {
        lock(&self.fresh).remove(&ino);
    }

    /// `parent/name` may name something else now.
    pub(crate) fn forget_entry(&self, parent: Ino, name: &[u8]) {
        lock(&self.entries).remove(&(parent, name.to_vec()));
    }

    /// `ino`'s attributes may have changed (its type cannot).
    pub(crate) fn forget_attrs(&self, ino: Ino) {
        lock(&self.fresh).remove(&ino);
        lock(&self.xattrless).drop_entry(ino);
        let mut m = lock(&self.inodes);
        if let Some(h) = m.get_mut(&ino) {
            // Keep the exact part; poison the rest so an expectation built from it fails
            // rather than passes by accident.
            h.perm = u32::MAX;
        }
    }

    /// `ino` is gone. Its type stays known (inode numbers are never reused), so a
    /// request for a removed directory can still be told from one for a removed file.
    pub(crate) fn forget_inode(&self, ino: Ino) {
        self.forget_attrs(ino);
        lock(&self.listed).remove(&ino);
    }

    /// Whether directory `dir` is known to be listed from the bucket.
    pub(crate) fn is_listed(&self, dir: Ino) -> bool {
        lock(&self.listed).contains(&dir)
    }

    /// Directory `dir` is listed.
    pub(crate) fn set_listed(&self, dir: Ino) {
        let mut s = lock(&self.listed);
        if s.len() >= HINTS_MAX {
            s.clear();
        }
        s.insert(dir);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A hint table poisoned by a panic elsewhere is still a valid cache.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod unit {
    use super::*;
    use deskfs_meta::Local;

    fn dir(ino: Ino, listed: i64) -> InodeRow {
        InodeRow {
            ino,
            kind: Kind::Dir,
            perm: 0o2775,
            uid: 1,
            gid: 2,
            rdev: 0,
            nlink: 2,
            size: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            btime_ns: 0,
            data_version: 0,
            target: None,
            local: Local::None,
            dirty: false,
            listed_ns: listed,
        }
    }

    #[test]
    fn rows_entries_and_forgetting() {
        let h = Hints::default();
        h.note_row(&dir(5, 0));
        assert!(!h.is_listed(5));
        h.note_row(&dir(6, 7));
        assert!(h.is_listed(6));
        assert_eq!(h.inode(5).unwrap().gid, 2);
        h.note_entry(1, b"a", 5);
        assert_eq!(h.entry(1, b"a"), Some(Some(5)));
        h.note_absent(1, b"b");
        assert_eq!(h.entry(1, b"b"), Some(None));
        h.forget_entry(1, b"a");
        assert_eq!(h.entry(1, b"a"), None);
        h.forget_attrs(5);
        assert_eq!(h.kind(5), Some(Kind::Dir), "the type stays");
        assert_ne!(h.inode(5).unwrap().perm, 0o2775, "the rest is poisoned");
        h.forget_inode(6);
        assert!(h.kind(6) == Some(Kind::Dir) && !h.is_listed(6));
    }
}
