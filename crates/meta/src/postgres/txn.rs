//! Interactive transactions ([`MetaEngine::txn`] / [`MetaEngine::read`]): each
//! [`MetaTxn`] method is one prepared statement, one round trip. `BEGIN` is not a round
//! trip of its own: it is pipelined with the first statement (a closure that sends
//! nothing costs nothing). Writes end with `COMMIT` (one round trip); reads, and writes
//! that failed, end with a `ROLLBACK` that is queued on the connection without waiting
//! for its answer (the next user of the connection queues behind it).
//!
//! Isolation: REPEATABLE READ for writes (a conflicting concurrent update fails with
//! SQLSTATE 40001 and the closure runs again), REPEATABLE READ READ ONLY for reads.
//!
//! [`MetaEngine::txn`]: crate::MetaEngine::txn
//! [`MetaEngine::read`]: crate::MetaEngine::read

use futures::FutureExt;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::pool::{is_conn_error, Conn};
use super::rows::{self, col, col_u32, col_u64, InodeParams};
use super::sql::Q;
use super::Inner;
use crate::sqlite::MAX_COALESCE_NS;
use crate::{
    Dentry, Ino, InodeRow, LockRow, MetaError, MetaTxn, ObjectRow, PendingRow, PendingStats,
    Result, SessionRow, Usage, XattrLook, ROOT_INO,
};

/// One interactive transaction on one leased connection.
pub(super) struct PgTxn<'a> {
    inner: &'a Inner,
    conn: &'a Conn,
    /// The `BEGIN` still to send (with the first statement).
    begin: Option<Q>,
    /// A statement failed: the server aborted the transaction (SQLSTATE and message of
    /// the first failure).
    failed: Option<(Option<String>, String)>,
    /// The connection is unusable (lost, timed out): it must not go back to the pool.
    pub broken: bool,
    /// A `COMMIT` may have reached the server without its answer coming back.
    pub commit_unknown: bool,
    /// Inodes or dentries were written (the change feed may have entries).
    pub touched: bool,
    /// The committed transaction logged change-feed rows.
    pub logged: bool,
}

type Param<'p> = &'p (dyn ToSql + Sync);

