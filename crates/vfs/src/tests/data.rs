//! open/create, read, write, flush/release, fsync: content and sizes.

use super::*;
use crate::{SetAttr, SetTime};

#[test]
fn write_then_read_before_and_after_flush_and_release() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    assert_eq!(h.write(a.ino, fh, 0, b"hello world").unwrap(), 11);
    // Visible before any flush, through the same handle and in getattr/lookup.
    assert_eq!(h.read(a.ino, fh, 0, 100).unwrap(), b"hello world");
    assert_eq!(h.getattr(a.ino).unwrap().size, 11);
    assert_eq!(h.lk(ROOT_INO, "f").unwrap().size, 11);
    assert_eq!(h.row(a.ino).unwrap().size, 0, "not committed before flush");
    // A second handle sees it too.
    let fh2 = h.op(a.ino, libc::O_RDONLY);
    assert_eq!(h.read(a.ino, fh2, 6, 100).unwrap(), b"world");

    h.flush(a.ino, fh).unwrap();
    let row = h.row(a.ino).unwrap();
    assert_eq!(row.size, 11, "flush commits the size");
    assert!(row.dirty);
    assert_eq!(h.read(a.ino, fh, 0, 5).unwrap(), b"hello");
    h.release(a.ino, fh).unwrap();
    h.release(a.ino, fh2).unwrap();
    assert_eq!(h.cat(a.ino), b"hello world");
    assert_eq!(h.getattr(a.ino).unwrap().size, 11);
}

#[test]
fn reads_at_offsets_and_sparse_holes_read_zeros() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "sparse");
    h.put(a.ino, fh, 0, b"abc");
    let far = (3 << 20) + 17;
    h.put(a.ino, fh, far, b"xyz");
    let size = far + 3;
    assert_eq!(h.getattr(a.ino).unwrap().size, size);

    let check = |fh: u64| {
        assert_eq!(h.read(a.ino, fh, 0, 3).unwrap(), b"abc");
        assert_eq!(h.read(a.ino, fh, 1, 4).unwrap(), b"bc\0\0");
        assert_eq!(h.read(a.ino, fh, 1 << 20, 4096).unwrap(), vec![0u8; 4096]);
        let mut tail = vec![0u8; 5];
        tail.extend_from_slice(b"xyz");
        assert_eq!(
            h.read(a.ino, fh, far - 5, 100).unwrap(),
            tail,
            "short read at EOF"
        );
        assert_eq!(h.read(a.ino, fh, size, 10).unwrap(), b"", "read at EOF");
        assert_eq!(
            h.read(a.ino, fh, size + 1000, 10).unwrap(),
            b"",
            "read past EOF"
        );
        let all = h.read_to_end(a.ino, fh, 0, 1 << 20);
        assert_eq!(all.len() as u64, size);
        assert!(all[3..far as usize].iter().all(|b| *b == 0));
    };
    check(fh);
    h.release(a.ino, fh).unwrap();
    let fh = h.op(a.ino, libc::O_RDONLY);
    check(fh);
    h.release(a.ino, fh).unwrap();

    // A hole at the end made by a write far out, then overwritten in the middle.
    let fh = h.op(a.ino, libc::O_RDWR);
    h.put(a.ino, fh, 10, b"MID");
    assert_eq!(h.read(a.ino, fh, 8, 7).unwrap(), b"\0\0MID\0\0");
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.getattr(a.ino).unwrap().size, size);
}

#[test]
fn overwrite_in_place_keeps_the_rest() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "f", b"0123456789");
    let fh = h.op(a.ino, libc::O_WRONLY);
    h.put(a.ino, fh, 4, b"ab");
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.cat(a.ino), b"0123ab6789");
    assert_eq!(h.getattr(a.ino).unwrap().size, 10);
}

#[test]
fn large_content_roundtrip_in_odd_chunks() {
    let h = Harness::new();
    let data = pattern((5 << 20) + 333, 1);
    let a = h.file(ROOT_INO, "big", &data);
    assert_eq!(a.size, data.len() as u64);
    assert_eq!(a.blocks, (data.len() as u64).div_ceil(512));
    let fh = h.op(a.ino, libc::O_RDONLY);
    assert_eq!(h.read_to_end(a.ino, fh, 0, 77_777), data);
    assert_eq!(
        h.read(a.ino, fh, 1_234_567, 10).unwrap(),
        &data[1_234_567..1_234_577]
    );
    h.release(a.ino, fh).unwrap();
}

