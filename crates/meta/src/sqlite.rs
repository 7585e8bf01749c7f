//! The embedded SQLite engine: one database file per workspace, WAL mode, shared by every
//! mount of the workspace on one host (SQLite's own file locking serialises writers).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};

use crate::{
    ChangeRow, Dentry, Ino, InodeRow, Kind, Local, LockRow, MetaEngine, MetaError, MetaTxn,
    ObjectRow, PendingRow, PendingStats, Result, SessionRow, Usage, ROOT_INO,
};

/// Schema version written to `PRAGMA user_version`. Databases with a higher number are
/// refused with [`MetaError::TooNew`].
pub const SCHEMA_VERSION: i64 = 1;

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
CREATE INDEX inodes_dirty ON inodes(dirty) WHERE dirty = 1;
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
    conn: Mutex<Connection>,
    /// The write-ahead log, open for `fdatasync` (see [`MetaEngine::make_durable`]).
    wal: Mutex<Option<std::fs::File>>,
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
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        )?;
        Self::configure(&conn)?;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let res =
            (|| -> Result<()> {
                conn.execute_batch(SCHEMA)?;
                conn.execute_batch(CHANGES_TABLE)?;
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
        Ok(SqliteEngine {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            wal: Mutex::new(None),
        })
    }

    /// Opens an existing database. Errors: [`MetaError::NotFound`] when the file is missing,
    /// [`MetaError::Corrupt`] when it is not a deskfs SQLite database, [`MetaError::TooNew`]
    /// when a newer deskfs wrote it.
    pub fn open(path: &Path) -> Result<SqliteEngine> {
        if !path.exists() {
            return Err(MetaError::NotFound(path.display().to_string()));
        }
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
            .map_err(|e| corrupt(path, e))?;
        Self::configure(&conn).map_err(|e| corrupt(path, e))?;
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
        Ok(SqliteEngine {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            wal: Mutex::new(None),
        })
    }

    fn configure(conn: &Connection) -> Result<()> {
        conn.busy_timeout(Duration::from_secs(30))?;
        // Every statement the engine uses stays prepared (rusqlite's default of 16 is
        // fewer than one request path's statements: they were re-parsed on every call).
        conn.set_prepared_statement_cache_capacity(256);
        // journal_mode returns a row; query it rather than execute.
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(MetaError::Db(format!("cannot enable WAL (got {mode})")));
        }
        conn.execute_batch(
            "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=OFF; PRAGMA cache_size=-65536; PRAGMA wal_autocheckpoint=10000;",
        )?;
        Ok(())
    }

    /// Runs SQLite's `PRAGMA integrity_check`; returns the problems found (empty = healthy).
    pub fn integrity_check(&self) -> Result<Vec<String>> {
        let conn = self.lock()?;
        let mut stmt = conn.prepare("PRAGMA integrity_check")?;
        let rows: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<std::result::Result<_, _>>()?;
        Ok(rows.into_iter().filter(|r| r != "ok").collect())
    }

    /// Writes a consistent copy of the database to `dest` (SQLite `VACUUM INTO`).
    pub fn backup_to(&self, dest: &Path) -> Result<()> {
        let conn = self.lock()?;
        let _ = std::fs::remove_file(dest);
        conn.execute("VACUUM INTO ?1", params![dest.to_string_lossy()])?;
        Ok(())
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>> {
        self.conn
            .lock()
            .map_err(|_| MetaError::Internal("sqlite connection mutex poisoned".into()))
    }
}

/// Runs a parameterless statement through the statement cache (no re-parse per call).
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

impl SqliteEngine {
    /// `fdatasync` of the WAL file through a cached descriptor, reopened when the file
    /// was replaced. `Ok(false)`: there is no WAL file to sync (use a FULL commit).
    fn sync_wal(&self) -> std::io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let path = {
            let mut p = self.path.clone().into_os_string();
            p.push("-wal");
            PathBuf::from(p)
        };
        let mut guard = self
            .wal
            .lock()
            .map_err(|_| std::io::Error::other("wal mutex poisoned"))?;
        let current = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let same = guard
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .is_some_and(|m| m.ino() == current.ino() && m.dev() == current.dev());
        if !same {
            *guard = Some(std::fs::OpenOptions::new().read(true).open(&path)?);
        }
        let f = guard
            .as_ref()
            .ok_or_else(|| std::io::Error::other("wal not open"))?;
        f.sync_data()?;
        Ok(true)
    }
}

