//! Commit windows: while a mount is alone on its workspace, consecutive write requests
//! share one SQLite transaction, committed every [`WindowConfig::span`] (or
//! [`WindowConfig::max_requests`], or at `fsync`), instead of one commit per request
//! (design record `docs/design/0009-commit-windows-and-a-redo-log.md`).
//!
//! A request inside a window runs under a savepoint (its failure undoes only itself) and
//! is acknowledged once its redo record ([`super::redo`]) is appended: that, not the
//! commit, is what survives `kill -9`. Reads on the same connection see the window's
//! uncommitted rows; other processes see the last committed state, at most one span old —
//! which is why a window only opens when no other mount session is registered (checked
//! inside the `BEGIN IMMEDIATE` that opens it: no session can register while the window
//! holds the write lock, and a newcomer's registration waits for the commit).
//!
//! Other writers are not starved by back-to-back windows: every engine that does not own
//! the log holds a shared `flock` on `<db>-join` from before its `BEGIN IMMEDIATE` to its
//! commit, and the owner opens a window only when it can take that lock exclusively
//! (nobody waiting); otherwise it commits request by request, leaving gaps. Those engines
//! also adopt a dead owner's log before they write (an owner killed while they were
//! open), so nothing is ever written on top of a state missing acknowledged requests.
//!
//! States (one type, [`Window`]): `Off` → (redo log owned) `Closed` ⇄ `Open`;
//! a failed commit, or SQLite rolling the window back on an I/O error → `NeedsReplay` →
//! (replay from the log succeeds) `Closed`. Nothing reads or commits in `NeedsReplay`
//! before the replay.

use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::exec;
use super::flush::{Synced, Wal, WalMark};
use super::redo::{self, Capture, RedoLog};
use crate::{MetaError, Op, Result};

/// When an open window commits.
#[derive(Clone, Copy, Debug)]
pub struct WindowConfig {
    /// Longest time a window stays open (its requests are only in the redo log meanwhile;
    /// another process waiting to write waits at most this long).
    pub span: Duration,
    /// Most requests in one window.
    pub max_requests: u32,
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            span: Duration::from_millis(20),
            max_requests: 4096,
        }
    }
}

/// Where the connection's write transactions stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Window {
    /// Every write transaction commits when its request ends: windows were not asked for,
    /// or another engine owns the redo log.
    Off,
    /// Windows allowed; no transaction open.
    Closed,
    /// A transaction is open since `since` holding `requests` acknowledged requests (each
    /// in the redo log). `durable_base`: every commit before it was flushed to the device
    /// when it opened, so flushing the redo log makes its requests durable (design record
    /// 0011); otherwise an `fsync` commits it and flushes the WAL.
    Open {
        since: Instant,
        requests: u32,
        durable_base: bool,
    },
    /// A window's commit failed: its requests are only in the redo log until a replay
    /// succeeds (tried before the next write).
    NeedsReplay,
}

/// Counters of the windows (for `deskfs status` and the tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    /// Windows committed.
    pub commits: u64,
    /// Requests acknowledged inside windows.
    pub requests: u64,
    /// Redo records replayed (at open, or after a failed commit).
    pub replayed: u64,
    /// Bytes in the redo log now (requests of the open window).
    pub redo_bytes: u64,
    /// Device flushes answered by flushing the redo log (design record 0011).
    pub redo_flushes: u64,
    /// Of those, the ones an earlier flush of the log already covered (nothing appended
    /// since): answered without touching the device.
    pub redo_flushes_covered: u64,
}

/// The engine's connection and its window. Derefs to the [`Connection`] for reads.
pub(super) struct Conn {
    /// Declared first: closed before the capture box it calls into is freed.
    db: Connection,
    window: Window,
    redo: Option<RedoLog>,
    capture: Option<Box<Capture>>,
    config: WindowConfig,
    /// This engine's mount session, once known: windows open only while no other one is
    /// registered.
    me: Option<u64>,
    next_seq: u64,
    stats: WindowStats,
    /// Set when a write opened a window (the engine wakes its commit timer).
    pub(super) opened: bool,
    /// A redo append failed: commit the window after undoing the request.
    commit_after: bool,
    /// `<db>-join` (see the module doc); `None` when it cannot be opened (read-only
    /// directory: nobody else writes there either).
    join: Option<Arc<File>>,
    /// The database file.
    path: PathBuf,
    /// The database's WAL, for device flushes.
    wal: Arc<Wal>,
    /// Which commits the last WAL flush covered.
    synced: Synced,
}

