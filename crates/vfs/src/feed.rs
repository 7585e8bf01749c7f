//! Keeping the kernel's caches honest (DESIGN.md, "Consistency model").
//!
//! The FUSE adapter lets the kernel cache entries, negative entries and attributes for a
//! long time and keeps file pages across opens ([`Opened::keep_cache`](crate::Opened)).
//! That is only correct if every change the kernel did not make itself through this mount
//! reaches it as an invalidation. Two sources exist:
//!
//! * **Other mounts** of the workspace: the metadata engine logs their namespace and
//!   attribute changes in its change feed while more than one session is live
//!   ([`deskfs_meta::MetaEngine::log_changes_as`]). The feed thread of every mount follows
//!   it — woken by the engine's signals where it has them (PostgreSQL `NOTIFY`), else
//!   every [`FEED_POLL`] — and turns each entry into `inval_entry` / `inval_inode`.
//! * **This mount's own background work** (the importer adding names listed from the
//!   bucket, a content refresh): queued with [`Vfs::invalidate_later`], because a
//!   notification sent from inside a request handler can deadlock on the directory lock
//!   the kernel holds for that request (libfuse: "do not call from a request handler").
//!
//! What is remembered about the kernel: [`KernelPages`], which content version the
//! kernel's page cache holds for an inode, so that `open` can keep those pages exactly
//! when they are still current; and `kernel_sync`, the invalidation each `open` sent, so
//! that the feed leaves out the ones it covered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use deskfs_meta::Signal;

use crate::handles::OpenRecord;
use crate::{Ino, Vfs};

/// How often the change feed is polled (bounds how long another mount's change can stay
/// invisible behind a cached entry or attribute).
pub const FEED_POLL: Duration = Duration::from_millis(50);

/// Feed entries older than this are pruned by the heartbeat, ms.
pub(crate) const FEED_KEEP_MS: i64 = 10 * 60 * 1000;

/// How long a joining mount waits for the live ones to publish their open files.
pub(crate) const JOIN_WAIT: Duration = Duration::from_secs(2);

/// Feed entries read per poll.
const FEED_BATCH: usize = 1024;

/// Delivers one invalidation to the kernel (the FUSE adapter's notifier).
pub type Invalidator = Box<dyn Fn(&Invalidation) + Send + Sync>;

/// One thing for the kernel to forget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// Drop the cached attributes and every cached page of an inode (`inval_inode`).
    Inode(Ino),
    /// Drop only the cached attributes of an inode (`inval_inode` with offset -1): safe
    /// while the kernel holds the inode's pages locked (inside a write).
    Attrs(Ino),
    /// Drop the cached entry — positive or negative — of `name` in directory `parent`
    /// (`inval_entry`).
    Entry {
        /// Directory inode.
        parent: Ino,
        /// Entry name (bytes).
        name: Vec<u8>,
    },
}

/// Sequence numbers of feed entries already delivered (a bounded window: engines repeat
/// an entry only while it is recent).
#[derive(Default)]
pub(crate) struct SeenChanges {
    inner: Mutex<(
        std::collections::HashSet<u64>,
        std::collections::VecDeque<u64>,
    )>,
}

/// Entries remembered by [`SeenChanges`].
const SEEN_MAX: usize = 1 << 16;

impl SeenChanges {
    /// Whether `seq` is seen for the first time (and remembers it).
    pub(crate) fn first(&self, seq: u64) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *g;
        if !set.insert(seq) {
            return false;
        }
        order.push_back(seq);
        if order.len() > SEEN_MAX {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
        true
    }
}

/// The content version whose pages the kernel holds, per inode (see the module docs).
#[derive(Default)]
pub(crate) struct KernelPages {
    map: Mutex<HashMap<Ino, u64>>,
}

/// Entries beyond which the map is reset (every open then starts cold once). A map of a
/// million inodes costs ~35 MiB (hash table doubling); 2^18 keeps it under 10 MiB, as
/// the hints are capped.
const KERNEL_PAGES_MAX: usize = 1 << 18;

impl KernelPages {
    /// Records that the kernel's pages of `ino` are those of content `version` and tells
    /// whether they already were (the open may keep them).
    pub(crate) fn opened(&self, ino: Ino, version: u64) -> bool {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= KERNEL_PAGES_MAX {
            m.clear();
        }
        m.insert(ino, version) == Some(version)
    }

