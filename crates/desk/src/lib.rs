//! Desks: a durable workspace bound to one agent identity (see DESIGN.md, "Desks").
//!
//! A desk is a directory `<root>/<AGENT>/` on a deskfs mount (any directory works) with
//! long-lived clones in `repos/`, one git worktree per task in `tasks/`, notes to the next
//! session in `notes/`, the desk's tools and package caches, and a manual (`AGENTS.md`)
//! whose machine part lists the tools and build/test commands the desk relies on. See
//! [`layout`] for the tree, [`worktree`] for how task worktrees stay valid wherever the desk
//! is mounted, [`task`] for starting and finishing tasks, [`resume`], [`tidy`] and
//! [`manual`] for the other commands.
//!
//! Errors are [`DeskError`]s: one line each, naming the problem and the fix.

pub mod error;
pub mod fsutil;
pub mod git;
pub mod include;
pub mod journal;
pub mod layout;
pub mod lock;
pub mod manual;
pub mod names;
pub mod notes;
pub mod record;
pub mod repos;
pub mod resume;
pub mod scan;
pub mod shell;
pub mod task;
pub mod tidy;
pub mod worktree;

pub use error::{DeskError, Result};
pub use layout::{list, Desk, DeskEntry};
