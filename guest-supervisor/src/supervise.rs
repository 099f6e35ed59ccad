//! `dormouse-supervisor run`: one container start, from PID 1's first
//! instruction to its exit.
//!
//! Owns the order of things: init duties (subreaper, reaper, signals)
//! before any child exists; identity; the run directory and the guest
//! socket; preparation; services and the self-probe; serving quiesce
//! requests (and reopening what held ones closed, once released); and on
//! SIGTERM/SIGINT the graceful stop — browsers first, then VNC, window
//! manager, X, stragglers — returning only once every child has been
//! reaped. It never exits on a recoverable problem: a desktop that
//! cannot be fully prepared still starts and reports why it is degraded.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::Config;
use crate::services::Services;
use crate::status::{QuiesceRequest, StartStep, StatusCell};
use crate::{identity, init, prepare, probe, reopen, socket, stop};

/// Why the supervisor could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Signal handling or the subreaper flag could not be set up.
    #[error("init duties: {0}")]
    Init(#[from] std::io::Error),
    /// The container-start identity is unreadable, so stale locks cannot
    /// be told from live ones.
    #[error("container-start identity: {0}")]
    Identity(#[from] identity::IdentityError),
}

/// How the supervisor ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// The signal that asked for the stop.
    pub signal: Signal,
    /// Whether every browser closed within its grace.
    pub browsers_clean: bool,
    /// Whether every child was reaped before returning.
    pub all_reaped: bool,
}

/// Runs the desktop until SIGTERM or SIGINT, then stops it gracefully.
// Over 100 lines on purpose: this is the order of one container start,
// read top to bottom; each step is a call into its own module, and cut
// into pieces the order itself would no longer be visible in one place.
pub async fn run(config: Arc<Config>) -> Result<Stopped, RunError> {
    let started = Instant::now();
    // Before any child exists: orphans must come to us, and no SIGCHLD may
    // go unseen.
    let is_pid1 = init::adopt_orphans()?;
    init::keep_descriptors_private()?;
    let reaper = init::Reaper::install()?;
    tokio::spawn(reaper.run());
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;

    let identity = identity::read(&config)?;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        protocol = dormouse_protocol::PROTOCOL_VERSION,
        pid1 = is_pid1,
        identity = %identity.fingerprint(),
        "supervisor starting"
    );
    let cell = StatusCell::since(identity.clone(), started.into_std());

    // The socket comes up first, so the host sees "preparing" (and why a
    // preparation failed) rather than silence.
    let (quiesce_tx, mut quiesce_rx) = mpsc::channel::<QuiesceRequest>(4);
    let exec = crate::exec::ExecRunner::new(crate::exec::ExecSettings::from_config(&config));
    let egress = crate::egress::Hub::new();
    let socket_task = tokio::spawn({
        let (config, cell, egress) = (config.clone(), cell.clone(), egress.clone());
        async move {
            if let Err(e) = socket::serve(config, cell, quiesce_tx, exec, egress).await {
                tracing::error!(error = %e, "guest socket failed");
            }
        }
    });

    let prepared = tokio::task::spawn_blocking({
        let (config, identity) = (config.clone(), identity.clone());
        move || prepare::prepare(&config, &identity)
    })
    .await;
    let prepare_problem = match prepared {
        Ok(p) => {
            tracing::info!(
                new_start = p.new_start,
                locks_removed = p.locks_removed.len(),
                preferences_fixed = p.preferences_fixed.len(),
                links_changed = p.links_changed,
                problems = p.problems.len(),
                elapsed_ms = crate::millis(started.elapsed()),
                "prepared"
            );
            (!p.problems.is_empty()).then(|| {
                let all: Vec<String> = p.problems.iter().map(ToString::to_string).collect();
                format!("preparation: {}", all.join("; "))
            })
        }
        Err(e) => Some(format!("preparation ended abnormally: {e}")),
    };
    cell.set_prepared();
    cell.mark(StartStep::Prepared);

    // Before the services, so no desktop program can take its port first.
    let egress_task = tokio::spawn({
        let cell = cell.clone();
        crate::egress::serve(egress, move || cell.mark(StartStep::Proxy))
    });
    let mut services = Services::start(config.clone(), cell.clone(), prepare_problem, started);
    let probe_task = tokio::spawn(probe::run_probe_loop(config.clone(), cell.clone()));
    let vnc_task = tokio::spawn({
        let (config, cell) = (config.clone(), cell.clone());
        async move {
            if let Err(e) = crate::vnc_socket::serve(config, cell).await {
                tracing::error!(error = %e, "vnc socket failed");
            }
        }
    });

    // Quiesce holds (an export of the running desktop): what they closed
    // comes back when the last one ends.
    let mut holds = reopen::Holds::default();
    let stop_signal = loop {
        tokio::select! {
            _ = sigterm.recv() => break Signal::SIGTERM,
            _ = sigint.recv() => break Signal::SIGINT,
            _ = sighup.recv() => services.forward(Signal::SIGHUP),
            Some(request) = quiesce_rx.recv() => match request {
                QuiesceRequest::Close { timeout, hold, reply } => {
                    let bound = timeout.min(Duration::from_millis(config.quiesce_max_ms));
                    let (quiesced, closed) =
                        stop::close_and_remember(&mut services, &config, is_pid1, bound).await;
                    if hold {
                        holds.take(closed);
                    }
                    // The client may have hung up meanwhile.
                    let _ = reply.send(quiesced);
                }
                QuiesceRequest::Release => {
                    if let Some(closed) = holds.release() {
                        let services_back = services.reopen(&closed.services);
                        let user_back = reopen::relaunch(&config, &closed.user);
                        tracing::info!(services = ?services_back, user = ?user_back, "browsers reopened after the last quiesce hold");
                    }
                }
            },
        }
    };

    // ---- graceful stop ------------------------------------------------
    let stopping = Instant::now();
    tracing::info!(signal = %stop_signal, "stopping");
    cell.set_stopping();
    probe_task.abort();
    vnc_task.abort();
    egress_task.abort();
    let budget = Duration::from_millis(config.stop_timeout_ms);
    // Browsers get most of the budget: flushing a profile is what matters.
    let browser_grace = budget.mul_f64(0.6);
    let service_grace = budget.mul_f64(0.1).min(Duration::from_secs(1));
    let quiesced = stop::close_browsers(&mut services, &config, is_pid1, browser_grace).await;
    services.stop_all(browser_grace, service_grace).await;
    let stragglers = stop::end_stragglers(&config, is_pid1, service_grace).await;
    let left = budget
        .saturating_sub(stopping.elapsed())
        .max(Duration::from_millis(500));
    let all_reaped = init::wait_childless(left).await;
    // Last, so clients could watch "stopping" until the end.
    socket_task.abort();
    let _ = socket_task.await;
    tracing::info!(
        elapsed_ms = crate::millis(stopping.elapsed()),
        browsers_clean = quiesced.complete,
        stragglers,
        all_reaped,
        "stopped"
    );
    Ok(Stopped {
        signal: stop_signal,
        browsers_clean: quiesced.complete,
        all_reaped,
    })
}
