//! The desk on disk: its directories, `desk.toml`, creation (atomic), listing, removal.
//!
//! ```text
//! <root>/<AGENT>/
//!   desk.toml          format version, agent name, creation time
//!   AGENTS.md          the manual: a human part and a machine part (see `manual`)
//!   CLAUDE.md          symlink -> AGENTS.md (one file for every agent that reads either)
//!   repos/NAME/        long-lived clones
//!   tasks/TASK/        one git worktree per task (`task start`), never the shared checkout
//!   notes/             notes to the next session (task summaries land here too)
//!   tools/bin/         the desk's own tools (on PATH for exec and manual commands)
//!   tmp/               scratch; `desk tidy` removes files older than a day
//!   .cache/{cargo,npm,pip,uv,go}/ package caches kept on the desk
//!   .desk/locks/       lock files (task start/finish, per-repo git work, manual edits)
//!   .desk/tasks/T.toml task records (repo, branch, base commit, start/finish times)
//!   .desk/journal/T.jsonl the task journal: one line per exec (`_desk.jsonl`: outside tasks)
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{DeskError, IoContext, Result};
use crate::fsutil::{atomic_write, now_secs, remove_path, tree_size};
use crate::names::check_agent;

/// The on-disk format this build writes and reads.
pub const FORMAT: u32 = 1;

/// Package caches kept on the desk: (directory under `.cache/`, environment variable that
/// points the tool at it).
pub const CACHES: [(&str, &str); 5] = [
    ("cargo", "CARGO_HOME"),
    ("npm", "npm_config_cache"),
    ("pip", "PIP_CACHE_DIR"),
    ("uv", "UV_CACHE_DIR"),
    ("go", "GOPATH"),
];

const DIRS: [&str; 12] = [
    "repos",
    "notes",
    "tasks",
    "tools/bin",
    "tmp",
    ".cache/cargo",
    ".cache/npm",
    ".cache/pip",
    ".cache/uv",
    ".cache/go",
    ".desk/locks",
    ".desk/tasks",
];

/// `desk.toml`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeskMeta {
    /// On-disk format version ([`FORMAT`]).
    pub format: u32,
    /// The agent the desk belongs to.
    pub agent: String,
    /// Creation time, seconds since the epoch.
    pub created: u64,
    /// What made it (`deskfs-desk VERSION`).
    #[serde(default)]
    pub created_by: String,
}

/// A desk that exists: `<root>/<agent>`.
#[derive(Clone, Debug)]
pub struct Desk {
    agent: String,
    dir: PathBuf,
    meta: DeskMeta,
}

