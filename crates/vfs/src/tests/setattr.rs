//! setattr: chmod, chown, truncate, utimensat.

use super::*;
use crate::{SetAttr, SetTime};

fn mode(m: u32) -> SetAttr {
    SetAttr {
        mode: Some(m),
        ..Default::default()
    }
}

#[test]
fn chmod_changes_permission_bits_only() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"abc");
    let a = h
        .setattr(&CTX, f.ino, &mode(libc::S_IFDIR | 0o4751))
        .unwrap();
    assert_eq!(
        (a.kind, a.perm, a.size),
        (Kind::File, 0o4751, 3),
        "type bits in mode are ignored"
    );
    assert_eq!(a.mode(), libc::S_IFREG | 0o4751);
    assert_eq!(h.getattr(f.ino).unwrap().perm, 0o4751);
    assert!(a.ctime_ns >= f.ctime_ns);
    assert_eq!(a.mtime_ns, f.mtime_ns, "chmod leaves mtime");
    assert_eq!(h.setattr(&CTX, f.ino, &mode(0o7777)).unwrap().perm, 0o7777);
    assert_eq!(h.setattr(&CTX, f.ino, &mode(0)).unwrap().perm, 0);
    assert_eq!(h.cat(f.ino), b"abc", "content untouched");

    let d = h.dir(ROOT_INO, "d");
    let a = h.setattr(&CTX, d.ino, &mode(0o1700)).unwrap();
    assert_eq!((a.kind, a.perm, a.nlink), (Kind::Dir, 0o1700, 2));
    assert_eq!(errno(h.setattr(&CTX, 987_654, &mode(0o644))), libc::ESTALE);
}

/// getattr of an open file reports what the row says unless the open file's state is
/// newer: another mount's chmod shows with its ctime while the file is open and read here
/// (its state loaded, same content version), and a file opened but not read yet shows its
/// committed size.
#[test]
fn getattr_of_an_open_file_takes_the_state_only_when_it_is_newer() {
    let mut h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"abcdef");
    h.remount();
    // Opened, not read: the state is not loaded.
    let fh = h.op(f.ino, libc::O_RDONLY);
    assert_eq!(
        h.getattr(f.ino).unwrap().size,
        6,
        "an unloaded state's size shown"
    );
    assert_eq!(h.read(f.ino, fh, 0, 6).unwrap(), b"abcdef");
    // Loaded, same version: a chmod by another mount (which this mount's state knows
    // nothing of) shows with its ctime.
    let before = h.getattr(f.ino).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let b = h.second_mount("cache-b");
    let a = b.setattr(&CTX, f.ino, &mode(0o600)).unwrap();
    assert!(a.ctime_ns > before.ctime_ns);
    let now = h.getattr(f.ino).unwrap();
    assert_eq!(
        (now.perm, now.ctime_ns, now.size),
        (0o600, a.ctime_ns, 6),
        "getattr of the open file shows the other mount's chmod"
    );
    h.release(f.ino, fh).unwrap();
}

#[test]
fn chown_sets_owner_and_clears_setid_bits() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"");
    let a = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                uid: Some(7),
                gid: Some(8),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.uid, a.gid), (7, 8));
    let a = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                uid: Some(9),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.uid, a.gid), (9, 8), "gid left alone");
    let a = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                gid: Some(10),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.uid, a.gid), (9, 10), "uid left alone");
    assert_eq!(h.getattr(f.ino).unwrap(), a);

    // Linux: chown of a regular file drops setuid, and setgid when group-executable.
    h.setattr(&CTX, f.ino, &mode(0o6755)).unwrap();
    let a = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                uid: Some(11),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.perm, 0o0755);
    h.setattr(&CTX, f.ino, &mode(0o6745)).unwrap();
    let a = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                gid: Some(12),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        a.perm, 0o2745,
        "setgid without group-exec is mandatory locking: kept"
    );
    // chown to the same owner changes nothing.
    h.setattr(&CTX, f.ino, &mode(0o4755)).unwrap();
    let a = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                uid: Some(11),
                gid: Some(12),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.perm, 0o4755);
    // Directories keep their bits.
    let d = h.dir(ROOT_INO, "d");
    h.setattr(&CTX, d.ino, &mode(0o2775)).unwrap();
    let a = h
        .setattr(
            &CTX,
            d.ino,
            &SetAttr {
                uid: Some(1),
                gid: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (1, 2, 0o2775));
}

