//! The MCP server (Model Context Protocol, the `rmcp` crate): one desk's tools for a
//! model. Over stdio (`deskfs mcp AGENT`, a local client: the desk is fixed) and over
//! streamable HTTP at `/mcp` of `deskfs serve` (every request carries the same bearer
//! tokens as `/v1`; the token decides the desk).
//!
//! Tools, with their MCP annotations (`readOnlyHint`, `destructiveHint`,
//! `idempotentHint`):
//! * the reference filesystem server's (`@modelcontextprotocol/server-filesystem`):
//!   `read_text_file`, `read_multiple_files`, `write_file`, `edit_file`,
//!   `create_directory`, `list_directory`, `list_directory_with_sizes`,
//!   `directory_tree`, `move_file`, `search_files`, `get_file_info`,
//!   `list_allowed_directories` — same names, arguments and result text (see
//!   [`crate::fstools`]); text results also come as structured content
//!   `{"content": TEXT}`;
//! * the desk's: `task_start`, `task_list`, `task_finish`, `resume` (structured content:
//!   the JSON of `deskfs task … --json` / `deskfs resume --json`);
//! * `exec`: a command in the sandbox ([`crate::exec::collect`]), journaled `via: mcp`;
//!   `journal`: the task journal's entries ([`crate::api::journal_entries`]);
//! * `memory`: Anthropic's memory tool (`memory_20250818`) on `memories/`
//!   ([`crate::memory`]), its result strings as published.
//!
//! A tool that fails returns an error result (`isError: true`) whose text is
//! `Error [CODE]: MESSAGE` with the stable codes of the HTTP API ([`crate::Code`]).
//! A read-only token (or `deskfs mcp --read-only`) gets `read_only_token` from every
//! tool that would change the desk.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use deskfs_desk::Desk;
use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::{self, blocking, commit_locked, desk_error, open_granted, App};
use crate::confine::{DeskDir, Precondition};
use crate::error::{Code, Result, ServeError};
use crate::exec::{Collected, ExecRequest, COLLECT_CAP};
use crate::exec_journal::Via;
use crate::fstools::{self, desk_path, shown, Edit};
use crate::tokens::Grant;

/// The structured content of a text tool: `{"content": TEXT}`.
#[derive(Serialize, JsonSchema)]
pub struct TextOut {
    /// The result text (the same as the text content block).
    pub content: String,
}

fn text(s: String) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(s.clone())]);
    r.structured_content = Some(json!({ "content": s }));
    r
}

fn structured(v: Value) -> CallToolResult {
    let shown = serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string());
    let mut r = CallToolResult::success(vec![ContentBlock::text(shown)]);
    r.structured_content = Some(v);
    r
}

/// The error result of a tool: `Error [CODE]: MESSAGE`, `isError: true`.
pub fn error_result(e: &ServeError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "Error [{}]: {}",
        e.code.as_str(),
        e.message
    ))])
}

fn done(r: Result<CallToolResult>) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
    Ok(r.unwrap_or_else(|e| error_result(&e)))
}

/// Arguments naming one path.
#[derive(Deserialize, JsonSchema)]
pub struct PathArg {
    /// A path under /desk (or relative to it).
    pub path: String,
}

/// Arguments of `read_text_file`.
#[derive(Deserialize, JsonSchema)]
pub struct ReadTextArgs {
    /// A path under /desk (or relative to it).
    pub path: String,
    /// If provided, returns only the first N lines of the file.
    pub head: Option<usize>,
    /// If provided, returns only the last N lines of the file.
    pub tail: Option<usize>,
}

/// Arguments of `read_multiple_files`.
#[derive(Deserialize, JsonSchema)]
pub struct ReadManyArgs {
    /// Paths under /desk (or relative to it).
    pub paths: Vec<String>,
}

/// Arguments of `write_file`.
#[derive(Deserialize, JsonSchema)]
pub struct WriteArgs {
    /// A path under /desk (or relative to it); its directory must exist.
    pub path: String,
    /// The whole new content (UTF-8 text).
    pub content: String,
}

