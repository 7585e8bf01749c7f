//! Path confinement of desks (`crates/serve/src/confine.rs` with its `error.rs`, compiled
//! as is).
//!
//! As text:
//! - `RelPath::parse(s)` accepts exactly the strings with no NUL byte, at most `PATH_MAX`
//!   bytes, not absolute, without a `..` component and without a component over `NAME_MAX`
//!   bytes, and refuses the others with the code of a reason that holds (`bad_path`,
//!   `path_too_long`, `outside_desk`, `name_too_long`). What it accepts is the components
//!   of `s` without the empty and `.` ones: every part non-empty, not `.`/`..`, without
//!   `/` or NUL, at most `NAME_MAX` bytes; `display()` parses back to the same path;
//!   `in_desk_state` is true exactly when the first part is `.desk`; `split_last` and
//!   `join` are inverse.
//! - `RelPath::resolve_link(base, target)` gives, for a relative target, the path reached
//!   by walking `base` then the target's components (`..` one up), and an error exactly
//!   when the target is empty, absolute or holds a NUL, the walk goes above the desk's root,
//!   a component is over `NAME_MAX` bytes, or it ends at the root; its parts are names
//!   `parse` accepts (the whole is not bounded by `PATH_MAX`: the kernel refuses longer).
//! In the kernel (a desk on /dev/shm with `.desk/` inside and a directory `outside/` next
//! to it, symlinks with fuzzed names and targets planted in the desk first): whatever
//! `stat`, `open_read`, `list`, `mkdir`, `remove`, `rename` and a write (`stage` +
//! `commit`) are asked with fuzzed paths, nothing outside the desk changes, nothing under
//! `.desk/` changes, and a file opened for reading is a file of the desk.
//!
//! Input: a small script, one command a line (corpus files are such scripts):
//! `ln DIR NAME TARGET` plants a symlink (DIR one of `.`, `a`, `a/b`, `notes`; TARGET the
//! rest of the line), `stat P`, `read P`, `ls P`, `mkdir [-p] P`, `rm [-r] P`,
//! `mv [-f] FROM TO`, `write [-x|-n] P` (`If-Match: *` / `If-None-Match: *`) run
//! against the desk (`nolinks`: on `DeskDir::without_symlinks`, where a file read is the
//! one at the path's own names, no symlink followed), `link BASE<TAB>TARGET` checks a
//! link as text. Every line is also
//! checked as a path and as a link target from `a/b`. The fixture: `desk/a/b/file`,
//! `desk/notes/`, `desk/.desk/{journal,tasks/t.json}`, links `desk/out -> ../outside`
//! and `desk/state -> .desk`; `outside/outside-secret-7f3a`, `outside/dir/`.

#![no_main]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../crates/serve/src/error.rs"]
mod error;

#[allow(dead_code)]
#[path = "../../crates/serve/src/confine.rs"]
mod confine;

use confine::{DeskDir, Precondition, RelPath, NAME_MAX, PATH_MAX};
use error::Code;

const SECRET: &str = "outside-secret-7f3a";

#[derive(Debug)]
enum Op<'a> {
    Stat(&'a str),
    Read(&'a str),
    List(&'a str),
    Mkdir(&'a str, bool),
    Remove(&'a str, bool),
    Rename(&'a str, &'a str, bool),
    Write(&'a str, Precondition),
}

/// Directories of the desk fixture where links are planted.
const DIRS: [&str; 4] = [".", "a", "a/b", "notes"];

/// `-FLAG REST` -> (true, REST); REST -> (false, REST).
fn flag<'a>(rest: &'a str, f: &str) -> (bool, &'a str) {
    match rest.strip_prefix(f).and_then(|r| r.strip_prefix(' ')) {
        Some(r) => (true, r),
        None => (false, rest),
    }
}

fn op(line: &str) -> Option<Op<'_>> {
    let (cmd, rest) = line.split_once(' ')?;
    Some(match cmd {
        "stat" => Op::Stat(rest),
        "read" => Op::Read(rest),
        "ls" => Op::List(rest),
        "mkdir" => {
            let (p, rest) = flag(rest, "-p");
            Op::Mkdir(rest, p)
        }
        "rm" => {
            let (r, rest) = flag(rest, "-r");
            Op::Remove(rest, r)
        }
        "mv" => {
            let (f, rest) = flag(rest, "-f");
            let (from, to) = rest.split_once(' ')?;
            Op::Rename(from, to, f)
        }
        "write" => {
            let (x, rest) = flag(rest, "-x");
            let (n, rest) = flag(rest, "-n");
            let pre = if x {
                Precondition::Exists
            } else if n {
                Precondition::Absent
            } else {
                Precondition::None
            };
            Op::Write(rest, pre)
        }
        _ => return None,
    })
}

fn base() -> &'static PathBuf {
    static B: OnceLock<PathBuf> = OnceLock::new();
    B.get_or_init(|| {
        // scripts/fuzz.sh gives a scratch dir it removes afterwards (on /dev/shm: the
        // writes' fsyncs cost nothing there).
        let root = std::env::var_os("DESKFS_FUZZ_SCRATCH").map(PathBuf::from);
        let shm = || Path::new("/dev/shm").exists().then(|| "/dev/shm".into());
        let root = root.or_else(shm).unwrap_or_else(std::env::temp_dir);
        let b = root.join(format!("deskfs-fuzz-confine.{}", std::process::id()));
        let _ = fs::remove_dir_all(&b);
        fs::create_dir_all(&b).expect("fixture dir");
        b
    })
}

/// A fresh desk and its surroundings.
fn fixture(b: &Path) {
    for d in ["desk", "outside"] {
        let _ = fs::remove_dir_all(b.join(d));
    }
    for d in ["outside/dir", "desk/.desk/tasks", "desk/a/b", "desk/notes"] {
        fs::create_dir_all(b.join(d)).expect("fixture");
    }
    fs::write(b.join("outside").join(SECRET), "secret").expect("fixture");
    fs::write(b.join("desk/.desk/journal"), "journal").expect("fixture");
    fs::write(b.join("desk/.desk/tasks/t.json"), "{}").expect("fixture");
    fs::write(b.join("desk/a/b/file"), "file").expect("fixture");
    symlink("../outside", b.join("desk/out")).expect("fixture");
    symlink(".desk", b.join("desk/state")).expect("fixture");
}

/// Everything under `dir`: path -> (type, content or link target); no link followed.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let md = fs::symlink_metadata(&p).expect("lstat");
            let v = if md.file_type().is_symlink() {
                format!("link {:?}", fs::read_link(&p).unwrap_or_default())
            } else if md.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", md.mode())
            } else {
                format!(
                    "file {:o} {:?}",
                    md.mode(),
                    fs::read(&p).unwrap_or_default()
                )
            };
            out.insert(rel, v);
        }
    }
    out
}

