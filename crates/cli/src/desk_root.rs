//! Where desks live: `--root DIR`, else `$DESKFS_ROOT`, else `desks/` on the mount of the
//! only mounted deskfs workspace. A root that is not on a deskfs mount works (plain
//! directories are fine for trying things out) but gets a one-line warning on stderr.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use deskfs_desk::Desk;

use crate::home::all_mounts;

/// The `--root` option shared by the desk commands.
#[derive(Args, Debug, Clone)]
pub struct RootArgs {
    /// Desk root: the directory holding one directory per agent (default: $DESKFS_ROOT,
    /// else `desks/` on the only mounted deskfs workspace).
    #[arg(long, global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
}

impl RootArgs {
    /// Uses `top` (the `--root` given before the subcommand) unless one was given after it.
    pub fn default_to(&mut self, top: Option<PathBuf>) {
        if self.root.is_none() {
            self.root = top;
        }
    }

    /// The desk root, resolved and checked (see the module doc).
    pub fn resolve(&self) -> Result<PathBuf> {
        let explicit = self.root.clone().or_else(|| {
            std::env::var_os("DESKFS_ROOT")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let root = match explicit {
            Some(r) => crate::absolute(&r),
            None => default_root()?,
        };
        if let Some(warning) = not_deskfs_warning(&root) {
            eprintln!("deskfs: warning: {warning}");
        }
        Ok(root)
    }

    /// Opens the desk of `agent` under the resolved root.
    pub fn open(&self, agent: &str) -> Result<Desk> {
        Ok(Desk::open(&self.resolve()?, agent)?)
    }
}

fn default_root() -> Result<PathBuf> {
    let mut mounts: Vec<(String, PathBuf)> = all_mounts()
        .into_iter()
        .map(|m| (m.workspace, m.mountpoint))
        .collect();
    mounts.sort();
    mounts.dedup_by(|a, b| a.1 == b.1);
    match mounts.as_slice() {
        [] => bail!("no desk root: no deskfs workspace is mounted; mount one (`deskfs mount NAME DIR`) or pass --root DIR (or set DESKFS_ROOT)"),
        [(_, mnt)] => Ok(mnt.join("desks")),
        several => {
            let choices: Vec<String> = several
                .iter()
                .map(|(ws, mnt)| format!("{ws} at {}", mnt.display()))
                .collect();
            bail!(
                "several deskfs workspaces are mounted ({}); choose the desk root with --root DIR or DESKFS_ROOT, e.g. --root {}",
                choices.join(", "),
                several[0].1.join("desks").display()
            )
        }
    }
}

use deskfs_fuse::mountinfo::{self, MountLine};

fn mount_table() -> Vec<MountLine> {
    mountinfo::read()
}

/// The nearest existing ancestor of `path` (itself included), resolved: where a path
/// that may not exist yet would live.
fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    let mut probe = path.to_path_buf();
    while !probe.exists() {
        probe = probe.parent()?.to_path_buf();
    }
    Some(std::fs::canonicalize(&probe).unwrap_or(probe))
}

/// The warning for a root not on a deskfs mount, or `None` when it is on one.
fn not_deskfs_warning(root: &Path) -> Option<String> {
    warning_for(root, &existing_ancestor(root)?, mount_table())
}

/// The deepest mount point holding `probe`; among equals the last one (later mounts
/// stack on earlier ones).
fn holding_mount(probe: &Path, mounts: Vec<MountLine>) -> Option<MountLine> {
    mounts
        .into_iter()
        .filter(|m| probe.starts_with(&m.point))
        .fold(None::<MountLine>, |best, m| match best {
            Some(b) if b.point.components().count() > m.point.components().count() => Some(b),
            _ => Some(m),
        })
}

/// The deskfs mount `path` (or its nearest existing ancestor, resolved) lies on: its
/// mount point and source (`deskfs:WORKSPACE`), or `None` when it is on another file
/// system.
pub(crate) fn on_deskfs_mount(path: &Path) -> Option<(PathBuf, String)> {
    holding_mount(&existing_ancestor(path)?, mount_table())
        .filter(MountLine::is_deskfs)
        .map(|m| (m.point, m.source))
}

/// The warning for `root` (resolved to the existing path `probe`) given the mount table.
fn warning_for(root: &Path, probe: &Path, mounts: Vec<MountLine>) -> Option<String> {
    let m = holding_mount(probe, mounts)?;
    if m.is_deskfs() {
        return None;
    }
    Some(format!(
        "desk root {} is not on a deskfs mount (it is on {} at {}): its desks are not kept in a bucket",
        root.display(),
        m.fstype,
        m.point.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
90 22 0:50 / /mnt/my\\040work rw,nosuid,nodev,relatime shared:50 - fuse deskfs:work rw,user_id=0,group_id=0
91 22 0:51 / /mnt/other rw,relatime shared:51 - tmpfs tmpfs rw
";

    #[test]
    fn finds_the_mount_of_a_root() {
        let m = mountinfo::parse(INFO.as_bytes());
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].point, Path::new("/mnt/my work"));
        assert_eq!(
            (m[1].fstype.as_str(), m[1].source.as_str()),
            ("fuse", "deskfs:work")
        );
        let root = Path::new("/mnt/my work/desks");
        assert_eq!(
            warning_for(root, root, mountinfo::parse(INFO.as_bytes())),
            None
        );
        let w = warning_for(
            Path::new("/mnt/other/d"),
            Path::new("/mnt/other"),
            mountinfo::parse(INFO.as_bytes()),
        );
        assert!(w.unwrap().contains("(it is on tmpfs at /mnt/other)"));
        let w = warning_for(
            Path::new("/srv/d"),
            Path::new("/srv"),
            mountinfo::parse(INFO.as_bytes()),
        );
        assert!(w.unwrap().contains("ext4 at /)"));
    }
}
