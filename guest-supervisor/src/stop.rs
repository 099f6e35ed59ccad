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
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::path::Path;
use std::time::Duration;

use dormouse_protocol::Quiesced;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use crate::config::Config;
use crate::procfs::{self, Stat};
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

/// One process as seen in procfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Parent's id.
    pub ppid: u32,
    /// Process group id.
    pub pgid: u32,
    /// Real uid.
    pub uid: u32,
    /// Command name.
    pub comm: String,
}

/// Every live (not zombie) process in `proc_root`.
pub fn processes(proc_root: &Path) -> std::io::Result<Vec<ProcessInfo>> {
    // A process may vanish between readdir and read: skip it.
    let mut all: Vec<ProcessInfo> = procfs::pid_dirs(proc_root)?
        .filter_map(|(pid, dir)| read_process(&dir, pid))
        .collect();
    all.sort_by_key(|p| p.pid);
    Ok(all)
}

fn read_process(dir: &Path, pid: u32) -> Option<ProcessInfo> {
    let text = std::fs::read_to_string(dir.join("stat")).ok()?;
    let stat = Stat::parse(&text)?;
    if !stat.is_live() {
        return None;
    }
    Some(ProcessInfo {
        pid,
        ppid: stat.number(Stat::PPID)?,
        pgid: stat.number(Stat::PGRP)?,
        uid: procfs::real_uid(dir)?,
        comm: stat.comm().to_owned(),
    })
}

/// The desktop user's processes; when `ancestor` is given, only its
/// descendants.
pub fn desktop_processes(
    config: &Config,
    ancestor: Option<u32>,
) -> std::io::Result<Vec<ProcessInfo>> {
    let all = processes(&config.proc_root)?;
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
    let started = Instant::now();
    let supervised = services.browser_names();
    let skip: BTreeSet<u32> = services.service_pids().into_iter().collect();
    let user = async {
        let procs = match desktop_processes(config, scope(is_pid1)) {
            Ok(procs) => procs,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list processes");
                return (Vec::new(), false);
            }
        };
        let mains: Vec<ProcessInfo> = browser_mains(&procs)
            .into_iter()
            .filter(|p| !skip.contains(&p.pgid))
            .cloned()
            .collect();
        let pids: Vec<u32> = mains.iter().map(|p| p.pid).collect();
        let complete = close_politely(config, &pids, bound).await;
        let names = mains
            .iter()
            .map(|p| format!("{} ({})", p.comm, p.pid))
            .collect();
        (names, complete)
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
    let ((mut closed, ours_complete), (user_closed, user_complete)) = tokio::join!(ours, user);
    closed.extend(user_closed);
    let elapsed_ms = started.elapsed().as_millis() as u64;
    tracing::info!(
        ?closed,
        complete = ours_complete && user_complete,
        elapsed_ms,
        "browsers closed"
    );
    Quiesced {
        closed,
        complete: ours_complete && user_complete,
        elapsed_ms,
    }
}

/// Closes the processes `pids` (browser main processes): their windows
/// first, then one SIGTERM each for those still running after half of
/// `bound`. `true` if all exited within `bound`.
pub async fn close_politely(config: &Config, pids: &[u32], bound: Duration) -> bool {
    if pids.is_empty() {
        return true;
    }
    let deadline = Instant::now() + bound;
    let asked = x_client::close_windows_of(config, pids, bound / 4).await;
    if asked > 0 {
        tracing::info!(?pids, windows = asked, "asked browser windows to close");
        let half = deadline.saturating_duration_since(Instant::now()) / 2;
        if wait_gone(&config.proc_root, pids, half).await {
            return true;
        }
    }
    let left: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&pid| alive(&config.proc_root, pid))
        .collect();
    for &pid in &left {
        tracing::info!(pid, "asking a browser to quit (SIGTERM)");
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    }
    wait_gone(
        &config.proc_root,
        &left,
        deadline.saturating_duration_since(Instant::now()),
    )
    .await
}

/// Whether `pid` is alive (not gone, not a zombie).
fn alive(proc_root: &Path, pid: u32) -> bool {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat"))
        .is_ok_and(|text| Stat::parse(&text).is_some_and(|s| s.is_live()))
}

/// Ends every desktop process still alive: SIGTERM, then SIGKILL for those
/// still there after `grace`. Returns how many were found.
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
    for p in &procs {
        tracing::info!(pid = p.pid, comm = %p.comm, "ending straggler");
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGTERM);
    }
    let pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
    if !wait_gone(&config.proc_root, &pids, grace).await {
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
    }
    procs.len()
}

/// Waits until every pid has exited, at most `bound`. `true` if all did.
pub async fn wait_gone(proc_root: &Path, pids: &[u32], bound: Duration) -> bool {
    let waits = pids.iter().map(|&pid| wait_exit(proc_root, pid));
    tokio::time::timeout(bound, futures_join_all(waits))
        .await
        .is_ok()
}

/// Waits for the exit of a process that need not be our child: by pidfd
/// (readable once it has exited), or — where the kernel or a seccomp
/// profile refuses pidfds — by looking at procfs every 20 ms.
async fn wait_exit(proc_root: &Path, pid: u32) {
    match pidfd_open(pid) {
        Ok(fd) => {
            // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays
            // open and the same for the AsyncFd's whole life.
            match unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
                Ok(fd) => {
                    let _ = fd.readable().await;
                    return;
                }
                Err(e) => tracing::debug!(pid, error = %e, "cannot watch pidfd"),
            }
        }
        Err(nix::errno::Errno::ESRCH) => return,
        Err(e) => tracing::debug!(pid, error = %e, "no pidfd; watching procfs"),
    }
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

fn pidfd_open(pid: u32) -> nix::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and touches no memory of ours.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as nix::libc::pid_t, 0) };
    if fd < 0 {
        return Err(nix::errno::Errno::last());
    }
    let fd = i32::try_from(fd).map_err(|_| nix::errno::Errno::EBADF)?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
}
