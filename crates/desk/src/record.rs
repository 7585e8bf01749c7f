//! Task records, `.desk/tasks/TASK.toml`: which repo and branch a task uses, the commit it
//! started from and when it started and finished. Written last by `task start` (a task
//! directory without a record is an interrupted start), marked finished by `task finish`
//! and removed by `desk tidy` once the branch is merged.

use std::fs;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{DeskError, Result};
use crate::fsutil::atomic_write;
use crate::layout::Desk;

/// One task's record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TaskRecord {
    /// Task name.
    pub task: String,
    /// Repo name under `repos/`.
    pub repo: String,
    /// The task's branch.
    pub branch: String,
    /// Full commit id the worktree started at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    /// Start time, seconds since the epoch.
    pub started: u64,
    /// Finish time, seconds since the epoch (`None` while open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<u64>,
}

fn path(desk: &Desk, task: &str) -> PathBuf {
    desk.records_dir().join(format!("{task}.toml"))
}

/// Reads the record of `task`; `None` when there is none or it is unreadable.
pub fn load(desk: &Desk, task: &str) -> Option<TaskRecord> {
    let text = fs::read_to_string(path(desk, task)).ok()?;
    toml::from_str(&text).ok()
}

/// All readable records, sorted by task name.
pub fn all(desk: &Desk) -> Vec<TaskRecord> {
    let mut v: Vec<TaskRecord> = fs::read_dir(desk.records_dir())
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let task = name.strip_suffix(".toml")?;
                    load(desk, task)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_by(|a, b| a.task.cmp(&b.task));
    v
}

/// Writes (atomically) the record.
///
/// # Errors
/// I/O errors.
pub fn save(desk: &Desk, r: &TaskRecord) -> Result<()> {
    let p = path(desk, &r.task);
    let text = toml::to_string(r).map_err(|e| DeskError::Encode {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    if let Some(dir) = p.parent() {
        fs::create_dir_all(dir).map_err(|e| DeskError::io("create", dir, e))?;
    }
    atomic_write(&p, text.as_bytes())
}

/// Removes the record of `task` (missing is fine).
///
/// # Errors
/// I/O errors.
pub fn remove(desk: &Desk, task: &str) -> Result<()> {
    crate::fsutil::remove_path(&path(desk, task))
}
