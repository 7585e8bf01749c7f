//! The bucket converges to the namespace whatever order uploads and deletes of one path
//! arrive in: an object whose PUT raced with the removal of its path is removed, and a
//! removed directory's leftovers never keep its marker (or come back as files).

use deskfs_meta::{read, txn, ObjectRow};

use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;

use crate::uploader::{forget_removed, record_in, GatePoint, PutGate};

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
    let h = Harness::uploads_held();
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
    let h = Harness::uploads_held();
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

/// Holds `v`'s upload of `path` at `point` until the returned gate is released.
pub(super) fn hold(v: &Vfs, path: &str, point: GatePoint) -> Arc<PutGate> {
    gate_on(v, path, point, None)
}

/// [`hold`] of only the upload that read the row at `content`'s length: a file is
/// created or truncated empty before it is written, and under load the upload of that
/// empty version may start first.
pub(super) fn hold_for(v: &Vfs, path: &str, point: GatePoint, content: &[u8]) -> Arc<PutGate> {
    gate_on(v, path, point, Some(content.len() as u64))
}

/// The gate of [`hold`] and [`hold_for`] (`size`: the row size it holds; `None`: any).
fn gate_on(v: &Vfs, path: &str, point: GatePoint, size: Option<u64>) -> Arc<PutGate> {
    let g = Arc::new(PutGate {
        path: path.as_bytes().to_vec(),
        point,
        size,
        reached: AtomicBool::new(false),
        released: AtomicBool::new(false),
    });
    v.uploader.gates.lock().unwrap().push(g.clone());
    g
}

/// Mount `v` creates `name` in the root holding `data` (create, write, close).
fn create_on(v: &Vfs, name: &str, data: &[u8]) -> Ino {
    let (ino, fh) = create_open_on(v, name, data);
    v.release(ino, fh).expect("release");
    ino
}

/// [`create_on`] with the writer's handle left open (flushed): the inode and the handle.
fn create_open_on(v: &Vfs, name: &str, data: &[u8]) -> (Ino, u64) {
    let (a, o) = v
        .create(&CTX, ROOT_INO, name.as_bytes(), 0o666, 0o022, libc::O_RDWR)
        .expect("create");
    assert_eq!(
        v.write(a.ino, o.fh, 0, data).expect("write") as usize,
        data.len()
    );
    v.flush(a.ino, o.fh).expect("flush");
    (a.ino, o.fh)
}

/// Mount `h` rewrites `ino` from scratch (`O_TRUNC`: no download of the old content).
fn rewrite_on(h: &Harness, ino: Ino, data: &[u8]) {
    let fh = h.op(ino, libc::O_WRONLY | libc::O_TRUNC);
    h.put(ino, fh, 0, data);
    h.flush(ino, fh).unwrap();
    h.release(ino, fh).unwrap();
}

/// Whether the bucket holds `want` at `path` and the records tell the truth about it: the
/// object row names the inode's current version with the ETag the bucket has, and the
/// inode is clean.
fn settled(h: &Harness, path: &str, ino: Ino, want: &[u8]) -> bool {
    let row = h.row(ino).expect("inode row");
    let obj = read(&*h.meta, |t| t.get_object(path.as_bytes())).unwrap();
    let rt = h.rt.as_ref().expect("runtime");
    let held = rt
        .block_on(h.bucket().head(path))
        .unwrap()
        .and_then(|x| x.etag);
    h.bucket_file(path).as_deref() == Some(want)
        && !row.dirty
        && obj.is_some_and(|o| o.data_version == row.data_version && o.etag == held)
}