#[test]
fn open_with_o_trunc_truncates() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "f", b"some old content");
    // Read-only O_TRUNC does nothing (Linux leaves the file alone).
    let fh = h.op(a.ino, libc::O_RDONLY | libc::O_TRUNC);
    assert_eq!(h.getattr(a.ino).unwrap().size, 16);
    h.release(a.ino, fh).unwrap();

    let before = h.getattr(a.ino).unwrap();
    let fh = h.op(a.ino, libc::O_WRONLY | libc::O_TRUNC);
    let now = h.getattr(a.ino).unwrap();
    assert_eq!(now.size, 0, "O_TRUNC empties the file at open");
    assert!(now.mtime_ns >= before.mtime_ns);
    h.put(a.ino, fh, 0, b"new");
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.cat(a.ino), b"new");
    assert_eq!(h.row(a.ino).unwrap().size, 3);
}

#[test]
fn o_append_writes_always_go_to_the_end() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "log", b"");
    let h1 = h.op(a.ino, libc::O_WRONLY | libc::O_APPEND);
    let h2 = h.op(a.ino, libc::O_WRONLY | libc::O_APPEND);
    let plain = h.op(a.ino, libc::O_RDWR);
    h.write(a.ino, h1, 0, b"a").unwrap();
    h.write(a.ino, h2, 0, b"bb").unwrap();
    h.write(a.ino, h1, 0, b"ccc").unwrap();
    // A non-append handle writes where it is told.
    h.write(a.ino, plain, 0, b"X").unwrap();
    h.write(a.ino, h2, 1, b"dddd").unwrap();
    assert_eq!(h.read(a.ino, plain, 0, 100).unwrap(), b"Xbbcccdddd");
    for fh in [h1, h2, plain] {
        h.release(a.ino, fh).unwrap();
    }
    assert_eq!(h.cat(a.ino), b"Xbbcccdddd");
}

#[test]
fn o_append_is_atomic_across_threads() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "log", b"");
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let vfs = h.arc();
            let ino = a.ino;
            std::thread::spawn(move || {
                let fh = vfs
                    .open(&CTX, ino, libc::O_WRONLY | libc::O_APPEND)
                    .unwrap()
                    .fh;
                for _ in 0..100 {
                    vfs.write(ino, fh, 0, &[b'a' + t; 16]).unwrap();
                }
                vfs.release(ino, fh).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let data = h.cat(a.ino);
    assert_eq!(data.len(), 4 * 100 * 16);
    let mut counts = [0; 4];
    for rec in data.chunks(16) {
        assert!(
            rec.iter().all(|b| *b == rec[0]),
            "torn append record {rec:?}"
        );
        counts[(rec[0] - b'a') as usize] += 1;
    }
    assert_eq!(counts, [100; 4]);
}

/// Writers that each open, append and close, concurrently (shell `>>` from several
/// processes): no append may be lost or overlap another.
#[test]
fn concurrent_open_append_close_cycles_lose_nothing() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "log", b"");
    let (threads, rounds) = (4u8, 1500);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let vfs = h.arc();
            let ino = a.ino;
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    let fh = vfs
                        .open(&CTX, ino, libc::O_WRONLY | libc::O_APPEND)
                        .unwrap()
                        .fh;
                    vfs.write(ino, fh, 0, &[b'a' + t; 16]).unwrap();
                    vfs.flush(ino, fh).unwrap();
                    vfs.release(ino, fh).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let data = h.cat(a.ino);
    let mut counts = vec![0; threads as usize];
    for rec in data.chunks(16) {
        assert!(
            rec.len() == 16 && rec.iter().all(|b| *b == rec[0]),
            "torn append record {rec:?}"
        );
        counts[(rec[0] - b'a') as usize] += 1;
    }
    assert_eq!(
        counts,
        vec![rounds; threads as usize],
        "appends lost; file is {} bytes",
        data.len()
    );
}

