//! `deskfs desk create|list|show|rm|tidy`.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use deskfs_desk::fsutil::{human_size, utc_iso};
use deskfs_desk::tidy::{tidy, TidyOptions, DEFAULT_TMP_AGE};
use deskfs_desk::{manual, task, Desk};
use serde_json::json;

use crate::desk_root::RootArgs;

/// Arguments of `deskfs desk`.
#[derive(Args, Debug)]
pub struct DeskArgs {
    #[command(flatten)]
    pub root: RootArgs,
    #[command(subcommand)]
    pub cmd: DeskCmd,
}

/// `deskfs desk` subcommands.
#[derive(Subcommand, Debug)]
pub enum DeskCmd {
    /// Create the desk of AGENT (repos/, notes/, tasks/, tools/bin/, caches, AGENTS.md).
    #[command(
        after_help = "Examples:\n  deskfs desk create alice\n  deskfs desk create alice --root /mnt/work/desks\n  DESKFS_ROOT=/srv/desks deskfs desk create ci-bot"
    )]
    Create {
        /// Agent name: 1-64 of [A-Za-z0-9._-], not starting with '.' or '-'.
        agent: String,
    },
    /// List the desks under the root.
    #[command(after_help = "Examples:\n  deskfs desk list\n  deskfs desk list --json")]
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Show one desk: path, creation time, repos, tasks, notes, recorded tools.
    #[command(after_help = "Examples:\n  deskfs desk show alice\n  deskfs desk show alice --json")]
    Show {
        /// Agent name.
        agent: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Remove a desk and everything on it (asks on a terminal; --yes otherwise).
    #[command(
        after_help = "Examples:\n  deskfs desk rm alice          # asks for the agent name on a terminal\n  deskfs desk rm alice --yes"
    )]
    Rm {
        /// Agent name.
        agent: String,
        /// Do not ask.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Remove stale worktrees, merged branches of finished tasks, scratch files, old tmp/
    /// files and caches over their cap; each reported with its size.
    #[command(
        after_help = "Examples:\n  deskfs desk tidy alice --dry-run\n  deskfs desk tidy alice --cache-cap 500M --tmp-age 6\n\nBranches count as merged when the remote's default branch (e.g. origin/main, after\n`git fetch`) contains them; a branch without commits of its own counts as merged."
    )]
    Tidy {
        /// Agent name.
        agent: String,
        /// Report only, remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Cap per package cache (.cache/cargo, npm, pip, uv): a bigger one is emptied.
        #[arg(long, value_name = "SIZE", default_value = "2G", value_parser = crate::size::parse_size)]
        cache_cap: u64,
        /// Files under tmp/ untouched for this many hours are removed.
        #[arg(long, value_name = "HOURS", default_value_t = DEFAULT_TMP_AGE / 3600)]
        tmp_age: u64,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `deskfs desk ...`.
pub fn run(a: DeskArgs) -> Result<()> {
    match a.cmd {
        DeskCmd::Create { agent } => {
            let root = a.root.resolve()?;
            let desk = Desk::create(&root, &agent)?;
            println!("created desk {agent} at {}", desk.dir().display());
            Ok(())
        }
        DeskCmd::List { json } => {
            let root = a.root.resolve()?;
            let desks = deskfs_desk::list(&root)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({"root": root, "desks": desks}))?
                );
            } else if desks.is_empty() {
                println!(
                    "no desks in {} (create one with `deskfs desk create AGENT`)",
                    root.display()
                );
            } else {
                for d in desks {
                    let created = d.created.map(utc_iso).unwrap_or_else(|| "?".into());
                    println!("{}\t{}\tcreated {created}", d.agent, d.path.display());
                }
            }
            Ok(())
        }
        DeskCmd::Show { agent, json } => show(&a.root.open(&agent)?, json),
        DeskCmd::Rm { agent, yes } => rm(&a.root.open(&agent)?, yes),
        DeskCmd::Tidy {
            agent,
            dry_run,
            cache_cap,
            tmp_age,
            json,
        } => {
            let desk = a.root.open(&agent)?;
            let opts = TidyOptions {
                dry_run,
                cache_cap,
                tmp_max_age: tmp_age.saturating_mul(3600),
            };
            for line in deskfs_desk::repos::refused(&desk) {
                eprintln!("deskfs: warning: {line}");
            }
            // Sizing caches and asking git about every worktree and branch can take a
            // while on a large desk: a spinner on a terminal (nothing elsewhere).
            let pb = crate::daemon::wait_spinner(&format!(
                "tidying desk {agent}: sizing caches, checking worktrees and branches"
            ));
            let items = tidy(&desk, &opts);
            pb.finish_and_clear();
            let items = items?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({"dry_run": dry_run, "items": items}))?
                );
            } else if items.is_empty() {
                println!("desk {agent}: nothing to tidy");
            } else {
                let mut total = 0;
                for i in &items {
                    let state = match (&i.error, i.removed) {
                        (Some(e), _) => format!("FAILED ({e})"),
                        (None, true) => "removed".into(),
                        (None, false) => "would remove".into(),
                    };
                    if i.removed || dry_run {
                        total += i.bytes;
                    }
                    println!(
                        "{state}\t{}\t{}\t{}\t{}",
                        i.kind,
                        i.what,
                        human_size(i.bytes),
                        i.detail
                    );
                }
                let verb = if dry_run { "would free" } else { "freed" };
                println!("{} item(s), {verb} {}", items.len(), human_size(total));
            }
            if items.iter().any(|i| i.error.is_some()) {
                bail!("some items could not be removed (see above)");
            }
            Ok(())
        }
    }
}

