//! Repos under `repos/`: turning a repo name (from the command line, a task record or the
//! manual) into a directory deskfs may act on.
//!
//! The agent can change its desk from inside `deskfs exec`, and host-side commands (task
//! start and finish, tidy, resume) run git in the repos and remove files in their git
//! directories. So a repo is only acted on when its name is one plain directory name,
//! `repos/NAME` is a real directory (not a symlink), its `.git` is not a symlink, a `.git`
//! file (`gitdir: PATH`) points inside the desk, and git's own idea of its git directory
//! resolves inside the desk. Anything else is refused with [`DeskError::UnsafeRepo`].

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{DeskError, IoContext, Result};
use crate::layout::Desk;
use crate::names::check_repo_name;
use crate::{git, worktree};

/// Resolves repo `name` to the canonical `repos/NAME`, checked as the module doc says
/// (also that git sees a repository there whose git directory is on the desk).
///
/// # Errors
/// [`DeskError::InvalidName`] (a name that is not one directory name),
/// [`DeskError::UnknownRepo`], [`DeskError::UnsafeRepo`], [`DeskError::NotARepo`].
pub fn checked(desk: &Desk, name: &str) -> Result<PathBuf> {
    let dir = existing_dir(desk, name)?;
    let unsafe_repo = |reason: String| DeskError::UnsafeRepo {
        repo: name.to_owned(),
        path: desk.repo_dir(name),
        reason,
    };
    let dotgit = dir.join(".git");
    match fs::symlink_metadata(&dotgit) {
        Ok(md) if md.file_type().is_symlink() => {
            let to = fs::read_link(&dotgit)
                .map(|t| format!(" (to {})", t.display()))
                .unwrap_or_default();
            return Err(unsafe_repo(format!(
                "its .git is a symlink{to}, which could lead git outside the desk"
            )));
        }
        Ok(md) if md.is_file() => {
            // `gitdir: PATH` (a separate git dir): it must stay on the desk.
            let text = fs::read_to_string(&dotgit).ctx("read", &dotgit)?;
            if let Some(target) = text.trim_end().strip_prefix("gitdir: ") {
                let target = dir.join(target);
                let real = fs::canonicalize(&target).unwrap_or(target);
                if !real.starts_with(desk.dir()) {
                    return Err(unsafe_repo(format!(
                        "its .git file points outside the desk, to {}",
                        real.display()
                    )));
                }
            }
        }
        Ok(md) if md.is_dir() => {
            let wt = dotgit.join("worktrees");
            if fs::symlink_metadata(&wt).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(unsafe_repo(
                    "its .git/worktrees is a symlink, which could lead deskfs outside the desk"
                        .into(),
                ));
            }
        }
        _ => {}
    }
    worktree::check_repo(&dir, desk.dir()).map_err(|e| match e {
        DeskError::NotARepo { reason, .. } if reason.contains("outside the desk") => {
            unsafe_repo(reason)
        }
        e => e,
    })?;
    Ok(dir)
}

/// Resolves repo `name` to the canonical `repos/NAME` when it is a valid name of a real
/// directory there (not a symlink); git is not asked. For commands that only need the
/// repo to exist (`manual repo`).
///
/// # Errors
/// [`DeskError::InvalidName`], [`DeskError::UnknownRepo`], [`DeskError::UnsafeRepo`] for a
/// symlink.
pub fn existing_dir(desk: &Desk, name: &str) -> Result<PathBuf> {
    check_repo_name(name)?;
    let dir = desk.repo_dir(name);
    let unknown = || DeskError::UnknownRepo {
        repo: name.to_owned(),
        dir: desk.repos_dir(),
        known: desk.repo_names(),
    };
    let md = match fs::symlink_metadata(&dir) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(unknown()),
        Err(e) => return Err(DeskError::io("stat", &dir, e)),
    };
    if md.file_type().is_symlink() {
        let to = fs::read_link(&dir)
            .map(|t| format!(" (to {})", t.display()))
            .unwrap_or_default();
        return Err(DeskError::UnsafeRepo {
            repo: name.to_owned(),
            path: dir,
            reason: format!("repos/{name} is a symlink{to}, not a directory on the desk"),
        });
    }
    if !md.is_dir() {
        return Err(unknown());
    }
    let real = fs::canonicalize(&dir).ctx("resolve", &dir)?;
    if !real.starts_with(desk.repos_dir()) {
        return Err(DeskError::UnsafeRepo {
            repo: name.to_owned(),
            path: dir,
            reason: format!("it resolves outside repos/, to {}", real.display()),
        });
    }
    Ok(real)
}

/// The repos deskfs may act on (see [`checked`]), by name, sorted. Plain directories that
/// are not git repositories and refused repos are left out (see [`refused`]).
pub fn usable(desk: &Desk) -> Vec<(String, PathBuf)> {
    desk.repo_names()
        .into_iter()
        .filter_map(|n| checked(desk, &n).ok().map(|d| (n, d)))
        .collect()
}

/// One line per entry of `repos/` that deskfs refuses to act on (a symlink, a `.git`
/// symlink, a git directory outside the desk), for commands to print as warnings.
pub fn refused(desk: &Desk) -> Vec<String> {
    let Ok(rd) = fs::read_dir(desk.repos_dir()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|n| match checked(desk, &n) {
            Err(e @ DeskError::UnsafeRepo { .. }) => Some(e.to_string()),
            _ => None,
        })
        .collect()
}

/// The git common directory of the checked repo at `repo` (canonical), as git reports it.
///
/// # Errors
/// [`DeskError::Git`] when git does not answer.
pub fn common_dir(repo: &Path) -> Result<PathBuf> {
    let out = git::run(
        repo,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )?;
    let p = PathBuf::from(out);
    Ok(fs::canonicalize(&p).unwrap_or(p))
}
