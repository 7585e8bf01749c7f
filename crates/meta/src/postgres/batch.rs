//! [`Op`] batches in one round trip: `BEGIN ISOLATION LEVEL READ COMMITTED`, one
//! prepared statement per op (two for the ops that first take a lock), `COMMIT`, all
//! written to the connection before any answer is read (tokio-postgres pipelines the
//! requests of futures polled together; [`pipeline`] polls them in order, so they go out
//! in order).
//!
//! # Expectations
//! Nothing can be checked client-side in the middle of a pipeline, so every expectation
//! is a server-side error: the expecting statement calls `deskfs_expect(ok, what)`, which
//! raises SQLSTATE `DK001` with `what` as detail (`deskfs_fence` raises `DK002`), and a
//! unique violation (23505) of `InsertDentry`/`MoveDentry` means the name is taken. The
//! first failing statement names the step; the server aborts the transaction there (later
//! statements answer 25P02 and `COMMIT` answers `ROLLBACK`), so nothing was applied.
//!
//! # Concurrency (READ COMMITTED: each statement sees what committed before it started)
//! * `TouchDir` updates the directory's row first: creates and removes in one directory
//!   queue on that row lock, different directories run in parallel, and every later
//!   statement of the batch sees the directory's entries as the last writer left them.
//! * `ExpectEmpty(d)` first locks `d`'s row (`FOR UPDATE`), then looks for entries in a
//!   second statement with a fresh snapshot. A create inside `d` holds `d`'s row (its
//!   `TouchDir(d)`) until it commits, so the check waits for it and then sees its entry;
//!   a create that comes later waits for this batch and then finds `d` gone (`DirAlive`).
//!   Checking in the same statement as the lock would read the pre-lock snapshot and let
//!   an rmdir remove a directory that just got a child.
//! * `ExpectNotAncestor` first takes a transaction-level advisory lock per workspace
//!   schema, then walks up from the target in a fresh snapshot. Two cross-directory
//!   directory renames could otherwise each pass the check against the other's old tree
//!   and together form a loop; Linux serialises such renames with the per-filesystem
//!   `s_vfs_rename_mutex`, and the advisory lock is that mutex (held to commit, so the
//!   next rename's check sees this one's move).
//! * `ExpectAttrs` locks the inode's row as an update would (`FOR NO KEY UPDATE`, the
//!   row re-checked after any wait), so the attributes hold until commit.
//! * `ExpectEntry` with an inode locks the entry (`FOR SHARE`) so it cannot change before
//!   commit; `CheckSession` locks the session row (`FOR KEY SHARE`) so the session
//!   cannot be deleted (fenced) before this batch commits, while heartbeats go on.
//! * Deadlocks (40P01) between batches locking rows in different orders are retried.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::pool::{is_conn_error, map_err, Conn};
use super::rows::{self, col, InodeParams};
use super::schema::{SQLSTATE_EXPECT, SQLSTATE_FENCED};
use super::sql::Q;
use super::Inner;
use crate::sqlite::MAX_COALESCE_NS;
use crate::{Expect, MetaError, Op, OpOut, Result, XattrMode, TXN_ATTEMPTS};

type Param<'a> = Box<dyn ToSql + Sync + 'a>;

/// What a statement's rows mean for its op's [`OpOut`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// Nothing (or a second statement of an op whose result comes from another).
    Done,
    /// `CommitContent`: column 1 of the one row is the new version.
    Version,
    /// `Purge`: column 0 of the one row is the number of inodes deleted.
    Purged,
    /// `GetInode`: the row, if any.
    Row,
    /// A lock taken for the op's next statement: yields nothing.
    Lock,
    /// The last statement before `COMMIT`: whether the change feed got rows.
    Logged,
}

struct Stmt<'a> {
    q: Q,
    params: Vec<Param<'a>>,
    /// Index of the op in the batch.
    step: usize,
    out: Out,
}

fn p<'a, T: ToSql + Sync + 'a>(v: T) -> Param<'a> {
    Box::new(v)
}

fn i(v: u64) -> i64 {
    v as i64
}

