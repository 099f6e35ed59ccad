//! The desktop's services: Xvfb → (window manager ∥ VNC server) (→ taskbar)
//! (→ browser).
//!
//! Owns starting each service as the desktop user in its own process group,
//! in order (a service starts only while the services it waits for run:
//! the window manager and the VNC server wait for X alone and start side by
//! side; a browser waits for all three),
//! waiting for its readiness event, restarting it with backoff after a
//! classified failure (fixing the cause first where it can), declaring a
//! crash loop, and stopping services one at a time on request. Every change
//! of the service table is published through [`StatusCell::set_services`].
//! It never reaps (see [`crate::init`]) and never decides about readiness of
//! the whole desktop (the status cell and the probe do).

pub mod output;
pub mod readiness;
pub mod restart;
mod spec;

use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::Utc;
use dormouse_protocol::{ServiceRunState, ServiceState};
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::Config;
use crate::init::{self, ChildExit, OwnedChild};
use crate::locks::{self, ProfileFamily};
use crate::status::StatusCell;
use output::{LineReader, Tail};
use restart::{FailureCause, Remedy, RestartDecision, RestartPolicy, RestartTracker};

pub use crate::config::Browser;
pub use spec::*;

/// The service table and the problems behind it, shared by the service
/// tasks; every change is published to the status cell.
#[derive(Debug, Clone)]
struct Table {
    inner: Arc<Mutex<Rows>>,
    cell: StatusCell,
    /// Bumped on every change, so a service waiting for the ones before it
    /// wakes up without polling.
    changed: watch::Sender<u64>,
}

#[derive(Debug)]
struct Rows {
    services: Vec<ServiceState>,
    /// A crash loop's reason, per service.
    problems: Vec<Option<String>>,
    /// A preparation failure, kept on every publish.
    prepare_problem: Option<String>,
}

impl Table {
    fn new(specs: &[ServiceSpec], cell: StatusCell, prepare_problem: Option<String>) -> Self {
        let services = specs
            .iter()
            .map(|s| ServiceState {
                name: s.name.into(),
                state: ServiceRunState::Pending,
                pid: None,
                restarts: 0,
                last_exit: None,
                ready_since: None,
            })
            .collect();
        let table = Self {
            inner: Arc::new(Mutex::new(Rows {
                services,
                problems: vec![None; specs.len()],
                prepare_problem,
            })),
            cell,
            changed: watch::channel(0).0,
        };
        table.publish(&table.rows());
        table
    }

    fn rows(&self) -> MutexGuard<'_, Rows> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes row `idx` and, with the lock still held (so two writers can
    /// never publish out of order), publishes the table.
    fn update(&self, idx: usize, f: impl FnOnce(&mut ServiceState, &mut Option<String>)) {
        let mut rows = self.rows();
        let Rows {
            services, problems, ..
        } = &mut *rows;
        if let (Some(service), Some(problem)) = (services.get_mut(idx), problems.get_mut(idx)) {
            f(service, problem);
        }
        self.publish(&rows);
        drop(rows);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn publish(&self, rows: &Rows) {
        let problems: Vec<&str> = rows
            .prepare_problem
            .iter()
            .chain(rows.problems.iter().flatten())
            .map(String::as_str)
            .collect();
        let problem = (!problems.is_empty()).then(|| problems.join("; "));
        self.cell.set_services(rows.services.clone(), problem);
    }

    fn states(&self) -> Vec<ServiceRunState> {
        self.rows().services.iter().map(|s| s.state).collect()
    }
}

/// How a service task is told to stop: `Some(grace)` = stop now, allowing
/// the process `grace` to exit after SIGTERM before SIGKILL.
type StopSignal = watch::Receiver<Option<Duration>>;

/// The running service tasks.
#[derive(Debug)]
pub struct Services {
    table: Table,
    handles: Vec<ServiceHandle>,
    /// What the tasks share, and every spec, to start a stopped one again.
    ctx: Arc<Context>,
    specs: Vec<ServiceSpec>,
}

#[derive(Debug)]
struct ServiceHandle {
    name: &'static str,
    kind: ServiceKind,
    stop: watch::Sender<Option<Duration>>,
    /// The pid of its running process, for forwarding signals.
    pid: watch::Receiver<Option<u32>>,
    task: Option<JoinHandle<bool>>,
}

/// What the tasks share.
#[derive(Debug)]
struct Context {
    config: Arc<Config>,
    table: Table,
    /// The kind of every service, in start order.
    kinds: Vec<ServiceKind>,
    policy: RestartPolicy,
    /// When the supervisor started, for readiness timings in the log.
    started: Instant,
}

impl Services {
    /// Starts a task per service of [`desktop_services`]. Each waits for the
    /// ones before it. `prepare_problem` stays in every published problem.
    pub fn start(
        config: Arc<Config>,
        cell: StatusCell,
        prepare_problem: Option<String>,
        started: Instant,
    ) -> Self {
        let specs = desktop_services(&config);
        let after_ready: Vec<&str> = specs
            .iter()
            .filter(|s| !s.kind.needed_for_ready())
            .map(|s| s.name)
            .collect();
        cell.set_after_ready(&after_ready);
        let table = Table::new(&specs, cell, prepare_problem);
        let ctx = Arc::new(Context {
            policy: RestartPolicy::from_config(&config),
            config,
            table: table.clone(),
            kinds: specs.iter().map(|s| s.kind).collect(),
            started,
        });
        let handles = specs
            .iter()
            .enumerate()
            .map(|(idx, spec)| spawn_task(spec.clone(), idx, &ctx))
            .collect();
        Self {
            table,
            handles,
            ctx,
            specs,
        }
    }