impl MetaEngine for SqliteEngine {
    fn txn(&self, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()> {
        let conn = self.lock()?;
        exec(&conn, "BEGIN IMMEDIATE")?;
        let mut t = SqlTxn { conn: &conn };
        match f(&mut t) {
            Ok(()) => match exec(&conn, "COMMIT") {
                Ok(()) => Ok(()),
                Err(e) => {
                    let _ = exec(&conn, "ROLLBACK");
                    Err(e.into())
                }
            },
            Err(e) => {
                let _ = exec(&conn, "ROLLBACK");
                Err(e)
            }
        }
    }

    fn read(&self, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()> {
        let conn = self.lock()?;
        exec(&conn, "BEGIN DEFERRED")?;
        let mut t = SqlTxn { conn: &conn };
        let r = f(&mut t);
        let _ = exec(&conn, "COMMIT");
        r
    }

    fn log_changes_as(&self, session: u64) -> Result<()> {
        let conn = self.lock()?;
        let sql = CHANGE_TRIGGERS
            .replace("{S}", &session.to_string())
            .replace("{NOW}", SQL_NOW_MS);
        conn.execute_batch(&sql)?;
        Ok(())
    }

    /// Every committed transaction is in the WAL file (synchronous=NORMAL writes it
    /// without fsync; checkpoints sync it first and the database after), so an
    /// `fdatasync` of the WAL makes all of them durable — done on a descriptor of our own,
    /// without holding the connection: other requests go on during the device flush, and
    /// callers can flush their own files at the same time. Falls back to a FULL-sync
    /// commit when the WAL cannot be opened.
    fn make_durable(&self) -> Result<()> {
        if self.sync_wal().unwrap_or(false) {
            return Ok(());
        }
        let conn = self.lock()?;
        // In WAL mode a commit with synchronous=FULL fsyncs the WAL, which holds every
        // earlier commit too.
        conn.execute_batch(
            "PRAGMA synchronous=FULL;
             BEGIN IMMEDIATE;
             INSERT INTO kv(key,value) VALUES('durable_mark','1')
               ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1;
             COMMIT;
             PRAGMA synchronous=NORMAL;",
        )?;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }
}

fn kind_code(k: Kind) -> i64 {
    (k.ifmt() >> 12) as i64
}

fn kind_from_code(c: i64) -> rusqlite::Result<Kind> {
    Kind::from_mode((c as u32) << 12).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Integer,
            format!("bad inode kind {c}").into(),
        )
    })
}

const INODE_COLS: &str = "ino,kind,perm,uid,gid,rdev,nlink,size,atime,mtime,ctime,btime,\
                          data_version,target,local,dirty,listed";

fn inode_from_row(r: &Row<'_>, base: usize) -> rusqlite::Result<InodeRow> {
    Ok(InodeRow {
        ino: r.get::<_, i64>(base)? as u64,
        kind: kind_from_code(r.get(base + 1)?)?,
        perm: r.get(base + 2)?,
        uid: r.get(base + 3)?,
        gid: r.get(base + 4)?,
        rdev: r.get(base + 5)?,
        nlink: r.get(base + 6)?,
        size: r.get::<_, i64>(base + 7)? as u64,
        atime_ns: r.get(base + 8)?,
        mtime_ns: r.get(base + 9)?,
        ctime_ns: r.get(base + 10)?,
        btime_ns: r.get(base + 11)?,
        data_version: r.get::<_, i64>(base + 12)? as u64,
        target: r.get(base + 13)?,
        local: if r.get::<_, i64>(base + 14)? == 1 {
            Local::Full
        } else {
            Local::None
        },
        dirty: r.get::<_, i64>(base + 15)? != 0,
        listed_ns: r.get(base + 16)?,
    })
}

fn object_from_row(r: &Row<'_>) -> rusqlite::Result<ObjectRow> {
    Ok(ObjectRow {
        path: r.get(0)?,
        key: r.get(1)?,
        ino: r.get::<_, i64>(2)? as u64,
        kind: kind_from_code(r.get(3)?)?,
        data_version: r.get::<_, i64>(4)? as u64,
        meta_stamp: r.get(5)?,
        etag: r.get(6)?,
        size: r.get::<_, i64>(7)? as u64,
    })
}

