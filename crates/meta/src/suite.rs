//! The engine-independent test suite: every test here runs unchanged against each
//! metadata engine (`engine_suite!` in each engine's test module), so an engine cannot
//! drift from what the VFS relies on.

use std::sync::Arc;

use crate::{
    read, txn, AttrUpdate, Expect, FeedCursor, Ino, InodeRow, Kind, Local, LockRow, MetaEngine,
    MetaError, ObjectRow, Op, OpOut, XattrLook, XattrMode, ROOT_INO,
};

/// A fresh, empty workspace database of one engine (root owned by 0:0, times 5 ns).
pub(crate) trait Fixture {
    /// The engine under test.
    fn engine(&self) -> Arc<dyn MetaEngine>;
    /// A second, independent connection to the same database (another mount).
    fn second(&self) -> Arc<dyn MetaEngine>;
}

/// Expands to one `#[test]` per suite test, each on a fresh fixture from `$make`
/// (an expression yielding `Option<Box<dyn Fixture>>`; `None` = engine not available,
/// which fails under `DESKFS_TEST_STRICT=1` and is reported as skipped otherwise).
macro_rules! engine_suite {
    ($make:expr) => {
        $crate::suite::engine_suite!(@tests $make;
            root_and_direct_reads, batch_create_and_lookup, batch_is_atomic,
            expectations, nlink_purge_and_opens, commit_content_versions, xattr_modes,
            mark_inode_hard_links, fencing, alloc_inos_unique, typed_errors_and_retries,
            dentries_and_cookies, pending_gen_and_seq, remarks_keep_the_older_seq, upload_announcements, pending_under_a_dir, objects_subtree_range, change_feed,
            sessions_locks_opens, held_opens_of_expired_sessions, wanted_uploads, concurrent_mounts, usage_and_orphans,
            keyed_transactions_serialise, paths_up_to_path_max);
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let fixture: Option<Box<dyn $crate::suite::Fixture>> = $make;
                match fixture {
                    Some(f) => $crate::suite::$name(&*f),
                    None => $crate::suite::unavailable(stringify!($name)),
                }
            }
        )*
    };
}
pub(crate) use engine_suite;

/// An engine is not configured for this run: a failure under `DESKFS_TEST_STRICT=1`.
pub(crate) fn unavailable(test: &str) {
    if std::env::var("DESKFS_TEST_STRICT").as_deref() == Ok("1") {
        panic!("{test}: engine not available (DESKFS_TEST_STRICT=1)");
    }
    eprintln!("{test}: engine not available, skipped");
}

fn row(kind: Kind) -> InodeRow {
    InodeRow {
        ino: 0,
        kind,
        perm: if kind == Kind::Dir { 0o755 } else { 0o644 },
        uid: 0,
        gid: 0,
        rdev: 0,
        nlink: if kind == Kind::Dir { 2 } else { 1 },
        size: 0,
        atime_ns: 1,
        mtime_ns: 2,
        ctime_ns: 3,
        btime_ns: 4,
        data_version: 1,
        target: None,
        local: Local::At(7),
        dirty: true,
        listed_ns: 0,
    }
}

/// Creates `parent/name` of `kind` through a batch; returns its number.
fn create(e: &dyn MetaEngine, parent: Ino, name: &str, kind: Kind) -> Ino {
    let ino = e.alloc_inos(1).unwrap().start;
    let r = InodeRow { ino, ..row(kind) };
    e.apply(&[
        Op::TouchDir {
            ino: parent,
            nlink_delta: (kind == Kind::Dir) as i64,
            time_ns: 100,
        },
        Op::InsertInode(r),
        Op::InsertDentry {
            parent,
            name: name.into(),
            ino,
        },
        Op::MarkPath {
            parent,
            name: name.into(),
            recursive: false,
            not_before_ns: 0,
        },
    ])
    .unwrap();
    ino
}

fn precondition(r: crate::Result<Vec<OpOut>>) -> (usize, Expect) {
    match r {
        Err(MetaError::Precondition { step, what }) => (step, what),
        other => panic!("expected a precondition failure, got {other:?}"),
    }
}

fn pending_paths(e: &dyn MetaEngine) -> Vec<String> {
    let mut v: Vec<String> = read(e, |t| t.due_pending(i64::MAX, 1000))
        .unwrap()
        .into_iter()
        .map(|p| String::from_utf8(p.path).unwrap())
        .collect();
    v.sort();
    v
}

pub(crate) fn root_and_direct_reads(f: &dyn Fixture) {
    let e = f.engine();
    let root = e.get_inode(ROOT_INO).unwrap().expect("root exists");
    assert_eq!(root.kind, Kind::Dir);
    assert_eq!(root.nlink, 2);
    assert!(e.get_inode(999_999).unwrap().is_none());
    assert!(e.lookup(ROOT_INO, b"nothing").unwrap().is_none());
    let ino = create(&*e, ROOT_INO, "f", Kind::File);
    let got = e.lookup(ROOT_INO, b"f").unwrap().unwrap();
    assert_eq!(got.ino, ino);
    assert_eq!(got.local, Local::At(7));
    assert_eq!(e.get_inode(ino).unwrap().unwrap(), got);
    assert!(!e.describe().is_empty());
}

pub(crate) fn batch_create_and_lookup(f: &dyn Fixture) {
    let e = f.engine();
    let a = create(&*e, ROOT_INO, "a", Kind::Dir);
    let b = create(&*e, a, "b", Kind::Dir);
    let name = b"f\xff\x01 x".to_vec(); // not UTF-8: bytes all the way
    let fino = e.alloc_inos(1).unwrap().start;
    let out = e
        .apply(&[
            Op::TouchDir {
                ino: b,
                nlink_delta: 0,
                time_ns: 500,
            },
            Op::InsertInode(InodeRow {
                ino: fino,
                ..row(Kind::File)
            }),
            Op::InsertDentry {
                parent: b,
                name: name.clone(),
                ino: fino,
            },
            Op::MarkPath {
                parent: b,
                name: name.clone(),
                recursive: false,
                not_before_ns: 0,
            },
            Op::GetInode(b),
        ])
        .unwrap();
    assert_eq!(out.len(), 5);
    let brow = out[4].row().unwrap();
    assert_eq!(brow.mtime_ns, 500);
    assert_eq!(brow.ctime_ns, 500);
    assert_eq!(
        e.get_inode(a).unwrap().unwrap().nlink,
        3,
        "a has one subdir"
    );
    assert_eq!(e.get_inode(ROOT_INO).unwrap().unwrap().nlink, 3);
    assert_eq!(e.lookup(b, &name).unwrap().unwrap().ino, fino);
    let mut want = b"a/b/".to_vec();
    want.extend_from_slice(&name);
    let paths = read(&*e, |t| t.paths_of(fino)).unwrap();
    assert_eq!(paths, vec![want.clone()]);
    let pend: Vec<Vec<u8>> = read(&*e, |t| t.due_pending(i64::MAX, 100))
        .unwrap()
        .into_iter()
        .map(|p| p.path)
        .collect();
    assert!(pend.contains(&want), "{pend:?}");
    assert!(pend.contains(&b"a/b".to_vec()));
    assert_eq!(read(&*e, |t| t.paths_of(ROOT_INO)).unwrap(), vec![vec![]]);
    // A whole path resolves in one call; a missing or non-directory step is None.
    assert_eq!(read(&*e, |t| t.resolve(&want)).unwrap(), Some(fino));
    assert_eq!(read(&*e, |t| t.resolve(b"a/b")).unwrap(), Some(b));
    assert_eq!(read(&*e, |t| t.resolve(b"")).unwrap(), Some(ROOT_INO));
    assert_eq!(read(&*e, |t| t.resolve(b"a/x/b")).unwrap(), None);
    assert_eq!(read(&*e, |t| t.resolve(b"a/b/")).unwrap(), None);
    let mut below = want.clone();
    below.extend_from_slice(b"/child");
    assert_eq!(read(&*e, |t| t.resolve(&below)).unwrap(), None);
    // TouchDir never moves times backwards.
    e.apply(&[Op::TouchDir {
        ino: b,
        nlink_delta: 0,
        time_ns: 10,
    }])
    .unwrap();
    assert_eq!(e.get_inode(b).unwrap().unwrap().mtime_ns, 500);
}

