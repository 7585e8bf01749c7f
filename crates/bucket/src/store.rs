//! The [`Bucket`]: one workspace's view of an object store, keys relative to its prefix.

use std::fs::File;
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    Attributes, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, RetryConfig, WriteMultipart,
};
use tokio::io::AsyncReadExt;

use crate::{BucketError, BucketSpec, PosixMeta, Result, Scheme};

/// Size from which files are uploaded with multipart, bytes (S3 API: parts ≥ 5 MiB).
pub const MULTIPART_THRESHOLD: u64 = 16 << 20;
/// Default multipart part size, bytes (the S3 API's minimum is 5 MiB). Grows for huge
/// files to stay under 10,000 parts. With [`PART_CONCURRENCY`] parts in flight and one
/// filling, a multipart upload holds ~40 MiB of memory.
pub const PART_SIZE: u64 = 8 << 20;
/// Parts uploaded concurrently per file.
pub const PART_CONCURRENCY: usize = 4;

/// Metadata of one object as listed or fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Key relative to the workspace prefix (no trailing `/`).
    pub key: String,
    /// Size, bytes.
    pub size: u64,
    /// ETag (S3 API), if the store gives one.
    pub etag: Option<String>,
    /// Last-modified time, ns since the epoch.
    pub mtime_ns: i64,
    /// POSIX attributes from user metadata (only from `head`; listings carry none).
    pub posix: Option<PosixMeta>,
}

/// Children of one directory prefix.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// Objects directly under the prefix (name = last key segment).
    pub files: Vec<(String, ObjectInfo)>,
    /// Sub-prefixes (directories), by name.
    pub dirs: Vec<String>,
}

/// Result of an upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutInfo {
    /// ETag of the new object.
    pub etag: Option<String>,
    /// Bytes written.
    pub size: u64,
}

impl PutInfo {
    /// Whether another put of the same key replaced this one's object before its ETag
    /// was read (local bucket: the ETag is then one no object has, see `local_etag`): the
    /// bucket does not hold what this put wrote. Object stores overwrite silently, so
    /// there a HEAD is the only way to tell.
    pub fn replaced(&self) -> bool {
        self.etag
            .as_deref()
            .is_some_and(|e| e.ends_with("-replaced\""))
    }
}

/// A bucket (or a prefix of one) opened through `object_store`.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    spec: BucketSpec,
    /// For `file://`: the root directory (markers are real directories there).
    local_root: Option<PathBuf>,
    /// Retries of reads past the HTTP client's own, and their counters (shared by clones).
    reads: Arc<crate::read_retry::ReadRetry>,
    /// Requests by kind and answer (shared by clones; see `counting`).
    requests: Arc<crate::RequestCounters>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("url", &self.spec.url)
            .finish()
    }
}

/// The endpoint of an S3 bucket, where a custom one is set: `--endpoint` (recorded in the
/// workspace), else `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, `AWS_ENDPOINT`, else the
/// `endpoint_url` of the AWS profile in the shared files (see [`crate::aws_profile`]);
/// `None` is AWS itself. A profile that cannot be read counts as none here (opening the
/// bucket reports it).
pub fn s3_endpoint(spec: &BucketSpec) -> Option<String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let profile = crate::aws_profile::load(env, false).ok().flatten();
    endpoint_from(spec, env, profile.as_ref())
}

fn endpoint_from(
    spec: &BucketSpec,
    env: impl Fn(&str) -> Option<String>,
    profile: Option<&crate::aws_profile::AwsProfile>,
) -> Option<String> {
    spec.endpoint
        .clone()
        .or_else(|| env("AWS_ENDPOINT_URL_S3"))
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .or_else(|| env("AWS_ENDPOINT"))
        .or_else(|| profile.and_then(|p| p.endpoint_url.clone()))
}

/// Why an S3 bucket has no credentials to use, or `None`. Keys come from the URL or
/// `AWS_ACCESS_KEY_ID` (or a profile of the shared files, checked before this); a web identity or container credentials are used when their
/// variables are set; the EC2 instance metadata service (169.254.169.254) only for AWS
/// itself (no custom endpoint) and unless `AWS_EC2_METADATA_DISABLED=true`. Without any,
/// a mount would wait on a metadata service that is not there: refused at once instead.
fn s3_credentials_missing(
    spec: &BucketSpec,
    custom_endpoint: bool,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let set = |k: &str| env(k).is_some_and(|v| !v.is_empty());
    let keys = spec.access_key.is_some() || set("AWS_ACCESS_KEY_ID");
    let other = set("AWS_WEB_IDENTITY_TOKEN_FILE")
        || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        || set("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    let imds_off = env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if keys || other || (!custom_endpoint && !imds_off) {
        return None;
    }
    Some(format!(
        "no credentials for bucket s3://{}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials (`aws configure`){}",
        spec.bucket,
        if custom_endpoint {
            " (instance-metadata credentials are used only for AWS itself, not a custom endpoint)"
        } else {
            " (AWS_EC2_METADATA_DISABLED=true turns instance-metadata credentials off)"
        }
    ))
}

