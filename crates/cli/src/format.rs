//! `deskfs format` (creates a workspace: bucket format record, metadata database, record
//! of the workspace in it, local config) and `deskfs attach` (joins a workspace whose
//! metadata lives in a shared database, from another host).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use deskfs_bucket::{Bucket, BucketSpec};

use crate::home::{check_name, ws_dir, WorkspaceConfig};
use crate::metadb::{new_id, MetaUrl, Record};

/// Arguments of `deskfs format`.
#[derive(Args, Debug)]
pub struct FormatArgs {
    /// Workspace name (letters, digits, '.', '_', '-').
    pub name: String,
    /// Bucket URL: s3://BUCKET[/PREFIX], gs://…, az://…, file:///DIR. Default: a local
    /// bucket directory inside the workspace's data dir.
    #[arg(long)]
    pub bucket: Option<String>,
    /// Metadata URL: sqlite:///ABSOLUTE/PATH.db (default: meta.db in the workspace's data
    /// dir), or postgres://USER@HOST:PORT/DATABASE[?schema=NAME] for a workspace that
    /// several hosts share (the password comes from PGPASSWORD or ~/.pgpass).
    #[arg(long)]
    pub meta: Option<String>,
    /// S3 endpoint URL for S3-compatible servers (path-style requests), e.g. http://127.0.0.1:3900.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// S3 region (default: AWS_REGION, else us-east-1).
    #[arg(long)]
    pub region: Option<String>,
    /// Access key id (default: AWS_ACCESS_KEY_ID). Stored in the local workspace config
    /// (mode 0600), never in the metadata database.
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

/// Arguments of `deskfs attach`.
#[derive(Args, Debug)]
pub struct AttachArgs {
    /// Workspace name on this machine.
    pub name: String,
    /// Metadata URL of a shared workspace: postgres://USER@HOST:PORT/DATABASE[?schema=NAME].
    /// Without it, the workspace is rebuilt on this machine from the bucket (--bucket).
    #[arg(long)]
    pub meta: Option<String>,
    /// The bucket URL. Alone: rebuild the workspace's SQLite metadata on this machine from
    /// the backup in the bucket (a machine that was lost). With --meta: checked against
    /// the bucket the shared workspace records.
    #[arg(long)]
    pub bucket: Option<String>,
    /// Rebuild even though the workspace's lease says it is mounted on another machine
    /// (use only when that machine is known to be dead).
    #[arg(long)]
    pub take_over: bool,
    /// S3 endpoint on this host, when it differs from the one recorded.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// S3 region, when it differs from the one recorded.
    #[arg(long)]
    pub region: Option<String>,
    /// Access key id (default: AWS_ACCESS_KEY_ID). Stored locally (mode 0600).
    #[arg(long)]
    pub access_key: Option<String>,
    /// Secret access key (default: AWS_SECRET_ACCESS_KEY).
    #[arg(long)]
    pub secret_key: Option<String>,
}

/// The bucket's format record (`.deskfs/format.json`).
pub(crate) const FORMAT_RECORD: &str = ".deskfs/format.json";

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
    if a.access_key.is_some() != a.secret_key.is_some() {
        bail!("--access-key and --secret-key must be given together");
    }
    let created_dir = !dir.exists();
    let res = format_inner(&a);
    if res.is_err() && created_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    res
}

/// Opens `spec`'s bucket and checks that it answers (30 s at most).
pub(crate) fn open_bucket(
    spec: &BucketSpec,
    rt: &tokio::runtime::Runtime,
    create: bool,
) -> Result<Bucket> {
    let bucket = Bucket::open(spec, create)?;
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
    Ok(bucket)
}

/// The workspace id in the bucket's format record, if there is one.
pub(crate) fn bucket_workspace(
    bucket: &Bucket,
    rt: &tokio::runtime::Runtime,
) -> Result<Option<serde_json::Value>> {
    if rt.block_on(bucket.head(FORMAT_RECORD))?.is_none() {
        return Ok(None);
    }
    let body = rt.block_on(bucket.get_range(FORMAT_RECORD, 0..64 << 10, None));
    Ok(body
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .or(Some(serde_json::Value::Null)))
}

