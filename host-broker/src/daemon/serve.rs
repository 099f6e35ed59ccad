//! Serving the API on a bound listener with hyper's HTTP/1 server, under
//! limits a client cannot talk its way around.
//!
//! It owns the accept loop and each connection's lifetime: a cap on open
//! connections (a semaphore taken before `accept`, so beyond the cap new
//! connections wait in the kernel's listen backlog and cost the broker no
//! file descriptor), a deadline for a request's head (also the idle time a
//! kept-alive connection may wait for its next request), a deadline for a
//! request's body, and a bound on how long a write may stall because the
//! client does not read. It never looks inside a request beyond that: what a
//! request means is the router's business.
//!
//! Only HTTP/1.1 is spoken (no HTTP/2 prior knowledge): every client of the
//! API speaks it, and hyper's head deadline exists for HTTP/1 only.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::listen::ApiListener;
pub use dormouse_http::body::{BodyDeadline, BodyTimedOut};

/// Default deadline for a request's head (request line and headers), and for
/// the silence of a kept-alive connection between two requests.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Default deadline for a request's body, counted from its head. Bodies are
/// at most [`dormouse_http::BODY_LIMIT`] (64 KiB): even a slow link sends that
/// in well under a second.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Default bound on a write that cannot progress because the client does not
/// read (responses, WebSocket events).
pub const DEFAULT_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Default cap on open connections (WebSockets included).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 512;

/// How often the "connection cap reached" line may be logged.
const CAP_LOG_EVERY: Duration = Duration::from_secs(60);

/// How long the accept loop pauses after an error that is not about one
/// connection (out of file descriptors, say), so it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(500);

/// The limits every connection is served under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Deadline for a request's head, and for an idle kept-alive connection.
    pub header_timeout: Duration,
    /// Deadline for a request's body, from the moment its head was read.
    pub body_timeout: Duration,
    /// How long a write may make no progress before the connection closes.
    pub write_stall_timeout: Duration,
    /// Most connections open at once; beyond it new ones wait to be accepted.
    pub max_connections: u32,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            write_stall_timeout: DEFAULT_WRITE_STALL_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then lets the
/// open connections finish (hyper's graceful shutdown) and returns once every
/// one has closed. WebSockets close themselves on the same signal.
pub async fn serve(
    listener: ApiListener,
    router: Router,
    limits: ServeLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    match listener {
        ApiListener::Tcp(l) => accept_loop(TcpAcceptor(l), router, limits, shutdown).await,
        ApiListener::Unix(l, _) => accept_loop(UnixAcceptor(l), router, limits, shutdown).await,
    }
}

/// A listener the accept loop can take connections from.
trait Acceptor: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Io>>;
}

struct TcpAcceptor(tokio::net::TcpListener);

impl Acceptor for TcpAcceptor {
    type Io = tokio::net::TcpStream;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Io>> {
        self.0.poll_accept(cx).map_ok(|(stream, _)| {
            // Small JSON answers; waiting for more to send only adds latency.
            let _ = stream.set_nodelay(true);
            stream
        })
    }
}

struct UnixAcceptor(tokio::net::UnixListener);

impl Acceptor for UnixAcceptor {
    type Io = tokio::net::UnixStream;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Io>> {
        self.0.poll_accept(cx).map_ok(|(stream, _)| stream)
    }
}

async fn accept_loop<A: Acceptor>(
    acceptor: A,
    router: Router,
    limits: ServeLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let max = limits.max_connections.max(1);
    let permits = Arc::new(Semaphore::new(max as usize));
    let mut cap_logged: Option<Instant> = None;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if cap_logged.is_none_or(|at| at.elapsed() >= CAP_LOG_EVERY) {
                    cap_logged = Some(Instant::now());
                    tracing::warn!(
                        max_connections = max,
                        "connection cap reached: {max} connections are open; new connections \
                         wait in the listen backlog until one closes (logged at most once a minute)"
                    );
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => {
                        permit.map_err(io::Error::other)?
                    }
                    () = shutdown.cancelled() => break,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = std::future::poll_fn(|cx| acceptor.poll_accept(cx)) => accepted,
            () = shutdown.cancelled() => break,
        };
        match accepted {
            Ok(io) => {
                tokio::spawn(serve_connection(
                    io,
                    permit,
                    router.clone(),
                    limits,
                    shutdown.clone(),
                ));
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors, most likely: wait for some to close.
                tracing::warn!(error = %e, "accepting a connection failed; pausing");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    // The listener closes here; wait for the open connections to finish.
    drop(acceptor);
    let _all = permits.acquire_many(max).await;
    Ok(())
}

/// An error about one connection that was already gone when accepted.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

async fn serve_connection<S>(
    io: S,
    permit: OwnedSemaphorePermit,
    router: Router,
    limits: ServeLimits,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The permit travels with the stream, so a connection upgraded to a
    // WebSocket still counts until the WebSocket closes.
    let io = TokioIo::new(Guarded::new(io, permit, limits.write_stall_timeout));
    let body_timeout = limits.body_timeout;
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let deadline = BodyDeadline::default();
        let mut request = request.map(|body| {
            axum::body::Body::new(TimedBody::new(body, body_timeout, deadline.clone()))
        });
        request.extensions_mut().insert(deadline);
        router.clone().oneshot(request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(connection);
    let outcome = tokio::select! {
        outcome = connection.as_mut() => outcome,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = outcome {
        // A client that timed out or went away: its own business.
        tracing::debug!(error = %e, "connection closed");
    }
}

/// A request body with a deadline: past it, reading fails with
/// [`BodyTimedOut`], and hyper closes the connection instead of draining it.
struct TimedBody {
    inner: Incoming,
    deadline: tokio::time::Instant,
    timer: Option<Pin<Box<Sleep>>>,
    limit: Duration,
    per_frame: BodyDeadline,
}

impl TimedBody {
    fn new(inner: Incoming, limit: Duration, per_frame: BodyDeadline) -> Self {
        Self {
            inner,
            deadline: tokio::time::Instant::now() + limit,
            timer: None,
            limit,
            per_frame,
        }
    }
}

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    // Boxed, so the extractor can find a `BodyTimedOut` by downcasting.
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if this.per_frame.counts_per_frame() {
                    this.deadline = tokio::time::Instant::now() + this.limit;
                    this.timer = None;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let deadline = this.deadline;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.limit))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's stream, holding its place under the cap and failing a
/// write that made no progress for the stall bound.
struct Guarded<S> {
    io: S,
    _permit: OwnedSemaphorePermit,
    stall_limit: Duration,
    stall: Option<Pin<Box<Sleep>>>,
}

impl<S> Guarded<S> {
    fn new(io: S, permit: OwnedSemaphorePermit, stall_limit: Duration) -> Self {
        Self {
            io,
            _permit: permit,
            stall_limit,
            stall: None,
        }
    }

    /// Called when a write returned `Pending`: arms the stall timer once and
    /// fails the write when it fires.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.stall_limit;
        let timer = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<T>(&mut self, ready: io::Result<T>) -> Poll<io::Result<T>> {
        self.stall = None;
        Poll::Ready(ready)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(r) => this.progressed(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => this.progressed(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Ready(r) => this.progressed(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_shutdown(cx) {
            Poll::Ready(r) => this.progressed(r),
            Poll::Pending => this.stalled(cx),
        }
    }
}
