//! Where the database is and how to reach it: a libpq-style URL completed from the
//! standard `PG*` variables and `~/.pgpass`, plus the engine's own options.

use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::config::{Host, SslMode};

use crate::{MetaError, Result};

/// Engine options that are not part of the connection itself. Each can also be given in
/// the URL's query string (`pool_size=N`, `op_timeout=SECONDS`), which wins.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Most connections the engine opens for requests (opened on demand; the change-feed
    /// listener and the notifier have one each besides). Default 8.
    pub pool_size: usize,
    /// Longest wait for one answer of the database (and for a free connection): past it
    /// the call fails with [`MetaError::Unreachable`]. Default 30 s.
    pub op_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            pool_size: 8,
            op_timeout: Duration::from_secs(30),
        }
    }
}

/// Everything needed to open connections to one workspace.
#[derive(Clone)]
pub(super) struct ConnSpec {
    /// The tokio-postgres configuration (credentials, host, timeouts, keepalives).
    pub pg: tokio_postgres::Config,
    /// PostgreSQL schema holding the workspace's tables.
    pub schema: String,
    /// `postgres://user@host:port/db?schema=…`, never with the password.
    pub describe: String,
    /// `host:port` of the first host, for error messages.
    pub target: String,
    /// Engine options.
    pub opts: PgOptions,
}

impl std::fmt::Debug for ConnSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe)
    }
}

/// The default schema when the URL names none.
const DEFAULT_SCHEMA: &str = "public";

fn bad_url(why: impl std::fmt::Display) -> MetaError {
    MetaError::Unreachable(format!("invalid PostgreSQL URL: {why}"))
}

/// Whether `s` may name a deskfs schema: lower-case ASCII letters, digits and `_`,
/// starting with a letter or `_`, at most 63 bytes (so it needs no quoting anywhere,
/// and the `LISTEN` channel derived from it stays a plain identifier).
pub(super) fn valid_schema(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_lowercase() || (i > 0 && b.is_ascii_digit()))
}

impl ConnSpec {
    /// Parses `url` (`postgres://` or `postgresql://`), takes out the engine's own query
    /// parameters (`schema`, `pool_size`, `op_timeout`, `sslmode`) and fills what the URL
    /// leaves out from `PGUSER`, `PGPASSWORD` (then `~/.pgpass`), `PGHOST`, `PGPORT`,
    /// `PGDATABASE` and `PGSSLMODE`. Errors: [`MetaError::Unreachable`] for a URL that
    /// cannot be used (bad syntax, a TLS mode this build cannot honour).
    pub(super) fn parse(url: &str, mut opts: PgOptions) -> Result<ConnSpec> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(bad_url("it must start with postgres:// or postgresql://"));
        }
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, q),
            None => (url, ""),
        };
        let mut kept = Vec::new();
        let mut schema = None;
        let mut sslmode = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "schema" => schema = Some(v.to_string()),
                "pool_size" => {
                    opts.pool_size =
                        v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            bad_url(format!("pool_size={v} is not a positive number"))
                        })?
                }
                "op_timeout" => {
                    let secs: f64 = v
                        .parse()
                        .ok()
                        .filter(|s: &f64| *s > 0.0 && s.is_finite())
                        .ok_or_else(|| {
                            bad_url(format!(
                                "op_timeout={v} is not a positive number of seconds"
                            ))
                        })?;
                    opts.op_timeout = Duration::from_secs_f64(secs);
                }
                "sslmode" => sslmode = Some(v.to_string()),
                _ => kept.push(pair),
            }
        }
        let stripped = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut pg: tokio_postgres::Config = stripped.parse().map_err(|e| bad_url(one_line(&e)))?;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());

        let sslmode = sslmode
            .or_else(|| env("PGSSLMODE"))
            .unwrap_or_else(|| "prefer".into());
        match sslmode.as_str() {
            // Without TLS support `prefer` and `allow` mean a plain connection, as in a
            // libpq built without OpenSSL.
            "disable" | "allow" | "prefer" => {
                pg.ssl_mode(SslMode::Disable);
            }
            "require" | "verify-ca" | "verify-full" => {
                return Err(MetaError::Unreachable(format!(
                    "sslmode={sslmode} asked, but this deskfs build has no TLS support for \
                     PostgreSQL (TLS is not built in); use sslmode=disable on a trusted network \
                     or a TLS tunnel"
                )))
            }
            other => return Err(bad_url(format!("unknown sslmode {other:?}"))),
        }

        let schema = schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_string());
        if !valid_schema(&schema) {
            return Err(bad_url(format!(
                "schema={schema:?}: use lower-case letters, digits and _ (at most 63)"
            )));
        }
        if pg.get_hosts().is_empty() {
            match env("PGHOST") {
                Some(h) if h.starts_with('/') => {
                    pg.host_path(h);
                }
                Some(h) => {
                    pg.host(&h);
                }
                None => {
                    pg.host("localhost");
                }
            }
        }
        if pg.get_ports().is_empty() {
            if let Some(p) = env("PGPORT") {
                let p: u16 = p
                    .parse()
                    .map_err(|_| bad_url(format!("PGPORT={p} is not a port number")))?;
                pg.port(p);
            }
        }
        if pg.get_user().is_none() {
            match env("PGUSER").or_else(|| env("USER")) {
                Some(u) => {
                    pg.user(&u);
                }
                None => return Err(bad_url("no user name (give it in the URL or PGUSER)")),
            }
        }
        if pg.get_dbname().is_none() {
            if let Some(d) = env("PGDATABASE") {
                pg.dbname(&d);
            }
        }
        let host = match pg.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let user = pg.get_user().unwrap_or_default().to_string();
        let db = pg.get_dbname().unwrap_or(&user).to_string();
        if pg.get_password().is_none() {
            if let Some(pw) = env("PGPASSWORD") {
                pg.password(pw);
            } else if let Some(pw) = pgpass_lookup(&host, port, &db, &user) {
                pg.password(pw);
            }
        }
        // Bounded waits on a network: a host that stops answering is found out.
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(opts.op_timeout.min(Duration::from_secs(10)));
        }
        if pg.get_tcp_user_timeout().is_none() {
            pg.tcp_user_timeout(opts.op_timeout);
        }
        pg.keepalives(true);
        if pg.get_keepalives_idle() >= Duration::from_secs(3600) {
            pg.keepalives_idle(Duration::from_secs(30));
        }
        if pg.get_keepalives_interval().is_none() {
            pg.keepalives_interval(Duration::from_secs(10));
        }
        if pg.get_keepalives_retries().is_none() {
            pg.keepalives_retries(3);
        }
        if pg.get_application_name().is_none() {
            pg.application_name("deskfs");
        }
        let target = if host.starts_with('/') {
            format!("{host}/.s.PGSQL.{port}")
        } else {
            format!("{host}:{port}")
        };
        let describe = format!("postgres://{user}@{target}/{db}?schema={schema}");
        Ok(ConnSpec {
            pg,
            schema,
            describe,
            target,
            opts,
        })
    }
}

