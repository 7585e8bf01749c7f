//! `mount.fuse.deskfs`: the mount(8) helper, so `mount -t fuse.deskfs NAME DIR -o …` and
//! `/etc/fstab` lines work. mount(8) runs `/sbin/mount.fuse.deskfs NAME DIR [-sfnv] [-o
//! OPTIONS]` for file system type `fuse.deskfs` (util-linux, mount(8) "External
//! helpers"); the deskfs binary answers to that name (a symlink) and turns the call into
//! `deskfs mount NAME DIR …`.

use std::ffi::OsString;

use anyhow::{bail, Result};

/// The name mount(8) runs for type `fuse.deskfs`.
pub const HELPER_NAME: &str = "mount.fuse.deskfs";

/// Options mount(8), systemd and fstab conventions use, which deskfs takes as given (the
/// kernel or the caller acts on them, or they mean nothing to a FUSE mount).
const IGNORED: &[&str] = &[
    "defaults", "rw", "auto", "noauto", "user", "users", "nouser", "owner", "group", "_netdev",
    "nofail", "exec", "noexec", "suid", "nosuid", "dev", "nodev", "async", "sync", "loop",
];

/// What a helper call asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum HelperCall {
    /// `-f` (fake): check the options, mount nothing.
    Fake,
    /// Mount: the `deskfs` argument vector to run, and the `DESKFS_HOME` to run it with
    /// (`home=` option).
    Mount {
        /// `deskfs mount NAME DIR …`, program name first.
        argv: Vec<OsString>,
        /// From `home=DIR`.
        home: Option<OsString>,
    },
}

/// Translates a helper call's arguments (`argv[1..]`) into a `deskfs mount` call.
/// Errors (one line each): a missing workspace or mount point, `ro` (deskfs mounts are
/// read-write), an unknown option (the line lists the known ones).
pub fn translate(args: &[OsString]) -> Result<HelperCall> {
    let mut positional = Vec::new();
    let mut opts: Vec<String> = Vec::new();
    let mut fake = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-o" => match it.next() {
                Some(o) => opts.extend(o.to_string_lossy().split(',').map(str::to_string)),
                None => bail!("{HELPER_NAME}: -o needs a list of options"),
            },
            "-t" => {
                it.next(); // the type (fuse.deskfs)
            }
            // sloppy, no mtab, verbose: nothing to do; fake: mount nothing.
            "-s" | "-n" | "-v" => {}
            "-f" => fake = true,
            _ if s.starts_with("-o") => opts.extend(s[2..].split(',').map(str::to_string)),
            _ => positional.push(a.clone()),
        }
    }
    let [source, dir] = positional.as_slice() else {
        bail!("{HELPER_NAME}: usage: {HELPER_NAME} WORKSPACE MOUNTPOINT [-o OPTIONS] (as mount(8) runs it for type fuse.deskfs)");
    };
    let name = source.to_string_lossy();
    let name = name.strip_prefix("deskfs:").unwrap_or(&name).to_string();
    let mut argv: Vec<OsString> = vec!["deskfs".into(), "mount".into(), name.into(), dir.clone()];
    let mut home = None;
    for o in opts.iter().filter(|o| !o.is_empty()) {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        if IGNORED.contains(&k) || k.starts_with("x-") || k == "comment" {
            continue;
        }
        let flag = match (k, v) {
            ("ro", None) => bail!("{HELPER_NAME}: option 'ro': deskfs mounts are read-write; remove it"),
            ("home", Some(v)) => {
                home = Some(v.into());
                continue;
            }
            ("allow_other", None) => {
                argv.push("--allow-other".into());
                continue;
            }
            ("noatime" | "relatime", None) => {
                argv.extend(["--atime".into(), k.into()]);
                continue;
            }
            ("no_passthrough", None) => {
                argv.push("--no-passthrough".into());
                continue;
            }
            ("cache_dir" | "cache_size" | "durability" | "threads" | "buffer_memory" | "lease"
            | "remote_wait" | "bucket_wait" | "list_ttl" | "metrics" | "log_format" | "meta", Some(_)) => {
                format!("--{}", k.replace('_', "-"))
            }
            _ => bail!("{HELPER_NAME}: unknown mount option '{o}' (deskfs takes cache_dir=, cache_size=, durability=, threads=, buffer_memory=, lease=, remote_wait=, bucket_wait=, list_ttl=, metrics=, log_format=, meta=, home=, allow_other, noatime, relatime, no_passthrough; fstab's defaults, _netdev, nofail, noauto, x-systemd.* are taken as given)"),
        };
        argv.push(flag.into());
        argv.push(v.unwrap_or_default().into());
    }
    if fake {
        return Ok(HelperCall::Fake);
    }
    Ok(HelperCall::Mount { argv, home })
}

#[cfg(test)]
mod unit {
    use super::*;

    fn call(s: &str) -> Result<HelperCall> {
        translate(&s.split(' ').map(OsString::from).collect::<Vec<_>>())
    }

    fn argv(c: HelperCall) -> (String, Option<OsString>) {
        match c {
            HelperCall::Mount { argv, home } => (
                argv.iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" "),
                home,
            ),
            HelperCall::Fake => panic!("fake"),
        }
    }

    #[test]
    fn fstab_options_become_mount_flags() {
        let (a, home) = argv(call("work /mnt/work -o rw,_netdev,nofail,x-systemd.requires=postgresql.service,cache_dir=/var/cache/w,durability=bucket,allow_other,noatime,home=/srv/deskfs").unwrap());
        assert_eq!(a, "deskfs mount work /mnt/work --cache-dir /var/cache/w --durability bucket --allow-other --atime noatime");
        assert_eq!(home, Some("/srv/deskfs".into()));
        let (a, _) = argv(call("deskfs:work /mnt/work").unwrap());
        assert_eq!(a, "deskfs mount work /mnt/work");
        let (a, _) = argv(call("-o cache_size=5G w /m -n -v").unwrap());
        assert_eq!(a, "deskfs mount w /m --cache-size 5G");
    }

    #[test]
    fn bad_calls_are_one_line_each() {
        for (c, want) in [
            ("work /mnt/work -o ro", "deskfs mounts are read-write"),
            (
                "work /mnt/work -o cachedir=/x",
                "unknown mount option 'cachedir=/x'",
            ),
            ("work", "usage:"),
            ("work /mnt/work -o", "-o needs a list"),
        ] {
            let e = call(c).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{c}: {e}");
        }
        assert_eq!(
            call("work /mnt/work -f -o cache_dir=/x").unwrap(),
            HelperCall::Fake
        );
    }
}
