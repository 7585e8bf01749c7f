//! The PostgreSQL engine: one workspace per PostgreSQL schema, shared by mounts on many
//! hosts, built for a network — one POSIX operation is one round trip.
//!
//! * [`MetaEngine::apply`] sends a whole [`Op`] batch as one pipelined READ COMMITTED
//!   transaction; expectations are server-side errors (see `batch.rs`).
//! * [`MetaEngine::txn`] / [`MetaEngine::read`] are REPEATABLE READ transactions where each
//!   [`MetaTxn`] method is one prepared statement (see `txn.rs`); retried on SQLSTATE
//!   40001/40P01 with [`crate::retry_backoff`], up to [`crate::TXN_ATTEMPTS`].
//! * [`MetaEngine::get_inode`] / [`MetaEngine::lookup`] are single statements.
//! * The change feed is kept by triggers; its cursor never skips a transaction that
//!   commits late (see `feed.rs`). Signals travel by `LISTEN`/`NOTIFY` (`signals.rs`).
//! * Commits return before their WAL flush (`synchronous_commit` off): visible to every
//!   host at once, durable within the WAL writer's delay (3 × `wal_writer_delay`, 600 ms
//!   by default) — what a kill -9 of any daemon cannot undo, and what only a crash of
//!   the database server's machine can lose, as a power loss loses ext4's last journal
//!   commits. [`MetaEngine::make_durable`] (fsync, fsyncdir, and before the uploader
//!   deletes from the bucket or evicts on the strength of a commit) commits one
//!   transaction that waits for the flush, which covers every earlier commit of every
//!   host (the WAL is one sequence).
//! * A few pooled connections (`pool.rs`), every statement prepared once per connection;
//!   each wait is bounded ([`PgOptions::op_timeout`], plus TCP keepalives), so a host cut
//!   off from the database gets [`MetaError::Unreachable`] instead of hanging.
//!
//! The engine owns a small tokio runtime for the connections' I/O; its synchronous API
//! may be called from plain threads and from inside other tokio runtimes alike.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::runtime::{Handle, Runtime};

mod batch;
mod config;
mod feed;
mod pool;
mod rows;
mod schema;
mod signals;
mod sql;
mod txn;
mod wire;

pub use config::PgOptions;
pub use schema::SCHEMA_VERSION;

use config::ConnSpec;
use pool::{Conn, Lease, Pool};
use sql::Q;
use txn::PgTxn;
use wire::Stalled;

use crate::{
    ChangeRow, EngineCounters, FeedCursor, Ino, InodeRow, MetaEngine, MetaError, MetaTxn, Op,
    OpOut, Result, Signal, TXN_ATTEMPTS,
};

/// [`EngineCounters`] as atomics.
#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
    commits: AtomicU64,
    retries: AtomicU64,
    preconditions: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn add_round_trip(&self) {
        crate::count_thread_round_trip();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }
    fn add_commit(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }
    fn add_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }
    fn snapshot(&self) -> EngineCounters {
        EngineCounters {
            round_trips: self.round_trips.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            preconditions: self.preconditions.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            ..EngineCounters::default()
        }
    }
}

/// Everything the engine's calls share (the runtime itself lives in [`PgEngine`]).
struct Inner {
    spec: Arc<ConnSpec>,
    handle: Handle,
    pool: Pool,
    counters: Counters,
    /// The change-feed session of this engine's connections (0 = not logging).
    session: AtomicU64,
    feed: feed::SnapCache,
    /// Wakes the debounced feed `NOTIFY` (started by `log_changes_as`).
    feed_notifier: OnceLock<Arc<tokio::sync::Notify>>,
    /// `LISTEN`/`NOTIFY` channel of the workspace.
    channel: String,
    /// This engine's id in signal payloads (its own signals are not delivered to it).
    id: u64,
    subscribed: AtomicBool,
}

impl Inner {
    /// Runs `fut`, a call on `conn`'s client, on the calling thread, at most the call
    /// time bound. Errors: [`MetaError::Unreachable`] when the bound passes or the
    /// connection ends under the call.
    fn wait<T>(&self, conn: &Conn, what: Q, fut: impl Future<Output = T>) -> Result<T> {
        let limit = self.spec.opts.op_timeout;
        conn.drive(Instant::now() + limit, fut)
            .map_err(|e| match e {
                Stalled::TimedOut => MetaError::Unreachable(format!(
                    "{}: timed out after {:.1} s waiting for {what:?}",
                    self.spec.target,
                    limit.as_secs_f64()
                )),
                Stalled::Ended => MetaError::Unreachable(format!(
                    "{}: connection to the database lost waiting for {what:?}",
                    self.spec.target
                )),
            })
    }

