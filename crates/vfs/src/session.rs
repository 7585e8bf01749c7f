//! Mount sessions: the lease under which a mount's locks and open-file records are valid.
//!
//! A mount registers a session when it starts and renews it every
//! [`VfsConfig::lease`](crate::VfsConfig)/6 (the heartbeat). Any mount expires sessions that
//! missed their lease (measured on the database's clock, so hosts' clocks need not agree)
//! or whose daemon is gone from this host, and cleans up after them: their locks and
//! open-file records go with the session row, and the orphans (`nlink == 0`) nobody holds
//! any more are purged. A mount that finds its own session gone was fenced (see
//! [`crate::coherence`]).
//!
//! A session that only missed its lease may belong to a daemon that is paused (SIGSTOP,
//! a suspended machine, a long stall) and resumes later, with files open whose names
//! other mounts removed meanwhile. Its locks go at once (others must make progress), but
//! its open-file records are *held* (moved to session `-id`, see
//! [`deskfs_meta::Op::ExpireSession`]) for [`VfsConfig::expired_open_grace`](crate::VfsConfig):
//! until then no mount purges those inodes, so the resumed daemon, fenced and registered
//! anew, still reads what its processes hold open, as on ext4. Held records are released
//! when the grace runs out, when their daemon registers again (fenced), or when their
//! daemon is known dead (a gone process of this host). A session of this host whose
//! process is gone is expired without a hold.

use std::time::Duration;

use deskfs_meta::{HeldOpens, MetaError, Op, OpOut, SessionRow};

use crate::{now_ns, Result, Vfs};

/// The host name mounts are told apart by (the UTS name: network namespaces with their
/// own UTS namespace count as hosts).
pub fn hostname() -> String {
    // Read once: the session rows this process registers carry this name, and the feed
    // compares other sessions with it every poll (a later change of the host's name must
    // not make this mount's own sessions look like another host's).
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "localhost".into())
    })
    .clone()
}

/// Whether process `pid` of this host exists (0 = unknown: treated as alive).
pub(crate) fn pid_alive(pid: u32) -> bool {
    pid == 0 || std::path::Path::new(&format!("/proc/{pid}")).exists()
}

