//! Whole-file fills (see `crate::fill`): a file read whole from the bucket becomes a
//! clean local copy whose next opens use passthrough, flushed before its row names this
//! cache, and a backing file given from a fill is the staging file every later change
//! goes to.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use super::*;
use crate::SetAttr;
use deskfs_cache::BlockKey;

/// 3 MiB and a bit: four blocks of the harness's 1 MiB, the last one short.
const SIZE: usize = (3 << 20) + 100;

/// A workspace holding `f` (SIZE bytes) in the bucket only (uploaded, then the cache dir
/// wiped), mounted again with passthrough on; the file's attributes and content.
fn cold_file() -> (Harness, Attr, Vec<u8>) {
    cold_file_with(test_cfg(), SIZE)
}

/// [`cold_file`] of `size` bytes in a workspace with `cfg`.
fn cold_file_with(cfg: VfsConfig, size: usize) -> (Harness, Attr, Vec<u8>) {
    let mut h = Harness::with_config(cfg);
    let data = pattern(size, 7);
    let a = h.file(ROOT_INO, "f", &data);
    h.sync_all();
    h.remount_after(|dir, _| std::fs::remove_dir_all(dir.join("cache")).unwrap());
    h.set_passthrough(true);
    assert_ne!(h.row(a.ino).unwrap().local, h.here(), "in the bucket only");
    (h, a, data)
}

/// Reads `ino` whole through a new read-only handle (128 KiB requests, as the kernel
/// does) and keeps the handle open; the handle.
fn read_whole(h: &Harness, ino: Ino, data: &[u8]) -> u64 {
    let o = h.open(&CTX, ino, libc::O_RDONLY).unwrap();
    assert!(
        o.backing.is_none(),
        "cold content is read through the daemon"
    );
    assert_eq!(h.read_to_end(ino, o.fh, 0, 128 << 10), data);
    o.fh
}

fn part_files(h: &Harness) -> Vec<String> {
    std::fs::read_dir(h.cache.staging_path(0).parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".part."))
        .collect()
}

/// A reader gets a fetched block before it is put into the fill: a process that reads the
/// file whole and closes it at once (`cat`) closes before the last puts. The fill is kept
/// for them (fails without: discarded at the last close, never adopted).
#[test]
fn a_file_read_whole_and_closed_before_its_last_blocks_are_kept_still_becomes_local() {
    let (h, a, data) = cold_file();
    h.fills.keep_delay_ms.store(300, Ordering::SeqCst);
    let fh = read_whole(&h, a.ino, &data);
    h.release(a.ino, fh).unwrap();
    assert!(
        wait_until(SYNC_TIMEOUT, || h.row(a.ino).unwrap().local == h.here()),
        "the fill is adopted although its last blocks were kept after the close"
    );
    h.fills.keep_delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(h.cat(a.ino), data);
}

#[test]
fn a_file_read_whole_becomes_a_flushed_local_copy_opened_through_passthrough() {
    let (h, a, data) = cold_file();
    let fh = read_whole(&h, a.ino, &data);
    h.release(a.ino, fh).unwrap();
    assert!(
        wait_until(SYNC_TIMEOUT, || h.row(a.ino).unwrap().local == h.here()),
        "the fill is adopted: this cache holds the content"
    );
    assert!(
        h.fills.flushes.load(Ordering::SeqCst) >= 1,
        "flushed before its row names this cache"
    );
    assert!(
        h.cache.staging_name_syncs() >= 1,
        "its name in the staging directory too"
    );
    assert_eq!(
        std::fs::read(h.cache.staging_path(a.ino)).unwrap(),
        data,
        "the staging file is the content, byte for byte"
    );
    assert!(
        wait_until(SYNC_TIMEOUT, || h.cache.stats().block_bytes == 0),
        "no second copy in the block cache: {} bytes",
        h.cache.stats().block_bytes
    );
    assert!(part_files(&h).is_empty(), "no fill file left");
    let o = h.open(&CTX, a.ino, libc::O_RDONLY).unwrap();
    let backing = o
        .backing
        .as_ref()
        .expect("the next open is a passthrough open");
    let mut got = vec![0u8; SIZE];
    backing.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, data);
    h.release(a.ino, o.fh).unwrap();
    assert!(
        !h.row(a.ino).unwrap().dirty,
        "a clean copy: nothing to upload"
    );
}

