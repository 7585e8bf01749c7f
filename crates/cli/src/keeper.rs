//! The bucket keeper of a mount of a SQLite workspace: holds the workspace lease in the
//! bucket and keeps the metadata backup (`.deskfs/meta/`) current — a flush every
//! [`FLUSH_EVERY`] while changes arrive, one after every `deskfs sync`, and a last one at
//! unmount. PostgreSQL workspaces have neither: their database is shared by every host
//! and is itself the namespace's durable home.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use deskfs_backup::lease::{self, Held, LeaseState};
use deskfs_backup::now_ns;
use deskfs_backup::writer::{BackupWriter, FlushOutcome};
use deskfs_bucket::Bucket;
use deskfs_meta::MetaEngine;
use tokio::runtime::Handle;

/// How long a starting mount waits for the bucket to hand it the lease before it mounts
/// anyway (the lease is then taken before the first backup).
const LEASE_AT_START: Duration = Duration::from_secs(10);

/// Background flush period.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// Status of the keeper, for `deskfs status`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct KeeperStatus {
    /// Backup generation in the bucket.
    pub generation: u64,
    /// Change mark the bucket's backup is at.
    pub seq: u64,
    /// Last successful flush, ns since the epoch.
    pub last_flush_ns: i64,
    /// Last flush error (cleared by the next success).
    pub last_error: Option<String>,
    /// Why this mount stopped writing the backup (the lease was taken over).
    pub lease_lost: Option<String>,
}

/// Shared between the keeper thread, the control socket and the daemon.
pub struct Keeper {
    writer: BackupWriter,
    /// The mount's own engine: its commit window is committed before each flush reads
    /// the database through the keeper's connection.
    mount_meta: Arc<dyn MetaEngine>,
    bucket: Bucket,
    rt: Handle,
    lease: Mutex<Option<Held>>,
    workspace: String,
    db: String,
    status: Mutex<KeeperStatus>,
    stop: AtomicBool,
    wake: (Mutex<bool>, Condvar),
}

