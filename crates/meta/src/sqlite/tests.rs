use super::*;
use crate::{read, txn};

fn file_row() -> InodeRow {
    InodeRow {
        ino: 0,
        kind: Kind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        nlink: 1,
        size: 3,
        atime_ns: 1,
        mtime_ns: 2,
        ctime_ns: 3,
        btime_ns: 4,
        data_version: 1,
        target: None,
        local: Local::Full,
        dirty: true,
        listed_ns: 0,
    }
}

#[test]
fn create_open_and_refuse_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.db");
    let e = SqliteEngine::create(&p, 0, 0, 5).unwrap();
    drop(e);
    assert!(matches!(
        SqliteEngine::create(&p, 0, 0, 5),
        Err(MetaError::Conflict(_))
    ));
    SqliteEngine::open(&p).unwrap();

    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, b"this is not a database at all, not even close.....").unwrap();
    assert!(matches!(
        SqliteEngine::open(&junk),
        Err(MetaError::Corrupt { .. })
    ));

    let newer = dir.path().join("newer.db");
    drop(SqliteEngine::create(&newer, 0, 0, 5).unwrap());
    let c = Connection::open(&newer).unwrap();
    c.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(c);
    assert!(matches!(
        SqliteEngine::open(&newer),
        Err(MetaError::TooNew { found: 99, .. })
    ));
    assert!(matches!(
        SqliteEngine::open(&dir.path().join("missing.db")),
        Err(MetaError::NotFound(_))
    ));
}

#[test]
fn dentries_inodes_and_cookies() {
    let dir = tempfile::tempdir().unwrap();
    let e = SqliteEngine::create(&dir.path().join("m.db"), 0, 0, 5).unwrap();
    let ino = txn(&e, |t| {
        let ino = t.insert_inode(&file_row())?;
        t.insert_dentry(ROOT_INO, b"a", ino)?;
        Ok(ino)
    })
    .unwrap();
    assert!(ino > ROOT_INO);
    let dup = txn(&e, |t| t.insert_dentry(ROOT_INO, b"a", ino));
    assert!(matches!(dup, Err(MetaError::Conflict(_))));
    let c1 = read(&e, |t| Ok(t.lookup(ROOT_INO, b"a")?.unwrap().cookie)).unwrap();
    txn(&e, |t| t.move_dentry(ROOT_INO, b"a", ROOT_INO, b"b")).unwrap();
    let d = read(&e, |t| t.lookup(ROOT_INO, b"b")).unwrap().unwrap();
    assert_eq!(d.cookie, c1, "rename keeps the readdir cookie");
    let list = read(&e, |t| t.list_dir(ROOT_INO, 0, 10)).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].1.size, 3);
    // failed transaction rolls back
    let r = txn(&e, |t| {
        t.delete_dentry(ROOT_INO, b"b")?;
        Err::<(), _>(MetaError::Internal("boom".into()))
    });
    assert!(r.is_err());
    assert!(read(&e, |t| t.lookup(ROOT_INO, b"b")).unwrap().is_some());
    e.make_durable().unwrap();
}

#[test]
fn pending_gen_and_seq() {
    let dir = tempfile::tempdir().unwrap();
    let e = SqliteEngine::create(&dir.path().join("m.db"), 0, 0, 5).unwrap();
    let s1 = txn(&e, |t| t.mark_pending(b"x", false, 10)).unwrap();
    let rows = read(&e, |t| t.due_pending(100, 10)).unwrap();
    assert_eq!(rows.len(), 1);
    let g = rows[0].gen;
    let s2 = txn(&e, |t| t.mark_pending(b"x", true, 20)).unwrap();
    assert!(s2 > s1);
    // stale gen does not clear the re-marked row
    txn(&e, |t| t.finish_pending(b"x", g)).unwrap();
    let rows = read(&e, |t| t.due_pending(100, 10)).unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].recursive);
    assert_eq!(rows[0].seq, s1, "oldest seq kept for barriers");
    assert!(read(&e, |t| t.pending_upto(s1)).unwrap());
    txn(&e, |t| t.finish_pending(b"x", rows[0].gen)).unwrap();
    assert!(!read(&e, |t| t.pending_upto(s2)).unwrap());
}