/// The statements of `ops`, in order.
fn plan<'a>(ops: &'a [Op]) -> Vec<Stmt<'a>> {
    let mut v = Vec::with_capacity(ops.len() + 2);
    for (step, op) in ops.iter().enumerate() {
        let mut push = |q: Q, params: Vec<Param<'a>>, out: Out| {
            v.push(Stmt {
                q,
                params,
                step,
                out,
            })
        };
        match op {
            Op::CheckSession(s) => push(Q::CheckSession, vec![p(i(*s))], Out::Done),
            Op::TouchDir {
                ino,
                nlink_delta,
                time_ns,
            } => push(
                Q::TouchDir,
                vec![p(i(*ino)), p(*nlink_delta), p(*time_ns)],
                Out::Done,
            ),
            Op::InsertInode(row) => {
                let ip = InodeParams::of(row);
                let params = vec![
                    p(i(row.ino)),
                    p(ip.kind),
                    p(ip.perm),
                    p(ip.uid),
                    p(ip.gid),
                    p(ip.rdev),
                    p(ip.nlink),
                    p(ip.size),
                    p(ip.atime),
                    p(ip.mtime),
                    p(ip.ctime),
                    p(ip.btime),
                    p(ip.data_version),
                    p(ip.target),
                    p(ip.local),
                    p(ip.dirty),
                    p(ip.listed),
                ];
                push(Q::InsertInodeAt, params, Out::Done)
            }
            Op::InsertDentry { parent, name, ino } => push(
                Q::InsertDentryOp,
                vec![p(i(*parent)), p(name), p(i(*ino))],
                Out::Done,
            ),
            Op::DeleteDentry { parent, name, ino } => push(
                Q::DeleteDentryOp,
                vec![p(i(*parent)), p(name), p(i(*ino))],
                Out::Done,
            ),
            Op::MoveDentry {
                parent,
                name,
                ino,
                new_parent,
                new_name,
            } => push(
                Q::MoveDentryOp,
                vec![
                    p(i(*parent)),
                    p(name),
                    p(i(*ino)),
                    p(i(*new_parent)),
                    p(new_name),
                ],
                Out::Done,
            ),
            Op::RepointDentry {
                parent,
                name,
                from,
                to,
            } => push(
                Q::RepointDentryOp,
                vec![p(i(*parent)), p(name), p(i(*from)), p(i(*to))],
                Out::Done,
            ),
            Op::ExpectEntry {
                parent,
                name,
                ino: None,
            } => push(Q::ExpectNameFree, vec![p(i(*parent)), p(name)], Out::Done),
            Op::ExpectEntry {
                parent,
                name,
                ino: Some(ino),
            } => push(
                Q::ExpectEntryIs,
                vec![p(i(*parent)), p(name), p(i(*ino))],
                Out::Done,
            ),
            Op::ExpectEmpty(dir) => {
                push(Q::LockDir, vec![p(i(*dir))], Out::Lock);
                push(Q::ExpectEmpty, vec![p(i(*dir))], Out::Done);
            }
            Op::ExpectNotAncestor { dir, of } => {
                push(Q::RenameLock, vec![], Out::Lock);
                push(Q::ExpectNotAncestor, vec![p(i(*dir)), p(i(*of))], Out::Done);
            }
            Op::AddNlink {
                ino,
                delta,
                ctime_ns,
            } => push(
                Q::AddNlink,
                vec![p(i(*ino)), p(*delta), p(*ctime_ns)],
                Out::Done,
            ),
            Op::ExpectAttrs {
                ino,
                perm,
                uid,
                gid,
            } => push(
                Q::ExpectAttrs,
                vec![
                    p(i(*ino)),
                    p(i64::from(*perm)),
                    p(i64::from(*uid)),
                    p(i64::from(*gid)),
                ],
                Out::Done,
            ),
            Op::SetAttrs { ino, set } => push(
                Q::SetAttrs,
                vec![
                    p(i(*ino)),
                    p(set.perm.map(i64::from)),
                    p(set.uid.map(i64::from)),
                    p(set.gid.map(i64::from)),
                    p(set.atime_ns),
                    p(set.mtime_ns),
                    p(set.ctime_ns),
                    p(set.dirty),
                    p(set.local.map(|l| l.code())),
                ],
                Out::Done,
            ),
            Op::CommitContent {
                ino,
                size,
                mtime_ns,
                ctime_ns,
                local,
            } => push(
                Q::CommitContent,
                vec![
                    p(i(*ino)),
                    p(i(*size)),
                    p(*mtime_ns),
                    p(*ctime_ns),
                    p(local.code()),
                ],
                Out::Version,
            ),
            Op::Purge(ino) => push(Q::Purge, vec![p(i(*ino))], Out::Purged),
            Op::DeleteInode(ino) => push(Q::DeleteInode, vec![p(i(*ino))], Out::Done),
            Op::MarkPath {
                parent,
                name,
                recursive,
                not_before_ns,
            } => push(
                Q::MarkPath,
                vec![
                    p(i(*parent)),
                    p(name),
                    p(*recursive),
                    p(*not_before_ns),
                    p(MAX_COALESCE_NS),
                ],
                Out::Done,
            ),
            Op::MarkInode { ino, not_before_ns } => push(
                Q::MarkInode,
                vec![
                    p(i(*ino)),
                    p(Option::<Vec<u8>>::None),
                    p(false),
                    p(*not_before_ns),
                    p(MAX_COALESCE_NS),
                ],
                Out::Done,
            ),
            Op::AddOpen {
                ino,
                session,
                delta,
            } => {
                push(
                    Q::AddOpen,
                    vec![p(i(*ino)), p(i(*session)), p(*delta)],
                    Out::Done,
                );
                if *delta < 0 {
                    push(Q::PruneOpen, vec![p(i(*ino)), p(i(*session))], Out::Done);
                }
            }
            Op::SetXattr {
                ino,
                name,
                value,
                mode,
            } => {
                let q = match mode {
                    XattrMode::Any => Q::SetXattrAny,
                    XattrMode::Create => Q::SetXattrCreate,
                    XattrMode::Replace => Q::SetXattrReplace,
                };
                push(q, vec![p(i(*ino)), p(name), p(value)], Out::Done)
            }
            Op::RemoveXattr { ino, name } => {
                push(Q::RemoveXattrOp, vec![p(i(*ino)), p(name)], Out::Done)
            }
            Op::GetInode(ino) => push(Q::GetInode, vec![p(i(*ino))], Out::Row),
            Op::ReleaseHeldOpens(id) => {
                push(Q::ReleaseHeldOpenRows, vec![p(i(*id))], Out::Done);
                push(Q::DeleteKv, vec![p(crate::held_opens_key(*id))], Out::Done);
            }
            Op::ExpireSession {
                id,
                stale_before_ns,
                hold_opens,
            } => {
                push(
                    Q::ExpireSessionRow,
                    vec![p(i(*id)), p(*stale_before_ns)],
                    Out::Purged,
                );
                if let Some(held) = hold_opens {
                    push(
                        Q::HoldSessionOpens,
                        vec![p(i(*id)), p(crate::held_opens_key(*id)), p(held.record())],
                        Out::Done,
                    );
                }
                push(Q::ExpireSessionOpens, vec![p(i(*id))], Out::Done);
                push(Q::ExpireSessionLocks, vec![p(i(*id))], Out::Done);
            }
        }
    }
    v
}

