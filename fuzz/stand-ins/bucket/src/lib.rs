//! Stand-in for `deskfs-bucket` in the fuzz targets: `crates/backup/src/layout.rs` imports
//! [`Bucket`] for `generations`, which lists the bucket; the targets run only its pure
//! key functions (`parse_key`, `snapshot_key`, `delta_key`), so this bucket lists nothing.

/// An object as listed.
pub struct ObjectInfo {
    /// Key relative to the workspace prefix.
    pub key: String,
    /// Size, bytes.
    pub size: u64,
}

/// A bucket error (never produced here).
#[derive(Debug)]
pub struct BucketError;

impl std::fmt::Display for BucketError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bucket error")
    }
}

impl std::error::Error for BucketError {}

/// A bucket that holds nothing.
pub struct Bucket;

impl Bucket {
    /// Every object under `dir_key` (none).
    pub async fn list_all(&self, _dir_key: &str) -> Result<Vec<ObjectInfo>, BucketError> {
        Ok(Vec::new())
    }
}
