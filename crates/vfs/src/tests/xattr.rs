//! Extended attributes.

use super::*;
use crate::xattr_flags::{CREATE, REPLACE};

#[test]
fn set_get_list_remove() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    assert_eq!(h.listxattr(f.ino).unwrap(), b"");
    h.setxattr(f.ino, b"user.b", b"two", 0).unwrap();
    h.setxattr(f.ino, b"user.a", b"one", 0).unwrap();
    h.setxattr(f.ino, b"trusted.t", b"", 0).unwrap();
    h.setxattr(f.ino, b"security.s", b"\0bin\xff", 0).unwrap();
    assert_eq!(h.getxattr(f.ino, b"user.a").unwrap(), b"one");
    assert_eq!(h.getxattr(f.ino, b"user.b").unwrap(), b"two");
    assert_eq!(h.getxattr(f.ino, b"trusted.t").unwrap(), b"");
    assert_eq!(h.getxattr(f.ino, b"security.s").unwrap(), b"\0bin\xff");
    let list = h.listxattr(f.ino).unwrap();
    let mut names: Vec<&[u8]> = list.split(|b| *b == 0).filter(|n| !n.is_empty()).collect();
    names.sort();
    assert_eq!(
        names,
        [&b"security.s"[..], b"trusted.t", b"user.a", b"user.b"]
    );
    assert_eq!(list.last(), Some(&0), "each name NUL-terminated");
    assert_eq!(list.iter().filter(|b| **b == 0).count(), 4);

    // Overwrite without flags.
    let before = h.getattr(f.ino).unwrap();
    h.setxattr(f.ino, b"user.a", b"uno", 0).unwrap();
    assert_eq!(h.getxattr(f.ino, b"user.a").unwrap(), b"uno");
    let after = h.getattr(f.ino).unwrap();
    assert!(after.ctime_ns >= before.ctime_ns, "setxattr changes ctime");
    assert_eq!(after.mtime_ns, before.mtime_ns, "setxattr leaves mtime");

    h.removexattr(f.ino, b"user.a").unwrap();
    assert_eq!(errno(h.getxattr(f.ino, b"user.a")), libc::ENODATA);
    assert_eq!(errno(h.removexattr(f.ino, b"user.a")), libc::ENODATA);
    let list = h.listxattr(f.ino).unwrap();
    assert!(!list.windows(7).any(|w| w == b"user.a\0"));
    assert_eq!(h.cat(f.ino), b"x", "content untouched");
}

#[test]
fn xattrs_on_directories_and_symlinks() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let l = h.symlink(&CTX, ROOT_INO, b"l", b"d").unwrap();
    h.setxattr(d.ino, b"user.k", b"dir", 0).unwrap();
    h.setxattr(l.ino, b"trusted.k", b"link", 0).unwrap();
    assert_eq!(h.getxattr(d.ino, b"user.k").unwrap(), b"dir");
    assert_eq!(h.getxattr(l.ino, b"trusted.k").unwrap(), b"link");
    assert_eq!(errno(h.getxattr(ROOT_INO, b"user.k")), libc::ENODATA);
}

#[test]
fn create_and_replace_flags() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"");
    assert_eq!(
        errno(h.setxattr(f.ino, b"user.k", b"v", REPLACE)),
        libc::ENODATA
    );
    assert_eq!(
        errno(h.getxattr(f.ino, b"user.k")),
        libc::ENODATA,
        "failed REPLACE created nothing"
    );
    h.setxattr(f.ino, b"user.k", b"v1", CREATE).unwrap();
    assert_eq!(
        errno(h.setxattr(f.ino, b"user.k", b"v2", CREATE)),
        libc::EEXIST
    );
    assert_eq!(
        h.getxattr(f.ino, b"user.k").unwrap(),
        b"v1",
        "failed CREATE changed nothing"
    );
    h.setxattr(f.ino, b"user.k", b"v3", REPLACE).unwrap();
    assert_eq!(h.getxattr(f.ino, b"user.k").unwrap(), b"v3");
}

