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
