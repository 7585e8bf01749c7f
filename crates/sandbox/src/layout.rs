//! The sandbox's filesystem: which host paths appear where, and what is masked.
//!
//! ```text
//! /usr /etc /opt            host, read-only (secrets in /etc masked, see ETC_SECRETS)
//! /bin /sbin /lib*          symlinks into /usr (merged /usr) or read-only binds
//! /proc                     the sandbox's own; sysctls and kernel knobs read-only/masked
//! /dev                      bwrap's minimal /dev (null, zero, random, tty, pts), read-only
//! /dev/shm, /tmp            fresh tmpfs each (the only writable places besides /desk)
//! /toolchain/rustup         host RUSTUP_HOME, read-only (when there is one)
//! /toolchain/cargo/bin      host CARGO_HOME/bin, read-only (rustup proxies; not CARGO_HOME
//!                           itself, which holds crates.io credentials)
//! /desk                     the desk, read-write
//! /desk/.desk               the desk's own records (task records, the task journal,
//!                           locks), read-only: kept by deskfs, never by the agent
//! ```
//! Nothing else of the host is visible: no /root, /home, /work, /var, /run, /sys, no
//! other desk, no deskfs data directory. Host paths that would otherwise show through one
//! of the read-only binds (a desk root or `DESKFS_HOME` under `/opt`, the caller's
//! [`crate::SandboxSpec::hide`] list) are covered by an empty read-only tmpfs (directories)
//! or `/dev/null` (files).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use crate::env::ToolchainEnv;
use crate::host::Host;
use crate::{Net, DESK_MOUNT};

/// Host directories bound read-only at the same path when present.
const SYSTEM_DIRS: &[&str] = &["/usr", "/etc", "/opt"];
/// Top-level names that are symlinks into /usr on merged-/usr systems, directories on
/// others.
const ROOT_LINKS: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// Files and directories in /etc that hold secrets readable by uid 0 (the sandbox keeps
/// the caller's uid; it drops capabilities, not ownership). Masked when present.
const ETC_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
    "/etc/ipsec.secrets",
    "/etc/ppp/chap-secrets",
    "/etc/ppp/pap-secrets",
    "/etc/NetworkManager/system-connections",
];
/// Parts of /proc a process with uid 0 could write even without capabilities (sysctls
/// such as `kernel.core_pattern`, the magic SysRq trigger): bound read-only.
const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "bus", "fs", "irq"];
/// Parts of /proc that reveal host kernel state: masked (the same list container
/// runtimes use).
const PROC_MASKED: &[&str] = &[
    "acpi",
    "scsi",
    "kcore",
    "keys",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
];

/// The directory of the desk that deskfs keeps for itself (task records, the task
/// journal, locks; `deskfs_desk`'s layout): bound read-only over its place in the desk.
pub(crate) const DESK_STATE: &str = ".desk";

/// In-sandbox home of the host's rustup directory when it is not under a bound dir.
pub(crate) const TOOLCHAIN_RUSTUP: &str = "/toolchain/rustup";
/// In-sandbox home of the host's cargo bin directory when it is not under a bound dir.
pub(crate) const TOOLCHAIN_CARGO_BIN: &str = "/toolchain/cargo/bin";

/// A host directory visible in the sandbox.
#[derive(Debug)]
struct View {
    /// Canonical host path.
    host: PathBuf,
    /// Where it appears inside.
    inside: PathBuf,
    /// The desk itself (hiding an ancestor of the desk never hides the desk).
    desk: bool,
}

impl View {
    /// Where host path `p` (canonical) appears through this view, if it does.
    fn map(&self, p: &Path) -> Option<PathBuf> {
        let rel = p.strip_prefix(&self.host).ok()?;
        Some(if rel.as_os_str().is_empty() {
            self.inside.clone()
        } else {
            self.inside.join(rel)
        })
    }
}

/// The mount options for bwrap and the toolchain paths they make available.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    /// bwrap arguments, in order.
    pub args: Vec<OsString>,
    /// In-sandbox paths of the host's Rust toolchain.
    pub toolchain: ToolchainEnv,
}

impl Layout {
    fn arg(&mut self, parts: &[&dyn AsRef<std::ffi::OsStr>]) {
        self.args
            .extend(parts.iter().map(|p| p.as_ref().to_os_string()));
    }
}

