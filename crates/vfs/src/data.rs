//! File content: open/create, read, write, flush/release, fsync, truncate; the staging
//! file (local journal), remote reads through the block cache with readahead, and
//! materialising a remote file locally before its first write.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deskfs_bucket::BucketError;
use deskfs_cache::BlockKey;
use deskfs_meta::{AttrUpdate, Ino, InodeRow, Kind, Op, OpOut};
use futures::future::{BoxFuture, FutureExt, Shared};

use crate::changes::{Batch, Plan};
use crate::datasync::DataSync;
use crate::handles::{Handle, InodeState, OpenRecord};
use crate::kernel_sync::{AttrStamp, Synced};
use crate::namespace::{NewNode, NodeSpec};
use crate::open_gate::Role;
use crate::passthrough::Absorb;
use crate::types::{Attr, Ctx, Opened};
use crate::{now_ns, poisoned, Result, Vfs, VfsError};

/// Largest file size, bytes (ext4 with 4 KiB blocks: 16 TiB).
pub const MAX_FILE_SIZE: u64 = 16 << 40;
/// Range size of whole-file downloads, bytes.
const DOWNLOAD_CHUNK: u64 = 8 << 20;

type BlockFuture = Shared<BoxFuture<'static, std::result::Result<Bytes, FetchError>>>;

/// Why a block fetch failed (cloneable: one fetch answers every reader of the block).
#[derive(Clone, Debug)]
enum FetchError {
    /// The object no longer has the ETag the fetch asked for, or is gone (key).
    Moved(String),
    /// Anything else (message).
    Other(String),
}

impl From<FetchError> for VfsError {
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::Moved(key) => VfsError::Bucket(BucketError::Changed(key)),
            FetchError::Other(m) => io_err(m),
        }
    }
}

/// What [`Vfs::locked_inner`] reads under the inode's lock before its body runs.
#[derive(Clone, Copy, Debug)]
enum RowRead {
    /// Nothing (the state alone).
    No,
    /// The committed row, servable here: an orphan only while this mount holds the inode
    /// (open or uncommitted).
    Servable,
    /// The committed row, orphans too (the request began while the inode had its name).
    Any,
    /// The row as a new `open` may use it: of orphans, only those this mount made and
    /// keeps. An orphan another mount made is reached through a stale dentry, even while
    /// this mount has it open — on ext4 that open of the path fails. This matters because
    /// FUSE sends `release` after `close(2)` returned: a process that closed a file, saw
    /// another mount delete it and opens the path again must not be served the deleted
    /// file because the `release` is still on its way.
    ForOpen,
    /// As `Any` (`orphan_ok`) or `ForOpen`, read in the same round trip as a +1 on
    /// `session`'s open count of the inode (see [`Vfs::locked_for_open`]).
    Counted { orphan_ok: bool, session: u64 },
}

/// An open's count in the open-file table that no handle owns yet: taken back (off the
/// request path) when the open fails.
struct UnownedCount<'a> {
    vfs: &'a Vfs,
    ino: Ino,
    /// The session it was made under, if it was made.
    session: Option<u64>,
}

impl Drop for UnownedCount<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.vfs.unrecord_later(self.ino, session);
        }
    }
}

/// How durable a commit must be when it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CommitSync {
    /// Committed: survives a crash of the daemon (`close`).
    Commit,
    /// `fdatasync`: the data, and what reading it back needs, survive a power loss.
    Data,
    /// `fsync`: the data and every attribute survive a power loss.
    Full,
}

/// What the locked part of an `open` decided.
enum OpenStep {
    /// Wait for content another cache holds, then try again.
    Remote(InodeRow),
    /// Opened (the open count is taken).
    Opened {
        file: bool,
        stale: bool,
        version: u64,
        keep: bool,
        /// The backing file of a passthrough open (counted in the state's `pt`).
        backing: Option<Arc<File>>,
        /// The attributes of the row the step was decided on.
        stamp: AttrStamp,
        /// Who tells the kernel, when several opens find it stale at once.
        role: Role,
    },
}

/// What one attempt of a read from the bucket found.
enum RemoteRead {
    /// The bytes asked for (short at end of file).
    Data(Vec<u8>),
    /// The version the attempt resolved was replaced while it waited for another mount's
    /// upload: the caller looks again from the top (the newer version may be local here).
    Moved,
}

/// Distance between a read and the end of the one before it (or from offset 0, for a
/// handle's first read) beyond which a reader is not reading the file whole, bytes (see
/// `fill`).
const FILL_JUMP: u64 = 8 << 20;

/// Readahead window of a reader's first sequential read, blocks (doubles from there).
const RA_START_BLOCKS: u64 = 2;

/// Block fetches in flight, shared so that a reader and the readahead never fetch the
/// same block twice.
#[derive(Default, Clone)]
pub(crate) struct Inflight {
    map: Arc<Mutex<HashMap<BlockKey, BlockFuture>>>,
}

impl Inflight {
    /// Whether no block fetch is in flight (or waiting for its cache write).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Whether a fetch of every block of `keys` is in flight (started, or completed with
    /// its block not yet kept: see [`Vfs::keep_block`]).
    pub(crate) fn all_in_flight(&self, mut keys: impl Iterator<Item = BlockKey>) -> bool {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        keys.all(|k| map.contains_key(&k))
    }
}

fn io_err(msg: impl Into<String>) -> VfsError {
    VfsError::Io(std::io::Error::other(msg.into()))
}

impl Vfs {
    /// Runs `f` on the live in-memory state of `ino` (created and loaded from the metadata
    /// engine if absent), locked. A state detached from the table by a concurrent last
    /// close is never used: the lookup is retried. Afterwards the state is dropped from the
    /// table when no handle holds it and nothing is uncommitted.
    pub(crate) fn locked<T>(
        &self,
        ino: Ino,
        f: impl FnOnce(&mut InodeState) -> Result<T>,
    ) -> Result<T> {
        self.locked_inner(ino, RowRead::No, |s, _| f(s), None)
    }

    /// [`Vfs::locked`] that also reads the inode's committed row under the state's lock
    /// (one round trip, which also loads a fresh state) and hands it to `f`: the row is
    /// never older than this mount's own commits. `ESTALE` when the inode is gone or
    /// another mount's orphan.
    pub(crate) fn locked_fresh<T>(
        &self,
        ino: Ino,
        f: impl FnOnce(&mut InodeState, &InodeRow) -> Result<T>,
    ) -> Result<T> {
        self.locked_fresh_as(ino, false, f)
    }

    /// [`Vfs::locked_fresh`]; with `orphan_ok`, an orphan of another mount is served too
    /// (the request began while the inode still had its name).
    fn locked_fresh_as<T>(
        &self,
        ino: Ino,
        orphan_ok: bool,
        f: impl FnOnce(&mut InodeState, &InodeRow) -> Result<T>,
    ) -> Result<T> {
        let read = if orphan_ok {
            RowRead::Any
        } else {
            RowRead::Servable
        };
        self.locked_row(ino, read, f)
    }

    /// [`Vfs::locked_fresh_as`] for a new `open`: unless `orphan_ok`, an orphan is served
    /// only when this mount made it and keeps it (see [`RowRead::ForOpen`]).
    /// `count`: also count an open of that session in the open-file table, in the same
    /// round trip as the row's read (while other mounts are live). `Ok`: the count was
    /// made and is the caller's; `Err`: none is left (it is queued to be taken back).
    fn locked_for_open<T>(
        &self,
        ino: Ino,
        orphan_ok: bool,
        count: Option<u64>,
        f: impl FnOnce(&mut InodeState, &InodeRow) -> Result<T>,
    ) -> Result<T> {
        let read = match (count, orphan_ok) {
            (Some(session), _) => RowRead::Counted { orphan_ok, session },
            (None, true) => RowRead::Any,
            (None, false) => RowRead::ForOpen,
        };
        self.locked_row(ino, read, |s, row| {
            let out = f(s, row);
            if let (Err(_), Some(session)) = (&out, count) {
                self.unrecord_later(ino, session);
            }
            out
        })
    }

    /// The row of `ino` read in one batch with a +1 on `session`'s open count of it; as
    /// [`Vfs::current_held`] otherwise (the count is queued to be taken back when the
    /// row is not servable). Errors: `EIO` when `session` was expired (another mount
    /// fenced this one: it registers anew first; a count under the dead session would
    /// outlive it, and the orphan it names would never be purged).
    fn current_counting_open(&self, ino: Ino, held: bool, session: u64) -> Result<InodeRow> {
        let out = self
            .meta
            .apply(&[
                Op::CheckSession(session),
                Op::AddOpen {
                    ino,
                    session,
                    delta: 1,
                },
                Op::GetInode(ino),
            ])
            .map_err(|e| self.on_meta_error(e))?;
        let res = match out.get(2).and_then(OpOut::row) {
            Some(r) => self.servable(r, held).map(|()| {
                self.hints.note_row(r);
                r.clone()
            }),
            None => Err(self.gone(ino)),
        };
        if res.is_err() {
            self.unrecord_later(ino, session);
        }
        res
    }

    /// Takes back an open count of `session` on `ino` off the request path.
    fn unrecord_later(&self, ino: Ino, session: u64) {
        self.releases.push(crate::release::QueuedRelease {
            ino,
            unrecord: Some(session),
            last: None,
        });
    }

    fn locked_row<T>(
        &self,
        ino: Ino,
        read: RowRead,
        f: impl FnOnce(&mut InodeState, &InodeRow) -> Result<T>,
    ) -> Result<T> {
        self.locked_inner(
            ino,
            read,
            |s, r| match r {
                Some(r) => f(s, r),
                None => Err(VfsError::Stale),
            },
            None,
        )
    }

