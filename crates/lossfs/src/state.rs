//! The model: the volatile view the mount shows, the durable state (the backing
//! directory), the ordered log of namespace operations between them, and what a power
//! cut does. No FUSE types here; errors are errnos, so each rule is unit-tested.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::names::{Names, ROOT};
use crate::overlay::{Backing, Kept, Overlay};
use crate::util::{matches, FileCopy, Rng};

/// Result of a model operation: the errno on failure.
pub(crate) type Res<T> = Result<T, i32>;

/// Items of each list a `cut --reorder` answer names (the rest are counted).
const REPORT_ITEMS: usize = 32;

/// Longest name of a directory entry, bytes.
pub(crate) const NAME_MAX: usize = 255;

/// Backing content of a file that has none yet (created, never made durable).
static EMPTY: Vec<u8> = Vec::new();

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
    /// The kind of a mode's `S_IFMT` bits (0 is a regular file).
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

    fn ifmt(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
            Kind::CharDev => libc::S_IFCHR,
            Kind::BlockDev => libc::S_IFBLK,
        }
    }
}

/// An inode's attributes as the mount shows them (times in ns since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attr {
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    pub(crate) perm: u32,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) rdev: u32,
    pub(crate) size: u64,
    pub(crate) atime_ns: i64,
    pub(crate) mtime_ns: i64,
    pub(crate) ctime_ns: i64,
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

/// One directory entry of a listing.
#[derive(Debug)]
pub(crate) struct DirEntry {
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    pub(crate) name: Vec<u8>,
}

#[derive(Debug)]
struct Inode {
    kind: Kind,
    perm: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    atime: i64,
    mtime: i64,
    ctime: i64,
    /// A symlink's target.
    target: Vec<u8>,
    /// A regular file's content.
    data: Option<Overlay>,
    /// References the kernel holds (entries handed out, not yet forgotten).
    lookups: u64,
    /// Open handles.
    opens: u32,
    /// The backing file, opened when first needed.
    base: Option<File>,
}

/// A pending namespace operation, by inode numbers (resolved to backing paths through
/// the durable namespace when applied).
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Mknod {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
        /// Type and permission bits.
        mode: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    },
    Mkdir {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Symlink {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
        target: Vec<u8>,
        uid: u32,
        gid: u32,
    },
    Link {
        ino: u64,
        parent: u64,
        name: Vec<u8>,
    },
    Unlink {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
    },
    Rmdir {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
    },
    Rename {
        parent: u64,
        name: Vec<u8>,
        newparent: u64,
        newname: Vec<u8>,
        flags: u32,
        ino: u64,
        /// The inode replaced (or exchanged with).
        other: Option<u64>,
    },
    SetAttr {
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<i64>,
        mtime: Option<i64>,
    },
}

impl Op {
    /// The directories whose entries the operation changes.
    fn dirs(&self) -> [Option<u64>; 2] {
        match self {
            Op::Mknod { parent, .. }
            | Op::Mkdir { parent, .. }
            | Op::Symlink { parent, .. }
            | Op::Link { parent, .. }
            | Op::Unlink { parent, .. }
            | Op::Rmdir { parent, .. } => [Some(*parent), None],
            Op::Rename {
                parent, newparent, ..
            } => [Some(*parent), Some(*newparent)],
            Op::SetAttr { .. } => [None, None],
        }
    }

    /// The inodes the operation is about (created, linked, unlinked, renamed, changed).
    fn objects(&self) -> [Option<u64>; 2] {
        match self {
            Op::Mknod { ino, .. }
            | Op::Mkdir { ino, .. }
            | Op::Symlink { ino, .. }
            | Op::Link { ino, .. }
            | Op::Unlink { ino, .. }
            | Op::Rmdir { ino, .. }
            | Op::SetAttr { ino, .. } => [Some(*ino), None],
            Op::Rename { ino, other, .. } => [Some(*ino), *other],
        }
    }

    /// Whether the operation is about inode `ino` (what its `fsync` makes durable).
    fn is_about(&self, ino: u64) -> bool {
        self.objects().contains(&Some(ino))
    }

    /// Whether the operation changes directory `dir` or is about it (what its
    /// `fsyncdir` makes durable).
    fn touches_dir(&self, dir: u64) -> bool {
        self.dirs().contains(&Some(dir)) || self.is_about(dir)
    }

    /// A short description (for reports).
    fn describe(&self, names: &Names) -> String {
        let at = |p: u64, n: &[u8]| {
            let mut path = names.path(p).unwrap_or_else(|| PathBuf::from("?"));
            path.push(std::ffi::OsStr::from_bytes(n));
            path.display().to_string()
        };
        match self {
            Op::Mknod {
                parent, name, mode, ..
            } => {
                if mode & libc::S_IFMT == libc::S_IFREG {
                    format!("create {}", at(*parent, name))
                } else {
                    format!("mknod {}", at(*parent, name))
                }
            }
            Op::Mkdir { parent, name, .. } => format!("mkdir {}", at(*parent, name)),
            Op::Symlink { parent, name, .. } => format!("symlink {}", at(*parent, name)),
            Op::Link { parent, name, .. } => format!("link {}", at(*parent, name)),
            Op::Unlink { parent, name, .. } => format!("unlink {}", at(*parent, name)),
            Op::Rmdir { parent, name, .. } => format!("rmdir {}", at(*parent, name)),
            Op::Rename {
                parent,
                name,
                newparent,
                newname,
                ..
            } => format!(
                "rename {} -> {}",
                at(*parent, name),
                at(*newparent, newname)
            ),
            Op::SetAttr { ino, .. } => format!(
                "setattr {}",
                names
                    .path(*ino)
                    .map_or_else(|| format!("#{ino}"), |p| p.display().to_string())
            ),
        }
    }
}

/// Counters reported by `stats`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    pub(crate) fsyncs: u64,
    pub(crate) fdatasyncs: u64,
    pub(crate) fsyncdirs: u64,
    pub(crate) syncs: u64,
    pub(crate) cuts: u64,
    pub(crate) injected_failures: u64,
    /// Operations the backing directory refused when made durable (should stay 0).
    pub(crate) apply_errors: u64,
}

/// What a new inode is (mknod, mkdir, symlink).
struct New {
    kind: Kind,
    perm: u32,
    rdev: u32,
    target: Vec<u8>,
}

/// A failure injection rule: the next `left` syncs of matching paths fail.
#[derive(Debug)]
struct Rule {
    pattern: String,
    left: u64,
}

