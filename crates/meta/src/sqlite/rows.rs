//! Row encoding of the SQLite engine: column lists and conversions.

use rusqlite::Row;

use crate::{InodeRow, Kind, Local, ObjectRow, PendingRow};

pub(super) fn kind_code(k: Kind) -> i64 {
    (k.ifmt() >> 12) as i64
}

pub(super) fn kind_from_code(c: i64) -> rusqlite::Result<Kind> {
    Kind::from_mode((c as u32) << 12).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Integer,
            format!("bad inode kind {c}").into(),
        )
    })
}

pub(super) const INODE_COLS: &str =
    "ino,kind,perm,uid,gid,rdev,nlink,size,atime,mtime,ctime,btime,\
                          data_version,target,local,dirty,listed";

pub(super) fn inode_from_row(r: &Row<'_>, base: usize) -> rusqlite::Result<InodeRow> {
    Ok(InodeRow {
        ino: r.get::<_, i64>(base)? as u64,
        kind: kind_from_code(r.get(base + 1)?)?,
        perm: r.get(base + 2)?,
        uid: r.get(base + 3)?,
        gid: r.get(base + 4)?,
        rdev: r.get(base + 5)?,
        nlink: r.get(base + 6)?,
        size: r.get::<_, i64>(base + 7)? as u64,
        atime_ns: r.get(base + 8)?,
        mtime_ns: r.get(base + 9)?,
        ctime_ns: r.get(base + 10)?,
        btime_ns: r.get(base + 11)?,
        data_version: r.get::<_, i64>(base + 12)? as u64,
        target: r.get(base + 13)?,
        local: Local::from_code(r.get(base + 14)?),
        dirty: r.get::<_, i64>(base + 15)? != 0,
        listed_ns: r.get(base + 16)?,
    })
}

pub(super) fn object_from_row(r: &Row<'_>) -> rusqlite::Result<ObjectRow> {
    Ok(ObjectRow {
        path: r.get(0)?,
        key: r.get(1)?,
        ino: r.get::<_, i64>(2)? as u64,
        kind: kind_from_code(r.get(3)?)?,
        data_version: r.get::<_, i64>(4)? as u64,
        meta_stamp: r.get(5)?,
        etag: r.get(6)?,
        size: r.get::<_, i64>(7)? as u64,
    })
}

pub(super) fn pending_from_row(r: &Row<'_>) -> rusqlite::Result<PendingRow> {
    Ok(PendingRow {
        path: r.get(0)?,
        recursive: r.get::<_, i64>(1)? != 0,
        seq: r.get::<_, i64>(2)? as u64,
        gen: r.get::<_, i64>(3)? as u64,
        due_ns: r.get(4)?,
        since_ns: r.get(5)?,
        attempts: r.get(6)?,
        last_error: r.get(7)?,
    })
}

pub(super) const OBJECT_COLS: &str = "path,key,ino,kind,data_version,meta_stamp,etag,size";
pub(super) const PENDING_COLS: &str = "path,recursive,seq,gen,due,since,attempts,last_error";

/// Upper bound (exclusive) of the byte strings that start with `dir/`: `dir0`.
pub(super) fn subtree_bounds(dir: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if dir.is_empty() {
        return (Vec::new(), vec![0xff; 8]);
    }
    let mut lo = dir.to_vec();
    lo.push(b'/');
    let mut hi = dir.to_vec();
    hi.push(b'/' + 1);
    (lo, hi)
}
