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
/// with `-`, not `HEAD` nor another of git's special refs ([`SPECIAL_REFS`], any
/// `*_HEAD`, in any letter case); Unicode control characters are refused too.
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

/// git's special refs kept directly in the git directory (`HEAD` and the `*_HEAD`
/// pseudorefs). A branch of such a name is shadowed by the pseudoref when git resolves the
/// name (`git worktree add DIR FETCH_HEAD` checks out the last fetch, detached), so none
/// is accepted, in any letter case (a case-insensitive file system would mix them up).
pub const SPECIAL_REFS: [&str; 10] = [
    "HEAD",
    "FETCH_HEAD",
    "ORIG_HEAD",
    "MERGE_HEAD",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "BISECT_HEAD",
    "AUTO_MERGE",
    "MERGE_AUTOSTASH",
];

/// The special ref `name` collides with: one of [`SPECIAL_REFS`] or any other
/// `[A-Za-z_]*_HEAD` name (git's pseudoref syntax), compared case-insensitively.
fn special_ref(name: &str) -> Option<String> {
    let upper = name.to_ascii_uppercase();
    if SPECIAL_REFS.contains(&upper.as_str()) {
        return Some(upper);
    }
    let pseudo =
        upper.ends_with("_HEAD") && upper.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    pseudo.then_some(upper)
}

/// Asks git itself (`git check-ref-format --branch NAME`) whether `name` is a valid new
/// branch name, after [`check_branch`]'s own rules (which refuse more: special refs, `@`,
/// control characters). `what` (`"task"` or `"branch"`) names the name in the error.
/// Without a runnable git only the own rules apply (git is needed later anyway).
///
/// # Errors
/// [`DeskError::InvalidName`] naming the broken rule or git's refusal.
pub fn check_with_git(what: &'static str, name: &str) -> Result<()> {
    let bad = |reason: String| DeskError::InvalidName {
        what,
        name: name.to_owned(),
        reason,
    };
    branch_rule(name).map_err(bad)?;
    let out = crate::git::command(
        std::path::Path::new("/"),
        ["check-ref-format", "--branch", name],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .status();
    match out {
        Ok(st) if !st.success() => Err(bad(
            "git refuses it as a branch name (`git check-ref-format --branch` failed); use letters, digits, '-', '_' and '.'".into(),
        )),
        _ => Ok(()),
    }
}

/// Longest repo name accepted, bytes (one file name).
pub const MAX_REPO_LEN: usize = 255;

/// Checks a repo name: one directory name under `repos/`: 1-255 bytes, no `/`, no NUL
/// or control characters, not starting with `.` (so neither `.` nor `..`) or `-`.
///
/// # Errors
/// [`DeskError::InvalidName`] naming the broken rule.
pub fn check_repo_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("it is empty".to_owned())
    } else if name.len() > MAX_REPO_LEN {
        Some(format!("longer than {MAX_REPO_LEN} bytes"))
    } else if name.contains('/') {
        Some("a repo name is one directory under repos/, it cannot contain '/'".to_owned())
    } else if name.starts_with('.') {
        Some("it cannot start with '.'".to_owned())
    } else if name.starts_with('-') {
        Some("it cannot start with '-'".to_owned())
    } else {
        name.chars()
            .find(|c| c.is_control())
            .map(|c| format!("it cannot contain {c:?}"))
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(DeskError::InvalidName {
            what: "repo",
            name: name.to_owned(),
            reason: format!(
                "{reason}; give the name of a directory under repos/ (`deskfs desk show AGENT` lists them)"
            ),
        }),
    }
}

fn branch_rule(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name == "@" {
        return Err("'@' alone is not a branch name".into());
    }
    if let Some(special) = special_ref(name) {
        return Err(format!(
            "{special} is one of git's special refs (a branch of that name makes `{name}` ambiguous); pick another name"
        ));
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
    if let Some(c) = name
        .chars()
        .find(|c| c.is_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\'))
    {
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

    /// Finding: git's special refs were accepted as task and branch names (only `HEAD`
    /// was refused); a branch `FETCH_HEAD` is shadowed by the pseudoref of that name.
    #[test]
    fn special_refs_are_refused_in_any_case() {
        for bad in [
            "FETCH_HEAD",
            "fetch_head",
            "Orig_Head",
            "MERGE_HEAD",
            "CHERRY_PICK_HEAD",
            "REVERT_HEAD",
            "REBASE_HEAD",
            "BISECT_HEAD",
            "AUTO_MERGE",
            "MY_OWN_HEAD",
            "head",
            "HEAD",
        ] {
            let e = check_task(bad).expect_err(bad).to_string();
            assert!(e.contains("special refs"), "{bad}: {e}");
            assert!(check_branch(bad).is_err(), "{bad}");
        }
        for ok in ["HEADS", "head-1", "fetch-head", "ahead", "my_head2"] {
            assert!(check_task(ok).is_ok(), "{ok}");
        }
        // Unicode control characters (C1) too, not only ASCII ones.
        assert!(check_task("a\u{85}b").is_err());
        assert!(check_task("a\u{9b}b").is_err());
    }

    /// Finding: repo names from input became paths unchecked.
    #[test]
    fn repo_names() {
        for ok in ["app", "my.repo", "a_b-c", "ünï", &"r".repeat(255)] {
            assert!(check_repo_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/abs",
            ".hidden",
            "-x",
            "a\0b",
            "a\nb",
            "a\u{7f}",
            &"r".repeat(256),
        ] {
            let e = check_repo_name(bad).expect_err(bad);
            assert!(
                matches!(e, DeskError::InvalidName { what: "repo", .. }),
                "{bad:?}: {e}"
            );
            assert!(!e.to_string().contains('\n'), "one line: {e}");
        }
    }

    /// `check_with_git` refuses whatever git refuses (and the special refs git accepts).
    #[test]
    fn check_with_git_follows_git() {
        if std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_err()
        {
            return;
        }
        for s in ["a//b", "a/.b", "x.lock", "-x", "a b", "@", "a@{1}", "x/"] {
            assert!(check_with_git("branch", s).is_err(), "{s}");
        }
        assert!(check_with_git("task", "FETCH_HEAD").is_err());
        assert!(check_with_git("task", "fix-1").is_ok());
        assert!(check_with_git("branch", "fix/issue-5").is_ok());
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
