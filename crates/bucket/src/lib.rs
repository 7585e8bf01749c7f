//! The bucket layer of deskfs.
//!
//! One workspace path is one object: the file `a/b.txt` is the object `<prefix>/a/b.txt`
//! holding the whole content, so any S3 tool sees the workspace as plain files. POSIX
//! attributes ride in object user metadata under the names s3fs-fuse uses
//! (`x-amz-meta-mode`, `-uid`, `-gid`, `-mtime`, `-atime`, `-ctime`, see [`posix`]); empty
//! directories are `dir/` marker objects (on Azure, which refuses metadata names that are
//! not identifiers and whose object_store client cannot write a key ending in `/`: names
//! spelled with `_`, and the blob `dir` with `hdi_isfolder=true`); symlinks are small objects whose mode has
//! `S_IFLNK` and whose body is the target.
//!
//! Everything goes through the `object_store` crate; the local-directory backend
//! (`file:///dir`) maps markers to real directories because a file system cannot hold a
//! key ending in `/`, and keeps no user metadata (the metadata engine holds the attributes).

pub mod aws_profile;
mod counting;
pub mod error;
mod http;
pub mod posix;
pub mod read_retry;
mod store;
mod url_spec;

pub use counting::{RequestCount, RequestCounters};
pub use error::BucketError;
pub use posix::PosixMeta;
pub use read_retry::ReadCounters;
pub use store::{s3_endpoint, Bucket, Listing, ObjectInfo, PutIf, PutInfo};
pub use url_spec::{BucketSpec, Scheme};

/// Result alias of the bucket layer.
pub type Result<T, E = BucketError> = std::result::Result<T, E>;

/// Key (relative to the workspace prefix) of the area reserved for deskfs: format record,
/// metadata backups, escaped names. Hidden from the mounted tree.
pub const RESERVED_DIR: &str = ".deskfs";