pub(crate) fn batch_is_atomic(f: &dyn Fixture) {
    let e = f.engine();
    create(&*e, ROOT_INO, "taken", Kind::File);
    let before = pending_paths(&*e);
    let root_before = e.get_inode(ROOT_INO).unwrap().unwrap();
    let ino = e.alloc_inos(1).unwrap().start;
    let r = e.apply(&[
        Op::TouchDir {
            ino: ROOT_INO,
            nlink_delta: 1,
            time_ns: 900,
        },
        Op::InsertInode(InodeRow {
            ino,
            ..row(Kind::Dir)
        }),
        Op::MarkPath {
            parent: ROOT_INO,
            name: b"taken".to_vec(),
            recursive: true,
            not_before_ns: 0,
        },
        Op::InsertDentry {
            parent: ROOT_INO,
            name: b"taken".to_vec(),
            ino,
        },
    ]);
    assert_eq!(precondition(r), (3, Expect::NameFree));
    assert!(
        e.get_inode(ino).unwrap().is_none(),
        "inode insert rolled back"
    );
    assert_eq!(e.get_inode(ROOT_INO).unwrap().unwrap(), root_before);
    assert_eq!(pending_paths(&*e), before);
    let recursive = read(&*e, |t| t.due_pending(i64::MAX, 100))
        .unwrap()
        .iter()
        .any(|p| p.recursive);
    assert!(!recursive, "the mark was rolled back too");
}

pub(crate) fn expectations(f: &dyn Fixture) {
    let e = f.engine();
    let d = create(&*e, ROOT_INO, "d", Kind::Dir);
    let sub = create(&*e, d, "sub", Kind::Dir);
    let x = create(&*e, d, "x", Kind::File);
    let y = create(&*e, ROOT_INO, "y", Kind::File);
    // DeleteDentry of the wrong inode.
    let r = e.apply(&[Op::DeleteDentry {
        parent: d,
        name: b"x".to_vec(),
        ino: y,
    }]);
    assert_eq!(precondition(r), (0, Expect::EntryIs));
    // MoveDentry onto a taken name; then a real move keeps the cookie.
    let r = e.apply(&[Op::MoveDentry {
        parent: d,
        name: b"x".to_vec(),
        ino: x,
        new_parent: ROOT_INO,
        new_name: b"y".to_vec(),
    }]);
    assert_eq!(precondition(r), (0, Expect::NameFree));
    let cookie = read(&*e, |t| t.lookup(d, b"x")).unwrap().unwrap().cookie;
    e.apply(&[Op::MoveDentry {
        parent: d,
        name: b"x".to_vec(),
        ino: x,
        new_parent: ROOT_INO,
        new_name: b"x2".to_vec(),
    }])
    .unwrap();
    let moved = read(&*e, |t| t.lookup(ROOT_INO, b"x2")).unwrap().unwrap();
    assert_eq!(
        (moved.ino, moved.cookie),
        (x, cookie),
        "move keeps the cookie"
    );
    assert!(e.lookup(d, b"x").unwrap().is_none());
    // ExpectEntry both ways.
    assert_eq!(
        precondition(e.apply(&[Op::ExpectEntry {
            parent: ROOT_INO,
            name: b"y".to_vec(),
            ino: None,
        }])),
        (0, Expect::NameFree)
    );
    assert_eq!(
        precondition(e.apply(&[
            Op::ExpectEntry {
                parent: ROOT_INO,
                name: b"y".to_vec(),
                ino: Some(y),
            },
            Op::ExpectEntry {
                parent: ROOT_INO,
                name: b"y".to_vec(),
                ino: Some(x),
            },
        ])),
        (1, Expect::EntryIs)
    );
    // Empty and ancestor checks.
    assert_eq!(
        precondition(e.apply(&[Op::ExpectEmpty(d)])),
        (0, Expect::DirEmpty)
    );
    e.apply(&[Op::ExpectEmpty(sub)]).unwrap();
    assert_eq!(
        precondition(e.apply(&[Op::ExpectNotAncestor { dir: d, of: sub }])),
        (0, Expect::NotAncestor)
    );
    assert_eq!(
        precondition(e.apply(&[Op::ExpectNotAncestor { dir: d, of: d }])),
        (0, Expect::NotAncestor)
    );
    e.apply(&[Op::ExpectNotAncestor { dir: sub, of: d }])
        .unwrap();
    e.apply(&[Op::ExpectNotAncestor {
        dir: d,
        of: ROOT_INO,
    }])
    .unwrap();
    // TouchDir on a file, and on a removed directory.
    assert_eq!(
        precondition(e.apply(&[Op::TouchDir {
            ino: y,
            nlink_delta: 0,
            time_ns: 1
        }])),
        (0, Expect::DirAlive)
    );
    e.apply(&[
        Op::DeleteDentry {
            parent: d,
            name: b"sub".to_vec(),
            ino: sub,
        },
        Op::DeleteInode(sub),
        Op::TouchDir {
            ino: d,
            nlink_delta: -1,
            time_ns: 1,
        },
    ])
    .unwrap();
    assert!(e.get_inode(sub).unwrap().is_none());
    assert_eq!(e.get_inode(d).unwrap().unwrap().nlink, 2);
    // RepointDentry.
    e.apply(&[Op::RepointDentry {
        parent: ROOT_INO,
        name: b"y".to_vec(),
        from: y,
        to: x,
    }])
    .unwrap();
    assert_eq!(e.lookup(ROOT_INO, b"y").unwrap().unwrap().ino, x);
    assert_eq!(
        precondition(e.apply(&[Op::RepointDentry {
            parent: ROOT_INO,
            name: b"y".to_vec(),
            from: y,
            to: x,
        }])),
        (0, Expect::EntryIs)
    );
    // A missing inode.
    assert_eq!(
        precondition(e.apply(&[Op::AddNlink {
            ino: 987_654,
            delta: 1,
            ctime_ns: 1
        }])),
        (0, Expect::InodeExists)
    );
    assert_eq!(
        precondition(e.apply(&[Op::SetAttrs {
            ino: 987_654,
            set: AttrUpdate::default()
        }])),
        (0, Expect::InodeExists)
    );
}

