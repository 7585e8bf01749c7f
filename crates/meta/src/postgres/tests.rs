//! The engine suite and PostgreSQL-specific tests, against the server named by
//! `DESKFS_TEST_PG_URL` (e.g. from `scripts/pg-server.sh start`). Each fixture works in a
//! fresh schema with a random name, dropped with the fixture. Without the variable the
//! tests are skipped (and fail under `DESKFS_TEST_STRICT=1`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::suite::{engine_suite, Fixture};
use crate::{read, txn, Expect, Kind, Local, ROOT_INO};

fn base_url() -> Option<String> {
    std::env::var("DESKFS_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

/// A schema name no other test uses.
fn fresh_schema() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "dk_t_{:x}_{}_{}",
        random_id() & 0xffff_ffff,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `base` with `extra` query parameters added.
fn with_params(base: &str, extra: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{extra}")
}

/// Runs SQL on a connection of its own (test setup and teardown), on a thread of its
/// own (callers may be inside a runtime).
fn admin(url: &str, sql: &str) {
    let spec = ConnSpec::parse(url, PgOptions::default()).unwrap();
    let sql = sql.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (client, conn) = spec.pg.connect(tokio_postgres::NoTls).await.unwrap();
            let task = tokio::spawn(conn);
            client.batch_execute(&sql).await.unwrap();
            drop(client);
            let _ = task.await;
        });
    })
    .join()
    .unwrap();
}

/// A fresh workspace in its own schema, dropped at the end.
struct PgFixture {
    url: String,
    base: String,
    schema: String,
    engine: Arc<PgEngine>,
}

impl PgFixture {
    fn new() -> Option<PgFixture> {
        let base = base_url()?;
        let schema = fresh_schema();
        let url = with_params(&base, &format!("schema={schema}"));
        let engine = Arc::new(PgEngine::create(&url, 0, 0, 5).unwrap());
        Some(PgFixture {
            url,
            base,
            schema,
            engine,
        })
    }
}

impl Drop for PgFixture {
    fn drop(&mut self) {
        admin(
            &self.base,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
        );
    }
}

impl Fixture for PgFixture {
    fn engine(&self) -> Arc<dyn MetaEngine> {
        self.engine.clone()
    }
    fn second(&self) -> Arc<dyn MetaEngine> {
        Arc::new(PgEngine::open(&self.url).unwrap())
    }
}

fn fixture() -> Option<Box<dyn Fixture>> {
    PgFixture::new().map(|f| Box::new(f) as Box<dyn Fixture>)
}

engine_suite!(fixture());

/// Where the test server is, from its URL (a TCP server, as `scripts/pg-server.sh` gives).
struct Server {
    user: String,
    password: String,
    host: String,
    port: u16,
    db: String,
}

impl Server {
    fn of(url: &str) -> Server {
        let spec = ConnSpec::parse(url, PgOptions::default()).unwrap();
        let user = spec.pg.get_user().unwrap().to_string();
        Server {
            password: String::from_utf8(spec.pg.get_password().unwrap_or_default().to_vec())
                .unwrap(),
            host: match &spec.pg.get_hosts()[0] {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                other => panic!("TCP test server expected, got {other:?}"),
            },
            port: spec.pg.get_ports().first().copied().unwrap_or(5432),
            db: spec.pg.get_dbname().unwrap_or(&user).to_string(),
            user,
        }
    }
}

/// The fixture for the tests below; `None` = skipped (a failure under strict mode).
fn pg(test: &str) -> Option<PgFixture> {
    let f = PgFixture::new();
    if f.is_none() {
        crate::suite::unavailable(test);
    }
    f
}

/// Registers a mount session for `host` (pid `pid`) on `e` and logs `e`'s changes under
/// it, as a mount does; returns the session id.
fn logging_session(e: &PgEngine, host: &str, pid: u32) -> u64 {
    let s = txn(e, |t| t.register_session(host, pid, 1)).unwrap();
    e.log_changes_as(s).unwrap();
    s
}

