//! The uploader: makes the bucket match the namespace, path by path.
//!
//! Every namespace change marks the workspace paths it affects as *pending* in the
//! metadata engine (same transaction), so the work list survives crashes. The uploader
//! takes due paths (after a short coalescing delay), compares what the namespace says
//! with what the bucket is recorded to hold, and issues the PUT (multipart for big
//! files), server-side COPY (renames of content that is not local), marker PUT or DELETE
//! needed. Failures are retried with exponential backoff (0.5 s doubling, capped at
//! 60 s); `deskfs status` shows them. Before the last bucket copy of a live file's content
//! is overwritten or deleted, that content is first made local, so no interleaving of
//! renames can lose it. Two mounts may put one key at once (no conditional PUT to rely
//! on): an upload is recorded, and its inode marked clean, only for an object the bucket
//! holds (`record_upload`), and a clean staging file is evicted only once the bucket is
//! found to hold its content (`Vfs::held_in_bucket`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use deskfs_bucket::PosixMeta;
use deskfs_meta::{Ino, InodeRow, Kind, Local, ObjectRow, PendingRow};
use futures::stream::FuturesUnordered;
use futures::StreamExt;

use crate::paths::{join, resolve};
use crate::{now_ns, Result, Vfs, VfsError};

/// Longest time a file with uncommitted writes delays its upload, ns.
const MAX_DEFER_NS: i64 = 30_000_000_000;

/// How often the uploader looks for due work when nothing wakes it.
const IDLE_TICK: Duration = Duration::from_millis(100);