    /// A pooled connection with this engine's change-feed session set on it (a
    /// connection found dead while setting it is replaced).
    fn lease(&self) -> Result<Lease<'_>> {
        let mut tries = 0;
        loop {
            tries += 1;
            let mut lease = self.pool.get()?;
            let session = self.session.load(Ordering::Relaxed);
            let conn = lease.conn()?;
            if session == 0 || conn.session == session {
                return Ok(lease);
            }
            self.counters.add_round_trip();
            let value = session.to_string();
            let st = conn.stmt(Q::SetSession);
            match self.wait(conn, Q::SetSession, conn.client.execute(st, &[&value])) {
                Ok(Ok(_)) => {
                    conn.session = session;
                    return Ok(lease);
                }
                Ok(Err(e)) if pool::is_conn_error(&e) && tries < 3 => {
                    drop(lease);
                    self.counters.add_retry();
                }
                Ok(Err(e)) => return Err(pool::map_err(&e)),
                Err(e) => return Err(e),
            }
        }
    }

    /// Counts `e` as a precondition or an error, and returns it.
    fn count_err(&self, e: MetaError) -> MetaError {
        match &e {
            MetaError::Precondition { .. } => {
                self.counters.preconditions.fetch_add(1, Ordering::Relaxed);
            }
            MetaError::Aborted | MetaError::Fenced(_) => {}
            _ => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        e
    }

    /// A commit may have logged changes: wake the feed notifier (debounced).
    fn changed(&self) {
        if self.session.load(Ordering::Relaxed) != 0 {
            if let Some(n) = self.feed_notifier.get() {
                n.notify_one();
            }
        }
    }

    /// One statement outside any transaction (autocommit), retried once on a connection
    /// that turns out dead. Only for statements that may run twice.
    fn single<T>(
        &self,
        q: Q,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        decode: impl Fn(Vec<tokio_postgres::Row>) -> Result<T>,
    ) -> Result<T> {
        let mut tries = 0;
        loop {
            tries += 1;
            let mut lease = self.lease().map_err(|e| self.count_err(e))?;
            let conn = lease.conn()?;
            self.counters.add_round_trip();
            let res = self.wait(conn, q, conn.client.query(conn.stmt(q), params));
            match res {
                Ok(Ok(rows)) => {
                    lease.release();
                    return decode(rows);
                }
                Ok(Err(e)) if pool::is_conn_error(&e) => {
                    drop(lease);
                    if tries < 3 {
                        self.counters.add_retry();
                        continue;
                    }
                    return Err(self.count_err(pool::map_err(&e)));
                }
                Ok(Err(e)) => {
                    lease.release();
                    let err = pool::map_err(&e);
                    if err.is_retryable() && tries < TXN_ATTEMPTS {
                        self.counters.add_retry();
                        std::thread::sleep(crate::retry_backoff(tries));
                        continue;
                    }
                    return Err(self.count_err(err));
                }
                Err(timeout) => {
                    drop(lease);
                    return Err(self.count_err(timeout));
                }
            }
        }
    }

    /// Runs `f` in a transaction (see `txn.rs`), retrying it on retryable errors and on a
    /// connection lost before anything could commit.
    fn run(&self, write: bool, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()> {
        self.run_with(write, None, f)
    }

    /// [`Inner::run`]; with `key`, READ COMMITTED after the key's advisory lock.
    fn run_with(
        &self,
        write: bool,
        key: Option<u64>,
        f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>,
    ) -> Result<()> {
        let begin = match (write, key) {
            (_, Some(_)) => Q::BeginKeyed,
            (true, None) => Q::BeginWrite,
            (false, None) => Q::BeginRead,
        };
        let mut attempt = 0;
        let mut conn_retries = 0;
        loop {
            attempt += 1;
            let mut lease = self.lease().map_err(|e| self.count_err(e))?;
            let conn = lease.conn()?;
            let mut t = PgTxn::new(self, conn, begin);
            let locked = match key {
                Some(k) => t.key_lock(k),
                None => Ok(()),
            };
            let res = match locked.and_then(|()| f(&mut t)) {
                Ok(()) if write => t.commit(),
                Ok(()) => {
                    t.finish_without_commit();
                    Ok(())
                }
                Err(e) => {
                    t.finish_without_commit();
                    Err(e)
                }
            };
            let (broken, commit_unknown, logged) = (t.broken, t.commit_unknown, t.logged);
            if broken {
                drop(lease);
            } else {
                lease.release();
            }
            match res {
                Ok(()) => {
                    if write {
                        self.counters.add_commit();
                        if logged {
                            self.changed();
                        }
                    }
                    return Ok(());
                }
                Err(e) if e.is_retryable() && attempt < TXN_ATTEMPTS => {
                    self.counters.add_retry();
                    tracing::debug!(attempt, error = %e, "postgres transaction retried");
                    std::thread::sleep(crate::retry_backoff(attempt));
                }
                // The connection died before anything could commit: run it again on a
                // fresh one (whatever the closure made of the failure).
                Err(e) if broken && !commit_unknown && conn_retries < 2 => {
                    conn_retries += 1;
                    self.counters.add_retry();
                    tracing::debug!(error = %e, "postgres transaction retried on a new connection");
                }
                Err(e) => return Err(self.count_err(e)),
            }
        }
    }
}

/// A PostgreSQL metadata database: the workspace's tables in one PostgreSQL schema.
pub struct PgEngine {
    inner: Arc<Inner>,
    /// The runtime running the connections; stopped (in the background) on drop.
    rt: Option<Runtime>,
}

impl std::fmt::Debug for PgEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgEngine")
            .field("db", &self.inner.spec.describe)
            .finish()
    }
}

