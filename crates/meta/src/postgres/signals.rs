//! Wake-ups between mounts: `NOTIFY` on one channel per workspace schema, a `LISTEN`
//! connection per subscribed engine, and the debounced feed notification.
//!
//! Payload: `<engine id, hex> <code>[ <args>]` with the codes `F` (feed), `S` (sessions),
//! `L ino` (lock freed), `W ino cache` (upload wanted), `U ino` (uploaded). An engine
//! drops the signals it sent itself.
//!
//! The feed notification is not sent inside the writing transactions (a `NOTIFY` takes a
//! cluster-wide lock at commit): after a commit that may have logged changes the engine
//! wakes a background task, which sends at most one `NOTIFY` per [`FEED_NOTIFY_EVERY`].

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio_postgres::{AsyncMessage, Client, NoTls, Notification};

use super::config::ConnSpec;
use super::pool::connect_raw;
use crate::Signal;

/// Shortest interval between two feed notifications of one engine.
pub(super) const FEED_NOTIFY_EVERY: Duration = Duration::from_millis(5);

/// The `LISTEN`/`NOTIFY` channel of the workspace in `schema` (a valid identifier:
/// schema names are checked to be plain, at most 63 bytes).
pub(super) fn channel(schema: &str) -> String {
    let c = format!("deskfs_{schema}");
    if c.len() <= 63 {
        return c;
    }
    // FNV-1a keeps long names distinct and stable across builds.
    let h = schema.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("deskfs_{}_{h:016x}", &schema[..30])
}

/// The payload announcing `s` from engine `me`.
pub(super) fn encode(me: u64, s: &Signal) -> String {
    match s {
        Signal::Feed => format!("{me:x} F"),
        Signal::Sessions => format!("{me:x} S"),
        Signal::LockFreed(ino) => format!("{me:x} L {ino}"),
        Signal::UploadWanted { ino, cache } => format!("{me:x} W {ino} {cache}"),
        Signal::Uploaded(ino) => format!("{me:x} U {ino}"),
    }
}

/// The sender and signal of a payload (`None` for one this build does not know).
pub(super) fn decode(payload: &str) -> Option<(u64, Signal)> {
    let mut it = payload.split(' ');
    let from = u64::from_str_radix(it.next()?, 16).ok()?;
    let code = it.next()?;
    let mut num = || it.next().and_then(|v| v.parse::<u64>().ok());
    let s = match code {
        "F" => Signal::Feed,
        "S" => Signal::Sessions,
        "L" => Signal::LockFreed(num()?),
        "W" => {
            let ino = num()?;
            Signal::UploadWanted { ino, cache: num()? }
        }
        "U" => Signal::Uploaded(num()?),
        _ => return None,
    };
    Some((from, s))
}

