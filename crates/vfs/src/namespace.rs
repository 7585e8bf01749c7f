//! Namespace operations: POSIX rules for lookup, create, unlink, rename, link, readdir,
//! attributes and xattrs — written once here, above the metadata engines. Each namespace
//! change is one batch of storage ops ([`deskfs_meta::Op`], applied in one round trip by
//! [`Vfs::change`]) that also marks the affected workspace paths pending for the
//! uploader; its expectations guard the facts the decision used.

use std::sync::Arc;

use deskfs_meta::{
    AttrUpdate, Ino, InodeRow, Kind, MetaTxn, Op, OpOut, XattrLook, XattrMode, ROOT_INO,
};

use crate::changes::{Batch, Facts, Node, OnFail, Plan};
use crate::handles::{Handle, OpenRecord};
use crate::types::{rename_flags, xattr_flags, Attr, Ctx, DirEntry, SetAttr, SetTime, StatFs};
use crate::{attr_of, now_ns, poisoned, Result, Vfs, VfsError};

/// Longest name, bytes (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Longest xattr value, bytes (Linux `XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65536;
/// The SELinux label's xattr name (see [`Vfs::getxattr`]).
const SELINUX_XATTR: &[u8] = b"security.selinux";
/// Most hard links of one inode (`LINK_MAX`; ext4's `EXT4_LINK_MAX`).
pub const LINK_MAX: u32 = 65000;
/// While other mounts are live, an inode that lost its last name is purged no sooner than
/// this: an open another mount began while it still had its name (a path resolved a
/// moment before a rename over it) can still complete, as on ext4.
pub const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a row this mount's own batch read back answers `getattr` while alone.
pub const FRESH_ALONE: std::time::Duration = std::time::Duration::from_secs(60);
/// The same while other mounts are live (the kernel's own attribute cache lasts 1 s).
pub const FRESH_SHARED: std::time::Duration = std::time::Duration::from_millis(100);
/// Directory entries returned per readdir call.
const READDIR_BATCH: usize = 128;

/// What [`Vfs::create_node`] made: the committed row and, for a regular file, its new
/// staging file, open read/write.
pub(crate) struct NewNode {
    pub(crate) row: InodeRow,
    pub(crate) staging: Option<std::fs::File>,
}

/// What a new inode is: type, permission bits, device number, symlink target.
pub(crate) struct NodeSpec<'a> {
    pub(crate) kind: Kind,
    pub(crate) perm: u32,
    pub(crate) rdev: u32,
    pub(crate) target: Option<&'a [u8]>,
    /// Record the new inode as open through this session (create = mknod + open).
    pub(crate) open_in: Option<u64>,
}

impl NodeSpec<'_> {
    pub(crate) fn new(kind: Kind, perm: u32) -> Self {
        NodeSpec {
            kind,
            perm,
            rdev: 0,
            target: None,
            open_in: None,
        }
    }
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(VfsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(VfsError::Invalid);
    }
    Ok(())
}

fn get_dir(t: &mut dyn MetaTxn, ino: Ino) -> Result<InodeRow> {
    let r = t.get_inode(ino)?.ok_or(VfsError::Stale)?;
    if r.kind != Kind::Dir {
        return Err(VfsError::NotDir);
    }
    Ok(r)
}

/// Whether an inode's attributes say it is a directory.
fn is_dir(n: &Node) -> bool {
    n.hint.kind == Kind::Dir
}

impl Vfs {
    /// Records that a request is being served now (the uploader waits for a quiet
    /// moment, see `uploader::BURST_DEFER`). One relaxed atomic store.
    pub fn note_activity(&self) {
        self.last_mark_ns
            .store(now_ns(), std::sync::atomic::Ordering::Relaxed);
    }

    /// When a path marked now may be uploaded (the coalescing delay), and a note that
    /// the request path is busy.
    pub(crate) fn not_before(&self) -> i64 {
        let now = now_ns();
        self.last_mark_ns
            .store(now, std::sync::atomic::Ordering::Relaxed);
        now + self.cfg.upload_delay.as_nanos() as i64
    }

    /// A pending mark of `parent/name` for the uploader.
    pub(crate) fn mark(&self, parent: Ino, name: &[u8], recursive: bool) -> Op {
        Op::MarkPath {
            parent,
            name: name.to_vec(),
            recursive,
            not_before_ns: self.not_before(),
        }
    }

    /// Whether this mount has `ino` open (handles) or holds uncommitted writes of it. A
    /// state another thread has locked right now counts as held (the safe answer for
    /// purge decisions).
    pub(crate) fn is_open(&self, ino: Ino) -> bool {
        let st = match self.inodes.lock() {
            Ok(m) => m.get(&ino).cloned(),
            Err(_) => return true,
        };
        match st {
            None => false,
            Some(st) => match st.try_lock() {
                Ok(s) => s.open_count > 0 || s.uncommitted,
                Err(std::sync::TryLockError::WouldBlock) => true,
                Err(std::sync::TryLockError::Poisoned(_)) => true,
            },
        }
    }

    /// Whether `ino` must outlive its last name for this mount: open here, or held by
    /// this mount's kernel (a process may have resolved a path to it a moment ago).
    pub(crate) fn keeps(&self, ino: Ino) -> bool {
        self.is_open(ino) || self.refs.held(ino)
    }

    /// Whether this mount may serve `row` (`held`: open or written here): a live inode,
    /// or an orphan this mount keeps (its own open files and kernel references).
    /// Another mount's orphan is `ESTALE`, so the kernel walks the path again and finds
    /// what replaced it.
    pub(crate) fn servable(&self, row: &InodeRow, held: bool) -> Result<()> {
        if row.nlink == 0 && row.kind != Kind::Dir && !held && !self.refs.is_kept_orphan(row.ino) {
            return Err(VfsError::Stale);
        }
        Ok(())
    }

    /// The error for a request naming inode `ino` that does not exist: `ESTALE` (the
    /// kernel walks the path again), or `ENOENT` for a directory known to be removed (a
    /// removed working directory answers that on ext4).
    pub(crate) fn gone(&self, ino: Ino) -> VfsError {
        if self.hints.kind(ino) == Some(Kind::Dir) {
            VfsError::NotFound
        } else {
            VfsError::Stale
        }
    }

    /// The row of `ino` as an inode-addressed request needs it: `ESTALE` when it is gone
    /// (for a directory `ENOENT`, as a removed working directory answers on ext4) or an
    /// orphan this mount does not keep.
    pub(crate) fn current(&self, ino: Ino) -> Result<InodeRow> {
        self.current_held(ino, None)
    }

    /// [`Vfs::current`] with what the caller knows of its state lock: `Some(held)` when
    /// it holds the inode's state locked (then `is_open` must not be asked).
    pub(crate) fn current_held(&self, ino: Ino, held: Option<bool>) -> Result<InodeRow> {
        match self.meta.get_inode(ino)? {
            Some(r) => {
                let held = match held {
                    Some(h) => h,
                    None => self.is_open(ino),
                };
                self.servable(&r, held)?;
                self.hints.note_row(&r);
                Ok(r)
            }
            None => Err(self.gone(ino)),
        }
    }

