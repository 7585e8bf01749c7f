//! Byte-range locks (`fcntl` F_SETLK/F_SETLKW/F_GETLK, OFD locks) and `flock`, kept in the
//! metadata engine so that every process and every mount of the workspace sees the same
//! locks. POSIX rules (split, merge, conflicts) live here; the engine only stores rows.
//!
//! Locks belong to an owner (the kernel's lock-owner id) through this mount's session.
//! They are released when the owner unlocks, when the owner closes the file (`flush` for
//! POSIX locks, release of the open file for OFD/flock locks), and when the mount's
//! session dies (its lease expires, or its daemon is gone: see [`crate::session`]).
//!
//! A blocked `F_SETLKW`/`flock` waits for a wake-up: an unlock on this mount, or a
//! [`Signal::LockFreed`] from another (PostgreSQL `NOTIFY`), with a slow poll as the
//! fallback for engines without notifications and for holders that die.
//!
//! While the mount is alone on its workspace its locks are decided in memory
//! ([`Table::Memory`]: no database transaction per `fcntl`; SQLite takes and drops a lock
//! several times per transaction). Locks die with the session anyway, so nothing about
//! them needs to survive a crash. Before this mount acknowledges a newcomer
//! ([`Vfs::publish_opens`](crate::Vfs)), the locks are written to the lock table in the
//! acknowledgement's own transaction and decisions move to the database; the newcomer
//! makes no lock decision before every older mount acknowledged it (or its session
//! expired: [`Vfs::await_lock_acks`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use deskfs_meta::{Ino, LockRow, MetaError, MetaTxn, Signal};

use crate::session::pid_alive;
use crate::{Result, Vfs, VfsError};

/// Longest a blocked lock request sleeps between looks at the lock table when nothing
/// wakes it, with an engine that has no notifications (SQLite: other mounts' unlocks are
/// seen by looking).
const LOCK_POLL_MAX: Duration = Duration::from_millis(50);
/// The same with notifications (PostgreSQL `NOTIFY`): a release anywhere wakes the
/// waiter; looking is only the fallback for holders that die and leases that expire.
const LOCK_POLL_NOTIFIED: Duration = Duration::from_secs(1);

/// Where this mount's lock decisions are made.
#[derive(Default)]
pub(crate) enum Table {
    /// Other mounts may be live: every decision is a transaction on the database's lock
    /// table, keyed by the inode (two mounts deciding on one file are serialised).
    #[default]
    Database,
    /// Alone on the workspace: this session's locks, by inode, are decided here and
    /// nowhere else. `in_db`: inodes on which the database may still hold rows of this
    /// session from before (replaced when the locks are published).
    Memory {
        rows: HashMap<Ino, Vec<LockRow>>,
        in_db: HashSet<Ino>,
    },
}

/// This mount's side of the lock table: which inodes it may hold locks on (closes of
/// other files skip the lock table), where decisions are made, and the wake-up of
/// blocked requests.
#[derive(Default)]
pub(crate) struct LocalLocks {
    /// Inodes this mount may hold locks on. Changed only while `mu`'s guard is held,
    /// around the decision that changes the locks, so it never misses one.
    held: Mutex<HashSet<Ino>>,
    /// Serialises this mount's lock decisions with `held`, and says where they are made.
    mu: Mutex<Table>,
    /// The session every older mount has acknowledged (0: not known yet): lock decisions
    /// wait for that before the first one (see [`Vfs::await_lock_acks`]).
    acked_session: AtomicU64,
    /// When the last successful lease renewal (or registration) of this mount's session
    /// began: decisions in memory are made only while the lease is surely still held.
    renewed: Mutex<Option<Instant>>,
    /// Bumped on every wake-up.
    gen: Mutex<u64>,
    cv: Condvar,
    /// Blocking lock requests that had to wait, since the mount (each counted once).
    waits: AtomicU64,
    /// Blocking lock requests waiting now.
    waiting: AtomicU64,
}

