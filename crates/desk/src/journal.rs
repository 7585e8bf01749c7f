//! The task journal, written by the system: one JSON line per exec in
//! `.desk/journal/<TASK>.jsonl` (`_desk.jsonl` for execs at the desk's top), with the
//! command, where and when it ran, how it ended, its output (bytes, and the first
//! [`OUTPUT_CAP`] bytes) and the files it created, changed and deleted — taken from the
//! mount daemon's change ring ([`ChangeSource`]), not from the agent's say-so.
//!
//! The callers (`deskfs exec`, the HTTP and MCP exec) do:
//!
//! ```text
//! let watch = ChangeWatch::start(source, workspace_prefix_of_the_desk); // before
//! ... run the command ...
//! let changes = watch.finish();                                          // after
//! journal::record_exec(&desk, task, &ExecRecord { .. }, changes)?;
//! ```
//!
//! Appends are one `write(2)` of a whole line on an `O_APPEND` descriptor under an
//! exclusive `flock`, then `fsync`: concurrent execs never interleave lines. A reader skips
//! a torn last line (a crash mid-append) and any line it cannot parse.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{DeskError, IoContext, Result};
use crate::fsutil::utc_iso;
use crate::layout::Desk;

/// Output kept per entry (stdout and stderr together, in arrival order), bytes.
pub const OUTPUT_CAP: usize = 64 << 10;

/// The journal of execs outside any task (`.desk/journal/_desk.jsonl`).
pub const DESK_JOURNAL: &str = "_desk";

/// Paths listed per kind (created, changed, deleted) in an entry; past it the list is
/// cut and [`Files::totals`] gives the full counts (an `npm install` makes tens of
/// thousands of files: the journal line stays small).
pub const FILES_CAP: usize = 2_000;

/// Entries `resume` shows per open task.
pub const RESUME_ENTRIES: usize = 3;

/// Changes asked from the daemon per request.
const PAGE: usize = 10_000;

/// deskfs's own directory of a desk (its record, locks, the journal), relative to the
/// desk: read-only to agents, and its changes are never an exec's.
const SYSTEM_DIR: &str = ".desk";

/// Where the journal of a desk lives, relative to the desk (its own appends are never
/// reported as an exec's changes).
pub const JOURNAL_DIR: &str = ".desk/journal";

/// One change as the mount daemon's `changes` command reports it (workspace paths).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingChange {
    /// Cursor position.
    pub seq: u64,
    /// `created`, `changed`, `deleted` or `renamed`.
    pub kind: String,
    /// Workspace path.
    pub path: String,
    /// A rename's new path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// A directory.
    #[serde(default)]
    pub dir: bool,
}

/// One answer of the daemon's `changes` command.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingPage {
    /// Where to continue.
    pub cursor: u64,
    /// Changes after the asked cursor were lost (ring overflow, daemon restart).
    pub overflowed: bool,
    /// Changes, oldest first.
    pub changes: Vec<RingChange>,
    /// Changes whose path could not be resolved.
    #[serde(default)]
    pub unresolved: usize,
    /// More follow from `cursor`.
    #[serde(default)]
    pub more: bool,
}

/// The change ring of the mount a desk lives on (the CLI implements it over the mount
/// daemon's control socket; tests with a fake).
pub trait ChangeSource: Send + Sync {
    /// The ring's cursor now. Errors: one line (daemon unreachable, …).
    fn cursor(&self) -> std::result::Result<u64, String>;
    /// Changes from `since` under workspace path prefix `prefix`, at most `limit`.
    /// Errors: one line.
    fn changes(
        &self,
        since: u64,
        prefix: &str,
        limit: usize,
    ) -> std::result::Result<RingPage, String>;
}

/// Makes the [`ChangeWatch`] for an exec on a desk (how the HTTP/MCP exec path is handed
/// the CLI's daemon lookup without depending on the CLI).
pub type WatchFactory = Arc<dyn Fn(&Desk) -> ChangeWatch + Send + Sync>;

/// Watches one exec's file changes: started before the command, finished after.
pub struct ChangeWatch {
    state: WatchState,
}

enum WatchState {
    Unknown(String),
    Watching {
        source: Box<dyn ChangeSource>,
        prefix: String,
        since: u64,
    },
}

impl std::fmt::Debug for ChangeWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            WatchState::Unknown(r) => write!(f, "ChangeWatch(unknown: {r})"),
            WatchState::Watching { prefix, since, .. } => {
                write!(f, "ChangeWatch({prefix:?} since {since})")
            }
        }
    }
}

/// What an exec changed, as far as the system knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChanges {
    /// The files (desk-relative paths; directories end with `/`), or `None` when they
    /// are not known (see `unknown`).
    pub files: Option<Files>,
    /// The ring lost changes during the exec: `files` is incomplete.
    pub overflowed: bool,
    /// Changes whose path could not be resolved (maybe under the desk, maybe not).
    pub unresolved: usize,
    /// Why the files are not known (the desk is not on a deskfs mount, the daemon did not
    /// answer).
    pub unknown: Option<String>,
}

/// Files created, changed and deleted, desk-relative, sorted; directories end with `/`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Files {
    /// Paths that did not exist before and do after.
    pub created: Vec<String>,
    /// Paths that existed before and after, with new content (or a new inode).
    pub changed: Vec<String>,
    /// Paths that existed before and do not after.
    pub deleted: Vec<String>,
    /// The full counts when a list was cut at [`FILES_CAP`] (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totals: Option<Totals>,
}

