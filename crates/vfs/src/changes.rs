//! Applying a namespace change: plan, apply in one round trip, re-plan when refused.
//!
//! A request handler builds a [`Plan`] from [`Facts`] — first from what this mount
//! remembers ([`crate::hints`]), which usually costs no round trip — and the batch goes
//! to [`deskfs_meta::MetaEngine::apply`]. Each op of the batch says what a failed
//! expectation means ([`OnFail`]): a definite answer (`EEXIST` for a taken name), or "the
//! facts were stale": then the plan is made again from fresh reads. POSIX rules are
//! decided only here, in the VFS (design record: docs/design/0002).

use deskfs_meta::{Ino, InodeRow, MetaError, Op, OpOut};

use crate::hints::InoHint;
use crate::{Result, Vfs, VfsError};

/// How often a change is planned again after refused batches before it gives up with
/// `EIO` (each retry reads fresh facts, so only sustained contention gets here).
const MAX_PLANS: usize = 16;

/// What a failed expectation of an op means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnFail {
    /// The facts the plan used were stale: plan again from fresh reads.
    Retry,
    /// The answer: fail the request with this errno.
    Errno(i32),
}

/// The ops of one change, with what each one's failure means.
pub(crate) struct Batch {
    pub(crate) ops: Vec<Op>,
    on_fail: Vec<OnFail>,
    /// Indexes of `GetInode` ops whose rows are remembered as fresh (see `refresh`).
    refresh: Vec<usize>,
}

impl Batch {
    /// A batch of this mount: it starts with the fencing check of its session.
    pub(crate) fn new(vfs: &Vfs) -> Batch {
        Batch::checking(vfs.coherence.session())
    }

    /// A batch that starts with the fencing check of `session` (none for 0): the one
    /// records it writes are made under (an open counted with a create), which may have
    /// been replaced since the caller read it — then the batch fails as fenced, and no
    /// record outlives the session it names.
    pub(crate) fn checking(session: u64) -> Batch {
        let mut b = Batch {
            ops: Vec::with_capacity(8),
            on_fail: Vec::with_capacity(8),
            refresh: Vec::new(),
        };
        if session != 0 {
            b.push(Op::CheckSession(session), OnFail::Retry);
        }
        b
    }

    /// Adds `op`; returns its index (to find its output).
    pub(crate) fn push(&mut self, op: Op, on_fail: OnFail) -> usize {
        self.ops.push(op);
        self.on_fail.push(on_fail);
        self.ops.len() - 1
    }

    /// Adds an op whose failure means stale facts.
    pub(crate) fn guard(&mut self, op: Op) -> usize {
        self.push(op, OnFail::Retry)
    }

    /// Reads `ino` back at the end of the batch (same round trip) and remembers the row
    /// as fresh: the `getattr` the kernel sends next for it (e.g. for a directory whose
    /// attributes it invalidated because we changed an entry) costs no round trip.
    /// Returns the op's index.
    pub(crate) fn refresh(&mut self, ino: Ino) -> usize {
        let i = self.guard(Op::GetInode(ino));
        self.refresh.push(i);
        i
    }

    /// The inodes whose rows this batch changes or reads back as fresh.
    fn touched(&self) -> impl Iterator<Item = Ino> + '_ {
        let read_back = self.refresh.iter().filter_map(|&i| match self.ops.get(i) {
            Some(Op::GetInode(ino)) => Some(*ino),
            _ => None,
        });
        self.ops.iter().filter_map(changed_inode).chain(read_back)
    }
}

/// Turns a batch's outputs into a change's answer (and does the local follow-up).
pub(crate) type Finish<'a, T> = Box<dyn FnOnce(&[OpOut]) -> Result<T> + 'a>;

/// What a plan decided.
pub(crate) enum Plan<'a, T> {
    /// The answer needs no write (e.g. a rename onto itself).
    Done(T),
    /// Apply the batch, then turn its outputs into the answer.
    Apply(Batch, Finish<'a, T>),
}

/// The facts a plan may use: remembered ones on the first attempt, read fresh after a
/// refused batch.
pub(crate) struct Facts<'v> {
    vfs: &'v Vfs,
    fresh: bool,
}

/// An inode as a plan sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    /// Its number.
    pub(crate) ino: Ino,
    /// Type, permission bits and owner (as last seen).
    pub(crate) hint: InoHint,
}

impl<'v> Facts<'v> {
    /// Facts from what this mount remembers (a plan's first attempt).
    pub(crate) fn hinted(vfs: &'v Vfs) -> Facts<'v> {
        Facts { vfs, fresh: false }
    }
}

impl Facts<'_> {
    /// The inode `parent/name` names, or `None`.
    pub(crate) fn entry(&self, parent: Ino, name: &[u8]) -> Result<Option<Node>> {
        if !self.fresh {
            match self.vfs.hints.entry(parent, name) {
                // Known free (the kernel's lookup just missed): guarded by the batch.
                Some(None) => return Ok(None),
                Some(Some(ino)) => {
                    if let Some(hint) = self.vfs.hints.inode(ino) {
                        return Ok(Some(Node { ino, hint }));
                    }
                }
                None => {}
            }
        }
        let row = self.vfs.meta.lookup(parent, name)?;
        match &row {
            Some(r) => {
                self.vfs.hints.note_row(r);
                self.vfs.hints.note_entry(parent, name, r.ino);
            }
            None => self.vfs.hints.note_absent(parent, name),
        }
        Ok(row.map(|r| node_of(&r)))
    }

