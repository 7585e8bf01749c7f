//! The inode table: every inode, directory entry, file byte and xattr, in memory. Pure
//! POSIX bookkeeping with no FUSE types, so each rule is unit-tested; errors are errnos.
//!
//! Inode numbers are never reused. An inode lives while it has a name (`nlink > 0`) or the
//! kernel holds a reference to it (`lookups > 0`: one per entry the file system handed
//! out, returned by `forget`); the root lives forever. Directory entries carry a cookie
//! (the readdir offset) that never changes while the entry exists, so a listing that runs
//! while entries come and go returns every untouched entry exactly once. Permission checks
//! are the kernel's (`default_permissions`).
//!
//! With a backing directory (passthrough mode) a regular file's bytes live in the file
//! `<dir>/<ino>` instead of RAM; its size and mtime are that file's.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::data::Data;

/// Inode number of the root directory.
pub(crate) const ROOT: u64 = 1;
/// Longest name of a directory entry, bytes.
pub(crate) const NAME_MAX: usize = 255;
/// `st_size` of a directory.
const DIR_SIZE: u64 = 4096;

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const CAPS: &[u8] = b"security.capability";
const SELINUX: &[u8] = b"security.selinux";

/// Result of a table operation: the errno on failure.
pub(crate) type Res<T> = Result<T, i32>;

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Kind {
    /// The kind of a `mknod` mode (`S_IFMT` bits); `None` for an unknown type.
    pub(crate) fn of_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            0 | libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => return None,
        })
    }
}

/// An inode's attributes (times in ns since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attr {
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    /// Permission bits with setuid/setgid/sticky (`0o7777`).
    pub(crate) perm: u32,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) rdev: u32,
    pub(crate) size: u64,
    pub(crate) atime_ns: i64,
    pub(crate) mtime_ns: i64,
    pub(crate) ctime_ns: i64,
    pub(crate) btime_ns: i64,
}

/// A time a `setattr` sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SetTime {
    Now,
    At(i64),
}

/// What a `setattr` changes (`None`: unchanged).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SetAttr {
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) size: Option<u64>,
    pub(crate) atime: Option<SetTime>,
    pub(crate) mtime: Option<SetTime>,
}

/// Who makes a request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caller {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// One entry of a listing.
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    pub(crate) ino: u64,
    /// The offset the next listing resumes after.
    pub(crate) cookie: u64,
    pub(crate) kind: Kind,
    pub(crate) name: &'a [u8],
    /// Attributes (readdirplus only; `None` for `.` and `..`).
    pub(crate) attr: Option<Attr>,
}

/// A directory's entries: by name, and by cookie (the readdir order).
#[derive(Debug)]
struct Dir {
    parent: u64,
    next_cookie: u64,
    by_name: HashMap<Box<[u8]>, u64>,
    by_cookie: BTreeMap<u64, (Box<[u8]>, u64)>,
}

/// Cookies 1 and 2 are `.` and `..`.
const FIRST_COOKIE: u64 = 3;

impl Dir {
    fn new(parent: u64) -> Dir {
        Dir {
            parent,
            next_cookie: FIRST_COOKIE,
            by_name: HashMap::new(),
            by_cookie: BTreeMap::new(),
        }
    }

    fn get(&self, name: &[u8]) -> Option<u64> {
        self.by_name
            .get(name)
            .and_then(|c| self.by_cookie.get(c))
            .map(|(_, ino)| *ino)
    }

    fn insert(&mut self, name: &[u8], ino: u64) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let name: Box<[u8]> = name.into();
        if let Some(old) = self.by_name.insert(name.clone(), cookie) {
            self.by_cookie.remove(&old);
        }
        self.by_cookie.insert(cookie, (name, ino));
    }

    fn remove(&mut self, name: &[u8]) -> Option<u64> {
        let cookie = self.by_name.remove(name)?;
        self.by_cookie.remove(&cookie).map(|(_, ino)| ino)
    }

    /// Points the existing entry `name` at `ino`, keeping its cookie.
    fn repoint(&mut self, name: &[u8], ino: u64) {
        if let Some(c) = self.by_name.get(name) {
            if let Some(e) = self.by_cookie.get_mut(c) {
                e.1 = ino;
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.by_cookie.is_empty()
    }
}

/// What an inode holds.
#[derive(Debug)]
enum Body {
    /// A regular file's bytes in RAM.
    File(Data),
    /// A regular file whose bytes are in its backing file (passthrough mode).
    Backed,
    Dir(Box<Dir>),
    Symlink(Box<[u8]>),
    /// FIFOs, sockets, devices: nothing but attributes.
    Special,
}

#[derive(Debug)]
struct Node {
    /// Attributes; `size` is kept for directories, symlinks and specials only.
    attr: Attr,
    lookups: u64,
    body: Body,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// What kind of inode [`Table::make`] makes.
struct New<'a> {
    kind: Kind,
    perm: u32,
    rdev: u32,
    /// A symlink's target.
    target: Option<&'a [u8]>,
}

/// Now, ns since the epoch.
pub(crate) fn now_ns() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

fn time_of(t: SetTime, now: i64) -> i64 {
    match t {
        SetTime::Now => now,
        SetTime::At(ns) => ns,
    }
}

fn check_name(name: &[u8]) -> Res<()> {
    if name.len() > NAME_MAX {
        Err(libc::ENAMETOOLONG)
    } else if name.is_empty() || name.contains(&b'/') {
        Err(libc::EINVAL)
    } else {
        Ok(())
    }
}

/// deskfs's xattr names (`crates/vfs/src/namespace.rs`): namespaces `user.`, `trusted.`
/// and `security.` (others, e.g. `system.posix_acl_access`, are `EOPNOTSUPP`), at most 255
/// bytes (`ERANGE`), not empty (`EINVAL`).
fn check_xattr_name(name: &[u8]) -> Res<()> {
    if name.is_empty() {
        return Err(libc::EINVAL);
    }
    if name.len() > NAME_MAX {
        return Err(libc::ERANGE);
    }
    let ok = [b"user.".as_slice(), b"trusted.", b"security."]
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len());
    if ok {
        Ok(())
    } else {
        Err(libc::EOPNOTSUPP)
    }
}

