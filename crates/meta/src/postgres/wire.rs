//! Pooled connections driven by the thread that uses them, as libpq does.
//!
//! A tokio-postgres connection is two halves: the `Client` that queues requests and the
//! `Connection` future that writes them to the socket and routes the answers back. Run
//! as a task on a runtime, every round trip crosses threads twice (the caller wakes the
//! runtime's worker to write; the worker, woken by the answer, wakes the caller). On this
//! two-core VM each such wake-up is an inter-processor interrupt and a VM exit: the
//! runtime's threads took 39 % of a mount's CPU on the two-host pip case (`perf`, design
//! 0021). Here the caller polls both halves itself and sleeps in `poll(2)` on the socket,
//! so an answer wakes exactly the thread waiting for it.
//!
//! The socket is non-blocking and registered with no reactor: a read or write that would
//! block returns `Pending` and records what the driver should wait for. A connection is
//! only ever polled by the thread holding its lease, so nothing else needs waking.
//! Time bounds are the driver's deadline (no tokio timer is involved).

use std::future::Future;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::Host;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{Client, Connection, NoTls};

use super::config::{connect_error, ConnSpec};
use crate::{MetaError, Result};

/// A connected, non-blocking socket to the server (TCP or a Unix-domain socket).
pub(super) struct Socket {
    stream: Stream,
    /// Set when a write would block: the driver then waits for `POLLOUT` too.
    want_write: Arc<AtomicBool>,
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

fn would_block<T>(r: std::io::Result<T>) -> Poll<std::io::Result<T>> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Poll::Pending,
        other => Poll::Ready(other),
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let dst = buf.initialize_unfilled();
        let r = match &mut this.stream {
            Stream::Tcp(s) => s.read(dst),
            Stream::Unix(s) => s.read(dst),
        };
        match would_block(r) {
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
                // Try again at the driver's next turn (it loops without waiting on a wake).
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.stream {
            Stream::Tcp(s) => s.write(data),
            Stream::Unix(s) => s.write(data),
        };
        match would_block(r) {
            Poll::Pending => {
                this.want_write.store(true, Ordering::Relaxed);
                Poll::Pending
            }
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            ready => ready,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = match &self.stream {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        };
        Poll::Ready(r.or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotConnected {
                Ok(())
            } else {
                Err(e)
            }
        }))
    }
}

/// The connection half of one pooled connection, polled by its lease holder.
pub(super) struct Io {
    conn: Pin<Box<Connection<Socket, NoTlsStream>>>,
    fd: RawFd,
    want_write: Arc<AtomicBool>,
    /// The connection future ended (server closed it, I/O error, or after Terminate).
    ended: bool,
    /// Send what is queued (a Terminate, after the client went) before closing.
    pub(super) polite: bool,
}

/// A waker for the driver's own thread: it only notes that something became ready, so
/// the driver polls again before waiting on the socket.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// The driver ran out of time (the deadline passed) or the connection ended while the
/// call still waited for its answer.
#[derive(Debug)]
pub(super) enum Stalled {
    TimedOut,
    Ended,
}

impl Io {
    /// Polls the connection once without waiting: takes in whatever the server sent
    /// while the connection sat idle (notices, or its end: a restarted server, a
    /// terminated backend). Returns whether the connection is still usable.
    pub(super) fn pump(&mut self) -> bool {
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag);
        let mut cx = Context::from_waker(&waker);
        self.poll_conn(&mut cx);
        !self.ended
    }

    fn poll_conn(&mut self, cx: &mut Context<'_>) {
        if self.ended {
            return;
        }
        if let Poll::Ready(r) = self.conn.as_mut().poll(cx) {
            if let Err(e) = r {
                tracing::debug!(error = %e, "postgres connection ended");
            }
            self.ended = true;
        }
    }

    /// Runs `fut` (which uses this connection's client) to completion on the calling
    /// thread, polling the connection alongside and sleeping in `poll(2)` on the socket
    /// in between, until `deadline`. Errors: [`Stalled`].
    pub(super) fn drive<F: Future>(
        &mut self,
        deadline: Instant,
        fut: F,
    ) -> std::result::Result<F::Output, Stalled> {
        let mut fut = pin!(fut);
        let mut ended_polls = 0;
        let (fd, want_write) = (self.fd, self.want_write.clone());
        run_on_fd(fd, &want_write, deadline, |cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Step::Done(Ok(v));
            }
            self.poll_conn(cx);
            if self.ended {
                // The client's calls fail once the connection went: give them a turn
                // to say so; a call that still waits would wait for nothing.
                ended_polls += 1;
                if ended_polls > 2 {
                    return Step::Done(Err(Stalled::Ended));
                }
                return Step::Again;
            }
            Step::Wait
        })?
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        // The client was dropped just before (it is declared first in `Conn`) and
        // queued its Terminate: one poll writes it.
        if self.polite {
            self.pump();
        }
    }
}

/// What one turn of [`run_on_fd`]'s loop found.
enum Step<T> {
    /// Finished with this.
    Done(T),
    /// Poll again at once.
    Again,
    /// Nothing ready: sleep on the socket (unless a wake-up came during the turn).
    Wait,
}

/// Calls `turn` until it is done, with a waker that only notes a wake-up (a turn that
/// woke something is followed by another at once) and sleeping on `fd` in between, until
/// `deadline` (`Stalled::TimedOut`).
fn run_on_fd<T>(
    fd: RawFd,
    want_write: &AtomicBool,
    deadline: Instant,
    mut turn: impl FnMut(&mut Context<'_>) -> Step<T>,
) -> std::result::Result<T, Stalled> {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        flag.0.store(false, Ordering::Release);
        match turn(&mut cx) {
            Step::Done(v) => return Ok(v),
            Step::Again => continue,
            Step::Wait if flag.0.load(Ordering::Acquire) => continue,
            Step::Wait => wait_fd(fd, want_write, deadline)?,
        }
    }
}

