//! The `fuser::Filesystem` implementation: each kernel request becomes one call on the
//! VFS core, and its result becomes the reply. No policy lives here.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use deskfs_vfs::{Attr, Ctx, Opened, SetAttr, Vfs, VfsError};
use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::backing::Backings;
use crate::convert::{
    file_attr, file_type, is_dot_or_dotdot, negative_attr, placeholder_attr, set_time,
    xattr_answer, XattrAnswer,
};

/// Largest read/write request and readahead window asked of the kernel, bytes.
const MAX_IO: u32 = 1 << 20;

/// Generation number of every inode (deskfs inode numbers are not exported over NFS).
const GENERATION: Generation = Generation(0);

/// Kernel cache lifetimes (see [`crate::MountOptions`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ttls {
    /// Attributes, while other mounts are live.
    pub(crate) attr: Duration,
    /// Entries, while other mounts are live.
    pub(crate) entry: Duration,
    /// Attributes and entries while this mount is alone (the change feed covers the
    /// moment another mount appears).
    pub(crate) alone: Duration,
    /// Negative entries (a name that does not exist) while alone; none while shared.
    pub(crate) negative: Duration,
}

/// A mounted deskfs as fuser sees it: the VFS, the kernel cache lifetimes and the
/// passthrough backing ids in use.
pub(crate) struct DeskFs {
    vfs: Arc<Vfs>,
    ttls: Ttls,
    backings: std::sync::Mutex<Backings>,
}

/// How an open is answered: through the page cache, or through a backing file.
enum OpenAnswer<'a> {
    Cached(FopenFlags),
    Passthrough(&'a fuser::BackingId),
}

impl DeskFs {
    /// Wraps `vfs` with the kernel cache lifetimes `ttls`.
    pub(crate) fn new(vfs: Arc<Vfs>, ttls: Ttls) -> DeskFs {
        DeskFs {
            vfs,
            ttls,
            backings: Default::default(),
        }
    }

