//! Confinement and tokens on a plain directory (the e2e suite runs the same through
//! `deskfs serve` on a real mount).

use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::time::Duration;

use crate::confine::{DeskDir, Kind, Precondition, RelPath};
use crate::error::Code;
use crate::tokens::{parse_ttl, Scope, TokenStore};

/// A desk dir and, beside it (outside the desk), a secret file and directory.
fn setup() -> (tempfile::TempDir, DeskDir) {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("desk")).unwrap();
    std::fs::write(t.path().join("secret"), b"outside").unwrap();
    std::fs::create_dir(t.path().join("outdir")).unwrap();
    std::fs::write(t.path().join("outdir/keep"), b"keep").unwrap();
    let d = DeskDir::open(&t.path().join("desk")).unwrap();
    (t, d)
}

fn rel(s: &str) -> RelPath {
    RelPath::parse(s).unwrap()
}

fn code<T: std::fmt::Debug>(r: crate::Result<T>) -> Code {
    r.expect_err("must fail").code
}

fn put(
    d: &DeskDir,
    p: &str,
    data: &[u8],
    pre: Precondition,
) -> crate::Result<crate::confine::Committed> {
    let mut s = d.stage(&rel(p))?;
    s.file().unwrap().write_all(data).unwrap();
    s.commit(&pre)
}

#[test]
fn paths_are_checked_as_text_first() {
    assert_eq!(code(RelPath::parse("a\0b")), Code::BadPath);
    assert_eq!(code(RelPath::parse("/etc/passwd")), Code::OutsideDesk);
    assert_eq!(code(RelPath::parse("..")), Code::OutsideDesk);
    assert_eq!(code(RelPath::parse("a/../../b")), Code::OutsideDesk);
    assert_eq!(code(RelPath::parse("a/../b")), Code::OutsideDesk);
    assert_eq!(code(RelPath::parse(&"n".repeat(256))), Code::NameTooLong);
    assert_eq!(code(RelPath::parse(&"a/".repeat(2049))), Code::PathTooLong);
    assert!(RelPath::parse(&"n".repeat(255)).is_ok());
    assert_eq!(rel("a//b/./c/").display(), "a/b/c");
    assert!(rel("").is_root() && rel(".").is_root());
}

