//! The HTTP client of the object stores: plain-`http://` endpoints go through a hyper
//! client whose TCP connections leave Linux's "interactive" delayed-ACK mode after every
//! request they send; everything else (HTTPS, proxies) goes through `object_store`'s
//! default reqwest client.
//!
//! Why: a keep-alive connection that sends a request soon after reading the previous
//! response is in the kernel's ping-pong (interactive) mode, where the ACK of a small
//! incoming segment is delayed up to 40 ms, hoping to ride on the next request. A server
//! that writes the response headers and the body separately with Nagle's algorithm on (Garage
//! does, for objects it stores as blocks) holds the body back until the headers are
//! acknowledged, so a small GET on a reused connection took ~42 ms instead of ~1 ms: the
//! cold read of a 4 KiB file waited 40 ms for nothing. `TCP_QUICKACK` right after each
//! request is written takes the socket out of ping-pong mode: the headers are acknowledged
//! as soon as they are read, the server sends the body at once. The option is not sticky
//! (the next request re-enters the mode), so it is set after every write; one
//! `setsockopt` per request.
//!
//! `DESKFS_HTTP_CLIENT=reqwest` in the daemon's environment sends everything through
//! reqwest (as before this client existed).

use std::error::Error as StdError;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, USER_AGENT};
use http_body::{Body, Frame, SizeHint};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use object_store::client::{
    HttpClient, HttpConnector as StoreConnector, HttpError, HttpErrorKind, HttpRequest,
    HttpRequestBody, HttpResponse, HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;
use tokio::net::TcpStream;

/// How long an idle pooled connection is kept (reqwest's default).
const POOL_IDLE: Duration = Duration::from_secs(90);

/// TCP keep-alive probes on pooled connections.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Builds the store's [`HttpClient`] (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct Connector {
    /// Longest time a request may take, from sending it to the end of the response body.
    pub timeout: Duration,
    /// Longest time a TCP connect may take.
    pub connect_timeout: Duration,
}

impl StoreConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let fallback = ReqwestConnector::default().connect(options)?;
        // reqwest honours the proxy variables; this client does not. DESKFS_HTTP_CLIENT=reqwest
        // turns this client off (a way out, and the comparison).
        let off = std::env::var("DESKFS_HTTP_CLIENT").is_ok_and(|v| v == "reqwest");
        if off || proxy_configured(|k| std::env::var_os(k)) {
            return Ok(fallback);
        }
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(self.connect_timeout));
        tcp.set_keepalive(Some(TCP_KEEPALIVE));
        tcp.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(QuickAckConnector(tcp));
        Ok(HttpClient::new(Service {
            plain: client,
            fallback,
            timeout: self.timeout,
        }))
    }
}

/// Whether a proxy environment variable that reqwest would use for `http://` is set.
fn proxy_configured(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
        .iter()
        .any(|k| var(k).is_some_and(|v| !v.is_empty()))
}

#[derive(Debug)]
struct Service {
    plain: Client<QuickAckConnector, HttpRequestBody>,
    fallback: HttpClient,
    timeout: Duration,
}

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        if req.uri().scheme_str() != Some("http") {
            return self.fallback.execute(req).await;
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut req = req;
        let h = req.headers_mut();
        if !h.contains_key(USER_AGENT) {
            h.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        }
        if !h.contains_key(ACCEPT) {
            h.insert(ACCEPT, HeaderValue::from_static("*/*"));
        }
        let resp = match tokio::time::timeout_at(deadline, self.plain.request(req)).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(e)) => return Err(classify(Box::new(e))),
            Ok(Ok(r)) => r,
        };
        let (parts, body) = resp.into_parts();
        let body = DeadlineBody {
            inner: body,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
        };
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

const USER_AGENT_VALUE: &str = concat!("deskfs/", env!("CARGO_PKG_VERSION"));

fn timed_out() -> HttpError {
    HttpError::new(
        HttpErrorKind::Timeout,
        std::io::Error::new(std::io::ErrorKind::TimedOut, "HTTP request timed out"),
    )
}

/// Maps a client error to the kind `object_store`'s retry logic reads (the same rules it
/// applies to reqwest's errors).
fn classify(e: Box<dyn StdError + Send + Sync>) -> HttpError {
    let mut kind = HttpErrorKind::Unknown;
    if let Some(le) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
        if le.is_connect() {
            kind = HttpErrorKind::Connect;
        }
    }
    let mut source: Option<&(dyn StdError + 'static)> = Some(e.as_ref());
    while kind == HttpErrorKind::Unknown {
        let Some(s) = source else { break };
        if let Some(he) = s.downcast_ref::<hyper::Error>() {
            if he.is_closed() || he.is_incomplete_message() || he.is_body_write_aborted() {
                kind = HttpErrorKind::Request;
            } else if he.is_timeout() {
                kind = HttpErrorKind::Timeout;
            }
        }
        if let Some(ie) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            match ie.kind() {
                K::TimedOut => kind = HttpErrorKind::Timeout,
                K::ConnectionAborted | K::ConnectionReset | K::BrokenPipe | K::UnexpectedEof => {
                    kind = HttpErrorKind::Interrupted
                }
                _ => {}
            }
        }
        source = s.source();
    }
    HttpError::new_boxed(kind, e)
}

