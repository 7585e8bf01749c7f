//! Rebuilding a workspace's metadata database from the bucket: the newest backup
//! generation, checked file by file against what the bucket holds now.
//!
//! For every regular file the backup names, the content the database will point at must
//! be in the bucket: the recorded object of its current version (same key, same ETag), or
//! else a newer object at its path (uploaded after the last backup, or written by another
//! tool: taken as the file's content, with its s3fs attributes when it has them), or else
//! an older recorded version (the newest writes never reached the bucket: reported). A
//! file with none of these is not created and is reported as lost — never a file whose
//! size or bytes the bucket cannot back. Objects the backup does not know (written after
//! it, or by other tools) are left to the importer: their directories are marked unlisted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use deskfs_bucket::{Bucket, ObjectInfo};
use deskfs_meta::{Ino, Kind, MetaEngine, ObjectRow, ROOT_INO};
use tokio::runtime::Handle;

use crate::file::{decode, FileKind};
use crate::layout::{generations, snapshot_key};
use crate::model::Model;
use crate::{now_ns, BackupError};

/// Rows written per transaction while filling the new database.
const WRITE_BATCH: usize = 5_000;

/// What a restore found and did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RestoreReport {
    /// Generation restored.
    pub generation: u64,
    /// Change mark the backup was at (snapshot plus the deltas applied).
    pub seq: u64,
    /// Deltas applied after the snapshot.
    pub deltas: u64,
    /// When the newest applied backup file was written, ns since the epoch.
    pub backup_time_ns: i64,
    /// Inodes restored, by kind.
    pub files: u64,
    /// Directories restored (root included).
    pub dirs: u64,
    /// Symlinks restored.
    pub symlinks: u64,
    /// FIFOs, sockets and devices restored.
    pub others: u64,
    /// Hard-linked inodes (more than one name).
    pub hard_links: u64,
    /// Inodes with xattrs.
    pub with_xattrs: u64,
    /// Files whose bucket object is newer than the backup (taken as their content).
    pub newer_in_bucket: Vec<String>,
    /// Files restored with an older version: their newest writes never reached the bucket.
    pub older_content: Vec<String>,
    /// Files not restored: no version of their content is in the bucket (deleted after
    /// the backup, or never uploaded).
    pub lost: Vec<String>,
    /// Objects the backup does not know (left to the importer: they appear as files).
    pub unknown_objects: u64,
    /// Generations or deltas that could not be used, and why.
    pub problems: Vec<String>,
}

/// Reads the newest usable generation into a [`Model`] (snapshot, then its deltas in
/// order while they chain). Errors: [`BackupError::NoBackup`] when no generation has a
/// readable snapshot.
pub async fn load_newest(
    bucket: &Bucket,
    report: &mut RestoreReport,
) -> Result<Model, BackupError> {
    let gens = generations(bucket).await?;
    if gens.is_empty() {
        return Err(BackupError::NoBackup(
            "the bucket holds no metadata backup (.deskfs/meta/)".into(),
        ));
    }
    for (gen, g) in gens.iter().rev() {
        if !g.snapshot {
            report.problems.push(format!(
                "generation {gen}: no snapshot (written by a crashed writer?)"
            ));
            continue;
        }
        let snap = match read_file(bucket, &snapshot_key(*gen)).await {
            Ok(d) if d.header.kind == FileKind::Snapshot => d,
            Ok(_) => {
                report
                    .problems
                    .push(format!("generation {gen}: snapshot has the wrong kind"));
                continue;
            }
            Err(e) => {
                report
                    .problems
                    .push(format!("generation {gen}: snapshot unusable: {e}"));
                continue;
            }
        };
        let mut model = Model::default();
        let mut seq = snap.header.to_seq;
        report.backup_time_ns = snap.header.written_ns;
        for r in snap.records {
            model.apply(r);
        }
        report.generation = *gen;
        for (to, key) in &g.deltas {
            if *to <= seq {
                continue; // written again after a crash: already covered
            }
            let d = match read_file(bucket, key).await {
                Ok(d) => d,
                Err(e) => {
                    report.problems.push(format!(
                        "delta {key} unusable ({e}); changes after mark {seq} come from the objects alone"
                    ));
                    break;
                }
            };
            if d.header.from_seq > seq || d.header.kind != FileKind::Delta {
                report.problems.push(format!(
                    "delta {key} starts after mark {} but the backup is at {seq}; later changes come from the objects alone",
                    d.header.from_seq
                ));
                break;
            }
            for r in d.records {
                model.apply(r);
            }
            seq = d.header.to_seq;
            report.deltas += 1;
            report.backup_time_ns = d.header.written_ns;
        }
        report.seq = seq;
        return Ok(model);
    }
    Err(BackupError::NoBackup(format!(
        "no usable metadata backup in the bucket ({})",
        report.problems.join("; ")
    )))
}

