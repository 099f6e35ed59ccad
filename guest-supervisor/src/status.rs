//! The one owner of the status the supervisor reports.
//!
//! Writers (preparation, the service runner, the self-probe) change only their
//! own inputs; `phase`, `ready` and `ready_since` are *derived* here in one
//! place, so no two writers can disagree about them. Readers (the socket,
//! `watch` streams) subscribe to a `tokio::sync::watch` channel, which is how
//! `watch` pushes every change without polling.

use chrono::{DateTime, Utc};
use dormouse_protocol::{
    CheckStatus, ContainerStartIdentity, GuestStatus, HealthReport, Phase, ServiceRunState,
    ServiceState, StartPhases,
};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A step of the container start whose end [`StatusCell::mark`] records
/// (ready is recorded by the cell itself, when it first derives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartStep {
    /// Preparation done.
    Prepared,
    /// The X server answered.
    X,
    /// The window manager announced itself.
    WindowManager,
    /// The VNC server answered.
    Vnc,
    /// The egress proxy listens.
    Proxy,
    /// The taskbar's band is kept.
    Taskbar,
}

/// The inputs the status is derived from.
#[derive(Debug, Clone)]
struct Inputs {
    preparing: bool,
    stopping: bool,
    services: Vec<ServiceState>,
    /// Bumped whenever a service starts, stops or restarts: a health report
    /// probed against an older epoch no longer proves readiness.
    services_epoch: u64,
    health: Option<(u64, HealthReport)>,
    /// A crash loop or preparation failure, set by the service runner.
    service_problem: Option<String>,
    ready_since: Option<DateTime<Utc>>,
    /// The taskbar's reserved band, set by the service runner while it runs.
    taskbar_height: Option<u32>,
    /// Names of the services readiness does not wait for (the taskbar):
    /// their changes neither make the desktop unready nor stale a probe.
    after_ready: Vec<String>,
    /// When the supervisor started, and each start step's end since.
    started: Instant,
    phases: StartPhases,
}

impl Inputs {
    /// Whether readiness waits for `service` (it is not one of
    /// [`Inputs::after_ready`]).
    fn needed(&self, service: &ServiceState) -> bool {
        !self.after_ready.contains(&service.name)
    }
}

/// Shared, cheaply clonable handle to the supervisor's status.
#[derive(Debug, Clone)]
pub struct StatusCell {
    identity: ContainerStartIdentity,
    inputs: std::sync::Arc<std::sync::Mutex<Inputs>>,
    tx: watch::Sender<GuestStatus>,
}

impl StatusCell {
    /// A cell in phase `preparing` for this container start, its start
    /// phases counted from now.
    pub fn new(identity: ContainerStartIdentity) -> Self {
        Self::since(identity, Instant::now())
    }

    /// A cell in phase `preparing`, its start phases counted from `started`
    /// (when the supervisor started).
    pub fn since(identity: ContainerStartIdentity, started: Instant) -> Self {
        let inputs = Inputs {
            preparing: true,
            stopping: false,
            services: Vec::new(),
            services_epoch: 0,
            health: None,
            service_problem: None,
            ready_since: None,
            taskbar_height: None,
            after_ready: Vec::new(),
            started,
            phases: StartPhases::default(),
        };
        let status = derive(&identity, &inputs);
        let (tx, _) = watch::channel(status);
        Self {
            identity,
            inputs: std::sync::Arc::new(std::sync::Mutex::new(inputs)),
            tx,
        }
    }

    /// This container start.
    pub fn identity(&self) -> &ContainerStartIdentity {
        &self.identity
    }

