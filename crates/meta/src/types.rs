//! Row types stored by the metadata engines.

/// Inode number. [`ROOT_INO`] is the workspace root directory.
pub type Ino = u64;

/// Inode number of the root directory (the FUSE root node id).
pub const ROOT_INO: Ino = 1;

/// File type of an inode, stored as its `S_IFMT` bits (POSIX `<sys/stat.h>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    /// Regular file (`S_IFREG`).
    File,
    /// Directory (`S_IFDIR`).
    Dir,
    /// Symbolic link (`S_IFLNK`).
    Symlink,
    /// Named pipe (`S_IFIFO`).
    Fifo,
    /// Unix domain socket (`S_IFSOCK`).
    Socket,
    /// Character device (`S_IFCHR`).
    CharDev,
    /// Block device (`S_IFBLK`).
    BlockDev,
}

impl Kind {
    /// The `S_IFMT` bits of this kind.
    pub fn ifmt(self) -> u32 {
        match self {
            Kind::File => 0o100000,
            Kind::Dir => 0o040000,
            Kind::Symlink => 0o120000,
            Kind::Fifo => 0o010000,
            Kind::Socket => 0o140000,
            Kind::CharDev => 0o020000,
            Kind::BlockDev => 0o060000,
        }
    }

    /// The kind named by the `S_IFMT` bits of `mode`, or `None` for an unknown type.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & 0o170000 {
            0o100000 => Kind::File,
            0o040000 => Kind::Dir,
            0o120000 => Kind::Symlink,
            0o010000 => Kind::Fifo,
            0o140000 => Kind::Socket,
            0o020000 => Kind::CharDev,
            0o060000 => Kind::BlockDev,
            _ => return None,
        })
    }
}

/// Where an inode's current content (`data_version`) is held outside the bucket.
///
/// Every cache directory has a random 63-bit id (mounts sharing a cache dir share it;
/// caches made before ids existed are id 1). The content is in a cache's staging file
/// only when the inode says `At(that cache)`; a staging file found in another cache for
/// the inode is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Local {
    /// Nothing held beyond evictable block-cache blocks: the bucket object is the content.
    None,
    /// The staging file in the cache with this id holds the full content.
    At(u64),
}

impl Local {
    /// The stored form: 0 for [`Local::None`], else the cache id.
    pub fn code(self) -> i64 {
        match self {
            Local::None => 0,
            Local::At(c) => c as i64,
        }
    }

    /// From the stored form.
    pub fn from_code(c: i64) -> Local {
        if c == 0 {
            Local::None
        } else {
            Local::At(c as u64)
        }
    }

    /// Whether the content is in the cache with id `cache`.
    pub fn is_in(self, cache: u64) -> bool {
        self == Local::At(cache)
    }
}

/// One inode. Times are nanoseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InodeRow {
    /// Inode number (ignored by [`crate::MetaTxn::insert_inode`], which allocates one;
    /// allocated by [`crate::MetaEngine::alloc_inos`] for [`crate::Op::InsertInode`]).
    pub ino: Ino,
    /// File type.
    pub kind: Kind,
    /// Permission bits, `mode & 0o7777` (setuid, setgid, sticky, rwx).
    pub perm: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Device number for character/block devices, else 0.
    pub rdev: u32,
    /// Hard-link count. For directories: 2 + number of subdirectories.
    pub nlink: u32,
    /// Size in bytes (file content length; symlink target length; 0 for others).
    pub size: u64,
    /// Last access, ns.
    pub atime_ns: i64,
    /// Last content modification, ns.
    pub mtime_ns: i64,
    /// Last status change, ns.
    pub ctime_ns: i64,
    /// Creation time, ns.
    pub btime_ns: i64,
    /// Content version: bumped on every committed content change (close/fsync after writes,
    /// truncate). The bucket object holding a version is recorded in [`ObjectRow`].
    pub data_version: u64,
    /// Symlink target bytes (symlinks only).
    pub target: Option<Vec<u8>>,
    /// What is held locally.
    pub local: Local,
    /// True while the content (`data_version`) is only local: not yet uploaded.
    pub dirty: bool,
    /// Directories: when their children were last listed from the bucket (ns, 0 = never;
    /// i64::MAX = created here, nothing to import).
    pub listed_ns: i64,
}

impl InodeRow {
    /// A new, empty inode of `kind` (number 0: the engine assigns it) with permission bits
    /// `perm`, owned by `uid:gid`, every time `now_ns`; one link (two for a directory: its
    /// `.`), no content, nothing local, never listed.
    pub fn fresh(kind: Kind, perm: u32, uid: u32, gid: u32, now_ns: i64) -> InodeRow {
        InodeRow {
            ino: 0,
            kind,
            perm,
            uid,
            gid,
            rdev: 0,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            atime_ns: now_ns,
            mtime_ns: now_ns,
            ctime_ns: now_ns,
            btime_ns: now_ns,
            data_version: 0,
            target: None,
            local: Local::None,
            dirty: false,
            listed_ns: 0,
        }
    }
}

