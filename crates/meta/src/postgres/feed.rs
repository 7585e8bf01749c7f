//! The change feed's cursor.
//!
//! # Why not `seq > last`
//! `changes.seq` is handed out when a row is inserted, but rows become visible when their
//! transaction commits: a transaction that logged seq 10 and commits after the one that
//! logged seq 11 would be skipped by a reader that already moved past 11.
//!
//! # The cursor
//! Every row records its transaction id (`xid`). A read is one statement, so the rows it
//! sees and `pg_current_snapshot()` are one snapshot `S`; `a` is `S`'s xmin (every
//! transaction below it had finished when `S` was taken). After a read, the rows covered
//! (delivered now or before) are:
//! * when the read returned everything it found: every row visible in `S`. The cursor is
//!   `{a, b = FLAG | token}`, the token unique within the engine;
//! * when `limit` cut it short: the rows visible in `S` up to the last one returned. The
//!   cursor is `{a, b = that row's seq}`.
//!
//! The next read returns what it sees that is not covered: `seq >` the bound (new rows),
//! or rows of transactions `>= a` that `S` did not see (they committed since: the late
//! ones). The snapshot `S` (its in-progress list) does not fit in two numbers, so the
//! engine keeps the snapshot of each cursor it handed out in a small cache. A cursor it
//! does not know (another engine's, an evicted one) falls back to what `{a, b}` alone
//! proves — rows with `xid < a` (up to seq `b` for a cut-short read) were delivered —
//! which returns some rows twice (allowed: followers are idempotent) and never skips one.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio_postgres::Row;

use super::rows::{col, col_u64};
use crate::{ChangeRow, FeedCursor, MetaError, Result};

/// Marks a cursor `b` that is a token, not a sequence number.
const FLAG: u64 = 1 << 63;

/// Snapshots of handed-out cursors, most recent `CAP`.
#[derive(Default)]
pub(super) struct SnapCache {
    inner: Mutex<Cached>,
    tokens: AtomicU64,
}

/// Cursor -> (snapshot, bound of the covered sequence numbers), and the keys in the order
/// they came (oldest evicted first).
#[derive(Default)]
struct Cached {
    map: HashMap<(u64, u64), (String, i64)>,
    order: VecDeque<(u64, u64)>,
}

const CAP: usize = 256;

/// `(xmax, number of in-progress xids)` of a `pg_snapshot` text (`xmin:xmax:xip,…`).
fn snap_order(s: &str) -> (u64, usize) {
    let mut parts = s.split(':');
    let _xmin = parts.next();
    let xmax = parts
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(u64::MAX);
    let xips = parts
        .next()
        .map_or(0, |x| x.split(',').filter(|p| !p.is_empty()).count());
    (xmax, xips)
}

impl SnapCache {
    /// Remembers the snapshot of cursor `key`. Cut-short cursors can repeat: of two
    /// snapshots for one, the older (which sees less) is kept, which only repeats rows.
    fn put(&self, key: (u64, u64), snap: String, bound: i64) {
        let Ok(mut g) = self.inner.lock() else { return };
        let Cached { map, order } = &mut *g;
        match map.get(&key) {
            Some((old, _)) => {
                let (ox, on) = snap_order(old);
                let (nx, nn) = snap_order(&snap);
                if nx < ox || (nx == ox && nn > on) {
                    map.insert(key, (snap, bound));
                }
            }
            None => {
                map.insert(key, (snap, bound));
                order.push_back(key);
                while order.len() > CAP {
                    if let Some(k) = order.pop_front() {
                        map.remove(&k);
                    }
                }
            }
        }
    }

    /// The snapshot to read from `cursor` with, if this engine knows it, and the sequence
    /// number bound of the covered rows.
    pub fn lookup(&self, cursor: FeedCursor) -> (Option<String>, i64) {
        if let Some((snap, bound)) = self
            .inner
            .lock()
            .ok()
            .and_then(|g| g.map.get(&(cursor.a, cursor.b)).cloned())
        {
            return (Some(snap), bound);
        }
        if cursor.b & FLAG != 0 {
            (None, i64::MAX)
        } else {
            (None, cursor.b as i64)
        }
    }

    /// A cursor covering everything visible in `snap`.
    fn complete(&self, xmin: u64, snap: String, top: i64) -> FeedCursor {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
        let cur = FeedCursor {
            a: xmin,
            b: FLAG | (token & !FLAG),
        };
        self.put((cur.a, cur.b), snap, top);
        cur
    }
}

/// The cursor for the snapshot in `r` (`FeedStart`'s columns: snapshot, xmin, top seq).
pub(super) fn start_cursor(cache: &SnapCache, r: &Row) -> Result<FeedCursor> {
    let snap: String = col(r, 0)?;
    Ok(cache.complete(col_u64(r, 1)?, snap, col(r, 2)?))
}

/// Decodes `FeedRead`'s rows (meta columns, then one change per row, or NULLs) into the
/// changes and the next cursor.
pub(super) fn read_result(
    cache: &SnapCache,
    limit: usize,
    rows: &[Row],
) -> Result<(Vec<ChangeRow>, FeedCursor)> {
    let meta = rows
        .first()
        .ok_or_else(|| MetaError::Internal("feed read returned no row".into()))?;
    let snap: String = col(meta, 0)?;
    let xmin = col_u64(meta, 1)?;
    let top: i64 = col(meta, 2)?;
    let mut changes = Vec::with_capacity(rows.len());
    for r in rows {
        let Some(seq) = col::<Option<i64>>(r, 3)? else {
            continue;
        };
        changes.push(ChangeRow {
            seq: seq as u64,
            session: col_u64(r, 4)?,
            ino: col_u64(r, 5)?,
            parent: col::<Option<i64>>(r, 6)?.map(|p| p as u64),
            name: col(r, 7)?,
        });
    }
    let next = match changes.last() {
        Some(last) if changes.len() >= limit => {
            let cur = FeedCursor {
                a: xmin,
                b: last.seq,
            };
            cache.put((cur.a, cur.b), snap, last.seq as i64);
            cur
        }
        _ => cache.complete(xmin, snap, top),
    };
    Ok((changes, next))
}