    /// `read`: what is read under the lock first (see [`RowRead`]). `known`: a row just
    /// written by this mount, to load a fresh state from.
    fn locked_inner<T>(
        &self,
        ino: Ino,
        read: RowRead,
        f: impl FnOnce(&mut InodeState, Option<&InodeRow>) -> Result<T>,
        known: Option<&InodeRow>,
    ) -> Result<T> {
        loop {
            let st = self.state_arc(ino);
            let mut s = st.lock().map_err(|_| poisoned())?;
            if s.detached {
                continue;
            }
            let fetched = match read {
                RowRead::No => None,
                RowRead::Servable => {
                    Some(self.current_held(ino, Some(s.open_count > 0 || s.uncommitted)))
                }
                RowRead::Any => Some(self.current_held(ino, Some(true))),
                RowRead::ForOpen => Some(self.current_held(ino, Some(false))),
                RowRead::Counted { orphan_ok, session } => {
                    Some(self.current_counting_open(ino, orphan_ok, session))
                }
            };
            let row = match fetched.transpose() {
                Ok(r) => r,
                Err(e) => {
                    self.maybe_detach(ino, &st, &mut s);
                    return Err(e);
                }
            };
            if !s.loaded {
                let loaded = match row.as_ref().or(known) {
                    Some(r) => {
                        s.fill(r);
                        Ok(())
                    }
                    None => self.load_state(ino, &mut s),
                };
                if let Err(e) = loaded {
                    self.maybe_detach(ino, &st, &mut s);
                    return Err(e);
                }
            }
            // Writes made through a passthrough backing file since the last request.
            if s.pt.writers() > 0 {
                if let Err(e) = self.absorb_backing(ino, &mut s, Absorb::Seen) {
                    self.maybe_detach(ino, &st, &mut s);
                    return Err(e);
                }
            }
            let out = f(&mut s, row.as_ref());
            self.maybe_detach(ino, &st, &mut s);
            return out;
        }
    }

    /// Like [`Vfs::locked`] for infallible bodies.
    pub(crate) fn with_state<T>(
        &self,
        ino: Ino,
        f: impl FnOnce(&mut InodeState) -> T,
    ) -> Result<T> {
        self.locked(ino, |s| Ok(f(s)))
    }

    pub(crate) fn state_arc(&self, ino: Ino) -> Arc<Mutex<InodeState>> {
        let mut m = self.inodes.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(ino).or_default().clone()
    }

    fn load_state(&self, ino: Ino, s: &mut InodeState) -> Result<()> {
        let row = self.meta.get_inode(ino)?.ok_or(VfsError::Stale)?;
        s.fill(&row);
        Ok(())
    }

    /// Close-to-open (and lock-to-read) coherence between mounts: when the committed
    /// content differs from what this mount's state holds, or from what the kernel's page
    /// cache and cached attributes were last told (another mount wrote), reload size and
    /// times, reopen the staging file, and (with `kernel`) drop the kernel's cached pages
    /// and attributes — the kernel would otherwise read the new content through the old
    /// size. Nothing changes while this mount has uncommitted writes (they win at their
    /// commit).
    pub(crate) fn revalidate(&self, ino: Ino, kernel: bool) -> Result<()> {
        let read_began = std::time::Instant::now();
        let (changed, version, stamp) = self.locked_fresh(ino, |s, row| {
            let (changed, version) = Self::adopt_row(s, row);
            Ok((changed, version, AttrStamp::of(row)))
        })?;
        if self.after_revalidate(ino, changed, version, kernel) {
            let sync = Synced { read_began, stamp };
            self.kernel_syncs.synced(ino, sync);
        }
        Ok(())
    }

    /// Moves a state that has no uncommitted writes to the committed content of `row`;
    /// returns whether it changed, and the version the state now holds.
    /// While files are open here through passthrough, their backing file stays what they
    /// read: the state keeps its content until their last close (their writes win at
    /// their commit, as uncommitted writes do).
    fn adopt_row(s: &mut InodeState, row: &InodeRow) -> (bool, u64) {
        if s.uncommitted || s.pt.active() || (row.data_version == s.version && row.size == s.size) {
            return (false, s.version);
        }
        s.size = row.size;
        s.mtime_ns = row.mtime_ns;
        s.ctime_ns = row.ctime_ns;
        s.version = row.data_version;
        s.staging = None;
        (true, row.data_version)
    }

    /// The kernel's view after a revalidation: its cached size and pages go when the
    /// content changed, or when (shared) they may be another version's than `version`.
    /// Returns whether the kernel was sent an invalidation.
    fn after_revalidate(&self, ino: Ino, changed: bool, version: u64, kernel: bool) -> bool {
        // The state may be fresh (loaded just now) while the kernel still caches an older
        // version's size and pages: compare with what the kernel was last given too.
        let kernel_stale = self.shared() && !self.kernel_pages.holds(ino, version);
        if changed || kernel_stale {
            if kernel {
                self.invalidate_now(&crate::Invalidation::Inode(ino));
                return true;
            }
            self.kernel_pages.forget(ino);
        }
        false
    }

    /// Removes an idle state from the table (caller holds the state's lock).
    fn maybe_detach(&self, ino: Ino, st: &Arc<Mutex<InodeState>>, s: &mut InodeState) {
        if s.open_count == 0 && !s.uncommitted {
            let mut m = self.inodes.lock().unwrap_or_else(|p| p.into_inner());
            if m.get(&ino).is_some_and(|cur| Arc::ptr_eq(cur, st)) {
                m.remove(&ino);
            }
            s.staging = None;
            s.loaded = false;
            s.detached = true;
        }
    }