/// A response body that fails with a timeout once the request's deadline passes.
struct DeadlineBody {
    inner: hyper::body::Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(classify(Box::new(e))))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(timed_out()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Connects like [`HttpConnector`]; the stream sets `TCP_QUICKACK` after every write.
#[derive(Clone, Debug)]
struct QuickAckConnector(HttpConnector);

impl tower_service::Service<Uri> for QuickAckConnector {
    type Response = QuickAck;
    type Error = Box<dyn StdError + Send + Sync>;
    type Future =
        Pin<Box<dyn Future<Output = Result<QuickAck, Box<dyn StdError + Send + Sync>>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let fut = self.0.call(dst);
        Box::pin(async move {
            let io = fut.await?;
            Ok(QuickAck { io })
        })
    }
}

/// A TCP connection that leaves delayed-ACK ping-pong mode after each write.
#[derive(Debug)]
struct QuickAck {
    io: TokioIo<TcpStream>,
}

impl QuickAck {
    fn quickack(&self) {
        let one: libc::c_int = 1;
        // SAFETY: setsockopt on the stream's own open socket, with a pointer to a live
        // c_int and its size. A failure (not TCP, old kernel) only loses the speed-up.
        unsafe {
            libc::setsockopt(
                self.io.inner().as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

impl Read for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.quickack();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.quickack();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Connection for QuickAck {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::net::TcpListener;
    use std::time::Instant;

    /// A keep-alive HTTP/1.1 server on 127.0.0.1 that answers every request with the
    /// headers and then the body in two writes, Nagle's algorithm on (as Garage does for
    /// objects stored as blocks). `stall` = never answer. Returns its URL.
    fn server(body: &'static [u8], stall: bool) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        buf.drain(..end);
                        if stall {
                            std::thread::sleep(Duration::from_secs(30));
                            return;
                        }
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/octet-stream\r\n\r\n",
                            body.len()
                        );
                        if s.write_all(head.as_bytes()).is_err() || s.write_all(body).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    fn client(timeout: Duration) -> HttpClient {
        let c = Connector {
            timeout,
            connect_timeout: Duration::from_secs(5),
        };
        c.connect(&ClientOptions::new().with_allow_http(true))
            .unwrap()
    }

    async fn get(c: &HttpClient, url: &str) -> Result<Bytes, HttpError> {
        let req = http::Request::builder()
            .uri(url)
            .body(HttpRequestBody::empty())
            .unwrap();
        c.execute(req).await?.into_body().bytes().await
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn small_responses_on_a_reused_connection_do_not_wait_for_a_delayed_ack() {
        if std::env::var("DESKFS_HTTP_CLIENT").is_ok() || proxy_configured(|k| std::env::var_os(k))
        {
            return; // this client is off in this environment
        }
        static BODY: [u8; 4096] = [7u8; 4096];
        let url = server(&BODY, false);
        let rt = rt();
        let c = client(Duration::from_secs(30));
        rt.block_on(async {
            // Warm the connection, then time back-to-back requests on it: with a delayed
            // ACK each one would take >= 40 ms (the server's body waits for the ACK).
            assert_eq!(get(&c, &url).await.unwrap().len(), 4096);
            let t = Instant::now();
            for _ in 0..10 {
                assert_eq!(&get(&c, &url).await.unwrap()[..], &BODY[..]);
            }
            let took = t.elapsed();
            assert!(took < Duration::from_millis(300), "10 GETs took {took:?}");
        });
    }

    #[test]
    fn a_server_that_does_not_answer_times_out() {
        if std::env::var("DESKFS_HTTP_CLIENT").is_ok() || proxy_configured(|k| std::env::var_os(k))
        {
            return;
        }
        let url = server(b"", true);
        let rt = rt();
        let c = client(Duration::from_millis(300));
        let t = Instant::now();
        let e = rt.block_on(get(&c, &url)).unwrap_err();
        assert_eq!(e.kind(), HttpErrorKind::Timeout, "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_refused_connection_is_a_connect_error() {
        if std::env::var("DESKFS_HTTP_CLIENT").is_ok() || proxy_configured(|k| std::env::var_os(k))
        {
            return;
        }
        // A port nobody listens on: bind, note it, close.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let rt = rt();
        let c = client(Duration::from_secs(5));
        let e = rt
            .block_on(get(&c, &format!("http://127.0.0.1:{port}/x")))
            .unwrap_err();
        assert_eq!(e.kind(), HttpErrorKind::Connect, "{e}");
    }

    #[test]
    fn proxy_variables_send_requests_through_reqwest() {
        let none = |_: &str| None;
        assert!(!proxy_configured(none));
        let empty = |_: &str| Some(std::ffi::OsString::new());
        assert!(!proxy_configured(empty));
        let set = |k: &str| (k == "HTTP_PROXY").then(|| "http://proxy:3128".into());
        assert!(proxy_configured(set));
    }
}
