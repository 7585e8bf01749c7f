//! The file tools of the MCP server, named and shaped like the reference MCP filesystem
//! server (`@modelcontextprotocol/server-filesystem`: tool names, arguments, result
//! text), over one desk held as a [`DeskDir`]. The desk appears as the one allowed
//! directory [`DESK_ROOT`] (`/desk`, where `deskfs exec` shows it too); a path is either
//! under `/desk` or relative to it, and every path is confined by [`DeskDir`] (no `..`,
//! no symlink out, no other absolute path).
//!
//! Each function here is blocking file-system work returning the tool's result text, or
//! a [`ServeError`] whose code the MCP layer puts in the error result. Writes are only
//! staged here ([`stage_text`]); the caller commits them under the desk's write lock.

use std::io::Write;

use globset::{Glob, GlobMatcher};
use serde::Serialize;

use crate::confine::{DeskDir, Kind, RelPath, Staged, Stat};
use crate::error::{Code, Result, ServeError};

/// Where the desk appears to MCP clients: the one allowed directory.
pub const DESK_ROOT: &str = "/desk";

/// Largest file a text tool reads or edits, bytes (a tool result is held in memory and
/// sent in one message).
pub const MAX_TEXT: u64 = 16 << 20;

/// Most entries `directory_tree` and `search_files` visit before they stop with
/// `too_large` (ask for a subdirectory, or exclude more).
pub const MAX_WALK: usize = 100_000;

/// A path as a tool receives it: `/desk/…`, `/desk`, or relative to the desk.
///
/// # Errors
/// `outside_desk` for another absolute path; those of [`RelPath::parse`].
pub fn desk_path(s: &str) -> Result<RelPath> {
    let rel = if s == DESK_ROOT {
        ""
    } else if let Some(r) = s.strip_prefix("/desk/") {
        r
    } else if s.starts_with('/') {
        return Err(ServeError::new(
            Code::OutsideDesk,
            format!("{s:?} is outside the allowed directory {DESK_ROOT}; use a path under {DESK_ROOT} or relative to it"),
        ));
    } else {
        s
    };
    RelPath::parse(rel)
}

/// How a desk path is shown in results: `/desk/a/b` (`/desk` for the root).
pub fn shown(p: &RelPath) -> String {
    if p.is_root() {
        DESK_ROOT.to_owned()
    } else {
        format!("{DESK_ROOT}/{}", p.display())
    }
}

fn read_bytes(dir: &DeskDir, p: &RelPath) -> Result<(Vec<u8>, Stat)> {
    match dir.read_up_to(p, MAX_TEXT)? {
        (Some(buf), st) => Ok((buf, st)),
        (None, st) => Err(ServeError::new(
            Code::TooLarge,
            format!(
                "{} is {} bytes, more than the {MAX_TEXT} a tool reads; use head/tail or the HTTP API's Range",
                shown(p),
                st.size
            ),
        )),
    }
}

/// The file's text (UTF-8; invalid bytes become U+FFFD) with the version it was read at.
///
/// # Errors
/// `not_found`, `is_dir`, `too_large` (over [`MAX_TEXT`]), `outside_desk`, `io`.
pub fn read_text(dir: &DeskDir, p: &RelPath) -> Result<(String, Stat)> {
    let (buf, st) = read_bytes(dir, p)?;
    Ok((String::from_utf8_lossy(&buf).into_owned(), st))
}

