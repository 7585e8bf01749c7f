//! Bucket fidelity: after `sync`, the bucket directory (read directly) holds exactly the
//! workspace, 1 path = 1 object.

use super::*;
use crate::rename_flags::EXCHANGE;
use std::sync::atomic::Ordering::SeqCst;

#[test]
fn files_and_nested_directories() {
    let h = Harness::new();
    let a = h.dir(ROOT_INO, "a");
    let b = h.dir(a.ino, "b");
    h.dir(ROOT_INO, "empty");
    h.file(b.ino, "c.txt", b"deep");
    h.file(ROOT_INO, "top.txt", b"top");
    h.file(a.ino, "zero", b"");
    let utf = h.file(a.ino, "été 日本.txt", b"unicode");
    h.sync_all();
    assert_eq!(h.bucket_file("a/b/c.txt").as_deref(), Some(&b"deep"[..]));
    assert_eq!(h.bucket_file("top.txt").as_deref(), Some(&b"top"[..]));
    assert_eq!(h.bucket_file("a/zero").as_deref(), Some(&b""[..]));
    assert_eq!(
        h.bucket_file("a/été 日本.txt").as_deref(),
        Some(&b"unicode"[..])
    );
    assert!(h.bucket_is_dir("empty"), "empty directory has its marker");
    assert!(h.bucket_is_dir("a/b"));
    assert_eq!(
        h.bucket_files(),
        ["a/b/c.txt", "a/zero", "a/été 日本.txt", "top.txt"]
    );
    // Uploaded content is clean now.
    let row = h.row(utf.ino).unwrap();
    assert!(!row.dirty);
    assert_eq!(h.status().unwrap().pending_uploads, 0);
}

#[test]
fn overwrite_truncate_and_append_reach_the_bucket() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"version one");
    h.sync_all();
    let fh = h.op(f.ino, libc::O_WRONLY | libc::O_TRUNC);
    h.put(f.ino, fh, 0, b"v2");
    h.release(f.ino, fh).unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"v2"[..]));
    let fh = h.op(f.ino, libc::O_WRONLY | libc::O_APPEND);
    h.put(f.ino, fh, 0, b"+more");
    h.release(f.ino, fh).unwrap();
    h.setattr(
        &CTX,
        f.ino,
        &crate::SetAttr {
            size: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"v2+m"[..]));
    // Writes still open at sync time are committed by sync.
    let fh = h.op(f.ino, libc::O_WRONLY);
    h.put(f.ino, fh, 0, b"OPEN");
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"OPEN"[..]));
    h.release(f.ino, fh).unwrap();
}

#[test]
fn renamed_file_moves_in_the_bucket() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.file(ROOT_INO, "old.txt", b"moving");
    h.sync_all();
    assert!(h.bucket_file("old.txt").is_some());
    h.rename(&CTX, ROOT_INO, b"old.txt", d.ino, b"new.txt", 0)
        .unwrap();
    h.sync_all();
    assert!(h.bucket_file("old.txt").is_none(), "old object gone");
    assert_eq!(h.bucket_file("d/new.txt").as_deref(), Some(&b"moving"[..]));
    assert_eq!(h.bucket_files(), ["d/new.txt"]);
}

#[test]
fn rename_over_an_existing_file_replaces_the_object() {
    let h = Harness::new();
    h.file(ROOT_INO, "a", b"from a");
    h.file(ROOT_INO, "b", b"old b");
    h.sync_all();
    h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"b", 0).unwrap();
    h.sync_all();
    assert_eq!(h.bucket_files(), ["b"]);
    assert_eq!(h.bucket_file("b").as_deref(), Some(&b"from a"[..]));
}

#[test]
fn deleted_file_leaves_the_bucket() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "x", b"x");
    h.file(d.ino, "y", b"y");
    h.sync_all();
    h.unlink(&CTX, d.ino, b"x").unwrap();
    h.sync_all();
    assert!(h.bucket_file("d/x").is_none());
    assert_eq!(h.bucket_file("d/y").as_deref(), Some(&b"y"[..]));
    // A removed directory leaves too.
    h.unlink(&CTX, d.ino, b"y").unwrap();
    h.rmdir(&CTX, ROOT_INO, b"d").unwrap();
    h.sync_all();
    assert!(!h.bucket_dir().join("d").exists());
    assert!(h.bucket_files().is_empty());
}

