//! Locks through the VFS: conflicts between owners, and a late release of an open file
//! whose owner id the kernel already gave to a new open file (flock owners are `struct
//! file` addresses, and RELEASE is asynchronous).

use std::sync::Mutex;

use super::*;
use crate::locks::LockType;
use crate::Invalidation;

const W: i32 = libc::F_WRLCK;
const ALL: u64 = u64::MAX;

#[test]
fn owners_conflict_and_unlock_frees() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let fh1 = h.op(f.ino, libc::O_RDWR);
    let fh2 = h.op(f.ino, libc::O_RDWR);
    h.setlk(f.ino, fh1, 1, 0, ALL, W, 100, false).unwrap();
    assert_eq!(
        errno(h.setlk(f.ino, fh2, 2, 0, ALL, W, 200, false)),
        libc::EAGAIN
    );
    h.setlk(f.ino, fh1, 1, 0, ALL, libc::F_UNLCK, 100, false)
        .unwrap();
    h.setlk(f.ino, fh2, 2, 0, ALL, W, 200, false).unwrap();
    h.release_fh_locks(f.ino, 2, fh2).unwrap();
    h.setlk(f.ino, fh1, 1, 0, ALL, W, 100, false).unwrap();
}

/// POSIX (fcntl(2)): read locks are shared, a write lock excludes every other owner's
/// lock. Decided in memory while the mount is alone.
#[test]
fn read_locks_are_shared_and_a_write_lock_waits_for_them() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let (fh1, fh2) = (h.op(f.ino, libc::O_RDWR), h.op(f.ino, libc::O_RDWR));
    h.setlk(f.ino, fh1, 1, 0, ALL, libc::F_RDLCK, 100, false)
        .unwrap();
    h.setlk(f.ino, fh2, 2, 10, 20, libc::F_RDLCK, 200, false)
        .expect("a second read lock is shared");
    assert_eq!(
        errno(h.setlk(f.ino, fh2, 2, 30, 40, W, 200, false)),
        libc::EAGAIN,
        "a write lock over another owner's read lock"
    );
    let seen = h.getlk(f.ino, 2, 30, 40, W).unwrap();
    assert_eq!(
        (seen.typ, seen.start, seen.end, seen.pid),
        (LockType::Read, 0, ALL, 100),
        "F_GETLK reports the read lock in the way"
    );
    assert_eq!(
        h.getlk(f.ino, 2, 30, 40, libc::F_RDLCK).unwrap().typ,
        LockType::Unlock,
        "a read lock is not in the way of a read lock"
    );
    // A blocking write request waits (counted, and shown as waiting) until the read lock
    // in its way goes.
    assert_eq!(h.status().unwrap().lock_waits, 0);
    let me = std::process::id();
    let h2 = h.arc();
    let blocked = std::thread::spawn(move || h2.setlk(f.ino, fh2, 2, 30, 40, W, me, true));
    assert!(wait_until(Duration::from_secs(10), || h
        .status()
        .unwrap()
        .lock_waiting
        == 1));
    h.setlk(f.ino, fh1, 1, 0, ALL, libc::F_UNLCK, 100, false)
        .unwrap();
    blocked
        .join()
        .unwrap()
        .expect("granted once the read lock went");
    let s = h.status().unwrap();
    assert_eq!((s.lock_waits, s.lock_waiting), (1, 0));
}

/// While another mount is live, locks are decided in the database: a lock conflicts
/// with every other owner's — on this mount too — and with an owner of the same number
/// on another mount (owner numbers are per mount), never with its own owner's.
#[test]
fn locks_decided_in_the_database_tell_owners_apart_by_mount_and_number() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let b = h.second_mount("cache-b");
    assert!(h.shared(), "two mounts: decisions in the database");
    let (fh1, fh2) = (h.op(f.ino, libc::O_RDWR), h.op(f.ino, libc::O_RDWR));
    let fhb = b.open(&CTX, f.ino, libc::O_RDWR).unwrap().fh;
    h.setlk(f.ino, fh1, 1, 0, 10, W, 100, false).unwrap();
    h.setlk(f.ino, fh1, 1, 0, 20, W, 100, false)
        .expect("an owner's own lock is never in its way");
    assert_eq!(
        errno(h.setlk(f.ino, fh2, 2, 5, 5, W, 100, false)),
        libc::EAGAIN,
        "another owner on the same mount"
    );
    assert_eq!(
        errno(b.setlk(f.ino, fhb, 1, 5, 5, W, 200, false)),
        libc::EAGAIN,
        "an owner of the same number on another mount"
    );
    b.setlk(f.ino, fhb, 1, 21, 30, W, 200, false)
        .expect("past the range: no conflict");
}

