//! The deskfs data directory: workspaces, their configuration and live mount records.
//!
//! ```text
//! $DESKFS_HOME/workspaces/NAME/workspace.toml   bucket URL, metadata URL, S3 settings (0600)
//!                              meta.db          SQLite metadata (embedded default)
//!                              bucket/          local bucket (embedded default)
//!                              cache/           default cache dir (staging + blocks)
//!                              run/PID.json     one record per live mount (+ PID.sock)
//!                              logs/            daemon logs
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Root of deskfs data: `$DESKFS_HOME`, else `$XDG_DATA_HOME/deskfs`, else
/// `~/.local/share/deskfs`.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("DESKFS_HOME").filter(|v| !v.is_empty()) {
        return crate::absolute(Path::new(&h));
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("deskfs");
    }
    let base = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    base.join(".local/share/deskfs")
}

/// Directory of workspace `name`.
pub fn ws_dir(name: &str) -> PathBuf {
    home().join("workspaces").join(name)
}

/// Checks a workspace name: 1–64 of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !name.starts_with(['.', '-']);
    if !ok {
        bail!("invalid workspace name {name:?}: use 1-64 letters, digits, '.', '_' or '-' (not starting with '.' or '-')");
    }
    Ok(())
}

/// `workspace.toml`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkspaceConfig {
    /// Workspace name.
    pub name: String,
    /// Bucket URL (`s3://…`, `gs://…`, `az://…`, `file:///…`).
    pub bucket: String,
    /// Metadata URL (`sqlite:///abs/path.db` or `postgres://user@host:port/db`, never
    /// with a password).
    pub meta: String,
    /// S3 endpoint, if set at format time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// S3 region, if set at format time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Access key given with `--access-key` (env vars win when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key: Option<String>,
    /// Secret key given with `--secret-key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key: Option<String>,
    /// Creation time, seconds since the epoch.
    pub created: u64,
}

impl WorkspaceConfig {
    /// Loads workspace `name`. Errors name the known workspaces.
    pub fn load(name: &str) -> Result<WorkspaceConfig> {
        check_name(name)?;
        let path = ws_dir(name).join("workspace.toml");
        if !path.exists() {
            let known = list_workspaces().unwrap_or_default();
            let hint = if known.is_empty() {
                "no workspaces exist yet".to_string()
            } else {
                format!("known: {}", known.join(", "))
            };
            bail!(
                "no workspace named {name:?} in {} ({hint}); create it with `deskfs format {name}`",
                home().display()
            );
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        toml::from_str(&text).with_context(|| {
            format!(
                "{} is not a valid workspace config; fix or re-run `deskfs format {name} --force`",
                path.display()
            )
        })
    }

    /// Writes `workspace.toml` atomically with mode 0600 (it may hold keys).
    pub fn save(&self) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = ws_dir(&self.name);
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(".workspace.toml.tmp");
        let text = toml::to_string_pretty(self)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join("workspace.toml"))?;
        Ok(())
    }

    /// The bucket spec with the stored S3 settings applied.
    pub fn bucket_spec(&self) -> Result<deskfs_bucket::BucketSpec> {
        let mut spec = deskfs_bucket::BucketSpec::parse(&self.bucket)?;
        spec.endpoint = self.endpoint.clone();
        spec.region = self.region.clone();
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            spec.access_key = self.access_key.clone();
            spec.secret_key = self.secret_key.clone();
        }
        Ok(spec)
    }
}

/// Names of all formatted workspaces.
pub fn list_workspaces() -> Result<Vec<String>> {
    let dir = home().join("workspaces");
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            if e.path().join("workspace.toml").exists() {
                if let Some(n) = e.file_name().to_str() {
                    v.push(n.to_string());
                }
            }
        }
    }
    v.sort();
    Ok(v)
}

/// A live mount, recorded by its daemon in `run/PID.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountRecord {
    /// Workspace name.
    pub workspace: String,
    /// Daemon PID.
    pub pid: u32,
    /// Mount point (absolute).
    pub mountpoint: PathBuf,
    /// Control socket.
    pub socket: PathBuf,
    /// Cache directory.
    pub cache_dir: PathBuf,
    /// Daemon log file, if daemonized.
    #[serde(default)]
    pub log: Option<PathBuf>,
    /// The mount's device number (`major`, `minor`) in `/proc/self/mountinfo`: what
    /// `umount` checks is still on top of the mount point before unmounting.
    #[serde(default)]
    pub dev: Option<(u32, u32)>,
}