#[test]
fn a_reader_whose_first_pages_the_kernel_had_cached_still_fills_the_file() {
    let (h, a, data) = cold_file();
    // An earlier reader left the first 128 KiB in the kernel's page cache: this reader's
    // first request begins there.
    let fh = h.op(a.ino, libc::O_RDONLY);
    let start = 128 << 10;
    assert_eq!(
        h.read_to_end(a.ino, fh, start, 128 << 10),
        data[start as usize..]
    );
    h.release(a.ino, fh).unwrap();
    assert!(
        wait_until(SYNC_TIMEOUT, || h.row(a.ino).unwrap().local == h.here()),
        "the block the reader never asked for was fetched into the fill, which was adopted"
    );
    assert_eq!(std::fs::read(h.cache.staging_path(a.ino)).unwrap(), data);
}

#[test]
fn a_writer_after_readers_of_a_fill_writes_the_file_they_read() {
    let (h, a, data) = cold_file();
    h.fills.hold_adoption.store(true, Ordering::SeqCst);
    let fh = read_whole(&h, a.ino, &data);
    h.release(a.ino, fh).unwrap();
    assert!(
        wait_until(SYNC_TIMEOUT, || h.fills.flushes.load(Ordering::SeqCst) == 1),
        "the complete fill is flushed"
    );
    // Flushed, not adopted: a reader is given the fill itself.
    let r = h.open(&CTX, a.ino, libc::O_RDONLY).unwrap();
    let rb = r
        .backing
        .clone()
        .expect("a complete fill serves passthrough readers");
    assert_ne!(h.row(a.ino).unwrap().local, h.here(), "not adopted yet");
    // A writer now: the fill becomes the staging file.
    let w = h.open(&CTX, a.ino, libc::O_RDWR).unwrap();
    let wb = w
        .backing
        .clone()
        .expect("the writer shares the backing file");
    assert_eq!(
        h.row(a.ino).unwrap().local,
        h.here(),
        "adopted by the writable open"
    );
    wb.write_all_at(b"NEW", 1 << 20).unwrap();
    let mut seen = [0u8; 3];
    rb.read_exact_at(&mut seen, 1 << 20).unwrap();
    assert_eq!(&seen, b"NEW", "the reader reads the file the writer writes");
    h.release(a.ino, w.fh).unwrap();
    h.release(a.ino, r.fh).unwrap();
    // The kernel closes the backing file after the last release.
    drop((w, r, wb, rb));
    h.sync_all();
    let mut want = data.clone();
    want[1 << 20..(1 << 20) + 3].copy_from_slice(b"NEW");
    assert_eq!(
        h.bucket_file("f").as_deref(),
        Some(&want[..]),
        "the write is uploaded"
    );
    assert_eq!(h.cat(a.ino), want);
}

#[test]
fn a_truncate_while_a_fill_is_open_for_reading_truncates_that_file() {
    let (h, a, data) = cold_file();
    h.fills.hold_adoption.store(true, Ordering::SeqCst);
    let fh = read_whole(&h, a.ino, &data);
    h.release(a.ino, fh).unwrap();
    assert!(wait_until(SYNC_TIMEOUT, || h
        .fills
        .flushes
        .load(Ordering::SeqCst)
        == 1));
    let r = h.open(&CTX, a.ino, libc::O_RDONLY).unwrap();
    let rb = r.backing.clone().expect("passthrough from the fill");
    let set = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    h.setattr(&CTX, a.ino, &set).unwrap();
    assert_eq!(
        rb.metadata().unwrap().len(),
        0,
        "the reader's backing file is the file truncated"
    );
    h.release(a.ino, r.fh).unwrap();
    drop((r, rb));
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b""[..]));
}

