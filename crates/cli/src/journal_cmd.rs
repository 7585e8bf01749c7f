//! `deskfs journal AGENT [--task T] [--json] [--limit N] [--files]`: the execs the system
//! recorded on a desk (see `deskfs_desk::journal`), and the glue `deskfs exec` uses to
//! record one: the change ring of the mount daemon serving the desk, asked over its
//! control socket before and after the command.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use clap::Args;
use deskfs_desk::journal::{
    self, ChangeSource, ChangeWatch, ExecRecord, Output, RingPage, WatchFactory, DESK_JOURNAL,
};
use deskfs_desk::{names, Desk, DeskError};

use crate::desk_root::RootArgs;
use crate::home::all_mounts;

/// Arguments of `deskfs journal`.
#[derive(Args, Debug)]
pub struct JournalArgs {
    #[command(flatten)]
    pub root: RootArgs,
    /// Agent name.
    pub agent: String,
    /// Only this task's execs (`_desk`: those outside tasks). Default: all, merged by time.
    #[arg(long)]
    pub task: Option<String>,
    /// Newest entries shown.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// The entries as JSON (an array, oldest first).
    #[arg(long)]
    pub json: bool,
    /// List the files each exec created (+), changed (~) and deleted (-).
    #[arg(long)]
    pub files: bool,
}

/// Runs `deskfs journal`.
pub fn run(a: JournalArgs) -> Result<()> {
    let desk = a.root.open(&a.agent)?;
    if let Some(t) = a.task.as_deref().filter(|t| *t != DESK_JOURNAL) {
        names::check_task(t)?;
        // A finished task keeps its journal; otherwise the task must exist.
        if !journal::journal_path(&desk, Some(t)).exists() && !desk.task_dir(t).is_dir() {
            return Err(DeskError::UnknownTask {
                agent: desk.agent().to_owned(),
                task: t.to_owned(),
                known: desk.task_names(),
            }
            .into());
        }
    }
    if a.limit == 0 {
        anyhow::bail!("--limit 0 shows nothing; give a positive number");
    }
    let entries = journal::read(&desk, a.task.as_deref(), a.limit)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    if entries.is_empty() {
        println!(
            "no execs recorded on desk {}{}",
            desk.agent(),
            a.task
                .as_deref()
                .map(|t| format!(" for task {t}"))
                .unwrap_or_default()
        );
        return Ok(());
    }
    println!(
        "{:<20}  {:<12}  {:<9}  {:>8}  {:<16}  COMMAND",
        "TIME", "TASK", "EXIT", "DURATION", "FILES"
    );
    for e in &entries {
        println!(
            "{:<20}  {:<12}  {:<9}  {:>8}  {:<16}  {}",
            e.start,
            e.task.as_deref().unwrap_or("-"),
            e.status_text(),
            format!("{:.1}s", e.duration_ms as f64 / 1000.0),
            e.files_summary(),
            e.command_line()
        );
        if a.files {
            if let Some(f) = &e.files {
                for (mark, list) in [("+", &f.created), ("~", &f.changed), ("-", &f.deleted)] {
                    for p in list {
                        println!("    {mark} {p}");
                    }
                }
                if f.totals.is_some() {
                    println!(
                        "    (lists cut at {} paths each; the counts above are complete)",
                        journal::FILES_CAP
                    );
                }
            }
            if let Some(why) = &e.changes_unknown {
                println!("    files unknown: {why}");
            }
            if e.changes_overflowed {
                println!("    (incomplete: the mount's change ring overflowed during the exec)");
            }
        }
    }
    Ok(())
}

/// The change ring of one mount daemon, over its control socket.
struct DaemonSource {
    socket: PathBuf,
}

impl ChangeSource for DaemonSource {
    fn cursor(&self) -> std::result::Result<u64, String> {
        crate::control::change_cursor(&self.socket).map_err(|e| e.to_string())
    }

    fn changes(
        &self,
        since: u64,
        prefix: &str,
        limit: usize,
    ) -> std::result::Result<RingPage, String> {
        crate::control::changes_since(&self.socket, since, prefix, limit).map_err(|e| e.to_string())
    }
}

/// The mount daemon serving `dir` (the live mount whose mount point is the longest
/// prefix of it) and `dir`'s workspace path there, with a trailing `/`.
fn mount_of(dir: &Path) -> Option<(PathBuf, String)> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    all_mounts()
        .into_iter()
        .filter_map(|m| {
            let mnt = std::fs::canonicalize(&m.mountpoint).unwrap_or(m.mountpoint);
            let rel = dir.strip_prefix(&mnt).ok()?.to_path_buf();
            Some((mnt.as_os_str().len(), m.socket, rel))
        })
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, socket, rel)| {
            let mut p = String::from_utf8_lossy(rel.as_os_str().as_bytes()).into_owned();
            if !p.is_empty() {
                p.push('/');
            }
            (socket, p)
        })
}

/// Starts watching the file changes on `desk` for one exec: the change ring of the mount
/// daemon serving the desk, or — for a desk that is a plain directory — a watch whose
/// result says the changes are unknown (never an empty list).
pub fn watch_desk(desk: &Desk) -> ChangeWatch {
    match mount_of(desk.dir()) {
        Some((socket, prefix)) => ChangeWatch::start(Box::new(DaemonSource { socket }), prefix),
        None => ChangeWatch::unknown(
            "the desk is not on a deskfs mount (a plain directory): its file changes are not recorded",
        ),
    }
}

/// [`watch_desk`] as the factory the HTTP and MCP exec paths are handed (they may not
/// depend on this crate).
pub fn watch_factory() -> WatchFactory {
    Arc::new(watch_desk)
}

/// Records one `deskfs exec` in the desk's journal. `code` is the exit status the CLI
/// passes on (128 + N when signal N killed the command). The output went to the caller's
/// stdio directly, so it is not captured. A journal that cannot be written is a warning
/// on stderr: the command's own outcome stands.
pub fn record_cli_exec(
    desk: &Desk,
    task: Option<&str>,
    argv: &[OsString],
    start: SystemTime,
    duration: Duration,
    code: i32,
    watch: ChangeWatch,
) {
    let changes = watch.finish();
    let command: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cwd = task.map(|t| format!("tasks/{t}")).unwrap_or_default();
    let r = ExecRecord {
        via: "cli",
        command: &command,
        cwd: &cwd,
        start,
        duration,
        exit_code: Some(code),
        signal: None,
        timed_out: false,
        killed: false,
        output: Output::NotCaptured(
            "deskfs exec passes the caller's terminal and pipes to the command: its output is not captured".into(),
        ),
    };
    if let Err(e) = journal::record_exec(desk, task, &r, changes) {
        eprintln!("deskfs: warning: this exec is not in the journal: {e}");
    }
}
