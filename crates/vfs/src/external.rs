//! Changes other tools make in the bucket: objects deleted behind deskfs's back leave the
//! namespace, and an object replaced while its file has unuploaded local writes is kept
//! beside it as a *bucket conflict* copy (`NAME.deskfs-conflict-bucket-UNIXTIME`): local
//! wins at the path, nothing is silently overwritten (DESIGN: "If a file changed in the
//! bucket while it has local unuploaded writes, neither version is lost").
//!
//! Detected where it is cheap and certain: at a re-listing (an ETag that differs from the
//! recorded one on a dirty file; a recorded object missing from the listing, confirmed
//! by a HEAD) and just before an upload overwrites a recorded object (a HEAD: the store
//! under test, Garage 2.5, ignores `If-Match`/`If-None-Match` on PUT, so a conditional
//! put would not be honoured; the window between that HEAD and the PUT remains).

use deskfs_meta::{Ino, InodeRow, Kind, Local, MetaTxn, ObjectRow};
use serde::Serialize;

use crate::paths::{is_escaped, join};
use crate::{now_ns, Result, Vfs, VfsError};
use std::sync::atomic::Ordering;

/// The kv key of the bounded list of bucket conflicts (`deskfs status` reads it).
pub const CONFLICTS_KEY: &str = "bucket_conflicts";

/// Conflicts kept in that list (oldest dropped first).
const CONFLICTS_KEPT: usize = 50;

/// Entries of a directory checked before it is dropped for a bucket-side delete; a bigger
/// subtree is left (and logged).
const DROP_SUBTREE_MAX: usize = 10_000;

/// Unlisted names examined per read when looking for objects deleted from the bucket.
const UNLISTED_CHUNK: usize = 256;

/// One bucket conflict: a version another tool wrote to the bucket while the file had
/// unuploaded local writes, kept beside it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BucketConflict {
    /// When it was saved, seconds since the Unix epoch.
    pub time: i64,
    /// The file's workspace path (local version).
    pub path: String,
    /// Where the bucket's version was kept (workspace path).
    pub saved_as: String,
}

/// The recorded bucket conflicts, oldest first (from the metadata; any process can read
/// them).
pub fn bucket_conflicts(t: &mut dyn MetaTxn) -> deskfs_meta::Result<Vec<BucketConflict>> {
    let raw = t.get_kv(CONFLICTS_KEY)?.unwrap_or_default();
    Ok(raw
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, '\t');
            Some(BucketConflict {
                time: it.next()?.parse().ok()?,
                path: it.next()?.to_string(),
                saved_as: it.next()?.to_string(),
            })
        })
        .collect())
}

fn push_conflict(t: &mut dyn MetaTxn, c: &BucketConflict) -> deskfs_meta::Result<()> {
    let mut all = bucket_conflicts(t)?;
    all.push(c.clone());
    let skip = all.len().saturating_sub(CONFLICTS_KEPT);
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    let text: String = all[skip..]
        .iter()
        .map(|c| format!("{}\t{}\t{}\n", c.time, clean(&c.path), clean(&c.saved_as)))
        .collect();
    t.set_kv(CONFLICTS_KEY, &text)
}

/// A bucket object the uploader or a listing found changed by another tool.
#[derive(Clone, Debug)]
pub(crate) struct Foreign {
    /// Workspace path of the file.
    pub path: Vec<u8>,
    /// Its object key.
    pub key: String,
    /// The record the change was measured against (what deskfs last wrote or read).
    pub recorded: ObjectRow,
    /// The bucket's ETag now.
    pub etag: String,
}

