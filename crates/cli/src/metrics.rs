//! `deskfs mount --metrics ADDR`: the mount's figures at `GET http://ADDR/metrics`, in the
//! Prometheus text exposition format (version 0.0.4): FUSE requests by kind with latency
//! histograms, error replies by errno, cache use, hits and misses, dirty data, pending
//! and failing uploads, bucket bytes and read retries, metadata round trips, lock waits,
//! change-feed lag. The same figures are in `deskfs status --json` (the mount's `live`
//! object). Every scrape reads the current values (a few counters and one status query of
//! the metadata database).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use deskfs_vfs::{Vfs, VfsStatus};

/// Binds `addr` now (so a bad or busy address fails the mount before it is made) and
/// serves `/metrics` on `rt` until the process exits. Errors: the address cannot be bound.
pub fn serve(addr: SocketAddr, vfs: Arc<Vfs>, rt: &tokio::runtime::Runtime) -> Result<()> {
    let std_listener = std::net::TcpListener::bind(addr).with_context(|| {
        format!("cannot listen for --metrics on {addr}: give a free address, e.g. 127.0.0.1:9464")
    })?;
    std_listener.set_nonblocking(true)?;
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(std_listener)?
    };
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let vfs = vfs.clone();
            async move { scrape(vfs).await }
        }),
    );
    rt.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
    tracing::info!(%addr, "metrics at http://{addr}/metrics");
    Ok(())
}

/// One scrape: the exposition text, or 500 with the reason.
async fn scrape(vfs: Arc<Vfs>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let r = tokio::task::spawn_blocking(move || vfs.status()).await;
    match r {
        Ok(Ok(s)) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            render(&s),
        )
            .into_response(),
        Ok(Err(e)) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read the mount's status: {e}\n"),
        )
            .into_response(),
        Err(e) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("status task failed: {e}\n"),
        )
            .into_response(),
    }
}

/// An errno's symbolic name (`ENOENT`), as the metrics and `status --json` label errors.
pub(crate) fn errno_name(errno: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(errno))
}

