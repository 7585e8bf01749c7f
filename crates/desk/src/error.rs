//! The error type of the desk layer. Every message is one line that names the problem and,
//! where there is one, the fix.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = DeskError> = std::result::Result<T, E>;

/// Everything that can go wrong in a desk operation.
#[derive(Debug, thiserror::Error)]
pub enum DeskError {
    /// An agent name outside `[A-Za-z0-9._-]{1,64}` (or starting with `.`/`-`).
    #[error("invalid agent name {name:?}: use 1-64 letters, digits, '.', '_' or '-' (not starting with '.' or '-')")]
    InvalidAgent {
        /// The rejected name.
        name: String,
    },
    /// A task or branch name git would refuse, or a task name that is not one path component.
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// `"task"`, `"branch"` or `"repo"`.
        what: &'static str,
        /// The rejected name.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// No desk of that agent under the root.
    #[error("no desk for agent {agent:?} in {} ({}); create it with `deskfs desk create {agent}`", root.display(), list_or_none(known, "desks"))]
    UnknownAgent {
        /// The agent asked for.
        agent: String,
        /// The desk root searched.
        root: PathBuf,
        /// Agents that do have a desk there.
        known: Vec<String>,
    },
    /// `desk create` of an agent that already has a desk (or something else at its path).
    #[error("desk {agent:?} already exists at {}; pick another agent name or remove it with `deskfs desk rm {agent}`", path.display())]
    DeskExists {
        /// The agent.
        agent: String,
        /// The existing path.
        path: PathBuf,
    },
    /// A directory that is not a desk (no valid `desk.toml`).
    #[error("{} is not a desk ({reason}); desks are made with `deskfs desk create`", path.display())]
    NotADesk {
        /// The directory.
        path: PathBuf,
        /// What is missing or wrong.
        reason: String,
    },
    /// No task of that name on the desk.
    #[error("no task {task:?} on desk {agent:?} ({}); start it with `deskfs task start {agent} {task} --repo NAME`", list_or_none(known, "tasks"))]
    UnknownTask {
        /// The agent.
        agent: String,
        /// The task asked for.
        task: String,
        /// Tasks that exist.
        known: Vec<String>,
    },
    /// `task start` of a task that exists already.
    #[error("task {task:?} already exists at {}; finish it first (`deskfs task finish {agent} {task}`) or pick another name", path.display())]
    TaskExists {
        /// The agent.
        agent: String,
        /// The task.
        task: String,
        /// Its directory.
        path: PathBuf,
    },
    /// Another process holds the task's lock (a concurrent start or finish).
    #[error("task {task:?} is busy: another deskfs process is starting or finishing it ({holder}); wait for it or pick another task name")]
    TaskBusy {
        /// The task.
        task: String,
        /// Who holds the lock, as far as known (`pid N` or `unknown holder`).
        holder: String,
    },
    /// A lock that stayed busy for too long.
    #[error("{what} {} is still locked after {secs} s ({holder}); retry when the other deskfs command has finished", path.display())]
    LockTimeout {
        /// What the lock protects.
        what: &'static str,
        /// The lock file.
        path: PathBuf,
        /// How long we waited, seconds.
        secs: u64,
        /// Who holds it, as far as known.
        holder: String,
    },
    /// No repo of that name under `repos/`.
    #[error("no repo {repo:?} in {} ({}); clone it there first, e.g. `git clone URL {}`", dir.display(), list_or_none(known, "repos"), dir.join(repo).display())]
    UnknownRepo {
        /// The repo asked for.
        repo: String,
        /// The `repos/` directory.
        dir: PathBuf,
        /// Repos that exist.
        known: Vec<String>,
    },
    /// `repos/NAME` (or its `.git`) is a symlink or its git directory resolves outside the
    /// desk: deskfs refuses to act on it, so nothing outside the desk is changed.
    #[error("refusing to act on repo {repo:?}: {reason}; replace {} with a real clone on the desk (e.g. `git clone URL {}`)", path.display(), path.display())]
    UnsafeRepo {
        /// The repo name.
        repo: String,
        /// `repos/NAME`.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `repos/NAME` exists but git does not see a repository there.
    #[error("{} is not a git repository ({reason}); clone or `git init` it, or pick another --repo", path.display())]
    NotARepo {
        /// The directory.
        path: PathBuf,
        /// What git said.
        reason: String,
    },
    /// `task finish` would drop uncommitted work.
    #[error("task {task:?} has {count} uncommitted or untracked file(s) ({sample}); commit them in {} or pass --discard to drop them", path.display())]
    Uncommitted {
        /// The task.
        task: String,
        /// Its worktree.
        path: PathBuf,
        /// Number of changed or untracked (non-ignored) entries.
        count: usize,
        /// The first few paths.
        sample: String,
    },
    /// A task directory that is not a working git worktree.
    #[error("task {task:?} at {} is not a valid git worktree ({reason}); `deskfs resume` shows the details, `deskfs desk tidy` removes leftovers", path.display())]
    BrokenTask {
        /// The task.
        task: String,
        /// Its directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A git command failed.
    #[error("git {args} (in {}) failed: {message}", dir.display())]
    Git {
        /// The arguments, space-joined.
        args: String,
        /// Where it ran.
        dir: PathBuf,
        /// Its stderr (first lines) or exit status.
        message: String,
    },
    /// `git` could not be run at all.
    #[error("cannot run git: {0}; install git (Debian: apt-get install git)")]
    NoGit(#[source] std::io::Error),
    /// AGENTS.md exists but its machine part cannot be read.
    #[error("manual {} is malformed: {reason}; fix the block between the deskfs:manual markers", path.display())]
    Manual {
        /// The manual file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tool's version command failed while recording it.
    #[error("version command {cmd:?} of tool {tool:?} failed: {reason}; install the tool (into tools/bin or the system) or pass the right --version-cmd")]
    VersionCmd {
        /// The tool.
        tool: String,
        /// The command.
        cmd: String,
        /// Exit status and output.
        reason: String,
    },
    /// A record (`desk.toml`, a task record) could not be encoded as TOML.
    #[error("cannot encode {}: {reason}", path.display())]
    Encode {
        /// The file it was meant for.
        path: PathBuf,
        /// The encoder's message.
        reason: String,
    },
    /// Any other I/O failure, with the operation and path it concerns.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done (`"create"`, `"read"`, ...).
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl DeskError {
    /// An [`DeskError::Io`] for `op` on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> DeskError {
        DeskError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// `known: a, b, c` or `no WHAT yet`.
fn list_or_none(v: &[String], what: &str) -> String {
    if v.is_empty() {
        format!("no {what} yet")
    } else {
        format!("known: {}", v.join(", "))
    }
}

/// Adds the `.map_err(io(op, path))` shorthand to `io::Result`.
pub(crate) trait IoContext<T> {
    /// Maps an I/O error to [`DeskError::Io`].
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| DeskError::io(op, path, e))
    }
}
