//! AWS's shared config and credentials files, read as the AWS CLI and SDKs read them, so
//! a machine set up with `aws configure` mounts an `s3://` workspace without exporting
//! keys (object_store reads only the environment).
//!
//! Source: AWS SDKs and Tools Reference Guide, "Shared config and credentials files":
//! - files: `AWS_SHARED_CREDENTIALS_FILE` (default `~/.aws/credentials`) and
//!   `AWS_CONFIG_FILE` (default `~/.aws/config`);
//! - profile: `AWS_PROFILE` (default `default`); in the credentials file its section is
//!   `[NAME]`, in the config file `[profile NAME]` (`[default]` for the default one);
//! - keys: `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token` (the
//!   credentials file first, then the config file), `region` and `endpoint_url` (config
//!   file);
//! - syntax: `key = value` (or `key: value`) lines, `#` or `;` comments, and indented
//!   lines after a setting continue it (a sub-section such as `s3 =`);
//! - only regular files are read (a FIFO or device named there counts as no file).
//!
//! Environment variables win over both files (the caller applies them first); the
//! credentials file is read only when the keys must come from the files. Profiles whose
//! credentials the AWS CLI takes before static keys (`role_arn`, SSO, a web identity) or
//! from a `credential_process` without static keys are refused with one line naming the
//! setting, since deskfs cannot follow them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::{BucketError, Result};

/// What a profile of the shared files gives an S3 bucket. Every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwsProfile {
    /// The profile's name.
    pub name: String,
    /// `aws_access_key_id`.
    pub access_key_id: Option<String>,
    /// `aws_secret_access_key`.
    pub secret_access_key: Option<String>,
    /// `aws_session_token` (temporary credentials).
    pub session_token: Option<String>,
    /// `region`.
    pub region: Option<String>,
    /// `endpoint_url` (an S3-compatible server).
    pub endpoint_url: Option<String>,
}

/// Settings of profiles whose credentials the AWS CLI takes before static keys (assume
/// role, SSO, web identity), which deskfs does not follow.
const BEFORE_KEYS: [&str; 6] = [
    "role_arn",
    "web_identity_token_file",
    "sso_session",
    "sso_start_url",
    "sso_account_id",
    "sso_role_name",
];

/// The largest shared file read, bytes: these files hold a few profiles.
const MAX_FILE: u64 = 1 << 20;