async fn read_file(bucket: &Bucket, key: &str) -> Result<crate::file::Decoded, BackupError> {
    let info = bucket
        .head(key)
        .await?
        .ok_or_else(|| BackupError::corrupt(format!("{key} vanished")))?;
    let data = bucket
        .get_range(key, 0..info.size, info.etag.as_deref())
        .await?;
    decode(&data)
}

/// Rebuilds the namespace of `model` into `meta` (a freshly created database: only its
/// root exists), checked against the objects in `bucket`. Returns the report.
pub fn restore_into(
    meta: &Arc<dyn MetaEngine>,
    bucket: &Bucket,
    rt: &Handle,
    mut model: Model,
    mut report: RestoreReport,
) -> Result<RestoreReport, BackupError> {
    let listing: HashMap<String, ObjectInfo> = rt
        .block_on(bucket.list_all(""))?
        .into_iter()
        .map(|o| (o.key.clone(), o))
        .collect();
    let paths = model.prune_and_count();
    check_contents(&mut model, &paths, bucket, rt, &listing, &mut report)?;
    let paths = model.prune_and_count();
    let unlisted = unknown_object_dirs(&model, &paths, &listing, &mut report);
    tally(&model, &mut report);
    write_model(meta, &model, &unlisted)?;
    Ok(report)
}

/// Whether the object recorded as `o` is in the listing as recorded.
fn present(o: &ObjectRow, listing: &HashMap<String, ObjectInfo>) -> bool {
    listing
        .get(&o.key)
        .is_some_and(|l| match (&o.etag, &l.etag) {
            (Some(a), Some(b)) => a == b,
            _ => l.size == o.size,
        })
}

/// Points every regular file at content the bucket holds (see the module doc), dropping
/// the files it cannot back.
fn check_contents(
    model: &mut Model,
    paths: &HashMap<Ino, Vec<u8>>,
    bucket: &Bucket,
    rt: &Handle,
    listing: &HashMap<String, ObjectInfo>,
    report: &mut RestoreReport,
) -> Result<(), BackupError> {
    let mut by_ino: HashMap<Ino, Vec<ObjectRow>> = HashMap::new();
    for o in model.objects.values() {
        if o.kind == Kind::File {
            by_ino.entry(o.ino).or_default().push(o.clone());
        }
    }
    let mut lost: HashSet<Ino> = HashSet::new();
    let mut new_objects: Vec<ObjectRow> = Vec::new();
    let files: Vec<Ino> = model
        .inodes
        .values()
        .filter(|r| r.kind == Kind::File)
        .map(|r| r.ino)
        .collect();
    for ino in files {
        let Some(rec) = model.inodes.get(&ino).cloned() else {
            continue;
        };
        let cands = by_ino.remove(&ino).unwrap_or_default();
        let path = paths.get(&ino).cloned().unwrap_or_default();
        let shown = String::from_utf8_lossy(&path).into_owned();
        let key = cands
            .iter()
            .find(|o| o.path == path)
            .map(|o| o.key.clone())
            .unwrap_or_else(|| String::from_utf8_lossy(&path).into_owned());
        let at_path = listing.get(&key);
        let recorded_at_path = at_path.is_some_and(|l| {
            cands
                .iter()
                .any(|o| o.key == key && l.etag.is_some() && o.etag == l.etag)
        });
        let newer_at_path = at_path.is_some() && !recorded_at_path;
        let exact = cands
            .iter()
            .any(|o| o.data_version == rec.data_version && present(o, listing));
        if exact || (rec.size == 0 && !newer_at_path) {
            continue;
        }
        if newer_at_path {
            let Some(h) = rt.block_on(bucket.head(&key))? else {
                lost.insert(ino);
                report.lost.push(shown);
                continue;
            };
            let r = model
                .inodes
                .get_mut(&ino)
                .ok_or_else(|| BackupError::corrupt("inode vanished during the restore"))?;
            r.size = h.size;
            r.data_version += 1;
            r.mtime_ns = h.posix.map_or(h.mtime_ns, |p| p.mtime_ns);
            r.ctime_ns = r.ctime_ns.max(r.mtime_ns);
            new_objects.push(ObjectRow {
                path: path.clone(),
                key: key.clone(),
                ino,
                kind: Kind::File,
                data_version: r.data_version,
                meta_stamp: r.ctime_ns,
                etag: h.etag,
                size: h.size,
            });
            report.newer_in_bucket.push(shown);
            continue;
        }
        // An older version the bucket still holds.
        if let Some(o) = cands
            .iter()
            .filter(|o| present(o, listing))
            .max_by_key(|o| o.data_version)
        {
            if let Some(r) = model.inodes.get_mut(&ino) {
                r.size = o.size;
                r.data_version = o.data_version;
            }
            report.older_content.push(shown);
            continue;
        }
        lost.insert(ino);
        report.lost.push(shown);
    }
    for o in new_objects {
        model.objects.insert(o.path.clone(), o);
    }
    if !lost.is_empty() {
        model.dentries.retain(|_, i| !lost.contains(i));
    }
    // Only objects that are in the bucket as recorded (or were just found) stay recorded.
    let kept: HashSet<Ino> = model.inodes.keys().copied().collect();
    model
        .objects
        .retain(|_, o| kept.contains(&o.ino) && (o.kind != Kind::File || present(o, listing)));
    Ok(())
}

