//! POSIX attributes in object user metadata, under s3fs-fuse's names so that buckets written
//! by either tool mount with the right modes in the other.
//!
//! | header              | value                                                  |
//! |---------------------|--------------------------------------------------------|
//! | `x-amz-meta-mode`   | decimal `st_mode` including the `S_IFMT` type bits     |
//! | `x-amz-meta-uid`    | decimal uid                                            |
//! | `x-amz-meta-gid`    | decimal gid                                            |
//! | `x-amz-meta-mtime`  | decimal seconds since the epoch (s3fs reads integers)  |
//! | `x-amz-meta-atime`  | same, access time                                      |
//! | `x-amz-meta-ctime`  | same, change time                                      |
//! | `x-amz-meta-deskfs-mtime-ns` | deskfs only: the mtime in ns (full precision) |
//!
//! Azure Blob storage takes only metadata names that are C# identifiers (letters, digits,
//! `_`, not starting with a digit) and answers `400 InvalidMetadata` to any other, so on
//! Azure the names go through [`azure_metadata_name`]: `x-ms-meta-deskfs_mtime_ns` there
//! (the s3fs names are identifiers already). Reading accepts both spellings.

use object_store::{Attribute, Attributes};

/// The deskfs-only metadata name of the mtime in ns, as written to S3 and GCS.
const MTIME_NS: &str = "deskfs-mtime-ns";

/// `name` as Azure Blob storage accepts a metadata name (a C# identifier): every character
/// other than an ASCII letter, digit or `_` becomes `_`, and a leading digit (or an empty
/// name) gets a `_` in front. Identifiers are returned unchanged.
pub fn azure_metadata_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The same attributes with every user-metadata name made acceptable to Azure
/// ([`azure_metadata_name`]); other attributes are kept as they are.
pub fn azure_attributes(a: &Attributes) -> Attributes {
    let mut out = Attributes::new();
    for (k, v) in a {
        let k = match k {
            Attribute::Metadata(name) => Attribute::Metadata(azure_metadata_name(name).into()),
            other => other.clone(),
        };
        out.insert(k, v.clone());
    }
    out
}

/// POSIX attributes carried by an object. Times are ns since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PosixMeta {
    /// Full `st_mode` (type bits + permission bits).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Modification time, ns.
    pub mtime_ns: i64,
    /// Access time, ns.
    pub atime_ns: i64,
    /// Change time, ns.
    pub ctime_ns: i64,
}

const NS: i64 = 1_000_000_000;

impl PosixMeta {
    /// The user-metadata attributes for this value.
    pub fn to_attributes(&self) -> Attributes {
        let mut a = Attributes::new();
        let mut put = |k: &'static str, v: String| {
            a.insert(Attribute::Metadata(k.into()), v.into());
        };
        put("mode", self.mode.to_string());
        put("uid", self.uid.to_string());
        put("gid", self.gid.to_string());
        put("mtime", self.mtime_ns.div_euclid(NS).to_string());
        put("atime", self.atime_ns.div_euclid(NS).to_string());
        put("ctime", self.ctime_ns.div_euclid(NS).to_string());
        put(MTIME_NS, self.mtime_ns.to_string());
        a
    }

    /// Reads the attributes back; `None` when the object carries no `mode` (written by a
    /// tool that does not store POSIX attributes). Missing times default to `fallback_ns`.
    pub fn from_attributes(a: &Attributes, fallback_ns: i64) -> Option<PosixMeta> {
        let get = |k: &'static str| -> Option<String> {
            a.get(&Attribute::Metadata(k.into()))
                .map(|v| v.as_ref().to_string())
        };
        let secs = |k: &'static str| -> Option<i64> {
            let v = get(k)?;
            // s3fs writes integers; tolerate "sec.frac" too.
            let (s, frac) = v.split_once('.').unwrap_or((&v, ""));
            let s: i64 = s.trim().parse().ok()?;
            let mut ns = 0i64;
            if !frac.is_empty() {
                let digits: String = frac.chars().take(9).collect();
                let scale = 10i64.pow(9 - digits.len() as u32);
                ns = digits.parse::<i64>().ok()? * scale;
            }
            Some(s * NS + ns)
        };
        let mode: u32 = get("mode")?.trim().parse().ok()?;
        let mtime_ns = get(MTIME_NS)
            .or_else(|| {
                // Azure's spelling (see `azure_metadata_name`); object_store reports the
                // names as the server sends them (Azure lowercases none of these).
                a.get(&Attribute::Metadata(azure_metadata_name(MTIME_NS).into()))
                    .map(|v| v.as_ref().to_string())
            })
            .and_then(|v| v.trim().parse().ok())
            .or_else(|| secs("mtime"))
            .unwrap_or(fallback_ns);
        Some(PosixMeta {
            mode,
            uid: get("uid").and_then(|v| v.trim().parse().ok()).unwrap_or(0),
            gid: get("gid").and_then(|v| v.trim().parse().ok()).unwrap_or(0),
            mtime_ns,
            atime_ns: secs("atime").unwrap_or(mtime_ns),
            ctime_ns: secs("ctime").unwrap_or(mtime_ns),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_s3fs_integers() {
        let m = PosixMeta {
            mode: 0o100640,
            uid: 1000,
            gid: 100,
            mtime_ns: 1_700_000_000_123_456_789,
            atime_ns: 1_700_000_000_000_000_000,
            ctime_ns: 1_700_000_001_000_000_000,
        };
        let back = PosixMeta::from_attributes(&m.to_attributes(), 0).unwrap();
        assert_eq!(back, m);
        let mut a = Attributes::new();
        a.insert(Attribute::Metadata("mode".into()), "33188".into());
        a.insert(Attribute::Metadata("mtime".into()), "1600000000".into());
        let s = PosixMeta::from_attributes(&a, 7).unwrap();
        assert_eq!(s.mode, 0o100644);
        assert_eq!(s.mtime_ns, 1_600_000_000 * NS);
        assert!(PosixMeta::from_attributes(&Attributes::new(), 0).is_none());
    }

    /// Azure refuses metadata names that are not C# identifiers (`400 InvalidMetadata`,
    /// the cause of every upload failing on Azurite): the Azure names are identifiers and
    /// read back to the same value.
    #[test]
    fn azure_names_are_identifiers_and_read_back() {
        let m = PosixMeta {
            mode: 0o100600,
            uid: 1,
            gid: 2,
            mtime_ns: 1_700_000_000_987_654_321,
            atime_ns: 1_700_000_000_000_000_000,
            ctime_ns: 1_700_000_000_000_000_000,
        };
        let az = azure_attributes(&m.to_attributes());
        for (k, _) in &az {
            let Attribute::Metadata(name) = k else {
                panic!("only metadata expected: {k:?}")
            };
            let mut cs = name.chars();
            let first = cs.next().expect("non-empty");
            assert!(first.is_ascii_alphabetic() || first == '_', "{name}");
            assert!(cs.all(|c| c.is_ascii_alphanumeric() || c == '_'), "{name}");
        }
        assert!(az
            .get(&Attribute::Metadata("deskfs_mtime_ns".into()))
            .is_some());
        assert_eq!(PosixMeta::from_attributes(&az, 0), Some(m));
        assert_eq!(azure_metadata_name("mode"), "mode");
        assert_eq!(azure_metadata_name("9lives.x"), "_9lives_x");
        assert_eq!(azure_metadata_name(""), "_");
    }
}
