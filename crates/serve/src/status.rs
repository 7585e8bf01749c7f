//! A desk's status (`GET /v1/desks/{agent}/status`): the desk (created, repos, open
//! tasks with their worktree state, disk usage), whether commands can run and how many
//! run now, and — when the server's binary can tell — the status of the deskfs
//! workspace the desk root is on (dirty data, pending and failing uploads, cache,
//! metadata backup). Nothing in it names a host path or another desk.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deskfs_desk::Desk;
use serde::Serialize;
use serde_json::{json, Value};

use crate::exec::ExecHost;

/// Gives the status of the workspace the desk root is on, for the desk of the agent
/// named (`None`: the root is not on a mounted deskfs workspace). Called off the async
/// workers for every status request; it must name no host path and no other desk.
pub type WorkspaceStatus = Arc<dyn Fn(&str) -> Option<Value> + Send + Sync>;

/// Entries the disk-usage walk looks at before it stops (`complete: false`).
const USAGE_MAX_ENTRIES: u64 = 200_000;
/// Time the disk-usage walk takes at most.
const USAGE_MAX_TIME: Duration = Duration::from_secs(2);

/// The desk's disk usage (apparent sizes, symlinks not followed, mounts not crossed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Sum of the sizes of regular files.
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Directories (the desk itself not counted).
    pub dirs: u64,
    /// Every entry was counted (`false`: the walk stopped at its entry or time limit,
    /// and the numbers are lower bounds).
    pub complete: bool,
}

/// Walks the desk at `dir` within the limits.
pub fn usage(dir: &Path) -> Usage {
    let mut u = Usage {
        complete: true,
        ..Usage::default()
    };
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return u;
    };
    let dev = top.dev();
    let deadline = Instant::now() + USAGE_MAX_TIME;
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0u64;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > USAGE_MAX_ENTRIES || (seen % 1024 == 0 && Instant::now() > deadline) {
                u.complete = false;
                return u;
            }
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                u.dirs += 1;
                if m.dev() == dev {
                    stack.push(e.path());
                }
            } else if m.is_file() {
                u.files += 1;
                u.bytes += m.len();
            }
        }
    }
    u
}

/// The status document of `desk` (blocking: walks the desk, reads its tasks' git
/// state, asks `workspace`).
pub fn desk_status(desk: &Desk, exec: &ExecHost, workspace: Option<&WorkspaceStatus>) -> Value {
    let tasks: Vec<Value> = deskfs_desk::task::list(desk)
        .into_iter()
        .map(|t| {
            json!({
                "name": t.name,
                "repo": t.repo,
                "health": t.health,
                "state": t.state,
                "started": t.started,
            })
        })
        .collect();
    let ws = workspace.and_then(|f| f(desk.agent()));
    json!({
        "agent": desk.agent(),
        "created": desk.meta().created,
        "repos": desk.repo_names(),
        "tasks": tasks,
        "usage": usage(desk.dir()),
        "exec": {
            "available": crate::exec::available(),
            "running": exec.running(desk.agent()),
        },
        "workspace": ws.unwrap_or(Value::Null),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_files_and_never_follows_links() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("desk");
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/f"), b"12345").unwrap();
        std::fs::write(d.join("a/b/g"), b"123").unwrap();
        std::fs::write(t.path().join("outside"), vec![0u8; 1000]).unwrap();
        std::os::unix::fs::symlink(t.path(), d.join("up")).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), d.join("o")).unwrap();
        let u = usage(&d);
        assert_eq!(
            u,
            Usage {
                bytes: 8,
                files: 2,
                dirs: 2,
                complete: true
            }
        );
    }
}