#[test]
fn truncate_shrinks_and_extends_with_zeros() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"abcdefghij");
    let size = |n| SetAttr {
        size: Some(n),
        ..Default::default()
    };
    let a = h.setattr(&CTX, f.ino, &size(4)).unwrap();
    assert_eq!((a.size, a.blocks), (4, 1));
    assert!(a.mtime_ns >= f.mtime_ns);
    assert_eq!(h.cat(f.ino), b"abcd");
    assert_eq!(h.row(f.ino).unwrap().size, 4, "truncate commits at once");

    let a = h.setattr(&CTX, f.ino, &size(10)).unwrap();
    assert_eq!(a.size, 10);
    assert_eq!(h.cat(f.ino), b"abcd\0\0\0\0\0\0");
    // Extend far: a hole.
    h.setattr(&CTX, f.ino, &size(3 << 20)).unwrap();
    let data = h.cat(f.ino);
    assert_eq!(data.len(), 3 << 20);
    assert!(data[4..].iter().all(|b| *b == 0));
    h.setattr(&CTX, f.ino, &size(0)).unwrap();
    assert_eq!(h.cat(f.ino), b"");
    assert_eq!(h.getattr(f.ino).unwrap().size, 0);

    let d = h.dir(ROOT_INO, "d");
    assert_eq!(errno(h.setattr(&CTX, d.ino, &size(0))), libc::EISDIR);
    let l = h.symlink(&CTX, ROOT_INO, b"l", b"target").unwrap();
    assert_eq!(errno(h.setattr(&CTX, l.ino, &size(0))), libc::EINVAL);
    assert_eq!(h.readlink(l.ino).unwrap(), b"target");
    assert_eq!(
        errno(h.setattr(&CTX, f.ino, &size((16 << 40) + 1))),
        libc::EFBIG
    );
}