/// Two mounts with their own caches put one key at once: mount A's upload of the version
/// it wrote began (its PUT held back), then mount B rewrote the file (`O_TRUNC`, so it
/// needed nothing from A) and uploaded, recorded and cleaned the newer version; then A's
/// older PUT landed over it. A finds at its record that its version is no longer the
/// inode's, asks the bucket, records what the bucket really holds, and makes B upload the
/// newest content again — B's staging file counts as dirty (never evicted) until then.
/// Without that, the bucket kept A's older bytes for ever while the inode was clean and
/// its only copy of the newest content evictable (91-bucket-convergence, seed 55).
#[test]
fn an_older_version_landing_over_a_newer_one_is_uploaded_again() {
    let h = Harness::new();
    let a = h.second_mount("cache-a");
    let gate = hold_for(&a, "f", GatePoint::Put, b"older, from mount A");
    let ino = create_on(&a, "f", b"older, from mount A");
    assert!(
        wait_until(Duration::from_secs(10), || gate.reached.load(SeqCst)),
        "A's upload never started"
    );
    rewrite_on(&h, ino, b"NEWEST, from mount B");
    assert!(
        wait_until(Duration::from_secs(10), || settled(
            &h,
            "f",
            ino,
            b"NEWEST, from mount B"
        )),
        "B's upload of the newest version was not recorded"
    );
    // Now A's older PUT lands, and is recorded.
    gate.released.store(true, SeqCst);
    assert!(
        wait_until(Duration::from_secs(10), || h.bucket_file("f").as_deref()
            == Some(&b"older, from mount A"[..])),
        "A's older PUT never landed"
    );
    newest_from_b_settles(
        &h,
        &a,
        ino,
        "the bucket kept the older version (or the records name what it does not hold)",
    );
}

/// The same race, recorded in the other order (the seed-55 symptom): B's PUT of the
/// newest version landed first, A's older one over it, A recorded, then B. B's record
/// used to name its own ETag, an object the bucket no longer held: every read elsewhere
/// failed "object changed in the bucket" for `remote_wait`, then with `EIO`, and the
/// inode was clean. B finds at its record that another put was recorded since its
/// snapshot, asks the bucket, and uploads again instead.
#[test]
fn a_newer_put_recorded_after_an_older_one_landed_over_it_is_done_again() {
    let h = Harness::new();
    let a = h.second_mount("cache-a");
    let gate_a = hold_for(&a, "f", GatePoint::Put, b"older, from mount A");
    let gate_b = hold_for(&h, "f", GatePoint::Record, b"NEWEST, from mount B");
    let ino = create_on(&a, "f", b"older, from mount A");
    let older = h.row(ino).expect("row").data_version;
    assert!(wait_until(Duration::from_secs(10), || gate_a
        .reached
        .load(SeqCst)));
    rewrite_on(&h, ino, b"NEWEST, from mount B");
    assert!(
        wait_until(Duration::from_secs(10), || gate_b.reached.load(SeqCst)),
        "B's upload never landed"
    );
    assert_eq!(
        h.bucket_file("f").as_deref(),
        Some(&b"NEWEST, from mount B"[..])
    );
    // A's older PUT lands over B's, and A records it.
    gate_a.released.store(true, SeqCst);
    assert!(
        wait_until(Duration::from_secs(10), || read(&*h.meta, |t| t
            .get_object(b"f"))
        .unwrap()
        .is_some_and(|o| o.data_version == older)),
        "A's older PUT was not recorded"
    );
    gate_b.released.store(true, SeqCst);
    newest_from_b_settles(
        &h,
        &a,
        ino,
        "the records name an object the bucket does not hold",
    );
}

/// The end of both racing-puts tests: `f` settles on B's newest content (bucket, record
/// and inode agree), B keeps its copy, and mount `a` reads the newest bytes. `what`
/// names the failure.
fn newest_from_b_settles(h: &Harness, a: &Vfs, ino: Ino, what: &str) {
    assert!(
        wait_until(Duration::from_secs(10), || settled(
            h,
            "f",
            ino,
            b"NEWEST, from mount B"
        )),
        "{what}: bucket {:?}, inode {:?}, record {:?}",
        h.bucket_file("f")
            .map(|b| String::from_utf8_lossy(&b).into_owned()),
        h.row(ino),
        read(&*h.meta, |t| t.get_object(b"f")).unwrap()
    );
    assert!(h.staging_exists(ino), "B's copy of the newest version went");
    assert_eq!(read_on(a, ino), b"NEWEST, from mount B");
}

/// The whole content of `ino` read through mount `v`.
fn read_on(v: &Vfs, ino: Ino) -> Vec<u8> {
    let o = v.open(&CTX, ino, libc::O_RDONLY).expect("open");
    let d = v.read(ino, o.fh, 0, 1 << 20).expect("read");
    v.release(ino, o.fh).expect("release");
    d
}

