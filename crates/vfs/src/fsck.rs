//! `fsck`: checks an unmounted workspace — the namespace in the metadata engine, and the
//! links between metadata, cache (staging files) and bucket (recorded objects) — and
//! repairs what it can. POSIX invariants checked here are the same the VFS maintains:
//! every dentry names an existing inode inside an existing directory; a non-directory's
//! nlink equals its number of names; a directory has exactly one name (the root none) and
//! nlink = 2 + subdirectories; every directory is reachable from the root.

use std::collections::{HashMap, HashSet, VecDeque};

use deskfs_bucket::Bucket;
use deskfs_cache::Cache;
use deskfs_meta::{Dentry, Ino, InodeRow, Kind, Local, MetaEngine, ROOT_INO};
use serde::Serialize;

use crate::paths::{dir_path, join};
use crate::{now_ns, Result};

/// One problem found.
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    /// Short machine-friendly class, e.g. `dangling-dentry`.
    pub kind: &'static str,
    /// What was found, for people.
    pub detail: String,
    /// Whether `--repair` fixed it.
    pub repaired: bool,
}

/// What fsck found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FsckReport {
    /// Inodes checked.
    pub inodes: u64,
    /// Directory entries checked.
    pub dentries: u64,
    /// Bucket objects checked (with `check_bucket`).
    pub objects_checked: u64,
    /// Problems, repaired or not.
    pub problems: Vec<Problem>,
    /// Expected leftovers of a crash that the next mount settles by itself (an open
    /// unlinked file, a staging file longer than its last commit, uploads still queued);
    /// `--repair` settles them now. Not problems.
    pub notes: Vec<Problem>,
}

impl FsckReport {
    /// Problems that remain (not repaired).
    pub fn unrepaired(&self) -> usize {
        self.problems.iter().filter(|p| !p.repaired).count()
    }
}

/// Options of a check.
#[derive(Clone, Copy, Debug, Default)]
pub struct FsckOptions {
    /// Fix what can be fixed.
    pub repair: bool,
    /// Also HEAD every recorded object of a clean file and compare its size.
    pub check_bucket: bool,
}

const BATCH: usize = 4096;

