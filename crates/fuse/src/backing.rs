//! Backing ids of FUSE passthrough (`FUSE_DEV_IOC_BACKING_OPEN`): one per inode while any
//! of its files is open through passthrough, shared by all of them (the kernel fails an
//! open naming another backing file of the same inode with `EIO`), closed after the
//! daemon saw the last of them released. The VFS decides which opens are passthrough
//! opens (see `deskfs_vfs::passthrough`); this table only keeps the kernel's ids alive.

use std::collections::HashMap;
use std::io;

use fuser::BackingId;

/// The backing ids in use, by inode, and which inode each passthrough handle is on.
#[derive(Default)]
pub(crate) struct Backings {
    by_ino: HashMap<u64, (BackingId, u32)>,
    by_fh: HashMap<u64, u64>,
}

impl Backings {
    /// The backing id for handle `fh` of `ino`: the inode's id in use, else a new one from
    /// `open` (which registers the staging file with the kernel). Counted until
    /// [`Backings::detach`] of `fh`. Errors: `open`'s (`EPERM` without `CAP_SYS_ADMIN`,
    /// `EINVAL`/`ELOOP` for a backing file on a stacked file system, ...).
    pub(crate) fn attach(
        &mut self,
        ino: u64,
        fh: u64,
        open: impl FnOnce() -> io::Result<BackingId>,
    ) -> io::Result<&BackingId> {
        let entry = match self.by_ino.entry(ino) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert((open()?, 0)),
        };
        entry.1 += 1;
        self.by_fh.insert(fh, ino);
        Ok(&entry.0)
    }

    /// Whether `ino` has a backing id in use.
    pub(crate) fn has(&self, ino: u64) -> bool {
        self.by_ino.contains_key(&ino)
    }

    /// Handle `fh` was released: when it was the last passthrough handle of its inode,
    /// the inode's backing id is closed.
    pub(crate) fn detach(&mut self, fh: u64) {
        let Some(ino) = self.by_fh.remove(&fh) else {
            return;
        };
        if let Some(entry) = self.by_ino.get_mut(&ino) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                // Dropping the id closes it (FUSE_DEV_IOC_BACKING_CLOSE).
                self.by_ino.remove(&ino);
            }
        }
    }
}
