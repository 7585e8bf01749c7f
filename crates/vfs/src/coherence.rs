//! The coherence protocol between mounts of one workspace, as one state machine.
//!
//! What a mount may let the kernel cache, whether it records its open files for others,
//! and how its staging files may be reused all follow from one fact: who else is live.
//!
//! ```text
//!              another session registers            a session on another host
//!   Alone ───────────────────────────────► SameHost ─────────────────────────► OtherHosts
//!     ▲  ◄───────────────────────────────    │    ◄─────────────────────────────    │
//!     │        the last other session ends   │      only same-host sessions left     │
//!     └──────────────────────────────────────┴───────────────────────────────────────┘
//!                                 the last other session ends
//! ```
//!
//! | state | kernel entry/attr TTL | negative entries, cached listings | open files recorded | staging files of purged inodes |
//! |---|---|---|---|---|
//! | `Alone` | long (60 s) | yes | no | reused (pool) |
//! | `SameHost` | short (1 s) + change feed | no | yes | deleted (a peer may share the cache dir) |
//! | `OtherHosts` | short (1 s) + change feed | no | yes | reused, unless a mount on this host is live too |
//!
//! Entering a shared state publishes this mount's open files and acknowledges the newest
//! peer (the joiner waits for that before serving, so no file it could unlink is open
//! unrecorded). Every state follows the change feed; alone, the feed is empty. Content
//! that only another cache holds (`Local::At(other)`) is fetched through the bucket after
//! asking its holder to upload (close-to-open across caches), in every state.
//!
//! A mount whose session disappeared (its lease expired while it was paused or cut off,
//! and another mount cleaned it up) is **fenced**: every batch it sends carries
//! `CheckSession`, so its next write fails; it registers a new session, counts the event
//! and reports it (log and `deskfs status`). Locks it held are gone.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use deskfs_meta::{FeedCursor, SessionRow};
use serde::Serialize;

/// Who else uses the workspace, as this mount last saw the session table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Peers {
    /// No other live mount.
    Alone,
    /// Other mounts, all on this host.
    SameHost,
    /// At least one mount on another host.
    OtherHosts,
}

impl Peers {
    fn code(self) -> u8 {
        match self {
            Peers::Alone => 0,
            Peers::SameHost => 1,
            Peers::OtherHosts => 2,
        }
    }

    fn from_code(c: u8) -> Peers {
        match c {
            0 => Peers::Alone,
            1 => Peers::SameHost,
            _ => Peers::OtherHosts,
        }
    }

    /// The state the session table puts a mount of `host` with session `me` in, and the
    /// newest other session.
    pub fn of(me: u64, host: &str, sessions: &[SessionRow]) -> (Peers, Option<u64>) {
        let others = sessions.iter().filter(|s| s.id != me);
        let newest = others.clone().map(|s| s.id).max();
        let state = if others.clone().any(|s| s.host != host) {
            Peers::OtherHosts
        } else if newest.is_some() {
            Peers::SameHost
        } else {
            Peers::Alone
        };
        (state, newest)
    }

    /// Whether other mounts are live.
    pub fn shared(self) -> bool {
        self != Peers::Alone
    }
}

/// A change of [`Peers`] seen by [`Coherence::observe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// State before.
    pub from: Peers,
    /// State after.
    pub to: Peers,
    /// The newest other session (the one to acknowledge), if any.
    pub newest_peer: Option<u64>,
}

impl Transition {
    /// This mount starts sharing (publish opens, acknowledge, shorten caches).
    pub fn starts_sharing(&self) -> bool {
        !self.from.shared() && self.to.shared()
    }

    /// This mount is alone again.
    pub fn ends_sharing(&self) -> bool {
        self.from.shared() && !self.to.shared()
    }
}

/// Why and when this mount was last fenced (status).
#[derive(Clone, Debug, Default, Serialize)]
pub struct FenceReport {
    /// How many times this mount lost its session.
    pub count: u64,
    /// The session that was lost last, and when (ns since the epoch).
    pub last: Option<(u64, i64)>,
    /// Files whose writes under a lost lease were kept beside newer content
    /// (`NAME.deskfs-conflict-HOST-TIME`).
    pub conflicts: u64,
}

