//! Close-to-open across caches: content that only another mount's local journal holds.
//!
//! `close` on mount A commits the new content version to the metadata engine at once,
//! but its bytes reach the bucket later (the uploader's coalescing delay). A mount B with
//! another cache dir (another host, or another `--cache-dir`) that opens the file then
//! finds the current version neither in its cache nor in the bucket. It records an upload
//! request (`wanted`) naming A's cache and signals it; A's uploader uploads that inode
//! right away (no coalescing, no burst deferral), records the object and signals back. B
//! waits at most [`VfsConfig::remote_wait`](crate::VfsConfig) and then fails the open with
//! `EIO` and a log line naming what it waited for: nothing is lost (A's journal still
//! holds the bytes and uploads them when it can), and B never reads another version's
//! bytes in their place. `deskfs status` lists the waits in progress.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use deskfs_meta::{Ino, InodeRow, Kind, Local, Signal};
use serde::Serialize;

use crate::{now_ns, Result, Vfs, VfsError};

/// One wait for content held elsewhere (status).
#[derive(Clone, Debug, Serialize)]
pub struct RemoteWait {
    /// Inode waited for.
    pub ino: Ino,
    /// Content version waited for.
    pub version: u64,
    /// Cache id that holds it.
    pub holder: u64,
    /// Seconds waited so far.
    pub waited_s: f64,
}

/// The waits of one mount, and the wake-up for "an upload finished".
#[derive(Default)]
pub(crate) struct RemoteWaits {
    waits: Mutex<HashMap<(Ino, u64), (u64, Instant)>>,
    /// Bumped on every `Uploaded` signal.
    uploaded: Mutex<u64>,
    cv: Condvar,
}

impl RemoteWaits {
    /// Wakes waiters (an upload finished somewhere).
    pub(crate) fn wake(&self) {
        let mut g = self.uploaded.lock().unwrap_or_else(|p| p.into_inner());
        *g += 1;
        self.cv.notify_all();
    }

    /// Sleeps until woken or `d` passed.
    fn sleep(&self, d: Duration) {
        let g = self.uploaded.lock().unwrap_or_else(|p| p.into_inner());
        let start = *g;
        let _ = self
            .cv
            .wait_timeout_while(g, d, |v| *v == start)
            .map(|(g, _)| drop(g));
    }

    /// The waits in progress.
    pub(crate) fn list(&self) -> Vec<RemoteWait> {
        let m = self.waits.lock().unwrap_or_else(|p| p.into_inner());
        m.iter()
            .map(|((ino, version), (holder, since))| RemoteWait {
                ino: *ino,
                version: *version,
                holder: *holder,
                waited_s: since.elapsed().as_secs_f64(),
            })
            .collect()
    }
}

/// The object-table path of an orphan's uploaded content: starts with a NUL byte, which
/// no name can hold, so it names no file.
fn orphan_path(ino: Ino) -> Vec<u8> {
    format!("\0orphan/{ino}").into_bytes()
}

/// How often a waiter re-reads the metadata when no signal arrives (engines without
/// notifications, a lost signal).
const RECHECK: Duration = Duration::from_millis(25);

