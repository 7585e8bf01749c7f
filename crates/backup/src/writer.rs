//! The backup writer: change marks become delta files; grown deltas become a new snapshot.
//!
//! One flush reads, in one read transaction of the metadata engine, the change marks
//! after the last backed-up one and the current state of everything they name, writes
//! that as one delta file, and only then forgets those marks (with the new position, in
//! one write transaction). A crash anywhere leaves the marks in place: the next flush
//! writes them again (records carry states, not operations, so applying one twice is
//! harmless). The cost of a flush follows the number of changes, not the workspace size;
//! a snapshot (the whole namespace) is written when the deltas of a generation outgrow
//! half of its snapshot or number [`MAX_DELTAS`], and old generations are deleted.
//!
//! Mounts sharing one database take turns through an advisory lock file beside it, so
//! there is one writer at a time per database; `deskfs sync` flushes after its uploads.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deskfs_bucket::Bucket;
use deskfs_meta::{BackupMark, MetaEngine, MetaTxn};
use tokio::runtime::Handle;

use crate::codec::{Encoder, InodeRec, Record};
use crate::file::{encode, FileKind, Header, FORMAT_VERSION};
use crate::layout::{delta_key, generations, snapshot_key};
use crate::{now_ns, BackupError};

/// A generation is compacted into a new snapshot after this many deltas.
pub const MAX_DELTAS: u64 = 500;
/// ... or once its deltas hold more than this share of its snapshot's bytes (or
/// [`MIN_COMPACT_BYTES`], whichever is larger).
pub const COMPACT_SHARE: f64 = 0.5;
/// Deltas smaller than this in total never trigger a snapshot by size.
pub const MIN_COMPACT_BYTES: u64 = 4 << 20;
/// Marks read into one delta at most (a bigger backlog is written as several).
const MARKS_PER_DELTA: usize = 100_000;
/// Rows read per scan step of a snapshot.
const SCAN_STEP: usize = 10_000;

/// Keys of the writer's state in the workspace's `kv` table.
mod kv {
    pub const GEN: &str = "backup.gen";
    pub const SEQ: &str = "backup.seq";
    pub const DELTAS: &str = "backup.deltas";
    pub const DELTA_BYTES: &str = "backup.delta_bytes";
    pub const SNAPSHOT_BYTES: &str = "backup.snapshot_bytes";
    pub const LAST_NS: &str = "backup.last_ns";
}

/// Where the backup stands (kept in the database, shown by `deskfs status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BackupState {
    /// Current generation (`None`: no snapshot written from this database yet).
    pub generation: Option<u64>,
    /// Last change mark in the bucket.
    pub seq: u64,
    /// Deltas written in this generation.
    pub deltas: u64,
    /// Their bytes.
    pub delta_bytes: u64,
    /// Bytes of this generation's snapshot.
    pub snapshot_bytes: u64,
    /// When the last file was written, ns (0 = never).
    pub last_ns: i64,
}

impl BackupState {
    /// Reads the state (in any transaction).
    pub fn read(t: &mut dyn MetaTxn) -> deskfs_meta::Result<BackupState> {
        let mut num = |k: &str| -> deskfs_meta::Result<Option<u64>> {
            Ok(t.get_kv(k)?.and_then(|v| v.parse().ok()))
        };
        Ok(BackupState {
            generation: num(kv::GEN)?,
            seq: num(kv::SEQ)?.unwrap_or(0),
            deltas: num(kv::DELTAS)?.unwrap_or(0),
            delta_bytes: num(kv::DELTA_BYTES)?.unwrap_or(0),
            snapshot_bytes: num(kv::SNAPSHOT_BYTES)?.unwrap_or(0),
            last_ns: t
                .get_kv(kv::LAST_NS)?
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        })
    }

    fn write(&self, t: &mut dyn MetaTxn) -> deskfs_meta::Result<()> {
        if let Some(g) = self.generation {
            t.set_kv(kv::GEN, &g.to_string())?;
        }
        t.set_kv(kv::SEQ, &self.seq.to_string())?;
        t.set_kv(kv::DELTAS, &self.deltas.to_string())?;
        t.set_kv(kv::DELTA_BYTES, &self.delta_bytes.to_string())?;
        t.set_kv(kv::SNAPSHOT_BYTES, &self.snapshot_bytes.to_string())?;
        t.set_kv(kv::LAST_NS, &self.last_ns.to_string())
    }

    /// Whether the generation's deltas call for a new snapshot.
    fn compaction_due(&self) -> bool {
        let limit = ((self.snapshot_bytes as f64 * COMPACT_SHARE) as u64).max(MIN_COMPACT_BYTES);
        self.deltas >= MAX_DELTAS || self.delta_bytes > limit
    }
}

/// What one flush wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlushOutcome {
    /// Files written (snapshot and deltas).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Records in them.
    pub records: u64,
    /// Whether a snapshot (new generation) was written.
    pub snapshot: bool,
    /// Old backup files deleted.
    pub pruned: u64,
    /// Generation after the flush.
    pub generation: u64,
    /// Change mark the bucket's backup is at.
    pub seq: u64,
}

