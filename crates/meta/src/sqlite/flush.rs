//! Device flushes of the files whose durability the SQLite engine decides itself: the
//! write-ahead log `<db>-wal` (every committed transaction is in it: `synchronous=NORMAL`
//! writes it without a flush; a checkpoint flushes it before copying it into the database)
//! and the redo log of a commit window (design records 0005, 0009 and
//! `docs/design/0011-fsync-through-the-redo-log.md`).
//!
//! [`WalMark`] says which commits a WAL flush covered: this connection's commits are
//! counted by a commit hook, other connections' by `PRAGMA data_version` (SQLite: "changes
//! committed by any other connection"); a flush covers the mark taken before it began.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use crate::Result;

/// `fdatasync(2)` of `file` (found at `path`). Under test, what it made durable is
/// recorded for the power-loss tests ([`durable_image`]).
pub(super) fn sync_data(file: &File, path: &Path) -> std::io::Result<()> {
    file.sync_data()?;
    #[cfg(test)]
    images::record(path);
    #[cfg(not(test))]
    let _ = path;
    Ok(())
}

/// `<db>-wal`, open for `fdatasync` through a cached descriptor (reopened when SQLite
/// replaced the file).
pub(super) struct Wal {
    path: PathBuf,
    file: Mutex<Option<Arc<File>>>,
    /// A flush failed: the kernel may have dropped the dirty pages and report the next
    /// flush of the same file successful without writing them ("fsyncgate"). Every later
    /// flush fails until the database is opened again.
    failed: AtomicBool,
}

impl Wal {
    /// The WAL of the database at `db`.
    pub(super) fn new(db: &Path) -> Wal {
        let mut p = db.to_path_buf().into_os_string();
        p.push("-wal");
        Wal {
            path: PathBuf::from(p),
            file: Mutex::new(None),
            failed: AtomicBool::new(false),
        }
    }

    /// Flushes the WAL to the device; the connection is not needed (other requests go on
    /// meanwhile). `Ok(false)`: there is no WAL file to flush. Errors: the flush's
    /// (`EIO`): the caller must not report the commits durable.
    pub(super) fn sync(&self) -> std::io::Result<bool> {
        let res = self.sync_once();
        if res.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        res
    }

    fn sync_once(&self) -> std::io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        if self.failed.load(Ordering::SeqCst) {
            return Err(failed_before("metadata WAL"));
        }
        let current = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let file = {
            let mut guard = self
                .file
                .lock()
                .map_err(|_| std::io::Error::other("wal mutex poisoned"))?;
            let same = guard
                .as_ref()
                .and_then(|f| f.metadata().ok())
                .is_some_and(|m| m.ino() == current.ino() && m.dev() == current.dev());
            if !same {
                *guard = Some(Arc::new(
                    std::fs::OpenOptions::new().read(true).open(&self.path)?,
                ));
            }
            guard
                .clone()
                .ok_or_else(|| std::io::Error::other("wal not open"))?
        };
        sync_data(&file, &self.path)?;
        Ok(true)
    }
}

/// The error of a flush refused because an earlier one of the same file failed.
fn failed_before(what: &str) -> std::io::Error {
    std::io::Error::other(format!(
        "an earlier flush of the {what} failed (EIO): nothing since is reported durable; remount after fixing the disk"
    ))
}

/// Flushes of one redo log, one at a time: a failed flush makes every later one fail
/// (until the log is emptied), so a flush racing a failed one cannot report success for
/// pages the failure dropped. A flush asked for records an earlier successful flush
/// already covered returns at once (SQLite's `fsync` of a directory right after the
/// `fsync` of the file it created appends nothing in between).
#[derive(Default)]
pub(super) struct LogFlush {
    serial: Mutex<()>,
    failed: AtomicBool,
    /// What the last successful flush covered: the log's length when it was handed out,
    /// in the log's current epoch.
    covered: Mutex<LogMark>,
    /// Flushes answered without a device flush (covered already).
    skipped: AtomicU64,
}

/// A point in a redo log: its length, in an epoch (incremented each time the log is
/// emptied, which happens only once the database holds its records durably).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct LogMark {
    pub(super) epoch: u64,
    pub(super) len: u64,
}

