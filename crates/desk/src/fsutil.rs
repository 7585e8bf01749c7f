//! Small file-system helpers: atomic writes, tree sizes, relative paths, UTC timestamps.

use std::fs;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{IoContext, Result};

/// Suffix of the temp files [`atomic_write`] makes next to their target; a leftover one is
/// a crash remnant that `desk tidy` removes.
pub const TMP_SUFFIX: &str = ".deskfs-tmp";

/// Writes `data` to `path` atomically: a temp file in the same directory, fsync, rename.
/// Readers see the old or the new content, never a mix; a crash leaves at most a
/// `.NAME.PID.deskfs-tmp` file behind.
///
/// # Errors
/// I/O errors creating, writing, syncing or renaming (the temp file is removed).
pub fn atomic_write(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}{TMP_SUFFIX}", std::process::id()));
    let res = (|| -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res.ctx("write", path)
}

/// Total size in bytes of the regular files under `path` (symlinks are not followed and
/// count as their own length; unreadable entries are skipped). 0 when `path` is missing.
pub fn tree_size(path: &Path) -> u64 {
    let Ok(md) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !md.is_dir() {
        return md.len();
    }
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                total += md.len();
            }
        }
    }
    total
}

/// Removes a file, symlink or directory tree; a missing path is not an error.
///
/// # Errors
/// I/O errors other than "not found".
pub fn remove_path(path: &Path) -> Result<()> {
    let md = match fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(crate::DeskError::io("stat", path, e)),
    };
    let res = if md.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match res {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r.ctx("remove", path),
    }
}

/// The path of `to` relative to directory `from`; both must be absolute and normalized
/// (e.g. canonicalized). `relative_path("/d/tasks/t", "/d/repos/r/.git")` is
/// `../../repos/r/.git`.
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// Seconds since the Unix epoch, now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Seconds since the epoch of a metadata's mtime (0 when unknown).
pub fn mtime_secs(md: &fs::Metadata) -> u64 {
    md.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `2024-05-01T12:34:56Z` for `secs` since the epoch (proleptic Gregorian, UTC).
pub fn utc_iso(secs: u64) -> String {
    let (y, mo, d, h, mi, s) = utc_parts(secs as i64);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// `2024-05-01T12:34:56.789Z` for `ns` nanoseconds since the epoch (before it too).
pub fn utc_iso_millis(ns: i64) -> String {
    let (y, mo, d, h, mi, s) = utc_parts(ns.div_euclid(1_000_000_000));
    let ms = ns.rem_euclid(1_000_000_000) / 1_000_000;
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

/// `20240501T123456Z`: [`utc_iso`] without separators, for file names.
pub fn utc_compact(secs: u64) -> String {
    let (y, mo, d, h, mi, s) = utc_parts(secs as i64);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

fn utc_parts(secs: i64) -> (i64, u32, u32, i64, i64, i64) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from a day count (era-based conversion, eras of 400 years = 146097 days).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Human size: `512 B`, `1.5 KiB`, `2.0 GiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(utc_iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_iso(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_iso(1_714_566_896), "2024-05-01T12:34:56Z");
        assert_eq!(utc_compact(1_714_566_896), "20240501T123456Z");
        // The century rules of the Gregorian calendar: 2100 is not a leap year, 2400 is
        // (each date checked against Python's datetime).
        assert_eq!(utc_iso(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(utc_iso(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(utc_iso(13_569_465_599), "2399-12-31T23:59:59Z");
        assert_eq!(utc_iso(13_574_606_400), "2400-02-29T12:00:00Z");
        assert_eq!(utc_iso(13_574_649_600), "2400-03-01T00:00:00Z");
    }

    #[test]
    fn times_in_milliseconds_before_and_after_the_epoch() {
        assert_eq!(utc_iso_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            utc_iso_millis(1_714_566_896_789_654_321),
            "2024-05-01T12:34:56.789Z"
        );
        assert_eq!(utc_iso_millis(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            utc_iso_millis(-2_203_891_200_000_000_000),
            "1900-03-01T00:00:00.000Z"
        );
        assert_eq!(
            utc_iso_millis(-2_203_977_600_000_000_000 + 1_000_000),
            "1900-02-28T00:00:00.001Z"
        );
    }

    /// A missing path is no error; any other failure is, of the look and of the removal.
    #[test]
    fn remove_path_ignores_only_a_missing_path() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        fs::create_dir_all(t.join("d/e")).unwrap();
        fs::write(t.join("f"), b"x").unwrap();
        remove_path(&t.join("missing")).unwrap();
        // The look fails (ENOTDIR: a file used as a directory).
        assert!(remove_path(&t.join("f/x")).is_err());
        // The removal fails (procfs refuses unlink, even to root).
        assert!(remove_path(Path::new("/proc/self/status")).is_err());
        remove_path(&t.join("d")).unwrap();
        remove_path(&t.join("f")).unwrap();
        assert!(!t.join("d").exists() && !t.join("f").exists());
    }

    #[test]
    fn relative() {
        assert_eq!(
            relative_path(
                Path::new("/d/tasks/t"),
                Path::new("/d/repos/r/.git/worktrees/t")
            ),
            PathBuf::from("../../repos/r/.git/worktrees/t")
        );
        assert_eq!(
            relative_path(Path::new("/a"), Path::new("/a")),
            PathBuf::from(".")
        );
        assert_eq!(
            relative_path(Path::new("/a/b"), Path::new("/a")),
            PathBuf::from("..")
        );
    }

    #[test]
    fn sizes_and_writes() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        atomic_write(&p, b"hello").unwrap();
        atomic_write(&p, b"hi").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"hi");
        fs::create_dir(t.path().join("d")).unwrap();
        fs::write(t.path().join("d/g"), vec![0u8; 1000]).unwrap();
        assert_eq!(tree_size(t.path()), 1002);
        assert_eq!(
            fs::read_dir(t.path()).unwrap().count(),
            2,
            "no temp file left"
        );
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1024), "1.0 KiB");
        assert_eq!(human_size(1 << 20), "1.0 MiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
        assert_eq!(human_size(2048 << 50), "2048.0 PiB", "no unit past PiB");
        remove_path(&t.path().join("d")).unwrap();
        remove_path(&t.path().join("missing")).unwrap();
        assert!(!t.path().join("d").exists());
    }
}
