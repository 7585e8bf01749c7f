//! lookup, getattr, mkdir, rmdir, create, statfs, access.

use super::*;
use crate::SetAttr;
use crate::SetTime;

#[test]
fn lookup_and_getattr() {
    let h = Harness::new();
    let root = h.getattr(ROOT_INO).unwrap();
    assert_eq!(
        (root.ino, root.kind, root.perm, root.nlink),
        (ROOT_INO, Kind::Dir, 0o755, 2)
    );
    assert_eq!(root.mode(), libc::S_IFDIR | 0o755);

    assert_eq!(errno(h.lk(ROOT_INO, "missing")), libc::ENOENT);
    assert_eq!(errno(h.getattr(987_654)), libc::ESTALE);

    let f = h.file(ROOT_INO, "f", b"hello");
    let l = h.lk(ROOT_INO, "f").unwrap();
    assert_eq!(l, f);
    assert_eq!(h.getattr(f.ino).unwrap(), f);
    assert_eq!((l.kind, l.size, l.nlink, l.blocks), (Kind::File, 5, 1, 1));
    assert_eq!(l.mode(), libc::S_IFREG | 0o644);
    assert_eq!((l.uid, l.gid), (CTX.uid, CTX.gid));

    // A file used as a directory.
    assert_eq!(errno(h.lk(f.ino, "x")), libc::ENOTDIR);
    assert_eq!(errno(h.lookup(&CTX, f.ino, b".")), libc::ENOTDIR);

    // `.` and `..`.
    let d = h.dir(ROOT_INO, "d");
    assert_eq!(h.lk(ROOT_INO, ".").unwrap().ino, ROOT_INO);
    assert_eq!(h.lk(ROOT_INO, "..").unwrap().ino, ROOT_INO);
    assert_eq!(h.lk(d.ino, ".").unwrap().ino, d.ino);
    assert_eq!(h.lk(d.ino, "..").unwrap().ino, ROOT_INO);

    // Lookup in a directory that does not exist.
    assert_eq!(errno(h.lk(987_654, "x")), libc::ESTALE);
}

#[test]
fn names_longer_than_255_bytes_are_enametoolong() {
    let h = Harness::new();
    let long = "n".repeat(256);
    let max = "m".repeat(255);
    let f = h.file(ROOT_INO, "f", b"x");
    let e = libc::ENAMETOOLONG;
    assert_eq!(errno(h.lk(ROOT_INO, &long)), e);
    assert_eq!(
        errno(h.create(&CTX, ROOT_INO, long.as_bytes(), 0o644, 0, libc::O_RDWR)),
        e
    );
    assert_eq!(errno(h.mkdir(&CTX, ROOT_INO, long.as_bytes(), 0o755, 0)), e);
    assert_eq!(errno(h.symlink(&CTX, ROOT_INO, long.as_bytes(), b"t")), e);
    assert_eq!(
        errno(h.mknod(&CTX, ROOT_INO, long.as_bytes(), libc::S_IFIFO | 0o644, 0, 0)),
        e
    );
    assert_eq!(errno(h.link(&CTX, f.ino, ROOT_INO, long.as_bytes())), e);
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"f", ROOT_INO, long.as_bytes(), 0)),
        e
    );
    assert_eq!(errno(h.unlink(&CTX, ROOT_INO, long.as_bytes())), e);
    assert_eq!(errno(h.rmdir(&CTX, ROOT_INO, long.as_bytes())), e);
    // 255 bytes is fine.
    assert_eq!(errno(h.lk(ROOT_INO, &max)), libc::ENOENT);
    let a = h.file(ROOT_INO, &max, b"max");
    assert_eq!(h.lk(ROOT_INO, &max).unwrap().ino, a.ino);
    assert!(h.ls(ROOT_INO).contains(&max));
}

#[test]
fn invalid_names_are_einval() {
    let h = Harness::new();
    for bad in [&b""[..], b".", b"..", b"a/b"] {
        assert_eq!(
            errno(h.create(&CTX, ROOT_INO, bad, 0o644, 0, libc::O_RDWR)),
            libc::EINVAL,
            "{bad:?}"
        );
        assert_eq!(
            errno(h.mkdir(&CTX, ROOT_INO, bad, 0o755, 0)),
            libc::EINVAL,
            "{bad:?}"
        );
    }
    assert_eq!(errno(h.rmdir(&CTX, ROOT_INO, b".")), libc::EINVAL);
    assert_eq!(errno(h.rmdir(&CTX, ROOT_INO, b"..")), libc::ENOTEMPTY);
}