#[test]
fn a_file_not_read_to_its_end_keeps_its_blocks_in_the_block_cache() {
    // Readahead of 2 blocks: reading 2.5 MiB fetches blocks 0-4 of 8.
    let cfg = VfsConfig {
        readahead_blocks: 2,
        ..test_cfg()
    };
    let (h, a, data) = cold_file_with(cfg, 8 << 20);
    let fh = h.op(a.ino, libc::O_RDONLY);
    let mut got = Vec::new();
    while got.len() < (5 << 20) / 2 {
        got.extend(h.read(a.ino, fh, got.len() as u64, 128 << 10).unwrap());
    }
    assert_eq!(got, data[..got.len()]);
    h.release(a.ino, fh).unwrap();
    assert!(
        wait_until(SYNC_TIMEOUT, || part_files(&h).is_empty()),
        "an unfinished fill is removed at the last close"
    );
    assert!(
        wait_until(SYNC_TIMEOUT, || h.cache.stats().block_bytes >= 3 << 20),
        "its blocks moved to the block cache: {} bytes",
        h.cache.stats().block_bytes
    );
    assert_ne!(h.row(a.ino).unwrap().local, h.here());
    assert_eq!(h.cat(a.ino), data, "and the file reads whole after it");
}

/// A block fetched for a fill that is discarded while the block is on its way (the last
/// close of a reader that stopped early, read-ahead in flight) goes to the block cache
/// like the fill's other blocks (fails without: the put into the discarded fill dropped
/// it, and the test above saw 2 of 3 MiB, now and then).
#[test]
fn a_block_arriving_for_a_fill_discarded_meanwhile_goes_to_the_block_cache() {
    let cfg = VfsConfig {
        readahead_blocks: 0,
        ..test_cfg()
    };
    let (h, a, data) = cold_file_with(cfg, SIZE);
    let version = h.row(a.ino).unwrap().data_version;
    let fh = h.op(a.ino, libc::O_RDONLY);
    // A fill begins with the second block of a read from the start.
    let upto = (1 << 20) + 4096;
    let mut got = Vec::new();
    while got.len() < upto {
        got.extend(h.read(a.ino, fh, got.len() as u64, 4096).unwrap());
    }
    assert_eq!(got, data[..upto]);
    let fill = h.fills.get(a.ino, version).expect("a fill began");
    h.release(a.ino, fh).unwrap();
    assert!(
        wait_until(SYNC_TIMEOUT, || part_files(&h).is_empty()),
        "the unfinished fill is discarded at the last close"
    );
    let k = BlockKey {
        ino: a.ino,
        version,
        index: 2,
    };
    assert!(!h.cache.has_block(&k), "block 2 was not fetched");
    // The fetch of block 2 that found the fill before the close lands now.
    h.fill_put(&fill, 2, &data[2 << 20..3 << 20]);
    assert_eq!(
        h.cache.read_block(&k).unwrap().as_deref(),
        Some(&data[2 << 20..3 << 20]),
        "the block is kept in the block cache"
    );
    assert_eq!(h.cat(a.ino), data);
}

/// Read-ahead from the bucket: a handle's first read (which may be anywhere) fetches
/// nothing ahead; each sequential read after it doubles the window, from 2 blocks up to
/// `readahead_blocks`, and fetches the blocks past the read within it; a read that jumps
/// turns it off again. (Read far from the start, so no whole-file fill is assembled.)
#[test]
fn a_sequential_reader_fetches_ahead_in_a_doubling_window_and_a_jump_stops_it() {
    const MIB: u64 = 1 << 20;
    let cfg = VfsConfig {
        readahead_blocks: 8,
        ..test_cfg()
    };
    let (h, a, data) = cold_file_with(cfg, 40 << 20);
    let version = h.row(a.ino).unwrap().data_version;
    let cached = |idx: u64| {
        h.cache.has_block(&BlockKey {
            ino: a.ino,
            version,
            index: idx,
        })
    };
    let settled = || wait_until(SYNC_TIMEOUT, || h.status().unwrap().buffers.held_bytes == 0);
    let fh = h.op(a.ino, libc::O_RDONLY);
    let mut off = 10 * MIB;
    // (the block read, the last block fetched ahead after it: none when equal)
    for (n, upto) in [(10, 10), (10, 12), (10, 14), (10, 18), (10, 18)] {
        let got = h.read(a.ino, fh, off, 4096).unwrap();
        assert_eq!(got, data[off as usize..off as usize + 4096]);
        off += 4096;
        assert!(settled(), "block fetches never ended");
        for idx in n + 1..=upto {
            assert!(
                cached(idx),
                "block {idx} was not fetched ahead (up to {upto})"
            );
        }
        assert!(
            !cached(upto + 1),
            "block {} was fetched ahead (up to {upto} expected)",
            upto + 1
        );
    }
    // A jump: the read's own block only, and the window starts over.
    off = 30 * MIB;
    assert_eq!(
        h.read(a.ino, fh, off, 4096).unwrap(),
        data[off as usize..off as usize + 4096]
    );
    assert!(settled());
    assert!(
        cached(30) && !cached(31),
        "a read after a jump fetched ahead"
    );
    off += 4096;
    assert_eq!(
        h.read(a.ino, fh, off, 4096).unwrap(),
        data[off as usize..off as usize + 4096]
    );
    assert!(settled());
    assert!(
        cached(32) && !cached(33),
        "the window after a jump starts at 2 blocks"
    );
    h.release(a.ino, fh).unwrap();
}

