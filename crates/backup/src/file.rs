//! One backup file: a snapshot or a delta, as stored in the bucket.
//!
//! Layout: the magic `DESKFSBK`, a little-endian `u32` header length, the header (JSON,
//! [`Header`]), the records ([`crate::codec`]) compressed with zstd, and the SHA-256 of
//! everything before it (32 bytes). A file whose checksum, magic, version or record count
//! does not hold is refused whole: a backup is never half-applied.

use sha2::{Digest, Sha256};

use crate::codec::{Decoder, Encoder, Record};
use crate::BackupError;

/// Version of the file format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"DESKFSBK";

/// What a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// The whole namespace at `to_seq`.
    Snapshot,
    /// The changes after `from_seq` up to `to_seq`.
    Delta,
}

/// The header of a backup file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Header {
    /// [`FORMAT_VERSION`] of the writer.
    pub format: u32,
    /// Snapshot or delta.
    pub kind: FileKind,
    /// Workspace id (from the bucket's format record).
    pub workspace: String,
    /// Generation: a snapshot starts one, its deltas follow it.
    pub generation: u64,
    /// Change-mark sequence number this file starts after (0 for snapshots).
    pub from_seq: u64,
    /// Change-mark sequence number the namespace is at after this file.
    pub to_seq: u64,
    /// Number of records (a cut file is refused even when it ends on a record boundary).
    pub records: u64,
    /// When it was written, ns since the Unix epoch.
    pub written_ns: i64,
    /// Host that wrote it.
    pub host: String,
}

/// Encodes `records` under `header` (its `records` field is set here).
pub fn encode(mut header: Header, enc: Encoder) -> Result<Vec<u8>, BackupError> {
    header.records = enc.count;
    let head = serde_json::to_vec(&header).map_err(|e| BackupError::corrupt(e.to_string()))?;
    let raw_len = enc.raw_len_after_finish();
    let body = enc.finish()?;
    let mut out = Vec::with_capacity(12 + head.len() + body.len() + 40);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(&raw_len.to_le_bytes());
    out.extend_from_slice(&body);
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    Ok(out)
}

/// A decoded file: its header and records.
#[derive(Debug)]
pub struct Decoded {
    /// Header.
    pub header: Header,
    /// Records in file order.
    pub records: Vec<Record>,
}

/// Checks and decodes a file. Errors: [`BackupError::Corrupt`] for a bad checksum, magic,
/// version, header or record stream.
pub fn decode(data: &[u8]) -> Result<Decoded, BackupError> {
    if data.len() < 8 + 4 + 8 + 32 {
        return Err(BackupError::corrupt("file too short"));
    }
    let (content, sum) = data.split_at(data.len() - 32);
    if Sha256::digest(content).as_slice() != sum {
        return Err(BackupError::corrupt("checksum mismatch"));
    }
    if &content[..8] != MAGIC {
        return Err(BackupError::corrupt("not a deskfs backup file"));
    }
    let hlen = u32::from_le_bytes([content[8], content[9], content[10], content[11]]) as usize;
    let hend = 12usize
        .checked_add(hlen)
        .filter(|e| e + 8 <= content.len())
        .ok_or_else(|| BackupError::corrupt("header cut short"))?;
    let header: Header = serde_json::from_slice(&content[12..hend])
        .map_err(|e| BackupError::corrupt(format!("header: {e}")))?;
    if header.format > FORMAT_VERSION {
        return Err(BackupError::TooNew(header.format));
    }
    let mut raw_len = [0u8; 8];
    raw_len.copy_from_slice(&content[hend..hend + 8]);
    let raw_len = u64::from_le_bytes(raw_len);
    // Decompressed no further than the header's length plus one byte: a stream that
    // would expand past it (a forged or broken file) is refused without being expanded.
    let mut body = Vec::with_capacity(raw_len.min(1 << 24) as usize);
    {
        use std::io::Read;
        zstd::stream::read::Decoder::new(&content[hend + 8..])?
            .take(raw_len.saturating_add(1))
            .read_to_end(&mut body)?;
    }
    if body.len() as u64 != raw_len {
        return Err(BackupError::corrupt(format!(
            "{} record bytes, header says {raw_len}",
            body.len()
        )));
    }
    let mut d = Decoder::new(&body);
    let mut records = Vec::new();
    while let Some(r) = d.next_record()? {
        records.push(r);
    }
    if records.len() as u64 != header.records {
        return Err(BackupError::corrupt(format!(
            "{} records, header says {}",
            records.len(),
            header.records
        )));
    }
    Ok(Decoded { header, records })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            format: FORMAT_VERSION,
            kind: FileKind::Delta,
            workspace: "w".into(),
            generation: 3,
            from_seq: 10,
            to_seq: 20,
            records: 0,
            written_ns: 1,
            host: "h".into(),
        }
    }

    #[test]
    fn a_file_round_trips_and_any_flipped_byte_is_refused() {
        let mut e = Encoder::new().unwrap();
        e.push(&Record::InodeGone(5));
        e.push(&Record::ObjectGone(b"p".to_vec()));
        let data = encode(header(), e).unwrap();
        let d = decode(&data).unwrap();
        assert_eq!(d.header.records, 2);
        assert_eq!(d.records.len(), 2);
        for i in 0..data.len() {
            let mut bad = data.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad).is_err(), "flip at {i} accepted");
        }
        assert!(decode(&data[..data.len() - 1]).is_err());
    }

    /// A file whose records expand far past the length its header gives (sealed with a
    /// valid checksum, as anyone can) is refused having expanded at most that length + 1.
    #[test]
    fn a_stream_longer_than_its_stated_length_is_refused_unexpanded() {
        let head = serde_json::to_vec(&header()).unwrap();
        let bomb = zstd::stream::encode_all(&vec![0u8; 64 << 20][..], 19).unwrap();
        assert!(bomb.len() < 64 << 10, "64 MiB of zeros compress well");
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(head.len() as u32).to_le_bytes());
        out.extend_from_slice(&head);
        out.extend_from_slice(&16u64.to_le_bytes());
        out.extend_from_slice(&bomb);
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        match decode(&out) {
            Err(BackupError::Corrupt(m)) => assert_eq!(m, "17 record bytes, header says 16"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
