//! `.worktreeinclude`: git-ignored files (e.g. `.env`) a new task worktree gets copied from
//! the repo's checkout, as common worktree tools do.
//!
//! The file sits at the top of the repo and uses gitignore syntax (plain paths, globs,
//! `dir/`, `!negation`, `#` comments). A file is copied when it matches a pattern **and**
//! git ignores it; tracked files come from the checkout itself and untracked, non-ignored
//! ones are left alone. Matching is git's own: `git ls-files --others --ignored
//! --exclude-from=.worktreeinclude` lists the candidates and `git check-ignore` keeps the
//! ignored ones. Regular files and symlinks are copied (permission bits kept, setuid and
//! setgid dropped); nothing is overwritten and no copy goes through a symlink (see
//! [`copy`]).

use std::fs;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;

use crate::error::{DeskError, IoContext, Result};
use crate::git;

/// Name of the pattern file at the top of a repo.
pub const FILE: &str = ".worktreeinclude";

/// The repo-relative paths `.worktreeinclude` selects in the checkout at `repo` (empty
/// without the file).
///
/// # Errors
/// [`DeskError::Git`] when git fails.
pub fn selected(repo: &Path) -> Result<Vec<PathBuf>> {
    let patterns = repo.join(FILE);
    // Only a regular file of the checkout is read (never through a symlink).
    if !fs::symlink_metadata(&patterns).is_ok_and(|m| m.is_file()) {
        return Ok(Vec::new());
    }
    let exclude_from = format!("--exclude-from={}", patterns.display());
    let listed = git::run(
        repo,
        &["ls-files", "-z", "--others", "--ignored", &exclude_from],
    )?;
    let candidates: Vec<&str> = listed.split('\0').filter(|p| !p.is_empty()).collect();
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    // Keep those git ignores by its standard rules.
    let mut child = git::command(repo, ["check-ignore", "-z", "--stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(DeskError::NoGit)?;
    let input: Vec<u8> = candidates
        .iter()
        .flat_map(|p| p.bytes().chain([0]))
        .collect();
    let writer = child.stdin.take().map(|mut stdin| {
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        })
    });
    let out = child.wait_with_output().map_err(DeskError::NoGit)?;
    if let Some(w) = writer {
        let _ = w.join();
    }
    // Exit 1 means "none of them is ignored".
    if !out.status.success() && out.status.code() != Some(1) {
        return Err(git::failure(repo, &["check-ignore", "--stdin"], &out));
    }
    let mut v: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}

/// Copies the files [`selected`] names from `repo` to the worktree at `dest`; returns the
/// copied relative paths and one warning line per path skipped for safety. Existing files
/// in `dest` are kept.
///
/// No copy goes through a symlink: each directory of a path is opened with `O_NOFOLLOW`
/// from `repo` (reading) and from `dest` (writing, made when missing), and the file is
/// created with `O_EXCL | O_NOFOLLOW`. A branch that commits `conf` as a symlink to
/// `/elsewhere` therefore cannot make `conf/.env` land in `/elsewhere`, and a symlink in
/// the checkout cannot make deskfs read outside it: such paths are skipped with a
/// warning. A `.worktreeinclude` that is itself a symlink is not read at all.
///
/// # Errors
/// Git and I/O errors.
pub fn copy(repo: &Path, dest: &Path) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let patterns = repo.join(FILE);
    if fs::symlink_metadata(&patterns).is_ok_and(|m| m.file_type().is_symlink()) {
        return Ok((
            Vec::new(),
            vec![format!(
                "{FILE} in {} is a symlink: not read, nothing copied into the task (make it a regular file)",
                repo.display()
            )],
        ));
    }
    copy_paths(repo, dest, &selected(repo)?)
}

