//! `deskfs format` (creates a workspace: bucket format record, metadata database, record
//! of the workspace in it, local config) and `deskfs attach` (joins a workspace whose
//! metadata lives in a shared database, from another host).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use deskfs_bucket::{Bucket, BucketSpec};

use crate::home::{check_name, ws_dir, WorkspaceConfig};
use crate::metadb::{new_id, MetaUrl, Record};

pub(crate) mod record;
use record::FormatRecord;

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

/// The bucket's format record (`.deskfs/format.json`, see [`record`]).
pub(crate) const FORMAT_RECORD: &str = record::KEY;

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

/// The bucket's format record, if there is one (every field absent when its body cannot
/// be read or is not a JSON object).
pub(crate) fn bucket_workspace(
    bucket: &Bucket,
    rt: &tokio::runtime::Runtime,
) -> Result<Option<FormatRecord>> {
    if rt.block_on(bucket.head(FORMAT_RECORD))?.is_none() {
        return Ok(None);
    }
    let body = rt.block_on(bucket.get_range(FORMAT_RECORD, 0..record::MAX_LEN, None));
    Ok(Some(
        body.ok()
            .and_then(|b| FormatRecord::parse(&b).ok())
            .unwrap_or_default(),
    ))
}

/// The server an S3 endpoint URL names, spelled one way: scheme and host in lower case,
/// the scheme's default port dropped (`:80` for http, `:443` for https), no trailing `/`,
/// and every loopback name (`localhost`, `127.0.0.1`, `[::1]`) as `localhost`. Not a URL
/// (or empty): the text itself, lower case.
fn endpoint_identity(ep: &str) -> String {
    let Ok(u) = url::Url::parse(ep.trim()) else {
        return ep.trim().trim_end_matches('/').to_ascii_lowercase();
    };
    let host = match u.host() {
        Some(url::Host::Domain(d)) if d.eq_ignore_ascii_case("localhost") => "localhost".into(),
        Some(url::Host::Ipv4(ip)) if ip.is_loopback() => "localhost".into(),
        Some(url::Host::Ipv6(ip)) if ip.is_loopback() => "localhost".into(),
        Some(h) => h.to_string().to_ascii_lowercase(),
        None => String::new(),
    };
    let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
    format!(
        "{}://{host}{port}{}",
        u.scheme(),
        u.path().trim_end_matches('/')
    )
}

/// Where a bucket URL puts objects, to tell whether two locations overlap: a resolved
/// directory (`file://`), or a store (kind, and for S3 the endpoint), a bucket and a
/// key prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Place {
    /// A local directory, resolved (symlinks followed).
    Dir(PathBuf),
    /// Keys under `prefix` (its segments) in `bucket` of `store`.
    Keys {
        store: String,
        bucket: String,
        prefix: Vec<String>,
    },
}

