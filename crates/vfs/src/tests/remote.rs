//! Close-to-open across caches: content only this mount's journal holds is uploaded when
//! another mount asks for it, also after it lost its name.

use deskfs_meta::{read, txn};

use super::*;

/// An inode another mount asked for that was renamed over (an orphan now) before the
/// uploader got to its path is uploaded to its orphan key when the request is followed
/// up: the path's upload would upload what the path names now, not it.
#[test]
fn a_wanted_inode_that_lost_its_name_is_uploaded_as_an_orphan() {
    let h = Harness::uploads_held();
    let x = h.file(ROOT_INO, "result", b"version one");
    let id = h.cache.id();
    txn(&*h.meta, |t| t.want_upload(x.ino, id, now_ns())).unwrap();
    h.file(ROOT_INO, ".tmp", b"version two");
    h.rename(&CTX, ROOT_INO, b".tmp", ROOT_INO, b"result", 0)
        .unwrap();
    let row = h.row(x.ino).expect("kept while the kernel knows it");
    assert_eq!(row.nlink, 0);
    h.settle_wanted(&[x.ino]);
    let obj = read(&*h.meta, |t| t.object_with_content(x.ino, row.data_version))
        .unwrap()
        .expect("the orphan's content was uploaded");
    assert_eq!(
        h.bucket_file(&obj.key).as_deref(),
        Some(&b"version one"[..])
    );
    assert!(
        read(&*h.meta, |t| t.wanted_for(id)).unwrap().is_empty(),
        "the request is answered"
    );
}

/// Content that hops from another mount's cache to this one: found to be the other
/// mount's to upload, then uploaded by it (for a waiting open), then rewritten here. The
/// sync barrier waits for this mount's upload of the rewrite: the earlier finding was
/// about another state of the path's pending row (91-bucket-convergence, seed 55:
/// `deskfs sync` returned while the bucket still held the other mount's version).
#[test]
fn sync_waits_for_content_that_came_back_from_another_cache() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"one");
    h.sync_all();
    // The other mount (its own cache) writes "two" and commits it, not uploaded yet.
    let (other, _sid) = super::feed::other_mount(&h);
    let theirs = deskfs_meta::Local::At(h.cache.id() ^ 0x5a5a);
    let mut row = h.row(f.ino).expect("row");
    row.data_version += 1;
    row.size = 3;
    row.local = theirs;
    row.dirty = true;
    row.ctime_ns = now_ns();
    row.mtime_ns = row.ctime_ns;
    txn(&*other, |t| {
        t.update_inode(&row)?;
        t.mark_pending(b"f", false, now_ns())
    })
    .unwrap();
    // This mount's uploader finds the path is the other mount's to do.
    let pending = || {
        read(&*h.meta, |t| t.due_pending(i64::MAX, 16))
            .unwrap()
            .into_iter()
            .find(|p| p.path == b"f")
    };
    assert!(
        wait_until(Duration::from_secs(10), || pending()
            .is_some_and(|p| h.uploader.is_elsewhere(&p))),
        "the uploader never found f to be the other mount's"
    );
    // The other mount uploads "two" (an open here waits for it) and records it.
    let gen = pending().expect("still pending").gen;
    let rt = h.rt.as_ref().expect("runtime");
    let put = rt
        .block_on(
            h.bucket()
                .put_bytes("f", bytes::Bytes::from_static(b"two"), None),
        )
        .unwrap();
    txn(&*other, |t| {
        t.put_object(&deskfs_meta::ObjectRow {
            path: b"f".to_vec(),
            key: "f".into(),
            ino: f.ino,
            kind: Kind::File,
            data_version: row.data_version,
            meta_stamp: row.ctime_ns,
            etag: put.etag.clone(),
            size: 3,
        })?;
        t.finish_pending(b"f", gen)?;
        let mut r = t.get_inode(f.ino)?.expect("row");
        r.dirty = false;
        t.update_inode(&r)
    })
    .unwrap();
    // This mount rewrites it: the content is this cache's now.
    let fh = h.op(f.ino, libc::O_RDWR);
    h.put(f.ino, fh, 0, b"THREE");
    h.flush(f.ino, fh).unwrap();
    h.release(f.ino, fh).unwrap();
    assert_eq!(h.row(f.ino).expect("row").local, h.here());
    h.sync_all();
    assert_eq!(
        h.bucket_file("f").as_deref(),
        Some(&b"THREE"[..]),
        "sync returned before this mount's rewrite reached the bucket"
    );
}