/// Drops setuid, and setgid when the file is group-executable or the caller is neither
/// root nor in the file's group (Linux `file_remove_privs`, left to the file system under
/// `FUSE_HANDLE_KILLPRIV_V2`); drops `security.capability`. Regular files only; ctime
/// changes when something was dropped.
fn kill_privs(n: &mut Node, who: Caller, now: i64) {
    if n.attr.kind != Kind::File {
        return;
    }
    let mut p = n.attr.perm & !S_ISUID;
    if p & 0o010 != 0 || (who.uid != 0 && who.gid != n.attr.gid) {
        p &= !S_ISGID;
    }
    let caps = n.xattrs.remove(CAPS).is_some();
    if p != n.attr.perm || caps {
        n.attr.perm = p;
        n.attr.ctime_ns = now;
    }
}

/// Every inode of the file system.
#[derive(Debug)]
pub(crate) struct Table {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    /// Passthrough mode: where regular files' bytes live (`<dir>/<ino>`).
    backing: Option<PathBuf>,
}

impl Table {
    /// An empty file system: the root directory, owned by `owner`, mode 0755. With
    /// `backing`, regular files keep their bytes in files of that (existing) directory.
    pub(crate) fn new(owner: Caller, backing: Option<PathBuf>) -> Table {
        let now = now_ns();
        let root = Node {
            attr: Attr {
                ino: ROOT,
                kind: Kind::Dir,
                perm: 0o755,
                nlink: 2,
                uid: owner.uid,
                gid: owner.gid,
                rdev: 0,
                size: DIR_SIZE,
                atime_ns: now,
                mtime_ns: now,
                ctime_ns: now,
                btime_ns: now,
            },
            lookups: 0,
            body: Body::Dir(Box::new(Dir::new(ROOT))),
            xattrs: BTreeMap::new(),
        };
        Table {
            nodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            backing,
        }
    }

    /// The backing file of `ino` (passthrough mode).
    pub(crate) fn backing_path(&self, ino: u64) -> Option<PathBuf> {
        self.backing.as_ref().map(|d| d.join(ino.to_string()))
    }

    /// Whether `ino`'s bytes are in a backing file.
    pub(crate) fn is_backed(&self, ino: u64) -> bool {
        matches!(self.nodes.get(&ino).map(|n| &n.body), Some(Body::Backed))
    }

