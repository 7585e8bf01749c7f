//! The importer: lazily lists bucket prefixes into the namespace, so an existing bucket
//! mounts as-is. A directory is listed on first use and again (by `opendir`) once its
//! listing is older than the TTL, picking up objects other tools added or changed.

use std::collections::{HashMap, HashSet};

use deskfs_bucket::{ObjectInfo, PosixMeta};
use deskfs_meta::{Ino, InodeRow, Kind, Local, MetaTxn, ObjectRow, ROOT_INO};
use futures::StreamExt;

use crate::namespace::NAME_MAX;
use crate::paths::{dir_path, is_escaped, join, RESERVED};
use crate::{now_ns, Result, Vfs};

/// The names in directory `dir`, read in pages of [`LIST_PAGE`].
fn dir_names(t: &mut dyn MetaTxn, dir: Ino) -> deskfs_meta::Result<HashSet<Vec<u8>>> {
    let mut names = HashSet::new();
    let mut after = 0;
    loop {
        let page = t.list_dir(dir, after, LIST_PAGE)?;
        let full = page.len() == LIST_PAGE;
        for (d, _) in page {
            after = after.max(d.cookie);
            names.insert(d.name);
        }
        if !full {
            return Ok(names);
        }
    }
}

/// Directory entries read per round trip while comparing a bucket listing with them.
const LIST_PAGE: usize = 4096;

/// HEAD requests in flight while importing a listing.
const HEAD_CONCURRENCY: usize = 32;

impl Vfs {
    /// Makes sure directory `dir` reflects the bucket: lists it if it never was, or (with
    /// `refresh`) if its listing is older than the TTL. A failed first listing is `EIO`; a
    /// failed refresh keeps serving what is known.
    /// Whether directory `row` must be listed from the bucket now (never listed, or with
    /// `refresh` a listing older than the TTL); remembers that it was listed.
    pub(crate) fn listing_due(&self, row: &InodeRow, refresh: bool) -> bool {
        if row.listed_ns == 0 {
            return true;
        }
        self.hints.set_listed(row.ino);
        let ttl = self.cfg.list_ttl.as_nanos() as i64;
        refresh && now_ns().saturating_sub(row.listed_ns) >= ttl
    }