    /// Whether the kernel's pages (and the size it caches with them) of `ino` are those
    /// of content `version` (false when unknown).
    pub(crate) fn holds(&self, ino: Ino, version: u64) -> bool {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&ino) == Some(&version)
    }

    /// This mount committed content `new` over `old` through the kernel (its page cache
    /// saw every write): pages that were current stay current.
    pub(crate) fn committed(&self, ino: Ino, old: u64, new: u64) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = m.get_mut(&ino) {
            if *v == old {
                *v = new;
            }
        }
    }

    /// The kernel's pages of `ino` can no longer be trusted.
    pub(crate) fn forget(&self, ino: Ino) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(&ino);
    }
}

impl Vfs {
    /// Installs the hook that delivers invalidations to the kernel (the FUSE adapter's
    /// notifier). Set once, after mounting; before that, invalidations are dropped (the
    /// kernel has cached nothing yet).
    pub fn set_invalidator(&self, f: Invalidator) {
        let _ = self.invalidator.set(f);
    }

    /// Delivers `inv` now. Only for callers outside request handlers (or that hold no
    /// lock the kernel could be waiting on): otherwise use [`Vfs::invalidate_later`].
    pub(crate) fn invalidate_now(&self, inv: &Invalidation) {
        self.forget_cached(inv);
        if let Some(f) = self.invalidator.get() {
            f(inv);
        }
    }

    /// Queues `inv` for the feed thread (within [`FEED_POLL`]). Safe from request
    /// handlers.
    pub(crate) fn invalidate_later(&self, inv: Invalidation) {
        self.forget_cached(&inv);
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(inv);
    }

    /// What this mount itself remembers about `inv`'s subject goes too.
    fn forget_cached(&self, inv: &Invalidation) {
        match inv {
            Invalidation::Inode(ino) => {
                self.kernel_pages.forget(*ino);
                self.hints.forget_attrs(*ino);
            }
            Invalidation::Attrs(ino) => self.hints.forget_attrs(*ino),
            Invalidation::Entry { parent, name } => self.hints.forget_entry(*parent, name),
        }
    }

    /// One round of the feed thread: queued invalidations, the session table (the
    /// coherence state), then the change feed. Returns how many invalidations were
    /// delivered.
    #[cfg(test)]
    pub(crate) fn feed_round(&self) -> usize {
        self.feed_tick(true, true)
    }

