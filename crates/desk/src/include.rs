//! `.worktreeinclude`: git-ignored files (e.g. `.env`) a new task worktree gets copied from
//! the repo's checkout, as common worktree tools do.
//!
//! The file sits at the top of the repo and uses gitignore syntax (plain paths, globs,
//! `dir/`, `!negation`, `#` comments). A file is copied when it matches a pattern **and**
//! git ignores it; tracked files come from the checkout itself and untracked, non-ignored
//! ones are left alone. Matching is git's own: `git ls-files --others --ignored
//! --exclude-from=.worktreeinclude` lists the candidates and `git check-ignore` keeps the
//! ignored ones. Regular files and symlinks are copied (modes kept); nothing is
//! overwritten.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::error::{DeskError, IoContext, Result};
use crate::git;

/// Name of the pattern file at the top of a repo.
pub const FILE: &str = ".worktreeinclude";

/// The repo-relative paths `.worktreeinclude` selects in the checkout at `repo` (empty
/// without the file).
///
/// # Errors
/// [`DeskError::Git`] when git fails.
pub fn selected(repo: &Path) -> Result<Vec<PathBuf>> {
    let patterns = repo.join(FILE);
    if !patterns.is_file() {
        return Ok(Vec::new());
    }
    let exclude_from = format!("--exclude-from={}", patterns.display());
    let listed = git::run(
        repo,
        &["ls-files", "-z", "--others", "--ignored", &exclude_from],
    )?;
    let candidates: Vec<&str> = listed.split('\0').filter(|p| !p.is_empty()).collect();
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    // Keep those git ignores by its standard rules.
    let mut child = git::command(repo, ["check-ignore", "-z", "--stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(DeskError::NoGit)?;
    let input: Vec<u8> = candidates
        .iter()
        .flat_map(|p| p.bytes().chain([0]))
        .collect();
    let writer = child.stdin.take().map(|mut stdin| {
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        })
    });
    let out = child.wait_with_output().map_err(DeskError::NoGit)?;
    if let Some(w) = writer {
        let _ = w.join();
    }
    // Exit 1 means "none of them is ignored".
    if !out.status.success() && out.status.code() != Some(1) {
        return Err(git::failure(repo, &["check-ignore", "--stdin"], &out));
    }
    let mut v: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}

/// Copies the files [`selected`] names from `repo` to the worktree at `dest`; returns the
/// copied relative paths. Existing files in `dest` are kept.
///
/// # Errors
/// Git and I/O errors.
pub fn copy(repo: &Path, dest: &Path) -> Result<Vec<PathBuf>> {
    let mut copied = Vec::new();
    for rel in selected(repo)? {
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            continue;
        }
        let from = repo.join(&rel);
        let to = dest.join(&rel);
        let Ok(md) = fs::symlink_metadata(&from) else {
            continue;
        };
        if fs::symlink_metadata(&to).is_ok() {
            continue;
        }
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).ctx("create", parent)?;
        }
        if md.file_type().is_symlink() {
            let target = fs::read_link(&from).ctx("read link", &from)?;
            std::os::unix::fs::symlink(&target, &to).ctx("create symlink", &to)?;
        } else if md.is_file() {
            fs::copy(&from, &to).ctx("copy to", &to)?;
            fs::set_permissions(&to, fs::Permissions::from_mode(md.permissions().mode()))
                .ctx("chmod", &to)?;
        } else {
            continue;
        }
        copied.push(rel);
    }
    Ok(copied)
}