/// Plans the sandbox's filesystem for the desk at `desk` (canonical host path).
pub(crate) fn plan(desk: &Path, net: Net, hide: &[PathBuf], host: &Host) -> Layout {
    let mut out = Layout::default();
    let mut views: Vec<View> = Vec::new();

    let usr = std::fs::canonicalize("/usr").ok();
    for dir in SYSTEM_DIRS {
        if let Ok(canon) = std::fs::canonicalize(dir) {
            if canon.is_dir() {
                out.arg(&[&"--ro-bind", &canon, dir]);
                views.push(View {
                    host: canon,
                    inside: PathBuf::from(dir),
                    desk: false,
                });
            }
        }
    }
    for name in ROOT_LINKS {
        let Ok(meta) = std::fs::symlink_metadata(name) else {
            continue;
        };
        let Ok(canon) = std::fs::canonicalize(name) else {
            continue;
        };
        let into_usr = usr.as_ref().is_some_and(|u| canon.starts_with(u));
        match std::fs::read_link(name) {
            Ok(target) if meta.file_type().is_symlink() && into_usr => {
                out.arg(&[&"--symlink", &target, name]);
            }
            _ if canon.is_dir() => {
                out.arg(&[&"--ro-bind", &canon, name]);
                views.push(View {
                    host: canon,
                    inside: PathBuf::from(name),
                    desk: false,
                });
            }
            _ => {}
        }
    }

    out.arg(&[&"--proc", &"/proc"]);
    for name in PROC_READ_ONLY {
        let p = Path::new("/proc").join(name);
        if p.exists() {
            out.arg(&[&"--ro-bind", &p, &p]);
        }
    }
    for name in PROC_MASKED {
        let p = Path::new("/proc").join(name);
        if let Ok(meta) = std::fs::metadata(&p) {
            mask(&mut out, &p, meta.is_dir());
        }
    }
    // /dev read-only except its shared-memory tmpfs (POSIX shm, Python multiprocessing)
    out.arg(&[
        &"--dev",
        &"/dev",
        &"--tmpfs",
        &"/dev/shm",
        &"--remount-ro",
        &"/dev",
    ]);
    out.arg(&[&"--tmpfs", &"/tmp"]);

    if net == Net::Host {
        resolv_conf(&mut out, &views);
    }
    toolchain(&mut out, &mut views, host);

    out.arg(&[&"--bind", &desk, &DESK_MOUNT]);
    // The desk's records and its task journal, written by deskfs after each command, are
    // the agent's to read, never to forge: bound read-only over their place. A write,
    // create, delete or rename under it fails with EROFS, and renaming or removing
    // `/desk/.desk` itself (to put a fake in its place) with EBUSY, a mount point.
    // `build` made sure it is a real directory of the desk (not a symlink out of it).
    let state = Path::new(DESK_MOUNT).join(DESK_STATE);
    out.arg(&[&"--ro-bind", &desk.join(DESK_STATE), &state]);
    views.push(View {
        host: desk.to_path_buf(),
        inside: PathBuf::from(DESK_MOUNT),
        desk: true,
    });

    // What must not show through the views above: (host path, whether hiding it may hide
    // a whole view that lies inside it).
    let mut secrets: Vec<(PathBuf, bool)> = ETC_SECRETS
        .iter()
        .map(|p| (PathBuf::from(p), true))
        .collect();
    if let Ok(entries) = std::fs::read_dir("/etc/ssh") {
        secrets.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("ssh_host_") && n.ends_with("_key"))
                })
                .map(|p| (p, true)),
        );
    }
    secrets.extend(host.deskfs_home().map(|p| (p, true)));
    // the desk root, i.e. the other desks; only where it shows through a view (a desk
    // right under / must not mask the system dirs)
    secrets.extend(desk.parent().map(|p| (p.to_path_buf(), false)));
    secrets.extend(hide.iter().map(|p| (p.clone(), true)));

    let mut masks: Vec<(PathBuf, bool)> = Vec::new();
    for (secret, whole_views) in &secrets {
        let Ok(canon) = std::fs::canonicalize(secret) else {
            continue; // not there, nothing to hide
        };
        let is_dir = canon.is_dir();
        for view in &views {
            if *whole_views && !view.desk && view.host.starts_with(&canon) {
                masks.push((view.inside.clone(), true));
            } else if let Some(inside) = view.map(&canon) {
                if !(view.desk && inside == Path::new(DESK_MOUNT)) {
                    masks.push((inside, is_dir));
                }
            }
        }
    }
    // a mask inside another masked directory would need a mount point the empty tmpfs
    // does not have (and is hidden anyway)
    masks.sort();
    masks.dedup();
    let mut kept: Vec<(PathBuf, bool)> = Vec::new();
    for (path, is_dir) in masks {
        if kept.iter().any(|(k, k_dir)| *k_dir && path.starts_with(k)) {
            continue;
        }
        kept.push((path, is_dir));
    }
    for (path, is_dir) in kept {
        mask(&mut out, &path, is_dir);
    }
    // the root itself is bwrap's tmpfs: read-only too
    out.arg(&[&"--remount-ro", &"/"]);
    out
}

/// Covers `inside` with an empty read-only tmpfs (directory) or `/dev/null` (anything
/// else).
fn mask(out: &mut Layout, inside: &Path, is_dir: bool) {
    if is_dir {
        out.arg(&[&"--tmpfs", &inside, &"--remount-ro", &inside]);
    } else {
        out.arg(&[&"--ro-bind", &"/dev/null", &inside]);
    }
}

