//! The `fuser::Filesystem` implementation: each request locks the model, does its work,
//! and replies. Kernel settings keep the kernel from hiding state: attribute and entry
//! TTLs of 0 (every path walk and stat asks the daemon), no negative entries, no
//! writeback cache (every write reaches the daemon), no `FOPEN_KEEP_CACHE` (an open
//! drops the kernel's cached pages of the file), no lock capabilities (POSIX and BSD
//! locks are the kernel's own), no xattr support (`ENOSYS`, which the kernel turns into
//! `EOPNOTSUPP` for good).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use crate::state::{Attr, Caller, Kind, Res, SetAttr, SetTime, State, NAME_MAX};

/// Attribute and entry lifetime: none, so the kernel asks every time.
const TTL: Duration = Duration::ZERO;
const GENERATION: Generation = Generation(0);
const BLKSIZE: u32 = 4096;
/// Largest write request asked of the kernel.
const MAX_WRITE: u32 = 1 << 20;

/// The file system: the model behind one lock (shared with the control socket).
pub(crate) struct LossFs {
    state: Arc<Mutex<State>>,
}

/// Locks the model (a panicked holder leaves it usable: each operation is small).
pub(crate) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl LossFs {
    /// The file system over the model `state`.
    pub(crate) fn new(state: Arc<Mutex<State>>) -> LossFs {
        LossFs { state }
    }

    fn s(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn ns_to_time(ns: i64) -> SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    let t = if ns >= 0 {
        UNIX_EPOCH.checked_add(d)
    } else {
        UNIX_EPOCH.checked_sub(d)
    };
    t.unwrap_or(UNIX_EPOCH)
}

/// A `setattr` time from fuser → ns since the epoch (fuser 0.18.0 decodes a pre-1970
/// kernel timespec `(sec < 0, nsec)` as `EPOCH - (|sec| s + nsec ns)`).
fn kernel_time_to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => {
            let d = before.duration();
            let ns = -i128::from(d.as_secs()) * 1_000_000_000 + i128::from(d.subsec_nanos());
            i64::try_from(ns).unwrap_or(i64::MIN)
        }
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(kernel_time_to_ns(t)),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: ns_to_time(a.atime_ns),
        mtime: ns_to_time(a.mtime_ns),
        ctime: ns_to_time(a.ctime_ns),
        crtime: ns_to_time(a.ctime_ns),
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

fn reply_entry(r: Res<Attr>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), GENERATION),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn reply_empty(r: Res<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn reply_data(r: Res<Vec<u8>>, reply: ReplyData) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn reply_attr(r: Res<Attr>, reply: ReplyAttr) {
    match r {
        Ok(a) => reply.attr(&TTL, &file_attr(&a)),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

impl Filesystem for LossFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.s().lookup(parent.0, name.as_bytes());
        reply_entry(r, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.s().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = self.s().getattr(ino.0);
        reply_attr(r, reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        let r = self.s().setattr(ino.0, &set);
        reply_attr(r, reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = self.s().readlink(ino.0);
        reply_data(r, reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self
            .s()
            .mknod(caller(req), parent.0, name.as_bytes(), mode, rdev);
        reply_entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.s().mkdir(caller(req), parent.0, name.as_bytes(), mode);
        reply_entry(r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.s().unlink(parent.0, name.as_bytes());
        reply_empty(r, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.s().rmdir(parent.0, name.as_bytes());
        reply_empty(r, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.s().symlink(
            caller(req),
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        reply_entry(r, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.s().rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        );
        reply_empty(r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.s().link(ino.0, newparent.0, newname.as_bytes());
        reply_entry(r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.s().open(ino.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let r = self.s().read(ino.0, offset, size);
        reply_data(r, reply);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self.s().write(ino.0, offset, data);
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.s().release(ino.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.s().fsync(ino.0, datasync);
        reply_empty(r, reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = self.s().fallocate(ino.0, offset, length, mode);
        reply_empty(r, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.s().getattr(ino.0) {
            Ok(a) if a.kind != Kind::Dir => reply.error(Errno::ENOTDIR),
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // A listing is the directory's entries in name order; the offset is a position
        // in it (entries added or removed during a listing may shift it).
        let r = self.s().readdir(ino.0);
        match r {
            Ok(entries) => {
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, e) in entries.iter().enumerate().skip(skip) {
                    if reply.add(
                        INodeNo(e.ino),
                        i as u64 + 1,
                        file_type(e.kind),
                        OsStr::from_bytes(&e.name),
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.s().fsyncdir(ino.0);
        reply_empty(r, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The backing file system's figures (pending data is not counted).
        let backing = self.s().backing().to_path_buf();
        match nix::sys::statvfs::statvfs(&backing) {
            Ok(v) => reply.statfs(
                v.blocks(),
                v.blocks_free(),
                v.blocks_available(),
                v.files(),
                v.files_free(),
                u32::try_from(v.block_size()).unwrap_or(BLKSIZE),
                NAME_MAX as u32,
                u32::try_from(v.fragment_size()).unwrap_or(BLKSIZE),
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Not called under `default_permissions` (the kernel checks the mode bits).
        let r = self.s().getattr(ino.0).map(|_| ());
        reply_empty(r, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.s();
        let r = s
            .mknod(caller(req), parent.0, name.as_bytes(), mode, 0)
            .and_then(|a| s.open(a.ino).map(|()| a));
        drop(s);
        match r {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a),
                GENERATION,
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }
}
