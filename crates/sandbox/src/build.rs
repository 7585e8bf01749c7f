//! Assembling the bwrap command line from a [`SandboxSpec`].

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::host::Host;
use crate::{env, fds, layout, seccomp, signals, Net, SandboxError, SandboxSpec, DESK_MOUNT};

/// The bwrap command for `argv` under `spec`, not started. Creates the desk's cache
/// directories (after every check passed, so bad input leaves nothing behind). `status`,
/// when given, becomes bwrap's `--json-status-fd`.
pub(crate) fn build(
    spec: &SandboxSpec,
    argv: &[OsString],
    host: &Host,
    bwrap: &Path,
    status: Option<OwnedFd>,
) -> Result<Command, SandboxError> {
    if argv.is_empty() {
        return Err(SandboxError::EmptyCommand);
    }
    let desk = std::fs::canonicalize(&spec.desk_dir)
        .ok()
        .filter(|d| d.is_dir())
        .ok_or_else(|| SandboxError::DeskMissing {
            path: spec.desk_dir.clone(),
        })?;
    check_workdir(&spec.workdir, &desk)?;
    let layout = layout::plan(&desk, spec.net, &spec.hide, host);
    let environment = env::environment(spec, host, &layout.toolchain)?;
    prepare_desk(&desk)?;

    let mut cmd = Command::new(bwrap);
    cmd.args([
        // bwrap gets SIGKILL when its parent (this process; strictly, the thread that
        // spawned it) dies, and takes the whole sandbox down with it: a killed
        // `deskfs exec` leaves nothing running
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        // the sandbox keeps the caller's uid (the desk's files are owned by it, and a
        // FUSE mount without allow_other admits no one else) but no capabilities
        "--cap-drop",
        "ALL",
    ]);
    if spec.net == Net::None {
        cmd.arg("--unshare-net");
    }
    // --new-session (setsid) detaches the command from the caller's terminal, so it
    // cannot push keystrokes into it (TIOCSTI). It also takes away job control, Ctrl-C
    // and /dev/tty (interactive shells, pagers, editors, password prompts), so it is used
    // only when no terminal is attached: the usual case for an agent. With a terminal the
    // session is kept, the seccomp filter below refuses TIOCSTI/TIOCLINUX instead (it is
    // installed in both cases), and Ctrl-C goes to the command (signals.rs).
    if !host.interactive {
        cmd.arg("--new-session");
    }
    cmd.args(&layout.args);
    let filter = match seccomp::tty_injection_filter() {
        Some(program) => Some(fds::memfd_with(&program).map_err(|e| {
            SandboxError::io("creating the seccomp filter for bwrap (memfd_create)", e)
        })?),
        None => {
            tracing::warn!("no seccomp filter for this architecture; relying on --new-session");
            None
        }
    };
    if filter.is_some() {
        cmd.arg("--seccomp").arg(fds::SECCOMP_FD.to_string());
    }
    if status.is_some() {
        cmd.arg("--json-status-fd").arg(fds::STATUS_FD.to_string());
    }
    cmd.arg("--chdir").arg(&spec.workdir).arg("--");
    if signals::shim_available() {
        cmd.args(signals::SHIM);
        if host.interactive {
            signals::ignore_in_child(&mut cmd);
        }
    }
    cmd.args(argv);
    // The environment goes to bwrap itself (which passes it on) rather than through
    // --clearenv/--setenv: same result, but values never appear in bwrap's argv, which
    // any user can read in /proc.
    cmd.env_clear().envs(environment);
    fds::pass_to_child(&mut cmd, filter, status);
    Ok(cmd)
}

