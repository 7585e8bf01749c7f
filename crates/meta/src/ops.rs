//! Operation batches: one namespace change as a list of storage steps that an engine
//! applies atomically in **one round trip** ([`crate::MetaEngine::apply`]).
//!
//! The POSIX rules stay above the engines: the VFS reads what it needs (or knows it from
//! the kernel's previous requests), decides — errno, nlink, which rename case — and
//! writes the outcome as a batch whose *expectations* guard every fact the decision
//! relied on (this entry names that inode, that directory is empty, …). An engine only
//! executes the steps in order inside one transaction; when an expectation does not hold
//! it rolls everything back and returns [`crate::MetaError::Precondition`] with the
//! failing step, and the VFS reads again and decides again. Design record:
//! `docs/design/0002-metadata-engine-interface.md`.
//!
//! Updates of shared rows are written as commutative changes (`nlink = nlink + d`,
//! `mtime = max(mtime, t)`), never as read-modify-write of a whole row, so two mounts
//! changing one directory do not conflict.

use crate::{Ino, InodeRow, Local};

/// A fact a batch step expected and did not find (see [`crate::MetaError::Precondition`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The directory exists, is a directory and was not removed (`nlink > 0`).
    DirAlive,
    /// The name is free in its directory.
    NameFree,
    /// The entry exists and names the expected inode.
    EntryIs,
    /// The directory has no entries.
    DirEmpty,
    /// The moved directory is not the target directory nor one of its ancestors.
    NotAncestor,
    /// The inode exists.
    InodeExists,
    /// The extended attribute does not exist yet (`XATTR_CREATE`).
    XattrAbsent,
    /// The extended attribute exists (`XATTR_REPLACE`, `removexattr`).
    XattrPresent,
    /// The mount session is still registered (its lease was not taken away).
    Session,
    /// The inode's permission bits and owner are still the ones the decision used.
    Attrs,
    /// The inode still has a name (a link to a file whose last name is gone fails).
    Linked,
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expect::DirAlive => "directory alive",
            Expect::NameFree => "name free",
            Expect::EntryIs => "entry names the expected inode",
            Expect::DirEmpty => "directory empty",
            Expect::NotAncestor => "not an ancestor",
            Expect::InodeExists => "inode exists",
            Expect::XattrAbsent => "xattr absent",
            Expect::XattrPresent => "xattr present",
            Expect::Session => "session registered",
            Expect::Attrs => "attributes unchanged",
            Expect::Linked => "inode still linked",
        })
    }
}

/// How `setxattr` treats an existing attribute (Linux `XATTR_CREATE` / `XATTR_REPLACE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum XattrMode {
    /// Create or replace.
    Any,
    /// Fail ([`Expect::XattrAbsent`]) if it exists.
    Create,
    /// Fail ([`Expect::XattrPresent`]) if it does not exist.
    Replace,
}

/// Attribute changes of one inode; `None` leaves a field as it is. Times are ns.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttrUpdate {
    /// Permission bits (`mode & 0o7777`).
    pub perm: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Access time.
    pub atime_ns: Option<i64>,
    /// Modification time.
    pub mtime_ns: Option<i64>,
    /// Status change time: set to at least this (`max(ctime, t)`).
    pub ctime_ns: Option<i64>,
    /// Content dirty flag.
    pub dirty: Option<bool>,
    /// Where the content is held.
    pub local: Option<Local>,
}

