//! Request counters: how many kernel requests of each kind the file system served and,
//! with `--stats`, how long the handlers took (handler start to reply sent). The kinds
//! and names are deskfs's (`crates/fuse/src/stats.rs`) plus `forget`, which deskfs does
//! not count. Lock-free, process-wide.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

macro_rules! ops {
    ($($v:ident => $name:literal),* $(,)?) => {
        /// A FUSE request kind.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Op { $($v),* }

        impl Op {
            /// Every kind, in table order.
            pub(crate) const ALL: &'static [Op] = &[$(Op::$v),*];

            /// The request's name (`lookup`, `getattr`, …).
            pub(crate) fn name(self) -> &'static str {
                match self { $(Op::$v => $name),* }
            }
        }
    };
}

ops! {
    Lookup => "lookup", Forget => "forget", Getattr => "getattr", Setattr => "setattr",
    Readlink => "readlink", Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink",
    Rmdir => "rmdir", Symlink => "symlink", Rename => "rename", Link => "link",
    Open => "open", Read => "read", Write => "write", Flush => "flush",
    Fallocate => "fallocate", Ioctl => "ioctl", Release => "release", Fsync => "fsync",
    Opendir => "opendir", Readdir => "readdir", Readdirplus => "readdirplus",
    Releasedir => "releasedir", Fsyncdir => "fsyncdir", Statfs => "statfs",
    Setxattr => "setxattr", Getxattr => "getxattr", Listxattr => "listxattr",
    Removexattr => "removexattr", Access => "access", Create => "create",
}

const N: usize = 32;

static COUNT: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static NANOS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static TIMING: AtomicBool = AtomicBool::new(false);

/// Also measure the time of each request (two clock reads per request).
pub(crate) fn enable_timing() {
    TIMING.store(true, Ordering::Relaxed);
}

/// One request being served: counted now, its time added when dropped.
pub(crate) struct Timed {
    op: Op,
    start: Option<Instant>,
}

/// Counts one request of kind `op`; the returned guard adds its time when dropped.
pub(crate) fn timed(op: Op) -> Timed {
    COUNT[op as usize].fetch_add(1, Ordering::Relaxed);
    let start = TIMING.load(Ordering::Relaxed).then(Instant::now);
    Timed { op, start }
}

/// Counts `n` requests of kind `op` without timing them (forgets).
pub(crate) fn count(op: Op, n: u64) {
    COUNT[op as usize].fetch_add(n, Ordering::Relaxed);
}

impl Drop for Timed {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            NANOS[self.op as usize].fetch_add(ns, Ordering::Relaxed);
        }
    }
}

/// The counters as JSON: `{"lookup": [count, ns, 0], …}` (deskfs's `[count, ns, round
/// trips]` records), kinds never seen left out.
pub(crate) fn snapshot() -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for &op in Op::ALL {
        let c = COUNT[op as usize].load(Ordering::Relaxed);
        if c > 0 {
            let ns = NANOS[op as usize].load(Ordering::Relaxed);
            m.insert(op.name().to_owned(), serde_json::json!([c, ns, 0]));
        }
    }
    serde_json::Value::Object(m)
}

/// One line per kind: count, and µs per request when timed.
pub(crate) fn summary() -> String {
    let mut out = String::new();
    for &op in Op::ALL {
        let c = COUNT[op as usize].load(Ordering::Relaxed);
        if c == 0 {
            continue;
        }
        let ns = NANOS[op as usize].load(Ordering::Relaxed);
        out.push_str(&format!("{:>12} {:>10}", op.name(), c));
        if ns > 0 {
            out.push_str(&format!(
                " {:>8.2} µs/request",
                ns as f64 / c as f64 / 1000.0
            ));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_op_and_counts() {
        assert_eq!(Op::ALL.len(), N);
        drop(timed(Op::Fsyncdir));
        count(Op::Forget, 3);
        let s = snapshot();
        assert!(s["fsyncdir"][0].as_u64().unwrap_or(0) >= 1);
        assert!(s["forget"][0].as_u64().unwrap_or(0) >= 3);
        assert!(summary().contains("fsyncdir"));
    }
}