/// Why a GCS bucket on a custom endpoint (`GOOGLE_BASE_URL`, e.g. an emulator) has no
/// credentials to use, or `None`. Without a service-account key
/// (`GOOGLE_SERVICE_ACCOUNT`, `_PATH`, `_KEY`), `GOOGLE_APPLICATION_CREDENTIALS`, a
/// bearer token or `GOOGLE_SKIP_SIGNATURE=true`, object_store asks the GCE metadata
/// service for a token, which exists only on Google Cloud: a mount would wait on it, so
/// it is refused at once. On Google's own endpoint (no `GOOGLE_BASE_URL`) the metadata
/// service is a real credential source and nothing is refused here.
fn gcs_credentials_missing(
    spec: &BucketSpec,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    let custom =
        env("GOOGLE_BASE_URL").filter(|u| !u.trim().is_empty() && !u.contains("googleapis.com"))?;
    let creds = [
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_PATH",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_BEARER_TOKEN",
    ]
    .iter()
    .any(|k| set(k));
    let skip = env("GOOGLE_SKIP_SIGNATURE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    // gcloud's application default credentials (`gcloud auth application-default login`),
    // which object_store reads when no variable names others.
    let adc = env("HOME").is_some_and(|h| {
        FsPath::new(&h)
            .join(".config/gcloud/application_default_credentials.json")
            .is_file()
    });
    if creds || skip || adc {
        return None;
    }
    Some(format!(
        "no credentials for bucket gs://{} on the endpoint {custom}: set GOOGLE_SERVICE_ACCOUNT_KEY (for an emulator a fake key with \"disable_oauth\": true, see scripts/gcs-server.sh), GOOGLE_SERVICE_ACCOUNT or GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login` (metadata-server credentials exist only on Google Cloud itself)",
        spec.bucket
    ))
}

/// The Azure Blob client of `spec`, configured from Azure's standard variables (read
/// through `env`): `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY` (or a SAS,
/// token, service principal, ... as object_store reads them), `AZURE_STORAGE_ENDPOINT`
/// (e.g. Azurite's `http://127.0.0.1:10000/ACCOUNT`), `AZURE_STORAGE_USE_EMULATOR`; and
/// `AZURE_STORAGE_CONNECTION_STRING` (`AccountName`, `AccountKey`, `BlobEndpoint`,
/// `SharedAccessSignature`, `DefaultEndpointsProtocol`, `EndpointSuffix`,
/// `UseDevelopmentStorage`), which object_store does not read: its fields fill in what the
/// separate variables leave unset. `--endpoint` (`spec.endpoint`) wins over both.
/// `names` are the names of the environment's `AZURE_*` variables, `env` reads one.
///
/// Errors: [`BucketError::Config`] with one line naming the variables when there is no
/// account, or when an account on a custom endpoint has no key or other credential (the
/// client would otherwise wait on Azure's instance metadata service, which only Azure
/// VMs have), or when the connection string cannot be read.
fn azure_builder(
    spec: &BucketSpec,
    names: Vec<String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<object_store::azure::MicrosoftAzureBuilder> {
    use object_store::azure::{AzureConfigKey as K, MicrosoftAzureBuilder};
    let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    // As `MicrosoftAzureBuilder::from_env` does: every AZURE_* variable object_store
    // knows (AZURE_STORAGE_ACCOUNT_NAME, _ACCOUNT_KEY, _SAS_TOKEN, _ENDPOINT,
    // _USE_EMULATOR, AZURE_CLIENT_ID, ...), and IDENTITY_ENDPOINT.
    let mut b = MicrosoftAzureBuilder::new();
    for name in names {
        if let (Some(key), Some(v)) = (name.to_ascii_lowercase().parse::<K>().ok(), var(&name)) {
            b = b.with_config(key, v);
        }
    }
    if let Some(v) = var("IDENTITY_ENDPOINT") {
        b = b.with_msi_endpoint(v);
    }
    if let Some(cs) = var("AZURE_STORAGE_CONNECTION_STRING") {
        for (key, v) in azure_connection_string(&cs)? {
            if b.get_config_value(&key).is_none() {
                b = b.with_config(key, v);
            }
        }
    }
    if let Some(ep) = &spec.endpoint {
        b = b.with_endpoint(ep.trim_end_matches('/').to_string());
    }
    let has = |k: K| b.get_config_value(&k).is_some_and(|v| !v.is_empty());
    let truthy = |k: K| {
        b.get_config_value(&k)
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on"))
    };
    let emulator = truthy(K::UseEmulator);
    let secret = has(K::AccessKey)
        || has(K::SasKey)
        || has(K::Token)
        || has(K::ClientSecret)
        || has(K::FederatedTokenFile)
        || has(K::MsiEndpoint)
        || truthy(K::UseAzureCli)
        || truthy(K::SkipSignature);
    let custom_endpoint = b
        .get_config_value(&K::Endpoint)
        .is_some_and(|e| !e.contains(".windows.net") && !e.contains(".microsoft.com"));
    const HOW: &str = "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_CONNECTION_STRING; for Azurite also AZURE_STORAGE_ENDPOINT=http://127.0.0.1:10000/ACCOUNT, or AZURE_STORAGE_USE_EMULATOR=true)";
    if !emulator && !has(K::AccountName) {
        return Err(BucketError::Config(format!(
            "no Azure storage account for container az://{}: {HOW}",
            spec.bucket
        )));
    }
    if !emulator && !secret && custom_endpoint {
        return Err(BucketError::Config(format!(
            "no credentials for container az://{} on the endpoint {}: {HOW} (managed-identity credentials exist only on Azure itself)",
            spec.bucket,
            b.get_config_value(&K::Endpoint).unwrap_or_default()
        )));
    }
    Ok(b.with_container_name(&spec.bucket))
}

/// The object_store settings an Azure connection string names (`Key=Value;...`, keys
/// case-insensitive). `BlobEndpoint` gives the endpoint; without it a
/// `DefaultEndpointsProtocol` other than https (or an `EndpointSuffix`) gives
/// `PROTO://ACCOUNT.blob.SUFFIX`. Unknown keys (`QueueEndpoint`, ...) are ignored.
/// Errors: [`BucketError::Config`] for a part without `=` (the value is not shown: it
/// may hold the key).
fn azure_connection_string(cs: &str) -> Result<Vec<(object_store::azure::AzureConfigKey, String)>> {
    use object_store::azure::AzureConfigKey as K;
    let mut out = Vec::new();
    let (mut account, mut proto, mut suffix, mut endpoint) = (None, None, None, None);
    for (i, part) in cs.split(';').enumerate() {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let Some((k, v)) = part.split_once('=') else {
            return Err(BucketError::Config(format!(
                "AZURE_STORAGE_CONNECTION_STRING: part {} has no '=' (expected Key=Value;Key=Value;...)",
                i + 1
            )));
        };
        let v = v.trim().to_string();
        match k.trim().to_ascii_lowercase().as_str() {
            "accountname" => {
                account = Some(v.clone());
                out.push((K::AccountName, v));
            }
            "accountkey" => out.push((K::AccessKey, v)),
            "sharedaccesssignature" => out.push((K::SasKey, v)),
            "blobendpoint" => endpoint = Some(v),
            "defaultendpointsprotocol" => proto = Some(v),
            "endpointsuffix" => suffix = Some(v),
            "usedevelopmentstorage" => out.push((K::UseEmulator, v)),
            _ => {}
        }
    }
    let endpoint = endpoint.or_else(|| {
        let account = account.as_ref()?;
        let proto = proto.clone().unwrap_or_else(|| "https".into());
        if proto == "https" && suffix.is_none() {
            return None; // object_store's default: https://ACCOUNT.blob.core.windows.net
        }
        let suffix = suffix.clone().unwrap_or_else(|| "core.windows.net".into());
        Some(format!("{proto}://{account}.blob.{suffix}"))
    });
    if let Some(e) = endpoint {
        out.push((K::Endpoint, e.trim_end_matches('/').to_string()));
    }
    Ok(out)
}

/// The generation precondition of a GCS update of `key` that wants the ETag `want`, from
/// the object's HEAD (`have` ETag, `generation`): the generation when the ETags match.
/// Errors: [`BucketError::Changed`] when they differ; [`BucketError::Other`] when the HEAD
/// gave no ETag or no generation (`x-goog-generation`), since then no write could be made
/// conditional.
fn gcs_generation_for(
    key: &str,
    want: &str,
    have: Option<&str>,
    generation: Option<String>,
) -> Result<Option<String>> {
    match (have, generation) {
        (Some(have), Some(generation)) if have == want => Ok(Some(generation)),
        (Some(_), Some(_)) => Err(BucketError::Changed(key.to_string())),
        _ => Err(BucketError::Other(format!(
            "GCS gave no ETag and generation for {key}: a conditional write cannot be made"
        ))),
    }
}

/// The metadata that marks an Azure blob as a directory (Azure's convention: Storage
/// Explorer, blobfuse, Hadoop ABFS/WASB).
const AZURE_FOLDER: &str = "hdi_isfolder";

/// Marks a `file://` listing that failed on a name that is no object key.
const LOCAL_BAD_NAME: &str = "a name in the bucket directory is no object key: ";

fn store_err(e: object_store::Error) -> BucketError {
    BucketError::from_store(e)
}

impl Bucket {
    /// Opens the bucket named by `spec`. Builds the client only; use [`Bucket::check`] to
    /// test reachability and credentials. For `file://`, creates the directory when
    /// `create_local` is set. Errors: [`BucketError::Config`].
    pub fn open(spec: &BucketSpec, create_local: bool) -> Result<Bucket> {
        let (connect_timeout, timeout) = (Duration::from_secs(5), Duration::from_secs(120));
        let client = ClientOptions::new()
            .with_connect_timeout(connect_timeout)
            .with_timeout(timeout)
            .with_allow_http(true);
        // Plain-http endpoints: connections that do not wait 40 ms on a delayed ACK
        // (see `crate::http`).
        let http = crate::http::Connector {
            timeout,
            connect_timeout,
        };
        let retry = RetryConfig {
            max_retries: 2,
            retry_timeout: Duration::from_secs(15),
            ..Default::default()
        };
        let cfg = |e: object_store::Error| BucketError::Config(e.to_string());
        let (store, local_root): (Arc<dyn ObjectStore>, Option<PathBuf>) = match spec.scheme {
            Some(Scheme::S3) => {
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(&spec.bucket)
                    .with_client_options(client)
                    .with_http_connector(http)
                    .with_retry(retry);
                let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
                // Keys from the URL/flags or the environment win; the shared files
                // (`aws configure`) fill what they leave open.
                let keys_given = spec.access_key.is_some() || env("AWS_ACCESS_KEY_ID").is_some();
                let profile = crate::aws_profile::load(env, !keys_given)?;
                let endpoint = endpoint_from(spec, env, profile.as_ref());
                let endpoint_set = endpoint.is_some();
                if let Some(ep) = endpoint {
                    b = b
                        .with_endpoint(ep.trim_end_matches('/'))
                        .with_virtual_hosted_style_request(false);
                }
                let region = spec
                    .region
                    .clone()
                    .or_else(|| env("AWS_REGION"))
                    .or_else(|| env("AWS_DEFAULT_REGION"))
                    .or_else(|| profile.as_ref().and_then(|p| p.region.clone()))
                    .unwrap_or_else(|| "us-east-1".into());
                b = b.with_region(region);
                let profile_keys = profile
                    .as_ref()
                    .filter(|p| !keys_given && p.access_key_id.is_some());
                if let Some(p) = profile_keys {
                    if let (Some(k), Some(s)) = (&p.access_key_id, &p.secret_access_key) {
                        b = b.with_access_key_id(k).with_secret_access_key(s);
                    }
                    if let Some(t) = &p.session_token {
                        b = b.with_token(t);
                    }
                } else if let Some(why) = s3_credentials_missing(spec, endpoint_set, env) {
                    return Err(BucketError::Config(why));
                }
                if let Some(k) = &spec.access_key {
                    b = b.with_access_key_id(k);
                }
                if let Some(s) = &spec.secret_key {
                    b = b.with_secret_access_key(s);
                }
                (Arc::new(b.build().map_err(cfg)?), None)
            }
            Some(Scheme::Gcs) => {
                if let Some(why) = gcs_credentials_missing(spec, |k| std::env::var(k).ok()) {
                    return Err(BucketError::Config(why));
                }
                let b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&spec.bucket)
                    .with_client_options(client)
                    .with_http_connector(http)
                    .with_retry(retry);
                (Arc::new(b.build().map_err(cfg)?), None)
            }
            Some(Scheme::Azure) => {
                let names = std::env::vars_os()
                    .filter_map(|(k, _)| k.into_string().ok())
                    .filter(|k| k.starts_with("AZURE_"))
                    .collect();
                let b = azure_builder(spec, names, |k| std::env::var(k).ok())?
                    .with_client_options(client)
                    .with_http_connector(http)
                    .with_retry(retry);
                (Arc::new(b.build().map_err(cfg)?), None)
            }
            Some(Scheme::Local) => {
                let root = PathBuf::from(&spec.bucket);
                if create_local {
                    std::fs::create_dir_all(&root).map_err(|e| {
                        BucketError::Config(format!(
                            "cannot create bucket directory {}: {e}",
                            root.display()
                        ))
                    })?;
                }
                if !root.is_dir() {
                    return Err(BucketError::Config(format!(
                        "bucket directory {} does not exist; create it or run `deskfs format` again",
                        root.display()
                    )));
                }
                clean_local_tmp(&root);
                let fs =
                    object_store::local::LocalFileSystem::new_with_prefix(&root).map_err(cfg)?;
                (Arc::new(fs), Some(root))
            }
            None => return Err(BucketError::Config("no bucket scheme".into())),
        };
        let requests = Arc::new(crate::RequestCounters::default());
        let store: Arc<dyn ObjectStore> =
            Arc::new(crate::counting::Counting::new(store, requests.clone()));
        Ok(Bucket {
            store,
            spec: spec.clone(),
            local_root,
            reads: Arc::default(),
            requests,
        })
    }

    /// The spec this bucket was opened with.
    pub fn spec(&self) -> &BucketSpec {
        &self.spec
    }

    /// Whether `key` can be stored as is. The local backend of `object_store` refuses
    /// path segments ending in `#<digits>` (its multipart temp-file names).
    pub fn key_storable(&self, key: &str) -> bool {
        if self.local_root.is_none() {
            return true;
        }
        key.split('/').all(|seg| match seg.rsplit_once('#') {
            Some((_, digits)) => digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()),
            None => true,
        })
    }

    /// Whether this is a local-directory bucket (`file://`), where directory markers are
    /// real directories.
    pub fn is_local(&self) -> bool {
        self.local_root.is_some()
    }

    /// Local bucket: every directory strictly under `dir_key` (keys); object stores: none (their markers are objects, listed by
    /// [`Bucket::list_all`]). A missing directory has none.
    pub fn local_dirs_under(&self, dir_key: &str) -> Result<Vec<String>> {
        let Some(root) = &self.local_root else {
            return Ok(Vec::new());
        };
        if self.local_symlink(dir_key, true).is_some() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut stack = vec![dir_key.to_string()];
        while let Some(d) = stack.pop() {
            let rd = match std::fs::read_dir(root.join(&d)) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => continue,
                Err(e) => return Err(e.into()),
            };
            for e in rd {
                let e = e?;
                if e.file_type()?.is_dir() {
                    let Some(name) = e.file_name().to_str().map(str::to_string) else {
                        continue;
                    };
                    let k = format!("{d}/{name}");
                    out.push(k.clone());
                    stack.push(k);
                }
            }
        }
        Ok(out)
    }

    /// `file://` buckets: the first symbolic link on the way from the bucket directory to
    /// `key` (its parent directories, and with `whole` the key's own entry), if any.
    /// deskfs never follows one: a link planted in the bucket directory (by another tool)
    /// could lead a write, a delete or a read outside it. Object stores: `None`.
    fn local_symlink(&self, key: &str, whole: bool) -> Option<PathBuf> {
        let root = self.local_root.as_ref()?;
        let parts: Vec<&str> = key.split('/').filter(|c| !c.is_empty()).collect();
        let upto = if whole {
            parts.len()
        } else {
            parts.len().saturating_sub(1)
        };
        let mut p = root.clone();
        for c in &parts[..upto] {
            p.push(c);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => return Some(p),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }

    /// [`Bucket::local_symlink`] as an error, for a write or a delete at `key`.
    /// Errors: [`BucketError::Config`] naming the link.
    fn refuse_symlink(&self, key: &str, whole: bool) -> Result<()> {
        match self.local_symlink(key, whole) {
            Some(link) => Err(BucketError::Config(format!(
                "bucket key {key:?} passes through the symbolic link {}, which deskfs does not follow (it may lead outside the bucket directory); remove or replace the link",
                link.display()
            ))),
            None => Ok(()),
        }
    }

    /// Whether this is an Azure Blob container (`az://`), whose directory markers are
    /// blobs without the trailing `/` (see [`Bucket::put_dir_marker`]).
    pub fn is_azure(&self) -> bool {
        self.spec.scheme == Some(Scheme::Azure)
    }

    /// The store path of the directory marker of `dir_key`: `dir_key/` (S3, GCS), or on
    /// Azure `dir_key` itself. object_store's Azure client builds its URLs from the
    /// path's segments and drops an empty last one, so `dir/` cannot be written there;
    /// Azure's own tools (Storage Explorer, blobfuse, ABFS) mark a directory with a blob
    /// of its name carrying the metadata `hdi_isfolder=true`, which deskfs writes too.
    fn marker_path(&self, dir_key: &str) -> Result<Path> {
        let p = self.path(dir_key)?;
        Ok(if self.is_azure() { p } else { p.join("") })
    }

    /// Azure: whether the object at `p` is a directory marker (`hdi_isfolder=true`).
    async fn azure_is_folder(&self, p: &Path) -> Result<Option<ObjectInfo>> {
        let key = self.rel_key(p);
        let info = self.head_at_raw(p, key).await?;
        Ok(info.filter(|(_, folder)| *folder).map(|(i, _)| i))
    }

    /// Whether objects carry user metadata (false for `file://`).
    pub fn supports_metadata(&self) -> bool {
        self.local_root.is_none()
    }

    /// The object_store path of a key relative to the prefix. Keys must be valid object
    /// keys (UTF-8, no empty/`.`/`..` segment, no control character); the VFS escapes the
    /// others. Errors: [`BucketError::Config`] on an invalid key.
    pub fn path(&self, key: &str) -> Result<Path> {
        let full = if self.spec.prefix.is_empty() {
            key.to_string()
        } else if key.is_empty() {
            self.spec.prefix.clone()
        } else {
            format!("{}/{}", self.spec.prefix, key)
        };
        Path::parse(&full).map_err(|e| BucketError::Config(format!("invalid key {key:?}: {e}")))
    }

    fn rel_key(&self, p: &Path) -> String {
        let s = p.as_ref();
        if self.spec.prefix.is_empty() {
            s.to_string()
        } else {
            s.strip_prefix(&self.spec.prefix)
                .map(|r| r.trim_start_matches('/').to_string())
                .unwrap_or_else(|| s.to_string())
        }
    }

    /// Checks that the bucket answers and the credentials work (a one-page listing of the
    /// prefix). Errors: [`BucketError::Auth`], [`BucketError::Unreachable`],
    /// [`BucketError::Config`] (no such bucket).
    pub async fn check(&self) -> Result<()> {
        let p = self.path(crate::RESERVED_DIR)?;
        let mut s = self.store.list(Some(&p));
        if let Some(r) = s.next().await {
            r.map_err(store_err)?;
        }
        Ok(())
    }

    /// Writes a small object in one PUT. `meta` is stored as user metadata when the store
    /// supports it.
    pub async fn put_bytes(
        &self,
        key: &str,
        data: Bytes,
        meta: Option<&PosixMeta>,
    ) -> Result<PutInfo> {
        let size = data.len() as u64;
        if let Some(root) = &self.local_root {
            return self.local_put(root, key, LocalSource::Bytes(data)).await;
        }
        let opts = PutOptions {
            mode: PutMode::Overwrite,
            attributes: self.attrs(meta),
            ..Default::default()
        };
        let r = self
            .store
            .put_opts(&self.path(key)?, PutPayload::from(data), opts)
            .await
            .map_err(store_err)?;
        Ok(PutInfo {
            etag: r.e_tag,
            size,
        })
    }

    /// Writes a small object only if `cond` holds (S3 API conditional writes:
    /// `If-None-Match: *` / `If-Match: ETag`), atomically where the store supports them;
    /// on `file://` the check and the write run under an exclusive lock of the bucket
    /// directory's condition lock (so every deskfs on the host agrees). Errors:
    /// [`BucketError::Changed`] when the condition does not hold; [`BucketError::Other`]
    /// when the store has no conditional writes (then nothing was written).
    pub async fn put_bytes_if(&self, key: &str, data: Bytes, cond: PutIf) -> Result<PutInfo> {
        if let Some(root) = &self.local_root {
            let lock = LocalCondLock::take(root).await?;
            let current = self.head(key).await?.map(|h| h.etag);
            let holds = match (&cond, &current) {
                (PutIf::Absent, None) => true,
                (PutIf::Matches(want), Some(Some(have))) => want == have,
                _ => false,
            };
            if !holds {
                return Err(BucketError::Changed(key.to_string()));
            }
            let r = self.local_put(root, key, LocalSource::Bytes(data)).await;
            drop(lock);
            return r;
        }
        let size = data.len() as u64;
        let path = self.path(key)?;
        let mode = match cond {
            PutIf::Absent => PutMode::Create,
            PutIf::Matches(etag) => PutMode::Update(object_store::UpdateVersion {
                version: self.generation_if_etag(&path, key, &etag).await?,
                e_tag: Some(etag),
            }),
        };
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&path, PutPayload::from(data), opts)
            .await
        {
            Ok(r) => Ok(PutInfo {
                etag: r.e_tag,
                size,
            }),
            Err(object_store::Error::AlreadyExists { .. }) => {
                Err(BucketError::Changed(key.to_string()))
            }
            Err(e) => Err(store_err(e)),
        }
    }

    /// On GCS, the generation of the object at `path` if its ETag is `etag`, for the
    /// precondition of an update: GCS has no `If-Match` on writes, only
    /// `x-goog-if-generation-match` (object_store refuses an update without a version:
    /// "Version required for conditional update", which made every lease renewal on a
    /// `gs://` workspace fail). The HEAD checks the ETag; the generation precondition then
    /// refuses any write that came between, so the update stays atomic. `None` on other
    /// stores (they take the ETag). Errors: [`BucketError::Changed`] when the object is
    /// gone or has another ETag; the HEAD's own errors.
    async fn generation_if_etag(
        &self,
        path: &Path,
        key: &str,
        etag: &str,
    ) -> Result<Option<String>> {
        if self.spec.scheme != Some(Scheme::Gcs) {
            return Ok(None);
        }
        let meta = match self.store.head(path).await {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BucketError::Changed(key.to_string()));
            }
            Err(e) => return Err(store_err(e)),
        };
        gcs_generation_for(key, etag, meta.e_tag.as_deref(), meta.version)
    }

    /// The user metadata a put stores for `meta`: none on `file://`; on Azure under names
    /// Azure accepts (C# identifiers, see [`crate::posix::azure_metadata_name`]: a name
    /// with `-` is refused with `400 InvalidMetadata`, so every upload failed).
    fn attrs(&self, meta: Option<&PosixMeta>) -> Attributes {
        match meta {
            Some(m) if self.supports_metadata() => {
                let a = m.to_attributes();
                if self.spec.scheme == Some(Scheme::Azure) {
                    crate::posix::azure_attributes(&a)
                } else {
                    a
                }
            }
            _ => Attributes::new(),
        }
    }

    /// Part size of a multipart upload of `len` bytes: [`PART_SIZE`], or larger so the
    /// upload stays under 9,000 parts (S3 API limit: 10,000), in whole MiB.
    fn part_size(len: u64) -> u64 {
        PART_SIZE.max(len.div_ceil(9_000).div_ceil(1 << 20) << 20)
    }

    /// Memory [`Bucket::put_file`] holds at most while uploading a file of `len` bytes:
    /// the whole body below [`MULTIPART_THRESHOLD`], else [`PART_CONCURRENCY`] parts in
    /// flight and one filling; nothing for `file://` buckets (copied file to file).
    pub fn put_file_buffer_bytes(&self, len: u64) -> u64 {
        if self.local_root.is_some() {
            0
        } else if len < MULTIPART_THRESHOLD {
            len
        } else {
            Self::part_size(len) * (PART_CONCURRENCY as u64 + 1)
        }
    }

    /// Uploads the local file `src` as the object `key`: one PUT below
    /// [`MULTIPART_THRESHOLD`], else a multipart upload with [`PART_CONCURRENCY`] parts in
    /// flight. The object appears atomically when complete (S3 API semantics).
    pub async fn put_file(
        &self,
        key: &str,
        src: &FsPath,
        meta: Option<&PosixMeta>,
    ) -> Result<PutInfo> {
        if let Some(root) = &self.local_root {
            return self
                .local_put(root, key, LocalSource::File(src.to_path_buf()))
                .await;
        }
        let mut f = tokio::fs::File::open(src).await?;
        let len = f.metadata().await?.len();
        if len < MULTIPART_THRESHOLD {
            let mut buf = Vec::with_capacity(len as usize);
            f.read_to_end(&mut buf).await?;
            return self.put_bytes(key, Bytes::from(buf), meta).await;
        }
        let part = Self::part_size(len) as usize;
        let opts = PutMultipartOptions {
            attributes: self.attrs(meta),
            ..Default::default()
        };
        let upload = self
            .store
            .put_multipart_opts(&self.path(key)?, opts)
            .await
            .map_err(store_err)?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, part);
        let mut buf = vec![0u8; 1 << 20];
        let mut sent = 0u64;
        loop {
            let n = f.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            if let Err(e) = w.wait_for_capacity(PART_CONCURRENCY).await {
                return Err(store_err(e));
            }
            w.write(&buf[..n]);
            sent += n as u64;
        }
        let r = w.finish().await.map_err(store_err)?;
        Ok(PutInfo {
            etag: r.e_tag,
            size: sent,
        })
    }

    /// Writes the directory marker of `dir_key`: the empty object `dir_key/` on object
    /// stores (s3fs convention), a real directory for `file://`.
    pub async fn put_dir_marker(&self, dir_key: &str, meta: Option<&PosixMeta>) -> Result<PutInfo> {
        if let Some(root) = &self.local_root {
            self.refuse_symlink(dir_key, true)?;
            std::fs::create_dir_all(root.join(dir_key))?;
            return Ok(PutInfo {
                etag: None,
                size: 0,
            });
        }
        let p = self.marker_path(dir_key)?;
        let mut attributes = self.attrs(meta);
        if self.is_azure() {
            attributes.insert(
                object_store::Attribute::Metadata(AZURE_FOLDER.into()),
                "true".into(),
            );
        }
        let opts = PutOptions {
            attributes,
            ..Default::default()
        };
        let r = self
            .store
            .put_opts(&p, PutPayload::default(), opts)
            .await
            .map_err(store_err)?;
        Ok(PutInfo {
            etag: r.e_tag,
            size: 0,
        })
    }

    /// Metadata of the directory marker of `dir_key` (the object `dir_key/`), or `None`
    /// when there is none (always `None` for `file://`, whose markers are directories).
    pub async fn head_dir_marker(&self, dir_key: &str) -> Result<Option<ObjectInfo>> {
        if self.local_root.is_some() {
            return Ok(None);
        }
        let p = self.marker_path(dir_key)?;
        if self.is_azure() {
            // A blob of the directory's name is its marker only with hdi_isfolder.
            return Ok(self.azure_is_folder(&p).await?.map(|mut i| {
                i.key = format!("{dir_key}/");
                i
            }));
        }
        self.head_at(&p, format!("{dir_key}/")).await
    }

    /// Removes the directory marker of `dir_key` (for `file://`: the directory, once empty;
    /// a non-empty one is left and reported as [`BucketError::Other`] so it is retried).
    pub async fn delete_dir_marker(&self, dir_key: &str) -> Result<()> {
        if let Some(root) = &self.local_root {
            self.refuse_symlink(dir_key, false)?;
            return match std::fs::remove_dir(root.join(dir_key)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Err(
                    BucketError::Other(format!("directory {dir_key} not empty yet in the bucket")),
                ),
                Err(e) => Err(e.into()),
            };
        }
        let p = self.marker_path(dir_key)?;
        if self.is_azure() && self.azure_is_folder(&p).await?.is_none() {
            return Ok(()); // no marker: a blob of that name is a file, not ours to remove
        }
        match self.store.delete(&p).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_err(e)),
        }
    }

    /// Deletes the object `key`; a missing object is not an error. (For `file://`, parent
    /// directories stay: they are the directory markers, removed with
    /// [`Bucket::delete_dir_marker`]; on Azure a directory marker at `key` is left too.)
    pub async fn delete(&self, key: &str) -> Result<()> {
        // (A link at `key` itself is removed as the entry it is, never followed.)
        self.refuse_symlink(key, false)?;
        let p = self.path(key)?;
        if self.is_azure() && self.azure_is_folder(&p).await?.is_some() {
            // On Azure a directory's marker has the key of a file of the same name: a
            // file replaced by a directory must not take the new marker with it
            // (`delete_dir_marker` removes markers).
            return Ok(());
        }
        match self.store.delete(&p).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_err(e)),
        }
        Ok(())
    }

    /// Server-side copy of `from` to `to` (metadata copied with it).
    pub async fn copy(&self, from: &str, to: &str) -> Result<()> {
        if let Some(root) = &self.local_root {
            if self.local_symlink(from, true).is_some() {
                return Err(BucketError::NotFound(format!("{from} (a symbolic link)")));
            }
            self.local_put(root, to, LocalSource::File(root.join(from)))
                .await?;
            return Ok(());
        }
        self.store
            .copy(&self.path(from)?, &self.path(to)?)
            .await
            .map_err(store_err)
    }

    /// Reads `range` (bytes) of `key`. With `etag`, fails with [`BucketError::Changed`]
    /// when the object no longer has that ETag (so a read never mixes two versions).
    pub async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        etag: Option<&str>,
    ) -> Result<Bytes> {
        if range.start >= range.end {
            return Ok(Bytes::new());
        }
        if self.local_symlink(key, true).is_some() {
            return Err(BucketError::NotFound(format!("{key} (a symbolic link)")));
        }
        let path = self.path(key)?;
        self.reads
            .run("get", || async {
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(range.clone())),
                    if_match: etag.map(str::to_string),
                    ..Default::default()
                };
                let r = self.store.get_opts(&path, opts).await.map_err(store_err)?;
                r.bytes().await.map_err(store_err)
            })
            .await
    }

    /// Requests made through this bucket (and its clones) so far, by kind and answer.
    pub fn request_counts(&self) -> Vec<crate::RequestCount> {
        self.requests.snapshot()
    }

    /// Counts of reads tried again after a transient failure, and of reads that failed
    /// after their last try, since the bucket was opened (see [`crate::read_retry`]).
    pub fn read_counters(&self) -> crate::ReadCounters {
        self.reads.counters()
    }

    /// Metadata of `key`, or `None` if it does not exist.
    pub async fn head(&self, key: &str) -> Result<Option<ObjectInfo>> {
        if self.local_symlink(key, true).is_some() {
            return Ok(None);
        }
        self.head_at(&self.path(key)?, key.to_string()).await
    }

    /// HEAD of the object at store path `p`, reported under `key`.
    async fn head_at(&self, p: &Path, key: String) -> Result<Option<ObjectInfo>> {
        self.reads
            .run("head", || self.head_once(p, key.clone()))
            .await
    }

    /// One try of [`Bucket::head_at`].
    async fn head_once(&self, p: &Path, key: String) -> Result<Option<ObjectInfo>> {
        Ok(self.head_once_raw(p, key).await?.map(|(i, _)| i))
    }

    /// [`Bucket::head_at`], with whether the object is an Azure directory marker
    /// (metadata `hdi_isfolder=true`).
    async fn head_at_raw(&self, p: &Path, key: String) -> Result<Option<(ObjectInfo, bool)>> {
        self.reads
            .run("head", || self.head_once_raw(p, key.clone()))
            .await
    }

    async fn head_once_raw(&self, p: &Path, key: String) -> Result<Option<(ObjectInfo, bool)>> {
        let opts = GetOptions {
            head: true,
            ..Default::default()
        };
        match self.store.get_opts(p, opts).await {
            Ok(r) => {
                let mtime_ns = to_ns_meta(&r.meta);
                let folder = r.attributes.iter().any(|(k, v)| {
                    matches!(k, object_store::Attribute::Metadata(n) if n.eq_ignore_ascii_case(AZURE_FOLDER))
                        && v.as_ref().eq_ignore_ascii_case("true")
                });
                Ok(Some((
                    ObjectInfo {
                        key,
                        size: r.meta.size,
                        etag: r.meta.e_tag.clone(),
                        mtime_ns,
                        posix: PosixMeta::from_attributes(&r.attributes, mtime_ns),
                    },
                    folder,
                )))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_err(e)),
        }
    }

    /// Lists the direct children of directory `dir_key` ("" = the workspace root).
    /// Pagination of large listings is done by the store client (S3 continuation tokens).
    /// The directory's own marker is not reported.
    pub async fn list_dir(&self, dir_key: &str) -> Result<Listing> {
        if self.local_symlink(dir_key, true).is_some() {
            return Ok(Listing::default());
        }
        let base = self.path(dir_key)?;
        let prefix = (!base.as_ref().is_empty()).then_some(&base);
        // `file://`: one entry whose name is no object key (a newline, a byte that is not
        // UTF-8, ... put there by another tool) fails object_store's whole listing; the
        // others are then listed one by one, without it (not retried: it stays).
        let local = self.local_root.is_some();
        let r = self
            .reads
            .run("list", || async {
                self.store
                    .list_with_delimiter(prefix)
                    .await
                    .map_err(|e| match e.to_string() {
                        m if local && m.contains("invalid path") => {
                            BucketError::Config(format!("{LOCAL_BAD_NAME}{m}"))
                        }
                        _ => store_err(e),
                    })
            })
            .await;
        let r = match r {
            Err(BucketError::Config(m)) if m.starts_with(LOCAL_BAD_NAME) => {
                tracing::warn!(dir = dir_key, error = %m, "a name in the bucket directory is no object key; it is left out");
                return self.local_list_dir_by_entry(dir_key).await;
            }
            other => other?,
        };
        let base_s = self.rel_key(&base);
        let name_of = |rel: &str| -> Option<String> {
            let tail = if base_s.is_empty() {
                rel
            } else {
                rel.strip_prefix(&base_s)?.strip_prefix('/')?
            };
            if tail.is_empty() || tail.contains('/') {
                None
            } else {
                Some(tail.to_string())
            }
        };
        let mut out = Listing::default();
        // (`file://`: an entry that is a symbolic link is not an object. The directory's
        // own path was checked above: one `lstat` of the entry itself suffices.)
        let link = |rel: &str| {
            self.local_root.as_ref().is_some_and(|root| {
                std::fs::symlink_metadata(root.join(rel)).is_ok_and(|m| m.file_type().is_symlink())
            })
        };
        for d in r.common_prefixes {
            let rel = self.rel_key(&d);
            if let Some(n) = name_of(&rel).filter(|_| !link(&rel)) {
                out.dirs.push(n);
            }
        }
        for o in r.objects {
            let rel = self.rel_key(&o.location);
            if self.is_azure() && o.size == 0 {
                // An empty blob may be a directory marker (`hdi_isfolder`, which listings
                // do not carry): one HEAD tells.
                if let Some(n) = name_of(&rel) {
                    if self.azure_is_folder(&o.location).await?.is_some() {
                        if !out.dirs.contains(&n) {
                            out.dirs.push(n);
                        }
                        continue;
                    }
                }
            }
            if let Some(n) = name_of(&rel).filter(|_| !link(&rel)) {
                let mtime_ns = to_ns_meta(&o);
                out.files.push((
                    n,
                    ObjectInfo {
                        key: rel,
                        size: o.size,
                        etag: o.e_tag,
                        mtime_ns,
                        posix: None,
                    },
                ));
            }
        }
        Ok(out)
    }

    /// [`Bucket::list_dir`] of a `file://` bucket, entry by entry: names that are no
    /// object key and symbolic links are left out, each file is asked for as
    /// [`Bucket::head`] does (the same ETag). Errors: the directory's read (`Io`).
    async fn local_list_dir_by_entry(&self, dir_key: &str) -> Result<Listing> {
        let Some(root) = &self.local_root else {
            return Ok(Listing::default());
        };
        let rd = match std::fs::read_dir(root.join(dir_key)) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Listing::default()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Listing::default();
        for e in rd {
            let e = e?;
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let key = if dir_key.is_empty() {
                name.clone()
            } else {
                format!("{dir_key}/{name}")
            };
            let Ok(p) = self.path(&key) else { continue };
            if self.rel_key(&p) != key {
                continue;
            }
            let ft = e.file_type()?;
            if ft.is_dir() {
                out.dirs.push(name);
            } else if ft.is_file() {
                if let Some(info) = self.head_at(&p, key).await? {
                    out.files.push((name, info));
                }
            }
        }
        Ok(out)
    }

    /// Every object under `dir_key/` recursively (used by fsck and tests).
    pub async fn list_all(&self, dir_key: &str) -> Result<Vec<ObjectInfo>> {
        let base = self.path(dir_key)?;
        let prefix = (!base.as_ref().is_empty()).then_some(&base);
        self.reads
            .run("list", || async {
                let mut s = self.store.list(prefix);
                let mut out = Vec::new();
                while let Some(o) = s.next().await {
                    let o = o.map_err(store_err)?;
                    let key = self.rel_key(&o.location);
                    if self.local_symlink(&key, true).is_some() {
                        continue;
                    }
                    let mtime_ns = to_ns_meta(&o);
                    out.push(ObjectInfo {
                        key,
                        size: o.size,
                        etag: o.e_tag,
                        mtime_ns,
                        posix: None,
                    });
                }
                Ok(out)
            })
            .await
    }
}

