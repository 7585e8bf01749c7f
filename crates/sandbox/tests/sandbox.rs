//! The sandbox for real: bwrap runs each command against a plain temp directory as the
//! desk. Every test checks something that would differ without the sandbox.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use deskfs_sandbox::{
    command, find_bwrap_in, run, spawn_piped, Net, Piped, SandboxError, SandboxSpec,
};

/// A desk root with desks `a` and `b` and a deskfs-home look-alike next to them.
struct World {
    _dir: tempfile::TempDir,
    root: PathBuf,
    desk: PathBuf,
    other: PathBuf,
    home: PathBuf,
}

impl World {
    fn in_dir(dir: tempfile::TempDir) -> World {
        let root = fs::canonicalize(dir.path()).unwrap();
        let desk = root.join("desks/a");
        let other = root.join("desks/b");
        let home = root.join("home/workspaces/w");
        for d in [
            &desk.join("notes"),
            &desk.join("tasks/t1"),
            &other,
            &home.join("cache"),
        ] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(other.join("secret.txt"), "desk b secret\n").unwrap();
        fs::write(home.join("meta.db"), "SQLite format 3\0").unwrap();
        fs::write(home.join("workspace.toml"), "secret_key = \"k\"\n").unwrap();
        fs::write(home.join("cache/block"), "cached\n").unwrap();
        World {
            _dir: dir,
            root,
            desk,
            other,
            home,
        }
    }

    fn new() -> World {
        World::in_dir(tempfile::tempdir().unwrap())
    }

    fn spec(&self) -> SandboxSpec {
        SandboxSpec::new(&self.desk)
    }
}

fn argv(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Runs a shell script in the sandbox with stdout/stderr captured and stdin closed.
fn sh(spec: &SandboxSpec, script: &str) -> Output {
    command(spec, &argv(&["sh", "-c", script]))
        .unwrap()
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}, stdout {:?}, stderr {:?}",
        o.status,
        stdout(o),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn exit_codes_pass_through() {
    let w = World::new();
    let spec = w.spec();
    for (script, want) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("kill -TERM $$", 128 + 15),
        ("kill -KILL $$", 128 + 9),
    ] {
        let got = run(&spec, &argv(&["sh", "-c", script])).unwrap();
        assert_eq!(got, want, "{script}");
    }
    // a program that is not there: 127 like a shell (the command starts through
    // `env --default-signal`), or, where env lacks that option, an error from bwrap
    match run(&spec, &argv(&["no-such-program-xyz"])) {
        Ok(127) | Err(SandboxError::Setup { code: 1 }) => {}
        other => panic!("a missing program gave {other:?}"),
    }
    // ...while a command that exits 1 is just that
    assert_eq!(run(&spec, &argv(&["false"])).unwrap(), 1);
}

#[test]
fn symlinks_out_of_the_desk_lead_nowhere() {
    let w = World::new();
    std::os::unix::fs::symlink(&w.other, w.desk.join("tasks/escape")).unwrap();
    let mut spec = w.spec();
    // the working directory exists on the host (through the link) but not inside
    spec.workdir = "/desk/tasks/escape".into();
    let err = run(&spec, &argv(&["true"])).unwrap_err();
    assert!(matches!(err, SandboxError::Setup { .. }), "{err}");
    spec.workdir = "/desk".into();
    let out = sh(&spec, "cat /desk/tasks/escape/secret.txt");
    assert!(!out.status.success(), "{}", show(&out));
}

