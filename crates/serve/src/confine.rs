//! Paths confined to one desk. A desk is held as an `O_PATH` descriptor of its directory;
//! every path an interface receives is first checked as text ([`RelPath::parse`]: no NUL,
//! not absolute, no `..`, names ≤ 255 bytes, ≤ 4,096 bytes in all) and then resolved
//! by the kernel from that descriptor with `openat2(2)` and `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS` (Linux ≥ 5.6): a symlink an agent planted that points out of
//! the desk, or one swapped in between a check and a use, fails with `EXDEV` (reported as
//! `outside_desk`) instead of being followed out. Changes resolve the parent directory
//! that way and then act on one plain name relative to it (`openat` with `O_EXCL`,
//! `renameat2`, `unlinkat`, `mkdirat`), which cannot leave the parent either.
//!
//! Writes replace atomically: the content goes to a temporary file in the same
//! directory, is `fsync`ed, and is renamed over the name (readers see the old file or the
//! new one, never a mix; deskfs makes the rename durable with the file's commit).

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::error::{Code, Result, ServeError};

/// Longest name of one path component, bytes (Linux `NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Longest path, bytes (Linux `PATH_MAX`).
pub const PATH_MAX: usize = 4096;

/// A path inside a desk, checked as text: relative, without NUL, `..` or over-long
/// names. The empty path is the desk's root directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelPath {
    parts: Vec<String>,
}

impl RelPath {
    /// The desk's root directory.
    pub fn root() -> RelPath {
        RelPath { parts: Vec::new() }
    }

    /// Checks `s` (`a/b/c`; empty and `.` components are skipped).
    ///
    /// # Errors
    /// `bad_path` (a NUL byte), `outside_desk` (absolute, or a `..` component),
    /// `name_too_long` (a component over [`NAME_MAX`] bytes), `path_too_long` (over
    /// [`PATH_MAX`] bytes).
    pub fn parse(s: &str) -> Result<RelPath> {
        if s.contains('\0') {
            return Err(ServeError::new(
                Code::BadPath,
                format!("path {s:?} contains a NUL byte; send the name without it"),
            ));
        }
        if s.len() > PATH_MAX {
            return Err(ServeError::new(
                Code::PathTooLong,
                format!(
                    "path of {} bytes is longer than {PATH_MAX}; use a shorter path",
                    s.len()
                ),
            ));
        }
        if s.starts_with('/') {
            return Err(ServeError::new(
                Code::OutsideDesk,
                format!("absolute path {s:?}: paths are relative to the desk's root (drop the leading '/')"),
            ));
        }
        let mut parts = Vec::new();
        for c in s.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    return Err(ServeError::new(
                        Code::OutsideDesk,
                        format!("path {s:?} has a '..' component; paths stay inside the desk"),
                    ))
                }
                c if c.len() > NAME_MAX => {
                    return Err(ServeError::new(
                        Code::NameTooLong,
                        format!(
                        "name of {} bytes in {s:?} is longer than {NAME_MAX}; use a shorter name",
                        c.len()
                    ),
                    ))
                }
                c => parts.push(c.to_owned()),
            }
        }
        Ok(RelPath { parts })
    }

    /// Whether this is the desk's root.
    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The path as shown in messages and results (`a/b`; empty for the root).
    pub fn display(&self) -> String {
        self.parts.join("/")
    }

    /// `self/name` (`name` one checked component).
    pub fn join(&self, name: &str) -> RelPath {
        let mut parts = self.parts.clone();
        parts.push(name.to_owned());
        RelPath { parts }
    }

    /// The path a symlink in this directory with `target` names (relative targets only;
    /// `..` pops a component). Errors when the target is absolute, empty or leaves the
    /// desk.
    pub fn resolve_link(&self, target: &str) -> Result<RelPath> {
        let out = || ServeError::new(Code::OutsideDesk, "the link leads out of the desk");
        if target.is_empty() || target.starts_with('/') || target.contains('\0') {
            return Err(out());
        }
        let mut parts = self.parts.clone();
        for c in target.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    parts.pop().ok_or_else(out)?;
                }
                c if c.len() > NAME_MAX => return Err(out()),
                c => parts.push(c.to_owned()),
            }
        }
        if parts.is_empty() {
            return Err(out());
        }
        Ok(RelPath { parts })
    }

    /// The parent and the last name; `None` for the root.
    pub fn split_last(&self) -> Option<(RelPath, &str)> {
        let (last, rest) = self.parts.split_last()?;
        Some((
            RelPath {
                parts: rest.to_vec(),
            },
            last.as_str(),
        ))
    }

    fn c_path(&self) -> CString {
        let s = if self.parts.is_empty() {
            ".".to_owned()
        } else {
            self.parts.join("/")
        };
        // `parse` refused NUL bytes.
        CString::new(s).unwrap_or_default()
    }
}

