//! Task worktrees and how their links stay valid wherever the desk is mounted.
//!
//! A linked worktree has two links: `tasks/T/.git` (a file `gitdir: PATH` naming its admin
//! dir `repos/R/.git/worktrees/ID`) and the back link `repos/R/.git/worktrees/ID/gitdir`
//! (the path of `tasks/T/.git`). Git up to 2.47 writes both as absolute paths, so a desk
//! seen at another path (a second mount point, another machine, `/desk` inside `deskfs
//! exec`) has links into the old location.
//!
//! Decision, checked by experiment with git 2.47.3 (desk copied/moved, and mounted at two
//! mount points in `tests/e2e/66-desk-session.sh`):
//!
//! * `tasks/T/.git` is rewritten to a **relative** path right after `worktree add`. Every
//!   git version resolves a relative `gitdir:` against the directory of the `.git` file, so
//!   status, diff, commit, log, push in the task work at any path.
//! * The back link stays **absolute**: git 2.47 resolves a relative back link against the
//!   current directory, so `git worktree prune` run in the repo deleted the registration of
//!   a healthy worktree and `git worktree list` showed it as prunable (tried: a relative
//!   back link `../../../../tasks/T/.git`). Instead every deskfs command that touches the
//!   desk rewrites a back link that does not name the current location (`repair`; it is
//!   what `git worktree repair` run in the task does, minus a process per task).
//! * Every task worktree is **locked** (`git worktree add --lock`, reason "deskfs task").
//!   `git worktree prune` (and `git gc`) never drop a locked worktree, so a back link that
//!   is stale because the desk is seen elsewhere (e.g. inside exec, where `/desk` is not
//!   the host path) cannot lose the registration. `task finish` unlocks before removing.
//!   In that state `git worktree list` still works and shows the last repaired path.
//! * With git >= 2.48, `worktree add --relative-paths` writes both links relative (and
//!   sets the repo's `extensions.relativeWorktrees`, which git < 2.48 refuses); then the
//!   back link is relative and `repair` leaves it alone.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{DeskError, IoContext, Result};
use crate::fsutil::relative_path;
use crate::git;

/// Lock reason written into `worktrees/ID/locked`.
pub const LOCK_REASON: &str = "deskfs task: finish with `deskfs task finish`";

/// What a task directory is, git-wise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// A linked worktree with its admin dir in place.
    Ok {
        /// `repos/R/.git/worktrees/ID` (canonical).
        admin: PathBuf,
        /// The repo's working directory (`repos/R`).
        repo: PathBuf,
    },
    /// No `.git` file: a start that died before git wrote it, or not a worktree at all.
    NoDotGit,
    /// `.git` exists but is not a `gitdir:` file.
    BadDotGit(String),
    /// `.git` names an admin dir that does not exist (the registration was removed).
    MissingRegistration(PathBuf),
}

fn dotgit_target(task_dir: &Path) -> Result<Option<String>, String> {
    let p = task_dir.join(".git");
    let md = match fs::symlink_metadata(&p) {
        Ok(md) => md,
        Err(_) => return Ok(None),
    };
    if !md.is_file() {
        return Err(".git is not a file (a clone, not a worktree?)".into());
    }
    let text = fs::read_to_string(&p).map_err(|e| format!("cannot read .git: {e}"))?;
    text.trim_end()
        .strip_prefix("gitdir: ")
        .map(|s| Some(s.to_owned()))
        .ok_or_else(|| ".git does not start with 'gitdir: '".into())
}

