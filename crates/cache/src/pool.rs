//! A reserve of pre-made empty files for new staging files. Creating a file (allocating
//! an inode in the cache file system) can cost hundreds of microseconds when the file
//! system has churned (ext4 without a journal scans past every recently deleted inode of
//! the group: 0.6–1 ms per create measured here after a few thousand deletes); renaming a
//! ready file into place costs a few. So the allocation happens before the burst that
//! needs it:
//!
//! - a background thread keeps empty files ready, first from **recycled** staging files
//!   of purged inodes (truncated to 0 there, off the request path), then by creating new
//!   ones: a few during a burst of creates, and, once it ends, twice as many as the
//!   burst took ([`Sizing`]; at most a bound, and fewer when the file system is short of
//!   free inodes);
//! - the reserve outlives the process: at start, the pools of processes that are gone
//!   (an unmounted or crashed mount of this cache dir) are **adopted**, not deleted, so a
//!   remount starts with a full reserve and deletes nothing (deleting thousands of files
//!   would itself make the next creates slow).
//!
//! Pool files live in `<cache>/pools/<pid>/` (per process: several mounts may share a
//! cache dir; on the staging area's file system, so a rename moves one into place). A
//! pool file named `<n>` was created empty and never written; one named `r<n>` is a
//! recycled staging file and is truncated before it is handed out. Nothing in the
//! metadata names a pool file, so taking, adopting or losing one never touches a file's
//! content.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::Cache;

pub(crate) struct Pool {
    /// `<cache>/pools`.
    pools: PathBuf,
    /// `<cache>/pools/<our pid>`.
    dir: PathBuf,
    ready: Mutex<Vec<PathBuf>>,
    /// Recycled staging files still holding their old content (truncated by the thread).
    recycled: Mutex<Vec<PathBuf>>,
    wake: Condvar,
    /// The next number for a pool file's name (above every adopted one).
    seq: AtomicU64,
    /// Takes (and misses) since the last idle moment: the size of the current burst.
    taken: AtomicUsize,
    /// When the last take happened, ms after `born` (0: never).
    last_take_ms: AtomicU64,
    born: Instant,
}

/// Recycled files kept waiting beyond this are deleted instead.
const MAX_RECYCLED: usize = 4096;

/// Ready files always kept when the file system has any free inodes at all.
const MIN_READY: usize = 64;

/// At most this share of the cache file system's free inodes goes to the reserve (1/8).
const FREE_INODE_SHARE: u64 = 8;

