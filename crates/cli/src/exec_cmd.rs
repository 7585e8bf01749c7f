//! `deskfs exec AGENT [--task TASK] [--net none|host] -- CMD...`: runs CMD in a
//! bubblewrap sandbox with the desk at `/desk` (see the deskfs-sandbox crate). Exits with
//! the command's exit code (128 + signal when a signal killed it).

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use deskfs_desk::worktree::{self, Health};
use deskfs_desk::{names, task};
use deskfs_sandbox::{Net, SandboxSpec, DESK_MOUNT};

use crate::desk_root::RootArgs;
use crate::home::{all_mounts, list_workspaces, WorkspaceConfig};

/// Network choice on the command line.
#[derive(ValueEnum, Clone, Copy, Debug, Default)]
pub enum NetArg {
    /// The host's network.
    #[default]
    Host,
    /// No network (loopback only).
    None,
}

/// Arguments of `deskfs exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub root: RootArgs,
    /// Agent name.
    pub agent: String,
    /// Run in the task's worktree (/desk/tasks/TASK) instead of /desk.
    #[arg(long)]
    pub task: Option<String>,
    /// Network access inside.
    #[arg(long, value_enum, default_value_t = NetArg::Host)]
    pub net: NetArg,
    /// Extra environment variable for the command: `VAR=VALUE`, or `VAR` to pass the
    /// caller's value (repeatable). Names starting with AWS_, GOOGLE_, GCLOUD_, AZURE_ or
    /// DESKFS_ are refused (the sandbox never sees credentials).
    #[arg(long = "env", short = 'e', value_name = "VAR[=VALUE]")]
    pub env: Vec<String>,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// Host paths of deskfs's own data outside `$DESKFS_HOME` (which the sandbox always
/// hides): mount cache dirs, metadata databases and local bucket dirs placed elsewhere.
/// `deskfs exec` and `deskfs serve`'s exec hide them.
pub(crate) fn private_paths() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = all_mounts().into_iter().map(|m| m.cache_dir).collect();
    for name in list_workspaces().unwrap_or_default() {
        let Ok(cfg) = WorkspaceConfig::load(&name) else {
            continue;
        };
        if let Some(db) = crate::metadb::MetaUrl::parse(&cfg.meta)
            .ok()
            .and_then(|u| u.sqlite_path().cloned())
        {
            v.push(db);
        }
        if let Some(dir) = cfg.bucket.strip_prefix("file://") {
            v.push(PathBuf::from(dir));
        }
    }
    v.sort();
    v.dedup();
    v
}

/// Git identity variables passed through when the caller has them set (the sandbox's
/// HOME is the desk, so `git config --global` inside writes `/desk/.gitconfig`).
const GIT_IDENTITY: &[&str] = &[
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
];

/// The caller's git identity variables that are set (`deskfs serve` gives them to every
/// command it runs, as `deskfs exec` does).
pub(crate) fn git_identity() -> Vec<(String, String)> {
    GIT_IDENTITY
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
        .collect()
}

/// The extra environment of the command: git identity from the caller, then `--env`.
/// Errors: `--env VAR` naming a variable the caller does not have, an empty name.
fn exec_env(args: &[String]) -> Result<Vec<(OsString, OsString)>> {
    let mut env: Vec<(OsString, OsString)> = GIT_IDENTITY
        .iter()
        .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v)))
        .collect();
    for a in args {
        let (k, v) = match a.split_once('=') {
            Some((k, v)) => (k.to_owned(), OsString::from(v)),
            None => match std::env::var_os(a) {
                Some(v) => (a.clone(), v),
                None => bail!(
                    "--env {a}: the variable is not set here; give a value with --env {a}=VALUE"
                ),
            },
        };
        if k.is_empty() {
            bail!("--env {a}: empty variable name; use --env NAME=VALUE");
        }
        env.retain(|(n, _)| n != k.as_str());
        env.push((OsString::from(k), v));
    }
    Ok(env)
}

/// Runs `deskfs exec`; the exit code to leave with.
pub fn run(a: ExecArgs) -> Result<u8> {
    deskfs_sandbox::check_bwrap()?;
    let desk = a.root.open(&a.agent)?;
    task::repair_links(&desk);
    let workdir = match &a.task {
        None => PathBuf::from(DESK_MOUNT),
        Some(t) => {
            names::check_task(t)?;
            let dir = desk.task_dir(t);
            if !dir.is_dir() {
                return Err(deskfs_desk::DeskError::UnknownTask {
                    agent: desk.agent().to_owned(),
                    task: t.clone(),
                    known: desk.task_names(),
                }
                .into());
            }
            let h = worktree::health(&dir);
            if !matches!(h, Health::Ok { .. }) {
                bail!(
                    "task {t} is not a working git worktree ({}); see `deskfs resume {}`",
                    task::health_text(&h),
                    desk.agent()
                );
            }
            PathBuf::from(DESK_MOUNT).join("tasks").join(t)
        }
    };
    let spec = SandboxSpec {
        desk_dir: desk.dir().to_path_buf(),
        workdir,
        net: match a.net {
            NetArg::Host => Net::Host,
            NetArg::None => Net::None,
        },
        env: exec_env(&a.env)?,
        // A path holding the desk cannot be hidden from it (e.g. a plain-directory root
        // inside a local bucket dir); the sandbox still shows only the desk itself.
        hide: private_paths()
            .into_iter()
            .filter(|p| !desk.dir().starts_with(p))
            .collect(),
    };
    // The task journal: the mount's changes under the desk, before and after (what the
    // sandbox makes on the desk is made first, so it is not the command's).
    deskfs_sandbox::prepare_desk(desk.dir())?;
    let (watch, start, t0) = (
        crate::journal_cmd::watch_desk(&desk),
        std::time::SystemTime::now(),
        std::time::Instant::now(),
    );
    let code = deskfs_sandbox::run(&spec, &a.cmd)?;
    let task = a.task.as_deref();
    crate::journal_cmd::record_cli_exec(&desk, task, &a.cmd, start, t0.elapsed(), code, watch);
    Ok(u8::try_from(code.clamp(0, 255)).unwrap_or(255))
}
