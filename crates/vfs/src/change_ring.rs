//! The change ring: this mount's recent namespace and content changes, in memory, in
//! order, each with a cursor (sequence number). `deskfs exec` takes the cursor before a
//! command and asks for the changes under the desk after it (the task journal, see
//! docs/design/0010 item 6 and docs/SEMANTICS.md "Task journal").
//!
//! **What is recorded**, at the point the change is committed to the metadata engine (in
//! the batch's success path, so a refused or failed request records nothing):
//! `created` (create, mknod, mkdir, symlink, link; a conflict copy kept beside a file),
//! `changed` (a content commit: flush/fsync/release of written data, truncate, `O_TRUNC`;
//! both names of a `RENAME_EXCHANGE`), `deleted` (unlink, rmdir, the target a rename
//! replaced), `renamed` (from → to).
//!
//! **Cost on the request path**: one short mutex push of the entry; the name is copied
//! (one allocation); no metadata round trip. A request knows its directory's inode and
//! the entry's name, not the directory's path, so the ring keeps `(parent inode, name)`
//! (and the inode) and **paths are resolved at query time** ([`Vfs::changes_since`]): a
//! directory that still exists gets its path *now* (a change inside a directory renamed
//! since is reported under the new name); one that is gone gets the path it had when it
//! was deleted or last renamed, learned from the ring's own entries; one that is neither
//! counts as `unresolved` (reported as a number, never silently dropped). A content change
//! (kept by inode only) is reported under the name its file had then, as far as the ring
//! shows it (the name a later rename or delete moved it from, or an earlier create or
//! rename gave it), else under its first name now.
//!
//! **Bounds**: [`RING_ENTRIES`] entries and [`RING_NAME_BYTES`] bytes of names; the oldest
//! go first. A query whose cursor is older than the oldest entry kept is answered with
//! `overflowed: true` (the changes it returns are then a suffix, not all of them). Cursors
//! start at the ring's creation time in µs since the epoch, so a cursor from an earlier
//! daemon run (the ring is lost at restart) also reads as overflowed, never as "nothing
//! changed".
//!
//! **Scope**: changes made through this mount. Other mounts' changes reach this one only
//! as kernel invalidations without their kind (created or deleted), so they are not
//! recorded; an exec runs on the local mount, whose own changes are what its journal
//! needs.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use deskfs_meta::{Ino, MetaTxn, ROOT_INO};
use serde::Serialize;

use crate::{paths, Result, Vfs};

/// Entries the ring keeps.
pub const RING_ENTRIES: usize = 65_536;

/// Bytes of names the ring keeps (entries are dropped oldest first past either bound).
pub const RING_NAME_BYTES: usize = 8 << 20;

/// Longest directory chain followed when resolving a path (a cycle guard).
const MAX_DEPTH: usize = 4096;

/// What happened to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// A new name (create, mknod, mkdir, symlink, link).
    Created,
    /// New content committed (or, for `RENAME_EXCHANGE`, a new inode under the name).
    Changed,
    /// A name removed (unlink, rmdir, replaced by a rename).
    Deleted,
    /// A name moved (`path` → `to`).
    Renamed,
}

/// One recorded change, as kept (paths unresolved).
#[derive(Clone, Debug)]
struct RawChange {
    seq: u64,
    kind: ChangeKind,
    dir: bool,
    /// The inode concerned.
    ino: Ino,
    /// The name concerned, `(directory, name)`; `None` for a content change (any name of
    /// `ino`).
    at: Option<(Ino, Box<[u8]>)>,
    /// A rename's new name.
    to: Option<(Ino, Box<[u8]>)>,
}

impl RawChange {
    fn name_bytes(&self) -> usize {
        self.at.as_ref().map_or(0, |a| a.1.len()) + self.to.as_ref().map_or(0, |a| a.1.len())
    }
}

struct Inner {
    buf: VecDeque<RawChange>,
    /// The sequence number the next change gets.
    next: u64,
    name_bytes: usize,
}

/// The ring (see the module docs).
pub(crate) struct ChangeRing {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_name_bytes: usize,
}

impl Default for ChangeRing {
    fn default() -> Self {
        Self::with_bounds(RING_ENTRIES, RING_NAME_BYTES)
    }
}

