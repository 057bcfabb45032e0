//! A LISTEN connection of its own, turning NOTIFYs into a generation
//! counter: a waiter reads the counter before its query and waits for it to
//! change, so a notification that arrives during the query is not lost.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Config, NoTls};

use crate::Shutdown;

/// `"name"` with embedded quotes doubled: an identifier for LISTEN.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Spawns the listener; the counter also moves after each (re)connect, since
/// notifications sent while disconnected are gone. Returns once the first
/// LISTENs are in place (or after 10 s).
pub(crate) async fn spawn(
    config: Config,
    channels: Vec<String>,
    generation: watch::Sender<u64>,
    stop: Shutdown,
) -> JoinHandle<()> {
    let mut ready = generation.subscribe();
    let handle = tokio::spawn(async move {
        while !stop.is_triggered() {
            if let Ok((client, mut conn)) = config.connect(NoTls).await {
                let g = generation.clone();
                let driver = tokio::spawn(async move {
                    let mut s = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(m) = s.next().await {
                        match m {
                            Ok(AsyncMessage::Notification(_)) => g.send_modify(|v| *v += 1),
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                });
                let mut ok = true;
                for ch in &channels {
                    if client
                        .batch_execute(&format!("LISTEN {}", quote_ident(ch)))
                        .await
                        .is_err()
                    {
                        ok = false;
                        break;
                    }
                }
                if ok {
                    generation.send_modify(|v| *v += 1);
                    tokio::select! {
                        _ = driver => {}
                        _ = stop.wait() => return,
                    }
                } else {
                    driver.abort();
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.wait() => return,
            }
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(10), ready.changed()).await;
    handle
}
