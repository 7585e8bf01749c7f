//! Metadata engines for deskfs.
//!
//! The namespace — inodes, dentries, xattrs, and the bookkeeping that links the namespace to
//! the bucket (which objects exist, which paths still have to be synced) — lives in a
//! transactional database. This crate defines the [`MetaEngine`] / [`MetaTxn`] traits and the
//! embedded SQLite backend ([`sqlite::SqliteEngine`]).
//!
//! Engines only *store and transact*: they never decide POSIX rules (errno, nlink, rename
//! cases). Those live once, above the engines, in the VFS core (`deskfs-vfs`).

pub mod error;
pub mod ops;
pub mod postgres;
pub mod sqlite;
#[cfg(test)]
mod suite;
pub mod types;

pub use error::{MetaError, TxnError};
pub use ops::{
    held_opens_key, held_opens_session, upload_key, upload_of, uploads_at_or_under, AttrUpdate,
    Expect, HeldOpens, Op, OpOut, XattrMode, HELD_OPENS_PREFIX, UPLOADS_PREFIX,
};
pub use types::*;

/// Result alias for metadata operations.
pub type Result<T, E = MetaError> = std::result::Result<T, E>;

/// How many times an engine runs a transaction that failed with a retryable error
/// ([`MetaError::is_retryable`]) before giving up.
pub const TXN_ATTEMPTS: u32 = 50;

/// A pending-row sequence bound `upto` as the engines store sequence numbers (signed
/// 64-bit, all positive): bounds past `i64::MAX` mean "every row", not a negative number.
pub(crate) fn seq_bound(upto: u64) -> i64 {
    i64::try_from(upto).unwrap_or(i64::MAX)
}

/// The backoff before attempt `n` (1-based) of a retried transaction: 1 ms doubling up
/// to 100 ms, with jitter (so two contending mounts do not retry in lock step).
pub fn retry_backoff(attempt: u32) -> std::time::Duration {
    let base_us = 1000u64 << attempt.min(7);
    let cap = base_us.min(100_000);
    // Cheap jitter from the clock: 50-150 % of the base.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    std::time::Duration::from_micros(cap / 2 + nanos % cap.max(1))
}

/// Counters of one engine instance (this process), for `deskfs status` and the
/// benchmark's per-operation figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineCounters {
    /// Waits for the database: one per statement or pipelined batch sent and answered
    /// (for SQLite, one per transaction or read: there is no network).
    pub round_trips: u64,
    /// Transactions committed (interactive, batches and single reads excluded).
    pub commits: u64,
    /// Transactions run again after a serialization failure, deadlock or busy database.
    pub retries: u64,
    /// Batches refused by an expectation ([`MetaError::Precondition`]).
    pub preconditions: u64,
    /// Statements that failed with another error.
    pub errors: u64,
    /// Commit windows committed (SQLite while alone; design record 0009).
    pub window_commits: u64,
    /// Requests acknowledged inside commit windows (each with a redo record).
    pub windowed: u64,
    /// Redo records replayed (after a crash, or a failed window commit).
    pub replayed: u64,
    /// Bytes in the redo log now: the open window's requests, not yet committed.
    pub redo_bytes: u64,
    /// Device flushes (`fsync`, `fsyncdir`) answered by flushing the redo log instead of
    /// committing the window (design record 0011).
    pub redo_flushes: u64,
    /// Of those, the ones answered without a device flush: an earlier flush of the log
    /// covered every record they needed (nothing was appended since).
    pub redo_flushes_covered: u64,
}

