//! The HTTP API under `/v1` (axum). Every request but the OpenAPI document carries
//! `Authorization: Bearer <token>`; the token is resolved to one desk first, and every
//! path is then resolved beneath that desk ([`crate::confine`]). Errors are JSON:
//! `{"error": {"code": "<stable code>", "message": "<one line>"}}` with the code's HTTP
//! status ([`crate::error::Code`]).
//!
//! | method and path | what |
//! |---|---|
//! | `GET /v1/openapi.json` | this API as an OpenAPI 3.1 document (no token) |
//! | `GET /v1/desks` | the desks the token opens |
//! | `POST /v1/desks` `{"agent"}` | create the token's desk |
//! | `GET /v1/desks/{agent}` | one desk: created, repos, tasks |
//! | `GET /v1/desks/{agent}/files/{path}` | content; one `Range`; `ETag`; `If-None-Match` → 304 |
//! | `PUT /v1/desks/{agent}/files/{path}` | atomic replace; `If-Match` / `If-None-Match: *` |
//! | `DELETE /v1/desks/{agent}/files/{path}[?recursive=true]` | remove |
//! | `GET /v1/desks/{agent}/stat[/{path}]` | attributes (`lstat`) |
//! | `GET /v1/desks/{agent}/list[/{path}]` | directory entries with attributes |
//! | `POST /v1/desks/{agent}/mkdir` `{"path", "parents"}` | make a directory |
//! | `POST /v1/desks/{agent}/move` `{"from", "to", "overwrite"}` | rename inside the desk |
//! | `POST /v1/desks/{agent}/memory` tool-use `input` | Anthropic's memory tool (`memory_20250818`) on the desk's `memories/`: 200, `text/plain` tool-result text, `X-Deskfs-Tool-Error: true\|false` (its `is_error`) |
//! | `GET /v1/desks/{agent}/resume` | what `deskfs resume --json` prints |
//! | `POST /v1/desks/{agent}/exec` `{"command"\|"shell", "cwd", "env", "timeout_secs", "net"}` | run a command in the sandbox: `text/event-stream` of `stdout`/`stderr` chunks as they come, then `exit` (or `error`); see [`crate::exec`] |
//! | `GET /v1/desks/{agent}/status` | the desk (repos, tasks, disk usage), exec, and the workspace it is on (dirty, pending, failing uploads) |
//! | `GET /v1/desks/{agent}/journal[?task=T&limit=N]` | the task journal: every command run (CLI, HTTP, MCP), how it ended, its output and files ([`journal_entries`]) |
//! | `GET /v1/desks/{agent}/tasks` | open tasks (`deskfs task list --json`) |
//! | `POST /v1/desks/{agent}/tasks` `{"task", "repo", "branch"}` | start a task (a worktree) |
//! | `POST /v1/desks/{agent}/tasks/{task}/finish` `{"discard", "note"}` | finish a task |

use std::collections::HashMap;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use deskfs_desk::{Desk, DeskError};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::confine::{DeskDir, Precondition, RelPath};
use crate::error::{Code, Result, ServeError};
use crate::tokens::{now_secs, Grant, TokenStore};

/// How long a conditional write waits for another process's write lock of the desk.
pub(crate) const WRITE_LOCK_WAIT: Duration = Duration::from_secs(30);

/// The server's state: the desk root and its tokens.
pub struct App {
    pub(crate) root: PathBuf,
    pub(crate) tokens: TokenStore,
    /// One queue per desk for the check-and-rename step of writes (in this process;
    /// the desk's `files.lock` covers other processes and hosts).
    write_queues: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// What the host adds to every command run ([`crate::exec`]).
    pub(crate) exec: crate::exec::ExecHost,
    /// The status of the workspace the root is on, when the binary can tell.
    workspace_status: Option<crate::status::WorkspaceStatus>,
}