/// State shared between the VFS and its uploader task.
#[derive(Default)]
pub(crate) struct UploaderShared {
    notify: tokio::sync::Notify,
    stop: AtomicBool,
    stopped: tokio::sync::Notify,
    running: AtomicBool,
    /// Held by reconciles that copy from, overwrite or delete objects that may hold
    /// another inode's content, so a copy never reads a source being replaced.
    content_lock: tokio::sync::Mutex<()>,
    /// Inodes other mounts wait for (see [`crate::remote`]) whose upload was made due.
    serving: std::sync::Mutex<HashSet<Ino>>,
    /// Another mount signalled that it waits for content of this cache (look now).
    pub(crate) wanted_hint: AtomicBool,
    /// Orphans whose content this mount uploaded for another (deleted at their purge).
    pub(crate) orphan_objects: std::sync::Mutex<HashSet<Ino>>,
    /// Pending paths found to be another mount's to upload ([`Outcome::Elsewhere`]): which
    /// state of their pending row that was found at, and when.
    elsewhere: std::sync::Mutex<HashMap<Vec<u8>, Finding>>,
    /// Paths whose object held an unrecorded ETag at an upload's check, with that ETag and
    /// when it was first seen (see `bucket_side_check`).
    foreign_seen: std::sync::Mutex<HashMap<Vec<u8>, (String, Instant)>>,
    /// Pending paths being uploaded by this mount right now, from before the first
    /// request of the upload until after its record was written: a directory listing
    /// taken meanwhile may show the new object without its record, or the record without
    /// the new object (see [`UploaderShared::uploading`]). Each with a number of its own
    /// (from `upload_ids`), so a sync barrier can wait for the uploads running when it was
    /// taken ([`UploaderShared::uploads_now`]).
    inflight: std::sync::Mutex<HashMap<Vec<u8>, u64>>,
    /// The last number given to an upload in `inflight`.
    upload_ids: AtomicU64,
    /// Pending rows this mount's reconcile deferred ([`Outcome::Defer`]: a writer still
    /// has the file open, another mount's put may be landing, ...): the row's `gen` then
    /// and until when (ns). A sync barrier takes every other row at once, past its delays,
    /// but not these before their time: the reconcile would only defer them again, in a
    /// loop of database round trips (found by an attack test: `deskfs sync` beside a file
    /// held open for writing spun the daemon at 100 % CPU).
    deferred: std::sync::Mutex<HashMap<Vec<u8>, (u64, i64)>>,
    /// Since when (ns) a burst of request-path changes holds uploads that are due; 0 when
    /// none does (`deskfs status`).
    pub(crate) burst_since_ns: std::sync::atomic::AtomicI64,
    /// Reconciles run so far (tests count them).
    #[cfg(test)]
    pub(crate) reconciles: AtomicU64,
    /// Holds tests put on uploads ([`PutGate`]).
    #[cfg(test)]
    pub(crate) gates: std::sync::Mutex<Vec<Arc<PutGate>>>,
    /// Run once by the next eviction with files to remove, after its records are durable
    /// and before the staging files go: requests landing there.
    #[cfg(test)]
    pub(crate) before_evict_remove: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// A pending row found to be another mount's to upload, and the state of the row it was
/// found at: its `seq` (a new row after the old one was finished) and `gen` (a re-mark).
/// For the sync barrier the finding holds for that state only: content changes that make
/// a path this mount's again (a write here after the content hopped from the other
/// cache, say) always re-mark the path, and the barrier waits for a row in another state.
#[derive(Clone, Copy, Debug)]
struct Finding {
    seq: u64,
    gen: u64,
    at: Instant,
}

impl Finding {
    /// Whether this finding is about `row` as it is now.
    fn is_about(&self, row: &PendingRow) -> bool {
        self.seq == row.seq && self.gen == row.gen
    }
}

impl UploaderShared {
    fn deferred(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, (u64, i64)>> {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `row` (in its present state) was deferred by a reconcile here until after
    /// `now` (ns).
    fn deferred_past(&self, row: &PendingRow, now: i64) -> bool {
        self.deferred()
            .get(&row.path)
            .is_some_and(|&(gen, until)| gen == row.gen && until > now)
    }

    /// Records the outcome of a reconcile of `path` at `gen` for [`Self::deferred_past`]:
    /// `Some(until)` when it was deferred until then (ns), `None` otherwise.
    fn note_deferral(&self, path: &[u8], gen: u64, until: Option<i64>, now: i64) {
        let mut m = self.deferred();
        match until {
            Some(until) => {
                m.insert(path.to_vec(), (gen, until));
            }
            None => {
                m.remove(path);
            }
        }
        if m.len() > 65_536 {
            m.retain(|_, &mut (_, until)| until > now);
        }
    }

    /// Whether this mount is uploading `path` right now (its put may have landed while
    /// its record is not written yet).
    pub(crate) fn uploading(&self, path: &[u8]) -> bool {
        self.inflight().contains_key(path)
    }

    /// Whether an upload of `dir` itself or of a path under it runs now (`dir` empty:
    /// any upload).
    pub(crate) fn uploading_under(&self, dir: &[u8]) -> bool {
        self.inflight()
            .keys()
            .any(|p| crate::paths::is_at_or_under(p, dir))
    }

    /// The numbers of the uploads running now. A put of one of them may land under a
    /// directory removed meanwhile, and the work that makes (see `sweep_again_if_removed`)
    /// is marked before the upload ends: a sync barrier waits for them with
    /// [`UploaderShared::any_running`], their rows may have been finished by another
    /// mount.
    pub(crate) fn uploads_now(&self) -> Vec<u64> {
        self.inflight().values().copied().collect()
    }

    /// Whether any of the uploads numbered `ids` still runs.
    pub(crate) fn any_running(&self, ids: &[u64]) -> bool {
        !ids.is_empty() && self.inflight().values().any(|i| ids.contains(i))
    }

    /// Starts an upload of `path`; `false` when one runs already.
    fn begin_upload(&self, path: &[u8]) -> bool {
        let mut m = self.inflight();
        if m.contains_key(path) {
            return false;
        }
        let id = self.upload_ids.fetch_add(1, Ordering::Relaxed) + 1;
        m.insert(path.to_vec(), id);
        true
    }

    /// The upload of `path` ended (its record, if any, is written).
    fn end_upload(&self, path: &[u8]) {
        self.inflight().remove(path);
    }

    fn inflight(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, u64>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the uploader (new work or a sync barrier).
    pub(crate) fn kick(&self) {
        self.notify.notify_one();
    }

    /// Tells the uploader that work was queued which is due `delay` from now: wakes it
    /// only when that is sooner than its next look ([`IDLE_TICK`]). A content commit
    /// calls this; with the default 500 ms delay it wakes nobody — every wake-up is a few
    /// context switches of the runtime's threads, paid on the request path (one per
    /// `fsync` of a database, one per file of an untar).
    pub(crate) fn queued(&self, delay: Duration) {
        if delay < IDLE_TICK {
            self.kick();
        }
    }

    /// Whether pending `row`, in its present state (`seq`, `gen`), was found within
    /// [`ELSEWHERE_FORGET`] to hold content only another mount's cache has: that mount's
    /// uploader does it, so this mount's sync barrier does not wait for it. A finding
    /// about an earlier state of the row does not count (see [`Finding`]).
    pub(crate) fn is_elsewhere(&self, row: &PendingRow) -> bool {
        self.finding(&row.path)
            .is_some_and(|f| f.is_about(row) && f.at.elapsed() < ELSEWHERE_FORGET)
    }

    /// Whether the uploader skips `path` now (found elsewhere within [`ELSEWHERE_SKIP`],
    /// whatever state its row had then: a path the mount holding its content keeps
    /// re-marking is not looked at again at every mark; one whose content came here
    /// waits at most that long, and a sync barrier waits for it).
    fn skips(&self, path: &[u8]) -> bool {
        self.finding(path)
            .is_some_and(|f| f.at.elapsed() < ELSEWHERE_SKIP)
    }

    fn finding(&self, path: &[u8]) -> Option<Finding> {
        self.elsewhere
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            .copied()
    }

    /// Another mount asks this one for content: paths found elsewhere before may be this
    /// mount's now (content hops between caches), so none is skipped any more.
    fn forget_elsewhere(&self) {
        self.elsewhere
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Records what reconciling pending row `row` (path, `seq`, `gen` as taken) found:
    /// another mount's (`mine` false) or not.
    fn found(&self, row: &PendingRow, mine: bool) {
        let mut m = self.elsewhere.lock().unwrap_or_else(|p| p.into_inner());
        if mine {
            m.remove(&row.path);
        } else {
            let f = Finding {
                seq: row.seq,
                gen: row.gen,
                at: Instant::now(),
            };
            m.insert(row.path.clone(), f);
        }
        if m.len() > 65_536 {
            m.retain(|_, f| f.at.elapsed() < ELSEWHERE_FORGET);
        }
    }

    /// Asks the uploader to stop after its in-flight operations.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

enum Outcome {
    Done,
    Defer(Duration),
    /// The path's content is held only by another mount's cache: that mount uploads it.
    /// The pending row is left as it is (this mount looks at it again later).
    Elsewhere,
}

/// How long a path whose content another mount holds is not looked at again here.
const ELSEWHERE_SKIP: Duration = Duration::from_secs(2);

/// How long such a path still counts as another mount's (a few skips: it is looked at
/// again after each).
const ELSEWHERE_FORGET: Duration = Duration::from_secs(10);

/// Longest a burst of request-path changes postpones an upload that is due. Uploads are
/// background work: the data is safe in the local journal meanwhile, and on a small
/// machine each one costs the bucket server, the metadata engine and this process CPU
/// the burst needs (case 26 of `shared/cases` on two hosts: 48–56 s with uploads
/// running beside pip, 38 s with them after it; design 0021). An agent's burst (an
/// install, a build, a checkout) rarely lasts a minute; one that does still uploads,
/// through [`BURST_WORKERS`].
pub const BURST_DEFER: Duration = Duration::from_secs(60);

/// How long without a change of the request path ends a burst, by default
/// (`VfsConfig::burst_quiet`): the pauses inside one (a package manager fetching the next
/// package, an interpreter starting) are shorter.
pub const BURST_QUIET: Duration = Duration::from_secs(2);

/// How long past its due time a pending row another mount marked waits for that mount
/// before this one reconciles it: the marking mount may postpone it by up to
/// [`BURST_DEFER`] during a burst of its own.
pub const OTHERS_GRACE: Duration = BURST_DEFER;

/// Uploads in flight at once while a burst goes on (the uploads past [`BURST_DEFER`]).
pub const BURST_WORKERS: usize = 2;

pub(crate) fn start(vfs: &Arc<Vfs>) {
    let v = vfs.clone();
    vfs.uploader.running.store(true, Ordering::SeqCst);
    vfs.rt.spawn(async move {
        run(v.clone()).await;
        v.uploader.running.store(false, Ordering::SeqCst);
        v.uploader.stopped.notify_waiters();
    });
}

fn backoff(attempts: u32) -> i64 {
    let ms = 500u64.saturating_mul(1u64 << attempts.min(7)).min(60_000);
    ms as i64 * 1_000_000
}

/// Due rows read ahead of the workers, so that the pending table is not read again for
/// every finished upload and every commit's wake-up: read again when the window ran dry
/// (at most every [`DueWindow::MIN_GAP`]), when it is older than [`DueWindow::MAX_AGE`],
/// when the horizon moved past what it was read for, and at once when a wait is urgent
/// (`sync`, `--durability bucket`). A row taken from it is reconciled against the
/// database as any row is, so an old one costs a no-op at worst.
#[derive(Default)]
struct DueWindow {
    rows: std::collections::VecDeque<PendingRow>,
    read_at: Option<std::time::Instant>,
    horizon: i64,
}

impl DueWindow {
    /// Shortest time between two reads of an empty window (commits wake the uploader
    /// hundreds of times a second during a burst).
    const MIN_GAP: Duration = Duration::from_millis(50);
    /// Longest a read row waits here.
    const MAX_AGE: Duration = Duration::from_millis(500);

    fn wants_read(&self, urgent: bool, horizon: i64) -> bool {
        let Some(at) = self.read_at else { return true };
        let age = at.elapsed();
        if urgent || age >= Self::MAX_AGE {
            return true;
        }
        if self.rows.is_empty()
            || horizon > self.horizon.saturating_add(Self::MAX_AGE.as_nanos() as i64)
        {
            return age >= Self::MIN_GAP;
        }
        false
    }

    fn fill(&mut self, rows: Vec<PendingRow>, horizon: i64) {
        self.rows = rows.into();
        self.read_at = Some(std::time::Instant::now());
        self.horizon = horizon;
    }

    fn next(&mut self) -> Option<PendingRow> {
        self.rows.pop_front()
    }
}

async fn run(vfs: Arc<Vfs>) {
    let mut window = DueWindow::default();
    let mut tasks = FuturesUnordered::new();
    let mut last_evict = std::time::Instant::now();
    let mut last_wanted = std::time::Instant::now();
    // Work a previous mount left pending is due at once, whatever delays or backoff it
    // was given (until a read of due work comes back short of a full window); work this
    // mount queues keeps its own delays.
    let mut resuming = true;
    let resume_upto = deskfs_meta::read(&*vfs.meta, |t| t.pending_last_seq()).unwrap_or(u64::MAX);
    if let Err(e) = forget_stale_announcements(&vfs) {
        tracing::debug!(error = %e, "cannot remove announcements of puts by mounts gone");
    }
    loop {
        let stopping = vfs.uploader.stop.load(Ordering::SeqCst);
        if stopping && tasks.is_empty() {
            break;
        }
        if !stopping && tasks.len() < vfs.cfg.upload_workers {
            let urgent = vfs.urgent.load(Ordering::SeqCst) > 0;
            let now = now_ns();
            // While the request path keeps queueing work (a burst: untar, git checkout,
            // npm install), uploads wait for a quiet moment so they do not compete with
            // it for CPU and the metadata engine; the data is safe in the local journal
            // meanwhile. A burst postpones an upload by at most BURST_DEFER.
            // Not while another mount waits for content of this cache (close-to-open
            // across caches): its open is blocked until the upload is done.
            let waiters = !vfs
                .uploader
                .serving
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty();
            let busy = !waiters
                && now - vfs.last_mark_ns.load(Ordering::Relaxed)
                    < vfs.cfg.upload_delay.max(vfs.cfg.burst_quiet).as_nanos() as i64;
            let held = busy && !urgent;
            let since = vfs.uploader.burst_since_ns.load(Ordering::Relaxed);
            if held && since == 0 {
                vfs.uploader.burst_since_ns.store(now, Ordering::Relaxed);
            } else if !held && since != 0 {
                vfs.uploader.burst_since_ns.store(0, Ordering::Relaxed);
            }
            let horizon = if urgent {
                i64::MAX
            } else if busy {
                now - BURST_DEFER.as_nanos() as i64
            } else if resuming {
                i64::MAX
            } else {
                now
            };
            // A wider window than the workers need: rows other mounts must do are skipped,
            // and the rest wait here for the next free worker (see `DueWindow`).
            let want = vfs.cfg.upload_workers * 32;
            // Shared with other mounts: rows another mount marked are its to upload (it
            // holds their content, and reconciling them here only to find that costs
            // database round trips on both sides); this mount steps in for a row only
            // OTHERS_GRACE past its due time, or at once under a barrier.
            let others = if vfs.shared() && horizon != i64::MAX {
                horizon.saturating_sub(OTHERS_GRACE.as_nanos() as i64)
            } else {
                horizon
            };
            let me = vfs.coherence.session();
            if window.wants_read(urgent, horizon) {
                match deskfs_meta::read(&*vfs.meta, |t| {
                    t.due_pending_for(horizon, want, me, others)
                }) {
                    Ok(mut rows) => {
                        if horizon == i64::MAX && !urgent {
                            if rows.len() < want {
                                resuming = false;
                            }
                            rows.retain(|r| r.due_ns <= now || r.seq <= resume_upto);
                        }
                        window.fill(rows, horizon)
                    }
                    Err(e) => {
                        window.fill(Vec::new(), horizon);
                        tracing::error!(error = %e, "uploader cannot read pending work")
                    }
                }
            }
            // During a burst, uploads that are due anyway (postponed BURST_DEFER) trickle
            // through a few workers instead of all of them.
            let workers = if busy && !urgent {
                BURST_WORKERS.min(vfs.cfg.upload_workers)
            } else {
                vfs.cfg.upload_workers
            };
            while tasks.len() < workers {
                let Some(row) = window.next() else { break };
                if row.due_ns > now && (row.attempts > 0 || vfs.uploader.deferred_past(&row, now)) {
                    // Failing, or deferred by its reconcile: keep its time even under a
                    // barrier.
                    continue;
                }
                if vfs.uploader.skips(&row.path) || !vfs.uploader.begin_upload(&row.path) {
                    continue;
                }
                let v = vfs.clone();
                tasks.push(async move {
                    let taken = row.clone();
                    let mine = process(&v, row).await;
                    (taken, mine)
                });
            }
        }
        let wanted_due = !vfs.coherence.notified()
            || vfs.uploader.wanted_hint.swap(false, Ordering::SeqCst)
            || last_wanted.elapsed() > Duration::from_secs(1);
        if !stopping && wanted_due {
            last_wanted = std::time::Instant::now();
            // Content other mounts wait for (close-to-open across caches): due now, once.
            let v = vfs.clone();
            let wanted = tokio::task::spawn_blocking(move || v.wanted_here())
                .await
                .unwrap_or_default();
            let fresh: Vec<Ino> = {
                let mut serving = vfs
                    .uploader
                    .serving
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let fresh: Vec<Ino> = wanted
                    .iter()
                    .copied()
                    .filter(|i| !serving.contains(i))
                    .collect();
                serving.retain(|i| wanted.contains(i));
                serving.extend(fresh.iter().copied());
                fresh
            };
            if !fresh.is_empty() {
                vfs.uploader.forget_elsewhere();
            }
            // New requests are made due; old ones are answered when their content turned
            // out clean or not held here (nothing left to upload).
            let v = vfs.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let older: Vec<Ino> = wanted.into_iter().filter(|i| !fresh.contains(i)).collect();
                v.serve_wanted(&fresh);
                v.settle_wanted(&older);
            })
            .await;
        }
        // Every 2 s; every 100 ms while the cache dir's file system is short of its
        // free-space reserve (writes through passthrough fill it without the daemon).
        let evict_every = if vfs.cache.space_short() > 0 {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(2)
        };
        if last_evict.elapsed() > evict_every {
            last_evict = std::time::Instant::now();
            let v = vfs.clone();
            let _ = tokio::task::spawn_blocking(move || v.evict()).await;
        }
        tokio::select! {
            Some((row, mine)) = tasks.next(), if !tasks.is_empty() => {
                vfs.uploader.end_upload(&row.path);
                vfs.uploader.found(&row, mine);
            }
            _ = vfs.uploader.notify.notified() => {}
            _ = tokio::time::sleep(IDLE_TICK) => {}
        }
    }
}

tokio::task_local! {
    /// The pending mark the running task reconciles (see [`Reconciling`]).
    static TASK: Reconciling;
}

/// What a reconcile task knows of itself beyond its row.
struct Reconciling {
    /// The sequence number of the pending mark it reconciles. Work it finds — a put that
    /// landed under a directory removed meanwhile, a put that raced with a delete — is
    /// marked under it ([`deskfs_meta::MetaTxn::remark_pending`]), so a sync barrier taken
    /// after that mark waits for the work too.
    seq: u64,
    /// The `kv` records announcing its puts ([`deskfs_meta::upload_key`]), removed with
    /// the outcome of the row (see [`announce`]).
    announced: std::sync::Mutex<Vec<String>>,
}

impl Reconciling {
    /// The announcements made so far, leaving none.
    fn take_announced(&self) -> Vec<String> {
        std::mem::take(&mut *self.announced.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Marks `path` pending again for work a reconcile found: under the reconciled mark's
/// sequence number `cause` (see [`Reconciling::seq`]) when known, else as a new mark.
fn remark(
    t: &mut dyn deskfs_meta::MetaTxn,
    path: &[u8],
    recursive: bool,
    cause: Option<u64>,
) -> Result<()> {
    match cause {
        Some(seq) => t.remark_pending(path, recursive, now_ns(), seq)?,
        None => {
            t.mark_pending(path, recursive, now_ns())?;
        }
    }
    Ok(())
}

/// The sequence number of the mark this task reconciles, if it runs under one.
fn mark_seq() -> Option<u64> {
    TASK.try_with(|t| t.seq).ok()
}

/// Announces to every mount of the workspace, before a PUT to `path` is sent, that an
/// object may land there that is this workspace's own (`kv` record
/// [`deskfs_meta::upload_key`], one per path and task): a listing imports no name with an
/// announced put at or under it (see `importer::OwnWork`), so a put that lands after its
/// path was removed is not taken for another tool's write by any mount — its pending row
/// may be finished by another mount meanwhile, and only this mount knows the PUT is in
/// flight. The record goes with the outcome of the task's row ([`process`]), after the
/// upload's own record (which marks any removal it landed under again). One small write
/// per uploaded path.
async fn announce(vfs: &Arc<Vfs>, path: &[u8]) -> Result<()> {
    let key = deskfs_meta::upload_key(path, vfs.coherence.session());
    let fresh = TASK
        .try_with(|t| {
            let mut a = t.announced.lock().unwrap_or_else(|p| p.into_inner());
            if a.contains(&key) {
                false
            } else {
                a.push(key.clone());
                true
            }
        })
        .unwrap_or(false);
    if fresh {
        blocking(vfs, move |v| {
            deskfs_meta::txn(&*v.meta, |t| t.set_kv(&key, "")).map_err(VfsError::from)
        })
        .await?;
    }
    Ok(())
}

/// Removes the announcements of puts (see [`announce`]) made by mount sessions no longer
/// registered: a daemon killed during a put leaves them. Listings ignore them already;
/// this keeps them from piling up. Returns how many went.
fn forget_stale_announcements(vfs: &Vfs) -> Result<usize> {
    Ok(deskfs_meta::txn(&*vfs.meta, |t| {
        let live: Vec<u64> = t.sessions()?.iter().map(|s| s.id).collect();
        let mut n = 0;
        for (k, _) in t.kv_with_prefix(deskfs_meta::UPLOADS_PREFIX)? {
            if deskfs_meta::upload_of(&k).is_some_and(|(_, s)| !live.contains(&s)) {
                t.delete_kv(&k)?;
                n += 1;
            }
        }
        Ok::<_, deskfs_meta::MetaError>(n)
    })?)
}

/// Removes the announcements `keys` (see [`announce`]) in transaction `t`.
fn withdraw(t: &mut dyn deskfs_meta::MetaTxn, keys: &[String]) -> deskfs_meta::Result<()> {
    for k in keys {
        t.delete_kv(k)?;
    }
    Ok(())
}

/// Reconciles one pending row and records the outcome. Returns false when the row is
/// another mount's to do ([`Outcome::Elsewhere`]).
async fn process(vfs: &Arc<Vfs>, row: PendingRow) -> bool {
    #[cfg(test)]
    vfs.uploader.reconciles.fetch_add(1, Ordering::Relaxed);
    let task = Reconciling {
        seq: row.seq,
        announced: Default::default(),
    };
    let (res, announced) = TASK
        .scope(task, async {
            let res = reconcile(vfs, &row).await;
            (res, TASK.with(Reconciling::take_announced))
        })
        .await;
    let now = now_ns();
    let path = row.path.clone();
    let gen = row.gen;
    let r = match res {
        Ok(Outcome::Elsewhere) => {
            // The row may be this mount's (it marked it: a rename of, or a repair to,
            // content another cache holds); the holder's uploader must take it now, not
            // only OTHERS_GRACE past due.
            let disown = vfs.shared();
            if disown || !announced.is_empty() {
                if let Err(e) = deskfs_meta::txn(&*vfs.meta, |t| {
                    withdraw(t, &announced)?;
                    if disown {
                        t.disown_pending(&path, gen)?;
                    }
                    Ok::<_, deskfs_meta::MetaError>(())
                }) {
                    tracing::debug!(error = %e, "cannot hand a pending row over to its holder");
                }
            }
            return false;
        }
        Ok(Outcome::Done) => {
            vfs.uploader.note_deferral(&path, gen, None, now);
            deskfs_meta::txn(&*vfs.meta, |t| {
                withdraw(t, &announced)?;
                t.finish_pending(&path, gen)
            })
        }
        Ok(Outcome::Defer(d)) => {
            let until = now.saturating_add(d.as_nanos() as i64);
            vfs.uploader.note_deferral(&path, gen, Some(until), now);
            deskfs_meta::txn(&*vfs.meta, |t| {
                withdraw(t, &announced)?;
                t.defer_pending(&path, gen, until)
            })
        }
        Err(e) => {
            vfs.uploader.note_deferral(&path, gen, None, now);
            let msg = e.to_string();
            tracing::warn!(path = %String::from_utf8_lossy(&path), attempts = row.attempts + 1, error = %msg, "upload failed; will retry");
            let retry = now + backoff(row.attempts);
            deskfs_meta::txn(&*vfs.meta, |t| {
                withdraw(t, &announced)?;
                t.fail_pending(&path, gen, &msg, retry)
            })
        }
    };
    if let Err(e) = r {
        tracing::error!(error = %e, "uploader cannot record progress");
    }
    true
}

async fn reconcile(vfs: &Arc<Vfs>, row: &PendingRow) -> Result<Outcome> {
    let mut outcome = Outcome::Done;
    let defer = |o: Outcome, acc: &mut Outcome| match o {
        Outcome::Elsewhere => *acc = Outcome::Elsewhere,
        Outcome::Defer(d) if !matches!(acc, Outcome::Elsewhere) => *acc = Outcome::Defer(d),
        _ => {}
    };
    if !row.recursive {
        return reconcile_one(vfs, &row.path).await;
    }
    let path = row.path.clone();
    let (children, self_dir, gone) = {
        let v = vfs.clone();
        tokio::task::spawn_blocking(move || -> Result<(BTreeSet<Vec<u8>>, bool, bool)> {
            let kids = subtree_paths(&v, &path)?;
            let (is_dir, gone) = deskfs_meta::read(&*v.meta, |t| {
                Ok::<_, crate::VfsError>(match resolve(t, &path)? {
                    Some(i) => (t.get_inode(i)?.is_some_and(|r| r.kind == Kind::Dir), false),
                    None => (false, true),
                })
            })?;
            Ok((kids, is_dir, gone))
        })
        .await
        .map_err(|e| VfsError::Io(std::io::Error::other(e.to_string())))??
    };
    // A directory now at `path`: its marker first (replacing whatever object was there),
    // then the children. Otherwise the children (deepest first) go before the path itself,
    // so directory markers are removed last.
    if self_dir {
        defer(reconcile_one(vfs, &row.path).await?, &mut outcome);
    }
    for p in children.iter().rev() {
        defer(reconcile_one(vfs, p).await?, &mut outcome);
    }
    if !self_dir {
        if gone && matches!(outcome, Outcome::Done) {
            sweep_removed_dir(vfs, &row.path).await?;
        }
        defer(reconcile_one(vfs, &row.path).await?, &mut outcome);
    }
    Ok(outcome)
}

/// After the recorded objects under a path that is no directory any more (removed or
/// renamed) are reconciled: deletes what the bucket still holds under it at paths the
/// namespace does not have — objects whose upload raced with their removal and were
/// left unrecorded, and (local bucket) the empty directories they leave, the removed
/// one included when nothing records it. Without this, a
/// removed directory's marker could never go (`file://`: "not empty yet") and the
/// leftovers came back as files at the next listing. One listing per removed directory;
/// paths the namespace has are never touched, nor anything under `.deskfs/`.
async fn sweep_removed_dir(vfs: &Arc<Vfs>, path: &[u8]) -> Result<()> {
    let key = vfs.key_for(path);
    if path.is_empty() || crate::paths::is_escaped(&key) {
        return Ok(());
    }
    #[cfg(test)]
    gate(vfs, path, GatePoint::Sweep, None).await;
    let listed = vfs.bucket.list_all(&key).await?;
    // Local bucket: its directories too (empty ones are not listed as objects), and the
    // removed directory itself: with no record of its own (its marker already deleted,
    // an upload landed under it since), nothing else would remove it.
    let mut dirs: BTreeSet<String> = vfs.bucket.local_dirs_under(&key)?.into_iter().collect();
    if vfs.bucket.is_local() {
        dirs.insert(key.clone());
    }
    let mut leftovers = Vec::new();
    for o in listed {
        if crate::paths::is_escaped(&o.key) || !o.key.starts_with(&format!("{key}/")) {
            continue;
        }
        let mut d = o.key.as_str();
        while let Some((parent, _)) = d.rsplit_once('/') {
            if parent.len() <= key.len() {
                break;
            }
            dirs.insert(parent.to_string());
            d = parent;
        }
        leftovers.push(o);
    }
    if leftovers.is_empty() && dirs.is_empty() {
        return Ok(());
    }
    let candidates: Vec<Vec<u8>> = leftovers
        .iter()
        .map(|o| o.key.as_bytes().to_vec())
        .chain(dirs.iter().map(|d| d.as_bytes().to_vec()))
        .collect();
    // Which of those paths the namespace has (or has a record of: that one is reconciled
    // by its own pending row).
    let keep: HashSet<Vec<u8>> = blocking(vfs, move |v| {
        deskfs_meta::read(&*v.meta, |t| {
            let mut keep = HashSet::new();
            for p in &candidates {
                if resolve(t, p)?.is_some() || t.get_object(p)?.is_some() {
                    keep.insert(p.clone());
                }
            }
            Ok::<_, crate::VfsError>(keep)
        })
    })
    .await?;
    if !leftovers.is_empty() {
        durable_before_delete(vfs).await?;
    }
    for o in &leftovers {
        if keep.contains(o.key.as_bytes()) {
            continue;
        }
        tracing::info!(key = %o.key, "removing an object left under a removed directory");
        vfs.bucket.delete(&o.key).await?;
        if o.size == 0 && !vfs.bucket.is_local() {
            // A `dir/` marker lists as `dir`.
            vfs.bucket.delete_dir_marker(&o.key).await?;
        }
    }
    if vfs.bucket.is_local() {
        // Deepest first: a directory goes once its leftovers did.
        let mut dirs: Vec<String> = dirs.into_iter().collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
        for d in dirs {
            if !keep.contains(d.as_bytes()) {
                vfs.bucket.delete_dir_marker(&d).await?;
            }
        }
    }
    Ok(())
}

/// Every path strictly under `path`: known objects plus the namespace subtree.
fn subtree_paths(vfs: &Vfs, path: &[u8]) -> Result<BTreeSet<Vec<u8>>> {
    let mut out = BTreeSet::new();
    deskfs_meta::read(&*vfs.meta, |t| {
        for o in t.objects_under(path, usize::MAX >> 1)? {
            out.insert(o.path);
        }
        if let Some(ino) = resolve(t, path)? {
            let mut stack: Vec<(Ino, Vec<u8>)> = vec![(ino, path.to_vec())];
            while let Some((dir, dpath)) = stack.pop() {
                let mut after = 0;
                loop {
                    let rows = t.list_dir(dir, after, 1024)?;
                    if rows.is_empty() {
                        break;
                    }
                    for (d, r) in rows {
                        after = d.cookie;
                        let p = join(&dpath, &d.name);
                        if r.kind == Kind::Dir {
                            stack.push((r.ino, p.clone()));
                        }
                        out.insert(p);
                    }
                }
            }
        }
        Ok::<_, crate::VfsError>(())
    })?;
    Ok(out)
}

fn posix_of(r: &InodeRow) -> PosixMeta {
    PosixMeta {
        mode: r.kind.ifmt() | r.perm,
        uid: r.uid,
        gid: r.gid,
        mtime_ns: r.mtime_ns,
        atime_ns: r.atime_ns,
        ctime_ns: r.ctime_ns,
    }
}

struct Snapshot {
    row: Option<InodeRow>,
    obj: Option<ObjectRow>,
    src: Option<ObjectRow>,
}

async fn blocking<T: Send + 'static>(
    vfs: &Arc<Vfs>,
    f: impl FnOnce(&Vfs) -> Result<T> + Send + 'static,
) -> Result<T> {
    let v = vfs.clone();
    tokio::task::spawn_blocking(move || f(&v))
        .await
        .map_err(|e| VfsError::Io(std::io::Error::other(e.to_string())))?
}

async fn snapshot(vfs: &Arc<Vfs>, path: &[u8]) -> Result<Snapshot> {
    let p = path.to_vec();
    blocking(vfs, move |v| {
        deskfs_meta::read(&*v.meta, |t| {
            let ino = resolve(t, &p)?;
            let row = match ino {
                Some(i) => t.get_inode(i)?,
                None => None,
            };
            let obj = t.get_object(&p)?;
            let src = match &row {
                Some(r) if r.kind == Kind::File => t.object_with_content(r.ino, r.data_version)?,
                _ => None,
            };
            Ok::<_, crate::VfsError>(Snapshot { row, obj, src })
        })
    })
    .await
}

/// Whether reconciling `snap` copies from, overwrites or deletes an object that may be
/// another inode's content (then it runs under the content lock).
fn touches_shared_content(snap: &Snapshot, here: Local) -> bool {
    let other_content = snap
        .obj
        .as_ref()
        .is_some_and(|o| o.kind == Kind::File && snap.row.as_ref().is_none_or(|r| r.ino != o.ino));
    let needs_copy = snap
        .row
        .as_ref()
        .is_some_and(|r| r.kind == Kind::File && r.local != here && r.size > 0);
    other_content || needs_copy
}

/// Reconciles one path with the bucket.
async fn reconcile_one(vfs: &Arc<Vfs>, path: &[u8]) -> Result<Outcome> {
    let snap = snapshot(vfs, path).await?;
    if touches_shared_content(&snap, vfs.here()) {
        let _guard = vfs.uploader.content_lock.lock().await;
        // Re-read under the lock: another reconcile may have moved content meanwhile.
        let snap = snapshot(vfs, path).await?;
        return apply(vfs, path, snap).await;
    }
    apply(vfs, path, snap).await
}

async fn apply(vfs: &Arc<Vfs>, path: &[u8], snap: Snapshot) -> Result<Outcome> {
    let key = vfs.key_for(path);
    let Some(r) = snap.row else {
        // Nothing at this path any more: remove what the bucket holds there.
        if let Some(obj) = snap.obj {
            remove_object(vfs, &obj).await?;
        }
        return Ok(Outcome::Done);
    };
    if let Some(obj) = &snap.obj {
        let was_dir = obj.kind == Kind::Dir;
        if was_dir != (r.kind == Kind::Dir) || obj.key != key {
            remove_object(vfs, obj).await?;
        }
    }
    let obj = match &snap.obj {
        Some(o) if (o.kind == Kind::Dir) == (r.kind == Kind::Dir) && o.key == key => {
            Some(o.clone())
        }
        _ => None,
    };
    let meta = posix_of(&r);
    match r.kind {
        Kind::Dir => {
            if obj.as_ref().is_some_and(|o| o.meta_stamp == r.ctime_ns) {
                return Ok(Outcome::Done);
            }
            announce(vfs, path).await?;
            let put = vfs.bucket.put_dir_marker(&key, Some(&meta)).await?;
            record(vfs, path, &key, &r, r.data_version, put.etag, 0).await?;
            Ok(Outcome::Done)
        }
        Kind::File => reconcile_file(vfs, path, &key, r, obj, snap.src, &snap.obj).await,
        Kind::Symlink => {
            if obj
                .as_ref()
                .is_some_and(|o| o.ino == r.ino && o.meta_stamp == r.ctime_ns)
            {
                return Ok(Outcome::Done);
            }
            let body = Bytes::from(r.target.clone().unwrap_or_default());
            announce(vfs, path).await?;
            let put = vfs.bucket.put_bytes(&key, body, Some(&meta)).await?;
            record(vfs, path, &key, &r, r.data_version, put.etag, r.size).await?;
            Ok(Outcome::Done)
        }
        Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev => {
            if obj
                .as_ref()
                .is_some_and(|o| o.ino == r.ino && o.meta_stamp == r.ctime_ns)
            {
                return Ok(Outcome::Done);
            }
            announce(vfs, path).await?;
            let put = vfs
                .bucket
                .put_bytes(&key, Bytes::new(), Some(&meta))
                .await?;
            record(vfs, path, &key, &r, r.data_version, put.etag, 0).await?;
            Ok(Outcome::Done)
        }
    }
}

async fn reconcile_file(
    vfs: &Arc<Vfs>,
    path: &[u8],
    key: &str,
    r: InodeRow,
    obj: Option<ObjectRow>,
    src: Option<ObjectRow>,
    prior: &Option<ObjectRow>,
) -> Result<Outcome> {
    if let Some(o) = &obj {
        if o.ino == r.ino && o.data_version == r.data_version && o.meta_stamp == r.ctime_ns {
            // Not while passthrough writers are open: the staging file may differ any
            // moment (their last close asks again).
            if r.dirty {
                match vfs.passthrough_writers(r.ino) {
                    Some(0) => mark_clean(vfs, r.ino, r.data_version, None).await?,
                    Some(_) => {}
                    None => return Ok(Outcome::Defer(Duration::from_millis(50))),
                }
            }
            served(vfs, r.ino).await;
            return Ok(Outcome::Done);
        }
        if o.ino == r.ino && o.data_version == r.data_version && !vfs.bucket.supports_metadata() {
            // Only attributes changed and the bucket keeps none: nothing to send.
            record(vfs, path, key, &r, r.data_version, o.etag.clone(), o.size).await?;
            return Ok(Outcome::Done);
        }
    }
    // A file still being written: wait for its close (bounded).
    let st = vfs.inodes.lock().ok().and_then(|m| m.get(&r.ino).cloned());
    let mut gen0 = None;
    let mut own_writes = false;
    if let Some(st) = st {
        // Never wait for the inode's lock on a runtime thread: its holder (a request
        // downloading content, say) may itself wait for this runtime (`block_on`).
        let mut guard = match st.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Ok(Outcome::Defer(Duration::from_millis(50)))
            }
            Err(std::sync::TryLockError::Poisoned(_)) => None,
        };
        if let Some(s) = guard.as_mut() {
            if s.uncommitted && now_ns() - s.dirty_since_ns < MAX_DEFER_NS {
                return Ok(Outcome::Defer(Duration::from_secs(1)));
            }
            // Created here for writing, not written yet: wait for that write (bounded);
            // past the bound the next write marks the row dirty itself again.
            if let Some(t) = s.create_guard {
                if now_ns() - t < MAX_DEFER_NS {
                    return Ok(Outcome::Defer(Duration::from_secs(1)));
                }
                if s.uncommitted {
                    s.create_guard = None;
                } else {
                    s.writes_settled();
                }
            }
            gen0 = Some(s.write_gen);
            // This mount's passthrough backing file holds a writer `flock` of its own.
            own_writes = s.uncommitted || s.pt.holds_writer_flock();
        }
    }
    // Content only another mount's cache holds: its uploader does this path.
    if r.size > 0 && src.is_none() && r.local != vfs.here() && r.local != Local::None {
        return Ok(Outcome::Elsewhere);
    }
    // Overwriting another inode's object: keep that content if it is its last copy.
    if let Some(o) = &snap_other(&obj, r.ino) {
        preserve_content(vfs, o).await?;
    }
    let meta = posix_of(&r);
    if r.local == vfs.here() && vfs.cache.has_staging(r.ino) {
        let staging = vfs.cache.staging_path(r.ino);
        // While read by path, a purge deletes the file instead of recycling it.
        let _reading = vfs.cache.read_guard(r.ino);
        let Some(probe) = StagingProbe::open(&staging, own_writes)? else {
            // A mount sharing this cache dir is uploading this file right now: two puts
            // of one path racing could leave the record naming the other's object.
            return Ok(Outcome::Defer(Duration::from_millis(200)));
        };
        let Some(before) = probe.look()? else {
            // Another mount sharing this cache dir has uncommitted writes to it: its
            // commit re-marks the path (and its own uploader bounds the deferral).
            return Ok(Outcome::Defer(Duration::from_secs(1)));
        };
        if let Some(out) = bucket_side_check(vfs, path, key, &r, obj.as_ref()).await? {
            return Ok(out);
        }
        announce(vfs, path).await?;
        #[cfg(test)]
        gate(vfs, path, GatePoint::Put, Some(r.size)).await;
        let put = vfs.put_staging(key, &staging, Some(&meta)).await?;
        // The staging file may have changed while it was read: only a file whose version,
        // write generation and on-disk times held still is recorded as that version.
        let (gen1, pt_writers) = vfs
            .inodes
            .lock()
            .ok()
            .and_then(|m| m.get(&r.ino).cloned())
            .map(|st| {
                st.try_lock()
                    .map(|s| (Some(s.write_gen), s.pt.writers()))
                    .unwrap_or((Some(u64::MAX), 1))
            })
            .unwrap_or((None, 0));
        let steady = (gen0.is_none() || gen0 == gen1) && probe.look()? == Some(before);
        // Truncated or extended since the snapshot: the commit re-marked the path.
        if !steady || put.size != r.size {
            // The object now holds bytes of no recorded version: recorded as holding
            // none (so no reader uses it, and a later delete finds it), done again.
            record(vfs, path, key, &r, 0, put.etag, put.size).await?;
            return Ok(Outcome::Defer(Duration::from_millis(200)));
        }
        #[cfg(test)]
        gate(vfs, path, GatePoint::Record, Some(r.size)).await;
        // Open for writing through passthrough: the kernel may write the staging file at
        // any moment without the daemon seeing it, so the row stays dirty (recorded, not
        // clean) until those handles close; `after_clean` catches an open that raced.
        let clean = pt_writers == 0;
        if clean {
            flush_staging(vfs, r.ino).await?;
        }
        let out = record_upload(vfs, path, key, &r, prior, put.etag, put.size, clean).await?;
        if matches!(out, Outcome::Done) {
            served(vfs, r.ino).await;
        }
        return Ok(out);
    }
    if r.size == 0 {
        if let Some(out) = bucket_side_check(vfs, path, key, &r, obj.as_ref()).await? {
            return Ok(out);
        }
        announce(vfs, path).await?;
        let put = vfs.bucket.put_bytes(key, Bytes::new(), Some(&meta)).await?;
        return record_upload(vfs, path, key, &r, prior, put.etag, 0, true).await;
    }
    match src {
        Some(s) if s.key != key => {
            announce(vfs, path).await?;
            #[cfg(test)]
            gate(vfs, path, GatePoint::Put, Some(r.size)).await;
            vfs.bucket.copy(&s.key, key).await?;
            let etag = vfs.bucket.head(key).await?.and_then(|h| h.etag);
            record_upload(vfs, path, key, &r, prior, etag, r.size, false).await
        }
        Some(_) => {
            // Same object, new attributes, content not local: fetch it, then re-upload.
            let row = r.clone();
            blocking(vfs, move |v| v.make_local(&row)).await?;
            Ok(Outcome::Defer(Duration::from_millis(1)))
        }
        None => Err(VfsError::Io(std::io::Error::other(format!(
            "content of inode {} (version {}) is neither local nor in the bucket",
            r.ino, r.data_version
        )))),
    }
}

/// Where a test holds an upload of one path ([`PutGate`]).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GatePoint {
    /// After the checks, before the PUT of a staging file (or the server-side COPY of an
    /// object holding its content).
    Put,
    /// Before the DELETE of the object recorded at the path (after the content check and
    /// the flush of the commits that removed the name).
    Delete,
    /// After that PUT landed, before it is recorded.
    Record,
    /// Before the sweep of what the bucket holds under a removed directory (the gate's
    /// path is the directory's).
    Sweep,
}

/// A test's hold on this mount's upload of one path at one point, so two mounts' puts
/// of one key can be made to land and be recorded in a chosen order (or a sweep be held).
#[cfg(test)]
pub(crate) struct PutGate {
    pub(crate) path: Vec<u8>,
    pub(crate) point: GatePoint,
    /// Only an upload of this size (the row's, as the upload read it) is held: a test
    /// holding the upload of a rewrite is not given the upload of the `O_TRUNC` before it.
    pub(crate) size: Option<u64>,
    /// Set when the upload reached the point (it waits there).
    pub(crate) reached: AtomicBool,
    /// Set by the test to let it go on.
    pub(crate) released: AtomicBool,
}

#[cfg(test)]
async fn gate(vfs: &Arc<Vfs>, path: &[u8], point: GatePoint, size: Option<u64>) {
    let g = vfs
        .uploader
        .gates
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|g| g.path == path && g.point == point && (g.size.is_none() || g.size == size))
        .cloned();
    if let Some(g) = g {
        g.reached.store(true, Ordering::SeqCst);
        while !g.released.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        vfs.uploader
            .gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|x| !Arc::ptr_eq(x, &g));
    }
}

/// How long an unrecorded ETag found at a path is given to be recorded (a PUT of another
/// reconcile of the path, landed but not recorded yet) before it counts as another
/// tool's write.
const FOREIGN_GRACE: Duration = Duration::from_secs(1);

/// Before new content of `r` overwrites the object recorded at `path` for the same inode:
/// a HEAD. When the bucket holds another version than the recorded one (another tool
/// replaced it; a changed ETag still unrecorded after [`FOREIGN_GRACE`]), that version is
/// kept beside the file first ([`Vfs::save_bucket_version`]). `Some(outcome)` when the
/// upload must wait; `None` to go on.
impl Vfs {
    /// [`deskfs_bucket::Bucket::put_file`] of a staging file, holding its upload
    /// buffers' share of the buffer budget (see [`crate::buffers`]) while it runs.
    pub(crate) async fn put_staging(
        &self,
        key: &str,
        staging: &std::path::Path,
        meta: Option<&PosixMeta>,
    ) -> std::result::Result<deskfs_bucket::PutInfo, deskfs_bucket::BucketError> {
        let len = tokio::fs::metadata(staging).await?.len();
        let bytes = self.bucket.put_file_buffer_bytes(len);
        let _held = match bytes {
            0 => None,
            n => Some(self.buffers.reserve(n).await),
        };
        self.bucket.put_file(key, staging, meta).await
    }
}

async fn bucket_side_check(
    vfs: &Arc<Vfs>,
    path: &[u8],
    key: &str,
    r: &InodeRow,
    obj: Option<&ObjectRow>,
) -> Result<Option<Outcome>> {
    let Some(o) = obj.filter(|o| o.ino == r.ino && o.key == key) else {
        return Ok(None);
    };
    let Some(recorded) = o.etag.as_deref() else {
        return Ok(None);
    };
    if recorded.ends_with("-replaced\"") {
        return Ok(None); // local bucket: an ETag no object has (see deskfs-bucket)
    }
    let Some(head) = vfs.bucket.head(key).await? else {
        return Ok(None); // deleted by another tool: the local version goes up
    };
    let Some(now) = head.etag.filter(|e| e != recorded) else {
        return Ok(None);
    };
    // A PUT of this path by another reconcile (here or another mount) may have landed
    // and be about to be recorded: given a moment.
    let first = {
        let mut seen = vfs
            .uploader
            .foreign_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seen.len() > 4096 {
            seen.clear();
        }
        let e = seen
            .entry(path.to_vec())
            .or_insert_with(|| (now.clone(), Instant::now()));
        if e.0 != now {
            *e = (now.clone(), Instant::now());
        }
        e.1
    };
    if first.elapsed() < FOREIGN_GRACE {
        return Ok(Some(Outcome::Defer(FOREIGN_GRACE)));
    }
    let f = crate::external::Foreign {
        path: path.to_vec(),
        key: key.to_string(),
        recorded: o.clone(),
        etag: now,
    };
    let saved = vfs.save_bucket_version(&f).await?;
    vfs.uploader
        .foreign_seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(path);
    Ok(match saved {
        Some(_) => None,
        None => Some(Outcome::Defer(Duration::from_millis(200))),
    })
}

/// The uploader's look at a staging file around its upload: whether a mount sharing the
/// cache dir holds uncommitted writes to it, and its size and times (any write changes
/// them). While it lives it holds the file's upload lock (an OFD byte-range lock, which
/// Linux keeps apart from the writers' `flock`), so the mounts sharing the cache dir
/// upload one file one at a time.
struct StagingProbe {
    file: std::fs::File,
    /// This mount's own uncommitted writes are allowed (their deferral ran out).
    own_writes: bool,
}

impl StagingProbe {
    /// The probe, or `None` while another mount sharing the cache dir uploads the file.
    fn open(path: &std::path::Path, own_writes: bool) -> Result<Option<StagingProbe>> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::options().read(true).write(true).open(path)?;
        let lk = libc::flock {
            l_type: libc::F_WRLCK as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: 0,
            l_len: 1,
            l_pid: 0,
        };
        // SAFETY: fcntl on an open fd owned by `file`, with a valid `flock` struct.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lk) } != 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(None),
                _ => Err(e.into()),
            };
        }
        Ok(Some(StagingProbe { file, own_writes }))
    }

    /// `(size, mtime ns, ctime ns)` now, or `None` while another mount has uncommitted
    /// writes to the file.
    fn look(&self) -> Result<Option<(u64, i64, i64)>> {
        use std::os::unix::fs::MetadataExt;
        if !self.own_writes && !crate::handles::no_uncommitted_writers(&self.file)? {
            return Ok(None);
        }
        let m = self.file.metadata()?;
        Ok(Some((
            m.size(),
            m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        )))
    }
}

