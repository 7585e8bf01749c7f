//! File content: open/create, read, write, flush/release, fsync, truncate; the staging
//! file (local journal), remote reads through the block cache with readahead, and
//! materialising a remote file locally before its first write.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deskfs_cache::BlockKey;
use deskfs_meta::{Ino, InodeRow, Kind, Local};
use futures::future::{BoxFuture, FutureExt, Shared};

use crate::handles::{Handle, InodeState, OPEN_CLOSED, OPEN_RECORDED, OPEN_UNRECORDED};
use crate::namespace::NodeSpec;
use crate::types::{Attr, Ctx, Opened};
use crate::{now_ns, poisoned, Result, Vfs, VfsError};

/// Largest file size, bytes (ext4 with 4 KiB blocks: 16 TiB).
pub const MAX_FILE_SIZE: u64 = 16 << 40;
/// Range size of whole-file downloads, bytes.
const DOWNLOAD_CHUNK: u64 = 8 << 20;

type BlockFuture = Shared<BoxFuture<'static, std::result::Result<Bytes, String>>>;

/// Readahead window of a reader's first sequential read, blocks (doubles from there).
const RA_START_BLOCKS: u64 = 2;

/// Block fetches in flight, shared so that a reader and the readahead never fetch the
/// same block twice.
#[derive(Default, Clone)]
pub(crate) struct Inflight {
    map: Arc<Mutex<HashMap<BlockKey, BlockFuture>>>,
}

fn io_err(msg: impl Into<String>) -> VfsError {
    VfsError::Io(std::io::Error::other(msg.into()))
}

impl Vfs {
    /// Runs `f` on the live in-memory state of `ino` (created and loaded from the metadata
    /// engine if absent), locked. A state detached from the table by a concurrent last
    /// close is never used: the lookup is retried. Afterwards the state is dropped from the
    /// table when no handle holds it and nothing is uncommitted.
    pub(crate) fn locked<T>(
        &self,
        ino: Ino,
        f: impl FnOnce(&mut InodeState) -> Result<T>,
    ) -> Result<T> {
        loop {
            let st = self.state_arc(ino);
            let mut s = st.lock().map_err(|_| poisoned())?;
            if s.detached {
                continue;
            }
            if !s.loaded {
                if let Err(e) = self.load_state(ino, &mut s) {
                    self.maybe_detach(ino, &st, &mut s);
                    return Err(e);
                }
            }
            let out = f(&mut s);
            self.maybe_detach(ino, &st, &mut s);
            return out;
        }
    }

    /// Like [`Vfs::locked`] for infallible bodies.
    pub(crate) fn with_state<T>(
        &self,
        ino: Ino,
        f: impl FnOnce(&mut InodeState) -> T,
    ) -> Result<T> {
        self.locked(ino, |s| Ok(f(s)))
    }

    pub(crate) fn state_arc(&self, ino: Ino) -> Arc<Mutex<InodeState>> {
        let mut m = self.inodes.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(ino).or_default().clone()
    }

    fn load_state(&self, ino: Ino, s: &mut InodeState) -> Result<()> {
        let row =
            deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.ok_or(VfsError::NotFound)?;
        s.size = row.size;
        s.mtime_ns = row.mtime_ns;
        s.ctime_ns = row.ctime_ns;
        s.version = row.data_version;
        s.loaded = true;
        Ok(())
    }

    /// Close-to-open (and lock-to-read) coherence between mounts: when the committed
    /// content version changed since this mount loaded it (another mount wrote), reload
    /// size and times, reopen the staging file, and (with `kernel`) drop the kernel's
    /// cached pages and attributes. Nothing happens while this mount has uncommitted
    /// writes (they win at their commit).
    pub(crate) fn revalidate(&self, ino: Ino, kernel: bool) -> Result<()> {
        let changed = self.locked(ino, |s| {
            if s.uncommitted {
                return Ok(false);
            }
            let row =
                deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.ok_or(VfsError::NotFound)?;
            if row.data_version == s.version && row.size == s.size {
                return Ok(false);
            }
            s.size = row.size;
            s.mtime_ns = row.mtime_ns;
            s.ctime_ns = row.ctime_ns;
            s.version = row.data_version;
            s.staging = None;
            Ok(true)
        })?;
        if changed {
            if kernel {
                self.invalidate_now(&crate::Invalidation::Inode(ino));
            } else {
                self.kernel_pages.forget(ino);
            }
        }
        Ok(())
    }

