//! The bucket converges to the namespace whatever order uploads and deletes of one path
//! arrive in: an object whose PUT raced with the removal of its path is removed, and a
//! removed directory's leftovers never keep its marker (or come back as files).

use deskfs_meta::{read, txn, ObjectRow};

use super::*;
use crate::uploader::{forget_removed, record_in};

/// The record an upload of `ino`'s content at `path` would write (its object is written
/// into the bucket directory by the test, as the PUT would).
fn upload_record(h: &Harness, path: &str, ino: Ino, etag: &str, size: u64) -> ObjectRow {
    let r = h.row(ino).expect("inode row");
    ObjectRow {
        path: path.as_bytes().to_vec(),
        key: path.to_string(),
        ino,
        kind: Kind::File,
        data_version: r.data_version,
        meta_stamp: r.ctime_ns,
        etag: Some(etag.to_string()),
        size,
    }
}

/// A PUT that lands after its path was unlinked and after the unlink's reconcile found
/// nothing to delete (another mount's uploader, or a directory's recursive reconcile, did
/// the path meanwhile): recording it marks the path again, so the object goes.
#[test]
fn a_put_landing_after_its_path_was_removed_is_deleted() {
    let h = Harness::with_config(VfsConfig {
        upload_delay: Duration::from_secs(3600),
        ..test_cfg()
    });
    let d = h.dir(ROOT_INO, "d");
    let f = h.file(d.ino, "db-shm", b"shared memory v1");
    let row = upload_record(&h, "d/db-shm", f.ino, "\"late\"", 16);
    h.unlink(&CTX, d.ino, b"db-shm").unwrap();
    h.sync_all(); // the unlink's reconcile: nothing recorded, nothing to delete
    assert!(h.bucket_file("d/db-shm").is_none());
    // Now the in-flight upload lands, and is recorded.
    std::fs::write(h.bucket_dir().join("d/db-shm"), b"shared memory v1").unwrap();
    txn(&*h.meta, |t| record_in(t, &row)).unwrap();
    h.sync_all();
    assert!(
        h.bucket_file("d/db-shm").is_none(),
        "an object whose path the namespace no longer has stayed in the bucket: {:?}",
        h.bucket_files()
    );
    assert!(read(&*h.meta, |t| t.get_object(b"d/db-shm"))
        .unwrap()
        .is_none());
    assert!(h.bucket_is_dir("d"), "the live directory keeps its marker");
}

/// A delete of an object whose record was replaced by a newer PUT meanwhile (the DELETE
/// went first, the PUT landed after it): the newer record is kept and the path looked at
/// again, so that object goes too instead of staying unrecorded for ever.
#[test]
fn a_delete_racing_with_a_newer_put_does_not_forget_it() {
    let h = Harness::with_config(VfsConfig {
        upload_delay: Duration::from_secs(3600),
        ..test_cfg()
    });
    let d = h.dir(ROOT_INO, "d");
    let f = h.file(d.ino, "db-shm", b"version one");
    h.sync_all();
    let old = read(&*h.meta, |t| t.get_object(b"d/db-shm"))
        .unwrap()
        .expect("uploaded");
    h.unlink(&CTX, d.ino, b"db-shm").unwrap();
    // The deleter: DELETE of the recorded object...
    std::fs::remove_file(h.bucket_dir().join("d/db-shm")).unwrap();
    // ...meanwhile a PUT of a newer version lands and is recorded...
    std::fs::write(h.bucket_dir().join("d/db-shm"), b"version two").unwrap();
    let newer = ObjectRow {
        etag: Some("\"newer\"".into()),
        size: 11,
        ..upload_record(&h, "d/db-shm", f.ino, "\"newer\"", 11)
    };
    txn(&*h.meta, |t| t.put_object(&newer)).unwrap();
    // ...then the deleter forgets what it deleted.
    let changed = txn(&*h.meta, |t| forget_removed(t, &old)).unwrap();
    assert_eq!(changed.as_ref(), Some(&newer));
    h.sync_all();
    assert!(
        h.bucket_file("d/db-shm").is_none(),
        "the newer object stayed in the bucket: {:?}",
        h.bucket_files()
    );
    // The directory goes with it.
    h.rmdir(&CTX, ROOT_INO, b"d").unwrap();
    h.sync(Duration::from_secs(5)).expect("sync after rmdir");
    assert!(h.bucket_files().is_empty(), "{:?}", h.bucket_files());
}

/// Objects left unrecorded under a directory being removed (a `*.db-shm` whose upload
/// raced with its unlink, an empty directory) are deleted when the namespace has no such
/// path, instead of the removal waiting for ever ("not empty yet in the bucket"); other
/// directories, `.deskfs/` and paths the namespace has are untouched.
#[test]
fn leftovers_under_a_removed_directory_are_deleted() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "app.db", b"database");
    let keep = h.dir(ROOT_INO, "keep");
    h.file(keep.ino, "k", b"kept");
    h.sync_all();
    let bd = h.bucket_dir();
    std::fs::write(bd.join("d/app.db-shm"), b"stale").unwrap();
    std::fs::create_dir_all(bd.join("d/sub/empty")).unwrap();
    std::fs::write(bd.join("d/sub/app.db-wal"), b"stale wal").unwrap();
    std::fs::write(bd.join("keep/unknown"), b"not ours to judge here").unwrap();
    std::fs::create_dir_all(bd.join(".deskfs")).unwrap();
    std::fs::write(bd.join(".deskfs/own"), b"reserved").unwrap();
    h.unlink(&CTX, d.ino, b"app.db").unwrap();
    h.rmdir(&CTX, ROOT_INO, b"d").unwrap();
    h.sync(Duration::from_secs(5))
        .expect("the removal of d reaches the bucket");
    assert!(!bd.join("d").exists(), "d left in the bucket");
    assert_eq!(
        h.bucket_files(),
        [".deskfs/own", "keep/k", "keep/unknown"],
        "only d's leftovers go"
    );
}

/// A directory renamed while its bucket prefix holds a leftover: the old prefix is
/// cleared, the new one holds exactly the namespace's files.
#[test]
fn leftovers_under_a_renamed_directory_are_deleted() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "a", b"a");
    h.sync_all();
    std::fs::write(h.bucket_dir().join("d/stale"), b"stale").unwrap();
    h.rename(&CTX, ROOT_INO, b"d", ROOT_INO, b"e", 0).unwrap();
    h.sync(Duration::from_secs(5)).expect("sync after rename");
    assert!(!h.bucket_dir().join("d").exists(), "{:?}", h.bucket_files());
    assert_eq!(h.bucket_files(), ["e/a"]);
}
