//! `deskfs doctor`: checks a machine before its first mount, and a workspace before use,
//! and says what to fix — one line per check, `FAIL` lines naming the problem and the
//! fix. Exit status 1 when any check failed (warnings do not fail).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;

use crate::home::{list_workspaces, ws_dir, WorkspaceConfig};

/// Arguments of `deskfs doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Check this workspace only (default: the machine and every workspace of this home).
    pub name: Option<String>,
    /// Machine-readable output: `{"checks": [{"what", "verdict", "detail"}], "failed": N}`.
    #[arg(long)]
    pub json: bool,
}

/// How a check came out.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Works.
    Ok,
    /// Works, with a limit worth knowing (slower, a feature off).
    Warn,
    /// Does not work: what depends on it fails. The detail names the fix.
    Fail,
}

/// One check: what was looked at, its verdict, and a line saying what was found (for a
/// failure: the problem and the fix).
#[derive(Serialize, Debug, Clone)]
pub struct Check {
    /// What was checked (`fuse device`, `workspace work: bucket`, …).
    pub what: String,
    /// Its verdict.
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
}

impl Check {
    fn new(what: impl Into<String>, verdict: Verdict, detail: impl Into<String>) -> Check {
        Check {
            what: what.into(),
            verdict,
            detail: detail.into(),
        }
    }
}

/// Runs `deskfs doctor`. Errors: a workspace name that does not exist; any failed check
/// (after all were printed).
pub fn run(a: DoctorArgs) -> Result<()> {
    let names = match &a.name {
        Some(n) => {
            WorkspaceConfig::load(n)?;
            vec![n.clone()]
        }
        None => list_workspaces().unwrap_or_default(),
    };
    let mut checks = machine_checks();
    if !names.is_empty() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        for n in &names {
            checks.extend(workspace_checks(n, &rt));
        }
    }
    let failed = checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"checks": checks, "failed": failed}))?
        );
    } else {
        let width = checks.iter().map(|c| c.what.len()).max().unwrap_or(0);
        for c in &checks {
            let v = match c.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            println!("{v}  {:width$}  {}", c.what, c.detail);
        }
    }
    if failed > 0 {
        bail!("{failed} check(s) failed: see the FAIL line(s) above for each problem and its fix");
    }
    Ok(())
}

/// The machine's checks: FUSE, the helpers deskfs runs, kernel features, the sandbox.
fn machine_checks() -> Vec<Check> {
    let root = nix::unistd::geteuid().is_root();
    vec![
        fuse_device(),
        fusermount(),
        allow_other(root),
        passthrough(root),
        bubblewrap(),
    ]
}

/// `/dev/fuse`: a character device this user can open read-write.
fn fuse_device() -> Check {
    use std::os::unix::fs::FileTypeExt;
    const WHAT: &str = "fuse device";
    match std::fs::metadata("/dev/fuse") {
        Err(_) => Check::new(WHAT, Verdict::Fail, "/dev/fuse is missing: load the fuse module (modprobe fuse); in a container, pass the device in (docker run --device /dev/fuse --cap-add SYS_ADMIN)"),
        Ok(m) if !m.file_type().is_char_device() => {
            Check::new(WHAT, Verdict::Fail, "/dev/fuse is not a character device: remove it and load the fuse module (modprobe fuse)")
        }
        Ok(_) => match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
            Ok(_) => Check::new(WHAT, Verdict::Ok, "/dev/fuse (character device, read-write)"),
            Err(e) => Check::new(WHAT, Verdict::Fail, format!("cannot open /dev/fuse read-write ({e}): give this user access (chmod 0666 /dev/fuse, as most distributions ship it)")),
        },
    }
}

/// `fusermount3` on PATH: unprivileged mounts and every unmount by another user go
/// through it.
fn fusermount() -> Check {
    match find_on_path("fusermount3") {
        Some(p) => Check::new("fusermount3", Verdict::Ok, p.display().to_string()),
        None => Check::new(
            "fusermount3",
            Verdict::Fail,
            "fusermount3 is not on PATH: install fuse3 (apt-get install -y fuse3; dnf install fuse3); unprivileged mounts and `deskfs umount` need it",
        ),
    }
}

/// `user_allow_other` in `/etc/fuse.conf`, which `deskfs mount --allow-other` needs when
/// not run as root.
fn allow_other(root: bool) -> Check {
    const WHAT: &str = "allow_other";
    if root {
        return Check::new(
            WHAT,
            Verdict::Ok,
            "root: --allow-other needs no fuse.conf setting",
        );
    }
    let set = std::fs::read_to_string("/etc/fuse.conf").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split('#').next().unwrap_or("").trim() == "user_allow_other")
    });
    if set {
        Check::new(
            WHAT,
            Verdict::Ok,
            "user_allow_other is set in /etc/fuse.conf",
        )
    } else {
        Check::new(WHAT, Verdict::Warn, "user_allow_other is not set in /etc/fuse.conf: `deskfs mount --allow-other` (other users reading the mount) fails until it is added")
    }
}

/// FUSE passthrough (Linux >= 6.9, CAP_SYS_ADMIN): files whose content is local are read
/// and written by the kernel without the daemon.
fn passthrough(root: bool) -> Check {
    const WHAT: &str = "fuse passthrough";
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    let version: Vec<u32> = release
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|p| p.parse().ok())
        .collect();
    let new_enough = matches!(version.as_slice(), [major, minor] if (*major, *minor) >= (6, 9));
    match (new_enough, root) {
        (true, true) => Check::new(WHAT, Verdict::Ok, format!("kernel {release} (>= 6.9), root: cached files are served by the kernel")),
        (true, false) => Check::new(WHAT, Verdict::Warn, format!("kernel {release} has it, but it needs CAP_SYS_ADMIN: mounted by this user, cached files are served by the daemon (slower)")),
        (false, _) => Check::new(WHAT, Verdict::Warn, format!("kernel {release:?} is older than 6.9: no FUSE passthrough, cached files are served by the daemon (slower)")),
    }
}