/// Deleting the last file of a directory that still exists must leave the directory's
/// marker in the bucket (an empty directory is a marker object).
#[test]
fn emptied_directory_keeps_its_marker() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "only", b"x");
    h.sync_all();
    assert!(h.bucket_is_dir("d"));
    h.unlink(&CTX, d.ino, b"only").unwrap();
    h.sync_all();
    assert!(h.bucket_file("d/only").is_none());
    assert!(h.lk(ROOT_INO, "d").is_ok());
    assert!(
        h.bucket_is_dir("d"),
        "directory d still exists in the workspace but not in the bucket"
    );
}

#[test]
fn renamed_directory_moves_its_subtree() {
    let h = Harness::new();
    let src = h.dir(ROOT_INO, "src");
    let sub = h.dir(src.ino, "sub");
    h.dir(sub.ino, "emptysub");
    h.file(src.ino, "a", b"A");
    h.file(sub.ino, "b", b"B");
    h.symlink(&CTX, sub.ino, b"l", b"../a").unwrap();
    h.sync_all();
    assert_eq!(h.bucket_files(), ["src/a", "src/sub/b", "src/sub/l"]);
    let dst = h.dir(ROOT_INO, "dst");
    h.rename(&CTX, ROOT_INO, b"src", dst.ino, b"moved", 0)
        .unwrap();
    h.sync_all();
    assert_eq!(
        h.bucket_files(),
        ["dst/moved/a", "dst/moved/sub/b", "dst/moved/sub/l"]
    );
    assert_eq!(h.bucket_file("dst/moved/a").as_deref(), Some(&b"A"[..]));
    assert_eq!(h.bucket_file("dst/moved/sub/b").as_deref(), Some(&b"B"[..]));
    assert_eq!(
        h.bucket_file("dst/moved/sub/l").as_deref(),
        Some(&b"../a"[..])
    );
    assert!(h.bucket_is_dir("dst/moved/sub/emptysub"));
    assert!(!h.bucket_dir().join("src").exists(), "old subtree gone");
}

#[test]
fn symlinks_and_special_files_have_objects() {
    let h = Harness::new();
    h.symlink(&CTX, ROOT_INO, b"link", b"some/target").unwrap();
    h.mknod(&CTX, ROOT_INO, b"fifo", libc::S_IFIFO | 0o644, 0, 0)
        .unwrap();
    h.mknod(&CTX, ROOT_INO, b"sock", libc::S_IFSOCK | 0o644, 0, 0)
        .unwrap();
    h.sync_all();
    assert_eq!(
        h.bucket_file("link").as_deref(),
        Some(&b"some/target"[..]),
        "symlink object holds the target"
    );
    assert_eq!(h.bucket_file("fifo").as_deref(), Some(&b""[..]));
    assert_eq!(h.bucket_file("sock").as_deref(), Some(&b""[..]));
    h.unlink(&CTX, ROOT_INO, b"link").unwrap();
    h.sync_all();
    assert!(h.bucket_file("link").is_none());
}

#[test]
fn hard_links_are_two_objects_with_the_same_content() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "d");
    let f = h.file(ROOT_INO, "f", b"v1");
    h.link(&CTX, f.ino, d.ino, b"g").unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"v1"[..]));
    assert_eq!(h.bucket_file("d/g").as_deref(), Some(&b"v1"[..]));
    let fh = h.op(f.ino, libc::O_WRONLY | libc::O_TRUNC);
    h.put(f.ino, fh, 0, b"version 2");
    h.release(f.ino, fh).unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"version 2"[..]));
    assert_eq!(
        h.bucket_file("d/g").as_deref(),
        Some(&b"version 2"[..]),
        "every name of the inode is updated"
    );
    // Removing one name removes one object only.
    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    h.sync_all();
    assert_eq!(h.bucket_files(), ["d/g"]);
}

#[test]
fn exchange_swaps_objects() {
    let h = Harness::new();
    h.file(ROOT_INO, "a", b"content of a");
    h.file(ROOT_INO, "b", b"content of b");
    h.sync_all();
    h.rename(&CTX, ROOT_INO, b"a", ROOT_INO, b"b", EXCHANGE)
        .unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("a").as_deref(), Some(&b"content of b"[..]));
    assert_eq!(h.bucket_file("b").as_deref(), Some(&b"content of a"[..]));
}

#[test]
fn big_file_goes_up_multipart_intact() {
    let h = Harness::new();
    // Above the 16 MiB multipart threshold and not a multiple of the part size.
    let data = pattern((17 << 20) + 12_345, 42);
    let (a, fh) = h.create_rw(ROOT_INO, "big.bin");
    h.put(a.ino, fh, 0, &data);
    h.release(a.ino, fh).unwrap();
    h.sync_all();
    let got = h.bucket_file("big.bin").expect("big object");
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bucket content differs from what was written");
    assert!(!h.row(a.ino).unwrap().dirty);
}