fn runtime() -> Result<Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("deskfs-pg")
        .enable_all()
        .build()?)
}

/// A random-enough 64-bit id (engine ids in signal payloads).
fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}

impl PgEngine {
    /// Creates a workspace: the schema named by the URL's `schema` parameter (default
    /// `public`; created if missing), its tables, and a root directory owned by `uid:gid`
    /// with permissions `0o755` at time `now_ns`.
    ///
    /// `url` is `postgres://user:password@host:port/db?schema=NAME&…` (or `postgresql://`);
    /// what it leaves out comes from `PGUSER`, `PGPASSWORD` / `~/.pgpass`, `PGHOST`,
    /// `PGPORT`, `PGDATABASE`, `PGSSLMODE`. Engine options may be given as `pool_size=N` and
    /// `op_timeout=SECONDS`.
    ///
    /// Errors: [`MetaError::Conflict`] when the schema already holds a deskfs workspace (or
    /// tables of the same names), [`MetaError::Unreachable`] when the server cannot be
    /// reached or refuses the login (or the URL is unusable, e.g. asks for TLS),
    /// [`MetaError::Db`] for other database errors (e.g. no right to create).
    pub fn create(url: &str, uid: u32, gid: u32, now_ns: i64) -> Result<PgEngine> {
        Self::create_with(url, PgOptions::default(), uid, gid, now_ns)
    }

    /// [`PgEngine::create`] with explicit options (the URL's parameters win).
    pub fn create_with(
        url: &str,
        opts: PgOptions,
        uid: u32,
        gid: u32,
        now_ns: i64,
    ) -> Result<PgEngine> {
        let spec = ConnSpec::parse(url, opts)?;
        let rt = runtime()?;
        let handle = rt.handle().clone();
        let limit = spec.opts.op_timeout;
        let what = format!("{}: creating the workspace", spec.target);
        pool::bounded(&handle, limit, &what, async {
            let (client, _task) = pool::connect_raw(&spec, &handle).await?;
            match schema::inspect(&client, &spec.schema).await? {
                schema::Found::Deskfs(_) => Err(MetaError::Conflict(format!(
                    "{} already holds a deskfs workspace",
                    spec.describe
                ))),
                _ => schema::create(&client, &spec.schema, uid, gid, now_ns).await,
            }
        })?;
        Self::start(spec, rt)
    }

    /// Opens an existing workspace (URL as for [`PgEngine::create`]).
    ///
    /// Errors: [`MetaError::NotFound`] when the schema holds no deskfs workspace (missing
    /// or empty), [`MetaError::Corrupt`] when it holds something else or a damaged one,
    /// [`MetaError::TooNew`] when a newer deskfs wrote it, [`MetaError::Unreachable`] when
    /// the server cannot be reached or refuses the login.
    pub fn open(url: &str) -> Result<PgEngine> {
        Self::open_with(url, PgOptions::default())
    }

