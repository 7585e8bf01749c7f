//! FUSE passthrough as the VFS sees it: which opens get the backing file, and how writes
//! the kernel makes straight to it (simulated here by writing the backing file) are
//! absorbed, committed, uploaded, and never lost to a clean mark or a crash.

use std::os::unix::fs::FileExt;

use super::*;
use crate::{Opened, SetAttr, SetTime};

/// A workspace with passthrough turned on, as the FUSE adapter does when the kernel
/// grants it.
fn pt_harness() -> Harness {
    let h = Harness::new();
    h.set_passthrough(true);
    h
}

/// `create` of `name` in the root for reading and writing: attributes and the open.
fn create_pt(h: &Harness, name: &str) -> (Attr, Opened) {
    h.create(&CTX, ROOT_INO, name.as_bytes(), 0o644, 0o022, libc::O_RDWR)
        .expect("create")
}

/// Writes `data` at `off` of the backing file, as the kernel does for a passthrough write.
fn kernel_write(o: &Opened, off: u64, data: &[u8]) {
    o.backing
        .as_ref()
        .expect("a passthrough open")
        .write_all_at(data, off)
        .expect("write to the backing file");
}

#[test]
fn writes_through_the_backing_file_are_seen_committed_at_close_and_uploaded() {
    let h = pt_harness();
    let (a, o) = create_pt(&h, "f");
    assert!(
        o.backing.is_some(),
        "a new local file is opened through passthrough"
    );
    kernel_write(&o, 0, b"hello world");
    assert_eq!(
        h.getattr(a.ino).unwrap().size,
        11,
        "getattr reads the backing file"
    );
    assert_eq!(
        h.row(a.ino).unwrap().size,
        0,
        "not committed before the close"
    );
    h.flush(a.ino, o.fh).unwrap();
    assert_eq!(h.row(a.ino).unwrap().size, 11, "flush commits the size");
    kernel_write(&o, 11, b"!");
    h.release(a.ino, o.fh).unwrap();
    drop(o); // the kernel closes the backing file after the release
    assert_eq!(
        h.row(a.ino).unwrap().size,
        12,
        "release commits what came after the flush"
    );
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"hello world!"[..]));
    assert!(
        !h.row(a.ino).unwrap().dirty,
        "clean once uploaded and closed"
    );
}

#[test]
fn a_clean_file_opened_for_writing_is_marked_dirty_before_the_kernel_can_write() {
    let mut h = pt_harness();
    let a = h.file(ROOT_INO, "f", b"old content");
    h.sync_all();
    assert!(!h.row(a.ino).unwrap().dirty);
    let o = h.open(&CTX, a.ino, libc::O_RDWR).unwrap();
    assert!(o.backing.is_some());
    assert!(h.row(a.ino).unwrap().dirty, "marked dirty at the open");
    // The kernel writes; the daemon dies before any close.
    kernel_write(&o, 0, b"NEW");
    h.crash_and_remount();
    // While a process still holds a file of the dead mount, the kernel may still write
    // through the backing file: its content is not taken as final.
    assert!(
        h.sync(Duration::from_millis(1500)).is_err(),
        "not uploaded as final while the dead mount's backing file is held"
    );
    kernel_write(&o, 3, b" late");
    drop(o); // that process closed it
    h.sync_all();
    assert_eq!(
        h.bucket_file("f").as_deref(),
        Some(&b"NEW lateent"[..]),
        "what reached the staging file is uploaded after the crash"
    );
}

#[test]
fn the_uploader_never_marks_a_file_clean_while_passthrough_writers_are_open() {
    let mut h = pt_harness();
    let (a, o) = create_pt(&h, "f");
    kernel_write(&o, 0, b"version one");
    h.flush(a.ino, o.fh).unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"version one"[..]));
    assert!(
        h.row(a.ino).unwrap().dirty,
        "uploaded, but the kernel may write any moment: still dirty"
    );
    // A write never flushed, then a crash: the row was dirty, so it is uploaded.
    kernel_write(&o, 0, b"VERSION");
    drop(o);
    h.crash_and_remount();
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"VERSION one"[..]));
}

#[test]
fn a_writer_closing_without_writing_leaves_the_file_clean() {
    let h = pt_harness();
    let a = h.file(ROOT_INO, "f", b"content");
    h.sync_all();
    let o = h.open(&CTX, a.ino, libc::O_RDWR).unwrap();
    assert!(o.backing.is_some());
    assert!(h.row(a.ino).unwrap().dirty);
    h.flush(a.ino, o.fh).unwrap();
    h.release(a.ino, o.fh).unwrap();
    drop(o);
    let version = h.row(a.ino).unwrap().data_version;
    assert!(
        wait_until(SYNC_TIMEOUT, || !h.row(a.ino).unwrap().dirty),
        "the uploader marks it clean again"
    );
    assert_eq!(
        h.row(a.ino).unwrap().data_version,
        version,
        "no new version"
    );
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"content"[..]));
}