impl App {
    /// Serves the desks under `root`, with the tokens of its store. Commands run with
    /// nothing hidden beyond what the sandbox always hides, and the status endpoint shows
    /// no workspace; see [`App::with_exec`] and [`App::with_workspace_status`].
    pub fn new(root: &Path) -> Arc<App> {
        Arc::new(App {
            root: root.to_path_buf(),
            tokens: TokenStore::at(root),
            write_queues: Default::default(),
            exec: crate::exec::ExecHost::default(),
            workspace_status: None,
        })
    }

    /// Runs commands with `host`'s hidden paths and base environment. Call it on the
    /// fresh `App` (before it is shared); on a shared one it changes nothing and logs
    /// an error.
    pub fn with_exec(mut self: Arc<Self>, host: crate::exec::ExecHost) -> Arc<Self> {
        match Arc::get_mut(&mut self) {
            Some(app) => app.exec = host,
            None => tracing::error!("App::with_exec on a shared App: ignored"),
        }
        self
    }

    /// Shows `status` (the workspace the root is on) in the desks' status. Call it on the
    /// fresh `App`, like [`App::with_exec`].
    pub fn with_workspace_status(
        mut self: Arc<Self>,
        status: crate::status::WorkspaceStatus,
    ) -> Arc<Self> {
        match Arc::get_mut(&mut self) {
            Some(app) => app.workspace_status = Some(status),
            None => tracing::error!("App::with_workspace_status on a shared App: ignored"),
        }
        self
    }

    /// What the host adds to every command (for interfaces that run commands).
    pub fn exec_host(&self) -> &crate::exec::ExecHost {
        &self.exec
    }

    pub(crate) fn write_queue(&self, agent: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.write_queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(agent.to_owned())
            .or_default()
            .clone()
    }
}

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({"error": {"code": self.code.as_str(), "message": self.message}});
        (status, axum::Json(body)).into_response()
    }
}

/// Runs blocking file-system work off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ServeError::new(Code::Io, format!("a worker failed: {e}")))?
}

pub(crate) fn desk_error(e: DeskError) -> ServeError {
    match e {
        DeskError::InvalidAgent { .. } => ServeError::new(Code::BadRequest, e.to_string()),
        // Neither the other desks' names nor host paths go to a token holder.
        DeskError::UnknownAgent { agent, .. } => ServeError::new(
            Code::UnknownDesk,
            format!("no desk for agent {agent:?}; create it with `deskfs desk create {agent}`"),
        ),
        DeskError::NotADesk { reason, .. } => {
            ServeError::new(Code::UnknownDesk, format!("the desk is damaged: {reason}"))
        }
        DeskError::DeskExists { .. } | DeskError::TaskExists { .. } => {
            ServeError::new(Code::Exists, e.to_string())
        }
        DeskError::UnknownTask { .. } | DeskError::UnknownRepo { .. } => {
            ServeError::new(Code::NotFound, e.to_string())
        }
        DeskError::InvalidName { .. } => ServeError::new(Code::BadRequest, e.to_string()),
        DeskError::Uncommitted { .. } | DeskError::LockTimeout { .. } => {
            ServeError::new(Code::Conflict, e.to_string())
        }
        e => ServeError::new(Code::Io, e.to_string()),
    }
}

/// The grant of the request's bearer token.
pub(crate) async fn grant(app: &Arc<App>, headers: &HeaderMap) -> Result<Grant> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            // The scheme is case-insensitive (RFC 9110, 11.1).
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim().to_owned())
        })
        .ok_or_else(|| {
            ServeError::new(
                Code::Unauthorized,
                "no token; send `Authorization: Bearer <token>` with a token from `deskfs token create AGENT`",
            )
        })?;
    let tokens = app.tokens.clone();
    blocking(move || tokens.verify(&token, now_secs())).await
}

/// Checks the token for `agent` (a change when `write`) and holds that desk.
async fn open_desk(
    app: &Arc<App>,
    headers: &HeaderMap,
    agent: &str,
    write: bool,
) -> Result<(Desk, DeskDir)> {
    let g = grant(app, headers).await?;
    open_granted(app, g, agent, write).await
}