    /// Removes an idle state from the table (caller holds the state's lock).
    fn maybe_detach(&self, ino: Ino, st: &Arc<Mutex<InodeState>>, s: &mut InodeState) {
        if s.open_count == 0 && !s.uncommitted {
            let mut m = self.inodes.lock().unwrap_or_else(|p| p.into_inner());
            if m.get(&ino).is_some_and(|cur| Arc::ptr_eq(cur, st)) {
                m.remove(&ino);
            }
            s.staging = None;
            s.loaded = false;
            s.detached = true;
        }
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .lock()
            .map_err(|_| poisoned())?
            .get(&fh)
            .cloned()
            .ok_or(VfsError::BadHandle)
    }

    /// A new handle. `recorded`: its open is already in the open-file table (`create`
    /// records it in its own transaction); otherwise it is recorded now when other
    /// mounts are live (see [`Vfs::publish_opens`]).
    fn new_handle(&self, ino: Ino, flags: i32, recorded: bool) -> Result<u64> {
        let acc = flags & libc::O_ACCMODE;
        let h = Arc::new(Handle {
            ino,
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            append: flags & libc::O_APPEND != 0,
            dir: false,
            last_read_end: AtomicU64::new(u64::MAX),
            ra_blocks: AtomicU64::new(0),
            lock_owners: Default::default(),
            recorded: AtomicU8::new(if recorded {
                OPEN_RECORDED
            } else {
                OPEN_UNRECORDED
            }),
        });
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .map_err(|_| poisoned())?
            .insert(fh, h.clone());
        // Inserted first, then checked: either this open sees the flag or the publisher
        // sees this handle (both compare-and-swap, so it is counted once).
        if !recorded && self.track_opens.load(Ordering::SeqCst) {
            let session = self.session.load(Ordering::SeqCst);
            let res = deskfs_meta::txn(&*self.meta, |t| h.record_open(t, session));
            if let Err(e) = res {
                h.recorded.store(OPEN_CLOSED, Ordering::SeqCst);
                self.handles.lock().map_err(|_| poisoned())?.remove(&fh);
                return Err(e.into());
            }
        }
        Ok(fh)
    }

    /// `open`: a handle on an existing inode; `O_TRUNC` truncates (without fetching the old
    /// content). Errors: `ENOENT`, `EISDIR` (write on a directory).
    pub fn open(&self, _ctx: &Ctx, ino: Ino, flags: i32) -> Result<Opened> {
        let row =
            deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.ok_or(VfsError::NotFound)?;
        let acc = flags & libc::O_ACCMODE;
        if row.kind == Kind::Dir && acc != libc::O_RDONLY {
            return Err(VfsError::IsDir);
        }
        if row.kind == Kind::File {
            // Another mount's new content: the kernel's cached size and pages go (no
            // directory or page lock of this inode is held by the kernel during OPEN).
            self.revalidate(ino, true)?;
        }
        let keep_cache = self.locked(ino, |s| {
            let trunc = flags & libc::O_TRUNC != 0 && acc != libc::O_RDONLY;
            if trunc && row.kind == Kind::File {
                self.truncate_locked(ino, s, 0)?;
            }
            s.open_count += 1;
            // The kernel's pages stay when they hold the current content (every change
            // since came through this kernel, or was invalidated).
            Ok(row.kind == Kind::File && !trunc && self.kernel_pages.opened(ino, s.version))
        })?;
        let fh = self.new_handle(ino, flags, false)?;
        Ok(Opened { fh, keep_cache })
    }