#[test]
fn non_utf8_name_goes_to_an_escaped_key() {
    let h = Harness::new();
    let name = b"bad\xffname";
    let (a, fh) = h
        .create(&CTX, ROOT_INO, name, 0o644, 0, libc::O_RDWR)
        .map(|(a, o)| (a, o.fh))
        .unwrap();
    h.put(a.ino, fh, 0, b"escaped content");
    h.release(a.ino, fh).unwrap();
    h.sync_all();
    let files = h.bucket_files();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with(".deskfs/escaped/"), "{files:?}");
    assert_eq!(
        h.bucket_file(&files[0]).as_deref(),
        Some(&b"escaped content"[..])
    );
    // The reserved area stays hidden from the tree.
    assert_eq!(h.ls_entries(ROOT_INO, false).len(), 3);
    assert_eq!(h.lookup(&CTX, ROOT_INO, name).unwrap().ino, a.ino);
}

#[test]
fn chmod_only_change_is_reconciled() {
    let h = Harness::new();
    let f = h.file(ROOT_INO, "f", b"same");
    h.sync_all();
    h.setattr(
        &CTX,
        f.ino,
        &crate::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    h.sync_all();
    assert_eq!(h.status().unwrap().pending_uploads, 0);
    assert_eq!(h.bucket_file("f").as_deref(), Some(&b"same"[..]));
}

/// `rm f && mv d f`: a directory takes the path of a deleted file.
#[test]
fn directory_replacing_a_deleted_file_path() {
    let h = Harness::new();
    h.file(ROOT_INO, "f", b"plain file");
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "x", b"child");
    h.sync_all();
    h.unlink(&CTX, ROOT_INO, b"f").unwrap();
    h.rename(&CTX, ROOT_INO, b"d", ROOT_INO, b"f", 0).unwrap();
    h.sync(Duration::from_secs(5)).expect("sync");
    assert_eq!(h.bucket_files(), ["f/x"]);
    assert_eq!(h.bucket_file("f/x").as_deref(), Some(&b"child"[..]));
}

/// RENAME_EXCHANGE of a file and a non-empty directory.
#[test]
fn exchange_of_a_file_and_a_directory() {
    let h = Harness::new();
    h.file(ROOT_INO, "f", b"plain file");
    let d = h.dir(ROOT_INO, "d");
    h.file(d.ino, "x", b"child");
    h.sync_all();
    h.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"d", EXCHANGE)
        .unwrap();
    assert_eq!(h.cat_path("d"), b"plain file");
    assert_eq!(h.cat_path("f/x"), b"child");
    h.sync(Duration::from_secs(5)).expect("sync");
    assert_eq!(h.bucket_files(), ["d", "f/x"]);
    assert_eq!(h.bucket_file("d").as_deref(), Some(&b"plain file"[..]));
}

/// `rm -r d && touch d`-style reuse of a path the other way: a file where a directory was.
#[test]
fn file_replacing_a_deleted_directory_path() {
    let h = Harness::new();
    let d = h.dir(ROOT_INO, "p");
    h.file(d.ino, "x", b"child");
    h.sync_all();
    h.unlink(&CTX, d.ino, b"x").unwrap();
    h.rmdir(&CTX, ROOT_INO, b"p").unwrap();
    h.file(ROOT_INO, "p", b"now a file");
    h.sync(Duration::from_secs(10)).expect("sync");
    assert_eq!(h.bucket_files(), ["p"]);
    assert_eq!(h.bucket_file("p").as_deref(), Some(&b"now a file"[..]));
}

/// A failing upload is retried with backoff, reported by `status` and by a timed-out
/// `sync`, and completes once the bucket accepts it again.
#[test]
fn failing_uploads_are_reported_and_retried() {
    let h = Harness::new();
    assert!(h.ls(ROOT_INO).is_empty());
    // Another tool puts a plain file where the workspace will want a directory.
    std::fs::write(h.bucket_dir().join("blk"), b"in the way").unwrap();
    let d = h.dir(ROOT_INO, "blk");
    h.file(d.ino, "f", b"waiting");
    h.file(ROOT_INO, "ok", b"fine");
    let err = h
        .sync(Duration::from_millis(1500))
        .expect_err("sync cannot finish while the bucket refuses");
    assert_eq!(err.errno(), libc::EIO);
    assert!(err.to_string().contains("timed out"), "{err}");
    let st = h.status().unwrap();
    assert!(st.failing_uploads >= 1, "{st:?}");
    assert!(
        st.failures
            .iter()
            .any(|f| f.path.starts_with("blk") && f.attempts >= 1 && !f.error.is_empty()),
        "{st:?}"
    );
    assert_eq!(
        h.bucket_file("ok").as_deref(),
        Some(&b"fine"[..]),
        "other uploads are not held up"
    );
    // The mount keeps working meanwhile.
    assert_eq!(h.cat_path("blk/f"), b"waiting");
    std::fs::remove_file(h.bucket_dir().join("blk")).unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("blk/f").as_deref(), Some(&b"waiting"[..]));
    let st = h.status().unwrap();
    assert_eq!((st.pending_uploads, st.failing_uploads), (0, 0), "{st:?}");
}

