//! A pool of pre-made empty files for new staging files. Creating a file (allocating an
//! inode in the cache file system) can cost hundreds of microseconds when the file system
//! has churned (ext4 without a journal scans past recently deleted inodes); renaming a
//! ready file into place costs a few. A background thread refills the pool, first from
//! **recycled** staging files of purged inodes (truncated to 0 there, off the request
//! path), then by creating new ones. Pool files live in `<cache>/pools/<pid>/` (per
//! process: several mounts may share a cache dir; on the staging area's file system, so
//! a rename moves one into place); those of dead processes are removed when a cache is
//! opened — a look at `pools/`, never a scan of the staging area (a million entries).

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, Weak};
use std::time::Duration;

use crate::Cache;

pub(crate) struct Pool {
    dir: PathBuf,
    ready: Mutex<Vec<PathBuf>>,
    /// Recycled staging files still holding their old content (truncated by the thread).
    recycled: Mutex<Vec<PathBuf>>,
    wake: Condvar,
    seq: std::sync::atomic::AtomicU64,
}

/// Recycled files kept waiting beyond this are deleted instead.
const MAX_RECYCLED: usize = 4096;

impl Pool {
    pub(crate) fn new(root: &Path) -> Pool {
        let pools = root.join("pools");
        if let Ok(rd) = std::fs::read_dir(&pools) {
            for e in rd.flatten() {
                let name = e.file_name();
                let Some(pid) = name.to_str() else { continue };
                if !Path::new(&format!("/proc/{pid}")).exists()
                    || pid == std::process::id().to_string()
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Pool {
            dir: pools.join(std::process::id().to_string()),
            ready: Mutex::new(Vec::new()),
            recycled: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            seq: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Ready files now (tests).
    #[cfg(test)]
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Renames a ready empty file to `dest`; false when the pool is empty (the caller then
    /// creates the file itself).
    pub(crate) fn take_into(&self, dest: &Path) -> bool {
        let f = self.ready.lock().ok().and_then(|mut v| v.pop());
        self.wake.notify_one();
        match f {
            Some(f) => std::fs::rename(&f, dest).is_ok(),
            None => false,
        }
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
        let n = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dest = self.dir.join(format!("r{n}"));
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

    pub(crate) fn start(cache: Weak<Cache>, target: usize) {
        let _ = std::thread::Builder::new()
            .name("deskfs-pool".into())
            .spawn(move || {
                let mut n: u64 = 0;
                loop {
                    let Some(c) = cache.upgrade() else { return };
                    let pool = &c.pool;
                    if std::fs::create_dir_all(&pool.dir).is_err() {
                        return;
                    }
                    let have = pool.ready.lock().map(|v| v.len()).unwrap_or(target);
                    if have < target && pool.refill_from_recycled() {
                        drop(c);
                        continue;
                    }
                    if have < target {
                        n += 1;
                        let p = pool.dir.join(n.to_string());
                        if std::fs::File::create(&p).is_ok() {
                            if let Ok(mut v) = pool.ready.lock() {
                                v.push(p);
                            }
                        }
                        drop(c);
                        continue;
                    }
                    // Full: sleep until something is taken (or a while passes).
                    if let Ok(g) = pool.ready.lock() {
                        let _ = pool.wake.wait_timeout(g, Duration::from_millis(500));
                    }
                    drop(c);
                }
            });
    }
}
