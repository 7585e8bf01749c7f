//! Rebuilding a namespace from the bucket's objects alone, when no backup can be used
//! (`deskfs fsck --rebuild-from-bucket`).
//!
//! What the objects carry is taken: paths, sizes, ETags, and the s3fs-style attributes
//! deskfs and s3fs write (mode with the file type, uid, gid, times; ns mtime when deskfs
//! wrote it); a symlink is an object whose mode says `S_IFLNK`, its body the target.
//! What objects cannot carry is reported, never guessed: hard-link identity (every name
//! becomes its own file), xattrs, names held in escaped keys (`.deskfs/escaped/`), and
//! the attributes of objects written without them (defaults are used and counted).

use std::collections::BTreeMap;
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
    let mut dirs: BTreeMap<Vec<u8>, Ino> = BTreeMap::new();
    dirs.insert(Vec::new(), ROOT_INO);
    let mut next: Ino = ROOT_INO + 1;
    let listing = rt.block_on(bucket.list_all(""))?;
    // Directories first (markers and key prefixes), so files land in them.
    let mut files = Vec::new();
    for o in listing {
        if o.key == ".deskfs" || o.key.starts_with(".deskfs/") {
            if o.key.starts_with(".deskfs/escaped/") {
                report.escaped_unnamed += 1;
            }
            continue;
        }
        report.objects += 1;
        let (dir_part, is_marker) = match o.key.strip_suffix('/') {
            Some(d) => (d.to_string(), true),
            None => (
                o.key
                    .rsplit_once('/')
                    .map(|(d, _)| d.to_string())
                    .unwrap_or_default(),
                false,
            ),
        };
        let mut path = Vec::new();
        for part in dir_part.split('/').filter(|p| !p.is_empty()) {
            let parent = dirs.get(&path).copied().unwrap_or(ROOT_INO);
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(part.as_bytes());
            if !dirs.contains_key(&path) {
                let ino = next;
                next += 1;
                model
                    .inodes
                    .insert(ino, dir_rec(ino, 0o755, uid, gid, o.mtime_ns));
                model
                    .dentries
                    .insert((parent, part.as_bytes().to_vec()), ino);
                dirs.insert(path.clone(), ino);
            }
        }
        if is_marker {
            if let Some(p) = rt.block_on(bucket.head(&o.key))?.and_then(|h| h.posix) {
                if let Some(ino) = dirs.get(path.as_slice()) {
                    if let Some(r) = model.inodes.get_mut(ino) {
                        r.perm = p.mode & 0o7777;
                        r.uid = p.uid;
                        r.gid = p.gid;
                        r.mtime_ns = p.mtime_ns;
                        r.ctime_ns = p.ctime_ns;
                        r.atime_ns = p.atime_ns;
                    }
                }
            }
            continue;
        }
        files.push(o);
    }
    for o in files {
        let (dir, name) = o.key.rsplit_once('/').unwrap_or(("", o.key.as_str()));
        let Some(parent) = dirs.get(dir.as_bytes()).copied() else {
            continue;
        };
        let mut name = name.as_bytes().to_vec();
        if dirs.contains_key(o.key.as_bytes()) {
            report.clashes.push(o.key.clone());
            name.extend_from_slice(b".deskfs-conflict-dir");
        }
        let head = rt.block_on(bucket.head(&o.key))?;
        let Some(h) = head else {
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
        if posix.is_some() {
            let ns_known = posix.is_some_and(|p| p.mtime_ns % 1_000_000_000 != 0);
            if !ns_known {
                report.mtime_seconds_only += 1;
            }
        }
        let target = if kind == Kind::Symlink {
            Some(
                rt.block_on(bucket.get_range(&o.key, 0..h.size, h.etag.as_deref()))?
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
            size: if kind == Kind::Symlink {
                target.as_ref().map_or(0, |t| t.len() as u64)
            } else {
                h.size
            },
            atime_ns: posix.map_or(mtime, |p| p.atime_ns),
            mtime_ns: mtime,
            ctime_ns: posix.map_or(mtime, |p| p.ctime_ns),
            btime_ns: mtime,
            data_version: 1,
            target,
        };
        let mut path = dir.as_bytes().to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(&name);
        model.objects.insert(
            path.clone(),
            ObjectRow {
                path,
                key: o.key.clone(),
                ino,
                kind,
                data_version: 1,
                meta_stamp: rec.ctime_ns,
                etag: h.etag.clone(),
                size: h.size,
            },
        );
        model.dentries.insert((parent, name), ino);
        match kind {
            Kind::Symlink => report.symlinks += 1,
            _ => report.files += 1,
        }
        model.inodes.insert(ino, rec);
    }
    report.dirs = dirs.len() as u64;
    model.recount();
    crate::restore::write_model(meta, &model, &Default::default())?;
    Ok(report)
}
