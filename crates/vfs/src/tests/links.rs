//! link, symlink/readlink, mknod.

use super::*;

#[test]
fn hard_links() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let f = h.file(ROOT_INO, "f", b"shared");
    let l = h.link(&CTX, f.ino, d.ino, b"g").unwrap();
    assert_eq!((l.ino, l.nlink, l.size), (f.ino, 2, 6));
    assert!(l.ctime_ns >= f.ctime_ns);
    assert_eq!(h.getattr(f.ino).unwrap().nlink, 2);
    assert_eq!(h.lk(d.ino, "g").unwrap().ino, f.ino);
    assert_eq!(
        h.getattr(d.ino).unwrap().nlink,
        2,
        "a file link does not count in the dir"
    );

    // Writes through one name are seen through the other.
    let fh = h.op(l.ino, libc::O_WRONLY | libc::O_APPEND);
    h.put(l.ino, fh, 0, b" content");
    h.release(l.ino, fh).unwrap();
    assert_eq!(h.cat_path("f"), b"shared content");
    assert_eq!(h.cat_path("d/g"), b"shared content");

    // Errors.
    assert_eq!(errno(h.link(&CTX, d.ino, ROOT_INO, b"dl")), libc::EPERM);
    assert_eq!(errno(h.link(&CTX, f.ino, ROOT_INO, b"d")), libc::EEXIST);
    assert_eq!(errno(h.link(&CTX, f.ino, d.ino, b"g")), libc::EEXIST);
    assert_eq!(errno(h.link(&CTX, 987_654, ROOT_INO, b"x")), libc::ESTALE);
    assert_eq!(errno(h.link(&CTX, f.ino, 987_654, b"x")), libc::ESTALE);
    assert_eq!(errno(h.link(&CTX, f.ino, f.ino, b"x")), libc::ENOTDIR);
    assert_eq!(h.getattr(f.ino).unwrap().nlink, 2);

    // Unlinking one name keeps the other.
    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    let g = h.getattr(f.ino).unwrap();
    assert_eq!(g.nlink, 1);
    assert_eq!(h.cat_path("d/g"), b"shared content");
    h.unlink(&CTX, d.ino, b"g").unwrap();
    h.kernel_forgets(f.ino);
    assert_eq!(errno(h.getattr(f.ino)), libc::ESTALE);
}

#[test]
fn link_to_symlink_and_special_files() {
    let h = Harness::new();
    let s = h.symlink(&CTX, ROOT_INO, b"s", b"target").unwrap();
    let l = h.link(&CTX, s.ino, ROOT_INO, b"s2").unwrap();
    assert_eq!((l.kind, l.nlink), (Kind::Symlink, 2));
    assert_eq!(
        h.readlink(h.lk(ROOT_INO, "s2").unwrap().ino).unwrap(),
        b"target"
    );
    let p = h
        .mknod(&CTX, ROOT_INO, b"p", libc::S_IFIFO | 0o600, 0, 0)
        .unwrap();
    assert_eq!(h.link(&CTX, p.ino, ROOT_INO, b"p2").unwrap().nlink, 2);
}

#[test]
fn link_to_an_open_unlinked_file_is_enoent() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    assert_eq!(errno(h.link(&CTX, a.ino, ROOT_INO, b"back")), libc::ENOENT);
    h.release(a.ino, fh).unwrap();
}

