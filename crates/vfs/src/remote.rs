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
    /// Cache id that holds it (this mount's own under bucket durability: a close or
    /// fsync waiting for its upload).
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
    pub(crate) fn sleep(&self, d: Duration) {
        let g = self.uploaded.lock().unwrap_or_else(|p| p.into_inner());
        let start = *g;
        let _ = self
            .cv
            .wait_timeout_while(g, d, |v| *v == start)
            .map(|(g, _)| drop(g));
    }

    /// Lists a wait for content version `version` of `ino` held by cache `holder`
    /// (status), begun at `since`.
    pub(crate) fn begin(&self, ino: Ino, version: u64, holder: u64, since: Instant) {
        self.waits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((ino, version), (holder, since));
    }

    /// Ends a wait listed by [`RemoteWaits::begin`].
    pub(crate) fn end(&self, ino: Ino, version: u64) {
        self.waits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ino, version));
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

/// How often a waiting open repeats its upload request.
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// How often a waiter re-reads the metadata when no signal arrives (engines without
/// notifications, a lost signal).
const RECHECK: Duration = Duration::from_millis(25);

impl Vfs {
    /// Makes sure the content of `row` can be read here: held in this cache or in the
    /// bucket. When only another cache holds it, asks that cache's mount to upload it now
    /// and waits (bounded). Returns the row it settled on: a newer commit may replace
    /// `row` during the wait, and then it is the newer version that is readable here
    /// (held in this cache, or in the bucket), not necessarily `row`'s. Errors: `EIO`
    /// (timed out, or the content is nowhere).
    pub(crate) fn await_remote_content(&self, row: &InodeRow) -> Result<InodeRow> {
        let start = Instant::now();
        let mut asked: Vec<(Ino, u64)> = Vec::new();
        let res = self.await_remote_inner(row, start, &mut asked);
        let mut waits = self.remote.waits.lock().unwrap_or_else(|p| p.into_inner());
        for k in &asked {
            waits.remove(k);
        }
        res
    }

