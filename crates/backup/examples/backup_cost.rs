//! What the bucket backup costs for a large workspace: builds a SQLite namespace of N
//! files (1,000 per directory, realistic names, one recorded object each, 1 % with an
//! xattr), then measures the snapshot (bytes, seconds), a delta after 1,000 changes, and
//! reading the backup back (seconds). Usage:
//!   cargo run --release -p deskfs-backup --example backup_cost -- [FILES] [DIR]
//! Prints one line per figure; used for the figures in docs/design/0004-bucket-backup.md.

use std::sync::Arc;
use std::time::Instant;

use deskfs_backup::restore::{load_newest, RestoreReport};
use deskfs_backup::writer::BackupWriter;
use deskfs_bucket::{Bucket, BucketSpec};
use deskfs_meta::sqlite::SqliteEngine;
use deskfs_meta::{InodeRow, Kind, Local, MetaEngine, ObjectRow, ROOT_INO};

fn row(kind: Kind, size: u64, t: i64) -> InodeRow {
    InodeRow {
        ino: 0,
        kind,
        perm: if kind == Kind::Dir { 0o755 } else { 0o644 },
        uid: 1000,
        gid: 1000,
        rdev: 0,
        nlink: if kind == Kind::Dir { 2 } else { 1 },
        size,
        atime_ns: t,
        mtime_ns: t,
        ctime_ns: t,
        btime_ns: t,
        data_version: 1,
        target: None,
        local: Local::None,
        dirty: false,
        listed_ns: i64::MAX,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let files: u64 = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let base = args
        .get(2)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("deskfs-backup-cost-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let meta: Arc<dyn MetaEngine> = Arc::new(SqliteEngine::create(&base.join("meta.db"), 0, 0, 1)?);
    let bucket = Bucket::open(
        &BucketSpec::parse(&format!("file://{}", base.join("bucket").display()))?,
        true,
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let t0 = Instant::now();
    let dirs = files.div_ceil(1000);
    let mut t = 1_764_000_000_000_000_000i64;
    for d in 0..dirs {
        deskfs_meta::txn(&*meta, |tx| {
            let dir = tx.insert_inode(&row(Kind::Dir, 0, t))?;
            let dname = format!("src/module-{d:05}");
            tx.insert_dentry(ROOT_INO, format!("module-{d:05}").as_bytes(), dir)?;
            for i in 0..1000.min(files - d * 1000) {
                t += 1_000_003;
                let name = format!("component_{i:04}_handler.rs");
                let ino = tx.insert_inode(&row(Kind::File, 4096 + i, t))?;
                tx.insert_dentry(dir, name.as_bytes(), ino)?;
                if i % 100 == 0 {
                    tx.set_xattr(ino, b"user.mime_type", b"text/x-rust")?;
                }
                let path = format!("{dname}/{name}");
                tx.put_object(&ObjectRow {
                    path: path.clone().into_bytes(),
                    key: path,
                    ino,
                    kind: Kind::File,
                    data_version: 1,
                    meta_stamp: t,
                    etag: Some(format!(
                        "\"{:032x}\"",
                        ino.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    )),
                    size: 4096 + i,
                })?;
            }
            Ok::<_, deskfs_meta::MetaError>(())
        })?;
    }
    println!(
        "namespace: {files} files in {dirs} dirs built in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let writer = BackupWriter::new(
        meta.clone(),
        bucket.clone(),
        rt.handle().clone(),
        "cost".into(),
        base.join("meta.db.backup-lock"),
    );
    let t0 = Instant::now();
    let out = writer.flush()?;
    println!(
        "snapshot: {} bytes ({:.1} bytes/file), {} records, {:.2} s, {} file(s) put",
        out.bytes,
        out.bytes as f64 / files as f64,
        out.records,
        t0.elapsed().as_secs_f64(),
        out.files
    );
    // 1,000 changes: 500 rewrites (size, mtime, new object version) and 500 creates.
    deskfs_meta::txn(&*meta, |tx| {
        for i in 0..500u64 {
            let ino = 3 + i * 7;
            if let Some(mut r) = tx.get_inode(ino)? {
                r.size += 1;
                r.mtime_ns += 1;
                r.data_version += 1;
                tx.update_inode(&r)?;
            }
        }
        for i in 0..500u64 {
            let ino = tx.insert_inode(&row(Kind::File, 10, t))?;
            tx.insert_dentry(ROOT_INO, format!("new-file-{i}.txt").as_bytes(), ino)?;
        }
        Ok::<_, deskfs_meta::MetaError>(())
    })?;
    let t0 = Instant::now();
    let out = writer.flush()?;
    println!(
        "delta after 1,000 changes: {} bytes ({:.1} bytes/change), {} records, {:.3} s",
        out.bytes,
        out.bytes as f64 / 1000.0,
        out.records,
        t0.elapsed().as_secs_f64()
    );
    if args.get(3).map(String::as_str) == Some("no-read") {
        std::fs::remove_dir_all(&base)?;
        return Ok(());
    }
    let t0 = Instant::now();
    let mut report = RestoreReport::default();
    let model = rt.block_on(load_newest(&bucket, &mut report))?;
    println!(
        "read back: {} inodes, {} entries, {} objects from generation {} + {} delta(s) in {:.2} s",
        model.inodes.len(),
        model.dentries.len(),
        model.objects.len(),
        report.generation,
        report.deltas,
        t0.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&base)?;
    Ok(())
}