/// One change as a query reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Its cursor position.
    pub seq: u64,
    /// What happened.
    pub kind: ChangeKind,
    /// Workspace path (no leading `/`; UTF-8, lossily).
    pub path: String,
    /// A rename's new path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Whether it is a directory.
    pub dir: bool,
}

/// The answer of [`Vfs::changes_since`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChangesPage {
    /// The cursor to ask from next (past the last change considered).
    pub cursor: u64,
    /// Changes after the asked cursor were dropped from the ring before this query: the
    /// list is incomplete.
    pub overflowed: bool,
    /// The matching changes, oldest first.
    pub changes: Vec<Change>,
    /// Changes whose path could not be resolved any more (their directory is gone and
    /// the ring does not know its name): they may or may not lie under the prefix.
    pub unresolved: usize,
    /// More matching changes follow (the limit was reached): ask again from `cursor`.
    pub more: bool,
}

impl ChangeRing {
    /// A ring with the given bounds (tests use small ones).
    pub(crate) fn with_bounds(max_entries: usize, max_name_bytes: usize) -> Self {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1)
            .max(1);
        ChangeRing {
            inner: Mutex::new(Inner {
                buf: VecDeque::new(),
                next: start,
                name_bytes: 0,
            }),
            max_entries: max_entries.max(1),
            max_name_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(
        &self,
        kind: ChangeKind,
        dir: bool,
        ino: Ino,
        at: Option<(Ino, &[u8])>,
        to: Option<(Ino, &[u8])>,
    ) {
        let mut c = RawChange {
            seq: 0,
            kind,
            dir,
            ino,
            at: at.map(|(p, n)| (p, Box::from(n))),
            to: to.map(|(p, n)| (p, Box::from(n))),
        };
        let mut g = self.lock();
        c.seq = g.next;
        g.next += 1;
        g.name_bytes += c.name_bytes();
        g.buf.push_back(c);
        while g.buf.len() > self.max_entries
            || (g.name_bytes > self.max_name_bytes && g.buf.len() > 1)
        {
            if let Some(old) = g.buf.pop_front() {
                g.name_bytes -= old.name_bytes();
            }
        }
    }

    /// `parent/name` (inode `ino`) was created.
    pub(crate) fn created(&self, parent: Ino, name: &[u8], ino: Ino, dir: bool) {
        self.push(ChangeKind::Created, dir, ino, Some((parent, name)), None);
    }

    /// `parent/name`, naming `ino`, was removed.
    pub(crate) fn deleted(&self, parent: Ino, name: &[u8], ino: Ino, dir: bool) {
        self.push(ChangeKind::Deleted, dir, ino, Some((parent, name)), None);
    }

    /// `parent/name` (inode `ino`) moved to `new_parent/new_name`.
    pub(crate) fn renamed(
        &self,
        parent: Ino,
        name: &[u8],
        ino: Ino,
        dir: bool,
        new_parent: Ino,
        new_name: &[u8],
    ) {
        self.push(
            ChangeKind::Renamed,
            dir,
            ino,
            Some((parent, name)),
            Some((new_parent, new_name)),
        );
    }

    /// New content of file `ino` was committed.
    pub(crate) fn changed(&self, ino: Ino) {
        self.push(ChangeKind::Changed, false, ino, None, None);
    }

    /// `parent/name` names another inode (`ino`) now (`RENAME_EXCHANGE`).
    pub(crate) fn repointed(&self, parent: Ino, name: &[u8], ino: Ino, dir: bool) {
        self.push(ChangeKind::Changed, dir, ino, Some((parent, name)), None);
    }

    /// The cursor of the next change.
    pub(crate) fn cursor(&self) -> u64 {
        self.lock().next
    }

    /// The changes from `since` on (copied out), whether some of them were dropped, and
    /// the cursor after the last one.
    fn window(&self, since: u64) -> (Vec<RawChange>, bool, u64) {
        let g = self.lock();
        let oldest = g.buf.front().map_or(g.next, |c| c.seq);
        // A cursor from the future is from another ring (an earlier run, another mount).
        let overflowed = since < oldest || since > g.next;
        let skip = since.saturating_sub(oldest) as usize;
        let v = if since > g.next {
            g.buf.iter().cloned().collect()
        } else {
            g.buf.iter().skip(skip).cloned().collect()
        };
        (v, overflowed, g.next)
    }
}

/// Resolves inodes to paths for one query: the engine's current answer first, then the
/// names the ring itself saw (for what is gone).
struct Resolver<'a> {
    /// Inode → the last name the window gave it (created, renamed to, deleted from).
    known: HashMap<Ino, (Ino, &'a [u8])>,
    memo: HashMap<Ino, Option<Vec<u8>>>,
}

impl<'a> Resolver<'a> {
    fn new(window: &'a [RawChange]) -> Self {
        let mut known = HashMap::new();
        for c in window {
            let name = match c.kind {
                ChangeKind::Renamed => c.to.as_ref(),
                _ => c.at.as_ref(),
            };
            if let Some((p, n)) = name {
                known.insert(c.ino, (*p, &n[..]));
            }
        }
        let mut memo = HashMap::new();
        memo.insert(ROOT_INO, Some(Vec::new()));
        Resolver { known, memo }
    }

