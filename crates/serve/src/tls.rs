//! TLS for `deskfs serve` (HTTPS on the TCP listener): a certificate chain and its
//! private key read from PEM files and checked before anything listens ([`TlsConfig`]),
//! and an accept loop in which one client's failed or stalled handshake never holds up
//! another ([`TlsListener`]).
//!
//! rustls 0.23 with its `ring` provider, named explicitly: the `deskfs` binary also links
//! rustls's aws-lc-rs provider (object_store's HTTP client), which would make rustls's
//! process-wide default provider ambiguous. Protocols are rustls's safe defaults (TLS 1.3
//! and 1.2); ALPN offers `http/1.1` only, the one protocol the server speaks; no client
//! certificates (bearer tokens authenticate clients).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::error::{Code, Result, ServeError};

/// How long a client has, from its TCP connection, to complete the TLS handshake; a
/// connection still shaking hands then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest PEM file read (bytes): a certificate chain or a key is a few KiB, so a
/// larger file is a wrong one (and `/dev/zero` ends rather than filling memory).
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// Handshaken connections waiting for the server to take them.
const QUEUE: usize = 64;

/// A server's TLS configuration: its certificate chain and the matching private key,
/// checked. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TlsConfig {
    config: Arc<rustls::ServerConfig>,
}

impl TlsConfig {
    /// Reads the certificate chain in `cert` (PEM `CERTIFICATE` blocks, the server's own
    /// certificate first, then any intermediates; other blocks are skipped) and the first
    /// private key in `key` (PEM: PKCS#8 `PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY` or SEC1
    /// `EC PRIVATE KEY`, not encrypted; RSA of 2048 bits or more, ECDSA P-256/P-384 or
    /// Ed25519, as rustls's ring provider takes them). The same file may hold both.
    ///
    /// # Errors
    /// One line naming the file, the problem and the fix (it names the command-line flags
    /// `--tls-cert` / `--tls-key`): `io` when a file cannot be read (missing, unreadable,
    /// a directory, over [`MAX_PEM_BYTES`]); `bad_request` when `cert` holds no
    /// certificate or `key` no private key, a file is not valid PEM, the key is encrypted
    /// or of a kind rustls cannot use, the certificate cannot be parsed, or the key is not
    /// the certificate's (rustls's `CertifiedKey::keys_match`).
    pub fn load(cert: &Path, key: &Path) -> Result<TlsConfig> {
        let bad = |m: String| ServeError::new(Code::BadRequest, m);
        let (cert_shown, key_shown) = (cert.display(), key.display());

        let cert_pem = read_pem_file(cert, "--tls-cert", "certificate")?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| {
                bad(format!(
                    "--tls-cert {cert_shown} is not valid PEM ({}); give the server's certificate chain in PEM",
                    pem_error(&e)
                ))
            })?;
        if chain.is_empty() {
            return Err(bad(if PrivateKeyDer::from_pem_slice(&cert_pem).is_ok() {
                format!("--tls-cert {cert_shown} holds a private key, not a certificate; are --tls-cert and --tls-key swapped?")
            } else {
                format!("--tls-cert {cert_shown} holds no PEM certificate (no `-----BEGIN CERTIFICATE-----` block); give the server's certificate chain in PEM")
            }));
        }

        let key_pem = read_pem_file(key, "--tls-key", "private key")?;
        let key_der = match PrivateKeyDer::from_pem_slice(&key_pem) {
            Ok(k) => k,
            Err(pem::Error::NoItemsFound) => {
                return Err(bad(
                    if contains(&key_pem, b"-----BEGIN ENCRYPTED PRIVATE KEY-----") {
                        format!("--tls-key {key_shown} holds an encrypted private key, which the server cannot use; decrypt it (`openssl pkey -in KEY -out PLAIN.pem`) and give the decrypted file")
                    } else if contains(&key_pem, b"-----BEGIN CERTIFICATE-----") {
                        format!("--tls-key {key_shown} holds a certificate, not a private key; are --tls-cert and --tls-key swapped?")
                    } else {
                        format!("--tls-key {key_shown} holds no private key; give the certificate's key in PEM (`PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`)")
                    },
                ));
            }
            Err(e) => {
                return Err(bad(format!(
                    "--tls-key {key_shown} is not valid PEM ({}); give the certificate's private key in PEM",
                    pem_error(&e)
                )))
            }
        };

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let signing = provider
            .key_provider
            .load_private_key(key_der.clone_key())
            .map_err(|e| {
                bad(format!(
                    "--tls-key {key_shown} holds a private key rustls cannot use ({e}); give an RSA (2048 bits or more), ECDSA P-256/P-384 or Ed25519 key"
                ))
            })?;
        let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
        match certified.keys_match() {
            // Unknown: the key cannot tell its public half; rustls then accepts it too.
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                return Err(bad(format!(
                    "--tls-key {key_shown} is not the private key of the certificate in --tls-cert {cert_shown}; give the key the certificate was made for (or the certificate first in its chain)"
                )))
            }
            Err(e) => {
                return Err(bad(format!(
                    "the first certificate in --tls-cert {cert_shown} cannot be parsed ({e}); give a valid X.509 certificate in PEM, the server's own first"
                )))
            }
        }

        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(format!("TLS cannot be set up ({e}); this is a bug")))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| {
                bad(format!(
                    "--tls-cert {cert_shown} and --tls-key {key_shown} cannot be used together ({e}); give a certificate chain and its own private key"
                ))
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsConfig {
            config: Arc::new(config),
        })
    }

    /// The rustls configuration.
    pub fn server_config(&self) -> &Arc<rustls::ServerConfig> {
        &self.config
    }
}

