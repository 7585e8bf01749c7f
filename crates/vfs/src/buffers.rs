//! One budget for the bytes the daemon holds in memory on the way between the bucket and
//! the cache: block fetches (a reader's and its readahead's) and upload buffers (a PUT's
//! body, a multipart upload's parts in flight).
//!
//! Without it each sequential reader could keep `readahead_blocks` fetches of one block in
//! flight and each upload worker a multipart upload's parts: 50 cold readers of large
//! files took the daemon to ~1 GiB of RSS. With it, what all of them hold together is at
//! most [`BufferBudget::limit`] bytes, and the rest waits:
//!
//! - a readahead fetch is speculative: when the budget is spent it is skipped, never
//!   waited for (the reader asks for that block later, if it still wants it);
//! - a fetch a reader waits on, and an upload, wait for their share (in arrival order:
//!   the semaphore is fair), so they always proceed once earlier holders finish.
//!
//! A reservation larger than the whole budget (a multipart upload of a huge file, whose
//! parts grow to stay under the S3 API's 10,000 parts) is cut to the budget: it then waits
//! for everything else to finish and runs alone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default budget, bytes: 64 MiB (two sequential readers at full readahead, or a
/// multipart upload and a reader).
pub const DEFAULT_LIMIT: u64 = 64 << 20;

/// Permits count KiB, so one acquisition (`u32` permits) can cover up to 4 TiB.
const UNIT: u64 = 1024;

/// The shared budget. Cheap to clone (an `Arc` inside).
#[derive(Clone, Debug)]
pub struct BufferBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sem: Arc<Semaphore>,
    limit: u64,
    held: AtomicU64,
    peak: AtomicU64,
    waits: AtomicU64,
    skipped: AtomicU64,
}

/// What the budget holds and has held (for `deskfs status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BufferStats {
    /// The budget, bytes.
    pub limit_bytes: u64,
    /// Reserved now, bytes.
    pub held_bytes: u64,
    /// Most ever reserved at once, bytes.
    pub peak_bytes: u64,
    /// Reservations that had to wait for others to finish.
    pub waits: u64,
    /// Readahead fetches skipped because the budget was spent.
    pub readahead_skipped: u64,
}

/// Bytes of the budget held until dropped.
#[derive(Debug)]
pub struct Reservation {
    /// `None` only if the semaphore were closed (it never is).
    _permit: Option<OwnedSemaphorePermit>,
    bytes: u64,
    inner: Arc<Inner>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.inner.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl BufferBudget {
    /// A budget of `limit` bytes (at least 1 MiB).
    pub fn new(limit: u64) -> BufferBudget {
        let limit = limit.max(1 << 20);
        let units = usize::try_from(limit / UNIT).unwrap_or(Semaphore::MAX_PERMITS);
        BufferBudget {
            inner: Arc::new(Inner {
                sem: Arc::new(Semaphore::new(units.min(Semaphore::MAX_PERMITS))),
                limit,
                held: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                skipped: AtomicU64::new(0),
            }),
        }
    }

    /// The budget, bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    fn units(&self, bytes: u64) -> (u32, u64) {
        let bytes = bytes.clamp(1, self.inner.limit);
        let units = bytes.div_ceil(UNIT);
        (u32::try_from(units).unwrap_or(u32::MAX), units * UNIT)
    }

    fn held(&self, permit: Option<OwnedSemaphorePermit>, bytes: u64) -> Reservation {
        let now = self.inner.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.inner.peak.fetch_max(now, Ordering::Relaxed);
        Reservation {
            _permit: permit,
            bytes,
            inner: self.inner.clone(),
        }
    }

    /// `bytes` for speculative work (readahead): `None`, counted as skipped, when the
    /// budget does not have them free now.
    pub fn try_reserve(&self, bytes: u64) -> Option<Reservation> {
        let (units, bytes) = self.units(bytes);
        match self.inner.sem.clone().try_acquire_many_owned(units) {
            Ok(p) => Some(self.held(Some(p), bytes)),
            Err(_) => {
                self.inner.skipped.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// `bytes` (cut to the whole budget), waiting until earlier holders release enough.
    pub async fn reserve(&self, bytes: u64) -> Reservation {
        let (units, bytes) = self.units(bytes);
        let sem = self.inner.sem.clone();
        let permit = match sem.clone().try_acquire_many_owned(units) {
            Ok(p) => Some(p),
            Err(_) => {
                self.inner.waits.fetch_add(1, Ordering::Relaxed);
                // The semaphore is never closed; were it, the work would go on
                // unbudgeted rather than fail a read or an upload.
                sem.acquire_many_owned(units).await.ok()
            }
        };
        self.held(permit, bytes)
    }

    /// What the budget holds now and has held.
    pub fn stats(&self) -> BufferStats {
        BufferStats {
            limit_bytes: self.inner.limit,
            held_bytes: self.inner.held.load(Ordering::Relaxed),
            peak_bytes: self.inner.peak.load(Ordering::Relaxed),
            waits: self.inner.waits.load(Ordering::Relaxed),
            readahead_skipped: self.inner.skipped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readahead_is_skipped_once_the_budget_is_spent_and_waiters_proceed_on_release() {
        let b = BufferBudget::new(4 << 20);
        let one = b.try_reserve(1 << 20).expect("free budget");
        let three = b.reserve(3 << 20).await;
        assert!(
            b.try_reserve(1 << 20).is_none(),
            "speculative work past the budget"
        );
        assert_eq!(b.stats().readahead_skipped, 1);
        assert_eq!(b.stats().held_bytes, 4 << 20);
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.reserve(2 << 20).await.bytes });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a reservation past the budget waits");
        drop(three);
        assert_eq!(waiter.await.expect("waiter"), 2 << 20);
        drop(one);
        let s = b.stats();
        assert_eq!((s.held_bytes, s.peak_bytes, s.waits), (0, 4 << 20, 1));
    }

    #[tokio::test]
    async fn a_reservation_larger_than_the_budget_is_cut_to_it() {
        let b = BufferBudget::new(2 << 20);
        let r = b.reserve(10 << 30).await;
        assert_eq!(r.bytes, 2 << 20);
        assert!(b.try_reserve(1).is_none());
        drop(r);
        assert!(b.try_reserve(1).is_some());
    }
}