#[test]
fn stdout_and_stderr_pass_through() {
    let w = World::new();
    let out = sh(
        &w.spec(),
        "printf 'to out\\n'; printf 'to err\\n' >&2; exit 5",
    );
    assert_eq!(stdout(&out), "to out\n", "{}", show(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "to err\n",
        "{}",
        show(&out)
    );
    assert_eq!(out.status.code(), Some(5));
}

#[test]
fn workdir_is_honoured() {
    let w = World::new();
    let mut spec = w.spec();
    assert_eq!(stdout(&sh(&spec, "pwd")), "/desk\n");
    spec.workdir = "/desk/tasks/t1".into();
    let out = sh(&spec, "pwd; ls -a");
    assert_eq!(stdout(&out), "/desk/tasks/t1\n.\n..\n", "{}", show(&out));
}

#[test]
fn environment_is_exactly_the_specified_one() {
    let w = World::new();
    // cargo sets these for the test process: they must not reach the sandbox
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let mut spec = w.spec();
    spec.env = vec![("FOO".into(), "bar baz".into())];
    let out = command(&spec, &argv(&["env", "-0"]))
        .unwrap()
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let vars: Vec<(String, String)> = out
        .stdout
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| {
            let v = String::from_utf8_lossy(v);
            let (n, val) = v.split_once('=').unwrap();
            (n.to_string(), val.to_string())
        })
        .collect();
    let get = |n: &str| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let expected = [
        ("HOME", "/desk"),
        ("DESK", "/desk"),
        ("TMPDIR", "/tmp"),
        ("XDG_CACHE_HOME", "/desk/.cache"),
        ("CARGO_HOME", "/desk/.cache/cargo"),
        ("npm_config_cache", "/desk/.cache/npm"),
        ("PIP_CACHE_DIR", "/desk/.cache/pip"),
        ("UV_CACHE_DIR", "/desk/.cache/uv"),
        ("GOPATH", "/desk/.cache/go"),
        ("CARGO_INSTALL_ROOT", "/desk/tools"),
        ("npm_config_prefix", "/desk/tools"),
        ("GOBIN", "/desk/tools/bin"),
        ("FOO", "bar baz"),
    ];
    for (name, value) in expected {
        assert_eq!(get(name), Some(value), "{name} in {vars:?}");
    }
    let path = get("PATH").unwrap();
    assert!(path.starts_with("/desk/tools/bin:"), "{path}");
    assert!(
        path.ends_with(":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        "{path}"
    );
    let optional: BTreeSet<&str> = [
        "PATH",
        "PWD", // bwrap sets it after --chdir
        "LANG",
        "TERM",
        "COLORTERM",
        "LC_ALL",
        "RUSTUP_HOME",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
    ]
    .into();
    for (name, _) in &vars {
        assert!(
            optional.contains(name.as_str()) || expected.iter().any(|(n, _)| n == name),
            "unexpected variable {name} inside the sandbox: {vars:?}"
        );
    }
    assert!(get("LANG").is_some());
    if let Some(term) = std::env::var_os("TERM") {
        assert_eq!(get("TERM").map(OsString::from), Some(term));
    }
    // the caches exist on the desk
    for c in ["cargo", "npm", "pip", "uv"] {
        assert!(w.desk.join(".cache").join(c).is_dir(), "{c}");
    }
}

#[test]
fn forbidden_extra_variables_are_refused() {
    let w = World::new();
    let mut spec = w.spec();
    spec.env = vec![("AWS_SECRET_ACCESS_KEY".into(), "x".into())];
    let err = command(&spec, &argv(&["true"])).unwrap_err();
    assert!(matches!(err, SandboxError::ForbiddenEnv { .. }), "{err}");
    // nothing created on the desk for a refused command
    assert!(!w.desk.join(".cache").exists());
}

#[test]
fn desk_is_writable_and_shows_on_the_host() {
    let w = World::new();
    let out = sh(
        &w.spec(),
        "echo note > /desk/notes/n1 && mkdir -p /desk/repos/r && echo t > /tmp/t && echo s > /dev/shm/s",
    );
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        fs::read_to_string(w.desk.join("notes/n1")).unwrap(),
        "note\n"
    );
    assert!(w.desk.join("repos/r").is_dir());
}

/// A desk with records under `.desk` as deskfs leaves them: `(journal file, its content)`.
fn desk_with_records(w: &World) -> (PathBuf, &'static str) {
    let journal = w.desk.join(".desk/journal/_desk.jsonl");
    fs::create_dir_all(journal.parent().unwrap()).unwrap();
    fs::create_dir_all(w.desk.join(".desk/locks")).unwrap();
    fs::create_dir_all(w.desk.join(".desk/tasks")).unwrap();
    fs::write(w.desk.join(".desk/tasks/t1.toml"), "repo = \"app\"\n").unwrap();
    let line = "{\"id\":\"real\"}\n";
    fs::write(&journal, line).unwrap();
    (journal, line)
}

