//! Bearer tokens scoped to one desk. A token is `dsk_<agent>_<43 base64url chars>` (32
//! random bytes), shown once when made; the store keeps only its SHA-256, with the agent
//! it opens, its scope (read-write or read-only), when it was made, when it expires and
//! when it was revoked, in `<desk root>/.deskfs-tokens.toml` (mode 0600; the name is no
//! valid agent name, so no desk can hold it; on a deskfs mount every host serving the
//! workspace sees the same tokens). The file is changed under a `flock` of
//! `.deskfs-tokens.lock` and replaced atomically (temporary file, `fsync`, rename, `fsync`
//! of the directory). Lookups compare digests in constant time.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{Code, Result, ServeError};

/// File name of the store under the desk root.
pub const STORE_NAME: &str = ".deskfs-tokens.toml";
const LOCK_NAME: &str = ".deskfs-tokens.lock";

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Read and change the desk, run commands.
    ReadWrite,
    /// Read only: every change and every command is refused (`read_only_token`).
    ReadOnly,
}

/// One token as stored (never the token itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Short id for `token list` / `token revoke`: the first 12 hex digits of the digest.
    pub id: String,
    /// The desk it opens.
    pub agent: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    /// What it may do.
    pub scope: Scope,
    /// Made at, seconds since the epoch.
    pub created: u64,
    /// Expires at, seconds since the epoch (`None`: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
    /// Revoked at, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<u64>,
    /// The creation time of the desk it was made for (`desk.toml`): a desk removed and
    /// made again under the same name is not opened by the old desk's tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desk_created: Option<u64>,
}

/// What a verified token grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The desk it opens.
    pub agent: String,
    /// What it may do there.
    pub scope: Scope,
    /// The token's id.
    pub id: String,
    /// The creation time of the desk it was made for.
    pub desk_created: Option<u64>,
}