    /// Starts again those of the services `names` that were stopped
    /// ([`Services::stop_service`]), each as on the first start (it waits
    /// for the services before it, with a fresh restart history; Chromium
    /// with `--restore-last-session`). Returns the names it started.
    pub fn reopen(&mut self, names: &[&str]) -> Vec<&'static str> {
        let mut started = Vec::new();
        for (idx, spec) in self.specs.iter().enumerate() {
            let Some(handle) = self.handles.get_mut(idx) else {
                continue;
            };
            if handle.task.is_some() || !names.contains(&spec.name) {
                continue;
            }
            let mut spec = spec.clone();
            // Its windows and tabs come back, as after a stop and start.
            if matches!(
                spec.kind,
                ServiceKind::Browser(Browser::Chromium | Browser::GoogleChrome)
            ) {
                spec.args.push("--restore-last-session".into());
            }
            *handle = spawn_task(spec, idx, &self.ctx);
            started.push(self.specs[idx].name);
        }
        started
    }

    /// Names of the browser services.
    pub fn browser_names(&self) -> Vec<&'static str> {
        self.handles
            .iter()
            .filter(|h| matches!(h.kind, ServiceKind::Browser(_)))
            .map(|h| h.name)
            .collect()
    }

    /// Stops the service `name` (SIGTERM to its process group, SIGKILL after
    /// `grace`) and waits for its task. `true` if its process exited within
    /// the grace (or was not running). A stopped service stays stopped.
    pub async fn stop_service(&mut self, name: &str, grace: Duration) -> bool {
        let Some(handle) = self.handles.iter_mut().find(|h| h.name == name) else {
            return true;
        };
        handle.stop.send_replace(Some(grace));
        let Some(task) = handle.task.take() else {
            return true;
        };
        // The task bounds itself (grace, then SIGKILL); the extra second
        // only guards against a process stuck in the kernel.
        match tokio::time::timeout(grace + Duration::from_secs(1), task).await {
            Ok(Ok(clean)) => clean,
            Ok(Err(e)) => {
                tracing::error!(service = name, error = %e, "service task failed");
                false
            }
            Err(_) => {
                tracing::warn!(service = name, "service did not stop in time");
                false
            }
        }
    }

    /// Stops every service, last started first (so browsers flush their
    /// profiles while X still runs). `browser_grace` bounds each browser,
    /// `grace` every other service.
    pub async fn stop_all(&mut self, browser_grace: Duration, grace: Duration) {
        let order: Vec<(&'static str, ServiceKind)> = self
            .handles
            .iter()
            .rev()
            .map(|h| (h.name, h.kind))
            .collect();
        for (name, kind) in order {
            let bound = if matches!(kind, ServiceKind::Browser(_)) {
                browser_grace
            } else {
                grace
            };
            let started = Instant::now();
            let clean = self.stop_service(name, bound).await;
            tracing::info!(
                service = name,
                clean,
                elapsed_ms = crate::millis(started.elapsed()),
                "service stopped"
            );
        }
    }

    /// Sends `signal` to the process group of every running service except
    /// the X server (for which SIGHUP means "reset", dropping every client).
    pub fn forward(&self, signal: Signal) {
        for handle in &self.handles {
            if handle.kind == ServiceKind::Display {
                continue;
            }
            if let Some(pid) = *handle.pid.borrow() {
                let Ok(pgid) = i32::try_from(pid).map(nix::unistd::Pid::from_raw) else {
                    continue;
                };
                match nix::sys::signal::killpg(pgid, signal) {
                    Ok(()) => tracing::info!(service = handle.name, %signal, "forwarded signal"),
                    Err(e) => {
                        tracing::debug!(service = handle.name, %signal, error = %e, "cannot forward signal")
                    }
                }
            }
        }
    }

    /// Pids (= process-group ids) of the services' running processes.
    pub fn service_pids(&self) -> Vec<u32> {
        self.handles
            .iter()
            .filter_map(|h| *h.pid.borrow())
            .collect()
    }

    /// Pids (= process-group ids) of the running browser services.
    pub fn browser_pids(&self) -> Vec<u32> {
        self.handles
            .iter()
            .filter(|h| matches!(h.kind, ServiceKind::Browser(_)))
            .filter_map(|h| *h.pid.borrow())
            .collect()
    }

    /// The current run states, in start order.
    pub fn states(&self) -> Vec<ServiceRunState> {
        self.table.states()
    }
}