/// A mount that goes alone again loads the locks it took while shared (in the database)
/// into memory first: a conflicting lock of another owner stays refused once its
/// decisions are made in memory.
#[test]
fn a_mount_going_alone_keeps_the_locks_it_took_while_shared() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let (fh1, fh2) = (h.op(f.ino, libc::O_RDWR), h.op(f.ino, libc::O_RDWR));
    {
        let _b = h.second_mount("cache-b");
        assert!(h.shared());
        h.setlk(f.ino, fh1, 1, 0, 10, W, 100, false).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || matches!(
            *h.locks_table().unwrap(),
            crate::locks::Table::Memory { .. }
        )),
        "the mount never went alone"
    );
    assert_eq!(
        errno(h.setlk(f.ino, fh2, 2, 5, 5, W, 100, false)),
        libc::EAGAIN,
        "the lock taken while shared is still held"
    );
}

/// A lock taken while shared and released after the mount went alone (in memory) has its
/// row removed when the locks are published to a mount that joins: the newcomer can take
/// it.
#[test]
fn a_lock_released_while_alone_is_free_for_a_mount_that_joins() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let fh1 = h.op(f.ino, libc::O_RDWR);
    {
        let _b = h.second_mount("cache-b");
        assert!(h.shared());
        h.setlk(f.ino, fh1, 1, 0, ALL, W, 100, false).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || matches!(
            *h.locks_table().unwrap(),
            crate::locks::Table::Memory { .. }
        )),
        "the mount never went alone"
    );
    h.setlk(f.ino, fh1, 1, 0, ALL, libc::F_UNLCK, 100, false)
        .unwrap();
    let c = h.second_mount("cache-c");
    let fhc = c.open(&CTX, f.ino, libc::O_RDWR).unwrap().fh;
    c.setlk(f.ino, fhc, 2, 0, ALL, W, 200, false)
        .expect("the lock released while alone kept its row in the lock table");
}

/// A mount whose lease renewal fails decides no lock in memory (`EIO`): past its lease,
/// another mount may expire it and decide alone. The failure is real: a trigger in the
/// SQLite database refuses the renewal's update (SQLite only; the rule is the engine's
/// neither way).
#[test]
fn a_mount_that_cannot_renew_its_lease_decides_no_lock_in_memory() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let fh1 = h.op(f.ino, libc::O_RDWR);
    h.setlk(f.ino, fh1, 1, 0, 9, W, 100, false).unwrap();
    assert!(matches!(
        *h.locks_table().unwrap(),
        crate::locks::Table::Memory { .. }
    ));
    let Some(refusal) = h.refuse_updates("sessions", "heartbeat") else {
        return;
    };
    h.locks.forget_renewal();
    assert_eq!(
        errno(h.setlk(f.ino, fh1, 1, 10, 19, W, 100, false)),
        libc::EIO,
        "a lock was decided in memory without a renewed lease"
    );
    refusal.lift();
    h.setlk(f.ino, fh1, 1, 10, 19, W, 100, false)
        .expect("renewed again: decisions go on");
}

/// While an older mount has not acknowledged this one (it is paused), a non-blocking lock
/// request gives up with `EAGAIN` after `JOIN_WAIT`; a blocking one goes on waiting.
#[test]
fn an_unacknowledged_join_fails_a_non_blocking_lock_and_holds_a_blocking_one() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let fh1 = h.op(f.ino, libc::O_RDWR);
    h.setlk(f.ino, fh1, 1, 0, 9, W, 100, false).unwrap();
    let paused = h.locks_table().unwrap();
    let b = h.second_mount("cache-b");
    let fhb = b.open(&CTX, f.ino, libc::O_RDWR).unwrap().fh;
    let me = std::process::id();
    let ask = |start: u64, sleep: bool| {
        let b = Arc::clone(&b);
        std::thread::spawn(move || b.setlk(f.ino, fhb, 2, start, start, W, me, sleep))
    };
    let blocking = ask(100, true);
    let non_blocking = ask(200, false);
    assert!(
        wait_until(crate::feed::JOIN_WAIT * 10, || non_blocking.is_finished()),
        "a non-blocking lock request waits for a paused mount's acknowledgement"
    );
    assert_eq!(errno(non_blocking.join().unwrap()), libc::EAGAIN);
    assert!(
        !blocking.is_finished(),
        "a blocking lock request gave up while the older mount was paused"
    );
    drop(paused);
    blocking
        .join()
        .unwrap()
        .expect("acknowledged: the free range is granted");
}

