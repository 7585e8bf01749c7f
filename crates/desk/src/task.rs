//! Tasks: `tasks/TASK/` is a git worktree of `repos/REPO` on its own branch.
//!
//! Start: the task lock (`.desk/locks/task-TASK.lock`, flock, non-blocking: a concurrent
//! start or finish of the same task fails at once with [`DeskError::TaskBusy`]), then an
//! atomic `mkdir tasks/TASK` (the second guard: of two starters exactly one creates it),
//! then `git worktree add --lock` under the repo lock, the `.worktreeinclude` copies and the
//! task record. Any failure after the mkdir rolls back: worktree removed, a branch the start
//! created deleted, directory removed.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::error::{DeskError, IoContext, Result};
use crate::fsutil::{now_secs, remove_path, utc_iso};
use crate::layout::Desk;
use crate::lock::FileLock;
use crate::names::{check_branch, check_task, check_with_git};
use crate::record::{self, TaskRecord};
use crate::worktree::{self, Health, State};
use crate::{git, include, notes};

/// How long git work waits for the repo lock held by another deskfs command.
pub const REPO_LOCK_TIMEOUT: Duration = Duration::from_secs(120);

/// Path of the lock file of task `task`.
pub fn task_lock_path(desk: &Desk, task: &str) -> PathBuf {
    desk.locks_dir().join(format!("task-{task}.lock"))
}

/// Takes the lock of task `task` without waiting.
///
/// # Errors
/// [`DeskError::TaskBusy`] when another process holds it.
pub fn lock_task(desk: &Desk, task: &str) -> Result<FileLock> {
    let p = task_lock_path(desk, task);
    fs::create_dir_all(desk.locks_dir()).ctx("create", &desk.locks_dir())?;
    FileLock::try_acquire(&p, true)?.map_err(|pid| DeskError::TaskBusy {
        task: task.to_owned(),
        holder: crate::lock::describe_holder(pid),
    })
}

/// Takes the lock serializing git worktree work in repo `repo` (waits up to
/// [`REPO_LOCK_TIMEOUT`]).
///
/// # Errors
/// [`DeskError::LockTimeout`].
pub fn lock_repo(desk: &Desk, repo: &str) -> Result<FileLock> {
    FileLock::acquire(
        &desk.locks_dir().join(format!("repo-{repo}.lock")),
        "repo",
        REPO_LOCK_TIMEOUT,
        true,
    )
}

/// Resolves `repo` to `repos/REPO`, checking it is a git repository deskfs may act on
/// (see [`crate::repos::checked`]: a plain name, no symlinked repo dir or `.git`, its git
/// directory on the desk).
///
/// # Errors
/// [`DeskError::InvalidName`], [`DeskError::UnknownRepo`], [`DeskError::UnsafeRepo`],
/// [`DeskError::NotARepo`].
pub fn repo_dir(desk: &Desk, repo: &str) -> Result<PathBuf> {
    crate::repos::checked(desk, repo)
}

/// What [`start`] made.
#[derive(Clone, Debug, Serialize)]
pub struct Started {
    /// The task.
    pub task: String,
    /// The worktree.
    pub path: PathBuf,
    /// Its branch.
    pub branch: String,
    /// Whether the branch was created (else an existing one was checked out).
    pub created_branch: bool,
    /// Files copied because `.worktreeinclude` names them (repo-relative).
    pub copied: Vec<PathBuf>,
    /// One line per `.worktreeinclude` path not copied because it would have gone through
    /// a symlink (out of the repo's checkout or the task's worktree).
    pub warnings: Vec<String>,
}

