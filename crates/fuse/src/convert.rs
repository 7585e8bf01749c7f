//! Pure conversions between VFS values and fuser values (times, file kinds, attributes,
//! the xattr size protocol). No I/O, so every rule here is unit-tested.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deskfs_vfs::{Attr, Kind, SetTime};
use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};

/// `st_blksize` reported for every inode: the preferred I/O size, bytes.
pub(crate) const BLKSIZE: u32 = 4096;

/// A time as nanoseconds since the epoch (negative before 1970) → `SystemTime`.
///
/// Every `i64` is representable on Linux; should the platform refuse one, the epoch is
/// returned rather than panicking.
pub(crate) fn ns_to_system_time(ns: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(ns.unsigned_abs());
    let t = if ns >= 0 {
        UNIX_EPOCH.checked_add(magnitude)
    } else {
        UNIX_EPOCH.checked_sub(magnitude)
    };
    t.unwrap_or(UNIX_EPOCH)
}

/// `SystemTime` → nanoseconds since the epoch (negative before 1970), saturating at the
/// `i64` range (years 1677..2262), as a kernel clamps a time to its file system's range.
pub(crate) fn system_time_to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos())
            .map(|n| -n)
            .unwrap_or(i64::MIN),
    }
}

/// A time that fuser decoded from a kernel request (`setattr`) → nanoseconds since the
/// epoch.
///
/// fuser 0.18.0 decodes a pre-1970 kernel timespec `(sec < 0, nsec)` as
/// `EPOCH - (|sec| s + nsec ns)`, but the kernel means `sec s + nsec ns` (nsec counts
/// forward; upstream fix: cberner/fuser#705). This undoes that: from
/// `EPOCH - d` it recovers `sec = -d.secs`, `nsec = d.subsec_nanos` and returns
/// `sec * 10^9 + nsec`. Times after 1970 are decoded correctly by fuser and pass through.
/// When fuser is upgraded to a release with the fix, set [`FUSER_SWAPS_PRE_EPOCH_NSEC`]
/// to `false` (a mount test that sets a pre-1970 time with a fraction catches it).
pub(crate) fn kernel_time_to_ns(t: SystemTime) -> i64 {
    if !FUSER_SWAPS_PRE_EPOCH_NSEC {
        return system_time_to_ns(t);
    }
    match t.duration_since(UNIX_EPOCH) {
        Ok(_) => system_time_to_ns(t),
        Err(before) => {
            let d = before.duration();
            let ns = -i128::from(d.as_secs()) * 1_000_000_000 + i128::from(d.subsec_nanos());
            i64::try_from(ns).unwrap_or(i64::MIN)
        }
    }
}

/// Whether the linked fuser has the pre-1970 timespec decoding bug (true for 0.18.0).
pub(crate) const FUSER_SWAPS_PRE_EPOCH_NSEC: bool = true;

/// fuser's `TimeOrNow` (a `setattr` time) → the VFS's [`SetTime`].
pub(crate) fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(kernel_time_to_ns(t)),
    }
}

/// VFS file kind → fuser file type.
pub(crate) fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

/// VFS attributes → fuser attributes (`blksize` = [`BLKSIZE`], `crtime` = birth time).
pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: ns_to_system_time(a.atime_ns),
        mtime: ns_to_system_time(a.mtime_ns),
        ctime: ns_to_system_time(a.ctime_ns),
        crtime: ns_to_system_time(a.btime_ns),
        kind: file_type(a.kind),
        // The mask keeps the value within 12 bits, so the cast is lossless.
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// Attributes for a `readdirplus` entry the VFS gave none for (`..`): the kernel does not
/// link `.` or `..` entries into its cache, only their inode number and type reach
/// `getdents`, so the rest is zero.
pub(crate) fn placeholder_attr(ino: u64, kind: Kind) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: file_type(kind),
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// The attributes of a negative entry: node id 0 tells the kernel that the name does not
/// exist, and the entry TTL how long it may remember that (FUSE protocol, `fuse_lookup`).
pub(crate) fn negative_attr() -> FileAttr {
    placeholder_attr(0, Kind::File)
}

/// Whether `name` is `.` or `..` (entries the kernel never counts as lookups).
pub(crate) fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// How to answer a `getxattr`/`listxattr` whose value is `value`, when the caller's
/// buffer holds `size` bytes (FUSE protocol: `size == 0` asks for the length only).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum XattrAnswer<'a> {
    /// Reply with the value's length, bytes.
    Size(u32),
    /// Reply with the value.
    Data(&'a [u8]),
    /// Reply with this errno (`ERANGE`: the buffer is too small; `E2BIG`: the value does
    /// not fit the protocol's 32-bit length).
    Error(i32),
}

