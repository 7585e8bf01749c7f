//! Running the sandbox with its output piped to the caller (for servers: `deskfs serve`'s
//! exec endpoint, the MCP exec tool) and killing it on demand.
//!
//! bwrap is spawned, waited for and reaped by a thread of its own, so `--die-with-parent`
//! (which fires when the *thread* that spawned bwrap ends) can never fire early because a
//! caller's worker thread retired. Killing sends SIGKILL to bwrap's children — the
//! sandbox's pid 1 — and to bwrap; when a pid namespace's init dies the kernel kills every
//! process in it: the whole tree goes, background children and new sessions included.
//! The init is killed directly, not only through its parent-death signal: that signal
//! was seen not to fire (about one kill in 20 under load; bwrap's own issue tracker has
//! races around it), leaving the command running and its pipes open.
//!
//! A kill can never hit a recycled pid: the waiting thread sees bwrap's exit with
//! `WNOWAIT` and marks it under the lock [`Killer::kill`] takes before it reaps bwrap, and
//! a child of bwrap is signalled through a pidfd opened before the check that it is still
//! bwrap's child.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::{ChildStderr, ChildStdout, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};

use crate::host::Host;
use crate::run::{command_exit_reported, exit_code};
use crate::{build, check_bwrap, fds, SandboxError, SandboxSpec};

/// How a piped command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The exit code as a shell reports it: the command's own, or 128 + the signal that
    /// ended it (bwrap reports a command killed by a signal that way, so `exit 137` and
    /// SIGKILL look the same), 127 when the program does not exist. A command this
    /// process killed ([`Killer::kill`]) ends with 137.
    pub code: i32,
    /// It was killed through [`Killer::kill`].
    pub killed: bool,
}

impl Ended {
    /// The signal that ended the command, as a shell infers it: `code - 128` for codes
    /// 129 to 192 (so a command that itself exits with such a code is indistinguishable
    /// from one a signal ended), and SIGKILL for a command killed through
    /// [`Killer::kill`].
    pub fn signal(&self) -> Option<i32> {
        if self.killed {
            return Some(libc::SIGKILL);
        }
        (129..=192).contains(&self.code).then(|| self.code - 128)
    }
}

#[derive(Debug, Default)]
struct KillState {
    /// bwrap's pid once spawned.
    pid: Option<libc::pid_t>,
    /// bwrap has exited (it is about to be reaped; its pid may be reused after that).
    exited: bool,
    /// A kill was asked for (before the spawn, or while it ran).
    requested: bool,
}

/// Kills a piped command (cheap to clone; usable from any thread).
#[derive(Debug, Clone, Default)]
pub struct Killer {
    state: Arc<Mutex<KillState>>,
}

impl Killer {
    /// Kills the command and everything it started (SIGKILL to bwrap; see the module
    /// docs). Returns whether a signal was sent: `false` when the command had already
    /// ended (a later [`Piped::wait`] then reports it as not killed). Asked before the
    /// command started, it is killed as soon as it starts.
    pub fn kill(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.exited {
            return false;
        }
        s.requested = true;
        match s.pid {
            // bwrap is not reaped (exited is false under the lock): `pid` is still
            // bwrap's.
            Some(pid) => kill_tree(pid),
            None => true,
        }
    }

    /// The command was killed (a kill was sent before it exited).
    fn was_killed(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .requested
    }

    fn set_pid(&self, pid: libc::pid_t) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.pid = Some(pid);
        if s.requested {
            // The child was just spawned and not reaped.
            kill_tree(pid);
        }
    }

    fn set_exited(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).exited = true;
    }
}

/// The pids `/proc/PID/task/PID/children` lists (children of `pid`'s main thread; bwrap
/// has no other), or none when the file cannot be read (a kernel without
/// `CONFIG_PROC_CHILDREN`: then only the parent-death signal ends the sandbox).
fn children_of(pid: libc::pid_t) -> Vec<libc::pid_t> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// SIGKILL to `pid` (a live or unreaped child of this process) and to its children;
/// whether `pid` was signalled. `pid` is stopped first, and its children are read once
/// it is: a stopped process forks no more (a fork under way when the stop came either
/// completed, and its child is listed, or is redone after the stop), and its children
/// stay its own (a parent that died would hand them to another) until they are
/// signalled.
fn kill_tree(pid: libc::pid_t) -> bool {
    // SAFETY: kill() on a pid that is not yet reaped, so still the one meant.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    wait_stopped(pid);
    kill_children_of(pid);
    // SAFETY: as above; SIGKILL also ends a stopped process.
    unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
}

