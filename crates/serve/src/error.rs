//! Errors of the desk interfaces: a stable machine code, an HTTP status, and one line
//! naming the problem and the fix. The same codes are used by every interface (HTTP
//! JSON bodies `{"error": {"code": ..., "message": ...}}`, MCP tool errors, the CLI).

use std::io;

/// A stable error code (the `code` field of every error body; never renamed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Malformed request: bad JSON, a bad header, a bad parameter (400).
    BadRequest,
    /// A path that is not acceptable as text: NUL byte, empty name (400).
    BadPath,
    /// A path that would leave the desk: absolute, `..`, a symlink pointing out (403).
    OutsideDesk,
    /// A path component over 255 bytes (400).
    NameTooLong,
    /// A path over 4,096 bytes (400).
    PathTooLong,
    /// No such file or directory (404).
    NotFound,
    /// The target exists (409).
    Exists,
    /// A directory where a file is needed (409).
    IsDir,
    /// A file where a directory is needed (409).
    NotDir,
    /// A directory that is not empty (409).
    NotEmpty,
    /// The desk's state refuses the change: a task with uncommitted work, a lock held
    /// elsewhere (409).
    Conflict,
    /// `If-Match` did not match the file's current ETag (412).
    EtagMismatch,
    /// The `Range` cannot be satisfied (416).
    RangeNotSatisfiable,
    /// No bearer token, or one that is not known (401).
    Unauthorized,
    /// The token has expired (401).
    TokenExpired,
    /// The token was revoked (401).
    TokenRevoked,
    /// The token opens another desk (403).
    TokenScope,
    /// A read-only token asked for a change (403).
    ReadOnlyToken,
    /// A change under the desk's `.desk/` (task records, the task journal, locks), which
    /// deskfs keeps and agents may only read (403).
    ReadOnlyPath,
    /// No desk of that agent (404).
    UnknownDesk,
    /// The endpoint does not take this method (405).
    MethodNotAllowed,
    /// The request body is larger than the endpoint takes (413).
    TooLarge,
    /// The file system refused: no space, permissions, I/O (500 / 507).
    Io,
    /// This server cannot run the command: no bubblewrap, or the sandbox could not be
    /// set up (the command never ran) (503).
    ExecUnavailable,
    /// The server already runs as many commands as it takes; the command did not start
    /// (429).
    TooManyCommands,
}

impl Code {
    /// Every code, in the order of the OpenAPI document's enum.
    pub const ALL: [Code; 25] = [
        Code::BadRequest,
        Code::BadPath,
        Code::OutsideDesk,
        Code::NameTooLong,
        Code::PathTooLong,
        Code::NotFound,
        Code::Exists,
        Code::IsDir,
        Code::NotDir,
        Code::NotEmpty,
        Code::Conflict,
        Code::EtagMismatch,
        Code::RangeNotSatisfiable,
        Code::Unauthorized,
        Code::TokenExpired,
        Code::TokenRevoked,
        Code::TokenScope,
        Code::ReadOnlyToken,
        Code::ReadOnlyPath,
        Code::UnknownDesk,
        Code::MethodNotAllowed,
        Code::TooLarge,
        Code::Io,
        Code::ExecUnavailable,
        Code::TooManyCommands,
    ];

    /// The code as sent (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            Code::BadRequest => "bad_request",
            Code::BadPath => "bad_path",
            Code::OutsideDesk => "outside_desk",
            Code::NameTooLong => "name_too_long",
            Code::PathTooLong => "path_too_long",
            Code::NotFound => "not_found",
            Code::Exists => "exists",
            Code::IsDir => "is_dir",
            Code::NotDir => "not_dir",
            Code::NotEmpty => "not_empty",
            Code::Conflict => "conflict",
            Code::EtagMismatch => "etag_mismatch",
            Code::RangeNotSatisfiable => "range_not_satisfiable",
            Code::Unauthorized => "unauthorized",
            Code::TokenExpired => "token_expired",
            Code::TokenRevoked => "token_revoked",
            Code::TokenScope => "token_scope",
            Code::ReadOnlyToken => "read_only_token",
            Code::ReadOnlyPath => "read_only_path",
            Code::UnknownDesk => "unknown_desk",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::TooLarge => "too_large",
            Code::Io => "io",
            Code::ExecUnavailable => "exec_unavailable",
            Code::TooManyCommands => "too_many_commands",
        }
    }

    /// The HTTP status of the code.
    pub fn status(self) -> u16 {
        match self {
            Code::BadRequest | Code::BadPath | Code::NameTooLong | Code::PathTooLong => 400,
            Code::Unauthorized | Code::TokenExpired | Code::TokenRevoked => 401,
            Code::OutsideDesk | Code::TokenScope | Code::ReadOnlyToken | Code::ReadOnlyPath => 403,
            Code::NotFound | Code::UnknownDesk => 404,
            Code::Exists | Code::IsDir | Code::NotDir | Code::NotEmpty | Code::Conflict => 409,
            Code::EtagMismatch => 412,
            Code::RangeNotSatisfiable => 416,
            Code::MethodNotAllowed => 405,
            Code::TooLarge => 413,
            Code::Io => 500,
            Code::ExecUnavailable => 503,
            Code::TooManyCommands => 429,
        }
    }
}

/// An error of a desk operation: its code and one line for a person.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ServeError {
    /// Stable code.
    pub code: Code,
    /// One line naming the problem and the fix.
    pub message: String,
}

impl ServeError {
    /// An error of code `code`.
    pub fn new(code: Code, message: impl Into<String>) -> ServeError {
        ServeError {
            code,
            message: message.into(),
        }
    }

    /// A file-system error on `path` (desk-relative, for the message) while `doing`,
    /// mapped to its code by errno: `ENOENT` not_found, `EEXIST` exists, `EISDIR` is_dir,
    /// `ENOTDIR` not_dir, `ENOTEMPTY` not_empty, `EXDEV`/`ELOOP` from a confined
    /// resolution outside_desk, `ENAMETOOLONG` name_too_long; anything else io.
    pub fn io(doing: &str, path: &str, e: io::Error) -> ServeError {
        let shown = if path.is_empty() { "/" } else { path };
        let (code, what) = match e.raw_os_error() {
            Some(libc::ENOENT) => (Code::NotFound, "no such file or directory".to_owned()),
            Some(libc::EEXIST) => (Code::Exists, "it already exists".to_owned()),
            Some(libc::EISDIR) => (Code::IsDir, "it is a directory".to_owned()),
            Some(libc::ENOTDIR) => (Code::NotDir, "a component is not a directory".to_owned()),
            Some(libc::ENOTEMPTY) => (Code::NotEmpty, "the directory is not empty".to_owned()),
            Some(libc::EXDEV) | Some(libc::ELOOP) => (
                Code::OutsideDesk,
                "it resolves outside the desk (a symlink pointing out, or a loop)".to_owned(),
            ),
            Some(libc::ENAMETOOLONG) => (Code::NameTooLong, "a name is too long".to_owned()),
            _ => (Code::Io, e.to_string()),
        };
        ServeError::new(code, format!("cannot {doing} {shown}: {what}"))
    }
}

/// Result alias of the crate.
pub type Result<T, E = ServeError> = std::result::Result<T, E>;