/// Arguments of `edit_file`.
#[derive(Deserialize, JsonSchema)]
pub struct EditArgs {
    /// The file to edit.
    pub path: String,
    /// Edits applied in order.
    pub edits: Vec<Edit>,
    /// Preview changes using git-style diff format, without writing.
    #[serde(default, rename = "dryRun")]
    pub dry_run: bool,
}

/// Arguments of `list_directory_with_sizes`.
#[derive(Deserialize, JsonSchema)]
pub struct ListSizesArgs {
    /// The directory.
    pub path: String,
    /// Sort entries by "name" (default) or "size" (largest first).
    #[serde(default, rename = "sortBy")]
    pub sort_by: Option<String>,
}

/// Arguments of `directory_tree`.
#[derive(Deserialize, JsonSchema)]
pub struct TreeArgs {
    /// The directory to start from.
    pub path: String,
    /// Glob patterns (relative to `path`) to leave out; a pattern without `*` leaves out
    /// every entry of that name.
    #[serde(default, rename = "excludePatterns")]
    pub exclude_patterns: Vec<String>,
}

/// Arguments of `move_file`.
#[derive(Deserialize, JsonSchema)]
pub struct MoveArgs {
    /// What to move.
    pub source: String,
    /// Where to; must not exist.
    pub destination: String,
}

/// Arguments of `search_files`.
#[derive(Deserialize, JsonSchema)]
pub struct SearchArgs {
    /// The directory to search under.
    pub path: String,
    /// Glob on the path relative to `path`: `*.rs` at the top, `**/*.rs` at any depth.
    pub pattern: String,
    /// Glob patterns to leave out (as in directory_tree).
    #[serde(default, rename = "excludePatterns")]
    pub exclude_patterns: Vec<String>,
}

/// Arguments of `task_start`.
#[derive(Deserialize, JsonSchema)]
pub struct TaskStartArgs {
    /// Task name (a git branch name: letters, digits, `-`, `_`, `.`).
    pub task: String,
    /// The repository under /desk/repos to make the worktree of.
    pub repo: String,
    /// Branch to start from (default: the repository's current branch).
    pub branch: Option<String>,
}

/// Arguments of `task_finish`.
#[derive(Deserialize, JsonSchema)]
pub struct TaskFinishArgs {
    /// The task.
    pub task: String,
    /// Throw away uncommitted work (otherwise a task with uncommitted work is refused).
    #[serde(default)]
    pub discard: bool,
    /// A line for the desk's notes.
    pub note: Option<String>,
}

/// Arguments of `journal`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JournalArgs {
    /// A task's name, or `_desk` for the commands run outside tasks; absent: every
    /// journal of the desk, merged by start time.
    #[serde(default)]
    pub task: Option<String>,
    /// At most this many of the newest entries (default 20, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// The text of an `exec` result: how it ended, then each non-empty stream.
fn exec_text(c: &Collected) -> String {
    let x = &c.exit;
    let how = if x.timed_out {
        format!("killed after its timeout (exit {})", x.code)
    } else if x.killed {
        format!("killed (exit {})", x.code)
    } else {
        match x.signal {
            Some(sig) => format!("exit {} (signal {sig})", x.code),
            None => format!("exit {}", x.code),
        }
    };
    let mut t = format!("{how} in {:.3} s", x.duration_ms as f64 / 1000.0);
    for (name, body, cut) in [
        ("stdout", &c.stdout, c.stdout_truncated),
        ("stderr", &c.stderr, c.stderr_truncated),
    ] {
        if !body.is_empty() {
            let note = if cut {
                " (cut: its middle is left out)"
            } else {
                ""
            };
            t.push_str(&format!("\n--- {name}{note} ---\n{body}"));
            if !body.ends_with('\n') {
                t.push('\n');
            }
        }
    }
    t
}

/// Where the grant of a call comes from.
#[derive(Clone)]
enum Access {
    /// One desk for the whole session (stdio).
    Fixed(Grant),
    /// The bearer token of each HTTP request (put in the request's extensions by
    /// [`authenticate`]).
    Bearer,
}

/// The MCP server of one desk (stdio) or of the token's desk (HTTP).
#[derive(Clone)]
pub struct DeskTools {
    app: Arc<App>,
    access: Access,
    tool_router: ToolRouter<DeskTools>,
}

