//! The control socket of a mount daemon: newline-delimited JSON requests
//! (`{"cmd":"sync"}`, `{"cmd":"status"}`) answered with `{"ok":true,...}` or
//! `{"ok":false,"error":"..."}`. Used by `deskfs sync`, `status` and `umount`, and by
//! `deskfs exec` for its journal:
//!
//! `{"cmd":"changes","since":CURSOR,"prefix":"desks/alice/","limit":N}` →
//! `{"ok":true,"cursor":NEXT,"overflowed":bool,"unresolved":N,"more":bool,"changes":[
//! {"seq":S,"kind":"created|changed|deleted|renamed","path":"…","to":"…","dir":bool}]}`
//! (the mount's change ring, see `deskfs_vfs::change_ring`); `"since":null` (or none)
//! answers `{"ok":true,"cursor":NOW}` only.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use deskfs_vfs::Vfs;

use crate::keeper::Keeper;
use serde_json::{json, Value};

/// Serves the control socket at `path` until the process exits, on a thread of its own:
/// its `accept` never returns by itself, so on the runtime's blocking pool it held the
/// daemon's exit for the whole shutdown grace (2 s added to every `deskfs umount`).
pub fn serve(path: &Path, vfs: Arc<Vfs>, keeper: Option<Arc<Keeper>>) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("cannot create control socket {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    std::thread::Builder::new()
        .name("deskfs-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let vfs = vfs.clone();
                let keeper = keeper.clone();
                std::thread::spawn(move || {
                    let _ = handle(conn, &vfs, keeper.as_deref());
                });
            }
        })
        .context("cannot start the control socket's thread")?;
    Ok(())
}

fn handle(conn: UnixStream, vfs: &Vfs, keeper: Option<&Keeper>) -> Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let req: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    let resp = match req.get("cmd").and_then(Value::as_str) {
        Some("sync") => {
            let secs = req.get("timeout").and_then(Value::as_u64).unwrap_or(3600);
            // Uploads first, then the metadata backup that names them: after `sync`
            // returns, a new machine rebuilds exactly this state from the bucket.
            let backup = |()| match keeper {
                Some(k) => k
                    .flush()
                    .map(|_| ())
                    .map_err(|e| (e.to_string(), Stage::Backup)),
                None => Ok(()),
            };
            match vfs
                .sync(Duration::from_secs(secs))
                .map_err(|e| (e.to_string(), Stage::Uploads))
                .and_then(backup)
            {
                Ok(()) => json!({"ok": true}),
                Err((e, stage)) => json!({"ok": false, "error": e, "stage": stage}),
            }
        }
        Some("status") => match vfs.status().map(serde_json::to_value) {
            Ok(Ok(mut s)) => {
                // Kernel requests served by this daemon, per kind (count, total ns).
                s["requests"] = json!(deskfs_fuse::stats::snapshot());
                // Error replies by errno name (as the metrics endpoint has them).
                s["errors"] = deskfs_fuse::stats::errors()
                    .into_iter()
                    .map(|(e, n)| (crate::metrics::errno_name(e), json!(n)))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
                if let Some(k) = keeper {
                    s["backup"] = json!(k.status());
                }
                json!({"ok": true, "status": s})
            }
            Ok(Err(e)) => json!({"ok": false, "error": e.to_string()}),
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        },
        Some("changes") => changes(vfs, &req),
        Some("commit") => match vfs.commit_all() {
            // `deskfs umount --no-wait`: no upload drain when the unmount follows.
            Ok(()) if req.get("exit").and_then(Value::as_str) == Some("now") => {
                crate::daemon::EXIT_WITHOUT_DRAIN.store(true, std::sync::atomic::Ordering::SeqCst);
                json!({"ok": true})
            }
            Ok(()) => json!({"ok": true}),
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        },
        _ => json!({"ok": false, "error": "unknown command"}),
    };
    let mut w = conn;
    writeln!(w, "{resp}")?;
    Ok(())
}

/// Changes asked for at most per `changes` request.
const CHANGES_MAX: u64 = deskfs_vfs::change_ring::RING_ENTRIES as u64;

/// The `changes` command (see the module docs).
fn changes(vfs: &Vfs, req: &Value) -> Value {
    let since = match req.get("since") {
        None | Some(Value::Null) => return json!({"ok": true, "cursor": vfs.change_cursor()}),
        Some(v) => match v.as_u64() {
            Some(c) => c,
            None => return json!({"ok": false, "error": "since: a cursor (a number) or null"}),
        },
    };
    let prefix = match req.get("prefix") {
        None | Some(Value::Null) => "",
        Some(Value::String(p)) => p.as_str(),
        Some(_) => return json!({"ok": false, "error": "prefix: a workspace path (a string)"}),
    };
    let limit = match req.get("limit") {
        None | Some(Value::Null) => CHANGES_MAX,
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => n.min(CHANGES_MAX),
            _ => return json!({"ok": false, "error": "limit: a positive number"}),
        },
    };
    match vfs.changes_since(since, prefix.as_bytes(), limit as usize) {
        Ok(page) => {
            let mut v = json!(page);
            v["ok"] = json!(true);
            v
        }
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    }
}

/// The change ring's cursor of the daemon at `socket`.
///
/// Errors: the daemon is unreachable or answers with an error.
pub fn change_cursor(socket: &Path) -> Result<u64> {
    let v = request(
        socket,
        json!({"cmd": "changes", "since": null}),
        Some(REPLY_WAIT),
    )?;
    v.get("cursor")
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("the mount daemon answered without a cursor"))
}

/// The changes of the daemon at `socket` from cursor `since` under workspace path
/// `prefix`, at most `limit`.
///
/// Errors: the daemon is unreachable, answers with an error or with a malformed page.
pub fn changes_since(
    socket: &Path,
    since: u64,
    prefix: &str,
    limit: usize,
) -> Result<deskfs_desk::journal::RingPage> {
    let v = request(
        socket,
        json!({"cmd": "changes", "since": since, "prefix": prefix, "limit": limit}),
        Some(REPLY_WAIT),
    )?;
    serde_json::from_value(v).context("the mount daemon answered `changes` with a malformed page")
}

/// How long a `changes` request waits for its answer.
const REPLY_WAIT: Duration = Duration::from_secs(30);

/// Sends one request to a daemon and returns its response (`ok` checked).
pub fn request(socket: &Path, req: Value, timeout: Option<Duration>) -> Result<Value> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("cannot reach the mount daemon at {}", socket.display()))?;
    s.set_read_timeout(timeout)?;
    writeln!(s, "{req}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line)
        .map_err(|_| anyhow!("the mount daemon closed the connection"))?;
    if v.get("ok").and_then(Value::as_bool) != Some(true) {
        let msg = v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("unknown error")
            .to_string();
        let stage = v
            .get("stage")
            .and_then(|s| serde_json::from_value(s.clone()).ok());
        return Err(DaemonError { msg, stage }.into());
    }
    Ok(v)
}

/// Which step of a `sync` request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Uploads did not all reach the bucket in time (or failed).
    Uploads,
    /// Every upload landed, but the metadata backup naming them was not written.
    Backup,
}

/// A request the daemon answered with an error.
#[derive(Debug, thiserror::Error)]
#[error("{msg}")]
pub struct DaemonError {
    /// The daemon's one-line message.
    pub msg: String,
    /// For `sync`: the step that failed.
    pub stage: Option<Stage>,
}