    /// Attributes with uncommitted in-memory size/mtime applied.
    pub(crate) fn overlay(&self, row: &InodeRow) -> Attr {
        let mut a = attr_of(row);
        // An access time queued for the database (see `atime`) shows at once.
        if let Some(t) = self.atimes.pending(row.ino) {
            a.atime_ns = a.atime_ns.max(t);
        }
        let st = self
            .inodes
            .lock()
            .ok()
            .and_then(|m| m.get(&row.ino).cloned());
        if let Some(st) = st {
            if let Ok(mut s) = st.lock() {
                // Writes through a passthrough backing file the kernel just told us of by
                // asking (an fstat failure leaves the last known values).
                if s.loaded && s.pt.writers() > 0 {
                    let _ = self.absorb_backing(row.ino, &mut s, crate::passthrough::Absorb::Seen);
                }
                // The state is newer than `row` while it holds uncommitted writes, and
                // when it committed a content version after `row` was read (a close that
                // committed between this request's read and now): the row's size would
                // shrink the kernel's — it takes this answer, given after the writes.
                if s.loaded && (s.uncommitted || s.version > row.data_version) {
                    a.size = s.size;
                    a.blocks = s.size.div_ceil(512);
                    a.mtime_ns = s.mtime_ns;
                    a.ctime_ns = s.ctime_ns;
                }
            }
        }
        a
    }

    /// A row for a new inode of `kind` in directory `parent` (hint of its attributes).
    fn new_row(&self, ctx: &Ctx, parent: &Node, kind: Kind, perm: u32, now: i64) -> InodeRow {
        let mut perm = perm & 0o7777;
        let mut gid = ctx.gid;
        if parent.hint.perm & 0o2000 != 0 {
            // BSD group semantics of a setgid directory (ext4 behaviour).
            gid = parent.hint.gid;
            if kind == Kind::Dir {
                perm |= 0o2000;
            }
        }
        InodeRow {
            listed_ns: if kind == Kind::Dir { now } else { 0 },
            ..InodeRow::fresh(kind, perm, ctx.uid, gid, now)
        }
    }

    /// The facts every change inside directory `parent` starts from: it exists and is a
    /// directory (`ENOENT`/`ENOTDIR` otherwise), with its attributes.
    fn dir_facts(&self, f: &Facts<'_>, parent: Ino) -> Result<Node> {
        let p = f.inode(parent)?.ok_or_else(|| self.gone(parent))?;
        if !is_dir(&p) {
            return Err(VfsError::NotDir);
        }
        Ok(p)
    }

    /// Creates a new inode named `parent/name` in one batch; a regular file gets its
    /// (empty) staging file, returned open.
    pub(crate) fn create_node(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        spec: NodeSpec<'_>,
    ) -> Result<NewNode> {
        let NodeSpec {
            kind,
            perm,
            rdev,
            target,
            open_in,
        } = spec;
        check_name(name)?;
        self.ensure_listed(parent, false)?;
        let ino = self.alloc_ino()?;
        // Before the inode exists: an xattr set on it by another thread between the
        // create's commit and the note below keeps the note from being made.
        let xattrs = self.hints.xattr_stamp();
        let row = self.change(|f| {
            let p = self.dir_facts(f, parent)?;
            if f.fresh() {
                // The decisive reads: a removed directory, a taken name, too many links.
                let prow = f.row(parent)?.ok_or(VfsError::NotFound)?;
                if prow.nlink == 0 {
                    return Err(VfsError::NotFound);
                }
                if kind == Kind::Dir && prow.nlink >= LINK_MAX {
                    return Err(VfsError::TooManyLinks);
                }
            }
            let now = now_ns();
            let mut row = self.new_row(ctx, &p, kind, perm, now);
            row.ino = ino;
            row.rdev = rdev;
            if let Some(tg) = target {
                row.size = tg.len() as u64;
                row.target = Some(tg.to_vec());
            }
            if kind == Kind::File {
                // Empty files need no download: their (empty) content is local.
                row.local = self.here();
                row.dirty = true;
                row.data_version = 1;
            }
            // A create that counts its open checks the session it counts under.
            let mut b = match open_in {
                Some(session) => Batch::checking(session),
                None => Batch::new(self),
            };
            b.guard(Op::ExpectAttrs {
                ino: parent,
                perm: p.hint.perm,
                uid: p.hint.uid,
                gid: p.hint.gid,
            });
            b.guard(Op::TouchDir {
                ino: parent,
                nlink_delta: (kind == Kind::Dir) as i64,
                time_ns: now,
            });
            b.guard(Op::InsertInode(row.clone()));
            b.push(
                Op::InsertDentry {
                    parent,
                    name: name.to_vec(),
                    ino,
                },
                OnFail::Errno(libc::EEXIST),
            );
            if let Some(session) = open_in {
                b.guard(Op::AddOpen {
                    ino,
                    session,
                    delta: 1,
                });
            }
            b.guard(self.mark(parent, name, false));
            b.refresh(parent);
            // Read back as committed: the next getattr, and a chown to its own owner,
            // need no round trip.
            b.refresh(ino);
            Ok(Plan::Apply(b, Box::new(move |_| Ok(row))))
        })?;
        // The staging file exists from birth: the empty content is local.
        let staging = if row.kind == Kind::File {
            Some(self.cache.create_staging(row.ino)?)
        } else {
            None
        };
        self.ring
            .created(parent, name, row.ino, row.kind == Kind::Dir);
        self.hints.note_row(&row);
        self.hints.note_no_xattrs(row.ino, &xattrs);
        self.hints.note_entry(parent, name, row.ino);
        self.refs.looked_up(row.ino);
        Ok(NewNode { row, staging })
    }

    /// [`Vfs::create_node`] for callers that keep only the row (`mknod`, `mkdir`,
    /// `symlink`; a regular file's staging file is closed again).
    fn create_row(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        spec: NodeSpec<'_>,
    ) -> Result<InodeRow> {
        self.create_node(ctx, parent, name, spec).map(|n| n.row)
    }

