//! Running git: one place that builds the command (no inherited `GIT_DIR`-style overrides,
//! no prompts), captures its output and turns a failure into [`DeskError::Git`].

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::error::{DeskError, Result};

/// Environment variables that would redirect git away from the `-C` directory.
const REDIRECTS: [&str; 6] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_NAMESPACE",
];

/// Settings that would run a program the repo names: deskfs runs git on the host, on
/// repos an agent controls from inside its sandbox, so a hook (`post-checkout` on
/// `worktree add`) or an fsmonitor (`git status`) committed or configured there must not
/// run. Given on the command line, they win over every config file.
const NO_PROGRAMS: [&str; 4] = [
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.sshCommand=false",
    "core.askPass=false",
];

/// A `git -C dir ARGS` command with a clean environment, stdin closed, and no program
/// named by the repo's config run ([`NO_PROGRAMS`]).
pub fn command<I, S>(dir: &Path, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new("git");
    c.arg("-C").arg(dir);
    for setting in NO_PROGRAMS {
        c.arg("-c").arg(setting);
    }
    c.args(args);
    for v in REDIRECTS {
        c.env_remove(v);
    }
    c.env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    c
}

fn describe(args: &[&str]) -> String {
    args.join(" ")
}

/// Runs git and returns its raw output, whatever the exit status.
///
/// # Errors
/// [`DeskError::NoGit`] when git cannot be started.
pub fn output(dir: &Path, args: &[&str]) -> Result<Output> {
    command(dir, args).output().map_err(DeskError::NoGit)
}

/// Runs git; its stdout (lossy UTF-8, trailing newline removed) on success.
///
/// # Errors
/// [`DeskError::Git`] with the first lines of stderr on a non-zero exit.
pub fn run(dir: &Path, args: &[&str]) -> Result<String> {
    let out = output(dir, args)?;
    if !out.status.success() {
        return Err(failure(dir, args, &out));
    }
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    while s.ends_with('\n') {
        s.pop();
    }
    Ok(s)
}

/// Runs git; `Some(stdout)` on success, `None` on a non-zero exit (a "no" answer such as
/// `rev-parse --verify` of a missing ref).
///
/// # Errors
/// [`DeskError::NoGit`] when git cannot be started.
pub fn try_run(dir: &Path, args: &[&str]) -> Result<Option<String>> {
    let out = output(dir, args)?;
    if !out.status.success() {
        return Ok(None);
    }
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    while s.ends_with('\n') {
        s.pop();
    }
    Ok(Some(s))
}

/// The [`DeskError::Git`] of a failed run: stderr joined into one line (at most 3 lines).
pub fn failure(dir: &Path, args: &[&str], out: &Output) -> DeskError {
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .collect();
    let message = if lines.is_empty() {
        format!("exit status {}", out.status)
    } else {
        lines.join(" / ")
    };
    DeskError::Git {
        args: describe(args),
        dir: dir.to_path_buf(),
        message,
    }
}

/// git's version as (major, minor, patch), probed once per process; `None` if git is
/// missing or prints something unexpected.
pub fn version() -> Option<(u32, u32, u32)> {
    static V: OnceLock<Option<(u32, u32, u32)>> = OnceLock::new();
    *V.get_or_init(|| {
        let out = Command::new("git").arg("--version").output().ok()?;
        parse_version(&String::from_utf8_lossy(&out.stdout))
    })
}

/// Parses `git version 2.47.3` (also `2.48.0.rc1`, `2.39.2.windows.1`).
pub fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let v = s.trim().strip_prefix("git version ")?;
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    let patch = it.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some((major, minor, patch))
}

/// Whether `git worktree add --relative-paths` exists (git >= 2.48).
pub fn has_relative_paths() -> bool {
    version().is_some_and(|v| v >= (2, 48, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("git version 2.47.3\n"), Some((2, 47, 3)));
        assert_eq!(parse_version("git version 2.48.0.rc1"), Some((2, 48, 0)));
        assert_eq!(
            parse_version("git version 2.39.2.windows.1"),
            Some((2, 39, 2))
        );
        assert_eq!(parse_version("git version 3.0"), Some((3, 0, 0)));
        assert_eq!(parse_version("hg 1.0"), None);
    }

    /// The probe is git's own answer (this machine has git: the desk tests need it).
    #[test]
    fn the_probed_version_is_what_git_says() {
        let out = Command::new("git").arg("--version").output().unwrap();
        let said = parse_version(&String::from_utf8_lossy(&out.stdout));
        assert!(said.is_some_and(|v| v >= (2, 0, 0)), "{said:?}");
        assert_eq!(version(), said);
    }

    /// A failed run names the command, the directory and git's own words (not blank
    /// lines, at most three).
    #[test]
    fn a_failed_run_says_what_git_said() {
        let t = tempfile::tempdir().unwrap();
        let e = run(t.path(), &["no-such-command", "--x"]).unwrap_err();
        match &e {
            DeskError::Git { args, dir, message } => {
                assert_eq!(args, "no-such-command --x");
                assert_eq!(dir, t.path());
                assert!(message.contains("is not a git command"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(try_run(t.path(), &["no-such-command"]).unwrap(), None);
    }
}
