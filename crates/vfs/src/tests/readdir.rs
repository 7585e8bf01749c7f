//! opendir/readdir/readdirplus: order, offsets (cookies), changes during a listing.

use std::collections::HashSet;

use super::*;

fn names(v: &[DirEntry]) -> Vec<String> {
    v.iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect()
}

#[test]
fn dot_and_dotdot_come_first_with_right_kinds() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let f = h.file(d.ino, "f", b"12");
    let s = h.dir(d.ino, "s");
    let l = h.symlink(&CTX, d.ino, b"l", b"f").unwrap();
    let all = h.ls_entries(d.ino, false);
    assert_eq!(names(&all[..2]), [".", ".."]);
    assert_eq!((all[0].ino, all[0].kind), (d.ino, Kind::Dir));
    assert_eq!((all[1].ino, all[1].kind), (ROOT_INO, Kind::Dir));
    assert_eq!(names(&all[2..]), ["f", "s", "l"], "creation order");
    assert_eq!((all[2].ino, all[2].kind), (f.ino, Kind::File));
    assert_eq!((all[3].ino, all[3].kind), (s.ino, Kind::Dir));
    assert_eq!((all[4].ino, all[4].kind), (l.ino, Kind::Symlink));
    assert!(
        all.iter().all(|e| e.attr.is_none()),
        "plain readdir carries no attributes"
    );
    let offs: Vec<u64> = all.iter().map(|e| e.offset).collect();
    assert!(
        offs.windows(2).all(|w| w[0] < w[1]),
        "offsets increase: {offs:?}"
    );
    assert!(offs[0] > 0, "offset 0 means 'from the start'");
    // Root: `..` is the root itself.
    let r = h.ls_entries(ROOT_INO, false);
    assert_eq!(names(&r), [".", "..", "d"]);
    assert_eq!(r[1].ino, ROOT_INO);
    // Empty directory: just the two.
    let e = h.ls_entries(s.ino, false);
    assert_eq!(names(&e), [".", ".."]);
    assert_eq!(e[1].ino, d.ino);
}

#[test]
fn readdirplus_carries_attributes() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "f", b"12345");
    h.dir(d.ino, "s");
    h.mknod(&CTX, d.ino, b"p", libc::S_IFIFO | 0o600, 0, 0)
        .unwrap();
    let all = h.ls_entries(d.ino, true);
    assert_eq!(all[0].attr, Some(h.getattr(d.ino).unwrap()));
    for e in &all[2..] {
        let a = e.attr.expect("readdirplus attr");
        assert_eq!(a, h.getattr(e.ino).unwrap(), "{:?}", e.name);
        assert_eq!(a.kind, e.kind);
    }
    // Sizes of files with uncommitted writes are the live ones.
    let (g, fh) = h.create_rw(d.ino, "g");
    h.put(g.ino, fh, 0, b"not yet committed");
    let all = h.ls_entries(d.ino, true);
    let ge = all.iter().find(|e| e.name == b"g").unwrap();
    assert_eq!(ge.attr.unwrap().size, 17);
    h.release(g.ino, fh).unwrap();
}

#[test]
fn offsets_resume_a_listing() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    for i in 0..20 {
        h.symlink(&CTX, d.ino, format!("e{i:02}").as_bytes(), b"t")
            .unwrap();
    }
    let fh = h.opendir(d.ino).unwrap();
    let full = h.readdir(d.ino, fh, 0, false).unwrap();
    assert_eq!(full.len(), 22);
    // Resume after every possible position (incl. after `.` and after `..`).
    for cut in 1..full.len() {
        let rest = h.readdir(d.ino, fh, full[cut - 1].offset, false).unwrap();
        assert_eq!(
            names(&rest),
            names(&full[cut..]),
            "resume after entry {cut}"
        );
        assert_eq!(
            rest.iter().map(|e| e.offset).collect::<Vec<_>>(),
            full[cut..].iter().map(|e| e.offset).collect::<Vec<_>>()
        );
    }
    // After the last entry: nothing.
    assert!(h
        .readdir(d.ino, fh, full.last().unwrap().offset, false)
        .unwrap()
        .is_empty());
    // Two batches through a fresh handle.
    h.releasedir(d.ino, fh).unwrap();
    let fh = h.opendir(d.ino).unwrap();
    let first: Vec<DirEntry> = h
        .readdir(d.ino, fh, 0, false)
        .unwrap()
        .into_iter()
        .take(9)
        .collect();
    let second = h
        .readdir(d.ino, fh, first.last().unwrap().offset, false)
        .unwrap();
    let mut both = names(&first);
    both.extend(names(&second));
    assert_eq!(both, names(&full));
    h.releasedir(d.ino, fh).unwrap();
}

