//! unlink, and open-unlinked files.

use super::*;

#[test]
fn unlink_errors() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let f = h.file(ROOT_INO, "f", b"x");
    assert_eq!(errno(h.unlink(&CTX, ROOT_INO, b"d")), libc::EISDIR);
    assert_eq!(errno(h.unlink(&CTX, ROOT_INO, b"nope")), libc::ENOENT);
    assert_eq!(errno(h.unlink(&CTX, f.ino, b"x")), libc::ENOTDIR);
    assert_eq!(errno(h.unlink(&CTX, 987_654, b"x")), libc::ESTALE);
    assert_eq!(errno(h.unlink(&CTX, ROOT_INO, b".")), libc::EINVAL);
    // Nothing changed.
    assert_eq!(h.ls(ROOT_INO), ["d", "f"]);
    assert_eq!(h.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 3);
}

#[test]
fn unlink_removes_name_inode_and_staging() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"content");
    assert!(h.staging_exists(f.ino));
    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    assert_eq!(errno(h.lk(ROOT_INO, "f")), libc::ENOENT);
    // The kernel still holds the inode (it looked it up): a process that resolved the
    // path a moment ago can still use it, as on ext4.
    assert_eq!(h.getattr(f.ino).unwrap().nlink, 0);
    assert!(h.row(f.ino).is_some(), "kept while the kernel holds it");
    h.kernel_forgets(f.ino);
    assert_eq!(errno(h.getattr(f.ino)), libc::ESTALE);
    assert!(h.row(f.ino).is_none());
    assert!(
        !h.staging_exists(f.ino),
        "staging file of a deleted file is removed"
    );
    assert!(h.ls(ROOT_INO).is_empty());
    // Special files and symlinks unlink the same way.
    let l = h.symlink(&CTX, ROOT_INO, b"l", b"x").unwrap();
    let p = h
        .mknod(&CTX, ROOT_INO, b"p", libc::S_IFIFO | 0o644, 0, 0)
        .unwrap();
    h.unlink(&CTX, ROOT_INO, b"l").unwrap();
    h.unlink(&CTX, ROOT_INO, b"p").unwrap();
    h.forget_many(&[(l.ino, 1), (p.ino, 1)]);
    h.flush_purges();
    assert!(h.ls(ROOT_INO).is_empty());
    assert_eq!(
        h.statfs().unwrap().ffree,
        h.statfs().unwrap().files - 1,
        "only the root is left"
    );
}

#[test]
fn open_unlinked_file_lives_until_last_release() {
    let h = Harness::new();
    let (a, w) = h.create_rw(ROOT_INO, "f");
    h.put(a.ino, w, 0, b"before");
    h.flush(a.ino, w).unwrap();
    let r = h.op(a.ino, libc::O_RDONLY);

    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    assert_eq!(errno(h.lk(ROOT_INO, "f")), libc::ENOENT);
    assert!(h.ls(ROOT_INO).is_empty());
    let g = h.getattr(a.ino).unwrap();
    assert_eq!((g.nlink, g.size), (0, 6));

    // Still readable and writable through the handles.
    assert_eq!(h.read(a.ino, r, 0, 100).unwrap(), b"before");
    h.put(a.ino, w, 6, b"+after");
    assert_eq!(h.read(a.ino, r, 0, 100).unwrap(), b"before+after");
    h.flush(a.ino, w).unwrap();
    assert_eq!(h.getattr(a.ino).unwrap().size, 12);
    // ftruncate and fchmod through the handle still work.
    let t = h.setattr(
        &CTX,
        a.ino,
        &crate::SetAttr {
            size: Some(13),
            mode: Some(0o600),
            fh: Some(w),
            ..Default::default()
        },
    );
    assert_eq!(
        t.map(|a| (a.size, a.perm, a.nlink)).unwrap(),
        (13, 0o600, 0)
    );
    assert_eq!(h.read(a.ino, r, 12, 10).unwrap(), b"\0");
    h.setattr(
        &CTX,
        a.ino,
        &crate::SetAttr {
            size: Some(12),
            ..Default::default()
        },
    )
    .unwrap();
    h.release(a.ino, w).unwrap();
    // One handle left: still there.
    assert_eq!(h.read(a.ino, r, 7, 100).unwrap(), b"after");
    assert!(h.staging_exists(a.ino));
    // The name can be reused meanwhile by another inode.
    let other = h.file(ROOT_INO, "f", b"new");
    assert_ne!(other.ino, a.ino);
    assert_eq!(h.read(a.ino, r, 0, 6).unwrap(), b"before");

    h.release(a.ino, r).unwrap();
    assert!(h.row(a.ino).is_some(), "the kernel still holds it");
    h.kernel_forgets(a.ino);
    assert_eq!(errno(h.getattr(a.ino)), libc::ESTALE);
    assert!(h.row(a.ino).is_none());
    assert!(!h.staging_exists(a.ino));
    assert_eq!(h.cat_path("f"), b"new");

    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"new"[..]));
}

