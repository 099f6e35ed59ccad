//! One connection, from the guest's request to its end: the caps, the
//! decision, the resolution, the dial of a checked address, the one
//! verdict the guest is sent, then the byte pipe both ways until either
//! side closes, the idle timeout passes, the desktop is fenced, or a policy
//! change denies it; and its audit entry.
//!
//! It never dials an address the decision did not pass, and never leaves
//! a guest waiting: every path sends a verdict or drops the stream.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::Utc;
use dormouse_protocol::egress_policy::{
    Destination, EgressDecision, EgressEnd, EgressKind, EgressLogEntry,
};
use dormouse_protocol::splice::{self, HandedSocket};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;

use crate::closer::Closer;
use crate::decide::{check_addresses, check_name, recheck, Pass};
use crate::limits::Slot;
use crate::service::Desk;

/// Longest host kept in an audit entry.
const MAX_LOGGED_HOST: usize = 260;

/// What the guest asked for on one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    /// The host, as the guest sent it (hostile until parsed).
    pub host: String,
    /// The port.
    pub port: u16,
    /// A tunnel or one plain-HTTP request.
    pub kind: EgressKind,
    /// For plain HTTP, the rewritten request head to send upstream first.
    pub head: Vec<u8>,
}

/// The one answer the guest gets before the pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Connected: the stream is a byte pipe from now on.
    Connected,
    /// Connected, and the guest hands its program's socket over next
    /// (only when [`GuestStream::can_hand_over`]).
    HandOver,
    /// Refused by the policy or a cap, with the reason line.
    Refused(String),
    /// Allowed but not reached, with the cause.
    Failed(String),
}

/// A guest connection that has asked: it is told the verdict, then its
/// socket carries the bytes.
pub trait GuestStream: Send {
    /// Sends the one verdict frame.
    fn send_verdict(&mut self, verdict: Verdict) -> impl Future<Output = io::Result<()>> + Send;
    /// The socket the bytes go through after [`Verdict::Connected`].
    fn socket(&self) -> &UnixStream;
    /// Whether the guest offered its program's socket, on a channel that
    /// can carry it.
    fn can_hand_over(&self) -> bool {
        false
    }
    /// After [`Verdict::HandOver`]: the guest program's socket, checked to
    /// be a connected TCP socket, within `within`; whatever the guest sent,
    /// taken or refused, is closed by `closer`.
    fn take_client(
        &mut self,
        within: std::time::Duration,
        closer: &Closer,
    ) -> impl Future<Output = io::Result<HandedSocket>> + Send {
        let _ = (within, closer);
        std::future::ready(Err(io::Error::other("this guest hands nothing over")))
    }
    /// Closes the guest connection once its socket was handed over: by
    /// `closer` where the connection may still hold descriptors the guest
    /// sent (their last close may linger), else here.
    fn close_with(self, closer: &Closer)
    where
        Self: Sized,
    {
        let _ = closer;
    }
}

/// The host as logged: escaped, capped.
fn logged_host(host: &str) -> String {
    host.chars()
        .flat_map(char::escape_default)
        .take(MAX_LOGGED_HOST)
        .collect()
}