/// Checks a task directory (see [`Health`]).
pub fn health(task_dir: &Path) -> Health {
    let target = match dotgit_target(task_dir) {
        Ok(None) => return Health::NoDotGit,
        Ok(Some(t)) => t,
        Err(e) => return Health::BadDotGit(e),
    };
    let admin = task_dir.join(&target);
    let Ok(admin) = fs::canonicalize(&admin) else {
        return Health::MissingRegistration(admin);
    };
    if !admin.join("HEAD").is_file() {
        return Health::MissingRegistration(admin);
    }
    let common = fs::read_to_string(admin.join("commondir"))
        .map(|c| admin.join(c.trim_end()))
        .unwrap_or_else(|_| admin.join("../.."));
    let common = fs::canonicalize(&common).unwrap_or(common);
    let repo = if common.file_name().is_some_and(|n| n == ".git") {
        common.parent().map(Path::to_path_buf).unwrap_or(common)
    } else {
        common
    };
    Health::Ok { admin, repo }
}

/// Checks that `dir` is the top of a git working tree or a bare repository whose git
/// directory is inside `desk_dir` (so relative links can reach it).
///
/// # Errors
/// [`DeskError::NotARepo`].
pub fn check_repo(dir: &Path, desk_dir: &Path) -> Result<()> {
    let not = |reason: String| DeskError::NotARepo {
        path: dir.to_path_buf(),
        reason,
    };
    let out = git::output(
        dir,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(not(err
            .lines()
            .next()
            .unwrap_or("git rev-parse failed")
            .trim()
            .to_owned()));
    }
    let common = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim_end());
    let common = fs::canonicalize(&common).unwrap_or(common);
    if !common.starts_with(desk_dir) {
        return Err(not(format!(
            "its git directory {} is outside the desk",
            common.display()
        )));
    }
    let top = git::try_run(dir, &["rev-parse", "--show-toplevel"])?;
    if let Some(top) = top {
        let top = fs::canonicalize(&top).unwrap_or_else(|_| PathBuf::from(&top));
        if top != dir {
            return Err(not(format!(
                "it is inside the repository {}, not its top",
                top.display()
            )));
        }
    }
    Ok(())
}

/// Whether local branch `branch` exists in the repo at `repo`.
///
/// # Errors
/// [`DeskError::NoGit`].
pub fn branch_exists(repo: &Path, branch: &str) -> Result<bool> {
    Ok(git::try_run(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/heads/{branch}"),
        ],
    )?
    .is_some())
}

/// Whether exactly one remote has a branch named `branch` (then `git worktree add PATH
/// BRANCH` creates a local branch tracking it).
///
/// # Errors
/// [`DeskError::NoGit`].
pub fn unique_remote_branch(repo: &Path, branch: &str) -> Result<bool> {
    let refs = git::try_run(
        repo,
        &[
            "for-each-ref",
            "--format=%(refname:strip=3)",
            "refs/remotes",
        ],
    )?
    .unwrap_or_default();
    Ok(refs.lines().filter(|r| *r == branch).count() == 1)
}

/// `git worktree add --lock` of `task_dir` (absent or empty) on `branch` (with `create`: a
/// new branch from the repo's HEAD; without: an existing local branch, or a new one
/// tracking the remote branch of that name), then the `.git` link made relative.
///
/// # Errors
/// [`DeskError::Git`] (e.g. the branch is checked out in another worktree).
pub fn add(repo: &Path, task_dir: &Path, branch: &str, create: bool) -> Result<()> {
    let task = task_dir.to_string_lossy().into_owned();
    let mut args: Vec<&str> = vec![
        "worktree",
        "add",
        "--quiet",
        "--lock",
        "--reason",
        LOCK_REASON,
    ];
    if git::has_relative_paths() {
        args.push("--relative-paths");
    }
    if create {
        args.extend(["-b", branch, &task]);
    } else {
        args.extend([&task as &str, branch]);
    }
    git::run(repo, &args)?;
    make_dotgit_relative(task_dir)?;
    Ok(())
}