pub(crate) fn nlink_purge_and_opens(f: &dyn Fixture) {
    let e = f.engine();
    let s = txn(&*e, |t| t.register_session("h", 1, 10)).unwrap();
    let x = create(&*e, ROOT_INO, "x", Kind::File);
    e.apply(&[Op::SetXattr {
        ino: x,
        name: b"user.a".to_vec(),
        value: b"1".to_vec(),
        mode: XattrMode::Any,
    }])
    .unwrap();
    // Still linked: no purge.
    let out = e.apply(&[Op::Purge(x)]).unwrap();
    assert_eq!(out, vec![OpOut::Purged(false)]);
    let out = e
        .apply(&[
            Op::AddOpen {
                ino: x,
                session: s,
                delta: 1,
            },
            Op::DeleteDentry {
                parent: ROOT_INO,
                name: b"x".to_vec(),
                ino: x,
            },
            Op::AddNlink {
                ino: x,
                delta: -1,
                ctime_ns: 77,
            },
            Op::Purge(x),
        ])
        .unwrap();
    assert_eq!(out[3], OpOut::Purged(false), "open through a session");
    let r = e.get_inode(x).unwrap().unwrap();
    assert_eq!((r.nlink, r.ctime_ns), (0, 77));
    assert_eq!(read(&*e, |t| t.orphan_inodes()).unwrap(), vec![x]);
    assert!(read(&*e, |t| t.open_elsewhere(x, 0)).unwrap());
    assert!(!read(&*e, |t| t.open_elsewhere(x, s)).unwrap());
    let out = e
        .apply(&[
            Op::AddOpen {
                ino: x,
                session: s,
                delta: -1,
            },
            Op::Purge(x),
        ])
        .unwrap();
    assert_eq!(out[1], OpOut::Purged(true));
    assert!(e.get_inode(x).unwrap().is_none());
    assert!(read(&*e, |t| t.get_xattr(x, b"user.a")).unwrap().is_none());
    // nlink never goes below 0, and an inode without names gets none back.
    let z = create(&*e, ROOT_INO, "z", Kind::File);
    e.apply(&[Op::AddNlink {
        ino: z,
        delta: -5,
        ctime_ns: 1,
    }])
    .unwrap();
    assert_eq!(e.get_inode(z).unwrap().unwrap().nlink, 0);
    assert_eq!(
        precondition(e.apply(&[Op::AddNlink {
            ino: z,
            delta: 1,
            ctime_ns: 1
        }])),
        (0, Expect::Linked)
    );
    // Attribute guards.
    let r = e.get_inode(z).unwrap().unwrap();
    e.apply(&[Op::ExpectAttrs {
        ino: z,
        perm: r.perm,
        uid: r.uid,
        gid: r.gid,
    }])
    .unwrap();
    assert_eq!(
        precondition(e.apply(&[Op::ExpectAttrs {
            ino: z,
            perm: r.perm ^ 0o2000,
            uid: r.uid,
            gid: r.gid,
        }])),
        (0, Expect::Attrs)
    );
    assert_eq!(
        precondition(e.apply(&[Op::ExpectAttrs {
            ino: 555_555,
            perm: 0,
            uid: 0,
            gid: 0,
        }])),
        (0, Expect::Attrs)
    );
}

pub(crate) fn commit_content_versions(f: &dyn Fixture) {
    let e = f.engine();
    let x = create(&*e, ROOT_INO, "x", Kind::File);
    e.apply(&[Op::SetAttrs {
        ino: x,
        set: AttrUpdate {
            dirty: Some(false),
            local: Some(Local::None),
            ctime_ns: Some(1000),
            ..Default::default()
        },
    }])
    .unwrap();
    let out = e
        .apply(&[
            Op::CommitContent {
                ino: x,
                size: 4096,
                mtime_ns: 2000,
                ctime_ns: 500,
                local: Local::At(42),
            },
            Op::GetInode(x),
        ])
        .unwrap();
    assert_eq!(out[0], OpOut::Version(2));
    let r = out[1].row().unwrap();
    assert_eq!(
        (
            r.size,
            r.mtime_ns,
            r.ctime_ns,
            r.data_version,
            r.dirty,
            r.local
        ),
        (4096, 2000, 1000, 2, true, Local::At(42)),
        "ctime only moves forward"
    );
    assert_eq!(
        precondition(e.apply(&[Op::CommitContent {
            ino: 424_242,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            local: Local::None,
        }])),
        (0, Expect::InodeExists)
    );
    // SetAttrs: only what is given changes.
    e.apply(&[Op::SetAttrs {
        ino: x,
        set: AttrUpdate {
            perm: Some(0o4750),
            gid: Some(33),
            mtime_ns: Some(7),
            ..Default::default()
        },
    }])
    .unwrap();
    let r = e.get_inode(x).unwrap().unwrap();
    assert_eq!(
        (r.perm, r.uid, r.gid, r.mtime_ns, r.size),
        (0o4750, 0, 33, 7, 4096)
    );
}

pub(crate) fn xattr_modes(f: &dyn Fixture) {
    let e = f.engine();
    let x = create(&*e, ROOT_INO, "x", Kind::File);
    let set = |mode, v: &[u8]| {
        e.apply(&[Op::SetXattr {
            ino: x,
            name: b"user.k".to_vec(),
            value: v.to_vec(),
            mode,
        }])
    };
    assert_eq!(
        precondition(set(XattrMode::Replace, b"1")),
        (0, Expect::XattrPresent)
    );
    set(XattrMode::Create, b"1").unwrap();
    assert_eq!(
        precondition(set(XattrMode::Create, b"2")),
        (0, Expect::XattrAbsent)
    );
    set(XattrMode::Replace, b"3").unwrap();
    set(XattrMode::Any, b"\x00\xffbin").unwrap();
    assert_eq!(
        read(&*e, |t| t.get_xattr(x, b"user.k")).unwrap().unwrap(),
        b"\x00\xffbin"
    );
    // One look: the value, a missing name beside another, none at all, no inode.
    let look = |ino, name: &[u8]| read(&*e, |t| t.look_xattr(ino, name)).unwrap();
    assert_eq!(
        look(x, b"user.k"),
        XattrLook::Value(b"\x00\xffbin".to_vec())
    );
    assert_eq!(look(x, b"user.no"), XattrLook::Missing { any: true });
    assert_eq!(look(ROOT_INO, b"user.k"), XattrLook::Missing { any: false });
    assert_eq!(look(x + 1000, b"user.k"), XattrLook::NoInode);
    set(XattrMode::Any, b"").unwrap();
    assert_eq!(
        look(x, b"user.k"),
        XattrLook::Value(Vec::new()),
        "an empty value is a value"
    );
    e.apply(&[Op::RemoveXattr {
        ino: x,
        name: b"user.k".to_vec(),
    }])
    .unwrap();
    assert_eq!(
        precondition(e.apply(&[Op::RemoveXattr {
            ino: x,
            name: b"user.k".to_vec(),
        }])),
        (0, Expect::XattrPresent)
    );
}

