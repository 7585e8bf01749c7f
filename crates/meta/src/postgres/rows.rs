//! Row decoding: columns read with `try_get` (a bad value is an error, never a panic) and
//! bigint columns turned back into the unsigned values they hold.

use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use crate::{InodeRow, Kind, Local, MetaError, ObjectRow, PendingRow, Result};

/// Column `i` of `r` as `T`.
pub(super) fn col<'a, T: FromSql<'a>>(r: &'a Row, i: usize) -> Result<T> {
    r.try_get(i).map_err(|e| {
        MetaError::Internal(format!(
            "postgres: column {i}: {}",
            super::config::one_line(&e)
        ))
    })
}

/// Column `i` (bigint) as `u64` (stored as `i64`, bit for bit).
pub(super) fn col_u64(r: &Row, i: usize) -> Result<u64> {
    Ok(col::<i64>(r, i)? as u64)
}

/// Column `i` (bigint) as `u32`; values out of range are a damaged database.
pub(super) fn col_u32(r: &Row, i: usize) -> Result<u32> {
    let v: i64 = col(r, i)?;
    u32::try_from(v)
        .map_err(|_| MetaError::Internal(format!("postgres: column {i}: {v} out of range")))
}

/// The stored code of a kind (`S_IFMT >> 12`, as in the SQLite engine).
pub(super) fn kind_code(k: Kind) -> i64 {
    (k.ifmt() >> 12) as i64
}

fn kind_from(c: i64) -> Result<Kind> {
    u32::try_from(c)
        .ok()
        .and_then(|c| Kind::from_mode(c << 12))
        .ok_or_else(|| MetaError::Internal(format!("postgres: bad inode kind {c}")))
}

/// An inode from the 17 columns starting at `base` (`inode_cols!` order).
pub(super) fn inode(r: &Row, base: usize) -> Result<InodeRow> {
    Ok(InodeRow {
        ino: col_u64(r, base)?,
        kind: kind_from(col(r, base + 1)?)?,
        perm: col_u32(r, base + 2)?,
        uid: col_u32(r, base + 3)?,
        gid: col_u32(r, base + 4)?,
        rdev: col_u32(r, base + 5)?,
        nlink: col_u32(r, base + 6)?,
        size: col_u64(r, base + 7)?,
        atime_ns: col(r, base + 8)?,
        mtime_ns: col(r, base + 9)?,
        ctime_ns: col(r, base + 10)?,
        btime_ns: col(r, base + 11)?,
        data_version: col_u64(r, base + 12)?,
        target: col(r, base + 13)?,
        local: Local::from_code(col(r, base + 14)?),
        dirty: col(r, base + 15)?,
        listed_ns: col(r, base + 16)?,
    })
}

/// The 16 values of `row` after its number, as `InsertInode`'s `$1..$16` (or, with the
/// number first, `InsertInodeAt`/`UpdateInode`'s).
pub(super) struct InodeParams {
    pub kind: i64,
    pub perm: i64,
    pub uid: i64,
    pub gid: i64,
    pub rdev: i64,
    pub nlink: i64,
    pub size: i64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub btime: i64,
    pub data_version: i64,
    pub target: Option<Vec<u8>>,
    pub local: i64,
    pub dirty: bool,
    pub listed: i64,
}

impl InodeParams {
    pub fn of(row: &InodeRow) -> InodeParams {
        InodeParams {
            kind: kind_code(row.kind),
            perm: i64::from(row.perm),
            uid: i64::from(row.uid),
            gid: i64::from(row.gid),
            rdev: i64::from(row.rdev),
            nlink: i64::from(row.nlink),
            size: row.size as i64,
            atime: row.atime_ns,
            mtime: row.mtime_ns,
            ctime: row.ctime_ns,
            btime: row.btime_ns,
            data_version: row.data_version as i64,
            target: row.target.clone(),
            local: row.local.code(),
            dirty: row.dirty,
            listed: row.listed_ns,
        }
    }

    /// As SQL parameters, in column order.
    pub fn refs(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 16] {
        [
            &self.kind,
            &self.perm,
            &self.uid,
            &self.gid,
            &self.rdev,
            &self.nlink,
            &self.size,
            &self.atime,
            &self.mtime,
            &self.ctime,
            &self.btime,
            &self.data_version,
            &self.target,
            &self.local,
            &self.dirty,
            &self.listed,
        ]
    }
}

/// An object row (`object_cols!` order).
pub(super) fn object(r: &Row) -> Result<ObjectRow> {
    Ok(ObjectRow {
        path: col(r, 0)?,
        key: col(r, 1)?,
        ino: col_u64(r, 2)?,
        kind: kind_from(col(r, 3)?)?,
        data_version: col_u64(r, 4)?,
        meta_stamp: col(r, 5)?,
        etag: col(r, 6)?,
        size: col_u64(r, 7)?,
    })
}

/// A pending row (`pending_cols!` order).
pub(super) fn pending(r: &Row) -> Result<PendingRow> {
    Ok(PendingRow {
        path: col(r, 0)?,
        recursive: col(r, 1)?,
        seq: col_u64(r, 2)?,
        gen: col_u64(r, 3)?,
        due_ns: col(r, 4)?,
        since_ns: col(r, 5)?,
        attempts: col_u32(r, 6)?,
        last_error: col(r, 7)?,
    })
}

/// Upper bound (exclusive) of the byte strings that start with `dir/`: `dir0`.
pub(super) fn subtree_bounds(dir: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut lo = dir.to_vec();
    lo.push(b'/');
    let mut hi = dir.to_vec();
    hi.push(b'/' + 1);
    (lo, hi)
}