/// Reads the profile named by `AWS_PROFILE` (or `default`) from the shared files, with
/// `env` giving the environment (`HOME`, `AWS_PROFILE`, `AWS_SHARED_CREDENTIALS_FILE`,
/// `AWS_CONFIG_FILE`; a leading `~/` in the two paths is `HOME`). `need_keys`: the
/// credentials must come from the files (none in the flags or the environment).
///
/// Returns `Ok(None)` when neither file exists, or when the `default` profile (not asked
/// for by name) is in neither. A path that names no regular file counts as no file, as
/// the AWS CLI has it.
///
/// # Errors
/// [`BucketError::Config`] with one line naming the file and the fix when the config
/// file (or, with `need_keys`, the credentials file) cannot be read or parsed
/// (`FILE:LINE`) or exceeds 1 MiB, when a profile named by `AWS_PROFILE` is in neither
/// file, and with `need_keys` when the profile holds a key id without a secret (or the
/// reverse) or gets its credentials from `role_arn`, SSO, a web identity, or a
/// `credential_process` without static keys.
pub fn load(env: impl Fn(&str) -> Option<String>, need_keys: bool) -> Result<Option<AwsProfile>> {
    let get = |k: &str| env(k).filter(|v| !v.is_empty());
    let home = get("HOME").map(PathBuf::from);
    let file = |var: &str, rel: &str| match get(var) {
        Some(v) => match (v.strip_prefix("~/"), &home) {
            (Some(rest), Some(h)) => Some(h.join(rest)),
            _ => Some(PathBuf::from(v)),
        },
        None => home.as_ref().map(|h| h.join(rel)),
    };
    let named = get("AWS_PROFILE");
    let name = named.clone().unwrap_or_else(|| "default".to_owned());
    let cred_path = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    let conf_path = file("AWS_CONFIG_FILE", ".aws/config");
    let creds = match &cred_path {
        Some(p) => match read_sections(p) {
            Ok(s) => s,
            Err(e) if need_keys => return Err(e),
            // The AWS CLI reads the credentials file only when it needs keys.
            Err(_) => None,
        },
        None => None,
    };
    let conf = match &conf_path {
        Some(p) => read_sections(p)?,
        None => None,
    };
    if creds.is_none() && conf.is_none() {
        return match named {
            Some(n) => Err(BucketError::Config(format!(
                "AWS_PROFILE={n} but there is no AWS shared credentials or config file ({}, {}); create it with `aws configure --profile {n}` or unset AWS_PROFILE",
                show(&cred_path),
                show(&conf_path)
            ))),
            None => Ok(None),
        };
    }
    let conf_sections: Vec<String> = if name == "default" {
        vec!["default".to_owned(), "profile default".to_owned()]
    } else {
        vec![format!("profile {name}")]
    };
    let from_creds = creds.as_ref().and_then(|s| s.get(&name));
    let from_conf = conf
        .as_ref()
        .and_then(|s| conf_sections.iter().find_map(|n| s.get(n)));
    if from_creds.is_none() && from_conf.is_none() {
        return match named {
            Some(n) => Err(BucketError::Config(format!(
                "AWS_PROFILE={n}: no profile [{n}] in {} and no [{}] in {}; fix the name or add it with `aws configure --profile {n}`",
                show(&cred_path),
                conf_sections[0],
                show(&conf_path)
            ))),
            None => Ok(None),
        };
    }
    let in_creds = |k: &str| from_creds.and_then(|s| s.get(k)).filter(|v| !v.is_empty());
    let in_conf = |k: &str| from_conf.and_then(|s| s.get(k)).filter(|v| !v.is_empty());
    // Keys: the credentials file first, then the config file; region and endpoint are
    // config settings.
    let key = |k: &str| in_creds(k).or_else(|| in_conf(k)).cloned();
    let p = AwsProfile {
        name: name.clone(),
        access_key_id: key("aws_access_key_id"),
        secret_access_key: key("aws_secret_access_key"),
        session_token: key("aws_session_token"),
        region: in_conf("region").cloned(),
        endpoint_url: in_conf("endpoint_url").cloned(),
    };
    if need_keys {
        let set = |k: &str| in_creds(k).or_else(|| in_conf(k)).is_some();
        let static_keys = p.access_key_id.is_some() || p.secret_access_key.is_some();
        let other = BEFORE_KEYS.iter().find(|k| set(k)).or_else(|| {
            ["credential_process"]
                .iter()
                .find(|k| !static_keys && set(k))
        });
        if let Some(k) = other {
            return Err(BucketError::Config(format!(
                "AWS profile {name} gets its credentials with {k}, which deskfs does not follow; export them first (`eval \"$(aws configure export-credentials --profile {name} --format env)\"`) or give the profile aws_access_key_id and aws_secret_access_key"
            )));
        }
        if p.access_key_id.is_some() != p.secret_access_key.is_some() {
            let (has, lacks) = if p.access_key_id.is_some() {
                ("aws_access_key_id", "aws_secret_access_key")
            } else {
                ("aws_secret_access_key", "aws_access_key_id")
            };
            return Err(BucketError::Config(format!(
                "AWS profile {name} has {has} but no {lacks} ({}); add it with `aws configure --profile {name}`",
                show(&cred_path)
            )));
        }
    }
    Ok(Some(p))
}

fn show(p: &Option<PathBuf>) -> String {
    p.as_ref().map_or_else(
        || "no HOME to find it".to_owned(),
        |p| p.display().to_string(),
    )
}

type Sections = HashMap<String, HashMap<String, String>>;