thread_local! {
    static THREAD_ROUND_TRIPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Database round trips made by the calling thread so far (every engine counts the ones it
/// waits for on the caller's thread): the difference around a request is that request's
/// round trips (`deskfs status`, per FUSE request kind).
pub fn thread_round_trips() -> u64 {
    THREAD_ROUND_TRIPS.with(|c| c.get())
}

/// Counts one round trip for the calling thread (engines call it beside their counters).
pub(crate) fn count_thread_round_trip() {
    THREAD_ROUND_TRIPS.with(|c| c.set(c.get() + 1));
}

/// A wake-up sent between mounts through the engine (PostgreSQL `LISTEN`/`NOTIFY`).
/// Followers treat every signal as a hint to look at the database, never as data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The change feed has new entries.
    Feed,
    /// A lock on the inode was released (blocked `F_SETLKW`/`flock` waiters retry).
    LockFreed(Ino),
    /// Another mount waits for the content of the inode, held only in the local journal
    /// of the mount whose cache is named: upload it now.
    UploadWanted {
        /// Inode.
        ino: Ino,
        /// Cache holding the content ([`Local::At`]).
        cache: u64,
    },
    /// The content of the inode reached the bucket.
    Uploaded(Ino),
    /// Mount sessions changed (one joined, left or was fenced).
    Sessions,
}

/// An opaque position in the change feed, owned by one follower.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedCursor {
    /// Engine-defined (SQLite: the last sequence number applied).
    pub a: u64,
    /// Engine-defined.
    pub b: u64,
}