#[test]
fn an_inode_is_never_open_through_the_page_cache_and_passthrough_at_once() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "f", b"abc");
    let cached = h.open(&CTX, a.ino, libc::O_RDONLY).unwrap();
    assert!(
        cached.backing.is_none(),
        "passthrough is off until the kernel grants it"
    );
    h.set_passthrough(true);
    let second = h.open(&CTX, a.ino, libc::O_RDONLY).unwrap();
    assert!(
        second.backing.is_none(),
        "a file open through the page cache keeps every open there"
    );
    h.release(a.ino, cached.fh).unwrap();
    h.release(a.ino, second.fh).unwrap();
    let p1 = h.open(&CTX, a.ino, libc::O_RDONLY).unwrap();
    assert!(p1.backing.is_some());
    // Passthrough turned off (a refused backing file elsewhere): opens of an inode that
    // is open through passthrough still must be, on the same file.
    h.set_passthrough(false);
    let p2 = h.open(&CTX, a.ino, libc::O_RDWR).unwrap();
    let (f1, f2) = (p1.backing.clone().unwrap(), p2.backing.clone().unwrap());
    assert!(Arc::ptr_eq(&f1, &f2), "one backing file per inode");
    h.release(a.ino, p1.fh).unwrap();
    h.release(a.ino, p2.fh).unwrap();
    let after = h.open(&CTX, a.ino, libc::O_RDONLY).unwrap();
    assert!(
        after.backing.is_none(),
        "off for new opens once the last one closed"
    );
    h.release(a.ino, after.fh).unwrap();
}

#[test]
fn a_refused_backing_file_turns_the_open_into_a_cached_one() {
    let h = pt_harness();
    let a = h.file(ROOT_INO, "f", b"abc");
    let o = h.open(&CTX, a.ino, libc::O_RDWR).unwrap();
    assert!(o.backing.is_some());
    h.set_passthrough(false);
    h.passthrough_refused(a.ino, o.fh);
    // Served by the daemon now: its writes are the daemon's.
    h.put(a.ino, o.fh, 0, b"X");
    let second = h.open(&CTX, a.ino, libc::O_RDONLY).unwrap();
    assert!(second.backing.is_none());
    assert_eq!(h.read(a.ino, second.fh, 0, 10).unwrap(), b"Xbc");
    h.release(a.ino, o.fh).unwrap();
    h.release(a.ino, second.fh).unwrap();
    assert_eq!(h.row(a.ino).unwrap().size, 3);
}

#[test]
fn the_daemons_own_changes_and_explicit_times_are_not_taken_for_kernel_writes() {
    let h = pt_harness();
    let (a, o) = create_pt(&h, "f");
    kernel_write(&o, 0, b"0123456789");
    // truncate through setattr while the passthrough writer is open
    let set = SetAttr {
        size: Some(4),
        ..Default::default()
    };
    assert_eq!(h.setattr(&CTX, a.ino, &set).unwrap().size, 4);
    assert_eq!(h.getattr(a.ino).unwrap().size, 4);
    // utimensat after the writes: the explicit mtime stays until the next write
    let when = 1_000_000_000_123;
    let set = SetAttr {
        mtime: Some(SetTime::At(when)),
        ..Default::default()
    };
    h.setattr(&CTX, a.ino, &set).unwrap();
    assert_eq!(h.getattr(a.ino).unwrap().mtime_ns, when);
    h.flush(a.ino, o.fh).unwrap();
    assert_eq!(h.getattr(a.ino).unwrap().mtime_ns, when, "no write since");
    kernel_write(&o, 4, b"45");
    let attr = h.getattr(a.ino).unwrap();
    assert_eq!(attr.size, 6);
    assert!(attr.mtime_ns > when, "a kernel write stamps a new mtime");
    h.release(a.ino, o.fh).unwrap();
    drop(o);
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"012345"[..]));
}

