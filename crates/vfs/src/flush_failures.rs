//! Files whose data flush failed: every later `fsync` of them fails too.
//!
//! When `fdatasync(2)` of a staging file fails, Linux has already marked the pages it
//! could not write clean (or, on some file systems, dropped them): a second `fdatasync`
//! reports success without writing them ("fsyncgate"; PostgreSQL, 2018). A file system
//! that retried the flush would acknowledge data that is gone. So the failure is
//! recorded per inode, here: the `fsync` that hit it fails with `EIO`, and so does every
//! later `fsync`/`fdatasync` of that inode, through any descriptor, for as long as the
//! mount lives, unless the content the failure concerned stops mattering — the file is
//! truncated to zero bytes or removed. The inode stays dirty (its upload goes on from
//! what the staging file holds), and `deskfs status` lists it.

use std::collections::HashMap;
use std::sync::Mutex;

use deskfs_meta::Ino;

use crate::{now_ns, VfsError};

/// One inode's failed flush.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FlushFailure {
    /// The inode.
    pub ino: Ino,
    /// One of its paths in the workspace (lossy UTF-8; empty when it has none).
    pub path: String,
    /// The first failure's error, as the OS reported it.
    pub error: String,
    /// When it was first seen (ns since the epoch).
    pub since_ns: i64,
    /// `fsync`s refused since, the first included.
    pub refused: u64,
}

/// The failed flushes of one mount.
#[derive(Default)]
pub(crate) struct FlushFailures(Mutex<HashMap<Ino, FlushFailure>>);

impl FlushFailures {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, FlushFailure>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A flush of `ino`'s staging file failed with `e`: recorded (the first error stays),
    /// and returned for the caller to report (its errno kept: `EIO`, `ENOSPC`).
    pub(crate) fn record(&self, ino: Ino, e: std::io::Error) -> VfsError {
        let mut m = self.map();
        let f = m.entry(ino).or_insert_with(|| FlushFailure {
            ino,
            path: String::new(),
            error: e.to_string(),
            since_ns: now_ns(),
            refused: 0,
        });
        f.refused += 1;
        tracing::error!(ino, error = %e, "fdatasync of a staging file failed: this fsync and every later one of the file fail with EIO (the kernel may have dropped the data)");
        VfsError::Io(e)
    }

    /// Before an `fsync` of `ino`: `EIO` when an earlier flush of it failed.
    pub(crate) fn check(&self, ino: Ino) -> crate::Result<()> {
        let mut m = self.map();
        match m.get_mut(&ino) {
            None => Ok(()),
            Some(f) => {
                f.refused += 1;
                Err(VfsError::Io(std::io::Error::other(format!(
                    "an earlier fdatasync of this file failed ({}); its data may be lost, so no fsync of it succeeds until it is truncated to zero or removed",
                    f.error
                ))))
            }
        }
    }

    /// The content the failure concerned no longer matters (`ino` was truncated to zero
    /// bytes, or removed).
    pub(crate) fn clear(&self, ino: Ino) {
        self.map().remove(&ino);
    }

    /// Every failure recorded, oldest first.
    pub(crate) fn list(&self) -> Vec<FlushFailure> {
        let mut v: Vec<FlushFailure> = self.map().values().cloned().collect();
        v.sort_by_key(|f| (f.since_ns, f.ino));
        v
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_failed_flush_refuses_every_later_fsync_until_the_content_goes() {
        let f = FlushFailures::default();
        assert!(f.check(7).is_ok());
        let e = f.record(7, std::io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(e.errno(), libc::EIO);
        for _ in 0..3 {
            assert_eq!(f.check(7).map_err(|e| e.errno()), Err(libc::EIO));
        }
        assert!(f.check(8).is_ok(), "other inodes are not concerned");
        let l = f.list();
        assert_eq!((l.len(), l[0].ino, l[0].refused), (1, 7, 4));
        f.clear(7);
        assert!(f.check(7).is_ok());
    }
}
