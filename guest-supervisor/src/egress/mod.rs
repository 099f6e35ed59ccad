//! The desktop's egress proxy: an HTTP proxy on the guest loopback
//! (`127.0.0.1:3128`, and `[::1]:3128` when the guest has IPv6 loopback)
//! whose every accepted client becomes one byte stream to the broker over
//! a connection the broker parked on the guest socket (`egress_accept`,
//! [`dormouse_protocol::egress`]). The guest has no network interface;
//! this is its only way out, and the broker decides every connection.
//!
//! Parts: [`head`] reads and checks a client's request head (bounded in
//! bytes and time), [`hub`] queues the parked broker connections and hands
//! each client to the oldest, [`session`] serves one parked connection
//! (open, verdict, answer, relay), [`reply`] writes the proxy's own
//! answers. Clients are capped at [`MAX_CLIENTS`] (more get `503` at once),
//! so a guest program cannot spend the supervisor's descriptors.
//!
//! It never resolves a name, never dials anything itself, and never
//! changes the status: it only records whether it serves, which the
//! self-probe reports ([`health_check`]).

pub mod head;
pub mod hub;
pub mod reply;
pub mod session;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dormouse_protocol::egress::{EgressForm, EgressOpen, PROXY_PORT};
use dormouse_protocol::{Check, CheckStatus};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use hub::{Handoff, Hub, ParkError, MAX_PARKED};

/// Most proxy clients at once (reading their head, waiting for the broker,
/// or relaying).
pub const MAX_CLIENTS: usize = 1024;

/// How long a client has to send its whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client waits for a parked broker connection.
pub const BROKER_WAIT: Duration = Duration::from_secs(5);

/// Name of the proxy's check in the health report.
pub const CHECK_NAME: &str = "egress_proxy";

/// What the proxy recorded of its start, for the self-probe; `None` until
/// it tried (and in processes that never run it).
static HEALTH: Mutex<Option<Check>> = Mutex::new(None);

/// The proxy's check for the health report, once it tried to start.
pub fn health_check() -> Option<Check> {
    HEALTH
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

fn record(check: Check) {
    *HEALTH
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(check);
}

/// Binds the proxy's port on both loopbacks and serves until dropped. A
/// taken IPv4 port is logged and reported (the desktop runs on without
/// egress); a missing IPv6 loopback is skipped quietly. `on_listening`
/// runs once the IPv4 port listens.
pub async fn serve(hub: Hub, on_listening: impl FnOnce()) {
    let v4 = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, PROXY_PORT))).await;
    let v6 = TcpListener::bind(SocketAddr::from((Ipv6Addr::LOCALHOST, PROXY_PORT))).await;
    let mut listeners = Vec::new();
    let mut served = Vec::new();
    match v4 {
        Ok(l) => {
            listeners.push(l);
            served.push(format!("127.0.0.1:{PROXY_PORT}"));
        }
        Err(e) => {
            tracing::warn!(port = PROXY_PORT, error = %e, "egress proxy cannot listen on 127.0.0.1");
            let detail = format!("127.0.0.1:{PROXY_PORT} cannot be bound: {e}");
            record(Check::new(CHECK_NAME, CheckStatus::Degraded, detail));
            return;
        }
    }
    match v6 {
        Ok(l) => {
            listeners.push(l);
            served.push(format!("[::1]:{PROXY_PORT}"));
        }
        Err(e) => tracing::debug!(error = %e, "no IPv6 loopback for the egress proxy"),
    }
    let detail = format!("serving on {}", served.join(" and "));
    tracing::info!(on = %served.join(", "), "egress proxy listening");
    record(Check::new(CHECK_NAME, CheckStatus::Ok, detail));
    on_listening();
    serve_on(listeners, hub, MAX_CLIENTS).await;
}

/// Serves `listeners` until dropped, at most `max_clients` at once over
/// all of them.
pub async fn serve_on(listeners: Vec<TcpListener>, hub: Hub, max_clients: usize) {
    hub.set_serving(true);
    let slots = Arc::new(Semaphore::new(max_clients));
    let mut loops = JoinSet::new();
    for listener in listeners {
        loops.spawn(accept_loop(listener, hub.clone(), Arc::clone(&slots)));
    }
    while loops.join_next().await.is_some() {}
    hub.set_serving(false);
}

async fn accept_loop(listener: TcpListener, hub: Hub, slots: Arc<Semaphore>) {
    let mut clients = JoinSet::new();
    let mut errors = 0u32;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    errors = 0;
                    match Arc::clone(&slots).try_acquire_owned() {
                        Ok(permit) => {
                            clients.spawn(client_task(client, hub.clone(), permit));
                        }
                        Err(_) => refuse_busy(&client),
                    }
                }
                Err(e) => {
                    errors = errors.saturating_add(1);
                    let pause = Duration::from_millis(10u64 << errors.min(6));
                    tracing::warn!(error = %e, ?pause, "egress proxy accept failed");
                    tokio::time::sleep(pause).await;
                }
            },
            Some(_) = clients.join_next(), if !clients.is_empty() => {}
        }
    }
}

/// Tells an over-cap client why, without waiting on it.
fn refuse_busy(client: &TcpStream) {
    let reason = "egress unavailable: too many connections are open already";
    // A fresh socket's send buffer is empty: this writes all or nothing.
    let _ = client.try_write(&reply::answer(503, reason, false));
}

/// One client: its head, then the hand-off to a parked broker connection
/// (which then owns the client and its permit).
async fn client_task(mut client: TcpStream, hub: Hub, permit: tokio::sync::OwnedSemaphorePermit) {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let request = match head::read_head(&mut client, deadline).await {
        Ok((raw, early)) => head::parse(&raw).map(|r| (r, early)),
        Err(e) => Err(e),
    };
    let (request, early) = match request {
        Ok(ok) => ok,
        Err(e) => {
            tracing::debug!(status = e.status, reason = %e.reason, "egress request refused");
            session::answer(&mut client, e.status, &e.reason, false).await;
            return;
        }
    };
    let html = matches!(request.form, EgressForm::Http { .. });
    let mut payload = request.upstream_head;
    payload.extend_from_slice(&early);
    let open = EgressOpen {
        id: hub.next_id(),
        host: request.host,
        port: request.port,
        form: request.form,
        hand_over: true,
    };
    let handoff = Handoff {
        client,
        open,
        payload,
        permit,
    };
    if let Err(mut back) = hub.hand_off(handoff, BROKER_WAIT).await {
        tracing::debug!(id = back.open.id, "no parked broker connection");
        let reason = "egress unavailable: the broker is not connected";
        session::answer(&mut back.client, 503, reason, html).await;
    }
}

#[cfg(test)]
mod tests;