fn show(desk: &Desk, json: bool) -> Result<()> {
    for line in deskfs_desk::repos::refused(desk) {
        eprintln!("deskfs: warning: {line}");
    }
    let repos: Vec<serde_json::Value> = desk
        .repo_names()
        .into_iter()
        .map(|r| {
            // git runs only in repos deskfs may act on (`repos::checked`).
            let branch = deskfs_desk::repos::checked(desk, &r).ok().and_then(|dir| {
                deskfs_desk::git::try_run(&dir, &["symbolic-ref", "-q", "--short", "HEAD"])
                    .ok()
                    .flatten()
            });
            json!({"name": r, "branch": branch})
        })
        .collect();
    let tasks = desk.task_names();
    let notes = deskfs_desk::notes::newest(desk, usize::MAX).len();
    let machine = manual::Manual::load(&desk.manual_path())
        .map(|m| m.machine)
        .ok();
    let tools: Vec<String> = machine
        .as_ref()
        .map(|m| {
            m.tools
                .iter()
                .map(|t| format!("{} ({})", t.name, t.version))
                .collect()
        })
        .unwrap_or_default();
    if json {
        let v = json!({
            "agent": desk.agent(),
            "path": desk.dir(),
            "format": desk.meta().format,
            "created": desk.meta().created,
            "repos": repos,
            "tasks": tasks,
            "notes": notes,
            "tools": machine.as_ref().map(|m| &m.tools),
            "manual_repos": machine.as_ref().map(|m| &m.repos),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("desk {} at {}", desk.agent(), desk.dir().display());
    println!(
        "created {} (format {})",
        utc_iso(desk.meta().created),
        desk.meta().format
    );
    let repo_text: Vec<String> = repos
        .iter()
        .map(|r| match r["branch"].as_str() {
            Some(b) => format!("{} ({b})", r["name"].as_str().unwrap_or("?")),
            None => r["name"].as_str().unwrap_or("?").to_owned(),
        })
        .collect();
    println!("repos: {}", none_or(&repo_text));
    println!("tasks: {}", none_or(&tasks));
    println!("notes: {notes}");
    println!("tools in the manual: {}", none_or(&tools));
    Ok(())
}

fn none_or(v: &[String]) -> String {
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

fn rm(desk: &Desk, yes: bool) -> Result<()> {
    if !yes {
        if !std::io::stdin().is_terminal() {
            bail!(
                "refusing to remove desk {} without confirmation (stdin is not a terminal); pass --yes",
                desk.agent()
            );
        }
        let open: Vec<String> = task::list(desk)
            .into_iter()
            .filter(|t| t.state.as_ref().is_some_and(|s| s.dirty_count() > 0))
            .map(|t| t.name)
            .collect();
        let warn = if open.is_empty() {
            String::new()
        } else {
            format!(" Tasks with uncommitted work: {}.", open.join(", "))
        };
        eprint!(
            "Remove desk {} at {} with all its repos, tasks and notes?{warn} [y/N] ",
            desk.agent(),
            desk.dir().display()
        );
        std::io::stderr().flush().ok();
        let mut answer = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut answer)
            .context("cannot read the answer")?;
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            bail!("desk {} not removed (answer was not yes)", desk.agent());
        }
    }
    let agent = desk.agent().to_owned();
    let path = desk.dir().to_path_buf();
    let freed = desk.clone().remove()?;
    println!(
        "removed desk {agent} at {} ({})",
        path.display(),
        human_size(freed)
    );
    Ok(())
}