/// A write to a file whose content is only in the bucket downloads it first; when the
/// object it resolved is removed meanwhile (an uploader's copy to the file's new key and
/// delete of the old one, on another mount), the download resolves the source again and
/// reads the new object, instead of failing the write with `EIO` (91-bucket-convergence,
/// seed 55: "request failed with EIO op=write error=object not found").
#[test]
fn a_write_downloading_content_whose_object_moved_reads_the_new_object() {
    let (h, a) = bucket_only(test_cfg());
    let row = h.row(a.ino).expect("imported row");
    assert_ne!(row.local, h.here(), "content only in the bucket");
    // Another mount's uploader copied the content to key "b" and deleted "a"; its
    // records of that land a moment later.
    std::fs::copy(h.bucket_dir().join("a"), h.bucket_dir().join("b")).unwrap();
    std::fs::remove_file(h.bucket_dir().join("a")).unwrap();
    let rt = h.rt.as_ref().expect("runtime");
    let etag = rt
        .block_on(h.bucket().head("b"))
        .unwrap()
        .and_then(|x| x.etag);
    let (other, _sid) = super::feed::other_mount(&h);
    let moved = deskfs_meta::ObjectRow {
        path: b"b".to_vec(),
        key: "b".into(),
        ino: a.ino,
        kind: Kind::File,
        data_version: row.data_version,
        meta_stamp: row.ctime_ns,
        etag,
        size: row.size,
    };
    let records = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        txn(&*other, |t| {
            t.put_object(&moved)?;
            t.delete_object(b"a")
        })
        .unwrap();
    });
    let fh = h.op(a.ino, libc::O_RDWR);
    let n = h.write(a.ino, fh, 0, b"CONTENT");
    records.join().unwrap();
    assert_eq!(n.expect("write while the object moved"), 7);
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.cat(a.ino), b"CONTENT in the bucket");
}

/// Another mount's commits of file `a` (imported, so its first version is in the bucket):
/// first a version only its cache holds (not uploaded), then, `after` later, a newer one
/// it uploaded. Returns the thread making the second commit.
fn commit_held_then_uploaded(
    h: &Harness,
    ino: Ino,
    held: &'static [u8],
    uploaded: &'static [u8],
    after: Duration,
) -> std::thread::JoinHandle<()> {
    let (other, _sid) = super::feed::other_mount(h);
    let theirs = deskfs_meta::Local::At(h.cache.id() ^ 0x5a5a);
    let mut row = h.row(ino).expect("row");
    row.data_version += 1;
    row.size = held.len() as u64;
    row.local = theirs;
    row.dirty = true;
    row.ctime_ns = now_ns();
    row.mtime_ns = row.ctime_ns;
    txn(&*other, |t| t.update_inode(&row)).unwrap();
    let bucket = h.bucket().clone();
    let rt = h.rt.as_ref().expect("runtime").handle().clone();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let put = rt
            .block_on(bucket.put_bytes("a", bytes::Bytes::from_static(uploaded), None))
            .unwrap();
        row.data_version += 1;
        row.size = uploaded.len() as u64;
        row.local = deskfs_meta::Local::None;
        row.dirty = false;
        txn(&*other, |t| {
            t.put_object(&deskfs_meta::ObjectRow {
                path: b"a".to_vec(),
                key: "a".into(),
                ino,
                kind: Kind::File,
                data_version: row.data_version,
                meta_stamp: row.ctime_ns,
                etag: put.etag.clone(),
                size: row.size,
            })?;
            t.update_inode(&row)
        })
        .unwrap();
    })
}

/// A mount with file `a` (imported: "version 1" in the bucket) open with `flags`, and
/// another mount committing "version 2" (held in its cache only) now and "version 3"
/// (uploaded) 300 ms later: the harness, the inode, the handle and that mount's thread.
fn open_while_versions_move(flags: i32) -> (Harness, Ino, u64, std::thread::JoinHandle<()>) {
    let h = Harness::build(
        VfsConfig {
            upload_delay: Duration::from_secs(3600),
            ..test_cfg()
        },
        |b| std::fs::write(b.join("a"), b"version 1").unwrap(),
    );
    let a = h.walk("a").unwrap().ino;
    let fh = h.op(a, flags);
    let other = commit_held_then_uploaded(
        &h,
        a,
        b"version 2",
        b"version 3",
        Duration::from_millis(300),
    );
    (h, a, fh, other)
}