#[test]
fn a_kernel_write_landing_during_the_daemons_truncate_is_absorbed() {
    let h = pt_harness();
    let (a, o) = create_pt(&h, "f");
    kernel_write(&o, 0, b"0123456789");
    // A second thread of the writer extends the file through the backing file while the
    // daemon's truncate holds the inode's lock, after its `set_len`: the size the daemon
    // did not make is that write's, not to be taken for the daemon's own change.
    let backing = o.backing.clone().expect("a passthrough open");
    crate::passthrough::tests::BEFORE_OWN_LOOK.with(|r| {
        *r.borrow_mut() = Some(Box::new(move || {
            backing
                .write_all_at(b"late", 20)
                .expect("write to the backing file");
        }))
    });
    let set = SetAttr {
        size: Some(4),
        ..Default::default()
    };
    h.setattr(&CTX, a.ino, &set).unwrap();
    assert_eq!(
        h.getattr(a.ino).unwrap().size,
        24,
        "the kernel write after the truncate sets the size"
    );
    h.release(a.ino, o.fh).unwrap();
    drop(o);
    h.sync_all();
    let mut want = b"0123".to_vec();
    want.resize(20, 0);
    want.extend_from_slice(b"late");
    assert_eq!(h.bucket_file("f"), Some(want), "uploaded whole");
}

/// A file held open for writing through passthrough while this mount's lease is lost
/// (cut off or paused): another mount commits new content, expires this session, and
/// this mount registers anew before it looks at the backing file again. The kernel's
/// writes found then were made under the lost lease: they are kept beside the file as a
/// conflict copy, never committed over the other mount's content (they were taken for
/// the new session's and overwrote it, found by e2e 86n-partition-hosts).
#[test]
fn passthrough_writes_under_a_lost_lease_become_a_conflict_copy() {
    let h = pt_harness();
    let a = h.file(ROOT_INO, "f", b"old content");
    h.sync_all();
    let o = h.open(&CTX, a.ino, libc::O_RDWR).unwrap();
    assert!(
        o.backing.is_some(),
        "opened through passthrough while alone"
    );
    let (other, _sid) = super::feed::other_mount(&h);
    h.feed_round();
    // The other mount commits its own content (held by its cache), then expires this
    // mount's session (its heartbeats stopped reaching the database).
    let theirs = deskfs_meta::txn(&*other, |t| {
        let mut r = t.get_inode(a.ino)?.expect("inode");
        r.size = 6;
        r.data_version += 1;
        r.local = deskfs_meta::Local::At(7);
        t.update_inode(&r)?;
        Ok::<_, deskfs_meta::MetaError>(r.data_version)
    })
    .unwrap();
    let lost = h.coherence.session();
    super::feed::expire_session(&*other, lost);
    h.fenced(lost);
    assert_ne!(h.coherence.session(), lost, "registered anew");
    // The kernel's write under the lost lease, first seen now.
    // (The kernel stamps the backing file's mtime from its coarse clock, a tick behind
    // ours at most: 20 ms of slack, 100 ms after every earlier time of the file.)
    std::thread::sleep(Duration::from_millis(100));
    let t0 = crate::now_ns() - 20_000_000;
    kernel_write(&o, 0, b"MINE");
    h.release(a.ino, o.fh).expect("release");
    drop(o);
    let r = h.row(a.ino).unwrap();
    assert_eq!(
        (r.data_version, r.size),
        (theirs, 6),
        "the other mount's newer content was overwritten"
    );
    let names = h.ls(ROOT_INO);
    let copy = names
        .iter()
        .find(|n| n.starts_with("f.deskfs-conflict-"))
        .unwrap_or_else(|| panic!("no conflict copy: {names:?}"));
    assert_eq!(h.cat_path(copy), b"MINEcontent");
    // The copy is a new file of its own: its size, times from the writes and its
    // creation, one link, its first version, dirty in this cache — and uploaded.
    let c = h.row(h.walk(copy).unwrap().ino).unwrap();
    assert_eq!((c.size, c.nlink, c.data_version), (11, 1, 1), "{c:?}");
    assert!(
        c.mtime_ns >= t0 && c.ctime_ns >= t0 && c.btime_ns >= t0,
        "{c:?}"
    );
    assert!(c.dirty && c.local == h.here(), "{c:?}");
    h.sync_all();
    assert_eq!(h.bucket_file(copy).as_deref(), Some(&b"MINEcontent"[..]));
}