/// Serves one asked connection to its end and records it.
pub async fn serve<G: GuestStream>(desk: Arc<Desk>, open: Open, mut guest: G) {
    let started = Instant::now();
    let mut entry = EgressLogEntry {
        seq: 0,
        time: Utc::now(),
        computer: desk.computer(),
        host: logged_host(&open.host),
        port: open.port,
        kind: open.kind.clone(),
        address: None,
        decision: EgressDecision::Refused,
        rule: None,
        reason: None,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
        end: EgressEnd::NotOpened,
    };
    let reached = tokio::select! {
        r = decide_and_dial(&desk, &open, &mut entry) => r,
        () = desk.fenced() => Err(Verdict::Failed("failed: the desktop stopped".into())),
    };
    let (upstream, dest, addr, _slot) = match reached {
        Ok(reached) => reached,
        Err(verdict) => {
            match &verdict {
                Verdict::Refused(r) => {
                    entry.decision = EgressDecision::Refused;
                    entry.reason = Some(r.clone());
                }
                Verdict::Failed(r) => {
                    entry.decision = EgressDecision::Failed;
                    entry.reason = Some(r.clone());
                }
                Verdict::Connected | Verdict::HandOver => {}
            }
            desk.decided(&entry);
            // The guest may already be gone; the refusal is recorded either way.
            let _ = tokio::time::timeout(desk.caps().connect_timeout, guest.send_verdict(verdict))
                .await;
            entry.duration_ms = elapsed_ms(started);
            desk.record(entry);
            return;
        }
    };
    entry.decision = EgressDecision::Allowed;
    desk.decided(&entry);
    let (end, up, down) = pipe(&desk, &open, guest, upstream, &dest, addr).await;
    entry.bytes_up = up;
    entry.bytes_down = down;
    entry.end = end;
    entry.duration_ms = elapsed_ms(started);
    desk.record(entry);
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The caps, the decision, the resolution and the dial; the entry gets
/// the rule and the address as they are known.
async fn decide_and_dial(
    desk: &Desk,
    open: &Open,
    entry: &mut EgressLogEntry,
) -> Result<(TcpStream, Destination, SocketAddr, Slot), Verdict> {
    if let Some(reason) = desk.closer().refusal() {
        return Err(Verdict::Refused(reason));
    }
    let slot = desk.limiter().admit().map_err(Verdict::Refused)?;
    let dest = Destination::parse(&open.host)
        .map_err(|why| Verdict::Refused(format!("denied: invalid host `{}`: {why}", entry.host)))?;
    let policy = desk.policy();
    let name = check_name(&policy, &dest, open.port).map_err(|r| {
        entry.rule = r.rule;
        Verdict::Refused(r.reason)
    })?;
    let resolved = desk
        .egress()
        .resolver()
        .resolve(&dest, open.port)
        .await
        .map_err(Verdict::Failed)?;
    let view = desk.egress().host_view();
    let passes =
        check_addresses(&policy, &dest, open.port, &name, &resolved, &view).map_err(|r| {
            entry.rule = r.rule;
            entry.address = r.address.map(|a| a.to_string());
            Verdict::Refused(r.reason)
        })?;
    let (stream, pass) = dial(desk, &passes, open.port).await.map_err(|(a, cause)| {
        entry.address = a.map(|a| a.to_string());
        Verdict::Failed(cause)
    })?;
    let addr = SocketAddr::new(pass.addr, open.port);
    entry.rule = pass.rule.clone();
    entry.address = Some(addr.to_string());
    Ok((stream, dest, addr, slot))
}

/// Dials the passed addresses in order within the connect timeout.
async fn dial(
    desk: &Desk,
    passes: &[Pass],
    port: u16,
) -> Result<(TcpStream, Pass), (Option<SocketAddr>, String)> {
    let timeout = desk.caps().connect_timeout;
    let deadline = Instant::now() + timeout;
    let mut last = (
        None,
        format!("failed: no address to connect to on port {port}"),
    );
    for pass in passes {
        let addr = SocketAddr::new(pass.addr, port);
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok((stream, pass.clone())),
            Ok(Err(e)) => last = (Some(addr), format!("failed: connect to {addr}: {e}")),
            Err(_) => {
                return Err((
                    Some(addr),
                    format!("failed: connect to {addr} timed out after {timeout:?}"),
                ))
            }
        }
    }
    Err(last)
}

