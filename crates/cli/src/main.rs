//! The `deskfs` command: formats workspaces, mounts them, syncs and reports status.
//! Only wiring lives here; the file system is in the library crates.

pub(crate) mod attach;
mod control;
mod daemon;
mod desk_cmd;
mod desk_root;
mod doctor;
mod exec_cmd;
mod format;
mod fsck;
mod gen_cmd;
mod home;
mod journal_cmd;
mod keeper;
mod manual_cmd;
mod mcp_cmd;
mod metadb;
mod metrics;
mod mount_helper;
mod resume_cmd;
mod serve_cmd;
mod size;
mod status;
mod systemd_cmd;
mod task_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// deskfs — an object-storage bucket mounted as a persistent POSIX workspace.
#[derive(Parser, Debug)]
#[command(name = "deskfs", version, about, long_about = None, propagate_version = true)]
#[command(
    after_help = "Examples:\n  deskfs format work                      # embedded default: local bucket dir + SQLite\n  deskfs mount work ~/work                # daemonizes, returns once mounted\n  echo hi > ~/work/hello.txt && deskfs sync work\n  deskfs status --json\n  deskfs umount ~/work\n\nData lives under $DESKFS_HOME (default: $XDG_DATA_HOME/deskfs or ~/.local/share/deskfs)."
)]
struct Cli {
    /// Desk root for desk, task, resume, manual and exec (same as their own --root).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a workspace on a bucket (or on the embedded local default).
    #[command(
        after_help = "Examples:\n  deskfs format work\n  deskfs format work --bucket file:///srv/buckets/work\n  deskfs format work --meta postgres://deskfs@db:5432/work --bucket s3://b/work   # shared by hosts\n  AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\\n    deskfs format work --bucket s3://my-bucket/agents/work --endpoint http://127.0.0.1:3900 --region garage\n\nS3 settings also come from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and\nAWS_SECRET_ACCESS_KEY, else from the AWS_PROFILE profile of ~/.aws/credentials and ~/.aws/config. An existing prefix keeps its objects: they appear as files."
    )]
    Format(format::FormatArgs),
    /// Use an existing workspace on this machine: rebuild a SQLite workspace from its
    /// bucket (--bucket; e.g. after losing the machine that held it), or join one shared
    /// through PostgreSQL (--meta).
    #[command(
        after_help = "Examples:\n  deskfs attach work --bucket s3://my-bucket/agents/work     # rebuild from the bucket's metadata backup\n  deskfs attach work --bucket file:///mnt/volume/work --take-over   # the old machine is dead\n  export PGPASSWORD=...                    # or a line in ~/.pgpass\n  deskfs attach work --meta postgres://deskfs@db.internal:5432/work\n  deskfs mount work /mnt/work --cache-dir /nvme/deskfs-cache\n\nWith --bucket, the workspace's metadata is rebuilt from the newest backup in\n<prefix>/.deskfs/meta/ checked against the objects (a report lists anything that could not\nbe restored); it is refused while another machine has the workspace mounted. With --meta,\nthe bucket URL and settings come from the database. Credentials never come from the\nbucket or the database (AWS_* variables or --access-key/--secret-key here)."
    )]
    Attach(format::AttachArgs),
    /// Mount a workspace at MOUNTPOINT (daemonizes; returns once the mount is ready).
    #[command(
        after_help = "Examples:\n  deskfs mount work /mnt/work\n  deskfs mount work /mnt/work --cache-dir /nvme/deskfs-cache --cache-size 50G\n  deskfs mount work /mnt/work --durability bucket   # close/fsync return once in the bucket\n  deskfs mount work /mnt/work --foreground     # stay attached; logs to stderr"
    )]
    Mount(daemon::MountArgs),
    /// Unmount: commit open files, wait for pending uploads (at most --timeout, unless
    /// --no-wait), unmount.
    #[command(
        alias = "unmount",
        after_help = "Examples:\n  deskfs umount /mnt/work\n  deskfs umount /mnt/work --timeout 300\n  deskfs umount /mnt/work --no-wait   # uploads resume at the next mount or `deskfs sync`\n\nExit status: 0 unmounted with everything in the bucket; 3 unmounted, but uploads were\nstill pending after --timeout (they are safe in the local journal and resume at the next\nmount or `deskfs sync`); 1 not unmounted (e.g. files still open)."
    )]
    Umount(daemon::UmountArgs),
    /// Return once everything written before this command is in the bucket.
    #[command(
        after_help = "Examples:\n  deskfs sync work\n  deskfs sync work --timeout 600\n\nWith the workspace mounted, the mount's daemon does the uploads; unmounted, this\ncommand uploads what is pending itself."
    )]
    Sync(daemon::SyncArgs),
    /// Show workspaces, mounts, cache use, dirty data and pending/failed uploads.
    #[command(after_help = "Examples:\n  deskfs status\n  deskfs status work --json")]
    Status(status::StatusArgs),
    /// Check (and with --repair, fix) an unmounted workspace: metadata, namespace,
    /// staging files and the objects recorded in the bucket.
    #[command(
        after_help = "Examples:\n  deskfs fsck work\n  deskfs fsck work --repair\n  deskfs fsck work --check-bucket --json\n  deskfs fsck work --rebuild-from-bucket                  # replace meta.db from the bucket\n  deskfs fsck work --rebuild-from-bucket --ignore-backup  # from the objects alone\n\nExit status: 0 when no problem remains, 1 otherwise."
    )]
    Fsck(fsck::FsckArgs),
    /// Desks: an agent's durable workspace (repos, tasks, notes, tools, caches, manual).
    #[command(
        after_help = "Examples:\n  deskfs desk create alice                 # under desks/ on the mounted workspace\n  deskfs desk list\n  deskfs desk show alice\n  deskfs desk tidy alice --dry-run\n  deskfs desk rm alice --yes\n  deskfs --root /mnt/work/desks desk list   # or DESKFS_ROOT=/mnt/work/desks\n\nThe desk root is --root DIR, else $DESKFS_ROOT, else desks/ on the only mounted workspace."
    )]
    Desk(desk_cmd::DeskArgs),
    /// Tasks: one git worktree per task under the desk's tasks/.
    #[command(
        after_help = "Examples:\n  deskfs task start alice fix-login --repo webapp\n  deskfs task start alice review-42 --repo webapp --branch pr/42\n  deskfs task list alice\n  deskfs task finish alice fix-login --note \"merged upstream as #51\"\n  deskfs task finish alice spike --discard"
    )]
    Task(task_cmd::TaskArgs),
    /// What a session reads first: manual, open tasks and their state, newest notes, warnings.
    #[command(after_help = "Examples:\n  deskfs resume alice\n  deskfs resume alice --json")]
    Resume(resume_cmd::ResumeArgs),
    /// The desk manual's machine part: recorded tools and repo commands, and drift checks.
    #[command(
        after_help = "Examples:\n  deskfs manual record alice rg\n  deskfs manual record alice node --version-cmd 'node -v'\n  deskfs manual repo alice webapp --test-cmd 'npm test' --build-cmd 'npm run build'\n  deskfs manual check alice              # exit status 1 on drift"
    )]
    Manual(manual_cmd::ManualArgs),
    /// Run a command in a bubblewrap sandbox with the desk at /desk.
    #[command(
        after_help = "Examples:\n  deskfs exec alice -- cargo --version\n  deskfs exec alice --task fix-login -- npm test\n  deskfs exec alice --net none -- sh -c 'make && make check'\n  deskfs exec alice -e GITHUB_TOKEN -e RUST_LOG=debug -- cargo test\n\nInside: the desk at /desk (also HOME, so `git config --global` lands in /desk/.gitconfig),\nthe working dir /desk or /desk/tasks/TASK, system dirs read-only, /tmp private,\nPATH = /desk/tools/bin, the host's Rust toolchain (read-only), system dirs. The environment\nis built from scratch: caches on the desk (CARGO_HOME, npm_config_cache, PIP_CACHE_DIR,\nUV_CACHE_DIR, GOPATH under /desk/.cache), the caller's GIT_AUTHOR_*/GIT_COMMITTER_*, and\nwhat --env adds. No other desk, no deskfs data, no credentials.\n\nExit status: the command's (128 + signal when a signal killed it)."
    )]
    Exec(exec_cmd::ExecArgs),
    /// The execs recorded on a desk: command, exit, duration, files created/changed/deleted.
    #[command(
        after_help = "Examples:\n  deskfs journal alice\n  deskfs journal alice --task fix-login --files\n  deskfs journal alice --json --limit 5\n\nEvery `deskfs exec` (and exec over HTTP and MCP) appends one line to\n.desk/journal/<TASK>.jsonl (_desk.jsonl outside tasks); the files come from the\nmount's own change records. `deskfs resume` shows the last entries of each open task."
    )]
    Journal(journal_cmd::JournalArgs),
    /// Serve the desks over HTTP (the /v1 API; bearer tokens from `deskfs token`).
    #[command(
        after_help = "Examples:\n  deskfs serve                                  # 127.0.0.1:8765, desks/ of the mounted workspace\n  deskfs serve --listen 127.0.0.1:0 --root /mnt/work/desks\n  deskfs serve --socket /run/deskfs/desks.sock\n  deskfs serve --listen 0.0.0.0:8443 --tls-cert cert.pem --tls-key key.pem   # HTTPS only\n  TOKEN=$(deskfs token create alice)\n  curl -H \"Authorization: Bearer $TOKEN\" http://127.0.0.1:8765/v1/desks/alice/list\n\nThe API is described at GET /v1/openapi.json."
    )]
    Serve(serve_cmd::ServeArgs),
    /// Bearer tokens that open one desk over HTTP: create, list, revoke.
    #[command(
        after_help = "Examples:\n  deskfs token create alice --expires 7d\n  deskfs token create alice --read-only\n  deskfs token list\n  deskfs token revoke 3fa2c1"
    )]
    Token(serve_cmd::TokenArgs),
    /// Serve one desk's MCP tools over stdin/stdout (for a local MCP client).
    #[command(
        after_help = "Examples:\n  deskfs mcp alice\n  deskfs mcp alice --read-only\n  claude mcp add desk -- deskfs mcp alice\n\nTools: read_text_file, read_multiple_files, write_file, edit_file, create_directory,\nlist_directory, list_directory_with_sizes, directory_tree, move_file, search_files,\nget_file_info, list_allowed_directories (the desk is /desk), task_start, task_list,\ntask_finish, resume. The same tools are at /mcp of `deskfs serve` (bearer tokens)."
    )]
    Mcp(mcp_cmd::McpArgs),
    /// Check this machine (FUSE, fusermount3, kernel features, bubblewrap) and the
    /// workspaces (metadata, bucket and credentials, cache dir): what to fix before a mount.
    #[command(
        after_help = "Examples:\n  deskfs doctor\n  deskfs doctor work\n  deskfs doctor --json\n\nExit status: 0 when no check failed (warnings allowed), 1 otherwise."
    )]
    Doctor(doctor::DoctorArgs),
    /// Print a systemd service unit that mounts a workspace at boot and unmounts it at stop.
    #[command(
        after_help = "Examples:\n  deskfs systemd-unit work /mnt/work > /etc/systemd/system/deskfs-work.service\n  deskfs systemd-unit work /mnt/work --requires postgresql.service -- --cache-dir /var/cache/deskfs/work\n  systemctl daemon-reload && systemctl enable --now deskfs-work.service\n\nThe unit runs `deskfs mount --foreground` (Type=notify: started once mounted) and\n`deskfs umount` at stop (pending uploads waited for, at most --stop-timeout)."
    )]
    SystemdUnit(systemd_cmd::UnitArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  deskfs completions bash > /etc/bash_completion.d/deskfs\n  deskfs completions zsh > \"${fpath[1]}/_deskfs\"\n  deskfs completions fish > ~/.config/fish/completions/deskfs.fish"
    )]
    Completions(gen_cmd::CompletionsArgs),
    /// Print the man page deskfs(1), or write every page (one per subcommand) into a dir.
    #[command(
        after_help = "Examples:\n  deskfs man | man -l -\n  deskfs man --out-dir /usr/local/share/man/man1 && mandb"
    )]
    Man(gen_cmd::ManArgs),
    /// Run a mount daemon in the foreground (used by `mount`; not for direct use).
    #[command(hide = true)]
    Daemon(daemon::MountArgs),
}

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let helper = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == mount_helper::HELPER_NAME);
    if helper {
        // Run by mount(8) for type fuse.deskfs (an fstab line, `mount -t fuse.deskfs`).
        match mount_helper::translate(&args[1..]) {
            Ok(mount_helper::HelperCall::Fake) => return ExitCode::SUCCESS,
            Ok(mount_helper::HelperCall::Mount { argv, home }) => {
                if let Some(h) = home {
                    // No thread runs yet.
                    std::env::set_var("DESKFS_HOME", h);
                }
                args = argv;
            }
            Err(e) => {
                eprintln!("deskfs: error: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let log_to_stderr = !matches!(cli.cmd, Cmd::Daemon(_));
    if log_to_stderr && !matches!(cli.cmd, Cmd::Mount(_)) {
        // A command whose output goes to a closed pipe (`deskfs status | head`) ends
        // quietly, as Unix tools do, instead of panicking in `println!`. Not for the
        // daemon (or `mount --foreground`), which must never die of a client's pipe.
        // SAFETY: restoring the default disposition of one signal before any thread runs.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let json_logs = match &cli.cmd {
        Cmd::Mount(a) | Cmd::Daemon(a) => a.log_format == "json",
        _ => false,
    };
    init_tracing(log_to_stderr, json_logs);
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let res = match cli.cmd {
        Cmd::Format(a) => done(format::run(a)),
        Cmd::Attach(a) => done(format::attach(a)),
        Cmd::Mount(a) => done(daemon::mount(a)),
        Cmd::Daemon(a) => done(daemon::run_daemon(a)),
        Cmd::Umount(a) => done(daemon::umount(a)),
        Cmd::Sync(a) => done(daemon::sync(a)),
        Cmd::Status(a) => done(status::run(a)),
        Cmd::Fsck(a) => done(fsck::run(a)),
        Cmd::Desk(mut a) => {
            a.root.default_to(cli.root);
            done(desk_cmd::run(a))
        }
        Cmd::Task(mut a) => {
            a.root.default_to(cli.root);
            done(task_cmd::run(a))
        }
        Cmd::Resume(mut a) => {
            a.root.default_to(cli.root);
            done(resume_cmd::run(a))
        }
        Cmd::Manual(mut a) => {
            a.root.default_to(cli.root);
            done(manual_cmd::run(a))
        }
        Cmd::Serve(mut a) => {
            a.root.default_to(cli.root);
            done(serve_cmd::serve(a))
        }
        Cmd::Token(mut a) => {
            a.root.default_to(cli.root);
            done(serve_cmd::token(a))
        }
        Cmd::Mcp(mut a) => {
            a.root.default_to(cli.root);
            done(mcp_cmd::run(a))
        }
        Cmd::Journal(mut a) => {
            a.root.default_to(cli.root);
            done(journal_cmd::run(a))
        }
        Cmd::Doctor(a) => done(doctor::run(a)),
        Cmd::SystemdUnit(a) => done(systemd_cmd::run(a)),
        Cmd::Completions(a) => done(gen_cmd::completions(a, Cli::command())),
        Cmd::Man(a) => done(gen_cmd::man(a, Cli::command())),
        // The command's own exit status, passed through.
        Cmd::Exec(mut a) => {
            a.root.default_to(cli.root);
            exec_cmd::run(a).map(ExitCode::from)
        }
    };
    match res {
        Ok(code) => code,
        Err(e) if e.downcast_ref::<daemon::UnmountedWithPending>().is_some() => {
            eprintln!("deskfs: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            // One line: the error and its causes.
            let mut msg = e.to_string();
            for c in e.chain().skip(1) {
                let s = c.to_string();
                if !msg.contains(&s) {
                    msg.push_str(": ");
                    msg.push_str(&s);
                }
            }
            eprintln!("deskfs: error: {}", msg.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// A command line clap refuses: help and version print as clap prints them; a mistake is
/// one line on stderr (what is wrong, the usage when clap gives one), exit status 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let text = e.render().to_string();
    let mut what = Vec::new();
    let mut usage = None;
    for l in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(u) = l.strip_prefix("Usage:") {
            usage = Some(u.trim().to_string());
        } else if !l.starts_with("For more information") {
            what.push(l.trim_start_matches("error:").trim().to_string());
        }
    }
    let mut line = what.join(" ");
    if let Some(u) = usage {
        line.push_str(&format!(" (usage: {u})"));
    }
    eprintln!("deskfs: error: {line}");
    ExitCode::from(2)
}

/// Logs to stderr, filtered by `DESKFS_LOG` (default: warnings, and deskfs's own info);
/// `json`: one JSON object per line (`mount --log-format json`).
fn init_tracing(_stderr: bool, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DESKFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,deskfs=info,deskfs_vfs=info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = if json {
        fmt.json().try_init()
    } else {
        fmt.try_init()
    };
}

/// Absolute form of a user-given path (relative to the current directory).
pub(crate) fn absolute(p: &std::path::Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}