/// Directories holding objects the backup does not know: they are listed again from the
/// bucket by the importer (`listed = 0`).
fn unknown_object_dirs(
    model: &Model,
    paths: &HashMap<Ino, Vec<u8>>,
    listing: &HashMap<String, ObjectInfo>,
    report: &mut RestoreReport,
) -> HashSet<Ino> {
    let known: HashSet<&str> = model.objects.values().map(|o| o.key.as_str()).collect();
    let mut by_path: BTreeMap<&[u8], Ino> = BTreeMap::new();
    for (ino, p) in paths {
        if model.inodes.get(ino).map(|r| r.kind) == Some(Kind::Dir) {
            by_path.insert(p.as_slice(), *ino);
        }
    }
    let mut out = HashSet::new();
    for key in listing.keys() {
        let k = key.trim_end_matches('/');
        if k.is_empty() || known.contains(k) || k == ".deskfs" || k.starts_with(".deskfs/") {
            continue;
        }
        // A directory marker of a directory the backup has is not news.
        if key.ends_with('/') && by_path.contains_key(k.as_bytes()) {
            continue;
        }
        report.unknown_objects += 1;
        // The deepest directory of the backup on the key's path gets listed again.
        let mut dir = ROOT_INO;
        let mut prefix = Vec::new();
        let parts: Vec<&str> = k.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(part.as_bytes());
            match by_path.get(prefix.as_slice()) {
                Some(i) => dir = *i,
                None => break,
            }
        }
        out.insert(dir);
    }
    out
}

fn tally(model: &Model, report: &mut RestoreReport) {
    let mut names: HashMap<Ino, u32> = HashMap::new();
    for i in model.dentries.values() {
        *names.entry(*i).or_default() += 1;
    }
    for r in model.inodes.values() {
        match r.kind {
            Kind::File => report.files += 1,
            Kind::Dir => report.dirs += 1,
            Kind::Symlink => report.symlinks += 1,
            _ => report.others += 1,
        }
        if r.kind != Kind::Dir && names.get(&r.ino).copied().unwrap_or(0) > 1 {
            report.hard_links += 1;
        }
    }
    report.with_xattrs = model.xattrs.len() as u64;
}

/// Writes the model into the (fresh) database, in batches, and forgets the change marks
/// the writes left (the next backup of this database starts with a snapshot).
pub(crate) fn write_model(
    meta: &Arc<dyn MetaEngine>,
    model: &Model,
    unlisted: &HashSet<Ino>,
) -> Result<(), BackupError> {
    let now = now_ns();
    let rows: Vec<_> = model
        .inodes
        .values()
        .map(|r| r.to_row(if unlisted.contains(&r.ino) { 0 } else { now }))
        .collect();
    for chunk in rows.chunks(WRITE_BATCH) {
        deskfs_meta::txn(&**meta, |t| {
            for r in chunk {
                t.put_inode_at(r)?;
            }
            Ok::<_, deskfs_meta::MetaError>(())
        })?;
    }
    let dentries: Vec<_> = model.dentries.iter().collect();
    for chunk in dentries.chunks(WRITE_BATCH) {
        deskfs_meta::txn(&**meta, |t| {
            for ((p, n), i) in chunk {
                t.insert_dentry(*p, n, **i)?;
            }
            Ok::<_, deskfs_meta::MetaError>(())
        })?;
    }
    let xattrs: Vec<_> = model.xattrs.iter().collect();
    for chunk in xattrs.chunks(WRITE_BATCH) {
        deskfs_meta::txn(&**meta, |t| {
            for (ino, attrs) in chunk {
                for (n, v) in attrs.iter() {
                    t.set_xattr(**ino, n, v)?;
                }
            }
            Ok::<_, deskfs_meta::MetaError>(())
        })?;
    }
    let objects: Vec<_> = model.objects.values().collect();
    for chunk in objects.chunks(WRITE_BATCH) {
        deskfs_meta::txn(&**meta, |t| {
            for o in chunk {
                t.put_object(o)?;
            }
            Ok::<_, deskfs_meta::MetaError>(())
        })?;
    }
    deskfs_meta::txn(&**meta, |t| {
        let end = t.backup_mark_end()?;
        t.trim_backup_marks(end)
    })?;
    Ok(())
}
