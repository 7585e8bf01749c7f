//! The redo log of a commit window (design record
//! `docs/design/0009-commit-windows-and-a-redo-log.md`).
//!
//! While a commit window is open, acknowledged requests live in an uncommitted SQLite
//! transaction; what makes each one survive `kill -9` is its **redo record**: the write
//! statements the request executed, with their parameters bound in (SQLite's expanded
//! SQL), appended to `<db>-redo` with one `write(2)` before the request returns. A record
//! in the page cache outlives the process. Power loss: an `fsync` inside a window whose
//! starting state is durable flushes this log (design record 0011); otherwise it commits
//! the window and flushes the WAL. A log that was flushed is emptied only after its
//! window's commit is flushed too ([`RedoLog::acknowledged`]).
//!
//! Replay executes the records after the last one the database holds
//! (`kv.redo_seq`, written in each window's own transaction) in order, on the very state
//! they were recorded on — no other writer can commit while a window is open, and every
//! opener replays before it writes — so triggers and `AUTOINCREMENT` counters produce
//! the same rows again.
//!
//! A record holds one of two things (design record 0008, step 1 of its addendum):
//! - the request's **operation batch** ([`crate::Op`]s, MessagePack with field and variant
//!   names) for requests that come through [`crate::MetaEngine::apply`] — the namespace
//!   requests of the FUSE path. Replay applies the batch again with the same code, on the
//!   same state, so it writes the same rows. No statement is traced for them: expanding
//!   and copying each statement's SQL text was 8 % of the daemon's CPU during `tar x`;
//! - the **write statements** of any other request (a `txn` closure: the uploader, the
//!   keeper), captured as they run.
//!
//! Record layout (little endian): `magic u32 | payload length u32 | CRC-32C u32 of
//! (seq ‖ payload) | seq u64 | payload`. Magic `DKR1`: the payload is a list of
//! `length u32 | SQL bytes`; magic `DKR2`: the payload is the encoded batch. A torn or
//! damaged tail ends the log (a torn record's request never returned).

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{ffi, Connection};

use super::flush::{LogFlush, LogMark};
use crate::{MetaError, Op, Result};

/// A record of write statements.
const MAGIC: u32 = 0x3152_4b44; // "DKR1"
/// A record of one operation batch.
const MAGIC_OPS: u32 = 0x3252_4b44; // "DKR2"
const HEADER: usize = 4 + 4 + 4 + 8;

/// The redo log file beside a database, locked (`flock`) by the engine that owns it: the
/// only one allowed to open commit windows, and the one that must replay it.
pub(super) struct RedoLog {
    file: Arc<File>,
    path: PathBuf,
    len: u64,
    /// A short write could not be cut off: nothing may be appended after it (replay
    /// would stop at the torn record) until the log is emptied.
    broken: bool,
    /// A flush of the log was handed out for an `fsync`: its records may be the only
    /// durable copy of acknowledged requests, so it is emptied only after the commit
    /// holding them is flushed.
    acknowledged: bool,
    /// Its flushes (serialised; a failure refuses later ones until the log is emptied).
    flush: Arc<LogFlush>,
}

/// A redo log's flush, handed out to run without the connection.
pub(super) struct LogHandout {
    file: Arc<File>,
    path: PathBuf,
    flush: Arc<LogFlush>,
    /// The records the flush must cover: the log as it was when handed out.
    upto: LogMark,
}

impl LogHandout {
    /// `fdatasync` of the log. Errors: the flush's or an earlier one's (`EIO`).
    pub(super) fn sync(&self) -> std::io::Result<()> {
        self.flush.sync(&self.file, &self.path, self.upto)
    }
}

/// One parsed record: the request's sequence number and what it wrote.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) seq: u64,
    pub(super) body: Body,
}

/// What a record holds (see the module documentation).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Body {
    /// Write statements with their values bound in, in execution order.
    Statements(Vec<String>),
    /// One operation batch, applied with [`super::batch::apply_ops`].
    Ops(Vec<Op>),
}

