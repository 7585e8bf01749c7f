//! The control socket: one command line in, one answer line out (`ok ...` or
//! `error ...`), then the connection is closed. Commands:
//!
//! ```text
//! cut [--reorder SEED]       power cut (see the crate doc)
//! sync                       make everything durable
//! fail-fsync PATTERN COUNT   the next COUNT fsync/fdatasync of matching files fail (EIO)
//! fail-fsyncdir PATTERN COUNT  likewise for fsync of matching directories
//! stats                      counters, as JSON after "ok "
//! ```
//!
//! Words are separated by whitespace, so a PATTERN cannot contain any. The socket is
//! the owner's only (mode 0600).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{INodeNo, Notifier};

use crate::fs::lock;
use crate::state::State;

/// Longest command line accepted, bytes.
const MAX_LINE: u64 = 4096;

/// Serves the control socket until the process exits.
pub(crate) fn serve(listener: UnixListener, state: Arc<Mutex<State>>, notifier: Option<Notifier>) {
    for conn in listener.incoming() {
        match conn {
            Ok(c) => {
                if let Err(e) = handle(c, &state, notifier.as_ref()) {
                    eprintln!("deskfs-lossfs: control connection: {e}");
                }
            }
            Err(e) => {
                eprintln!("deskfs-lossfs: control socket: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn handle(c: UnixStream, state: &Mutex<State>, notifier: Option<&Notifier>) -> io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new((&c).take(MAX_LINE)).read_line(&mut line)?;
    let answer = execute(line.trim(), state, notifier);
    eprintln!("deskfs-lossfs: control: {} -> {answer}", line.trim());
    let mut w = &c;
    w.write_all(answer.as_bytes())?;
    w.write_all(b"\n")
}

/// Runs one command; returns the answer line.
pub(crate) fn execute(line: &str, state: &Mutex<State>, notifier: Option<&Notifier>) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["cut"] => cut(state, notifier, None),
        ["cut", "--reorder", seed] => match seed.parse::<u64>() {
            Ok(seed) => cut(state, notifier, Some(seed)),
            Err(_) => format!("error bad seed {seed:?}"),
        },
        ["sync"] => match lock(state).sync() {
            Ok(done) => format!("ok {done}"),
            Err(e) => format!("error {e}"),
        },
        [cmd @ ("fail-fsync" | "fail-fsyncdir"), pattern, count] => match count.parse::<u64>() {
            Ok(n) => {
                lock(state).add_failure(*cmd == "fail-fsyncdir", pattern, n);
                format!("ok the next {n} {cmd} of {pattern:?} fail")
            }
            Err(_) => format!("error bad count {count:?}"),
        },
        ["stats"] => format!("ok {}", lock(state).stats()),
        ["image", dest, extra @ ..] => {
            let extra: Vec<std::path::PathBuf> = extra.iter().map(Into::into).collect();
            match lock(state).image(std::path::Path::new(dest), &extra) {
                Ok(report) => format!("ok image {dest}: {report}"),
                Err(e) => format!("error image {dest}: {e}"),
            }
        }
        _ => format!(
            "error unknown command {line:?} (cut [--reorder SEED] | sync | image DEST [DIR...] | fail-fsync PATTERN COUNT | fail-fsyncdir PATTERN COUNT | stats)"
        ),
    }
}

fn cut(state: &Mutex<State>, notifier: Option<&Notifier>, reorder: Option<u64>) -> String {
    let (r, old) = {
        let mut s = lock(state);
        let old = s.referenced();
        (s.cut(reorder), old)
    };
    // Outside the lock: dropping the kernel's cached pages may make it write dirty
    // (mmap) pages back first, which the (now stale) inodes refuse.
    if let Some(n) = notifier {
        for ino in old {
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
        }
    }
    match r {
        Ok(report) => format!("ok cut: {report}"),
        Err(e) => format!("error cut: cannot reload the backing directory: {e}"),
    }
}

/// The client: sends `command` to the socket at `sock`, returns the answer line.
pub(crate) fn client(sock: &Path, command: &str) -> io::Result<String> {
    let mut c = UnixStream::connect(sock)?;
    c.write_all(command.as_bytes())?;
    c.write_all(b"\n")?;
    c.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    c.read_to_string(&mut answer)?;
    Ok(answer.trim_end().to_owned())
}
