//! Advisory locks on lock files of the desk (`.desk/locks/*.lock`), with `flock(2)`.
//!
//! deskfs implements `flock` across processes and mounts, so these locks also hold between
//! a host process and one inside `deskfs exec`. A lock file records the holder's PID for
//! error messages. [`FileLock::acquire`] re-checks after locking that the path still names
//! the locked file (a holder that removes its lock file on release would otherwise let two
//! later processes lock two different files).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{DeskError, IoContext, Result};

/// A held lock; released (and the file removed if asked) on drop.
#[derive(Debug)]
pub struct FileLock {
    file: File,
    path: PathBuf,
    remove_on_drop: bool,
}

/// What a probe of a lock file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Nobody holds it: a leftover of a process that died (or finished without cleaning up).
    Free {
        /// The PID recorded in it, if any.
        pid: Option<u32>,
    },
    /// A live process holds it.
    Held {
        /// The PID recorded in it, if any.
        pid: Option<u32>,
    },
}

fn flock(file: &File, op: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock on a file descriptor we own; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

fn recorded_pid(file: &mut File) -> Option<u32> {
    let mut s = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut s).ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

/// `pid N` or `unknown holder`, for messages.
pub fn describe_holder(pid: Option<u32>) -> String {
    pid.map(|p| format!("pid {p}"))
        .unwrap_or_else(|| "unknown holder".to_owned())
}

impl FileLock {
    /// Tries once to take the exclusive lock on `path` (created if missing).
    /// `Ok(Err(pid))` when another process holds it (`pid` as recorded in the file).
    ///
    /// # Errors
    /// I/O errors opening or locking the file.
    pub fn try_acquire(path: &Path, remove_on_drop: bool) -> Result<Result<FileLock, Option<u32>>> {
        loop {
            // O_NOFOLLOW: a symlink planted from inside `exec` must not make the host
            // write through it.
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .ctx("open lock file", path)?;
            if !flock(&file, libc::LOCK_EX | libc::LOCK_NB).ctx("lock", path)? {
                return Ok(Err(recorded_pid(&mut file)));
            }
            // The holder before us may have removed the file after we opened it.
            let same = match (file.metadata(), fs::metadata(path)) {
                (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            };
            if !same {
                continue;
            }
            file.set_len(0).ctx("write lock file", path)?;
            file.rewind().ctx("write lock file", path)?;
            writeln!(file, "pid {}", std::process::id()).ctx("write lock file", path)?;
            return Ok(Ok(FileLock {
                file,
                path: path.to_path_buf(),
                remove_on_drop,
            }));
        }
    }

    /// Takes the lock on `path`, retrying every 50 ms for up to `timeout`.
    ///
    /// # Errors
    /// [`DeskError::LockTimeout`] after `timeout`; I/O errors.
    pub fn acquire(
        path: &Path,
        what: &'static str,
        timeout: Duration,
        remove_on_drop: bool,
    ) -> Result<FileLock> {
        let start = Instant::now();
        loop {
            match Self::try_acquire(path, remove_on_drop)? {
                Ok(l) => return Ok(l),
                Err(pid) if start.elapsed() >= timeout => {
                    return Err(DeskError::LockTimeout {
                        what,
                        path: path.to_path_buf(),
                        secs: timeout.as_secs(),
                        holder: describe_holder(pid),
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if self.remove_on_drop {
            // Removed while still locked: a waiter that opened it re-checks the path.
            let _ = fs::remove_file(&self.path);
        }
        let _ = flock(&self.file, libc::LOCK_UN);
    }
}

/// Whether anyone holds the lock of `path` right now (the lock is taken and dropped at
/// once when free, so a concurrent taker may see it busy for an instant).
///
/// # Errors
/// I/O errors opening the file (a missing file is an error too).
pub fn probe(path: &Path) -> Result<Probe> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ctx("open lock file", path)?;
    let pid = recorded_pid(&mut file);
    if flock(&file, libc::LOCK_EX | libc::LOCK_NB).ctx("lock", path)? {
        let _ = flock(&file, libc::LOCK_UN);
        Ok(Probe::Free { pid })
    } else {
        Ok(Probe::Held { pid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_named_by_its_pid_or_as_unknown() {
        assert_eq!(describe_holder(Some(4242)), "pid 4242");
        assert_eq!(describe_holder(None), "unknown holder");
    }

    /// `acquire` waits for a holder that lets go within its timeout.
    #[test]
    fn acquire_waits_for_the_holder_to_let_go() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("x.lock");
        let a = FileLock::try_acquire(&p, false).unwrap().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let q = p.clone();
        let waiter = std::thread::spawn(move || {
            tx.send(()).unwrap();
            FileLock::acquire(&q, "test", Duration::from_secs(30), false)
        });
        rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        drop(a);
        assert!(waiter.join().unwrap().is_ok(), "the waiter gave up");
    }

    #[test]
    fn exclusive_and_removed() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("x.lock");
        let a = FileLock::try_acquire(&p, true).unwrap().unwrap();
        let b = FileLock::try_acquire(&p, true).unwrap();
        assert_eq!(b.unwrap_err(), Some(std::process::id()));
        assert!(matches!(probe(&p).unwrap(), Probe::Held { .. }));
        let e = FileLock::acquire(&p, "test", Duration::from_millis(120), false).unwrap_err();
        assert!(e.to_string().contains("still locked"), "{e}");
        drop(a);
        assert!(!p.exists());
        let c = FileLock::try_acquire(&p, false).unwrap().unwrap();
        drop(c);
        assert!(matches!(probe(&p).unwrap(), Probe::Free { pid: Some(_) }));
    }
}
