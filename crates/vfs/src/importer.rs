//! The importer: lazily lists bucket prefixes into the namespace, so an existing bucket
//! mounts as-is. A directory is listed on first use and again (by `opendir`) once its
//! listing is older than the TTL, picking up objects other tools added or changed.

use std::collections::{HashMap, HashSet};

use deskfs_bucket::{ObjectInfo, PosixMeta};
use deskfs_meta::{Ino, InodeRow, Kind, Local, MetaEngine, MetaTxn, ObjectRow, ROOT_INO};
use futures::StreamExt;

use crate::namespace::NAME_MAX;
use crate::paths::{dir_path, is_escaped, join, RESERVED};
use crate::{now_ns, Result, Vfs};

/// The names in directory `dir`, read in pages of [`LIST_PAGE`], each page a read of its
/// own: a large directory is compared in the background beside the mount's requests,
/// which share the database connection, so no read holds it for the whole directory.
fn dir_names(meta: &dyn MetaEngine, dir: Ino) -> Result<HashSet<Vec<u8>>> {
    let mut names = HashSet::new();
    let mut after = 0;
    loop {
        let page = deskfs_meta::read(meta, |t| t.list_dir(dir, after, LIST_PAGE))?;
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

/// Object rows read per round trip while comparing a listing (one read each, as pages).
const OBJECT_CHUNK: usize = 1024;

/// Directory entries read per round trip while comparing a bucket listing with them.
const LIST_PAGE: usize = 4096;

/// HEAD requests in flight while importing a listing.
const HEAD_CONCURRENCY: usize = 32;

/// The refreshes of directory listings from the bucket: which run now (at most one per
/// directory) and which failed lately (not tried again within `list_ttl` of the failure:
/// while the bucket is out, each directory costs one bounded wait per TTL, not one per
/// `opendir`).
#[derive(Default)]
pub(crate) struct BackgroundRelists(std::sync::Mutex<RelistState>);

#[derive(Default)]
pub(crate) struct RelistState {
    running: HashSet<Ino>,
    failed: HashMap<Ino, std::time::Instant>,
}

impl BackgroundRelists {
    fn state(&self) -> std::sync::MutexGuard<'_, RelistState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims the refresh of `dir`; `false` when one already runs.
    pub(crate) fn start(&self, dir: Ino) -> bool {
        self.state().running.insert(dir)
    }

    /// Ends the claim on `dir`'s refresh; `ok` tells whether it reached the bucket and
    /// applied what it found.
    pub(crate) fn finish(&self, dir: Ino, ok: bool) {
        let mut st = self.state();
        st.running.remove(&dir);
        if ok {
            st.failed.remove(&dir);
        } else {
            st.failed.insert(dir, std::time::Instant::now());
        }
    }

    /// Whether a refresh of `dir` runs now.
    pub(crate) fn running_for(&self, dir: Ino) -> bool {
        self.state().running.contains(&dir)
    }

    /// Whether the last refresh of `dir` failed less than `ttl` ago.
    pub(crate) fn failed_within(&self, dir: Ino, ttl: std::time::Duration) -> bool {
        self.state()
            .failed
            .get(&dir)
            .is_some_and(|t| t.elapsed() < ttl)
    }

    /// How many refreshes run now.
    pub(crate) fn running(&self) -> usize {
        self.state().running.len()
    }

    /// How many directories' last refresh failed (their known entries are served).
    pub(crate) fn failing(&self) -> usize {
        self.state().failed.len()
    }
}

/// The claim on one directory's refresh ([`BackgroundRelists::start`]): ended when
/// dropped, as failed unless [`RelistClaim::succeeded`] was called — an error or a panic
/// on the way ends it too.
struct RelistClaim<'a> {
    relists: &'a BackgroundRelists,
    dir: Ino,
    ok: bool,
}

impl<'a> RelistClaim<'a> {
    /// Claims `dir`; `None` when a refresh of it runs already.
    fn take(relists: &'a BackgroundRelists, dir: Ino) -> Option<Self> {
        relists.start(dir).then_some(RelistClaim {
            relists,
            dir,
            ok: false,
        })
    }

    fn succeeded(&mut self) {
        self.ok = true;
    }

    /// Hands the claim to a thread that goes on with the refresh: it ends there (see
    /// [`RelistClaim::resume`]), not here.
    fn hand_over(self) -> Ino {
        let dir = self.dir;
        std::mem::forget(self);
        dir
    }

    /// Takes up a claim on `dir` handed over with [`RelistClaim::hand_over`].
    fn resume(relists: &'a BackgroundRelists, dir: Ino) -> Self {
        RelistClaim {
            relists,
            dir,
            ok: false,
        }
    }
}

impl Drop for RelistClaim<'_> {
    fn drop(&mut self) {
        self.relists.finish(self.dir, self.ok);
    }
}

