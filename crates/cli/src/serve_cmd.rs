//! `deskfs serve` (the desks' HTTP API) and `deskfs token create|list|revoke` (bearer
//! tokens scoped to one desk). The work is in the deskfs-serve crate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use deskfs_desk::fsutil::utc_iso;
use deskfs_serve::tokens::{parse_ttl, Scope, TokenStore};
use deskfs_serve::Listen;
use serde_json::{json, Value};

use crate::desk_root::RootArgs;

/// Arguments of `deskfs serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub root: RootArgs,
    /// TCP address to listen on (loopback by default; port 0 picks a free one).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8765",
        conflicts_with = "socket"
    )]
    pub listen: String,
    /// Listen on a Unix socket instead of TCP.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Serve HTTPS only, with this certificate chain (PEM, the server's certificate
    /// first). Needs --tls-key; TCP only.
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1, not encrypted).
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// Commands (exec over HTTP and MCP) run at once, over all desks; past it a command
    /// is refused with 429 too_many_commands.
    #[arg(long, value_name = "N", default_value_t = deskfs_serve::exec::DEFAULT_MAX_RUNNING as u16,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_commands: u16,
}

/// Arguments of `deskfs token`.
#[derive(Args, Debug)]
pub struct TokenArgs {
    #[command(flatten)]
    pub root: RootArgs,
    #[command(subcommand)]
    pub cmd: TokenCmd,
}

/// `deskfs token` subcommands.
#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a bearer token that opens AGENT's desk (printed once; only its hash is kept).
    #[command(
        after_help = "Examples:\n  deskfs token create alice\n  deskfs token create alice --read-only --expires 7d\n  TOKEN=$(deskfs token create alice --expires 12h)"
    )]
    Create {
        /// Agent whose desk the token opens.
        agent: String,
        /// Reads only: changes and commands are refused.
        #[arg(long)]
        read_only: bool,
        /// Lifetime: a number with s, m, h, d or w (default: no expiry).
        #[arg(long, value_name = "TTL")]
        expires: Option<String>,
    },
    /// List tokens (ids, desks, scopes, expiry, revocation; never the tokens).
    #[command(after_help = "Examples:\n  deskfs token list\n  deskfs token list --json")]
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its id (at least 6 characters of it, from `token list`).
    #[command(after_help = "Examples:\n  deskfs token revoke 3fa2c1")]
    Revoke {
        /// Token id (or its first characters).
        id: String,
    },
}

/// `deskfs serve`.
pub fn serve(a: ServeArgs) -> Result<()> {
    let root = a.root.resolve()?;
    if !root.is_dir() {
        bail!(
            "desk root {} does not exist; create a desk first (`deskfs desk create AGENT`) or pass --root",
            root.display()
        );
    }
    let tls = match (&a.tls_cert, &a.tls_key) {
        (None, None) => None,
        (Some(_), None) => bail!(
            "--tls-cert needs --tls-key: give both (the certificate chain and its private key, PEM) or neither"
        ),
        (None, Some(_)) => bail!(
            "--tls-key needs --tls-cert: give both (the certificate chain and its private key, PEM) or neither"
        ),
        (Some(_), Some(_)) if a.socket.is_some() => bail!(
            "--tls-cert/--tls-key are for TCP: a Unix socket (--socket) is served as plain HTTP; drop --socket or the TLS flags"
        ),
        (Some(cert), Some(key)) => Some(deskfs_serve::tls::TlsConfig::load(cert, key)?),
    };
    let listen = match a.socket {
        Some(p) => Listen::Unix(crate::absolute(&p)),
        None => {
            let addr = a.listen.parse::<SocketAddr>().map_err(|_| {
                anyhow!(
                    "invalid --listen {:?}: give IP:PORT, e.g. 127.0.0.1:8765",
                    a.listen
                )
            })?;
            match tls {
                Some(tls) => Listen::Tls { addr, tls },
                None => Listen::Tcp(addr),
            }
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("deskfs-serve")
        .build()
        .context("cannot start the server's runtime")?;
    rt.block_on(async move {
        let shutdown = async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return std::future::pending().await,
                };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        let shown_root = root.display().to_string();
        let app = deskfs_serve::api::App::new(&root)
            .with_exec(exec_host().with_limit(usize::from(a.max_commands)))
            .with_workspace_status(workspace_status_of(&root));
        deskfs_serve::serve_app(
            app,
            listen,
            move |addr| {
                println!(
                    "serving the desks of {shown_root} at {addr} (API under /v1; stop with Ctrl-C)"
                );
            },
            shutdown,
        )
        .await
        .map_err(|e| anyhow!(e))
    })
}

/// What this binary adds to every command the server runs (HTTP and MCP): deskfs's
/// private host paths hidden, the caller's git identity, and the task journal with the
/// changes from the mount daemon's change ring.
pub(crate) fn exec_host() -> deskfs_serve::exec::ExecHost {
    deskfs_serve::exec::ExecHost::new()
        .hiding(crate::exec_cmd::private_paths)
        .with_env(crate::exec_cmd::git_identity())
        .with_journal(crate::journal_cmd::watch_factory())
}

/// The status of the deskfs workspace `root` is on, for one desk's status
/// (`GET /v1/desks/{agent}/status`): `None` when `root` is on no mounted workspace. Only
/// numbers and that desk's own paths (desk-relative): no host path, no other desk, no
/// bucket or database address.
fn workspace_status_of(root: &Path) -> deskfs_serve::status::WorkspaceStatus {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    Arc::new(move |agent: &str| {
        // The mount holding the root (the innermost, if mounts nest), asked each time:
        // a workspace may be mounted or unmounted while the server runs.
        let (mount, under) = crate::home::all_mounts()
            .into_iter()
            .filter_map(|m| {
                let mnt = std::fs::canonicalize(&m.mountpoint).ok()?;
                let under = root.strip_prefix(&mnt).ok()?.to_path_buf();
                Some((m, mnt.components().count(), under))
            })
            .max_by_key(|(_, depth, _)| *depth)
            .map(|(m, _, under)| (m, under))?;
        let full = match crate::status::workspace_status(&mount.workspace) {
            Ok(v) => v,
            Err(_) => {
                return Some(
                    json!({"mounted": true, "error": "the workspace's status cannot be read now; try again"}),
                )
            }
        };
        let desk_prefix = format!("{}/{agent}/", under.display())
            .trim_start_matches('/')
            .to_owned();
        Some(desk_view(&full, &desk_prefix))
    })
}

/// The parts of `deskfs status --json NAME` that a desk's token holder may see; failing
/// uploads only under `desk_prefix` (a workspace path), shown desk-relative.
fn desk_view(full: &Value, desk_prefix: &str) -> Value {
    let live = full
        .get("mounts")
        .and_then(|m| m.get(0))
        .and_then(|m| m.get("live"))
        .filter(|l| !l.is_null());
    let failing_here: Vec<Value> = full
        .get("failures")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| {
            let p = f.get("path")?.as_str()?.trim_start_matches('/');
            let rel = p.strip_prefix(desk_prefix)?;
            let error = f
                .get("error")
                .and_then(Value::as_str)
                .map(without_addresses);
            Some(json!({"path": rel, "attempts": f.get("attempts"), "error": error}))
        })
        .collect();
    let backup = full.get("backup").map(|b| {
        json!({
            "kind": b.get("kind"),
            "changes_not_backed_up": b.get("changes_not_backed_up"),
            "last_written_ns": b.get("last_written_ns"),
        })
    });
    json!({
        "mounted": true,
        "durability": live.and_then(|l| l.get("durability")),
        "files": full.get("inodes"),
        "bytes": full.get("bytes"),
        "dirty_files": full.get("dirty_files"),
        "dirty_bytes": full.get("dirty_bytes"),
        "pending_uploads": full.get("pending_uploads"),
        "failing_uploads": full.get("failing_uploads"),
        "failing_in_this_desk": failing_here,
        "bucket_conflicts": full.get("bucket_conflicts").and_then(Value::as_array).map_or(0, Vec::len),
        "cache": full.get("cache"),
        "backup": backup,
    })
}

