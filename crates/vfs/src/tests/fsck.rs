//! fsck: a healthy workspace has no problem; damage of each class is found and repaired.

use std::path::Path;

use deskfs_cache::Cache;

use super::*;
use crate::fsck::{fsck, FsckOptions, FsckReport};

fn run(dir: &Path, db: &MetaDb, repair: bool) -> FsckReport {
    let meta = db.open();
    let cache = Cache::open(&dir.join("cache"), 64 << 20, 1 << 20).expect("open cache");
    fsck(
        &*meta,
        &cache,
        None,
        FsckOptions {
            repair,
            check_bucket: false,
        },
        &|_| {},
    )
    .expect("fsck")
}

fn kinds(r: &FsckReport) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = r.problems.iter().map(|p| p.kind).collect();
    v.sort();
    v
}

#[test]
fn healthy_workspace_has_no_problem_and_damage_is_repaired() {
    let mut h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let f = h.file(d.ino, "f", b"hello");
    h.link(&CTX, f.ino, ROOT_INO, b"f2").unwrap();
    h.dir(d.ino, "sub");
    h.sync_all();
    let f_ino = f.ino;
    let mut seen = Vec::new();
    h.remount_after(|dir, db| {
        let clean = run(dir, db, false);
        assert!(
            clean.problems.is_empty(),
            "healthy workspace: {:?}",
            clean.problems
        );
        // Damage: wrong link counts, an entry naming nothing, a stray staging file.
        let meta = db.open();
        deskfs_meta::txn(&*meta, |t| {
            t.set_nlink(f_ino, 7)?;
            t.set_nlink(ROOT_INO, 9)?;
            t.insert_dentry(ROOT_INO, b"ghost", 999_999)?;
            Ok::<_, deskfs_meta::MetaError>(())
        })
        .unwrap();
        std::fs::write(dir.join("cache/staging/888888"), b"junk").unwrap();
        let found = run(dir, db, false);
        seen = kinds(&found);
        assert_eq!(found.unrepaired(), found.problems.len());
        let fixed = run(dir, db, true);
        assert_eq!(fixed.unrepaired(), 0, "{:?}", fixed.problems);
        let again = run(dir, db, false);
        assert!(
            again.problems.is_empty(),
            "after repair: {:?}",
            again.problems
        );
    });
    assert_eq!(seen, ["dangling-dentry", "nlink", "nlink"]);
    // The repaired workspace works.
    assert_eq!(h.getattr(f_ino).unwrap().nlink, 2);
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(h.cat_path("f2"), b"hello");
    assert_eq!(errno(h.lk(ROOT_INO, "ghost")), libc::ENOENT);
}

#[test]
fn dirty_staging_longer_than_metadata_is_adopted() {
    let mut h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"abc");
    let ino = f.ino;
    h.remount_after(|dir, db| {
        // A crash after writes reached the staging file but before they were committed.
        let meta = db.open();
        deskfs_meta::txn(&*meta, |t| {
            let mut r = t.get_inode(ino)?.unwrap();
            r.dirty = true;
            t.update_inode(&r)
        })
        .unwrap();
        std::fs::write(dir.join(format!("cache/staging/{ino}")), b"abcdef").unwrap();
        let found = run(dir, db, true);
        assert!(found.problems.is_empty(), "{:?}", found.problems);
        let notes: Vec<&str> = found.notes.iter().map(|n| n.kind).collect();
        assert_eq!(
            notes,
            ["staging-size"],
            "a crash leftover, settled by --repair"
        );
    });
    assert_eq!(h.cat_path("f"), b"abcdef");
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"abcdef"[..]));
}

#[test]
fn content_in_another_cache_is_noted_not_lost() {
    let mut h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"hello");
    h.sync_all();
    let ino = f.ino;
    h.remount_after(|dir, db| {
        // Clean, its only copy in this cache, its object forgotten (the state between the
        // delete of its old name's object and the upload at its new name).
        let meta = db.open();
        deskfs_meta::txn(&*meta, |t| {
            t.delete_object(b"f")?;
            t.mark_pending(b"f", false, 0)?;
            Ok::<_, deskfs_meta::MetaError>(())
        })
        .unwrap();
        let here = run(dir, db, false);
        assert!(here.problems.is_empty(), "{:?}", here.problems);
        let notes: Vec<&str> = here.notes.iter().map(|n| n.kind).collect();
        assert_eq!(notes, ["not-uploaded"]);
        // Checked with another cache dir: that copy is not this cache's to judge.
        let other = Cache::open(&dir.join("other-cache"), 64 << 20, 1 << 20).expect("cache");
        let elsewhere = fsck(
            &*meta,
            &other,
            None,
            FsckOptions {
                repair: false,
                check_bucket: false,
            },
            &|_| {},
        )
        .expect("fsck");
        assert!(elsewhere.problems.is_empty(), "{:?}", elsewhere.problems);
        let notes: Vec<&str> = elsewhere.notes.iter().map(|n| n.kind).collect();
        assert_eq!(notes, ["other-cache"]);
        // In no cache at all: lost.
        deskfs_meta::txn(&*meta, |t| {
            let mut r = t.get_inode(ino)?.unwrap();
            r.local = deskfs_meta::Local::None;
            t.update_inode(&r)
        })
        .unwrap();
        assert_eq!(kinds(&run(dir, db, false)), ["content-missing"]);
    });
}

/// `fsck` between a crash and the next mount (the soak runs it there): a dirty file whose
/// staging file a power loss took — its commit kept, its content never fsynced — is what
/// the next mount's recovery leaves empty, so it is a note; `--repair` empties it now.
/// After a clean unmount the same state has no such cause: a problem.
#[test]
fn content_lost_with_an_unflushed_staging_file_is_a_note_until_the_next_mount() {
    let mut h = Harness::uploads_held();
    let f = h.file(
        ROOT_INO,
        "never-fsynced",
        b"content that never reached the disk",
    );
    let ino = f.ino;
    let staging = move |dir: &Path| dir.join("cache/staging").join(ino.to_string());
    h.crash_and_remount_after(|dir, db| {
        std::fs::remove_file(staging(dir)).expect("remove the staging file");
        let found = run(dir, db, false);
        assert!(found.problems.is_empty(), "{:?}", found.problems);
        let notes: Vec<&str> = found.notes.iter().map(|n| n.kind).collect();
        assert_eq!(notes, ["unflushed-content-lost"]);
        let fixed = run(dir, db, true);
        assert!(fixed.problems.is_empty(), "{:?}", fixed.problems);
        assert_eq!(
            std::fs::metadata(staging(dir)).map(|m| m.len()).ok(),
            Some(0)
        );
        let again = run(dir, db, false);
        assert!(
            again.problems.is_empty() && again.notes.is_empty(),
            "{:?}",
            again
        );
    });
    assert_eq!(h.lk(ROOT_INO, "never-fsynced").unwrap().size, 0);
    let second = h.file(ROOT_INO, "second", b"again").ino;
    h.remount_after(|dir, db| {
        std::fs::remove_file(dir.join("cache/staging").join(second.to_string()))
            .expect("remove the staging file");
        let found = run(dir, db, false);
        assert_eq!(kinds(&found), ["dirty-data-missing"], "after a clean end");
    });
}