/// Runs each command in one sandbox (`sh -c CMD`, stderr kept) and returns, per
/// command, `Ok(())` when it succeeded or `Err(stderr)` when it failed.
fn each_inside(spec: &SandboxSpec, cmds: &[&str]) -> Vec<Result<(), String>> {
    let mut script = String::new();
    for (i, c) in cmds.iter().enumerate() {
        let quoted = c.replace('\'', "'\\''");
        script.push_str(&format!(
            "if sh -c '{quoted}' 2>/tmp/e; then echo \"{i} ok\"; else echo \"{i} failed $(tr '\\n' ' ' </tmp/e)\"; fi\n"
        ));
    }
    let out = sh(spec, &script);
    assert!(out.status.success(), "{}", show(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), cmds.len(), "{}", show(&out));
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let rest = l.strip_prefix(&format!("{i} ")).unwrap_or(l);
            if rest == "ok" {
                Ok(())
            } else {
                Err(rest.trim_start_matches("failed").trim().to_owned())
            }
        })
        .collect()
}

#[test]
fn desk_records_are_read_only_inside() {
    let w = World::new();
    let (journal, line) = desk_with_records(&w);
    // (command, what the kernel must answer: EROFS under it, EBUSY for the mount point)
    let refused = [
        (
            "echo x > /desk/.desk/journal/_desk.jsonl",
            "Read-only file system",
        ),
        (
            "echo x >> /desk/.desk/journal/_desk.jsonl",
            "Read-only file system",
        ),
        (
            "echo x > /desk/.desk/journal/t1.jsonl",
            "Read-only file system",
        ),
        (
            "rm /desk/.desk/journal/_desk.jsonl",
            "Read-only file system",
        ),
        ("rm -r /desk/.desk/journal", "Read-only file system"),
        ("mkdir /desk/.desk/y", "Read-only file system"),
        ("mkdir -p /desk/.desk/journal/y", "Read-only file system"),
        (
            "touch /desk/.desk/locks/task-t1.lock",
            "Read-only file system",
        ),
        (
            "chmod 666 /desk/.desk/journal/_desk.jsonl",
            "Read-only file system",
        ),
        (
            "ln -s /desk/notes /desk/.desk/journal/l",
            "Read-only file system",
        ),
        ("rmdir /desk/.desk/locks", "Read-only file system"),
        (
            "mv /desk/.desk/journal /desk/.desk/j",
            "Read-only file system",
        ),
        ("mv /desk/.desk /desk/x", "Device or resource busy"),
        ("rmdir /desk/.desk", "Device or resource busy"),
        // a fake journal directory moved over it, or the real one moved out
        (
            "mkdir -p /desk/notes/fake && mv -T /desk/notes/fake /desk/.desk",
            "",
        ),
        ("mv /desk/.desk/journal /desk/notes/j", ""),
        ("mv /desk/notes/fake /desk/.desk/journal2", ""),
        ("rm -rf /desk/.desk", ""),
        // a user namespace of its own (where the host allows one) cannot take the
        // read-only mount away: it is locked to the mounts it came with (EINVAL)
        (
            "unshare -Um sh -c 'umount -l /desk/.desk; echo x > /desk/.desk/journal/_desk.jsonl'",
            "",
        ),
    ];
    let cmds: Vec<&str> = refused.iter().map(|(c, _)| *c).collect();
    for ((cmd, want), got) in refused.iter().zip(each_inside(&w.spec(), &cmds)) {
        match got {
            Ok(()) => panic!("{cmd} succeeded inside the sandbox"),
            Err(stderr) => assert!(stderr.contains(want), "{cmd}: {stderr}"),
        }
    }
    // nothing of it reached the desk
    assert_eq!(fs::read_to_string(&journal).unwrap(), line);
    assert!(!w.desk.join(".desk/journal/t1.jsonl").exists());
    assert!(!w.desk.join(".desk/y").exists());
    assert!(!w.desk.join(".desk/journal2").exists());
    assert!(!w.desk.join("x").exists());
    // (moving the journal out is a copy that cannot remove the original: EXDEV, EROFS)
    assert!(w.desk.join(".desk/journal").is_dir());
    assert!(w.desk.join(".desk/locks").is_dir());
    assert!(w.desk.join(".desk/tasks/t1.toml").is_file());
    // ...while it reads, and the rest of the desk stays writable
    let out = sh(
        &w.spec(),
        "cat /desk/.desk/journal/_desk.jsonl && ls /desk/.desk && echo x > /desk/notes/x && mkdir /desk/y && mv /desk/y /desk/z",
    );
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(stdout(&out), format!("{line}journal\nlocks\ntasks\n"));
    assert_eq!(fs::read_to_string(w.desk.join("notes/x")).unwrap(), "x\n");
    assert!(w.desk.join("z").is_dir());
}

