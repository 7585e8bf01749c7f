//! Import: objects put in the bucket by other tools appear in the tree, lazily.

use deskfs_meta::read;

use super::*;
use crate::rename_flags::EXCHANGE;

fn put(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

#[test]
fn nested_objects_appear_with_sizes_and_content() {
    let big = pattern((2 << 20) + 500_000, 7);
    let big2 = big.clone();
    let h = Harness::build(test_cfg(), move |b| {
        put(b, "top.txt", b"top level");
        put(b, "a/b/c.txt", b"three levels down");
        put(b, "a/x.bin", &big2);
        put(b, "a/zero", b"");
        std::fs::create_dir_all(b.join("a/emptydir")).unwrap();
        put(b, ".deskfs/format", b"reserved");
    });
    assert_eq!(h.ls(ROOT_INO), ["a", "top.txt"], ".deskfs is hidden");
    let top = h.lk(ROOT_INO, "top.txt").unwrap();
    assert_eq!(
        (top.kind, top.size, top.perm, top.nlink),
        (Kind::File, 9, 0o644, 1)
    );
    let a = h.lk(ROOT_INO, "a").unwrap();
    assert_eq!(a.kind, Kind::Dir);
    assert_eq!(h.ls(a.ino), ["b", "emptydir", "x.bin", "zero"]);
    assert_eq!(h.getattr(a.ino).unwrap().nlink, 4, "2 + two subdirectories");
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(h.walk("a/b/c.txt").unwrap().size, 17);
    assert_eq!(h.walk("a/x.bin").unwrap().size, big.len() as u64);
    assert_eq!(h.walk("a/zero").unwrap().size, 0);
    assert_eq!(h.walk("a/emptydir").unwrap().kind, Kind::Dir);
    assert!(h.ls(h.walk("a/emptydir").unwrap().ino).is_empty());
    assert_eq!(errno(h.lk(ROOT_INO, ".deskfs")), libc::ENOENT);

    assert_eq!(h.cat_path("top.txt"), b"top level");
    assert_eq!(h.cat_path("a/b/c.txt"), b"three levels down");
    assert_eq!(h.cat_path("a/zero"), b"");
    // Ranged reads of a multi-block object, out of order.
    let x = h.walk("a/x.bin").unwrap();
    let fh = h.op(x.ino, libc::O_RDONLY);
    let off = (2 << 20) + 1000;
    assert_eq!(
        h.read(x.ino, fh, off, 4000).unwrap(),
        &big[off as usize..off as usize + 4000]
    );
    assert_eq!(h.read(x.ino, fh, 3, 10).unwrap(), &big[3..13]);
    assert!(h.read_to_end(x.ino, fh, 0, 131_072) == big);
    assert_eq!(h.read(x.ino, fh, big.len() as u64, 10).unwrap(), b"");
    h.release(x.ino, fh).unwrap();
    // Mounting changed nothing in the bucket.
    h.sync_all();
    assert_eq!(
        h.bucket_files(),
        [
            ".deskfs/format",
            "a/b/c.txt",
            "a/x.bin",
            "a/zero",
            "top.txt"
        ]
    );
    assert!(h.bucket_file("a/x.bin").unwrap() == big);
}

#[test]
fn thousand_objects_in_one_directory() {
    let h = Harness::build(test_cfg(), |b| {
        std::fs::create_dir_all(b.join("many")).unwrap();
        for i in 0..1000 {
            std::fs::write(
                b.join(format!("many/f{i:04}")),
                format!("content {i}").repeat(i % 7 + 1),
            )
            .unwrap();
        }
    });
    let many = h.lk(ROOT_INO, "many").unwrap();
    let entries = h.ls_entries(many.ino, true);
    assert_eq!(entries.len(), 1002);
    let mut seen = std::collections::HashSet::new();
    for e in &entries[2..] {
        let name = String::from_utf8(e.name.clone()).unwrap();
        let i: usize = name[1..].parse().unwrap();
        assert!(seen.insert(i), "{name} twice");
        let want = format!("content {i}").repeat(i % 7 + 1);
        let a = e.attr.unwrap();
        assert_eq!((a.kind, a.size), (Kind::File, want.len() as u64), "{name}");
    }
    assert_eq!(seen.len(), 1000);
    for i in [0usize, 1, 499, 998, 999] {
        let want = format!("content {i}").repeat(i % 7 + 1);
        assert_eq!(h.cat_path(&format!("many/f{i:04}")), want.as_bytes());
    }
    // Lookups do not import twice.
    assert_eq!(h.ls(many.ino).len(), 1000);
}

#[test]
fn lookup_before_readdir_imports_too() {
    let h = Harness::build(test_cfg(), |b| put(b, "d/e/f.txt", b"found by lookup"));
    assert_eq!(h.cat_path("d/e/f.txt"), b"found by lookup");
    assert_eq!(h.ls(ROOT_INO), ["d"]);
}

#[test]
fn imported_directory_is_not_empty_for_rmdir() {
    let h = Harness::build(test_cfg(), |b| put(b, "d/inside", b"x"));
    assert_eq!(errno(h.rmdir(&CTX, ROOT_INO, b"d")), libc::ENOTEMPTY);
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["inside"]);
    // Nor as a rename target (a fresh mount where d was never listed).
    let h2 = Harness::build(test_cfg(), |b| put(b, "d/inside", b"x"));
    h2.dir(ROOT_INO, "e");
    assert_eq!(
        errno(h2.rename(&CTX, ROOT_INO, b"e", ROOT_INO, b"d", 0)),
        libc::ENOTEMPTY
    );
}

