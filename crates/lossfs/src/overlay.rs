//! A regular file's unsynced data: whole 4 KiB pages written since its last durable
//! state, over the backing file's content.
//!
//! The file as the mount shows it is, byte by byte at offset `o < size`: the overlay page
//! holding `o` if there is one; else the backing file's byte if `o < base_len`; else zero.
//! `base_len` is the backing length at the last durable state, lowered by every truncate
//! since (bytes a truncate cut off must not come back when the file grows again). An
//! overlay page is complete: the first write into a page reads the page's visible content
//! (backing bytes below `base_len`, zeros past it) and then applies the write.
//!
//! Making the file durable ([`Overlay::persist`]) cuts the backing file to `base_len`,
//! writes each page (clipped to `size`), and sets the length to `size`. A power cut with
//! reordering ([`Overlay::persist_some`]) may keep any subset of the pages and, as one more
//! unit, the size change.

use std::collections::BTreeMap;
use std::io;

/// Page size: the unit of data a power cut keeps or loses (pages are never torn).
pub(crate) const PAGE: u64 = 4096;

/// Where an overlay reads and writes the backing content (a file; a `Vec` in tests).
pub(crate) trait Backing {
    /// The backing content's length.
    fn len(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`, zeros past the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `buf` at `offset`.
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Sets the length.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

impl Backing for std::fs::File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut done = 0usize;
        while done < buf.len() {
            let n = FileExt::read_at(self, &mut buf[done..], offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf[done..].fill(0);
        Ok(())
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)
    }
}

impl Backing for Vec<u8> {
    fn len(&self) -> io::Result<u64> {
        Ok(Vec::len(self) as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        buf.fill(0);
        let from = (offset as usize).min(Vec::len(self));
        let to = (from + buf.len()).min(Vec::len(self));
        buf[..to - from].copy_from_slice(&self[from..to]);
        Ok(())
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = offset as usize + buf.len();
        if Vec::len(self) < end {
            self.resize(end, 0);
        }
        self[offset as usize..end].copy_from_slice(buf);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.resize(len as usize, 0);
        Ok(())
    }
}

/// What a reordered persist kept of one file.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Kept {
    /// Indexes of the pages kept.
    pub(crate) pages: Vec<u64>,
    /// Number of pages that were pending.
    pub(crate) of: usize,
    /// Whether the size change (truncate/extend) was kept.
    pub(crate) size: bool,
}

/// A file's content as the mount shows it, over its backing content.
#[derive(Debug, Clone)]
pub(crate) struct Overlay {
    size: u64,
    base_len: u64,
    pages: BTreeMap<u64, Box<[u8]>>,
    /// Something changed since the last durable state (data or size).
    dirty: bool,
}

impl Overlay {
    /// A clean overlay over backing content of `len` bytes.
    pub(crate) fn clean(len: u64) -> Overlay {
        Overlay {
            size: len,
            base_len: len,
            pages: BTreeMap::new(),
            dirty: false,
        }
    }

    /// The file's size as the mount shows it.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Whether there are unsynced changes.
    pub(crate) fn dirty(&self) -> bool {
        self.dirty
    }

    /// Bytes held in pages.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }

    /// Whether reading needs the backing content (some visible byte comes from it).
    pub(crate) fn needs_base(&self) -> bool {
        self.base_len > 0
    }

    /// The visible content of page `idx` (from the overlay, else built from the backing).
    fn page(&self, idx: u64, base: &dyn Backing) -> io::Result<Box<[u8]>> {
        if let Some(p) = self.pages.get(&idx) {
            return Ok(p.clone());
        }
        let mut p = vec![0u8; PAGE as usize].into_boxed_slice();
        let start = idx * PAGE;
        let visible = self.base_len.min(self.size);
        if start < visible {
            let n = (visible - start).min(PAGE) as usize;
            base.read_at(&mut p[..n], start)?;
        }
        Ok(p)
    }

    /// Up to `len` bytes from `offset` (fewer at the end, none past it).
    pub(crate) fn read(&self, offset: u64, len: u32, base: &dyn Backing) -> io::Result<Vec<u8>> {
        if offset >= self.size {
            return Ok(Vec::new());
        }
        let end = self.size.min(offset.saturating_add(u64::from(len)));
        let mut out = vec![0u8; (end - offset) as usize];
        let mut pos = offset;
        while pos < end {
            let idx = pos / PAGE;
            let pstart = idx * PAGE;
            let to = end.min(pstart + PAGE);
            let dst = &mut out[(pos - offset) as usize..(to - offset) as usize];
            if let Some(p) = self.pages.get(&idx) {
                dst.copy_from_slice(&p[(pos - pstart) as usize..(to - pstart) as usize]);
            } else {
                let visible = self.base_len.min(to);
                if pos < visible {
                    base.read_at(&mut dst[..(visible - pos) as usize], pos)?;
                }
            }
            pos = to;
        }
        Ok(out)
    }

    /// Writes `data` at `offset`, growing the file as needed.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8], base: &dyn Backing) -> io::Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        let mut pos = offset;
        while pos < end {
            let idx = pos / PAGE;
            let pstart = idx * PAGE;
            let to = end.min(pstart + PAGE);
            let mut page = match self.pages.remove(&idx) {
                Some(p) => p,
                None => self.page(idx, base)?,
            };
            page[(pos - pstart) as usize..(to - pstart) as usize]
                .copy_from_slice(&data[(pos - offset) as usize..(to - offset) as usize]);
            self.pages.insert(idx, page);
            pos = to;
        }
        self.size = self.size.max(end);
        self.dirty = true;
        Ok(())
    }

    /// Zeroes `offset..end` (within the size: the caller grows the file first).
    pub(crate) fn zero(&mut self, offset: u64, end: u64, base: &dyn Backing) -> io::Result<()> {
        let end = end.min(self.size);
        let mut pos = offset;
        while pos < end {
            let idx = pos / PAGE;
            let pstart = idx * PAGE;
            let to = end.min(pstart + PAGE);
            let range = (pos - pstart) as usize..(to - pstart) as usize;
            if let Some(p) = self.pages.get_mut(&idx) {
                p[range].fill(0);
            } else if pos < self.base_len {
                // Backing bytes show here: the page must hide them.
                let mut p = self.page(idx, base)?;
                p[range].fill(0);
                self.pages.insert(idx, p);
            }
            // Else the range reads as zeros already.
            pos = to;
        }
        self.dirty = true;
        Ok(())
    }

    /// Sets the size: cut pages and backing bytes past it; growing reads as zeros.
    pub(crate) fn truncate(&mut self, size: u64) {
        if size < self.size {
            self.base_len = self.base_len.min(size);
            let first_gone = size.div_ceil(PAGE);
            self.pages.retain(|&idx, _| idx < first_gone);
            if size % PAGE != 0 {
                if let Some(p) = self.pages.get_mut(&(size / PAGE)) {
                    p[(size % PAGE) as usize..].fill(0);
                }
            }
        }
        self.size = size;
        self.dirty = true;
    }

    /// Makes everything durable in `f`, and the overlay clean (the caller syncs `f`).
    pub(crate) fn persist(&mut self, f: &mut dyn Backing) -> io::Result<()> {
        self.persist_some(f, true, &mut |_| true)?;
        *self = Overlay::clean(self.size);
        Ok(())
    }

    /// Writes to `f` what a disk may have written of this overlay before a power cut:
    /// each page for which `keep` says yes, and the size change if `keep_size`. Without
    /// the size change, pages are clipped to the backing file's length (past it they
    /// would not be visible: the size is what makes them so).
    pub(crate) fn persist_some(
        &self,
        f: &mut dyn Backing,
        keep_size: bool,
        keep: &mut dyn FnMut(u64) -> bool,
    ) -> io::Result<Kept> {
        let mut kept = Kept {
            size: keep_size,
            of: self.pages.len(),
            ..Kept::default()
        };
        let cur = f.len()?;
        let limit = if keep_size {
            if self.base_len < cur {
                f.set_len(self.base_len)?;
            }
            self.size
        } else {
            self.size.min(cur)
        };
        for (&idx, page) in &self.pages {
            if !keep(idx) {
                continue;
            }
            kept.pages.push(idx);
            let start = idx * PAGE;
            if start >= limit {
                continue;
            }
            let n = (limit - start).min(PAGE) as usize;
            f.write_at(&page[..n], start)?;
        }
        if keep_size && f.len()? != self.size {
            f.set_len(self.size)?;
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(o: &Overlay, base: &Vec<u8>) -> Vec<u8> {
        o.read(0, u32::MAX, base).expect("read")
    }

    #[test]
    fn overlay_applies_over_backing() {
        let base: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8).collect();
        let mut o = Overlay::clean(base.len() as u64);
        o.write(5000, b"hello", &base).expect("write");
        let mut want = base.clone();
        want[5000..5005].copy_from_slice(b"hello");
        assert_eq!(view(&o, &base), want);
        // A read straddling pages.
        assert_eq!(o.read(4998, 9, &base).expect("read"), want[4998..5007]);
        assert_eq!(o.pending_bytes(), PAGE);
        // Growing past the end.
        o.write(12000, b"xy", &base).expect("write");
        want.resize(12000, 0);
        want.extend_from_slice(b"xy");
        assert_eq!(view(&o, &base), want);
        assert!(o.dirty());
    }

    #[test]
    fn truncate_then_grow_reads_zeros() {
        let base = vec![7u8; 9000];
        let mut o = Overlay::clean(9000);
        o.truncate(100);
        o.truncate(9000);
        let mut want = vec![7u8; 100];
        want.resize(9000, 0);
        assert_eq!(view(&o, &base), want);
        // A page written after the truncate must not bring old bytes back.
        let mut o = Overlay::clean(9000);
        o.write(0, b"a", &base).expect("write");
        o.truncate(2);
        o.write(4000, b"b", &base).expect("write");
        let v = view(&o, &base);
        assert_eq!(v.len(), 4001);
        assert_eq!(&v[..2], &[b'a', 7]);
        assert!(v[2..4000].iter().all(|&b| b == 0));
        assert_eq!(v[4000], b'b');
    }

    #[test]
    fn zero_hides_backing_and_overlay_bytes() {
        let base = vec![3u8; 3 * PAGE as usize];
        let mut o = Overlay::clean(base.len() as u64);
        o.write(2 * PAGE, &[4u8; 10], &base).expect("write");
        o.zero(100, 2 * PAGE + 5, &base).expect("zero");
        let v = view(&o, &base);
        assert!(v[..100].iter().all(|&b| b == 3));
        assert!(v[100..2 * PAGE as usize + 5].iter().all(|&b| b == 0));
        assert_eq!(&v[2 * PAGE as usize + 5..2 * PAGE as usize + 10], &[4u8; 5]);
        assert!(v[2 * PAGE as usize + 10..].iter().all(|&b| b == 3));
        // Past the backing content nothing needs a page.
        let mut o = Overlay::clean(0);
        o.truncate(10 * PAGE);
        o.zero(0, 10 * PAGE, &base).expect("zero");
        assert_eq!(o.pending_bytes(), 0);
    }

    #[test]
    fn persist_makes_backing_equal_view() {
        let mut base = vec![1u8; 10000];
        let mut o = Overlay::clean(10000);
        o.write(4090, &[2u8; 20], &base).expect("write");
        o.truncate(6000);
        o.write(8000, &[3u8; 10], &base).expect("write");
        let want = view(&o, &base);
        o.persist(&mut base).expect("persist");
        assert_eq!(base, want);
        assert!(!o.dirty());
        assert_eq!(o.pending_bytes(), 0);
        assert_eq!(view(&o, &base), want);
    }

    #[test]
    fn persist_some_keeps_chosen_pages_only() {
        let mut base = vec![0u8; 3 * PAGE as usize];
        let mut o = Overlay::clean(base.len() as u64);
        for i in 0..3u64 {
            o.write(i * PAGE, &[9u8; 4], &base).expect("write");
        }
        // Past the end: visible only with the size.
        o.write(5 * PAGE, &[8u8; 4], &base).expect("write");
        let kept = o
            .persist_some(&mut base, false, &mut |idx| idx != 1)
            .expect("persist");
        assert_eq!(kept.pages, vec![0, 2, 5]);
        assert_eq!(base.len(), 3 * PAGE as usize);
        assert_eq!(base[0], 9);
        assert_eq!(base[PAGE as usize], 0);
        assert_eq!(base[2 * PAGE as usize], 9);
        let mut base2 = vec![0u8; 3 * PAGE as usize];
        o.persist_some(&mut base2, true, &mut |idx| idx == 5)
            .expect("persist");
        assert_eq!(base2.len() as u64, 5 * PAGE + 4);
        assert_eq!(base2[0], 0);
        assert_eq!(base2[5 * PAGE as usize], 8);
    }
}
