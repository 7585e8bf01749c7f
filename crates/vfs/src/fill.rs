//! Whole-file fills: a file read from the bucket sequentially from its first byte is
//! assembled in one file of its own in the staging area
//! (`staging/<ino>.part.<pid>.<n>`, removed at the next start if this process is gone)
//! instead of in the block cache. Once every block is in it, the fill serves read-only
//! opens through FUSE passthrough at once; flushed, it becomes the inode's clean staging
//! file (`local == here`), exactly as a download for a write does (design 0016).
//!
//! ```text
//!   Filling ──last block put──▶ Complete ──fdatasync──▶ Synced ──adopted──▶ Taken
//!      └──────── discarded (last close before complete, another version, ...) ──▶ Discarded
//! ```
//!
//! Nothing here is ever the only copy of content: the bucket holds every byte of a
//! fill's version. What the rules protect is the opposite direction: a row names this
//! cache as a holder of its content only after the fill was flushed (design 0015: a
//! clean row's copy is on disk), and a backing file given to the kernel is always the
//! file that becomes the staging file (see [`Vfs::take_fill`]).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deskfs_cache::BlockKey;
use deskfs_meta::{Ino, InodeRow, Kind};

use crate::handles::InodeState;
use crate::{Result, Vfs};

/// The states of a [`Fill`] (see the module's diagram).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Blocks arrive.
    Filling,
    /// Every block is in the file; not flushed yet.
    Complete,
    /// Complete and flushed (`fdatasync`): ready to become the staging file.
    Synced,
    /// Adopted as the staging file: no longer in the registry's hands.
    Taken,
    /// Thrown away before adoption; its blocks went to the block cache.
    Discarded,
}

impl Stage {
    /// Out of use: adopted or discarded.
    fn ended(self) -> bool {
        matches!(self, Stage::Taken | Stage::Discarded)
    }
}

/// What [`Fill::put`] did with a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Put {
    /// Written into the file; blocks are still missing.
    Stored,
    /// Written, and it was the last missing block: the fill is `Complete`.
    Completed,
    /// The fill holds the block already, or held it (complete, adopted): nothing
    /// written.
    Present,
    /// The fill was discarded before the block was kept: the block is not in it and
    /// belongs where the discard sent the others (the block cache).
    Refused,
}

struct FillState {
    present: Vec<bool>,
    missing: u64,
    stage: Stage,
}

/// One file being assembled from the bucket: content version `version` of inode `ino`,
/// `size` bytes in blocks of `block_size` bytes at their offsets.
pub(crate) struct Fill {
    pub(crate) ino: Ino,
    pub(crate) version: u64,
    pub(crate) size: u64,
    block_size: u64,
    path: PathBuf,
    file: File,
    state: Mutex<FillState>,
    /// Serialises flushes (held across the `fdatasync`, never with `state`).
    sync_lock: Mutex<()>,
}