#[test]
fn imported_files_can_be_modified_renamed_and_deleted() {
    let h = Harness::build(test_cfg(), |b| {
        put(b, "edit.txt", b"0123456789");
        put(b, "move.txt", b"moving object");
        put(b, "del.txt", b"bye");
        put(b, "dir/inner.txt", b"inner");
    });
    let e = h.lk(ROOT_INO, "edit.txt").unwrap();
    let fh = h.op(e.ino, libc::O_WRONLY);
    h.put(e.ino, fh, 3, b"abc");
    h.release(e.ino, fh).unwrap();
    assert_eq!(h.cat(e.ino), b"012abc6789");
    h.rename(&CTX, ROOT_INO, b"move.txt", ROOT_INO, b"moved.txt", 0)
        .unwrap();
    h.unlink(&CTX, ROOT_INO, b"del.txt").unwrap();
    let dir = h.lk(ROOT_INO, "dir").unwrap();
    assert_eq!(h.ls(dir.ino), ["inner.txt"]);
    let other = h.dir(ROOT_INO, "other");
    h.rename(&CTX, ROOT_INO, b"dir", other.ino, b"dir2", 0)
        .unwrap();
    assert_eq!(h.lk(other.ino, "dir2").unwrap().ino, dir.ino);
    h.sync_all();
    assert_eq!(
        h.bucket_files(),
        ["edit.txt", "moved.txt", "other/dir2/inner.txt"]
    );
    assert_eq!(
        h.bucket_file("edit.txt").as_deref(),
        Some(&b"012abc6789"[..])
    );
    assert_eq!(
        h.bucket_file("moved.txt").as_deref(),
        Some(&b"moving object"[..])
    );
    assert_eq!(
        h.bucket_file("other/dir2/inner.txt").as_deref(),
        Some(&b"inner"[..])
    );
    assert_eq!(h.cat_path("moved.txt"), b"moving object");
    assert_eq!(h.cat_path("other/dir2/inner.txt"), b"inner");
}

#[test]
fn o_trunc_on_an_imported_file_needs_no_download() {
    let h = Harness::build(test_cfg(), |b| put(b, "f", &pattern(3 << 20, 1)));
    let f = h.lk(ROOT_INO, "f").unwrap();
    let fh = h.op(f.ino, libc::O_RDWR | libc::O_TRUNC);
    assert_eq!(h.getattr(f.ino).unwrap().size, 0);
    h.put(f.ino, fh, 0, b"fresh");
    h.release(f.ino, fh).unwrap();
    assert_eq!(h.cat(f.ino), b"fresh");
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"fresh"[..]));
}

#[test]
fn truncate_and_extend_an_imported_file() {
    let data = pattern((1 << 20) + 100, 3);
    let d2 = data.clone();
    let h = Harness::build(test_cfg(), move |b| {
        put(b, "shrink", &d2);
        put(b, "grow", b"abc");
    });
    let s = h.lk(ROOT_INO, "shrink").unwrap();
    let a = h
        .setattr(
            &CTX,
            s.ino,
            &crate::SetAttr {
                size: Some(5),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.size, 5);
    assert_eq!(h.cat(s.ino), &data[..5]);
    let g = h.lk(ROOT_INO, "grow").unwrap();
    h.setattr(
        &CTX,
        g.ino,
        &crate::SetAttr {
            size: Some(6),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(h.cat(g.ino), b"abc\0\0\0");
    h.sync_all();
    assert_eq!(h.bucket_file("shrink").as_deref(), Some(&data[..5]));
    assert_eq!(h.bucket_file("grow").as_deref(), Some(&b"abc\0\0\0"[..]));
}

#[test]
fn changes_by_other_tools_are_picked_up_after_the_ttl() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            ..test_cfg()
        },
        |b| {
            put(b, "d/changed", b"old");
            put(b, "d/same", b"same");
        },
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["changed", "same"]);
    let c = h.lk(d.ino, "changed").unwrap();
    assert_eq!(h.cat(c.ino), b"old");
    // Another tool rewrites one object and adds one.
    let bd = h.bucket_dir();
    std::thread::sleep(Duration::from_millis(20)); // a different mtime, so a different ETag
    std::fs::write(bd.join("d/changed"), b"new longer content").unwrap();
    std::fs::write(bd.join("d/added"), b"added").unwrap();
    assert_eq!(h.ls(d.ino), ["added", "changed", "same"]);
    let c2 = h.lk(d.ino, "changed").unwrap();
    assert_eq!(c2.ino, c.ino);
    assert_eq!(c2.size, 18);
    assert_eq!(h.cat(c.ino), b"new longer content");
    assert_eq!(h.cat_path("d/added"), b"added");
}

/// A directory of `background_relist_min` entries or more is refreshed on a thread of its
/// own: the `opendir` that finds its listing older than the TTL is served the known
/// entries without waiting for the bucket, one refresh runs at a time, and what it finds
/// shows at a later `readdir`.
#[test]
fn a_large_directory_is_refreshed_in_the_background() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            background_relist_min: 2,
            ..test_cfg()
        },
        |b| {
            put(b, "d/a", b"a");
            put(b, "d/b", b"b");
        },
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(
        h.ls(d.ino),
        ["a", "b"],
        "the first listing waits for the bucket"
    );
    std::fs::write(h.bucket_dir().join("d/added"), b"added").unwrap();
    // While a refresh of `d` runs, an opendir starts no other and waits for none.
    assert!(h.relists.start(d.ino));
    assert_eq!(h.ls(d.ino), ["a", "b"], "the known entries, at once");
    assert_eq!(h.status().unwrap().background_relists, 1);
    h.relists.finish(d.ino, true);
    // The next opendir starts a refresh; a later readdir shows what it found.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let names = h.ls(d.ino);
        if names == ["a", "added", "b"] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the background refresh never showed the new object: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(h.cat_path("d/added"), b"added");
    while h.status().unwrap().background_relists != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a refresh never finished"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_local_delete_is_not_undone_by_a_relisting() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            upload_delay: Duration::from_secs(3600),
            ..test_cfg()
        },
        |b| put(b, "d/f", b"x"),
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["f"]);
    h.unlink(&CTX, d.ino, b"f").unwrap();
    // The object is still in the bucket (upload delayed): a relisting must not revive it.
    assert!(h.bucket_file("d/f").is_some());
    assert!(h.ls(d.ino).is_empty());
    assert_eq!(errno(h.lk(d.ino, "f")), libc::ENOENT);
    h.sync_all();
    assert!(h.bucket_file("d/f").is_none());
    assert!(h.ls(d.ino).is_empty());
}