impl Desk {
    /// Opens the desk of `agent` under `root`. The directory is canonicalized, so paths
    /// derived from it are what git and the kernel report.
    ///
    /// # Errors
    /// [`DeskError::InvalidAgent`], [`DeskError::UnknownAgent`] (naming the desks that do
    /// exist), [`DeskError::NotADesk`] when `desk.toml` is missing, unreadable or newer.
    pub fn open(root: &Path, agent: &str) -> Result<Desk> {
        check_agent(agent)?;
        let dir = root.join(agent);
        if !dir.is_dir() {
            return Err(DeskError::UnknownAgent {
                agent: agent.to_owned(),
                root: root.to_path_buf(),
                known: list(root)?.into_iter().map(|d| d.agent).collect(),
            });
        }
        let dir = fs::canonicalize(&dir).ctx("resolve", &dir)?;
        // The desk's own directories must be directories, not symlinks: an agent can plant
        // symlinks from inside `deskfs exec`, and host-side commands (tidy, task, notes,
        // locks) must never write or delete through them outside the desk.
        for sub in [
            "repos",
            "notes",
            "tasks",
            "tools",
            "tools/bin",
            "tmp",
            ".cache",
            ".desk",
            ".desk/locks",
            ".desk/tasks",
            ".desk/journal",
        ] {
            let p = dir.join(sub);
            if fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(DeskError::io(
                    "use",
                    &p,
                    std::io::Error::other(format!(
                        "it is a symlink (planted from inside exec?); desk commands refuse to follow it: remove it (`rm {}`) and run `mkdir {}`",
                        p.display(),
                        p.display()
                    )),
                ));
            }
        }
        for (cache, _) in CACHES {
            let p = dir.join(".cache").join(cache);
            if fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(DeskError::io(
                    "use",
                    &p,
                    std::io::Error::other(format!(
                        "it is a symlink (planted from inside exec?); desk commands refuse to follow it: remove it (`rm {}`)",
                        p.display()
                    )),
                ));
            }
        }
        let meta = read_meta(&dir)?;
        Ok(Desk {
            agent: agent.to_owned(),
            dir,
            meta,
        })
    }

    /// Creates the desk of `agent` under `root` (made if missing). The tree is built in a
    /// hidden temp dir next to it and renamed into place, so a failure or crash never
    /// leaves a half-made desk under the agent's name.
    ///
    /// # Errors
    /// [`DeskError::InvalidAgent`], [`DeskError::DeskExists`], I/O errors.
    pub fn create(root: &Path, agent: &str) -> Result<Desk> {
        check_agent(agent)?;
        fs::create_dir_all(root).ctx("create desk root", root)?;
        let target = root.join(agent);
        if fs::symlink_metadata(&target).is_ok() {
            return Err(DeskError::DeskExists {
                agent: agent.to_owned(),
                path: target,
            });
        }
        let tmp = root.join(format!(".{agent}.creating.{}", std::process::id()));
        remove_path(&tmp)?;
        let built = build(&tmp, agent).and_then(|()| rename_noreplace(&tmp, &target));
        if let Err(e) = built {
            let _ = remove_path(&tmp);
            return Err(match e {
                DeskError::Io { ref source, .. }
                    if matches!(
                        source.raw_os_error(),
                        Some(libc::EEXIST) | Some(libc::ENOTEMPTY)
                    ) =>
                {
                    DeskError::DeskExists {
                        agent: agent.to_owned(),
                        path: target,
                    }
                }
                e => e,
            });
        }
        Desk::open(root, agent)
    }

    /// Removes the desk: renamed to a hidden name first (so it vanishes at once), then
    /// deleted. Returns the bytes freed.
    ///
    /// # Errors
    /// I/O errors (a partly deleted tree stays under the hidden name).
    pub fn remove(self) -> Result<u64> {
        let parent = self.dir.parent().unwrap_or(Path::new("/"));
        let gone = parent.join(format!(".{}.removing.{}", self.agent, std::process::id()));
        fs::rename(&self.dir, &gone).ctx("rename", &self.dir)?;
        let size = tree_size(&gone);
        remove_path(&gone)?;
        Ok(size)
    }

    /// The agent name.
    pub fn agent(&self) -> &str {
        &self.agent
    }
    /// The desk directory (canonical, absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// `desk.toml` contents.
    pub fn meta(&self) -> &DeskMeta {
        &self.meta
    }
    /// `repos/`.
    pub fn repos_dir(&self) -> PathBuf {
        self.dir.join("repos")
    }
    /// `tasks/`.
    pub fn tasks_dir(&self) -> PathBuf {
        self.dir.join("tasks")
    }
    /// `notes/`.
    pub fn notes_dir(&self) -> PathBuf {
        self.dir.join("notes")
    }
    /// `tools/bin/`.
    pub fn tools_bin(&self) -> PathBuf {
        self.dir.join("tools/bin")
    }
    /// `tmp/`.
    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }
    /// `.cache/`.
    pub fn cache_root(&self) -> PathBuf {
        self.dir.join(".cache")
    }
    /// `AGENTS.md`.
    pub fn manual_path(&self) -> PathBuf {
        self.dir.join("AGENTS.md")
    }
    /// `CLAUDE.md`.
    pub fn claude_path(&self) -> PathBuf {
        self.dir.join("CLAUDE.md")
    }
    /// `.desk/locks/`.
    pub fn locks_dir(&self) -> PathBuf {
        self.dir.join(".desk/locks")
    }
    /// `.desk/tasks/` (task records).
    pub fn records_dir(&self) -> PathBuf {
        self.dir.join(".desk/tasks")
    }
    /// Directory of task `task` (not checked).
    pub fn task_dir(&self, task: &str) -> PathBuf {
        self.tasks_dir().join(task)
    }
    /// Directory of repo `repo` (not checked).
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.repos_dir().join(repo)
    }

    /// Names of the directories under `repos/`, sorted.
    pub fn repo_names(&self) -> Vec<String> {
        dir_names(&self.repos_dir())
    }
    /// Names of the directories under `tasks/` (dot entries skipped), sorted.
    pub fn task_names(&self) -> Vec<String> {
        dir_names(&self.tasks_dir())
    }

    /// Environment for host-side checks of this desk (finding a repo's test program):
    /// `tools/bin` first on `PATH`, package caches on the desk. The sandbox sets the same
    /// variables with `/desk` paths.
    pub fn command_env(&self) -> Vec<(String, std::ffi::OsString)> {
        let mut path = std::ffi::OsString::from(self.tools_bin());
        if let Some(p) = std::env::var_os("PATH").filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(p);
        }
        let mut env = vec![("PATH".to_owned(), path)];
        for (dir, var) in CACHES {
            env.push((var.to_owned(), self.cache_root().join(dir).into_os_string()));
        }
        env
    }
}