    /// The path of `ino` (a directory, or any inode by its first name), or `None`.
    fn path(&mut self, t: &mut dyn MetaTxn, ino: Ino, depth: usize) -> Result<Option<Vec<u8>>> {
        if let Some(p) = self.memo.get(&ino) {
            return Ok(p.clone());
        }
        let mut p = paths::paths_of(t, ino)?.into_iter().next();
        if p.is_none() && depth < MAX_DEPTH {
            if let Some(&(parent, name)) = self.known.get(&ino) {
                p = self
                    .path(t, parent, depth + 1)?
                    .map(|d| paths::join(&d, name));
            }
        }
        self.memo.insert(ino, p.clone());
        Ok(p)
    }

    /// The path of `(parent, name)`.
    fn entry(&mut self, t: &mut dyn MetaTxn, parent: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.path(t, parent, 0)?.map(|d| paths::join(&d, name)))
    }
}

/// For each content change (no name of its own), the name its file had then, when the
/// window shows it: the name the next rename or delete of the inode moved it from, else
/// the name the last create or rename before gave it (`None`: its name now is the one).
fn names_at_content_changes(window: &[RawChange]) -> Vec<Option<(Ino, &[u8])>> {
    let mut out = vec![None; window.len()];
    let mut next_from: HashMap<Ino, (Ino, &[u8])> = HashMap::new();
    for (i, c) in window.iter().enumerate().rev() {
        match (c.kind, &c.at) {
            (ChangeKind::Renamed | ChangeKind::Deleted, Some((p, n))) => {
                next_from.insert(c.ino, (*p, &n[..]));
            }
            (ChangeKind::Changed, None) => out[i] = next_from.get(&c.ino).copied(),
            _ => {}
        }
    }
    let mut last_to: HashMap<Ino, (Ino, &[u8])> = HashMap::new();
    for (i, c) in window.iter().enumerate() {
        let name = match c.kind {
            ChangeKind::Created => c.at.as_ref(),
            ChangeKind::Renamed => c.to.as_ref(),
            ChangeKind::Changed if c.at.is_none() => {
                if out[i].is_none() {
                    out[i] = last_to.get(&c.ino).copied();
                }
                None
            }
            _ => None,
        };
        if let Some((p, n)) = name {
            last_to.insert(c.ino, (*p, &n[..]));
        }
    }
    out
}

fn under(path: &[u8], prefix: &[u8]) -> bool {
    path.starts_with(prefix)
}