/// What a request appends: the statements a [`Capture`] collected, or its batch
/// (encoded by [`encode_ops`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Payload<'a> {
    /// A [`Capture`]'s payload.
    Statements(&'a [u8]),
    /// An encoded batch.
    Ops(&'a [u8]),
}

/// Encodes `ops` as a record payload. Errors: `Internal` (a value serde cannot encode;
/// none of `Op`'s can).
pub(super) fn encode_ops(ops: &[Op]) -> Result<Vec<u8>> {
    rmp_serde::to_vec_named(ops)
        .map_err(|e| MetaError::Internal(format!("encoding a redo record: {e}")))
}

/// Whether applying `ops` can change the database (a batch of expectations and reads
/// only is not logged).
pub(super) fn ops_write(ops: &[Op]) -> bool {
    ops.iter().any(|op| {
        !matches!(
            op,
            Op::CheckSession(_)
                | Op::ExpectEntry { .. }
                | Op::ExpectEmpty(_)
                | Op::ExpectNotAncestor { .. }
                | Op::ExpectAttrs { .. }
                | Op::GetInode(_)
        )
    })
}

/// `<db>-redo`.
pub(super) fn path_for(db: &Path) -> PathBuf {
    let mut p = db.to_path_buf().into_os_string();
    p.push("-redo");
    PathBuf::from(p)
}

/// `<db>-join`: engines without windows hold it shared while they write (see
/// [`super::window`]).
pub(super) fn join_path_for(db: &Path) -> PathBuf {
    let mut p = db.to_path_buf().into_os_string();
    p.push("-join");
    PathBuf::from(p)
}

impl RedoLog {
    /// Opens (creating) the log of `db` and takes its lock. `Ok(None)`: another engine —
    /// in this process or another — holds it (it owns the windows and the replay).
    pub(super) fn lock(db: &Path) -> Result<Option<RedoLog>> {
        let path = path_for(db);
        let created = !path.exists();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(e.into()),
        }
        if created {
            // The log's name must survive a power cut too (records in it may be the only
            // durable copy of acknowledged requests).
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        let len = file.metadata()?.len();
        Ok(Some(RedoLog {
            file: Arc::new(file),
            path,
            len,
            broken: false,
            // Records left by a dead owner may have been acknowledged by its fsyncs.
            acknowledged: len > 0,
            flush: Arc::new(LogFlush::default()),
        }))
    }

    /// Whether the log holds anything (a record not yet known to be in the database).
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The records after `after`, in order; a torn or damaged tail is reported and
    /// ignored (its request never returned).
    pub(super) fn records_after(&mut self, after: u64) -> Result<Vec<Record>> {
        use std::io::Seek;
        // The descriptor is O_APPEND: writes go to the end whatever the offset.
        (&*self.file).rewind()?;
        let mut bytes = Vec::with_capacity(self.len as usize);
        (&*self.file).read_to_end(&mut bytes)?;
        let (records, good) = parse(&bytes);
        if good < bytes.len() {
            tracing::error!(
                log = %self.path.display(),
                dropped_bytes = bytes.len() - good,
                "redo log ends in a torn or damaged record; it was never acknowledged"
            );
        }
        Ok(records.into_iter().filter(|r| r.seq > after).collect())
    }

    /// The records to replay on a database that holds every record up to `applied`:
    /// those after it, which must continue it (the first is `applied + 1`). A log that
    /// does not continue the database — left beside a database that was re-created or
    /// restored from a copy — is not applied: it is copied to `<db>-redo.unmatched` for
    /// inspection and nothing is returned (the caller empties the log).
    pub(super) fn replayable(&mut self, applied: u64) -> Result<Vec<Record>> {
        let records = self.records_after(applied)?;
        match records.first() {
            Some(first) if first.seq != applied + 1 => {
                let mut aside = self.path.clone().into_os_string();
                aside.push(".unmatched");
                std::fs::copy(&self.path, &aside)?;
                tracing::error!(
                    log = %self.path.display(),
                    first = first.seq,
                    database_at = applied,
                    "the metadata redo log does not continue this database (re-created or restored?); not applied, kept as {}",
                    PathBuf::from(&aside).display()
                );
                Ok(Vec::new())
            }
            _ => Ok(records),
        }
    }

    /// Appends one record with a single `write(2)`. An error leaves the request
    /// unacknowledged (the caller rolls it back); a short write is cut off again so the
    /// next record starts on a boundary.
    pub(super) fn append(&mut self, seq: u64, payload: Payload<'_>) -> Result<()> {
        let (magic, payload) = match payload {
            Payload::Statements(p) => (MAGIC, p),
            Payload::Ops(p) => (MAGIC_OPS, p),
        };
        let mut buf = Vec::with_capacity(HEADER + payload.len());
        buf.extend_from_slice(&magic.to_le_bytes());
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(&checksum(seq, payload).to_le_bytes());
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(payload);
        if self.broken {
            return Err(MetaError::Internal(
                "the metadata redo log ends in a torn record; commit first".into(),
            ));
        }
        if let Err(e) = (&*self.file).write_all(&buf) {
            if self.file.set_len(self.len).is_err() {
                self.broken = true;
            }
            return Err(e.into());
        }
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Empties the log once the database holds every record (after a window's commit;
    /// when [`RedoLog::acknowledged`], after that commit was flushed too).
    pub(super) fn clear(&mut self) -> Result<()> {
        self.file.set_len(0)?;
        self.len = 0;
        self.broken = false;
        self.acknowledged = false;
        self.flush.reset();
        Ok(())
    }

    /// What an `fsync` flushes instead of committing: the log, marked acknowledged (see
    /// the field); `None` when an earlier flush failed (the caller commits and flushes
    /// the WAL instead).
    pub(super) fn flush_for_fsync(&mut self) -> Option<LogHandout> {
        if self.flush.failed() {
            return None;
        }
        self.acknowledged = true;
        Some(LogHandout {
            file: self.file.clone(),
            path: self.path.clone(),
            flush: self.flush.clone(),
            upto: self.flush.mark(self.len),
        })
    }

    /// Whether the log may hold the only durable copy of acknowledged requests: it must
    /// not be emptied before the commit holding them is flushed.
    pub(super) fn acknowledged(&self) -> bool {
        self.acknowledged
    }

    /// Flushes asked for that an earlier one already covered.
    pub(super) fn flushes_covered(&self) -> u64 {
        self.flush.skipped()
    }

    /// Bytes in the log.
    pub(super) fn len(&self) -> u64 {
        self.len
    }
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(&seq.to_le_bytes());
    d.update(payload);
    d.finalize() as u32
}

/// Parses records from the start of `bytes`; returns them and how many bytes were good.
fn parse(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER {
        let word =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let len = word(at + 4) as usize;
        let sum = word(at + 8);
        let mut seq8 = [0u8; 8];
        seq8.copy_from_slice(&bytes[at + 12..at + 20]);
        let seq = u64::from_le_bytes(seq8);
        let magic = word(at);
        if (magic != MAGIC && magic != MAGIC_OPS) || bytes.len() - at - HEADER < len {
            break;
        }
        let payload = &bytes[at + HEADER..at + HEADER + len];
        if checksum(seq, payload) != sum {
            break;
        }
        let body = if magic == MAGIC {
            statements_of(payload).map(Body::Statements)
        } else {
            rmp_serde::from_slice(payload).ok().map(Body::Ops)
        };
        let Some(body) = body else {
            break;
        };
        out.push(Record { seq, body });
        at += HEADER + len;
    }
    (out, at)
}

fn statements_of(mut payload: &[u8]) -> Option<Vec<String>> {
    let mut v = Vec::new();
    while !payload.is_empty() {
        let n = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
        let sql = payload.get(4..4 + n)?;
        v.push(String::from_utf8(sql.to_vec()).ok()?);
        payload = &payload[4 + n..];
    }
    Some(v)
}

/// Executes `records` (already filtered to those after the database's `redo_seq`) on
/// `conn`, inside the caller's transaction, and records the last sequence number.
/// A statement that fails with a constraint error failed the same way when it was
/// recorded (the request handled it), so it is skipped; any other error aborts the
/// replay. A batch is applied whole: it succeeded on this very state when it was
/// recorded, so any failure (an expectation included) means the log does not belong to
/// this database (`Corrupt`).
pub(super) fn replay(conn: &Connection, records: &[Record]) -> Result<u64> {
    let mut last = 0;
    let corrupt = |seq: u64, e: &dyn std::fmt::Display| MetaError::Corrupt {
        path: "redo log".into(),
        detail: format!("record {seq} does not apply: {e}"),
    };
    for r in records {
        match &r.body {
            Body::Statements(statements) => {
                for sql in statements {
                    match conn.execute_batch(sql) {
                        Ok(()) => {}
                        Err(rusqlite::Error::SqliteFailure(e, _))
                            if e.code == rusqlite::ErrorCode::ConstraintViolation => {}
                        Err(e) => return Err(corrupt(r.seq, &e)),
                    }
                }
            }
            Body::Ops(ops) => {
                super::batch::apply_ops(conn, ops).map_err(|e| corrupt(r.seq, &e))?;
            }
        }
        last = r.seq;
    }
    if last > 0 {
        set_redo_seq(conn, last)?;
    }
    Ok(last)
}

/// Replays, inside the caller's transaction, the records of `log` that continue the
/// database (see [`RedoLog::replayable`]); returns how many.
pub(super) fn replay_pending(conn: &Connection, log: &mut RedoLog) -> Result<u64> {
    let records = log.replayable(redo_seq(conn)?)?;
    replay(conn, &records)?;
    Ok(records.len() as u64)
}

/// The last record the database holds (0 when none was ever committed).
pub(super) fn redo_seq(conn: &Connection) -> Result<u64> {
    use rusqlite::OptionalExtension;
    let v: Option<String> = conn
        .prepare_cached("SELECT value FROM kv WHERE key='redo_seq'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(v.and_then(|s| s.parse().ok()).unwrap_or(0))
}

/// Records, in the open transaction, that the database holds every record up to `seq`.
pub(super) fn set_redo_seq(conn: &Connection, seq: u64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO kv(key,value) VALUES('redo_seq',?1)
         ON CONFLICT(key) DO UPDATE SET value=excluded.value",
    )?
    .execute([seq.to_string()])?;
    Ok(())
}

/// Collects the write statements a connection executes while switched on: SQLite's
/// statement trace (`sqlite3_trace_v2`, `SQLITE_TRACE_STMT`) hands over each statement as
/// it starts; read-only ones and trigger bodies (replay fires the triggers again) are
/// skipped; the rest are kept as expanded SQL (parameters bound in as literals).
///
/// Lives in a `Box` whose address is the trace context: it must outlive the hook, so the
/// owner removes the hook ([`Capture::detach`]) before dropping it.
pub(super) struct Capture {
    on: Cell<bool>,
    /// A statement could not be expanded (out of memory): the request cannot be logged.
    lost: Cell<bool>,
    buf: RefCell<Vec<u8>>,
}

impl Capture {
    /// Installs the hook on `conn`.
    pub(super) fn attach(conn: &Connection) -> Box<Capture> {
        let c = Box::new(Capture {
            on: Cell::new(false),
            lost: Cell::new(false),
            buf: RefCell::new(Vec::with_capacity(4096)),
        });
        // SAFETY: `conn.handle()` is the live connection; the context pointer stays valid
        // until `detach` (the owner detaches before dropping the box) and the callback only
        // runs on the thread executing a statement of this connection, which holds the
        // engine's connection mutex, so the `Cell`s are never touched concurrently.
        unsafe {
            ffi::sqlite3_trace_v2(
                conn.handle(),
                ffi::SQLITE_TRACE_STMT as c_uint,
                Some(on_statement),
                &*c as *const Capture as *mut c_void,
            );
        }
        c
    }

    /// Removes the hook from `conn`.
    pub(super) fn detach(conn: &Connection) {
        // SAFETY: clearing the trace callback of a live connection.
        unsafe {
            ffi::sqlite3_trace_v2(conn.handle(), 0, None, std::ptr::null_mut());
        }
    }

    /// Starts collecting (clears what an earlier request left).
    pub(super) fn start(&self) {
        self.buf.borrow_mut().clear();
        self.lost.set(false);
        self.on.set(true);
    }

    /// Stops collecting; returns the payload (empty: the request wrote nothing) or `None`
    /// when a statement could not be recorded.
    pub(super) fn stop(&self) -> Option<std::cell::Ref<'_, Vec<u8>>> {
        self.on.set(false);
        if self.lost.get() {
            return None;
        }
        Some(self.buf.borrow())
    }
}

/// The `sqlite3_trace_v2` callback: `p` is the statement, `x` its unexpanded SQL text or,
/// for a trigger body, a `-- TRIGGER name` comment.
unsafe extern "C" fn on_statement(
    _mask: c_uint,
    ctx: *mut c_void,
    p: *mut c_void,
    x: *mut c_void,
) -> c_int {
    // SAFETY: ctx is the `Capture` registered in `attach`, alive while the hook is set.
    let cap = unsafe { &*(ctx as *const Capture) };
    if !cap.on.get() {
        return 0;
    }
    let stmt = p as *mut ffi::sqlite3_stmt;
    // SAFETY: x is a NUL-terminated string owned by SQLite for the callback's duration.
    let text = unsafe { CStr::from_ptr(x as *const c_char) }.to_bytes();
    if text.starts_with(b"--") {
        return 0;
    }
    // SAFETY: stmt is the statement being run.
    if unsafe { ffi::sqlite3_stmt_readonly(stmt) } != 0 {
        return 0;
    }
    // SAFETY: expanded SQL is allocated by SQLite and freed with sqlite3_free below.
    let expanded = unsafe { ffi::sqlite3_expanded_sql(stmt) };
    if expanded.is_null() {
        cap.lost.set(true);
        return 0;
    }
    {
        // SAFETY: a NUL-terminated string from sqlite3_expanded_sql.
        let sql = unsafe { CStr::from_ptr(expanded) }.to_bytes();
        let mut buf = cap.buf.borrow_mut();
        buf.extend_from_slice(&(sql.len() as u32).to_le_bytes());
        buf.extend_from_slice(sql);
    }
    // SAFETY: allocated by SQLite above.
    unsafe { ffi::sqlite3_free(expanded as *mut c_void) };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(stmts: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for s in stmts {
            v.extend_from_slice(&(s.len() as u32).to_le_bytes());
            v.extend_from_slice(s.as_bytes());
        }
        v
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("m.db");
        let mut log = RedoLog::lock(&db).unwrap().unwrap();
        let p1 = payload(&["INSERT INTO t VALUES(1)"]);
        log.append(1, Payload::Statements(&p1)).unwrap();
        let p2 = payload(&["UPDATE t SET a=2", "DELETE FROM t"]);
        log.append(2, Payload::Statements(&p2)).unwrap();
        let ops = vec![
            Op::MarkInode {
                ino: 7,
                not_before_ns: -3,
            },
            Op::InsertDentry {
                parent: 1,
                name: vec![0, b'/', 0xff, b'\n'],
                ino: 7,
            },
        ];
        log.append(3, Payload::Ops(&encode_ops(&ops).unwrap()))
            .unwrap();
        let all = log.records_after(0).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(
            all[1].body,
            Body::Statements(vec!["UPDATE t SET a=2".into(), "DELETE FROM t".into()])
        );
        assert_eq!(all[2].body, Body::Ops(ops));
        assert_eq!(log.records_after(2).unwrap().len(), 1);
        // A second opener (another mount) does not get the lock while this one lives.
        assert!(RedoLog::lock(&db).unwrap().is_none());
        // Tear the last record: it is dropped, the others stay.
        let full = log.len();
        log.file.set_len(full - 3).unwrap();
        let got = log.records_after(0).unwrap();
        assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
        // A flipped byte in the middle ends the log there.
        drop(log);
        let mut bytes = std::fs::read(path_for(&db)).unwrap();
        bytes[HEADER + 5] ^= 0xff;
        std::fs::write(path_for(&db), &bytes).unwrap();
        let mut log = RedoLog::lock(&db).unwrap().unwrap();
        assert!(log.records_after(0).unwrap().is_empty());
        log.clear().unwrap();
        assert!(log.is_empty());
    }
}