    /// `lookup`: the attributes of `parent/name` (the kernel now holds a reference to the
    /// inode). Errors: `ENOENT`, `ENAMETOOLONG`. Lists the directory from the bucket
    /// first if it was never listed.
    pub fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(VfsError::NameTooLong);
        }
        self.ensure_listed(parent, false)?;
        let row = if name == b"." || name == b".." {
            let me = self.current(parent)?;
            if me.kind != Kind::Dir {
                return Err(VfsError::NotDir);
            }
            if name == b"." {
                Some(me)
            } else {
                let p = deskfs_meta::read(&*self.meta, |t| self.parent_of(t, parent))?;
                self.meta.get_inode(p)?
            }
        } else {
            self.meta.lookup(parent, name)?
        };
        tracing::debug!(parent, name = %String::from_utf8_lossy(name), pid = ctx.pid, ino = row.as_ref().map(|r| r.ino), nlink = row.as_ref().map(|r| r.nlink), "lookup");
        let Some(row) = row else {
            // (A retry's walk that finds no entry retries no open.)
            self.retries.ended(ctx.pid);
            if name != b"." && name != b".." {
                self.hints.note_absent(parent, name);
            }
            // A miss: the parent decides between ENOENT and ENOTDIR.
            return Err(match self.hints.kind(parent) {
                Some(Kind::Dir) => VfsError::NotFound,
                Some(_) => VfsError::NotDir,
                None => match self.meta.get_inode(parent)? {
                    Some(p) if p.kind != Kind::Dir => VfsError::NotDir,
                    Some(_) => VfsError::NotFound,
                    None => self.gone(parent),
                },
            });
        };
        self.hints.note_row(&row);
        self.hints.note_entry(parent, name, row.ino);
        self.refs.looked_up(row.ino);
        self.retries.looked_up(ctx.pid, row.ino);
        Ok(self.overlay(&row))
    }

    fn parent_of(&self, t: &mut dyn MetaTxn, ino: Ino) -> deskfs_meta::Result<Ino> {
        if ino == ROOT_INO {
            return Ok(ROOT_INO);
        }
        Ok(t.names_of(ino)?
            .first()
            .map(|(p, _)| *p)
            .unwrap_or(ROOT_INO))
    }

    /// Kernel `forget`: the kernel dropped `nlookup` references to `ino`. An orphan kept
    /// for the kernel is purged when its last reference and handle are gone.
    pub fn forget(&self, ino: Ino, nlookup: u64) {
        self.forget_many(&[(ino, nlookup)]);
    }

    /// Kernel `batch_forget`: [`Vfs::forget`] for many inodes. Orphans released are
    /// purged by the feed thread within [`crate::feed::FEED_POLL`], many per batch.
    pub fn forget_many(&self, items: &[(Ino, u64)]) {
        for (ino, n) in items {
            if self.refs.forget(*ino, *n) && !self.keeps(*ino) {
                self.refs.queue_purge(*ino);
            }
        }
    }

    /// Purges the queued orphans that nothing holds again meanwhile (after
    /// [`ORPHAN_GRACE`] while other mounts are live).
    pub(crate) fn flush_purges(&self) {
        let grace = if self.shared() {
            ORPHAN_GRACE
        } else {
            std::time::Duration::ZERO
        };
        self.flush_purges_after(grace);
    }

    /// Purges the queued orphans queued at least `grace` ago (all at shutdown).
    pub(crate) fn flush_purges_after(&self, grace: std::time::Duration) {
        let q: Vec<Ino> = self
            .refs
            .take_due(grace)
            .into_iter()
            .filter(|i| !self.keeps(*i))
            .collect();
        for chunk in q.chunks(256) {
            self.purge_now(chunk);
        }
    }

    /// Purges the orphans `inos` (those still unreferenced everywhere), with their local
    /// data.
    pub(crate) fn purge_now(&self, inos: &[Ino]) {
        let ops: Vec<Op> = inos.iter().map(|i| Op::Purge(*i)).collect();
        match self.meta.apply(&ops) {
            Ok(out) => {
                for (ino, o) in inos.iter().zip(out) {
                    self.refs.drop_orphan(*ino);
                    if o == OpOut::Purged(true) {
                        self.purge_local(*ino);
                    }
                }
            }
            // Left as orphans: the next mount's recovery purges them.
            Err(e) => tracing::warn!(error = %e, "cannot purge orphans"),
        }
    }

    /// `ino` lost its last name while this mount keeps it: it stays an orphan until the
    /// last handle or kernel reference goes (re-checked here, as the kernel may have let
    /// go meanwhile).
    pub(crate) fn settle_orphan(&self, ino: Ino) {
        self.refs.keep_orphan(ino);
        self.purge_if_unheld(ino);
    }

    /// The last handle of orphan `ino` closed: purge it unless this mount still holds it
    /// (kernel references — then only when this mount made it an orphan, see
    /// [`Vfs::settle_orphan`]). An orphan another mount made is never adopted here, so this
    /// mount answers `ESTALE` for it and the kernel walks the path again.
    pub(crate) fn release_orphan(&self, ino: Ino) {
        if self.refs.is_kept_orphan(ino) {
            self.purge_if_unheld(ino);
        } else if !self.is_open(ino) {
            if self.shared() {
                self.refs.queue_purge(ino);
            } else {
                self.purge_now(&[ino]);
            }
        }
    }

    fn purge_if_unheld(&self, ino: Ino) {
        if !self.keeps(ino) {
            if self.shared() {
                // Other mounts may be opening it right now (see ORPHAN_GRACE).
                self.refs.queue_purge(ino);
            } else {
                self.purge_now(&[ino]);
            }
        }
    }

    /// `getattr` for a process: [`Vfs::getattr`], where an `ESTALE` makes the kernel
    /// walk the path again (`stat(2)` and `open(2)` retry once with `LOOKUP_REVAL`) and
    /// the inode that fresh lookup returned to `pid` is served even if it lost its name
    /// since (a name renamed over again and again; see `kernel_refs::StaleRetries`); the
    /// retry stays for the `open` that may follow.
    /// Errors: as [`Vfs::getattr`].
    pub fn getattr_for(&self, ctx: &Ctx, ino: Ino) -> Result<Attr> {
        match self.getattr(ino) {
            Err(VfsError::Stale) => {
                if self.retries.in_retry(ctx.pid, ino) {
                    if let Some(row) = self.meta.get_inode(ino)? {
                        return Ok(self.overlay(&row));
                    }
                }
                self.retries.staled(ctx.pid);
                Err(VfsError::Stale)
            }
            r => r,
        }
    }

    /// How long what this mount's own last change told about an inode answers without a
    /// round trip: [`FRESH_ALONE`] alone, [`FRESH_SHARED`] shared.
    fn fresh_for(&self) -> std::time::Duration {
        if self.shared() {
            FRESH_SHARED
        } else {
            FRESH_ALONE
        }
    }

    /// `getattr`. Errors: `ESTALE` (the inode is gone: the kernel walks the path again).
    /// A row this mount's own last change read back answers without a round trip while
    /// young ([`FRESH_ALONE`] alone — nobody else changes it, and other writers'
    /// changes arrive as invalidations that drop it — or [`FRESH_SHARED`] shared).
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        if let Some(r) = self.hints.fresh(ino, self.fresh_for()) {
            if self.servable(&r, false).is_ok() {
                return Ok(self.overlay(&r));
            }
        }
        let row = self.current(ino)?;
        #[cfg(test)]
        if let Some(race) = tests::BEFORE_OVERLAY.with(|r| r.borrow_mut().take()) {
            race();
        }
        Ok(self.overlay(&row))
    }

    /// `setattr`: chmod, chown, truncate (both ways), utimensat (ns, `UTIME_NOW`,
    /// `UTIME_OMIT` = `None`). Permission checks are the kernel's (`default_permissions`).
    /// Errors: `ESTALE`, `EISDIR` (truncate of a directory), `EINVAL`.
    pub fn setattr(&self, ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        if let Some(size) = set.size {
            // Truncation by an unprivileged caller drops setuid/setgid (killpriv v2: the
            // kernel leaves it to us; root stands for CAP_FSETID).
            if ctx.uid != 0 {
                self.kill_privs(ctx, ino)?;
            }
            self.truncate(ino, size)?;
        }
        let needs_meta = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some();
        if !needs_meta {
            return self.getattr(ino);
        }
        let now = now_ns();
        let t_of = |s: SetTime| match s {
            SetTime::Now => now,
            SetTime::At(ns) => ns,
        };
        // An explicit mtime wins over uncommitted writes' mtime.
        if let Some(m) = set.mtime {
            self.with_state(ino, |st| {
                if st.loaded {
                    st.mtime_ns = t_of(m);
                }
            })?;
        }
        // While this mount still has content of the file to commit (open, written), its
        // commit at close marks the inode for upload: this change rides on that mark.
        // Decided under the state's lock, held through the transaction, so the close
        // cannot commit in between.
        let st = self.inodes.lock().ok().and_then(|m| m.get(&ino).cloned());
        let held = st
            .as_ref()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()));
        let marked_at_close = held
            .as_ref()
            .is_some_and(|s| !s.detached && s.loaded && s.uncommitted && s.open_count > 0);
        // Open here for writing, with writes to commit or created for writing and not
        // written yet (the create's writer lock held): its close commits.
        let writing = held.as_ref().is_some_and(|s| {
            !s.detached
                && s.loaded
                && s.open_count > 0
                && (s.uncommitted || s.create_guard.is_some())
        });
        if writing && set.mode.is_none() && set.atime.is_none() && set.mtime.is_none() {
            if let Some(row) = self.same_owner(ino, set) {
                // A chown to the owner it has (SQLite gives every new journal its
                // database's owner, before writing it): only ctime changes, carried by
                // the commit at close like a write's mtime. No round trip.
                if let Some(mut st) = held {
                    if !st.uncommitted {
                        self.cache.staging_dirty(ino);
                    }
                    st.note_ctime(now, self.coherence.session());
                }
                // (The state's lock is released: `overlay` takes it.)
                return Ok(self.overlay(&row));
            }
        }
        let change = || {
            self.change(|f| {
                let cur = f.inode(ino)?.ok_or(VfsError::Stale)?;
                let mut b = Batch::new(self);
                let mut perm = set.mode.map(|m| m & 0o7777);
                let changes_owner = set.uid.is_some_and(|u| u != cur.hint.uid)
                    || set.gid.is_some_and(|g| g != cur.hint.gid);
                // chown clears setuid, and setgid when group-executable (Linux), judged on the
                // mode it had: guarded.
                if changes_owner && cur.hint.kind != Kind::Dir && set.mode.is_none() {
                    let mut p = cur.hint.perm & !0o4000;
                    if p & 0o010 != 0 {
                        p &= !0o2000;
                    }
                    if p != cur.hint.perm {
                        b.guard(Op::ExpectAttrs {
                            ino,
                            perm: cur.hint.perm,
                            uid: cur.hint.uid,
                            gid: cur.hint.gid,
                        });
                        perm = Some(p);
                    }
                }
                b.guard(Op::SetAttrs {
                    ino,
                    set: AttrUpdate {
                        perm,
                        uid: set.uid,
                        gid: set.gid,
                        atime_ns: set.atime.map(t_of),
                        mtime_ns: set.mtime.map(t_of),
                        ctime_ns: Some(now),
                        ..Default::default()
                    },
                });
                if !marked_at_close {
                    b.guard(Op::MarkInode {
                        ino,
                        not_before_ns: self.not_before(),
                    });
                }
                let get = b.refresh(ino);
                Ok(Plan::Apply(
                    b,
                    Box::new(move |out| out[get].row().cloned().ok_or(VfsError::Stale)),
                ))
            })
        };
        // An explicit atime (`touch -a`, `utimensat`) stands over accesses queued before it.
        let row = if set.atime.is_some() {
            self.atimes.explicit(ino, change)
        } else {
            change()
        };
        drop(held);
        let row = row?;
        self.with_state(ino, |st| {
            if st.loaded {
                st.ctime_ns = now;
            }
        })?;
        Ok(self.overlay(&row))
    }

    /// The row of `ino` when `set` names its current owner and group (or neither), this
    /// mount is alone and its own last change of the row is young enough to be exact
    /// (see [`Vfs::getattr`]): a chown that changes nothing but ctime.
    fn same_owner(&self, ino: Ino, set: &SetAttr) -> Option<InodeRow> {
        // Only while alone: a change is skipped on the strength of this row, and a peer
        // may have changed the owner within the shared freshness window.
        if self.shared() {
            return None;
        }
        let row = self.hints.fresh(ino, FRESH_ALONE)?;
        let same = set.uid.is_none_or(|u| u == row.uid) && set.gid.is_none_or(|g| g == row.gid);
        same.then_some(row)
    }

    /// Drops the privileges a write or truncate by an unprivileged caller must drop
    /// (Linux `file_remove_privs` / `setattr_should_drop_sgid`, which FUSE leaves to the
    /// file system under `FUSE_HANDLE_KILLPRIV_V2`): setuid; setgid when the file is
    /// group-executable or the caller is not in its group (judged by the caller's primary
    /// gid: FUSE does not pass supplementary groups); the `security.capability` xattr.
    /// ctime changes, and the kernel's cached attributes are dropped, only when something
    /// was dropped. Errors: `ESTALE`.
    pub fn kill_privs(&self, ctx: &Ctx, ino: Ino) -> Result<()> {
        const CAPS: &[u8] = b"security.capability";
        let kill = |perm: u32, gid: u32| {
            let mut p = perm & !0o4000;
            if p & 0o010 != 0 || (ctx.gid != gid && ctx.uid != 0) {
                p &= !0o2000;
            }
            p
        };
        let now = now_ns();
        let dropped = self.change(|f| {
            let row = f.row(ino)?.ok_or(VfsError::Stale)?;
            let has_caps = deskfs_meta::read(&*self.meta, |t| t.get_xattr(ino, CAPS))?.is_some();
            let perm = kill(row.perm, row.gid);
            if row.kind != Kind::File || (perm == row.perm && !has_caps) {
                return Ok(Plan::Done(false));
            }
            let mut b = Batch::new(self);
            b.guard(Op::ExpectAttrs {
                ino,
                perm: row.perm,
                uid: row.uid,
                gid: row.gid,
            });
            b.guard(Op::SetAttrs {
                ino,
                set: AttrUpdate {
                    perm: Some(perm),
                    ctime_ns: Some(now),
                    ..Default::default()
                },
            });
            if has_caps {
                b.guard(Op::RemoveXattr {
                    ino,
                    name: CAPS.to_vec(),
                });
            }
            b.guard(Op::MarkInode {
                ino,
                not_before_ns: self.not_before(),
            });
            Ok(Plan::Apply(b, Box::new(|_| Ok(true))))
        })?;
        if dropped {
            self.with_state(ino, |st| {
                if st.loaded {
                    st.ctime_ns = now;
                }
            })?;
            self.invalidate_now(&crate::Invalidation::Attrs(ino));
        }
        Ok(())
    }

    /// `readlink`. Errors: `ESTALE`, `EINVAL` (not a symlink).
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let row = self.current(ino)?;
        match (row.kind, row.target) {
            (Kind::Symlink, Some(t)) => Ok(t),
            _ => Err(VfsError::Invalid),
        }
    }

    /// `mknod`: regular files, FIFOs, sockets and device nodes. `mode` carries the
    /// `S_IFMT` type bits. Errors: `EEXIST`, `ENOENT`, `ENOTDIR`, `EINVAL` (unknown type).
    pub fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let kind = Kind::from_mode(mode).ok_or(VfsError::Invalid)?;
        if matches!(kind, Kind::Dir | Kind::Symlink) {
            return Err(VfsError::Invalid);
        }
        let row = self.create_row(
            ctx,
            parent,
            name,
            NodeSpec {
                rdev,
                ..NodeSpec::new(kind, mode & !umask)
            },
        )?;
        Ok(attr_of(&row))
    }

    /// `mkdir`. Errors: `EEXIST`, `ENOENT`, `ENOTDIR`, `ENAMETOOLONG`, `EMLINK`.
    pub fn mkdir(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr> {
        let row = self.create_row(
            ctx,
            parent,
            name,
            NodeSpec::new(Kind::Dir, mode & !umask & 0o7777),
        )?;
        self.hints.set_listed(row.ino);
        Ok(attr_of(&row))
    }

    /// `symlink`. Errors: `EEXIST`, `ENOENT`, `ENOTDIR`, `ENAMETOOLONG` (target > 4095).
    pub fn symlink(&self, ctx: &Ctx, parent: Ino, name: &[u8], target: &[u8]) -> Result<Attr> {
        if target.len() >= 4096 {
            return Err(VfsError::NameTooLong);
        }
        let row = self.create_row(
            ctx,
            parent,
            name,
            NodeSpec {
                target: Some(target),
                ..NodeSpec::new(Kind::Symlink, 0o777)
            },
        )?;
        Ok(attr_of(&row))
    }

    /// Drops an inode's local data after it was purged.
    pub(crate) fn purge_local(&self, ino: Ino) {
        self.forget_orphan_object(ino);
        self.flush_failures.clear(ino);
        // Its staging file can serve a new file, unless another mount on this host (which
        // may share this cache dir and upload from it) is live.
        let res = if self.coherence.cache_may_be_shared() {
            self.cache.remove_staging(ino)
        } else {
            self.cache.recycle_staging(ino)
        };
        if let Err(e) = res {
            tracing::warn!(ino, error = %e, "cannot remove staging file");
        }
        self.cache.drop_blocks(ino);
        self.fill_purged(ino);
        self.hints.forget_inode(ino);
    }

    /// Adds to `b` the removal of the name `parent/name` of non-directory `x`: one link
    /// less, and the inode's purge when this mount does not keep it. Returns the index
    /// of the op reporting the purge, if any, and of the `GetInode` giving its nlink.
    fn drop_link(
        &self,
        b: &mut Batch,
        parent: Ino,
        name: &[u8],
        x: Ino,
        now: i64,
    ) -> (Option<usize>, usize) {
        b.guard(Op::DeleteDentry {
            parent,
            name: name.to_vec(),
            ino: x,
        });
        b.guard(Op::AddNlink {
            ino: x,
            delta: -1,
            ctime_ns: now,
        });
        // Purged at once only while alone: another mount may be opening it (ORPHAN_GRACE).
        let purge = (!self.keeps(x) && !self.shared()).then(|| b.guard(Op::Purge(x)));
        let get = b.guard(Op::GetInode(x));
        (purge, get)
    }

    /// After a batch that removed a name of `x`: local cleanup of a purged inode, or an
    /// orphan kept for this mount.
    fn after_drop(&self, x: Ino, out: &[OpOut], purge: Option<usize>, get: usize) {
        if purge.is_some_and(|i| out[i] == OpOut::Purged(true)) {
            self.purge_local(x);
            return;
        }
        if out[get].row().is_some_and(|r| r.nlink == 0) {
            self.settle_orphan(x);
        }
    }

    /// `unlink`. An open file stays readable and writable through its handles until the
    /// last close (and an inode the kernel still holds stays until it forgets it).
    /// Errors: `ENOENT`, `EISDIR`, `ENOTDIR`.
    pub fn unlink(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.ensure_listed(parent, false)?;
        self.change(|f| {
            self.dir_facts(f, parent)?;
            let x = f.entry(parent, name)?.ok_or(VfsError::NotFound)?;
            if is_dir(&x) {
                return Err(VfsError::IsDir);
            }
            let now = now_ns();
            let mut b = Batch::new(self);
            b.guard(Op::TouchDir {
                ino: parent,
                nlink_delta: 0,
                time_ns: now,
            });
            let (purge, get) = self.drop_link(&mut b, parent, name, x.ino, now);
            b.guard(self.mark(parent, name, false));
            b.refresh(parent);
            Ok(Plan::Apply(
                b,
                Box::new(move |out| {
                    self.ring.deleted(parent, name, x.ino, false);
                    self.hints.forget_entry(parent, name);
                    self.after_drop(x.ino, out, purge, get);
                    Ok(())
                }),
            ))
        })
    }

    /// `rmdir`. Errors: `ENOENT`, `ENOTDIR`, `ENOTEMPTY`, `EINVAL` (`.`).
    pub fn rmdir(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(VfsError::Invalid);
        }
        if name == b".." {
            return Err(VfsError::NotEmpty);
        }
        check_name(name)?;
        self.ensure_listed(parent, false)?;
        // Children that exist only in the bucket make the directory non-empty too.
        if let Some(d) = self.meta.lookup(parent, name)? {
            self.ensure_listed(d.ino, false)?;
        }
        self.change(|f| {
            self.dir_facts(f, parent)?;
            let d = f.entry(parent, name)?.ok_or(VfsError::NotFound)?;
            if !is_dir(&d) {
                return Err(VfsError::NotDir);
            }
            let now = now_ns();
            let mut b = Batch::new(self);
            b.guard(Op::TouchDir {
                ino: parent,
                nlink_delta: -1,
                time_ns: now,
            });
            // Lock the directory itself: a create inside it cannot slip in between.
            b.guard(Op::TouchDir {
                ino: d.ino,
                nlink_delta: 0,
                time_ns: now,
            });
            b.push(Op::ExpectEmpty(d.ino), OnFail::Errno(libc::ENOTEMPTY));
            b.guard(Op::DeleteDentry {
                parent,
                name: name.to_vec(),
                ino: d.ino,
            });
            b.guard(Op::DeleteInode(d.ino));
            b.guard(self.mark(parent, name, true));
            b.refresh(parent);
            Ok(Plan::Apply(
                b,
                Box::new(move |_| {
                    self.ring.deleted(parent, name, d.ino, true);
                    self.hints.forget_entry(parent, name);
                    self.hints.forget_inode(d.ino);
                    Ok(())
                }),
            ))
        })
    }

    /// `rename`/`renameat2`: atomic replace of a file or an empty directory,
    /// `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, directories anywhere except into
    /// themselves. One batch; the bucket follows in the background (copy + delete). A
    /// replaced file this mount still holds stays as an orphan until released.
    /// Errors: `ENOENT`, `EEXIST` (NOREPLACE), `ENOTEMPTY`, `EISDIR`, `ENOTDIR`, `EINVAL`.
    pub fn rename(
        &self,
        _ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        let noreplace = flags & rename_flags::NOREPLACE != 0;
        let exchange = flags & rename_flags::EXCHANGE != 0;
        if flags & !(rename_flags::NOREPLACE | rename_flags::EXCHANGE) != 0
            || (noreplace && exchange)
        {
            return Err(VfsError::Invalid);
        }
        check_name(name)?;
        check_name(new_name)?;
        self.ensure_listed(parent, false)?;
        if new_parent != parent {
            self.ensure_listed(new_parent, false)?;
        }
        // Directories moved or replaced must be complete first: a moved directory takes
        // its bucket-only children along, a replaced one must really be empty. (Files
        // need nothing: the kernel's lookups told us what the names are.)
        let probe = Facts::hinted(self);
        if let Some(d) = probe.entry(parent, name)?.filter(is_dir) {
            self.ensure_subtree_listed(d.ino)?;
        }
        if let Some(d) = probe.entry(new_parent, new_name)?.filter(is_dir) {
            self.ensure_listed(d.ino, false)?;
            if exchange {
                self.ensure_subtree_listed(d.ino)?;
            }
        }
        self.change(|f| {
            self.dir_facts(f, parent)?;
            self.dir_facts(f, new_parent)?;
            let s = f.entry(parent, name)?.ok_or(VfsError::NotFound)?;
            let d = f.entry(new_parent, new_name)?;
            if exchange && d.is_none() {
                return Err(VfsError::NotFound);
            }
            if noreplace && d.is_some() {
                return Err(VfsError::Exists);
            }
            if d.is_some_and(|d| d.ino == s.ino) {
                // Same inode (same entry or two hard links): POSIX says do nothing.
                return Ok(Plan::Done(()));
            }
            let now = now_ns();
            let src_dir = is_dir(&s);
            let moves = parent != new_parent;
            let mut b = Batch::new(self);
            // Both directories' rows first (in inode order), so changes of the same
            // directories serialise without deadlocking.
            let mut dirs = vec![(parent, 0i64), (new_parent, 0i64)];
            if let Some(d) = d.filter(|_| exchange) {
                let dst_dir = is_dir(&d);
                if moves {
                    if src_dir {
                        dirs[0].1 -= 1;
                        dirs[1].1 += 1;
                    }
                    if dst_dir {
                        dirs[1].1 -= 1;
                        dirs[0].1 += 1;
                    }
                }
                push_dirs(&mut b, dirs, now);
                if moves && src_dir {
                    b.push(
                        Op::ExpectNotAncestor {
                            dir: s.ino,
                            of: new_parent,
                        },
                        OnFail::Errno(libc::EINVAL),
                    );
                }
                if moves && dst_dir {
                    b.push(
                        Op::ExpectNotAncestor {
                            dir: d.ino,
                            of: parent,
                        },
                        OnFail::Errno(libc::EINVAL),
                    );
                }
                b.guard(Op::RepointDentry {
                    parent,
                    name: name.to_vec(),
                    from: s.ino,
                    to: d.ino,
                });
                b.guard(Op::RepointDentry {
                    parent: new_parent,
                    name: new_name.to_vec(),
                    from: d.ino,
                    to: s.ino,
                });
                for ino in [s.ino, d.ino] {
                    b.guard(Op::SetAttrs {
                        ino,
                        set: AttrUpdate {
                            ctime_ns: Some(now),
                            ..Default::default()
                        },
                    });
                }
                b.guard(self.mark(parent, name, true));
                b.guard(self.mark(new_parent, new_name, true));
                b.refresh(parent);
                if new_parent != parent {
                    b.refresh(new_parent);
                }
                return Ok(Plan::Apply(
                    b,
                    Box::new(move |_| {
                        self.ring.repointed(parent, name, d.ino, is_dir(&d));
                        self.ring.repointed(new_parent, new_name, s.ino, src_dir);
                        self.hints.note_entry(parent, name, d.ino);
                        self.hints.note_entry(new_parent, new_name, s.ino);
                        Ok(())
                    }),
                ));
            }
            if let Some(d) = &d {
                if src_dir && !is_dir(d) {
                    return Err(VfsError::NotDir);
                }
                if !src_dir && is_dir(d) {
                    return Err(VfsError::IsDir);
                }
                if is_dir(d) {
                    dirs[1].1 -= 1;
                }
            }
            if moves && src_dir {
                dirs[0].1 -= 1;
                dirs[1].1 += 1;
            }
            push_dirs(&mut b, dirs, now);
            if moves && src_dir {
                b.push(
                    Op::ExpectNotAncestor {
                        dir: s.ino,
                        of: new_parent,
                    },
                    OnFail::Errno(libc::EINVAL),
                );
            }
            let mut dropped = None;
            match &d {
                Some(d) if is_dir(d) => {
                    b.guard(Op::TouchDir {
                        ino: d.ino,
                        nlink_delta: 0,
                        time_ns: now,
                    });
                    b.push(Op::ExpectEmpty(d.ino), OnFail::Errno(libc::ENOTEMPTY));
                    b.guard(Op::DeleteDentry {
                        parent: new_parent,
                        name: new_name.to_vec(),
                        ino: d.ino,
                    });
                    b.guard(Op::DeleteInode(d.ino));
                }
                Some(d) => {
                    dropped = Some((
                        d.ino,
                        self.drop_link(&mut b, new_parent, new_name, d.ino, now),
                    ));
                }
                None => {}
            }
            b.guard(Op::MoveDentry {
                parent,
                name: name.to_vec(),
                ino: s.ino,
                new_parent,
                new_name: new_name.to_vec(),
            });
            b.guard(Op::SetAttrs {
                ino: s.ino,
                set: AttrUpdate {
                    ctime_ns: Some(now),
                    ..Default::default()
                },
            });
            // The old name must leave the bucket, the new one appear (whole subtrees for
            // directories); a replaced object is overwritten at the new path.
            b.guard(self.mark(parent, name, src_dir));
            b.guard(self.mark(new_parent, new_name, src_dir || d.is_some()));
            b.refresh(parent);
            if new_parent != parent {
                b.refresh(new_parent);
            }
            let replaced_dir = d.filter(is_dir).map(|d| d.ino);
            Ok(Plan::Apply(
                b,
                Box::new(move |out| {
                    if let Some(d) = &d {
                        self.ring.deleted(new_parent, new_name, d.ino, is_dir(d));
                    }
                    self.ring
                        .renamed(parent, name, s.ino, src_dir, new_parent, new_name);
                    self.hints.forget_entry(parent, name);
                    self.hints.note_entry(new_parent, new_name, s.ino);
                    if let Some(ino) = replaced_dir {
                        self.hints.forget_inode(ino);
                    }
                    if let Some((x, (purge, get))) = dropped {
                        self.after_drop(x, out, purge, get);
                    }
                    Ok(())
                }),
            ))
        })
    }

    /// `link`: a new name for a non-directory. Errors: `EPERM` (directory), `EEXIST`,
    /// `ENOENT` (the inode has no name left), `ENOTDIR`, `EMLINK` (more than
    /// [`LINK_MAX`] links).
    pub fn link(&self, _ctx: &Ctx, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr> {
        check_name(new_name)?;
        self.ensure_listed(new_parent, false)?;
        let row = self.change(|f| {
            self.dir_facts(f, new_parent)?;
            // The link count decides EMLINK/ENOENT: always read.
            let r = f.row(ino)?.ok_or(VfsError::Stale)?;
            if r.kind == Kind::Dir {
                return Err(VfsError::NotPermitted);
            }
            if r.nlink == 0 {
                return Err(VfsError::NotFound);
            }
            if r.nlink >= LINK_MAX {
                return Err(VfsError::TooManyLinks);
            }
            let now = now_ns();
            let mut b = Batch::new(self);
            b.guard(Op::TouchDir {
                ino: new_parent,
                nlink_delta: 0,
                time_ns: now,
            });
            b.push(
                Op::AddNlink {
                    ino,
                    delta: 1,
                    ctime_ns: now,
                },
                OnFail::Errno(libc::ENOENT),
            );
            b.push(
                Op::InsertDentry {
                    parent: new_parent,
                    name: new_name.to_vec(),
                    ino,
                },
                OnFail::Errno(libc::EEXIST),
            );
            b.guard(self.mark(new_parent, new_name, false));
            b.refresh(new_parent);
            let get = b.guard(Op::GetInode(ino));
            Ok(Plan::Apply(
                b,
                Box::new(move |out| out[get].row().cloned().ok_or(VfsError::NotFound)),
            ))
        })?;
        self.ring.created(new_parent, new_name, ino, false);
        self.hints.note_entry(new_parent, new_name, ino);
        self.refs.looked_up(ino);
        Ok(self.overlay(&row))
    }
}