#[test]
fn handle_errors() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "f", b"data");
    let ro = h.op(a.ino, libc::O_RDONLY);
    assert_eq!(errno(h.write(a.ino, ro, 0, b"x")), libc::EBADF);
    h.release(a.ino, ro).unwrap();
    let wo = h.op(a.ino, libc::O_WRONLY);
    assert_eq!(
        errno(h.read(a.ino, wo, 0, 10)),
        libc::EBADF,
        "read through a write-only handle"
    );
    h.release(a.ino, wo).unwrap();
    let other = h.file(ROOT_INO, "other", b"zz");
    let rw = h.op(other.ino, libc::O_RDWR);
    assert_eq!(
        errno(h.read(a.ino, rw, 0, 10)),
        libc::EBADF,
        "handle of another inode"
    );
    assert_eq!(
        errno(h.write(a.ino, rw, 0, b"x")),
        libc::EBADF,
        "handle of another inode"
    );
    h.release(other.ino, rw).unwrap();
    assert_eq!(errno(h.read(a.ino, 999_999, 0, 10)), libc::EBADF);
    assert_eq!(errno(h.write(a.ino, 999_999, 0, b"x")), libc::EBADF);
    // A released handle is gone.
    assert_eq!(errno(h.read(a.ino, ro, 0, 10)), libc::EBADF);
    assert_eq!(h.cat(a.ino), b"data");

    let d = h.dir(ROOT_INO, "d");
    assert_eq!(errno(h.open(&CTX, d.ino, libc::O_WRONLY)), libc::EISDIR);
    assert_eq!(errno(h.open(&CTX, d.ino, libc::O_RDWR)), libc::EISDIR);
    assert_eq!(errno(h.open(&CTX, 987_654, libc::O_RDONLY)), libc::ESTALE);
    assert_eq!(errno(h.opendir(a.ino)), libc::ENOTDIR);
    assert_eq!(errno(h.opendir(987_654)), libc::ESTALE);
    // Writes past the ext4 limit (16 TiB).
    let fh = h.op(a.ino, libc::O_WRONLY);
    assert_eq!(errno(h.write(a.ino, fh, 16 << 40, b"x")), libc::EFBIG);
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.getattr(a.ino).unwrap().size, 4);
}

#[test]
fn fsync_commits_size_and_data() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    h.put(a.ino, fh, 0, b"durable");
    assert_eq!(h.row(a.ino).unwrap().size, 0);
    h.fsync(a.ino, fh, false).unwrap();
    let row = h.row(a.ino).unwrap();
    assert_eq!(row.size, 7);
    assert!(
        row.dirty,
        "not uploaded yet, or at least not before the commit"
    );
    h.put(a.ino, fh, 7, b"!");
    h.fsync(a.ino, fh, true).unwrap();
    assert_eq!(h.row(a.ino).unwrap().size, 8);
    h.fsyncdir(ROOT_INO).unwrap();
    assert_eq!(h.read(a.ino, fh, 0, 100).unwrap(), b"durable!");
    h.release(a.ino, fh).unwrap();
    // fsync without writes is fine.
    let fh = h.op(a.ino, libc::O_RDONLY);
    h.fsync(a.ino, fh, false).unwrap();
    h.release(a.ino, fh).unwrap();
}

#[test]
fn write_updates_mtime_and_ctime() {
    let h = Harness::new();
    let a = h.file(ROOT_INO, "f", b"x");
    let t0 = 1_000_000_000;
    h.setattr(
        &CTX,
        a.ino,
        &SetAttr {
            mtime: Some(SetTime::At(t0)),
            atime: Some(SetTime::At(t0)),
            ..Default::default()
        },
    )
    .unwrap();
    let fh = h.op(a.ino, libc::O_WRONLY);
    h.put(a.ino, fh, 1, b"y");
    let mid = h.getattr(a.ino).unwrap();
    assert!(mid.mtime_ns > t0, "mtime visible before close");
    h.release(a.ino, fh).unwrap();
    let after = h.getattr(a.ino).unwrap();
    assert!(after.mtime_ns > t0);
    assert_eq!(
        after.mtime_ns, mid.mtime_ns,
        "close keeps the write's mtime"
    );
    assert!(after.ctime_ns >= after.mtime_ns);
    assert_eq!(after.atime_ns, t0);
    assert_eq!(h.row(a.ino).unwrap().mtime_ns, after.mtime_ns);
}