/// Inode numbers of the regular files in the desk (links not followed).
fn desk_files(desk: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    let mut stack = vec![desk.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = fs::symlink_metadata(e.path()) else {
                continue;
            };
            if md.is_dir() {
                stack.push(e.path());
            } else if md.is_file() {
                out.push(md.ino());
            }
        }
    }
    out
}

/// The inode at `rel` in `dir` and whether no component on the way is a symlink.
fn lexical_file(dir: &Path, rel: &str) -> (u64, bool) {
    let mut at = dir.to_path_buf();
    for c in rel.split('/') {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(md) if !md.file_type().is_symlink() => {}
            _ => return (0, false),
        }
    }
    (
        fs::symlink_metadata(&at).map(|m| m.ino()).unwrap_or(0),
        true,
    )
}

fn components(s: &str) -> Vec<&str> {
    s.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

fn check_parse(s: &str) -> Option<RelPath> {
    let nul = s.contains('\0');
    let long = s.len() > PATH_MAX;
    let outside = s.starts_with('/') || s.split('/').any(|c| c == "..");
    let name_long = s.split('/').any(|c| c.len() > NAME_MAX);
    match RelPath::parse(s) {
        Ok(p) => {
            assert!(!nul && !long && !outside && !name_long, "accepted {s:?}");
            let want = components(s);
            let shown = p.display();
            assert_eq!(shown, want.join("/"), "parts of {s:?}");
            assert!(shown.len() <= s.len());
            assert_eq!(p.is_root(), want.is_empty());
            assert_eq!(p.in_desk_state(), want.first() == Some(&".desk"));
            assert_eq!(
                RelPath::parse(&shown).ok().as_ref(),
                Some(&p),
                "display of {s:?}"
            );
            if let Some((parent, last)) = p.split_last() {
                assert_eq!(Some(&last), want.last());
                assert_eq!(parent.join(last), p);
            }
            Some(p)
        }
        Err(e) => {
            let holds = match e.code {
                Code::BadPath => nul,
                Code::PathTooLong => long,
                Code::OutsideDesk => outside,
                Code::NameTooLong => name_long,
                _ => false,
            };
            assert!(holds, "{s:?} refused as {:?} ({})", e.code, e.message);
            None
        }
    }
}

fn check_link(base: &RelPath, target: &str) {
    // The walk, as the kernel takes a relative link's components.
    let mut parts: Vec<String> = components(&base.display())
        .into_iter()
        .map(String::from)
        .collect();
    let mut above_root = false;
    let mut long = false;
    for c in components(target) {
        if c == ".." {
            above_root |= parts.pop().is_none();
        } else {
            long |= c.len() > NAME_MAX;
            parts.push(c.to_string());
        }
    }
    let bad = target.is_empty() || target.starts_with('/') || target.contains('\0');
    match base.resolve_link(target) {
        Ok(r) => {
            assert!(
                !bad && !above_root && !long && !parts.is_empty(),
                "link {target:?} from {base:?} accepted"
            );
            let shown = r.display();
            assert_eq!(shown, parts.join("/"));
            // Every part is a name `parse` accepts; the whole may be longer than
            // PATH_MAX (base and target each up to it): the kernel refuses that one.
            for c in shown.split('/') {
                assert!(
                    valid_name(c),
                    "link {target:?} from {base:?} gives part {c:?}"
                );
            }
            if shown.len() <= PATH_MAX {
                assert_eq!(
                    RelPath::parse(&shown).ok(),
                    Some(r),
                    "link result is not a valid path"
                );
            }
        }
        Err(e) => {
            assert_eq!(e.code, Code::OutsideDesk);
            assert!(
                bad || above_root || long || parts.is_empty(),
                "link {target:?} from {base:?} refused"
            );
        }
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n != "."
        && n != ".."
        && !n.contains('/')
        && !n.contains('\0')
        && n.len() <= NAME_MAX
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let ab = RelPath::parse("a/b").unwrap();
    let mut links = Vec::new();
    let mut ops = Vec::new();
    let mut no_links = false;
    for line in text.split('\n') {
        check_parse(line);
        check_link(&ab, line);
        if let Some(rest) = line.strip_prefix("link ") {
            let (b, t) = rest.split_once('\t').unwrap_or((rest, ""));
            if let Some(b) = check_parse(b) {
                check_link(&b, t);
            }
        } else if let Some(rest) = line.strip_prefix("ln ") {
            let mut it = rest.splitn(3, ' ');
            if let (Some(d), Some(n), Some(t)) = (it.next(), it.next(), it.next()) {
                links.push((d, n, t));
            }
        } else if line == "nolinks" {
            no_links = true;
        } else if let Some(o) = op(line) {
            ops.push(o);
        }
    }
    if ops.is_empty() {
        return;
    }
    let b = base();
    fixture(b);
    let desk = b.join("desk");
    for (d, name, target) in links.into_iter().take(8) {
        if !DIRS.contains(&d)
            || !valid_name(name)
            || target.contains('\0')
            || target.is_empty()
            || name == SECRET
        {
            continue;
        }
        let _ = symlink(target, desk.join(d).join(name));
    }
    let outside_before = tree(&b.join("outside"));
    let state_before = tree(&desk.join(".desk"));
    let secret_ino = fs::metadata(b.join("outside").join(SECRET)).unwrap().ino();
    let dd = DeskDir::open(&desk).expect("open the desk");
    let dd = if no_links {
        dd.without_symlinks().expect("the desk without symlinks")
    } else {
        dd
    };
    for op in ops.into_iter().take(6) {
        // `mkdir -p` costs O(depth²) system calls (each level is resolved from the desk
        // and walked up for `.desk`): 2,000 levels take ~30 s here. Deep paths are
        // checked as text above; the kernel part keeps to 128 levels.
        let rp = |s: &str| {
            RelPath::parse(s)
                .ok()
                .filter(|_| s.matches('/').count() < 128)
        };
        match &op {
            Op::Stat(p) => {
                if let Some(p) = rp(p) {
                    let _ = dd.stat(&p);
                }
            }
            Op::Read(p) => {
                if let Some(p) = rp(p) {
                    if let Ok((f, _)) = dd.open_read(&p) {
                        let ino = f.metadata().unwrap().ino();
                        assert_ne!(ino, secret_ino, "read {p:?} opened a file outside the desk");
                        assert!(
                            desk_files(&desk).contains(&ino),
                            "read {p:?} opened a file not in the desk"
                        );
                        if no_links {
                            let (real, ok) = lexical_file(&desk, &p.display());
                            assert!(ok && real == ino, "read {p:?} followed a symlink");
                        }
                    }
                }
            }
            Op::List(p) => {
                if let Some(p) = rp(p) {
                    if let Ok(entries) = dd.list(&p) {
                        assert!(
                            entries.iter().all(|e| !e.path.ends_with(SECRET)),
                            "list {p:?} shows the directory outside the desk"
                        );
                    }
                }
            }
            Op::Mkdir(p, parents) => {
                if let Some(p) = rp(p) {
                    let _ = dd.mkdir(&p, *parents);
                }
            }
            Op::Remove(p, recursive) => {
                if let Some(p) = rp(p) {
                    let _ = dd.remove(&p, *recursive);
                }
            }
            Op::Rename(from, to, overwrite) => {
                if let (Some(f), Some(t)) = (rp(from), rp(to)) {
                    let _ = dd.rename(&f, &t, *overwrite);
                }
            }
            Op::Write(p, pre) => {
                if let Some(p) = rp(p) {
                    if let Ok(mut st) = dd.stage(&p) {
                        st.file().unwrap().write_all(b"new").unwrap();
                        let _ = st.commit(pre);
                    }
                }
            }
        }
        assert_eq!(
            tree(&b.join("outside")),
            outside_before,
            "{op:?} changed what is outside the desk"
        );
        assert_eq!(
            tree(&desk.join(".desk")),
            state_before,
            "{op:?} changed the desk's .desk/"
        );
        let top: Vec<String> = fs::read_dir(b)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(top.len() == 2, "{op:?} created {top:?} next to the desk");
    }
});