/// A bucket listing under way on the runtime.
type ListTask = tokio::task::JoinHandle<deskfs_bucket::Result<deskfs_bucket::Listing>>;

/// What a [`ListTask`] ended with: the bucket's answer, or the task's failure.
type ListAnswer =
    std::result::Result<deskfs_bucket::Result<deskfs_bucket::Listing>, tokio::task::JoinError>;

/// What one bucket listing of a directory asks of the namespace, worked out in one read.
/// Only the names it holds are looked at again in the write that follows: a re-listing
/// that finds nothing new costs one pass over the directory and one object-row read per
/// listed name, and writes only the directory's `listed_ns`.
#[derive(Default)]
struct ListingPlan {
    /// Indices into the listed files: names with neither an entry nor an object row.
    new_files: Vec<usize>,
    /// Indices into the listed files: known objects whose ETag differs from the listing's,
    /// with their records as read for the plan.
    changed: Vec<(usize, ObjectRow)>,
    /// Indices into the listed prefixes: names with neither an entry nor an object row.
    new_dirs: Vec<usize>,
    /// Entries of the directory the listing does not name (deleted by another tool, or
    /// never uploaded: [`Vfs::drop_deleted`] tells which).
    unlisted: Vec<Vec<u8>>,
}

impl ListingPlan {
    /// Compares listed `files` and `dirs` (names in directory `dir`, workspace path
    /// `path`) with what the namespace knows, in reads of a page each (the write that
    /// follows checks every name it acts on again).
    fn read(
        meta: &dyn MetaEngine,
        dir: Ino,
        path: &[u8],
        files: &[(String, ObjectInfo)],
        dirs: &[String],
    ) -> Result<ListingPlan> {
        let local = dir_names(meta, dir)?;
        let paths: Vec<Vec<u8>> = files
            .iter()
            .map(|(n, _)| n)
            .chain(dirs.iter())
            .map(|n| join(path, n.as_bytes()))
            .collect();
        let mut objs: HashMap<Vec<u8>, ObjectRow> = HashMap::new();
        for chunk in paths.chunks(OBJECT_CHUNK) {
            let rows = deskfs_meta::read(meta, |t| t.get_objects(chunk))?;
            objs.extend(rows.into_iter().map(|o| (o.path.clone(), o)));
        }
        let mut plan = ListingPlan::default();
        for (i, (name, info)) in files.iter().enumerate() {
            match objs.get(&paths[i]) {
                Some(o) if etag_changed(o, info) => plan.changed.push((i, o.clone())),
                Some(_) => {}
                None if local.contains(name.as_bytes()) => {}
                None => plan.new_files.push(i),
            }
        }
        for (j, name) in dirs.iter().enumerate() {
            if !local.contains(name.as_bytes()) && !objs.contains_key(&paths[files.len() + j]) {
                plan.new_dirs.push(j);
            }
        }
        let listed: HashSet<&[u8]> = files
            .iter()
            .map(|(n, _)| n.as_bytes())
            .chain(dirs.iter().map(|n| n.as_bytes()))
            .collect();
        plan.unlisted = local
            .into_iter()
            .filter(|n| !listed.contains(n.as_slice()))
            .collect();
        Ok(plan)
    }
}

