//! Clean-shutdown markers of a cache dir: whether the mounts that used it before this one
//! all committed their writes before they ended.
//!
//! Crash recovery of dirty inodes (`Vfs::recover`) adopts every dirty staging file as a
//! new content version, one transaction per file: after a crash that is the rule (writes
//! that reached a staging file after the last commit must be uploaded), but after a clean
//! unmount there is nothing to adopt, and a workspace with 100,000 files waiting for their
//! upload would spend seconds on it at every mount. So each mount holds a marker file
//! `<cache>/mounts/<pid>-<ns>.live` with an exclusive `flock` for its whole life, and
//! removes it after its last commit at shutdown. A marker found unlocked belonged to a
//! mount that died without that: recovery runs in full.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// What [`MountMarker::claim`] found in the cache dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    /// A mount of this cache dir ended without a clean shutdown (or the dir is new).
    pub after_crash: bool,
    /// Another mount uses this cache dir now.
    pub others_live: bool,
}

/// This mount's marker (its `flock` lives as long as the file is open).
#[derive(Debug)]
pub(crate) struct MountMarker {
    path: PathBuf,
    _file: File,
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: `Ok(true)` when taken, `Ok(false)` when another open
/// file holds a lock on it.
fn try_exclusive(f: &File) -> std::io::Result<bool> {
    // SAFETY: plain syscall on an open fd owned by `f`.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

impl MountMarker {
    /// Places this mount's marker in `cache_root/mounts/` and tells whether crash
    /// recovery is needed: true when a marker of a mount that did not end cleanly is
    /// found (it is removed), or when the cache dir has never held markers (a cache dir
    /// of an older deskfs). Markers of live mounts sharing the cache dir are left alone.
    /// Errors: the cache dir's file system (`EIO`, `ENOSPC`, `EACCES`).
    pub(crate) fn claim(cache_root: &Path) -> std::io::Result<(MountMarker, Found)> {
        let dir = cache_root.join("mounts");
        let mut needs_recovery = !dir.is_dir();
        let mut others_live = false;
        std::fs::create_dir_all(&dir)?;
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.extension().and_then(|x| x.to_str()) != Some("live") {
                continue;
            }
            let f = match File::open(&p) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if try_exclusive(&f)? {
                // Its mount ended without a clean shutdown.
                needs_recovery = true;
                std::fs::remove_file(&p).or_else(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })?;
            } else {
                others_live = true;
            }
        }
        // Locked under a name no scan looks at, then renamed: a marker any scan sees is
        // locked while its mount lives.
        let name = format!("{}-{}", std::process::id(), crate::now_ns());
        let tmp = dir.join(format!("{name}.new"));
        let file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        if !try_exclusive(&file)? {
            return Err(std::io::Error::other(format!(
                "mount marker {} is locked by another process",
                tmp.display()
            )));
        }
        let path = dir.join(format!("{name}.live"));
        std::fs::rename(&tmp, &path)?;
        let found = Found {
            after_crash: needs_recovery,
            others_live,
        };
        Ok((MountMarker { path, _file: file }, found))
    }

    /// Every write of this mount is committed: the next mount needs no crash recovery
    /// on its account. Errors: removing the marker (`EIO`); the marker then stays and
    /// the next mount recovers in full, which is only slower.
    pub(crate) fn ended_cleanly(self) -> std::io::Result<()> {
        std::fs::remove_file(&self.path)
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_mount_that_did_not_end_cleanly_asks_for_recovery_once() {
        let tmp = tempfile::tempdir().unwrap();
        let (first, found) = MountMarker::claim(tmp.path()).unwrap();
        assert!(found.after_crash, "a cache dir without markers: recover");
        assert!(!found.others_live);
        // A second, live mount sharing the cache dir: no reason to recover.
        let (second, found) = MountMarker::claim(tmp.path()).unwrap();
        assert!(!found.after_crash, "a live mount's marker is left alone");
        assert!(found.others_live, "the first mount is live");
        second.ended_cleanly().unwrap();
        // The first one dies (its lock goes with its file).
        drop(first);
        let (third, found) = MountMarker::claim(tmp.path()).unwrap();
        assert!(found.after_crash, "a dead mount's marker asks for recovery");
        assert!(!found.others_live);
        third.ended_cleanly().unwrap();
        let (_fourth, found) = MountMarker::claim(tmp.path()).unwrap();
        assert!(!found.after_crash, "after clean ends, none is needed");
    }
}
