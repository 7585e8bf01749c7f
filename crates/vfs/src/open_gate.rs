//! Concurrent opens of one inode on one mount share one kernel invalidation.
//!
//! An `open` that finds the kernel's cached size and pages stale (another mount's newer
//! content) decides so under the inode's state lock, and sends `inval_inode` after that
//! lock is released, before it answers (`Vfs::open`). A second open of the same inode
//! deciding in between would find the kernel still stale and send an invalidation of its
//! own — which can land while the first opener's process refreshes the inode's
//! attributes: the kernel then discards the fresh reply and keeps the size it cached
//! before (see [`crate::kernel_sync`]), and that process reads the new bytes with the old
//! size.
//!
//! So the first open *leads*: under the state's lock it registers a gate for the inode,
//! the content version it opens and the attributes it read ([`OpenGates::role`]). A later
//! open that read the same, while the gate stands, *follows*: it sends nothing (not even
//! the attribute invalidation of its access time), and answers only once the leader's
//! invalidation was delivered ([`Gate::wait`]) — or, if the leader ended without
//! delivering it, sends its own. An open that read other attributes or another version
//! leads a gate of its own (its invalidation is needed: the feed would send it
//! otherwise).
//!
//! Followers wait on FUSE workers. The leader delivers microseconds after the state's
//! lock; its invalidation can only be held up inside the kernel (`inval_inode` waits for
//! a page lock held by a `READ` in flight, which needs a free worker). Followers then
//! wait for at most [`FOLLOW_WAIT`] before they send their own — which would block on
//! the same page lock: that stall is older than the gate (every stale open used to send
//! its own), and the gate does not add to it.
//!
//! Opens with `O_TRUNC` neither lead nor follow (their own truncation changes the version
//! they open); they invalidate as before.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::kernel_sync::AttrStamp;
use crate::Ino;

/// How long a follower waits for its leader's invalidation before it sends its own. Long:
/// sending its own while the leader's is still on its way would bring back the race the
/// gate closes, and the leader delivers at once unless the kernel holds it up (see the
/// module docs).
pub(crate) const FOLLOW_WAIT: Duration = Duration::from_secs(10);

/// What became of a leader's invalidation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GateState {
    /// Not yet delivered.
    Pending,
    /// Delivered to the kernel: followers may answer.
    Delivered,
    /// The leader ended without delivering (it failed): followers send their own.
    Abandoned,
}

/// One leader's invalidation of one inode for one content version.
#[derive(Debug)]
pub(crate) struct Gate {
    version: u64,
    stamp: AttrStamp,
    state: Mutex<GateState>,
    done: Condvar,
}

impl Gate {
    /// Waits until the leader delivered its invalidation (`true`), or gave up or stalled
    /// past [`FOLLOW_WAIT`] (`false`: the follower must send its own).
    pub(crate) fn wait(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (st, _) = self
            .done
            .wait_timeout_while(st, FOLLOW_WAIT, |s| *s == GateState::Pending)
            .unwrap_or_else(|p| p.into_inner());
        *st == GateState::Delivered
    }

    fn set(&self, to: GateState) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *st == GateState::Pending {
            *st = to;
        }
        self.done.notify_all();
    }
}

/// The gates standing, per inode (at most one: a newer version's replaces an older one's).
#[derive(Default)]
pub(crate) struct OpenGates {
    map: Arc<Mutex<HashMap<Ino, Arc<Gate>>>>,
}

/// An open's part in the kernel's invalidation of its inode.
#[derive(Debug)]
pub(crate) enum Role {
    /// The kernel is current, or this open does not take part (`O_TRUNC`, not a file).
    Alone,
    /// This open sends the invalidation ([`Lead::delivered`] after it did).
    Lead(Lead),
    /// Another open of the same version sends it: wait for it ([`Gate::wait`]).
    Follow(Arc<Gate>),
}

/// A leader's hold on its gate. Dropped without [`Lead::delivered`], the gate is
/// abandoned (its followers send their own invalidation).
#[derive(Debug)]
pub(crate) struct Lead {
    ino: Ino,
    gate: Arc<Gate>,
    map: Arc<Mutex<HashMap<Ino, Arc<Gate>>>>,
}

impl Lead {
    /// The invalidation was delivered to the kernel: followers may answer.
    pub(crate) fn delivered(self) {
        self.end(GateState::Delivered);
    }

