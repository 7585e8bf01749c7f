//! The workspace lease: which metadata database owns a bucket-backed (SQLite) workspace.
//!
//! A SQLite workspace lives in one database on one machine; a second machine that
//! rebuilt its own database from the bucket must not write beside it, and the first
//! machine must not come back after another took over and write from its stale copy.
//! The record `.deskfs/lease.json` names the owning database (`db`, a random id kept in
//! its `kv`), the host and mount daemon holding it, and when it was last renewed. Every
//! change is a conditional write (`If-Match` the ETag read, `If-None-Match: *` when
//! there is none; on `file://` a lock file serialises check and write), so two
//! machines racing for it cannot both win; the record is read back after each write, so
//! on servers that ignore the conditional headers (Garage 2.5) a race is seen at once,
//! leaving only the window between one writer's read-back and the other's write.
//!
//! - A mount takes it (state `mounted`) and renews it every [`RENEW_EVERY`]; a clean
//!   unmount sets `released` (the database still owns the workspace).
//! - A mount of a database that is not the owner is refused: another machine attached
//!   the workspace since (its copy is stale).
//! - `deskfs attach --bucket` on a new machine refuses while the lease is `mounted` and
//!   was renewed within [`TTL`]; `--take-over` takes it anyway (a machine known dead).

use std::time::Duration;

use bytes::Bytes;
use deskfs_bucket::{Bucket, BucketError, PutIf};
use deskfs_meta::MetaEngine;

use crate::{now_ns, BackupError};

/// Key of the lease record.
pub const LEASE_KEY: &str = ".deskfs/lease.json";
/// A `mounted` lease not renewed for this long belongs to a dead machine.
pub const TTL: Duration = Duration::from_secs(90);
/// How often a mount renews its lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(15);
/// How many lost races for the record a renewal retries while it still names this
/// database (several mounts of one database renew the same record).
pub const RENEW_RACES: usize = 8;
/// `kv` key of the database's own id.
const DB_ID_KEY: &str = "db_id";

/// Whether a lease is held by a running mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// A mount of the owning database is (or was, until it stopped renewing) running.
    Mounted,
    /// The owning database is not mounted anywhere.
    Released,
}

/// The lease record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseRecord {
    /// Workspace id (bucket format record).
    pub workspace: String,
    /// Id of the owning metadata database.
    pub db: String,
    /// Host of the last holder.
    pub host: String,
    /// Daemon PID of the last holder.
    pub pid: u32,
    /// Mounted or released.
    pub state: LeaseState,
    /// Last renewal, ns since the epoch (the holder's clock).
    pub renewed_ns: i64,
}

impl LeaseRecord {
    /// Whether a mount holds it now (`mounted`, renewed within [`TTL`] of `now_ns`).
    pub fn live(&self, now_ns: i64) -> bool {
        self.state == LeaseState::Mounted
            && now_ns.saturating_sub(self.renewed_ns) < TTL.as_nanos() as i64
    }

    /// "host H (pid P, renewed N s ago)".
    pub fn holder(&self, now_ns: i64) -> String {
        format!(
            "host {} (daemon pid {}, renewed {} s ago)",
            self.host,
            self.pid,
            now_ns.saturating_sub(self.renewed_ns) / 1_000_000_000
        )
    }
}

/// The lease as read: the record and its ETag (for the next conditional write).
#[derive(Clone, Debug)]
pub struct ReadLease {
    /// The record.
    pub record: LeaseRecord,
    /// ETag of the object.
    pub etag: Option<String>,
}

/// Reads the lease (`None`: never taken). A damaged record reads as `None` for the
/// owner checks but keeps its ETag so it can be replaced conditionally.
pub async fn read(bucket: &Bucket) -> Result<Option<ReadLease>, BackupError> {
    let Some(h) = bucket.head(LEASE_KEY).await? else {
        return Ok(None);
    };
    let body = match bucket
        .get_range(LEASE_KEY, 0..h.size, h.etag.as_deref())
        .await
    {
        Ok(b) => b,
        Err(BucketError::Changed(_) | BucketError::NotFound(_)) => {
            // Replaced or removed between the two requests: read again.
            return Box::pin(read(bucket)).await;
        }
        Err(e) => return Err(e.into()),
    };
    let record = serde_json::from_slice(&body)
        .map_err(|e| BackupError::corrupt(format!("{LEASE_KEY}: {e}")))?;
    Ok(Some(ReadLease {
        record,
        etag: h.etag,
    }))
}

/// The database's own id (created on first use).
pub fn db_id(meta: &dyn MetaEngine) -> Result<String, BackupError> {
    Ok(deskfs_meta::txn(meta, |t| {
        if let Some(id) = t.get_kv(DB_ID_KEY)? {
            return Ok(id);
        }
        let id = random_id();
        t.set_kv(DB_ID_KEY, &id)?;
        Ok::<_, deskfs_meta::MetaError>(id)
    })?)
}