impl Pool {
    pub(crate) fn new(root: &Path) -> Pool {
        let pools = root.join("pools");
        Pool {
            dir: pools.join(std::process::id().to_string()),
            pools,
            ready: Mutex::new(Vec::new()),
            recycled: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            seq: AtomicU64::new(1),
            taken: AtomicUsize::new(0),
            last_take_ms: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// Ready files now (`deskfs status`, tests).
    pub(crate) fn ready(&self) -> usize {
        self.ready.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Renames a ready empty file to `dest`; false when the pool is empty (the caller then
    /// creates the file itself).
    pub(crate) fn take_into(&self, dest: &Path) -> bool {
        self.taken.fetch_add(1, Ordering::Relaxed);
        let ms = self.born.elapsed().as_millis() as u64;
        self.last_take_ms.store(ms.max(1), Ordering::Relaxed);
        let f = self.ready.lock().ok().and_then(|mut v| v.pop());
        self.wake.notify_one();
        match f {
            Some(f) => std::fs::rename(&f, dest).is_ok(),
            None => false,
        }
    }

    /// A fresh name in our pool dir (`r` prefix: a recycled file).
    fn fresh_name(&self, recycled: bool) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.dir.join(if recycled {
            format!("r{n}")
        } else {
            n.to_string()
        })
    }

    /// Moves the file at `src` (a staging file nobody reads or will open again) into the
    /// pool for reuse; false when it could not (the caller deletes it).
    pub(crate) fn recycle(&self, src: &Path) -> bool {
        let Ok(mut v) = self.recycled.lock() else {
            return false;
        };
        if v.len() >= MAX_RECYCLED || std::fs::create_dir_all(&self.dir).is_err() {
            return false;
        }
        let dest = self.fresh_name(true);
        if std::fs::rename(src, &dest).is_err() {
            return false;
        }
        v.push(dest);
        drop(v);
        self.wake.notify_one();
        true
    }

    /// One recycled file made empty and ready; false when there was none.
    fn refill_from_recycled(&self) -> bool {
        let Some(p) = self.recycled.lock().ok().and_then(|mut v| v.pop()) else {
            return false;
        };
        let emptied = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|f| f.set_len(0));
        match emptied {
            Ok(()) => {
                if let Ok(mut v) = self.ready.lock() {
                    v.push(p);
                }
            }
            Err(_) => {
                let _ = std::fs::remove_file(&p);
            }
        }
        true
    }

    /// Takes over the pool dirs of processes that are gone (and, at `start`, a stale one
    /// under our own pid): their files join ours — `<n>` ready, `r<n>` to be truncated first — up to
    /// `cap` files; the rest are deleted. Renames are atomic, so two mounts adopting at
    /// once each get a file or miss it (`ENOENT`), never share one.
    fn adopt(&self, cap: usize, start: bool) {
        let Ok(rd) = std::fs::read_dir(&self.pools) else {
            return;
        };
        let ours = std::process::id().to_string();
        let mut dead = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str() else { continue };
            // `<pid>`, or `adopting-<pid>` left by a process that died adopting.
            let pid = pid.strip_prefix("adopting-").unwrap_or(pid);
            if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let gone = if pid == ours {
                start
            } else {
                !Path::new(&format!("/proc/{pid}")).exists()
            };
            if gone {
                dead.push(e.path());
            }
        }
        if std::fs::create_dir_all(&self.pools).is_err() {
            return;
        }
        for old in dead {
            // A dir of our own pid (reused) is adopted in place: move it aside first.
            let src = if old == self.dir {
                let aside = self.pools.join(format!("adopting-{ours}"));
                if std::fs::rename(&old, &aside).is_err() {
                    continue;
                }
                aside
            } else {
                old
            };
            self.adopt_dir(&src, cap);
            let _ = std::fs::remove_dir_all(&src);
        }
    }

    /// Moves the files of `src` into our pool dir, up to `cap` in the pool in all.
    fn adopt_dir(&self, src: &Path, cap: usize) {
        let Ok(rd) = std::fs::read_dir(src) else {
            return;
        };
        if std::fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        for e in rd.flatten() {
            let held = self.ready() + self.recycled.lock().map(|v| v.len()).unwrap_or(0);
            if held >= cap {
                return;
            }
            let recycled = e.file_name().to_string_lossy().starts_with('r');
            let dest = self.fresh_name(recycled);
            if std::fs::rename(e.path(), &dest).is_err() {
                continue;
            }
            let list = if recycled {
                &self.recycled
            } else {
                &self.ready
            };
            if let Ok(mut v) = list.lock() {
                v.push(dest);
            }
        }
    }

    /// How many ready files to keep now: `target`, fewer when the cache file system has
    /// few free inodes (at most 1/[`FREE_INODE_SHARE`] of them, or [`MIN_READY`] where
    /// that is still a small share; file systems that report no inode counts, such as
    /// btrfs, are not limited).
    fn goal(&self, target: usize) -> usize {
        goal_for(target, inode_counts(&self.pools).ok())
    }

    /// Starts the thread that keeps the reserve: at most `max` files (and at most its
    /// share of free inodes). See [`Sizing`] for how many it keeps when.
    pub(crate) fn start(cache: Weak<Cache>, max: usize) {
        let _ = std::thread::Builder::new()
            .name("deskfs-pool".into())
            .spawn(move || {
                // Ahead of need, with spare CPU only: the lowest priority (a failure
                // leaves the default).
                // SAFETY: plain syscalls on this thread's own id.
                unsafe {
                    let tid = libc::gettid();
                    libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
                }
                let mut sizing = match cache.upgrade() {
                    Some(c) => {
                        c.pool.adopt(c.pool.goal(max), true);
                        Sizing::new(max, c.pool.ready() + c.pool.recycled_len())
                    }
                    None => return,
                };
                let mut bound = 0;
                let mut looked = 0usize;
                let mut adopted_at = Instant::now();
                loop {
                    let Some(c) = cache.upgrade() else { return };
                    let pool = &c.pool;
                    if std::fs::create_dir_all(&pool.dir).is_err() {
                        return;
                    }
                    // The free-inode bound, looked at again every 256 files made.
                    if looked == 0 {
                        bound = pool.goal(max);
                    }
                    looked = (looked + 1) % 256;
                    let idle = pool.idle();
                    if idle {
                        sizing.burst_ended(pool.taken.swap(0, Ordering::Relaxed));
                        // A mount unmounted just before this one started may have been
                        // alive at the first look: look again now and then.
                        if adopted_at.elapsed() >= ADOPT_AGAIN {
                            adopted_at = Instant::now();
                            pool.adopt(bound, false);
                            sizing.adopted(pool.ready() + pool.recycled_len());
                        }
                    }
                    let want = sizing.want(idle).min(bound);
                    let have = pool.ready();
                    if have < want && pool.refill_from_recycled() {
                        drop(c);
                        continue;
                    }
                    if have < want {
                        let p = pool.fresh_name(false);
                        if std::fs::File::create(&p).is_ok() {
                            if let Ok(mut v) = pool.ready.lock() {
                                v.push(p);
                            }
                        }
                        drop(c);
                        continue;
                    }
                    looked = 0;
                    // Enough for now: sleep until something is taken (or a while passes).
                    if let Ok(g) = pool.ready.lock() {
                        let _ = pool.wake.wait_timeout(g, Duration::from_millis(250));
                    }
                    drop(c);
                }
            });
    }

    /// Files waiting to be truncated.
    fn recycled_len(&self) -> usize {
        self.recycled.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// No file taken for [`IDLE`].
    fn idle(&self) -> bool {
        let last = self.last_take_ms.load(Ordering::Relaxed);
        last == 0 || self.born.elapsed().as_millis() as u64 >= last + IDLE.as_millis() as u64
    }
}

/// How often an idle pool looks for pools of processes gone since.
const ADOPT_AGAIN: Duration = Duration::from_secs(2);

/// How long without a take counts as the end of a burst.
const IDLE: Duration = Duration::from_secs(1);

/// How many ready files the reserve keeps. During a burst of creates only [`MIN_READY`]
/// are made (making more would compete with the burst for the CPU and the file system);
/// when it ends, the reserve grows to twice the burst's size (at most `max`), made while
/// nothing is created. It never shrinks while the process runs, and a remount adopts it
/// whole. So short-lived mounts keep a small reserve, and a workspace that sees bursts of
/// thousands of new files (an untar, a clone, an install) has them ready for the next.
#[derive(Debug)]
pub(crate) struct Sizing {
    max: usize,
    target: usize,
}

impl Sizing {
    /// `held`: files already in the pool (adopted).
    pub(crate) fn new(max: usize, held: usize) -> Sizing {
        Sizing {
            max,
            target: held.max(MIN_READY).min(max),
        }
    }

    /// The pool holds `held` files after an adoption: a reserve that size is kept.
    pub(crate) fn adopted(&mut self, held: usize) {
        self.target = self.target.max(held).min(self.max);
    }

    /// A burst of `taken` takes ended.
    pub(crate) fn burst_ended(&mut self, taken: usize) {
        self.target = self.target.max(taken.saturating_mul(2)).min(self.max);
    }

    /// Ready files to keep now.
    pub(crate) fn want(&self, idle: bool) -> usize {
        if idle {
            self.target
        } else {
            MIN_READY.min(self.target)
        }
    }
}

/// [`Pool::goal`] from the file system's `(total, free)` inode counts (`None`: unknown).
pub(crate) fn goal_for(target: usize, counts: Option<(u64, u64)>) -> usize {
    let Some((total, free)) = counts else {
        return MIN_READY.min(target);
    };
    if total == 0 {
        return target;
    }
    let share = usize::try_from(free / FREE_INODE_SHARE).unwrap_or(usize::MAX);
    let floor = if free >= 4 * MIN_READY as u64 {
        MIN_READY
    } else {
        0
    };
    target.min(share.max(floor))
}

/// `(total inodes, free inodes for unprivileged users)` of the file system holding `p`
/// (`statvfs(3)`). Errors: the call's.
fn inode_counts(p: &Path) -> std::io::Result<(u64, u64)> {
    let st = crate::statvfs(p)?;
    Ok((st.f_files, st.f_favail))
}
