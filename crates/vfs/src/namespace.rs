//! Namespace operations: POSIX rules for lookup, create, unlink, rename, link, readdir,
//! attributes and xattrs — written once here, on top of the metadata engine's
//! transactions. Each namespace change is one transaction that also marks the affected
//! workspace paths pending for the uploader.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use deskfs_meta::{Ino, InodeRow, Kind, Local, MetaTxn, ROOT_INO};

use crate::handles::Handle;
use crate::paths::{dir_path, join};
use crate::types::{rename_flags, xattr_flags, Attr, Ctx, DirEntry, SetAttr, SetTime, StatFs};
use crate::{attr_of, now_ns, poisoned, Result, Vfs, VfsError};

/// Longest name, bytes (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Longest xattr value, bytes (Linux `XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Most hard links of one inode (`LINK_MAX`; ext4's `EXT4_LINK_MAX`).
pub const LINK_MAX: u32 = 65000;
/// Directory entries returned per readdir call.
const READDIR_BATCH: usize = 128;

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

pub(crate) fn get(t: &mut dyn MetaTxn, ino: Ino) -> Result<InodeRow> {
    t.get_inode(ino)?.ok_or(VfsError::NotFound)
}

fn get_dir(t: &mut dyn MetaTxn, ino: Ino) -> Result<InodeRow> {
    let r = get(t, ino)?;
    if r.kind != Kind::Dir {
        return Err(VfsError::NotDir);
    }
    Ok(r)
}

/// Applies link-count deltas and mtime/ctime = `now` to directories, merging repeats.
fn touch_dirs(t: &mut dyn MetaTxn, dirs: &[(Ino, i64)], now: i64) -> Result<()> {
    let mut merged: BTreeMap<Ino, i64> = BTreeMap::new();
    for (ino, d) in dirs {
        *merged.entry(*ino).or_default() += d;
    }
    for (ino, delta) in merged {
        let mut r = get(t, ino)?;
        r.nlink = (r.nlink as i64 + delta).max(0) as u32;
        r.mtime_ns = now;
        r.ctime_ns = now;
        t.update_inode(&r)?;
    }
    Ok(())
}