/// `utimensat` right after kernel writes the daemon has not looked at yet: every request
/// absorbs them before it is served (they came first), so the explicit mtime is the last
/// change and stays — not taken for a write made after it.
#[test]
fn an_explicit_mtime_right_after_unseen_kernel_writes_stays() {
    let h = pt_harness();
    let (a, o) = create_pt(&h, "f");
    kernel_write(&o, 0, b"0123456789");
    let when = 1_000_000_000_123;
    let set = SetAttr {
        mtime: Some(SetTime::At(when)),
        ..Default::default()
    };
    h.setattr(&CTX, a.ino, &set).unwrap();
    let attr = h.getattr(a.ino).unwrap();
    assert_eq!(attr.size, 10, "the kernel's writes");
    assert_eq!(attr.mtime_ns, when, "the explicit mtime came after them");
    h.release(a.ino, o.fh).unwrap();
    drop(o);
    assert_eq!(h.row(a.ino).unwrap().mtime_ns, when, "committed at close");
}

/// A writable passthrough open whose dirty mark the database refuses fails (`EIO`) and
/// gives its place in the inode's state back: the next open, with nothing else open, is
/// a passthrough open again (a leftover count would make it look shared with a cached
/// open, and every later open would be served through the daemon).
#[test]
fn a_passthrough_open_refused_its_dirty_mark_gives_its_place_back() {
    let h = pt_harness();
    let (a, o) = create_pt(&h, "f");
    kernel_write(&o, 0, b"data");
    h.release(a.ino, o.fh).unwrap();
    drop(o);
    h.sync_all();
    assert!(!h.row(a.ino).unwrap().dirty, "clean: a writer must mark it");
    let Some(refusal) = h.refuse_updates("inodes", "dirty") else {
        return;
    };
    let refused = h.open(&CTX, a.ino, libc::O_RDWR);
    assert_eq!(errno(refused.map(|_| ())), libc::EIO, "the dirty mark");
    refusal.lift();
    let o = h.open(&CTX, a.ino, libc::O_RDWR).expect("open again");
    assert!(
        o.backing.is_some(),
        "nothing else is open: a passthrough open again"
    );
    h.release(a.ino, o.fh).unwrap();
}

/// A writable passthrough open made while alone whose handle could not be made (another
/// mount joined and expired this one in between: `EIO`) gives back its writer too: the
/// file, marked dirty for that writer that never wrote, is settled and clean again once
/// synced (a writer left counted would keep every uploader from marking it clean).
#[test]
fn a_passthrough_writer_fenced_before_its_handle_was_made_leaves_the_file_cleanable() {
    let h = pt_harness();
    let (a, o) = create_pt(&h, "f");
    kernel_write(&o, 0, b"data");
    h.release(a.ino, o.fh).unwrap();
    drop(o);
    h.sync_all();
    assert!(!h.row(a.ino).unwrap().dirty);
    let _join = super::feed::join_before_next_handle(&h, true);
    let refused = h.open(&CTX, a.ino, libc::O_RDWR);
    assert_eq!(errno(refused.map(|_| ())), libc::EIO, "fenced");
    h.sync_all();
    assert!(
        !h.row(a.ino).unwrap().dirty,
        "the writer that never was keeps the file dirty"
    );
    assert_eq!(h.cat(a.ino), b"data");
}

/// A writable passthrough open of a clean file that the kernel refused (served by the
/// daemon instead) and that wrote nothing leaves the file clean once synced: the dirty
/// mark made for the passthrough writer is settled when that writer goes.
#[test]
fn a_refused_writer_that_wrote_nothing_leaves_the_file_cleanable() {
    let h = pt_harness();
    let a = h.file(ROOT_INO, "f", b"abc");
    h.sync_all();
    assert!(!h.row(a.ino).unwrap().dirty);
    let o = h.open(&CTX, a.ino, libc::O_RDWR).unwrap();
    assert!(o.backing.is_some());
    assert!(h.row(a.ino).unwrap().dirty, "marked for the writer");
    h.passthrough_refused(a.ino, o.fh);
    h.release(a.ino, o.fh).unwrap();
    h.sync_all();
    assert!(
        !h.row(a.ino).unwrap().dirty,
        "left dirty by a writer that never wrote"
    );
}

/// A file created for reading only (`open(O_CREAT | O_RDONLY)`) has no writer: nothing
/// holds it back from the uploader while it stays open, so it is uploaded and marked
/// clean like any closed file (a writer's lock, taken for a create that will write
/// next, would keep it dirty until the close).
#[test]
fn a_file_created_for_reading_only_is_cleaned_while_it_stays_open() {
    let h = pt_harness();
    let (a, o) = h
        .create(&CTX, ROOT_INO, b"ro", 0o644, 0o022, libc::O_RDONLY)
        .expect("create");
    h.sync(Duration::from_secs(10)).expect("sync");
    assert!(
        !h.row(a.ino).unwrap().dirty,
        "a read-only create kept its empty file dirty while open"
    );
    h.release(a.ino, o.fh).unwrap();
}
