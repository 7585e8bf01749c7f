//! `deskfs exec`: a command run against a desk inside a bubblewrap sandbox.
//!
//! The command sees the desk read-write at [`DESK_MOUNT`] (`/desk`) except the desk's
//! own records, `/desk/.desk` (task records, the task journal, locks), which are
//! read-only (`EROFS`; renaming `/desk/.desk` itself is `EBUSY`), the system
//! directories read-only, a fresh `/tmp`, its own `/proc` and a minimal `/dev`, and
//! nothing else of the host: no other desk, no deskfs data directory (workspace configs
//! with bucket keys, metadata databases, caches), no home directories. The environment is
//! built from scratch (see [`command`] for the list); cloud credentials never enter. It runs
//! with the caller's uid but no capabilities, in its own pid, ipc, uts (and, with
//! [`Net::None`], network) namespaces, and dies with its caller.
//!
//! ```no_run
//! use deskfs_sandbox::{run, SandboxSpec};
//! let spec = SandboxSpec::new("/mnt/ws/desks/alice");
//! let code = run(&spec, &["cargo".into(), "test".into()])?;
//! std::process::exit(code);
//! # Ok::<(), deskfs_sandbox::SandboxError>(())
//! ```
//!
//! The layout in detail is in the `layout` module; why `--new-session` is used only
//! without a terminal, in `build`.

mod build;
mod env;
mod error;
mod fds;
mod host;
mod layout;
mod locate;
mod piped;
mod run;
mod seccomp;
mod signals;

use std::ffi::OsString;
use std::path::PathBuf;

pub use error::SandboxError;
pub use locate::find_bwrap_in;
pub use piped::{Ended, Killer, Piped};

/// Where the desk appears inside the sandbox.
pub const DESK_MOUNT: &str = "/desk";

/// Network access of the sandboxed command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Net {
    /// The host's network (`--net host`, the default). Note that this includes the
    /// host's loopback services and abstract Unix sockets.
    #[default]
    Host,
    /// No network: a private network namespace with only `lo` (`--net none`).
    None,
}

/// What to run against: the desk, the working directory inside, network, extra
/// environment and extra host paths to hide.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxSpec {
    /// Host path of the desk (absolute; symlinks are resolved); bound read-write at
    /// [`DESK_MOUNT`], its `.desk` read-only over `/desk/.desk`. Must exist.
    pub desk_dir: PathBuf,
    /// Working directory INSIDE the sandbox: [`DESK_MOUNT`] or a path under it (e.g.
    /// `/desk/tasks/T`), absolute, without `..`; must exist on the desk.
    pub workdir: PathBuf,
    /// Network access.
    pub net: Net,
    /// Extra variables set inside, after (and overriding) the defaults. Names must be
    /// non-empty without `=`; `AWS_*`, `GOOGLE_*`, `GCLOUD_*`, `AZURE_*` and `DESKFS_*`
    /// are refused.
    pub env: Vec<(OsString, OsString)>,
    /// Extra host paths that must not be visible. Only paths that would show through a
    /// read-only system bind (`/usr`, `/etc`, `/opt`, ...) or the desk need this; they are
    /// covered by an empty read-only tmpfs (directories) or `/dev/null` (files). Paths that
    /// do not exist are ignored. The caller's deskfs data directory and the desk's parent
    /// (the other desks) are always hidden.
    pub hide: Vec<PathBuf>,
}

impl SandboxSpec {
    /// A spec for the desk at `desk_dir`: working directory `/desk`, host network, no
    /// extra environment, nothing extra hidden.
    pub fn new(desk_dir: impl Into<PathBuf>) -> Self {
        SandboxSpec {
            desk_dir: desk_dir.into(),
            workdir: PathBuf::from(DESK_MOUNT),
            net: Net::Host,
            env: Vec::new(),
            hide: Vec::new(),
        }
    }
}

/// The path of the `bwrap` binary on the caller's PATH.
///
/// # Errors
/// [`SandboxError::BwrapMissing`] ("bubblewrap (bwrap) is not installed: apt-get install
/// -y bubblewrap") when there is none.
pub fn check_bwrap() -> Result<PathBuf, SandboxError> {
    find_bwrap_in(std::env::var_os("PATH").as_deref())
}