/// Applies the FUSE xattr size protocol to `value` and the caller's buffer `size`.
pub(crate) fn xattr_answer(value: &[u8], size: u32) -> XattrAnswer<'_> {
    let Ok(len) = u32::try_from(value.len()) else {
        return XattrAnswer::Error(libc::E2BIG);
    };
    if size == 0 {
        XattrAnswer::Size(len)
    } else if len > size {
        XattrAnswer::Error(libc::ERANGE)
    } else {
        XattrAnswer::Data(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn before_epoch(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH - Duration::new(secs, nanos)
    }

    #[test]
    fn ns_to_system_time_handles_both_sides_of_the_epoch() {
        assert_eq!(ns_to_system_time(0), UNIX_EPOCH);
        assert_eq!(
            ns_to_system_time(1_500_000_000),
            UNIX_EPOCH + Duration::new(1, 500_000_000)
        );
        assert_eq!(
            ns_to_system_time(-1_200_000_000),
            before_epoch(1, 200_000_000)
        );
        assert_eq!(ns_to_system_time(-1), before_epoch(0, 1));
    }

    #[test]
    fn ns_round_trips_through_system_time() {
        for ns in [
            0,
            1,
            -1,
            999_999_999,
            -999_999_999,
            1_000_000_000,
            -1_000_000_000,
            -1_200_000_000,
            1_700_000_000_123_456_789,
            // 1901-12-13, the 32-bit time_t minimum used by test suites.
            -2_147_483_648_000_000_000,
            i64::MAX,
            i64::MIN,
        ] {
            assert_eq!(system_time_to_ns(ns_to_system_time(ns)), ns, "ns={ns}");
        }
    }

    #[test]
    fn system_time_to_ns_saturates_outside_the_i64_range() {
        let far_future = UNIX_EPOCH + Duration::from_secs(u64::from(u32::MAX) * 100);
        assert_eq!(system_time_to_ns(far_future), i64::MAX);
        let far_past = before_epoch(u64::from(u32::MAX) * 100, 0);
        assert_eq!(system_time_to_ns(far_past), i64::MIN);
    }

    #[test]
    fn kernel_time_undoes_fusers_pre_epoch_decoding() {
        // Kernel sent (sec = -2, nsec = 800_000_000) = -1.2 s; fuser 0.18.0 hands over
        // EPOCH - 2.8 s, a fixed fuser EPOCH - 1.2 s.
        let handed_over = if FUSER_SWAPS_PRE_EPOCH_NSEC {
            before_epoch(2, 800_000_000)
        } else {
            before_epoch(1, 200_000_000)
        };
        assert_eq!(kernel_time_to_ns(handed_over), -1_200_000_000);
        // Whole seconds are decoded correctly by fuser.
        assert_eq!(kernel_time_to_ns(before_epoch(5, 0)), -5_000_000_000);
        // After the epoch nothing changes.
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 42);
        assert_eq!(kernel_time_to_ns(t), 1_700_000_000_000_000_042);
    }

    #[test]
    fn set_time_maps_now_and_specific_times() {
        assert_eq!(set_time(TimeOrNow::Now), SetTime::Now);
        let t = UNIX_EPOCH + Duration::new(3, 4);
        assert_eq!(
            set_time(TimeOrNow::SpecificTime(t)),
            SetTime::At(3_000_000_004)
        );
    }

    #[test]
    fn every_kind_maps_to_its_file_type() {
        let pairs = [
            (Kind::File, FileType::RegularFile),
            (Kind::Dir, FileType::Directory),
            (Kind::Symlink, FileType::Symlink),
            (Kind::Fifo, FileType::NamedPipe),
            (Kind::Socket, FileType::Socket),
            (Kind::CharDev, FileType::CharDevice),
            (Kind::BlockDev, FileType::BlockDevice),
        ];
        for (kind, ft) in pairs {
            assert_eq!(file_type(kind), ft, "{kind:?}");
        }
    }

    #[test]
    fn file_attr_copies_every_field() {
        let a = Attr {
            ino: 42,
            kind: Kind::File,
            perm: 0o4755,
            nlink: 2,
            uid: 1000,
            gid: 100,
            rdev: 0,
            size: 5000,
            blocks: 16,
            atime_ns: -1_500_000_000,
            mtime_ns: 2_000_000_001,
            ctime_ns: 3,
            btime_ns: 4,
        };
        let f = file_attr(&a);
        assert_eq!(f.ino, INodeNo(42));
        assert_eq!(f.kind, FileType::RegularFile);
        assert_eq!(f.perm, 0o4755);
        assert_eq!((f.nlink, f.uid, f.gid, f.rdev), (2, 1000, 100, 0));
        assert_eq!((f.size, f.blocks, f.blksize), (5000, 16, BLKSIZE));
        assert_eq!(f.atime, before_epoch(1, 500_000_000));
        assert_eq!(f.mtime, UNIX_EPOCH + Duration::new(2, 1));
        assert_eq!(f.ctime, UNIX_EPOCH + Duration::new(0, 3));
        assert_eq!(f.crtime, UNIX_EPOCH + Duration::new(0, 4));
    }

    #[test]
    fn xattr_answer_follows_the_size_protocol() {
        assert_eq!(xattr_answer(b"abc", 0), XattrAnswer::Size(3));
        assert_eq!(xattr_answer(b"", 0), XattrAnswer::Size(0));
        assert_eq!(xattr_answer(b"abc", 2), XattrAnswer::Error(libc::ERANGE));
        assert_eq!(xattr_answer(b"abc", 3), XattrAnswer::Data(b"abc"));
        assert_eq!(xattr_answer(b"abc", 4096), XattrAnswer::Data(b"abc"));
    }

    #[test]
    fn dot_entries_are_recognised() {
        assert!(is_dot_or_dotdot(b"."));
        assert!(is_dot_or_dotdot(b".."));
        assert!(!is_dot_or_dotdot(b"..."));
        assert!(!is_dot_or_dotdot(b".a"));
    }
}
