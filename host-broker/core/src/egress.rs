//! The broker's wiring of egress ([`dormouse_egress`]): one pool of parked
//! `egress_accept` connections per ready desktop, admitted through the one
//! road of guest calls ([`crate::relay`], `Purpose::Egress`), fenced when
//! the desktop leaves ready, its generation changes or it is removed; and
//! the hooks by which egress reaches the rest of the broker (activity for
//! the idle timer, counters, events).
//!
//! It follows the owner's status events and never decides a connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dormouse_egress::{Closer, Egress, GuestStream, Hooks, Open, Parker, Verdict};
use dormouse_protocol::api::{BrokerEvent, ComputerStatus, ContainerState};
use dormouse_protocol::egress::{EgressForm, EgressVerdict};
use dormouse_protocol::egress_policy::{EgressDecision, EgressKind, EgressLogEntry};
use dormouse_protocol::splice::HandedSocket;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::command::BrokerHandle;
use crate::guest::egress::EgressSession;
use crate::guest::GuestSocket;
use crate::metrics::Metrics;
use crate::relay::Purpose;

/// Connections kept parked per ready desktop.
pub const PARKED: usize = 4;
/// How often every desktop's pool is checked against the owner's view,
/// whatever the events said.
const RESYNC: Duration = Duration::from_secs(5);

/// What egress tells the broker: bytes as activity, decisions as counters
/// and events.
#[derive(Debug)]
pub struct BrokerHooks {
    broker: BrokerHandle,
    metrics: Arc<Metrics>,
}

impl BrokerHooks {
    /// Hooks into `broker` and `metrics`.
    pub fn new(broker: BrokerHandle, metrics: Arc<Metrics>) -> Self {
        Self { broker, metrics }
    }
}

impl Hooks for BrokerHooks {
    fn activity(&self, computer: Uuid) {
        let broker = self.broker.clone();
        tokio::spawn(async move {
            if let Err(e) = broker.egress_activity(computer).await {
                tracing::debug!(%computer, error = %e, "egress activity not counted");
            }
        });
    }

    fn counted(&self, _computer: Uuid, decision: EgressDecision) {
        self.metrics.egress_decision(decision);
    }

    fn event(&self, entry: &EgressLogEntry) {
        self.broker.publish(BrokerEvent::Egress {
            entry: Box::new(entry.clone()),
        });
    }

    fn stalled_close(&self, _computer: Uuid) {
        self.metrics.egress_stalled_close();
    }
}

impl GuestStream for EgressSession {
    async fn send_verdict(&mut self, verdict: Verdict) -> std::io::Result<()> {
        let verdict = match verdict {
            Verdict::Connected => EgressVerdict::Connected,
            Verdict::HandOver => EgressVerdict::HandOver,
            Verdict::Refused(reason) => EgressVerdict::Refused { reason },
            Verdict::Failed(reason) => EgressVerdict::Failed { reason },
        };
        self.verdict(&verdict).await
    }
    fn socket(&self) -> &tokio::net::UnixStream {
        EgressSession::socket(self)
    }
    fn can_hand_over(&self) -> bool {
        EgressSession::can_hand_over(self)
    }
    async fn take_client(
        &mut self,
        within: Duration,
        closer: &Closer,
    ) -> std::io::Result<HandedSocket> {
        EgressSession::take_client(self, within, closer).await
    }
    fn close_with(self, closer: &Closer) {
        EgressSession::close_with(self, closer);
    }
}

/// Parks connections over one desktop's guest channel.
#[derive(Debug)]
struct GuestParker {
    guest: GuestSocket,
}

impl Parker for GuestParker {
    type Conn = EgressSession;

    async fn park(&self) -> Result<(Open, EgressSession), String> {
        let conn = self.guest.connect().await.map_err(|e| e.to_string())?;
        let (open, head, session) = conn.egress_accept().await.map_err(|e| e.to_string())?;
        let kind = match open.form {
            EgressForm::Connect => EgressKind::Connect,
            EgressForm::Http { method } => EgressKind::Http { method },
        };
        Ok((
            Open {
                host: open.host,
                port: open.port,
                kind,
                head,
            },
            session,
        ))
    }
}

