//! Locks through the VFS: conflicts between owners, and a late release of an open file
//! whose owner id the kernel already gave to a new open file (flock owners are `struct
//! file` addresses, and RELEASE is asynchronous).

use super::*;

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
