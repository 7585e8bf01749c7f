//! The metadata-backup parsers (`crates/backup/src/{codec,file,layout,model}.rs`,
//! compiled as is).
//!
//! - `file::decode` of any bytes returns a file or an error, never panics; the harness
//!   also appends the right SHA-256 to the bytes, so the header, zstd and record parsers
//!   behind the checksum are reached. What it accepts has as many records as its header
//!   says and a format this build reads; encoded again, it decodes to the same header and
//!   records;
//! - `file::encode` then `decode` gives back the header (its `records` set to the count)
//!   and every record, for any values; a file with any one byte changed is refused whole;
//!   a `format` newer than `FORMAT_VERSION` is refused as `TooNew`;
//! - `layout::parse_key` takes any text; it reads back exactly the keys `snapshot_key`
//!   and `delta_key` write, and nothing else;
//! - a decoded record set applied to `model::Model` and `prune_and_count`ed holds what
//!   that function promises: only what is reachable from a root directory through entries
//!   whose inodes exist, each directory under one name, link counts from the entries
//!   (files: names; directories: 2 + subdirectories); a second pass changes nothing.
//!
//! Input: bytes as found at a backup key (corpus files are backup files as deskfs writes
//! them, and keys of the layout). Each input is also decoded with its last 32 bytes
//! replaced by the right SHA-256, read as a key (`parse_key`), and read by `arbitrary`
//! as a header and records to write, change one byte of, and read back.

#![no_main]

use std::collections::{BTreeMap, HashMap};

use arbitrary::{Arbitrary, Unstructured};
use deskfs_meta::{Ino, Kind, ObjectRow, ROOT_INO};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

/// `deskfs_backup::BackupError` with the variants these four files use (the real enum is
/// in crates/backup/src/lib.rs, whose other modules need the bucket and the engines).
#[allow(dead_code)]
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("backup file is damaged: {0}")]
    Corrupt(String),
    #[error("backup file has format {0}, newer than this deskfs supports; upgrade deskfs")]
    TooNew(u32),
    #[error(transparent)]
    Bucket(#[from] deskfs_bucket::BucketError),
    #[error("backup I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl BackupError {
    pub(crate) fn corrupt(s: impl Into<String>) -> BackupError {
        BackupError::Corrupt(s.into())
    }
}

#[allow(dead_code)]
#[path = "../../crates/backup/src/codec.rs"]
mod codec;
#[allow(dead_code)]
#[path = "../../crates/backup/src/file.rs"]
mod file;
#[allow(dead_code)]
#[path = "../../crates/backup/src/layout.rs"]
mod layout;
#[allow(dead_code)]
#[path = "../../crates/backup/src/model.rs"]
mod model;

use codec::{Encoder, InodeRec, Record};
use file::{decode, encode, FileKind, Header, FORMAT_VERSION};

const KINDS: [Kind; 7] = [
    Kind::Dir,
    Kind::File,
    Kind::Symlink,
    Kind::Fifo,
    Kind::Socket,
    Kind::CharDev,
    Kind::BlockDev,
];

/// Inode numbers: mostly small (so entries meet inodes), sometimes anything.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum ArbIno {
    Small(u8),
    Any(u64),
}