/// Makes sure the desk's `.desk` (bound read-only inside, see the layout) is a real
/// directory of the desk before bwrap binds it by path: made (mode 0755 less the umask)
/// when missing, so an agent never finds a writable place there to plant a fake journal
/// in; refused when it is a symlink or anything else, so the bind can never show a
/// directory from outside the desk (or a writable one from inside it) at `/desk/.desk`.
///
/// Nothing the agent runs can swap it between this check and the bind: inside every
/// running sandbox `/desk/.desk` is a read-only mount point (`EROFS`, `EBUSY`), and the
/// desk's other interfaces refuse changes under `.desk`.
///
/// # Errors
/// [`SandboxError::Io`] when it is not a directory (the message says what to do) or
/// cannot be made.
/// What the sandbox needs on the desk before it starts: `.desk/` as a real directory
/// (bound read-only) and the tool cache directories (`.cache/…`) the environment points
/// at. Idempotent; see [`crate::prepare_desk`].
pub(crate) fn prepare_desk(desk: &Path) -> Result<(), SandboxError> {
    desk_state(desk)?;
    for rel in env::CACHE_DIRS {
        let dir = desk.join(rel);
        std::fs::create_dir_all(&dir)
            .map_err(|e| SandboxError::io(format!("creating {}", dir.display()), e))?;
    }
    Ok(())
}

fn desk_state(desk: &Path) -> Result<(), SandboxError> {
    let state = desk.join(layout::DESK_STATE);
    let what = || format!("binding {} read-only", state.display());
    let refuse = || {
        SandboxError::io(
            what(),
            std::io::Error::other(format!(
                "the desk's {} is a symlink or not a directory (planted from inside exec?); \
                 deskfs keeps the desk's records there and will not bind what it points at: \
                 remove it and make it a directory again (mkdir {})",
                layout::DESK_STATE,
                layout::DESK_STATE
            )),
        )
    };
    match std::fs::symlink_metadata(&state) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(refuse()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::create_dir(&state) {
                Ok(()) => Ok(()),
                // made meanwhile: look again
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    match std::fs::symlink_metadata(&state) {
                        Ok(m) if m.is_dir() => Ok(()),
                        _ => Err(refuse()),
                    }
                }
                Err(e) => Err(SandboxError::io(what(), e)),
            }
        }
        Err(e) => Err(SandboxError::io(what(), e)),
    }
}

/// `workdir` must be `/desk` or a normalized absolute path under it that exists on the
/// desk (`desk` is the desk's canonical host path).
fn check_workdir(workdir: &Path, desk: &Path) -> Result<(), SandboxError> {
    let bad = || SandboxError::BadWorkdir {
        path: workdir.to_path_buf(),
    };
    let mut components = workdir.components();
    if components.next() != Some(Component::RootDir) {
        return Err(bad());
    }
    let mut rel = PathBuf::new();
    for c in components {
        match c {
            Component::Normal(n) => rel.push(n),
            _ => return Err(bad()),
        }
    }
    let rel = rel
        .strip_prefix(DESK_MOUNT.trim_start_matches('/'))
        .map_err(|_| bad())?;
    let host = desk.join(rel);
    if !host.is_dir() {
        return Err(SandboxError::WorkdirMissing {
            inside: workdir.to_path_buf(),
            host,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workdir_rules() {
        let desk = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(desk.path().join("tasks/t1")).unwrap();
        assert!(check_workdir(Path::new("/desk"), desk.path()).is_ok());
        assert!(check_workdir(Path::new("/desk/tasks/t1"), desk.path()).is_ok());
        assert!(check_workdir(Path::new("/desk/tasks/t1/"), desk.path()).is_ok());
        for bad in [
            "desk",
            "/",
            "/tmp",
            "/desk/../etc",
            "/desk/tasks/..",
            "/desks",
            "/desk2/x",
        ] {
            let err = check_workdir(Path::new(bad), desk.path()).unwrap_err();
            assert!(
                matches!(err, SandboxError::BadWorkdir { .. }),
                "{bad}: {err}"
            );
        }
        let err = check_workdir(Path::new("/desk/tasks/none"), desk.path()).unwrap_err();
        assert!(matches!(err, SandboxError::WorkdirMissing { .. }), "{err}");
    }
}