/// What a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by `stat` and `list`).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// Attributes of one path (`lstat`: a symlink is described, not followed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stat {
    /// Desk-relative path (empty for the root).
    pub path: String,
    /// What it is.
    pub kind: Kind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Last modification, ns since the epoch.
    pub mtime_ns: i64,
    /// The entity tag of this version: `"<ino>-<mtime ns>-<size>"` in hex, quoted as in
    /// HTTP. An atomic replace makes a new inode, so two versions never share one.
    pub etag: String,
    /// A symlink's target (only for symlinks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Last access, ns since the epoch (not in the HTTP API's JSON).
    #[serde(skip)]
    pub atime_ns: i64,
    /// Last status change, ns since the epoch (not in the HTTP API's JSON).
    #[serde(skip)]
    pub ctime_ns: i64,
}

impl Stat {
    fn of(path: &RelPath, st: &libc::stat, target: Option<String>) -> Stat {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        };
        let mtime_ns = st.st_mtime * 1_000_000_000 + st.st_mtime_nsec;
        Stat {
            path: path.display(),
            kind,
            size: st.st_size as u64,
            mode: st.st_mode & 0o7777,
            mtime_ns,
            etag: format!("\"{:x}-{:x}-{:x}\"", st.st_ino, mtime_ns, st.st_size),
            target,
            atime_ns: st.st_atime * 1_000_000_000 + st.st_atime_nsec,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        }
    }
}

/// A condition on the current version for a write (HTTP `If-Match` / `If-None-Match`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// None: create or replace.
    None,
    /// `If-Match: *`: the file must exist.
    Exists,
    /// `If-Match: "<etag>"`: the file must exist with this ETag.
    Etag(String),
    /// `If-None-Match: *`: the file must not exist (create only).
    Absent,
}

/// One desk, held open: every path is resolved beneath it.
#[derive(Debug)]
pub struct DeskDir {
    fd: OwnedFd,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| ServeError::new(Code::BadPath, "name contains a NUL byte"))
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// `openat2(dir, path, flags | O_CLOEXEC, mode)` resolving beneath `dir` without magic
/// links; retried on `EAGAIN` (a rename raced the resolution) and `EINTR`.
fn openat2(dir: RawFd, path: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    let mut tries = 0;
    loop {
        // SAFETY: `path` is a valid C string, `how` a valid `open_how` of the size passed;
        // the kernel returns a new descriptor or -1.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if rc >= 0 {
            // SAFETY: a descriptor the kernel just gave us, owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) });
        }
        let e = last_err();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) if tries < 64 => tries += 1,
            _ => return Err(e),
        }
    }
}

fn fstatat(dir: RawFd, name: &CStr, flags: i32) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid C string; `st` is written by the call before it is read.
    let rc = unsafe { libc::fstatat(dir, name.as_ptr(), st.as_mut_ptr(), flags) };
    if rc != 0 {
        return Err(last_err());
    }
    // SAFETY: fstatat returned 0, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

