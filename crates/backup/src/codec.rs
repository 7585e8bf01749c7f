//! The records of a backup file and their binary encoding.
//!
//! A record is a tag byte followed by its fields: unsigned integers as LEB128 varints,
//! signed ones (times, ns) zigzag-encoded first, byte strings as a varint length and the
//! bytes, optional values as a presence byte. The encoding is deskfs's own and versioned
//! by the file header ([`crate::file::FORMAT_VERSION`]).

use deskfs_meta::{Ino, InodeRow, Kind, Local, ObjectRow};

use crate::BackupError;

/// The attributes of one inode as the backup keeps them: everything a rebuilt namespace
/// needs, nothing about this machine (no cache location, dirty flag or listing time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRec {
    /// Inode number (kept by a rebuild).
    pub ino: Ino,
    /// File type.
    pub kind: Kind,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number (character/block devices).
    pub rdev: u32,
    /// Link count.
    pub nlink: u32,
    /// Size, bytes.
    pub size: u64,
    /// Access time, ns.
    pub atime_ns: i64,
    /// Modification time, ns.
    pub mtime_ns: i64,
    /// Status change time, ns.
    pub ctime_ns: i64,
    /// Birth time, ns.
    pub btime_ns: i64,
    /// Content version.
    pub data_version: u64,
    /// Symlink target.
    pub target: Option<Vec<u8>>,
}

impl InodeRec {
    /// The backup's view of an inode row.
    pub fn of(r: &InodeRow) -> InodeRec {
        InodeRec {
            ino: r.ino,
            kind: r.kind,
            perm: r.perm,
            uid: r.uid,
            gid: r.gid,
            rdev: r.rdev,
            nlink: r.nlink,
            size: r.size,
            atime_ns: r.atime_ns,
            mtime_ns: r.mtime_ns,
            ctime_ns: r.ctime_ns,
            btime_ns: r.btime_ns,
            data_version: r.data_version,
            target: r.target.clone(),
        }
    }

    /// An inode row for a rebuilt database: content in the bucket (nothing local, clean),
    /// directories listed at `listed_ns`.
    pub fn to_row(&self, listed_ns: i64) -> InodeRow {
        InodeRow {
            ino: self.ino,
            kind: self.kind,
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            nlink: self.nlink,
            size: self.size,
            atime_ns: self.atime_ns,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            btime_ns: self.btime_ns,
            data_version: self.data_version,
            target: self.target.clone(),
            local: Local::None,
            dirty: false,
            listed_ns: if self.kind == Kind::Dir { listed_ns } else { 0 },
        }
    }
}

/// One fact of the namespace, or its absence. A snapshot holds only the positive kinds;
/// a delta holds the current state of everything that changed since the previous file,
/// positive or `…Gone`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// An inode and its attributes.
    Inode(InodeRec),
    /// The inode no longer exists.
    InodeGone(Ino),
    /// The entry `parent/name` names `ino`.
    Dentry {
        /// Directory.
        parent: Ino,
        /// Name (raw bytes).
        name: Vec<u8>,
        /// Inode named.
        ino: Ino,
    },
    /// The entry `parent/name` no longer exists.
    DentryGone {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
    },
    /// The complete set of xattrs of an inode (empty: it has none now).
    Xattrs {
        /// Inode.
        ino: Ino,
        /// `(name, value)` pairs, sorted by name.
        attrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// The object recorded at a workspace path (which key, which content version, ETag).
    Object(ObjectRow),
    /// No object is recorded at this path any more.
    ObjectGone(Vec<u8>),
}

const T_INODE: u8 = 1;
const T_INODE_GONE: u8 = 2;
const T_DENTRY: u8 = 3;
const T_DENTRY_GONE: u8 = 4;
const T_XATTRS: u8 = 5;
const T_OBJECT: u8 = 6;
const T_OBJECT_GONE: u8 = 7;

fn kind_code(k: Kind) -> u8 {
    (k.ifmt() >> 12) as u8
}

fn kind_of(c: u8) -> Result<Kind, BackupError> {
    Kind::from_mode((c as u32) << 12)
        .ok_or_else(|| BackupError::corrupt(format!("unknown file type {c}")))
}

/// Encodes records and compresses them as they come (zstd stream), so a snapshot of a
/// large namespace holds only its compressed form in memory (plus [`CHUNK`] bytes).
pub struct Encoder {
    /// Encoded bytes not yet handed to the compressor.
    buf: Vec<u8>,
    /// Records encoded so far.
    pub count: u64,
    /// Uncompressed bytes encoded so far.
    pub raw_len: u64,
    z: zstd::stream::Encoder<'static, Vec<u8>>,
    err: Option<std::io::Error>,
}

/// Encoded bytes gathered before they are compressed.
const CHUNK: usize = 1 << 20;
/// zstd level: fast, and about 4-6x on namespace records.
const ZSTD_LEVEL: i32 = 3;

