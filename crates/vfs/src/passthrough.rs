//! FUSE passthrough: open files whose content is in the local staging file are served by
//! the kernel straight from that file (read, write, splice and mmap never reach the
//! daemon; Linux ≥ 6.9, `FUSE_PASSTHROUGH`, `FOPEN_PASSTHROUGH` with a backing id).
//!
//! The kernel's rule (fs/fuse/iomode.c): while an inode has a file open through a backing
//! file, every open of it must be a passthrough open *of that same backing file*, and a
//! passthrough open is refused while it has files open through the page cache; a wrong
//! answer fails the user's `open(2)` with `EIO`. So the decision is per inode, under its
//! state lock, from this mount's counts of its open handles (which the kernel's counts
//! never exceed: the kernel forgets a file at its last `fput`, before it sends RELEASE):
//!
//! ```text
//!   no handle ──open (content local, alone, ...)──▶ Passthrough{handles ≥ 1, file}
//!       ▲   └──open (otherwise)──▶ Cached{handles ≥ 1}
//!       └──────── last release of either ◀───────┘
//!   Passthrough: every further open is passthrough on the same file, whatever the
//!   conditions now (another mount appeared, ...).
//! ```
//!
//! Writes through the backing file are not seen by the daemon; their effects are
//! *absorbed* from the staging file's own size and times ([`Vfs::absorb_backing`]) before
//! any request of the inode is served under its lock (getattr, setattr, flush, fsync,
//! release, ...). A writable passthrough open marks the row dirty first (as the first
//! write of a clean file does), and the uploader never marks an inode clean while
//! passthrough writers are open (see `uploader`), so what reaches the staging file is
//! always uploaded, even after a `kill -9`.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use deskfs_meta::{InodeRow, Kind};

use crate::handles::InodeState;
use crate::{now_ns, Ino, Result, Vfs, VfsError};

/// Within this long after a staging file's mtime, a later write may leave size and times
/// unchanged (file systems stamp times at the clock tick, 1–10 ms): a look taken that
/// soon proves nothing about writes that came after it, ns.
const AMBIGUOUS_NS: i64 = 20_000_000;

/// Whether the staging files' file system stamps a write after an `fstat` with a new time
/// (probed once, when passthrough is turned on).
static FINE_TIMES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Probes `path` (a scratch file, removed again): 200 one-byte overwrites, each followed
/// by an `fstat`, all change the file's times.
fn probe_fine_times(path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileExt;
    let probe = || -> std::io::Result<bool> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.write_all_at(b"0", 0)?;
        let mut last = BackingLook::of(&f)?;
        for _ in 0..200 {
            f.write_all_at(b"1", 0)?;
            let now = BackingLook::of(&f)?;
            if now.same_file_state(&last) {
                return Ok(false);
            }
            last = now;
        }
        Ok(true)
    };
    let fine = probe().unwrap_or(false);
    let _ = std::fs::remove_file(path);
    fine
}

/// The staging file's size and times as last absorbed, and when they were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BackingLook {
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    /// When this look was taken, ns since the epoch.
    taken_ns: i64,
}

impl BackingLook {
    /// Reads `f`'s size and times now. Errors: `fstat` failures (`EIO`).
    fn of(f: &File) -> std::io::Result<BackingLook> {
        let m = f.metadata()?;
        Ok(BackingLook {
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            taken_ns: now_ns(),
        })
    }

    /// Same size and times as `other` (when they were taken aside).
    fn same_file_state(&self, other: &BackingLook) -> bool {
        (self.size, self.mtime_ns, self.ctime_ns) == (other.size, other.mtime_ns, other.ctime_ns)
    }

    /// Taken so soon after the last change that a write after it may have left no trace
    /// (never, on file systems whose times are fine-grained once looked at: Linux ≥ 6.13
    /// multigrain timestamps on ext4, XFS, btrfs, tmpfs).
    fn ambiguous(&self) -> bool {
        !FINE_TIMES.get().copied().unwrap_or(false)
            && self.taken_ns - self.mtime_ns.max(self.ctime_ns) < AMBIGUOUS_NS
    }
}

