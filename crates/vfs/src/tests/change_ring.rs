//! The change ring through real operations: each namespace and content change lands in
//! it with its workspace path, resolved at query time.

use super::*;
use crate::{Change, ChangeKind, SetAttr};

fn kinds(changes: &[Change]) -> Vec<(ChangeKind, String, Option<String>, bool)> {
    changes
        .iter()
        .map(|c| (c.kind, c.path.clone(), c.to.clone(), c.dir))
        .collect()
}

fn c(kind: ChangeKind, path: &str, dir: bool) -> (ChangeKind, String, Option<String>, bool) {
    (kind, path.to_owned(), None, dir)
}

#[test]
fn operations_are_recorded_with_paths() {
    use ChangeKind::*;
    let h = Harness::new();
    let desks = h.dir(ROOT_INO, "desks");
    let alice = h.dir(desks.ino, "alice");
    let other = h.dir(desks.ino, "bob");
    let old = h.file(alice.ino, "c", b"old");
    h.file(alice.ino, "f", b"f");
    h.file(alice.ino, "b", b"b");
    let start = h.change_cursor();
    // What `sh -c 'echo hi > a; echo x >> b; rm c; mkdir d; touch d/e; mv f g'` does.
    h.file(alice.ino, "a", b"hi\n");
    let b = h.lk(alice.ino, "b").unwrap();
    let fh = h.op(b.ino, libc::O_WRONLY | libc::O_APPEND);
    h.put(b.ino, fh, 1, b"x\n");
    h.flush(b.ino, fh).unwrap();
    h.release(b.ino, fh).unwrap();
    h.unlink(&CTX, alice.ino, b"c").unwrap();
    let d = h.dir(alice.ino, "d");
    let (e, fh) = h.create_rw(d.ino, "e");
    h.flush(e.ino, fh).unwrap();
    h.release(e.ino, fh).unwrap();
    h.rename(&CTX, alice.ino, b"f", alice.ino, b"g", 0).unwrap();
    // Elsewhere: filtered out by the prefix.
    h.file(other.ino, "x", b"x");
    // Failed requests record nothing.
    assert_eq!(errno(h.unlink(&CTX, alice.ino, b"nope")), libc::ENOENT);
    assert_eq!(
        errno(h.mkdir(&CTX, alice.ino, b"d", 0o777, 0)),
        libc::EEXIST
    );

    let page = h.changes_since(start, b"desks/alice/", 1000).unwrap();
    assert!(!page.overflowed);
    assert!(!page.more);
    assert_eq!(page.unresolved, 0);
    assert_eq!(page.cursor, h.change_cursor());
    assert_eq!(
        kinds(&page.changes),
        vec![
            c(Created, "desks/alice/a", false),
            c(Changed, "desks/alice/a", false),
            c(Changed, "desks/alice/b", false),
            c(Deleted, "desks/alice/c", false),
            c(Created, "desks/alice/d", true),
            c(Created, "desks/alice/d/e", false),
            (
                Renamed,
                "desks/alice/f".into(),
                Some("desks/alice/g".into()),
                false
            ),
        ]
    );
    // Cursors are strictly increasing.
    assert!(page.changes.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(page.changes[0].seq >= start);
    // Nothing since the end; everything for the whole workspace includes bob's file.
    let after = h.changes_since(page.cursor, b"", 10).unwrap();
    assert!(after.changes.is_empty() && !after.overflowed);
    let all = h.changes_since(start, b"", 1000).unwrap();
    assert!(all.changes.iter().any(|c| c.path == "desks/bob/x"));
    // The limit: a page, `more`, and the cursor to continue from.
    let first = h.changes_since(start, b"desks/alice/", 2).unwrap();
    assert_eq!(first.changes.len(), 2);
    assert!(first.more);
    let rest = h
        .changes_since(first.cursor, b"desks/alice/", 1000)
        .unwrap();
    assert_eq!(rest.changes.len(), 5);
    let _ = old;
}

#[test]
fn paths_of_renamed_and_removed_directories() {
    use ChangeKind::*;
    let h = Harness::new();
    let keep = h.dir(ROOT_INO, "old");
    h.file(keep.ino, "x", b"x");
    let start = h.change_cursor();
    // A directory made, filled, renamed: the file inside is reported under the new name.
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "e", b"e");
    h.rename(&CTX, ROOT_INO, b"d", ROOT_INO, b"n", 0).unwrap();
    // A directory removed with its content: the paths it had.
    h.unlink(&CTX, keep.ino, b"x").unwrap();
    h.rmdir(&CTX, ROOT_INO, b"old").unwrap();
    // Truncate (setattr size) is a content change; rename onto a file replaces it.
    let t = h.file(ROOT_INO, "t", b"abc");
    let mark = h.change_cursor();
    h.setattr(
        &CTX,
        t.ino,
        &SetAttr {
            size: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    h.file(ROOT_INO, "t.tmp", b"new");
    h.rename(&CTX, ROOT_INO, b"t.tmp", ROOT_INO, b"t", 0)
        .unwrap();
    let page = h.changes_since(start, b"", 1000).unwrap();
    let got = kinds(&page.changes);
    assert_eq!(got[0], c(Created, "d", true));
    assert_eq!(got[1], c(Created, "n/e", false));
    assert_eq!(got[2], c(Changed, "n/e", false));
    assert_eq!(got[3], (Renamed, "d".into(), Some("n".into()), true));
    assert_eq!(got[4], c(Deleted, "old/x", false));
    assert_eq!(got[5], c(Deleted, "old", true));
    let tail = h.changes_since(mark, b"", 1000).unwrap();
    assert_eq!(
        kinds(&tail.changes),
        vec![
            c(Changed, "t", false),
            c(Created, "t.tmp", false),
            c(Changed, "t.tmp", false),
            c(Deleted, "t", false),
            (Renamed, "t.tmp".into(), Some("t".into()), false),
        ]
    );
    assert_eq!(page.unresolved, 0);
}

#[test]
fn links_symlinks_and_nodes() {
    use ChangeKind::*;
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"f");
    let start = h.change_cursor();
    h.link(&CTX, f.ino, ROOT_INO, b"hard").unwrap();
    h.symlink(&CTX, ROOT_INO, b"sym", b"f").unwrap();
    h.mknod(&CTX, ROOT_INO, b"fifo", libc::S_IFIFO | 0o644, 0, 0)
        .unwrap();
    let page = h.changes_since(start, b"", 100).unwrap();
    assert_eq!(
        kinds(&page.changes),
        vec![
            c(Created, "hard", false),
            c(Created, "sym", false),
            c(Created, "fifo", false),
        ]
    );
}