fn file_row(ino: Ino) -> InodeRow {
    InodeRow {
        ino,
        kind: Kind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        nlink: 1,
        size: 0,
        atime_ns: 1,
        mtime_ns: 1,
        ctime_ns: 1,
        btime_ns: 1,
        data_version: 1,
        target: None,
        local: Local::None,
        dirty: false,
        listed_ns: 0,
    }
}

fn dir_row(ino: Ino) -> InodeRow {
    InodeRow {
        kind: Kind::Dir,
        perm: 0o755,
        nlink: 2,
        ..file_row(ino)
    }
}

/// Creates `parent/name` in one batch; `Err` when a precondition failed.
fn create(e: &dyn MetaEngine, parent: Ino, name: &str, dir: bool) -> Result<Ino> {
    let ino = e.alloc_inos(1)?.start;
    e.apply(&[
        Op::TouchDir {
            ino: parent,
            nlink_delta: dir as i64,
            time_ns: 10,
        },
        Op::InsertInode(if dir { dir_row(ino) } else { file_row(ino) }),
        Op::InsertDentry {
            parent,
            name: name.into(),
            ino,
        },
    ])?;
    Ok(ino)
}

#[test]
fn create_open_errors() {
    let Some(f) = pg("create_open_errors") else {
        return;
    };
    // A second create on the same schema.
    assert!(matches!(
        PgEngine::create(&f.url, 0, 0, 5),
        Err(MetaError::Conflict(_))
    ));
    // No workspace in a schema that does not exist.
    let missing = with_params(&f.base, &format!("schema={}", fresh_schema()));
    let r = PgEngine::open(&missing);
    assert!(matches!(r, Err(MetaError::NotFound(_))), "{r:?}");
    // Something else in the schema.
    let other = fresh_schema();
    admin(
        &f.base,
        &format!("CREATE SCHEMA {other}; CREATE TABLE {other}.t(x int)"),
    );
    let r = PgEngine::open(&with_params(&f.base, &format!("schema={other}")));
    admin(&f.base, &format!("DROP SCHEMA {other} CASCADE"));
    assert!(matches!(r, Err(MetaError::Corrupt { .. })), "{r:?}");
    // A newer schema version.
    admin(
        &f.base,
        &format!(
            "UPDATE {}.kv SET value = '99' WHERE key = 'schema_version'",
            f.schema
        ),
    );
    let r = PgEngine::open(&f.url);
    assert!(
        matches!(r, Err(MetaError::TooNew { found: 99, .. })),
        "{r:?}"
    );
    admin(
        &f.base,
        &format!(
            "UPDATE {}.kv SET value = '1' WHERE key = 'schema_version'",
            f.schema
        ),
    );
    PgEngine::open(&f.url).unwrap();
    // Never a password in describe().
    let spec = ConnSpec::parse(&f.base, PgOptions::default()).unwrap();
    if let Some(pw) = spec.pg.get_password() {
        let pw = String::from_utf8_lossy(pw).to_string();
        assert!(
            !f.engine.describe().contains(&pw),
            "{}",
            f.engine.describe()
        );
    }
    assert!(f.engine.describe().contains(&f.schema));
}

