//! Closing browsers cleanly (quiesce, and the first step of a stop), and
//! ending whatever desktop processes are left at the end of a stop.
//!
//! Owns finding the desktop user's processes in `config.proc_root` (only
//! the supervisor's descendants when it is not PID 1, so a shared pid
//! namespace never exposes the host's processes to it), closing browsers the
//! way a person would — `WM_DELETE_WINDOW` to each of their windows, which
//! runs the browser's normal shutdown: cookies flushed, profile lock
//! released — then, for what is left, one SIGTERM per main process (Chromium
//! ends its session on SIGTERM without flushing recent cookies, and a second
//! SIGTERM makes it skip even that), and waiting for exits by pidfd. It
//! never touches processes of other users, and never kills before asking.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use dormouse_protocol::Quiesced;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::Instant;

use crate::config::Config;
use crate::pidfd::Pidfd;
use crate::procfs::{self, ProcessInfo, Stat};
use crate::reopen::{Closed, Relaunch, MAX_RELAUNCHES};
use crate::services::Services;
use crate::x_client;

/// Command names (`/proc/<pid>/comm`) of browser processes.
const BROWSER_COMMS: &[&str] = &[
    "chromium",
    "chrome",
    "google-chrome",
    "firefox-esr",
    "firefox",
    "firefox-bin",
];

/// The desktop user's processes; when `ancestor` is given, only its
/// descendants.
pub fn desktop_processes(
    config: &Config,
    ancestor: Option<u32>,
) -> std::io::Result<Vec<ProcessInfo>> {
    let all = procfs::processes(&config.proc_root)?;
    let parents: BTreeMap<u32, u32> = all.iter().map(|p| (p.pid, p.ppid)).collect();
    let descends = |mut pid: u32| {
        let Some(root) = ancestor else { return true };
        for _ in 0..1024 {
            match parents.get(&pid) {
                Some(&ppid) if ppid == root => return true,
                Some(&ppid) if ppid != 0 && ppid != pid => pid = ppid,
                _ => return false,
            }
        }
        false
    };
    Ok(all
        .iter()
        .filter(|p| p.uid == config.uid && descends(p.pid))
        .cloned()
        .collect())
}

/// Browser main processes among `procs`: a browser whose parent is not a
/// browser (helpers and content processes are children of the main one).
pub fn browser_mains(procs: &[ProcessInfo]) -> Vec<&ProcessInfo> {
    let is_browser = |comm: &str| BROWSER_COMMS.contains(&comm);
    let by_pid: BTreeMap<u32, &ProcessInfo> = procs.iter().map(|p| (p.pid, p)).collect();
    procs
        .iter()
        .filter(|p| is_browser(&p.comm))
        .filter(|p| {
            !by_pid
                .get(&p.ppid)
                .is_some_and(|parent| is_browser(&parent.comm))
        })
        .collect()
}

/// The supervisor's own pid when it is not PID 1 (limits every scan to its
/// descendants), `None` as PID 1 (the whole namespace is the container).
pub fn scope(is_pid1: bool) -> Option<u32> {
    (!is_pid1).then(std::process::id)
}

/// Closes every browser so its profile flushes: the supervised browser
/// services (SIGTERM to their group) and browsers the user started (one
/// SIGTERM to each main process), all at once, bounded by `bound`.
pub async fn close_browsers(
    services: &mut Services,
    config: &Config,
    is_pid1: bool,
    bound: Duration,
) -> Quiesced {
    close_and_remember(services, config, is_pid1, bound).await.0
}

/// [`close_browsers`], also saying what it closed in a form that can be
/// started again ([`crate::reopen`]): the browser services, and the user's
/// browsers as captured just before they were asked to close.
pub async fn close_and_remember(
    services: &mut Services,
    config: &Config,
    is_pid1: bool,
    bound: Duration,
) -> (Quiesced, Closed) {
    let started = Instant::now();
    let supervised = services.browser_names();
    let remembered_services = supervised.clone();
    // The browser services' groups close through their service. Only
    // theirs: a browser opened from the window manager's menu runs in the
    // window manager's group, and is the user's, to close like any other.
    let skip: BTreeSet<u32> = services.browser_pids().into_iter().collect();
    let user = async {
        let procs = match desktop_processes(config, scope(is_pid1)) {
            Ok(procs) => procs,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list processes");
                return (Vec::new(), false, Vec::new());
            }
        };
        let mains: Vec<ProcessInfo> = browser_mains(&procs)
            .into_iter()
            .filter(|p| !skip.contains(&p.pgid))
            .cloned()
            .collect();
        let pids: Vec<u32> = mains.iter().map(|p| p.pid).collect();
        let captured: Vec<Relaunch> = mains
            .iter()
            .filter_map(|p| Relaunch::capture(&config.proc_root, p.pid))
            .take(MAX_RELAUNCHES)
            .collect();
        let complete = close_politely(config, &pids, bound).await;
        let names = mains
            .iter()
            .map(|p| format!("{} ({})", p.comm, p.pid))
            .collect();
        (names, complete, captured)
    };
    let ours = async {
        let mut closed = Vec::new();
        let mut complete = true;
        for name in supervised {
            if services.stop_service(name, bound).await {
                closed.push(name.to_owned());
            } else {
                complete = false;
            }
        }
        (closed, complete)
    };
    let ((mut closed, ours_complete), (user_closed, user_complete, captured)) =
        tokio::join!(ours, user);
    closed.extend(user_closed);
    let elapsed_ms = crate::millis(started.elapsed());
    tracing::info!(
        ?closed,
        complete = ours_complete && user_complete,
        elapsed_ms,
        "browsers closed"
    );
    let quiesced = Quiesced {
        closed,
        complete: ours_complete && user_complete,
        elapsed_ms,
    };
    let remembered = Closed {
        services: remembered_services,
        user: captured,
    };
    (quiesced, remembered)
}

