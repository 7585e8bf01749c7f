//! When `close` and `fsync` are acknowledged: the mount's durability choice.
//!
//! - [`Durability::Local`] (the default): `close` returns once the new content version is
//!   committed to the metadata engine (it survives `kill -9` of the daemon), `fsync` once
//!   the staging file is fdatasync'ed and the commit is durable (it survives a reboot).
//!   The upload follows in the background.
//! - [`Durability::Bucket`]: for machines that may vanish with their disk. `close` of a
//!   descriptor opened for writing, and `fsync`/`fdatasync`, also wait until that content
//!   version (or a later one) is in the bucket and recorded so in the metadata (the inode
//!   marked clean at that version or later; or, when a later version was committed
//!   meanwhile, an object row naming this one); `fsync` of a directory
//!   waits until the namespace changes under it that were pending when it was called
//!   (creates, renames, deletes, including their content) are in the bucket.
//!
//! The wait reuses the close-to-open request of [`crate::remote`]: the closing mount asks
//! its own uploader for the inode (an upload request naming its own cache), which then
//! uploads it at once, past the coalescing delay and the burst deferral, and wakes the
//! waiter when the object is recorded. The wait is bounded by
//! [`VfsConfig::bucket_wait`](crate::VfsConfig): past it the call fails with `EIO` (as
//! ext4's `fsync` does when the device cannot take the data) and logs what it waited for.
//! Nothing is lost then: the content stays committed in the local journal, exactly as
//! under `Local`, and the uploader keeps retrying with backoff.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use deskfs_meta::{Ino, Kind, ROOT_INO};

use crate::{now_ns, Result, Vfs, VfsError};

/// Puts what objects cannot carry (the metadata backup) into the bucket; returns once it
/// is there. Errors are reported to the caller as `EIO`.
pub type NamespaceBarrier = Box<dyn Fn() -> std::result::Result<(), String> + Send + Sync>;

/// Where `close`/`fsync` data must be before they return (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// On the local disk (metadata commit; `fsync`: fdatasync + durable commit).
    #[default]
    Local,
    /// In the bucket (uploaded and recorded as clean), waited for a bounded time.
    Bucket,
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Local => "local",
            Durability::Bucket => "bucket",
        })
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    /// `local` or `bucket`; anything else is refused with a message naming both.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "local" => Ok(Durability::Local),
            "bucket" => Ok(Durability::Bucket),
            other => Err(format!(
                "unknown durability {other:?}: use `local` (close/fsync return once the data is on the local disk) or `bucket` (once it is in the bucket)"
            )),
        }
    }
}

/// How often a waiting close repeats its upload request (the uploader may have answered
/// an older one meanwhile).
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// How often a waiter re-reads the metadata when no wake-up arrives.
const RECHECK: Duration = Duration::from_millis(25);

/// Pending rows of a directory looked at per check.
const DIR_ROWS: usize = 256;

/// What a waiter found about a content version.
enum Found {
    /// In the bucket, superseded by another mount's commit, or nothing left to keep.
    Done,
    /// Still only in the local journal.
    Waiting,
}

impl Vfs {
    /// The mount's durability choice.
    pub fn durability(&self) -> Durability {
        self.cfg.durability
    }

    /// Sets the namespace barrier: under [`Durability::Bucket`], `fsync` and `fsyncdir`
    /// return only after it did (the mount's metadata backup, so that what they made
    /// durable survives the loss of the machine with its modes, links and xattrs too).
    /// Set once; later calls are ignored.
    pub fn set_namespace_barrier(&self, f: NamespaceBarrier) {
        let _ = self.namespace_barrier.set(f);
    }

    /// Under [`Durability::Bucket`], runs the namespace barrier (if one is set). Errors:
    /// `EIO` naming what failed (the data stays committed and uploaded; the backup is
    /// written at the next flush).
    pub(crate) fn namespace_durable(&self) -> Result<()> {
        if self.cfg.durability != Durability::Bucket {
            return Ok(());
        }
        let Some(f) = self.namespace_barrier.get() else {
            return Ok(());
        };
        f().map_err(|why| {
            tracing::error!(why = %why, "durability bucket: the metadata backup could not be written; fsync fails with EIO");
            VfsError::Io(std::io::Error::other(format!(
                "metadata backup not written: {why}"
            )))
        })
    }