/// The coherence state of one mount.
pub(crate) struct Coherence {
    session: AtomicU64,
    peers: AtomicU8,
    /// Highest peer session this mount has published its opens to (join handshake).
    acked_peer: AtomicU64,
    /// Position in the change feed this mount has applied.
    cursor: Mutex<FeedCursor>,
    fences: Mutex<FenceReport>,
    /// Set at shutdown: background threads end.
    stopped: AtomicBool,
    /// The engine delivers signals from other mounts (PostgreSQL `NOTIFY`): waits and
    /// followers are woken by them, and poll only as a fallback.
    notified: AtomicBool,
    /// Times this mount began sharing (facts about rows known only while alone are
    /// valid within one alone period: see `datasync`).
    sharings: AtomicU64,
    /// Another live session runs on this host: it may use this cache directory (and
    /// read its staging files by path), so a purged inode's staging file is deleted
    /// rather than reused. Mounts on other hosts never see this cache.
    local_peer: AtomicBool,
    /// Held while this mount re-registers after a fence (see `Vfs::fenced`).
    pub(crate) fencing: Mutex<()>,
}

impl Default for Coherence {
    fn default() -> Self {
        Coherence {
            session: AtomicU64::new(0),
            // Until the session table was read, assume company (the safe side).
            peers: AtomicU8::new(Peers::SameHost.code()),
            acked_peer: AtomicU64::new(0),
            cursor: Mutex::new(FeedCursor::default()),
            fences: Mutex::new(FenceReport::default()),
            stopped: AtomicBool::new(false),
            notified: AtomicBool::new(false),
            sharings: AtomicU64::new(0),
            local_peer: AtomicBool::new(true),
            fencing: Mutex::new(()),
        }
    }
}

impl Coherence {
    /// This mount's session id (0 before registration).
    pub(crate) fn session(&self) -> u64 {
        self.session.load(Ordering::SeqCst)
    }

    /// A new session was registered.
    pub(crate) fn set_session(&self, id: u64) {
        self.session.store(id, Ordering::SeqCst);
        self.acked_peer.store(0, Ordering::SeqCst);
    }

    /// The current state.
    pub(crate) fn peers(&self) -> Peers {
        Peers::from_code(self.peers.load(Ordering::SeqCst))
    }

    /// Whether other mounts are live (short kernel caches, opens recorded).
    pub(crate) fn shared(&self) -> bool {
        self.peers().shared()
    }

    /// Whether a mount on this host other than this one may be using this cache
    /// directory (true until the session table was read).
    pub(crate) fn cache_may_be_shared(&self) -> bool {
        self.local_peer.load(Ordering::SeqCst)
    }

    /// The current alone period: `Some(n)` while alone, a number that changes whenever
    /// other mounts appear (so a fact learnt while alone is not trusted after a shared
    /// spell); `None` while shared.
    pub(crate) fn alone_period(&self) -> Option<u64> {
        let n = self.sharings.load(Ordering::SeqCst);
        (!self.shared() && self.sharings.load(Ordering::SeqCst) == n).then_some(n)
    }

    /// Moves to the state the session table `sessions` implies for this mount on `host`.
    pub(crate) fn observe(&self, host: &str, sessions: &[SessionRow]) -> Transition {
        let (to, newest_peer) = Peers::of(self.session(), host, sessions);
        let me = self.session();
        let local = sessions.iter().any(|s| s.id != me && s.host == host);
        self.local_peer.store(local, Ordering::SeqCst);
        let from = Peers::from_code(self.peers.swap(to.code(), Ordering::SeqCst));
        if to.shared() && !from.shared() {
            self.sharings.fetch_add(1, Ordering::SeqCst);
        }
        Transition {
            from,
            to,
            newest_peer,
        }
    }

    /// Whether this mount still owes `peer` the publication of its open files.
    pub(crate) fn owes_ack(&self, peer: u64) -> bool {
        self.acked_peer.load(Ordering::SeqCst) < peer
    }

    /// The open files were published to `peer` (and everyone older).
    pub(crate) fn acked(&self, peer: u64) {
        self.acked_peer.fetch_max(peer, Ordering::SeqCst);
    }

