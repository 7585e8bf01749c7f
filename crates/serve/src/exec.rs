//! Commands run against a desk in the bubblewrap sandbox (`deskfs-sandbox`), for every
//! interface: the HTTP endpoint streams [`ExecEvent`]s as they come ([`start`]), the MCP
//! tool takes the output collected up to a cap ([`collect`]). Both go through [`start`].
//!
//! The request ([`ExecRequest`]):
//! * `command`: the program and its arguments (argv, no shell), or `shell`: one string
//!   run as `sh -c STRING` (pipes, `&&`, redirections); exactly one of the two.
//! * `cwd`: a directory of the desk, desk-relative (`tasks/T`, `repos/app`; default the
//!   desk itself); checked like every path ([`crate::confine`]) and it must be a real
//!   directory, not a symlink. Inside, the desk is `/desk`, so `cwd: "tasks/T"` runs in
//!   `/desk/tasks/T`.
//! * `env`: extra variables; names starting with `AWS_`, `GOOGLE_`, `GCLOUD_`, `AZURE_`
//!   or `DESKFS_` are refused (the sandbox never sees credentials); no NUL anywhere.
//! * `timeout_secs`: default [`DEFAULT_TIMEOUT_SECS`], at most [`MAX_TIMEOUT_SECS`]; when
//!   it passes, the command and every process it started are killed (the sandbox's pid
//!   namespace ends) and the exit reports `timed_out`.
//! * `net`: `"host"` (default) or `"none"` (loopback only).
//!
//! stdin is `/dev/null`; no terminal. Output comes as it is written, in chunks of up to
//! 64 KiB per read; stdout and stderr are separate. A chunk is never split inside a UTF-8
//! character; chunks that are not UTF-8 (binary output) are carried as base64 on HTTP
//! (see [`chunk_json`]), so concatenating the chunks of one stream gives its exact bytes.
//! The end is one [`ExitInfo`] after all output, or an error when the sandbox could not
//! be set up (the command never ran; bwrap's message arrived as stderr). Dropping the
//! [`ExecStream`] (an HTTP client that goes away) kills the command.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use deskfs_desk::Desk;
use deskfs_sandbox::{Ended, Killer, Net, Piped, SandboxError, SandboxSpec, DESK_MOUNT};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::confine::{DeskDir, Kind, RelPath};
use crate::error::{Code, Result, ServeError};
use crate::exec_journal::{PendingEntry, SharedTally, Via};
use deskfs_desk::journal::WatchFactory;

/// Timeout of a command that names none, seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 600;
/// The longest timeout a request may ask for, seconds.
pub const MAX_TIMEOUT_SECS: u64 = 3600;
/// Commands one server runs at once unless told otherwise ([`ExecHost::with_limit`]).
/// Each holds three threads of its own while it runs (two pipe readers and its waiter;
/// never tokio's blocking pool, which file requests use).
pub const DEFAULT_MAX_RUNNING: usize = 64;
/// What [`collect`] keeps of each stream by default: 1 MiB (the first and last half).
pub const COLLECT_CAP: usize = 1 << 20;
/// Largest chunk read from a pipe at once.
const CHUNK: usize = 64 * 1024;
/// Chunks in flight to a slow reader before the command's pipe fills up.
const QUEUE: usize = 16;

/// Network access of the command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetChoice {
    /// The host's network.
    #[default]
    Host,
    /// Loopback only.
    None,
}

/// One command to run (the JSON body of `POST /v1/desks/{agent}/exec`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments (no shell). Exclusive with `shell`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// A shell command line, run as `sh -c SHELL`. Exclusive with `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Working directory, desk-relative (default: the desk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Seconds before the command is killed (default [`DEFAULT_TIMEOUT_SECS`], at most
    /// [`MAX_TIMEOUT_SECS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Network access.
    #[serde(default)]
    pub net: NetChoice,
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ExitInfo {
    /// The exit code as a shell reports it: the command's own, 128 + signal when a signal
    /// ended it, 127 when the program does not exist, 137 when it was killed.
    pub code: i32,
    /// The signal that ended it, as a shell infers it (`code - 128` for 129..=192, so a
    /// command that itself exits 130 shows signal 2); 9 when it was killed.
    pub signal: Option<i32>,
    /// Wall time from start to end, milliseconds.
    pub duration_ms: u64,
    /// Bytes written to stdout.
    pub stdout_bytes: u64,
    /// Bytes written to stderr.
    pub stderr_bytes: u64,
    /// Its timeout passed and it was killed.
    pub timed_out: bool,
    /// It was killed (its timeout passed, or the client went away).
    pub killed: bool,
    /// The id of its entry in the desk's task journal (absent when this server keeps no
    /// journal, or the entry could not be written).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_id: Option<String>,
}

/// One event of a running command, in order: output chunks, then one `Exit` or `Error`.
#[derive(Debug)]
pub enum ExecEvent {
    /// Bytes the command wrote to stdout.
    Stdout(Vec<u8>),
    /// Bytes the command (or bwrap, setting up) wrote to stderr.
    Stderr(Vec<u8>),
    /// The command ended; all its output came before.
    Exit(ExitInfo),
    /// The command never ran (`exec_unavailable`: the sandbox could not be set up), or
    /// the server failed while it ran (`io`).
    Error(ServeError),
}

/// The chunk's JSON: `{"text": "..."}` when the bytes are UTF-8, else `{"base64":
/// "..."}` (standard alphabet, padded).
pub fn chunk_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => json!({ "text": s }),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(bytes) }),
    }
}

type HideFn = dyn Fn() -> Vec<PathBuf> + Send + Sync;

/// What the server host adds to every command: host paths to hide (the binary's deskfs
/// data outside `$DESKFS_HOME`: mount caches, metadata databases, local bucket
/// directories), base environment (e.g. the server's git identity), and a count of the
/// commands running per desk. Cheap to clone (shared).
#[derive(Clone)]
pub struct ExecHost {
    hide: Option<Arc<HideFn>>,
    env: Vec<(String, String)>,
    /// Watches the desk's mount for each command's file changes, for the task journal
    /// (`None`: no journal is kept).
    journal: Option<WatchFactory>,
    /// The commands running now: id → (agent, its killer).
    running: Arc<Mutex<HashMap<u64, (String, Killer)>>>,
    /// One permit per command that may run at once.
    slots: Arc<tokio::sync::Semaphore>,
    /// Their number.
    limit: usize,
}

