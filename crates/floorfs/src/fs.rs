//! The `fuser::Filesystem` implementation: each request takes the table's one lock, does
//! its in-memory work, drops the lock and replies. Kernel settings are deskfs's when it
//! is the only mount of its workspace (`crates/fuse/src/filesystem.rs`): 60 s attribute
//! and entry TTLs, 30 s negative entries, 1 MiB requests, readdirplus (auto), parallel
//! dirops, killpriv v2, cached symlinks, cached directory listings, page-cache opens kept
//! across opens (`FOPEN_KEEP_CACHE`), no writeback cache — but no lock capabilities:
//! POSIX and BSD locks are the kernel's own (per mount), which costs no request at all.
//! With `--passthrough` every regular file is opened through its backing file (as deskfs
//! does for files whose content is local), so reads and writes never reach the daemon;
//! its `fsync` then flushes the backing file (`fdatasync` or `fsync`), the least a file
//! system that keeps that promise does (names live in memory: `fsyncdir` has nothing to do).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::stats::{timed, Op};
use crate::table::{Attr, Caller, Kind, Res, SetAttr, SetTime, Table, NAME_MAX};

/// Largest read/write request and readahead window asked of the kernel (deskfs's).
const MAX_IO: u32 = 1 << 20;
/// Attribute and entry lifetime (deskfs alone: `alone_ttl`).
const TTL: Duration = Duration::from_secs(60);
/// Negative entry lifetime (deskfs alone: `negative_ttl`).
const NEGATIVE_TTL: Duration = Duration::from_secs(30);
const GENERATION: Generation = Generation(0);
const BLKSIZE: u32 = 4096;
/// File handle of an open answered through a backing file; other opens get 0.
const FH_PASSTHROUGH: u64 = 1;

/// The file system: the inode table behind one lock, and the passthrough state.
pub(crate) struct FloorFs {
    table: Mutex<Table>,
    /// `--passthrough` was asked for.
    passthrough_wanted: bool,
    /// Passthrough granted by the kernel and not refused since.
    passthrough_on: AtomicBool,
    /// Backing ids in use, by inode, with their open count (one id per inode, shared by
    /// all its passthrough opens: the kernel refuses another).
    backings: Mutex<HashMap<u64, (BackingId, u32)>>,
}

impl FloorFs {
    pub(crate) fn new(table: Table, passthrough: bool) -> FloorFs {
        FloorFs {
            table: Mutex::new(table),
            passthrough_wanted: passthrough,
            passthrough_on: AtomicBool::new(false),
            backings: Mutex::new(HashMap::new()),
        }
    }