pub(crate) fn mark_inode_hard_links(f: &dyn Fixture) {
    let e = f.engine();
    let d = create(&*e, ROOT_INO, "d", Kind::Dir);
    let x = create(&*e, d, "x", Kind::File);
    e.apply(&[
        Op::InsertDentry {
            parent: ROOT_INO,
            name: b"link".to_vec(),
            ino: x,
        },
        Op::AddNlink {
            ino: x,
            delta: 1,
            ctime_ns: 1,
        },
    ])
    .unwrap();
    // Clear the work list, then mark the inode: both names.
    let rows = read(&*e, |t| t.due_pending(i64::MAX, 100)).unwrap();
    txn(&*e, |t| {
        for r in &rows {
            t.finish_pending(&r.path, r.gen)?;
        }
        Ok::<_, MetaError>(())
    })
    .unwrap();
    assert!(pending_paths(&*e).is_empty());
    e.apply(&[Op::MarkInode {
        ino: x,
        not_before_ns: 0,
    }])
    .unwrap();
    assert_eq!(
        pending_paths(&*e),
        vec!["d/x".to_string(), "link".to_string()]
    );
    let mut paths = read(&*e, |t| t.paths_of(x)).unwrap();
    paths.sort();
    assert_eq!(paths, vec![b"d/x".to_vec(), b"link".to_vec()]);
    // Under an unlinked directory a name has no path.
    e.apply(&[Op::DeleteDentry {
        parent: ROOT_INO,
        name: b"d".to_vec(),
        ino: d,
    }])
    .unwrap();
    assert_eq!(
        read(&*e, |t| t.paths_of(x)).unwrap(),
        vec![b"link".to_vec()]
    );
    let before = pending_paths(&*e).len();
    e.apply(&[Op::MarkPath {
        parent: d,
        name: b"x".to_vec(),
        recursive: false,
        not_before_ns: 0,
    }])
    .unwrap();
    assert_eq!(
        pending_paths(&*e).len(),
        before,
        "unreachable: nothing marked"
    );
}

pub(crate) fn fencing(f: &dyn Fixture) {
    let e = f.engine();
    let s = txn(&*e, |t| t.register_session("h", 1, 10)).unwrap();
    e.apply(&[Op::CheckSession(s)]).unwrap();
    txn(&*e, |t| t.delete_session(s)).unwrap();
    let x = e.alloc_inos(1).unwrap().start;
    let r = e.apply(&[
        Op::CheckSession(s),
        Op::InsertInode(InodeRow {
            ino: x,
            ..row(Kind::File)
        }),
    ]);
    assert!(matches!(r, Err(MetaError::Fenced(id)) if id == s), "{r:?}");
    assert!(e.get_inode(x).unwrap().is_none());
}

pub(crate) fn alloc_inos_unique(f: &dyn Fixture) {
    let e = f.engine();
    let e2 = f.second();
    let mut seen = std::collections::HashSet::new();
    seen.insert(ROOT_INO);
    for i in 0..20 {
        let eng = if i % 2 == 0 { &e } else { &e2 };
        for ino in eng.alloc_inos(7).unwrap() {
            assert!(seen.insert(ino), "{ino} handed out twice");
        }
        let ino = txn(&**eng, |t| t.insert_inode(&row(Kind::File))).unwrap();
        assert!(seen.insert(ino), "insert_inode reused {ino}");
    }
}

pub(crate) fn typed_errors_and_retries(f: &dyn Fixture) {
    let e = f.engine();
    #[derive(Debug, PartialEq)]
    enum Mine {
        Posix(i32),
        Meta(String),
    }
    impl From<MetaError> for Mine {
        fn from(m: MetaError) -> Self {
            Mine::Meta(m.to_string())
        }
    }
    impl crate::TxnError for Mine {
        fn into_meta(self) -> Result<MetaError, Self> {
            Err(self)
        }
    }
    // A caller error comes back as itself, and the transaction rolls back.
    let r: Result<(), Mine> = txn(&*e, |t| {
        t.set_kv("k", "v")?;
        Err(Mine::Posix(39))
    });
    assert_eq!(r, Err(Mine::Posix(39)));
    assert_eq!(read(&*e, |t| t.get_kv("k")).unwrap(), None);
    // A retryable engine error runs the closure again.
    let before = e.counters().retries;
    let mut calls = 0;
    let v = txn(&*e, |t| {
        calls += 1;
        t.set_kv("k", &calls.to_string())?;
        if calls < 3 {
            return Err(MetaError::db("40001", "could not serialize access"));
        }
        Ok(calls)
    })
    .unwrap();
    assert_eq!((v, calls), (3, 3));
    assert_eq!(read(&*e, |t| t.get_kv("k")).unwrap().as_deref(), Some("3"));
    assert_eq!(e.counters().retries - before, 2);
    // A non-retryable engine error keeps its code.
    let r = txn(&*e, |_| {
        Err::<(), _>(MetaError::db("23505", "duplicate key"))
    });
    assert!(matches!(r, Err(MetaError::Db { code: Some(c), .. }) if c == "23505"));
}

pub(crate) fn dentries_and_cookies(f: &dyn Fixture) {
    let e = f.engine();
    let ino = txn(&*e, |t| {
        let ino = t.insert_inode(&InodeRow {
            size: 3,
            ..row(Kind::File)
        })?;
        t.insert_dentry(ROOT_INO, b"a", ino)?;
        Ok::<_, MetaError>(ino)
    })
    .unwrap();
    assert!(ino > ROOT_INO);
    let dup = txn(&*e, |t| t.insert_dentry(ROOT_INO, b"a", ino));
    assert!(matches!(dup, Err(MetaError::Conflict(_))), "{dup:?}");
    let c1 = read(&*e, |t| {
        Ok::<_, MetaError>(t.lookup(ROOT_INO, b"a")?.unwrap().cookie)
    })
    .unwrap();
    txn(&*e, |t| t.move_dentry(ROOT_INO, b"a", ROOT_INO, b"b")).unwrap();
    let d = read(&*e, |t| t.lookup(ROOT_INO, b"b")).unwrap().unwrap();
    assert_eq!(d.cookie, c1, "rename keeps the readdir cookie");
    let list = read(&*e, |t| t.list_dir(ROOT_INO, 0, 10)).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].1.size, 3);
    assert!(read(&*e, |t| t.has_children(ROOT_INO)).unwrap());
    assert_eq!(read(&*e, |t| t.count_children(ROOT_INO, 10)).unwrap(), 1);
    assert_eq!(
        read(&*e, |t| t.count_children(ROOT_INO, 0)).unwrap(),
        0,
        "counted up to the cap"
    );
    assert_eq!(read(&*e, |t| t.count_children(ino, 10)).unwrap(), 0);
    assert_eq!(
        read(&*e, |t| t.names_of(ino)).unwrap(),
        vec![(ROOT_INO, b"b".to_vec())]
    );
    // A failed transaction rolls back.
    let r = txn(&*e, |t| {
        t.delete_dentry(ROOT_INO, b"b")?;
        Err::<(), _>(MetaError::Internal("boom".into()))
    });
    assert!(r.is_err());
    assert!(read(&*e, |t| t.lookup(ROOT_INO, b"b")).unwrap().is_some());
    // Whole-row update and scans.
    let mut r = read(&*e, |t| t.get_inode(ino)).unwrap().unwrap();
    r.size = 12;
    r.target = Some(b"t".to_vec());
    txn(&*e, |t| t.update_inode(&r)).unwrap();
    assert_eq!(e.get_inode(ino).unwrap().unwrap(), r);
    let all = read(&*e, |t| t.scan_inodes(0, 100)).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(read(&*e, |t| t.scan_dentries(0, 100)).unwrap().len(), 1);
    e.make_durable().unwrap();
}