impl Default for ExecHost {
    fn default() -> ExecHost {
        ExecHost {
            hide: None,
            env: Vec::new(),
            journal: None,
            running: Arc::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_RUNNING)),
            limit: DEFAULT_MAX_RUNNING,
        }
    }
}

static NEXT_RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl std::fmt::Debug for ExecHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecHost")
            .field("hide", &self.hide.is_some())
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("journal", &self.journal.is_some())
            .finish()
    }
}

impl ExecHost {
    /// Nothing hidden beyond what the sandbox always hides (`$DESKFS_HOME`, the other
    /// desks, home directories), no base environment.
    pub fn new() -> ExecHost {
        ExecHost::default()
    }

    /// Hides the paths `paths()` returns (asked at every command, so workspaces mounted
    /// later are covered). Paths that hold the desk are left out (they cannot be hidden
    /// from it; the sandbox shows only the desk of them anyway).
    pub fn hiding(mut self, paths: impl Fn() -> Vec<PathBuf> + Send + Sync + 'static) -> Self {
        self.hide = Some(Arc::new(paths));
        self
    }

    /// Sets variables every command gets (a request's `env` overrides them). They are
    /// checked like a request's at each command.
    pub fn with_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = env;
        self
    }

    /// Records every command in the desk's task journal (`.desk/journal/`), with the file
    /// changes `watch` reports for it (see `deskfs_desk::journal`).
    pub fn with_journal(mut self, watch: WatchFactory) -> Self {
        self.journal = Some(watch);
        self
    }

    /// Runs at most `n` commands at once (at least 1); past it a command is refused with
    /// `too_many_commands` (429) before it starts.
    pub fn with_limit(mut self, n: usize) -> Self {
        let n = n.max(1);
        self.slots = Arc::new(tokio::sync::Semaphore::new(n));
        self.limit = n;
        self
    }

    /// How many commands run on `agent`'s desk now.
    pub fn running(&self, agent: &str) -> usize {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|(a, _)| a == agent)
            .count()
    }

    /// Kills every command running now (a server shutting down: their streams end with
    /// `killed`, so their connections end too).
    pub fn kill_all(&self) {
        for (_, k) in self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            k.kill();
        }
    }

    /// Waits until no command runs and every ended one is in the journal, at most
    /// `within`; whether that was reached. A server stopping calls it after
    /// [`ExecHost::kill_all`], so the commands it killed are recorded before it exits.
    pub async fn drain(&self, within: Duration) -> bool {
        let all = u32::try_from(self.limit).unwrap_or(u32::MAX);
        tokio::time::timeout(within, self.slots.acquire_many(all))
            .await
            .is_ok_and(|permits| permits.is_ok())
    }

    fn register(&self, agent: &str, killer: Killer) -> u64 {
        let id = NEXT_RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (agent.to_owned(), killer));
        id
    }

    fn unregister(&self, id: u64) {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
}

/// Whether this server can run commands (bubblewrap is installed).
pub fn available() -> bool {
    deskfs_sandbox::check_bwrap().is_ok()
}

fn bad(msg: impl Into<String>) -> ServeError {
    ServeError::new(Code::BadRequest, msg)
}

/// A sandbox error as an error of this crate, with no host path in the message.
fn sandbox_error(e: SandboxError) -> ServeError {
    match e {
        SandboxError::EmptyCommand => bad(
            "no command: send \"command\": [PROGRAM, ARGS...] or \"shell\": \"COMMAND LINE\"",
        ),
        SandboxError::BadEnvName { .. } | SandboxError::ForbiddenEnv { .. } => {
            bad(e.to_string())
        }
        SandboxError::BadWorkdir { .. } | SandboxError::WorkdirMissing { .. } => {
            ServeError::new(
                Code::NotFound,
                "the working directory is not a directory of the desk; name an existing one in \"cwd\"",
            )
        }
        SandboxError::DeskMissing { .. } => ServeError::new(
            Code::UnknownDesk,
            "the desk's directory is gone; create the desk again",
        ),
        SandboxError::BwrapMissing => ServeError::new(
            Code::ExecUnavailable,
            "this server cannot run commands: bubblewrap (bwrap) is not installed on it (apt-get install -y bubblewrap)",
        ),
        SandboxError::Spawn { source, .. } => ServeError::new(
            Code::ExecUnavailable,
            format!("the server could not start bubblewrap: {source}"),
        ),
        SandboxError::Setup { code } => ServeError::new(
            Code::ExecUnavailable,
            format!("the sandbox could not be set up and the command did not run (bwrap exited with {code}; its message is in stderr)"),
        ),
        SandboxError::Io { source, .. } => ServeError::new(
            Code::Io,
            format!("cannot prepare the sandbox: {source}"),
        ),
    }
}