fn readlinkat(dir: RawFd, name: &CStr) -> io::Result<String> {
    let mut buf = vec![0u8; PATH_MAX + 1];
    // SAFETY: valid C string and a buffer of the length passed.
    let n = unsafe {
        libc::readlinkat(
            dir,
            name.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    };
    if n < 0 {
        return Err(last_err());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(last_err())
    }
}

/// Entries of the directory open at `fd` (without `.` and `..`), as raw names.
fn read_names(fd: &OwnedFd) -> io::Result<Vec<Vec<u8>>> {
    // fdopendir takes the descriptor: give it a duplicate.
    // SAFETY: plain syscalls on a descriptor we own; `dirp` is used only while open and
    // closed once.
    unsafe {
        let dup = libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0);
        if dup < 0 {
            return Err(last_err());
        }
        let dirp = libc::fdopendir(dup);
        if dirp.is_null() {
            let e = last_err();
            libc::close(dup);
            return Err(e);
        }
        let mut names = Vec::new();
        loop {
            *libc::__errno_location() = 0;
            let ent = libc::readdir(dirp);
            if ent.is_null() {
                let errno = *libc::__errno_location();
                libc::closedir(dirp);
                if errno != 0 {
                    return Err(io::Error::from_raw_os_error(errno));
                }
                break;
            }
            let name = CStr::from_ptr((*ent).d_name.as_ptr()).to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        Ok(names)
    }
}

impl DeskDir {
    /// Holds the desk directory `dir` (which must be a directory, not a symlink).
    ///
    /// # Errors
    /// `unknown_desk` when it is not a directory; `io` otherwise.
    pub fn open(dir: &Path) -> Result<DeskDir> {
        use std::os::unix::ffi::OsStrExt;
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| ServeError::new(Code::BadPath, "desk path contains a NUL byte"))?;
        // SAFETY: valid C string; a new descriptor or -1.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(ServeError::new(
                Code::UnknownDesk,
                format!("cannot open desk {}: {}", dir.display(), last_err()),
            ));
        }
        // SAFETY: a descriptor the kernel just gave us.
        Ok(DeskDir {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn resolve(&self, p: &RelPath, flags: i32, doing: &str) -> Result<OwnedFd> {
        openat2(self.fd.as_raw_fd(), &p.c_path(), flags, 0)
            .map_err(|e| ServeError::io(doing, &p.display(), e))
    }

    /// The parent directory of `p` (resolved beneath the desk) and `p`'s last name.
    /// Errors: `bad_path` for the root itself; resolution errors of the parent.
    fn parent(&self, p: &RelPath, doing: &str) -> Result<(OwnedFd, CString)> {
        self.parent_with(p, doing, libc::O_PATH | libc::O_DIRECTORY)
    }

    /// [`DeskDir::parent`] with the parent opened with `flags`.
    fn parent_with(&self, p: &RelPath, doing: &str, flags: i32) -> Result<(OwnedFd, CString)> {
        let Some((dir, name)) = p.split_last() else {
            return Err(ServeError::new(
                Code::BadPath,
                format!("cannot {doing} the desk's root directory; name a path inside it"),
            ));
        };
        let fd = openat2(self.fd.as_raw_fd(), &dir.c_path(), flags, 0)
            .map_err(|e| ServeError::io(doing, &p.display(), e))?;
        Ok((fd, cstr(name)?))
    }

    /// Attributes of `p` (a symlink is described, not followed).
    ///
    /// # Errors
    /// `not_found`, `not_dir`, `outside_desk` (a parent resolves out), `io`.
    pub fn stat(&self, p: &RelPath) -> Result<Stat> {
        if p.is_root() {
            let st = fstatat(self.fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
                .map_err(|e| ServeError::io("stat", "", e))?;
            return Ok(Stat::of(p, &st, None));
        }
        let (dir, name) = self.parent(p, "stat")?;
        let st = fstatat(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| ServeError::io("stat", &p.display(), e))?;
        let target = if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            readlinkat(dir.as_raw_fd(), &name).ok()
        } else {
            None
        };
        Ok(Stat::of(p, &st, target))
    }

    /// Opens the regular file `p` for reading (symlinks followed only while they stay
    /// inside the desk), with its attributes.
    ///
    /// # Errors
    /// `not_found`, `is_dir`, `outside_desk`, `io`.
    pub fn open_read(&self, p: &RelPath) -> Result<(File, Stat)> {
        // Non-blocking: a FIFO must not hold the request (only regular files are read).
        let fd = self.resolve(
            p,
            libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
            "read",
        )?;
        let st = fstatat(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
            .map_err(|e| ServeError::io("read", &p.display(), e))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(ServeError::new(
                Code::IsDir,
                format!(
                    "cannot read {}: it is a directory; list it instead",
                    p.display()
                ),
            ));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(ServeError::new(
                Code::Conflict,
                format!(
                    "cannot read {}: not a regular file (a FIFO, socket or device)",
                    p.display()
                ),
            ));
        }
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) };
        Ok((File::from(fd), Stat::of(p, &st, None)))
    }

    /// The entries of directory `p`, sorted by name, each described without following
    /// symlinks. Entries whose names are not UTF-8 are shown with U+FFFD.
    ///
    /// # Errors
    /// `not_found`, `not_dir`, `outside_desk`, `io`.
    pub fn list(&self, p: &RelPath) -> Result<Vec<Stat>> {
        let fd = self.resolve(p, libc::O_RDONLY | libc::O_DIRECTORY, "list")?;
        let names = read_names(&fd).map_err(|e| ServeError::io("list", &p.display(), e))?;
        let mut out = Vec::with_capacity(names.len());
        for raw in names {
            let Ok(c) = CString::new(raw.clone()) else {
                continue;
            };
            let Ok(st) = fstatat(fd.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW) else {
                continue; // removed meanwhile
            };
            let name = String::from_utf8_lossy(&raw).into_owned();
            let target = if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                readlinkat(fd.as_raw_fd(), &c).ok()
            } else {
                None
            };
            out.push(Stat::of(&p.join(&name), &st, target));
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Makes directory `p` (mode 0755 less the umask); with `parents`, also its missing
    /// parents, and an existing directory is fine.
    ///
    /// # Errors
    /// `exists` (without `parents`, or a non-directory in the way), `not_found` (a
    /// missing parent without `parents`), `outside_desk`, `io`.
    pub fn mkdir(&self, p: &RelPath, parents: bool) -> Result<()> {
        if !parents {
            let (dir, name) = self.parent(p, "create directory")?;
            // SAFETY: valid C string, a descriptor we own.
            return check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) })
                .map_err(|e| ServeError::io("create directory", &p.display(), e));
        }
        let mut at = RelPath::root();
        for part in &p.parts {
            at = at.join(part);
            let (dir, name) = self.parent(&at, "create directory")?;
            // SAFETY: as above.
            let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) };
            if rc != 0 {
                let e = last_err();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(ServeError::io("create directory", &at.display(), e));
                }
                let st = fstatat(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)
                    .map_err(|e| ServeError::io("create directory", &at.display(), e))?;
                if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(ServeError::new(
                        Code::Exists,
                        format!(
                            "cannot create directory {}: {} exists and is not a directory",
                            p.display(),
                            at.display()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The path a write of `p` lands on: `p` itself, or, when `p` names a symlink, the
    /// path inside the desk it points at (followed up to 40 times, as the kernel does), so
    /// a write reaches the file a read of `p` returns (`CLAUDE.md` → `AGENTS.md`).
    ///
    /// # Errors
    /// `outside_desk` for a link whose target is absolute or leaves the desk, or for a
    /// loop.
    fn follow_links(&self, p: &RelPath) -> Result<RelPath> {
        let mut cur = p.clone();
        for _ in 0..40 {
            let Some((dir, _)) = cur.split_last() else {
                return Ok(cur);
            };
            let (dfd, cname) = self.parent(&cur, "write")?;
            let st = match fstatat(dfd.as_raw_fd(), &cname, libc::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(cur),
                Err(e) => return Err(ServeError::io("write", &cur.display(), e)),
            };
            if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                return Ok(cur);
            }
            let target = readlinkat(dfd.as_raw_fd(), &cname)
                .map_err(|e| ServeError::io("write", &cur.display(), e))?;
            cur = dir.resolve_link(&target).map_err(|_| {
                ServeError::new(
                    Code::OutsideDesk,
                    format!(
                        "cannot write {}: it is a symlink to {target:?}, outside the desk",
                        p.display()
                    ),
                )
            })?;
        }
        Err(ServeError::new(
            Code::OutsideDesk,
            format!("cannot write {}: too many levels of symlinks", p.display()),
        ))
    }

    /// Removes `p`: a file or symlink, or a directory (empty, or with `recursive` its
    /// whole tree; symlinks inside are removed, never followed).
    ///
    /// # Errors
    /// `not_found`, `not_empty` (a directory without `recursive`), `outside_desk`, `io`.
    pub fn remove(&self, p: &RelPath, recursive: bool) -> Result<()> {
        let (dir, name) = self.parent(p, "delete")?;
        let st = fstatat(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| ServeError::io("delete", &p.display(), e))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if recursive {
                remove_tree(&dir, &name).map_err(|e| ServeError::io("delete", &p.display(), e))?;
            }
            // SAFETY: valid C string, a descriptor we own.
            return check(unsafe {
                libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR)
            })
            .map_err(|e| ServeError::io("delete", &p.display(), e));
        }
        // SAFETY: as above.
        check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
            .map_err(|e| ServeError::io("delete", &p.display(), e))
    }

    /// Renames `from` to `to` (within the desk); without `overwrite` an existing `to` is
    /// `exists` (`RENAME_NOREPLACE`).
    ///
    /// # Errors
    /// `not_found`, `exists`, `not_empty`, `is_dir`, `not_dir`, `outside_desk`, `io`.
    pub fn rename(&self, from: &RelPath, to: &RelPath, overwrite: bool) -> Result<()> {
        let (fdir, fname) = self.parent(from, "move")?;
        let (tdir, tname) = self.parent(to, "move")?;
        let flags = if overwrite { 0 } else { libc::RENAME_NOREPLACE };
        // SAFETY: valid C strings, descriptors we own.
        let rc = unsafe {
            libc::renameat2(
                fdir.as_raw_fd(),
                fname.as_ptr(),
                tdir.as_raw_fd(),
                tname.as_ptr(),
                flags,
            )
        };
        check(rc).map_err(|e| {
            let shown = format!("{} to {}", from.display(), to.display());
            if e.raw_os_error() == Some(libc::EINVAL) {
                return ServeError::new(
                    Code::BadRequest,
                    format!("cannot move {shown}: a directory cannot move into itself"),
                );
            }
            ServeError::io("move", &shown, e)
        })
    }

    /// Begins an atomic replace of `p`: a new temporary file in `p`'s directory, to be
    /// filled by the caller and then [`Staged::commit`]ted (dropping it removes the file).
    ///
    /// # Errors
    /// `not_found` / `not_dir` (the parent), `outside_desk`, `bad_path` (the root), `io`.
    pub fn stage(&self, p: &RelPath) -> Result<Staged> {
        let p = &self.follow_links(p)?;
        // Opened for reading (not O_PATH): its fsync makes the rename durable.
        let (dir, name) = self.parent_with(p, "write", libc::O_RDONLY | libc::O_DIRECTORY)?;
        let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = cstr(&format!(".deskfs-put.{}.{n}", std::process::id()))?;
        // SAFETY: valid C string, a descriptor we own; a new descriptor or -1.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                tmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o644,
            )
        };
        if fd < 0 {
            return Err(ServeError::io("write", &p.display(), last_err()));
        }
        Ok(Staged {
            dir,
            tmp,
            name,
            path: p.clone(),
            // SAFETY: a descriptor the kernel just gave us.
            file: Some(File::from(unsafe { OwnedFd::from_raw_fd(fd) })),
            done: false,
        })
    }
}

