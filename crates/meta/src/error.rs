//! Errors of the metadata engines.

/// What can go wrong in a metadata engine. The VFS maps these to errno: `NotFound` →
/// `ENOENT`, `Conflict` → `EEXIST`, `Fenced` → `EIO` (after re-registering), everything
/// else → `EIO`.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The row the operation needs does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A unique key (a dentry name) already exists.
    #[error("already exists: {0}")]
    Conflict(String),
    /// A step of an operation batch ([`crate::MetaEngine::apply`]) found the database not
    /// as the batch expected; nothing of the batch was applied. `step` is the index of the
    /// failing [`crate::Op`]. The caller re-reads and decides again (the POSIX rules live
    /// above the engines).
    #[error("precondition of step {step} failed: {what}")]
    Precondition {
        /// Index of the failing op in the batch.
        step: usize,
        /// What did not hold.
        what: crate::Expect,
    },
    /// This mount's session lease was taken away (expired and cleaned up by another
    /// mount): it must not act on what it held. Nothing of the operation was applied.
    #[error("mount session {0} was fenced (its lease expired); re-registering")]
    Fenced(u64),
    /// The database is not a deskfs metadata database, or it is damaged.
    #[error("metadata database {path} is corrupt or not a deskfs database ({detail}); run `deskfs fsck` or restore the backup")]
    Corrupt {
        /// Database location.
        path: String,
        /// What the engine reported.
        detail: String,
    },
    /// The database was written by a newer deskfs.
    #[error("metadata database {path} has schema version {found}, this deskfs supports up to {supported}; upgrade deskfs")]
    TooNew {
        /// Database location.
        path: String,
        /// Version found in the file.
        found: i64,
        /// Highest version this build understands.
        supported: i64,
    },
    /// The database engine failed. `code` is the engine's own error code, kept as it
    /// came: the SQLSTATE for PostgreSQL (`40001`, `23505`, …), the extended result
    /// code name for SQLite (`SQLITE_BUSY`, …).
    #[error("metadata database error{}: {message}", code.as_deref().map(|c| format!(" [{c}]")).unwrap_or_default())]
    Db {
        /// Engine error code (SQLSTATE or SQLite code), when there is one.
        code: Option<String>,
        /// The engine's message.
        message: String,
    },
    /// The database could not be reached (connection refused, timed out, lost).
    #[error("metadata database unreachable: {0}")]
    Unreachable(String),
    /// File-system error around the database file.
    #[error("metadata I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A transaction closure returned the caller's own error (see [`crate::txn`]); the
    /// transaction was rolled back. Never seen by callers of the typed helpers.
    #[error("transaction aborted by its caller")]
    Aborted,
    /// The engine does not offer this operation (e.g. the bucket backup's change marks
    /// on PostgreSQL, whose database is itself the namespace's durable home).
    #[error("not supported by the {engine} metadata engine: {what}")]
    Unsupported {
        /// Engine name (`sqlite`, `postgres`).
        engine: &'static str,
        /// The operation.
        what: &'static str,
    },
    /// A bug: an invariant of the engine did not hold.
    #[error("metadata internal error: {0}")]
    Internal(String),
}

impl MetaError {
    /// Whether the whole transaction may simply be run again: a serialization failure
    /// (SQLSTATE `40001`), a deadlock (`40P01`), or a busy/locked SQLite database. The
    /// engines retry these themselves, with backoff, before giving up.
    pub fn is_retryable(&self) -> bool {
        match self {
            MetaError::Db { code: Some(c), .. } => matches!(
                c.as_str(),
                "40001" | "40P01" | "SQLITE_BUSY" | "SQLITE_LOCKED" | "SQLITE_BUSY_SNAPSHOT"
            ),
            _ => false,
        }
    }

    /// Whether the database's storage is full: SQLite's `SQLITE_FULL`, PostgreSQL's
    /// `53100` (disk_full), or `ENOSPC` from a file around the database (its redo log).
    /// The VFS answers these with `ENOSPC`, as ext4 does on a full disk.
    pub fn is_disk_full(&self) -> bool {
        match self {
            MetaError::Db { code: Some(c), .. } => c.starts_with("SQLITE_FULL") || c == "53100",
            MetaError::Io(e) => e.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }

    /// A database error with an engine code.
    pub fn db(code: impl Into<String>, message: impl Into<String>) -> MetaError {
        MetaError::Db {
            code: Some(code.into()),
            message: message.into(),
        }
    }
}

impl From<rusqlite::Error> for MetaError {
    fn from(e: rusqlite::Error) -> Self {
        let code = match &e {
            rusqlite::Error::SqliteFailure(f, _) => Some(sqlite_code_name(f)),
            _ => None,
        };
        MetaError::Db {
            code,
            message: e.to_string(),
        }
    }
}

/// The name of a SQLite result code (`SQLITE_BUSY`, `SQLITE_CONSTRAINT_UNIQUE`, …).
fn sqlite_code_name(f: &rusqlite::ffi::Error) -> String {
    use rusqlite::ErrorCode as C;
    let base = match f.code {
        C::DatabaseBusy => "SQLITE_BUSY",
        C::DatabaseLocked => "SQLITE_LOCKED",
        C::ConstraintViolation => "SQLITE_CONSTRAINT",
        C::SystemIoFailure => "SQLITE_IOERR",
        C::DatabaseCorrupt => "SQLITE_CORRUPT",
        C::DiskFull => "SQLITE_FULL",
        C::CannotOpen => "SQLITE_CANTOPEN",
        C::ReadOnly => "SQLITE_READONLY",
        C::NotADatabase => "SQLITE_NOTADB",
        _ => return format!("SQLITE_{}", f.extended_code),
    };
    if f.extended_code == rusqlite::ffi::SQLITE_BUSY_SNAPSHOT {
        return "SQLITE_BUSY_SNAPSHOT".into();
    }
    base.into()
}

/// An error type that can travel through a transaction closure (see [`crate::txn`]):
/// engine errors stay engine errors (so the engine can retry serialization failures),
/// the caller's own errors (a POSIX errno) come back to the caller as themselves.
pub trait TxnError: From<MetaError> {
    /// `Ok` when this is an engine error (returned to the engine), `Err(self)` otherwise.
    fn into_meta(self) -> Result<MetaError, Self>;
}

impl TxnError for MetaError {
    fn into_meta(self) -> Result<MetaError, Self> {
        Ok(self)
    }
}