/// A read waiting for another mount's upload of the version it found, which a newer
/// commit replaces meanwhile, reads the newer version instead of failing with `EIO`
/// (86p-coherence-pg: "request failed with EIO op=read error=inode 1356: content not in
/// the bucket yet and not local" while SQLite writers on two mounts took turns).
#[test]
fn a_read_whose_awaited_version_is_replaced_reads_the_newer_one() {
    let (h, a, fh, other) = open_while_versions_move(libc::O_RDONLY);
    let got = h.read(a, fh, 0, 64);
    other.join().unwrap();
    assert_eq!(got.expect("read while versions moved"), b"version 3");
    h.release(a, fh).unwrap();
}

/// The same for a write, which makes the content local first: it waits for the version
/// it found, and downloads the newer one that replaced it.
#[test]
fn a_write_whose_awaited_version_is_replaced_downloads_the_newer_one() {
    let (h, a, fh, other) = open_while_versions_move(libc::O_RDWR);
    let n = h.write(a, fh, 0, b"V");
    other.join().unwrap();
    assert_eq!(n.expect("write while versions moved"), 1);
    h.release(a, fh).unwrap();
    assert_eq!(h.cat(a), b"Version 3");
}

/// An open that fails after its count went into the open-file table — the mount holding
/// the newest content did not upload it in time (`EIO`) — takes that count back: the
/// inode is not left counted open here, where every other mount's `unlink` would keep it
/// for a handle that never existed.
#[test]
fn an_open_failing_on_content_another_cache_kept_takes_its_open_count_back() {
    let h = Harness::with_config(VfsConfig {
        remote_wait: Duration::from_millis(300),
        ..test_cfg()
    });
    let f = h.file(ROOT_INO, "held", b"first");
    let (other, sid) = super::feed::other_mount(&h);
    h.feed_round();
    assert!(h.shared(), "the open is counted only while shared");
    // The other mount commits a version only its cache holds, and never uploads it.
    let mut row = h.row(f.ino).expect("row");
    row.data_version += 1;
    row.size = 6;
    row.local = deskfs_meta::Local::At(h.cache.id() ^ 0x5a5a);
    row.dirty = true;
    txn(&*other, |t| t.update_inode(&row)).unwrap();
    let err = h
        .open(&CTX, f.ino, libc::O_RDONLY)
        .expect_err("content nobody uploads in time");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    h.flush_releases();
    assert!(
        !txn(&*other, |t| t.open_elsewhere(f.ino, sid)).unwrap(),
        "the failed open is still counted in the open-file table"
    );
}

/// Makes the row of `ino` name no copy in any cache (the bucket object is the content),
/// as an eviction's commit does, and leaves `stale` in its staging file — a copy whose
/// removal failed (the next mount's index removes such files).
fn evicted_with_a_stale_copy(h: &Harness, ino: Ino, stale: &[u8]) {
    let mut row = h.row(ino).expect("row");
    row.local = deskfs_meta::Local::None;
    txn(&**h.meta(), |t| t.update_inode(&row)).unwrap();
    std::fs::write(h.cache.staging_path(ino), stale).expect("write the stale copy");
}

/// A write to content held only by the bucket downloads it, and the download replaces a
/// stale staging file of the same inode (left by a failed removal): the write lands on
/// the current content, never on the stale copy's bytes.
#[test]
fn a_download_replaces_a_stale_staging_file() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"current content");
    h.sync_all();
    evicted_with_a_stale_copy(&h, f.ino, b"STALE COPY OF AN OLD VERSION");
    let fh = h.op(f.ino, libc::O_RDWR);
    h.put(f.ino, fh, 0, b"C");
    h.release(f.ino, fh).unwrap();
    assert_eq!(
        h.cat(f.ino),
        b"Current content",
        "written over the stale copy"
    );
    assert_eq!(h.row(f.ino).unwrap().local, h.here(), "held here now");
}