impl Deref for Conn {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.db
    }
}

impl Conn {
    pub(super) fn new(db: Connection, path: &Path) -> Conn {
        let synced = Synced::attach(&db);
        let join = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(redo::join_path_for(path))
            .ok()
            .map(Arc::new);
        Conn {
            join,
            synced,
            wal: Arc::new(Wal::new(path)),
            commit_after: false,
            path: path.to_path_buf(),
            db,
            window: Window::Off,
            redo: None,
            capture: None,
            config: WindowConfig::default(),
            me: None,
            next_seq: 1,
            stats: WindowStats::default(),
            opened: false,
        }
    }

    /// Replays what `redo` holds beyond the database's `redo_seq` in one transaction and
    /// empties it — after flushing `wal` when the log may hold acknowledged requests (an
    /// `fsync` answered from it). Returns the number of records replayed. Errors: the
    /// replay's, the commit's, the flush's (the log is kept then).
    pub(super) fn replay_log(db: &Connection, log: &mut RedoLog, wal: &Wal) -> Result<u64> {
        if log.is_empty() {
            return Ok(0);
        }
        exec(db, "BEGIN IMMEDIATE")?;
        let res = redo::replay_pending(db, log);
        match res.and_then(|n| exec(db, "COMMIT").map(|()| n).map_err(Into::into)) {
            Ok(n) => {
                if n > 0 {
                    tracing::debug!(records = n, "replayed the metadata redo log");
                }
                if log.acknowledged() && !wal.sync()? {
                    return Err(MetaError::Internal(
                        "no WAL file to flush after replaying the redo log".into(),
                    ));
                }
                log.clear()?;
                Ok(n)
            }
            Err(e) => {
                let _ = exec(db, "ROLLBACK");
                Err(e)
            }
        }
    }

    /// Takes the redo log (replaying what a dead owner left) and allows windows.
    /// `Ok(false)`: another engine owns the log; this one stays `Off`.
    pub(super) fn enable(
        &mut self,
        db_path: &std::path::Path,
        config: WindowConfig,
    ) -> Result<bool> {
        if self.window != Window::Off {
            return Ok(true);
        }
        // A process replaying a dead owner's log holds its lock for a moment: wait for it
        // while the log holds records (a live owner's log is mostly empty: another mount
        // of this host then gives up at once).
        let until = Instant::now() + Duration::from_secs(1);
        let mut log = loop {
            match RedoLog::lock(db_path)? {
                Some(log) => break log,
                None if Instant::now() < until
                    && std::fs::metadata(redo::path_for(db_path)).is_ok_and(|m| m.len() > 0) =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                None => return Ok(false),
            }
        };
        self.stats.replayed += Self::replay_log(&self.db, &mut log, &self.wal)?;
        self.next_seq = redo::redo_seq(&self.db)? + 1;
        self.capture = Some(Capture::attach(&self.db));
        self.redo = Some(log);
        self.config = config;
        self.window = Window::Closed;
        Ok(true)
    }

    /// Records this engine's mount session (windows ignore it when checking for others).
    pub(super) fn set_session(&mut self, session: u64) {
        self.me = Some(session);
    }

    /// The window's state and counters.
    pub(super) fn window(&self) -> (Window, WindowStats) {
        let mut stats = self.stats;
        stats.redo_bytes = self.redo.as_ref().map_or(0, |l| l.len());
        stats.redo_flushes_covered = self.redo.as_ref().map_or(0, |l| l.flushes_covered());
        (self.window, stats)
    }

