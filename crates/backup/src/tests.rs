//! The writer and the restore against a real SQLite database and a real local bucket.

use std::sync::Arc;

use bytes::Bytes;
use deskfs_bucket::{Bucket, BucketSpec};
use deskfs_meta::sqlite::SqliteEngine;
use deskfs_meta::{Ino, InodeRow, Kind, Local, MetaEngine, MetaTxn, ObjectRow, ROOT_INO};

use crate::layout::{generations, snapshot_key};
use crate::model::Model;
use crate::restore::{load_newest, restore_into, RestoreReport};
use crate::writer::{BackupWriter, MAX_DELTAS};

struct World {
    dir: tempfile::TempDir,
    meta: Arc<dyn MetaEngine>,
    bucket: Bucket,
    rt: tokio::runtime::Runtime,
}

fn world() -> World {
    let dir = tempfile::tempdir().expect("tempdir");
    let meta: Arc<dyn MetaEngine> =
        Arc::new(SqliteEngine::create(&dir.path().join("meta.db"), 0, 0, 1).expect("db"));
    let spec = BucketSpec::parse(&format!("file://{}", dir.path().join("bucket").display()))
        .expect("spec");
    let bucket = Bucket::open(&spec, true).expect("bucket");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");
    World {
        dir,
        meta,
        bucket,
        rt,
    }
}

impl World {
    fn writer(&self) -> BackupWriter {
        BackupWriter::new(
            self.meta.clone(),
            self.bucket.clone(),
            self.rt.handle().clone(),
            "ws".into(),
            self.dir.path().join("meta.db.backup-lock"),
        )
    }

    /// A regular file `parent/name` with `data`, uploaded and recorded.
    fn file(&self, parent: Ino, name: &str, path: &str, data: &[u8], mode: u32) -> Ino {
        let put = self
            .rt
            .block_on(
                self.bucket
                    .put_bytes(path, Bytes::copy_from_slice(data), None),
            )
            .expect("put");
        deskfs_meta::txn(&*self.meta, |t| {
            let ino = t.insert_inode(&row(Kind::File, mode, data.len() as u64))?;
            t.insert_dentry(parent, name.as_bytes(), ino)?;
            t.put_object(&ObjectRow {
                path: path.as_bytes().to_vec(),
                key: path.into(),
                ino,
                kind: Kind::File,
                data_version: 1,
                meta_stamp: 0,
                etag: put.etag.clone(),
                size: data.len() as u64,
            })?;
            Ok::<_, deskfs_meta::MetaError>(ino)
        })
        .expect("file")
    }

    fn dir(&self, parent: Ino, name: &str) -> Ino {
        deskfs_meta::txn(&*self.meta, |t| {
            let ino = t.insert_inode(&row(Kind::Dir, 0o750, 0))?;
            t.insert_dentry(parent, name.as_bytes(), ino)?;
            Ok::<_, deskfs_meta::MetaError>(ino)
        })
        .expect("dir")
    }

    /// Restores the bucket's newest backup into a fresh database; returns it and the report.
    fn restore(&self) -> (Arc<dyn MetaEngine>, RestoreReport, tempfile::TempDir) {
        let d2 = tempfile::tempdir().expect("tempdir");
        let fresh: Arc<dyn MetaEngine> =
            Arc::new(SqliteEngine::create(&d2.path().join("meta.db"), 0, 0, 1).expect("db"));
        let mut report = RestoreReport::default();
        let model = self
            .rt
            .block_on(load_newest(&self.bucket, &mut report))
            .expect("load");
        let report =
            restore_into(&fresh, &self.bucket, self.rt.handle(), model, report).expect("restore");
        (fresh, report, d2)
    }
}

fn row(kind: Kind, perm: u32, size: u64) -> InodeRow {
    InodeRow {
        ino: 0,
        kind,
        perm,
        uid: 1000,
        gid: 100,
        rdev: 0,
        nlink: if kind == Kind::Dir { 2 } else { 1 },
        size,
        atime_ns: 5,
        mtime_ns: 1_700_000_000_123_456_789,
        ctime_ns: 7,
        btime_ns: 8,
        data_version: 1,
        target: None,
        local: Local::None,
        dirty: false,
        listed_ns: i64::MAX,
    }
}

/// The namespace of a database as a comparable model (inodes without bookkeeping,
/// entries, xattrs).
fn model_of(meta: &dyn MetaEngine) -> Model {
    deskfs_meta::read(meta, |t: &mut dyn MetaTxn| {
        let mut m = Model::default();
        for r in t.scan_inodes(0, usize::MAX >> 1)? {
            let x = t.xattrs_of(r.ino)?;
            if !x.is_empty() {
                m.xattrs.insert(r.ino, x);
            }
            m.inodes.insert(r.ino, crate::codec::InodeRec::of(&r));
        }
        for d in t.scan_dentries(0, usize::MAX >> 1)? {
            m.dentries.insert((d.parent, d.name), d.ino);
        }
        Ok::<_, deskfs_meta::MetaError>(m)
    })
    .expect("model")
}

