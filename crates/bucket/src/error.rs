//! Errors of the bucket layer.

/// A bucket operation failed. The VFS maps `NotFound` to `ENOENT` on reads of a vanished
/// object and everything else to `EIO`; the uploader retries all but `Config`.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The bucket URL or options cannot work (unknown scheme, missing bucket name, ...).
    #[error("{0}")]
    Config(String),
    /// The object does not exist (S3 404 / NoSuchKey).
    #[error("object not found: {0}")]
    NotFound(String),
    /// A conditional request failed: the object changed (S3 412 PreconditionFailed).
    #[error("object changed in the bucket: {0}")]
    Changed(String),
    /// Credentials were refused (S3 401/403).
    #[error("access denied by the bucket ({0}); check the access key and secret (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")]
    Auth(String),
    /// The endpoint could not be reached (connection refused, DNS, timeout).
    #[error("bucket unreachable ({0}); check the endpoint URL and that the server is up")]
    Unreachable(String),
    /// Local file I/O around a transfer.
    #[error("local I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Any other failure reported by the store.
    #[error("bucket error: {0}")]
    Other(String),
}

impl BucketError {
    /// Classifies an `object_store` error.
    pub fn from_store(e: object_store::Error) -> BucketError {
        use object_store::Error as E;
        match e {
            E::NotFound { path, .. } => BucketError::NotFound(path),
            E::Precondition { path, .. } => BucketError::Changed(path),
            E::Unauthenticated { source, .. } | E::PermissionDenied { source, .. } => {
                BucketError::Auth(first_line(&source.to_string()))
            }
            other => {
                let text = full_chain(&other);
                let lower = text.to_ascii_lowercase();
                if lower.contains("connect")
                    || lower.contains("dns")
                    || lower.contains("timed out")
                    || lower.contains("timeout")
                {
                    BucketError::Unreachable(first_line(&text))
                } else if lower.contains("403")
                    || lower.contains("forbidden")
                    || lower.contains("accessdenied")
                    || lower.contains("invalidaccesskeyid")
                    || lower.contains("signaturedoesnotmatch")
                    || lower.contains("401")
                {
                    BucketError::Auth(first_line(&text))
                } else if lower.contains("nosuchbucket") {
                    BucketError::Config(format!(
                        "bucket does not exist ({}); create it first or fix the URL",
                        first_line(&text)
                    ))
                } else {
                    BucketError::Other(first_line(&text))
                }
            }
        }
    }

    /// Whether retrying later may succeed (network, server errors); `false` for
    /// configuration problems.
    pub fn is_transient(&self) -> bool {
        !matches!(self, BucketError::Config(_))
    }
}

fn full_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("").trim();
    if line.len() > 300 {
        let mut end = 300;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &line[..end])
    } else {
        line.to_string()
    }
}
