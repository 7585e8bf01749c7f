//! Desks reachable from anywhere (issue 12; design record 0010): the `/v1` HTTP API
//! ([`api`]) over the desks of one desk root, with bearer tokens scoped to one desk
//! ([`tokens`]) and every path confined to that desk by the kernel ([`confine`]).
//! The binary's `deskfs serve` and `deskfs token` parse arguments and call this crate.

pub mod api;
pub mod confine;
pub mod error;
pub mod exec;
pub mod exec_journal;
pub mod fstools;
pub mod mcp;
pub mod memory;
pub mod openapi;
pub mod status;
pub mod tls;
pub mod tokens;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use error::{Code, Result, ServeError};

/// Where the server listens.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A TCP address (`127.0.0.1:8765`), plain HTTP.
    Tcp(SocketAddr),
    /// A TCP address serving HTTPS only ([`tls`]): every connection must complete a TLS
    /// handshake with `tls`'s certificate before its first request.
    Tls {
        /// The address.
        addr: SocketAddr,
        /// The certificate chain and key, checked ([`tls::TlsConfig::load`]).
        tls: tls::TlsConfig,
    },
    /// A Unix socket path (created; an existing socket file is replaced).
    Unix(PathBuf),
}

/// The `Host` header values `/mcp` accepts (DNS-rebinding protection): the loopback
/// names, plus the listening address when it is a specific one; any for a wildcard
/// address, TLS (the certificate's name is checked by the client) or a Unix socket
/// (bearer tokens guard every request either way).
fn allowed_hosts(listen: &Listen) -> Vec<String> {
    match listen {
        Listen::Tcp(a) if a.ip().is_unspecified() => Vec::new(),
        // Over TLS a rebinding page cannot pass the client's check of the certificate's
        // name, and clients use that name as the Host: any Host is taken.
        Listen::Tls { .. } => Vec::new(),
        Listen::Tcp(a) => {
            let mut v: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
            let ip = a.ip().to_string();
            if !v.contains(&ip) {
                v.push(ip);
            }
            v
        }
        Listen::Unix(_) => Vec::new(),
    }
}

/// Serves the desks under `root` on `listen` until `shutdown` resolves. `ready` is
/// called with the bound address (for `:0`) once the server accepts connections:
/// `http://IP:PORT`, `https://IP:PORT` ([`Listen::Tls`]) or `unix:PATH`.
///
/// # Errors
/// `io` when the address cannot be bound or the server fails.
pub async fn serve(
    root: &Path,
    listen: Listen,
    ready: impl FnOnce(String),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    serve_app(api::App::new(root), listen, ready, shutdown).await
}

/// [`serve`] with an [`api::App`] the caller built (e.g. with
/// [`api::App::with_exec`] and [`api::App::with_workspace_status`]).
///
/// # Errors
/// `io` when the address cannot be bound or the server fails.
pub async fn serve_app(
    state: std::sync::Arc<api::App>,
    listen: Listen,
    ready: impl FnOnce(String),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let exec = state.exec_host().clone();
    let shutdown = async move {
        shutdown.await;
        // Running commands are killed: their streams end, and so do their connections;
        // their journal entries are written before the server goes.
        exec.kill_all();
        if !exec.drain(std::time::Duration::from_secs(10)).await {
            tracing::warn!("commands still running 10 s after they were killed; stopping anyway");
        }
    };
    let app = api::router(state.clone()).merge(mcp::router(state, allowed_hosts(&listen)));
    let io = |what: String, e: std::io::Error| ServeError::new(Code::Io, format!("{what}: {e}"));
    let bind = |addr: SocketAddr| async move {
        let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            io(
                format!("cannot listen on {addr} (in use? pick another --listen)"),
                e,
            )
        })?;
        let bound = l
            .local_addr()
            .map_err(|e| io("no local address".into(), e))?;
        Ok::<_, ServeError>((l, bound))
    };
    match listen {
        Listen::Tcp(addr) => {
            let (l, bound) = bind(addr).await?;
            ready(format!("http://{bound}"));
            axum::serve(l, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| io("server failed".into(), e))
        }
        Listen::Tls { addr, tls } => {
            let (l, bound) = bind(addr).await?;
            let l = tls::TlsListener::new(l, &tls).map_err(|e| io("no local address".into(), e))?;
            ready(format!("https://{bound}"));
            axum::serve(l, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| io("server failed".into(), e))
        }
        Listen::Unix(path) => {
            if std::fs::symlink_metadata(&path)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            {
                let _ = std::fs::remove_file(&path);
            }
            let l = tokio::net::UnixListener::bind(&path)
                .map_err(|e| io(format!("cannot listen on {}", path.display()), e))?;
            ready(format!("unix:{}", path.display()));
            let r = axum::serve(l, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| io("server failed".into(), e));
            let _ = std::fs::remove_file(&path);
            r
        }
    }
}
