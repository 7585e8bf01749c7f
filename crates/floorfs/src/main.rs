//! `deskfs-floorfs`: the benchmark's FUSE floor.
//!
//! A minimal FUSE file system with everything in memory — no durability, no database, no
//! bucket — that answers each kernel request as fast as it can, with the kernel settings
//! deskfs uses when it is a workspace's only mount (see `fs.rs`). What it costs on a
//! workload is what FUSE itself costs on this machine: the floor no FUSE file system goes
//! below, against which `scripts/bench.sh --targets local,floor,deskfs` measures deskfs.
//!
//! Data lives in RAM and is lost at unmount; with `--passthrough DIR` regular files keep
//! their bytes in files under `DIR/floorfs-<pid>/` (removed at exit) and are opened
//! through FUSE passthrough, as deskfs opens files whose content is local. It is a real
//! POSIX file system (good enough for git, tar, sqlite, pjdfstest), but never a deskfs
//! substitute.
//!
//! ```text
//! deskfs-floorfs /mnt/floor [--threads 4] [--passthrough /var/tmp/floor] [--stats FILE]
//! ```
//!
//! Runs in the foreground until the mount is unmounted (`fusermount3 -u`, `umount`) or it
//! gets SIGTERM/SIGINT (then it unmounts). SIGUSR1 writes the request counters to the
//! `--stats` file (`{"pid": …, "seq": n, "requests": {"lookup": [count, ns, 0], …}}`); at
//! exit they are written there and summed up on stderr.

mod data;
mod fs;
mod stats;
mod table;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use clap::Parser;
use fuser::{Config, MountOption, Session, SessionACL};
use nix::sys::signal::{self, SigSet, Signal};

/// The benchmark's FUSE floor: an in-memory file system (data is lost at unmount).
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Where to mount (an existing directory).
    mountpoint: PathBuf,
    /// Threads serving kernel requests (each with its own /dev/fuse fd), as deskfs's
    /// `--threads`.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    threads: u32,
    /// Keep regular files' bytes in files under DIR (a private subdirectory, removed at
    /// exit) and open them through FUSE passthrough (root, Linux >= 6.9), as deskfs does
    /// for files whose content is local. DIR must not be on a stacked file system.
    #[arg(long, value_name = "DIR")]
    passthrough: Option<PathBuf>,
    /// Time every request, and write the counters as JSON to FILE on SIGUSR1 and at exit.
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// Let other users use the mount (`allow_other`; pjdfstest needs it).
    #[arg(long)]
    allow_other: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("deskfs-floorfs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the counters to `path` (through a temporary file and a rename, so a reader
/// never sees half of it).
fn write_stats(path: &Path, seq: u64) -> std::io::Result<()> {
    let v = serde_json::json!({
        "pid": std::process::id(),
        "seq": seq,
        "requests": stats::snapshot(),
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, v.to_string())?;
    std::fs::rename(&tmp, path)
}

fn run(args: &Args) -> Result<(), String> {
    // Signals are taken with sigwait by this thread only: block them before any thread
    // exists (threads inherit the mask).
    let mut sigs = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        sigs.add(s);
    }
    sigs.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;

    if args.stats.is_some() {
        stats::enable_timing();
    }
    let backing = match &args.passthrough {
        Some(dir) => {
            let d = dir.join(format!("floorfs-{}", std::process::id()));
            std::fs::create_dir_all(&d)
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
            Some(d)
        }
        None => None,
    };
    let owner = table::Caller {
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
    };
    let fs = fs::FloorFs::new(table::Table::new(owner, backing.clone()), backing.is_some());

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("floorfs".to_owned()),
        MountOption::Subtype("floorfs".to_owned()),
        MountOption::RW,
        MountOption::DefaultPermissions,
    ];
    config.acl = if args.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(args.threads as usize);
    config.clone_fd = true;
    let mut session = Session::new(fs, &args.mountpoint, &config)
        .map_err(|e| format!("cannot mount at {}: {e}", args.mountpoint.display()))?;
    let mut unmounter = session.unmount_callable();
    let (done_tx, done_rx) = mpsc::channel();
    let serving = std::thread::Builder::new()
        .name("floorfs-session".into())
        .spawn(move || {
            let r = session.run();
            let _ = done_tx.send(r);
            // Wake the main thread's sigwait.
            let _ = signal::kill(nix::unistd::getpid(), Signal::SIGUSR2);
        })
        .map_err(|e| format!("cannot start the session thread: {e}"))?;
    eprintln!(
        "deskfs-floorfs: mounted at {} ({} threads{})",
        args.mountpoint.display(),
        args.threads,
        backing
            .as_ref()
            .map(|d| format!(", passthrough files in {}", d.display()))
            .unwrap_or_default()
    );

    let mut seq = 0u64;
    let ended = loop {
        match sigs.wait() {
            Ok(Signal::SIGUSR1) => {
                seq += 1;
                if let Some(p) = &args.stats {
                    if let Err(e) = write_stats(p, seq) {
                        eprintln!("deskfs-floorfs: cannot write {}: {e}", p.display());
                    }
                }
            }
            Ok(Signal::SIGUSR2) => {
                if let Ok(r) = done_rx.try_recv() {
                    break Some(r);
                }
            }
            Ok(s) => {
                eprintln!("deskfs-floorfs: {s}: unmounting");
                if let Err(e) = unmounter.unmount() {
                    eprintln!("deskfs-floorfs: unmount failed ({e}); detaching");
                    let _ = nix::mount::umount2(&args.mountpoint, nix::mount::MntFlags::MNT_DETACH);
                }
                break done_rx.recv_timeout(Duration::from_secs(10)).ok();
            }
            Err(e) => return Err(format!("sigwait: {e}")),
        }
    };
    if ended.is_some() {
        let _ = serving.join();
    }
    if let Some(p) = &args.stats {
        if let Err(e) = write_stats(p, seq + 1) {
            eprintln!("deskfs-floorfs: cannot write {}: {e}", p.display());
        }
    }
    eprint!(
        "deskfs-floorfs: unmounted; requests served:\n{}",
        stats::summary()
    );
    if let Some(d) = &backing {
        let _ = std::fs::remove_dir_all(d);
    }
    match ended {
        Some(Err(e)) => Err(format!("the session ended with an error: {e}")),
        _ => Ok(()),
    }
}
