//! Connections: opening them (session setup, every statement prepared at once), a small
//! pool handing them out per call, and the bridge from the engine's synchronous API to
//! the async client.
//!
//! # The bridge
//! The engine owns a small multi-thread tokio runtime; each connection's I/O task runs on
//! it. A call polls the client's futures on the *caller's* thread with a park/unpark
//! [`block_on`] under the runtime's context (for timers): no `Runtime::block_on`, no
//! futures-executor "enter" guard, so callers may be plain threads or workers of another
//! tokio runtime (the VFS's uploader runs engine calls from async code).
//!
//! # Broken connections
//! A connection goes back to the pool only when its state is known (idle, or with a
//! `ROLLBACK` queued); one whose call timed out or failed below SQL is dropped, its I/O
//! task aborted (the server then rolls back whatever it had open). Idle connections whose
//! server went away (restart, `pg_terminate_backend`) close their client and are skipped
//! at checkout; the next call opens a fresh one.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use super::wire::{self, Io, Stalled};
use tokio_postgres::{Client, NoTls, Statement};

use super::config::{connect_error, ConnSpec};
use super::sql::Q;
use crate::{MetaError, Result};

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `fut` to completion on the calling thread (parking between wake-ups), inside
/// `handle`'s context so tokio timers and sockets created by `fut` use the engine's
/// runtime. Safe from any thread, including another runtime's workers.
pub(super) fn block_on<F: Future>(handle: &Handle, fut: F) -> F::Output {
    let _ctx = handle.enter();
    let mut fut = pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Runs `fut` with the call time bound; a timeout is [`MetaError::Unreachable`]
/// ("`what` timed out after …").
pub(super) fn bounded<T>(
    handle: &Handle,
    limit: Duration,
    what: &str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    block_on(handle, async {
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(MetaError::Unreachable(format!(
                "{what} timed out after {:.1} s",
                limit.as_secs_f64()
            ))),
        }
    })
}

/// A tokio-postgres error as a [`MetaError`]: database errors keep their SQLSTATE,
/// failures below SQL (connection lost, I/O) are [`MetaError::Unreachable`], a value that
/// does not convert is [`MetaError::Internal`].
pub(crate) fn map_err(e: &tokio_postgres::Error) -> MetaError {
    if let Some(db) = e.as_db_error() {
        let mut message = db.message().to_string();
        if let Some(d) = db.detail() {
            message = format!("{message} ({d})");
        }
        return MetaError::Db {
            code: Some(db.code().code().to_string()),
            message,
        };
    }
    if is_conn_error(e) {
        return MetaError::Unreachable(format!(
            "connection to the database lost: {}",
            super::config::one_line(e)
        ));
    }
    MetaError::Internal(format!("postgres: {}", super::config::one_line(e)))
}

/// Whether `e` means the connection is unusable (closed, I/O failure) rather than a
/// statement that failed on a healthy connection.
pub(super) fn is_conn_error(e: &tokio_postgres::Error) -> bool {
    if e.as_db_error().is_some() {
        // FATAL errors (admin shutdown, terminated backend) end the session too.
        return e
            .as_db_error()
            .is_some_and(|d| d.severity() == "FATAL" || d.severity() == "PANIC");
    }
    if e.is_closed() {
        return true;
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if s.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        src = s.source();
    }
    // A value that did not convert ("error serializing parameter", "error deserializing
    // column") leaves the connection healthy; anything else (protocol desynchronisation
    // and the like) means it is not to be trusted again.
    !super::config::one_line(e).contains("serializing")
}

/// One open connection with its prepared statements, driven by the thread holding its
/// lease ([`super::wire`]).
pub(super) struct Conn {
    // Declared before `io`: dropped first, it queues the Terminate that `io` sends.
    pub client: Client,
    stmts: Vec<Statement>,
    io: Mutex<Io>,
    /// Its session is idle (or has only a `ROLLBACK` queued): closing it may be polite.
    clean: bool,
    /// The change-feed session set on this connection (`deskfs.session`), 0 = none.
    pub session: u64,
}

impl Conn {
    /// The prepared statement `q`.
    pub fn stmt(&self, q: Q) -> &Statement {
        &self.stmts[q as usize]
    }