impl Vfs {
    /// Records that a request is being served now (the uploader waits for a quiet
    /// moment, see `uploader::BURST_DEFER`). One relaxed atomic store.
    pub fn note_activity(&self) {
        self.last_mark_ns
            .store(now_ns(), std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn not_before(&self) -> i64 {
        let now = now_ns();
        self.last_mark_ns
            .store(now, std::sync::atomic::Ordering::Relaxed);
        now + self.cfg.upload_delay.as_nanos() as i64
    }

    /// Marks `parent/name` pending for the uploader (no-op if `parent` is unreachable).
    pub(crate) fn mark_name(
        &self,
        t: &mut dyn MetaTxn,
        parent: Ino,
        name: &[u8],
        recursive: bool,
    ) -> Result<()> {
        if let Some(dir) = dir_path(t, parent)? {
            t.mark_pending(&join(&dir, name), recursive, self.not_before())?;
        }
        Ok(())
    }

    /// Whether this mount holds in-memory state (open handles) for `ino`.
    pub(crate) fn is_open(&self, ino: Ino) -> bool {
        self.inodes
            .lock()
            .map(|m| m.contains_key(&ino))
            .unwrap_or(true)
    }

    /// Attributes with uncommitted in-memory size/mtime applied.
    pub(crate) fn overlay(&self, row: &InodeRow) -> Attr {
        let mut a = attr_of(row);
        let st = self
            .inodes
            .lock()
            .ok()
            .and_then(|m| m.get(&row.ino).cloned());
        if let Some(st) = st {
            if let Ok(s) = st.lock() {
                if s.loaded && s.uncommitted {
                    a.size = s.size;
                    a.blocks = s.size.div_ceil(512);
                    a.mtime_ns = s.mtime_ns;
                    a.ctime_ns = s.ctime_ns;
                }
            }
        }
        a
    }

    fn new_row(&self, ctx: &Ctx, parent: &InodeRow, kind: Kind, perm: u32) -> InodeRow {
        let now = now_ns();
        let mut perm = perm & 0o7777;
        let mut gid = ctx.gid;
        if parent.perm & 0o2000 != 0 {
            // BSD group semantics of a setgid directory (ext4 behaviour).
            gid = parent.gid;
            if kind == Kind::Dir {
                perm |= 0o2000;
            }
        }
        InodeRow {
            ino: 0,
            kind,
            perm,
            uid: ctx.uid,
            gid,
            rdev: 0,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            btime_ns: now,
            data_version: 0,
            target: None,
            local: Local::None,
            dirty: false,
            listed_ns: if kind == Kind::Dir { now } else { 0 },
        }
    }

    /// Creates a new inode named `parent/name` in one transaction.
    pub(crate) fn create_node(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        spec: NodeSpec<'_>,
    ) -> Result<InodeRow> {
        let NodeSpec {
            kind,
            perm,
            rdev,
            target,
            open_in,
        } = spec;
        check_name(name)?;
        self.ensure_listed(parent, false)?;
        deskfs_meta::txn(&*self.meta, |t| {
            let p = get_dir(t, parent)?;
            if p.nlink == 0 {
                return Err(VfsError::NotFound.into_meta());
            }
            if t.lookup(parent, name)?.is_some() {
                return Err(VfsError::Exists.into_meta());
            }
            if kind == Kind::Dir && p.nlink >= LINK_MAX {
                return Err(VfsError::TooManyLinks.into_meta());
            }
            let mut row = self.new_row(ctx, &p, kind, perm);
            row.rdev = rdev;
            if let Some(tg) = target {
                row.size = tg.len() as u64;
                row.target = Some(tg.to_vec());
            }
            if kind == Kind::File {
                // Empty files need no download: their (empty) content is local.
                row.local = Local::Full;
                row.dirty = true;
                row.data_version = 1;
            }
            row.ino = t.insert_inode(&row)?;
            t.insert_dentry(parent, name, row.ino)?;
            if let Some(session) = open_in {
                t.add_open(row.ino, session, 1)?;
            }
            touch_dirs(
                t,
                &[(parent, if kind == Kind::Dir { 1 } else { 0 })],
                row.ctime_ns,
            )?;
            self.mark_name(t, parent, name, false)?;
            Ok(row)
        })
        .map_err(VfsError::from_meta)
        .and_then(|row| {
            if row.kind == Kind::File {
                // The staging file exists from birth: the empty content is local.
                self.cache.open_staging(row.ino, true)?;
            }
            Ok(row)
        })
    }

    /// `lookup`: the attributes of `parent/name`. Errors: `ENOENT`, `ENOTDIR`,
    /// `ENAMETOOLONG`. Lists the directory from the bucket first if it was never listed.
    pub fn lookup(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(VfsError::NameTooLong);
        }
        self.ensure_listed(parent, false)?;
        let row = deskfs_meta::read(&*self.meta, |t| {
            let p = get_dir(t, parent).map_err(VfsError::into_meta)?;
            let ino = if name == b"." {
                p.ino
            } else if name == b".." {
                self.parent_of(t, p.ino)?
            } else {
                match t.lookup(parent, name)? {
                    Some(d) => d.ino,
                    None => return Err(VfsError::NotFound.into_meta()),
                }
            };
            get(t, ino).map_err(VfsError::into_meta)
        })
        .map_err(VfsError::from_meta)?;
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

    /// Kernel `forget`: nothing is pinned by lookups in deskfs, so this is a no-op.
    pub fn forget(&self, _ino: Ino, _nlookup: u64) {}

    /// `getattr`. Errors: `ENOENT`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let row =
            deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.ok_or(VfsError::NotFound)?;
        Ok(self.overlay(&row))
    }

    /// `setattr`: chmod, chown, truncate (both ways), utimensat (ns, `UTIME_NOW`,
    /// `UTIME_OMIT` = `None`). Permission checks are the kernel's (`default_permissions`).
    /// Errors: `ENOENT`, `EISDIR` (truncate of a directory), `EINVAL`.
    pub fn setattr(&self, ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        if let Some(size) = set.size {
            // Truncation by an unprivileged caller drops setuid/setgid (killpriv v2: the
            // kernel leaves it to us; root stands for CAP_FSETID).
            if ctx.uid != 0 {
                self.kill_privs(ctx, ino)?;
            }
            self.truncate(ino, size)?;
        }
        let now = now_ns();
        let needs_meta = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some();
        if needs_meta {
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
            let row = deskfs_meta::txn(&*self.meta, |t| {
                let mut r = get(t, ino).map_err(VfsError::into_meta)?;
                if let Some(mode) = set.mode {
                    r.perm = mode & 0o7777;
                }
                if set.uid.is_some() || set.gid.is_some() {
                    let changes_owner =
                        set.uid.is_some_and(|u| u != r.uid) || set.gid.is_some_and(|g| g != r.gid);
                    if let Some(u) = set.uid {
                        r.uid = u;
                    }
                    if let Some(g) = set.gid {
                        r.gid = g;
                    }
                    // chown clears setuid, and setgid when group-executable (Linux).
                    if changes_owner && r.kind != Kind::Dir && set.mode.is_none() {
                        r.perm &= !0o4000;
                        if r.perm & 0o010 != 0 {
                            r.perm &= !0o2000;
                        }
                    }
                }
                if let Some(a) = set.atime {
                    r.atime_ns = t_of(a);
                }
                if let Some(m) = set.mtime {
                    r.mtime_ns = t_of(m);
                }
                r.ctime_ns = now;
                t.update_inode(&r)?;
                for (parent, name) in t.names_of(ino)? {
                    self.mark_name(t, parent, &name, false)?;
                }
                Ok(r)
            })?;
            self.with_state(ino, |st| {
                if st.loaded {
                    st.ctime_ns = now;
                }
            })?;
            return Ok(self.overlay(&row));
        }
        self.getattr(ino)
    }

    /// Drops the privileges a write or truncate by an unprivileged caller must drop
    /// (Linux `file_remove_privs` / `setattr_should_drop_sgid`, which FUSE leaves to the
    /// file system under `FUSE_HANDLE_KILLPRIV_V2`): setuid; setgid when the file is
    /// group-executable or the caller is not in its group (judged by the caller's primary
    /// gid: FUSE does not pass supplementary groups); the `security.capability` xattr.
    /// ctime changes, and the kernel's cached attributes are dropped, only when something
    /// was dropped. Errors: `ENOENT`.
    pub fn kill_privs(&self, ctx: &Ctx, ino: Ino) -> Result<()> {
        const CAPS: &[u8] = b"security.capability";
        let kill = |perm: u32, gid: u32| {
            let mut p = perm & !0o4000;
            if p & 0o010 != 0 || (ctx.gid != gid && ctx.uid != 0) {
                p &= !0o2000;
            }
            p
        };
        let (row, has_caps) = deskfs_meta::read(&*self.meta, |t| {
            Ok((t.get_inode(ino)?, t.get_xattr(ino, CAPS)?.is_some()))
        })?;
        let row = row.ok_or(VfsError::NotFound)?;
        if row.kind != Kind::File || (kill(row.perm, row.gid) == row.perm && !has_caps) {
            return Ok(());
        }
        let now = now_ns();
        deskfs_meta::txn(&*self.meta, |t| {
            let mut r = get(t, ino).map_err(VfsError::into_meta)?;
            r.perm = kill(r.perm, r.gid);
            r.ctime_ns = now;
            t.update_inode(&r)?;
            t.remove_xattr(ino, CAPS)?;
            for (parent, name) in t.names_of(ino)? {
                self.mark_name(t, parent, &name, false)?;
            }
            Ok(())
        })?;
        self.with_state(ino, |st| {
            if st.loaded {
                st.ctime_ns = now;
            }
        })?;
        self.invalidate_now(&crate::Invalidation::Attrs(ino));
        Ok(())
    }

    /// `readlink`. Errors: `ENOENT`, `EINVAL` (not a symlink).
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let row =
            deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.ok_or(VfsError::NotFound)?;
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
        let row = self.create_node(
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

    /// `mkdir`. Errors: `EEXIST`, `ENOENT`, `ENOTDIR`, `ENAMETOOLONG`.
    pub fn mkdir(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr> {
        let row = self.create_node(
            ctx,
            parent,
            name,
            NodeSpec::new(Kind::Dir, mode & !umask & 0o7777),
        )?;
        Ok(attr_of(&row))
    }

    /// `symlink`. Errors: `EEXIST`, `ENOENT`, `ENOTDIR`, `ENAMETOOLONG` (target > 4095).
    pub fn symlink(&self, ctx: &Ctx, parent: Ino, name: &[u8], target: &[u8]) -> Result<Attr> {
        if target.len() >= 4096 {
            return Err(VfsError::NameTooLong);
        }
        let row = self.create_node(
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

    /// Drops an inode's local data after its last name and handle went away.
    pub(crate) fn purge_local(&self, ino: Ino) {
        // Its staging file can serve a new file, unless another mount (which may share
        // this cache dir and upload from it) is live.
        let res = if self.shared() {
            self.cache.remove_staging(ino)
        } else {
            self.cache.recycle_staging(ino)
        };
        if let Err(e) = res {
            tracing::warn!(ino, error = %e, "cannot remove staging file");
        }
        self.cache.drop_blocks(ino);
    }

    /// Removes one name of a non-directory inside a transaction; returns the inode when it
    /// must be purged (last link gone and not open).
    fn drop_link(
        &self,
        t: &mut dyn MetaTxn,
        parent: Ino,
        name: &[u8],
        now: i64,
    ) -> deskfs_meta::Result<Option<Ino>> {
        let d = t
            .lookup(parent, name)?
            .ok_or_else(|| VfsError::NotFound.into_meta())?;
        let mut r = t
            .get_inode(d.ino)?
            .ok_or_else(|| VfsError::NotFound.into_meta())?;
        t.delete_dentry(parent, name)?;
        r.nlink = r.nlink.saturating_sub(1);
        r.ctime_ns = now;
        if r.nlink == 0 && !self.is_open(r.ino) && !t.open_elsewhere(r.ino, 0)? {
            t.delete_inode(r.ino)?;
            return Ok(Some(r.ino));
        }
        t.update_inode(&r)?;
        Ok(None)
    }

    /// `unlink`. An open file stays readable and writable through its handles until the
    /// last close. Errors: `ENOENT`, `EISDIR`, `ENOTDIR`.
    pub fn unlink(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.ensure_listed(parent, false)?;
        let now = now_ns();
        let purged = deskfs_meta::txn(&*self.meta, |t| {
            get_dir(t, parent).map_err(VfsError::into_meta)?;
            let d = t
                .lookup(parent, name)?
                .ok_or_else(|| VfsError::NotFound.into_meta())?;
            let r = get(t, d.ino).map_err(VfsError::into_meta)?;
            if r.kind == Kind::Dir {
                return Err(VfsError::IsDir.into_meta());
            }
            let purged = self.drop_link(t, parent, name, now)?;
            touch_dirs(t, &[(parent, 0)], now)?;
            self.mark_name(t, parent, name, false)?;
            Ok(purged)
        })
        .map_err(VfsError::from_meta)?;
        if let Some(ino) = purged {
            self.purge_local(ino);
        }
        Ok(())
    }

    /// `rmdir`. Errors: `ENOENT`, `ENOTDIR`, `ENOTEMPTY`, `EBUSY` never (no mount points).
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
        let child = deskfs_meta::read(&*self.meta, |t| t.lookup(parent, name))?;
        if let Some(d) = &child {
            self.ensure_listed(d.ino, false)?;
        }
        let now = now_ns();
        deskfs_meta::txn(&*self.meta, |t| {
            get_dir(t, parent).map_err(VfsError::into_meta)?;
            let d = t
                .lookup(parent, name)?
                .ok_or_else(|| VfsError::NotFound.into_meta())?;
            let r = get(t, d.ino).map_err(VfsError::into_meta)?;
            if r.kind != Kind::Dir {
                return Err(VfsError::NotDir.into_meta());
            }
            if t.has_children(r.ino)? {
                return Err(VfsError::NotEmpty.into_meta());
            }
            t.delete_dentry(parent, name)?;
            t.delete_inode(r.ino)?;
            touch_dirs(t, &[(parent, -1)], now)?;
            self.mark_name(t, parent, name, true)?;
            Ok(())
        })
        .map_err(VfsError::from_meta)
    }

    /// Whether directory `anc` is `ino` or one of its ancestors.
    fn is_ancestor(
        &self,
        t: &mut dyn MetaTxn,
        anc: Ino,
        mut ino: Ino,
    ) -> deskfs_meta::Result<bool> {
        let mut guard = 0;
        loop {
            if ino == anc {
                return Ok(true);
            }
            if ino == ROOT_INO || guard > 4096 {
                return Ok(false);
            }
            ino = self.parent_of(t, ino)?;
            guard += 1;
        }
    }

    /// `rename`/`renameat2`: atomic replace of a file or an empty directory,
    /// `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, directories anywhere except into
    /// themselves. One transaction; the bucket follows in the background (copy + delete).
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
        // its bucket-only children along, a replaced one must really be empty.
        let (src, dst) = deskfs_meta::read(&*self.meta, |t| {
            Ok((t.lookup(parent, name)?, t.lookup(new_parent, new_name)?))
        })?;
        if let Some(d) = &src {
            self.ensure_subtree_listed(d.ino)?;
        }
        if let Some(d) = &dst {
            self.ensure_listed(d.ino, false)?;
            if exchange {
                self.ensure_subtree_listed(d.ino)?;
            }
        }
        let now = now_ns();
        let purged = deskfs_meta::txn(&*self.meta, |t| {
            get_dir(t, parent).map_err(VfsError::into_meta)?;
            get_dir(t, new_parent).map_err(VfsError::into_meta)?;
            let src = t
                .lookup(parent, name)?
                .ok_or_else(|| VfsError::NotFound.into_meta())?;
            let mut srow = get(t, src.ino).map_err(VfsError::into_meta)?;
            let dst = t.lookup(new_parent, new_name)?;
            if exchange && dst.is_none() {
                return Err(VfsError::NotFound.into_meta());
            }
            if noreplace && dst.is_some() {
                return Err(VfsError::Exists.into_meta());
            }
            if let Some(d) = &dst {
                if d.ino == src.ino {
                    // Same inode (same entry or two hard links): POSIX says do nothing.
                    return Ok(None);
                }
            }
            let src_dir = srow.kind == Kind::Dir;
            if src_dir && self.is_ancestor(t, srow.ino, new_parent)? {
                return Err(VfsError::Invalid.into_meta());
            }
            if exchange {
                let d = dst.as_ref().ok_or_else(|| VfsError::NotFound.into_meta())?;
                let mut drow = get(t, d.ino).map_err(VfsError::into_meta)?;
                let dst_dir = drow.kind == Kind::Dir;
                if dst_dir && self.is_ancestor(t, drow.ino, parent)? {
                    return Err(VfsError::Invalid.into_meta());
                }
                t.repoint_dentry(parent, name, drow.ino)?;
                t.repoint_dentry(new_parent, new_name, srow.ino)?;
                let mut deltas = vec![(parent, 0i64), (new_parent, 0i64)];
                if parent != new_parent {
                    if src_dir {
                        deltas.push((parent, -1));
                        deltas.push((new_parent, 1));
                    }
                    if dst_dir {
                        deltas.push((new_parent, -1));
                        deltas.push((parent, 1));
                    }
                }
                srow.ctime_ns = now;
                drow.ctime_ns = now;
                t.update_inode(&srow)?;
                t.update_inode(&drow)?;
                touch_dirs(t, &deltas, now)?;
                self.mark_name(t, parent, name, true)?;
                self.mark_name(t, new_parent, new_name, true)?;
                return Ok(None);
            }
            let mut deltas = vec![(parent, 0i64), (new_parent, 0i64)];
            let mut purged = None;
            if let Some(d) = &dst {
                let drow = get(t, d.ino).map_err(VfsError::into_meta)?;
                if src_dir {
                    if drow.kind != Kind::Dir {
                        return Err(VfsError::NotDir.into_meta());
                    }
                    if t.has_children(drow.ino)? {
                        return Err(VfsError::NotEmpty.into_meta());
                    }
                    t.delete_dentry(new_parent, new_name)?;
                    t.delete_inode(drow.ino)?;
                    deltas.push((new_parent, -1));
                } else {
                    if drow.kind == Kind::Dir {
                        return Err(VfsError::IsDir.into_meta());
                    }
                    purged = self.drop_link(t, new_parent, new_name, now)?;
                }
            }
            t.move_dentry(parent, name, new_parent, new_name)?;
            if src_dir && parent != new_parent {
                deltas.push((parent, -1));
                deltas.push((new_parent, 1));
            }
            srow.ctime_ns = now;
            t.update_inode(&srow)?;
            touch_dirs(t, &deltas, now)?;
            // The old name must leave the bucket, the new one appear (whole subtrees for
            // directories); a replaced object is overwritten at the new path.
            self.mark_name(t, parent, name, src_dir)?;
            self.mark_name(t, new_parent, new_name, src_dir || dst.is_some())?;
            Ok(purged)
        })
        .map_err(VfsError::from_meta)?;
        if let Some(ino) = purged {
            self.purge_local(ino);
        }
        Ok(())
    }

    /// `link`: a new name for a non-directory. Errors: `EPERM` (directory), `EEXIST`,
    /// `ENOENT`, `ENOTDIR`, `EMLINK` (more than [`LINK_MAX`] links).
    pub fn link(&self, _ctx: &Ctx, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr> {
        check_name(new_name)?;
        self.ensure_listed(new_parent, false)?;
        let now = now_ns();
        let row = deskfs_meta::txn(&*self.meta, |t| {
            get_dir(t, new_parent).map_err(VfsError::into_meta)?;
            let mut r = get(t, ino).map_err(VfsError::into_meta)?;
            if r.kind == Kind::Dir {
                return Err(VfsError::NotPermitted.into_meta());
            }
            if r.nlink == 0 {
                return Err(VfsError::NotFound.into_meta());
            }
            if t.lookup(new_parent, new_name)?.is_some() {
                return Err(VfsError::Exists.into_meta());
            }
            if r.nlink >= LINK_MAX {
                return Err(VfsError::TooManyLinks.into_meta());
            }
            t.insert_dentry(new_parent, new_name, ino)?;
            r.nlink += 1;
            r.ctime_ns = now;
            t.update_inode(&r)?;
            touch_dirs(t, &[(new_parent, 0)], now)?;
            self.mark_name(t, new_parent, new_name, false)?;
            Ok(r)
        })
        .map_err(VfsError::from_meta)?;
        Ok(self.overlay(&row))
    }

    /// `opendir`: lists the directory from the bucket when it was never listed or its
    /// listing is older than the TTL. Errors: `ENOENT`, `ENOTDIR`.
    pub fn opendir(&self, ino: Ino) -> Result<u64> {
        let row =
            deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.ok_or(VfsError::NotFound)?;
        if row.kind != Kind::Dir {
            return Err(VfsError::NotDir);
        }
        self.ensure_listed(ino, true)?;
        let fh = self
            .next_fh
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let h = Arc::new(Handle {
            ino,
            write: false,
            read: true,
            append: false,
            dir: true,
            last_read_end: AtomicU64::new(0),
            ra_blocks: AtomicU64::new(0),
            lock_owners: Default::default(),
            recorded: std::sync::atomic::AtomicU8::new(crate::handles::OPEN_CLOSED),
        });
        self.handles.lock().map_err(|_| poisoned())?.insert(fh, h);
        Ok(fh)
    }

    /// Whether the kernel's cached listing of directory `ino` (FUSE `FOPEN_CACHE_DIR`)
    /// still holds: it does when this mount is alone and the directory's mtime, ctime and
    /// last bucket listing are what they were at the previous `opendir` that cached it.
    /// Call after [`Vfs::opendir`] (which may re-list the bucket).
    pub fn dir_cache_current(&self, ino: Ino) -> bool {
        use std::hash::{Hash, Hasher};
        let Ok(Some(row)) = deskfs_meta::read(&*self.meta, |t| t.get_inode(ino)) else {
            return false;
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (row.mtime_ns, row.ctime_ns, row.listed_ns, row.nlink).hash(&mut h);
        let current = self.kernel_pages.opened(ino, h.finish());
        current && !self.shared()
    }

    /// `readdir`/`readdirplus`: entries after `offset` (0 = from the start), `.` and `..`
    /// first. Offsets are entry cookies that stay valid while other entries are added or
    /// removed, so a listing under concurrent change neither repeats nor skips survivors.
    pub fn readdir(&self, ino: Ino, _fh: u64, offset: u64, plus: bool) -> Result<Vec<DirEntry>> {
        let (me, parent, rows) = deskfs_meta::read(&*self.meta, |t| {
            let me = get_dir(t, ino).map_err(VfsError::into_meta)?;
            let parent = self.parent_of(t, ino)?;
            let after = offset.saturating_sub(2);
            let rows = t.list_dir(ino, after, READDIR_BATCH)?;
            Ok((me, parent, rows))
        })
        .map_err(VfsError::from_meta)?;
        let mut out = Vec::with_capacity(rows.len() + 2);
        if offset < 1 {
            out.push(DirEntry {
                ino,
                offset: 1,
                kind: Kind::Dir,
                name: b".".to_vec(),
                attr: plus.then(|| attr_of(&me)),
            });
        }
        if offset < 2 {
            out.push(DirEntry {
                ino: parent,
                offset: 2,
                kind: Kind::Dir,
                name: b"..".to_vec(),
                attr: None,
            });
        }
        for (d, r) in rows {
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

    /// `fsyncdir`: makes every committed namespace change durable.
    pub fn fsyncdir(&self, _ino: Ino) -> Result<()> {
        self.meta.make_durable()?;
        Ok(())
    }

    /// `statfs`: a 1 PiB volume minus the bytes in use; inodes likewise.
    pub fn statfs(&self) -> Result<StatFs> {
        let u = deskfs_meta::read(&*self.meta, |t| t.usage())?;
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
        let now = now_ns();
        deskfs_meta::txn(&*self.meta, |t| {
            let mut r = get(t, ino).map_err(VfsError::into_meta)?;
            let exists = t.get_xattr(ino, name)?.is_some();
            if flags & xattr_flags::CREATE != 0 && exists {
                return Err(VfsError::Exists.into_meta());
            }
            if flags & xattr_flags::REPLACE != 0 && !exists {
                return Err(VfsError::NoAttr.into_meta());
            }
            t.set_xattr(ino, name, value)?;
            r.ctime_ns = now;
            t.update_inode(&r)
        })
        .map_err(VfsError::from_meta)
    }

    /// `getxattr`: the whole value (the adapter applies the size protocol).
    /// Errors: `ENODATA`, `ENOENT`, `EOPNOTSUPP`.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        Self::check_xattr_name(name)?;
        deskfs_meta::read(&*self.meta, |t| {
            get(t, ino).map_err(VfsError::into_meta)?;
            t.get_xattr(ino, name)?
                .ok_or_else(|| VfsError::NoAttr.into_meta())
        })
        .map_err(VfsError::from_meta)
    }

    /// `listxattr`: names, each NUL-terminated, concatenated.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>> {
        let names = deskfs_meta::read(&*self.meta, |t| {
            get(t, ino).map_err(VfsError::into_meta)?;
            t.list_xattrs(ino)
        })
        .map_err(VfsError::from_meta)?;
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    /// `removexattr`. Errors: `ENODATA`, `ENOENT`.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        Self::check_xattr_name(name)?;
        let now = now_ns();
        deskfs_meta::txn(&*self.meta, |t| {
            let mut r = get(t, ino).map_err(VfsError::into_meta)?;
            if !t.remove_xattr(ino, name)? {
                return Err(VfsError::NoAttr.into_meta());
            }
            r.ctime_ns = now;
            t.update_inode(&r)
        })
        .map_err(VfsError::from_meta)
    }

    /// `access(2)` check against the mode bits (root passes read/write, and execute when
    /// any execute bit is set). Errors: `EACCES`, `ENOENT`.
    pub fn access(&self, ctx: &Ctx, ino: Ino, mask: i32) -> Result<()> {
        let r = deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.ok_or(VfsError::NotFound)?;
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

impl VfsError {
    /// Carries a VFS error through a metadata transaction closure (which returns
    /// `MetaError`), to be recovered by [`VfsError::from_meta`].
    pub(crate) fn into_meta(self) -> deskfs_meta::MetaError {
        if let VfsError::Meta(e) = self {
            return e;
        }
        deskfs_meta::MetaError::Internal(format!("{}{}", VFS_TAG, self.errno()))
    }

    /// Recovers an error carried by [`VfsError::into_meta`], or wraps a real engine error.
    pub(crate) fn from_meta(e: deskfs_meta::MetaError) -> VfsError {
        if let deskfs_meta::MetaError::Internal(s) = &e {
            if let Some(n) = s.strip_prefix(VFS_TAG).and_then(|n| n.parse::<i32>().ok()) {
                return VfsError::from_errno(n);
            }
        }
        VfsError::Meta(e)
    }

    pub(crate) fn from_errno(n: i32) -> VfsError {
        match n {
            libc::ENOENT => VfsError::NotFound,
            libc::EEXIST => VfsError::Exists,
            libc::ENOTDIR => VfsError::NotDir,
            libc::EISDIR => VfsError::IsDir,
            libc::ENOTEMPTY => VfsError::NotEmpty,
            libc::EINVAL => VfsError::Invalid,
            libc::ENAMETOOLONG => VfsError::NameTooLong,
            libc::EPERM => VfsError::NotPermitted,
            libc::EACCES => VfsError::Access,
            libc::ENODATA => VfsError::NoAttr,
            libc::ERANGE => VfsError::Range,
            libc::E2BIG => VfsError::TooBig,
            libc::EOPNOTSUPP => VfsError::NotSupported,
            libc::EMLINK => VfsError::TooManyLinks,
            _ => VfsError::Io(std::io::Error::from_raw_os_error(n)),
        }
    }
}

const VFS_TAG: &str = "vfs-errno:";