/// A blocking lock request counted as waiting (in [`LocalLocks`]) until dropped.
struct Waiting<'a>(&'a AtomicU64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LocalLocks {
    fn may_hold(&self, ino: Ino) -> bool {
        self.held.lock().map(|m| m.contains(&ino)).unwrap_or(true)
    }

    /// `(waits, waiting)`: blocking lock requests that had to wait since the mount, and
    /// those waiting now.
    pub(crate) fn wait_counts(&self) -> (u64, u64) {
        (
            self.waits.load(Ordering::Relaxed),
            self.waiting.load(Ordering::Relaxed),
        )
    }

    /// Wakes blocked lock requests (a lock was released somewhere).
    pub(crate) fn wake(&self) {
        let mut g = self.gen.lock().unwrap_or_else(|p| p.into_inner());
        *g += 1;
        self.cv.notify_all();
    }

    /// The current wake-up generation.
    fn generation(&self) -> u64 {
        *self.gen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps until a wake-up after generation `seen`, or `d`. Returns whether it was
    /// woken (`false`: `d` ran out with no wake-up since `seen`).
    fn sleep(&self, seen: u64, d: Duration) -> bool {
        let g = self.gen.lock().unwrap_or_else(|p| p.into_inner());
        match self.cv.wait_timeout_while(g, d, |v| *v == seen) {
            Ok((_, r)) => !r.timed_out(),
            Err(p) => !p.into_inner().1.timed_out(),
        }
    }

    /// The session these locks were held through is gone (fenced): decisions go back to
    /// the database until this mount is seen alone again.
    pub(crate) fn forget_all(&self) {
        if let Ok(mut t) = self.mu.lock() {
            *t = Table::Database;
        }
        if let Ok(mut m) = self.held.lock() {
            m.clear();
        }
        self.wake();
    }

    /// A renewal of the session's lease that began at `at` succeeded.
    pub(crate) fn renewed(&self, at: Instant) {
        let mut r = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none_or(|t| t < at) {
            *r = Some(at);
        }
    }

    /// Whether the session's lease is surely held (another mount expires it a lease after
    /// its last renewal; `lease - lease/3` leaves two heartbeat periods of margin).
    fn lease_held(&self, lease: Duration) -> bool {
        self.renewed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() < lease - lease / 3)
    }

    /// Forgets the last renewal, as if the mount had been paused past its lease.
    #[cfg(test)]
    pub(crate) fn forget_renewal(&self) {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Every older mount acknowledged `session` (the mount-time handshake completed).
    pub(crate) fn all_acked(&self, session: u64) {
        self.acked_session.store(session, Ordering::SeqCst);
    }

    fn table(&self) -> Result<MutexGuard<'_, Table>> {
        self.mu.lock().map_err(|_| crate::poisoned())
    }
}

/// The first lock of `rows` held by another owner than `owner` that blocks `[start,
/// end]` (a write lock conflicts with any lock, a read lock with write locks).
fn first_conflict(
    rows: &[LockRow],
    owner: u64,
    start: u64,
    end: u64,
    write: bool,
) -> Option<&LockRow> {
    rows.iter()
        .find(|l| l.owner != owner && overlaps(l, start, end) && (l.write || write))
}

/// `F_RDLCK` / `F_WRLCK` / `F_UNLCK` (Linux values, as the FUSE protocol passes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockType {
    /// Shared lock.
    Read,
    /// Exclusive lock.
    Write,
    /// Unlock.
    Unlock,
}

impl LockType {
    /// From the `l_type` value of `struct flock`. Errors: `EINVAL`.
    pub fn from_raw(t: i32) -> Result<LockType> {
        match t {
            libc::F_RDLCK => Ok(LockType::Read),
            libc::F_WRLCK => Ok(LockType::Write),
            libc::F_UNLCK => Ok(LockType::Unlock),
            _ => Err(VfsError::Invalid),
        }
    }

