//! The local disk cache of deskfs, in one directory (`--cache-dir`):
//!
//! * `staging/<ino>` — the **staging file** of an inode: its full content while it has
//!   local writes (the local journal: never evicted while dirty) and, after upload, a clean
//!   full copy that is evictable.
//! * `blocks/<xx>/<ino>.<version>.<index>` — the **block cache**: fixed-size blocks
//!   (default 1 MiB) of bucket objects fetched by ranged GETs, LRU-evicted to stay under
//!   the size cap.
//!
//! This crate knows nothing about the bucket or the metadata engine: the VFS decides which
//! staging file is clean before asking for its eviction.

mod blocks;
mod lru;
mod pool;

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

pub use blocks::BlockKey;
use lru::Lru;

/// Default block size, bytes (1 MiB).
pub const DEFAULT_BLOCK_SIZE: u64 = 1 << 20;

/// Cache errors (all I/O on the cache directory; the VFS maps them to `EIO`, or `ENOSPC`
/// when the disk is full).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// I/O on a cache file.
    #[error("cache I/O error on {path}: {source}")]
    Io {
        /// File involved.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
}

impl CacheError {
    fn io(path: &Path, source: io::Error) -> CacheError {
        CacheError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The raw OS errno, if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            CacheError::Io { source, .. } => source.raw_os_error(),
        }
    }
}

/// Result alias of the cache.
pub type Result<T, E = CacheError> = std::result::Result<T, E>;

/// Sizes for `deskfs status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Bytes held by the block cache.
    pub block_bytes: u64,
    /// Number of cached blocks.
    pub blocks: u64,
    /// Bytes of clean (evictable) staging files tracked.
    pub clean_staging_bytes: u64,
    /// Size cap for evictable data, bytes.
    pub capacity: u64,
    /// Empty files ready for new staging files (the reserve that keeps inode allocation
    /// off the request path).
    pub reserve_files: u64,
}

/// Removes partial downloads (`<ino>.part.<pid>.<n>`, and the older `<ino>.part`) left in
/// `staging` by processes that are gone (a crash mid-download).
/// Removes the download `path` (named `INO.part.PID.SEQ`) when the process that made
/// it is gone (this process's own ones are in progress).
fn remove_if_dead_download(path: &Path, rest: &str) {
    let owner_alive = rest
        .strip_prefix('.')
        .and_then(|r| r.split('.').next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| {
            pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
        });
    if !owner_alive {
        let _ = std::fs::remove_file(path);
    }
}

/// An exclusive lock on the cache dir's staging area, held by every mount sharing the
/// dir while it decides which staging file holds an inode (see [`Cache::local_lock`]).
/// Released when dropped.
pub struct LocalLock {
    _file: File,
}

/// See [`Cache::read_guard`].
pub struct ReadGuard<'a> {
    cache: &'a Cache,
    ino: u64,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        let mut r = self.cache.readers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = r.get_mut(&self.ino) {
            *n -= 1;
            if *n == 0 {
                r.remove(&self.ino);
            }
        }
    }
}

/// Reads the id of the cache at `root` (`cache-id`), creating it when missing: 1 for a
/// cache made before ids existed (its staging dir already has files), else a random
/// 63-bit id. Ids name caches in the metadata engine (which cache holds an inode's
/// content); mounts sharing a cache dir share its id.
fn cache_id(root: &Path, staging: &Path) -> Result<u64> {
    let path = root.join("cache-id");
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            return s
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|id| *id > 0)
                .ok_or_else(|| {
                    CacheError::io(
                        &path,
                        io::Error::new(io::ErrorKind::InvalidData, "not a cache id"),
                    )
                })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(CacheError::io(&path, e)),
    }
    let pre_ids = std::fs::read_dir(staging)
        .map(|mut rd| {
            rd.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().parse::<u64>().is_ok()))
        })
        .unwrap_or(false);
    let id = if pre_ids { 1 } else { random_id() };
    // Written under a temp name, flushed, and linked into place: two mounts opening a
    // fresh cache at once agree on the first id written, and after a power loss the name
    // never stands over an empty file (every staging file's row names this id).
    let tmp = root.join(format!(".cache-id.{}", std::process::id()));
    write_synced(&tmp, format!("{id}\n").as_bytes()).map_err(|e| CacheError::io(&tmp, e))?;
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(root).map_err(|e| CacheError::io(root, e))?;
            Ok(id)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => cache_id(root, staging),
        Err(e) => Err(CacheError::io(&path, e)),
    }
}