fn assert_same_namespace(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    let (mut x, y) = (model_of(a), model_of(b));
    // The root's times are the rebuilt database's own until the backup's root replaced it.
    x.recount();
    assert_eq!(x.inodes, y.inodes, "inodes differ");
    assert_eq!(x.dentries, y.dentries, "entries differ");
    assert_eq!(x.xattrs, y.xattrs, "xattrs differ");
}

/// A snapshot, then deltas of creates, a rename, an unlink, a chmod and xattrs: the
/// rebuilt namespace equals the original, inode numbers included; a hard link stays one
/// inode with two names.
#[test]
fn snapshot_plus_deltas_rebuild_the_namespace_exactly() {
    let w = world();
    let d = w.dir(ROOT_INO, "d");
    let f = w.file(d, "a", "d/a", b"alpha", 0o640);
    let writer = w.writer();
    let out = writer.flush().expect("flush");
    assert!(out.snapshot, "the first flush writes a snapshot");
    // Changes after the snapshot: only deltas.
    let g = w.file(ROOT_INO, "g", "g", b"gamma", 0o4755);
    deskfs_meta::txn(&*w.meta, |t| {
        t.insert_dentry(ROOT_INO, b"g-link", g)?;
        let mut r = t.get_inode(g)?.expect("g");
        r.nlink = 2;
        t.update_inode(&r)?;
        t.set_xattr(f, b"user.k", b"v\x00w")?;
        t.move_dentry(d, b"a", ROOT_INO, b"a-moved")?;
        let mut r = t.get_inode(d)?.expect("d");
        r.perm = 0o1777;
        t.update_inode(&r)?;
        Ok::<_, deskfs_meta::MetaError>(())
    })
    .expect("changes");
    let h = w.file(ROOT_INO, "h", "h", b"doomed", 0o644);
    deskfs_meta::txn(&*w.meta, |t| {
        t.delete_dentry(ROOT_INO, b"h")?;
        t.delete_inode(h)?;
        t.delete_object(b"h")
    })
    .expect("unlink");
    let out = writer.flush().expect("flush");
    assert!(!out.snapshot && out.files == 1, "{out:?}");
    let (fresh, report, _d) = w.restore();
    assert_eq!(report.deltas, 1);
    assert!(report.lost.is_empty(), "{report:?}");
    assert_eq!(report.hard_links, 1);
    assert_same_namespace(&*w.meta, &*fresh);
    // Nothing is left to back up in the rebuilt database's marks but its own snapshot.
    let end = deskfs_meta::read(&*fresh, |t| t.backup_marks(0, 10)).expect("marks");
    assert!(end.is_empty(), "restore left change marks: {end:?}");
}

/// A file whose content never reached the bucket is reported as lost and not created;
/// one whose object was replaced by a newer upload gets the newer content's size.
#[test]
fn content_the_bucket_cannot_back_is_reported_never_invented() {
    let w = world();
    w.file(ROOT_INO, "kept", "kept", b"kept", 0o644);
    let lost = w.file(ROOT_INO, "lost", "lost", b"short", 0o644);
    w.file(ROOT_INO, "newer", "newer", b"old", 0o644);
    w.writer().flush().expect("flush");
    // "lost": its object disappears; "newer": replaced in the bucket after the backup.
    w.rt.block_on(w.bucket.delete("lost")).expect("delete");
    w.rt.block_on(
        w.bucket
            .put_bytes("newer", Bytes::from_static(b"much newer content"), None),
    )
    .expect("put");
    let (fresh, report, _d) = w.restore();
    assert_eq!(report.lost, vec!["lost".to_string()]);
    assert_eq!(report.newer_in_bucket, vec!["newer".to_string()]);
    let m = model_of(&*fresh);
    assert!(!m.inodes.contains_key(&lost), "a lost file was created");
    let newer = m
        .dentries
        .get(&(ROOT_INO, b"newer".to_vec()))
        .and_then(|i| m.inodes.get(i))
        .expect("newer");
    assert_eq!(newer.size, 18);
    let o = deskfs_meta::read(&*fresh, |t| {
        t.object_with_content(newer.ino, newer.data_version)
    })
    .expect("read");
    assert!(
        o.is_some(),
        "the newer content is not recorded as the file's object"
    );
}