fn pending_from_row(r: &Row<'_>) -> rusqlite::Result<PendingRow> {
    Ok(PendingRow {
        path: r.get(0)?,
        recursive: r.get::<_, i64>(1)? != 0,
        seq: r.get::<_, i64>(2)? as u64,
        gen: r.get::<_, i64>(3)? as u64,
        due_ns: r.get(4)?,
        since_ns: r.get(5)?,
        attempts: r.get(6)?,
        last_error: r.get(7)?,
    })
}

const OBJECT_COLS: &str = "path,key,ino,kind,data_version,meta_stamp,etag,size";
const PENDING_COLS: &str = "path,recursive,seq,gen,due,since,attempts,last_error";

/// Upper bound (exclusive) of the byte strings that start with `dir/`: `dir0`.
fn subtree_bounds(dir: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if dir.is_empty() {
        return (Vec::new(), vec![0xff; 8]);
    }
    let mut lo = dir.to_vec();
    lo.push(b'/');
    let mut hi = dir.to_vec();
    hi.push(b'/' + 1);
    (lo, hi)
}

struct SqlTxn<'c> {
    conn: &'c Connection,
}

impl SqlTxn<'_> {
    fn next_seq(&mut self) -> Result<u64> {
        let seq: i64 = self.conn.query_row(
            "UPDATE kv SET value = CAST(value AS INTEGER) + 1 WHERE key='pending_seq' RETURNING CAST(value AS INTEGER)",
            [],
            |r| r.get(0),
        )?;
        Ok(seq as u64)
    }
}