/// One step of a batch. Steps run in order; "expects" name the [`Expect`] that fails the
/// batch. All names are raw bytes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// Expects session `0` to be registered ([`Expect::Session`]): fencing. Put first in
    /// every batch of a mount that may have lost its lease.
    CheckSession(u64),
    /// Directory `ino`: `nlink += nlink_delta`, `mtime` and `ctime` set to at least
    /// `time_ns`. Expects [`Expect::DirAlive`]. Also serialises changes of this
    /// directory's entries between engines that lock rows (the row is locked first).
    TouchDir {
        /// Directory.
        ino: Ino,
        /// Link count change (subdirectories added or removed).
        nlink_delta: i64,
        /// New mtime/ctime (lower bound), ns.
        time_ns: i64,
    },
    /// Inserts `0` with its number `0.ino` (allocated with
    /// [`crate::MetaEngine::alloc_inos`]).
    InsertInode(InodeRow),
    /// Adds `parent/name -> ino`. Expects [`Expect::NameFree`].
    InsertDentry {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
        /// Inode it names.
        ino: Ino,
    },
    /// Removes `parent/name`, which must name `ino` ([`Expect::EntryIs`]).
    DeleteDentry {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
        /// Inode it must name.
        ino: Ino,
    },
    /// Moves `parent/name` (which must name `ino`: [`Expect::EntryIs`]) to
    /// `new_parent/new_name` (which must be free: [`Expect::NameFree`]), keeping its
    /// readdir cookie.
    MoveDentry {
        /// Old directory.
        parent: Ino,
        /// Old name.
        name: Vec<u8>,
        /// Inode it must name.
        ino: Ino,
        /// New directory.
        new_parent: Ino,
        /// New name.
        new_name: Vec<u8>,
    },
    /// Points `parent/name` (which must name `from`: [`Expect::EntryIs`]) at `to`.
    RepointDentry {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
        /// Inode it must name now.
        from: Ino,
        /// Inode it names afterwards.
        to: Ino,
    },
    /// Expects `parent/name` to name `ino` ([`Expect::EntryIs`]), or with `None` to be
    /// free ([`Expect::NameFree`]).
    ExpectEntry {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
        /// Inode it must name, or `None` for absent.
        ino: Option<Ino>,
    },
    /// Expects directory `0` to have no entries ([`Expect::DirEmpty`]).
    ExpectEmpty(Ino),
    /// Expects `dir` to be neither `of` nor an ancestor of `of` ([`Expect::NotAncestor`]):
    /// a directory is not moved into itself.
    ExpectNotAncestor {
        /// The directory being moved.
        dir: Ino,
        /// Its new parent.
        of: Ino,
    },
    /// `nlink += delta` (never below 0) and `ctime = max(ctime, ctime_ns)` on inode `ino`.
    /// Expects [`Expect::InodeExists`]; with `delta > 0` also [`Expect::Linked`] (the inode
    /// has `nlink > 0`: an inode whose last name is gone never gets a new one).
    AddNlink {
        /// Inode.
        ino: Ino,
        /// Link count change.
        delta: i64,
        /// New ctime (lower bound), ns.
        ctime_ns: i64,
    },
    /// Expects inode `ino` to have exactly these permission bits, owner and group
    /// ([`Expect::Attrs`]; a missing inode fails the same way): guards decisions made
    /// from attributes read earlier (the group of a setgid directory, chown's clearing
    /// of setuid).
    ExpectAttrs {
        /// Inode.
        ino: Ino,
        /// Permission bits (`mode & 0o7777`).
        perm: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// Applies `set` to inode `ino`. Expects [`Expect::InodeExists`].
    SetAttrs {
        /// Inode.
        ino: Ino,
        /// Changes.
        set: AttrUpdate,
    },
    /// Commits new content of file `ino`: `size`, `mtime`, `ctime = max(ctime, ctime_ns)`,
    /// `data_version + 1`, dirty, held at `local`. Yields [`OpOut::Version`] (the new
    /// content version). Expects [`Expect::InodeExists`].
    CommitContent {
        /// Inode.
        ino: Ino,
        /// New size, bytes.
        size: u64,
        /// New mtime, ns.
        mtime_ns: i64,
        /// New ctime (lower bound), ns.
        ctime_ns: i64,
        /// Where the new content is held.
        local: Local,
    },
    /// Deletes inode `0` (with its xattrs) if it has no names left (`nlink == 0`) and no
    /// mount records it open. Yields [`OpOut::Purged`]. Never fails.
    Purge(Ino),
    /// Deletes inode `0` and its xattrs unconditionally (an empty directory's rmdir).
    DeleteInode(Ino),
    /// Marks the workspace path of `parent/name` pending for the uploader (computed from
    /// the dentries inside the transaction; nothing when `parent` is unreachable). With
    /// `recursive`, everything under it too. Not before `not_before_ns`.
    MarkPath {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
        /// Whole subtree.
        recursive: bool,
        /// Coalescing delay end, ns.
        not_before_ns: i64,
    },
    /// Marks every path of inode `ino` (one per hard link) pending.
    MarkInode {
        /// Inode.
        ino: Ino,
        /// Coalescing delay end, ns.
        not_before_ns: i64,
    },
    /// Adds `delta` to the open count of `ino` in `session` (rows at 0 disappear).
    AddOpen {
        /// Inode.
        ino: Ino,
        /// Session.
        session: u64,
        /// Change.
        delta: i64,
    },
    /// Sets xattr `name` of `ino`; see [`XattrMode`].
    SetXattr {
        /// Inode.
        ino: Ino,
        /// Attribute name.
        name: Vec<u8>,
        /// Value.
        value: Vec<u8>,
        /// Create/replace rule.
        mode: XattrMode,
    },
    /// Removes xattr `name` of `ino`. Expects [`Expect::XattrPresent`].
    RemoveXattr {
        /// Inode.
        ino: Ino,
        /// Attribute name.
        name: Vec<u8>,
    },
    /// Yields [`OpOut::Row`] with the inode as this transaction sees it at this point.
    GetInode(Ino),
    /// Expires mount session `id` if its last heartbeat is older than `stale_before_ns`
    /// (database clock; `i64::MAX` = unconditionally): deletes it with its locks and
    /// open-file records. Every batch or lock transaction that checked the session
    /// ([`Op::CheckSession`], [`crate::MetaTxn::check_session`]) before commits first, so
    /// no record it wrote survives the session. Yields [`OpOut::Purged`] (whether it was
    /// expired).
    ExpireSession {
        /// Session.
        id: u64,
        /// Heartbeat cutoff, ns.
        stale_before_ns: i64,
        /// `Some`: the session may only be paused (it missed its lease; its process may
        /// resume), so its open-file records are kept, moved to session `-id`, with this
        /// record under [`held_opens_key`]`(id)` (when there were any): inodes it had
        /// open stay unpurged until [`Op::ReleaseHeldOpens`]. `None`: they are deleted.
        #[serde(default)]
        hold_opens: Option<HeldOpens>,
    },
    /// Deletes the open-file records kept for expired session `0` (see
    /// [`Op::ExpireSession`]) and their time record. Yields [`OpOut::Done`]. Never fails.
    ReleaseHeldOpens(u64),
}

