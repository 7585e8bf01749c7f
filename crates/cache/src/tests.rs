use super::*;

#[test]
fn blocks_roundtrip_and_evict() {
    let d = tempfile::tempdir().unwrap();
    let c = Cache::open(d.path(), 3000, 1024).unwrap();
    for i in 0..5 {
        let k = BlockKey {
            ino: 7,
            version: 1,
            index: i,
        };
        c.write_block(&k, &[i as u8; 1000]).unwrap();
    }
    // cap 3000 keeps the 3 newest
    let k0 = BlockKey {
        ino: 7,
        version: 1,
        index: 0,
    };
    let k4 = BlockKey {
        ino: 7,
        version: 1,
        index: 4,
    };
    assert_eq!(c.read_block(&k0).unwrap(), None);
    assert_eq!(c.read_block(&k4).unwrap().unwrap(), vec![4u8; 1000]);
    assert_eq!(c.stats().block_bytes, 3000);
    // reopen re-indexes
    drop(c);
    let c = Cache::open(d.path(), 3000, 1024).unwrap();
    assert_eq!(c.stats().blocks, 3);
    c.drop_blocks(7);
    assert_eq!(c.stats().blocks, 0);
}

#[test]
fn staging_files() {
    let d = tempfile::tempdir().unwrap();
    let c = Cache::open(d.path(), 100, 1024).unwrap();
    use std::os::unix::fs::FileExt;
    let f = c.open_staging(42, true).unwrap();
    f.write_at(b"hello", 0).unwrap();
    assert!(c.has_staging(42));
    assert_eq!(c.staging_inodes().unwrap(), vec![42]);
    c.staging_clean(42, 500);
    assert_eq!(c.over_capacity(), vec![42]);
    c.staging_dirty(42);
    assert!(
        c.over_capacity().is_empty(),
        "dirty staging is never a victim"
    );
    c.remove_staging(42).unwrap();
    assert!(!c.has_staging(42));
}

/// Files named `r<N>` in the pool dir (recycled staging files).
fn recycled_in_pool(root: &std::path::Path) -> usize {
    let dir = root.join("pools").join(std::process::id().to_string());
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with('r'))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn recycled_staging_files_come_back_empty_and_readers_block_recycling() {
    let dir = tempfile::tempdir().unwrap();
    let cache = std::sync::Arc::new(Cache::open(dir.path(), 1 << 30, 1 << 20).unwrap());
    {
        use std::io::Write;
        let mut f = cache.open_staging(1, true).unwrap();
        f.write_all(b"old content of a purged inode").unwrap();
    }
    // Read by path (an upload): deleted, not recycled.
    {
        let _g = cache.read_guard(1);
        cache.recycle_staging(1).unwrap();
    }
    assert!(!cache.has_staging(1));
    assert_eq!(recycled_in_pool(dir.path()), 0);
    // Nobody reads it: recycled into the pool.
    {
        use std::io::Write;
        let mut f = cache.open_staging(2, true).unwrap();
        f.write_all(b"more old content").unwrap();
    }
    cache.recycle_staging(2).unwrap();
    assert!(!cache.has_staging(2));
    assert_eq!(recycled_in_pool(dir.path()), 1);
    // The pool thread empties it and hands it out: every new staging file starts empty.
    cache.start_pool(4);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for ino in 10..30u64 {
        let f = cache.open_staging(ino, true).unwrap();
        assert_eq!(
            f.metadata().unwrap().len(),
            0,
            "staging file {ino} not empty"
        );
        assert!(std::time::Instant::now() < deadline);
    }
    // Absent files are fine.
    cache.recycle_staging(999).unwrap();
}

#[test]
fn partial_downloads_of_dead_processes_are_removed_by_the_staging_scan() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    // pid 1 is alive (init); a huge pid is not.
    for name in [
        "7.part",
        "8.part.4000000000.1",
        "9.part.1.3",
        "10",
        "notes.part.x",
    ] {
        std::fs::write(staging.join(name), b"x").unwrap();
    }
    let c = Cache::open(dir.path(), 1 << 20, 1 << 20).unwrap();
    assert!(
        staging.join("7.part").exists(),
        "opening does not scan the staging area (a million files take seconds)"
    );
    assert_eq!(c.staging_inodes().unwrap(), vec![10]);
    assert!(!staging.join("7.part").exists());
    assert!(!staging.join("8.part.4000000000.1").exists());
    assert!(
        staging.join("9.part.1.3").exists(),
        "a live process's download stays"
    );
    assert!(staging.join("10").exists(), "staging files stay");
    assert!(staging.join("notes.part.x").exists(), "other names stay");
}