/// The whole model.
#[derive(Debug)]
pub(crate) struct State {
    backing: PathBuf,
    next_ino: u64,
    inodes: HashMap<u64, Inode>,
    /// What the mount shows.
    vnames: Names,
    /// What the backing directory holds.
    dnames: Names,
    /// Pending namespace operations, oldest first.
    log: Vec<Op>,
    fail_fsync: Vec<Rule>,
    fail_fsyncdir: Vec<Rule>,
    counters: Counters,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets times without following a symlink (`None`: unchanged).
fn set_times(p: &Path, atime: Option<i64>, mtime: Option<i64>) -> io::Result<()> {
    let ts = |t: Option<i64>| match t {
        Some(ns) => libc::timespec {
            tv_sec: ns.div_euclid(1_000_000_000),
            tv_nsec: ns.rem_euclid(1_000_000_000),
        },
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    };
    let times = [ts(atime), ts(mtime)];
    let c = cpath(p)?;
    // SAFETY: `c` is a NUL-terminated path and `times` two timespecs, as utimensat wants.
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// The first [`REPORT_ITEMS`] of `items` joined with `sep`, and how many more there are
/// (the daemon's stderr has them all).
fn abridged(items: &[String], sep: &str) -> String {
    let mut out = items
        .iter()
        .take(REPORT_ITEMS)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(sep);
    if items.len() > REPORT_ITEMS {
        out.push_str(&format!("{sep}... {} more", items.len() - REPORT_ITEMS));
    }
    out
}

/// Opens a file of the backing directory for reading and writing (reading only if
/// writing is refused: then making its data durable fails).
fn open_backing(p: &Path) -> io::Result<File> {
    let rw = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p);
    match rw {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EROFS)) => {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
        }
        r => r,
    }
}

/// The inode of the backing entry `meta` describes.
fn inode_of(meta: &std::fs::Metadata, path: &Path) -> io::Result<Inode> {
    let kind = Kind::of_mode(meta.mode()).unwrap_or(Kind::File);
    let target = if kind == Kind::Symlink {
        std::fs::read_link(path)?.as_os_str().as_bytes().to_vec()
    } else {
        Vec::new()
    };
    let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
    Ok(Inode {
        kind,
        perm: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        // FUSE carries a 32-bit rdev (the kernel's new_encode_dev of it).
        rdev: meta.rdev() as u32,
        atime: ns(meta.atime(), meta.atime_nsec()),
        mtime: ns(meta.mtime(), meta.mtime_nsec()),
        ctime: ns(meta.ctime(), meta.ctime_nsec()),
        target,
        data: (kind == Kind::File).then(|| Overlay::clean(meta.len())),
        lookups: 0,
        opens: 0,
        base: None,
    })
}

/// Opens the backing file of `ino` into `inode.base` if it is not open (through its
/// durable path). Errors if it has none.
fn ensure_base(inode: &mut Inode, ino: u64, dnames: &Names, backing: &Path) -> io::Result<()> {
    if inode.base.is_none() {
        let rel = dnames
            .path(ino)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        inode.base = Some(open_backing(&backing.join(rel))?);
    }
    Ok(())
}

impl State {
    /// The model over backing directory `backing`, everything in it durable.
    pub(crate) fn load_from(backing: &Path) -> io::Result<State> {
        if !std::fs::metadata(backing)?.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let mut s = State {
            backing: backing.to_path_buf(),
            next_ino: ROOT + 1,
            inodes: HashMap::new(),
            vnames: Names::new(),
            dnames: Names::new(),
            log: Vec::new(),
            fail_fsync: Vec::new(),
            fail_fsyncdir: Vec::new(),
            counters: Counters::default(),
        };
        s.load()?;
        Ok(s)
    }

    /// Rebuilds the volatile view from the backing directory, with inode numbers never
    /// used before (an old one is stale: the kernel must not mistake new content for it).
    fn load(&mut self) -> io::Result<()> {
        self.inodes.clear();
        self.vnames = Names::new();
        self.dnames = Names::new();
        self.log.clear();
        let root = std::fs::metadata(&self.backing)?;
        self.inodes.insert(ROOT, inode_of(&root, &self.backing)?);
        let mut seen: HashMap<(u64, u64), u64> = HashMap::new();
        let mut stack = vec![(ROOT, self.backing.clone())];
        while let Some((dir, path)) = stack.pop() {
            let mut names = Vec::new();
            for e in std::fs::read_dir(&path)? {
                names.push(e?.file_name());
            }
            names.sort();
            for name in names {
                let p = path.join(&name);
                let meta = std::fs::symlink_metadata(&p)?;
                let key = (meta.dev(), meta.ino());
                let isdir = meta.is_dir();
                let ino = match seen.get(&key) {
                    Some(&ino) if !isdir => ino,
                    _ => {
                        let ino = self.next_ino;
                        self.next_ino += 1;
                        self.inodes.insert(ino, inode_of(&meta, &p)?);
                        seen.insert(key, ino);
                        if isdir {
                            stack.push((ino, p.clone()));
                        }
                        ino
                    }
                };
                let name = name.as_bytes();
                self.vnames.insert(dir, name, ino, isdir);
                self.dnames.insert(dir, name, ino, isdir);
            }
        }
        Ok(())
    }

    fn inode(&self, ino: u64) -> Res<&Inode> {
        self.inodes.get(&ino).ok_or(libc::ESTALE)
    }