/// Closes the processes `pids` (browser main processes): their windows
/// first, then one SIGTERM each for those still running after half of
/// `bound`, sent through a pidfd opened while the process was known alive.
/// `true` if all exited within `bound`.
pub async fn close_politely(config: &Config, pids: &[u32], bound: Duration) -> bool {
    if pids.is_empty() {
        return true;
    }
    let deadline = Instant::now() + bound;
    // Held from here on: a pid that ends and is reused meanwhile is never
    // signalled, its pidfd still names the process that was closed.
    let held = Held::all(&config.proc_root, pids);
    let asked = x_client::close_windows_of(config, pids, bound / 4).await;
    if asked > 0 {
        tracing::info!(?pids, windows = asked, "asked browser windows to close");
        let half = deadline.saturating_duration_since(Instant::now()) / 2;
        if wait_all(&config.proc_root, &held, half).await {
            return true;
        }
    }
    let (left, _gone): (Vec<Held>, Vec<Held>) =
        held.into_iter().partition(|h| h.alive(&config.proc_root));
    for h in &left {
        tracing::info!(pid = h.pid, "asking a browser to quit (SIGTERM)");
        h.signal(Signal::SIGTERM);
    }
    wait_all(
        &config.proc_root,
        &left,
        deadline.saturating_duration_since(Instant::now()),
    )
    .await
}

/// One process held while it was known alive: by a pidfd where the kernel
/// gives one (signals and the wait for its exit then go to that very
/// process, never to a reused pid), else by pid number.
#[derive(Debug)]
pub struct Held {
    /// Its pid (for messages and the procfs fallback).
    pub pid: u32,
    pidfd: Option<Pidfd>,
}

impl Held {
    /// Holds `pid` if it is alive now: opens its pidfd, then checks in procfs
    /// that the pid still is a live process (so the pidfd cannot name a
    /// process that took over the number). `None` when it is gone.
    pub fn new(proc_root: &Path, pid: u32) -> Option<Self> {
        match Pidfd::open(pid) {
            Ok(fd) => {
                let held = Self {
                    pid,
                    pidfd: Some(fd),
                };
                held.alive(proc_root).then_some(held)
            }
            Err(nix::errno::Errno::ESRCH) => None,
            Err(e) => {
                tracing::debug!(pid, error = %e, "no pidfd; signalling by pid");
                alive(proc_root, pid).then_some(Self { pid, pidfd: None })
            }
        }
    }

    /// Holds every live one of `pids`.
    pub fn all(proc_root: &Path, pids: &[u32]) -> Vec<Self> {
        pids.iter()
            .filter_map(|&pid| Self::new(proc_root, pid))
            .collect()
    }

    /// Whether it still runs: its pidfd is not readable yet (or, without a
    /// pidfd, procfs says so).
    pub fn alive(&self, proc_root: &Path) -> bool {
        match &self.pidfd {
            Some(fd) => match fd.has_exited() {
                Ok(exited) => !exited,
                Err(_) => alive(proc_root, self.pid),
            },
            None => alive(proc_root, self.pid),
        }
    }

    /// Sends `signal`: through the pidfd (a process that has ended gets
    /// nothing, and nothing else gets it), or by pid without one.
    pub fn signal(&self, signal: Signal) {
        match &self.pidfd {
            Some(fd) => {
                if let Err(e) = fd.signal(signal) {
                    tracing::debug!(pid = self.pid, error = %e, "signal not delivered");
                }
            }
            None => {
                if let Ok(pid) = i32::try_from(self.pid) {
                    let _ = kill(Pid::from_raw(pid), signal);
                }
            }
        }
    }

    /// Waits for its exit: its pidfd becomes readable (or, without one,
    /// procfs says it has exited).
    async fn wait(&self, proc_root: &Path) {
        if let Some(fd) = &self.pidfd {
            match fd.exited().await {
                Ok(()) => return,
                Err(e) => tracing::debug!(pid = self.pid, error = %e, "cannot watch pidfd"),
            }
        }
        wait_in_procfs(proc_root, self.pid).await;
    }
}

