//! `deskfs fsck`: offline check and repair of a workspace.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use deskfs_cache::Cache;
use deskfs_meta::sqlite::SqliteEngine;
use deskfs_vfs::fsck::{fsck, FsckOptions};

use crate::home::{mounts_of, ws_dir, WorkspaceConfig};

/// Arguments of `deskfs fsck`.
#[derive(Args, Debug)]
pub struct FsckArgs {
    /// Workspace name.
    pub name: String,
    /// Repair what can be repaired (link counts, dangling entries, orphans, stray staging
    /// files, upload queue).
    #[arg(long)]
    pub repair: bool,
    /// Also check every recorded object of a clean file in the bucket (one HEAD each).
    #[arg(long)]
    pub check_bucket: bool,
    /// Cache directory to check (default: the one the workspace was last mounted with).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// Runs `deskfs fsck`.
pub fn run(a: FsckArgs) -> Result<()> {
    let cfg = WorkspaceConfig::load(&a.name)?;
    if let Some(m) = mounts_of(&a.name).first() {
        bail!(
            "workspace {} is mounted at {} (pid {}); unmount it first (deskfs umount {})",
            a.name,
            m.mountpoint.display(),
            m.pid,
            m.mountpoint.display()
        );
    }
    let url = crate::metadb::MetaUrl::parse(&cfg.meta)?;
    let meta = url.open()?;
    let pb = indicatif::ProgressBar::new_spinner();
    pb.enable_steady_tick(Duration::from_millis(120));
    let integrity = match url.sqlite_path() {
        Some(db) => {
            pb.set_message("SQLite integrity check");
            SqliteEngine::open(db)?.integrity_check()?
        }
        // PostgreSQL checks its own pages (checksums, WAL); deskfs checks the namespace.
        None => Vec::new(),
    };
    // Without --cache-dir: the default one (or, for workspaces from before cache ids,
    // the one recorded).
    let recorded = deskfs_meta::read(&*meta, |t| t.get_kv("cache_dir"))?;
    let cache_dir = a
        .cache_dir
        .clone()
        .map(|p| crate::absolute(&p))
        .or(recorded.map(PathBuf::from))
        .unwrap_or_else(|| ws_dir(&a.name).join("cache"));
    let cache = Cache::open(&cache_dir, u64::MAX, deskfs_cache::DEFAULT_BLOCK_SIZE)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let bucket = if a.check_bucket {
        Some(deskfs_bucket::Bucket::open(&cfg.bucket_spec()?, false)?)
    } else {
        None
    };
    let handle = rt.handle().clone();
    let bref = bucket.as_ref().map(|b| (b, &handle));
    let progress = |s: &str| pb.set_message(s.to_string());
    let mut report = fsck(
        &*meta,
        &cache,
        bref,
        FsckOptions {
            repair: a.repair,
            check_bucket: a.check_bucket,
        },
        &progress,
    )?;
    pb.finish_and_clear();
    for line in &integrity {
        report.problems.push(deskfs_vfs::fsck::Problem {
            kind: "sqlite-integrity",
            detail: line.clone(),
            repaired: false,
        });
    }
    let remaining = report.unrepaired();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for n in &report.notes {
            let tag = if n.repaired { "settled " } else { "note    " };
            println!(
                "{tag} [{}] {} (crash leftover; the next mount settles it)",
                n.kind, n.detail
            );
        }
        for p in &report.problems {
            let tag = if p.repaired { "repaired" } else { "PROBLEM " };
            println!("{tag} [{}] {}", p.kind, p.detail);
        }
        println!(
            "fsck {}: {} inodes, {} entries, {} objects checked; {} problems ({} repaired, {} remaining)",
            a.name,
            report.inodes,
            report.dentries,
            report.objects_checked,
            report.problems.len(),
            report.problems.len() - remaining,
            remaining
        );
    }
    if remaining > 0 {
        std::process::exit(1);
    }
    Ok(())
}
