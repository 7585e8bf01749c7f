//! The OpenAPI 3.1 document of the `/v1` API, served at `GET /v1/openapi.json`.

use serde_json::{json, Value};

fn path_param(name: &str, what: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": what, "schema": {"type": "string"}})
}

fn errors(codes: &[u16]) -> Value {
    let mut m = serde_json::Map::new();
    for c in codes {
        m.insert(
            c.to_string(),
            json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
        );
    }
    Value::Object(m)
}

fn with(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

fn json_ok(schema: &str) -> Value {
    json!({"description": "ok", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

/// `POST /v1/desks/{agent}/exec`: the request, the SSE events, the errors.
fn exec_path(agent: &Value) -> Value {
    let chunk = json!({"type": "object", "description": "one chunk of output as written: UTF-8 text (never split inside a character), or base64 when the bytes are not UTF-8; the chunks of a stream concatenated are its exact bytes",
        "properties": {"text": {"type": "string"}, "base64": {"type": "string", "contentEncoding": "base64"}}});
    let exit = json!({"type": "object", "required": ["code", "signal", "duration_ms", "stdout_bytes", "stderr_bytes", "timed_out", "killed"], "properties": {
        "code": {"type": "integer", "description": "as a shell reports it: the command's code, 128 + signal when a signal ended it, 127 no such program, 137 killed"},
        "signal": {"type": ["integer", "null"], "description": "code - 128 for codes 129..=192 (as a shell infers it); 9 when killed"},
        "duration_ms": {"type": "integer"}, "stdout_bytes": {"type": "integer"}, "stderr_bytes": {"type": "integer"},
        "timed_out": {"type": "boolean", "description": "its timeout passed and it was killed, with every process it started"},
        "killed": {"type": "boolean", "description": "killed by the server: its timeout passed, the client went away, or the server stopped"},
        "journal_id": {"type": "string", "description": "its entry in the desk's task journal (GET .../journal); absent when the entry could not be written"}}});
    let request = json!({"type": "object", "additionalProperties": false, "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "program and arguments (no shell); or give shell"},
        "shell": {"type": "string", "description": "a command line run as sh -c SHELL; or give command"},
        "cwd": {"type": "string", "description": "a directory of the desk, desk-relative (tasks/T, repos/app); default the desk (/desk inside)"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "extra variables; AWS_*, GOOGLE_*, GCLOUD_*, AZURE_*, DESKFS_* refused"},
        "timeout_secs": {"type": "integer", "minimum": 1, "maximum": crate::exec::MAX_TIMEOUT_SECS, "default": crate::exec::DEFAULT_TIMEOUT_SECS},
        "net": {"type": "string", "enum": ["host", "none"], "default": "host"}}});
    json!({"post": {
        "summary": "Run a command in the desk's sandbox (bubblewrap; the desk at /desk, stdin /dev/null); output streamed as it is written",
        "description": "The reply is text/event-stream: events `stdout` and `stderr` (data: a chunk), then one `exit` (data: the exit), or `error` (data: {\"error\": {code, message}}) when the sandbox could not be set up after the stream began (the command never ran; bwrap's message came as stderr). Comments keep the stream alive every 5 s. Closing the connection kills the command and every process it started. A read-only token is refused (403 read_only_token).",
        "parameters": [agent],
        "requestBody": {"required": true, "content": {"application/json": {"schema": request}}},
        "responses": with(json!({"200": {"description": "the events", "content": {"text/event-stream": {"schema": {"type": "string"},
            "x-events": {"stdout": chunk, "stderr": chunk, "exit": exit, "error": {"$ref": "#/components/schemas/Error"}}}}}}),
            errors(&[400, 401, 403, 404, 409, 429, 500, 503]))
    }})
}

/// `GET /v1/desks/{agent}/journal`.
fn journal_path(agent: &Value) -> Value {
    let q = |name: &str, schema: Value, what: &str| json!({"name": name, "in": "query", "required": false, "schema": schema, "description": what});
    json!({"get": {
        "summary": "The desk's task journal, written by the system: every command run (CLI, HTTP, MCP) with its argv, cwd, start, duration, exit status (killed, timed_out), output (bytes; the first 64 KiB when captured) and the files it created, changed and deleted as the mount recorded them (files null with changes_unknown when not known)",
        "parameters": [agent,
            q("task", json!({"type": "string"}), "one task's journal; _desk for commands outside tasks; absent: all, merged by start time"),
            q("limit", json!({"type": "integer", "minimum": 1, "maximum": crate::api::JOURNAL_MAX_LIMIT, "default": crate::api::JOURNAL_DEFAULT_LIMIT}), "the newest N entries, returned oldest first")],
        "responses": with(json!({"200": {"description": "the entries", "content": {"application/json": {"schema": {"type": "object", "properties": {
            "entries": {"type": "array", "items": {"type": "object", "required": ["id", "via", "command", "cwd", "start", "start_ms", "duration_ms", "exit_code", "signal", "timed_out", "killed", "output_captured", "files"]}}}}}}}}),
            errors(&[400, 401, 403, 404, 500]))
    }})
}

/// `GET /v1/desks/{agent}/status`.
fn status_path(agent: &Value) -> Value {
    json!({"get": {
        "summary": "The desk's status: repos, open tasks with their worktree state, disk usage, exec (available, running), and the deskfs workspace the desks are on (null when not on a mount): dirty data, pending and failing uploads (those of this desk by desk-relative path), cache, metadata backup",
        "parameters": [agent],
        "responses": with(json!({"200": {"description": "the status", "content": {"application/json": {"schema": {"type": "object", "properties": {
            "agent": {"type": "string"}, "created": {"type": "integer"},
            "repos": {"type": "array", "items": {"type": "string"}},
            "tasks": {"type": "array", "items": {"type": "object"}},
            "usage": {"type": "object", "properties": {"bytes": {"type": "integer"}, "files": {"type": "integer"}, "dirs": {"type": "integer"}, "complete": {"type": "boolean"}}},
            "exec": {"type": "object", "properties": {"available": {"type": "boolean"}, "running": {"type": "integer"}}},
            "workspace": {"type": ["object", "null"]}}}}}}}), errors(&[401, 403, 404, 500]))
    }})
}

/// The document.
pub fn document() -> Value {
    let agent = path_param("agent", "the desk's agent name");
    let path = path_param("path", "a path inside the desk (relative; no `..`)");
    let auth_errors = [401, 403, 404, 500];
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "deskfs desks",
            "version": "1",
            "description": "An agent's desk (files, tasks) on a deskfs workspace. Every call but this document needs `Authorization: Bearer <token>` (`deskfs token create AGENT`); a token opens one desk. Errors are `{\"error\": {\"code\", \"message\"}}` with stable codes. The desk's `.desk/` (task records, the task journal, locks) is kept by deskfs: it can be read, and every change under it (a write, mkdir, move into, out of or of it, delete), however the path reaches it (a symlink included), is 403 read_only_path."
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
                    "code": {"type": "string", "enum": crate::error::Code::ALL.map(crate::error::Code::as_str)},
                    "message": {"type": "string"}}}}},
                "Stat": {"type": "object", "required": ["path", "kind", "size", "mode", "mtime_ns", "etag"], "properties": {
                    "path": {"type": "string"}, "kind": {"type": "string", "enum": ["file", "dir", "symlink", "other"]},
                    "size": {"type": "integer"}, "mode": {"type": "integer"}, "mtime_ns": {"type": "integer"},
                    "etag": {"type": "string"}, "target": {"type": "string"}}},
                "Listing": {"type": "object", "properties": {"path": {"type": "string"}, "entries": {"type": "array", "items": {"$ref": "#/components/schemas/Stat"}}}},
                "Desk": {"type": "object", "properties": {"agent": {"type": "string"}, "created": {"type": "integer"}, "repos": {"type": "array", "items": {"type": "string"}}, "tasks": {"type": "array", "items": {"type": "string"}}}},
                "Desks": {"type": "object", "properties": {"desks": {"type": "array", "items": {"$ref": "#/components/schemas/Desk"}}}}
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {"200": {"description": "the document"}}}},
            "/v1/desks": {
                "get": {"summary": "The desks the token opens", "responses": with(json!({"200": json_ok("Desks")}), errors(&[401, 500]))},
                "post": {"summary": "Create the token's desk", "requestBody": {"content": {"application/json": {"schema": {"type": "object", "required": ["agent"], "properties": {"agent": {"type": "string"}}}}}},
                         "responses": with(json!({"201": json_ok("Desk")}), errors(&[400, 401, 403, 409, 500]))}
            },
            "/v1/desks/{agent}": {"get": {"summary": "One desk", "parameters": [agent], "responses": with(json!({"200": json_ok("Desk")}), errors(&auth_errors))}},
            "/v1/desks/{agent}/files/{path}": {
                "get": {"summary": "A file's content (one Range; ETag; If-None-Match gives 304)", "parameters": [agent, path,
                            {"name": "Range", "in": "header", "schema": {"type": "string"}, "example": "bytes=0-1023"},
                            {"name": "If-None-Match", "in": "header", "schema": {"type": "string"}}],
                        "responses": with(json!({"200": {"description": "the content", "content": {"application/octet-stream": {}}}, "206": {"description": "the range"}, "304": {"description": "unchanged"}}), errors(&[400, 401, 403, 404, 409, 416, 500]))},
                "put": {"summary": "Replace a file atomically (temporary file, fsync, rename); the parent must exist", "parameters": [agent, path,
                            {"name": "If-Match", "in": "header", "schema": {"type": "string"}, "description": "the ETag the file must have, or * (must exist)"},
                            {"name": "If-None-Match", "in": "header", "schema": {"type": "string", "enum": ["*"]}, "description": "create only"}],
                        "requestBody": {"content": {"application/octet-stream": {}}},
                        "responses": with(json!({"200": json_ok("Stat"), "201": json_ok("Stat")}), errors(&[400, 401, 403, 404, 409, 412, 500]))},
                "delete": {"summary": "Remove a file, symlink or directory", "parameters": [agent, path, {"name": "recursive", "in": "query", "schema": {"type": "boolean"}}],
                           "responses": with(json!({"204": {"description": "removed"}}), errors(&[400, 401, 403, 404, 409, 500]))}
            },
            "/v1/desks/{agent}/stat": {"get": {"summary": "The desk root's attributes", "parameters": [agent], "responses": with(json!({"200": json_ok("Stat")}), errors(&auth_errors))}},
            "/v1/desks/{agent}/stat/{path}": {"get": {"summary": "A path's attributes (symlinks not followed)", "parameters": [agent, path], "responses": with(json!({"200": json_ok("Stat")}), errors(&[400, 401, 403, 404, 500]))}},
            "/v1/desks/{agent}/list": {"get": {"summary": "The desk root's entries", "parameters": [agent], "responses": with(json!({"200": json_ok("Listing")}), errors(&auth_errors))}},
            "/v1/desks/{agent}/list/{path}": {"get": {"summary": "A directory's entries", "parameters": [agent, path], "responses": with(json!({"200": json_ok("Listing")}), errors(&[400, 401, 403, 404, 409, 500]))}},
            "/v1/desks/{agent}/mkdir": {"post": {"summary": "Make a directory", "parameters": [agent],
                "requestBody": {"content": {"application/json": {"schema": {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}, "parents": {"type": "boolean"}}}}}},
                "responses": with(json!({"201": json_ok("Stat")}), errors(&[400, 401, 403, 404, 409, 500]))}},
            "/v1/desks/{agent}/exec": exec_path(&agent),
            "/v1/desks/{agent}/status": status_path(&agent),
            "/v1/desks/{agent}/journal": journal_path(&agent),
            "/v1/desks/{agent}/resume": {"get": {"summary": "What a session reads first (as `deskfs resume --json`)", "parameters": [agent], "responses": with(json!({"200": {"description": "the resume"}}), errors(&auth_errors))}},
            "/v1/desks/{agent}/tasks": {
                "get": {"summary": "Open tasks", "parameters": [agent], "responses": with(json!({"200": {"description": "the tasks"}}), errors(&auth_errors))},
                "post": {"summary": "Start a task: a git worktree of a repo under tasks/", "parameters": [agent],
                         "requestBody": {"content": {"application/json": {"schema": {"type": "object", "required": ["task", "repo"], "properties": {"task": {"type": "string"}, "repo": {"type": "string"}, "branch": {"type": "string"}}}}}},
                         "responses": with(json!({"201": {"description": "started"}}), errors(&[400, 401, 403, 404, 409, 500]))}
            },
            "/v1/desks/{agent}/tasks/{task}/finish": {"post": {"summary": "Finish a task (refused with uncommitted work unless discard)", "parameters": [agent, path_param("task", "the task")],
                "requestBody": {"content": {"application/json": {"schema": {"type": "object", "properties": {"discard": {"type": "boolean"}, "note": {"type": "string"}}}}}},
                "responses": with(json!({"200": {"description": "finished"}}), errors(&[400, 401, 403, 404, 409, 500]))}},
            "/v1/desks/{agent}/move": {"post": {"summary": "Rename inside the desk (RENAME_NOREPLACE unless overwrite)", "parameters": [agent],
                "requestBody": {"content": {"application/json": {"schema": {"type": "object", "required": ["from", "to"], "properties": {"from": {"type": "string"}, "to": {"type": "string"}, "overwrite": {"type": "boolean"}}}}}},
                "responses": with(json!({"200": json_ok("Stat")}), errors(&[400, 401, 403, 404, 409, 500]))}},
            "/v1/desks/{agent}/memory": {"post": {"summary": "Anthropic's memory tool (memory_20250818) on the desk's memories/: the body is the tool-use input, the reply the tool-result text", "parameters": [agent],
                "description": "Paths are /memories/...; results and error strings are those of Anthropic's memory tool documentation. A tool error (no such file, old_str not unique, a path leaving /memories, a symlink) is still 200, with X-Deskfs-Tool-Error: true (the tool_result's is_error). A read-only token may only view (any other command is 403 read_only_token).",
                "requestBody": {"content": {"application/json": {"schema": crate::memory::input_schema()}}},
                "responses": with(json!({"200": {"description": "the tool-result text",
                    "headers": {"X-Deskfs-Tool-Error": {"description": "true when the text is one of the tool's error strings (is_error)", "schema": {"type": "string", "enum": ["true", "false"]}}},
                    "content": {"text/plain": {"schema": {"type": "string"}}}}}), errors(&[400, 401, 403, 404, 409, 500]))}}
        }
    })
}