/// The `l_type` values are Linux's, both ways (F_GETLK replies carry them).
#[test]
fn lock_types_are_the_linux_l_type_values() {
    for (t, raw) in [
        (LockType::Read, libc::F_RDLCK),
        (LockType::Write, libc::F_WRLCK),
        (LockType::Unlock, libc::F_UNLCK),
    ] {
        assert_eq!(t.raw(), raw);
        assert_eq!(LockType::from_raw(raw).unwrap(), t);
    }
    assert_eq!(errno(LockType::from_raw(7).map(|_| ())), libc::EINVAL);
}

#[test]
fn a_late_release_does_not_drop_the_lock_of_a_new_open_file_with_the_same_owner() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    // Process 1's open file (owner 7) holds the flock; it closes, but its RELEASE is late.
    let fh1 = h.op(f.ino, libc::O_RDWR);
    h.setlk(f.ino, fh1, 7, 0, ALL, W, 100, false).unwrap();
    // Process 2's new open file got the same owner id and takes the flock.
    let fh2 = h.op(f.ino, libc::O_RDWR);
    h.setlk(f.ino, fh2, 7, 0, ALL, W, 200, false).unwrap();
    // The late release of the first open file.
    h.release_fh_locks(f.ino, 7, fh1).unwrap();
    h.release(f.ino, fh1).unwrap();
    // Process 2 still holds it: a third owner must not get it.
    let fh3 = h.op(f.ino, libc::O_RDWR);
    assert_eq!(
        errno(h.setlk(f.ino, fh3, 9, 0, ALL, W, 300, false)),
        libc::EAGAIN,
        "the new open file's lock was dropped by the old one's release"
    );
    h.release_fh_locks(f.ino, 7, fh2).unwrap();
    h.setlk(f.ino, fh3, 9, 0, ALL, W, 300, false).unwrap();
}

const R: i32 = libc::F_RDLCK;

#[test]
fn locks_decided_in_memory_while_alone_reach_a_mount_that_joins() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let fh1 = h.op(f.ino, libc::O_RDWR);
    // Alone: taking locks costs no database round trip. The engine's counter also counts
    // the mount's background threads (uploader, feed, heartbeat), so a try that one of
    // them lands in is taken again (the same locks, by the same owner, again); a lock
    // that went to the database makes every try count.
    assert!(!h.shared());
    let quiet_try = (0..5).any(|_| {
        let before = h.meta.counters().round_trips;
        h.setlk(f.ino, fh1, 1, 0, 99, W, 100, false).unwrap();
        h.setlk(f.ino, fh1, 1, 200, ALL, R, 100, false).unwrap();
        h.meta.counters().round_trips == before
    });
    assert!(quiet_try, "a lock decided alone went to the database");
    // A second mount joins: it is acknowledged with the locks in the lock table.
    let b = h.second_mount("cache-b");
    let fhb = b.open(&CTX, f.ino, libc::O_RDWR).unwrap().fh;
    assert_eq!(
        errno(b.setlk(f.ino, fhb, 2, 50, 60, W, 200, false)),
        libc::EAGAIN,
        "the joining mount does not see a write lock taken while the first was alone"
    );
    let seen = b.getlk(f.ino, 2, 0, 10, W).unwrap();
    assert_eq!((seen.typ, seen.start, seen.end), (LockType::Write, 0, 99));
    b.setlk(f.ino, fhb, 2, 300, 400, R, 200, false).unwrap();
    assert_eq!(
        errno(b.setlk(f.ino, fhb, 2, 500, 600, W, 200, false)),
        libc::EAGAIN,
        "a read lock taken while alone must block a write lock"
    );
    // Decisions are shared now: the first mount sees the second's read lock.
    assert_eq!(
        errno(h.setlk(f.ino, fh1, 1, 300, 300, W, 100, false)),
        libc::EAGAIN
    );
    h.setlk(f.ino, fh1, 1, 0, ALL, libc::F_UNLCK, 100, false)
        .unwrap();
    b.setlk(f.ino, fhb, 2, 50, 60, W, 200, false).unwrap();
}

