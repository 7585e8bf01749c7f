//! Anthropic's memory tool (`memory_20250818`), handled on a desk: the model's paths
//! `/memories/...` are the desk's `memories/` directory, and the six commands (`view`,
//! `create`, `str_replace`, `insert`, `delete`, `rename`) answer with the protocol's
//! result and error strings ([`text`]). HTTP (`POST /v1/desks/{agent}/memory`) and MCP
//! (the `memory` tool) both call [`run`] with the tool-use `input` and send back the
//! text it returns as the tool result (with `is_error` for the error strings).
//!
//! Where the strings come from (checked 2026-12-03):
//! - Anthropic's memory tool documentation,
//!   <https://platform.claude.com/docs/en/agents-and-tools/tool-use/memory-tool>
//!   ("Tool commands": every return value and error string of the six commands, the
//!   6-wide right-aligned line numbers with a tab, the 999,999-line limit, the directory
//!   listing's header, sizes and tab). Where the documentation gives a string, it is used
//!   as published (for example `Error: File {path} already exists`).
//! - Where the documentation gives none, the reference implementation in Anthropic's
//!   Python SDK, `anthropics/anthropic-sdk-python`,
//!   `src/anthropic/lib/tools/_beta_builtin_memory_tool.py`
//!   (`BetaLocalFilesystemMemoryTool`; the TypeScript SDK's
//!   `anthropics/anthropic-sdk-typescript`, `src/tools/memory/node.ts`, agrees): the
//!   text after "The memory file has been edited." (the snippet of two lines either side
//!   of the change), directories shown with a trailing `/`, the invalid-path strings
//!   (`Path must start with /memories, got: ...`, `... would escape /memories
//!   directory`, `... via symlink`), `Cannot delete the /memories directory itself`,
//!   `Unsupported file type for ...` and `Unknown command: ...`.
//! - Strings neither gives (bad input shapes, NUL bytes, over-long names, read-only
//!   tokens, files too large or not UTF-8, I/O failures) are deskfs's own, one line
//!   each, starting with `Error:` like the documented errors.
//!
//! Confinement: a path is checked as text first (it must be `/memories` or start with
//! `/memories/`; no `..` component, no NUL byte, names ≤ 255 bytes, paths ≤ 4,096
//! bytes), then every existing component under `memories/` is looked at without
//! following it and a symlink anywhere on the path is refused, and every file operation
//! then goes through [`DeskDir`], which resolves beneath the desk with `openat2`
//! (`RESOLVE_BENEATH`), so even a symlink swapped in after the check cannot lead out of
//! the desk. Writes replace atomically (a temporary file in the same directory,
//! `fsync`, rename; an edit commits only if the file still has the ETag it was read
//! with), and `memories/` is made at the first write.

use std::io::Write;

use serde_json::{json, Map, Value};

use crate::confine::{DeskDir, Kind, Precondition, RelPath, NAME_MAX, PATH_MAX};
use crate::error::{Code, ServeError};

/// The tool's `type` in the Messages API.
pub const TOOL_TYPE: &str = "memory_20250818";
/// The tool's name (in the Messages API and as an MCP tool).
pub const TOOL_NAME: &str = "memory";
/// The model's memory directory.
pub const MEMORY_ROOT: &str = "/memories";
/// The desk directory it is (relative to the desk's root).
pub const MEMORY_DIR: &str = "memories";
/// Files with more lines than this are not shown (documented limit).
pub const MAX_LINES: usize = 999_999;
/// Width of the line-number column (documented: 6, right-aligned, then a tab).
pub const LINE_NUMBER_WIDTH: usize = 6;
/// Largest memory file the tool reads, bytes (deskfs's limit).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Every result and error string of the tool, as templates: `{name}` is replaced by
/// that value (see the module documentation for where each comes from).
pub mod text {
    // ---- view (documentation)
    /// `view` of a directory: the header line.
    pub const VIEW_DIR_HEADER: &str = "Here're the files and directories up to 2 levels deep in {path}, excluding hidden items and node_modules:";
    /// `view` of a file: the header line.
    pub const VIEW_FILE_HEADER: &str = "Here's the content of {path} with line numbers:";
    /// `view` of a path that does not exist.
    pub const VIEW_NOT_FOUND: &str = "The path {path} does not exist. Please provide a valid path.";
    /// `view` of a file over [`super::MAX_LINES`] lines.
    pub const VIEW_TOO_MANY_LINES: &str =
        "File {path} exceeds maximum line limit of 999,999 lines.";
    /// `view` of a FIFO, socket or device (Python SDK).
    pub const VIEW_UNSUPPORTED: &str = "Unsupported file type for {path}";

    // ---- create (documentation)
    /// `create` done.
    pub const CREATE_OK: &str = "File created successfully at: {path}";
    /// `create` of a path that exists.
    pub const CREATE_EXISTS: &str = "Error: File {path} already exists";

    // ---- str_replace (documentation; the snippet's lead-in from the Python SDK)
    /// `str_replace` done; followed by a newline and the numbered snippet.
    pub const STR_REPLACE_OK: &str = "The memory file has been edited. Here is the snippet showing the change (with line numbers):";
    /// `str_replace` of a path that does not exist or is a directory.
    pub const STR_REPLACE_NOT_FOUND: &str =
        "Error: The path {path} does not exist. Please provide a valid path.";
    /// `str_replace` whose `old_str` is not in the file.
    pub const STR_REPLACE_NO_MATCH: &str =
        "No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}.";
    /// `str_replace` whose `old_str` is in the file more than once.
    pub const STR_REPLACE_MULTIPLE: &str = "No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines: {line_numbers}. Please ensure it is unique";

    // ---- insert (documentation)
    /// `insert` done.
    pub const INSERT_OK: &str = "The file {path} has been edited.";
    /// `insert` into a path that does not exist or is a directory.
    pub const INSERT_NOT_FOUND: &str = "Error: The path {path} does not exist";
    /// `insert` at a line outside `[0, lines]`.
    pub const INSERT_BAD_LINE: &str = "Error: Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the file: [0, {n_lines}]";

    // ---- delete (documentation; the root refusal from the Python SDK)
    /// `delete` done.
    pub const DELETE_OK: &str = "Successfully deleted {path}";
    /// `delete` of a path that does not exist.
    pub const DELETE_NOT_FOUND: &str = "Error: The path {path} does not exist";
    /// `delete` of `/memories` itself.
    pub const DELETE_ROOT: &str = "Cannot delete the /memories directory itself";

    // ---- rename (documentation)
    /// `rename` done.
    pub const RENAME_OK: &str = "Successfully renamed {old_path} to {new_path}";
    /// `rename` of a source that does not exist.
    pub const RENAME_NOT_FOUND: &str = "Error: The path {old_path} does not exist";
    /// `rename` onto a destination that exists (never overwritten).
    pub const RENAME_EXISTS: &str = "Error: The destination {new_path} already exists";

    // ---- paths (Python SDK)
    /// A path that is not under `/memories` at all.
    pub const PATH_PREFIX: &str = "Path must start with /memories, got: {path}";
    /// A path that leaves `/memories`: a `..` component, or `/memoriesX`.
    pub const PATH_ESCAPE: &str = "Path {path} would escape /memories directory";
    /// A path through a symlink that points out of `/memories`.
    pub const PATH_SYMLINK: &str = "Path would escape /memories directory via symlink";

