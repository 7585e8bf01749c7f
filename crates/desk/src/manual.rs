//! The desk manual, `AGENTS.md`: a human part the agent edits freely and a machine part —
//! a fenced TOML block between two HTML-comment markers — that `manual record` keeps true
//! and `manual check` verifies.
//!
//! ````text
//! <!-- deskfs:manual:begin (machine part: ...) -->
//! ```toml
//! [[tool]]
//! name = "rg"
//! version = "ripgrep 14.1.0"
//! version_cmd = "rg --version"
//!
//! [[repo]]
//! name = "app"
//! test_cmd = "cargo test"
//! build_cmd = "cargo build"
//! ```
//! <!-- deskfs:manual:end -->
//! ````
//!
//! Everything outside the markers is the human part; writes replace only the bytes between
//! (and including) the markers, so the human part stays byte for byte as it was. Writes are
//! atomic (temp file + rename) under the desk's manual lock.

use std::fs;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{DeskError, Result};
use crate::fsutil::{atomic_write, now_secs, utc_iso};
use crate::layout::Desk;
use crate::lock::FileLock;
use crate::shell;

/// First bytes of the line that opens the machine part.
pub const BEGIN: &str = "<!-- deskfs:manual:begin";
/// The line that closes the machine part.
pub const END: &str = "<!-- deskfs:manual:end -->";
const BEGIN_LINE: &str = "<!-- deskfs:manual:begin (machine part: written by `deskfs manual record`, checked by `deskfs manual check`; keep the markers) -->";
/// How long a tool's version command may run.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(30);

/// A tool the desk relies on.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ToolEntry {
    /// Tool name (for people; also the default program of `version_cmd`).
    pub name: String,
    /// First line the version command printed when recorded.
    pub version: String,
    /// Shell command that prints the version (run with `tools/bin` first on PATH).
    pub version_cmd: String,
    /// When it was recorded (UTC, ISO 8601).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<String>,
}

/// A repo under `repos/` and how to build and test it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RepoEntry {
    /// Directory name under `repos/`.
    pub name: String,
    /// Shell command that runs the tests (in the repo or a task worktree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_cmd: Option<String>,
    /// Shell command that builds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_cmd: Option<String>,
}

/// The machine-readable part.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MachinePart {
    /// `[[tool]]` entries.
    #[serde(default, rename = "tool", skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolEntry>,
    /// `[[repo]]` entries.
    #[serde(default, rename = "repo", skip_serializing_if = "Vec::is_empty")]
    pub repos: Vec<RepoEntry>,
}

/// A parsed `AGENTS.md`.
#[derive(Clone, Debug)]
pub struct Manual {
    text: String,
    /// Byte range of the machine block, markers included (without the newline after END).
    span: Option<(usize, usize)>,
    /// The machine part (empty when the file has no block).
    pub machine: MachinePart,
}

/// The `AGENTS.md` of a new desk.
pub fn template(agent: &str) -> String {
    let machine = block_text(EMPTY_BODY);
    format!(
        "# Desk manual: {agent}\n\
\n\
This is the desk's manual, the first thing a session reads (`deskfs resume {agent}`).\n\
Keep it true: what is installed and how, how to build and test each repo, quirks worth\n\
remembering. Edit this part freely; leave the block between the deskfs:manual markers to\n\
`deskfs manual record` (tools) and `deskfs manual repo` (repo build/test commands).\n\
\n\
## Layout\n\
- `repos/NAME/`: long-lived clones. `tasks/TASK/`: one git worktree per task\n\
  (`deskfs task start {agent} TASK --repo NAME`, `deskfs task finish {agent} TASK`).\n\
- `notes/`: notes to the next session. `tools/bin/`: the desk's tools (on PATH in exec).\n\
- `.cache/`: cargo, npm, pip and uv caches. `tmp/`: scratch (`deskfs desk tidy` cleans it).\n\
\n\
## Gotchas\n\
- (none yet)\n\
\n\
{machine}\n"
    )
}