fn snap_other(obj: &Option<ObjectRow>, ino: Ino) -> Option<ObjectRow> {
    obj.as_ref()
        .filter(|o| o.ino != ino && o.kind == Kind::File)
        .cloned()
}

/// Before the object `o` is overwritten or deleted: if it holds the current content of a
/// live inode that has no local copy, download that content first.
async fn preserve_content(vfs: &Arc<Vfs>, o: &ObjectRow) -> Result<()> {
    if o.kind != Kind::File || o.ino == 0 {
        return Ok(());
    }
    let o = o.clone();
    blocking(vfs, move |v| {
        let row = deskfs_meta::read(&*v.meta, |t| t.get_inode(o.ino))?;
        let Some(row) = row else { return Ok(()) };
        let live = row.nlink > 0 || v.is_open(row.ino);
        if !live || row.local == v.here() || row.data_version != o.data_version || row.size == 0 {
            return Ok(());
        }
        v.make_local(&row)
    })
    .await
}

/// Makes the commits that led to a delete (an unlink, a rename: all before now) durable
/// before the bucket loses the object: after a power loss the database must not come
/// back naming it. Concurrent deletes share one flush (see `meta_flush`).
async fn durable_before_delete(vfs: &Arc<Vfs>) -> Result<()> {
    let since = std::time::Instant::now();
    blocking(vfs, move |v| v.durable_since(since)).await
}

