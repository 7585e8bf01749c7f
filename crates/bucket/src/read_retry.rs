//! Reads of the bucket (GET, HEAD, LIST) retried past the HTTP client's own retries.
//!
//! The HTTP client retries each request twice (`RetryConfig` in [`crate::Bucket::open`]);
//! that is enough for one hiccup, not for a server that fails one request in ten for a
//! while (503 SlowDown bursts, resets, bodies cut short). Uploads have their own
//! persistent queue; a read has only the caller waiting on it, so a failed read is
//! tried again here, a bounded number of times with growing pauses, before its error
//! reaches the caller as `EIO`. Answers that cannot change by waiting are returned at
//! once: not found, changed (ETag precondition), access denied, configuration, local I/O.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::{BucketError, Result};

/// Tries of one read, the first included (each is itself up to 3 HTTP requests).
pub const READ_ATTEMPTS: u32 = 5;
/// Pause before the second try; doubled before each later one (0.25, 0.5, 1, 2 s: a
/// read the bucket keeps refusing fails after ~4 s of pauses plus its requests' time).
pub const READ_FIRST_PAUSE: Duration = Duration::from_millis(250);

/// Counts of read retries since the bucket was opened (shown by `deskfs status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReadCounters {
    /// Reads tried again after a transient failure (one per extra try).
    pub retried: u64,
    /// Reads that failed after their last try (each reached its caller as an error).
    pub failed: u64,
}

/// The retry rule and shared counters of one bucket's reads.
#[derive(Debug)]
pub(crate) struct ReadRetry {
    /// Pause before the second try ([`READ_FIRST_PAUSE`]; shorter in tests).
    first_pause: Duration,
    retried: AtomicU64,
    failed: AtomicU64,
}

impl Default for ReadRetry {
    fn default() -> Self {
        Self {
            first_pause: READ_FIRST_PAUSE,
            retried: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }
}

impl ReadRetry {
    /// Runs the read `op` until it succeeds, fails with an error waiting cannot change,
    /// or has been tried [`READ_ATTEMPTS`] times; returns its last result.
    pub(crate) async fn run<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut pause = self.first_pause;
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if !worth_retrying(&e) => return Err(e),
                Err(e) if attempt >= READ_ATTEMPTS => {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
                Err(e) => {
                    tracing::debug!(read = what, attempt, error = %e, "bucket read failed; trying again");
                    self.retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
            }
        }
    }

    /// The counters now.
    pub(crate) fn counters(&self) -> ReadCounters {
        ReadCounters {
            retried: self.retried.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// Whether trying a read again later may give another answer: server errors, resets,
/// cut bodies, timeouts and refused connections may; the rest are the answer.
fn worth_retrying(e: &BucketError) -> bool {
    matches!(e, BucketError::Unreachable(_) | BucketError::Other(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    /// The rule with 1 ms pauses (1, 2, 4, 8 ms): the tests count tries, not seconds.
    fn quick() -> ReadRetry {
        ReadRetry {
            first_pause: Duration::from_millis(1),
            ..ReadRetry::default()
        }
    }

    #[test]
    fn a_read_failing_transiently_is_tried_again_until_it_succeeds() {
        let r = quick();
        let calls = AtomicU32::new(0);
        let out = rt().block_on(r.run("get", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(BucketError::Other(
                    "the server answered 503 SlowDown".into(),
                )),
                1..=3 => Err(BucketError::Unreachable("connection reset".into())),
                _ => Ok(7),
            }
        }));
        assert_eq!(out.expect("converged"), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(
            r.counters(),
            ReadCounters {
                retried: 4,
                failed: 0
            }
        );
    }

    #[test]
    fn retries_are_bounded_and_the_last_error_is_returned() {
        let r = quick();
        let calls = AtomicU32::new(0);
        let out: Result<()> = rt().block_on(r.run("get", || async {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            Err(BucketError::Other(format!("500 number {n}")))
        }));
        assert_eq!(calls.load(Ordering::SeqCst), READ_ATTEMPTS);
        let msg = out.expect_err("fails").to_string();
        assert!(
            msg.contains(&format!("500 number {}", READ_ATTEMPTS - 1)),
            "{msg}"
        );
        assert_eq!(
            r.counters(),
            ReadCounters {
                retried: u64::from(READ_ATTEMPTS - 1),
                failed: 1
            }
        );
    }

    #[test]
    fn answers_waiting_cannot_change_are_returned_at_once() {
        for e in [
            BucketError::NotFound("k".into()),
            BucketError::Changed("k".into()),
            BucketError::Auth("403".into()),
            BucketError::Config("bad".into()),
        ] {
            let r = quick();
            let calls = AtomicU32::new(0);
            let mut once = Some(e);
            let out: Result<()> = rt().block_on(r.run("get", || {
                calls.fetch_add(1, Ordering::SeqCst);
                let e = once.take().expect("called once");
                async move { Err(e) }
            }));
            assert!(out.is_err());
            assert_eq!(calls.load(Ordering::SeqCst), 1);
            assert_eq!(r.counters(), ReadCounters::default());
        }
    }
}