#[test]
fn ftruncate_through_a_handle_with_pending_writes() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    h.put(a.ino, fh, 0, b"0123456789");
    let at = h
        .setattr(
            &CTX,
            a.ino,
            &SetAttr {
                size: Some(4),
                fh: Some(fh),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(at.size, 4);
    assert_eq!(h.read(a.ino, fh, 0, 100).unwrap(), b"0123");
    h.put(a.ino, fh, 6, b"Z");
    assert_eq!(h.read(a.ino, fh, 0, 100).unwrap(), b"0123\0\0Z");
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.cat(a.ino), b"0123\0\0Z");
    assert_eq!(h.row(a.ino).unwrap().size, 7);
}

/// Not a check: prints in-process timings of the small-file path (run with --ignored --nocapture).
#[test]
#[ignore = "timing probe, prints numbers only"]
fn probe_small_file_timings() {
    let delay = std::env::var("PROBE_UPLOAD_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let h = Harness::with_config(VfsConfig {
        upload_delay: std::time::Duration::from_millis(delay),
        ..test_cfg()
    });
    let d = h.dir(ROOT_INO, "d");
    let n = 2000;
    let mut tc = std::time::Duration::ZERO;
    let mut tw = std::time::Duration::ZERO;
    let mut tf = std::time::Duration::ZERO;
    let mut tr = std::time::Duration::ZERO;
    let mut ts = std::time::Duration::ZERO;
    for i in 0..n {
        let t = std::time::Instant::now();
        let (a, o) = h
            .create(
                &CTX,
                d.ino,
                format!("f{i}").as_bytes(),
                0o644,
                0,
                libc::O_WRONLY,
            )
            .unwrap();
        tc += t.elapsed();
        let t = std::time::Instant::now();
        h.write(a.ino, o.fh, 0, &[7u8; 4096]).unwrap();
        tw += t.elapsed();
        let t = std::time::Instant::now();
        for set in [
            crate::SetAttr {
                uid: Some(CTX.uid),
                gid: Some(CTX.gid),
                ..Default::default()
            },
            crate::SetAttr {
                mode: Some(0o644),
                ..Default::default()
            },
            crate::SetAttr {
                atime: Some(crate::SetTime::At(1)),
                mtime: Some(crate::SetTime::At(1)),
                ..Default::default()
            },
        ] {
            h.setattr(&CTX, a.ino, &set).unwrap();
        }
        ts += t.elapsed();
        let t = std::time::Instant::now();
        h.flush(a.ino, o.fh).unwrap();
        tf += t.elapsed();
        let t = std::time::Instant::now();
        h.release(a.ino, o.fh).unwrap();
        tr += t.elapsed();
    }
    eprintln!(
        "create {:?} write {:?} 3 x setattr {:?} flush {:?} release {:?} per file",
        tc / n,
        tw / n,
        ts / n,
        tf / n,
        tr / n
    );
    let t = std::time::Instant::now();
    for i in 0..n {
        h.lookup(&CTX, d.ino, format!("f{i}").as_bytes()).unwrap();
    }
    eprintln!("lookup: {:?} per file", t.elapsed() / n);
}

/// A new file written and closed costs the create's batch and the close's commit: the
/// first write needs no look at the row (dirty from its create, kept from uploaders by
/// the writer lock) and the kernel's `security.capability` question before it none
/// (a file this mount created has no xattrs). Counted on both engines.
#[test]
fn a_new_file_is_created_written_and_closed_in_two_round_trips() {
    let h = Harness::new();
    h.file(ROOT_INO, "warm-up", b"the root's first listing");
    let rt = deskfs_meta::thread_round_trips;
    let before = rt();
    let (a, fh) = h.create_rw(ROOT_INO, "new");
    assert_eq!(rt() - before, 1, "create");
    let before = rt();
    assert_eq!(
        errno(h.getxattr(a.ino, b"security.capability")),
        libc::ENODATA
    );
    h.write(a.ino, fh, 0, b"hello").unwrap();
    assert_eq!(rt() - before, 0, "getxattr and the first write");
    let before = rt();
    h.flush(a.ino, fh).unwrap();
    h.release(a.ino, fh).unwrap();
    assert_eq!(rt() - before, 1, "close");
    assert_eq!(h.cat(a.ino), b"hello");
    let row = h.row(a.ino).unwrap();
    assert!(row.dirty && row.size == 5, "{row:?}");
}