pub(crate) fn pending_gen_and_seq(f: &dyn Fixture) {
    let e = f.engine();
    let s1 = txn(&*e, |t| t.mark_pending(b"x", false, 10)).unwrap();
    let rows = read(&*e, |t| t.due_pending(100, 10)).unwrap();
    assert_eq!(rows.len(), 1);
    let g = rows[0].gen;
    let s2 = txn(&*e, |t| t.mark_pending(b"x", true, 20)).unwrap();
    assert!(s2 > s1);
    // A stale gen does not clear the re-marked row.
    txn(&*e, |t| t.finish_pending(b"x", g)).unwrap();
    let rows = read(&*e, |t| t.due_pending(100, 10)).unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].recursive);
    assert_eq!(rows[0].seq, s1, "oldest seq kept for barriers");
    assert!(read(&*e, |t| t.pending_upto(s1)).unwrap());
    assert!(
        read(&*e, |t| t.is_pending(b"x/y/z")).unwrap(),
        "recursive mark covers children"
    );
    txn(&*e, |t| t.fail_pending(b"x", rows[0].gen, "boom", 50)).unwrap();
    let failed = read(&*e, |t| t.failed_pending(5)).unwrap();
    assert_eq!(
        (failed[0].attempts, failed[0].last_error.as_deref()),
        (1, Some("boom"))
    );
    let st = read(&*e, |t| t.pending_stats()).unwrap();
    assert_eq!((st.pending, st.failing), (1, 1));
    assert!(st.last_seq >= s2);
    assert_eq!(read(&*e, |t| t.pending_last_seq()).unwrap(), st.last_seq);
    txn(&*e, |t| t.finish_pending(b"x", rows[0].gen)).unwrap();
    assert_eq!(
        read(&*e, |t| t.pending_last_seq()).unwrap(),
        st.last_seq,
        "the newest mark's number outlives its row"
    );
    assert!(!read(&*e, |t| t.pending_upto(s2)).unwrap());
}

/// Work found by reconciling a mark is marked under that mark's sequence number, so a
/// barrier taken after the first mark covers it: a new row takes the given number; a
/// live row keeps the older of its own and the given one; either way the row is marked
/// again (gen moves, recursive only grows).
pub(crate) fn remarks_keep_the_older_seq(f: &dyn Fixture) {
    let e = f.engine();
    let cause = txn(&*e, |t| t.mark_pending(b"d/f", false, 10)).unwrap();
    let barrier = txn(&*e, |t| t.mark_pending(b"other", false, 10)).unwrap();
    txn(&*e, |t| t.remark_pending(b"d", true, 10, cause)).unwrap();
    let row = |p: &[u8]| {
        read(&*e, |t| t.due_pending(i64::MAX, 100))
            .unwrap()
            .into_iter()
            .find(|r| r.path == p)
            .expect("row")
    };
    let d = row(b"d");
    assert_eq!(
        (d.seq, d.recursive),
        (cause, true),
        "a new row takes the cause's seq"
    );
    assert!(barrier > cause);
    txn(&*e, |t| t.finish_pending(b"d/f", 1)).unwrap();
    txn(&*e, |t| t.finish_pending(b"other", 1)).unwrap();
    assert!(
        read(&*e, |t| t.pending_upto(barrier)).unwrap(),
        "the barrier after the cause waits for the remark"
    );
    let later = txn(&*e, |t| t.mark_pending(b"late", false, 10)).unwrap();
    txn(&*e, |t| t.remark_pending(b"late", false, 10, cause)).unwrap();
    let l = row(b"late");
    assert_eq!(
        (l.seq, l.gen),
        (cause, 2),
        "a live row takes the older seq, marked again"
    );
    txn(&*e, |t| t.remark_pending(b"d", false, 10, later)).unwrap();
    let d2 = row(b"d");
    assert_eq!(
        (d2.seq, d2.recursive, d2.gen),
        (cause, true, d.gen + 1),
        "its own older seq kept"
    );
}

/// Announced puts (`kv` records by [`crate::upload_key`]): found by the prefix of a
/// directory at or under it, path and session read back, removed by `delete_kv`.
pub(crate) fn upload_announcements(f: &dyn Fixture) {
    let e = f.engine();
    txn(&*e, |t| {
        for (p, s) in [
            ("d", 1),
            ("d/a", 1),
            ("d/sub/b", 2),
            ("d.txt", 1),
            ("dd", 3),
        ] {
            t.set_kv(&crate::upload_key(p.as_bytes(), s), "")?;
        }
        Ok::<_, MetaError>(())
    })
    .unwrap();
    let under = |dir: &str| -> Vec<(String, u64)> {
        read(&*e, |t| {
            t.kv_with_prefix(&crate::uploads_at_or_under(dir.as_bytes()))
        })
        .unwrap()
        .into_iter()
        .filter_map(|(k, _)| crate::upload_of(&k))
        .filter(|(p, _)| {
            dir.is_empty() || p == dir.as_bytes() || p.starts_with(format!("{dir}/").as_bytes())
        })
        .map(|(p, s)| (String::from_utf8(p).unwrap(), s))
        .collect()
    };
    assert_eq!(
        under("d"),
        [
            ("d".to_string(), 1),
            ("d/a".to_string(), 1),
            ("d/sub/b".to_string(), 2)
        ]
    );
    assert_eq!(under("").len(), 5);
    assert_eq!(under("d/sub"), [("d/sub/b".to_string(), 2)]);
    txn(&*e, |t| t.delete_kv(&crate::upload_key(b"d/a", 1))).unwrap();
    txn(&*e, |t| t.delete_kv(&crate::upload_key(b"never", 1))).unwrap();
    assert_eq!(under("d").len(), 2);
    assert_eq!(crate::upload_of("upload.zz.1"), None);
    assert_eq!(crate::upload_of("held_opens.1"), None);
}

/// The pending rows of a directory's subtree marked up to a barrier (fsync of a
/// directory under bucket durability): the dir itself and paths under it, not a sibling
/// that shares its name as a prefix, not rows marked after the barrier.
pub(crate) fn pending_under_a_dir(f: &dyn Fixture) {
    let e = f.engine();
    let mut last = 0;
    for p in ["d", "d/a", "d/sub/b", "d.txt", "dd", "e"] {
        last = txn(&*e, |t| t.mark_pending(p.as_bytes(), false, 10)).unwrap();
    }
    let paths = |dir: &[u8], upto: u64| -> Vec<String> {
        read(&*e, |t| t.pending_under(dir, upto, 100))
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8(r.path).unwrap())
            .collect()
    };
    assert_eq!(paths(b"d", last), ["d", "d/a", "d/sub/b"]);
    assert_eq!(paths(b"d/sub", last), ["d/sub/b"]);
    assert_eq!(paths(b"", last).len(), 6, "the root covers everything");
    let later = txn(&*e, |t| t.mark_pending(b"d/new", false, 10)).unwrap();
    assert_eq!(
        paths(b"d", last),
        ["d", "d/a", "d/sub/b"],
        "marked after the barrier"
    );
    assert_eq!(paths(b"d", later).len(), 4);
    assert_eq!(paths(b"d", u64::MAX).len(), 4, "u64::MAX bounds nothing");
    assert!(read(&*e, |t| t.pending_upto(u64::MAX)).unwrap());
    assert_eq!(
        read(&*e, |t| t.pending_under(b"d", later, 2))
            .unwrap()
            .len(),
        2
    );
}

