//! `deskfs manual check|record|repo`: the machine part of a desk's AGENTS.md.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use deskfs_desk::manual;

use crate::desk_root::RootArgs;

/// Arguments of `deskfs manual`.
#[derive(Args, Debug)]
pub struct ManualArgs {
    #[command(flatten)]
    pub root: RootArgs,
    #[command(subcommand)]
    pub cmd: ManualCmd,
}

/// `deskfs manual` subcommands.
#[derive(Subcommand, Debug)]
pub enum ManualCmd {
    /// Check the manual against the desk: each tool's version command prints the recorded
    /// version, each repo and its test/build programs exist. Exit status 1 on drift.
    #[command(
        after_help = "Examples:\n  deskfs manual check alice\n  deskfs manual check alice --json"
    )]
    Check {
        /// Agent name.
        agent: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Run a tool's version command now and record tool, version and command in the
    /// manual (the human part is kept byte for byte).
    #[command(
        after_help = "Examples:\n  deskfs manual record alice cargo\n  deskfs manual record alice node --version-cmd 'node -v'\n  apt-get install -y ripgrep && deskfs manual record alice rg\n\nThe version command runs inside the desk's exec sandbox (no network), as the agent\nwould see it: /desk/tools/bin first on PATH, the desk's caches, the host's Rust toolchain."
    )]
    Record {
        /// Agent name.
        agent: String,
        /// Tool name.
        tool: String,
        /// Shell command printing the version (default: the recorded one, else
        /// `TOOL --version`); runs with the desk's tools/bin first on PATH.
        #[arg(long, value_name = "CMD")]
        version_cmd: Option<String>,
    },
    /// Record how to test and build a repo under repos/.
    #[command(
        after_help = "Examples:\n  deskfs manual repo alice app --test-cmd 'cargo test' --build-cmd 'cargo build'"
    )]
    Repo {
        /// Agent name.
        agent: String,
        /// Repo name (directory under repos/).
        repo: String,
        /// Shell command running its tests.
        #[arg(long, value_name = "CMD")]
        test_cmd: Option<String>,
        /// Shell command building it.
        #[arg(long, value_name = "CMD")]
        build_cmd: Option<String>,
    },
}

/// Runs `deskfs manual ...`.
pub fn run(a: ManualArgs) -> Result<()> {
    match a.cmd {
        ManualCmd::Check { agent, json } => {
            let desk = a.root.open(&agent)?;
            let drift = manual::check(&desk)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({"drift": drift}))?
                );
            } else if drift.is_empty() {
                println!("manual of desk {agent} matches the desk");
            } else {
                for d in &drift {
                    println!("drift: {}: {}", d.subject, d.problem);
                }
            }
            if !drift.is_empty() {
                bail!(
                    "the manual of desk {agent} has {} drift item(s); fix the desk or re-record (`deskfs manual record {agent} TOOL`)",
                    drift.len()
                );
            }
            Ok(())
        }
        ManualCmd::Record {
            agent,
            tool,
            version_cmd,
        } => {
            let desk = a.root.open(&agent)?;
            let t = manual::record_tool(&desk, &tool, version_cmd.as_deref())?;
            println!(
                "recorded tool {}: {} (`{}`)",
                t.name, t.version, t.version_cmd
            );
            Ok(())
        }
        ManualCmd::Repo {
            agent,
            repo,
            test_cmd,
            build_cmd,
        } => {
            if test_cmd.is_none() && build_cmd.is_none() {
                bail!(
                    "nothing to record for repo {repo}: pass --test-cmd CMD and/or --build-cmd CMD"
                );
            }
            let desk = a.root.open(&agent)?;
            let r = manual::record_repo(&desk, &repo, test_cmd.as_deref(), build_cmd.as_deref())?;
            println!(
                "recorded repo {}: test `{}`, build `{}`",
                r.name,
                r.test_cmd.as_deref().unwrap_or("-"),
                r.build_cmd.as_deref().unwrap_or("-")
            );
            Ok(())
        }
    }
}