/// A download made local is recorded only while its version is still the current one:
/// when another mount commits a newer version (held by its cache) between the download
/// and the record, the row keeps naming that mount's cache — never this one, which does
/// not hold those bytes.
#[test]
fn a_download_is_not_recorded_over_a_newer_version() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"current content");
    h.sync_all();
    evicted_with_a_stale_copy(&h, f.ino, b"");
    let other = h.db.open();
    let theirs = deskfs_meta::Local::At(h.cache.id() ^ 0x5a5a);
    let ino = f.ino;
    crate::data::tests::BEFORE_ADOPT_RECORD.with(|r| {
        *r.borrow_mut() = Some(Box::new(move || {
            txn(&*other, |t| {
                let mut r = t.get_inode(ino)?.expect("row");
                r.data_version += 1;
                r.size = 6;
                r.local = theirs;
                r.dirty = true;
                t.update_inode(&r)
            })
            .unwrap();
        }))
    });
    let fh = h.op(f.ino, libc::O_RDWR);
    h.put(f.ino, fh, 0, b"C");
    assert!(
        crate::data::tests::BEFORE_ADOPT_RECORD.with(|r| r.borrow().is_none()),
        "the other mount's commit ran"
    );
    assert_eq!(
        h.row(f.ino).unwrap().local,
        theirs,
        "this cache was recorded as the holder of a version it does not have"
    );
    h.release(f.ino, fh).unwrap();
}

/// A mount configured as `cfg` but with uploads held back, and file `a` imported from the
/// bucket ("content in the bucket", not read yet): the harness and the file.
fn bucket_only(cfg: VfsConfig) -> (Harness, Attr) {
    let h = Harness::build(
        VfsConfig {
            upload_delay: Duration::from_secs(3600),
            ..cfg
        },
        |b| std::fs::write(b.join("a"), b"content in the bucket").unwrap(),
    );
    let a = h.walk("a").unwrap();
    assert_ne!(
        h.row(a.ino).unwrap().local,
        h.here(),
        "content only in the bucket"
    );
    (h, a)
}

/// [`bucket_only`] with `remote_wait` 300 ms, the object then removed behind the
/// workspace's back (the record still names it).
fn content_gone_from_the_bucket() -> (Harness, Attr) {
    let (h, a) = bucket_only(VfsConfig {
        remote_wait: Duration::from_millis(300),
        ..test_cfg()
    });
    std::fs::remove_file(h.bucket_dir().join("a")).unwrap();
    (h, a)
}

/// A download whose object stays gone from the bucket (removed behind the workspace's
/// back; the record still names it) fails with `EIO` once `remote_wait` has passed,
/// instead of resolving the source again for ever.
#[test]
fn a_download_whose_object_stays_gone_fails_with_eio_after_the_remote_wait() {
    let (h, a) = content_gone_from_the_bucket();
    let fh = h.op(a.ino, libc::O_RDWR);
    let err = h
        .write(a.ino, fh, 0, b"CONTENT")
        .expect_err("a write over content that is nowhere");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    h.release(a.ino, fh).unwrap();
}

/// A download whose object went (another mount's uploader removed it, and then its
/// record) while the content stays in that mount's cache asks that mount for an upload
/// and reads the new object, instead of failing with `EIO`: a copy kept in a cache
/// counts as the content until the bucket has it again.
#[test]
fn a_download_whose_object_went_asks_the_cache_that_kept_the_content() {
    let (h, a) = bucket_only(test_cfg());
    let (other, _sid) = super::feed::other_mount(&h);
    // The other mount holds a clean copy of the current version.
    let theirs = deskfs_meta::Local::At(h.cache.id() ^ 0x5a5a);
    let mut row = h.row(a.ino).expect("imported row");
    row.local = theirs;
    txn(&*other, |t| t.update_inode(&row)).unwrap();
    // Its uploader removes the object "a" now (this mount's first download attempt
    // finds the record and no object), then the record; later it uploads the content
    // again to "b", as asked, and records that.
    std::fs::remove_file(h.bucket_dir().join("a")).unwrap();
    let bucket = h.bucket().clone();
    let rt = h.rt.as_ref().expect("runtime").handle().clone();
    let ino = a.ino;
    let (version, stamp) = (row.data_version, row.ctime_ns);
    let uploader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        txn(&*other, |t| t.delete_object(b"a")).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let body = bytes::Bytes::from_static(b"content in the bucket");
        let put = rt.block_on(bucket.put_bytes("b", body, None)).unwrap();
        txn(&*other, |t| {
            t.put_object(&deskfs_meta::ObjectRow {
                path: b"b".to_vec(),
                key: "b".into(),
                ino,
                kind: Kind::File,
                data_version: version,
                meta_stamp: stamp,
                etag: put.etag.clone(),
                size: 21,
            })
        })
        .unwrap();
    });
    let fh = h.op(a.ino, libc::O_RDWR);
    let n = h.write(a.ino, fh, 0, b"CONTENT");
    uploader.join().unwrap();
    assert_eq!(n.expect("write while the object was away"), 7);
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.cat(a.ino), b"CONTENT in the bucket");
}

