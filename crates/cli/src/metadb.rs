//! The metadata database of a workspace, named by a URL: `sqlite:///ABS/PATH.db` (the
//! embedded default, one host) or `postgres://[USER@]HOST[:PORT]/DB[?schema=NAME]` (a
//! workspace shared by several hosts). Also the workspace record kept in it: name,
//! id, bucket URL and bucket settings — never credentials.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use deskfs_meta::postgres::PgEngine;
use deskfs_meta::sqlite::SqliteEngine;
use deskfs_meta::{MetaEngine, MetaError};

/// A parsed metadata URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaUrl {
    /// SQLite database file.
    Sqlite(PathBuf),
    /// PostgreSQL connection URL (as given; the password, if any, is in it).
    Postgres(String),
}

impl MetaUrl {
    /// Parses `url`. Errors name the accepted forms.
    pub fn parse(url: &str) -> Result<MetaUrl> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let u = url::Url::parse(url).map_err(|e| {
                anyhow!(
                    "bad metadata URL {}: {e}; use postgres://USER@HOST:PORT/DATABASE",
                    redact(url)
                )
            })?;
            if u.host_str().is_none_or(|h| h.is_empty()) && std::env::var_os("PGHOST").is_none() {
                bail!("bad metadata URL {}: no host; use postgres://USER@HOST:PORT/DATABASE (or set PGHOST)", redact(url));
            }
            return Ok(MetaUrl::Postgres(url.to_string()));
        }
        let p = if let Some(rest) = url.strip_prefix("sqlite://") {
            rest
        } else if url.starts_with('/') {
            url
        } else {
            bail!("bad metadata URL {url:?}: use sqlite:///ABSOLUTE/PATH.db or postgres://USER@HOST:PORT/DATABASE");
        };
        if !p.starts_with('/') {
            bail!("bad metadata URL {url:?}: the SQLite path must be absolute (sqlite:///path/meta.db)");
        }
        Ok(MetaUrl::Sqlite(PathBuf::from(p)))
    }

    /// Whether several hosts can share this database.
    pub fn is_shared(&self) -> bool {
        matches!(self, MetaUrl::Postgres(_))
    }

    /// The URL to store in the local workspace config: without a password (credentials
    /// come from `PGPASSWORD` / `~/.pgpass` at mount time).
    pub fn stored(&self) -> String {
        match self {
            MetaUrl::Sqlite(p) => format!("sqlite://{}", p.display()),
            MetaUrl::Postgres(u) => strip_password(u),
        }
    }

    /// The URL for messages (no password).
    pub fn display(&self) -> String {
        match self {
            MetaUrl::Sqlite(p) => format!("sqlite://{}", p.display()),
            MetaUrl::Postgres(u) => redact(u),
        }
    }

    /// Whether the given URL carried a password (it is not stored).
    pub fn has_password(&self) -> bool {
        matches!(self, MetaUrl::Postgres(u) if url::Url::parse(u).is_ok_and(|x| x.password().is_some()))
    }

    /// The SQLite file, if this is one.
    pub fn sqlite_path(&self) -> Option<&PathBuf> {
        match self {
            MetaUrl::Sqlite(p) => Some(p),
            MetaUrl::Postgres(_) => None,
        }
    }

    /// Creates a new, empty workspace database (root owned by `uid:gid`).
    pub fn create(&self, uid: u32, gid: u32, now_ns: i64) -> Result<Arc<dyn MetaEngine>> {
        match self {
            MetaUrl::Sqlite(p) => Ok(Arc::new(
                SqliteEngine::create(p, uid, gid, now_ns)
                    .with_context(|| format!("cannot create metadata database {}", p.display()))?,
            )),
            MetaUrl::Postgres(u) => match PgEngine::create(u, uid, gid, now_ns) {
                Ok(e) => Ok(Arc::new(e)),
                Err(e) => Err(self.explain(e)),
            },
        }
    }

    /// Opens the workspace database.
    pub fn open(&self) -> Result<Arc<dyn MetaEngine>> {
        self.open_raw().map_err(|e| self.explain(e))
    }

    /// Opens the workspace database for a mount daemon: SQLite gets commit windows
    /// (`DESKFS_COMMIT_WINDOW_MS`, default 20; 0 turns them off), which it uses while the
    /// mount is alone on the workspace.
    pub fn open_for_mount(&self) -> Result<Arc<dyn MetaEngine>> {
        let MetaUrl::Sqlite(p) = self else {
            return self.open();
        };
        let span_ms = match std::env::var("DESKFS_COMMIT_WINDOW_MS") {
            Err(_) => 20,
            Ok(v) => v.trim().parse::<u64>().map_err(|_| {
                anyhow!("DESKFS_COMMIT_WINDOW_MS={v:?} is not a number of milliseconds; set it to e.g. 20, or 0 to commit every request")
            })?,
        };
        let engine = SqliteEngine::open(p).map_err(|e| self.explain(e))?;
        if span_ms > 0 {
            let config = deskfs_meta::sqlite::WindowConfig {
                span: std::time::Duration::from_millis(span_ms),
                ..Default::default()
            };
            if !engine
                .enable_commit_window(config)
                .map_err(|e| self.explain(e))?
            {
                tracing::info!(
                    "another process owns the metadata redo log; committing every request"
                );
            }
        }
        Ok(Arc::new(engine))
    }

    /// Opens the workspace database, with the engine's own error.
    pub fn open_raw(&self) -> std::result::Result<Arc<dyn MetaEngine>, MetaError> {
        Ok(match self {
            MetaUrl::Sqlite(p) => Arc::new(SqliteEngine::open(p)?),
            MetaUrl::Postgres(u) => Arc::new(PgEngine::open(u)?),
        })
    }

    /// Drops the workspace in this database (`format --force`). Returns whether there
    /// was one.
    pub fn destroy(&self) -> Result<bool> {
        match self {
            MetaUrl::Sqlite(p) => {
                let existed = p.exists();
                for suffix in ["", "-wal", "-shm", "-redo", "-join"] {
                    let f = PathBuf::from(format!("{}{suffix}", p.display()));
                    match std::fs::remove_file(&f) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(anyhow!("cannot remove {}: {e}", f.display())),
                    }
                }
                Ok(existed)
            }
            MetaUrl::Postgres(u) => PgEngine::destroy(u).map_err(|e| self.explain(e)),
        }
    }

    /// One clear line for an engine error about this database.
    pub fn explain(&self, e: MetaError) -> anyhow::Error {
        let d = self.display();
        match e {
            MetaError::Unreachable(m) => {
                let fix = if m.contains("password") {
                    "; set the password in PGPASSWORD or ~/.pgpass (deskfs never stores it)"
                } else if m.contains("refused") || m.contains("timed out") || m.contains("resolve") {
                    "; check the host and port, and that PostgreSQL runs there and accepts connections from this host"
                } else {
                    ""
                };
                anyhow!("cannot use the metadata database {d}: {m}{fix}")
            }
            MetaError::NotFound(_) => match self {
                MetaUrl::Sqlite(_) => anyhow!("metadata database {d} is missing; restore it, or create the workspace with `deskfs format`"),
                MetaUrl::Postgres(_) => anyhow!("no deskfs workspace in {d}; create one there with `deskfs format NAME --meta URL --bucket URL`"),
            },
            MetaError::Conflict(_) => anyhow!("{d} already holds a deskfs workspace; attach to it with `deskfs attach NAME --meta URL`, or use --force to replace it"),
            other => anyhow!(other),
        }
    }
}

