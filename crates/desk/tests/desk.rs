//! In-process tests of the desk layer on plain temp dirs, against the real git.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier, Once};
use std::time::{Duration, SystemTime};

use deskfs_desk::tidy::{tidy, TidyOptions};
use deskfs_desk::{manual, resume, task, Desk, DeskError};

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (k, v) in [
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_AUTHOR_NAME", "desk test"),
            ("GIT_AUTHOR_EMAIL", "t@deskfs.invalid"),
            ("GIT_COMMITTER_NAME", "desk test"),
            ("GIT_COMMITTER_EMAIL", "t@deskfs.invalid"),
        ] {
            std::env::set_var(k, v);
        }
    });
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

/// A source repo with two commits, a .gitignore, a .worktreeinclude, an ignored .env and
/// config/local.toml, an ignored build dir and an untracked, non-ignored file.
fn source_repo(base: &Path) -> PathBuf {
    let src = base.join("src");
    fs::create_dir_all(&src).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    fs::write(src.join("README"), "hello\n").unwrap();
    fs::write(
        src.join(".gitignore"),
        ".env\nconfig/local.toml\nbuild/\n*.secret\n",
    )
    .unwrap();
    fs::write(
        src.join(".worktreeinclude"),
        "# copied into task worktrees\n.env\nconfig/*.toml\n*.secret\n",
    )
    .unwrap();
    git(&src, &["add", "."]);
    git(&src, &["commit", "-q", "-m", "first"]);
    fs::write(src.join("lib.txt"), "lib\n").unwrap();
    git(&src, &["add", "."]);
    git(&src, &["commit", "-q", "-m", "second"]);
    src
}

/// A desk with `repos/app` cloned from [`source_repo`] and the ignored files in its checkout.
/// A clone of the source repo at `to`, outside any desk.
fn clone_source(base: &Path, to: &Path) {
    git(
        base,
        &[
            "clone",
            "-q",
            base.join("src").to_str().unwrap(),
            to.to_str().unwrap(),
        ],
    );
}

fn desk_with_repo(base: &Path) -> (PathBuf, Desk) {
    setup();
    let src = source_repo(base);
    let root = base.join("desks");
    let desk = Desk::create(&root, "agent").unwrap();
    let app = desk.repo_dir("app");
    git(
        base,
        &["clone", "-q", src.to_str().unwrap(), app.to_str().unwrap()],
    );
    fs::write(app.join(".env"), "TOKEN=1\n").unwrap();
    fs::create_dir_all(app.join("config")).unwrap();
    fs::write(app.join("config/local.toml"), "x = 1\n").unwrap();
    fs::write(app.join("k.secret"), "s\n").unwrap();
    fs::create_dir_all(app.join("build")).unwrap();
    fs::write(app.join("build/out.bin"), "bin\n").unwrap();
    fs::write(app.join("notes.txt"), "untracked, not ignored\n").unwrap();
    (root, desk)
}