#[test]
fn fdatasync_of_a_durably_dirty_file_flushes_only_its_data() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "db");
    h.put(a.ino, fh, 0, &pattern(8192, 1));
    let flushes = || h.meta_flush.count();
    let n0 = flushes();
    h.fsync(a.ino, fh, false).unwrap();
    assert_eq!(
        flushes(),
        n0 + 1,
        "the first fsync flushes the metadata log"
    );
    // Only data changed since, and the row is durably dirty: the data flush alone.
    let data = || h.data_flushes.load(std::sync::atomic::Ordering::Relaxed);
    let d0 = data();
    h.put(a.ino, fh, 4096, &pattern(4096, 2));
    h.fsync(a.ino, fh, true).unwrap();
    h.put(a.ino, fh, 0, &pattern(100, 3));
    h.fsync(a.ino, fh, true).unwrap();
    assert_eq!(flushes(), n0 + 1, "fdatasync: one device flush");
    assert_eq!(data(), d0 + 2, "each fdatasync flushes the staging file");
    // fsync (times too) flushes the log.
    h.fsync(a.ino, fh, false).unwrap();
    assert_eq!(flushes(), n0 + 2);
    h.release(a.ino, fh).unwrap();
    // Uploaded and marked clean: the next fdatasync must make the new dirty mark durable.
    h.sync_all();
    assert!(!h.row(a.ino).unwrap().dirty);
    let fh = h.op(a.ino, libc::O_RDWR);
    h.put(a.ino, fh, 0, &pattern(100, 4));
    h.fsync(a.ino, fh, true).unwrap();
    assert_eq!(flushes(), n0 + 3, "a clean row made dirty again is flushed");
    h.release(a.ino, fh).unwrap();
}

/// A `getattr` whose read of the row came before a close committed the file's writes
/// answers the committed size, not the row's: the kernel takes the answer to a request
/// sent after the writes, and a smaller size would hide their end from every reader
/// (seen under load: a file written through a passthrough open read back empty).
#[test]
fn getattr_racing_a_close_answers_the_written_size() {
    let h = Harness::build(test_cfg(), |_| {});
    let a = h.file(ROOT_INO, "f", b"x");
    let fh = h.op(a.ino, libc::O_WRONLY);
    h.put(a.ino, fh, 0, &[7u8; 5000]);
    let vfs = h.vfs.clone().expect("mounted");
    crate::namespace::tests::BEFORE_OVERLAY.with(|r| {
        *r.borrow_mut() = Some(Box::new(move || vfs.flush(a.ino, fh).expect("flush")));
    });
    let size = h.getattr(a.ino).unwrap().size;
    assert!(
        crate::namespace::tests::BEFORE_OVERLAY.with(|r| r.borrow().is_none()),
        "the close committed between the row's read and the answer"
    );
    assert_eq!(size, 5000);
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.getattr(a.ino).unwrap().size, 5000);
}

/// `fsync` must flush the file's data whatever descriptor it comes through: written and
/// closed (committed, not flushed), forgotten by the kernel (its in-memory state goes),
/// then opened read-only and fsynced — as `sync FILE` or a database's recovery does. The
/// fsync found no staging file open in the fresh state and flushed none: it returned
/// success with the data in the page cache only.
#[test]
fn fsync_through_a_read_only_open_after_a_forget_flushes_the_data() {
    let h = Harness::uploads_held();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    h.put(a.ino, fh, 0, &pattern(8192, 7));
    h.release(a.ino, fh).unwrap();
    h.kernel_forgets(a.ino);
    let data = || h.data_flushes.load(std::sync::atomic::Ordering::Relaxed);
    for datasync in [true, false] {
        let fh = h.op(a.ino, libc::O_RDONLY);
        let d0 = data();
        h.fsync(a.ino, fh, datasync).unwrap();
        assert_eq!(
            data(),
            d0 + 1,
            "fsync (datasync {datasync}) flushed no data"
        );
        h.release(a.ino, fh).unwrap();
        h.kernel_forgets(a.ino);
    }
}

/// A close whose commit fails (the database refuses it) fails with `EIO` and keeps the
/// writes: the feed thread commits them once the database answers again
/// (`Vfs::recommit_released`). The failure is real: a trigger in the SQLite database
/// refuses the commit's update (SQLite only).
#[test]
fn writes_whose_commit_failed_at_close_are_committed_when_the_database_answers_again() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    h.write(a.ino, fh, 0, b"hello").unwrap();
    let Some(refusal) = h.refuse_updates("inodes", "size") else {
        return;
    };
    assert_eq!(errno(h.flush(a.ino, fh)), libc::EIO, "the close's commit");
    let _ = h.release(a.ino, fh);
    assert_eq!(h.row(a.ino).unwrap().size, 0, "nothing committed yet");
    refusal.lift();
    assert!(
        wait_until(Duration::from_secs(20), || h.row(a.ino).unwrap().size == 5),
        "the writes of the closed file were never committed"
    );
    assert_eq!(h.cat(a.ino), b"hello");
}