/// The state letter of `pid` in `/proc/PID/stat` (`R`, `S`, `T`, `Z`, …); `None` when it
/// is gone (or the file cannot be read or parsed).
fn proc_state(pid: libc::pid_t) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Waits until `pid` is stopped or dead ([`proc_state`]), at most 200 ms: a stop is
/// delivered when the process next leaves the kernel, which a busy machine may delay.
fn wait_stopped(pid: libc::pid_t) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    while std::time::Instant::now() < deadline {
        match proc_state(pid) {
            Some('T' | 't' | 'Z' | 'X' | 'x') | None => return,
            Some(_) => std::thread::sleep(std::time::Duration::from_micros(200)),
        }
    }
}

/// SIGKILL to every child of `pid`, which must be a live or unreaped child of this
/// process. Each is signalled through a pidfd opened before the check that it is still a
/// child of `pid`, so a pid recycled in between is never hit. Best effort: a child that
/// ended meanwhile needs no signal.
fn kill_children_of(pid: libc::pid_t) {
    for child in children_of(pid) {
        // SAFETY: pidfd_open(2) with a pid and no flags; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child, 0) };
        let Ok(fd) = std::os::fd::RawFd::try_from(fd) else {
            continue;
        };
        if fd < 0 {
            continue;
        }
        // SAFETY: pidfd_open just returned this descriptor and nothing else owns it.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        if children_of(pid).contains(&child) {
            // SAFETY: pidfd_send_signal(2) on an open pidfd, no siginfo, no flags.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    }
}

/// A sandboxed command started by [`crate::spawn_piped`]: its stdout and stderr, a
/// [`Killer`], and its end. Dropping it without [`Piped::wait`] kills the command.
#[derive(Debug)]
pub struct Piped {
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    killer: Killer,
    done: Option<mpsc::Receiver<Result<Ended, SandboxError>>>,
}

impl Piped {
    /// The command's stdout (once; `None` after the first call).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.stdout.take()
    }

    /// The command's stderr (once; `None` after the first call). bwrap's own messages
    /// (a failed sandbox setup) arrive here too.
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.stderr.take()
    }

    /// A handle that kills the command.
    pub fn killer(&self) -> Killer {
        self.killer.clone()
    }

    /// Blocks until the command has ended and returns how. Read its stdout and stderr
    /// meanwhile (from other threads): a command whose pipe is full waits for a reader.
    ///
    /// # Errors
    /// [`SandboxError::Setup`] when the sandbox could not be set up and the command never
    /// ran (bwrap's message went to the stderr pipe); [`SandboxError::Io`] when the
    /// waiting thread failed.
    pub fn wait(mut self) -> Result<Ended, SandboxError> {
        let Some(done) = self.done.take() else {
            return Err(SandboxError::io(
                "waiting for bwrap",
                std::io::Error::other("already waited for"),
            ));
        };
        done.recv().unwrap_or_else(|_| {
            Err(SandboxError::io(
                "waiting for bwrap",
                std::io::Error::other("the waiting thread ended without a result"),
            ))
        })
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        if self.done.is_some() {
            self.killer.kill();
        }
    }
}