/// How sure an absorb must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Absorb {
    /// Changes seen in size or times only (getattr and ordinary requests).
    Seen,
    /// Before a commit point (flush, fsync, release): also count as changed when the last
    /// look was ambiguous, so no write is ever left out of a committed version.
    Commit,
}

/// Passthrough facts of one inode's open handles in this mount (part of its state).
#[derive(Debug, Default)]
pub(crate) struct Passthrough {
    /// Handles opened through the backing file.
    handles: u32,
    /// Of those, opened for writing.
    writers: u32,
    /// The backing file: the staging file, opened for the kernel alone (its own open file
    /// description, so the daemon's `flock`s never live on in the kernel's reference).
    file: Option<Arc<File>>,
    /// The backing file holds a shared `flock` (taken at the first writable open, kept
    /// while the kernel may write through it — even after this daemon died, as long as a
    /// process holds a file of its mount open): uploaders of later mounts then treat the
    /// staging file as holding uncommitted writes.
    writer_flock: bool,
    /// The backing file's state as last absorbed.
    seen: Option<BackingLook>,
    /// This mount's session when `seen` was taken: the kernel's writes found at the next
    /// look may have been made any time since, so under that session's lease (which may
    /// have been lost meanwhile: see `Vfs::commit_after_fence`).
    seen_session: u64,
    /// The row was marked dirty for these writers (not by a write): when the last one
    /// closes without having written, the uploader is asked to look again (and mark it
    /// clean: the bucket already holds its content).
    pub(crate) marked_dirty: bool,
    /// The backing file is a complete whole-file fill not yet adopted as the staging file
    /// (read-only opens only; see [`crate::fill`]).
    from_fill: bool,
}

impl Passthrough {
    /// Passthrough handles are open.
    pub(crate) fn active(&self) -> bool {
        self.handles > 0
    }

    /// The backing file's content was moved to another inode (a conflict copy, see
    /// `Vfs::commit_after_fence`): it is not looked at for this inode again. Handles the
    /// kernel already holds keep writing to it; new opens of this inode fail with `EIO`
    /// (the kernel's rule: the same backing file while any passthrough open is left)
    /// until they are closed.
    pub(crate) fn backing_moved(&mut self) {
        self.file = None;
        self.seen = None;
    }

    /// A new look at the backing file under session `now`: the session the kernel's
    /// writes it finds count as made under — the last look's (they may have been made
    /// any time since, under that session's lease, perhaps lost meanwhile: a partition
    /// or a pause past the lease; see `Vfs::commit_after_fence`), else `now`.
    fn look_session(&mut self, now: u64) -> u64 {
        match std::mem::replace(&mut self.seen_session, now) {
            0 => now,
            then => then,
        }
    }

    /// Passthrough handles open for writing.
    pub(crate) fn writers(&self) -> u32 {
        self.writers
    }

    /// The backing file holds this mount's writer `flock` (see `writer_flock`).
    pub(crate) fn holds_writer_flock(&self) -> bool {
        self.writer_flock
    }
}

