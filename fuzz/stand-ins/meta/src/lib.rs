//! Stand-in for `deskfs-meta` in the fuzz targets: its row types are compiled from
//! `crates/meta/src/types.rs` itself (`Ino`, `Kind`, `InodeRow`, `ObjectRow`, ...); its
//! engines (SQLite, PostgreSQL) are not built. Only the two other names the fuzzed modules
//! import are declared here, with the shapes those modules use: [`MetaError`] and
//! [`MetaTxn`] (`crates/vfs/src/paths.rs` calls `paths_of` and `resolve` on it in
//! functions the targets never run).

#[path = "../../../../crates/meta/src/types.rs"]
mod types;
pub use types::*;

/// An engine error (never produced here).
#[derive(Debug)]
pub struct MetaError;

impl std::fmt::Display for MetaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("metadata engine error")
    }
}

impl std::error::Error for MetaError {}

/// The two statements `crates/vfs/src/paths.rs` issues.
pub trait MetaTxn {
    /// Every path naming `ino`.
    fn paths_of(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>, MetaError>;
    /// The inode at `path`.
    fn resolve(&mut self, path: &[u8]) -> Result<Option<Ino>, MetaError>;
}