/// `fallocate(2)`: the modes deskfs takes (0, `KEEP_SIZE`, `PUNCH_HOLE | KEEP_SIZE`,
/// `ZERO_RANGE`) change the content and size as Linux documents them and are committed at
/// close; the others are `EOPNOTSUPP` (`PUNCH_HOLE` needs `KEEP_SIZE`: fallocate(2)), a
/// handle not open for writing is `EBADF`, a range past the largest file `EFBIG`.
#[test]
fn fallocate_modes_change_content_and_size_as_linux_documents() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "f");
    h.write(a.ino, fh, 0, b"abcd").unwrap();
    let size = |h: &Harness| h.getattr(a.ino).unwrap().size;
    let before = h.getattr(a.ino).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    // Mode 0 extends the size with zeros, and is a change (mtime, ctime).
    h.fallocate(a.ino, fh, 0, 8192, 0).unwrap();
    assert_eq!(size(&h), 8192);
    let after = h.getattr(a.ino).unwrap();
    assert!(after.mtime_ns > before.mtime_ns && after.ctime_ns > before.ctime_ns);
    let mut want = b"abcd".to_vec();
    want.resize(8192, 0);
    assert_eq!(h.read(a.ino, fh, 0, 16384).unwrap(), want);
    // KEEP_SIZE allocates without changing the size.
    h.fallocate(a.ino, fh, 0, 65536, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(size(&h), 8192);
    // A hole punched (with KEEP_SIZE) reads as zeros; the size stays.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    h.fallocate(a.ino, fh, 0, 2, punch).unwrap();
    assert_eq!(h.read(a.ino, fh, 0, 4).unwrap(), b"\0\0cd");
    assert_eq!(size(&h), 8192);
    // ZERO_RANGE zeroes, and extends the size past the end.
    h.fallocate(a.ino, fh, 2, 1, libc::FALLOC_FL_ZERO_RANGE)
        .unwrap();
    assert_eq!(h.read(a.ino, fh, 0, 4).unwrap(), b"\0\0\0d");
    h.fallocate(a.ino, fh, 8192, 100, libc::FALLOC_FL_ZERO_RANGE)
        .unwrap();
    assert_eq!(size(&h), 8292);
    // What deskfs does not take.
    for mode in [
        libc::FALLOC_FL_PUNCH_HOLE,
        libc::FALLOC_FL_COLLAPSE_RANGE,
        libc::FALLOC_FL_INSERT_RANGE,
        libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_COLLAPSE_RANGE,
    ] {
        assert_eq!(
            errno(h.fallocate(a.ino, fh, 0, 4096, mode)),
            libc::EOPNOTSUPP,
            "mode {mode:#x}"
        );
    }
    assert_eq!(
        errno(h.fallocate(a.ino, fh, crate::data::MAX_FILE_SIZE - 10, 11, 0)),
        libc::EFBIG
    );
    assert_eq!(errno(h.fallocate(a.ino, fh, u64::MAX, 2, 0)), libc::EFBIG);
    let ro = h.op(a.ino, libc::O_RDONLY);
    assert_eq!(errno(h.fallocate(a.ino, ro, 0, 10, 0)), libc::EBADF);
    let (b, fb) = h.create_rw(ROOT_INO, "g");
    assert_eq!(
        errno(h.fallocate(a.ino, fb, 0, 10, 0)),
        libc::EBADF,
        "another file's handle"
    );
    h.release(a.ino, ro).unwrap();
    h.release(b.ino, fb).unwrap();
    h.release(a.ino, fh).unwrap();
    let row = h.row(a.ino).unwrap();
    assert_eq!((row.size, row.dirty), (8292, true), "committed at close");
    let mut want = b"\0\0\0d".to_vec();
    want.resize(8292, 0);
    assert_eq!(h.cat(a.ino), want);
}

