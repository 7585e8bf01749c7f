//! Small helpers: a seeded random number generator and the path patterns of
//! `fail-fsync`.

use std::io;
use std::path::Path;

/// SplitMix64: a seeded generator, so a `cut --reorder SEED` is reproducible.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform number in `0..=n`.
    pub(crate) fn up_to(&mut self, n: usize) -> usize {
        // The modulo bias is irrelevant at these sizes.
        (self.next_u64() % (n as u64 + 1)) as usize
    }

    /// True with probability 1/2.
    pub(crate) fn coin(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }
}

/// Whether `path` (relative to the mount root, no leading `/`) matches `pattern`: a glob
/// when the pattern has `*` or `?` (`*` any run of characters, `/` included; `?` one
/// character; the whole path must match), else a substring of the path.
pub(crate) fn matches(pattern: &str, path: &str) -> bool {
    if !pattern.contains(['*', '?']) {
        return path.contains(pattern);
    }
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = path.chars().collect();
    // Iterative glob with backtracking to the last star.
    let (mut pi, mut si) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// How [`copy_tree`] copies regular files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileCopy {
    /// Their bytes (a file changed in place later keeps this copy as it was).
    Bytes,
    /// A hard link: the same inode, so the same inode number and times (a `file://`
    /// bucket's ETags stay valid); only for trees whose files are replaced by rename,
    /// never changed in place.
    Link,
}

/// Copies the tree at `src` to `dst` (created; must not exist): directories, regular
/// files (their bytes with their permission bits, or hard links: `how`) and symlinks.
/// Returns the files copied and the entries of other kinds skipped (sockets, fifos,
/// devices). Errors: the first failing read or write, with its path.
pub(crate) fn copy_tree(src: &Path, dst: &Path, how: FileCopy) -> io::Result<(u64, u64)> {
    let at = |p: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
    std::fs::create_dir(dst).map_err(|e| at(dst, e))?;
    let (mut files, mut skipped) = (0, 0);
    for entry in std::fs::read_dir(src).map_err(|e| at(src, e))? {
        let entry = entry.map_err(|e| at(src, e))?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        // An entry gone since the listing (a directory outside this file system that
        // another process changes, such as a bucket dir being uploaded to) is skipped.
        let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
        let kind = match entry.file_type() {
            Err(e) if gone(&e) => continue,
            other => other.map_err(|e| at(&from, e))?,
        };
        let copied = if kind.is_dir() {
            copy_tree(&from, &to, how).map(|(f, s)| {
                files += f;
                skipped += s;
            })
        } else if kind.is_file() {
            match how {
                FileCopy::Bytes => std::fs::copy(&from, &to).map(|_| ()),
                FileCopy::Link => std::fs::hard_link(&from, &to),
            }
            .map(|()| files += 1)
        } else if kind.is_symlink() {
            std::fs::read_link(&from).and_then(|t| std::os::unix::fs::symlink(t, &to))
        } else {
            skipped += 1;
            Ok(())
        };
        match copied {
            Err(e) if gone(&e) => continue,
            other => other.map_err(|e| at(&from, e))?,
        }
    }
    Ok((files, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_reproducible() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(42);
        let b: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(Rng::new(43).next_u64(), a[0]);
        let mut r = Rng::new(7);
        let heads = (0..1000).filter(|_| r.coin()).count();
        assert!((400..600).contains(&heads), "{heads}");
    }

    #[test]
    fn patterns() {
        assert!(matches("wal", "db/x.sqlite-wal"));
        assert!(!matches("shm", "db/x.sqlite-wal"));
        assert!(matches("*-wal", "db/x.sqlite-wal"));
        assert!(matches("db/*.sqlite", "db/a/b.sqlite"));
        assert!(!matches("db/*.sqlite", "db/a/b.sqlite-wal"));
        assert!(matches("?b", "ab"));
        assert!(matches("*", ""));
        assert!(!matches("a*b*c", "acb"));
    }
}
