//! The environment of the sandboxed command: built from scratch, never inherited.
//!
//! Only a few of the caller's variables pass through (terminal type, locale, and the HTTP
//! proxy settings when the network is shared); everything else, cloud credentials
//! included, stays outside. Package managers keep their caches on the desk and install
//! tools into `/desk/tools` so both survive the session.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use crate::host::Host;
use crate::{Net, SandboxError, SandboxSpec, DESK_MOUNT};

/// The system part of PATH inside the sandbox.
pub(crate) const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Cache directories (relative to the desk) that exist before the command starts.
pub(crate) const CACHE_DIRS: &[&str] = &[
    ".cache/cargo",
    ".cache/npm",
    ".cache/pip",
    ".cache/uv",
    ".cache/go",
];

/// Caller variables passed through unchanged when set: terminal and locale.
const PASS_THROUGH: &[&str] = &["TERM", "COLORTERM", "LANG", "LC_ALL"];

/// Caller variables passed through only with [`Net::Host`]: without them a machine behind
/// a proxy has no network in exec.
const PROXY_VARS: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
];

/// Name prefixes that never enter the sandbox, not even through [`SandboxSpec::env`]:
/// cloud SDK credentials and deskfs's own settings.
const FORBIDDEN_PREFIXES: &[&str] = &["AWS_", "GOOGLE_", "GCLOUD_", "AZURE_", "DESKFS_"];

/// In-sandbox paths of the host's Rust toolchain, when it is offered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ToolchainEnv {
    /// Value for `RUSTUP_HOME`.
    pub rustup_home: Option<PathBuf>,
    /// Directory with `cargo`, `rustc` (rustup proxies), put on PATH after the desk's tools.
    pub cargo_bin: Option<PathBuf>,
}

/// Checks one name of [`SandboxSpec::env`].
pub(crate) fn check_extra_name(name: &OsStr) -> Result<(), SandboxError> {
    let bytes = name.as_encoded_bytes();
    if bytes.is_empty() || bytes.contains(&b'=') || bytes.contains(&0) {
        return Err(SandboxError::BadEnvName { name: name.into() });
    }
    let upper = name.to_string_lossy().to_ascii_uppercase();
    if FORBIDDEN_PREFIXES.iter().any(|p| upper.starts_with(p)) {
        return Err(SandboxError::ForbiddenEnv { name: name.into() });
    }
    Ok(())
}

