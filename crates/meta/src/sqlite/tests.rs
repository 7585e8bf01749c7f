use std::sync::Arc;

use super::*;
use crate::suite::{engine_suite, Fixture};
use crate::Local;

/// A fresh SQLite database in a temp dir.
struct SqliteFixture {
    dir: tempfile::TempDir,
    engine: Arc<SqliteEngine>,
}

impl Fixture for SqliteFixture {
    fn engine(&self) -> Arc<dyn MetaEngine> {
        self.engine.clone()
    }
    fn second(&self) -> Arc<dyn MetaEngine> {
        Arc::new(SqliteEngine::open(&self.dir.path().join("m.db")).unwrap())
    }
}

fn fixture() -> Option<Box<dyn Fixture>> {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(SqliteEngine::create(&dir.path().join("m.db"), 0, 0, 5).unwrap());
    Some(Box::new(SqliteFixture { dir, engine }))
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