#[test]
fn namespaces_sizes_and_missing_inodes() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"");
    for name in [
        &b"system.posix_acl_access"[..],
        b"system.foo",
        b"other.x",
        b"user.",
        b"user",
    ] {
        assert_eq!(
            errno(h.setxattr(f.ino, name, b"v", 0)),
            libc::EOPNOTSUPP,
            "{name:?}"
        );
        assert_eq!(errno(h.getxattr(f.ino, name)), libc::EOPNOTSUPP, "{name:?}");
    }
    assert_eq!(errno(h.setxattr(f.ino, b"", b"v", 0)), libc::EINVAL);
    // Value size limit: 64 KiB is the largest value.
    let max = vec![0xabu8; 65536];
    h.setxattr(f.ino, b"user.big", &max, 0).unwrap();
    assert_eq!(h.getxattr(f.ino, b"user.big").unwrap(), max);
    assert_eq!(
        errno(h.setxattr(f.ino, b"user.big", &vec![0u8; 65537], 0)),
        libc::E2BIG
    );
    assert_eq!(
        h.getxattr(f.ino, b"user.big").unwrap().len(),
        65536,
        "failed set changed nothing"
    );
    // Name length limit: 255 bytes.
    let name255 = format!("user.{}", "n".repeat(250));
    h.setxattr(f.ino, name255.as_bytes(), b"v", 0).unwrap();
    let name256 = format!("user.{}", "n".repeat(251));
    assert_eq!(
        errno(h.setxattr(f.ino, name256.as_bytes(), b"v", 0)),
        libc::ERANGE
    );
    // Missing inode.
    assert_eq!(errno(h.setxattr(987_654, b"user.k", b"v", 0)), libc::ESTALE);
    assert_eq!(errno(h.getxattr(987_654, b"user.k")), libc::ESTALE);
    assert_eq!(errno(h.listxattr(987_654)), libc::ESTALE);
    assert_eq!(errno(h.removexattr(987_654, b"user.k")), libc::ESTALE);
}

#[test]
fn xattrs_follow_the_inode() {
    let mut h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"");
    h.setxattr(f.ino, b"user.k", b"v", 0).unwrap();
    h.link(&CTX, f.ino, ROOT_INO, b"g").unwrap();
    h.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"h", 0).unwrap();
    let g = h.lk(ROOT_INO, "g").unwrap();
    assert_eq!(h.getxattr(g.ino, b"user.k").unwrap(), b"v");
    h.remount();
    let hh = h.lk(ROOT_INO, "h").unwrap();
    assert_eq!(
        h.getxattr(hh.ino, b"user.k").unwrap(),
        b"v",
        "xattrs survive a remount"
    );
    // A new inode never inherits xattrs of a deleted one.
    h.unlink(&CTX, ROOT_INO, b"g").unwrap();
    h.unlink(&CTX, ROOT_INO, b"h").unwrap();
    let n = h.file(ROOT_INO, "h", b"");
    assert_eq!(h.listxattr(n.ino).unwrap(), b"");
}

#[test]
fn a_missing_selinux_label_is_not_supported_a_stored_one_is_returned() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"x");
    // Fresh file (answered from the hints) and a stored inode (answered from the metadata).
    assert_eq!(
        errno(h.getxattr(f.ino, b"security.selinux")),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        errno(h.getxattr(ROOT_INO, b"security.selinux")),
        libc::EOPNOTSUPP
    );
    // Other missing names stay ENODATA.
    assert_eq!(
        errno(h.getxattr(f.ino, b"security.capability")),
        libc::ENODATA
    );
    assert_eq!(errno(h.getxattr(f.ino, b"user.x")), libc::ENODATA);
    // A label restored by a tool (tar --selinux, rsync -X) is kept and read back.
    h.setxattr(
        f.ino,
        b"security.selinux",
        b"system_u:object_r:tmp_t:s0\0",
        0,
    )
    .unwrap();
    assert_eq!(
        h.getxattr(f.ino, b"security.selinux").unwrap(),
        b"system_u:object_r:tmp_t:s0\0"
    );
    h.removexattr(f.ino, b"security.selinux").unwrap();
    assert_eq!(
        errno(h.getxattr(f.ino, b"security.selinux")),
        libc::EOPNOTSUPP
    );
}