#[test]
fn changes_between_batches_neither_repeat_nor_skip_survivors() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    for i in 0..30 {
        h.symlink(&CTX, d.ino, format!("e{i:02}").as_bytes(), b"t")
            .unwrap();
    }
    let fh = h.opendir(d.ino).unwrap();
    let first: Vec<DirEntry> = h
        .readdir(d.ino, fh, 0, false)
        .unwrap()
        .into_iter()
        .take(12)
        .collect();
    let seen: HashSet<String> = names(&first).into_iter().collect();
    // Between batches: delete listed and unlisted entries, add new ones, rename one of
    // each kind.
    for n in ["e00", "e05", "e15", "e20", "e29"] {
        h.unlink(&CTX, d.ino, n.as_bytes()).unwrap();
    }
    for n in ["new1", "new2"] {
        h.symlink(&CTX, d.ino, n.as_bytes(), b"t").unwrap();
    }
    h.rename(&CTX, d.ino, b"e03", d.ino, b"r03", 0).unwrap(); // already listed
    h.rename(&CTX, d.ino, b"e25", d.ino, b"r25", 0).unwrap(); // not yet listed
    let second = h
        .readdir(d.ino, fh, first.last().unwrap().offset, false)
        .unwrap();
    h.releasedir(d.ino, fh).unwrap();
    let second_names = names(&second);
    for n in &second_names {
        assert!(!seen.contains(n), "{n} listed twice");
    }
    assert!(
        !second_names.contains(&"r03".to_string()),
        "an entry renamed after being listed is not listed again"
    );
    // Every entry that existed before the listing started, still exists, and was not
    // listed in the first batch must be in the second.
    assert_eq!(
        names(&first[2..]),
        (0..10).map(|i| format!("e{i:02}")).collect::<Vec<_>>()
    );
    let expected = (10..30)
        .map(|i| format!("e{i:02}"))
        .filter(|n| !["e15", "e20", "e29"].contains(&n.as_str()));
    for n in expected {
        let want = if n == "e25" { "r25".to_string() } else { n };
        assert!(
            second_names.contains(&want),
            "survivor {want} skipped; got {second_names:?}"
        );
    }
    for n in ["e15", "e20", "e29", "e25"] {
        assert!(!second_names.contains(&n.to_string()), "{n} is gone");
    }
}

#[test]
fn cookies_are_stable_across_rename() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    for i in 0..6 {
        h.symlink(&CTX, d.ino, format!("e{i}").as_bytes(), b"t")
            .unwrap();
    }
    let before = h.ls_entries(d.ino, false);
    h.rename(&CTX, d.ino, b"e3", d.ino, b"renamed", 0).unwrap();
    let after = h.ls_entries(d.ino, false);
    assert_eq!(after.len(), before.len());
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.offset, b.offset);
        assert_eq!(a.ino, b.ino);
    }
    assert_eq!(after[5].name, b"renamed");
    // Resuming from the offset of e2 finds the renamed entry next.
    let fh = h.opendir(d.ino).unwrap();
    let rest = h.readdir(d.ino, fh, before[4].offset, false).unwrap();
    assert_eq!(names(&rest), ["renamed", "e4", "e5"]);
    h.releasedir(d.ino, fh).unwrap();
}

#[test]
fn large_directory_is_listed_in_several_batches() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let n = 1300;
    for i in 0..n {
        h.mknod(
            &CTX,
            d.ino,
            format!("n{i:04}").as_bytes(),
            libc::S_IFIFO | 0o644,
            0,
            0,
        )
        .unwrap();
    }
    let fh = h.opendir(d.ino).unwrap();
    let first = h.readdir(d.ino, fh, 0, true).unwrap();
    assert!(first.len() < n + 2, "one reply is bounded");
    let all = h.ls_entries(d.ino, true);
    assert_eq!(all.len(), n + 2);
    let uniq: HashSet<&[u8]> = all.iter().map(|e| e.name.as_slice()).collect();
    assert_eq!(uniq.len(), n + 2);
    assert!(all[2..]
        .iter()
        .all(|e| e.attr.is_some_and(|a| a.kind == Kind::Fifo)));
    h.releasedir(d.ino, fh).unwrap();
}

#[test]
fn readdir_errors() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"");
    assert_eq!(errno(h.opendir(f.ino)), libc::ENOTDIR);
    assert_eq!(errno(h.readdir(f.ino, 0, 0, false)), libc::ENOTDIR);
    assert_eq!(errno(h.readdir(987_654, 0, 0, false)), libc::ESTALE);
}

#[test]
fn opendir_after_this_mounts_own_change_of_the_directory_costs_no_round_trip() {
    // SQLite opens a database's directory to fsync it after creating each journal.
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let (a, fh) = h.create_rw(d.ino, "db-journal");
    h.release(a.ino, fh).unwrap();
    let rt = deskfs_meta::thread_round_trips;
    let before = rt();
    let dh = h.opendir(d.ino).unwrap();
    assert_eq!(rt() - before, 0, "the create read the directory's row back");
    h.releasedir(d.ino, dh).unwrap();
    assert_eq!(
        names(&h.ls_entries(d.ino, false)),
        [".", "..", "db-journal"]
    );
    // Still a directory check: a file is refused.
    assert_eq!(errno(h.opendir(a.ino)), libc::ENOTDIR);
}
