//! `desk tidy`: finds what a desk no longer needs, reports each item with its size and
//! removes it unless it is a dry run.
//!
//! What counts (the `kind` of a [`TidyItem`]):
//! * `stale-registration`: a repo's worktree registration whose worktree is gone (see
//!   `scan::stale_registrations`); its admin dir is removed (`git worktree prune` after
//!   dropping deskfs's lock).
//! * `broken-task`: a `tasks/*/` directory that is not a working worktree (no `.git`, a bad
//!   one, or its registration is gone) and whose task is not being started right now.
//! * `merged-branch`: the branch of a finished task (per its record) that is merged into
//!   the repo's default branch and checked out nowhere; deleted, with the record. A finished
//!   task whose branch no longer exists just loses its record (`finished-record`).
//! * `leftover-lock`: a lock file under `.desk/locks/` nobody holds.
//! * `git-lock`: a git `*.lock` file older than an hour in a repo's git dir (a killed git).
//! * `scratch`: `*.tmp`, `*~`, `.#*` and deskfs temp files (`*.deskfs-tmp`) in the desk
//!   outside `repos/`, `tasks/` and `.cache/` (files in git checkouts belong to the
//!   project), plus `.AGENT.creating.*` / `.AGENT.removing.*` leftovers next to the desk.
//! * `old-tmp`: files under `tmp/` not modified for `tmp_max_age` (default 24 h); empty
//!   directories under `tmp/` go with them.
//! * `cache-over-cap`: a package cache under `.cache/` bigger than `cache_cap` (default
//!   2 GiB); it is emptied (the tools refill it).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Result;
use crate::fsutil::{mtime_secs, now_secs, remove_path, tree_size, TMP_SUFFIX};
use crate::layout::{Desk, CACHES};
use crate::worktree::{self, Health};
use crate::{git, record, scan, task};

/// Default cap per package cache, bytes.
pub const DEFAULT_CACHE_CAP: u64 = 2 << 30;
/// Default age after which files under `tmp/` go, seconds.
pub const DEFAULT_TMP_AGE: u64 = 24 * 3600;
/// Age from which tidy removes a git lock file, seconds.
pub const GIT_LOCK_REMOVE_AGE: u64 = 3600;

/// Options of [`tidy`].
#[derive(Clone, Debug)]
pub struct TidyOptions {
    /// Report only.
    pub dry_run: bool,
    /// Cap per cache directory, bytes.
    pub cache_cap: u64,
    /// Age in seconds after which files under `tmp/` are removed.
    pub tmp_max_age: u64,
}

impl Default for TidyOptions {
    fn default() -> Self {
        TidyOptions {
            dry_run: false,
            cache_cap: DEFAULT_CACHE_CAP,
            tmp_max_age: DEFAULT_TMP_AGE,
        }
    }
}

/// One thing tidy found.
#[derive(Clone, Debug, Serialize)]
pub struct TidyItem {
    /// What kind of leftover (see the module doc).
    pub kind: &'static str,
    /// What: a path relative to the desk, or `repo:branch`.
    pub what: String,
    /// Bytes it takes (0 for a branch).
    pub bytes: u64,
    /// Why it goes.
    pub detail: String,
    /// Whether it was removed (false in a dry run or on error).
    pub removed: bool,
    /// The error removing it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

struct Collector<'a> {
    desk: &'a Desk,
    dry_run: bool,
    items: Vec<TidyItem>,
}

impl Collector<'_> {
    fn rel(&self, p: &Path) -> String {
        p.strip_prefix(self.desk.dir())
            .map(|r| r.display().to_string())
            .unwrap_or_else(|_| p.display().to_string())
    }

    fn add(
        &mut self,
        kind: &'static str,
        what: String,
        bytes: u64,
        detail: String,
        remove: impl FnOnce() -> Result<()>,
    ) {
        let (removed, error) = if self.dry_run {
            (false, None)
        } else {
            match remove() {
                Ok(()) => (true, None),
                Err(e) => (false, Some(e.to_string())),
            }
        };
        self.items.push(TidyItem {
            kind,
            what,
            bytes,
            detail,
            removed,
            error,
        });
    }

    fn path(&mut self, kind: &'static str, p: &Path, detail: String) {
        // Never remove anything whose directory resolves outside the desk (or next to it,
        // for the desk's own create/remove leftovers).
        let inside = p
            .parent()
            .and_then(|d| fs::canonicalize(d).ok())
            .is_some_and(|d| {
                d.starts_with(self.desk.dir()) || Some(d.as_path()) == self.desk.dir().parent()
            });
        if !inside {
            return;
        }
        let bytes = tree_size(p);
        let what = self.rel(p);
        let p = p.to_path_buf();
        self.add(kind, what, bytes, detail, move || remove_path(&p));
    }
}

