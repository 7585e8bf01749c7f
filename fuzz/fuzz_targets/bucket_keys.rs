//! Name escaping and bucket-key mapping (`crates/vfs/src/paths.rs`, compiled as is).
//!
//! A workspace path (any bytes: `key_of` is total, deskfs never refuses a name ext4
//! accepts) maps to its object key `key_of_with(path, prefix_len, storable)`:
//! - a plain key is the path itself (the key decodes to the path by identity): non-empty
//!   UTF-8, every `/`-segment non-empty, not `.`/`..`, without control characters, the
//!   first segment not the reserved `.deskfs`, short enough that `PREFIX/KEY/` (a
//!   directory marker) stays within the S3 limit of 1,024 bytes, storable by the backend,
//!   and accepted by the bucket layer's gate (`Bucket::path` is
//!   `object_store::path::Path::parse` of `PREFIX/KEY`, which must give back the same text);
//!   the keys of its parent directories are plain too (a directory listing finds its
//!   children under its own key);
//! - any other path gets `.deskfs/escaped/<sha256 of the path, hex>`, itself a valid key;
//! - two different paths never get the same key; `is_escaped` tells the two kinds apart
//!   and takes any text.
//!
//! Input: `PATH_A [NUL PATH_B [NUL PARAMS]]` (corpus files are readable paths). PATH_B
//! defaults to PATH_A with its first segment dropped; PARAMS bytes 0-1 are the bucket
//! prefix length (little-endian, 0..=512 used), byte 2 a byte the backend refuses in
//! keys (0: none; the local `file://` backend refuses some keys, a fuzzed rule stands in).

#![no_main]

use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

/// What `paths.rs` calls `crate::Result` (only its engine helpers use it).
#[allow(dead_code)]
type Result<T> = std::result::Result<T, deskfs_meta::MetaError>;

#[allow(dead_code)]
#[path = "../../crates/vfs/src/paths.rs"]
mod paths;

use paths::{is_escaped, join, key_of_with, MAX_KEY_LEN, RESERVED};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn check(path: &[u8], prefix: &str, storable: &dyn Fn(&str) -> bool) -> String {
    let k = key_of_with(path, prefix.len(), storable);
    let full = if prefix.is_empty() {
        k.clone()
    } else {
        format!("{prefix}/{k}")
    };
    let parsed = object_store::path::Path::parse(&full)
        .unwrap_or_else(|e| panic!("key {k:?} of {path:?} refused by the bucket layer: {e}"));
    assert_eq!(parsed.as_ref(), full, "the bucket layer changed key {k:?}");
    if is_escaped(&k) {
        assert_eq!(
            k,
            format!(".deskfs/escaped/{}", hex(&Sha256::digest(path))),
            "escaped key of {path:?}"
        );
        assert!(prefix.len() + 1 + k.len() < MAX_KEY_LEN);
        return k;
    }
    // Plain: the key is the path.
    assert_eq!(k.as_bytes(), path, "plain key differs from its path");
    assert!(!k.is_empty(), "empty key");
    assert!(
        prefix.len() + 1 + k.len() < MAX_KEY_LEN,
        "key {k:?} too long for prefix {}",
        prefix.len()
    );
    assert!(storable(&k), "unstorable key {k:?} not escaped");
    let first = k.split('/').next().unwrap_or_default();
    assert_ne!(first.as_bytes(), RESERVED, "plain key under .deskfs: {k:?}");
    for seg in k.split('/') {
        assert!(
            !seg.is_empty() && seg != "." && seg != ".." && !seg.chars().any(char::is_control),
            "bad segment {seg:?} in plain key {k:?}"
        );
    }
    for (i, _) in k.match_indices('/') {
        let dir = &k[..i];
        assert_eq!(
            key_of_with(dir.as_bytes(), prefix.len(), storable),
            dir,
            "the parent directory {dir:?} of plain key {k:?} is escaped"
        );
    }
    k
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == 0);
    let a = parts.next().unwrap_or_default();
    let b = match parts.next() {
        Some(b) => b.to_vec(),
        None => a
            .splitn(2, |c| *c == b'/')
            .nth(1)
            .unwrap_or_default()
            .to_vec(),
    };
    let params = parts.next().unwrap_or_default();
    let byte = |i: usize| params.get(i).copied().unwrap_or(0);
    let prefix_len = usize::from(u16::from_le_bytes([byte(0), byte(1)])) % 513;
    let refused = byte(2);
    let prefix = "p".repeat(prefix_len);
    let storable = move |k: &str| refused == 0 || !k.as_bytes().contains(&refused);

    let ka = check(a, &prefix, &storable);
    let kb = check(&b, &prefix, &storable);
    assert_eq!(
        ka == kb,
        a == &b[..],
        "{a:?} and {b:?}: keys {ka:?} and {kb:?}"
    );
    // A path the VFS builds name by name (`join`) from valid names is that text.
    let names: Vec<&[u8]> = a.split(|c| *c == b'/').collect();
    if names.iter().all(|n| !n.is_empty()) {
        let joined = names.iter().fold(Vec::new(), |dir, name| join(&dir, name));
        assert_eq!(joined, a);
    }
    // Telling escaped keys from plain ones takes any text.
    let listed = String::from_utf8_lossy(data);
    let _ = is_escaped(&listed);
    check(listed.as_bytes(), &prefix, &storable);
});