/// A random 128-bit id in hex (from the kernel's random source).
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    // SAFETY: getrandom fills our buffer; a short read leaves zeros mixed with the clock.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        b[..8].copy_from_slice(&now_ns().to_le_bytes());
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Writes `record` where the lease was `prev` (conditional). Errors:
/// [`BackupError::Leased`] when someone changed the lease in between.
async fn write(
    bucket: &Bucket,
    prev: Option<&ReadLease>,
    record: &LeaseRecord,
) -> Result<Option<String>, BackupError> {
    let body =
        serde_json::to_vec_pretty(record).map_err(|e| BackupError::corrupt(e.to_string()))?;
    let cond = match prev.and_then(|p| p.etag.clone()) {
        Some(e) => PutIf::Matches(e),
        None if prev.is_some() => {
            // A store without ETags: nothing to condition on.
            return Ok(bucket
                .put_bytes(LEASE_KEY, Bytes::from(body), None)
                .await?
                .etag);
        }
        None => PutIf::Absent,
    };
    match bucket.put_bytes_if(LEASE_KEY, Bytes::from(body), cond).await {
        Ok(p) => {
            // Servers that ignore conditional headers (Garage 2.5 does) make the write
            // above unconditional: read it back, so a racing writer is seen at once.
            match read(bucket).await? {
                Some(now) if now.record.db == record.db => Ok(now.etag.or(p.etag)),
                Some(now) => Err(BackupError::Leased(format!(
                    "the workspace lease was taken by {} at the same time; retry",
                    now.record.holder(now_ns())
                ))),
                None => Ok(p.etag),
            }
        }
        Err(BucketError::Changed(_)) => Err(BackupError::Leased(
            "the workspace lease changed while it was being taken (another machine is attaching or mounting it); retry".into(),
        )),
        Err(e) => Err(e.into()),
    }
}

/// A lease held by this process's mount.
#[derive(Debug)]
pub struct Held {
    record: LeaseRecord,
    etag: Option<String>,
}

/// Takes the lease for a mount of database `db` of workspace `workspace`. Errors:
/// [`BackupError::Leased`] when another database owns the workspace (this copy is stale)
/// or another database's mount holds it live.
pub async fn take_for_mount(
    bucket: &Bucket,
    workspace: &str,
    db: &str,
) -> Result<Held, BackupError> {
    let now = now_ns();
    let cur = read(bucket).await?;
    if let Some(c) = &cur {
        if c.record.db != db {
            return Err(BackupError::Leased(format!(
                "another machine took this workspace over since this database last held it ({}, lease {}); this copy is stale: move this workspace's data dir away and run `deskfs attach NAME --bucket URL` to rebuild it from the bucket",
                c.record.holder(now),
                if c.record.live(now) { "live" } else { "not renewed" }
            )));
        }
    }
    let record = LeaseRecord {
        workspace: workspace.to_string(),
        db: db.to_string(),
        host: crate::hostname(),
        pid: std::process::id(),
        state: LeaseState::Mounted,
        renewed_ns: now,
    };
    let etag = write(bucket, cur.as_ref(), &record).await?;
    Ok(Held { record, etag })
}

/// Takes the lease for a database being rebuilt on this machine (`deskfs attach
/// --bucket`), leaving it `released` (the mount takes it as `mounted`). Errors:
/// [`BackupError::Leased`] while another mount holds it live, unless `take_over`.
pub async fn take_for_attach(
    bucket: &Bucket,
    workspace: &str,
    db: &str,
    take_over: bool,
) -> Result<(), BackupError> {
    let now = now_ns();
    let cur = read(bucket).await?;
    if let Some(c) = &cur {
        if c.record.live(now) && !take_over {
            return Err(BackupError::Leased(format!(
                "workspace is mounted on {}; unmount it there first, or, if that machine is dead, run attach again with --take-over",
                c.record.holder(now)
            )));
        }
    }
    let record = LeaseRecord {
        workspace: workspace.to_string(),
        db: db.to_string(),
        host: crate::hostname(),
        pid: std::process::id(),
        state: LeaseState::Released,
        renewed_ns: now,
    };
    write(bucket, cur.as_ref(), &record).await?;
    Ok(())
}

impl Held {
    /// Renews the lease. Several mounts of one database (on this host) renew the same
    /// record and race for it: a lost race where the record still names this database is
    /// retried against the record now there, at most [`RENEW_RACES`] times, and a
    /// `mounted` record another mount of this database renewed within [`RENEW_EVERY`]
    /// is adopted as is. Errors: [`BackupError::Leased`] when another database took the
    /// workspace over (this mount must stop writing to the bucket), or when the record
    /// kept changing under every retry.
    pub async fn renew(&mut self, bucket: &Bucket, state: LeaseState) -> Result<(), BackupError> {
        let mut prev = Some(ReadLease {
            record: self.record.clone(),
            etag: self.etag.clone(),
        });
        let mut last = None;
        for _ in 0..RENEW_RACES {
            let mut rec = self.record.clone();
            rec.state = state;
            rec.renewed_ns = now_ns();
            rec.pid = std::process::id();
            match write(bucket, prev.as_ref(), &rec).await {
                Ok(etag) => {
                    self.record = rec;
                    self.etag = etag;
                    return Ok(());
                }
                Err(e @ BackupError::Leased(_)) => last = Some(e),
                Err(e) => return Err(e),
            }
            // Someone else wrote the record: who?
            let cur = read(bucket).await?;
            match &cur {
                Some(c) if c.record.db != self.record.db => {
                    return Err(BackupError::Leased(format!(
                        "the workspace was taken over by {}; this mount no longer owns it",
                        c.record.holder(now_ns())
                    )));
                }
                Some(c)
                    if state == LeaseState::Mounted
                        && c.record.live(now_ns())
                        && now_ns().saturating_sub(c.record.renewed_ns)
                            < RENEW_EVERY.as_nanos() as i64 =>
                {
                    // Another mount of this database just renewed it: held all the same.
                    self.record = c.record.clone();
                    self.etag = c.etag.clone();
                    return Ok(());
                }
                _ => {}
            }
            prev = cur;
            let jitter = u64::from(std::process::id() % 50) + 10;
            tokio::time::sleep(Duration::from_millis(jitter)).await;
        }
        Err(last.unwrap_or_else(|| {
            BackupError::Leased("the workspace lease kept changing; retry".into())
        }))
    }

    /// The record as last written.
    pub fn record(&self) -> &LeaseRecord {
        &self.record
    }
}