#[test]
fn mkdir_sets_nlink_and_errors() {
    let h = Harness::new();
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 2);
    let d = h.dir(ROOT_INO, "d");
    assert_eq!((d.kind, d.perm, d.nlink, d.size), (Kind::Dir, 0o755, 2, 0));
    assert_eq!((d.uid, d.gid), (CTX.uid, CTX.gid));
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(h.lk(ROOT_INO, "d").unwrap(), h.getattr(d.ino).unwrap());

    // umask and mode bits beyond 0o7777 are dropped.
    let m = h
        .mkdir(&CTX, ROOT_INO, b"m", libc::S_IFDIR | 0o1777, 0o077)
        .unwrap();
    assert_eq!(m.perm, 0o1700);
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 4);

    // Nested: d gets a subdirectory link.
    let s = h.dir(d.ino, "s");
    assert_eq!(h.getattr(d.ino).unwrap().nlink, 3);
    assert_eq!(h.lk(s.ino, "..").unwrap().ino, d.ino);

    assert_eq!(errno(h.mkdir(&CTX, ROOT_INO, b"d", 0o755, 0)), libc::EEXIST);
    h.file(ROOT_INO, "f", b"");
    assert_eq!(errno(h.mkdir(&CTX, ROOT_INO, b"f", 0o755, 0)), libc::EEXIST);
    let f = h.lk(ROOT_INO, "f").unwrap();
    assert_eq!(errno(h.mkdir(&CTX, f.ino, b"x", 0o755, 0)), libc::ENOTDIR);
    assert_eq!(errno(h.mkdir(&CTX, 987_654, b"x", 0o755, 0)), libc::ESTALE);
    // Failed attempts did not change the link counts.
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 4);
}

#[test]
fn rmdir_rules_and_nlink() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "f", b"x");
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 3);

    assert_eq!(errno(h.rmdir(&CTX, ROOT_INO, b"d")), libc::ENOTEMPTY);
    assert_eq!(errno(h.rmdir(&CTX, d.ino, b"f")), libc::ENOTDIR);
    assert_eq!(errno(h.rmdir(&CTX, ROOT_INO, b"nope")), libc::ENOENT);
    let f = h.lk(d.ino, "f").unwrap();
    assert_eq!(errno(h.rmdir(&CTX, f.ino, b"x")), libc::ENOTDIR);

    // A subdirectory also makes it non-empty.
    h.unlink(&CTX, d.ino, b"f").unwrap();
    let s = h.dir(d.ino, "s");
    assert_eq!(errno(h.rmdir(&CTX, ROOT_INO, b"d")), libc::ENOTEMPTY);
    h.rmdir(&CTX, d.ino, b"s").unwrap();
    assert_eq!(h.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(errno(h.getattr(s.ino)), libc::ENOENT);

    h.rmdir(&CTX, ROOT_INO, b"d").unwrap();
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 2);
    assert_eq!(errno(h.lk(ROOT_INO, "d")), libc::ENOENT);
    assert_eq!(errno(h.getattr(d.ino)), libc::ENOENT);
    assert!(h.ls(ROOT_INO).is_empty());
    // The name is free again.
    let d2 = h.dir(ROOT_INO, "d");
    assert_ne!(d2.ino, d.ino, "inode numbers are not reused");
}