/// Deltas past the compaction limit start a new generation; generations older than the
/// previous one are deleted; a restore reads the newest.
#[test]
fn compaction_starts_generations_and_prunes_old_ones() {
    let w = world();
    let writer = w.writer();
    writer.flush().expect("first snapshot");
    for round in 0..(MAX_DELTAS * 2 + 3) {
        w.dir(ROOT_INO, &format!("d{round}"));
        writer.flush().expect("flush");
    }
    let gens = w.rt.block_on(generations(&w.bucket)).expect("generations");
    let numbers: Vec<u64> = gens.keys().copied().collect();
    assert_eq!(numbers.len(), 2, "kept generations: {numbers:?}");
    assert_eq!(
        numbers[1], 3,
        "two compactions after the first snapshot: {numbers:?}"
    );
    let (fresh, report, _d) = w.restore();
    assert_eq!(report.generation, 3);
    assert_same_namespace(&*w.meta, &*fresh);
}

/// A damaged delta stops the chain there (reported); a damaged snapshot makes the
/// restore use the previous generation: never a half-applied file.
#[test]
fn a_damaged_file_is_refused_whole() {
    let w = world();
    let writer = w.writer();
    w.dir(ROOT_INO, "before");
    writer.flush().expect("snapshot");
    w.dir(ROOT_INO, "in-delta");
    writer.flush().expect("delta");
    let gens = w.rt.block_on(generations(&w.bucket)).expect("gens");
    let (gen, g) = gens.iter().next_back().expect("a generation");
    let (_, key) = g.deltas.iter().next().expect("a delta");
    let path = w.dir.path().join("bucket").join(key);
    let mut data = std::fs::read(&path).expect("read");
    let mid = data.len() / 2;
    data[mid] ^= 0x55;
    std::fs::write(&path, &data).expect("write");
    let mut report = RestoreReport::default();
    let model =
        w.rt.block_on(load_newest(&w.bucket, &mut report))
            .expect("load");
    assert!(
        report.problems.iter().any(|p| p.contains("damaged")),
        "{report:?}"
    );
    assert!(model.dentries.contains_key(&(ROOT_INO, b"before".to_vec())));
    assert!(!model
        .dentries
        .contains_key(&(ROOT_INO, b"in-delta".to_vec())));
    // Damage the snapshot too: no generation is usable any more.
    let snap = w.dir.path().join("bucket").join(snapshot_key(*gen));
    let mut data = std::fs::read(&snap).expect("read");
    data[20] ^= 1;
    std::fs::write(&snap, &data).expect("write");
    let mut report = RestoreReport::default();
    let r = w.rt.block_on(load_newest(&w.bucket, &mut report));
    assert!(matches!(r, Err(crate::BackupError::NoBackup(_))), "{r:?}");
}

/// A flush that failed after its file reached the bucket (crash before the marks were
/// trimmed) writes the same changes again: applying states twice is harmless.
#[test]
fn a_repeated_delta_is_harmless() {
    let w = world();
    let writer = w.writer();
    writer.flush().expect("snapshot");
    w.dir(ROOT_INO, "x");
    writer.flush().expect("delta");
    // Pretend the trim never happened: put the position back.
    deskfs_meta::txn(&*w.meta, |t| t.set_kv("backup.seq", "0")).expect("rewind");
    let n = deskfs_meta::read(&*w.meta, |t| t.backup_marks(0, 100))
        .expect("marks")
        .len();
    assert_eq!(n, 0, "marks were trimmed");
    w.dir(ROOT_INO, "y");
    writer.flush().expect("delta again");
    let (fresh, _report, _d) = w.restore();
    assert_same_namespace(&*w.meta, &*fresh);
}

/// Three mounts of one database renew the same lease record at once (the 86 failure):
/// none of them may take the lost race for a takeover. A renewal after another database
/// attached must fail.
#[test]
fn mounts_of_one_database_renew_the_lease_together() {
    use crate::lease::{self, LeaseState};
    let w = world();
    let held: Vec<_> = (0..3)
        .map(|_| {
            w.rt.block_on(lease::take_for_mount(&w.bucket, "ws", "db-a"))
                .expect("take")
        })
        .collect();
    let bucket = w.bucket.clone();
    let results = w.rt.block_on(async move {
        let mut tasks = Vec::new();
        for mut h in held {
            let b = bucket.clone();
            tasks.push(tokio::spawn(async move {
                let mut r = Vec::new();
                for _ in 0..20 {
                    r.push(
                        h.renew(&b, LeaseState::Mounted)
                            .await
                            .map_err(|e| e.to_string()),
                    );
                }
                (h, r)
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("join"));
        }
        out
    });
    let mut held = Vec::new();
    for (h, r) in results {
        for x in &r {
            assert!(
                x.is_ok(),
                "a renewal by a mount of the owning database failed: {x:?}"
            );
        }
        held.push(h);
    }
    w.rt.block_on(lease::take_for_attach(&w.bucket, "ws", "db-b", true))
        .expect("take over");
    let err =
        w.rt.block_on(held[0].renew(&w.bucket, LeaseState::Mounted))
            .expect_err("a stale database must lose the lease");
    assert!(err.to_string().contains("taken over"), "{err}");
}