#[test]
fn objects_subtree_range() {
    let dir = tempfile::tempdir().unwrap();
    let e = SqliteEngine::create(&dir.path().join("m.db"), 0, 0, 5).unwrap();
    txn(&e, |t| {
        for p in ["a", "a/b", "a/b/c", "a.txt", "ab", "b"] {
            t.put_object(&ObjectRow {
                path: p.as_bytes().to_vec(),
                key: p.into(),
                ino: 2,
                kind: Kind::File,
                data_version: 1,
                meta_stamp: 0,
                etag: None,
                size: 0,
            })?;
        }
        Ok(())
    })
    .unwrap();
    let under: Vec<String> = read(&e, |t| t.objects_under(b"a", 100))
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(under, vec!["a/b", "a/b/c"]);
    assert_eq!(read(&e, |t| t.objects_under(b"", 100)).unwrap().len(), 6);
}

#[test]
fn change_feed_logs_only_while_another_session_lives() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.db");
    let a = SqliteEngine::create(&p, 0, 0, 5).unwrap();
    let sa = txn(&a, |t| t.register_session("h", 1, 10)).unwrap();
    a.log_changes_as(sa).unwrap();
    // Alone: nothing is logged.
    let ino = txn(&a, |t| {
        let ino = t.insert_inode(&file_row())?;
        t.insert_dentry(ROOT_INO, b"alone", ino)?;
        Ok(ino)
    })
    .unwrap();
    assert_eq!(read(&a, |t| t.last_change()).unwrap(), 0);

    let b = SqliteEngine::open(&p).unwrap();
    let sb = txn(&b, |t| t.register_session("h", 2, 10)).unwrap();
    b.log_changes_as(sb).unwrap();
    // A's rename and size change are logged under A's session; B's create under B's.
    txn(&a, |t| {
        t.move_dentry(ROOT_INO, b"alone", ROOT_INO, b"moved")?;
        let mut r = t.get_inode(ino)?.unwrap();
        r.size = 99;
        t.update_inode(&r)?;
        // A flag the kernel never sees: not logged.
        r.dirty = false;
        t.update_inode(&r)
    })
    .unwrap();
    txn(&b, |t| {
        let i = t.insert_inode(&file_row())?;
        t.insert_dentry(ROOT_INO, b"fromb", i)
    })
    .unwrap();
    let for_b = read(&b, |t| t.changes_after(0, sb, 100)).unwrap();
    let names: Vec<_> = for_b.iter().map(|c| c.name.clone()).collect();
    assert_eq!(
        names,
        vec![Some(b"alone".to_vec()), Some(b"moved".to_vec()), None],
        "{for_b:?}"
    );
    assert!(for_b.iter().all(|c| c.session == sa && c.ino == ino));
    let for_a = read(&a, |t| t.changes_after(0, sa, 100)).unwrap();
    assert_eq!(for_a.len(), 1);
    assert_eq!(for_a[0].name.as_deref(), Some(&b"fromb"[..]));
    assert_eq!(for_a[0].parent, Some(ROOT_INO));
    let last = read(&a, |t| t.last_change()).unwrap();
    assert_eq!(
        read(&a, |t| t.changes_after(last, sa, 100)).unwrap(),
        vec![]
    );
    // Pruning by age.
    assert_eq!(txn(&a, |t| t.prune_changes(0)).unwrap(), 0);
    assert_eq!(txn(&a, |t| t.prune_changes(i64::MAX)).unwrap(), 4);
    // B gone: A logs nothing again.
    txn(&a, |t| t.delete_session(sb)).unwrap();
    txn(&a, |t| t.delete_dentry(ROOT_INO, b"fromb")).unwrap();
    assert_eq!(read(&a, |t| t.changes_after(0, 0, 100)).unwrap(), vec![]);
}