    fn await_remote_inner(
        &self,
        row: &InodeRow,
        start: Instant,
        asked: &mut Vec<(Ino, u64)>,
    ) -> Result<InodeRow> {
        let mut row = row.clone();
        let mut last_ask: Option<(u64, u64, Instant)> = None;
        loop {
            if row.kind != Kind::File || row.size == 0 || row.local == self.here() {
                return Ok(row);
            }
            let have = deskfs_meta::read(&*self.meta, |t| {
                t.object_with_content(row.ino, row.data_version)
            })?;
            if have.is_some() {
                return Ok(row);
            }
            let Local::At(holder) = row.local else {
                return Err(VfsError::Io(std::io::Error::other(format!(
                    "content of inode {} version {} is neither in a cache nor in the bucket",
                    row.ino, row.data_version
                ))));
            };
            // Ask (again every second: a holder may have cleared an older request).
            let ask = match last_ask {
                Some((v, h, t)) => v != row.data_version || h != holder || t.elapsed() >= ASK_AGAIN,
                None => true,
            };
            if ask {
                last_ask = Some((row.data_version, holder, Instant::now()));
                if !asked.contains(&(row.ino, row.data_version)) {
                    asked.push((row.ino, row.data_version));
                    self.remote
                        .waits
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert((row.ino, row.data_version), (holder, start));
                }
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
                return Err(VfsError::Io(std::io::Error::new(
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
        }
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
        if !inos.is_empty() {
            self.uploader.kick();
        }
    }

    /// Follows up the requests among `inos` (all those still open): answers those that
    /// need no upload from this mount any more (content in the bucket, or not held here)
    /// so their waiters look again; uploads those that lost their last name since they
    /// were made due (the upload of a path uploads whatever the path names now, so an
    /// inode renamed over or unlinked meanwhile goes to its orphan key instead); and
    /// makes the others due again (a rename may have moved them to another path).
    pub(crate) fn settle_wanted(&self, inos: &[Ino]) {
        for &ino in inos {
            let state = deskfs_meta::read(&*self.meta, |t| {
                let Some(r) = t.get_inode(ino)? else {
                    return Ok::<_, crate::VfsError>(None);
                };
                let in_bucket = t.object_with_content(ino, r.data_version)?.is_some();
                // Every name of it still has its pending row: the uploader has it, in its
                // own time (a failing upload keeps its backoff, a deferred one its delay).
                let mut queued = r.nlink > 0;
                for p in crate::paths::paths_of(t, ino)? {
                    queued &= t.is_pending(&p)?;
                }
                Ok(Some((r, in_bucket, queued)))
            });
            match state {
                Ok(Some((r, false, _))) if r.local == self.here() && r.nlink == 0 => {
                    if let Err(e) = self.upload_orphan(&r) {
                        tracing::warn!(ino, error = %e, "cannot upload an orphan another mount waits for");
                    }
                    self.uploaded(ino);
                }
                // Re-marked only when a name of it lost its row (a rename moved it): a
                // re-mark each round would restart a failing upload's backoff from zero,
                // and reconcile it in a loop (found by the attack helper: after a
                // `--durability bucket` close failed, ~13 tries a second, forever, and
                // status showed no failing upload).
                Ok(Some((_, false, true))) => {}
                Ok(Some((r, false, _))) if r.dirty && r.local == self.here() => {
                    if let Err(e) = self.meta.apply(&[deskfs_meta::Op::MarkInode {
                        ino,
                        not_before_ns: 0,
                    }]) {
                        tracing::warn!(ino, error = %e, "cannot serve an upload request");
                    }
                }
                Ok(_) => self.uploaded(ino),
                Err(e) => tracing::warn!(ino, error = %e, "cannot check an upload request"),
            }
        }
    }

    /// Uploads the content of orphan `r` (held here) to
    /// `.deskfs/orphans/INO.VERSION.SESSION` and records it (path `\0orphan/INO`, which
    /// names nothing): another mount that opened the inode just before it lost its name
    /// reads it from there. The object goes when the orphan is purged.
    ///
    /// Mounts sharing this cache dir may serve the same request at once: each writes its
    /// own key, so the recorded row always names an object its recorder wrote (its ETag
    /// holds); the first record of a version wins and a later uploader deletes its copy.
    fn upload_orphan(&self, r: &InodeRow) -> Result<()> {
        let (ino, version) = (r.ino, r.data_version);
        if deskfs_meta::read(&*self.meta, |t| t.object_with_content(ino, version))?.is_some() {
            return Ok(());
        }
        let key = format!(
            ".deskfs/orphans/{ino}.{version}.{}",
            self.coherence.session()
        );
        let staging = self.cache.staging_path(ino);
        let put = {
            let _reading = self.cache.read_guard(ino);
            self.rt.block_on(self.put_staging(&key, &staging, None))?
        };
        let row = deskfs_meta::ObjectRow {
            path: orphan_path(ino),
            key: key.clone(),
            ino,
            kind: Kind::File,
            data_version: version,
            meta_stamp: r.ctime_ns,
            etag: put.etag,
            size: put.size,
        };
        // `Ok(what the record replaced)`, or `Err(the key recorded)` when a copy of this
        // version is recorded already (another uploader's: then ours is the one to go).
        let recorded = deskfs_meta::txn(&*self.meta, |t| match t.get_object(&row.path)? {
            Some(o) if o.data_version == version => Ok::<_, deskfs_meta::MetaError>(Err(o.key)),
            old => {
                t.put_object(&row)?;
                Ok(Ok(old.map(|o| o.key)))
            }
        })?;
        let unused = match recorded {
            Err(theirs) => (theirs != key).then_some(key),
            Ok(old) => {
                self.uploader
                    .orphan_objects
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(ino);
                old.filter(|k| *k != key)
            }
        };
        if let Some(k) = unused {
            if let Err(e) = self.rt.block_on(self.bucket.delete(&k)) {
                tracing::warn!(key = %k, error = %e, "cannot delete an unused orphan object");
            }
        }
        Ok(())
    }

    /// After `ino` was purged: the object of its content uploaded as an orphan (if any)
    /// is deleted by the uploader. The orphan object may be another mount's upload (it
    /// served this mount's open while it lost the name; this mount purged at its last
    /// close): its record is looked up when this mount did not upload it — unless this
    /// mount was alone since it started (no other mount could have asked for one), so
    /// an `unlink` while alone costs no extra read. Crash recovery, which purges orphans
    /// of earlier mounts, always looks ([`Vfs::forget_earlier_orphan_object`]).
    pub(crate) fn forget_orphan_object(&self, ino: Ino) {
        let mine = self
            .uploader
            .orphan_objects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ino);
        let maybe_theirs = self.coherence.alone_period() != Some(0);
        self.forget_orphan_record(ino, mine, maybe_theirs);
    }

    /// [`Vfs::forget_orphan_object`] for an orphan a mount before this one left.
    pub(crate) fn forget_earlier_orphan_object(&self, ino: Ino) {
        self.forget_orphan_record(ino, false, true);
    }

    /// Queues the deletion of `ino`'s orphan object when this mount uploaded it (`mine`)
    /// or, when `look`, its record exists.
    fn forget_orphan_record(&self, ino: Ino, mine: bool, look: bool) {
        let had = mine
            || look
                && match deskfs_meta::read(&*self.meta, |t| t.get_object(&orphan_path(ino))) {
                    Ok(o) => o.is_some(),
                    Err(e) => {
                        tracing::warn!(ino, error = %e, "cannot look for an orphan's object; `deskfs fsck --repair` finds it");
                        false
                    }
                };
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
