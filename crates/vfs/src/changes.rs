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
}

impl Batch {
    /// A batch of this mount: it starts with the fencing check of its session.
    pub(crate) fn new(vfs: &Vfs) -> Batch {
        let mut b = Batch {
            ops: Vec::with_capacity(8),
            on_fail: Vec::with_capacity(8),
        };
        let s = vfs.coherence.session();
        if s != 0 {
            b.push(Op::CheckSession(s), OnFail::Retry);
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

impl Facts<'_> {
    /// The inode `parent/name` names, or `None`.
    pub(crate) fn entry(&self, parent: Ino, name: &[u8]) -> Result<Option<Node>> {
        if !self.fresh {
            if let Some(ino) = self.vfs.hints.entry(parent, name) {
                if let Some(hint) = self.vfs.hints.inode(ino) {
                    return Ok(Some(Node { ino, hint }));
                }
            }
        }
        let row = self.vfs.meta.lookup(parent, name)?;
        Ok(row.map(|r| {
            self.vfs.hints.note_row(&r);
            self.vfs.hints.note_entry(parent, name, r.ino);
            node_of(&r)
        }))
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
            match self.meta.apply(&batch.ops) {
                Ok(out) => return finish(&out),
                Err(MetaError::Precondition { step, what }) => {
                    match batch.on_fail.get(step).copied().unwrap_or(OnFail::Retry) {
                        OnFail::Errno(e) => return Err(VfsError::from_errno(e)),
                        OnFail::Retry => {
                            tracing::trace!(step, %what, attempt, "batch refused; planning again");
                        }
                    }
                }
                Err(e) => return Err(self.on_meta_error(e)),
            }
        }
        Err(VfsError::Io(std::io::Error::other(
            "namespace change refused too often by concurrent changes",
        )))
    }
}