const EMPTY_BODY: &str = "# no tools or repos recorded yet\n";

fn block_text(body: &str) -> String {
    format!("{BEGIN_LINE}\n```toml\n{body}```\n{END}")
}

/// The machine block (markers included) for `m`.
fn render_block(m: &MachinePart) -> Result<String, String> {
    let body = render_body(m);
    // A line of the body that starts a fence or the end marker would end the block early
    // when it is read back (every value is one line: this cannot happen; kept as a guard).
    if let Some(line) = body
        .lines()
        .find(|l| l.starts_with("```") || l.starts_with(END))
    {
        return Err(format!("a line of the TOML would end the block: {line:?}"));
    }
    Ok(block_text(if body.trim().is_empty() {
        EMPTY_BODY
    } else {
        &body
    }))
}

/// The TOML of `m`, laid out as `toml::to_string` lays it out (one `[[tool]]` or
/// `[[repo]]` table after the other, a blank line between two, the fields in the order of
/// their structs), with every string on one line ([`toml_str`]): a value holding line
/// breaks (a multi-line test command) would otherwise be written as a multi-line
/// string, and one of its lines could start with ```` ``` ```` or the end marker, ending
/// the block early when it is read back. New fields of [`ToolEntry`] and [`RepoEntry`]
/// must be written here too (`every_field_round_trips` checks every field).
fn render_body(m: &MachinePart) -> String {
    let mut tables = Vec::new();
    for t in &m.tools {
        let mut s = String::from("[[tool]]\n");
        field(&mut s, "name", Some(&t.name));
        field(&mut s, "version", Some(&t.version));
        field(&mut s, "version_cmd", Some(&t.version_cmd));
        field(&mut s, "recorded", t.recorded.as_deref());
        tables.push(s);
    }
    for r in &m.repos {
        let mut s = String::from("[[repo]]\n");
        field(&mut s, "name", Some(&r.name));
        field(&mut s, "test_cmd", r.test_cmd.as_deref());
        field(&mut s, "build_cmd", r.build_cmd.as_deref());
        tables.push(s);
    }
    tables.join("\n")
}

/// `key = VALUE` and a newline, when there is a value.
fn field(out: &mut String, key: &str, value: Option<&str>) {
    if let Some(v) = value {
        out.push_str(key);
        out.push_str(" = ");
        out.push_str(&toml_str(v));
        out.push('\n');
    }
}