#[test]
fn task_lifecycle_resume_finish_tidy() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());

    let s1 = task::start(&desk, "t1", "app", None).unwrap();
    assert!(s1.created_branch);
    let mut copied: Vec<String> = s1.copied.iter().map(|p| p.display().to_string()).collect();
    copied.sort();
    assert_eq!(copied, [".env", "config/local.toml", "k.secret"]);
    let t1 = desk.task_dir("t1");
    assert_eq!(fs::read_to_string(t1.join(".env")).unwrap(), "TOKEN=1\n");
    assert!(
        !t1.join("notes.txt").exists(),
        "untracked non-ignored files are not copied"
    );
    assert!(
        !t1.join("build").exists(),
        "ignored files not named are not copied"
    );
    let dotgit = fs::read_to_string(t1.join(".git")).unwrap();
    assert_eq!(
        dotgit.trim_end(),
        "gitdir: ../../repos/app/.git/worktrees/t1"
    );

    let s2 = task::start(&desk, "t2", "app", Some("feature/two")).unwrap();
    assert_eq!(s2.branch, "feature/two");

    // Work: one commit in t1, an uncommitted edit and an untracked file in t2.
    fs::write(t1.join("lib.txt"), "lib v2\n").unwrap();
    git(&t1, &["commit", "-q", "-am", "t1 work"]);
    let t2 = desk.task_dir("t2");
    fs::write(t2.join("README"), "changed\n").unwrap();
    fs::write(t2.join("new.txt"), "new\n").unwrap();

    let r = resume::resume(&desk).unwrap();
    assert_eq!(r.tasks.len(), 2);
    let st1 = r.tasks[0].state.clone().unwrap();
    assert_eq!(
        (st1.branch.as_deref(), st1.ahead, st1.behind),
        (Some("t1"), Some(1), Some(0))
    );
    assert_eq!(st1.base.as_deref(), Some("origin/main"));
    assert_eq!(st1.dirty_count(), 0);
    let st2 = r.tasks[1].state.clone().unwrap();
    assert_eq!((st2.uncommitted, st2.untracked), (1, 1));
    let kinds: Vec<&str> = r.warnings.iter().map(|w| w.kind).collect();
    assert_eq!(kinds, ["dirty-task"], "{:?}", r.warnings);
    assert!(r.manual.contains("# Desk manual: agent"));
    assert!(!r.manual.contains("deskfs:manual:begin"));
    assert!(r
        .to_text()
        .contains("t1  repo app  branch t1  1 ahead, 0 behind origin/main  clean"));

    // Finishing t2 with work in it is refused, nothing changes.
    let e = task::finish(&desk, "t2", false, None).unwrap_err();
    assert!(matches!(e, DeskError::Uncommitted { count: 2, .. }), "{e}");
    assert!(t2.join("new.txt").exists());

    // t1: committed work (ignored .env etc. do not count) -> removed, note written.
    let f1 = task::finish(&desk, "t1", false, Some("done with t1")).unwrap();
    assert_eq!(f1.commits, 1);
    assert!(!t1.exists());
    let note = fs::read_to_string(&f1.note).unwrap();
    assert!(
        note.starts_with("# Task t1 finished: 1 commit(s) on branch t1 (repo app)"),
        "{note}"
    );
    assert!(
        note.contains("t1 work") && note.contains("done with t1"),
        "{note}"
    );
    assert!(
        git(&desk.repo_dir("app"), &["branch", "--list", "t1"]).contains("t1"),
        "branch kept"
    );

    let f2 = task::finish(&desk, "t2", true, None).unwrap();
    assert_eq!((f2.commits, f2.discarded), (0, 2));
    assert!(!t2.exists());
    let wl = git(&desk.repo_dir("app"), &["worktree", "list", "--porcelain"]);
    assert_eq!(
        wl.matches("worktree ").count(),
        1,
        "only the main worktree is left: {wl}"
    );

    let r = resume::resume(&desk).unwrap();
    assert!(
        r.tasks.is_empty() && r.warnings.is_empty(),
        "{:?}",
        r.warnings
    );
    assert_eq!(r.notes.len(), 2);
    assert!(r.notes[0].first_line.starts_with("Task t"), "{:?}", r.notes);

    // Tidy: feature/two (no commits) is merged into origin/main -> deleted; t1 is not.
    let items = tidy(&desk, &TidyOptions::default()).unwrap();
    let what: Vec<(&str, &str)> = items.iter().map(|i| (i.kind, i.what.as_str())).collect();
    assert_eq!(what, [("merged-branch", "app:feature/two")], "{items:?}");
    assert!(items[0].removed);
    assert!(git(&desk.repo_dir("app"), &["branch", "--list", "feature/two"]).is_empty());
    assert!(tidy(&desk, &TidyOptions::default()).unwrap().is_empty());
}

/// The note `task finish` writes says what `--discard` dropped, and only when it dropped
/// something.
#[test]
fn finish_notes_say_what_was_discarded() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    task::start(&desk, "clean", "app", None).unwrap();
    let f = task::finish(&desk, "clean", true, None).unwrap();
    let note = fs::read_to_string(&f.note).unwrap();
    assert_eq!(f.discarded, 0);
    assert!(!note.contains("discarded"), "{note}");
    task::start(&desk, "dirty", "app", None).unwrap();
    fs::write(desk.task_dir("dirty").join("scratch.txt"), "x").unwrap();
    let f = task::finish(&desk, "dirty", true, None).unwrap();
    let note = fs::read_to_string(&f.note).unwrap();
    assert_eq!(f.discarded, 1);
    assert!(
        note.contains("- discarded 1 uncommitted change(s): scratch.txt"),
        "{note}"
    );
}

/// `desk tidy` deletes the merged branch of a finished task, but never the repo's default
/// branch, nor a branch checked out in a worktree.
#[test]
fn tidy_keeps_the_default_branch_and_checked_out_ones() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    let app = desk.repo_dir("app");
    // A task that worked on `main` itself (the checkout lets go of it first).
    git(&app, &["checkout", "-q", "--detach"]);
    task::start(&desk, "onmain", "app", Some("main")).unwrap();
    task::finish(&desk, "onmain", false, None).unwrap();
    // A task whose merged branch is then checked out in the repo's own checkout.
    task::start(&desk, "co", "app", Some("feat")).unwrap();
    task::finish(&desk, "co", false, None).unwrap();
    git(&app, &["checkout", "-q", "feat"]);
    let dry = TidyOptions {
        dry_run: true,
        ..TidyOptions::default()
    };
    let items = tidy(&desk, &dry).unwrap();
    assert!(items.iter().all(|i| i.kind != "merged-branch"), "{items:?}");
    // Once `feat` is no longer checked out, it goes; `main` stays.
    git(&app, &["checkout", "-q", "--detach"]);
    let items = tidy(&desk, &TidyOptions::default()).unwrap();
    let what: Vec<(&str, &str)> = items.iter().map(|i| (i.kind, i.what.as_str())).collect();
    assert_eq!(what, [("merged-branch", "app:feat")], "{items:?}");
    assert!(git(&app, &["branch", "--list", "feat"]).is_empty());
    assert!(!git(&app, &["branch", "--list", "main"]).is_empty());
}

