//! The relay of one viewer: WebSocket binary messages to and from a
//! connected VNC socket, the client side through [`RfbFilter`] and, for a
//! view capability, the server side through [`RfbServerFilter`] (a control
//! connection's server side goes through as it is).
//!
//! It owns the connection's buffers and its end: revocation, expiry, a
//! broker shutdown, a protocol violation, a viewer too slow to read, or the
//! desktop's VNC server going away each close it with a WebSocket close code
//! and a reason. It must never queue without bound: one read buffer toward
//! the viewer, one filtered message toward the server, and every send to
//! the viewer is bounded in time, so a viewer that stops reading is dropped
//! instead of holding memory or anyone else up. Each viewer has its own VNC
//! connection, so backpressure stays per viewer (the guest's x11vnc runs
//! with `-threads`, a thread per client).

use std::pin::pin;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use dormouse_protocol::screen::{
    RevokeReason, ScreenMode, CLOSE_DESKTOP_GONE, CLOSE_DESKTOP_PROTOCOL, CLOSE_PROTOCOL,
    CLOSE_TOO_SLOW, MAX_SCREEN_CONNECTIONS,
};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::rfb::{RfbFilter, RfbViolation, MAX_CUT_TEXT};
use super::rfb_server::{RfbServerFilter, RfbServerViolation};

/// When, after a viewer's first whole-screen request, the gateway asks the
/// server for the whole screen again (see [`upstream`]).
const FULL_REFRESH_AFTER: [Duration; 3] = [
    Duration::from_millis(300),
    Duration::from_millis(1000),
    Duration::from_millis(3000),
];

/// How long a connection's first request for updates waits, counted from
/// the relay's start (just after the VNC connection was made): x11vnc reads
/// the screen into its framebuffer only while a client is connected and past
/// its handshake, on its main loop, which sleeps 200 ms at a time while no
/// client is connected. A request that reaches it sooner is answered from a
/// framebuffer never read since x11vnc started (black) or last read when the
/// previous viewer left (an older screen). See docs/screens.md.
pub const FIRST_UPDATE_AFTER: Duration = Duration::from_millis(250);

/// The bounds of one relay.
#[derive(Debug, Clone, Copy)]
pub struct RelayLimits {
    /// How long one send to the viewer may take before it counts as too slow.
    pub send_stall: Duration,
    /// Bytes read from the VNC server per WebSocket message.
    pub read_chunk: usize,
    /// Largest WebSocket message (and frame) accepted from a viewer.
    pub max_client_message: usize,
    /// How often an idle connection is pinged.
    pub ping_every: Duration,
    /// How long the close frame may take to go out.
    pub close_within: Duration,
    /// How long a connection whose VNC server closed waits for the
    /// revocation that usually follows (a killed or stopped desktop closes
    /// its socket a moment before the broker hears why), so the viewer is
    /// told the reason rather than only that the screen closed.
    pub gone_grace: Duration,
    /// How long after the relay starts the viewer's first request for
    /// updates may reach the VNC server (see [`upstream`]): it is held, with
    /// everything after it, until then.
    pub first_update_after: Duration,
}

impl Default for RelayLimits {
    fn default() -> Self {
        Self {
            send_stall: Duration::from_secs(10),
            read_chunk: 64 * 1024,
            // A whole clipboard message fits in one WebSocket message.
            max_client_message: usize::try_from(MAX_CUT_TEXT).unwrap_or(1 << 20) + 64 * 1024,
            ping_every: Duration::from_secs(30),
            close_within: Duration::from_secs(1),
            gone_grace: Duration::from_millis(800),
            first_update_after: FIRST_UPDATE_AFTER,
        }
    }
}

/// What one relay is allowed and listens to.
#[derive(Debug)]
pub struct RelaySession {
    /// What the capability allows.
    pub mode: ScreenMode,
    /// When the capability expires.
    pub deadline: Instant,
    /// The capability's revocation signal.
    pub revoked: watch::Receiver<Option<RevokeReason>>,
    /// Cancelled when the broker shuts down.
    pub shutdown: CancellationToken,
}

/// How a relay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayEnd {
    /// The viewer closed or its connection failed.
    Viewer,
    /// The capability was revoked or expired, or the broker shuts down.
    Revoked(RevokeReason),
    /// The viewer sent RFB the filter refuses.
    Protocol(RfbViolation),
    /// The desktop sent a view connection RFB the gateway cannot frame.
    DesktopProtocol(RfbServerViolation),
    /// The viewer sent a text message (RFB is binary only).
    TextMessage,
    /// A send to the viewer took longer than [`RelayLimits::send_stall`].
    TooSlow,
    /// The VNC server closed or failed.
    DesktopGone,
    /// The VNC server closed before it said a byte: the guest refused the
    /// connection (its screen full) or its server does not answer.
    DesktopRefused,
}

