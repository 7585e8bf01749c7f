//! What a dirty file's staging file becomes after a crash: the one rule that mount-time
//! recovery ([`crate::Vfs`]'s `recover`) and `deskfs fsck --repair` both apply.
//!
//! A dirty inode held by this cache dir has its truth in its staging file. After the
//! mount that wrote it died (`kill -9`, power loss), the staging file may hold writes the
//! last commit does not describe (the daemon died before the close committed them), or
//! may be gone altogether (a power loss kept the commit of a file never fsynced but not
//! its staging file's name, or a crash came between a create's commit and its staging
//! file). Either way the file is committed as a new content version of what the staging
//! file holds — empty when it is gone, as ext4 leaves a file whose unsynced data a power
//! loss took — and marked for upload, so the row never describes content that exists
//! nowhere (every read and upload of it would fail).

use std::time::UNIX_EPOCH;

use deskfs_cache::Cache;
use deskfs_meta::{InodeRow, Local, MetaEngine, MetaError, Op};

use crate::{now_ns, Result};

/// How [`adopt_staging`] left a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Adopted {
    /// Its staging file was there: committed at its size (bytes).
    Kept(u64),
    /// Its staging file was gone: committed empty (it had `lost` bytes, maybe 0).
    Emptied {
        /// The size the row claimed, bytes.
        lost: u64,
    },
}

/// Commits `row` (a dirty regular file held by cache `here`) as what its staging file in
/// `cache` holds, creating an empty one when it is missing, and marks it for upload.
/// mtime and ctime move to the staging file's mtime when the size changed (never
/// backwards). A commit refused because another mount changed the row first is not an
/// error (its change is newer). Errors: the cache's (`EIO`, `ENOSPC`) and the engine's.
pub(crate) fn adopt_staging(
    meta: &dyn MetaEngine,
    cache: &Cache,
    here: Local,
    row: &InodeRow,
) -> Result<Adopted> {
    let (md, adopted) = match std::fs::metadata(cache.staging_path(row.ino)) {
        Ok(md) => {
            let n = md.len();
            (md, Adopted::Kept(n))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
            cache.open_staging(row.ino, true)?.metadata()?,
            Adopted::Emptied { lost: row.size },
        ),
        Err(e) => return Err(e.into()),
    };
    let mtime = md
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(row.mtime_ns);
    let (mtime, ctime) = if row.size != md.len() {
        (row.mtime_ns.max(mtime), row.ctime_ns.max(mtime))
    } else {
        (row.mtime_ns, row.ctime_ns)
    };
    let res = meta.apply(&[
        Op::CommitContent {
            ino: row.ino,
            size: md.len(),
            mtime_ns: mtime,
            ctime_ns: ctime,
            local: here,
        },
        Op::MarkInode {
            ino: row.ino,
            not_before_ns: now_ns(),
        },
    ]);
    match res {
        Ok(_) | Err(MetaError::Precondition { .. }) => Ok(adopted),
        Err(e) => Err(e.into()),
    }
}