/// Writes one workspace's backup. Cheap to share (`Arc`); flushes are serialised.
pub struct BackupWriter {
    meta: Arc<dyn MetaEngine>,
    bucket: Bucket,
    rt: Handle,
    workspace: String,
    host: String,
    /// Advisory lock file shared by every mount of the database.
    lock_path: PathBuf,
    /// Serialises this process's flushes; holds whether the bucket's generations were
    /// checked against the database's since this writer started.
    inner: Mutex<bool>,
}

impl BackupWriter {
    /// A writer for `meta` (an engine with change marks: SQLite) into `bucket`.
    /// `workspace` is the workspace id of the bucket's format record; `lock_path` a file
    /// beside the database (created when missing).
    pub fn new(
        meta: Arc<dyn MetaEngine>,
        bucket: Bucket,
        rt: Handle,
        workspace: String,
        lock_path: PathBuf,
    ) -> BackupWriter {
        BackupWriter {
            meta,
            bucket,
            rt,
            workspace,
            host: crate::hostname(),
            lock_path,
            inner: Mutex::new(false),
        }
    }

    /// The state kept in the database.
    pub fn state(&self) -> Result<BackupState, BackupError> {
        Ok(deskfs_meta::read(&*self.meta, BackupState::read)?)
    }

    /// Brings the bucket's backup up to every change committed before this call: writes
    /// the pending deltas, and a snapshot first when none is usable or one is due. Must
    /// not be called from inside the runtime. Errors: bucket and engine errors (the
    /// marks stay; the next flush writes them).
    pub fn flush(&self) -> Result<FlushOutcome, BackupError> {
        let mut checked = self
            .inner
            .lock()
            .map_err(|_| BackupError::corrupt("backup writer mutex poisoned"))?;
        let _lock = FileLock::take(&self.lock_path)?;
        let mut st = self.state()?;
        let mut out = FlushOutcome::default();
        let mut need_snapshot = st.generation.is_none();
        if !*checked || need_snapshot {
            let gens = self.rt.block_on(generations(&self.bucket))?;
            let newest = gens.keys().next_back().copied().unwrap_or(0);
            let ours_ok = st
                .generation
                .is_some_and(|g| gens.get(&g).is_some_and(|x| x.snapshot));
            if !ours_ok || newest > st.generation.unwrap_or(0) {
                // No snapshot of ours in the bucket, or another database wrote a newer
                // generation: start a new one above everything there.
                need_snapshot = true;
                st.generation = Some(newest.max(st.generation.unwrap_or(0)));
            }
            *checked = true;
        }
        if need_snapshot || st.compaction_due() {
            self.snapshot(&mut st, &mut out)?;
        }
        loop {
            let wrote = self.delta(&mut st, &mut out)?;
            if !wrote {
                break;
            }
            if st.compaction_due() {
                self.snapshot(&mut st, &mut out)?;
            }
        }
        out.generation = st.generation.unwrap_or(0);
        out.seq = st.seq;
        Ok(out)
    }

    fn header(&self, kind: FileKind, gen: u64, from: u64, to: u64) -> Header {
        Header {
            format: FORMAT_VERSION,
            kind,
            workspace: self.workspace.clone(),
            generation: gen,
            from_seq: from,
            to_seq: to,
            records: 0,
            written_ns: now_ns(),
            host: self.host.clone(),
        }
    }

    /// Writes one delta of the marks after `st.seq`; `false` when there were none.
    fn delta(&self, st: &mut BackupState, out: &mut FlushOutcome) -> Result<bool, BackupError> {
        let from = st.seq;
        let (enc, to) = deskfs_meta::read(&*self.meta, |t| delta_records(t, from))?;
        let Some(to) = to else {
            return Ok(false);
        };
        let gen = st.generation.unwrap_or(0);
        let records = enc.count;
        let data = encode(self.header(FileKind::Delta, gen, from, to), enc)?;
        let n = data.len() as u64;
        self.rt.block_on(
            self.bucket
                .put_bytes(&delta_key(gen, to), Bytes::from(data), None),
        )?;
        st.seq = to;
        st.deltas += 1;
        st.delta_bytes += n;
        self.written(st, out, n, records)?;
        Ok(true)
    }

    /// Writes the whole namespace as the snapshot of a new generation, then deletes
    /// generations older than the previous one.
    fn snapshot(&self, st: &mut BackupState, out: &mut FlushOutcome) -> Result<(), BackupError> {
        let gen = st.generation.map_or(1, |g| g + 1);
        let (enc, to) = deskfs_meta::read(&*self.meta, snapshot_records)?;
        let records = enc.count;
        let data = encode(self.header(FileKind::Snapshot, gen, 0, to), enc)?;
        let n = data.len() as u64;
        self.rt.block_on(
            self.bucket
                .put_bytes(&snapshot_key(gen), Bytes::from(data), None),
        )?;
        *st = BackupState {
            generation: Some(gen),
            seq: to,
            deltas: 0,
            delta_bytes: 0,
            snapshot_bytes: n,
            last_ns: 0,
        };
        self.written(st, out, n, records)?;
        out.snapshot = true;
        out.pruned += self.prune(gen)?;
        Ok(())
    }

