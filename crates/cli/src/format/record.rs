//! The bucket's format record, `.deskfs/format.json`: written once by `deskfs format`,
//! read by `deskfs attach --bucket` (the workspace id; a workspace whose metadata is in
//! PostgreSQL is refused there), by `deskfs format` (a bucket that holds a record is
//! refused without `--force`; attaching to a shared database whose bucket names another
//! workspace id is refused) and by `deskfs fsck` (the id, when the database has none).
//!
//! The body is one JSON object:
//! `{"created":SECS,"format":"deskfs","id":HEX,"meta":"sqlite"|"postgres","version":1,"workspace":NAME}`.
//! Reading is lenient, as it has always been: a field that is missing or holds another
//! JSON type reads as absent, unknown fields are ignored; only a body that is not a JSON
//! object is an error (its readers then know a record exists but not its fields).
//! [`FormatRecord::parse`] of [`FormatRecord::to_bytes`] gives the record back, for any
//! field values.
//!
//! This file uses nothing but `serde_json`: `fuzz/fuzz_targets/format_record.rs` compiles
//! it as is (`scripts/fuzz.sh format_record`).

use serde_json::{Map, Value};

/// Key of the record, relative to the workspace prefix.
pub const KEY: &str = ".deskfs/format.json";
/// `version` this deskfs writes.
pub const VERSION: u64 = 1;
/// Bytes of the record read from the bucket (a longer body is not a record).
pub const MAX_LEN: u64 = 64 << 10;

/// A format record. Every field is optional: see the module doc.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FormatRecord {
    /// `"deskfs"`.
    pub format: Option<String>,
    /// [`VERSION`] of the writer.
    pub version: Option<u64>,
    /// Workspace name given to `deskfs format`.
    pub workspace: Option<String>,
    /// Random workspace id (also in the metadata database and in every backup header).
    pub id: Option<String>,
    /// Metadata engine: `"sqlite"` or `"postgres"`.
    pub meta: Option<String>,
    /// When it was written, seconds since the Unix epoch.
    pub created: Option<u64>,
}

impl FormatRecord {
    /// The record `deskfs format` writes.
    pub fn new(workspace: &str, id: &str, shared_meta: bool, created: u64) -> FormatRecord {
        FormatRecord {
            format: Some("deskfs".into()),
            version: Some(VERSION),
            workspace: Some(workspace.into()),
            id: Some(id.into()),
            meta: Some(if shared_meta { "postgres" } else { "sqlite" }.into()),
            created: Some(created),
        }
    }

    /// Whether the workspace keeps its metadata in PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        self.meta.as_deref() == Some("postgres")
    }

    /// The JSON body (absent fields are left out).
    pub fn to_bytes(&self) -> Vec<u8> {
        // In the order `deskfs format` has always written them.
        let fields = [
            ("format", self.format.clone().map(Value::from)),
            ("version", self.version.map(Value::from)),
            ("workspace", self.workspace.clone().map(Value::from)),
            ("id", self.id.clone().map(Value::from)),
            ("meta", self.meta.clone().map(Value::from)),
            ("created", self.created.map(Value::from)),
        ];
        let m: Map<String, Value> = fields
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), v?)))
            .collect();
        Value::Object(m).to_string().into_bytes()
    }

    /// Reads a body. Errors (one line): the body is not a JSON object.
    pub fn parse(body: &[u8]) -> Result<FormatRecord, String> {
        let v: Value =
            serde_json::from_slice(body).map_err(|e| format!("format record is not JSON: {e}"))?;
        let Value::Object(m) = v else {
            return Err("format record is not a JSON object".into());
        };
        let text = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
        let number = |k: &str| m.get(k).and_then(Value::as_u64);
        Ok(FormatRecord {
            format: text("format"),
            version: number("version"),
            workspace: text("workspace"),
            id: text("id"),
            meta: text("meta"),
            created: number("created"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_reads_as_before() {
        let r = FormatRecord::new("w", "00ff", true, 1_700_000_000);
        assert_eq!(FormatRecord::parse(&r.to_bytes()), Ok(r.clone()));
        assert!(r.is_postgres());
        // The bytes `deskfs format` wrote before this type existed.
        let old = serde_json::json!({
            "format": "deskfs",
            "version": 1,
            "workspace": "w",
            "id": "00ff",
            "meta": "postgres",
            "created": 1_700_000_000u64,
        })
        .to_string();
        assert_eq!(r.to_bytes(), old.as_bytes());
        assert_eq!(FormatRecord::parse(old.as_bytes()), Ok(r));
        // Lenient: wrong types read as absent, unknown fields are ignored.
        let odd = FormatRecord::parse(br#"{"id":7,"meta":null,"version":-1,"x":[1]}"#).unwrap();
        assert_eq!(odd, FormatRecord::default());
        assert!(!odd.is_postgres());
        for bad in [&b""[..], b"null", b"[]", b"\"x\"", b"{", b"\xff"] {
            assert!(FormatRecord::parse(bad).is_err(), "{bad:?}");
        }
    }
}
