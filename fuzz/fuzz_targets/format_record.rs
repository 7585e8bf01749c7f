//! The bucket's format record, `.deskfs/format.json` (`crates/cli/src/format/record.rs`,
//! compiled as is).
//!
//! - `FormatRecord::parse` of any bytes returns a record or an error line, never panics;
//!   it succeeds exactly when the bytes are a JSON object (as `serde_json` reads them);
//! - for any record (every field present or absent, any text, any number),
//!   `parse(to_bytes(r)) == r`, and `to_bytes` of what `parse` returned reads back the same;
//! - `FormatRecord::new` (what `deskfs format` writes) round-trips too.
//!
//! Input: the bytes found at the key (corpus files are format records and near misses);
//! the same bytes, read by `arbitrary`, also give the fields of a record to write.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../crates/cli/src/format/record.rs"]
mod record;

use record::FormatRecord;

#[derive(Arbitrary, Debug)]
struct Fields {
    format: Option<String>,
    version: Option<u64>,
    workspace: Option<String>,
    id: Option<String>,
    meta: Option<String>,
    created: Option<u64>,
    shared: bool,
}

fuzz_target!(|data: &[u8]| {
    let is_object = matches!(
        serde_json::from_slice::<serde_json::Value>(data),
        Ok(serde_json::Value::Object(_))
    );
    match FormatRecord::parse(data) {
        Ok(r) => {
            assert!(is_object, "accepted a body that is not a JSON object");
            assert_eq!(FormatRecord::parse(&r.to_bytes()).as_ref(), Ok(&r));
        }
        Err(e) => {
            assert!(!is_object, "refused a JSON object: {e}");
            assert!(!e.contains('\n'), "error is not one line: {e:?}");
        }
    }

    let Ok(f) = Fields::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let r = FormatRecord {
        format: f.format,
        version: f.version,
        workspace: f.workspace,
        id: f.id,
        meta: f.meta,
        created: f.created,
    };
    let bytes = r.to_bytes();
    assert_eq!(FormatRecord::parse(&bytes).as_ref(), Ok(&r), "{bytes:?}");
    let w = r.workspace.clone().unwrap_or_default();
    let i = r.id.clone().unwrap_or_default();
    let n = FormatRecord::new(&w, &i, f.shared, r.created.unwrap_or_default());
    let back = FormatRecord::parse(&n.to_bytes()).expect("a written record reads back");
    assert_eq!(back, n);
    assert_eq!(back.is_postgres(), f.shared);
    assert_eq!(back.version, Some(record::VERSION));
});