/// Holds the desk of `agent` for a request with grant `g` (a change when `write`).
///
/// # Errors
/// `token_scope` (another desk), `read_only_token` (a change with a read-only token),
/// `token_revoked` (the desk was made again), `unknown_desk`, `io`.
pub(crate) async fn open_granted(
    app: &Arc<App>,
    g: Grant,
    agent: &str,
    write: bool,
) -> Result<(Desk, DeskDir)> {
    g.allows(agent, write)?;
    let root = app.root.clone();
    let agent = agent.to_owned();
    blocking(move || {
        let desk = Desk::open(&root, &agent).map_err(desk_error)?;
        g.same_desk(desk.meta().created)?;
        let dir = DeskDir::open(desk.dir())?;
        Ok((desk, dir))
    })
    .await
}

fn json_body<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| {
        ServeError::new(
            Code::BadRequest,
            format!("request body is not the JSON this call takes: {e}"),
        )
    })
}

fn flag(query: &Option<String>, name: &str) -> bool {
    query.as_deref().is_some_and(|q| {
        q.split('&').any(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, "true"));
            k == name && matches!(v, "true" | "1" | "yes")
        })
    })
}

/// The whole router.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/desks", get(list_desks).post(create_desk))
        .route("/v1/desks/{agent}", get(show_desk))
        .route(
            "/v1/desks/{agent}/files/{*path}",
            get(read_file).put(write_file).delete(delete_file),
        )
        .route("/v1/desks/{agent}/stat", get(stat_root))
        .route("/v1/desks/{agent}/stat/{*path}", get(stat_path))
        .route("/v1/desks/{agent}/list", get(list_root))
        .route("/v1/desks/{agent}/list/{*path}", get(list_path))
        .route("/v1/desks/{agent}/mkdir", post(mkdir))
        .route("/v1/desks/{agent}/move", post(move_path))
        .route("/v1/desks/{agent}/memory", post(memory))
        .route("/v1/desks/{agent}/resume", get(resume))
        .route("/v1/desks/{agent}/exec", post(exec))
        .route("/v1/desks/{agent}/status", get(desk_status))
        .route("/v1/desks/{agent}/journal", get(journal))
        .route("/v1/desks/{agent}/tasks", get(list_tasks).post(start_task))
        .route("/v1/desks/{agent}/tasks/{task}/finish", post(finish_task))
        .fallback(|| async {
            ServeError::new(Code::NotFound, "no such endpoint; see GET /v1/openapi.json")
        })
        .layer(axum::middleware::map_response(json_errors))
        .with_state(app)
}

