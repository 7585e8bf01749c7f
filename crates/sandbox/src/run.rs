//! Running the sandbox to completion and turning bwrap's outcome into an exit code.

use std::ffi::OsString;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::host::Host;
use crate::{build, check_bwrap, fds, signals, SandboxError, SandboxSpec};

/// See [`crate::run`].
pub(crate) fn run(spec: &SandboxSpec, argv: &[OsString]) -> Result<i32, SandboxError> {
    let bwrap = check_bwrap()?;
    let host = Host::current();
    let (mut status_read, status_write) = fds::status_pipe()
        .map_err(|e| SandboxError::io("creating the status pipe for bwrap", e))?;
    let mut cmd = build::build(spec, argv, &host, &bwrap, Some(status_write))?;
    let mut child = cmd.spawn().map_err(|source| SandboxError::Spawn {
        bwrap: bwrap.clone(),
        source,
    })?;
    drop(cmd); // our copies of the descriptors passed to bwrap
    let status = {
        // with a terminal, Ctrl-C and Ctrl-\ are the command's business (see signals.rs)
        let _ignore = host.interactive.then(signals::ParentIgnores::new);
        child
            .wait()
            .map_err(|e| SandboxError::io("waiting for bwrap", e))?
    };
    let ran = command_exit_reported(&mut status_read);
    match (status.code(), ran) {
        (Some(code), false) => Err(SandboxError::Setup { code }),
        _ => Ok(exit_code(status)),
    }
}

/// A shell's view of an exit status: the code, or 128 + the signal that killed it.
pub(crate) fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// bwrap wrote `{"exit-code": N}` to its status descriptor: the command ran and ended
/// (bwrap reports a command killed by a signal as 128 + signal). Without it, a bwrap exit
/// code means the command never ran: the sandbox setup failed or the program could not be
/// executed, and bwrap said why on stderr. The exit code alone cannot tell "setup failed"
/// from "the command exited 1".
pub(crate) fn command_exit_reported(status_read: &mut File) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        match status_read.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // WouldBlock: a process inside still holds the write end; what bwrap wrote
            // before exiting is all there is
            Err(_) => break,
        }
    }
    const KEY: &[u8] = b"\"exit-code\"";
    buf.windows(KEY.len()).any(|w| w == KEY)
}
