//! `deskfs attach NAME --bucket URL`: a SQLite workspace rebuilt on this machine from its
//! bucket (the metadata backup plus the objects), e.g. after the machine that held it
//! was lost. Refused while the workspace's lease says another machine has it mounted,
//! unless `--take-over`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use deskfs_backup::now_ns;
use deskfs_backup::restore::{self, RestoreReport};
use deskfs_backup::{lease, BackupError};
use deskfs_bucket::BucketSpec;
use deskfs_meta::MetaEngine;

use crate::format::{bucket_workspace, open_bucket, AttachArgs};
use crate::home::{check_name, ws_dir, WorkspaceConfig};
use crate::metadb::{MetaUrl, Record};

/// How many lost paths are printed (all are in `attach-report.json`).
const SHOWN: usize = 20;

/// Runs `deskfs attach NAME --bucket URL`.
pub fn from_bucket(a: AttachArgs) -> Result<()> {
    check_name(&a.name)?;
    let Some(url) = &a.bucket else {
        bail!("attach needs --bucket URL (rebuild a workspace on this machine from its bucket) or --meta postgres://… (join a workspace shared through PostgreSQL)");
    };
    let dir = ws_dir(&a.name);
    if dir.join("workspace.toml").exists() {
        bail!(
            "workspace {:?} already exists on this machine ({}); mount it with `deskfs mount {} MOUNTPOINT`, or attach under another name",
            a.name,
            dir.display(),
            a.name
        );
    }
    if a.access_key.is_some() != a.secret_key.is_some() {
        bail!("--access-key and --secret-key must be given together");
    }
    let mut spec = BucketSpec::parse(url)?;
    spec.endpoint = a.endpoint.clone();
    spec.region = a.region.clone();
    spec.access_key = a.access_key.clone();
    spec.secret_key = a.secret_key.clone();
    crate::format::check_bucket_place(&a.name, &spec)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let bucket = open_bucket(&spec, &rt, false)?;
    let record = bucket_workspace(&bucket, &rt)?.ok_or_else(|| {
        anyhow!(
            "bucket {} holds no deskfs workspace; create one with `deskfs format {} --bucket {}`",
            spec.url,
            a.name,
            spec.url
        )
    })?;
    if record.is_postgres() {
        bail!("the workspace in bucket {} keeps its metadata in PostgreSQL; join it with `deskfs attach {} --meta postgres://…`", spec.url, a.name);
    }
    let id = record.id.unwrap_or_default();
    // Refuse early (nothing created yet) while another machine has it mounted.
    let now = now_ns();
    if let Some(l) = rt.block_on(lease::read(&bucket))? {
        if l.record.live(now) && !a.take_over {
            bail!(
                "workspace in bucket {} is mounted on {}; unmount it there first, or, if that machine is dead, add --take-over",
                spec.url,
                l.record.holder(now)
            );
        }
    }
    let created_dir = !dir.exists();
    let res = rebuild(&a, &spec, &bucket, &rt, &id);
    if res.is_err() && created_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    res
}

fn rebuild(
    a: &AttachArgs,
    spec: &BucketSpec,
    bucket: &deskfs_bucket::Bucket,
    rt: &tokio::runtime::Runtime,
    id: &str,
) -> Result<()> {
    let dir = ws_dir(&a.name);
    let meta_url = MetaUrl::parse(&format!("sqlite://{}", dir.join("meta.db").display()))?;
    let record = Record {
        name: a.name.clone(),
        id: id.to_string(),
        bucket: spec.url.clone(),
        endpoint: a.endpoint.clone(),
        region: a.region.clone(),
    };
    let summary = fill_from_bucket(&meta_url, &record, bucket, rt, a.take_over, false)?;
    let cfg = WorkspaceConfig {
        name: a.name.clone(),
        bucket: spec.url.clone(),
        meta: meta_url.stored(),
        endpoint: a.endpoint.clone(),
        region: a.region.clone(),
        access_key: a.access_key.clone(),
        secret_key: a.secret_key.clone(),
        created: (now_ns() / 1_000_000_000) as u64,
    };
    cfg.save()?;
    println!(
        "attached workspace {} from bucket {}: {summary}",
        a.name, spec.url
    );
    println!(
        "mount it with `deskfs mount {} MOUNTPOINT` (report: {})",
        a.name,
        dir.join("attach-report.json").display()
    );
    Ok(())
}