async fn remove_object(vfs: &Arc<Vfs>, o: &ObjectRow) -> Result<()> {
    preserve_content(vfs, o).await?;
    durable_before_delete(vfs).await?;
    #[cfg(test)]
    gate(vfs, &o.path, GatePoint::Delete, None).await;
    if o.kind == Kind::Dir {
        vfs.bucket.delete_dir_marker(&o.key).await?;
    } else {
        vfs.bucket.delete(&o.key).await?;
    }
    let removed = o.clone();
    let cause = mark_seq();
    let changed = blocking(vfs, move |v| {
        deskfs_meta::txn(&*v.meta, |t| forget_removed(t, &removed))
    })
    .await?;
    if let Some(cur) = changed {
        // A PUT to this key raced with the DELETE. If the DELETE came second, the newer
        // record names an object that is gone: it is recorded as holding no version (so
        // no reader uses it and the reconcile uploads again).
        if cur.kind != Kind::Dir && vfs.bucket.head(&cur.key).await?.is_none() {
            blocking(vfs, move |v| {
                deskfs_meta::txn(&*v.meta, |t| {
                    if t.get_object(&cur.path)?.as_ref() == Some(&cur) {
                        t.put_object(&ObjectRow {
                            data_version: 0,
                            etag: None,
                            ..cur.clone()
                        })?;
                        remark(t, &cur.path, false, cause)?;
                        sweep_again_if_removed(t, &cur.path, cause)?;
                    }
                    Ok::<_, crate::VfsError>(())
                })?;
                Ok(())
            })
            .await?;
        }
    }
    Ok(())
}

