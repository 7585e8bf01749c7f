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
//! States (one type, [`Window`]): `Off` → (redo log owned) `Closed` ⇄ `Open`;
//! a failed commit → `NeedsReplay` → (replay from the log succeeds) `Closed`.

use std::ops::Deref;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::exec;
use super::redo::{self, Capture, RedoLog};
use crate::{MetaError, Result};

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
    /// in the redo log).
    Open { since: Instant, requests: u32 },
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
}

impl Deref for Conn {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.db
    }
}

impl Conn {
    pub(super) fn new(db: Connection) -> Conn {
        Conn {
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
    /// empties it. Returns the number of records replayed.
    pub(super) fn replay_log(db: &Connection, log: &mut RedoLog) -> Result<u64> {
        if log.is_empty() {
            return Ok(0);
        }
        exec(db, "BEGIN IMMEDIATE")?;
        let res = (|| {
            let records = log.records_after(redo::redo_seq(db)?)?;
            redo::replay(db, &records)?;
            Ok::<_, MetaError>(records.len() as u64)
        })();
        match res.and_then(|n| exec(db, "COMMIT").map(|()| n).map_err(Into::into)) {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(records = n, "replayed the metadata redo log");
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
        let Some(mut log) = RedoLog::lock(db_path)? else {
            return Ok(false);
        };
        self.stats.replayed += Self::replay_log(&self.db, &mut log)?;
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
        (self.window, stats)
    }

    /// When the open window must commit (`None`: no window open).
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self.window {
            Window::Open { since, .. } => Some(since + self.config.span),
            _ => None,
        }
    }

    /// Runs a read-only `body`: inside the open window (it sees the window's rows), else
    /// in a deferred transaction of its own.
    pub(super) fn read<T>(&mut self, body: &mut impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        if matches!(self.window, Window::Open { .. }) {
            return body(&self.db);
        }
        exec(&self.db, "BEGIN DEFERRED")?;
        finish(&self.db, body(&self.db))
    }

    /// Runs a write `body` atomically: in the open window (opening one when allowed and
    /// alone), or in a transaction committed before returning.
    pub(super) fn write<T>(
        &mut self,
        body: &mut impl FnMut(&Connection) -> Result<T>,
    ) -> Result<T> {
        self.settle()?;
        if self.window == Window::Closed || self.window == Window::Off {
            exec(&self.db, "BEGIN IMMEDIATE")?;
            let open = self.window == Window::Closed
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
            self.window = Window::Open {
                since: Instant::now(),
                requests: 0,
            };
            self.opened = true;
        }
        let out = self.in_window(body);
        if let Window::Open { requests, .. } = self.window {
            if requests >= self.config.max_requests {
                if let Err(e) = self.commit_window() {
                    tracing::warn!(error = %e, "commit window failed; replaying its redo log");
                }
            }
        }
        out
    }

    /// Commits an overdue window and replays after a failed one, before a new request.
    fn settle(&mut self) -> Result<()> {
        match self.window {
            Window::NeedsReplay => self.replay_now(),
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

    fn in_window<T>(&mut self, body: &mut impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        exec(&self.db, "SAVEPOINT request")?;
        let cap = self.capture.as_deref().ok_or_else(|| {
            MetaError::Internal("commit window without a statement capture".into())
        })?;
        cap.start();
        let res = body(&self.db);
        let logged = match (&res, cap.stop()) {
            (Err(_), _) => Ok(false),
            (Ok(_), None) => Err(MetaError::Internal(
                "a statement of the request could not be recorded in the redo log".into(),
            )),
            (Ok(_), Some(p)) if p.is_empty() => Ok(false),
            (Ok(_), Some(p)) => match self.redo.as_mut() {
                Some(log) => log.append(self.next_seq, &p).map(|()| true),
                None => Err(MetaError::Internal(
                    "commit window without a redo log".into(),
                )),
            },
        };
        match (res, logged) {
            (Ok(v), Ok(logged)) => {
                exec(&self.db, "RELEASE request")?;
                if logged {
                    self.next_seq += 1;
                    self.stats.requests += 1;
                    if let Window::Open { requests, .. } = &mut self.window {
                        *requests += 1;
                    }
                }
                Ok(v)
            }
            (Err(e), _) | (Ok(_), Err(e)) => {
                self.undo_request();
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

    /// Commits the open window (no-op otherwise) and empties the redo log. On failure the
    /// transaction is rolled back and replayed from the log (state `NeedsReplay` until
    /// that succeeds).
    pub(super) fn commit_window(&mut self) -> Result<()> {
        if !matches!(self.window, Window::Open { .. }) {
            return Ok(());
        }
        let res = redo::set_redo_seq(&self.db, self.next_seq - 1)
            .and_then(|()| exec(&self.db, "COMMIT").map_err(Into::into));
        match res {
            Ok(()) => {
                self.window = Window::Closed;
                self.stats.commits += 1;
                if let Some(log) = self.redo.as_mut() {
                    // Failing to empty it is harmless: redo_seq says what is applied.
                    if let Err(e) = log.clear() {
                        tracing::warn!(error = %e, "cannot empty the metadata redo log");
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

    fn replay_now(&mut self) -> Result<()> {
        let Some(log) = self.redo.as_mut() else {
            self.window = Window::Off;
            return Ok(());
        };
        let n = Self::replay_log(&self.db, log)?;
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