/// The bwrap command that runs `argv` (program and arguments, looked up on the sandbox's
/// PATH) in the sandbox described by `spec`; not started. stdin, stdout and stderr are
/// inherited unless the caller changes them; bwrap exits with the command's exit code, or
/// 128 + signal when a signal killed it, or 127 when the program does not exist. The
/// command is started through `/usr/bin/env --default-signal=INT,QUIT --` where the
/// system's env supports it (so Ctrl-C at a terminal reaches the command, not bwrap).
///
/// Environment inside: `PATH=/desk/tools/bin[:<toolchain>]:/usr/local/sbin:/usr/local/bin:
/// /usr/sbin:/usr/bin:/sbin:/bin`, `HOME=DESK=/desk`, `TMPDIR=/tmp`, caches on the desk
/// (`XDG_CACHE_HOME=/desk/.cache`, `CARGO_HOME`, `npm_config_cache`, `PIP_CACHE_DIR`,
/// `UV_CACHE_DIR` under it, `GOPATH=/desk/.cache/go`), installs into the desk's tools
/// (`CARGO_INSTALL_ROOT=npm_config_prefix=/desk/tools`, `GOBIN=/desk/tools/bin`), the
/// caller's `TERM`, `COLORTERM`, `LANG` (default `C.UTF-8`) and `LC_ALL`, its proxy
/// variables with [`Net::Host`], `RUSTUP_HOME` when the host's Rust toolchain is offered
/// (read-only at `/toolchain`, see the layout), then [`SandboxSpec::env`].
///
/// Side effect: creates the desk's cache directories (`.cache/{cargo,npm,pip,uv,go}`)
/// and its `.desk` directory when missing (bound read-only inside).
/// Spawn it from a thread that outlives the command: bwrap's `--die-with-parent` fires
/// when the spawning thread exits.
///
/// # Errors
/// [`SandboxError::BwrapMissing`], [`SandboxError::EmptyCommand`],
/// [`SandboxError::DeskMissing`], [`SandboxError::BadWorkdir`],
/// [`SandboxError::WorkdirMissing`], [`SandboxError::BadEnvName`],
/// [`SandboxError::ForbiddenEnv`], [`SandboxError::Io`] (cache directories, seccomp memfd;
/// the desk's `.desk` is a symlink or not a directory: refused, never bound).
pub fn command(
    spec: &SandboxSpec,
    argv: &[OsString],
) -> Result<std::process::Command, SandboxError> {
    let bwrap = check_bwrap()?;
    build::build(spec, argv, &host::Host::current(), &bwrap, None)
}

/// Runs `argv` in the sandbox (see [`command`]) with stdin, stdout and stderr inherited,
/// waits for it and returns its exit code: the command's own, 128 + signal when a signal
/// killed it, 127 when the program does not exist (like a shell). While it runs with a terminal attached, this process
/// ignores SIGINT and SIGQUIT (the command receives them from the terminal itself).
///
/// # Errors
/// Those of [`command`], [`SandboxError::Spawn`] when bwrap cannot be started, and
/// [`SandboxError::Setup`] when bwrap fails before starting the command (its own message
/// is on stderr). A command that starts and fails is not an error.
pub fn run(spec: &SandboxSpec, argv: &[OsString]) -> Result<i32, SandboxError> {
    run::run(spec, argv)
}

/// Makes what every sandbox of the desk at `desk_dir` needs there (`.desk/`, the tool
/// cache directories under `.cache/`), as starting one does. A caller that watches the
/// desk's changes (the task journal) calls it before it starts watching, so these are
/// never counted as the command's own. Idempotent.
///
/// # Errors
/// [`SandboxError::DeskMissing`]; [`SandboxError::Io`] when `.desk` is not a directory
/// or a directory cannot be made.
pub fn prepare_desk(desk_dir: &std::path::Path) -> Result<(), SandboxError> {
    let desk = std::fs::canonicalize(desk_dir)
        .ok()
        .filter(|d| d.is_dir())
        .ok_or_else(|| SandboxError::DeskMissing {
            path: desk_dir.to_path_buf(),
        })?;
    build::prepare_desk(&desk)
}

/// Starts `argv` in the sandbox (see [`command`]) with stdin `/dev/null` and stdout and
/// stderr piped to the caller, and returns at once. No terminal reaches the command (it
/// runs in a session of its own). bwrap is spawned and waited for by a thread of its own,
/// so the caller's threads may come and go; [`Piped::killer`] kills the command and
/// every process it started (the sandbox's pid namespace ends), and dropping the
/// [`Piped`] without [`Piped::wait`] does the same.
///
/// # Errors
/// Those of [`command`], [`SandboxError::Spawn`] when bwrap cannot be started, and
/// [`SandboxError::Io`] (the status pipe, the thread). A sandbox that fails to set up is
/// reported by [`Piped::wait`] ([`SandboxError::Setup`]).
pub fn spawn_piped(spec: &SandboxSpec, argv: &[OsString]) -> Result<Piped, SandboxError> {
    piped::spawn_piped(spec, argv)
}