/// How many paths were created, changed and deleted (see [`Files::totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Created.
    pub created: usize,
    /// Changed.
    pub changed: usize,
    /// Deleted.
    pub deleted: usize,
}

impl Files {
    /// The counts: [`Files::totals`], or the lists' lengths.
    pub fn counts(&self) -> Totals {
        self.totals.unwrap_or(Totals {
            created: self.created.len(),
            changed: self.changed.len(),
            deleted: self.deleted.len(),
        })
    }
}

impl ChangeWatch {
    /// Starts watching the workspace paths under `prefix` (the desk's directory relative
    /// to its mount, with a trailing `/`): takes the ring's cursor now. A source that does
    /// not answer makes a watch whose result is "unknown" with its reason.
    pub fn start(source: Box<dyn ChangeSource>, prefix: String) -> ChangeWatch {
        let state = match source.cursor() {
            Ok(since) => WatchState::Watching {
                source,
                prefix,
                since,
            },
            Err(e) => WatchState::Unknown(format!("the mount daemon did not answer: {e}")),
        };
        ChangeWatch { state }
    }

    /// A watch that knows nothing, with the reason (e.g. the desk is a plain directory).
    pub fn unknown(reason: impl Into<String>) -> ChangeWatch {
        ChangeWatch {
            state: WatchState::Unknown(reason.into()),
        }
    }

    /// The changes since [`ChangeWatch::start`], netted per path (see [`net_changes`]).
    pub fn finish(self) -> FileChanges {
        let (source, prefix, mut since) = match self.state {
            WatchState::Unknown(reason) => {
                return FileChanges {
                    unknown: Some(reason),
                    ..Default::default()
                }
            }
            WatchState::Watching {
                source,
                prefix,
                since,
            } => (source, prefix, since),
        };
        let mut all = Vec::new();
        let mut overflowed = false;
        let mut unresolved = 0;
        loop {
            match source.changes(since, &prefix, PAGE) {
                Ok(p) => {
                    overflowed |= p.overflowed;
                    unresolved += p.unresolved;
                    all.extend(p.changes);
                    if !p.more || p.cursor <= since {
                        break;
                    }
                    since = p.cursor;
                }
                Err(e) => {
                    return FileChanges {
                        unknown: Some(format!("the mount daemon did not answer: {e}")),
                        ..Default::default()
                    }
                }
            }
        }
        FileChanges {
            files: Some(net_changes(&all, &prefix)),
            overflowed,
            unresolved,
            unknown: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Created,
    Changed,
    Deleted,
}

/// Nets a sequence of changes into what differs between before and after, per path,
/// relative to `prefix` (changes outside it, and under `.desk/` — deskfs's own record,
/// locks and this journal, read-only to agents — are ignored):
/// created then deleted is neither; created then changed is created; deleted then created
/// is changed; a rename is a delete of its old path and a create of its new one (a
/// directory's entries already listed move along; its untouched content is not listed).
pub fn net_changes(changes: &[RingChange], prefix: &str) -> Files {
    let rel = |p: &str| -> Option<String> {
        let r = p.strip_prefix(prefix)?;
        if r.is_empty() || r == SYSTEM_DIR || r.starts_with(&format!("{SYSTEM_DIR}/")) {
            return None;
        }
        Some(r.to_owned())
    };
    let mut st: BTreeMap<String, St> = BTreeMap::new();
    let mut dirs: BTreeSet<String> = BTreeSet::new();
    fn create(st: &mut BTreeMap<String, St>, p: String) {
        let n = match st.get(&p) {
            Some(St::Deleted) | Some(St::Changed) => St::Changed,
            _ => St::Created,
        };
        st.insert(p, n);
    }
    fn delete(st: &mut BTreeMap<String, St>, p: String) {
        match st.get(&p) {
            Some(St::Created) => {
                st.remove(&p);
            }
            _ => {
                st.insert(p, St::Deleted);
            }
        }
    }
    let mark_dir = |dirs: &mut BTreeSet<String>, p: &str, dir: bool| {
        if dir {
            dirs.insert(p.to_owned());
        } else {
            dirs.remove(p);
        }
    };
    for c in changes {
        let from = rel(&c.path);
        match c.kind.as_str() {
            "created" => {
                if let Some(p) = from {
                    mark_dir(&mut dirs, &p, c.dir);
                    create(&mut st, p);
                }
            }
            "changed" => {
                if let Some(p) = from {
                    mark_dir(&mut dirs, &p, c.dir);
                    let n = match st.get(&p) {
                        Some(St::Created) => St::Created,
                        _ => St::Changed,
                    };
                    st.insert(p, n);
                }
            }
            "deleted" => {
                if let Some(p) = from {
                    mark_dir(&mut dirs, &p, c.dir);
                    delete(&mut st, p);
                }
            }
            "renamed" => {
                let to = c.to.as_deref().and_then(rel);
                // Entries under a renamed directory move with it.
                let mut moved = Vec::new();
                if c.dir {
                    if let Some(f) = &from {
                        let sub = format!("{f}/");
                        let keys: Vec<String> = st
                            .range(sub.clone()..)
                            .take_while(|(k, _)| k.starts_with(&sub))
                            .map(|(k, _)| k.clone())
                            .collect();
                        for k in keys {
                            if let Some(s) = st.remove(&k) {
                                let was_dir = dirs.remove(&k);
                                match s {
                                    // Gone from the old place either way.
                                    St::Deleted => {
                                        if was_dir {
                                            dirs.insert(k.clone());
                                        }
                                        st.insert(k, St::Deleted);
                                    }
                                    St::Created => moved.push((k[sub.len()..].to_owned(), was_dir)),
                                    St::Changed => {
                                        st.insert(k.clone(), St::Deleted);
                                        if was_dir {
                                            dirs.insert(k.clone());
                                        }
                                        moved.push((k[sub.len()..].to_owned(), was_dir));
                                    }
                                }
                            }
                        }
                    }
                }
                if let Some(f) = from {
                    mark_dir(&mut dirs, &f, c.dir);
                    delete(&mut st, f);
                }
                if let Some(t) = to {
                    mark_dir(&mut dirs, &t, c.dir);
                    for (k, was_dir) in moved {
                        let p = format!("{t}/{k}");
                        mark_dir(&mut dirs, &p, was_dir);
                        create(&mut st, p);
                    }
                    create(&mut st, t);
                }
            }
            _ => {}
        }
    }
    let mut f = Files::default();
    for (p, s) in st {
        let shown = if dirs.contains(&p) {
            format!("{p}/")
        } else {
            p
        };
        match s {
            St::Created => f.created.push(shown),
            St::Changed => f.changed.push(shown),
            St::Deleted => f.deleted.push(shown),
        }
    }
    let totals = Totals {
        created: f.created.len(),
        changed: f.changed.len(),
        deleted: f.deleted.len(),
    };
    for list in [&mut f.created, &mut f.changed, &mut f.deleted] {
        list.sort();
        if list.len() > FILES_CAP {
            list.truncate(FILES_CAP);
            f.totals = Some(totals);
        }
    }
    f
}

/// Stdout/stderr byte counts and the first [`OUTPUT_CAP`] bytes of both, in arrival
/// order (feed it as the chunks come).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputTally {
    /// Bytes on stdout.
    pub stdout_bytes: u64,
    /// Bytes on stderr.
    pub stderr_bytes: u64,
    /// The first bytes of the combined output.
    pub head: Vec<u8>,
    /// More output came than `head` holds.
    pub truncated: bool,
}

impl OutputTally {
    /// A chunk of stdout.
    pub fn stdout(&mut self, b: &[u8]) {
        self.stdout_bytes += b.len() as u64;
        self.keep(b);
    }
    /// A chunk of stderr.
    pub fn stderr(&mut self, b: &[u8]) {
        self.stderr_bytes += b.len() as u64;
        self.keep(b);
    }
    fn keep(&mut self, b: &[u8]) {
        let room = OUTPUT_CAP.saturating_sub(self.head.len());
        if b.len() > room {
            self.truncated = true;
        }
        self.head.extend_from_slice(&b[..b.len().min(room)]);
    }
}

/// How an exec's output was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Captured (HTTP, MCP, a piped CLI exec).
    Captured(OutputTally),
    /// Not captured, with why (e.g. the CLI's command wrote to the terminal directly).
    NotCaptured(String),
}