    /// The inode `ino`, or `None` when it does not exist.
    pub(crate) fn inode(&self, ino: Ino) -> Result<Option<Node>> {
        if !self.fresh {
            if let Some(hint) = self.vfs.hints.inode(ino) {
                if hint.perm != u32::MAX {
                    return Ok(Some(Node { ino, hint }));
                }
            }
        }
        Ok(self.row(ino)?.map(|r| node_of(&r)))
    }

    /// The current row of `ino` (always read).
    pub(crate) fn row(&self, ino: Ino) -> Result<Option<InodeRow>> {
        let r = self.vfs.meta.get_inode(ino)?;
        if let Some(r) = &r {
            self.vfs.hints.note_row(r);
        }
        Ok(r)
    }

    /// Whether these facts were read fresh (a retry).
    pub(crate) fn fresh(&self) -> bool {
        self.fresh
    }
}

fn node_of(r: &InodeRow) -> Node {
    Node {
        ino: r.ino,
        hint: InoHint {
            kind: r.kind,
            perm: r.perm,
            uid: r.uid,
            gid: r.gid,
        },
    }
}

impl Vfs {
    /// An engine error as the request's answer; a fenced session is replaced first.
    pub(crate) fn on_meta_error(&self, e: MetaError) -> VfsError {
        if let MetaError::Fenced(s) = e {
            self.fenced(s);
        }
        VfsError::Meta(e)
    }

    /// Plans and applies one namespace change (see the module docs).
    pub(crate) fn change<'a, T>(
        &'a self,
        mut plan: impl FnMut(&Facts<'a>) -> Result<Plan<'a, T>>,
    ) -> Result<T> {
        for attempt in 0..MAX_PLANS {
            let facts = Facts {
                vfs: self,
                fresh: attempt > 0,
            };
            let (batch, finish) = match plan(&facts)? {
                Plan::Done(v) => return Ok(v),
                Plan::Apply(b, f) => (b, f),
            };
            let ticket = self.hints.begin_change(batch.touched());
            match self.meta.apply(&batch.ops) {
                Ok(out) => {
                    #[cfg(test)]
                    if let Some(race) = tests::AFTER_APPLY.with(|r| r.borrow_mut().take()) {
                        race();
                    }
                    // Rows this batch changed are not fresh any more; those it read back are.
                    for op in &batch.ops {
                        if let Some(ino) = changed_inode(op) {
                            self.hints.forget_fresh(ino);
                        }
                    }
                    self.forget_xattrs_of(&batch.ops);
                    for &i in &batch.refresh {
                        if let Some(r) = out.get(i).and_then(|o| o.row()) {
                            self.hints.note_read_back(r, ticket);
                        }
                    }
                    return finish(&out);
                }
                Err(MetaError::Precondition { step, what }) => {
                    match batch.on_fail.get(step).copied().unwrap_or(OnFail::Retry) {
                        OnFail::Errno(e) => return Err(VfsError::from_errno(e)),
                        OnFail::Retry => {
                            tracing::trace!(step, %what, attempt, "batch refused; planning again");
                        }
                    }
                }
                Err(e) => {
                    // The batch may have been applied all the same (PostgreSQL: the
                    // connection lost at COMMIT).
                    self.forget_xattrs_of(&batch.ops);
                    return Err(self.on_meta_error(e));
                }
            }
        }
        Err(VfsError::Io(std::io::Error::other(
            "namespace change refused too often by concurrent changes",
        )))
    }
}

impl Vfs {
    /// What this mount knows of the xattrs of the inodes `ops` set or remove goes (after
    /// the batch was applied, or may have been).
    fn forget_xattrs_of(&self, ops: &[Op]) {
        for op in ops {
            if let Op::SetXattr { ino, .. } | Op::RemoveXattr { ino, .. } = op {
                self.hints.forget_xattrs(*ino);
            }
        }
    }
}

/// The inode whose row `op` changes, if any (dentry ops change their directories' rows
/// through the `TouchDir` that accompanies them).
fn changed_inode(op: &Op) -> Option<Ino> {
    match op {
        Op::TouchDir { ino, .. }
        | Op::AddNlink { ino, .. }
        | Op::SetAttrs { ino, .. }
        | Op::CommitContent { ino, .. }
        | Op::SetXattr { ino, .. }
        | Op::RemoveXattr { ino, .. } => Some(*ino),
        Op::InsertInode(r) => Some(r.ino),
        Op::Purge(ino) | Op::DeleteInode(ino) => Some(*ino),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;

    thread_local! {
        /// Run once by the next change applied on this thread, between its commit and
        /// what it notes of its read-back rows: changes landing there.
        pub(crate) static AFTER_APPLY: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }
}