/// Whether this mount (or another, sharing the database) still has bucket work at or
/// under a listed name the namespace does not have: a pending path, or an upload in
/// flight (this mount's, or one another live mount announced: `uploader::announce`). Such a name's objects are the leftovers of a local removal or rename, not
/// another tool's writes (an upload that landed after its file and directory were
/// removed, before the uploader deleted it again; one that landed unrecorded before a
/// crash), and importing them would bring back what was removed here. They are not
/// imported while that work is pending; what the bucket still holds there once it is
/// done is another tool's, and the next listing takes it.
/// Two reads per listing when nothing is pending at or under the listed directory (the
/// usual case), one more per new name otherwise.
struct OwnWork {
    /// Whether any pending row lies at or under the listed directory, or covers it.
    any: bool,
    /// Paths at or under the listed directory with a put in flight announced by a
    /// registered mount session (announcements of sessions gone are stale: ignored).
    announced: Vec<Vec<u8>>,
}

/// Every pending mark, whatever its sequence number ([`MetaTxn::pending_under`]'s bound).
const ANY_SEQ: u64 = u64::MAX;

impl OwnWork {
    fn read(t: &mut dyn MetaTxn, dir_path: &[u8]) -> Result<OwnWork> {
        let any = t.is_pending(dir_path)? || !t.pending_under(dir_path, ANY_SEQ, 1)?.is_empty();
        let mut announced: Vec<(Vec<u8>, u64)> = t
            .kv_with_prefix(&deskfs_meta::uploads_at_or_under(dir_path))?
            .into_iter()
            .filter_map(|(k, _)| deskfs_meta::upload_of(&k))
            .filter(|(p, _)| crate::paths::is_at_or_under(p, dir_path))
            .collect();
        if !announced.is_empty() {
            let live: Vec<u64> = t.sessions()?.iter().map(|s| s.id).collect();
            announced.retain(|(_, s)| live.contains(s));
        }
        Ok(OwnWork {
            any,
            announced: announced.into_iter().map(|(p, _)| p).collect(),
        })
    }

    /// Whether `path` (a listed name with neither an entry nor an object row) has work
    /// of ours; with `subtree`, anywhere under it too (a listed directory prefix).
    fn at(
        &mut self,
        t: &mut dyn MetaTxn,
        path: &[u8],
        uploader: &crate::uploader::UploaderShared,
        subtree: bool,
    ) -> Result<bool> {
        let flying = if subtree {
            uploader.uploading_under(path)
                || self
                    .announced
                    .iter()
                    .any(|p| crate::paths::is_at_or_under(p, path))
        } else {
            uploader.uploading(path) || self.announced.iter().any(|p| p == path)
        };
        if flying {
            return Ok(true);
        }
        if !self.any {
            return Ok(false);
        }
        Ok(t.is_pending(path)? || subtree && !t.pending_under(path, ANY_SEQ, 1)?.is_empty())
    }
}

/// Inserts `row` as entry `name` of directory `dir` and records `obj` (its `ino` filled
/// in) as the object holding it; returns the new inode's number.
fn insert_imported(
    t: &mut dyn MetaTxn,
    dir: Ino,
    name: &[u8],
    row: &InodeRow,
    obj: ObjectRow,
) -> Result<Ino> {
    let ino = t.insert_inode(row)?;
    t.insert_dentry(dir, name, ino)?;
    t.put_object(&ObjectRow { ino, ..obj })?;
    Ok(ino)
}

/// Whether another tool replaced recorded object `o` (both ETags known and different).
fn etag_changed(o: &ObjectRow, info: &ObjectInfo) -> bool {
    o.etag.is_some() && info.etag.is_some() && o.etag != info.etag
}

/// What applying a listing changed, for the kernel's caches and the conflict saver.
#[derive(Default)]
struct Applied {
    /// Files whose content the bucket replaced (their pages and staging files go).
    changed: Vec<Ino>,
    /// Names added to the directory.
    added: Vec<Vec<u8>>,
    /// Files replaced in the bucket while they had unuploaded local writes.
    foreign: Vec<crate::external::Foreign>,
}