impl Place {
    /// The place of `spec` (its endpoint as [`deskfs_bucket::s3_endpoint`] finds it names
    /// the S3 store).
    fn of(spec: &BucketSpec) -> Place {
        use deskfs_bucket::Scheme;
        let store = match spec.scheme {
            Some(Scheme::Local) => {
                return Place::Dir(crate::home::resolve(Path::new(&spec.bucket)));
            }
            Some(Scheme::S3) | None => {
                let ep = deskfs_bucket::s3_endpoint(spec).unwrap_or_default();
                format!("s3 {}", endpoint_identity(&ep))
            }
            Some(Scheme::Gcs) => "gs".to_string(),
            Some(Scheme::Azure) => "az".to_string(),
        };
        Place::Keys {
            store,
            bucket: spec.bucket.clone(),
            prefix: spec
                .prefix
                .split('/')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    /// How `self` stands to `other`: `Some("is")` the same place, `Some("lies inside")`,
    /// `Some("contains")`, or `None` apart.
    fn relation(&self, other: &Place) -> Option<&'static str> {
        let (mine, theirs): (Vec<&std::ffi::OsStr>, Vec<&std::ffi::OsStr>) = match (self, other) {
            (Place::Dir(a), Place::Dir(b)) => (a.iter().collect(), b.iter().collect()),
            (
                Place::Keys {
                    store: s1,
                    bucket: b1,
                    prefix: p1,
                },
                Place::Keys {
                    store: s2,
                    bucket: b2,
                    prefix: p2,
                },
            ) if s1 == s2 && b1 == b2 => (
                p1.iter().map(std::ffi::OsStr::new).collect(),
                p2.iter().map(std::ffi::OsStr::new).collect(),
            ),
            _ => return None,
        };
        if mine == theirs {
            Some("is")
        } else if mine.starts_with(&theirs) {
            Some("lies inside")
        } else if theirs.starts_with(&mine) {
            Some("contains")
        } else {
            None
        }
    }
}

/// Refuses a bucket location workspace `name` must not have (checked before anything is
/// created, by `format` and `attach`):
/// * a `file://` directory that resolves to the file system root (through a symlink),
///   that lies on a deskfs mount, that is, contains or lies inside the deskfs home (other than in a workspace's own
///   `bucket/` dir), or that lies inside a cache dir (one with a `cache-id`, or one a
///   live mount uses) or contains a live mount's cache dir: the objects would be written
///   over, or mixed with, deskfs's own files;
/// * a location that is, lies inside or contains the bucket location of another
///   workspace of this deskfs home: the two would import, change and delete each other's
///   files.
pub(crate) fn check_bucket_place(name: &str, spec: &BucketSpec) -> Result<()> {
    let place = Place::of(spec);
    if let Place::Dir(dir) = &place {
        let url = &spec.url;
        if dir.parent().is_none() {
            bail!("bucket {url} resolves to the file system root {}: objects would be written at the machine's own paths; give a directory of its own", dir.display());
        }
        let home = crate::home::resolve(&crate::home::home());
        if home.starts_with(dir) {
            bail!("bucket directory {} {} the deskfs home {}: its databases and caches would show as objects; give a directory outside it", dir.display(), if *dir == home { "is" } else { "contains" }, home.display());
        }
        if let Ok(rel) = dir.strip_prefix(&home) {
            let c: Vec<_> = rel.iter().collect();
            let own_bucket = c.len() >= 3 && c[0] == "workspaces" && c[2] == "bucket";
            if !own_bucket {
                bail!("bucket directory {} lies inside the deskfs home {} (only a workspace's own workspaces/NAME/bucket may): objects would mix with deskfs's files; give a directory outside it", dir.display(), home.display());
            }
        }
        if let Some((point, source)) = crate::desk_root::on_deskfs_mount(dir) {
            bail!("bucket directory {} lies on a deskfs mount ({source} at {}): a workspace's objects cannot live inside a deskfs workspace (its uploads would go through another mount, or wait on themselves); give a directory on a local disk", dir.display(), point.display());
        }
        if let Some(cache) = dir.ancestors().find(|a| a.join("cache-id").is_file()) {
            bail!("bucket directory {} lies inside the deskfs cache dir {}: objects would mix with cached files (and be evicted); give a directory outside it", dir.display(), cache.display());
        }
        for m in crate::home::all_mounts() {
            let cache = crate::home::resolve(&m.cache_dir);
            if crate::home::nested(dir, &cache) {
                bail!("bucket directory {} overlaps the cache dir {} of the mount of workspace {:?} at {}: objects would mix with cached files; give a directory apart from it", dir.display(), cache.display(), m.workspace, m.mountpoint.display());
            }
        }
    }
    for other in crate::home::list_workspaces()? {
        if other == name {
            continue;
        }
        let Ok(cfg) = WorkspaceConfig::load(&other) else {
            continue;
        };
        let Ok(mut theirs) = BucketSpec::parse(&cfg.bucket) else {
            continue;
        };
        theirs.endpoint = cfg.endpoint.clone();
        if let Some(rel) = place.relation(&Place::of(&theirs)) {
            let rel = if rel == "is" { "is also" } else { rel };
            bail!(
                "bucket {} {rel} the bucket of workspace {other:?} ({}): two workspaces would import, change and delete each other's files; give {name} a bucket location apart from it",
                spec.url,
                theirs.url
            );
        }
    }
    Ok(())
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
    check_bucket_place(&a.name, &spec)?;
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
    let record = FormatRecord::new(&a.name, &id, meta_url.is_shared(), now.as_secs());
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
    if let Err(e) = rt.block_on(bucket.put_bytes(FORMAT_RECORD, record.to_bytes().into(), None)) {
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
    // The default cache dir of the workspace this one replaces names that workspace's
    // inodes: set aside (it may hold files that never reached the bucket), never reused.
    let old_cache = dir.join("cache");
    if a.force && old_cache.exists() {
        let aside = dir.join(format!("cache.before-format-{}", now.as_secs()));
        match std::fs::rename(&old_cache, &aside) {
            Ok(()) => println!(
                "note: the cache dir of the replaced workspace was moved to {} (remove it once nothing in it is needed)",
                aside.display()
            ),
            Err(e) => eprintln!(
                "deskfs: warning: cannot move the replaced workspace's cache dir {} aside ({e}); remove it before mounting",
                old_cache.display()
            ),
        }
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
    check_bucket_place(&a.name, &spec)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bucket = open_bucket(&spec, &rt, false)?;
    match bucket_workspace(&bucket, &rt)? {
        Some(v) if v.id.as_ref().is_some_and(|i| *i != rec.id) => {
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

#[cfg(test)]
mod unit {
    use super::*;

    fn place(url: &str, endpoint: Option<&str>) -> Place {
        let mut s = BucketSpec::parse(url).unwrap();
        s.endpoint = endpoint.map(str::to_string);
        Place::of(&s)
    }

    #[test]
    fn bucket_places_overlap_by_whole_segments() {
        let ep = Some("http://127.0.0.1:3900");
        let agents = place("s3://b/agents", ep);
        assert_eq!(agents.relation(&place("s3://b/agents/", ep)), Some("is"));
        assert_eq!(
            place("s3://b/agents/work", ep).relation(&agents),
            Some("lies inside")
        );
        assert_eq!(
            agents.relation(&place("s3://b/agents/work", ep)),
            Some("contains")
        );
        assert_eq!(place("s3://b", ep).relation(&agents), Some("contains"));
        assert_eq!(place("s3a://b/agents", ep).relation(&agents), Some("is"));
        // Apart: another segment, another bucket, another server, another store.
        assert_eq!(place("s3://b/agents2", ep).relation(&agents), None);
        assert_eq!(place("s3://c/agents", ep).relation(&agents), None);
        assert_eq!(
            place("s3://b/agents", Some("http://other:9000")).relation(&agents),
            None
        );
        assert_eq!(
            place("s3://b/agents", Some("HTTP://127.0.0.1:3900/")).relation(&agents),
            Some("is")
        );
        assert_eq!(place("gs://b/agents", None).relation(&agents), None);
        // One server, spelled differently: loopback names, default ports.
        for same in [
            "http://localhost:3900",
            "http://[::1]:3900/",
            "http://LocalHost:3900",
        ] {
            assert_eq!(
                place("s3://b/agents", Some(same)).relation(&agents),
                Some("is"),
                "{same}"
            );
        }
        let https = place("s3://b/x", Some("https://S3.example.com:443/"));
        assert_eq!(
            place("s3://b/x", Some("https://s3.example.com")).relation(&https),
            Some("is")
        );
        assert_eq!(
            place("s3://b/x", Some("http://s3.example.com")).relation(&https),
            None,
            "another scheme is another server (port 80)"
        );
        assert_eq!(
            place("s3://b/agents", Some("http://127.0.0.1:3901")).relation(&agents),
            None
        );

        let t = crate::home::test_dir("places");
        let x = format!("file://{}/x", t.display());
        let xy = format!("file://{}/x/y", t.display());
        let xz = format!("file://{}/xz", t.display());
        assert_eq!(
            place(&xy, None).relation(&place(&x, None)),
            Some("lies inside")
        );
        assert_eq!(
            place(&x, None).relation(&place(&xy, None)),
            Some("contains")
        );
        assert_eq!(place(&xz, None).relation(&place(&x, None)), None);
        // Through a symlink: the same directory.
        std::fs::create_dir(t.join("x")).unwrap();
        std::os::unix::fs::symlink(t.join("x"), t.join("link")).unwrap();
        let link = format!("file://{}/link/y", t.display());
        assert_eq!(place(&link, None).relation(&place(&xy, None)), Some("is"));
        let _ = std::fs::remove_dir_all(&t);
    }
}