    /// The feed position.
    pub(crate) fn cursor(&self) -> FeedCursor {
        *self.cursor.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the feed position.
    pub(crate) fn set_cursor(&self, c: FeedCursor) {
        *self.cursor.lock().unwrap_or_else(|p| p.into_inner()) = c;
    }

    /// Records that session `lost` was fenced at `now_ns`. A lost session counts once:
    /// when the registration that replaces it fails (its answer lost in a cut: it may
    /// have been applied), the next attempt is the same fence, not another one.
    pub(crate) fn fenced(&self, lost: u64, now_ns: i64) {
        // The records published under the lost session went with it: the new session
        // publishes the open files to the peers again.
        self.acked_peer.store(0, Ordering::SeqCst);
        let mut f = self.fences.lock().unwrap_or_else(|p| p.into_inner());
        if f.last.is_some_and(|(l, _)| l == lost) {
            return;
        }
        f.count += 1;
        f.last = Some((lost, now_ns));
    }

    /// Writes under a lost lease were saved as a conflict copy.
    pub(crate) fn conflict(&self) {
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .conflicts += 1;
    }

    /// Fencing history.
    pub(crate) fn fence_report(&self) -> FenceReport {
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records whether the engine delivers signals.
    pub(crate) fn set_notified(&self, yes: bool) {
        self.notified.store(yes, Ordering::Relaxed);
    }

    /// Whether the engine delivers signals from other mounts.
    pub(crate) fn notified(&self) -> bool {
        self.notified.load(Ordering::Relaxed)
    }

    /// Background work should end.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// Whether [`Coherence::stop`] was called.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn s(id: u64, host: &str) -> SessionRow {
        SessionRow {
            id,
            host: host.into(),
            pid: 1,
            heartbeat_ns: 0,
        }
    }

    #[test]
    fn every_transition() {
        let c = Coherence::default();
        c.set_session(5);
        // Before the first observation the mount assumes company.
        assert!(c.shared() && c.cache_may_be_shared());
        let t = c.observe("a", &[s(5, "a")]);
        assert!(!c.cache_may_be_shared());
        assert_eq!(
            (t.from, t.to, t.newest_peer),
            (Peers::SameHost, Peers::Alone, None)
        );
        assert!(t.ends_sharing());
        // Alone -> SameHost
        let t = c.observe("a", &[s(5, "a"), s(7, "a")]);
        assert_eq!(
            (t.from, t.to, t.newest_peer),
            (Peers::Alone, Peers::SameHost, Some(7))
        );
        assert!(t.starts_sharing() && c.shared() && c.cache_may_be_shared());
        // SameHost -> OtherHosts
        let t = c.observe("a", &[s(5, "a"), s(7, "a"), s(9, "b")]);
        assert_eq!(
            (t.from, t.to, t.newest_peer),
            (Peers::SameHost, Peers::OtherHosts, Some(9))
        );
        assert!(!t.starts_sharing() && !t.ends_sharing() && c.cache_may_be_shared());
        // OtherHosts -> SameHost
        let t = c.observe("a", &[s(5, "a"), s(7, "a")]);
        assert_eq!((t.from, t.to), (Peers::OtherHosts, Peers::SameHost));
        // SameHost -> Alone
        let t = c.observe("a", &[s(5, "a")]);
        assert!(t.ends_sharing());
        // Alone -> OtherHosts directly, and back
        let t = c.observe("a", &[s(5, "a"), s(11, "b")]);
        assert_eq!((t.from, t.to), (Peers::Alone, Peers::OtherHosts));
        assert!(t.starts_sharing());
        // Only another host's mount: nobody else can use this cache directory.
        assert!(c.shared() && !c.cache_may_be_shared());
        let t = c.observe("a", &[s(5, "a")]);
        assert_eq!((t.from, t.to), (Peers::OtherHosts, Peers::Alone));
        // Acknowledgements.
        assert!(c.owes_ack(11));
        c.acked(11);
        assert!(!c.owes_ack(11) && c.owes_ack(12));
        // A new session owes everyone again.
        c.set_session(20);
        assert!(c.owes_ack(11));
        // Fencing is counted.
        c.fenced(5, 123);
        c.fenced(20, 456);
        let f = c.fence_report();
        assert_eq!((f.count, f.last), (2, Some((20, 456))));
    }
}