/// Checks `req` against the desk at `desk_dir` and turns it into what the sandbox runs.
fn prepare(
    desk_dir: &Path,
    host: &ExecHost,
    req: &ExecRequest,
) -> Result<(SandboxSpec, Vec<OsString>, Duration)> {
    let argv: Vec<String> = match (&req.shell, req.command.is_empty()) {
        (Some(_), false) => {
            return Err(bad(
                "send \"command\" (argv) or \"shell\" (a command line for sh -c), not both",
            ))
        }
        (Some(s), true) if s.trim().is_empty() => return Err(bad("\"shell\" is empty")),
        (Some(s), true) => vec!["sh".into(), "-c".into(), s.clone()],
        (None, true) => return Err(sandbox_error(SandboxError::EmptyCommand)),
        (None, false) => req.command.clone(),
    };
    if argv[0].is_empty() {
        return Err(bad("the program name (command[0]) is empty"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(bad("the command contains a NUL byte"));
    }
    let timeout = match req.timeout_secs {
        None => DEFAULT_TIMEOUT_SECS,
        Some(t) if (1..=MAX_TIMEOUT_SECS).contains(&t) => t,
        Some(t) => {
            return Err(bad(format!(
                "timeout_secs {t} is out of range; give 1 to {MAX_TIMEOUT_SECS}"
            )))
        }
    };
    let mut workdir = PathBuf::from(DESK_MOUNT);
    if let Some(cwd) = &req.cwd {
        let rel = RelPath::parse(cwd)?;
        if !rel.is_root() {
            let st = DeskDir::open(desk_dir)?.stat(&rel)?;
            match st.kind {
                Kind::Dir => {}
                Kind::Symlink => {
                    return Err(ServeError::new(
                        Code::NotDir,
                        format!(
                            "cwd {:?} is a symlink; name the directory itself",
                            rel.display()
                        ),
                    ))
                }
                _ => {
                    return Err(ServeError::new(
                        Code::NotDir,
                        format!("cwd {:?} is not a directory", rel.display()),
                    ))
                }
            }
            workdir.push(rel.display());
        }
    }
    let mut env: Vec<(String, String)> = host.env.clone();
    for (k, v) in &req.env {
        env.retain(|(n, _)| n != k);
        env.push((k.clone(), v.clone()));
    }
    if env
        .iter()
        .any(|(k, v)| k.contains('\0') || v.contains('\0'))
    {
        return Err(bad("an environment variable contains a NUL byte"));
    }
    let hide = host
        .hide
        .as_ref()
        .map(|f| f())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| !desk_dir.starts_with(p))
        .collect();
    let spec = SandboxSpec {
        desk_dir: desk_dir.to_path_buf(),
        workdir,
        net: match req.net {
            NetChoice::Host => Net::Host,
            NetChoice::None => Net::None,
        },
        env: env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        hide,
    };
    Ok((
        spec,
        argv.into_iter().map(OsString::from).collect(),
        Duration::from_secs(timeout),
    ))
}

/// A running command's events. Dropping it kills the command (and everything it
/// started) if it still runs.
#[derive(Debug)]
pub struct ExecStream {
    rx: mpsc::Receiver<ExecEvent>,
    killer: Killer,
}

impl ExecStream {
    /// The next event; `None` after the `Exit` or `Error` event.
    pub async fn next(&mut self) -> Option<ExecEvent> {
        self.rx.recv().await
    }
}

impl Drop for ExecStream {
    fn drop(&mut self) {
        self.killer.kill();
    }
}

/// Holds a bit of output back while it ends inside a UTF-8 character, so no chunk splits
/// one (invalid bytes are passed on as they are).
fn utf8_cut(buf: &mut Vec<u8>) -> Vec<u8> {
    let keep = match std::str::from_utf8(buf) {
        Err(e) if e.error_len().is_none() => buf.len() - e.valid_up_to(),
        _ => 0,
    };
    let rest = buf.split_off(buf.len() - keep);
    std::mem::replace(buf, rest)
}

/// Which stream a pump reads.
#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn event(self, b: Vec<u8>) -> ExecEvent {
        match self {
            Stream::Stdout => ExecEvent::Stdout(b),
            Stream::Stderr => ExecEvent::Stderr(b),
        }
    }
}

/// Reads `pipe` to its end, sending chunks as events of `stream` and adding them to
/// `tally` (the journal's count, when kept); returns the bytes read.
fn pump(
    mut pipe: impl Read,
    tx: mpsc::Sender<ExecEvent>,
    stream: Stream,
    tally: Option<SharedTally>,
) -> u64 {
    let mut total = 0u64;
    let mut buf = vec![0u8; CHUNK];
    let mut pending: Vec<u8> = Vec::new();
    let mut receiver_gone = false;
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        total += n as u64;
        if let Some(t) = &tally {
            let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
            match stream {
                Stream::Stdout => t.stdout(&buf[..n]),
                Stream::Stderr => t.stderr(&buf[..n]),
            }
        }
        if receiver_gone {
            continue; // drain, so the command is never stuck on a full pipe
        }
        pending.extend_from_slice(&buf[..n]);
        let out = utf8_cut(&mut pending);
        if !out.is_empty() && tx.blocking_send(stream.event(out)).is_err() {
            receiver_gone = true;
        }
    }
    if !pending.is_empty() && !receiver_gone {
        let _ = tx.blocking_send(stream.event(pending));
    }
    total
}

/// Starts `req` on `desk` and returns its events as they come. Validation, the
/// working directory and the sandbox's own checks fail here, before anything runs.
/// When `host` keeps a journal, the command is recorded in it (as run `via`) before its
/// `Exit` event is sent; a command that never ran is not recorded.
///
/// # Errors
/// `bad_request` (no command or both forms, an empty program, NUL bytes, a refused or
/// malformed variable name, a timeout out of range), the path codes of `cwd`
/// (`outside_desk`, `not_found`, `not_dir`, `bad_path`, `name_too_long`, …),
/// `exec_unavailable` (no bubblewrap, or it cannot be started), `too_many_commands`
/// (the server's limit of running commands is reached), `io`.
pub async fn start(desk: &Desk, host: &ExecHost, req: ExecRequest, via: Via) -> Result<ExecStream> {
    let slot = host.slots.clone().try_acquire_owned().map_err(|_| {
        ServeError::new(
            Code::TooManyCommands,
            format!(
                "this server already runs {} commands, as many as it takes; retry when one has ended (deskfs serve --max-commands raises the limit)",
                host.limit
            ),
        )
    })?;
    let d = desk.clone();
    let h = host.clone();
    let (piped, timeout, started, entry) = tokio::task::spawn_blocking(move || {
        let (spec, argv, timeout) = prepare(d.dir(), &h, &req)?;
        // What the sandbox makes on the desk is made before the journal's watch starts.
        deskfs_sandbox::prepare_desk(d.dir()).map_err(sandbox_error)?;
        let entry = h.journal.as_ref().map(|w| {
            let command = argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let cwd = spec
                .workdir
                .strip_prefix(DESK_MOUNT)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            PendingEntry::begin(w, &d, via, command, cwd)
        });
        let started = Instant::now();
        let piped = deskfs_sandbox::spawn_piped(&spec, &argv).map_err(sandbox_error)?;
        Ok::<_, ServeError>((piped, timeout, started, entry))
    })
    .await
    .map_err(|e| ServeError::new(Code::Io, format!("a worker failed: {e}")))??;
    Ok(supervise(
        piped,
        timeout,
        started,
        host.clone(),
        desk.agent().to_owned(),
        entry,
        slot,
    ))
}

