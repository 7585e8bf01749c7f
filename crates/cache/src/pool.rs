//! A pool of pre-made empty files for new staging files. Creating a file (allocating an
//! inode in the cache file system) can cost hundreds of microseconds when the file system
//! has churned; renaming a ready file into place costs a few. A background thread refills
//! the pool. Pool files live in `staging/.pool-<pid>/` (per process: several mounts may
//! share a cache dir); those of dead processes are removed when a cache is opened.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, Weak};
use std::time::Duration;

use crate::Cache;

pub(crate) struct Pool {
    dir: PathBuf,
    ready: Mutex<Vec<PathBuf>>,
    wake: Condvar,
}

impl Pool {
    pub(crate) fn new(staging: &Path) -> Pool {
        if let Ok(rd) = std::fs::read_dir(staging) {
            for e in rd.flatten() {
                let name = e.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(".pool-")) else {
                    continue;
                };
                if !Path::new(&format!("/proc/{pid}")).exists()
                    || pid == std::process::id().to_string()
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Pool {
            dir: staging.join(format!(".pool-{}", std::process::id())),
            ready: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        }
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