#[test]
fn worktree_links_survive_a_move() {
    let t = tempfile::tempdir().unwrap();
    let (root, desk) = desk_with_repo(t.path());
    task::start(&desk, "mv", "app", None).unwrap();
    drop(desk);
    // The desk appears at another absolute path (like a second mount point).
    let moved = t.path().join("elsewhere");
    fs::rename(&root, &moved).unwrap();
    let d = moved.join("agent");
    let wt = d.join("tasks/mv");
    let repo = d.join("repos/app");
    assert!(git(&wt, &["status", "--porcelain"]).is_empty());
    fs::write(wt.join("x.txt"), "x\n").unwrap();
    git(&wt, &["add", "x.txt"]);
    git(&wt, &["commit", "-q", "-m", "moved commit"]);
    // prune from the repo and from the worktree must keep the registration (locked).
    git(&repo, &["worktree", "prune"]);
    git(&wt, &["worktree", "prune"]);
    assert!(repo.join(".git/worktrees/mv").is_dir());
    assert!(git(&repo, &["worktree", "list"]).contains("locked"));
    // The first deskfs command at the new place repairs the back link.
    let desk = Desk::open(&moved, "agent").unwrap();
    assert!(task::repair_links(&desk).is_empty());
    let back = fs::read_to_string(repo.join(".git/worktrees/mv/gitdir")).unwrap();
    assert_eq!(
        back.trim_end(),
        desk.task_dir("mv").join(".git").display().to_string()
    );
    let list = git(&repo, &["worktree", "list"]);
    assert!(
        list.contains(&desk.task_dir("mv").display().to_string()),
        "{list}"
    );
    let r = resume::resume(&desk).unwrap();
    assert_eq!(r.tasks[0].state.as_ref().unwrap().ahead, Some(1));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    task::finish(&desk, "mv", false, None).unwrap();
    assert!(!repo.join(".git/worktrees/mv").exists());
}

#[test]
fn concurrent_starts_one_wins() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    let n = 6;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let desk = desk.clone();
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                task::start(&desk, "same", "app", None)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1, "{results:?}");
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(e, DeskError::TaskBusy { .. } | DeskError::TaskExists { .. }),
            "{e}"
        );
    }
    let r = resume::resume(&desk).unwrap();
    assert_eq!(r.tasks.len(), 1);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn bad_input_leaves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    for bad in ["a..b", "x/y", "-x", ".hidden", "a b", "x.lock", "HEAD", ""] {
        let e = task::start(&desk, bad, "app", None).unwrap_err();
        assert!(matches!(e, DeskError::InvalidName { .. }), "{bad}: {e}");
    }
    let e = task::start(&desk, "ok", "app", Some("bad..branch")).unwrap_err();
    assert!(
        matches!(e, DeskError::InvalidName { what: "branch", .. }),
        "{e}"
    );
    let e = task::start(&desk, "ok", "nope", None).unwrap_err();
    assert!(e.to_string().contains("known: app"), "{e}");
    let e = task::start(&desk, "ok", "../app", None).unwrap_err();
    assert!(
        matches!(e, DeskError::InvalidName { what: "repo", .. }),
        "{e}"
    );
    fs::create_dir_all(desk.repo_dir("plain")).unwrap();
    let e = task::start(&desk, "ok", "plain", None).unwrap_err();
    assert!(matches!(e, DeskError::NotARepo { .. }), "{e}");
    // A branch already checked out in another worktree: git refuses, all rolled back.
    task::start(&desk, "first", "app", None).unwrap();
    let e = task::start(&desk, "second", "app", Some("first")).unwrap_err();
    assert!(matches!(e, DeskError::Git { .. }), "{e}");
    let e = task::start(&desk, "first", "app", None).unwrap_err();
    assert!(matches!(e, DeskError::TaskExists { .. }), "{e}");
    let e = task::finish(&desk, "nope", false, None).unwrap_err();
    assert!(e.to_string().contains("known: first"), "{e}");
    assert_eq!(desk.task_names(), ["first"]);
    let records: Vec<_> = fs::read_dir(desk.records_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(records, ["first.toml"]);
    let locks: Vec<_> = fs::read_dir(desk.locks_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        locks.is_empty(),
        "lock files are removed on release: {locks:?}"
    );
    assert!(git(&desk.repo_dir("app"), &["branch", "--list", "second"]).is_empty());
    // A branch only the remote has: tracked.
    let src = t.path().join("src");
    git(&src, &["branch", "topic"]);
    git(&desk.repo_dir("app"), &["fetch", "-q", "origin"]);
    let s = task::start(&desk, "on-topic", "app", Some("topic")).unwrap();
    assert!(s.created_branch);
    let st = task::info(&desk, "on-topic").state.unwrap();
    assert_eq!(st.base.as_deref(), Some("origin/topic"), "{st:?}");
    // An existing branch is checked out, not recreated.
    git(&desk.repo_dir("app"), &["branch", "old-branch"]);
    let s = task::start(&desk, "reuse", "app", Some("old-branch")).unwrap();
    assert!(!s.created_branch);
}

