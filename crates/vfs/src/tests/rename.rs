//! rename / renameat2: every case and its errno.

use super::*;
use crate::rename_flags::{EXCHANGE, NOREPLACE, WHITEOUT};

#[test]
fn rename_file_within_a_directory() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "a", b"AAA");
    h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"b", 0).unwrap();
    assert_eq!(errno(h.lk(ROOT_INO, "a")), libc::ENOENT);
    let b = h.lk(ROOT_INO, "b").unwrap();
    assert_eq!(b.ino, a.ino);
    assert_eq!(b.nlink, 1);
    assert!(b.ctime_ns >= a.ctime_ns);
    assert_eq!(b.mtime_ns, a.mtime_ns, "rename leaves mtime");
    assert_eq!(h.cat(b.ino), b"AAA");
    assert_eq!(h.ls(ROOT_INO), ["b"]);
    // Renaming a name onto itself is a no-op.
    h.rename(&CTX, ROOT_INO, b"b", ROOT_INO, b"b", 0).unwrap();
    assert_eq!(h.lk(ROOT_INO, "b").unwrap().ino, a.ino);
}

#[test]
fn rename_replaces_a_file_atomically() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "a", b"new");
    let b = h.file(ROOT_INO, "b", b"old");
    h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"b", 0).unwrap();
    assert_eq!(h.lk(ROOT_INO, "b").unwrap().ino, a.ino);
    assert_eq!(h.cat_path("b"), b"new");
    assert_eq!(errno(h.lk(ROOT_INO, "a")), libc::ENOENT);
    // The replaced inode outlives its name while the kernel holds it (a path walk
    // that reached it a moment before the rename still opens it, as on ext4) ...
    assert_eq!(h.getattr(b.ino).unwrap().nlink, 0);
    h.kernel_forgets(b.ino);
    // ... and is gone once the kernel forgets it.
    assert_eq!(
        errno(h.getattr(b.ino)),
        libc::ESTALE,
        "the replaced inode is gone"
    );
    assert!(!h.staging_exists(b.ino));
    assert_eq!(h.ls(ROOT_INO), ["b"]);
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 2);
}

#[test]
fn rename_replacing_one_of_several_links_keeps_the_inode() {
    let h = Harness::new();
    h.file(ROOT_INO, "a", b"A");
    let b = h.file(ROOT_INO, "b", b"B");
    h.link(&CTX, b.ino, ROOT_INO, b"b2").unwrap();
    h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"b", 0).unwrap();
    let b2 = h.getattr(b.ino).unwrap();
    assert_eq!(b2.nlink, 1);
    assert_eq!(h.cat_path("b2"), b"B");
    assert_eq!(h.cat_path("b"), b"A");
}

#[test]
fn rename_noreplace() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "a", b"A");
    let b = h.file(ROOT_INO, "b", b"B");
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"b", NOREPLACE)),
        libc::EEXIST
    );
    assert_eq!(h.lk(ROOT_INO, "a").unwrap().ino, a.ino);
    assert_eq!(h.lk(ROOT_INO, "b").unwrap().ino, b.ino);
    assert_eq!(h.cat_path("b"), b"B");
    // Also against a directory.
    h.dir(ROOT_INO, "d");
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"d", NOREPLACE)),
        libc::EEXIST
    );
    // A free target works.
    h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"c", NOREPLACE)
        .unwrap();
    assert_eq!(h.lk(ROOT_INO, "c").unwrap().ino, a.ino);
}

#[test]
fn rename_exchange_swaps_files() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "a", b"AAA");
    let b = h.file(ROOT_INO, "b", b"BB");
    h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"b", EXCHANGE)
        .unwrap();
    assert_eq!(h.lk(ROOT_INO, "a").unwrap().ino, b.ino);
    assert_eq!(h.lk(ROOT_INO, "b").unwrap().ino, a.ino);
    assert_eq!(h.cat_path("a"), b"BB");
    assert_eq!(h.cat_path("b"), b"AAA");
    assert_eq!(h.getattr(a.ino).unwrap().nlink, 1);
    assert_eq!(h.getattr(b.ino).unwrap().nlink, 1);
    // Target missing.
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"zz", EXCHANGE)),
        libc::ENOENT
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"zz", ROOT_INO, b"a", EXCHANGE)),
        libc::ENOENT
    );
    assert_eq!(h.ls(ROOT_INO), ["a", "b"]);
    // Invalid flag combinations.
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"b", EXCHANGE | NOREPLACE)),
        libc::EINVAL
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"c", WHITEOUT)),
        libc::EINVAL
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"c", 0x100)),
        libc::EINVAL
    );
    assert_eq!(h.ls(ROOT_INO), ["a", "b"]);
}

