//! Running a desk's shell commands (tool version commands) inside the desk's `exec`
//! sandbox (`sh -c CMD` at /desk, no network), with a timeout and captured output.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How a shell command ended.
#[derive(Debug, Clone)]
pub struct ShellOutput {
    /// Exit code; `None` when killed by a signal or by the timeout.
    pub code: Option<i32>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Captured stdout (lossy UTF-8).
    pub stdout: String,
    /// Captured stderr (lossy UTF-8).
    pub stderr: String,
}

impl ShellOutput {
    /// The first non-empty line of stdout, else of stderr, trimmed (`java -version`
    /// prints to stderr).
    pub fn first_line(&self) -> Option<String> {
        let first = |s: &str| {
            s.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(str::to_owned)
        };
        first(&self.stdout).or_else(|| first(&self.stderr))
    }

    /// One-line description of a failure: `exit 127: sh: 1: foo: not found`.
    pub fn failure(&self) -> String {
        let what = if self.timed_out {
            "timed out".to_owned()
        } else {
            match self.code {
                Some(c) => format!("exit {c}"),
                None => "killed by a signal".to_owned(),
            }
        };
        let err = self
            .stderr
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("");
        if err.is_empty() {
            what
        } else {
            format!("{what}: {err}")
        }
    }
}

/// Runs `sh -c cmd` in `cwd` with `env` added, stdin closed, for at most `timeout`
/// (then its whole process group is killed).
///
/// # Errors
/// The spawn error when `sh` cannot be started.
pub fn run(
    cmd: &str,
    cwd: &Path,
    env: &[(String, OsString)],
    timeout: Duration,
) -> std::io::Result<ShellOutput> {
    // The command comes from AGENTS.md, which the agent edits from inside `deskfs exec`:
    // it runs in the same sandbox (desk at /desk, no network), never on the host.
    // The sandbox sets PATH and HOME for /desk itself; other variables pass.
    let spec = deskfs_sandbox::SandboxSpec {
        net: deskfs_sandbox::Net::None,
        env: env
            .iter()
            .filter(|(k, _)| k != "PATH" && k != "HOME")
            .map(|(k, v)| (OsString::from(k), v.clone()))
            .collect(),
        ..deskfs_sandbox::SandboxSpec::new(cwd.to_path_buf())
    };
    let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), cmd.into()];
    let mut c = deskfs_sandbox::command(&spec, &argv).map_err(std::io::Error::other)?;
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = c.spawn()?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out_t = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err_t = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if start.elapsed() >= timeout {
            timed_out = true;
            // SAFETY: signalling the process group we created (pgid = child pid).
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
            }
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    Ok(ShellOutput {
        code: if timed_out { None } else { status.code() },
        timed_out,
        stdout,
        stderr,
    })
}

/// Shell builtins and keywords a command may start with (they always "exist").
const BUILTINS: [&str; 16] = [
    "cd", "export", ".", "source", "test", "[", "true", "false", "exec", "set", "env", "if", "for",
    "while", "(", "{",
];

/// The program a shell command line starts with, after `VAR=value` prefixes; `None` for an
/// empty line.
pub fn program_of(cmd: &str) -> Option<&str> {
    cmd.split_whitespace().find(|w| {
        let assignment = w.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        !assignment
    })
}

/// Where the program `prog` would be found: a path with `/` relative to `cwd`, else the
/// first executable file named `prog` on `path` (a `PATH`-style list). Builtins resolve to
/// themselves.
pub fn find_program(prog: &str, cwd: &Path, path: &std::ffi::OsStr) -> Option<PathBuf> {
    if BUILTINS.contains(&prog) {
        return Some(PathBuf::from(prog));
    }
    if prog.contains('/') {
        let p = cwd.join(prog);
        return is_executable(&p).then_some(p);
    }
    std::env::split_paths(path)
        .map(|d| d.join(prog))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_times_out() {
        let t = tempfile::tempdir().unwrap();
        let o = run(
            "echo hi; echo oops >&2",
            t.path(),
            &[],
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(o.code, Some(0));
        assert_eq!(o.first_line().as_deref(), Some("hi"));
        let o = run("echo v1 >&2", t.path(), &[], Duration::from_secs(10)).unwrap();
        assert_eq!(o.first_line().as_deref(), Some("v1"));
        let env = vec![("X_TEST".to_owned(), OsString::from("42"))];
        let o = run(
            "echo $X_TEST; exit 3",
            t.path(),
            &env,
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!((o.code, o.first_line().as_deref()), (Some(3), Some("42")));
        let start = Instant::now();
        let o = run("sleep 30", t.path(), &[], Duration::from_millis(200)).unwrap();
        assert!(o.timed_out && start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn programs() {
        assert_eq!(program_of("RUST_LOG=x cargo test"), Some("cargo"));
        assert_eq!(program_of("./run.sh --all"), Some("./run.sh"));
        assert_eq!(program_of("  "), None);
        let t = tempfile::tempdir().unwrap();
        let path = std::ffi::OsString::from("/bin:/usr/bin");
        assert!(find_program("sh", t.path(), &path).is_some());
        assert!(find_program("no-such-program-xyz", t.path(), &path).is_none());
        assert!(find_program("./missing.sh", t.path(), &path).is_none());
        assert!(find_program("cd", t.path(), &path).is_some());
    }
}
