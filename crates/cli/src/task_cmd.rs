//! `deskfs task start|list|finish`.

use anyhow::Result;
use clap::{Args, Subcommand};
use deskfs_desk::resume::task_line;
use deskfs_desk::task;

use crate::desk_root::RootArgs;

/// Arguments of `deskfs task`.
#[derive(Args, Debug)]
pub struct TaskArgs {
    #[command(flatten)]
    pub root: RootArgs,
    #[command(subcommand)]
    pub cmd: TaskCmd,
}

/// `deskfs task` subcommands.
#[derive(Subcommand, Debug)]
pub enum TaskCmd {
    /// Make tasks/TASK a git worktree of repos/REPO on its own branch, with the
    /// git-ignored files named by the repo's .worktreeinclude copied in.
    #[command(
        after_help = "Examples:\n  deskfs task start alice fix-login --repo app\n  deskfs task start alice hotfix --repo app --branch release-1.2\n\nThe .worktreeinclude files are copied from the repo's own working tree (repos/REPO):\nput .env there once and every new task gets a copy."
    )]
    Start {
        /// Agent name.
        agent: String,
        /// Task name: a valid git branch name without '/'.
        task: String,
        /// The repo under repos/ to work on.
        #[arg(long)]
        repo: String,
        /// Branch to use (default: the task name); an existing branch is checked out, a new
        /// one starts at the repo's HEAD.
        #[arg(long)]
        branch: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List the open tasks with branch, ahead/behind and uncommitted changes.
    #[command(after_help = "Examples:\n  deskfs task list alice\n  deskfs task list alice --json")]
    List {
        /// Agent name.
        agent: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Write a summary note, remove the worktree (its branch stays), prune. Refuses
    /// uncommitted or untracked work unless --discard.
    #[command(
        after_help = "Examples:\n  deskfs task finish alice fix-login --note \"PR #12 opened\"\n  deskfs task finish alice spike --discard"
    )]
    Finish {
        /// Agent name.
        agent: String,
        /// Task name.
        task: String,
        /// Drop uncommitted changes and untracked files.
        #[arg(long)]
        discard: bool,
        /// Text added to the summary note.
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `deskfs task ...`.
pub fn run(a: TaskArgs) -> Result<()> {
    match a.cmd {
        TaskCmd::Start {
            agent,
            task: name,
            repo,
            branch,
            json,
        } => {
            let desk = a.root.open(&agent)?;
            task::repair_links(&desk);
            let s = task::start(&desk, &name, &repo, branch.as_deref())?;
            for w in &s.warnings {
                eprintln!("deskfs: warning: {w}");
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                let how = if s.created_branch {
                    "new branch"
                } else {
                    "existing branch"
                };
                let copied: Vec<String> =
                    s.copied.iter().map(|p| p.display().to_string()).collect();
                let copied = if copied.is_empty() {
                    String::new()
                } else {
                    format!("; copied {}", copied.join(", "))
                };
                println!(
                    "started task {name} at {} ({how} {}){copied}",
                    s.path.display(),
                    s.branch
                );
            }
            Ok(())
        }
        TaskCmd::List { agent, json } => {
            let desk = a.root.open(&agent)?;
            task::repair_links(&desk);
            let tasks = task::list(&desk);
            if json {
                println!("{}", serde_json::to_string_pretty(&tasks)?);
            } else if tasks.is_empty() {
                println!("no open tasks on desk {agent}");
            } else {
                for t in &tasks {
                    println!("{}", task_line(t));
                }
            }
            Ok(())
        }
        TaskCmd::Finish {
            agent,
            task: name,
            discard,
            note,
            json,
        } => {
            let desk = a.root.open(&agent)?;
            task::repair_links(&desk);
            let f = task::finish(&desk, &name, discard, note.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&f)?);
            } else {
                let branch = f.branch.as_deref().unwrap_or("(detached)");
                let dropped = if f.discarded > 0 {
                    format!(", {} uncommitted change(s) discarded", f.discarded)
                } else {
                    String::new()
                };
                println!(
                    "finished task {name}: {} commit(s) on branch {branch}{dropped}; worktree removed; note {}",
                    f.commits,
                    f.note.display()
                );
            }
            Ok(())
        }
    }
}