/// With systemd-resolved, /etc/resolv.conf is a symlink into /run, which is not bound:
/// bind its target read-only at the path the link names so name resolution works.
fn resolv_conf(out: &mut Layout, views: &[View]) {
    let link = Path::new("/etc/resolv.conf");
    let Ok(target) = std::fs::read_link(link) else {
        return; // a plain file (or none): /etc covers it
    };
    let Ok(canon) = std::fs::canonicalize(link) else {
        return; // dangling
    };
    if views.iter().any(|v| canon.starts_with(&v.host)) {
        return;
    }
    let named = normalize(&Path::new("/etc").join(target));
    out.arg(&[&"--ro-bind", &canon, &named]);
}

/// The host's Rust toolchain (rustup and its proxies), offered read-only: a coding agent
/// expects `cargo` to work. `RUSTUP_HOME` or `~/.rustup`, and `CARGO_HOME/bin` or
/// `~/.cargo/bin` (only `bin`: `CARGO_HOME` also holds the registry token). Installing
/// another toolchain inside fails (read-only); the desk's own crates cache is on the desk.
fn toolchain(out: &mut Layout, views: &mut Vec<View>, host: &Host) {
    let home = host.home();
    let cargo_bin = host
        .path_var("CARGO_HOME")
        .or_else(|| home.as_ref().map(|h| h.join(".cargo")))
        .map(|c| c.join("bin"))
        .and_then(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p.join("cargo").is_file());
    let Some(cargo_bin) = cargo_bin else {
        return;
    };
    let rustup = host
        .path_var("RUSTUP_HOME")
        .or_else(|| home.as_ref().map(|h| h.join(".rustup")))
        .and_then(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p.join("toolchains").is_dir());

    let mut offer = |host_dir: PathBuf, fallback: &str| -> PathBuf {
        if let Some(inside) = views.iter().find_map(|v| v.map(&host_dir)) {
            return inside;
        }
        out.arg(&[&"--ro-bind", &host_dir, &fallback]);
        views.push(View {
            host: host_dir,
            inside: PathBuf::from(fallback),
            desk: false,
        });
        PathBuf::from(fallback)
    };
    let rustup_home = rustup.map(|r| offer(r, TOOLCHAIN_RUSTUP));
    let cargo_bin = offer(cargo_bin, TOOLCHAIN_CARGO_BIN);
    out.toolchain = ToolchainEnv {
        rustup_home,
        cargo_bin: Some(cargo_bin),
    };
}

/// `p` with `.` and `..` resolved lexically (no symlinks followed).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn normalize_resolves_dots() {
        assert_eq!(
            normalize(Path::new("/etc/../run/./systemd/resolve/x")),
            PathBuf::from("/run/systemd/resolve/x")
        );
    }

    #[test]
    fn desk_bound_last_before_masks_and_nothing_else_of_home() {
        let desk = tempfile::tempdir().unwrap();
        let canon = std::fs::canonicalize(desk.path()).unwrap();
        let l = plan(&canon, Net::Host, &[], &Host::default());
        let a = pairs(&l.args);
        let bind = a.iter().position(|x| x == "--bind").unwrap();
        assert_eq!(a[bind + 1], canon.to_string_lossy());
        assert_eq!(a[bind + 2], "/desk");
        assert_eq!(a.iter().filter(|x| *x == "--bind").count(), 1, "{a:?}");
        for forbidden in ["/root", "/home", "/work", "/var", "/run", "/sys"] {
            assert!(!a.iter().any(|x| x == forbidden), "{forbidden} in {a:?}");
        }
    }

    #[test]
    fn desk_state_is_bound_read_only_over_the_desk() {
        // `.desk` (task records, the task journal, locks) read-only right after the
        // read-write bind of the desk, so it lies on top of it
        let desk = tempfile::tempdir().unwrap();
        let canon = std::fs::canonicalize(desk.path()).unwrap();
        let a = pairs(&plan(&canon, Net::None, &[], &Host::default()).args);
        let bind = a.iter().position(|x| x == "--bind").unwrap();
        assert_eq!(
            a[bind + 3..bind + 6],
            [
                "--ro-bind".to_string(),
                canon.join(".desk").to_string_lossy().into_owned(),
                "/desk/.desk".to_string()
            ],
            "{a:?}"
        );
        // and nothing binds it (or anything else over /desk) writable afterwards
        assert!(
            !a[bind + 6..].iter().any(|x| x.starts_with("/desk")),
            "{a:?}"
        );
    }

    #[test]
    fn hide_under_a_read_only_view_is_masked_and_nested_masks_collapse() {
        // /usr/share is bound read-only through /usr: hiding it masks it, and hiding a
        // path below it adds nothing more
        let desk = tempfile::tempdir().unwrap();
        let canon = std::fs::canonicalize(desk.path()).unwrap();
        let hide = [PathBuf::from("/usr/share"), PathBuf::from("/usr/share/doc")];
        let a = pairs(&plan(&canon, Net::None, &hide, &Host::default()).args);
        let tmpfs: Vec<_> = a
            .windows(2)
            .filter(|w| w[0] == "--tmpfs")
            .map(|w| w[1].clone())
            .collect();
        assert!(tmpfs.contains(&"/usr/share".to_string()), "{a:?}");
        assert!(!tmpfs.contains(&"/usr/share/doc".to_string()), "{a:?}");
    }
}