/// Adds the `TouchDir` of each directory (merged, in inode order).
fn push_dirs(b: &mut Batch, dirs: Vec<(Ino, i64)>, now: i64) {
    let mut merged: std::collections::BTreeMap<Ino, i64> = std::collections::BTreeMap::new();
    for (ino, d) in dirs {
        *merged.entry(ino).or_default() += d;
    }
    for (ino, nlink_delta) in merged {
        b.guard(Op::TouchDir {
            ino,
            nlink_delta,
            time_ns: now,
        });
    }
}

impl Vfs {
    /// `opendir`: lists the directory from the bucket when it was never listed or its
    /// listing is older than the TTL. Errors: `ESTALE`/`ENOENT`, `ENOTDIR`.
    pub fn opendir(&self, ino: Ino) -> Result<u64> {
        self.opendir_cached(ino).map(|(fh, _)| fh)
    }

    /// [`Vfs::opendir`], also telling whether the kernel's cached listing still holds
    /// (`FOPEN_KEEP_CACHE`): one round trip unless the listing from the bucket is
    /// due, none when this mount's own last change of the directory is recent. Errors:
    /// as [`Vfs::opendir`].
    pub fn opendir_cached(&self, ino: Ino) -> Result<(u64, bool)> {
        // The directory's row as this mount's own last change of it read it back (SQLite
        // opens a database's directory to fsync it after each journal it creates): no
        // round trip, as for `getattr`.
        let mut row = match self.hints.fresh(ino, self.fresh_for()) {
            Some(r) => r,
            None => self.current(ino)?,
        };
        if row.kind != Kind::Dir {
            return Err(VfsError::NotDir);
        }
        if self.listing_due(&row, true) {
            self.ensure_listed(ino, true)?;
            row = self.current(ino)?;
        }
        let fh = self.new_dir_handle(ino)?;
        Ok((fh, self.dir_cache_holds(&row)))
    }