/// After the object of `removed` was deleted from the bucket: forgets its record, unless
/// the record changed meanwhile. A changed record is a PUT to the same key that may have
/// landed after the DELETE (another reconcile of the path, here or in another mount): the
/// record stays, and the path is marked pending again so the bucket is looked at once
/// more. (Forgetting that newer record left its object in the bucket unrecorded: nothing
/// removed it any more, and a removed directory's marker could never go.)
/// Returns the changed record.
pub(crate) fn forget_removed(
    t: &mut dyn deskfs_meta::MetaTxn,
    removed: &ObjectRow,
) -> Result<Option<ObjectRow>> {
    match t.get_object(&removed.path)? {
        Some(cur) if cur == *removed => {
            t.delete_object(&removed.path)?;
            Ok(None)
        }
        Some(cur) => {
            t.mark_pending(&removed.path, false, now_ns())?;
            Ok(Some(cur))
        }
        None => Ok(None),
    }
}

async fn record(
    vfs: &Arc<Vfs>,
    path: &[u8],
    key: &str,
    r: &InodeRow,
    version: u64,
    etag: Option<String>,
    size: u64,
) -> Result<()> {
    let row = ObjectRow {
        path: path.to_vec(),
        key: key.to_string(),
        ino: r.ino,
        kind: r.kind,
        data_version: version,
        meta_stamp: r.ctime_ns,
        etag,
        size,
    };
    blocking(vfs, move |v| {
        deskfs_meta::txn(&*v.meta, |t| record_in(t, &row))?;
        Ok(())
    })
    .await
}

