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
    cache_families(&mut e, s);
    upload_families(&mut e, s);
    meta_families(&mut e, s);
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
        let label = format!("{:?}", nix::errno::Errno::from_raw(errno));
        e.sample(name, &[("errno", &label)], n as f64);
    }
}

/// The cache dir: bytes held, hits and misses of readers, evictions, fills.
fn cache_families(e: &mut Exposition, s: &VfsStatus) {
    let g = |v: u64| v as f64;
    e.one(
        "cache_block_bytes",
        "gauge",
        "Bytes of bucket blocks in the block cache.",
        g(s.cache_block_bytes),
    );
    e.one(
        "cache_clean_bytes",
        "gauge",
        "Bytes of clean local copies of uploaded files.",
        g(s.cache_clean_bytes),
    );
    e.one(
        "cache_capacity_bytes",
        "gauge",
        "The cache's cap on evictable data (--cache-size).",
        g(s.cache_capacity),
    );
    e.one(
        "cache_block_hits_total",
        "counter",
        "Blocks of bucket-backed files readers got from this cache.",
        g(s.block_hits),
    );
    e.one(
        "cache_block_misses_total",
        "counter",
        "Blocks readers waited for from the bucket.",
        g(s.block_misses),
    );
    e.one(
        "cache_space_evictions_total",
        "counter",
        "Cached data evicted because the cache dir's disk ran short of space.",
        g(s.cache_space_evictions),
    );
    e.one(
        "cache_fills_total",
        "counter",
        "Files read whole from the bucket that became local copies.",
        g(s.cache_fills),
    );
    e.one(
        "cache_fill_bytes_total",
        "counter",
        "Bytes of those local copies.",
        g(s.cache_fill_bytes),
    );
    e.one(
        "bucket_fetched_bytes_total",
        "counter",
        "Bytes block fetches brought from the bucket (readers' and readahead's).",
        g(s.block_fetched_bytes),
    );
    e.one(
        "bucket_read_retries_total",
        "counter",
        "Bucket reads (GET, HEAD, LIST) tried again after a transient failure.",
        g(s.bucket_reads.retried),
    );
    e.one(
        "bucket_read_failures_total",
        "counter",
        "Bucket reads that failed after their last try.",
        g(s.bucket_reads.failed),
    );
    e.one(
        "buffer_held_bytes",
        "gauge",
        "Memory held by block fetches and upload buffers.",
        g(s.buffers.held_bytes),
    );
    e.one(
        "buffer_limit_bytes",
        "gauge",
        "Budget of that memory (--buffer-memory).",
        g(s.buffers.limit_bytes),
    );
    e.one(
        "buffer_waits_total",
        "counter",
        "Fetches and uploads that waited for buffer memory.",
        g(s.buffers.waits),
    );
    e.one(
        "readahead_skipped_total",
        "counter",
        "Readahead fetches skipped for lack of buffer memory.",
        g(s.buffers.readahead_skipped),
    );
    e.one(
        "passthrough_opens_total",
        "counter",
        "Opens served through FUSE passthrough.",
        g(s.passthrough_opens),
    );
}

/// Dirty data and the upload queue.
fn upload_families(e: &mut Exposition, s: &VfsStatus) {
    let g = |v: u64| v as f64;
    e.one(
        "dirty_files",
        "gauge",
        "Files with content not yet uploaded.",
        g(s.dirty_files),
    );
    e.one(
        "dirty_bytes",
        "gauge",
        "Bytes of those files.",
        g(s.dirty_bytes),
    );
    e.one(
        "uploads_pending",
        "gauge",
        "Paths queued for upload.",
        g(s.pending_uploads),
    );
    e.one(
        "uploads_failing",
        "gauge",
        "Queued uploads whose last attempt failed.",
        g(s.failing_uploads),
    );
    e.one(
        "open_files",
        "gauge",
        "Files open through this mount.",
        s.open_files as f64,
    );
    e.one(
        "kernel_inodes",
        "gauge",
        "Inodes the kernel holds references to.",
        s.kernel_inodes as f64,
    );
    e.one(
        "kept_orphans",
        "gauge",
        "Unlinked files kept while open.",
        s.kept_orphans as f64,
    );
    e.one(
        "data_flushes_total",
        "counter",
        "Device flushes of staging files (fsync, fdatasync).",
        g(s.data_flushes),
    );
    e.one(
        "bucket_marker_missing",
        "gauge",
        "1 while the bucket lacks this workspace's format record (deletions in listings are not applied).",
        if s.bucket_marker_missing { 1.0 } else { 0.0 },
    );
}

/// The metadata database, locks and coherence with other mounts.
fn meta_families(e: &mut Exposition, s: &VfsStatus) {
    let g = |v: u64| v as f64;
    e.one(
        "meta_round_trips_total",
        "counter",
        "Metadata database round trips.",
        g(s.engine.round_trips),
    );
    e.one(
        "meta_commits_total",
        "counter",
        "Metadata transactions committed.",
        g(s.engine.commits),
    );
    e.one(
        "meta_retries_total",
        "counter",
        "Metadata transactions run again after a serialization failure or busy database.",
        g(s.engine.retries),
    );
    e.one(
        "meta_errors_total",
        "counter",
        "Metadata transactions that failed.",
        g(s.engine.errors),
    );
    e.one(
        "meta_flushes_total",
        "counter",
        "Device flushes of the metadata log.",
        g(s.meta_flushes),
    );
    e.one(
        "lock_waits_total",
        "counter",
        "Blocking lock requests that had to wait.",
        g(s.lock_waits),
    );
    e.one(
        "lock_waiting",
        "gauge",
        "Blocking lock requests waiting now.",
        g(s.lock_waiting),
    );
    e.one(
        "fences_total",
        "counter",
        "Times this mount lost its session lease.",
        g(s.fences.count),
    );
    if let Some(ms) = s.feed_lag_ms {
        e.one(
            "feed_lag_seconds",
            "gauge",
            "While other mounts are live: time since this mount last read the change feed to its end.",
            ms as f64 / 1000.0,
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
