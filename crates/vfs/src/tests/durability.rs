//! Durability choice: under `bucket`, close of a written descriptor, fsync and fsyncdir
//! return only once the content (or the directory's pending changes) is in the bucket;
//! past the bound they fail with EIO and the data stays in the local journal. Under
//! `local` they return before the upload. A long coalescing delay makes "uploaded in the
//! background anyway" impossible within the tests' time.

use super::*;
use crate::Durability;

fn cfg(d: Durability) -> VfsConfig {
    VfsConfig {
        upload_delay: Duration::from_secs(600),
        durability: d,
        bucket_wait: Duration::from_secs(20),
        ..Default::default()
    }
}

#[test]
fn bucket_durability_close_and_fsync_return_with_the_content_in_the_bucket() {
    let h = Harness::with_config(cfg(Durability::Bucket));
    // close
    let a = h.file(ROOT_INO, "closed.txt", b"closed content");
    assert!(!h.row(a.ino).unwrap().dirty, "recorded as clean");
    assert_eq!(
        h.bucket_file("closed.txt").as_deref(),
        Some(&b"closed content"[..])
    );
    // fsync without close, then a rewrite and fdatasync
    let (b, fh) = h.create_rw(ROOT_INO, "fsynced.bin");
    let data = pattern(3 << 20, 7);
    h.put(b.ino, fh, 0, &data);
    h.fsync(b.ino, fh, false).unwrap();
    assert!(
        h.bucket_file("fsynced.bin") == Some(data.clone()),
        "fsync: in the bucket"
    );
    h.put(b.ino, fh, 0, b"REWRITTEN");
    h.fsync(b.ino, fh, true).unwrap();
    let mut want = data.clone();
    want[..9].copy_from_slice(b"REWRITTEN");
    assert!(
        h.bucket_file("fsynced.bin") == Some(want),
        "fdatasync: the new version"
    );
    // A close of a descriptor opened read-only does not wait (nothing written through it).
    let rfh = h.op(b.ino, libc::O_RDONLY);
    h.put(b.ino, fh, 0, b"again");
    h.flush(b.ino, rfh).unwrap();
    h.release(b.ino, rfh).unwrap();
    h.release(b.ino, fh).unwrap();
}

#[test]
fn local_durability_close_and_fsync_return_before_the_upload() {
    let h = Harness::with_config(cfg(Durability::Local));
    h.file(ROOT_INO, "closed.txt", b"closed content");
    let (b, fh) = h.create_rw(ROOT_INO, "fsynced.bin");
    h.put(b.ino, fh, 0, b"fsynced");
    h.fsync(b.ino, fh, false).unwrap();
    assert_eq!(
        h.bucket_file("closed.txt"),
        None,
        "not uploaded yet (600 s delay)"
    );
    assert_eq!(h.bucket_file("fsynced.bin"), None);
    h.release(b.ino, fh).unwrap();
    assert_eq!(h.durability(), Durability::Local);
}

#[test]
fn bucket_durability_fsyncdir_waits_for_renames_and_deletes_under_it() {
    let h = Harness::with_config(cfg(Durability::Bucket));
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "old", b"renamed content");
    h.file(d.ino, "gone", b"deleted");
    assert!(h.bucket_file("d/old").is_some() && h.bucket_file("d/gone").is_some());
    h.rename(&CTX, d.ino, b"old", d.ino, b"new", 0).unwrap();
    h.unlink(&CTX, d.ino, b"gone").unwrap();
    h.mkdir(&CTX, d.ino, b"sub", 0o755, 0).unwrap();
    h.fsyncdir(d.ino).unwrap();
    assert_eq!(
        h.bucket_file("d/new").as_deref(),
        Some(&b"renamed content"[..])
    );
    assert_eq!(h.bucket_file("d/old"), None, "old name deleted");
    assert_eq!(h.bucket_file("d/gone"), None, "unlinked name deleted");
    assert!(h.bucket_is_dir("d/sub"), "new directory's marker");
}

/// The bucket refuses the upload (a file where the object's parent directory should be):
/// close and fsync fail with EIO after the bound, nothing is lost, and the content
/// reaches the bucket once it takes uploads again.
#[test]
fn bucket_durability_fails_with_eio_when_the_bucket_refuses_and_keeps_the_data() {
    let mut c = cfg(Durability::Bucket);
    c.bucket_wait = Duration::from_secs(2);
    let h = Harness::with_config(c);
    let d = h.dir(ROOT_INO, "d");
    h.fsyncdir(ROOT_INO).unwrap();
    assert!(h.bucket_is_dir("d"));
    let marker = h.bucket_dir().join("d");
    std::fs::remove_dir(&marker).unwrap();
    std::fs::write(&marker, b"in the way").unwrap();
    let (f, fh) = h.create_rw(d.ino, "f");
    h.put(f.ino, fh, 0, b"kept in the journal");
    let t = Instant::now();
    assert_eq!(errno(h.flush(f.ino, fh)), libc::EIO, "close: EIO");
    assert!(t.elapsed() < Duration::from_secs(15), "bounded wait");
    assert_eq!(errno(h.fsync(f.ino, fh, false)), libc::EIO, "fsync: EIO");
    h.release(f.ino, fh).unwrap();
    assert_eq!(h.cat_path("d/f"), b"kept in the journal");
    std::fs::remove_file(&marker).unwrap();
    std::fs::create_dir(&marker).unwrap();
    h.sync(SYNC_TIMEOUT).unwrap();
    assert_eq!(
        h.bucket_file("d/f").as_deref(),
        Some(&b"kept in the journal"[..])
    );
}

/// While changes keep coming (a burst: an install, a build), due uploads wait; the first
/// quiet moment (`burst_quiet` without a change) lets them all go. Fails when a burst does
/// not postpone uploads (they go `upload_delay` after each close).
#[test]
fn a_burst_of_changes_postpones_uploads_until_a_quiet_moment() {
    let h = Harness::with_config(VfsConfig {
        upload_delay: Duration::from_millis(10),
        burst_quiet: Duration::from_millis(1500),
        ..Default::default()
    });
    h.file(ROOT_INO, "first.txt", b"first");
    let start = std::time::Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(3) {
        h.file(ROOT_INO, &format!("burst-{n}"), b"x");
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            h.bucket_file("first.txt").is_none(),
            "first.txt was uploaded during the burst (after {n} changes, {:?})",
            start.elapsed()
        );
    }
    let st = h.status().unwrap();
    assert!(
        st.uploads_held_ms.is_some_and(|ms| ms >= 1000),
        "status does not say that a burst holds the uploads: {:?}",
        st.uploads_held_ms
    );
    assert_eq!(st.burst_defer_ms, 60_000);
    let last = format!("burst-{}", n - 1);
    assert!(
        wait_until(Duration::from_secs(15), || {
            h.bucket_file("first.txt").is_some() && h.bucket_file(&last).is_some()
        }),
        "the uploads did not go once the burst ended"
    );
    assert_eq!(h.status().unwrap().uploads_held_ms, None, "still held");
}