/// Runs tidy on `desk` (worktree back links are repaired first). Repos deskfs refuses to
/// act on (see [`crate::repos::refused`]) are left alone; callers print those lines.
///
/// # Errors
/// None today beyond what each item reports; kept fallible for I/O on the desk itself.
pub fn tidy(desk: &Desk, opts: &TidyOptions) -> Result<Vec<TidyItem>> {
    let _ = task::repair_links(desk);
    let mut c = Collector {
        desk,
        dry_run: opts.dry_run,
        items: Vec::new(),
    };
    broken_tasks(&mut c);
    stale_registrations(&mut c);
    merged_branches(&mut c)?;
    leftover_locks(&mut c);
    for g in scan::stale_git_locks(desk, GIT_LOCK_REMOVE_AGE) {
        let detail = format!("git lock file {} min old", g.age_secs / 60);
        c.path("git-lock", &g.path, detail);
    }
    scratch(&mut c);
    old_tmp(&mut c, opts.tmp_max_age);
    caches(&mut c, opts.cache_cap);
    Ok(c.items)
}

fn broken_tasks(c: &mut Collector) {
    for t in c.desk.task_names() {
        let dir = c.desk.task_dir(&t);
        let h = worktree::health(&dir);
        if matches!(h, Health::Ok { .. }) || scan::task_busy(c.desk, &t) {
            continue;
        }
        let desk = c.desk;
        let detail = task::health_text(&h);
        let bytes = tree_size(&dir);
        let what = c.rel(&dir);
        c.add("broken-task", what, bytes, detail, || {
            remove_path(&dir)?;
            // An unfinished record of a task that is gone is no use either.
            if record::load(desk, &t).is_some_and(|r| r.finished.is_none()) {
                record::remove(desk, &t)?;
            }
            Ok(())
        });
    }
}

fn stale_registrations(c: &mut Collector) {
    for s in scan::stale_registrations(c.desk) {
        let admin = s.registration.admin.clone();
        let bytes = tree_size(&admin);
        let what = c.rel(&admin);
        let detail = format!(
            "worktree registration of a gone worktree ({})",
            s.registration
                .target
                .as_ref()
                .map(|t| t.display().to_string())
                .unwrap_or_else(|| "no gitdir".into())
        );
        let repo_dir = s.repo_dir.clone();
        c.add("stale-registration", what, bytes, detail, move || {
            remove_path(&admin.join("locked"))?;
            worktree::prune(&repo_dir)?;
            // prune keeps a registration whose gitdir file is unreadable; drop it directly.
            remove_path(&admin)
        });
    }
}

fn merged_branches(c: &mut Collector) -> Result<()> {
    let open: Vec<String> = c.desk.task_names();
    for r in record::all(c.desk) {
        if r.finished.is_none() || open.contains(&r.task) {
            continue;
        }
        let desk = c.desk;
        let task_name = r.task.clone();
        // Only a repo deskfs may act on (see `repos::checked`); a repo that is gone just
        // leaves the record to drop, a refused one is left alone (`desk tidy` warns).
        let repo = match crate::repos::checked(desk, &r.repo) {
            Ok(dir) => Some(dir),
            Err(crate::DeskError::UnknownRepo { .. }) => None,
            Err(_) => continue,
        };
        let gone = match &repo {
            Some(dir) => !worktree::branch_exists(dir, &r.branch)?,
            None => true,
        };
        if gone {
            let what = format!("record {}", r.task);
            let detail = format!("finished task; its branch {} is gone", r.branch);
            c.add("finished-record", what, 0, detail, move || {
                record::remove(desk, &task_name)
            });
            continue;
        }
        let Some(repo) = repo else { continue };
        let Some(default) = worktree::default_branch(&repo)? else {
            continue;
        };
        if default == r.branch || default.ends_with(&format!("/{}", r.branch)) {
            continue;
        }
        let merged =
            git::try_run(&repo, &["merge-base", "--is-ancestor", &r.branch, &default])?.is_some();
        if !merged || checked_out(&repo, &r.branch)? {
            continue;
        }
        let what = format!("{}:{}", r.repo, r.branch);
        let detail = format!(
            "branch of finished task {} is merged into {default}",
            r.task
        );
        let branch = r.branch.clone();
        c.add("merged-branch", what, 0, detail, move || {
            git::run(&repo, &["branch", "-D", &branch])?;
            record::remove(desk, &task_name)
        });
    }
    Ok(())
}

