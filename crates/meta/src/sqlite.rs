//! The embedded SQLite engine: one database file per workspace, WAL mode, shared by every
//! mount of the workspace on one host (SQLite's own file locking serialises writers).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

mod batch;
mod flush;
mod redo;
mod rows;
mod txn;
mod window;

use window::Conn;
pub use window::{WindowConfig, WindowStats};

use rows::{inode_from_row, kind_code, INODE_COLS};
use txn::SqlTxn;

use crate::{
    ChangeRow, EngineCounters, FeedCursor, Ino, InodeRow, Kind, MetaEngine, MetaError, MetaTxn, Op,
    OpOut, Result, Usage, ROOT_INO, TXN_ATTEMPTS,
};

/// SQLite's multi-thread mode for our connections: each is used by one thread at a time
/// (a `rusqlite::Connection` is not `Sync`; ours sit behind the engine's mutex), so
/// SQLite's own per-connection mutex — taken and released by every `bind`, `step` and
/// `column` call in its default serialized mode, 6 % of the daemon's CPU during `tar x`
/// — guards nothing. rusqlite's own `Connection::open` sets it too.
const OPEN_NO_MUTEX: OpenFlags = OpenFlags::SQLITE_OPEN_NO_MUTEX;

/// Schema version written to `PRAGMA user_version`. Databases with a higher number are
/// refused with [`MetaError::TooNew`]; older ones are migrated when opened.
/// 1: first release. 2: `local` holds a cache id, inode numbers come from
/// `kv.next_ino`, upload requests (`wanted`). 3: change marks for the bucket backup
/// (`backup_log` and its triggers).
pub const SCHEMA_VERSION: i64 = 3;

/// Page size of new databases, bytes (see [`SqliteEngine::create`]).
pub const PAGE_SIZE: u32 = 1024;

/// How long a pending path may be postponed by repeated re-marks (coalescing cap), ns.
pub const MAX_COALESCE_NS: i64 = 30_000_000_000;

const SCHEMA: &str = r#"
CREATE TABLE inodes(
  ino INTEGER PRIMARY KEY AUTOINCREMENT,
  kind INTEGER NOT NULL, perm INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
  rdev INTEGER NOT NULL, nlink INTEGER NOT NULL, size INTEGER NOT NULL,
  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL, btime INTEGER NOT NULL,
  data_version INTEGER NOT NULL, target BLOB, local INTEGER NOT NULL, dirty INTEGER NOT NULL,
  listed INTEGER NOT NULL);
CREATE INDEX inodes_dirty_local ON inodes(local) WHERE dirty = 1;
CREATE INDEX inodes_orphan ON inodes(nlink) WHERE nlink = 0;
CREATE TABLE dentries(
  cookie INTEGER PRIMARY KEY AUTOINCREMENT,
  parent INTEGER NOT NULL, name BLOB NOT NULL, ino INTEGER NOT NULL,
  UNIQUE(parent, name));