/// How an exec ended and what it printed, for [`record_exec`].
#[derive(Clone, Debug)]
pub struct ExecRecord<'a> {
    /// `cli`, `http` or `mcp`.
    pub via: &'a str,
    /// The command and its arguments.
    pub command: &'a [String],
    /// Working directory, desk-relative (`""` = the desk's top, `tasks/T`).
    pub cwd: &'a str,
    /// When it started.
    pub start: SystemTime,
    /// How long it ran.
    pub duration: Duration,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Killed because its time ran out.
    pub timed_out: bool,
    /// Killed by the system that ran it (its time ran out, its client went away, the
    /// server stopped), not ended on its own.
    pub killed: bool,
    /// Its output.
    pub output: Output,
}

/// One journal line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Unique id (start ms, process, counter; hex).
    pub id: String,
    /// The task (`None`: the desk's top).
    #[serde(default)]
    pub task: Option<String>,
    /// `cli`, `http` or `mcp`.
    pub via: String,
    /// argv.
    pub command: Vec<String>,
    /// Desk-relative working directory (`""` = the desk's top).
    pub cwd: String,
    /// Start, RFC 3339 UTC (seconds).
    pub start: String,
    /// Start, ms since the epoch.
    pub start_ms: u64,
    /// Run time, ms.
    pub duration_ms: u64,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Killed because its time ran out.
    #[serde(default)]
    pub timed_out: bool,
    /// Killed by the system that ran it (timeout, client gone, server stopping).
    #[serde(default)]
    pub killed: bool,
    /// Whether the output was captured (else the byte counts and `output` are absent).
    pub output_captured: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_note: Option<String>,
    /// Bytes on stdout.
    pub stdout_bytes: Option<u64>,
    /// Bytes on stderr.
    pub stderr_bytes: Option<u64>,
    /// The first [`OUTPUT_CAP`] bytes of the combined output (UTF-8, lossily).
    pub output: Option<String>,
    /// The output was longer than `output`.
    #[serde(default)]
    pub output_truncated: bool,
    /// Files created, changed, deleted (`null` when unknown: see `changes_unknown`).
    pub files: Option<Files>,
    /// The change ring lost changes during the exec: `files` is incomplete.
    #[serde(default)]
    pub changes_overflowed: bool,
    /// Changes whose path was lost (their directory is gone): not in `files`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub changes_unresolved: usize,
    /// Why `files` is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes_unknown: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn new_id(start_ms: u64) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{start_ms:x}-{:x}-{:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl Entry {
    /// The entry of an exec.
    pub fn new(task: Option<&str>, r: &ExecRecord<'_>, changes: FileChanges) -> Entry {
        let start_ms = ms(r.start);
        let (captured, note, out, err, text, truncated) = match &r.output {
            Output::Captured(t) => (
                true,
                None,
                Some(t.stdout_bytes),
                Some(t.stderr_bytes),
                Some(String::from_utf8_lossy(&t.head).into_owned()),
                t.truncated,
            ),
            Output::NotCaptured(why) => (false, Some(why.clone()), None, None, None, false),
        };
        Entry {
            id: new_id(start_ms),
            task: task.map(str::to_owned),
            via: r.via.to_owned(),
            command: r.command.to_vec(),
            cwd: r.cwd.to_owned(),
            start: utc_iso(start_ms / 1000),
            start_ms,
            duration_ms: r.duration.as_millis() as u64,
            exit_code: r.exit_code,
            signal: r.signal,
            timed_out: r.timed_out,
            killed: r.killed,
            output_captured: captured,
            output_note: note,
            stdout_bytes: out,
            stderr_bytes: err,
            output: text,
            output_truncated: truncated,
            files: changes.files,
            changes_overflowed: changes.overflowed,
            changes_unresolved: changes.unresolved,
            changes_unknown: changes.unknown,
        }
    }

    /// `+3 ~1 -2` (created, changed, deleted), or `files ?` when unknown (`!` appended
    /// when the ring overflowed).
    pub fn files_summary(&self) -> String {
        match &self.files {
            Some(f) => {
                let n = f.counts();
                format!(
                    "+{} ~{} -{}{}",
                    n.created,
                    n.changed,
                    n.deleted,
                    if self.changes_overflowed {
                        " (incomplete)"
                    } else {
                        ""
                    }
                )
            }
            None => "files ?".into(),
        }
    }

    /// `exit 0`, `signal 9`, `timeout`, `killed`.
    pub fn status_text(&self) -> String {
        if self.timed_out {
            return "timeout".into();
        }
        if self.killed {
            return "killed".into();
        }
        match (self.exit_code, self.signal) {
            (_, Some(s)) => format!("signal {s}"),
            (Some(c), None) => format!("exit {c}"),
            (None, None) => "?".into(),
        }
    }

    /// The command as one line (arguments with spaces or quotes quoted, cut at 80
    /// characters).
    pub fn command_line(&self) -> String {
        let mut s = self
            .command
            .iter()
            .map(|a| {
                if !a.is_empty()
                    && a.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c))
                {
                    a.clone()
                } else {
                    format!("'{}'", a.replace('\'', "'\\''"))
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
            .replace(['\n', '\r', '\t'], " ");
        if s.chars().count() > 80 {
            s = s.chars().take(79).collect::<String>() + "…";
        }
        s
    }
}