/// Rewrites `task_dir/.git` to a relative `gitdir:` if it is absolute. Returns whether it
/// changed anything.
///
/// # Errors
/// I/O errors; [`DeskError::BrokenTask`] if the link is unreadable.
pub fn make_dotgit_relative(task_dir: &Path) -> Result<bool> {
    let broken = |reason: String| DeskError::BrokenTask {
        task: task_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: task_dir.to_path_buf(),
        reason,
    };
    let target = dotgit_target(task_dir)
        .map_err(broken)?
        .ok_or_else(|| broken("no .git file".into()))?;
    if !Path::new(&target).is_absolute() {
        return Ok(false);
    }
    let admin = fs::canonicalize(&target).ctx("resolve", Path::new(&target))?;
    let here = fs::canonicalize(task_dir).ctx("resolve", task_dir)?;
    let rel = relative_path(&here, &admin);
    let p = task_dir.join(".git");
    fs::write(&p, format!("gitdir: {}\n", rel.display())).ctx("write", &p)?;
    Ok(true)
}

/// Points the back link of the worktree at `task_dir` at its current location when it is
/// absolute and names another place (see the module doc). Also makes an absolute `.git`
/// link relative again. Returns whether it wrote anything.
///
/// # Errors
/// [`DeskError::BrokenTask`] when the task is not a healthy worktree; I/O errors.
pub fn repair(task_dir: &Path) -> Result<bool> {
    let mut changed = make_dotgit_relative(task_dir)?;
    let Health::Ok { admin, .. } = health(task_dir) else {
        return Ok(changed);
    };
    let back = admin.join("gitdir");
    let want = fs::canonicalize(task_dir)
        .ctx("resolve", task_dir)?
        .join(".git");
    let have = fs::read_to_string(&back).unwrap_or_default();
    let have = have.trim_end();
    let relative_ok = !have.is_empty() && !Path::new(have).is_absolute();
    if !relative_ok && Path::new(have) != want {
        fs::write(&back, format!("{}\n", want.display())).ctx("write", &back)?;
        changed = true;
    }
    Ok(changed)
}

/// Unlocks (if locked) and removes the worktree at `task_dir` with `git worktree remove`
/// (`--force` drops uncommitted changes), then prunes.
///
/// # Errors
/// [`DeskError::Git`].
pub fn remove(repo: &Path, task_dir: &Path, force: bool) -> Result<()> {
    let task = task_dir.to_string_lossy().into_owned();
    if let Health::Ok { admin, .. } = health(task_dir) {
        if admin.join("locked").exists() {
            git::run(repo, &["worktree", "unlock", &task])?;
        }
    }
    let mut args = vec!["worktree", "remove"];
    if force {
        args.push("--force");
    }
    args.push(&task);
    git::run(repo, &args)?;
    prune(repo)
}

/// `git worktree prune` in `repo`.
///
/// # Errors
/// [`DeskError::Git`].
pub fn prune(repo: &Path) -> Result<()> {
    git::run(repo, &["worktree", "prune"]).map(|_| ())
}

/// A worktree registration found in a repo's `worktrees/` admin area.
#[derive(Clone, Debug, Serialize)]
pub struct Registration {
    /// Admin dir id (`worktrees/ID`).
    pub id: String,
    /// The admin dir.
    pub admin: PathBuf,
    /// Where its back link points (resolved against the admin dir when relative).
    pub target: Option<PathBuf>,
    /// Whether it is locked.
    pub locked: bool,
}

/// The worktree registrations of the repo at `repo`.
///
/// # Errors
/// [`DeskError::NoGit`].
pub fn registrations(repo: &Path) -> Result<Vec<Registration>> {
    let Some(common) = git::try_run(
        repo,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )?
    else {
        return Ok(Vec::new());
    };
    let dir = PathBuf::from(common).join("worktrees");
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir(&dir) else {
        return Ok(v);
    };
    for e in rd.flatten() {
        let admin = e.path();
        if !admin.is_dir() {
            continue;
        }
        let target = fs::read_to_string(admin.join("gitdir")).ok().map(|t| {
            let t = PathBuf::from(t.trim_end());
            if t.is_absolute() {
                t
            } else {
                admin.join(t)
            }
        });
        v.push(Registration {
            id: e.file_name().to_string_lossy().into_owned(),
            locked: admin.join("locked").exists(),
            admin,
            target,
        });
    }
    v.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(v)
}