/// See [`crate::spawn_piped`].
pub(crate) fn spawn_piped(spec: &SandboxSpec, argv: &[OsString]) -> Result<Piped, SandboxError> {
    let bwrap = check_bwrap()?;
    // No terminal reaches the command: stdin is /dev/null and the output goes to pipes,
    // so it always gets its own session (--new-session) and default signal handling.
    let host = Host {
        interactive: false,
        ..Host::current()
    };
    let (status_read, status_write) = fds::status_pipe()
        .map_err(|e| SandboxError::io("creating the status pipe for bwrap", e))?;
    let mut cmd = build::build(spec, argv, &host, &bwrap, Some(status_write))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let killer = Killer::default();
    let (started_tx, started_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let k = killer.clone();
    std::thread::Builder::new()
        .name("deskfs-exec-wait".into())
        .spawn(move || supervise(cmd, bwrap, status_read, k, started_tx, done_tx))
        .map_err(|e| SandboxError::io("starting the thread that runs bwrap", e))?;
    let (stdout, stderr) = started_rx.recv().unwrap_or_else(|_| {
        Err(SandboxError::io(
            "starting bwrap",
            std::io::Error::other("the thread that runs bwrap ended"),
        ))
    })?;
    Ok(Piped {
        stdout: Some(stdout),
        stderr: Some(stderr),
        killer,
        done: Some(done_rx),
    })
}

type Started = Result<(ChildStdout, ChildStderr), SandboxError>;

/// The body of the thread that owns bwrap: spawn, report the pipes, wait, report the end.
fn supervise(
    mut cmd: Command,
    bwrap: std::path::PathBuf,
    mut status_read: File,
    killer: Killer,
    started: mpsc::Sender<Started>,
    done: mpsc::Sender<Result<Ended, SandboxError>>,
) {
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(source) => {
            let _ = started.send(Err(SandboxError::Spawn { bwrap, source }));
            return;
        }
    };
    drop(cmd); // our copies of the descriptors passed to bwrap
    let pid = child.id() as libc::pid_t;
    killer.set_pid(pid);
    match (child.stdout.take(), child.stderr.take()) {
        (Some(o), Some(e)) => {
            let _ = started.send(Ok((o, e)));
        }
        _ => {
            killer.kill();
            let _ = child.wait();
            let _ = started.send(Err(SandboxError::io(
                "starting bwrap",
                std::io::Error::other("no pipes to the command"),
            )));
            return;
        }
    }
    // Wait for the exit without reaping, so a concurrent kill() cannot hit a reused pid.
    loop {
        // SAFETY: waitid with a zeroed siginfo_t it fills in.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    killer.set_exited();
    let result = match child.wait() {
        Err(e) => Err(SandboxError::io("waiting for bwrap", e)),
        Ok(status) => {
            let ran = command_exit_reported(&mut status_read);
            // killed by us: a kill was sent and bwrap died of a signal (not a command
            // that ended on its own just as the kill was sent)
            let killed = killer.was_killed() && status.code().is_none();
            match (status.code(), ran, killed) {
                (Some(code), false, false) => Err(SandboxError::Setup { code }),
                _ => Ok(Ended {
                    code: exit_code(status),
                    killed,
                }),
            }
        }
    };
    let _ = done.send(result);
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read};
    use std::time::Duration;

    use super::*;

    /// What `ps` would say about `pid`: alive unless gone or a zombie.
    fn alive(pid: libc::pid_t) -> bool {
        !matches!(proc_state(pid), None | Some('Z' | 'X' | 'x'))
    }

    /// A kill ends the children of the process too, without their parent-death signal: a
    /// shell's background `sleep` (which has none, as bwrap's child may lack its own) goes,
    /// and with it the last writer of the output pipe, so a reader reaches its end.
    #[test]
    fn a_kill_ends_the_children_and_closes_the_pipes() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 1000 & echo $!; wait"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (status_read, status_write) = fds::status_pipe().unwrap();
        drop(status_write);
        let killer = Killer::default();
        let (started_tx, started_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let k = killer.clone();
        std::thread::spawn(move || {
            supervise(cmd, "sh".into(), status_read, k, started_tx, done_tx)
        });
        let (stdout, _stderr) = started_rx.recv().unwrap().unwrap();
        let mut out = BufReader::new(stdout);
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let sleep: libc::pid_t = line.trim().parse().unwrap();
        assert!(alive(sleep));
        assert!(killer.kill(), "the shell was running");
        let (eof_tx, eof_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut rest = Vec::new();
            let _ = eof_tx.send(out.read_to_end(&mut rest).map(|_| rest));
        });
        let ended = done_rx.recv_timeout(Duration::from_secs(10));
        let eof = eof_rx.recv_timeout(Duration::from_secs(10));
        // A process killed closes its files before it turns into a zombie: the end of
        // the pipe can be seen a moment before its state says so.
        let gone_by = std::time::Instant::now() + Duration::from_secs(10);
        while alive(sleep) && std::time::Instant::now() < gone_by {
            std::thread::sleep(Duration::from_millis(5));
        }
        let sleep_alive = alive(sleep);
        if sleep_alive {
            // SAFETY: the test's own background child, still alive (not recycled).
            unsafe { libc::kill(sleep, libc::SIGKILL) };
        }
        assert!(!sleep_alive, "the background child outlived the kill");
        assert!(eof.is_ok(), "the output pipe stayed open");
        let ended = ended.expect("no end reported").unwrap();
        assert!(ended.killed, "{ended:?}");
    }
}