    fn t(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reply_entry(&self, r: Res<Attr>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), GENERATION),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    /// Opens `ino` for the kernel: through its backing file when passthrough is on (or
    /// the inode already has a backing id), else through the page cache. `open_backing`
    /// registers a file with the kernel; `send` sends the answer (with the backings
    /// table locked, so the answers for one inode reach the kernel in order).
    fn answer_open(
        &self,
        ino: u64,
        open_backing: impl FnOnce(&std::fs::File) -> io::Result<BackingId>,
        send: impl FnOnce(Option<&BackingId>),
    ) {
        let path = {
            let t = self.t();
            if t.is_backed(ino) {
                t.backing_path(ino)
            } else {
                None
            }
        };
        let mut b = self.backings.lock().unwrap_or_else(|p| p.into_inner());
        let Some(path) = path else { return send(None) };
        if !self.passthrough_on.load(Ordering::Relaxed) && !b.contains_key(&ino) {
            return send(None);
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = b.entry(ino) {
            let id = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .and_then(|f| open_backing(&f));
            match id {
                Ok(id) => {
                    slot.insert((id, 0));
                }
                Err(e) => {
                    if self.passthrough_on.swap(false, Ordering::Relaxed) {
                        eprintln!("deskfs-floorfs: the kernel refused a backing file ({e}); serving reads and writes from now on");
                    }
                    return send(None);
                }
            }
        }
        match b.get_mut(&ino) {
            Some(entry) => {
                entry.1 += 1;
                send(Some(&entry.0));
            }
            None => send(None),
        }
    }
}

/// The caller of a request.
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

/// A `setattr` time from fuser → ns since the epoch. fuser 0.18.0 decodes a pre-1970
/// kernel timespec `(sec < 0, nsec)` as `EPOCH - (|sec| s + nsec ns)` where the kernel
/// means `sec s + nsec ns` (deskfs's `kernel_time_to_ns` undoes the same).
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
        crtime: ns_to_time(a.btime_ns),
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

/// Attributes of a readdirplus `.`/`..` entry (the kernel uses only ino and type) and of
/// a negative entry (ino 0).
fn placeholder_attr(ino: u64, kind: Kind) -> FileAttr {
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

fn reply_empty(r: Res<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

/// Replies to getxattr/listxattr per the FUSE size protocol (`size` 0: the length only).
fn reply_xattr(r: Res<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Err(e) => reply.error(Errno::from_i32(e)),
        Ok(v) => match u32::try_from(v.len()) {
            Err(_) => reply.error(Errno::E2BIG),
            Ok(len) if size == 0 => reply.size(len),
            Ok(len) if len > size => reply.error(Errno::ERANGE),
            Ok(_) => reply.data(&v),
        },
    }
}

impl Filesystem for FloorFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(nearest);
        }
        for flag in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ] {
            if let Err(missing) = config.add_capabilities(flag) {
                eprintln!("deskfs-floorfs: the kernel lacks {missing:?}");
            }
        }
        if self.passthrough_wanted {
            let granted = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !granted {
                eprintln!("deskfs-floorfs: the kernel does not offer FUSE passthrough; reads and writes go through the daemon");
            }
            self.passthrough_on.store(granted, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _op = timed(Op::Lookup);
        let r = self.t().lookup(parent.0, name.as_bytes());
        match r {
            Err(libc::ENOENT) => reply.entry_with_ttls(
                &Duration::ZERO,
                &NEGATIVE_TTL,
                &placeholder_attr(0, Kind::File),
                GENERATION,
            ),
            r => self.reply_entry(r, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        crate::stats::count(Op::Forget, 1);
        self.t().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _op = timed(Op::Getattr);
        let r = self.t().getattr(ino.0);
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
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
        let _op = timed(Op::Setattr);
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        let r = self.t().setattr(caller(req), ino.0, &set);
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _op = timed(Op::Readlink);
        let r = self.t().readlink(ino.0);
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
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
        let _op = timed(Op::Mknod);
        let r = self
            .t()
            .mknod(caller(req), parent.0, name.as_bytes(), mode, rdev);
        self.reply_entry(r, reply);
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
        let _op = timed(Op::Mkdir);
        let r = self.t().mkdir(caller(req), parent.0, name.as_bytes(), mode);
        self.reply_entry(r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _op = timed(Op::Unlink);
        let r = self.t().unlink(parent.0, name.as_bytes());
        reply_empty(r, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _op = timed(Op::Rmdir);
        let r = self.t().rmdir(parent.0, name.as_bytes());
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
        let _op = timed(Op::Symlink);
        let r = self.t().symlink(
            caller(req),
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        self.reply_entry(r, reply);
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
        let _op = timed(Op::Rename);
        let r = self.t().rename(
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
        let _op = timed(Op::Link);
        let r = self.t().link(ino.0, newparent.0, newname.as_bytes());
        self.reply_entry(r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _op = timed(Op::Open);
        if let Err(e) = self.t().getattr(ino.0) {
            return reply.error(Errno::from_i32(e));
        }
        let reply = std::cell::Cell::new(Some(reply));
        self.answer_open(
            ino.0,
            |f| match reply.take() {
                Some(r) => {
                    let id = r.open_backing(f);
                    reply.set(Some(r));
                    id
                }
                None => Err(io::Error::other("reply already sent")),
            },
            |id| {
                if let Some(r) = reply.take() {
                    match id {
                        Some(id) => r.opened_passthrough(
                            FileHandle(FH_PASSTHROUGH),
                            FopenFlags::empty(),
                            id,
                        ),
                        None => r.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
                    }
                }
            },
        );
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
        let _op = timed(Op::Read);
        let r = self.t().read(ino.0, offset, size);
        match r {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _op = timed(Op::Write);
        let kill = write_flags
            .contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            .then(|| caller(req));
        let r = self.t().write(ino.0, offset, data, kill);
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
        let _op = timed(Op::Flush);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _op = timed(Op::Release);
        if fh.0 == FH_PASSTHROUGH {
            let mut b = self.backings.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(entry) = b.get_mut(&ino.0) {
                entry.1 = entry.1.saturating_sub(1);
                if entry.1 == 0 {
                    // Dropping the id closes it (FUSE_DEV_IOC_BACKING_CLOSE).
                    b.remove(&ino.0);
                }
            }
        }
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
        let _op = timed(Op::Fsync);
        // Outside the table's lock: a device flush takes ~100 µs here.
        let backed = self.t().is_backed(ino.0);
        let r = if backed {
            let t = self.t();
            let path = t.backing_path(ino.0);
            drop(t);
            match path {
                Some(p) => std::fs::File::open(p)
                    .and_then(|f| {
                        if datasync {
                            f.sync_data()
                        } else {
                            f.sync_all()
                        }
                    })
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)),
                None => Ok(()),
            }
        } else {
            Ok(())
        };
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
        let _op = timed(Op::Fallocate);
        let r = self.t().fallocate(ino.0, offset, length, mode);
        reply_empty(r, reply);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let _op = timed(Op::Ioctl);
        reply.error(Errno::ENOTTY);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _op = timed(Op::Opendir);
        let r = self.t().getattr(ino.0);
        match r {
            Ok(a) if a.kind != Kind::Dir => reply.error(Errno::ENOTDIR),
            // Listings are cached in the kernel and kept across opens: every change goes
            // through this mount, and the kernel drops its cache when the directory changes.
            Ok(_) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
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
        let _op = timed(Op::Readdir);
        let r = self.t().readdir(ino.0, offset, false, |e| {
            reply.add(
                INodeNo(e.ino),
                e.cookie,
                file_type(e.kind),
                OsStr::from_bytes(e.name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _op = timed(Op::Readdirplus);
        let r = self.t().readdir(ino.0, offset, true, |e| {
            let attr = match &e.attr {
                Some(a) => file_attr(a),
                None => placeholder_attr(e.ino, e.kind),
            };
            reply.add(
                INodeNo(e.ino),
                e.cookie,
                OsStr::from_bytes(e.name),
                &TTL,
                &attr,
                GENERATION,
            )
        });
        match r {
            Ok(()) => reply.ok(),
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
        let _op = timed(Op::Releasedir);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _op = timed(Op::Fsyncdir);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _op = timed(Op::Statfs);
        let files = self.t().len() as u64;
        // A nominal 1 TiB and 2^32 inodes: the real limit is the machine's RAM.
        let blocks = (1u64 << 40) / u64::from(BLKSIZE);
        let max_files = 1u64 << 32;
        reply.statfs(
            blocks,
            blocks,
            blocks,
            max_files,
            max_files.saturating_sub(files),
            BLKSIZE,
            NAME_MAX as u32,
            BLKSIZE,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _op = timed(Op::Setxattr);
        let r = self.t().setxattr(ino.0, name.as_bytes(), value, flags);
        reply_empty(r, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _op = timed(Op::Getxattr);
        let r = self.t().getxattr(ino.0, name.as_bytes());
        reply_xattr(r, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _op = timed(Op::Listxattr);
        let r = self.t().listxattr(ino.0);
        reply_xattr(r, size, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _op = timed(Op::Removexattr);
        let r = self.t().removexattr(ino.0, name.as_bytes());
        reply_empty(r, reply);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Not called under `default_permissions` (the kernel checks the mode bits).
        let _op = timed(Op::Access);
        let r = self.t().getattr(ino.0).map(|_| ());
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
        let _op = timed(Op::Create);
        let r = self
            .t()
            .mknod(caller(req), parent.0, name.as_bytes(), mode, 0);
        let a = match r {
            Ok(a) => file_attr(&a),
            Err(e) => return reply.error(Errno::from_i32(e)),
        };
        let reply = std::cell::Cell::new(Some(reply));
        self.answer_open(
            a.ino.0,
            |f| match reply.take() {
                Some(r) => {
                    let id = r.open_backing(f);
                    reply.set(Some(r));
                    id
                }
                None => Err(io::Error::other("reply already sent")),
            },
            |id| {
                if let Some(r) = reply.take() {
                    match id {
                        Some(id) => r.created_passthrough(
                            &TTL,
                            &a,
                            GENERATION,
                            FileHandle(FH_PASSTHROUGH),
                            FopenFlags::empty(),
                            id,
                        ),
                        None => r.created(
                            &TTL,
                            &a,
                            GENERATION,
                            FileHandle(0),
                            FopenFlags::FOPEN_KEEP_CACHE,
                        ),
                    }
                }
            },
        );
    }
}
