use std::sync::Arc;

use super::*;
use crate::suite::{engine_suite, Fixture};
use crate::{read, txn, Local};

/// A fresh SQLite database in a temp dir; `windowed`: its engine owns commit windows, as
/// the mount daemon's does, and `second()` is another mount, which registers its session —
/// what closes the first one's windows, as between real mounts.
struct SqliteFixture {
    dir: tempfile::TempDir,
    engine: Arc<SqliteEngine>,
    windowed: bool,
}

impl Fixture for SqliteFixture {
    fn engine(&self) -> Arc<dyn MetaEngine> {
        self.engine.clone()
    }
    fn second(&self) -> Arc<dyn MetaEngine> {
        let e = SqliteEngine::open(&self.dir.path().join("m.db")).unwrap();
        if self.windowed {
            assert!(!e.enable_commit_window(WindowConfig::default()).unwrap());
            let s = crate::txn(&e, |t| t.register_session("second", 2, 1)).unwrap();
            e.log_changes_as(s).unwrap();
        }
        Arc::new(e)
    }
}

fn fixture_with(windowed: bool) -> Option<Box<dyn Fixture>> {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(SqliteEngine::create(&dir.path().join("m.db"), 0, 0, 5).unwrap());
    if windowed {
        assert!(engine
            .enable_commit_window(WindowConfig::default())
            .unwrap());
    }
    Some(Box::new(SqliteFixture {
        dir,
        engine,
        windowed,
    }))
}

fn fixture() -> Option<Box<dyn Fixture>> {
    fixture_with(false)
}

engine_suite!(fixture());

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
        local: Local::At(1),
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
fn schema_1_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.db");
    let e = SqliteEngine::create(&p, 0, 0, 5).unwrap();
    let ino = crate::txn(&e, |t| {
        let i = t.insert_inode(&file_row())?;
        t.insert_dentry(ROOT_INO, b"old", i)?;
        Ok::<_, MetaError>(i)
    })
    .unwrap();
    drop(e);
    // Make it look like a schema-1 database: no counter, no upload requests.
    let c = Connection::open(&p).unwrap();
    c.execute_batch(
        "DELETE FROM kv WHERE key='next_ino'; DROP TABLE wanted; PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(c);
    let e = SqliteEngine::open(&p).unwrap();
    let fresh = e.alloc_inos(1).unwrap().start;
    assert!(
        fresh > ino,
        "numbers continue after the highest one: {fresh} > {ino}"
    );
    crate::txn(&e, |t| t.want_upload(ino, 1, 1)).unwrap();
    let v: i64 = e
        .lock()
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    assert_eq!(e.get_inode(ino).unwrap().unwrap().local, Local::At(1));
}

#[test]
fn a_readdir_page_is_an_index_range_also_on_an_older_database() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.db");
    let e = SqliteEngine::create(&p, 0, 0, 5).unwrap();
    drop(e);
    // A database made before the index existed: opening it adds the index.
    let c = Connection::open(&p).unwrap();
    c.execute_batch("DROP INDEX dentries_parent_cookie;")
        .unwrap();
    drop(c);
    let e = SqliteEngine::open(&p).unwrap();
    let conn = e.lock().unwrap();
    let plan = query_plan(&conn, super::txn::LIST_DIR_SQL, params![1i64, 0i64, 100i64]);
    assert!(
        plan.contains("dentries_parent_cookie") && !plan.contains("TEMP B-TREE"),
        "a readdir page sorts the whole directory: {plan}"
    );
}

#[test]
fn the_caches_holding_dirty_files_are_found_by_index_seeks_also_on_an_older_database() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.db");
    drop(SqliteEngine::create(&p, 0, 0, 5).unwrap());
    // A database made before the index existed (it had one on `dirty` alone).
    let c = Connection::open(&p).unwrap();
    c.execute_batch(
        "DROP INDEX inodes_dirty_local; CREATE INDEX inodes_dirty ON inodes(dirty) WHERE dirty = 1;",
    )
    .unwrap();
    drop(c);
    let e = SqliteEngine::open(&p).unwrap();
    let conn = e.lock().unwrap();
    let indexes: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='inodes' ORDER BY name",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<std::result::Result<_, _>>()
        .unwrap();
    assert!(
        indexes.contains(&"inodes_dirty_local".to_string()),
        "{indexes:?}"
    );
    assert!(
        !indexes.contains(&"inodes_dirty".to_string()),
        "the old index is dropped (one index per dirty row, not two): {indexes:?}"
    );
    let plan = query_plan(&conn, super::txn::DIRTY_CACHES_SQL, []);
    assert!(
        plan.contains("SEARCH inodes USING COVERING INDEX inodes_dirty_local")
            && !plan.contains("SCAN inodes"),
        "finding the dirty caches reads the dirty rows: {plan}"
    );
}