/// `.desk/journal/`.
pub fn journal_dir(desk: &Desk) -> PathBuf {
    desk.dir().join(JOURNAL_DIR)
}

/// The journal file of `task` (`None`: the desk's own).
pub fn journal_path(desk: &Desk, task: Option<&str>) -> PathBuf {
    journal_dir(desk).join(format!("{}.jsonl", task.unwrap_or(DESK_JOURNAL)))
}

/// Appends `entry` to the journal of `task` (`None`: the desk's): one line, one `write`
/// on an `O_APPEND` descriptor under an exclusive `flock` (where the file system has
/// them), then `fsync`.
///
/// # Errors
/// [`DeskError::Io`] creating the directory, opening (a symlink in the journal's place is
/// refused), writing or syncing; [`DeskError::Encode`] when the entry cannot be encoded.
pub fn append(desk: &Desk, task: Option<&str>, entry: &Entry) -> Result<()> {
    if let Some(t) = task {
        crate::names::check_task(t)?;
    }
    let dir = journal_dir(desk);
    if fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(DeskError::io(
            "use",
            &dir,
            std::io::Error::other("it is a symlink (planted from inside exec?); the journal refuses to follow it: remove it"),
        ));
    }
    let new_dir = !dir.exists();
    fs::create_dir_all(&dir).ctx("create", &dir)?;
    if new_dir {
        // The new directory's entry in `.desk/` is durable before a line is acknowledged.
        sync_dir(dir.parent().unwrap_or(&dir))?;
    }
    let path = journal_path(desk, task);
    let mut line = serde_json::to_vec(entry).map_err(|e| DeskError::Encode {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    line.push(b'\n');
    let new_file = !path.exists();
    append_line(&path, &line)?;
    if new_file {
        // So is the new journal file's entry in `.desk/journal/`.
        sync_dir(&dir)?;
    }
    Ok(())
}

/// `fsync` of a directory (its entries), errors passed on.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).ctx("sync", dir)
}

/// One whole line appended atomically (see [`append`]).
fn append_line(path: &Path, line: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ctx("open", path)?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own. Where the file system has no flock, the
    // single O_APPEND write still keeps lines whole.
    let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0;
    let res = (|| {
        // A torn line left by a crash: end it first, so this entry starts a line.
        let len = f.metadata()?.len();
        let mut buf = Vec::with_capacity(line.len() + 1);
        if len > 0 {
            let mut last = [0u8; 1];
            let mut r = File::open(path)?;
            r.seek(SeekFrom::Start(len - 1))?;
            r.read_exact(&mut last)?;
            if last[0] != b'\n' {
                buf.push(b'\n');
            }
        }
        buf.extend_from_slice(line);
        let n = f.write(&buf)?;
        if n != buf.len() {
            // A short write of a regular file is an error here (disk full): finish the
            // line, so the next entry starts clean; the reader skips it as unparsable.
            f.write_all(&buf[n..])?;
        }
        f.sync_all()
    })();
    if locked {
        // SAFETY: as above.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
    }
    res.ctx("append to", path)
}