impl DeskTools {
    /// The tools of the desk `grant` opens, for a local client (stdio).
    pub fn fixed(app: Arc<App>, grant: Grant) -> DeskTools {
        DeskTools {
            app,
            access: Access::Fixed(grant),
            tool_router: Self::tool_router() + Self::memory_router(),
        }
    }

    /// The tools of each HTTP request's token.
    pub fn bearer(app: Arc<App>) -> DeskTools {
        DeskTools {
            app,
            access: Access::Bearer,
            tool_router: Self::tool_router() + Self::memory_router(),
        }
    }

    fn grant(&self, ctx: &RequestContext<RoleServer>) -> Result<Grant> {
        match &self.access {
            Access::Fixed(g) => Ok(g.clone()),
            Access::Bearer => ctx
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|p| p.extensions.get::<Grant>())
                .cloned()
                .ok_or_else(|| {
                    ServeError::new(
                        Code::Unauthorized,
                        "no token; send `Authorization: Bearer <token>` with a token from `deskfs token create AGENT`",
                    )
                }),
        }
    }

    async fn desk(
        &self,
        ctx: &RequestContext<RoleServer>,
        write: bool,
    ) -> Result<(Desk, DeskDir, Grant)> {
        let g = self.grant(ctx)?;
        let (desk, dir) = open_granted(&self.app, g.clone(), &g.agent.clone(), write).await?;
        Ok((desk, dir, g))
    }

    /// Runs blocking reads of the desk: `f` gets the held desk directory.
    async fn read<T: Send + 'static>(
        &self,
        ctx: &RequestContext<RoleServer>,
        f: impl FnOnce(&DeskDir) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (_, dir, _) = self.desk(ctx, false).await?;
        blocking(move || f(&dir)).await
    }

    /// Writes `content` as the whole new content of `path` under `pre`, atomically.
    async fn write_whole(
        &self,
        ctx: &RequestContext<RoleServer>,
        path: &str,
        content: Vec<u8>,
        pre: Precondition,
    ) -> Result<crate::confine::Committed> {
        let p = desk_path(path)?;
        let (desk, dir, g) = self.desk(ctx, true).await?;
        let staged = blocking(move || fstools::stage_text(&dir, &p, &content)).await?;
        commit_locked(&self.app, &g.agent, &desk, staged, pre).await
    }
}