#[test]
fn cache_ids_are_stable_and_old_caches_are_one() {
    let dir = tempfile::tempdir().unwrap();
    let a = Cache::open(&dir.path().join("a"), 1 << 20, 4096).unwrap();
    let id = a.id();
    assert!(id >= 2);
    drop(a);
    assert_eq!(
        Cache::open(&dir.path().join("a"), 1 << 20, 4096)
            .unwrap()
            .id(),
        id
    );
    let b = Cache::open(&dir.path().join("b"), 1 << 20, 4096).unwrap();
    assert_ne!(b.id(), id, "two caches, two ids");
    // A cache dir from before ids: staging files but no cache-id file.
    let old = dir.path().join("old");
    std::fs::create_dir_all(old.join("staging")).unwrap();
    std::fs::write(old.join("staging/17"), b"x").unwrap();
    assert_eq!(Cache::open(&old, 1 << 20, 4096).unwrap().id(), 1);
    std::fs::write(dir.path().join("a/cache-id"), b"junk").unwrap();
    assert!(Cache::open(&dir.path().join("a"), 1 << 20, 4096).is_err());
}

/// A new inode's staging file is empty, from the pool or made on the spot, even where a
/// stale file with the same inode number was left (an earlier database's): its bytes
/// must never show through a later extension of the new, empty file.
#[test]
fn a_new_staging_file_is_empty_whatever_was_at_its_path() {
    use std::io::{Read, Write};
    let d = tempfile::tempdir().unwrap();
    let c = std::sync::Arc::new(Cache::open(d.path(), 100, 1024).unwrap());
    for pooled in [false, true] {
        if pooled {
            c.start_pool(4);
            let t = std::time::Instant::now();
            while c.pool.ready() == 0 {
                assert!(
                    t.elapsed() < std::time::Duration::from_secs(10),
                    "pool never filled"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let ino = 40 + pooled as u64;
        std::fs::write(c.staging_path(ino), b"stale bytes of another database").unwrap();
        let mut f = c.create_staging(ino).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0, "pooled: {pooled}");
        f.set_len(5).unwrap();
        f.flush().unwrap();
        let mut got = Vec::new();
        std::fs::File::open(c.staging_path(ino))
            .unwrap()
            .read_to_end(&mut got)
            .unwrap();
        assert_eq!(got, vec![0u8; 5], "pooled: {pooled}");
    }
}

#[test]
fn the_pool_of_a_gone_process_is_adopted_and_its_recycled_files_come_back_empty() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    // A pool left by a mount that is gone (no such pid): one empty file, one recycled
    // staging file still holding the content of a purged inode.
    let dead = dir.path().join("pools").join("999999999");
    std::fs::create_dir_all(&dead).unwrap();
    std::fs::write(dead.join("5"), b"").unwrap();
    std::fs::write(dead.join("r7"), b"content of a purged inode").unwrap();
    let mut before: Vec<u64> = ["5", "r7"]
        .iter()
        .map(|n| std::fs::metadata(dead.join(n)).unwrap().ino())
        .collect();
    before.sort();
    let cache = std::sync::Arc::new(Cache::open(dir.path(), 1 << 30, 1 << 20).unwrap());
    cache.start_pool(2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cache.pool.ready() < 2 {
        assert!(std::time::Instant::now() < deadline, "pool never filled");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!dead.exists(), "the gone process's pool dir is taken over");
    assert_eq!(cache.stats().reserve_files, 2);
    // The ready files are the adopted ones (no inode allocated), both empty.
    let ours = dir
        .path()
        .join("pools")
        .join(std::process::id().to_string());
    let mut got = Vec::new();
    for e in std::fs::read_dir(&ours).unwrap() {
        let m = e.unwrap().metadata().unwrap();
        assert_eq!(m.len(), 0, "a ready file is empty");
        got.push(m.ino());
    }
    got.sort();
    assert_eq!(got, before, "the reserve survived the process that made it");
    let f = cache.create_staging(1).unwrap();
    assert_eq!(
        f.metadata().unwrap().len(),
        0,
        "a new staging file starts empty"
    );
    assert!(before.contains(&f.metadata().unwrap().ino()));
}

#[test]
fn the_reserve_takes_a_bounded_share_of_free_inodes() {
    use crate::pool::goal_for;
    assert_eq!(goal_for(8192, Some((1_000_000, 900_000))), 8192);
    // 1/8 of the free inodes at most, and a small floor while that is still cheap.
    assert_eq!(goal_for(8192, Some((16_384, 16_000))), 2000);
    assert_eq!(goal_for(8192, Some((4096, 300))), 64);
    assert_eq!(goal_for(8192, Some((4096, 100))), 12);
    assert_eq!(goal_for(8192, Some((4096, 0))), 0);
    // No inode counts (btrfs): not limited; counts unknown: the floor only.
    assert_eq!(goal_for(8192, Some((0, 0))), 8192);
    assert_eq!(goal_for(8192, None), 64);
}

#[test]
fn the_reserve_grows_after_a_burst_never_during_one() {
    use crate::pool::Sizing;
    let mut s = Sizing::new(8192, 0);
    assert_eq!(
        (s.want(true), s.want(false)),
        (64, 64),
        "a new mount keeps a few"
    );
    s.burst_ended(5000);
    assert_eq!(s.want(true), 8192, "twice the burst, at most the bound");
    assert_eq!(s.want(false), 64, "during a burst only a few are made");
    s.burst_ended(10);
    assert_eq!(s.want(true), 8192, "never shrinks");
    // A remount starts from the reserve it adopted.
    assert_eq!(Sizing::new(8192, 3000).want(true), 3000);
    assert_eq!(Sizing::new(16, 3000).want(true), 16);
}