/// What one step yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpOut {
    /// Nothing to report.
    Done,
    /// [`Op::CommitContent`]: the new content version.
    Version(u64),
    /// [`Op::Purge`]: whether the inode was deleted; [`Op::ExpireSession`]: whether the
    /// session was expired.
    Purged(bool),
    /// [`Op::GetInode`]: the row.
    Row(Option<InodeRow>),
}

impl OpOut {
    /// The row of a [`Op::GetInode`] step.
    pub fn row(&self) -> Option<&InodeRow> {
        match self {
            OpOut::Row(r) => r.as_ref(),
            _ => None,
        }
    }
}

/// Prefix of the workspace records (`kv`) announcing a put in flight: a mount's uploader
/// writes one before it sends a PUT and removes it with the outcome of the upload, so
/// every mount's listing knows the object that may land there is this workspace's own
/// (see [`upload_key`]).
pub const UPLOADS_PREFIX: &str = "upload.";

/// The `kv` key announcing a put of workspace path `path` by mount session `session`:
/// `upload.<path in lowercase hex>.<session>`. Hex keeps path order and prefixes: the
/// keys of paths at or under a directory start with [`uploads_at_or_under`]'s prefix.
pub fn upload_key(path: &[u8], session: u64) -> String {
    format!("{UPLOADS_PREFIX}{}.{session}", hex(path))
}

/// The prefix shared by the [`upload_key`]s of `dir` and of every path under it (and of
/// siblings whose name starts with `dir`'s last one: filter with [`upload_of`] and
/// `paths::is_at_or_under`); `dir` empty: every announced put.
pub fn uploads_at_or_under(dir: &[u8]) -> String {
    format!("{UPLOADS_PREFIX}{}", hex(dir))
}

/// The path and session an [`upload_key`] names (`None` for any other key).
pub fn upload_of(key: &str) -> Option<(Vec<u8>, u64)> {
    let rest = key.strip_prefix(UPLOADS_PREFIX)?;
    let (h, session) = rest.rsplit_once('.')?;
    if h.len() % 2 != 0 {
        return None;
    }
    let path = (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((path, session.parse().ok()?))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Prefix of the workspace records (`kv`) naming expired sessions whose open-file records
/// are held (see [`Op::ExpireSession`]).
pub const HELD_OPENS_PREFIX: &str = "held_opens.";

/// The `kv` key recording since when (database clock, ns, as decimal text) the open-file
/// records of expired session `id` are held.
pub fn held_opens_key(id: u64) -> String {
    format!("{HELD_OPENS_PREFIX}{id}")
}

/// The session a [`held_opens_key`] names (`None` for any other key).
pub fn held_opens_session(key: &str) -> Option<u64> {
    key.strip_prefix(HELD_OPENS_PREFIX)?.parse().ok()
}

/// Why and since when the open-file records of an expired session are held (the value of
/// its [`held_opens_key`] record, as `SINCE_NS PID HOST`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldOpens {
    /// When the session was expired, database clock, ns.
    pub since_ns: i64,
    /// The expired session's daemon process (on `host`).
    pub pid: u32,
    /// The expired session's host name.
    pub host: String,
}

impl HeldOpens {
    /// The record's text.
    pub fn record(&self) -> String {
        format!("{} {} {}", self.since_ns, self.pid, self.host)
    }

    /// Parses [`HeldOpens::record`]'s text (`None` when malformed).
    pub fn parse(text: &str) -> Option<HeldOpens> {
        let mut it = text.splitn(3, ' ');
        Some(HeldOpens {
            since_ns: it.next()?.parse().ok()?,
            pid: it.next()?.parse().ok()?,
            host: it.next()?.to_string(),
        })
    }
}
