//! The metadata backup of a deskfs workspace, kept in its own bucket under
//! `.deskfs/meta/`, so that losing the machine loses nothing that reached the bucket.
//!
//! - [`writer::BackupWriter`] turns the engine's change marks
//!   ([`deskfs_meta::MetaTxn::backup_marks`]) into checksummed delta files, and writes a
//!   fresh snapshot (a new *generation*) when the deltas have grown past a share of the
//!   snapshot; generations older than the previous one are deleted.
//! - [`restore`] rebuilds a metadata database on a new machine from the newest generation
//!   and the bucket's objects (`deskfs attach --bucket`); [`rebuild`] does it from the
//!   objects and their s3fs-style metadata alone (`deskfs fsck --rebuild-from-bucket`).
//! - [`lease`] is the bucket's record of which database owns the workspace, so that two
//!   machines never write one workspace from two diverging databases.
//!
//! Layout in the bucket (keys relative to the workspace prefix):
//!
//! | key | holds |
//! |---|---|
//! | `.deskfs/meta/g{GEN:010}/snapshot.dbk` | the namespace at the generation's start |
//! | `.deskfs/meta/g{GEN:010}/d{TO_SEQ:016}.dbk` | changes up to mark `TO_SEQ` |
//! | `.deskfs/lease.json` | the owning database and its mount's heartbeat |

pub mod codec;
pub mod file;
pub mod layout;
pub mod lease;
pub mod model;
pub mod rebuild;
pub mod restore;
pub mod writer;

#[cfg(test)]
mod tests;

/// What can go wrong with a backup.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A backup file failed its checks (checksum, magic, record stream).
    #[error("backup file is damaged: {0}")]
    Corrupt(String),
    /// A newer deskfs wrote the file.
    #[error("backup file has format {0}, newer than this deskfs supports; upgrade deskfs")]
    TooNew(u32),
    /// The bucket holds no usable backup.
    #[error("{0}")]
    NoBackup(String),
    /// The workspace is owned by another live mount (see [`lease`]).
    #[error("{0}")]
    Leased(String),
    /// The metadata engine failed.
    #[error(transparent)]
    Meta(#[from] deskfs_meta::MetaError),
    /// The bucket failed.
    #[error(transparent)]
    Bucket(#[from] deskfs_bucket::BucketError),
    /// Local I/O (compression buffers, lock files).
    #[error("backup I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl BackupError {
    pub(crate) fn corrupt(s: impl Into<String>) -> BackupError {
        BackupError::Corrupt(s.into())
    }
}

impl deskfs_meta::TxnError for BackupError {
    fn into_meta(self) -> Result<deskfs_meta::MetaError, Self> {
        match self {
            BackupError::Meta(m) => Ok(m),
            other => Err(other),
        }
    }
}

/// Current time, ns since the Unix epoch (0 before 1970).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// This machine's host name (for file headers and the lease).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
