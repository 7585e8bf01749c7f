//! The mount table of this process's mount namespace, `/proc/self/mountinfo`, read as
//! bytes (a mount point anywhere may hold bytes that are not UTF-8) and never through a
//! call into a file system (which may not answer).
//!
//! Format: proc(5), `/proc/[pid]/mountinfo`: `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS
//! [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS`, with space, tab, newline and backslash in
//! paths written as `\NNN` octal escapes (so ` - ` only ever separates the two halves).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One mount of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountLine {
    /// The mounted file system's device number (`major`, `minor`): one per mount of a
    /// FUSE file system, so it tells two mounts at one mount point apart.
    pub dev: (u32, u32),
    /// Mount point, unescaped.
    pub point: PathBuf,
    /// File system type, e.g. `fuse.deskfs`, `ext4`.
    pub fstype: String,
    /// Source, unescaped (lossy UTF-8), e.g. `deskfs:work`.
    pub source: String,
}

impl MountLine {
    /// A deskfs mount: a FUSE type (`fuse.deskfs`, or `fuse` as older deskfs and
    /// fuser's own mount named it) with a `deskfs` source.
    pub fn is_deskfs(&self) -> bool {
        self.fstype.starts_with("fuse") && self.source.starts_with("deskfs")
    }
}

/// The table of this process's mount namespace; empty when it cannot be read.
pub fn read() -> Vec<MountLine> {
    std::fs::read("/proc/self/mountinfo")
        .map(|t| parse(&t))
        .unwrap_or_default()
}

/// The top mount at `path` (the last line with that exact mount point: later mounts
/// stack on earlier ones), or `None` when nothing is mounted there.
pub fn top_at(path: &Path) -> Option<MountLine> {
    top_in(read(), path)
}

/// As [`top_at`], over a table already read.
pub fn top_in(table: Vec<MountLine>, path: &Path) -> Option<MountLine> {
    table.into_iter().rev().find(|m| m.point == path)
}

/// Parses a mount table; lines that do not have the format are skipped.
pub fn parse(text: &[u8]) -> Vec<MountLine> {
    text.split(|&b| b == b'\n').filter_map(line).collect()
}

fn line(l: &[u8]) -> Option<MountLine> {
    let sep = l.windows(3).position(|w| w == b" - ")?;
    let (left, right) = (&l[..sep], &l[sep + 3..]);
    let mut f = left.split(|&b| b == b' ');
    let dev = f.nth(2)?;
    let point = f.nth(1)?;
    let mut r = right.split(|&b| b == b' ');
    let fstype = r.next()?;
    let source = r.next()?;
    let dev = std::str::from_utf8(dev).ok()?;
    let (maj, min) = dev.split_once(':')?;
    Some(MountLine {
        dev: (maj.parse().ok()?, min.parse().ok()?),
        point: PathBuf::from(OsString::from_vec(unescape(point))),
        fstype: String::from_utf8_lossy(fstype).into_owned(),
        source: String::from_utf8_lossy(&unescape(source)).into_owned(),
    })
}

/// Undoes the `\NNN` octal escapes.
fn unescape(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    const INFO: &[u8] = b"\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:50 / /mnt/a\\040b rw,nosuid shared:7 master:2 - fuse.deskfs deskfs:x rw,user_id=0
41 40 0:51 / /mnt/a\\040b rw - fuse.deskfs deskfs:y rw,user_id=0
42 22 0:52 / /mnt/bad\xff rw - tmpfs none rw
43 22 0:53 / /mnt/a\\134-\\011 rw - fuse deskfs:old rw
";

    #[test]
    fn every_line_is_read_and_the_top_of_a_stack_wins() {
        let t = parse(INFO);
        assert_eq!(t.len(), 5, "{t:?}");
        let top = top_in(t.clone(), Path::new("/mnt/a b")).expect("mounted");
        assert_eq!(top.dev, (0, 51));
        assert_eq!(top.source, "deskfs:y");
        assert!(top.is_deskfs());
        // A mount point that is not UTF-8 is read, and does not hide the others.
        let bad = PathBuf::from(std::ffi::OsStr::from_bytes(b"/mnt/bad\xff"));
        assert_eq!(top_in(t.clone(), &bad).map(|m| m.dev), Some((0, 52)));
        assert!(!top_in(t.clone(), &bad).expect("tmpfs").is_deskfs());
        assert_eq!(
            top_in(t.clone(), Path::new("/mnt/a\\-\t")).map(|m| m.fstype),
            Some("fuse".to_owned())
        );
        assert_eq!(top_in(t, Path::new("/mnt")), None);
    }

    #[test]
    fn escapes_are_undone_and_lone_backslashes_kept() {
        assert_eq!(unescape(b"a\\134b\\011c\\"), b"a\\b\tc\\".to_vec());
        assert_eq!(unescape(b"x\\04"), b"x\\04".to_vec());
        assert_eq!(unescape(b"\\777"), b"\\777".to_vec());
    }
}
