//! `deskfs format`: creates a workspace (bucket format record, metadata database, config).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use deskfs_bucket::{Bucket, BucketSpec};

use crate::home::{check_name, ws_dir, WorkspaceConfig};

/// Arguments of `deskfs format`.
#[derive(Args, Debug)]
pub struct FormatArgs {
    /// Workspace name (letters, digits, '.', '_', '-').
    pub name: String,
    /// Bucket URL: s3://BUCKET[/PREFIX], gs://…, az://…, file:///DIR. Default: a local
    /// bucket directory inside the workspace's data dir.
    #[arg(long)]
    pub bucket: Option<String>,
    /// Metadata URL: sqlite:///ABSOLUTE/PATH.db. Default: meta.db in the workspace's data dir.
    #[arg(long)]
    pub meta: Option<String>,
    /// S3 endpoint URL for S3-compatible servers (path-style requests), e.g. http://127.0.0.1:3900.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// S3 region (default: AWS_REGION, else us-east-1).
    #[arg(long)]
    pub region: Option<String>,
    /// Access key id (default: AWS_ACCESS_KEY_ID). Stored in the workspace config (mode 0600).
    #[arg(long)]
    pub access_key: Option<String>,
    /// Secret access key (default: AWS_SECRET_ACCESS_KEY).
    #[arg(long)]
    pub secret_key: Option<String>,
    /// Replace an existing workspace of this name (its metadata is discarded; bucket
    /// objects stay and are imported again).
    #[arg(long)]
    pub force: bool,
}

const FORMAT_RECORD: &str = ".deskfs/format.json";

/// Runs `deskfs format`.
pub fn run(a: FormatArgs) -> Result<()> {
    check_name(&a.name)?;
    let dir = ws_dir(&a.name);
    if dir.join("workspace.toml").exists() && !a.force {
        bail!("workspace {:?} already exists ({}); use --force to reformat it (discards its metadata) or pick another name", a.name, dir.display());
    }
    if !crate::home::mounts_of(&a.name).is_empty() {
        bail!(
            "workspace {:?} is mounted; unmount it first (deskfs umount MOUNTPOINT)",
            a.name
        );
    }
    let created_dir = !dir.exists();
    let res = format_inner(&a, created_dir);
    if res.is_err() && created_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    res
}

fn format_inner(a: &FormatArgs, _created_dir: bool) -> Result<()> {
    let dir = ws_dir(&a.name);
    let bucket_url = match &a.bucket {
        Some(u) => u.clone(),
        None => format!("file://{}", dir.join("bucket").display()),
    };
    let mut spec = BucketSpec::parse(&bucket_url)?;
    spec.endpoint = a.endpoint.clone();
    spec.region = a.region.clone();
    spec.access_key = a.access_key.clone();
    spec.secret_key = a.secret_key.clone();
    if a.access_key.is_some() != a.secret_key.is_some() {
        bail!("--access-key and --secret-key must be given together");
    }
    let meta_url = match &a.meta {
        Some(m) => m.clone(),
        None => format!("sqlite://{}", dir.join("meta.db").display()),
    };
    let db = crate::home::sqlite_path(&meta_url)?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bucket = Bucket::open(&spec, spec.scheme == Some(deskfs_bucket::Scheme::Local))?;
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), bucket.check())
            .await
            .map_err(|_| {
                anyhow!(
                    "bucket {} did not answer within 30 s; check the endpoint",
                    spec.url
                )
            })?
            .map_err(anyhow::Error::from)
    })
    .with_context(|| format!("cannot use bucket {}", spec.url))?;
    let existing = rt.block_on(bucket.head(FORMAT_RECORD))?;
    if existing.is_some() && !a.force {
        bail!("bucket {} already holds a deskfs workspace ({FORMAT_RECORD}); use --force to format over it (objects are kept and imported)", spec.url);
    }
    if db.exists() {
        if !a.force {
            bail!(
                "metadata database {} already exists; use --force to replace it",
                db.display()
            );
        }
        for suffix in ["", "-wal", "-shm"] {
            let p = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
            let _ = std::fs::remove_file(p);
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let record = serde_json::json!({
        "format": "deskfs",
        "version": 1,
        "workspace": a.name,
        "created": now.as_secs(),
    });
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    deskfs_meta::sqlite::SqliteEngine::create(&db, uid, gid, now.as_nanos() as i64)
        .with_context(|| format!("cannot create metadata database {}", db.display()))?;
    if let Err(e) = rt.block_on(bucket.put_bytes(FORMAT_RECORD, record.to_string().into(), None)) {
        let _ = std::fs::remove_file(&db);
        return Err(anyhow::Error::from(e).context(format!("cannot write to bucket {}", spec.url)));
    }
    let cfg = WorkspaceConfig {
        name: a.name.clone(),
        bucket: spec.url.clone(),
        meta: meta_url,
        endpoint: a.endpoint.clone(),
        region: a.region.clone(),
        access_key: a.access_key.clone(),
        secret_key: a.secret_key.clone(),
        created: now.as_secs(),
    };
    if let Err(e) = cfg.save() {
        let _ = std::fs::remove_file(&db);
        return Err(e);
    }
    println!(
        "formatted workspace {} (bucket {}, metadata {})",
        a.name,
        spec.url,
        db.display()
    );
    Ok(())
}
