//! Name rules: agent names (directory names under the desk root), task names (a git branch
//! name that is also a single path component) and branch names (`git check-ref-format
//! --branch` rules).

use crate::error::{DeskError, Result};

/// Longest task name accepted, in bytes (well under the 255-byte file name limit, since a
/// task name also becomes part of lock and record file names).
pub const MAX_TASK_LEN: usize = 128;

/// Checks an agent name: 1–64 of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
///
/// # Errors
/// [`DeskError::InvalidAgent`].
pub fn check_agent(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(DeskError::InvalidAgent {
            name: name.to_owned(),
        })
    }
}

/// Checks a task name: a valid git branch name (see [`check_branch`]) without `/`, at most
/// [`MAX_TASK_LEN`] bytes, so it is also one path component under `tasks/`.
///
/// # Errors
/// [`DeskError::InvalidName`] naming the broken rule.
pub fn check_task(name: &str) -> Result<()> {
    let bad = |reason: &str| DeskError::InvalidName {
        what: "task",
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if name.contains('/') {
        return Err(bad(
            "a task name is one path component, it cannot contain '/'",
        ));
    }
    if name.len() > MAX_TASK_LEN {
        return Err(bad(&format!("longer than {MAX_TASK_LEN} bytes")));
    }
    if name == crate::journal::DESK_JOURNAL {
        return Err(bad(
            "the name of the journal of execs outside tasks (`.desk/journal/_desk.jsonl`)",
        ));
    }
    branch_rule(name).map_err(|r| bad(&r))
}

/// Checks a branch name with the rules of `git check-ref-format --branch`: no empty
/// component, no component starting with `.` or ending with `.lock`, no `..`, `@{`, control
/// characters, space, `~ ^ : ? * [ \`, not ending with `.` or `/`, not `@`, not starting
/// with `-`, not `HEAD`.
///
/// # Errors
/// [`DeskError::InvalidName`] naming the broken rule.
pub fn check_branch(name: &str) -> Result<()> {
    branch_rule(name).map_err(|reason| DeskError::InvalidName {
        what: "branch",
        name: name.to_owned(),
        reason,
    })
}

/// The longest part (between `/`) of a branch name, bytes: a file name (255) less
/// `.lock`.
const BRANCH_PART_MAX: usize = 250;

fn branch_rule(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name == "@" {
        return Err("'@' alone is not a branch name".into());
    }
    if name == "HEAD" {
        return Err("HEAD is not a branch name".into());
    }
    if name.starts_with('-') {
        return Err("it cannot start with '-'".into());
    }
    if name.ends_with('/') {
        return Err("it cannot end with '/'".into());
    }
    if name.ends_with('.') {
        return Err("it cannot end with '.'".into());
    }
    if name.contains("..") {
        return Err("it cannot contain '..'".into());
    }
    if name.contains("@{") {
        return Err("it cannot contain '@{'".into());
    }
    if let Some(c) = name.chars().find(|c| {
        c.is_ascii_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\')
    }) {
        return Err(format!("it cannot contain {c:?}"));
    }
    for comp in name.split('/') {
        if comp.is_empty() {
            return Err("it cannot contain '//'".into());
        }
        if comp.starts_with('.') {
            return Err("no part of it can start with '.'".into());
        }
        if comp.ends_with(".lock") {
            return Err("no part of it can end with '.lock'".into());
        }
        // git keeps a branch as a file of that name, and `NAME.lock` while it changes it.
        if comp.len() > BRANCH_PART_MAX {
            return Err(format!(
                "a part of it is {} bytes; at most {BRANCH_PART_MAX} (git stores it as a file name)",
                comp.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_parts_fit_a_file_name() {
        assert!(check_branch(&"n".repeat(250)).is_ok());
        assert!(check_branch(&format!("a/{}", "n".repeat(250))).is_ok());
        for bad in ["n".repeat(251), format!("{}/a", "n".repeat(256))] {
            let e = check_branch(&bad).expect_err("a part longer than a file name");
            assert!(e.to_string().contains("at most 250"), "{e}");
        }
        assert!(check_task(&"n".repeat(251)).is_err());
    }

    #[test]
    fn agents() {
        for ok in ["a", "agent-1", "A.b_c", &"x".repeat(64)] {
            assert!(check_agent(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".a", "-a", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(check_agent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tasks() {
        for ok in ["fix-1", "feature_x", "a.b", "v1@2", "ünï"] {
            assert!(check_task(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "a..b", "x/y", "-x", ".x", "x.", "x.lock", "a b", "a~1", "a^", "a:b", "a?", "a*",
            "a[", "a\\b", "@", "HEAD", "a@{1", "a\tb",
        ] {
            assert!(check_task(bad).is_err(), "{bad}");
        }
    }

    /// The rules agree with git itself on a set of samples (skipped when git is missing).
    /// `@` is left out: `git check-ref-format --branch @` expands it to the current branch,
    /// while as a new branch name it only confuses, so `check_branch` refuses it.
    #[test]
    fn branches_agree_with_git() {
        let samples = [
            "ok",
            "a/b",
            "a//b",
            "a/.b",
            "a/b.lock",
            "a..b",
            "-x",
            "x.",
            "x/",
            "a@{b",
            "a b",
            "HEAD",
            "fix/issue-5",
            "a.b/c_d",
            "x~",
            "lock.lock",
        ];
        for s in samples {
            let out = std::process::Command::new("git")
                .args(["check-ref-format", "--branch", s])
                .output();
            let Ok(out) = out else { return };
            assert_eq!(
                out.status.success(),
                check_branch(s).is_ok(),
                "git and check_branch disagree on {s:?}"
            );
        }
    }
}