/// The same for a directory: removed here (`rm -r`) while its objects are still in the
/// bucket (their deletes not yet sent), a relisting of its parent must not bring it back.
#[test]
fn a_local_rmdir_is_not_undone_by_a_relisting() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            upload_delay: Duration::from_secs(3600),
            ..test_cfg()
        },
        |b| put(b, "top/d/f", b"x"),
    );
    let top = h.lk(ROOT_INO, "top").unwrap();
    let d = h.lk(top.ino, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["f"]);
    h.unlink(&CTX, d.ino, b"f").unwrap();
    h.rmdir(&CTX, top.ino, b"d").unwrap();
    assert!(h.bucket_file("top/d/f").is_some());
    assert!(
        h.ls(top.ino).is_empty(),
        "a relisting revived the removed directory"
    );
    assert_eq!(errno(h.lk(top.ino, "d")), libc::ENOENT);
    h.sync_all();
    assert!(h.bucket_file("top/d/f").is_none());
    assert!(h.ls(top.ino).is_empty());
}

/// An upload that lands after its file and directory were removed here, and after the
/// directory's own object was already deleted, leaves an object under the removed
/// directory until the uploader deletes it again: a relisting of the parent meanwhile
/// must not import the directory as new (it was removed here; the object is this mount's
/// own leftover, recorded and pending), and the uploader removes the leftover and, in a
/// local bucket, the directory it left. Found by e2e/82s-soak: a directory journaled
/// removed was back after `kill -9` and a remount.
#[test]
fn an_upload_landing_under_a_removed_directory_does_not_revive_it() {
    use std::sync::atomic::Ordering::SeqCst;
    let (h, top, gate) = removed_dir_with_a_held_put();
    gate.released.store(true, SeqCst);
    // (A delete of the path that was still under way may remove the landed object at
    // once; then the relisting below has nothing to revive from, and passes trivially.)
    assert!(
        wait_until(Duration::from_secs(10), || h
            .bucket_file("top/d/f")
            .is_some()
            || !h.uploader.uploading(b"top/d/f")),
        "the held upload landed"
    );
    assert!(
        h.ls(top.ino).is_empty(),
        "a relisting revived the removed directory"
    );
    assert_eq!(errno(h.lk(top.ino, "d")), libc::ENOENT);
    // The uploader deletes the leftover and, in a local bucket, the directory the put
    // made (racing deletes of the path may finish after the upload's record, so this is
    // waited for rather than a `sync`, whose barrier is the pending marks made before it).
    h.sync_all();
    assert!(
        wait_until(Duration::from_secs(20), || h
            .bucket_file("top/d/f")
            .is_none()
            && !h.bucket_is_dir("top/d")),
        "the leftover object or the local bucket's directory was left behind"
    );
    assert!(h.ls(top.ino).is_empty());
}

/// What [`removed_dir_with_a_held_put`] writes over `top/d/f`.
const REWRITTEN: &[u8] = b"rewritten";

/// `top/d/f` imported, rewritten, its upload held before its PUT; then `f` and `d`
/// removed and their objects deleted from the bucket. Returns the harness, `top` and the
/// held upload's gate.
fn removed_dir_with_a_held_put() -> (Harness, Attr, Arc<crate::uploader::PutGate>) {
    use std::sync::atomic::Ordering::SeqCst;
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            upload_delay: Duration::ZERO,
            ..test_cfg()
        },
        |b| put(b, "top/d/f", b"original"),
    );
    let top = h.lk(ROOT_INO, "top").unwrap();
    let d = h.lk(top.ino, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["f"]);
    let f = h.lk(d.ino, "f").unwrap();
    // Held only for the rewrite's 9 bytes: the upload of the `O_TRUNC` before the write
    // (which may run first, under load) is let through.
    let gate = super::converge::hold_for(&h, "top/d/f", crate::uploader::GatePoint::Put, REWRITTEN);
    let fh = h.op(f.ino, libc::O_WRONLY | libc::O_TRUNC);
    h.put(f.ino, fh, 0, REWRITTEN);
    h.release(f.ino, fh).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || gate.reached.load(SeqCst)),
        "the upload of the rewrite reached its PUT"
    );
    h.unlink(&CTX, d.ino, b"f").unwrap();
    h.rmdir(&CTX, top.ino, b"d").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || {
            read(&*h.meta, |t| t.get_object(b"top/d"))
                .unwrap()
                .is_none()
                && h.bucket_file("top/d/f").is_none()
        }),
        "the removed directory's objects were deleted"
    );
    (h, top, gate)
}

/// A sync begun after the removal returns only once what the held put left under the
/// removed directory is gone too — though that work is found (the put lands) after the
/// sync's barrier was taken: it is marked under the upload's own mark.
#[test]
fn a_sync_waits_for_the_leftovers_of_a_put_landing_under_a_removed_directory() {
    use std::sync::atomic::Ordering::SeqCst;
    let (h, _top, gate) = removed_dir_with_a_held_put();
    let sweep = super::converge::hold(&h, "top/d", crate::uploader::GatePoint::Sweep);
    std::thread::scope(|s| {
        let sync = s.spawn(|| h.sync(SYNC_TIMEOUT));
        std::thread::sleep(Duration::from_millis(100));
        gate.released.store(true, SeqCst);
        assert!(
            wait_until(Duration::from_secs(10), || sweep.reached.load(SeqCst)),
            "the landed put had the removal swept again"
        );
        assert!(
            !wait_until(Duration::from_secs(2), || sync.is_finished()),
            "sync returned while the sweep of the put's leftovers was held"
        );
        sweep.released.store(true, SeqCst);
        sync.join().expect("sync thread").expect("sync");
    });
    assert!(
        h.bucket_file("top/d/f").is_none() && !h.bucket_is_dir("top/d"),
        "sync returned with the put's object or the local bucket's directory still there"
    );
}