fn format_inner(a: &FormatArgs) -> Result<()> {
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
    let meta_url = MetaUrl::parse(&match &a.meta {
        Some(m) => m.clone(),
        None => format!("sqlite://{}", dir.join("meta.db").display()),
    })?;

    // The database first (nothing is created before every check passed): refuse one
    // that already holds a workspace, unless --force.
    let mut replace_db = false;
    match meta_url.open_raw() {
        Ok(existing) => {
            let rec = Record::read(&*existing)?;
            drop(existing);
            if !a.force {
                return Err(match (rec, &meta_url) {
                    (Some(r), MetaUrl::Postgres(_)) => anyhow!(
                        "{} already holds workspace {:?} (bucket {}); join it with `deskfs attach {} --meta URL`, or use --force to replace it",
                        meta_url.display(), r.name, r.bucket, r.name
                    ),
                    _ => anyhow!(
                        "metadata database {} already exists; use --force to replace it",
                        meta_url.display()
                    ),
                });
            }
            replace_db = true;
        }
        // Nothing there: the normal case.
        Err(deskfs_meta::MetaError::NotFound(_)) => {}
        // A damaged or too new database is replaced only with --force; an unreachable
        // server, a wrong password, a schema of something else: never.
        Err(
            e @ (deskfs_meta::MetaError::Corrupt { .. } | deskfs_meta::MetaError::TooNew { .. }),
        ) if a.force => {
            tracing::warn!(error = %e, "replacing the metadata database (--force)");
            replace_db = true;
        }
        Err(e) => return Err(meta_url.explain(e)),
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bucket = open_bucket(
        &spec,
        &rt,
        spec.scheme == Some(deskfs_bucket::Scheme::Local),
    )?;
    if bucket_workspace(&bucket, &rt)?.is_some() && !a.force {
        bail!("bucket {} already holds a deskfs workspace ({FORMAT_RECORD}); to use it on this machine run `deskfs attach {} --bucket {}` (rebuilds it with its modes, links, times and xattrs), or --force to start a new workspace over its objects", spec.url, a.name, spec.url);
    }
    if replace_db {
        meta_url.destroy()?;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let id = new_id();
    let record = serde_json::json!({
        "format": "deskfs",
        "version": 1,
        "workspace": a.name,
        "id": id,
        "meta": if meta_url.is_shared() { "postgres" } else { "sqlite" },
        "created": now.as_secs(),
    });
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let meta = meta_url.create(uid, gid, now.as_nanos() as i64)?;
    let undo = |meta_url: &MetaUrl| {
        let _ = meta_url.destroy();
    };
    let rec = Record {
        name: a.name.clone(),
        id: id.clone(),
        bucket: spec.url.clone(),
        endpoint: a.endpoint.clone(),
        region: a.region.clone(),
    };
    if let Err(e) = rec.write(&*meta) {
        drop(meta);
        undo(&meta_url);
        return Err(e);
    }
    // A SQLite workspace is owned by this database from now on (see deskfs_backup::lease).
    let db = if meta_url.is_shared() {
        None
    } else {
        match deskfs_backup::lease::db_id(&*meta) {
            Ok(d) => Some(d),
            Err(e) => {
                drop(meta);
                undo(&meta_url);
                return Err(e.into());
            }
        }
    };
    drop(meta);
    if let Err(e) = rt.block_on(bucket.put_bytes(FORMAT_RECORD, record.to_string().into(), None)) {
        undo(&meta_url);
        return Err(anyhow::Error::from(e).context(format!("cannot write to bucket {}", spec.url)));
    }
    if let Some(db) = &db {
        if let Err(e) = rt.block_on(deskfs_backup::lease::take_for_attach(
            &bucket, &id, db, true,
        )) {
            undo(&meta_url);
            return Err(anyhow::Error::from(e).context(format!(
                "cannot write the workspace lease to bucket {}",
                spec.url
            )));
        }
    }
    let cfg = WorkspaceConfig {
        name: a.name.clone(),
        bucket: spec.url.clone(),
        meta: meta_url.stored(),
        endpoint: a.endpoint.clone(),
        region: a.region.clone(),
        access_key: a.access_key.clone(),
        secret_key: a.secret_key.clone(),
        created: now.as_secs(),
    };
    if let Err(e) = cfg.save() {
        undo(&meta_url);
        return Err(e);
    }
    println!(
        "formatted workspace {} (bucket {}, metadata {})",
        a.name,
        spec.url,
        meta_url.display()
    );
    if meta_url.has_password() {
        println!("note: the database password is not stored; mounts read it from PGPASSWORD or ~/.pgpass");
    }
    if meta_url.is_shared() {
        println!(
            "other hosts join it with: deskfs attach {} --meta {}",
            a.name,
            meta_url.stored()
        );
    }
    Ok(())
}

/// Runs `deskfs attach`: records locally a workspace whose metadata lives in a shared
/// database (made by `deskfs format --meta postgres://…` on another host).
pub fn attach(a: AttachArgs) -> Result<()> {
    check_name(&a.name)?;
    let dir = ws_dir(&a.name);
    if dir.join("workspace.toml").exists() {
        bail!(
            "workspace {:?} already exists on this host ({}); mount it with `deskfs mount {} MOUNTPOINT`",
            a.name,
            dir.display(),
            a.name
        );
    }
    if a.access_key.is_some() != a.secret_key.is_some() {
        bail!("--access-key and --secret-key must be given together");
    }
    let Some(meta) = &a.meta else {
        return crate::attach::from_bucket(a);
    };
    let meta_url = MetaUrl::parse(meta)?;
    if !meta_url.is_shared() {
        bail!("attach --meta joins a workspace shared through PostgreSQL (postgres://USER@HOST:PORT/DATABASE); to move a SQLite workspace to this machine use `deskfs attach {} --bucket URL`", a.name);
    }
    let meta = meta_url.open()?;
    let rec = Record::read(&*meta)?.ok_or_else(|| {
        anyhow!(
            "{} holds a deskfs workspace without a workspace record (made by an older deskfs); format a new one",
            meta_url.display()
        )
    })?;
    drop(meta);
    if rec.name != a.name {
        bail!(
            "{} holds workspace {:?}, not {:?}; attach with that name, or check the URL",
            meta_url.display(),
            rec.name,
            a.name
        );
    }
    if let Some(b) = &a.bucket {
        let given = BucketSpec::parse(b)?.url;
        if given != rec.bucket {
            bail!(
                "bucket {given} differs from the bucket workspace {:?} records ({}); omit --bucket or give that one",
                rec.name,
                rec.bucket
            );
        }
    }
    let endpoint = a.endpoint.clone().or(rec.endpoint.clone());
    let region = a.region.clone().or(rec.region.clone());
    let mut spec = BucketSpec::parse(&rec.bucket)?;
    spec.endpoint = endpoint.clone();
    spec.region = region.clone();
    spec.access_key = a.access_key.clone();
    spec.secret_key = a.secret_key.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bucket = open_bucket(&spec, &rt, false)?;
    match bucket_workspace(&bucket, &rt)? {
        Some(v)
            if v.get("id")
                .and_then(|i| i.as_str())
                .is_some_and(|i| i != rec.id) =>
        {
            bail!(
                "bucket {} holds another deskfs workspace than the one {} records; check both URLs",
                spec.url,
                meta_url.display()
            )
        }
        _ => {}
    }
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let cfg = WorkspaceConfig {
        name: a.name.clone(),
        bucket: rec.bucket.clone(),
        meta: meta_url.stored(),
        endpoint,
        region,
        access_key: a.access_key.clone(),
        secret_key: a.secret_key.clone(),
        created,
    };
    cfg.save()?;
    println!(
        "attached workspace {} (bucket {}, metadata {}); mount it with `deskfs mount {} MOUNTPOINT`",
        a.name,
        rec.bucket,
        meta_url.display(),
        a.name
    );
    Ok(())
}