/// `text` with every URL (`scheme://…` up to the next space or quote) replaced by
/// `<bucket>`: an upload error names the request's endpoint, bucket and key, which a
/// desk's token holder is not shown.
fn without_addresses(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let start = rest[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.'))
            .map_or(0, |j| j + 1);
        out.push_str(&rest[..start]);
        out.push_str("<bucket>");
        let tail = &rest[i + 3..];
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')' | ',' | '>'))
            .unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `deskfs token …`.
pub fn token(a: TokenArgs) -> Result<()> {
    let root = a.root.resolve()?;
    let store = TokenStore::at(&root);
    match a.cmd {
        TokenCmd::Create {
            agent,
            read_only,
            expires,
        } => {
            let desk = a.root.open(&agent)?;
            let ttl = expires.as_deref().map(parse_ttl).transpose()?;
            let scope = if read_only {
                Scope::ReadOnly
            } else {
                Scope::ReadWrite
            };
            let (tok, rec) = store.create(desk.agent(), Some(desk.meta().created), scope, ttl)?;
            println!("{tok}");
            eprintln!(
                "token {} for the desk of {} ({}{}); shown once, keep it secret",
                rec.id,
                rec.agent,
                if read_only { "read-only" } else { "read-write" },
                rec.expires
                    .map(|e| format!(", expires {}", utc_iso(e)))
                    .unwrap_or_default()
            );
        }
        TokenCmd::List { json } => {
            let list = store.list()?;
            if json {
                let v: Vec<_> = list
                    .iter()
                    .map(|t| {
                        json!({"id": t.id, "agent": t.agent, "scope": t.scope, "created": t.created,
                               "expires": t.expires, "revoked": t.revoked})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if list.is_empty() {
                println!("no tokens; make one with `deskfs token create AGENT`");
            } else {
                let now = deskfs_serve::tokens::now_secs();
                for t in list {
                    let state = match (t.revoked, t.expires) {
                        (Some(r), _) => format!("revoked {}", utc_iso(r)),
                        (None, Some(e)) if e <= now => format!("expired {}", utc_iso(e)),
                        (None, Some(e)) => format!("expires {}", utc_iso(e)),
                        (None, None) => "no expiry".to_owned(),
                    };
                    let scope = match t.scope {
                        Scope::ReadWrite => "read-write",
                        Scope::ReadOnly => "read-only",
                    };
                    println!(
                        "{}  {:<20} {:<10} made {}  {state}",
                        t.id,
                        t.agent,
                        scope,
                        utc_iso(t.created)
                    );
                }
            }
        }
        TokenCmd::Revoke { id } => {
            let t = store.revoke(&id)?;
            println!("revoked token {} of the desk of {}", t.id, t.agent);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::without_addresses;

    #[test]
    fn upload_errors_name_no_bucket_address() {
        assert_eq!(
            without_addresses(
                "Error performing PUT http://127.0.0.1:3900/bkt/desks/a/f in 1s: 503"
            ),
            "Error performing PUT <bucket> in 1s: 503"
        );
        assert_eq!(
            without_addresses("url \"https://s3.example.com/b?x=1\", and s3://b/k)"),
            "url \"<bucket>\", and <bucket>)"
        );
        assert_eq!(without_addresses("disk full"), "disk full");
    }
}