/// Records `row` as what the bucket holds at its path, in transaction `t`. The namespace
/// may have moved on while the object was being written (an unlink, rename or rmdir
/// raced with the PUT, and another reconcile of the path may have finished meanwhile):
/// then the path is marked pending again, so a reconcile that starts after the object
/// landed removes or redoes it. One more statement (`paths_of`) per recorded upload.
pub(crate) fn record_in(t: &mut dyn deskfs_meta::MetaTxn, row: &ObjectRow) -> Result<()> {
    t.put_object(row)?;
    if !t.paths_of(row.ino)?.contains(&row.path) {
        t.mark_pending(&row.path, false, now_ns())?;
    }
    Ok(())
}

/// What [`record_checked`] found about a put it was asked to record.
#[derive(Debug, PartialEq, Eq)]
enum Landing {
    /// Recorded; `Some(size)` when that also marked the inode clean.
    Recorded(Option<u64>),
    /// Another put may have raced with this one: a HEAD must tell whose object is in the
    /// bucket before anything is recorded.
    Unverified,
    /// Not the newest content of the path (any more): recorded if its object is in place
    /// (so the record tells the truth), and the path marked for its newest content.
    Superseded,
    /// The newest content, but another put replaced its object: the path is marked and
    /// this upload done again.
    Overwritten,
}