#[test]
fn missing_desk_records_are_made_before_the_bind() {
    // a desk without `.desk` gets one: a real directory, read-only inside at once
    let w = World::new();
    let out = sh(&w.spec(), "mkdir /desk/.desk/journal");
    assert!(!out.status.success(), "{}", show(&out));
    let meta = fs::symlink_metadata(w.desk.join(".desk")).unwrap();
    assert!(meta.is_dir());
    assert!(!w.desk.join(".desk/journal").exists());
}

#[test]
fn desk_records_that_are_not_a_directory_are_never_bound() {
    // `.desk` as a symlink (planted from inside before it was read-only) is refused
    // before anything runs: not one out of the desk (another desk would show at
    // /desk/.desk), not one to a writable place inside it; a plain file neither
    let w = World::new();
    let state = w.desk.join(".desk");
    for target in [w.other.clone(), w.desk.join("notes")] {
        let _ = fs::remove_file(&state);
        std::os::unix::fs::symlink(&target, &state).unwrap();
        let err = command(&w.spec(), &argv(&["true"])).unwrap_err();
        assert!(matches!(err, SandboxError::Io { .. }), "{err}");
        assert!(
            err.to_string().contains("symlink or not a directory"),
            "{err}"
        );
    }
    fs::remove_file(&state).unwrap();
    fs::write(&state, "").unwrap();
    let err = command(&w.spec(), &argv(&["true"])).unwrap_err();
    assert!(matches!(err, SandboxError::Io { .. }), "{err}");
    assert_eq!(
        fs::read_to_string(w.other.join("secret.txt")).unwrap(),
        "desk b secret\n"
    );
}

#[test]
fn writes_outside_the_desk_fail() {
    let w = World::new();
    let mut dirs = vec!["/usr", "/etc", "", "/bin", "/proc", "/dev", "/lib"];
    if Path::new("/opt").is_dir() {
        dirs.push("/opt");
    }
    for dir in dirs {
        // a unique name, removed again should the sandbox ever let it through
        let t = PathBuf::from(format!("{dir}/deskfs-sandbox-test.{}", std::process::id()));
        let out = sh(&w.spec(), &format!("echo x > {}", t.display()));
        let leaked = t.exists();
        if leaked {
            let _ = fs::remove_file(&t);
        }
        assert!(
            !out.status.success(),
            "writing {} succeeded: {}",
            t.display(),
            show(&out)
        );
        assert!(!leaked, "{} appeared on the host", t.display());
    }
    // kernel knobs a capability-less uid 0 could otherwise write (test -w: nothing written)
    for t in ["/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger"] {
        let out = sh(&w.spec(), &format!("test -w {t}"));
        assert_eq!(
            out.status.code(),
            Some(1),
            "{t} is writable: {}",
            show(&out)
        );
    }
    // no capabilities
    let out = sh(&w.spec(), "grep CapEff /proc/self/status");
    assert_eq!(
        stdout(&out).split_whitespace().nth(1),
        Some("0000000000000000")
    );
}

/// `ls` of every path in the list must fail inside.
fn assert_invisible(spec: &SandboxSpec, paths: &[&Path]) {
    for p in paths {
        assert!(
            p.exists(),
            "test setup: {} should exist on the host",
            p.display()
        );
        let out = sh(spec, &format!("ls -d '{}' || exit 0; exit 1", p.display()));
        assert!(
            out.status.success(),
            "{} is visible: {}",
            p.display(),
            show(&out)
        );
        let out = sh(spec, &format!("cat '{}'", p.display()));
        assert!(
            !out.status.success(),
            "{} is readable: {}",
            p.display(),
            show(&out)
        );
    }
}