impl RelayEnd {
    /// The close frame to send, if any (a viewer that left gets none).
    pub fn close_frame(&self) -> Option<(u16, String)> {
        match self {
            Self::Viewer => None,
            Self::Revoked(reason) => Some((reason.close_code(), reason.close_reason().to_owned())),
            Self::Protocol(v) => Some((CLOSE_PROTOCOL, format!("rfb refused: {v}"))),
            Self::DesktopProtocol(v) => Some((
                CLOSE_DESKTOP_PROTOCOL,
                format!("the desktop's rfb refused: {v}"),
            )),
            Self::TextMessage => Some((CLOSE_PROTOCOL, "rfb refused: text message".to_owned())),
            Self::TooSlow => Some((CLOSE_TOO_SLOW, "viewer too slow".to_owned())),
            Self::DesktopGone => {
                Some((CLOSE_DESKTOP_GONE, "the desktop's screen closed".to_owned()))
            }
            Self::DesktopRefused => Some((
                CLOSE_DESKTOP_GONE,
                format!(
                    "the desktop's screen closed before its greeting (full at {MAX_SCREEN_CONNECTIONS}, or not answering)"
                ),
            )),
        }
    }
}

/// Counts of one relay, for the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Bytes sent to the viewer.
    pub to_viewer: u64,
    /// Bytes forwarded to the VNC server.
    pub to_desktop: u64,
    /// Input messages dropped (view mode).
    pub dropped_input: u64,
    /// The desktop's clipboard messages dropped (view mode).
    pub dropped_cut_text: u64,
}

/// Relays until something ends it; sends the close frame; returns why.
pub async fn relay(
    socket: WebSocket,
    vnc: UnixStream,
    mut session: RelaySession,
    limits: RelayLimits,
) -> (RelayEnd, RelayStats) {
    let (mut ws_tx, ws_rx) = socket.split();
    let (vnc_rd, vnc_wr) = vnc.into_split();
    let mut stats = RelayStats::default();
    let mut up_stats = RelayStats::default();
    let filter = RfbFilter::new(session.mode);
    // View: the desktop's side is framed, its clipboard cut out.
    let mut server =
        (session.mode == ScreenMode::View).then(|| RfbServerFilter::new(filter.negotiated()));
    let first_update_at = Instant::now() + limits.first_update_after;
    let end = {
        let up = pin!(upstream(
            ws_rx,
            vnc_wr,
            filter,
            first_update_at,
            &mut up_stats
        ));
        downstream(
            &mut ws_tx,
            vnc_rd,
            &mut session,
            limits,
            up,
            &mut server,
            &mut stats,
        )
        .await
    };
    stats.dropped_cut_text = server.as_ref().map_or(0, RfbServerFilter::dropped_cut_text);
    stats.to_desktop = up_stats.to_desktop;
    stats.dropped_input = up_stats.dropped_input;
    if let Some((code, reason)) = end.close_frame() {
        let close = Message::Close(Some(CloseFrame {
            code,
            reason: Utf8Bytes::from(reason),
        }));
        // Bounded: a viewer that does not read does not get to hold the
        // relay open; dropping both halves closes the TCP connection.
        let _ = tokio::time::timeout(limits.close_within, ws_tx.send(close)).await;
    } else {
        // The viewer closed: flush the close reply the socket queued.
        let _ = tokio::time::timeout(limits.close_within, ws_tx.close()).await;
    }
    (end, stats)
}

/// Why the current capability no longer holds, if it does not.
fn revoked(rx: &watch::Receiver<Option<RevokeReason>>) -> Option<RevokeReason> {
    *rx.borrow()
}

/// Waits until the capability is revoked (a dropped sender means revoked:
/// the registry forgot the capability).
async fn until_revoked(rx: &mut watch::Receiver<Option<RevokeReason>>) -> RevokeReason {
    loop {
        if let Some(reason) = revoked(rx) {
            return reason;
        }
        if rx.changed().await.is_err() {
            return revoked(rx).unwrap_or(RevokeReason::Deleted);
        }
    }
}