fn text(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

impl Vfs {
    /// The change ring's cursor now: [`Vfs::changes_since`] with it returns the changes
    /// made after this call.
    pub fn change_cursor(&self) -> u64 {
        self.ring.cursor()
    }

    /// This mount's changes from cursor `since` on whose path (or a rename's either path)
    /// starts with `prefix` (bytes of a workspace path, e.g. `desks/alice/`; empty for
    /// all), oldest first, at most `limit` of them (see the module docs for how paths are
    /// resolved and what `overflowed` and `unresolved` mean).
    ///
    /// Errors: the metadata engine's, resolving paths.
    pub fn changes_since(&self, since: u64, prefix: &[u8], limit: usize) -> Result<ChangesPage> {
        let (window, overflowed, next) = self.ring.window(since);
        let mut out = Vec::new();
        let mut unresolved = 0usize;
        let mut cursor = next;
        let mut more = false;
        if !window.is_empty() {
            let mut r = Resolver::new(&window);
            let names_then = names_at_content_changes(&window);
            deskfs_meta::read(&*self.meta, |t| {
                out.clear();
                unresolved = 0;
                cursor = next;
                more = false;
                for (i, c) in window.iter().enumerate() {
                    let path = match (&c.at, names_then[i]) {
                        (Some((p, n)), _) => r.entry(t, *p, n)?,
                        (None, Some((p, n))) => r.entry(t, p, n)?,
                        (None, None) => r.path(t, c.ino, 0)?,
                    };
                    let to = match &c.to {
                        Some((p, n)) => r.entry(t, *p, n)?,
                        None => None,
                    };
                    let (path, to) = match (path, to, c.kind) {
                        (Some(p), to, ChangeKind::Renamed) if to.is_some() => (p, to),
                        (Some(p), None, k) if k != ChangeKind::Renamed => (p, None),
                        _ => {
                            unresolved += 1;
                            continue;
                        }
                    };
                    let hit =
                        under(&path, prefix) || to.as_deref().is_some_and(|t| under(t, prefix));
                    if !hit {
                        continue;
                    }
                    if out.len() >= limit {
                        more = true;
                        cursor = c.seq;
                        break;
                    }
                    out.push(Change {
                        seq: c.seq,
                        kind: c.kind,
                        path: text(&path),
                        to: to.as_deref().map(text),
                        dir: c.dir,
                    });
                }
                Ok::<(), crate::VfsError>(())
            })?;
        }
        Ok(ChangesPage {
            cursor,
            overflowed,
            changes: out,
            unresolved,
            more,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_and_window() {
        let r = ChangeRing::with_bounds(4, 1 << 20);
        let c0 = r.cursor();
        r.created(1, b"a", 10, false);
        r.changed(10);
        let c2 = r.cursor();
        assert_eq!(c2, c0 + 2);
        r.deleted(1, b"a", 10, false);
        let (w, over, next) = r.window(c2);
        assert!(!over);
        assert_eq!(next, c2 + 1);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].kind, ChangeKind::Deleted);
        let (w, over, _) = r.window(c0);
        assert!(!over);
        assert_eq!(w.len(), 3);
        // Nothing since now: empty, not overflowed.
        let (w, over, _) = r.window(r.cursor());
        assert!(w.is_empty() && !over);
    }

    #[test]
    fn overflow_is_reported() {
        let r = ChangeRing::with_bounds(4, 1 << 20);
        let c0 = r.cursor();
        for i in 0..6 {
            r.created(1, format!("f{i}").as_bytes(), 10 + i, false);
        }
        let (w, over, _) = r.window(c0);
        assert!(over, "two of six entries fell out of a ring of four");
        assert_eq!(w.len(), 4);
        assert_eq!(&*w[0].at.as_ref().unwrap().1, b"f2");
        // From the oldest kept entry on, nothing is missing.
        let (_, over, _) = r.window(c0 + 2);
        assert!(!over);
        // A cursor from an earlier run (before this ring began) or from the future.
        assert!(r.window(1).1);
        assert!(r.window(r.cursor() + 5).1);
    }

    #[test]
    fn name_bytes_bound() {
        let r = ChangeRing::with_bounds(1000, 10);
        let c0 = r.cursor();
        r.created(1, b"abcdef", 2, false);
        r.created(1, b"ghijkl", 3, false);
        let (w, over, _) = r.window(c0);
        assert!(over);
        assert_eq!(w.len(), 1);
        assert_eq!(r.lock().name_bytes, 6);
    }

    #[test]
    fn rename_keeps_both_names() {
        let r = ChangeRing::with_bounds(16, 1 << 20);
        let c0 = r.cursor();
        r.renamed(1, b"f", 7, false, 5, b"g");
        let (w, _, _) = r.window(c0);
        assert_eq!(w[0].kind, ChangeKind::Renamed);
        assert_eq!(w[0].at.as_ref().map(|a| (a.0, &*a.1)), Some((1, &b"f"[..])));
        assert_eq!(w[0].to.as_ref().map(|a| (a.0, &*a.1)), Some((5, &b"g"[..])));
        // The resolver learns the new name of inode 7.
        let res = Resolver::new(&w);
        assert_eq!(res.known.get(&7), Some(&(5, &b"g"[..])));
    }

    #[test]
    fn prefix_filter() {
        assert!(under(b"desks/alice/a", b"desks/alice/"));
        assert!(!under(b"desks/alicebob/a", b"desks/alice/"));
        assert!(!under(b"desks/alice", b"desks/alice/"));
        assert!(under(b"x", b""));
    }
}