/// `task start`: makes `tasks/TASK` a worktree of `repos/REPO` on `branch` (default: the
/// task name; an existing local branch is checked out; else a remote branch of that name
/// in exactly one remote is tracked; else a new branch starts at the repo's HEAD).
///
/// # Errors
/// Name errors, [`DeskError::UnknownRepo`], [`DeskError::NotARepo`],
/// [`DeskError::TaskBusy`], [`DeskError::TaskExists`], [`DeskError::Git`] (e.g. the branch
/// is checked out elsewhere). Nothing is left behind on error.
pub fn start(desk: &Desk, task: &str, repo: &str, branch: Option<&str>) -> Result<Started> {
    check_task(task)?;
    check_with_git("task", task)?;
    let branch = branch.unwrap_or(task);
    check_branch(branch)?;
    check_with_git("branch", branch)?;
    let repo_path = repo_dir(desk, repo)?;
    let _task_lock = lock_task(desk, task)?;
    let dir = desk.task_dir(task);
    let exists = || DeskError::TaskExists {
        agent: desk.agent().to_owned(),
        task: task.to_owned(),
        path: dir.clone(),
    };
    if fs::symlink_metadata(&dir).is_ok() {
        return Err(exists());
    }
    fs::create_dir_all(desk.tasks_dir()).ctx("create", &desk.tasks_dir())?;
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(exists()),
        Err(e) => return Err(DeskError::io("create", &dir, e)),
    }
    let _repo_lock = match lock_repo(desk, repo) {
        Ok(l) => l,
        Err(e) => {
            let _ = fs::remove_dir(&dir);
            return Err(e);
        }
    };
    // A new branch starts at the repo's HEAD, unless exactly one remote has a branch of
    // that name: then git creates it tracking that one.
    let kind = worktree::branch_exists(&repo_path, branch).and_then(|local| {
        let remote = !local && worktree::unique_remote_branch(&repo_path, branch)?;
        Ok((local, remote))
    });
    let (local, remote) = match kind {
        Ok(k) => k,
        Err(e) => {
            let _ = fs::remove_dir(&dir);
            return Err(e);
        }
    };
    let create = !local;
    if let Err(e) = worktree::add(&repo_path, &dir, branch, create && !remote) {
        let _ = remove_path(&dir);
        let _ = worktree::prune(&repo_path);
        return Err(e);
    }
    let finish = || -> Result<Started> {
        let (copied, warnings) = include::copy(&repo_path, &dir)?;
        let base_commit = git::try_run(&dir, &["rev-parse", "-q", "--verify", "HEAD"])?;
        record::save(
            desk,
            &TaskRecord {
                task: task.to_owned(),
                repo: repo.to_owned(),
                branch: branch.to_owned(),
                base_commit,
                started: now_secs(),
                finished: None,
            },
        )?;
        Ok(Started {
            task: task.to_owned(),
            path: dir.clone(),
            branch: branch.to_owned(),
            created_branch: create,
            copied,
            warnings,
        })
    };
    match finish() {
        Ok(s) => Ok(s),
        Err(e) => {
            let _ = worktree::remove(&repo_path, &dir, true);
            let _ = remove_path(&dir);
            if create {
                let _ = git::run(&repo_path, &["branch", "-D", branch]);
            }
            let _ = record::remove(desk, task);
            Err(e)
        }
    }
}

/// Points every task's worktree back link at where the desk is now (see `worktree`);
/// returns one message per task it could not repair.
pub fn repair_links(desk: &Desk) -> Vec<String> {
    let mut errors = Vec::new();
    for t in desk.task_names() {
        let dir = desk.task_dir(&t);
        if let Health::Ok { admin, .. } = worktree::health(&dir) {
            // Repairing writes into the admin dir: never outside the desk.
            if !admin.starts_with(desk.dir()) {
                errors.push(format!(
                    "task {t}: not repaired, its .git points outside the desk (to {})",
                    admin.display()
                ));
                continue;
            }
            if let Err(e) = worktree::repair(&dir) {
                errors.push(format!("task {t}: {e}"));
            }
        }
    }
    errors
}