/// bubblewrap on PATH and able to make the namespaces `deskfs exec` runs commands in.
fn bubblewrap() -> Check {
    const WHAT: &str = "bubblewrap";
    let bwrap = match deskfs_sandbox::check_bwrap() {
        Ok(p) => p,
        Err(_) => {
            return Check::new(WHAT, Verdict::Fail, "bubblewrap (bwrap) is not on PATH: install it (apt-get install -y bubblewrap); `deskfs exec` and exec over HTTP/MCP need it");
        }
    };
    let out = std::process::Command::new(&bwrap)
        .args([
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "true",
        ])
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => Check::new(WHAT, Verdict::Ok, format!("{} (namespaces work)", bwrap.display())),
        Ok(o) => Check::new(WHAT, Verdict::Fail, format!(
            "{} cannot make a sandbox ({}): enable unprivileged user namespaces (sysctl -w kernel.unprivileged_userns_clone=1, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0) or run as root",
            bwrap.display(),
            String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or("no message").trim()
        )),
        Err(e) => Check::new(WHAT, Verdict::Fail, format!("cannot run {} ({e}): reinstall bubblewrap", bwrap.display())),
    }
}

/// A workspace's checks: its metadata database, its bucket (reachable, credentials
/// accepted) and its default cache dir's file system and free space.
fn workspace_checks(name: &str, rt: &tokio::runtime::Runtime) -> Vec<Check> {
    let what = |w: &str| format!("workspace {name}: {w}");
    let cfg = match WorkspaceConfig::load(name) {
        Ok(c) => c,
        Err(e) => return vec![Check::new(what("config"), Verdict::Fail, format!("{e:#}"))],
    };
    let mut v = Vec::new();
    v.push(
        match crate::metadb::MetaUrl::parse(&cfg.meta).and_then(|u| u.open().map(|_| u)) {
            Ok(u) => Check::new(what("metadata"), Verdict::Ok, u.display()),
            Err(e) => Check::new(
                what("metadata"),
                Verdict::Fail,
                format!("cannot open the metadata database: {e:#}"),
            ),
        },
    );
    v.push(bucket_check(&cfg, rt, what("bucket")));
    v.push(cache_dir_check(
        &ws_dir(name).join("cache"),
        what("cache dir"),
    ));
    v
}

/// The bucket answers a one-page listing within 10 s with the credentials this machine
/// has.
fn bucket_check(cfg: &WorkspaceConfig, rt: &tokio::runtime::Runtime, what: String) -> Check {
    let bucket = match cfg
        .bucket_spec()
        .and_then(|s| Ok(deskfs_bucket::Bucket::open(&s, false)?))
    {
        Ok(b) => b,
        Err(e) => return Check::new(what, Verdict::Fail, format!("bucket {}: {e:#}", cfg.bucket)),
    };
    match rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), bucket.check()).await })
    {
        Ok(Ok(())) => Check::new(what, Verdict::Ok, format!("{} answers", cfg.bucket)),
        Ok(Err(e)) => Check::new(what, Verdict::Fail, format!("bucket {}: {e}", cfg.bucket)),
        Err(_) => Check::new(
            what,
            Verdict::Fail,
            format!(
                "bucket {} did not answer within 10 s: check the endpoint and the network",
                cfg.bucket
            ),
        ),
    }
}

/// The cache dir (or, before the first mount, its nearest existing parent): on a local
/// disk file system with room. FUSE (a cache on a deskfs mount, say) fails; tmpfs and
/// little free space warn.
fn cache_dir_check(dir: &Path, what: String) -> Check {
    use nix::sys::statfs::{statfs, FUSE_SUPER_MAGIC, TMPFS_MAGIC};
    let mut at = dir.to_path_buf();
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p.to_path_buf(),
            None => break,
        }
    }
    let (fs, vfs) = match (statfs(&at), nix::sys::statvfs::statvfs(&at)) {
        (Ok(f), Ok(v)) => (f, v),
        (Err(e), _) | (_, Err(e)) => {
            return Check::new(
                what,
                Verdict::Fail,
                format!("cannot look at {} ({e})", at.display()),
            )
        }
    };
    let free = vfs.blocks_available().saturating_mul(vfs.fragment_size());
    let gib = free as f64 / f64::from(1u32 << 30);
    if fs.filesystem_type() == FUSE_SUPER_MAGIC {
        return Check::new(what, Verdict::Fail, format!("{} is on a FUSE file system: put the cache on a local disk (deskfs mount --cache-dir DIR)", dir.display()));
    }
    if fs.filesystem_type() == TMPFS_MAGIC {
        return Check::new(what, Verdict::Warn, format!("{} is on tmpfs ({gib:.1} GiB free): files not yet uploaded are lost with a reboot; use --cache-dir on a disk", dir.display()));
    }
    if free < 1 << 30 {
        return Check::new(what, Verdict::Warn, format!("{}: only {gib:.2} GiB free; writes fail with ENOSPC once it is full (clean cached data is evicted first)", dir.display()));
    }
    Check::new(
        what,
        Verdict::Ok,
        format!("{} ({gib:.1} GiB free)", dir.display()),
    )
}

/// The first executable file named `name` in the directories of `PATH` (the desk
/// layer's lookup, as a command run on the desk would find it).
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    deskfs_desk::shell::find_program(name, Path::new("/"), &path)
}