CREATE INDEX dentries_ino ON dentries(ino);
CREATE TABLE xattrs(ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY(ino, name)) WITHOUT ROWID;
CREATE TABLE objects(path BLOB PRIMARY KEY, key TEXT NOT NULL, ino INTEGER NOT NULL,
  kind INTEGER NOT NULL, data_version INTEGER NOT NULL, meta_stamp INTEGER NOT NULL,
  etag TEXT, size INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX objects_ino ON objects(ino, data_version);
CREATE TABLE pending(path BLOB PRIMARY KEY, recursive INTEGER NOT NULL, seq INTEGER NOT NULL,
  gen INTEGER NOT NULL, due INTEGER NOT NULL, since INTEGER NOT NULL,
  attempts INTEGER NOT NULL, last_error TEXT) WITHOUT ROWID;
CREATE INDEX pending_due ON pending(due);
CREATE INDEX pending_seq ON pending(seq);
CREATE TABLE kv(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE sessions(id INTEGER PRIMARY KEY AUTOINCREMENT, host TEXT NOT NULL,
  pid INTEGER NOT NULL, started INTEGER NOT NULL, heartbeat INTEGER NOT NULL);
CREATE TABLE open_files(ino INTEGER NOT NULL, session INTEGER NOT NULL, count INTEGER NOT NULL,
  PRIMARY KEY(ino, session)) WITHOUT ROWID;
CREATE TABLE locks(ino INTEGER NOT NULL, session INTEGER NOT NULL, owner INTEGER NOT NULL,
  write INTEGER NOT NULL, start INTEGER NOT NULL, end_ INTEGER NOT NULL, pid INTEGER NOT NULL,
  fh INTEGER NOT NULL);
CREATE INDEX locks_ino ON locks(ino);
CREATE INDEX locks_session ON locks(session);
"#;

/// Schema 2 additions (also run on a schema-1 database when it is opened).
const SCHEMA_V2: &str = "
CREATE TABLE IF NOT EXISTS wanted(ino INTEGER PRIMARY KEY, cache INTEGER NOT NULL,
  since INTEGER NOT NULL);
INSERT OR IGNORE INTO kv(key,value) SELECT 'next_ino',
  CAST(max(coalesce((SELECT max(ino) FROM inodes), 1),
           coalesce((SELECT seq FROM sqlite_sequence WHERE name='inodes'), 1)) + 1 AS TEXT);
";

/// Schema 3: every change to what the bucket backup records (inodes — not their
/// access time alone, nor the dirty/local/listed bookkeeping —, dentries, xattrs, objects)
/// leaves a mark in `backup_log`, from every connection (permanent triggers), in the
/// change's own transaction. The backup writer turns marks into deltas and trims them.
const SCHEMA_V3: &str = "
CREATE TABLE IF NOT EXISTS backup_log(seq INTEGER PRIMARY KEY AUTOINCREMENT,
  ino INTEGER, parent INTEGER, name BLOB, path BLOB);
CREATE TRIGGER IF NOT EXISTS bk_inode_ins AFTER INSERT ON inodes
  BEGIN INSERT INTO backup_log(ino) VALUES(NEW.ino); END;
CREATE TRIGGER IF NOT EXISTS bk_inode_upd AFTER UPDATE ON inodes
  WHEN OLD.kind <> NEW.kind OR OLD.perm <> NEW.perm OR OLD.uid <> NEW.uid
    OR OLD.gid <> NEW.gid OR OLD.rdev <> NEW.rdev OR OLD.nlink <> NEW.nlink
    OR OLD.size <> NEW.size OR OLD.mtime <> NEW.mtime OR OLD.ctime <> NEW.ctime
    OR OLD.btime <> NEW.btime OR OLD.data_version <> NEW.data_version
    OR OLD.target IS NOT NEW.target
  BEGIN INSERT INTO backup_log(ino) VALUES(NEW.ino); END;
CREATE TRIGGER IF NOT EXISTS bk_inode_del AFTER DELETE ON inodes
  BEGIN INSERT INTO backup_log(ino) VALUES(OLD.ino); END;
CREATE TRIGGER IF NOT EXISTS bk_dentry_ins AFTER INSERT ON dentries
  BEGIN INSERT INTO backup_log(parent, name) VALUES(NEW.parent, NEW.name); END;
CREATE TRIGGER IF NOT EXISTS bk_dentry_del AFTER DELETE ON dentries
  BEGIN INSERT INTO backup_log(parent, name) VALUES(OLD.parent, OLD.name); END;
CREATE TRIGGER IF NOT EXISTS bk_dentry_upd AFTER UPDATE ON dentries
  BEGIN INSERT INTO backup_log(parent, name) VALUES(OLD.parent, OLD.name), (NEW.parent, NEW.name); END;
CREATE TRIGGER IF NOT EXISTS bk_xattr_ins AFTER INSERT ON xattrs
  BEGIN INSERT INTO backup_log(ino) VALUES(NEW.ino); END;
CREATE TRIGGER IF NOT EXISTS bk_xattr_upd AFTER UPDATE ON xattrs
  BEGIN INSERT INTO backup_log(ino) VALUES(NEW.ino); END;
CREATE TRIGGER IF NOT EXISTS bk_xattr_del AFTER DELETE ON xattrs
  BEGIN INSERT INTO backup_log(ino) VALUES(OLD.ino); END;
CREATE TRIGGER IF NOT EXISTS bk_object_ins AFTER INSERT ON objects
  BEGIN INSERT INTO backup_log(path) VALUES(NEW.path); END;
CREATE TRIGGER IF NOT EXISTS bk_object_upd AFTER UPDATE ON objects
  BEGIN INSERT INTO backup_log(path) VALUES(OLD.path), (NEW.path); END;
CREATE TRIGGER IF NOT EXISTS bk_object_del AFTER DELETE ON objects
  BEGIN INSERT INTO backup_log(path) VALUES(OLD.path); END;
";

/// Indexes added without a schema version (created on open when missing; a database
/// without them is only slower): a directory's entries in cookie order, so each page of
/// `readdir` is one index range instead of a sort of the whole directory (a 100,000-entry
/// directory took 25 ms per page); the dirty inodes by cache, which replaces the index
/// of dirty inodes alone (same rows, so no more writes), so a mount finds the caches
/// holding unuploaded files with a few seeks instead of reading every dirty row (3.8 s
/// at a million).
const INDEXES: &str =
    "CREATE INDEX IF NOT EXISTS dentries_parent_cookie ON dentries(parent, cookie);
CREATE INDEX IF NOT EXISTS inodes_dirty_local ON inodes(local) WHERE dirty = 1;
DROP INDEX IF EXISTS inodes_dirty;";

/// The change feed (added after schema 1 shipped; created on open when missing).
const CHANGES_TABLE: &str = "CREATE TABLE IF NOT EXISTS changes(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, session INTEGER NOT NULL, ts INTEGER NOT NULL,
  ino INTEGER NOT NULL, parent INTEGER, name BLOB);";

/// Current time in ms since the Unix epoch, as SQL.
const SQL_NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/// TEMP triggers (this connection only) that log changes into `changes` tagged with
/// session `{S}`, only while another session is registered. Attribute-only updates the
/// kernel cannot see (dirty/local/listed flags) are not logged.
const CHANGE_TRIGGERS: &str = "
DROP TRIGGER IF EXISTS temp.feed_dentry_ins;
DROP TRIGGER IF EXISTS temp.feed_dentry_del;
DROP TRIGGER IF EXISTS temp.feed_dentry_upd;
DROP TRIGGER IF EXISTS temp.feed_inode_upd;
DROP TRIGGER IF EXISTS temp.feed_inode_del;
CREATE TEMP TRIGGER feed_dentry_ins AFTER INSERT ON main.dentries
  WHEN EXISTS (SELECT 1 FROM sessions WHERE id <> {S})
  BEGIN INSERT INTO changes(session, ts, ino, parent, name)
    VALUES({S}, {NOW}, NEW.ino, NEW.parent, NEW.name); END;
CREATE TEMP TRIGGER feed_dentry_del AFTER DELETE ON main.dentries
  WHEN EXISTS (SELECT 1 FROM sessions WHERE id <> {S})
  BEGIN INSERT INTO changes(session, ts, ino, parent, name)
    VALUES({S}, {NOW}, OLD.ino, OLD.parent, OLD.name); END;
CREATE TEMP TRIGGER feed_dentry_upd AFTER UPDATE ON main.dentries
  WHEN EXISTS (SELECT 1 FROM sessions WHERE id <> {S})
  BEGIN INSERT INTO changes(session, ts, ino, parent, name)
    VALUES({S}, {NOW}, OLD.ino, OLD.parent, OLD.name), ({S}, {NOW}, NEW.ino, NEW.parent, NEW.name); END;
CREATE TEMP TRIGGER feed_inode_upd AFTER UPDATE ON main.inodes
  WHEN (OLD.size <> NEW.size OR OLD.mtime <> NEW.mtime OR OLD.ctime <> NEW.ctime
        OR OLD.atime <> NEW.atime OR OLD.nlink <> NEW.nlink
        OR OLD.data_version <> NEW.data_version)
   AND EXISTS (SELECT 1 FROM sessions WHERE id <> {S})
  BEGIN INSERT INTO changes(session, ts, ino, parent, name)
    VALUES({S}, {NOW}, NEW.ino, NULL, NULL); END;
CREATE TEMP TRIGGER feed_inode_del AFTER DELETE ON main.inodes
  WHEN EXISTS (SELECT 1 FROM sessions WHERE id <> {S})
  BEGIN INSERT INTO changes(session, ts, ino, parent, name)
    VALUES({S}, {NOW}, OLD.ino, NULL, NULL); END;
";

/// A SQLite metadata database (`rusqlite`, bundled SQLite, WAL journal).
pub struct SqliteEngine {
    path: PathBuf,
    shared: Arc<Shared>,
    /// The thread committing overdue windows (see [`SqliteEngine::enable_commit_window`]).
    timer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The write-ahead log, for device flushes (see [`MetaEngine::make_durable`]).
    wal: Arc<flush::Wal>,
    counters: Counters,
    /// This connection logs changes to the feed (see [`MetaEngine::log_changes_as`]).
    logging: AtomicBool,
    /// A read-only connection of its own for [`MetaEngine::usage`]'s scan (opened on
    /// first use), so the scan holds back no request on the engine's connection.
    side: Mutex<Option<Connection>>,
}

/// What the engine and its window-commit thread share.
struct Shared {
    conn: Mutex<Conn>,
    /// Woken when a window opens, and to stop.
    wake: Condvar,
    stop: AtomicBool,
}

/// [`EngineCounters`] as atomics.
#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
    commits: AtomicU64,
    retries: AtomicU64,
    preconditions: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// One round trip (also counted for the calling thread).
    fn round_trip(&self) {
        crate::count_thread_round_trip();
        Self::add(&self.round_trips);
    }

    fn snapshot(&self) -> EngineCounters {
        EngineCounters {
            round_trips: self.round_trips.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            preconditions: self.preconditions.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            ..EngineCounters::default()
        }
    }
}