/// Gives the errors axum answers itself (a method an endpoint does not take, a path that
/// is not UTF-8, a body over the limit) the same JSON shape as ours.
async fn json_errors(resp: Response) -> Response {
    let st = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(st.is_client_error() || st.is_server_error()) || is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|b| {
            String::from_utf8_lossy(&b)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let code = match st.as_u16() {
        404 => Code::NotFound,
        405 => Code::MethodNotAllowed,
        413 => Code::TooLarge,
        416 => Code::RangeNotSatisfiable,
        s if s < 500 => Code::BadRequest,
        _ => Code::Io,
    };
    let message = if text.is_empty() {
        match code {
            Code::MethodNotAllowed => {
                "this endpoint does not take that method; see GET /v1/openapi.json".to_owned()
            }
            _ => format!("{st}; see GET /v1/openapi.json"),
        }
    } else {
        text
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let body = json!({"error": {"code": code.as_str(), "message": message}});
    Response::from_parts(parts, Body::from(body.to_string()))
}

async fn openapi() -> axum::Json<Value> {
    axum::Json(crate::openapi::document())
}

async fn list_desks(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response> {
    let g = grant(&app, &headers).await?;
    let root = app.root.clone();
    let desks = blocking(move || deskfs_desk::list(&root).map_err(desk_error)).await?;
    let v: Vec<Value> = desks
        .into_iter()
        .filter(|d| d.agent == g.agent)
        .map(|d| json!({"agent": d.agent, "created": d.created}))
        .collect();
    Ok(axum::Json(json!({ "desks": v })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateDesk {
    agent: String,
}

async fn create_desk(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let req: CreateDesk = json_body(&body)?;
    let g = grant(&app, &headers).await?;
    g.allows(&req.agent, true)?;
    if g.desk_created.is_some() {
        // Made for a desk that existed: it never opens a desk made after that one.
        let root = app.root.clone();
        let agent = req.agent.clone();
        let existing = blocking(move || Ok(Desk::open(&root, &agent).ok())).await?;
        match existing {
            Some(d) => g.same_desk(d.meta().created)?,
            None => return Err(ServeError::new(
                Code::TokenRevoked,
                "this token was made for a desk that was removed; make a new one with `deskfs token create`",
            )),
        }
    }
    let root = app.root.clone();
    let desk = blocking(move || Desk::create(&root, &req.agent).map_err(desk_error)).await?;
    let v = json!({"agent": desk.agent(), "created": desk.meta().created});
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

async fn show_desk(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let (desk, _) = open_desk(&app, &headers, &agent, false).await?;
    let v = json!({
        "agent": desk.agent(),
        "created": desk.meta().created,
        "repos": desk.repo_names(),
        "tasks": desk.task_names(),
    });
    Ok(axum::Json(v).into_response())
}

/// Whether the `If-None-Match` value `v` (`*`, or a list of strong or weak tags)
/// names `etag` (weak comparison, RFC 9110 13.1.2).
fn etag_listed(v: &str, etag: &str) -> bool {
    v.split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.trim_start_matches("W/") == etag)
}

/// One `Range: bytes=…` of a file of `size` bytes: `Some((start, len))`, `None` to
/// serve the whole file (no header, or several ranges, which RFC 9110 lets a server
/// ignore).
fn range(headers: &HeaderMap, size: u64) -> Result<Option<(u64, u64)>> {
    let Some(v) = headers.get(header::RANGE) else {
        return Ok(None);
    };
    let bad = || {
        ServeError::new(
            Code::RangeNotSatisfiable,
            format!("cannot serve that Range of a {size}-byte file; use bytes=START-END within it"),
        )
    };
    // A Range the server does not understand is ignored (RFC 9110 14.2): the whole file.
    let Ok(s) = v.to_str() else {
        return Ok(None);
    };
    let Some(spec) = s.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    let num = |x: &str| -> Option<u64> {
        if x.is_empty() || !x.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        // Past u64: as large as can be (clamped to the file below).
        Some(x.parse().unwrap_or(u64::MAX))
    };
    if (!a.trim().is_empty() && num(a.trim()).is_none())
        || (!b.trim().is_empty() && num(b.trim()).is_none())
    {
        return Ok(None);
    }
    let (start, end) = match (a.trim(), b.trim()) {
        ("", "") => return Ok(None),
        ("", n) => {
            let n = num(n).ok_or_else(bad)?;
            if n == 0 {
                return Err(bad());
            }
            (size.saturating_sub(n), size.saturating_sub(1))
        }
        (a, "") => (num(a).ok_or_else(bad)?, size.saturating_sub(1)),
        (a, b) => {
            let a = num(a).ok_or_else(bad)?;
            let b = num(b).ok_or_else(bad)?;
            if b < a {
                return Err(bad());
            }
            (a, b.min(size.saturating_sub(1)))
        }
    };
    if start >= size {
        return Err(bad());
    }
    Ok(Some((start, end - start + 1)))
}

async fn read_file(
    State(app): State<Arc<App>>,
    UrlPath((agent, path)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response> {
    let rel = RelPath::parse(&path)?;
    let (_, dir) = open_desk(&app, &headers, &agent, false).await?;
    let (file, st) = blocking(move || dir.open_read(&rel)).await?;
    let etag =
        HeaderValue::from_str(&st.etag).map_err(|e| ServeError::new(Code::Io, e.to_string()))?;
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| etag_listed(v, &st.etag))
    {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    let size = st.size;
    let want = match range(&headers, size) {
        Ok(r) => r,
        Err(e) => {
            let mut resp = e.into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                resp.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(resp);
        }
    };
    let (start, len) = want.unwrap_or((0, size));
    let mut file = file;
    if start > 0 {
        file.seek(SeekFrom::Start(start))
            .map_err(|e| ServeError::io("read", &st.path, e))?;
    }
    let reader = tokio::fs::File::from_std(file).take(len);
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::ETAG, etag);
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Some((s, l)) = want {
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {s}-{}/{size}", s + l - 1)) {
            resp.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(resp)
}

/// The write condition of a PUT's headers.
fn precondition(headers: &HeaderMap) -> Result<Precondition> {
    let text = |h| {
        headers
            .get(h)
            .map(|v| {
                v.to_str().map(|s| s.trim().to_owned()).map_err(|_| {
                    ServeError::new(Code::BadRequest, "a condition header is not text")
                })
            })
            .transpose()
    };
    match (text(header::IF_MATCH)?, text(header::IF_NONE_MATCH)?) {
        (Some(_), Some(_)) => Err(ServeError::new(
            Code::BadRequest,
            "send If-Match or If-None-Match, not both",
        )),
        (Some(m), None) if m == "*" => Ok(Precondition::Exists),
        (Some(m), None) => Ok(Precondition::Etag(m)),
        (None, Some(n)) if n == "*" => Ok(Precondition::Absent),
        (None, Some(_)) => Err(ServeError::new(
            Code::BadRequest,
            "a PUT takes only If-None-Match: * (create only)",
        )),
        (None, None) => Ok(Precondition::None),
    }
}

/// Commits a staged write of `agent`'s desk under the desk's write lock: check and
/// rename one at a time per desk, in this process by its queue, across processes and
/// hosts by the desk's `files.lock`.
///
/// # Errors
/// Those of [`crate::confine::Staged::commit`]; `conflict` when the lock stays held
/// elsewhere for [`WRITE_LOCK_WAIT`].
pub(crate) async fn commit_locked(
    app: &Arc<App>,
    agent: &str,
    desk: &Desk,
    staged: crate::confine::Staged,
    pre: Precondition,
) -> Result<crate::confine::Committed> {
    with_write_lock(app, agent, desk, move || staged.commit(&pre)).await
}

/// Runs `f` (blocking) holding the desk's write turn: this server's queue for `agent`,
/// then `.desk/locks/files.lock` (other servers and hosts).
///
/// # Errors
/// Those of `f`; `conflict` when the lock stays held elsewhere for [`WRITE_LOCK_WAIT`].
async fn with_write_lock<T: Send + 'static>(
    app: &Arc<App>,
    agent: &str,
    desk: &Desk,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let queue = app.write_queue(agent);
    let _turn = queue.lock().await;
    let lock_path = desk.locks_dir().join("files.lock");
    blocking(move || {
        let _lock = deskfs_desk::lock::FileLock::acquire(
            &lock_path,
            "the desk's file writes",
            WRITE_LOCK_WAIT,
            false,
        )
        .map_err(desk_error)?;
        f()
    })
    .await
}

async fn write_file(
    State(app): State<Arc<App>>,
    UrlPath((agent, path)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    let rel = RelPath::parse(&path)?;
    let pre = precondition(&headers)?;
    let (desk, dir) = open_desk(&app, &headers, &agent, true).await?;
    let mut staged = blocking(move || dir.stage(&rel)).await?;
    let shown = path.clone();
    let Some(f) = staged.take_file() else {
        return Err(ServeError::new(Code::Io, "no temporary file"));
    };
    let mut out = tokio::fs::File::from_std(f);
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ServeError::new(
                Code::BadRequest,
                format!("the request body broke off ({e}); nothing was written"),
            )
        })?;
        out.write_all(&chunk)
            .await
            .map_err(|e| ServeError::io("write", &shown, e))?;
    }
    out.flush()
        .await
        .map_err(|e| ServeError::io("write", &shown, e))?;
    staged.put_back(out.into_std().await);
    let done = commit_locked(&app, &agent, &desk, staged, pre).await?;
    let status = if done.replaced {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let etag = HeaderValue::from_str(&done.stat.etag)
        .map_err(|e| ServeError::new(Code::Io, e.to_string()))?;
    Ok((status, [(header::ETAG, etag)], axum::Json(done.stat)).into_response())
}

async fn delete_file(
    State(app): State<Arc<App>>,
    UrlPath((agent, path)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response> {
    let rel = RelPath::parse(&path)?;
    let recursive = flag(&query, "recursive");
    let (_, dir) = open_desk(&app, &headers, &agent, true).await?;
    blocking(move || dir.remove(&rel, recursive)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn stat_of(app: Arc<App>, agent: String, path: &str, headers: HeaderMap) -> Result<Response> {
    let rel = RelPath::parse(path)?;
    let (_, dir) = open_desk(&app, &headers, &agent, false).await?;
    let st = blocking(move || dir.stat(&rel)).await?;
    Ok(axum::Json(st).into_response())
}

async fn stat_root(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response> {
    stat_of(app, agent, "", headers).await
}

async fn stat_path(
    State(app): State<Arc<App>>,
    UrlPath((agent, path)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response> {
    stat_of(app, agent, &path, headers).await
}

async fn list_of(app: Arc<App>, agent: String, path: &str, headers: HeaderMap) -> Result<Response> {
    let rel = RelPath::parse(path)?;
    let (_, dir) = open_desk(&app, &headers, &agent, false).await?;
    let shown = rel.display();
    let entries = blocking(move || dir.list(&rel)).await?;
    Ok(axum::Json(json!({"path": shown, "entries": entries})).into_response())
}

async fn list_root(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response> {
    list_of(app, agent, "", headers).await
}

async fn list_path(
    State(app): State<Arc<App>>,
    UrlPath((agent, path)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response> {
    list_of(app, agent, &path, headers).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Mkdir {
    path: String,
    #[serde(default)]
    parents: bool,
}

async fn mkdir(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let req: Mkdir = json_body(&body)?;
    let rel = RelPath::parse(&req.path)?;
    let (_, dir) = open_desk(&app, &headers, &agent, true).await?;
    let st = blocking(move || {
        dir.mkdir(&rel, req.parents)?;
        dir.stat(&rel)
    })
    .await?;
    Ok((StatusCode::CREATED, axum::Json(st)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Move {
    from: String,
    to: String,
    #[serde(default)]
    overwrite: bool,
}

async fn move_path(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let req: Move = json_body(&body)?;
    let from = RelPath::parse(&req.from)?;
    let to = RelPath::parse(&req.to)?;
    let (_, dir) = open_desk(&app, &headers, &agent, true).await?;
    let st = blocking(move || {
        dir.rename(&from, &to, req.overwrite)?;
        dir.stat(&to)
    })
    .await?;
    Ok(axum::Json(st).into_response())
}

/// Runs one memory-tool command ([`crate::memory::run`]) on `agent`'s desk for a
/// request with grant `g`: a change (every command but `view`) needs a read-write
/// grant and runs one at a time per desk (the queue and `files.lock` of file writes).
///
/// # Errors
/// Those of [`open_granted`] (`read_only_token` for a change with a read-only token);
/// `conflict` when the desk's write lock stays held elsewhere for [`WRITE_LOCK_WAIT`].
/// The command's own failures are not errors: they are its error strings, with
/// `is_error` set.
pub(crate) async fn memory_command(
    app: &Arc<App>,
    g: Grant,
    agent: &str,
    input: Value,
) -> Result<crate::memory::MemoryOutcome> {
    let change = crate::memory::is_change(&input);
    let (desk, dir) = open_granted(app, g, agent, change).await?;
    if !change {
        return blocking(move || Ok(crate::memory::run(&dir, &input, false))).await;
    }
    with_write_lock(app, agent, &desk, move || {
        Ok(crate::memory::run(&dir, &input, true))
    })
    .await
}

/// `POST /v1/desks/{agent}/memory`: the body is the tool-use `input`; the reply is the
/// tool-result text (`text/plain`, status 200 for results and the tool's error strings
/// alike) with `X-Deskfs-Tool-Error` giving its `is_error`.
async fn memory(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let input: Value = json_body(&body)?;
    let g = grant(&app, &headers).await?;
    let out = memory_command(&app, g, &agent, input).await?;
    let flag = if out.is_error { "true" } else { "false" };
    Ok((
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::HeaderName::from_static("x-deskfs-tool-error"),
                HeaderValue::from_static(flag),
            ),
        ],
        out.text,
    )
        .into_response())
}

async fn resume(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let (desk, _) = open_desk(&app, &headers, &agent, false).await?;
    let r = blocking(move || deskfs_desk::resume::resume(&desk).map_err(desk_error)).await?;
    Ok(axum::Json(r).into_response())
}

/// Entries the journal endpoint and tool return when the request names no limit.
pub const JOURNAL_DEFAULT_LIMIT: usize = 20;
/// The most entries one journal request returns.
pub const JOURNAL_MAX_LIMIT: usize = 1000;

/// The newest `limit` entries of the task journal of the desk `g` opens, oldest first:
/// of task `task` (`_desk`: the execs outside tasks), or of all of them merged.
///
/// # Errors
/// `bad_request` (a limit of 0 or over [`JOURNAL_MAX_LIMIT`], an invalid task name),
/// `not_found` (no such task, and no journal for it), the grant's codes, `io`.
pub(crate) async fn journal_entries(
    app: &Arc<App>,
    g: Grant,
    agent: &str,
    task: Option<String>,
    limit: Option<usize>,
) -> Result<Vec<deskfs_desk::journal::Entry>> {
    let limit = limit.unwrap_or(JOURNAL_DEFAULT_LIMIT);
    if !(1..=JOURNAL_MAX_LIMIT).contains(&limit) {
        return Err(ServeError::new(
            Code::BadRequest,
            format!("limit {limit} is out of range; give 1 to {JOURNAL_MAX_LIMIT}"),
        ));
    }
    let (desk, _) = open_granted(app, g, agent, false).await?;
    blocking(move || {
        use deskfs_desk::journal;
        if let Some(t) = task.as_deref() {
            if t != journal::DESK_JOURNAL {
                deskfs_desk::names::check_task(t).map_err(desk_error)?;
                if !desk.task_dir(t).exists() && !journal::journal_path(&desk, Some(t)).exists()
                {
                    return Err(ServeError::new(
                        Code::NotFound,
                        format!("no task {t:?} and no journal of it; see the tasks with GET /v1/desks/{{agent}}/tasks"),
                    ));
                }
            }
        }
        journal::read(&desk, task.as_deref(), limit).map_err(desk_error)
    })
    .await
}

async fn journal(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    query: std::result::Result<
        axum::extract::Query<HashMap<String, String>>,
        axum::extract::rejection::QueryRejection,
    >,
    headers: HeaderMap,
) -> Result<Response> {
    let axum::extract::Query(q) =
        query.map_err(|e| ServeError::new(Code::BadRequest, format!("bad query: {e}")))?;
    if let Some(k) = q.keys().find(|k| !matches!(k.as_str(), "task" | "limit")) {
        return Err(ServeError::new(
            Code::BadRequest,
            format!("unknown query parameter {k:?}; the journal takes task and limit"),
        ));
    }
    let limit = q
        .get("limit")
        .map(|l| {
            l.parse::<usize>().map_err(|_| {
                ServeError::new(
                    Code::BadRequest,
                    format!("limit {l:?} is not a number; give 1 to {JOURNAL_MAX_LIMIT}"),
                )
            })
        })
        .transpose()?;
    let g = grant(&app, &headers).await?;
    let entries = journal_entries(&app, g, &agent, q.get("task").cloned(), limit).await?;
    Ok(axum::Json(json!({ "entries": entries })).into_response())
}

async fn list_tasks(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let (desk, _) = open_desk(&app, &headers, &agent, false).await?;
    let tasks = blocking(move || Ok(deskfs_desk::task::list(&desk))).await?;
    Ok(axum::Json(json!({ "tasks": tasks })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartTask {
    task: String,
    repo: String,
    #[serde(default)]
    branch: Option<String>,
}

async fn start_task(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let req: StartTask = json_body(&body)?;
    let (desk, _) = open_desk(&app, &headers, &agent, true).await?;
    let started = blocking(move || {
        deskfs_desk::task::repair_links(&desk);
        deskfs_desk::task::start(&desk, &req.task, &req.repo, req.branch.as_deref())
            .map_err(desk_error)
    })
    .await?;
    Ok((StatusCode::CREATED, axum::Json(started)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FinishTask {
    #[serde(default)]
    discard: bool,
    #[serde(default)]
    note: Option<String>,
}

async fn finish_task(
    State(app): State<Arc<App>>,
    UrlPath((agent, task)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let req: FinishTask = if body.is_empty() {
        FinishTask::default()
    } else {
        json_body(&body)?
    };
    let (desk, _) = open_desk(&app, &headers, &agent, true).await?;
    let finished = blocking(move || {
        deskfs_desk::task::repair_links(&desk);
        deskfs_desk::task::finish(&desk, &task, req.discard, req.note.as_deref())
            .map_err(desk_error)
    })
    .await?;
    Ok(axum::Json(finished).into_response())
}

/// The body of an `exec` SSE event.
fn exec_event(ev: crate::exec::ExecEvent) -> axum::response::sse::Event {
    use crate::exec::{chunk_json, ExecEvent};
    use axum::response::sse::Event;
    let (name, data) = match ev {
        ExecEvent::Stdout(b) => ("stdout", chunk_json(&b)),
        ExecEvent::Stderr(b) => ("stderr", chunk_json(&b)),
        ExecEvent::Exit(x) => ("exit", serde_json::to_value(x).unwrap_or(Value::Null)),
        ExecEvent::Error(e) => (
            "error",
            json!({"error": {"code": e.code.as_str(), "message": e.message}}),
        ),
    };
    Event::default().event(name).data(data.to_string())
}

async fn exec(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    use axum::response::sse::{KeepAlive, Sse};
    let req: crate::exec::ExecRequest = json_body(&body)?;
    // A command can change anything in the desk: read-only tokens are refused.
    let (desk, _) = open_desk(&app, &headers, &agent, true).await?;
    let running = crate::exec::start(&desk, &app.exec, req, crate::exec_journal::Via::Http).await?;
    // Dropping the stream (the client went away) drops `running`, which kills the
    // command; the keep-alive comments find a closed connection within their interval.
    let events = futures::stream::unfold(running, |mut r| async move {
        let ev = r.next().await?;
        Some((Ok::<_, std::convert::Infallible>(exec_event(ev)), r))
    });
    let mut resp = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
        .into_response();
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

async fn desk_status(
    State(app): State<Arc<App>>,
    UrlPath(agent): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let (desk, _) = open_desk(&app, &headers, &agent, false).await?;
    let a = app.clone();
    let v = blocking(move || {
        Ok(crate::status::desk_status(
            &desk,
            &a.exec,
            a.workspace_status.as_ref(),
        ))
    })
    .await?;
    Ok(axum::Json(v).into_response())
}