impl MountRecord {
    /// Path of the record of `pid` in workspace `name`.
    pub fn path(name: &str, pid: u32) -> PathBuf {
        ws_dir(name).join("run").join(format!("{pid}.json"))
    }
}

/// Whether process `pid` is stopped (by SIGSTOP, SIGTSTP or a debugger: state `T` or
/// `t` in `/proc/PID/stat`); `false` when it is running or gone.
pub fn pid_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
    })
}

/// Whether process `pid` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 (after the parenthesised command name) is the state; Z = zombie.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(true),
        Err(_) => false,
    }
}

/// Live mounts of workspace `name` (records of dead daemons are removed).
pub fn mounts_of(name: &str) -> Vec<MountRecord> {
    let dir = ws_dir(name).join("run");
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return v;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        let Ok(rec) = serde_json::from_str::<MountRecord>(&text) else {
            continue;
        };
        if pid_alive(rec.pid) {
            v.push(rec);
        } else {
            let _ = std::fs::remove_file(&p);
            let _ = std::fs::remove_file(&rec.socket);
        }
    }
    v.sort_by_key(|r| r.pid);
    v
}

/// All live mounts of all workspaces.
pub fn all_mounts() -> Vec<MountRecord> {
    list_workspaces()
        .unwrap_or_default()
        .iter()
        .flat_map(|n| mounts_of(n))
        .collect()
}

/// Whether `path` is currently a mount point (per `/proc/self/mountinfo`).
pub fn is_mountpoint(path: &Path) -> bool {
    deskfs_fuse::mountinfo::top_at(path).is_some()
}

/// `path` made absolute with its longest existing ancestor resolved (symlinks, `.`,
/// `..`), the components that do not exist yet appended lexically (a `..` among them
/// drops the component before it). Two spellings of one place resolve alike, whether or
/// not the place exists yet (a cache dir is created at the first mount).
pub fn resolve(path: &Path) -> PathBuf {
    use std::path::Component;
    let abs = crate::absolute(path);
    let comps: Vec<Component> = abs.components().collect();
    for k in (1..=comps.len()).rev() {
        let head: PathBuf = comps[..k].iter().collect();
        if let Ok(mut out) = std::fs::canonicalize(&head) {
            for c in &comps[k..] {
                match c {
                    Component::ParentDir => {
                        out.pop();
                    }
                    Component::Normal(n) => out.push(n),
                    _ => {}
                }
            }
            return out;
        }
    }
    abs
}

/// Whether one of two resolved paths is the other or lies inside it (whole components:
/// `/a/bc` is not inside `/a/b`).
pub fn nested(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// A fresh, empty temp dir for unit test `what` (removed by the test at its end).
#[cfg(test)]
pub(crate) fn test_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("deskfs-unit-{}-{what}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn resolve_follows_links_and_keeps_missing_tails() {
        let t = test_dir("resolve");
        let real = std::fs::canonicalize(&t).unwrap();
        std::fs::create_dir(real.join("d")).unwrap();
        std::os::unix::fs::symlink(real.join("d"), real.join("link")).unwrap();
        assert_eq!(resolve(&real.join("link/x/y")), real.join("d/x/y"));
        assert_eq!(resolve(&real.join("d/../d/./x")), real.join("d/x"));
        assert_eq!(resolve(&real.join("no/../d/x")), real.join("d/x"));
        assert_eq!(resolve(Path::new("/")), PathBuf::from("/"));
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn nested_compares_whole_components() {
        assert!(nested(Path::new("/a/b"), Path::new("/a/b")));
        assert!(nested(Path::new("/a/b/c"), Path::new("/a/b")));
        assert!(nested(Path::new("/a"), Path::new("/a/b")));
        assert!(!nested(Path::new("/a/bc"), Path::new("/a/b")));
        assert!(!nested(Path::new("/a/b"), Path::new("/c")));
    }
}