    // ---- deskfs's own
    /// A path through a symlink that stays inside `/memories` (never followed either).
    pub const PATH_SYMLINK_INSIDE: &str =
        "Error: The path {path} goes through a symlink; the memory tool does not follow symlinks";
    /// A path with a NUL byte (shown as `\0`).
    pub const PATH_NUL: &str = "Error: The path {path} contains a NUL byte";
    /// A path with a component over 255 bytes.
    pub const PATH_NAME_TOO_LONG: &str = "Error: The path {path} has a name longer than 255 bytes";
    /// A path over 4,096 bytes.
    pub const PATH_TOO_LONG: &str = "Error: The path {path} is longer than 4096 bytes";
    /// `rename` of `/memories` itself.
    pub const RENAME_ROOT: &str = "Error: Cannot rename the /memories directory itself";
    /// `rename` of a directory into itself.
    pub const RENAME_INTO_ITSELF: &str = "Error: Cannot move {old_path} into itself ({new_path})";
    /// A command other than the six (Python SDK's message).
    pub const UNKNOWN_COMMAND: &str = "Unknown command: {command}";
    /// Input that is not a JSON object with a string `command`.
    pub const BAD_INPUT: &str = "Error: The memory tool takes a JSON object with a `command` (view, create, str_replace, insert, delete or rename)";
    /// A parameter missing or of the wrong type.
    pub const BAD_PARAMETER: &str = "Error: The `{command}` command needs `{name}` as {expected}";
    /// A change asked of a read-only memory (a read-only token).
    pub const READ_ONLY: &str =
        "Error: This memory is read-only (a read-only token); only `view` is allowed";
    /// An edit of a file that is not UTF-8 text.
    pub const NOT_UTF8: &str =
        "Error: The file {path} is not UTF-8 text; the memory tool edits text only";
    /// A file over [`super::MAX_FILE_BYTES`].
    pub const TOO_LARGE: &str =
        "Error: The file {path} is {size} bytes, more than the memory tool reads ({max} bytes)";
    /// An edit whose file changed between its read and its write (nothing written).
    pub const CHANGED: &str =
        "Error: The file {path} changed while it was being edited; nothing was written, try again";
    /// Any other failure of the file system (the message names the operation).
    pub const IO: &str = "Error: {message}";
}

/// What a command answered: the tool-result text, and whether it is an error (the
/// `is_error` of Anthropic's `tool_result`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryOutcome {
    /// The text of the tool result.
    pub text: String,
    /// The text is one of the error strings.
    pub is_error: bool,
}

impl MemoryOutcome {
    fn ok(text: String) -> MemoryOutcome {
        MemoryOutcome {
            text,
            is_error: false,
        }
    }
}

/// An error string, already filled in.
type Failed = String;
type Out<T> = std::result::Result<T, Failed>;

/// `template` with each `{name}` of `vars` replaced by its value, in one pass (a value
/// that itself contains `{path}` is not replaced again).
pub fn fill(template: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let hit = after.find('}').and_then(|close| {
            let name = &after[..close];
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (close, *v))
        });
        match hit {
            Some((close, v)) => {
                out.push_str(v);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Whether `input` asks for a change (every command but `view`; unknown or malformed
/// input is not a change, and [`run`] answers it with an error string).
pub fn is_change(input: &Value) -> bool {
    matches!(
        input.get("command").and_then(Value::as_str),
        Some("create" | "str_replace" | "insert" | "delete" | "rename")
    )
}

/// The JSON Schema of the tool's input (for MCP's tool list and the OpenAPI document).
pub fn input_schema() -> Value {
    json!({
        "type": "object",
        "required": ["command"],
        "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]},
            "path": {"type": "string", "description": "/memories or a path under it"},
            "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2, "description": "view: first and last line (1-based; -1 = to the end)"},
            "file_text": {"type": "string", "description": "create: the content"},
            "old_str": {"type": "string", "description": "str_replace: text that occurs exactly once"},
            "new_str": {"type": "string", "description": "str_replace: its replacement"},
            "insert_line": {"type": "integer", "description": "insert: the line after which to insert (0 = at the top)"},
            "insert_text": {"type": "string", "description": "insert: the text"},
            "old_path": {"type": "string", "description": "rename: the source"},
            "new_path": {"type": "string", "description": "rename: the destination (must not exist)"}
        }
    })
}

/// Runs one memory command (`input` is the tool-use `input` object) on the desk `desk`,
/// rooted at its `memories/`. `writable` is false for a read-only token: then only
/// `view` runs, every other command answers [`text::READ_ONLY`].
///
/// Never fails: every failure is one of the error strings, with `is_error` set.
pub fn run(desk: &DeskDir, input: &Value, writable: bool) -> MemoryOutcome {
    // Every component was checked for links as text (`check_links`); resolving with no
    // link followed makes a link swapped in after that check fail (`ELOOP`, the symlink
    // string) instead of leading elsewhere in the desk.
    let desk = match desk.without_symlinks() {
        Ok(d) => d,
        Err(e) => {
            return MemoryOutcome {
                text: io_failed(&e),
                is_error: true,
            }
        }
    };
    match dispatch(&desk, input, writable) {
        Ok(text) => MemoryOutcome::ok(text),
        Err(text) => MemoryOutcome {
            text,
            is_error: true,
        },
    }
}

fn dispatch(desk: &DeskDir, input: &Value, writable: bool) -> Out<String> {
    let Some(args) = input.as_object() else {
        return Err(text::BAD_INPUT.to_owned());
    };
    let Some(command) = args.get("command").and_then(Value::as_str) else {
        return Err(text::BAD_INPUT.to_owned());
    };
    let a = Args { command, args };
    match command {
        "view" => view(desk, &a),
        "create" | "str_replace" | "insert" | "delete" | "rename" if !writable => {
            Err(text::READ_ONLY.to_owned())
        }
        "create" => create(desk, &a),
        "str_replace" => str_replace(desk, &a),
        "insert" => insert(desk, &a),
        "delete" => delete(desk, &a),
        "rename" => rename(desk, &a),
        other => Err(fill(text::UNKNOWN_COMMAND, &[("command", other)])),
    }
}

/// The parameters of one command.
struct Args<'a> {
    command: &'a str,
    args: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    fn bad(&self, name: &str, expected: &str) -> Failed {
        fill(
            text::BAD_PARAMETER,
            &[
                ("command", self.command),
                ("name", name),
                ("expected", expected),
            ],
        )
    }

    fn str(&self, name: &str) -> Out<&'a str> {
        self.args
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| self.bad(name, "a string"))
    }

    fn int(&self, name: &str) -> Out<i64> {
        self.args
            .get(name)
            .and_then(Value::as_i64)
            .ok_or_else(|| self.bad(name, "an integer"))
    }

    /// `view_range`: absent or null, or two integers.
    fn range(&self) -> Out<Option<(i64, i64)>> {
        match self.args.get("view_range") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(v)) if v.len() == 2 => match (v[0].as_i64(), v[1].as_i64()) {
                (Some(a), Some(b)) => Ok(Some((a, b))),
                _ => Err(self.bad("view_range", "two integers [first, last]")),
            },
            Some(_) => Err(self.bad("view_range", "two integers [first, last]")),
        }
    }
}

/// A model path, checked: `rel` is desk-relative (`memories/...`), `shown` the path as
/// the model wrote it (every string quotes it so).
struct MemPath<'a> {
    rel: RelPath,
    shown: &'a str,
}

impl MemPath<'_> {
    fn is_root(&self) -> bool {
        self.rel.display() == MEMORY_DIR
    }
}