/// The listing rule across mounts of one workspace: while mount A's put under a
/// directory A removed has landed but is not recorded yet, mount B's listing of the
/// parent does not import the leftover as a new directory (A's work is pending in the
/// shared database); once A settled it, neither mount has the directory and the bucket
/// holds nothing of it.
#[test]
fn another_mount_does_not_import_the_leftover_of_a_removal_there() {
    use std::sync::atomic::Ordering::SeqCst;
    let (h, top, put_gate) = removed_dir_with_a_held_put();
    let landed =
        super::converge::hold_for(&h, "top/d/f", crate::uploader::GatePoint::Record, REWRITTEN);
    put_gate.released.store(true, SeqCst);
    assert!(
        wait_until(Duration::from_secs(10), || landed.reached.load(SeqCst)),
        "the held put landed"
    );
    assert!(
        h.bucket_file("top/d/f").is_some(),
        "the leftover is in the bucket"
    );
    let b = h.second_mount("cache-b");
    // B's uploader may take the removal's rows meanwhile; give it the time to.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        names_on(&b, top.ino).is_empty(),
        "mount B imported the leftover of A's removal"
    );
    landed.released.store(true, SeqCst);
    // A's sync waits for the upload that was running at its barrier, and so for the
    // removal it marked again (B finished the upload's own row meanwhile).
    h.sync_all();
    assert!(names_on(&b, top.ino).is_empty() && h.ls(top.ino).is_empty());
    assert!(h.bucket_file("top/d/f").is_none() && !h.bucket_is_dir("top/d"));
}

/// Renaming an imported directory whose content was never listed must move that content
/// with it (`mv` of a directory nobody looked into yet).
#[test]
fn rename_of_a_never_listed_imported_directory_keeps_its_content() {
    let h = Harness::build(test_cfg(), |b| {
        put(b, "dir/inner.txt", b"inner");
        put(b, "dir/sub/deep.txt", b"deep");
    });
    let dir = h.lk(ROOT_INO, "dir").unwrap();
    // No lookup or readdir inside `dir` before the rename.
    h.rename(&CTX, ROOT_INO, b"dir", ROOT_INO, b"dir2", 0)
        .unwrap();
    assert_eq!(h.lk(ROOT_INO, "dir2").unwrap().ino, dir.ino);
    assert_eq!(
        h.ls(dir.ino),
        ["inner.txt", "sub"],
        "content of the renamed directory"
    );
    assert_eq!(h.cat_path("dir2/inner.txt"), b"inner");
    assert_eq!(h.cat_path("dir2/sub/deep.txt"), b"deep");
    h.sync(Duration::from_secs(5)).expect("sync");
    assert_eq!(h.bucket_files(), ["dir2/inner.txt", "dir2/sub/deep.txt"]);
}

/// RENAME_EXCHANGE of two files whose content is only in the bucket: after sync each
/// object must hold the other's former content.
#[test]
fn exchange_of_imported_files_swaps_objects() {
    let n = 6;
    let h = Harness::build(test_cfg(), move |b| {
        for i in 0..n {
            put(b, &format!("p{i}/a"), format!("content A{i}").as_bytes());
            put(b, &format!("p{i}/b"), format!("content B{i}").as_bytes());
        }
    });
    for i in 0..n {
        let p = h.lk(ROOT_INO, &format!("p{i}")).unwrap();
        assert_eq!(h.ls(p.ino), ["a", "b"]);
        h.rename(&CTX, p.ino, b"a", p.ino, b"b", EXCHANGE).unwrap();
    }
    h.sync_all();
    let mut wrong = Vec::new();
    for i in 0..n {
        let a = h
            .bucket_file(&format!("p{i}/a"))
            .map(|v| String::from_utf8(v).unwrap());
        let b = h
            .bucket_file(&format!("p{i}/b"))
            .map(|v| String::from_utf8(v).unwrap());
        if a.as_deref() != Some(&format!("content B{i}"))
            || b.as_deref() != Some(&format!("content A{i}"))
        {
            wrong.push(format!("p{i}: a={a:?} b={b:?}"));
        }
        // Through the mount the swap is right in any case.
        assert_eq!(
            h.cat_path(&format!("p{i}/a")),
            format!("content B{i}").as_bytes()
        );
    }
    // What a mount that lost its cache (or another machine) then reads.
    let mut h = h;
    h.remount_after(|dir, _| std::fs::remove_dir_all(dir.join("cache")).unwrap());
    for i in 0..n {
        let a = String::from_utf8(h.cat_path(&format!("p{i}/a"))).unwrap();
        let b = String::from_utf8(h.cat_path(&format!("p{i}/b"))).unwrap();
        if a != format!("content B{i}") || b != format!("content A{i}") {
            wrong.push(format!("p{i} read after cache loss: a={a:?} b={b:?}"));
        }
    }
    assert!(wrong.is_empty(), "bucket objects not swapped: {wrong:#?}");
}

