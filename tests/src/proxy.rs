//! A unix-socket proxy between a broker and its engine, for tests that cut
//! the engine off without touching the engine:
//!
//! - [`EngineProxy::stall_events`]: whatever the engine sends on an event
//!   subscription (`GET …/events`) is swallowed while the connection stays
//!   open. The broker sees a healthy, silent stream; every other request
//!   (inspect, start, …) still passes.
//! - [`EngineProxy::cut`]: the engine is gone as far as the broker can
//!   tell. Every relayed connection is dropped and the socket refuses new
//!   ones (no one listens on it: `ECONNREFUSED`, as a dead daemon's stale
//!   socket does) until [`EngineProxy::restore`].
//!
//! Otherwise every byte passes both ways. It only relays; it never makes a
//! request of its own.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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
    accepted: AtomicUsize,
}

/// The proxy; dropping it closes the listener and every relayed connection.
#[derive(Debug)]
pub struct EngineProxy {
    socket: PathBuf,
    upstream: PathBuf,
    switches: Arc<Switches>,
    /// The accept loop (it owns the listener and every relay); `None`
    /// while cut.
    accept: Mutex<Option<JoinHandle<()>>>,
    // Declared last: the socket's directory outlives the accept loop.
    _dir: TempDir,
}

impl EngineProxy {
    /// Listens on a fresh socket and relays every connection to `upstream`.
    pub fn start(upstream: impl Into<PathBuf>) -> Result<Self> {
        let dir = TempDir::new("dormouse-engine-proxy");
        let socket = dir.path().join("engine.sock");
        let proxy = Self {
            socket,
            upstream: upstream.into(),
            switches: Arc::new(Switches::default()),
            accept: Mutex::new(None),
            _dir: dir,
        };
        proxy.listen()?;
        Ok(proxy)
    }

    fn listen(&self) -> Result<()> {
        let _ = std::fs::remove_file(&self.socket);
        let listener = UnixListener::bind(&self.socket)
            .with_context(|| format!("binding {}", self.socket.display()))?;
        let shared = self.switches.clone();
        let upstream = self.upstream.clone();
        let accept = tokio::spawn(async move {
            // Dropped with this task: every relay ends with it.
            let mut relays = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                let Ok(engine) = UnixStream::connect(&upstream).await else {
                    continue;
                };
                relays.spawn(relay(client, engine, shared.clone()));
            }
        });
        let old = self
            .accept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(accept);
        if let Some(old) = old {
            old.abort();
        }
        Ok(())
    }

    /// The socket to give the broker (`--engine-socket unix://…`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// From now on the event streams go silent (their connections stay open).
    pub fn stall_events(&self) {
        self.switches.stalled.store(true, Ordering::SeqCst);
    }

    /// Cuts the engine off: every relayed connection is dropped and nothing
    /// listens on the socket until [`Self::restore`] (connecting is refused).
    pub fn cut(&self) {
        let accept = self
            .accept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(accept) = accept {
            accept.abort();
        }
    }

    /// Whether the proxy is cut now.
    pub fn is_cut(&self) -> bool {
        self.accept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Listens again after [`Self::cut`], on the same socket path.
    pub fn restore(&self) -> Result<()> {
        self.listen()
    }

    /// Event subscriptions relayed so far.
    pub fn subscriptions(&self) -> usize {
        self.switches.subscriptions.load(Ordering::SeqCst)
    }

    /// Chunks of event-stream bytes swallowed since the stall.
    pub fn swallowed(&self) -> usize {
        self.switches.swallowed.load(Ordering::SeqCst)
    }

    /// Connections accepted so far (every one is relayed).
    pub fn accepted(&self) -> usize {
        self.switches.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for EngineProxy {
    fn drop(&mut self) {
        self.cut();
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

    #[tokio::test]
    async fn a_cut_drops_every_connection_and_refuses_new_ones_until_restored() {
        let dir = TempDir::new("dormouse-proxy-test");
        let upstream = dir.path().join("upstream.sock");
        let engine = UnixListener::bind(&upstream).unwrap();
        // An "engine" that echoes.
        tokio::spawn(async move {
            while let Ok((mut s, _)) = engine.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = EngineProxy::start(&upstream).unwrap();
        let mut open = UnixStream::connect(proxy.socket()).await.unwrap();
        open.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        open.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");

        proxy.cut();
        assert!(proxy.is_cut());
        let mut rest = Vec::new();
        let n = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            open.read_to_end(&mut rest),
        )
        .await
        .expect("the open connection is dropped")
        .unwrap_or(0);
        assert_eq!(n, 0);
        let refused = UnixStream::connect(proxy.socket()).await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

        proxy.restore().unwrap();
        let mut again = UnixStream::connect(proxy.socket()).await.unwrap();
        again.write_all(b"back").await.unwrap();
        again.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"back");
    }

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
