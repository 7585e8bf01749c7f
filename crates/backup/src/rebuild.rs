//! Rebuilding a namespace from the bucket's objects alone, when no backup can be used
//! (`deskfs fsck --rebuild-from-bucket`).
//!
//! What the objects carry is taken: paths, sizes, ETags, and the s3fs-style attributes
//! deskfs and s3fs write (mode with the file type, uid, gid, times; ns mtime when deskfs
//! wrote it); a symlink is an object whose mode says `S_IFLNK`, its body the target.
//! What objects cannot carry is reported, never guessed: hard-link identity (every name
//! becomes its own file), xattrs, names held in escaped keys (`.deskfs/escaped/`), and
//! the attributes of objects written without them (defaults are used and counted).

use std::sync::Arc;

use deskfs_bucket::Bucket;
use deskfs_meta::{Ino, Kind, MetaEngine, ObjectRow, ROOT_INO};
use tokio::runtime::Handle;

use crate::codec::InodeRec;
use crate::model::Model;
use crate::{now_ns, BackupError};

/// Symlink targets longer than this are not read (PATH_MAX).
const MAX_TARGET: u64 = 4096;

/// What a rebuild from objects found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RebuildReport {
    /// Objects seen (markers included, `.deskfs/` excluded).
    pub objects: u64,
    /// Regular files created.
    pub files: u64,
    /// Directories created (root included).
    pub dirs: u64,
    /// Symlinks created.
    pub symlinks: u64,
    /// Objects without POSIX attributes (mode 0644/0755, owner of the caller, object
    /// time used).
    pub without_attributes: u64,
    /// Objects whose mtime is known to the second only (s3fs-written).
    pub mtime_seconds_only: u64,
    /// Objects under escaped keys whose names only the backup knew (not restored).
    pub escaped_unnamed: u64,
    /// Paths that are both a file and a directory prefix (the file is kept under
    /// `NAME.deskfs-conflict-dir`).
    pub clashes: Vec<String>,
    /// What cannot be known without a backup (always the same list; printed for the user).
    pub unknowable: Vec<String>,
}

