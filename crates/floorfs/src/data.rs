//! The content of a regular file held in RAM: a size and sparse chunks of up to
//! [`CHUNK`] bytes. A chunk holds only the bytes up to the last one written in it (a
//! 4 KiB file costs 4 KiB, not a whole chunk); everything else below the size — holes,
//! chunk tails — reads as zeros.

use std::collections::BTreeMap;

/// Largest chunk, bytes.
pub(crate) const CHUNK: u64 = 64 * 1024;

/// A file's bytes.
#[derive(Debug, Default)]
pub(crate) struct Data {
    size: u64,
    chunks: BTreeMap<u64, Vec<u8>>,
}

impl Data {
    /// The file's size, bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Up to `len` bytes from `offset` (fewer at the end of the file, none past it).
    pub(crate) fn read(&self, offset: u64, len: u32) -> Vec<u8> {
        if offset >= self.size {
            return Vec::new();
        }
        let end = self.size.min(offset.saturating_add(u64::from(len)));
        // The cast is lossless: end - offset <= len, a u32.
        let mut out = vec![0u8; (end - offset) as usize];
        let first = offset / CHUNK;
        for (&idx, chunk) in self.chunks.range(first..=(end - 1) / CHUNK) {
            let base = idx * CHUNK;
            let from = offset.max(base);
            let to = end.min(base + chunk.len() as u64);
            if from < to {
                let src = &chunk[(from - base) as usize..(to - base) as usize];
                out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(src);
            }
        }
        out
    }

    /// Writes `buf` at `offset`, growing the file as needed. Errors: `EFBIG` past the
    /// largest offset a file may have.
    pub(crate) fn write(&mut self, offset: u64, buf: &[u8]) -> Result<(), i32> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(libc::EFBIG)?;
        let mut pos = offset;
        while pos < end {
            let idx = pos / CHUNK;
            let base = idx * CHUNK;
            let to = end.min(base + CHUNK);
            let chunk = self.chunks.entry(idx).or_default();
            let (a, b) = ((pos - base) as usize, (to - base) as usize);
            if chunk.len() < b {
                chunk.resize(b, 0);
            }
            chunk[a..b].copy_from_slice(&buf[(pos - offset) as usize..(to - offset) as usize]);
            pos = to;
        }
        self.size = self.size.max(end);
        Ok(())
    }

    /// Sets the size: shrinking drops the bytes past it, growing adds zeros (a hole).
    pub(crate) fn truncate(&mut self, size: u64) {
        if size < self.size {
            let keep = size.div_ceil(CHUNK);
            self.chunks.split_off(&keep);
            if size % CHUNK != 0 {
                if let Some(last) = self.chunks.get_mut(&(size / CHUNK)) {
                    last.truncate((size % CHUNK) as usize);
                }
            }
        }
        self.size = size;
    }

    /// Zeros `len` bytes from `offset` without changing the size (punch hole).
    pub(crate) fn zero(&mut self, offset: u64, len: u64) {
        let end = self.size.min(offset.saturating_add(len));
        let mut pos = offset;
        while pos < end {
            let idx = pos / CHUNK;
            let base = idx * CHUNK;
            let to = end.min(base + CHUNK);
            if pos == base && to == base + CHUNK {
                self.chunks.remove(&idx);
            } else if let Some(chunk) = self.chunks.get_mut(&idx) {
                let a = ((pos - base) as usize).min(chunk.len());
                let b = ((to - base) as usize).min(chunk.len());
                chunk[a..b].fill(0);
            }
            pos = to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_across_chunks() {
        let mut d = Data::default();
        let buf: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        d.write(1000, &buf).expect("write");
        assert_eq!(d.size(), 201_000);
        assert_eq!(d.read(0, 1000), vec![0u8; 1000]);
        assert_eq!(d.read(1000, 200_000), buf);
        assert_eq!(d.read(70_000, 10), buf[69_000..69_010].to_vec());
        assert!(d.read(201_000, 10).is_empty());
        assert_eq!(d.read(200_990, 100).len(), 10);
    }

    #[test]
    fn holes_and_truncate_read_as_zeros() {
        let mut d = Data::default();
        d.write(0, &[7u8; 100]).expect("write");
        d.truncate(10);
        d.truncate(3 * CHUNK);
        let r = d.read(0, 200);
        assert_eq!(&r[..10], &[7u8; 10]);
        assert!(r[10..].iter().all(|&b| b == 0));
        d.write(2 * CHUNK + 5, b"x").expect("write");
        assert_eq!(d.read(2 * CHUNK + 5, 1), b"x");
        d.truncate(0);
        assert_eq!(d.size(), 0);
        d.truncate(1 << 40);
        assert_eq!(d.read(1 << 39, 4), vec![0u8; 4]);
    }

    #[test]
    fn punch_hole_keeps_size() {
        let mut d = Data::default();
        d.write(0, &vec![1u8; 3 * CHUNK as usize]).expect("write");
        d.zero(10, 2 * CHUNK);
        assert_eq!(d.size(), 3 * CHUNK);
        let r = d.read(0, 3 * CHUNK as u32);
        assert!(r[..10].iter().all(|&b| b == 1));
        assert!(r[10..(2 * CHUNK + 10) as usize].iter().all(|&b| b == 0));
        assert!(r[(2 * CHUNK + 10) as usize..].iter().all(|&b| b == 1));
    }

    #[test]
    fn offsets_past_the_limit_fail() {
        let mut d = Data::default();
        assert_eq!(d.write(i64::MAX as u64, b"x"), Err(libc::EFBIG));
        assert_eq!(d.write(u64::MAX, b"x"), Err(libc::EFBIG));
    }
}