    /// Number of inodes.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    fn node(&self, ino: u64) -> Res<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Res<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: u64) -> Res<&Dir> {
        match &self.node(ino)?.body {
            Body::Dir(d) => Ok(d),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Res<&mut Dir> {
        match &mut self.node_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn backing_file(&self, ino: u64, write: bool) -> Res<File> {
        let p = self.backing_path(ino).ok_or(libc::EIO)?;
        OpenOptions::new()
            .read(true)
            .write(write)
            .open(p)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// The attributes of `n` as the kernel sees them: a backed file's size and mtime are
    /// its backing file's (writes through passthrough never reach us).
    fn attr_of(&self, n: &Node) -> Attr {
        let mut a = n.attr;
        match &n.body {
            Body::File(d) => a.size = d.size(),
            Body::Backed => {
                let md = self
                    .backing_path(a.ino)
                    .and_then(|p| std::fs::metadata(p).ok());
                if let Some(md) = md {
                    a.size = md.size();
                    a.mtime_ns = md.mtime() * 1_000_000_000 + md.mtime_nsec();
                    a.ctime_ns = a.ctime_ns.max(md.ctime() * 1_000_000_000 + md.ctime_nsec());
                }
            }
            _ => {}
        }
        a
    }

    /// The attributes of `ino`. Errors: `ENOENT`.
    pub(crate) fn getattr(&self, ino: u64) -> Res<Attr> {
        Ok(self.attr_of(self.node(ino)?))
    }

    /// Looks `name` up in `parent`, counting one kernel reference. Errors: `ENOENT`,
    /// `ENOTDIR`, `ENAMETOOLONG`.
    pub(crate) fn lookup(&mut self, parent: u64, name: &[u8]) -> Res<Attr> {
        if name.len() > NAME_MAX {
            return Err(libc::ENAMETOOLONG);
        }
        let d = self.dir(parent)?;
        let ino = match name {
            b"." => parent,
            b".." => d.parent,
            _ => d.get(name).ok_or(libc::ENOENT)?,
        };
        let n = self.node_mut(ino)?;
        n.lookups += 1;
        let n = self.node(ino)?;
        Ok(self.attr_of(n))
    }

    /// The kernel dropped `count` references to `ino`.
    pub(crate) fn forget(&mut self, ino: u64, count: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups = n.lookups.saturating_sub(count);
            self.maybe_free(ino);
        }
    }

    fn maybe_free(&mut self, ino: u64) {
        if ino == ROOT {
            return;
        }
        let gone = self
            .nodes
            .get(&ino)
            .is_some_and(|n| n.attr.nlink == 0 && n.lookups == 0);
        if gone {
            if let Some(n) = self.nodes.remove(&ino) {
                if matches!(n.body, Body::Backed) {
                    if let Some(p) = self.backing_path(ino) {
                        let _ = std::fs::remove_file(p);
                    }
                }
            }
        }
    }

    /// Makes a new inode named `name` in `parent`; counts one kernel reference.
    fn make(&mut self, who: Caller, parent: u64, name: &[u8], new: New<'_>) -> Res<Attr> {
        let New {
            kind,
            perm,
            rdev,
            target,
        } = new;
        check_name(name)?;
        let pa = self.node(parent)?.attr;
        if self.dir(parent)?.get(name).is_some() {
            return Err(libc::EEXIST);
        }
        let now = now_ns();
        let ino = self.next_ino;
        let mut perm = perm & 0o7777;
        let mut gid = who.gid;
        if pa.perm & S_ISGID != 0 {
            // A setgid directory: BSD group semantics, and subdirectories inherit it.
            gid = pa.gid;
            if kind == Kind::Dir {
                perm |= S_ISGID;
            }
        }
        let body = match kind {
            Kind::File if self.backing.is_some() => {
                let p = self.backing_path(ino).ok_or(libc::EIO)?;
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(p)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
                Body::Backed
            }
            Kind::File => Body::File(Data::default()),
            Kind::Dir => Body::Dir(Box::new(Dir::new(parent))),
            Kind::Symlink => Body::Symlink(target.unwrap_or_default().into()),
            _ => Body::Special,
        };
        let size = match kind {
            Kind::Dir => DIR_SIZE,
            Kind::Symlink => target.map_or(0, |t| t.len() as u64),
            _ => 0,
        };
        let attr = Attr {
            ino,
            kind,
            perm,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            uid: who.uid,
            gid,
            rdev,
            size,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            btime_ns: now,
        };
        self.next_ino += 1;
        self.nodes.insert(
            ino,
            Node {
                attr,
                lookups: 1,
                body,
                xattrs: BTreeMap::new(),
            },
        );
        self.dir_mut(parent)?.insert(name, ino);
        let p = self.node_mut(parent)?;
        if kind == Kind::Dir {
            p.attr.nlink += 1;
        }
        p.attr.mtime_ns = now;
        p.attr.ctime_ns = now;
        // A backed file's times are its backing file's from the start.
        let n = self.node(ino)?;
        Ok(self.attr_of(n))
    }

    /// `mknod`/`create`: a file, FIFO, socket or device. Errors: `EEXIST`, `ENOENT`,
    /// `ENOTDIR`, `ENAMETOOLONG`, `EINVAL` (unknown type).
    pub(crate) fn mknod(
        &mut self,
        who: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
    ) -> Res<Attr> {
        let kind = Kind::of_mode(mode).ok_or(libc::EINVAL)?;
        if matches!(kind, Kind::Dir | Kind::Symlink) {
            return Err(libc::EINVAL);
        }
        self.make(
            who,
            parent,
            name,
            New {
                kind,
                perm: mode,
                rdev,
                target: None,
            },
        )
    }

    /// `mkdir`. Errors as [`Table::mknod`].
    pub(crate) fn mkdir(&mut self, who: Caller, parent: u64, name: &[u8], mode: u32) -> Res<Attr> {
        self.make(
            who,
            parent,
            name,
            New {
                kind: Kind::Dir,
                perm: mode,
                rdev: 0,
                target: None,
            },
        )
    }

    /// `symlink`. Errors as [`Table::mknod`].
    pub(crate) fn symlink(
        &mut self,
        who: Caller,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Res<Attr> {
        self.make(
            who,
            parent,
            name,
            New {
                kind: Kind::Symlink,
                perm: 0o777,
                rdev: 0,
                target: Some(target),
            },
        )
    }

    /// `readlink`. Errors: `ENOENT`, `EINVAL` (not a symlink).
    pub(crate) fn readlink(&self, ino: u64) -> Res<Vec<u8>> {
        match &self.node(ino)?.body {
            Body::Symlink(t) => Ok(t.to_vec()),
            _ => Err(libc::EINVAL),
        }
    }

    /// `link`: a new name for `ino`; counts one kernel reference. Errors: `EEXIST`,
    /// `EPERM` (a directory), `ENOENT`, `ENOTDIR`, `ENAMETOOLONG`.
    pub(crate) fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> Res<Attr> {
        check_name(name)?;
        if self.node(ino)?.attr.kind == Kind::Dir {
            return Err(libc::EPERM);
        }
        if self.dir(parent)?.get(name).is_some() {
            return Err(libc::EEXIST);
        }
        let now = now_ns();
        self.dir_mut(parent)?.insert(name, ino);
        let p = self.node_mut(parent)?;
        p.attr.mtime_ns = now;
        p.attr.ctime_ns = now;
        let n = self.node_mut(ino)?;
        n.attr.nlink += 1;
        n.attr.ctime_ns = now;
        n.lookups += 1;
        let n = self.node(ino)?;
        Ok(self.attr_of(n))
    }

    /// `unlink`. Errors: `ENOENT`, `ENOTDIR`, `EISDIR`.
    pub(crate) fn unlink(&mut self, parent: u64, name: &[u8]) -> Res<()> {
        let ino = self.dir(parent)?.get(name).ok_or(libc::ENOENT)?;
        if self.node(ino)?.attr.kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        let now = now_ns();
        self.dir_mut(parent)?.remove(name);
        let p = self.node_mut(parent)?;
        p.attr.mtime_ns = now;
        p.attr.ctime_ns = now;
        let n = self.node_mut(ino)?;
        n.attr.nlink = n.attr.nlink.saturating_sub(1);
        n.attr.ctime_ns = now;
        self.maybe_free(ino);
        Ok(())
    }

    /// `rmdir`. Errors: `ENOENT`, `ENOTDIR`, `ENOTEMPTY`, `EINVAL` (`.`), `EBUSY` (root).
    pub(crate) fn rmdir(&mut self, parent: u64, name: &[u8]) -> Res<()> {
        match name {
            b"." => return Err(libc::EINVAL),
            b".." => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        let ino = self.dir(parent)?.get(name).ok_or(libc::ENOENT)?;
        if !self.dir(ino)?.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        let now = now_ns();
        self.dir_mut(parent)?.remove(name);
        let p = self.node_mut(parent)?;
        p.attr.nlink = p.attr.nlink.saturating_sub(1);
        p.attr.mtime_ns = now;
        p.attr.ctime_ns = now;
        let n = self.node_mut(ino)?;
        n.attr.nlink = 0;
        n.attr.ctime_ns = now;
        self.maybe_free(ino);
        Ok(())
    }

    /// Whether directory `ino` is `dir` or below it.
    fn is_within(&self, mut ino: u64, dir: u64) -> bool {
        loop {
            if ino == dir {
                return true;
            }
            match self.dir(ino) {
                Ok(d) if d.parent != ino => ino = d.parent,
                _ => return false,
            }
        }
    }

    /// `rename`, with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`. An existing target is
    /// replaced (a directory only by a directory, and only when empty). Errors: `ENOENT`,
    /// `EEXIST` (noreplace), `ENOTDIR`, `EISDIR`, `ENOTEMPTY`, `EINVAL` (a directory into
    /// itself, unknown flags), `ENAMETOOLONG`.
    pub(crate) fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Res<()> {
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 || (noreplace && exchange)
        {
            return Err(libc::EINVAL);
        }
        check_name(newname)?;
        let src = self.dir(parent)?.get(name).ok_or(libc::ENOENT)?;
        let dst = self.dir(newparent)?.get(newname);
        let src_dir = self.node(src)?.attr.kind == Kind::Dir;
        let now = now_ns();
        if exchange {
            let dst = dst.ok_or(libc::ENOENT)?;
            let dst_dir = self.node(dst)?.attr.kind == Kind::Dir;
            if (src_dir && self.is_within(newparent, src))
                || (dst_dir && self.is_within(parent, dst))
            {
                return Err(libc::EINVAL);
            }
            self.dir_mut(parent)?.repoint(name, dst);
            self.dir_mut(newparent)?.repoint(newname, src);
            if parent != newparent {
                if src_dir {
                    self.dir_mut(src)?.parent = newparent;
                    self.node_mut(parent)?.attr.nlink -= 1;
                    self.node_mut(newparent)?.attr.nlink += 1;
                }
                if dst_dir {
                    self.dir_mut(dst)?.parent = parent;
                    self.node_mut(newparent)?.attr.nlink -= 1;
                    self.node_mut(parent)?.attr.nlink += 1;
                }
            }
            for ino in [src, dst] {
                self.node_mut(ino)?.attr.ctime_ns = now;
            }
            for ino in [parent, newparent] {
                let p = self.node_mut(ino)?;
                p.attr.mtime_ns = now;
                p.attr.ctime_ns = now;
            }
            return Ok(());
        }
        if let Some(dst) = dst {
            if noreplace {
                return Err(libc::EEXIST);
            }
            if dst == src {
                return Ok(()); // two names of one inode: nothing happens (POSIX)
            }
        }
        if src_dir && self.is_within(newparent, src) {
            return Err(libc::EINVAL);
        }
        if let Some(dst) = dst {
            let dst_dir = self.node(dst)?.attr.kind == Kind::Dir;
            match (src_dir, dst_dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !self.dir(dst)?.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
            self.dir_mut(newparent)?.remove(newname);
            let n = self.node_mut(dst)?;
            if dst_dir {
                n.attr.nlink = 0;
            } else {
                n.attr.nlink = n.attr.nlink.saturating_sub(1);
            }
            n.attr.ctime_ns = now;
            if dst_dir {
                self.node_mut(newparent)?.attr.nlink -= 1;
            }
            self.maybe_free(dst);
        }
        self.dir_mut(parent)?.remove(name);
        self.dir_mut(newparent)?.insert(newname, src);
        if src_dir && parent != newparent {
            self.dir_mut(src)?.parent = newparent;
            self.node_mut(parent)?.attr.nlink -= 1;
            self.node_mut(newparent)?.attr.nlink += 1;
        }
        self.node_mut(src)?.attr.ctime_ns = now;
        for ino in [parent, newparent] {
            let p = self.node_mut(ino)?;
            p.attr.mtime_ns = now;
            p.attr.ctime_ns = now;
        }
        Ok(())
    }

    /// `setattr`: chmod, chown (drops setuid/setgid of a file), truncate (drops them too
    /// when an unprivileged caller truncates), utimensat. ctime always changes. Errors:
    /// `ENOENT`, `EISDIR`/`EINVAL` (truncate of a non-file), `EFBIG`.
    pub(crate) fn setattr(&mut self, who: Caller, ino: u64, set: &SetAttr) -> Res<Attr> {
        let now = now_ns();
        if let Some(size) = set.size {
            if size > i64::MAX as u64 {
                return Err(libc::EFBIG);
            }
            let backed = self.is_backed(ino);
            let file = if backed {
                Some(self.backing_file(ino, true)?)
            } else {
                None
            };
            let n = self.node_mut(ino)?;
            match (&mut n.body, &file) {
                (Body::File(d), _) => d.truncate(size),
                (Body::Backed, Some(f)) => f
                    .set_len(size)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?,
                (Body::Dir(_), _) => return Err(libc::EISDIR),
                _ => return Err(libc::EINVAL),
            }
            if who.uid != 0 {
                kill_privs(n, who, now);
            }
            n.attr.mtime_ns = now;
            n.attr.ctime_ns = now;
        }
        let n = self.node_mut(ino)?;
        if let Some(mode) = set.mode {
            n.attr.perm = mode & 0o7777;
        }
        let changes_owner =
            set.uid.is_some_and(|u| u != n.attr.uid) || set.gid.is_some_and(|g| g != n.attr.gid);
        if changes_owner && n.attr.kind != Kind::Dir && set.mode.is_none() {
            // chown drops setuid, and setgid when group-executable (Linux).
            n.attr.perm &= !S_ISUID;
            if n.attr.perm & 0o010 != 0 {
                n.attr.perm &= !S_ISGID;
            }
        }
        if let Some(uid) = set.uid {
            n.attr.uid = uid;
        }
        if let Some(gid) = set.gid {
            n.attr.gid = gid;
        }
        if let Some(t) = set.atime {
            n.attr.atime_ns = time_of(t, now);
        }
        let mtime = set.mtime.map(|t| time_of(t, now));
        if let Some(m) = mtime {
            n.attr.mtime_ns = m;
        }
        n.attr.ctime_ns = now;
        if let (Some(m), true) = (mtime, self.is_backed(ino)) {
            // A backed file's mtime is its backing file's: set it there.
            let f = self.backing_file(ino, true)?;
            let t = if m >= 0 {
                UNIX_EPOCH + Duration::from_nanos(m as u64)
            } else {
                UNIX_EPOCH - Duration::from_nanos(m.unsigned_abs())
            };
            f.set_modified(t)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        }
        self.getattr(ino)
    }

    /// `read`: up to `len` bytes from `offset`. Errors: `ENOENT`, `EISDIR`, `EINVAL`.
    pub(crate) fn read(&self, ino: u64, offset: u64, len: u32) -> Res<Vec<u8>> {
        match &self.node(ino)?.body {
            Body::File(d) => Ok(d.read(offset, len)),
            Body::Backed => {
                let f = self.backing_file(ino, false)?;
                let mut buf = vec![0u8; len as usize];
                let mut got = 0;
                while got < buf.len() {
                    match f.read_at(&mut buf[got..], offset + got as u64) {
                        Ok(0) => break,
                        Ok(k) => got += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
                    }
                }
                buf.truncate(got);
                Ok(buf)
            }
            Body::Dir(_) => Err(libc::EISDIR),
            _ => Err(libc::EINVAL),
        }
    }

    /// `write` of `buf` at `offset`; with `kill`, the writer's privileges check drops
    /// setuid/setgid first. Errors: `ENOENT`, `EISDIR`, `EINVAL`, `EFBIG`.
    pub(crate) fn write(
        &mut self,
        ino: u64,
        offset: u64,
        buf: &[u8],
        kill: Option<Caller>,
    ) -> Res<u32> {
        let now = now_ns();
        let file = if self.is_backed(ino) {
            Some(self.backing_file(ino, true)?)
        } else {
            None
        };
        let n = self.node_mut(ino)?;
        if let Some(who) = kill {
            kill_privs(n, who, now);
        }
        match (&mut n.body, file) {
            (Body::File(d), _) => d.write(offset, buf)?,
            (Body::Backed, Some(f)) => f
                .write_all_at(buf, offset)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?,
            (Body::Dir(_), _) => return Err(libc::EISDIR),
            _ => return Err(libc::EINVAL),
        }
        n.attr.mtime_ns = now;
        n.attr.ctime_ns = now;
        u32::try_from(buf.len()).map_err(|_| libc::EINVAL)
    }

    /// `fallocate`: mode 0 (allocate, extending the size), `FALLOC_FL_KEEP_SIZE`,
    /// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`. Errors: `EOPNOTSUPP` (other modes),
    /// `ENOENT`, `ENODEV` (not a file), `EFBIG`.
    pub(crate) fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: i32) -> Res<()> {
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        if mode & !(libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE) != 0 || (punch && !keep)
        {
            return Err(libc::EOPNOTSUPP);
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(libc::EFBIG)?;
        let now = now_ns();
        if self.is_backed(ino) {
            let f = self.backing_file(ino, true)?;
            let flags = nix::fcntl::FallocateFlags::from_bits_truncate(mode);
            nix::fcntl::fallocate(&f, flags, offset as i64, len as i64).map_err(|e| e as i32)?;
        } else {
            let n = self.node_mut(ino)?;
            match &mut n.body {
                Body::File(d) if punch => d.zero(offset, len),
                Body::File(d) if !keep && end > d.size() => d.truncate(end),
                Body::File(_) => {}
                _ => return Err(libc::ENODEV),
            }
        }
        let n = self.node_mut(ino)?;
        if punch || !keep {
            n.attr.mtime_ns = now;
        }
        n.attr.ctime_ns = now;
        Ok(())
    }

    /// Lists `ino` from after cookie `offset`, handing each entry to `add` until it says
    /// the reply is full (that entry is not sent). With `plus`, entries carry attributes
    /// and each one sent (but `.` and `..`) counts a kernel reference. Errors: `ENOENT`,
    /// `ENOTDIR`.
    pub(crate) fn readdir(
        &mut self,
        ino: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(&Entry<'_>) -> bool,
    ) -> Res<()> {
        let d = self.dir(ino)?;
        let mut sent = Vec::new();
        let dots = [(1u64, b".".as_slice(), ino), (2, b"..", d.parent)];
        for (cookie, name, i) in dots {
            if offset < cookie {
                let e = Entry {
                    ino: i,
                    cookie,
                    kind: Kind::Dir,
                    name,
                    attr: None,
                };
                if add(&e) {
                    return Ok(());
                }
            }
        }
        for (&cookie, (name, child)) in d.by_cookie.range(offset.max(FIRST_COOKIE - 1) + 1..) {
            let Some(n) = self.nodes.get(child) else {
                continue;
            };
            let e = Entry {
                ino: *child,
                cookie,
                kind: n.attr.kind,
                name,
                attr: plus.then(|| self.attr_of(n)),
            };
            if add(&e) {
                break;
            }
            if plus {
                sent.push(*child);
            }
        }
        for child in sent {
            if let Some(n) = self.nodes.get_mut(&child) {
                n.lookups += 1;
            }
        }
        Ok(())
    }

    /// `setxattr` (`XATTR_CREATE`: fail with `EEXIST` if present; `XATTR_REPLACE`:
    /// `ENODATA` if absent). Errors: `ENOENT`, `EINVAL` (flags), those of the name's check.
    pub(crate) fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Res<()> {
        check_xattr_name(name)?;
        if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            return Err(libc::EINVAL);
        }
        let n = self.node_mut(ino)?;
        let x = &mut n.xattrs;
        let present = x.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && present {
            return Err(libc::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !present {
            return Err(libc::ENODATA);
        }
        x.insert(name.to_vec(), value.to_vec());
        n.attr.ctime_ns = now_ns();
        Ok(())
    }

    /// `getxattr`. Errors: `ENOENT`, `ENODATA`, those of the name's check; a missing
    /// `security.selinux` is `EOPNOTSUPP`, as deskfs answers: `ls -l` (libselinux) then
    /// stops asking the mount for labels instead of asking once per entry.
    pub(crate) fn getxattr(&self, ino: u64, name: &[u8]) -> Res<Vec<u8>> {
        check_xattr_name(name)?;
        let n = self.node(ino)?;
        match n.xattrs.get(name) {
            Some(v) => Ok(v.clone()),
            None if name == SELINUX => Err(libc::EOPNOTSUPP),
            None => Err(libc::ENODATA),
        }
    }

    /// `listxattr`: the names, each NUL-terminated. Errors: `ENOENT`.
    pub(crate) fn listxattr(&self, ino: u64) -> Res<Vec<u8>> {
        let mut out = Vec::new();
        for k in self.node(ino)?.xattrs.keys() {
            out.extend_from_slice(k);
            out.push(0);
        }
        Ok(out)
    }

    /// `removexattr`. Errors: `ENOENT`, `ENODATA`, those of the name's check.
    pub(crate) fn removexattr(&mut self, ino: u64, name: &[u8]) -> Res<()> {
        check_xattr_name(name)?;
        let n = self.node_mut(ino)?;
        n.xattrs.remove(name).ok_or(libc::ENODATA)?;
        n.attr.ctime_ns = now_ns();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Caller = Caller {
        uid: 1000,
        gid: 1000,
    };

    fn names(t: &mut Table, dir: u64) -> Vec<String> {
        let mut out = Vec::new();
        t.readdir(dir, 0, false, |e| {
            out.push(String::from_utf8_lossy(e.name).into_owned());
            false
        })
        .expect("readdir");
        out
    }

    #[test]
    fn create_lookup_write_read_unlink() {
        let mut t = Table::new(ME, None);
        let a = t
            .mknod(ME, ROOT, b"f", libc::S_IFREG | 0o644, 0)
            .expect("mknod");
        assert_eq!(
            (a.kind, a.perm, a.nlink, a.uid),
            (Kind::File, 0o644, 1, 1000)
        );
        assert_eq!(
            t.mknod(ME, ROOT, b"f", libc::S_IFREG | 0o644, 0),
            Err(libc::EEXIST)
        );
        assert_eq!(t.write(a.ino, 0, b"hello", None), Ok(5));
        assert_eq!(t.read(a.ino, 1, 100).expect("read"), b"ello");
        assert_eq!(t.lookup(ROOT, b"f").expect("lookup").size, 5);
        assert_eq!(t.lookup(ROOT, b"g"), Err(libc::ENOENT));
        t.unlink(ROOT, b"f").expect("unlink");
        // still referenced by the kernel (2 lookups): alive, unnamed
        assert_eq!(t.getattr(a.ino).expect("getattr").nlink, 0);
        t.forget(a.ino, 2);
        assert_eq!(t.getattr(a.ino), Err(libc::ENOENT));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn directories_count_links_and_refuse_removal_when_full() {
        let mut t = Table::new(ME, None);
        let d = t.mkdir(ME, ROOT, b"d", 0o755).expect("mkdir");
        assert_eq!(t.getattr(ROOT).expect("root").nlink, 3);
        t.mkdir(ME, d.ino, b"e", 0o755).expect("mkdir");
        assert_eq!(t.rmdir(ROOT, b"d"), Err(libc::ENOTEMPTY));
        assert_eq!(t.unlink(ROOT, b"d"), Err(libc::EISDIR));
        t.rmdir(d.ino, b"e").expect("rmdir e");
        t.rmdir(ROOT, b"d").expect("rmdir d");
        assert_eq!(t.getattr(ROOT).expect("root").nlink, 2);
        assert_eq!(t.lookup(ROOT, &[b'x'; 256]), Err(libc::ENAMETOOLONG));
    }

    #[test]
    fn rename_replaces_refuses_and_exchanges() {
        let mut t = Table::new(ME, None);
        let a = t
            .mknod(ME, ROOT, b"a", libc::S_IFREG | 0o644, 0)
            .expect("a");
        let b = t
            .mknod(ME, ROOT, b"b", libc::S_IFREG | 0o644, 0)
            .expect("b");
        let d = t.mkdir(ME, ROOT, b"d", 0o755).expect("d");
        assert_eq!(
            t.rename(ROOT, b"a", ROOT, b"b", libc::RENAME_NOREPLACE),
            Err(libc::EEXIST)
        );
        assert_eq!(t.rename(ROOT, b"a", ROOT, b"d", 0), Err(libc::EISDIR));
        assert_eq!(t.rename(ROOT, b"d", ROOT, b"a", 0), Err(libc::ENOTDIR));
        assert_eq!(t.rename(ROOT, b"d", d.ino, b"x", 0), Err(libc::EINVAL));
        t.rename(ROOT, b"a", ROOT, b"b", libc::RENAME_EXCHANGE)
            .expect("exchange");
        assert_eq!(t.lookup(ROOT, b"a").expect("a").ino, b.ino);
        t.rename(ROOT, b"a", ROOT, b"b", 0).expect("replace");
        assert_eq!(t.lookup(ROOT, b"b").expect("b").ino, b.ino);
        assert_eq!(
            t.getattr(a.ino).expect("replaced, still referenced").nlink,
            0
        );
        t.rename(ROOT, b"b", d.ino, b"moved", 0).expect("move");
        assert_eq!(names(&mut t, d.ino), [".", "..", "moved"]);
        let e = t.mkdir(ME, ROOT, b"e", 0o755).expect("e");
        t.rename(ROOT, b"e", d.ino, b"e2", 0).expect("move dir");
        assert_eq!(t.getattr(d.ino).expect("d").nlink, 3);
        assert_eq!(t.getattr(ROOT).expect("root").nlink, 3);
        assert_eq!(t.lookup(e.ino, b"..").expect("..").ino, d.ino);
    }

    #[test]
    fn readdir_cookies_survive_removals() {
        let mut t = Table::new(ME, None);
        for i in 0..10 {
            t.mknod(
                ME,
                ROOT,
                format!("f{i}").as_bytes(),
                libc::S_IFREG | 0o644,
                0,
            )
            .expect("mknod");
        }
        let mut first = Vec::new();
        t.readdir(ROOT, 0, false, |e| {
            first.push((e.cookie, e.name.to_vec()));
            first.len() == 6 // full after 5 entries
        })
        .expect("readdir");
        first.pop();
        let resume = first.last().map(|e| e.0).expect("some");
        t.unlink(ROOT, b"f0").expect("unlink");
        t.unlink(ROOT, b"f1").expect("unlink");
        let mut rest = Vec::new();
        t.readdir(ROOT, resume, false, |e| {
            rest.push(String::from_utf8_lossy(e.name).into_owned());
            false
        })
        .expect("readdir");
        assert_eq!(rest, ["f3", "f4", "f5", "f6", "f7", "f8", "f9"]);
    }

    #[test]
    fn readdirplus_counts_references() {
        let mut t = Table::new(ME, None);
        let a = t
            .mknod(ME, ROOT, b"a", libc::S_IFREG | 0o644, 0)
            .expect("a");
        t.unlink(ROOT, b"a").ok();
        t.forget(a.ino, 1);
        let b = t
            .mknod(ME, ROOT, b"b", libc::S_IFREG | 0o644, 0)
            .expect("b");
        t.forget(b.ino, 1);
        t.readdir(ROOT, 0, true, |e| {
            assert!(e.attr.is_some() || e.name.starts_with(b"."));
            false
        })
        .expect("readdirplus");
        t.unlink(ROOT, b"b").expect("unlink");
        assert!(t.getattr(b.ino).is_ok(), "readdirplus reference keeps it");
        t.forget(b.ino, 1);
        assert_eq!(t.getattr(b.ino), Err(libc::ENOENT));
    }

    #[test]
    fn setattr_truncates_chowns_and_drops_setuid() {
        let mut t = Table::new(ME, None);
        let a = t
            .mknod(ME, ROOT, b"a", libc::S_IFREG | 0o6755, 0)
            .expect("a");
        t.write(a.ino, 0, b"0123456789", None).expect("write");
        let set = SetAttr {
            size: Some(4),
            ..Default::default()
        };
        let got = t.setattr(ME, a.ino, &set).expect("truncate");
        assert_eq!(got.size, 4);
        assert_eq!(got.perm, 0o755, "unprivileged truncate drops setuid/setgid");
        let set = SetAttr {
            mode: Some(0o6755),
            ..Default::default()
        };
        t.setattr(ME, a.ino, &set).expect("chmod");
        let set = SetAttr {
            uid: Some(0),
            ..Default::default()
        };
        assert_eq!(t.setattr(ME, a.ino, &set).expect("chown").perm, 0o755);
        let set = SetAttr {
            mtime: Some(SetTime::At(-1_500_000_000)),
            ..Default::default()
        };
        assert_eq!(
            t.setattr(ME, a.ino, &set).expect("utimens").mtime_ns,
            -1_500_000_000
        );
        t.setattr(
            ME,
            a.ino,
            &SetAttr {
                mode: Some(0o4755),
                ..Default::default()
            },
        )
        .expect("chmod");
        t.write(a.ino, 0, b"x", Some(ME)).expect("write");
        assert_eq!(
            t.getattr(a.ino).expect("a").perm,
            0o755,
            "a write drops setuid"
        );
    }

    #[test]
    fn setgid_directories_pass_their_group_on() {
        let mut t = Table::new(ME, None);
        let d = t.mkdir(ME, ROOT, b"d", 0o2775).expect("d");
        t.setattr(
            ME,
            d.ino,
            &SetAttr {
                gid: Some(50),
                mode: Some(0o2775),
                ..Default::default()
            },
        )
        .expect("chgrp");
        let f = t
            .mknod(ME, d.ino, b"f", libc::S_IFREG | 0o644, 0)
            .expect("f");
        assert_eq!(f.gid, 50);
        let e = t.mkdir(ME, d.ino, b"e", 0o755).expect("e");
        assert_eq!((e.gid, e.perm), (50, 0o2755));
    }

    #[test]
    fn xattrs_follow_create_and_replace_flags() {
        let mut t = Table::new(ME, None);
        t.setxattr(ROOT, b"user.a", b"1", 0).expect("set");
        assert_eq!(
            t.setxattr(ROOT, b"user.a", b"2", libc::XATTR_CREATE),
            Err(libc::EEXIST)
        );
        assert_eq!(
            t.setxattr(ROOT, b"user.b", b"2", libc::XATTR_REPLACE),
            Err(libc::ENODATA)
        );
        t.setxattr(ROOT, b"user.b", b"2", 0).expect("set");
        assert_eq!(t.listxattr(ROOT).expect("list"), b"user.a\0user.b\0");
        assert_eq!(t.getxattr(ROOT, b"user.a").expect("get"), b"1");
        assert_eq!(t.getxattr(ROOT, b"user.c"), Err(libc::ENODATA));
        assert_eq!(t.getxattr(ROOT, b"security.selinux"), Err(libc::EOPNOTSUPP));
        assert_eq!(
            t.getxattr(ROOT, b"system.posix_acl_access"),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(t.setxattr(ROOT, b"user.", b"x", 0), Err(libc::EOPNOTSUPP));
        assert_eq!(t.setxattr(ROOT, &[b'u'; 256], b"x", 0), Err(libc::ERANGE));
        t.removexattr(ROOT, b"user.a").expect("remove");
        assert_eq!(t.removexattr(ROOT, b"user.a"), Err(libc::ENODATA));
    }

    #[test]
    fn backed_files_keep_their_bytes_in_the_backing_dir() {
        let dir = std::env::temp_dir().join(format!("floorfs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut t = Table::new(ME, Some(dir.clone()));
        let a = t
            .mknod(ME, ROOT, b"a", libc::S_IFREG | 0o644, 0)
            .expect("a");
        t.write(a.ino, 3, b"abc", None).expect("write");
        assert_eq!(t.read(a.ino, 0, 10).expect("read"), b"\0\0\0abc");
        assert_eq!(
            std::fs::read(dir.join(a.ino.to_string())).expect("backing"),
            b"\0\0\0abc"
        );
        assert_eq!(
            t.setattr(
                ME,
                a.ino,
                &SetAttr {
                    size: Some(4),
                    ..Default::default()
                }
            )
            .expect("trunc")
            .size,
            4
        );
        t.unlink(ROOT, b"a").expect("unlink");
        t.forget(a.ino, 1);
        assert!(!dir.join(a.ino.to_string()).exists());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