/// Reads that cross a block boundary get the bytes of both blocks, whichever way each
/// block comes: fetched from the bucket, from the block cache, or from a whole-file fill.
#[test]
fn reads_across_block_boundaries_join_both_blocks() {
    const MIB: usize = 1 << 20;
    let (h, a, data) = cold_file_with(test_cfg(), 12 * MIB);
    let fh = h.op(a.ino, libc::O_RDONLY);
    // From the start (a fill assembles the file): 300 KiB reads, some across blocks.
    let mut off = 0;
    while off < 3 * MIB {
        let got = h.read(a.ino, fh, off as u64, 300 << 10).unwrap();
        assert_eq!(got, data[off..off + got.len()], "at {off} (fill)");
        assert_eq!(got.len(), 300 << 10, "a short read at {off} (fill)");
        off += got.len();
    }
    h.release(a.ino, fh).unwrap();
    // Far from the start (no fill): the same span cold, then from the block cache.
    let span = 10 * MIB - 1000;
    for how in ["fetched", "cached"] {
        let fh = h.op(a.ino, libc::O_RDONLY);
        let got = h.read(a.ino, fh, span as u64, 4000).unwrap();
        assert_eq!(
            got,
            data[span..span + 4000],
            "across blocks 9 and 10 ({how})"
        );
        h.release(a.ino, fh).unwrap();
    }
}

/// Reads `[from, to)` of `ino` through `fh` in `chunk`-byte requests, checked against
/// `data`.
fn read_span(h: &Harness, ino: Ino, fh: u64, data: &[u8], from: u64, to: u64, chunk: u32) {
    let mut off = from;
    while off < to {
        let want = (to - off).min(u64::from(chunk)) as u32;
        let got = h.read(ino, fh, off, want).unwrap();
        assert_eq!(
            got,
            data[off as usize..off as usize + got.len()],
            "at {off}"
        );
        assert!(!got.is_empty(), "a short read at {off}");
        off += got.len() as u64;
    }
}

/// After the last close: whether the file became local (its fill was adopted), once any
/// unfinished fill was removed.
fn became_local(h: &Harness, ino: Ino) -> bool {
    if wait_until(SYNC_TIMEOUT, || h.row(ino).unwrap().local == h.here()) {
        return true;
    }
    assert!(wait_until(SYNC_TIMEOUT, || part_files(h).is_empty()));
    false
}

/// Releases `fh` and checks that the file became local with `data` (`why` when not).
fn closed_and_local(h: &Harness, ino: Ino, fh: u64, data: &[u8], why: &str) {
    h.release(ino, fh).unwrap();
    assert!(became_local(h, ino), "{why}");
    assert_eq!(std::fs::read(h.cache.staging_path(ino)).unwrap(), data);
}

/// 16 MiB: sixteen whole blocks (a size the top-up's last-block test must get right),
/// twice `FILL_JUMP`, and the most a fill may take of the harness's 64 MiB cache (a
/// quarter).
const BIG: usize = 16 << 20;

