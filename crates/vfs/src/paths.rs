//! Workspace paths and their object keys (1 path = 1 object).
//!
//! A path is the `/`-joined bytes of the names from the root, without a leading `/`
//! (the root is the empty path). Its object key is the same text when that is a valid
//! object key; otherwise (bytes that are not UTF-8, control characters, a key longer than
//! the S3 limit of 1,024 bytes, or a path under the reserved `.deskfs` name) the object
//! goes to an escaped key `.deskfs/escaped/<sha256 of the path>` — deskfs never refuses a
//! name ext4 accepts. The metadata engine records the key of every object.

use deskfs_meta::{Ino, MetaTxn};
use sha2::{Digest, Sha256};

use crate::Result;

/// Longest object key the S3 API accepts, bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Reserved top-level name (hidden from the mount in the bucket listing).
pub const RESERVED: &[u8] = b".deskfs";

/// Joins a directory path and a child name.
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

/// Whether workspace path `path` is `dir` itself or lies under it (whole segments:
/// `a/bc` is not under `a/b`; every path is under the root, `dir` empty).
pub fn is_at_or_under(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || path.starts_with(dir) && (path.len() == dir.len() || path[dir.len()] == b'/')
}

/// The object key of `path`, given the bucket prefix length (to respect [`MAX_KEY_LEN`]).
/// Directory markers add one byte (`/`), accounted for here.
pub fn key_of(path: &[u8], prefix_len: usize) -> String {
    key_of_with(path, prefix_len, |_| true)
}

/// [`key_of`] with a backend check: keys the bucket cannot store (`storable` false) are
/// escaped too.
pub fn key_of_with(path: &[u8], prefix_len: usize, storable: impl Fn(&str) -> bool) -> String {
    if let Ok(s) = std::str::from_utf8(path) {
        let plain = !s.is_empty()
            && prefix_len + 1 + s.len() < MAX_KEY_LEN
            && s.split('/')
                .next()
                .is_none_or(|first| first.as_bytes() != RESERVED)
            && s.split('/').all(|seg| {
                !seg.is_empty() && seg != "." && seg != ".." && !seg.chars().any(|c| c.is_control())
            });
        if plain && storable(s) {
            return s.to_string();
        }
    }
    let digest = Sha256::digest(path);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!(".deskfs/escaped/{hex}")
}

/// Whether `key` is an escaped key (its path cannot be listed from the bucket).
pub fn is_escaped(key: &str) -> bool {
    key.starts_with(".deskfs/")
}

/// The path of directory `ino` (the root is the empty path). `None` when `ino` is not
/// reachable from the root (an unlinked directory). One engine statement.
pub fn dir_path(t: &mut dyn MetaTxn, ino: Ino) -> Result<Option<Vec<u8>>> {
    Ok(t.paths_of(ino)?.into_iter().next())
}

/// Every path naming `ino` (one per hard link). One engine statement.
pub fn paths_of(t: &mut dyn MetaTxn, ino: Ino) -> Result<Vec<Vec<u8>>> {
    Ok(t.paths_of(ino)?)
}

/// Resolves a path to its inode (see [`MetaTxn::resolve`]).
pub fn resolve(t: &mut dyn MetaTxn, path: &[u8]) -> Result<Option<Ino>> {
    Ok(t.resolve(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(key_of(b"a/b.txt", 0), "a/b.txt");
        assert_eq!(key_of("é/日本".as_bytes(), 0), "é/日本");
        assert!(is_escaped(&key_of(b"a/\xff", 0)));
        assert!(is_escaped(&key_of(b"a/b\nc", 0)));
        assert!(is_escaped(&key_of(b".deskfs/x", 0)));
        assert!(!is_escaped(&key_of(b"x/.deskfs", 0)));
        let long = vec![b'a'; 1100];
        assert!(is_escaped(&key_of(&long, 0)));
        assert!(is_escaped(&key_of(&[b'a'; 1000], 30)));
        assert_eq!(join(b"", b"x"), b"x");
        assert_eq!(join(b"a", b"x"), b"a/x");
    }
}