/// A task as `task list` and `resume` show it.
#[derive(Clone, Debug, Serialize)]
pub struct TaskInfo {
    /// Task name.
    pub name: String,
    /// Its directory.
    pub path: PathBuf,
    /// Repo name (from the record, else from the worktree link).
    pub repo: Option<String>,
    /// `ok`, or what is wrong with the directory.
    pub health: String,
    /// Worktree state (when healthy and git could read it).
    pub state: Option<State>,
    /// Start time (UTC ISO 8601), from the record.
    pub started: Option<String>,
    /// Whether a start record exists (missing: an interrupted start).
    pub has_record: bool,
}

/// Describes a [`Health`] in a few words (`ok` when healthy).
pub fn health_text(h: &Health) -> String {
    match h {
        Health::Ok { .. } => "ok".into(),
        Health::NoDotGit => "not a worktree (no .git file; an interrupted start?)".into(),
        Health::BadDotGit(e) => format!("not a worktree ({e})"),
        Health::MissingRegistration(a) => {
            format!(
                "worktree registration missing ({} does not exist)",
                a.display()
            )
        }
    }
}

fn repo_name_of(desk: &Desk, repo: &Path) -> Option<String> {
    let rel = repo.strip_prefix(desk.repos_dir()).ok()?;
    Some(rel.to_string_lossy().into_owned())
}

/// The tasks under `tasks/`, sorted by name.
pub fn list(desk: &Desk) -> Vec<TaskInfo> {
    desk.task_names()
        .into_iter()
        .map(|name| info(desk, &name))
        .collect()
}

/// [`TaskInfo`] of one task directory.
pub fn info(desk: &Desk, name: &str) -> TaskInfo {
    let path = desk.task_dir(name);
    let rec = record::load(desk, name).filter(|r| r.finished.is_none());
    let health = worktree::health(&path);
    let (repo, state) = match &health {
        Health::Ok { repo, .. } => (repo_name_of(desk, repo), worktree::state(&path, repo).ok()),
        _ => (rec.as_ref().map(|r| r.repo.clone()), None),
    };
    TaskInfo {
        name: name.to_owned(),
        health: health_text(&health),
        repo: rec.as_ref().map(|r| r.repo.clone()).or(repo),
        state,
        started: rec.as_ref().map(|r| utc_iso(r.started)),
        has_record: rec.is_some(),
        path,
    }
}

/// What [`finish`] did.
#[derive(Clone, Debug, Serialize)]
pub struct Finished {
    /// The task.
    pub task: String,
    /// Its branch (kept; `desk tidy` deletes it once merged).
    pub branch: Option<String>,
    /// Commits made on the branch during the task.
    pub commits: usize,
    /// Uncommitted entries dropped (only with `discard`).
    pub discarded: usize,
    /// The summary note written.
    pub note: PathBuf,
}