/// The condition of [`Bucket::put_bytes_if`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutIf {
    /// Only if no object exists at the key (`If-None-Match: *`).
    Absent,
    /// Only if the object has this ETag (`If-Match`).
    Matches(String),
}

/// An exclusive `flock` on the local bucket's condition lock file
/// (`.deskfs/tmp/cond.lock`), held across a conditional write's check and write.
struct LocalCondLock {
    /// Held open for the lock's life; closing it releases the lock.
    _file: File,
}

impl LocalCondLock {
    async fn take(root: &FsPath) -> Result<LocalCondLock> {
        let dir = root.join(LOCAL_TMP);
        tokio::task::spawn_blocking(move || -> std::io::Result<LocalCondLock> {
            use std::os::fd::AsRawFd;
            std::fs::create_dir_all(&dir)?;
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join("cond.lock"))?;
            // SAFETY: flock on a descriptor we own; released when the file is closed.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(LocalCondLock { _file: f })
        })
        .await
        .map_err(|e| BucketError::Other(e.to_string()))?
        .map_err(BucketError::from)
    }
}

/// What a local-bucket write copies from.
enum LocalSource {
    Bytes(Bytes),
    File(PathBuf),
}

/// Directory (under the local bucket root) of in-flight writes: `<pid>-<n>` files.
const LOCAL_TMP: &str = ".deskfs/tmp";