#[test]
fn symlinks_pointing_out_are_never_followed_out() {
    let (t, d) = setup();
    let desk = t.path().join("desk");
    symlink(t.path().join("secret"), desk.join("abs")).unwrap();
    symlink("../secret", desk.join("rel")).unwrap();
    symlink(t.path().join("outdir"), desk.join("dirlink")).unwrap();
    symlink("/", desk.join("root")).unwrap();
    for p in ["abs", "rel", "root/etc/passwd", "dirlink/keep"] {
        assert_eq!(code(d.open_read(&rel(p))), Code::OutsideDesk, "read {p}");
    }
    assert_eq!(code(d.list(&rel("dirlink"))), Code::OutsideDesk);
    assert_eq!(code(d.stat(&rel("dirlink/keep"))), Code::OutsideDesk);
    assert_eq!(code(d.stage(&rel("dirlink/new"))), Code::OutsideDesk);
    assert_eq!(code(d.mkdir(&rel("dirlink/sub"), false)), Code::OutsideDesk);
    // mkdir -p finds the link in the way and never looks through it.
    assert_eq!(code(d.mkdir(&rel("dirlink/a/b"), true)), Code::Exists);
    assert_eq!(
        code(d.remove(&rel("dirlink/keep"), false)),
        Code::OutsideDesk
    );
    assert_eq!(
        code(d.rename(&rel("dirlink/keep"), &rel("stolen"), false)),
        Code::OutsideDesk
    );
    // The links themselves are described, not followed, and can be removed.
    let st = d.stat(&rel("abs")).unwrap();
    assert_eq!(st.kind, Kind::Symlink);
    assert_eq!(
        st.target.as_deref(),
        Some(t.path().join("secret").to_str().unwrap())
    );
    // A write to a link pointing out is refused; the file it names is untouched.
    assert_eq!(
        code(put(&d, "abs", b"new", Precondition::None)),
        Code::OutsideDesk
    );
    assert_eq!(
        code(put(&d, "rel", b"new", Precondition::None)),
        Code::OutsideDesk
    );
    assert_eq!(std::fs::read(t.path().join("secret")).unwrap(), b"outside");
    // mkdir -p does not look through a link either: it is in the way.
    assert_eq!(code(d.mkdir(&rel("abs/x"), true)), Code::Exists);
    d.remove(&rel("dirlink"), true).unwrap();
    assert_eq!(
        std::fs::read(t.path().join("outdir/keep")).unwrap(),
        b"keep"
    );
    // A link that stays inside is followed.
    std::fs::write(desk.join("target"), b"inside").unwrap();
    symlink("target", desk.join("ok")).unwrap();
    let (mut f, st) = d.open_read(&rel("ok")).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!((s.as_str(), st.size), ("inside", 6));
    // ... and a write through it lands on its target, under the ETag a read gave
    // (CLAUDE.md → AGENTS.md stay one file).
    let w = put(&d, "ok", b"edited", Precondition::Etag(st.etag)).unwrap();
    assert_eq!(w.stat.path, "target");
    assert_eq!(std::fs::read(desk.join("target")).unwrap(), b"edited");
    assert!(std::fs::symlink_metadata(desk.join("ok"))
        .unwrap()
        .file_type()
        .is_symlink());
    // A FIFO is not read (it would block): only regular files are.
    let fifo = std::ffi::CString::new(desk.join("fifo").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    assert_eq!(code(d.open_read(&rel("fifo"))), Code::Conflict);
}

#[test]
fn a_recursive_delete_removes_links_not_what_they_name() {
    let (t, d) = setup();
    let desk = t.path().join("desk");
    std::fs::create_dir_all(desk.join("tree/sub")).unwrap();
    std::fs::write(desk.join("tree/sub/f"), b"x").unwrap();
    symlink(t.path().join("outdir"), desk.join("tree/sub/out")).unwrap();
    assert_eq!(code(d.remove(&rel("tree"), false)), Code::NotEmpty);
    d.remove(&rel("tree"), true).unwrap();
    assert!(!desk.join("tree").exists());
    assert_eq!(
        std::fs::read(t.path().join("outdir/keep")).unwrap(),
        b"keep"
    );
}

#[test]
fn a_symlink_swapped_in_during_use_cannot_lead_out() {
    let (t, d) = setup();
    let desk = t.path().join("desk");
    std::fs::create_dir(desk.join("real")).unwrap();
    std::fs::write(desk.join("real/keep"), b"inside").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let desk2 = desk.clone();
    let outdir = t.path().join("outdir");
    // Swap `d` between a directory of the desk and a symlink to one outside.
    let swapper = std::thread::spawn(move || {
        let mut n = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = std::fs::remove_file(desk2.join("d"));
            let _ = std::os::unix::fs::symlink("real", desk2.join("d"));
            let _ = std::fs::remove_file(desk2.join("d"));
            let _ = std::os::unix::fs::symlink(&outdir, desk2.join("d"));
            n += 1;
        }
        n
    });
    let mut inside = 0;
    for _ in 0..20_000 {
        if let Ok((mut f, _)) = d.open_read(&rel("d/keep")) {
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            assert_eq!(s, "inside", "read a file outside the desk");
            inside += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(
        swaps > 0 && inside > 0,
        "the race ran ({swaps} swaps, {inside} reads)"
    );
}

#[test]
fn writes_replace_atomically_under_their_condition() {
    let (t, d) = setup();
    let desk = t.path().join("desk");
    let first = put(&d, "f", b"one", Precondition::Absent).unwrap();
    assert!(!first.replaced);
    assert_eq!(code(put(&d, "f", b"x", Precondition::Absent)), Code::Exists);
    assert_eq!(
        code(put(&d, "f", b"x", Precondition::Etag("\"nope\"".into()))),
        Code::EtagMismatch
    );
    assert_eq!(
        code(put(&d, "g", b"x", Precondition::Exists)),
        Code::EtagMismatch
    );
    std::fs::set_permissions(
        desk.join("f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let cur = d.stat(&rel("f")).unwrap();
    let second = put(&d, "f", b"two", Precondition::Etag(cur.etag.clone())).unwrap();
    assert!(second.replaced);
    assert_ne!(second.stat.etag, cur.etag, "a new version has a new ETag");
    assert_eq!(second.stat.mode, 0o600, "the replaced file's mode is kept");
    // The old ETag no longer matches: a lost update is refused.
    assert_eq!(
        code(put(&d, "f", b"three", Precondition::Etag(cur.etag))),
        Code::EtagMismatch
    );
    assert_eq!(std::fs::read(desk.join("f")).unwrap(), b"two");
    // A staged write that is dropped leaves nothing behind.
    {
        let mut s = d.stage(&rel("h")).unwrap();
        s.file().unwrap().write_all(b"partial").unwrap();
    }
    let names: Vec<String> = d
        .list(&RelPath::root())
        .unwrap()
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(names, vec!["f"], "no temporary file is left");
    assert_eq!(code(d.stage(&RelPath::root())), Code::BadPath);
    std::fs::create_dir(desk.join("dir")).unwrap();
    assert_eq!(code(put(&d, "dir", b"x", Precondition::None)), Code::IsDir);
}

#[test]
fn mkdir_move_and_errors_map_to_codes() {
    let (t, d) = setup();
    let desk = t.path().join("desk");
    d.mkdir(&rel("a/b/c"), true).unwrap();
    d.mkdir(&rel("a/b/c"), true).unwrap();
    assert_eq!(code(d.mkdir(&rel("a/b/c"), false)), Code::Exists);
    assert_eq!(code(d.mkdir(&rel("x/y"), false)), Code::NotFound);
    put(&d, "a/file", b"1", Precondition::None).unwrap();
    assert_eq!(code(d.mkdir(&rel("a/file/z"), true)), Code::Exists);
    put(&d, "a/other", b"2", Precondition::None).unwrap();
    assert_eq!(
        code(d.rename(&rel("a/file"), &rel("a/other"), false)),
        Code::Exists
    );
    d.rename(&rel("a/file"), &rel("a/other"), true).unwrap();
    assert_eq!(std::fs::read(desk.join("a/other")).unwrap(), b"1");
    assert_eq!(code(d.open_read(&rel("a"))), Code::IsDir);
    assert_eq!(code(d.open_read(&rel("nope"))), Code::NotFound);
    assert_eq!(code(d.list(&rel("a/other"))), Code::NotDir);
}

#[test]
fn tokens_open_one_desk_until_they_expire_or_are_revoked() {
    let t = tempfile::tempdir().unwrap();
    let store = TokenStore::at(t.path());
    let (tok, rec) = store
        .create("alice", Some(7), Scope::ReadWrite, None)
        .unwrap();
    assert!(tok.starts_with("dsk_alice_"));
    assert!(
        !std::fs::read_to_string(store.path())
            .unwrap()
            .contains(&tok),
        "only the digest is stored"
    );
    let mode = std::fs::metadata(store.path()).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    let now = crate::tokens::now_secs();
    let g = store.verify(&tok, now).unwrap();
    assert_eq!((g.agent.as_str(), g.scope), ("alice", Scope::ReadWrite));
    g.allows("alice", true).unwrap();
    assert_eq!(code(g.allows("bob", false)), Code::TokenScope);
    g.same_desk(7).unwrap();
    assert_eq!(
        code(g.same_desk(8)),
        Code::TokenRevoked,
        "a desk made again is another desk"
    );
    // Another token with the same agent prefix but a different secret is unknown.
    let forged = format!("{}x", &tok[..tok.len() - 1]);
    assert_eq!(code(store.verify(&forged, now)), Code::Unauthorized);
    assert_eq!(code(store.verify("dsk_", now)), Code::Unauthorized);
    assert_eq!(code(store.verify("nope", now)), Code::Unauthorized);
    let (ro, _) = store
        .create(
            "alice",
            Some(7),
            Scope::ReadOnly,
            Some(Duration::from_secs(60)),
        )
        .unwrap();
    let g = store.verify(&ro, now).unwrap();
    g.allows("alice", false).unwrap();
    assert_eq!(code(g.allows("alice", true)), Code::ReadOnlyToken);
    assert_eq!(code(store.verify(&ro, now + 61)), Code::TokenExpired);
    store.revoke(&rec.id[..8]).unwrap();
    assert_eq!(code(store.verify(&tok, now)), Code::TokenRevoked);
    assert_eq!(code(store.revoke("abc")), Code::BadRequest);
    assert_eq!(code(store.revoke("ffffffffffff")), Code::NotFound);
    assert_eq!(store.list().unwrap().len(), 2);
    // A damaged store is one clear error, not an open door.
    std::fs::write(store.path(), "not toml [").unwrap();
    let e = store.verify(&ro, now).unwrap_err();
    assert_eq!(e.code, Code::Io);
    assert!(e.message.contains("damaged"), "{}", e.message);
}

#[test]
fn lifetimes_parse_or_say_what_they_take() {
    assert_eq!(parse_ttl("7d").unwrap(), Duration::from_secs(7 * 86_400));
    assert_eq!(parse_ttl("90s").unwrap(), Duration::from_secs(90));
    assert_eq!(parse_ttl("2w").unwrap(), Duration::from_secs(14 * 86_400));
    for bad in ["", "d", "7", "0d", "7y", "-1d", "1.5h"] {
        assert_eq!(code(parse_ttl(bad)), Code::BadRequest, "{bad:?}");
    }
}