/// Runs `f` on a thread of its own, not on tokio's blocking pool: a command may run for an
/// hour, and the threads of many commands must never starve the file requests that pool
/// serves. The receiver gets `f`'s result, or an error when the thread could not start
/// (then `f` and what it holds are dropped: a pipe closes, a command is killed).
fn own_thread<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::sync::oneshot::Receiver<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = tx.send(f());
        });
    if let Err(e) = started {
        tracing::error!(error = %e, "cannot start a thread for a command");
    }
    rx
}

/// Pumps the output of `piped` and reports its end, killing it at `timeout`.
fn supervise(
    mut piped: Piped,
    timeout: Duration,
    started: Instant,
    host: ExecHost,
    agent: String,
    entry: Option<PendingEntry>,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> ExecStream {
    let (tx, rx) = mpsc::channel(QUEUE);
    let killer = piped.killer();
    let out = piped.take_stdout();
    let err = piped.take_stderr();
    let (tx_out, tx_err) = (tx.clone(), tx.clone());
    let (tally_out, tally_err) = (
        entry.as_ref().map(PendingEntry::tally),
        entry.as_ref().map(PendingEntry::tally),
    );
    let out = own_thread("exec-stdout", move || {
        out.map_or(0, |o| pump(o, tx_out, Stream::Stdout, tally_out))
    });
    let err = own_thread("exec-stderr", move || {
        err.map_or(0, |e| pump(e, tx_err, Stream::Stderr, tally_err))
    });
    let k = killer.clone();
    let id = host.register(&agent, killer.clone());
    tokio::spawn(async move {
        let mut wait = own_thread("exec-wait", move || piped.wait());
        let (ended, timed_out) = tokio::select! {
            r = &mut wait => (r, false),
            _ = tokio::time::sleep(timeout) => {
                let killed = k.kill();
                (wait.await, killed)
            }
        };
        // All output is read before the end is reported (the pipes end with the sandbox).
        let stdout_bytes = out.await.unwrap_or(0);
        let stderr_bytes = err.await.unwrap_or(0);
        host.unregister(id);
        let event = match ended {
            Ok(Ok(e)) => {
                let mut exit = exit_info(e, started, stdout_bytes, stderr_bytes, timed_out);
                if let Some(entry) = entry {
                    let x = exit.clone();
                    exit.journal_id = tokio::task::spawn_blocking(move || entry.finish(&x))
                        .await
                        .ok()
                        .flatten();
                }
                ExecEvent::Exit(exit)
            }
            Ok(Err(e)) => ExecEvent::Error(sandbox_error(e)),
            Err(e) => ExecEvent::Error(ServeError::new(
                Code::Io,
                format!("waiting for the command failed: {e}"),
            )),
        };
        // The slot is free once the command ended and its entry is written.
        drop(slot);
        let _ = tx.send(event).await;
    });
    ExecStream { rx, killer }
}

fn exit_info(
    e: Ended,
    started: Instant,
    stdout_bytes: u64,
    stderr_bytes: u64,
    timed_out: bool,
) -> ExitInfo {
    ExitInfo {
        code: e.code,
        signal: e.signal(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        stdout_bytes,
        stderr_bytes,
        timed_out: timed_out && e.killed,
        killed: e.killed,
        journal_id: None,
    }
}

/// The first and last `cap / 2` bytes of a stream.
#[derive(Debug)]
struct Capture {
    half: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
    total: u64,
}

impl Capture {
    fn new(cap: usize) -> Capture {
        Capture {
            half: cap / 2,
            head: Vec::new(),
            tail: Vec::new(),
            total: 0,
        }
    }

    fn push(&mut self, mut b: &[u8]) {
        self.total += b.len() as u64;
        let room = self.half.saturating_sub(self.head.len());
        let n = room.min(b.len());
        self.head.extend_from_slice(&b[..n]);
        b = &b[n..];
        self.tail.extend_from_slice(b);
        if self.tail.len() > 2 * self.half.max(1) {
            let drop = self.tail.len() - self.half;
            self.tail.drain(..drop);
        }
    }

    /// The text (lossy UTF-8) and whether bytes were left out.
    fn finish(mut self) -> (String, bool) {
        let kept = (self.head.len() + self.tail.len()) as u64;
        if kept == self.total && self.tail.len() <= self.half {
            self.head.extend_from_slice(&self.tail);
            return (String::from_utf8_lossy(&self.head).into_owned(), false);
        }
        let start = self.tail.len().saturating_sub(self.half);
        let tail = &self.tail[start..];
        let omitted = self.total - (self.head.len() + tail.len()) as u64;
        (
            format!(
                "{}\n[... {omitted} bytes left out ...]\n{}",
                String::from_utf8_lossy(&self.head),
                String::from_utf8_lossy(tail)
            ),
            true,
        )
    }
}

/// A command's output collected (for callers that take one result, like MCP tools).
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct Collected {
    /// stdout as text (invalid UTF-8 replaced); when longer than the cap, its first and
    /// last half-cap with `[... N bytes left out ...]` between.
    pub stdout: String,
    /// stderr, the same way.
    pub stderr: String,
    /// stdout was longer than the cap.
    pub stdout_truncated: bool,
    /// stderr was longer than the cap.
    pub stderr_truncated: bool,
    /// How it ended (byte counts are of the whole output).
    pub exit: ExitInfo,
}

/// Runs `req` on `desk` to its end (or timeout) and returns its output, keeping at most
/// `cap` bytes of each stream ([`COLLECT_CAP`] is the usual cap).
///
/// # Errors
/// Those of [`start`]; `exec_unavailable` when the sandbox could not be set up (the
/// message ends with what bwrap said); `io`.
pub async fn collect(
    desk: &Desk,
    host: &ExecHost,
    req: ExecRequest,
    cap: usize,
    via: Via,
) -> Result<Collected> {
    let mut s = start(desk, host, req, via).await?;
    let (mut out, mut err) = (Capture::new(cap), Capture::new(cap));
    while let Some(ev) = s.next().await {
        match ev {
            ExecEvent::Stdout(b) => out.push(&b),
            ExecEvent::Stderr(b) => err.push(&b),
            ExecEvent::Exit(exit) => {
                let (stdout, stdout_truncated) = out.finish();
                let (stderr, stderr_truncated) = err.finish();
                return Ok(Collected {
                    stdout,
                    stderr,
                    stdout_truncated,
                    stderr_truncated,
                    exit,
                });
            }
            ExecEvent::Error(mut e) => {
                // What bwrap said (paths inside the sandbox only), on the one line.
                let said = err.finish().0;
                let said: String = said
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .chars()
                    .take(300)
                    .collect();
                if e.code == Code::ExecUnavailable && !said.is_empty() {
                    e.message = format!(
                        "the sandbox could not be set up and the command did not run: {said}"
                    );
                }
                return Err(e);
            }
        }
    }
    Err(ServeError::new(
        Code::Io,
        "the command's events ended without an exit",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_never_cut_inside_a_character() {
        let mut b = "aé".as_bytes().to_vec();
        b.pop(); // half of é
        assert_eq!(utf8_cut(&mut b), b"a");
        assert_eq!(b, vec![0xc3]);
        b.push(0xa9);
        assert_eq!(utf8_cut(&mut b), "é".as_bytes());
        assert!(b.is_empty());
        let mut bin = vec![0xff, 0xfe, b'x'];
        assert_eq!(utf8_cut(&mut bin), vec![0xff, 0xfe, b'x']);
        assert_eq!(chunk_json(b"hi\n"), json!({"text": "hi\n"}));
        assert_eq!(chunk_json(&[0xff]), json!({"base64": "/w=="}));
    }

    #[test]
    fn a_capture_keeps_head_and_tail() {
        let mut c = Capture::new(8);
        c.push(b"abc");
        assert_eq!(c.finish(), ("abc".to_owned(), false));
        let mut c = Capture::new(8);
        c.push(b"12345678");
        assert_eq!(c.finish(), ("12345678".to_owned(), false));
        let mut c = Capture::new(8);
        for _ in 0..100 {
            c.push(b"xy");
        }
        c.push(b"END!");
        let (t, cut) = c.finish();
        assert!(cut);
        assert_eq!(t, "xyxy\n[... 196 bytes left out ...]\nEND!");
    }

    /// A desk root with the desk of `alice` (a `tasks/t1` dir, a link `out` to a
    /// directory outside), and the root's temp dir.
    fn desk() -> (tempfile::TempDir, Desk) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("desks");
        std::fs::create_dir(&root).unwrap();
        let d = Desk::create(&root, "alice").unwrap();
        std::fs::create_dir_all(d.dir().join("tasks/t1")).unwrap();
        std::fs::create_dir(t.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), d.dir().join("out")).unwrap();
        (t, d)
    }

    fn sh(script: &str) -> ExecRequest {
        ExecRequest {
            shell: Some(script.into()),
            ..ExecRequest::default()
        }
    }

    async fn run(d: &Desk, req: ExecRequest) -> Result<Collected> {
        collect(d, &ExecHost::new(), req, COLLECT_CAP, Via::Http).await
    }

    /// Some process runs `sleep MARKER`.
    fn sleeping(marker: &str) -> bool {
        let want = format!("sleep\0{marker}\0");
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let mut s = String::new();
            std::fs::File::open(e.path().join("cmdline"))
                .and_then(|mut f| f.read_to_string(&mut s))
                .is_ok()
                && s == want
        })
    }

    /// Waits (bounded) for `sleep MARKER` to run: the shell prints before it execs sleep.
    async fn started(marker: &str) -> bool {
        for _ in 0..500 {
            if sleeping(marker) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    async fn gone(marker: &str) -> bool {
        for _ in 0..250 {
            if !sleeping(marker) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn exit_codes_signals_and_separate_streams() {
        let (_t, d) = desk();
        let c = run(&d, sh("printf out; printf err >&2; exit 3"))
            .await
            .unwrap();
        assert_eq!((c.stdout.as_str(), c.stderr.as_str()), ("out", "err"));
        assert_eq!(
            (c.exit.code, c.exit.signal, c.exit.timed_out, c.exit.killed),
            (3, None, false, false)
        );
        assert_eq!((c.exit.stdout_bytes, c.exit.stderr_bytes), (3, 3));
        let c = run(&d, sh("kill -TERM $$")).await.unwrap();
        assert_eq!((c.exit.code, c.exit.signal), (143, Some(15)));
        // argv, no shell: the argument is one word, `$HOME` stays as it is
        let argv = ExecRequest {
            command: vec!["echo".into(), "a  b".into(), "$HOME".into()],
            ..ExecRequest::default()
        };
        let c = run(&d, argv).await.unwrap();
        assert_eq!((c.stdout.as_str(), c.exit.code), ("a  b $HOME\n", 0));
        let c = run(&d, sh("no-such-program-xyz")).await.unwrap();
        assert_eq!(c.exit.code, 127);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_timeout_kills_the_whole_tree_and_says_so() {
        let (_t, d) = desk();
        let marker = format!("{}.{}", 2000, std::process::id());
        // a grandchild in its own session, ignoring TERM and HUP, holding no pipe
        let script = format!(
            "setsid sh -c 'trap \"\" TERM HUP; exec sleep {marker}' </dev/null >/dev/null 2>&1 & echo started; exec sleep 1000"
        );
        let started = Instant::now();
        let req = ExecRequest {
            timeout_secs: Some(1),
            ..sh(&script)
        };
        let c = tokio::time::timeout(Duration::from_secs(20), run(&d, req))
            .await
            .expect("the timeout did not end the command")
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
        assert_eq!(c.stdout, "started\n");
        assert!(c.exit.timed_out && c.exit.killed, "{:?}", c.exit);
        assert_eq!((c.exit.code, c.exit.signal), (137, Some(9)));
        assert!(c.exit.duration_ms >= 1000, "{:?}", c.exit);
        assert!(gone(&marker).await, "sleep {marker} outlived the timeout");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn output_arrives_while_the_command_runs() {
        let (_t, d) = desk();
        // prints, then waits (bounded) for a file only this test makes after reading it
        let req = ExecRequest {
            timeout_secs: Some(60),
            ..sh("echo ready; i=0; while [ ! -e /desk/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; echo done")
        };
        let mut s = start(&d, &ExecHost::new(), req, Via::Http).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(20), s.next())
            .await
            .unwrap();
        assert!(
            matches!(&first, Some(ExecEvent::Stdout(b)) if b == b"ready\n"),
            "{first:?}"
        );
        assert!(!d.dir().join("go").exists());
        std::fs::write(d.dir().join("go"), b"").unwrap();
        let mut rest = Vec::new();
        while let Some(ev) = s.next().await {
            rest.push(ev);
        }
        assert!(
            matches!(&rest[0], ExecEvent::Stdout(b) if b == b"done\n"),
            "{rest:?}"
        );
        assert!(
            matches!(&rest[1], ExecEvent::Exit(x) if x.code == 0 && !x.timed_out),
            "{rest:?}"
        );
        assert_eq!(rest.len(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn dropping_the_stream_kills_the_command() {
        let (_t, d) = desk();
        let marker = format!("{}.{}", 2001, std::process::id());
        let host = ExecHost::new();
        let mut s = start(
            &d,
            &host,
            sh(&format!("echo started; exec sleep {marker}")),
            Via::Http,
        )
        .await
        .unwrap();
        assert!(matches!(s.next().await, Some(ExecEvent::Stdout(_))));
        assert!(started(&marker).await);
        assert_eq!(host.running("alice"), 1);
        drop(s);
        assert!(gone(&marker).await, "sleep {marker} outlived its client");
        for _ in 0..250 {
            if host.running("alice") == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(host.running("alice"), 0);
    }

    /// A host that journals, with changes "unknown" (no mount daemon in unit tests; the
    /// changes themselves are proven by tests/e2e/99-journal.sh on a real mount).
    fn journaling() -> ExecHost {
        ExecHost::new().with_journal(Arc::new(|_: &Desk| {
            deskfs_desk::journal::ChangeWatch::unknown("unit test")
        }))
    }

    async fn exit_of(s: &mut ExecStream) -> ExitInfo {
        while let Some(ev) = s.next().await {
            if let ExecEvent::Exit(x) = ev {
                return x;
            }
        }
        panic!("no exit event");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn every_run_is_in_the_journal_before_its_exit_is_reported() {
        use deskfs_desk::journal;
        let (_t, d) = desk();
        let host = journaling();
        let c = collect(
            &d,
            &host,
            sh("echo out; echo err >&2; exit 3"),
            COLLECT_CAP,
            Via::Mcp,
        )
        .await
        .unwrap();
        let id = c
            .exit
            .journal_id
            .clone()
            .expect("no journal id in the exit");
        let e = journal::read(&d, Some(journal::DESK_JOURNAL), 10).unwrap();
        assert_eq!(e.len(), 1, "{e:?}");
        let e = &e[0];
        assert_eq!(e.id, id);
        assert_eq!(
            (e.via.as_str(), e.cwd.as_str(), e.task.as_deref()),
            ("mcp", "", None)
        );
        assert_eq!(e.command, ["sh", "-c", "echo out; echo err >&2; exit 3"]);
        assert_eq!(
            (e.exit_code, e.signal, e.killed, e.timed_out),
            (Some(3), None, false, false)
        );
        assert_eq!((e.stdout_bytes, e.stderr_bytes), (Some(4), Some(4)));
        let out = e.output.as_deref().unwrap();
        assert!(out == "out\nerr\n" || out == "err\nout\n", "{out:?}");
        assert_eq!(e.changes_unknown.as_deref(), Some("unit test"));

        // A run in a task's worktree goes to that task's journal, with its cwd.
        let req = ExecRequest {
            command: vec!["true".into()],
            cwd: Some("tasks/t1".into()),
            ..ExecRequest::default()
        };
        collect(&d, &host, req, COLLECT_CAP, Via::Http)
            .await
            .unwrap();
        let t = journal::read(&d, Some("t1"), 10).unwrap();
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(
            (t[0].via.as_str(), t[0].cwd.as_str(), t[0].task.as_deref()),
            ("http", "tasks/t1", Some("t1"))
        );

        // A command that never ran (refused before it started) is not recorded; a host
        // without a journal records nothing.
        let bad = ExecRequest {
            command: vec!["true".into()],
            cwd: Some("nope".into()),
            ..ExecRequest::default()
        };
        assert!(collect(&d, &host, bad, COLLECT_CAP, Via::Http)
            .await
            .is_err());
        collect(&d, &ExecHost::new(), sh("true"), COLLECT_CAP, Via::Http)
            .await
            .unwrap();
        assert_eq!(journal::read(&d, None, 100).unwrap().len(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn what_the_sandbox_makes_on_the_desk_is_made_before_the_watch() {
        let (_t, d) = desk();
        let _ = std::fs::remove_dir_all(d.dir().join(".cache"));
        let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = seen.clone();
        let host = ExecHost::new().with_journal(Arc::new(move |d: &Desk| {
            s2.store(
                d.dir().join(".cache").is_dir(),
                std::sync::atomic::Ordering::SeqCst,
            );
            deskfs_desk::journal::ChangeWatch::unknown("unit test")
        }));
        collect(&d, &host, sh("true"), COLLECT_CAP, Via::Http)
            .await
            .unwrap();
        assert!(
            seen.load(std::sync::atomic::Ordering::SeqCst),
            "the watch began before the sandbox's cache directories were made"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn killed_runs_are_journaled_as_killed() {
        use deskfs_desk::journal;
        let (_t, d) = desk();
        let host = journaling();
        // Its timeout passes.
        let mut req = sh("echo started; exec sleep 1000");
        req.timeout_secs = Some(1);
        let mut s = start(&d, &host, req, Via::Http).await.unwrap();
        let x = exit_of(&mut s).await;
        assert!(x.timed_out && x.killed, "{x:?}");
        let e = journal::read(&d, None, 10).unwrap();
        assert!(
            e[0].timed_out && e[0].killed && e[0].status_text() == "timeout",
            "{e:?}"
        );
        assert_eq!(e[0].output.as_deref(), Some("started\n"));
        // Its client goes away: the entry is written after the kill, with no one to tell.
        let mut s = start(&d, &host, sh("echo started; exec sleep 1000"), Via::Http)
            .await
            .unwrap();
        assert!(matches!(s.next().await, Some(ExecEvent::Stdout(_))));
        drop(s);
        let mut e = Vec::new();
        for _ in 0..500 {
            e = journal::read(&d, None, 10).unwrap();
            if e.len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(e.len(), 2, "the killed run is not in the journal: {e:?}");
        assert!(
            e[1].killed && !e[1].timed_out && e[1].signal == Some(9),
            "{:?}",
            e[1]
        );
        assert_eq!(e[1].status_text(), "killed");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn commands_past_the_limit_are_refused_before_they_start() {
        let (_t, d) = desk();
        let host = ExecHost::new().with_limit(2);
        let mut a = start(&d, &host, sh("echo a; exec sleep 1000"), Via::Http)
            .await
            .unwrap();
        let mut b = start(&d, &host, sh("echo b; exec sleep 1000"), Via::Http)
            .await
            .unwrap();
        let e = start(&d, &host, sh("touch /desk/third"), Via::Http)
            .await
            .expect_err("a third command past the limit of 2");
        assert_eq!((e.code, e.code.status()), (Code::TooManyCommands, 429));
        assert!(e.message.contains("--max-commands"), "{}", e.message);
        assert!(!d.dir().join("third").exists(), "the refused command ran");
        // The slot comes back when a command has ended (here: killed by its client).
        assert!(matches!(a.next().await, Some(ExecEvent::Stdout(_))));
        drop(a);
        let mut c = None;
        for _ in 0..500 {
            match start(&d, &host, sh("echo c"), Via::Http).await {
                Ok(s) => {
                    c = Some(s);
                    break;
                }
                Err(e) if e.code == Code::TooManyCommands => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
        let mut c = c.expect("no slot came back after a command ended");
        assert_eq!(exit_of(&mut c).await.code, 0);
        assert!(matches!(b.next().await, Some(ExecEvent::Stdout(_))));
        drop(b);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_server_shutting_down_kills_its_commands() {
        let (_t, d) = desk();
        let host = ExecHost::new();
        let mut s = start(&d, &host, sh("echo started; exec sleep 1000"), Via::Http)
            .await
            .unwrap();
        assert!(matches!(s.next().await, Some(ExecEvent::Stdout(_))));
        host.kill_all();
        let end = tokio::time::timeout(Duration::from_secs(20), s.next())
            .await
            .expect("the command outlived kill_all");
        assert!(
            matches!(&end, Some(ExecEvent::Exit(x)) if x.killed && !x.timed_out),
            "{end:?}"
        );
        assert_eq!(host.running("alice"), 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_server_stopping_journals_the_commands_it_killed() {
        let (_t, d) = desk();
        let host = journaling();
        // The client keeps no stream: nothing but the drain waits for the entry.
        let mut s = start(&d, &host, sh("echo started; exec sleep 1000"), Via::Mcp)
            .await
            .unwrap();
        assert!(matches!(s.next().await, Some(ExecEvent::Stdout(_))));
        host.kill_all();
        assert!(host.drain(Duration::from_secs(20)).await, "not drained");
        let e = deskfs_desk::journal::read(&d, None, 10).unwrap();
        assert!(e.len() == 1 && e[0].killed && e[0].via == "mcp", "{e:?}");
        drop(s);
        assert!(
            host.drain(Duration::from_secs(1)).await,
            "an idle host drains at once"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn environment_is_checked_and_passed() {
        let (_t, d) = desk();
        let host = ExecHost::new().with_env(vec![
            ("GIT_AUTHOR_NAME".into(), "srv".into()),
            ("A".into(), "base".into()),
        ]);
        let mut req = sh("echo $GIT_AUTHOR_NAME $A $FOO");
        req.env.insert("FOO".into(), "bar".into());
        req.env.insert("A".into(), "mine".into());
        let c = collect(&d, &host, req, COLLECT_CAP, Via::Http)
            .await
            .unwrap();
        assert_eq!(c.stdout, "srv mine bar\n");
        for name in [
            "AWS_SECRET_ACCESS_KEY",
            "aws_x",
            "DESKFS_HOME",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "AZURE_X",
            "GCLOUD_X",
            "",
            "A=B",
        ] {
            let mut req = sh("true");
            req.env.insert(name.into(), "x".into());
            let e = run(&d, req).await.unwrap_err();
            assert_eq!(e.code, Code::BadRequest, "{name}: {e}");
        }
        let mut req = sh("true");
        req.env.insert("X".into(), "a\0b".into());
        assert_eq!(run(&d, req).await.unwrap_err().code, Code::BadRequest);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn cwd_stays_in_the_desk() {
        let (_t, d) = desk();
        let at = |cwd: &str| ExecRequest {
            cwd: Some(cwd.into()),
            ..sh("pwd")
        };
        assert_eq!(
            run(&d, at("tasks/t1")).await.unwrap().stdout,
            "/desk/tasks/t1\n"
        );
        assert_eq!(run(&d, at("")).await.unwrap().stdout, "/desk\n");
        for (cwd, code) in [
            ("..", Code::OutsideDesk),
            ("../alice", Code::OutsideDesk),
            ("/etc", Code::OutsideDesk),
            ("tasks/../..", Code::OutsideDesk),
            ("out", Code::NotDir),
            ("out/x", Code::OutsideDesk),
            ("nope", Code::NotFound),
            ("AGENTS.md", Code::NotDir),
            ("a\0b", Code::BadPath),
        ] {
            let e = run(&d, at(cwd)).await.unwrap_err();
            assert_eq!(e.code, code, "cwd {cwd:?}: {e}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn bad_requests_are_refused_before_anything_runs() {
        let (_t, d) = desk();
        let both = ExecRequest {
            command: vec!["true".into()],
            ..sh("true")
        };
        for req in [
            ExecRequest::default(),
            both,
            sh("  "),
            ExecRequest {
                command: vec!["".into()],
                ..ExecRequest::default()
            },
            ExecRequest {
                timeout_secs: Some(0),
                ..sh("true")
            },
            ExecRequest {
                timeout_secs: Some(MAX_TIMEOUT_SECS + 1),
                ..sh("true")
            },
        ] {
            let shown = format!("{req:?}");
            assert_eq!(
                run(&d, req).await.unwrap_err().code,
                Code::BadRequest,
                "{shown}"
            );
        }
        let json: std::result::Result<ExecRequest, _> =
            serde_json::from_str(r#"{"command": ["x"], "tmeout_secs": 3}"#);
        assert!(json.is_err(), "unknown fields are refused");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn collected_output_is_capped_and_binary_is_kept_in_stream_chunks() {
        let (_t, d) = desk();
        let c = collect(
            &d,
            &ExecHost::new(),
            sh("head -c 100000 /dev/zero | tr '\\0' x; echo; echo tail-line"),
            1000,
            Via::Http,
        )
        .await
        .unwrap();
        assert!(
            c.stdout_truncated && c.stdout.ends_with("tail-line\n") && c.stdout.len() < 1100,
            "{}",
            c.stdout.len()
        );
        assert_eq!(c.exit.stdout_bytes, 100011);
        let mut s = start(&d, &ExecHost::new(), sh("printf '\\377\\376'"), Via::Http)
            .await
            .unwrap();
        let mut bytes = Vec::new();
        while let Some(ev) = s.next().await {
            if let ExecEvent::Stdout(b) = ev {
                bytes.extend(b);
            }
        }
        assert_eq!(bytes, vec![0xff, 0xfe]);
    }

    /// One HTTP/1.1 request to `addr` over a raw socket; returns the socket after the
    /// request is sent (the test reads the reply as it comes).
    async fn send(
        addr: &str,
        method: &str,
        path: &str,
        token: &str,
        body: &str,
    ) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).await.unwrap();
        c
    }

    /// Reads from `c` until the text read so far contains `want` (or the reply ends).
    async fn read_until(c: &mut tokio::net::TcpStream, seen: &mut String, want: &str) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while !seen.contains(want) {
            match tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                _ => return false,
            }
        }
        true
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn http_exec_streams_events_and_refuses_read_only_tokens() {
        use crate::tokens::{Scope, TokenStore};
        let (t, d) = desk();
        let root = t.path().join("desks");
        let store = TokenStore::at(&root);
        let (rw, _) = store
            .create("alice", Some(d.meta().created), Scope::ReadWrite, None)
            .unwrap();
        let (ro, _) = store
            .create("alice", Some(d.meta().created), Scope::ReadOnly, None)
            .unwrap();
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let app = crate::api::App::new(&root);
        let server = tokio::spawn(crate::serve_app(
            app,
            crate::Listen::Tcp("127.0.0.1:0".parse().unwrap()),
            move |a| {
                let _ = addr_tx.send(a);
            },
            async move {
                let _ = stop_rx.await;
            },
        ));
        let base = addr_rx.await.unwrap();
        let addr = base.trim_start_matches("http://").to_owned();
        let body = r#"{"shell": "echo ready; i=0; while [ ! -e /desk/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; echo done >&2; exit 3"}"#;
        let mut c = send(&addr, "POST", "/v1/desks/alice/exec", &rw, body).await;
        let mut seen = String::new();
        assert!(read_until(&mut c, &mut seen, "ready").await, "{seen}");
        assert!(
            seen.starts_with("HTTP/1.1 200") && seen.contains("text/event-stream"),
            "{seen}"
        );
        assert!(
            seen.contains("event: stdout\ndata: {\"text\":\"ready\\n\"}"),
            "{seen}"
        );
        assert!(!seen.contains("event: exit"), "{seen}");
        std::fs::write(d.dir().join("go"), b"").unwrap();
        assert!(read_until(&mut c, &mut seen, "event: exit").await, "{seen}");
        assert!(read_until(&mut c, &mut seen, "\n\n").await, "{seen}");
        assert!(
            seen.contains("event: stderr\ndata: {\"text\":\"done\\n\"}"),
            "{seen}"
        );
        assert!(seen.contains("\"code\":3"), "{seen}");
        // a read-only token runs nothing
        let mut c = send(
            &addr,
            "POST",
            "/v1/desks/alice/exec",
            &ro,
            r#"{"shell": "touch /desk/ro"}"#,
        )
        .await;
        let mut seen = String::new();
        read_until(&mut c, &mut seen, "\u{0}").await;
        assert!(
            seen.starts_with("HTTP/1.1 403") && seen.contains("read_only_token"),
            "{seen}"
        );
        assert!(!d.dir().join("ro").exists());
        // errors before the stream are JSON
        let mut c = send(
            &addr,
            "POST",
            "/v1/desks/alice/exec",
            &rw,
            r#"{"shell": "true", "cwd": "../x"}"#,
        )
        .await;
        let mut seen = String::new();
        read_until(&mut c, &mut seen, "\u{0}").await;
        assert!(
            seen.starts_with("HTTP/1.1 403") && seen.contains("outside_desk"),
            "{seen}"
        );
        // the status: the desk, no host path
        let mut c = send(&addr, "GET", "/v1/desks/alice/status", &ro, "").await;
        let mut seen = String::new();
        read_until(&mut c, &mut seen, "\u{0}").await;
        assert!(
            seen.starts_with("HTTP/1.1 200") && seen.contains("\"agent\":\"alice\""),
            "{seen}"
        );
        assert!(
            seen.contains("\"usage\"") && seen.contains("\"workspace\":null"),
            "{seen}"
        );
        assert!(
            !seen.contains(&t.path().display().to_string()),
            "a host path: {seen}"
        );
        let _ = stop_tx.send(());
        let _ = server.await;
    }
}
