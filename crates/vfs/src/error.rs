//! VFS errors and their errno.

use deskfs_bucket::BucketError;
use deskfs_cache::CacheError;
use deskfs_meta::MetaError;

/// An operation failed. [`VfsError::errno`] gives the errno a kernel file system (ext4)
/// returns in the same case; the FUSE adapter replies with it.
#[derive(Debug, thiserror::Error)]
pub enum VfsError {
    /// `ENOENT`: no such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// `EEXIST`: the name exists.
    #[error("file exists")]
    Exists,
    /// `ENOTDIR`: a directory was expected.
    #[error("not a directory")]
    NotDir,
    /// `EISDIR`: a non-directory was expected.
    #[error("is a directory")]
    IsDir,
    /// `ENOTEMPTY`: directory not empty.
    #[error("directory not empty")]
    NotEmpty,
    /// `EINVAL`: invalid argument (e.g. rename of a directory into itself).
    #[error("invalid argument")]
    Invalid,
    /// `ENAMETOOLONG`: a name longer than 255 bytes.
    #[error("file name too long")]
    NameTooLong,
    /// `EPERM`: operation not permitted (e.g. hard link to a directory).
    #[error("operation not permitted")]
    NotPermitted,
    /// `EACCES`: permission denied.
    #[error("permission denied")]
    Access,
    /// `EBADF`: unknown or wrongly opened file handle.
    #[error("bad file handle")]
    BadHandle,
    /// `ENODATA`: no such extended attribute.
    #[error("no such attribute")]
    NoAttr,
    /// `ERANGE`: buffer too small / xattr name too long.
    #[error("result out of range")]
    Range,
    /// `E2BIG`: xattr value too large.
    #[error("argument list too long")]
    TooBig,
    /// `EOPNOTSUPP`: not supported (e.g. an unsupported xattr namespace).
    #[error("operation not supported")]
    NotSupported,
    /// `EFBIG`: file too large.
    #[error("file too large")]
    FileTooBig,
    /// `EMLINK`: too many hard links (more than 65,000, as ext4).
    #[error("too many links")]
    TooManyLinks,
    /// `EAGAIN`: a lock is held by someone else (`F_SETLK`, `LOCK_NB`).
    #[error("resource temporarily unavailable")]
    WouldBlock,
    /// `EINTR`: the waiting process went away.
    #[error("interrupted")]
    Interrupted,
    /// `ENXIO`: `SEEK_DATA`/`SEEK_HOLE` at or past end of file.
    #[error("no such device or address")]
    NoSuchOffset,
    /// `ESTALE`: the inode the kernel names no longer exists (another mount removed it,
    /// or it was purged after its last name went away). The kernel then walks the path
    /// again (`LOOKUP_REVAL`), so a name replaced by a rename resolves to the new file
    /// instead of failing with `ENOENT` (NFS does the same).
    #[error("stale file handle")]
    Stale,
    /// `ENOSPC`: the cache disk is full.
    #[error("no space left on the cache device")]
    NoSpace,
    /// `EIO` from the metadata engine.
    #[error("metadata: {0}")]
    Meta(MetaError),
    /// `EIO` from the bucket (a read of data that is not cached while the bucket fails).
    #[error("bucket: {0}")]
    Bucket(#[from] BucketError),
    /// `EIO` (or `ENOSPC`) from the cache directory.
    #[error("cache: {0}")]
    Cache(#[from] CacheError),
    /// `EIO`: other local I/O.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl VfsError {
    /// The errno for this error (positive, as in `<errno.h>`).
    pub fn errno(&self) -> i32 {
        use VfsError::*;
        match self {
            NotFound => libc::ENOENT,
            Exists => libc::EEXIST,
            NotDir => libc::ENOTDIR,
            IsDir => libc::EISDIR,
            NotEmpty => libc::ENOTEMPTY,
            Invalid => libc::EINVAL,
            NameTooLong => libc::ENAMETOOLONG,
            NotPermitted => libc::EPERM,
            Access => libc::EACCES,
            BadHandle => libc::EBADF,
            NoAttr => libc::ENODATA,
            Range => libc::ERANGE,
            TooBig => libc::E2BIG,
            NotSupported => libc::EOPNOTSUPP,
            FileTooBig => libc::EFBIG,
            TooManyLinks => libc::EMLINK,
            WouldBlock => libc::EAGAIN,
            NoSuchOffset => libc::ENXIO,
            Interrupted => libc::EINTR,
            NoSpace => libc::ENOSPC,
            Stale => libc::ESTALE,
            Meta(MetaError::NotFound(_)) => libc::ENOENT,
            Meta(MetaError::Conflict(_)) => libc::EEXIST,
            Meta(m) if m.is_disk_full() => libc::ENOSPC,
            Meta(_) => libc::EIO,
            Bucket(BucketError::NotFound(_)) => libc::EIO,
            Bucket(_) => libc::EIO,
            Cache(c) if c.raw_os_error() == Some(libc::ENOSPC) => libc::ENOSPC,
            Cache(_) => libc::EIO,
            Io(e) if e.raw_os_error() == Some(libc::ENOSPC) => libc::ENOSPC,
            Io(_) => libc::EIO,
        }
    }
}

/// Result alias of the VFS.
pub type Result<T, E = VfsError> = std::result::Result<T, E>;

impl From<MetaError> for VfsError {
    fn from(e: MetaError) -> Self {
        VfsError::Meta(e)
    }
}

/// Lets a POSIX error travel through a metadata transaction closure as itself (see
/// [`deskfs_meta::txn`]); engine errors inside stay engine errors, so the engine can retry
/// them.
impl deskfs_meta::TxnError for VfsError {
    fn into_meta(self) -> std::result::Result<MetaError, Self> {
        match self {
            VfsError::Meta(m) => Ok(m),
            other => Err(other),
        }
    }
}

impl VfsError {
    /// The error for an errno value (the inverse of [`VfsError::errno`] for the codes it
    /// has a variant for; others become [`VfsError::Io`] carrying the code).
    pub fn from_errno(n: i32) -> VfsError {
        match n {
            libc::ENOENT => VfsError::NotFound,
            libc::EEXIST => VfsError::Exists,
            libc::ENOTDIR => VfsError::NotDir,
            libc::EISDIR => VfsError::IsDir,
            libc::ENOTEMPTY => VfsError::NotEmpty,
            libc::EINVAL => VfsError::Invalid,
            libc::ENAMETOOLONG => VfsError::NameTooLong,
            libc::EPERM => VfsError::NotPermitted,
            libc::EACCES => VfsError::Access,
            libc::EBADF => VfsError::BadHandle,
            libc::ENODATA => VfsError::NoAttr,
            libc::ERANGE => VfsError::Range,
            libc::E2BIG => VfsError::TooBig,
            libc::EOPNOTSUPP => VfsError::NotSupported,
            libc::EFBIG => VfsError::FileTooBig,
            libc::EMLINK => VfsError::TooManyLinks,
            libc::EAGAIN => VfsError::WouldBlock,
            libc::EINTR => VfsError::Interrupted,
            libc::ENXIO => VfsError::NoSuchOffset,
            libc::ENOSPC => VfsError::NoSpace,
            libc::ESTALE => VfsError::Stale,
            _ => VfsError::Io(std::io::Error::from_raw_os_error(n)),
        }
    }
}