impl ArbIno {
    fn get(self) -> Ino {
        match self {
            ArbIno::Small(i) => u64::from(i % 16),
            ArbIno::Any(i) => i,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct ArbInode {
    ino: ArbIno,
    kind: u8,
    perm: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    nlink: u32,
    size: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    btime_ns: i64,
    data_version: u64,
    target: Option<Vec<u8>>,
}

#[derive(Arbitrary, Debug)]
enum ArbRecord {
    Inode(ArbInode),
    InodeGone(ArbIno),
    Dentry(ArbIno, Vec<u8>, ArbIno),
    DentryGone(ArbIno, Vec<u8>),
    Xattrs(ArbIno, Vec<(Vec<u8>, Vec<u8>)>),
    Object {
        path: Vec<u8>,
        key: String,
        ino: ArbIno,
        kind: u8,
        data_version: u64,
        meta_stamp: i64,
        etag: Option<String>,
        size: u64,
    },
    ObjectGone(Vec<u8>),
}

fn kind(k: u8) -> Kind {
    KINDS[usize::from(k) % KINDS.len()]
}

impl ArbRecord {
    fn record(self) -> Record {
        match self {
            ArbRecord::Inode(n) => Record::Inode(InodeRec {
                ino: n.ino.get(),
                kind: kind(n.kind),
                perm: n.perm,
                uid: n.uid,
                gid: n.gid,
                rdev: n.rdev,
                nlink: n.nlink,
                size: n.size,
                atime_ns: n.atime_ns,
                mtime_ns: n.mtime_ns,
                ctime_ns: n.ctime_ns,
                btime_ns: n.btime_ns,
                data_version: n.data_version,
                target: n.target,
            }),
            ArbRecord::InodeGone(i) => Record::InodeGone(i.get()),
            ArbRecord::Dentry(p, name, i) => Record::Dentry {
                parent: p.get(),
                name,
                ino: i.get(),
            },
            ArbRecord::DentryGone(p, name) => Record::DentryGone {
                parent: p.get(),
                name,
            },
            ArbRecord::Xattrs(i, attrs) => Record::Xattrs {
                ino: i.get(),
                attrs,
            },
            ArbRecord::Object {
                path,
                key,
                ino,
                kind: k,
                data_version,
                meta_stamp,
                etag,
                size,
            } => Record::Object(ObjectRow {
                path,
                key,
                ino: ino.get(),
                kind: kind(k),
                data_version,
                meta_stamp,
                etag,
                size,
            }),
            ArbRecord::ObjectGone(p) => Record::ObjectGone(p),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct ArbHeader {
    format: u32,
    delta: bool,
    workspace: String,
    generation: u64,
    from_seq: u64,
    to_seq: u64,
    records: u64,
    written_ns: i64,
    host: String,
}

#[derive(Arbitrary, Debug)]
struct Write {
    header: ArbHeader,
    records: Vec<ArbRecord>,
    flip_at: usize,
    flip: u8,
    seqs: (u64, u64),
}

fn encode_records(header: Header, records: &[Record]) -> Vec<u8> {
    let mut e = Encoder::new().expect("zstd encoder");
    for r in records {
        e.push(r);
    }
    encode(header, e).expect("encode")
}

/// The promises of `Model::prune_and_count`.
fn check_model(records: Vec<Record>) {
    let mut m = model::Model::default();
    for r in records {
        m.apply(r);
    }
    let root_dir = m.inodes.get(&ROOT_INO).map(|r| r.kind) == Some(Kind::Dir);
    let path_of = m.prune_and_count();
    if !root_dir {
        assert!(
            m.inodes.is_empty() && m.dentries.is_empty(),
            "kept entries without a root directory"
        );
        return;
    }
    let kept: Vec<Ino> = m.inodes.keys().copied().collect();
    let mut names: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    let mut dir_parent: BTreeMap<Ino, Ino> = BTreeMap::new();
    for ((p, _), i) in &m.dentries {
        let pk = m.inodes.get(p).map(|r| r.kind);
        assert_eq!(
            pk,
            Some(Kind::Dir),
            "entry in {p}, which is not a kept directory"
        );
        let ik = m
            .inodes
            .get(i)
            .map(|r| r.kind)
            .expect("entry naming a dropped inode");
        assert_ne!(*i, ROOT_INO, "the root has a name");
        *names.entry(*i).or_default() += 1;
        if ik == Kind::Dir {
            *subdirs.entry(*p).or_default() += 1;
            assert!(
                dir_parent.insert(*i, *p).is_none(),
                "directory {i} has two names"
            );
        }
    }
    for ino in &kept {
        assert!(path_of.contains_key(ino), "kept inode {ino} has no path");
        let r = &m.inodes[ino];
        if *ino != ROOT_INO {
            assert!(
                names.get(ino).copied().unwrap_or(0) > 0,
                "kept inode {ino} unnamed"
            );
        }
        let want = if r.kind == Kind::Dir {
            2 + subdirs.get(ino).copied().unwrap_or(0)
        } else {
            names.get(ino).copied().unwrap_or(0)
        };
        assert_eq!(r.nlink, want, "link count of {ino}");
    }
    assert_eq!(path_of.len(), kept.len(), "paths of dropped inodes");
    // Directories form one tree under the root.
    for d in dir_parent.keys() {
        let mut at = *d;
        let mut steps = 0;
        while at != ROOT_INO {
            at = dir_parent[&at];
            steps += 1;
            assert!(steps <= dir_parent.len(), "directory cycle through {d}");
        }
    }
    assert!(
        m.xattrs.keys().all(|i| m.inodes.contains_key(i)),
        "xattrs of a dropped inode"
    );
    let before = (m.inodes.clone(), m.dentries.clone());
    m.prune_and_count();
    assert!(
        before == (m.inodes.clone(), m.dentries.clone()),
        "a second pass changed the model"
    );
}

fn decoded_round_trip(d: file::Decoded) {
    assert_eq!(d.records.len() as u64, d.header.records);
    assert!(d.header.format <= FORMAT_VERSION);
    let again = encode_records(d.header.clone(), &d.records);
    let back = decode(&again).expect("a decoded file, encoded again, decodes");
    assert_eq!(back.header, d.header);
    assert_eq!(back.records, d.records);
    check_model(d.records);
}

fn write(w: Write) {
    let Write {
        header: h,
        records,
        flip_at,
        flip,
        seqs: (g, q),
    } = w;
    assert_eq!(layout::parse_key(&layout::snapshot_key(g)), Some((g, None)));
    assert_eq!(
        layout::parse_key(&layout::delta_key(g, q)),
        Some((g, Some(q)))
    );
    let records: Vec<Record> = records.into_iter().map(ArbRecord::record).collect();
    let header = Header {
        format: h.format,
        kind: if h.delta {
            FileKind::Delta
        } else {
            FileKind::Snapshot
        },
        workspace: h.workspace,
        generation: h.generation,
        from_seq: h.from_seq,
        to_seq: h.to_seq,
        records: h.records,
        written_ns: h.written_ns,
        host: h.host,
    };
    let data = encode_records(header.clone(), &records);
    match decode(&data) {
        Ok(d) => {
            assert!(header.format <= FORMAT_VERSION);
            assert_eq!(
                d.header,
                Header {
                    records: records.len() as u64,
                    ..header
                }
            );
            assert_eq!(d.records, records);
        }
        Err(BackupError::TooNew(f)) => assert!(f == header.format && f > FORMAT_VERSION),
        Err(e) => panic!("a written file is refused: {e}"),
    }
    let mut bad = data.clone();
    let i = flip_at % bad.len();
    bad[i] ^= flip.max(1);
    assert!(decode(&bad).is_err(), "byte {i} changed, file accepted");
    let cut = data.len() - 1 - flip_at % (data.len() - 1);
    assert!(
        decode(&data[..cut]).is_err(),
        "a file cut to {cut} bytes accepted"
    );
    if header.format <= FORMAT_VERSION {
        check_model(records);
    }
}

fuzz_target!(|data: &[u8]| {
    // As found.
    if let Ok(d) = decode(data) {
        decoded_round_trip(d);
    }
    // Past the checksum.
    if data.len() >= 32 {
        let mut b = data[..data.len() - 32].to_vec();
        let sum = Sha256::digest(&b);
        b.extend_from_slice(&sum);
        if let Ok(d) = decode(&b) {
            decoded_round_trip(d);
        }
    }
    // As a key.
    let k = String::from_utf8_lossy(data);
    if let Some((g, s)) = layout::parse_key(&k) {
        let written = match s {
            None => layout::snapshot_key(g),
            Some(s) => layout::delta_key(g, s),
        };
        assert_eq!(written, k, "parse_key accepts a key deskfs does not write");
    }
    // As a file to write.
    if let Ok(w) = Write::arbitrary(&mut Unstructured::new(data)) {
        write(w);
    }
});
