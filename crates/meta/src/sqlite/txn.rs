//! [`MetaTxn`] on one SQLite connection inside a transaction.

use rusqlite::{params, Connection, OptionalExtension};

/// The caches holding dirty content: a loose index scan of `inodes_dirty_local`, one
/// seek per distinct cache id (never a scan of the dirty rows).
pub(super) const DIRTY_CACHES_SQL: &str = "WITH RECURSIVE c(l) AS (
   SELECT (SELECT min(local) FROM inodes WHERE dirty=1 AND local > 0)
   UNION ALL
   SELECT (SELECT min(local) FROM inodes WHERE dirty=1 AND local > c.l)
     FROM c WHERE c.l IS NOT NULL)
 SELECT l FROM c WHERE l IS NOT NULL";

/// One page of a directory: entries after a cookie, in cookie order, with their inodes
/// (an index range on `dentries(parent, cookie)`).
pub(crate) const LIST_DIR_SQL: &str =
    "SELECT d.cookie, d.name, i.ino,i.kind,i.perm,i.uid,i.gid,i.rdev,i.nlink,i.size,
            i.atime,i.mtime,i.ctime,i.btime,i.data_version,i.target,i.local,i.dirty,i.listed
     FROM dentries d JOIN inodes i ON i.ino = d.ino
     WHERE d.parent=?1 AND d.cookie>?2 ORDER BY d.cookie LIMIT ?3";

use super::batch::{alloc_inos, insert_inode_at, next_seq};
use super::rows::*;
use crate::{
    BackupMark, Dentry, Ino, InodeRow, LockRow, MetaError, MetaTxn, ObjectRow, PendingRow,
    PendingStats, Result, SessionRow, Usage,
};

pub(super) struct SqlTxn<'c> {
    pub(super) conn: &'c Connection,
}

impl SqlTxn<'_> {
    fn next_seq(&mut self) -> Result<u64> {
        next_seq(self.conn)
    }
}