/// A failing upload whose content is wanted (another mount waits to open it, or a
/// `--durability bucket` close waited and gave up) keeps its backoff and shows as
/// failing: the round that follows up the request does not re-mark a path the uploader
/// still has queued. Before, it re-marked it on every round: the upload was tried ~13
/// times a second, forever, its attempts reset to 0 and `status` showed no failure.
#[test]
fn a_wanted_failing_upload_keeps_its_backoff() {
    let h = Harness::new();
    assert!(h.ls(ROOT_INO).is_empty());
    // Another tool puts a plain file where the workspace wants a directory.
    std::fs::write(h.bucket_dir().join("blk"), b"in the way").unwrap();
    let d = h.dir(ROOT_INO, "blk");
    let f = h.file(d.ino, "f", b"waiting");
    deskfs_meta::txn(&*h.meta, |t| {
        t.want_upload(f.ino, h.cache.id(), crate::now_ns())
    })
    .unwrap();
    h.uploader.wanted_hint.store(true, SeqCst);
    h.uploader.kick();
    let before = h.uploader.reconciles.load(SeqCst);
    std::thread::sleep(Duration::from_secs(3));
    let spent = h.uploader.reconciles.load(SeqCst) - before;
    assert!(
        spent < 30,
        "{spent} reconciles in 3 s for two failing paths"
    );
    let st = h.status().unwrap();
    assert!(
        st.failures
            .iter()
            .any(|x| x.path.starts_with("blk") && x.attempts >= 2),
        "the failure is shown, its attempts counted: {st:?}"
    );
    std::fs::remove_file(h.bucket_dir().join("blk")).unwrap();
    h.sync_all();
    assert_eq!(h.bucket_file("blk/f").as_deref(), Some(&b"waiting"[..]));
}

/// Names with characters that URLs or object_store treat specially (for `file://`
/// buckets, paths go through URL encoding).
pub(crate) const ODD_NAMES: &[&str] = &[
    "a b",
    "100%",
    "x%41y",
    "q?x",
    "h#t",
    "h#1x",
    "br[ack]et",
    "ti~lde",
    "ca^ret",
    "dq\"uote",
    "back\\slash",
    "pi|pe",
    "st*ar",
    "co:lon",
    "emoji😀",
    "semi;colon",
    "plus+sign",
    "eq=ual",
    "amp&",
    "at@",
    "lt<gt>",
];

#[test]
fn odd_names_reach_the_bucket_under_their_own_name() {
    let h = Harness::new();
    for (i, n) in ODD_NAMES.iter().enumerate() {
        h.file(ROOT_INO, n, format!("content {i}").as_bytes());
    }
    h.sync_all();
    let mut wrong = Vec::new();
    for (i, n) in ODD_NAMES.iter().enumerate() {
        let got = h.bucket_file(n);
        if got.as_deref() != Some(format!("content {i}").as_bytes()) {
            wrong.push(format!(
                "{n:?}: {:?}",
                got.map(|g| String::from_utf8_lossy(&g).into_owned())
            ));
        }
    }
    let mut want: Vec<String> = ODD_NAMES.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert!(
        wrong.is_empty(),
        "objects missing or wrong: {wrong:#?}\nbucket has {:?}",
        h.bucket_files()
    );
    assert_eq!(h.bucket_files(), want);
}

/// ext4 accepts `v#1`; the local object store refuses keys ending in `#<digits>` (its
/// multipart staging names), so such a name needs an escaped key.
#[test]
fn name_ending_in_hash_digits_is_uploaded() {
    let h = Harness::new();
    h.file(ROOT_INO, "v#1", b"hash one");
    h.sync(Duration::from_secs(3)).expect("sync");
    let files = h.bucket_files();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(h.bucket_file(&files[0]).as_deref(), Some(&b"hash one"[..]));
}