impl Vfs {
    /// Makes sure the content of `row` can be read here: held in this cache or in the
    /// bucket. When only another cache holds it, asks that cache's mount to upload it now
    /// and waits (bounded). Errors: `EIO` (timed out, or the content is nowhere).
    pub(crate) fn await_remote_content(&self, row: &InodeRow) -> Result<()> {
        let mut row = row.clone();
        let start = Instant::now();
        let mut asked: Option<(u64, u64)> = None;
        let res = loop {
            if row.kind != Kind::File || row.size == 0 || row.local == self.here() {
                break Ok(());
            }
            let have = deskfs_meta::read(&*self.meta, |t| {
                t.object_with_content(row.ino, row.data_version)
            })?;
            if have.is_some() {
                break Ok(());
            }
            let Local::At(holder) = row.local else {
                break Err(VfsError::Io(std::io::Error::other(format!(
                    "content of inode {} version {} is neither in a cache nor in the bucket",
                    row.ino, row.data_version
                ))));
            };
            if asked != Some((row.data_version, holder)) {
                asked = Some((row.data_version, holder));
                self.remote
                    .waits
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((row.ino, row.data_version), (holder, start));
                let ino = row.ino;
                deskfs_meta::txn(&*self.meta, |t| t.want_upload(ino, holder, now_ns()))?;
                let _ = self.meta.signal(&Signal::UploadWanted {
                    ino: row.ino,
                    cache: holder,
                });
                tracing::debug!(
                    ino,
                    holder,
                    version = row.data_version,
                    "content held by another cache: asked for its upload"
                );
            }
            if start.elapsed() >= self.cfg.remote_wait {
                tracing::error!(
                    ino = row.ino,
                    version = row.data_version,
                    holder,
                    waited_s = start.elapsed().as_secs_f64(),
                    "the mount holding this file's newest content (cache {holder}) did not upload it in time; the open fails with EIO (nothing is lost: that mount uploads it when it can)"
                );
                break Err(VfsError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "content of inode {} is still only in the journal of another mount (cache {holder}), which did not upload it within {} s",
                        row.ino,
                        self.cfg.remote_wait.as_secs()
                    ),
                )));
            }
            self.remote.sleep(RECHECK);
            // A newer commit may have replaced what we wait for.
            row = self.meta.get_inode(row.ino)?.ok_or(VfsError::Stale)?;
        };
        if let Some((v, _)) = asked {
            self.remote
                .waits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(row.ino, v));
        }
        res
    }

    /// A signal from another mount.
    pub(crate) fn on_signal(&self, sig: &Signal) {
        match sig {
            Signal::UploadWanted { cache, .. } if *cache == self.cache.id() => {
                self.uploader
                    .wanted_hint
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.uploader.kick();
            }
            Signal::Uploaded(_) => self.remote.wake(),
            // A lock released, or a session expired with its locks: waiters look again.
            Signal::LockFreed(_) | Signal::Sessions => self.locks.wake(),
            _ => {}
        }
    }

    /// The holder's side: inodes other mounts wait for, held in this cache. Their paths
    /// are made due now; returns them (the uploader treats them as urgent).
    pub(crate) fn wanted_here(&self) -> Vec<Ino> {
        let id = self.cache.id();
        match deskfs_meta::read(&*self.meta, |t| t.wanted_for(id)) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read upload requests");
                Vec::new()
            }
        }
    }

    /// Makes the content of the inodes other mounts asked for due for upload now, or
    /// answers at once for those with nothing to upload (clean, or not held here).
    pub(crate) fn serve_wanted(&self, inos: &[Ino]) {
        for &ino in inos {
            let row = match self.meta.get_inode(ino) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(ino, error = %e, "cannot serve an upload request");
                    continue;
                }
            };
            match row {
                // An orphan (another mount opens it a moment after it lost its name):
                // no path to upload it to, so it goes to a key of its own.
                Some(r) if r.nlink == 0 && r.local == self.here() => {
                    if let Err(e) = self.upload_orphan(&r) {
                        tracing::warn!(ino, error = %e, "cannot upload an orphan another mount waits for");
                    }
                    self.uploaded(ino);
                }
                Some(r) if r.dirty && r.local == self.here() => {
                    tracing::debug!(ino, "another mount waits for this content: uploading now");
                    if let Err(e) = self.meta.apply(&[deskfs_meta::Op::MarkInode {
                        ino,
                        not_before_ns: 0,
                    }]) {
                        tracing::warn!(ino, error = %e, "cannot serve an upload request");
                    }
                }
                _ => self.uploaded(ino),
            }
        }
        self.uploader.kick();
    }

    /// Uploads the content of orphan `r` (held here) to `.deskfs/orphans/INO.VERSION` and
    /// records it (path `\0orphan/INO`, which names nothing): another mount that opened
    /// the inode just before it lost its name reads it from there. The object goes when
    /// the orphan is purged.
    fn upload_orphan(&self, r: &InodeRow) -> Result<()> {
        let key = format!(".deskfs/orphans/{}.{}", r.ino, r.data_version);
        let staging = self.cache.staging_path(r.ino);
        let put = {
            let _reading = self.cache.read_guard(r.ino);
            self.rt
                .block_on(self.bucket.put_file(&key, &staging, None))?
        };
        let row = deskfs_meta::ObjectRow {
            path: orphan_path(r.ino),
            key,
            ino: r.ino,
            kind: Kind::File,
            data_version: r.data_version,
            meta_stamp: r.ctime_ns,
            etag: put.etag,
            size: put.size,
        };
        deskfs_meta::txn(&*self.meta, |t| t.put_object(&row))?;
        self.uploader
            .orphan_objects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(r.ino);
        Ok(())
    }

    /// After `ino` was purged: the object of its content uploaded as an orphan (if any)
    /// is deleted by the uploader.
    pub(crate) fn forget_orphan_object(&self, ino: Ino) {
        let had = self
            .uploader
            .orphan_objects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ino);
        if had {
            let p = orphan_path(ino);
            let r = deskfs_meta::txn(&*self.meta, |t| t.mark_pending(&p, false, now_ns()));
            if let Err(e) = r {
                tracing::warn!(ino, error = %e, "cannot queue the removal of an orphan's object");
            }
        }
    }

    /// The content of `ino` reached the bucket: forget a request for it and wake waiters.
    pub(crate) fn uploaded(&self, ino: Ino) {
        let _ = deskfs_meta::txn(&*self.meta, |t| t.clear_wanted(ino));
        let _ = self.meta.signal(&Signal::Uploaded(ino));
        self.remote.wake();
    }
}