/// Builds the namespace the objects describe and writes it into `meta` (a fresh
/// database whose root exists), owned by `uid:gid` where objects carry no owner.
pub fn rebuild_into(
    meta: &Arc<dyn MetaEngine>,
    bucket: &Bucket,
    rt: &Handle,
    uid: u32,
    gid: u32,
) -> Result<RebuildReport, BackupError> {
    let mut report = RebuildReport {
        unknowable: vec![
            "hard-link identity: every name is its own file".into(),
            "extended attributes (xattrs)".into(),
            "names that S3 keys cannot hold (kept under .deskfs/escaped/)".into(),
            "FIFOs, sockets and device nodes (they have no objects)".into(),
        ],
        ..Default::default()
    };
    let now = now_ns();
    let mut model = Model::default();
    let dir_rec = |ino: Ino, perm: u32, uid: u32, gid: u32, t: i64| InodeRec {
        ino,
        kind: Kind::Dir,
        perm,
        uid,
        gid,
        rdev: 0,
        nlink: 2,
        size: 0,
        atime_ns: t,
        mtime_ns: t,
        ctime_ns: t,
        btime_ns: t,
        data_version: 0,
        target: None,
    };
    model
        .inodes
        .insert(ROOT_INO, dir_rec(ROOT_INO, 0o755, uid, gid, now));
    let mut next: Ino = ROOT_INO + 1;
    let mut dirs = 1u64;
    report.escaped_unnamed = rt.block_on(bucket.list_all(".deskfs/escaped"))?.len() as u64;
    // A walk by directory listings (with delimiter), so empty directories' markers are
    // seen as the prefixes they are.
    let mut queue: Vec<(String, Ino)> = vec![(String::new(), ROOT_INO)];
    while let Some((dkey, dino)) = queue.pop() {
        let listing = rt.block_on(bucket.list_dir(&dkey))?;
        let join = |name: &str| {
            if dkey.is_empty() {
                name.to_string()
            } else {
                format!("{dkey}/{name}")
            }
        };
        let dir_names: std::collections::HashSet<&str> =
            listing.dirs.iter().map(String::as_str).collect();
        for name in &listing.dirs {
            if dkey.is_empty() && name == ".deskfs" {
                continue;
            }
            let key = join(name);
            let ino = next;
            next += 1;
            dirs += 1;
            let mut rec = dir_rec(ino, 0o755, uid, gid, now);
            match rt.block_on(bucket.head_dir_marker(&key))? {
                Some(h) => match h.posix {
                    Some(p) => {
                        rec.perm = p.mode & 0o7777;
                        rec.uid = p.uid;
                        rec.gid = p.gid;
                        rec.mtime_ns = p.mtime_ns;
                        rec.atime_ns = p.atime_ns;
                        rec.ctime_ns = p.ctime_ns;
                        rec.btime_ns = p.mtime_ns;
                    }
                    None => report.without_attributes += 1,
                },
                // A directory that is only a key prefix: nothing to read attributes from.
                None => report.without_attributes += 1,
            }
            report.objects += 1;
            model.inodes.insert(ino, rec);
            model.dentries.insert((dino, name.as_bytes().to_vec()), ino);
            queue.push((key, ino));
        }
        for (name, info) in &listing.files {
            if dkey.is_empty() && name == ".deskfs" {
                continue;
            }
            report.objects += 1;
            let key = info.key.clone();
            let mut entry = name.as_bytes().to_vec();
            if dir_names.contains(name.as_str()) {
                report.clashes.push(key.clone());
                entry.extend_from_slice(b".deskfs-conflict-dir");
            }
            let Some(h) = rt.block_on(bucket.head(&key))? else {
                continue; // deleted meanwhile
            };
            let posix = h.posix;
            let mode = match posix {
                Some(p) => p.mode,
                None => {
                    report.without_attributes += 1;
                    0o100644
                }
            };
            let kind = match Kind::from_mode(mode) {
                Some(Kind::Symlink) if h.size <= MAX_TARGET => Kind::Symlink,
                _ => Kind::File,
            };
            if posix.is_some_and(|p| p.mtime_ns % 1_000_000_000 == 0) {
                report.mtime_seconds_only += 1;
            }
            let target = if kind == Kind::Symlink {
                Some(
                    rt.block_on(bucket.get_range(&key, 0..h.size, h.etag.as_deref()))?
                        .to_vec(),
                )
            } else {
                None
            };
            let mtime = posix.map_or(h.mtime_ns, |p| p.mtime_ns);
            let ino = next;
            next += 1;
            let rec = InodeRec {
                ino,
                kind,
                perm: if posix.is_some() {
                    mode & 0o7777
                } else {
                    0o644
                },
                uid: posix.map_or(uid, |p| p.uid),
                gid: posix.map_or(gid, |p| p.gid),
                rdev: 0,
                nlink: 1,
                size: match &target {
                    Some(t) => t.len() as u64,
                    None => h.size,
                },
                atime_ns: posix.map_or(mtime, |p| p.atime_ns),
                mtime_ns: mtime,
                ctime_ns: posix.map_or(mtime, |p| p.ctime_ns),
                btime_ns: mtime,
                data_version: 1,
                target,
            };
            let mut path = if dkey.is_empty() {
                Vec::new()
            } else {
                let mut p = dkey.as_bytes().to_vec();
                p.push(b'/');
                p
            };
            path.extend_from_slice(&entry);
            model.objects.insert(
                path.clone(),
                ObjectRow {
                    path,
                    key,
                    ino,
                    kind,
                    data_version: 1,
                    meta_stamp: rec.ctime_ns,
                    etag: h.etag.clone(),
                    size: h.size,
                },
            );
            model.dentries.insert((dino, entry), ino);
            match kind {
                Kind::Symlink => report.symlinks += 1,
                _ => report.files += 1,
            }
            model.inodes.insert(ino, rec);
        }
    }
    report.dirs = dirs;
    model.recount();
    crate::restore::write_model(meta, &model, &Default::default())?;
    Ok(report)
}
