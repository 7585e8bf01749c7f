//! `deskfs-lossfs`: a power-loss FUSE file system for tests (in the manner of LazyFS).
//! A test tool, never shipped.
//!
//! A kill -9 test cannot show that what `fsync` returned survives a power loss: the
//! kernel's page cache survives the process. lossfs mirrors a backing directory at a mount
//! point, keeps in memory everything written through the mount that was not made durable,
//! and on a simulated power cut throws it away. Put deskfs's cache directory and SQLite
//! database on it, cut, and look at what is left.
//!
//! ```text
//! deskfs-lossfs serve --backing DIR --control SOCK MOUNTPOINT [--allow-other]
//! deskfs-lossfs ctl SOCK cut [--reorder SEED] | sync | image DEST [DIR...]
//!                        | fail-fsync PATTERN COUNT | fail-fsyncdir PATTERN COUNT | stats
//! ```
//!
//! # The model
//!
//! * **The disk** is the backing directory `DIR`: what is in it is what survived. lossfs
//!   writes to it only to make something durable; nothing else may change it while
//!   mounted. The mount shows the **volatile view**: the disk plus what is pending.
//! * **Data.** A write to a regular file goes to an in-memory overlay of whole 4 KiB pages
//!   of that inode (plus its pending size: truncates and extensions), never to the backing
//!   file. Reads return the backing content with the overlay applied (`overlay.rs`).
//!   `fsync`/`fdatasync` of a file writes its overlay and size into the backing file,
//!   `fsync`s/`fdatasync`s that, and clears the overlay. `close` makes nothing durable.
//! * **Namespace.** create, mknod, mkdir, symlink, link, unlink, rmdir, rename (with
//!   `RENAME_NOREPLACE` and `RENAME_EXCHANGE`) and setattr of mode/owner/times change the
//!   volatile view at once and are appended to an ordered log of pending operations.
//!   Operations become durable **in order, as a prefix of the log** — as a journaling
//!   file system (ext4 with a journal, data=ordered) commits metadata in order: making an
//!   operation durable makes every earlier one durable too. What makes them durable:
//!   - `fsyncdir` of a directory: the log up to the last operation that changes that
//!     directory's entries or is about the directory itself;
//!   - `fsync`/`fdatasync` of a file: the log up to the last operation about that inode
//!     (its creation, a link, unlink or rename of it, a chmod/chown/utimes of it) — the
//!     ext4 rule that an fsync of a new inode makes its directory entry durable too
//!     (`ext4_sync_parent`, or the journal commit that holds the create); then its data;
//!   - the `sync` control command: the whole log, then every file's data, then `syncfs`
//!     (FUSE does not forward `syncfs`/`sync(2)` to the daemon; hence the command.)
//! * **Power cut** (`cut`): every overlay and every pending operation is dropped; the
//!   volatile view is reloaded from the backing directory, with inode numbers never used
//!   before, so handles opened before the cut are stale: their reads, writes and fsyncs
//!   fail with `EIO` (their cached pages are invalidated), their stats with `ESTALE`.
//!   Between cuts an inode keeps its number (one per inode, never reused).
//! * **Crash image** (`image DEST [DIR...]`): what a power cut now would leave, without
//!   cutting: the backing directory is copied to `DEST/disk` (after each `DIR`, such as
//!   a `file://` bucket outside this file system, hard-linked to `DEST/<its name>`: its
//!   files must be replaced by rename, never changed in place), all under the
//!   model's lock, so nothing becomes durable during the copy. The workload goes on; a
//!   test restores an image into the backing directory and `cut`s to look at it later.
//!   Many cut points per workload run, for the price of a copy each.
//! * **Reordered power cut** (`cut --reorder SEED`): before dropping, as a disk may have
//!   written some unsynced state: a random prefix of the log (length uniform in
//!   `0..=pending`) is made durable; then, for each file with pending data that has a name
//!   on disk after that prefix (in path order), its size change is kept with probability 1/2 and each of
//!   its pending 4 KiB pages is kept with probability 1/2, independently. A kept page past
//!   the old end of file shows only if the size change is kept (as ext4 data=ordered only
//!   publishes a new `i_size` after the data). Pages are atomic: torn pages are not
//!   modelled. The generator is SplitMix64 seeded with SEED, so the same operations and
//!   seed keep the same things; the answer lists what was kept.
//! * **fsync errors** (`fail-fsync PATTERN COUNT`): the next COUNT `fsync`/`fdatasync` of
//!   files whose path (relative to the mount root, no leading `/`; `""` for a file with
//!   no name) matches PATTERN fail with `EIO`, and the file's unsynced data is dropped
//!   (size and pages revert to the backing file) — as Linux marks pages clean after a
//!   writeback error, so a later fsync succeeds without that data. The failed fsync makes
//!   no namespace operation durable. PATTERN is a glob if it has `*` or `?` (`*` matches
//!   any run of characters, `/` included; the whole path must match), else a substring.
//!   `fail-fsyncdir` does the same for `fsync` of directories (nothing is dropped: the
//!   pending operations stay pending).
//! * `fallocate`: mode 0 grows the file; `FALLOC_FL_KEEP_SIZE` alone does nothing;
//!   `PUNCH_HOLE|KEEP_SIZE` and `ZERO_RANGE` (± `KEEP_SIZE`) write zeros, as unsynced
//!   data like any write; other modes fail with `EOPNOTSUPP`. `SEEK_DATA`/`SEEK_HOLE` are
//!   the kernel's generic ones (the whole file is data).
//! * What is not modelled: xattrs (not supported: `EOPNOTSUPP`), file locks (the
//!   kernel's own, per mount), ext4's `auto_da_alloc` (a rename over a file does not flush
//!   the new file's data), torn pages, data of a file written after its last name on disk
//!   was removed (kept in memory, never persisted), pending pages of a file unlinked from
//!   the view and closed (dropped at once: a reordered cut cannot keep them), the backing
//!   file system's own crash
//!   behaviour (the backing directory is trusted to be durable once lossfs synced it),
//!   atime. Pending data is held in RAM (whole pages). After a cut, timestamps are the
//!   backing files' (a file's `fsync` gives its backing file the volatile mtime). Run as
//!   root to keep owners and write read-only backing files. A directory listing is the
//!   entries in name order, its offsets positions in that order (entries added or removed
//!   during a listing may shift it).
//!
//! # Kernel settings
//!
//! Attribute and entry TTLs are 0 and there is no writeback cache, so every write and
//! every lookup reaches the daemon; shared writable `mmap` (SQLite's `-shm`) works through
//! the page cache, the kernel writing dirty pages back as WRITE requests (before it sends
//! an `fsync`).
//!
//! `serve` runs in the foreground until the mount is unmounted or it gets SIGTERM/SIGINT
//! (then it unmounts).