/// Starts following the owner: a pool per ready desktop until `shutdown`.
pub fn spawn(
    broker: BrokerHandle,
    egress: Arc<Egress>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(supervise(broker, egress, shutdown))
}

/// A running pool: the generation it was started under, and its fence.
type Pools = HashMap<Uuid, (u64, CancellationToken)>;

async fn supervise(broker: BrokerHandle, egress: Arc<Egress>, shutdown: CancellationToken) {
    let mut events = broker.subscribe();
    let mut pools: Pools = HashMap::new();
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = resync.tick() => match broker.list().await {
                Ok(all) => {
                    let live: std::collections::HashSet<Uuid> = all.iter().map(|s| s.id).collect();
                    pools.retain(|id, (_, fence)| {
                        let keep = live.contains(id);
                        if !keep { fence.cancel(); }
                        keep
                    });
                    for status in &all {
                        follow(&broker, &egress, &mut pools, status, &shutdown);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "egress cannot list the computers"),
            },
            event = events.recv() => match event {
                Ok(BrokerEvent::Status { computer }) => {
                    follow(&broker, &egress, &mut pools, &computer, &shutdown);
                }
                Ok(BrokerEvent::Removed { id }) => {
                    if let Some((_, fence)) = pools.remove(&id) {
                        fence.cancel();
                    }
                    egress.forget(id);
                }
                Ok(BrokerEvent::Egress { .. } | BrokerEvent::Activity { .. }) => {}
                Err(RecvError::Lagged(_)) => resync.reset_immediately(),
                Err(RecvError::Closed) => break,
            },
        }
    }
    for (_, (_, fence)) in pools.drain() {
        fence.cancel();
    }
}

/// Starts, keeps or fences the pool of one computer after its status. A
/// pool's fence is a child of `shutdown`: the daemon's shutdown ends every
/// pool (and drops the broker handle each holds, so the core can finish)
/// even when this supervisor is aborted before it could fence them.
fn follow(
    broker: &BrokerHandle,
    egress: &Arc<Egress>,
    pools: &mut Pools,
    s: &ComputerStatus,
    shutdown: &CancellationToken,
) {
    let wanted = s.container == ContainerState::Running && s.ready;
    if let Some((generation, fence)) = pools.get(&s.id) {
        if wanted && *generation == s.generation && !fence.is_cancelled() {
            return;
        }
        fence.cancel();
        pools.remove(&s.id);
    }
    if !wanted {
        return;
    }
    let fence = shutdown.child_token();
    pools.insert(s.id, (s.generation, fence.clone()));
    tokio::spawn(run(broker.clone(), Arc::clone(egress), s.id, fence));
}

/// One desktop's pool, from admission to its fence.
async fn run(broker: BrokerHandle, egress: Arc<Egress>, id: Uuid, fence: CancellationToken) {
    let ticket = match broker.admit_guest(id, None, Purpose::Egress).await {
        Ok(ticket) => ticket,
        Err(e) => {
            tracing::debug!(computer = %id, error = %e, "egress not admitted (yet)");
            fence.cancel();
            return;
        }
    };
    let Some(policy) = broker.egress_policies().watch(id) else {
        fence.cancel();
        return;
    };
    let revoked = ticket.revoked.clone();
    let cut = fence.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = revoked.cancelled() => cut.cancel(),
            () = cut.cancelled() => {}
        }
    });
    tracing::info!(computer = %id, generation = ticket.generation, "egress pool started");
    let desk = egress.desk(id, policy, fence.clone());
    let parker = Arc::new(GuestParker {
        guest: ticket.guest.clone(),
    });
    dormouse_egress::run_pool(desk, parker, PARKED).await;
    fence.cancel();
    tracing::info!(computer = %id, "egress pool ended");
}