/// The bytes of the PEM file `path` given as `flag` (at most [`MAX_PEM_BYTES`]).
fn read_pem_file(path: &Path, flag: &str, what: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let fail = |why: String| {
        ServeError::new(
            Code::Io,
            format!(
                "cannot read {flag} {}: {why}; give the path of a readable PEM file holding the {what}",
                path.display()
            ),
        )
    };
    if path.is_dir() {
        return Err(fail("it is a directory".into()));
    }
    let f = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut buf = Vec::new();
    f.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| fail(e.to_string()))?;
    if buf.len() as u64 > MAX_PEM_BYTES {
        return Err(fail(format!(
            "it is larger than {} KiB, too large for a PEM {what}",
            MAX_PEM_BYTES / 1024
        )));
    }
    Ok(buf)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A PEM parse error as a short phrase.
fn pem_error(e: &pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { .. } => "a `-----BEGIN` block has no `-----END`".into(),
        pem::Error::IllegalSectionStart { .. } => "a malformed `-----BEGIN` line".into(),
        pem::Error::Base64Decode(_) => "a block is not valid base64".into(),
        other => other.to_string(),
    }
}

/// A TCP listener whose connections speak TLS, for `axum::serve`: a task accepts TCP
/// connections and runs each handshake in a task of its own (at most
/// [`HANDSHAKE_TIMEOUT`]), so a client that fails its handshake (plain HTTP sent to the
/// port, a client that does not trust the certificate) or stalls in it only loses its own
/// connection. Dropping the listener (the server shutting down) stops accepting and drops
/// connections still shaking hands.
pub struct TlsListener {
    incoming: mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Serves TLS with `tls` on the connections of `tcp`. Must be called inside a tokio
    /// runtime (it spawns the accepting task).
    ///
    /// # Errors
    /// The listener's local address cannot be read.
    pub fn new(tcp: TcpListener, tls: &TlsConfig) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
        let (tx, incoming) = mpsc::channel(QUEUE);
        Ok(TlsListener {
            incoming,
            local,
            acceptor: tokio::spawn(accept_loop(tcp, acceptor, tx)),
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(conn) => conn,
            // The accepting task is gone (it ends only when this listener is dropped,
            // or by a panic): no connection will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Accepts TCP connections until `tx`'s receiver is gone; each handshake runs in a task
/// of its own and a finished one is handed to the server through `tx`.
async fn accept_loop(
    tcp: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    tx: mpsc::Sender<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = tx.closed() => return,
            r = tcp.accept() => match r {
                Ok(conn) => conn,
                Err(e) => {
                    // As axum's own loop: a connection gone before it was accepted is
                    // nothing; anything else (EMFILE...) is told and waited out.
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused
                            | std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                    ) {
                        tracing::error!("accept error: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
        };
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(conn)) => {
                    let _ = tx.send((conn, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn data(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name)
    }

    fn load_err(cert: &Path, key: &Path) -> ServeError {
        match TlsConfig::load(cert, key) {
            Ok(_) => panic!("{} + {} loaded", cert.display(), key.display()),
            Err(e) => e,
        }
    }

    fn assert_one_line(e: &ServeError, code: Code, wants: &[&str]) {
        assert_eq!(e.code, code, "{}", e.message);
        assert!(
            !e.message.contains('\n'),
            "more than one line: {}",
            e.message
        );
        for w in wants {
            assert!(e.message.contains(w), "{w:?} not in: {}", e.message);
        }
    }

    #[test]
    fn a_matching_certificate_and_key_load_in_every_key_encoding() {
        for key in ["key-pkcs8.pem", "key-pkcs1.pem"] {
            let c = TlsConfig::load(&data("cert.pem"), &data(key)).unwrap();
            assert_eq!(c.server_config().alpn_protocols, vec![b"http/1.1".to_vec()]);
        }
        TlsConfig::load(&data("ec-cert.pem"), &data("ec-key-sec1.pem")).unwrap();
        // One file holding both.
        TlsConfig::load(&data("combined.pem"), &data("combined.pem")).unwrap();
    }

    #[test]
    fn missing_and_unreadable_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("none.pem");
        let e = load_err(&none, &data("key-pkcs8.pem"));
        assert_one_line(
            &e,
            Code::Io,
            &["cannot read --tls-cert", "none.pem", "No such file"],
        );
        let e = load_err(&data("cert.pem"), &none);
        assert_one_line(&e, Code::Io, &["cannot read --tls-key", "none.pem"]);
        let e = load_err(dir.path(), &data("key-pkcs8.pem"));
        assert_one_line(&e, Code::Io, &["--tls-cert", "is a directory"]);
        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'x'; MAX_PEM_BYTES as usize + 1]).unwrap();
        let e = load_err(&big, &data("key-pkcs8.pem"));
        assert_one_line(&e, Code::Io, &["too large"]);
        // Unreadable (not as root, who reads anything).
        if unsafe { libc::geteuid() } != 0 {
            use std::os::unix::fs::PermissionsExt;
            let locked = dir.path().join("locked.pem");
            std::fs::copy(data("key-pkcs8.pem"), &locked).unwrap();
            std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
            let e = load_err(&data("cert.pem"), &locked);
            assert_one_line(&e, Code::Io, &["--tls-key", "Permission denied"]);
        }
    }

    #[test]
    fn files_without_a_certificate_or_a_key_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a pem file\n").unwrap();
        let e = load_err(&junk, &data("key-pkcs8.pem"));
        assert_one_line(
            &e,
            Code::BadRequest,
            &["--tls-cert", "junk.pem", "holds no PEM certificate"],
        );
        let e = load_err(&data("cert.pem"), &junk);
        assert_one_line(
            &e,
            Code::BadRequest,
            &["--tls-key", "junk.pem", "holds no private key"],
        );
        // Swapped flags are pointed out.
        let e = load_err(&data("key-pkcs8.pem"), &data("cert.pem"));
        assert_one_line(
            &e,
            Code::BadRequest,
            &[
                "--tls-cert",
                "holds a private key, not a certificate",
                "swapped",
            ],
        );
        let e = load_err(&data("cert.pem"), &data("cert.pem"));
        assert_one_line(
            &e,
            Code::BadRequest,
            &[
                "--tls-key",
                "holds a certificate, not a private key",
                "swapped",
            ],
        );
        // An encrypted key.
        let e = load_err(&data("cert.pem"), &data("key-encrypted.pem"));
        assert_one_line(
            &e,
            Code::BadRequest,
            &["holds an encrypted private key", "decrypt it"],
        );
        // Broken PEM.
        let broken = dir.path().join("broken.pem");
        std::fs::write(&broken, "-----BEGIN CERTIFICATE-----\nAAAA\n").unwrap();
        let e = load_err(&broken, &data("key-pkcs8.pem"));
        assert_one_line(&e, Code::BadRequest, &["is not valid PEM", "-----END"]);
        std::fs::write(
            &broken,
            "-----BEGIN PRIVATE KEY-----\n!!notbase64!!\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = load_err(&data("cert.pem"), &broken);
        assert_one_line(&e, Code::BadRequest, &["--tls-key", "is not valid PEM"]);
        // Valid PEM, not a key.
        std::fs::write(
            &broken,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = load_err(&data("cert.pem"), &broken);
        assert_one_line(&e, Code::BadRequest, &["--tls-key", "rustls cannot use"]);
        // Valid PEM, not a certificate.
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = load_err(&broken, &data("key-pkcs8.pem"));
        assert_one_line(&e, Code::BadRequest, &["--tls-cert", "cannot be parsed"]);
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let e = load_err(&data("cert.pem"), &data("other-key.pem"));
        assert_one_line(
            &e,
            Code::BadRequest,
            &[
                "--tls-key",
                "other-key.pem",
                "is not the private key of the certificate",
                "cert.pem",
            ],
        );
        let e = load_err(&data("ec-cert.pem"), &data("key-pkcs8.pem"));
        assert_one_line(&e, Code::BadRequest, &["is not the private key"]);
    }

    /// A plain-HTTP client and a stalled one do not stop the next TLS client.
    #[tokio::test]
    async fn a_failed_or_stalled_handshake_does_not_stop_the_next_client() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let tls = TlsConfig::load(&data("cert.pem"), &data("key-pkcs8.pem")).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut listener = TlsListener::new(tcp, &tls).unwrap();
        let addr = axum::serve::Listener::local_addr(&listener).unwrap();

        // A client that connects and says nothing.
        let _stalled = TcpStream::connect(addr).await.unwrap();
        // Plain HTTP: the handshake fails, the connection is closed.
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf))
            .await
            .expect("the plain-HTTP connection was not closed");

        // A TLS client trusting the certificate.
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(data("cert.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let server = tokio::spawn(async move {
            let (mut conn, _) = axum::serve::Listener::accept(&mut listener).await;
            let mut b = [0u8; 5];
            conn.read_exact(&mut b).await.unwrap();
            conn.write_all(b"world").await.unwrap();
            conn.shutdown().await.unwrap();
            b
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut conn = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
            .await
            .expect("the TLS client waited behind the others")
            .unwrap();
        conn.write_all(b"hello").await.unwrap();
        let mut got = Vec::new();
        conn.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"world");
        assert_eq!(&server.await.unwrap(), b"hello");
    }
}