mod control;
mod fs;
mod names;
mod overlay;
mod state;
mod util;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use clap::{Parser, Subcommand};
use fuser::{Config, MountOption, Session, SessionACL};
use nix::sys::signal::{self, SigSet, Signal};

/// A power-loss FUSE file system for tests.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Mount BACKING at MOUNTPOINT (foreground).
    Serve {
        /// The "disk": what is in it is what survived.
        #[arg(long, value_name = "DIR")]
        backing: PathBuf,
        /// Unix socket taking control commands (cut, sync, image, fail-fsync, stats).
        #[arg(long, value_name = "SOCK")]
        control: PathBuf,
        /// Where to mount (an existing directory).
        mountpoint: PathBuf,
        /// Let other users use the mount (`allow_other`).
        #[arg(long)]
        allow_other: bool,
        /// Threads serving kernel requests.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
        threads: u32,
    },
    /// Send one command to a running lossfs and print the answer (exit 1 on `error`).
    Ctl {
        /// The control socket.
        socket: PathBuf,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    match args.cmd {
        Cmd::Serve {
            backing,
            control,
            mountpoint,
            allow_other,
            threads,
        } => match serve(&backing, &control, &mountpoint, allow_other, threads) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("deskfs-lossfs: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Ctl { socket, command } => match control::client(&socket, &command.join(" ")) {
            Ok(answer) => {
                println!("{answer}");
                if answer.starts_with("ok") {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("deskfs-lossfs: {}: {e}", socket.display());
                ExitCode::FAILURE
            }
        },
    }
}

/// Raises the open file limit to its maximum (backing files are kept open).
fn raise_nofile() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid rlimit to fill in, then to read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

fn serve(
    backing: &Path,
    control: &Path,
    mountpoint: &Path,
    allow_other: bool,
    threads: u32,
) -> Result<(), String> {
    // Signals are taken with sigwait by this thread only: block them before any thread
    // exists (threads inherit the mask).
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR2] {
        sigs.add(s);
    }
    sigs.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    // Modes reach the backing directory as the kernel passed them (it applied the
    // caller's umask already).
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    raise_nofile();

    let backing = backing
        .canonicalize()
        .map_err(|e| format!("backing directory {}: {e}", backing.display()))?;
    let state = state::State::load_from(&backing)
        .map_err(|e| format!("cannot load {}: {e}", backing.display()))?;
    let state = Arc::new(Mutex::new(state));

    if let Ok(meta) = std::fs::symlink_metadata(control) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            let _ = std::fs::remove_file(control);
        }
    }
    let listener = std::os::unix::net::UnixListener::bind(control)
        .map_err(|e| format!("cannot bind {}: {e}", control.display()))?;
    // Only the owner may cut power.
    std::fs::set_permissions(control, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", control.display()))?;

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("lossfs".to_owned()),
        MountOption::Subtype("lossfs".to_owned()),
        MountOption::RW,
        MountOption::DefaultPermissions,
    ];
    config.acl = if allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads as usize);
    config.clone_fd = true;
    let mut session = Session::new(fs::LossFs::new(state.clone()), mountpoint, &config)
        .map_err(|e| format!("cannot mount at {}: {e}", mountpoint.display()))?;
    let notifier = session.notifier();
    let mut unmounter = session.unmount_callable();
    let control_state = state.clone();
    std::thread::Builder::new()
        .name("lossfs-control".into())
        .spawn(move || control::serve(listener, control_state, Some(notifier)))
        .map_err(|e| format!("cannot start the control thread: {e}"))?;
    let (done_tx, done_rx) = mpsc::channel();
    let serving = std::thread::Builder::new()
        .name("lossfs-session".into())
        .spawn(move || {
            let r = session.run();
            let _ = done_tx.send(r);
            // Wake the main thread's sigwait.
            let _ = signal::kill(nix::unistd::getpid(), Signal::SIGUSR2);
        })
        .map_err(|e| format!("cannot start the session thread: {e}"))?;
    eprintln!(
        "deskfs-lossfs: {} mounted at {} (control socket {})",
        backing.display(),
        mountpoint.display(),
        control.display()
    );

    let ended = loop {
        match sigs.wait() {
            Ok(Signal::SIGUSR2) => {
                if let Ok(r) = done_rx.try_recv() {
                    break Some(r);
                }
            }
            Ok(s) => {
                eprintln!("deskfs-lossfs: {s}: unmounting");
                if let Err(e) = unmounter.unmount() {
                    eprintln!("deskfs-lossfs: unmount failed ({e}); detaching");
                    let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
                }
                break done_rx.recv_timeout(Duration::from_secs(10)).ok();
            }
            Err(e) => return Err(format!("sigwait: {e}")),
        }
    };
    if ended.is_some() {
        let _ = serving.join();
    }
    let _ = std::fs::remove_file(control);
    eprintln!(
        "deskfs-lossfs: unmounted; pending at exit (lost): {}",
        fs::lock(&state).stats()
    );
    match ended {
        Some(Err(e)) => Err(format!("the session ended with an error: {e}")),
        _ => Ok(()),
    }
}