/// Records an exec: builds its [`Entry`] and appends it to the journal of `task`.
/// Returns the entry.
///
/// # Errors
/// See [`append`].
pub fn record_exec(
    desk: &Desk,
    task: Option<&str>,
    r: &ExecRecord<'_>,
    changes: FileChanges,
) -> Result<Entry> {
    let e = Entry::new(task, r, changes);
    append(desk, task, &e)?;
    Ok(e)
}

/// Reads at most `limit` newest entries of the journal at `path`, oldest first. Reads
/// backwards from the end, so a long journal costs only its tail. A torn last line and
/// lines that do not parse are skipped. A missing file is empty.
fn read_file(path: &Path, limit: usize) -> Result<Vec<Entry>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    let mut f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DeskError::io("open", path, e)),
    };
    let len = f.metadata().ctx("read", path)?.len();
    const CHUNK: u64 = 256 << 10;
    // Chunks read from the end, newest last; joined once.
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut lines = 0usize;
    let mut pos = len;
    // Enough complete lines (the first may be partial unless at the start)?
    while pos > 0 && lines <= limit {
        let n = CHUNK.min(pos);
        pos -= n;
        let mut buf = vec![0u8; n as usize];
        f.seek(SeekFrom::Start(pos)).ctx("read", path)?;
        f.read_exact(&mut buf).ctx("read", path)?;
        lines += buf.iter().filter(|&&b| b == b'\n').count();
        chunks.push(buf);
    }
    chunks.reverse();
    let tail = chunks.concat();
    let mut parts: Vec<&[u8]> = tail.split(|&b| b == b'\n').collect();
    // The piece after the last newline: empty, or a torn line.
    parts.pop();
    if pos > 0 && !parts.is_empty() {
        // Starts mid-line.
        parts.remove(0);
    }
    let mut out: Vec<Entry> = parts
        .iter()
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect();
    if out.len() > limit {
        out.drain(..out.len() - limit);
    }
    Ok(out)
}