#[test]
fn manual_record_and_drift() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let desk = Desk::create(&t.path().join("desks"), "m").unwrap();
    let tool = desk.tools_bin().join("mytool");
    fs::write(&tool, "#!/bin/sh\necho mytool 1.0\n").unwrap();
    fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // The human part, edited by the agent, must survive byte for byte.
    let text = fs::read_to_string(desk.manual_path()).unwrap();
    let edited = text.replace("- (none yet)", "- use  `make -j2`\t(trailing spaces)   \r");
    fs::write(desk.manual_path(), &edited).unwrap();
    let human_before = manual::Manual::load(&desk.manual_path()).unwrap().human();

    let e = manual::record_tool(&desk, "missing-tool", None).unwrap_err();
    assert!(matches!(e, DeskError::VersionCmd { .. }), "{e}");
    let entry = manual::record_tool(&desk, "mytool", None).unwrap();
    assert_eq!(
        (entry.version.as_str(), entry.version_cmd.as_str()),
        ("mytool 1.0", "mytool --version")
    );
    manual::record_tool(&desk, "sh", Some("echo sh-is-here")).unwrap();
    // `manual repo` wants the repo to exist under repos/.
    let e = manual::record_repo(&desk, "app", Some("./run-tests.sh"), Some("make")).unwrap_err();
    assert!(matches!(e, DeskError::UnknownRepo { .. }), "{e}");
    fs::create_dir_all(desk.repo_dir("app")).unwrap();
    manual::record_repo(&desk, "app", Some("./run-tests.sh"), Some("make")).unwrap();
    fs::remove_dir(desk.repo_dir("app")).unwrap();
    let m = manual::Manual::load(&desk.manual_path()).unwrap();
    assert_eq!(m.human(), human_before);
    assert_eq!(m.machine.tools.len(), 2);
    assert!(fs::read_to_string(desk.claude_path())
        .unwrap()
        .contains("mytool 1.0"));

    // The repo does not exist yet: drift.
    let d = manual::check(&desk).unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].subject, "repo app");
    fs::create_dir_all(desk.repo_dir("app")).unwrap();
    let d = manual::check(&desk).unwrap();
    assert!(d[0].problem.contains("./run-tests.sh"), "{d:?}");
    let script = desk.repo_dir("app").join("run-tests.sh");
    fs::write(&script, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert!(manual::check(&desk).unwrap().is_empty());

    // New version, then the tool removed.
    fs::write(&tool, "#!/bin/sh\necho mytool 2.0\n").unwrap();
    let d = manual::check(&desk).unwrap();
    assert!(d.len() == 1 && d[0].problem.contains("mytool 2.0"), "{d:?}");
    fs::remove_file(&tool).unwrap();
    let d = manual::check(&desk).unwrap();
    assert!(
        d.len() == 1 && d[0].subject == "tool mytool" && d[0].problem.contains("failed"),
        "{d:?}"
    );
    let r = resume::resume(&desk).unwrap();
    assert_eq!(r.warnings.len(), 1);
    assert_eq!(r.warnings[0].kind, "manual-drift");
    // CLAUDE.md replaced by a regular file is drift too.
    fs::remove_file(desk.claude_path()).unwrap();
    fs::write(desk.claude_path(), "x").unwrap();
    assert!(manual::check(&desk)
        .unwrap()
        .iter()
        .any(|d| d.subject == "CLAUDE.md"));
}

fn age(p: &Path, secs: u64) {
    let f = fs::File::options().write(true).open(p).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs))
        .unwrap();
}

