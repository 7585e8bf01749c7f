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
    /// Replace the metadata database with one rebuilt from the bucket: the newest usable
    /// metadata backup checked against the objects, or, with no usable backup, the objects
    /// and their s3fs-style attributes alone (what they cannot tell is reported). The old
    /// database is kept beside it as meta.db.before-rebuild-TIME.
    #[arg(long)]
    pub rebuild_from_bucket: bool,
    /// With --rebuild-from-bucket: ignore the metadata backup, use the objects alone.
    #[arg(long, requires = "rebuild_from_bucket")]
    pub ignore_backup: bool,
    /// With --rebuild-from-bucket: rebuild although the old database has files not yet
    /// uploaded (their local content is then lost) or cannot be read.
    #[arg(long, requires = "rebuild_from_bucket")]
    pub force: bool,
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
    if a.rebuild_from_bucket {
        return rebuild_from_bucket(&a, &cfg, &url);
    }
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
    let cache_dir = cache_dir_to_check(&a, &*meta)?;
    // Another workspace's cache dir names other inodes: checked (and repaired) against
    // this namespace it would look broken, and `--repair` would drop its files.
    crate::daemon::check_cache_owner(&cfg, &*meta, &cache_dir)?;
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
            let why = if n.kind == "other-cache" {
                ""
            } else {
                " (crash leftover; the next mount settles it)"
            };
            println!("{tag} [{}] {}{why}", n.kind, n.detail);
        }
        for p in &report.problems {
            let tag = if p.repaired { "repaired" } else { "PROBLEM " };
            println!("{tag} [{}] {}", p.kind, p.detail);
        }
        let objects = if a.check_bucket {
            format!("{} bucket objects checked", report.objects_checked)
        } else {
            "bucket not checked (--check-bucket)".to_string()
        };
        println!(
            "fsck {} (cache dir {}): {} inodes, {} entries, {objects}; {} problems ({} repaired, {} remaining)",
            a.name,
            cache_dir.display(),
            report.inodes,
            report.dentries,
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

/// The cache dir `fsck` checks: `--cache-dir`; else the one the workspace was last
/// mounted with on this host (see [`crate::daemon::last_cache_key`]) while it exists;
/// else, for workspaces from before cache ids, the one recorded; else the default one.
/// (Checked against the wrong one, every file whose content that cache holds would look
/// lost, and its real staging files would go unchecked.)
fn cache_dir_to_check(a: &FsckArgs, meta: &dyn deskfs_meta::MetaEngine) -> Result<PathBuf> {
    if let Some(p) = &a.cache_dir {
        return Ok(crate::absolute(p));
    }
    let last_key = crate::daemon::last_cache_key(&deskfs_vfs::hostname());
    let (last, legacy) = deskfs_meta::read(meta, |t| {
        Ok::<_, deskfs_meta::MetaError>((t.get_kv(&last_key)?, t.get_kv("cache_dir")?))
    })?;
    Ok(last
        .map(PathBuf::from)
        .filter(|p| p.join("cache-id").is_file())
        .or(legacy.map(PathBuf::from))
        .unwrap_or_else(|| ws_dir(&a.name).join("cache")))
}

/// `deskfs fsck NAME --rebuild-from-bucket`.
fn rebuild_from_bucket(
    a: &FsckArgs,
    cfg: &WorkspaceConfig,
    url: &crate::metadb::MetaUrl,
) -> Result<()> {
    let Some(db) = url.sqlite_path().cloned() else {
        bail!("--rebuild-from-bucket rebuilds a SQLite workspace; a PostgreSQL workspace's namespace lives in its database (restore that with PostgreSQL's own tools)");
    };
    // What the old database knows: its record, and whether it holds unuploaded files.
    let old = url.open();
    let (record, dirty) = match &old {
        Ok(m) => (
            crate::metadb::Record::read(&**m)?,
            deskfs_meta::read(&**m, |t| t.dirty_inodes())?.len(),
        ),
        Err(e) if !a.force => {
            bail!("cannot read the old database ({e}); add --force to rebuild without it")
        }
        Err(_) => (None, 0),
    };
    drop(old);
    if dirty > 0 && !a.force {
        bail!("the database records {dirty} file(s) whose content is not in the bucket yet; run `deskfs sync {}` first (or add --force to discard them)", a.name);
    }
    let spec = cfg.bucket_spec()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let bucket = crate::format::open_bucket(&spec, &rt, false)?;
    let id = match record
        .as_ref()
        .map(|r| r.id.clone())
        .filter(|i| !i.is_empty())
    {
        Some(id) => id,
        None => crate::format::bucket_workspace(&bucket, &rt)?
            .and_then(|v| v.id)
            .unwrap_or_default(),
    };
    let record = crate::metadb::Record {
        name: a.name.clone(),
        id,
        bucket: spec.url.clone(),
        endpoint: cfg.endpoint.clone(),
        region: cfg.region.clone(),
    };
    // Keep the old database (and its WAL) beside the new one.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let kept = PathBuf::from(format!("{}.before-rebuild-{stamp}", db.display()));
    let moves: Vec<(PathBuf, PathBuf)> = ["", "-wal", "-shm"]
        .iter()
        .map(|suffix| {
            (
                PathBuf::from(format!("{}{suffix}", db.display())),
                PathBuf::from(format!("{}{suffix}", kept.display())),
            )
        })
        .filter(|(from, _)| from.exists())
        .collect();
    for (from, to) in &moves {
        std::fs::rename(from, to)?;
    }
    match crate::attach::fill_from_bucket(url, &record, &bucket, &rt, false, a.ignore_backup) {
        Ok(summary) => {
            println!(
                "rebuilt workspace {} from bucket {}: {summary}",
                a.name, spec.url
            );
            println!("the old database is kept as {}", kept.display());
            Ok(())
        }
        Err(e) => {
            // Put the old database back: nothing half-done.
            let _ = std::fs::remove_file(&db);
            let _ = std::fs::remove_file(format!("{}-wal", db.display()));
            let _ = std::fs::remove_file(format!("{}-shm", db.display()));
            for (from, to) in &moves {
                let _ = std::fs::rename(to, from);
            }
            Err(e)
        }
    }
}