/// The password for `host:port:db:user` in `$PGPASSFILE` or `~/.pgpass` (libpq's format:
/// `*` matches anything, `\` escapes `:` and `\`; files readable by group or others are
/// ignored, as libpq does).
fn pgpass_lookup(host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass")))?;
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() || meta.permissions().mode() & 0o077 != 0 {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let port = port.to_string();
    let host = if host.starts_with('/') {
        "localhost"
    } else {
        host
    };
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_pgpass(line);
        if fields.len() < 5 {
            continue;
        }
        let want = [host, port.as_str(), db, user];
        if fields[..4]
            .iter()
            .zip(want)
            .all(|(f, w)| f == "*" || f == w)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

fn split_pgpass(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(n), Some(cur)) = (chars.next(), out.last_mut()) {
                    cur.push(n);
                }
            }
            ':' if out.len() < 5 => out.push(String::new()),
            c => {
                if let Some(cur) = out.last_mut() {
                    cur.push(c)
                }
            }
        }
    }
    out
}

/// The first line of an error's message chain, without tokio-postgres's prefixes.
pub(super) fn one_line(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !m.is_empty() && !msg.contains(&m) {
            msg = format!("{msg}: {m}");
        }
        src = s.source();
    }
    msg.lines().next().unwrap_or_default().to_string()
}

/// A connection attempt's failure as one short line for [`MetaError::Unreachable`].
pub(super) fn connect_error(target: &str, e: &tokio_postgres::Error) -> MetaError {
    if let Some(db) = e.as_db_error() {
        // e.g. `password authentication failed for user "deskfs"`, `database "x" does not exist`
        return MetaError::Unreachable(format!("{target}: {}", db.message()));
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            let why = match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                std::io::ErrorKind::TimedOut => "connection timed out".to_string(),
                std::io::ErrorKind::NotFound => "no such host or socket".to_string(),
                _ => io.to_string(),
            };
            return MetaError::Unreachable(format!("{target}: {why}"));
        }
        src = s.source();
    }
    let text = one_line(e);
    if text.contains("password missing") {
        return MetaError::Unreachable(format!(
            "{target}: the server asks for a password; give it in the URL, PGPASSWORD or ~/.pgpass"
        ));
    }
    if text.contains("timeout") || text.contains("timed out") {
        return MetaError::Unreachable(format!("{target}: connection timed out"));
    }
    MetaError::Unreachable(format!("{target}: {text}"))
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn url_params_and_describe() {
        let s = ConnSpec::parse(
            "postgres://u:secret@127.0.0.1:5999/db?schema=ws_1&pool_size=3&op_timeout=2.5&sslmode=disable&application_name=x",
            PgOptions::default(),
        )
        .unwrap();
        assert_eq!(s.schema, "ws_1");
        assert_eq!(s.opts.pool_size, 3);
        assert_eq!(s.opts.op_timeout, Duration::from_millis(2500));
        assert_eq!(s.describe, "postgres://u@127.0.0.1:5999/db?schema=ws_1");
        assert!(!format!("{s:?}").contains("secret"));
        assert_eq!(s.pg.get_password(), Some(&b"secret"[..]));
        assert_eq!(s.pg.get_application_name(), Some("x"));
        assert!(
            ConnSpec::parse("postgres://u@h/db?schema=Bad-Name", PgOptions::default()).is_err()
        );
        assert!(ConnSpec::parse("mysql://u@h/db", PgOptions::default()).is_err());
        let tls = ConnSpec::parse("postgresql://u@h/db?sslmode=require", PgOptions::default());
        assert!(
            matches!(&tls, Err(MetaError::Unreachable(m)) if m.contains("TLS is not built in")),
            "{tls:?}"
        );
    }

    #[test]
    fn pgpass_fields() {
        assert_eq!(
            split_pgpass(r"h:5432:*:u:pa\:ss:word"),
            vec!["h", "5432", "*", "u", "pa:ss:word"]
        );
        assert!(valid_schema("_a1"));
        assert!(!valid_schema("1a"));
        assert!(!valid_schema("A"));
    }
}