/// Whether an op changes rows the change-feed triggers watch.
fn feeds(op: &Op) -> bool {
    matches!(
        op,
        Op::TouchDir { .. }
            | Op::InsertDentry { .. }
            | Op::DeleteDentry { .. }
            | Op::MoveDentry { .. }
            | Op::RepointDentry { .. }
            | Op::AddNlink { .. }
            | Op::SetAttrs { .. }
            | Op::CommitContent { .. }
            | Op::Purge(_)
            | Op::DeleteInode(_)
    )
}

type Answer = std::result::Result<Vec<Row>, tokio_postgres::Error>;
type Pending<'a> = Pin<Box<dyn Future<Output = Answer> + 'a>>;

/// What one pipelined attempt came to.
enum Attempt {
    Applied(Vec<Vec<Row>>),
    /// Not applied; retry only if retryable (and `safe`).
    Failed {
        err: MetaError,
        /// The connection must not be reused.
        broken: bool,
        /// Nothing was committed for certain (a retry cannot apply the batch twice).
        safe: bool,
    },
}

/// Sends `BEGIN`, every statement and `COMMIT` without waiting, then collects the
/// answers. Returns them in order (first = `BEGIN`, last = `COMMIT`) and whether the
/// connection was already closed when `COMMIT` was to be sent (so it never was).
async fn pipeline(conn: &Conn, stmts: &[Stmt<'_>]) -> (Vec<Answer>, bool) {
    let client = &conn.client;
    let refs: Vec<Vec<&(dyn ToSql + Sync)>> = stmts
        .iter()
        .map(|s| {
            s.params
                .iter()
                .map(|b| &**b as &(dyn ToSql + Sync))
                .collect()
        })
        .collect();
    let mut slots: Vec<Option<Pending<'_>>> = Vec::with_capacity(stmts.len() + 2);
    slots.push(Some(Box::pin(client.query(conn.stmt(Q::BeginBatch), &[]))));
    for (s, r) in stmts.iter().zip(&refs) {
        slots.push(Some(Box::pin(client.query(conn.stmt(s.q), r))));
    }
    slots.push(Some(Box::pin(client.query(conn.stmt(Q::Commit), &[]))));
    let n = slots.len();
    let mut answers: Vec<Option<Answer>> = (0..n).map(|_| None).collect();
    let mut first = true;
    let mut commit_unsent = false;
    std::future::poll_fn(|cx| {
        // In index order: each future's first poll writes its request, so the requests
        // reach the connection in batch order.
        for (k, slot) in slots.iter_mut().enumerate() {
            if let Some(f) = slot {
                if first && k == n - 1 {
                    commit_unsent = client.is_closed();
                }
                if let Poll::Ready(a) = f.as_mut().poll(cx) {
                    answers[k] = Some(a);
                    *slot = None;
                }
            }
        }
        first = false;
        if slots.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    drop(slots);
    let answers = answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Ok(Vec::new())))
        .collect();
    (answers, commit_unsent)
}

/// The [`MetaError`] for the failure of statement `s` of `ops`.
fn step_error(e: &tokio_postgres::Error, s: &Stmt<'_>, ops: &[Op]) -> MetaError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        if code == SQLSTATE_EXPECT {
            let what = match db.detail().unwrap_or_default() {
                "dir_alive" => Expect::DirAlive,
                "name_free" => Expect::NameFree,
                "entry_is" => Expect::EntryIs,
                "dir_empty" => Expect::DirEmpty,
                "not_ancestor" => Expect::NotAncestor,
                "inode_exists" => Expect::InodeExists,
                "xattr_absent" => Expect::XattrAbsent,
                "xattr_present" => Expect::XattrPresent,
                "attrs" => Expect::Attrs,
                "linked" => Expect::Linked,
                other => {
                    return MetaError::Internal(format!("unknown batch expectation {other:?}"))
                }
            };
            return MetaError::Precondition { step: s.step, what };
        }
        if code == SQLSTATE_FENCED {
            if let Some(Op::CheckSession(id)) = ops.get(s.step) {
                return MetaError::Fenced(*id);
            }
        }
        if code == "23505" && matches!(s.q, Q::InsertDentryOp | Q::MoveDentryOp) {
            return MetaError::Precondition {
                step: s.step,
                what: Expect::NameFree,
            };
        }
    }
    map_err(e)
}