#[test]
fn create_is_exclusive_and_checks_parent() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    assert_eq!((a.kind, a.size, a.nlink, a.perm), (Kind::File, 0, 1, 0o644));
    assert_eq!(h.read(a.ino, fh, 0, 100).unwrap(), b"");
    h.release(a.ino, fh).unwrap();

    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    assert_eq!(
        errno(h.create(&CTX, ROOT_INO, b"f", 0o644, 0, flags)),
        libc::EEXIST
    );
    h.dir(ROOT_INO, "d");
    assert_eq!(
        errno(h.create(&CTX, ROOT_INO, b"d", 0o644, 0, flags)),
        libc::EEXIST
    );
    assert_eq!(
        errno(h.create(&CTX, a.ino, b"x", 0o644, 0, flags)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(h.create(&CTX, 987_654, b"x", 0o644, 0, flags)),
        libc::ESTALE
    );
    // The existing file is untouched by the failed create.
    assert_eq!(h.lk(ROOT_INO, "f").unwrap().ino, a.ino);

    // Mode: permission bits only, umask applied.
    let (b, fh) = h
        .create(
            &CTX,
            ROOT_INO,
            b"g",
            libc::S_IFREG | 0o4777,
            0o027,
            libc::O_WRONLY,
        )
        .map(|(a, o)| (a, o.fh))
        .unwrap();
    assert_eq!(b.perm, 0o4750);
    h.release(b.ino, fh).unwrap();
}

#[test]
fn creating_in_an_unlinked_directory_is_enoent() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.rmdir(&CTX, ROOT_INO, b"d").unwrap();
    assert_eq!(
        errno(h.create(&CTX, d.ino, b"x", 0o644, 0, libc::O_RDWR)),
        libc::ENOENT
    );
    assert_eq!(errno(h.mkdir(&CTX, d.ino, b"x", 0o755, 0)), libc::ENOENT);
}

/// A create or mkdir whose first plan was made on stale facts of its parent (another
/// connection changed the parent's row meanwhile: the batch's guard fails) is planned
/// again on fresh reads, which keep the rules: a live parent is fine, a file may be made
/// in a directory at LINK_MAX links, a directory may not (`EMLINK`, as ext4).
#[test]
fn a_create_planned_again_on_fresh_facts_keeps_the_rules() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "warm", b"");
    let other = h.db.open();
    // Another tool changes the parent's row: this mount's hints of it are stale.
    let touch = |perm: u32, nlink: Option<u32>| {
        deskfs_meta::txn(&*other, |t| {
            let mut r = t.get_inode(d.ino)?.expect("d");
            r.perm = perm;
            if let Some(n) = nlink {
                r.nlink = n;
            }
            t.update_inode(&r)
        })
        .unwrap();
    };
    touch(0o775, None);
    h.file(d.ino, "f", b"x");
    touch(0o777, None);
    h.dir(d.ino, "sub");
    touch(0o775, Some(crate::namespace::LINK_MAX));
    assert_eq!(
        errno(h.mkdir(&CTX, d.ino, b"sub2", 0o777, 0o022)),
        libc::EMLINK,
        "a directory at LINK_MAX links takes no subdirectory"
    );
    touch(0o777, Some(crate::namespace::LINK_MAX));
    h.file(d.ino, "g", b"y");
    assert_eq!(h.ls(d.ino), ["f", "g", "sub", "warm"]);
}

#[test]
fn parent_times_change_on_entry_changes() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let old = SetAttr {
        atime: Some(SetTime::At(1_000_000_000)),
        mtime: Some(SetTime::At(1_000_000_000)),
        ..Default::default()
    };
    let step = |what: &str, f: &dyn Fn()| {
        h.setattr(&CTX, d.ino, &old).unwrap();
        let before = h.getattr(d.ino).unwrap();
        assert_eq!(before.mtime_ns, 1_000_000_000);
        f();
        let after = h.getattr(d.ino).unwrap();
        assert!(
            after.mtime_ns > before.mtime_ns,
            "{what}: parent mtime not updated"
        );
        assert!(
            after.ctime_ns >= before.ctime_ns,
            "{what}: parent ctime went back"
        );
        assert_eq!(after.atime_ns, 1_000_000_000, "{what}: atime changed");
    };
    step("create", &|| {
        h.file(d.ino, "f", b"x");
    });
    step("mkdir", &|| {
        h.dir(d.ino, "s");
    });
    step("symlink", &|| {
        h.symlink(&CTX, d.ino, b"l", b"f").unwrap();
    });
    step("link", &|| {
        let f = h.lk(d.ino, "f").unwrap();
        h.link(&CTX, f.ino, d.ino, b"g").unwrap();
    });
    step("rename", &|| {
        h.rename(&CTX, d.ino, b"g", d.ino, b"g2", 0).unwrap()
    });
    step("unlink", &|| h.unlink(&CTX, d.ino, b"g2").unwrap());
    step("rmdir", &|| h.rmdir(&CTX, d.ino, b"s").unwrap());
}