#[test]
fn unlinked_file_with_two_handles_is_purged_after_both_close() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let h1 = h.op(f.ino, libc::O_RDONLY);
    let h2 = h.op(f.ino, libc::O_RDONLY);
    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    // The kernel lets go of its lookup references; the handles still hold the inode.
    h.kernel_forgets(f.ino);
    h.release(f.ino, h1).unwrap();
    assert_eq!(h.getattr(f.ino).unwrap().nlink, 0, "still open once");
    h.release(f.ino, h2).unwrap();
    assert_eq!(
        errno(h.getattr(f.ino)),
        libc::ESTALE,
        "purged at the last close"
    );
    assert!(!h.staging_exists(f.ino));
}

#[test]
fn replacing_an_open_file_by_rename_keeps_it_readable() {
    let h = Harness::new();
    let old = h.file(ROOT_INO, "target", b"old content");
    h.file(ROOT_INO, "src", b"new content");
    let r = h.op(old.ino, libc::O_RDONLY);
    h.rename(&CTX, ROOT_INO, b"src", ROOT_INO, b"target", 0)
        .unwrap();
    assert_eq!(h.cat_path("target"), b"new content");
    assert_eq!(h.getattr(old.ino).unwrap().nlink, 0);
    assert_eq!(h.read(old.ino, r, 0, 100).unwrap(), b"old content");
    h.release(old.ino, r).unwrap();
    // Still held by the kernel (a path walk may be on it): open works, as on ext4.
    let again = h.op(old.ino, libc::O_RDONLY);
    assert_eq!(h.read(old.ino, again, 0, 100).unwrap(), b"old content");
    h.release(old.ino, again).unwrap();
    h.kernel_forgets(old.ino);
    assert_eq!(errno(h.getattr(old.ino)), libc::ESTALE);
    assert_eq!(errno(h.open(&CTX, old.ino, libc::O_RDONLY)), libc::ESTALE);
    assert!(!h.staging_exists(old.ino));
}

#[test]
fn open_unlinked_file_is_reclaimed_on_remount() {
    let mut h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "tmp");
    h.put(a.ino, fh, 0, &pattern(100_000, 3));
    h.unlink(&CTX, ROOT_INO, b"tmp").unwrap();
    assert!(h.staging_exists(a.ino));
    // The process dies with the file open: the handle is never released.
    h.remount();
    assert_eq!(errno(h.getattr(a.ino)), libc::ESTALE);
    assert!(h.row(a.ino).is_none(), "orphan inode deleted by recovery");
    assert!(
        !h.staging_exists(a.ino),
        "orphan staging file deleted by recovery"
    );
    assert!(h.ls(ROOT_INO).is_empty());
    h.sync_all();
    assert!(h.bucket_file("tmp").is_none());
}

#[test]
fn unlinked_file_never_reaches_the_bucket() {
    let h = Harness::uploads_held();
    h.file(ROOT_INO, "gone", b"x");
    h.unlink(&CTX, ROOT_INO, b"gone").unwrap();
    h.sync_all();
    assert!(h.bucket_file("gone").is_none());
    assert_eq!(h.status().unwrap().pending_uploads, 0);
}

/// The kernel's retry after `ESTALE` (its fresh lookup found inode `z`) is served `z`
/// even if `z` lost its last name before the open arrived — which needs `z` still there:
/// while other mounts are live, an unlink here purges an inode nobody holds only after
/// `ORPHAN_GRACE`, never in the unlink's own batch.
#[test]
fn an_unlink_while_other_mounts_are_live_leaves_the_inode_for_their_retries() {
    let h = Harness::new();
    let x = h.file(ROOT_INO, "f", b"first");
    h.sync_all();
    let b = h.second_mount("cache-b");
    assert!(
        wait_until(SYNC_TIMEOUT, || h.shared()),
        "this mount sees the other one"
    );
    let me = Ctx { pid: 6161, ..CTX };
    assert_eq!(b.lookup(&me, ROOT_INO, b"f").unwrap().ino, x.ino);
    // Replaced here: the other mount's open of what it resolved is stale, and the
    // kernel's fresh lookup finds the new file.
    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    let z = h.file(ROOT_INO, "f", b"second");
    assert_eq!(errno(b.open(&me, x.ino, libc::O_RDONLY)), libc::ESTALE);
    assert_eq!(b.lookup(&me, ROOT_INO, b"f").unwrap().ino, z.ino);
    // Unlinked here before the repeated open arrives (by a process of this mount whose
    // kernel holds no reference to it any more).
    h.kernel_forgets(z.ino);
    h.flush_releases();
    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    assert!(h.row(z.ino).is_some(), "purged in the unlink's batch");
    let o = b
        .open(&me, z.ino, libc::O_RDONLY)
        .expect("the kernel's retry is served what its lookup found");
    b.release(z.ino, o.fh).unwrap();
}
