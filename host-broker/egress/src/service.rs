//! The egress service of the broker ([`Egress`]: the resolver, the host's
//! view, the caps, the audit directory, the hooks into the broker) and of
//! each desktop ([`Desk`]: its policy as a `watch`, its caps' counters, its
//! audit log, its fence), and the pool that keeps guest connections parked
//! for a ready desktop ([`run_pool`]).
//!
//! A desk's fence is cancelled when the desktop stops, is removed or its
//! generation changes: the pool ends and every open connection of it is
//! closed. A policy change is a new value of the desk's `watch`; every open
//! connection judges itself again against it ([`crate::relay`]). What
//! the guests hand over is closed on one broker-wide pool of threads
//! ([`crate::closer`]), each desktop with its own turns and limit.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dormouse_protocol::egress_policy::{EgressDecision, EgressLogEntry, EgressPolicy};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::audit::AuditLog;
use crate::closer::{ClosePool, Closer};
use crate::decide::HostView;
use crate::limits::{Caps, Limiter};
use crate::relay::{self, GuestStream, Open};
use crate::resolve::{host_addresses, Resolver};

/// How long the host's own addresses are kept before they are listed again.
const HOST_VIEW_TTL: Duration = Duration::from_secs(10);
/// Most decision events per desktop per second; beyond, they are counted only.
pub const EVENTS_PER_SECOND: u32 = 10;
/// How often egress bytes count as the desktop's activity at most.
const ACTIVITY_EVERY: Duration = Duration::from_secs(1);

/// What egress tells the broker.
pub trait Hooks: Send + Sync + 'static {
    /// Bytes moved for `computer` (at most once per second per desktop).
    fn activity(&self, computer: Uuid);
    /// A connection was decided (every one: for counters).
    fn counted(&self, computer: Uuid, decision: EgressDecision);
    /// A connection was decided (rate-limited: for the event stream).
    fn event(&self, entry: &EgressLogEntry);
    /// Closing a socket `computer`'s guest handed over took longer than
    /// [`crate::closer::STALLED_AFTER`] (called on a closer thread).
    fn stalled_close(&self, computer: Uuid) {
        let _ = computer;
    }
}

/// The broker-wide part of egress.
pub struct Egress {
    resolver: Resolver,
    caps: Caps,
    audit_dir: Option<PathBuf>,
    protected: Vec<std::net::SocketAddr>,
    view: Mutex<(Arc<HostView>, Option<Instant>)>,
    hooks: Arc<dyn Hooks>,
    logs: Mutex<HashMap<Uuid, Arc<AuditLog>>>,
    closes: ClosePool,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("caps", &self.caps)
            .field("audit_dir", &self.audit_dir)
            .finish_non_exhaustive()
    }
}

impl Egress {
    /// The service: names through `resolver`, `caps` per desktop, audit
    /// files in `audit_dir` (memory only when `None`), the broker's own
    /// API sockets `protected`.
    pub fn new(
        resolver: Resolver,
        caps: Caps,
        audit_dir: Option<PathBuf>,
        protected: Vec<std::net::SocketAddr>,
        hooks: Arc<dyn Hooks>,
    ) -> Self {
        let stalls = Arc::clone(&hooks);
        Self {
            resolver,
            caps,
            audit_dir,
            protected,
            view: Mutex::new((Arc::new(HostView::default()), None)),
            hooks,
            logs: Mutex::new(HashMap::new()),
            closes: ClosePool::new(Arc::new(move |id| stalls.stalled_close(id))),
        }
    }

    /// The service closing what guests hand over on `closes` instead of
    /// a pool of its own (a test's slow closes).
    pub fn with_closes(mut self, closes: ClosePool) -> Self {
        self.closes = closes;
        self
    }

    /// The pool that closes what guests handed over.
    pub fn closes(&self) -> &ClosePool {
        &self.closes
    }

    /// The resolver.
    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// The host's addresses and the protected sockets, listed at most
    /// [`HOST_VIEW_TTL`] ago.
    pub fn host_view(&self) -> Arc<HostView> {
        let mut v = self
            .view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh = v.1.is_some_and(|at| at.elapsed() < HOST_VIEW_TTL);
        if !fresh {
            v.0 = Arc::new(HostView {
                own: host_addresses(),
                protected: self.protected.clone(),
            });
            v.1 = Some(Instant::now());
        }
        Arc::clone(&v.0)
    }

    /// Computer `id`'s audit log, opened (and read back) on first use.
    pub fn log(&self, id: Uuid) -> Arc<AuditLog> {
        let mut logs = self
            .logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(logs.entry(id).or_insert_with(|| {
            let opened = self.audit_dir.as_ref().map(|dir| AuditLog::open(dir, id));
            match opened {
                Some(Ok(log)) => Arc::new(log),
                Some(Err(e)) => {
                    tracing::warn!(computer = %id, error = %e, "egress audit kept in memory only");
                    Arc::new(AuditLog::in_memory(id))
                }
                None => Arc::new(AuditLog::in_memory(id)),
            }
        }))
    }

    /// Forgets computer `id`'s audit log and removes its file.
    pub fn forget(&self, id: Uuid) {
        let removed = self
            .logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
        match removed {
            Some(log) => log.delete(),
            None => {
                if let Some(dir) = &self.audit_dir {
                    let _ = std::fs::remove_file(dir.join(format!("{id}.jsonl")));
                }
            }
        }
    }