/// Copies `rels` (repo-relative) from `repo` to `dest` without following any symlink on
/// either side (see [`copy`]); returns what was copied and the warnings.
///
/// # Errors
/// I/O errors other than a path going through a symlink (that is a warning).
pub fn copy_paths(
    repo: &Path,
    dest: &Path,
    rels: &[PathBuf],
) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let src_root = safe::open_dir(None, repo.as_os_str()).ctx("open", repo)?;
    let dst_root = safe::open_dir(None, dest.as_os_str()).ctx("open", dest)?;
    let mut copied = Vec::new();
    let mut warnings = Vec::new();
    for rel in rels {
        let mut parts = Vec::new();
        let mut plain = true;
        for c in rel.components() {
            match c {
                Component::Normal(n) => parts.push(n),
                _ => plain = false,
            }
        }
        let Some((name, dirs)) = parts.split_last().filter(|_| plain) else {
            warnings.push(format!(
                "{FILE}: skipped {}: not a plain path inside the repo",
                rel.display()
            ));
            continue;
        };
        match safe::copy_one(&src_root, &dst_root, dirs, name) {
            Ok(true) => copied.push(rel.clone()),
            Ok(false) => {}
            Err(safe::Refused::Symlink(side)) => warnings.push(format!(
                "{FILE}: skipped {}: a part of its path in the {side} is a symlink, which could lead outside it (copy the file by hand if the task needs it)",
                rel.display()
            )),
            Err(safe::Refused::Io(op, e)) => {
                return Err(DeskError::io(op, dest.join(rel), e));
            }
        }
    }
    Ok((copied, warnings))
}

/// Symlink-proof file operations relative to directory descriptors.
mod safe {
    use std::ffi::{CString, OsStr};
    use std::fs::File;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// Why a path was not copied.
    pub enum Refused {
        /// A component on that side (`"repo checkout"`, `"task worktree"`) is a symlink.
        Symlink(&'static str),
        /// Another I/O error: the operation and the error.
        Io(&'static str, io::Error),
    }

    #[cfg(test)]
    thread_local! {
        /// Runs once in [`copy_one`] between the look at the source and its open.
        pub static AFTER_LOOK: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
            std::cell::RefCell::new(None);
    }

    fn cstr(s: &OsStr) -> io::Result<CString> {
        CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    }

    fn at(dir: Option<&OwnedFd>) -> libc::c_int {
        dir.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd)
    }