/// Same through the three-rename swap (`mv a t; mv b a; mv t b`) tools use without
/// renameat2.
#[test]
fn three_rename_swap_of_imported_files() {
    let n = 6;
    let h = Harness::build(test_cfg(), move |b| {
        for i in 0..n {
            put(b, &format!("p{i}/a"), format!("content A{i}").as_bytes());
            put(b, &format!("p{i}/b"), format!("content B{i}").as_bytes());
        }
    });
    for i in 0..n {
        let p = h.lk(ROOT_INO, &format!("p{i}")).unwrap();
        assert_eq!(h.ls(p.ino), ["a", "b"]);
        h.rename(&CTX, p.ino, b"a", p.ino, b"t", 0).unwrap();
        h.rename(&CTX, p.ino, b"b", p.ino, b"a", 0).unwrap();
        h.rename(&CTX, p.ino, b"t", p.ino, b"b", 0).unwrap();
    }
    h.sync_all();
    let mut wrong = Vec::new();
    for i in 0..n {
        let a = h
            .bucket_file(&format!("p{i}/a"))
            .map(|v| String::from_utf8(v).unwrap());
        let b = h
            .bucket_file(&format!("p{i}/b"))
            .map(|v| String::from_utf8(v).unwrap());
        let t = h.bucket_file(&format!("p{i}/t"));
        if a.as_deref() != Some(&format!("content B{i}"))
            || b.as_deref() != Some(&format!("content A{i}"))
            || t.is_some()
        {
            wrong.push(format!("p{i}: a={a:?} b={b:?} t={t:?}"));
        }
    }
    assert!(wrong.is_empty(), "bucket objects not swapped: {wrong:#?}");
}

/// Design: "If a file changed in the bucket while it has local unuploaded writes, neither
/// version is lost: local wins at the path, the other is kept beside it under a conflict
/// name". Found at a re-listing (ETag changed, inode dirty).
#[test]
fn bucket_change_during_local_writes_keeps_both_versions() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            upload_delay: Duration::from_secs(3600),
            ..test_cfg()
        },
        |b| put(b, "d/f", b"original"),
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["f"]);
    let f = h.lk(d.ino, "f").unwrap();
    let fh = h.op(f.ino, libc::O_WRONLY | libc::O_TRUNC);
    h.put(f.ino, fh, 0, b"local version");
    h.release(f.ino, fh).unwrap();
    // Another tool changes the object meanwhile.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(h.bucket_dir().join("d/f"), b"remote version").unwrap();
    let names = h.ls(d.ino); // relisting notices the change
    let conflict = names
        .iter()
        .find(|n| n.starts_with("f.deskfs-conflict-bucket-"))
        .unwrap_or_else(|| panic!("no conflict copy beside f: {names:?}"))
        .clone();
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(
        h.cat_path("d/f"),
        b"local version",
        "local wins at the path"
    );
    assert_eq!(h.cat_path(&format!("d/{conflict}")), b"remote version");
    h.sync_all();
    assert_eq!(h.bucket_file("d/f").as_deref(), Some(&b"local version"[..]));
    assert_eq!(
        h.bucket_file(&format!("d/{conflict}")).as_deref(),
        Some(&b"remote version"[..])
    );
    let listed = read(&*h.meta, |t| crate::external::bucket_conflicts(t)).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].path, "d/f");
    assert_eq!(listed[0].saved_as, format!("d/{conflict}"));
    // Nothing more at the next listings and syncs.
    assert_eq!(h.ls(d.ino).len(), 2);
}

/// The same change found at upload time (no re-listing in between): the upload's check
/// of the recorded ETag keeps the bucket's version before the local one overwrites it.
#[test]
fn bucket_change_found_at_upload_keeps_both_versions() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::from_secs(3600),
            upload_delay: Duration::from_secs(3600),
            ..test_cfg()
        },
        |_| {},
    );
    let d = h.dir(ROOT_INO, "d");
    let f = h.file(d.ino, "f", b"first upload");
    h.sync_all();
    let fh = h.op(f.ino, libc::O_WRONLY | libc::O_TRUNC);
    h.put(f.ino, fh, 0, b"local edit");
    h.release(f.ino, fh).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(h.bucket_dir().join("d/f"), b"written by another tool").unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("d/f").as_deref(), Some(&b"local edit"[..]));
    let kept: Vec<String> = h
        .bucket_files()
        .into_iter()
        .filter(|p| p.starts_with("d/f.deskfs-conflict-bucket-"))
        .collect();
    assert_eq!(kept.len(), 1, "{:?}", h.bucket_files());
    assert_eq!(
        h.bucket_file(&kept[0]).as_deref(),
        Some(&b"written by another tool"[..])
    );
    assert_eq!(h.cat_path(&kept[0]), b"written by another tool");
    let listed = read(&*h.meta, |t| crate::external::bucket_conflicts(t)).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
}

/// An object deleted by another tool disappears from the tree after the listing TTL
/// (while the file is clean and closed); so does a directory whose objects are all gone.
/// Content that exists only here stays: a file with unuploaded writes, a directory
/// holding one.
#[test]
fn bucket_side_delete_is_picked_up() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            ..test_cfg()
        },
        |b| {
            put(b, "d/keep", b"k");
            put(b, "d/gone", b"g");
            put(b, "d/dirty", b"old");
            put(b, "d/sub/x", b"x");
            put(b, "d/sub/deep/y", b"y");
            put(b, "d/busy/z", b"z");
        },
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["busy", "dirty", "gone", "keep", "sub"]);
    let sub = h.lk(d.ino, "sub").unwrap();
    assert_eq!(h.ls(sub.ino), ["deep", "x"]);
    let busy = h.lk(d.ino, "busy").unwrap();
    assert_eq!(h.ls(busy.ino), ["z"]);
    // Unuploaded local writes (upload held back: the bucket is read-only for a moment).
    let mut h = h;
    h.remount_with(VfsConfig {
        list_ttl: Duration::ZERO,
        upload_delay: Duration::from_secs(3600),
        ..test_cfg()
    });
    let dirty = h.walk("d/dirty").unwrap();
    let fh = h.op(dirty.ino, libc::O_WRONLY | libc::O_TRUNC);
    h.put(dirty.ino, fh, 0, b"only here");
    h.release(dirty.ino, fh).unwrap();
    let busy = h.walk("d/busy").unwrap();
    h.file(busy.ino, "new", b"made here");
    let bd = h.bucket_dir();
    std::fs::remove_file(bd.join("d/gone")).unwrap();
    std::fs::remove_file(bd.join("d/dirty")).unwrap();
    std::fs::remove_dir_all(bd.join("d/sub")).unwrap();
    std::fs::remove_dir_all(bd.join("d/busy")).unwrap();
    let d = h.walk("d").unwrap();
    assert_eq!(h.ls(d.ino), ["busy", "dirty", "keep"]);
    assert_eq!(errno(h.lk(d.ino, "gone")), libc::ENOENT);
    assert_eq!(errno(h.lk(d.ino, "sub")), libc::ENOENT);
    assert_eq!(h.cat_path("d/dirty"), b"only here");
    assert_eq!(h.ls(busy.ino), ["new"], "z went, the local file stays");
    h.sync_all();
    assert_eq!(h.bucket_file("d/dirty").as_deref(), Some(&b"only here"[..]));
    assert_eq!(
        h.bucket_file("d/busy/new").as_deref(),
        Some(&b"made here"[..])
    );
    assert!(h.bucket_file("d/gone").is_none() && !bd.join("d/sub").exists());
}