/// The task of service `idx`, and the handle that stops it.
fn spawn_task(spec: ServiceSpec, idx: usize, ctx: &Arc<Context>) -> ServiceHandle {
    let (stop_tx, stop_rx) = watch::channel(None);
    let (pid_tx, pid_rx) = watch::channel(None);
    let name = spec.name;
    let kind = spec.kind;
    let task = tokio::spawn(supervise(spec, idx, ctx.clone(), stop_rx, pid_tx));
    ServiceHandle {
        name,
        kind,
        stop: stop_tx,
        pid: pid_rx,
        task: Some(task),
    }
}

/// Runs one service until told to stop; returns whether its last process
/// exited within the stop grace.
async fn supervise(
    spec: ServiceSpec,
    idx: usize,
    ctx: Arc<Context>,
    mut stop: StopSignal,
    pid_tx: watch::Sender<Option<u32>>,
) -> bool {
    let mut tracker = RestartTracker::new(ctx.policy);
    let mut deps = ctx.table.changed.subscribe();
    loop {
        // 1. Wait for the services before this one that it needs to run.
        loop {
            if stop.borrow().is_some() {
                return stopped(&ctx, idx);
            }
            let states = ctx.table.states();
            let needed_run = states[..idx]
                .iter()
                .zip(&ctx.kinds)
                .filter(|(_, kind)| spec.kind.waits_for(**kind))
                .all(|(s, _)| *s == ServiceRunState::Running);
            if needed_run {
                break;
            }
            let alive = tokio::select! {
                r = deps.changed() => r.is_ok(),
                r = stop.changed() => r.is_ok(),
            };
            if !alive {
                return stopped(&ctx, idx);
            }
        }

        // 2. Spawn and wait for readiness.
        let spawned_at = Instant::now();
        let attempt = run_once(&spec, idx, &ctx, &mut stop, &pid_tx).await;
        if spec.kind == ServiceKind::Taskbar {
            // Its band goes with it; the next start measures it again.
            ctx.table.cell.set_taskbar_height(None);
        }
        let attempt = match attempt {
            Attempt::Stopped(clean) => {
                pid_tx.send_replace(None);
                stopped(&ctx, idx);
                return clean;
            }
            Attempt::Failed(cause) => cause,
        };
        pid_tx.send_replace(None);

        // 3. Fix the cause where possible, then back off or give up a while.
        let ran_for = spawned_at.elapsed();
        let fixed = apply_remedy(&spec, &ctx.config, &attempt);
        let decision = tracker.record_failure(Instant::now(), ran_for, fixed);
        let (state, wait) = match decision {
            RestartDecision::RetryAfter(delay) => (ServiceRunState::Backoff, delay),
            RestartDecision::CrashLoop { failures, cooldown } => {
                let window = Duration::from_millis(ctx.config.crash_loop_window_ms);
                let problem = format!(
                    "{}: crash loop ({failures} failures within {}s, last: {attempt}); retrying in {}s",
                    spec.name,
                    window.as_secs(),
                    cooldown.as_secs()
                );
                tracing::error!(service = spec.name, %problem, "crash loop");
                ctx.table.update(idx, |_, p| *p = Some(problem));
                (ServiceRunState::Failed, cooldown)
            }
        };
        tracing::warn!(service = spec.name, cause = %attempt, ran_ms = crate::millis(ran_for), retry_ms = crate::millis(wait), fixed, "service failed");
        ctx.table.update(idx, |s, _| {
            s.state = state;
            s.pid = None;
            s.ready_since = None;
            s.restarts = s.restarts.saturating_add(1);
            s.last_exit = Some(attempt.to_string());
        });
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(Option::is_some) => return stopped(&ctx, idx),
        }
    }
}