/// One directory entry. `cookie` is unique, never reused, and stable for the life of the
/// entry (also across rename), so it serves as the readdir offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dentry {
    /// Readdir cookie.
    pub cookie: u64,
    /// Directory holding the entry.
    pub parent: Ino,
    /// Entry name (raw bytes, no `/`, not `.`/`..`).
    pub name: Vec<u8>,
    /// The inode it names.
    pub ino: Ino,
}

/// What `getxattr` needs to know about one inode and one name, read in one look
/// ([`MetaTxn::look_xattr`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XattrLook {
    /// No inode `ino` (a stale handle: `ESTALE`).
    NoInode,
    /// The value of the name asked for.
    Value(Vec<u8>),
    /// The name is not set (`ENODATA`); `any` tells whether the inode has other xattrs.
    Missing {
        /// Whether the inode has at least one other xattr.
        any: bool,
    },
}

/// What the bucket is believed to hold at one workspace path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRow {
    /// Workspace path, `/`-separated bytes without leading `/`.
    pub path: Vec<u8>,
    /// Object key relative to the workspace prefix (differs from `path` for escaped names).
    /// Directory markers are recorded without the trailing `/`.
    pub key: String,
    /// Inode whose content it holds (0 if unknown).
    pub ino: Ino,
    /// Kind of the inode it represents.
    pub kind: Kind,
    /// Content version of that inode it holds.
    pub data_version: u64,
    /// Attribute stamp it carries (the inode's ctime at upload), to detect chmod/chown.
    pub meta_stamp: i64,
    /// ETag returned by the bucket (S3 API), if any.
    pub etag: Option<String>,
    /// Object size in bytes.
    pub size: u64,
}

/// One path waiting for reconciliation with the bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingRow {
    /// Workspace path.
    pub path: Vec<u8>,
    /// Reconcile the whole subtree under `path` too.
    pub recursive: bool,
    /// Sequence number of the oldest unreconciled mark (sync barriers wait on it).
    pub seq: u64,
    /// Bumped by every re-mark; a worker only clears the row if it is unchanged.
    pub gen: u64,
    /// Not to be attempted before this time (ns).
    pub due_ns: i64,
    /// First mark time (ns); bounds the coalescing delay.
    pub since_ns: i64,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Last failure message.
    pub last_error: Option<String>,
}

/// Summary of pending bucket work.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingStats {
    /// Paths waiting.
    pub pending: u64,
    /// Of those, how many failed at least once.
    pub failing: u64,
    /// Highest sequence number handed out so far.
    pub last_seq: u64,
}

/// Totals over the namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Number of inodes.
    pub inodes: u64,
    /// Sum of file sizes, bytes.
    pub bytes: u64,
    /// Number of inodes with dirty data.
    pub dirty_inodes: u64,
    /// Sum of sizes of dirty inodes, bytes.
    pub dirty_bytes: u64,
}

/// One byte-range lock (POSIX `fcntl` record lock, OFD lock or `flock`), held by an owner
/// (the kernel's lock owner id) through one mount session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRow {
    /// Locked inode.
    pub ino: Ino,
    /// Mount session holding it (see [`MetaTxn::register_session`]).
    pub session: u64,
    /// Lock owner id from the kernel (per process for POSIX locks, per open file for OFD
    /// and flock locks).
    pub owner: u64,
    /// Write (exclusive) lock; else read (shared).
    pub write: bool,
    /// First byte, inclusive.
    pub start: u64,
    /// Last byte, inclusive (`u64::MAX` = to end of file, "whole file").
    pub end: u64,
    /// Process that took it (reported by `F_GETLK`).
    pub pid: u32,
    /// Open file (handle) it was last taken through.
    pub fh: u64,
}

/// A mount session: one live mount of the workspace, kept alive by heartbeats (a lease).
/// Locks and open-file records die with their session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRow {
    /// Session id.
    pub id: u64,
    /// Host name of the mount.
    pub host: String,
    /// Daemon PID on that host.
    pub pid: u32,
    /// Last heartbeat, ns.
    pub heartbeat_ns: i64,
}

/// One entry of the change feed: a namespace or attribute change committed by a mount
/// while other mounts were live. Followers turn it into kernel cache invalidations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeRow {
    /// Position in the feed (strictly increasing).
    pub seq: u64,
    /// Session (mount) that made the change.
    pub session: u64,
    /// Inode whose attributes or content changed (or that a dentry names).
    pub ino: Ino,
    /// For a dentry change: its directory and name (both `None` for an inode change).
    pub parent: Option<Ino>,
    /// See `parent`.
    pub name: Option<Vec<u8>>,
}

/// One namespace fact changed since the last bucket backup (see
/// [`crate::MetaTxn::backup_marks`]): the backup writer reads the current state of what a
/// mark names and writes it (or its absence) into the next backup delta.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BackupMark {
    /// The inode's attributes, symlink target, link count or xattrs changed (or it was
    /// created or deleted).
    Inode(Ino),
    /// The entry `parent/name` was added, removed or repointed.
    Dentry {
        /// Directory.
        parent: Ino,
        /// Entry name.
        name: Vec<u8>,
    },
    /// The object recorded at this workspace path changed (uploaded, forgotten).
    Object(Vec<u8>),
}