/// The byte pipe of a connected connection, to its end.
async fn pipe<G: GuestStream>(
    desk: &Desk,
    open: &Open,
    mut guest: G,
    mut upstream: TcpStream,
    dest: &Destination,
    addr: SocketAddr,
) -> (EgressEnd, u64, u64) {
    let up = AtomicU64::new(0);
    let down = AtomicU64::new(0);
    let totals = || (up.load(Ordering::Relaxed), down.load(Ordering::Relaxed));
    if let Err(e) = upstream.set_nodelay(true) {
        tracing::debug!(error = %e, "no TCP_NODELAY on an egress connection");
    }
    // Handed over, the program's socket and the upstream are relayed here
    // directly; otherwise the bytes go through the guest session.
    let handed = guest.can_hand_over();
    let verdict = if handed {
        Verdict::HandOver
    } else {
        Verdict::Connected
    };
    if guest.send_verdict(verdict).await.is_err() {
        return (EgressEnd::Error, 0, 0);
    }
    // Handed over, the session has done its work: closing it lets the
    // guest forget the connection (the broker's own caps still hold it).
    let client = if handed {
        let taken = guest
            .take_client(desk.caps().connect_timeout, desk.closer())
            .await;
        guest.close_with(desk.closer());
        match taken {
            Ok(client) => {
                if let Err(e) = client.set_nodelay(true) {
                    tracing::debug!(error = %e, "no TCP_NODELAY on a handed-over connection");
                }
                Side::Program(client)
            }
            Err(e) => {
                tracing::debug!(computer = %desk.computer(), error = %e, "no socket handed over");
                return (EgressEnd::Error, 0, 0);
            }
        }
    } else {
        Side::Session(guest)
    };
    if !open.head.is_empty() {
        if upstream.write_all(&open.head).await.is_err() {
            return (EgressEnd::Error, 0, 0);
        }
        up.fetch_add(
            u64::try_from(open.head.len()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
    // Only the sockets go into the relay (a guest stream need not be Sync).
    let (program, session) = match &client {
        Side::Program(program) => (Some(program), None),
        Side::Session(guest) => (None, Some(guest.socket())),
    };
    let relayed = async {
        match (program, session) {
            (Some(program), _) => splice::relay(program, &upstream, &up, &down).await,
            (None, Some(session)) => splice::relay(session, &upstream, &up, &down).await,
            (None, None) => Err(io::Error::other("nothing to relay")),
        }
    };
    let end = tokio::select! {
        r = relayed => {
            if r.is_ok() { EgressEnd::Closed } else { EgressEnd::Error }
        }
        () = desk.fenced() => EgressEnd::Fenced,
        end = watch_policy(desk, dest, addr.ip(), addr.port()) => end,
        () = watch_idle(desk, &up, &down) => EgressEnd::Idle,
    };
    if end == EgressEnd::Closed {
        if let Side::Program(program) = &client {
            program.ended_cleanly();
        }
    }
    let (u, d) = totals();
    (end, u, d)
}

/// The guest end of a connected connection.
enum Side<G> {
    /// The program's own socket, handed over.
    Program(HandedSocket),
    /// The guest session, the bytes going through it.
    Session(G),
}

/// Ends when a policy change denies the connection (or the desktop's
/// policy is gone with it).
async fn watch_policy(desk: &Desk, dest: &Destination, addr: IpAddr, port: u16) -> EgressEnd {
    let mut rx = desk.watch_policy();
    loop {
        if rx.changed().await.is_err() {
            return EgressEnd::Fenced;
        }
        let policy = rx.borrow_and_update().clone();
        if let Err(r) = recheck(&policy, dest, addr, port, &desk.egress().host_view()) {
            tracing::info!(computer = %desk.computer(), %dest, %addr, reason = %r.reason, "a policy change cut an egress connection");
            return EgressEnd::Policy;
        }
    }
}

/// Ends after the idle timeout without a byte either way; each second
/// bytes moved counts as the desktop's activity.
async fn watch_idle(desk: &Desk, up: &AtomicU64, down: &AtomicU64) {
    let tick = std::time::Duration::from_secs(1);
    let mut seen = 0u64;
    let mut moved_at = Instant::now();
    let mut ticker = tokio::time::interval_at(Instant::now() + tick, tick);
    loop {
        ticker.tick().await;
        let total = up
            .load(Ordering::Relaxed)
            .wrapping_add(down.load(Ordering::Relaxed));
        if total != seen {
            seen = total;
            moved_at = Instant::now();
            desk.activity();
        } else if moved_at.elapsed() >= desk.caps().idle_timeout {
            return;
        }
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