/// An older put that lands over a recorded, clean version and is never recorded (its
/// mount died between its PUT and its record): the record names an object the bucket no
/// longer holds. Before the holder's staging file — the last copy — is evicted, the
/// bucket is asked; it is kept, made dirty and uploaded again (the bytes found in its
/// place are kept beside it, as any unrecorded write is). Without the check the cache
/// (here 1 byte: every clean file is over its cap) evicted it and the content was gone.
#[test]
fn a_clean_file_is_not_evicted_when_the_bucket_lost_its_content() {
    let h = Harness::new();
    let a = h.second_mount_with("cache-a", 1);
    let gate = hold_for(&a, "f", GatePoint::Record, b"the only copy is in cache A");
    let ino = create_on(&a, "f", b"the only copy is in cache A");
    assert!(wait_until(Duration::from_secs(10), || gate
        .reached
        .load(SeqCst)));
    // The dead mount's older PUT lands now, over A's.
    std::fs::write(h.bucket_dir().join("f"), b"older bytes").unwrap();
    gate.released.store(true, SeqCst);
    assert!(
        wait_until(Duration::from_secs(20), || settled(
            &h,
            "f",
            ino,
            b"the only copy is in cache A"
        )),
        "the content was not uploaded again: bucket {:?}, inode {:?}",
        h.bucket_file("f")
            .map(|b| String::from_utf8_lossy(&b).into_owned()),
        h.row(ino)
    );
    assert_eq!(h.cat(ino), b"the only copy is in cache A");
    let kept = h.ls(ROOT_INO);
    assert!(
        kept.iter().any(|n| n.starts_with("f.deskfs-conflict-")),
        "the bytes found in the bucket were not kept: {kept:?}"
    );
}

/// A clean, local file renamed: the reconcile of its old name deletes the old object
/// (the content is local, so it downloads nothing) while the new name is not uploaded
/// yet. An eviction between the content check and that delete found the object
/// recorded (its bucket check ran before) and dropped the staging file: the content was
/// then nowhere (found by the soak test: fsck "content-missing"). The eviction now
/// relies only on an object whose path has no pending work, read in its own
/// transaction.
#[test]
fn a_renamed_file_is_not_evicted_while_its_old_object_is_being_deleted() {
    let h = Harness::new();
    let a = h.second_mount_with("cache-a", 1);
    let content = b"only in cache A once the old object goes";
    // Written on A and kept open (read-only) so no eviction takes it before the rename.
    let (ino, w) = create_open_on(&a, "f", content);
    let r = a.open(&CTX, ino, libc::O_RDONLY).expect("open");
    a.release(ino, w).expect("release");
    assert!(
        wait_until(Duration::from_secs(20), || settled(&h, "f", ino, content)),
        "f was not uploaded"
    );
    assert_eq!(h.row(ino).expect("row").local, a.here(), "f is local to A");
    // A's uploader alone does the rows (the other mount's would download f's content
    // into its own cache first: another case); it holds the delete of f's object and
    // the upload (a COPY from f, or a PUT) of g.
    h.uploader.stop();
    let gates = [
        hold(&a, "f", GatePoint::Delete),
        hold_for(&a, "g", GatePoint::Put, content),
    ];
    a.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"g", 0)
        .expect("rename");
    assert!(
        wait_until(Duration::from_secs(10), || gates
            .iter()
            .any(|g| g.path == b"f" && g.reached.load(SeqCst))),
        "the delete of f's object never came"
    );
    a.release(ino, r.fh).expect("release");
    // Counted clean again in A's cache (an eviction round took it off that list while it
    // was open), so this eviction considers it.
    a.cache.staging_clean(ino, content.len() as u64);
    assert!(
        wait_until(Duration::from_secs(10), || !read(&*h.meta, |t| t
            .open_elsewhere(ino, 0))
        .unwrap()),
        "the close of f on A was never published"
    );
    a.evict();
    for g in &gates {
        g.released.store(true, SeqCst);
    }
    assert!(
        wait_until(Duration::from_secs(20), || settled(&h, "g", ino, content)),
        "g's content was lost: bucket {:?}, inode {:?}, staging on A {}",
        h.bucket_file("g")
            .map(|b| String::from_utf8_lossy(&b).into_owned()),
        h.row(ino),
        a.cache.has_staging(ino)
    );
    assert_eq!(read_on(&a, ino), content);
    assert_eq!(h.bucket_file("f"), None);
}