/// `s` as a one-line TOML string: a literal string `'…'` when `s` holds `"` and no `'` or
/// control character (as `toml` writes those), else a basic string `"…"` with quotes,
/// backslashes, line breaks and every other control character escaped.
fn toml_str(s: &str) -> String {
    let control = |c: char| (c < ' ' && c != '\t') || c == '\u{7f}';
    if s.contains('"') && !s.contains('\'') && !s.chars().any(control) {
        return format!("'{s}'");
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if control(c) => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Byte offset of the first line of `text` (from `from`) that starts with `prefix`.
fn find_line(text: &str, from: usize, prefix: &str) -> Option<usize> {
    let mut pos = from;
    for line in text[from..].split_inclusive('\n') {
        if line.starts_with(prefix) {
            return Some(pos);
        }
        pos += line.len();
    }
    None
}

impl Manual {
    /// Parses manual text; `path` is only used in errors.
    ///
    /// # Errors
    /// [`DeskError::Manual`] for a begin marker without an end (or the reverse), a block
    /// without a ```` ```toml ```` fence, or invalid TOML.
    pub fn parse(path: &Path, text: String) -> Result<Manual> {
        let bad = |reason: String| DeskError::Manual {
            path: path.to_path_buf(),
            reason,
        };
        let begin = find_line(&text, 0, BEGIN);
        let end = find_line(&text, begin.unwrap_or(0), END);
        let (b, e) = match (begin, end) {
            (None, None) => {
                return Ok(Manual {
                    text,
                    span: None,
                    machine: MachinePart::default(),
                })
            }
            (Some(b), Some(e)) => (b, e),
            (Some(_), None) => return Err(bad("the begin marker has no end marker".into())),
            (None, Some(_)) => return Err(bad("an end marker without a begin marker".into())),
        };
        let inner = &text[b..e];
        let fence = inner
            .find("\n```toml\n")
            .ok_or_else(|| bad("no ```toml fence inside the markers".into()))?;
        let body_start = fence + "\n```toml\n".len();
        let body_end = inner[body_start..]
            .find("\n```")
            .map(|i| body_start + i + 1)
            .or_else(|| inner[body_start..].starts_with("```").then_some(body_start))
            .ok_or_else(|| bad("the ```toml fence is not closed".into()))?;
        let machine: MachinePart = toml::from_str(&inner[body_start..body_end])
            .map_err(|e| bad(format!("invalid TOML: {}", e.message())))?;
        Ok(Manual {
            span: Some((b, e + END.len())),
            text,
            machine,
        })
    }

    /// Reads and parses `path`.
    ///
    /// # Errors
    /// I/O errors; see [`Manual::parse`].
    pub fn load(path: &Path) -> Result<Manual> {
        let text = fs::read_to_string(path).map_err(|e| DeskError::io("read", path, e))?;
        Manual::parse(path, text)
    }

    /// The whole file as read.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The human part: the text before and after the machine block.
    pub fn human(&self) -> String {
        match self.span {
            None => self.text.clone(),
            Some((b, e)) => format!("{}{}", &self.text[..b], &self.text[e..]),
        }
    }

    /// The file with the machine block replaced by `machine` (appended when absent); the
    /// rest is byte for byte the same.
    ///
    /// # Errors
    /// [`DeskError::Manual`] if `machine` cannot be written as TOML (e.g. a string with
    /// characters TOML cannot hold).
    pub fn render(&self, path: &Path, machine: &MachinePart) -> Result<String> {
        let block = render_block(machine).map_err(|e| DeskError::Manual {
            path: path.to_path_buf(),
            reason: format!("cannot write the machine part: {e}"),
        })?;
        Ok(match self.span {
            Some((b, e)) => format!("{}{block}{}", &self.text[..b], &self.text[e..]),
            None => {
                let sep = if self.text.is_empty() || self.text.ends_with('\n') {
                    ""
                } else {
                    "\n"
                };
                format!("{}{sep}\n{block}\n", self.text)
            }
        })
    }
}

fn manual_lock(desk: &Desk) -> Result<FileLock> {
    FileLock::acquire(
        &desk.locks_dir().join("manual.lock"),
        "the manual",
        Duration::from_secs(60),
        true,
    )
}

/// Read-modify-write of the machine part under the manual lock; atomic.
fn update(desk: &Desk, f: impl FnOnce(&mut MachinePart)) -> Result<MachinePart> {
    let _lock = manual_lock(desk)?;
    let path = desk.manual_path();
    let manual = match Manual::load(&path) {
        Ok(m) => m,
        Err(DeskError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Manual::parse(&path, template(desk.agent()))?
        }
        Err(e) => return Err(e),
    };
    let mut machine = manual.machine.clone();
    f(&mut machine);
    atomic_write(&path, manual.render(&path, &machine)?.as_bytes())?;
    Ok(machine)
}

/// Runs `version_cmd` for the desk (in the desk dir, `tools/bin` first on PATH); the
/// first output line on success.
fn probe_version(desk: &Desk, tool: &str, cmd: &str) -> Result<String, String> {
    // The sandbox gives the command the desk's own PATH and caches (as in `exec`).
    let out = shell::run(cmd, desk.dir(), &[], VERSION_TIMEOUT)
        .map_err(|e| format!("cannot run sh: {e}"))?;
    if out.code != Some(0) {
        return Err(out.failure());
    }
    out.first_line()
        .ok_or_else(|| format!("{tool}: the version command printed nothing"))
}

/// `manual record`: runs the tool's version command now and records tool, version and
/// command (replacing an entry of the same name). `version_cmd` defaults to the recorded
/// one, else `TOOL --version`.
///
/// # Errors
/// [`DeskError::VersionCmd`] when the command fails (nothing is written), manual errors.
pub fn record_tool(desk: &Desk, tool: &str, version_cmd: Option<&str>) -> Result<ToolEntry> {
    // The name becomes the default command (`TOOL --version`): letters, digits and
    // `._+-` only, so it can never carry shell syntax.
    let name_ok = !tool.is_empty()
        && tool.len() <= 64
        && !tool.starts_with('-')
        && tool
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'));
    if !name_ok {
        return Err(DeskError::VersionCmd {
            tool: tool.to_owned(),
            cmd: String::new(),
            reason: "a tool name is 1-64 of letters, digits, '.', '_', '+' or '-' (not starting with '-')".into(),
        });
    }
    let current = Manual::load(&desk.manual_path())
        .ok()
        .and_then(|m| m.machine.tools.into_iter().find(|t| t.name == tool));
    let cmd = match (version_cmd, &current) {
        (Some(c), _) => c.to_owned(),
        (None, Some(t)) => t.version_cmd.clone(),
        (None, None) => format!("{tool} --version"),
    };
    let version = probe_version(desk, tool, &cmd).map_err(|reason| DeskError::VersionCmd {
        tool: tool.to_owned(),
        cmd: cmd.clone(),
        reason,
    })?;
    let entry = ToolEntry {
        name: tool.to_owned(),
        version,
        version_cmd: cmd,
        recorded: Some(utc_iso(now_secs())),
    };
    let e = entry.clone();
    update(desk, move |m| {
        match m.tools.iter_mut().find(|t| t.name == e.name) {
            Some(t) => *t = e,
            None => m.tools.push(e),
        }
    })?;
    Ok(entry)
}

/// `manual repo`: records (or updates) the build/test commands of repo `name`, which must
/// be a directory under `repos/` (not a symlink); a `None` keeps the recorded value.
///
/// # Errors
/// [`DeskError::InvalidName`] (not one directory name: `/`, `..`, a leading `.` or `-`,
/// control characters, empty, over 255 bytes), [`DeskError::UnknownRepo`],
/// [`DeskError::UnsafeRepo`]; manual errors. Nothing is written on error.
pub fn record_repo(
    desk: &Desk,
    name: &str,
    test_cmd: Option<&str>,
    build_cmd: Option<&str>,
) -> Result<RepoEntry> {
    crate::repos::existing_dir(desk, name)?;
    let mut out = RepoEntry::default();
    let name = name.to_owned();
    update(desk, |m| {
        let idx = match m.repos.iter().position(|r| r.name == name) {
            Some(i) => i,
            None => {
                m.repos.push(RepoEntry {
                    name: name.clone(),
                    ..RepoEntry::default()
                });
                m.repos.len() - 1
            }
        };
        let r = &mut m.repos[idx];
        if let Some(t) = test_cmd {
            r.test_cmd = Some(t.to_owned());
        }
        if let Some(b) = build_cmd {
            r.build_cmd = Some(b.to_owned());
        }
        out = r.clone();
    })?;
    Ok(out)
}

/// One way the manual no longer tells the truth.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Drift {
    /// What it is about: `tool rg`, `repo app`, `CLAUDE.md`, `AGENTS.md`.
    pub subject: String,
    /// What is wrong, one line.
    pub problem: String,
}

/// `manual check`: every listed tool's version command runs and prints the recorded
/// version; every listed repo exists and the programs of its test/build commands exist
/// (relative to the repo, or on PATH with `tools/bin` first); `CLAUDE.md` still links to
/// `AGENTS.md`. Empty when all is true.
///
/// # Errors
/// Only when the manual cannot be read at all (a malformed block is reported as drift).
pub fn check(desk: &Desk) -> Result<Vec<Drift>> {
    let mut drift = Vec::new();
    let path = desk.manual_path();
    let manual = match Manual::load(&path) {
        Ok(m) => m,
        Err(e @ DeskError::Manual { .. }) => {
            drift.push(Drift {
                subject: "AGENTS.md".into(),
                problem: e.to_string(),
            });
            return Ok(drift);
        }
        Err(DeskError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            drift.push(Drift {
                subject: "AGENTS.md".into(),
                problem: "the manual is missing; `deskfs manual record` recreates it".into(),
            });
            return Ok(drift);
        }
        Err(e) => return Err(e),
    };
    check_claude_link(desk, &mut drift);
    for t in &manual.machine.tools {
        let subject = format!("tool {}", t.name);
        match probe_version(desk, &t.name, &t.version_cmd) {
            Ok(v) if v == t.version => {}
            Ok(v) => drift.push(Drift {
                subject,
                problem: format!(
                    "recorded version {:?}, now {:?} (re-record with `deskfs manual record {} {}`)",
                    t.version,
                    v,
                    desk.agent(),
                    t.name
                ),
            }),
            Err(reason) => drift.push(Drift {
                subject,
                problem: format!(
                    "`{}` failed ({reason}): the tool is missing or broken",
                    t.version_cmd
                ),
            }),
        }
    }
    let path_var = desk
        .command_env()
        .into_iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v)
        .unwrap_or_default();
    for r in &manual.machine.repos {
        let subject = format!("repo {}", r.name);
        if let Err(e) = crate::names::check_repo_name(&r.name) {
            drift.push(Drift {
                subject,
                problem: format!("{e}; remove the entry from the manual"),
            });
            continue;
        }
        let dir = desk.repo_dir(&r.name);
        if fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            drift.push(Drift {
                subject,
                problem: format!(
                    "{} is a symlink, not a directory on the desk",
                    dir.display()
                ),
            });
            continue;
        }
        if !dir.is_dir() {
            drift.push(Drift {
                subject,
                problem: format!("{} does not exist", dir.display()),
            });
            continue;
        }
        for (what, cmd) in [("test_cmd", &r.test_cmd), ("build_cmd", &r.build_cmd)] {
            let Some(cmd) = cmd else { continue };
            match shell::program_of(cmd) {
                None => drift.push(Drift {
                    subject: subject.clone(),
                    problem: format!("{what} is empty"),
                }),
                Some(prog) => {
                    if shell::find_program(prog, &dir, &path_var).is_none() {
                        drift.push(Drift {
                            subject: subject.clone(),
                            problem: format!("{what} {cmd:?}: program {prog:?} not found (in the repo or on PATH)"),
                        });
                    }
                }
            }
        }
    }
    Ok(drift)
}