impl LogFlush {
    /// Whether a flush failed since the log was last emptied.
    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// The log was emptied after its records were made durable in the WAL: a new epoch.
    pub(super) fn reset(&self) {
        let mut c = self.covered.lock().unwrap_or_else(|p| p.into_inner());
        *c = LogMark {
            epoch: c.epoch + 1,
            len: 0,
        };
        self.failed.store(false, Ordering::SeqCst);
    }

    /// The current epoch, for a mark of `len` bytes.
    pub(super) fn mark(&self, len: u64) -> LogMark {
        let c = self.covered.lock().unwrap_or_else(|p| p.into_inner());
        LogMark {
            epoch: c.epoch,
            len,
        }
    }

    /// Flushes answered so far without a device flush: an earlier one covered them.
    pub(super) fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Whether a successful flush, or the log's emptying since, covered `upto`.
    fn is_covered(&self, upto: LogMark) -> bool {
        let c = self.covered.lock().unwrap_or_else(|p| p.into_inner());
        // Another epoch: the log was emptied since, after the database held its records
        // durably (`RedoLog::clear`).
        c.epoch != upto.epoch || c.len >= upto.len
    }

    /// `fdatasync` of the log `file` at `path`, unless a successful flush already covered
    /// `upto`. Errors: the flush's, or an earlier failure's.
    pub(super) fn sync(&self, file: &File, path: &Path, upto: LogMark) -> std::io::Result<()> {
        let _one = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        if self.failed() {
            return Err(failed_before("metadata redo log"));
        }
        if self.is_covered(upto) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        sync_data(file, path).inspect_err(|_| self.failed.store(true, Ordering::SeqCst))?;
        let mut c = self.covered.lock().unwrap_or_else(|p| p.into_inner());
        if c.epoch == upto.epoch && c.len < upto.len {
            c.len = upto.len;
        }
        Ok(())
    }
}

/// Which commits the WAL holds at one moment: this connection's commit count and the
/// database's `data_version` as this connection sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WalMark {
    commits: u64,
    data_version: i64,
}

/// Counts this connection's commits (a commit hook) and remembers the mark the last
/// successful WAL flush covered.
pub(super) struct Synced {
    commits: Arc<AtomicU64>,
    /// `None` until a flush by this process: a database opened after a `kill -9` may hold
    /// commits nobody flushed.
    last: Option<WalMark>,
}

impl Synced {
    /// Installs the commit hook on `db`.
    pub(super) fn attach(db: &Connection) -> Synced {
        let commits = Arc::new(AtomicU64::new(0));
        let hook = commits.clone();
        db.commit_hook(Some(move || {
            hook.fetch_add(1, Ordering::Relaxed);
            false
        }));
        Synced {
            commits,
            last: None,
        }
    }

    /// The mark of what the WAL holds now. Errors: the `PRAGMA`'s.
    pub(super) fn mark(&self, db: &Connection) -> Result<WalMark> {
        let data_version: i64 = db
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?;
        Ok(WalMark {
            commits: self.commits.load(Ordering::Relaxed),
            data_version,
        })
    }

    /// Records that a flush which began at `mark` succeeded.
    pub(super) fn flushed(&mut self, mark: WalMark) {
        if self.last.is_none_or(|l| l.commits <= mark.commits) {
            self.last = Some(mark);
        }
    }

    /// Whether every commit in the WAL (this connection's and others') is durable.
    pub(super) fn all_durable(&self, db: &Connection) -> Result<bool> {
        Ok(self.last == Some(self.mark(db)?))
    }
}

/// What the last `fdatasync` of a file made durable (test builds only): the harness of
/// the power-loss tests builds the files a power cut would leave from these images.
#[cfg(test)]
pub(super) fn durable_image(path: &Path) -> Option<Vec<u8>> {
    images::get(path)
}

#[cfg(test)]
mod images {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static SYNCED: Mutex<Option<HashMap<PathBuf, Vec<u8>>>> = Mutex::new(None);

    pub(super) fn record(path: &Path) {
        let content = std::fs::read(path).unwrap_or_default();
        let mut g = SYNCED.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert_with(HashMap::new)
            .insert(path.to_path_buf(), content);
    }

    pub(super) fn get(path: &Path) -> Option<Vec<u8>> {
        let g = SYNCED.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().and_then(|m| m.get(path).cloned())
    }
}