/// The state of a worktree, as `resume` and `task list` show it.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct State {
    /// Checked-out branch (`None` when detached).
    pub branch: Option<String>,
    /// Short commit id of HEAD (`None` in an empty repo).
    pub head: Option<String>,
    /// What ahead/behind count against: the branch's upstream, else the repo's default
    /// branch.
    pub base: Option<String>,
    /// Commits on HEAD not on `base`.
    pub ahead: Option<u32>,
    /// Commits on `base` not on HEAD.
    pub behind: Option<u32>,
    /// Changed tracked entries (staged or not).
    pub uncommitted: usize,
    /// Untracked, not ignored entries.
    pub untracked: usize,
    /// The first few changed or untracked paths.
    pub changed_paths: Vec<String>,
}

impl State {
    /// Changed plus untracked entries.
    pub fn dirty_count(&self) -> usize {
        self.uncommitted + self.untracked
    }
}

/// The repo's default branch: `origin/HEAD`'s target, else the branch checked out in
/// the repo itself, else `main` or `master` if one exists.
///
/// # Errors
/// [`DeskError::NoGit`].
pub fn default_branch(repo: &Path) -> Result<Option<String>> {
    if let Some(b) = git::try_run(
        repo,
        &["symbolic-ref", "-q", "--short", "refs/remotes/origin/HEAD"],
    )? {
        return Ok(Some(b));
    }
    if let Some(b) = git::try_run(repo, &["symbolic-ref", "-q", "--short", "HEAD"])? {
        if branch_exists(repo, &b)? {
            return Ok(Some(b));
        }
    }
    for b in ["main", "master"] {
        if branch_exists(repo, b)? {
            return Ok(Some(b.to_owned()));
        }
    }
    Ok(None)
}

/// Reads the state of the worktree at `dir` (a task) of the repo at `repo`.
///
/// # Errors
/// [`DeskError::Git`] when `git status` fails there.
pub fn state(dir: &Path, repo: &Path) -> Result<State> {
    let mut s = State {
        branch: git::try_run(dir, &["symbolic-ref", "-q", "--short", "HEAD"])?,
        head: git::try_run(dir, &["rev-parse", "--short", "-q", "--verify", "HEAD"])?,
        ..State::default()
    };
    let upstream = git::try_run(
        dir,
        &[
            "rev-parse",
            "--abbrev-ref",
            "--symbolic-full-name",
            "@{upstream}",
        ],
    )?;
    s.base = match upstream {
        Some(u) => Some(u),
        None => default_branch(repo)?.filter(|b| Some(b) != s.branch.as_ref()),
    };
    if let (Some(base), Some(_)) = (&s.base, &s.head) {
        let range = format!("{base}...HEAD");
        if let Some(out) = git::try_run(dir, &["rev-list", "--left-right", "--count", &range])? {
            let mut it = out.split_whitespace().map(|n| n.parse::<u32>().ok());
            s.behind = it.next().flatten();
            s.ahead = it.next().flatten();
        }
    }
    let out = git::output(
        dir,
        &["status", "--porcelain=v1", "-z", "--untracked-files=normal"],
    )?;
    if !out.status.success() {
        return Err(git::failure(dir, &["status"], &out));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split('\0').filter(|f| !f.is_empty());
    while let Some(f) = fields.next() {
        if f.len() < 4 {
            continue;
        }
        let (xy, path) = f.split_at(3);
        if xy.starts_with("??") {
            s.untracked += 1;
        } else {
            s.uncommitted += 1;
            if xy.contains(['R', 'C']) {
                fields.next(); // the rename/copy source
            }
        }
        if s.changed_paths.len() < 5 {
            s.changed_paths.push(path.to_owned());
        }
    }
    Ok(s)
}
