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
//!   it every [`FEED_POLL`] and turns each entry into `inval_entry` / `inval_inode`.
//! * **This mount's own background work** (the importer adding names listed from the
//!   bucket, a content refresh): queued with [`Vfs::invalidate_later`], because a
//!   notification sent from inside a request handler can deadlock on the directory lock
//!   the kernel holds for that request (libfuse: "do not call from a request handler").
//!
//! The feed thread also remembers nothing about the kernel beyond [`KernelPages`]: which
//! content version the kernel's page cache holds for an inode, so that `open` can keep
//! those pages exactly when they are still current.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

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

/// The content version whose pages the kernel holds, per inode (see the module docs).
#[derive(Default)]
pub(crate) struct KernelPages {
    map: Mutex<HashMap<Ino, u64>>,
}

/// Entries beyond which the map is reset (every open then starts cold once).
const KERNEL_PAGES_MAX: usize = 1 << 20;

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
        if let Invalidation::Inode(ino) = inv {
            self.kernel_pages.forget(*ino);
        }
        if let Some(f) = self.invalidator.get() {
            f(inv);
        }
    }

    /// Queues `inv` for the feed thread (within [`FEED_POLL`]). Safe from request
    /// handlers.
    pub(crate) fn invalidate_later(&self, inv: Invalidation) {
        if let Invalidation::Inode(ino) = &inv {
            self.kernel_pages.forget(*ino);
        }
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(inv);
    }

    /// One round of the feed thread: queued invalidations, then the change feed.
    /// Returns how many invalidations were delivered.
    pub(crate) fn feed_round(&self) -> usize {
        let queued = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        let mut n = queued.len();
        for inv in &queued {
            self.invalidate_now(inv);
        }
        let me = self.session.load(Ordering::SeqCst);
        match deskfs_meta::read(&*self.meta, |t| t.sessions()) {
            Ok(sessions) => {
                let newest_peer = sessions.iter().map(|s| s.id).filter(|&id| id != me).max();
                self.shared.store(newest_peer.is_some(), Ordering::SeqCst);
                match newest_peer {
                    Some(peer) => {
                        if let Err(e) = self.publish_opens(peer) {
                            tracing::warn!(error = %e, "cannot publish open files to a new mount");
                        }
                    }
                    None => self.track_opens.store(false, Ordering::SeqCst),
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the mount sessions"),
        }
        loop {
            let after = self.feed_cursor.load(Ordering::SeqCst);
            let rows =
                match deskfs_meta::read(&*self.meta, |t| t.changes_after(after, me, FEED_BATCH)) {
                    Ok(rows) => rows,
                    Err(e) => {
                        tracing::warn!(error = %e, "change feed unreadable; retrying");
                        return n;
                    }
                };
            let Some(last) = rows.last().map(|r| r.seq) else {
                return n;
            };
            for r in &rows {
                if let (Some(parent), Some(name)) = (r.parent, r.name.clone()) {
                    self.invalidate_now(&Invalidation::Entry { parent, name });
                    // The directory's cached listing and attributes too.
                    self.invalidate_now(&Invalidation::Inode(parent));
                    n += 2;
                }
                self.invalidate_now(&Invalidation::Inode(r.ino));
                n += 1;
            }
            self.feed_cursor.store(last, Ordering::SeqCst);
            if rows.len() < FEED_BATCH {
                return n;
            }
        }
    }

    /// Another mount (newest session `peer`) is live: from now on opens are recorded in
    /// the open-file table (so its `unlink` keeps an inode this mount has open), the ones
    /// made while alone are recorded now, and the acknowledgement it waits for at mount
    /// time is written (kv `feed_ack.<session>` = newest peer seen).
    pub(crate) fn publish_opens(&self, peer: u64) -> crate::Result<()> {
        if self.acked_peer.load(Ordering::SeqCst) >= peer && self.track_opens.load(Ordering::SeqCst)
        {
            return Ok(());
        }
        self.track_opens.store(true, Ordering::SeqCst);
        let handles: Vec<_> = self
            .handles
            .lock()
            .map_err(|_| crate::poisoned())?
            .values()
            .filter(|h| !h.dir)
            .cloned()
            .collect();
        let me = self.session.load(Ordering::SeqCst);
        deskfs_meta::txn(&*self.meta, |t| {
            for h in &handles {
                h.record_open(t, me)?;
            }
            t.set_kv(&format!("feed_ack.{me}"), &peer.to_string())
        })?;
        self.acked_peer.fetch_max(peer, Ordering::SeqCst);
        Ok(())
    }

    /// Mount-time handshake: waits (up to `limit`) until every other live mount has
    /// acknowledged this session, i.e. records its opens and follows the feed. A mount
    /// that does not answer in time (an older deskfs, or hung) is logged and not waited
    /// for.
    pub(crate) fn await_peer_acks(&self, limit: Duration) {
        let me = self.session.load(Ordering::SeqCst);
        let start = std::time::Instant::now();
        loop {
            let pending = deskfs_meta::read(&*self.meta, |t| {
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
                Ok(v)
            });
            match pending {
                Ok(v) if v.is_empty() => return,
                Ok(v) if start.elapsed() >= limit => {
                    tracing::warn!(sessions = ?v, "other mounts did not acknowledge this one in time; continuing");
                    return;
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the mount sessions");
                    return;
                }
            }
        }
    }

    /// Whether other mounts of the workspace are live (as of the last feed round, at most
    /// [`FEED_POLL`] ago). A mount that is alone may let the kernel cache entries,
    /// negative entries and attributes for long; a shared one keeps them short, and the
    /// feed invalidates what the others change.
    pub fn shared(&self) -> bool {
        self.shared.load(Ordering::SeqCst)
    }

    /// Starts following the feed from its current end (the kernel has cached nothing of
    /// this mount yet).
    pub(crate) fn reset_feed_cursor(&self) -> crate::Result<()> {
        let last = deskfs_meta::read(&*self.meta, |t| t.last_change())?;
        self.feed_cursor.store(last, Ordering::SeqCst);
        let me = self.session.load(Ordering::SeqCst);
        let shared = deskfs_meta::read(&*self.meta, |t| t.sessions())?
            .iter()
            .any(|s| s.id != me);
        self.shared.store(shared, Ordering::SeqCst);
        self.track_opens.store(shared, Ordering::SeqCst);
        Ok(())
    }
}

/// Starts the feed thread of `vfs`; it ends when the VFS is dropped or shut down.
pub(crate) fn start(vfs: &Arc<Vfs>) {
    let weak: Weak<Vfs> = Arc::downgrade(vfs);
    let spawned = std::thread::Builder::new()
        .name("deskfs-feed".into())
        .spawn(move || loop {
            std::thread::sleep(FEED_POLL);
            let Some(v) = weak.upgrade() else { return };
            if v.feed_stopped.load(Ordering::SeqCst) {
                return;
            }
            v.feed_round();
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the change-feed thread; kernel caches of other mounts' changes expire only by TTL");
    }
}