    /// Opens directory `name` (relative to `dir`, or a path) without following a symlink
    /// in its last component.
    pub fn open_dir(dir: Option<&OwnedFd>, name: &OsStr) -> io::Result<OwnedFd> {
        let c = cstr(name)?;
        // SAFETY: a valid C string and directory descriptor; the result is checked.
        let fd = unsafe {
            libc::openat(
                at(dir),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn is_symlink_err(e: &io::Error) -> bool {
        // O_NOFOLLOW on a symlink: ELOOP; O_DIRECTORY on a symlink to a file: ENOTDIR.
        matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR))
    }

    fn lstat_at(dir: &OwnedFd, name: &OsStr) -> io::Result<libc::stat> {
        let c = cstr(name)?;
        // SAFETY: zeroed stat is a valid out buffer; arguments are valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::fstatat(
                dir.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }

    /// Copies `dirs/name` from `src` to `dst`: `Ok(true)` when copied, `Ok(false)` when
    /// the source is gone or not a file or symlink, or the target exists.
    pub fn copy_one(
        src: &OwnedFd,
        dst: &OwnedFd,
        dirs: &[&OsStr],
        name: &OsStr,
    ) -> Result<bool, Refused> {
        const SRC: &str = "repo checkout";
        const DST: &str = "task worktree";
        let io = |op| move |e| Refused::Io(op, e);
        // Source side: every directory opened without following symlinks.
        let mut s = None::<OwnedFd>;
        for d in dirs {
            let parent = s.as_ref().unwrap_or(src);
            match open_dir(Some(parent), d) {
                Ok(fd) => s = Some(fd),
                Err(e) if is_symlink_err(&e) => return Err(Refused::Symlink(SRC)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(Refused::Io("open", e)),
            }
        }
        let s = s.as_ref().unwrap_or(src);
        let st = match lstat_at(s, name) {
            Ok(st) => st,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(Refused::Io("stat", e)),
        };
        // What was looked at may be replaced before it is opened (a checkout changing
        // under the copy): every step below holds on its own.
        #[cfg(test)]
        if let Some(swap) = AFTER_LOOK.with(|h| h.borrow_mut().take()) {
            swap();
        }
        let kind = st.st_mode & libc::S_IFMT;
        if kind != libc::S_IFREG && kind != libc::S_IFLNK {
            return Ok(false);
        }
        // Destination side: directories made when missing, never followed.
        let mut d = None::<OwnedFd>;
        for part in dirs {
            let parent = d.as_ref().unwrap_or(dst);
            let c = cstr(part).map_err(io("create"))?;
            // SAFETY: valid descriptor and C string.
            let rc = unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o777) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::AlreadyExists {
                    return Err(Refused::Io("create", e));
                }
            }
            match open_dir(Some(parent), part) {
                Ok(fd) => d = Some(fd),
                Err(e) if is_symlink_err(&e) => return Err(Refused::Symlink(DST)),
                Err(e) => return Err(Refused::Io("open", e)),
            }
        }
        let d = d.as_ref().unwrap_or(dst);
        let cname = cstr(name).map_err(io("copy"))?;
        if kind == libc::S_IFLNK {
            let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
            // SAFETY: buf is writable for its length.
            let n = unsafe {
                libc::readlinkat(
                    s.as_raw_fd(),
                    cname.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                return Err(Refused::Io("read link", io::Error::last_os_error()));
            }
            buf.truncate(n as usize);
            let target = CString::new(buf).map_err(|_| {
                Refused::Io("read link", io::Error::from(io::ErrorKind::InvalidData))
            })?;
            // SAFETY: valid C strings and descriptor. symlinkat never follows `name`.
            let rc = unsafe { libc::symlinkat(target.as_ptr(), d.as_raw_fd(), cname.as_ptr()) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::AlreadyExists {
                    return Ok(false);
                }
                return Err(Refused::Io("create symlink", e));
            }
            return Ok(true);
        }
        // SAFETY: valid descriptor and C string; the result is checked.
        let fd = unsafe {
            libc::openat(
                s.as_raw_fd(),
                cname.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if is_symlink_err(&e) {
                return Err(Refused::Symlink(SRC));
            }
            return Err(Refused::Io("open", e));
        }
        // SAFETY: a fresh descriptor we own.
        let mut from = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let md = from.metadata().map_err(io("stat"))?;
        if !md.is_file() {
            return Ok(false);
        }
        let mode = md.mode() & 0o777;
        // SAFETY: valid descriptor and C string; O_EXCL|O_NOFOLLOW: never through a link.
        let fd = unsafe {
            libc::openat(
                d.as_raw_fd(),
                cname.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::AlreadyExists {
                return Ok(false);
            }
            return Err(Refused::Io("create", e));
        }
        // SAFETY: a fresh descriptor we own.
        let mut to = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        io::copy(&mut from, &mut to).map_err(io("copy to"))?;
        to.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io("chmod"))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::fs;
    use std::os::fd::OwnedFd;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::safe::{self, Refused};

    /// A checkout `src`, a worktree `dst` and a directory `out` outside both.
    fn places() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
        let t = tempfile::tempdir().expect("tempdir");
        let (src, dst, out) = (
            t.path().join("src"),
            t.path().join("dst"),
            t.path().join("out"),
        );
        for d in [&src, &dst, &out] {
            fs::create_dir(d).expect("mkdir");
        }
        (t, src, dst, out)
    }

    fn dir_fd(p: &Path) -> OwnedFd {
        safe::open_dir(None, p.as_os_str()).expect("open dir")
    }

    /// [`safe::copy_one`] of `rel` as one word: `copied`, `skipped`, `symlink in SIDE`,
    /// `OP: errno N`.
    fn copy(src: &Path, dst: &Path, rel: &str) -> String {
        let parts: Vec<&OsStr> = rel.split('/').map(OsStr::new).collect();
        let (name, dirs) = parts.split_last().expect("a name");
        match safe::copy_one(&dir_fd(src), &dir_fd(dst), dirs, name) {
            Ok(true) => "copied".into(),
            Ok(false) => "skipped".into(),
            Err(Refused::Symlink(side)) => format!("symlink in {side}"),
            Err(Refused::Io(op, e)) => format!("{op}: errno {}", e.raw_os_error().unwrap_or(0)),
        }
    }

    #[test]
    fn files_and_links_are_copied_into_directories_made_on_the_way() {
        let (_t, src, dst, _) = places();
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/.env"), b"SECRET=1").unwrap();
        fs::set_permissions(src.join("a/b/.env"), fs::Permissions::from_mode(0o4750)).unwrap();
        symlink("some/target", src.join("a/link")).unwrap();
        assert_eq!(copy(&src, &dst, "a/b/.env"), "copied");
        assert_eq!(fs::read(dst.join("a/b/.env")).unwrap(), b"SECRET=1");
        let mode = fs::metadata(dst.join("a/b/.env"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o750, "permission bits kept, setuid dropped");
        assert_eq!(copy(&src, &dst, "a/link"), "copied");
        assert_eq!(
            fs::read_link(dst.join("a/link")).unwrap(),
            Path::new("some/target"),
            "a symlink is copied as a symlink, never followed"
        );
    }

    #[test]
    fn what_exists_in_the_worktree_is_kept() {
        let (_t, src, dst, _) = places();
        fs::write(src.join("f"), b"new").unwrap();
        fs::write(dst.join("f"), b"mine").unwrap();
        symlink("new-target", src.join("l")).unwrap();
        symlink("my-target", dst.join("l")).unwrap();
        assert_eq!(copy(&src, &dst, "f"), "skipped");
        assert_eq!(copy(&src, &dst, "l"), "skipped");
        assert_eq!(fs::read(dst.join("f")).unwrap(), b"mine");
        assert_eq!(
            fs::read_link(dst.join("l")).unwrap(),
            Path::new("my-target")
        );
    }

    #[test]
    fn a_symlink_on_either_side_is_never_gone_through() {
        let (_t, src, dst, out) = places();
        fs::write(out.join(".env"), b"outside").unwrap();
        // the checkout's `conf` leads out: nothing is read through it
        symlink(&out, src.join("conf")).unwrap();
        assert_eq!(copy(&src, &dst, "conf/.env"), "symlink in repo checkout");
        assert!(!dst.join("conf").exists());
        // the worktree's `real` (a branch committed it as a link) leads out: nothing lands
        fs::create_dir(src.join("real")).unwrap();
        fs::write(src.join("real/new.env"), b"x").unwrap();
        symlink(&out, dst.join("real")).unwrap();
        assert_eq!(copy(&src, &dst, "real/new.env"), "symlink in task worktree");
        assert!(
            !out.join("new.env").exists(),
            "a file landed outside the worktree"
        );
        // a regular file where a directory is expected is refused the same way
        fs::write(src.join("plain"), b"x").unwrap();
        assert_eq!(copy(&src, &dst, "plain/x"), "symlink in repo checkout");
    }

    #[test]
    fn what_is_gone_or_not_a_file_is_skipped_and_other_errors_are_told() {
        let (_t, src, dst, _) = places();
        assert_eq!(copy(&src, &dst, "nope/x"), "skipped", "a missing directory");
        fs::create_dir(src.join("d")).unwrap();
        assert_eq!(copy(&src, &dst, "d/missing"), "skipped", "a missing file");
        assert_eq!(copy(&src, &dst, "d"), "skipped", "a directory");
        let fifo =
            std::ffi::CString::new(src.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert_eq!(copy(&src, &dst, "fifo"), "skipped", "a FIFO");
        assert!(!dst.join("fifo").exists() && !dst.join("d").exists());
        let long = "n".repeat(256);
        assert_eq!(
            copy(&src, &dst, &format!("{long}/x")),
            format!("open: errno {}", libc::ENAMETOOLONG)
        );
        assert_eq!(
            copy(&src, &dst, &format!("d/{long}")),
            format!("stat: errno {}", libc::ENAMETOOLONG)
        );
    }

    /// [`copy`] with `swap` run between the look at the source and its open, on a thread
    /// of its own (a copy that blocks fails the test instead of hanging it).
    fn copy_swapped(
        src: &Path,
        dst: &Path,
        rel: &str,
        swap: impl FnOnce() + Send + 'static,
    ) -> String {
        let (src, dst, rel) = (src.to_path_buf(), dst.to_path_buf(), rel.to_owned());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            safe::AFTER_LOOK.with(|h| *h.borrow_mut() = Some(Box::new(swap)));
            let _ = tx.send(copy(&src, &dst, &rel));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the copy blocked")
    }

    /// A source replaced between its look and its open is never followed out, read
    /// through a FIFO, or taken for what it was.
    #[test]
    fn a_source_replaced_after_its_look_is_not_gone_through() {
        let (_t, src, dst, out) = places();
        fs::write(out.join("secret"), b"outside").unwrap();
        // A file turned into a link out of the checkout.
        fs::write(src.join("f"), b"in").unwrap();
        let (f, target) = (src.join("f"), out.join("secret"));
        let got = copy_swapped(&src, &dst, "f", move || {
            fs::remove_file(&f).unwrap();
            symlink(&target, &f).unwrap();
        });
        assert_eq!(got, "symlink in repo checkout");
        assert!(!dst.join("f").exists(), "nothing copied");
        // A file turned into a FIFO nobody writes: skipped, not waited on.
        fs::write(src.join("p"), b"in").unwrap();
        let p = src.join("p");
        let got = copy_swapped(&src, &dst, "p", move || {
            fs::remove_file(&p).unwrap();
            let c = std::ffi::CString::new(p.into_os_string().into_encoded_bytes()).unwrap();
            // SAFETY: a valid C string.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        });
        assert_eq!(got, "skipped");
        assert!(!dst.join("p").exists());
        // A link turned into a file: not read as a link.
        symlink("t", src.join("l")).unwrap();
        let l = src.join("l");
        let got = copy_swapped(&src, &dst, "l", move || {
            fs::remove_file(&l).unwrap();
            fs::write(&l, b"now a file").unwrap();
        });
        assert_eq!(got, format!("read link: errno {}", libc::EINVAL));
        assert!(fs::symlink_metadata(dst.join("l")).is_err());
    }

    #[test]
    fn open_dir_opens_only_a_real_directory() {
        let (_t, src, _, out) = places();
        fs::write(src.join("f"), b"x").unwrap();
        symlink(&out, src.join("l")).unwrap();
        let fd = dir_fd(&src);
        assert!(
            safe::open_dir(Some(&fd), OsStr::new("f")).is_err(),
            "a file"
        );
        assert!(
            safe::open_dir(Some(&fd), OsStr::new("l")).is_err(),
            "a link to a directory"
        );
        assert!(safe::open_dir(None, src.join("l").as_os_str()).is_err());
        assert!(safe::open_dir(Some(&fd), OsStr::new(".")).is_ok());
    }

    fn git(dir: &Path, args: &[&str]) {
        let st = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .status()
            .expect("git runs");
        assert!(st.success(), "git {args:?}");
    }

    #[test]
    fn selected_is_what_the_patterns_name_and_git_ignores() {
        let t = tempfile::tempdir().expect("tempdir");
        let repo = t.path();
        git(repo, &["init", "-q"]);
        fs::write(repo.join(".gitignore"), ".env\nbuild/\n").unwrap();
        fs::write(repo.join(".env"), b"S=1").unwrap();
        fs::write(repo.join("notes.txt"), b"untracked, not ignored").unwrap();
        fs::create_dir(repo.join("build")).unwrap();
        fs::write(repo.join("build/out.bin"), b"x").unwrap();
        assert!(
            super::selected(repo).unwrap().is_empty(),
            "no .worktreeinclude"
        );
        fs::write(repo.join(super::FILE), "# comment\n.env\n*.txt\n").unwrap();
        assert_eq!(super::selected(repo).unwrap(), [PathBuf::from(".env")]);
        // patterns naming only files git does not ignore: nothing (git check-ignore
        // exits 1), not an error
        fs::write(repo.join(super::FILE), "*.txt\n").unwrap();
        assert!(super::selected(repo).unwrap().is_empty());
        // a .worktreeinclude that is a symlink is not read
        fs::remove_file(repo.join(super::FILE)).unwrap();
        fs::write(repo.join("patterns"), ".env\n").unwrap();
        symlink("patterns", repo.join(super::FILE)).unwrap();
        assert!(super::selected(repo).unwrap().is_empty());
        let dest = t.path().join("wt");
        fs::create_dir(&dest).unwrap();
        let (copied, warnings) = super::copy(repo, &dest).unwrap();
        assert!(copied.is_empty());
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("is a symlink: not read"),
            "{warnings:?}"
        );
    }
}