#[tool_router(router = tool_router)]
impl DeskTools {
    #[tool(
        description = "Read the complete contents of a file as text (UTF-8). Use head or tail for the first or last N lines. Paths are under /desk, the only allowed directory.",
        annotations(read_only_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn read_text_file(
        &self,
        Parameters(a): Parameters<ReadTextArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        done(
            self.read(&ctx, move |d| {
                fstools::read_text_file(d, &a.path, a.head, a.tail)
            })
            .await
            .map(text),
        )
    }

    #[tool(
        description = "Read several files at once; each comes with its path, and a file that cannot be read does not stop the others.",
        annotations(read_only_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn read_multiple_files(
        &self,
        Parameters(a): Parameters<ReadManyArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        done(
            self.read(&ctx, move |d| Ok(fstools::read_multiple_files(d, &a.paths)))
                .await
                .map(text),
        )
    }

    #[tool(
        description = "Create a file or replace its whole content. The new content is written to a temporary file, flushed to stable storage and renamed over the path: readers see the old file or the new one, never a mix.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn write_file(
        &self,
        Parameters(a): Parameters<WriteArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = self
            .write_whole(&ctx, &a.path, a.content.into_bytes(), Precondition::None)
            .await
            .and_then(|_| {
                Ok(text(format!(
                    "Successfully wrote to {}",
                    shown(&desk_path(&a.path)?)
                )))
            });
        done(r)
    }

    #[tool(
        description = "Edit a text file: each edit replaces oldText (matched exactly, else line by line ignoring surrounding whitespace) with newText. Returns a git-style unified diff. With dryRun the diff is returned and nothing is written. The edit fails, writing nothing, if the file changed while it was being edited.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn edit_file(
        &self,
        Parameters(a): Parameters<EditArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let p = desk_path(&a.path)?;
            let (_, dir, _) = self.desk(&ctx, !a.dry_run).await?;
            let rp = p.clone();
            let (old, st) = blocking(move || fstools::read_utf8(&dir, &rp)).await?;
            let new = fstools::apply_edits(&old, &a.edits)?;
            let diff = fstools::fenced_diff(&shown(&p), &old.replace("\r\n", "\n"), &new);
            if !a.dry_run {
                // The version read is the condition: a change in between fails the edit.
                self.write_whole(&ctx, &a.path, new.into_bytes(), Precondition::Etag(st.etag))
                    .await
                    .map_err(|e| match e.code {
                        Code::EtagMismatch => ServeError::new(
                            Code::Conflict,
                            format!("{} changed while it was being edited; nothing was written, edit it again", shown(&p)),
                        ),
                        _ => e,
                    })?;
            }
            Ok(text(diff))
        }
        .await;
        done(r)
    }

    #[tool(
        description = "Create a directory, with its missing parents; succeeds if it already exists.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn create_directory(
        &self,
        Parameters(a): Parameters<PathArg>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let p = desk_path(&a.path)?;
            let (_, dir, _) = self.desk(&ctx, true).await?;
            let shown_p = shown(&p);
            blocking(move || dir.mkdir(&p, true)).await?;
            Ok(text(format!("Successfully created directory {shown_p}")))
        }
        .await;
        done(r)
    }

    #[tool(
        description = "List a directory: one entry per line, prefixed [DIR] or [FILE].",
        annotations(read_only_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn list_directory(
        &self,
        Parameters(a): Parameters<PathArg>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        done(
            self.read(&ctx, move |d| fstools::list_directory(d, &a.path))
                .await
                .map(text),
        )
    }

    #[tool(
        description = "List a directory with file sizes ([DIR]/[FILE] prefixes), sorted by name or size, with totals.",
        annotations(read_only_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn list_directory_with_sizes(
        &self,
        Parameters(a): Parameters<ListSizesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        done(
            self.read(&ctx, move |d| {
                fstools::list_directory_with_sizes(
                    d,
                    &a.path,
                    a.sort_by.as_deref().unwrap_or("name"),
                )
            })
            .await
            .map(text),
        )
    }

    #[tool(
        description = "The tree under a directory as JSON: entries with name, type (file or directory) and, for directories, children. Symlinks are not followed.",
        annotations(read_only_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn directory_tree(
        &self,
        Parameters(a): Parameters<TreeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        done(
            self.read(&ctx, move |d| {
                fstools::directory_tree(d, &a.path, &a.exclude_patterns)
            })
            .await
            .map(text),
        )
    }

    #[tool(
        description = "Move or rename a file or directory inside the desk; fails if the destination exists.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn move_file(
        &self,
        Parameters(a): Parameters<MoveArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let from = desk_path(&a.source)?;
            let to = desk_path(&a.destination)?;
            let (_, dir, _) = self.desk(&ctx, true).await?;
            let msg = format!("Successfully moved {} to {}", shown(&from), shown(&to));
            blocking(move || dir.rename(&from, &to, false)).await?;
            Ok(text(msg))
        }
        .await;
        done(r)
    }

    #[tool(
        description = "Find files and directories under a path whose path relative to it matches a glob (`*.rs` at the top level, `**/*.rs` at any depth). Returns full paths, one per line.",
        annotations(read_only_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn search_files(
        &self,
        Parameters(a): Parameters<SearchArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        done(
            self.read(&ctx, move |d| {
                fstools::search_files(d, &a.path, &a.pattern, &a.exclude_patterns)
            })
            .await
            .map(text),
        )
    }

    #[tool(
        description = "Metadata of a file or directory: size, times, type, permissions, ETag.",
        annotations(read_only_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn get_file_info(
        &self,
        Parameters(a): Parameters<PathArg>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        done(
            self.read(&ctx, move |d| fstools::get_file_info(d, &a.path))
                .await
                .map(text),
        )
    }

    #[tool(
        description = "The directories these tools may use: the desk, /desk.",
        annotations(read_only_hint = true),
        output_schema = schema_for_output::<TextOut>()
    )]
    async fn list_allowed_directories(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = self
            .desk(&ctx, false)
            .await
            .map(|_| text(format!("Allowed directories:\n{}", fstools::DESK_ROOT)));
        done(r)
    }

    #[tool(
        description = "Start a task: a git worktree of a repository under /desk/repos, at /desk/tasks/TASK on a branch of the task's name.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false
        )
    )]
    async fn task_start(
        &self,
        Parameters(a): Parameters<TaskStartArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let (desk, _, _) = self.desk(&ctx, true).await?;
            let started = blocking(move || {
                deskfs_desk::task::repair_links(&desk);
                deskfs_desk::task::start(&desk, &a.task, &a.repo, a.branch.as_deref())
                    .map_err(desk_error)
            })
            .await?;
            Ok(structured(to_value(&started)?))
        }
        .await;
        done(r)
    }

    #[tool(
        description = "The desk's open tasks with their repository, branch and state.",
        annotations(read_only_hint = true)
    )]
    async fn task_list(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let (desk, _, _) = self.desk(&ctx, false).await?;
            let tasks = blocking(move || Ok(deskfs_desk::task::list(&desk))).await?;
            Ok(structured(json!({ "tasks": to_value(&tasks)? })))
        }
        .await;
        done(r)
    }

    #[tool(
        description = "Finish a task: remove its worktree (its branch and commits stay in the repository). Refused while it has uncommitted work unless discard is true.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false
        )
    )]
    async fn task_finish(
        &self,
        Parameters(a): Parameters<TaskFinishArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let (desk, _, _) = self.desk(&ctx, true).await?;
            let finished = blocking(move || {
                deskfs_desk::task::repair_links(&desk);
                deskfs_desk::task::finish(&desk, &a.task, a.discard, a.note.as_deref())
                    .map_err(desk_error)
            })
            .await?;
            Ok(structured(to_value(&finished)?))
        }
        .await;
        done(r)
    }

    #[tool(
        description = "Run a command next to the desk's data, in a sandbox (bubblewrap) where the desk is /desk and nothing else of the host's data shows: `command` as argv, or `shell` as one line for sh -c; `cwd` desk-relative (tasks/T runs in task T's worktree); `env`; `timeout_secs` (default 600, at most 3600; the whole process tree is killed when it passes); `net`: host (default) or none. stdin is empty, no terminal. Returns how it ended, stdout and stderr (each kept up to 1 MiB: its first and last half). Every run is recorded in the desk's task journal with the files it changed.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        ),
        output_schema = schema_for_output::<Collected>()
    )]
    async fn exec(
        &self,
        Parameters(req): Parameters<ExecRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let (desk, _, _) = self.desk(&ctx, true).await?;
            let c = crate::exec::collect(&desk, &self.app.exec, req, COLLECT_CAP, Via::Mcp).await?;
            let mut res = CallToolResult::success(vec![ContentBlock::text(exec_text(&c))]);
            res.structured_content = Some(to_value(&c)?);
            Ok(res)
        }
        .await;
        done(r)
    }

    #[tool(
        description = "The desk's task journal, written by the system: every command run (CLI, HTTP, MCP) with its working directory, start, duration, exit status, output (bytes and the first 64 KiB) and the files it created, changed and deleted, as the filesystem recorded them. `task`: one task's journal (`_desk`: commands outside tasks); `limit`: newest N (default 20).",
        annotations(read_only_hint = true)
    )]
    async fn journal(
        &self,
        Parameters(a): Parameters<JournalArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let g = self.grant(&ctx)?;
            let agent = g.agent.clone();
            let entries = api::journal_entries(&self.app, g, &agent, a.task, a.limit).await?;
            Ok(structured(json!({ "entries": to_value(&entries)? })))
        }
        .await;
        done(r)
    }

    #[tool(
        description = "Where the desk's work stands, to pick up where the last session left off: the manual, open tasks with their state, recent notes (what `deskfs resume --json` prints).",
        annotations(read_only_hint = true)
    )]
    async fn resume(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let (desk, _, _) = self.desk(&ctx, false).await?;
            let r =
                blocking(move || deskfs_desk::resume::resume(&desk).map_err(desk_error)).await?;
            Ok(structured(to_value(&r)?))
        }
        .await;
        done(r)
    }
}

