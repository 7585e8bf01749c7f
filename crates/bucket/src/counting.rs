//! Requests to the object store counted by kind and answer: an `ObjectStore` that passes
//! every call to the store it wraps and counts it when it completes (`put`, `put_multipart`
//! (the upload's start; its parts are not counted), `get`, `head`, `list`, `delete`,
//! `copy`), by the answer's HTTP status where one is known (`200` for success, `404`,
//! `304`, `409`, `412`, the status a server error names) or `error` (no answer: a
//! connection failure, a timeout). One call is one count: the HTTP client's own retries
//! inside it are not counted apart. Read by `deskfs status` and the metrics endpoint.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// Counts by `(kind, status)`; shared by clones of a bucket.
#[derive(Default, Debug)]
pub struct RequestCounters(Mutex<BTreeMap<(&'static str, String), u64>>);

/// One row of [`RequestCounters::snapshot`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RequestCount {
    /// `put`, `put_multipart`, `get`, `head`, `list`, `delete` or `copy`.
    pub kind: &'static str,
    /// `200`, `404`, `412`, `503`, …, or `error` (no answer).
    pub status: String,
    /// Requests so far.
    pub count: u64,
}

impl RequestCounters {
    fn count<T>(&self, kind: &'static str, r: &Result<T>) {
        let status = match r {
            Ok(_) => "200".to_string(),
            Err(e) => status_of(e),
        };
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((kind, status)).or_default() += 1;
    }

    /// Every `(kind, status)` seen, with its count, sorted.
    pub fn snapshot(&self) -> Vec<RequestCount> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((kind, status), &count)| RequestCount {
                kind,
                status: status.clone(),
                count,
            })
            .collect()
    }
}

/// The HTTP status an error stands for: object_store's kinds for the ones it names, the
/// status in a server's answer for the rest (see `error`), `error` when no server
/// answered.
fn status_of(e: &object_store::Error) -> String {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => "404".into(),
        E::NotModified { .. } => "304".into(),
        E::AlreadyExists { .. } => "409".into(),
        E::Precondition { .. } => "412".into(),
        _ => crate::error::answer_status(&e.to_string())
            .map(|s| s.to_string())
            .unwrap_or_else(|| "error".into()),
    }
}

/// An `ObjectStore` whose calls are counted in a [`RequestCounters`].
#[derive(Debug)]
pub(crate) struct Counting {
    inner: Arc<dyn ObjectStore>,
    counters: Arc<RequestCounters>,
}

impl Counting {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, counters: Arc<RequestCounters>) -> Counting {
        Counting { inner, counters }
    }
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Counting {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let r = self.inner.put_opts(location, payload, opts).await;
        self.counters.count("put", &r);
        r
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let r = self.inner.put_multipart_opts(location, opts).await;
        self.counters.count("put_multipart", &r);
        r
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let kind = if options.head { "head" } else { "get" };
        let r = self.inner.get_opts(location, options).await;
        self.counters.count(kind, &r);
        r
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let r = self.inner.get_ranges(location, ranges).await;
        self.counters.count("get", &r);
        r
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let counters = self.counters.clone();
        self.inner
            .delete_stream(locations)
            .inspect(move |r| counters.count("delete", r))
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        // One count per listing, at its first answer (an entry, an error, or its end):
        // a caller may read only the first page.
        use std::sync::atomic::{AtomicBool, Ordering};
        let counted = Arc::new(AtomicBool::new(false));
        let (c1, c2) = (self.counters.clone(), self.counters.clone());
        let (k1, k2) = (counted.clone(), counted);
        self.inner
            .list(prefix)
            .inspect(move |r| {
                if !k1.swap(true, Ordering::Relaxed) {
                    c1.count("list", r);
                }
            })
            .chain(
                futures::stream::once(async move {
                    if !k2.swap(true, Ordering::Relaxed) {
                        c2.count("list", &Ok(()));
                    }
                })
                .filter_map(|()| async { None }),
            )
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let r = self.inner.list_with_delimiter(prefix).await;
        self.counters.count("list", &r);
        r
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let r = self.inner.copy_opts(from, to, options).await;
        self.counters.count("copy", &r);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt as _;

    #[tokio::test]
    async fn calls_are_counted_by_kind_and_answer() {
        let counters = Arc::new(RequestCounters::default());
        let s = Counting::new(Arc::new(InMemory::new()), counters.clone());
        let p = Path::from("a/b");
        s.put(&p, PutPayload::from_static(b"x")).await.unwrap();
        s.get(&p).await.unwrap().bytes().await.unwrap();
        s.head(&p).await.unwrap();
        assert!(s.head(&Path::from("nope")).await.is_err());
        let first = s.list(None).next().await;
        assert!(first.is_some_and(|r| r.is_ok()));
        s.list_with_delimiter(Some(&Path::from("a"))).await.unwrap();
        s.copy(&p, &Path::from("a/c")).await.unwrap();
        s.delete(&p).await.unwrap();
        let got: Vec<(&str, String, u64)> = counters
            .snapshot()
            .into_iter()
            .map(|c| (c.kind, c.status, c.count))
            .collect();
        let want = [
            ("copy", "200", 1),
            ("delete", "200", 1),
            ("get", "200", 1),
            ("head", "200", 1),
            ("head", "404", 1),
            ("list", "200", 2),
            ("put", "200", 1),
        ];
        assert_eq!(
            got,
            want.iter()
                .map(|(k, s, n)| (*k, s.to_string(), *n))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_server_answer_gives_its_status_and_no_answer_is_an_error() {
        let e = object_store::Error::Generic {
            store: "S3",
            source: "Error performing PUT http://h/b/k in 1s, after 2 retries: Server returned non-2xx status code: 503 Service Unavailable: <Code>SlowDown</Code>".into(),
        };
        assert_eq!(status_of(&e), "503");
        let e = object_store::Error::Generic {
            store: "S3",
            source: "error sending request: connection refused".into(),
        };
        assert_eq!(status_of(&e), "error");
    }
}
