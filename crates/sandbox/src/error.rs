//! The error type of the sandbox. Every message is one line that names the problem and,
//! where there is one, the fix.

use std::ffi::OsString;
use std::path::PathBuf;

/// Everything that can stop a command from being started in the sandbox. A command that
/// starts and then fails is not an error: its exit code is the result.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No executable `bwrap` on the searched PATH.
    #[error("bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap")]
    BwrapMissing,
    /// The desk directory does not exist or is not a directory.
    #[error("desk directory {} does not exist or is not a directory: create the desk first (deskfs desk create AGENT)", path.display())]
    DeskMissing {
        /// The host path given as the desk.
        path: PathBuf,
    },
    /// The working directory is not an absolute, normalized path under `/desk`.
    #[error("working directory {} is not allowed: it must be {} or a path under it, without '.' or '..'", path.display(), crate::DESK_MOUNT)]
    BadWorkdir {
        /// The rejected in-sandbox path.
        path: PathBuf,
    },
    /// The working directory is under `/desk` but missing on the desk.
    #[error("working directory {} does not exist on the desk ({} on the host)", inside.display(), host.display())]
    WorkdirMissing {
        /// The in-sandbox path.
        inside: PathBuf,
        /// Where it would be on the host.
        host: PathBuf,
    },
    /// No command to run.
    #[error("no command given: deskfs exec AGENT -- CMD [ARGS...]")]
    EmptyCommand,
    /// An extra environment variable whose name is empty or contains `=` or NUL.
    #[error("invalid environment variable name {name:?}: it must be non-empty without '=' or NUL")]
    BadEnvName {
        /// The rejected name.
        name: OsString,
    },
    /// An extra environment variable that must never enter the sandbox (cloud credentials,
    /// deskfs settings).
    #[error("refusing to pass {name:?} into the sandbox: AWS_*, GOOGLE_*, GCLOUD_*, AZURE_* and DESKFS_* variables never enter exec")]
    ForbiddenEnv {
        /// The rejected name.
        name: OsString,
    },
    /// A filesystem or system call failed while preparing the sandbox.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. "creating /x/.cache/cargo".
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `bwrap` could not be started at all.
    #[error("could not start {}: {source}", bwrap.display())]
    Spawn {
        /// The bwrap binary.
        bwrap: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `bwrap` started but the command never ran: the sandbox could not be set up or the
    /// program could not be executed (bwrap's own message is on stderr).
    #[error(
        "the command did not start in the sandbox (bwrap exited with {code}; its message is above)"
    )]
    Setup {
        /// bwrap's exit code.
        code: i32,
    },
}

impl SandboxError {
    /// An [`SandboxError::Io`] with a description of the failed step.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SandboxError::Io {
            what: what.into(),
            source,
        }
    }
}