pub(crate) fn objects_subtree_range(f: &dyn Fixture) {
    let e = f.engine();
    txn(&*e, |t| {
        for (i, p) in ["a", "a/b", "a/b/c", "a.txt", "ab", "b"].iter().enumerate() {
            t.put_object(&ObjectRow {
                path: p.as_bytes().to_vec(),
                key: p.to_string(),
                ino: 2,
                kind: Kind::File,
                data_version: i as u64,
                meta_stamp: 0,
                etag: Some(format!("e-{p}")),
                size: 0,
            })?;
        }
        Ok::<_, MetaError>(())
    })
    .unwrap();
    let under: Vec<String> = read(&*e, |t| t.objects_under(b"a", 100))
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(under, vec!["a/b", "a/b/c"]);
    assert_eq!(read(&*e, |t| t.objects_under(b"", 100)).unwrap().len(), 6);
    let o = read(&*e, |t| t.object_with_content(2, 2)).unwrap().unwrap();
    assert_eq!(o.key, "a/b/c");
    let asked: Vec<Vec<u8>> = ["ab", "a/b", "nothing", "a/b"]
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    let mut got: Vec<String> = read(&*e, |t| t.get_objects(&asked))
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    got.sort();
    got.dedup();
    assert_eq!(got, vec!["a/b", "ab"]);
    assert!(read(&*e, |t| t.get_objects(&[])).unwrap().is_empty());
    txn(&*e, |t| t.delete_object(b"a/b/c")).unwrap();
    assert!(read(&*e, |t| t.get_object(b"a/b/c")).unwrap().is_none());
}

/// Object and pending rows keyed by paths up to `PATH_MAX` (4096 bytes, beyond a
/// PostgreSQL btree entry), sharing prefixes longer than any index prefix: stored, found,
/// ordered and removed exactly.
pub(crate) fn paths_up_to_path_max(f: &dyn Fixture) {
    let e = f.engine();
    // Letters from a linear congruential sequence: paths that do not compress.
    let mut seed = 12345u32;
    let mut letters = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                b'a' + ((seed >> 16) % 26) as u8
            })
            .collect()
    };
    let dir = letters(2500);
    let body = letters(4095 - dir.len() - 2);
    let path = |tail: &str| {
        let mut p = dir.clone();
        p.push(b'/');
        p.extend_from_slice(&body[..body.len() + 1 - tail.len()]);
        p.extend_from_slice(tail.as_bytes());
        p
    };
    let (p1, p2) = (path("b"), path("a"));
    assert_eq!(p1.len(), 4095);
    txn(&*e, |t| {
        for (i, p) in [&p1, &p2].into_iter().enumerate() {
            t.put_object(&ObjectRow {
                path: p.clone(),
                key: format!("k{i}"),
                ino: 3,
                kind: Kind::File,
                data_version: i as u64,
                meta_stamp: 0,
                etag: None,
                size: 0,
            })?;
            t.mark_pending(p, i == 1, 10)?;
        }
        Ok::<_, MetaError>(())
    })
    .unwrap();
    let keys: Vec<String> = read(&*e, |t| t.objects_under(&dir, 10))
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys, vec!["k1", "k0"], "ordered by the whole path");
    assert_eq!(read(&*e, |t| t.get_object(&p1)).unwrap().unwrap().key, "k0");
    let mut child = p2.clone();
    child.extend_from_slice(b"/c");
    assert!(
        read(&*e, |t| t.is_pending(&child)).unwrap(),
        "recursive mark"
    );
    let rows = read(&*e, |t| t.due_pending(100, 10)).unwrap();
    assert_eq!(rows.len(), 2);
    txn(&*e, |t| {
        for r in &rows {
            t.finish_pending(&r.path, r.gen)?;
        }
        t.delete_object(&p1)
    })
    .unwrap();
    assert!(!read(&*e, |t| t.is_pending(&p1)).unwrap());
    assert!(read(&*e, |t| t.get_object(&p1)).unwrap().is_none());
    assert!(read(&*e, |t| t.get_object(&p2)).unwrap().is_some());
}