/// A bucket that no longer holds the workspace's marker (the format record: a disk not
/// mounted at the bucket dir, a bucket emptied or swapped) empties no directory: what is
/// missing from its listings is not taken as deleted until the marker is back, and
/// status says so meanwhile.
#[test]
fn a_bucket_without_its_marker_deletes_nothing() {
    const MARKER: &str = ".deskfs/format.json";
    let cfg = VfsConfig {
        list_ttl: Duration::ZERO,
        bucket_marker: Some(MARKER.into()),
        ..test_cfg()
    };
    let h = Harness::build(cfg, |b| {
        put(b, MARKER, b"{}");
        put(b, "d/a", b"a");
        put(b, "d/sub/b", b"b");
        put(b, "d/c", b"c");
    });
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["a", "c", "sub"]);
    let sub = h.lk(d.ino, "sub").unwrap();
    assert_eq!(h.ls(sub.ino), ["b"]);
    let bd = h.bucket_dir();
    let aside = h.tmp.path().join("aside");
    std::fs::rename(&bd, &aside).unwrap();
    std::fs::create_dir(&bd).unwrap();
    assert_eq!(
        h.ls(d.ino),
        ["a", "c", "sub"],
        "an empty bucket emptied the directory"
    );
    assert_eq!(h.ls(sub.ino), ["b"]);
    assert!(h.status().unwrap().bucket_marker_missing);
    // The bucket back: status clears, and a real deletion by another tool is taken.
    std::fs::remove_dir(&bd).unwrap();
    std::fs::rename(&aside, &bd).unwrap();
    std::fs::remove_file(bd.join("d/c")).unwrap();
    assert_eq!(h.ls(d.ino), ["a", "sub"]);
    assert!(!h.status().unwrap().bucket_marker_missing);
    assert_eq!(h.cat_path("d/sub/b"), b"b");
}

/// Status counts the blocks of bucket-backed files readers got from the cache (hits)
/// and those they waited for from the bucket (misses), and the bytes fetched.
#[test]
fn block_hits_misses_and_fetched_bytes_are_counted() {
    let bs = deskfs_cache::DEFAULT_BLOCK_SIZE;
    let data = pattern(3 * bs as usize, 7);
    let h = Harness::build(
        VfsConfig {
            readahead_blocks: 0,
            ..test_cfg()
        },
        |b| put(b, "f", &data),
    );
    let f = h.lk(ROOT_INO, "f").unwrap();
    let before = h.status().unwrap();
    assert_eq!((before.block_hits, before.block_misses), (0, 0));
    // The middle block, twice (not from the start: the file is not assembled whole).
    for round in 0..2 {
        let fh = h.op(f.ino, libc::O_RDONLY);
        let got = h.read(f.ino, fh, bs, bs as u32).unwrap();
        assert_eq!(got, &data[bs as usize..2 * bs as usize], "round {round}");
        h.release(f.ino, fh).unwrap();
        // The fetched block is written to the block cache after the reader got it.
        assert!(wait_until(Duration::from_secs(10), || h.fetches.is_empty()));
    }
    let s = h.status().unwrap();
    assert_eq!(
        (s.block_misses, s.block_hits, s.block_fetched_bytes),
        (1, 1, bs),
        "one fetch of one block, then one hit"
    );
}

#[test]
fn odd_names_are_imported_under_their_own_name() {
    let h = Harness::build(test_cfg(), |b| {
        for (i, n) in crate::tests::bucket::ODD_NAMES.iter().enumerate() {
            put(b, n, format!("content {i}").as_bytes());
        }
    });
    let mut want: Vec<String> = crate::tests::bucket::ODD_NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    want.sort();
    let got = h.ls(ROOT_INO);
    let missing: Vec<&String> = want.iter().filter(|n| !got.contains(n)).collect();
    let extra: Vec<&String> = got.iter().filter(|n| !want.contains(n)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, unexpected {extra:?}"
    );
    for (i, n) in crate::tests::bucket::ODD_NAMES.iter().enumerate() {
        assert_eq!(h.cat_path(n), format!("content {i}").as_bytes(), "{n}");
    }
}

#[test]
#[ignore = "NOT SUPPORTED YET (README limits): local bucket: files named like `v#1` (ends in #digits) in the bucket dir are never imported"]
fn name_ending_in_hash_digits_is_imported() {
    let h = Harness::build(test_cfg(), |b| put(b, "v#1", b"hash one"));
    assert_eq!(h.ls(ROOT_INO), ["v#1"]);
    assert_eq!(h.cat_path("v#1"), b"hash one");
}