/// POSIX attributes (from `x-amz-meta-*`) and symlink targets of new objects, by name.
type NewAttrs = HashMap<String, (Option<PosixMeta>, Option<Vec<u8>>)>;

impl Vfs {
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

    /// Makes sure directory `dir` reflects the bucket: lists it if it never was, or (with
    /// `refresh`) refreshes a listing older than the TTL. A failed first listing is
    /// `EIO`. A refresh never fails the caller and waits for the bucket at most
    /// `relist_wait` (none for a directory of `background_relist_min` entries or more,
    /// see [`crate::VfsConfig`]): past that it goes on in the background, the caller is
    /// served the known entries, and what it finds shows from the next `opendir` on. A
    /// failed refresh keeps serving what is known and is not tried again within
    /// `list_ttl`.
    pub(crate) fn ensure_listed(&self, dir: Ino, refresh: bool) -> Result<()> {
        // A listing is never undone: a directory known listed needs no read.
        if !refresh && self.hints.is_listed(dir) {
            return Ok(());
        }
        let Some(row) = self.meta.get_inode(dir)? else {
            return Ok(());
        };
        if row.kind != Kind::Dir || !self.listing_due(&row, refresh) {
            return Ok(());
        }
        if row.listed_ns == 0 {
            return self.first_listing(dir);
        }
        if self.relists.running_for(dir) || self.relists.failed_within(dir, self.cfg.list_ttl) {
            return Ok(());
        }
        let min = self.cfg.background_relist_min;
        let entries = deskfs_meta::read(&*self.meta, |t| t.count_children(dir, min))?;
        let wait = (entries < min).then_some(self.cfg.relist_wait);
        self.refresh_listing(dir, wait);
        Ok(())
    }

    /// The path and bucket key of directory `dir`; `None` when it is gone, or (after
    /// recording it listed) when its key is escaped and so holds no objects of other
    /// tools.
    fn listing_key(&self, dir: Ino, now: i64) -> Result<Option<(Vec<u8>, String)>> {
        let Some(path) = deskfs_meta::read(&*self.meta, |t| dir_path(t, dir))? else {
            return Ok(None);
        };
        let key = if path.is_empty() {
            String::new()
        } else {
            self.key_for(&path)
        };
        if is_escaped(&key) {
            self.set_listed(dir, now)?;
            return Ok(None);
        }
        Ok(Some((path, key)))
    }

    /// Lists directory `dir`, never listed, from the bucket, waiting for it. Errors: the
    /// bucket's (`EIO`), the database's.
    fn first_listing(&self, dir: Ino) -> Result<()> {
        let now = now_ns();
        let Some((path, key)) = self.listing_key(dir, now)? else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let listing = self.rt.block_on(self.bucket.list_dir(&key))?;
        self.apply_bucket_listing(dir, &path, false, listing, started)
    }