pub(crate) fn change_feed(f: &dyn Fixture) {
    let a = f.engine();
    let sa = txn(&*a, |t| t.register_session("h", 1, 10)).unwrap();
    a.log_changes_as(sa).unwrap();
    // Alone: nothing is logged.
    let ino = create(&*a, ROOT_INO, "alone", Kind::File);
    let start = a.feed_start().unwrap();
    let (rows, _) = a.feed_read(FeedCursor::default(), 0, 100).unwrap();
    assert!(rows.is_empty(), "{rows:?}");

    let b = f.second();
    let sb = txn(&*b, |t| t.register_session("h", 2, 10)).unwrap();
    b.log_changes_as(sb).unwrap();
    // A's rename and size change are logged under A's session; B's create under B's.
    a.apply(&[
        Op::MoveDentry {
            parent: ROOT_INO,
            name: b"alone".to_vec(),
            ino,
            new_parent: ROOT_INO,
            new_name: b"moved".to_vec(),
        },
        Op::CommitContent {
            ino,
            size: 99,
            mtime_ns: 9,
            ctime_ns: 9,
            local: Local::At(7),
        },
    ])
    .unwrap();
    // A flag the kernel never sees: not logged.
    a.apply(&[Op::SetAttrs {
        ino,
        set: AttrUpdate {
            dirty: Some(false),
            ..Default::default()
        },
    }])
    .unwrap();
    create(&*b, ROOT_INO, "fromb", Kind::File);
    let mut for_b = Vec::new();
    let mut cur = start;
    for _ in 0..50 {
        let (rows, next) = b.feed_read(cur, sb, 100).unwrap();
        cur = next;
        for r in rows {
            if !for_b.contains(&r) {
                for_b.push(r);
            }
        }
        if for_b.len() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let names: Vec<_> = for_b.iter().map(|c| c.name.clone()).collect();
    assert!(names.contains(&Some(b"alone".to_vec())), "{for_b:?}");
    assert!(names.contains(&Some(b"moved".to_vec())), "{for_b:?}");
    assert!(names.contains(&None), "the size change: {for_b:?}");
    assert!(
        for_b.iter().all(|c| c.session == sa && c.ino == ino),
        "{for_b:?}"
    );
    let (for_a, _) = a.feed_read(start, sa, 100).unwrap();
    let fromb: Vec<_> = for_a
        .iter()
        .filter(|c| c.name.as_deref() == Some(&b"fromb"[..]))
        .collect();
    assert_eq!(fromb.len(), 1, "{for_a:?}");
    assert_eq!(fromb[0].parent, Some(ROOT_INO));
    assert!(for_a.iter().all(|c| c.session == sb));
    // Reading from the end gives nothing new.
    let (_, end) = a.feed_read(start, sa, 1000).unwrap();
    let (again, _) = a.feed_read(end, sa, 100).unwrap();
    assert!(again.iter().all(|c| for_a.contains(c)), "{again:?}");
    // Pruning by age.
    assert_eq!(txn(&*a, |t| t.prune_changes(0)).unwrap(), 0);
    assert!(txn(&*a, |t| t.prune_changes(i64::MAX)).unwrap() >= 4);
    // B (and any other mount the fixture made) gone: A logs nothing again.
    txn(&*a, |t| {
        for s in t.sessions()? {
            if s.id != sa {
                t.delete_session(s.id)?;
            }
        }
        Ok::<(), MetaError>(())
    })
    .unwrap();
    let after = a.feed_start().unwrap();
    create(&*a, ROOT_INO, "alone-again", Kind::File);
    let (rows, _) = a.feed_read(after, 0, 100).unwrap();
    assert!(rows.is_empty(), "{rows:?}");
}

pub(crate) fn sessions_locks_opens(f: &dyn Fixture) {
    let e = f.engine();
    let s1 = txn(&*e, |t| t.register_session("h1", 11, 10)).unwrap();
    let s2 = txn(&*e, |t| t.register_session("h2", 22, 10)).unwrap();
    assert_ne!(s1, s2);
    txn(&*e, |t| t.heartbeat(s1, 99)).unwrap();
    let now = read(&*e, |t| t.db_now_ns()).unwrap();
    let local = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!(
        (now - local).abs() < 60_000_000_000,
        "database clock within a minute"
    );
    let ss = read(&*e, |t| t.sessions()).unwrap();
    assert_eq!(ss.len(), 2);
    assert_eq!(ss.iter().find(|s| s.id == s1).unwrap().heartbeat_ns, 99);
    assert_eq!(ss.iter().find(|s| s.id == s2).unwrap().host, "h2");
    let lock = |session, owner, start, end, fh| LockRow {
        ino: 5,
        session,
        owner,
        write: true,
        start,
        end,
        pid: 7,
        fh,
    };
    txn(&*e, |t| {
        t.set_owner_locks(
            5,
            s1,
            1,
            &[lock(s1, 1, 0, 9, 100), lock(s1, 1, 20, 29, 101)],
        )?;
        t.set_owner_locks(5, s2, 2, &[lock(s2, 2, 40, u64::MAX, 200)])?;
        t.add_open(5, s2, 2)
    })
    .unwrap();
    let all = read(&*e, |t| t.locks_on(5)).unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all.iter().find(|l| l.session == s2).unwrap().end, u64::MAX);
    assert_eq!(read(&*e, |t| t.session_lock_count(s1)).unwrap(), 2);
    txn(&*e, |t| t.delete_fh_locks(5, s1, 1, 101)).unwrap();
    assert_eq!(read(&*e, |t| t.session_lock_count(s1)).unwrap(), 1);
    assert!(read(&*e, |t| t.open_elsewhere(5, s1)).unwrap());
    // A session's death takes its locks and open records.
    txn(&*e, |t| t.delete_session(s2)).unwrap();
    assert!(!read(&*e, |t| t.open_elsewhere(5, s1)).unwrap());
    assert_eq!(read(&*e, |t| t.locks_on(5)).unwrap().len(), 1);
    assert!(matches!(
        txn(&*e, |t| t.heartbeat(s2, 100)),
        Err(MetaError::NotFound(_))
    ));
    assert!(matches!(
        txn(&*e, |t| t.check_session(s2)),
        Err(MetaError::Fenced(id)) if id == s2
    ));
    txn(&*e, |t| t.check_session(s1)).unwrap();
    // Expiry honours the heartbeat cutoff, and takes the records along.
    txn(&*e, |t| t.add_open(9, s1, 1)).unwrap();
    let out = e
        .apply(&[Op::ExpireSession {
            id: s1,
            stale_before_ns: 50,
            hold_opens: None,
        }])
        .unwrap();
    assert_eq!(
        out,
        vec![OpOut::Purged(false)],
        "heartbeat 99 is not stale at 50"
    );
    let out = e
        .apply(&[Op::ExpireSession {
            id: s1,
            stale_before_ns: i64::MAX,
            hold_opens: None,
        }])
        .unwrap();
    assert_eq!(out, vec![OpOut::Purged(true)]);
    assert!(read(&*e, |t| t.sessions()).unwrap().is_empty());
    assert!(read(&*e, |t| t.locks_on(5)).unwrap().is_empty());
    assert!(!read(&*e, |t| t.open_elsewhere(9, 0)).unwrap());
}

/// A session expired for missing its lease (perhaps only paused) keeps its open-file
/// records, moved aside with a time record: the orphans it holds are not purged until the
/// records are released; one expired without a hold keeps nothing.
pub(crate) fn held_opens_of_expired_sessions(f: &dyn Fixture) {
    let e = f.engine();
    let s1 = txn(&*e, |t| t.register_session("h1", 11, 10)).unwrap();
    let s2 = txn(&*e, |t| t.register_session("h2", 12, 10)).unwrap();
    let x = create(&*e, ROOT_INO, "x", Kind::File);
    let unlink = |ino, name: &str| {
        vec![
            Op::DeleteDentry {
                parent: ROOT_INO,
                name: name.as_bytes().to_vec(),
                ino,
            },
            Op::AddNlink {
                ino,
                delta: -1,
                ctime_ns: 20,
            },
        ]
    };
    txn(&*e, |t| t.add_open(x, s1, 2)).unwrap();
    let held = crate::HeldOpens {
        since_ns: 30,
        pid: 11,
        host: "h1 with spaces".into(),
    };
    let out = e
        .apply(&[Op::ExpireSession {
            id: s1,
            stale_before_ns: i64::MAX,
            hold_opens: Some(held.clone()),
        }])
        .unwrap();
    assert_eq!(out, vec![OpOut::Purged(true)]);
    assert_eq!(
        read(&*e, |t| t.sessions()).unwrap().len(),
        1,
        "the session row goes"
    );
    // Still open for every other session, and recorded with its time.
    assert!(read(&*e, |t| t.open_elsewhere(x, s2)).unwrap());
    let recs = read(&*e, |t| t.kv_with_prefix(crate::HELD_OPENS_PREFIX)).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(crate::held_opens_session(&recs[0].0), Some(s1));
    assert_eq!(crate::HeldOpens::parse(&recs[0].1), Some(held));
    let mut ops = unlink(x, "x");
    ops.push(Op::Purge(x));
    let out = e.apply(&ops).unwrap();
    assert_eq!(
        out[2],
        OpOut::Purged(false),
        "held open by the expired session"
    );
    e.apply(&[Op::ReleaseHeldOpens(s1)]).unwrap();
    assert!(!read(&*e, |t| t.open_elsewhere(x, s2)).unwrap());
    assert!(read(&*e, |t| t.kv_with_prefix(crate::HELD_OPENS_PREFIX))
        .unwrap()
        .is_empty());
    assert_eq!(e.apply(&[Op::Purge(x)]).unwrap(), vec![OpOut::Purged(true)]);
    // Expired without a hold (its daemon is known gone): nothing is kept, no record.
    let y = create(&*e, ROOT_INO, "y", Kind::File);
    txn(&*e, |t| t.add_open(y, s2, 1)).unwrap();
    e.apply(&[Op::ExpireSession {
        id: s2,
        stale_before_ns: i64::MAX,
        hold_opens: None,
    }])
    .unwrap();
    let mut ops = unlink(y, "y");
    ops.push(Op::Purge(y));
    assert_eq!(e.apply(&ops).unwrap()[2], OpOut::Purged(true));
    assert!(read(&*e, |t| t.kv_with_prefix(crate::HELD_OPENS_PREFIX))
        .unwrap()
        .is_empty());
    // A held expiry of a session with nothing open writes no record.
    let s3 = txn(&*e, |t| t.register_session("h3", 13, 10)).unwrap();
    e.apply(&[Op::ExpireSession {
        id: s3,
        stale_before_ns: i64::MAX,
        hold_opens: Some(crate::HeldOpens {
            since_ns: 40,
            pid: 13,
            host: "h3".into(),
        }),
    }])
    .unwrap();
    assert!(read(&*e, |t| t.kv_with_prefix(crate::HELD_OPENS_PREFIX))
        .unwrap()
        .is_empty());
}