impl std::fmt::Debug for SqliteEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteEngine")
            .field("path", &self.path)
            .finish()
    }
}

fn corrupt(path: &Path, detail: impl ToString) -> MetaError {
    MetaError::Corrupt {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

impl SqliteEngine {
    /// Creates a new database at `path` with an empty root directory owned by `uid:gid`
    /// with permissions `0o755`, at time `now_ns`. Fails with [`MetaError::Conflict`] if
    /// a file already exists there.
    pub fn create(path: &Path, uid: u32, gid: u32, now_ns: i64) -> Result<SqliteEngine> {
        if path.exists() {
            return Err(MetaError::Conflict(path.display().to_string()));
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // A redo log left by a database that no longer exists must not meet this one.
        match std::fs::remove_file(redo::path_for(path)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OPEN_NO_MUTEX,
        )?;
        // Before the first write: every changed page of a commit is one WAL frame, and a
        // namespace change touches 4-14 b-tree pages (the row, each index, the pending
        // mark, the change feed, the backup marks). 1 KiB pages write a quarter of the
        // bytes: setattr 30 -> 17 us, flush 52-72 -> 35-42 us, unlink 68-74 -> 44-50 us
        // in process; a cold listing of 10,000 entries reads more pages (69 -> 84-90 ms).
        // Databases made before keep their page size.
        conn.execute_batch(&format!("PRAGMA page_size={PAGE_SIZE}"))?;
        Self::configure(&conn)?;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let res =
            (|| -> Result<()> {
                conn.execute_batch(SCHEMA)?;
                conn.execute_batch(CHANGES_TABLE)?;
                conn.execute_batch(SCHEMA_V2)?;
                conn.execute_batch(SCHEMA_V3)?;
                conn.execute_batch(INDEXES)?;
                conn.execute(
                "INSERT INTO inodes(ino,kind,perm,uid,gid,rdev,nlink,size,atime,mtime,ctime,btime,
                 data_version,target,local,dirty,listed)
                 VALUES(?1,?2,?3,?4,?5,0,2,0,?6,?6,?6,?6,0,NULL,0,0,0)",
                params![ROOT_INO as i64, kind_code(Kind::Dir), 0o755, uid, gid, now_ns],
            )?;
                conn.execute(
                    "INSERT INTO kv(key,value) VALUES('format','deskfs'),('pending_seq','0')",
                    [],
                )?;
                conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))?;
                Ok(())
            })();
        match res {
            Ok(()) => conn.execute_batch("COMMIT")?,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                drop(conn);
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        }
        Ok(SqliteEngine::wrap(path, conn))
    }

    /// Opens an existing database. Errors: [`MetaError::NotFound`] when the file is missing,
    /// [`MetaError::Corrupt`] when it is not a deskfs SQLite database, [`MetaError::TooNew`]
    /// when a newer deskfs wrote it.
    pub fn open(path: &Path) -> Result<SqliteEngine> {
        if !path.exists() {
            return Err(MetaError::NotFound(path.display().to_string()));
        }
        let conn =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OPEN_NO_MUTEX)
                .map_err(|e| corrupt(path, e))?;
        Self::configure(&conn).map_err(|e| corrupt(path, e))?;
        Self::replay_dead_owner(path, &conn)?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| corrupt(path, e))?;
        if version > SCHEMA_VERSION {
            return Err(MetaError::TooNew {
                path: path.display().to_string(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        let format: Option<String> = conn
            .query_row("SELECT value FROM kv WHERE key='format'", [], |r| r.get(0))
            .optional()
            .map_err(|e| corrupt(path, e))?;
        if version < 1 || format.as_deref() != Some("deskfs") {
            return Err(corrupt(path, "no deskfs format record"));
        }
        let root: Option<i64> = conn
            .query_row("SELECT kind FROM inodes WHERE ino=1", [], |r| r.get(0))
            .optional()
            .map_err(|e| corrupt(path, e))?;
        if root != Some(kind_code(Kind::Dir)) {
            return Err(corrupt(path, "root directory missing"));
        }
        conn.execute_batch(CHANGES_TABLE)?;
        conn.execute_batch(INDEXES)?;
        if version < SCHEMA_VERSION {
            conn.execute_batch(&format!(
                "BEGIN IMMEDIATE; {SCHEMA_V2} {SCHEMA_V3} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))
            .map_err(|e| {
                corrupt(
                    path,
                    format!("cannot migrate to schema {SCHEMA_VERSION}: {e}"),
                )
            })?;
        }
        Ok(SqliteEngine::wrap(path, conn))
    }

    /// Replays the redo log a dead window owner left (see [`redo`]): before anything
    /// else writes, so its records apply to the state they were recorded on. A live owner
    /// holds the log's lock and commits its own windows; then nothing is done here.
    fn replay_dead_owner(path: &Path, conn: &Connection) -> Result<()> {
        if !redo::path_for(path).exists() {
            return Ok(());
        }
        if let Some(mut log) = redo::RedoLog::lock(path)? {
            Conn::replay_log(conn, &mut log, &flush::Wal::new(path))?;
        }
        Ok(())
    }

    /// Lets consecutive write requests share one transaction while this engine's mount is
    /// alone on the workspace (commit windows, [`WindowConfig`]; design record 0009):
    /// takes the redo log `<db>-redo` (replaying what a dead owner left) and starts the
    /// thread that commits overdue windows. `Ok(false)`: another engine holds the log —
    /// this one commits every request, as before.
    pub fn enable_commit_window(&self, config: WindowConfig) -> Result<bool> {
        if !self.lock()?.enable(&self.path, config)? {
            return Ok(false);
        }
        let mut timer = self
            .timer
            .lock()
            .map_err(|_| MetaError::Internal("timer mutex poisoned".into()))?;
        if timer.is_none() {
            let shared = self.shared.clone();
            *timer = Some(
                std::thread::Builder::new()
                    .name("meta-window".into())
                    .spawn(move || commit_overdue_windows(&shared))?,
            );
        }
        Ok(true)
    }

    /// The commit window's counters (all zero when windows are off).
    pub fn window_stats(&self) -> Result<WindowStats> {
        Ok(self.lock()?.window().1)
    }

    /// Commits the open window, if any (the next write opens a new one).
    pub fn commit_window(&self) -> Result<()> {
        self.lock()?.commit_window()
    }

    fn wrap(path: &Path, conn: Connection) -> SqliteEngine {
        let conn = Conn::new(conn, path);
        SqliteEngine {
            path: path.to_path_buf(),
            wal: conn.wal(),
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                wake: Condvar::new(),
                stop: AtomicBool::new(false),
            }),
            timer: Mutex::new(None),
            counters: Counters::default(),
            logging: AtomicBool::new(false),
            side: Mutex::new(None),
        }
    }

    /// Runs `body` in a write (`BEGIN IMMEDIATE`, or the open commit window) or read
    /// transaction, committing on `Ok` (a window commits later; the request is in the
    /// redo log when this returns); retried (with backoff) on retryable errors. Counts
    /// round trips, commits and retries.
    fn run<T>(&self, write: bool, body: impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        self.run_logged(write, None, body)
    }

    /// [`SqliteEngine::run`] of a body that applies `ops` and nothing else: in a commit
    /// window the batch is the request's redo record (see [`redo`]).
    fn run_logged<T>(
        &self,
        write: bool,
        ops: Option<&[Op]>,
        mut body: impl FnMut(&Connection) -> Result<T>,
    ) -> Result<T> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let res = {
                let mut conn = self.lock()?;
                self.counters.round_trip();
                let res = if write {
                    conn.write(&mut body, ops)
                } else {
                    conn.read(&mut body)
                };
                if std::mem::take(&mut conn.opened) {
                    self.shared.wake.notify_one();
                }
                res
            };
            match res {
                Ok(v) => {
                    if write {
                        Counters::add(&self.counters.commits);
                    }
                    return Ok(v);
                }
                Err(e) if e.is_retryable() && attempt < TXN_ATTEMPTS => {
                    Counters::add(&self.counters.retries);
                    tracing::debug!(attempt, error = %e, "sqlite transaction retried");
                    std::thread::sleep(crate::retry_backoff(attempt));
                }
                Err(e) => {
                    match &e {
                        MetaError::Precondition { .. } => {
                            Counters::add(&self.counters.preconditions)
                        }
                        MetaError::Aborted | MetaError::Fenced(_) => {}
                        _ => Counters::add(&self.counters.errors),
                    }
                    return Err(e);
                }
            }
        }
    }

    fn configure(conn: &Connection) -> Result<()> {
        conn.busy_timeout(Duration::from_secs(30))?;
        // Every statement the engine uses stays prepared (rusqlite's default of 16 is
        // fewer than one request path's statements: they were re-parsed on every call).
        conn.set_prepared_statement_cache_capacity(256);
        // journal_mode returns a row; query it rather than execute.
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(MetaError::db(
                "SQLITE_WAL",
                format!("cannot enable WAL (got {mode})"),
            ));
        }
        // A 32 MiB page cache: a million-file database does not fit in any affordable
        // cache, misses are reads of the OS page cache, and the daemon stays under its
        // memory budget (256 MiB at a million files).
        conn.execute_batch(
            "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=OFF; PRAGMA cache_size=-32768; PRAGMA wal_autocheckpoint=10000;",
        )?;
        Ok(())
    }

    /// Runs SQLite's `PRAGMA integrity_check`; returns the problems found (empty = healthy).
    pub fn integrity_check(&self) -> Result<Vec<String>> {
        let mut conn = self.lock()?;
        conn.commit_window()?;
        let mut stmt = conn.prepare("PRAGMA integrity_check")?;
        let rows: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<std::result::Result<_, _>>()?;
        Ok(rows.into_iter().filter(|r| r != "ok").collect())
    }

    /// Writes a consistent copy of the database to `dest` (SQLite `VACUUM INTO`).
    pub fn backup_to(&self, dest: &Path) -> Result<()> {
        let mut conn = self.lock()?;
        conn.commit_window()?;
        let _ = std::fs::remove_file(dest);
        conn.execute("VACUUM INTO ?1", params![dest.to_string_lossy()])?;
        Ok(())
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection, with a window SQLite rolled back or whose commit failed replayed
    /// first (reads must never see a state missing acknowledged requests).
    fn lock_current(&self) -> Result<std::sync::MutexGuard<'_, Conn>> {
        let mut conn = self.lock()?;
        conn.current()?;
        Ok(conn)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Conn>> {
        self.shared
            .conn
            .lock()
            .map_err(|_| MetaError::Internal("sqlite connection mutex poisoned".into()))
    }
}