impl Fill {
    fn create(path: PathBuf, row: &InodeRow, block_size: u64) -> std::io::Result<Fill> {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        file.set_len(row.size)?;
        let blocks = row.size.div_ceil(block_size);
        Ok(Fill {
            ino: row.ino,
            version: row.data_version,
            size: row.size,
            block_size,
            path,
            file,
            state: Mutex::new(FillState {
                present: vec![false; blocks as usize],
                missing: blocks,
                stage: Stage::Filling,
            }),
            sync_lock: Mutex::new(()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FillState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of block `index` (the last one is short).
    fn block_len(&self, index: u64) -> u64 {
        let start = index * self.block_size;
        self.size.saturating_sub(start).min(self.block_size)
    }

    /// The fill's stage now.
    pub(crate) fn stage(&self) -> Stage {
        self.state().stage
    }

    /// Whether block `index` is in the file.
    pub(crate) fn has(&self, index: u64) -> bool {
        self.state()
            .present
            .get(index as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The blocks not in the file yet (indices).
    fn missing_blocks(&self) -> Vec<u64> {
        let st = self.state();
        (0..st.present.len() as u64)
            .filter(|i| !st.present[*i as usize])
            .collect()
    }

    /// Every block is in the file (flushed or not), and it is not taken.
    pub(crate) fn complete(&self) -> bool {
        matches!(self.stage(), Stage::Complete | Stage::Synced)
    }

    /// Writes block `index` (`data`, the whole block) into the file and says what it did
    /// ([`Put`]): a block already present is left as it is; a fill no longer filling,
    /// or one that stops filling while the block is written (a discard at the last
    /// close), does not keep it ([`Put::Refused`]). Errors: the write's (`ENOSPC`,
    /// `EIO`); a block of the wrong length (`EINVAL`).
    pub(crate) fn put(&self, index: u64, data: &[u8]) -> std::io::Result<Put> {
        if let Some(early) = Self::answer(&self.state(), index) {
            return Ok(early);
        }
        if data.len() as u64 != self.block_len(index) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let offset = index * self.block_size;
        self.file.write_all_at(data, offset)?;
        // Writeback starts now, while the reader waits for the network, so the flush
        // before adoption has little left to write (a 1 GiB flush at the end made a
        // passthrough re-read running beside it 4x slower). Only a start: a write error
        // is reported by that flush (`fdatasync`), which decides.
        // SAFETY: sync_file_range on a descriptor owned by `self.file`.
        let rc = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                data.len() as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        if rc != 0 {
            tracing::debug!(ino = self.ino, error = %std::io::Error::last_os_error(), "cannot start the writeback of a fill block");
        }
        let mut st = self.state();
        if let Some(late) = Self::answer(&st, index) {
            return Ok(late);
        }
        st.present[index as usize] = true;
        st.missing -= 1;
        if st.missing == 0 {
            st.stage = Stage::Complete;
            return Ok(Put::Completed);
        }
        Ok(Put::Stored)
    }

    /// The answer to a put of block `index` (state `st`) that must not write:
    /// `Some(Refused)` when the fill was discarded, `Some(Present)` when the block is in
    /// it (or the fill is past filling, or the index out of its range), `None` when the
    /// put may go on.
    fn answer(st: &FillState, index: u64) -> Option<Put> {
        match st.stage {
            Stage::Filling => {}
            Stage::Discarded => return Some(Put::Refused),
            Stage::Complete | Stage::Synced | Stage::Taken => return Some(Put::Present),
        }
        match st.present.get(index as usize) {
            Some(false) => None,
            _ => Some(Put::Present),
        }
    }

    /// Bytes `from..to` of block `index` (offsets inside the block), or `None` when the
    /// block is not in the file. Errors: the read's (`EIO`).
    pub(crate) fn read(&self, index: u64, from: u64, to: u64) -> std::io::Result<Option<Vec<u8>>> {
        if !self.has(index) {
            return Ok(None);
        }
        let to = to.min(self.block_len(index));
        let mut buf = vec![0u8; to.saturating_sub(from) as usize];
        self.file
            .read_exact_at(&mut buf, index * self.block_size + from)?;
        Ok(Some(buf))
    }

    /// A new open of the fill's file for the kernel (its own open file description,
    /// through `/proc/self/fd`: the path may be renamed meanwhile), readable and writable
    /// as every backing file is (a writer opened later shares it, once it was adopted).
    pub(crate) fn backing(&self) -> std::io::Result<File> {
        File::options()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Flushes the complete file (`fdatasync`) once: `Complete` becomes `Synced`.
    /// Returns whether the fill is `Synced` now (`false`: still filling, or taken).
    /// Errors: the flush's (`EIO`): the fill stays `Complete` and is never adopted
    /// unflushed.
    fn sync(&self, flushes: &AtomicU64) -> std::io::Result<bool> {
        let _one = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        match self.stage() {
            Stage::Synced => return Ok(true),
            Stage::Complete => {}
            Stage::Filling | Stage::Taken | Stage::Discarded => return Ok(false),
        }
        self.file.sync_data()?;
        flushes.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state();
        if st.stage == Stage::Complete {
            st.stage = Stage::Synced;
        }
        Ok(st.stage == Stage::Synced)
    }

    /// Takes a `Synced` fill for adoption (`true` once; the caller renames the file).
    fn take_synced(&self) -> bool {
        let mut st = self.state();
        if st.stage == Stage::Synced {
            st.stage = Stage::Taken;
            return true;
        }
        false
    }

    /// Takes the fill out of use: the indexes of the blocks it holds (for the block
    /// cache; the caller removes the file), or `None` when it was taken already (adopted:
    /// its file is the staging file now). Open descriptors of it (a kernel's backing
    /// file) keep reading what it holds: this version's bytes.
    fn discard(&self) -> Option<Vec<u64>> {
        let mut st = self.state();
        if st.stage.ended() {
            return None;
        }
        st.stage = Stage::Discarded;
        Some(
            st.present
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.then_some(i as u64))
                .collect(),
        )
    }
}

/// The fills of this mount, by inode (one at a time per inode).
#[derive(Clone, Default)]
pub(crate) struct Fills {
    map: Arc<Mutex<HashMap<Ino, Arc<Fill>>>>,
    /// Fills flushed so far (for `deskfs status` and tests).
    pub(crate) flushes: Arc<AtomicU64>,
    /// Fills adopted as staging files so far.
    pub(crate) adopted: Arc<AtomicU64>,
    /// Passthrough opens so far (every backing file given), and of those, opens given a
    /// complete fill.
    pub(crate) passthrough_opens: Arc<AtomicU64>,
    pub(crate) fill_opens: Arc<AtomicU64>,
    /// The last adopted fills' (inode, version): a fetch that completes after its fill
    /// was adopted keeps no block-cache copy of content that is local now.
    recent: Arc<Mutex<std::collections::VecDeque<(Ino, u64)>>>,
    /// Tests: complete fills are flushed and then wait (`Synced`) instead of being adopted
    /// in the background.
    #[cfg(test)]
    pub(crate) hold_adoption: Arc<std::sync::atomic::AtomicBool>,
    /// Tests: a fetched block is kept (put into its fill) this many ms after the reader
    /// got it, as on a loaded machine.
    #[cfg(test)]
    pub(crate) keep_delay_ms: Arc<AtomicU64>,
}

/// A complete fill is flushed once its inode was not open for this many ticks in a row…
const FLUSH_QUIET_TICKS: u32 = 2;
/// …of this length…
const FLUSH_TICK: std::time::Duration = std::time::Duration::from_millis(500);
/// …or after this long in any case.
const FLUSH_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// How many adopted fills [`Fills`] remembers for late fetches.
const RECENT_ADOPTED: usize = 64;

impl Fills {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, Arc<Fill>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fill of `ino` at content `version`, if one is in use.
    pub(crate) fn get(&self, ino: Ino, version: u64) -> Option<Arc<Fill>> {
        self.map()
            .get(&ino)
            .filter(|f| f.version == version && !f.stage().ended())
            .cloned()
    }

    /// The complete fill of `ino` at content `version`, if there is one: a backing file
    /// for readers (flushed or not: nothing is claimed of it yet).
    pub(crate) fn complete(&self, ino: Ino, version: u64) -> Option<Arc<Fill>> {
        self.get(ino, version).filter(|f| f.complete())
    }

    /// Removes `fill` from the registry (if it is still the one of its inode).
    fn forget(&self, fill: &Arc<Fill>) {
        let mut m = self.map();
        if m.get(&fill.ino).is_some_and(|f| Arc::ptr_eq(f, fill)) {
            m.remove(&fill.ino);
        }
    }

    /// Notes that the fill of (`ino`, `version`) was adopted.
    fn adopted(&self, ino: Ino, version: u64) {
        self.adopted.fetch_add(1, Ordering::Relaxed);
        let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if r.len() == RECENT_ADOPTED {
            r.pop_front();
        }
        r.push_back((ino, version));
    }

    /// Whether the fill of (`ino`, `version`) was adopted lately.
    fn adopted_lately(&self, ino: Ino, version: u64) -> bool {
        self.recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(ino, version))
    }

    /// Fills in use and the bytes they span (for `deskfs status`).
    pub(crate) fn usage(&self) -> (u64, u64) {
        let m = self.map();
        (m.len() as u64, m.values().map(|f| f.size).sum())
    }
}

impl Vfs {
    /// The fill a sequential reader of `row` (its content in the bucket only) reading
    /// block `index` uses: the inode's fill for this version, or — from the reader's
    /// second block on, when the handle has read from offset 0 without a jump — a new
    /// one, when passthrough could use it (on, this mount alone) and it fits (a quarter
    /// of the cache's capacity, all fills together). Blocks of it already in the block
    /// cache are copied in. `None`: the reader uses the block cache.
    pub(crate) fn fill_for_read(
        &self,
        row: &InodeRow,
        index: u64,
        from_start: bool,
    ) -> Option<Arc<Fill>> {
        if let Some(f) = self.fills.get(row.ino, row.data_version) {
            return Some(f);
        }
        if !from_start
            || index == 0
            || row.kind != Kind::File
            || row.local == self.here()
            || !self.passthrough_on()
            || self.shared()
        {
            return None;
        }
        let budget = self.cache.capacity() / 4;
        let fill = {
            let mut m = self.fills.map();
            if let Some(f) = m.get(&row.ino) {
                if f.version == row.data_version && !f.stage().ended() {
                    return Some(f.clone());
                }
            }
            let used: u64 = m.values().map(|f| f.size).sum();
            if used.saturating_add(row.size) > budget {
                return None;
            }
            static SEQ: AtomicU64 = AtomicU64::new(0);
            let path = self.cache.staging_path(row.ino).with_extension(format!(
                "part.{}.{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let fill = match Fill::create(path, row, self.cache.block_size()) {
                Ok(f) => Arc::new(f),
                Err(e) => {
                    tracing::debug!(ino = row.ino, error = %e, "cannot start a whole-file fill");
                    return None;
                }
            };
            if let Some(old) = m.insert(row.ino, fill.clone()) {
                self.discard_fill(&old);
            }
            fill
        };
        // What the reader read so far is in the block cache: copied in.
        for i in 0..row.size.div_ceil(self.cache.block_size()) {
            let k = BlockKey {
                ino: row.ino,
                version: row.data_version,
                index: i,
            };
            if self.cache.has_block(&k) {
                if let Ok(Some(d)) = self.cache.read_block(&k) {
                    self.fill_put(&fill, i, &d);
                }
            }
        }
        Some(fill)
    }

    /// Keeps a fetched block: in the inode's fill when one is in use for its version,
    /// else in the block cache.
    pub(crate) fn keep_block(&self, k: BlockKey, data: &[u8]) {
        #[cfg(test)]
        std::thread::sleep(std::time::Duration::from_millis(
            self.fills.keep_delay_ms.load(Ordering::SeqCst),
        ));
        if let Some(fill) = self.fills.get(k.ino, k.version) {
            return self.fill_put(&fill, k.index, data);
        }
        if self.fills.adopted_lately(k.ino, k.version) {
            return;
        }
        if let Err(e) = self.cache.write_block(&k, data) {
            tracing::debug!(error = %e, "cannot keep a fetched block in the cache");
            return;
        }
        // A fill began, or was adopted, while the block was written: it goes there.
        if let Some(fill) = self.fills.get(k.ino, k.version) {
            self.fill_put(&fill, k.index, data);
            self.cache.drop_block(&k);
        } else if self.fills.adopted_lately(k.ino, k.version) {
            self.cache.drop_block(&k);
        }
    }

    /// Puts block `index` into `fill`; the put that completes it starts its adoption in
    /// the background. A failed write discards the fill (its blocks go to the block
    /// cache; readers fetch the rest as usual).
    pub(crate) fn fill_put(&self, fill: &Arc<Fill>, index: u64, data: &[u8]) {
        match fill.put(index, data) {
            Ok(Put::Completed) => {
                let this = self.this.clone();
                let fill = fill.clone();
                self.rt.spawn_blocking(move || {
                    if let Some(vfs) = this.upgrade() {
                        vfs.adopt_fill(&fill);
                    }
                });
            }
            Ok(Put::Stored | Put::Present) => {}
            // Discarded while the block was on its way (the last close of a reader that
            // did not read to the end, with read-ahead in flight): the block goes where
            // the discard sent the others.
            Ok(Put::Refused) => {
                let k = BlockKey {
                    ino: fill.ino,
                    version: fill.version,
                    index,
                };
                if let Err(e) = self.cache.write_block(&k, data) {
                    tracing::debug!(error = %e, "cannot keep a fetched block in the cache");
                }
            }
            Err(e) => {
                tracing::debug!(ino = fill.ino, error = %e, "whole-file fill failed; blocks go to the block cache");
                self.fills.forget(fill);
                self.discard_fill(fill);
            }
        }
    }

    /// Makes a complete fill the inode's clean staging file, in the background: flushed
    /// first (outside the inode's lock), then adopted under it when the row still has the
    /// fill's version and names no copy here; otherwise discarded. Errors are logged: the
    /// fill is discarded and the content stays in the bucket.
    fn adopt_fill(&self, fill: &Arc<Fill>) {
        // The flush waits until the file was left alone for a moment: a re-read right
        // after the read that filled it (through passthrough, from this very file) ran at
        // a third of its speed beside the flush of a 1 GiB fill.
        let since = std::time::Instant::now();
        let mut quiet = 0;
        while quiet < FLUSH_QUIET_TICKS && since.elapsed() < FLUSH_WAIT_MAX {
            std::thread::sleep(FLUSH_TICK);
            quiet = if self.is_open(fill.ino) { 0 } else { quiet + 1 };
            if fill.stage().ended() {
                return;
            }
        }
        match fill.sync(&self.fills.flushes) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(ino = fill.ino, error = %e, "cannot flush a whole-file fill; it is dropped");
                self.fills.forget(fill);
                self.discard_fill(fill);
                return;
            }
        }
        #[cfg(test)]
        if self.fills.hold_adoption.load(Ordering::SeqCst) {
            return;
        }
        let res = self.locked(fill.ino, |s| {
            let row = self.meta.get_inode(fill.ino)?;
            let usable = row.as_ref().is_some_and(|r| {
                r.data_version == fill.version && r.local != self.here() && s.staging.is_none()
            });
            match row {
                Some(r) if usable && fill.take_synced() => {
                    self.fills.forget(fill);
                    self.adopt_local(&r, Some(&fill.path))?;
                    self.fills.adopted(fill.ino, fill.version);
                    self.cache.drop_blocks(fill.ino);
                    if s.open_count == 0 {
                        self.cache.staging_clean(fill.ino, fill.size);
                    } else {
                        s.clean_at_close = Some(fill.version);
                    }
                }
                _ => {
                    self.fills.forget(fill);
                    self.discard_fill(fill);
                }
            }
            Ok(())
        });
        if let Err(e) = res {
            tracing::warn!(ino = fill.ino, error = %e, "cannot adopt a whole-file fill; it is dropped");
            self.fills.forget(fill);
            self.discard_fill(fill);
        }
    }

    /// For a caller about to make `row`'s content local (under the inode's lock, `s`):
    /// the path of its complete fill of that version, flushed and taken out of the
    /// registry, to adopt instead of a download — so a backing file the kernel was given
    /// from the fill is the staging file from then on. An unfinished or other-version
    /// fill is discarded (the content is downloaded whole anyway). Errors: the flush's
    /// (`EIO`).
    pub(crate) fn take_fill(&self, row: &InodeRow) -> Result<Option<PathBuf>> {
        let fill = self.fills.map().get(&row.ino).cloned();
        let Some(fill) = fill else { return Ok(None) };
        if fill.version != row.data_version || !fill.complete() {
            self.fills.forget(&fill);
            self.discard_fill(&fill);
            return Ok(None);
        }
        if !fill.sync(&self.fills.flushes)? || !fill.take_synced() {
            return Ok(None);
        }
        self.fills.forget(&fill);
        self.fills.adopted(fill.ino, fill.version);
        self.cache.drop_blocks(fill.ino);
        Ok(Some(fill.path.clone()))
    }

    /// At the last close of `ino` (state `s`): a fill of another version than the
    /// state's, or one that is not complete and will not be, is discarded (its blocks go
    /// to the block cache). A fill whose every missing block is being fetched is kept:
    /// a reader gets a fetched block before it is put into the fill, so a process that
    /// read the file whole and closed it at once would otherwise lose the fill to that
    /// moment; those puts complete it and it is adopted as usual.
    pub(crate) fn fill_closed(&self, ino: Ino, s: &InodeState) {
        let fill = self.fills.map().get(&ino).cloned();
        if let Some(fill) = fill {
            let finishing = || {
                self.fetches
                    .all_in_flight(fill.missing_blocks().into_iter().map(|index| BlockKey {
                        ino,
                        version: fill.version,
                        index,
                    }))
            };
            if fill.version != s.version || (fill.stage() == Stage::Filling && !finishing()) {
                self.fills.forget(&fill);
                self.discard_fill(&fill);
            }
        }
    }

    /// Drops the fill of a purged inode.
    pub(crate) fn fill_purged(&self, ino: Ino) {
        let fill = self.fills.map().remove(&ino);
        if let Some(fill) = fill {
            self.discard_fill(&fill);
        }
    }

    /// Discards `fill` (already out of the registry, or about to be): its blocks are moved
    /// to the block cache and its file removed, in the background.
    fn discard_fill(&self, fill: &Arc<Fill>) {
        let Some(blocks) = fill.discard() else {
            return;
        };
        let fill = fill.clone();
        let cache = self.cache.clone();
        self.rt.spawn_blocking(move || {
            for index in blocks {
                let k = BlockKey {
                    ino: fill.ino,
                    version: fill.version,
                    index,
                };
                let len = fill.block_len(index);
                let mut buf = vec![0u8; len as usize];
                if fill
                    .file
                    .read_exact_at(&mut buf, index * fill.block_size)
                    .is_ok()
                {
                    let _ = cache.write_block(&k, &buf);
                }
            }
            if let Err(e) = std::fs::remove_file(&fill.path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %fill.path.display(), error = %e, "cannot remove a dropped whole-file fill");
                }
            }
        });
    }
}