/// [`cold_file_with`] of [`BIG`] bytes, read ahead 2 blocks at most, and a read-only
/// handle of it.
fn big_cold_file() -> (Harness, Attr, Vec<u8>, u64) {
    let cfg = VfsConfig {
        readahead_blocks: 2,
        ..test_cfg()
    };
    let (h, a, data) = cold_file_with(cfg, BIG);
    let fh = h.op(a.ino, libc::O_RDONLY);
    (h, a, data, fh)
}

/// A reader that began at offset 0 and skips ahead by at most `FILL_JUMP` (8 MiB) before
/// its fill began (a fill starts at the first read past block 0) is still reading the
/// file whole: the blocks it skipped are fetched when it reaches the last block and the
/// file becomes local. Fails when a skip of exactly `FILL_JUMP` counts as a jump.
#[test]
fn a_skip_of_at_most_fill_jump_keeps_a_reader_whole_file() {
    let (h, a, data, fh) = big_cold_file();
    read_span(&h, a.ino, fh, &data, 0, 512 << 10, 128 << 10);
    let skip_to = (512 << 10) + (8 << 20);
    read_span(&h, a.ino, fh, &data, skip_to, BIG as u64, 128 << 10);
    closed_and_local(
        &h,
        a.ino,
        fh,
        &data,
        "the skipped blocks were not filled in",
    );
}

/// A reader whose first request begins within `FILL_JUMP` of the start (the kernel served
/// the pages before it from its cache) is a whole-file reader from that first request on,
/// even when its next requests are past `FILL_JUMP`; the blocks before its first request
/// are fetched when it reaches the last block. Fails when only later requests near the
/// start count, or when the last block is misjudged (a size of whole blocks).
#[test]
fn a_first_read_near_the_start_makes_a_whole_file_reader() {
    let (h, a, data, fh) = big_cold_file();
    let first = (15 << 20) / 2; // 7.5 MiB: its 1 MiB request ends past FILL_JUMP
    read_span(&h, a.ino, fh, &data, first, BIG as u64, 1 << 20);
    closed_and_local(
        &h,
        a.ino,
        fh,
        &data,
        "the blocks before the first read were not filled in",
    );
}

/// A reader whose first request begins past `FILL_JUMP` is not reading the file whole:
/// reading on to the end makes no local copy. Fails when any first read counts.
#[test]
fn a_first_read_past_fill_jump_is_not_a_whole_file_reader() {
    let (h, a, data, fh) = big_cold_file();
    read_span(&h, a.ino, fh, &data, 9 << 20, BIG as u64, 128 << 10);
    h.release(a.ino, fh).unwrap();
    assert!(
        !became_local(&h, a.ino),
        "a partial reader made the file local"
    );
    let version = h.row(a.ino).unwrap().data_version;
    assert!(
        !h.cache.has_block(&BlockKey {
            ino: a.ino,
            version,
            index: 0
        }),
        "the start of the file was fetched for a reader that never asked for it"
    );
}

/// The blocks before a whole-file reader's first request are fetched only once it reads
/// the last block: one that stops before the end never pays for them. Fails when the
/// top-up runs on other reads.
#[test]
fn blocks_before_a_readers_first_request_are_fetched_only_at_the_last_block() {
    let (h, a, data, fh) = big_cold_file();
    read_span(&h, a.ino, fh, &data, 3 << 20, 6 << 20, 128 << 10);
    h.release(a.ino, fh).unwrap();
    assert!(!became_local(&h, a.ino));
    assert!(wait_until(SYNC_TIMEOUT, || h
        .status()
        .unwrap()
        .buffers
        .held_bytes
        == 0));
    let version = h.row(a.ino).unwrap().data_version;
    for index in 0..3 {
        assert!(
            !h.cache.has_block(&BlockKey {
                ino: a.ino,
                version,
                index
            }),
            "block {index}, before the reader's first request, was fetched"
        );
    }
    assert!(
        h.cache.has_block(&BlockKey {
            ino: a.ino,
            version,
            index: 3
        }),
        "the blocks it read went to the block cache"
    );
}