#[test]
fn unreachable_errors_are_short_and_clear() {
    let Some(f) = pg("unreachable_errors_are_short_and_clear") else {
        return;
    };
    let Server {
        user,
        host,
        port,
        db,
        ..
    } = Server::of(&f.base);
    // Wrong password.
    let bad = format!(
        "postgres://{user}:wrong-{}@{host}:{port}/{db}?schema={}",
        random_id(),
        f.schema
    );
    match PgEngine::open(&bad) {
        Err(MetaError::Unreachable(m)) => {
            assert!(
                m.contains(&format!(
                    "password authentication failed for user \"{user}\""
                )),
                "{m}"
            );
            assert!(!m.contains('\n') && m.len() < 200, "{m}");
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    // Nothing listening.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let free_port = free.local_addr().unwrap().port();
    drop(free);
    let refused = format!("postgres://{user}:x@127.0.0.1:{free_port}/{db}");
    match PgEngine::open(&refused) {
        Err(MetaError::Unreachable(m)) => assert!(m.contains("connection refused"), "{m}"),
        other => panic!("expected Unreachable, got {other:?}"),
    }
    // A host that accepts and never answers: bounded by op_timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let hold = std::thread::spawn(move || {
        let conn = silent.accept();
        std::thread::sleep(Duration::from_secs(3));
        drop(conn);
    });
    let t0 = Instant::now();
    let r = PgEngine::open(&format!(
        "postgres://{user}:x@127.0.0.1:{silent_port}/{db}?op_timeout=1"
    ));
    assert!(
        matches!(&r, Err(MetaError::Unreachable(m)) if m.contains("timed out")),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    hold.join().unwrap();
    // TLS asked of a build without it.
    let r = PgEngine::open(&with_params(&f.url, "sslmode=require"));
    assert!(
        matches!(&r, Err(MetaError::Unreachable(m)) if m.contains("TLS")),
        "{r:?}"
    );
}

#[test]
fn one_round_trip_per_operation() {
    let Some(f) = pg("one_round_trip_per_operation") else {
        return;
    };
    let e = &*f.engine;
    create(e, ROOT_INO, "warm", false).unwrap();
    let rt = |e: &PgEngine| e.counters().round_trips;
    let ino = e.alloc_inos(1).unwrap().start;
    let before = rt(e);
    let out = e
        .apply(&[
            Op::TouchDir {
                ino: ROOT_INO,
                nlink_delta: 1,
                time_ns: 20,
            },
            Op::InsertInode(dir_row(ino)),
            Op::InsertDentry {
                parent: ROOT_INO,
                name: b"d".to_vec(),
                ino,
            },
            Op::ExpectEmpty(ino),
            Op::ExpectNotAncestor {
                dir: ino,
                of: ROOT_INO,
            },
            Op::MarkPath {
                parent: ROOT_INO,
                name: b"d".to_vec(),
                recursive: true,
                not_before_ns: 0,
            },
            Op::GetInode(ROOT_INO),
        ])
        .unwrap();
    assert_eq!(rt(e) - before, 1, "one batch, one round trip");
    assert_eq!(out[6].row().unwrap().nlink, 3);
    // A failed batch is one round trip too, and applies nothing.
    let before = rt(e);
    let r = e.apply(&[
        Op::TouchDir {
            ino: ROOT_INO,
            nlink_delta: 1,
            time_ns: 30,
        },
        Op::InsertDentry {
            parent: ROOT_INO,
            name: b"d".to_vec(),
            ino,
        },
    ]);
    assert!(
        matches!(
            r,
            Err(MetaError::Precondition {
                step: 1,
                what: Expect::NameFree
            })
        ),
        "{r:?}"
    );
    assert_eq!(rt(e) - before, 1);
    assert_eq!(e.get_inode(ROOT_INO).unwrap().unwrap().nlink, 3);
    // Direct reads: one each.
    let before = rt(e);
    e.get_inode(ino).unwrap();
    e.lookup(ROOT_INO, b"d").unwrap();
    assert_eq!(rt(e) - before, 2);
    // A read of one statement: one (BEGIN goes with it, ROLLBACK is not waited for).
    let before = rt(e);
    read(e, |t| t.get_inode(ino)).unwrap();
    assert_eq!(rt(e) - before, 1);
    // A write of two statements: two plus COMMIT.
    let before = rt(e);
    txn(e, |t| {
        t.set_kv("a", "1")?;
        t.set_kv("b", "2")
    })
    .unwrap();
    assert_eq!(rt(e) - before, 3);
    // A closure that sends nothing costs nothing.
    let before = rt(e);
    txn(e, |_| Ok::<_, MetaError>(())).unwrap();
    assert_eq!(rt(e) - before, 0);
}

#[test]
fn feed_never_skips_a_late_commit() {
    let Some(f) = pg("feed_never_skips_a_late_commit") else {
        return;
    };
    let a = f.engine.clone();
    let b = Arc::new(PgEngine::open(&f.url).unwrap());
    let follower = PgEngine::open(&f.url).unwrap();
    let sa = logging_session(&a, "a", 1);
    logging_session(&b, "b", 2);
    let start = follower.feed_start().unwrap();
    let cold_start = start; // also read later by an engine that never saw this cursor

    // A logs a change (a low sequence number) and keeps its transaction open...
    let (logged_tx, logged_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let a2 = a.clone();
    let holder = std::thread::spawn(move || {
        let ino = a2.alloc_inos(1).unwrap().start;
        let mut first = true;
        txn(&*a2, |t| {
            t.insert_dentry(ROOT_INO, b"late", ino)?;
            if first {
                first = false;
                logged_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            }
            Ok::<_, MetaError>(())
        })
        .unwrap();
    });
    logged_rx.recv().unwrap();
    // ...while B logs one with a higher number and commits first.
    let early = create(&*b, ROOT_INO, "early", false).unwrap();
    let (rows, cur) = follower.feed_read(start, 0, 100).unwrap();
    let names: Vec<_> = rows.iter().filter_map(|r| r.name.clone()).collect();
    assert!(names.contains(&b"early".to_vec()), "{rows:?}");
    assert!(!names.contains(&b"late".to_vec()), "{rows:?}");
    let early_seq = rows.iter().find(|r| r.ino == early).unwrap().seq;
    // Now A commits its older change.
    go_tx.send(()).unwrap();
    holder.join().unwrap();
    let (rows, cur2) = follower.feed_read(cur, 0, 100).unwrap();
    let late: Vec<_> = rows
        .iter()
        .filter(|r| r.name.as_deref() == Some(&b"late"[..]))
        .collect();
    assert_eq!(late.len(), 1, "the late commit is delivered: {rows:?}");
    assert!(late[0].seq < early_seq, "it had the lower number: {rows:?}");
    assert_eq!(late[0].session, sa);
    assert!(
        !rows
            .iter()
            .any(|r| r.name.as_deref() == Some(&b"early"[..])),
        "the cursor knows its snapshot: no repeats {rows:?}"
    );
    let (again, _) = follower.feed_read(cur2, 0, 100).unwrap();
    assert!(again.is_empty(), "{again:?}");
    // An engine that did not hand out the cursor still delivers everything (maybe twice).
    let cold = PgEngine::open(&f.url).unwrap();
    let (rows, _) = cold.feed_read(cold_start, 0, 100).unwrap();
    for n in [&b"late"[..], &b"early"[..]] {
        assert!(
            rows.iter().any(|r| r.name.as_deref() == Some(n)),
            "{rows:?}"
        );
    }
    let (rows, _) = cold.feed_read(cur, 0, 100).unwrap();
    assert!(
        rows.iter().any(|r| r.name.as_deref() == Some(&b"late"[..])),
        "{rows:?}"
    );
    // Paging with a small limit reaches everything in order.
    let mut seen = Vec::new();
    let mut c = cold_start;
    for _ in 0..20 {
        let (rows, next) = follower.feed_read(c, 0, 1).unwrap();
        if rows.is_empty() {
            break;
        }
        seen.extend(rows.into_iter().map(|r| r.seq));
        c = next;
    }
    seen.dedup();
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted);
    assert!(seen.len() >= 2, "{seen:?}");
}

#[test]
fn signals_reach_other_engines() {
    let Some(f) = pg("signals_reach_other_engines") else {
        return;
    };
    let a = f.engine.clone();
    let b = PgEngine::open(&f.url).unwrap();
    let rx = b.subscribe().expect("first subscriber");
    assert!(b.subscribe().is_none(), "one subscriber per engine");
    let own = a.subscribe().unwrap();
    let sent = [
        Signal::LockFreed(42),
        Signal::UploadWanted { ino: 7, cache: 9 },
        Signal::Uploaded(7),
        Signal::Sessions,
        Signal::Feed,
    ];
    for s in &sent {
        a.signal(s).unwrap();
    }
    for s in &sent {
        assert_eq!(rx.recv_timeout(Duration::from_secs(1)).unwrap(), *s);
    }
    // An engine does not hear itself.
    assert!(own.recv_timeout(Duration::from_millis(200)).is_err());
    // Commits that logged feed rows wake followers (debounced NOTIFY); a mount that is
    // alone logs nothing and wakes no one.
    logging_session(&a, "a", 1);
    create(&*a, ROOT_INO, "alone", false).unwrap();
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    logging_session(&b, "b", 2);
    create(&*a, ROOT_INO, "x", false).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(1)).unwrap(),
        Signal::Feed
    );
    // An interactive transaction too.
    txn(&*a, |t| t.delete_dentry(ROOT_INO, b"x")).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(1)).unwrap(),
        Signal::Feed
    );
    // A burst of commits: woken, with at most one notification per interval (about 10
    // for these 20 here; not asserted, it depends on the machine's speed).
    for k in 0..20 {
        create(&*a, ROOT_INO, &format!("burst{k}"), false).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let woken = rx.try_iter().count();
    assert!(woken >= 1, "no wake-up for 20 commits");
}

