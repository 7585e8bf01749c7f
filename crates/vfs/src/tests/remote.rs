//! Close-to-open across caches: content only this mount's journal holds is uploaded when
//! another mount asks for it, also after it lost its name.

use deskfs_meta::{read, txn};

use super::*;

/// An inode another mount asked for that was renamed over (an orphan now) before the
/// uploader got to its path is uploaded to its orphan key when the request is followed
/// up: the path's upload would upload what the path names now, not it.
#[test]
fn a_wanted_inode_that_lost_its_name_is_uploaded_as_an_orphan() {
    let h = Harness::with_config(VfsConfig {
        upload_delay: Duration::from_secs(3600),
        ..test_cfg()
    });
    let x = h.file(ROOT_INO, "result", b"version one");
    let id = h.cache.id();
    txn(&*h.meta, |t| t.want_upload(x.ino, id, now_ns())).unwrap();
    h.file(ROOT_INO, ".tmp", b"version two");
    h.rename(&CTX, ROOT_INO, b".tmp", ROOT_INO, b"result", 0)
        .unwrap();
    let row = h.row(x.ino).expect("kept while the kernel knows it");
    assert_eq!(row.nlink, 0);
    h.settle_wanted(&[x.ino]);
    let obj = read(&*h.meta, |t| t.object_with_content(x.ino, row.data_version))
        .unwrap()
        .expect("the orphan's content was uploaded");
    assert_eq!(
        h.bucket_file(&obj.key).as_deref(),
        Some(&b"version one"[..])
    );
    assert!(
        read(&*h.meta, |t| t.wanted_for(id)).unwrap().is_empty(),
        "the request is answered"
    );
}