    /// Takes in what the server sent while the connection sat idle; false when the
    /// connection turned out dead (a restarted server, a terminated backend).
    fn alive(&self) -> bool {
        !self.client.is_closed() && self.io.lock().map(|mut io| io.pump()).unwrap_or(false)
    }

    /// Runs `fut` (a call on this connection's client) on the calling thread until
    /// `deadline`. Errors: [`Stalled`] (out of time, or the connection ended).
    pub fn drive<F: Future>(
        &self,
        deadline: Instant,
        fut: F,
    ) -> std::result::Result<F::Output, Stalled> {
        match self.io.lock() {
            Ok(mut io) => io.drive(deadline, fut),
            Err(_) => Err(Stalled::Ended),
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // A clean connection says goodbye (Terminate) before its socket closes; one in
        // an unknown state is just closed.
        if self.clean {
            if let Ok(io) = self.io.get_mut() {
                io.polite = true;
            }
        }
    }
}

/// The session settings every connection starts with (one round trip): the workspace
/// schema; commits that return before their WAL flush (durable within the WAL writer's
/// delay; `make_durable` flushes on demand for fsync, as SQLite's synchronous=NORMAL and
/// a later WAL sync do), and the server's side of the time bounds: statements end after
/// the call time bound, a session left idle inside a transaction (a client cut off
/// mid-transaction) is ended so its locks go, a dead client is noticed by keepalives
/// and, while a statement runs, by connection checks.
fn session_setup(spec: &ConnSpec) -> String {
    let op_ms = spec.opts.op_timeout.as_millis().max(1);
    format!(
        "SET search_path TO {schema}; \
         SET synchronous_commit = off; \
         SET statement_timeout = {op_ms}; \
         SET idle_in_transaction_session_timeout = {idle_ms}; \
         SET tcp_keepalives_idle = 30; SET tcp_keepalives_interval = 10; \
         SET tcp_keepalives_count = 3; \
         SELECT set_config('client_connection_check_interval', '10000', false) \
           WHERE current_setting('server_version_num')::int >= 140000;",
        schema = spec.schema,
        idle_ms = op_ms.saturating_mul(2).max(60_000),
    )
}

/// Opens a connection without preparing anything (schema creation and checks).
/// Errors: [`MetaError::Unreachable`] with a one-line reason.
pub(super) async fn connect_raw(
    spec: &ConnSpec,
    handle: &Handle,
) -> Result<(Client, JoinHandle<()>)> {
    let (client, connection) = spec
        .pg
        .connect(NoTls)
        .await
        .map_err(|e| connect_error(&spec.target, &e))?;
    let target = spec.target.clone();
    let task = handle.spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(target = %target, error = %e, "postgres connection ended");
        }
    });
    let setup = session_setup(spec);
    if let Err(e) = client.batch_execute(&setup).await {
        task.abort();
        return Err(connect_error(&spec.target, &e));
    }
    Ok((client, task))
}

/// Opens a connection and prepares every statement (one pipelined round trip), on the
/// calling thread within the call time bound. Errors: [`MetaError::Unreachable`],
/// [`MetaError::Db`] when a statement does not prepare.
fn connect(spec: &ConnSpec) -> Result<Conn> {
    let deadline = Instant::now() + spec.opts.op_timeout;
    let (client, io) = wire::connect(spec, deadline)?;
    let conn = Conn {
        client,
        stmts: Vec::new(),
        io: Mutex::new(io),
        clean: false,
        session: 0,
    };
    let stalled = |e: Stalled| match e {
        Stalled::TimedOut => MetaError::Unreachable(format!(
            "{}: connection timed out while setting up the session",
            spec.target
        )),
        Stalled::Ended => MetaError::Unreachable(format!(
            "{}: connection to the database lost while setting up the session",
            spec.target
        )),
    };
    let setup = session_setup(spec);
    conn.drive(deadline, conn.client.batch_execute(&setup))
        .map_err(stalled)?
        .map_err(|e| connect_error(&spec.target, &e))?;
    let prepared = conn
        .drive(
            deadline,
            futures::future::join_all(Q::ALL.iter().map(|q| conn.client.prepare(q.sql()))),
        )
        .map_err(stalled)?;
    let mut stmts = Vec::with_capacity(prepared.len());
    for (q, p) in Q::ALL.iter().zip(prepared) {
        match p {
            Ok(s) => stmts.push(s),
            Err(e) => {
                let err = map_err(&e);
                return Err(match err {
                    MetaError::Db { code, message } => MetaError::Db {
                        code,
                        message: format!("preparing {q:?}: {message}"),
                    },
                    other => other,
                });
            }
        }
    }
    let mut conn = conn;
    conn.stmts = stmts;
    Ok(conn)
}