/// The file's text, which must be UTF-8 (for an edit that writes the whole file back:
/// a lossy read would replace every invalid byte), with the version it was read at.
///
/// # Errors
/// `conflict` when the file is not UTF-8; those of [`read_text`].
pub fn read_utf8(dir: &DeskDir, p: &RelPath) -> Result<(String, Stat)> {
    let (buf, st) = read_bytes(dir, p)?;
    let text = String::from_utf8(buf).map_err(|e| {
        ServeError::new(
            Code::Conflict,
            format!(
                "{} is not UTF-8 text (byte {} is not): an edit would corrupt it; replace it whole with write_file",
                shown(p),
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    Ok((text, st))
}

/// `read_text_file`: the whole text, or its first `head` or last `tail` lines.
///
/// # Errors
/// `bad_request` when both `head` and `tail` are given; those of [`read_text`].
pub fn read_text_file(
    dir: &DeskDir,
    path: &str,
    head: Option<usize>,
    tail: Option<usize>,
) -> Result<String> {
    let p = desk_path(path)?;
    if head.is_some() && tail.is_some() {
        return Err(ServeError::new(
            Code::BadRequest,
            "cannot specify both head and tail parameters simultaneously; give one",
        ));
    }
    let (text, _) = read_text(dir, &p)?;
    Ok(match (head, tail) {
        (Some(n), _) => text.split('\n').take(n).collect::<Vec<_>>().join("\n"),
        (_, Some(n)) => {
            let body = text.strip_suffix('\n').unwrap_or(&text);
            let lines: Vec<&str> = body.split('\n').collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        _ => text,
    })
}

/// `read_multiple_files`: each file as `PATH:\nTEXT\n`, or `PATH: Error - MESSAGE` for
/// one that cannot be read (the others are still read), separated by `\n---\n`. The
/// texts together are at most [`MAX_TEXT`] bytes: a file past that budget is an error
/// line asking for another call.
pub fn read_multiple_files(dir: &DeskDir, paths: &[String]) -> String {
    let mut budget = MAX_TEXT as usize;
    paths
        .iter()
        .map(|path| {
            let read = desk_path(path).and_then(|p| read_text(dir, &p).map(|(t, _)| (p, t)));
            match read {
                Ok((p, text)) if text.len() <= budget => {
                    budget -= text.len();
                    format!("{}:\n{text}\n", shown(&p))
                }
                Ok(_) => format!(
                    "{path}: Error - the files before it fill this result's {} MiB; read it in another call",
                    MAX_TEXT >> 20
                ),
                Err(e) => format!("{path}: Error - {}", e.message),
            }
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// Stages `content` as the new content of `p` (a temporary file beside it, written and
/// not yet committed).
///
/// # Errors
/// Those of [`DeskDir::stage`] and `io` for the write.
pub fn stage_text(dir: &DeskDir, p: &RelPath, content: &[u8]) -> Result<Staged> {
    let mut staged = dir.stage(p)?;
    let Some(f) = staged.file() else {
        return Err(ServeError::new(Code::Io, "no temporary file"));
    };
    f.write_all(content)
        .map_err(|e| ServeError::io("write", &shown(p), e))?;
    Ok(staged)
}

/// One `edit_file` edit: replace `old_text` with `new_text`.
#[derive(Clone, Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    /// Text to search for: matched exactly first, else line by line ignoring leading
    /// and trailing whitespace (the first line's indentation is kept).
    #[serde(rename = "oldText")]
    pub old_text: String,
    /// Text to replace it with.
    #[serde(rename = "newText")]
    pub new_text: String,
}

/// Applies `edits` in order to `content` (line endings normalised to `\n`).
///
/// # Errors
/// `not_found` naming the first edit whose text is not in the file (nothing is changed).
pub fn apply_edits(content: &str, edits: &[Edit]) -> Result<String> {
    let mut text = content.replace("\r\n", "\n");
    for e in edits {
        let old = e.old_text.replace("\r\n", "\n");
        let new = e.new_text.replace("\r\n", "\n");
        if old.is_empty() {
            return Err(ServeError::new(
                Code::BadRequest,
                "an edit's oldText is empty; give the text to replace",
            ));
        }
        if let Some(at) = text.find(&old) {
            text.replace_range(at..at + old.len(), &new);
            continue;
        }
        text = replace_lines_loosely(&text, &old, &new).ok_or_else(|| {
            ServeError::new(
                Code::NotFound,
                format!("Could not find exact match for edit:\n{}", e.old_text),
            )
        })?;
    }
    Ok(text)
}

fn indent_of(s: &str) -> &str {
    &s[..s.len() - s.trim_start().len()]
}

/// The first run of lines equal to `old`'s lines up to surrounding whitespace, replaced
/// by `new`'s lines: the first keeps the matched line's indentation, the others keep
/// their indentation relative to the old text's.
fn replace_lines_loosely(text: &str, old: &str, new: &str) -> Option<String> {
    let old_lines: Vec<&str> = old.split('\n').collect();
    let lines: Vec<&str> = text.split('\n').collect();
    let n = old_lines.len();
    let at = (0..=lines.len().checked_sub(n)?).find(|&i| {
        lines[i..i + n]
            .iter()
            .zip(&old_lines)
            .all(|(a, b)| a.trim() == b.trim())
    })?;
    let base = indent_of(lines[at]);
    let replaced: Vec<String> = new
        .split('\n')
        .enumerate()
        .map(|(j, line)| {
            if j == 0 {
                return format!("{base}{}", line.trim_start());
            }
            let old_indent = old_lines.get(j).map(|l| indent_of(l)).unwrap_or("");
            let new_indent = indent_of(line);
            if !old_indent.is_empty() && !new_indent.is_empty() {
                let extra = new_indent.len().saturating_sub(old_indent.len());
                format!("{base}{}{}", " ".repeat(extra), line.trim_start())
            } else {
                line.to_owned()
            }
        })
        .collect();
    let mut out: Vec<String> = lines[..at].iter().map(|s| (*s).to_owned()).collect();
    out.extend(replaced);
    out.extend(lines[at + n..].iter().map(|s| (*s).to_owned()));
    Some(out.join("\n"))
}

/// A git-style unified diff of `old` → `new` for `name`, fenced as a `diff` block with
/// enough backticks that the diff's own cannot close it.
pub fn fenced_diff(name: &str, old: &str, new: &str) -> String {
    let diff = similar::TextDiff::from_lines(old, new);
    let body = diff
        .unified_diff()
        .context_radius(3)
        .header(&format!("{name}\toriginal"), &format!("{name}\tmodified"))
        .to_string();
    let patch = format!(
        "Index: {name}\n===================================================================\n{body}"
    );
    let mut ticks = 3;
    while patch.contains(&"`".repeat(ticks)) {
        ticks += 1;
    }
    let fence = "`".repeat(ticks);
    format!("{fence}diff\n{patch}{fence}\n\n")
}

/// `list_directory`: `[DIR] name` / `[FILE] name` lines, by name.
///
/// # Errors
/// `not_found`, `not_dir`, `outside_desk`, `io`.
pub fn list_directory(dir: &DeskDir, path: &str) -> Result<String> {
    let p = desk_path(path)?;
    let mut entries = dir.list(&p)?;
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries
        .iter()
        .map(|e| format!("{} {}", tag(e.kind), leaf(&e.path)))
        .collect::<Vec<_>>()
        .join("\n"))
}

fn tag(k: Kind) -> &'static str {
    if k == Kind::Dir {
        "[DIR]"
    } else {
        "[FILE]"
    }
}

fn leaf(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A size as the reference server shows it: `0 B`, `512 B`, `1.50 KB`, … `TB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    if bytes == 0 {
        return "0 B".to_owned();
    }
    let mut i = 0;
    while i + 1 < UNITS.len() && bytes >= 1u64 << (10 * (i + 1)) {
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!(
            "{:.2} {}",
            bytes as f64 / (1u64 << (10 * i)) as f64,
            UNITS[i]
        )
    }
}

/// `list_directory_with_sizes`: entries with sizes (by name, or by size largest first),
/// then a blank line, `Total: F files, D directories` and `Combined size: S`.
///
/// # Errors
/// `bad_request` for a `sort_by` other than `name`/`size`; those of [`list_directory`].
pub fn list_directory_with_sizes(dir: &DeskDir, path: &str, sort_by: &str) -> Result<String> {
    let p = desk_path(path)?;
    let mut entries = dir.list(&p)?;
    match sort_by {
        "name" => entries.sort_by(|a, b| a.path.cmp(&b.path)),
        // largest first; a directory counts as 0 (its own size is not its content's)
        "size" => entries.sort_by_key(|e| {
            (
                std::cmp::Reverse(if e.kind == Kind::Dir { 0 } else { e.size }),
                e.path.clone(),
            )
        }),
        other => {
            return Err(ServeError::new(
                Code::BadRequest,
                format!("sortBy {other:?}: use \"name\" or \"size\""),
            ))
        }
    }
    let mut lines: Vec<String> = entries
        .iter()
        .map(|e| {
            let size = if e.kind == Kind::Dir {
                String::new()
            } else {
                format!("{:>10}", format_size(e.size))
            };
            format!("{} {:<30} {size}", tag(e.kind), leaf(&e.path))
        })
        .collect();
    let files = entries.iter().filter(|e| e.kind != Kind::Dir).count();
    let dirs = entries.len() - files;
    let total: u64 = entries
        .iter()
        .filter(|e| e.kind != Kind::Dir)
        .map(|e| e.size)
        .sum();
    lines.push(String::new());
    lines.push(format!("Total: {files} files, {dirs} directories"));
    lines.push(format!("Combined size: {}", format_size(total)));
    Ok(lines.join("\n"))
}

fn matcher(pattern: &str) -> Result<GlobMatcher> {
    Glob::new(pattern)
        .map(|g| g.compile_matcher())
        .map_err(|e| {
            ServeError::new(
                Code::BadRequest,
                format!("bad glob pattern {pattern:?}: {e}"),
            )
        })
}

/// Exclude patterns: a pattern with `*` is a glob on the path relative to the walk's
/// start; one without excludes every entry of that name (and what is under it).
struct Excludes(Vec<GlobMatcher>);

impl Excludes {
    fn new(patterns: &[String]) -> Result<Excludes> {
        patterns
            .iter()
            .map(|p| {
                if p.contains('*') {
                    matcher(p)
                } else {
                    matcher(&format!("**/{p}"))
                }
            })
            .collect::<Result<Vec<_>>>()
            .map(Excludes)
    }

    fn excludes(&self, rel: &str) -> bool {
        self.0.iter().any(|m| m.is_match(rel))
    }
}

/// One node of `directory_tree`.
#[derive(Serialize)]
pub struct TreeNode {
    /// The entry's name.
    pub name: String,
    /// `file` or `directory` (a symlink is a `file`: it is not followed).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Present for directories only (empty when empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<TreeNode>>,
}

/// `directory_tree`: the tree under `path` as JSON with 2-space indentation.
///
/// # Errors
/// `too_large` past [`MAX_WALK`] entries; `bad_request` for a bad pattern; those of
/// [`list_directory`].
pub fn directory_tree(dir: &DeskDir, path: &str, exclude: &[String]) -> Result<String> {
    let p = desk_path(path)?;
    let ex = Excludes::new(exclude)?;
    let mut seen = 0usize;
    let tree = tree_of(dir, &p, "", &ex, &mut seen)?;
    serde_json::to_string_pretty(&tree).map_err(|e| ServeError::new(Code::Io, e.to_string()))
}

fn tree_of(
    dir: &DeskDir,
    p: &RelPath,
    rel: &str,
    ex: &Excludes,
    seen: &mut usize,
) -> Result<Vec<TreeNode>> {
    let mut entries = dir.list(p)?;
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        *seen += 1;
        if *seen > MAX_WALK {
            return Err(too_many(p));
        }
        let name = leaf(&e.path).to_owned();
        let child_rel = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if ex.excludes(&child_rel) {
            continue;
        }
        let children = if e.kind == Kind::Dir {
            Some(tree_of(dir, &p.join(&name), &child_rel, ex, seen)?)
        } else {
            None
        };
        out.push(TreeNode {
            name,
            kind: if e.kind == Kind::Dir {
                "directory"
            } else {
                "file"
            },
            children,
        });
    }
    Ok(out)
}

fn too_many(p: &RelPath) -> ServeError {
    ServeError::new(
        Code::TooLarge,
        format!(
            "more than {MAX_WALK} entries under {}; start deeper or add excludePatterns",
            shown(p)
        ),
    )
}

/// `search_files`: paths under `path` whose path relative to it matches the glob
/// `pattern` (`*.rs` matches at the top only, `**/*.rs` at any depth), one per line,
/// or `No matches found`.
///
/// # Errors
/// As [`directory_tree`].
pub fn search_files(
    dir: &DeskDir,
    path: &str,
    pattern: &str,
    exclude: &[String],
) -> Result<String> {
    let p = desk_path(path)?;
    let glob = Glob::new(pattern).map_err(|e| {
        ServeError::new(
            Code::BadRequest,
            format!("bad glob pattern {pattern:?}: {e}"),
        )
    })?;
    let m = globset::GlobBuilder::new(glob.glob())
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| {
            ServeError::new(
                Code::BadRequest,
                format!("bad glob pattern {pattern:?}: {e}"),
            )
        })?;
    let ex = Excludes::new(exclude)?;
    let mut found = Vec::new();
    let mut stack = vec![(p.clone(), String::new())];
    let mut seen = 0usize;
    while let Some((d, rel)) = stack.pop() {
        let mut entries = dir.list(&d)?;
        entries.sort_by(|a, b| b.path.cmp(&a.path));
        for e in entries {
            seen += 1;
            if seen > MAX_WALK {
                return Err(too_many(&p));
            }
            let name = leaf(&e.path).to_owned();
            let child_rel = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if ex.excludes(&child_rel) {
                continue;
            }
            let child = d.join(&name);
            if m.is_match(&child_rel) {
                found.push(shown(&child));
            }
            if e.kind == Kind::Dir {
                stack.push((child, child_rel));
            }
        }
    }
    found.sort();
    Ok(if found.is_empty() {
        "No matches found".to_owned()
    } else {
        found.join("\n")
    })
}

fn time_text(ns: i64) -> String {
    deskfs_desk::fsutil::utc_iso_millis(ns)
}

/// `get_file_info`: `key: value` lines — size, modified, accessed, changed (status
/// change: Linux keeps no creation time deskfs could report), isDirectory, isFile,
/// isSymbolicLink, permissions (octal), etag.
///
/// # Errors
/// `not_found`, `outside_desk`, `io`.
pub fn get_file_info(dir: &DeskDir, path: &str) -> Result<String> {
    let p = desk_path(path)?;
    let st = dir.stat(&p)?;
    let mut lines = vec![
        format!("size: {}", st.size),
        format!("modified: {}", time_text(st.mtime_ns)),
        format!("accessed: {}", time_text(st.atime_ns)),
        format!("changed: {}", time_text(st.ctime_ns)),
        format!("isDirectory: {}", st.kind == Kind::Dir),
        format!("isFile: {}", st.kind == Kind::File),
        format!("isSymbolicLink: {}", st.kind == Kind::Symlink),
        format!("permissions: {:03o}", st.mode & 0o777),
        format!("etag: {}", st.etag),
    ];
    if let Some(t) = &st.target {
        lines.push(format!("target: {t}"));
    }
    Ok(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desk() -> (tempfile::TempDir, DeskDir) {
        let t = tempfile::tempdir().expect("tempdir");
        let d = DeskDir::open(t.path()).expect("open");
        (t, d)
    }

    fn put(t: &tempfile::TempDir, p: &str, s: &str) {
        let f = t.path().join(p);
        std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
        std::fs::write(f, s).expect("write");
    }

    #[test]
    fn paths_are_under_desk_or_relative_and_nothing_else() {
        assert_eq!(desk_path("/desk/a/b").expect("ok").display(), "a/b");
        assert_eq!(desk_path("a/b").expect("ok").display(), "a/b");
        assert!(desk_path("/desk").expect("ok").is_root());
        for bad in ["/etc/passwd", "/deskX/a", "/desk/../x", "../x", "a/\0"] {
            assert!(desk_path(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            desk_path("/desks/a").map_err(|e| e.code),
            Err(Code::OutsideDesk)
        );
    }

    #[test]
    fn head_and_tail_take_lines_and_not_both() {
        let (t, d) = desk();
        put(&t, "f", "1\n2\n3\n4\n");
        assert_eq!(
            read_text_file(&d, "f", Some(2), None).expect("head"),
            "1\n2"
        );
        assert_eq!(
            read_text_file(&d, "/desk/f", None, Some(2)).expect("tail"),
            "3\n4"
        );
        assert_eq!(
            read_text_file(&d, "f", None, None).expect("all"),
            "1\n2\n3\n4\n"
        );
        assert_eq!(
            read_text_file(&d, "f", Some(1), Some(1)).map_err(|e| e.code),
            Err(Code::BadRequest)
        );
    }

    #[test]
    fn read_multiple_reports_each_failure_and_reads_the_rest() {
        let (t, d) = desk();
        put(&t, "a", "A");
        let out = read_multiple_files(&d, &["a".into(), "/etc/passwd".into(), "nope".into()]);
        let parts: Vec<&str> = out.split("\n---\n").collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], "/desk/a:\nA\n");
        assert!(
            parts[1].starts_with("/etc/passwd: Error - "),
            "{}",
            parts[1]
        );
        assert!(parts[2].starts_with("nope: Error - "), "{}", parts[2]);
    }

    #[test]
    fn read_multiple_holds_at_most_one_budget_of_text() {
        let (t, d) = desk();
        put(&t, "big", &"x".repeat((MAX_TEXT as usize) / 2 + 1));
        put(&t, "small", "s");
        let names: Vec<String> = ["big", "big", "small", "big"].map(String::from).to_vec();
        let out = read_multiple_files(&d, &names);
        assert!(out.len() < MAX_TEXT as usize + 4096, "{} bytes", out.len());
        let parts: Vec<&str> = out.split("\n---\n").collect();
        assert_eq!(parts.len(), 4);
        assert!(parts[0].starts_with("/desk/big:\nxxx"));
        assert!(
            parts[1].starts_with("big: Error - ") && parts[1].contains("another call"),
            "{}",
            &parts[1][..80.min(parts[1].len())]
        );
        assert_eq!(parts[2], "/desk/small:\ns\n");
        assert!(parts[3].starts_with("big: Error - "));
    }

    #[test]
    fn edits_read_only_utf8_text() {
        let (t, d) = desk();
        std::fs::write(t.path().join("bin"), b"ok\xff\n").expect("write");
        put(&t, "txt", "fine\n");
        let e = read_utf8(&d, &desk_path("bin").expect("path")).expect_err("not UTF-8");
        assert_eq!(e.code, Code::Conflict);
        assert!(
            e.message.contains("byte 2") && e.message.contains("write_file"),
            "{}",
            e.message
        );
        assert_eq!(
            read_utf8(&d, &desk_path("txt").expect("path"))
                .expect("utf8")
                .0,
            "fine\n"
        );
    }

    #[test]
    fn edits_match_exactly_then_loosely_keeping_indentation() {
        let text = "fn main() {\n    let x = 1;\n    println!(\"{x}\");\n}\n";
        let exact = apply_edits(
            text,
            &[Edit {
                old_text: "let x = 1;".into(),
                new_text: "let x = 2;".into(),
            }],
        )
        .expect("exact");
        assert!(exact.contains("    let x = 2;\n"));
        let loose = apply_edits(
            text,
            &[Edit {
                old_text: "let x = 1;\nprintln!(\"{x}\");".into(),
                new_text: "let y = 3;\nprintln!(\"{y}\");".into(),
            }],
        )
        .expect("loose");
        assert_eq!(
            loose,
            "fn main() {\n    let y = 3;\nprintln!(\"{y}\");\n}\n"
        );
        let missing = apply_edits(
            text,
            &[Edit {
                old_text: "nothing like this".into(),
                new_text: "x".into(),
            }],
        );
        assert_eq!(
            missing.map_err(|e| e.message),
            Err("Could not find exact match for edit:\nnothing like this".to_owned())
        );
    }

    #[test]
    fn the_diff_is_a_fenced_unified_diff() {
        let d = fenced_diff("/desk/f", "a\nb\nc\n", "a\nB\nc\n");
        assert!(d.starts_with("```diff\nIndex: /desk/f\n"), "{d}");
        assert!(
            d.contains("--- /desk/f\toriginal\n+++ /desk/f\tmodified\n"),
            "{d}"
        );
        assert!(d.contains("@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"), "{d}");
        assert!(d.ends_with("```\n\n"));
        let fenced = fenced_diff("f", "x\n", "```\n");
        assert!(fenced.starts_with("````diff\n"), "{fenced}");
    }

    #[test]
    fn listings_tag_dirs_and_files_and_sum_sizes() {
        let (t, d) = desk();
        put(&t, "b.txt", "12345");
        put(&t, "sub/x", "1");
        assert_eq!(
            list_directory(&d, "/desk").expect("list"),
            "[FILE] b.txt\n[DIR] sub"
        );
        let sized = list_directory_with_sizes(&d, "", "size").expect("sizes");
        let lines: Vec<&str> = sized.lines().collect();
        assert_eq!(lines[0], format!("[FILE] {:<30} {:>10}", "b.txt", "5 B"));
        assert_eq!(lines[1].trim_end(), "[DIR] sub");
        assert_eq!(
            &lines[3..],
            ["Total: 1 files, 1 directories", "Combined size: 5 B"]
        );
        assert_eq!(format_size(1536), "1.50 KB");
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(3 << 20), "3.00 MB");
    }

    #[test]
    fn tree_and_search_follow_globs_and_excludes() {
        let (t, d) = desk();
        put(&t, "src/a.rs", "");
        put(&t, "src/deep/b.rs", "");
        put(&t, "node_modules/m/c.rs", "");
        put(&t, "top.rs", "");
        let tree: serde_json::Value =
            serde_json::from_str(&directory_tree(&d, "", &["node_modules".into()]).expect("tree"))
                .expect("json");
        let names: Vec<&str> = tree
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|n| n["name"].as_str())
            .collect();
        assert_eq!(names, ["src", "top.rs"]);
        assert_eq!(tree[0]["type"], "directory");
        assert!(tree[1].get("children").is_none());
        assert_eq!(
            search_files(&d, "", "*.rs", &[]).expect("top"),
            "/desk/top.rs"
        );
        assert_eq!(
            search_files(&d, "/desk", "**/*.rs", &["node_modules".into()]).expect("deep"),
            "/desk/src/a.rs\n/desk/src/deep/b.rs\n/desk/top.rs"
        );
        assert_eq!(
            search_files(&d, "src", "*.py", &[]).expect("none"),
            "No matches found"
        );
    }

    #[test]
    fn a_symlink_out_of_the_desk_is_never_followed_by_a_tool() {
        let (t, d) = desk();
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("secret"), "s").expect("write");
        std::os::unix::fs::symlink(outside.path(), t.path().join("out")).expect("link");
        assert_eq!(
            read_text_file(&d, "out/secret", None, None).map_err(|e| e.code),
            Err(Code::OutsideDesk)
        );
        assert_eq!(
            list_directory(&d, "out").map_err(|e| e.code),
            Err(Code::OutsideDesk)
        );
        // the link itself is listed, not followed
        assert_eq!(
            search_files(&d, "", "**/secret", &[]).expect("search"),
            "No matches found"
        );
    }

    #[test]
    fn file_info_shows_times_kind_and_mode() {
        let (t, d) = desk();
        put(&t, "f", "abc");
        let info = get_file_info(&d, "/desk/f").expect("info");
        assert!(info.starts_with("size: 3\nmodified: 20"), "{info}");
        assert!(info.contains("\nisFile: true\n"), "{info}");
        assert_eq!(time_text(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            time_text(1_780_000_000_123_000_000),
            "2026-05-28T20:26:40.123Z"
        );
    }
}