    /// [`PgEngine::open`] with explicit options (the URL's parameters win).
    pub fn open_with(url: &str, opts: PgOptions) -> Result<PgEngine> {
        let spec = ConnSpec::parse(url, opts)?;
        let rt = runtime()?;
        let handle = rt.handle().clone();
        let limit = spec.opts.op_timeout;
        let corrupt = |detail: String| MetaError::Corrupt {
            path: spec.describe.clone(),
            detail,
        };
        let what = format!("{}: opening the workspace", spec.target);
        pool::bounded(&handle, limit, &what, async {
            let (client, _task) = pool::connect_raw(&spec, &handle).await?;
            match schema::inspect(&client, &spec.schema).await? {
                schema::Found::Nothing => Err(MetaError::NotFound(format!(
                    "no deskfs workspace in {}",
                    spec.describe
                ))),
                schema::Found::Foreign(d) => Err(corrupt(d)),
                schema::Found::Deskfs(v) if v > SCHEMA_VERSION => Err(MetaError::TooNew {
                    path: spec.describe.clone(),
                    found: v,
                    supported: SCHEMA_VERSION,
                }),
                schema::Found::Deskfs(_) => {
                    schema::check(&client, &spec.schema)
                        .await?
                        .map_err(corrupt)?;
                    // An index added after schema 3 shipped (readdir pages in cookie
                    // order); only slower without it, so a failure (no CREATE privilege,
                    // a concurrent creator) is logged and ignored.
                    let ddl = format!(
                        "CREATE INDEX IF NOT EXISTS dentries_parent_cookie \
                         ON {}.dentries(parent, cookie)",
                        spec.schema
                    );
                    if let Err(e) = client.batch_execute(&ddl).await {
                        tracing::warn!(error = %e, "cannot add the dentries(parent, cookie) index; readdir of big directories stays slower");
                    }
                    schema::add_pending_owner(&client, &spec.schema).await
                }
            }
        })?;
        Self::start(spec, rt)
    }

    fn start(spec: ConnSpec, rt: Runtime) -> Result<PgEngine> {
        let spec = Arc::new(spec);
        let handle = rt.handle().clone();
        let inner = Arc::new(Inner {
            pool: Pool::new(spec.clone()),
            channel: signals::channel(&spec.schema),
            spec,
            handle,
            counters: Counters::default(),
            session: AtomicU64::new(0),
            feed: feed::SnapCache::default(),
            feed_notifier: OnceLock::new(),
            id: random_id(),
            subscribed: AtomicBool::new(false),
        });
        let engine = PgEngine {
            inner,
            rt: Some(rt),
        };
        // One connection now: every statement prepares against the schema, so a schema
        // this build cannot use fails here rather than on the first request.
        engine.inner.pool.get()?.release();
        Ok(engine)
    }

    /// Drops the deskfs workspace the URL names (`deskfs format --force`, test cleanup):
    /// its schema, or its tables when it lives in `public`. Returns whether there was
    /// one. Errors: as [`PgEngine::open`]; `Corrupt` when the schema holds something
    /// that is not deskfs's (nothing is dropped then).
    pub fn destroy(url: &str) -> Result<bool> {
        let spec = ConnSpec::parse(url, PgOptions::default())?;
        let rt = runtime()?;
        let handle = rt.handle().clone();
        let limit = spec.opts.op_timeout;
        let what = format!("{}: dropping the workspace", spec.target);
        let r = pool::bounded(&handle, limit, &what, async {
            let (client, _task) = pool::connect_raw(&spec, &handle).await?;
            schema::destroy(&client, &spec.schema).await
        });
        rt.shutdown_background();
        r
    }

    /// The PostgreSQL schema holding the workspace.
    pub fn schema(&self) -> &str {
        &self.inner.spec.schema
    }
}

impl Drop for PgEngine {
    fn drop(&mut self) {
        self.inner.pool.close_idle();
        if let Some(rt) = self.rt.take() {
            // Never blocks, so dropping the engine inside another runtime is fine.
            rt.shutdown_background();
        }
    }
}

