//! A unix-socket proxy between a broker and its engine, for tests that cut
//! the engine's event stream without touching the engine: every byte passes
//! both ways until [`EngineProxy::stall_events`], after which whatever the
//! engine sends on an event subscription (`GET …/events`) is swallowed while
//! the connection stays open. The broker sees a healthy, silent stream; every
//! other request (inspect, start, …) still passes.
//!
//! It only relays; it never makes a request of its own.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

use crate::TempDir;

#[derive(Debug, Default)]
struct Switches {
    stalled: AtomicBool,
    subscriptions: AtomicUsize,
    swallowed: AtomicUsize,
}

/// The proxy; dropping it closes the listener and every relayed connection.
#[derive(Debug)]
pub struct EngineProxy {
    socket: PathBuf,
    switches: Arc<Switches>,
    accept: JoinHandle<()>,
    // Declared last: the socket's directory outlives the accept loop.
    _dir: TempDir,
}

impl EngineProxy {
    /// Listens on a fresh socket and relays every connection to `upstream`.
    pub fn start(upstream: impl Into<PathBuf>) -> Result<Self> {
        let upstream = upstream.into();
        let dir = TempDir::new("dormouse-engine-proxy");
        let socket = dir.path().join("engine.sock");
        let listener =
            UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
        let switches = Arc::new(Switches::default());
        let shared = switches.clone();
        let accept = tokio::spawn(async move {
            let mut relays = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(engine) = UnixStream::connect(&upstream).await else {
                    continue;
                };
                relays.spawn(relay(client, engine, shared.clone()));
            }
        });
        Ok(Self {
            socket,
            switches,
            accept,
            _dir: dir,
        })
    }

    /// The socket to give the broker (`--engine-socket unix://…`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// From now on the event streams go silent (their connections stay open).
    pub fn stall_events(&self) {
        self.switches.stalled.store(true, Ordering::SeqCst);
    }

    /// Event subscriptions relayed so far.
    pub fn subscriptions(&self) -> usize {
        self.switches.subscriptions.load(Ordering::SeqCst)
    }

    /// Chunks of event-stream bytes swallowed since the stall.
    pub fn swallowed(&self) -> usize {
        self.switches.swallowed.load(Ordering::SeqCst)
    }
}

impl Drop for EngineProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Whether bytes sent towards the engine hold an event subscription's
/// request line. A pooled connection that carried one stays busy with its
/// stream, so once seen the whole connection is an event stream.
fn subscribes(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.lines().any(|line| {
        line.starts_with("GET ") && (line.contains("/events?") || line.contains("/events "))
    })
}

async fn relay(client: UnixStream, engine: UnixStream, switches: Arc<Switches>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_engine, mut to_engine) = engine.into_split();
    let events = Arc::new(AtomicBool::new(false));
    let marked = events.clone();
    let counted = switches.clone();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !marked.load(Ordering::SeqCst) && subscribes(&buf[..n]) {
                marked.store(true, Ordering::SeqCst);
                counted.subscriptions.fetch_add(1, Ordering::SeqCst);
            }
            if to_engine.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_engine.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_engine.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if events.load(Ordering::SeqCst) && switches.stalled.load(Ordering::SeqCst) {
                switches.swallowed.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            if to_client.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        // A stalled stream is never ended towards the broker.
        if switches.stalled.load(Ordering::SeqCst) && events.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let _ = to_client.shutdown().await;
    };
    tokio::join!(up, down);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_subscriptions_are_told_from_other_requests() {
        assert!(subscribes(
            b"GET /v1.41/events?filters=%7B%7D HTTP/1.1\r\nhost: docker\r\n\r\n"
        ));
        assert!(subscribes(b"GET /events HTTP/1.1\r\n\r\n"));
        assert!(!subscribes(
            b"GET /v1.41/containers/dormouse-x/json HTTP/1.1\r\n\r\n"
        ));
        assert!(!subscribes(
            b"POST /v1.41/containers/x/start HTTP/1.1\r\n\r\n"
        ));
    }
}