#[test]
fn rename_exchange_dir_and_file_across_directories_fixes_nlink() {
    let h = Harness::new();
    let p = h.dir(ROOT_INO, "p");
    let q = h.dir(ROOT_INO, "q");
    let d = h.dir(p.ino, "d");
    h.file(d.ino, "inner", b"i");
    let f = h.file(q.ino, "f", b"F");
    assert_eq!(h.getattr(p.ino).unwrap().nlink, 3);
    assert_eq!(h.getattr(q.ino).unwrap().nlink, 2);
    h.rename(&CTX, p.ino, b"d", q.ino, b"f", EXCHANGE).unwrap();
    assert_eq!(h.lk(p.ino, "d").unwrap().ino, f.ino);
    assert_eq!(h.lk(q.ino, "f").unwrap().ino, d.ino);
    assert_eq!(
        h.getattr(p.ino).unwrap().nlink,
        2,
        "p lost its subdirectory"
    );
    assert_eq!(h.getattr(q.ino).unwrap().nlink, 3, "q gained one");
    assert_eq!(h.lk(d.ino, "..").unwrap().ino, q.ino);
    assert_eq!(h.cat_path("q/f/inner"), b"i");
    assert_eq!(h.cat_path("p/d"), b"F");
    // Two directories across parents: counts unchanged.
    let e = h.dir(p.ino, "e");
    h.rename(&CTX, p.ino, b"e", q.ino, b"f", EXCHANGE).unwrap();
    assert_eq!(h.getattr(p.ino).unwrap().nlink, 3);
    assert_eq!(h.getattr(q.ino).unwrap().nlink, 3);
    assert_eq!(h.lk(q.ino, "f").unwrap().ino, e.ino);
    assert_eq!(h.lk(p.ino, "e").unwrap().ino, d.ino);
}

#[test]
fn rename_directory_into_itself_is_einval() {
    let h = Harness::new();
    let a = h.dir(ROOT_INO, "a");
    let b = h.dir(a.ino, "b");
    let c = h.dir(b.ino, "c");
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", a.ino, b"x", 0)),
        libc::EINVAL
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", c.ino, b"x", 0)),
        libc::EINVAL
    );
    assert_eq!(
        errno(h.rename(&CTX, a.ino, b"b", c.ino, b"x", 0)),
        libc::EINVAL
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", b.ino, b"x", NOREPLACE)),
        libc::EINVAL
    );
    // Exchanging a directory with its own descendant, either way round.
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"a", a.ino, b"b", EXCHANGE)),
        libc::EINVAL
    );
    assert_eq!(
        errno(h.rename(&CTX, a.ino, b"b", ROOT_INO, b"a", EXCHANGE)),
        libc::EINVAL
    );
    // The tree is unchanged.
    assert_eq!(h.walk("a/b/c").unwrap().ino, c.ino);
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(h.getattr(a.ino).unwrap().nlink, 3);
    // Moving a directory up is fine.
    h.rename(&CTX, b.ino, b"c", ROOT_INO, b"c", 0).unwrap();
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 4);
    assert_eq!(h.getattr(b.ino).unwrap().nlink, 2);
}