/// A desk found by [`list`].
#[derive(Clone, Debug, Serialize)]
pub struct DeskEntry {
    /// Agent name (directory name).
    pub agent: String,
    /// Desk directory.
    pub path: PathBuf,
    /// Creation time (seconds since the epoch), when `desk.toml` is readable.
    pub created: Option<u64>,
}

/// The desks under `root`, sorted by agent. Hidden entries (temp dirs of a create or remove
/// in progress) and directories without `desk.toml` are skipped. A missing root is empty.
///
/// # Errors
/// I/O errors reading an existing root.
pub fn list(root: &Path) -> Result<Vec<DeskEntry>> {
    let rd = match fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DeskError::io("read", root, e)),
    };
    let mut v = Vec::new();
    for e in rd.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if check_agent(&name).is_err() || !e.path().join("desk.toml").is_file() {
            continue;
        }
        let created = read_meta(&e.path()).ok().map(|m| m.created);
        v.push(DeskEntry {
            agent: name,
            path: e.path(),
            created,
        });
    }
    v.sort_by(|a, b| a.agent.cmp(&b.agent));
    Ok(v)
}

/// Largest `desk.toml` read, bytes.
const MAX_DESK_TOML: u64 = 64 * 1024;

fn read_meta(dir: &Path) -> Result<DeskMeta> {
    let p = dir.join("desk.toml");
    let not_a_desk = |reason: String| DeskError::NotADesk {
        path: dir.to_path_buf(),
        reason,
    };
    // The agent can change its desk from inside `exec`: desk.toml is read only as a
    // small regular file (never through a symlink, never a FIFO or device, which would
    // block or never end).
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&p)
            .map_err(|e| not_a_desk(format!("cannot read desk.toml: {e}")))?
    };
    let md = file
        .metadata()
        .map_err(|e| not_a_desk(format!("cannot read desk.toml: {e}")))?;
    if !md.is_file() || md.len() > MAX_DESK_TOML {
        return Err(not_a_desk(format!(
            "desk.toml is not a regular file of at most {MAX_DESK_TOML} bytes"
        )));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(&file, MAX_DESK_TOML), &mut text)
        .map_err(|e| not_a_desk(format!("cannot read desk.toml: {e}")))?;
    let meta: DeskMeta = toml::from_str(&text).map_err(|e| DeskError::NotADesk {
        path: dir.to_path_buf(),
        reason: format!("desk.toml is invalid: {}", e.message()),
    })?;
    if meta.format > FORMAT {
        return Err(DeskError::NotADesk {
            path: dir.to_path_buf(),
            reason: format!(
                "desk.toml has format {} but this deskfs reads up to {FORMAT}; upgrade deskfs",
                meta.format
            ),
        });
    }
    Ok(meta)
}

fn build(tmp: &Path, agent: &str) -> Result<()> {
    fs::create_dir(tmp).ctx("create", tmp)?;
    for d in DIRS {
        let p = tmp.join(d);
        fs::create_dir_all(&p).ctx("create", &p)?;
    }
    let meta = DeskMeta {
        format: FORMAT,
        agent: agent.to_owned(),
        created: now_secs(),
        created_by: format!("deskfs-desk {}", env!("CARGO_PKG_VERSION")),
    };
    let text = toml::to_string(&meta).map_err(|e| DeskError::Encode {
        path: tmp.join("desk.toml"),
        reason: e.to_string(),
    })?;
    atomic_write(&tmp.join("desk.toml"), text.as_bytes())?;
    atomic_write(
        &tmp.join("AGENTS.md"),
        crate::manual::template(agent).as_bytes(),
    )?;
    let claude = tmp.join("CLAUDE.md");
    std::os::unix::fs::symlink("AGENTS.md", &claude).ctx("create symlink", &claude)?;
    Ok(())
}