/// Whether `branch` is checked out in any worktree of `repo`.
fn checked_out(repo: &Path, branch: &str) -> Result<bool> {
    let list = git::run(repo, &["worktree", "list", "--porcelain"])?;
    let want = format!("branch refs/heads/{branch}");
    Ok(list.lines().any(|l| l == want))
}

fn leftover_locks(c: &mut Collector) {
    for l in scan::locks(c.desk) {
        if !l.held {
            let detail = format!(
                "lock {} nobody holds ({})",
                l.name,
                crate::lock::describe_holder(l.pid)
            );
            c.path("leftover-lock", &l.path, detail);
        }
    }
}

fn is_scratch(name: &str) -> bool {
    name.ends_with(".tmp")
        || name.ends_with('~')
        || name.starts_with(".#")
        || name.ends_with(TMP_SUFFIX)
}

fn scratch(c: &mut Collector) {
    let skip: Vec<PathBuf> = ["repos", "tasks", ".cache", "tmp"]
        .iter()
        .map(|d| c.desk.dir().join(d))
        .collect();
    let mut found = Vec::new();
    let mut stack = vec![c.desk.dir().to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if !skip.contains(&p) {
                    stack.push(p);
                }
            } else if is_scratch(&e.file_name().to_string_lossy()) {
                found.push(p);
            }
        }
    }
    // Leftovers of an interrupted `desk create` / `desk rm` of this agent.
    if let Some(parent) = c.desk.dir().parent() {
        let agent = c.desk.agent();
        if let Ok(rd) = fs::read_dir(parent) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&format!(".{agent}.creating."))
                    || n.starts_with(&format!(".{agent}.removing."))
                {
                    found.push(e.path());
                }
            }
        }
    }
    found.sort();
    for p in found {
        c.path("scratch", &p, "scratch or temp file".into());
    }
}

fn old_tmp(c: &mut Collector, max_age: u64) {
    let now = now_secs();
    let tmp = c.desk.tmp_dir();
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    let mut stack = vec![tmp.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let Ok(md) = fs::symlink_metadata(e.path()) else {
                continue;
            };
            if md.is_dir() {
                stack.push(e.path());
                dirs.push(e.path());
            } else if now.saturating_sub(mtime_secs(&md)) >= max_age {
                files.push(e.path());
            }
        }
    }
    files.sort();
    for f in files {
        let detail = format!("in tmp/, untouched for over {} h", max_age / 3600);
        c.path("old-tmp", &f, detail);
    }
    if !c.dry_run {
        // Deepest first; only dirs that became empty go (remove_dir fails on the others).
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let _ = fs::remove_dir(d);
        }
    }
}

fn caches(c: &mut Collector, cap: u64) {
    for (name, _) in CACHES {
        let dir = c.desk.cache_root().join(name);
        let size = tree_size(&dir);
        if size <= cap {
            continue;
        }
        let what = c.rel(&dir);
        let detail = format!("over the cap of {}", crate::fsutil::human_size(cap));
        c.add("cache-over-cap", what, size, detail, move || {
            let rd = fs::read_dir(&dir).map_err(|e| crate::DeskError::io("read", &dir, e))?;
            for e in rd.flatten() {
                remove_path(&e.path())?;
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        assert_eq!(
            DEFAULT_CACHE_CAP,
            2 * 1024 * 1024 * 1024,
            "2 GiB per package cache"
        );
        assert_eq!(DEFAULT_TMP_AGE, 86_400, "a day");
        assert_eq!(TidyOptions::default().cache_cap, DEFAULT_CACHE_CAP);
    }

    #[test]
    fn scratch_names_are_editor_and_temporary_leftovers() {
        for n in [
            "a.tmp",
            "draft.md~",
            ".#draft.md",
            &format!("x{TMP_SUFFIX}"),
        ] {
            assert!(is_scratch(n), "{n}");
        }
        for n in ["a.txt", "tmp", "a.tmpx", "#a#", "notes.md"] {
            assert!(!is_scratch(n), "{n}");
        }
    }
}