    /// `create`: a new regular file, opened. Errors: `EEXIST`, `ENOENT`, `ENOTDIR`,
    /// `ENAMETOOLONG`.
    pub fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Opened)> {
        let tracked = self.track_opens.load(Ordering::SeqCst);
        let row = self.create_node(
            ctx,
            parent,
            name,
            NodeSpec {
                open_in: tracked.then(|| self.session.load(Ordering::SeqCst)),
                ..NodeSpec::new(Kind::File, mode & !umask & 0o7777)
            },
        )?;
        self.locked(row.ino, |s| {
            s.open_count += 1;
            self.kernel_pages.opened(row.ino, s.version);
            Ok(())
        })?;
        let fh = self.new_handle(row.ino, flags, tracked)?;
        Ok((
            crate::attr_of(&row),
            Opened {
                fh,
                keep_cache: false,
            },
        ))
    }

    /// Makes the content of `ino` local in its staging file (download when needed; not when
    /// the caller is about to truncate to 0). Caller holds the state lock.
    fn ensure_local(
        &self,
        ino: Ino,
        s: &mut InodeState,
        truncating_to: Option<u64>,
    ) -> Result<Arc<File>> {
        if let Some(f) = &s.staging {
            return Ok(f.clone());
        }
        let row =
            deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.ok_or(VfsError::NotFound)?;
        if row.local == Local::Full {
            match self.cache.open_staging(ino, false) {
                Ok(f) => {
                    let f = Arc::new(f);
                    s.staging = Some(f.clone());
                    return Ok(f);
                }
                // An empty file whose staging file was never created (crash right after
                // its create committed) falls through and gets an empty one.
                Err(e) if row.size > 0 => {
                    tracing::error!(ino, error = %e, "staging file missing for a local inode");
                    if row.dirty {
                        return Err(e.into());
                    }
                }
                Err(_) => {}
            }
        }
        if row.size == 0 || truncating_to == Some(0) {
            let f = self.cache.open_staging(ino, true)?;
            f.set_len(0)?;
        } else {
            self.download_full(&row)?;
        }
        deskfs_meta::txn(&*self.meta, |t| {
            if let Some(mut r) = t.get_inode(ino)? {
                if r.local != Local::Full {
                    r.local = Local::Full;
                    t.update_inode(&r)?;
                }
            }
            Ok(())
        })?;
        let f = Arc::new(self.cache.open_staging(ino, false)?);
        s.staging = Some(f.clone());
        Ok(f)
    }

    /// Downloads the whole content of `row` (its current version) into its staging file,
    /// fsyncing it before it is recorded as local.
    pub(crate) fn download_full(&self, row: &InodeRow) -> Result<()> {
        let src = deskfs_meta::read(&*self.meta, |t| {
            t.object_with_content(row.ino, row.data_version)
        })?;
        let Some(src) = src else {
            return Err(io_err(format!(
                "content of inode {} version {} is neither local nor in the bucket",
                row.ino, row.data_version
            )));
        };
        let path = self.cache.staging_path(row.ino);
        // A name of our own: another mount sharing this cache dir may download the same
        // inode at the same time (a shared `.part` would be truncated under us).
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = path.with_extension(format!(
            "part.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let res = self.download_into(row, &src, &tmp).and_then(|()| {
            // Never replace a staging file that appeared meanwhile: it is the same content
            // (another mount's download), maybe already written to since.
            match nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                &tmp,
                nix::fcntl::AT_FDCWD,
                &path,
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => Ok(()),
                Err(nix::errno::Errno::EEXIST) => {
                    let _ = std::fs::remove_file(&tmp);
                    Ok(())
                }
                Err(e) => Err(VfsError::Io(std::io::Error::from(e))),
            }
        });
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res
    }

    /// Writes the content of `row` (object `src`) into the new file `tmp`, fsynced.
    fn download_into(
        &self,
        row: &InodeRow,
        src: &deskfs_meta::ObjectRow,
        tmp: &std::path::Path,
    ) -> Result<()> {
        let f = File::create(tmp)?;
        let mut off = 0u64;
        while off < row.size {
            let end = (off + DOWNLOAD_CHUNK).min(row.size);
            let data = self.rt.block_on(self.bucket.get_range(
                &src.key,
                off..end,
                src.etag.as_deref(),
            ))?;
            if data.len() as u64 != end - off {
                return Err(io_err(format!("short read of {} from the bucket", src.key)));
            }
            f.write_all_at(&data, off)?;
            off = end;
        }
        f.set_len(row.size)?;
        f.sync_all()?;
        Ok(())
    }

    /// `read`: up to `size` bytes at `offset` (short at end of file).
    /// Errors: `EBADF`, `EIO` (content neither cached nor readable from the bucket).
    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let h = self.handle(fh)?;
        if !h.read || h.ino != ino {
            return Err(VfsError::BadHandle);
        }
        let (staging, cur_size) = self.locked(ino, |s| {
            if s.staging.is_none() {
                let local = deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?
                    .map(|r| r.local == Local::Full)
                    .unwrap_or(false);
                if local {
                    if let Ok(f) = self.cache.open_staging(ino, false) {
                        s.staging = Some(Arc::new(f));
                    }
                }
            }
            Ok((s.staging.clone(), s.size))
        })?;
        if offset >= cur_size {
            return Ok(Vec::new());
        }
        let len = (size as u64).min(cur_size - offset) as usize;
        if let Some(f) = staging {
            self.cache.touch_staging(ino);
            let mut buf = vec![0u8; len];
            let mut done = 0;
            while done < len {
                let n = f.read_at(&mut buf[done..], offset + done as u64)?;
                if n == 0 {
                    break; // hole at the end of a sparse file reads as zeros
                }
                done += n;
            }
            return Ok(buf);
        }
        self.read_remote(&h, ino, offset, len)
    }

    fn read_remote(&self, h: &Handle, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>> {
        let (row, src) = deskfs_meta::read(&*self.meta, |t| {
            let row = t.get_inode(ino)?;
            let src = match &row {
                Some(r) => t.object_with_content(ino, r.data_version)?,
                None => None,
            };
            Ok((row, src))
        })?;
        let row = row.ok_or(VfsError::NotFound)?;
        let Some(src) = src else {
            return Err(io_err(format!(
                "inode {ino}: content not in the bucket yet and not local"
            )));
        };
        let bs = self.cache.block_size();
        let end = (offset + len as u64).min(row.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let first = offset / bs;
        let last = (end - 1) / bs;
        // Sequential reader: fetch ahead.
        let sequential = h.last_read_end.load(Ordering::Relaxed) == offset || offset == 0;
        let window = if sequential {
            let w = h.ra_blocks.load(Ordering::Relaxed);
            let next = (w * 2).clamp(RA_START_BLOCKS, self.cfg.readahead_blocks.max(1));
            h.ra_blocks.store(next, Ordering::Relaxed);
            next.min(self.cfg.readahead_blocks)
        } else {
            h.ra_blocks.store(0, Ordering::Relaxed);
            0
        };
        if window > 0 {
            let max_idx = (row.size - 1) / bs;
            for idx in (last + 1)..=(last + window).min(max_idx) {
                let k = BlockKey {
                    ino,
                    version: row.data_version,
                    index: idx,
                };
                if self.cache.has_block(&k) {
                    continue;
                }
                let fut = self.block_future(k, &src.key, src.etag.clone(), row.size);
                self.rt.spawn(fut.map(|_| ()));
            }
        }
        let mut out = Vec::with_capacity((end - offset) as usize);
        for idx in first..=last {
            let k = BlockKey {
                ino,
                version: row.data_version,
                index: idx,
            };
            let bstart = idx * bs;
            let from = offset.max(bstart) - bstart;
            let to = end.min(bstart + bs) - bstart;
            // Only the part of the block this request wants is read from the cache.
            if let Some(part) = self.cache.read_block_range(&k, from, to)? {
                if part.len() as u64 == to - from {
                    if first == last {
                        // The whole answer is in one block (the usual 128 KiB read).
                        h.last_read_end.store(end, Ordering::Relaxed);
                        return Ok(part);
                    }
                    out.extend_from_slice(&part);
                    continue;
                }
            }
            let fut = self.block_future(k, &src.key, src.etag.clone(), row.size);
            let data = self.rt.block_on(fut).map_err(io_err)?;
            let to = to.min(data.len() as u64);
            if from < to {
                out.extend_from_slice(&data[from as usize..to as usize]);
            }
        }
        h.last_read_end.store(end, Ordering::Relaxed);
        Ok(out)
    }

    fn block_future(&self, k: BlockKey, key: &str, etag: Option<String>, size: u64) -> BlockFuture {
        let mut map = self.fetches.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(&k) {
            return f.clone();
        }
        let bucket = self.bucket.clone();
        let cache = self.cache.clone();
        let inflight = self.fetches.map.clone();
        let key = key.to_string();
        let bs = cache.block_size();
        let fut = async move {
            let start = k.index * bs;
            let end = (start + bs).min(size);
            let res = bucket.get_range(&key, start..end, etag.as_deref()).await;
            let out = match res {
                Ok(data) if data.len() as u64 == end - start => {
                    let c = cache.clone();
                    let d = data.clone();
                    let _ = tokio::task::spawn_blocking(move || c.write_block(&k, &d)).await;
                    Ok(data)
                }
                Ok(data) => Err(format!(
                    "short read of {key}: {} of {} bytes",
                    data.len(),
                    end - start
                )),
                Err(e) => Err(e.to_string()),
            };
            inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&k);
            out
        }
        .boxed()
        .shared();
        map.insert(k, fut.clone());
        fut
    }

    /// `write`: `data` at `offset` (at the end of file for `O_APPEND` handles, atomically
    /// with respect to other writers of this mount). Returns bytes written.
    /// Errors: `EBADF` (not open for writing), `EFBIG`, `ENOSPC`, `EIO`.
    pub fn write(&self, ino: Ino, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.handle(fh)?;
        if !h.write || h.ino != ino {
            return Err(VfsError::BadHandle);
        }
        self.locked(ino, |s| {
            let f = self.ensure_local(ino, s, None)?;
            let off = if h.append { s.size } else { offset };
            let end = off
                .checked_add(data.len() as u64)
                .filter(|e| *e <= MAX_FILE_SIZE)
                .ok_or(VfsError::FileTooBig)?;
            if !s.uncommitted {
                self.begin_dirty(ino)?;
            }
            f.write_all_at(data, off)?;
            s.size = s.size.max(end);
            s.note_change(now_ns());
            Ok(data.len() as u32)
        })
    }

    /// Records in the metadata engine that the staging file is about to diverge from the
    /// bucket, so a crash before the next commit still uploads what reached the staging
    /// file (recovery re-reads its length).
    fn begin_dirty(&self, ino: Ino) -> Result<()> {
        self.cache.staging_dirty(ino);
        // Usually already dirty (a new file, or writes since the last upload): a read
        // suffices.
        if deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?.is_some_and(|r| r.dirty) {
            return Ok(());
        }
        deskfs_meta::txn(&*self.meta, |t| {
            if let Some(mut r) = t.get_inode(ino)? {
                if !r.dirty {
                    r.dirty = true;
                    t.update_inode(&r)?;
                }
            }
            Ok(())
        })?;
        self.cache.staging_dirty(ino);
        Ok(())
    }

    /// Commits uncommitted writes of a locked state: size, mtime and a new content
    /// version go to the metadata engine in one transaction that also marks every path of
    /// the inode pending. With `durable`, the staging file is fdatasync'ed first and the
    /// commit is made durable (fsync semantics).
    pub(crate) fn commit_locked(&self, ino: Ino, s: &mut InodeState, durable: bool) -> Result<()> {
        if s.uncommitted {
            let (size, mtime, ctime) = (s.size, s.mtime_ns, s.ctime_ns);
            // The transaction returns the new content version: no second read needed.
            let version = deskfs_meta::txn(&*self.meta, |t| {
                let Some(mut r) = t.get_inode(ino)? else {
                    return Ok(None);
                };
                r.size = size;
                r.mtime_ns = mtime;
                r.ctime_ns = ctime.max(r.ctime_ns);
                r.data_version += 1;
                r.dirty = true;
                r.local = Local::Full;
                t.update_inode(&r)?;
                for (parent, name) in t.names_of(ino)? {
                    self.mark_name(t, parent, &name, false)?;
                }
                Ok(Some(r.data_version))
            })?;
            s.uncommitted = false;
            if let Some(v) = version {
                self.kernel_pages.committed(ino, s.version, v);
                s.version = v;
            }
            self.cache.drop_blocks(ino);
            self.uploader.kick();
        }
        if durable {
            // Both device flushes at once: the staging file's data and the metadata log.
            // (Order does not matter: until both are done, fsync has not returned, and
            // recovery adopts whatever of the staging file a dirty inode has.)
            let staging = s.staging.clone();
            std::thread::scope(|sc| -> Result<()> {
                let data = staging.map(|f| sc.spawn(move || f.sync_data()));
                let meta = self.meta.make_durable();
                if let Some(j) = data {
                    j.join().map_err(|_| {
                        VfsError::Io(std::io::Error::other("fdatasync thread panicked"))
                    })??;
                }
                meta?;
                Ok(())
            })?;
        }
        Ok(())
    }

    /// `flush` (every `close` of a descriptor): commits the file's writes so that they
    /// survive a crash of the daemon and are uploaded.
    pub fn flush(&self, ino: Ino, _fh: u64) -> Result<()> {
        self.locked(ino, |s| self.commit_locked(ino, s, false))
    }

    /// `release` (last close of an open file description): commits, then drops the inode
    /// if it was unlinked while open.
    pub fn release(&self, ino: Ino, fh: u64) -> Result<()> {
        let h = self.handles.lock().map_err(|_| poisoned())?.remove(&fh);
        if h.as_ref().is_some_and(|h| h.dir) {
            return Ok(());
        }
        if let Some(h) = &h {
            let owners: Vec<u64> = h
                .lock_owners
                .lock()
                .map(|o| o.iter().copied().collect())
                .unwrap_or_default();
            for owner in owners {
                self.release_fh_locks(ino, owner, fh)?;
            }
        }
        let session = self.session.load(Ordering::SeqCst);
        let mut res = Ok(());
        let (last, size) = self.locked(ino, |s| {
            res = self.commit_locked(ino, s, false);
            if h.is_some() {
                s.open_count = s.open_count.saturating_sub(1);
            }
            Ok((s.open_count == 0, s.size))
        })?;
        let recorded = h
            .as_ref()
            .is_some_and(|h| h.recorded.swap(OPEN_CLOSED, Ordering::SeqCst) == OPEN_RECORDED);
        // An unrecorded open needs no write unless its inode may have to go.
        let mut maybe_purge = last;
        if last && !recorded {
            if let Some(r) = deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))? {
                if r.nlink > 0 {
                    maybe_purge = false;
                    if r.local == Local::Full && !r.dirty {
                        self.cache.staging_clean(ino, size);
                    }
                }
            }
        }
        if recorded || maybe_purge {
            let purge = deskfs_meta::txn(&*self.meta, |t| {
                if recorded {
                    t.add_open(ino, session, -1)?;
                }
                if !last {
                    return Ok(false);
                }
                match t.get_inode(ino)? {
                    Some(r) if r.nlink == 0 => {
                        if self.is_open(ino) || t.open_elsewhere(ino, 0)? {
                            return Ok(false);
                        }
                        t.delete_inode(ino)?;
                        Ok(true)
                    }
                    Some(r) => {
                        if r.local == Local::Full && !r.dirty {
                            self.cache.staging_clean(ino, size);
                        }
                        Ok(false)
                    }
                    None => Ok(false),
                }
            })?;
            if purge {
                self.purge_local(ino);
            }
        }
        res
    }

    /// `fsync`/`fdatasync`: the file's data and metadata are on stable local storage when
    /// this returns (the upload follows in the background).
    pub fn fsync(&self, ino: Ino, _fh: u64, _datasync: bool) -> Result<()> {
        self.locked(ino, |s| self.commit_locked(ino, s, true))
    }

    /// Truncate (or extend with zeros) to `size` bytes and commit.
    pub(crate) fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        self.locked(ino, |s| self.truncate_locked(ino, s, size))
    }

    fn truncate_locked(&self, ino: Ino, s: &mut InodeState, size: u64) -> Result<()> {
        let kind = deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?
            .ok_or(VfsError::NotFound)?
            .kind;
        match kind {
            Kind::File => {}
            Kind::Dir => return Err(VfsError::IsDir),
            _ => return Err(VfsError::Invalid),
        }
        if size > MAX_FILE_SIZE {
            return Err(VfsError::FileTooBig);
        }
        let f = self.ensure_local(ino, s, Some(size))?;
        if !s.uncommitted {
            self.begin_dirty(ino)?;
        }
        f.set_len(size)?;
        s.size = size;
        s.note_change(now_ns());
        self.commit_locked(ino, s, false)
    }
}