/// `fallocate` on a file whose content is committed and clean makes it dirty again (the
/// next upload carries it): the first change after a commit begins a dirty period.
#[test]
fn fallocate_of_a_clean_file_makes_it_dirty() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"abc");
    h.sync_all();
    assert!(!h.row(f.ino).unwrap().dirty);
    let fh = h.op(f.ino, libc::O_RDWR);
    h.fallocate(f.ino, fh, 0, 100, 0).unwrap();
    h.release(f.ino, fh).unwrap();
    let row = h.row(f.ino).unwrap();
    assert_eq!((row.size, row.dirty), (100, true));
    h.sync_all();
    let b = h.second_mount("cache-b");
    let mut want = b"abc".to_vec();
    want.resize(100, 0);
    let fb = b.open(&CTX, f.ino, libc::O_RDONLY).unwrap().fh;
    assert_eq!(
        b.read(f.ino, fb, 0, 4096).unwrap(),
        want,
        "the upload carried the new size"
    );
    b.release(f.ino, fb).unwrap();
}

/// `lseek` with `SEEK_DATA`/`SEEK_HOLE` (lseek(2)): local content answers from the staging
/// file's holes (the end of the file is a hole); past the end is `ENXIO`, as is a negative
/// offset; another `whence` is `EINVAL`. Content that is only in the bucket is one data
/// extent.
#[test]
fn lseek_finds_data_and_holes() {
    let h = Harness::new();
    let (a, fh) = h.create_rw(ROOT_INO, "sparse");
    const MIB: u64 = 1 << 20;
    h.write(a.ino, fh, 0, b"x").unwrap();
    h.write(a.ino, fh, MIB, b"y").unwrap();
    let size = (MIB + 1) as i64;
    let seek = |off: i64, whence| h.lseek(a.ino, fh, off, whence);
    assert_eq!(seek(0, libc::SEEK_DATA).unwrap(), 0);
    let hole = seek(0, libc::SEEK_HOLE).unwrap();
    assert!(hole > 0 && hole <= MIB as i64, "hole at {hole}");
    let data = seek(hole, libc::SEEK_DATA).unwrap();
    assert!(data > hole && data <= MIB as i64, "data at {data}");
    assert_eq!(
        seek(MIB as i64, libc::SEEK_HOLE).unwrap(),
        size,
        "the end of the file is a hole"
    );
    assert_eq!(errno(seek(size, libc::SEEK_DATA)), libc::ENXIO);
    assert_eq!(errno(seek(size, libc::SEEK_HOLE)), libc::ENXIO);
    assert_eq!(errno(seek(-1, libc::SEEK_DATA)), libc::ENXIO);
    assert_eq!(errno(seek(0, libc::SEEK_SET)), libc::EINVAL);
    assert_eq!(errno(seek(0, libc::SEEK_END)), libc::EINVAL);
    // Bytes written past a hole at the end of the staging file: no data after them.
    h.fallocate(a.ino, fh, 0, size as u64 + 4096, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(seek(size - 1, libc::SEEK_HOLE).unwrap(), size);
    h.release(a.ino, fh).unwrap();
    h.sync_all();
    // Another mount has the content in the bucket only: one extent.
    let b = h.second_mount("cache-b");
    let fb = b.open(&CTX, a.ino, libc::O_RDONLY).unwrap().fh;
    assert_eq!(b.lseek(a.ino, fb, 10, libc::SEEK_DATA).unwrap(), 10);
    assert_eq!(b.lseek(a.ino, fb, 10, libc::SEEK_HOLE).unwrap(), size);
    assert_eq!(
        errno(b.lseek(a.ino, fb, size, libc::SEEK_DATA)),
        libc::ENXIO
    );
    b.release(a.ino, fb).unwrap();
}

/// Access times at `open` (relatime, as ext4 keeps them): an open for reading of a file
/// changed since its last read moves atime to now — `getattr` shows it at once, the
/// kernel is told to drop its cached attributes, the next feed tick commits it — while
/// a write-only open, an `O_NOATIME` open and a second read leave it; a change counts
/// from this mount's uncommitted writes too.
#[test]
fn an_open_for_reading_moves_atime_by_relatime() {
    let h = Harness::new();
    let seen: Arc<std::sync::Mutex<Vec<crate::Invalidation>>> = Arc::default();
    let s = seen.clone();
    h.set_invalidator(Box::new(move |inv| s.lock().unwrap().push(inv.clone())));
    let f = h.file(ROOT_INO, "f", b"data");
    let atime = || h.getattr(f.ino).unwrap().atime_ns;
    let told =
        || std::mem::take(&mut *seen.lock().unwrap()).contains(&crate::Invalidation::Attrs(f.ino));
    let open_close = |flags: i32| {
        std::thread::sleep(Duration::from_millis(2));
        let fh = h.op(f.ino, flags);
        h.release(f.ino, fh).unwrap();
    };
    let a0 = atime();
    told();
    open_close(libc::O_WRONLY);
    assert_eq!(atime(), a0, "a write-only open is no access");
    open_close(libc::O_RDONLY | libc::O_NOATIME);
    assert_eq!(atime(), a0, "O_NOATIME");
    assert!(!told());
    open_close(libc::O_RDONLY);
    let a1 = atime();
    assert!(a1 > a0, "a read since the last change moves atime");
    assert!(told(), "the kernel's cached atime goes");
    open_close(libc::O_RDWR);
    assert_eq!(
        atime(),
        a1,
        "read since the last change: relatime leaves it"
    );
    assert!(!told());
    h.feed_round();
    assert_eq!(
        h.row(f.ino).unwrap().atime_ns,
        a1,
        "committed at the feed tick"
    );
    // Written here and not committed yet: that change counts.
    let w = h.op(f.ino, libc::O_WRONLY);
    std::thread::sleep(Duration::from_millis(2));
    h.put(f.ino, w, 0, b"DATA");
    open_close(libc::O_RDONLY);
    assert!(atime() > a1, "a read after uncommitted writes moves atime");
    h.release(f.ino, w).unwrap();
}

/// An empty file whose staging file is missing (a crash right after its create
/// committed, before the file was made) is written from empty at its first write: there
/// is no content to lose, so no error.
#[test]
fn an_empty_file_whose_staging_file_is_missing_is_written_from_empty() {
    let h = Harness::uploads_held();
    let (a, fh) = h.create_rw(ROOT_INO, "e");
    h.release(a.ino, fh).unwrap();
    assert!(h.row(a.ino).unwrap().dirty, "not uploaded");
    std::fs::remove_file(h.cache.staging_path(a.ino)).expect("remove the staging file");
    let fh = h.op(a.ino, libc::O_RDWR);
    assert_eq!(h.write(a.ino, fh, 0, b"x").unwrap(), 1);
    h.release(a.ino, fh).unwrap();
    assert_eq!(h.cat(a.ino), b"x");
}

/// A file with unuploaded content whose staging file vanished while mounted (removed by
/// hand from the cache dir) fails its next write with `EIO` at once: its content is
/// nowhere else, so there is nothing to wait for or download.
#[test]
fn unuploaded_content_whose_staging_file_vanished_fails_with_eio() {
    let h = Harness::with_config(VfsConfig {
        upload_delay: Duration::from_secs(3600),
        remote_wait: Duration::from_secs(3600),
        ..test_cfg()
    });
    let f = h.file(ROOT_INO, "gone", b"only here");
    assert!(h.row(f.ino).unwrap().dirty, "not uploaded");
    std::fs::remove_file(h.cache.staging_path(f.ino)).expect("remove the staging file");
    let fh = h.op(f.ino, libc::O_RDWR);
    assert_eq!(errno(h.write(f.ino, fh, 0, b"x")), libc::EIO);
    h.release(f.ino, fh).unwrap();
}

/// A staging file shorter than the file's size (cut behind the mount's back) reads as
/// zeros past its end, never as other bytes of the file: the read loop goes on from
/// where the short read ended.
#[test]
fn a_staging_file_shorter_than_the_file_reads_zeros_past_its_end() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"abcdefgh");
    std::fs::OpenOptions::new()
        .write(true)
        .open(h.cache.staging_path(f.ino))
        .unwrap()
        .set_len(4)
        .unwrap();
    let fh = h.op(f.ino, libc::O_RDONLY);
    assert_eq!(h.read(f.ino, fh, 2, 6).unwrap(), b"cd\0\0\0\0");
    // Wholly past its end: the first read returns nothing, and the loop ends there.
    assert_eq!(h.read(f.ino, fh, 5, 3).unwrap(), b"\0\0\0");
    h.release(f.ino, fh).unwrap();
}