    /// Refreshes directory `dir`'s listing from the bucket, unless a refresh of it runs
    /// already: waits for the bucket's answer up to `wait` and applies it here, or leaves
    /// the rest to a thread of its own. Failures are logged (and remembered: see
    /// [`BackgroundRelists`]); the known entries stay.
    fn refresh_listing(&self, dir: Ino, wait: Option<std::time::Duration>) {
        let Some(mut claim) = RelistClaim::take(&self.relists, dir) else {
            return;
        };
        let now = now_ns();
        let (path, key) = match self.listing_key(dir, now) {
            Ok(Some(pk)) => pk,
            Ok(None) => {
                claim.succeeded();
                return;
            }
            Err(e) => {
                tracing::warn!(dir, error = %e, "refreshing a directory listing failed; serving the known entries");
                return;
            }
        };
        let started = std::time::Instant::now();
        let bucket = self.bucket.clone();
        let list_key = key.clone();
        let mut task: ListTask = self.rt.spawn(async move {
            #[cfg(test)]
            if let Some(hook) = tests::take_refresh_hook(&list_key) {
                if let Ok(Some(e)) = tokio::task::spawn_blocking(hook).await {
                    return Err(e);
                }
            }
            bucket.list_dir(&list_key).await
        });
        if let Some(wait) = wait {
            let answered = self
                .rt
                .block_on(async { tokio::time::timeout(wait, &mut task).await });
            if let Ok(joined) = answered {
                match self.finish_refresh(dir, &path, joined, started) {
                    Ok(()) => claim.succeeded(),
                    Err(e) => {
                        tracing::warn!(dir, error = %e, "refreshing a directory listing failed; serving the known entries");
                    }
                }
                return;
            }
            tracing::info!(
                dir,
                wait_ms = wait.as_millis() as u64,
                "the bucket did not answer a directory's listing in time; serving the known entries, the refresh goes on in the background"
            );
        }
        let dir = claim.hand_over();
        let weak = self.this.clone();
        let spawned = std::thread::Builder::new()
            .name("deskfs-relist".into())
            .spawn(move || {
                let Some(vfs) = weak.upgrade() else { return };
                let mut claim = RelistClaim::resume(&vfs.relists, dir);
                let joined = vfs.rt.block_on(task);
                // Applied only while this mount runs and the directory is still at the
                // path listed (a rename meanwhile leaves it to the next refresh).
                let applied = match vfs.still_listed_at(dir, &path) {
                    Ok(true) => vfs.finish_refresh(dir, &path, joined, started),
                    other => other.map(|_| ()),
                };
                match applied {
                    Ok(()) => claim.succeeded(),
                    Err(e) => {
                        tracing::warn!(dir, error = %e, "refreshing a directory listing failed; serving the known entries");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(dir, error = %e, "cannot start a directory refresh; serving the known entries");
            self.relists.finish(dir, false);
        }
    }

    /// Whether a refresh of `dir` at `path` that went on in the background may still be
    /// applied: this mount runs and the directory is still at that path.
    fn still_listed_at(&self, dir: Ino, path: &[u8]) -> Result<bool> {
        if self.coherence.stopped() {
            return Ok(false);
        }
        let now_path = deskfs_meta::read(&*self.meta, |t| dir_path(t, dir))?;
        Ok(now_path.as_deref() == Some(path))
    }

    /// Applies a refresh's answer from the bucket. Errors: the listing's (`EIO`), a
    /// listing task that panicked (`EIO`), the database's.
    fn finish_refresh(
        &self,
        dir: Ino,
        path: &[u8],
        joined: ListAnswer,
        started: std::time::Instant,
    ) -> Result<()> {
        let listing = joined.map_err(|e| {
            crate::VfsError::Io(std::io::Error::other(format!(
                "the bucket listing task failed: {e}"
            )))
        })??;
        self.apply_bucket_listing(dir, path, true, listing, started)
    }

    /// Brings directory `dir` (at `path`; `relisted`: it was listed before) in line with
    /// the bucket's `listing`: new objects become entries, objects replaced by other
    /// tools new content (or a conflict copy), deleted ones leave (see
    /// [`Vfs::drop_deleted`]).
    fn apply_bucket_listing(
        &self,
        dir: Ino,
        path: &[u8],
        relisted: bool,
        listing: deskfs_bucket::Listing,
        started: std::time::Instant,
    ) -> Result<()> {
        let listed_in = started.elapsed();
        let keep = |n: &str| n.len() <= NAME_MAX && !(dir == ROOT_INO && n.as_bytes() == RESERVED);
        let files: Vec<(String, ObjectInfo)> =
            listing.files.into_iter().filter(|(n, _)| keep(n)).collect();
        let dirs: Vec<String> = listing.dirs.into_iter().filter(|n| keep(n)).collect();
        #[cfg(test)]
        if let Some(race) = tests::AFTER_LIST.with(|r| r.borrow_mut().take()) {
            race();
        }
        let mut plan = ListingPlan::read(&*self.meta, dir, path, &files, &dirs)?;
        self.confirm_replaced(&files, &mut plan);
        let attrs = self.new_object_attrs(&files, &plan.new_files);
        let applied = self.apply_listing(dir, path, &files, &dirs, &plan, &attrs)?;
        self.hints.set_listed(dir);
        // The kernel may hold negative entries for the new names and pages of the
        // replaced contents (delivered after this request: see `feed`).
        if !applied.added.is_empty() {
            // Its cached listing as well.
            self.invalidate_later(crate::Invalidation::Inode(dir));
        }
        for name in applied.added {
            self.invalidate_later(crate::Invalidation::Entry { parent: dir, name });
        }
        for &ino in &applied.changed {
            self.invalidate_later(crate::Invalidation::Inode(ino));
            self.cache.drop_blocks(ino);
        }
        #[cfg(test)]
        if let Some(race) = tests::AFTER_APPLY.with(|r| r.borrow_mut().take()) {
            race();
        }
        self.remove_unheld_staging(&applied.changed);
        for f in &applied.foreign {
            if let Err(e) = self.rt.block_on(self.save_bucket_version(f)) {
                tracing::warn!(path = %String::from_utf8_lossy(&f.path), error = %e, "keeping the bucket's version of a conflicting file failed; the upload checks again");
            }
        }
        // Objects other tools deleted (a re-listing only: the entries were listed before).
        if relisted && !plan.unlisted.is_empty() {
            if let Err(e) = self.drop_deleted(dir, path, &plan.unlisted) {
                tracing::warn!(dir, error = %e, "looking for objects deleted from the bucket failed");
            }
        }
        tracing::debug!(
            dir,
            objects = files.len(),
            list_ms = listed_in.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "directory listed from the bucket"
        );
        Ok(())
    }

    /// Keeps in `plan.changed` only the objects the bucket still holds as listed, asked
    /// after the plan read their records: a listing is a snapshot, and an upload of this
    /// or another mount may have put and recorded newer content since (then the record
    /// read for the plan, or the object now, differs from the listing, and the listing
    /// must not be taken as another tool's change). Objects this mount is uploading are
    /// left out by the write that follows (the listing may show the put before its
    /// record). A HEAD that fails leaves the object out until the next listing.
    /// Costs one HEAD per object whose ETag differs from its record, none otherwise.
    fn confirm_replaced(&self, files: &[(String, ObjectInfo)], plan: &mut ListingPlan) {
        if plan.changed.is_empty() {
            return;
        }
        let bucket = self.bucket.clone();
        plan.changed = self.rt.block_on(
            futures::stream::iter(std::mem::take(&mut plan.changed))
                .map(|(i, rec)| {
                    let bucket = bucket.clone();
                    let (key, listed) = (files[i].1.key.clone(), files[i].1.etag.clone());
                    async move {
                        match bucket.head(&key).await {
                            Ok(Some(h)) if h.etag.is_some() && h.etag == listed => Some((i, rec)),
                            Ok(_) => None,
                            Err(e) => {
                                tracing::debug!(key, error = %e, "cannot confirm a replaced object; looked at again at the next listing");
                                None
                            }
                        }
                    }
                })
                .buffer_unordered(HEAD_CONCURRENCY)
                .filter_map(|x| async move { x })
                .collect(),
        );
    }

    /// POSIX attributes (and symlink targets) of the new objects among `files` (indices
    /// `new`), fetched with [`HEAD_CONCURRENCY`] requests in flight. An object whose HEAD
    /// fails gets default attributes.
    fn new_object_attrs(&self, files: &[(String, ObjectInfo)], new: &[usize]) -> NewAttrs {
        let mut attrs = NewAttrs::new();
        if !self.bucket.supports_metadata() || new.is_empty() {
            return attrs;
        }
        let bucket = self.bucket.clone();
        let jobs: Vec<(String, String, u64)> = new
            .iter()
            .map(|&i| (files[i].0.clone(), files[i].1.key.clone(), files[i].1.size))
            .collect();
        let results: Vec<(String, Option<PosixMeta>, Option<Vec<u8>>)> = self.rt.block_on(
            futures::stream::iter(jobs)
                .map(|(name, key, size)| {
                    let bucket = bucket.clone();
                    async move {
                        let posix = bucket.head(&key).await.ok().flatten().and_then(|h| h.posix);
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
        attrs
    }

    /// Writes what `plan` found, each name checked again inside the transaction (a
    /// request may have created or recorded it since the plan's read), and stamps the
    /// directory listed.
    fn apply_listing(
        &self,
        dir: Ino,
        path: &[u8],
        files: &[(String, ObjectInfo)],
        dirs: &[String],
        plan: &ListingPlan,
        attrs: &NewAttrs,
    ) -> Result<Applied> {
        let mut out = Applied::default();
        deskfs_meta::txn(&*self.meta, |t| {
            out = Applied::default();
            let mut ours = OwnWork::read(t, path)?;
            for (i, planned) in &plan.changed {
                let (name, info) = &files[*i];
                let cpath = join(path, name.as_bytes());
                // Recorded since the confirmation (an upload): the listing is older.
                if t.get_object(&cpath)?.as_ref() != Some(planned)
                    || self.uploader.uploading(&cpath)
                {
                    continue;
                }
                self.take_replaced(t, dir, name.as_bytes(), info, planned.clone(), &mut out)?;
            }
            for &i in &plan.new_files {
                let (name, info) = &files[i];
                let nb = name.as_bytes();
                let cpath = join(path, nb);
                if t.lookup(dir, nb)?.is_some()
                    || t.get_object(&cpath)?.is_some()
                    || ours.at(t, &cpath, &self.uploader, false)?
                {
                    continue;
                }
                let (posix, target) = attrs.get(name).cloned().unwrap_or((None, None));
                self.import_file(t, dir, nb, cpath, info, posix, target)?;
                out.added.push(nb.to_vec());
            }
            let mut new_dirs = 0u32;
            for &j in &plan.new_dirs {
                let nb = dirs[j].as_bytes();
                let cpath = join(path, nb);
                if t.lookup(dir, nb)?.is_some()
                    || t.get_object(&cpath)?.is_some()
                    || ours.at(t, &cpath, &self.uploader, true)?
                {
                    continue;
                }
                self.import_dir(t, dir, nb, cpath)?;
                out.added.push(nb.to_vec());
                new_dirs += 1;
            }
            if let Some(mut d) = t.get_inode(dir)? {
                d.nlink += new_dirs;
                d.listed_ns = now_ns();
                t.update_inode(&d)?;
            }
            Ok::<_, crate::VfsError>(())
        })?;
        Ok(out)
    }

    /// Recorded object `obj` of entry `name` in `dir` shows ETag `info.etag` in the
    /// bucket now: another tool replaced it. A clean, closed file takes the new content;
    /// one with local writes not uploaded keeps them, and the bucket's version is saved
    /// beside it ([`crate::external`]).
    fn take_replaced(
        &self,
        t: &mut dyn MetaTxn,
        dir: Ino,
        name: &[u8],
        info: &ObjectInfo,
        obj: ObjectRow,
        out: &mut Applied,
    ) -> Result<()> {
        if !etag_changed(&obj, info) {
            return Ok(());
        }
        let Some(d) = t.lookup(dir, name)? else {
            return Ok(());
        };
        let Some(mut r) = t.get_inode(d.ino)? else {
            return Ok(());
        };
        if d.ino != obj.ino || r.kind != Kind::File {
            return Ok(());
        }
        let local_writes = r.dirty || r.data_version != obj.data_version;
        if local_writes {
            if let Some(etag) = &info.etag {
                out.foreign.push(crate::external::Foreign {
                    path: obj.path.clone(),
                    key: obj.key.clone(),
                    recorded: obj.clone(),
                    etag: etag.clone(),
                });
            }
        } else if !self.is_open(r.ino) {
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
            out.changed.push(r.ino);
        }
        Ok(())
    }

    /// Adds object `info` as file (or symlink) `name` in `dir` at workspace path `cpath`,
    /// with the POSIX attributes its metadata carried (else defaults).
    #[allow(clippy::too_many_arguments)]
    fn import_file(
        &self,
        t: &mut dyn MetaTxn,
        dir: Ino,
        name: &[u8],
        cpath: Vec<u8>,
        info: &ObjectInfo,
        posix: Option<PosixMeta>,
        target: Option<Vec<u8>>,
    ) -> Result<Ino> {
        let cfg = &self.cfg;
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
            target: if kind == Kind::Symlink { target } else { None },
            local: Local::None,
            dirty: false,
            listed_ns: 0,
        };
        let obj = ObjectRow {
            path: cpath,
            key: info.key.clone(),
            ino: 0,
            kind,
            data_version: 1,
            meta_stamp: row.ctime_ns,
            etag: info.etag.clone(),
            size: info.size,
        };
        insert_imported(t, dir, name, &row, obj)
    }

    /// Adds bucket prefix `name/` as directory `name` in `dir` (workspace path `cpath`),
    /// recorded as known so that a local `rmdir` is not undone by a re-listing.
    fn import_dir(
        &self,
        t: &mut dyn MetaTxn,
        dir: Ino,
        name: &[u8],
        cpath: Vec<u8>,
    ) -> Result<Ino> {
        let cfg = &self.cfg;
        let row = InodeRow::fresh(Kind::Dir, 0o755, cfg.default_uid, cfg.default_gid, now_ns());
        let obj = ObjectRow {
            key: self.key_for(&cpath),
            path: cpath,
            ino: 0,
            kind: Kind::Dir,
            data_version: 0,
            meta_stamp: i64::MIN,
            etag: None,
            size: 0,
        };
        insert_imported(t, dir, name, &row, obj)
    }

    /// Lists every directory under `dir` (inclusive) that was never listed, so that the
    /// whole subtree is in the namespace before it moves (its objects must move with it).
    pub(crate) fn ensure_subtree_listed(&self, dir: Ino) -> Result<()> {
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            self.ensure_listed(d, false)?;
            const PAGE: usize = 1024;
            let mut after = 0;
            loop {
                let rows = deskfs_meta::read(&*self.meta, |t| t.list_dir(d, after, PAGE))?;
                let last_page = rows.len() < PAGE;
                for (de, r) in rows {
                    after = de.cookie;
                    if r.kind == Kind::Dir {
                        stack.push(r.ino);
                    }
                }
                // A short page is the last: no read of an empty one.
                if last_page {
                    break;
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

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;
    use std::sync::Mutex;

    /// Run (on a blocking thread) by a refresh's bucket listing of key `.0` before it asks
    /// the bucket; an error it returns is the listing's answer. Keyed by the listed key:
    /// tests running at once list other keys.
    pub(crate) type RefreshHook = Box<dyn FnOnce() -> Option<deskfs_bucket::BucketError> + Send>;

    static REFRESH_HOOKS: Mutex<Vec<(String, RefreshHook)>> = Mutex::new(Vec::new());

    /// Sets the hook of the next refresh listing `key`.
    pub(crate) fn on_refresh(key: &str, hook: RefreshHook) {
        REFRESH_HOOKS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((key.to_string(), hook));
    }

    pub(super) fn take_refresh_hook(key: &str) -> Option<RefreshHook> {
        let mut hooks = REFRESH_HOOKS.lock().unwrap_or_else(|p| p.into_inner());
        let i = hooks.iter().position(|(k, _)| k == key)?;
        Some(hooks.remove(i).1)
    }

    thread_local! {
        /// Run once by the next directory listing on this thread, between the bucket's
        /// answer and the plan's read of the records: changes landing there.
        pub(crate) static AFTER_LIST: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run once by the next directory listing on this thread that took another
        /// tool's content for files, after its commit and before their staging files go.
        pub(crate) static AFTER_APPLY: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}