fn stopped(ctx: &Context, idx: usize) -> bool {
    ctx.table.update(idx, |s, _| {
        s.state = ServiceRunState::Stopped;
        s.pid = None;
        s.ready_since = None;
    });
    true
}

enum Attempt {
    /// Told to stop; whether the process exited within the grace.
    Stopped(bool),
    /// It failed for this cause (and is gone).
    Failed(FailureCause),
}

/// One life of the service: spawn, readiness, run until exit or stop.
// Over 100 lines on purpose: one life in order (spawn, race readiness
// against exit and stop, then race exit against stop), each race a short
// `select!`; apart, the order of a life would be spread over helpers.
async fn run_once(
    spec: &ServiceSpec,
    idx: usize,
    ctx: &Context,
    stop: &mut StopSignal,
    pid_tx: &watch::Sender<Option<u32>>,
) -> Attempt {
    let config = &ctx.config;
    let mut cmd = desktop_command(config, &spec.program);
    cmd.args(&spec.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, mut io) = match init::spawn(&mut cmd) {
        Ok(spawned) => spawned,
        Err(e) => return Attempt::Failed(FailureCause::SpawnFailed(e.to_string())),
    };
    let pid = child.pid();
    pid_tx.send_replace(Some(pid));
    ctx.table.update(idx, |s, _| {
        s.state = ServiceRunState::Starting;
        s.pid = Some(pid);
        s.ready_since = None;
    });
    tracing::info!(service = spec.name, pid, program = %spec.program, "service started");

    let tail = Tail::default();
    let mut stderr_task = None;
    if let Some(stderr) = io.stderr.take() {
        match pipe_reader(stderr) {
            Ok(reader) => {
                stderr_task = Some(tokio::spawn(output::forward(
                    spec.name,
                    LineReader::new(reader),
                    tail.clone(),
                )));
            }
            Err(e) => tracing::warn!(service = spec.name, error = %e, "cannot read stderr"),
        }
    }
    let mut stdout = io.stdout.take().and_then(|s| match pipe_reader(s) {
        Ok(r) => Some(LineReader::new(r)),
        Err(e) => {
            tracing::warn!(service = spec.name, error = %e, "cannot read stdout");
            None
        }
    });
    drop(io);

    let bound = Duration::from_millis(config.service_ready_timeout_ms);
    let ready = async {
        match (spec.kind, stdout.as_mut()) {
            (ServiceKind::Display, Some(out)) => readiness::display(config, out).await,
            (ServiceKind::Vnc, Some(out)) => readiness::vnc(config, out).await,
            (ServiceKind::Display | ServiceKind::Vnc, None) => {
                Err(readiness::NotReady::OutputClosed)
            }
            (ServiceKind::WindowManager, _) => readiness::window_manager(config).await,
            (ServiceKind::Taskbar, _) => readiness::taskbar(config)
                .await
                .map(|band| ctx.table.cell.set_taskbar_height(Some(band))),
            (ServiceKind::Browser(_), _) => Ok(()),
        }
    };
    let outcome = tokio::select! {
        biased;
        _ = stop.wait_for(Option::is_some) => None,
        exit = child.wait() => Some(Err(Some(exit))),
        r = tokio::time::timeout(bound, ready) => Some(match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(service = spec.name, error = %e, "not ready");
                Err(None)
            }
            Err(_) => Err(None),
        }),
    };
    let Some(outcome) = outcome else {
        return Attempt::Stopped(terminate(spec, config, &mut child, stop_grace(stop)).await);
    };
    if let Some(out) = stdout.take() {
        tokio::spawn(output::forward(spec.name, out, tail.clone()));
    }
    let exit = match outcome {
        Ok(()) => {
            let now = Utc::now();
            ctx.table.update(idx, |s, problem| {
                s.state = ServiceRunState::Running;
                s.ready_since = Some(now);
                // Running again ends a crash loop's complaint.
                *problem = None;
            });
            tracing::info!(
                service = spec.name,
                pid,
                ready_ms = crate::millis(ctx.started.elapsed()),
                "service ready"
            );
            if let Some(step) = spec.kind.start_step() {
                ctx.table.cell.mark(step);
            }
            let exit = tokio::select! {
                biased;
                _ = stop.wait_for(Option::is_some) => None,
                exit = child.wait() => Some(exit),
            };
            if exit.is_none() {
                return Attempt::Stopped(
                    terminate(spec, config, &mut child, stop_grace(stop)).await,
                );
            }
            exit
        }
        Err(Some(exit)) => Some(exit),
        Err(None) => {
            // Not ready in time (or its readiness failed): it goes.
            terminate(spec, config, &mut child, Duration::from_millis(500)).await;
            None
        }
    };
    // Helpers of a dead leader (e.g. a browser's renderers) go with it.
    kill_group_leftovers(pid);
    // The last lines it wrote name the cause: read them to the end of the
    // pipe before classifying (bounded: a stray process could hold it open).
    if let Some(task) = stderr_task {
        let _ = tokio::time::timeout(Duration::from_millis(250), task).await;
    }
    Attempt::Failed(restart::classify(spec.kind, exit, &tail.lines()))
}

