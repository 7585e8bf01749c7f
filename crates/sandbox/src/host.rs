//! What the sandbox reads from the calling process: its environment and whether a terminal
//! is attached. Taken once per command so tests can supply their own.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// A snapshot of the caller's environment and terminal state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Host {
    /// The caller's environment variables.
    pub vars: BTreeMap<OsString, OsString>,
    /// A terminal is attached to stdin, stdout or stderr (interactive use).
    pub interactive: bool,
}

impl Host {
    /// The current process's environment and terminal state.
    pub fn current() -> Self {
        // SAFETY: isatty only inspects the descriptor; any value is fine to pass.
        let tty = |fd| unsafe { libc::isatty(fd) == 1 };
        Host {
            vars: std::env::vars_os().collect(),
            interactive: tty(0) || tty(1) || tty(2),
        }
    }

    /// A non-empty variable of the caller.
    pub fn var(&self, name: &str) -> Option<&OsStr> {
        self.vars
            .get(OsStr::new(name))
            .map(OsString::as_os_str)
            .filter(|v| !v.is_empty())
    }

    /// A non-empty variable as a path.
    pub fn path_var(&self, name: &str) -> Option<PathBuf> {
        self.var(name).map(PathBuf::from)
    }

    /// The caller's home directory (`$HOME`).
    pub fn home(&self) -> Option<PathBuf> {
        self.path_var("HOME")
    }

    /// Where deskfs keeps its data (workspace configs with keys, metadata databases,
    /// caches) for this caller: `$DESKFS_HOME`, else `$XDG_DATA_HOME/deskfs`, else
    /// `~/.local/share/deskfs` (the same rule as the CLI).
    pub fn deskfs_home(&self) -> Option<PathBuf> {
        if let Some(h) = self.path_var("DESKFS_HOME") {
            return Some(h);
        }
        if let Some(x) = self.path_var("XDG_DATA_HOME") {
            return Some(x.join("deskfs"));
        }
        self.home().map(|h| h.join(".local/share/deskfs"))
    }
}