impl Grant {
    /// Checks that the desk the token was made for is the one there now (created at
    /// `created`).
    ///
    /// # Errors
    /// `token_revoked` when that desk was removed (and perhaps made again).
    pub fn same_desk(&self, created: u64) -> Result<()> {
        match self.desk_created {
            Some(c) if c != created => Err(ServeError::new(
                Code::TokenRevoked,
                format!(
                    "this token was made for a desk of {:?} that was removed; make a new one with `deskfs token create {}`",
                    self.agent, self.agent
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Checks that this grant opens `agent`'s desk, for a change when `write`.
    ///
    /// # Errors
    /// `token_scope` (another desk), `read_only_token` (a change with a read-only token).
    pub fn allows(&self, agent: &str, write: bool) -> Result<()> {
        if self.agent != agent {
            return Err(ServeError::new(
                Code::TokenScope,
                format!(
                    "this token opens the desk of {:?}, not {agent:?}; use a token made with `deskfs token create {agent}`",
                    self.agent
                ),
            ));
        }
        if write && self.scope == Scope::ReadOnly {
            return Err(ServeError::new(
                Code::ReadOnlyToken,
                "this token is read-only; changes and commands need a token made without --read-only",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StoreFile {
    #[serde(default)]
    token: Vec<TokenRecord>,
}

/// The token store of one desk root.
#[derive(Clone, Debug)]
pub struct TokenStore {
    root: PathBuf,
}

/// Now, seconds since the epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn digest_hex(token: &str) -> String {
    let d = Sha256::digest(token.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn io_err(doing: &str, path: &Path, e: std::io::Error) -> ServeError {
    ServeError::new(Code::Io, format!("cannot {doing} {}: {e}", path.display()))
}

impl TokenStore {
    /// The store of the desk root `root`.
    pub fn at(root: &Path) -> TokenStore {
        TokenStore {
            root: root.to_path_buf(),
        }
    }

    /// Path of the store file.
    pub fn path(&self) -> PathBuf {
        self.root.join(STORE_NAME)
    }

    fn read(&self) -> Result<StoreFile> {
        let p = self.path();
        match std::fs::read_to_string(&p) {
            Ok(text) => toml::from_str(&text).map_err(|e| {
                ServeError::new(
                    Code::Io,
                    format!(
                        "token store {} is damaged ({}); fix or remove it and make new tokens",
                        p.display(),
                        e.message()
                    ),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StoreFile::default()),
            Err(e) => Err(io_err("read", &p, e)),
        }
    }

    /// Runs `f` on the store under its lock and writes the result back atomically.
    fn change<T>(&self, f: impl FnOnce(&mut StoreFile) -> Result<T>) -> Result<T> {
        let lock_path = self.root.join(LOCK_NAME);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io_err("open", &lock_path, e))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io_err("lock", &lock_path, std::io::Error::last_os_error()));
        }
        let mut store = self.read()?;
        let out = f(&mut store)?;
        let text = toml::to_string(&store).map_err(|e| {
            ServeError::new(Code::Io, format!("cannot encode the token store: {e}"))
        })?;
        let p = self.path();
        let tmp = self
            .root
            .join(format!("{STORE_NAME}.tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &p)?;
            File::open(&self.root)?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err("write", &p, e));
        }
        drop(lock);
        Ok(out)
    }

    /// Makes a token for `agent`'s desk (created at `desk_created`) with `scope`, expiring after `ttl` (never when
    /// `None`). Returns the token (shown once; only its digest is kept) and its record.
    ///
    /// # Errors
    /// `io` (the store cannot be read or written, or no random bytes).
    pub fn create(
        &self,
        agent: &str,
        desk_created: Option<u64>,
        scope: Scope,
        ttl: Option<Duration>,
    ) -> Result<(String, TokenRecord)> {
        let mut secret = [0u8; 32];
        getrandom::getrandom(&mut secret)
            .map_err(|e| ServeError::new(Code::Io, format!("no random bytes for a token: {e}")))?;
        let token = format!(
            "dsk_{agent}_{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
        );
        let sha256 = digest_hex(&token);
        let now = now_secs();
        let rec = TokenRecord {
            id: sha256[..12].to_owned(),
            agent: agent.to_owned(),
            sha256,
            scope,
            created: now,
            expires: ttl.map(|d| now.saturating_add(d.as_secs())),
            revoked: None,
            desk_created,
        };
        let r = rec.clone();
        self.change(move |s| {
            s.token.push(r);
            Ok(())
        })?;
        Ok((token, rec))
    }

    /// Every token record, oldest first.
    ///
    /// # Errors
    /// `io` (the store cannot be read or is damaged).
    pub fn list(&self) -> Result<Vec<TokenRecord>> {
        Ok(self.read()?.token)
    }

    /// Revokes the token whose id starts with `id` (at least 6 hex digits, matching one
    /// token). Revoking a revoked token changes nothing.
    ///
    /// # Errors
    /// `not_found` (no such token), `bad_request` (too short or ambiguous), `io`.
    pub fn revoke(&self, id: &str) -> Result<TokenRecord> {
        if id.len() < 6 {
            return Err(ServeError::new(
                Code::BadRequest,
                format!("token id {id:?} is too short; give at least 6 characters of an id from `deskfs token list`"),
            ));
        }
        self.change(|s| {
            let mut hits = s.token.iter_mut().filter(|t| t.id.starts_with(id));
            let Some(t) = hits.next() else {
                return Err(ServeError::new(
                    Code::NotFound,
                    format!("no token with id {id:?}; see `deskfs token list`"),
                ));
            };
            if hits.next().is_some() {
                return Err(ServeError::new(
                    Code::BadRequest,
                    format!("token id {id:?} matches several tokens; give more of it"),
                ));
            }
            if t.revoked.is_none() {
                t.revoked = Some(now_secs());
            }
            Ok(t.clone())
        })
    }

    /// The grant of `token` at `now` (seconds since the epoch).
    ///
    /// # Errors
    /// `unauthorized` (malformed or unknown), `token_revoked`, `token_expired`, `io`.
    pub fn verify(&self, token: &str, now: u64) -> Result<Grant> {
        let unknown = || {
            ServeError::new(
                Code::Unauthorized,
                "unknown token; send `Authorization: Bearer <token>` with a token from `deskfs token create AGENT`",
            )
        };
        if !token.starts_with("dsk_") || token.len() > 200 {
            return Err(unknown());
        }
        let want = digest_hex(token);
        let store = self.read()?;
        let mut found = None;
        for t in &store.token {
            // Constant time over each digest, and every record is looked at.
            if bool::from(t.sha256.as_bytes().ct_eq(want.as_bytes())) {
                found = Some(t);
            }
        }
        let t = found.ok_or_else(unknown)?;
        if t.revoked.is_some() {
            return Err(ServeError::new(
                Code::TokenRevoked,
                format!(
                    "token {} was revoked; make a new one with `deskfs token create {}`",
                    t.id, t.agent
                ),
            ));
        }
        if t.expires.is_some_and(|e| now >= e) {
            return Err(ServeError::new(
                Code::TokenExpired,
                format!(
                    "token {} has expired; make a new one with `deskfs token create {}`",
                    t.id, t.agent
                ),
            ));
        }
        Ok(Grant {
            agent: t.agent.clone(),
            scope: t.scope,
            id: t.id.clone(),
            desk_created: t.desk_created,
        })
    }
}

/// Parses a lifetime such as `90s`, `30m`, `12h`, `7d` or `2w`.
///
/// # Errors
/// `bad_request` naming the accepted forms.
pub fn parse_ttl(s: &str) -> Result<Duration> {
    let bad = || {
        ServeError::new(
            Code::BadRequest,
            format!("invalid lifetime {s:?}: use a number with s, m, h, d or w, e.g. 7d"),
        )
    };
    let s = s.trim();
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(bad()),
    };
    if n == 0 {
        return Err(bad());
    }
    Ok(Duration::from_secs(n.checked_mul(mult).ok_or_else(bad)?))
}
