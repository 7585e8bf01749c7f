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
    #[error("access denied by the bucket ({0}); check the credentials (s3://: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; az://: AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY)")]
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
                // Named like any server answer ("the server answered 403
                // AuthorizationFailure (…) to PUT …") when the text has one.
                let text = full_chain(source.as_ref());
                match ServerAnswer::parse(&text) {
                    Some(a) => a.into_error(),
                    None => BucketError::Auth(first_line(&source.to_string())),
                }
            }
            other => {
                let text = full_chain(&other);
                if let Some(a) = ServerAnswer::parse(&text) {
                    return a.into_error();
                }
                let lower = text.to_ascii_lowercase();
                if lower.contains("connect")
                    || lower.contains("dns")
                    || lower.contains("timed out")
                    || lower.replace("retry_timeout", "").contains("timeout")
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

/// An HTTP answer the server gave, as `object_store` reports it ("Error performing PUT
/// URL in 12ms, after 2 retries, … - Server returned non-2xx status code: 503 Service
/// Unavailable: <Error><Code>SlowDown</Code><Message>…</Message></Error>").
#[derive(Debug, PartialEq, Eq)]
struct ServerAnswer {
    /// HTTP status.
    status: u16,
    /// The S3 error code (`SlowDown`, `InternalError`, `AccessDenied`, …), if the body
    /// had one.
    code: Option<String>,
    /// The S3 error message, if any.
    message: Option<String>,
    /// "PUT http://…/key", if the text named the request.
    request: Option<String>,
    /// "after 2 retries", if retried.
    retries: Option<String>,
}

/// The HTTP status a server answered with, as object_store's error text `text` names it
/// ("… non-2xx status code: 503 …"); `None` when no server answered.
pub(crate) fn answer_status(text: &str) -> Option<u16> {
    ServerAnswer::parse(text).map(|a| a.status)
}

impl ServerAnswer {
    fn parse(text: &str) -> Option<ServerAnswer> {
        const MARK: &str = "non-2xx status code: ";
        let at = text.find(MARK)? + MARK.len();
        let rest = &text[at..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let status = digits.parse().ok()?;
        let between = |open: &str, close: &str| {
            let i = rest.find(open)? + open.len();
            let j = rest[i..].find(close)?;
            Some(rest[i..i + j].trim().to_string()).filter(|s| !s.is_empty())
        };
        let request = text.rfind("Error performing ").and_then(|i| {
            let r = &text[i + "Error performing ".len()..];
            r.split(" in ").next().map(|s| s.trim().to_string())
        });
        let retries = text.find("after ").and_then(|i| {
            let r = &text[i..];
            let end = r
                .find(" retries")
                .map(|j| j + " retries".len())
                .or_else(|| r.find(" retry").map(|j| j + " retry".len()))?;
            Some(r[..end].to_string()).filter(|s| s.len() < 24)
        });
        Some(ServerAnswer {
            status,
            code: between("<Code>", "</Code>"),
            // (Azure's message goes on with "\nRequestId:…\nTime:…" lines.)
            message: between("<Message>", "</Message>")
                .and_then(|m| m.lines().next().map(|l| l.trim().to_string())),
            request,
            retries,
        })
    }

    /// "the server answered 503 SlowDown (Please reduce your request rate.) to PUT
    /// http://…/key, after 2 retries"; 401/403 are [`BucketError::Auth`], a missing bucket
    /// [`BucketError::Config`], the rest [`BucketError::Other`] (retried).
    fn into_error(self) -> BucketError {
        let mut s = format!("the server answered {}", self.status);
        if let Some(c) = &self.code {
            s.push_str(&format!(" {c}"));
        }
        if let Some(m) = &self.message {
            s.push_str(&format!(" ({m})"));
        }
        if let Some(r) = &self.request {
            s.push_str(&format!(" to {r}"));
        }
        if let Some(r) = &self.retries {
            s.push_str(&format!(", {r}"));
        }
        let s = first_line(&s);
        match (self.status, self.code.as_deref()) {
            (401 | 403, _) => BucketError::Auth(s),
            (_, Some("NoSuchBucket")) => BucketError::Config(format!(
                "bucket does not exist ({s}); create it first or fix the URL"
            )),
            _ => BucketError::Other(s),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    const SLOWDOWN: &str = "Generic S3 error: Error performing PUT http://127.0.0.1:3900/b/p/small/s030.dat in 279.12ms, after 2 retries, max_retries: 2, retry_timeout: 15s  - Server returned non-2xx status code: 503 Service Unavailable: <?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

    #[test]
    fn a_server_answer_is_named_with_its_status_and_s3_code_not_taken_for_unreachable() {
        let a = ServerAnswer::parse(SLOWDOWN).expect("parsed");
        assert_eq!(a.status, 503);
        assert_eq!(a.code.as_deref(), Some("SlowDown"));
        let e = a.into_error();
        assert!(matches!(e, BucketError::Other(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "bucket error: the server answered 503 SlowDown (Please reduce your request rate.) to PUT http://127.0.0.1:3900/b/p/small/s030.dat, after 2 retries"
        );
    }

    /// Azure's error message goes on with RequestId/Time lines: the answer keeps its
    /// first line and still names the request (it was cut at the newline before).
    #[test]
    fn an_azure_answer_is_named_on_one_line_with_its_request() {
        let bad = "Error performing PUT http://127.0.0.1:10000/acct/c/p/a.txt in 3ms - Server returned non-2xx status code: 400 Bad Request: <?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<Error>\n  <Code>InvalidMetadata</Code>\n  <Message>The metadata specified is invalid. It has characters that are not permitted.\nRequestId:5c62f007\nTime:2026-12-05T18:27:58.683Z</Message>\n</Error>";
        let e = ServerAnswer::parse(bad).expect("parsed").into_error();
        assert_eq!(
            e.to_string(),
            "bucket error: the server answered 400 InvalidMetadata (The metadata specified is invalid. It has characters that are not permitted.) to PUT http://127.0.0.1:10000/acct/c/p/a.txt"
        );
    }

    #[test]
    fn statuses_decide_the_kind_and_durations_are_not_statuses() {
        let denied = "Error performing GET http://h/b in 401.2ms - Server returned non-2xx status code: 403 Forbidden: <Error><Code>AccessDenied</Code></Error>";
        assert!(matches!(
            ServerAnswer::parse(denied).map(ServerAnswer::into_error),
            Some(BucketError::Auth(_))
        ));
        // "in 401.2ms" is a duration: a 500 stays a server error.
        let internal = "Error performing GET http://h/b in 401.2ms - Server returned non-2xx status code: 500 Internal Server Error: ";
        assert!(matches!(
            ServerAnswer::parse(internal).map(ServerAnswer::into_error),
            Some(BucketError::Other(_))
        ));
        let nobucket = "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code></Error>";
        assert!(matches!(
            ServerAnswer::parse(nobucket).map(ServerAnswer::into_error),
            Some(BucketError::Config(_))
        ));
        assert!(ServerAnswer::parse("error sending request: connection refused").is_none());
    }
}
