//! Where backup files live in the bucket, and reading that layout back from a listing.

use std::collections::BTreeMap;

use deskfs_bucket::Bucket;

use crate::BackupError;

/// Directory (key prefix) of the backup files.
pub const META_DIR: &str = ".deskfs/meta";

/// Key of the snapshot that starts generation `gen`.
pub fn snapshot_key(gen: u64) -> String {
    format!("{META_DIR}/g{gen:010}/snapshot.dbk")
}

/// Key of the delta of generation `gen` that ends at mark `to_seq`.
pub fn delta_key(gen: u64, to_seq: u64) -> String {
    format!("{META_DIR}/g{gen:010}/d{to_seq:016}.dbk")
}

/// The backup files of one generation found in the bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Generation {
    /// Whether its snapshot exists.
    pub snapshot: bool,
    /// Its deltas: `to_seq -> key`, in order.
    pub deltas: BTreeMap<u64, String>,
    /// Every key of the generation (for pruning), with sizes.
    pub keys: Vec<(String, u64)>,
}

/// Parses a key under [`META_DIR`]: `(generation, None)` for a snapshot,
/// `(generation, Some(to_seq))` for a delta; `None` for anything else — also for a key
/// that names the same numbers in another form than [`snapshot_key`] and [`delta_key`]
/// write (`g7`, `g+0000000007`, a short `d…` name), which no backup file has.
pub fn parse_key(key: &str) -> Option<(u64, Option<u64>)> {
    let rest = key.strip_prefix(META_DIR)?.strip_prefix("/g")?;
    let (gen, file) = rest.split_once('/')?;
    let gen: u64 = gen.parse().ok()?;
    let (seq, written) = if file == "snapshot.dbk" {
        (None, snapshot_key(gen))
    } else {
        let seq = file.strip_prefix('d')?.strip_suffix(".dbk")?.parse().ok()?;
        (Some(seq), delta_key(gen, seq))
    };
    (written == key).then_some((gen, seq))
}

/// Every generation in the bucket, by number.
pub async fn generations(bucket: &Bucket) -> Result<BTreeMap<u64, Generation>, BackupError> {
    let mut out: BTreeMap<u64, Generation> = BTreeMap::new();
    for o in bucket.list_all(META_DIR).await? {
        let Some((gen, delta)) = parse_key(&o.key) else {
            continue;
        };
        let g = out.entry(gen).or_default();
        match delta {
            None => g.snapshot = true,
            Some(seq) => {
                g.deltas.insert(seq, o.key.clone());
            }
        }
        g.keys.push((o.key, o.size));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_back() {
        assert_eq!(parse_key(&snapshot_key(7)), Some((7, None)));
        assert_eq!(parse_key(&delta_key(7, 123)), Some((7, Some(123))));
        assert_eq!(parse_key(".deskfs/meta/g1/other"), None);
        assert_eq!(parse_key(".deskfs/format.json"), None);
        assert_eq!(parse_key(&snapshot_key(u64::MAX)), Some((u64::MAX, None)));
        assert_eq!(
            parse_key(&delta_key(0, u64::MAX)),
            Some((0, Some(u64::MAX)))
        );
        // Found by fuzz/fuzz_targets/meta_backup.rs: other spellings of the same numbers
        // were read as backup files of that generation.
        for other in [
            ".deskfs/meta/g0000000007/d000000000.dbk",
            ".deskfs/meta/g7/snapshot.dbk",
            ".deskfs/meta/g+000000007/snapshot.dbk",
            ".deskfs/meta/g00000000007/snapshot.dbk",
            ".deskfs/meta/g0000000007/d+000000000000123.dbk",
        ] {
            assert_eq!(parse_key(other), None, "{other}");
        }
        // Lexical order of keys is numeric order (fixed widths).
        assert!(delta_key(1, 9) < delta_key(1, 10));
        assert!(snapshot_key(9) < snapshot_key(10));
    }
}