    fn new_dir_handle(&self, ino: Ino) -> Result<u64> {
        let fh = self
            .next_fh
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let h = Arc::new(Handle::new(
            ino,
            true,
            false,
            false,
            true,
            OpenRecord::Closed,
        ));
        self.handles.lock().map_err(|_| poisoned())?.insert(fh, h);
        Ok(fh)
    }

    /// Whether the kernel's cached listing of directory `row` (FUSE `FOPEN_CACHE_DIR`)
    /// still holds: it does when this mount is alone and the directory's mtime, ctime and
    /// last bucket listing are what they were at the previous `opendir` that cached it.
    /// `row` is read after any re-listing from the bucket.
    fn dir_cache_holds(&self, row: &InodeRow) -> bool {
        use std::hash::{Hash, Hasher};
        let ino = row.ino;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (row.mtime_ns, row.ctime_ns, row.listed_ns, row.nlink).hash(&mut h);
        let current = self.kernel_pages.opened(ino, h.finish());
        current && !self.shared()
    }

    /// `readdir`/`readdirplus`: entries after `offset` (0 = from the start), `.` and `..`
    /// first. Offsets are entry cookies that stay valid while other entries are added or
    /// removed, so a listing under concurrent change neither repeats nor skips survivors.
    pub fn readdir(&self, ino: Ino, _fh: u64, offset: u64, plus: bool) -> Result<Vec<DirEntry>> {
        // `.` and `..` (and the check that `ino` is a directory) come with the first page;
        // later pages read entries only (one round trip; `opendir` checked the type).
        let (dots, rows) = deskfs_meta::read(&*self.meta, |t| {
            let dots = if offset < 2 {
                Some((get_dir(t, ino)?, self.parent_of(t, ino)?))
            } else {
                None
            };
            let after = offset.saturating_sub(2);
            let rows = t.list_dir(ino, after, READDIR_BATCH)?;
            Ok::<_, VfsError>((dots, rows))
        })?;
        let mut out = Vec::with_capacity(rows.len() + 2);
        if let Some((me, _)) = &dots {
            // A listing is an access of the directory (ext4 `relatime`; see `atime`).
            // (The kernel drops its cached atime after a readdir itself.)
            self.accessed(ino, me.atime_ns, me.mtime_ns, me.ctime_ns, now_ns());
        }
        if let Some((me, parent)) = dots {
            if offset < 1 {
                out.push(DirEntry {
                    ino,
                    offset: 1,
                    kind: Kind::Dir,
                    name: b".".to_vec(),
                    // With the access time this listing queued.
                    attr: plus.then(|| self.overlay(&me)),
                });
            }
            out.push(DirEntry {
                ino: parent,
                offset: 2,
                kind: Kind::Dir,
                name: b"..".to_vec(),
                attr: None,
            });
        }
        for (d, r) in rows {
            self.hints.note_row(&r);
            self.hints.note_entry(ino, &d.name, d.ino);
            if plus {
                // Each readdirplus entry hands the kernel a reference (the adapter gives
                // back those it could not send).
                self.refs.looked_up(d.ino);
            }
            out.push(DirEntry {
                ino: d.ino,
                offset: d.cookie + 2,
                kind: r.kind,
                name: d.name,
                attr: plus.then(|| self.overlay(&r)),
            });
        }
        Ok(out)
    }