fn stop_grace(stop: &StopSignal) -> Duration {
    stop.borrow().unwrap_or(Duration::from_secs(1))
}

/// Ends a service within `grace`: a browser is first asked to close its
/// windows (its normal shutdown flushes the profile); then SIGTERM to the
/// group, SIGKILL when the grace is over. Waits until the leader is reaped.
/// `true` if it exited within the grace.
async fn terminate(
    spec: &ServiceSpec,
    config: &Config,
    child: &mut OwnedChild,
    grace: Duration,
) -> bool {
    let name = spec.name;
    let deadline = Instant::now() + grace;
    if matches!(spec.kind, ServiceKind::Browser(_)) && child.exited().is_none() {
        let asked = crate::x_client::close_windows_of(config, &[child.pid()], grace / 4).await;
        if asked > 0 {
            let half = deadline.saturating_duration_since(Instant::now()) / 2;
            if let Ok(exit) = tokio::time::timeout(half, child.wait()).await {
                tracing::info!(service = name, windows = asked, %exit, "closed through its windows");
                kill_group_leftovers(child.pid());
                return true;
            }
            tracing::info!(
                service = name,
                "still running after closing its windows; SIGTERM"
            );
        }
    }
    child.signal_group(Signal::SIGTERM);
    let clean = match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(exit) => {
            tracing::debug!(service = name, %exit, "exited after SIGTERM");
            true
        }
        Err(_) => {
            tracing::warn!(
                service = name,
                grace_ms = crate::millis(grace),
                "no exit after SIGTERM; killing"
            );
            child.signal_group(Signal::SIGKILL);
            false
        }
    };
    let _: ChildExit = child.wait().await;
    kill_group_leftovers(child.pid());
    clean
}

/// SIGKILL to whatever is left of a process group whose leader is gone. The
/// kernel does not reuse a pid while it is some group's id, so this cannot
/// reach a stranger.
fn kill_group_leftovers(pgid: u32) {
    let Ok(pgid) = i32::try_from(pgid).map(nix::unistd::Pid::from_raw) else {
        return;
    };
    let _ = nix::sys::signal::killpg(pgid, Signal::SIGKILL);
}

/// Fixes what a failure's cause points at; `true` if something was fixed.
fn apply_remedy(spec: &ServiceSpec, config: &Config, cause: &FailureCause) -> bool {
    let result = match (cause.remedy(), spec.kind) {
        (Remedy::ClearDisplayLocks, ServiceKind::Display) => locks::clear_x_locks(config),
        (Remedy::ClearProfileLocks, ServiceKind::Browser(browser)) => {
            locks::clear_profile_locks(config, Some(ProfileFamily::of(browser)))
        }
        _ => return false,
    };
    match result {
        Ok(removed) => {
            for path in &removed {
                tracing::info!(service = spec.name, path = %path.display(), %cause, "removed stale lock before retrying");
            }
            !removed.is_empty()
        }
        Err(e) => {
            tracing::warn!(service = spec.name, error = %e, "cannot remove stale locks");
            false
        }
    }
}

/// A child's pipe as a non-blocking reader on the runtime.
fn pipe_reader(
    pipe: impl Into<std::os::fd::OwnedFd>,
) -> std::io::Result<tokio::net::unix::pipe::Receiver> {
    tokio::net::unix::pipe::Receiver::from_owned_fd(pipe.into())
}

#[cfg(test)]
mod tests;