/// A clean file an eviction round finds busy — its state locked by a request at that
/// moment, so it counts as open — is evicted by a later round once it is free. Before,
/// the round took it off the cache's list of clean files for good: no close came to put
/// it back, and the cache stayed over its cap until the file's next upload.
#[test]
fn a_clean_file_busy_during_an_eviction_round_is_evicted_by_a_later_one() {
    let h = Arc::new(Harness::with_cache_capacity(1));
    let content = b"clean, local, busy while the cache is over its cap";
    let (ino, w) = create_open_on(&h, "f", content);
    // Held open past the upload: no eviction round takes it first.
    let held = h.open(&CTX, ino, libc::O_RDONLY).expect("open");
    h.release(ino, w).expect("release");
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&content[..]));
    h.release(ino, held.fh).expect("release");
    // A request holds the inode's state (as a getattr or a setattr does) while a round
    // looks at it.
    let (entered, leave) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let request = {
        let (h, entered, leave) = (h.clone(), entered.clone(), leave.clone());
        std::thread::spawn(move || {
            h.locked(ino, |_| {
                entered.store(true, SeqCst);
                while !leave.load(SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            })
        })
    };
    assert!(wait_until(Duration::from_secs(10), || entered.load(SeqCst)));
    let round = {
        let h = h.clone();
        std::thread::spawn(move || h.evict())
    };
    std::thread::sleep(Duration::from_millis(300));
    leave.store(true, SeqCst);
    request.join().expect("request").expect("locked");
    round.join().expect("eviction round");
    assert_eq!(h.row(ino).expect("row").local, h.here(), "kept while busy");
    h.evict();
    assert_ne!(
        h.row(ino).expect("row").local,
        h.here(),
        "free again, it is evicted by the next round"
    );
    assert!(!h.cache.has_staging(ino), "its staging file is removed");
    assert_eq!(h.cat(ino), content);
}

/// A file evicted by a committed record (the cache is over its cap) and opened with
/// `O_TRUNC` before its staging file is removed: the open needs no download and makes
/// that same file local again, then writes to it. The eviction must leave it. Before, it
/// removed the file after its record outside any lock, and the rewrite — acknowledged by
/// its close — was in a removed file: never uploaded, unreadable.
#[test]
fn an_eviction_leaves_a_file_rewritten_before_its_removal() {
    let h = Harness::new();
    let a = h.second_mount_with("cache-a", 1);
    // Held until the hook is in place: the file is evicted right after its record.
    let gate = hold_for(
        &a,
        "f",
        GatePoint::Record,
        b"first content, uploaded then evicted",
    );
    let ino = create_on(&a, "f", b"first content, uploaded then evicted");
    let ran = Arc::new(AtomicBool::new(false));
    let (v, flag) = ((*a).clone(), ran.clone());
    *a.uploader.before_evict_remove.lock().unwrap() = Some(Box::new(move || {
        let o = v
            .open(&CTX, ino, libc::O_WRONLY | libc::O_TRUNC)
            .expect("open");
        v.write(ino, o.fh, 0, b"rewritten").expect("write");
        v.flush(ino, o.fh).expect("flush");
        v.release(ino, o.fh).expect("release");
        flag.store(true, SeqCst);
    }));
    gate.released.store(true, SeqCst);
    assert!(
        wait_until(Duration::from_secs(20), || ran.load(SeqCst)),
        "the file was never evicted"
    );
    assert!(
        wait_until(Duration::from_secs(20), || settled(
            &h,
            "f",
            ino,
            b"rewritten"
        )),
        "the rewrite was not uploaded: bucket {:?}, inode {:?}",
        h.bucket_file("f")
            .map(|b| String::from_utf8_lossy(&b).into_owned()),
        h.row(ino)
    );
    assert_eq!(read_on(&a, ino), b"rewritten");
}
