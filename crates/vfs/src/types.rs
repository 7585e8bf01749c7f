//! Values crossing the VFS API (what the FUSE adapter translates).

pub use deskfs_meta::{Ino, Kind, ROOT_INO};

/// Attributes of an inode, as `stat(2)` reports them. Times are ns since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// File type.
    pub kind: Kind,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number (devices only).
    pub rdev: u32,
    /// Size, bytes.
    pub size: u64,
    /// 512-byte blocks allocated (`st_blocks`).
    pub blocks: u64,
    /// Access time, ns.
    pub atime_ns: i64,
    /// Modification time, ns.
    pub mtime_ns: i64,
    /// Status change time, ns.
    pub ctime_ns: i64,
    /// Birth time, ns.
    pub btime_ns: i64,
}

impl Attr {
    /// Full `st_mode` (type + permission bits).
    pub fn mode(&self) -> u32 {
        self.kind.ifmt() | self.perm
    }
}

/// Caller identity of a request (from the FUSE request header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ctx {
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
    /// Process id.
    pub pid: u32,
}

impl Ctx {
    /// deskfs itself (uid 0), for namespace changes it makes on its own behalf (an
    /// object deleted from the bucket by another tool).
    pub const ROOT: Ctx = Ctx {
        uid: 0,
        gid: 0,
        pid: 0,
    };
}

/// A time to set with `utimensat(2)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// `UTIME_NOW`.
    Now,
    /// A given time, ns since the epoch.
    At(i64),
}

/// Changes requested by `setattr` (chmod, chown, truncate, utimensat). `None` = leave
/// unchanged (`UTIME_OMIT` for times).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New mode; only the permission bits (`& 0o7777`) are used.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend with zeros).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// File handle the change came through (ftruncate), if any.
    pub fh: Option<u64>,
}

/// One directory entry returned by `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode number.
    pub ino: Ino,
    /// Offset to pass to the next `readdir` to continue after this entry.
    pub offset: u64,
    /// File type.
    pub kind: Kind,
    /// Name bytes (`.` and `..` included).
    pub name: Vec<u8>,
    /// Full attributes (for readdirplus). For `..`, `None`.
    pub attr: Option<Attr>,
}

/// `statfs(2)` figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Total blocks of `bsize` bytes.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size, bytes.
    pub bsize: u32,
    /// Maximum name length, bytes.
    pub namelen: u32,
    /// Fragment size, bytes.
    pub frsize: u32,
}

/// What `open`/`create` returned: the handle, whether the kernel may keep its page
/// cache of the file (content unchanged since the last open), and the backing file when
/// the open is served by FUSE passthrough.
#[derive(Clone, Debug)]
pub struct Opened {
    /// File handle.
    pub fh: u64,
    /// The content did not change since it was last cached: keep the kernel page cache.
    pub keep_cache: bool,
    /// The staging file to hand the kernel as the backing file (`FOPEN_PASSTHROUGH`):
    /// every open of the inode must name the same one while any is open. When the
    /// kernel refuses it, call [`crate::Vfs::passthrough_refused`] before replying.
    pub backing: Option<std::sync::Arc<std::fs::File>>,
}

/// `rename(2)`/`renameat2(2)` flags (Linux values).
pub mod rename_flags {
    /// Fail with `EEXIST` if the target exists.
    pub const NOREPLACE: u32 = 1;
    /// Atomically exchange source and target (both must exist).
    pub const EXCHANGE: u32 = 2;
    /// Whiteout (overlayfs); not supported: `EINVAL`.
    pub const WHITEOUT: u32 = 4;
}

/// `setxattr(2)` flags.
pub mod xattr_flags {
    /// Fail with `EEXIST` if the attribute exists.
    pub const CREATE: i32 = 1;
    /// Fail with `ENODATA` if the attribute does not exist.
    pub const REPLACE: i32 = 2;
}
