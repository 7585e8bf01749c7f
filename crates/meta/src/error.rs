//! Errors of the metadata engines.

/// What can go wrong in a metadata engine. The VFS maps these to errno: `NotFound` →
/// `ENOENT`, `Conflict` → `EEXIST`, everything else → `EIO`.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The row the operation needs does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A unique key (a dentry name) already exists.
    #[error("already exists: {0}")]
    Conflict(String),
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
    /// The database engine failed (I/O error, lock timeout, constraint).
    #[error("metadata database error: {0}")]
    Db(String),
    /// File-system error around the database file.
    #[error("metadata I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A bug: an invariant of the engine did not hold.
    #[error("metadata internal error: {0}")]
    Internal(String),
}

impl From<rusqlite::Error> for MetaError {
    fn from(e: rusqlite::Error) -> Self {
        MetaError::Db(e.to_string())
    }
}