    /// A round of the feed thread doing what is due: queued invalidations and purges
    /// always; the session table (`sessions`) and the change feed (`feed`) when asked.
    fn feed_tick(&self, sessions: bool, feed: bool) -> usize {
        let queued = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        let mut n = queued.len();
        for inv in &queued {
            self.invalidate_now(inv);
        }
        self.flush_releases();
        self.flush_access_times();
        self.flush_purges();
        if sessions {
            if let Err(e) = self.observe_sessions() {
                tracing::warn!(error = %e, "cannot read the mount sessions");
            }
        }
        if !feed {
            return n;
        }
        let me = self.coherence.session();
        loop {
            let cursor = self.coherence.cursor();
            let (rows, next) = match self.meta.feed_read(cursor, me, FEED_BATCH) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "change feed unreadable; retrying");
                    return n;
                }
            };
            // Every change in `rows` was committed before this instant. Inodes an open
            // already invalidated for since are left out (see `kernel_sync`).
            let batch_read = Instant::now();
            let mut coverage =
                self.kernel_syncs
                    .coverage(&*self.meta, rows.iter().map(|r| r.ino), batch_read);
            let mut delivered = false;
            for r in &rows {
                // Engines may return a change twice (PostgreSQL, until its transaction
                // is below every snapshot): deliver it once.
                if !self.feed_seen.first(r.seq) {
                    continue;
                }
                delivered = true;
                if let (Some(parent), Some(name)) = (r.parent, r.name.clone()) {
                    self.invalidate_now(&Invalidation::Entry { parent, name });
                    // The directory's cached listing and attributes too.
                    self.invalidate_now(&Invalidation::Inode(parent));
                    n += 2;
                }
                let ino = r.ino;
                if coverage.deliver(ino, || self.invalidate_now(&Invalidation::Inode(ino))) {
                    n += 1;
                } else {
                    tracing::debug!(
                        ino,
                        seq = r.seq,
                        "feed: invalidation left out, an open covered it"
                    );
                }
            }
            if delivered {
                // Another mount is busy changing the workspace: this mount's uploader
                // waits for a quiet moment too (`uploader::BURST_DEFER`), so it does not
                // take that mount's fresh pending rows (its to upload) and compete with
                // it for the database while the burst lasts.
                self.note_activity();
            }
            self.coherence.set_cursor(next);
            if rows.len() < FEED_BATCH {
                self.feed_caught_up_ns
                    .store(crate::now_ns(), std::sync::atomic::Ordering::Relaxed);
                return n;
            }
        }
    }

    /// Reads the session table and moves the coherence state machine; entering a shared
    /// state (or seeing a newer peer) publishes this mount's open files to it.
    pub(crate) fn observe_sessions(&self) -> crate::Result<()> {
        let sessions = deskfs_meta::read(&*self.meta, |t| t.sessions())?;
        let me = self.coherence.session();
        if me != 0 && !sessions.iter().any(|s| s.id == me) {
            self.fenced(me);
            return Ok(());
        }
        let t = self
            .coherence
            .observe(&crate::session::hostname(), &sessions);
        if t.from != t.to {
            tracing::info!(from = ?t.from, to = ?t.to, "coherence state changed");
        }
        if let Some(peer) = t.newest_peer {
            if self.coherence.owes_ack(peer) {
                self.publish_opens(peer)?;
            }
        } else {
            self.locks_alone()?;
        }
        Ok(())
    }

    /// Another mount (newest session `peer`) is live: the opens made while alone are
    /// recorded in the open-file table now (so its `unlink` keeps an inode this mount has
    /// open), the locks decided in memory are written to the lock table, and the
    /// acknowledgement it waits for at mount time is written (kv `feed_ack.<session>` =
    /// newest peer seen), all in one transaction. New opens are recorded as they happen
    /// while shared, and lock decisions are transactions on the lock table.
    pub(crate) fn publish_opens(&self, peer: u64) -> crate::Result<()> {
        let handles: Vec<_> = self
            .handles
            .lock()
            .map_err(|_| crate::poisoned())?
            .values()
            .filter(|h| !h.dir)
            .cloned()
            .collect();
        // Claim the unrecorded ones first (outside the transaction: it may run twice).
        let claimed: Vec<_> = handles.into_iter().filter(|h| h.claim_record()).collect();
        let me = self.coherence.session();
        // Held across the transaction: no lock is decided in memory after the publication.
        let mut table = self.locks_table()?;
        let res = deskfs_meta::txn(&*self.meta, |t| {
            t.check_session(me)?;
            for h in &claimed {
                t.add_open(h.ino, me, 1)?;
            }
            self.publish_locks(t, &table)?;
            t.set_kv(&format!("feed_ack.{me}"), &peer.to_string())
        });
        if res.is_ok() {
            *table = crate::locks::Table::Database;
        }
        drop(table);
        match res {
            Ok(()) => {
                for h in &claimed {
                    if h.finish_record() == OpenRecord::Closed {
                        // Released while being recorded: take the record back.
                        let _ = deskfs_meta::txn(&*self.meta, |t| t.add_open(h.ino, me, -1));
                    }
                }
                self.coherence.acked(peer);
                Ok(())
            }
            Err(e) => {
                for h in &claimed {
                    h.abandon_record();
                }
                Err(e.into())
            }
        }
    }

    /// Mount-time handshake: waits (up to `limit`) until every other live mount has
    /// acknowledged this session, i.e. records its opens and follows the feed. A mount
    /// that does not answer in time (an older deskfs, or hung) is logged and not waited
    /// for.
    pub(crate) fn await_peer_acks(&self, limit: Duration) {
        let me = self.coherence.session();
        let start = Instant::now();
        loop {
            match self.unacked_peers() {
                Ok(v) if v.is_empty() => {
                    self.locks.all_acked(me);
                    return;
                }
                Ok(v) if start.elapsed() >= limit => {
                    tracing::warn!(sessions = ?v, "other mounts did not acknowledge this one in time; continuing");
                    return;
                }
                Ok(_) => {
                    let _ = self.meta.signal(&Signal::Sessions);
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the mount sessions");
                    return;
                }
            }
        }
    }

    /// The other live mounts that have not acknowledged this mount's session yet.
    pub(crate) fn unacked_peers(&self) -> crate::Result<Vec<u64>> {
        let me = self.coherence.session();
        Ok(deskfs_meta::read(&*self.meta, |t| {
            let mut v = Vec::new();
            for s in t.sessions()? {
                if s.id == me {
                    continue;
                }
                let ack = t
                    .get_kv(&format!("feed_ack.{}", s.id))?
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                if ack < me {
                    v.push(s.id);
                }
            }
            Ok::<_, deskfs_meta::MetaError>(v)
        })?)
    }

    /// Whether other mounts of the workspace are live (as of the last look at the
    /// session table, at most [`FEED_POLL`] ago). A mount that is alone may let the
    /// kernel cache entries, negative entries and attributes for long; a shared one keeps
    /// them short, and the feed invalidates what the others change.
    pub fn shared(&self) -> bool {
        self.coherence.shared()
    }

    /// The coherence state (see [`crate::coherence`]).
    pub fn peers(&self) -> crate::coherence::Peers {
        self.coherence.peers()
    }
}

