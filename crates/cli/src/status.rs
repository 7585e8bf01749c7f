//! `deskfs status`: workspaces, mounts, cache, dirty data, pending and failing uploads.

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use serde_json::{json, Value};

use crate::home::{list_workspaces, mounts_of, WorkspaceConfig};

/// Arguments of `deskfs status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Workspace name (default: all).
    pub name: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// The status of workspace `name` (what `deskfs status --json NAME` prints).
pub(crate) fn workspace_status(name: &str) -> Result<Value> {
    let cfg = WorkspaceConfig::load(name)?;
    let mounts = mounts_of(name);
    let mut mount_values = Vec::new();
    for m in &mounts {
        let live = crate::control::request(
            &m.socket,
            json!({"cmd": "status"}),
            Some(Duration::from_secs(10)),
        )
        .ok()
        .and_then(|v| v.get("status").cloned());
        mount_values.push(json!({
            "pid": m.pid,
            "mountpoint": m.mountpoint,
            "cache_dir": m.cache_dir,
            "durability": live.as_ref().and_then(|l| l.get("durability")).cloned(),
            "log": m.log,
            "live": live,
        }));
    }
    let meta = crate::metadb::MetaUrl::parse(&cfg.meta)?.open()?;
    let (usage, pending, failed, conflicts) = deskfs_meta::read(&*meta, |t| {
        Ok::<_, deskfs_meta::MetaError>((
            t.usage()?,
            t.pending_stats()?,
            t.failed_pending(10)?,
            deskfs_vfs::external::bucket_conflicts(t)?,
        ))
    })?;
    let backup = backup_status(&cfg, &*meta)?;
    let failures: Vec<Value> = failed
        .into_iter()
        .map(|f| {
            json!({
                "path": String::from_utf8_lossy(&f.path),
                "attempts": f.attempts,
                "error": f.last_error,
            })
        })
        .collect();
    let cache = mount_values
        .first()
        .and_then(|m| m.get("live"))
        .map(|l| {
            json!({
                "block_bytes": l.get("cache_block_bytes"),
                "clean_bytes": l.get("cache_clean_bytes"),
                "capacity": l.get("cache_capacity"),
                "space_short": l.get("cache_space_short"),
                "space_evictions": l.get("cache_space_evictions"),
                "reserve_files": l.get("cache_reserve_files"),
                "fills": l.get("cache_fills"),
                "fill_bytes": l.get("cache_fill_bytes"),
                "fills_adopted": l.get("cache_fills_adopted"),
            })
        })
        .unwrap_or(Value::Null);
    Ok(json!({
        "workspace": name,
        "bucket": cfg.bucket,
        "meta": cfg.meta,
        "mounts": mount_values,
        "inodes": usage.inodes,
        "bytes": usage.bytes,
        "dirty_files": usage.dirty_inodes,
        "dirty_bytes": usage.dirty_bytes,
        "pending_uploads": pending.pending,
        "failing_uploads": pending.failing,
        "failures": failures,
        "bucket_conflicts": conflicts,
        "cache": cache,
        "backup": backup,
    }))
}

/// The metadata backup's position (SQLite workspaces): generation, the change mark the
/// bucket's backup is at, how many changes are not in it yet, when it was last written;
/// a mount's keeper adds its last error and whether it lost the workspace lease.
fn backup_status(cfg: &WorkspaceConfig, meta: &dyn deskfs_meta::MetaEngine) -> Result<Value> {
    if crate::metadb::MetaUrl::parse(&cfg.meta)?
        .sqlite_path()
        .is_none()
    {
        return Ok(
            json!({"kind": "database", "note": "the PostgreSQL database is the namespace's durable home"}),
        );
    }
    let (st, end) = deskfs_meta::read(meta, |t| {
        Ok::<_, deskfs_meta::MetaError>((
            deskfs_backup::writer::BackupState::read(t)?,
            t.backup_mark_end()?,
        ))
    })?;
    Ok(json!({
        "kind": "bucket",
        "generation": st.generation,
        "seq": st.seq,
        "changes_not_backed_up": end.saturating_sub(st.seq),
        "deltas": st.deltas,
        "delta_bytes": st.delta_bytes,
        "snapshot_bytes": st.snapshot_bytes,
        "last_written_ns": st.last_ns,
    }))
}