    /// A desk for computer `id` under `policy`, fenced by `fence`.
    pub fn desk(
        self: &Arc<Self>,
        id: Uuid,
        policy: watch::Receiver<EgressPolicy>,
        fence: CancellationToken,
    ) -> Arc<Desk> {
        Arc::new(Desk {
            egress: Arc::clone(self),
            computer: id,
            policy,
            limiter: Limiter::new(self.caps),
            closer: self.closes.closer(id),
            log: self.log(id),
            fence,
            activity_at: Mutex::new(None),
            events: Mutex::new((Instant::now(), 0)),
        })
    }
}

/// One desktop's egress while it is ready.
#[derive(Debug)]
pub struct Desk {
    egress: Arc<Egress>,
    computer: Uuid,
    policy: watch::Receiver<EgressPolicy>,
    limiter: Limiter,
    closer: Closer,
    log: Arc<AuditLog>,
    fence: CancellationToken,
    activity_at: Mutex<Option<Instant>>,
    events: Mutex<(Instant, u32)>,
}

impl Desk {
    /// The computer.
    pub fn computer(&self) -> Uuid {
        self.computer
    }

    /// The broker-wide service.
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    /// The caps.
    pub fn caps(&self) -> Caps {
        self.limiter.caps()
    }

    /// The counters against the caps.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Where this desktop's handed sockets are closed.
    pub fn closer(&self) -> &Closer {
        &self.closer
    }

    /// The policy now.
    pub fn policy(&self) -> EgressPolicy {
        self.policy.borrow().clone()
    }

    /// A receiver of the policy's changes.
    pub fn watch_policy(&self) -> watch::Receiver<EgressPolicy> {
        let mut rx = self.policy.clone();
        rx.mark_unchanged();
        rx
    }

    /// Resolves when the desk is fenced.
    pub async fn fenced(&self) {
        self.fence.cancelled().await;
    }

    /// Whether the desk is fenced.
    pub fn is_fenced(&self) -> bool {
        self.fence.is_cancelled()
    }

    /// Bytes moved: activity for the idle timer, at most once per second.
    pub fn activity(&self) {
        let mut at = self
            .activity_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if at.is_none_or(|t| t.elapsed() >= ACTIVITY_EVERY) {
            *at = Some(Instant::now());
            self.egress.hooks.activity(self.computer);
        }
    }

    /// A connection was decided: counted always, an event within the rate.
    pub fn decided(&self, entry: &EgressLogEntry) {
        self.egress.hooks.counted(self.computer, entry.decision);
        let mut ev = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ev.0.elapsed() >= Duration::from_secs(1) {
            *ev = (Instant::now(), 0);
        }
        if ev.1 < EVENTS_PER_SECOND {
            ev.1 += 1;
            self.egress.hooks.event(entry);
        }
    }

    /// The audit log.
    pub fn log(&self) -> &AuditLog {
        &self.log
    }

    /// Records a finished connection in the audit.
    pub fn record(&self, entry: EgressLogEntry) {
        self.log.record(entry);
    }
}

/// Opens guest connections that wait for the guest's next proxied
/// connection (`egress_accept`).
pub trait Parker: Send + Sync + 'static {
    /// The guest connection once the guest asked on it.
    type Conn: GuestStream + 'static;
    /// Parks one connection; resolves when the guest asks on it, or fails
    /// when the guest cannot be reached (or refused).
    fn park(&self) -> impl Future<Output = Result<(Open, Self::Conn), String>> + Send;
}

/// Keeps `parked` connections parked for `desk` until it is fenced,
/// replacing each as the guest takes it and serving what it asks in a task
/// of its own. A failing guest is retried with a back-off of up to 5 s.
pub async fn run_pool<P: Parker>(desk: Arc<Desk>, parker: Arc<P>, parked: usize) {
    let mut parking: JoinSet<Result<(Open, P::Conn), String>> = JoinSet::new();
    let park = |set: &mut JoinSet<_>, delay: Duration| {
        let parker = Arc::clone(&parker);
        set.spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            parker.park().await
        });
    };
    for _ in 0..parked.max(1) {
        park(&mut parking, Duration::ZERO);
    }
    let mut failures: u32 = 0;
    loop {
        let done = tokio::select! {
            () = desk.fenced() => break,
            done = parking.join_next() => done,
        };
        let Some(done) = done else { break };
        match done {
            Ok(Ok((open, conn))) => {
                failures = 0;
                park(&mut parking, Duration::ZERO);
                tokio::spawn(relay::serve(Arc::clone(&desk), open, conn));
            }
            Ok(Err(e)) => {
                failures = failures.saturating_add(1);
                let delay = backoff(failures);
                tracing::debug!(computer = %desk.computer(), error = %e, ?delay, "no egress connection parked");
                park(&mut parking, delay);
            }
            Err(e) => {
                tracing::warn!(computer = %desk.computer(), error = %e, "an egress park task failed");
                park(&mut parking, backoff(failures.saturating_add(1)));
            }
        }
    }
    parking.abort_all();
}

/// The wait before parking again after `failures` failures in a row.
fn backoff(failures: u32) -> Duration {
    let ms = 100u64.saturating_mul(1u64 << failures.min(6));
    Duration::from_millis(ms.min(5000))
}