/// `rename(2)` that fails with EEXIST when `to` exists (`renameat2` with
/// `RENAME_NOREPLACE`); falls back to a plain rename (which still refuses a non-empty
/// target directory) on file systems without the flag.
fn rename_noreplace(from: &Path, to: &Path) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| {
            DeskError::io(
                "rename",
                p,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"),
            )
        })
    };
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them as given.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(DeskError::io(
                    "rename into",
                    to,
                    std::io::Error::from_raw_os_error(libc::EEXIST),
                ));
            }
            fs::rename(from, to).ctx("rename into", to)
        }
        _ => Err(DeskError::io("rename into", to, e)),
    }
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_open_list_remove() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("desks");
        let d = Desk::create(&root, "alice").unwrap();
        for sub in DIRS {
            assert!(d.dir().join(sub).is_dir(), "{sub}");
        }
        assert_eq!(
            fs::read_link(d.claude_path()).unwrap(),
            Path::new("AGENTS.md")
        );
        assert!(fs::read_to_string(d.claude_path())
            .unwrap()
            .contains("alice"));
        assert_eq!(d.meta().agent, "alice");
        let e = Desk::create(&root, "alice").unwrap_err();
        assert!(matches!(e, DeskError::DeskExists { .. }), "{e}");
        Desk::create(&root, "bob").unwrap();
        let names: Vec<_> = list(&root).unwrap().into_iter().map(|d| d.agent).collect();
        assert_eq!(names, ["alice", "bob"]);
        let e = Desk::open(&root, "carol").unwrap_err().to_string();
        assert!(e.contains("known: alice, bob"), "{e}");
        assert!(Desk::open(&root, "../x").is_err());
        d.remove().unwrap();
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1, "only bob is left");
    }

    /// A listing: a missing root is empty, a root that cannot be read is an error, and
    /// only directories named as agents holding a `desk.toml` are desks (of any size up
    /// to the limit: a long comment is fine).
    #[test]
    fn list_shows_only_desks() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("desks");
        assert!(list(&root).unwrap().is_empty(), "a missing root");
        fs::write(t.path().join("file"), b"x").unwrap();
        assert!(
            list(&t.path().join("file")).is_err(),
            "a root that is a file"
        );
        let d = Desk::create(&root, "alice").unwrap();
        let toml = d.dir().join("desk.toml");
        let mut text = fs::read_to_string(&toml).unwrap();
        text.push_str(&format!("# {}\n", "x".repeat(4000)));
        fs::write(&toml, text).unwrap();
        fs::create_dir(root.join("nodesk")).unwrap();
        fs::create_dir(root.join(".hidden")).unwrap();
        fs::copy(&toml, root.join(".hidden/desk.toml")).unwrap();
        let got = list(&root).unwrap();
        assert_eq!(
            got.iter().map(|e| e.agent.as_str()).collect::<Vec<_>>(),
            ["alice"]
        );
        assert!(got[0].created.is_some(), "its desk.toml was read");
    }

    /// `desk.toml` is read when it is a regular file of at most [`MAX_DESK_TOML`] bytes in
    /// a format this deskfs knows; anything else is "not a desk", with the reason.
    #[test]
    fn desk_toml_is_read_only_when_small_regular_and_known() {
        let t = tempfile::tempdir().unwrap();
        let d = Desk::create(t.path(), "alice").unwrap();
        let toml = d.dir().join("desk.toml");
        let text = fs::read_to_string(&toml).unwrap();
        let reason = |dir: &Path| match read_meta(dir) {
            Err(DeskError::NotADesk { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        // Exactly the limit: read.
        let pad = MAX_DESK_TOML as usize - text.len() - 3;
        fs::write(&toml, format!("{text}# {}\n", "x".repeat(pad))).unwrap();
        assert_eq!(fs::metadata(&toml).unwrap().len(), MAX_DESK_TOML);
        assert_eq!(read_meta(d.dir()).unwrap().agent, "alice");
        // One byte more: refused.
        fs::write(&toml, format!("{text}# {}\n", "x".repeat(pad + 1))).unwrap();
        assert!(reason(d.dir()).contains("at most"));
        // A directory in its place: refused as such.
        fs::remove_file(&toml).unwrap();
        fs::create_dir(&toml).unwrap();
        assert!(reason(d.dir()).contains("not a regular file"));
        fs::remove_dir(&toml).unwrap();
        // A newer format: refused, naming the fix.
        let newer = text.replace(
            &format!("format = {FORMAT}"),
            &format!("format = {}", FORMAT + 1),
        );
        assert_ne!(newer, text, "the format line is {text}");
        fs::write(&toml, newer).unwrap();
        assert!(reason(d.dir()).contains("upgrade deskfs"));
    }

    /// A create that fails for another reason than a desk in its place says so, not
    /// "exists" (procfs refuses the directory, even to root).
    #[test]
    fn a_create_failing_otherwise_is_not_told_as_existing() {
        let e = Desk::create(Path::new("/proc"), "alice").unwrap_err();
        assert!(matches!(e, DeskError::Io { .. }), "{e}");
    }

    #[test]
    fn failed_create_leaves_nothing() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("desks");
        fs::create_dir(&root).unwrap();
        // An empty directory under the agent's name: refused, nothing else made.
        fs::create_dir(root.join("x")).unwrap();
        assert!(Desk::create(&root, "x").is_err());
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1);
        // A root that is a file: refused.
        let file = t.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(Desk::create(&file, "y").is_err());
    }
}