/// Checks `path` as text: `/memories` or `/memories/...`, no `..`, no NUL, names and
/// length within the limits.
fn parse_path(path: &str) -> Out<MemPath<'_>> {
    let escape = || fill(text::PATH_ESCAPE, &[("path", path)]);
    if path.contains('\0') {
        return Err(fill(
            text::PATH_NUL,
            &[("path", &path.replace('\0', "\\0"))],
        ));
    }
    let Some(rest) = path.strip_prefix(MEMORY_ROOT) else {
        return Err(fill(text::PATH_PREFIX, &[("path", path)]));
    };
    if !rest.is_empty() && !rest.starts_with('/') {
        // `/memoriesX`: a sibling of /memories, not inside it.
        return Err(escape());
    }
    if path.len() > PATH_MAX {
        return Err(fill(text::PATH_TOO_LONG, &[("path", path)]));
    }
    for c in rest.split('/') {
        if c == ".." {
            return Err(escape());
        }
        if c.len() > NAME_MAX {
            return Err(fill(text::PATH_NAME_TOO_LONG, &[("path", path)]));
        }
    }
    let rel = RelPath::parse(&format!("{MEMORY_DIR}{rest}")).map_err(|e| match e.code {
        Code::NameTooLong => fill(text::PATH_NAME_TOO_LONG, &[("path", path)]),
        Code::PathTooLong => fill(text::PATH_TOO_LONG, &[("path", path)]),
        Code::BadPath => fill(text::PATH_NUL, &[("path", path)]),
        _ => escape(),
    })?;
    Ok(MemPath { rel, shown: path })
}

/// A failure of a desk operation on `p` as an error string: a resolution that would
/// leave the desk (a symlink swapped in after [`check_links`]) is the symlink string.
fn io_failed(e: &ServeError) -> Failed {
    match e.code {
        Code::OutsideDesk => text::PATH_SYMLINK.to_owned(),
        _ => fill(text::IO, &[("message", &e.message)]),
    }
}

/// Refuses a path with a symlink at any existing component under the desk's root
/// (`memories` itself included), without following any: one pointing out of
/// `/memories` (or out of the desk) is [`text::PATH_SYMLINK`], one staying inside is
/// [`text::PATH_SYMLINK_INSIDE`].
fn check_links(desk: &DeskDir, p: &MemPath<'_>) -> Out<()> {
    let mut at = RelPath::root();
    for part in p.rel.display().split('/') {
        at = at.join(part);
        match desk.stat(&at) {
            Ok(st) if st.kind == Kind::Symlink => {
                let parent = at
                    .split_last()
                    .map(|(d, _)| d)
                    .unwrap_or_else(RelPath::root);
                let inside = st
                    .target
                    .as_deref()
                    .and_then(|t| parent.resolve_link(t).ok())
                    .is_some_and(|r| {
                        let r = r.display();
                        r == MEMORY_DIR || r.starts_with(&format!("{MEMORY_DIR}/"))
                    });
                return Err(if inside {
                    fill(text::PATH_SYMLINK_INSIDE, &[("path", p.shown)])
                } else {
                    text::PATH_SYMLINK.to_owned()
                });
            }
            Ok(_) => {}
            // The rest does not exist (or a file is in the way): the command says so.
            Err(e) if matches!(e.code, Code::NotFound | Code::NotDir) => return Ok(()),
            Err(e) => return Err(io_failed(&e)),
        }
    }
    Ok(())
}

/// A checked path of parameter `name`.
fn path_arg<'a>(desk: &DeskDir, a: &Args<'a>, name: &str) -> Out<MemPath<'a>> {
    let p = parse_path(a.str(name)?)?;
    check_links(desk, &p)?;
    Ok(p)
}

/// Human-readable size: bytes below 1 KiB (`512B`), else one decimal and the unit
/// (`4.0K`, `1.5K`, `1.2M`), as the documentation's examples show.
pub fn human_size(n: u64) -> String {
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    for unit in ["K", "M", "G"] {
        if v < 1024.0 {
            return format!("{v:.1}{unit}");
        }
        v /= 1024.0;
    }
    format!("{v:.1}T")
}

/// One numbered line: the number right-aligned in [`LINE_NUMBER_WIDTH`], a tab, the line.
fn numbered(n: usize, line: &str) -> String {
    format!("{n:>width$}\t{line}", width = LINE_NUMBER_WIDTH)
}

/// Whether a listing shows the entry `name` (hidden items and `node_modules` are not).
fn listed(name: &str) -> bool {
    !name.starts_with('.') && name != "node_modules"
}

fn name_of(desk_path: &str) -> &str {
    desk_path.rsplit('/').next().unwrap_or(desk_path)
}

/// Directory and file entries of `p` that a listing shows, sorted by name (symlinks and
/// special files are not shown).
fn shown_entries(desk: &DeskDir, p: &RelPath) -> Out<Vec<crate::confine::Stat>> {
    let mut v = desk.list(p).map_err(|e| io_failed(&e))?;
    v.retain(|s| listed(name_of(&s.path)) && matches!(s.kind, Kind::File | Kind::Dir));
    Ok(v)
}

fn view(desk: &DeskDir, a: &Args<'_>) -> Out<String> {
    let p = path_arg(desk, a, "path")?;
    let range = a.range()?;
    let not_found = || fill(text::VIEW_NOT_FOUND, &[("path", p.shown)]);
    let st = match desk.stat(&p.rel) {
        Ok(st) => st,
        // No memory yet: an empty /memories.
        Err(e) if e.code == Code::NotFound && p.is_root() => return Ok(listing(p.shown, 0, &[])),
        Err(e) if matches!(e.code, Code::NotFound | Code::NotDir) => return Err(not_found()),
        Err(e) => return Err(io_failed(&e)),
    };
    match st.kind {
        Kind::Dir => {
            let base = p.shown.trim_end_matches('/');
            let mut lines = Vec::new();
            for e in shown_entries(desk, &p.rel)? {
                let name = name_of(&e.path);
                if e.kind == Kind::Dir {
                    lines.push(format!("{}\t{base}/{name}/", human_size(e.size)));
                    let sub = p.rel.join(name);
                    // Removed meanwhile: shown without its entries.
                    for c in shown_entries(desk, &sub).unwrap_or_default() {
                        let cname = name_of(&c.path);
                        let slash = if c.kind == Kind::Dir { "/" } else { "" };
                        lines.push(format!(
                            "{}\t{base}/{name}/{cname}{slash}",
                            human_size(c.size)
                        ));
                    }
                } else {
                    lines.push(format!("{}\t{base}/{name}", human_size(e.size)));
                }
            }
            Ok(listing(p.shown, st.size, &lines))
        }
        Kind::File => {
            let content = read_text(desk, &p, false)?.0;
            let lines: Vec<&str> = content.split('\n').collect();
            if lines.len() > MAX_LINES {
                return Err(fill(text::VIEW_TOO_MANY_LINES, &[("path", p.shown)]));
            }
            let (first, end) = match range {
                None => (0, lines.len()),
                Some((a, b)) => {
                    let first = usize::try_from(a.max(1) - 1).unwrap_or(0);
                    let end = if b == -1 {
                        lines.len()
                    } else {
                        usize::try_from(b.max(0)).unwrap_or(0).min(lines.len())
                    };
                    (first, end)
                }
            };
            let body: Vec<String> = lines
                .get(first..end.max(first))
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(i, l)| numbered(first + i + 1, l))
                .collect();
            Ok(format!(
                "{}\n{}",
                fill(text::VIEW_FILE_HEADER, &[("path", p.shown)]),
                body.join("\n")
            ))
        }
        Kind::Symlink => Err(text::PATH_SYMLINK.to_owned()),
        Kind::Other => Err(fill(text::VIEW_UNSUPPORTED, &[("path", p.shown)])),
    }
}