/// Comparing a directory's listing with what is known costs a few round trips, not some
/// per entry: 300 objects re-listed, one of them replaced by another tool, in under 20
/// (it took two per entry before: 600 on a network database).
#[test]
fn relisting_a_directory_costs_round_trips_per_listing_not_per_entry() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            ..test_cfg()
        },
        |b| {
            for i in 0..300 {
                put(b, &format!("d/f{i:03}"), b"x");
            }
        },
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino).len(), 300);
    std::thread::sleep(Duration::from_millis(20)); // a different mtime, so a different ETag
    std::fs::write(h.bucket_dir().join("d/f007"), b"replaced").unwrap();
    let retries_before = h.meta.counters().retries;
    let before = deskfs_meta::thread_round_trips();
    let fh = h.opendir(d.ino).unwrap();
    let spent = deskfs_meta::thread_round_trips() - before;
    // A transaction run again after a serialization failure (PostgreSQL, with a
    // background commit such as the directory's access time) repeats its round trips.
    let runs = 1 + h.meta.counters().retries - retries_before;
    h.releasedir(d.ino, fh).unwrap();
    assert!(
        spent < 20 * runs,
        "{spent} round trips to re-list 300 entries ({} transactions run again)",
        runs - 1
    );
    assert_eq!(
        h.walk("d/f007").unwrap().size,
        8,
        "the replaced object was seen"
    );
}

/// A listing is a snapshot of the bucket: content this mount wrote and uploaded after the
/// bucket answered (its record newer than the listing) is not taken for another tool's
/// change of the object — which would give the file the listing's older size and drop
/// its local copy. (Seen under load: an exec's file written through a passthrough open
/// read back empty, its size taken from a listing that had seen the truncated version.)
#[test]
fn a_listing_older_than_an_upload_does_not_undo_it() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            ..test_cfg()
        },
        |b| put(b, "d/f", b""),
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["f"]);
    let f = h.lk(d.ino, "f").unwrap();
    let newer = b"written and uploaded while the listing was in flight".to_vec();
    let vfs = h.vfs.clone().expect("mounted");
    let data = newer.clone();
    crate::importer::tests::AFTER_LIST.with(|r| {
        *r.borrow_mut() = Some(Box::new(move || {
            let fh = vfs
                .open(&CTX, f.ino, libc::O_WRONLY | libc::O_TRUNC)
                .unwrap()
                .fh;
            // (A different mtime, so the local bucket's ETag differs.)
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(vfs.write(f.ino, fh, 0, &data).unwrap() as usize, data.len());
            vfs.flush(f.ino, fh).unwrap();
            vfs.release(f.ino, fh).unwrap();
            vfs.sync(SYNC_TIMEOUT).unwrap();
        }))
    });
    assert_eq!(h.ls(d.ino), ["f"], "the listing ran");
    assert!(
        crate::importer::tests::AFTER_LIST.with(|r| r.borrow().is_none()),
        "the upload landed between the listing and its plan"
    );
    assert_eq!(h.getattr(f.ino).unwrap().size, newer.len() as u64);
    assert_eq!(h.cat(f.ino), newer);
    h.sync_all();
    assert_eq!(h.bucket_file("d/f").as_deref(), Some(&newer[..]));
    // And a later listing (the object as recorded) changes nothing.
    assert_eq!(h.ls(d.ino), ["f"]);
    assert_eq!(h.cat(f.ino), newer);
}

/// A listing taken while this mount's upload of a file has put its object but not yet
/// recorded it shows an ETag the record does not know: that is the upload's own content,
/// not another tool's change — no conflict copy is made, and the file keeps its content.
#[test]
fn a_listing_during_an_upload_is_not_a_conflict() {
    use std::sync::atomic::Ordering::SeqCst;
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            upload_delay: Duration::ZERO,
            ..test_cfg()
        },
        |b| put(b, "d/f", b"original"),
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["f"]);
    let f = h.lk(d.ino, "f").unwrap();
    let local = b"the local version";
    // Held only for the rewrite (not the upload of the `O_TRUNC` before it).
    let gate = super::converge::hold_for(&h, "d/f", crate::uploader::GatePoint::Record, local);
    std::thread::sleep(Duration::from_millis(20)); // a different mtime: a new ETag
    let fh = h.op(f.ino, libc::O_WRONLY | libc::O_TRUNC);
    h.put(f.ino, fh, 0, local);
    h.release(f.ino, fh).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || gate.reached.load(SeqCst)),
        "the upload reached its record"
    );
    assert_eq!(
        h.bucket_file("d/f").as_deref(),
        Some(&b"the local version"[..])
    );
    assert_eq!(
        h.ls(d.ino),
        ["f"],
        "no conflict copy of the upload's own object"
    );
    gate.released.store(true, SeqCst);
    h.sync_all();
    assert_eq!(h.ls(d.ino), ["f"]);
    assert_eq!(h.cat(f.ino), b"the local version");
    assert_eq!(
        h.bucket_file("d/f").as_deref(),
        Some(&b"the local version"[..])
    );
}

