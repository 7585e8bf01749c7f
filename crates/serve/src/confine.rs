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
//! The desk's `.desk/` ([`DESK_STATE`]: task records, the task journal, locks) is kept by
//! deskfs: it can be read, but every change whose target lies in it, or is it, is refused
//! (`read_only_path`), whichever way the path reaches it. The check is on what the kernel
//! resolved, not only on the text: after the parent directory of the target is open
//! (beneath the desk), it is walked up with `openat(fd, "..")` to the desk's root,
//! comparing device and inode numbers (`statx` with `AT_STATX_DONT_SYNC`: the cached
//! attributes, no round trip to a FUSE daemon); a parent that is `.desk` or lies under it
//! is refused, and so is the name `.desk` in the desk's root. So a symlink the agent
//! planted (`x -> .desk`, `y -> .desk/journal`) leads nowhere writable. This costs one
//! `statx` for a target in the desk's root and two syscalls per level below it; `/proc`
//! is not needed. Nothing an agent can do moves a directory into or out of `.desk`
//! between the check and the change (here it is refused; inside `deskfs exec` `.desk`
//! is a read-only mount point).
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

/// The desk's own directory (task records, the task journal, locks): readable, never
/// changed through these interfaces (`read_only_path`).
pub const DESK_STATE: &str = ".desk";
/// [`DESK_STATE`] for system calls.
const DESK_STATE_C: &CStr = c".desk";

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

    /// Whether the path, as text, is [`DESK_STATE`] or lies under it.
    pub fn in_desk_state(&self) -> bool {
        self.parts.first().is_some_and(|c| c == DESK_STATE)
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
        let mtime_ns = ns(st.st_mtime, st.st_mtime_nsec);
        Stat {
            path: path.display(),
            kind,
            size: st.st_size as u64,
            mode: st.st_mode & 0o7777,
            mtime_ns,
            etag: format!("\"{:x}-{:x}-{:x}\"", st.st_ino, mtime_ns, st.st_size),
            target,
            atime_ns: ns(st.st_atime, st.st_atime_nsec),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// Nanoseconds since the epoch of a `stat` time, saturating (a time past the year 2262,
/// which `touch -d` can set, shows as the largest one instead of overflowing).
fn ns(sec: i64, nsec: i64) -> i64 {
    sec.saturating_mul(1_000_000_000).saturating_add(nsec)
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
    /// The desk directory's identity, where a walk up from a directory inside ends.
    root: FileId,
    /// `RESOLVE_*` flags of every resolution beneath the desk.
    resolve: u64,
}

/// How paths resolve beneath a desk by default: symlinks followed while they stay inside.
const RESOLVE_DEFAULT: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;

/// Which file a descriptor or name is: device and inode numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev_major: u32,
    dev_minor: u32,
    ino: u64,
}

/// The identity of `name` in `dir` (the empty name: `dir` itself) and whether it is a
/// directory, never following a symlink. From the attributes the kernel has
/// (`AT_STATX_DONT_SYNC`): device and inode numbers never change, so a FUSE mount is not
/// asked.
fn file_id(dir: RawFd, name: &CStr) -> io::Result<(FileId, bool)> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let mut flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC;
    if name.is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    // SAFETY: valid C string; `stx` is a zeroed `statx` the call fills.
    let rc = unsafe {
        libc::statx(
            dir,
            name.as_ptr(),
            flags,
            libc::STATX_TYPE | libc::STATX_INO,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(last_err());
    }
    // SAFETY: zero-initialised and filled by a successful statx.
    let stx = unsafe { stx.assume_init() };
    let id = FileId {
        dev_major: stx.stx_dev_major,
        dev_minor: stx.stx_dev_minor,
        ino: stx.stx_ino,
    };
    Ok((id, u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFDIR))
}

/// Most directory levels walked up from a target's parent to the desk's root (a path
/// of at most [`PATH_MAX`] bytes has fewer; links inside the desk may lead deeper).
const MAX_WALK: usize = 1 << 16;

/// The refusal of a change of `shown` (desk-relative) under [`DESK_STATE`].
fn read_only(doing: &str, shown: &str) -> ServeError {
    let shown = if shown.is_empty() { "/" } else { shown };
    ServeError::new(
        Code::ReadOnlyPath,
        format!(
            "cannot {doing} {shown}: `{DESK_STATE}/` is kept by deskfs (task records, the task journal, locks) and is read-only to agents"
        ),
    )
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| ServeError::new(Code::BadPath, "name contains a NUL byte"))
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// `openat2(dir, path, flags | O_CLOEXEC, mode)` resolving with `resolve` (at least
/// `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`); retried on `EAGAIN` (a rename raced the
/// resolution) and `EINTR`.
fn openat2(dir: RawFd, path: &CStr, flags: i32, mode: u32, resolve: u64) -> io::Result<OwnedFd> {
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = resolve | RESOLVE_DEFAULT;
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
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let (root, _) = file_id(fd.as_raw_fd(), c"").map_err(|e| {
            ServeError::new(Code::Io, format!("cannot open desk {}: {e}", dir.display()))
        })?;
        Ok(DeskDir {
            fd,
            root,
            resolve: RESOLVE_DEFAULT,
        })
    }

    /// The same desk with no symlink followed anywhere (`RESOLVE_NO_SYMLINKS`; a write to
    /// a link replaces the link): for callers confined to a part of the desk that checked
    /// for links as text, so a link swapped in after their check cannot lead elsewhere in
    /// the desk (the memory tool and `memories/`). A link in the way fails with `ELOOP`.
    ///
    /// # Errors
    /// `io` when the descriptor cannot be duplicated.
    pub fn without_symlinks(&self) -> Result<DeskDir> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| ServeError::new(Code::Io, format!("cannot hold the desk: {e}")))?;
        Ok(DeskDir {
            fd,
            root: self.root,
            resolve: self.resolve | libc::RESOLVE_NO_SYMLINKS,
        })
    }

    fn follows_links(&self) -> bool {
        self.resolve & libc::RESOLVE_NO_SYMLINKS == 0
    }

    /// Refuses a change of the entry `name` of directory `dir` (open beneath the desk)
    /// when that entry is the desk's [`DESK_STATE`] or lies under it, judged by what the
    /// kernel resolved (see the module documentation): `dir` is the desk's root and `name`
    /// is `.desk`, or `dir` is `.desk` or one of its descendants (walked up with `..` to
    /// the root, comparing device and inode). `shown` names the target in the error.
    ///
    /// # Errors
    /// `read_only_path` (403); `outside_desk` when the walk up reaches `/` without meeting
    /// the desk (the directory was moved out meanwhile); `io` when a step fails.
    fn refuse_state(&self, dir: &OwnedFd, name: &CStr, doing: &str, shown: &str) -> Result<()> {
        let io_err = |e| ServeError::io(doing, shown, e);
        let (mut at, _) = file_id(dir.as_raw_fd(), c"").map_err(io_err)?;
        if at == self.root {
            return if name.to_bytes() == DESK_STATE.as_bytes() {
                Err(read_only(doing, shown))
            } else {
                Ok(())
            };
        }
        let state = match file_id(self.fd.as_raw_fd(), DESK_STATE_C) {
            Ok((id, true)) => id,
            // no `.desk` directory (a symlink in its place is refused by name, and the
            // desk library refuses to open such a desk): nothing lies under it
            Ok((_, false)) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(io_err(e)),
        };
        let mut up_from: Option<OwnedFd> = None;
        for _ in 0..MAX_WALK {
            if at == state {
                return Err(read_only(doing, shown));
            }
            let from = up_from.as_ref().map_or(dir.as_raw_fd(), AsRawFd::as_raw_fd);
            // SAFETY: a NUL-terminated literal and a descriptor we own; a new descriptor
            // or -1.
            let fd = unsafe {
                libc::openat(
                    from,
                    c"..".as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(io_err(last_err()));
            }
            // SAFETY: a descriptor the kernel just gave us.
            let parent = unsafe { OwnedFd::from_raw_fd(fd) };
            let (id, _) = file_id(parent.as_raw_fd(), c"").map_err(io_err)?;
            if id == self.root {
                return Ok(());
            }
            if id == at {
                // `/`: the directory was moved out of the desk meanwhile
                return Err(ServeError::new(
                    Code::OutsideDesk,
                    format!("cannot {doing} {shown}: its directory is no longer inside the desk"),
                ));
            }
            at = id;
            up_from = Some(parent);
        }
        Err(ServeError::new(
            Code::Io,
            format!("cannot {doing} {shown}: more than {MAX_WALK} directory levels above it"),
        ))
    }

    /// [`DeskDir::refuse_state`] for `p` as text first (`.desk` or under it), then for
    /// its parent `dir` as resolved and its last name `name`.
    fn refuse_state_of(&self, p: &RelPath, dir: &OwnedFd, name: &CStr, doing: &str) -> Result<()> {
        if p.in_desk_state() {
            return Err(read_only(doing, &p.display()));
        }
        self.refuse_state(dir, name, doing, &p.display())
    }

    fn resolve(&self, p: &RelPath, flags: i32, doing: &str) -> Result<OwnedFd> {
        openat2(self.fd.as_raw_fd(), &p.c_path(), flags, 0, self.resolve)
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
        let fd = openat2(self.fd.as_raw_fd(), &dir.c_path(), flags, 0, self.resolve)
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

    /// The whole content of the regular file `p` when it is at most `max` bytes (`None`
    /// when it is larger: the caller says so in its own words), with its attributes.
    ///
    /// # Errors
    /// Those of [`DeskDir::open_read`]; `io` reading.
    pub fn read_up_to(&self, p: &RelPath, max: u64) -> Result<(Option<Vec<u8>>, Stat)> {
        let (f, st) = self.open_read(p)?;
        if st.size > max {
            return Ok((None, st));
        }
        let mut buf = Vec::with_capacity(st.size as usize);
        use std::io::Read;
        f.take(max + 1)
            .read_to_end(&mut buf)
            .map_err(|e| ServeError::io("read", &p.display(), e))?;
        Ok((Some(buf), st))
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
    /// missing parent without `parents`), `outside_desk`, `read_only_path` (`.desk` or a
    /// directory under it, also an existing one with `parents`), `io`.
    pub fn mkdir(&self, p: &RelPath, parents: bool) -> Result<()> {
        if p.in_desk_state() {
            return Err(read_only("create directory", &p.display()));
        }
        if !parents {
            let (dir, name) = self.parent(p, "create directory")?;
            self.refuse_state_of(p, &dir, &name, "create directory")?;
            // SAFETY: valid C string, a descriptor we own.
            return check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) })
                .map_err(|e| ServeError::io("create directory", &p.display(), e));
        }
        // Walked down one level at a time from the directory made (or found) just above,
        // never following a link, so the cost grows with the depth, not its square: the
        // first level is checked against `.desk` by name (it is in the desk's root); no
        // level below can be under `.desk` without a link, and a link in the way is
        // refused (`exists`); the deepest directory is then walked up to the root once,
        // which also finds a directory moved out of the desk meanwhile.
        let mut held: Option<OwnedFd> = None;
        let mut at = RelPath::root();
        for part in &p.parts {
            at = at.join(part);
            let name = cstr(part)?;
            let dir = held.as_ref().unwrap_or(&self.fd);
            if held.is_none() {
                self.refuse_state_of(&at, dir, &name, "create directory")?;
            }
            // SAFETY: as above.
            let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) };
            if rc != 0 {
                let e = last_err();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(ServeError::io("create directory", &at.display(), e));
                }
            }
            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            let level = openat2(dir.as_raw_fd(), &name, flags, 0, self.resolve);
            held = Some(level.map_err(|e| match e.raw_os_error() {
                Some(libc::ENOTDIR | libc::ELOOP) => ServeError::new(
                    Code::Exists,
                    format!(
                        "cannot create directory {}: {} exists and is not a directory",
                        p.display(),
                        at.display()
                    ),
                ),
                _ => ServeError::io("create directory", &at.display(), e),
            })?);
        }
        if let Some(deepest) = &held {
            self.refuse_state(deepest, c"", "create directory", &p.display())?;
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
        if !self.follows_links() {
            return Ok(cur);
        }
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
    /// `not_found`, `not_empty` (a directory without `recursive`), `outside_desk`,
    /// `read_only_path` (`.desk` or anything under it), `bad_path` (the desk's root:
    /// never removed, so neither is its `.desk`), `io`.
    pub fn remove(&self, p: &RelPath, recursive: bool) -> Result<()> {
        if p.in_desk_state() {
            return Err(read_only("delete", &p.display()));
        }
        let (dir, name) = self.parent(p, "delete")?;
        self.refuse_state_of(p, &dir, &name, "delete")?;
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
    /// `not_found`, `exists`, `not_empty`, `is_dir`, `not_dir`, `outside_desk`,
    /// `read_only_path` (either side `.desk` or under it: nothing moves into, out of or
    /// over it, nor does `.desk` itself), `io`.
    pub fn rename(&self, from: &RelPath, to: &RelPath, overwrite: bool) -> Result<()> {
        for p in [from, to] {
            if p.in_desk_state() {
                return Err(read_only("move", &p.display()));
            }
        }
        let (fdir, fname) = self.parent(from, "move")?;
        let (tdir, tname) = self.parent(to, "move")?;
        self.refuse_state_of(from, &fdir, &fname, "move")?;
        self.refuse_state_of(to, &tdir, &tname, "move")?;
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
    /// `not_found` / `not_dir` (the parent), `outside_desk`, `read_only_path` (the file,
    /// or the one a symlink at `p` leads to, is under `.desk`), `bad_path` (the root),
    /// `io`.
    pub fn stage(&self, p: &RelPath) -> Result<Staged> {
        if p.in_desk_state() {
            return Err(read_only("write", &p.display()));
        }
        let p = &self.follow_links(p)?;
        // Opened for reading (not O_PATH): its fsync makes the rename durable.
        let (dir, name) = self.parent_with(p, "write", libc::O_RDONLY | libc::O_DIRECTORY)?;
        self.refuse_state_of(p, &dir, &name, "write")?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::symlink;

    /// A desk with its records as deskfs leaves them, a note, and the journal's content.
    fn desk() -> (tempfile::TempDir, std::path::PathBuf, DeskDir) {
        let t = tempfile::tempdir().expect("tempdir");
        let desk = t.path().join("desk");
        for d in [".desk/journal", ".desk/locks", ".desk/tasks", "notes/fake"] {
            std::fs::create_dir_all(desk.join(d)).expect("mkdir");
        }
        std::fs::write(desk.join(".desk/journal/_desk.jsonl"), JOURNAL).expect("write");
        std::fs::write(desk.join(".desk/tasks/t1.toml"), "repo = \"app\"\n").expect("write");
        std::fs::write(desk.join("notes/n"), "note").expect("write");
        let d = DeskDir::open(&desk).expect("open");
        (t, desk, d)
    }

    const JOURNAL: &str = "{\"id\":\"real\"}\n";

    #[test]
    fn without_symlinks_no_link_is_followed_even_inside_the_desk() {
        let (_t, desk, d) = desk();
        std::fs::create_dir(desk.join("memories")).expect("mkdir");
        std::fs::write(desk.join("notes/f"), "notes").expect("write");
        // As if swapped in after a caller's check: a link inside the desk, out of memories/.
        symlink("../notes", desk.join("memories/d")).expect("symlink");
        symlink("../notes/f", desk.join("memories/f")).expect("symlink");
        assert!(
            d.open_read(&rel("memories/d/f")).is_ok(),
            "the default follows inside"
        );
        let m = d.without_symlinks().expect("dup");
        assert_eq!(code(m.open_read(&rel("memories/d/f"))), Code::OutsideDesk);
        assert_eq!(code(m.open_read(&rel("memories/f"))), Code::OutsideDesk);
        assert_eq!(code(m.list(&rel("memories/d"))), Code::OutsideDesk);
        assert_eq!(code(m.stat(&rel("memories/d/f"))), Code::OutsideDesk);
        assert_eq!(code(put(&m, "memories/d/new", b"x")), Code::OutsideDesk);
        assert_eq!(
            code(m.mkdir(&rel("memories/d/sub"), false)),
            Code::OutsideDesk
        );
        assert_eq!(
            code(m.remove(&rel("memories/d/f"), false)),
            Code::OutsideDesk
        );
        assert_eq!(
            code(m.rename(&rel("memories/d/f"), &rel("memories/g"), false)),
            Code::OutsideDesk
        );
        // A write to the link itself replaces the link, never its target.
        put(&m, "memories/f", b"mine").expect("put over the link");
        assert_eq!(std::fs::read(desk.join("notes/f")).expect("read"), b"notes");
        assert_eq!(
            std::fs::read(desk.join("memories/f")).expect("read"),
            b"mine"
        );
        assert!(!desk.join("notes/new").exists() && !desk.join("notes/sub").exists());
        // Paths without links work as before.
        put(&m, "memories/a", b"a").expect("put");
        assert_eq!(
            m.open_read(&rel("memories/a")).map(|(_, st)| st.size).ok(),
            Some(1)
        );
    }

    fn rel(s: &str) -> RelPath {
        RelPath::parse(s).expect("path")
    }

    fn code<T: std::fmt::Debug>(r: Result<T>) -> Code {
        r.expect_err("should be refused").code
    }

    fn put(d: &DeskDir, p: &str, data: &[u8]) -> Result<Committed> {
        let mut s = d.stage(&rel(p))?;
        s.file().expect("file").write_all(data).expect("write");
        s.commit(&Precondition::None)
    }

    /// `.desk` is as [`desk`] made it: the journal's content, the records, no stray file.
    fn assert_intact(desk: &Path) {
        let j = desk.join(".desk/journal/_desk.jsonl");
        assert_eq!(std::fs::read_to_string(j).expect("journal"), JOURNAL);
        let names = |d: &str| {
            let mut v: Vec<String> = std::fs::read_dir(desk.join(d))
                .expect("read_dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(".desk"), ["journal", "locks", "tasks"]);
        assert_eq!(names(".desk/journal"), ["_desk.jsonl"]);
        assert_eq!(names(".desk/locks"), Vec::<String>::new());
        assert_eq!(names(".desk/tasks"), ["t1.toml"]);
        let st = std::fs::symlink_metadata(desk.join(".desk")).expect("stat");
        assert!(st.is_dir());
    }

    #[test]
    fn desk_state_is_read_only_by_its_own_path() {
        assert_eq!(DESK_STATE_C.to_bytes(), DESK_STATE.as_bytes());
        let (_t, desk, d) = desk();
        for p in [
            ".desk/journal/_desk.jsonl",
            ".desk/journal/t1.jsonl",
            ".desk/x",
        ] {
            assert_eq!(code(put(&d, p, b"forged")), Code::ReadOnlyPath, "put {p}");
        }
        assert_eq!(code(put(&d, ".desk", b"x")), Code::ReadOnlyPath);
        for (p, parents) in [
            (".desk/y", false),
            (".desk/journal/y", true),
            (".desk", true),
            (".desk/journal", true),
        ] {
            assert_eq!(
                code(d.mkdir(&rel(p), parents)),
                Code::ReadOnlyPath,
                "mkdir {p}"
            );
        }
        for (p, recursive) in [
            (".desk/journal/_desk.jsonl", false),
            (".desk/locks", false),
            (".desk/journal", true),
            (".desk", true),
            (".desk/none", false),
        ] {
            assert_eq!(
                code(d.remove(&rel(p), recursive)),
                Code::ReadOnlyPath,
                "delete {p}"
            );
        }
        for (from, to, overwrite) in [
            (".desk", "moved", false),
            (".desk/journal", "notes/j", false),
            (".desk/journal/_desk.jsonl", "notes/j", false),
            ("notes/n", ".desk/journal/_desk.jsonl", true),
            ("notes/n", ".desk/n", false),
            ("notes/fake", ".desk", true),
            (".desk/journal", ".desk/j", false),
        ] {
            assert_eq!(
                code(d.rename(&rel(from), &rel(to), overwrite)),
                Code::ReadOnlyPath,
                "move {from} to {to}"
            );
        }
        let e = d.remove(&rel(".desk"), true).expect_err("refused");
        assert_eq!(e.code.status(), 403);
        assert!(
            e.message.contains("kept by deskfs") && e.message.contains("read-only"),
            "{}",
            e.message
        );
        // reads stay allowed
        let (mut f, st) = d
            .open_read(&rel(".desk/journal/_desk.jsonl"))
            .expect("read");
        let mut s = String::new();
        f.read_to_string(&mut s).expect("read");
        assert_eq!((s.as_str(), st.kind), (JOURNAL, Kind::File));
        assert_eq!(d.list(&rel(".desk")).expect("list").len(), 3);
        assert_eq!(d.stat(&rel(".desk")).expect("stat").kind, Kind::Dir);
        // a `.desk` anywhere but the desk's root is an ordinary name
        d.mkdir(&rel("notes/.desk"), false).expect("mkdir");
        put(&d, "notes/.desk/x", b"mine").expect("put");
        d.rename(&rel("notes/.desk"), &rel("notes/other"), false)
            .expect("move");
        assert_intact(&desk);
    }

    #[test]
    fn desk_state_is_read_only_through_symlinks() {
        // what the kernel resolves counts, not the text: links planted by the agent
        let (_t, desk, d) = desk();
        symlink(".desk", desk.join("x")).expect("symlink");
        symlink(".desk/journal", desk.join("y")).expect("symlink");
        symlink(".desk/journal/_desk.jsonl", desk.join("j")).expect("symlink");
        symlink(".", desk.join("dot")).expect("symlink");
        symlink("../.desk", desk.join("notes/up")).expect("symlink");
        for p in [
            "x/journal/_desk.jsonl",
            "x/journal/t1.jsonl",
            "x/x",
            "y/_desk.jsonl",
            "y/new.jsonl",
            "j",
            "dot/.desk",
            "dot/.desk/journal/_desk.jsonl",
            "notes/up/journal/_desk.jsonl",
            "notes/up/tasks/t1.toml",
        ] {
            assert_eq!(code(put(&d, p, b"forged")), Code::ReadOnlyPath, "put {p}");
        }
        for p in ["x/y", "y/sub", "dot/.desk", "notes/up/z"] {
            assert_eq!(
                code(d.mkdir(&rel(p), false)),
                Code::ReadOnlyPath,
                "mkdir {p}"
            );
        }
        // mkdir -p finds the link in the way and never looks through it
        assert_eq!(code(d.mkdir(&rel("x/journal/z"), true)), Code::Exists);
        for (p, recursive) in [
            ("y/_desk.jsonl", false),
            ("x/journal", true),
            ("x/locks", false),
            ("dot/.desk", true),
            ("notes/up/tasks", true),
        ] {
            assert_eq!(
                code(d.remove(&rel(p), recursive)),
                Code::ReadOnlyPath,
                "delete {p}"
            );
        }
        for (from, to, overwrite) in [
            ("y/_desk.jsonl", "notes/stolen", false),
            ("notes/n", "y/_desk.jsonl", true),
            ("notes/n", "x/n", false),
            ("dot/.desk", "notes/old", false),
            ("notes/fake", "dot/.desk", true),
            ("x/journal", "notes/j", false),
            ("notes/up/journal", "notes/j", false),
        ] {
            assert_eq!(
                code(d.rename(&rel(from), &rel(to), overwrite)),
                Code::ReadOnlyPath,
                "move {from} to {to}"
            );
        }
        // reads through the links stay allowed
        let (mut f, _) = d.open_read(&rel("y/_desk.jsonl")).expect("read");
        let mut s = String::new();
        f.read_to_string(&mut s).expect("read");
        assert_eq!(s, JOURNAL);
        assert_eq!(d.list(&rel("x")).expect("list").len(), 3);
        // the links themselves are the agent's: moved and removed, never what they name
        d.rename(&rel("x"), &rel("notes/x"), false)
            .expect("move link");
        d.remove(&rel("notes/x"), false).expect("remove link");
        d.remove(&rel("dot"), true).expect("remove link");
        d.remove(&rel("notes"), true)
            .expect("remove notes with a link in it");
        assert_intact(&desk);
    }

    #[test]
    fn removing_the_desk_root_never_removes_desk_state() {
        let (_t, desk, d) = desk();
        for recursive in [false, true] {
            assert_eq!(code(d.remove(&RelPath::root(), recursive)), Code::BadPath);
            assert_eq!(code(d.remove(&rel("."), recursive)), Code::BadPath);
        }
        assert_intact(&desk);
        assert!(desk.join("notes/n").is_file());
    }

    #[test]
    fn mkdir_with_parents_makes_a_deep_tree_level_by_level() {
        let (_t, desk, d) = desk();
        // 2,000 levels: the longest path the interfaces take (4,000 of 4,096 bytes)
        let deep = "d/".repeat(2000);
        d.mkdir(&rel(&deep), true).expect("mkdir -p deep");
        assert!(desk.join(&deep).is_dir());
        // again: every level exists, which is fine
        d.mkdir(&rel(&deep), true).expect("mkdir -p again");
        // a file in the way, at the first level or deep down
        std::fs::write(desk.join("f"), b"x").expect("write");
        assert_eq!(code(d.mkdir(&rel("f/a"), true)), Code::Exists);
        let mid = format!("{}file", "d/".repeat(100));
        std::fs::write(desk.join(&mid), b"x").expect("write");
        assert_eq!(
            code(d.mkdir(&rel(&format!("{mid}/a/b")), true)),
            Code::Exists
        );
        assert!(!desk.join(&mid).is_dir());
        // a link to a directory inside the desk, deep down, is not looked through
        symlink("..", desk.join("d/d/up")).expect("symlink");
        assert_eq!(code(d.mkdir(&rel("d/d/up/new"), true)), Code::Exists);
        assert!(!desk.join("d/new").exists());
        // a new branch beside existing levels
        d.mkdir(&rel("d/d/e/f"), true).expect("mkdir -p branch");
        assert!(desk.join("d/d/e/f").is_dir());
    }

    #[test]
    fn desk_state_cannot_be_made_by_an_agent() {
        // a desk without `.desk` yet (older desks): no one but deskfs makes it, under
        // no name that reaches it
        let t = tempfile::tempdir().expect("tempdir");
        let desk = t.path().join("desk");
        std::fs::create_dir_all(desk.join("notes/fake/journal")).expect("mkdir");
        symlink(".", desk.join("dot")).expect("symlink");
        let d = DeskDir::open(&desk).expect("open");
        for (p, parents) in [
            (".desk", false),
            (".desk", true),
            (".desk/journal", true),
            ("dot/.desk", false),
        ] {
            assert_eq!(
                code(d.mkdir(&rel(p), parents)),
                Code::ReadOnlyPath,
                "mkdir {p}"
            );
        }
        for p in [".desk", "dot/.desk"] {
            assert_eq!(code(put(&d, p, b"x")), Code::ReadOnlyPath, "put {p}");
            assert_eq!(
                code(d.rename(&rel("notes/fake"), &rel(p), false)),
                Code::ReadOnlyPath,
                "move to {p}"
            );
        }
        assert!(std::fs::symlink_metadata(desk.join(".desk")).is_err());
        assert!(desk.join("notes/fake/journal").is_dir());
    }
}