    fn end(&self, how: GateState) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.get(&self.ino).is_some_and(|g| Arc::ptr_eq(g, &self.gate)) {
            m.remove(&self.ino);
        }
        drop(m);
        self.gate.set(how);
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        // After `delivered` this finds the gate ended and changes nothing.
        self.end(GateState::Abandoned);
    }
}

impl OpenGates {
    /// The part of an open of `ino` that opens content `version` from a row with the
    /// attributes `stamp`, decided under the inode's state lock: `stale` = the kernel's
    /// cached size and pages are not `version`'s. A gate standing for the same version
    /// and attributes makes it a follower (whatever `stale` says: the kernel is being
    /// told); otherwise a stale open leads.
    pub(crate) fn role(&self, ino: Ino, version: u64, stamp: AttrStamp, stale: bool) -> Role {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = m.get(&ino) {
            if g.version == version && g.stamp == stamp {
                return Role::Follow(g.clone());
            }
        }
        if !stale {
            return Role::Alone;
        }
        let gate = Arc::new(Gate {
            version,
            stamp,
            state: Mutex::new(GateState::Pending),
            done: Condvar::new(),
        });
        m.insert(ino, gate.clone());
        Role::Lead(Lead {
            ino,
            gate,
            map: self.map.clone(),
        })
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn st(v: u64) -> AttrStamp {
        AttrStamp::for_test(v, 0)
    }

    #[test]
    fn a_stale_open_leads_and_opens_of_its_version_follow_until_it_delivered() {
        let g = OpenGates::default();
        assert!(matches!(g.role(7, 1, st(1), false), Role::Alone));
        let Role::Lead(lead) = g.role(7, 2, st(2), true) else {
            panic!("a stale open leads")
        };
        let Role::Follow(f) = g.role(7, 2, st(2), false) else {
            panic!("the same version follows, stale or not")
        };
        assert!(matches!(g.role(7, 2, st(2), true), Role::Follow(_)));
        assert!(
            matches!(g.role(8, 2, st(2), false), Role::Alone),
            "another inode"
        );
        let waiter = std::thread::spawn(move || f.wait());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "a follower waits for the delivery");
        lead.delivered();
        assert!(waiter.join().unwrap(), "delivered");
        assert!(
            matches!(g.role(7, 2, st(2), false), Role::Alone),
            "the gate is gone"
        );
    }

    #[test]
    fn an_open_that_read_other_attributes_leads_a_gate_of_its_own() {
        let g = OpenGates::default();
        let Role::Lead(first) = g.role(7, 2, st(2), true) else {
            panic!("leads")
        };
        // A chmod (say) committed between the two row reads: the feed would deliver it,
        // so this open tells the kernel itself (and records what it covered).
        let changed = AttrStamp::for_test(2, 99);
        let Role::Lead(second) = g.role(7, 2, changed, true) else {
            panic!("other attributes lead")
        };
        assert!(matches!(g.role(7, 2, changed, false), Role::Follow(_)));
        first.delivered();
        second.delivered();
    }

    #[test]
    fn an_abandoned_lead_makes_its_followers_send_their_own() {
        let g = OpenGates::default();
        let Role::Lead(lead) = g.role(3, 5, st(5), true) else {
            panic!("leads")
        };
        let Role::Follow(f) = g.role(3, 5, st(5), false) else {
            panic!("follows")
        };
        drop(lead);
        assert!(!f.wait(), "abandoned");
        assert!(
            matches!(g.role(3, 5, st(5), true), Role::Lead(_)),
            "a new open leads again"
        );
    }

    #[test]
    fn a_newer_version_leads_a_gate_of_its_own_and_the_older_leader_leaves_it() {
        let g = OpenGates::default();
        let Role::Lead(old) = g.role(4, 1, st(1), true) else {
            panic!("leads")
        };
        let Role::Lead(new) = g.role(4, 2, st(2), true) else {
            panic!("another version leads")
        };
        old.delivered();
        assert!(
            matches!(g.role(4, 2, st(2), false), Role::Follow(_)),
            "the older leader's end leaves the newer gate standing"
        );
        new.delivered();
        assert!(matches!(g.role(4, 2, st(2), false), Role::Alone));
    }
}