/// A clean file whose row names this cache but whose staging file is gone (removed from
/// the cache dir behind the mount's back) is downloaded again from the bucket at the
/// next write: the missing copy is not waited for as if another mount held the content
/// (that wait ended only after `remote_wait`, spinning on the row meanwhile); a read
/// before it reads the bucket's copy.
#[test]
fn a_clean_local_file_whose_staging_file_is_gone_is_downloaded_again() {
    let h = Harness::with_config(VfsConfig {
        remote_wait: Duration::from_secs(3600),
        ..test_cfg()
    });
    let f = h.file(ROOT_INO, "f", b"content in the bucket");
    h.sync_all();
    let row = h.row(f.ino).expect("row");
    assert!(
        !row.dirty && row.local == h.here(),
        "a clean copy here: {row:?}"
    );
    std::fs::remove_file(h.cache.staging_path(f.ino)).unwrap();
    assert_eq!(h.cat(f.ino), b"content in the bucket", "a read");
    let _ = std::fs::remove_file(h.cache.staging_path(f.ino));
    let fh = h.op(f.ino, libc::O_RDWR);
    assert_eq!(h.write(f.ino, fh, 0, b"CONTENT").expect("write"), 7);
    h.release(f.ino, fh).unwrap();
    assert_eq!(h.cat(f.ino), b"CONTENT in the bucket");
}

/// The same for a read: a block fetch whose object stays gone is resolved again until
/// `remote_wait` has passed, then fails with `EIO`, never for ever.
#[test]
fn a_read_whose_object_stays_gone_fails_with_eio_after_the_remote_wait() {
    let (h, a) = content_gone_from_the_bucket();
    let fh = h.op(a.ino, libc::O_RDONLY);
    let err = h
        .read(a.ino, fh, 0, 64)
        .expect_err("a read of content that is nowhere");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    h.release(a.ino, fh).unwrap();
}

/// An empty file in the bucket, written by this mount with a write that fails (past the
/// largest file size: `EFBIG`): there was nothing to download, an empty staging file was
/// made, and it is the version the bucket holds — the row names this cache and stays
/// clean: a failed write changes nothing, and nothing is uploaded again. Only content
/// that was not empty is recorded dirty when it is made local as an empty file (a
/// truncation to 0: `adopt_local`'s `emptied`, `row.size > 0`).
#[test]
fn an_empty_file_made_local_by_a_failed_write_stays_clean() {
    let h = Harness::build(test_cfg(), |b| {
        std::fs::write(b.join("empty"), b"").unwrap()
    });
    let f = h.lk(ROOT_INO, "empty").unwrap();
    assert_ne!(h.row(f.ino).expect("row").local, h.here(), "not local yet");
    let fh = h.op(f.ino, libc::O_WRONLY);
    assert!(matches!(
        h.write(f.ino, fh, crate::data::MAX_FILE_SIZE, b"x"),
        Err(crate::VfsError::FileTooBig)
    ));
    let row = h.row(f.ino).expect("row");
    assert_eq!(row.local, h.here(), "the write made it local");
    assert!(!row.dirty, "an empty file made local was recorded dirty");
    h.release(f.ino, fh).unwrap();
    assert!(!h.row(f.ino).expect("row").dirty);
}

/// A write to content only the bucket holds downloads it whole first, in ranges of
/// `DOWNLOAD_CHUNK` (8 MiB): a file of more than one range comes down exact, each range
/// checked for a short body (`download_into`).
#[test]
fn a_write_to_a_bucket_only_file_of_several_download_ranges_keeps_every_byte() {
    let size = (8 << 20) + 100_000;
    let data = pattern(size, 41);
    let d = data.clone();
    let h = Harness::build(test_cfg(), move |b| {
        std::fs::write(b.join("big"), &d).unwrap()
    });
    let f = h.lk(ROOT_INO, "big").unwrap();
    assert_ne!(h.row(f.ino).expect("row").local, h.here(), "not local yet");
    let fh = h.op(f.ino, libc::O_WRONLY);
    h.write(f.ino, fh, 1, b"XY")
        .expect("the write downloads the content first");
    h.release(f.ino, fh).unwrap();
    let mut want = data;
    want[1..3].copy_from_slice(b"XY");
    let got = h.cat(f.ino);
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the downloaded content differs");
}
