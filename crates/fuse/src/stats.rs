//! Per-request statistics: how many kernel requests of each kind this process served and
//! how long the daemon spent on them (from the handler's start to its return, which
//! includes the reply). Process-wide counters, lock-free; read by `deskfs status`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

macro_rules! ops {
    ($($v:ident => $name:literal),* $(,)?) => {
        /// A FUSE request kind (FUSE protocol opcode names, lower-case).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(missing_docs)]
        pub enum Op { $($v),* }

        impl Op {
            /// Every kind, in table order.
            pub const ALL: &'static [Op] = &[$(Op::$v),*];

            /// The request's name (`lookup`, `getattr`, …).
            pub fn name(self) -> &'static str {
                match self { $(Op::$v => $name),* }
            }
        }
    };
}

ops! {
    Lookup => "lookup", Getattr => "getattr", Setattr => "setattr", Readlink => "readlink",
    Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink", Rmdir => "rmdir",
    Symlink => "symlink", Rename => "rename", Link => "link", Open => "open", Read => "read",
    Write => "write", Flush => "flush", Fallocate => "fallocate", Lseek => "lseek",
    Ioctl => "ioctl", Getlk => "getlk", Setlk => "setlk", Release => "release",
    Fsync => "fsync", Opendir => "opendir", Readdir => "readdir",
    Readdirplus => "readdirplus", Releasedir => "releasedir", Fsyncdir => "fsyncdir",
    Statfs => "statfs", Setxattr => "setxattr", Getxattr => "getxattr",
    Listxattr => "listxattr", Removexattr => "removexattr", Access => "access",
    Create => "create",
}

const N: usize = 34;

/// Upper bounds of the latency histogram's buckets, ns (Prometheus `le`: a request of
/// exactly a bound counts in that bucket); slower requests count only in `+Inf`.
pub const LATENCY_BOUNDS_NS: [u64; 14] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    50_000_000,
    250_000_000,
    1_000_000_000,
    5_000_000_000,
];
const B: usize = LATENCY_BOUNDS_NS.len();

/// Errno values counted one by one (Linux's are below 134); larger ones share the last.
const ERRNO_SLOTS: usize = 134;

static COUNT: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
/// Per kind, the requests in each latency bucket (not cumulative).
static BUCKETS: [[AtomicU64; B]; N] = [const { [const { AtomicU64::new(0) }; B] }; N];
/// Error replies by errno.
static ERRORS: [AtomicU64; ERRNO_SLOTS] = [const { AtomicU64::new(0) }; ERRNO_SLOTS];
static NANOS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static ROUND_TRIPS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

/// Counts one request of kind `op` and, when dropped, the time spent on it (made by
/// the request handlers).
pub struct Timed {
    op: Op,
    start: Instant,
    round_trips: u64,
}

/// Starts timing one request of kind `op`.
pub(crate) fn timed(op: Op) -> Timed {
    Timed {
        op,
        start: Instant::now(),
        round_trips: deskfs_meta::thread_round_trips(),
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        let i = self.op as usize;
        let ns = self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        COUNT[i].fetch_add(1, Ordering::Relaxed);
        NANOS[i].fetch_add(ns, Ordering::Relaxed);
        if let Some(b) = LATENCY_BOUNDS_NS.iter().position(|&le| ns <= le) {
            BUCKETS[i][b].fetch_add(1, Ordering::Relaxed);
        }
        let rts = deskfs_meta::thread_round_trips().saturating_sub(self.round_trips);
        ROUND_TRIPS[i].fetch_add(rts, Ordering::Relaxed);
    }
}

/// One row of [`snapshot`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OpStat {
    /// Request kind (`lookup`, `write`, …).
    pub op: &'static str,
    /// Requests served since the process started.
    pub count: u64,
    /// Time spent serving them in total, ns.
    pub total_ns: u64,
    /// Metadata database round trips they waited for, in total.
    pub round_trips: u64,
}

/// Counts one error reply with `errno` (a positive errno value).
pub(crate) fn error(errno: i32) {
    let slot = usize::try_from(errno).unwrap_or(0).min(ERRNO_SLOTS - 1);
    ERRORS[slot].fetch_add(1, Ordering::Relaxed);
}

/// Error replies sent so far, `(errno, count)` for each errno replied at least once,
/// ascending (errnos of 133 and above are counted as 133).
pub fn errors() -> Vec<(i32, u64)> {
    ERRORS
        .iter()
        .enumerate()
        .map(|(e, n)| (e as i32, n.load(Ordering::Relaxed)))
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// One request kind's latency histogram: `(op, counts per bucket of
/// [`LATENCY_BOUNDS_NS`] — not cumulative —, total count, total ns)`, for the kinds
/// served so far, in table order.
pub fn histograms() -> Vec<(&'static str, [u64; B], u64, u64)> {
    Op::ALL
        .iter()
        .map(|&op| {
            let i = op as usize;
            let mut b = [0u64; B];
            for (k, slot) in b.iter_mut().enumerate() {
                *slot = BUCKETS[i][k].load(Ordering::Relaxed);
            }
            (
                op.name(),
                b,
                COUNT[i].load(Ordering::Relaxed),
                NANOS[i].load(Ordering::Relaxed),
            )
        })
        .filter(|h| h.2 > 0)
        .collect()
}

/// The request kinds served so far (those with a count of 0 left out), in table order.
pub fn snapshot() -> Vec<OpStat> {
    Op::ALL
        .iter()
        .map(|&op| OpStat {
            op: op.name(),
            count: COUNT[op as usize].load(Ordering::Relaxed),
            total_ns: NANOS[op as usize].load(Ordering::Relaxed),
            round_trips: ROUND_TRIPS[op as usize].load(Ordering::Relaxed),
        })
        .filter(|s| s.count > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_op_and_counts() {
        assert_eq!(Op::ALL.len(), N);
        let before = snapshot()
            .iter()
            .find(|s| s.op == "fsyncdir")
            .map(|s| s.count)
            .unwrap_or(0);
        drop(timed(Op::Fsyncdir));
        drop(timed(Op::Fsyncdir));
        let after = snapshot().into_iter().find(|s| s.op == "fsyncdir").unwrap();
        assert_eq!(after.count, before + 2);
    }
}