    pub(crate) fn ensure_listed(&self, dir: Ino, refresh: bool) -> Result<()> {
        // A listing is never undone: a directory known listed needs no read.
        if !refresh && self.hints.is_listed(dir) {
            return Ok(());
        }
        let Some(row) = self.meta.get_inode(dir)? else {
            return Ok(());
        };
        if row.kind != Kind::Dir {
            return Ok(());
        }
        let now = now_ns();
        if !self.listing_due(&row, refresh) {
            return Ok(());
        }
        let Some(path) = deskfs_meta::read(&*self.meta, |t| dir_path(t, dir))? else {
            return Ok(());
        };
        let key = if path.is_empty() {
            String::new()
        } else {
            self.key_for(&path)
        };
        if is_escaped(&key) {
            self.set_listed(dir, now)?;
            return Ok(());
        }
        let listing = match self.rt.block_on(self.bucket.list_dir(&key)) {
            Ok(l) => l,
            Err(e) if row.listed_ns != 0 => {
                tracing::warn!(dir, error = %e, "refreshing a directory listing failed; serving the known entries");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        // Which files are new to us (neither known objects nor local names)?
        let files: Vec<(String, ObjectInfo)> = listing
            .files
            .into_iter()
            .filter(|(n, _)| n.len() <= NAME_MAX && !(dir == ROOT_INO && n.as_bytes() == RESERVED))
            .collect();
        // The directory's names in pages (a few round trips for thousands of entries),
        // then the object rows of the names it lacks (rare: deleted here, removal from
        // the bucket still pending).
        let new_names: Vec<String> = deskfs_meta::read(&*self.meta, |t| {
            let local = dir_names(t, dir)?;
            let unnamed: Vec<&String> = files
                .iter()
                .map(|(n, _)| n)
                .filter(|n| !local.contains(n.as_bytes()))
                .collect();
            let paths: Vec<Vec<u8>> = unnamed.iter().map(|n| join(&path, n.as_bytes())).collect();
            let known: HashSet<Vec<u8>> =
                t.get_objects(&paths)?.into_iter().map(|o| o.path).collect();
            Ok::<_, crate::VfsError>(
                unnamed
                    .into_iter()
                    .filter(|n| !known.contains(&join(&path, n.as_bytes())))
                    .cloned()
                    .collect(),
            )
        })?;
        // POSIX attributes (and symlink targets) of new objects, fetched concurrently.
        let mut attrs: HashMap<String, (Option<PosixMeta>, Option<Vec<u8>>)> = HashMap::new();
        if self.bucket.supports_metadata() && !new_names.is_empty() {
            let by_name: HashMap<&str, &ObjectInfo> =
                files.iter().map(|(n, i)| (n.as_str(), i)).collect();
            let bucket = self.bucket.clone();
            let jobs: Vec<(String, String, u64)> = new_names
                .iter()
                .filter_map(|n| {
                    by_name
                        .get(n.as_str())
                        .map(|i| (n.clone(), i.key.clone(), i.size))
                })
                .collect();
            let results: Vec<(String, Option<PosixMeta>, Option<Vec<u8>>)> = self.rt.block_on(
                futures::stream::iter(jobs)
                    .map(|(name, key, size)| {
                        let bucket = bucket.clone();
                        async move {
                            let posix =
                                bucket.head(&key).await.ok().flatten().and_then(|h| h.posix);
                            let target = match posix {
                                Some(p)
                                    if Kind::from_mode(p.mode) == Some(Kind::Symlink)
                                        && size < 4096 =>
                                {
                                    bucket
                                        .get_range(&key, 0..size, None)
                                        .await
                                        .ok()
                                        .map(|b| b.to_vec())
                                }
                                _ => None,
                            };
                            (name, posix, target)
                        }
                    })
                    .buffer_unordered(HEAD_CONCURRENCY)
                    .collect(),
            );
            for (n, p, t) in results {
                attrs.insert(n, (p, t));
            }
        }
        let mut changed: Vec<Ino> = Vec::new();
        let mut added: Vec<Vec<u8>> = Vec::new();
        let mut foreign: Vec<crate::external::Foreign> = Vec::new();
        let cfg = &self.cfg;
        deskfs_meta::txn(&*self.meta, |t| {
            changed.clear();
            added.clear();
            foreign.clear();
            let mut new_dirs = 0i64;
            // What is known of every listed name, read at once.
            let mut names = dir_names(t, dir)?;
            let child_paths: Vec<Vec<u8>> = files
                .iter()
                .map(|(n, _)| n)
                .chain(listing.dirs.iter())
                .map(|n| join(&path, n.as_bytes()))
                .collect();
            let objs: HashMap<Vec<u8>, ObjectRow> = t
                .get_objects(&child_paths)?
                .into_iter()
                .map(|o| (o.path.clone(), o))
                .collect();
            for (name, info) in &files {
                let nb = name.as_bytes();
                let cpath = join(&path, nb);
                if let Some(obj) = objs.get(&cpath).cloned() {
                    // Known object: did another tool replace it?
                    if obj.etag.is_some() && info.etag.is_some() && obj.etag != info.etag {
                        if let Some(d) = t.lookup(dir, nb)? {
                            if let Some(mut r) = t.get_inode(d.ino)? {
                                let local_writes = r.dirty || r.data_version != obj.data_version;
                                if d.ino == obj.ino && r.kind == Kind::File && local_writes {
                                    // Changed in the bucket while the file has local
                                    // writes not uploaded: both versions are kept.
                                    if let Some(etag) = &info.etag {
                                        foreign.push(crate::external::Foreign {
                                            path: cpath.clone(),
                                            key: obj.key.clone(),
                                            recorded: obj.clone(),
                                            etag: etag.clone(),
                                        });
                                    }
                                } else if d.ino == obj.ino
                                    && r.kind == Kind::File
                                    && !self.is_open(r.ino)
                                {
                                    r.size = info.size;
                                    r.mtime_ns = info.mtime_ns;
                                    r.ctime_ns = now_ns();
                                    r.data_version += 1;
                                    r.local = Local::None;
                                    t.update_inode(&r)?;
                                    t.put_object(&ObjectRow {
                                        etag: info.etag.clone(),
                                        size: info.size,
                                        data_version: r.data_version,
                                        meta_stamp: r.ctime_ns,
                                        ..obj
                                    })?;
                                    changed.push(r.ino);
                                }
                            }
                        }
                    }
                    continue;
                }
                if !names.insert(nb.to_vec()) {
                    continue; // a local name
                }
                let (posix, target) = attrs.get(name).cloned().unwrap_or((None, None));
                let mode = posix.map(|p| p.mode).unwrap_or(0o100644);
                let mut kind = Kind::from_mode(mode).unwrap_or(Kind::File);
                if kind == Kind::Dir || (kind == Kind::Symlink && target.is_none()) {
                    kind = Kind::File;
                }
                let mtime = posix.map(|p| p.mtime_ns).unwrap_or(info.mtime_ns);
                let row = InodeRow {
                    ino: 0,
                    kind,
                    perm: if posix.is_some() {
                        mode & 0o7777
                    } else {
                        0o644
                    },
                    uid: posix.map(|p| p.uid).unwrap_or(cfg.default_uid),
                    gid: posix.map(|p| p.gid).unwrap_or(cfg.default_gid),
                    rdev: 0,
                    nlink: 1,
                    size: if kind == Kind::Symlink {
                        target.as_ref().map(|t| t.len() as u64).unwrap_or(0)
                    } else {
                        info.size
                    },
                    atime_ns: posix.map(|p| p.atime_ns).unwrap_or(mtime),
                    mtime_ns: mtime,
                    ctime_ns: posix.map(|p| p.ctime_ns).unwrap_or(mtime),
                    btime_ns: mtime,
                    data_version: 1,
                    target: if kind == Kind::Symlink {
                        target.clone()
                    } else {
                        None
                    },
                    local: Local::None,
                    dirty: false,
                    listed_ns: 0,
                };
                let ino = t.insert_inode(&row)?;
                t.insert_dentry(dir, nb, ino)?;
                added.push(nb.to_vec());
                t.put_object(&ObjectRow {
                    path: cpath,
                    key: info.key.clone(),
                    ino,
                    kind,
                    data_version: 1,
                    meta_stamp: row.ctime_ns,
                    etag: info.etag.clone(),
                    size: info.size,
                })?;
            }
            for name in &listing.dirs {
                let nb = name.as_bytes();
                if nb.len() > NAME_MAX || (dir == ROOT_INO && nb == RESERVED) {
                    continue;
                }
                let cpath = join(&path, nb);
                if names.contains(nb) || objs.contains_key(&cpath) {
                    continue;
                }
                names.insert(nb.to_vec());
                let now = now_ns();
                let row = InodeRow {
                    ino: 0,
                    kind: Kind::Dir,
                    perm: 0o755,
                    uid: cfg.default_uid,
                    gid: cfg.default_gid,
                    rdev: 0,
                    nlink: 2,
                    size: 0,
                    atime_ns: now,
                    mtime_ns: now,
                    ctime_ns: now,
                    btime_ns: now,
                    data_version: 0,
                    target: None,
                    local: Local::None,
                    dirty: false,
                    listed_ns: 0,
                };
                let ino = t.insert_inode(&row)?;
                t.insert_dentry(dir, nb, ino)?;
                added.push(nb.to_vec());
                // Recorded as known so that a local rmdir is not undone by a re-listing.
                t.put_object(&ObjectRow {
                    path: cpath.clone(),
                    key: self.key_for(&cpath),
                    ino,
                    kind: Kind::Dir,
                    data_version: 0,
                    meta_stamp: i64::MIN,
                    etag: None,
                    size: 0,
                })?;
                new_dirs += 1;
            }
            if let Some(mut d) = t.get_inode(dir)? {
                d.nlink += new_dirs as u32;
                d.listed_ns = now_ns();
                t.update_inode(&d)?;
            }
            Ok::<_, crate::VfsError>(())
        })?;
        self.hints.set_listed(dir);
        // The kernel may hold negative entries for the new names and pages of the
        // replaced contents (delivered after this request: see `feed`).
        if !added.is_empty() {
            // Its cached listing as well.
            self.invalidate_later(crate::Invalidation::Inode(dir));
        }
        for name in added {
            self.invalidate_later(crate::Invalidation::Entry { parent: dir, name });
        }
        for ino in changed {
            self.invalidate_later(crate::Invalidation::Inode(ino));
            self.cache.drop_blocks(ino);
            let _ = self.cache.remove_staging(ino);
        }
        for f in &foreign {
            if let Err(e) = self.rt.block_on(self.save_bucket_version(f)) {
                tracing::warn!(path = %String::from_utf8_lossy(&f.path), error = %e, "keeping the bucket's version of a conflicting file failed; the upload checks again");
            }
        }
        // Objects other tools deleted (a re-listing only: the entries were listed before).
        if row.listed_ns != 0 {
            let names: HashSet<&str> = files
                .iter()
                .map(|(n, _)| n.as_str())
                .chain(listing.dirs.iter().map(String::as_str))
                .collect();
            if let Err(e) = self.drop_deleted(dir, &path, &names) {
                tracing::warn!(dir, error = %e, "looking for objects deleted from the bucket failed");
            }
        }
        Ok(())
    }

    /// Lists every directory under `dir` (inclusive) that was never listed, so that the
    /// whole subtree is in the namespace before it moves (its objects must move with it).
    pub(crate) fn ensure_subtree_listed(&self, dir: Ino) -> Result<()> {
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            self.ensure_listed(d, false)?;
            let mut after = 0;
            loop {
                let rows = deskfs_meta::read(&*self.meta, |t| t.list_dir(d, after, 1024))?;
                if rows.is_empty() {
                    break;
                }
                for (de, r) in rows {
                    after = de.cookie;
                    if r.kind == Kind::Dir {
                        stack.push(r.ino);
                    }
                }
            }
        }
        Ok(())
    }

    fn set_listed(&self, dir: Ino, now: i64) -> Result<()> {
        self.hints.set_listed(dir);
        deskfs_meta::txn(&*self.meta, |t| {
            if let Some(mut d) = t.get_inode(dir)? {
                d.listed_ns = now;
                t.update_inode(&d)?;
            }
            Ok::<_, crate::VfsError>(())
        })?;
        Ok(())
    }
}
