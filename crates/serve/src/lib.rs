//! Desks reachable from anywhere (issue 12; design record 0010): the `/v1` HTTP API
//! ([`api`]) over the desks of one desk root, with bearer tokens scoped to one desk
//! ([`tokens`]) and every path confined to that desk by the kernel ([`confine`]).
//! The binary's `deskfs serve` and `deskfs token` parse arguments and call this crate.

pub mod api;
pub mod confine;
pub mod error;
pub mod openapi;
pub mod tokens;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use error::{Code, Result, ServeError};

/// Where the server listens.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A TCP address (`127.0.0.1:8765`).
    Tcp(SocketAddr),
    /// A Unix socket path (created; an existing socket file is replaced).
    Unix(PathBuf),
}

/// Serves the desks under `root` on `listen` until `shutdown` resolves. `ready` is
/// called with the bound address (for `:0`) once the server accepts connections.
///
/// # Errors
/// `io` when the address cannot be bound or the server fails.
pub async fn serve(
    root: &Path,
    listen: Listen,
    ready: impl FnOnce(String),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let app = api::router(api::App::new(root));
    let io = |what: String, e: std::io::Error| ServeError::new(Code::Io, format!("{what}: {e}"));
    match listen {
        Listen::Tcp(addr) => {
            let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                io(
                    format!("cannot listen on {addr} (in use? pick another --listen)"),
                    e,
                )
            })?;
            let bound = l
                .local_addr()
                .map_err(|e| io("no local address".into(), e))?;
            ready(format!("http://{bound}"));
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
