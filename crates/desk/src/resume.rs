//! `resume`: what an agent reads first in a session — the manual's human part, the open
//! tasks with their worktree state, the newest notes, and warnings about anything an
//! interrupted session may have left (manual drift, dirty or broken tasks, leftover locks,
//! lost worktree registrations, stale git lock files).

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::error::Result;
use crate::fsutil::utc_iso;
use crate::layout::Desk;
use crate::manual::{self, Manual};
use crate::notes::{self, NoteInfo};
use crate::task::{self, TaskInfo};
use crate::{journal, record, scan};

/// How many notes `resume` shows.
pub const NOTES_SHOWN: usize = 5;
/// Age (seconds) from which `resume` warns about a git `*.lock` file (git holds them for
/// moments; an older one was most likely left by a killed git, e.g. in a killed exec).
pub const GIT_LOCK_AGE: u64 = 60;

/// One warning.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Warning {
    /// Kind: `manual-drift`, `dirty-task`, `broken-task`, `interrupted-start`,
    /// `leftover-lock`, `start-in-progress`, `stale-registration`, `missing-task`,
    /// `git-lock`, `link-repair`, `journal`, `unsafe-repo`.
    pub kind: &'static str,
    /// What it is about (a task, tool, path).
    pub subject: String,
    /// One line: what is wrong and what to do.
    pub message: String,
}

/// The newest journal entries of one task.
#[derive(Clone, Debug, Serialize)]
pub struct JournalTail {
    /// The task (`_desk`: execs outside tasks).
    pub task: String,
    /// Oldest first.
    pub entries: Vec<journal::Entry>,
}

/// The `resume` report.
#[derive(Clone, Debug, Serialize)]
pub struct Resume {
    /// The agent.
    pub agent: String,
    /// The desk directory.
    pub desk: PathBuf,
    /// The manual's human part (`AGENTS.md` without the machine block).
    pub manual: String,
    /// The manual's machine part: recorded tools (with versions) and each repo's test and
    /// build commands (empty when the manual has none or cannot be parsed).
    pub recorded: manual::MachinePart,
    /// Open tasks.
    pub tasks: Vec<TaskInfo>,
    /// The newest notes, newest first.
    pub notes: Vec<NoteInfo>,
    /// The last [`journal::RESUME_ENTRIES`] execs of each open task (and of the desk's
    /// top, as task `_desk`), for those that have any.
    pub journal: Vec<JournalTail>,
    /// Warnings; empty when the desk is in order.
    pub warnings: Vec<Warning>,
}

/// Builds the report (repairing worktree back links first, see `worktree`).
///
/// # Errors
/// Only I/O errors reading the manual other than "malformed" (reported as a warning).
pub fn resume(desk: &Desk) -> Result<Resume> {
    let mut warnings = Vec::new();
    for e in task::repair_links(desk) {
        warnings.push(Warning {
            kind: "link-repair",
            subject: "worktree links".into(),
            message: e,
        });
    }
    let (manual_text, recorded) = match Manual::load(&desk.manual_path()) {
        Ok(m) => (m.human(), m.machine.clone()),
        Err(_) => (
            std::fs::read_to_string(desk.manual_path()).unwrap_or_default(),
            manual::MachinePart::default(),
        ),
    };
    for d in manual::check(desk)? {
        warnings.push(Warning {
            kind: "manual-drift",
            subject: d.subject.clone(),
            message: format!("manual drift: {}: {}", d.subject, d.problem),
        });
    }
    let tasks = task::list(desk);
    for t in &tasks {
        if t.health != "ok" {
            warnings.push(Warning {
                kind: "broken-task",
                subject: t.name.clone(),
                message: format!(
                    "task {}: {}; `deskfs desk tidy {}` removes it",
                    t.name,
                    t.health,
                    desk.agent()
                ),
            });
            continue;
        }
        if !t.has_record {
            warnings.push(Warning {
                kind: "interrupted-start",
                subject: t.name.clone(),
                message: format!(
                    "task {} has no start record (its start was interrupted): check it, then keep working or `deskfs task finish {} {} --discard`",
                    t.name,
                    desk.agent(),
                    t.name
                ),
            });
        }
        if let Some(s) = &t.state {
            if s.dirty_count() > 0 {
                warnings.push(Warning {
                    kind: "dirty-task",
                    subject: t.name.clone(),
                    message: format!(
                        "task {} has {} uncommitted or untracked file(s) ({}): left by an interrupted session? commit them or drop them with `deskfs task finish {} {} --discard`",
                        t.name,
                        s.dirty_count(),
                        s.changed_paths.join(", "),
                        desk.agent(),
                        t.name
                    ),
                });
            }
        }
    }
    for l in scan::locks(desk) {
        let holder = crate::lock::describe_holder(l.pid);
        let what = match &l.task {
            Some(t) => format!("task {t}"),
            None => l.name.clone(),
        };
        if l.held {
            if let Some(t) = &l.task {
                warnings.push(Warning {
                    kind: "start-in-progress",
                    subject: t.clone(),
                    message: format!("task {t} is being started or finished right now ({holder})"),
                });
            }
        } else {
            warnings.push(Warning {
                kind: "leftover-lock",
                subject: l.name.clone(),
                message: format!(
                    "leftover lock of {what} from an interrupted deskfs command ({holder}, {}); `deskfs desk tidy {}` removes it",
                    l.path.display(),
                    desk.agent()
                ),
            });
        }
    }
    for s in scan::stale_registrations(desk) {
        let target = s
            .registration
            .target
            .as_ref()
            .map(|t| t.display().to_string())
            .unwrap_or_else(|| "?".into());
        warnings.push(Warning {
            kind: "stale-registration",
            subject: format!("{}:{}", s.repo, s.registration.id),
            message: format!(
                "repo {} registers worktree {} at {target}, which is gone; `deskfs desk tidy {}` removes the registration",
                s.repo,
                s.registration.id,
                desk.agent()
            ),
        });
    }
    let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
    for r in record::all(desk) {
        if r.finished.is_none() && !names.contains(&r.task.as_str()) {
            warnings.push(Warning {
                kind: "missing-task",
                subject: r.task.clone(),
                message: format!(
                    "task {} (repo {}, branch {}) has a record but no directory: its worktree was removed by hand; its branch is still in the repo",
                    r.task, r.repo, r.branch
                ),
            });
        }
    }
    for line in crate::repos::refused(desk) {
        warnings.push(Warning {
            kind: "unsafe-repo",
            subject: "repos".into(),
            message: line,
        });
    }
    for g in scan::stale_git_locks(desk, GIT_LOCK_AGE) {
        warnings.push(Warning {
            kind: "git-lock",
            subject: g.path.display().to_string(),
            message: format!(
                "git lock file {} is {} s old (a killed git left it?); if no git command is running, remove it (`deskfs desk tidy {}` does after an hour)",
                g.path.display(),
                g.age_secs,
                desk.agent()
            ),
        });
    }
    let mut tails = Vec::new();
    let names_with_desk = names
        .iter()
        .copied()
        .chain(std::iter::once(journal::DESK_JOURNAL));
    for t in names_with_desk {
        match journal::read(desk, Some(t), journal::RESUME_ENTRIES) {
            Ok(entries) if !entries.is_empty() => tails.push(JournalTail {
                task: t.to_owned(),
                entries,
            }),
            Ok(_) => {}
            Err(e) => warnings.push(Warning {
                kind: "journal",
                subject: t.to_owned(),
                message: format!("cannot read the journal of {t}: {e}"),
            }),
        }
    }
    Ok(Resume {
        journal: tails,
        agent: desk.agent().to_owned(),
        desk: desk.dir().to_path_buf(),
        manual: manual_text,
        recorded,
        tasks,
        notes: notes::newest(desk, NOTES_SHOWN),
        warnings,
    })
}