/// Records the put (or copy) of `r`'s content version at `path` (object `key`, ETag
/// `etag`, `size` bytes) and, with `clean`, marks the inode clean — in one transaction,
/// and only for an object the bucket holds. The bucket has no conditional PUT deskfs can
/// rely on (Garage ignores `If-Match` on PUT; `file://` has none), so two mounts can put
/// one key at once — one an older version (its reconcile began before the other mount
/// took the content over) that may land last. Without a check the newer version's record
/// and clean flag named an object the bucket no longer held: conditional reads failed
/// for `remote_wait` and then with `EIO`, and the only copy of the newer content, its
/// holder's staging file, was evictable (91-bucket-convergence, seed 55).
///
/// Cost on the common path: none beyond the record's reads. A HEAD is made only when
/// something raced: the path's record changed since the reconcile's snapshot `before`
/// (another put was recorded meanwhile), or the version put is no longer the inode's or
/// the path no longer names it. A `file://` put whose object another put replaced
/// before its ETag was read ([`deskfs_bucket::PutInfo::replaced`]) needs none.
/// The uploader that learns its put landed over newer content (a superseded one, found
/// in place) records what the bucket really holds and makes the newest content's holder
/// upload it again, its inode dirty (so never evicted) until then.
#[allow(clippy::too_many_arguments)]
async fn record_upload(
    vfs: &Arc<Vfs>,
    path: &[u8],
    key: &str,
    r: &InodeRow,
    before: &Option<ObjectRow>,
    etag: Option<String>,
    size: u64,
    clean: bool,
) -> Result<Outcome> {
    let replaced = deskfs_bucket::PutInfo {
        etag: etag.clone(),
        size,
    }
    .replaced();
    let row = ObjectRow {
        path: path.to_vec(),
        key: key.to_string(),
        ino: r.ino,
        kind: r.kind,
        data_version: r.data_version,
        meta_stamp: r.ctime_ns,
        etag,
        size,
    };
    // `Some(in place)` once the bucket was asked (or the put itself told).
    let mut verified = replaced.then_some(false);
    let cause = mark_seq();
    loop {
        let (rw, before) = (row.clone(), before.clone());
        let landing = blocking(vfs, move |v| {
            v.clean_locked(
                rw.ino,
                || {
                    deskfs_meta::txn(&*v.meta, |t| {
                        record_checked(t, &rw, &before, verified, clean, cause)
                    })
                },
                |l| matches!(l, Landing::Recorded(Some(_))),
            )
        })
        .await?;
        match landing {
            Landing::Unverified if verified.is_none() => {
                let held = vfs.bucket.head(key).await?.and_then(|h| h.etag);
                let in_place = held.is_some() && held == row.etag;
                if !in_place {
                    tracing::info!(
                        key,
                        ino = r.ino,
                        version = r.data_version,
                        "another put of this key landed after ours"
                    );
                }
                verified = Some(in_place);
            }
            Landing::Unverified => {
                return Err(VfsError::Io(std::io::Error::other(
                    "uploader: a verified put asked for verification again",
                )))
            }
            Landing::Recorded(cleaned) => {
                if let Some(sz) = cleaned {
                    blocking(vfs, move |v| {
                        v.after_clean(row.ino, row.data_version, sz);
                        Ok(())
                    })
                    .await?;
                }
                return Ok(Outcome::Done);
            }
            Landing::Superseded => return Ok(Outcome::Done),
            Landing::Overwritten => return Ok(Outcome::Defer(Duration::from_millis(200))),
        }
    }
}

/// The transaction of [`record_upload`]: records `row` (and marks its inode clean with
/// `clean`) when nothing raced with its put or `verified` says its object is in place;
/// see [`Landing`] for the rest. Work found is marked under `cause` (see [`remark`]).
fn record_checked(
    t: &mut dyn deskfs_meta::MetaTxn,
    row: &ObjectRow,
    before: &Option<ObjectRow>,
    verified: Option<bool>,
    clean: bool,
    cause: Option<u64>,
) -> Result<Landing> {
    let now = t.get_object(&row.path)?;
    let inode = t.get_inode(row.ino)?;
    let named = t.paths_of(row.ino)?.contains(&row.path);
    let current = named
        && inode
            .as_ref()
            .is_some_and(|i| i.data_version == row.data_version);
    match verified {
        None if now != *before || !current => return Ok(Landing::Unverified),
        Some(false) if current => {
            remark(t, &row.path, false, cause)?;
            return Ok(Landing::Overwritten);
        }
        Some(false) => {
            sweep_again_if_removed(t, &row.path, cause)?;
            return Ok(Landing::Superseded);
        }
        _ => {}
    }
    record_in(t, row)?;
    if !current {
        // Our object replaced the path's newest content (or is about to be replaced by
        // it): the record says what the bucket holds, and the holder of the newest
        // content uploads it again — dirty until then, so its copy is never evicted.
        remark(t, &row.path, false, cause)?;
        sweep_again_if_removed(t, &row.path, cause)?;
        if let Some(ino) = resolve(t, &row.path)? {
            if let Some(mut i) = t.get_inode(ino)? {
                if i.kind == Kind::File && !i.dirty && matches!(i.local, Local::At(_)) {
                    i.dirty = true;
                    t.update_inode(&i)?;
                }
            }
        }
        return Ok(Landing::Superseded);
    }
    match inode {
        Some(mut i) if clean && i.dirty && i.size == row.size => {
            i.dirty = false;
            t.update_inode(&i)?;
            Ok(Landing::Recorded(Some(i.size)))
        }
        _ => Ok(Landing::Recorded(None)),
    }
}

/// After a put to `path` that is not the path's current content landed: when a
/// directory above `path` was removed meanwhile, its removal is reconciled again, so
/// what the put left there goes too (the object if it is still there, and a local
/// bucket's directories, which a put creates and a delete of the object leaves). The
/// removal is marked under `cause` (see [`remark`]).
fn sweep_again_if_removed(
    t: &mut dyn deskfs_meta::MetaTxn,
    path: &[u8],
    cause: Option<u64>,
) -> Result<()> {
    if let Some(gone) = first_missing_ancestor(t, path)? {
        remark(t, &gone, true, cause)?;
    }
    Ok(())
}

/// The shallowest directory path above `path` that the namespace does not have (`a/b`
/// for `a/b/c/f` when `a` exists and `a/b` does not); `None` when every ancestor exists.
fn first_missing_ancestor(
    t: &mut dyn deskfs_meta::MetaTxn,
    path: &[u8],
) -> Result<Option<Vec<u8>>> {
    let mut end = 0;
    while let Some(i) = path[end..].iter().position(|&b| b == b'/') {
        let dir = &path[..end + i];
        if resolve(t, dir)?.is_none() {
            return Ok(Some(dir.to_vec()));
        }
        end += i + 1;
    }
    Ok(None)
}

/// If another mount waits for `ino`'s content, tell it the upload is done.
async fn served(vfs: &Arc<Vfs>, ino: Ino) {
    let was = vfs
        .uploader
        .serving
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&ino);
    if was {
        let v = vfs.clone();
        let _ = tokio::task::spawn_blocking(move || v.uploaded(ino)).await;
    }
}

/// Flushes `ino`'s staging file before its row may say clean. A clean row's local copy is
/// what the next open reads (passthrough included), and after a power loss recovery
/// adopts only dirty staging files: one uploaded but still in the page cache could come
/// back short or as zeros and be served as the file — or uploaded over the good object at
/// its next change. A failed flush fails the upload (the row stays dirty, retried).
async fn flush_staging(vfs: &Arc<Vfs>, ino: Ino) -> Result<()> {
    blocking(vfs, move |v| Ok(v.cache.sync_staging(ino)?)).await
}

async fn mark_clean(vfs: &Arc<Vfs>, ino: Ino, version: u64, size: Option<u64>) -> Result<()> {
    flush_staging(vfs, ino).await?;
    blocking(vfs, move |v| {
        let txn = || {
            deskfs_meta::txn(&*v.meta, |t| {
                if let Some(mut cur) = t.get_inode(ino)? {
                    if cur.data_version == version
                        && cur.dirty
                        && size.is_none_or(|s| s == cur.size)
                    {
                        cur.dirty = false;
                        t.update_inode(&cur)?;
                        return Ok::<_, crate::VfsError>(Some(cur.size));
                    }
                }
                Ok(None)
            })
        };
        let clean = v.clean_locked(ino, txn, |c| c.is_some())?;
        if let Some(sz) = clean {
            v.after_clean(ino, version, sz);
        }
        Ok(())
    })
    .await
}