/// Sleeps until `fd` is readable (or writable, when a write would have blocked), or
/// `deadline` passes (`Stalled::TimedOut`). A signal ends the wait early (the caller
/// polls again).
fn wait_fd(
    fd: RawFd,
    want_write: &AtomicBool,
    deadline: Instant,
) -> std::result::Result<(), Stalled> {
    let now = Instant::now();
    if now >= deadline {
        return Err(Stalled::TimedOut);
    }
    let left = deadline - now;
    let ms = left
        .as_millis()
        .saturating_add(u128::from(!left.subsec_nanos().is_multiple_of(1_000_000)))
        .min(i32::MAX as u128) as i32;
    let mut events = libc::POLLIN;
    if want_write.swap(false, Ordering::Relaxed) {
        events |= libc::POLLOUT;
    }
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let _ = unsafe { libc::poll(&mut p, 1, ms) };
    // Readiness, a hang-up, an error or a signal: the caller's next poll finds out which.
    Ok(())
}

/// Sets TCP keepalives as the URL asks (tokio-postgres's own connect does the same).
fn keepalives(s: &TcpStream, spec: &ConnSpec) {
    if !spec.pg.get_keepalives() {
        return;
    }
    let fd = s.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, v: libc::c_int| {
        // SAFETY: a plain setsockopt with an int option on our own socket.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    };
    let secs = |d: Duration| d.as_secs().clamp(1, i32::MAX as u64) as libc::c_int;
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(
        libc::IPPROTO_TCP,
        libc::TCP_KEEPIDLE,
        secs(spec.pg.get_keepalives_idle()),
    );
    if let Some(i) = spec.pg.get_keepalives_interval() {
        set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs(i));
    }
    if let Some(n) = spec.pg.get_keepalives_retries() {
        set(
            libc::IPPROTO_TCP,
            libc::TCP_KEEPCNT,
            n.min(i32::MAX as u32) as libc::c_int,
        );
    }
}

/// Opens a socket to the first of the URL's hosts that answers (each TCP address in
/// turn, within the connect timeout each). Errors: [`MetaError::Unreachable`].
fn open_socket(spec: &ConnSpec) -> Result<Socket> {
    let hosts = spec.pg.get_hosts();
    let ports = spec.pg.get_ports();
    let timeout = spec
        .pg
        .get_connect_timeout()
        .copied()
        .unwrap_or(spec.opts.op_timeout);
    let mut last: Option<std::io::Error> = None;
    for (i, host) in hosts.iter().enumerate() {
        let port = ports
            .get(i)
            .or_else(|| ports.first())
            .copied()
            .unwrap_or(5432);
        let stream = match host {
            Host::Unix(dir) => {
                UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).map(Stream::Unix)
            }
            Host::Tcp(name) => {
                // `hostaddr` (libpq): the address to use, the name kept for messages.
                let given = spec.pg.get_hostaddrs().get(i).copied();
                let addrs = match given {
                    Some(ip) => vec![std::net::SocketAddr::new(ip, port)],
                    None => match (name.as_str(), port).to_socket_addrs() {
                        Ok(a) => a.collect::<Vec<_>>(),
                        Err(e) => {
                            last = Some(e);
                            continue;
                        }
                    },
                };
                let mut got = Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no address for {name}"),
                ));
                for a in addrs {
                    got = TcpStream::connect_timeout(&a, timeout);
                    if got.is_ok() {
                        break;
                    }
                }
                got.and_then(|s| {
                    s.set_nodelay(true)?;
                    keepalives(&s, spec);
                    Ok(Stream::Tcp(s))
                })
            }
        };
        let stream = stream.and_then(|s| {
            match &s {
                Stream::Tcp(t) => t.set_nonblocking(true)?,
                Stream::Unix(u) => u.set_nonblocking(true)?,
            }
            Ok(s)
        });
        match stream {
            Ok(stream) => {
                return Ok(Socket {
                    stream,
                    want_write: Arc::new(AtomicBool::new(false)),
                })
            }
            Err(e) => last = Some(e),
        }
    }
    let why = match last {
        Some(e) => match e.kind() {
            std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                "connection timed out".to_string()
            }
            std::io::ErrorKind::NotFound => "no such host or socket".to_string(),
            _ => e.to_string(),
        },
        None => "no host to connect to".to_string(),
    };
    Err(MetaError::Unreachable(format!("{}: {why}", spec.target)))
}

/// Connects and runs the startup handshake (authentication) on the calling thread,
/// within `deadline`. Errors: [`MetaError::Unreachable`] with a one-line reason.
pub(super) fn connect(spec: &ConnSpec, deadline: Instant) -> Result<(Client, Io)> {
    let sock = open_socket(spec)?;
    let fd = sock.stream.fd();
    let want_write = sock.want_write.clone();
    let mut hs = pin!(spec.pg.connect_raw(sock, NoTls));
    let (client, conn) = run_on_fd(fd, &want_write, deadline, |cx| match hs.as_mut().poll(cx) {
        Poll::Ready(r) => Step::Done(r),
        Poll::Pending => Step::Wait,
    })
    .map_err(|_| MetaError::Unreachable(format!("{}: connection timed out", spec.target)))?
    .map_err(|e| connect_error(&spec.target, &e))?;
    Ok((
        client,
        Io {
            conn: Box::pin(conn),
            fd,
            want_write,
            ended: false,
            polite: false,
        },
    ))
}
