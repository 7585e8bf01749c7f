//! Device flushes of the metadata log, shared by callers that need them at once.
//!
//! Engines commit without a device flush ([`deskfs_meta::MetaEngine::make_durable`]);
//! a step that destroys something on the strength of earlier commits (the uploader's
//! delete after an unlink or rename, an eviction after an upload's record) flushes first,
//! so that after a power loss the database never names content that is gone. Such steps
//! come in bursts (eight upload workers deleting a removed tree): a flush that *began*
//! after a caller's commits covers them, so callers waiting behind a flush in progress
//! that began too early flush once more, and the others share it.

use std::sync::Mutex;
use std::time::Instant;

use crate::{Result, Vfs};

/// When the last completed flush began.
#[derive(Default)]
pub(crate) struct MetaFlush {
    last_start: Mutex<Option<Instant>>,
    /// Flushes run so far.
    flushes: std::sync::atomic::AtomicU64,
}

impl MetaFlush {
    /// Flushes of the metadata log run so far.
    pub(crate) fn count(&self) -> u64 {
        self.flushes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a flush that began at or after `since` has completed (commits made before
    /// `since` are durable).
    pub(crate) fn covers(&self, since: Instant) -> bool {
        self.last_start
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t >= since)
    }

    /// Runs `flush` unless a flush that began at or after `since` has completed; one
    /// flush at a time (later callers wait, then share it when it began late enough).
    /// A failed flush counts for nobody.
    pub(crate) fn covering<E>(
        &self,
        since: Instant,
        flush: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut last = self.last_start.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t >= since) {
            return Ok(());
        }
        let start = Instant::now();
        flush()?;
        *last = Some(start);
        self.flushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl Vfs {
    /// Makes every metadata commit made before `since` durable: one
    /// [`make_durable`](deskfs_meta::MetaEngine::make_durable), unless a flush that began
    /// at or after `since` has completed. Errors: the engine's (the caller must not go
    /// on with what depended on it).
    pub(crate) fn durable_since(&self, since: Instant) -> Result<()> {
        Ok(self
            .meta_flush
            .covering(since, || self.meta.make_durable())?)
    }
}

#[cfg(test)]
mod unit {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_flush_that_began_after_the_commits_covers_them_and_no_earlier_one_does() {
        let f = MetaFlush::default();
        let n = Cell::new(0);
        let flush = || {
            n.set(n.get() + 1);
            Ok::<(), ()>(())
        };
        let before = Instant::now();
        f.covering(before, flush).unwrap();
        assert_eq!(n.get(), 1);
        // Commits made before that flush began: covered.
        f.covering(before, flush).unwrap();
        assert_eq!(
            n.get(),
            1,
            "a flush that began after the commits covers them"
        );
        // Commits made after it began: a flush of their own.
        std::thread::sleep(std::time::Duration::from_millis(2));
        f.covering(Instant::now(), flush).unwrap();
        assert_eq!(
            n.get(),
            2,
            "a flush that began earlier does not cover later commits"
        );
        // A failed flush covers nothing.
        let later = Instant::now();
        assert!(f.covering(later, || Err::<(), ()>(())).is_err());
        f.covering(later, flush).unwrap();
        assert_eq!(n.get(), 3, "a failed flush counts for nobody");
    }
}