impl MetaTxn for SqlTxn<'_> {
    fn get_inode(&mut self, ino: Ino) -> Result<Option<InodeRow>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE ino=?1"))?;
        Ok(st
            .query_row(params![ino as i64], |r| inode_from_row(r, 0))
            .optional()?)
    }

    fn insert_inode(&mut self, row: &InodeRow) -> Result<Ino> {
        let ino = alloc_inos(self.conn, 1)?.start;
        insert_inode_at(self.conn, ino, row)?;
        Ok(ino)
    }

    fn update_inode(&mut self, row: &InodeRow) -> Result<()> {
        let mut st = self.conn.prepare_cached(
            "UPDATE inodes SET kind=?2,perm=?3,uid=?4,gid=?5,rdev=?6,nlink=?7,size=?8,atime=?9,
             mtime=?10,ctime=?11,btime=?12,data_version=?13,target=?14,local=?15,dirty=?16,
             listed=?17 WHERE ino=?1",
        )?;
        let n = st.execute(params![
            row.ino as i64,
            kind_code(row.kind),
            row.perm,
            row.uid,
            row.gid,
            row.rdev,
            row.nlink,
            row.size as i64,
            row.atime_ns,
            row.mtime_ns,
            row.ctime_ns,
            row.btime_ns,
            row.data_version as i64,
            row.target,
            row.local.code(),
            row.dirty as i64,
            row.listed_ns,
        ])?;
        if n == 0 {
            return Err(MetaError::NotFound(format!("inode {}", row.ino)));
        }
        Ok(())
    }

    fn delete_inode(&mut self, ino: Ino) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM inodes WHERE ino=?1")?
            .execute(params![ino as i64])?;
        self.conn
            .prepare_cached("DELETE FROM xattrs WHERE ino=?1")?
            .execute(params![ino as i64])?;
        Ok(())
    }

    fn scan_inodes(&mut self, after: Ino, limit: usize) -> Result<Vec<InodeRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {INODE_COLS} FROM inodes WHERE ino>?1 ORDER BY ino LIMIT ?2"
        ))?;
        let v = st
            .query_map(params![after as i64, limit as i64], |r| {
                inode_from_row(r, 0)
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn scan_dentries(&mut self, after: u64, limit: usize) -> Result<Vec<Dentry>> {
        let mut st = self.conn.prepare_cached(
            "SELECT cookie,parent,name,ino FROM dentries WHERE cookie>?1 ORDER BY cookie LIMIT ?2",
        )?;
        let v = st
            .query_map(params![after as i64, limit as i64], |r| {
                Ok(Dentry {
                    cookie: r.get::<_, i64>(0)? as u64,
                    parent: r.get::<_, i64>(1)? as u64,
                    name: r.get(2)?,
                    ino: r.get::<_, i64>(3)? as u64,
                })
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn set_nlink(&mut self, ino: Ino, nlink: u32) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE inodes SET nlink=?2 WHERE ino=?1")?
            .execute(params![ino as i64, nlink])?;
        Ok(())
    }

    fn orphan_inodes(&mut self) -> Result<Vec<Ino>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT ino FROM inodes WHERE nlink=0")?;
        let v = st
            .query_map([], |r| r.get::<_, i64>(0))?
            .map(|r| r.map(|i| i as u64))
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn dirty_inodes(&mut self) -> Result<Vec<InodeRow>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE dirty=1"))?;
        let v = st
            .query_map([], |r| inode_from_row(r, 0))?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn dirty_caches(&mut self) -> Result<Vec<u64>> {
        // A loose index scan of `inodes_dirty_local`: one seek per distinct cache.
        let mut st = self.conn.prepare_cached(DIRTY_CACHES_SQL)?;
        let v = st
            .query_map([], |r| r.get::<_, i64>(0))?
            .map(|r| r.map(|l| l as u64))
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn dirty_in_cache(&mut self, cache: u64) -> Result<u64> {
        let n: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM inodes WHERE dirty=1 AND local=?1")?
            .query_row(params![cache as i64], |r| r.get(0))?;
        Ok(n as u64)
    }

    fn lookup(&mut self, parent: Ino, name: &[u8]) -> Result<Option<Dentry>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT cookie,ino FROM dentries WHERE parent=?1 AND name=?2")?;
        Ok(st
            .query_row(params![parent as i64, name], |r| {
                Ok(Dentry {
                    cookie: r.get::<_, i64>(0)? as u64,
                    parent,
                    name: name.to_vec(),
                    ino: r.get::<_, i64>(1)? as u64,
                })
            })
            .optional()?)
    }

    fn insert_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()> {
        let mut st = self
            .conn
            .prepare_cached("INSERT INTO dentries(parent,name,ino) VALUES(?1,?2,?3)")?;
        match st.execute(params![parent as i64, name, ino as i64]) {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(MetaError::Conflict(String::from_utf8_lossy(name).into()))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn delete_dentry(&mut self, parent: Ino, name: &[u8]) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM dentries WHERE parent=?1 AND name=?2")?
            .execute(params![parent as i64, name])?;
        Ok(())
    }

    fn move_dentry(
        &mut self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
    ) -> Result<()> {
        let n = self
            .conn
            .prepare_cached("UPDATE dentries SET parent=?3, name=?4 WHERE parent=?1 AND name=?2")?
            .execute(params![parent as i64, name, new_parent as i64, new_name])?;
        if n == 0 {
            return Err(MetaError::NotFound(String::from_utf8_lossy(name).into()));
        }
        Ok(())
    }

    fn repoint_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()> {
        let n = self
            .conn
            .prepare_cached("UPDATE dentries SET ino=?3 WHERE parent=?1 AND name=?2")?
            .execute(params![parent as i64, name, ino as i64])?;
        if n == 0 {
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
        let mut st = self.conn.prepare_cached(LIST_DIR_SQL)?;
        let v = st
            .query_map(params![parent as i64, after as i64, limit as i64], |r| {
                let inode = inode_from_row(r, 2)?;
                Ok((
                    Dentry {
                        cookie: r.get::<_, i64>(0)? as u64,
                        parent,
                        name: r.get(1)?,
                        ino: inode.ino,
                    },
                    inode,
                ))
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn has_children(&mut self, parent: Ino) -> Result<bool> {
        let mut st = self
            .conn
            .prepare_cached("SELECT 1 FROM dentries WHERE parent=?1 LIMIT 1")?;
        Ok(st.exists(params![parent as i64])?)
    }

    fn count_children(&mut self, parent: Ino, cap: u64) -> Result<u64> {
        let mut st = self.conn.prepare_cached(
            "SELECT count(*) FROM (SELECT 1 FROM dentries WHERE parent=?1 LIMIT ?2)",
        )?;
        let n: i64 = st.query_row(
            params![parent as i64, cap.min(i64::MAX as u64) as i64],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    fn names_of(&mut self, ino: Ino) -> Result<Vec<(Ino, Vec<u8>)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT parent,name FROM dentries WHERE ino=?1 ORDER BY cookie")?;
        let v = st
            .query_map(params![ino as i64], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?))
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn paths_of(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        if ino == crate::ROOT_INO {
            return Ok(vec![Vec::new()]);
        }
        super::batch::paths_of(self.conn, ino)
    }

    fn get_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT value FROM xattrs WHERE ino=?1 AND name=?2")?;
        Ok(st
            .query_row(params![ino as i64, name], |r| r.get(0))
            .optional()?)
    }

    fn set_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO xattrs(ino,name,value) VALUES(?1,?2,?3)
                 ON CONFLICT(ino,name) DO UPDATE SET value=excluded.value",
            )?
            .execute(params![ino as i64, name, value])?;
        Ok(())
    }

    fn remove_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<bool> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM xattrs WHERE ino=?1 AND name=?2")?
            .execute(params![ino as i64, name])?;
        Ok(n > 0)
    }

    fn list_xattrs(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT name FROM xattrs WHERE ino=?1 ORDER BY name")?;
        let v = st
            .query_map(params![ino as i64], |r| r.get::<_, Vec<u8>>(0))?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn get_object(&mut self, path: &[u8]) -> Result<Option<ObjectRow>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {OBJECT_COLS} FROM objects WHERE path=?1"))?;
        Ok(st.query_row(params![path], object_from_row).optional()?)
    }

    fn put_object(&mut self, row: &ObjectRow) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO objects(path,key,ino,kind,data_version,meta_stamp,etag,size)
                 VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
            )?
            .execute(params![
                row.path,
                row.key,
                row.ino as i64,
                kind_code(row.kind),
                row.data_version as i64,
                row.meta_stamp,
                row.etag,
                row.size as i64
            ])?;
        Ok(())
    }

    fn delete_object(&mut self, path: &[u8]) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM objects WHERE path=?1")?
            .execute(params![path])?;
        Ok(())
    }

    fn objects_under(&mut self, dir: &[u8], limit: usize) -> Result<Vec<ObjectRow>> {
        let (lo, hi) = subtree_bounds(dir);
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {OBJECT_COLS} FROM objects WHERE path>=?1 AND path<?2 ORDER BY path LIMIT ?3"
        ))?;
        let v = st
            .query_map(params![lo, hi, limit as i64], object_from_row)?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn object_with_content(&mut self, ino: Ino, data_version: u64) -> Result<Option<ObjectRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {OBJECT_COLS} FROM objects WHERE ino=?1 AND data_version=?2 LIMIT 1"
        ))?;
        Ok(st
            .query_row(params![ino as i64, data_version as i64], object_from_row)
            .optional()?)
    }

    fn mark_pending(&mut self, path: &[u8], recursive: bool, not_before_ns: i64) -> Result<u64> {
        let seq = self.next_seq()?;
        super::batch::mark_one(self.conn, path, recursive, seq, not_before_ns)?;
        Ok(seq)
    }

    fn remark_pending(
        &mut self,
        path: &[u8],
        recursive: bool,
        not_before_ns: i64,
        seq: u64,
    ) -> Result<()> {
        super::batch::remark_one(self.conn, path, recursive, seq, not_before_ns)
    }

    fn due_pending(&mut self, now_ns: i64, limit: usize) -> Result<Vec<PendingRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {PENDING_COLS} FROM pending WHERE due<=?1 ORDER BY due LIMIT ?2"
        ))?;
        let v = st
            .query_map(params![now_ns, limit as i64], pending_from_row)?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn finish_pending(&mut self, path: &[u8], gen: u64) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM pending WHERE path=?1 AND gen=?2")?
            .execute(params![path, gen as i64])?;
        Ok(())
    }

    fn fail_pending(&mut self, path: &[u8], gen: u64, error: &str, retry_at_ns: i64) -> Result<()> {
        // A NUL would cut the value short in the redo log's expanded SQL.
        let error = error.replace('\0', "\u{fffd}");
        self.conn
            .prepare_cached(
                "UPDATE pending SET attempts=attempts+1, last_error=?3, due=?4
                 WHERE path=?1 AND gen=?2",
            )?
            .execute(params![path, gen as i64, error, retry_at_ns])?;
        Ok(())
    }

    fn defer_pending(&mut self, path: &[u8], gen: u64, retry_at_ns: i64) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE pending SET due=?3 WHERE path=?1 AND gen=?2")?
            .execute(params![path, gen as i64, retry_at_ns])?;
        Ok(())
    }

    fn is_pending(&mut self, path: &[u8]) -> Result<bool> {
        let mut st = self
            .conn
            .prepare_cached("SELECT recursive FROM pending WHERE path=?1")?;
        if st.exists(params![path])? {
            return Ok(true);
        }
        let mut anc = self
            .conn
            .prepare_cached("SELECT 1 FROM pending WHERE path=?1 AND recursive=1")?;
        for (i, b) in path.iter().enumerate() {
            if *b == b'/' && anc.exists(params![&path[..i]])? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn pending_stats(&mut self) -> Result<PendingStats> {
        let (pending, failing): (i64, i64) = self.conn.query_row(
            "SELECT count(*), coalesce(sum(attempts>0),0) FROM pending",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(PendingStats {
            pending: pending as u64,
            failing: failing as u64,
            last_seq: self.pending_last_seq()?,
        })
    }

    fn pending_last_seq(&mut self) -> Result<u64> {
        let last: Option<String> = self
            .conn
            .prepare_cached("SELECT value FROM kv WHERE key='pending_seq'")?
            .query_row([], |r| r.get(0))
            .optional()?;
        Ok(last.and_then(|s| s.parse().ok()).unwrap_or(0))
    }

    fn pending_upto(&mut self, upto: u64) -> Result<bool> {
        let mut st = self
            .conn
            .prepare_cached("SELECT 1 FROM pending WHERE seq<=?1 LIMIT 1")?;
        Ok(st.exists(params![crate::seq_bound(upto)])?)
    }

    fn pending_under(&mut self, dir: &[u8], upto: u64, limit: usize) -> Result<Vec<PendingRow>> {
        let (lo, hi) = subtree_bounds(dir);
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {PENDING_COLS} FROM pending
             WHERE seq<=?1 AND (path=?2 OR (path>=?3 AND path<?4)) ORDER BY seq LIMIT ?5"
        ))?;
        let v = st
            .query_map(
                params![crate::seq_bound(upto), dir, lo, hi, limit as i64],
                pending_from_row,
            )?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn failed_pending(&mut self, limit: usize) -> Result<Vec<PendingRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {PENDING_COLS} FROM pending WHERE attempts>0 ORDER BY due DESC LIMIT ?1"
        ))?;
        let v = st
            .query_map(params![limit as i64], pending_from_row)?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn db_now_ns(&mut self) -> Result<i64> {
        // One host: the database's clock is this machine's.
        Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0))
    }

    fn register_session(&mut self, host: &str, pid: u32, now_ns: i64) -> Result<u64> {
        self.conn
            .prepare_cached("INSERT INTO sessions(host,pid,started,heartbeat) VALUES(?1,?2,?3,?3)")?
            .execute(params![host, pid, now_ns])?;
        Ok(self.conn.last_insert_rowid() as u64)
    }

    fn heartbeat(&mut self, session: u64, now_ns: i64) -> Result<()> {
        let n = self
            .conn
            .prepare_cached("UPDATE sessions SET heartbeat=?2 WHERE id=?1")?
            .execute(params![session as i64, now_ns])?;
        if n == 0 {
            return Err(MetaError::NotFound(format!("session {session}")));
        }
        Ok(())
    }

    fn sessions(&mut self) -> Result<Vec<SessionRow>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id,host,pid,heartbeat FROM sessions ORDER BY id")?;
        let v = st
            .query_map([], |r| {
                Ok(SessionRow {
                    id: r.get::<_, i64>(0)? as u64,
                    host: r.get(1)?,
                    pid: r.get(2)?,
                    heartbeat_ns: r.get(3)?,
                })
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn delete_session(&mut self, session: u64) -> Result<()> {
        for sql in [
            "DELETE FROM sessions WHERE id=?1",
            "DELETE FROM open_files WHERE session=?1",
            "DELETE FROM locks WHERE session=?1",
        ] {
            self.conn
                .prepare_cached(sql)?
                .execute(params![session as i64])?;
        }
        Ok(())
    }

    fn backup_marks(&mut self, after: u64, limit: usize) -> Result<Vec<(u64, BackupMark)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT seq, ino, parent, name, path FROM backup_log WHERE seq > ?1 ORDER BY seq LIMIT ?2",
        )?;
        let rows = st.query_map(params![after as i64, limit as i64], |r| {
            let seq = r.get::<_, i64>(0)? as u64;
            let ino: Option<i64> = r.get(1)?;
            let parent: Option<i64> = r.get(2)?;
            let name: Option<Vec<u8>> = r.get(3)?;
            let path: Option<Vec<u8>> = r.get(4)?;
            Ok((seq, ino, parent, name, path))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, ino, parent, name, path) = row?;
            let mark = match (ino, parent, name, path) {
                (_, Some(parent), Some(name), _) => BackupMark::Dentry {
                    parent: parent as u64,
                    name,
                },
                (_, _, _, Some(path)) => BackupMark::Object(path),
                (Some(ino), _, _, _) => BackupMark::Inode(ino as u64),
                _ => {
                    return Err(MetaError::Internal(format!(
                        "backup_log row {seq} names nothing"
                    )))
                }
            };
            out.push((seq, mark));
        }
        Ok(out)
    }

    fn backup_mark_end(&mut self) -> Result<u64> {
        let n: i64 = self
            .conn
            .prepare_cached(
                "SELECT max(coalesce((SELECT max(seq) FROM backup_log), 0),
                            coalesce((SELECT seq FROM sqlite_sequence WHERE name='backup_log'), 0))",
            )?
            .query_row([], |r| r.get(0))?;
        Ok(n as u64)
    }

    fn trim_backup_marks(&mut self, upto: u64) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM backup_log WHERE seq <= ?1")?
            .execute(params![upto as i64])?;
        Ok(())
    }

    fn scan_objects(&mut self, after: &[u8], limit: usize) -> Result<Vec<ObjectRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {OBJECT_COLS} FROM objects WHERE path > ?1 ORDER BY path LIMIT ?2"
        ))?;
        let v = st
            .query_map(params![after, limit as i64], object_from_row)?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn xattrs_of(&mut self, ino: Ino) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT name, value FROM xattrs WHERE ino=?1 ORDER BY name")?;
        let v = st
            .query_map(params![ino as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn put_inode_at(&mut self, row: &InodeRow) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM inodes WHERE ino=?1")?
            .execute(params![row.ino as i64])?;
        insert_inode_at(self.conn, row.ino, row)?;
        self.conn
            .prepare_cached(
                "UPDATE kv SET value = CAST(max(CAST(value AS INTEGER), ?1 + 1) AS TEXT)
                 WHERE key='next_ino'",
            )?
            .execute(params![row.ino as i64])?;
        Ok(())
    }

    fn prune_changes(&mut self, before_ms: i64) -> Result<u64> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM changes WHERE ts < ?1")?
            .execute(params![before_ms])?;
        Ok(n as u64)
    }

    fn check_session(&mut self, session: u64) -> Result<()> {
        let live = self
            .conn
            .prepare_cached("SELECT 1 FROM sessions WHERE id=?1")?
            .exists(params![session as i64])?;
        if !live {
            return Err(MetaError::Fenced(session));
        }
        Ok(())
    }

    fn add_open(&mut self, ino: Ino, session: u64, delta: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO open_files(ino,session,count) VALUES(?1,?2,?3)
                 ON CONFLICT(ino,session) DO UPDATE SET count = count + excluded.count",
            )?
            .execute(params![ino as i64, session as i64, delta])?;
        self.conn
            .prepare_cached("DELETE FROM open_files WHERE ino=?1 AND session=?2 AND count<=0")?
            .execute(params![ino as i64, session as i64])?;
        Ok(())
    }

    fn open_elsewhere(&mut self, ino: Ino, session: u64) -> Result<bool> {
        let mut st = self.conn.prepare_cached(
            "SELECT 1 FROM open_files WHERE ino=?1 AND session<>?2 AND count>0 LIMIT 1",
        )?;
        Ok(st.exists(params![ino as i64, session as i64])?)
    }

    fn locks_on(&mut self, ino: Ino) -> Result<Vec<LockRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT session,owner,write,start,end_,pid,fh FROM locks WHERE ino=?1 ORDER BY start",
        )?;
        let v = st
            .query_map(params![ino as i64], |r| {
                Ok(LockRow {
                    ino,
                    session: r.get::<_, i64>(0)? as u64,
                    owner: r.get::<_, i64>(1)? as u64,
                    write: r.get::<_, i64>(2)? != 0,
                    start: r.get::<_, i64>(3)? as u64,
                    end: r.get::<_, i64>(4)? as u64,
                    pid: r.get(5)?,
                    fh: r.get::<_, i64>(6)? as u64,
                })
            })?
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn set_owner_locks(
        &mut self,
        ino: Ino,
        session: u64,
        owner: u64,
        locks: &[LockRow],
    ) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM locks WHERE ino=?1 AND session=?2 AND owner=?3")?
            .execute(params![ino as i64, session as i64, owner as i64])?;
        let mut ins = self.conn.prepare_cached(
            "INSERT INTO locks(ino,session,owner,write,start,end_,pid,fh) VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
        )?;
        for l in locks {
            ins.execute(params![
                ino as i64,
                session as i64,
                owner as i64,
                l.write as i64,
                l.start as i64,
                l.end as i64,
                l.pid,
                l.fh as i64
            ])?;
        }
        Ok(())
    }

    fn delete_fh_locks(&mut self, ino: Ino, session: u64, owner: u64, fh: u64) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM locks WHERE ino=?1 AND session=?2 AND owner=?3 AND fh=?4")?
            .execute(params![ino as i64, session as i64, owner as i64, fh as i64])?;
        Ok(())
    }

    fn session_lock_count(&mut self, session: u64) -> Result<u64> {
        let n: i64 = self.conn.query_row(
            "SELECT count(*) FROM locks WHERE session=?1",
            params![session as i64],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    fn want_upload(&mut self, ino: Ino, cache: u64, now_ns: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO wanted(ino,cache,since) VALUES(?1,?2,?3)
                 ON CONFLICT(ino) DO UPDATE SET cache=excluded.cache",
            )?
            .execute(params![ino as i64, cache as i64, now_ns])?;
        Ok(())
    }

    fn wanted_for(&mut self, cache: u64) -> Result<Vec<Ino>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT ino FROM wanted WHERE cache=?1 ORDER BY since")?;
        let v = st
            .query_map(params![cache as i64], |r| r.get::<_, i64>(0))?
            .map(|r| r.map(|i| i as u64))
            .collect::<std::result::Result<_, _>>()?;
        Ok(v)
    }

    fn clear_wanted(&mut self, ino: Ino) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM wanted WHERE ino=?1")?
            .execute(params![ino as i64])?;
        Ok(())
    }

    fn get_kv(&mut self, key: &str) -> Result<Option<String>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT value FROM kv WHERE key=?1")?;
        Ok(st.query_row(params![key], |r| r.get(0)).optional()?)
    }

    fn set_kv(&mut self, key: &str, value: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO kv(key,value) VALUES(?1,?2) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            )?
            .execute(params![key, value])?;
        Ok(())
    }

    fn delete_kv(&mut self, key: &str) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM kv WHERE key=?1")?
            .execute(params![key])?;
        Ok(())
    }

    fn kv_with_prefix(&mut self, prefix: &str) -> Result<Vec<(String, String)>> {
        // Keys are compared as text: `prefix` .. `prefix` followed by U+10FFFF bounds
        // every key that starts with it (no LIKE: `_` and `%` in prefixes).
        let end = format!("{prefix}\u{10FFFF}");
        let mut st = self.conn.prepare_cached(
            "SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key",
        )?;
        let rows = st.query_map(params![prefix, end], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
    }

    fn usage(&mut self) -> Result<Usage> {
        usage_of(self.conn)
    }
}

/// [`MetaTxn::usage`] on `conn`: one scan of the inodes.
pub(crate) fn usage_of(conn: &Connection) -> Result<Usage> {
    #[cfg(test)]
    if let Some(during) = tests::DURING_USAGE.with(|h| h.borrow_mut().take()) {
        during();
    }
    let (inodes, bytes, dinodes, dbytes): (i64, i64, i64, i64) = conn.query_row(
        "SELECT count(*), coalesce(sum(CASE WHEN kind=8 THEN size ELSE 0 END),0),
                coalesce(sum(dirty=1 AND nlink>0),0), coalesce(sum(CASE WHEN dirty=1 AND nlink>0 THEN size ELSE 0 END),0)
         FROM inodes",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    Ok(Usage {
        inodes: inodes as u64,
        bytes: bytes as u64,
        dirty_inodes: dinodes as u64,
        dirty_bytes: dbytes as u64,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;

    thread_local! {
        /// Run once by the next usage scan on this thread, before it reads.
        pub(crate) static DURING_USAGE: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}