#[test]
fn tidy_finds_and_removes_leftovers() {
    let t = tempfile::tempdir().unwrap();
    let (root, desk) = desk_with_repo(t.path());
    task::start(&desk, "keep", "app", None).unwrap();
    task::start(&desk, "gone", "app", None).unwrap();
    // Worktree deleted by hand: stale registration + record without dir.
    fs::remove_dir_all(desk.task_dir("gone")).unwrap();
    // A half-made task dir, a leftover lock, scratch files, an old and a new tmp file,
    // an oversized cache, a leftover of an interrupted create.
    fs::create_dir_all(desk.task_dir("half/sub")).unwrap();
    fs::write(desk.task_dir("half/sub/f"), vec![1u8; 100]).unwrap();
    fs::write(desk.locks_dir().join("task-dead.lock"), "pid 999999\n").unwrap();
    fs::write(desk.dir().join("notes/draft.md~"), "x").unwrap();
    fs::write(desk.dir().join("scratch.tmp"), "xx").unwrap();
    fs::write(desk.dir().join("notes/keep.md"), "keep").unwrap();
    fs::write(
        desk.task_dir("keep").join("work.tmp"),
        "in a worktree: not touched",
    )
    .unwrap();
    fs::create_dir_all(desk.tmp_dir().join("d")).unwrap();
    fs::write(desk.tmp_dir().join("d/old"), vec![0u8; 10]).unwrap();
    age(&desk.tmp_dir().join("d/old"), 2 * 86_400);
    fs::write(desk.tmp_dir().join("new"), "n").unwrap();
    fs::write(desk.cache_root().join("npm/blob"), vec![0u8; 5000]).unwrap();
    fs::create_dir_all(root.join(".agent.creating.1")).unwrap();
    let index_lock = desk.repo_dir("app").join(".git/worktrees/keep/index.lock");
    fs::write(&index_lock, "").unwrap();
    age(&index_lock, 2 * 3600);

    let r = resume::resume(&desk).unwrap();
    let mut kinds: Vec<&str> = r.warnings.iter().map(|w| w.kind).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "broken-task",
            "dirty-task",
            "git-lock",
            "leftover-lock",
            "missing-task",
            "stale-registration"
        ],
        "{:?}",
        r.warnings
    );

    let opts = TidyOptions {
        dry_run: true,
        cache_cap: 4096,
        ..TidyOptions::default()
    };
    let dry = tidy(&desk, &opts).unwrap();
    let mut found: Vec<(&str, String)> = dry.iter().map(|i| (i.kind, i.what.clone())).collect();
    found.sort();
    let expect: Vec<(&str, String)> = vec![
        ("broken-task", "tasks/half".into()),
        ("cache-over-cap", ".cache/npm".into()),
        (
            "git-lock",
            "repos/app/.git/worktrees/keep/index.lock".into(),
        ),
        ("leftover-lock", ".desk/locks/task-dead.lock".into()),
        ("old-tmp", "tmp/d/old".into()),
        (
            "scratch",
            root.join(".agent.creating.1").display().to_string(),
        ),
        ("scratch", "notes/draft.md~".into()),
        ("scratch", "scratch.tmp".into()),
        ("stale-registration", "repos/app/.git/worktrees/gone".into()),
    ];
    assert_eq!(found, expect, "{dry:?}");
    assert!(dry.iter().all(|i| !i.removed));
    assert_eq!(
        dry.iter().find(|i| i.kind == "broken-task").unwrap().bytes,
        100
    );
    assert_eq!(
        dry.iter()
            .find(|i| i.kind == "cache-over-cap")
            .unwrap()
            .bytes,
        5000
    );
    assert!(desk.task_dir("half").exists(), "dry run removes nothing");

    let done = tidy(
        &desk,
        &TidyOptions {
            dry_run: false,
            ..opts.clone()
        },
    )
    .unwrap();
    assert_eq!(done.len(), expect.len());
    assert!(
        done.iter().all(|i| i.removed && i.error.is_none()),
        "{done:?}"
    );
    assert!(!desk.task_dir("half").exists());
    assert!(!desk.tmp_dir().join("d").exists() && desk.tmp_dir().join("new").exists());
    assert!(desk.dir().join("notes/keep.md").exists());
    assert!(desk.task_dir("keep").join("work.tmp").exists());
    assert!(desk.cache_root().join("npm").is_dir());
    assert!(!desk.repo_dir("app").join(".git/worktrees/gone").exists());
    assert!(desk.repo_dir("app").join(".git/worktrees/keep").exists());
    assert!(tidy(&desk, &opts).unwrap().is_empty());
    // missing-task: the record of the hand-deleted task is still reported by resume.
    let kinds: Vec<&str> = resume::resume(&desk)
        .unwrap()
        .warnings
        .iter()
        .map(|w| w.kind)
        .collect();
    assert_eq!(kinds, ["dirty-task", "missing-task"]);
}

/// An agent can change its desk from inside `exec`; its `desk.toml` is read only as a
/// small regular file: a symlink (to a huge file, or `/dev/zero`), a FIFO or an
/// oversized file make the desk "not a desk" at once, never a hang or a read without end.
#[test]
fn desk_toml_is_read_only_as_a_small_regular_file() {
    let root = tempfile::tempdir().unwrap();
    Desk::create(root.path(), "mallory").unwrap();
    let toml = root.path().join("mallory/desk.toml");
    let good = fs::read(&toml).unwrap();
    type Make<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Make)> = vec![
        (
            "symlink to /dev/zero",
            Box::new(|| std::os::unix::fs::symlink("/dev/zero", &toml).unwrap()),
        ),
        (
            "oversized",
            Box::new(|| fs::write(&toml, vec![b'#'; 100_000]).unwrap()),
        ),
        (
            "fifo",
            Box::new(|| {
                let c = std::ffi::CString::new(toml.to_str().unwrap()).unwrap();
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            }),
        ),
    ];
    for (what, make) in cases {
        fs::remove_file(&toml).unwrap();
        make();
        let e = Desk::open(root.path(), "mallory").expect_err(what);
        assert!(matches!(e, DeskError::NotADesk { .. }), "{what}: {e}");
        // Listing the root returns (without its creation time) instead of reading
        // without end.
        let l = deskfs_desk::list(root.path()).unwrap();
        assert!(l.iter().all(|d| d.created.is_none()), "{what}");
    }
    fs::remove_file(&toml).unwrap();
    fs::write(&toml, good).unwrap();
    Desk::open(root.path(), "mallory").unwrap();
}