#[test]
fn listener_reconnects_and_asks_for_a_full_look() {
    let Some(f) = pg("listener_reconnects_and_asks_for_a_full_look") else {
        return;
    };
    let app = format!("dk_listen_{:x}", random_id());
    let b = PgEngine::open(&with_params(&f.url, &format!("application_name={app}"))).unwrap();
    let rx = b.subscribe().unwrap();
    admin(
        &f.base,
        &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}'"),
    );
    let got: Vec<Signal> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    assert_eq!(got, vec![Signal::Feed, Signal::Sessions]);
    f.engine.signal(&Signal::LockFreed(5)).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(2)).unwrap(),
        Signal::LockFreed(5)
    );
}

#[test]
fn killed_connections_are_replaced() {
    let Some(f) = pg("killed_connections_are_replaced") else {
        return;
    };
    let app = format!("dk_kill_{:x}", random_id());
    let e = PgEngine::open(&with_params(&f.url, &format!("application_name={app}"))).unwrap();
    let d = create(&e, ROOT_INO, "d", true).unwrap();
    let kill = || {
        admin(
            &f.base,
            &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}'"),
        )
    };
    kill();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(e.get_inode(d).unwrap().unwrap().kind, Kind::Dir);
    kill();
    std::thread::sleep(Duration::from_millis(100));
    create(&e, d, "f", false).unwrap();
    kill();
    std::thread::sleep(Duration::from_millis(100));
    assert!(read(&e, |t| t.has_children(d)).unwrap());
    kill();
    txn(&e, |t| t.set_kv("k", "v")).unwrap();
    // Killed without a pause: the next call may find out only when it uses the
    // connection; it still succeeds.
    kill();
    assert!(e.lookup(d, b"f").unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_inside_a_tokio_runtime() {
    let Some(f) = pg("works_inside_a_tokio_runtime") else {
        return;
    };
    let e = PgEngine::open(&f.url).unwrap();
    let d = create(&e, ROOT_INO, "d", true).unwrap();
    assert!(e.get_inode(d).unwrap().is_some());
    let n = txn(&e, |t| t.usage()).unwrap().inodes;
    assert_eq!(n, 2);
    // From a spawned task, too, and dropped inside the runtime.
    let e = Arc::new(e);
    let e2 = e.clone();
    tokio::spawn(async move { e2.lookup(ROOT_INO, b"d").unwrap().unwrap().ino })
        .await
        .map(|ino| assert_eq!(ino, d))
        .unwrap();
    drop(e);
}

#[tokio::test(flavor = "current_thread")]
async fn works_inside_a_current_thread_runtime() {
    let Some(f) = pg("works_inside_a_current_thread_runtime") else {
        return;
    };
    let e = PgEngine::open(&f.url).unwrap();
    create(&e, ROOT_INO, "x", false).unwrap();
    assert!(e.lookup(ROOT_INO, b"x").unwrap().is_some());
    drop(e);
}

/// rmdir racing a create inside the directory: never a removed directory with a child.
#[test]
fn rmdir_and_create_inside_do_not_both_win() {
    let Some(f) = pg("rmdir_and_create_inside_do_not_both_win") else {
        return;
    };
    let a = f.engine.clone();
    let b = Arc::new(PgEngine::open(&f.url).unwrap());
    for round in 0..30 {
        let name = format!("d{round}");
        let d = create(&*a, ROOT_INO, &name, true).unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let (a2, bar) = (a.clone(), barrier.clone());
        let rm = std::thread::spawn(move || {
            bar.wait();
            a2.apply(&[
                Op::TouchDir {
                    ino: ROOT_INO,
                    nlink_delta: -1,
                    time_ns: 1,
                },
                Op::DeleteDentry {
                    parent: ROOT_INO,
                    name: name.into_bytes(),
                    ino: d,
                },
                Op::ExpectEmpty(d),
                Op::DeleteInode(d),
            ])
            .is_ok()
        });
        barrier.wait();
        let made = create(&*b, d, "child", false).is_ok();
        let removed = rm.join().unwrap();
        assert!(
            made != removed,
            "round {round}: created {made}, removed {removed}"
        );
        let children = read(&*a, |t| t.list_dir(d, 0, 10)).unwrap().len();
        assert_eq!(children, made as usize);
        assert_eq!(a.get_inode(d).unwrap().is_some(), !removed);
    }
}

/// Two cross-directory renames that would form a loop: at most one succeeds.
#[test]
fn crossing_directory_renames_cannot_form_a_loop() {
    let Some(f) = pg("crossing_directory_renames_cannot_form_a_loop") else {
        return;
    };
    let a = f.engine.clone();
    let b = Arc::new(PgEngine::open(&f.url).unwrap());
    let rename = |e: &dyn MetaEngine, from: Ino, name: &str, dir: Ino, to: Ino| {
        e.apply(&[
            Op::TouchDir {
                ino: from,
                nlink_delta: -1,
                time_ns: 1,
            },
            Op::TouchDir {
                ino: to,
                nlink_delta: 1,
                time_ns: 1,
            },
            Op::ExpectNotAncestor { dir, of: to },
            Op::MoveDentry {
                parent: from,
                name: name.into(),
                ino: dir,
                new_parent: to,
                new_name: name.into(),
            },
        ])
        .is_ok()
    };
    for round in 0..20 {
        let pa = create(&*a, ROOT_INO, &format!("a{round}"), true).unwrap();
        let pb = create(&*a, ROOT_INO, &format!("b{round}"), true).unwrap();
        let x = create(&*a, pa, "x", true).unwrap();
        let y = create(&*a, pb, "y", true).unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let (a2, bar) = (a.clone(), barrier.clone());
        let t = std::thread::spawn(move || {
            bar.wait();
            rename(&*a2, pa, "x", x, y)
        });
        barrier.wait();
        let second = rename(&*b, pb, "y", y, x);
        let first = t.join().unwrap();
        assert!(
            !(first && second),
            "round {round}: both renames succeeded (a loop)"
        );
        assert!(first || second, "round {round}: neither rename succeeded");
    }
}

/// Batches commit without waiting for the WAL flush (the connection's setting is off),
/// and `make_durable` commits a transaction that does wait (setting on, an xid taken).
#[test]
fn commits_are_flushed_on_demand() {
    let Some(f) = pg("commits_are_flushed_on_demand") else {
        return;
    };
    let e = &*f.engine;
    create(e, ROOT_INO, "a", false).unwrap();
    let mode = e
        .inner
        .single(super::sql::Q::SyncCommit, &[], |rows| {
            Ok(rows
                .first()
                .and_then(|r| r.try_get::<_, String>(0).ok())
                .unwrap_or_default())
        })
        .unwrap();
    assert_eq!(mode, "off", "batches must not wait for the WAL flush");
    let before = e.counters().round_trips;
    e.make_durable().unwrap();
    assert_eq!(e.counters().round_trips, before + 1, "one round trip");
}

/// Each mount uploads what it marked: `due_pending_for` gives a session its own rows (and
/// rows marked outside any session) when due, another session's only once due at the
/// later bound; a re-mark makes the row the re-marker's.
#[test]
fn pending_rows_belong_to_the_session_that_marked_them() {
    let Some(f) = pg("pending_rows_belong_to_the_session_that_marked_them") else {
        return;
    };
    let a = f.engine.clone();
    let b = Arc::new(PgEngine::open(&f.url).unwrap());
    let sa = logging_session(&a, "a", 1);
    let sb = logging_session(&b, "b", 2);
    let plain = PgEngine::open(&f.url).unwrap(); // no session: its marks are nobody's
    txn(&*a, |t| t.mark_pending(b"by-a", false, 100)).unwrap();
    txn(&*b, |t| t.mark_pending(b"by-b", false, 100)).unwrap();
    txn(&plain, |t| t.mark_pending(b"by-none", false, 100)).unwrap();
    let due = |e: &dyn MetaEngine, me: u64, others: i64| -> Vec<String> {
        let mut v: Vec<String> = read(e, |t| t.due_pending_for(1_000, 10, me, others))
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8(r.path).unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(due(&*a, sa, 50), ["by-a", "by-none"]);
    assert_eq!(due(&*b, sb, 50), ["by-b", "by-none"]);
    // Past the others' bound, every due row.
    assert_eq!(due(&*b, sb, 100), ["by-a", "by-b", "by-none"]);
    // Never more than due_pending would give.
    assert!(read(&*a, |t| t.due_pending_for(99, 10, sa, i64::MAX))
        .unwrap()
        .is_empty());
    // B re-marks A's path: B's now.
    txn(&*b, |t| t.mark_pending(b"by-a", false, 100)).unwrap();
    assert_eq!(due(&*a, sa, 50), ["by-none"]);
    assert_eq!(due(&*b, sb, 50), ["by-a", "by-b", "by-none"]);
}

/// A workspace made before `pending.owner` existed gets the column when opened, and
/// marks and reads of pending rows work on it.
#[test]
fn an_older_schema_gets_the_pending_owner_column() {
    let Some(f) = pg("an_older_schema_gets_the_pending_owner_column") else {
        return;
    };
    txn(&*f.engine, |t| t.mark_pending(b"old", false, 1)).unwrap();
    admin(
        &f.base,
        &format!("ALTER TABLE {}.pending DROP COLUMN owner", f.schema),
    );
    let e = PgEngine::open(&f.url).unwrap();
    let s = logging_session(&e, "h", 1);
    txn(&e, |t| t.mark_pending(b"new", false, 1)).unwrap();
    let rows = read(&e, |t| t.due_pending_for(10, 10, s, 0)).unwrap();
    let mut paths: Vec<&[u8]> = rows.iter().map(|r| r.path.as_slice()).collect();
    paths.sort();
    assert_eq!(paths, [b"new".as_slice(), b"old".as_slice()]);
}

/// The engine's own connections (driven by their caller, `wire`) reach the server as
/// libpq would: through the Unix socket of a `host=/dir` URL, and at a `hostaddr` when
/// the host name does not resolve; a round trip works on both.
#[test]
fn connections_reach_the_server_by_unix_socket_and_by_hostaddr() {
    let Some(f) = pg("connections_reach_the_server_by_unix_socket_and_by_hostaddr") else {
        return;
    };
    let Server {
        user,
        password,
        host,
        port,
        db,
    } = Server::of(&f.base);
    let ip: std::net::IpAddr = host.parse().expect("the test server's host is an address");
    let by_addr = format!(
        "postgres://{user}:{password}@no-such-host.invalid:{port}/{db}?hostaddr={ip}&schema={}",
        f.schema
    );
    let e = PgEngine::open(&by_addr).expect("hostaddr is used, not the name");
    assert_eq!(e.get_inode(ROOT_INO).unwrap().unwrap().ino, ROOT_INO);
    // The server's socket directory, from the admin conninfo scripts/pg-server.sh gives.
    let Some(dir) = std::env::var("DESKFS_TEST_PG_ADMIN").ok().and_then(|a| {
        a.split_whitespace()
            .find_map(|kv| kv.strip_prefix("host=").map(str::to_string))
            .filter(|h| h.starts_with('/'))
    }) else {
        crate::suite::unavailable("connections_reach_the_server_by_unix_socket (no socket dir)");
        return;
    };
    let by_socket = format!(
        "postgres://{user}:{password}@/{db}?host={dir}&port={port}&schema={}",
        f.schema
    );
    let e = PgEngine::open(&by_socket).expect("the Unix socket is used");
    assert_eq!(e.get_inode(ROOT_INO).unwrap().unwrap().ino, ROOT_INO);
    assert!(
        e.inner.spec.target.starts_with(&dir),
        "{}",
        e.inner.spec.target
    );
}