/// Creates the SQLite database `meta_url` (which must not exist), writes `record` into
/// it, fills it from the bucket — the newest usable metadata backup checked against the
/// objects, or (none usable, or `ignore_backup`) the objects alone —, writes the report
/// to `attach-report.json` beside it and takes the workspace lease for it (refused while
/// another machine's mount holds it live, unless `take_over`). Returns a one-line summary.
pub(crate) fn fill_from_bucket(
    meta_url: &MetaUrl,
    record: &Record,
    bucket: &deskfs_bucket::Bucket,
    rt: &tokio::runtime::Runtime,
    take_over: bool,
    ignore_backup: bool,
) -> Result<String> {
    if meta_url.open_raw().is_ok() {
        bail!(
            "{} already exists; move it away (it may be this workspace's old database) and retry",
            meta_url.display()
        );
    }
    let report_path = meta_url
        .sqlite_path()
        .and_then(|p| p.parent())
        .map(|d| d.join("attach-report.json"))
        .ok_or_else(|| anyhow!("{} is not a SQLite database", meta_url.display()))?;
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let meta: Arc<dyn MetaEngine> = meta_url.create(uid, gid, now_ns())?;
    record.write(&*meta)?;
    let pb = crate::daemon::spinner("reading the metadata backup");
    let mut report = RestoreReport::default();
    let loaded = if ignore_backup {
        Err(BackupError::NoBackup(
            "the backup was not used (--ignore-backup)".into(),
        ))
    } else {
        rt.block_on(restore::load_newest(bucket, &mut report))
    };
    let summary = match loaded {
        Ok(model) => {
            pb.set_message("checking the backup against the bucket's objects");
            let r = restore::restore_into(&meta, bucket, rt.handle(), model, report)?;
            std::fs::write(&report_path, serde_json::to_vec_pretty(&r)?)?;
            summarize(&r)
        }
        Err(BackupError::NoBackup(why)) => {
            pb.set_message("no backup: rebuilding from the objects");
            let r = deskfs_backup::rebuild::rebuild_into(&meta, bucket, rt.handle(), uid, gid)?;
            std::fs::write(&report_path, serde_json::to_vec_pretty(&r)?)?;
            format!(
                "{why}: rebuilt from the objects alone ({} files, {} dirs, {} symlinks; {} objects without POSIX attributes got defaults; {} escaped names unknown). Not knowable without a backup: {}",
                r.files,
                r.dirs,
                r.symlinks,
                r.without_attributes,
                r.escaped_unnamed,
                r.unknowable.join("; ")
            )
        }
        Err(e) => return Err(e.into()),
    };
    pb.finish_and_clear();
    let db = lease::db_id(&*meta)?;
    rt.block_on(lease::take_for_attach(bucket, &record.id, &db, take_over))
        .context("cannot take the workspace lease")?;
    Ok(summary)
}

fn summarize(r: &RestoreReport) -> String {
    let age = (now_ns() - r.backup_time_ns).max(0) / 1_000_000_000;
    let mut s = format!(
        "backup generation {} (+{} deltas, written {age} s ago): {} files, {} dirs, {} symlinks, {} other, {} hard-linked, {} with xattrs",
        r.generation, r.deltas, r.files, r.dirs, r.symlinks, r.others, r.hard_links, r.with_xattrs
    );
    if !r.newer_in_bucket.is_empty() {
        s.push_str(&format!(
            "; {} file(s) newer in the bucket than the backup (taken)",
            r.newer_in_bucket.len()
        ));
    }
    if r.unknown_objects > 0 {
        s.push_str(&format!(
            "; {} object(s) the backup does not know (they appear as files)",
            r.unknown_objects
        ));
    }
    if !r.older_content.is_empty() {
        s.push_str(&format!(
            "; {} file(s) restored with an older version (their newest writes never reached the bucket): {}",
            r.older_content.len(),
            shown(&r.older_content)
        ));
    }
    if !r.lost.is_empty() {
        s.push_str(&format!(
            "; LOST {} file(s) whose content is not in the bucket (never uploaded, or deleted after the backup): {}",
            r.lost.len(),
            shown(&r.lost)
        ));
    }
    for p in &r.problems {
        s.push_str(&format!("; note: {p}"));
    }
    s
}

fn shown(v: &[String]) -> String {
    let mut s = v.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if v.len() > SHOWN {
        s.push_str(&format!(", … ({} more)", v.len() - SHOWN));
    }
    s
}
