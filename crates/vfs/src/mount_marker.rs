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

use deskfs_cache::sync_dir;

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

/// Whether a marker file may be removed: `NotFound` (another mount removed it first) is
/// not an error.
fn remove_if_present(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A marker of `dir` with its lock state: `Ok(Some(true))` when nobody holds it (its
/// mount is gone), `Ok(Some(false))` when a live mount does, `Ok(None)` when it vanished.
fn probe(p: &Path) -> std::io::Result<Option<bool>> {
    match File::open(p) {
        Ok(f) => Ok(Some(try_exclusive(&f)?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// How old a half-made marker (`.new`) must be to be taken for a crash's leftover.
const NEW_MARKER_STALE: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the half-made marker `p` was last changed [`NEW_MARKER_STALE`] ago or more
/// (false when it cannot be told: it is left).
fn stale_leftover(p: &Path) -> bool {
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= NEW_MARKER_STALE)
}

/// Markers (`.live`) and half-made markers (`.new`) in `dir`, but for `own`.
fn markers(dir: &Path, own: Option<&Path>) -> std::io::Result<Vec<(PathBuf, bool)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if Some(p.as_path()) == own {
            continue;
        }
        match p.extension().and_then(|x| x.to_str()) {
            Some("live") => out.push((p, true)),
            Some("new") => out.push((p, false)),
            _ => {}
        }
    }
    Ok(out)
}

/// Whether a mount of the cache dir `cache_root` ended without a clean shutdown and no
/// mount has recovered since: an unlocked marker is there (read-only: for `fsck`, which
/// then takes the leftovers recovery settles for notes). Errors: reading the dir
/// (`EIO`, `EACCES`); a cache dir without markers is `Ok(false)`.
pub(crate) fn unclean_end(cache_root: &Path) -> std::io::Result<bool> {
    let dir = cache_root.join("mounts");
    if !dir.is_dir() {
        return Ok(false);
    }
    for (p, live) in markers(&dir, None)? {
        if live && probe(&p)? == Some(true) {
            return Ok(true);
        }
    }
    Ok(false)
}

impl MountMarker {
    /// Places this mount's marker in `cache_root/mounts/` and tells whether crash
    /// recovery is needed: true when a marker of a mount that did not end cleanly is
    /// found (it is removed), or when the cache dir has never held markers (a cache dir
    /// of an older deskfs). Markers of live mounts sharing the cache dir are left alone.
    ///
    /// Order, so that a power loss at any point keeps the evidence of a crash until a
    /// mount has recovered from it: this mount's marker is made (locked under a `.new`
    /// name no scan trusts, renamed to `.live`) and its directory entry flushed
    /// (`fsync` of `mounts/`) before any dead mount's marker is removed. A removal that a
    /// power loss undoes only makes the next mount recover again. An unlocked `.new`
    /// older than a minute (a crash between its creation and its rename, when the dead
    /// mount's markers were all still there) is removed.
    /// Errors: the cache dir's file system (`EIO`, `ENOSPC`, `EACCES`).
    pub(crate) fn claim(cache_root: &Path) -> std::io::Result<(MountMarker, Found)> {
        let dir = cache_root.join("mounts");
        let mut needs_recovery = !dir.is_dir();
        let mut others_live = false;
        if needs_recovery {
            std::fs::create_dir_all(&dir)?;
            sync_dir(cache_root)?;
        }
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
        sync_dir(&dir)?;
        for (p, live) in markers(&dir, Some(&path))? {
            // A `.new` is unlocked for an instant while a mount sharing the dir makes it:
            // only an old one is a crash's leftover.
            if !live && !stale_leftover(&p) {
                continue;
            }
            match probe(&p)? {
                Some(true) => {
                    // Its mount ended without a clean shutdown (or, `.new`, while it began).
                    needs_recovery |= live;
                    remove_if_present(&p)?;
                }
                Some(false) => others_live |= live,
                None => {}
            }
        }
        let found = Found {
            after_crash: needs_recovery,
            others_live,
        };
        Ok((MountMarker { path, _file: file }, found))
    }

    /// Every write of this mount is committed and on disk (the caller flushed the dirty
    /// staging files and the metadata log): the next mount needs no crash recovery on
    /// its account, even after a power loss. Errors: the removal (`EIO`); the marker
    /// then stays and the next mount recovers in full, which is only slower.
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

    #[test]
    fn fsck_sees_an_unclean_end_until_a_mount_recovers() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(!unclean_end(tmp.path()).unwrap(), "no markers at all");
        let (first, _) = MountMarker::claim(tmp.path()).unwrap();
        assert!(!unclean_end(tmp.path()).unwrap(), "a live mount");
        drop(first);
        assert!(unclean_end(tmp.path()).unwrap(), "a dead mount's marker");
        // A crash of the next mount between its marker's creation and its rename.
        let half = tmp.path().join("mounts/1-1.new");
        std::fs::write(&half, b"").unwrap();
        // Another mount making its marker now: left alone.
        let fresh = tmp.path().join("mounts/2-2.new");
        std::fs::write(&fresh, b"").unwrap();
        let old = std::time::SystemTime::now() - NEW_MARKER_STALE;
        File::options()
            .write(true)
            .open(&half)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let (second, found) = MountMarker::claim(tmp.path()).unwrap();
        assert!(found.after_crash);
        assert!(!unclean_end(tmp.path()).unwrap(), "recovered, and live");
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("mounts"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left.len(),
            2,
            "this mount's marker and the fresh .new: {left:?}"
        );
        assert!(!half.exists() && fresh.exists());
        second.ended_cleanly().unwrap();
        assert!(!unclean_end(tmp.path()).unwrap(), "a clean end");
    }
}