    fn inode_mut(&mut self, ino: u64) -> Res<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(libc::ESTALE)
    }

    /// The attributes of `ino`.
    pub(crate) fn getattr(&self, ino: u64) -> Res<Attr> {
        let i = self.inode(ino)?;
        let nlink = match i.kind {
            Kind::Dir if self.vnames.contains(ino) => 2 + self.vnames.subdirs(ino),
            Kind::Dir => 0,
            _ => self.vnames.nlink(ino),
        };
        let size = match i.kind {
            Kind::File => i.data.as_ref().map_or(0, Overlay::size),
            Kind::Dir => 4096,
            Kind::Symlink => i.target.len() as u64,
            _ => 0,
        };
        Ok(Attr {
            ino,
            kind: i.kind,
            perm: i.perm,
            nlink: u32::try_from(nlink).unwrap_or(u32::MAX),
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            size,
            atime_ns: i.atime,
            mtime_ns: i.mtime,
            ctime_ns: i.ctime,
        })
    }

    /// The path of `ino` relative to the mount root (`""`: the root, or no name).
    pub(crate) fn path_of(&self, ino: u64) -> String {
        self.vnames
            .path(ino)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Checks that `parent` is a live directory and `name` a valid name.
    fn check_dir(&self, parent: u64, name: &[u8]) -> Res<()> {
        let p = self.inode(parent)?;
        if p.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        if !self.vnames.contains(parent) {
            return Err(libc::ENOENT);
        }
        if name.len() > NAME_MAX {
            return Err(libc::ENAMETOOLONG);
        }
        if name.is_empty() || name.contains(&b'/') {
            return Err(libc::EINVAL);
        }
        Ok(())
    }

    /// Looks `name` up in `parent` (one more kernel reference on success).
    pub(crate) fn lookup(&mut self, parent: u64, name: &[u8]) -> Res<Attr> {
        self.check_dir(parent, name)?;
        let ino = self.vnames.lookup(parent, name).ok_or(libc::ENOENT)?;
        let a = self.getattr(ino)?;
        self.inode_mut(ino)?.lookups += 1;
        Ok(a)
    }

    /// The kernel dropped `n` references to `ino`.
    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.lookups = i.lookups.saturating_sub(n);
        }
        self.maybe_free(ino);
    }

    /// Drops an inode nobody can reach any more.
    fn maybe_free(&mut self, ino: u64) {
        if ino == ROOT || self.vnames.contains(ino) {
            return;
        }
        if self
            .inodes
            .get(&ino)
            .is_some_and(|i| i.lookups == 0 && i.opens == 0)
        {
            self.inodes.remove(&ino);
        }
    }

    /// Creates an inode under `parent` and names it: the common part of mknod, mkdir
    /// and symlink. Returns its attributes.
    fn create_named(&mut self, c: Caller, parent: u64, name: &[u8], new: New) -> Res<Attr> {
        let New {
            kind,
            mut perm,
            rdev,
            target,
        } = new;
        self.check_dir(parent, name)?;
        if self.vnames.lookup(parent, name).is_some() {
            return Err(libc::EEXIST);
        }
        let (pperm, pgid) = {
            let p = self.inode(parent)?;
            (p.perm, p.gid)
        };
        // A setgid directory gives its group (and to a subdirectory, its setgid bit).
        let gid = if pperm & libc::S_ISGID != 0 {
            if kind == Kind::Dir {
                perm |= libc::S_ISGID;
            }
            pgid
        } else {
            c.gid
        };
        let ino = self.next_ino;
        self.next_ino += 1;
        let now = now_ns();
        self.inodes.insert(
            ino,
            Inode {
                kind,
                perm,
                uid: c.uid,
                gid,
                rdev,
                atime: now,
                mtime: now,
                ctime: now,
                target: target.clone(),
                data: (kind == Kind::File).then(|| Overlay::clean(0)),
                lookups: 1,
                opens: 0,
                base: None,
            },
        );
        self.vnames.insert(parent, name, ino, kind == Kind::Dir);
        self.touch_dir(parent, now);
        let name = name.to_vec();
        self.log.push(match kind {
            Kind::Dir => Op::Mkdir {
                parent,
                name,
                ino,
                mode: perm,
                uid: c.uid,
                gid,
            },
            Kind::Symlink => Op::Symlink {
                parent,
                name,
                ino,
                target,
                uid: c.uid,
                gid,
            },
            _ => Op::Mknod {
                parent,
                name,
                ino,
                mode: kind.ifmt() | perm,
                rdev,
                uid: c.uid,
                gid,
            },
        });
        self.getattr(ino)
    }

    /// A directory's entries changed at `now`.
    fn touch_dir(&mut self, dir: u64, now: i64) {
        if let Some(d) = self.inodes.get_mut(&dir) {
            d.mtime = now;
            d.ctime = now;
        }
    }

    /// `mknod` (and `create`): a regular file, fifo, socket or device.
    pub(crate) fn mknod(
        &mut self,
        c: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
    ) -> Res<Attr> {
        let kind = Kind::of_mode(mode).ok_or(libc::EINVAL)?;
        if matches!(kind, Kind::Dir | Kind::Symlink) {
            return Err(libc::EINVAL);
        }
        let new = New {
            kind,
            perm: mode & 0o7777,
            rdev,
            target: Vec::new(),
        };
        self.create_named(c, parent, name, new)
    }

    /// `mkdir`.
    pub(crate) fn mkdir(&mut self, c: Caller, parent: u64, name: &[u8], mode: u32) -> Res<Attr> {
        let new = New {
            kind: Kind::Dir,
            perm: mode & 0o7777,
            rdev: 0,
            target: Vec::new(),
        };
        self.create_named(c, parent, name, new)
    }

    /// `symlink`.
    pub(crate) fn symlink(
        &mut self,
        c: Caller,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Res<Attr> {
        if target.is_empty() {
            return Err(libc::ENOENT);
        }
        let new = New {
            kind: Kind::Symlink,
            perm: 0o777,
            rdev: 0,
            target: target.to_vec(),
        };
        self.create_named(c, parent, name, new)
    }

    /// `readlink`.
    pub(crate) fn readlink(&self, ino: u64) -> Res<Vec<u8>> {
        let i = self.inode(ino)?;
        if i.kind != Kind::Symlink {
            return Err(libc::EINVAL);
        }
        Ok(i.target.clone())
    }

    /// `link`: another name for `ino`.
    pub(crate) fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> Res<Attr> {
        self.check_dir(parent, name)?;
        let kind = self.inode(ino)?.kind;
        if kind == Kind::Dir {
            return Err(libc::EPERM);
        }
        if !self.vnames.contains(ino) {
            return Err(libc::ENOENT);
        }
        if self.vnames.lookup(parent, name).is_some() {
            return Err(libc::EEXIST);
        }
        self.vnames.insert(parent, name, ino, false);
        let now = now_ns();
        self.touch_dir(parent, now);
        let i = self.inode_mut(ino)?;
        i.ctime = now;
        i.lookups += 1;
        self.log.push(Op::Link {
            ino,
            parent,
            name: name.to_vec(),
        });
        self.getattr(ino)
    }

    /// `unlink`.
    pub(crate) fn unlink(&mut self, parent: u64, name: &[u8]) -> Res<()> {
        self.check_dir(parent, name)?;
        let ino = self.vnames.lookup(parent, name).ok_or(libc::ENOENT)?;
        if self.vnames.is_dir(ino) {
            return Err(libc::EISDIR);
        }
        self.vnames.remove(parent, name);
        let now = now_ns();
        self.touch_dir(parent, now);
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.ctime = now;
        }
        self.log.push(Op::Unlink {
            parent,
            name: name.to_vec(),
            ino,
        });
        self.maybe_free(ino);
        Ok(())
    }

    /// `rmdir`.
    pub(crate) fn rmdir(&mut self, parent: u64, name: &[u8]) -> Res<()> {
        self.check_dir(parent, name)?;
        if name == b"." {
            return Err(libc::EINVAL);
        }
        let ino = self.vnames.lookup(parent, name).ok_or(libc::ENOENT)?;
        if !self.vnames.is_dir(ino) {
            return Err(libc::ENOTDIR);
        }
        if !self.vnames.is_empty_dir(ino) {
            return Err(libc::ENOTEMPTY);
        }
        self.vnames.remove(parent, name);
        self.touch_dir(parent, now_ns());
        self.log.push(Op::Rmdir {
            parent,
            name: name.to_vec(),
            ino,
        });
        self.maybe_free(ino);
        Ok(())
    }

    /// `rename`, with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
    pub(crate) fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Res<()> {
        self.check_dir(parent, name)?;
        self.check_dir(newparent, newname)?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 || (noreplace && exchange)
        {
            return Err(libc::EINVAL);
        }
        let src = self.vnames.lookup(parent, name).ok_or(libc::ENOENT)?;
        let dst = self.vnames.lookup(newparent, newname);
        let src_dir = self.vnames.is_dir(src);
        if src_dir && self.vnames.is_ancestor(src, newparent) {
            return Err(libc::EINVAL);
        }
        let now = now_ns();
        if exchange {
            let dst = dst.ok_or(libc::ENOENT)?;
            if self.vnames.is_dir(dst) && self.vnames.is_ancestor(dst, parent) {
                return Err(libc::EINVAL);
            }
            if src == dst {
                return Ok(());
            }
            self.vnames.exchange(parent, name, newparent, newname);
        } else {
            if let Some(d) = dst {
                if noreplace {
                    return Err(libc::EEXIST);
                }
                if d == src {
                    return Ok(());
                }
                let d_dir = self.vnames.is_dir(d);
                if src_dir && !d_dir {
                    return Err(libc::ENOTDIR);
                }
                if !src_dir && d_dir {
                    return Err(libc::EISDIR);
                }
                if d_dir && !self.vnames.is_empty_dir(d) {
                    return Err(libc::ENOTEMPTY);
                }
            }
            self.vnames.rename(parent, name, newparent, newname);
        }
        self.touch_dir(parent, now);
        self.touch_dir(newparent, now);
        for i in [Some(src), dst].into_iter().flatten() {
            if let Some(i) = self.inodes.get_mut(&i) {
                i.ctime = now;
            }
        }
        self.log.push(Op::Rename {
            parent,
            name: name.to_vec(),
            newparent,
            newname: newname.to_vec(),
            flags,
            ino: src,
            other: dst,
        });
        if let Some(d) = dst {
            self.maybe_free(d);
        }
        Ok(())
    }

    /// `setattr`: a size is data (durable with the file's fsync), the rest is an
    /// operation of the log.
    pub(crate) fn setattr(&mut self, ino: u64, set: &SetAttr) -> Res<Attr> {
        let now = now_ns();
        let i = self.inode_mut(ino)?;
        if let Some(size) = set.size {
            match (i.kind, i.data.as_mut()) {
                (Kind::File, Some(d)) => {
                    if size > i64::MAX as u64 {
                        return Err(libc::EFBIG);
                    }
                    d.truncate(size);
                    i.mtime = now;
                    i.ctime = now;
                }
                (Kind::Dir, _) => return Err(libc::EISDIR),
                _ => return Err(libc::EINVAL),
            }
        }
        let resolve = |t: Option<SetTime>| {
            t.map(|t| match t {
                SetTime::Now => now,
                SetTime::At(ns) => ns,
            })
        };
        let (atime, mtime) = (resolve(set.atime), resolve(set.mtime));
        if set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
            && atime.is_none()
            && mtime.is_none()
        {
            return self.getattr(ino);
        }
        let mode = set.mode.map(|m| m & 0o7777);
        if let Some(m) = mode {
            i.perm = m;
        }
        if let Some(u) = set.uid {
            i.uid = u;
        }
        if let Some(g) = set.gid {
            i.gid = g;
        }
        if let Some(t) = atime {
            i.atime = t;
        }
        if let Some(t) = mtime {
            i.mtime = t;
        }
        i.ctime = now;
        self.log.push(Op::SetAttr {
            ino,
            mode,
            uid: set.uid,
            gid: set.gid,
            atime,
            mtime,
        });
        self.getattr(ino)
    }

    /// An open of `ino`.
    pub(crate) fn open(&mut self, ino: u64) -> Res<()> {
        self.inode_mut(ino)?.opens += 1;
        Ok(())
    }

    /// The last close of a handle of `ino`.
    pub(crate) fn release(&mut self, ino: u64) {
        let durable = self.dnames.contains(ino);
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.opens = i.opens.saturating_sub(1);
            if i.opens == 0 && durable {
                // Reopened through its durable path when needed again.
                i.base = None;
            }
        }
        self.maybe_free(ino);
    }

    /// The regular file `ino`, with its backing file open if reading needs it.
    fn file(&mut self, ino: u64) -> Res<&mut Inode> {
        let i = self.inodes.get_mut(&ino).ok_or(libc::EIO)?;
        match (i.kind, &i.data) {
            (Kind::File, Some(d)) => {
                if d.needs_base() {
                    ensure_base(i, ino, &self.dnames, &self.backing).map_err(|e| errno(&e))?;
                }
                Ok(i)
            }
            (Kind::Dir, _) => Err(libc::EISDIR),
            _ => Err(libc::EINVAL),
        }
    }

    /// Reads the file as the mount shows it.
    pub(crate) fn read(&mut self, ino: u64, offset: u64, len: u32) -> Res<Vec<u8>> {
        let i = self.file(ino)?;
        let base: &dyn Backing = match &i.base {
            Some(f) => f,
            None => &EMPTY,
        };
        match &i.data {
            Some(d) => d.read(offset, len, base).map_err(|e| errno(&e)),
            None => Err(libc::EINVAL),
        }
    }

    /// Writes into the overlay (never into the backing file).
    pub(crate) fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Res<u32> {
        let i = self.file(ino)?;
        let base: &dyn Backing = match &i.base {
            Some(f) => f,
            None => &EMPTY,
        };
        let d = i.data.as_mut().ok_or(libc::EINVAL)?;
        d.write(offset, data, base).map_err(|e| errno(&e))?;
        let now = now_ns();
        i.mtime = now;
        i.ctime = now;
        u32::try_from(data.len()).map_err(|_| libc::EINVAL)
    }

    /// `fallocate`: mode 0 grows the file (zeros); `FALLOC_FL_KEEP_SIZE` alone does
    /// nothing (space is not modelled); `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE` and
    /// `FALLOC_FL_ZERO_RANGE` (with or without `KEEP_SIZE`) write zeros, as unsynced
    /// data like any write. Other modes are not supported (`EOPNOTSUPP`).
    pub(crate) fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: i32) -> Res<()> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(libc::EFBIG)?;
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        if !matches!(mode, 0 | KEEP | PUNCH) && mode != ZERO && mode != ZERO | KEEP {
            return Err(libc::EOPNOTSUPP);
        }
        let i = self.file(ino)?;
        let base: &dyn Backing = match &i.base {
            Some(f) => f,
            None => &EMPTY,
        };
        let d = i.data.as_mut().ok_or(libc::EINVAL)?;
        if mode & KEEP == 0 && end > d.size() {
            d.truncate(end);
        }
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | ZERO) != 0 {
            d.zero(offset, end, base).map_err(|e| errno(&e))?;
            i.mtime = now_ns();
        }
        i.ctime = now_ns();
        Ok(())
    }

    /// The entries of directory `ino`, `.` and `..` first, then by name.
    pub(crate) fn readdir(&self, ino: u64) -> Res<Vec<DirEntry>> {
        if self.inode(ino)?.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        let mut out = vec![
            DirEntry {
                ino,
                kind: Kind::Dir,
                name: b".".to_vec(),
            },
            DirEntry {
                ino: self.vnames.parent(ino).unwrap_or(ROOT),
                kind: Kind::Dir,
                name: b"..".to_vec(),
            },
        ];
        for (name, child) in self.vnames.children(ino) {
            if let Some(c) = self.inodes.get(&child) {
                out.push(DirEntry {
                    ino: child,
                    kind: c.kind,
                    name,
                });
            }
        }
        Ok(out)
    }

    /// The backing directory.
    pub(crate) fn backing(&self) -> &Path {
        &self.backing
    }

    /// Takes one failure of the first rule of `rules` matching `path`.
    fn take_failure(rules: &mut Vec<Rule>, path: &str) -> bool {
        let hit = rules
            .iter_mut()
            .find(|r| r.left > 0 && matches(&r.pattern, path));
        let failed = match hit {
            Some(r) => {
                r.left -= 1;
                true
            }
            None => false,
        };
        rules.retain(|r| r.left > 0);
        failed
    }

    /// `fsync`/`fdatasync` of a file: the operations of the log about it (and all
    /// earlier ones) are applied to the backing directory, then its data is written to
    /// its backing file, which is synced. An injected failure drops the data instead.
    pub(crate) fn fsync(&mut self, ino: u64, datasync: bool) -> Res<()> {
        if !self.inodes.contains_key(&ino) {
            return Err(libc::EIO);
        }
        if datasync {
            self.counters.fdatasyncs += 1;
        } else {
            self.counters.fsyncs += 1;
        }
        let path = self.path_of(ino);
        if Self::take_failure(&mut self.fail_fsync, &path) {
            self.counters.injected_failures += 1;
            eprintln!(
                "deskfs-lossfs: injected EIO on fsync of {path:?}; its unsynced data is dropped"
            );
            self.drop_data(ino);
            return Err(libc::EIO);
        }
        if let Some(i) = self.log.iter().rposition(|op| op.is_about(ino)) {
            self.flush_checked(i + 1)?;
        }
        self.persist_file(ino, datasync).map_err(|e| errno(&e))
    }

    /// Forgets the unsynced data of `ino`: the file reverts to its backing content (as
    /// Linux marks pages clean after a failed writeback).
    fn drop_data(&mut self, ino: u64) {
        let Some(i) = self.inodes.get_mut(&ino) else {
            return;
        };
        if i.data.is_none() {
            return;
        }
        if i.base.is_none() && self.dnames.contains(ino) {
            let _ = ensure_base(i, ino, &self.dnames, &self.backing);
        }
        let len = match &i.base {
            Some(f) => f.metadata().map_or(0, |m| m.len()),
            None => 0,
        };
        i.data = Some(Overlay::clean(len));
    }

    /// Writes the unsynced data of `ino` to its backing file and syncs that. A file with
    /// no name on disk has nowhere to go: its data stays in memory.
    fn persist_file(&mut self, ino: u64, datasync: bool) -> io::Result<()> {
        let Some(i) = self.inodes.get_mut(&ino) else {
            return Ok(());
        };
        if !i.data.as_ref().is_some_and(Overlay::dirty) {
            return Ok(());
        }
        if i.base.is_none() {
            if !self.dnames.contains(ino) {
                return Ok(());
            }
            ensure_base(i, ino, &self.dnames, &self.backing)?;
        }
        let mtime = i.mtime;
        let (Some(d), Some(f)) = (i.data.as_mut(), i.base.as_mut()) else {
            return Ok(());
        };
        d.persist(f)?;
        // The backing file's mtime is the volatile one (the last write's, or what a
        // utimes set, made durable just before), not the time of this fsync.
        let times = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: mtime.div_euclid(1_000_000_000),
                tv_nsec: mtime.rem_euclid(1_000_000_000),
            },
        ];
        // SAFETY: a valid open file descriptor and two timespecs.
        check(unsafe { libc::futimens(std::os::fd::AsRawFd::as_raw_fd(f), times.as_ptr()) })?;
        if datasync {
            f.sync_data()
        } else {
            f.sync_all()
        }
    }

    /// `fsyncdir`: the operations of the log that change or are about directory `ino`
    /// (and all earlier ones) are applied to the backing directory.
    pub(crate) fn fsyncdir(&mut self, ino: u64) -> Res<()> {
        if !self.inodes.contains_key(&ino) {
            return Err(libc::EIO);
        }
        self.counters.fsyncdirs += 1;
        let path = self.path_of(ino);
        if Self::take_failure(&mut self.fail_fsyncdir, &path) {
            self.counters.injected_failures += 1;
            eprintln!("deskfs-lossfs: injected EIO on fsync of directory {path:?}");
            return Err(libc::EIO);
        }
        if let Some(i) = self.log.iter().rposition(|op| op.touches_dir(ino)) {
            self.flush_checked(i + 1)?;
        }
        Ok(())
    }

    /// Applies the first `n` operations of the log to the backing directory, in order,
    /// and syncs the directories they changed. Returns their descriptions.
    fn flush_log(&mut self, n: usize) -> Vec<String> {
        let n = n.min(self.log.len());
        let ops: Vec<Op> = self.log.drain(..n).collect();
        let mut dirs = BTreeSet::new();
        let mut done = Vec::with_capacity(ops.len());
        for op in &ops {
            done.push(op.describe(&self.dnames));
            if let Err(e) = self.apply(op, &mut dirs) {
                self.counters.apply_errors += 1;
                eprintln!(
                    "deskfs-lossfs: cannot make durable: {}: {e}",
                    op.describe(&self.dnames)
                );
            }
        }
        for d in dirs {
            if let Err(e) = File::open(&d).and_then(|f| f.sync_all()) {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    eprintln!("deskfs-lossfs: cannot sync {}: {e}", d.display());
                }
            }
        }
        done
    }

    /// [`State::flush_log`] for an fsync: `EIO` if the backing directory refused an
    /// operation (what was asked to be durable is not).
    fn flush_checked(&mut self, n: usize) -> Res<()> {
        let before = self.counters.apply_errors;
        self.flush_log(n);
        if self.counters.apply_errors > before {
            Err(libc::EIO)
        } else {
            Ok(())
        }
    }

    /// The backing path of directory entry `parent/name` of the durable namespace.
    fn dpath(&self, parent: u64, name: &[u8]) -> io::Result<PathBuf> {
        let dir = self
            .dnames
            .path(parent)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        Ok(self
            .backing
            .join(dir)
            .join(std::ffi::OsStr::from_bytes(name)))
    }

    /// Keeps the backing file of `ino` open if the volatile view still needs its content
    /// after its durable name goes.
    fn keep_base(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            if i.kind == Kind::File && self.dnames.nlink(ino) == 1 {
                let _ = ensure_base(i, ino, &self.dnames, &self.backing);
            }
        }
    }

    /// Applies one operation to the backing directory and the durable namespace.
    fn apply(&mut self, op: &Op, dirs: &mut BTreeSet<PathBuf>) -> io::Result<()> {
        let mut dir_of = |p: &Path| {
            if let Some(d) = p.parent() {
                dirs.insert(d.to_path_buf());
            }
        };
        match op {
            Op::Mknod {
                parent,
                name,
                ino,
                mode,
                rdev,
                uid,
                gid,
            } => {
                let p = self.dpath(*parent, name)?;
                if mode & libc::S_IFMT == libc::S_IFREG {
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(mode & 0o7777)
                        .open(&p)?;
                } else {
                    let c = cpath(&p)?;
                    // SAFETY: `c` is a NUL-terminated path.
                    check(unsafe {
                        libc::mknod(c.as_ptr(), *mode as libc::mode_t, libc::dev_t::from(*rdev))
                    })?;
                }
                self.finish_create(&p, *mode & 0o7777, *uid, *gid, false)?;
                self.dnames.insert(*parent, name, *ino, false);
                dir_of(&p);
            }
            Op::Mkdir {
                parent,
                name,
                ino,
                mode,
                uid,
                gid,
            } => {
                let p = self.dpath(*parent, name)?;
                std::fs::create_dir(&p)?;
                self.finish_create(&p, *mode, *uid, *gid, false)?;
                self.dnames.insert(*parent, name, *ino, true);
                dir_of(&p);
            }
            Op::Symlink {
                parent,
                name,
                ino,
                target,
                uid,
                gid,
            } => {
                let p = self.dpath(*parent, name)?;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &p)?;
                self.finish_create(&p, 0, *uid, *gid, true)?;
                self.dnames.insert(*parent, name, *ino, false);
                dir_of(&p);
            }
            Op::Link { ino, parent, name } => {
                let src = self
                    .dnames
                    .path(*ino)
                    .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
                let p = self.dpath(*parent, name)?;
                std::fs::hard_link(self.backing.join(src), &p)?;
                self.dnames.insert(*parent, name, *ino, false);
                dir_of(&p);
            }
            Op::Unlink { parent, name, ino } => {
                let p = self.dpath(*parent, name)?;
                self.keep_base(*ino);
                std::fs::remove_file(&p)?;
                self.dnames.remove(*parent, name);
                dir_of(&p);
            }
            Op::Rmdir { parent, name, .. } => {
                let p = self.dpath(*parent, name)?;
                std::fs::remove_dir(&p)?;
                self.dnames.remove(*parent, name);
                dir_of(&p);
            }
            Op::Rename {
                parent,
                name,
                newparent,
                newname,
                flags,
                other,
                ..
            } => {
                let from = self.dpath(*parent, name)?;
                let to = self.dpath(*newparent, newname)?;
                let exchange = flags & libc::RENAME_EXCHANGE != 0;
                if let (Some(o), false) = (other, exchange) {
                    self.keep_base(*o);
                }
                let (cf, ct) = (cpath(&from)?, cpath(&to)?);
                // SAFETY: two NUL-terminated paths relative to the working directory.
                check(unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        cf.as_ptr(),
                        libc::AT_FDCWD,
                        ct.as_ptr(),
                        *flags,
                    )
                })?;
                if exchange {
                    self.dnames.exchange(*parent, name, *newparent, newname);
                } else {
                    self.dnames.rename(*parent, name, *newparent, newname);
                }
                dir_of(&from);
                dir_of(&to);
            }
            Op::SetAttr {
                ino,
                mode,
                uid,
                gid,
                atime,
                mtime,
            } => {
                // An inode with no name on disk vanishes at a cut: nothing to persist.
                let Some(rel) = self.dnames.path(*ino) else {
                    return Ok(());
                };
                let p = self.backing.join(rel);
                let symlink = std::fs::symlink_metadata(&p)?.file_type().is_symlink();
                if let (Some(m), false) = (mode, symlink) {
                    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(*m))?;
                }
                if uid.is_some() || gid.is_some() {
                    std::os::unix::fs::lchown(&p, *uid, *gid)?;
                }
                if atime.is_some() || mtime.is_some() {
                    set_times(&p, *atime, *mtime)?;
                }
            }
        }
        Ok(())
    }

    /// Owner and exact mode of an entry just created in the backing directory.
    fn finish_create(
        &self,
        p: &Path,
        mode: u32,
        uid: u32,
        gid: u32,
        symlink: bool,
    ) -> io::Result<()> {
        // Only root may give files away; as another user they stay the daemon's.
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
        }
        if !symlink {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        }
        Ok(())
    }

    /// The `sync` command: everything becomes durable.
    pub(crate) fn sync(&mut self) -> Result<String, String> {
        self.counters.syncs += 1;
        let ops = self.log.len();
        let before = self.counters.apply_errors;
        self.flush_log(ops);
        let refused = self.counters.apply_errors - before;
        let mut inos: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.data.as_ref().is_some_and(Overlay::dirty))
            .map(|(&ino, _)| ino)
            .collect();
        inos.sort_unstable();
        let mut errors = 0;
        for &ino in &inos {
            if let Err(e) = self.persist_file(ino, false) {
                errors += 1;
                eprintln!(
                    "deskfs-lossfs: sync: cannot persist {}: {e}",
                    self.path_of(ino)
                );
            }
        }
        if let Ok(d) = File::open(&self.backing) {
            // SAFETY: a valid open file descriptor.
            unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) };
        }
        let done = format!(
            "synced {} of {ops} namespace ops and {} of {} files",
            ops as u64 - refused,
            inos.len() - errors,
            inos.len()
        );
        if refused > 0 || errors > 0 {
            Err(format!("{done} (the rest failed: see stderr)"))
        } else {
            Ok(done)
        }
    }

    /// The inodes the kernel may still hold (to invalidate after a cut).
    pub(crate) fn referenced(&self) -> Vec<u64> {
        self.inodes
            .iter()
            .filter(|(&ino, i)| ino != ROOT && (i.lookups > 0 || i.opens > 0))
            .map(|(&ino, _)| ino)
            .collect()
    }

    /// A power cut: everything not durable is lost and the volatile view becomes the
    /// backing directory again (new inode numbers). With `reorder`, first a random
    /// prefix of the log and a random half of the pending pages (and size changes) are
    /// made durable, as a disk may have written them, seeded so it is reproducible.
    /// Returns what was kept.
    pub(crate) fn cut(&mut self, reorder: Option<u64>) -> io::Result<String> {
        let pending_ops = self.log.len();
        let mut report = format!("dropped {pending_ops} namespace ops");
        if let Some(seed) = reorder {
            let mut rng = Rng::new(seed);
            let k = rng.up_to(pending_ops);
            let kept_ops = self.flush_log(k);
            eprintln!(
                "deskfs-lossfs: cut --reorder {seed}: kept {k}/{pending_ops} namespace ops: [{}]",
                kept_ops.join(", ")
            );
            report = format!(
                "kept {k}/{pending_ops} namespace ops [{}]",
                abridged(&kept_ops, ", ")
            );
            let mut files: Vec<(PathBuf, u64)> = self
                .inodes
                .iter()
                .filter(|(&ino, i)| {
                    i.data.as_ref().is_some_and(Overlay::dirty) && self.dnames.contains(ino)
                })
                .filter_map(|(&ino, _)| self.dnames.path(ino).map(|p| (p, ino)))
                .collect();
            files.sort();
            let mut parts = Vec::new();
            for (path, ino) in files {
                let keep_size = rng.coin();
                let r: io::Result<Kept> = (|| {
                    let Some(i) = self.inodes.get_mut(&ino) else {
                        return Ok(Kept::default());
                    };
                    ensure_base(i, ino, &self.dnames, &self.backing)?;
                    let (Some(d), Some(f)) = (i.data.as_ref(), i.base.as_mut()) else {
                        return Ok(Kept::default());
                    };
                    let kept = d.persist_some(f, keep_size, &mut |_| rng.coin())?;
                    f.sync_data()?;
                    Ok(kept)
                })();
                match r {
                    Ok(k) => parts.push(format!(
                        "{}: pages {:?} of {}, size {}",
                        path.display(),
                        k.pages,
                        k.of,
                        if k.size { "kept" } else { "lost" }
                    )),
                    Err(e) => {
                        self.counters.apply_errors += 1;
                        parts.push(format!("{}: error {e}", path.display()));
                    }
                }
            }
            eprintln!(
                "deskfs-lossfs: cut --reorder {seed}: data: [{}]",
                parts.join("; ")
            );
            report.push_str(&format!("; data: [{}]", abridged(&parts, "; ")));
        }
        self.counters.cuts += 1;
        // Close every backing file before reloading.
        self.inodes.clear();
        self.load()?;
        Ok(report)
    }

    /// The `fail-fsync` (`dir` false) and `fail-fsyncdir` commands: the next `count`
    /// syncs of paths matching `pattern` fail with EIO.
    pub(crate) fn add_failure(&mut self, dir: bool, pattern: &str, count: u64) {
        let rules = if dir {
            &mut self.fail_fsyncdir
        } else {
            &mut self.fail_fsync
        };
        rules.push(Rule {
            pattern: pattern.to_owned(),
            left: count,
        });
        rules.retain(|r| r.left > 0);
    }

    /// A crash image: what a power cut now would leave, copied to `dest/disk` (the
    /// backing directory: only what was made durable; nothing pending), after each of
    /// `extra` (directories outside this file system, such as a `file://` bucket, whose
    /// files are replaced by rename and never changed in place: hard-linked to
    /// `dest/<their name>`, so they keep their inode numbers and times, which a
    /// `file://` bucket's ETags are made of) — all while the caller holds the state's lock, so no
    /// operation becomes durable during the copy and the image is one instant. Returns a
    /// report line. Errors: a failed copy (`dest` is then incomplete).
    pub(crate) fn image(&self, dest: &Path, extra: &[PathBuf]) -> io::Result<String> {
        std::fs::create_dir_all(dest)?;
        let mut report = Vec::new();
        for dir in extra {
            let name = dir.file_name().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} has no name", dir.display()),
                )
            })?;
            let (files, _) = crate::util::copy_tree(dir, &dest.join(name), FileCopy::Link)?;
            report.push(format!("{}: {files} files", name.to_string_lossy()));
        }
        let (files, skipped) =
            crate::util::copy_tree(&self.backing, &dest.join("disk"), FileCopy::Bytes)?;
        report.insert(
            0,
            format!(
                "disk: {files} files ({} pending ops left out)",
                self.log.len()
            ),
        );
        if skipped > 0 {
            report.push(format!("{skipped} special files skipped"));
        }
        Ok(report.join(", "))
    }

    /// The `stats` command's JSON.
    pub(crate) fn stats(&self) -> serde_json::Value {
        let mut bytes = 0;
        let mut files = 0;
        for i in self.inodes.values() {
            if let Some(d) = &i.data {
                if d.dirty() {
                    files += 1;
                    bytes += d.pending_bytes();
                }
            }
        }
        let c = &self.counters;
        serde_json::json!({
            "pending_data_bytes": bytes,
            "pending_files": files,
            "pending_namespace_ops": self.log.len(),
            "fsyncs": c.fsyncs,
            "fdatasyncs": c.fdatasyncs,
            "fsyncdirs": c.fsyncdirs,
            "syncs": c.syncs,
            "cuts": c.cuts,
            "injected_failures": c.injected_failures,
            "apply_errors": c.apply_errors,
            "inodes": self.inodes.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Caller = Caller { uid: 0, gid: 0 };

    fn new_state() -> (tempfile::TempDir, State) {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = State::load_from(dir.path()).expect("load");
        (dir, s)
    }

    fn create(s: &mut State, parent: u64, name: &str, data: &[u8]) -> u64 {
        let a = s
            .mknod(ME, parent, name.as_bytes(), libc::S_IFREG | 0o644, 0)
            .expect("create");
        s.write(a.ino, 0, data).expect("write");
        a.ino
    }

    fn read_all(s: &mut State, ino: u64) -> Vec<u8> {
        s.read(ino, 0, u32::MAX).expect("read")
    }

    fn lookup(s: &mut State, path: &str) -> Res<u64> {
        let mut cur = ROOT;
        for part in path.split('/') {
            cur = s.lookup(cur, part.as_bytes())?.ino;
        }
        Ok(cur)
    }

    #[test]
    fn an_image_holds_what_a_cut_would_leave_and_the_view_goes_on() {
        let (dir, mut s) = new_state();
        let kept = create(&mut s, ROOT, "kept", b"durable");
        s.fsync(kept, false).expect("fsync");
        s.write(kept, 0, b"PENDING").expect("write");
        let _lost = create(&mut s, ROOT, "lost", b"never synced");
        let out = tempfile::tempdir().expect("tempdir");
        let extra = tempfile::tempdir().expect("tempdir");
        std::fs::write(extra.path().join("obj"), b"bucket object").expect("seed");
        let dest = out.path().join("img");
        let report = s
            .image(&dest, &[extra.path().to_path_buf()])
            .expect("image");
        assert!(report.contains("pending ops left out"), "{report}");
        assert_eq!(
            std::fs::read(dest.join("disk/kept")).expect("read"),
            b"durable"
        );
        assert!(
            !dest.join("disk/lost").exists(),
            "an unsynced create in the image"
        );
        let name = extra.path().file_name().expect("name");
        assert_eq!(
            std::fs::read(dest.join(name).join("obj")).expect("read"),
            b"bucket object"
        );
        // The live view is untouched: the pending write and file are still there.
        assert_eq!(read_all(&mut s, kept), b"PENDING");
        assert!(lookup(&mut s, "lost").is_ok());
        // Restored into the backing directory, a cut shows exactly the image.
        s.cut(None).expect("cut");
        let kept = lookup(&mut s, "kept").expect("lookup");
        assert_eq!(read_all(&mut s, kept), b"durable");
        assert_eq!(lookup(&mut s, "lost"), Err(libc::ENOENT));
        let _ = dir;
    }

    #[test]
    fn writes_stay_in_memory_until_fsync() {
        let (dir, mut s) = new_state();
        std::fs::write(dir.path().join("f"), b"old").expect("seed");
        let mut s2 = State::load_from(dir.path()).expect("load");
        std::mem::swap(&mut s, &mut s2);
        let f = lookup(&mut s, "f").expect("lookup");
        s.write(f, 0, b"NEW!").expect("write");
        assert_eq!(read_all(&mut s, f), b"NEW!");
        assert_eq!(std::fs::read(dir.path().join("f")).expect("read"), b"old");
        s.fsync(f, true).expect("fsync");
        assert_eq!(std::fs::read(dir.path().join("f")).expect("read"), b"NEW!");
        s.write(f, 1, b"xx").expect("write");
        s.cut(None).expect("cut");
        let f = lookup(&mut s, "f").expect("lookup");
        assert_eq!(read_all(&mut s, f), b"NEW!");
    }

    #[test]
    fn fsync_of_a_new_file_makes_its_entry_and_earlier_ops_durable() {
        let (dir, mut s) = new_state();
        let d = s.mkdir(ME, ROOT, b"d", 0o755).expect("mkdir").ino;
        let a = create(&mut s, d, "a", b"aaa");
        let _b = create(&mut s, ROOT, "b", b"bbb");
        assert!(!dir.path().join("d").exists());
        s.fsync(a, false).expect("fsync");
        // The prefix up to a's creation: d and d/a, not b (created after).
        assert_eq!(std::fs::read(dir.path().join("d/a")).expect("read"), b"aaa");
        assert!(!dir.path().join("b").exists());
        s.cut(None).expect("cut");
        assert!(lookup(&mut s, "d/a").is_ok());
        assert_eq!(lookup(&mut s, "b"), Err(libc::ENOENT));
    }

    #[test]
    fn fsyncdir_makes_the_prefix_durable_and_rename_needs_it() {
        let (dir, mut s) = new_state();
        let t = create(&mut s, ROOT, "tmp", b"v1");
        s.fsync(t, false).expect("fsync");
        s.rename(ROOT, b"tmp", ROOT, b"final", 0).expect("rename");
        let other = create(&mut s, ROOT, "later", b"x");
        let _ = other;
        assert!(dir.path().join("tmp").exists());
        assert!(!dir.path().join("final").exists());
        s.fsyncdir(ROOT).expect("fsyncdir");
        assert!(dir.path().join("final").exists());
        assert!(!dir.path().join("tmp").exists());
        // `later` was created in the root too: its entry is durable, its data is not.
        assert_eq!(std::fs::read(dir.path().join("later")).expect("read"), b"");
        assert_eq!(s.stats()["pending_namespace_ops"], 0);
    }

    #[test]
    fn unsynced_create_is_gone_after_cut() {
        let (dir, mut s) = new_state();
        create(&mut s, ROOT, "f", b"data");
        s.cut(None).expect("cut");
        assert_eq!(lookup(&mut s, "f"), Err(libc::ENOENT));
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
    }

    #[test]
    fn stale_inodes_after_cut() {
        let (_dir, mut s) = new_state();
        let f = create(&mut s, ROOT, "f", b"data");
        s.fsync(f, false).expect("fsync");
        s.cut(None).expect("cut");
        assert_eq!(s.read(f, 0, 10), Err(libc::EIO));
        assert_eq!(s.getattr(f), Err(libc::ESTALE));
        let g = lookup(&mut s, "f").expect("lookup");
        assert_ne!(f, g);
    }

    #[test]
    fn injected_fsync_failure_drops_the_data() {
        let (dir, mut s) = new_state();
        let f = create(&mut s, ROOT, "db-wal", b"one");
        s.fsync(f, false).expect("fsync");
        s.write(f, 3, b"two").expect("write");
        s.add_failure(false, "*-wal", 1);
        assert_eq!(s.fsync(f, false), Err(libc::EIO));
        // Pages are "clean": the mount shows the durable content again.
        assert_eq!(read_all(&mut s, f), b"one");
        s.write(f, 3, b"333").expect("write");
        s.fsync(f, false).expect("second fsync");
        assert_eq!(
            std::fs::read(dir.path().join("db-wal")).expect("read"),
            b"one333"
        );
        assert_eq!(s.stats()["injected_failures"], 1);
        // A non-matching pattern does not fail.
        s.add_failure(false, "shm", 1);
        s.fsync(f, false).expect("fsync");
    }

    #[test]
    fn truncate_is_durable_with_fsync() {
        let (dir, mut s) = new_state();
        let f = create(&mut s, ROOT, "f", &[7u8; 10000]);
        s.fsync(f, false).expect("fsync");
        let set = SetAttr {
            size: Some(10),
            ..SetAttr::default()
        };
        s.setattr(f, &set).expect("truncate");
        assert_eq!(s.getattr(f).expect("attr").size, 10);
        assert_eq!(
            std::fs::metadata(dir.path().join("f")).expect("stat").len(),
            10000
        );
        s.fsync(f, true).expect("fsync");
        assert_eq!(
            std::fs::metadata(dir.path().join("f")).expect("stat").len(),
            10
        );
    }

    #[test]
    fn utimes_survives_a_later_data_fsync() {
        let (dir, mut s) = new_state();
        let f = create(&mut s, ROOT, "f", b"data");
        let set = SetAttr {
            mtime: Some(SetTime::At(2_000_000_000_000_000_000)),
            ..SetAttr::default()
        };
        s.setattr(f, &set).expect("utimes");
        s.fsync(f, false).expect("fsync");
        let meta = std::fs::metadata(dir.path().join("f")).expect("stat");
        assert_eq!(meta.mtime(), 2_000_000_000);
    }

    #[test]
    fn unlink_while_open_keeps_content() {
        let (_dir, mut s) = new_state();
        let f = create(&mut s, ROOT, "f", b"content");
        s.fsync(f, false).expect("fsync");
        s.open(f).expect("open");
        s.unlink(ROOT, b"f").expect("unlink");
        s.fsyncdir(ROOT)
            .expect("fsyncdir: the unlink reaches the disk");
        assert_eq!(read_all(&mut s, f), b"content");
        s.release(f);
    }

    /// Runs the same operations on a fresh backing directory and cuts with `seed`;
    /// returns the report and the surviving tree.
    fn reorder_run(seed: u64) -> (String, Vec<(String, Vec<u8>)>) {
        let (dir, mut s) = new_state();
        let base = create(&mut s, ROOT, "base", &[1u8; 8 * 4096]);
        s.fsync(base, false).expect("fsync");
        for i in 0..8u64 {
            s.write(base, i * 4096, &[2u8; 100]).expect("write");
        }
        for i in 0..6 {
            create(&mut s, ROOT, &format!("n{i}"), b"x");
        }
        let report = s.cut(Some(seed)).expect("cut");
        let mut tree = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        for n in names {
            let data = std::fs::read(dir.path().join(&n)).expect("read");
            tree.push((n.to_string_lossy().into_owned(), data));
        }
        (report, tree)
    }

    #[test]
    fn reorder_is_reproducible_and_keeps_a_prefix() {
        let (r1, t1) = reorder_run(7);
        let (r2, t2) = reorder_run(7);
        assert_eq!(r1, r2);
        assert_eq!(t1, t2);
        // Over several seeds: a prefix of the creations survives, and both kept and
        // lost pages occur.
        let mut kept_pages = 0;
        let mut lost_pages = 0;
        let mut sizes = BTreeSet::new();
        for seed in 0..20 {
            let (_, t) = reorder_run(seed);
            let names: Vec<&str> = t.iter().map(|(n, _)| n.as_str()).collect();
            let created: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| n.starts_with('n'))
                .collect();
            let want: Vec<String> = (0..created.len()).map(|i| format!("n{i}")).collect();
            assert_eq!(created, want, "seed {seed}: not a prefix");
            let base = &t.iter().find(|(n, _)| n == "base").expect("base").1;
            for i in 0..8 {
                match base[i * 4096] {
                    2 => kept_pages += 1,
                    1 => lost_pages += 1,
                    b => panic!("seed {seed}: page {i} is {b}"),
                }
            }
            sizes.insert(created.len());
        }
        assert!(kept_pages > 0 && lost_pages > 0);
        assert!(sizes.len() > 2, "prefix lengths {sizes:?}");
    }

    #[test]
    fn rename_exchange_and_noreplace() {
        let (dir, mut s) = new_state();
        let a = create(&mut s, ROOT, "a", b"A");
        let b = create(&mut s, ROOT, "b", b"B");
        assert_eq!(
            s.rename(ROOT, b"a", ROOT, b"b", libc::RENAME_NOREPLACE),
            Err(libc::EEXIST)
        );
        s.rename(ROOT, b"a", ROOT, b"b", libc::RENAME_EXCHANGE)
            .expect("exchange");
        assert_eq!(lookup(&mut s, "a"), Ok(b));
        s.fsync(a, false).expect("fsync");
        s.fsync(b, false).expect("fsync");
        assert_eq!(std::fs::read(dir.path().join("a")).expect("read"), b"B");
        assert_eq!(std::fs::read(dir.path().join("b")).expect("read"), b"A");
    }
}