/// `url` with its password replaced by `***`.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "(unparsable URL)".into(),
    }
}

/// `url` without its password.
fn strip_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => url.to_string(),
    }
}

/// The workspace identity kept in its metadata database (kv `workspace.*`), so that a
/// host attaching to the database learns the bucket, and a database or bucket of
/// another workspace is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Workspace name.
    pub name: String,
    /// Random id, also in the bucket's format record.
    pub id: String,
    /// Bucket URL.
    pub bucket: String,
    /// S3 endpoint given at format time.
    pub endpoint: Option<String>,
    /// S3 region given at format time.
    pub region: Option<String>,
}

impl Record {
    /// Writes the record.
    pub fn write(&self, meta: &dyn MetaEngine) -> Result<()> {
        deskfs_meta::txn(meta, |t| {
            t.set_kv("workspace.name", &self.name)?;
            t.set_kv("workspace.id", &self.id)?;
            t.set_kv("workspace.bucket", &self.bucket)?;
            t.set_kv("workspace.endpoint", self.endpoint.as_deref().unwrap_or(""))?;
            t.set_kv("workspace.region", self.region.as_deref().unwrap_or(""))
        })?;
        Ok(())
    }

    /// Reads the record (`None` in databases made before records existed).
    pub fn read(meta: &dyn MetaEngine) -> Result<Option<Record>> {
        let r = deskfs_meta::read(meta, |t| {
            let Some(name) = t.get_kv("workspace.name")? else {
                return Ok::<_, MetaError>(None);
            };
            let opt = |v: Option<String>| v.filter(|s| !s.is_empty());
            Ok(Some(Record {
                name,
                id: t.get_kv("workspace.id")?.unwrap_or_default(),
                bucket: t.get_kv("workspace.bucket")?.unwrap_or_default(),
                endpoint: opt(t.get_kv("workspace.endpoint")?),
                region: opt(t.get_kv("workspace.region")?),
            }))
        })?;
        Ok(r)
    }
}

/// A fresh random id (hex, 128 bits).
pub fn new_id() -> String {
    deskfs_backup::lease::random_id()
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            MetaUrl::parse("sqlite:///a/b.db").unwrap(),
            MetaUrl::Sqlite("/a/b.db".into())
        );
        assert_eq!(
            MetaUrl::parse("/a/b.db").unwrap(),
            MetaUrl::Sqlite("/a/b.db".into())
        );
        assert!(MetaUrl::parse("sqlite://rel.db").is_err());
        assert!(MetaUrl::parse("mysql://x/y").is_err());
        let p = MetaUrl::parse("postgres://u:secret@db.example:5433/ws?schema=a").unwrap();
        assert!(p.is_shared() && p.has_password());
        assert!(!p.display().contains("secret"), "{}", p.display());
        assert!(!p.stored().contains("secret"), "{}", p.stored());
        assert!(p.stored().contains("schema=a"));
        let q = MetaUrl::parse("postgresql://u@h/db").unwrap();
        assert!(!q.has_password());
    }
}