impl<'a> PgTxn<'a> {
    pub fn new(inner: &'a Inner, conn: &'a Conn, begin: Q) -> PgTxn<'a> {
        PgTxn {
            inner,
            conn,
            begin: Some(begin),
            failed: None,
            broken: false,
            commit_unknown: false,
            touched: false,
            logged: false,
        }
    }

    fn began(&self) -> bool {
        self.begin.is_none()
    }

    fn note_err(&mut self, e: &tokio_postgres::Error) -> MetaError {
        if is_conn_error(e) {
            self.broken = true;
        }
        let m = super::pool::map_err(e);
        if let MetaError::Db { code, message } = &m {
            if self.failed.is_none() {
                self.failed = Some((code.clone(), message.clone()));
            }
        }
        m
    }

    /// Runs `q` (after the pending `BEGIN`, in the same round trip) and returns its rows.
    fn query(&mut self, q: Q, params: &[Param<'_>]) -> Result<Vec<Row>> {
        let conn = self.conn;
        let begin = self.begin.take().map(|b| conn.stmt(b));
        self.inner.counters.add_round_trip();
        let res = self.inner.wait(conn, q, async {
            match begin {
                Some(b) => {
                    let (rb, rq) = futures::future::join(
                        conn.client.execute(b, &[]),
                        conn.client.query(conn.stmt(q), params),
                    )
                    .await;
                    rb?;
                    rq
                }
                None => conn.client.query(conn.stmt(q), params).await,
            }
        });
        match res {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(self.note_err(&e)),
            Err(timeout) => {
                self.broken = true;
                Err(timeout)
            }
        }
    }

    /// Runs `q` and returns the number of rows it changed.
    /// Takes the transaction-level advisory lock of `key` (the first statement of a keyed
    /// transaction).
    pub(super) fn key_lock(&mut self, key: u64) -> Result<()> {
        let k = key.to_string();
        self.query(Q::KeyLock, &[&k])?;
        Ok(())
    }

    fn exec(&mut self, q: Q, params: &[Param<'_>]) -> Result<u64> {
        let conn = self.conn;
        let begin = self.begin.take().map(|b| conn.stmt(b));
        self.inner.counters.add_round_trip();
        let res = self.inner.wait(conn, q, async {
            match begin {
                Some(b) => {
                    let (rb, rq) = futures::future::join(
                        conn.client.execute(b, &[]),
                        conn.client.execute(conn.stmt(q), params),
                    )
                    .await;
                    rb?;
                    rq
                }
                None => conn.client.execute(conn.stmt(q), params).await,
            }
        });
        match res {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => Err(self.note_err(&e)),
            Err(timeout) => {
                self.broken = true;
                Err(timeout)
            }
        }
    }

    fn one(&mut self, q: Q, params: &[Param<'_>]) -> Result<Row> {
        self.query(q, params)?
            .into_iter()
            .next()
            .ok_or_else(|| MetaError::Internal(format!("postgres: {q:?} returned no row")))
    }

    fn opt(&mut self, q: Q, params: &[Param<'_>]) -> Result<Option<Row>> {
        Ok(self.query(q, params)?.into_iter().next())
    }

    /// Queues `ROLLBACK` without waiting for its answer (0 round trips).
    fn queue_rollback(&mut self) {
        if !self.began() || self.broken {
            return;
        }
        let fut = self.conn.client.execute(self.conn.stmt(Q::Rollback), &[]);
        // The first poll hands the request to the connection (in order, before any later
        // user's); the answer is not awaited.
        if let Some(Err(e)) = fut.now_or_never() {
            if is_conn_error(&e) {
                self.broken = true;
            }
        }
    }

    /// Ends a write transaction whose closure succeeded: `COMMIT` (one round trip), or
    /// the first statement error when the server already aborted the transaction.
    pub fn commit(&mut self) -> Result<()> {
        if !self.began() {
            return Ok(());
        }
        if let Some((code, message)) = self.failed.take() {
            self.queue_rollback();
            return Err(MetaError::Db {
                code,
                message: format!("transaction aborted by an earlier failed statement: {message}"),
            });
        }
        let conn = self.conn;
        // Whether the feed got rows is asked in the same round trip as COMMIT.
        let ask = self.touched
            && self
                .inner
                .session
                .load(std::sync::atomic::Ordering::Relaxed)
                != 0;
        self.inner.counters.add_round_trip();
        let res = self.inner.wait(conn, Q::Commit, async {
            let logged = async {
                if ask {
                    conn.client.query(conn.stmt(Q::Logged), &[]).await.map(Some)
                } else {
                    Ok(None)
                }
            };
            let (l, c) =
                futures::future::join(logged, conn.client.execute(conn.stmt(Q::Commit), &[])).await;
            // A failed query before COMMIT aborts the transaction (COMMIT then answers
            // ROLLBACK): its error is the outcome.
            let l = l?;
            c?;
            Ok::<_, tokio_postgres::Error>(l)
        });
        match res {
            Ok(Ok(rows)) => {
                self.logged = rows
                    .and_then(|r| r.into_iter().next())
                    .and_then(|r| r.try_get::<_, bool>(0).ok())
                    .unwrap_or(false);
                Ok(())
            }
            Ok(Err(e)) => {
                let m = self.note_err(&e);
                if self.broken {
                    self.commit_unknown = true;
                    return Err(MetaError::Unreachable(format!(
                        "connection lost while committing; the transaction may or may not have committed ({m})"
                    )));
                }
                Err(m)
            }
            Err(timeout) => {
                self.broken = true;
                self.commit_unknown = true;
                Err(timeout)
            }
        }
    }

    /// Ends a read-only transaction, or a write transaction whose closure failed.
    pub fn finish_without_commit(&mut self) {
        self.queue_rollback();
    }
}

fn i(v: u64) -> i64 {
    v as i64
}

fn dentry_row(r: &Row) -> Result<Dentry> {
    Ok(Dentry {
        cookie: col_u64(r, 0)?,
        parent: col_u64(r, 1)?,
        name: col(r, 2)?,
        ino: col_u64(r, 3)?,
    })
}

impl MetaTxn for PgTxn<'_> {
    fn get_inode(&mut self, ino: Ino) -> Result<Option<InodeRow>> {
        match self.opt(Q::GetInode, &[&i(ino)])? {
            Some(r) => Ok(Some(rows::inode(&r, 0)?)),
            None => Ok(None),
        }
    }

    fn insert_inode(&mut self, row: &InodeRow) -> Result<Ino> {
        let p = InodeParams::of(row);
        let r = self.one(Q::InsertInode, &p.refs())?;
        col_u64(&r, 0)
    }

    fn update_inode(&mut self, row: &InodeRow) -> Result<()> {
        self.touched = true;
        let p = InodeParams::of(row);
        let ino = i(row.ino);
        let mut params: Vec<Param<'_>> = vec![&ino];
        params.extend_from_slice(&p.refs());
        if self.exec(Q::UpdateInode, &params)? == 0 {
            return Err(MetaError::NotFound(format!("inode {}", row.ino)));
        }
        Ok(())
    }

    fn delete_inode(&mut self, ino: Ino) -> Result<()> {
        self.touched = true;
        self.exec(Q::DeleteInode, &[&i(ino)])?;
        Ok(())
    }

    fn scan_inodes(&mut self, after: Ino, limit: usize) -> Result<Vec<InodeRow>> {
        self.query(Q::ScanInodes, &[&i(after), &(limit as i64)])?
            .iter()
            .map(|r| rows::inode(r, 0))
            .collect()
    }

    fn scan_dentries(&mut self, after: u64, limit: usize) -> Result<Vec<Dentry>> {
        self.query(Q::ScanDentries, &[&i(after), &(limit as i64)])?
            .iter()
            .map(dentry_row)
            .collect()
    }

    fn set_nlink(&mut self, ino: Ino, nlink: u32) -> Result<()> {
        self.touched = true;
        self.exec(Q::SetNlink, &[&i(ino), &i64::from(nlink)])?;
        Ok(())
    }

    fn orphan_inodes(&mut self) -> Result<Vec<Ino>> {
        self.query(Q::OrphanInodes, &[])?
            .iter()
            .map(|r| col_u64(r, 0))
            .collect()
    }

    fn dirty_inodes(&mut self) -> Result<Vec<InodeRow>> {
        self.query(Q::DirtyInodes, &[])?
            .iter()
            .map(|r| rows::inode(r, 0))
            .collect()
    }

    fn dirty_caches(&mut self) -> Result<Vec<u64>> {
        self.query(Q::DirtyCaches, &[])?
            .iter()
            .map(|r| col_u64(r, 0))
            .collect()
    }

    fn dirty_in_cache(&mut self, cache: u64) -> Result<u64> {
        let rows = self.query(Q::DirtyInCache, &[&i(cache)])?;
        match rows.first() {
            Some(r) => col_u64(r, 0),
            None => Ok(0),
        }
    }

    fn lookup(&mut self, parent: Ino, name: &[u8]) -> Result<Option<Dentry>> {
        match self.opt(Q::LookupDentry, &[&i(parent), &name])? {
            Some(r) => Ok(Some(Dentry {
                cookie: col_u64(&r, 0)?,
                parent,
                name: name.to_vec(),
                ino: col_u64(&r, 1)?,
            })),
            None => Ok(None),
        }
    }

    fn insert_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()> {
        self.touched = true;
        // ON CONFLICT DO NOTHING: a taken name is reported without aborting the
        // transaction (the closure may go on, as it can on SQLite).
        if self
            .query(Q::InsertDentry, &[&i(parent), &name, &i(ino)])?
            .is_empty()
        {
            return Err(MetaError::Conflict(String::from_utf8_lossy(name).into()));
        }
        Ok(())
    }

    fn delete_dentry(&mut self, parent: Ino, name: &[u8]) -> Result<()> {
        self.touched = true;
        self.exec(Q::DeleteDentry, &[&i(parent), &name])?;
        Ok(())
    }

    fn move_dentry(
        &mut self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
    ) -> Result<()> {
        self.touched = true;
        let n = self.exec(
            Q::MoveDentry,
            &[&i(parent), &name, &i(new_parent), &new_name],
        )?;
        if n == 0 {
            return Err(MetaError::NotFound(String::from_utf8_lossy(name).into()));
        }
        Ok(())
    }

    fn repoint_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()> {
        self.touched = true;
        if self.exec(Q::RepointDentry, &[&i(parent), &name, &i(ino)])? == 0 {
            return Err(MetaError::NotFound(String::from_utf8_lossy(name).into()));
        }
        Ok(())
    }

    fn list_dir(
        &mut self,
        parent: Ino,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(Dentry, InodeRow)>> {
        self.query(Q::ListDir, &[&i(parent), &i(after), &(limit as i64)])?
            .iter()
            .map(|r| {
                let inode = rows::inode(r, 2)?;
                Ok((
                    Dentry {
                        cookie: col_u64(r, 0)?,
                        parent,
                        name: col(r, 1)?,
                        ino: inode.ino,
                    },
                    inode,
                ))
            })
            .collect()
    }

    fn has_children(&mut self, parent: Ino) -> Result<bool> {
        col(&self.one(Q::HasChildren, &[&i(parent)])?, 0)
    }

    fn count_children(&mut self, parent: Ino, cap: u64) -> Result<u64> {
        col_u64(
            &self.one(
                Q::CountChildren,
                &[&i(parent), &i(cap.min(i64::MAX as u64))],
            )?,
            0,
        )
    }

    fn names_of(&mut self, ino: Ino) -> Result<Vec<(Ino, Vec<u8>)>> {
        self.query(Q::NamesOf, &[&i(ino)])?
            .iter()
            .map(|r| Ok((col_u64(r, 0)?, col(r, 1)?)))
            .collect()
    }

    fn paths_of(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        if ino == ROOT_INO {
            return Ok(vec![Vec::new()]);
        }
        self.query(Q::PathsOf, &[&i(ino)])?
            .iter()
            .map(|r| col(r, 0))
            .collect()
    }

    fn resolve(&mut self, path: &[u8]) -> Result<Option<Ino>> {
        if path.is_empty() {
            return Ok(Some(ROOT_INO));
        }
        // One statement for the whole walk (a round trip per name cost the uploader
        // ten statements per deep path).
        let segs: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
        let n = i32::try_from(segs.len()).unwrap_or(i32::MAX);
        match self.opt(Q::ResolvePath, &[&i(ROOT_INO), &segs, &n])? {
            Some(r) => Ok(Some(col_u64(&r, 0)?)),
            None => Ok(None),
        }
    }

    fn get_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.opt(Q::GetXattr, &[&i(ino), &name])? {
            Some(r) => Ok(Some(col(&r, 0)?)),
            None => Ok(None),
        }
    }

    fn look_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<XattrLook> {
        let Some(r) = self.opt(Q::LookXattr, &[&i(ino), &name])? else {
            return Err(MetaError::Internal(
                "postgres: look_xattr returned no row".into(),
            ));
        };
        let exists: bool = col(&r, 0)?;
        let value: Option<Vec<u8>> = col(&r, 1)?;
        let any: bool = col(&r, 2)?;
        Ok(match (exists, value) {
            (false, _) => XattrLook::NoInode,
            (true, Some(v)) => XattrLook::Value(v),
            (true, None) => XattrLook::Missing { any },
        })
    }

    fn set_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        self.exec(Q::SetXattrAny, &[&i(ino), &name, &value])?;
        Ok(())
    }

    fn remove_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<bool> {
        Ok(self.exec(Q::RemoveXattr, &[&i(ino), &name])? > 0)
    }

    fn list_xattrs(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.query(Q::ListXattrs, &[&i(ino)])?
            .iter()
            .map(|r| col(r, 0))
            .collect()
    }

    fn get_object(&mut self, path: &[u8]) -> Result<Option<ObjectRow>> {
        match self.opt(Q::GetObject, &[&path])? {
            Some(r) => Ok(Some(rows::object(&r)?)),
            None => Ok(None),
        }
    }

    fn get_objects(&mut self, paths: &[Vec<u8>]) -> Result<Vec<ObjectRow>> {
        if paths.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self.query(Q::GetObjects, &[&paths])?;
        rows.iter().map(rows::object).collect()
    }

    fn put_object(&mut self, row: &ObjectRow) -> Result<()> {
        self.exec(
            Q::PutObject,
            &[
                &row.path,
                &row.key,
                &i(row.ino),
                &rows::kind_code(row.kind),
                &i(row.data_version),
                &row.meta_stamp,
                &row.etag,
                &i(row.size),
            ],
        )?;
        Ok(())
    }

    fn delete_object(&mut self, path: &[u8]) -> Result<()> {
        self.exec(Q::DeleteObject, &[&path])?;
        Ok(())
    }

    fn objects_under(&mut self, dir: &[u8], limit: usize) -> Result<Vec<ObjectRow>> {
        let rows = if dir.is_empty() {
            self.query(Q::ObjectsAll, &[&(limit as i64)])?
        } else {
            let (lo, hi) = rows::subtree_bounds(dir);
            self.query(Q::ObjectsUnder, &[&lo, &hi, &(limit as i64)])?
        };
        rows.iter().map(rows::object).collect()
    }

    fn object_with_content(&mut self, ino: Ino, data_version: u64) -> Result<Option<ObjectRow>> {
        match self.opt(Q::ObjectWithContent, &[&i(ino), &i(data_version)])? {
            Some(r) => Ok(Some(rows::object(&r)?)),
            None => Ok(None),
        }
    }

    fn mark_pending(&mut self, path: &[u8], recursive: bool, not_before_ns: i64) -> Result<u64> {
        let r = self.one(
            Q::MarkPending,
            &[&path, &recursive, &not_before_ns, &MAX_COALESCE_NS],
        )?;
        col_u64(&r, 0)
    }

    fn remark_pending(
        &mut self,
        path: &[u8],
        recursive: bool,
        not_before_ns: i64,
        seq: u64,
    ) -> Result<()> {
        self.exec(
            Q::RemarkPending,
            &[
                &path,
                &recursive,
                &not_before_ns,
                &MAX_COALESCE_NS,
                &crate::seq_bound(seq),
            ],
        )?;
        Ok(())
    }

    fn due_pending(&mut self, now_ns: i64, limit: usize) -> Result<Vec<PendingRow>> {
        self.query(Q::DuePending, &[&now_ns, &(limit as i64)])?
            .iter()
            .map(rows::pending)
            .collect()
    }

    fn due_pending_for(
        &mut self,
        now_ns: i64,
        limit: usize,
        me: u64,
        others_ns: i64,
    ) -> Result<Vec<PendingRow>> {
        self.query(
            Q::DuePendingFor,
            &[&now_ns, &(limit as i64), &i(me), &others_ns.min(now_ns)],
        )?
        .iter()
        .map(rows::pending)
        .collect()
    }

    fn finish_pending(&mut self, path: &[u8], gen: u64) -> Result<()> {
        self.exec(Q::FinishPending, &[&path, &i(gen)])?;
        Ok(())
    }

    fn fail_pending(&mut self, path: &[u8], gen: u64, error: &str, retry_at_ns: i64) -> Result<()> {
        self.exec(Q::FailPending, &[&path, &i(gen), &error, &retry_at_ns])?;
        Ok(())
    }

    fn defer_pending(&mut self, path: &[u8], gen: u64, retry_at_ns: i64) -> Result<()> {
        self.exec(Q::DeferPending, &[&path, &i(gen), &retry_at_ns])?;
        Ok(())
    }

    fn disown_pending(&mut self, path: &[u8], gen: u64) -> Result<()> {
        self.exec(Q::DisownPending, &[&path, &i(gen)])?;
        Ok(())
    }

    fn is_pending(&mut self, path: &[u8]) -> Result<bool> {
        // Every ancestor directory path, for its recursive marks: one statement.
        let ancestors: Vec<&[u8]> = path
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .map(|(k, _)| &path[..k])
            .collect();
        col(&self.one(Q::IsPending, &[&path, &ancestors])?, 0)
    }

    /// `last_seq` is the pending sequence's last value. A sync barrier reads it and waits
    /// for rows with `seq <=` it: every mark committed before the read took its number
    /// from the sequence before committing, and a sequence only grows (non-transactional,
    /// one shared counter, CACHE 1), so its number is `<=` the value read — what the
    /// barrier needs, without a counter row that every writer would lock until commit.
    fn pending_stats(&mut self) -> Result<PendingStats> {
        let r = self.one(Q::PendingStats, &[])?;
        Ok(PendingStats {
            pending: col_u64(&r, 0)?,
            failing: col_u64(&r, 1)?,
            last_seq: col_u64(&r, 2)?,
        })
    }

    fn pending_last_seq(&mut self) -> Result<u64> {
        col_u64(&self.one(Q::PendingLastSeq, &[])?, 0)
    }

    fn pending_upto(&mut self, upto: u64) -> Result<bool> {
        col(&self.one(Q::PendingUpto, &[&crate::seq_bound(upto)])?, 0)
    }

    fn pending_under(&mut self, dir: &[u8], upto: u64, limit: usize) -> Result<Vec<PendingRow>> {
        let rows = if dir.is_empty() {
            self.query(
                Q::PendingUptoRows,
                &[&crate::seq_bound(upto), &(limit as i64)],
            )?
        } else {
            let (lo, hi) = rows::subtree_bounds(dir);
            self.query(
                Q::PendingUnder,
                &[&crate::seq_bound(upto), &dir, &lo, &hi, &(limit as i64)],
            )?
        };
        rows.iter().map(rows::pending).collect()
    }

    fn failed_pending(&mut self, limit: usize) -> Result<Vec<PendingRow>> {
        self.query(Q::FailedPending, &[&(limit as i64)])?
            .iter()
            .map(rows::pending)
            .collect()
    }

    fn db_now_ns(&mut self) -> Result<i64> {
        col(&self.one(Q::DbNow, &[])?, 0)
    }

    fn register_session(&mut self, host: &str, pid: u32, now_ns: i64) -> Result<u64> {
        let r = self.one(Q::RegisterSession, &[&host, &i64::from(pid), &now_ns])?;
        col_u64(&r, 0)
    }

    fn heartbeat(&mut self, session: u64, now_ns: i64) -> Result<()> {
        if self.exec(Q::Heartbeat, &[&i(session), &now_ns])? == 0 {
            return Err(MetaError::NotFound(format!("session {session}")));
        }
        Ok(())
    }

    fn sessions(&mut self) -> Result<Vec<SessionRow>> {
        self.query(Q::Sessions, &[])?
            .iter()
            .map(|r| {
                Ok(SessionRow {
                    id: col_u64(r, 0)?,
                    host: col(r, 1)?,
                    pid: col_u32(r, 2)?,
                    heartbeat_ns: col(r, 3)?,
                })
            })
            .collect()
    }

    fn delete_session(&mut self, session: u64) -> Result<()> {
        self.exec(Q::DeleteSession, &[&i(session)])?;
        Ok(())
    }

    fn check_session(&mut self, session: u64) -> Result<()> {
        let n: i64 = col(&self.one(Q::CheckSessionTxn, &[&i(session)])?, 0)?;
        if n != 1 {
            return Err(MetaError::Fenced(session));
        }
        Ok(())
    }

    fn add_open(&mut self, ino: Ino, session: u64, delta: i64) -> Result<()> {
        self.query(Q::AddOpen, &[&i(ino), &i(session), &delta])?;
        if delta < 0 {
            self.query(Q::PruneOpen, &[&i(ino), &i(session)])?;
        }
        Ok(())
    }

    fn open_elsewhere(&mut self, ino: Ino, session: u64) -> Result<bool> {
        col(&self.one(Q::OpenElsewhere, &[&i(ino), &i(session)])?, 0)
    }

    fn locks_on(&mut self, ino: Ino) -> Result<Vec<LockRow>> {
        self.query(Q::LocksOn, &[&i(ino)])?
            .iter()
            .map(|r| {
                Ok(LockRow {
                    ino,
                    session: col_u64(r, 0)?,
                    owner: col_u64(r, 1)?,
                    write: col(r, 2)?,
                    start: col_u64(r, 3)?,
                    end: col_u64(r, 4)?,
                    pid: col_u32(r, 5)?,
                    fh: col_u64(r, 6)?,
                })
            })
            .collect()
    }

    fn set_owner_locks(
        &mut self,
        ino: Ino,
        session: u64,
        owner: u64,
        locks: &[LockRow],
    ) -> Result<()> {
        let write: Vec<bool> = locks.iter().map(|l| l.write).collect();
        let start: Vec<i64> = locks.iter().map(|l| i(l.start)).collect();
        let end: Vec<i64> = locks.iter().map(|l| i(l.end)).collect();
        let pid: Vec<i64> = locks.iter().map(|l| i64::from(l.pid)).collect();
        let fh: Vec<i64> = locks.iter().map(|l| i(l.fh)).collect();
        self.exec(
            Q::SetOwnerLocks,
            &[
                &i(ino),
                &i(session),
                &i(owner),
                &write,
                &start,
                &end,
                &pid,
                &fh,
            ],
        )?;
        Ok(())
    }

    fn delete_fh_locks(&mut self, ino: Ino, session: u64, owner: u64, fh: u64) -> Result<()> {
        self.exec(Q::DeleteFhLocks, &[&i(ino), &i(session), &i(owner), &i(fh)])?;
        Ok(())
    }

    fn session_lock_count(&mut self, session: u64) -> Result<u64> {
        col_u64(&self.one(Q::SessionLockCount, &[&i(session)])?, 0)
    }

    fn want_upload(&mut self, ino: Ino, cache: u64, now_ns: i64) -> Result<()> {
        self.exec(Q::WantUpload, &[&i(ino), &i(cache), &now_ns])?;
        Ok(())
    }

    fn wanted_for(&mut self, cache: u64) -> Result<Vec<Ino>> {
        self.query(Q::WantedFor, &[&i(cache)])?
            .iter()
            .map(|r| col_u64(r, 0))
            .collect()
    }

    fn clear_wanted(&mut self, ino: Ino) -> Result<()> {
        self.exec(Q::ClearWanted, &[&i(ino)])?;
        Ok(())
    }

    fn get_kv(&mut self, key: &str) -> Result<Option<String>> {
        match self.opt(Q::GetKv, &[&key])? {
            Some(r) => Ok(Some(col(&r, 0)?)),
            None => Ok(None),
        }
    }

    fn set_kv(&mut self, key: &str, value: &str) -> Result<()> {
        self.exec(Q::SetKv, &[&key, &value])?;
        Ok(())
    }

    fn delete_kv(&mut self, key: &str) -> Result<()> {
        self.exec(Q::DeleteKv, &[&key])?;
        Ok(())
    }

    fn kv_with_prefix(&mut self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.query(Q::KvPrefix, &[&prefix])?
            .iter()
            .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
            .collect()
    }

    fn usage(&mut self) -> Result<Usage> {
        let r = self.one(Q::Usage, &[])?;
        Ok(Usage {
            inodes: col_u64(&r, 0)?,
            bytes: col_u64(&r, 1)?,
            dirty_inodes: col_u64(&r, 2)?,
            dirty_bytes: col_u64(&r, 3)?,
        })
    }

    fn prune_changes(&mut self, before_ms: i64) -> Result<u64> {
        self.exec(Q::PruneChanges, &[&before_ms])
    }
}