    /// `releasedir`.
    pub fn releasedir(&self, _ino: Ino, fh: u64) -> Result<()> {
        self.handles.lock().map_err(|_| poisoned())?.remove(&fh);
        Ok(())
    }

    /// `fsyncdir`: makes every committed namespace change durable; under bucket
    /// durability also waits until the changes under the directory that were pending are
    /// in the bucket (`EIO` past the bound; see [`crate::durability`]).
    pub fn fsyncdir(&self, ino: Ino) -> Result<()> {
        self.meta.make_durable()?;
        self.await_dir_durable(ino)?;
        self.namespace_durable()
    }

    /// `statfs`: a 1 PiB volume minus the bytes in use; inodes likewise.
    pub fn statfs(&self) -> Result<StatFs> {
        let u = self.meta.usage()?;
        let bsize = 4096u64;
        let blocks = (1u64 << 50) / bsize;
        let used = u.bytes.div_ceil(bsize).min(blocks);
        let files = 1u64 << 40;
        Ok(StatFs {
            blocks,
            bfree: blocks - used,
            bavail: blocks - used,
            files,
            ffree: files.saturating_sub(u.inodes),
            bsize: bsize as u32,
            namelen: NAME_MAX as u32,
            frsize: bsize as u32,
        })
    }

    fn check_xattr_name(name: &[u8]) -> Result<()> {
        if name.is_empty() {
            return Err(VfsError::Invalid);
        }
        if name.len() > 255 {
            return Err(VfsError::Range);
        }
        let ok = [b"user.".as_slice(), b"trusted.", b"security."]
            .iter()
            .any(|p| name.starts_with(p) && name.len() > p.len());
        if !ok {
            return Err(VfsError::NotSupported);
        }
        Ok(())
    }