    /// When the open window must commit (`None`: no window open).
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self.window {
            Window::Open { since, .. } => Some(since + self.config.span),
            _ => None,
        }
    }

    /// Makes the connection's view whole before it is used: a window SQLite rolled back
    /// on its own (an I/O or memory error, even in a read) and a window whose commit
    /// failed are replayed from the redo log first. Errors: the replay's.
    pub(super) fn current(&mut self) -> Result<()> {
        if matches!(self.window, Window::Open { .. }) && self.db.is_autocommit() {
            tracing::error!("SQLite rolled the open commit window back; replaying its redo log");
            self.window = Window::NeedsReplay;
        }
        if self.window == Window::NeedsReplay {
            self.replay_now()?;
        }
        Ok(())
    }

    /// Runs a read-only `body`: inside the open window (it sees the window's rows), else
    /// in a deferred transaction of its own.
    pub(super) fn read<T>(&mut self, body: &mut impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        self.current()?;
        if matches!(self.window, Window::Open { .. }) {
            return body(&self.db);
        }
        exec(&self.db, "BEGIN DEFERRED")?;
        finish(&self.db, body(&self.db))
    }

    /// Runs a write `body` atomically: in the open window (opening one when allowed and
    /// alone), or in a transaction committed before returning. `ops`: the batch `body`
    /// applies (and nothing else), logged as the request's redo record instead of its
    /// statements; `None` for any other body.
    pub(super) fn write<T>(
        &mut self,
        body: &mut impl FnMut(&Connection) -> Result<T>,
        ops: Option<&[Op]>,
    ) -> Result<T> {
        self.current()?;
        self.settle()?;
        if self.window == Window::Off {
            return self.write_unwindowed(body);
        }
        if self.window == Window::Closed {
            // Someone waits to write (or is writing): commit request by request so they
            // get in between.
            let waited = !self.nobody_waiting();
            exec(&self.db, "BEGIN IMMEDIATE")?;
            let open = !waited
                && match self.alone() {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = exec(&self.db, "ROLLBACK");
                        return Err(e);
                    }
                };
            if !open {
                return finish(&self.db, body(&self.db));
            }
            let durable_base = match self.synced.all_durable(&self.db) {
                Ok(d) => d,
                Err(e) => {
                    let _ = exec(&self.db, "ROLLBACK");
                    return Err(e);
                }
            };
            self.window = Window::Open {
                since: Instant::now(),
                requests: 0,
                durable_base,
            };
            self.opened = true;
        }
        let out = self.in_window(body, ops);
        if let Window::Open { requests, .. } = self.window {
            if requests >= self.config.max_requests {
                if let Err(e) = self.commit_window() {
                    tracing::warn!(error = %e, "commit window failed; replaying its redo log");
                }
            }
        }
        out
    }

    /// A write of an engine without windows: one transaction, under the shared join lock
    /// (the owner of the log opens no window meanwhile), adopting a dead owner's log
    /// first.
    fn write_unwindowed<T>(
        &mut self,
        body: &mut impl FnMut(&Connection) -> Result<T>,
    ) -> Result<T> {
        let join = self.join.clone();
        let _waiting = join.as_deref().and_then(SharedLock::take);
        exec(&self.db, "BEGIN IMMEDIATE")?;
        let adopted = match self.adopt_dead_log() {
            Ok(a) => a,
            Err(e) => {
                let _ = exec(&self.db, "ROLLBACK");
                return Err(e);
            }
        };
        let out = finish(&self.db, body(&self.db))?;
        if let Some(mut log) = adopted {
            // The dead owner may have answered fsyncs from it: its records must be durable
            // in the WAL before they leave the log (they are skipped by a later replay).
            match self.wal.sync() {
                Ok(true) => {
                    if let Err(e) = log.clear() {
                        tracing::warn!(error = %e, "cannot empty the adopted metadata redo log");
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "flushing the WAL after adopting a redo log failed; the log is kept")
                }
            }
        }
        Ok(out)
    }

    /// Inside a write transaction of an engine without windows: when `<db>-redo` holds
    /// records and nobody holds its lock (its owner died while this engine was open),
    /// replays them into this transaction and returns the locked log (emptied by the
    /// caller after the commit).
    fn adopt_dead_log(&mut self) -> Result<Option<RedoLog>> {
        let redo = redo::path_for(&self.path);
        if std::fs::metadata(&redo).map_or(true, |m| m.len() == 0) {
            return Ok(None);
        }
        let Some(mut log) = RedoLog::lock(&self.path)? else {
            return Ok(None);
        };
        let n = redo::replay_pending(&self.db, &mut log)?;
        if n > 0 {
            tracing::debug!(records = n, "replayed a dead mount's metadata redo log");
            self.stats.replayed += n;
        }
        Ok(Some(log))
    }

    /// Whether no other engine waits to write (the owner's exclusive try on `<db>-join`).
    fn nobody_waiting(&self) -> bool {
        match &self.join {
            Some(f) => match f.try_lock() {
                Ok(()) => {
                    let _ = f.unlock();
                    true
                }
                Err(_) => false,
            },
            None => true,
        }
    }

    /// Commits an overdue window before a new request (a window waiting for replay was
    /// replayed by [`Conn::current`] already).
    fn settle(&mut self) -> Result<()> {
        match self.window {
            Window::Open { since, .. } if since.elapsed() >= self.config.span => {
                self.commit_window()
            }
            _ => Ok(()),
        }
    }

    fn alone(&self) -> Result<bool> {
        let others: bool = self
            .db
            .prepare_cached("SELECT EXISTS(SELECT 1 FROM sessions WHERE id IS NOT ?1)")?
            .query_row([self.me.map(|s| s as i64)], |r| r.get(0))?;
        Ok(!others)
    }

    fn in_window<T>(
        &mut self,
        body: &mut impl FnMut(&Connection) -> Result<T>,
        ops: Option<&[Op]>,
    ) -> Result<T> {
        exec(&self.db, "SAVEPOINT request")?;
        let cap = self.capture.as_deref().ok_or_else(|| {
            MetaError::Internal("commit window without a statement capture".into())
        })?;
        if ops.is_none() {
            cap.start();
        }
        let res = body(&self.db);
        let lost = || {
            MetaError::Internal(
                "a statement of the request could not be recorded in the redo log".into(),
            )
        };
        let seq = self.next_seq;
        let logged = match (&res, ops) {
            (Err(_), None) => {
                let _ = cap.stop();
                Ok(false)
            }
            // A refused request is not logged: its batch is not even encoded.
            (Err(_), Some(_)) => Ok(false),
            (Ok(_), None) => match cap.stop() {
                None => Err(lost()),
                Some(p) if p.is_empty() => Ok(false),
                Some(p) => append_record(
                    &mut self.redo,
                    &mut self.commit_after,
                    seq,
                    redo::Payload::Statements(&p),
                ),
            },
            (Ok(_), Some(ops)) if !redo::ops_write(ops) => Ok(false),
            (Ok(_), Some(ops)) => match redo::encode_ops(ops) {
                Ok(p) => append_record(
                    &mut self.redo,
                    &mut self.commit_after,
                    seq,
                    redo::Payload::Ops(&p),
                ),
                Err(e) => {
                    tracing::error!(error = %e, "a request's batch cannot be encoded for the redo log");
                    Err(lost())
                }
            },
        };
        match (res, logged) {
            (Ok(v), Ok(logged)) => {
                if logged {
                    // The record is in the log: the request will take effect, replayed if
                    // need be, so its number is spent and it is acknowledged.
                    self.next_seq += 1;
                    self.stats.requests += 1;
                    if let Window::Open { requests, .. } = &mut self.window {
                        *requests += 1;
                    }
                }
                if let Err(e) = exec(&self.db, "RELEASE request") {
                    tracing::error!(error = %e, "releasing a request's savepoint failed; replaying the window");
                    if !self.db.is_autocommit() {
                        let _ = exec(&self.db, "ROLLBACK");
                    }
                    self.window = Window::NeedsReplay;
                    self.replay_now()?;
                    if !logged {
                        return Err(e.into());
                    }
                }
                Ok(v)
            }
            (Err(e), _) | (Ok(_), Err(e)) => {
                self.undo_request();
                if std::mem::take(&mut self.commit_after) {
                    if let Err(e2) = self.commit_window() {
                        tracing::error!(error = %e2, "commit after a failed redo append failed");
                    }
                }
                Err(e)
            }
        }
    }

    /// Rolls the current request back to its savepoint. When SQLite already rolled the
    /// whole transaction back (it does on some I/O and memory errors), the window's
    /// requests survive only in the redo log: replay it before anything else.
    fn undo_request(&mut self) {
        if self.db.is_autocommit() {
            self.window = Window::NeedsReplay;
            return;
        }
        if exec(&self.db, "ROLLBACK TO request").is_err()
            || exec(&self.db, "RELEASE request").is_err()
        {
            let _ = exec(&self.db, "ROLLBACK");
            self.window = Window::NeedsReplay;
        }
    }

    /// Commits the open window (no-op otherwise) and empties the redo log — after a WAL
    /// flush when an `fsync` was answered from the log (rule 2 of design record 0011; a
    /// failed flush keeps the log, and windows stay off). On failure the transaction is
    /// rolled back and replayed from the log (state `NeedsReplay` until that succeeds).
    pub(super) fn commit_window(&mut self) -> Result<()> {
        self.current()?;
        if !matches!(self.window, Window::Open { .. }) {
            return Ok(());
        }
        let res = redo::set_redo_seq(&self.db, self.next_seq - 1)
            .and_then(|()| exec(&self.db, "COMMIT").map_err(Into::into));
        match res {
            Ok(()) => {
                self.window = Window::Closed;
                self.stats.commits += 1;
                if self.redo.as_ref().is_some_and(RedoLog::acknowledged) && !self.flush_wal() {
                    tracing::error!("the WAL flush after a commit window failed; the redo log keeps its requests, commit windows off");
                    self.window = Window::Off;
                    return Ok(());
                }
                if let Some(log) = self.redo.as_mut() {
                    // Failing to empty it is harmless for replay (redo_seq says what is
                    // applied), but appends after a torn record would be lost: no more
                    // windows then.
                    if let Err(e) = log.clear() {
                        tracing::error!(error = %e, "cannot empty the metadata redo log; commit windows off");
                        self.window = Window::Off;
                    }
                }
                Ok(())
            }
            Err(e) => {
                if !self.db.is_autocommit() {
                    let _ = exec(&self.db, "ROLLBACK");
                }
                self.window = Window::NeedsReplay;
                if let Err(e2) = self.replay_now() {
                    tracing::error!(error = %e2, "replaying the metadata redo log failed; retried before the next write");
                }
                Err(e)
            }
        }
    }

    /// Flushes the WAL and records what the flush covered; `false` when it failed (logged)
    /// or there is no WAL.
    fn flush_wal(&mut self) -> bool {
        let mark = match self.synced.mark(&self.db) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the database's data version");
                return false;
            }
        };
        match self.wal.sync() {
            Ok(true) => {
                self.synced.flushed(mark);
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::error!(error = %e, "flushing the metadata WAL failed");
                false
            }
        }
    }

    /// The database's WAL (flushed by `make_durable` without the connection).
    pub(super) fn wal(&self) -> Arc<Wal> {
        self.wal.clone()
    }

    /// What the WAL holds now (taken before a flush; see [`Conn::wal_flushed`]).
    pub(super) fn wal_mark(&self) -> Result<WalMark> {
        self.synced.mark(&self.db)
    }

    /// A WAL flush that began at `mark` succeeded.
    pub(super) fn wal_flushed(&mut self, mark: WalMark) {
        self.synced.flushed(mark);
    }

    /// Whether the mark taken before the last successful WAL flush is still current
    /// (nothing committed since, here or by another connection).
    pub(super) fn wal_durable(&self) -> Result<bool> {
        self.synced.all_durable(&self.db)
    }

    /// For an `fsync` inside a window on a durable base: the redo log to flush instead of
    /// committing (design record 0011). `None`: commit and flush the WAL.
    pub(super) fn log_for_fsync(&mut self) -> Option<redo::LogHandout> {
        match self.window {
            Window::Open {
                durable_base: true, ..
            } => {
                let out = self.redo.as_mut()?.flush_for_fsync();
                self.stats.redo_flushes += u64::from(out.is_some());
                out
            }
            _ => None,
        }
    }

    fn replay_now(&mut self) -> Result<()> {
        let Some(log) = self.redo.as_mut() else {
            self.window = Window::Off;
            return Ok(());
        };
        let n = Self::replay_log(&self.db, log, &self.wal)?;
        self.stats.replayed += n;
        self.window = Window::Closed;
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Err(e) = self.commit_window() {
            tracing::error!(error = %e, "final commit window failed; the redo log keeps it for the next open");
        }
        if self.capture.is_some() {
            Capture::detach(&self.db);
        }
    }
}