    /// Under [`Durability::Bucket`], waits until content version `version` of `ino` (0:
    /// the current one) or a later one is in the bucket; returns at once under `Local`.
    /// Errors: `EIO` ([`VfsError::Io`], `TimedOut`) after
    /// [`VfsConfig::bucket_wait`](crate::VfsConfig); the content stays in the journal.
    pub(crate) fn await_durable(&self, ino: Ino, version: u64) -> Result<()> {
        if self.cfg.durability != Durability::Bucket {
            return Ok(());
        }
        let start = Instant::now();
        let mut target = version;
        let mut asked: Option<Instant> = None;
        let here = self.cache.id();
        let res = loop {
            if let Found::Done = self.content_state(ino, &mut target)? {
                break Ok(());
            }
            if asked.is_none_or(|t| t.elapsed() >= ASK_AGAIN) {
                if asked.is_none() {
                    self.remote.begin(ino, target, here, start);
                }
                asked = Some(Instant::now());
                deskfs_meta::txn(&*self.meta, |t| t.want_upload(ino, here, now_ns()))?;
                self.uploader
                    .wanted_hint
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.uploader.kick();
            }
            if start.elapsed() >= self.cfg.bucket_wait {
                let why = self.failure_of(ino);
                tracing::error!(
                    ino,
                    version = target,
                    waited_s = start.elapsed().as_secs_f64(),
                    why = %why,
                    "durability bucket: this content did not reach the bucket in time; close/fsync fails with EIO (nothing is lost: it stays in the local journal and the uploader keeps retrying)"
                );
                break Err(VfsError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "content of inode {ino} (version {target}) did not reach the bucket within {} s ({why}); it is kept in the local journal and uploaded when the bucket answers",
                        self.cfg.bucket_wait.as_secs()
                    ),
                )));
            }
            self.remote.sleep(RECHECK);
        };
        if asked.is_some() {
            self.remote.end(ino, target);
        }
        res
    }

    /// Whether the content version `*target` of `ino` needs no more waiting (sets
    /// `*target` to the current version when 0).
    fn content_state(&self, ino: Ino, target: &mut u64) -> Result<Found> {
        let here = self.here();
        deskfs_meta::read(&*self.meta, |t| {
            let Some(r) = t.get_inode(ino)? else {
                return Ok::<_, VfsError>(Found::Done); // purged: nothing to keep
            };
            if *target == 0 {
                *target = r.data_version;
            }
            let done = r.kind != Kind::File
                // No name left: no object to hold it (as ext4, nothing to find after a crash).
                || r.nlink == 0
                // A later version that another mount committed replaced these bytes.
                || (r.data_version > *target && r.local != here)
                || (!r.dirty && r.data_version >= *target)
                // Uploaded, and a later version (not clean yet) committed since.
                || (r.data_version > *target
                    && t.object_with_content(ino, *target)?.is_some());
            Ok(if done { Found::Done } else { Found::Waiting })
        })
    }

    /// The last upload error of a path of `ino`, for messages.
    fn failure_of(&self, ino: Ino) -> String {
        let found = deskfs_meta::read(&*self.meta, |t| {
            let paths = t.paths_of(ino)?;
            let failed = t.failed_pending(64)?;
            Ok::<_, VfsError>(
                failed
                    .into_iter()
                    .find(|f| paths.contains(&f.path))
                    .map(|f| describe_failure(f.attempts, f.last_error.as_deref())),
            )
        });
        match found {
            Ok(Some(s)) => s,
            Ok(None) => "upload in progress".into(),
            Err(e) => format!("cannot read its upload state: {e}"),
        }
    }

    /// Under [`Durability::Bucket`], `fsync` of directory `dir`: waits until every path at
    /// or under it that was pending when called is reconciled with the bucket — but for
    /// paths whose content only another mount's cache holds (that mount uploads them) and
    /// files with writes not yet committed here (their own close/fsync covers them).
    /// Returns at once under `Local`. Errors: `EIO` after the bound, naming a path.
    pub(crate) fn await_dir_durable(&self, dir: Ino) -> Result<()> {
        if self.cfg.durability != Durability::Bucket {
            return Ok(());
        }
        let path = if dir == ROOT_INO {
            Vec::new()
        } else {
            match deskfs_meta::read(&*self.meta, |t| crate::paths::dir_path(t, dir))? {
                Some(p) => p,
                None => return Ok(()), // removed meanwhile: nothing under it to keep
            }
        };
        let barrier = deskfs_meta::read(&*self.meta, |t| Ok::<_, VfsError>(t.pending_last_seq()?))?;
        // The sync barrier's lever: every pending row is due now, past coalescing.
        self.urgent
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.uploader.kick();
        let start = Instant::now();
        let mut skip: HashMap<Vec<u8>, bool> = HashMap::new();
        let res = loop {
            let rows =
                deskfs_meta::read(&*self.meta, |t| t.pending_under(&path, barrier, DIR_ROWS));
            let rows = match rows {
                Ok(r) => r,
                Err(e) => break Err(e.into()),
            };
            let mut left = Vec::new();
            for r in rows {
                // NUL-led paths name no file (orphans' uploads).
                if r.path.first() == Some(&0) || self.uploader.is_elsewhere(&r) {
                    continue;
                }
                let skipped = match skip.get(&r.path) {
                    Some(s) => *s,
                    None => {
                        let s = self.being_written(&r.path);
                        skip.insert(r.path.clone(), s);
                        s
                    }
                };
                if !skipped {
                    left.push(r);
                }
            }
            let Some(first) = left.first() else {
                break Ok(());
            };
            if start.elapsed() >= self.cfg.bucket_wait {
                let p = String::from_utf8_lossy(&first.path).into_owned();
                let why = describe_failure(first.attempts, first.last_error.as_deref());
                tracing::error!(
                    dir = %String::from_utf8_lossy(&path),
                    waiting = left.len(),
                    first = %p,
                    why = %why,
                    "durability bucket: changes under this directory did not reach the bucket in time; fsync fails with EIO (nothing is lost: they stay in the local journal and the uploader keeps retrying)"
                );
                break Err(VfsError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "{} change(s) under /{} did not reach the bucket within {} s, e.g. {p} ({why})",
                        left.len(),
                        String::from_utf8_lossy(&path),
                        self.cfg.bucket_wait.as_secs()
                    ),
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.urgent
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        res
    }

    /// Whether `path` names a file with writes not yet committed by this mount.
    fn being_written(&self, path: &[u8]) -> bool {
        let ino = deskfs_meta::read(&*self.meta, |t| crate::paths::resolve(t, path));
        let Ok(Some(ino)) = ino else { return false };
        let st = self.inodes.lock().ok().and_then(|m| m.get(&ino).cloned());
        st.is_some_and(|st| st.lock().is_ok_and(|s| s.uncommitted))
    }
}

/// "attempt N: ERROR" or "upload in progress".
fn describe_failure(attempts: u32, error: Option<&str>) -> String {
    match error {
        Some(e) if attempts > 0 => format!("attempt {attempts}: {e}"),
        _ => "upload in progress".into(),
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn durability_parses_its_two_names_and_refuses_others() {
        assert_eq!("local".parse::<Durability>(), Ok(Durability::Local));
        assert_eq!("bucket".parse::<Durability>(), Ok(Durability::Bucket));
        let e = "foo".parse::<Durability>().unwrap_err();
        assert!(e.contains("\"foo\"") && e.contains("local") && e.contains("bucket"));
        assert!(!e.contains('\n'), "one line");
        assert_eq!(Durability::default(), Durability::Local);
        assert_eq!(Durability::Bucket.to_string(), "bucket");
    }
}