#[test]
fn host_paths_are_not_visible() {
    let w = World::new();
    let spec = w.spec();
    assert_invisible(
        &spec,
        &[
            &w.other.join("secret.txt"),
            &w.home.join("meta.db"),
            &w.home.join("workspace.toml"),
            &w.home.join("cache/block"),
        ],
    );
    // the sandbox's own tree: only the expected top-level names, nothing of the host's
    // homes or data
    let out = sh(&spec, "ls -A /");
    let top: BTreeSet<String> = stdout(&out).lines().map(String::from).collect();
    for name in top.iter() {
        assert!(
            [
                "usr",
                "etc",
                "opt",
                "bin",
                "sbin",
                "lib",
                "lib32",
                "lib64",
                "libx32",
                "proc",
                "dev",
                "tmp",
                "desk",
                "toolchain"
            ]
            .contains(&name.as_str()),
            "unexpected /{name} in the sandbox: {top:?}"
        );
    }
    let out = sh(&spec, "ls -A /tmp | wc -l");
    assert_eq!(stdout(&out).trim(), "0", "/tmp is not empty");
    // secrets in the read-only /etc are masked
    let out = sh(&spec, "test -s /etc/shadow");
    assert_eq!(
        out.status.code(),
        Some(1),
        "/etc/shadow readable: {}",
        show(&out)
    );
    // the desk root of the host path is not there either (desk `a` is only /desk)
    let out = sh(&spec, &format!("ls '{}'", w.root.display()));
    assert!(!out.status.success(), "{}", show(&out));
}

#[test]
fn hidden_paths_under_a_read_only_bind_stay_hidden() {
    // a desk root and a deskfs home under /opt, which is bound read-only: the other desk
    // is masked automatically, the home through `hide`
    let Ok(dir) = tempfile::Builder::new()
        .prefix("deskfs-sandbox-test.")
        .tempdir_in("/opt")
    else {
        eprintln!("SKIP: /opt is not writable here");
        return;
    };
    let w = World::in_dir(dir);
    let mut spec = w.spec();
    spec.hide = vec![w.root.join("home")];
    // visible without the masks: the test would catch a missing mask
    assert!(w.other.starts_with("/opt"));
    assert_invisible(
        &spec,
        &[
            &w.other.join("secret.txt"),
            &w.home.join("meta.db"),
            &w.home.join("workspace.toml"),
        ],
    );
    // and the desk itself stays reachable at /desk
    let out = sh(&spec, "echo ok > /desk/notes/x && cat /desk/notes/x");
    assert_eq!(stdout(&out), "ok\n", "{}", show(&out));
    // hiding something inside the desk works too
    fs::write(w.desk.join("notes/private"), "p").unwrap();
    spec.hide = vec![w.desk.join("notes/private")];
    let out = sh(&spec, "cat /desk/notes/private");
    assert_eq!(stdout(&out), "", "{}", show(&out));
}

#[test]
fn net_none_has_no_network() {
    let w = World::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port}");
    let mut spec = w.spec();
    let out = command(&spec, &argv(&["bash", "-c", &connect]))
        .unwrap()
        .output()
        .unwrap();
    assert!(out.status.success(), "host network: {}", show(&out));

    spec.net = Net::None;
    let out = command(&spec, &argv(&["bash", "-c", &connect]))
        .unwrap()
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "connected without network: {}",
        show(&out)
    );
    let out = sh(&spec, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
    assert_eq!(stdout(&out), "lo\n", "{}", show(&out));
}

#[test]
fn missing_bwrap_is_a_clear_error() {
    let empty = tempfile::tempdir().unwrap();
    for path in [OsString::new(), empty.path().as_os_str().to_os_string()] {
        let err = find_bwrap_in(Some(&path)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap"
        );
    }
}

#[test]
fn bad_input_is_refused_before_anything_is_created() {
    let w = World::new();
    let err = command(&w.spec(), &[]).unwrap_err();
    assert!(matches!(err, SandboxError::EmptyCommand), "{err}");
    let mut spec = w.spec();
    spec.workdir = "/etc".into();
    assert!(matches!(
        command(&spec, &argv(&["true"])).unwrap_err(),
        SandboxError::BadWorkdir { .. }
    ));
    spec.workdir = "/desk/tasks/nope".into();
    assert!(matches!(
        command(&spec, &argv(&["true"])).unwrap_err(),
        SandboxError::WorkdirMissing { .. }
    ));
    assert!(!w.desk.join(".cache").exists());
    assert!(!w.desk.join(".desk").exists());
    let err = command(&SandboxSpec::new(w.root.join("desks/zz")), &argv(&["true"])).unwrap_err();
    assert!(matches!(err, SandboxError::DeskMissing { .. }), "{err}");
    assert!(!w.root.join("desks/zz").exists());
}