fn check_claude_link(desk: &Desk, drift: &mut Vec<Drift>) {
    let claude = desk.claude_path();
    match fs::read_link(&claude) {
        Ok(t) if t == Path::new("AGENTS.md") => {}
        Ok(t) => drift.push(Drift {
            subject: "CLAUDE.md".into(),
            problem: format!("links to {} instead of AGENTS.md", t.display()),
        }),
        Err(_) if claude.exists() => drift.push(Drift {
            subject: "CLAUDE.md".into(),
            problem: "is a regular file, no longer a link to AGENTS.md: merge it into AGENTS.md and `ln -sf AGENTS.md CLAUDE.md`".into(),
        }),
        Err(_) => drift.push(Drift {
            subject: "CLAUDE.md".into(),
            problem: "is missing: `ln -s AGENTS.md CLAUDE.md` in the desk".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_render_preserves_human_part() {
        let p = Path::new("AGENTS.md");
        let t = template("a");
        let m = Manual::parse(p, t.clone()).unwrap();
        assert_eq!(m.machine, MachinePart::default());
        assert_eq!(
            m.render(p, &m.machine).unwrap(),
            t,
            "unchanged block renders identically"
        );
        let human_before = m.human();
        let mut mp = MachinePart::default();
        mp.tools.push(ToolEntry {
            name: "rg".into(),
            version: "ripgrep 14".into(),
            version_cmd: "rg --version".into(),
            recorded: None,
        });
        mp.repos.push(RepoEntry {
            name: "app".into(),
            test_cmd: Some("cargo test".into()),
            build_cmd: None,
        });
        let out = m.render(p, &mp).unwrap();
        let m2 = Manual::parse(p, out.clone()).unwrap();
        assert_eq!(m2.machine, mp);
        assert_eq!(m2.human(), human_before);
        // Text around the block, odd bytes included, survives exactly.
        let odd = format!(
            "x\r\n  trailing  \n{}\nafter\n\n\tend",
            &out[out.find(BEGIN).unwrap()..].trim_end()
        );
        let m3 = Manual::parse(p, odd.clone()).unwrap();
        let again = m3.render(p, &MachinePart::default()).unwrap();
        assert!(again.starts_with("x\r\n  trailing  \n"));
        assert!(again.ends_with("\nafter\n\n\tend"));
    }

    /// Found by `fuzz/fuzz_targets/agents_manual.rs` (`scripts/fuzz.sh agents_manual`):
    /// values with line breaks were written as TOML multi-line strings, and a line of one
    /// that started with ```` ``` ```` (or the end marker) ended the block early: the file
    /// `manual repo`/`record` had just written no longer parsed.
    #[test]
    fn values_with_line_breaks_stay_inside_the_block() {
        let p = Path::new("AGENTS.md");
        let m = Manual::parse(p, template("a")).unwrap();
        let mut mp = MachinePart::default();
        mp.repos.push(RepoEntry {
            name: "app".into(),
            test_cmd: Some("make\n```\nmake check".into()),
            build_cmd: Some(format!("x\n{END}\n{BEGIN} \"q\" 'q' \\ \t\r\u{1}\u{7f}é")),
        });
        mp.tools.push(ToolEntry {
            name: "n\n```toml\n".into(),
            version: "v\"1\"".into(),
            version_cmd: "a'b".into(),
            recorded: Some(String::new()),
        });
        let out = m.render(p, &mp).unwrap();
        let back = Manual::parse(p, out.clone()).unwrap();
        assert_eq!(back.machine, mp);
        assert_eq!(back.human(), m.human());
        assert_eq!(back.render(p, &mp).unwrap(), out);
    }

    #[test]
    fn every_field_round_trips_in_the_layout_toml_writes() {
        let mp = MachinePart {
            tools: vec![
                ToolEntry {
                    name: "rg".into(),
                    version: "ripgrep 14.1.0".into(),
                    version_cmd: "rg --version".into(),
                    recorded: Some("2026-12-04T10:00:00Z".into()),
                },
                ToolEntry {
                    name: "jq".into(),
                    version: "jq-1.7".into(),
                    version_cmd: "jq --version".into(),
                    recorded: None,
                },
            ],
            repos: vec![
                RepoEntry {
                    name: "app".into(),
                    test_cmd: Some("pytest -k \"not slow\"".into()),
                    build_cmd: Some("make".into()),
                },
                RepoEntry::default(),
            ],
        };
        let body = render_body(&mp);
        assert_eq!(body, toml::to_string(&mp).unwrap());
        assert_eq!(toml::from_str::<MachinePart>(&body).unwrap(), mp);
    }

    #[test]
    fn malformed_and_missing_blocks() {
        let p = Path::new("AGENTS.md");
        assert!(Manual::parse(p, format!("a\n{BEGIN} x -->\n")).is_err());
        assert!(Manual::parse(p, format!("a\n{END}\n")).is_err());
        assert!(Manual::parse(p, format!("{BEGIN} -->\nno fence\n{END}\n")).is_err());
        assert!(Manual::parse(
            p,
            format!("{BEGIN} -->\n```toml\n[[tool]]\nname=1\n```\n{END}\n")
        )
        .is_err());
        let m = Manual::parse(p, "just prose".into()).unwrap();
        let out = m.render(p, &MachinePart::default()).unwrap();
        assert!(out.starts_with("just prose\n\n"));
        assert!(Manual::parse(p, out).unwrap().span.is_some());
    }
}