#[test]
fn a_joining_mount_decides_no_lock_before_the_alone_mount_acknowledged_it() {
    // The first mount is "paused" (its decision lock held here): it cannot publish its
    // locks, so it does not acknowledge the newcomer, whose mount goes on after
    // JOIN_WAIT — but whose first lock request must wait for that acknowledgement.
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let fh1 = h.op(f.ino, libc::O_RDWR);
    h.setlk(f.ino, fh1, 1, 0, ALL, W, 100, false).unwrap();
    let paused = h.locks_table().unwrap();
    let b = h.second_mount("cache-b");
    let fhb = b.open(&CTX, f.ino, libc::O_RDWR).unwrap().fh;
    let asked = {
        let b = Arc::clone(&b);
        let me = std::process::id();
        std::thread::spawn(move || b.setlk(f.ino, fhb, 2, 0, ALL, W, me, false))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !asked.is_finished(),
        "a lock was decided before the alone mount acknowledged the newcomer"
    );
    drop(paused);
    assert_eq!(errno(asked.join().unwrap()), libc::EAGAIN);
}

#[test]
fn a_mount_past_its_lease_decides_no_lock_in_memory() {
    // Paused past its lease, a mount may have been expired by another, which may be
    // deciding alone now: the first decision after the pause renews the lease (and finds
    // the session gone) instead of granting from memory.
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let fh1 = h.op(f.ino, libc::O_RDWR);
    h.setlk(f.ino, fh1, 1, 0, ALL, W, 100, false).unwrap();
    let lost = h.coherence.session();
    deskfs_meta::txn(&*h.meta, |t| t.delete_session(lost)).unwrap();
    h.locks.forget_renewal();
    let fh2 = h.op(f.ino, libc::O_RDWR);
    assert!(
        h.setlk(f.ino, fh2, 2, 0, ALL, W, 200, false).is_ok(),
        "the lost session's lock still blocks (decided from memory after the lease)"
    );
    assert_ne!(h.coherence.session(), lost, "the mount registered anew");
}

/// Lock-to-read coherence (as NFS): taking a lock while another mount is live revalidates
/// what this mount cached, so a file it has open reads what the other mount committed
/// before the lock — also when the new content is as long as the old (only the version
/// tells them apart).
#[test]
fn a_lock_reads_what_another_mount_committed_even_at_the_same_size() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"hello");
    let b = h.second_mount("cache-b");
    assert!(h.shared(), "two mounts");
    let fh = h.op(f.ino, libc::O_RDWR);
    assert_eq!(h.read(f.ino, fh, 0, 64).unwrap(), b"hello");
    let seen: Arc<Mutex<Vec<Invalidation>>> = Arc::default();
    let s = seen.clone();
    h.set_invalidator(Box::new(move |inv| s.lock().unwrap().push(inv.clone())));
    let kernel_told = |seen: &Mutex<Vec<Invalidation>>| {
        seen.lock().unwrap().contains(&Invalidation::Inode(f.ino))
    };
    // Nothing changed: the kernel keeps its cached pages and size.
    h.setlk(f.ino, fh, 1, 0, ALL, W, 100, false).unwrap();
    h.setlk(f.ino, fh, 1, 0, ALL, libc::F_UNLCK, 100, false)
        .unwrap();
    assert!(!kernel_told(&seen), "{:?}", seen.lock().unwrap());
    let fhb = b.open(&CTX, f.ino, libc::O_RDWR).unwrap().fh;
    assert_eq!(b.write(f.ino, fhb, 0, b"HELLO").unwrap(), 5);
    b.flush(f.ino, fhb).unwrap();
    b.release(f.ino, fhb).unwrap();
    // The change feed's own invalidation of the commit is delivered and set aside.
    h.feed_round();
    std::thread::sleep(Duration::from_millis(100));
    seen.lock().unwrap().clear();
    h.setlk(f.ino, fh, 1, 0, ALL, W, 100, false).unwrap();
    assert!(
        kernel_told(&seen),
        "the kernel's cached size and pages of the old content stay: {:?}",
        seen.lock().unwrap()
    );
    assert_eq!(
        h.read(f.ino, fh, 0, 64).unwrap(),
        b"HELLO",
        "the lock holder reads the other mount's commit"
    );
}

/// A file open here whose last name another mount removed stays this mount's (ext4 keeps
/// an unlinked file while it is open): a lock on it is granted, with the revalidation
/// that comes with it, and its content still reads.
#[test]
fn a_lock_on_a_file_open_here_that_another_mount_unlinked_is_granted() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"kept");
    let b = h.second_mount("cache-b");
    assert!(h.shared(), "two mounts");
    let fh = h.op(f.ino, libc::O_RDWR);
    b.unlink(&CTX, ROOT_INO, b"f").unwrap();
    h.setlk(f.ino, fh, 1, 0, ALL, W, 100, false)
        .expect("a lock on an open file another mount unlinked");
    assert_eq!(h.read(f.ino, fh, 0, 64).unwrap(), b"kept");
    h.release(f.ino, fh).unwrap();
}