impl Vfs {
    /// Of the inodes `inos` (clean staging files about to be evicted), those whose
    /// current content the bucket verifiably holds: a HEAD of the object recorded for it
    /// answers its recorded ETag (up to 16 at once; empty files need none). A staging
    /// file may be the last copy of its content, and an object can be replaced by another
    /// mount's put of an older version after the record (see [`record_upload`]; its
    /// uploader normally repairs that at once, but it may have died first). One found
    /// not held is made dirty again, its record made to name no version and its paths
    /// pending: this cache uploads it again.
    /// Costs one HEAD per evicted file, only when the cache is over its cap.
    fn held_in_bucket(&self, inos: &[Ino]) -> HashSet<Ino> {
        let here = self.here();
        let mut held = HashSet::new();
        let mut lost = Vec::new();
        let mut ask = Vec::new();
        let looked = deskfs_meta::read(&*self.meta, |t| {
            let mut out = Vec::new();
            for &ino in inos {
                let Some(r) = t.get_inode(ino)? else { continue };
                if r.local != here || r.dirty || r.kind != Kind::File {
                    continue; // not evicted anyway
                }
                out.push((r.clone(), t.object_with_content(ino, r.data_version)?));
            }
            Ok::<_, crate::VfsError>(out)
        });
        match looked {
            Ok(rows) => {
                for (r, o) in rows {
                    match o {
                        _ if r.size == 0 => {
                            held.insert(r.ino);
                        }
                        Some(o) => ask.push((r, o)),
                        None => lost.push((r, None)),
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "eviction cannot read records");
                return held;
            }
        }
        let answers: Vec<(InodeRow, ObjectRow, bool)> = self.rt.block_on(
            futures::stream::iter(ask)
                .map(|(r, o)| async move {
                    match self.bucket.head(&o.key).await {
                        Ok(h) => {
                            let ok = h.and_then(|h| h.etag) == o.etag;
                            Some((r, o, ok))
                        }
                        Err(e) => {
                            tracing::debug!(key = %o.key, error = %e, "no eviction: the bucket did not answer");
                            None
                        }
                    }
                })
                .buffer_unordered(16)
                .filter_map(|x| async move { x })
                .collect(),
        );
        for (r, o, ok) in answers {
            if ok {
                held.insert(r.ino);
            } else {
                lost.push((r, Some(o)));
            }
        }
        for (r, o) in lost {
            tracing::warn!(ino = r.ino, version = r.data_version, "the bucket does not hold this clean file's content (another put replaced it): kept and uploaded again");
            let res = deskfs_meta::txn(&*self.meta, |t| {
                if let Some(mut cur) = t.get_inode(r.ino)? {
                    if cur.data_version == r.data_version && cur.local == here && !cur.dirty {
                        cur.dirty = true;
                        t.update_inode(&cur)?;
                        // The record names no version any more (no reader or uploader
                        // takes it for this content); its ETag stays, so the bytes found
                        // in its place are kept beside the file before the upload.
                        if let Some(o) = &o {
                            if t.get_object(&o.path)?.as_ref() == Some(o) {
                                t.put_object(&ObjectRow {
                                    data_version: 0,
                                    ..o.clone()
                                })?;
                            }
                        }
                        for p in t.paths_of(r.ino)? {
                            t.mark_pending(&p, false, now_ns())?;
                        }
                    }
                }
                Ok::<_, crate::VfsError>(())
            });
            if let Err(e) = res {
                tracing::warn!(ino = r.ino, error = %e, "cannot queue the upload again");
            }
        }
        held
    }

    /// After `ino` was marked clean at content `version` (`size` bytes): its staging file
    /// becomes evictable (once closed, if open).
    /// A passthrough writer opened meanwhile (it saw the row still dirty and did not mark
    /// it): the row is marked dirty again.
    fn after_clean(&self, ino: Ino, version: u64, size: u64) {
        if !self.is_open(ino) {
            self.cache.staging_clean(ino, size);
        } else {
            let st = self.inodes.lock().ok().and_then(|m| m.get(&ino).cloned());
            if let Some(st) = st {
                if let Ok(mut s) = st.lock() {
                    if s.pt.writers() > 0 {
                        s.pt.marked_dirty = true;
                        match self.mark_dirty(ino) {
                            Ok(()) => s.dirty_mark.committed(self.coherence.alone_period()),
                            Err(e) => {
                                tracing::warn!(ino, error = %e, "cannot mark a file open for passthrough writes dirty again");
                            }
                        }
                        return;
                    }
                    s.clean_at_close = Some(version);
                }
            }
        }
    }

    /// A clean staging file (content `version`, `size` bytes) an eviction round found
    /// open here, or busy (its state locked by a request, which [`Vfs::is_open`] counts
    /// as open): evictable again at its last close, unless written meanwhile; not open
    /// once the lock is had: evictable now. Else it would stay off the cache's clean list
    /// until its next upload, and the cache over its cap.
    fn evictable_at_close(&self, ino: Ino, version: u64, size: u64) {
        let st = self.inodes.lock().ok().and_then(|m| m.get(&ino).cloned());
        let open = match st {
            Some(st) => match st.lock() {
                Ok(mut s) if s.open_count > 0 || s.uncommitted => {
                    if s.version == version {
                        s.clean_at_close = Some(version);
                    }
                    true
                }
                Ok(_) => false,
                Err(_) => true,
            },
            None => false,
        };
        if !open {
            self.cache.staging_clean(ino, size);
        }
    }

    /// Evicts clean staging files when the cache is over its cap (never dirty or open ones,
    /// nor one whose content the bucket is not found to hold: [`Vfs::held_in_bucket`]).
    /// Evicts clean cached data now, when the cache dir's file system is short of its
    /// free-space reserve (a write just found it full). Counted in
    /// [`Vfs::status`]'s `space_evictions`.
    pub(crate) fn make_room(&self) {
        self.space_evictions.fetch_add(1, Ordering::Relaxed);
        self.evict();
    }

    /// Evicts the clean staging files over the cache's cap whose content the bucket
    /// holds (see [`Vfs::held_in_bucket`] and [`still_held`]). One pass at a time
    /// ([`Vfs::evicting`]): a caller returns once the files a running pass chose are gone.
    pub(crate) fn evict(&self) {
        let _one = self.evicting.lock().unwrap_or_else(|p| p.into_inner());
        let candidates = self.cache.over_capacity();
        if candidates.is_empty() {
            return;
        }
        let held = self.held_in_bucket(&candidates);
        let mut evicted_inos = Vec::new();
        for ino in candidates {
            if !held.contains(&ino) {
                self.cache.staging_dirty(ino);
                continue;
            }
            let evicted = deskfs_meta::txn(&*self.meta, |t| {
                let Some(mut r) = t.get_inode(ino)? else {
                    return Ok(Eviction::Kept);
                };
                if r.local != self.here() || r.dirty {
                    return Ok(Eviction::Kept);
                }
                // Not while open here or through another mount sharing this cache
                // dir (its writes would go to a deleted file).
                if self.is_open(ino) {
                    return Ok(Eviction::OpenHere {
                        version: r.data_version,
                        size: r.size,
                    });
                }
                if t.open_elsewhere(ino, 0)? || !still_held(t, &r)? {
                    return Ok(Eviction::Kept);
                }
                r.local = Local::None;
                t.update_inode(&r)?;
                Ok::<_, crate::VfsError>(Eviction::Evicted)
            });
            match evicted {
                Ok(Eviction::Evicted) => evicted_inos.push(ino),
                Ok(Eviction::OpenHere { version, size }) => {
                    self.cache.staging_dirty(ino);
                    self.evictable_at_close(ino, version, size);
                }
                Ok(Eviction::Kept) => self.cache.staging_dirty(ino),
                Err(e) => tracing::warn!(ino, error = %e, "eviction failed"),
            }
        }
        if evicted_inos.is_empty() {
            return;
        }
        // The only local copy goes on the strength of commits (the upload's record, the
        // eviction's): they must survive a power loss first (engines commit without a
        // device flush; see `MetaEngine::make_durable`).
        if let Err(e) = self.durable_since(std::time::Instant::now()) {
            tracing::warn!(error = %e, "cannot make the evictions durable; keeping the files");
            return;
        }
        #[cfg(test)]
        if let Some(hook) = self
            .uploader
            .before_evict_remove
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            hook();
        }
        self.remove_unheld_staging(&evicted_inos);
    }
}

/// What an eviction round's transaction did with one clean staging file.
enum Eviction {
    /// Its row names no local copy now; the file is removed once that is durable.
    Evicted,
    /// Kept: open or busy here. `version`/`size`: the row's content, evictable later.
    OpenHere { version: u64, size: u64 },
    /// Kept: dirty, not local, open through another mount, or not held in the bucket.
    Kept,
}

/// Whether the object recorded as holding `r`'s content is still there to be relied on,
/// read in the eviction's own transaction: the check against the bucket
/// ([`Vfs::held_in_bucket`]) ran before it, and the reconcile of a path the object was
/// at — a rename or a delete of that name, pending meanwhile — may be deleting it now
/// (its content check found the staging file local, so it downloads nothing). Evicting
/// then would leave the content nowhere: an object whose path has pending work is not
/// relied on. Empty files need no object.
fn still_held(t: &mut dyn deskfs_meta::MetaTxn, r: &InodeRow) -> Result<bool> {
    if r.size == 0 {
        return Ok(true);
    }
    Ok(match t.object_with_content(r.ino, r.data_version)? {
        Some(o) => !t.is_pending(&o.path)?,
        None => false,
    })
}

#[cfg(test)]
mod unit {
    use super::*;

    fn pending(path: &str, seq: u64, gen: u64) -> PendingRow {
        PendingRow {
            path: path.as_bytes().to_vec(),
            recursive: false,
            seq,
            gen,
            due_ns: 0,
            since_ns: 0,
            attempts: 0,
            last_error: None,
        }
    }

    /// A path another cache's content blocked is skipped for a while, counts as another
    /// mount's for the sync barrier, and is looked at again at once when another mount
    /// asks this one for content (content hops between caches: a lock handed round).
    #[test]
    fn paths_found_elsewhere_are_skipped_until_this_mount_is_asked() {
        let u = UploaderShared::default();
        let (a, b) = (pending("a", 1, 1), pending("b", 2, 1));
        u.found(&a, false);
        u.found(&b, false);
        assert!(u.skips(b"a") && u.is_elsewhere(&a));
        u.found(&b, true);
        assert!(!u.skips(b"b") && !u.is_elsewhere(&b), "done here after all");
        u.forget_elsewhere();
        assert!(!u.skips(b"a") && !u.is_elsewhere(&a));
    }

    /// For the sync barrier a finding holds for the state of the pending row it was
    /// made at only: the path re-marked (a change since) or marked anew (the old row
    /// finished, a new change) is waited for (seed 55 of 91: a write here after the
    /// content hopped from the other cache was left to it, and `sync` returned early).
    #[test]
    fn a_finding_elsewhere_is_about_one_state_of_the_row() {
        let u = UploaderShared::default();
        u.found(&pending("f", 7, 5), false);
        assert!(u.is_elsewhere(&pending("f", 7, 5)));
        for later in [pending("f", 7, 6), pending("f", 9, 1), pending("f", 9, 5)] {
            assert!(!u.is_elsewhere(&later), "{later:?} left to another mount");
        }
        assert!(
            u.skips(b"f"),
            "the path is still not looked at for a moment"
        );
    }

    /// Mounts sharing a cache dir upload one staging file one at a time (their records
    /// of two racing puts could name the other's object), and a writer's `flock` does
    /// not get in the way of that lock.
    #[test]
    fn one_upload_of_a_staging_file_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("7");
        std::fs::write(&p, b"content").unwrap();
        let first = StagingProbe::open(&p, false).unwrap().expect("free");
        assert!(StagingProbe::open(&p, false).unwrap().is_none(), "busy");
        let writer = std::fs::File::open(&p).unwrap();
        let mut st = crate::handles::InodeState::default();
        st.hold_writer_lock(&writer).unwrap();
        assert!(
            first.look().unwrap().is_none(),
            "a writer holds uncommitted writes"
        );
        st.staging = Some(std::sync::Arc::new(writer));
        st.writes_settled();
        assert!(first.look().unwrap().is_some());
        drop(first);
        assert!(
            StagingProbe::open(&p, false).unwrap().is_some(),
            "free again"
        );
    }
}