    /// After a file of `n` bytes holding `records` reached the bucket: forgets the marks
    /// it covers (up to `st.seq`) and stores the new state, in one transaction.
    fn written(
        &self,
        st: &mut BackupState,
        out: &mut FlushOutcome,
        n: u64,
        records: u64,
    ) -> Result<(), BackupError> {
        st.last_ns = now_ns();
        let new = st.clone();
        deskfs_meta::txn(&*self.meta, |t| {
            t.trim_backup_marks(new.seq)?;
            new.write(t)
        })?;
        out.files += 1;
        out.bytes += n;
        out.records += records;
        Ok(())
    }

    /// Deletes the files of generations older than `current - 1`.
    fn prune(&self, current: u64) -> Result<u64, BackupError> {
        let gens = self.rt.block_on(generations(&self.bucket))?;
        let mut n = 0;
        for (g, files) in gens {
            if g + 1 >= current {
                continue;
            }
            for (key, _) in files.keys {
                self.rt.block_on(self.bucket.delete(&key))?;
                n += 1;
            }
        }
        Ok(n)
    }
}

/// The records of the marks after `from` (at most [`MARKS_PER_DELTA`]) and the last
/// mark they cover (`None`: no marks).
fn delta_records(t: &mut dyn MetaTxn, from: u64) -> deskfs_meta::Result<(Encoder, Option<u64>)> {
    let marks = t.backup_marks(from, MARKS_PER_DELTA)?;
    let Some(to) = marks.last().map(|(s, _)| *s) else {
        return Ok((Encoder::new()?, None));
    };
    let mut inodes = BTreeSet::new();
    let mut dentries = BTreeSet::new();
    let mut objects = BTreeSet::new();
    for (_, m) in marks {
        match m {
            BackupMark::Inode(i) => {
                inodes.insert(i);
            }
            BackupMark::Dentry { parent, name } => {
                dentries.insert((parent, name));
            }
            BackupMark::Object(p) => {
                objects.insert(p);
            }
        }
    }
    let mut enc = Encoder::new()?;
    for ino in inodes {
        match t.get_inode(ino)? {
            Some(row) => {
                enc.push(&Record::Inode(InodeRec::of(&row)));
                enc.push(&Record::Xattrs {
                    ino,
                    attrs: t.xattrs_of(ino)?,
                });
            }
            None => enc.push(&Record::InodeGone(ino)),
        }
    }
    for (parent, name) in dentries {
        match t.lookup(parent, &name)? {
            Some(d) => enc.push(&Record::Dentry {
                parent,
                name,
                ino: d.ino,
            }),
            None => enc.push(&Record::DentryGone { parent, name }),
        }
    }
    for path in objects {
        match t.get_object(&path)? {
            Some(o) => enc.push(&Record::Object(o)),
            None => enc.push(&Record::ObjectGone(path)),
        }
    }
    Ok((enc, Some(to)))
}

/// Every inode (with its xattrs), entry and recorded object, and the mark they are at.
fn snapshot_records(t: &mut dyn MetaTxn) -> deskfs_meta::Result<(Encoder, u64)> {
    let to = t.backup_mark_end()?;
    let mut enc = Encoder::new()?;
    let mut after = 0;
    loop {
        let rows = t.scan_inodes(after, SCAN_STEP)?;
        let Some(last) = rows.last().map(|r| r.ino) else {
            break;
        };
        for r in &rows {
            enc.push(&Record::Inode(InodeRec::of(r)));
            let attrs = t.xattrs_of(r.ino)?;
            if !attrs.is_empty() {
                enc.push(&Record::Xattrs { ino: r.ino, attrs });
            }
        }
        after = last;
    }
    let mut after = 0;
    loop {
        let rows = t.scan_dentries(after, SCAN_STEP)?;
        let Some(last) = rows.last().map(|d| d.cookie) else {
            break;
        };
        for d in rows {
            enc.push(&Record::Dentry {
                parent: d.parent,
                name: d.name,
                ino: d.ino,
            });
        }
        after = last;
    }
    let mut after: Vec<u8> = Vec::new();
    loop {
        let rows = t.scan_objects(&after, SCAN_STEP)?;
        let Some(last) = rows.last().map(|o| o.path.clone()) else {
            break;
        };
        for o in rows {
            enc.push(&Record::Object(o));
        }
        after = last;
    }
    Ok((enc, to))
}

/// An exclusive `flock` on a file, released on drop.
struct FileLock(File);

impl FileLock {
    fn take(path: &std::path::Path) -> Result<FileLock, BackupError> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(FileLock(f))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlock of a descriptor we own (closing would release it too).
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}