/// With an engine that notifies, how often the session table and the change feed are
/// read anyway (a notification lost with a connection, a peer that died silently).
const NOTIFIED_FALLBACK: Duration = Duration::from_secs(1);

/// How often uncommitted writes of released files (a commit that failed while the
/// database was unreachable) are committed again.
const RECOMMIT_EVERY: Duration = Duration::from_secs(2);

/// Starts the thread that acts on other mounts' signals at once — lock waiters woken,
/// upload requests and finished uploads passed on — whatever the feed thread is doing (a
/// kernel invalidation can wait behind a slow request); what concerns the feed and the
/// session table is passed on to the feed thread through the returned receiver. `None`
/// when the thread cannot start (then the feed thread polls).
fn dispatch_signals(
    vfs: &Arc<Vfs>,
    rx: std::sync::mpsc::Receiver<Signal>,
) -> Option<std::sync::mpsc::Receiver<Signal>> {
    let weak: Weak<Vfs> = Arc::downgrade(vfs);
    let (tx, feed_rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("deskfs-signals".into())
        .spawn(move || {
            while let Ok(sig) = rx.recv() {
                let Some(v) = weak.upgrade() else { return };
                if v.coherence.stopped() {
                    return;
                }
                v.on_signal(&sig);
                if matches!(sig, Signal::Feed | Signal::Sessions) && tx.send(sig).is_err() {
                    return;
                }
            }
        });
    match spawned {
        Ok(_) => Some(feed_rx),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the signal thread; other mounts' changes are polled");
            None
        }
    }
}

/// Starts the feed thread of `vfs`: follows the change feed and the session table, renews
/// the lease, retries failed commits. It ends when the VFS is dropped or shut down.
pub(crate) fn start(vfs: &Arc<Vfs>) {
    let weak: Weak<Vfs> = Arc::downgrade(vfs);
    let signals = vfs
        .meta
        .subscribe()
        .and_then(|rx| dispatch_signals(vfs, rx));
    vfs.coherence.set_notified(signals.is_some());
    let spawned = std::thread::Builder::new()
        .name("deskfs-feed".into())
        .spawn(move || {
            let mut last_recommit = Instant::now();
            let mut last_read = Instant::now();
            loop {
                // Wait for a signal (or the poll period). Without notifications every
                // round reads the session table and the feed; with them, what a signal
                // names (and everything at least every NOTIFIED_FALLBACK).
                let (mut sessions, mut feed) = (signals.is_none(), signals.is_none());
                match &signals {
                    Some(rx) => match rx.recv_timeout(FEED_POLL) {
                        Ok(sig) => {
                            let mut note = |sig: &Signal| match sig {
                                Signal::Sessions => {
                                    sessions = true;
                                    feed = true;
                                }
                                Signal::Feed => feed = true,
                                _ => {}
                            };
                            note(&sig);
                            // Take whatever else arrived meanwhile.
                            while let Ok(more) = rx.try_recv() {
                                note(&more);
                            }
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                            std::thread::sleep(FEED_POLL)
                        }
                    },
                    None => std::thread::sleep(FEED_POLL),
                }
                let Some(v) = weak.upgrade() else { return };
                if v.coherence.stopped() {
                    return;
                }
                if last_read.elapsed() >= NOTIFIED_FALLBACK {
                    sessions = true;
                    feed = true;
                }
                if sessions || feed {
                    last_read = Instant::now();
                }
                v.feed_tick(sessions, feed);
                if last_recommit.elapsed() >= RECOMMIT_EVERY {
                    last_recommit = Instant::now();
                    v.recommit_released();
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the change-feed thread; kernel caches of other mounts' changes expire only by TTL");
    }
    // The lease has a thread of its own: nothing the feed thread waits for (a kernel
    // invalidation behind a slow request) may delay a heartbeat.
    let weak: Weak<Vfs> = Arc::downgrade(vfs);
    let spawned = std::thread::Builder::new()
        .name("deskfs-lease".into())
        .spawn(move || loop {
            let period = match weak.upgrade() {
                Some(v) => v.heartbeat_period(),
                None => return,
            };
            std::thread::sleep(period);
            let Some(v) = weak.upgrade() else { return };
            if v.coherence.stopped() {
                return;
            }
            v.heartbeat();
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the lease thread: this mount will be expired by others after the lease");
    }
}