#[test]
fn setgid_directory_passes_its_group_down() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.setattr(
        &CTX,
        d.ino,
        &SetAttr {
            gid: Some(50),
            mode: Some(0o2775),
            ..Default::default()
        },
    )
    .unwrap();
    let f = h.file(d.ino, "f", b"");
    assert_eq!(f.gid, 50, "file in setgid dir takes the dir's group");
    let s = h.dir(d.ino, "s");
    assert_eq!(s.gid, 50);
    assert_eq!(s.perm & 0o2000, 0o2000, "subdirectory inherits setgid");
    // Without setgid: the caller's group.
    let e = h.dir(ROOT_INO, "e");
    assert_eq!(h.file(e.ino, "f", b"").gid, CTX.gid);
}

#[test]
fn statfs_is_sane() {
    let h = Harness::new();
    let s0 = h.statfs().unwrap();
    assert_eq!(s0.bsize, 4096);
    assert_eq!(s0.frsize, 4096);
    assert_eq!(s0.namelen, 255);
    assert!(s0.blocks > 0 && s0.bfree <= s0.blocks && s0.bavail <= s0.bfree);
    assert!(s0.files > 0 && s0.ffree <= s0.files);
    h.file(ROOT_INO, "big", &vec![7u8; 1 << 20]);
    h.dir(ROOT_INO, "d");
    let s1 = h.statfs().unwrap();
    assert_eq!(
        s0.bfree - s1.bfree,
        256,
        "1 MiB = 256 blocks of 4 KiB in use"
    );
    assert_eq!(s0.ffree - s1.ffree, 2, "two more inodes in use");
    assert_eq!(s1.blocks, s0.blocks);
}

#[test]
fn access_checks_mode_bits() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    h.setattr(
        &CTX,
        f.ino,
        &SetAttr {
            mode: Some(0o640),
            ..Default::default()
        },
    )
    .unwrap();
    let other = Ctx {
        uid: 2000,
        gid: 2000,
        pid: 1,
    };
    let group = Ctx {
        uid: 2000,
        gid: CTX.gid,
        pid: 1,
    };
    let root = Ctx {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    let (r, w, x) = (libc::R_OK, libc::W_OK, libc::X_OK);
    h.access(&CTX, f.ino, r | w).unwrap();
    assert_eq!(errno(h.access(&CTX, f.ino, x)), libc::EACCES);
    h.access(&group, f.ino, r).unwrap();
    assert_eq!(errno(h.access(&group, f.ino, w)), libc::EACCES);
    assert_eq!(errno(h.access(&other, f.ino, r)), libc::EACCES);
    h.access(&other, f.ino, libc::F_OK).unwrap();
    h.access(&root, f.ino, r | w).unwrap();
    assert_eq!(
        errno(h.access(&root, f.ino, x)),
        libc::EACCES,
        "root needs some x bit"
    );
    h.access(&root, ROOT_INO, x).unwrap();
    assert_eq!(errno(h.access(&CTX, 987_654, r)), libc::ESTALE);
}

#[test]
fn status_reports_pending_then_clean() {
    let h = Harness::uploads_held();
    h.file(ROOT_INO, "f", b"12345");
    let (a, fh) = h.create_rw(ROOT_INO, "open");
    let st = h.status().unwrap();
    assert_eq!(st.open_files, 1);
    assert!(st.pending_uploads >= 2, "{st:?}");
    assert!(st.dirty_files >= 2 && st.dirty_bytes >= 5, "{st:?}");
    h.release(a.ino, fh).unwrap();
    h.sync_all();
    let st = h.status().unwrap();
    assert_eq!(
        (
            st.pending_uploads,
            st.failing_uploads,
            st.dirty_files,
            st.open_files
        ),
        (0, 0, 0, 0),
        "{st:?}"
    );
}