/// Creates (or truncates) `path` with `data` and flushes it (`fsync`). Errors: the
/// create, write or flush (a flush error is returned, never dropped).
fn write_synced(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Flushes directory `dir` (`fsync` of the directory), so the names just made, renamed
/// or removed in it survive a power loss. Errors: the open or the flush (`EIO`).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// A random id in `2..2^63` (from the kernel's random source; clock and pid as a fallback).
fn random_id() -> u64 {
    let mut b = [0u8; 8];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_ok();
    let mut v = u64::from_le_bytes(b);
    if !ok {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        v = t ^ ((std::process::id() as u64) << 32);
    }
    (v >> 1).max(2)
}

/// Least free space the cache keeps on its file system, bytes (see
/// [`Cache::space_short`]).
const FREE_RESERVE_MIN: u64 = 4 << 20;
/// Most free space the cache keeps on its file system, bytes.
const FREE_RESERVE_MAX: u64 = 2 << 30;

/// Free space beyond the reserve below which writes come through the daemon (see
/// [`Cache::room_for_direct_writes`]), bytes.
pub const DIRECT_WRITE_ROOM: u64 = 1 << 30;

/// The free-space reserve of a file system of `total` bytes (see [`Cache::space_short`]).
fn reserve_of(total: u64) -> u64 {
    (total / 10).clamp(FREE_RESERVE_MIN, FREE_RESERVE_MAX)
}

/// Size and space available to unprivileged users of the file system holding `path`,
/// bytes; `None` when it cannot be asked.
fn fs_space(path: &Path) -> Option<(u64, u64)> {
    let st = statvfs(path).ok()?;
    let unit = st.f_frsize as u64;
    Some((st.f_blocks as u64 * unit, st.f_bavail as u64 * unit))
}

/// `statvfs(3)` of the file system holding `p`. Errors: the call's.
pub(crate) fn statvfs(p: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid C string; `st` is written by the call before it is read.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// The cache directory.
pub struct Cache {
    root: PathBuf,
    id: u64,
    staging: PathBuf,
    blocks: PathBuf,
    block_size: u64,
    capacity: u64,
    lru: std::sync::Mutex<Lru>,
    pool: pool::Pool,
    /// Staging files being read by path (uploads), with reader counts.
    readers: std::sync::Mutex<std::collections::HashMap<u64, usize>>,
    /// Flushes run by [`Cache::sync_staging`].
    staging_syncs: std::sync::atomic::AtomicU64,
    /// Flushes run by [`Cache::sync_staging_names`].
    name_syncs: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("root", &self.root).finish()
    }
}

impl Cache {
    /// Opens (creating if needed) the cache at `root` with an evictable-data cap of
    /// `capacity` bytes and blocks of `block_size` bytes. Existing blocks are indexed.
    pub fn open(root: &Path, capacity: u64, block_size: u64) -> Result<Cache> {
        let staging = root.join("staging");
        let blocks = root.join("blocks");
        for d in [root, &staging, &blocks] {
            std::fs::create_dir_all(d).map_err(|e| CacheError::io(d, e))?;
        }
        let id = cache_id(root, &staging)?;
        let cache = Cache {
            root: root.to_path_buf(),
            id,
            staging,
            blocks,
            block_size,
            capacity,
            lru: std::sync::Mutex::new(Lru::default()),
            pool: pool::Pool::new(root),
            readers: std::sync::Mutex::new(std::collections::HashMap::new()),
            staging_syncs: std::sync::atomic::AtomicU64::new(0),
            name_syncs: std::sync::atomic::AtomicU64::new(0),
        };
        cache.index_blocks()?;
        Ok(cache)
    }

    /// This cache's id (`Local::At` in the metadata engine): stable for the life of the
    /// cache directory, shared by every mount using it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The cache directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Size cap of evictable data (blocks and clean staging files), bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Block size, bytes.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Path of the staging file of `ino`.
    pub fn staging_path(&self, ino: u64) -> PathBuf {
        self.staging.join(ino.to_string())
    }

    /// Opens the staging file of `ino` for read/write, creating it (empty) if `create`.
    /// Errors: `NotFound` inside [`CacheError::Io`] when absent and not `create`.
    pub fn open_staging(&self, ino: u64, create: bool) -> Result<File> {
        let p = self.staging_path(ino);
        if create && !p.exists() {
            // A pre-made empty file, renamed into place: file creation (inode allocation)
            // stays off the request path.
            self.pool.take_into(&p);
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(&p)
            .map_err(|e| CacheError::io(&p, e))
    }

    /// A new, empty staging file for a freshly allocated inode `ino`, opened read/write:
    /// a pre-made pool file renamed into place (or, with the pool empty, a file created
    /// here). A file already at the path — only a stale one can be, left by an earlier
    /// database with the same inode numbers — is replaced, so the result is always empty.
    /// One rename and one open; no look at the path first. Errors: `Io` (`ENOSPC`, …).
    pub fn create_staging(&self, ino: u64) -> Result<File> {
        let p = self.staging_path(ino);
        let pooled = self.pool.take_into(&p);
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!pooled)
            .open(&p)
            .map_err(|e| CacheError::io(&p, e))
    }

    /// Takes the staging-area lock (`flock` on `staging/.lock`), shared by every process
    /// using this cache dir; blocks until it is free.
    pub fn local_lock(&self) -> Result<LocalLock> {
        use std::os::fd::AsRawFd;
        let p = self.staging.join(".lock");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .map_err(|e| CacheError::io(&p, e))?;
        loop {
            // SAFETY: flock on a descriptor owned by `f`.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(LocalLock { _file: f });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(CacheError::io(&p, e));
            }
        }
    }

    /// Flushes the staging file of `ino` to stable storage (`fdatasync`); a missing file
    /// needs nothing. The uploader calls it before a row may say clean: after a power
    /// loss only dirty staging files are recovered, so a clean one must already be on
    /// disk. Errors: the flush (`EIO`, reported once by the kernel — never retried into a
    /// success by the caller: the row stays dirty and the upload is tried again).
    pub fn sync_staging(&self, ino: u64) -> Result<()> {
        let p = self.staging_path(ino);
        let f = match File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(CacheError::io(&p, e)),
        };
        f.sync_data().map_err(|e| CacheError::io(&p, e))?;
        self.staging_syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Flushes the staging directory (`fsync` of the directory), so that a file just
    /// renamed into it keeps its name after a power loss — before a row may name this
    /// cache as the holder of that content. Errors: the open or the flush (`EIO`).
    pub fn sync_staging_names(&self) -> Result<()> {
        sync_dir(&self.staging).map_err(|e| CacheError::io(&self.staging, e))?;
        self.name_syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// How many staging-directory flushes [`Cache::sync_staging_names`] ran.
    pub fn staging_name_syncs(&self) -> u64 {
        self.name_syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many staging flushes [`Cache::sync_staging`] ran.
    pub fn staging_syncs(&self) -> u64 {
        self.staging_syncs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `ino` has a staging file.
    pub fn has_staging(&self, ino: u64) -> bool {
        self.staging_path(ino).exists()
    }

    /// Keeps up to `target` empty files ready for new staging files, made by a background
    /// thread (which ends when the cache is dropped).
    pub fn start_pool(self: &std::sync::Arc<Self>, target: usize) {
        pool::Pool::start(std::sync::Arc::downgrade(self), target);
    }

    /// Retires the staging file of a purged inode (no name and no handle left, never to be
    /// opened again): it goes to the pool for reuse by a new file, unless someone reads it
    /// by path right now ([`Cache::read_guard`]), in which case it is deleted (the reader
    /// keeps its content through its open descriptor). No error if absent.
    pub fn recycle_staging(&self, ino: u64) -> Result<()> {
        let readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if readers.contains_key(&ino) {
            drop(readers);
            return self.remove_staging(ino);
        }
        self.lru_lock().forget_staging(ino);
        let p = self.staging_path(ino);
        if self.pool.recycle(&p) {
            return Ok(());
        }
        drop(readers);
        self.remove_staging(ino)
    }

    /// Marks the staging file of `ino` as being read by path (an upload) until the guard
    /// is dropped: [`Cache::recycle_staging`] then deletes instead of reusing it.
    pub fn read_guard(&self, ino: u64) -> ReadGuard<'_> {
        *self
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(ino)
            .or_insert(0) += 1;
        ReadGuard { cache: self, ino }
    }

    /// Deletes the staging file of `ino` (no error if absent) and forgets it in the LRU.
    pub fn remove_staging(&self, ino: u64) -> Result<()> {
        self.lru_lock().forget_staging(ino);
        let p = self.staging_path(ino);
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CacheError::io(&p, e)),
        }
    }

    /// Inode numbers that have a staging file (indexed in the background after a mount);
    /// interrupted downloads of processes that are gone are removed on the way.
    pub fn staging_inodes(&self) -> Result<Vec<u64>> {
        let rd = std::fs::read_dir(&self.staging).map_err(|e| CacheError::io(&self.staging, e))?;
        let mut v = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Ok(ino) = name.parse::<u64>() {
                v.push(ino);
            } else if let Some(pid) = name.strip_prefix(".pool-") {
                // A pool of an older deskfs (inside the staging area), its process gone.
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            } else if let Some((ino, rest)) = name.split_once(".part") {
                // Interrupted downloads of processes that are gone go on the way.
                if !ino.is_empty() && ino.bytes().all(|b| b.is_ascii_digit()) {
                    remove_if_dead_download(&e.path(), rest);
                }
            }
        }
        Ok(v)
    }

    /// Records that the staging file of `ino` (`bytes` long) is clean and may be evicted.
    pub fn staging_clean(&self, ino: u64, bytes: u64) {
        self.lru_lock().touch_staging(ino, bytes);
    }

    /// Records that the staging file of `ino` is dirty (never evicted) or in use.
    pub fn staging_dirty(&self, ino: u64) {
        self.lru_lock().forget_staging(ino);
    }

    /// Marks a clean staging file as recently used.
    pub fn touch_staging(&self, ino: u64) {
        self.lru_lock().refresh_staging(ino);
    }

    /// When evictable data exceeds the cap, or the cache dir's file system has less free
    /// than its reserve (see [`Cache::space_short`]): clean staging files (least recently
    /// used first) the VFS should try to evict. Blocks are evicted here directly.
    pub fn over_capacity(&self) -> Vec<u64> {
        let short = self.space_short();
        let (evicted, cap) = {
            let mut lru = self.lru_lock();
            let cap = match short {
                0 => self.capacity,
                n => self
                    .capacity
                    .min((lru.block_bytes + lru.staging_bytes).saturating_sub(n)),
            };
            (lru.evict_blocks(cap), cap)
        };
        for k in evicted {
            let _ = std::fs::remove_file(self.block_path(&k));
        }
        let lru = self.lru_lock();
        lru.staging_victims(cap)
    }

    /// Whether writes may go straight to staging files, past the daemon (FUSE
    /// passthrough: it never sees them, so it cannot make room when one finds the file
    /// system full): the file system has its reserve and [`DIRECT_WRITE_ROOM`] more free,
    /// or the cache holds no clean data that could make room.
    pub fn room_for_direct_writes(&self) -> bool {
        let evictable = {
            let lru = self.lru_lock();
            lru.block_bytes + lru.staging_bytes
        };
        if evictable == 0 {
            return true;
        }
        match fs_space(&self.root) {
            Some((total, avail)) => avail >= reserve_of(total) + DIRECT_WRITE_ROOM,
            None => true,
        }
    }

    /// Bytes the cache dir's file system lacks of its free-space reserve: 10 % of its
    /// size, at least 4 MiB, at most 2 GiB (space for writes to land in while clean data
    /// makes room). 0 when it has the reserve free, or cannot be asked (`statvfs`).
    pub fn space_short(&self) -> u64 {
        match fs_space(&self.root) {
            Some((total, avail)) => reserve_of(total).saturating_sub(avail),
            None => 0,
        }
    }

    /// Sizes for status.
    pub fn stats(&self) -> CacheStats {
        let lru = self.lru_lock();
        CacheStats {
            block_bytes: lru.block_bytes,
            blocks: lru.block_count() as u64,
            clean_staging_bytes: lru.staging_bytes,
            capacity: self.capacity,
            reserve_files: self.pool.ready() as u64,
        }
    }

    fn lru_lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A poisoned LRU only means a panic elsewhere; its data stays usable.
        self.lru.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests;