#[test]
fn terminal_injection_is_refused() {
    let w = World::new();
    if which("python3").is_none() {
        eprintln!("SKIP: no python3");
        return;
    }
    // stdin is /dev/null: without the filter TIOCSTI fails with ENOTTY (25), with it EPERM
    let script = "import errno, fcntl, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])";
    let out = command(&w.spec(), &argv(&["python3", "-c", script]))
        .unwrap()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "EPERM\n", "{}", show(&out));
}

#[test]
fn leaked_descriptors_do_not_reach_the_command() {
    let w = World::new();
    let file = fs::File::open(w.other.join("secret.txt")).unwrap();
    // SAFETY: dup of an open descriptor; the copy is not close-on-exec, like one a careless
    // caller would leave open
    let leaked = unsafe { libc::dup(file.as_raw_fd()) };
    assert!(leaked > 2);
    let out = sh(&w.spec(), &format!("cat <&{leaked}"));
    // SAFETY: closing the descriptor dup returned
    unsafe { libc::close(leaked) };
    assert!(
        !out.status.success(),
        "read through fd {leaked}: {}",
        show(&out)
    );
    let out = sh(&w.spec(), "ls /proc/self/fd");
    let fds: Vec<String> = stdout(&out).lines().map(String::from).collect();
    // 0-2, plus the one ls opens to read the directory
    assert!(fds.len() <= 4, "descriptors inside: {fds:?}");
}