struct PoolState {
    idle: Vec<Conn>,
    /// Connections open (idle or handed out).
    open: usize,
}

/// Up to `size` connections, opened on demand, reused most-recent first.
pub(super) struct Pool {
    spec: Arc<ConnSpec>,
    state: Mutex<PoolState>,
    freed: Condvar,
}

impl Pool {
    pub fn new(spec: Arc<ConnSpec>) -> Pool {
        Pool {
            spec,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, PoolState>> {
        self.state
            .lock()
            .map_err(|_| MetaError::Internal("postgres pool mutex poisoned".into()))
    }

    /// A connection for one call: an idle one, else a new one while fewer than the pool
    /// size are open, else the first one given back within the call time bound. Errors:
    /// [`MetaError::Unreachable`] (cannot connect, or all connections stay busy).
    pub fn get(&self) -> Result<Lease<'_>> {
        let deadline = Instant::now() + self.spec.opts.op_timeout;
        let mut st = self.lock()?;
        loop {
            while let Some(c) = st.idle.pop() {
                if !c.alive() {
                    st.open -= 1;
                    continue;
                }
                let mut c = c;
                c.clean = false;
                return Ok(Lease {
                    pool: self,
                    conn: Some(c),
                });
            }
            if st.open < self.spec.opts.pool_size {
                st.open += 1;
                drop(st);
                return match connect(&self.spec) {
                    Ok(c) => Ok(Lease {
                        pool: self,
                        conn: Some(c),
                    }),
                    Err(e) => {
                        let mut st = self.lock()?;
                        st.open -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(MetaError::Unreachable(format!(
                    "all {} database connections stayed busy for {:.1} s",
                    self.spec.opts.pool_size,
                    self.spec.opts.op_timeout.as_secs_f64()
                )));
            }
            st = self
                .freed
                .wait_timeout(st, deadline - now)
                .map_err(|_| MetaError::Internal("postgres pool mutex poisoned".into()))?
                .0;
        }
    }

    /// Closes the idle connections (politely: each sends Terminate).
    pub fn close_idle(&self) {
        let idle = match self.state.lock() {
            Ok(mut st) => {
                let v = std::mem::take(&mut st.idle);
                st.open -= v.len();
                v
            }
            Err(_) => return,
        };
        drop(idle);
    }
}

/// A connection handed out by the pool. Dropped without [`Lease::release`], the
/// connection is closed (its state is unknown).
pub(super) struct Lease<'p> {
    pool: &'p Pool,
    conn: Option<Conn>,
}

impl Lease<'_> {
    /// The connection.
    pub fn conn(&mut self) -> Result<&mut Conn> {
        self.conn
            .as_mut()
            .ok_or_else(|| MetaError::Internal("postgres lease used after release".into()))
    }

    /// Gives the connection back for reuse (its session is idle or has only a
    /// `ROLLBACK` queued).
    pub fn release(mut self) {
        if let Some(mut c) = self.conn.take() {
            c.clean = true;
            // Writes what the session still has queued (a `ROLLBACK` not waited for) at
            // once, so the server ends that transaction now rather than when the
            // connection is next used.
            let alive = c.alive();
            if let Ok(mut st) = self.pool.state.lock() {
                if !alive {
                    st.open -= 1;
                } else {
                    st.idle.push(c);
                }
                self.pool.freed.notify_one();
            }
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            drop(c);
            if let Ok(mut st) = self.pool.state.lock() {
                st.open -= 1;
                self.pool.freed.notify_one();
            }
        }
    }
}