/// The journal names of a desk: `_desk` and each task that has a journal, sorted.
pub fn journals(desk: &Desk) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(journal_dir(desk))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_suffix(".jsonl").map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The newest `limit` entries, oldest first: of task `Some(t)` (`Some("_desk")`: the
/// desk's own), or of every journal of the desk merged by start time (`None`).
///
/// # Errors
/// [`DeskError::InvalidName`] for a bad task name; I/O errors reading.
pub fn read(desk: &Desk, task: Option<&str>, limit: usize) -> Result<Vec<Entry>> {
    match task {
        Some(DESK_JOURNAL) => read_file(&journal_path(desk, None), limit),
        Some(t) => {
            crate::names::check_task(t)?;
            read_file(&journal_path(desk, Some(t)), limit)
        }
        None => {
            let mut all = Vec::new();
            for j in journals(desk) {
                if j != DESK_JOURNAL && crate::names::check_task(&j).is_err() {
                    continue;
                }
                all.extend(read_file(
                    &journal_dir(desk).join(format!("{j}.jsonl")),
                    limit,
                )?);
            }
            all.sort_by(|a, b| a.start_ms.cmp(&b.start_ms).then(a.id.cmp(&b.id)));
            if all.len() > limit {
                all.drain(..all.len() - limit);
            }
            Ok(all)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring answering from a script of pages (the real one is the mount daemon's, over
    /// its control socket: `e2e/99-journal.sh`); records the cursors it was asked from.
    struct Script {
        start: std::result::Result<u64, String>,
        pages: std::sync::Mutex<Vec<std::result::Result<RingPage, String>>>,
        asked: Arc<std::sync::Mutex<Vec<u64>>>,
    }

    impl ChangeSource for Script {
        fn cursor(&self) -> std::result::Result<u64, String> {
            self.start.clone()
        }
        fn changes(
            &self,
            since: u64,
            _prefix: &str,
            _limit: usize,
        ) -> std::result::Result<RingPage, String> {
            self.asked.lock().unwrap().push(since);
            let mut pages = self.pages.lock().unwrap();
            assert!(!pages.is_empty(), "asked past the last page (from {since})");
            pages.remove(0)
        }
    }

    fn watch(
        start: std::result::Result<u64, String>,
        pages: Vec<std::result::Result<RingPage, String>>,
    ) -> (ChangeWatch, Arc<std::sync::Mutex<Vec<u64>>>) {
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let source = Script {
            start,
            pages: std::sync::Mutex::new(pages),
            asked: asked.clone(),
        };
        (
            ChangeWatch::start(Box::new(source), "desks/a/".into()),
            asked,
        )
    }

    /// A watch reads every page from its start cursor on, adding up what each says was
    /// lost or unresolved, and stops at the last page — or at a page that does not move
    /// the cursor on (a ring that went back must not loop for ever).
    #[test]
    fn a_watch_reads_every_page_and_adds_up_what_was_lost() {
        let page = |cursor, path: &str, overflowed, unresolved, more| {
            Ok(RingPage {
                cursor,
                overflowed,
                changes: vec![ch("created", path, false)],
                unresolved,
                more,
            })
        };
        let (w, asked) = watch(
            Ok(3),
            vec![page(5, "a", true, 1, true), page(9, "b", false, 2, false)],
        );
        assert_eq!(format!("{w:?}"), "ChangeWatch(\"desks/a/\" since 3)");
        let got = w.finish();
        assert_eq!(*asked.lock().unwrap(), [3, 5]);
        assert_eq!(
            got,
            FileChanges {
                files: Some(files(&["a", "b"], &[], &[])),
                overflowed: true,
                unresolved: 3,
                unknown: None,
            }
        );
        // "More" from a cursor that did not move: stop there.
        let (w, asked) = watch(Ok(7), vec![page(7, "a", false, 0, true)]);
        assert_eq!(w.finish().files, Some(files(&["a"], &[], &[])));
        assert_eq!(*asked.lock().unwrap(), [7]);
    }

    /// A list of exactly [`FILES_CAP`] paths is whole (no totals); one more cuts it and
    /// gives the totals.
    #[test]
    fn lists_are_cut_only_past_the_cap() {
        let many = |n: usize| -> Vec<RingChange> {
            (0..n)
                .map(|i| ch("created", &format!("f{i:05}"), false))
                .collect()
        };
        let f = net_changes(&many(FILES_CAP), "desks/a/");
        assert_eq!((f.created.len(), f.totals), (FILES_CAP, None));
        let f = net_changes(&many(FILES_CAP + 1), "desks/a/");
        assert_eq!(f.created.len(), FILES_CAP);
        assert_eq!(
            f.totals,
            Some(Totals {
                created: FILES_CAP + 1,
                changed: 0,
                deleted: 0
            })
        );
    }

    /// The kept output is whole up to [`OUTPUT_CAP`] bytes over both streams, in
    /// arrival order; a byte past it marks it truncated.
    #[test]
    fn output_is_kept_up_to_the_cap_and_marked_past_it() {
        let mut t = OutputTally::default();
        t.stdout(b"ab");
        t.stderr(b"c");
        assert_eq!((t.head.as_slice(), t.truncated), (&b"abc"[..], false));
        t.stdout(&vec![b'x'; OUTPUT_CAP - 3]);
        assert_eq!(
            (t.head.len(), t.truncated),
            (OUTPUT_CAP, false),
            "exactly full"
        );
        t.stderr(b"y");
        assert_eq!((t.head.len(), t.truncated), (OUTPUT_CAP, true));
        assert_eq!((t.stdout_bytes, t.stderr_bytes), (OUTPUT_CAP as u64 - 1, 2));
    }

    /// A daemon that does not answer, at the start or on a page: the files are unknown,
    /// with the reason.
    #[test]
    fn a_watch_whose_daemon_does_not_answer_knows_nothing_and_says_why() {
        let (w, _) = watch(Err("connection refused".into()), vec![]);
        assert_eq!(
            format!("{w:?}"),
            "ChangeWatch(unknown: the mount daemon did not answer: connection refused)"
        );
        let got = w.finish();
        assert_eq!(got.files, None);
        assert_eq!(
            got.unknown.as_deref(),
            Some("the mount daemon did not answer: connection refused")
        );
        let (w, _) = watch(Ok(1), vec![Err("timed out".into())]);
        let got = w.finish();
        assert_eq!((got.files, got.overflowed), (None, false));
        assert_eq!(
            got.unknown.as_deref(),
            Some("the mount daemon did not answer: timed out")
        );
    }

    fn ch(kind: &str, path: &str, dir: bool) -> RingChange {
        RingChange {
            seq: 0,
            kind: kind.into(),
            path: format!("desks/a/{path}"),
            to: None,
            dir,
        }
    }

    fn mv(from: &str, to: &str, dir: bool) -> RingChange {
        RingChange {
            to: Some(format!("desks/a/{to}")),
            ..ch("renamed", from, dir)
        }
    }

    fn files(c: &[&str], m: &[&str], d: &[&str]) -> Files {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        Files {
            created: v(c),
            changed: v(m),
            deleted: v(d),
            totals: None,
        }
    }

    #[test]
    fn netting() {
        // echo hi > a; echo x >> b; rm c; mkdir d; touch d/e; mv f g
        let seq = vec![
            ch("created", "a", false),
            ch("changed", "a", false),
            ch("changed", "b", false),
            ch("deleted", "c", false),
            ch("created", "d", true),
            ch("created", "d/e", false),
            mv("f", "g", false),
        ];
        assert_eq!(
            net_changes(&seq, "desks/a/"),
            files(&["a", "d/", "d/e", "g"], &["b"], &["c", "f"])
        );
        // Created then deleted is neither; deleted then created is changed.
        let seq = vec![
            ch("created", "t", false),
            ch("changed", "t", false),
            ch("deleted", "t", false),
            ch("deleted", "x", false),
            ch("created", "x", false),
        ];
        assert_eq!(net_changes(&seq, "desks/a/"), files(&[], &["x"], &[]));
        // Atomic save: write a temp file, rename it over the target: the target changed.
        let seq = vec![
            ch("created", "f.tmp", false),
            ch("changed", "f.tmp", false),
            ch("deleted", "f", false),
            mv("f.tmp", "f", false),
        ];
        assert_eq!(net_changes(&seq, "desks/a/"), files(&[], &["f"], &[]));
        // A new directory filled then renamed: everything at its new place.
        let seq = vec![
            ch("created", "d", true),
            ch("created", "d/e", false),
            mv("d", "n", true),
        ];
        assert_eq!(
            net_changes(&seq, "desks/a/"),
            files(&["n/", "n/e"], &[], &[])
        );
        // Outside the desk, or deskfs's own `.desk/` (the journal, the server's write
        // lock): ignored; moved in from outside: created; a name merely like it: kept.
        let seq = vec![
            RingChange {
                path: "desks/b/x".into(),
                ..ch("created", "", false)
            },
            ch("changed", ".desk/journal/_desk.jsonl", false),
            ch("changed", ".desk/locks/files.lock", false),
            ch("created", ".desk", true),
            ch("created", ".desktop", false),
            RingChange {
                path: "elsewhere/y".into(),
                ..mv("", "y", false)
            },
        ];
        assert_eq!(
            net_changes(&seq, "desks/a/"),
            files(&[".desktop", "y"], &[], &[])
        );
    }

    #[test]
    fn long_lists_are_cut_with_their_totals() {
        let seq: Vec<RingChange> = (0..FILES_CAP + 5)
            .map(|i| ch("created", &format!("n/{i:05}"), false))
            .chain([ch("deleted", "old", false)])
            .collect();
        let f = net_changes(&seq, "desks/a/");
        assert_eq!(f.created.len(), FILES_CAP);
        assert_eq!(f.created[0], "n/00000");
        assert_eq!(f.deleted, ["old"]);
        let t = f.totals.expect("totals when cut");
        assert_eq!((t.created, t.changed, t.deleted), (FILES_CAP + 5, 0, 1));
        assert_eq!(f.counts().created, FILES_CAP + 5);
    }

    #[test]
    fn tally_caps_output() {
        let mut t = OutputTally::default();
        t.stdout(&vec![b'a'; OUTPUT_CAP - 1]);
        t.stderr(b"xyz");
        assert_eq!(t.stdout_bytes, OUTPUT_CAP as u64 - 1);
        assert_eq!(t.stderr_bytes, 3);
        assert_eq!(t.head.len(), OUTPUT_CAP);
        assert!(t.truncated);
    }

    fn desk() -> (tempfile::TempDir, Desk) {
        let tmp = tempfile::tempdir().unwrap();
        let d = Desk::create(tmp.path(), "alice").unwrap();
        (tmp, d)
    }

    fn rec(i: usize) -> Entry {
        let argv = vec!["sh".to_string(), "-c".to_string(), format!("echo {i}")];
        Entry::new(
            Some("t1"),
            &ExecRecord {
                via: "cli",
                command: &argv,
                cwd: "tasks/t1",
                start: SystemTime::now(),
                duration: Duration::from_millis(5),
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                killed: false,
                // Long lines: more than a pipe buffer, so interleaving would show.
                output: Output::Captured(OutputTally {
                    stdout_bytes: 9000,
                    stderr_bytes: 0,
                    head: format!("{i}:").into_bytes().repeat(3000),
                    truncated: false,
                }),
            },
            FileChanges::default(),
        )
    }

    #[test]
    fn concurrent_appends_do_not_interleave() {
        let (_tmp, d) = desk();
        let d = Arc::new(d);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for i in 0..25 {
                        append(&d, Some("t1"), &rec(t * 100 + i)).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = fs::read_to_string(journal_path(&d, Some("t1"))).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 200);
        for l in &lines {
            let e: Entry = serde_json::from_str(l).expect("every line is one whole entry");
            assert_eq!(e.task.as_deref(), Some("t1"));
        }
        assert_eq!(read(&d, Some("t1"), 1000).unwrap().len(), 200);
        assert_eq!(read(&d, None, 7).unwrap().len(), 7);
    }

    #[test]
    fn a_journal_that_is_a_symlink_is_never_read_through() {
        let (_t, d) = desk();
        let elsewhere = d.dir().join("notes/fake.jsonl");
        std::fs::create_dir_all(elsewhere.parent().unwrap()).unwrap();
        std::fs::write(&elsewhere, serde_json::to_string(&rec(1)).unwrap() + "\n").unwrap();
        std::fs::create_dir_all(journal_dir(&d)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, journal_path(&d, Some("t1"))).unwrap();
        assert!(
            read(&d, Some("t1"), 10).is_err(),
            "a linked journal was read"
        );
        assert!(
            append(&d, Some("t1"), &rec(2)).is_err(),
            "a linked journal was written"
        );
        let there = std::fs::read_to_string(&elsewhere).unwrap();
        assert_eq!(
            there.lines().count(),
            1,
            "the file it leads to is untouched"
        );
    }

    /// All journals merged: the desk's own and each task's, oldest first, the newest
    /// `limit`; a file whose name is no task name is not read.
    #[test]
    fn every_journal_merged_is_the_newest_entries_of_all() {
        let (_t, d) = desk();
        let at = |e: Entry, ms: u64| Entry { start_ms: ms, ..e };
        append(&d, None, &at(rec(1), 1_000)).unwrap();
        append(&d, Some("t1"), &at(rec(2), 2_000)).unwrap();
        append(&d, Some("t2"), &at(rec(3), 3_000)).unwrap();
        std::fs::write(
            journal_dir(&d).join("bad name.jsonl"),
            serde_json::to_string(&at(rec(4), 4_000)).unwrap() + "\n",
        )
        .unwrap();
        let starts = |v: Vec<Entry>| v.iter().map(|e| e.start_ms).collect::<Vec<_>>();
        assert_eq!(starts(read(&d, None, 10).unwrap()), [1_000, 2_000, 3_000]);
        assert_eq!(starts(read(&d, None, 2).unwrap()), [2_000, 3_000]);
        assert_eq!(starts(read(&d, None, 1).unwrap()), [3_000]);
    }

    /// A command as one line: plain words as they are, anything else quoted the shell's
    /// way, line breaks as spaces, at most 80 characters.
    #[test]
    fn command_lines_quote_what_needs_it_and_are_cut_at_80() {
        let mut e = rec(1);
        let line = |e: &mut Entry, argv: &[&str]| {
            e.command = argv.iter().map(|a| a.to_string()).collect();
            e.command_line()
        };
        assert_eq!(
            line(&mut e, &["git", "commit", "-m", "a b", "", "it's", "x\ny"]),
            "git commit -m 'a b' '' 'it'\\''s' 'x y'"
        );
        assert_eq!(
            line(&mut e, &["a/b.c=d:e@f%g+h,i_j-k"]),
            "a/b.c=d:e@f%g+h,i_j-k"
        );
        let eighty = "x".repeat(80);
        assert_eq!(line(&mut e, &[&eighty]), eighty, "80 characters are whole");
        let cut = line(&mut e, &[&"é".repeat(81)]);
        assert_eq!(
            cut,
            "'".to_string() + &"é".repeat(78) + "…",
            "cut by characters, not bytes"
        );
    }

    #[test]
    fn torn_last_line_is_tolerated() {
        let (_tmp, d) = desk();
        for i in 0..3 {
            append(&d, Some("t1"), &rec(i)).unwrap();
        }
        let p = journal_path(&d, Some("t1"));
        // A crash in the middle of the fourth append.
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(br#"{"id":"torn","task":"t1","via":"cl"#)
            .unwrap();
        drop(f);
        let got = read(&d, Some("t1"), 10).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(read(&d, Some("t1"), 2).unwrap().len(), 2);
        // The next append starts a line of its own: the torn piece stays one bad line.
        append(&d, Some("t1"), &rec(9)).unwrap();
        let got = read(&d, Some("t1"), 10).unwrap();
        assert_eq!(got.len(), 4);
        assert!(got[3].command[2].ends_with('9'));
    }

    #[test]
    fn tail_read_of_a_long_journal() {
        let (_tmp, d) = desk();
        for i in 0..120 {
            append(&d, None, &rec(i)).unwrap();
        }
        // 120 lines of ~12 KB: more than one 256 KiB chunk from the end.
        let got = read(&d, Some(DESK_JOURNAL), 30).unwrap();
        assert_eq!(got.len(), 30);
        assert!(got[29].command[2].ends_with("119"));
        assert!(got[0].command[2].ends_with("90"));
        assert!(read(&d, Some("nope"), 3).unwrap().is_empty());
        assert!(read(&d, Some("bad/name"), 3).is_err());
    }

    #[test]
    fn unknown_changes_are_not_an_empty_list() {
        let e = Entry::new(
            None,
            &ExecRecord {
                via: "cli",
                command: &["true".to_string()],
                cwd: "",
                start: SystemTime::now(),
                duration: Duration::ZERO,
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                killed: false,
                output: Output::NotCaptured("terminal".into()),
            },
            ChangeWatch::unknown("not on a deskfs mount").finish(),
        );
        let v = serde_json::to_value(&e).unwrap();
        assert!(v["files"].is_null());
        assert_eq!(v["changes_unknown"], "not on a deskfs mount");
        assert_eq!(e.files_summary(), "files ?");
    }

    /// An entry carries its start (milliseconds and UTC text) and an id of its own that
    /// begins with that start.
    #[test]
    fn entries_carry_their_start_and_distinct_ids() {
        let (a, b) = (rec(1), rec(2));
        let now = ms(SystemTime::now());
        assert!(
            a.start_ms <= now && a.start_ms + 60_000 > now,
            "{}",
            a.start_ms
        );
        assert_eq!(a.start, utc_iso(a.start_ms / 1000));
        assert!(a.id.starts_with(&format!("{:x}-", a.start_ms)), "{}", a.id);
        assert_ne!(a.id, b.id);
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(super::ms(at(1_714_566_896_789)), 1_714_566_896_789);
    }

    /// How an entry ended, in a word or two: a timeout and a kill first (both end
    /// with SIGKILL), then a signal, then the exit code.
    #[test]
    fn status_text_says_how_it_ended() {
        let mut e = rec(1);
        assert_eq!(e.status_text(), "exit 0");
        e.exit_code = Some(3);
        assert_eq!(e.status_text(), "exit 3");
        (e.exit_code, e.signal) = (Some(137), Some(9));
        assert_eq!(e.status_text(), "signal 9");
        e.killed = true;
        assert_eq!(e.status_text(), "killed");
        e.timed_out = true;
        assert_eq!(e.status_text(), "timeout");
        (e.exit_code, e.signal, e.killed, e.timed_out) = (None, None, false, false);
        assert_eq!(e.status_text(), "?");
    }

    /// Unresolved changes are written only when there are some, and read back.
    #[test]
    fn unresolved_changes_are_written_only_when_there_are_some() {
        let mut e = rec(1);
        assert_eq!(e.changes_unresolved, 0);
        let v = serde_json::to_value(&e).unwrap();
        assert!(v.get("changes_unresolved").is_none(), "{v}");
        e.changes_unresolved = 2;
        let text = serde_json::to_string(&e).unwrap();
        let back: Entry = serde_json::from_str(&text).unwrap();
        assert_eq!(back.changes_unresolved, 2);
    }
}