impl Vfs {
    /// Keeps the bucket's version `f` of a file with unuploaded local writes beside it:
    /// its bytes (read with `If-Match` on the foreign ETag, so exactly that version) go to
    /// the object of `NAME.deskfs-conflict-bucket-UNIXTIME`, which enters the namespace as
    /// a clean file, and the file's record takes the foreign ETag (the local version then
    /// overwrites it knowingly). Returns the conflict path, or `None` when another mount
    /// or reconcile dealt with it first or the object changed again (looked at later).
    pub(crate) async fn save_bucket_version(&self, f: &Foreign) -> Result<Option<Vec<u8>>> {
        let _one = self.external_lock.lock().await;
        let Some(head) = self.bucket.head(&f.key).await? else {
            return Ok(None); // deleted meanwhile: nothing to keep
        };
        if head.etag.as_deref() != Some(f.etag.as_str()) {
            return Ok(None);
        }
        let body = match self
            .bucket
            .get_range(&f.key, 0..head.size, Some(&f.etag))
            .await
        {
            Ok(b) => b,
            Err(deskfs_bucket::BucketError::Changed(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (parent, name) = match f.path.iter().rposition(|b| *b == b'/') {
            Some(i) => (f.path[..i].to_vec(), f.path[i + 1..].to_vec()),
            None => (Vec::new(), f.path.clone()),
        };
        let stamp = now_ns() / 1_000_000_000;
        let mut cname = name.clone();
        cname.extend_from_slice(format!(".deskfs-conflict-bucket-{stamp}").as_bytes());
        cname.truncate(crate::namespace::NAME_MAX);
        let cpath = join(&parent, &cname);
        let ckey = self.key_for(&cpath);
        let put = self
            .bucket
            .put_bytes(&ckey, body.clone(), head.posix.as_ref())
            .await?;
        let now = now_ns();
        let cfg = &self.cfg;
        let done = deskfs_meta::txn(&*self.meta, |t| {
            // Still the conflict it was found as, and the name still free?
            let cur = t.get_object(&f.path)?;
            if cur.as_ref() != Some(&f.recorded) {
                return Ok::<_, VfsError>(None);
            }
            let Some(dir) = crate::paths::resolve(t, &parent)? else {
                return Ok(None);
            };
            if t.lookup(dir, &cname)?.is_some() {
                return Ok(None);
            }
            let p = head.posix;
            let row = InodeRow {
                ino: 0,
                kind: Kind::File,
                perm: p.map(|p| p.mode & 0o7777).unwrap_or(0o644),
                uid: p.map(|p| p.uid).unwrap_or(cfg.default_uid),
                gid: p.map(|p| p.gid).unwrap_or(cfg.default_gid),
                rdev: 0,
                nlink: 1,
                size: body.len() as u64,
                atime_ns: head.mtime_ns,
                mtime_ns: head.mtime_ns,
                ctime_ns: now,
                btime_ns: now,
                data_version: 1,
                target: None,
                local: Local::None,
                dirty: false,
                listed_ns: 0,
            };
            let ino = t.insert_inode(&row)?;
            t.insert_dentry(dir, &cname, ino)?;
            if let Some(mut d) = t.get_inode(dir)? {
                d.mtime_ns = now;
                d.ctime_ns = now;
                t.update_inode(&d)?;
            }
            t.put_object(&ObjectRow {
                path: cpath.clone(),
                key: ckey.clone(),
                ino,
                kind: Kind::File,
                data_version: 1,
                meta_stamp: now,
                etag: put.etag.clone(),
                size: body.len() as u64,
            })?;
            t.put_object(&ObjectRow {
                etag: Some(f.etag.clone()),
                size: head.size,
                ..f.recorded.clone()
            })?;
            push_conflict(
                t,
                &BucketConflict {
                    time: stamp,
                    path: String::from_utf8_lossy(&f.path).into_owned(),
                    saved_as: String::from_utf8_lossy(&cpath).into_owned(),
                },
            )?;
            Ok(Some(dir))
        })?;
        let Some(dir) = done else {
            self.bucket.delete(&ckey).await?;
            return Ok(None);
        };
        tracing::warn!(
            path = %String::from_utf8_lossy(&f.path),
            saved_as = %String::from_utf8_lossy(&cpath),
            "the object changed in the bucket while the file had unuploaded local writes: the local version stays at the path, the bucket's version is kept beside it"
        );
        self.invalidate_later(crate::Invalidation::Inode(dir));
        self.invalidate_later(crate::Invalidation::Entry {
            parent: dir,
            name: cname,
        });
        Ok(Some(cpath))
    }

    /// Whether the bucket still holds [`crate::VfsConfig::bucket_marker`] (one HEAD;
    /// `true` when none is configured). When it does not, logs it once per change and
    /// `deskfs status` says so. Errors: the HEAD failed (`EIO`).
    fn bucket_is_still_ours(&self) -> Result<bool> {
        let Some(key) = &self.cfg.bucket_marker else {
            return Ok(true);
        };
        let present = self.rt.block_on(self.bucket.head(key))?.is_some();
        let was_missing = self.marker_missing.swap(!present, Ordering::SeqCst);
        if !present && !was_missing {
            tracing::error!(marker = %key, "the bucket no longer holds this workspace's format record (a disk not mounted at the bucket dir? the bucket emptied or replaced?): objects missing from it are not taken as deleted, nothing is removed from the namespace");
        } else if present && was_missing {
            tracing::warn!(marker = %key, "the bucket holds this workspace's format record again");
        }
        Ok(present)
    }

    /// After a re-listing of directory `dir` (workspace path `path`) that does not name
    /// its entries `unlisted`: removes those whose objects another tool deleted — files
    /// that are clean, closed, not pending, whose recorded object holds their current
    /// content and is confirmed gone by a HEAD; directories whose whole subtree is such
    /// files (and directories) and whose prefix is confirmed empty. Content that exists
    /// only here (dirty, unuploaded, created here) is never removed, and nothing is while the
    /// bucket lacks its marker (see [`crate::VfsConfig::bucket_marker`]).
    pub(crate) fn drop_deleted(&self, dir: Ino, path: &[u8], unlisted: &[Vec<u8>]) -> Result<()> {
        // A read per chunk of names: a large directory is refreshed in the background,
        // beside requests that share the database connection.
        let mut found: Vec<(Vec<u8>, Kind, Vec<ObjectRow>)> = Vec::new();
        for chunk in unlisted.chunks(UNLISTED_CHUNK) {
            let rows = deskfs_meta::read(&*self.meta, |t| {
                let mut out = Vec::new();
                for name in chunk {
                    let Some(d) = t.lookup(dir, name)? else {
                        continue;
                    };
                    let Some(r) = t.get_inode(d.ino)? else {
                        continue;
                    };
                    if let Some(rows) = self.bucket_only(t, &join(path, name), &r)? {
                        out.push((name.clone(), r.kind, rows));
                    }
                }
                Ok::<_, VfsError>(out)
            })?;
            found.extend(rows);
        }
        if found.is_empty() || !self.bucket_is_still_ours()? {
            return Ok(());
        }
        for (name, kind, rows) in found {
            let cpath = join(path, &name);
            // Confirmed gone now, after the read: a PUT landing later changes a record.
            let gone = self.rt.block_on(async {
                if kind == Kind::Dir {
                    let key = self.key_for(&cpath);
                    Ok::<_, VfsError>(self.bucket.list_all(&key).await?.is_empty())
                } else {
                    Ok(self.bucket.head(&rows[0].key).await?.is_none())
                }
            })?;
            if !gone {
                continue;
            }
            let unchanged = deskfs_meta::read(&*self.meta, |t| {
                for o in &rows {
                    if t.get_object(&o.path)?.as_ref() != Some(o) {
                        return Ok::<_, VfsError>(false);
                    }
                }
                let Some(d) = t.lookup(dir, &name)? else {
                    return Ok(false);
                };
                let Some(r) = t.get_inode(d.ino)? else {
                    return Ok(false);
                };
                Ok(self.bucket_only(t, &cpath, &r)?.is_some())
            })?;
            if !unchanged {
                continue;
            }
            tracing::info!(path = %String::from_utf8_lossy(&cpath), "deleted from the bucket by another tool: removed from the namespace");
            let r = if kind == Kind::Dir {
                self.drop_subtree(dir, &name)
            } else {
                self.unlink(&crate::Ctx::ROOT, dir, &name)
            };
            match r {
                Ok(()) | Err(VfsError::NotFound) | Err(VfsError::NotEmpty) => {}
                Err(e) => return Err(e),
            }
            self.invalidate_later(crate::Invalidation::Entry { parent: dir, name });
            self.invalidate_later(crate::Invalidation::Inode(dir));
        }
        Ok(())
    }

    /// Removes directory `parent/name` and its subtree (deepest first) through the
    /// namespace operations.
    fn drop_subtree(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let Some(d) = self.meta.lookup(parent, name)? else {
            return Ok(());
        };
        let kids = deskfs_meta::read(&*self.meta, |t| {
            Ok::<_, VfsError>(t.list_dir(d.ino, 0, DROP_SUBTREE_MAX)?)
        })?;
        for (k, r) in kids {
            if r.kind == Kind::Dir {
                self.drop_subtree(d.ino, &k.name)?;
            } else {
                self.unlink(&crate::Ctx::ROOT, d.ino, &k.name)?;
            }
        }
        self.rmdir(&crate::Ctx::ROOT, parent, name)
    }

    /// The records of `path` (inode `r`) and everything under it, when all of it exists
    /// only as bucket objects deskfs knows (so a bucket-side delete may remove it);
    /// `None` when anything there has content or names only here.
    fn bucket_only(
        &self,
        t: &mut dyn MetaTxn,
        path: &[u8],
        r: &InodeRow,
    ) -> Result<Option<Vec<ObjectRow>>> {
        let mut rows = Vec::new();
        let mut stack = vec![(path.to_vec(), r.clone())];
        let mut seen = 0usize;
        while let Some((p, r)) = stack.pop() {
            seen += 1;
            if seen > DROP_SUBTREE_MAX || t.is_pending(&p)? || self.is_open(r.ino) {
                return Ok(None);
            }
            let obj = t.get_object(&p)?;
            if r.kind == Kind::Dir {
                // Never known in the bucket (made here): not the bucket's to take away.
                let Some(o) = obj else { return Ok(None) };
                rows.push(o);
                let mut after = 0;
                loop {
                    let page = t.list_dir(r.ino, after, 1024)?;
                    if page.is_empty() {
                        break;
                    }
                    for (d, cr) in page {
                        after = d.cookie;
                        stack.push((join(&p, &d.name), cr));
                    }
                }
                continue;
            }
            let Some(o) = obj else { return Ok(None) };
            if r.dirty
                || o.ino != r.ino
                || o.data_version != r.data_version
                || is_escaped(&o.key)
                || o.key != self.key_for(&p)
            {
                return Ok(None);
            }
            rows.push(o);
        }
        Ok(Some(rows))
    }
}