    /// Answers the open `o` of `ino` by `send` (called with the backings table locked, so
    /// answers for one inode reach the kernel in the order their modes were settled).
    /// A passthrough open whose backing file the kernel refuses is turned into a cached
    /// one, and passthrough is turned off for the mount: an inode must never see a cached
    /// and a passthrough open at once.
    fn answer_open(
        &self,
        ino: u64,
        o: &Opened,
        open_backing: impl FnOnce(&std::fs::File) -> io::Result<fuser::BackingId>,
        send: impl FnOnce(OpenAnswer<'_>),
    ) {
        let mut backings = self.backings.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(file) = &o.backing {
            let allowed = self.vfs.passthrough_on() || backings.has(ino);
            let attached = if allowed {
                backings.attach(ino, o.fh, || open_backing(file))
            } else {
                Err(io::Error::other("passthrough turned off"))
            };
            match attached {
                Ok(id) => return send(OpenAnswer::Passthrough(id)),
                Err(e) => {
                    if self.vfs.passthrough_on() {
                        tracing::warn!(error = %e, "the kernel refused a passthrough backing file; serving reads and writes through the daemon from now on");
                        self.vfs.set_passthrough(false);
                    }
                    self.vfs.passthrough_refused(ino, o.fh);
                }
            }
        }
        send(OpenAnswer::Cached(fopen_flags(
            o.keep_cache && o.backing.is_none(),
        )))
    }

    /// Starts timing one request of kind `op`, and tells the VFS that the file system is
    /// in use (the uploader yields to bursts of requests).
    fn timed(&self, op: crate::stats::Op) -> crate::stats::Timed {
        self.vfs.note_activity();
        crate::stats::timed(op)
    }

    /// Runs `f` (a request that replies itself) on a thread of its own when it may wait
    /// for the bucket (bucket durability: close, fsync and fsyncdir wait for uploads), so
    /// the FUSE workers keep serving other requests; else right here.
    fn maybe_waiting(&self, f: impl FnOnce() + Send + 'static) {
        if self.vfs.durability() != deskfs_vfs::Durability::Bucket {
            return f();
        }
        let f = std::sync::Arc::new(std::sync::Mutex::new(Some(f)));
        let g = f.clone();
        let spawned = std::thread::Builder::new()
            .name("deskfs-durable".into())
            .spawn(move || {
                if let Some(f) = g.lock().ok().and_then(|mut o| o.take()) {
                    f();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a thread for a durable wait; waiting on the worker");
            if let Some(f) = f.lock().ok().and_then(|mut o| o.take()) {
                f();
            }
        }
    }

    /// How long the kernel may cache attributes now.
    fn attr_ttl(&self) -> Duration {
        if self.vfs.shared() {
            self.ttls.attr
        } else {
            self.ttls.alone
        }
    }

    /// How long the kernel may cache a name → inode mapping now.
    fn entry_ttl(&self) -> Duration {
        if self.vfs.shared() {
            self.ttls.entry
        } else {
            self.ttls.alone
        }
    }

    /// How long the kernel may remember that a name does not exist now: only while
    /// alone. Shared, never: close-to-open across mounts means a name another mount
    /// created and closed is found by the next `open` here at once, and the change feed
    /// that would drop a negative entry arrives up to ~50 ms later.
    fn negative_ttl(&self) -> Duration {
        if self.vfs.shared() {
            Duration::ZERO
        } else {
            self.ttls.negative
        }
    }

    /// The TTL for replies that carry one lifetime for both the entry and its attributes
    /// (`create`, `readdirplus`): the shorter of the two.
    fn single_ttl(&self) -> Duration {
        self.attr_ttl().min(self.entry_ttl())
    }

    /// Replies to an entry-creating request (lookup, mknod, mkdir, symlink, link). A
    /// lookup's `ENOENT` becomes a negative entry (node id 0) the kernel may cache, when
    /// this mount is alone.
    fn reply_entry(&self, op: &'static str, result: Result<Attr, VfsError>, reply: ReplyEntry) {
        match result {
            Ok(attr) => reply.entry_with_ttls(
                &self.attr_ttl(),
                &self.entry_ttl(),
                &file_attr(&attr),
                GENERATION,
            ),
            Err(VfsError::NotFound) if op == "lookup" && !self.negative_ttl().is_zero() => reply
                .entry_with_ttls(
                    &Duration::ZERO,
                    &self.negative_ttl(),
                    &negative_attr(),
                    GENERATION,
                ),
            Err(e) => reply.error(errno(op, &e)),
        }
    }
}

/// The caller identity of a request.
fn ctx(req: &Request) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

/// The errno to reply with for `e`, logged: `EIO` means something below the VFS failed
/// (warn); other errnos are ordinary answers (debug).
fn errno(op: &'static str, e: &VfsError) -> Errno {
    let code = e.errno();
    crate::stats::error(code);
    if code == libc::EIO {
        tracing::warn!(op, error = %e, "request failed with EIO");
    } else {
        tracing::debug!(op, errno = code, error = %e, "request failed");
    }
    Errno::from_i32(code)
}

/// Replies `ok` or the error's errno.
fn reply_empty(op: &'static str, result: Result<(), VfsError>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(op, &e)),
    }
}

/// Replies to `getxattr`/`listxattr` per the FUSE size protocol.
fn reply_xattr(op: &'static str, result: Result<Vec<u8>, VfsError>, size: u32, reply: ReplyXattr) {
    let value = match result {
        Ok(value) => value,
        Err(e) => return reply.error(errno(op, &e)),
    };
    match xattr_answer(&value, size) {
        XattrAnswer::Size(len) => reply.size(len),
        XattrAnswer::Data(data) => reply.data(data),
        XattrAnswer::Error(code) => {
            crate::stats::error(code);
            reply.error(Errno::from_i32(code))
        }
    }
}

/// `FOPEN_KEEP_CACHE` when the VFS says the kernel's cached pages are still valid.
fn fopen_flags(keep_cache: bool) -> FopenFlags {
    if keep_cache {
        FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::empty()
    }
}

impl Filesystem for DeskFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Ask for 1 MiB requests; where the kernel caps lower, take its cap.
        if let Err(nearest) = config.set_max_write(MAX_IO) {
            tracing::debug!(nearest, "max_write capped");
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_readahead(MAX_IO) {
            tracing::debug!(nearest, "max_readahead capped by the kernel");
            let _ = config.set_max_readahead(nearest);
        }
        // fcntl/OFD locks and flock go to the VFS, whose lock table is shared by every
        // mount of the workspace.
        // readdirplus: `ls -l` gets names and attributes in one request per batch.
        // killpriv v2: the VFS clears setuid/setgid/capabilities on write, truncate and
        // chown, so the kernel sets SB_NOSEC and stops asking getxattr("security.capability")
        // before every write (one round trip per write(2) otherwise).
        // parallel dirops: lookups and readdirs of one directory run at once (the kernel
        // otherwise serialises them on the directory's lock; the VFS needs no such lock:
        // every namespace change is one metadata transaction).
        // cache symlinks: readlink answered from the kernel's page cache (a symlink's
        // target never changes; inode numbers are never reused).
        for flag in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        // passthrough: files whose content is in a local staging file are read, written
        // and mmapped by the kernel straight from it (Linux >= 6.9). Backing files live
        // on the cache dir's file system, which must not itself be stacked (depth 1).
        if self.vfs.passthrough_wanted() {
            let granted = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !granted {
                tracing::info!("the kernel does not offer FUSE passthrough; the daemon serves all reads and writes");
            }
            self.vfs.set_passthrough(granted);
        }
        for flag in [InitFlags::FUSE_POSIX_LOCKS, InitFlags::FUSE_FLOCK_LOCKS] {
            if let Err(missing) = config.add_capabilities(flag) {
                tracing::warn!(
                    ?missing,
                    "kernel lacks a lock capability; locks stay local to this mount"
                );
            }
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _op = self.timed(crate::stats::Op::Lookup);
        let result = self.vfs.lookup(&ctx(req), parent.0, name.as_bytes());
        self.reply_entry("lookup", result, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.vfs.forget(ino.0, nlookup);
    }
    // batch_forget: fuser 0.18 keeps `ForgetOne` private, so its default (one `forget`
    // per node) is used.

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _op = self.timed(crate::stats::Op::Getattr);
        match self.vfs.getattr_for(&ctx(req), ino.0) {
            Ok(attr) => reply.attr(&self.attr_ttl(), &file_attr(&attr)),
            Err(e) => reply.error(errno("getattr", &e)),
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
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _op = self.timed(crate::stats::Op::Setattr);
        // ctime is only sent with the writeback cache (not enabled); the others are macOS.
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            fh: fh.map(|fh| fh.0),
        };
        match self.vfs.setattr(&ctx(req), ino.0, &set) {
            Ok(attr) => reply.attr(&self.attr_ttl(), &file_attr(&attr)),
            Err(e) => reply.error(errno("setattr", &e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _op = self.timed(crate::stats::Op::Readlink);
        match self.vfs.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno("readlink", &e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _op = self.timed(crate::stats::Op::Mknod);
        let result = self
            .vfs
            .mknod(&ctx(req), parent.0, name.as_bytes(), mode, umask, rdev);
        self.reply_entry("mknod", result, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _op = self.timed(crate::stats::Op::Mkdir);
        let result = self
            .vfs
            .mkdir(&ctx(req), parent.0, name.as_bytes(), mode, umask);
        self.reply_entry("mkdir", result, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _op = self.timed(crate::stats::Op::Unlink);
        let result = self.vfs.unlink(&ctx(req), parent.0, name.as_bytes());
        reply_empty("unlink", result, reply);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _op = self.timed(crate::stats::Op::Rmdir);
        let result = self.vfs.rmdir(&ctx(req), parent.0, name.as_bytes());
        reply_empty("rmdir", result, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _op = self.timed(crate::stats::Op::Symlink);
        let result = self.vfs.symlink(
            &ctx(req),
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        self.reply_entry("symlink", result, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _op = self.timed(crate::stats::Op::Rename);
        let result = self.vfs.rename(
            &ctx(req),
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        );
        reply_empty("rename", result, reply);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _op = self.timed(crate::stats::Op::Link);
        let result = self
            .vfs
            .link(&ctx(req), ino.0, newparent.0, newname.as_bytes());
        self.reply_entry("link", result, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _op = self.timed(crate::stats::Op::Open);
        match self.vfs.open(&ctx(req), ino.0, flags.0) {
            Ok(o) => {
                let fh = FileHandle(o.fh);
                let reply = std::cell::Cell::new(Some(reply));
                self.answer_open(
                    ino.0,
                    &o,
                    |file| backing_of(&reply, file),
                    |answer| {
                        if let Some(r) = reply.take() {
                            match answer {
                                OpenAnswer::Passthrough(id) => {
                                    r.opened_passthrough(fh, FopenFlags::empty(), id)
                                }
                                OpenAnswer::Cached(flags) => r.opened(fh, flags),
                            }
                        }
                    },
                );
            }
            Err(e) => reply.error(errno("open", &e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _op = self.timed(crate::stats::Op::Read);
        match self.vfs.read(ino.0, fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno("read", &e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _op = self.timed(crate::stats::Op::Write);
        // FUSE_HANDLE_KILLPRIV_V2: the kernel asks us to drop setuid/setgid (and file
        // capabilities) when a writer without CAP_FSETID writes.
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.vfs.kill_privs(&ctx(req), ino.0) {
                return reply.error(errno("write(kill_privs)", &e));
            }
        }
        match self.vfs.write(ino.0, fh.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(errno("write", &e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let op = self.timed(crate::stats::Op::Flush);
        // The writes first, then the locks: close(2) of any descriptor drops the
        // process's POSIX locks on the file, and the next holder (maybe on another host)
        // must read what was written under them.
        let vfs = self.vfs.clone();
        self.maybe_waiting(move || {
            let _op = op;
            let res = vfs.flush(ino.0, fh.0);
            if let Err(e) = vfs.release_locks(ino.0, lock_owner.0) {
                errno("flush(unlock)", &e);
            }
            reply_empty("flush", res, reply);
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _op = self.timed(crate::stats::Op::Fallocate);
        reply_empty(
            "fallocate",
            self.vfs.fallocate(ino.0, fh.0, offset, length, mode),
            reply,
        );
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        let _op = self.timed(crate::stats::Op::Lseek);
        match self.vfs.lseek(ino.0, fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno("lseek", &e)),
        }
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
        let _op = self.timed(crate::stats::Op::Ioctl);
        // No ioctls (TCGETS probes from isatty() land here): "not a typewriter", as ext4.
        crate::stats::error(libc::ENOTTY);
        reply.error(Errno::ENOTTY);
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let _op = self.timed(crate::stats::Op::Getlk);
        match self.vfs.getlk(ino.0, lock_owner.0, start, end, typ) {
            Ok(l) => reply.locked(l.start, l.end, l.typ.raw(), l.pid),
            Err(e) => reply.error(errno("getlk", &e)),
        }
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let _op = self.timed(crate::stats::Op::Setlk);
        if !sleep {
            let r = self
                .vfs
                .setlk(ino.0, fh.0, lock_owner.0, start, end, typ, pid, false);
            return reply_empty("setlk", r, reply);
        }
        // F_SETLKW / blocking flock: tried at once here (an unlock, and most locks, are
        // granted without waiting; a thread costs more than the decision), and only
        // when it would block does it wait, on a thread of its own, not a FUSE worker.
        match self
            .vfs
            .try_setlk_at_once(ino.0, fh.0, lock_owner.0, start, end, typ, pid)
        {
            Err(VfsError::WouldBlock) => {}
            r => return reply_empty("setlkw", r, reply),
        }
        let vfs = self.vfs.clone();
        let spawned = std::thread::Builder::new()
            .name("deskfs-lockwait".into())
            .spawn(move || {
                let r = vfs.setlk(ino.0, fh.0, lock_owner.0, start, end, typ, pid, true);
                reply_empty("setlkw", r, reply);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a lock-wait thread");
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        let op = self.timed(crate::stats::Op::Release);
        // FUSE_RELEASE_FLOCK_UNLOCK: the open file's flock lock goes with it. Only the
        // locks taken through this open file: RELEASE is asynchronous, and the kernel may
        // already have given the same owner id (the `struct file` address) to a new open
        // file whose flock must survive this late release.
        if let Some(owner) = lock_owner {
            if let Err(e) = self.vfs.release_fh_locks(ino.0, owner.0, fh.0) {
                errno("release(unlock)", &e);
            }
        }
        // A release that carries FUSE_RELEASE_FLUSH stands for a flush followed by the
        // release. Errors of a release never reach close(2), but the handle must be freed.
        // The flush may wait for the bucket (bucket durability): off the worker then.
        let vfs = self.vfs.clone();
        let work = move || {
            let _op = op;
            if flush {
                if let Err(e) = vfs.flush(ino.0, fh.0) {
                    errno("release(flush)", &e);
                }
            }
            reply_empty("release", vfs.release(ino.0, fh.0), reply);
        };
        // The kernel dropped this file before it sent RELEASE: its backing id (if it was a
        // passthrough open) may go.
        self.backings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .detach(fh.0);
        if flush {
            self.maybe_waiting(work);
        } else {
            work();
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let op = self.timed(crate::stats::Op::Fsync);
        let vfs = self.vfs.clone();
        self.maybe_waiting(move || {
            let _op = op;
            reply_empty("fsync", vfs.fsync(ino.0, fh.0, datasync), reply);
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _op = self.timed(crate::stats::Op::Opendir);
        match self.vfs.opendir_cached(ino.0) {
            // The kernel caches listings (in the directory's page cache) and keeps them
            // across opens while the directory has not changed.
            Ok((fh, current)) => {
                let mut flags = FopenFlags::FOPEN_CACHE_DIR;
                if current {
                    flags |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                reply.opened(FileHandle(fh), flags)
            }
            Err(e) => reply.error(errno("opendir", &e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _op = self.timed(crate::stats::Op::Readdir);
        let entries = match self.vfs.readdir(ino.0, fh.0, offset, false) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno("readdir", &e)),
        };
        for e in &entries {
            let name = OsStr::from_bytes(&e.name);
            if reply.add(INodeNo(e.ino), e.offset, file_type(e.kind), name) {
                break; // buffer full: the kernel asks again from the last offset sent
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _op = self.timed(crate::stats::Op::Readdirplus);
        let entries = match self.vfs.readdir(ino.0, fh.0, offset, true) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno("readdirplus", &e)),
        };
        let ttl = self.single_ttl();
        let mut sent = 0;
        for e in &entries {
            let attr = match &e.attr {
                Some(a) => file_attr(a),
                None => placeholder_attr(e.ino, e.kind),
            };
            let name = OsStr::from_bytes(&e.name);
            if reply.add(INodeNo(e.ino), e.offset, name, &ttl, &attr, GENERATION) {
                break;
            }
            sent += 1;
        }
        // The kernel counts one lookup per entry it receives (except `.` and `..`); the
        // VFS counted one per entry it returned with attributes. Give back the difference.
        for e in &entries[sent..] {
            if e.attr.is_some() && !is_dot_or_dotdot(&e.name) {
                self.vfs.forget(e.ino, 1);
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _op = self.timed(crate::stats::Op::Releasedir);
        reply_empty("releasedir", self.vfs.releasedir(ino.0, fh.0), reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let op = self.timed(crate::stats::Op::Fsyncdir);
        let vfs = self.vfs.clone();
        self.maybe_waiting(move || {
            let _op = op;
            reply_empty("fsyncdir", vfs.fsyncdir(ino.0), reply);
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _op = self.timed(crate::stats::Op::Statfs);
        match self.vfs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno("statfs", &e)),
        }
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
        let _op = self.timed(crate::stats::Op::Setxattr);
        // `position` is macOS-only (resource forks); Linux always sends 0.
        let result = self.vfs.setxattr(ino.0, name.as_bytes(), value, flags);
        reply_empty("setxattr", result, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _op = self.timed(crate::stats::Op::Getxattr);
        let result = self.vfs.getxattr(ino.0, name.as_bytes());
        reply_xattr("getxattr", result, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _op = self.timed(crate::stats::Op::Listxattr);
        reply_xattr("listxattr", self.vfs.listxattr(ino.0), size, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _op = self.timed(crate::stats::Op::Removexattr);
        let result = self.vfs.removexattr(ino.0, name.as_bytes());
        reply_empty("removexattr", result, reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _op = self.timed(crate::stats::Op::Access);
        let result = self.vfs.access(&ctx(req), ino.0, mask.bits());
        reply_empty("access", result, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _op = self.timed(crate::stats::Op::Create);
        let result = self
            .vfs
            .create(&ctx(req), parent.0, name.as_bytes(), mode, umask, flags);
        match result {
            Ok((attr, o)) => {
                let (ttl, attr, fh) = (self.single_ttl(), file_attr(&attr), FileHandle(o.fh));
                let reply = std::cell::Cell::new(Some(reply));
                self.answer_open(
                    ino_of(&attr),
                    &o,
                    |file| backing_of(&reply, file),
                    |answer| {
                        if let Some(r) = reply.take() {
                            match answer {
                                OpenAnswer::Passthrough(id) => r.created_passthrough(
                                    &ttl,
                                    &attr,
                                    GENERATION,
                                    fh,
                                    FopenFlags::empty(),
                                    id,
                                ),
                                OpenAnswer::Cached(flags) => {
                                    r.created(&ttl, &attr, GENERATION, fh, flags)
                                }
                            }
                        }
                    },
                );
            }
            Err(e) => reply.error(errno("create", &e)),
        }
    }
}

/// The inode number of a reply's attributes.
fn ino_of(attr: &fuser::FileAttr) -> u64 {
    attr.ino.0
}

/// A reply that can register a backing file with the kernel (open and create).
trait BackingReply {
    fn open_backing(&self, file: &std::fs::File) -> io::Result<fuser::BackingId>;
}

impl BackingReply for ReplyOpen {
    fn open_backing(&self, file: &std::fs::File) -> io::Result<fuser::BackingId> {
        ReplyOpen::open_backing(self, file)
    }
}

impl BackingReply for ReplyCreate {
    fn open_backing(&self, file: &std::fs::File) -> io::Result<fuser::BackingId> {
        ReplyCreate::open_backing(self, file)
    }
}

/// Registers `file` as a backing file through the reply held in `reply` (kept there for
/// the answer that follows). Errors: the kernel's (`EPERM`, `EINVAL`, ...).
fn backing_of<R: BackingReply>(
    reply: &std::cell::Cell<Option<R>>,
    file: &std::fs::File,
) -> io::Result<fuser::BackingId> {
    match reply.take() {
        Some(r) => {
            let id = r.open_backing(file);
            reply.set(Some(r));
            id
        }
        None => Err(io::Error::other("reply already sent")),
    }
}