/// Arguments of `memory`: the tool-use input of Anthropic's memory tool
/// (`memory_20250818`): `command` and that command's fields.
#[derive(Deserialize, JsonSchema)]
pub struct MemoryArgs {
    /// view, create, str_replace, insert, delete or rename.
    pub command: String,
    /// The command's other fields (path, file_text, old_str, new_str, insert_line,
    /// insert_text, view_range, old_path, new_path).
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

#[tool_router(router = memory_router)]
impl DeskTools {
    #[tool(
        description = "Anthropic's memory tool (memory_20250818) on the desk's memories/ directory, seen as /memories: view, create, str_replace, insert, delete, rename. Results are the protocol's exact strings.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false
        )
    )]
    async fn memory(
        &self,
        Parameters(a): Parameters<MemoryArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let r = async {
            let g = self.grant(&ctx)?;
            let mut input = a.rest;
            input.insert("command".into(), Value::String(a.command));
            let agent = g.agent.clone();
            let out = api::memory_command(&self.app, g, &agent, Value::Object(input)).await?;
            let block = vec![ContentBlock::text(out.text)];
            Ok(if out.is_error {
                CallToolResult::error(block)
            } else {
                CallToolResult::success(block)
            })
        }
        .await;
        done(r)
    }
}

fn to_value<T: Serialize>(v: &T) -> Result<Value> {
    serde_json::to_value(v)
        .map_err(|e| ServeError::new(Code::Io, format!("cannot encode the result: {e}")))
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for DeskTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("deskfs", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "An agent's desk on deskfs: files under /desk (repos/, notes/, tasks/, AGENTS.md), tasks as git worktrees, and `resume` to see where the work stands. Call resume first.",
            )
    }
}

