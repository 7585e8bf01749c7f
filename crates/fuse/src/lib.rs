//! FUSE adapter of deskfs: mounts a [`Vfs`] through the kernel's FUSE driver (via
//! `fuser`).
//!
//! The adapter only translates: each kernel request becomes one call on the VFS core and
//! its result becomes the reply (errors as [`deskfs_vfs::VfsError::errno`]). POSIX rules,
//! caching policy and durability live in the VFS.
//!
//! ```no_run
//! # fn demo(vfs: std::sync::Arc<deskfs_vfs::Vfs>) -> std::io::Result<()> {
//! use deskfs_fuse::{mount, MountOptions};
//! let opts = MountOptions { fsname: "deskfs:work".into(), ..MountOptions::default() };
//! let handle = mount(vfs, std::path::Path::new("/mnt/work"), &opts)?;
//! handle.join()?; // until `fusermount3 -u /mnt/work`
//! # Ok(())
//! # }
//! ```
//!
//! Kernel connection settings: requests of up to 1 MiB (`max_write`, and `max_readahead`
//! up to the kernel's cap); `FUSE_POSIX_LOCKS` and `FUSE_FLOCK_LOCKS`, so `fcntl` and
//! `flock` locks reach the VFS and hold across mounts and hosts; passthrough when the
//! kernel offers it; otherwise fuser's default init flags (async reads, big writes,
//! max_pages). The mount is `rw,nodev,nosuid`, of type [`FS_TYPE`] (`fuse.deskfs`): as
//! root `mount(2)` is called here (fuser's own direct mount would say `fuse`), otherwise
//! fusermount3 mounts with `subtype=deskfs`.

#![warn(missing_docs)]

mod backing;
mod convert;
mod filesystem;
mod kernel_mount;
pub mod mountinfo;
pub mod stats;

pub use kernel_mount::FS_TYPE;

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use deskfs_vfs::{Ino, Vfs};
use fuser::{BackgroundSession, Config, INodeNo, MountOption, Notifier, Session, SessionACL};

use crate::filesystem::{DeskFs, Ttls};

/// How to mount a workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Let users other than the mounting one use the mount (`allow_other`). Non-root
    /// mounts need `user_allow_other` in `/etc/fuse.conf`, else mounting fails.
    pub allow_other: bool,
    /// Threads serving kernel requests (each with its own cloned `/dev/fuse` fd). At
    /// least 1; default 4.
    pub threads: usize,
    /// How long the kernel may cache an inode's attributes while other mounts of the
    /// workspace are live. Default 1 s.
    pub attr_ttl: Duration,
    /// How long the kernel may cache a name → inode mapping while other mounts of the
    /// workspace are live. Default 1 s.
    pub entry_ttl: Duration,
    /// Attribute and entry lifetime while this mount is the workspace's only one. Safe to
    /// be long: the VFS invalidates what it changes behind the kernel, and once another
    /// mount appears its changes arrive through the change feed. Default 60 s.
    pub alone_ttl: Duration,
    /// How long the kernel may remember that a name does not exist (negative entry), only
    /// while alone; zero disables negative entries. Default 30 s.
    pub negative_ttl: Duration,
    /// Source name shown in `/proc/mounts` and `df`, e.g. `deskfs:NAME`. Must not contain
    /// `,` or NUL. Default `deskfs`.
    pub fsname: String,
    /// Let the kernel check permissions from the mode bits (`default_permissions`), so
    /// `access` is not called. Default true.
    pub default_permissions: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            threads: 4,
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            alone_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(30),
            fsname: "deskfs".to_owned(),
            default_permissions: true,
        }
    }
}

impl MountOptions {
    fn ttls(&self) -> Ttls {
        Ttls {
            attr: self.attr_ttl,
            entry: self.entry_ttl,
            alone: self.alone_ttl,
            negative: self.negative_ttl,
        }
    }