static LOCAL_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Bucket {
    /// Writes an object of the local bucket: data goes to `.deskfs/tmp/<pid>-<n>`, is
    /// fsynced, then renamed into place (and the directory fsynced), so a crash leaves
    /// either the old or the new object, never a partial one, and no stray temp file
    /// in the tree (leftovers of dead processes are removed at open).
    /// The ETag to record for the object `key` just written from the file `ours`.
    ///
    /// The local store's ETag starts with the file's inode number (hex), so it tells
    /// whose file is in place. Another put of the same key may have replaced ours since
    /// the rename (two mounts sharing a cache dir upload the same content): when the file
    /// in place holds the same bytes, its ETag is as good as ours; otherwise ours gets an
    /// ETag no object has, so a conditional read of it fails as `Changed` instead of
    /// returning other bytes.
    async fn local_etag(&self, root: &FsPath, key: &str, ours: File) -> Result<Option<String>> {
        use std::os::unix::fs::MetadataExt;
        let mine = ours.metadata()?.ino();
        let dest = root.join(key);
        let ours = Arc::new(ours);
        for _ in 0..3 {
            let Some(etag) = self.head(key).await?.and_then(|h| h.etag) else {
                break;
            };
            if etag.starts_with(&format!("\"{mine:x}-")) {
                return Ok(Some(etag));
            }
            let (o, d) = (ours.clone(), dest.clone());
            let same = tokio::task::spawn_blocking(move || -> std::io::Result<Option<u64>> {
                let other = File::open(&d)?;
                let ino = other.metadata()?.ino();
                Ok(same_bytes(&o, &other)?.then_some(ino))
            })
            .await
            .map_err(|e| BucketError::Other(e.to_string()))??;
            match same {
                Some(ino) if etag.starts_with(&format!("\"{ino:x}-")) => return Ok(Some(etag)),
                Some(_) => continue, // replaced again meanwhile: look once more
                None => break,
            }
        }
        Ok(Some(format!("\"{mine:x}-replaced\"")))
    }

    async fn local_put(&self, root: &FsPath, key: &str, src: LocalSource) -> Result<PutInfo> {
        // (A link at `key` itself is replaced by the rename, never written through.)
        self.refuse_symlink(key, false)?;
        let root = root.to_path_buf();
        let dest = root.join(key);
        let base = root.clone();
        let (size, ours) = tokio::task::spawn_blocking(move || -> std::io::Result<(u64, File)> {
            use std::io::Write;
            let tmpdir = root.join(LOCAL_TMP);
            std::fs::create_dir_all(&tmpdir)?;
            let n = LOCAL_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = tmpdir.join(format!("{}-{n}", std::process::id()));
            let size = match src {
                LocalSource::Bytes(b) => {
                    let mut f = File::create(&tmp)?;
                    f.write_all(&b)?;
                    f.sync_data()?;
                    b.len() as u64
                }
                LocalSource::File(p) => {
                    let size = std::fs::copy(&p, &tmp)?;
                    File::open(&tmp)?.sync_data()?;
                    size
                }
            };
            let parent = dest
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or(root.clone());
            std::fs::create_dir_all(&parent)?;
            let ours = File::open(&tmp)?;
            if let Err(e) = std::fs::rename(&tmp, &dest) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            File::open(&parent)?.sync_all()?;
            Ok((size, ours))
        })
        .await
        .map_err(|e| BucketError::Other(e.to_string()))??;
        let etag = self.local_etag(&base, key, ours).await?;
        Ok(PutInfo { etag, size })
    }
}