/// The sections of one shared file, or `None` when there is no regular file there (a
/// FIFO or a device is never opened).
fn read_sections(path: &Path) -> Result<Option<Sections>> {
    let meta = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => m,
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(BucketError::Config(format!(
                "cannot read the AWS shared file {}: {e}",
                path.display()
            )))
        }
    };
    if meta.len() > MAX_FILE {
        return Err(BucketError::Config(format!(
            "AWS shared file {} is {} bytes, more than a shared file holds (1 MiB at most); point AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE at the right file",
            path.display(),
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| {
        BucketError::Config(format!(
            "cannot read the AWS shared file {}: {e}",
            path.display()
        ))
    })?;
    let text = String::from_utf8_lossy(&bytes);
    parse(text.trim_start_matches('\u{feff}'))
        .map(Some)
        .map_err(|(line, why)| {
            BucketError::Config(format!(
                "AWS shared file {}:{line}: {why}; fix that line (see `aws configure`)",
                path.display()
            ))
        })
}

/// Parses the shared-file syntax; the error is the 1-based line and what is wrong there.
/// A setting is `key = value` or `key: value` (the first `=` or `:`); an indented line
/// after a setting continues it (a sub-section such as `s3 =` and its keys) and is not
/// read; a later section or key of the same name replaces the earlier one.
fn parse(text: &str) -> std::result::Result<Sections, (usize, &'static str)> {
    let mut out = Sections::new();
    let mut section: Option<String> = None;
    // A setting was read in this section: indented lines after it continue it.
    let mut after_key = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') || body.starts_with(';') {
            continue;
        }
        let indented = body.len() != line.len();
        if indented && after_key {
            continue;
        }
        if let Some(rest) = body.strip_prefix('[') {
            let name = rest
                .strip_suffix(']')
                .ok_or((i + 1, "a section header without its closing ]"))?;
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            out.entry(name.clone()).or_default();
            section = Some(name);
            after_key = false;
            continue;
        }
        let Some(at) = body.find(['=', ':']) else {
            return Err((i + 1, "a line that is neither [section] nor key = value"));
        };
        let Some(sec) = &section else {
            return Err((i + 1, "a setting before any [section]"));
        };
        let (k, v) = (
            body[..at].trim().to_ascii_lowercase(),
            body[at + 1..].trim().to_owned(),
        );
        after_key = true;
        out.entry(sec.clone()).or_default().insert(k, v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p.display().to_string()
    }

    #[test]
    fn the_named_profile_comes_from_both_files_with_the_credentials_file_first() {
        let d = tempfile::tempdir().expect("tempdir");
        let cred = write(
            d.path(),
            "credentials",
            "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n# a comment\n[work]\naws_access_key_id=WORKKEY\naws_secret_access_key = work/secret=\naws_session_token = tok\n",
        );
        let conf = write(
            d.path(),
            "config",
            "[default]\nregion = eu-west-1\n[profile work]\nregion = garage\nendpoint_url = http://127.0.0.1:3900\naws_access_key_id = IGNORED\ns3 =\n  addressing_style = path\n  endpoint_url = http://elsewhere\n",
        );
        let env = env_of(&[
            ("AWS_SHARED_CREDENTIALS_FILE", cred.clone()),
            ("AWS_CONFIG_FILE", conf.clone()),
            ("AWS_PROFILE", "work".into()),
        ]);
        let p = load(env, true).expect("load").expect("a profile");
        assert_eq!(
            p,
            AwsProfile {
                name: "work".into(),
                access_key_id: Some("WORKKEY".into()),
                secret_access_key: Some("work/secret=".into()),
                session_token: Some("tok".into()),
                region: Some("garage".into()),
                endpoint_url: Some("http://127.0.0.1:3900".into()),
            }
        );
        let env = env_of(&[
            ("AWS_SHARED_CREDENTIALS_FILE", cred),
            ("AWS_CONFIG_FILE", conf),
        ]);
        let p = load(env, true).expect("load").expect("the default profile");
        assert_eq!(p.access_key_id.as_deref(), Some("DEF"));
        assert_eq!(p.region.as_deref(), Some("eu-west-1"));
        assert_eq!(p.endpoint_url, None);
    }

    #[test]
    fn files_are_found_under_home_and_their_absence_is_no_profile() {
        let d = tempfile::tempdir().expect("tempdir");
        let home = d.path().display().to_string();
        assert_eq!(
            load(env_of(&[("HOME", home.clone())]), true).expect("load"),
            None
        );
        assert_eq!(load(env_of(&[]), true).expect("load"), None);
        std::fs::create_dir(d.path().join(".aws")).expect("mkdir");
        write(
            &d.path().join(".aws"),
            "credentials",
            "[default]\naws_access_key_id = A\naws_secret_access_key = S\n",
        );
        let p = load(env_of(&[("HOME", home)]), true)
            .expect("load")
            .expect("profile");
        assert_eq!(p.access_key_id.as_deref(), Some("A"));
    }

    #[test]
    fn bad_profiles_and_files_are_one_line_naming_the_fix() {
        let d = tempfile::tempdir().expect("tempdir");
        let cases = [
            (
                "[default]\naws_access_key_id = A\n",
                "has aws_access_key_id but no aws_secret_access_key",
            ),
            (
                "[default]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = b\n",
                "role_arn",
            ),
            (
                "[default]\ncredential_process = /bin/true\n",
                "credential_process",
            ),
            (
                "aws_access_key_id = A\n",
                ":1: a setting before any [section]",
            ),
            ("[default\n", ":1: a section header without its closing ]"),
            ("[default]\njust words\n", ":2: a line that is neither"),
        ];
        for (text, want) in cases {
            let cred = write(d.path(), "credentials", text);
            let env = env_of(&[("AWS_SHARED_CREDENTIALS_FILE", cred)]);
            let err = load(env, true).expect_err(text).to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        let cred = write(
            d.path(),
            "credentials",
            "[default]\naws_access_key_id = A\naws_secret_access_key = S\n",
        );
        let env = env_of(&[
            ("AWS_SHARED_CREDENTIALS_FILE", cred),
            ("AWS_PROFILE", "nosuch".into()),
        ]);
        let err = load(env, false)
            .expect_err("a missing named profile")
            .to_string();
        assert!(
            err.contains("AWS_PROFILE=nosuch: no profile [nosuch]"),
            "{err}"
        );
        let env = env_of(&[
            ("HOME", d.path().join("nohome").display().to_string()),
            ("AWS_PROFILE", "x".into()),
        ]);
        let err = load(env, true).expect_err("no files at all").to_string();
        assert!(
            err.contains("no AWS shared credentials or config file"),
            "{err}"
        );
    }

    #[test]
    fn the_aws_cli_syntax_and_precedence_are_kept() {
        let d = tempfile::tempdir().expect("tempdir");
        let home = d.path().display().to_string();
        std::fs::create_dir(d.path().join(".aws")).expect("mkdir");
        // `key: value`, a BOM, CRLF, a continued value, [profile default], static keys
        // beside a credential_process.
        write(
            &d.path().join(".aws"),
            "config",
            "\u{feff}[profile default]\r\nregion: here-1\r\nendpoint_url = http://127.0.0.1:9\r\nnote = a\r\n  region = not-a-key\r\ncredential_process = /bin/false\r\naws_access_key_id = K\r\naws_secret_access_key = S\r\n",
        );
        // `~/` in the variable is HOME.
        let env = env_of(&[
            ("HOME", home.clone()),
            ("AWS_CONFIG_FILE", "~/.aws/config".into()),
        ]);
        let p = load(env, true).expect("load").expect("profile");
        assert_eq!(p.region.as_deref(), Some("here-1"));
        assert_eq!(p.endpoint_url.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(p.access_key_id.as_deref(), Some("K"));
        // Keys given elsewhere: a broken credentials file is not read, the config is.
        let garbage = write(d.path(), "garbage", "\0\x01 not ini\n");
        let env = env_of(&[
            ("HOME", home.clone()),
            ("AWS_SHARED_CREDENTIALS_FILE", garbage.clone()),
        ]);
        let p = load(&env, false).expect("load").expect("profile");
        assert_eq!(p.endpoint_url.as_deref(), Some("http://127.0.0.1:9"));
        assert!(load(&env, true).is_err());
        // A FIFO (or a device) is no file: never opened, so never waited on.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.display().to_string()).expect("path");
        // SAFETY: a NUL-terminated path alive for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let env = env_of(&[
            ("HOME", home.clone()),
            ("AWS_SHARED_CREDENTIALS_FILE", fifo.display().to_string()),
        ]);
        assert!(load(env, true).expect("load").is_some());
        let env = env_of(&[
            ("HOME", home),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/zero".into()),
        ]);
        assert!(load(env, true).expect("load").is_some());
    }
}
