//! The kernel mount of a deskfs file system made with `mount(2)` itself, so the mount
//! table names its type `fuse.deskfs` as libfuse and fusermount3 name a FUSE file system
//! with a subtype (`/proc/mounts`, `findmnt -t fuse.deskfs`, `umount -t`, systemd `.mount`
//! units and `/etc/fstab` lines all match on it). fuser's own direct mount always says
//! `fuse`; this module mounts first and hands fuser the `/dev/fuse` descriptor
//! (`Session::from_fd`). Without the privilege for `mount(2)` (`EPERM`: not root, or root
//! of a user namespace) the caller falls back to fuser's fusermount3 path, which passes
//! `subtype=deskfs` and gets the same type.
//!
//! The mount data follows the FUSE protocol's mount options (Linux
//! `Documentation/filesystems/fuse.rst`): `fd`, `rootmode`, `user_id`, `group_id`,
//! `default_permissions`, `allow_other`; flags `MS_NOSUID | MS_NODEV` as libfuse and
//! fusermount3 set them.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The file system type the mount table shows: `fuse.` and the subtype.
pub const FS_TYPE: &str = "fuse.deskfs";

/// What the kernel mount needs besides the mount point.
#[derive(Debug, Clone)]
pub(crate) struct MountData<'a> {
    /// Source shown in the mount table (no `,` or NUL: checked by the caller).
    pub fsname: &'a str,
    /// `default_permissions`: the kernel checks the mode bits.
    pub default_permissions: bool,
    /// `allow_other`: users other than the mounting one may use the mount.
    pub allow_other: bool,
}

impl MountData<'_> {
    /// The `data` string of `mount(2)` for a FUSE mount served on descriptor `fd` by user
    /// `uid`/`gid`, e.g. `fd=5,rootmode=40000,user_id=0,group_id=0,default_permissions`.
    fn options(&self, fd: i32, uid: u32, gid: u32) -> String {
        let mut s = format!("fd={fd},rootmode=40000,user_id={uid},group_id={gid}");
        if self.default_permissions {
            s.push_str(",default_permissions");
        }
        if self.allow_other {
            s.push_str(",allow_other");
        }
        s
    }
}

/// A FUSE mount this process made with `mount(2)` at a resolved path; unmounted on
/// [`KernelMount::unmount`] or on drop, only while the mount point still holds this very
/// mount (its device number in `/proc/self/mountinfo`), so a later mount stacked or
/// remade there is never touched.
#[derive(Debug)]
pub(crate) struct KernelMount {
    path: PathBuf,
    dev: Option<(u32, u32)>,
    done: bool,
}

/// Mounts a FUSE file system of type [`FS_TYPE`] at `mountpoint`.
///
/// Returns the open `/dev/fuse` descriptor to serve the mount on (the kernel sends `INIT`
/// there next) and the mount, or `Ok(None)` when `/dev/fuse` may not be opened (`EACCES`)
/// or `mount(2)` is not permitted (`EPERM`): the caller then mounts through fusermount3.
///
/// # Errors
/// Opening `/dev/fuse` (`ENOENT` without FUSE), or `mount(2)`'s error other than
/// `EPERM` (`ENOENT`/`ENOTDIR` for a bad mount point), with the mount point and options
/// in the message.
pub(crate) fn mount(
    mountpoint: &Path,
    data: &MountData<'_>,
) -> io::Result<Option<(OwnedFd, KernelMount)>> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse");
    let dev = match dev {
        Ok(f) => f,
        // Not ours to open: fusermount3 (setuid root) may still mount for this user.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Ok(None),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot open /dev/fuse: {e}"),
            ))
        }
    };
    // SAFETY: getuid/getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let options = data.options(dev.as_raw_fd(), uid, gid);
    // Resolved before the mount: once it is there, resolving a path through it (a
    // trailing `/`, `.`, `..`, a symlink) asks the file system, which cannot answer
    // before this thread has answered the kernel's INIT.
    let path = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let c_source = cstring(data.fsname.as_bytes())?;
    let c_target = cstring(path.as_os_str().as_bytes())?;
    let c_type = cstring(FS_TYPE.as_bytes())?;
    let c_data = cstring(options.as_bytes())?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    let rc = unsafe {
        libc::mount(
            c_source.as_ptr(),
            c_target.as_ptr(),
            c_type.as_ptr(),
            flags,
            c_data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            return Ok(None);
        }
        return Err(io::Error::new(
            e.kind(),
            format!(
                "mount(2) of {} at {} with {options:?}: {e}",
                FS_TYPE,
                mountpoint.display()
            ),
        ));
    }
    let dev_no = mount_dev(&path);
    Ok(Some((
        OwnedFd::from(dev),
        KernelMount {
            path,
            dev: dev_no,
            done: false,
        },
    )))
}

impl KernelMount {
    /// Unmounts with `umount2(flags)` (0, or `MNT_DETACH` for a lazy unmount), unless the
    /// mount point no longer holds this mount (unmounted from outside: nothing to do).
    ///
    /// # Errors
    /// `umount2`'s error: `EBUSY` while files are open under a non-lazy unmount (the mount
    /// then stays; it is not retried on drop).
    pub(crate) fn unmount(&mut self, flags: i32) -> io::Result<()> {
        if std::mem::replace(&mut self.done, true) || !self.still_mounted() {
            return Ok(());
        }
        let c_target = cstring(self.path.as_os_str().as_bytes())?;
        // SAFETY: a NUL-terminated path alive for the call.
        if unsafe { libc::umount2(c_target.as_ptr(), flags) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("umount of {}: {e}", self.path.display()),
            ));
        }
        Ok(())
    }

    /// Whether the top mount at the mount point is still the one made here; `false`
    /// when that cannot be told (its device number was never found): never unmount
    /// what may be another file system.
    fn still_mounted(&self) -> bool {
        self.dev.is_some() && mount_dev(&self.path) == self.dev
    }

    /// The mount's device number in the mount table, when found right after mounting.
    pub(crate) fn dev(&self) -> Option<(u32, u32)> {
        self.dev
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if let Err(e) = self.unmount(0) {
            tracing::warn!(error = %e, "unmount at the end of the session failed");
        }
    }
}

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a mount argument contains a NUL byte",
        )
    })
}

/// The device number of the top mount at `path`.
fn mount_dev(path: &Path) -> Option<(u32, u32)> {
    crate::mountinfo::top_at(path).map(|m| m.dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_data_names_the_session_user_and_the_chosen_options() {
        let d = MountData {
            fsname: "deskfs:w",
            default_permissions: true,
            allow_other: false,
        };
        assert_eq!(
            d.options(7, 1000, 100),
            "fd=7,rootmode=40000,user_id=1000,group_id=100,default_permissions"
        );
        let d = MountData {
            default_permissions: false,
            allow_other: true,
            ..d
        };
        assert_eq!(
            d.options(3, 0, 0),
            "fd=3,rootmode=40000,user_id=0,group_id=0,allow_other"
        );
    }
}
