//! Ctrl-C and Ctrl-\ at a terminal: they belong to the sandboxed command, not to bwrap or
//! deskfs.
//!
//! With a terminal attached (no `--new-session`), deskfs, bwrap and the command share the
//! terminal's foreground process group, so the terminal sends SIGINT/SIGQUIT to all three.
//! If bwrap or deskfs died of it, `--die-with-parent` would SIGKILL the command, so a
//! program that handles Ctrl-C itself (an interactive shell at its prompt, a REPL, an
//! editor) would be killed. So, like a shell waiting for its foreground job:
//! * deskfs ignores both signals while it waits ([`ParentIgnores`]);
//! * bwrap is started with both ignored ([`ignore_in_child`]), and the command is started
//!   through `/usr/bin/env --default-signal=INT,QUIT --` ([`SHIM`]), which puts them back to
//!   their default before the command runs (an ignored signal stays ignored across exec,
//!   and a shell cannot undo that itself).
//!
//! The shim is used whenever the system's `env` supports `--default-signal` (GNU coreutils
//! 8.31 or newer), with or without a terminal, so the command starts the same way in both
//! cases; a program that does not exist then ends with env's exit code 127, as in a
//! shell. Without that support, bwrap is not made to ignore the signals (Ctrl-C then ends
//! the whole sandbox, which is still better than a command that cannot be interrupted).

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Run in front of the command inside the sandbox (see the module docs).
pub(crate) const SHIM: [&str; 3] = ["/usr/bin/env", "--default-signal=INT,QUIT", "--"];

/// The system's `env` understands `--default-signal` (probed once per process; /usr is
/// the same inside the sandbox).
pub(crate) fn shim_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new(SHIM[0])
            .args([SHIM[1], "/bin/true"])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Starts the child of `cmd` (bwrap) with SIGINT and SIGQUIT ignored.
pub(crate) fn ignore_in_child(cmd: &mut Command) {
    let setup = || -> io::Result<()> {
        for sig in [libc::SIGINT, libc::SIGQUIT] {
            // SAFETY: signal() is async-signal-safe; SIG_IGN is a valid disposition.
            if unsafe { libc::signal(sig, libc::SIG_IGN) } == libc::SIG_ERR {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the closure only calls signal(), which is async-signal-safe, and does not
    // allocate.
    unsafe {
        cmd.pre_exec(setup);
    }
}

/// SIGINT and SIGQUIT ignored in this process while alive; the previous dispositions are
/// restored on drop.
pub(crate) struct ParentIgnores {
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

impl ParentIgnores {
    /// Starts ignoring.
    pub(crate) fn new() -> Self {
        let mut saved = Vec::new();
        for sig in [libc::SIGINT, libc::SIGQUIT] {
            // SAFETY: sigaction with a zeroed struct set to SIG_IGN and a valid out pointer.
            unsafe {
                let mut ignore: libc::sigaction = std::mem::zeroed();
                ignore.sa_sigaction = libc::SIG_IGN;
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &ignore, &mut old) == 0 {
                    saved.push((sig, old));
                }
            }
        }
        ParentIgnores { saved }
    }
}

impl Drop for ParentIgnores {
    fn drop(&mut self) {
        for (sig, old) in &self.saved {
            // SAFETY: restores a disposition sigaction returned earlier.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
    }
}