    /// The `l_type` value.
    pub fn raw(self) -> i32 {
        match self {
            LockType::Read => libc::F_RDLCK,
            LockType::Write => libc::F_WRLCK,
            LockType::Unlock => libc::F_UNLCK,
        }
    }
}

/// A lock as `F_GETLK` reports it. `end` is inclusive; `u64::MAX` means to end of file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// Type (`Unlock` = no conflicting lock).
    pub typ: LockType,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive.
    pub end: u64,
    /// Holder's pid (0 when held through another host's mount).
    pub pid: u32,
}

fn overlaps(l: &LockRow, start: u64, end: u64) -> bool {
    l.start <= end && start <= l.end
}

/// The owner's locks after setting `[start, end]` to `typ` (POSIX: the new range
/// replaces whatever the owner held there; adjacent or overlapping ranges of the same type
/// merge).
fn apply(mine: &[LockRow], new: &LockRow, typ: LockType) -> Vec<LockRow> {
    let mut out: Vec<LockRow> = Vec::new();
    for l in mine {
        if !overlaps(l, new.start, new.end) {
            out.push(l.clone());
            continue;
        }
        if l.start < new.start {
            out.push(LockRow {
                end: new.start - 1,
                ..l.clone()
            });
        }
        if l.end > new.end {
            out.push(LockRow {
                start: new.end + 1,
                ..l.clone()
            });
        }
    }
    if typ != LockType::Unlock {
        out.push(new.clone());
    }
    out.sort_by_key(|l| l.start);
    let mut merged: Vec<LockRow> = Vec::new();
    for l in out {
        if let Some(last) = merged.last_mut() {
            if last.write == l.write && last.end != u64::MAX && last.end + 1 >= l.start {
                last.end = last.end.max(l.end);
                continue;
            }
        }
        merged.push(l);
    }
    merged
}

/// What a lock request may wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Nothing: `EAGAIN` on a conflict and before other mounts acknowledged this one.
    Never,
    /// Other mounts' acknowledgement of this one (up to `JOIN_WAIT`), not a conflict
    /// (`F_SETLK`).
    Acks,
    /// The grant (`F_SETLKW`).
    Granted,
}

impl Vfs {
    fn conflict(
        &self,
        t: &mut dyn MetaTxn,
        ino: Ino,
        owner: u64,
        start: u64,
        end: u64,
        write: bool,
    ) -> deskfs_meta::Result<Option<LockRow>> {
        let s = self.coherence.session();
        Ok(t.locks_on(ino)?.into_iter().find(|l| {
            !(l.session == s && l.owner == owner) && overlaps(l, start, end) && (l.write || write)
        }))
    }