/// Takes a shared `flock` on `f` (the mark of a staging file with possible uncommitted
/// writes; see [`crate::handles::no_uncommitted_writers`]). Errors: `flock`'s (`EIO`).
fn shared_flock(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: plain syscall on an open fd owned by `f`.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

impl Vfs {
    /// Passthrough was asked for in the configuration (the FUSE adapter then asks the
    /// kernel for it).
    pub fn passthrough_wanted(&self) -> bool {
        self.cfg.passthrough
    }

    /// Passthrough is used by this mount (asked for and granted by the kernel).
    pub fn passthrough_on(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// Passthrough handles open for writing on `ino` now; `None` while its state is locked
    /// (never waited for: the uploader calls this on runtime threads).
    pub(crate) fn passthrough_writers(&self, ino: Ino) -> Option<u32> {
        let st = self.inodes.lock().ok().and_then(|m| m.get(&ino).cloned());
        match st {
            Some(st) => st.try_lock().ok().map(|s| s.pt.writers()),
            None => Some(0),
        }
    }

    /// Turns passthrough on or off for opens from now on: the FUSE adapter turns it on
    /// when the kernel granted `FUSE_PASSTHROUGH`, and off when a backing file is refused
    /// (no `CAP_SYS_ADMIN`, a cache dir on a stacked file system).
    pub fn set_passthrough(&self, on: bool) {
        let on = on && self.cfg.passthrough;
        if on {
            FINE_TIMES.get_or_init(|| {
                probe_fine_times(&self.cache.staging_path(0).with_extension("timeprobe"))
            });
        }
        if self.passthrough.swap(on, Ordering::Relaxed) != on {
            tracing::info!(on, "FUSE passthrough");
        }
    }

    /// Decides whether the open being counted in `s` (its `open_count` already includes
    /// it) is a passthrough open; if so counts it and returns the backing file. `row` is
    /// the inode's committed row, read under the same lock. A writable passthrough open
    /// marks a clean row dirty first. Errors: the metadata engine's (the open fails).
    pub(crate) fn passthrough_grant(
        &self,
        ino: Ino,
        s: &mut InodeState,
        row: &InodeRow,
        write: bool,
    ) -> Result<Option<Arc<File>>> {
        if row.kind != Kind::File {
            return Ok(None);
        }
        if s.pt.active() {
            // The kernel requires it: the same backing file for every open while any is.
            let Some(f) = s.pt.file.clone() else {
                return Ok(None);
            };
            if write {
                if s.pt.from_fill {
                    self.adopt_backing_fill(ino, s, &f)?;
                }
                self.open_daemon_staging(ino, s)?;
                if self.passthrough_begin_write(ino, s, row)? {
                    s.pt.marked_dirty = true;
                }
                if !s.pt.writer_flock {
                    shared_flock(&f)?;
                    s.pt.writer_flock = true;
                }
            }
            s.pt.handles += 1;
            s.pt.writers += u32::from(write);
            self.fills.passthrough_opens.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(f));
        }
        let cached_handles = s.open_count.saturating_sub(1);
        // A reader of content only the bucket holds is given a complete fill of it.
        let fill = (!write && row.local != self.here())
            .then(|| self.fills.complete(ino, row.data_version))
            .flatten();
        let eligible = self.passthrough_on()
            && cached_handles == 0
            && !self.shared()
            && (row.local == self.here() || fill.is_some())
            && !(write && self.durability() == crate::Durability::Bucket)
            // Low on free space, writes come through the daemon, which makes room by
            // evicting clean data when one finds the file system full.
            && (!write || self.cache.room_for_direct_writes())
            // A write by a non-owner must drop setuid/setgid (killpriv): only the daemon
            // sees writes that can do that.
            && !(write && row.perm & 0o6000 != 0);
        if !eligible {
            return Ok(None);
        }
        let opened = match &fill {
            Some(fill) => fill.backing().map_err(VfsError::from),
            None => self.cache.open_staging(ino, false).map_err(VfsError::from),
        };
        let f = match opened {
            Ok(f) => Arc::new(f),
            Err(_) => return Ok(None),
        };
        if write {
            self.open_daemon_staging(ino, s)?;
        }
        let look = BackingLook::of(&f)?;
        if look.size != s.size {
            // Staging file and state disagree (an interrupted download, a crash being
            // recovered): served by the daemon, which knows the size.
            return Ok(None);
        }
        let marked_dirty = write && self.passthrough_begin_write(ino, s, row)?;
        if write {
            shared_flock(&f)?;
        }
        s.pt = Passthrough {
            handles: 1,
            writers: u32::from(write),
            file: Some(f.clone()),
            seen: Some(look),
            seen_session: self.coherence.session(),
            marked_dirty,
            writer_flock: write,
            from_fill: fill.is_some(),
        };
        self.cache.touch_staging(ino);
        self.fills.passthrough_opens.fetch_add(1, Ordering::Relaxed);
        if fill.is_some() {
            self.fills.fill_opens.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(f))
    }

    /// A writable open of an inode whose passthrough readers read a complete fill
    /// (`backing`): the fill becomes the staging file first (see [`Vfs::take_fill`]), so
    /// the kernel's writes land in the file the daemon commits and uploads. Errors: the
    /// adoption's (`EIO`), and `EIO` when the staging file is another file after all (the
    /// content changed since the readers opened; they must close first).
    fn adopt_backing_fill(&self, ino: Ino, s: &mut InodeState, backing: &File) -> Result<()> {
        let staging = self.ensure_local(ino, s, None)?;
        let (a, b) = (staging.metadata()?, backing.metadata()?);
        if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
            return Err(VfsError::Io(std::io::Error::other(format!(
                "inode {ino}: its content changed while it was open for reading through passthrough; close it everywhere and open it again to write"
            ))));
        }
        s.pt.from_fill = false;
        Ok(())
    }

    /// The daemon's own descriptor of a staging file a passthrough writer is given (the
    /// writer lock of a create, `fsync`'s flush, truncate and fallocate use it; a reader
    /// needs none: `fsync` opens it when missing). Errors: the open's (`EIO`).
    fn open_daemon_staging(&self, ino: Ino, s: &mut InodeState) -> Result<()> {
        if s.staging.is_none() {
            s.staging = Some(Arc::new(self.cache.open_staging(ino, false)?));
        }
        Ok(())
    }

    /// A writable passthrough open of `ino`: the row is marked dirty before the kernel can
    /// write (as [`Vfs::write`]'s first write does), so a crash of the daemon leaves the
    /// staging file's content to be uploaded rather than a clean row that no longer
    /// matches it. Returns whether the row was marked here.
    fn passthrough_begin_write(
        &self,
        ino: Ino,
        s: &mut InodeState,
        row: &InodeRow,
    ) -> Result<bool> {
        if s.uncommitted || s.create_guard.is_some() {
            return Ok(false);
        }
        let marked = !row.dirty;
        if marked {
            self.mark_dirty(ino)?;
            s.dirty_mark.committed(self.coherence.alone_period());
        }
        self.cache.staging_dirty(ino);
        Ok(marked)
    }

    /// Takes back a passthrough open the kernel was not given (the backing file was
    /// refused): the handle `fh` of `ino` is served by the daemon instead.
    pub fn passthrough_refused(&self, ino: Ino, fh: u64) {
        let Ok(h) = self.handle(fh) else { return };
        if !h.passthrough.swap(false, Ordering::SeqCst) {
            return;
        }
        let _ = self.with_state(ino, |s| self.passthrough_gone(ino, s, h.write));
    }

    /// A passthrough handle of `ino` (opened for writing: `write`) is gone — released,
    /// refused by the kernel, or never made (its open failed after the grant): its counts
    /// go, and when it was the last writer of a row marked dirty for the writers and
    /// nothing they wrote is uncommitted, the row goes back to the uploader, which marks
    /// it clean again ([`Vfs::passthrough_settle`]; without it the row stayed dirty, its
    /// staging file never evictable). Caller holds the state's lock.
    pub(crate) fn passthrough_gone(&self, ino: Ino, s: &mut InodeState, write: bool) {
        if Self::passthrough_closed(s, write) {
            if let Err(e) = self.passthrough_settle(ino) {
                tracing::warn!(ino, error = %e, "cannot queue a look at a file written through passthrough");
            }
        }
    }

    /// A passthrough handle (opened for writing: `write`) of the inode in `s` is gone.
    /// Returns true when it was the last writer, the row was marked dirty for the
    /// writers, and nothing they wrote is uncommitted: then the caller asks the uploader
    /// to look at the inode again ([`Vfs::passthrough_settle`]).
    pub(crate) fn passthrough_closed(s: &mut InodeState, write: bool) -> bool {
        s.pt.handles = s.pt.handles.saturating_sub(1);
        let mut settle = false;
        if write {
            s.pt.writers = s.pt.writers.saturating_sub(1);
            if s.pt.writers == 0 {
                settle = std::mem::take(&mut s.pt.marked_dirty) && !s.uncommitted;
            }
        }
        if s.pt.handles == 0 {
            let marked = s.pt.marked_dirty;
            s.pt = Passthrough::default();
            s.pt.marked_dirty = marked;
        }
        settle
    }

    /// The last passthrough writer of `ino` closed without writing: its row, marked dirty
    /// for it, goes back to the uploader, which finds its content in the bucket already
    /// and marks it clean. Errors: the metadata engine's.
    pub(crate) fn passthrough_settle(&self, ino: Ino) -> Result<()> {
        self.change(|_| {
            let mut b = crate::changes::Batch::new(self);
            b.guard(deskfs_meta::Op::MarkInode {
                ino,
                not_before_ns: self.not_before(),
            });
            Ok(crate::changes::Plan::Apply(b, Box::new(|_| Ok(()))))
        })?;
        self.uploader.kick();
        Ok(())
    }

    /// Brings `s` up to date with writes made through the backing file since the last
    /// look: a change in the staging file's size or times becomes the state's size, mtime
    /// and ctime and an uncommitted change (committed at the next flush, fsync or
    /// release, as the daemon's own writes are). With [`Absorb::Commit`], an ambiguous
    /// last look counts as a change. Nothing to do without passthrough writers.
    /// Errors: `fstat` of the staging file (`EIO`).
    pub(crate) fn absorb_backing(&self, ino: Ino, s: &mut InodeState, how: Absorb) -> Result<()> {
        if s.pt.writers == 0 {
            return Ok(());
        }
        let Some(f) = s.pt.file.clone() else {
            return Ok(());
        };
        let now = BackingLook::of(&f)?;
        let changed = match s.pt.seen {
            Some(seen) => {
                !seen.same_file_state(&now) || (how == Absorb::Commit && seen.ambiguous())
            }
            None => true,
        };
        s.pt.seen = Some(now);
        // (A fenced mount's writes through the backing file are not committed over
        // another mount's newer content.)
        let made_under = s.pt.look_session(self.coherence.session());
        if !changed {
            return Ok(());
        }
        if !s.uncommitted {
            // (The backing file's own writer flock marks the uncommitted writes.)
            self.cache.staging_dirty(ino);
        }
        s.size = now.size;
        s.note_change(now.mtime_ns, made_under);
        s.ctime_ns = now.ctime_ns.max(s.ctime_ns);
        // The kernel's page cache of this inode did not see these writes.
        self.kernel_pages.forget(ino);
        Ok(())
    }

    /// After the daemon itself changed the backing file (truncate, fallocate; `s.size`
    /// already says the size it made): the file's new state is no write of the kernel's
    /// and becomes the last look. A kernel write through the backing file may still have
    /// landed between the daemon's change and this look (the kernel takes no daemon lock):
    /// a size the daemon did not make is such a write, and is absorbed like one.
    /// Errors: `fstat` of the staging file (`EIO`).
    pub(crate) fn passthrough_own_change(&self, ino: Ino, s: &mut InodeState) -> Result<()> {
        let Some(f) = s.pt.file.clone() else {
            return Ok(());
        };
        #[cfg(test)]
        if let Some(race) = tests::BEFORE_OWN_LOOK.with(|r| r.borrow_mut().take()) {
            race();
        }
        let look = BackingLook::of(&f)?;
        s.pt.seen = Some(look);
        let made_under = s.pt.look_session(self.coherence.session());
        if look.size != s.size && s.pt.writers > 0 {
            s.size = look.size;
            s.note_change(look.mtime_ns.max(s.mtime_ns), made_under);
            s.ctime_ns = look.ctime_ns.max(s.ctime_ns);
            self.kernel_pages.forget(ino);
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;

    thread_local! {
        /// Run once by the next [`super::Vfs::passthrough_own_change`] on this thread,
        /// between the daemon's change and its look at the backing file: a kernel write
        /// landing there.
        pub(crate) static BEFORE_OWN_LOOK: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}