/// A file made by another mount, which has ended: this mount is alone again and has no
/// hint about the file.
fn a_file_another_mount_made(h: &Harness, name: &[u8]) -> Ino {
    let b = h.second_mount("cache-b");
    let (a, o) = b
        .create(&CTX, ROOT_INO, name, 0o644, 0, libc::O_RDWR)
        .unwrap();
    b.release(a.ino, o.fh).unwrap();
    drop(b);
    h.feed_round();
    assert!(!h.shared(), "alone again");
    a.ino
}

/// Alone, a file read with no extended attribute at all answers the next `getxattr`
/// (the kernel's `security.capability` question before a write, once per transaction
/// of a database) and `listxattr` from memory; an xattr set through this mount, or
/// through another one (its change arrives through the feed), is read again. Counted in
/// round trips.
#[test]
fn a_file_read_with_no_xattrs_answers_again_from_memory_until_one_is_set() {
    let h = Harness::new();
    let ino = a_file_another_mount_made(&h, b"db");
    let rt = deskfs_meta::thread_round_trips;
    let cap = &b"security.capability"[..];
    let before = rt();
    assert_eq!(errno(h.getxattr(ino, cap)), libc::ENODATA);
    assert_eq!(rt() - before, 1, "the first getxattr reads");
    let before = rt();
    assert_eq!(errno(h.getxattr(ino, cap)), libc::ENODATA);
    assert_eq!(h.listxattr(ino).unwrap(), b"");
    assert_eq!(rt() - before, 0, "known to have none");
    // Set through this mount.
    h.setxattr(ino, b"user.k", b"v", 0).unwrap();
    assert_eq!(h.getxattr(ino, b"user.k").unwrap(), b"v");
    h.removexattr(ino, b"user.k").unwrap();
    assert_eq!(errno(h.getxattr(ino, b"user.k")), libc::ENODATA);
    let before = rt();
    assert_eq!(errno(h.getxattr(ino, b"user.k")), libc::ENODATA);
    assert_eq!(rt() - before, 0, "none again, and known");
    // Set through another mount: its change reaches this one through the feed.
    let b = h.second_mount("cache-c");
    h.feed_round();
    assert!(h.hints.no_xattrs(ino, crate::namespace::FRESH_ALONE));
    b.setxattr(ino, b"user.o", b"other", 0).unwrap();
    h.feed_round();
    assert!(
        !h.hints.no_xattrs(ino, crate::namespace::FRESH_ALONE),
        "the feed's invalidation drops the hint (at any age)"
    );
    assert_eq!(h.getxattr(ino, b"user.o").unwrap(), b"other");
}

/// An xattr change landing between a read that found none and noting that: the note
/// is not made (the change may come after what the read saw).
#[test]
fn an_xattr_set_while_a_read_found_none_is_not_hidden() {
    let h = Harness::new();
    let ino = a_file_another_mount_made(&h, b"f");
    let vfs = h.arc();
    crate::namespace::tests::BEFORE_XATTR_NOTE.with(|r| {
        *r.borrow_mut() = Some(Box::new(move || {
            vfs.setxattr(ino, b"user.late", b"1", 0).unwrap();
        }))
    });
    assert_eq!(errno(h.getxattr(ino, b"user.late")), libc::ENODATA);
    assert_eq!(
        h.getxattr(ino, b"user.late").unwrap(),
        b"1",
        "the set that landed during the read is seen"
    );
}