    /// The decision lock (see [`Table`]).
    pub(crate) fn locks_table(&self) -> Result<MutexGuard<'_, Table>> {
        self.locks.table()
    }

    /// Makes lock decisions in memory from now on, if this mount is alone (checked again
    /// here, under the decision lock: an acknowledgement given since a stale look at the
    /// session table keeps them in the database). Loads this session's rows from the
    /// database first.
    pub(crate) fn locks_alone(&self) -> Result<()> {
        let mut table = self.locks.table()?;
        if matches!(*table, Table::Memory { .. }) {
            return Ok(());
        }
        let me = self.coherence.session();
        let held: Vec<Ino> = self
            .locks
            .held
            .lock()
            .map_err(|_| crate::poisoned())?
            .iter()
            .copied()
            .collect();
        let mine = deskfs_meta::read(&*self.meta, |t| {
            if t.sessions()?.iter().any(|s| s.id != me) {
                return Ok(None);
            }
            let mut rows: HashMap<Ino, Vec<LockRow>> = HashMap::new();
            for &ino in &held {
                let v: Vec<LockRow> = t
                    .locks_on(ino)?
                    .into_iter()
                    .filter(|l| l.session == me)
                    .collect();
                if !v.is_empty() {
                    rows.insert(ino, v);
                }
            }
            Ok::<_, MetaError>(Some(rows))
        })?;
        if let Some(rows) = mine {
            let in_db = rows.keys().copied().collect();
            *table = Table::Memory { rows, in_db };
            tracing::debug!("alone: lock decisions in memory");
        }
        Ok(())
    }

    /// Inside the transaction that acknowledges another mount: writes the locks decided
    /// in memory to the lock table (replacing this session's older rows). The caller
    /// holds the decision lock (`table`) across the transaction and moves it to
    /// [`Table::Database`] once it committed.
    pub(crate) fn publish_locks(
        &self,
        t: &mut dyn MetaTxn,
        table: &Table,
    ) -> deskfs_meta::Result<()> {
        let Table::Memory { rows, in_db } = table else {
            return Ok(());
        };
        let me = self.coherence.session();
        for &ino in rows.keys().chain(in_db.iter()).collect::<HashSet<_>>() {
            let mut owners: HashSet<u64> = t
                .locks_on(ino)?
                .into_iter()
                .filter(|l| l.session == me)
                .map(|l| l.owner)
                .collect();
            let mine = rows.get(&ino).map(Vec::as_slice).unwrap_or(&[]);
            owners.extend(mine.iter().map(|l| l.owner));
            for owner in owners {
                let v: Vec<LockRow> = mine.iter().filter(|l| l.owner == owner).cloned().collect();
                t.set_owner_locks(ino, me, owner, &v)?;
            }
        }
        Ok(())
    }

    /// Before a lock decision in memory: the session's lease must surely be held (a mount
    /// paused or cut off past its lease may have been expired, and another mount may
    /// decide alone now). When the last renewal is too old, renews it here (which fences
    /// a lost session); when that fails, no decision is made (`EIO`).
    fn lease_for_memory(&self) -> Result<()> {
        if !matches!(*self.locks.table()?, Table::Memory { .. }) {
            return Ok(());
        }
        let lease = self.cfg.lease;
        if self.locks.lease_held(lease) {
            return Ok(());
        }
        self.heartbeat();
        if self.locks.lease_held(lease) || !matches!(*self.locks.table()?, Table::Memory { .. }) {
            return Ok(());
        }
        Err(VfsError::Meta(MetaError::Internal(
            "cannot renew this mount's session lease: no lock decision without it".into(),
        )))
    }

    /// Before this mount's first lock decision in a session: waits until every older
    /// mount has acknowledged the session (they publish the locks they decided in memory
    /// before they do) or its session expired (a paused mount: at most a lease). Usually
    /// the mount-time handshake settled it already. `pid`/`wait_for`: the request's — one
    /// that waits for nothing gives up with `EAGAIN` at once, a non-blocking one after
    /// `JOIN_WAIT`, a blocking one with `EINTR` when its process is gone.
    fn await_lock_acks(&self, pid: u32, wait_for: Wait) -> Result<()> {
        if self.locks_ready() {
            return Ok(());
        }
        if wait_for == Wait::Never {
            return Err(VfsError::WouldBlock);
        }
        let sleep = wait_for == Wait::Granted;
        let me = self.coherence.session();
        let start = Instant::now();
        let mut warned = false;
        loop {
            let pending = self.unacked_peers()?;
            if pending.is_empty() {
                self.locks.all_acked(me);
                return Ok(());
            }
            if !sleep && start.elapsed() >= crate::feed::JOIN_WAIT {
                return Err(VfsError::WouldBlock);
            }
            if sleep && pid != 0 && !pid_alive(pid) {
                return Err(VfsError::Interrupted);
            }
            if !warned && start.elapsed() >= crate::feed::JOIN_WAIT {
                warned = true;
                tracing::warn!(sessions = ?pending, "a lock request waits for other mounts to acknowledge this one (or for their sessions to expire)");
            }
            let _ = self.meta.signal(&Signal::Sessions);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether a lock request on this mount is decided without waiting for other mounts
    /// to acknowledge it (they all have: see `await_lock_acks`).
    fn locks_ready(&self) -> bool {
        self.locks.acked_session.load(Ordering::SeqCst) == self.coherence.session()
    }

    /// A blocking request (`F_SETLKW`, `flock` without `LOCK_NB`) tried at once on the
    /// calling thread, before it waits on a thread of its own: [`Vfs::setlk`] without
    /// waiting for anything — a conflict, or other mounts' acknowledgement of this one —
    /// `EAGAIN` (`VfsError::WouldBlock`) then.
    #[allow(clippy::too_many_arguments)]
    pub fn try_setlk_at_once(
        &self,
        ino: Ino,
        fh: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> Result<()> {
        self.setlk_inner(ino, fh, owner, start, end, typ, pid, Wait::Never)
    }

    /// `F_GETLK`: the first lock that would block `typ` on `[start, end]` for `owner`, or
    /// `typ = Unlock` when none would.
    pub fn getlk(&self, ino: Ino, owner: u64, start: u64, end: u64, typ: i32) -> Result<LockInfo> {
        let typ = LockType::from_raw(typ)?;
        if start > end {
            return Err(VfsError::Invalid);
        }
        self.await_lock_acks(0, Wait::Granted)?;
        self.lease_for_memory()?;
        let write = typ == LockType::Write;
        let c = match &*self.locks.table()? {
            Table::Memory { rows, .. } => rows
                .get(&ino)
                .and_then(|v| first_conflict(v, owner, start, end, write))
                .cloned(),
            Table::Database => deskfs_meta::read(&*self.meta, |t| {
                self.conflict(t, ino, owner, start, end, write)
            })?,
        };
        Ok(match c {
            Some(l) => LockInfo {
                typ: if l.write {
                    LockType::Write
                } else {
                    LockType::Read
                },
                start: l.start,
                end: l.end,
                pid: if l.session == self.coherence.session() {
                    l.pid
                } else {
                    0
                },
            },
            None => LockInfo {
                typ: LockType::Unlock,
                start,
                end,
                pid: 0,
            },
        })
    }

    /// `F_SETLK` (`sleep = false`: `EAGAIN` on conflict) / `F_SETLKW` (`sleep = true`:
    /// waits until granted, `EINTR` if the requesting process `pid` goes away) and `flock`.
    /// `fh` records which open file took the lock so that its release drops it.
    #[allow(clippy::too_many_arguments)]
    pub fn setlk(
        &self,
        ino: Ino,
        fh: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
    ) -> Result<()> {
        let wait = if sleep { Wait::Granted } else { Wait::Acks };
        self.setlk_inner(ino, fh, owner, start, end, typ, pid, wait)
    }

    #[allow(clippy::too_many_arguments)]
    fn setlk_inner(
        &self,
        ino: Ino,
        fh: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        wait_for: Wait,
    ) -> Result<()> {
        let sleep = wait_for == Wait::Granted;
        let typ = LockType::from_raw(typ)?;
        if start > end {
            return Err(VfsError::Invalid);
        }
        if let Ok(hs) = self.handles.lock() {
            if let Some(h) = hs.get(&fh) {
                if let Ok(mut owners) = h.lock_owners.lock() {
                    owners.insert(owner);
                }
            }
        }
        // Unlocking where this mount holds nothing (SQLite unlocks far more often than it
        // locks) needs no transaction.
        if typ == LockType::Unlock && !self.locks.may_hold(ino) {
            return Ok(());
        }
        if typ == LockType::Unlock {
            // Lock-to-read coherence (as NFS): what was written under the lock is
            // committed before the lock goes, so the next holder — on any mount or host,
            // which revalidates when it takes the lock — reads it.
            self.commit_pending(ino)?;
        }
        self.await_lock_acks(pid, wait_for)?;
        let mut wait = Duration::from_millis(1);
        let mut waiting: Option<Waiting> = None;
        loop {
            let seen = self.locks.generation();
            self.lease_for_memory()?;
            let granted = {
                let mut table = self.locks.table()?;
                let s = self.coherence.session();
                let write = typ == LockType::Write;
                // The range as this owner asks for it (see `apply`).
                let new = LockRow {
                    ino,
                    session: s,
                    owner,
                    write,
                    start,
                    end,
                    pid,
                    fh,
                };
                if let Table::Memory { rows, .. } = &mut *table {
                    let mine = rows.entry(ino).or_default();
                    let granted = typ == LockType::Unlock
                        || first_conflict(mine, owner, start, end, write).is_none();
                    if granted {
                        let (theirs, own): (Vec<LockRow>, Vec<LockRow>) =
                            mine.drain(..).partition(|l| l.owner != owner);
                        *mine = theirs;
                        mine.extend(apply(&own, &new, typ));
                    }
                    if mine.is_empty() {
                        rows.remove(&ino);
                        self.forget_locks(ino);
                    } else if granted {
                        self.note_locks(ino);
                    }
                    granted
                } else {
                    // Keyed by the inode: two mounts deciding on locks of one file at once are
                    // serialised (each sees the other's grant).
                    let granted = deskfs_meta::txn_keyed(&*self.meta, ino, |t| {
                        t.check_session(s)?;
                        if typ != LockType::Unlock
                            && self.conflict(t, ino, owner, start, end, write)?.is_some()
                        {
                            return Ok(false);
                        }
                        let mine: Vec<LockRow> = t
                            .locks_on(ino)?
                            .into_iter()
                            .filter(|l| l.session == s && l.owner == owner)
                            .collect();
                        t.set_owner_locks(ino, s, owner, &apply(&mine, &new, typ))?;
                        Ok::<_, MetaError>(true)
                    });
                    let granted = match granted {
                        Ok(g) => g,
                        Err(e) => {
                            // A lost session re-registers (and looks at the session table,
                            // which takes the decision lock): not under it.
                            drop(table);
                            return Err(self.on_meta_error(e));
                        }
                    };
                    if granted && typ != LockType::Unlock {
                        self.note_locks(ino);
                    }
                    granted
                }
            };
            if granted {
                if typ == LockType::Unlock {
                    self.lock_freed(ino);
                } else {
                    // Like NFS: taking a lock revalidates what this mount has cached, so
                    // the holder sees what the previous holder wrote on another mount.
                    // Alone, there is none: a mount that joins waits for this one's
                    // acknowledgement before it serves requests (`await_peer_acks`, up to
                    // JOIN_WAIT), and from then on this one is shared. The row read is
                    // saved (SQLite takes 9 locks per transaction).
                    if self.shared() {
                        self.revalidate(ino, true)?;
                    }
                }
                return Ok(());
            }
            if !sleep {
                return Err(VfsError::WouldBlock);
            }
            if !pid_alive(pid) {
                return Err(VfsError::Interrupted);
            }
            if waiting.is_none() {
                self.locks.waits.fetch_add(1, Ordering::Relaxed);
                self.locks.waiting.fetch_add(1, Ordering::Relaxed);
                waiting = Some(Waiting(&self.locks.waiting));
            }
            self.locks.sleep(seen, wait);
            let max = if self.coherence.notified() {
                LOCK_POLL_NOTIFIED
            } else {
                LOCK_POLL_MAX
            };
            wait = (wait * 2).min(max);
        }
    }

    /// A lock on `ino` was released through this mount: wake local waiters and tell the
    /// other mounts.
    fn lock_freed(&self, ino: Ino) {
        self.locks.wake();
        if self.shared() {
            let _ = self.meta.signal(&Signal::LockFreed(ino));
        }
    }

    /// Commits the uncommitted writes of `ino`, if it has any (before a lock on it goes).
    fn commit_pending(&self, ino: Ino) -> Result<()> {
        let st = self
            .inodes
            .lock()
            .map_err(|_| crate::poisoned())?
            .get(&ino)
            .cloned();
        if st.is_some() {
            self.locked(ino, |s| {
                self.commit_locked(ino, s, crate::data::CommitSync::Commit)
            })?;
        }
        Ok(())
    }

    /// Drops every lock `owner` holds on `ino` through this mount (close of a descriptor
    /// for POSIX locks; last close of an open file for OFD/flock locks). Writes still
    /// uncommitted are committed first (see [`Vfs::setlk`]).
    pub fn release_locks(&self, ino: Ino, owner: u64) -> Result<()> {
        // Every close comes here: most files were never locked through this mount.
        if !self.locks.may_hold(ino) {
            return Ok(());
        }
        self.commit_pending(ino)?;
        let mut table = self.locks.table()?;
        if let Table::Memory { rows, .. } = &mut *table {
            let Some(v) = rows.get_mut(&ino) else {
                return Ok(());
            };
            let before = v.len();
            v.retain(|l| l.owner != owner);
            let freed = v.len() < before;
            if v.is_empty() {
                rows.remove(&ino);
                self.forget_locks(ino);
            }
            drop(table);
            if freed {
                self.lock_freed(ino);
            }
            return Ok(());
        }
        let _mu = table;
        let s = self.coherence.session();
        let (freed, none_left) = deskfs_meta::txn_keyed(&*self.meta, ino, |t| {
            let all = t.locks_on(ino)?;
            let mine = all.iter().any(|l| l.session == s && l.owner == owner);
            if mine {
                t.set_owner_locks(ino, s, owner, &[])?;
            }
            let others_mine = all.iter().any(|l| l.session == s && l.owner != owner);
            Ok::<_, MetaError>((mine, !others_mine))
        })?;
        if none_left {
            self.forget_locks(ino);
        }
        drop(_mu);
        if freed {
            self.lock_freed(ino);
        }
        Ok(())
    }

    /// A lock on `ino` may be taken through this mount (caller holds `locks.mu`).
    fn note_locks(&self, ino: Ino) {
        if let Ok(mut m) = self.locks.held.lock() {
            m.insert(ino);
        }
    }

    /// No lock of this mount is left on `ino` (caller holds `locks.mu`).
    fn forget_locks(&self, ino: Ino) {
        if let Ok(mut m) = self.locks.held.lock() {
            m.remove(&ino);
        }
    }

    /// Drops the locks `owner` took through open file `fh` (the file's last close). A
    /// late release cannot drop a lock that a new open file with a recycled owner id took.
    pub fn release_fh_locks(&self, ino: Ino, owner: u64, fh: u64) -> Result<()> {
        if !self.locks.may_hold(ino) {
            return Ok(());
        }
        self.commit_pending(ino)?;
        let s = self.coherence.session();
        {
            let mut table = self.locks.table()?;
            match &mut *table {
                Table::Memory { rows, .. } => {
                    if let Some(v) = rows.get_mut(&ino) {
                        v.retain(|l| !(l.owner == owner && l.fh == fh));
                        if v.is_empty() {
                            rows.remove(&ino);
                            self.forget_locks(ino);
                        }
                    }
                }
                Table::Database => deskfs_meta::txn_keyed(&*self.meta, ino, |t| {
                    t.delete_fh_locks(ino, s, owner, fh)
                })?,
            }
        }
        self.lock_freed(ino);
        Ok(())
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn row(start: u64, end: u64, write: bool) -> LockRow {
        LockRow {
            ino: 1,
            session: 1,
            owner: 1,
            write,
            start,
            end,
            pid: 1,
            fh: 1,
        }
    }

    /// A blocked request sleeps until a release anywhere wakes it: a wake-up after the
    /// generation it saw ends its sleep (also one that came before it began to sleep), and
    /// nothing else does. Without wake-ups a waiter still gets the lock at its next look
    /// (≤ 50 ms, or 1 s with notifications), so only this shows them missing.
    #[test]
    fn a_sleeping_lock_request_is_woken_by_a_release_and_only_by_one() {
        let l = LocalLocks::default();
        l.wake();
        l.wake();
        let seen = l.generation();
        assert_eq!(seen, 2, "each wake-up is one generation");
        assert!(
            !l.sleep(seen, Duration::from_millis(20)),
            "nothing woke it, yet it did not time out"
        );
        std::thread::scope(|s| {
            let sleeper = s.spawn(|| l.sleep(seen, Duration::from_secs(5)));
            l.wake();
            assert!(sleeper.join().expect("sleeper"), "the wake-up was missed");
        });
        assert_eq!(l.generation(), seen + 1);
        assert!(
            l.sleep(seen, Duration::ZERO),
            "a wake-up before the sleep counts"
        );
    }

    /// A thread that panicked holding the wake-up lock (poisoning it) changes nothing:
    /// a sleep still tells a wake-up from a timeout.
    #[test]
    fn a_poisoned_wake_up_lock_still_tells_a_wake_up_from_a_timeout() {
        let l = LocalLocks::default();
        std::thread::scope(|s| {
            let poisoner = s.spawn(|| {
                let _g = l.gen.lock().expect("gen");
                panic!("poisons the lock on purpose");
            });
            assert!(poisoner.join().is_err());
        });
        assert!(l.gen.is_poisoned());
        let seen = l.generation();
        assert!(
            !l.sleep(seen, Duration::from_millis(20)),
            "nothing woke it, yet it did not time out"
        );
        l.wake();
        assert!(l.sleep(seen, Duration::ZERO), "the wake-up was missed");
    }

    /// The lease is counted from the start of the latest renewal that succeeded: a later
    /// one moves it on, an earlier one that finished late does not move it back.
    #[test]
    fn the_lease_counts_from_the_latest_renewal_that_succeeded() {
        let l = LocalLocks::default();
        let t0 = Instant::now();
        let (t1, t2) = (t0 + Duration::from_secs(1), t0 + Duration::from_secs(2));
        l.renewed(t1);
        l.renewed(t2);
        l.renewed(t0);
        assert_eq!(*l.renewed.lock().expect("renewed"), Some(t2));
    }

    /// Lock decisions are made in memory only while the lease is surely held: the last
    /// renewal began less than `lease - lease/3` ago (two heartbeats of margin before
    /// another mount may expire the session and take its locks).
    #[test]
    fn the_lease_is_surely_held_only_within_two_thirds_of_it() {
        let l = LocalLocks::default();
        let lease = Duration::from_secs(30);
        assert!(!l.lease_held(lease), "never renewed");
        let ago = |s| {
            Instant::now()
                .checked_sub(Duration::from_secs(s))
                .expect("clock")
        };
        l.renewed(ago(5));
        assert!(l.lease_held(lease), "renewed 5 s ago");
        l.forget_renewal();
        l.renewed(ago(25));
        assert!(
            !l.lease_held(lease),
            "25 s into a 30 s lease is past its two thirds"
        );
    }

    #[test]
    fn split_and_merge() {
        let mine = vec![row(0, 99, true)];
        // unlock the middle: two pieces
        let v = apply(&mine, &row(10, 19, false), LockType::Unlock);
        assert_eq!(
            v.iter().map(|l| (l.start, l.end)).collect::<Vec<_>>(),
            vec![(0, 9), (20, 99)]
        );
        // downgrade a middle piece to read: three pieces
        let v = apply(&mine, &row(10, 19, false), LockType::Read);
        assert_eq!(v.len(), 3);
        assert!(!v[1].write);
        // re-lock the hole as write: merges back to one
        let v2 = apply(
            &apply(&mine, &row(10, 19, false), LockType::Unlock),
            &row(10, 19, true),
            LockType::Write,
        );
        assert_eq!(
            v2.iter().map(|l| (l.start, l.end)).collect::<Vec<_>>(),
            vec![(0, 99)]
        );
        // whole file
        let v = apply(&[], &row(0, u64::MAX, true), LockType::Write);
        assert_eq!(v.len(), 1);
        let v = apply(&v, &row(0, u64::MAX, true), LockType::Unlock);
        assert!(v.is_empty());
    }
}