impl Keeper {
    /// Takes the lease for a mount of database `meta` (SQLite, at `db_path`) and returns
    /// the keeper (its thread not started yet). Errors: the workspace is owned by another
    /// database (this copy is stale) or mounted live from another one.
    pub fn open(
        meta: Arc<dyn MetaEngine>,
        mount_meta: Arc<dyn MetaEngine>,
        db_path: &std::path::Path,
        bucket: Bucket,
        rt: Handle,
        workspace_id: String,
    ) -> Result<Arc<Keeper>> {
        let db = lease::db_id(&*meta)?;
        let take = rt.block_on(async {
            tokio::time::timeout(
                LEASE_AT_START,
                lease::take_for_mount(&bucket, &workspace_id, &db),
            )
            .await
        });
        let held = match take {
            Ok(Ok(h)) => Some(h),
            Ok(Err(e @ deskfs_backup::BackupError::Leased(_))) => return Err(anyhow!("{e}")),
            // The bucket is down: the mount works (writes wait in the journal); the lease
            // is taken before the first backup is written.
            Ok(Err(e)) => {
                tracing::warn!("cannot take the workspace lease now ({e}); retried before the first metadata backup");
                None
            }
            Err(_) => {
                tracing::warn!(
                    "the bucket did not answer within {} s for the workspace lease; retried before the first metadata backup",
                    LEASE_AT_START.as_secs()
                );
                None
            }
        };
        let mut lock = db_path.as_os_str().to_owned();
        lock.push(".backup-lock");
        let workspace_id_copy = workspace_id.clone();
        let writer = BackupWriter::new(meta, bucket.clone(), rt.clone(), workspace_id, lock.into());
        Ok(Arc::new(Keeper {
            writer,
            mount_meta,
            bucket,
            rt,
            lease: Mutex::new(held),
            workspace: workspace_id_copy,
            db,
            status: Mutex::new(KeeperStatus::default()),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(false), Condvar::new()),
        }))
    }

    /// Starts the background thread (flushes and lease renewals).
    pub fn start(self: &Arc<Keeper>) -> Result<std::thread::JoinHandle<()>> {
        let k = self.clone();
        Ok(std::thread::Builder::new()
            .name("deskfs-keeper".into())
            .spawn(move || k.run())?)
    }

    fn run(&self) {
        let mut renewed = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            {
                let (m, cv) = &self.wake;
                let Ok(g) = m.lock() else { return };
                let _ = cv.wait_timeout_while(g, FLUSH_EVERY, |woken| !*woken);
                if let Ok(mut g) = m.lock() {
                    *g = false;
                }
            }
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            if renewed.elapsed() >= lease::RENEW_EVERY {
                self.renew(LeaseState::Mounted);
                renewed = Instant::now();
            }
            if let Err(e) = self.flush() {
                tracing::warn!("metadata backup to the bucket failed (retried): {e}");
            }
        }
    }

    fn renew(&self, state: LeaseState) {
        let Ok(mut l) = self.lease.lock() else { return };
        let Some(held) = l.as_mut() else { return };
        match self.rt.block_on(held.renew(&self.bucket, state)) {
            Ok(()) => {}
            Err(deskfs_backup::BackupError::Leased(why)) => {
                tracing::error!("{why}: the metadata backup stops here (data already in the bucket is safe; unmount this mount)");
                if let Ok(mut s) = self.status.lock() {
                    s.lease_lost = Some(why);
                }
                *l = None;
            }
            Err(e) => tracing::warn!("cannot renew the workspace lease (retried): {e}"),
        }
    }

    /// Writes the backup up to now. Errors: the lease was lost, or the bucket/database
    /// failed (the marks stay for the next flush).
    pub fn flush(&self) -> Result<FlushOutcome> {
        if let Some(why) = self.status.lock().ok().and_then(|s| s.lease_lost.clone()) {
            return Err(anyhow!("metadata backup stopped: {why}"));
        }
        self.ensure_lease()?;
        // The backup reads through its own connection: what the mount acknowledged must
        // be committed first (a commit window holds up to 20 ms of requests).
        self.mount_meta.settle()?;
        match self.writer.flush() {
            Ok(out) => {
                if let Ok(mut s) = self.status.lock() {
                    s.generation = out.generation;
                    s.seq = out.seq;
                    s.last_flush_ns = now_ns();
                    s.last_error = None;
                }
                if out.files > 0 {
                    tracing::debug!(?out, "metadata backup written");
                }
                Ok(out)
            }
            Err(e) => {
                if let Ok(mut s) = self.status.lock() {
                    s.last_error = Some(e.to_string());
                }
                Err(anyhow!("metadata backup: {e}"))
            }
        }
    }

    /// Takes the lease if the bucket was unreachable when the mount started.
    fn ensure_lease(&self) -> Result<()> {
        let mut l = self
            .lease
            .lock()
            .map_err(|_| anyhow!("lease mutex poisoned"))?;
        if l.is_some() {
            return Ok(());
        }
        match self.rt.block_on(lease::take_for_mount(
            &self.bucket,
            &self.workspace,
            &self.db,
        )) {
            Ok(h) => {
                *l = Some(h);
                Ok(())
            }
            Err(e @ deskfs_backup::BackupError::Leased(_)) => {
                let why = e.to_string();
                tracing::error!("{why}");
                if let Ok(mut s) = self.status.lock() {
                    s.lease_lost = Some(why.clone());
                }
                Err(anyhow!("metadata backup stopped: {why}"))
            }
            Err(e) => Err(anyhow!("cannot take the workspace lease: {e}")),
        }
    }

    /// The keeper's status.
    pub fn status(&self) -> KeeperStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops the thread, writes a last backup and releases the lease (unless
    /// `keep_lease`: another live mount of this database on this host still holds it),
    /// waiting at most `limit`: a daemon told to stop exits promptly even when the bucket
    /// does not answer (the change marks stay; the next mount or `deskfs sync` writes them).
    ///
    /// Returns [`LastBackup::StillRunning`] when the limit passed first: the keeper's
    /// threads then still wait on the runtime's timers and sockets, so the caller must not
    /// shut that runtime down (tokio panics a thread whose timer outlives its runtime);
    /// the process exits with the runtime left running instead.
    #[must_use]
    pub fn finish(
        self: &Arc<Self>,
        thread: Option<std::thread::JoinHandle<()>>,
        keep_lease: bool,
        limit: Duration,
    ) -> LastBackup {
        self.stop.store(true, Ordering::Release);
        {
            let (m, cv) = &self.wake;
            if let Ok(mut g) = m.lock() {
                *g = true;
            }
            cv.notify_all();
        }
        let k = self.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("deskfs-keeper-last".into())
            .spawn(move || {
                if let Some(t) = thread {
                    let _ = t.join();
                }
                if let Err(e) = k.flush() {
                    tracing::warn!("last metadata backup failed ({e}); the next mount or `deskfs sync` writes it");
                }
                if !keep_lease {
                    k.renew(LeaseState::Released);
                }
                let _ = tx.send(());
            });
        if spawned.is_ok() && rx.recv_timeout(limit).is_err() {
            tracing::warn!(
                "the last metadata backup did not finish within {} s (bucket slow or down); the next mount or `deskfs sync` writes it",
                limit.as_secs()
            );
            return LastBackup::StillRunning;
        }
        LastBackup::Ended
    }
}

/// How [`Keeper::finish`] left the last metadata backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastBackup {
    /// Written, failed, or never started: no keeper thread uses the runtime any more.
    Ended,
    /// Still waiting on the bucket past the limit: the runtime must outlive the process.
    StillRunning,
}

impl LastBackup {
    /// Shuts `rt` down, waiting at most `in_flight` for its tasks, unless the last backup
    /// still runs on it: then the runtime is left to the process's exit (its threads end
    /// with the process), since shutting it down would panic the keeper's threads.
    pub fn shut_down(self, rt: tokio::runtime::Runtime, in_flight: Duration) {
        match self {
            LastBackup::Ended => rt.shutdown_timeout(in_flight),
            LastBackup::StillRunning => std::mem::forget(rt),
        }
    }
}

/// The keeper of an opened workspace: `Some` for SQLite workspaces (lease taken), `None`
/// for PostgreSQL ones.
pub fn for_workspace(o: &crate::daemon::Opened, rt: &Handle) -> Result<Option<Arc<Keeper>>> {
    let url = crate::metadb::MetaUrl::parse(&o.cfg.meta)?;
    let Some(db_path) = url.sqlite_path() else {
        return Ok(None);
    };
    let id = crate::metadb::Record::read(&*o.meta)?
        .map(|r| r.id)
        .unwrap_or_default();
    // A connection of its own: a snapshot's long read transaction (seconds for a
    // million files) must not hold the mount's connection; WAL lets both run at once.
    let own = url.open()?;
    Ok(Some(Keeper::open(
        own,
        o.meta.clone(),
        db_path,
        o.bucket.clone(),
        rt.clone(),
        id,
    )?))
}
