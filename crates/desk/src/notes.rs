//! `notes/`: the agent's notes to its next session. deskfs adds one note per finished task;
//! `resume` shows the newest ones.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{IoContext, Result};
use crate::fsutil::{atomic_write, mtime_secs, now_secs, utc_compact};
use crate::layout::Desk;

/// A note as `resume` lists it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct NoteInfo {
    /// Path relative to the desk (`notes/...`).
    pub path: PathBuf,
    /// Modification time, seconds since the epoch.
    pub modified: u64,
    /// First non-empty line, without leading `#`, at most 120 characters.
    pub first_line: String,
}

/// The `n` most recently modified regular files under `notes/` (recursively; hidden files
/// and temp files skipped), newest first.
pub fn newest(desk: &Desk, n: usize) -> Vec<NoteInfo> {
    let mut all = Vec::new();
    let mut stack = vec![desk.notes_dir()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else if md.is_file() {
                all.push((mtime_secs(&md), e.path()));
            }
        }
    }
    all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
    all.into_iter()
        .take(n)
        .map(|(modified, p)| NoteInfo {
            first_line: first_line(&p),
            path: p
                .strip_prefix(desk.dir())
                .map(Path::to_path_buf)
                .unwrap_or(p),
            modified,
        })
        .collect()
}

fn first_line(p: &Path) -> String {
    let Ok(bytes) = fs::read(p) else {
        return String::new();
    };
    let head = &bytes[..bytes.len().min(4096)];
    let text = String::from_utf8_lossy(head);
    let line = text
        .lines()
        .map(|l| l.trim().trim_start_matches('#').trim())
        .find(|l| !l.is_empty())
        .unwrap_or("");
    line.chars().take(120).collect()
}

/// Writes a new note `notes/<UTC time>-<slug>.md` (atomic; a numeric suffix keeps names
/// unique) and returns its path.
///
/// # Errors
/// I/O errors.
pub fn write(desk: &Desk, slug: &str, content: &str) -> Result<PathBuf> {
    let dir = desk.notes_dir();
    fs::create_dir_all(&dir).ctx("create", &dir)?;
    let stamp = utc_compact(now_secs());
    let mut path = dir.join(format!("{stamp}-{slug}.md"));
    let mut i = 2;
    while path.exists() {
        path = dir.join(format!("{stamp}-{slug}-{i}.md"));
        i += 1;
    }
    atomic_write(&path, content.as_bytes())?;
    Ok(path)
}
