//! Inspections shared by `resume` (which warns) and `desk tidy` (which removes): leftover
//! task locks, worktree registrations without a worktree, stale git lock files.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::fsutil::{mtime_secs, now_secs};
use crate::layout::Desk;
use crate::lock::{probe, Probe};
use crate::repos;
use crate::worktree::{self, Health, Registration};

/// A lock file under `.desk/locks/` (`task-T.lock`, `repo-R.lock`, `manual.lock`).
#[derive(Clone, Debug, Serialize)]
pub struct LockInfo {
    /// File name without `.lock`: `task-T`, `repo-R`, `manual`.
    pub name: String,
    /// The task it guards, for a task lock.
    pub task: Option<String>,
    /// The lock file.
    pub path: PathBuf,
    /// Whether someone holds it.
    pub held: bool,
    /// PID recorded in it.
    pub pid: Option<u32>,
}

/// The lock files under `.desk/locks/`. Every deskfs lock file is removed by its holder on
/// release, so a free one is a leftover of a command that died (e.g. a task start).
pub fn locks(desk: &Desk) -> Vec<LockInfo> {
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir(desk.locks_dir()) else {
        return v;
    };
    for e in rd.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(name) = file.strip_suffix(".lock") else {
            continue;
        };
        let Ok(p) = probe(&e.path()) else { continue };
        let (held, pid) = match p {
            Probe::Held { pid } => (true, pid),
            Probe::Free { pid } => (false, pid),
        };
        v.push(LockInfo {
            name: name.to_owned(),
            task: name.strip_prefix("task-").map(str::to_owned),
            path: e.path(),
            held,
            pid,
        });
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// Whether the lock of `task` is held right now.
pub fn task_busy(desk: &Desk, task: &str) -> bool {
    probe(&crate::task::task_lock_path(desk, task)).is_ok_and(|p| matches!(p, Probe::Held { .. }))
}

/// A registration in `repos/REPO` whose worktree is gone.
#[derive(Clone, Debug, Serialize)]
pub struct StaleRegistration {
    /// Repo name.
    pub repo: String,
    /// The repo's directory.
    pub repo_dir: PathBuf,
    /// The registration.
    pub registration: Registration,
}

/// Registrations that no task directory claims and whose back link names a missing
/// `.git`, unless locked by someone other than deskfs (git's "initializing" lock of an
/// interrupted `worktree add` counts as deskfs's). Tasks being started are skipped.
pub fn stale_registrations(desk: &Desk) -> Vec<StaleRegistration> {
    let claimed: HashSet<PathBuf> = desk
        .task_names()
        .iter()
        .filter_map(|t| match worktree::health(&desk.task_dir(t)) {
            Health::Ok { admin, .. } => Some(admin),
            _ => None,
        })
        .collect();
    let mut v = Vec::new();
    // Only repos deskfs may act on (`repos::checked`), and only admin dirs inside their
    // git directory: tidy removes what this returns.
    for (repo, dir) in repos::usable(desk) {
        let Ok(common) = repos::common_dir(&dir) else {
            continue;
        };
        let Ok(regs) = worktree::registrations(&dir) else {
            continue;
        };
        for reg in regs {
            let admin = fs::canonicalize(&reg.admin).unwrap_or_else(|_| reg.admin.clone());
            if claimed.contains(&admin) || !admin.starts_with(&common) {
                continue;
            }
            let target_exists = reg.target.as_deref().is_some_and(Path::exists);
            if target_exists {
                continue;
            }
            let reason = fs::read_to_string(reg.admin.join("locked")).unwrap_or_default();
            let ours =
                !reg.locked || reason.starts_with("deskfs task") || reason.trim() == "initializing";
            if !ours {
                continue;
            }
            // A task of that name being started right now: not stale yet.
            let task = reg
                .target
                .as_deref()
                .and_then(Path::parent)
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned());
            if task.is_some_and(|t| task_busy(desk, &t)) {
                continue;
            }
            v.push(StaleRegistration {
                repo: repo.clone(),
                repo_dir: dir.clone(),
                registration: reg,
            });
        }
    }
    v
}

/// A git lock file (`index.lock`, `HEAD.lock`, ...) left by a killed git process.
#[derive(Clone, Debug, Serialize)]
pub struct GitLock {
    /// The file.
    pub path: PathBuf,
    /// Its age in seconds.
    pub age_secs: u64,
}

/// `*.lock` files directly in each repo's git dir (as git reports it) and in its
/// `worktrees/*/` admin dirs (where git keeps `index.lock` and `HEAD.lock`) older than
/// `min_age_secs`. Only repos deskfs may act on (`repos::checked`), and only directories
/// that resolve inside their git directory: `desk tidy` removes what this returns.
pub fn stale_git_locks(desk: &Desk, min_age_secs: u64) -> Vec<GitLock> {
    let now = now_secs();
    let mut dirs = Vec::new();
    for (_, repo) in repos::usable(desk) {
        let Ok(common) = repos::common_dir(&repo) else {
            continue;
        };
        if let Ok(rd) = fs::read_dir(common.join("worktrees")) {
            dirs.extend(rd.flatten().filter_map(|e| {
                let real = fs::canonicalize(e.path()).ok()?;
                real.starts_with(&common).then_some(real)
            }));
        }
        dirs.push(common);
    }
    let mut v = Vec::new();
    for d in dirs {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let name = e.file_name();
            if !name.to_string_lossy().ends_with(".lock") {
                continue;
            }
            let Ok(md) = e.metadata() else { continue };
            if !md.is_file() {
                continue;
            }
            let age = now.saturating_sub(mtime_secs(&md));
            if age >= min_age_secs {
                v.push(GitLock {
                    path: e.path(),
                    age_secs: age,
                });
            }
        }
    }
    v.sort_by(|a, b| a.path.cmp(&b.path));
    v
}