/// Finding: a branch that commits a directory as a symlink out of the desk made `task
/// start` write a `.worktreeinclude` copy through it. Now no copy goes through a symlink on
/// either side (the branch's worktree or the repo's checkout): the path is skipped with a
/// warning line, and a symlinked `.worktreeinclude` is not read.
#[test]
fn worktreeinclude_never_copies_through_a_symlink() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let app = desk.repo_dir("app");
    // Branch `evil`: config/ is a symlink to a directory outside the desk.
    git(&app, &["checkout", "-q", "-b", "evil"]);
    git(
        &app,
        &["rm", "-q", "--cached", "--ignore-unmatch", "-r", "config"],
    );
    fs::rename(app.join("config"), t.path().join("config.keep")).unwrap();
    std::os::unix::fs::symlink(&outside, app.join("config")).unwrap();
    git(&app, &["add", "config"]);
    git(&app, &["commit", "-q", "-m", "config is a link"]);
    fs::remove_file(app.join("config")).unwrap();
    git(&app, &["checkout", "-q", "main"]);
    fs::rename(t.path().join("config.keep"), app.join("config")).unwrap();
    assert!(app.join("config/local.toml").is_file());

    let s = task::start(&desk, "evil", "app", None).unwrap();
    let wt = desk.task_dir("evil");
    assert!(fs::symlink_metadata(wt.join("config"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(
        !outside.join("local.toml").exists(),
        "a .worktreeinclude copy went through the branch's symlink out of the desk"
    );
    let mut copied: Vec<String> = s.copied.iter().map(|p| p.display().to_string()).collect();
    copied.sort();
    assert_eq!(copied, [".env", "k.secret"]);
    assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    assert!(
        s.warnings[0].contains("skipped config/local.toml")
            && s.warnings[0].contains("task worktree is a symlink"),
        "{:?}",
        s.warnings
    );

    // The checkout side: a symlinked directory in the repo is not read through.
    let secret_dir = t.path().join("secret-dir");
    fs::create_dir(&secret_dir).unwrap();
    fs::write(secret_dir.join("key"), "private\n").unwrap();
    std::os::unix::fs::symlink(&secret_dir, app.join("linked")).unwrap();
    let dest = t.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let (copied, warnings) = deskfs_desk::include::copy_paths(
        &app,
        &dest,
        &[PathBuf::from("linked/key"), PathBuf::from(".env")],
    )
    .unwrap();
    assert_eq!(copied, [PathBuf::from(".env")]);
    assert!(
        !dest.join("linked").exists(),
        "read through a symlink in the checkout"
    );
    assert!(
        warnings.len() == 1 && warnings[0].contains("repo checkout is a symlink"),
        "{warnings:?}"
    );
    fs::remove_file(app.join("linked")).unwrap();

    // A .worktreeinclude that is a symlink is not read at all.
    let patterns = t.path().join("patterns");
    fs::write(&patterns, ".env\n").unwrap();
    fs::remove_file(app.join(".worktreeinclude")).unwrap();
    std::os::unix::fs::symlink(&patterns, app.join(".worktreeinclude")).unwrap();
    let s = task::start(&desk, "linked-patterns", "app", None).unwrap();
    assert!(s.copied.is_empty(), "{:?}", s.copied);
    assert!(
        s.warnings.len() == 1 && s.warnings[0].contains(".worktreeinclude in"),
        "{:?}",
        s.warnings
    );
    assert!(!desk.task_dir("linked-patterns").join(".env").exists());
}

/// Finding: a `repos/R/.git` that is a symlink let `desk tidy` (and task start) act on a
/// repository outside the desk. Now such a repo (and a symlinked `repos/R`) is refused with
/// one line, and tidy leaves it alone.
#[test]
fn repos_whose_git_dir_leaves_the_desk_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    // A repository outside the desk with a stale-looking git lock and a gone worktree.
    let outside = t.path().join("outside-repo");
    clone_source(t.path(), &outside);
    let gone = t.path().join("gone-wt");
    git(&outside, &["worktree", "add", "-q", gone.to_str().unwrap()]);
    fs::remove_dir_all(&gone).unwrap();
    let lock = outside.join(".git/index.lock");
    fs::write(&lock, "").unwrap();
    age(&lock, 2 * 3600);
    let evil = desk.repo_dir("evil");
    fs::create_dir(&evil).unwrap();
    std::os::unix::fs::symlink(outside.join(".git"), evil.join(".git")).unwrap();
    std::os::unix::fs::symlink(&outside, desk.repo_dir("linked")).unwrap();

    let e = task::start(&desk, "t", "evil", None).unwrap_err();
    assert!(matches!(e, DeskError::UnsafeRepo { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("refusing to act on repo \"evil\"") && msg.contains(".git is a symlink"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
    let e = task::start(&desk, "t", "linked", None).unwrap_err();
    assert!(matches!(e, DeskError::UnsafeRepo { .. }), "{e}");
    assert!(desk.task_names().is_empty());
    assert_eq!(git(&outside, &["worktree", "list"]).lines().count(), 2);

    let refused = deskfs_desk::repos::refused(&desk);
    assert_eq!(refused.len(), 2, "{refused:?}");
    let items = tidy(&desk, &TidyOptions::default()).unwrap();
    assert!(
        lock.exists(),
        "tidy removed a lock file outside the desk: {items:?}"
    );
    assert!(
        outside.join(".git/worktrees").read_dir().unwrap().count() == 1,
        "tidy pruned a registration outside the desk: {items:?}"
    );
    assert!(
        items.iter().all(|i| !i.what.contains("outside")),
        "{items:?}"
    );
    let r = resume::resume(&desk).unwrap();
    assert!(
        r.warnings
            .iter()
            .filter(|w| w.kind == "unsafe-repo")
            .count()
            == 2,
        "{:?}",
        r.warnings
    );
}

/// A repo's git directory must stay on the desk however `.git` reaches it: a `gitdir:`
/// file pointing out, a `.git/worktrees` that is a symlink, and a plain directory that
/// git takes for part of a repository outside the desk are refused (`UnsafeRepo`, one line
/// saying which); a `gitdir:` file pointing inside the desk is a repo like any other.
#[test]
fn repos_reaching_git_outside_the_desk_by_any_way_are_refused() {
    let t = tempfile::tempdir().unwrap();
    // The desks live inside a repository of their own: a directory under repos/ without
    // a .git is part of it to git, and its git directory is outside the desk.
    let outer = t.path().join("outer");
    fs::create_dir(&outer).unwrap();
    git(&outer, &["init", "-q"]);
    let (_root, desk) = desk_with_repo(&outer);
    let src = outer.join("src");
    let refused = |repo: &str, says: &str| {
        let e = task::start(&desk, "t", repo, None).unwrap_err();
        assert!(matches!(e, DeskError::UnsafeRepo { .. }), "{repo}: {e}");
        assert!(e.to_string().contains(says), "{repo}: {e}");
    };
    // repos/NAME cloned with its git directory at `gitdir` (a `.git` file naming it)
    let clone_with_git_dir = |name: &str, gitdir: &Path| {
        let sep = format!("--separate-git-dir={}", gitdir.display());
        let to = desk.repo_dir(name);
        let args = [
            "clone",
            "-q",
            &sep,
            src.to_str().unwrap(),
            to.to_str().unwrap(),
        ];
        git(t.path(), &args);
    };
    // `gitdir:` out of the desk
    clone_with_git_dir("sepout", &t.path().join("sep-out.git"));
    refused("sepout", "its .git file points outside the desk");
    // `.git/worktrees` a symlink out of the desk
    let wt = desk.repo_dir("wtlink");
    git(
        t.path(),
        &["clone", "-q", src.to_str().unwrap(), wt.to_str().unwrap()],
    );
    let elsewhere = t.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, wt.join(".git/worktrees")).unwrap();
    refused("wtlink", "its .git/worktrees is a symlink");
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    // a plain directory: git finds the outer repository
    fs::create_dir(desk.repo_dir("plain")).unwrap();
    refused("plain", "is outside the desk");
    assert!(desk.task_names().is_empty());
    // `gitdir:` inside the desk: fine
    clone_with_git_dir("sepin", &desk.dir().join("notes/sep-in.git"));
    task::start(&desk, "t", "sepin", None).unwrap();
    assert_eq!(desk.task_names(), ["t"]);
}

/// A task name may be up to [`deskfs_desk::names::MAX_TASK_LEN`] bytes, not one more.
#[test]
fn task_names_up_to_the_limit_are_taken() {
    let max = deskfs_desk::names::MAX_TASK_LEN;
    assert!(deskfs_desk::names::check_task(&"t".repeat(max)).is_ok());
    let e = deskfs_desk::names::check_task(&"t".repeat(max + 1)).unwrap_err();
    assert!(
        e.to_string().contains(&format!("longer than {max} bytes")),
        "{e}"
    );
}

/// Finding: task names that are git's special refs (`FETCH_HEAD`, `ORIG_HEAD`, in any
/// case) were accepted; a task of that name checked out the pseudoref instead of a branch.
#[test]
fn special_ref_names_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    git(&desk.repo_dir("app"), &["fetch", "-q", "origin"]);
    for bad in [
        "FETCH_HEAD",
        "fetch_head",
        "ORIG_HEAD",
        "MERGE_HEAD",
        "Cherry_Pick_Head",
        "AUTO_MERGE",
        "HEAD",
        "head",
        "a\u{85}b",
    ] {
        let e = task::start(&desk, bad, "app", None).unwrap_err();
        assert!(matches!(e, DeskError::InvalidName { .. }), "{bad}: {e}");
        assert!(!e.to_string().contains('\n'));
        let e = task::start(&desk, "ok", "app", Some(bad)).unwrap_err();
        assert!(
            matches!(e, DeskError::InvalidName { what: "branch", .. }),
            "{bad}: {e}"
        );
    }
    assert!(desk.task_names().is_empty());
    assert!(git(&desk.repo_dir("app"), &["branch", "--list", "*HEAD*"]).is_empty());
}

/// Finding: `manual repo` took any repo name (`../x`, `a/b`, names that do not exist).
#[test]
fn manual_repo_names_are_checked() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    let before = fs::read(desk.manual_path()).unwrap();
    let long = "r".repeat(256);
    for bad in [
        "", "..", ".", "../app", "a/b", ".hidden", "-x", "a\nb", "a\0b", &long,
    ] {
        let e = manual::record_repo(&desk, bad, Some("make test"), None).unwrap_err();
        assert!(
            matches!(e, DeskError::InvalidName { what: "repo", .. }),
            "{bad:?}: {e}"
        );
    }
    let e = manual::record_repo(&desk, "nope", Some("make test"), None).unwrap_err();
    assert!(matches!(e, DeskError::UnknownRepo { .. }), "{e}");
    std::os::unix::fs::symlink(desk.repo_dir("app"), desk.repo_dir("alias")).unwrap();
    let e = manual::record_repo(&desk, "alias", Some("make test"), None).unwrap_err();
    assert!(matches!(e, DeskError::UnsafeRepo { .. }), "{e}");
    assert_eq!(
        fs::read(desk.manual_path()).unwrap(),
        before,
        "nothing written"
    );
    manual::record_repo(&desk, "app", Some("make test"), None).unwrap();
}

/// A task whose `.git` names a registration that claims a repo on the desk (its
/// `commondir`) but lies outside that repo's git directory is not finished: git would
/// act on the forged registration.
#[test]
fn a_task_registration_outside_its_repos_git_dir_is_not_finished() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    task::start(&desk, "t", "app", None).unwrap();
    let real_admin = desk.repo_dir("app").join(".git/worktrees/t");
    let fake = desk.tmp_dir().join("fake-admin");
    fs::create_dir_all(&fake).unwrap();
    for f in ["HEAD", "gitdir"] {
        fs::copy(real_admin.join(f), fake.join(f)).unwrap();
    }
    let common = desk.repo_dir("app").join(".git");
    fs::write(fake.join("commondir"), format!("{}\n", common.display())).unwrap();
    fs::write(
        desk.task_dir("t").join(".git"),
        format!("gitdir: {}\n", fake.display()),
    )
    .unwrap();
    let e = task::finish(&desk, "t", true, None).unwrap_err();
    assert!(matches!(e, DeskError::BrokenTask { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("is not inside its repo's git directory"),
        "{e}"
    );
    assert!(desk.task_dir("t").is_dir() && fake.join("HEAD").is_file());
}

/// A task directory whose `.git` names a worktree registration of a repository outside
/// the desk: link repair does not write there and `task finish` refuses to run git in that
/// repository (it would remove the outside registration).
#[test]
fn tasks_whose_git_dir_leaves_the_desk_are_not_acted_on() {
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    let outside = t.path().join("outside-repo");
    clone_source(t.path(), &outside);
    let wt = desk.task_dir("x");
    git(
        &outside,
        &["worktree", "add", "-q", "-b", "x", wt.to_str().unwrap()],
    );
    let back = outside.join(".git/worktrees/x/gitdir");
    fs::write(&back, "/elsewhere/tasks/x/.git\n").unwrap();
    let errors = task::repair_links(&desk);
    assert!(
        errors.len() == 1 && errors[0].contains("outside the desk"),
        "{errors:?}"
    );
    assert_eq!(
        fs::read_to_string(&back).unwrap(),
        "/elsewhere/tasks/x/.git\n",
        "link repair wrote outside the desk"
    );
    let e = task::finish(&desk, "x", true, None).unwrap_err();
    assert!(matches!(e, DeskError::BrokenTask { .. }), "{e}");
    assert!(outside.join(".git/worktrees/x").is_dir());
    assert!(wt.join(".git").is_file());
}

#[test]
fn hooks_and_fsmonitors_of_a_repo_never_run() {
    // deskfs runs git on the host; the repo is the agent's. A post-checkout hook would run
    // at `task start` (git worktree add), an fsmonitor at every `git status`.
    let t = tempfile::tempdir().unwrap();
    let (_root, desk) = desk_with_repo(t.path());
    let app = desk.repo_dir("app");
    let ran = t.path().join("ran");
    let hook = format!("#!/bin/sh\necho \"$0\" >> {}\n", ran.display());
    for h in [
        "post-checkout",
        "reference-transaction",
        "post-index-change",
    ] {
        let p = app.join(".git/hooks").join(h);
        fs::write(&p, &hook).unwrap();
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let monitor = t.path().join("monitor.sh");
    fs::write(&monitor, &hook).unwrap();
    fs::set_permissions(
        &monitor,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    git(
        &app,
        &["config", "core.fsmonitor", monitor.to_str().unwrap()],
    );
    task::start(&desk, "hooked", "app", None).unwrap();
    resume::resume(&desk).unwrap();
    assert!(
        !ran.exists(),
        "a program named by the repo ran: {}",
        fs::read_to_string(&ran).unwrap_or_default()
    );
}