#[test]
fn utimens_exact_now_and_omit() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    let at = 1_234_567_890_123_456_789i64;
    let mt = 987_654_321_987_654_321i64;
    let a = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                atime: Some(SetTime::At(at)),
                mtime: Some(SetTime::At(mt)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.atime_ns, a.mtime_ns), (at, mt), "exact nanoseconds");
    assert_eq!(h.getattr(f.ino).unwrap(), a);
    assert!(a.ctime_ns >= f.ctime_ns);

    // UTIME_OMIT (None) for mtime: only atime moves.
    let b = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                atime: Some(SetTime::At(5)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((b.atime_ns, b.mtime_ns), (5, mt));
    // And the other way round.
    let c = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                mtime: Some(SetTime::At(6)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((c.atime_ns, c.mtime_ns), (5, 6));
    // Negative times (before 1970) are kept too.
    let n = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                mtime: Some(SetTime::At(-1_500_000_000)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(n.mtime_ns, -1_500_000_000);

    // UTIME_NOW.
    let before = now_ns();
    let d = h
        .setattr(
            &CTX,
            f.ino,
            &SetAttr {
                atime: Some(SetTime::Now),
                mtime: Some(SetTime::Now),
                ..Default::default()
            },
        )
        .unwrap();
    let after = now_ns();
    assert!(
        d.atime_ns >= before && d.atime_ns <= after,
        "atime {} not in [{before}, {after}]",
        d.atime_ns
    );
    assert!(d.mtime_ns >= before && d.mtime_ns <= after);
    assert!(d.ctime_ns >= before && d.ctime_ns <= after);

    // Nothing set at all: nothing changes.
    let e = h.setattr(&CTX, f.ino, &SetAttr::default()).unwrap();
    assert_eq!(e, d);
    assert_eq!(h.getattr(f.ino).unwrap(), d);
    // Times on directories and symlinks.
    let dir = h.dir(ROOT_INO, "d");
    let g = h
        .setattr(
            &CTX,
            dir.ino,
            &SetAttr {
                mtime: Some(SetTime::At(mt)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(g.mtime_ns, mt);
    let l = h.symlink(&CTX, ROOT_INO, b"l", b"f").unwrap();
    let g = h
        .setattr(
            &CTX,
            l.ino,
            &SetAttr {
                atime: Some(SetTime::At(at)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(g.atime_ns, at);
}

#[test]
fn explicit_mtime_wins_over_pending_writes() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    h.put(a.ino, fh, 0, b"data");
    let mt = 1_600_000_000_000_000_001;
    let s = h
        .setattr(
            &CTX,
            a.ino,
            &SetAttr {
                mtime: Some(SetTime::At(mt)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.mtime_ns, mt);
    assert_eq!(s.size, 4);
    assert_eq!(h.getattr(a.ino).unwrap().mtime_ns, mt);
    h.flush(a.ino, fh).unwrap();
    assert_eq!(
        h.getattr(a.ino).unwrap().mtime_ns,
        mt,
        "the close must not replace the explicit mtime"
    );
    assert_eq!(h.row(a.ino).unwrap().mtime_ns, mt);
    // A later write moves it again.
    h.put(a.ino, fh, 4, b"!");
    h.release(a.ino, fh).unwrap();
    assert!(h.getattr(a.ino).unwrap().mtime_ns > mt);
}

#[test]
fn chmod_during_pending_writes_keeps_both() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    h.put(a.ino, fh, 0, b"12345");
    let s = h.setattr(&CTX, a.ino, &mode(0o600)).unwrap();
    assert_eq!((s.perm, s.size), (0o600, 5));
    h.release(a.ino, fh).unwrap();
    let g = h.getattr(a.ino).unwrap();
    assert_eq!((g.perm, g.size), (0o600, 5));
    assert_eq!(h.cat(a.ino), b"12345");
}

#[test]
fn unprivileged_write_or_truncate_drops_setuid_setgid_and_capabilities() {
    let h = Harness::new();
    let other = Ctx {
        uid: 2000,
        gid: 2000,
        pid: 1,
    };
    let in_group = Ctx {
        uid: 2000,
        gid: CTX.gid,
        pid: 1,
    };
    let perm = |ino| h.getattr(ino).unwrap().perm;
    let chmod = |ino, mode| {
        let set = SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        h.setattr(&CTX, ino, &set).unwrap();
    };
    let f = h.file(ROOT_INO, "f", b"data");
    // setuid always goes; setgid when group-executable; ctime moves with them.
    chmod(f.ino, 0o6777);
    let before = h.row(f.ino).unwrap().ctime_ns;
    std::thread::sleep(Duration::from_millis(2));
    h.kill_privs(&in_group, f.ino).unwrap();
    assert_eq!(perm(f.ino), 0o777);
    assert!(
        h.row(f.ino).unwrap().ctime_ns > before,
        "dropping privileges is a change of the inode: ctime moves"
    );
    // setgid without group-exec stays for a member of the group...
    chmod(f.ino, 0o2767);
    h.kill_privs(&in_group, f.ino).unwrap();
    assert_eq!(perm(f.ino), 0o2767);
    // ...and goes for a caller outside it (Linux setattr_should_drop_sgid).
    h.kill_privs(&other, f.ino).unwrap();
    assert_eq!(perm(f.ino), 0o767);
    // File capabilities go too; other xattrs stay; ctime moves only when something went.
    h.setxattr(f.ino, b"security.capability", b"caps", 0)
        .unwrap();
    h.setxattr(f.ino, b"user.keep", b"1", 0).unwrap();
    h.kill_privs(&other, f.ino).unwrap();
    assert!(h.getxattr(f.ino, b"security.capability").is_err());
    assert_eq!(h.getxattr(f.ino, b"user.keep").unwrap(), b"1");
    let before = h.getattr(f.ino).unwrap().ctime_ns;
    std::thread::sleep(Duration::from_millis(2));
    h.kill_privs(&other, f.ino).unwrap();
    assert_eq!(
        h.getattr(f.ino).unwrap().ctime_ns,
        before,
        "nothing to drop: no change"
    );
    // Truncate by an unprivileged caller drops setuid; by root it does not.
    chmod(f.ino, 0o4755);
    let trunc = SetAttr {
        size: Some(1),
        ..SetAttr::default()
    };
    let root = Ctx {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    h.setattr(&root, f.ino, &trunc).unwrap();
    assert_eq!(perm(f.ino), 0o4755);
    h.setattr(&other, f.ino, &trunc).unwrap();
    assert_eq!(perm(f.ino), 0o755);
    // Directories are left alone.
    let d = h.dir(ROOT_INO, "d");
    chmod(d.ino, 0o2775);
    h.kill_privs(&other, d.ino).unwrap();
    assert_eq!(perm(d.ino), 0o2775);
}

#[test]
fn a_chown_to_the_owner_of_a_file_being_written_costs_no_round_trip_and_its_ctime_is_kept() {
    // SQLite gives each new rollback journal its database's owner (`fchown` as root).
    let h = Harness::new();
    h.file(ROOT_INO, "warm-up", b"the root's first listing");
    let (a, fh) = h.create_rw(ROOT_INO, "db-journal");
    let owner = |uid, gid| SetAttr {
        uid: Some(uid),
        gid: Some(gid),
        ..Default::default()
    };
    let rt = deskfs_meta::thread_round_trips;
    let before = rt();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let same = h.setattr(&CTX, a.ino, &owner(a.uid, a.gid)).unwrap();
    assert_eq!(rt() - before, 0, "a chown that changes nothing but ctime");
    assert_eq!((same.uid, same.gid, same.size), (a.uid, a.gid, 0));
    assert!(same.ctime_ns > a.ctime_ns, "ctime moves");
    assert_eq!(same.mtime_ns, a.mtime_ns, "mtime does not");
    h.write(a.ino, fh, 0, b"journal").unwrap();
    h.flush(a.ino, fh).unwrap();
    h.release(a.ino, fh).unwrap();
    let row = h.row(a.ino).unwrap();
    assert!(
        row.ctime_ns >= same.ctime_ns,
        "the close commits the chown's ctime"
    );

    // Another owner is a real change, applied at once, open or not.
    let (b, fh) = h.create_rw(ROOT_INO, "other");
    h.write(b.ino, fh, 0, b"x").unwrap();
    let changed = h.setattr(&CTX, b.ino, &owner(7, 8)).unwrap();
    assert_eq!((changed.uid, changed.gid), (7, 8));
    assert_eq!(
        (h.row(b.ino).unwrap().uid, h.row(b.ino).unwrap().gid),
        (7, 8)
    );
    // And the same owner again, now that the row says 7:8, still costs nothing.
    let before = rt();
    assert_eq!(h.setattr(&CTX, b.ino, &owner(7, 8)).unwrap().uid, 7);
    assert_eq!(rt() - before, 0);
    // Only the group, or only the user, new: a real change too.
    assert_eq!(h.setattr(&CTX, b.ino, &owner(7, 9)).unwrap().gid, 9);
    assert_eq!(h.row(b.ino).unwrap().gid, 9, "a new group alone is applied");
    assert_eq!(h.setattr(&CTX, b.ino, &owner(6, 9)).unwrap().uid, 6);
    assert_eq!(h.row(b.ino).unwrap().uid, 6, "a new user alone is applied");
    h.release(b.ino, fh).unwrap();
    assert_eq!(h.row(b.ino).unwrap().uid, 6);
}

#[test]
fn with_a_peer_mount_a_chown_to_the_owner_a_stale_row_names_is_applied() {
    // The row this mount read back may be stale once another mount is live: the chown
    // must then be decided on the database's row, not skipped as "no change".
    let h = Harness::new();
    let (f, fh) = h.create_rw(ROOT_INO, "shared");
    h.write(f.ino, fh, 0, b"x").unwrap();
    let b = h.second_mount("cache-b");
    assert!(
        wait_until(std::time::Duration::from_secs(10), || h.shared()),
        "the first mount never noticed the second"
    );
    let owner = |uid, gid| SetAttr {
        uid: Some(uid),
        gid: Some(gid),
        ..Default::default()
    };
    b.setattr(&CTX, f.ino, &owner(7, 8)).unwrap();
    let a = h.setattr(&CTX, f.ino, &owner(f.uid, f.gid)).unwrap();
    assert_eq!((a.uid, a.gid), (f.uid, f.gid), "the chown back was skipped");
    let row = h.row(f.ino).unwrap();
    assert_eq!((row.uid, row.gid), (f.uid, f.gid));
    h.release(f.ino, fh).unwrap();
}

#[test]
fn a_chown_of_a_file_not_being_written_is_committed_and_marked_at_once() {
    // The fast path and the ride on the close's upload mark above are for a file this
    // mount is writing, whose close commits and marks: a file closed or open only for
    // reading has no such commit coming, so the chown's ctime goes to the row at once and
    // the inode is marked for upload (its owner is in the object's metadata) at once.
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "db");
    h.write(a.ino, fh, 0, b"committed").unwrap();
    h.release(a.ino, fh).unwrap();
    let owner = |uid, gid| SetAttr {
        uid: Some(uid),
        gid: Some(gid),
        ..Default::default()
    };
    let last_mark = || deskfs_meta::read(&**h.meta(), |t| t.pending_last_seq()).unwrap();
    let tick = || std::thread::sleep(std::time::Duration::from_millis(2));
    // Closed (this also leaves the row this mount read back fresh: the fast path's
    // condition on the owner holds from here on).
    let before = h.row(a.ino).unwrap().ctime_ns;
    tick();
    let closed = h.setattr(&CTX, a.ino, &owner(a.uid, a.gid)).unwrap();
    assert!(closed.ctime_ns > before, "ctime moves");
    assert_eq!(
        h.row(a.ino).unwrap().ctime_ns,
        closed.ctime_ns,
        "a chown of a closed file is committed at once"
    );
    // Open only for reading: a new owner is marked for upload at once (and leaves the
    // row this mount read back fresh: the fast path's condition on the owner holds for
    // the next chown); the same owner again commits its ctime at once.
    let reader = h.op(a.ino, libc::O_RDONLY);
    let marks = last_mark();
    let moved = h.setattr(&CTX, a.ino, &owner(7, 8)).unwrap();
    assert!(
        last_mark() > marks,
        "a new owner of a file open only for reading is marked for upload at once"
    );
    tick();
    let same = h.setattr(&CTX, a.ino, &owner(7, 8)).unwrap();
    assert!(same.ctime_ns > moved.ctime_ns, "ctime moves");
    assert_eq!(
        h.row(a.ino).unwrap().ctime_ns,
        same.ctime_ns,
        "a chown of a file open only for reading is committed before its close"
    );
    h.release(a.ino, reader).unwrap();
    // Being written: the close's commit carries the new owner's mark.
    let writer = h.op(a.ino, libc::O_RDWR);
    h.write(a.ino, writer, 0, b"C").unwrap();
    let marks = last_mark();
    h.setattr(&CTX, a.ino, &owner(9, 10)).unwrap();
    assert_eq!(
        last_mark(),
        marks,
        "no mark of its own while a close will mark"
    );
    h.release(a.ino, writer).unwrap();
    assert!(last_mark() > marks, "the close marks it");
    assert_eq!(
        (h.row(a.ino).unwrap().uid, h.row(a.ino).unwrap().gid),
        (9, 10)
    );
}

/// Mount B (a second mount of `h`'s workspace) rewrites `ino` with `data` and closes it.
fn rewrite_on_b(b: &Vfs, ino: Ino, data: &[u8]) {
    let fh = b
        .open(&CTX, ino, libc::O_WRONLY | libc::O_TRUNC)
        .expect("open on B")
        .fh;
    assert_eq!(
        b.write(ino, fh, 0, data).expect("write on B") as usize,
        data.len()
    );
    b.release(ino, fh).expect("release on B");
}

/// What mount B reads of `ino`.
fn read_on_b(b: &Vfs, ino: Ino) -> Vec<u8> {
    let fh = b.open(&CTX, ino, libc::O_RDONLY).expect("open on B").fh;
    let out = b.read(ino, fh, 0, 1 << 20).expect("read on B");
    b.release(ino, fh).expect("release on B");
    out
}

/// The names in the root that are conflict copies.
fn conflict_copies(h: &Harness) -> Vec<String> {
    h.ls(ROOT_INO)
        .into_iter()
        .filter(|n| n.contains(".deskfs-conflict-"))
        .collect()
}

const THEIRS: &[u8] = b"THEIR NEWER AND LONGER CONTENT";

/// Runs `race` once, when the next truncation on this thread has set the staging file's
/// length and not committed it yet.
fn before_truncate_commit(race: impl FnOnce() + 'static) {
    crate::data::tests::BEFORE_TRUNCATE_COMMIT.with(|r| *r.borrow_mut() = Some(Box::new(race)));
}

/// Whether the race given to [`before_truncate_commit`] ran.
fn race_ran() -> bool {
    crate::data::tests::BEFORE_TRUNCATE_COMMIT.with(|r| r.borrow().is_none())
}

const TRUNC: SetAttr = SetAttr {
    size: Some(0),
    mode: None,
    uid: None,
    gid: None,
    atime: None,
    mtime: None,
    fh: None,
};

/// A truncation during which another mount rewrote the file and expired this mount's
/// session (its heartbeats stopped reaching the database): its commit finds the lease
/// lost and newer content. The truncation came after that rewrite, so it applies to the
/// newer content: no empty conflict copy is made of it, and the writes that follow on
/// the same descriptor make the whole file — never this mount's bytes over the tail of
/// the other mount's longer content (found by e2e 86n-partition-hosts: an `O_TRUNC`
/// open's truncation became an empty `NAME.deskfs-conflict-*` copy).
#[test]
fn a_truncation_finding_its_lease_lost_applies_to_the_newer_content() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"old content");
    h.sync_all();
    let fh = h.op(f.ino, libc::O_WRONLY);
    let b = h.second_mount("cache-b");
    let lost = h.coherence.session();
    let (bv, ino) = (Arc::clone(&b), f.ino);
    before_truncate_commit(move || {
        rewrite_on_b(&bv, ino, THEIRS);
        super::feed::expire_session(&*bv.meta, lost);
    });
    let a = h.setattr(&CTX, f.ino, &TRUNC).expect("truncate");
    assert!(race_ran());
    assert_ne!(h.coherence.session(), lost, "registered anew");
    assert_eq!(a.size, 0, "the truncation took effect");
    h.put(f.ino, fh, 0, b"MINE");
    h.flush(f.ino, fh).expect("flush");
    h.release(f.ino, fh).expect("release");
    assert_eq!(
        h.cat(f.ino),
        b"MINE",
        "the truncation was not applied to the newer content"
    );
    assert_eq!(
        conflict_copies(&h),
        Vec::<String>::new(),
        "a copy of nothing"
    );
    assert_eq!(read_on_b(&b, f.ino), b"MINE", "B reads the result");
}

/// A truncation whose commit failed (the database out of reach: the caller got `EIO`),
/// then another mount's rewrite of the file and the loss of this mount's lease before
/// the truncation's retry: the failed truncation is not applied over the newer content,
/// and no empty conflict copy is made of it — nothing was written under the lost lease.
#[test]
fn a_failed_truncation_under_a_lost_lease_leaves_the_newer_content() {
    let h = Harness::new();
    let Some(db) = h.sqlite_path() else {
        eprintln!("skipped: the failure is injected with a SQLite trigger");
        return;
    };
    let f = h.file(ROOT_INO, "f", b"old content");
    h.sync_all();
    let fh = h.op(f.ino, libc::O_WRONLY);
    let refusal = Arc::new(std::sync::Mutex::new(None));
    let r = refusal.clone();
    before_truncate_commit(move || {
        *r.lock().unwrap() = Some(crate::tests::refuse_updates_in(&db, "inodes", "size"))
    });
    assert_eq!(errno(h.setattr(&CTX, f.ino, &TRUNC)), libc::EIO);
    assert!(race_ran());
    refusal.lock().unwrap().take().expect("refusal").lift();
    let b = h.second_mount("cache-b");
    rewrite_on_b(&b, f.ino, THEIRS);
    // B expires this mount's session; this mount's heartbeat finds it gone.
    let lost = h.coherence.session();
    super::feed::expire_session(&*b.meta, lost);
    h.fenced(lost);
    h.release(f.ino, fh).expect("release");
    assert_eq!(
        conflict_copies(&h),
        Vec::<String>::new(),
        "a copy of nothing"
    );
    assert_eq!(
        h.cat(f.ino),
        THEIRS,
        "the failed truncation was applied later"
    );
    assert_eq!(read_on_b(&b, f.ino), THEIRS);
}

/// Writes made under a lost lease, then a truncation of them: the writes are committed
/// before the truncation touches them, so the conflict copy holds what was written —
/// not what the truncation left of it — and the truncation applies to the other
/// mount's newer content.
#[test]
fn writes_under_a_lost_lease_are_kept_whole_when_a_truncation_follows() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"old content");
    h.sync_all();
    let fh = h.op(f.ino, libc::O_WRONLY);
    h.put(f.ino, fh, 0, b"MY LOST-LEASE WRITE");
    let b = h.second_mount("cache-b");
    rewrite_on_b(&b, f.ino, THEIRS);
    super::feed::expire_session(&*b.meta, h.coherence.session());
    let trunc = SetAttr {
        size: Some(5),
        ..Default::default()
    };
    assert_eq!(h.setattr(&CTX, f.ino, &trunc).expect("truncate").size, 5);
    h.release(f.ino, fh).expect("release");
    let copies = conflict_copies(&h);
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(h.cat_path(&copies[0]), b"MY LOST-LEASE WRITE");
    assert_eq!(h.cat(f.ino), &THEIRS[..5]);
}