    /// The fuser session configuration for these options.
    ///
    /// # Errors
    /// `InvalidInput` if `threads` is 0 or `fsname` contains `,` or NUL.
    fn config(&self) -> io::Result<Config> {
        if self.threads == 0 {
            return Err(invalid("threads must be at least 1"));
        }
        if self.fsname.contains([',', '\0']) {
            return Err(invalid("fsname must not contain ',' or NUL"));
        }
        let mut mount_options = vec![
            MountOption::FSName(self.fsname.clone()),
            MountOption::Subtype("deskfs".to_owned()),
            MountOption::RW,
        ];
        if self.default_permissions {
            mount_options.push(MountOption::DefaultPermissions);
        }
        // `Config` is non-exhaustive: start from its default and set every field we use.
        let mut config = Config::default();
        config.mount_options = mount_options;
        config.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(self.threads);
        config.clone_fd = true;
        Ok(config)
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_owned())
}

/// Mounts `vfs` at `mountpoint` and serves it from background threads.
///
/// Returns once the kernel mount exists and the FUSE handshake is done, so the mount is
/// usable on return. Dropping the returned handle unmounts (best effort, without waiting
/// for the serving threads); use [`MountHandle::join`] or [`MountHandle::unmount`].
///
/// # Errors
/// `InvalidInput` for bad options (see [`MountOptions`]); otherwise the error of opening
/// `/dev/fuse`, of `mount(2)`/`fusermount3`, or of the handshake (e.g. `mountpoint`
/// missing, not a directory, or not permitted).
pub fn mount(vfs: Arc<Vfs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<MountHandle> {
    let (session, kernel) = open_session(vfs, mountpoint, opts)?;
    // The kernel mount is dropped (unmounted) if the serving thread cannot start.
    let session = session.spawn()?;
    // fusermount3's mount is in the table once the handshake is done.
    let dev = match &kernel {
        Some(k) => k.dev(),
        None => std::fs::canonicalize(mountpoint)
            .ok()
            .and_then(|p| mountinfo::top_at(&p))
            .map(|m| m.dev),
    };
    Ok(MountHandle {
        session,
        kernel,
        dev,
    })
}

/// Mounts (see [`kernel_mount`]) and answers the kernel's `INIT`: a session ready to
/// serve, and the kernel mount when it was made here rather than by fusermount3.
fn open_session(
    vfs: Arc<Vfs>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> io::Result<(Session<DeskFs>, Option<kernel_mount::KernelMount>)> {
    let config = opts.config()?;
    let fs = DeskFs::new(vfs, opts.ttls());
    let data = kernel_mount::MountData {
        fsname: &opts.fsname,
        default_permissions: opts.default_permissions,
        allow_other: opts.allow_other,
    };
    match kernel_mount::mount(mountpoint, &data)? {
        // On a failed handshake the kernel mount is dropped, which unmounts it.
        Some((fd, kernel)) => Ok((Session::from_fd(fs, fd, config.acl, config)?, Some(kernel))),
        None => Ok((Session::new(fs, mountpoint, &config)?, None)),
    }
}

/// Mounts `vfs` at `mountpoint` and serves it on the calling thread (plus
/// `opts.threads - 1` more) until the file system is unmounted externally (e.g.
/// `fusermount3 -u`).
///
/// # Errors
/// As [`mount`], plus the error that ended the session, if any.
pub fn mount_foreground(vfs: Arc<Vfs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<()> {
    let (session, _kernel) = open_session(vfs, mountpoint, opts)?;
    session.run()
}

/// A mount served from background threads (see [`mount`]).
#[derive(Debug)]
pub struct MountHandle {
    session: BackgroundSession,
    /// The kernel mount when made here (as root); `None` when fusermount3 made it and
    /// fuser's session unmounts it.
    kernel: Option<kernel_mount::KernelMount>,
    /// The mount's device number in the mount table.
    dev: Option<(u32, u32)>,
}

impl MountHandle {
    /// Blocks until the file system is unmounted externally (`fusermount3 -u`,
    /// `umount`) and the serving threads have finished.
    ///
    /// # Errors
    /// The error that ended the session (a `/dev/fuse` read failure), or `Other` if a
    /// serving thread panicked.
    pub fn join(self) -> io::Result<()> {
        self.session.join()
    }

    /// Unmounts and waits until the serving threads have finished.
    ///
    /// As root this is `umount(2)`, which fails with `EBUSY` while files are open; as
    /// another user it is `fusermount3 -u -z` (lazy: detached now, finished once the
    /// last open file closes).
    ///
    /// # Errors
    /// The `umount(2)` error (the file system then stays mounted and served until it is
    /// unmounted externally), or as [`MountHandle::join`].
    pub fn unmount(mut self) -> io::Result<()> {
        match self.kernel.take() {
            Some(mut k) => {
                k.unmount(0)?;
                self.session.join()
            }
            None => self.session.umount_and_join(),
        }
    }

    /// The mount's device number (`major`, `minor`) in `/proc/self/mountinfo`, which
    /// tells it apart from any other mount at the same mount point; `None` when it was
    /// not found there after mounting.
    pub fn device(&self) -> Option<(u32, u32)> {
        self.dev
    }

    /// A handle to drop entries and inodes from the kernel's caches, for changes made
    /// by other mounts or hosts.
    pub fn invalidator(&self) -> Invalidator {
        Invalidator {
            notifier: self.session.notifier(),
        }
    }
}

/// Drops kernel cache entries of a mount (FUSE notifications). Cheap to clone; usable
/// from any thread, but never from inside a request on the same inode (the kernel would
/// wait on itself).
#[derive(Clone, Debug)]
pub struct Invalidator {
    notifier: Notifier,
}

impl Invalidator {
    /// Forgets the kernel's cached lookup of `name` in directory `parent`.
    ///
    /// # Errors
    /// As the kernel returns them; an entry the kernel does not hold is not an error.
    pub fn inval_entry(&self, parent: Ino, name: &[u8]) -> io::Result<()> {
        self.notifier
            .inval_entry(INodeNo(parent), OsStr::from_bytes(name))
    }

    /// Forgets the kernel's cached attributes of `ino` and its cached pages from byte
    /// `offset` for `len` bytes (`len` 0 = to the end of the file; a negative `offset`
    /// drops the attributes only).
    ///
    /// # Errors
    /// As the kernel returns them; an inode the kernel does not hold is not an error.
    pub fn inval_inode(&self, ino: Ino, offset: i64, len: i64) -> io::Result<()> {
        self.notifier.inval_inode(INodeNo(ino), offset, len)
    }

    /// Tells the kernel that `name` in `parent`, which was inode `child`, was deleted:
    /// drops the entry and notifies inotify watchers.
    ///
    /// # Errors
    /// As the kernel returns them.
    pub fn delete(&self, parent: Ino, child: Ino, name: &[u8]) -> io::Result<()> {
        self.notifier
            .delete(INodeNo(parent), INodeNo(child), OsStr::from_bytes(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_make_the_expected_config() {
        let config = MountOptions::default().config().expect("valid defaults");
        assert_eq!(
            config.mount_options,
            vec![
                MountOption::FSName("deskfs".to_owned()),
                MountOption::Subtype("deskfs".to_owned()),
                MountOption::RW,
                MountOption::DefaultPermissions,
            ]
        );
        assert_eq!(config.acl, SessionACL::Owner);
        assert_eq!(config.n_threads, Some(4));
        assert!(config.clone_fd);
    }

    #[test]
    fn allow_other_widens_the_acl() {
        let opts = MountOptions {
            allow_other: true,
            default_permissions: false,
            ..MountOptions::default()
        };
        let config = opts.config().expect("valid options");
        assert_eq!(config.acl, SessionACL::All);
        assert!(!config
            .mount_options
            .contains(&MountOption::DefaultPermissions));
    }

    #[test]
    fn bad_options_are_refused() {
        let zero_threads = MountOptions {
            threads: 0,
            ..MountOptions::default()
        };
        let comma = MountOptions {
            fsname: "deskfs:a,b".to_owned(),
            ..MountOptions::default()
        };
        for opts in [zero_threads, comma] {
            let err = opts.config().expect_err("invalid options");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
    }
}
