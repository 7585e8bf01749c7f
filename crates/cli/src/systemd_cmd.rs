//! systemd: `deskfs systemd-unit NAME MOUNTPOINT` prints a service unit that mounts a
//! workspace at boot and unmounts it cleanly at stop, and the daemon's readiness
//! notification (`sd_notify` `READY=1`, systemd.service(5) `Type=notify`) it relies on.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

/// `--stop-timeout`'s default, seconds.
const DEFAULT_STOP_TIMEOUT: u64 = 120;

/// Arguments of `deskfs systemd-unit`.
#[derive(Args, Debug)]
pub struct UnitArgs {
    /// Workspace to mount.
    pub name: String,
    /// Where to mount it.
    pub mountpoint: PathBuf,
    /// A unit the mount needs first (a local database server, say: postgresql.service);
    /// repeatable. The network is always waited for (network-online.target).
    #[arg(long = "requires", value_name = "UNIT")]
    pub requires: Vec<String>,
    /// Longest wait for pending uploads at stop, seconds (`deskfs umount --timeout`).
    #[arg(long, default_value_t = DEFAULT_STOP_TIMEOUT)]
    pub stop_timeout: u64,
    /// More `deskfs mount` options, after `--` (e.g. -- --cache-dir /var/cache/deskfs/w).
    #[arg(last = true)]
    pub mount_args: Vec<OsString>,
}

/// `s` as one POSIX shell word: as is when it holds only characters no shell treats
/// specially, else in single quotes (a `'` written as `'\''`).
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Prints the unit for `a` on stdout.
pub fn run(a: UnitArgs) -> Result<()> {
    crate::home::check_name(&a.name)?;
    let exe = std::env::current_exe().context("cannot find the deskfs binary's path")?;
    print!("{}", unit_text(&a, &exe, &crate::home::home()));
    Ok(())
}

/// The unit's text. `exe`: the deskfs binary; `home`: the `DESKFS_HOME` the workspace
/// lives in.
fn unit_text(a: &UnitArgs, exe: &std::path::Path, home: &std::path::Path) -> String {
    let mnt = crate::absolute(&a.mountpoint);
    let exe_q = quote(&exe.to_string_lossy());
    let mut start = format!(
        "{exe_q} mount {} {} --foreground",
        quote(&a.name),
        quote(&mnt.to_string_lossy())
    );
    for m in &a.mount_args {
        start.push(' ');
        start.push_str(&quote(&m.to_string_lossy()));
    }
    let mut after = vec!["network-online.target".to_string()];
    after.extend(a.requires.iter().cloned());
    let requires = if a.requires.is_empty() {
        String::new()
    } else {
        format!("Requires={}\n", a.requires.join(" "))
    };
    // The command that printed this unit, to print it again (every argument kept).
    let mut again = format!(
        "deskfs systemd-unit {} {}",
        shell_quote(&a.name),
        shell_quote(&mnt.to_string_lossy())
    );
    for r in &a.requires {
        again.push_str(&format!(" --requires {}", shell_quote(r)));
    }
    if a.stop_timeout != DEFAULT_STOP_TIMEOUT {
        again.push_str(&format!(" --stop-timeout {}", a.stop_timeout));
    }
    if !a.mount_args.is_empty() {
        again.push_str(" --");
        for m in &a.mount_args {
            again.push(' ');
            again.push_str(&shell_quote(&m.to_string_lossy()));
        }
    }
    format!(
        "# deskfs workspace {name} at {mnt}: install with\n\
         #   {again} > /etc/systemd/system/deskfs-{name}.service\n\
         #   systemctl daemon-reload && systemctl enable --now deskfs-{name}.service\n\
         [Unit]\n\
         Description=deskfs workspace {name} at {mnt}\n\
         Wants=network-online.target\n\
         {requires}\
         After={after}\n\
         \n\
         [Service]\n\
         Type=notify\n\
         NotifyAccess=main\n\
         Environment={env}\n\
         ExecStart={start}\n\
         ExecStop={exe_q} umount {mnt_q} --timeout {t}\n\
         TimeoutStartSec=120\n\
         TimeoutStopSec={stop}\n\
         Restart=on-failure\n\
         RestartSec=5\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        name = a.name,
        mnt = mnt.display(),
        mnt_q = quote(&mnt.to_string_lossy()),
        after = after.join(" "),
        env = quote(&format!("DESKFS_HOME={}", home.display())),
        t = a.stop_timeout,
        stop = a.stop_timeout + 30,
    )
}

/// One word of a systemd command line (systemd.service(5) "Command lines"): quoted when
/// it holds a space, quote, backslash or nothing; `%` and `$` doubled (specifier and
/// variable expansion).
fn quote(s: &str) -> String {
    let s = s.replace('%', "%%").replace('$', "$$");
    if !s.is_empty() && !s.contains([' ', '\t', '"', '\'', '\\', ';']) {
        return s;
    }
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Tells systemd (through `$NOTIFY_SOCKET`, when set) `state`, e.g. `READY=1`; a path
/// socket or an abstract one (`@name`). Errors are logged, never fatal: the mount works
/// without a service manager.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let r = (|| -> std::io::Result<()> {
        let sock = std::os::unix::net::UnixDatagram::unbound()?;
        let p = path.to_string_lossy();
        if let Some(name) = p.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            sock.send_to(state.as_bytes(), &*p)?;
        }
        Ok(())
    })();
    if let Err(e) = r {
        tracing::warn!(error = %e, "cannot notify the service manager ({state})");
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn the_unit_mounts_in_the_foreground_and_unmounts_at_stop() {
        let a = UnitArgs {
            name: "work".into(),
            mountpoint: "/mnt/my work".into(),
            requires: vec!["postgresql.service".into()],
            stop_timeout: 60,
            mount_args: vec!["--cache-dir".into(), "/var/cache/50%".into()],
        };
        let t = unit_text(
            &a,
            std::path::Path::new("/usr/bin/deskfs"),
            std::path::Path::new("/srv/h"),
        );
        assert!(t.contains("\nType=notify\n"), "{t}");
        assert!(
            t.contains(
                "\nRequires=postgresql.service\nAfter=network-online.target postgresql.service\n"
            ),
            "{t}"
        );
        assert!(t.contains("\nExecStart=/usr/bin/deskfs mount work \"/mnt/my work\" --foreground --cache-dir /var/cache/50%%\n"), "{t}");
        assert!(
            t.contains("\nExecStop=/usr/bin/deskfs umount \"/mnt/my work\" --timeout 60\n"),
            "{t}"
        );
        assert!(t.contains("\nEnvironment=DESKFS_HOME=/srv/h\n"), "{t}");
        assert!(t.contains("\nTimeoutStopSec=90\n"), "{t}");
        // The install line repeats every argument, quoted for a shell.
        assert!(t.contains("\n#   deskfs systemd-unit work '/mnt/my work' --requires postgresql.service --stop-timeout 60 -- --cache-dir /var/cache/50% > /etc/systemd/system/deskfs-work.service\n"), "{t}");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn words_are_quoted_for_systemd() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a b"), "\"a b\"");
        assert_eq!(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(quote("$HOME 100%"), "\"$$HOME 100%%\"");
        assert_eq!(quote(""), "\"\"");
    }
}