async fn downstream<F>(
    ws_tx: &mut SplitSink<WebSocket, Message>,
    mut vnc_rd: OwnedReadHalf,
    session: &mut RelaySession,
    limits: RelayLimits,
    mut up: std::pin::Pin<&mut F>,
    server: &mut Option<RfbServerFilter>,
    stats: &mut RelayStats,
) -> RelayEnd
where
    F: std::future::Future<Output = RelayEnd>,
{
    let mut buf = vec![0u8; limits.read_chunk.max(1)];
    // What the server filter lets through of one read (at most one read).
    let mut framed = Vec::new();
    let mut from_desktop = 0u64;
    let mut ping = tokio::time::interval(limits.ping_every);
    ping.tick().await;
    let deadline = session.deadline;
    let shutdown = session.shutdown.clone();
    let revoked_rx = &mut session.revoked;
    loop {
        let message = tokio::select! {
            biased;
            reason = until_revoked(revoked_rx) => return RelayEnd::Revoked(reason),
            () = tokio::time::sleep_until(deadline) => return RelayEnd::Revoked(RevokeReason::Expired),
            () = shutdown.cancelled() => return RelayEnd::Revoked(RevokeReason::Shutdown),
            end = &mut up => return end,
            read = vnc_rd.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    return match tokio::time::timeout(limits.gone_grace, until_revoked(revoked_rx)).await {
                        Ok(reason) => RelayEnd::Revoked(reason),
                        Err(_) if from_desktop == 0 => RelayEnd::DesktopRefused,
                        Err(_) => RelayEnd::DesktopGone,
                    };
                }
                Ok(n) => {
                    from_desktop += n as u64;
                    let data = match server.as_mut() {
                        None => &buf[..n],
                        Some(filter) => {
                            framed.clear();
                            if let Err(v) = filter.feed(&buf[..n], &mut framed) {
                                // What was framed before the fault still
                                // goes (bounded), so the viewer has the
                                // stream up to it, then the close.
                                if !framed.is_empty() {
                                    let last = Message::Binary(Bytes::copy_from_slice(&framed));
                                    let _ = tokio::time::timeout(limits.send_stall, ws_tx.send(last)).await;
                                }
                                return RelayEnd::DesktopProtocol(v);
                            }
                            if framed.is_empty() {
                                continue;
                            }
                            &framed[..]
                        }
                    };
                    stats.to_viewer += data.len() as u64;
                    Message::Binary(Bytes::copy_from_slice(data))
                }
            },
            _ = ping.tick() => Message::Ping(Bytes::new()),
        };
        // While one send is pending nothing else is read from the server
        // (that is the per-viewer backpressure), but revocation still wins.
        tokio::select! {
            biased;
            reason = until_revoked(revoked_rx) => return RelayEnd::Revoked(reason),
            () = tokio::time::sleep_until(deadline) => return RelayEnd::Revoked(RevokeReason::Expired),
            () = shutdown.cancelled() => return RelayEnd::Revoked(RevokeReason::Shutdown),
            sent = tokio::time::timeout(limits.send_stall, ws_tx.send(message)) => match sent {
                Err(_) => return RelayEnd::TooSlow,
                Ok(Err(_)) => return RelayEnd::Viewer,
                Ok(Ok(())) => {}
            },
        }
    }
}

async fn upstream(
    mut ws_rx: SplitStream<WebSocket>,
    mut vnc_wr: OwnedWriteHalf,
    mut filter: RfbFilter,
    first_update_at: Instant,
    stats: &mut RelayStats,
) -> RelayEnd {
    let mut out = Vec::new();
    // The first frame is the screen: the viewer's first request for updates
    // (and whatever follows it) waits until `first_update_at`, by when
    // x11vnc has read the screen for this connection. Until then nothing
    // from this viewer reaches the server, so the order of its messages is
    // kept; revocation and the rest are the downstream's and stay immediate.
    // x11vnc can answer the first whole-screen request of a connection with
    // a black buffer (but for the pointer it draws) and then only send what
    // changes, so a viewer of a still desktop would stay black. The gateway
    // asks for the whole screen again a few times after the viewer first
    // did: a bounded number of extra frames per connection.
    let mut refresh: Option<([u8; 10], usize)> = None;
    let refresh_timer = tokio::time::sleep(Duration::ZERO);
    let mut refresh_timer = pin!(refresh_timer);
    let end = loop {
        let next = tokio::select! {
            next = ws_rx.next() => next,
            () = &mut refresh_timer, if refresh.is_some() => {
                let Some((request, sent)) = refresh.take() else { continue };
                if filter.at_message_boundary() {
                    if vnc_wr.write_all(&request).await.is_err() {
                        break RelayEnd::DesktopGone;
                    }
                    stats.to_desktop += request.len() as u64;
                }
                if let Some(after) = FULL_REFRESH_AFTER.get(sent + 1) {
                    refresh = Some((request, sent + 1));
                    refresh_timer.as_mut().reset(Instant::now() + *after);
                }
                continue;
            }
        };
        let data = match next {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break RelayEnd::Viewer,
            Some(Ok(Message::Binary(data))) => data,
            Some(Ok(Message::Text(_))) => break RelayEnd::TextMessage,
            // Pings are answered by the socket itself.
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
        };
        out.clear();
        if let Err(violation) = filter.feed(&data, &mut out) {
            break RelayEnd::Protocol(violation);
        }
        stats.dropped_input = filter.dropped();
        let mut rest = &out[..];
        if let Some(at) = filter.take_first_ask_offset() {
            if Instant::now() < first_update_at {
                if vnc_wr.write_all(&rest[..at]).await.is_err() {
                    break RelayEnd::DesktopGone;
                }
                stats.to_desktop += at as u64;
                rest = &rest[at..];
                tokio::time::sleep_until(first_update_at).await;
            }
        }
        if !rest.is_empty() {
            if vnc_wr.write_all(rest).await.is_err() {
                break RelayEnd::DesktopGone;
            }
            stats.to_desktop += rest.len() as u64;
        }
        if let Some(request) = filter.take_first_full_request() {
            refresh = Some((request, 0));
            refresh_timer
                .as_mut()
                .reset(Instant::now() + FULL_REFRESH_AFTER[0]);
        }
        // Never keep a large buffer alive after one large clipboard message.
        if out.capacity() > 256 * 1024 {
            out = Vec::new();
        }
    };
    stats.dropped_input = filter.dropped();
    end
}