fn run_once(inner: &Inner, conn: &Conn, ops: &[Op], stmts: &[Stmt<'_>]) -> Attempt {
    inner.counters.add_round_trip();
    let (answers, commit_unsent) = match inner.wait(conn, Q::Commit, pipeline(conn, stmts)) {
        Ok(r) => r,
        Err(e) => {
            return Attempt::Failed {
                err: MetaError::Unreachable(format!(
                    "{e}; the batch may or may not have been applied"
                )),
                broken: true,
                safe: false,
            }
        }
    };
    let broken = answers
        .iter()
        .any(|a| a.as_ref().err().is_some_and(is_conn_error));
    // The first statement that failed for a reason other than a lost connection aborted
    // the transaction on the server: nothing was applied.
    let n = stmts.len();
    let begin_err = answers[0].as_ref().err();
    if let Some(e) = begin_err.filter(|e| !is_conn_error(e)) {
        return Attempt::Failed {
            err: map_err(e),
            broken,
            safe: true,
        };
    }
    for (k, s) in stmts.iter().enumerate() {
        if let Err(e) = &answers[k + 1] {
            if !is_conn_error(e) {
                return Attempt::Failed {
                    err: step_error(e, s, ops),
                    broken,
                    safe: true,
                };
            }
            break;
        }
    }
    if broken {
        // Certainly not applied when COMMIT never left, or when the server ended the
        // session (a FATAL answer, in order) before reaching COMMIT.
        let fatal_before_commit = answers[..=n]
            .iter()
            .find_map(|a| a.as_ref().err())
            .is_some_and(|e| e.as_db_error().is_some());
        let safe = commit_unsent || fatal_before_commit;
        return Attempt::Failed {
            err: MetaError::Unreachable(if safe {
                "connection to the database lost before the batch was applied".into()
            } else {
                "connection to the database lost while applying a batch; it may or may not \
                 have been applied"
                    .into()
            }),
            broken,
            safe,
        };
    }
    if let Err(e) = &answers[n + 1] {
        return Attempt::Failed {
            err: map_err(e),
            broken,
            safe: true,
        };
    }
    let mut rows = answers;
    rows.pop();
    Attempt::Applied(
        rows.into_iter()
            .skip(1)
            .map(|a| a.unwrap_or_default())
            .collect(),
    )
}

fn outputs(ops: &[Op], stmts: &[Stmt<'_>], rows: Vec<Vec<Row>>) -> Result<Vec<OpOut>> {
    let mut out = vec![OpOut::Done; ops.len()];
    for (s, rs) in stmts.iter().zip(rows) {
        let first = rs.first();
        out[s.step] = match s.out {
            Out::Done | Out::Lock | Out::Logged => continue,
            Out::Version => match first {
                Some(r) => OpOut::Version(col::<i64>(r, 1)? as u64),
                None => return Err(MetaError::Internal("CommitContent returned no row".into())),
            },
            Out::Purged => match first {
                Some(r) => OpOut::Purged(col::<i64>(r, 0)? > 0),
                None => return Err(MetaError::Internal("Purge returned no row".into())),
            },
            Out::Row => OpOut::Row(match first {
                Some(r) => Some(rows::inode(r, 0)?),
                None => None,
            }),
        };
    }
    Ok(out)
}

/// Applies `ops` atomically in one round trip per attempt; retried on serialization
/// failures and deadlocks (with backoff) and on a connection found dead before the batch
/// could commit.
pub(super) fn apply(inner: &Inner, ops: &[Op]) -> Result<Vec<OpOut>> {
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let mut stmts = plan(ops);
    let logging = inner.session.load(std::sync::atomic::Ordering::Relaxed) != 0;
    if logging && ops.iter().any(feeds) {
        stmts.push(Stmt {
            q: Q::Logged,
            params: Vec::new(),
            step: ops.len() - 1,
            out: Out::Logged,
        });
    }
    let mut conn_retries = 0;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut lease = match inner.lease() {
            Ok(l) => l,
            Err(e) => return Err(inner.count_err(e)),
        };
        let res = match lease.conn() {
            Ok(conn) => run_once(inner, conn, ops, &stmts),
            Err(e) => Attempt::Failed {
                err: e,
                broken: true,
                safe: true,
            },
        };
        match res {
            Attempt::Applied(rows) => {
                lease.release();
                inner.counters.add_commit();
                let logged = stmts.iter().zip(&rows).any(|(s, r)| {
                    s.out == Out::Logged
                        && r.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true)
                });
                if logged {
                    inner.changed();
                }
                return outputs(ops, &stmts, rows);
            }
            Attempt::Failed { err, broken, safe } => {
                if broken {
                    drop(lease);
                } else {
                    lease.release();
                }
                if err.is_retryable() && attempt < TXN_ATTEMPTS {
                    inner.counters.add_retry();
                    tracing::debug!(attempt, error = %err, "postgres batch retried");
                    std::thread::sleep(crate::retry_backoff(attempt));
                    continue;
                }
                if broken && safe && conn_retries < 2 {
                    conn_retries += 1;
                    inner.counters.add_retry();
                    tracing::debug!(error = %err, "postgres batch retried on a new connection");
                    continue;
                }
                return Err(inner.count_err(err));
            }
        }
    }
}