pub(crate) fn wanted_uploads(f: &dyn Fixture) {
    let e = f.engine();
    txn(&*e, |t| {
        t.want_upload(10, 7, 1)?;
        t.want_upload(11, 8, 2)?;
        t.want_upload(10, 7, 3)
    })
    .unwrap();
    assert_eq!(read(&*e, |t| t.wanted_for(7)).unwrap(), vec![10]);
    txn(&*e, |t| t.clear_wanted(10)).unwrap();
    assert!(read(&*e, |t| t.wanted_for(7)).unwrap().is_empty());
    assert_eq!(read(&*e, |t| t.wanted_for(8)).unwrap(), vec![11]);
}

pub(crate) fn concurrent_mounts(f: &dyn Fixture) {
    let engines = [f.engine(), f.second()];
    let d = create(&*engines[0], ROOT_INO, "d", Kind::Dir);
    let per = 50;
    std::thread::scope(|sc| {
        for (i, e) in engines.iter().enumerate() {
            for k in 0..2 {
                let e = e.clone();
                sc.spawn(move || {
                    for n in 0..per {
                        let name = format!("f-{i}-{k}-{n}");
                        create(&*e, d, &name, Kind::Dir);
                        // Everyone also races for one name: exactly one wins.
                        let ino = e.alloc_inos(1).unwrap().start;
                        let _ = e.apply(&[
                            Op::TouchDir {
                                ino: d,
                                nlink_delta: 0,
                                time_ns: 1,
                            },
                            Op::InsertInode(InodeRow {
                                ino,
                                ..row(Kind::File)
                            }),
                            Op::InsertDentry {
                                parent: d,
                                name: format!("race-{n}").into_bytes(),
                                ino,
                            },
                        ]);
                    }
                });
            }
        }
    });
    let dir = engines[1].get_inode(d).unwrap().unwrap();
    assert_eq!(
        dir.nlink as usize,
        2 + 4 * per,
        "every subdirectory counted once"
    );
    let list = read(&*engines[0], |t| t.list_dir(d, 0, 10_000)).unwrap();
    assert_eq!(list.len(), 4 * per + per);
}

pub(crate) fn usage_and_orphans(f: &dyn Fixture) {
    let e = f.engine();
    let x = create(&*e, ROOT_INO, "x", Kind::File);
    e.apply(&[Op::CommitContent {
        ino: x,
        size: 1000,
        mtime_ns: 1,
        ctime_ns: 1,
        local: Local::At(7),
    }])
    .unwrap();
    let u = read(&*e, |t| t.usage()).unwrap();
    assert_eq!(
        (u.inodes, u.bytes, u.dirty_inodes, u.dirty_bytes),
        (2, 1000, 1, 1000)
    );
    // The engine's own scan (statfs) counts every request answered before it, also one
    // still in a commit window.
    assert_eq!(e.usage().unwrap(), u);
    let w = create(&*e, ROOT_INO, "w", Kind::File);
    assert_eq!(
        e.usage().unwrap().inodes,
        3,
        "the create just answered is counted"
    );
    e.apply(&[
        Op::DeleteDentry {
            parent: ROOT_INO,
            name: b"w".to_vec(),
            ino: w,
        },
        Op::DeleteInode(w),
    ])
    .unwrap();
    assert_eq!(e.usage().unwrap(), u);
    assert_eq!(read(&*e, |t| t.dirty_inodes()).unwrap().len(), 1);
    // The caches holding dirty content, found without reading the rows.
    let y = create(&*e, ROOT_INO, "y", Kind::File);
    let z = create(&*e, ROOT_INO, "z", Kind::File);
    for (ino, cache) in [(y, 3), (z, 3)] {
        e.apply(&[Op::CommitContent {
            ino,
            size: 1,
            mtime_ns: 1,
            ctime_ns: 1,
            local: Local::At(cache),
        }])
        .unwrap();
    }
    assert_eq!(read(&*e, |t| t.dirty_caches()).unwrap(), vec![3, 7]);
    assert_eq!(read(&*e, |t| t.dirty_in_cache(3)).unwrap(), 2);
    assert_eq!(read(&*e, |t| t.dirty_in_cache(7)).unwrap(), 1);
    assert_eq!(read(&*e, |t| t.dirty_in_cache(8)).unwrap(), 0);
    txn(&*e, |t| t.set_nlink(x, 0)).unwrap();
    assert_eq!(read(&*e, |t| t.orphan_inodes()).unwrap(), vec![x]);
    txn(&*e, |t| t.set_kv("a", "1")).unwrap();
    txn(&*e, |t| t.set_kv("a", "2")).unwrap();
    assert_eq!(read(&*e, |t| t.get_kv("a")).unwrap().as_deref(), Some("2"));
}

pub(crate) fn keyed_transactions_serialise(f: &dyn Fixture) {
    // Read-decide-write under one key from two connections at once: no update is lost
    // (the byte-range lock code relies on this to never grant two conflicting locks).
    let engines = [f.engine(), f.second()];
    txn(&*engines[0], |t| t.set_kv("counter", "0")).unwrap();
    let per = 60;
    std::thread::scope(|sc| {
        for e in &engines {
            for _ in 0..2 {
                let e = e.clone();
                sc.spawn(move || {
                    for _ in 0..per {
                        crate::txn_keyed(&*e, 42, |t| {
                            let n: u64 = t
                                .get_kv("counter")?
                                .and_then(|v| v.parse().ok())
                                .unwrap_or(0);
                            t.set_kv("counter", &(n + 1).to_string())
                        })
                        .unwrap();
                    }
                });
            }
        }
    });
    let n = read(&*engines[0], |t| t.get_kv("counter")).unwrap();
    assert_eq!(n.as_deref(), Some((4 * per).to_string().as_str()));
}
