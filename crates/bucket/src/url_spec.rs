//! Parsing of bucket URLs: `s3://bucket/prefix`, `gs://bucket/prefix`,
//! `az://container/prefix`, `file:///absolute/dir`.

use crate::{BucketError, Result};

/// Which object store a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Amazon S3 and S3-compatible servers (MinIO, Garage, R2, ...).
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage.
    Azure,
    /// A local directory (the embedded default).
    Local,
}

/// A parsed bucket location plus connection options.
///
/// Credentials and endpoint default to the standard environment variables of each cloud
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
/// `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...); fields set here win.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BucketSpec {
    /// The URL as given (normalised: no trailing `/`).
    pub url: String,
    /// Store kind; `None` only in `Default`.
    pub scheme: Option<Scheme>,
    /// Bucket/container name; for `file://`, the absolute directory.
    pub bucket: String,
    /// Key prefix inside the bucket, without leading or trailing `/` (may be empty).
    pub prefix: String,
    /// S3 endpoint URL, e.g. `http://127.0.0.1:3900` (path-style requests are used).
    pub endpoint: Option<String>,
    /// S3 region.
    pub region: Option<String>,
    /// Access key id.
    pub access_key: Option<String>,
    /// Secret access key.
    pub secret_key: Option<String>,
}

impl BucketSpec {
    /// Parses a bucket URL. Errors: [`BucketError::Config`] with the accepted forms.
    pub fn parse(url: &str) -> Result<BucketSpec> {
        let bad = |why: &str| {
            BucketError::Config(format!(
                "bad bucket URL {url:?}: {why}; use s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX], az://CONTAINER[/PREFIX] or file:///ABSOLUTE/DIR"
            ))
        };
        let (scheme_s, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let scheme = match scheme_s.to_ascii_lowercase().as_str() {
            "s3" | "s3a" => Scheme::S3,
            "gs" | "gcs" => Scheme::Gcs,
            "az" | "azure" | "abfs" => Scheme::Azure,
            "file" => Scheme::Local,
            other => return Err(bad(&format!("unknown scheme {other:?}"))),
        };
        if scheme == Scheme::Local {
            if !rest.starts_with('/') {
                return Err(bad("a file:// URL needs an absolute path (file:///dir)"));
            }
            let dir = rest.trim_end_matches('/');
            if dir.is_empty() {
                return Err(bad(
                    "the file system root cannot be a bucket directory (objects would be written at the machine's own paths); give a directory of its own, e.g. file:///srv/deskfs-bucket",
                ));
            }
            if dir[1..]
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
            {
                return Err(bad(
                    "the directory has an empty, '.' or '..' segment; give its plain absolute path",
                ));
            }
            return Ok(BucketSpec {
                url: format!("file://{dir}"),
                scheme: Some(scheme),
                bucket: dir.to_string(),
                ..Default::default()
            });
        }
        let rest = rest.trim_end_matches('/');
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("missing bucket name"));
        }
        if bucket.contains(|c: char| c.is_whitespace() || c == '?' || c == '#') {
            return Err(bad("invalid bucket name"));
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
            && !prefix.is_empty()
        {
            return Err(bad("prefix has an empty, '.' or '..' segment"));
        }
        Ok(BucketSpec {
            url: format!("{scheme_s}://{rest}"),
            scheme: Some(scheme),
            bucket: bucket.to_string(),
            prefix,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_forms() {
        let s = BucketSpec::parse("s3://b/p/q/").unwrap();
        assert_eq!((s.bucket.as_str(), s.prefix.as_str()), ("b", "p/q"));
        assert_eq!(s.scheme, Some(Scheme::S3));
        let l = BucketSpec::parse("file:///tmp/x/").unwrap();
        assert_eq!(l.bucket, "/tmp/x");
        assert!(BucketSpec::parse("ftp://x").is_err());
        assert!(BucketSpec::parse("file://relative").is_err());
        // The root, or a path that may resolve to it: objects would land on the
        // machine's own files (a workspace file `etc/passwd` at /etc/passwd).
        for root in [
            "file:///",
            "file:////",
            "file:///tmp/..",
            "file:///tmp/x/../..",
            "file:////tmp",
            "file:///./tmp",
        ] {
            let e = BucketSpec::parse(root).expect_err(root).to_string();
            assert!(e.contains(root), "{root}: the error names the URL: {e}");
        }
        assert!(BucketSpec::parse("s3://").is_err());
        assert!(BucketSpec::parse("s3://b/a//c").is_err());
        assert!(BucketSpec::parse("just-a-name").is_err());
    }
}