    pub(crate) fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .lock()
            .map_err(|_| poisoned())?
            .get(&fh)
            .cloned()
            .ok_or(VfsError::BadHandle)
    }

    /// A new handle. `recorded`: the session its open is already counted under in the
    /// open-file table (`open` counts it with its read of the row, `create` in its own
    /// batch); otherwise (or when that session was replaced meanwhile) it is recorded now
    /// when other mounts are live (see [`Vfs::publish_opens`]). `passthrough`: it was
    /// counted as a passthrough open.
    fn new_handle(
        &self,
        ino: Ino,
        flags: i32,
        recorded: Option<u64>,
        passthrough: bool,
    ) -> Result<u64> {
        let acc = flags & libc::O_ACCMODE;
        let h = Arc::new(Handle::new(
            ino,
            acc == libc::O_RDONLY || acc == libc::O_RDWR,
            acc == libc::O_WRONLY || acc == libc::O_RDWR,
            flags & libc::O_APPEND != 0,
            false,
            if recorded.is_some() {
                OpenRecord::Recorded
            } else {
                OpenRecord::Unrecorded
            },
        ));
        h.passthrough.store(passthrough, Ordering::SeqCst);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        {
            // Inserted under the fencing lock: a re-registration either comes after and
            // finds this handle (and records it again under its new session), or came
            // before, and the count was made under a session that is gone (its records
            // went with it): then the handle is unrecorded, and recorded below.
            let _fencing = recorded.map(|_| {
                self.coherence
                    .fencing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
            });
            if recorded.is_some_and(|counted| counted != self.coherence.session()) {
                h.unrecord();
            }
            self.handles
                .lock()
                .map_err(|_| poisoned())?
                .insert(fh, h.clone());
        }
        // Inserted first, then checked: either this open sees the shared state or the
        // publisher (which moves the state first) sees this handle.
        // (Only an unrecorded handle is claimed.)
        if self.shared() && h.claim_record() {
            let session = self.coherence.session();
            // Under a live session only (a count under an expired one would outlive it).
            let res = self.meta.apply(&[
                Op::CheckSession(session),
                Op::AddOpen {
                    ino,
                    session,
                    delta: 1,
                },
            ]);
            match res {
                Ok(_) => {
                    if h.finish_record() == OpenRecord::Closed {
                        let _ = self.meta.apply(&[Op::AddOpen {
                            ino,
                            session,
                            delta: -1,
                        }]);
                    }
                }
                Err(e) => {
                    h.abandon_record();
                    self.handles.lock().map_err(|_| poisoned())?.remove(&fh);
                    return Err(self.on_meta_error(e));
                }
            }
        }
        Ok(fh)
    }

    /// Takes back the open count (and passthrough count, when `passthrough`; opened for
    /// writing: `write`) of an open whose handle could not be made.
    fn uncount_open(&self, ino: Ino, passthrough: bool, write: bool) {
        let _ = self.with_state(ino, |s| {
            s.open_count = s.open_count.saturating_sub(1);
            if passthrough {
                self.passthrough_gone(ino, s, write);
            }
        });
    }

    /// `open`: a handle on an existing inode; `O_TRUNC` truncates (without fetching the old
    /// content). Errors: `ENOENT`, `EISDIR` (write on a directory).
    pub fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Opened> {
        let r = self.open_inner(ctx, ino, flags);
        tracing::debug!(ino, pid = ctx.pid, flags, ok = r.is_ok(), err = ?r.as_ref().err(), "open");
        if matches!(r, Err(VfsError::Stale)) {
            // The kernel looks the path up again and repeats the open (see `kernel_refs`).
            self.retries.staled(ctx.pid);
        }
        r
    }

    fn open_inner(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Opened> {
        let acc = flags & libc::O_ACCMODE;
        let trunc = flags & libc::O_TRUNC != 0 && acc != libc::O_RDONLY;
        // An open for reading is the access that moves atime (see `atime`).
        let reads = acc != libc::O_WRONLY && flags & libc::O_NOATIME == 0;
        let mut atime_queued = false;
        // The kernel's repeat of an open we answered ESTALE, through a fresh lookup: that
        // inode is served even if it lost its name since (see `kernel_refs`).
        let retry = self.retries.is_retry(ctx.pid, ino);
        if retry {
            tracing::debug!(ino, pid = ctx.pid, "open: the kernel's retry after ESTALE");
        }
        let mut waited = false;
        // While other mounts are live the open is counted in the open-file table, in the
        // round trip that reads the row (once, whatever the loop below repeats).
        let mut count = UnownedCount {
            vfs: self,
            ino,
            session: None,
        };
        loop {
            // One round trip: the committed row, read under the state's lock. After a
            // wait for remote content, the inode is served even if it lost its name
            // during the wait: this open began while it had it.
            let ask = (count.session.is_none() && self.shared()).then(|| self.coherence.session());
            // Before the row read: an invalidation sent on its strength covers every
            // change committed before this instant (see `kernel_sync`).
            let read_began = std::time::Instant::now();
            let step = self.locked_for_open(ino, retry || waited, ask, |s, row| {
                self.open_step(ino, s, row, acc, trunc, waited)
                    .inspect(|step| {
                        if reads && matches!(step, OpenStep::Opened { file: true, .. }) {
                            atime_queued |= self.accessed_file(ino, s, row);
                        }
                    })
            })?;
            // A follower sends nothing (`open_gate`): an attribute invalidation moves the
            // kernel's attribute version as a whole one does, and could land in the
            // leader's refresh; its access time shows once the kernel's attributes expire.
            let follows = matches!(
                step,
                OpenStep::Opened {
                    role: Role::Follow(_),
                    ..
                }
            );
            if std::mem::take(&mut atime_queued) && !follows {
                // Outside the state's lock; the kernel holds no lock of this inode during
                // OPEN, and an attribute-only invalidation waits for nothing.
                self.invalidate_now(&crate::Invalidation::Attrs(ino));
            }
            count.session = count.session.or(ask);
            match step {
                OpenStep::Remote(row) => {
                    self.await_remote_content(&row)?;
                    // The first block now, before the object can be replaced.
                    self.prefetch_first_block(&row);
                    waited = true;
                }
                OpenStep::Opened {
                    file,
                    stale,
                    version,
                    keep,
                    backing,
                    stamp,
                    role,
                } => {
                    // Another mount's new content: the kernel's cached size and pages go
                    // (the kernel holds no lock of this inode during OPEN), once for all
                    // the opens finding it stale at once (`open_gate`).
                    let sync = Synced { read_began, stamp };
                    let tell = match role {
                        Role::Lead(lead) => {
                            self.tell_kernel_opened(ino, version, sync);
                            lead.delivered();
                            false
                        }
                        // Sent by the leader (delivered, or its own if it gave up).
                        Role::Follow(gate) => !gate.wait(),
                        Role::Alone => file && stale,
                    };
                    if tell {
                        self.tell_kernel_opened(ino, version, sync);
                    }
                    #[cfg(test)]
                    if let Some(race) = tests::BEFORE_NEW_HANDLE.with(|r| r.borrow_mut().take()) {
                        race();
                    }
                    let fh = self
                        .new_handle(ino, flags, count.session, backing.is_some())
                        .inspect_err(|_| {
                            self.uncount_open(ino, backing.is_some(), acc != libc::O_RDONLY)
                        })?;
                    // The handle owns the count now (its release takes it back).
                    count.session = None;
                    return Ok(Opened {
                        fh,
                        keep_cache: keep,
                        backing,
                    });
                }
            }
        }
    }

    /// An open found the kernel's cached size and pages of `ino` stale: drops them; from
    /// now on the kernel caches content `version`. The feed's later invalidation of the
    /// same change is left out (it could make the kernel drop the attributes the opener is
    /// about to read: see `kernel_sync`).
    fn tell_kernel_opened(&self, ino: Ino, version: u64, sync: Synced) {
        #[cfg(test)]
        if let Some(race) = tests::BEFORE_OPEN_INVALIDATES.with(|r| r.borrow_mut().take()) {
            race();
        }
        self.invalidate_now(&crate::Invalidation::Inode(ino));
        self.kernel_pages.opened(ino, version);
        self.kernel_syncs.synced(ino, sync);
    }

    /// An open of file `ino` for reading, under its state's lock: queues the access time
    /// by the mount's rule, judged on the times including this mount's uncommitted writes.
    /// Returns whether it was queued (the caller drops the kernel's cached attributes).
    fn accessed_file(&self, ino: Ino, s: &InodeState, row: &InodeRow) -> bool {
        let (mtime, ctime) = if s.loaded && s.uncommitted {
            (s.mtime_ns.max(row.mtime_ns), s.ctime_ns.max(row.ctime_ns))
        } else {
            (row.mtime_ns, row.ctime_ns)
        };
        self.accessed(ino, row.atime_ns, mtime, ctime, now_ns())
    }

    /// One step of `open` under the inode's lock, from its committed `row`.
    fn open_step(
        &self,
        ino: Ino,
        s: &mut InodeState,
        row: &InodeRow,
        acc: i32,
        trunc: bool,
        waited: bool,
    ) -> Result<OpenStep> {
        if row.kind == Kind::Dir && acc != libc::O_RDONLY {
            return Err(VfsError::IsDir);
        }
        let file = row.kind == Kind::File;
        let (changed, version) = if file {
            Self::adopt_row(s, row)
        } else {
            (false, s.version)
        };
        // Close-to-open across caches: content only another mount's journal
        // holds is uploaded by it first (waited for outside this lock).
        if file && !trunc && !waited && row.dirty && row.local != self.here() {
            return Ok(OpenStep::Remote(row.clone()));
        }
        // The kernel's cached size and pages are another version's when the
        // content changed, or (shared) when it was last given another one.
        let stale = changed || (self.shared() && !self.kernel_pages.holds(ino, version));
        if trunc && file {
            self.truncate_locked(ino, s, 0)?;
        }
        s.open_count += 1;
        let backing = if file {
            match self.passthrough_grant(ino, s, row, acc != libc::O_RDONLY) {
                Ok(b) => b,
                Err(e) => {
                    s.open_count -= 1;
                    return Err(e);
                }
            }
        } else {
            None
        };
        // Several opens finding the kernel stale at once: one tells it (`open_gate`).
        let role = if file && !trunc {
            self.open_gates
                .role(ino, s.version, AttrStamp::of(row), stale)
        } else {
            Role::Alone
        };
        let follows = matches!(role, Role::Follow(_));
        // The kernel's pages stay when they hold the current content (every
        // change since came through this kernel, or was invalidated).
        let keep = file && !trunc && !stale && !follows && self.kernel_pages.opened(ino, s.version);
        Ok(OpenStep::Opened {
            file,
            stale,
            version: s.version,
            keep,
            backing,
            stamp: AttrStamp::of(row),
            role,
        })
    }

    /// Starts fetching the first block of `row`'s content into the block cache (content
    /// just uploaded for this mount by another one; small files are then read whole).
    fn prefetch_first_block(&self, row: &InodeRow) {
        if row.size == 0 {
            return;
        }
        let src = deskfs_meta::read(&*self.meta, |t| {
            t.object_with_content(row.ino, row.data_version)
        });
        if let Ok(Some(src)) = src {
            let k = BlockKey {
                ino: row.ino,
                version: row.data_version,
                index: 0,
            };
            if !self.cache.has_block(&k) {
                if let Some(fut) = self.block_future_ahead(k, &src.key, src.etag.clone(), row.size)
                {
                    self.rt.spawn(fut.map(|_| ()));
                }
            }
        }
    }

    /// `create`: a new regular file, opened. Errors: `EEXIST`, `ENOENT`, `ENOTDIR`,
    /// `ENAMETOOLONG`.
    pub fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Opened)> {
        self.retries.ended(ctx.pid);
        let open_in = self.shared().then(|| self.coherence.session());
        let NewNode { row, staging } = self.create_node(
            ctx,
            parent,
            name,
            NodeSpec {
                open_in,
                ..NodeSpec::new(Kind::File, mode & !umask & 0o7777)
            },
        )?;
        // The state starts from the row just created (no read needed).
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let backing = self.locked_inner(
            row.ino,
            RowRead::No,
            |s, _| {
                s.open_count += 1;
                // Dirty from birth, committed just now.
                s.dirty_mark.committed(self.coherence.alone_period());
                self.kernel_pages.opened(row.ino, s.version);
                // Its staging file was made (and opened) by `create_node`: the first
                // write needs no look at the row to find where the content is.
                if s.staging.is_none() {
                    s.staging = staging.map(Arc::new);
                }
                // Written next, most likely: the row is dirty from its create, and the
                // writer lock taken now keeps every uploader from marking it clean
                // before that write (see `InodeState::create_guard`).
                if write && row.dirty {
                    if let Some(f) = s.staging.clone() {
                        if s.hold_writer_lock(&f).is_ok() {
                            s.create_guard = Some(now_ns());
                        }
                    }
                }
                match self.passthrough_grant(row.ino, s, &row, write) {
                    Ok(b) => Ok(b),
                    Err(e) => {
                        s.open_count -= 1;
                        Err(e)
                    }
                }
            },
            Some(&row),
        )?;
        let fh = self
            .new_handle(row.ino, flags, open_in, backing.is_some())
            .inspect_err(|_| self.uncount_open(row.ino, backing.is_some(), write))?;
        Ok((
            crate::attr_of(&row),
            Opened {
                fh,
                keep_cache: false,
                backing,
            },
        ))
    }

    /// Makes the content of `ino` local in its staging file (download when needed; not when
    /// the caller is about to truncate to 0). Caller holds the state lock.
    pub(crate) fn ensure_local(
        &self,
        ino: Ino,
        s: &mut InodeState,
        truncating_to: Option<u64>,
    ) -> Result<Arc<File>> {
        if let Some(f) = &s.staging {
            return Ok(f.clone());
        }
        let start = std::time::Instant::now();
        let (row, tmp) = loop {
            let row = self.current(ino)?;
            if row.local == self.here() {
                match self.cache.open_staging(ino, false) {
                    Ok(f) => {
                        let f = Arc::new(f);
                        s.staging = Some(f.clone());
                        return Ok(f);
                    }
                    // An empty file whose staging file was never created (crash right
                    // after its create committed) falls through and gets an empty one.
                    Err(e) if row.size > 0 => {
                        tracing::error!(ino, error = %e, "staging file missing for a local inode");
                        if row.dirty {
                            return Err(e.into());
                        }
                    }
                    Err(_) => {}
                }
            }
            // A complete fill of this version is the download (a kernel may read it as
            // its backing file: it must become the staging file).
            if let Some(tmp) = self.take_fill(&row)? {
                break (row, Some(tmp));
            }
            if row.size == 0 || truncating_to == Some(0) {
                break (row, None);
            }
            // Content held by another cache is uploaded by its mount first. A newer
            // commit during that wait (perhaps this mount's own) is looked at afresh. A
            // row naming this cache whose staging file is gone (clean: the bucket has
            // it) is downloaded at once.
            let now = self.await_remote_content(&row)?;
            let moved = now.data_version != row.data_version
                || (now.local == self.here() && row.local != self.here());
            if moved && start.elapsed() < self.cfg.remote_wait {
                continue;
            }
            let tmp = self.download_full(&row)?;
            break (row, Some(tmp));
        };
        self.adopt_local(&row, tmp.as_deref())?;
        let f = Arc::new(self.cache.open_staging(ino, false)?);
        s.staging = Some(f.clone());
        Ok(f)
    }

    /// Downloads `row`'s content and makes this cache its holder (a copy kept before the
    /// last bucket copy of live content is replaced).
    pub(crate) fn make_local(&self, row: &InodeRow) -> Result<()> {
        let tmp = self.download_full(row)?;
        self.adopt_local(row, Some(&tmp))
    }

    /// Makes this cache the holder of `row`'s content version: the downloaded file `tmp`
    /// (or an empty file) becomes the staging file, replacing a stale one, unless a mount
    /// sharing this cache dir did the same first. Serialised per cache dir, and recorded
    /// only while the version is still current. An empty file for content that is not
    /// empty (a truncation to 0 needs no download) is recorded dirty in the same
    /// transaction: a clean row names a cache only where its content is (a crash right
    /// after the record must not leave this cache serving an empty file as the old
    /// version; recovery takes a dirty one as the truncation applied).
    pub(crate) fn adopt_local(&self, row: &InodeRow, tmp: Option<&std::path::Path>) -> Result<()> {
        let here = self.here();
        let _lock = self.cache.local_lock()?;
        let cur = self.meta.get_inode(row.ino)?.ok_or(VfsError::Stale)?;
        let path = self.cache.staging_path(row.ino);
        if cur.local == here && path.exists() {
            // A sibling mount made it local meanwhile: its file stays.
            if let Some(t) = tmp {
                let _ = std::fs::remove_file(t);
            }
            return Ok(());
        }
        match tmp {
            Some(t) => {
                // The download was flushed; its new name must be on disk too before the
                // row names this cache (a power loss must not leave a clean row here
                // with no file).
                std::fs::rename(t, &path)?;
                self.cache.sync_staging_names()?;
            }
            None => {
                let f = self.cache.open_staging(row.ino, true)?;
                f.set_len(0)?;
                f.sync_all()?;
            }
        }
        let version = row.data_version;
        let emptied = tmp.is_none() && row.size > 0;
        if emptied {
            self.cache.staging_dirty(row.ino);
        }
        #[cfg(test)]
        if let Some(race) = tests::BEFORE_ADOPT_RECORD.with(|r| r.borrow_mut().take()) {
            race();
        }
        deskfs_meta::txn(&*self.meta, |t| {
            if let Some(mut r) = t.get_inode(row.ino)? {
                if r.data_version == version && r.local != here {
                    r.local = here;
                    r.dirty |= emptied;
                    t.update_inode(&r)?;
                }
            }
            Ok::<_, deskfs_meta::MetaError>(())
        })?;
        #[cfg(test)]
        if let Some(check) = tests::AFTER_ADOPT_RECORD.with(|r| r.borrow_mut().take()) {
            check();
        }
        Ok(())
    }

    /// Removes the staging files of `inos`, whose rows a committed transaction made name
    /// no copy in this cache (an eviction; content another tool replaced). An open since
    /// that commit (an `O_TRUNC` open needs no download: it makes the same file local
    /// again, see [`Vfs::adopt_local`]) would have its writes go to a removed file: each
    /// is removed under the staging-area lock that adoption takes, and only while its row
    /// still names no copy here and it is not open. Errors are logged: a file left is
    /// removed by the next mount's index ([`Vfs::index_staging`]).
    pub(crate) fn remove_unheld_staging(&self, inos: &[Ino]) {
        if inos.is_empty() {
            return;
        }
        let here = self.here();
        let _lock = match self.cache.local_lock() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot lock the staging area; unheld staging files stay until the next mount's index");
                return;
            }
        };
        for &ino in inos {
            match self.meta.get_inode(ino) {
                Ok(r) if r.as_ref().is_none_or(|r| r.local != here) && !self.is_open(ino) => {
                    if let Err(e) = self.cache.remove_staging(ino) {
                        tracing::warn!(ino, error = %e, "cannot remove an unheld staging file");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(ino, error = %e, "cannot read an inode whose staging file goes; its staging file stays")
                }
            }
        }
    }

    /// Downloads the whole content of `row` (its current version) into a new file of its
    /// own beside the staging file (another mount sharing this cache dir may download
    /// the same inode at the same time), fsynced; returns its path. The object it reads
    /// may be replaced or removed meanwhile (an uploader's copy and delete after a rename,
    /// here or on another mount): then the source is resolved again, as
    /// [`Vfs::read`] does, for up to `remote_wait`. Errors: `EIO` (the content is
    /// nowhere readable, or kept moving).
    pub(crate) fn download_full(&self, row: &InodeRow) -> Result<std::path::PathBuf> {
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(2);
        loop {
            match self.download_full_once(row) {
                // The conditional reads guarantee no bytes of another object were kept.
                Err(VfsError::Bucket(BucketError::Changed(key) | BucketError::NotFound(key)))
                    if start.elapsed() < self.cfg.remote_wait =>
                {
                    tracing::debug!(
                        ino = row.ino,
                        key,
                        "object replaced during a download; resolving again"
                    );
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(100));
                }
                r => return r,
            }
        }
    }

    /// One attempt of [`Vfs::download_full`]. Content found in no object (its object went
    /// after the caller found it, or during an earlier attempt) may be in a cache only,
    /// kept there before its last bucket copy went: while the version is still current,
    /// its holder is asked to upload it, and waited for (see
    /// [`Vfs::await_remote_content`]).
    fn download_full_once(&self, row: &InodeRow) -> Result<std::path::PathBuf> {
        let mut src = deskfs_meta::read(&*self.meta, |t| {
            t.object_with_content(row.ino, row.data_version)
        })?;
        if src.is_none() {
            let cur = self.meta.get_inode(row.ino)?.ok_or(VfsError::Stale)?;
            if cur.data_version == row.data_version {
                self.await_remote_content(&cur)?;
                src = deskfs_meta::read(&*self.meta, |t| {
                    t.object_with_content(row.ino, row.data_version)
                })?;
            }
        }
        let Some(src) = src else {
            return Err(io_err(format!(
                "content of inode {} version {} is neither local nor in the bucket",
                row.ino, row.data_version
            )));
        };
        let path = self.cache.staging_path(row.ino);
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = path.with_extension(format!(
            "part.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match self.download_into(row, &src, &tmp) {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Writes the content of `row` (object `src`) into the new file `tmp`, fsynced.
    fn download_into(
        &self,
        row: &InodeRow,
        src: &deskfs_meta::ObjectRow,
        tmp: &std::path::Path,
    ) -> Result<()> {
        let f = File::create(tmp)?;
        let mut off = 0u64;
        while off < row.size {
            let end = (off + DOWNLOAD_CHUNK).min(row.size);
            let data = self.rt.block_on(self.bucket.get_range(
                &src.key,
                off..end,
                src.etag.as_deref(),
            ))?;
            if data.len() as u64 != end - off {
                return Err(io_err(format!("short read of {} from the bucket", src.key)));
            }
            f.write_all_at(&data, off)?;
            off = end;
        }
        f.set_len(row.size)?;
        f.sync_all()?;
        Ok(())
    }

    /// The staging file of `ino` when this cache holds its content (opened and kept in
    /// the state on first use), and the size including uncommitted writes, bytes.
    fn staging_and_size(&self, ino: Ino) -> Result<(Option<Arc<File>>, u64)> {
        self.locked(ino, |s| {
            if s.staging.is_none() {
                let local = self
                    .meta
                    .get_inode(ino)?
                    .is_some_and(|r| r.local == self.here());
                if local {
                    if let Ok(f) = self.cache.open_staging(ino, false) {
                        s.staging = Some(Arc::new(f));
                    }
                }
            }
            Ok((s.staging.clone(), s.size))
        })
    }

    /// `read`: up to `size` bytes at `offset` (short at end of file).
    /// Errors: `EBADF`, `EIO` (content neither cached nor readable from the bucket).
    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let h = self.handle(fh)?;
        if !h.read || h.ino != ino {
            return Err(VfsError::BadHandle);
        }
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(2);
        loop {
            let (staging, cur_size) = self.staging_and_size(ino)?;
            if offset >= cur_size {
                return Ok(Vec::new());
            }
            let len = (size as u64).min(cur_size - offset) as usize;
            if let Some(f) = staging {
                self.cache.touch_staging(ino);
                let mut buf = vec![0u8; len];
                let mut done = 0;
                while done < len {
                    let n = f.read_at(&mut buf[done..], offset + done as u64)?;
                    if n == 0 {
                        break; // hole at the end of a sparse file reads as zeros
                    }
                    done += n;
                }
                return Ok(buf);
            }
            match self.read_remote_once(&h, ino, offset, len) {
                Ok(RemoteRead::Data(buf)) => return Ok(buf),
                // The content moved: the object was replaced or removed while we read it
                // (a rename over the file's old name, the upload of a newer version, an
                // orphan's content moving to its own key), or a newer commit replaced the
                // version we waited for (and may have made it local here). Look again from
                // the top; the conditional GET guarantees no bytes of another version
                // were used.
                Ok(RemoteRead::Moved)
                | Err(VfsError::Bucket(BucketError::Changed(_) | BucketError::NotFound(_)))
                    if start.elapsed() < self.cfg.remote_wait =>
                {
                    tracing::debug!(ino, "content moved during the read; resolving again");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(100));
                }
                Ok(RemoteRead::Moved) => {
                    return Err(io_err(format!(
                        "inode {ino}: its content kept moving for {} s (newer versions committed on other mounts while this read waited)",
                        self.cfg.remote_wait.as_secs()
                    )))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt of a read from the bucket (the caller [`Vfs::read`] tries again on
    /// `Moved` and on `Bucket(Changed | NotFound)`, which mean the object it resolved was
    /// replaced meanwhile).
    fn read_remote_once(
        &self,
        h: &Handle,
        ino: Ino,
        offset: u64,
        len: usize,
    ) -> Result<RemoteRead> {
        let (row, src) = deskfs_meta::read(&*self.meta, |t| {
            let row = t.get_inode(ino)?;
            let src = match &row {
                Some(r) => t.object_with_content(ino, r.data_version)?,
                None => None,
            };
            Ok::<_, crate::VfsError>((row, src))
        })?;
        let row = row.ok_or(VfsError::Stale)?;
        let src = match src {
            Some(src) => src,
            None => {
                // Only another cache holds this version: have it uploaded, then read.
                let now = self.await_remote_content(&row)?;
                if now.data_version != row.data_version || now.local == self.here() {
                    return Ok(RemoteRead::Moved);
                }
                match deskfs_meta::read(&*self.meta, |t| {
                    t.object_with_content(ino, row.data_version)
                })? {
                    Some(src) => src,
                    None => return Ok(RemoteRead::Moved),
                }
            }
        };
        let bs = self.cache.block_size();
        let end = (offset + len as u64).min(row.size);
        if offset >= end {
            return Ok(RemoteRead::Data(Vec::new()));
        }
        let first = offset / bs;
        let last = (end - 1) / bs;
        // Sequential reader: fetch ahead.
        let last_end = h.last_read_end.load(Ordering::Relaxed);
        let sequential = last_end == offset || offset == 0;
        // A whole-file reader began near offset 0 (the kernel serves what its page cache
        // holds without asking: an earlier reader's first pages) and never jumped (the
        // kernel's readahead requests arrive on several threads, a little out of order).
        let near_start = offset <= FILL_JUMP;
        let jumped = if last_end == u64::MAX {
            !near_start
        } else {
            offset.abs_diff(last_end) > FILL_JUMP
        };
        if offset == 0 || (last_end == u64::MAX && near_start) {
            h.from_start.store(true, Ordering::Relaxed);
        } else if jumped {
            h.from_start.store(false, Ordering::Relaxed);
        }
        // A whole-file reader assembles the file for passthrough (see `fill`).
        let fill = self.fill_for_read(&row, first, h.from_start.load(Ordering::Relaxed));
        if let Some(f) = &fill {
            if last == (row.size - 1) / bs {
                self.top_up_fill(f, &src, first);
            }
        }
        let window = if sequential {
            let w = h.ra_blocks.load(Ordering::Relaxed);
            // Not `clamp`: a window of fewer than RA_START_BLOCKS (0 turns it off) is allowed.
            let next = (w * 2)
                .max(RA_START_BLOCKS)
                .min(self.cfg.readahead_blocks.max(1));
            h.ra_blocks.store(next, Ordering::Relaxed);
            next.min(self.cfg.readahead_blocks)
        } else {
            h.ra_blocks.store(0, Ordering::Relaxed);
            0
        };
        if window > 0 {
            let max_idx = (row.size - 1) / bs;
            for idx in (last + 1)..=(last + window).min(max_idx) {
                let k = BlockKey {
                    ino,
                    version: row.data_version,
                    index: idx,
                };
                if self.cache.has_block(&k) || fill.as_ref().is_some_and(|f| f.has(idx)) {
                    continue;
                }
                // Past the buffer budget the rest of the window is skipped: the reader
                // asks for those blocks itself if it still wants them.
                let Some(fut) = self.block_future_ahead(k, &src.key, src.etag.clone(), row.size)
                else {
                    break;
                };
                self.rt.spawn(fut.map(|_| ()));
            }
        }
        let mut out = Vec::with_capacity((end - offset) as usize);
        for idx in first..=last {
            let k = BlockKey {
                ino,
                version: row.data_version,
                index: idx,
            };
            let bstart = idx * bs;
            let from = offset.max(bstart) - bstart;
            let to = end.min(bstart + bs) - bstart;
            if let Some(part) = match &fill {
                Some(f) => f.read(idx, from, to)?,
                None => None,
            } {
                self.blocks.hit();
                if first == last {
                    h.last_read_end.store(end, Ordering::Relaxed);
                    return Ok(RemoteRead::Data(part));
                }
                out.extend_from_slice(&part);
                continue;
            }
            // Only the part of the block this request wants is read from the cache.
            if let Some(part) = self.cache.read_block_range(&k, from, to)? {
                if part.len() as u64 == to - from {
                    self.blocks.hit();
                    if let Some(f) = &fill {
                        // Cached before the fill began (or while it began): copied in.
                        if let Some(d) = self.cache.read_block(&k)? {
                            self.fill_put(f, idx, &d);
                        }
                    }
                    if first == last {
                        // The whole answer is in one block (the usual 128 KiB read).
                        h.last_read_end.store(end, Ordering::Relaxed);
                        return Ok(RemoteRead::Data(part));
                    }
                    out.extend_from_slice(&part);
                    continue;
                }
            }
            self.blocks.miss();
            let fut = self.block_future(k, &src.key, src.etag.clone(), row.size);
            // (The fetch keeps the block: in the fill when there is one by then.)
            let data = self.rt.block_on(fut).map_err(VfsError::from)?;
            let to = to.min(data.len() as u64);
            if from < to {
                out.extend_from_slice(&data[from as usize..to as usize]);
            }
        }
        h.last_read_end.store(end, Ordering::Relaxed);
        Ok(RemoteRead::Data(out))
    }

    /// A whole-file reader reached the last block of `fill`: blocks it is still missing
    /// before block `upto` (read before the fill began, their cache write still on its way
    /// then) are copied from the block cache, or fetched again (object `src`) into it.
    /// Usually none: this costs the last read nothing.
    fn top_up_fill(&self, fill: &Arc<crate::fill::Fill>, src: &deskfs_meta::ObjectRow, upto: u64) {
        for index in 0..upto {
            if fill.has(index) {
                continue;
            }
            let k = BlockKey {
                ino: fill.ino,
                version: fill.version,
                index,
            };
            match self.cache.read_block(&k) {
                Ok(Some(d)) => self.fill_put(fill, index, &d),
                _ => {
                    // The fetch (or one in flight, perhaps done already: its block is on
                    // its way to the block cache) hands its bytes to the fill. Waited for,
                    // so the fill is complete when the reader's last read returns; a
                    // failure leaves it unfinished (dropped at the last close).
                    let fut = self.block_future(k, &src.key, src.etag.clone(), fill.size);
                    if let Ok(d) = self.rt.block_on(fut) {
                        self.fill_put(fill, index, &d);
                    }
                }
            }
        }
    }

    /// The fetch of block `k` of object `key` (an object of `size` bytes; `etag` pins its
    /// version), shared with any fetch of it already in flight. The block's bytes count
    /// against the buffer budget until they are in the block cache: a fetch someone
    /// waits on waits for its share; see [`Vfs::block_future_ahead`] for readahead.
    fn block_future(&self, k: BlockKey, key: &str, etag: Option<String>, size: u64) -> BlockFuture {
        let mut map = self.fetches.map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&k) {
            Some(f) => f.clone(),
            None => self.start_fetch(&mut map, k, key, etag, size, None),
        }
    }

    /// [`Vfs::block_future`] for readahead: `None` (nothing started) when the block is
    /// not in flight already and the buffer budget has no room for it now.
    fn block_future_ahead(
        &self,
        k: BlockKey,
        key: &str,
        etag: Option<String>,
        size: u64,
    ) -> Option<BlockFuture> {
        let mut map = self.fetches.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(&k) {
            return Some(f.clone());
        }
        let bs = self.cache.block_size();
        let bytes = (k.index * bs + bs).min(size).saturating_sub(k.index * bs);
        let held = self.buffers.try_reserve(bytes)?;
        Some(self.start_fetch(&mut map, k, key, etag, size, Some(held)))
    }

    /// Starts the fetch of block `k` and enters it in the in-flight `map`; `reserved` is
    /// its share of the buffer budget when already taken (else the fetch waits for it).
    fn start_fetch(
        &self,
        map: &mut HashMap<BlockKey, BlockFuture>,
        k: BlockKey,
        key: &str,
        etag: Option<String>,
        size: u64,
        reserved: Option<crate::buffers::Reservation>,
    ) -> BlockFuture {
        let budget = self.buffers.clone();
        let bucket = self.bucket.clone();
        let cache = self.cache.clone();
        let this = self.this.clone();
        let inflight = self.fetches.map.clone();
        let key = key.to_string();
        let bs = cache.block_size();
        let fut = async move {
            let start = k.index * bs;
            let end = (start + bs).min(size);
            // Held until the block is in the cache (or the fetch failed).
            let held = match reserved {
                Some(r) => r,
                None => budget.reserve(end - start).await,
            };
            let res = bucket.get_range(&key, start..end, etag.as_deref()).await;
            let out = match res {
                Ok(data) if data.len() as u64 == end - start => {
                    if let Some(vfs) = this.upgrade() {
                        vfs.blocks.fetched(data.len() as u64);
                    }
                    // The reader gets the block now; the cache file is written after
                    // (a file create, a write and a rename: 0.1-0.5 ms on the cold path).
                    // The block stays in the in-flight map until it is, so a read of it
                    // meanwhile shares this fetch instead of starting another GET.
                    let c = cache.clone();
                    let d = data.clone();
                    let inflight = inflight.clone();
                    tokio::task::spawn_blocking(move || {
                        let _held = held;
                        match this.upgrade() {
                            Some(vfs) => vfs.keep_block(k, &d),
                            None => {
                                if let Err(e) = c.write_block(&k, &d) {
                                    tracing::debug!(error = %e, "cannot keep a fetched block in the cache");
                                }
                            }
                        }
                        inflight
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&k);
                    });
                    return Ok(data);
                }
                Ok(data) => Err(FetchError::Other(format!(
                    "short read of {key}: {} of {} bytes",
                    data.len(),
                    end - start
                ))),
                Err(BucketError::Changed(_) | BucketError::NotFound(_)) => {
                    Err(FetchError::Moved(key.clone()))
                }
                Err(e) => Err(FetchError::Other(e.to_string())),
            };
            inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&k);
            out
        }
        .boxed()
        .shared();
        map.insert(k, fut.clone());
        fut
    }

    /// `write`: `data` at `offset` (at the end of file for `O_APPEND` handles, atomically
    /// with respect to other writers of this mount). Returns bytes written.
    /// Errors: `EBADF` (not open for writing), `EFBIG`, `ENOSPC`, `EIO`.
    pub fn write(&self, ino: Ino, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.handle(fh)?;
        if !h.write || h.ino != ino {
            return Err(VfsError::BadHandle);
        }
        self.locked(ino, |s| {
            let f = self.ensure_local(ino, s, None)?;
            let off = if h.append { s.size } else { offset };
            let end = off
                .checked_add(data.len() as u64)
                .filter(|e| *e <= MAX_FILE_SIZE)
                .ok_or(VfsError::FileTooBig)?;
            if !s.uncommitted {
                if s.create_guard.is_some() {
                    self.cache.staging_dirty(ino);
                } else {
                    self.begin_dirty(ino)?;
                }
                s.hold_writer_lock(&f)?;
            }
            match f.write_all_at(data, off) {
                // The cache dir's file system is full: clean cached data makes room
                // (blocks, clean local copies), then the write is tried once more. What
                // stays full is `ENOSPC`, as on ext4.
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    self.make_room();
                    f.write_all_at(data, off)?;
                }
                other => other?,
            }
            s.size = s.size.max(end);
            s.note_change(now_ns(), self.coherence.session());
            Ok(data.len() as u32)
        })
    }

    /// Records in the metadata engine that the staging file is about to diverge from the
    /// bucket, so a crash before the next commit still uploads what reached the staging
    /// file (recovery re-reads its length).
    fn begin_dirty(&self, ino: Ino) -> Result<()> {
        self.cache.staging_dirty(ino);
        // Usually already dirty (a new file, or writes since the last upload): a read
        // suffices.
        if self.meta.get_inode(ino)?.is_some_and(|r| r.dirty) {
            return Ok(());
        }
        self.mark_dirty(ino)?;
        self.cache.staging_dirty(ino);
        Ok(())
    }

    /// Marks the row of `ino` dirty (its content is to be uploaded) in one commit.
    pub(crate) fn mark_dirty(&self, ino: Ino) -> Result<()> {
        self.change(|_| {
            let mut b = Batch::new(self);
            b.guard(Op::SetAttrs {
                ino,
                set: AttrUpdate {
                    dirty: Some(true),
                    ..Default::default()
                },
            });
            Ok(Plan::Apply(b, Box::new(|_| Ok(()))))
        })?;
        Ok(())
    }

    /// Commits uncommitted writes of a locked state: size, mtime and a new content
    /// version go to the metadata engine in one batch that also marks every path of the
    /// inode pending. With `durable`, the staging file is fdatasync'ed and the commit is
    /// made durable (fsync semantics).
    pub(crate) fn commit_locked(
        &self,
        ino: Ino,
        s: &mut InodeState,
        durable: CommitSync,
    ) -> Result<()> {
        self.commit_with(ino, s, durable, None, false).map(|_| ())
    }

    /// [`Vfs::commit_locked`], in the same batch also removing an open-file record of
    /// `unrecord` (a session) and reading the inode back (`get`): a close costs one round
    /// trip. Returns the row when `get` (`None` when the inode is gone).
    fn commit_with(
        &self,
        ino: Ino,
        s: &mut InodeState,
        durable: CommitSync,
        unrecord: Option<u64>,
        get: bool,
    ) -> Result<Option<InodeRow>> {
        let here = self.here();
        let commit = s.uncommitted;
        if commit && s.dirty_session != 0 && s.dirty_session != self.coherence.session() {
            // These writes began under a session that was fenced since (the heartbeat
            // noticed first and registered a new one).
            return self.commit_after_fence(ino, s, durable, get);
        }
        let (size, mtime, ctime) = (s.size, s.mtime_ns, s.ctime_ns);
        let mut row = None;
        if commit || unrecord.is_some() || get {
            let out = self.change(|f| {
                if f.fresh() && f.row(ino)?.is_none() {
                    // Purged meanwhile (another mount's cleanup): nothing to commit.
                    return Ok(Plan::Done((None, None)));
                }
                let mut b = Batch::new(self);
                let version = commit.then(|| {
                    b.guard(Op::CommitContent {
                        ino,
                        size,
                        mtime_ns: mtime,
                        ctime_ns: ctime,
                        local: here,
                    })
                });
                if commit {
                    b.guard(Op::MarkInode {
                        ino,
                        not_before_ns: self.not_before(),
                    });
                }
                if let Some(session) = unrecord {
                    b.guard(Op::AddOpen {
                        ino,
                        session,
                        delta: -1,
                    });
                }
                let read = get.then(|| b.guard(Op::GetInode(ino)));
                Ok(Plan::Apply(
                    b,
                    Box::new(move |out: &[OpOut]| {
                        let v = version.and_then(|i| match out[i] {
                            OpOut::Version(v) => Some(v),
                            _ => None,
                        });
                        Ok((v, read.and_then(|i| out[i].row().cloned())))
                    }),
                ))
            });
            let out = match out {
                // Written under a lease that was lost meanwhile (the session was just
                // replaced): commit unless another mount committed since, else keep the
                // writes beside the file.
                Err(VfsError::Meta(deskfs_meta::MetaError::Fenced(_))) if commit => {
                    return self.commit_after_fence(ino, s, durable, get);
                }
                other => other?,
            };
            let (version, r) = out;
            row = r;
            if commit {
                if version.is_some() {
                    self.ring.changed(ino);
                }
                s.writes_settled();
                if let Some(v) = version {
                    self.kernel_pages.committed(ino, s.version, v);
                    s.version = v;
                }
                self.cache.drop_blocks(ino);
                self.uploader.queued(self.cfg.upload_delay);
            }
        }
        if commit {
            s.dirty_mark.committed(self.coherence.alone_period());
        }
        if durable != CommitSync::Commit {
            self.flush_devices(ino, s, durable)?;
        }
        Ok(row)
    }

    /// The device flushes of an `fsync` (`how` = [`CommitSync::Full`]) or `fdatasync`
    /// ([`CommitSync::Data`]) after its commit: the staging file's data, and the metadata
    /// log — which `fdatasync` skips when the row is known durably dirty (see
    /// [`crate::datasync`]). Both at once when both are needed (order does not matter:
    /// until both are done, fsync has not returned, and recovery adopts whatever of the
    /// staging file a dirty inode has). Errors: either flush's (`EIO`); never swallowed.
    fn flush_devices(&self, ino: Ino, s: &mut InodeState, how: CommitSync) -> Result<()> {
        let staging = s.staging.clone();
        let period = self.coherence.alone_period();
        if !self.needs_meta_flush(s, how) {
            // The data's flush alone: on this thread (a hand-over to another thread
            // costs more than the overlap gains when nothing runs beside it).
            if let Some(started) = s.data_sync.take() {
                self.data_flushed(ino, started.wait())?;
            } else if let Some(f) = staging {
                let res = crate::datasync::flush_data(&f, &self.data_flushes);
                self.data_flushed(ino, res.map_err(VfsError::from))?;
            }
            s.dirty_mark.flushed(period);
            return Ok(());
        }
        let since = std::time::Instant::now();
        // The data's flush: the one `fsync` started before its commit (else one of its
        // own, beside the metadata's).
        let data = s
            .data_sync
            .take()
            .or_else(|| staging.map(|f| DataSync::start(&self.rt, f, self.data_flushes.clone())));
        let meta = self.durable_since(since);
        // Both results are taken (a writeback error is reported only once).
        let data = data.map(|d| self.data_flushed(ino, d.wait())).transpose();
        data?;
        meta?;
        s.dirty_mark.flushed(period);
        Ok(())
    }

    /// The outcome of a flush of `ino`'s staging file: a failure is recorded, so that
    /// every later `fsync` of the file fails too (see `flush_failures`).
    fn data_flushed(&self, ino: Ino, res: Result<()>) -> Result<()> {
        match res {
            Err(VfsError::Io(e)) => Err(self.flush_failures.record(ino, e)),
            other => other,
        }
    }

    /// Whether an `fsync` (`how` = [`CommitSync::Full`]) or `fdatasync`
    /// ([`CommitSync::Data`]) of the inode in state `s` must flush the metadata log too:
    /// always for `fsync`; for `fdatasync` unless the row is known durably dirty, or a
    /// metadata flush that began after its dirty commit completed (see
    /// [`crate::datasync`]). A commit made under the state's lock never turns a `false`
    /// into a `true` (the earliest dirty commit of an alone period counts).
    fn needs_meta_flush(&self, s: &InodeState, how: CommitSync) -> bool {
        if how != CommitSync::Data {
            return true;
        }
        match s
            .dirty_mark
            .needs_flush_after(self.coherence.alone_period())
        {
            // Durably dirty already, or a flush since the dirty commit covers it.
            Some(None) => false,
            Some(Some(at)) => !self.meta_flush.covers(at),
            None => true,
        }
    }

    /// Commits writes made while this mount's session was lost (see `coherence`): when the
    /// file's content is still the version they were made on, they commit as usual;
    /// when another mount committed newer content meanwhile, that content stays and
    /// these writes become a file of their own beside it,
    /// `NAME.deskfs-conflict-HOST-UNIXTIME` — nothing is lost, nothing newer is
    /// overwritten. Writes to a file deleted meanwhile are dropped, as on ext4.
    fn commit_after_fence(
        &self,
        ino: Ino,
        s: &mut InodeState,
        durable: CommitSync,
        get: bool,
    ) -> Result<Option<InodeRow>> {
        let cur = self.meta.get_inode(ino)?;
        match cur {
            // A newer version held by this very cache is this mount's own: a commit of
            // these writes that the database applied although its answer was lost (the
            // cut came between the commit and its reply). The staging file is that
            // content: moving it to a conflict copy left the row naming content that
            // was nowhere (every open EIO, its upload failing for ever).
            Some(r) if r.data_version == s.version || r.local == self.here() => {
                // Nobody committed meanwhile: the writes are this session's now.
                s.dirty_session = self.coherence.session();
                return self.commit_with(ino, s, durable, None, get);
            }
            // Nothing written under the lost lease (a truncation, a ctime), and no kernel
            // handle writing through the staging file: no bytes to keep, and the newer
            // content stays. (A truncation in progress is applied to it again: see
            // `truncate_locked`.)
            Some(r) if r.nlink > 0 && !s.wrote && !s.pt.active() => {
                tracing::warn!(
                    ino,
                    "a change made under a lost lease that wrote no bytes (a truncation, a ctime) is not applied over newer content another mount committed meanwhile"
                );
                s.writes_settled();
                self.invalidate_later(crate::Invalidation::Inode(ino));
            }
            Some(r) if r.nlink > 0 => {
                self.save_conflict(ino, s, &r)?;
                // The kernel's pages hold the conflicting writes: they go.
                self.invalidate_later(crate::Invalidation::Inode(ino));
                // A passthrough backing file is the conflict copy's staging file now:
                // nothing the kernel finds in it is this inode's any more.
                s.pt.backing_moved();
            }
            _ => {
                tracing::warn!(
                    ino,
                    "writes made under a lost lease to a file deleted meanwhile are dropped"
                );
                s.writes_settled();
            }
        }
        s.staging = None;
        s.loaded = false;
        Ok(if get { self.meta.get_inode(ino)? } else { None })
    }

    /// Moves the uncommitted content of `ino` (state `s`, row `r`) to a new file beside
    /// its first name.
    fn save_conflict(&self, ino: Ino, s: &mut InodeState, r: &InodeRow) -> Result<()> {
        let names = deskfs_meta::read(&*self.meta, |t| t.names_of(ino))?;
        let Some((parent, name)) = names.into_iter().next() else {
            s.writes_settled();
            return Ok(());
        };
        let new_ino = self.alloc_ino()?;
        let here = self.here();
        // The journal moves first: the new inode's staging file is these writes.
        std::fs::rename(
            self.cache.staging_path(ino),
            self.cache.staging_path(new_ino),
        )?;
        let stamp = crate::now_ns() / 1_000_000_000;
        let host = crate::session::hostname();
        let res = self.change(|_| {
            let mut cname = name.clone();
            cname.extend_from_slice(format!(".deskfs-conflict-{host}-{stamp}").as_bytes());
            cname.truncate(crate::namespace::NAME_MAX);
            let now = crate::now_ns();
            let row = InodeRow {
                ino: new_ino,
                size: s.size,
                mtime_ns: s.mtime_ns,
                ctime_ns: now,
                btime_ns: now,
                nlink: 1,
                data_version: 1,
                local: here,
                dirty: true,
                ..r.clone()
            };
            let mut b = Batch::new(self);
            b.guard(Op::TouchDir {
                ino: parent,
                nlink_delta: 0,
                time_ns: now,
            });
            b.guard(Op::InsertInode(row));
            b.guard(Op::InsertDentry {
                parent,
                name: cname.clone(),
                ino: new_ino,
            });
            b.guard(Op::MarkPath {
                parent,
                name: cname.clone(),
                recursive: false,
                not_before_ns: self.not_before(),
            });
            Ok(Plan::Apply(b, Box::new(move |_| Ok(cname))))
        });
        match res {
            Ok(cname) => {
                self.ring.created(parent, &cname, new_ino, false);
                tracing::warn!(ino, new_ino, name = %String::from_utf8_lossy(&cname), "writes made while this mount's lease was lost conflict with newer content committed by another mount: kept beside it");
                self.coherence.conflict();
                s.writes_settled();
                self.uploader.kick();
                Ok(())
            }
            Err(e) => {
                // Put the journal back: the writes stay uncommitted and are retried.
                let _ = std::fs::rename(
                    self.cache.staging_path(new_ino),
                    self.cache.staging_path(ino),
                );
                Err(e)
            }
        }
    }

    /// `flush` (every `close` of a descriptor): commits the file's writes so that they
    /// survive a crash of the daemon and are uploaded. Under bucket durability, a
    /// descriptor opened for writing then waits until that content is in the bucket
    /// (`EIO` past the bound; see [`crate::durability`]).
    pub fn flush(&self, ino: Ino, fh: u64) -> Result<()> {
        let version = self.locked(ino, |s| {
            self.absorb_backing(ino, s, Absorb::Commit)?;
            self.commit_locked(ino, s, CommitSync::Commit)?;
            if s.create_guard.is_some() && !s.uncommitted {
                // Closed without a write: the create's writer lock goes.
                s.writes_settled();
            }
            Ok(s.version)
        })?;
        if self.durability() == crate::Durability::Bucket && self.handle(fh).is_ok_and(|h| h.write)
        {
            // Outside the inode's lock: the uploader takes it.
            self.await_durable(ino, version)?;
        }
        Ok(())
    }

    /// `release` (last close of an open file description): commits, removes the open's
    /// record, and purges the inode if it lost its last name while open and nothing else
    /// holds it.
    pub fn release(&self, ino: Ino, fh: u64) -> Result<()> {
        let h = self.handles.lock().map_err(|_| poisoned())?.remove(&fh);
        if h.as_ref().is_some_and(|h| h.dir) {
            return Ok(());
        }
        if let Some(h) = &h {
            let owners: Vec<u64> = h
                .lock_owners
                .lock()
                .map(|o| o.iter().copied().collect())
                .unwrap_or_default();
            for owner in owners {
                self.release_fh_locks(ino, owner, fh)?;
            }
        }
        let unrecord = h
            .as_ref()
            .is_some_and(|h| h.close_record())
            .then(|| self.coherence.session());
        let mut res = Ok(());
        let (last, size, row, clean) = self.locked(ino, |s| {
            // (A failed look leaves the last known size and times; the handle must go.)
            if let Err(e) = self.absorb_backing(ino, s, Absorb::Commit) {
                tracing::warn!(ino, error = %e, "cannot read the backing file's size and times at release");
            }
            if let Some(h) = &h {
                s.open_count = s.open_count.saturating_sub(1);
                if h.passthrough.swap(false, Ordering::SeqCst) {
                    self.passthrough_gone(ino, s, h.write);
                }
            }
            let last = s.open_count == 0;
            if last {
                self.fill_closed(ino, s);
            }
            // The row decides the purge of an orphan: read it in the same batch when this
            // is the last handle and the inode may have lost its names (always possible
            // while other mounts are live; alone, only through this mount).
            let get = last && (self.shared() || self.refs.is_kept_orphan(ino));
            if self.shared() && !s.uncommitted && (unrecord.is_some() || get) {
                // Nothing to commit: the record and the orphan check go off the request
                // path (see `release`).
                self.releases.push(crate::release::QueuedRelease {
                    ino,
                    unrecord,
                    last: get.then_some(crate::release::LastHandle {
                        version: s.version,
                        size: s.size,
                    }),
                });
                return Ok((false, s.size, None, false));
            }
            let row = match self.commit_with(ino, s, CommitSync::Commit, unrecord, get) {
                Ok(r) => r,
                Err(e) => {
                    res = Err(e);
                    None
                }
            };
            let clean = last && !s.uncommitted && s.clean_at_close == Some(s.version);
            Ok((last, s.size, row, clean))
        })?;
        if last {
            match row {
                Some(r) if r.nlink == 0 => self.release_orphan(ino),
                Some(r) if r.local == self.here() && !r.dirty => {
                    self.cache.staging_clean(ino, size)
                }
                // Not read: evictable when its upload was recorded while it was open
                // (else when the upload is recorded, or at the next mount's recovery).
                None if clean => self.cache.staging_clean(ino, size),
                _ => {}
            }
        }
        res
    }

    /// Commits writes of files already closed whose commit failed (the database was
    /// unreachable): called periodically, so they are not lost once it answers again.
    pub(crate) fn recommit_released(&self) {
        let states: Vec<(u64, Arc<Mutex<InodeState>>)> = match self.inodes.lock() {
            Ok(m) => m.iter().map(|(k, v)| (*k, v.clone())).collect(),
            Err(_) => return,
        };
        for (ino, st) in states {
            let pending = st
                .lock()
                .map(|s| s.uncommitted && s.open_count == 0)
                .unwrap_or(false);
            if pending {
                if let Err(e) = self.locked(ino, |s| self.commit_locked(ino, s, CommitSync::Commit))
                {
                    tracing::warn!(ino, error = %e, "commit of a closed file still fails; retrying");
                }
            }
        }
    }

    /// `fsync`/`fdatasync`: the file's data and metadata are on stable local storage when
    /// this returns (the upload follows in the background); under bucket durability, also
    /// in the bucket (`EIO` past the bound; see [`crate::durability`]).
    pub fn fsync(&self, ino: Ino, _fh: u64, datasync: bool) -> Result<()> {
        // An earlier flush of this file failed: the kernel may have dropped that data,
        // and a new flush would report success without it (see `flush_failures`).
        self.flush_failures.check(ino)?;
        let version = self.locked(ino, |s| {
            self.absorb_backing(ino, s, Absorb::Commit)?;
            self.open_staging_to_flush(ino, s)?;
            let how = if datasync {
                CommitSync::Data
            } else {
                CommitSync::Full
            };
            // When the metadata log needs a flush too, the data's starts now and runs
            // while the metadata commits: it does not depend on the commit (see
            // `flush_devices`). Alone, it runs after the commit on this thread.
            if self.needs_meta_flush(s, how) {
                s.data_sync = s
                    .staging
                    .clone()
                    .map(|f| DataSync::start(&self.rt, f, self.data_flushes.clone()));
            }
            let res = self.commit_locked(ino, s, how);
            // `flush_devices` waited for it; a path that ended before it still waits
            // here, so the flush's error is reported, never dropped.
            let early = s
                .data_sync
                .take()
                .map(|d| self.data_flushed(ino, d.wait()))
                .transpose();
            res?;
            early?;
            Ok(s.version)
        })?;
        self.await_durable(ino, version)?;
        self.namespace_durable()
    }

    /// Before an `fsync`: the staging file of `ino` in the state, when this cache holds its
    /// content. A state loaded afresh (the kernel forgot the inode after its last close)
    /// has none until a write or a passthrough open, yet the page cache may hold that
    /// close's data unflushed: `fsync` through any descriptor, read-only ones included,
    /// flushes it (POSIX `fsync`: all modified data of the file). Errors: the row's read
    /// or the open (`EIO`); a staging file absent (content not local) is no error.
    fn open_staging_to_flush(&self, ino: Ino, s: &mut InodeState) -> Result<()> {
        if s.staging.is_some() {
            return Ok(());
        }
        let local = self
            .meta
            .get_inode(ino)?
            .is_some_and(|r| r.kind == Kind::File && r.local == self.here());
        if !local {
            return Ok(());
        }
        match self.cache.open_staging(ino, false) {
            Ok(f) => {
                s.staging = Some(Arc::new(f));
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Truncate (or extend with zeros) to `size` bytes and commit.
    pub(crate) fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        self.locked(ino, |s| self.truncate_locked(ino, s, size))
    }

    /// Truncates the locked file to `size` bytes. Writes still to commit are committed
    /// first, as they were written: a lost lease is found on them, and when another
    /// mount committed meanwhile they are kept as a conflict copy of what was written,
    /// not of what this truncation leaves of it. A truncation whose own commit finds the
    /// lease lost and the file changed by another mount comes after that change: it is
    /// applied again, to the file's content now, under the new session (once; `EIO`
    /// when the lease is lost again at once).
    fn truncate_locked(&self, ino: Ino, s: &mut InodeState, size: u64) -> Result<()> {
        let kind = match self.hints.kind(ino) {
            Some(k) => k,
            None => self.current(ino)?.kind,
        };
        match kind {
            Kind::File => {}
            Kind::Dir => return Err(VfsError::IsDir),
            _ => return Err(VfsError::Invalid),
        }
        if size > MAX_FILE_SIZE {
            return Err(VfsError::FileTooBig);
        }
        if s.uncommitted {
            self.commit_locked(ino, s, CommitSync::Commit)?;
            if !s.loaded {
                // Kept as a conflict copy: the file's content is the other mount's now.
                self.load_state(ino, s)?;
            }
        }
        for _ in 0..2 {
            self.truncate_once(ino, s, size)?;
            // Moved away by a lost lease's conflict (see `commit_after_fence`), unless
            // kernel handles write through the backing file, which went with the copy.
            if s.loaded || s.pt.active() {
                return Ok(());
            }
            self.load_state(ino, s)?;
        }
        Err(VfsError::Io(std::io::Error::other(
            "this mount's lease was lost twice during one truncation",
        )))
    }

    /// One attempt of [`Vfs::truncate_locked`] on the file's content: set the staging
    /// file's length and commit it.
    fn truncate_once(&self, ino: Ino, s: &mut InodeState, size: u64) -> Result<()> {
        let f = self.ensure_local(ino, s, Some(size))?;
        if !s.uncommitted {
            self.begin_dirty(ino)?;
            s.hold_writer_lock(&f)?;
        }
        f.set_len(size)?;
        if size == 0 {
            // Nothing of what a failed flush may have dropped is part of the file now.
            self.flush_failures.clear(ino);
        }
        s.size = size;
        s.note_size_change(now_ns(), self.coherence.session());
        self.passthrough_own_change(ino, s)?;
        #[cfg(test)]
        if let Some(race) = tests::BEFORE_TRUNCATE_COMMIT.with(|r| r.borrow_mut().take()) {
            race();
        }
        self.commit_locked(ino, s, CommitSync::Commit)
    }
}

impl Vfs {
    /// `fallocate(2)` on a regular file: mode 0 (allocate, extending the size),
    /// `FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE` and
    /// `FALLOC_FL_ZERO_RANGE`, applied to the staging file (the content becomes local).
    /// Errors: `EOPNOTSUPP` for other modes, `EBADF` for a handle not open for writing,
    /// `EFBIG`, `ENOSPC`.
    pub fn fallocate(&self, ino: Ino, fh: u64, offset: u64, length: u64, mode: i32) -> Result<()> {
        let h = self.handle(fh)?;
        if !h.write || h.ino != ino {
            return Err(VfsError::BadHandle);
        }
        let supported =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !supported != 0
            || (mode & libc::FALLOC_FL_PUNCH_HOLE != 0 && mode & libc::FALLOC_FL_KEEP_SIZE == 0)
        {
            return Err(VfsError::NotSupported);
        }
        let end = offset
            .checked_add(length)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(VfsError::FileTooBig)?;
        self.locked(ino, |s| {
            let f = self.ensure_local(ino, s, None)?;
            if !s.uncommitted {
                self.begin_dirty(ino)?;
                s.hold_writer_lock(&f)?;
            }
            use std::os::fd::AsRawFd;
            // SAFETY: plain syscall on an open fd owned by `f`.
            let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, length as i64) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                s.size = s.size.max(end);
            }
            s.note_change(now_ns(), self.coherence.session());
            self.passthrough_own_change(ino, s)
        })
    }

    /// `lseek(2)` with `SEEK_DATA` / `SEEK_HOLE` (others are answered by the kernel).
    /// Local content answers from the staging file's own holes; remote content is one data
    /// extent. Errors: `ENXIO` at or past end of file, `EINVAL` for other `whence`.
    pub fn lseek(&self, ino: Ino, _fh: u64, offset: i64, whence: i32) -> Result<i64> {
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(VfsError::Invalid);
        }
        let (staging, size) = self.staging_and_size(ino)?;
        if offset < 0 || offset as u64 >= size {
            return Err(VfsError::NoSuchOffset);
        }
        if let Some(f) = staging {
            use std::os::fd::AsRawFd;
            // SAFETY: plain syscall on an open fd owned by `f`.
            let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
            if r >= 0 {
                return Ok(r.min(size as i64));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) && whence == libc::SEEK_HOLE {
                return Ok(size as i64);
            }
            return Err(if e.raw_os_error() == Some(libc::ENXIO) {
                VfsError::NoSuchOffset
            } else {
                e.into()
            });
        }
        Ok(if whence == libc::SEEK_DATA {
            offset
        } else {
            size as i64
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;

    thread_local! {
        /// Run once by the next `open` on this thread that was granted, between its
        /// locked part (the row read, with or without the open's count) and the making
        /// of its handle: another mount joining, or expiring this one, there.
        pub(crate) static BEFORE_NEW_HANDLE: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run once by the next `open` on this thread that tells the kernel its cache is
        /// stale, just before it does: another open of the inode there.
        pub(crate) static BEFORE_OPEN_INVALIDATES: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run once by the next [`super::Vfs::adopt_local`] on this thread, between the
        /// new staging file and the record naming this cache its holder: another mount
        /// committing a newer version there.
        pub(crate) static BEFORE_ADOPT_RECORD: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run once by the next [`super::Vfs::adopt_local`] on this thread, right after
        /// its record: what a crash there leaves.
        pub(crate) static AFTER_ADOPT_RECORD: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
        /// Run once by the next truncation on this thread, between the staging file's
        /// new length and its commit: another mount expiring this one, there.
        pub(crate) static BEFORE_TRUNCATE_COMMIT: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}
