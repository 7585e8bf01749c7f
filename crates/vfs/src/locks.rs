//! Byte-range locks (`fcntl` F_SETLK/F_SETLKW/F_GETLK, OFD locks) and `flock`, kept in the
//! metadata engine so that every process and every mount of the workspace sees the same
//! locks. POSIX rules (split, merge, conflicts) live here; the engine only stores rows.
//!
//! Locks belong to an owner (the kernel's lock-owner id) through this mount's session.
//! They are released when the owner unlocks, when the owner closes the file (`flush` for
//! POSIX locks, release of the open file for OFD/flock locks), and when the mount's
//! session dies (lease: no heartbeat for [`LEASE_NS`], or its daemon is gone).

use std::sync::atomic::Ordering;
use std::time::Duration;

use deskfs_meta::{Ino, LockRow, MetaTxn};

use crate::{now_ns, Result, Vfs, VfsError};

/// A session without heartbeat for this long is dead; its locks are released (ns).
pub const LEASE_NS: i64 = 30_000_000_000;
/// Heartbeat period.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

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

fn pid_alive(pid: u32) -> bool {
    pid == 0 || std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl Vfs {
    fn session(&self) -> u64 {
        self.session.load(Ordering::SeqCst)
    }

    fn conflict(
        &self,
        t: &mut dyn MetaTxn,
        ino: Ino,
        owner: u64,
        start: u64,
        end: u64,
        write: bool,
    ) -> deskfs_meta::Result<Option<LockRow>> {
        let s = self.session();
        Ok(t.locks_on(ino)?.into_iter().find(|l| {
            !(l.session == s && l.owner == owner) && overlaps(l, start, end) && (l.write || write)
        }))
    }

    /// `F_GETLK`: the first lock that would block `typ` on `[start, end]` for `owner`, or
    /// `typ = Unlock` when none would.
    pub fn getlk(&self, ino: Ino, owner: u64, start: u64, end: u64, typ: i32) -> Result<LockInfo> {
        let typ = LockType::from_raw(typ)?;
        if start > end {
            return Err(VfsError::Invalid);
        }
        let c = deskfs_meta::read(&*self.meta, |t| {
            self.conflict(t, ino, owner, start, end, typ == LockType::Write)
        })?;
        Ok(match c {
            Some(l) => LockInfo {
                typ: if l.write {
                    LockType::Write
                } else {
                    LockType::Read
                },
                start: l.start,
                end: l.end,
                pid: if l.session == self.session() {
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
        if typ == LockType::Unlock && !self.may_hold_locks(ino) {
            return Ok(());
        }
        let mut wait = Duration::from_millis(1);
        loop {
            let s = self.session();
            let granted = deskfs_meta::txn(&*self.meta, |t| {
                if typ != LockType::Unlock
                    && self
                        .conflict(t, ino, owner, start, end, typ == LockType::Write)?
                        .is_some()
                {
                    return Ok(false);
                }
                let mine: Vec<LockRow> = t
                    .locks_on(ino)?
                    .into_iter()
                    .filter(|l| l.session == s && l.owner == owner)
                    .collect();
                let new = LockRow {
                    ino,
                    session: s,
                    owner,
                    write: typ == LockType::Write,
                    start,
                    end,
                    pid,
                    fh,
                };
                t.set_owner_locks(ino, s, owner, &apply(&mine, &new, typ))?;
                // Inside the transaction (serialized with every other lock change of
                // this mount), so the set never misses a lock that exists.
                if typ != LockType::Unlock {
                    self.note_locks(ino);
                }
                Ok(true)
            })?;
            if granted {
                if typ != LockType::Unlock {
                    // Like NFS: taking a lock revalidates what this mount has cached, so
                    // the holder sees what the previous holder wrote on another mount.
                    self.revalidate(ino, true)?;
                }
                return Ok(());
            }
            if !sleep {
                return Err(VfsError::WouldBlock);
            }
            if !pid_alive(pid) {
                return Err(VfsError::Interrupted);
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_millis(50));
        }
    }

    /// Drops every lock `owner` holds on `ino` through this mount (close of a descriptor
    /// for POSIX locks; last close of an open file for OFD/flock locks).
    pub fn release_locks(&self, ino: Ino, owner: u64) -> Result<()> {
        // Every close comes here: most files were never locked through this mount.
        if !self.may_hold_locks(ino) {
            return Ok(());
        }
        let s = self.session();
        deskfs_meta::txn(&*self.meta, |t| {
            let all = t.locks_on(ino)?;
            if all.iter().any(|l| l.session == s && l.owner == owner) {
                t.set_owner_locks(ino, s, owner, &[])?;
            }
            if !all.iter().any(|l| l.session == s && l.owner != owner) {
                self.forget_locks(ino);
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Whether this mount may hold a lock on `ino` (false: it certainly holds none).
    fn may_hold_locks(&self, ino: Ino) -> bool {
        self.locked_inodes
            .lock()
            .map(|m| m.contains(&ino))
            .unwrap_or(true)
    }

    /// A lock on `ino` may be taken through this mount.
    fn note_locks(&self, ino: Ino) {
        if let Ok(mut m) = self.locked_inodes.lock() {
            m.insert(ino);
        }
    }

    /// No lock of this mount is left on `ino`.
    fn forget_locks(&self, ino: Ino) {
        if let Ok(mut m) = self.locked_inodes.lock() {
            m.remove(&ino);
        }
    }

    /// Drops the locks `owner` took through open file `fh` (the file's last close). A
    /// late release cannot drop a lock that a new open file with a recycled owner id took.
    pub fn release_fh_locks(&self, ino: Ino, owner: u64, fh: u64) -> Result<()> {
        if !self.may_hold_locks(ino) {
            return Ok(());
        }
        let s = self.session();
        deskfs_meta::txn(&*self.meta, |t| t.delete_fh_locks(ino, s, owner, fh))?;
        Ok(())
    }

    /// Registers this mount's session and releases sessions that are dead: same host with
    /// their daemon gone, or any host without heartbeat for [`LEASE_NS`].
    pub(crate) fn start_session(&self) -> Result<()> {
        let host = hostname();
        let me = std::process::id();
        let now = now_ns();
        let id = deskfs_meta::txn(&*self.meta, |t| {
            for s in t.sessions()? {
                let dead = (s.host == host && (s.pid == me || !pid_alive(s.pid)))
                    || now - s.heartbeat_ns > LEASE_NS;
                if dead {
                    t.delete_session(s.id)?;
                }
            }
            t.register_session(&host, me, now)
        })?;
        self.session.store(id, Ordering::SeqCst);
        // Follow other mounts' changes from here on; log ours while others are live.
        self.meta.log_changes_as(id)?;
        self.reset_feed_cursor()?;
        Ok(())
    }

    /// Renews the lease and expires dead sessions (called every [`HEARTBEAT`]).
    pub(crate) fn heartbeat(&self) {
        let now = now_ns();
        let s = self.session();
        let r = deskfs_meta::txn(&*self.meta, |t| {
            let host = hostname();
            for other in t.sessions()? {
                let gone_here =
                    other.host == host && other.pid != std::process::id() && !pid_alive(other.pid);
                if other.id != s && (gone_here || now - other.heartbeat_ns > LEASE_NS) {
                    tracing::warn!(session = other.id, host = %other.host, pid = other.pid, "mount session expired: releasing its locks");
                    t.delete_session(other.id)?;
                }
            }
            t.prune_changes(now / 1_000_000 - crate::feed::FEED_KEEP_MS)?;
            t.heartbeat(s, now)
        });
        if let Err(e) = r {
            tracing::error!(error = %e, "lease renewal failed; registering a new session (locks held through the old one are gone)");
            let _ = self.start_session();
        }
    }

    /// Ends this mount's session (its locks and open-file records go with it).
    pub(crate) fn end_session(&self) {
        let s = self.session();
        let _ = deskfs_meta::txn(&*self.meta, |t| {
            t.delete_session(s)?;
            t.set_kv(&format!("feed_ack.{s}"), "0")
        });
    }
}

fn hostname() -> String {
    nix_hostname().unwrap_or_else(|| "localhost".into())
}

fn nix_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
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
