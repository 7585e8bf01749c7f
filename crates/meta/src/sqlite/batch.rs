//! [`Op`] batches on SQLite: each op is one or two prepared statements inside the
//! caller's `BEGIN IMMEDIATE` transaction. Expectations are checked with row counts; the
//! first one that fails aborts the batch with [`MetaError::Precondition`].

use rusqlite::{params, Connection, OptionalExtension};

use super::rows::{inode_from_row, kind_code, INODE_COLS};
use super::MAX_COALESCE_NS;
use crate::{Expect, Ino, InodeRow, MetaError, Op, OpOut, Result, XattrMode, ROOT_INO};

/// Reserves `n` inode numbers from the workspace counter (`kv.next_ino`).
pub(crate) fn alloc_inos(conn: &Connection, n: u64) -> Result<std::ops::Range<Ino>> {
    let end: i64 = conn
        .prepare_cached(
            "UPDATE kv SET value = CAST(value AS INTEGER) + ?1 WHERE key='next_ino'
             RETURNING CAST(value AS INTEGER)",
        )?
        .query_row(params![n as i64], |r| r.get(0))?;
    let end = end as u64;
    Ok(end - n..end)
}

/// Inserts `row` as inode number `ino`.
pub(crate) fn insert_inode_at(conn: &Connection, ino: Ino, row: &InodeRow) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO inodes(ino,kind,perm,uid,gid,rdev,nlink,size,atime,mtime,ctime,btime,
         data_version,target,local,dirty,listed)
         VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17)",
    )?
    .execute(params![
        ino as i64,
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
    Ok(())
}

/// The next pending-work sequence number (sync barriers compare against it).
pub(crate) fn next_seq(conn: &Connection) -> Result<u64> {
    let seq: i64 = conn
        .prepare_cached(
            "UPDATE kv SET value = CAST(value AS INTEGER) + 1 WHERE key='pending_seq'
             RETURNING CAST(value AS INTEGER)",
        )?
        .query_row([], |r| r.get(0))?;
    Ok(seq as u64)
}

/// The workspace path of `parent/name`: walked up to the root through directory
/// entries (a directory has one), one index seek (`dentries_ino`) per level. `None` when
/// unreachable (an unlinked directory on the way, or deeper than 4,096 levels).
fn path_up(conn: &Connection, parent: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut st = conn.prepare_cached("SELECT parent, name FROM dentries WHERE ino=?1 LIMIT 1")?;
    // Components from the leaf up, joined in reverse at the end.
    let mut parts: Vec<Vec<u8>> = vec![name.to_vec()];
    let mut at = parent;
    while at != ROOT_INO {
        if parts.len() > 4096 {
            return Ok(None);
        }
        let up: Option<(i64, Vec<u8>)> = st
            .query_row(params![at as i64], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((p, n)) = up else {
            return Ok(None);
        };
        parts.push(n);
        at = p as Ino;
    }
    let mut path = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, part) in parts.iter().rev().enumerate() {
        if i > 0 {
            path.push(b'/');
        }
        path.extend_from_slice(part);
    }
    Ok(Some(path))
}

/// The workspace paths of every name of `ino` (one per hard link, in the order the names
/// were made; empty for an unreachable inode).
pub(crate) fn paths_of(conn: &Connection, ino: Ino) -> Result<Vec<Vec<u8>>> {
    let names: Vec<(i64, Vec<u8>)> = conn
        .prepare_cached("SELECT parent, name FROM dentries WHERE ino=?1 ORDER BY cookie")?
        .query_map(params![ino as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<std::result::Result<_, _>>()?;
    let mut out = Vec::with_capacity(names.len());
    for (parent, name) in names {
        if let Some(p) = path_up(conn, parent as Ino, &name)? {
            out.push(p);
        }
    }
    Ok(out)
}

/// The upsert of a pending row (parameters: path, recursive, seq, due, coalescing bound);
/// `$tail` is appended to its `DO UPDATE SET` list.
macro_rules! mark_sql {
    ($tail:literal) => {
        concat!(
            "INSERT INTO pending(path,recursive,seq,gen,due,since,attempts,last_error)
             VALUES(?1,?2,?3,1,?4,?4,0,NULL)
             ON CONFLICT(path) DO UPDATE SET
               recursive = max(recursive, excluded.recursive),
               gen = gen + 1,
               due = min(excluded.due, since + ?5)",
            $tail
        )
    };
}

/// Inserts `path` into the uploader's queue with number `seq`, due at `not_before_ns`;
/// a path already queued is re-marked instead: its generation goes up (an upload in
/// flight will not finish it), its due time moves to `not_before_ns` but never past
/// `since + MAX_COALESCE_NS`, `recursive` only widens, and its number stays.
pub(crate) fn mark_one(
    conn: &Connection,
    path: &[u8],
    recursive: bool,
    seq: u64,
    not_before_ns: i64,
) -> Result<()> {
    upsert_pending(conn, mark_sql!(""), path, recursive, seq, not_before_ns)
}

/// [`MetaTxn::remark_pending`](crate::MetaTxn::remark_pending): as [`mark_one`], the
/// row keeping the older of its own sequence number and `seq`.
pub(crate) fn remark_one(
    conn: &Connection,
    path: &[u8],
    recursive: bool,
    seq: u64,
    not_before_ns: i64,
) -> Result<()> {
    let sql = mark_sql!(", seq = min(seq, excluded.seq)");
    upsert_pending(conn, sql, path, recursive, seq, not_before_ns)
}

fn upsert_pending(
    conn: &Connection,
    sql: &str,
    path: &[u8],
    recursive: bool,
    seq: u64,
    not_before_ns: i64,
) -> Result<()> {
    conn.prepare_cached(sql)?.execute(params![
        path,
        recursive as i64,
        crate::seq_bound(seq),
        not_before_ns,
        MAX_COALESCE_NS
    ])?;
    Ok(())
}

fn fail(step: usize, what: Expect) -> MetaError {
    MetaError::Precondition { step, what }
}

fn expect_one(n: usize, step: usize, what: Expect) -> Result<()> {
    if n == 1 {
        Ok(())
    } else {
        Err(fail(step, what))
    }
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.code == rusqlite::ErrorCode::ConstraintViolation)
}

/// Applies `ops` on `conn` (inside the caller's transaction), in order.
pub(crate) fn apply_ops(conn: &Connection, ops: &[Op]) -> Result<Vec<OpOut>> {
    let mut out = Vec::with_capacity(ops.len());
    for (step, op) in ops.iter().enumerate() {
        out.push(apply_one(conn, step, op)?);
    }
    Ok(out)
}

fn apply_one(conn: &Connection, step: usize, op: &Op) -> Result<OpOut> {
    match op {
        Op::CheckSession(s) => {
            let live = conn
                .prepare_cached("SELECT 1 FROM sessions WHERE id=?1")?
                .exists(params![*s as i64])?;
            if !live {
                return Err(MetaError::Fenced(*s));
            }
        }
        Op::TouchDir {
            ino,
            nlink_delta,
            time_ns,
        } => {
            let n = conn
                .prepare_cached(
                    "UPDATE inodes SET nlink = nlink + ?2, mtime = max(mtime, ?3),
                     ctime = max(ctime, ?3) WHERE ino=?1 AND kind=4 AND nlink>0",
                )?
                .execute(params![*ino as i64, nlink_delta, time_ns])?;
            expect_one(n, step, Expect::DirAlive)?;
        }
        Op::InsertInode(row) => insert_inode_at(conn, row.ino, row)?,
        Op::InsertDentry { parent, name, ino } => {
            let r = conn
                .prepare_cached("INSERT INTO dentries(parent,name,ino) VALUES(?1,?2,?3)")?
                .execute(params![*parent as i64, name, *ino as i64]);
            match r {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => return Err(fail(step, Expect::NameFree)),
                Err(e) => return Err(e.into()),
            }
        }
        Op::DeleteDentry { parent, name, ino } => {
            let n = conn
                .prepare_cached("DELETE FROM dentries WHERE parent=?1 AND name=?2 AND ino=?3")?
                .execute(params![*parent as i64, name, *ino as i64])?;
            expect_one(n, step, Expect::EntryIs)?;
        }
        Op::MoveDentry {
            parent,
            name,
            ino,
            new_parent,
            new_name,
        } => {
            let r = conn
                .prepare_cached(
                    "UPDATE dentries SET parent=?4, name=?5 WHERE parent=?1 AND name=?2 AND ino=?3",
                )?
                .execute(params![
                    *parent as i64,
                    name,
                    *ino as i64,
                    *new_parent as i64,
                    new_name
                ]);
            match r {
                Ok(n) => expect_one(n, step, Expect::EntryIs)?,
                Err(e) if is_unique_violation(&e) => return Err(fail(step, Expect::NameFree)),
                Err(e) => return Err(e.into()),
            }
        }
        Op::RepointDentry {
            parent,
            name,
            from,
            to,
        } => {
            let n = conn
                .prepare_cached(
                    "UPDATE dentries SET ino=?4 WHERE parent=?1 AND name=?2 AND ino=?3",
                )?
                .execute(params![*parent as i64, name, *from as i64, *to as i64])?;
            expect_one(n, step, Expect::EntryIs)?;
        }
        Op::ExpectEntry { parent, name, ino } => {
            let found: Option<i64> = conn
                .prepare_cached("SELECT ino FROM dentries WHERE parent=?1 AND name=?2")?
                .query_row(params![*parent as i64, name], |r| r.get(0))
                .optional()?;
            match (ino, found) {
                (None, Some(_)) => return Err(fail(step, Expect::NameFree)),
                (Some(want), got) if got != Some(*want as i64) => {
                    return Err(fail(step, Expect::EntryIs))
                }
                _ => {}
            }
        }
        Op::ExpectEmpty(dir) => {
            let has = conn
                .prepare_cached("SELECT 1 FROM dentries WHERE parent=?1 LIMIT 1")?
                .exists(params![*dir as i64])?;
            if has {
                return Err(fail(step, Expect::DirEmpty));
            }
        }
        Op::ExpectNotAncestor { dir, of } => {
            let hit = conn
                .prepare_cached(
                    "WITH RECURSIVE up(ino, depth) AS (
                       SELECT ?2, 0
                       UNION ALL
                       SELECT d.parent, up.depth + 1 FROM up JOIN dentries d ON d.ino = up.ino
                       WHERE up.ino <> 1 AND up.ino <> ?1 AND up.depth < 4096)
                     SELECT 1 FROM up WHERE ino = ?1 LIMIT 1",
                )?
                .exists(params![*dir as i64, *of as i64])?;
            if hit {
                return Err(fail(step, Expect::NotAncestor));
            }
        }
        Op::AddNlink {
            ino,
            delta,
            ctime_ns,
        } => {
            let n = conn
                .prepare_cached(
                    "UPDATE inodes SET nlink = max(nlink + ?2, 0), ctime = max(ctime, ?3)
                     WHERE ino=?1 AND (?2 <= 0 OR nlink > 0)",
                )?
                .execute(params![*ino as i64, delta, ctime_ns])?;
            if n != 1 {
                let exists = conn
                    .prepare_cached("SELECT 1 FROM inodes WHERE ino=?1")?
                    .exists(params![*ino as i64])?;
                let what = if exists {
                    Expect::Linked
                } else {
                    Expect::InodeExists
                };
                return Err(fail(step, what));
            }
        }
        Op::ExpectAttrs {
            ino,
            perm,
            uid,
            gid,
        } => {
            let same = conn
                .prepare_cached(
                    "SELECT 1 FROM inodes WHERE ino=?1 AND perm=?2 AND uid=?3 AND gid=?4",
                )?
                .exists(params![*ino as i64, perm, uid, gid])?;
            if !same {
                return Err(fail(step, Expect::Attrs));
            }
        }
        Op::SetAttrs { ino, set } => {
            let n = conn
                .prepare_cached(
                    "UPDATE inodes SET perm = coalesce(?2, perm), uid = coalesce(?3, uid),
                     gid = coalesce(?4, gid), atime = coalesce(?5, atime),
                     mtime = coalesce(?6, mtime), ctime = max(ctime, coalesce(?7, ctime)),
                     dirty = coalesce(?8, dirty), local = coalesce(?9, local)
                     WHERE ino=?1",
                )?
                .execute(params![
                    *ino as i64,
                    set.perm,
                    set.uid,
                    set.gid,
                    set.atime_ns,
                    set.mtime_ns,
                    set.ctime_ns,
                    set.dirty.map(|d| d as i64),
                    set.local.map(|l| l.code()),
                ])?;
            expect_one(n, step, Expect::InodeExists)?;
        }
        Op::CommitContent {
            ino,
            size,
            mtime_ns,
            ctime_ns,
            local,
        } => {
            let v: Option<i64> = conn
                .prepare_cached(
                    "UPDATE inodes SET size=?2, mtime=?3, ctime=max(ctime, ?4),
                     data_version = data_version + 1, dirty=1, local=?5
                     WHERE ino=?1 RETURNING data_version",
                )?
                .query_row(
                    params![*ino as i64, *size as i64, mtime_ns, ctime_ns, local.code()],
                    |r| r.get(0),
                )
                .optional()?;
            match v {
                Some(v) => return Ok(OpOut::Version(v as u64)),
                None => return Err(fail(step, Expect::InodeExists)),
            }
        }
        Op::Purge(ino) => {
            let n = conn
                .prepare_cached(
                    "DELETE FROM inodes WHERE ino=?1 AND nlink=0
                     AND NOT EXISTS (SELECT 1 FROM open_files WHERE ino=?1 AND count>0)",
                )?
                .execute(params![*ino as i64])?;
            if n > 0 {
                conn.prepare_cached("DELETE FROM xattrs WHERE ino=?1")?
                    .execute(params![*ino as i64])?;
            }
            return Ok(OpOut::Purged(n > 0));
        }
        Op::DeleteInode(ino) => {
            for sql in [
                "DELETE FROM inodes WHERE ino=?1",
                "DELETE FROM xattrs WHERE ino=?1",
            ] {
                conn.prepare_cached(sql)?.execute(params![*ino as i64])?;
            }
        }
        Op::MarkPath {
            parent,
            name,
            recursive,
            not_before_ns,
        } => {
            let seq = next_seq(conn)?;
            if let Some(path) = path_up(conn, *parent, name)? {
                mark_one(conn, &path, *recursive, seq, *not_before_ns)?;
            }
        }
        Op::MarkInode { ino, not_before_ns } => {
            let seq = next_seq(conn)?;
            for path in paths_of(conn, *ino)? {
                mark_one(conn, &path, false, seq, *not_before_ns)?;
            }
        }
        Op::AddOpen {
            ino,
            session,
            delta,
        } => {
            let count: i64 = conn
                .prepare_cached(
                    "INSERT INTO open_files(ino,session,count) VALUES(?1,?2,?3)
                     ON CONFLICT(ino,session) DO UPDATE SET count = count + excluded.count
                     RETURNING count",
                )?
                .query_row(params![*ino as i64, *session as i64, delta], |r| r.get(0))?;
            if count <= 0 {
                conn.prepare_cached("DELETE FROM open_files WHERE ino=?1 AND session=?2")?
                    .execute(params![*ino as i64, *session as i64])?;
            }
        }
        Op::SetXattr {
            ino,
            name,
            value,
            mode,
        } => {
            let exists = conn
                .prepare_cached("SELECT 1 FROM xattrs WHERE ino=?1 AND name=?2")?
                .exists(params![*ino as i64, name])?;
            match mode {
                XattrMode::Create if exists => return Err(fail(step, Expect::XattrAbsent)),
                XattrMode::Replace if !exists => return Err(fail(step, Expect::XattrPresent)),
                _ => {}
            }
            conn.prepare_cached(
                "INSERT INTO xattrs(ino,name,value) VALUES(?1,?2,?3)
                 ON CONFLICT(ino,name) DO UPDATE SET value=excluded.value",
            )?
            .execute(params![*ino as i64, name, value])?;
        }
        Op::RemoveXattr { ino, name } => {
            let n = conn
                .prepare_cached("DELETE FROM xattrs WHERE ino=?1 AND name=?2")?
                .execute(params![*ino as i64, name])?;
            expect_one(n, step, Expect::XattrPresent)?;
        }
        Op::ExpireSession {
            id,
            stale_before_ns,
            hold_opens,
        } => {
            let n = conn
                .prepare_cached("DELETE FROM sessions WHERE id=?1 AND heartbeat < ?2")?
                .execute(params![*id as i64, stale_before_ns])?;
            if n > 0 {
                if let Some(held) = hold_opens {
                    let moved = conn
                        .prepare_cached(
                            "INSERT INTO open_files(ino,session,count)
                             SELECT ino, -?1, count FROM open_files WHERE session=?1 AND count>0
                             ON CONFLICT(ino,session) DO UPDATE SET count=count+excluded.count",
                        )?
                        .execute(params![*id as i64])?;
                    if moved > 0 {
                        conn.prepare_cached(
                            "INSERT INTO kv(key,value) VALUES(?1,?2)
                             ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                        )?
                        .execute(params![crate::held_opens_key(*id), held.record()])?;
                    }
                }
                for sql in [
                    "DELETE FROM open_files WHERE session=?1",
                    "DELETE FROM locks WHERE session=?1",
                ] {
                    conn.prepare_cached(sql)?.execute(params![*id as i64])?;
                }
            }
            return Ok(OpOut::Purged(n > 0));
        }
        Op::ReleaseHeldOpens(id) => {
            conn.prepare_cached("DELETE FROM open_files WHERE session=?1")?
                .execute(params![-(*id as i64)])?;
            conn.prepare_cached("DELETE FROM kv WHERE key=?1")?
                .execute(params![crate::held_opens_key(*id)])?;
        }
        Op::GetInode(ino) => {
            let row = conn
                .prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE ino=?1"))?
                .query_row(params![*ino as i64], |r| inode_from_row(r, 0))
                .optional()?;
            return Ok(OpOut::Row(row));
        }
    }
    Ok(OpOut::Done)
}