/// The directory listing: the header, the directory's own line, then `lines`.
fn listing(shown: &str, size: u64, lines: &[String]) -> String {
    let mut out = fill(text::VIEW_DIR_HEADER, &[("path", shown)]);
    out.push('\n');
    out.push_str(&human_size(size));
    out.push('\t');
    out.push_str(shown);
    for l in lines {
        out.push('\n');
        out.push_str(l);
    }
    out
}

/// The content of file `p` and its ETag (at most [`MAX_FILE_BYTES`]); `strict`: refuse
/// content that is not UTF-8 (for edits), else show it with U+FFFD.
fn read_text(desk: &DeskDir, p: &MemPath<'_>, strict: bool) -> Out<(String, String)> {
    let (buf, st) = desk
        .read_up_to(&p.rel, MAX_FILE_BYTES)
        .map_err(|e| io_failed(&e))?;
    let Some(buf) = buf else {
        return Err(fill(
            text::TOO_LARGE,
            &[
                ("path", p.shown),
                ("size", &st.size.to_string()),
                ("max", &MAX_FILE_BYTES.to_string()),
            ],
        ));
    };
    let text = match String::from_utf8(buf) {
        Ok(s) => s,
        Err(_) if strict => return Err(fill(text::NOT_UTF8, &[("path", p.shown)])),
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    Ok((text, st.etag))
}

/// The regular file at `p` (for an edit): its content and ETag, or `not_found` when
/// there is none (a directory counts as none, as documented).
fn read_for_edit(desk: &DeskDir, p: &MemPath<'_>, not_found: &str) -> Out<(String, String)> {
    let missing = || fill(not_found, &[("path", p.shown)]);
    match desk.stat(&p.rel) {
        Ok(st) if st.kind == Kind::File => {}
        Ok(_) => return Err(missing()),
        Err(e) if matches!(e.code, Code::NotFound | Code::NotDir) => return Err(missing()),
        Err(e) => return Err(io_failed(&e)),
    }
    match read_text(desk, p, true) {
        Err(_) if desk.stat(&p.rel).is_err() => Err(missing()),
        r => r,
    }
}

/// Replaces `p` with `content` atomically (temporary file, `fsync`, rename) under
/// `pre`.
fn write(desk: &DeskDir, p: &MemPath<'_>, content: &str, pre: &Precondition) -> Out<()> {
    let mut staged = desk.stage(&p.rel).map_err(|e| io_failed(&e))?;
    let Some(f) = staged.file() else {
        return Err(fill(
            text::IO,
            &[("message", "the temporary file was lost")],
        ));
    };
    f.write_all(content.as_bytes())
        .map_err(|e| io_failed(&ServeError::io("write", &p.rel.display(), e)))?;
    staged.commit(pre).map(|_| ()).map_err(|e| match e.code {
        Code::Exists | Code::IsDir => fill(text::CREATE_EXISTS, &[("path", p.shown)]),
        Code::EtagMismatch => fill(text::CHANGED, &[("path", p.shown)]),
        _ => io_failed(&e),
    })
}

/// Makes the directories above `p` (`memories/` included) that are missing.
fn make_parents(desk: &DeskDir, p: &MemPath<'_>) -> Out<()> {
    if let Some((dir, _)) = p.rel.split_last() {
        desk.mkdir(&dir, true).map_err(|e| io_failed(&e))?;
    }
    Ok(())
}

fn create(desk: &DeskDir, a: &Args<'_>) -> Out<String> {
    let p = path_arg(desk, a, "path")?;
    let file_text = a.str("file_text")?;
    let exists = || fill(text::CREATE_EXISTS, &[("path", p.shown)]);
    if p.is_root() {
        return Err(exists());
    }
    make_parents(desk, &p)?;
    write(desk, &p, file_text, &Precondition::Absent)?;
    Ok(fill(text::CREATE_OK, &[("path", p.shown)]))
}

/// Start offsets of every occurrence of `needle` in `hay`, overlapping ones included
/// (an empty `needle` occurs at every character boundary).
fn occurrences(hay: &str, needle: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = hay.get(from..).and_then(|h| h.find(needle)) {
        let pos = from + i;
        out.push(pos);
        match hay[pos..].chars().next() {
            Some(c) => from = pos + c.len_utf8(),
            None => break,
        }
    }
    out
}

fn line_of(hay: &str, pos: usize) -> usize {
    hay.as_bytes()[..pos]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The distinct 1-based lines where the sorted offsets `at` fall, in one pass over `hay`.
fn lines_of(hay: &str, at: &[usize]) -> Vec<usize> {
    let (mut line, mut from, mut out) = (1usize, 0usize, Vec::new());
    for &pos in at {
        line += hay.as_bytes()[from..pos]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        from = pos;
        if out.last() != Some(&line) {
            out.push(line);
        }
    }
    out
}

fn str_replace(desk: &DeskDir, a: &Args<'_>) -> Out<String> {
    let p = path_arg(desk, a, "path")?;
    let old = a.str("old_str")?;
    let new = a.str("new_str")?;
    let (content, etag) = read_for_edit(desk, &p, text::STR_REPLACE_NOT_FOUND)?;
    let found = occurrences(&content, old);
    let pos = match found.as_slice() {
        [] => {
            return Err(fill(
                text::STR_REPLACE_NO_MATCH,
                &[("old_str", old), ("path", p.shown)],
            ))
        }
        [pos] => *pos,
        many => {
            let lines = lines_of(&content, many);
            let list: Vec<String> = lines.iter().map(usize::to_string).collect();
            return Err(fill(
                text::STR_REPLACE_MULTIPLE,
                &[("old_str", old), ("line_numbers", &list.join(", "))],
            ));
        }
    };
    let edited = format!("{}{new}{}", &content[..pos], &content[pos + old.len()..]);
    write(desk, &p, &edited, &Precondition::Etag(etag))?;
    // Two lines either side of the line where the change starts.
    let at = line_of(&content, pos) - 1;
    let lines: Vec<&str> = edited.split('\n').collect();
    let first = at.saturating_sub(2);
    let end = (at + 3).min(lines.len());
    let snippet: Vec<String> = (first..end).map(|i| numbered(i + 1, lines[i])).collect();
    Ok(format!("{}\n{}", text::STR_REPLACE_OK, snippet.join("\n")))
}

fn insert(desk: &DeskDir, a: &Args<'_>) -> Out<String> {
    let p = path_arg(desk, a, "path")?;
    let at = a.int("insert_line")?;
    let new = a.str("insert_text")?;
    let (content, etag) = read_for_edit(desk, &p, text::INSERT_NOT_FOUND)?;
    // The file's lines (a final newline ends the last line, it does not start another).
    let mut lines: Vec<&str> = if content.is_empty() {
        Vec::new()
    } else {
        content
            .strip_suffix('\n')
            .unwrap_or(&content)
            .split('\n')
            .collect()
    };
    let idx = usize::try_from(at).ok().filter(|&i| i <= lines.len());
    let Some(idx) = idx else {
        return Err(fill(
            text::INSERT_BAD_LINE,
            &[
                ("insert_line", &at.to_string()),
                ("n_lines", &lines.len().to_string()),
            ],
        ));
    };
    lines.insert(idx, new.trim_end_matches('\n'));
    let mut edited = lines.join("\n");
    edited.push('\n');
    write(desk, &p, &edited, &Precondition::Etag(etag))?;
    Ok(fill(text::INSERT_OK, &[("path", p.shown)]))
}

fn delete(desk: &DeskDir, a: &Args<'_>) -> Out<String> {
    let p = parse_path(a.str("path")?)?;
    if p.is_root() {
        return Err(text::DELETE_ROOT.to_owned());
    }
    check_links(desk, &p)?;
    match desk.remove(&p.rel, true) {
        Ok(()) => Ok(fill(text::DELETE_OK, &[("path", p.shown)])),
        Err(e) if matches!(e.code, Code::NotFound | Code::NotDir) => {
            Err(fill(text::DELETE_NOT_FOUND, &[("path", p.shown)]))
        }
        Err(e) => Err(io_failed(&e)),
    }
}

fn rename(desk: &DeskDir, a: &Args<'_>) -> Out<String> {
    let from = path_arg(desk, a, "old_path")?;
    let to = path_arg(desk, a, "new_path")?;
    let vars = [("old_path", from.shown), ("new_path", to.shown)];
    if from.is_root() {
        return Err(text::RENAME_ROOT.to_owned());
    }
    let missing = || fill(text::RENAME_NOT_FOUND, &vars);
    let exists = || fill(text::RENAME_EXISTS, &vars);
    match desk.stat(&from.rel) {
        Ok(_) => {}
        Err(e) if matches!(e.code, Code::NotFound | Code::NotDir) => return Err(missing()),
        Err(e) => return Err(io_failed(&e)),
    }
    match desk.stat(&to.rel) {
        Ok(_) => return Err(exists()),
        Err(e) if e.code == Code::NotFound => {}
        Err(e) if e.code == Code::NotDir => {}
        Err(e) => return Err(io_failed(&e)),
    }
    make_parents(desk, &to)?;
    // RENAME_NOREPLACE: a destination made meanwhile is never overwritten.
    match desk.rename(&from.rel, &to.rel, false) {
        Ok(()) => Ok(fill(text::RENAME_OK, &vars)),
        Err(e) if matches!(e.code, Code::Exists | Code::NotEmpty) => Err(exists()),
        Err(e) if e.code == Code::NotFound => Err(missing()),
        Err(e) if e.code == Code::BadRequest => Err(fill(text::RENAME_INTO_ITSELF, &vars)),
        Err(e) => Err(io_failed(&e)),
    }
}

#[cfg(test)]
mod tests {
    //! Every string byte for byte against the published ones ([`super::text`]), and the
    //! escapes, on a plain directory.

    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};

    use serde_json::{json, Value};

    use super::*;

    /// A desk with `desk.toml`, and beside it (outside the desk) a secret file and dir.
    fn setup() -> (tempfile::TempDir, PathBuf, DeskDir) {
        let t = tempfile::tempdir().unwrap();
        let desk = t.path().join("desk");
        std::fs::create_dir(&desk).unwrap();
        std::fs::write(desk.join("desk.toml"), "agent = \"alice\"\n").unwrap();
        std::fs::write(t.path().join("secret"), "outside\n").unwrap();
        std::fs::create_dir(t.path().join("outdir")).unwrap();
        std::fs::write(t.path().join("outdir/keep"), "keep\n").unwrap();
        let d = DeskDir::open(&desk).unwrap();
        (t, desk, d)
    }

    fn ok(d: &DeskDir, input: Value) -> String {
        let out = run(d, &input, true);
        assert!(!out.is_error, "{input}: unexpected error {:?}", out.text);
        out.text
    }

    fn err(d: &DeskDir, input: Value) -> String {
        let out = run(d, &input, true);
        assert!(
            out.is_error,
            "{input}: expected an error, got {:?}",
            out.text
        );
        out.text
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap()
    }

    fn size_of(p: &Path) -> String {
        human_size(std::fs::symlink_metadata(p).unwrap().len())
    }

    /// Nothing but `keep` in the outside dir, the secret unchanged.
    fn outside_untouched(t: &tempfile::TempDir) {
        assert_eq!(read(&t.path().join("secret")), "outside\n");
        let names: Vec<_> = std::fs::read_dir(t.path().join("outdir"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["keep"]);
        assert_eq!(read(&t.path().join("outdir/keep")), "keep\n");
    }

    #[test]
    fn memory_strings_are_the_published_ones() {
        // The table, as the documentation and the SDK publish it (a typo here or there
        // fails this test and the byte-for-byte ones below).
        assert_eq!(text::VIEW_DIR_HEADER, "Here're the files and directories up to 2 levels deep in {path}, excluding hidden items and node_modules:");
        assert_eq!(
            text::VIEW_FILE_HEADER,
            "Here's the content of {path} with line numbers:"
        );
        assert_eq!(
            text::VIEW_NOT_FOUND,
            "The path {path} does not exist. Please provide a valid path."
        );
        assert_eq!(
            text::VIEW_TOO_MANY_LINES,
            "File {path} exceeds maximum line limit of 999,999 lines."
        );
        assert_eq!(text::CREATE_OK, "File created successfully at: {path}");
        assert_eq!(text::CREATE_EXISTS, "Error: File {path} already exists");
        assert_eq!(text::STR_REPLACE_OK, "The memory file has been edited. Here is the snippet showing the change (with line numbers):");
        assert_eq!(
            text::STR_REPLACE_NOT_FOUND,
            "Error: The path {path} does not exist. Please provide a valid path."
        );
        assert_eq!(
            text::STR_REPLACE_NO_MATCH,
            "No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}."
        );
        assert_eq!(text::STR_REPLACE_MULTIPLE, "No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines: {line_numbers}. Please ensure it is unique");
        assert_eq!(text::INSERT_OK, "The file {path} has been edited.");
        assert_eq!(
            text::INSERT_NOT_FOUND,
            "Error: The path {path} does not exist"
        );
        assert_eq!(text::INSERT_BAD_LINE, "Error: Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the file: [0, {n_lines}]");
        assert_eq!(text::DELETE_OK, "Successfully deleted {path}");
        assert_eq!(
            text::DELETE_NOT_FOUND,
            "Error: The path {path} does not exist"
        );
        assert_eq!(
            text::RENAME_OK,
            "Successfully renamed {old_path} to {new_path}"
        );
        assert_eq!(
            text::RENAME_NOT_FOUND,
            "Error: The path {old_path} does not exist"
        );
        assert_eq!(
            text::RENAME_EXISTS,
            "Error: The destination {new_path} already exists"
        );
        assert_eq!(
            text::PATH_PREFIX,
            "Path must start with /memories, got: {path}"
        );
        assert_eq!(
            text::PATH_ESCAPE,
            "Path {path} would escape /memories directory"
        );
        assert_eq!(
            text::PATH_SYMLINK,
            "Path would escape /memories directory via symlink"
        );
        assert_eq!(
            text::DELETE_ROOT,
            "Cannot delete the /memories directory itself"
        );
        assert_eq!(text::UNKNOWN_COMMAND, "Unknown command: {command}");
        // One pass: a value that looks like a placeholder stays as it is.
        assert_eq!(
            fill("{a} and {b} {c}", &[("a", "{b}"), ("b", "x")]),
            "{b} and x {c}"
        );
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(1023), "1023B");
        assert_eq!(human_size(4096), "4.0K");
        assert_eq!(human_size(1536), "1.5K");
        assert_eq!(human_size(5632), "5.5K");
        assert_eq!(human_size(1_258_291), "1.2M");
    }

    #[test]
    fn memory_view_lists_two_levels_without_hidden_items() {
        let (_t, desk, d) = setup();
        // No memory yet: an empty /memories (and nothing is made by a view).
        assert_eq!(
            ok(&d, json!({"command": "view", "path": "/memories"})),
            "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:\n0B\t/memories"
        );
        assert!(!desk.join("memories").exists());
        let m = desk.join("memories");
        std::fs::create_dir_all(m.join("projects/deep/deeper")).unwrap();
        std::fs::create_dir_all(m.join("node_modules/x")).unwrap();
        std::fs::create_dir_all(m.join(".hidden_dir")).unwrap();
        std::fs::write(m.join("notes.md"), "x".repeat(1536)).unwrap();
        std::fs::write(m.join(".hidden"), "h").unwrap();
        std::fs::write(m.join("projects/a.txt"), "abc").unwrap();
        std::fs::write(m.join("projects/.secret"), "s").unwrap();
        std::fs::write(m.join("projects/deep/third.txt"), "3").unwrap();
        std::fs::write(m.join("projects/deep/deeper/fourth.txt"), "4").unwrap();
        symlink("notes.md", m.join("link")).unwrap();
        let want = format!(
            "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:\n\
             {}\t/memories\n\
             1.5K\t/memories/notes.md\n\
             {}\t/memories/projects/\n\
             3B\t/memories/projects/a.txt\n\
             {}\t/memories/projects/deep/",
            size_of(&m),
            size_of(&m.join("projects")),
            size_of(&m.join("projects/deep")),
        );
        assert_eq!(
            ok(&d, json!({"command": "view", "path": "/memories"})),
            want
        );
        // A subdirectory: its own two levels, under the path as given.
        let want = format!(
            "Here're the files and directories up to 2 levels deep in /memories/projects, excluding hidden items and node_modules:\n\
             {}\t/memories/projects\n\
             3B\t/memories/projects/a.txt\n\
             {}\t/memories/projects/deep/\n\
             {}\t/memories/projects/deep/deeper/\n\
             1B\t/memories/projects/deep/third.txt",
            size_of(&m.join("projects")),
            size_of(&m.join("projects/deep")),
            size_of(&m.join("projects/deep/deeper")),
        );
        assert_eq!(
            ok(&d, json!({"command": "view", "path": "/memories/projects"})),
            want
        );
        assert_eq!(
            err(&d, json!({"command": "view", "path": "/memories/nope"})),
            "The path /memories/nope does not exist. Please provide a valid path."
        );
        assert_eq!(
            err(
                &d,
                json!({"command": "view", "path": "/memories/notes.md/x"})
            ),
            "The path /memories/notes.md/x does not exist. Please provide a valid path."
        );
    }

    #[test]
    fn memory_view_of_a_file_numbers_lines_as_published() {
        let (_t, desk, d) = setup();
        std::fs::create_dir(desk.join("memories")).unwrap();
        std::fs::write(
            desk.join("memories/notes.txt"),
            "Hello World\nThis is line two",
        )
        .unwrap();
        assert_eq!(
            ok(&d, json!({"command": "view", "path": "/memories/notes.txt"})),
            "Here's the content of /memories/notes.txt with line numbers:\n     1\tHello World\n     2\tThis is line two"
        );
        let body: String = (1..=100).map(|i| format!("Line {i}\n")).collect();
        std::fs::write(desk.join("memories/long.txt"), body).unwrap();
        let all = ok(&d, json!({"command": "view", "path": "/memories/long.txt"}));
        assert!(all.contains("\n    10\tLine 10\n") && all.contains("\n   100\tLine 100\n"));
        // A final newline ends in an empty numbered line (as the SDKs split).
        assert!(all.ends_with("\n   101\t"));
        let view = |r: Value| {
            ok(
                &d,
                json!({"command": "view", "path": "/memories/long.txt", "view_range": r}),
            )
        };
        assert_eq!(
            view(json!([9, 11])),
            "Here's the content of /memories/long.txt with line numbers:\n     9\tLine 9\n    10\tLine 10\n    11\tLine 11"
        );
        assert_eq!(
            view(json!([100, -1])),
            "Here's the content of /memories/long.txt with line numbers:\n   100\tLine 100\n   101\t"
        );
        assert_eq!(
            view(json!([0, 1])),
            "Here's the content of /memories/long.txt with line numbers:\n     1\tLine 1"
        );
        assert_eq!(
            view(json!([200, 300])),
            "Here's the content of /memories/long.txt with line numbers:\n"
        );
        assert_eq!(
            err(
                &d,
                json!({"command": "view", "path": "/memories/long.txt", "view_range": [1]})
            ),
            "Error: The `view` command needs `view_range` as two integers [first, last]"
        );
    }

    #[test]
    fn memory_view_refuses_files_over_the_line_limit() {
        let (_t, desk, d) = setup();
        std::fs::create_dir(desk.join("memories")).unwrap();
        // 999,999 lines (the last one empty) are shown; 1,000,000 are not.
        std::fs::write(desk.join("memories/max.txt"), "\n".repeat(999_998)).unwrap();
        let shown = ok(
            &d,
            json!({"command": "view", "path": "/memories/max.txt", "view_range": [999_999, -1]}),
        );
        assert!(shown.ends_with("\n999999\t"), "{shown}");
        std::fs::write(desk.join("memories/big.txt"), "\n".repeat(999_999)).unwrap();
        assert_eq!(
            err(&d, json!({"command": "view", "path": "/memories/big.txt"})),
            "File /memories/big.txt exceeds maximum line limit of 999,999 lines."
        );
    }

    #[test]
    fn memory_create_makes_new_files_only() {
        let (_t, desk, d) = setup();
        let input = json!({"command": "create", "path": "/memories/notes.txt", "file_text": "Meeting notes:\n- one\n"});
        assert_eq!(
            ok(&d, input.clone()),
            "File created successfully at: /memories/notes.txt"
        );
        assert_eq!(
            read(&desk.join("memories/notes.txt")),
            "Meeting notes:\n- one\n"
        );
        // Existing: refused, the file kept.
        let again =
            json!({"command": "create", "path": "/memories/notes.txt", "file_text": "other"});
        assert_eq!(
            err(&d, again),
            "Error: File /memories/notes.txt already exists"
        );
        assert_eq!(
            read(&desk.join("memories/notes.txt")),
            "Meeting notes:\n- one\n"
        );
        // Missing directories are made; an existing directory is refused as existing.
        assert_eq!(
            ok(
                &d,
                json!({"command": "create", "path": "/memories/a/b/c.md", "file_text": ""})
            ),
            "File created successfully at: /memories/a/b/c.md"
        );
        assert_eq!(
            err(
                &d,
                json!({"command": "create", "path": "/memories/a/b", "file_text": "x"})
            ),
            "Error: File /memories/a/b already exists"
        );
        assert_eq!(
            err(
                &d,
                json!({"command": "create", "path": "/memories", "file_text": "x"})
            ),
            "Error: File /memories already exists"
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(desk.join("memories"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    }

    #[test]
    fn lines_of_counts_in_one_pass() {
        let hay = "a\nb a\n\na a";
        let at = occurrences(hay, "a");
        assert_eq!(lines_of(hay, &at), vec![1, 2, 4]);
        assert_eq!(
            lines_of(hay, &at),
            at.iter()
                .map(|&p| line_of(hay, p))
                .fold(Vec::new(), |mut v, l| {
                    if v.last() != Some(&l) {
                        v.push(l)
                    }
                    v
                })
        );
    }

    #[test]
    fn memory_str_replace_edits_one_occurrence_only() {
        let (_t, desk, d) = setup();
        let f = desk.join("memories/prefs.txt");
        std::fs::create_dir(desk.join("memories")).unwrap();
        std::fs::write(&f, "a\nb\nFavorite color: blue\nd\ne\nf\n").unwrap();
        let edit = |old: &str, new: &str| json!({"command": "str_replace", "path": "/memories/prefs.txt", "old_str": old, "new_str": new});
        assert_eq!(
            ok(&d, edit("Favorite color: blue", "Favorite color: green")),
            "The memory file has been edited. Here is the snippet showing the change (with line numbers):\n\
             \x20    1\ta\n     2\tb\n     3\tFavorite color: green\n     4\td\n     5\te"
        );
        assert_eq!(read(&f), "a\nb\nFavorite color: green\nd\ne\nf\n");
        // At the top: the snippet starts at line 1.
        assert_eq!(
            ok(&d, edit("a\n", "A\n")),
            "The memory file has been edited. Here is the snippet showing the change (with line numbers):\n\
             \x20    1\tA\n     2\tb\n     3\tFavorite color: green"
        );
        assert_eq!(
            err(&d, edit("purple", "x")),
            "No replacement was performed, old_str `purple` did not appear verbatim in /memories/prefs.txt."
        );
        std::fs::write(&f, "x = 1\ny = 2\nx = 3\n").unwrap();
        assert_eq!(
            err(&d, edit("x = ", "z = ")),
            "No replacement was performed. Multiple occurrences of old_str `x = ` in lines: 1, 3. Please ensure it is unique"
        );
        assert_eq!(read(&f), "x = 1\ny = 2\nx = 3\n");
        let missing = json!({"command": "str_replace", "path": "/memories/none.txt", "old_str": "a", "new_str": "b"});
        assert_eq!(
            err(&d, missing),
            "Error: The path /memories/none.txt does not exist. Please provide a valid path."
        );
        // A directory answers as a file that does not exist (documented).
        let dir =
            json!({"command": "str_replace", "path": "/memories", "old_str": "a", "new_str": "b"});
        assert_eq!(
            err(&d, dir),
            "Error: The path /memories does not exist. Please provide a valid path."
        );
        // Not UTF-8: never rewritten.
        std::fs::write(&f, b"x\xff\n").unwrap();
        assert_eq!(
            err(&d, edit("x", "y")),
            "Error: The file /memories/prefs.txt is not UTF-8 text; the memory tool edits text only"
        );
        assert_eq!(std::fs::read(&f).unwrap(), b"x\xff\n");
    }

    #[test]
    fn memory_insert_puts_text_after_a_line() {
        let (_t, desk, d) = setup();
        let f = desk.join("memories/todo.txt");
        std::fs::create_dir(desk.join("memories")).unwrap();
        std::fs::write(&f, "one\ntwo\nthree\n").unwrap();
        let ins = |line: Value, text: &str| json!({"command": "insert", "path": "/memories/todo.txt", "insert_line": line, "insert_text": text});
        assert_eq!(
            ok(&d, ins(json!(2), "- review\n")),
            "The file /memories/todo.txt has been edited."
        );
        assert_eq!(read(&f), "one\ntwo\n- review\nthree\n");
        assert_eq!(
            ok(&d, ins(json!(0), "top")),
            "The file /memories/todo.txt has been edited."
        );
        assert_eq!(
            ok(&d, ins(json!(5), "end")),
            "The file /memories/todo.txt has been edited."
        );
        assert_eq!(read(&f), "top\none\ntwo\n- review\nthree\nend\n");
        assert_eq!(
            err(&d, ins(json!(7), "x")),
            "Error: Invalid `insert_line` parameter: 7. It should be within the range of lines of the file: [0, 6]"
        );
        assert_eq!(
            err(&d, ins(json!(-1), "x")),
            "Error: Invalid `insert_line` parameter: -1. It should be within the range of lines of the file: [0, 6]"
        );
        assert_eq!(
            err(&d, ins(json!("2"), "x")),
            "Error: The `insert` command needs `insert_line` as an integer"
        );
        let missing = json!({"command": "insert", "path": "/memories/none.txt", "insert_line": 0, "insert_text": "x"});
        assert_eq!(
            err(&d, missing),
            "Error: The path /memories/none.txt does not exist"
        );
        let dir =
            json!({"command": "insert", "path": "/memories", "insert_line": 0, "insert_text": "x"});
        assert_eq!(err(&d, dir), "Error: The path /memories does not exist");
        assert_eq!(read(&f), "top\none\ntwo\n- review\nthree\nend\n");
    }

    #[test]
    fn memory_delete_removes_files_and_trees() {
        let (_t, desk, d) = setup();
        std::fs::create_dir_all(desk.join("memories/dir/sub")).unwrap();
        std::fs::write(desk.join("memories/dir/sub/f"), "f").unwrap();
        std::fs::write(desk.join("memories/old.txt"), "o").unwrap();
        assert_eq!(
            ok(
                &d,
                json!({"command": "delete", "path": "/memories/old.txt"})
            ),
            "Successfully deleted /memories/old.txt"
        );
        assert_eq!(
            ok(&d, json!({"command": "delete", "path": "/memories/dir"})),
            "Successfully deleted /memories/dir"
        );
        assert!(!desk.join("memories/dir").exists() && !desk.join("memories/old.txt").exists());
        assert_eq!(
            err(
                &d,
                json!({"command": "delete", "path": "/memories/old.txt"})
            ),
            "Error: The path /memories/old.txt does not exist"
        );
        for root in ["/memories", "/memories/", "/memories/."] {
            assert_eq!(
                err(&d, json!({"command": "delete", "path": root})),
                "Cannot delete the /memories directory itself"
            );
        }
        assert!(desk.join("memories").is_dir() && desk.join("desk.toml").exists());
    }

    #[test]
    fn memory_rename_never_overwrites() {
        let (_t, desk, d) = setup();
        let m = desk.join("memories");
        std::fs::create_dir(&m).unwrap();
        std::fs::write(m.join("draft.txt"), "draft").unwrap();
        std::fs::write(m.join("final.txt"), "final").unwrap();
        let mv = |a: &str, b: &str| json!({"command": "rename", "old_path": a, "new_path": b});
        assert_eq!(
            err(&d, mv("/memories/draft.txt", "/memories/final.txt")),
            "Error: The destination /memories/final.txt already exists"
        );
        assert_eq!(read(&m.join("final.txt")), "final");
        assert_eq!(
            err(&d, mv("/memories/none.txt", "/memories/x.txt")),
            "Error: The path /memories/none.txt does not exist"
        );
        assert_eq!(
            ok(
                &d,
                mv("/memories/draft.txt", "/memories/archive/2026/draft.txt")
            ),
            "Successfully renamed /memories/draft.txt to /memories/archive/2026/draft.txt"
        );
        assert_eq!(read(&m.join("archive/2026/draft.txt")), "draft");
        assert_eq!(
            ok(&d, mv("/memories/archive", "/memories/old")),
            "Successfully renamed /memories/archive to /memories/old"
        );
        assert_eq!(
            err(&d, mv("/memories/old", "/memories/old/inner")),
            "Error: Cannot move /memories/old into itself (/memories/old/inner)"
        );
        assert_eq!(
            err(&d, mv("/memories", "/memories/x")),
            "Error: Cannot rename the /memories directory itself"
        );
    }

    #[test]
    fn memory_paths_cannot_escape() {
        let (t, desk, d) = setup();
        std::fs::create_dir(desk.join("memories")).unwrap();
        std::fs::write(desk.join("memories/ok.txt"), "ok\n").unwrap();
        std::fs::create_dir(desk.join("memoriesX")).unwrap();
        std::fs::write(desk.join("memoriesX/a"), "sibling\n").unwrap();
        let long = format!("/memories/{}", "n".repeat(300));
        let too_long = format!("/memories/{}", "a/".repeat(2100));
        let cases: Vec<(String, String)> = vec![
            (
                "/memoriesX/a".into(),
                "Path /memoriesX/a would escape /memories directory".into(),
            ),
            (
                "/memories/../desk.toml".into(),
                "Path /memories/../desk.toml would escape /memories directory".into(),
            ),
            (
                "/memories/a/../../desk.toml".into(),
                "Path /memories/a/../../desk.toml would escape /memories directory".into(),
            ),
            (
                "/memories/..".into(),
                "Path /memories/.. would escape /memories directory".into(),
            ),
            (
                "/etc/passwd".into(),
                "Path must start with /memories, got: /etc/passwd".into(),
            ),
            (
                "memories/ok.txt".into(),
                "Path must start with /memories, got: memories/ok.txt".into(),
            ),
            (
                "/desk.toml".into(),
                "Path must start with /memories, got: /desk.toml".into(),
            ),
            ("".into(), "Path must start with /memories, got: ".into()),
            (
                "/memories/a\0b".into(),
                "Error: The path /memories/a\\0b contains a NUL byte".into(),
            ),
            (
                long.clone(),
                format!("Error: The path {long} has a name longer than 255 bytes"),
            ),
            (
                too_long.clone(),
                format!("Error: The path {too_long} is longer than 4096 bytes"),
            ),
        ];
        for (path, want) in &cases {
            let inputs = [
                json!({"command": "view", "path": path}),
                json!({"command": "create", "path": path, "file_text": "pwned"}),
                json!({"command": "str_replace", "path": path, "old_str": "agent", "new_str": "pwned"}),
                json!({"command": "insert", "path": path, "insert_line": 0, "insert_text": "pwned"}),
                json!({"command": "delete", "path": path}),
                json!({"command": "rename", "old_path": path, "new_path": "/memories/stolen"}),
                json!({"command": "rename", "old_path": "/memories/ok.txt", "new_path": path}),
            ];
            for input in inputs {
                assert_eq!(&err(&d, input.clone()), want, "{input}");
            }
        }
        assert_eq!(read(&desk.join("desk.toml")), "agent = \"alice\"\n");
        assert_eq!(read(&desk.join("memoriesX/a")), "sibling\n");
        assert_eq!(read(&desk.join("memories/ok.txt")), "ok\n");
        assert!(!desk.join("memories/stolen").exists());
        outside_untouched(&t);
    }

    #[test]
    fn memory_symlinks_are_never_followed() {
        let (t, desk, d) = setup();
        let m = desk.join("memories");
        std::fs::create_dir(&m).unwrap();
        std::fs::write(m.join("ok.txt"), "ok\n").unwrap();
        // Planted: a link to a dir outside the desk, one to a file outside, one to the
        // desk's own desk.toml (inside the desk, outside /memories), one inside.
        symlink(t.path().join("outdir"), m.join("out")).unwrap();
        symlink(t.path().join("secret"), m.join("pw")).unwrap();
        symlink("../desk.toml", m.join("toml")).unwrap();
        symlink("ok.txt", m.join("alias")).unwrap();
        let escape = "Path would escape /memories directory via symlink";
        for path in [
            "/memories/out",
            "/memories/out/keep",
            "/memories/out/new",
            "/memories/pw",
            "/memories/toml",
        ] {
            let inputs = [
                json!({"command": "view", "path": path}),
                json!({"command": "create", "path": path, "file_text": "pwned"}),
                json!({"command": "str_replace", "path": path, "old_str": "e", "new_str": "pwned"}),
                json!({"command": "insert", "path": path, "insert_line": 0, "insert_text": "pwned"}),
                json!({"command": "delete", "path": path}),
                json!({"command": "rename", "old_path": path, "new_path": "/memories/stolen"}),
                json!({"command": "rename", "old_path": "/memories/ok.txt", "new_path": path}),
            ];
            for input in inputs {
                assert_eq!(err(&d, input.clone()), escape, "{input}");
            }
        }
        assert_eq!(
            err(&d, json!({"command": "view", "path": "/memories/alias"})),
            "Error: The path /memories/alias goes through a symlink; the memory tool does not follow symlinks"
        );
        // The listing shows no link.
        let listing = ok(&d, json!({"command": "view", "path": "/memories"}));
        assert!(
            !listing.contains("out") && !listing.contains("pw") && !listing.contains("alias"),
            "{listing}"
        );
        assert!(
            m.join("out").is_symlink() && m.join("pw").is_symlink() && m.join("toml").is_symlink()
        );
        assert_eq!(read(&desk.join("desk.toml")), "agent = \"alice\"\n");
        // `memories` itself a link out of the desk: nothing through it.
        std::fs::remove_dir_all(&m).unwrap();
        symlink(t.path().join("outdir"), &m).unwrap();
        for input in [
            json!({"command": "view", "path": "/memories"}),
            json!({"command": "view", "path": "/memories/keep"}),
            json!({"command": "create", "path": "/memories/new", "file_text": "pwned"}),
            json!({"command": "delete", "path": "/memories/keep"}),
        ] {
            assert_eq!(err(&d, input.clone()), escape, "{input}");
        }
        outside_untouched(&t);
    }

    #[test]
    fn memory_read_only_refuses_every_change() {
        let (_t, desk, d) = setup();
        let m = desk.join("memories");
        std::fs::create_dir(&m).unwrap();
        std::fs::write(m.join("a.txt"), "a\n").unwrap();
        let refused = "Error: This memory is read-only (a read-only token); only `view` is allowed";
        for input in [
            json!({"command": "create", "path": "/memories/b.txt", "file_text": "b"}),
            json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "a", "new_str": "b"}),
            json!({"command": "insert", "path": "/memories/a.txt", "insert_line": 0, "insert_text": "b"}),
            json!({"command": "delete", "path": "/memories/a.txt"}),
            json!({"command": "rename", "old_path": "/memories/a.txt", "new_path": "/memories/c.txt"}),
        ] {
            assert!(is_change(&input));
            let out = run(&d, &input, false);
            assert_eq!(
                out,
                MemoryOutcome {
                    text: refused.into(),
                    is_error: true
                },
                "{input}"
            );
        }
        let names: Vec<_> = std::fs::read_dir(&m)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.txt"]);
        assert_eq!(read(&m.join("a.txt")), "a\n");
        let view = json!({"command": "view", "path": "/memories/a.txt"});
        assert!(!is_change(&view));
        assert_eq!(
            run(&d, &view, false),
            MemoryOutcome {
                text:
                    "Here's the content of /memories/a.txt with line numbers:\n     1\ta\n     2\t"
                        .into(),
                is_error: false
            }
        );
    }

    #[test]
    fn memory_bad_input_gets_one_clear_line() {
        let (_t, _desk, d) = setup();
        let bad = "Error: The memory tool takes a JSON object with a `command` (view, create, str_replace, insert, delete or rename)";
        assert_eq!(err(&d, json!(["view"])), bad);
        assert_eq!(err(&d, json!({"path": "/memories"})), bad);
        assert_eq!(err(&d, json!({"command": 3})), bad);
        assert_eq!(
            err(&d, json!({"command": "undo", "path": "/memories"})),
            "Unknown command: undo"
        );
        assert!(!is_change(&json!({"command": "undo"})));
        assert_eq!(
            err(&d, json!({"command": "view"})),
            "Error: The `view` command needs `path` as a string"
        );
        assert_eq!(
            err(&d, json!({"command": "create", "path": "/memories/a"})),
            "Error: The `create` command needs `file_text` as a string"
        );
        assert_eq!(
            err(
                &d,
                json!({"command": "str_replace", "path": "/memories/a", "old_str": "x", "new_str": 1})
            ),
            "Error: The `str_replace` command needs `new_str` as a string"
        );
        assert_eq!(
            err(&d, json!({"command": "rename", "old_path": "/memories/a"})),
            "Error: The `rename` command needs `new_path` as a string"
        );
        for e in [
            err(&d, json!(null)),
            err(&d, json!({"command": "view", "path": 7})),
        ] {
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