#[test]
fn symlinks_and_readlink() {
    let h = Harness::new();
    let target = b"../some/where/file.txt";
    let s = h.symlink(&CTX, ROOT_INO, b"link", target).unwrap();
    assert_eq!(
        (s.kind, s.perm, s.size, s.nlink),
        (Kind::Symlink, 0o777, target.len() as u64, 1)
    );
    assert_eq!(s.mode(), libc::S_IFLNK | 0o777);
    assert_eq!((s.uid, s.gid), (CTX.uid, CTX.gid));
    assert_eq!(h.lk(ROOT_INO, "link").unwrap(), s);
    assert_eq!(h.readlink(s.ino).unwrap(), target);
    // Targets are arbitrary bytes, need not exist, may be absolute.
    let t2 = b"/abs/\xff\xfe/x";
    let s2 = h.symlink(&CTX, ROOT_INO, b"raw", t2).unwrap();
    assert_eq!(h.readlink(s2.ino).unwrap(), t2);

    let f = h.file(ROOT_INO, "f", b"x");
    let d = h.dir(ROOT_INO, "d");
    assert_eq!(errno(h.readlink(f.ino)), libc::EINVAL);
    assert_eq!(errno(h.readlink(d.ino)), libc::EINVAL);
    assert_eq!(errno(h.readlink(987_654)), libc::ESTALE);
    assert_eq!(
        errno(h.symlink(&CTX, ROOT_INO, b"link", b"x")),
        libc::EEXIST
    );
    assert_eq!(errno(h.symlink(&CTX, ROOT_INO, b"f", b"x")), libc::EEXIST);
    assert_eq!(errno(h.symlink(&CTX, f.ino, b"x", b"x")), libc::ENOTDIR);
    // PATH_MAX: a 4095-byte target is fine, 4096 is too long.
    let ok = vec![b'a'; 4095];
    let s3 = h.symlink(&CTX, ROOT_INO, b"long", &ok).unwrap();
    assert_eq!(h.readlink(s3.ino).unwrap(), ok);
    assert_eq!(
        errno(h.symlink(&CTX, ROOT_INO, b"toolong", &[b'a'; 4096])),
        libc::ENAMETOOLONG
    );
    // Opening a symlink for writing does not write through it (the kernel resolves links);
    // but setattr on it only touches the link.
    h.setattr(
        &CTX,
        s.ino,
        &crate::SetAttr {
            uid: Some(5),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(h.getattr(s.ino).unwrap().uid, 5);
    assert_eq!(h.readlink(s.ino).unwrap(), target);
}

#[test]
fn mknod_special_kinds() {
    let h = Harness::new();
    let cases: [(&str, u32, Kind, u32); 4] = [
        ("fifo", libc::S_IFIFO, Kind::Fifo, 0),
        ("sock", libc::S_IFSOCK, Kind::Socket, 0),
        ("chr", libc::S_IFCHR, Kind::CharDev, 0x0103),
        ("blk", libc::S_IFBLK, Kind::BlockDev, 0x0801),
    ];
    for (name, ty, kind, rdev) in cases {
        let a = h
            .mknod(&CTX, ROOT_INO, name.as_bytes(), ty | 0o666, 0o022, rdev)
            .unwrap();
        assert_eq!(
            (a.kind, a.perm, a.rdev, a.size, a.nlink),
            (kind, 0o644, rdev, 0, 1),
            "{name}"
        );
        assert_eq!(a.mode(), ty | 0o644);
        let l = h.lk(ROOT_INO, name).unwrap();
        assert_eq!(l, a, "{name}");
        assert_eq!(errno(h.readlink(a.ino)), libc::EINVAL);
    }
    let entries = h.ls_entries(ROOT_INO, false);
    let kind_of = |n: &str| {
        entries
            .iter()
            .find(|e| e.name == n.as_bytes())
            .unwrap()
            .kind
    };
    assert_eq!(kind_of("fifo"), Kind::Fifo);
    assert_eq!(kind_of("sock"), Kind::Socket);
    assert_eq!(kind_of("chr"), Kind::CharDev);
    assert_eq!(kind_of("blk"), Kind::BlockDev);

    assert_eq!(
        errno(h.mknod(&CTX, ROOT_INO, b"fifo", libc::S_IFIFO | 0o644, 0, 0)),
        libc::EEXIST
    );
    assert_eq!(
        errno(h.mknod(&CTX, ROOT_INO, b"x", 0o644, 0, 0)),
        libc::EINVAL,
        "no type bits"
    );
    assert_eq!(
        errno(h.mknod(&CTX, ROOT_INO, b"x", libc::S_IFDIR | 0o755, 0, 0)),
        libc::EINVAL
    );
    assert_eq!(
        errno(h.mknod(&CTX, ROOT_INO, b"x", libc::S_IFLNK | 0o777, 0, 0)),
        libc::EINVAL
    );
    let fifo = h.lk(ROOT_INO, "fifo").unwrap();
    assert_eq!(
        errno(h.mknod(&CTX, fifo.ino, b"x", libc::S_IFIFO | 0o644, 0, 0)),
        libc::ENOTDIR
    );
}

#[test]
fn mknod_regular_file_is_an_empty_file() {
    let h = Harness::new();
    let a = h
        .mknod(&CTX, ROOT_INO, b"reg", libc::S_IFREG | 0o640, 0, 0)
        .unwrap();
    assert_eq!((a.kind, a.perm, a.size), (Kind::File, 0o640, 0));
    assert_eq!(h.cat(a.ino), b"");
    h.sync_all();
    assert_eq!(h.bucket_file("reg").as_deref(), Some(&b""[..]));
}

/// `mknod(S_IFREG)` followed by open + write (what `mknod(2)` with `S_IFREG`, or a FUSE
/// mount without `create`, does) must work like a file made by `create`.
#[test]
fn mknod_regular_file_then_write() {
    let h = Harness::new();
    let a = h
        .mknod(&CTX, ROOT_INO, b"reg", libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    let fh = h.op(a.ino, libc::O_WRONLY);
    let w = h.write(a.ino, fh, 0, b"data");
    h.release(a.ino, fh).unwrap();
    assert_eq!(
        w.map_err(|e| e.errno()),
        Ok(4),
        "write to an mknod'ed regular file"
    );
    assert_eq!(h.cat(a.ino), b"data");
}

#[test]
fn mknod_regular_file_then_truncate() {
    let h = Harness::new();
    let a = h
        .mknod(&CTX, ROOT_INO, b"reg", libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    let r = h.setattr(
        &CTX,
        a.ino,
        &crate::SetAttr {
            size: Some(10),
            ..Default::default()
        },
    );
    assert_eq!(r.map(|a| a.size).map_err(|e| e.errno()), Ok(10));
}
