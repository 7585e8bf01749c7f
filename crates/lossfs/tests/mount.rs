//! Integration tests: mount the real FUSE file system on a temporary directory, drive it
//! through the mount and the control socket (the `ctl` client mode of the binary), cut
//! power, and look at what survived. Skipped (with a printed reason) without `/dev/fuse`.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_deskfs-lossfs");

/// A running lossfs over a fresh backing directory.
struct Mount {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

fn is_mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
        })
        .unwrap_or(false)
}

impl Mount {
    /// Mounts; `None` (after printing why) where FUSE is not available.
    fn new(seed_backing: impl FnOnce(&Path)) -> Option<Mount> {
        if !Path::new("/dev/fuse").exists() {
            eprintln!("skipping: /dev/fuse is missing");
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let backing = dir.path().join("backing");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&backing).expect("mkdir backing");
        fs::create_dir(&mnt).expect("mkdir mnt");
        seed_backing(&backing);
        let sock = dir.path().join("control.sock");
        let log = dir.path().join("lossfs.log");
        let child = Command::new(BIN)
            .arg("serve")
            .arg("--backing")
            .arg(&backing)
            .arg("--control")
            .arg(&sock)
            .arg(&mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn deskfs-lossfs");
        let mut m = Mount {
            _dir: dir,
            backing,
            mnt,
            sock,
            log,
            child: Some(child),
        };
        let start = Instant::now();
        while !(is_mounted(&m.mnt) && m.sock.exists()) {
            if let Some(c) = m.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!(
                        "deskfs-lossfs exited ({st}): {}",
                        fs::read_to_string(&m.log).unwrap_or_default()
                    );
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "not mounted after 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(m)
    }

    /// A path in the mount.
    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// A path in the backing directory.
    fn b(&self, rel: &str) -> PathBuf {
        self.backing.join(rel)
    }

    /// Sends a control command through the `ctl` client; returns the answer.
    fn ctl(&self, cmd: &str) -> String {
        let out = Command::new(BIN)
            .arg("ctl")
            .arg(&self.sock)
            .args(cmd.split(' '))
            .output()
            .expect("run ctl");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(out.status.success(), "ctl {cmd}: {answer}");
        assert!(answer.starts_with("ok"), "ctl {cmd}: {answer}");
        answer
    }

    fn cut(&self) -> String {
        self.ctl("cut")
    }

    fn stats(&self) -> serde_json::Value {
        let a = self.ctl("stats");
        serde_json::from_str(a.trim_start_matches("ok ")).expect("stats JSON")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM: lossfs unmounts and exits.
            let pid = c.id() as libc::pid_t;
            // SAFETY: signalling our own child, by its pid.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let start = Instant::now();
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    _ if start.elapsed() > Duration::from_secs(10) => {
                        let _ = Command::new("fusermount3")
                            .arg("-u")
                            .arg("-z")
                            .arg(&self.mnt)
                            .status();
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        if std::thread::panicking() || std::env::var_os("LOSSFS_TEST_LOG").is_some() {
            eprintln!(
                "lossfs log:\n{}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mnt)
                .status();
        }
    }
}

fn write_file(path: &Path, data: &[u8]) -> File {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("open for writing");
    f.write_all(data).expect("write");
    f
}

fn fsync_dir(path: &Path) {
    File::open(path)
        .expect("open dir")
        .sync_all()
        .expect("fsync dir");
}

fn read(path: &Path) -> Option<Vec<u8>> {
    match fs::read(path) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}

/// (1) A write without fsync is lost at a cut; the backing file never saw it.
#[test]
fn unsynced_write_is_lost() {
    let Some(m) = Mount::new(|b| fs::write(b.join("f"), b"original").expect("seed")) else {
        return;
    };
    let f = OpenOptions::new().write(true).open(m.p("f")).expect("open");
    f.write_all_at(b"CHANGED", 0).expect("write");
    drop(f);
    assert_eq!(read(&m.p("f")).as_deref(), Some(&b"CHANGEDl"[..]));
    assert_eq!(read(&m.b("f")).as_deref(), Some(&b"original"[..]));
    assert!(m.stats()["pending_data_bytes"].as_u64() > Some(0));
    m.cut();
    assert_eq!(read(&m.p("f")).as_deref(), Some(&b"original"[..]));
    assert_eq!(read(&m.b("f")).as_deref(), Some(&b"original"[..]));
}

/// (2) What fdatasync returned survives.
#[test]
fn fdatasync_write_survives() {
    let Some(m) = Mount::new(|b| fs::write(b.join("f"), b"original").expect("seed")) else {
        return;
    };
    let f = OpenOptions::new().write(true).open(m.p("f")).expect("open");
    f.write_all_at(b"durable!", 0).expect("write");
    f.sync_data().expect("fdatasync");
    f.write_all_at(b"LOST", 20).expect("write after");
    drop(f);
    m.cut();
    assert_eq!(read(&m.p("f")).as_deref(), Some(&b"durable!"[..]));
}

/// (3) fsync of a new file makes its directory entry durable too (ext4 rule).
#[test]
fn fsync_of_new_file_makes_entry_durable() {
    let Some(m) = Mount::new(|_| {}) else { return };
    fs::create_dir(m.p("d")).expect("mkdir");
    let f = write_file(&m.p("d/new"), b"payload");
    // Created after d/new: not made durable by its fsync (operations persist in order).
    drop(write_file(&m.p("d/later"), b"later"));
    f.sync_all().expect("fsync");
    drop(f);
    m.cut();
    assert_eq!(read(&m.p("d/new")).as_deref(), Some(&b"payload"[..]));
    assert_eq!(read(&m.p("d/later")), None);
}

/// (4) A new file never fsynced is gone.
#[test]
fn unsynced_create_is_gone() {
    let Some(m) = Mount::new(|_| {}) else { return };
    drop(write_file(&m.p("ghost"), b"boo"));
    assert!(m.p("ghost").exists());
    m.cut();
    assert!(!m.p("ghost").exists());
    assert!(!m.b("ghost").exists());
}

/// (5) rename after fsync of the source: not durable without fsync of the directory
/// (or of the renamed file).
#[test]
fn rename_needs_fsyncdir() {
    let Some(m) = Mount::new(|_| {}) else { return };
    // Without fsyncdir: the old name survives.
    let f = write_file(&m.p("tmp"), b"v1");
    f.sync_all().expect("fsync");
    drop(f);
    fs::rename(m.p("tmp"), m.p("final")).expect("rename");
    m.cut();
    assert_eq!(read(&m.p("tmp")).as_deref(), Some(&b"v1"[..]));
    assert_eq!(read(&m.p("final")), None);
    // With fsyncdir: the new name.
    fs::rename(m.p("tmp"), m.p("final")).expect("rename");
    fsync_dir(&m.mnt);
    m.cut();
    assert_eq!(read(&m.p("tmp")), None);
    assert_eq!(read(&m.p("final")).as_deref(), Some(&b"v1"[..]));
    // fsync of the renamed file itself makes its rename durable (the journal commit
    // that holds it).
    fs::rename(m.p("final"), m.p("again")).expect("rename");
    File::open(m.p("again"))
        .expect("open")
        .sync_all()
        .expect("fsync");
    m.cut();
    assert_eq!(read(&m.p("final")), None);
    assert_eq!(read(&m.p("again")).as_deref(), Some(&b"v1"[..]));
}

/// The classic replace-by-rename without an fsync of the new file: the directory fsync
/// makes the rename durable but not the data, so the file is empty after a cut (no
/// ext4 `auto_da_alloc`) — the bug this harness exists to catch. With the fsync, the new
/// content.
#[test]
fn rename_over_without_fsync_loses_content() {
    let Some(m) = Mount::new(|b| fs::write(b.join("conf"), b"old").expect("seed")) else {
        return;
    };
    drop(write_file(&m.p("conf.tmp"), b"new"));
    fs::rename(m.p("conf.tmp"), m.p("conf")).expect("rename");
    fsync_dir(&m.mnt);
    m.cut();
    assert_eq!(read(&m.p("conf")).as_deref(), Some(&b""[..]));
    let f = write_file(&m.p("conf.tmp"), b"new");
    f.sync_all().expect("fsync");
    drop(f);
    fs::rename(m.p("conf.tmp"), m.p("conf")).expect("rename");
    fsync_dir(&m.mnt);
    m.cut();
    assert_eq!(read(&m.p("conf")).as_deref(), Some(&b"new"[..]));
    assert_eq!(read(&m.p("conf.tmp")), None);
}

/// (6) An injected fsync failure returns EIO and loses the data; the next fsync
/// succeeds without it.
#[test]
fn failed_fsync_loses_data() {
    let Some(m) = Mount::new(|_| {}) else { return };
    let f = write_file(&m.p("db-wal"), b"first");
    f.sync_all().expect("fsync");
    f.write_all_at(b"second", 5).expect("write");
    m.ctl("fail-fsync *-wal 1");
    let e = f.sync_all().expect_err("injected failure");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    f.sync_all().expect("second fsync succeeds");
    drop(f);
    assert_eq!(m.stats()["injected_failures"], 1);
    m.cut();
    assert_eq!(read(&m.p("db-wal")).as_deref(), Some(&b"first"[..]));
}

/// (6b) fail-fsyncdir: the directory fsync fails and makes nothing durable.
#[test]
fn failed_fsyncdir_keeps_ops_pending() {
    let Some(m) = Mount::new(|_| {}) else { return };
    fs::create_dir(m.p("d")).expect("mkdir");
    m.ctl("fail-fsyncdir d 1");
    let e = File::open(m.p("d"))
        .expect("open dir")
        .sync_all()
        .expect_err("injected failure");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    m.cut();
    assert!(!m.p("d").exists());
}

fn count_rows(path: &Path) -> (i64, String) {
    let c = rusqlite::Connection::open(path).expect("reopen");
    let n: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap_or(-1);
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    (n, ok)
}

/// Opens a WAL database on the mount and commits `txs` transactions of 10 rows each;
/// returns the connection (still open) and the number of rows committed in all.
fn sqlite_fill(db: &Path, sync: &str, txs: i64) -> (rusqlite::Connection, i64) {
    let c = rusqlite::Connection::open(db).expect("open db");
    let mode: String = c
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .expect("wal");
    assert_eq!(mode, "wal");
    c.execute_batch(&format!(
        "PRAGMA synchronous={sync}; CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB);"
    ))
    .expect("schema");
    let before: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .expect("count");
    let mut rows = before;
    for _ in 0..txs {
        c.execute_batch(
            "BEGIN; INSERT INTO t(v) SELECT randomblob(300) FROM \
             (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<10) SELECT i FROM n); \
             COMMIT;",
        )
        .expect("insert");
        rows += 10;
    }
    let n: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .expect("count");
    assert_eq!(n, rows);
    (c, rows)
}

/// Not a test by itself: the SQLite writer process of [`sqlite_wal_survives_cuts`]
/// (this test binary run again with `LOSSFS_SQLITE_CHILD=DB,SYNC,TXS,REPORT`). It
/// commits, writes the number of rows committed to REPORT, and waits to be killed (-9: no close, no
/// checkpoint — the process dies with the power).
#[test]
fn sqlite_writer_child() {
    let Some(spec) = std::env::var_os("LOSSFS_SQLITE_CHILD") else {
        return;
    };
    let spec = spec.to_string_lossy().into_owned();
    let mut parts = spec.split(',');
    let (Some(db), Some(sync), Some(txs), Some(report)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        panic!("bad LOSSFS_SQLITE_CHILD {spec:?}");
    };
    let (_c, rows) = sqlite_fill(Path::new(db), sync, txs.parse().expect("txs"));
    let tmp = format!("{report}.tmp");
    fs::write(&tmp, rows.to_string()).expect("write the report");
    fs::rename(&tmp, report).expect("publish the report");
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Runs the SQLite writer in a child process, and kills it (-9) once it has committed;
/// returns the number of rows committed.
fn sqlite_writer(db: &Path, sync: &str, txs: i64) -> i64 {
    let report = db.with_extension("committed");
    let report = std::env::temp_dir().join(format!(
        "lossfs-{}-{}",
        std::process::id(),
        report
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let _ = fs::remove_file(&report);
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "sqlite_writer_child", "--test-threads=1"])
        .env(
            "LOSSFS_SQLITE_CHILD",
            format!("{},{sync},{txs},{}", db.display(), report.display()),
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the writer");
    let start = Instant::now();
    let rows = loop {
        if let Ok(s) = fs::read_to_string(&report) {
            break s.trim().parse::<i64>().ok();
        }
        if matches!(child.try_wait(), Ok(Some(_))) || start.elapsed() > Duration::from_secs(120) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Kill by the pid we started, and reap it.
    let _ = child.kill();
    let _ = child.wait();
    let _ = fs::remove_file(&report);
    rows.expect("the writer reported its commits")
}

/// (7) SQLite in WAL mode: with synchronous=FULL every committed row survives a cut
/// (also reordered cuts); with synchronous=OFF the database still opens intact.
#[test]
fn sqlite_wal_survives_cuts() {
    let Some(m) = Mount::new(|_| {}) else { return };
    let db = m.p("t.db");
    let rows = sqlite_writer(&db, "FULL", 20);
    assert_eq!(rows, 200);
    m.cut();
    assert!(
        m.p("t.db-wal").exists(),
        "the WAL was fsynced, so it exists"
    );
    assert_eq!(count_rows(&db), (rows, "ok".to_owned()));

    for seed in [1u64, 2, 3] {
        let more = sqlite_writer(&db, "FULL", 3);
        m.ctl(&format!("cut --reorder {seed}"));
        let (n, ok) = count_rows(&db);
        assert_eq!(ok, "ok", "seed {seed}");
        assert!(n >= more, "seed {seed}: {n} rows, committed {more}");
    }
    let (durable, _) = count_rows(&db);

    let all = sqlite_writer(&db, "OFF", 5);
    assert_eq!(all, durable + 50);
    m.cut();
    let (n, ok) = count_rows(&db);
    assert_eq!(ok, "ok");
    assert_eq!(n, durable, "nothing was synced after the FULL rows");
    assert_eq!(m.stats()["apply_errors"], 0);
}

/// The writes a reorder test makes (on a fresh mount each time).
fn reorder_workload(m: &Mount) {
    let f = write_file(&m.p("big"), &[1u8; 16 * 4096]);
    f.sync_all().expect("fsync");
    for i in 0..16u64 {
        f.write_all_at(&[2u8; 10], i * 4096 + 7).expect("write");
    }
    drop(f);
    for i in 0..8 {
        drop(write_file(&m.p(&format!("n{i}")), b"x"));
    }
}

/// The backing tree: names and contents.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .expect("ls")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    out.sort();
    out
}

/// (8) `cut --reorder SEED` is reproducible, keeps a prefix of the namespace log and a
/// subset of the pages.
#[test]
fn reorder_is_reproducible() {
    let mut outcomes = Vec::new();
    for seed in [42u64, 42, 5, 6, 7] {
        let Some(m) = Mount::new(|_| {}) else { return };
        reorder_workload(&m);
        let answer = m.ctl(&format!("cut --reorder {seed}"));
        let t = tree(&m.backing);
        // What the mount shows is the backing directory.
        assert_eq!(tree(&m.mnt), t);
        let created: Vec<&str> = t
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| n.starts_with('n'))
            .collect();
        let want: Vec<String> = (0..created.len()).map(|i| format!("n{i}")).collect();
        assert_eq!(created, want, "seed {seed}: not a prefix ({answer})");
        outcomes.push((seed, answer, t));
    }
    assert_eq!(outcomes[0].1, outcomes[1].1, "same seed, same report");
    assert_eq!(outcomes[0].2, outcomes[1].2, "same seed, same disk");
    let distinct: std::collections::BTreeSet<_> = outcomes.iter().map(|o| &o.2).collect();
    assert!(distinct.len() > 2, "seeds should differ");
}

/// Shared writable mmap (SQLite's -shm) works, and msync'd pages reach the daemon.
#[test]
fn shared_mmap_works() {
    let Some(m) = Mount::new(|_| {}) else { return };
    let f = write_file(&m.p("shm"), b"");
    f.set_len(32768).expect("ftruncate");
    // SAFETY: a fresh shared mapping of 32 KiB of an open file, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            32768,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: p maps 32768 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(b"mapped".as_ptr(), (p as *mut u8).add(5000), 6);
        assert_eq!(libc::msync(p, 32768, libc::MS_SYNC), 0);
    }
    let mut other = File::open(m.p("shm")).expect("open again");
    let mut buf = vec![0u8; 32768];
    other.read_exact(&mut buf).expect("read");
    assert_eq!(&buf[5000..5006], b"mapped");
    f.sync_all().expect("fsync");
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(p, 32768) };
    assert_eq!(
        &fs::read(m.b("shm")).expect("backing")[5000..5006],
        b"mapped"
    );
}

/// Handles opened before a cut are stale afterwards.
#[test]
fn handles_are_stale_after_cut() {
    let Some(m) = Mount::new(|b| fs::write(b.join("f"), b"content").expect("seed")) else {
        return;
    };
    let f = File::open(m.p("f")).expect("open");
    let mut buf = [0u8; 7];
    f.read_exact_at(&mut buf, 0).expect("read before");
    m.cut();
    let e = f.read_exact_at(&mut buf, 0).expect_err("stale read");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(read(&m.p("f")).as_deref(), Some(&b"content"[..]));
}

/// The ordinary POSIX behaviour a program needs (open flags, truncate, links, dirs).
#[test]
fn posix_basics() {
    let Some(m) = Mount::new(|_| {}) else { return };
    drop(write_file(&m.p("a"), b"hello"));
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.p("a"))
        .expect_err("O_EXCL");
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
    let mut ap = OpenOptions::new()
        .append(true)
        .open(m.p("a"))
        .expect("append");
    ap.write_all(b" world").expect("append write");
    drop(ap);
    assert_eq!(read(&m.p("a")).as_deref(), Some(&b"hello world"[..]));
    drop(
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(m.p("a"))
            .expect("O_TRUNC"),
    );
    assert_eq!(read(&m.p("a")).as_deref(), Some(&b""[..]));
    drop(write_file(&m.p("a"), &[5u8; 10000]));
    let f = OpenOptions::new().write(true).open(m.p("a")).expect("open");
    f.set_len(100).expect("ftruncate");
    f.set_len(5000).expect("extend");
    drop(f);
    let d = read(&m.p("a")).expect("read");
    assert_eq!(d.len(), 5000);
    assert!(d[..100].iter().all(|&b| b == 5) && d[100..].iter().all(|&b| b == 0));
    // Punch a hole through backing content (made durable first) and unsynced pages.
    let f = OpenOptions::new().write(true).open(m.p("a")).expect("open");
    f.sync_all().expect("fsync");
    f.write_all_at(&[6u8; 10], 4000).expect("write");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: fallocate on an open descriptor.
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            50,
            4000,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    drop(f);
    let d = read(&m.p("a")).expect("read");
    assert_eq!(d.len(), 5000);
    assert!(d[..50].iter().all(|&b| b == 5) && d[50..4050].iter().all(|&b| b == 0));
    fs::hard_link(m.p("a"), m.p("b")).expect("link");
    assert_eq!(fs::metadata(m.p("a")).expect("stat").nlink(), 2);
    fs::create_dir_all(m.p("x/y")).expect("mkdir -p");
    std::os::unix::fs::symlink("../a", m.p("x/l")).expect("symlink");
    assert_eq!(fs::read(m.p("x/l")).expect("via symlink").len(), 5000);
    let e = fs::remove_dir(m.p("x")).expect_err("rmdir non-empty");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    fs::rename(m.p("b"), m.p("x/y/b")).expect("rename across dirs");
    fs::remove_file(m.p("a")).expect("unlink");
    let mut names: Vec<String> = fs::read_dir(m.p("x"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["l", "y"]);
    let st = nix::sys::statvfs::statvfs(&m.mnt).expect("statfs");
    assert!(st.blocks() > 0);
    // Nothing above was synced: after `sync` it is all on disk.
    m.ctl("sync");
    assert_eq!(fs::read(m.b("x/y/b")).expect("synced").len(), 5000);
    assert!(!m.b("a").exists());
    assert_eq!(m.stats()["pending_namespace_ops"], 0);
}