#[test]
fn sandbox_dies_with_its_parent() {
    let w = World::new();
    let marker = format!("{}.{}", 600, std::process::id());
    let mut cmd = command(&w.spec(), &argv(&["sleep", &marker])).unwrap();
    // --die-with-parent: the parent is the thread that spawned bwrap; let it end
    let mut child = std::thread::spawn(move || {
        let child = cmd.spawn().unwrap();
        // let bwrap arm PR_SET_PDEATHSIG before this thread ends
        std::thread::sleep(Duration::from_millis(300));
        child
    })
    .join()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("bwrap outlived the thread that started it");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{status:?}");
    while sleeping(&marker) {
        assert!(Instant::now() < deadline, "sleep {marker} outlived bwrap");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn host_rust_toolchain_is_offered_read_only() {
    let w = World::new();
    if which("cargo").is_none() {
        eprintln!("SKIP: no cargo on the host");
        return;
    }
    let out = sh(
        &w.spec(),
        "cargo --version && rustc --version && ! touch \"$RUSTUP_HOME/x\"",
    );
    assert!(out.status.success(), "{}", show(&out));
    assert!(stdout(&out).starts_with("cargo "), "{}", show(&out));
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// Some process runs `sleep MARKER`.
fn sleeping(marker: &str) -> bool {
    let want = format!("sleep\0{marker}\0");
    fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let mut s = String::new();
        fs::File::open(e.path().join("cmdline"))
            .and_then(|mut f| f.read_to_string(&mut s))
            .is_ok()
            && s == want
    })
}

/// Reads a piped command's stdout and stderr to the end on two threads.
fn drain(
    p: &mut Piped,
) -> (
    std::thread::JoinHandle<Vec<u8>>,
    std::thread::JoinHandle<Vec<u8>>,
) {
    let mut out = p.take_stdout().unwrap();
    let mut err = p.take_stderr().unwrap();
    (
        std::thread::spawn(move || {
            let mut v = Vec::new();
            out.read_to_end(&mut v).unwrap();
            v
        }),
        std::thread::spawn(move || {
            let mut v = Vec::new();
            err.read_to_end(&mut v).unwrap();
            v
        }),
    )
}

#[test]
fn piped_output_and_exit_codes_come_back_separately() {
    let w = World::new();
    for (script, code, signal) in [
        ("printf 'to out'; printf 'to err' >&2; exit 3", 3, None),
        ("printf 'to out'; printf 'to err' >&2", 0, None),
        (
            "printf 'to out'; printf 'to err' >&2; kill -TERM $$",
            143,
            Some(15),
        ),
    ] {
        let mut p = spawn_piped(&w.spec(), &argv(&["sh", "-c", script])).unwrap();
        let (o, e) = drain(&mut p);
        let ended = p.wait().unwrap();
        assert_eq!(
            (ended.code, ended.signal(), ended.killed),
            (code, signal, false),
            "{script}"
        );
        assert_eq!(o.join().unwrap(), b"to out", "{script}");
        assert_eq!(e.join().unwrap(), b"to err", "{script}");
    }
    // stdin is /dev/null, and no terminal: its own session
    let mut p = spawn_piped(
        &w.spec(),
        &argv(&["sh", "-c", "cat; test -t 0 || echo notty"]),
    )
    .unwrap();
    let (o, _) = drain(&mut p);
    assert_eq!(p.wait().unwrap().code, 0);
    assert_eq!(o.join().unwrap(), b"notty\n");
}

#[test]
fn piped_setup_failure_is_told_from_a_failing_command() {
    let w = World::new();
    std::os::unix::fs::symlink(&w.other, w.desk.join("tasks/escape")).unwrap();
    let mut spec = w.spec();
    spec.workdir = "/desk/tasks/escape".into();
    let mut p = spawn_piped(&spec, &argv(&["true"])).unwrap();
    let (_, e) = drain(&mut p);
    let err = p.wait().unwrap_err();
    assert!(matches!(err, SandboxError::Setup { .. }), "{err}");
    assert!(!e.join().unwrap().is_empty(), "bwrap says why on stderr");
    // bad input is refused before anything starts
    spec.workdir = "/desk".into();
    spec.env = vec![("AWS_SECRET_ACCESS_KEY".into(), "x".into())];
    let err = spawn_piped(&spec, &argv(&["true"])).unwrap_err();
    assert!(matches!(err, SandboxError::ForbiddenEnv { .. }), "{err}");
}

#[test]
fn killing_a_piped_command_kills_its_whole_tree() {
    let w = World::new();
    let marker = format!("{}.{}", 1000, std::process::id());
    // a background grandchild in a session of its own, ignoring SIGTERM/SIGHUP, that
    // holds no pipe of ours: only the end of the pid namespace can take it down
    let script = format!(
        "setsid sh -c 'trap \"\" TERM HUP; exec sleep {marker}' </dev/null >/dev/null 2>&1 & echo started; exec sleep 1000"
    );
    let mut p = spawn_piped(&w.spec(), &argv(&["sh", "-c", &script])).unwrap();
    let mut out = p.take_stdout().unwrap();
    let mut first = [0u8; 8];
    out.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"started\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sleeping(&marker) {
        assert!(Instant::now() < deadline, "the grandchild never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let killer = p.killer();
    let started = Instant::now();
    assert!(killer.kill());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(p.wait()));
    let ended = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the command did not end after the kill")
        .unwrap();
    assert!(ended.killed && ended.signal() == Some(9), "{ended:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "wait after kill took {:?}",
        started.elapsed()
    );
    // the pipe reaches its end: nothing inside holds it any more
    let mut rest = Vec::new();
    out.read_to_end(&mut rest).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while sleeping(&marker) {
        assert!(
            Instant::now() < deadline,
            "sleep {marker} outlived the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // a kill after the end sends nothing
    assert!(!killer.kill());
}

#[test]
fn dropping_a_piped_command_kills_it() {
    let w = World::new();
    let marker = format!("{}.{}", 1001, std::process::id());
    let mut p = spawn_piped(&w.spec(), &argv(&["sleep", &marker])).unwrap();
    let mut out = p.take_stdout().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sleeping(&marker) {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(p);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(out.read_to_end(&mut Vec::new()).is_ok()));
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap_or(false),
        "the output did not end after the drop"
    );
    while sleeping(&marker) {
        assert!(
            Instant::now() < deadline,
            "sleep {marker} outlived its Piped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_piped_command_outlives_the_thread_that_started_it() {
    let w = World::new();
    // started from a short-lived thread (like a pool's worker that retires): bwrap's
    // --die-with-parent must not fire, since a thread of the sandbox's own spawned it
    let spec = w.spec();
    let mut p = std::thread::spawn(move || {
        spawn_piped(&spec, &argv(&["sh", "-c", "sleep 1; echo alive"])).unwrap()
    })
    .join()
    .unwrap();
    let (o, _) = drain(&mut p);
    let ended = p.wait().unwrap();
    assert_eq!((ended.code, ended.killed), (0, false));
    assert_eq!(o.join().unwrap(), b"alive\n");
}