impl MetaEngine for PgEngine {
    fn txn(&self, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()> {
        self.inner.run(true, f)
    }

    fn read(&self, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()> {
        self.inner.run(false, f)
    }

    fn txn_keyed(&self, key: u64, f: &mut dyn FnMut(&mut dyn MetaTxn) -> Result<()>) -> Result<()> {
        self.inner.run_with(true, Some(key), f)
    }

    fn apply(&self, ops: &[Op]) -> Result<Vec<OpOut>> {
        batch::apply(&self.inner, ops)
    }

    fn get_inode(&self, ino: Ino) -> Result<Option<InodeRow>> {
        self.inner.single(Q::GetInode, &[&(ino as i64)], |rows| {
            rows.first().map(|r| rows::inode(r, 0)).transpose()
        })
    }

    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Option<InodeRow>> {
        self.inner
            .single(Q::LookupInode, &[&(parent as i64), &name], |rows| {
                rows.first().map(|r| rows::inode(r, 0)).transpose()
            })
    }

    fn alloc_inos(&self, n: u64) -> Result<std::ops::Range<Ino>> {
        if n == 0 {
            return Ok(0..0);
        }
        let n_i = i64::try_from(n)
            .map_err(|_| MetaError::Internal(format!("alloc_inos({n}): too many")))?;
        let start = self.inner.single(Q::AllocInos, &[&n_i], |rows| {
            let r = rows
                .first()
                .ok_or_else(|| MetaError::Internal("alloc_inos returned no row".into()))?;
            rows::col_u64(r, 0)
        })?;
        Ok(start..start + n)
    }

    /// One round trip: a transaction whose commit waits for the WAL flush (see the
    /// module docs), so every commit before it, from any host, is durable.
    fn make_durable(&self) -> Result<()> {
        self.inner.single(Q::Durable, &[], |rows| {
            // The commit waits for the flush only with the setting on and an xid taken.
            let ok = rows.first().is_some_and(|r| {
                r.try_get::<_, String>(0).is_ok_and(|v| v == "on")
                    && r.try_get::<_, String>(1).is_ok_and(|x| !x.is_empty())
            });
            if ok {
                Ok(())
            } else {
                Err(MetaError::Internal(
                    "the durable commit did not run with synchronous_commit on".into(),
                ))
            }
        })
    }

    fn describe(&self) -> String {
        self.inner.spec.describe.clone()
    }

    fn counters(&self) -> EngineCounters {
        self.inner.counters.snapshot()
    }

    /// Sets `deskfs.session` on every connection of the engine (each picks it up at its
    /// next use), which the change-feed triggers read, and starts the debounced feed
    /// `NOTIFY`.
    fn log_changes_as(&self, session: u64) -> Result<()> {
        self.inner.session.store(session, Ordering::Relaxed);
        self.inner.feed_notifier.get_or_init(|| {
            signals::spawn_feed_notifier(
                self.inner.spec.clone(),
                &self.inner.handle,
                self.inner.channel.clone(),
                signals::encode(self.inner.id, &Signal::Feed),
            )
        });
        Ok(())
    }

    fn feed_start(&self) -> Result<FeedCursor> {
        self.inner.single(Q::FeedStart, &[], |rows| {
            let r = rows
                .first()
                .ok_or_else(|| MetaError::Internal("feed start returned no row".into()))?;
            feed::start_cursor(&self.inner.feed, r)
        })
    }

    /// See `feed.rs` for the cursor: no change committed is skipped, even when its
    /// transaction commits after one with a higher sequence number.
    fn feed_read(
        &self,
        cursor: FeedCursor,
        not_session: u64,
        limit: usize,
    ) -> Result<(Vec<ChangeRow>, FeedCursor)> {
        if limit == 0 {
            return Ok((Vec::new(), cursor));
        }
        let (snap, bound) = self.inner.feed.lookup(cursor);
        let (a, lim) = (cursor.a as i64, limit.min(i64::MAX as usize) as i64);
        let (rows, next) = self
            .inner
            .single(Q::FeedRead, &[&bound, &a, &snap, &lim], |rows| {
                feed::read_result(&self.inner.feed, limit, &rows)
            })?;
        Ok((
            rows.into_iter()
                .filter(|c| c.session != not_session)
                .collect(),
            next,
        ))
    }

    fn signal(&self, signal: &Signal) -> Result<()> {
        let payload = signals::encode(self.inner.id, signal);
        self.inner
            .single(Q::Notify, &[&self.inner.channel, &payload], |_| Ok(()))
    }

    /// The first caller gets the receiver; the `LISTEN` is in place when this returns
    /// (waiting at most the call time bound for it).
    fn subscribe(&self) -> Option<std::sync::mpsc::Receiver<Signal>> {
        if self.inner.subscribed.swap(true, Ordering::SeqCst) {
            return None;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let ready = signals::spawn_listener(
            self.inner.spec.clone(),
            &self.inner.handle,
            self.inner.channel.clone(),
            self.inner.id,
            tx,
        );
        if ready.recv_timeout(self.inner.spec.opts.op_timeout).is_err() {
            tracing::warn!("signal listener not ready in time; signals may arrive late");
        }
        Some(rx)
    }
}

#[cfg(test)]
mod tests;