/// Serves the desk `grant` opens over stdin/stdout until the client closes it.
///
/// # Errors
/// `io` when the transport fails.
pub async fn serve_stdio(app: Arc<App>, grant: Grant) -> Result<()> {
    let exec = app.exec.clone();
    let running = DeskTools::fixed(app, grant)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ServeError::new(Code::Io, format!("MCP session failed to start: {e}")))?;
    let ended = running
        .waiting()
        .await
        .map_err(|e| ServeError::new(Code::Io, format!("MCP session failed: {e}")));
    // The client is gone: commands still running are killed and journaled.
    exec.kill_all();
    exec.drain(std::time::Duration::from_secs(10)).await;
    ended?;
    Ok(())
}

/// Checks the bearer token of an `/mcp` request and hands its grant to the tools
/// (request extensions); without a valid one the answer is the `/v1` JSON error with
/// `WWW-Authenticate: Bearer` (the MCP authorization rules: 401 for a missing or bad
/// token).
async fn authenticate(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    match api::grant(&app, req.headers()).await {
        Ok(g) => {
            req.extensions_mut().insert(g);
            next.run(req).await
        }
        Err(e) => {
            let status = e.code.status();
            let mut resp = e.into_response();
            if status == 401 {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            } else if status == 0 {
                *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            }
            resp
        }
    }
}

/// The `/mcp` endpoint (streamable HTTP). `allowed_hosts`: the `Host` values accepted
/// (DNS-rebinding protection; empty accepts any, which the bearer tokens make safe).
pub fn router(app: Arc<App>, allowed_hosts: Vec<String>) -> Router {
    let tools_app = app.clone();
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(allowed_hosts);
    // A session is ended after this long without a message (rmcp's default is 300 s): it
    // must outlast the longest tool call, an exec at its greatest timeout.
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(std::time::Duration::from_secs(
        crate::exec::MAX_TIMEOUT_SECS + 300,
    ));
    let service = StreamableHttpService::new(
        move || Ok(DeskTools::bearer(tools_app.clone())),
        Arc::new(sessions),
        config,
    );
    Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(app, authenticate))
}