impl Drop for SqliteEngine {
    fn drop(&mut self) {
        {
            // Under the mutex: the commit thread checks `stop` and waits under it, so it
            // cannot miss this wake-up.
            let _g = self.shared.conn.lock();
            self.shared.stop.store(true, Ordering::Relaxed);
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.timer.get_mut().ok().and_then(|t| t.take()) {
            let _ = t.join();
        }
    }
}

/// The window-commit thread: sleeps until a window opens, then commits it when its span
/// is over (a request arriving after the deadline commits it too).
fn commit_overdue_windows(shared: &Shared) {
    let Ok(mut conn) = shared.conn.lock() else {
        return;
    };
    while !shared.stop.load(Ordering::Relaxed) {
        conn = match conn.deadline() {
            None => match shared.wake.wait(conn) {
                Ok(g) => g,
                Err(_) => return,
            },
            Some(at) => {
                let now = Instant::now();
                if now >= at {
                    if let Err(e) = conn.commit_window() {
                        tracing::error!(error = %e, "metadata commit window failed");
                    }
                    continue;
                }
                match shared.wake.wait_timeout(conn, at - now) {
                    Ok((g, _)) => g,
                    Err(_) => return,
                }
            }
        };
    }
}

/// Runs a parameterless statement through the statement cache (no re-parse per call).
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

impl MetaEngine for SqliteEngine {
    fn txn(&self, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()> {
        self.run(true, |conn| f(&mut SqlTxn { conn }))
    }

    fn read(&self, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()> {
        self.run(false, |conn| f(&mut SqlTxn { conn }))
    }

    fn apply(&self, ops: &[Op]) -> Result<Vec<OpOut>> {
        self.run_logged(true, Some(ops), |conn| batch::apply_ops(conn, ops))
    }

    fn get_inode(&self, ino: Ino) -> Result<Option<InodeRow>> {
        let conn = self.lock_current()?;
        self.counters.round_trip();
        let mut st =
            conn.prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE ino=?1"))?;
        Ok(st
            .query_row(params![ino as i64], |r| inode_from_row(r, 0))
            .optional()?)
    }

    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Option<InodeRow>> {
        let conn = self.lock_current()?;
        self.counters.round_trip();
        let mut st = conn.prepare_cached(
            "SELECT i.ino,i.kind,i.perm,i.uid,i.gid,i.rdev,i.nlink,i.size,i.atime,i.mtime,
                    i.ctime,i.btime,i.data_version,i.target,i.local,i.dirty,i.listed
             FROM dentries d JOIN inodes i ON i.ino = d.ino WHERE d.parent=?1 AND d.name=?2",
        )?;
        Ok(st
            .query_row(params![parent as i64, name], |r| inode_from_row(r, 0))
            .optional()?)
    }

    fn alloc_inos(&self, n: u64) -> Result<std::ops::Range<Ino>> {
        self.run(true, |conn| batch::alloc_inos(conn, n))
    }

    fn settle(&self) -> Result<()> {
        self.commit_window()
    }

    /// Scans on a read-only connection of its own (WAL: a reader never waits for the
    /// writer, nor the writer for it), after committing the open window so the counts
    /// include every request answered before: a workspace of 1,000,000 inodes takes a
    /// scan of some 100 ms, during which requests go on.
    fn usage(&self) -> Result<Usage> {
        self.settle()?;
        let mut side = self
            .side
            .lock()
            .map_err(|_| MetaError::Internal("usage connection mutex poisoned".into()))?;
        if side.is_none() {
            let conn = Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OPEN_NO_MUTEX,
            )?;
            conn.busy_timeout(std::time::Duration::from_secs(30))?;
            *side = Some(conn);
        }
        match side.as_ref() {
            Some(conn) => txn::usage_of(conn),
            None => Ok(Usage::default()),
        }
    }

    fn counters(&self) -> EngineCounters {
        let mut c = self.counters.snapshot();
        if let Ok(w) = self.window_stats() {
            c.window_commits = w.commits;
            c.windowed = w.requests;
            c.replayed = w.replayed;
            c.redo_bytes = w.redo_bytes;
            c.redo_flushes = w.redo_flushes;
            c.redo_flushes_covered = w.redo_flushes_covered;
        }
        c
    }

    fn feed_start(&self) -> Result<FeedCursor> {
        let conn = self.lock_current()?;
        self.counters.round_trip();
        let last: i64 = conn
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM changes")?
            .query_row([], |r| r.get(0))?;
        Ok(FeedCursor {
            a: last as u64,
            b: 0,
        })
    }

    /// SQLite has one writer at a time, so sequence numbers are handed out in commit
    /// order: `seq > cursor` never misses a change.
    fn feed_read(
        &self,
        cursor: FeedCursor,
        not_session: u64,
        limit: usize,
    ) -> Result<(Vec<ChangeRow>, FeedCursor)> {
        let conn = self.lock_current()?;
        self.counters.round_trip();
        let mut st = conn.prepare_cached(
            "SELECT seq, session, ino, parent, name FROM changes
             WHERE seq > ?1 ORDER BY seq LIMIT ?2",
        )?;
        let all: Vec<ChangeRow> = st
            .query_map(params![cursor.a as i64, limit as i64], |r| {
                Ok(ChangeRow {
                    seq: r.get::<_, i64>(0)? as u64,
                    session: r.get::<_, i64>(1)? as u64,
                    ino: r.get::<_, i64>(2)? as u64,
                    parent: r.get::<_, Option<i64>>(3)?.map(|p| p as u64),
                    name: r.get(4)?,
                })
            })?
            .collect::<std::result::Result<_, _>>()?;
        let next = FeedCursor {
            a: all.last().map(|c| c.seq).unwrap_or(cursor.a),
            b: 0,
        };
        Ok((
            all.into_iter()
                .filter(|c| c.session != not_session)
                .collect(),
            next,
        ))
    }

    fn log_changes_as(&self, session: u64) -> Result<()> {
        let mut conn = self.lock()?;
        // TEMP schema changes are transactional: made inside a window, a rollback of the
        // window would drop the triggers (and replay would not bring them back).
        conn.commit_window()?;
        conn.set_session(session);
        let sql = CHANGE_TRIGGERS
            .replace("{S}", &session.to_string())
            .replace("{NOW}", SQL_NOW_MS);
        conn.execute_batch(&sql)?;
        self.logging.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Every committed transaction is in the WAL file (synchronous=NORMAL writes it
    /// without a flush; a checkpoint flushes it first and the database after), so one
    /// `fdatasync` of the WAL makes all of them durable — done on a descriptor of our own,
    /// without holding the connection: other requests go on during the device flush, and
    /// callers flush their own files at the same time. Nothing is flushed when nothing was
    /// committed since the last flush. Inside a commit window whose starting state is
    /// durable, the window's requests are all in its redo log: that log is flushed instead
    /// of committing (design record 0011; the window's commit later flushes the WAL before
    /// emptying the log). Falls back to a FULL-sync commit when there is no WAL file.
    /// Errors: the flush's ([`MetaError::Io`], `EIO`) — nothing is reported durable then.
    fn make_durable(&self) -> Result<()> {
        let mark = {
            let mut conn = self.lock_current()?;
            if let Some(log) = conn.log_for_fsync() {
                drop(conn);
                return Ok(log.sync()?);
            }
            conn.commit_window()?;
            if conn.wal_durable()? {
                return Ok(());
            }
            conn.wal_mark()?
        };
        if self.wal.sync()? {
            self.lock()?.wal_flushed(mark);
            return Ok(());
        }
        let mut conn = self.lock()?;
        // Under the same lock as the commit: no window can open in between.
        conn.commit_window()?;
        // In WAL mode a commit with synchronous=FULL fsyncs the WAL, which holds every
        // earlier commit too.
        conn.execute_batch("PRAGMA synchronous=FULL")?;
        let res = conn.execute_batch(
            "BEGIN IMMEDIATE;
             INSERT INTO kv(key,value) VALUES('durable_mark','1')
               ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1;
             COMMIT;",
        );
        if res.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        conn.execute_batch("PRAGMA synchronous=NORMAL")?;
        res?;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }
}

#[cfg(test)]
mod tests;