/// Another tool replaced a file this cache holds a clean copy of: the listing takes the
/// new content (the row names no local copy) and the old staging file goes. A rewrite
/// with `O_TRUNC` landing between the two makes that same file local again; its content,
/// acknowledged by its close, stays. Before, the listing removed the file anyway and the
/// rewrite was in a removed file.
#[test]
fn a_rewrite_racing_a_listing_that_takes_new_content_is_kept() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            ..test_cfg()
        },
        |b| put(b, "d/f", b"the first version"),
    );
    let d = h.lk(ROOT_INO, "d").unwrap();
    assert_eq!(h.ls(d.ino), ["f"]);
    let f = h.lk(d.ino, "f").unwrap();
    assert_eq!(
        h.cat(f.ino),
        b"the first version",
        "now a local, clean copy"
    );
    put(
        &h.bucket_dir(),
        "d/f",
        b"another tool's longer second version",
    );
    let vfs = h.vfs.clone().expect("mounted");
    crate::importer::tests::AFTER_APPLY.with(|r| {
        *r.borrow_mut() = Some(Box::new(move || {
            let fh = vfs
                .open(&CTX, f.ino, libc::O_WRONLY | libc::O_TRUNC)
                .unwrap()
                .fh;
            assert_eq!(vfs.write(f.ino, fh, 0, b"mine").unwrap(), 4);
            vfs.flush(f.ino, fh).unwrap();
            vfs.release(f.ino, fh).unwrap();
        }))
    });
    assert_eq!(h.ls(d.ino), ["f"], "the listing ran");
    assert!(
        crate::importer::tests::AFTER_APPLY.with(|r| r.borrow().is_none()),
        "the listing did not take the new content"
    );
    assert_eq!(h.cat(f.ino), b"mine");
    h.sync_all();
    assert_eq!(h.bucket_file("d/f").as_deref(), Some(&b"mine"[..]));
}

/// An `opendir` whose refresh finds the bucket stalled (an outage retried with backoff)
/// waits for it at most `relist_wait`, then is served the known entries; the refresh
/// goes on in the background and what it finds shows from a later `opendir` on.
/// (82s-soak: SQLite opens a database's directory to fsync it; during a burst of 503
/// answers each such open waited for a listing retried for seconds, and commits of a
/// database on the mount stalled while the bucket was out.)
#[test]
fn an_opendir_waits_for_a_stalled_bucket_listing_at_most_relist_wait() {
    let h = Harness::build(
        VfsConfig {
            list_ttl: Duration::ZERO,
            relist_wait: Duration::from_millis(100),
            ..test_cfg()
        },
        |b| put(b, "stalled/a", b"a"),
    );
    let d = h.lk(ROOT_INO, "stalled").unwrap();
    assert_eq!(h.ls(d.ino), ["a"], "the first listing waits for the bucket");
    put(&h.bucket_dir(), "stalled/added", b"added");
    let (release, released) = std::sync::mpsc::channel::<()>();
    let stalled_for_ever = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stalled_for_ever.clone();
    crate::importer::tests::on_refresh(
        "stalled",
        Box::new(move || {
            if released.recv_timeout(Duration::from_secs(20)).is_err() {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            None
        }),
    );
    assert_eq!(
        h.ls(d.ino),
        ["a"],
        "the opendir waited for the stalled listing"
    );
    assert_eq!(h.status().unwrap().background_relists, 1);
    release.send(()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h.ls(d.ino) != ["a", "added"] {
        assert!(
            std::time::Instant::now() < deadline,
            "the background refresh never showed the new object"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !stalled_for_ever.load(std::sync::atomic::Ordering::SeqCst),
        "the listing was released only by its own timeout"
    );
    assert_eq!(h.status().unwrap().failed_relists, 0);
}

/// A refresh that failed (the bucket out) is not tried again by every `opendir`: the
/// known entries are served without asking the bucket until `list_ttl` after the
/// failure, `deskfs status` counts the directory, and the next refresh after that
/// finds what changed.
#[test]
fn a_failed_refresh_is_not_tried_again_within_the_listing_ttl() {
    let ttl = Duration::from_millis(400);
    let h = Harness::build(
        VfsConfig {
            list_ttl: ttl,
            ..test_cfg()
        },
        |b| put(b, "outage/a", b"a"),
    );
    let d = h.lk(ROOT_INO, "outage").unwrap();
    assert_eq!(h.ls(d.ino), ["a"]);
    put(&h.bucket_dir(), "outage/added", b"added");
    std::thread::sleep(ttl);
    crate::importer::tests::on_refresh(
        "outage",
        Box::new(|| Some(deskfs_bucket::BucketError::Unreachable("injected".into()))),
    );
    assert_eq!(
        h.ls(d.ino),
        ["a"],
        "the failed refresh serves the known entries"
    );
    assert_eq!(h.status().unwrap().failed_relists, 1);
    assert_eq!(
        h.ls(d.ino),
        ["a"],
        "an opendir right after the failure asked the bucket again"
    );
    std::thread::sleep(ttl);
    assert_eq!(h.ls(d.ino), ["a", "added"], "the refresh after the TTL");
    assert_eq!(h.status().unwrap().failed_relists, 0);
}

/// An `O_TRUNC` open of content only the bucket holds makes an empty staging file without
/// a download and names this cache in the row; a crash right after that record (before
/// the truncation's commit) leaves the file whole or empty after recovery — never a clean
/// row naming this cache over the empty file, which served the old version as a run of
/// missing bytes and would have been uploaded so at the file's next change.
#[test]
fn a_crash_inside_an_o_trunc_of_bucket_only_content_leaves_it_whole_or_empty() {
    let data = pattern(64 << 10, 5);
    let d2 = data.clone();
    let mut h = Harness::build(test_cfg(), move |b| put(b, "f", &d2));
    let f = h.lk(ROOT_INO, "f").unwrap();
    assert_ne!(
        h.row(f.ino).unwrap().local,
        h.here(),
        "content only in the bucket"
    );
    crate::data::tests::AFTER_ADOPT_RECORD
        .with(|r| *r.borrow_mut() = Some(Box::new(|| panic!("the daemon dies here (test)"))));
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.open(&CTX, f.ino, libc::O_RDWR | libc::O_TRUNC)
    }));
    assert!(crashed.is_err(), "the O_TRUNC open reached the hook");
    h.crash_and_remount();
    let got = h.cat_path("f");
    assert!(
        got == data || got.is_empty(),
        "after the crash the file is neither whole nor empty: {} bytes, {} of them zero",
        got.len(),
        got.iter().filter(|b| **b == 0).count()
    );
    h.sync_all();
    assert_eq!(
        h.bucket_file("f").unwrap_or_default(),
        got,
        "the bucket agrees"
    );
}