/// `task finish`: refuses uncommitted or untracked (non-ignored) work unless `discard`;
/// removes the worktree (the branch and its commits stay), prunes, marks the record
/// finished and writes a summary note (task, repo, branch, commits, times, `note`).
///
/// # Errors
/// [`DeskError::UnknownTask`], [`DeskError::TaskBusy`], [`DeskError::BrokenTask`],
/// [`DeskError::Uncommitted`], git and I/O errors.
pub fn finish(desk: &Desk, task: &str, discard: bool, note: Option<&str>) -> Result<Finished> {
    check_task(task)?;
    let dir = desk.task_dir(task);
    if !dir.is_dir() {
        return Err(DeskError::UnknownTask {
            agent: desk.agent().to_owned(),
            task: task.to_owned(),
            known: desk.task_names(),
        });
    }
    let _task_lock = lock_task(desk, task)?;
    let health = worktree::health(&dir);
    let Health::Ok { repo, admin } = &health else {
        return Err(DeskError::BrokenTask {
            task: task.to_owned(),
            path: dir,
            reason: health_text(&health),
        });
    };
    // Finish runs git in the repo and removes the worktree's registration: only in a repo
    // under repos/ that deskfs may act on, and only a registration inside it.
    let checked = repo_name_of(desk, repo)
        .ok_or_else(|| {
            format!(
                "its repo {} is not under {}",
                repo.display(),
                desk.repos_dir().display()
            )
        })
        .and_then(|name| crate::repos::checked(desk, &name).map_err(|e| e.to_string()))
        .and_then(|real| {
            let common = crate::repos::common_dir(&real).map_err(|e| e.to_string())?;
            if &real == repo && admin.starts_with(&common) {
                Ok(())
            } else {
                Err(format!(
                    "its git registration {} is not inside its repo's git directory {}",
                    admin.display(),
                    common.display()
                ))
            }
        });
    if let Err(reason) = checked {
        return Err(DeskError::BrokenTask {
            task: task.to_owned(),
            path: dir,
            reason,
        });
    }
    worktree::repair(&dir)?;
    let st = worktree::state(&dir, repo)?;
    if st.dirty_count() > 0 && !discard {
        return Err(DeskError::Uncommitted {
            task: task.to_owned(),
            path: dir,
            count: st.dirty_count(),
            sample: st.changed_paths.join(", "),
        });
    }
    let rec = record::load(desk, task);
    let base = rec
        .as_ref()
        .and_then(|r| r.base_commit.clone())
        .or_else(|| st.base.clone());
    let log = match &base {
        Some(b) => git::try_run(&dir, &["log", "--format=%h %s", &format!("{b}..HEAD")])?
            .unwrap_or_default(),
        None => String::new(),
    };
    let commits: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    let repo_name = repo_name_of(desk, repo)
        .or_else(|| rec.as_ref().map(|r| r.repo.clone()))
        .unwrap_or_default();
    {
        let _repo_lock = lock_repo(desk, &repo_name)?;
        worktree::remove(repo, &dir, discard)?;
    }
    let now = now_secs();
    let mut rec = rec.unwrap_or_else(|| TaskRecord {
        task: task.to_owned(),
        repo: repo_name.clone(),
        branch: st.branch.clone().unwrap_or_default(),
        base_commit: None,
        started: now,
        finished: None,
    });
    rec.finished = Some(now);
    if let Some(b) = &st.branch {
        rec.branch = b.clone();
    }
    record::save(desk, &rec)?;

    let branch_text = st
        .branch
        .clone()
        .unwrap_or_else(|| "(detached HEAD)".into());
    let mut text = format!(
        "# Task {task} finished: {} commit(s) on branch {branch_text} (repo {repo_name})\n\n",
        commits.len()
    );
    text.push_str(&format!("- started: {}\n", utc_iso(rec.started)));
    text.push_str(&format!("- finished: {}\n", utc_iso(now)));
    if let Some(h) = &st.head {
        text.push_str(&format!("- head: {h}\n"));
    }
    if let (Some(base), Some(a), Some(b)) = (&st.base, st.ahead, st.behind) {
        text.push_str(&format!("- vs {base}: {a} ahead, {b} behind\n"));
    }
    if discard && st.dirty_count() > 0 {
        text.push_str(&format!(
            "- discarded {} uncommitted change(s): {}\n",
            st.dirty_count(),
            st.changed_paths.join(", ")
        ));
    }
    if !commits.is_empty() {
        text.push_str("\nCommits:\n");
        for c in commits.iter().take(50) {
            text.push_str(&format!("- {c}\n"));
        }
    }
    if let Some(n) = note.filter(|n| !n.trim().is_empty()) {
        text.push_str(&format!("\n{}\n", n.trim_end()));
    }
    let note_path = notes::write(desk, &format!("task-{task}"), &text)?;
    Ok(Finished {
        task: task.to_owned(),
        commits: commits.len(),
        discarded: if discard { st.dirty_count() } else { 0 },
        branch: st.branch,
        note: note_path,
    })
}