/// One open metadata database.
///
/// Namespace changes on the request path go through [`MetaEngine::apply`] (one round
/// trip); everything else runs inside [`MetaEngine::txn`]: either all its writes commit,
/// or none do. Commits are crash-safe against a `kill -9` of the process as soon as the
/// call returns; they become durable against power loss after
/// [`MetaEngine::make_durable`].
pub trait MetaEngine: Send + Sync {
    /// Runs `f` inside one write transaction and commits it when `f` returns `Ok`.
    ///
    /// `f` is run again when the transaction fails with a retryable error (serialization
    /// failure, deadlock, busy database; [`TXN_ATTEMPTS`] times with backoff), so it must
    /// not have side effects outside the transaction. An `Err` from `f` rolls the
    /// transaction back and is returned as is (after retries when retryable).
    fn txn(&self, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()>;

    /// Runs `f` in a write transaction serialised with every other `txn_keyed` of the same
    /// `key` and seeing everything committed before it: for read-decide-write sequences
    /// whose writes do not conflict by themselves (two byte-range locks on one inode are two
    /// different rows). PostgreSQL: READ COMMITTED after a transaction-level advisory lock
    /// on the key; SQLite: one writer at a time already. Retried like [`MetaEngine::txn`].
    fn txn_keyed(
        &self,
        _key: u64,
        f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>,
    ) -> Result<()> {
        self.txn(f)
    }

    /// Runs `f` against a consistent read snapshot (no write lock taken). Retried like
    /// [`MetaEngine::txn`].
    fn read(&self, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()>;

    /// Applies `ops` in order, atomically, in one round trip where the engine allows it.
    /// Returns one [`OpOut`] per op. Errors: [`MetaError::Precondition`] (nothing applied)
    /// when an op's expectation fails, [`MetaError::Fenced`] for a failed
    /// [`Op::CheckSession`]; retryable errors are retried inside.
    fn apply(&self, ops: &[Op]) -> Result<Vec<OpOut>>;

    /// The inode row of `ino` (one round trip, no transaction).
    fn get_inode(&self, ino: Ino) -> Result<Option<InodeRow>>;

    /// The inode named `parent/name` (one round trip, no transaction).
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Option<InodeRow>>;

    /// Reserves `n` fresh inode numbers (never handed out again) for [`Op::InsertInode`].
    fn alloc_inos(&self, n: u64) -> Result<std::ops::Range<Ino>>;

    /// Makes every transaction committed so far durable on stable storage (an fsync point,
    /// used by `fsync(2)`/`fsyncdir(2)`). Errors: [`MetaError::Io`] / [`MetaError::Db`].
    fn make_durable(&self) -> Result<()>;

    /// Short description for logs and `deskfs status`, e.g. `sqlite:/path/meta.db`
    /// (never a password).
    fn describe(&self) -> String;

    /// What the workspace uses (`statfs`, `deskfs status`): inodes and bytes, counted over
    /// every inode, so its cost grows with the workspace (a scan). Engines run it where it
    /// holds back no other request when they can; the default is a read transaction.
    /// Errors: the engine's.
    fn usage(&self) -> Result<Usage> {
        let mut out = None;
        self.read(&mut |t| {
            out = Some(t.usage()?);
            Ok(())
        })?;
        // (The closure ran when the read succeeded.)
        Ok(out.unwrap_or_default())
    }

    /// Counters of this engine instance.
    fn counters(&self) -> EngineCounters {
        EngineCounters::default()
    }

    /// Commits what this engine acknowledged but still holds uncommitted (SQLite's commit
    /// window, design record 0009), so that other connections and processes see it —
    /// before a reader of its own connection (the metadata backup) or the end of a mount.
    /// Engines that commit every request have nothing to do.
    fn settle(&self) -> Result<()> {
        Ok(())
    }

    /// Starts logging this connection's namespace and attribute changes into the change
    /// feed, tagged with `session`, whenever another session is registered (a mount that
    /// is alone logs nothing). Engines without a feed return `Ok(())` and log nothing.
    fn log_changes_as(&self, _session: u64) -> Result<()> {
        Ok(())
    }

    /// The current end of the change feed: a follower starting here sees every change
    /// committed after this call.
    fn feed_start(&self) -> Result<FeedCursor>;

    /// Changes after `cursor` (up to `limit`) not made by session `not_session`, oldest
    /// first, and the cursor to continue from. No committed change is ever skipped; a
    /// change may be returned twice (followers' actions are idempotent).
    fn feed_read(
        &self,
        cursor: FeedCursor,
        not_session: u64,
        limit: usize,
    ) -> Result<(Vec<ChangeRow>, FeedCursor)>;

    /// Sends `signal` to the other mounts (no-op where the engine has no notifications).
    fn signal(&self, _signal: &Signal) -> Result<()> {
        Ok(())
    }

    /// Signals from other mounts, for the one follower of this engine (the first caller
    /// gets the receiver, later callers `None`). `None` where the engine has no
    /// notifications: followers poll.
    fn subscribe(&self) -> Option<std::sync::mpsc::Receiver<Signal>> {
        None
    }
}

/// Runs `f` in a write transaction and returns its value (typed wrapper over
/// [`MetaEngine::txn`]). `f` may return the caller's own error type `E` (e.g. a POSIX
/// errno): it comes back as itself, while engine errors inside it stay engine errors (and
/// are retried when retryable).
pub fn txn<T, E: TxnError>(
    engine: &dyn MetaEngine,
    f: impl FnMut(&mut dyn MetaTxn) -> Result<T, E>,
) -> Result<T, E> {
    typed(|body| engine.txn(body), f)
}

/// [`txn`] serialised by `key` (see [`MetaEngine::txn_keyed`]).
pub fn txn_keyed<T, E: TxnError>(
    engine: &dyn MetaEngine,
    key: u64,
    f: impl FnMut(&mut dyn MetaTxn) -> Result<T, E>,
) -> Result<T, E> {
    typed(|body| engine.txn_keyed(key, body), f)
}

/// Runs `f` on a read snapshot and returns its value (typed wrapper over
/// [`MetaEngine::read`], errors as in [`txn`]).
pub fn read<T, E: TxnError>(
    engine: &dyn MetaEngine,
    f: impl FnMut(&mut dyn MetaTxn) -> Result<T, E>,
) -> Result<T, E> {
    typed(|body| engine.read(body), f)
}

/// Runs the typed closure `f` through `run` (one of the engine's untyped entry points):
/// its value comes back, and an error of the caller's type passes through the engine as
/// [`MetaError::Aborted`] and comes out as itself.
fn typed<T, E: TxnError>(
    run: impl FnOnce(&mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()>,
    mut f: impl FnMut(&mut dyn MetaTxn) -> Result<T, E>,
) -> Result<T, E> {
    let mut out = None;
    let mut caller_err = None;
    let res = run(&mut |t| {
        caller_err = None;
        match f(t) {
            Ok(v) => {
                out = Some(v);
                Ok(())
            }
            Err(e) => match e.into_meta() {
                Ok(m) => Err(m),
                Err(e) => {
                    caller_err = Some(e);
                    Err(MetaError::Aborted)
                }
            },
        }
    });
    finish(res, out, caller_err)
}

fn finish<T, E: TxnError>(res: Result<()>, out: Option<T>, caller_err: Option<E>) -> Result<T, E> {
    match res {
        Ok(()) => {
            out.ok_or_else(|| E::from(MetaError::Internal("transaction produced no value".into())))
        }
        Err(MetaError::Aborted) => Err(caller_err
            .unwrap_or_else(|| E::from(MetaError::Internal("aborted without an error".into())))),
        Err(e) => Err(E::from(e)),
    }
}

/// The operations one transaction offers. All names are raw bytes (POSIX names need not be
/// UTF-8); inode numbers are `u64` with [`ROOT_INO`] = 1.
pub trait MetaTxn {
    // ---- inodes ----
    /// The inode row, or `None` when `ino` does not exist.
    fn get_inode(&mut self, ino: Ino) -> Result<Option<InodeRow>>;
    /// Inserts a new inode (the `ino` field of `row` is ignored) and returns its number.
    /// Numbers are never reused within one database.
    fn insert_inode(&mut self, row: &InodeRow) -> Result<Ino>;
    /// Overwrites every column of an existing inode. [`MetaError::NotFound`] if absent.
    fn update_inode(&mut self, row: &InodeRow) -> Result<()>;
    /// Deletes an inode and its xattrs. Dentries must already be gone.
    fn delete_inode(&mut self, ino: Ino) -> Result<()>;
    /// Up to `limit` inodes with number greater than `after`, in order (full scans: fsck).
    fn scan_inodes(&mut self, after: Ino, limit: usize) -> Result<Vec<InodeRow>>;
    /// Up to `limit` dentries with cookie greater than `after`, in order (full scans: fsck).
    fn scan_dentries(&mut self, after: u64, limit: usize) -> Result<Vec<Dentry>>;
    /// Sets an inode's link count (fsck repairs).
    fn set_nlink(&mut self, ino: Ino, nlink: u32) -> Result<()>;
    /// Inodes with `nlink == 0` (orphans left by a crash or by open-unlinked files).
    fn orphan_inodes(&mut self) -> Result<Vec<Ino>>;
    /// Inodes whose data is dirty (local content not yet in the bucket).
    fn dirty_inodes(&mut self) -> Result<Vec<InodeRow>>;
    /// The caches (ids of [`Local::At`]) holding dirty content, ascending, without reading
    /// the dirty rows (a mount checks its cache dir against them: a workspace of a
    /// million unuploaded files must not cost a million rows).
    fn dirty_caches(&mut self) -> Result<Vec<u64>>;
    /// How many dirty inodes hold their content in cache `cache`.
    fn dirty_in_cache(&mut self, cache: u64) -> Result<u64>;

    // ---- dentries ----
    /// Looks `name` up in directory `parent`.
    fn lookup(&mut self, parent: Ino, name: &[u8]) -> Result<Option<Dentry>>;
    /// Adds the entry `parent/name -> ino`. [`MetaError::Conflict`] if the name exists.
    fn insert_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()>;
    /// Removes the entry `parent/name` (no-op if absent).
    fn delete_dentry(&mut self, parent: Ino, name: &[u8]) -> Result<()>;
    /// Moves an entry, keeping its cookie (readdir offset) stable. The target must be free.
    fn move_dentry(
        &mut self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
    ) -> Result<()>;
    /// Points an existing entry at another inode (used by RENAME_EXCHANGE).
    fn repoint_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()>;
    /// Up to `limit` entries of `parent` whose cookie is greater than `after`, in cookie order,
    /// each with its inode row.
    fn list_dir(
        &mut self,
        parent: Ino,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(Dentry, InodeRow)>>;
    /// Whether directory `parent` has any entry.
    fn has_children(&mut self, parent: Ino) -> Result<bool>;
    /// How many entries directory `parent` has, counted up to `cap` (a directory with more
    /// answers `cap`): one index range of at most `cap` entries.
    fn count_children(&mut self, parent: Ino, cap: u64) -> Result<u64>;
    /// Every `(parent, name)` that names `ino` (several for hard links).
    fn names_of(&mut self, ino: Ino) -> Result<Vec<(Ino, Vec<u8>)>>;
    /// The inode at workspace path `path` (`/`-joined names from the root; the empty
    /// path is the root), or `None` when a name on the way is missing. The default walks
    /// the names with [`MetaTxn::lookup`] (one statement each); engines where a statement
    /// is a network round trip resolve the whole path in one.
    fn resolve(&mut self, path: &[u8]) -> Result<Option<Ino>> {
        let mut cur = ROOT_INO;
        if path.is_empty() {
            return Ok(Some(cur));
        }
        for seg in path.split(|b| *b == b'/') {
            match self.lookup(cur, seg)? {
                Some(d) => cur = d.ino,
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }

    /// Every workspace path of `ino` (`/`-joined names from the root, one per hard link,
    /// in the order of their entries' cookies; the root is the empty path). Names under
    /// an unlinked directory have no path and are left out. One statement.
    fn paths_of(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>>;

    // ---- xattrs ----
    /// The value of xattr `name`, or `None`.
    fn get_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Whether `ino` exists, the value of its xattr `name`, and, when that is not set,
    /// whether it has any other: what `getxattr` needs, in one statement on engines where
    /// a statement is a network round trip.
    fn look_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<XattrLook> {
        if self.get_inode(ino)?.is_none() {
            return Ok(XattrLook::NoInode);
        }
        Ok(match self.get_xattr(ino, name)? {
            Some(v) => XattrLook::Value(v),
            None => XattrLook::Missing {
                any: !self.list_xattrs(ino)?.is_empty(),
            },
        })
    }
    /// Sets (creates or replaces) xattr `name`.
    fn set_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()>;
    /// Removes xattr `name`; returns whether it existed.
    fn remove_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<bool>;
    /// All xattr names of `ino`, sorted.
    fn list_xattrs(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>>;

    // ---- bucket sync state: what the bucket holds ----
    /// The object recorded at workspace path `path` (bytes, `/`-separated, no leading `/`).
    fn get_object(&mut self, path: &[u8]) -> Result<Option<ObjectRow>>;
    /// Records (inserts or replaces) the object at `row.path`.
    fn put_object(&mut self, row: &ObjectRow) -> Result<()>;
    /// The objects recorded at any of `paths` (those that exist, in no particular order):
    /// one round trip on engines that can (comparing a bucket listing with what is known).
    fn get_objects(&mut self, paths: &[Vec<u8>]) -> Result<Vec<ObjectRow>> {
        let mut out = Vec::new();
        for p in paths {
            if let Some(o) = self.get_object(p)? {
                out.push(o);
            }
        }
        Ok(out)
    }
    /// Forgets the object at `path`.
    fn delete_object(&mut self, path: &[u8]) -> Result<()>;
    /// Objects whose path is strictly under directory path `dir` (`dir` empty = everything).
    fn objects_under(&mut self, dir: &[u8], limit: usize) -> Result<Vec<ObjectRow>>;
    /// Some object holding content version `data_version` of inode `ino` (a copy source).
    fn object_with_content(&mut self, ino: Ino, data_version: u64) -> Result<Option<ObjectRow>>;

    // ---- bucket sync state: what still has to reach the bucket ----
    /// Marks `path` (and with `recursive`, everything under it) as needing reconciliation
    /// with the bucket, not before `not_before_ns` (coalescing delay). Returns the sequence
    /// number given to this mark (monotonic; used by sync barriers).
    fn mark_pending(&mut self, path: &[u8], recursive: bool, not_before_ns: i64) -> Result<u64>;
    /// Marks `path` as [`MetaTxn::mark_pending`] does, but under sequence number `seq` —
    /// that of the mark whose reconciliation found this work (an upload that landed under
    /// a directory removed meanwhile, say) — or the row's own, whichever is older. A sync
    /// barrier taken after that first mark then waits for this work too, though it was
    /// found after the barrier.
    fn remark_pending(
        &mut self,
        path: &[u8],
        recursive: bool,
        not_before_ns: i64,
        seq: u64,
    ) -> Result<()>;
    /// Up to `limit` pending paths due at `now_ns`, oldest due first.
    fn due_pending(&mut self, now_ns: i64, limit: usize) -> Result<Vec<PendingRow>>;
    /// [`MetaTxn::due_pending`] for mount session `me` when other mounts share the
    /// workspace: the rows `me` marked last (and rows marked outside any session) due at
    /// `now_ns`, the rows other sessions marked only once due at `others_ns` (each mount
    /// uploads what it changed; the others step in for one that is late or gone). Engines
    /// that do not record who marked a row (SQLite: every mount is on one host) give every
    /// row due at `now_ns`.
    fn due_pending_for(
        &mut self,
        now_ns: i64,
        limit: usize,
        me: u64,
        others_ns: i64,
    ) -> Result<Vec<PendingRow>> {
        let _ = (me, others_ns);
        self.due_pending(now_ns, limit)
    }
    /// Removes a pending row if it was not re-marked since `gen` was read.
    fn finish_pending(&mut self, path: &[u8], gen: u64) -> Result<()>;
    /// Records a failed attempt and when to retry.
    fn fail_pending(&mut self, path: &[u8], gen: u64, error: &str, retry_at_ns: i64) -> Result<()>;
    /// Postpones a pending row without counting an attempt (e.g. file still being written).
    fn defer_pending(&mut self, path: &[u8], gen: u64, retry_at_ns: i64) -> Result<()>;
    /// Makes a pending row nobody's (every mount takes it when due; see
    /// [`MetaTxn::due_pending_for`]) if it was not re-marked since `gen` was read: its
    /// marker found the content held only by another mount's cache, whose uploader must
    /// do it. No-op for engines that do not record who marked a row.
    fn disown_pending(&mut self, path: &[u8], gen: u64) -> Result<()> {
        let _ = (path, gen);
        Ok(())
    }
    /// Whether `path` is pending, itself or through a recursive mark of an ancestor.
    fn is_pending(&mut self, path: &[u8]) -> Result<bool>;
    /// Counts and the oldest sequence number of pending work (counting reads every
    /// pending row: for `deskfs status`, not for the request path).
    fn pending_stats(&mut self) -> Result<PendingStats>;
    /// The sequence number of the newest pending mark ever made ([`PendingStats::last_seq`])
    /// without counting rows: one read, whatever the backlog.
    fn pending_last_seq(&mut self) -> Result<u64>;
    /// Whether any pending row has `seq <= upto` (`u64::MAX`: any row).
    fn pending_upto(&mut self, upto: u64) -> Result<bool>;
    /// The most recent failures (path, attempts, error), newest first.
    fn failed_pending(&mut self, limit: usize) -> Result<Vec<PendingRow>>;
    /// Up to `limit` pending rows marked at or before sequence number `upto` whose path
    /// is `dir` itself or lies under it (`dir` empty: every path), oldest mark first
    /// (`upto` = `u64::MAX`: whenever marked). Used by `fsync` of a directory under bucket
    /// durability and by listings (no import where this workspace has work pending).
    fn pending_under(&mut self, dir: &[u8], upto: u64, limit: usize) -> Result<Vec<PendingRow>>;

    // ---- sessions (leases), open files, locks ----
    /// The database's clock, ns since the Unix epoch. Lease times (heartbeats, expiry)
    /// are measured on it, so hosts whose clocks differ still agree on who expired.
    fn db_now_ns(&mut self) -> Result<i64>;
    /// Registers a mount session and returns its id.
    fn register_session(&mut self, host: &str, pid: u32, now_ns: i64) -> Result<u64>;
    /// Renews a session's lease. [`MetaError::NotFound`] if it was expired by someone.
    fn heartbeat(&mut self, session: u64, now_ns: i64) -> Result<()>;
    /// All sessions.
    fn sessions(&mut self) -> Result<Vec<SessionRow>>;
    /// Removes a session with its locks and open-file records.
    fn delete_session(&mut self, session: u64) -> Result<()>;
    /// Fails with [`MetaError::Fenced`] unless `session` is registered, and keeps it from
    /// being expired until this transaction ends (PostgreSQL: a key-share lock on its
    /// row). Lock and open-file transactions call it first.
    fn check_session(&mut self, session: u64) -> Result<()>;
    /// Adds `delta` to the open count of `ino` in `session` (rows at 0 are removed).
    fn add_open(&mut self, ino: Ino, session: u64, delta: i64) -> Result<()>;
    /// Whether any session other than `session` has `ino` open.
    fn open_elsewhere(&mut self, ino: Ino, session: u64) -> Result<bool>;
    /// Every lock on `ino`.
    fn locks_on(&mut self, ino: Ino) -> Result<Vec<LockRow>>;
    /// Replaces all locks of (`ino`, `session`, `owner`) by `locks`.
    fn set_owner_locks(
        &mut self,
        ino: Ino,
        session: u64,
        owner: u64,
        locks: &[LockRow],
    ) -> Result<()>;
    /// Removes the locks of (`ino`, `session`, `owner`) taken through open file `fh`.
    fn delete_fh_locks(&mut self, ino: Ino, session: u64, owner: u64, fh: u64) -> Result<()>;
    /// Number of locks held through `session` (status).
    fn session_lock_count(&mut self, session: u64) -> Result<u64>;

    // ---- content wanted by another mount (close-to-open across caches) ----
    /// Records that a mount waits for the content of `ino`, held only in cache `cache`
    /// (its holder's uploader uploads it at once). Idempotent.
    fn want_upload(&mut self, ino: Ino, cache: u64, now_ns: i64) -> Result<()>;
    /// Inodes whose upload other mounts wait for, held in cache `cache`.
    fn wanted_for(&mut self, cache: u64) -> Result<Vec<Ino>>;
    /// Forgets the upload request for `ino` (its content reached the bucket).
    fn clear_wanted(&mut self, ino: Ino) -> Result<()>;

    // ---- workspace records and counters ----
    /// Reads a workspace-level setting.
    fn get_kv(&mut self, key: &str) -> Result<Option<String>>;
    /// Writes a workspace-level setting.
    fn set_kv(&mut self, key: &str, value: &str) -> Result<()>;
    /// Removes a workspace record (none with that key: nothing happens).
    fn delete_kv(&mut self, key: &str) -> Result<()>;
    /// The workspace records whose key starts with `prefix`, in key order.
    fn kv_with_prefix(&mut self, prefix: &str) -> Result<Vec<(String, String)>>;
    /// Totals for statfs/status.
    fn usage(&mut self) -> Result<Usage>;

    // ---- bucket backup (see the `deskfs-backup` crate) ----
    /// Up to `limit` changes recorded for the bucket backup with a sequence number greater
    /// than `after`, oldest first, with their sequence numbers. Engines without change
    /// marks fail with [`MetaError::Unsupported`].
    fn backup_marks(&mut self, _after: u64, _limit: usize) -> Result<Vec<(u64, BackupMark)>> {
        Err(MetaError::Unsupported {
            engine: "this",
            what: "backup change marks",
        })
    }
    /// The highest backup-mark sequence number handed out so far (0 when none).
    fn backup_mark_end(&mut self) -> Result<u64> {
        Err(MetaError::Unsupported {
            engine: "this",
            what: "backup change marks",
        })
    }
    /// Forgets the backup marks with sequence numbers up to `upto` (they are in a backup).
    fn trim_backup_marks(&mut self, _upto: u64) -> Result<()> {
        Err(MetaError::Unsupported {
            engine: "this",
            what: "backup change marks",
        })
    }
    /// Up to `limit` recorded objects with path greater than `after`, in path order
    /// (full scans: backups, fsck).
    fn scan_objects(&mut self, _after: &[u8], _limit: usize) -> Result<Vec<ObjectRow>> {
        Err(MetaError::Unsupported {
            engine: "this",
            what: "object scans",
        })
    }
    /// Every xattr of `ino` with its value, sorted by name.
    fn xattrs_of(&mut self, ino: Ino) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for name in self.list_xattrs(ino)? {
            if let Some(v) = self.get_xattr(ino, &name)? {
                out.push((name, v));
            }
        }
        Ok(out)
    }
    /// Writes `row` as inode `row.ino` (inserted, or replacing that inode's row), and keeps
    /// later allocations above it: rebuilding a namespace from a backup keeps its inode
    /// numbers.
    fn put_inode_at(&mut self, _row: &InodeRow) -> Result<()> {
        Err(MetaError::Unsupported {
            engine: "this",
            what: "restoring inodes at their numbers",
        })
    }

    // ---- change feed (see `MetaEngine::log_changes_as`) ----
    /// Drops feed entries older than `before_ms` (ms since the Unix epoch); returns how many.
    fn prune_changes(&mut self, before_ms: i64) -> Result<u64>;
}