/// Waits until every held process has exited, at most `bound`. `true` if
/// all did.
async fn wait_all(proc_root: &Path, held: &[Held], bound: Duration) -> bool {
    let waits = held.iter().map(|h| h.wait(proc_root));
    tokio::time::timeout(bound, futures_join_all(waits))
        .await
        .is_ok()
}

/// Whether `pid` is alive (not gone, not a zombie).
fn alive(proc_root: &Path, pid: u32) -> bool {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat"))
        .is_ok_and(|text| Stat::parse(&text).is_some_and(|s| s.is_live()))
}

/// Ends every desktop process still alive: SIGTERM, then SIGKILL for those
/// still there after `grace`, both through pidfds opened while each process
/// was known alive. Returns how many were found.
pub async fn end_stragglers(config: &Config, is_pid1: bool, grace: Duration) -> usize {
    let procs = match desktop_processes(config, scope(is_pid1)) {
        Ok(procs) => procs,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list processes");
            return 0;
        }
    };
    if procs.is_empty() {
        return 0;
    }
    let pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
    let held = Held::all(&config.proc_root, &pids);
    for p in &procs {
        tracing::info!(pid = p.pid, comm = %p.comm, "ending straggler");
    }
    for h in &held {
        h.signal(Signal::SIGTERM);
    }
    if !wait_all(&config.proc_root, &held, grace).await {
        for h in &held {
            h.signal(Signal::SIGKILL);
        }
    }
    procs.len()
}

/// Waits until every pid has exited, at most `bound`. `true` if all did.
pub async fn wait_gone(proc_root: &Path, pids: &[u32], bound: Duration) -> bool {
    wait_all(proc_root, &Held::all(proc_root, pids), bound).await
}

/// Waits for `pid` to exit by looking at procfs every 20 ms, where the
/// kernel or a seccomp profile refuses pidfds.
async fn wait_in_procfs(proc_root: &Path, pid: u32) {
    let stat = proc_root.join(pid.to_string()).join("stat");
    loop {
        match std::fs::read_to_string(&stat) {
            Ok(text) => {
                if Stat::parse(&text).is_some_and(|s| s.has_exited()) {
                    return;
                }
            }
            Err(_) => return,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Awaits all futures concurrently (a tiny `join_all`, so the supervisor
/// needs no futures crate).
async fn futures_join_all<F: std::future::Future<Output = ()>>(
    futures: impl IntoIterator<Item = F>,
) {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    std::future::poll_fn(move |cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(root: &Path, pid: u32, ppid: u32, uid: u32, comm: &str, state: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("stat"),
            format!(
                "{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 20 0 1 0 100\n"
            ),
        )
        .expect("stat");
        std::fs::write(
            dir.join("status"),
            format!("Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .expect("status");
    }

    #[test]
    fn finds_desktop_processes_and_browser_mains() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fake(root, 1, 0, 0, "dormouse-superv", "S");
        fake(root, 10, 1, 1000, "chromium", "S");
        fake(root, 11, 10, 1000, "chromium", "S"); // zygote/renderer
        fake(root, 12, 1, 1000, "firefox-esr", "S");
        fake(root, 13, 12, 1000, "Web Content", "S");
        fake(root, 14, 1, 1000, "sleep", "Z"); // zombie: not listed
        fake(root, 15, 1, 0, "chromium", "S"); // root's, not the desktop's
        fake(root, 20, 0, 1000, "bash", "S"); // not a descendant of 1
        let config = Config {
            proc_root: root.to_owned(),
            ..Config::default()
        };
        let all = desktop_processes(&config, None).expect("list");
        let pids: Vec<u32> = all.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [10, 11, 12, 13, 20]);
        let mains: Vec<u32> = browser_mains(&all).iter().map(|p| p.pid).collect();
        assert_eq!(mains, [10, 12]);
        let under_1: Vec<u32> = desktop_processes(&config, Some(1))
            .expect("list")
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(under_1, [10, 11, 12, 13]);
    }

    #[tokio::test]
    async fn waiting_for_a_gone_pid_returns_at_once() {
        // Pid numbers this high are never in use on a default pid_max.
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(wait_gone(dir.path(), &[4_000_000, 4_000_001], Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_held_process_is_signalled_through_its_pidfd_and_never_after_its_end() {
        use std::os::unix::process::ExitStatusExt as _;
        let proc_root = Path::new("/proc");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let held = Held::new(proc_root, child.id()).expect("alive");
        assert!(held.alive(proc_root));
        held.signal(Signal::SIGTERM);
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc_sigterm()));
        // Reaped: the pid number may now be anyone's. The pidfd still names
        // the process that ended, so nothing is signalled.
        assert!(!held.alive(proc_root));
        if let Some(fd) = &held.pidfd {
            assert_eq!(fd.signal(Signal::SIGTERM), Err(nix::errno::Errno::ESRCH));
        }
        assert!(
            tokio::time::timeout(Duration::from_secs(5), held.wait(proc_root))
                .await
                .is_ok()
        );
    }

    fn libc_sigterm() -> i32 {
        Signal::SIGTERM as i32
    }
}