/// Commits (on `Ok`) or rolls back (on `Err`) the transaction `res` ran in.
fn finish<T>(db: &Connection, res: Result<T>) -> Result<T> {
    match res {
        Ok(v) => match exec(db, "COMMIT") {
            Ok(()) => Ok(v),
            Err(e) => {
                let _ = exec(db, "ROLLBACK");
                Err(e.into())
            }
        },
        Err(e) => {
            let _ = exec(db, "ROLLBACK");
            Err(e)
        }
    }
}

/// A shared `flock` on `<db>-join`, held while an engine without windows writes.
struct SharedLock<'f>(&'f File);

impl<'f> SharedLock<'f> {
    fn take(f: &'f File) -> Option<SharedLock<'f>> {
        f.lock_shared().ok().map(|()| SharedLock(f))
    }
}

impl Drop for SharedLock<'_> {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Appends a request's record to the window's log (`Ok(true)`: acknowledged). A failed
/// append sets `commit_after`: the window commits what the log holds so it can be
/// emptied (a torn tail).
fn append_record(
    redo: &mut Option<RedoLog>,
    commit_after: &mut bool,
    seq: u64,
    payload: redo::Payload<'_>,
) -> Result<bool> {
    match redo.as_mut() {
        Some(log) => log
            .append(seq, payload)
            .map(|()| true)
            .inspect_err(|_| *commit_after = true),
        None => Err(MetaError::Internal(
            "commit window without a redo log".into(),
        )),
    }
}