/// The complete environment of the command, in order; later entries of the same name
/// replace earlier ones (so [`SandboxSpec::env`] overrides the defaults).
pub(crate) fn environment(
    spec: &SandboxSpec,
    host: &Host,
    toolchain: &ToolchainEnv,
) -> Result<Vec<(OsString, OsString)>, SandboxError> {
    let desk = |rel: &str| -> OsString {
        if rel.is_empty() {
            DESK_MOUNT.into()
        } else {
            format!("{DESK_MOUNT}/{rel}").into()
        }
    };
    let mut path = OsString::from(format!("{DESK_MOUNT}/tools/bin"));
    if let Some(bin) = &toolchain.cargo_bin {
        path.push(":");
        path.push(bin);
    }
    path.push(":");
    path.push(SYSTEM_PATH);

    let mut env: Vec<(OsString, OsString)> = vec![
        ("PATH".into(), path),
        ("HOME".into(), desk("")),
        ("DESK".into(), desk("")),
        ("TMPDIR".into(), "/tmp".into()),
        ("XDG_CACHE_HOME".into(), desk(".cache")),
        ("CARGO_HOME".into(), desk(".cache/cargo")),
        ("npm_config_cache".into(), desk(".cache/npm")),
        ("PIP_CACHE_DIR".into(), desk(".cache/pip")),
        ("UV_CACHE_DIR".into(), desk(".cache/uv")),
        ("GOPATH".into(), desk(".cache/go")),
        // installs land in tools/ (tools/bin is on PATH), not in a cache tidy may drop
        ("CARGO_INSTALL_ROOT".into(), desk("tools")),
        ("npm_config_prefix".into(), desk("tools")),
        ("GOBIN".into(), desk("tools/bin")),
    ];
    if let Some(rustup) = &toolchain.rustup_home {
        env.push(("RUSTUP_HOME".into(), rustup.into()));
    }
    for name in PASS_THROUGH {
        if let Some(v) = host.var(name) {
            env.push(((*name).into(), v.into()));
        }
    }
    if host.var("LANG").is_none() {
        env.push(("LANG".into(), "C.UTF-8".into()));
    }
    if spec.net == Net::Host {
        for name in PROXY_VARS {
            if let Some(v) = host.var(name) {
                env.push(((*name).into(), v.into()));
            }
        }
    }
    for (name, value) in &spec.env {
        check_extra_name(name)?;
        env.retain(|(n, _)| n != name);
        env.push((name.clone(), value.clone()));
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(vars: &[(&str, &str)]) -> Host {
        Host {
            vars: vars
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            interactive: false,
        }
    }

    fn get<'a>(env: &'a [(OsString, OsString)], name: &str) -> Option<&'a OsStr> {
        env.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_os_str())
    }

    #[test]
    fn only_listed_caller_variables_pass() {
        let h = host(&[
            ("TERM", "xterm"),
            ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
            ("DESKFS_HOME", "/x"),
            ("HOME", "/root"),
            ("https_proxy", "http://proxy:3128"),
        ]);
        let spec = SandboxSpec::new("/d");
        let env = environment(&spec, &h, &ToolchainEnv::default()).unwrap();
        assert_eq!(get(&env, "TERM"), Some(OsStr::new("xterm")));
        assert_eq!(get(&env, "HOME"), Some(OsStr::new("/desk")));
        assert_eq!(get(&env, "LANG"), Some(OsStr::new("C.UTF-8")));
        assert_eq!(
            get(&env, "https_proxy"),
            Some(OsStr::new("http://proxy:3128"))
        );
        assert!(get(&env, "AWS_SECRET_ACCESS_KEY").is_none());
        assert!(get(&env, "DESKFS_HOME").is_none());

        let offline = SandboxSpec {
            net: Net::None,
            ..SandboxSpec::new("/d")
        };
        let env = environment(&offline, &h, &ToolchainEnv::default()).unwrap();
        assert!(get(&env, "https_proxy").is_none());
    }

    #[test]
    fn extra_variables_override_and_are_checked() {
        let mut spec = SandboxSpec::new("/d");
        spec.env = vec![("PATH".into(), "/bin".into()), ("FOO".into(), "1".into())];
        let env = environment(&spec, &host(&[]), &ToolchainEnv::default()).unwrap();
        assert_eq!(get(&env, "PATH"), Some(OsStr::new("/bin")));
        assert_eq!(env.iter().filter(|(n, _)| n == "PATH").count(), 1);
        assert_eq!(get(&env, "FOO"), Some(OsStr::new("1")));

        for bad in [
            "AWS_ACCESS_KEY_ID",
            "aws_session_token",
            "DESKFS_ROOT",
            "AZURE_X",
        ] {
            spec.env = vec![(bad.into(), "v".into())];
            let err = environment(&spec, &host(&[]), &ToolchainEnv::default()).unwrap_err();
            assert!(
                matches!(err, SandboxError::ForbiddenEnv { .. }),
                "{bad}: {err}"
            );
        }
        for bad in ["", "A=B"] {
            spec.env = vec![(bad.into(), "v".into())];
            let err = environment(&spec, &host(&[]), &ToolchainEnv::default()).unwrap_err();
            assert!(
                matches!(err, SandboxError::BadEnvName { .. }),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn toolchain_goes_after_desk_tools() {
        let tc = ToolchainEnv {
            rustup_home: Some("/toolchain/rustup".into()),
            cargo_bin: Some("/toolchain/cargo/bin".into()),
        };
        let env = environment(&SandboxSpec::new("/d"), &host(&[]), &tc).unwrap();
        assert_eq!(
            get(&env, "PATH").unwrap(),
            OsStr::new(&format!(
                "/desk/tools/bin:/toolchain/cargo/bin:{SYSTEM_PATH}"
            ))
        );
        assert_eq!(
            get(&env, "RUSTUP_HOME"),
            Some(OsStr::new("/toolchain/rustup"))
        );
    }
}