/// The text exposition being written: one `# HELP`/`# TYPE` pair per family, then its
/// samples.
struct Exposition(String);

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP deskfs_{name} {help}");
        let _ = writeln!(self.0, "# TYPE deskfs_{name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str("deskfs_");
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.0, "{k}=\"{v}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// A family of one unlabelled sample.
    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// The exposition text for status `s` and this process's FUSE request counters.
pub fn render(s: &VfsStatus) -> String {
    let mut e = Exposition(String::new());
    fuse_families(&mut e);
    bucket_requests(&mut e, s);
    for Scalar(name, counter, help, v) in scalars(s) {
        e.one(name, if counter { "counter" } else { "gauge" }, help, v);
    }
    e.0
}

/// FUSE requests: latency histograms by kind, database round trips, errors by errno.
fn fuse_families(e: &mut Exposition) {
    let name = "fuse_request_duration_seconds";
    e.family(
        name,
        "histogram",
        "Time the daemon spent on FUSE requests, by kind.",
    );
    let bounds = deskfs_fuse::stats::LATENCY_BOUNDS_NS;
    for (op, buckets, count, total_ns) in deskfs_fuse::stats::histograms() {
        let mut cumulative = 0;
        for (le_ns, n) in bounds.iter().zip(buckets) {
            cumulative += n;
            let le = format!("{}", *le_ns as f64 / 1e9);
            e.sample(
                &format!("{name}_bucket"),
                &[("op", op), ("le", &le)],
                cumulative as f64,
            );
        }
        e.sample(
            &format!("{name}_bucket"),
            &[("op", op), ("le", "+Inf")],
            count as f64,
        );
        e.sample(&format!("{name}_sum"), &[("op", op)], total_ns as f64 / 1e9);
        e.sample(&format!("{name}_count"), &[("op", op)], count as f64);
    }
    let name = "fuse_request_round_trips_total";
    e.family(
        name,
        "counter",
        "Metadata database round trips FUSE requests waited for, by kind.",
    );
    for st in deskfs_fuse::stats::snapshot() {
        e.sample(name, &[("op", st.op)], st.round_trips as f64);
    }
    let name = "fuse_errors_total";
    e.family(
        name,
        "counter",
        "FUSE requests answered with an error, by errno.",
    );
    for (errno, n) in deskfs_fuse::stats::errors() {
        e.sample(name, &[("errno", &errno_name(errno))], n as f64);
    }
}

/// A family of one unlabelled sample: its name (after `deskfs_`), whether it is a
/// counter (else a gauge), its help line and its value.
struct Scalar(&'static str, bool, &'static str, f64);

/// A counter.
fn c(name: &'static str, help: &'static str, v: u64) -> Scalar {
    Scalar(name, true, help, v as f64)
}

/// A gauge.
fn g(name: &'static str, help: &'static str, v: f64) -> Scalar {
    Scalar(name, false, help, v)
}

/// The status's unlabelled figures: cache, bucket, buffers, dirty data and uploads, the
/// metadata database, locks and coherence with other mounts.
fn scalars(s: &VfsStatus) -> Vec<Scalar> {
    let b = &s.buffers;
    let e = &s.engine;
    let mut v = vec![
        g(
            "cache_block_bytes",
            "Bytes of bucket blocks in the block cache.",
            s.cache_block_bytes as f64,
        ),
        g(
            "cache_clean_bytes",
            "Bytes of clean local copies of uploaded files.",
            s.cache_clean_bytes as f64,
        ),
        g(
            "cache_capacity_bytes",
            "The cap on evictable cached data (--cache-size).",
            s.cache_capacity as f64,
        ),
        c(
            "cache_block_hits_total",
            "Blocks of bucket files readers got from this cache.",
            s.block_hits,
        ),
        c(
            "cache_block_misses_total",
            "Blocks readers waited for from the bucket.",
            s.block_misses,
        ),
        c(
            "cache_space_evictions_total",
            "Evictions for lack of disk space.",
            s.cache_space_evictions,
        ),
        c(
            "cache_fills_total",
            "Files read whole that became local copies.",
            s.cache_fills,
        ),
        c(
            "cache_fill_bytes_total",
            "Bytes of those local copies.",
            s.cache_fill_bytes,
        ),
        c(
            "bucket_fetched_bytes_total",
            "Bytes block fetches brought from the bucket.",
            s.block_fetched_bytes,
        ),
        c(
            "bucket_read_retries_total",
            "Bucket reads tried again after a transient failure.",
            s.bucket_reads.retried,
        ),
        c(
            "bucket_read_failures_total",
            "Bucket reads that failed after their last try.",
            s.bucket_reads.failed,
        ),
        g(
            "buffer_held_bytes",
            "Memory held by block fetches and upload buffers.",
            b.held_bytes as f64,
        ),
        g(
            "buffer_limit_bytes",
            "Budget of that memory (--buffer-memory).",
            b.limit_bytes as f64,
        ),
        c(
            "buffer_waits_total",
            "Fetches and uploads that waited for buffer memory.",
            b.waits,
        ),
        c(
            "readahead_skipped_total",
            "Readahead skipped for lack of buffer memory.",
            b.readahead_skipped,
        ),
        c(
            "passthrough_opens_total",
            "Opens served through FUSE passthrough.",
            s.passthrough_opens,
        ),
        g(
            "dirty_files",
            "Files with content not yet uploaded.",
            s.dirty_files as f64,
        ),
        g("dirty_bytes", "Bytes of those files.", s.dirty_bytes as f64),
        g(
            "uploads_pending",
            "Paths queued for upload.",
            s.pending_uploads as f64,
        ),
        g(
            "uploads_failing",
            "Queued uploads whose last attempt failed.",
            s.failing_uploads as f64,
        ),
        g(
            "open_files",
            "Files open through this mount.",
            s.open_files as f64,
        ),
        g(
            "kernel_inodes",
            "Inodes the kernel holds references to.",
            s.kernel_inodes as f64,
        ),
        g(
            "kept_orphans",
            "Unlinked files kept while open.",
            s.kept_orphans as f64,
        ),
        c(
            "data_flushes_total",
            "Device flushes of staging files (fsync, fdatasync).",
            s.data_flushes,
        ),
        g(
            "bucket_marker_missing",
            "1 while the bucket lacks this workspace's format record.",
            f64::from(u8::from(s.bucket_marker_missing)),
        ),
        c(
            "meta_round_trips_total",
            "Metadata database round trips.",
            e.round_trips,
        ),
        c(
            "meta_commits_total",
            "Metadata transactions committed.",
            e.commits,
        ),
        c(
            "meta_retries_total",
            "Metadata transactions run again (serialization, busy).",
            e.retries,
        ),
        c(
            "meta_errors_total",
            "Metadata transactions that failed.",
            e.errors,
        ),
        c(
            "meta_flushes_total",
            "Device flushes of the metadata log.",
            s.meta_flushes,
        ),
        c(
            "lock_waits_total",
            "Blocking lock requests that had to wait.",
            s.lock_waits,
        ),
        g(
            "lock_waiting",
            "Blocking lock requests waiting now.",
            s.lock_waiting as f64,
        ),
        c(
            "fences_total",
            "Times this mount lost its session lease.",
            s.fences.count,
        ),
    ];
    if let Some(ms) = s.feed_lag_ms {
        v.push(g(
            "feed_lag_seconds",
            "With other mounts live: time since the change feed was last read to its end.",
            ms as f64 / 1000.0,
        ));
    }
    v
}

/// Bucket requests by kind and answer.
fn bucket_requests(e: &mut Exposition, s: &VfsStatus) {
    let name = "bucket_requests_total";
    e.family(
        name,
        "counter",
        "Requests to the bucket by kind and answer (HTTP status, or error: no answer).",
    );
    for r in &s.bucket_requests {
        e.sample(
            name,
            &[("kind", r.kind), ("status", &r.status)],
            r.count as f64,
        );
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_families_typed() {
        let mut e = Exposition(String::new());
        e.family("x_total", "counter", "An example.");
        e.sample("x_total", &[("path", "a\"b\\c\nd")], 2.0);
        assert_eq!(
            e.0,
            "# HELP deskfs_x_total An example.\n# TYPE deskfs_x_total counter\ndeskfs_x_total{path=\"a\\\"b\\\\c\\nd\"} 2\n"
        );
    }
}