/// Starts the task that sends the debounced feed notification; wake it with the returned
/// `Notify` (wake-ups while it is busy or waiting out the interval coalesce into one).
pub(super) fn spawn_feed_notifier(
    spec: Arc<ConnSpec>,
    handle: &Handle,
    channel: String,
    payload: String,
) -> Arc<tokio::sync::Notify> {
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = wake.clone();
    let h = handle.clone();
    handle.spawn(async move {
        let mut conn: Option<(Client, tokio_postgres::Statement)> = None;
        loop {
            w.notified().await;
            for attempt in 0..3u32 {
                if conn.as_ref().is_none_or(|(c, _)| c.is_closed()) {
                    conn = match open_notifier(&spec, &h).await {
                        Ok(c) => Some(c),
                        Err(e) => {
                            tracing::debug!(error = %e, "feed notifier cannot connect");
                            None
                        }
                    };
                }
                if let Some((c, st)) = &conn {
                    let sent = tokio::time::timeout(
                        spec.opts.op_timeout,
                        c.execute(st, &[&channel, &payload]),
                    )
                    .await;
                    match sent {
                        Ok(Ok(_)) => break,
                        Ok(Err(e)) => tracing::debug!(error = %e, attempt, "feed NOTIFY failed"),
                        Err(_) => tracing::debug!(attempt, "feed NOTIFY timed out"),
                    }
                    conn = None;
                }
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            tokio::time::sleep(FEED_NOTIFY_EVERY).await;
        }
    });
    wake
}

async fn open_notifier(
    spec: &ConnSpec,
    handle: &Handle,
) -> crate::Result<(Client, tokio_postgres::Statement)> {
    let (client, _task) = connect_raw(spec, handle).await?;
    let st = client
        .prepare("SELECT pg_notify($1, $2)")
        .await
        .map_err(|e| super::pool::map_err(&e))?;
    Ok((client, st))
}

/// Opens a connection that listens on `channel`; its notifications arrive on the
/// returned receiver, which ends when the connection does.
async fn open_listener(
    spec: &ConnSpec,
    handle: &Handle,
    channel: &str,
) -> crate::Result<(Client, tokio::sync::mpsc::UnboundedReceiver<Notification>)> {
    let (client, mut connection) = spec
        .pg
        .connect(NoTls)
        .await
        .map_err(|e| super::config::connect_error(&spec.target, &e))?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    handle.spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "signal listener connection ended");
                    return;
                }
                None => return,
            }
        }
    });
    let listen = tokio::time::timeout(
        spec.opts.op_timeout,
        client.batch_execute(&format!("LISTEN {channel}")),
    )
    .await
    .map_err(|_| crate::MetaError::Unreachable(format!("{}: LISTEN timed out", spec.target)))?;
    listen.map_err(|e| super::pool::map_err(&e))?;
    Ok((client, rx))
}

/// Starts the listener feeding `tx` with the other engines' signals on `channel`. It
/// reconnects after errors (100 ms doubling to 5 s) and then sends [`Signal::Feed`] and
/// [`Signal::Sessions`] (what was signalled meanwhile is lost: look at everything). The
/// returned receiver yields once the first `LISTEN` is in place (or failed).
pub(super) fn spawn_listener(
    spec: Arc<ConnSpec>,
    handle: &Handle,
    channel: String,
    me: u64,
    tx: mpsc::Sender<Signal>,
) -> mpsc::Receiver<()> {
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    let h = handle.clone();
    handle.spawn(async move {
        let mut ready = Some(ready_tx);
        let mut missed = false;
        let mut backoff = Duration::from_millis(100);
        loop {
            match open_listener(&spec, &h, &channel).await {
                Ok((client, mut notes)) => {
                    backoff = Duration::from_millis(100);
                    if let Some(r) = ready.take() {
                        let _ = r.try_send(());
                    }
                    if missed
                        && (tx.send(Signal::Feed).is_err() || tx.send(Signal::Sessions).is_err())
                    {
                        return;
                    }
                    while let Some(n) = notes.recv().await {
                        match decode(n.payload()) {
                            Some((from, _)) if from == me => {}
                            Some((_, s)) => {
                                if tx.send(s).is_err() {
                                    return;
                                }
                            }
                            None => tracing::debug!(payload = n.payload(), "unknown signal"),
                        }
                    }
                    drop(client);
                    tracing::warn!(channel = %channel, "signal listener lost its connection; reconnecting");
                }
                Err(e) => {
                    tracing::warn!(error = %e, channel = %channel, "signal listener cannot connect; retrying");
                    if let Some(r) = ready.take() {
                        let _ = r.try_send(());
                    }
                }
            }
            missed = true;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    });
    ready_rx
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        for s in [
            Signal::Feed,
            Signal::Sessions,
            Signal::LockFreed(7),
            Signal::UploadWanted {
                ino: 8,
                cache: u64::MAX,
            },
            Signal::Uploaded(9),
        ] {
            assert_eq!(decode(&encode(0xabc, &s)), Some((0xabc, s)));
        }
        assert_eq!(decode("zz F"), None);
        assert_eq!(decode("1 Q"), None);
        assert!(channel(&"x".repeat(63)).len() <= 63);
    }
}