impl Vfs {
    /// `fallocate(2)` on a regular file: mode 0 (allocate, extending the size),
    /// `FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE` and
    /// `FALLOC_FL_ZERO_RANGE`, applied to the staging file (the content becomes local).
    /// Errors: `EOPNOTSUPP` for other modes, `EBADF` for a handle not open for writing,
    /// `EFBIG`, `ENOSPC`.
    pub fn fallocate(&self, ino: Ino, fh: u64, offset: u64, length: u64, mode: i32) -> Result<()> {
        let h = self.handle(fh)?;
        if !h.write || h.ino != ino {
            return Err(VfsError::BadHandle);
        }
        let supported =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !supported != 0
            || (mode & libc::FALLOC_FL_PUNCH_HOLE != 0 && mode & libc::FALLOC_FL_KEEP_SIZE == 0)
        {
            return Err(VfsError::NotSupported);
        }
        let end = offset
            .checked_add(length)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(VfsError::FileTooBig)?;
        self.locked(ino, |s| {
            let f = self.ensure_local(ino, s, None)?;
            if !s.uncommitted {
                self.begin_dirty(ino)?;
            }
            use std::os::fd::AsRawFd;
            // SAFETY: plain syscall on an open fd owned by `f`.
            let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, length as i64) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                s.size = s.size.max(end);
            }
            s.note_change(now_ns());
            Ok(())
        })
    }

    /// `lseek(2)` with `SEEK_DATA` / `SEEK_HOLE` (others are answered by the kernel).
    /// Local content answers from the staging file's own holes; remote content is one data
    /// extent. Errors: `ENXIO` at or past end of file, `EINVAL` for other `whence`.
    pub fn lseek(&self, ino: Ino, _fh: u64, offset: i64, whence: i32) -> Result<i64> {
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(VfsError::Invalid);
        }
        let (staging, size) = self.locked(ino, |s| {
            if s.staging.is_none() {
                let local = deskfs_meta::read(&*self.meta, |t| t.get_inode(ino))?
                    .is_some_and(|r| r.local == Local::Full);
                if local {
                    if let Ok(f) = self.cache.open_staging(ino, false) {
                        s.staging = Some(Arc::new(f));
                    }
                }
            }
            Ok((s.staging.clone(), s.size))
        })?;
        if offset < 0 || offset as u64 >= size {
            return Err(VfsError::NoSuchOffset);
        }
        if let Some(f) = staging {
            use std::os::fd::AsRawFd;
            // SAFETY: plain syscall on an open fd owned by `f`.
            let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
            if r >= 0 {
                return Ok(r.min(size as i64));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) && whence == libc::SEEK_HOLE {
                return Ok(size as i64);
            }
            return Err(if e.raw_os_error() == Some(libc::ENXIO) {
                VfsError::NoSuchOffset
            } else {
                e.into()
            });
        }
        Ok(if whence == libc::SEEK_DATA {
            offset
        } else {
            size as i64
        })
    }
}