/// Checks (and with `opts.repair`, repairs) the workspace. `progress` is called with a
/// short phase description. The workspace must not be mounted. Errors: engine or cache
/// I/O failures ([`crate::VfsError`]); problems found are in the report, not errors.
pub fn fsck(
    meta: &dyn MetaEngine,
    cache: &Cache,
    bucket: Option<(&Bucket, &tokio::runtime::Handle)>,
    opts: FsckOptions,
    progress: &dyn Fn(&str),
) -> Result<FsckReport> {
    let mut rep = FsckReport::default();
    // Content held in this cache dir; other caches' (other hosts') content is theirs.
    let here = Local::At(cache.id());
    let add = |rep: &mut FsckReport, kind: &'static str, detail: String, repaired: bool| {
        rep.problems.push(Problem {
            kind,
            detail,
            repaired,
        });
    };

    progress("reading inodes");
    let mut inodes: HashMap<Ino, InodeRow> = HashMap::new();
    let mut after = 0;
    loop {
        let rows = deskfs_meta::read(meta, |t| t.scan_inodes(after, BATCH))?;
        let Some(last) = rows.last() else { break };
        after = last.ino;
        for r in rows {
            inodes.insert(r.ino, r);
        }
    }
    rep.inodes = inodes.len() as u64;
    progress("reading directory entries");
    let mut dentries: Vec<Dentry> = Vec::new();
    let mut after = 0;
    loop {
        let rows = deskfs_meta::read(meta, |t| t.scan_dentries(after, BATCH))?;
        let Some(last) = rows.last() else { break };
        after = last.cookie;
        dentries.extend(rows);
    }
    rep.dentries = dentries.len() as u64;

    match inodes.get(&ROOT_INO) {
        Some(r) if r.kind == Kind::Dir => {}
        _ => {
            add(
                &mut rep,
                "root-missing",
                "the root directory (inode 1) is missing or not a directory; rebuild the workspace"
                    .into(),
                false,
            );
            return Ok(rep);
        }
    }

    progress("checking the namespace");
    // Dentries pointing nowhere or living in non-directories.
    let mut good: Vec<&Dentry> = Vec::new();
    let mut bad: Vec<&Dentry> = Vec::new();
    for d in &dentries {
        let parent_ok = inodes.get(&d.parent).is_some_and(|p| p.kind == Kind::Dir);
        let child_ok = inodes.contains_key(&d.ino) && d.ino != ROOT_INO;
        if parent_ok && child_ok {
            good.push(d);
        } else {
            bad.push(d);
        }
    }
    for d in &bad {
        add(
            &mut rep,
            "dangling-dentry",
            format!(
                "entry {:?} in inode {} names inode {} (missing parent or child)",
                String::from_utf8_lossy(&d.name),
                d.parent,
                d.ino
            ),
            opts.repair,
        );
    }
    if opts.repair && !bad.is_empty() {
        let bad: Vec<(Ino, Vec<u8>)> = bad.iter().map(|d| (d.parent, d.name.clone())).collect();
        deskfs_meta::txn(meta, |t| {
            for (p, n) in &bad {
                t.delete_dentry(*p, n)?;
            }
            Ok::<_, crate::VfsError>(())
        })?;
    }
    // Link counts and directory shape.
    let mut names: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    let mut children: HashMap<Ino, Vec<Ino>> = HashMap::new();
    for d in &good {
        *names.entry(d.ino).or_default() += 1;
        if inodes[&d.ino].kind == Kind::Dir {
            *subdirs.entry(d.parent).or_default() += 1;
        }
        children.entry(d.parent).or_default().push(d.ino);
    }
    // Reachability from the root.
    let mut reached: HashSet<Ino> = HashSet::new();
    let mut queue = VecDeque::from([ROOT_INO]);
    while let Some(i) = queue.pop_front() {
        if !reached.insert(i) {
            continue;
        }
        for c in children.get(&i).into_iter().flatten() {
            queue.push_back(*c);
        }
    }
    let mut nlink_fixes: Vec<(Ino, u32)> = Vec::new();
    let mut orphans: Vec<Ino> = Vec::new();
    let mut ids: Vec<&Ino> = inodes.keys().collect();
    ids.sort();
    for ino in ids {
        let r = &inodes[ino];
        let n = names.get(ino).copied().unwrap_or(0);
        if r.kind == Kind::Dir {
            let want = 2 + subdirs.get(ino).copied().unwrap_or(0);
            if *ino != ROOT_INO && n > 1 {
                add(
                    &mut rep,
                    "dir-hardlink",
                    format!("directory inode {ino} has {n} names"),
                    false,
                );
            }
            if *ino != ROOT_INO && n == 0 {
                add(
                    &mut rep,
                    "lost-directory",
                    format!("directory inode {ino} has no name"),
                    opts.repair,
                );
                orphans.push(*ino);
                continue;
            }
            if r.nlink != want {
                add(
                    &mut rep,
                    "nlink",
                    format!(
                        "directory inode {ino}: nlink {} but {} expected",
                        r.nlink, want
                    ),
                    opts.repair,
                );
                nlink_fixes.push((*ino, want));
            }
            if *ino != ROOT_INO && n > 0 && !reached.contains(ino) {
                add(
                    &mut rep,
                    "unreachable",
                    format!("directory inode {ino} is not reachable from the root (cycle)"),
                    false,
                );
            }
        } else {
            if n == 0 {
                let p = Problem {
                    kind: "orphan",
                    detail: format!("inode {ino} ({:?}, {} bytes) has no name", r.kind, r.size),
                    repaired: opts.repair,
                };
                if r.nlink == 0 {
                    // Unlinked while open when the daemon stopped: purged at the next mount.
                    rep.notes.push(p);
                } else {
                    rep.problems.push(p);
                }
                orphans.push(*ino);
                continue;
            }
            if r.nlink != n {
                add(
                    &mut rep,
                    "nlink",
                    format!("inode {ino}: nlink {} but {n} names", r.nlink),
                    opts.repair,
                );
                nlink_fixes.push((*ino, n));
            }
        }
    }
    if opts.repair && (!nlink_fixes.is_empty() || !orphans.is_empty()) {
        deskfs_meta::txn(meta, |t| {
            for (ino, n) in &nlink_fixes {
                t.set_nlink(*ino, *n)?;
            }
            for ino in &orphans {
                t.delete_inode(*ino)?;
            }
            Ok::<_, crate::VfsError>(())
        })?;
        for ino in &orphans {
            cache.remove_staging(*ino)?;
            cache.drop_blocks(*ino);
            inodes.remove(ino);
        }
    }

    progress("checking staging files");
    // The last mount of this cache dir died (kill -9, power loss) and none has recovered
    // since: what that recovery settles is a note, not a problem.
    let crashed = crate::mount_marker::unclean_end(cache.root())?;
    let staged: HashSet<Ino> = cache.staging_inodes()?.into_iter().collect();
    for ino in &staged {
        let keep = inodes.get(ino).is_some_and(|r| r.local == here);
        if !keep {
            // Left by a crash between a delete's commit and the file's removal (or an
            // interrupted download): the next mount removes it.
            rep.notes.push(Problem {
                kind: "stray-staging",
                detail: format!("staging file of inode {ino} belongs to no local inode"),
                repaired: opts.repair,
            });
            if opts.repair {
                cache.remove_staging(*ino)?;
            }
        }
    }
    let mut ids: Vec<Ino> = inodes.keys().copied().collect();
    ids.sort();
    for ino in ids {
        let r = inodes[&ino].clone();
        if r.kind != Kind::File || r.nlink == 0 {
            continue;
        }
        let staging = cache.staging_path(ino);
        let len = std::fs::metadata(&staging).ok().map(|m| m.len());
        if r.local == here {
            match len {
                None if r.dirty && r.size > 0 && crashed => {
                    // A power loss kept the commit of a file never fsynced but not its
                    // staging file's name: recovery at the next mount leaves it empty
                    // (`Vfs::recover`), as ext4 leaves such a file.
                    rep.notes.push(Problem {
                        kind: "unflushed-content-lost",
                        detail: format!("inode {ino}: its {} unuploaded bytes were never fsynced and a crash took its staging file; the next mount leaves it empty", r.size),
                        repaired: opts.repair,
                    });
                    if opts.repair {
                        crate::crash_adopt::adopt_staging(meta, cache, here, &r)?;
                    }
                }
                None if r.dirty && r.size > 0 => add(
                    &mut rep,
                    "dirty-data-missing",
                    format!("inode {ino} has {} unuploaded bytes but no staging file in {} (mounted with another --cache-dir?)", r.size, cache.root().display()),
                    false,
                ),
                None => {
                    let p = Problem {
                        kind: "staging-missing",
                        detail: format!("inode {ino} ({} bytes) is marked local but has no staging file", r.size),
                        repaired: opts.repair,
                    };
                    if r.size == 0 {
                        // Crash between a create's commit and its (empty) staging file.
                        rep.notes.push(p);
                    } else {
                        rep.problems.push(p);
                    }
                    if opts.repair {
                        deskfs_meta::txn(meta, |t| {
                            if let Some(mut cur) = t.get_inode(ino)? {
                                cur.local = Local::None;
                                if cur.size == 0 {
                                    cur.dirty = true;
                                    cur.local = here;
                                }
                                t.update_inode(&cur)?;
                            }
                            Ok::<_, crate::VfsError>(())
                        })?;
                        if r.size == 0 {
                            cache.open_staging(ino, true)?;
                        }
                    }
                }
                Some(l) if l != r.size && r.dirty => {
                    // Writes that reached the staging file after the last commit: the next
                    // mount adopts them (crash recovery).
                    rep.notes.push(Problem {
                        kind: "staging-size",
                        detail: format!("inode {ino}: staging file is {l} bytes, last commit says {}", r.size),
                        repaired: opts.repair,
                    });
                    if opts.repair {
                        adopt_staging(meta, ino, l)?;
                    }
                }
                Some(l) if l != r.size => {
                    add(&mut rep, "staging-size", format!("inode {ino}: clean staging copy is {l} bytes, metadata says {}", r.size), opts.repair);
                    if opts.repair {
                        cache.remove_staging(ino)?;
                        deskfs_meta::txn(meta, |t| {
                            if let Some(mut cur) = t.get_inode(ino)? {
                                cur.local = Local::None;
                                t.update_inode(&cur)?;
                            }
                            Ok::<_, crate::VfsError>(())
                        })?;
                    }
                }
                Some(_) => {}
            }
        }
        if !r.dirty && r.size > 0 {
            let obj = deskfs_meta::read(meta, |t| t.object_with_content(ino, r.data_version))?;
            let local = r.local == here && len == Some(r.size);
            match obj {
                None if local => {
                    let queued = deskfs_meta::read(meta, |t| {
                        let mut any = false;
                        for (parent, name) in t.names_of(ino)? {
                            if let Some(dir) = dir_path(t, parent)? {
                                any |= t.is_pending(&join(&dir, &name))?;
                            }
                        }
                        Ok::<_, crate::VfsError>(any)
                    })?;
                    let p = Problem {
                        kind: "not-uploaded",
                        detail: format!(
                            "inode {ino}: no object holds its content yet (local copy kept)"
                        ),
                        repaired: opts.repair,
                    };
                    if queued {
                        rep.notes.push(p);
                    } else {
                        rep.problems.push(p);
                    }
                    if opts.repair {
                        mark_dirty(meta, ino)?;
                    }
                }
                // Held by another cache (another host's, or this host's other
                // --cache-dir): that cache's check looks at it, not this one.
                None if r.local != here && r.local != Local::None => {
                    rep.notes.push(Problem {
                        kind: "other-cache",
                        detail: format!(
                            "inode {ino} ({} bytes): its only copy is in another cache (id {}), not checked here; run fsck with that cache's --cache-dir",
                            r.size,
                            r.local.code()
                        ),
                        repaired: false,
                    })
                }
                None => add(
                    &mut rep,
                    "content-missing",
                    format!(
                        "inode {ino} ({} bytes) is neither local nor recorded in the bucket",
                        r.size
                    ),
                    false,
                ),
                Some(o) => {
                    if let Some((b, rt)) = bucket {
                        if opts.check_bucket {
                            rep.objects_checked += 1;
                            let problem = match rt.block_on(b.head(&o.key)) {
                                Ok(Some(h)) if h.size == r.size => None,
                                Ok(Some(h)) => Some((
                                    "object-size",
                                    format!(
                                        "object {} is {} bytes, inode {ino} says {}",
                                        o.key, h.size, r.size
                                    ),
                                )),
                                Ok(None) => Some((
                                    "object-missing",
                                    format!(
                                        "object {} of inode {ino} is gone from the bucket",
                                        o.key
                                    ),
                                )),
                                Err(e) => {
                                    add(
                                        &mut rep,
                                        "bucket-error",
                                        format!("cannot check object {}: {e}", o.key),
                                        false,
                                    );
                                    None
                                }
                            };
                            if let Some((kind, detail)) = problem {
                                // Re-uploadable when the content is local.
                                add(&mut rep, kind, detail, opts.repair && local);
                                if opts.repair && local {
                                    mark_dirty(meta, ino)?;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    progress("checking bucket records");
    let objects = deskfs_meta::read(meta, |t| t.objects_under(b"", usize::MAX >> 1))?;
    let mut stale = Vec::new();
    let mut queued = 0usize;
    for o in objects {
        if o.ino != 0 && !inodes.contains_key(&o.ino) {
            if deskfs_meta::read(meta, |t| t.is_pending(&o.path))? {
                queued += 1;
            } else {
                stale.push(o.path);
            }
        }
    }
    if queued > 0 {
        rep.notes.push(Problem {
            kind: "queued-deletes",
            detail: format!("{queued} bucket object(s) of deleted files are queued for deletion"),
            repaired: false,
        });
    }
    if !stale.is_empty() {
        let still_pending = stale.len();
        // Such an object must leave the bucket unless a pending entry will handle it.
        if opts.repair {
            deskfs_meta::txn(meta, |t| {
                for p in &stale {
                    t.mark_pending(p, false, now_ns())?;
                }
                Ok::<_, crate::VfsError>(())
            })?;
        }
        add(
            &mut rep,
            "stale-objects",
            format!("{still_pending} bucket object(s) belong to deleted inodes (queued for deletion by the uploader)"),
            opts.repair,
        );
    }
    // Dirty files must be queued for upload.
    let dirty = deskfs_meta::read(meta, |t| t.dirty_inodes())?;
    let mut requeue = Vec::new();
    for r in dirty.iter().filter(|r| r.nlink > 0) {
        let paths = deskfs_meta::read(meta, |t| {
            let mut v = Vec::new();
            for (parent, name) in t.names_of(r.ino)? {
                if let Some(dir) = dir_path(t, parent)? {
                    v.push(join(&dir, &name));
                }
            }
            Ok::<_, crate::VfsError>(v)
        })?;
        requeue.extend(paths);
    }
    if opts.repair && !requeue.is_empty() {
        deskfs_meta::txn(meta, |t| {
            for p in &requeue {
                t.mark_pending(p, false, now_ns())?;
            }
            Ok::<_, crate::VfsError>(())
        })?;
    }
    Ok(rep)
}

fn mark_dirty(meta: &dyn MetaEngine, ino: Ino) -> Result<()> {
    deskfs_meta::txn(meta, |t| {
        if let Some(mut cur) = t.get_inode(ino)? {
            cur.dirty = true;
            cur.data_version += 1;
            t.update_inode(&cur)?;
        }
        Ok::<_, crate::VfsError>(())
    })?;
    Ok(())
}

fn adopt_staging(meta: &dyn MetaEngine, ino: Ino, len: u64) -> Result<()> {
    deskfs_meta::txn(meta, |t| {
        if let Some(mut cur) = t.get_inode(ino)? {
            cur.size = len;
            cur.data_version += 1;
            cur.ctime_ns = now_ns();
            t.update_inode(&cur)?;
        }
        Ok::<_, crate::VfsError>(())
    })?;
    Ok(())
}