#[test]
fn new_databases_use_small_pages_and_old_ones_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.db");
    drop(SqliteEngine::create(&p, 0, 0, 5).unwrap());
    let size = |p: &std::path::Path| -> i64 {
        Connection::open(p)
            .unwrap()
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(size(&p), i64::from(super::PAGE_SIZE));
    // A database made with 4 KiB pages (before) opens and keeps them.
    let old = dir.path().join("old.db");
    drop(SqliteEngine::create(&old, 0, 0, 5).unwrap());
    let c = Connection::open(&old).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=DELETE; PRAGMA page_size=4096; VACUUM; PRAGMA journal_mode=WAL;",
    )
    .unwrap();
    drop(c);
    assert_eq!(size(&old), 4096);
    let e = SqliteEngine::open(&old).unwrap();
    e.apply(&[]).unwrap();
    drop(e);
    assert_eq!(size(&old), 4096);
}

/// SQLite's plan for `sql` with `params`, its steps joined by "; ".
fn query_plan(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> String {
    let steps: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(params, |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<std::result::Result<_, _>>()
        .unwrap();
    steps.join("; ")
}

/// The whole engine suite again with commit windows on (as the daemon runs SQLite).
mod windowed {
    use super::*;

    engine_suite!(fixture_with(true));
}

/// Every row of every table the namespace and the uploader keep (not the redo mark).
fn dump(conn: &rusqlite::Connection) -> Vec<String> {
    let mut out = Vec::new();
    for (table, order) in [
        ("inodes", "ino"),
        ("dentries", "cookie"),
        ("xattrs", "ino, name"),
        ("objects", "path"),
        ("pending", "path"),
        ("kv", "key"),
        ("sessions", "id"),
        ("open_files", "ino, session"),
        ("wanted", "ino"),
        ("backup_log", "seq"),
        ("changes", "seq"),
        ("sqlite_sequence", "name"),
    ] {
        let mut st = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
            .unwrap();
        let n = st.column_count();
        let rows = st
            .query_map([], |r| {
                let mut s = format!("{table}:");
                for i in 0..n {
                    let v: rusqlite::types::Value = r.get(i)?;
                    s.push_str(&format!(" {v:?}"));
                }
                Ok(s)
            })
            .unwrap();
        for r in rows {
            let r = r.unwrap();
            if !r.starts_with("kv: Text(\"redo_seq\")") {
                out.push(r);
            }
        }
    }
    out
}

/// A request mix like a day of `tar`, `git` and an uploader: creates, attribute and
/// content commits, renames, unlinks, xattrs, pending marks and their completion.
fn random_request(e: &SqliteEngine, rng: &mut u64, live: &mut Vec<(Vec<u8>, Ino)>, n: usize) {
    use crate::ops::AttrUpdate;
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let pick = next() % 10;
    let t = 100 + n as i64;
    if live.is_empty() || pick < 3 {
        let ino = e.alloc_inos(1).unwrap().start;
        let name = format!("f{n}").into_bytes();
        let mut row = file_row();
        row.ino = ino;
        e.apply(&[
            Op::TouchDir {
                ino: ROOT_INO,
                nlink_delta: 0,
                time_ns: t,
            },
            Op::InsertInode(row),
            Op::InsertDentry {
                parent: ROOT_INO,
                name: name.clone(),
                ino,
            },
            Op::MarkPath {
                parent: ROOT_INO,
                name: name.clone(),
                recursive: false,
                not_before_ns: t,
            },
        ])
        .unwrap();
        live.push((name, ino));
        return;
    }
    let i = (next() % live.len() as u64) as usize;
    let (name, ino) = live[i].clone();
    match pick {
        3 => {
            e.apply(&[
                Op::SetAttrs {
                    ino,
                    set: AttrUpdate {
                        mtime_ns: Some(t),
                        perm: Some(0o600),
                        ..Default::default()
                    },
                },
                Op::MarkInode {
                    ino,
                    not_before_ns: t,
                },
            ])
            .unwrap();
        }
        4 => {
            e.apply(&[
                Op::CommitContent {
                    ino,
                    size: n as u64,
                    mtime_ns: t,
                    ctime_ns: t,
                    local: Local::At(1),
                },
                Op::MarkInode {
                    ino,
                    not_before_ns: t,
                },
            ])
            .unwrap();
        }
        5 => {
            let new_name = format!("r{n}").into_bytes();
            e.apply(&[
                Op::MoveDentry {
                    parent: ROOT_INO,
                    name: name.clone(),
                    ino,
                    new_parent: ROOT_INO,
                    new_name: new_name.clone(),
                },
                Op::MarkPath {
                    parent: ROOT_INO,
                    name: new_name.clone(),
                    recursive: false,
                    not_before_ns: t,
                },
            ])
            .unwrap();
            live[i].0 = new_name;
        }
        6 => {
            e.apply(&[
                Op::DeleteDentry {
                    parent: ROOT_INO,
                    name: name.clone(),
                    ino,
                },
                Op::AddNlink {
                    ino,
                    delta: -1,
                    ctime_ns: t,
                },
                Op::Purge(ino),
                Op::TouchDir {
                    ino: ROOT_INO,
                    nlink_delta: 0,
                    time_ns: t,
                },
            ])
            .unwrap();
            live.swap_remove(i);
        }
        7 => {
            e.apply(&[Op::SetXattr {
                ino,
                name: b"user.k".to_vec(),
                value: vec![n as u8; 40],
                mode: crate::XattrMode::Any,
            }])
            .unwrap();
        }
        8 => {
            // A request that fails its expectation: nothing of it may reach the log.
            let r = e.apply(&[
                Op::SetAttrs {
                    ino,
                    set: AttrUpdate {
                        mtime_ns: Some(t),
                        ..Default::default()
                    },
                },
                Op::InsertDentry {
                    parent: ROOT_INO,
                    name: name.clone(),
                    ino,
                },
            ]);
            assert!(matches!(r, Err(MetaError::Precondition { .. })), "{r:?}");
        }
        _ => {
            // The uploader: finish what is due.
            let due = crate::read(e, |t| t.due_pending(i64::MAX, 3)).unwrap();
            crate::txn(e, |t| {
                for p in &due {
                    t.finish_pending(&p.path, p.gen)?;
                }
                Ok::<(), MetaError>(())
            })
            .unwrap();
        }
    }
}

/// Copies the files a `kill -9` would leave (the database, its WAL and the redo log as the
/// page cache holds them; not the `-shm` index, which SQLite rebuilds).
fn crash_copy(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for suffix in ["", "-wal", "-redo"] {
        let src = PathBuf::from(format!("{}{suffix}", from.display()));
        if src.exists() {
            std::fs::copy(&src, to.join(format!("m.db{suffix}"))).unwrap();
        }
    }
}

/// A new database in `dir` whose engine owns commit windows of `span` / `max_requests`.
fn windowed_engine(
    dir: &std::path::Path,
    span: Duration,
    max_requests: u32,
) -> (PathBuf, SqliteEngine) {
    let db = dir.join("m.db");
    let e = SqliteEngine::create(&db, 0, 0, 5).unwrap();
    let config = WindowConfig { span, max_requests };
    assert!(e.enable_commit_window(config).unwrap());
    (db, e)
}

#[test]
fn a_crash_inside_a_commit_window_loses_no_acknowledged_request() {
    // At random points of a random workload, snapshot the files as kill -9 would leave
    // them and open the snapshot: the replayed database must equal, row for row (triggers'
    // marks, AUTOINCREMENT counters and all), what the live engine answered at that point.
    let dir = tempfile::tempdir().unwrap();
    let (db, e) = windowed_engine(dir.path(), Duration::from_secs(3600), 150);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut live = Vec::new();
    let mut checked = 0;
    for n in 0..900 {
        random_request(&e, &mut rng, &mut live, n);
        if n % 37 == 11 {
            let at = dir.path().join(format!("crash-{n}"));
            crash_copy(&db, &at);
            let expect = dump(&e.lock().unwrap());
            let copy = SqliteEngine::open(&at.join("m.db")).unwrap();
            let got = dump(&copy.lock().unwrap());
            assert_eq!(got.len(), expect.len(), "rows after a crash at request {n}");
            for (g, x) in got.iter().zip(&expect) {
                assert_eq!(g, x, "after a crash at request {n}");
            }
            checked += 1;
        }
    }
    let stats = e.window_stats().unwrap();
    assert!(stats.commits >= 5, "{stats:?}");
    assert!(checked >= 20);
    // The log held requests at most crash points (windows of up to 150 requests).
    let redo_bytes = stats.redo_bytes;
    drop(e);
    // A clean close commits the last window and empties the log.
    assert_eq!(
        std::fs::metadata(redo::path_for(&db)).unwrap().len(),
        0,
        "{redo_bytes}"
    );
}

#[test]
fn a_window_commits_within_its_span_and_before_another_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (db, e) = windowed_engine(dir.path(), Duration::from_millis(50), 1_000_000);
    let ino = txn(&e, |t| t.insert_inode(&file_row())).unwrap();
    assert_eq!(e.window_stats().unwrap().commits, 0);
    // Another process (here: connection) does not see the window until it commits…
    let other = rusqlite::Connection::open(&db).unwrap();
    let seen = |c: &rusqlite::Connection| -> i64 {
        c.query_row(
            "SELECT count(*) FROM inodes WHERE ino=?1",
            [ino as i64],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(seen(&other), 0, "an uncommitted window is visible outside");
    // …and its write waits for the commit thread (at most the span) instead of failing.
    other.busy_timeout(Duration::from_secs(5)).unwrap();
    other
        .execute("INSERT INTO kv(key,value) VALUES('x','y')", [])
        .unwrap();
    assert_eq!(seen(&other), 1);
    assert_eq!(e.window_stats().unwrap().commits, 1);
    // fsync's path commits at once.
    txn(&e, |t| t.set_kv("a", "b")).unwrap();
    e.make_durable().unwrap();
    assert_eq!(e.window_stats().unwrap().commits, 2);
}

#[test]
fn windows_stay_closed_while_another_session_is_registered() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let e = SqliteEngine::create(&db, 0, 0, 5).unwrap();
    assert!(e.enable_commit_window(WindowConfig::default()).unwrap());
    let me = txn(&e, |t| t.register_session("me", 1, 1)).unwrap();
    e.log_changes_as(me).unwrap();
    e.commit_window().unwrap();
    txn(&e, |t| t.set_kv("a", "1")).unwrap();
    assert_eq!(
        e.window_stats().unwrap().requests,
        2,
        "alone: requests go to windows"
    );
    let other = SqliteEngine::open(&db).unwrap();
    let s2 = txn(&other, |t| t.register_session("other", 2, 1)).unwrap();
    assert!(s2 > me);
    // The registration waited for the window's commit; from now on every request commits.
    let before = e.window_stats().unwrap();
    txn(&e, |t| t.set_kv("a", "2")).unwrap();
    assert_eq!(e.window_stats().unwrap().requests, before.requests);
    assert_eq!(
        read(&other, |t| t.get_kv("a")).unwrap().as_deref(),
        Some("2")
    );
}

#[test]
fn another_writer_gets_in_while_the_owner_writes_without_pause() {
    // Back-to-back windows hold SQLite's write lock nearly all the time; SQLite's busy
    // handler in the other engine sleeps up to 100 ms between tries and would almost
    // never land in a gap. The shared lock on `<db>-join` makes the owner leave gaps.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let owner = Arc::new(SqliteEngine::create(&db, 0, 0, 5).unwrap());
    assert!(owner.enable_commit_window(WindowConfig::default()).unwrap());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (owner, done) = (owner.clone(), done.clone());
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let mut n = 0u64;
            while !done.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(40) {
                txn(&*owner, |t| t.set_kv("busy", &n.to_string())).unwrap();
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let other = SqliteEngine::open(&db).unwrap();
    // Starved, it gets in only by luck (23 s in a run without the join lock) or fails
    // with SQLITE_BUSY after the 30 s busy timeout. The bound is the guarantee (about one
    // 20 ms window), with a wide margin for a loaded machine — not a speed figure.
    let asked = std::time::Instant::now();
    txn(&other, |t| t.set_kv("other", "in")).unwrap();
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "another writer waited {waited:?}"
    );
    done.store(true, Ordering::Relaxed);
    let n = writer.join().unwrap();
    assert!(n > 0);
    assert_eq!(
        read(&*owner, |t| t.get_kv("other")).unwrap().as_deref(),
        Some("in")
    );
}

#[test]
fn an_engine_open_before_the_owner_died_replays_its_log_before_writing() {
    // A tool opened while the mount was alive; the mount is killed with records only in
    // its redo log; the tool's next write must not land on a state missing them.
    let dir = tempfile::tempdir().unwrap();
    let (db, e) = windowed_engine(dir.path(), Duration::from_secs(3600), 1_000_000);
    let ino = txn(&e, |t| t.insert_inode(&file_row())).unwrap();
    txn(&e, |t| t.insert_dentry(ROOT_INO, b"acked", ino)).unwrap();
    // The state kill -9 leaves, taken apart: the database and WAL first (the tool opens
    // them while the owner lives), the redo log appears as the owner dies.
    let at = dir.path().join("crash");
    crash_copy(&db, &at);
    let redo_copy = at.join("m.db-redo");
    let redo_bytes = std::fs::read(&redo_copy).unwrap();
    assert!(!redo_bytes.is_empty());
    std::fs::remove_file(&redo_copy).unwrap();
    let tool = SqliteEngine::open(&at.join("m.db")).unwrap();
    assert!(read(&tool, |t| t.lookup(ROOT_INO, b"acked"))
        .unwrap()
        .is_none());
    std::fs::write(&redo_copy, &redo_bytes).unwrap();
    txn(&tool, |t| t.set_kv("tool", "wrote")).unwrap();
    let found = read(&tool, |t| t.lookup(ROOT_INO, b"acked")).unwrap();
    assert_eq!(
        found.map(|d| d.ino),
        Some(ino),
        "the dead owner's request was not replayed"
    );
    assert_eq!(std::fs::metadata(&redo_copy).unwrap().len(), 0);
    assert_eq!(tool.counters().replayed, 2);
}

#[test]
fn a_redo_log_that_does_not_continue_the_database_is_set_aside() {
    // kill -9 leaves a redo log; the operator then restores meta.db from an older copy.
    // The log's records were made on a later state: replaying them would diverge.
    let dir = tempfile::tempdir().unwrap();
    let (db, e) = windowed_engine(dir.path(), Duration::from_secs(3600), 1_000_000);
    let older = dir.path().join("older.db");
    e.backup_to(&older).unwrap(); // commits the (empty) window: redo_seq 0
    let ino = txn(&e, |t| t.insert_inode(&file_row())).unwrap();
    e.commit_window().unwrap(); // redo_seq 1
    txn(&e, |t| t.insert_dentry(ROOT_INO, b"late", ino)).unwrap(); // record 2, log only
    let at = dir.path().join("crash");
    crash_copy(&db, &at);
    std::fs::copy(&older, at.join("m.db")).unwrap();
    let _ = std::fs::remove_file(at.join("m.db-wal"));
    let restored = SqliteEngine::open(&at.join("m.db")).unwrap();
    assert!(read(&restored, |t| t.lookup(ROOT_INO, b"late"))
        .unwrap()
        .is_none());
    assert!(
        at.join("m.db-redo.unmatched").exists(),
        "the log was not kept aside"
    );
    assert_eq!(std::fs::metadata(at.join("m.db-redo")).unwrap().len(), 0);
    // The same log on the database it continues is replayed.
    let live = dir.path().join("live");
    crash_copy(&db, &live);
    let reopened = SqliteEngine::open(&live.join("m.db")).unwrap();
    assert!(read(&reopened, |t| t.lookup(ROOT_INO, b"late"))
        .unwrap()
        .is_some());
    // A new database never meets a leftover log.
    drop(restored);
    std::fs::write(
        at.join("m.db-redo"),
        std::fs::read(db.with_extension("db-redo")).unwrap(),
    )
    .unwrap();
    std::fs::remove_file(at.join("m.db")).unwrap();
    SqliteEngine::create(&at.join("m.db"), 0, 0, 5).unwrap();
    assert!(!at.join("m.db-redo").exists());
}

#[test]
fn a_batch_record_that_does_not_apply_on_its_state_stops_the_replay() {
    // A namespace request's redo record is its batch, replayed on the state it was
    // recorded on: it applies whole. One that does not (its name taken meanwhile) means
    // the log is not this database's: opening refuses instead of skipping a step.
    let dir = tempfile::tempdir().unwrap();
    let (db, e) = windowed_engine(dir.path(), Duration::from_secs(3600), 1_000_000);
    let ino = e.alloc_inos(1).unwrap().start;
    let mut row = file_row();
    row.ino = ino;
    e.apply(&[
        Op::InsertInode(row),
        Op::InsertDentry {
            parent: ROOT_INO,
            name: b"a".to_vec(),
            ino,
        },
    ])
    .unwrap();
    let good = dir.path().join("good");
    crash_copy(&db, &good);
    let replayed = SqliteEngine::open(&good.join("m.db")).unwrap();
    assert_eq!(
        read(&replayed, |t| t.lookup(ROOT_INO, b"a"))
            .unwrap()
            .map(|r| r.ino),
        Some(ino)
    );
    let bad = dir.path().join("bad");
    crash_copy(&db, &bad);
    rusqlite::Connection::open(bad.join("m.db"))
        .unwrap()
        .execute(
            "INSERT INTO dentries(parent,name,ino) VALUES(1, CAST('a' AS BLOB), 1)",
            [],
        )
        .unwrap();
    match SqliteEngine::open(&bad.join("m.db")) {
        Err(MetaError::Corrupt { detail, .. }) => {
            assert!(detail.contains("does not apply"), "{detail}")
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a batch that does not apply was skipped"),
    }
}

/// What a file holds after a power cut: its content as of its last device flush, or
/// everything written since (each unflushed write may or may not have reached the disk).
#[derive(Clone, Copy, Debug)]
enum AfterCut {
    LastFlush,
    Written,
}

/// Builds in `to` the files a power cut could leave: the database file as written (it
/// changes only at checkpoints, which flush the WAL first; none run in these tests), the
/// WAL and the redo log each as `wal` / `log` say (a file never flushed is empty at
/// `LastFlush`).
fn power_cut_copy(db: &std::path::Path, to: &std::path::Path, wal: AfterCut, log: AfterCut) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(db, to.join("m.db")).unwrap();
    for (suffix, state) in [("-wal", wal), ("-redo", log)] {
        let src = PathBuf::from(format!("{}{suffix}", db.display()));
        let bytes = match state {
            AfterCut::LastFlush => flush::durable_image(&src).unwrap_or_default(),
            AfterCut::Written => std::fs::read(&src).unwrap_or_default(),
        };
        let dest = to.join(format!("m.db{suffix}"));
        std::fs::write(&dest, bytes).unwrap();
        // What survived the cut is on the disk.
        flush::sync_data(&std::fs::File::open(&dest).unwrap(), &dest).unwrap();
    }
}

#[test]
fn a_redo_log_flush_with_nothing_appended_since_the_last_one_touches_no_device() {
    // SQLite's rollback journal: `fsync` of the new journal, then `fsync` of its
    // directory with no request in between. The second flush of the log is covered by the
    // first; one with a record appended since is not, and what it covered survives a cut.
    let dir = tempfile::tempdir().unwrap();
    let (db, e) = windowed_engine(dir.path(), Duration::from_secs(3600), 1_000_000);
    let stats = |e: &SqliteEngine| {
        let s = e.window_stats().unwrap();
        (s.redo_flushes, s.redo_flushes_covered)
    };
    e.make_durable().unwrap();
    txn(&e, |t| t.set_kv("a", "1")).unwrap();
    e.make_durable().unwrap();
    assert_eq!(
        stats(&e),
        (1, 0),
        "the first flush of the log touches the device"
    );
    e.make_durable().unwrap();
    assert_eq!(stats(&e), (2, 1), "nothing appended since: covered");
    txn(&e, |t| t.set_kv("b", "2")).unwrap();
    e.make_durable().unwrap();
    assert_eq!(stats(&e), (3, 1), "a record appended since: flushed");
    let at = dir.path().join("cut");
    power_cut_copy(&db, &at, AfterCut::LastFlush, AfterCut::LastFlush);
    let copy = SqliteEngine::open(&at.join("m.db")).unwrap();
    assert_eq!(
        read(&copy, |t| t.get_kv("b")).unwrap().as_deref(),
        Some("2")
    );
    // The window's commit empties the log: the next window's first flush is its own.
    e.commit_window().unwrap();
    txn(&e, |t| t.set_kv("c", "3")).unwrap();
    e.make_durable().unwrap();
    assert_eq!(
        stats(&e).1,
        1,
        "a new epoch of the log is not covered by the old one"
    );
    let at = dir.path().join("cut2");
    power_cut_copy(&db, &at, AfterCut::LastFlush, AfterCut::LastFlush);
    let copy = SqliteEngine::open(&at.join("m.db")).unwrap();
    assert_eq!(
        read(&copy, |t| t.get_kv("c")).unwrap().as_deref(),
        Some("3")
    );
}

#[test]
fn what_make_durable_returned_survives_a_power_cut() {
    // Design record 0011: inside a commit window on a durable base, `make_durable` flushes
    // the redo log instead of committing. After every step, each of the four states a
    // power cut may leave (WAL and log each as last flushed or as written) must hold
    // every key written before the last `make_durable` returned. Rule 1 (a window on an
    // unflushed commit commits and flushes the WAL) and rule 2 (a window whose log answered
    // an fsync flushes its commit before emptying the log) each fail here when dropped.
    let dir = tempfile::tempdir().unwrap();
    let (db, e) = windowed_engine(dir.path(), Duration::from_secs(3600), 1_000_000);
    let mut durable: Vec<(String, String)> = Vec::new();
    let mut written: Vec<(String, String)> = Vec::new();
    let mut cuts = 0;
    let mut check = |step: &str, durable: &[(String, String)]| {
        for wal in [AfterCut::LastFlush, AfterCut::Written] {
            for log in [AfterCut::LastFlush, AfterCut::Written] {
                cuts += 1;
                let at = dir.path().join(format!("cut-{cuts}"));
                power_cut_copy(&db, &at, wal, log);
                let copy = SqliteEngine::open(&at.join("m.db")).unwrap();
                // A second cut right after the reopening replayed the log and emptied it:
                // the replay's commit must have been flushed first.
                let again = dir.path().join(format!("cut-{cuts}-again"));
                power_cut_copy(
                    &at.join("m.db"),
                    &again,
                    AfterCut::LastFlush,
                    AfterCut::Written,
                );
                let copy2 = SqliteEngine::open(&again.join("m.db")).unwrap();
                for (k, v) in durable {
                    for (c, when) in [(&copy, "after"), (&copy2, "twice, right after")] {
                        assert_eq!(
                            read(c, |t| t.get_kv(k)).unwrap().as_deref(),
                            Some(v.as_str()),
                            "{k} {when} a power cut {step} (WAL {wal:?}, log {log:?})"
                        );
                    }
                }
            }
        }
    };
    let put = |k: &str, written: &mut Vec<(String, String)>| {
        txn(&e, |t| t.set_kv(k, &format!("v-{k}"))).unwrap();
        written.push((k.to_string(), format!("v-{k}")));
    };
    let flushes = |e: &SqliteEngine| e.window_stats().unwrap().redo_flushes;

    // The first flush knows nothing about earlier commits: it flushes the WAL.
    e.make_durable().unwrap();
    put("k1", &mut written);
    e.make_durable().unwrap();
    assert_eq!(
        flushes(&e),
        1,
        "a window on a flushed base answers from its log"
    );
    durable.clone_from(&written);
    check("after the log answered an fsync", &durable);
    put("k2", &mut written);
    e.make_durable().unwrap();
    assert_eq!(flushes(&e), 2);
    durable.clone_from(&written);
    check("after a second fsync of the same window", &durable);

    // Rule 2: the window's commit empties the log only after flushing the commit.
    e.commit_window().unwrap();
    check(
        "after the commit of a window whose log answered fsyncs",
        &durable,
    );

    // That flush covered the commit: the next window answers from its log too.
    put("k3", &mut written);
    e.make_durable().unwrap();
    assert_eq!(flushes(&e), 3);
    durable.clone_from(&written);
    check("in a window opened on a flushed commit", &durable);
    e.commit_window().unwrap();

    // Rule 1: a window opened on a commit nobody flushed (k4's window had no fsync) must
    // not answer from its log: after a cut, the log would not continue the database.
    put("k4", &mut written);
    e.commit_window().unwrap();
    put("k5", &mut written);
    e.make_durable().unwrap();
    assert_eq!(
        flushes(&e),
        3,
        "a window on an unflushed commit flushes the WAL"
    );
    durable.clone_from(&written);
    check(
        "after an fsync in a window opened on an unflushed commit",
        &durable,
    );

    // The same for a commit made by another connection (SQLite's data_version).
    {
        let other = rusqlite::Connection::open(&db).unwrap();
        other
            .execute("INSERT INTO kv(key,value) VALUES('other','v-other')", [])
            .unwrap();
    }
    written.push(("other".into(), "v-other".into()));
    put("k6", &mut written);
    e.make_durable().unwrap();
    assert_eq!(
        flushes(&e),
        3,
        "another connection's commit is not flushed yet"
    );
    durable.clone_from(&written);
    check(
        "after an fsync following another connection's commit",
        &durable,
    );

    // Nothing committed since the last flush: nothing to flush, and the next window's
    // fsync answers from its log again.
    e.make_durable().unwrap();
    put("k7", &mut written);
    e.make_durable().unwrap();
    assert_eq!(flushes(&e), 4);
    durable.clone_from(&written);
    check("at the end", &durable);
    assert_eq!(cuts, 28);
}

#[test]
fn open_records_at_zero_disappear() {
    // `AddOpen` reads the count back and deletes the row only when it reaches 0: one
    // statement for an open instead of two, and no row left for a file nobody holds.
    let dir = tempfile::tempdir().unwrap();
    let (_db, e) = windowed_engine(dir.path(), Duration::from_secs(3600), 1_000_000);
    let rows = |e: &SqliteEngine| -> Vec<(i64, i64)> {
        let c = e.lock().unwrap();
        let mut st = c
            .prepare("SELECT session, count FROM open_files ORDER BY session")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    };
    let open = |session: u64, delta: i64| {
        e.apply(&[Op::AddOpen {
            ino: 9,
            session,
            delta,
        }])
        .unwrap();
    };
    open(1, 1);
    open(1, 1);
    open(2, 1);
    assert_eq!(rows(&e), vec![(1, 2), (2, 1)]);
    open(1, -1);
    open(2, -1);
    assert_eq!(rows(&e), vec![(1, 1)]);
    open(1, -1);
    assert!(rows(&e).is_empty());
}

/// The usage scan of `statfs` and `deskfs status` (every inode: some 100 ms at 1,000,000)
/// runs on a connection of its own: the engine's connection, which every request of the
/// mount takes, is free while it scans. Before, it ran in a read transaction there and
/// every request waited for it.
#[test]
fn the_usage_scan_leaves_the_engine_connection_free() {
    let dir = tempfile::tempdir().unwrap();
    let e = Arc::new(SqliteEngine::create(&dir.path().join("m.db"), 0, 0, 5).unwrap());
    assert!(e.enable_commit_window(WindowConfig::default()).unwrap());
    let free = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (e2, f2) = (e.clone(), free.clone());
    super::txn::tests::DURING_USAGE.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            f2.store(e2.shared.conn.try_lock().is_ok(), Ordering::SeqCst);
        }))
    });
    let u = e.usage().unwrap();
    assert_eq!(u.inodes, 1, "the root");
    assert!(
        super::txn::tests::DURING_USAGE.with(|h| h.borrow().is_none()),
        "the scan ran"
    );
    assert!(
        free.load(Ordering::SeqCst),
        "the engine's connection was held during the scan"
    );
}