    /// The current status.
    pub fn snapshot(&self) -> GuestStatus {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every later change (for `watch`).
    pub fn subscribe(&self) -> watch::Receiver<GuestStatus> {
        self.tx.subscribe()
    }

    /// The epoch of the service set; the probe records it with its report.
    pub fn services_epoch(&self) -> u64 {
        self.lock().services_epoch
    }

    /// Preparation finished (services may start).
    pub fn set_prepared(&self) {
        self.update(|i| i.preparing = false);
    }

    /// A graceful stop began.
    pub fn set_stopping(&self) {
        self.update(|i| i.stopping = true);
    }

    /// Names the services readiness does not wait for (set once, before
    /// the services start).
    pub fn set_after_ready(&self, names: &[&str]) {
        self.update(|i| i.after_ready = names.iter().map(|n| (*n).to_owned()).collect());
    }

    /// The services readiness waits for, of `services`.
    pub fn needed(&self, services: &[ServiceState]) -> Vec<ServiceState> {
        let i = self.lock();
        services.iter().filter(|s| i.needed(s)).cloned().collect()
    }

    /// Records that `step` of this container start just ended (only its
    /// first end counts).
    pub fn mark(&self, step: StartStep) {
        self.update(|i| {
            let at = Some(crate::millis(i.started.elapsed()));
            let p = &mut i.phases;
            let slot = match step {
                StartStep::Prepared => &mut p.prepared_ms,
                StartStep::X => &mut p.x_ms,
                StartStep::WindowManager => &mut p.window_manager_ms,
                StartStep::Vnc => &mut p.vnc_ms,
                StartStep::Proxy => &mut p.proxy_ms,
                StartStep::Taskbar => &mut p.taskbar_ms,
            };
            if slot.is_none() {
                *slot = at;
            }
        });
    }

    /// Waits, at most `bound`, until no service readiness does not wait
    /// for is still on its way up (pending or starting while every needed
    /// service runs: one held back by a failed window manager is not on
    /// its way), so that what a caller sees next (a screenshot) shows it.
    pub async fn settled(&self, bound: Duration) {
        let mut rx = self.subscribe();
        let on_its_way = |i: &Inputs| {
            i.services
                .iter()
                .filter(|s| i.needed(s))
                .all(|s| s.state == ServiceRunState::Running)
                && i.services.iter().filter(|s| !i.needed(s)).any(|s| {
                    matches!(
                        s.state,
                        ServiceRunState::Pending | ServiceRunState::Starting
                    )
                })
        };
        let wait = async {
            while on_its_way(&self.lock()) {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(bound, wait).await;
    }

    /// Replaces the service table. Any change of a needed service's state
    /// or pid starts a new epoch, so the next probe must pass again.
    pub fn set_services(&self, services: Vec<ServiceState>, problem: Option<String>) {
        self.update(|i| {
            let needed = |s: &&ServiceState| i.needed(s);
            let changed = i.services.iter().filter(needed).count()
                != services.iter().filter(needed).count()
                || i.services
                    .iter()
                    .filter(needed)
                    .zip(services.iter().filter(needed))
                    .any(|(a, b)| a.name != b.name || a.state != b.state || a.pid != b.pid);
            if changed {
                i.services_epoch += 1;
            }
            i.services = services;
            i.service_problem = problem;
        });
    }

    /// The height of the taskbar's band while it runs, `None` without one.
    pub fn set_taskbar_height(&self, height: Option<u32>) {
        self.update(|i| i.taskbar_height = height);
    }

    /// Records a probe report made against `epoch`.
    pub fn set_health(&self, epoch: u64, report: HealthReport) {
        self.update(|i| i.health = Some((epoch, report)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inputs> {
        // A poisoned lock only means a writer panicked mid-update; the inputs
        // are plain data and still the best we know.
        self.inputs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut Inputs)) {
        let mut inputs = self.lock();
        f(&mut inputs);
        let mut status = derive(&self.identity, &inputs);
        match (status.ready, inputs.ready_since) {
            (true, None) => inputs.ready_since = Some(Utc::now()),
            (false, Some(_)) => inputs.ready_since = None,
            _ => {}
        }
        if status.ready && inputs.phases.ready_ms.is_none() {
            inputs.phases.ready_ms = Some(crate::millis(inputs.started.elapsed()));
        }
        status.ready_since = inputs.ready_since;
        *status.start_phases = inputs.phases;
        self.tx.send_if_modified(|current| {
            if *current == status {
                false
            } else {
                *current = status;
                true
            }
        });
    }
}

fn derive(identity: &ContainerStartIdentity, i: &Inputs) -> GuestStatus {
    let all_running = !i.services.is_empty()
        && i.services
            .iter()
            .filter(|s| i.needed(s))
            .all(|s| s.state == ServiceRunState::Running);
    let any_failed = i
        .services
        .iter()
        .any(|s| matches!(s.state, ServiceRunState::Failed));
    let current_health = i
        .health
        .as_ref()
        .filter(|(epoch, _)| *epoch == i.services_epoch)
        .map(|(_, h)| h);
    let health_ok = current_health.map(|h| h.overall);

    let ready = !i.preparing
        && !i.stopping
        && all_running
        && health_ok.is_some_and(|s| s != CheckStatus::Fail);
    let phase = if i.stopping {
        Phase::Stopping
    } else if i.preparing {
        Phase::Preparing
    } else if any_failed
        || i.service_problem.is_some()
        || (ready && health_ok == Some(CheckStatus::Degraded))
    {
        Phase::Degraded
    } else if ready {
        Phase::Ready
    } else {
        Phase::Starting
    };
    let problem = i.service_problem.clone().or_else(|| {
        current_health
            .filter(|h| h.overall != CheckStatus::Ok)
            .map(|h| {
                h.checks
                    .iter()
                    .filter(|c| c.status != CheckStatus::Ok)
                    .map(|c| format!("{}: {}", c.name, c.detail))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
    });
    GuestStatus {
        phase,
        ready,
        ready_since: i.ready_since,
        identity: identity.clone(),
        services: i.services.clone(),
        health: i.health.as_ref().map(|(_, h)| h.clone()),
        problem,
        taskbar_height: i.taskbar_height,
        start_phases: Box::new(i.phases),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dormouse_protocol::Check;

    fn identity() -> ContainerStartIdentity {
        ContainerStartIdentity {
            boot_id: "b".into(),
            pid_ns_inode: 1,
            pid1_start_time: 2,
        }
    }

    fn service(name: &str, state: ServiceRunState, pid: u32) -> ServiceState {
        ServiceState {
            name: name.into(),
            state,
            pid: Some(pid),
            restarts: 0,
            last_exit: None,
            ready_since: None,
        }
    }

    fn report(status: CheckStatus) -> HealthReport {
        HealthReport::from_checks(vec![Check::new("x_display", status, "")], Utc::now())
    }

    #[test]
    fn ready_needs_a_probe_of_the_current_services() {
        let cell = StatusCell::new(identity());
        assert_eq!(cell.snapshot().phase, Phase::Preparing);
        cell.set_prepared();
        cell.set_services(vec![service("xvfb", ServiceRunState::Running, 10)], None);
        assert_eq!(cell.snapshot().phase, Phase::Starting);
        cell.set_health(cell.services_epoch(), report(CheckStatus::Ok));
        let status = cell.snapshot();
        assert!(status.ready);
        assert_eq!(status.phase, Phase::Ready);
        assert!(status.ready_since.is_some());

        // A restart (new pid) makes the old report stale until re-probed.
        cell.set_services(vec![service("xvfb", ServiceRunState::Running, 11)], None);
        assert!(!cell.snapshot().ready);
        assert!(cell.snapshot().ready_since.is_none());
        cell.set_health(cell.services_epoch(), report(CheckStatus::Ok));
        assert!(cell.snapshot().ready);
    }

    #[test]
    fn a_failed_probe_is_never_ready() {
        let cell = StatusCell::new(identity());
        cell.set_prepared();
        cell.set_services(vec![service("xvfb", ServiceRunState::Running, 10)], None);
        cell.set_health(cell.services_epoch(), report(CheckStatus::Fail));
        let status = cell.snapshot();
        assert!(!status.ready);
        assert_eq!(status.phase, Phase::Starting);
        assert!(status.problem.is_some());
    }

    #[test]
    fn crash_loop_degrades_and_stopping_wins() {
        let cell = StatusCell::new(identity());
        cell.set_prepared();
        cell.set_services(
            vec![service("vnc", ServiceRunState::Failed, 10)],
            Some("vnc: crash loop".into()),
        );
        assert_eq!(cell.snapshot().phase, Phase::Degraded);
        assert_eq!(cell.snapshot().problem.as_deref(), Some("vnc: crash loop"));
        cell.set_stopping();
        assert_eq!(cell.snapshot().phase, Phase::Stopping);
    }

    #[tokio::test]
    async fn the_taskbar_is_not_waited_for_but_screenshots_wait_for_it() {
        let cell = StatusCell::new(identity());
        cell.set_after_ready(&["taskbar"]);
        cell.set_prepared();
        cell.mark(StartStep::Prepared);
        let x = service("xvfb", ServiceRunState::Running, 10);
        let starting = service("taskbar", ServiceRunState::Starting, 11);
        cell.set_services(vec![x.clone(), starting.clone()], None);
        let epoch = cell.services_epoch();
        cell.set_health(epoch, report(CheckStatus::Ok));
        let status = cell.snapshot();
        assert!(status.ready, "ready with the taskbar still starting");
        assert!(status.start_phases.prepared_ms.is_some());
        assert!(status.start_phases.ready_ms.is_some());
        assert!(status.start_phases.taskbar_ms.is_none());

        // Its start neither stales the probe nor makes the desktop unready.
        let waiter = {
            let cell = cell.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                cell.settled(Duration::from_secs(10)).await;
                t.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "a screenshot waits while it starts");
        let running = service("taskbar", ServiceRunState::Running, 11);
        cell.set_services(vec![x, running], None);
        cell.mark(StartStep::Taskbar);
        let waited = waiter.await.unwrap();
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_secs(5));
        assert_eq!(cell.services_epoch(), epoch);
        let status = cell.snapshot();
        assert!(status.ready);
        assert!(status.start_phases.taskbar_ms >= status.start_phases.prepared_ms);

        // Held back by a needed service that is down, it is not on its way.
        let down = service("xvfb", ServiceRunState::Backoff, 10);
        cell.set_services(vec![down, starting.clone()], None);
        let t = Instant::now();
        cell.settled(Duration::from_secs(10)).await;
        assert!(t.elapsed() < Duration::from_secs(1));
        let x = service("xvfb", ServiceRunState::Running, 10);
        cell.set_services(
            vec![x, service("taskbar", ServiceRunState::Running, 11)],
            None,
        );

        // Without one on its way, nothing waits; a first figure is kept.
        let t = Instant::now();
        cell.settled(Duration::from_secs(10)).await;
        assert!(t.elapsed() < Duration::from_secs(1));
        let first = cell.snapshot().start_phases.taskbar_ms;
        std::thread::sleep(Duration::from_millis(5));
        cell.mark(StartStep::Taskbar);
        assert_eq!(cell.snapshot().start_phases.taskbar_ms, first);
    }

    #[test]
    fn subscribers_see_changes() {
        let cell = StatusCell::new(identity());
        let mut rx = cell.subscribe();
        cell.set_prepared();
        assert!(rx.has_changed().expect("sender alive"));
        assert_eq!(rx.borrow_and_update().phase, Phase::Starting);
    }
}

/// A request to the service runner about the browsers: close them cleanly
/// (before a stop, or held for an export), or end a hold. The socket's
/// `quiesce` and `quiesce_hold` send these and await the replies.
#[derive(Debug)]
pub enum QuiesceRequest {
    /// Close every browser within `timeout`. With `hold`, what it closed is
    /// started again once this hold and every other one is released.
    Close {
        /// Upper bound for the whole quiesce.
        timeout: std::time::Duration,
        /// Keep them closed until a [`QuiesceRequest::Release`], then reopen.
        hold: bool,
        /// Where the outcome goes.
        reply: tokio::sync::oneshot::Sender<dormouse_protocol::Quiesced>,
    },
    /// One hold ended (sent exactly once per `Close { hold: true }` that
    /// was handed over).
    Release,
}
