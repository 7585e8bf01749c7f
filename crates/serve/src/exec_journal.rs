//! The task journal of the commands run over HTTP and MCP ([`crate::exec`]): one
//! [`PendingEntry`] per command, begun before it starts (the mount's change cursor and
//! the start time are taken then), fed its output as it comes, and recorded in the desk's
//! `.desk/journal/` when it ends — before its end is reported, so a client that saw the
//! exit finds the entry (see `deskfs_desk::journal`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use deskfs_desk::journal::{self, ChangeWatch, ExecRecord, Output, OutputTally, WatchFactory};
use deskfs_desk::{names, Desk};

use crate::exec::ExitInfo;

/// Which interface ran the command (the entry's `via`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `POST /v1/desks/{agent}/exec`.
    Http,
    /// The MCP `exec` tool.
    Mcp,
}

impl Via {
    /// `http` or `mcp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Http => "http",
            Via::Mcp => "mcp",
        }
    }
}

/// The output of one command as it comes (shared by its stdout and stderr pumps, so the
/// kept head is in arrival order).
pub(crate) type SharedTally = Arc<Mutex<OutputTally>>;

/// One command's journal entry while it runs.
pub(crate) struct PendingEntry {
    desk: Desk,
    task: Option<String>,
    via: Via,
    command: Vec<String>,
    cwd: String,
    start: SystemTime,
    watch: ChangeWatch,
    tally: SharedTally,
}

/// The task a working directory belongs to: `tasks/T` and below are task `T` (when `T`
/// is a valid task name), anything else the desk's own journal.
pub(crate) fn task_of(cwd: &str) -> Option<String> {
    let mut parts = cwd.split('/');
    match (parts.next(), parts.next()) {
        (Some("tasks"), Some(t)) if names::check_task(t).is_ok() => Some(t.to_owned()),
        _ => None,
    }
}

impl PendingEntry {
    /// Begins the entry of `command` run in desk-relative `cwd` (`""`: the desk's top):
    /// takes the change cursor of the desk's mount through `watch` and the time now.
    /// Blocking (asks the mount daemon).
    pub(crate) fn begin(
        watch: &WatchFactory,
        desk: &Desk,
        via: Via,
        command: Vec<String>,
        cwd: String,
    ) -> PendingEntry {
        PendingEntry {
            desk: desk.clone(),
            task: task_of(&cwd),
            via,
            command,
            cwd,
            start: SystemTime::now(),
            watch: watch(desk),
            tally: SharedTally::default(),
        }
    }

    /// Where the pumps add the output.
    pub(crate) fn tally(&self) -> SharedTally {
        self.tally.clone()
    }

    /// Records the entry of a command that ended as `exit`; returns its id. Blocking (asks
    /// the mount daemon for the changes, appends and fsyncs the journal line). A journal
    /// that cannot be written is logged, never the command's failure.
    pub(crate) fn finish(self, exit: &ExitInfo) -> Option<String> {
        let changes = self.watch.finish();
        let tally = std::mem::take(&mut *self.tally.lock().unwrap_or_else(|p| p.into_inner()));
        let r = ExecRecord {
            via: self.via.as_str(),
            command: &self.command,
            cwd: &self.cwd,
            start: self.start,
            duration: Duration::from_millis(exit.duration_ms),
            exit_code: Some(exit.code),
            signal: exit.signal,
            timed_out: exit.timed_out,
            killed: exit.killed,
            output: Output::Captured(tally),
        };
        match journal::record_exec(&self.desk, self.task.as_deref(), &r, changes) {
            Ok(e) => Some(e.id),
            Err(e) => {
                tracing::warn!(agent = self.desk.agent(), error = %e, "an exec is not in the journal");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_is_read_from_the_working_directory() {
        assert_eq!(task_of("tasks/fix-1"), Some("fix-1".into()));
        assert_eq!(task_of("tasks/fix-1/src/lib"), Some("fix-1".into()));
        assert_eq!(task_of(""), None);
        assert_eq!(task_of("tasks"), None);
        assert_eq!(task_of("repos/app"), None);
        assert_eq!(task_of("notes/tasks/x"), None);
        assert_eq!(task_of("tasks/.."), None);
    }
}