impl MetaTxn for SqlTxn<'_> {
    fn get_inode(&mut self, ino: Ino) -> Result<Option<InodeRow>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE ino=?1"))?;
        Ok(st
            .query_row(params![ino as i64], |r| inode_from_row(r, 0))
            .optional()?)
    }

    fn insert_inode(&mut self, row: &InodeRow) -> Result<Ino> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO inodes(kind,perm,uid,gid,rdev,nlink,size,atime,mtime,ctime,btime,
             data_version,target,local,dirty,listed)
             VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)",
        )?;
        st.execute(params![
            kind_code(row.kind),
            row.perm,
            row.uid,
            row.gid,
            row.rdev,
            row.nlink,
            row.size as i64,
            row.atime_ns,
            row.mtime_ns,
            row.ctime_ns,
            row.btime_ns,
            row.data_version as i64,
            row.target,
            (row.local == Local::Full) as i64,
            row.dirty as i64,
            row.listed_ns,
        ])?;
        Ok(self.conn.last_insert_rowid() as u64)
    }

    fn update_inode(&mut self, row: &InodeRow) -> Result<()> {
        let mut st = self.conn.prepare_cached(
            "UPDATE inodes SET kind=?2,perm=?3,uid=?4,gid=?5,rdev=?6,nlink=?7,size=?8,atime=?9,
             mtime=?10,ctime=?11,btime=?12,data_version=?13,target=?14,local=?15,dirty=?16,
             listed=?17 WHERE ino=?1",
        )?;
        let n = st.execute(params![
            row.ino as i64,
            kind_code(row.kind),
            row.perm,
            row.uid,
            row.gid,
            row.rdev,
            row.nlink,
            row.size as i64,
            row.atime_ns,
            row.mtime_ns,
            row.ctime_ns,
            row.btime_ns,
            row.data_version as i64,
            row.target,
            (row.local == Local::Full) as i64,
            row.dirty as i64,
            row.listed_ns,
        ])?;
        if n == 0 {
            return Err(MetaError::NotFound(format!("inode {}", row.ino)));
        }
        Ok(())
    }

    fn delete_inode(&mut self, ino: Ino) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM inodes WHERE ino=?1")?
            .execute(params![ino as i64])?;
        self.conn
            .prepare_cached("DELETE FROM xattrs WHERE ino=?1")?
            .execute(params![ino as i64])?;
        Ok(())
    }

    fn scan_inodes(&mut self, after: Ino, limit: usize) -> Result<Vec<InodeRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {INODE_COLS} FROM inodes WHERE ino>?1 ORDER BY ino LIMIT ?2"
        ))?;
        let v = st
            .query_map(params![after as i64, limit as i64], |r| {
                inode_from_row(r, 0)
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn scan_dentries(&mut self, after: u64, limit: usize) -> Result<Vec<Dentry>> {
        let mut st = self.conn.prepare_cached(
            "SELECT cookie,parent,name,ino FROM dentries WHERE cookie>?1 ORDER BY cookie LIMIT ?2",
        )?;
        let v = st
            .query_map(params![after as i64, limit as i64], |r| {
                Ok(Dentry {
                    cookie: r.get::<_, i64>(0)? as u64,
                    parent: r.get::<_, i64>(1)? as u64,
                    name: r.get(2)?,
                    ino: r.get::<_, i64>(3)? as u64,
                })
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn set_nlink(&mut self, ino: Ino, nlink: u32) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE inodes SET nlink=?2 WHERE ino=?1")?
            .execute(params![ino as i64, nlink])?;
        Ok(())
    }

    fn orphan_inodes(&mut self) -> Result<Vec<Ino>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT ino FROM inodes WHERE nlink=0")?;
        let v = st
            .query_map([], |r| r.get::<_, i64>(0))?
            .map(|r| r.map(|i| i as u64))
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn dirty_inodes(&mut self) -> Result<Vec<InodeRow>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE dirty=1"))?;
        let v = st
            .query_map([], |r| inode_from_row(r, 0))?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn lookup(&mut self, parent: Ino, name: &[u8]) -> Result<Option<Dentry>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT cookie,ino FROM dentries WHERE parent=?1 AND name=?2")?;
        Ok(st
            .query_row(params![parent as i64, name], |r| {
                Ok(Dentry {
                    cookie: r.get::<_, i64>(0)? as u64,
                    parent,
                    name: name.to_vec(),
                    ino: r.get::<_, i64>(1)? as u64,
                })
            })
            .optional()?)
    }

    fn insert_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()> {
        let mut st = self
            .conn
            .prepare_cached("INSERT INTO dentries(parent,name,ino) VALUES(?1,?2,?3)")?;
        match st.execute(params![parent as i64, name, ino as i64]) {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(MetaError::Conflict(String::from_utf8_lossy(name).into()))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn delete_dentry(&mut self, parent: Ino, name: &[u8]) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM dentries WHERE parent=?1 AND name=?2")?
            .execute(params![parent as i64, name])?;
        Ok(())
    }

    fn move_dentry(
        &mut self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
    ) -> Result<()> {
        let n = self
            .conn
            .prepare_cached("UPDATE dentries SET parent=?3, name=?4 WHERE parent=?1 AND name=?2")?
            .execute(params![parent as i64, name, new_parent as i64, new_name])?;
        if n == 0 {
            return Err(MetaError::NotFound(String::from_utf8_lossy(name).into()));
        }
        Ok(())
    }

    fn repoint_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()> {
        let n = self
            .conn
            .prepare_cached("UPDATE dentries SET ino=?3 WHERE parent=?1 AND name=?2")?
            .execute(params![parent as i64, name, ino as i64])?;
        if n == 0 {
            return Err(MetaError::NotFound(String::from_utf8_lossy(name).into()));
        }
        Ok(())
    }

    fn list_dir(
        &mut self,
        parent: Ino,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(Dentry, InodeRow)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT d.cookie, d.name, i.ino,i.kind,i.perm,i.uid,i.gid,i.rdev,i.nlink,i.size,
                    i.atime,i.mtime,i.ctime,i.btime,i.data_version,i.target,i.local,i.dirty,i.listed
             FROM dentries d JOIN inodes i ON i.ino = d.ino
             WHERE d.parent=?1 AND d.cookie>?2 ORDER BY d.cookie LIMIT ?3",
        )?;
        let v = st
            .query_map(params![parent as i64, after as i64, limit as i64], |r| {
                let inode = inode_from_row(r, 2)?;
                Ok((
                    Dentry {
                        cookie: r.get::<_, i64>(0)? as u64,
                        parent,
                        name: r.get(1)?,
                        ino: inode.ino,
                    },
                    inode,
                ))
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn has_children(&mut self, parent: Ino) -> Result<bool> {
        let mut st = self
            .conn
            .prepare_cached("SELECT 1 FROM dentries WHERE parent=?1 LIMIT 1")?;
        Ok(st.exists(params![parent as i64])?)
    }

    fn names_of(&mut self, ino: Ino) -> Result<Vec<(Ino, Vec<u8>)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT parent,name FROM dentries WHERE ino=?1 ORDER BY cookie")?;
        let v = st
            .query_map(params![ino as i64], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?))
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn get_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT value FROM xattrs WHERE ino=?1 AND name=?2")?;
        Ok(st
            .query_row(params![ino as i64, name], |r| r.get(0))
            .optional()?)
    }

    fn set_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO xattrs(ino,name,value) VALUES(?1,?2,?3)
                 ON CONFLICT(ino,name) DO UPDATE SET value=excluded.value",
            )?
            .execute(params![ino as i64, name, value])?;
        Ok(())
    }

    fn remove_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<bool> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM xattrs WHERE ino=?1 AND name=?2")?
            .execute(params![ino as i64, name])?;
        Ok(n > 0)
    }

    fn list_xattrs(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT name FROM xattrs WHERE ino=?1 ORDER BY name")?;
        let v = st
            .query_map(params![ino as i64], |r| r.get::<_, Vec<u8>>(0))?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn get_object(&mut self, path: &[u8]) -> Result<Option<ObjectRow>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {OBJECT_COLS} FROM objects WHERE path=?1"))?;
        Ok(st.query_row(params![path], object_from_row).optional()?)
    }

    fn put_object(&mut self, row: &ObjectRow) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO objects(path,key,ino,kind,data_version,meta_stamp,etag,size)
                 VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
            )?
            .execute(params![
                row.path,
                row.key,
                row.ino as i64,
                kind_code(row.kind),
                row.data_version as i64,
                row.meta_stamp,
                row.etag,
                row.size as i64
            ])?;
        Ok(())
    }

    fn delete_object(&mut self, path: &[u8]) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM objects WHERE path=?1")?
            .execute(params![path])?;
        Ok(())
    }

    fn objects_under(&mut self, dir: &[u8], limit: usize) -> Result<Vec<ObjectRow>> {
        let (lo, hi) = subtree_bounds(dir);
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {OBJECT_COLS} FROM objects WHERE path>=?1 AND path<?2 ORDER BY path LIMIT ?3"
        ))?;
        let v = st
            .query_map(params![lo, hi, limit as i64], object_from_row)?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn object_with_content(&mut self, ino: Ino, data_version: u64) -> Result<Option<ObjectRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {OBJECT_COLS} FROM objects WHERE ino=?1 AND data_version=?2 LIMIT 1"
        ))?;
        Ok(st
            .query_row(params![ino as i64, data_version as i64], object_from_row)
            .optional()?)
    }

    fn mark_pending(&mut self, path: &[u8], recursive: bool, not_before_ns: i64) -> Result<u64> {
        let seq = self.next_seq()?;
        self.conn
            .prepare_cached(
                "INSERT INTO pending(path,recursive,seq,gen,due,since,attempts,last_error)
                 VALUES(?1,?2,?3,1,?4,?5,0,NULL)
                 ON CONFLICT(path) DO UPDATE SET
                   recursive = max(recursive, excluded.recursive),
                   gen = gen + 1,
                   due = min(excluded.due, since + ?6)",
            )?
            .execute(params![
                path,
                recursive as i64,
                seq as i64,
                not_before_ns,
                not_before_ns,
                MAX_COALESCE_NS
            ])?;
        Ok(seq)
    }

    fn due_pending(&mut self, now_ns: i64, limit: usize) -> Result<Vec<PendingRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {PENDING_COLS} FROM pending WHERE due<=?1 ORDER BY due LIMIT ?2"
        ))?;
        let v = st
            .query_map(params![now_ns, limit as i64], pending_from_row)?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn finish_pending(&mut self, path: &[u8], gen: u64) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM pending WHERE path=?1 AND gen=?2")?
            .execute(params![path, gen as i64])?;
        Ok(())
    }

    fn fail_pending(&mut self, path: &[u8], gen: u64, error: &str, retry_at_ns: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE pending SET attempts=attempts+1, last_error=?3, due=?4
                 WHERE path=?1 AND gen=?2",
            )?
            .execute(params![path, gen as i64, error, retry_at_ns])?;
        Ok(())
    }

    fn defer_pending(&mut self, path: &[u8], gen: u64, retry_at_ns: i64) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE pending SET due=?3 WHERE path=?1 AND gen=?2")?
            .execute(params![path, gen as i64, retry_at_ns])?;
        Ok(())
    }

    fn is_pending(&mut self, path: &[u8]) -> Result<bool> {
        let mut st = self
            .conn
            .prepare_cached("SELECT recursive FROM pending WHERE path=?1")?;
        if st.exists(params![path])? {
            return Ok(true);
        }
        let mut anc = self
            .conn
            .prepare_cached("SELECT 1 FROM pending WHERE path=?1 AND recursive=1")?;
        for (i, b) in path.iter().enumerate() {
            if *b == b'/' && anc.exists(params![&path[..i]])? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn pending_stats(&mut self) -> Result<PendingStats> {
        let (pending, failing): (i64, i64) = self.conn.query_row(
            "SELECT count(*), coalesce(sum(attempts>0),0) FROM pending",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let last: String =
            self.conn
                .query_row("SELECT value FROM kv WHERE key='pending_seq'", [], |r| {
                    r.get(0)
                })?;
        Ok(PendingStats {
            pending: pending as u64,
            failing: failing as u64,
            last_seq: last.parse().unwrap_or(0),
        })
    }

    fn pending_upto(&mut self, upto: u64) -> Result<bool> {
        let mut st = self
            .conn
            .prepare_cached("SELECT 1 FROM pending WHERE seq<=?1 LIMIT 1")?;
        Ok(st.exists(params![upto as i64])?)
    }

    fn failed_pending(&mut self, limit: usize) -> Result<Vec<PendingRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {PENDING_COLS} FROM pending WHERE attempts>0 ORDER BY due DESC LIMIT ?1"
        ))?;
        let v = st
            .query_map(params![limit as i64], pending_from_row)?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn register_session(&mut self, host: &str, pid: u32, now_ns: i64) -> Result<u64> {
        self.conn
            .prepare_cached("INSERT INTO sessions(host,pid,started,heartbeat) VALUES(?1,?2,?3,?3)")?
            .execute(params![host, pid, now_ns])?;
        Ok(self.conn.last_insert_rowid() as u64)
    }

    fn heartbeat(&mut self, session: u64, now_ns: i64) -> Result<()> {
        let n = self
            .conn
            .prepare_cached("UPDATE sessions SET heartbeat=?2 WHERE id=?1")?
            .execute(params![session as i64, now_ns])?;
        if n == 0 {
            return Err(MetaError::NotFound(format!("session {session}")));
        }
        Ok(())
    }

    fn sessions(&mut self) -> Result<Vec<SessionRow>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id,host,pid,heartbeat FROM sessions ORDER BY id")?;
        let v = st
            .query_map([], |r| {
                Ok(SessionRow {
                    id: r.get::<_, i64>(0)? as u64,
                    host: r.get(1)?,
                    pid: r.get(2)?,
                    heartbeat_ns: r.get(3)?,
                })
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn delete_session(&mut self, session: u64) -> Result<()> {
        for sql in [
            "DELETE FROM sessions WHERE id=?1",
            "DELETE FROM open_files WHERE session=?1",
            "DELETE FROM locks WHERE session=?1",
        ] {
            self.conn
                .prepare_cached(sql)?
                .execute(params![session as i64])?;
        }
        Ok(())
    }

    fn changes_after(
        &mut self,
        after: u64,
        not_session: u64,
        limit: usize,
    ) -> Result<Vec<ChangeRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT seq, session, ino, parent, name FROM changes
             WHERE seq > ?1 AND session <> ?2 ORDER BY seq LIMIT ?3",
        )?;
        let v = st
            .query_map(
                params![after as i64, not_session as i64, limit as i64],
                |r| {
                    Ok(ChangeRow {
                        seq: r.get::<_, i64>(0)? as u64,
                        session: r.get::<_, i64>(1)? as u64,
                        ino: r.get::<_, i64>(2)? as u64,
                        parent: r.get::<_, Option<i64>>(3)?.map(|p| p as u64),
                        name: r.get(4)?,
                    })
                },
            )?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn last_change(&mut self) -> Result<u64> {
        let mut st = self
            .conn
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM changes")?;
        Ok(st.query_row([], |r| r.get::<_, i64>(0))? as u64)
    }

    fn prune_changes(&mut self, before_ms: i64) -> Result<u64> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM changes WHERE ts < ?1")?
            .execute(params![before_ms])?;
        Ok(n as u64)
    }

    fn add_open(&mut self, ino: Ino, session: u64, delta: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO open_files(ino,session,count) VALUES(?1,?2,?3)
                 ON CONFLICT(ino,session) DO UPDATE SET count = count + excluded.count",
            )?
            .execute(params![ino as i64, session as i64, delta])?;
        self.conn
            .prepare_cached("DELETE FROM open_files WHERE ino=?1 AND session=?2 AND count<=0")?
            .execute(params![ino as i64, session as i64])?;
        Ok(())
    }

    fn open_elsewhere(&mut self, ino: Ino, session: u64) -> Result<bool> {
        let mut st = self.conn.prepare_cached(
            "SELECT 1 FROM open_files WHERE ino=?1 AND session<>?2 AND count>0 LIMIT 1",
        )?;
        Ok(st.exists(params![ino as i64, session as i64])?)
    }

    fn locks_on(&mut self, ino: Ino) -> Result<Vec<LockRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT session,owner,write,start,end_,pid,fh FROM locks WHERE ino=?1 ORDER BY start",
        )?;
        let v = st
            .query_map(params![ino as i64], |r| {
                Ok(LockRow {
                    ino,
                    session: r.get::<_, i64>(0)? as u64,
                    owner: r.get::<_, i64>(1)? as u64,
                    write: r.get::<_, i64>(2)? != 0,
                    start: r.get::<_, i64>(3)? as u64,
                    end: r.get::<_, i64>(4)? as u64,
                    pid: r.get(5)?,
                    fh: r.get::<_, i64>(6)? as u64,
                })
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn set_owner_locks(
        &mut self,
        ino: Ino,
        session: u64,
        owner: u64,
        locks: &[LockRow],
    ) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM locks WHERE ino=?1 AND session=?2 AND owner=?3")?
            .execute(params![ino as i64, session as i64, owner as i64])?;
        let mut ins = self.conn.prepare_cached(
            "INSERT INTO locks(ino,session,owner,write,start,end_,pid,fh) VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
        )?;
        for l in locks {
            ins.execute(params![
                ino as i64,
                session as i64,
                owner as i64,
                l.write as i64,
                l.start as i64,
                l.end as i64,
                l.pid,
                l.fh as i64
            ])?;
        }
        Ok(())
    }

    fn delete_fh_locks(&mut self, ino: Ino, session: u64, owner: u64, fh: u64) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM locks WHERE ino=?1 AND session=?2 AND owner=?3 AND fh=?4")?
            .execute(params![ino as i64, session as i64, owner as i64, fh as i64])?;
        Ok(())
    }

    fn session_lock_count(&mut self, session: u64) -> Result<u64> {
        let n: i64 = self.conn.query_row(
            "SELECT count(*) FROM locks WHERE session=?1",
            params![session as i64],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    fn get_kv(&mut self, key: &str) -> Result<Option<String>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT value FROM kv WHERE key=?1")?;
        Ok(st.query_row(params![key], |r| r.get(0)).optional()?)
    }

    fn set_kv(&mut self, key: &str, value: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO kv(key,value) VALUES(?1,?2) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            )?
            .execute(params![key, value])?;
        Ok(())
    }

    fn usage(&mut self) -> Result<Usage> {
        let (inodes, bytes, dinodes, dbytes): (i64, i64, i64, i64) = self.conn.query_row(
            "SELECT count(*), coalesce(sum(CASE WHEN kind=8 THEN size ELSE 0 END),0),
                    coalesce(sum(dirty=1 AND nlink>0),0), coalesce(sum(CASE WHEN dirty=1 AND nlink>0 THEN size ELSE 0 END),0)
             FROM inodes",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        Ok(Usage {
            inodes: inodes as u64,
            bytes: bytes as u64,
            dirty_inodes: dinodes as u64,
            dirty_bytes: dbytes as u64,
        })
    }
}

#[cfg(test)]
mod tests;