fn human(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// "12.0 MiB of 128.0 MiB held by fetches and uploads (peak 128.0 MiB); 31 waited for
/// room, 2,040 readahead fetches skipped" from a daemon's buffer budget.
fn buffers_line(b: Option<&Value>) -> Option<String> {
    let b = b?;
    let n = |k: &str| b.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut s = format!(
        "{} of {} held by block fetches and uploads (peak {})",
        human(n("held_bytes")),
        human(n("limit_bytes")),
        human(n("peak_bytes"))
    );
    if n("waits") + n("readahead_skipped") > 0 {
        s.push_str(&format!(
            "; {} waited for room, {} readahead fetches skipped",
            n("waits"),
            n("readahead_skipped")
        ));
    }
    Some(s)
}

/// "12 tried again after a transient failure, 1 failed after 5 tries" from a daemon's
/// bucket read counters, or `None` while every read succeeded at its first try.
fn bucket_reads_line(v: Option<&Value>) -> Option<String> {
    let n = |k: &str| {
        v.and_then(|v| v.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (retried, failed) = (n("retried"), n("failed"));
    (retried + failed > 0).then(|| {
        format!(
            "{retried} tried again after a transient failure, {failed} failed after {} tries (the error reached the reader)",
            deskfs_bucket::read_retry::READ_ATTEMPTS
        )
    })
}

/// "session 7, other hosts live; database: 1,234 round trips, 2 retries; fenced 1 time
/// (last 5 min ago), 1 conflict copy" from a daemon's status.
/// One line per expired mount session whose open files are held for it (design record
/// 0018): who it was, how long ago it expired, when the hold ends.
fn held_lines(l: &Value) -> Vec<String> {
    let now = deskfs_vfs::now_ns();
    l.get("held_sessions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|h| {
                    let n = |k: &str| h.get(k).and_then(Value::as_i64).unwrap_or(0);
                    let ago = now.saturating_sub(n("since_ns")).max(0) / 1_000_000_000;
                    let release = match n("release_in_s") {
                        s if s <= 0 => "released at the next heartbeat".to_string(),
                        s => format!("released in {} unless it comes back", secs_text(s)),
                    };
                    format!(
                        "session {} (pid {} on {}) expired {} ago, paused or cut off: its open files are kept for it, {release}",
                        n("session"),
                        n("pid"),
                        h.get("host").and_then(Value::as_str).unwrap_or("?"),
                        secs_text(ago),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `s` seconds as `3 s`, `4 min 2 s`, `23 h 59 min`.
fn secs_text(s: i64) -> String {
    match s {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {} s", s / 60, s % 60),
        s => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

fn sharing_line(l: &Value) -> Option<String> {
    let session = l.get("session")?.as_u64()?;
    let peers = match l.get("peers")?.as_str()? {
        "Alone" => "alone",
        "SameHost" => "other mounts on this host live",
        _ => "mounts on other hosts live",
    };
    let e = l.get("engine")?;
    let n = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut s = format!(
        "session {session}, {peers}; database: {} round trips, {} retries, {} refused batches",
        n("round_trips"),
        n("retries"),
        n("preconditions")
    );
    if n("window_commits") + n("windowed") + n("replayed") > 0 {
        s.push_str(&format!(
            "; commit windows: {} requests in {} commits, {} redo bytes open, {} fsyncs from the redo log ({} of them covered by an earlier flush), {} replayed",
            n("windowed"),
            n("window_commits"),
            n("redo_bytes"),
            n("redo_flushes"),
            n("redo_flushes_covered"),
            n("replayed")
        ));
    }
    let f = l.get("fences")?;
    let count = f.get("count").and_then(Value::as_u64).unwrap_or(0);
    if count > 0 {
        let ago = f
            .get("last")
            .and_then(|v| v.get(1))
            .and_then(Value::as_i64)
            .map(|t| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as i64)
                    .unwrap_or(0);
                (now - t) / 1_000_000_000
            })
            .unwrap_or(0);
        s.push_str(&format!(
            "; FENCED {count} time(s) (lease lost, last {ago} s ago; locks held then were released), {} conflict cop(ies)",
            f.get("conflicts").and_then(Value::as_u64).unwrap_or(0)
        ));
    }
    Some(s)
}

/// Runs `deskfs status`.
/// "N served; most time in: write 12,903 x 45 us, ..." from a daemon's request table
/// (`[{op, count, total_ns}]`); `None` when there is none.
fn requests_line(v: Option<&Value>) -> Option<String> {
    let rows = v?.as_array()?;
    let mut rows: Vec<(&str, u64, u64)> = rows
        .iter()
        .filter_map(|r| {
            Some((
                r.get("op")?.as_str()?,
                r.get("count")?.as_u64()?,
                r.get("total_ns")?.as_u64()?,
            ))
        })
        .filter(|r| r.1 > 0)
        .collect();
    let total: u64 = rows.iter().map(|r| r.1).sum();
    if total == 0 {
        return None;
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.2));
    let top: Vec<String> = rows
        .iter()
        .take(5)
        .map(|(op, n, ns)| format!("{op} {n} x {} us", ns / n / 1000))
        .collect();
    Some(format!("{total} served; most time in: {}", top.join(", ")))
}

pub fn run(a: StatusArgs) -> Result<()> {
    let names = match &a.name {
        Some(n) => vec![n.clone()],
        None => list_workspaces()?,
    };
    let mut all = Vec::new();
    for n in &names {
        all.push(workspace_status(n)?);
    }
    if a.json {
        let out = if a.name.is_some() {
            all.into_iter().next().unwrap_or(Value::Null)
        } else {
            json!({"workspaces": all})
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if all.is_empty() {
        println!("no workspaces (create one with `deskfs format NAME`)");
    }
    for w in &all {
        let g = |k: &str| w.get(k).and_then(Value::as_u64).unwrap_or(0);
        println!("workspace {}", w["workspace"].as_str().unwrap_or("?"));
        println!("  bucket        {}", w["bucket"].as_str().unwrap_or("?"));
        println!("  metadata      {}", w["meta"].as_str().unwrap_or("?"));
        let mounts = w["mounts"].as_array().cloned().unwrap_or_default();
        if mounts.is_empty() {
            println!("  mounts        (not mounted)");
        }
        for m in &mounts {
            println!(
                "  mount         {} (pid {}, cache {})",
                m["mountpoint"].as_str().unwrap_or("?"),
                m["pid"],
                m["cache_dir"].as_str().unwrap_or("?")
            );
            if let Some(l) = m.get("live").filter(|l| !l.is_null()) {
                let lg = |k: &str| l.get(k).and_then(Value::as_u64).unwrap_or(0);
                match l.get("durability").and_then(Value::as_str) {
                    Some("bucket") => println!("  durability    bucket (close/fsync return once the data is in the bucket)"),
                    Some(d) => println!("  durability    {d} (close/fsync return once the data is on the local disk)"),
                    None => {}
                }
                println!(
                    "  cache         {} in blocks, {} clean copies, cap {}; {} open files; {} empty files ready for new ones",
                    human(lg("cache_block_bytes")),
                    human(lg("cache_clean_bytes")),
                    human(lg("cache_capacity")),
                    lg("open_files"),
                    lg("cache_reserve_files")
                );
                if lg("cache_space_short") > 0 || lg("cache_space_evictions") > 0 {
                    println!(
                        "  disk          {}{} found the cache dir's file system full and evicted clean data first",
                        match lg("cache_space_short") {
                            0 => String::new(),
                            n => format!("LOW ON SPACE: {} short of the free-space reserve (clean data is being evicted); ", human(n)),
                        },
                        match lg("cache_space_evictions") {
                            1 => "1 write".to_string(),
                            n => format!("{n} writes"),
                        }
                    );
                }
                if lg("cache_fills") > 0 || lg("cache_fills_adopted") > 0 {
                    println!(
                        "  whole reads   {} files ({}) being assembled for passthrough; {} made local so far",
                        lg("cache_fills"),
                        human(lg("cache_fill_bytes")),
                        lg("cache_fills_adopted")
                    );
                }
                if let Some(mode) = l.get("atime").and_then(Value::as_str) {
                    println!(
                        "  atime         {mode}: {} access times committed, {} queued",
                        lg("atime_committed"),
                        lg("atime_queued")
                    );
                }
                if let Some(line) = buffers_line(l.get("buffers")) {
                    println!("  memory        {line}");
                }
                if let Some(line) = bucket_reads_line(l.get("bucket_reads")) {
                    println!("  bucket reads  {line}");
                }
                if let Some(line) = requests_line(l.get("requests")) {
                    println!("  requests      {line}");
                }
                if let Some(line) = sharing_line(l) {
                    println!("  sharing       {line}");
                }
                for line in held_lines(l) {
                    println!("  held opens    {line}");
                }
                if let Some(ms) = l.get("uploads_held_ms").and_then(Value::as_u64) {
                    println!(
                        "  uploads held  {:.1} s so far by a burst of changes: due uploads wait for a quiet moment, at most {} s past due (the data is safe in the local journal)",
                        ms as f64 / 1000.0,
                        lg("burst_defer_ms") / 1000
                    );
                }
                match lg("background_relists") {
                    0 => {}
                    1 => println!("  listing       1 directory being refreshed from the bucket in the background"),
                    n => println!("  listing       {n} directories being refreshed from the bucket in the background"),
                }
                match lg("failed_relists") {
                    0 => {}
                    1 => println!("  listing       1 directory's last refresh from the bucket failed: its known entries are served, tried again after the listing TTL"),
                    n => println!("  listing       {n} directories' last refresh from the bucket failed: their known entries are served, tried again after the listing TTL"),
                }
                for wv in l["waiting_for"].as_array().cloned().unwrap_or_default() {
                    println!(
                        "  waiting       inode {} (version {}) waited {:.1} s so far for cache {} to upload it",
                        wv["ino"], wv["version"], wv["waited_s"].as_f64().unwrap_or(0.0), wv["holder"]
                    );
                }
            }
        }
        println!(
            "  files         {} inodes, {}",
            g("inodes"),
            human(g("bytes"))
        );
        println!(
            "  dirty         {} file(s), {} not yet in the bucket",
            g("dirty_files"),
            human(g("dirty_bytes"))
        );
        println!(
            "  uploads       {} pending, {} failing",
            g("pending_uploads"),
            g("failing_uploads")
        );
        if let Some(b) = w.get("backup").filter(|b| b["kind"] == "bucket") {
            let bg = |k: &str| b.get(k).and_then(Value::as_u64).unwrap_or(0);
            let age = b["last_written_ns"]
                .as_i64()
                .filter(|t| *t > 0)
                .map(|t| {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos() as i64)
                        .unwrap_or(0);
                    format!("written {} s ago", (now - t).max(0) / 1_000_000_000)
                })
                .unwrap_or_else(|| "never written".into());
            println!(
                "  backup        generation {}, {} change(s) not in the bucket yet, {age}; snapshot {} + {} delta(s) {}",
                bg("generation"),
                bg("changes_not_backed_up"),
                human(bg("snapshot_bytes")),
                bg("deltas"),
                human(bg("delta_bytes"))
            );
        }
        for m in &mounts {
            if let Some(k) = m.get("live").and_then(|l| l.get("backup")) {
                if let Some(e) = k["lease_lost"].as_str() {
                    println!("  backup        STOPPED: {e}");
                }
                if let Some(e) = k["last_error"].as_str() {
                    println!("  backup        failing: {e}");
                }
            }
        }
        let conflicts = w["bucket_conflicts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !conflicts.is_empty() {
            println!(
                "  conflicts     {} changed in the bucket while they had local writes (both kept):",
                conflicts.len()
            );
        }
        for c in conflicts {
            println!(
                "    conflict    {}: the bucket's version is kept as {}",
                c["path"].as_str().unwrap_or("?"),
                c["saved_as"].as_str().unwrap_or("?")
            );
        }
        for f in w["failures"].as_array().cloned().unwrap_or_default() {
            println!(
                "    failing     {} ({} attempts): {}",
                f["path"].as_str().unwrap_or("?"),
                f["attempts"],
                f["error"].as_str().unwrap_or("")
            );
        }
        for m in &mounts {
            let failed = m
                .get("live")
                .and_then(|l| l["flush_failures"].as_array().cloned())
                .unwrap_or_default();
            let foreign = m
                .get("live")
                .and_then(|l| l["bucket_marker_missing"].as_bool())
                .unwrap_or(false);
            if foreign {
                println!(
                    "  BUCKET NOT THIS WORKSPACE'S  {} holds no format record ({}) now: a disk not mounted at the bucket dir, or the bucket emptied or replaced? Objects missing from it are not taken as deleted; reads of files not cached here fail until the bucket is back",
                    w["bucket"].as_str().unwrap_or("the bucket"),
                    crate::format::FORMAT_RECORD
                );
            }
            for f in failed {
                println!(
                    "  FSYNC FAILED  {} (inode {}): {}; its data may be lost, every fsync of it fails with EIO until it is truncated to zero or removed ({} refused)",
                    f["path"].as_str().filter(|p| !p.is_empty()).unwrap_or("(no name)"),
                    f["ino"],
                    f["error"].as_str().unwrap_or(""),
                    f["refused"]
                );
            }
        }
    }
    Ok(())
}