thread_local! {
    /// This thread is re-registering this mount's session (inside `Vfs::fenced`).
    static FENCING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears [`FENCING`] when the re-registration of this thread ends.
struct FencingHere;

impl Drop for FencingHere {
    fn drop(&mut self) {
        FENCING.with(|f| f.set(false));
    }
}

/// A session found dead, with what its expiry must do.
struct Dead {
    row: SessionRow,
    /// Heartbeat cutoff its expiry checks (database clock, ns): a session that renews
    /// meanwhile survives.
    cutoff: i64,
    /// `Some` when it may only be paused: its open-file records are held.
    hold: Option<HeldOpens>,
}

impl Vfs {
    /// The heartbeat period: a sixth of the lease.
    pub(crate) fn heartbeat_period(&self) -> Duration {
        self.cfg.lease / 6
    }

    fn lease_ns(&self) -> i64 {
        self.cfg.lease.as_nanos() as i64
    }

    /// Registers this mount's session (expiring dead ones first) and starts following the
    /// change feed from its current end.
    pub(crate) fn start_session(&self) -> Result<()> {
        let host = hostname();
        let me = self.pid;
        let began = std::time::Instant::now();
        let (id, dead) = deskfs_meta::txn(&*self.meta, |t| {
            let now = t.db_now_ns()?;
            let dead = self.dead_sessions(&t.sessions()?, now, None);
            Ok::<_, MetaError>((t.register_session(&host, me, now)?, dead))
        })?;
        self.expire(&dead);
        self.coherence.set_session(id);
        self.locks.renewed(began);
        // Log ours while others are live; follow theirs from here on.
        self.meta.log_changes_as(id)?;
        self.coherence.set_cursor(self.meta.feed_start()?);
        self.observe_sessions()?;
        let _ = self.meta.signal(&deskfs_meta::Signal::Sessions);
        Ok(())
    }

    /// The sessions of `sessions` (other than `me`) that are dead at database time `now`:
    /// no heartbeat for a lease, or a daemon of this host that is gone (or this very
    /// process's old one). Each with the heartbeat cutoff its expiry must check, so a
    /// session that renews meanwhile survives.
    fn dead_sessions(&self, sessions: &[SessionRow], now: i64, me: Option<u64>) -> Vec<Dead> {
        let host = hostname();
        let pid = self.pid;
        let lease = self.lease_ns();
        sessions
            .iter()
            .filter(|s| Some(s.id) != me)
            .filter_map(|s| {
                if s.host == host && (s.pid == pid || !pid_alive(s.pid)) {
                    Some(Dead {
                        row: s.clone(),
                        cutoff: i64::MAX,
                        hold: None,
                    })
                } else if now - s.heartbeat_ns > lease {
                    Some(Dead {
                        row: s.clone(),
                        cutoff: now - lease,
                        hold: Some(HeldOpens {
                            since_ns: now,
                            pid: s.pid,
                            host: s.host.clone(),
                        }),
                    })
                } else {
                    None
                }
            })
            .collect()
    }

    /// The expired sessions whose held open-file records are due for release at
    /// database time `now`: held longer than the grace, or of a daemon of this host that
    /// is gone (the same rules as [`Vfs::dead_sessions`]).
    fn held_due(&self, held: &[(String, String)], now: i64) -> Vec<u64> {
        let host = hostname();
        let grace = self.cfg.expired_open_grace.as_nanos() as i64;
        held.iter()
            .filter_map(|(k, v)| {
                let id = deskfs_meta::held_opens_session(k)?;
                // A malformed record holds nothing worth keeping.
                let due = HeldOpens::parse(v).is_none_or(|h| {
                    now.saturating_sub(h.since_ns) > grace || (h.host == host && !pid_alive(h.pid))
                });
                due.then_some(id)
            })
            .collect()
    }

    /// Releases the held open-file records of expired sessions `ids`, then purges the
    /// orphans nobody holds any more.
    fn release_held(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        let ops: Vec<Op> = ids.iter().map(|id| Op::ReleaseHeldOpens(*id)).collect();
        match self.meta.apply(&ops) {
            Ok(_) => {
                tracing::info!(sessions = ?ids, "released the open files held for expired mount sessions");
                if let Err(e) = self.purge_unheld_orphans() {
                    tracing::warn!(error = %e, "cannot purge the orphans of expired sessions");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot release the open files held for expired sessions; retrying")
            }
        }
    }

    /// Expires `dead` sessions (one batch), then purges the orphans nobody holds any
    /// more.
    fn expire(&self, dead: &[Dead]) {
        if dead.is_empty() {
            return;
        }
        let ops: Vec<Op> = dead
            .iter()
            .map(|d| Op::ExpireSession {
                id: d.row.id,
                stale_before_ns: d.cutoff,
                hold_opens: d.hold.clone(),
            })
            .collect();
        match self.meta.apply(&ops) {
            Ok(out) => {
                let mut any = false;
                for (d, o) in dead.iter().zip(out) {
                    if o == OpOut::Purged(true) {
                        any = true;
                        let s = &d.row;
                        if d.hold.is_some() {
                            tracing::warn!(session = s.id, host = %s.host, pid = s.pid, grace_s = self.cfg.expired_open_grace.as_secs(), "mount session expired (missed its lease): its locks are released; the files it has open stay readable for it for the grace, in case it was only paused");
                        } else {
                            tracing::warn!(session = s.id, host = %s.host, pid = s.pid, "mount session expired (its daemon is gone): its locks, open-file records and orphans are released");
                        }
                    }
                }
                if any {
                    let _ = self.meta.signal(&deskfs_meta::Signal::Sessions);
                    // Their locks are free: this mount's waiters look again too.
                    self.locks.wake();
                    if let Err(e) = self.purge_unheld_orphans() {
                        tracing::warn!(error = %e, "cannot purge the orphans of expired sessions");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot expire dead sessions"),
        }
    }

    /// Renews the lease, expires dead sessions (cleaning up after them) and prunes the
    /// feed. Called every [`Vfs::heartbeat_period`] by the feed thread.
    pub(crate) fn heartbeat(&self) {
        let me = self.coherence.session();
        let began = std::time::Instant::now();
        let r = deskfs_meta::txn(&*self.meta, |t| {
            let now = t.db_now_ns()?;
            t.heartbeat(me, now)?;
            let dead = self.dead_sessions(&t.sessions()?, now, Some(me));
            let held = self.held_due(&t.kv_with_prefix(deskfs_meta::HELD_OPENS_PREFIX)?, now);
            t.prune_changes(now / 1_000_000 - crate::feed::FEED_KEEP_MS)?;
            Ok::<_, MetaError>((dead, held))
        });
        match r {
            Ok((dead, held)) => {
                self.locks.renewed(began);
                self.expire(&dead);
                self.release_held(&held);
            }
            Err(MetaError::NotFound(_)) => self.fenced(me),
            Err(e) => tracing::warn!(error = %e, "lease renewal failed; retrying"),
        }
    }

    /// This mount's session `lost` is gone (expired by another mount): log it, count it,
    /// forget the locks held through it, and register anew (opens are published again
    /// when other mounts are live).
    pub(crate) fn fenced(&self, lost: u64) {
        // One re-registration at a time: the lease thread, the feed thread and requests
        // may all find the session gone at once. Each registering a session of its own
        // made the later registration expire the earlier one as "its daemon is gone"
        // (same host and pid), without a hold, dropping the open-file records published
        // under it: another mount could then purge a file this one still has open.
        // Whoever finds a re-registration under way waits for it, then finds the session
        // replaced. (The registration itself may end up here again, on its own thread.)
        if FENCING.with(|f| f.replace(true)) {
            return;
        }
        let _reset = FencingHere;
        let _one = self
            .coherence
            .fencing
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if self.coherence.session() != lost {
            return; // already re-registered
        }
        if self.coherence.stopped() {
            // Shutting down: the session was ended by `end_session`, not expired.
            return;
        }
        tracing::error!(session = lost, "this mount's session lease was lost (the mount was paused or cut off longer than the lease, and another mount expired it): locks held through it are gone; registering a new session");
        self.coherence.fenced(lost, now_ns());
        self.locks.forget_all();
        if let Ok(hs) = self.handles.lock() {
            for h in hs.values() {
                h.unrecord();
            }
        }
        if let Err(e) = self.start_session() {
            // (Applied with its answer lost, the registration is a session of this
            // process: the next attempt expires it as "its daemon is gone".)
            tracing::error!(error = %e, "cannot register a new session; the next request or lease renewal tries again");
            return;
        }
        // Its opens are recorded under the new session (when others are live, as always):
        // what the old one's expiry held for it goes.
        self.release_held(&[lost]);
    }

    /// Purges orphans that no session records open and this mount does not hold (run
    /// after expiring dead sessions, whose kept orphans nobody will purge otherwise).
    pub(crate) fn purge_unheld_orphans(&self) -> Result<()> {
        let orphans = deskfs_meta::read(&*self.meta, |t| t.orphan_inodes())?;
        let victims: Vec<_> = orphans.into_iter().filter(|i| !self.keeps(*i)).collect();
        if victims.is_empty() {
            return Ok(());
        }
        let ops: Vec<Op> = victims.iter().map(|i| Op::Purge(*i)).collect();
        let out = self.meta.apply(&ops)?;
        for (ino, o) in victims.iter().zip(out) {
            if o == OpOut::Purged(true) {
                self.purge_local(*ino);
            }
        }
        Ok(())
    }

    /// Ends this mount's session (its locks and open-file records go with it).
    pub(crate) fn end_session(&self) {
        let s = self.coherence.session();
        let _ = deskfs_meta::txn(&*self.meta, |t| {
            t.delete_session(s)?;
            t.set_kv(&format!("feed_ack.{s}"), "0")
        });
        let _ = self.meta.signal(&deskfs_meta::Signal::Sessions);
    }
}