#[test]
fn rename_type_mismatches_and_non_empty_targets() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let full = h.dir(ROOT_INO, "full");
    h.file(full.ino, "x", b"x");
    let f = h.file(ROOT_INO, "f", b"f");
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"d", ROOT_INO, b"full", 0)),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"d", 0)),
        libc::EISDIR
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"d", ROOT_INO, b"f", 0)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"nope", ROOT_INO, b"x", 0)),
        libc::ENOENT
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"f", 987_654, b"x", 0)),
        libc::ESTALE
    );
    assert_eq!(
        errno(h.rename(&CTX, ROOT_INO, b"f", f.ino, b"x", 0)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(h.rename(&CTX, f.ino, b"x", ROOT_INO, b"y", 0)),
        libc::ENOTDIR
    );
    assert_eq!(h.ls(ROOT_INO), ["d", "f", "full"]);
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 4);

    // A directory over an empty directory replaces it.
    let e = h.dir(ROOT_INO, "e");
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 5);
    h.rename(&CTX, ROOT_INO, b"d", ROOT_INO, b"e", 0).unwrap();
    assert_eq!(h.lk(ROOT_INO, "e").unwrap().ino, d.ino);
    assert_eq!(errno(h.getattr(e.ino)), libc::ENOENT);
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 4);
    assert_eq!(h.ls(ROOT_INO), ["e", "f", "full"]);
}

#[test]
fn rename_between_directories_fixes_nlink() {
    let h = Harness::new();
    let p1 = h.dir(ROOT_INO, "p1");
    let p2 = h.dir(ROOT_INO, "p2");
    let d = h.dir(p1.ino, "d");
    h.file(d.ino, "f", b"in d");
    assert_eq!(h.getattr(p1.ino).unwrap().nlink, 3);
    assert_eq!(h.getattr(p2.ino).unwrap().nlink, 2);
    h.rename(&CTX, p1.ino, b"d", p2.ino, b"d2", 0).unwrap();
    assert_eq!(h.getattr(p1.ino).unwrap().nlink, 2);
    assert_eq!(h.getattr(p2.ino).unwrap().nlink, 3);
    assert_eq!(h.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(h.lk(d.ino, "..").unwrap().ino, p2.ino);
    let dotdot = h
        .ls_entries(d.ino, false)
        .into_iter()
        .find(|e| e.name == b"..")
        .unwrap();
    assert_eq!(dotdot.ino, p2.ino);
    assert_eq!(h.cat_path("p2/d2/f"), b"in d");
    assert!(h.ls(p1.ino).is_empty());
    // Replacing an empty directory in another parent.
    let t = h.dir(p1.ino, "t");
    assert_eq!(h.getattr(p1.ino).unwrap().nlink, 3);
    h.rename(&CTX, p2.ino, b"d2", p1.ino, b"t", 0).unwrap();
    assert_eq!(errno(h.getattr(t.ino)), libc::ENOENT);
    assert_eq!(h.getattr(p1.ino).unwrap().nlink, 3);
    assert_eq!(h.getattr(p2.ino).unwrap().nlink, 2);
    assert_eq!(h.getattr(ROOT_INO).unwrap().nlink, 4);
    // A file between directories: no link count changes.
    h.file(p1.ino, "file", b"z");
    h.rename(&CTX, p1.ino, b"file", p2.ino, b"file", 0).unwrap();
    assert_eq!(h.getattr(p1.ino).unwrap().nlink, 3);
    assert_eq!(h.getattr(p2.ino).unwrap().nlink, 2);
}

#[test]
fn rename_onto_a_hard_link_of_the_same_inode_does_nothing() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"same");
    h.link(&CTX, f.ino, ROOT_INO, b"g").unwrap();
    h.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"g", 0).unwrap();
    assert_eq!(h.ls(ROOT_INO), ["f", "g"], "POSIX: both names stay");
    assert_eq!(h.getattr(f.ino).unwrap().nlink, 2);
    h.rename(&CTX, ROOT_INO, b"g", ROOT_INO, b"f", EXCHANGE)
        .unwrap();
    assert_eq!(h.ls(ROOT_INO), ["f", "g"]);
    assert_eq!(h.getattr(f.ino).unwrap().nlink, 2);
    assert_eq!(h.cat_path("g"), b"same");
}

#[test]
fn rename_keeps_open_handles_working() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "a");
    h.put(a.ino, fh, 0, b"one");
    let d = h.dir(ROOT_INO, "d");
    h.rename(&CTX, ROOT_INO, b"a", d.ino, b"moved", 0).unwrap();
    h.put(a.ino, fh, 3, b"two");
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.cat_path("d/moved"), b"onetwo");
    h.sync_all();
    assert_eq!(h.bucket_file("d/moved").as_deref(), Some(&b"onetwo"[..]));
    assert!(h.bucket_file("a").is_none());
}