    /// `setxattr` (`XATTR_CREATE`/`XATTR_REPLACE` honoured). Namespaces `user.`,
    /// `trusted.`, `security.`. Errors: `EEXIST`, `ENODATA`, `E2BIG` (> 64 KiB), `ERANGE`
    /// (name > 255), `EOPNOTSUPP` (other namespaces, incl. `system.` ACLs).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        Self::check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(VfsError::TooBig);
        }
        let mode = if flags & xattr_flags::CREATE != 0 {
            XattrMode::Create
        } else if flags & xattr_flags::REPLACE != 0 {
            XattrMode::Replace
        } else {
            XattrMode::Any
        };
        self.change(|f| {
            if f.fresh() {
                f.row(ino)?.ok_or(VfsError::Stale)?;
            }
            let mut b = Batch::new(self);
            b.guard(Op::SetAttrs {
                ino,
                set: AttrUpdate {
                    ctime_ns: Some(now_ns()),
                    ..Default::default()
                },
            });
            let errno = if mode == XattrMode::Create {
                libc::EEXIST
            } else {
                libc::ENODATA
            };
            b.push(
                Op::SetXattr {
                    ino,
                    name: name.to_vec(),
                    value: value.to_vec(),
                    mode,
                },
                OnFail::Errno(errno),
            );
            Ok(Plan::Apply(b, Box::new(|_| Ok(()))))
        })
    }

    /// `getxattr`: the whole value (the adapter applies the size protocol).
    /// Errors: `ENODATA`, `ENOENT`, `EOPNOTSUPP` (other namespaces; `security.selinux`
    /// when the inode has no such attribute).
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        Self::check_xattr_name(name)?;
        // A file this mount just created has none: the kernel's `security.capability`
        // question before the first write costs no round trip.
        let r = if self.hints.no_xattrs(ino, self.fresh_for()) {
            Err(VfsError::NoAttr)
        } else {
            // Alone, a file with none at all is remembered as such (for `FRESH_ALONE`):
            // the kernel asks for `security.capability` before the first write after
            // the inode's attributes were refreshed, once per transaction of a
            // database. Shared, the hint would last 100 ms: not worth the extra look.
            let learn = !self.shared();
            let stamp = self.hints.xattr_stamp();
            let got = deskfs_meta::read(&*self.meta, |t| {
                Ok::<_, VfsError>(match t.look_xattr(ino, name)? {
                    XattrLook::NoInode => return Err(VfsError::Stale),
                    XattrLook::Value(v) => Some(v),
                    XattrLook::Missing { any: false } if learn => None,
                    XattrLook::Missing { .. } => return Err(VfsError::NoAttr),
                })
            });
            match got {
                Ok(Some(v)) => Ok(v),
                Ok(None) => {
                    #[cfg(test)]
                    if let Some(race) = tests::BEFORE_XATTR_NOTE.with(|r| r.borrow_mut().take()) {
                        race();
                    }
                    self.hints.note_no_xattrs(ino, &stamp);
                    Err(VfsError::NoAttr)
                }
                Err(e) => Err(e),
            }
        };
        match r {
            // No SELinux label: "labels not supported here" rather than "no label".
            // `ls -l` (coreutils through libselinux) asks every entry for its label and
            // stops asking on a device once the answer is EOPNOTSUPP, so a listing costs
            // one request instead of one per entry (FUSE cannot cache xattrs). Under
            // SELinux the kernel answers this name itself (the mount is labelled by
            // policy); a label stored here (tar/rsync restores) is still returned.
            Err(VfsError::NoAttr) if name == SELINUX_XATTR => Err(VfsError::NotSupported),
            r => r,
        }
    }

    /// `listxattr`: names, each NUL-terminated, concatenated.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>> {
        if self.hints.no_xattrs(ino, self.fresh_for()) {
            return Ok(Vec::new());
        }
        let stamp = self.hints.xattr_stamp();
        let names = deskfs_meta::read(&*self.meta, |t| {
            t.get_inode(ino)?.ok_or(VfsError::Stale)?;
            Ok::<_, VfsError>(t.list_xattrs(ino)?)
        })?;
        if names.is_empty() && !self.shared() {
            self.hints.note_no_xattrs(ino, &stamp);
        }
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    /// `removexattr`. Errors: `ENODATA`, `ESTALE`.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        Self::check_xattr_name(name)?;
        self.change(|f| {
            if f.fresh() {
                f.row(ino)?.ok_or(VfsError::Stale)?;
            }
            let mut b = Batch::new(self);
            b.guard(Op::SetAttrs {
                ino,
                set: AttrUpdate {
                    ctime_ns: Some(now_ns()),
                    ..Default::default()
                },
            });
            b.push(
                Op::RemoveXattr {
                    ino,
                    name: name.to_vec(),
                },
                OnFail::Errno(libc::ENODATA),
            );
            Ok(Plan::Apply(b, Box::new(|_| Ok(()))))
        })
    }

    /// `access(2)` check against the mode bits (root passes read/write, and execute when
    /// any execute bit is set). Errors: `EACCES`, `ENOENT`.
    pub fn access(&self, ctx: &Ctx, ino: Ino, mask: i32) -> Result<()> {
        let r = self.current(ino)?;
        let mask = mask as u32 & 7;
        if mask == 0 {
            return Ok(());
        }
        if ctx.uid == 0 {
            if mask & 1 != 0 && r.kind != Kind::Dir && r.perm & 0o111 == 0 {
                return Err(VfsError::Access);
            }
            return Ok(());
        }
        let bits = if ctx.uid == r.uid {
            (r.perm >> 6) & 7
        } else if ctx.gid == r.gid {
            (r.perm >> 3) & 7
        } else {
            r.perm & 7
        };
        if bits & mask == mask {
            Ok(())
        } else {
            Err(VfsError::Access)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;

    thread_local! {
        /// Run once by the next `getattr` on this thread that reads the row, between that
        /// read and the overlay of the inode's state: a commit landing there.
        pub(crate) static BEFORE_OVERLAY: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run once by the next `getxattr` on this thread that read no xattr at all,
        /// between that read and noting it: a change landing there.
        pub(crate) static BEFORE_XATTR_NOTE: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}
