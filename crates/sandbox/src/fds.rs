//! File descriptors handed to bwrap, and closing everything else the caller leaked.
//!
//! bwrap reads the seccomp program from [`SECCOMP_FD`] and writes its JSON status to
//! [`STATUS_FD`]. Both are opened close-on-exec in the parent (so no other child of this
//! process inherits them) and moved to those fixed numbers in the child between `fork` and
//! `exec`. Every other descriptor from 3 up is made close-on-exec there too: a descriptor
//! the caller of `deskfs exec` left open (a directory, a socket) would otherwise reach the
//! sandboxed command and could open host files through it.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Where bwrap finds the seccomp program (`--seccomp 3`).
pub(crate) const SECCOMP_FD: RawFd = 3;
/// Where bwrap writes its JSON status (`--json-status-fd 4`).
pub(crate) const STATUS_FD: RawFd = 4;
/// Temporary home of the passed descriptors while they are moved into place.
const PARK_FD: RawFd = 10;

/// An in-memory file holding `data` (the child rewinds it before bwrap reads it).
pub(crate) fn memfd_with(data: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: the name is a NUL-terminated literal; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"deskfs-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this descriptor and nothing else owns it.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(data)?;
    Ok(OwnedFd::from(file))
}

/// A close-on-exec pipe whose read end does not block: `(read, write)`.
pub(crate) fn status_pipe() -> io::Result<(File, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (read, write) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // bwrap must be able to block on its end
    // SAFETY: plain fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(write.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(write.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((read, write))
}

/// Arranges for the child of `cmd` to get `seccomp` at [`SECCOMP_FD`] (rewound) and
/// `status` at [`STATUS_FD`], and nothing else above stderr. The descriptors stay open as
/// long as `cmd` lives.
pub(crate) fn pass_to_child(cmd: &mut Command, seccomp: Option<OwnedFd>, status: Option<OwnedFd>) {
    let seccomp_raw = seccomp.as_ref().map(AsRawFd::as_raw_fd);
    let status_raw = status.as_ref().map(AsRawFd::as_raw_fd);
    let child_setup = move || -> io::Result<()> {
        // keep the owners alive inside the closure, i.e. as long as the Command
        let _owners = (&seccomp, &status);
        // Only async-signal-safe system calls from here on: this runs between fork and
        // exec. Park the passed descriptors out of the way, mark everything from 3 up
        // close-on-exec, then put the passed ones at their numbers (dup2 clears the flag).
        let parked_seccomp = seccomp_raw.map(park).transpose()?;
        let parked_status = status_raw.map(park).transpose()?;
        cloexec_from(3)?;
        if let Some(fd) = parked_seccomp {
            // SAFETY: lseek/dup2 on descriptors open in this (child) process.
            unsafe {
                if libc::lseek(fd, 0, libc::SEEK_SET) < 0 || libc::dup2(fd, SECCOMP_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        if let Some(fd) = parked_status {
            // SAFETY: as above.
            if unsafe { libc::dup2(fd, STATUS_FD) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the closure only makes async-signal-safe system calls (fcntl, lseek, dup2,
    // close_range) and does not allocate, as required between fork and exec.
    unsafe {
        cmd.pre_exec(child_setup);
    }
}

/// Duplicates `fd` to the lowest free number at or above [`PARK_FD`].
fn park(fd: RawFd) -> io::Result<RawFd> {
    // SAFETY: F_DUPFD on an open descriptor.
    let parked = unsafe { libc::fcntl(fd, libc::F_DUPFD, PARK_FD) };
    if parked < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(parked)
    }
}

/// Marks every descriptor from `first` up close-on-exec.
fn cloexec_from(first: RawFd) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range with the CLOEXEC flag only changes descriptor flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // Kernels before 5.11: one fcntl per possible descriptor.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let last = limit.rlim_cur.min(1 << 20) as RawFd;
    for fd in first..last {
        // SAFETY: F_SETFD on a descriptor that may not be open fails harmlessly (EBADF).
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}