impl Encoder {
    /// A new, empty encoder. Errors: the compressor cannot be set up (out of memory).
    pub fn new() -> std::io::Result<Encoder> {
        Ok(Encoder {
            buf: Vec::with_capacity(CHUNK + 4096),
            count: 0,
            raw_len: 0,
            z: zstd::stream::Encoder::new(Vec::new(), ZSTD_LEVEL)?,
            err: None,
        })
    }

    /// The uncompressed length the records will have once [`Encoder::finish`]ed.
    pub fn raw_len_after_finish(&self) -> u64 {
        self.raw_len + self.buf.len() as u64
    }

    /// The compressed records. Errors: the compressor failed.
    pub fn finish(mut self) -> std::io::Result<Vec<u8>> {
        self.spill();
        if let Some(e) = self.err.take() {
            return Err(e);
        }
        self.z.finish()
    }

    fn spill(&mut self) {
        use std::io::Write;
        if self.err.is_none() && !self.buf.is_empty() {
            self.raw_len += self.buf.len() as u64;
            if let Err(e) = self.z.write_all(&self.buf) {
                self.err = Some(e);
            }
        }
        self.buf.clear();
    }

    fn u(&mut self, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(b);
                return;
            }
            self.buf.push(b | 0x80);
        }
    }

    fn i(&mut self, v: i64) {
        self.u(((v << 1) ^ (v >> 63)) as u64);
    }

    fn bytes(&mut self, b: &[u8]) {
        self.u(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    fn opt(&mut self, b: Option<&[u8]>) {
        match b {
            Some(b) => {
                self.buf.push(1);
                self.bytes(b);
            }
            None => self.buf.push(0),
        }
    }

    /// Appends one record.
    pub fn push(&mut self, r: &Record) {
        if self.buf.len() >= CHUNK {
            self.spill();
        }
        self.count += 1;
        match r {
            Record::Inode(n) => {
                self.buf.push(T_INODE);
                self.u(n.ino);
                self.buf.push(kind_code(n.kind));
                self.u(n.perm as u64);
                self.u(n.uid as u64);
                self.u(n.gid as u64);
                self.u(n.rdev as u64);
                self.u(n.nlink as u64);
                self.u(n.size);
                self.i(n.atime_ns);
                self.i(n.mtime_ns);
                self.i(n.ctime_ns);
                self.i(n.btime_ns);
                self.u(n.data_version);
                self.opt(n.target.as_deref());
            }
            Record::InodeGone(ino) => {
                self.buf.push(T_INODE_GONE);
                self.u(*ino);
            }
            Record::Dentry { parent, name, ino } => {
                self.buf.push(T_DENTRY);
                self.u(*parent);
                self.bytes(name);
                self.u(*ino);
            }
            Record::DentryGone { parent, name } => {
                self.buf.push(T_DENTRY_GONE);
                self.u(*parent);
                self.bytes(name);
            }
            Record::Xattrs { ino, attrs } => {
                self.buf.push(T_XATTRS);
                self.u(*ino);
                self.u(attrs.len() as u64);
                for (n, v) in attrs {
                    self.bytes(n);
                    self.bytes(v);
                }
            }
            Record::Object(o) => {
                self.buf.push(T_OBJECT);
                self.bytes(&o.path);
                self.bytes(o.key.as_bytes());
                self.u(o.ino);
                self.buf.push(kind_code(o.kind));
                self.u(o.data_version);
                self.i(o.meta_stamp);
                self.opt(o.etag.as_deref().map(str::as_bytes));
                self.u(o.size);
            }
            Record::ObjectGone(p) => {
                self.buf.push(T_OBJECT_GONE);
                self.bytes(p);
            }
        }
    }
}

/// Reads records back from an encoded buffer.
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder over `buf`.
    pub fn new(buf: &'a [u8]) -> Decoder<'a> {
        Decoder { buf, pos: 0 }
    }

    fn byte(&mut self) -> Result<u8, BackupError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| BackupError::corrupt("record cut short"))?;
        self.pos += 1;
        Ok(b)
    }

    fn u(&mut self) -> Result<u64, BackupError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(BackupError::corrupt("varint too long"))
    }

    fn u32(&mut self) -> Result<u32, BackupError> {
        u32::try_from(self.u()?).map_err(|_| BackupError::corrupt("value out of range"))
    }

    fn i(&mut self) -> Result<i64, BackupError> {
        let z = self.u()?;
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, BackupError> {
        let n =
            usize::try_from(self.u()?).map_err(|_| BackupError::corrupt("length out of range"))?;
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| BackupError::corrupt("byte string cut short"))?;
        let v = self.buf[self.pos..end].to_vec();
        self.pos = end;
        Ok(v)
    }

    fn opt(&mut self) -> Result<Option<Vec<u8>>, BackupError> {
        match self.byte()? {
            0 => Ok(None),
            1 => Ok(Some(self.bytes()?)),
            b => Err(BackupError::corrupt(format!("bad presence byte {b}"))),
        }
    }

    fn string(&mut self) -> Result<String, BackupError> {
        String::from_utf8(self.bytes()?).map_err(|_| BackupError::corrupt("key is not UTF-8"))
    }

    /// The next record, or `None` at the end of the buffer.
    pub fn next_record(&mut self) -> Result<Option<Record>, BackupError> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let r = match self.byte()? {
            T_INODE => Record::Inode(InodeRec {
                ino: self.u()?,
                kind: kind_of(self.byte()?)?,
                perm: self.u32()?,
                uid: self.u32()?,
                gid: self.u32()?,
                rdev: self.u32()?,
                nlink: self.u32()?,
                size: self.u()?,
                atime_ns: self.i()?,
                mtime_ns: self.i()?,
                ctime_ns: self.i()?,
                btime_ns: self.i()?,
                data_version: self.u()?,
                target: self.opt()?,
            }),
            T_INODE_GONE => Record::InodeGone(self.u()?),
            T_DENTRY => Record::Dentry {
                parent: self.u()?,
                name: self.bytes()?,
                ino: self.u()?,
            },
            T_DENTRY_GONE => Record::DentryGone {
                parent: self.u()?,
                name: self.bytes()?,
            },
            T_XATTRS => {
                let ino = self.u()?;
                let n = self.u()?;
                let mut attrs = Vec::new();
                for _ in 0..n {
                    attrs.push((self.bytes()?, self.bytes()?));
                }
                Record::Xattrs { ino, attrs }
            }
            T_OBJECT => Record::Object(ObjectRow {
                path: self.bytes()?,
                key: self.string()?,
                ino: self.u()?,
                kind: kind_of(self.byte()?)?,
                data_version: self.u()?,
                meta_stamp: self.i()?,
                etag: self
                    .opt()?
                    .map(|b| {
                        String::from_utf8(b).map_err(|_| BackupError::corrupt("ETag is not UTF-8"))
                    })
                    .transpose()?,
                size: self.u()?,
            }),
            T_OBJECT_GONE => Record::ObjectGone(self.bytes()?),
            t => return Err(BackupError::corrupt(format!("unknown record tag {t}"))),
        };
        Ok(Some(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record::Inode(InodeRec {
                ino: 42,
                kind: Kind::Symlink,
                perm: 0o7777,
                uid: u32::MAX,
                gid: 0,
                rdev: 0,
                nlink: 1,
                size: 3,
                atime_ns: -5,
                mtime_ns: 1_700_000_000_123_456_789,
                ctime_ns: i64::MIN,
                btime_ns: i64::MAX,
                data_version: u64::MAX,
                target: Some(b"a\xffb".to_vec()),
            }),
            Record::InodeGone(7),
            Record::Dentry {
                parent: 1,
                name: b"\x01odd name\n".to_vec(),
                ino: 42,
            },
            Record::DentryGone {
                parent: 1,
                name: vec![],
            },
            Record::Xattrs {
                ino: 42,
                attrs: vec![
                    (b"user.a".to_vec(), vec![0, 1, 2]),
                    (b"user.b".to_vec(), vec![]),
                ],
            },
            Record::Object(ObjectRow {
                path: b"x/y".to_vec(),
                key: ".deskfs/escaped/ab".into(),
                ino: 42,
                kind: Kind::File,
                data_version: 3,
                meta_stamp: -1,
                etag: Some("\"e\"".into()),
                size: 9,
            }),
            Record::ObjectGone(b"gone".to_vec()),
        ]
    }

    fn encoded() -> Vec<u8> {
        let mut e = Encoder::new().unwrap();
        for r in sample() {
            e.push(&r);
        }
        assert_eq!(e.count, 7);
        zstd::stream::decode_all(&e.finish().unwrap()[..]).unwrap()
    }

    #[test]
    fn every_record_kind_round_trips_with_extreme_values() {
        let buf = encoded();
        let mut d = Decoder::new(&buf);
        let mut back = Vec::new();
        while let Some(r) = d.next_record().unwrap() {
            back.push(r);
        }
        assert_eq!(back, sample());
    }

    #[test]
    fn a_cut_buffer_is_an_error_not_a_short_read() {
        let buf = encoded();
        for cut in 1..buf.len() {
            let mut d = Decoder::new(&buf[..cut]);
            let mut res = Ok(None);
            for _ in 0..10 {
                res = d.next_record();
                if !matches!(res, Ok(Some(_))) {
                    break;
                }
            }
            // A cut inside a record is reported; a cut on a record boundary ends early,
            // which the file's record count catches (see file.rs).
            assert!(res.is_err() || matches!(res, Ok(None)), "cut {cut}");
        }
    }
}