/// Whether two open files hold the same bytes (read in 1 MiB pieces).
fn same_bytes(a: &File, b: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let (la, lb) = (a.metadata()?.len(), b.metadata()?.len());
    if la != lb {
        return Ok(false);
    }
    let mut off = 0u64;
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    while off < la {
        let n = ((la - off) as usize).min(x.len());
        a.read_exact_at(&mut x[..n], off)?;
        b.read_exact_at(&mut y[..n], off)?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
        off += n as u64;
    }
    Ok(true)
}

/// Removes in-flight write files of processes that no longer exist.
fn clean_local_tmp(root: &FsPath) {
    let Ok(rd) = std::fs::read_dir(root.join(LOCAL_TMP)) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if name == "cond.lock" {
            continue; // the conditional-write lock (see `LocalCondLock`), never a leftover
        }
        let pid = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn to_ns_meta(m: &object_store::ObjectMeta) -> i64 {
    m.last_modified.timestamp_nanos_opt().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> (tempfile::TempDir, Bucket) {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = BucketSpec::parse(&format!("file://{}", dir.path().display())).expect("spec");
        let b = Bucket::open(&spec, true).expect("open");
        (dir, b)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// A name another tool gave a file in a `file://` bucket directory that is no object
    /// key (a newline, a tab, a byte that is not UTF-8) is left out of the listing of its
    /// directory, and every other entry is listed, files with the ETag a head gives.
    /// Before, object_store's listing failed whole: the directory answered `EIO`.
    #[test]
    fn a_name_that_is_no_key_leaves_the_rest_of_its_directory_listed() {
        use std::os::unix::ffi::OsStrExt;
        let (d, b) = local();
        let sub = d.path().join("sub");
        std::fs::create_dir_all(sub.join("inner")).unwrap();
        std::fs::write(sub.join("good"), b"good").unwrap();
        for bad in [&b"nl\nname"[..], b"tab\there", b"bad\xff"] {
            std::fs::write(sub.join(std::ffi::OsStr::from_bytes(bad)), b"x").unwrap();
        }
        rt().block_on(async {
            let l = b.list_dir("sub").await.expect("listed");
            let names: Vec<&str> = l.files.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, vec!["good"]);
            assert_eq!(l.dirs, vec!["inner".to_string()]);
            let head = b.head("sub/good").await.unwrap().expect("head");
            assert_eq!(l.files[0].1.etag, head.etag);
            assert_eq!(l.files[0].1.size, 4);
            assert_eq!(l.files[0].1.key, "sub/good");
        });
    }

    /// Symbolic links planted in a `file://` bucket directory are never followed: no
    /// write, delete or read goes through one to what lies outside, listings leave them
    /// out, and a link at a key itself is replaced or removed as the entry it is.
    #[test]
    fn symlinks_in_a_local_bucket_lead_nowhere_outside_it() {
        let (d, b) = local();
        let outside = tempfile::tempdir().expect("tempdir");
        let out = outside.path();
        std::fs::write(out.join("of"), b"outside").unwrap();
        std::os::unix::fs::symlink(out, d.path().join("dlnk")).unwrap();
        std::os::unix::fs::symlink(out.join("of"), d.path().join("flnk")).unwrap();
        let cdata = || Bytes::from_static(b"new");
        rt().block_on(async {
            b.put_bytes("inside", cdata(), None).await.unwrap();
            let r = b.put_bytes("dlnk/new", cdata(), None).await;
            assert!(
                matches!(&r, Err(BucketError::Config(m)) if m.contains("symbolic link")),
                "{r:?}"
            );
            assert!(b.copy("inside", "dlnk/copy").await.is_err());
            assert!(b.put_dir_marker("dlnk/sub", None).await.is_err());
            assert!(b.delete("dlnk/of").await.is_err());
            assert!(matches!(
                b.get_range("dlnk/of", 0..3, None).await,
                Err(BucketError::NotFound(_))
            ));
            assert!(matches!(
                b.get_range("flnk", 0..3, None).await,
                Err(BucketError::NotFound(_))
            ));
            assert!(b.head("flnk").await.unwrap().is_none());
            assert!(b.head("dlnk/of").await.unwrap().is_none());
            assert!(matches!(
                b.copy("flnk", "stolen").await,
                Err(BucketError::NotFound(_))
            ));
            let l = b.list_dir("").await.unwrap();
            let names: Vec<&str> = l.files.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, vec!["inside"], "links are not listed");
            assert!(!l.dirs.iter().any(|d| d == "dlnk"), "{:?}", l.dirs);
            let l = b.list_dir("dlnk").await.unwrap();
            assert!(l.files.is_empty() && l.dirs.is_empty());
            let all: Vec<String> = b
                .list_all("")
                .await
                .unwrap()
                .into_iter()
                .map(|o| o.key)
                .collect();
            assert!(
                all.iter().all(|k| !k.starts_with("dlnk") && k != "flnk"),
                "{all:?}"
            );
            assert!(b.local_dirs_under("dlnk").unwrap().is_empty());
            // A link at the key itself: removed or replaced, never followed.
            b.put_bytes("flnk", cdata(), None).await.unwrap();
            assert!(!std::fs::symlink_metadata(d.path().join("flnk"))
                .unwrap()
                .is_symlink());
            std::os::unix::fs::symlink(out.join("of"), d.path().join("flnk2")).unwrap();
            b.delete("flnk2").await.unwrap();
            assert!(std::fs::symlink_metadata(d.path().join("flnk2")).is_err());
        });
        let mut left: Vec<String> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec!["of"], "nothing written or removed outside");
        assert_eq!(std::fs::read(out.join("of")).unwrap(), b"outside");
    }

    /// A GCS bucket on a custom endpoint with no credential is refused with one line
    /// instead of waiting on the GCE metadata service; Google's endpoint is left alone.
    #[test]
    fn gcs_custom_endpoint_needs_credentials() {
        let spec = BucketSpec::parse("gs://bk/p").expect("spec");
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let why =
            gcs_credentials_missing(&spec, env(&[("GOOGLE_BASE_URL", "http://127.0.0.1:4443")]));
        let why = why.expect("refused");
        assert!(
            why.contains("gs://bk") && why.contains("GOOGLE_SERVICE_ACCOUNT_KEY"),
            "{why}"
        );
        assert!(!why.contains('\n'));
        for ok in [
            &[
                ("GOOGLE_BASE_URL", "http://127.0.0.1:4443"),
                ("GOOGLE_SERVICE_ACCOUNT_KEY", "{}"),
            ][..],
            &[
                ("GOOGLE_BASE_URL", "http://127.0.0.1:4443"),
                ("GOOGLE_SKIP_SIGNATURE", "true"),
            ][..],
            &[][..],
        ] {
            let vars: &'static [(&'static str, &'static str)] = ok;
            assert_eq!(gcs_credentials_missing(&spec, env(vars)), None, "{vars:?}");
        }
        // gcloud's application default credentials under HOME count as credentials.
        let home = tempfile::tempdir().expect("tempdir");
        let h = home.path().display().to_string();
        let with_home = |k: &str| match k {
            "GOOGLE_BASE_URL" => Some("http://127.0.0.1:4443".to_owned()),
            "HOME" => Some(h.clone()),
            _ => None,
        };
        assert!(gcs_credentials_missing(&spec, with_home).is_some());
        let dir = home.path().join(".config/gcloud");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("application_default_credentials.json"), "{}").expect("write");
        assert_eq!(gcs_credentials_missing(&spec, with_home), None);
    }

    /// GCS has no `If-Match` on writes: a conditional update names the generation the
    /// HEAD found with the wanted ETag, and a changed object is `Changed` before any write.
    #[test]
    fn gcs_update_names_the_generation_of_the_wanted_etag() {
        let r = gcs_generation_for("k", "\"e1\"", Some("\"e1\""), Some("1700".into()));
        assert_eq!(r.ok().flatten().as_deref(), Some("1700"));
        let r = gcs_generation_for("k", "\"e1\"", Some("\"e2\""), Some("1800".into()));
        assert!(matches!(r, Err(BucketError::Changed(k)) if k == "k"));
        let r = gcs_generation_for("k", "\"e1\"", Some("\"e1\""), None);
        assert!(matches!(r, Err(BucketError::Other(_))), "{r:?}");
    }

    /// A read that names the ETag of a replaced object fails as `Changed` instead of
    /// returning the new object's bytes (the local store too: a reader on another cache
    /// must never mix versions).
    #[test]
    fn conditional_read_refuses_a_replaced_object() {
        let (_d, b) = local();
        rt().block_on(async {
            let one = b
                .put_bytes("k", Bytes::from_static(b"one"), None)
                .await
                .unwrap();
            let two = b
                .put_bytes("k", Bytes::from_static(b"two!"), None)
                .await
                .unwrap();
            assert_ne!(one.etag, two.etag);
            let r = b.get_range("k", 0..3, one.etag.as_deref()).await;
            assert!(matches!(r, Err(BucketError::Changed(_))), "{r:?}");
            let r = b.get_range("k", 0..4, two.etag.as_deref()).await.unwrap();
            assert_eq!(&r[..], b"two!");
        });
    }

    /// Two puts of one key racing (two mounts sharing a cache dir upload the same
    /// content): the one whose file was replaced records an ETag that reads the file in
    /// place when it holds the same bytes, and one no object has when it does not.
    #[test]
    fn etag_of_a_put_replaced_by_another() {
        let (d, b) = local();
        let root = d.path().to_path_buf();
        rt().block_on(async {
            b.put_bytes("k", Bytes::from_static(b"same"), None)
                .await
                .unwrap();
            // Our put's file, then replaced in place by another with the same bytes.
            let ours = File::open(root.join("k")).unwrap();
            std::fs::write(root.join("k.other"), b"same").unwrap();
            std::fs::rename(root.join("k.other"), root.join("k")).unwrap();
            let e = b.local_etag(&root, "k", ours).await.unwrap();
            let r = b.get_range("k", 0..4, e.as_deref()).await.unwrap();
            assert_eq!(&r[..], b"same");
            // Now replaced by other bytes: our ETag must not read them.
            let ours = File::open(root.join("k")).unwrap();
            std::fs::write(root.join("k.other"), b"diff").unwrap();
            std::fs::rename(root.join("k.other"), root.join("k")).unwrap();
            let e = b.local_etag(&root, "k", ours).await.unwrap();
            let r = b.get_range("k", 0..4, e.as_deref()).await;
            assert!(matches!(r, Err(BucketError::Changed(_))), "{r:?}");
        });
    }

    #[test]
    fn s3_without_credentials_is_refused_before_any_request() {
        let spec = BucketSpec::parse("s3://b").unwrap();
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let why = s3_credentials_missing(&spec, true, env(&[])).expect("refused");
        assert!(why.contains("AWS_ACCESS_KEY_ID"), "{why}");
        let empty = env(&[("AWS_ACCESS_KEY_ID", "")]);
        assert!(s3_credentials_missing(&spec, true, empty).is_some());
        let keys = env(&[("AWS_ACCESS_KEY_ID", "k")]);
        assert!(s3_credentials_missing(&spec, true, keys).is_none());
        let web = env(&[("AWS_WEB_IDENTITY_TOKEN_FILE", "/t")]);
        assert!(s3_credentials_missing(&spec, true, web).is_none());
        // AWS itself: instance-metadata credentials, unless turned off.
        assert!(s3_credentials_missing(&spec, false, env(&[])).is_none());
        let off = env(&[("AWS_EC2_METADATA_DISABLED", "TRUE")]);
        assert!(s3_credentials_missing(&spec, false, off).is_some());
    }

    fn env_of(pairs: &[(&str, &str)]) -> (Vec<String>, impl Fn(&str) -> Option<String>) {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let names = owned.iter().map(|(k, _)| k.clone()).collect();
        (names, move |k: &str| {
            owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    const KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    /// Azure credentials: no account, or an account on a custom endpoint (Azurite) with
    /// no key, is refused with one line naming the variables, before any request; the
    /// separate variables, a connection string and the emulator switch each suffice.
    #[test]
    fn azure_credentials_come_from_the_standard_variables() {
        use object_store::azure::AzureConfigKey as K;
        let spec = BucketSpec::parse("az://c/p").unwrap();
        let refused = |pairs: &[(&str, &str)]| {
            let (n, e) = env_of(pairs);
            match azure_builder(&spec, n, e) {
                Err(BucketError::Config(m)) => m,
                Ok(_) => panic!("accepted: {pairs:?}"),
                Err(other) => panic!("{other:?}"),
            }
        };
        let m = refused(&[]);
        assert!(
            m.contains("AZURE_STORAGE_ACCOUNT_NAME") && !m.contains('\n'),
            "{m}"
        );
        let m = refused(&[
            ("AZURE_STORAGE_ACCOUNT_NAME", "a"),
            ("AZURE_STORAGE_ENDPOINT", "http://127.0.0.1:10000/a"),
        ]);
        assert!(m.contains("AZURE_STORAGE_ACCOUNT_KEY"), "{m}");
        let m = refused(&[("AZURE_STORAGE_CONNECTION_STRING", "AccountName=a;oops")]);
        assert!(m.contains("part 2") && !m.contains("oops"), "{m}");

        let (n, e) = env_of(&[
            ("AZURE_STORAGE_ACCOUNT_NAME", "a"),
            ("AZURE_STORAGE_ACCOUNT_KEY", KEY),
            ("AZURE_STORAGE_ENDPOINT", "http://127.0.0.1:10000/a"),
        ]);
        let b = azure_builder(&spec, n, e).expect("keys");
        assert_eq!(b.get_config_value(&K::AccessKey).as_deref(), Some(KEY));
        assert!(b.build().is_ok());

        let cs = format!("DefaultEndpointsProtocol=http;AccountName=acc;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:10000/acc/;");
        let (n, e) = env_of(&[("AZURE_STORAGE_CONNECTION_STRING", &cs)]);
        let b = azure_builder(&spec, n, e).expect("connection string");
        assert_eq!(b.get_config_value(&K::AccountName).as_deref(), Some("acc"));
        assert_eq!(
            b.get_config_value(&K::Endpoint).as_deref(),
            Some("http://127.0.0.1:10000/acc")
        );
        // The separate variable wins over the connection string.
        let (n, e) = env_of(&[
            ("AZURE_STORAGE_CONNECTION_STRING", &cs),
            ("AZURE_STORAGE_ACCOUNT_NAME", "other"),
        ]);
        let b = azure_builder(&spec, n, e).unwrap();
        assert_eq!(
            b.get_config_value(&K::AccountName).as_deref(),
            Some("other")
        );
        // Without BlobEndpoint: protocol and suffix make the endpoint.
        let v = azure_connection_string(
            "DefaultEndpointsProtocol=http;AccountName=x;EndpointSuffix=example.test",
        )
        .unwrap();
        assert!(
            v.contains(&(K::Endpoint, "http://x.blob.example.test".into())),
            "{v:?}"
        );

        let (n, e) = env_of(&[("AZURE_STORAGE_USE_EMULATOR", "true")]);
        assert!(azure_builder(&spec, n, e).is_ok());
    }
}