#[test]
fn concurrent_namespace_changes_keep_counts_right() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let vfs = h.arc();
            let parent = d.ino;
            std::thread::spawn(move || {
                for i in 0..50 {
                    vfs.mkdir(&CTX, parent, format!("d{t}-{i}").as_bytes(), 0o755, 0)
                        .unwrap();
                    let (a, o) = vfs
                        .create(
                            &CTX,
                            parent,
                            format!("f{t}-{i}").as_bytes(),
                            0o644,
                            0,
                            libc::O_RDWR,
                        )
                        .unwrap();
                    vfs.write(a.ino, o.fh, 0, format!("{t}-{i}").as_bytes())
                        .unwrap();
                    vfs.release(a.ino, o.fh).unwrap();
                    if i % 2 == 0 {
                        vfs.rmdir(&CTX, parent, format!("d{t}-{i}").as_bytes())
                            .unwrap();
                        vfs.rename(
                            &CTX,
                            parent,
                            format!("f{t}-{i}").as_bytes(),
                            parent,
                            format!("g{t}-{i}").as_bytes(),
                            0,
                        )
                        .unwrap();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let names = h.ls(d.ino);
    assert_eq!(names.len(), 4 * 25 + 4 * 50);
    assert_eq!(h.getattr(d.ino).unwrap().nlink, 2 + 4 * 25);
    for t in 0..4 {
        for i in 0..50 {
            let name = if i % 2 == 0 {
                format!("g{t}-{i}")
            } else {
                format!("f{t}-{i}")
            };
            assert_eq!(
                h.cat_path(&format!("d/{name}")),
                format!("{t}-{i}").as_bytes()
            );
        }
    }
}

/// Two changes of one directory whose answers come back in the other order than their
/// commits: the directory's row the first read back (in its commit) is older than the
/// second's, and must not be kept as fresh after it — `getattr` would show the
/// directory's link count and times without the second change for as long as a fresh
/// row is trusted (60 s alone).
#[test]
fn a_directory_row_read_back_before_a_later_change_is_not_kept_fresh() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let vfs = h.arc();
    crate::changes::tests::AFTER_APPLY.with(|r| {
        *r.borrow_mut() = Some(Box::new(move || {
            vfs.mkdir(&CTX, d.ino, b"y", 0o777, 0o022).expect("mkdir y");
        }))
    });
    h.dir(d.ino, "x");
    assert!(
        crate::changes::tests::AFTER_APPLY.with(|r| r.borrow().is_none()),
        "the second change ran"
    );
    let after_both = h.getattr(d.ino).unwrap();
    assert_eq!(after_both.nlink, 4, "d, ., x/.. and y/..");
    assert_eq!(h.ls(d.ino), ["x", "y"]);
}

/// A lookup under a file is `ENOTDIR` (POSIX), also when this mount remembers nothing of
/// the parent (a fresh mount: its kind is read from the database). The kernel checks
/// the parent's type before it asks, so only this test asks.
#[test]
fn a_lookup_under_a_file_is_enotdir_even_with_nothing_remembered() {
    let mut h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let d = h.dir(ROOT_INO, "d");
    h.remount();
    assert_eq!(errno(h.lookup(&CTX, f.ino, b"x")), libc::ENOTDIR);
    assert_eq!(errno(h.lookup(&CTX, d.ino, b"nothing")), libc::ENOENT);
}

/// The kernel looks a rename's new name up before it renames (`mv a b`, and every
/// write-to-temp-then-rename): the miss is remembered, so the rename plans on it and its
/// batch (which guards that the name is still free) is its one round trip to the engine.
/// Without the remembered miss the rename reads the new name's entry first: a second
/// round trip on every such rename.
#[test]
fn a_rename_to_the_name_a_lookup_just_missed_reads_nothing_first() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let rt = deskfs_meta::thread_round_trips;
    let cost = |from: &str, to: &str, look_first: bool| {
        h.file(d.ino, from, b"x");
        h.lk(d.ino, from).expect("lookup of the old name");
        if look_first {
            assert_eq!(errno(h.lk(d.ino, to)), libc::ENOENT);
        }
        let before = rt();
        h.rename(&CTX, d.ino, from.as_bytes(), d.ino, to.as_bytes(), 0)
            .expect("rename");
        rt() - before
    };
    let blind = cost("a", "b", false);
    let hinted = cost("c", "e", true);
    assert_eq!(
        hinted + 1,
        blind,
        "the lookup's miss saves the rename one read"
    );
    assert_eq!(h.ls(d.ino), ["b", "e"]);
}