/// Removes everything inside directory `name` of `parent` (not the directory itself),
/// never following a symlink.
fn remove_tree(parent: &OwnedFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C string, a descriptor we own; a new descriptor or -1.
    let fd = unsafe {
        libc::openat(
            parent.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last_err());
    }
    // SAFETY: a descriptor the kernel just gave us.
    let dir = unsafe { OwnedFd::from_raw_fd(fd) };
    for raw in read_names(&dir)? {
        let Ok(c) = CString::new(raw) else { continue };
        let st = match fstatat(dir.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if is_dir {
            remove_tree(&dir, &c)?;
        }
        let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: valid C string, a descriptor we own.
        let rc = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) };
        if rc != 0 {
            let e = last_err();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// What [`Staged::commit`] did.
#[derive(Clone, Debug)]
pub struct Committed {
    /// The new version's attributes.
    pub stat: Stat,
    /// A file was replaced (false: created).
    pub replaced: bool,
}

/// A temporary file holding the new content of a path until [`Staged::commit`].
#[derive(Debug)]
pub struct Staged {
    dir: OwnedFd,
    tmp: CString,
    name: CString,
    path: RelPath,
    file: Option<File>,
    done: bool,
}

impl Staged {
    /// The temporary file to write the content into.
    pub fn file(&mut self) -> Option<&mut File> {
        self.file.as_mut()
    }

    /// Takes the temporary file out (to write it asynchronously); give it back with
    /// [`Staged::put_back`] before committing.
    pub fn take_file(&mut self) -> Option<File> {
        self.file.take()
    }

    /// Gives back the file taken by [`Staged::take_file`].
    pub fn put_back(&mut self, f: File) {
        self.file = Some(f);
    }

    /// Makes the content durable (`fsync`), checks `pre` against the current version,
    /// renames the temporary file over the path (keeping the replaced file's permission
    /// bits) and flushes the directory, so what it returned survives a power loss. The caller serialises conditional writes of one desk (see
    /// `Desks::write_lock`), so no other conditional write lands between check and rename.
    ///
    /// # Errors
    /// `etag_mismatch` (the condition failed; nothing changed), `exists` (create only,
    /// and the path exists), `is_dir` (a directory is at the path), `io` (the `fsync`
    /// included: its failure is never ignored).
    pub fn commit(mut self, pre: &Precondition) -> Result<Committed> {
        let shown = self.path.display();
        let Some(file) = self.file.take() else {
            return Err(ServeError::new(
                Code::Io,
                format!("cannot write {shown}: content lost"),
            ));
        };
        file.sync_all()
            .map_err(|e| ServeError::io("write", &shown, e))?;
        let cur = match fstatat(self.dir.as_raw_fd(), &self.name, libc::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Some(st),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
            Err(e) => return Err(ServeError::io("write", &shown, e)),
        };
        if let Some(st) = &cur {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                return Err(ServeError::new(
                    Code::IsDir,
                    format!("cannot write {shown}: it is a directory"),
                ));
            }
        }
        let current = cur.as_ref().map(|st| Stat::of(&self.path, st, None));
        match (pre, &current) {
            (Precondition::Exists, None) | (Precondition::Etag(_), None) => {
                return Err(ServeError::new(
                    Code::EtagMismatch,
                    format!("{shown} does not exist (If-Match); read it again or drop the condition"),
                ))
            }
            (Precondition::Etag(want), Some(c)) if *want != c.etag => {
                return Err(ServeError::new(
                    Code::EtagMismatch,
                    format!(
                        "{shown} changed: its ETag is {} now, not {want}; read it again and retry",
                        c.etag
                    ),
                ))
            }
            (Precondition::Absent, Some(_)) => {
                return Err(ServeError::new(
                    Code::Exists,
                    format!("{shown} already exists (If-None-Match: *); pick another name or drop the condition"),
                ))
            }
            _ => {}
        }
        if let Some(st) = &cur {
            if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                // SAFETY: a descriptor we own.
                let rc = unsafe { libc::fchmod(file.as_raw_fd(), st.st_mode & 0o7777) };
                check(rc).map_err(|e| ServeError::io("write", &shown, e))?;
            }
        }
        let flags = if *pre == Precondition::Absent {
            libc::RENAME_NOREPLACE
        } else {
            0
        };
        // SAFETY: valid C strings, a descriptor we own (both names relative to it).
        let rc = unsafe {
            libc::renameat2(
                self.dir.as_raw_fd(),
                self.tmp.as_ptr(),
                self.dir.as_raw_fd(),
                self.name.as_ptr(),
                flags,
            )
        };
        check(rc).map_err(|e| ServeError::io("write", &shown, e))?;
        self.done = true;
        // The new name survives a power loss once the directory is flushed too.
        // SAFETY: a descriptor we own.
        check(unsafe { libc::fsync(self.dir.as_raw_fd()) })
            .map_err(|e| ServeError::io("write", &shown, e))?;
        let st = fstatat(file.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
            .map_err(|e| ServeError::io("write", &shown, e))?;
        Ok(Committed {
            stat: Stat::of(&self.path, &st, None),
            replaced: cur.is_some(),
        })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: valid C string, a descriptor we own.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.tmp.as_ptr(), 0) };
        }
    }
}