impl Resume {
    /// The report for people.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "desk {} at {}", self.agent, self.desk.display());
        let _ = writeln!(s, "\n== manual (AGENTS.md) ==");
        let _ = writeln!(s, "{}", self.manual.trim_end());
        if !self.recorded.repos.is_empty() || !self.recorded.tools.is_empty() {
            let _ = writeln!(
                s,
                "\n== how to build and test, tools (recorded in the manual) =="
            );
        }
        for r in &self.recorded.repos {
            let _ = writeln!(
                s,
                "repo {}: test `{}`, build `{}`",
                r.name,
                r.test_cmd.as_deref().unwrap_or("-"),
                r.build_cmd.as_deref().unwrap_or("-")
            );
        }
        for t in &self.recorded.tools {
            let _ = writeln!(s, "tool {}: {} (`{}`)", t.name, t.version, t.version_cmd);
        }
        let _ = writeln!(s, "\n== tasks ({}) ==", self.tasks.len());
        if self.tasks.is_empty() {
            let _ = writeln!(s, "(no open tasks)");
        }
        for t in &self.tasks {
            let _ = writeln!(s, "{}", task_line(t));
        }
        if !self.journal.is_empty() {
            let _ = writeln!(s, "\n== last execs (deskfs journal {}) ==", self.agent);
        }
        for j in &self.journal {
            for e in &j.entries {
                let _ = writeln!(s, "{}", journal_line(&j.task, e));
            }
        }
        let _ = writeln!(s, "\n== newest notes ==");
        if self.notes.is_empty() {
            let _ = writeln!(s, "(no notes)");
        }
        for n in &self.notes {
            let _ = writeln!(
                s,
                "{}  {}  {}",
                utc_iso(n.modified),
                n.path.display(),
                n.first_line
            );
        }
        let _ = writeln!(s, "\n== warnings ({}) ==", self.warnings.len());
        if self.warnings.is_empty() {
            let _ = writeln!(s, "(none)");
        }
        for w in &self.warnings {
            let _ = writeln!(s, "! {}", w.message);
        }
        s
    }
}

/// One line per journal entry: `fix-1  2026-12-03T03:10:00Z  exit 0  1.2s  +3 ~1 -2  cargo test`.
pub fn journal_line(task: &str, e: &journal::Entry) -> String {
    format!(
        "{task}  {}  {}  {:.1}s  {}  {}",
        e.start,
        e.status_text(),
        e.duration_ms as f64 / 1000.0,
        e.files_summary(),
        e.command_line()
    )
}

/// One line per task: `fix-1  repo app  branch fix-1  2 ahead, 0 behind main  1 uncommitted`.
pub fn task_line(t: &TaskInfo) -> String {
    let mut line = format!("{}  repo {}", t.name, t.repo.as_deref().unwrap_or("?"));
    match &t.state {
        Some(st) => {
            let _ = write!(
                line,
                "  branch {}",
                st.branch.as_deref().unwrap_or("(detached)")
            );
            match (&st.base, st.ahead, st.behind) {
                (Some(b), Some(a), Some(be)) => {
                    let _ = write!(line, "  {a} ahead, {be} behind {b}");
                }
                _ => line.push_str("  (no base branch to compare)"),
            }
            if st.dirty_count() == 0 {
                line.push_str("  clean");
            } else {
                let _ = write!(
                    line,
                    "  {} uncommitted, {} untracked",
                    st.uncommitted, st.untracked
                );
            }
        }
        None => {
            let _ = write!(line, "  {}", t.health);
        }
    }
    line
}
