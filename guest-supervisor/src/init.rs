//! PID-1 duties: becoming a subreaper, spawning owned children, reaping.
//!
//! Owns the one table of children the supervisor waits on itself, and the
//! one place that calls `waitpid`. A sweep reaps every child that has ended
//! (`waitpid(-1, WNOHANG)`) and hands the status of an owned child to its
//! owner; anything else — orphans reparented to PID 1, like Chromium's
//! helpers — is reaped blindly. Because spawning inserts into the table while
//! holding the same lock a sweep takes, no status is ever lost or stolen.
//!
//! Rule for the whole crate: every child process is spawned through
//! [`spawn`]. Never `std::process::Command::{status, output}` nor
//! `tokio::process`: they `waitpid` on their own and would race with the
//! sweep (one of the two would get `ECHILD`).

use std::collections::BTreeMap;
use std::fmt;
use std::process::{Child, Command};
use std::sync::{LazyLock, Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::{oneshot, watch};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    /// It exited with this code.
    Code(i32),
    /// A signal (by number) ended it.
    Signal(i32),
}

impl ChildExit {
    /// Whether it exited with code 0.
    pub fn success(self) -> bool {
        self == Self::Code(0)
    }
}

impl fmt::Display for ChildExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Code(code) => write!(f, "exit {code}"),
            Self::Signal(n) => match Signal::try_from(n) {
                Ok(sig) => write!(f, "signal {n} ({})", sig.as_str()),
                Err(_) => write!(f, "signal {n}"),
            },
        }
    }
}

/// Owners waiting for the status of their child, by pid.
static OWNED: Mutex<BTreeMap<i32, oneshot::Sender<ChildExit>>> = Mutex::new(BTreeMap::new());

/// `true` after a sweep found no children at all (`ECHILD`).
static CHILDLESS: LazyLock<watch::Sender<bool>> = LazyLock::new(|| watch::channel(false).0);

fn owned() -> MutexGuard<'static, BTreeMap<i32, oneshot::Sender<ChildExit>>> {
    // A poisoned table only means a panic elsewhere mid-insert; the map is
    // still a valid map.
    OWNED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child the supervisor waits on itself.
#[derive(Debug)]
pub struct OwnedChild {
    pid: Pid,
    rx: oneshot::Receiver<ChildExit>,
    exit: Option<ChildExit>,
}

impl OwnedChild {
    /// Its pid (also its process-group id when spawned with
    /// `process_group(0)`).
    pub fn pid(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    /// Waits until it has ended and been reaped. Cancel-safe; may be called
    /// again after it returned.
    pub async fn wait(&mut self) -> ChildExit {
        if let Some(exit) = self.exit {
            return exit;
        }
        let exit = match (&mut self.rx).await {
            Ok(exit) => exit,
            // Only if the table entry was dropped without a status, which
            // the sweep never does; report it as a kill rather than hang.
            Err(_) => ChildExit::Signal(Signal::SIGKILL as i32),
        };
        self.exit = Some(exit);
        exit
    }

    /// Its status if it has ended already.
    pub fn exited(&mut self) -> Option<ChildExit> {
        if self.exit.is_none() {
            self.exit = self.rx.try_recv().ok();
        }
        self.exit
    }

    /// Sends `signal` to its whole process group (which it leads). A group
    /// that is gone already is not an error.
    pub fn signal_group(&mut self, signal: Signal) {
        if self.exited().is_some() {
            // The pid may be reused after the reap; never signal a stranger.
            return;
        }
        if let Err(e) = nix::sys::signal::killpg(self.pid, signal) {
            if e != Errno::ESRCH {
                tracing::warn!(pid = self.pid.as_raw(), %signal, error = %e, "cannot signal process group");
            }
        }
    }
}

/// Spawns `cmd` as an owned child: the next sweep hands its status to the
/// returned [`OwnedChild`] instead of reaping it blindly. The [`Child`] is
/// returned only for its pipes; never wait on it.
pub fn spawn(cmd: &mut Command) -> std::io::Result<(OwnedChild, Child)> {
    let (tx, rx) = oneshot::channel();
    // Held across fork/exec and insert, so a sweep cannot reap the child
    // before its owner is known.
    let mut table = owned();
    let child = cmd.spawn()?;
    // Linux pids stay below 2^22; a larger one would be a kernel we do not
    // know, and an unowned child is better than a wrong pid.
    let pid = Pid::from_raw(
        i32::try_from(child.id()).map_err(|_| std::io::Error::other("pid out of range"))?,
    );
    table.insert(pid.as_raw(), tx);
    drop(table);
    CHILDLESS.send_replace(false);
    Ok((
        OwnedChild {
            pid,
            rx,
            exit: None,
        },
        child,
    ))
}

/// Reaps every child that has ended; returns how many were orphans (not
/// owned).
pub fn sweep() -> usize {
    let mut orphans = 0;
    let mut table = owned();
    let childless = loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => break false,
            Ok(WaitStatus::Exited(pid, code)) => {
                orphans += route(&mut table, pid, ChildExit::Code(code));
            }
            Ok(WaitStatus::Signaled(pid, signal, _core)) => {
                orphans += route(&mut table, pid, ChildExit::Signal(signal as i32));
            }
            // Stops and continues are not asked for (no WUNTRACED).
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(Errno::ECHILD) => break true,
            Err(e) => {
                tracing::warn!(error = %e, "waitpid failed");
                break false;
            }
        }
    };
    drop(table);
    CHILDLESS.send_if_modified(|c| std::mem::replace(c, childless) != childless);
    orphans
}

fn route(
    table: &mut BTreeMap<i32, oneshot::Sender<ChildExit>>,
    pid: Pid,
    exit: ChildExit,
) -> usize {
    match table.remove(&pid.as_raw()) {
        Some(owner) => {
            // The owner may have stopped caring; that is fine.
            let _ = owner.send(exit);
            0
        }
        None => {
            tracing::debug!(pid = pid.as_raw(), %exit, "reaped orphan");
            1
        }
    }
}

/// Reaps on every `SIGCHLD`, for as long as the supervisor runs.
#[derive(Debug)]
pub struct Reaper {
    sigchld: tokio::signal::unix::Signal,
}

impl Reaper {
    /// Installs the `SIGCHLD` handler. Call before spawning anything.
    pub fn install() -> std::io::Result<Self> {
        let sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        Ok(Self { sigchld })
    }

    /// Sweeps now and after every `SIGCHLD` (several may coalesce into one;
    /// a sweep reaps all that ended).
    pub async fn run(mut self) {
        loop {
            let orphans = sweep();
            if orphans > 0 {
                tracing::debug!(orphans, "reaped orphans");
            }
            if self.sigchld.recv().await.is_none() {
                return;
            }
        }
    }
}

/// Waits until the supervisor has no children left (every one reaped), at
/// most `bound`. `true` if it got there.
pub async fn wait_childless(bound: std::time::Duration) -> bool {
    let mut rx = CHILDLESS.subscribe();
    sweep();
    tokio::time::timeout(bound, rx.wait_for(|childless| *childless))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// When the supervisor is not PID 1 (run under another init, or in a shared
/// pid namespace), it becomes a child subreaper so orphans of its services
/// are reparented to it and reaped here. Returns whether it is PID 1.
pub fn adopt_orphans() -> std::io::Result<bool> {
    if nix::unistd::getpid().as_raw() == 1 {
        return Ok(true);
    }
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
    Ok(false)
}

/// Makes the supervisor undumpable, so no process of the desktop (root
/// included: the container has no `CAP_SYS_PTRACE`) can attach to it,
/// read its memory or copy its descriptors (`ptrace`, `pidfd_getfd`,
/// `/proc/1/fd`). An egress hand-over relies on it: the program's socket
/// the supervisor sends to the broker is then held by the broker alone,
/// so nobody in the guest can change that socket's flags under the
/// broker (docs/network.md). Children are dumpable again once they exec.
pub fn keep_descriptors_private() -> std::io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(std::io::Error::from)
}

/// Keeps PID 1's resident memory small and flat (its target is 4 MiB): one
/// malloc arena instead of one per blocking thread, and buffers of 64 KiB or
/// more (screenshot strips, PNG output) in their own mappings, which go back
/// to the kernel when freed instead of staying in a heap the size of the
/// largest screenshot ever taken. Call before any thread starts.
pub fn tune_allocator() {
    // SAFETY: `mallopt` only sets allocator parameters; it is called before
    // any other thread exists, so nothing allocates concurrently.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 64 * 1024);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;
    use std::time::Duration;

    // One test, because sweeps are process-wide: parallel tests that spawn
    // children would see each other's.
    #[tokio::test]
    async fn owned_statuses_are_routed_and_orphans_reaped() {
        adopt_orphans().expect("subreaper");
        let reaper = Reaper::install().expect("sigchld");
        let task = tokio::spawn(reaper.run());

        let (mut ok, _c) = spawn(Command::new("/bin/sh").args(["-c", "exit 3"])).expect("spawn");
        let (mut killed, _k) = spawn(
            Command::new("/bin/sh")
                .args(["-c", "kill -9 $$"])
                .process_group(0),
        )
        .expect("spawn");
        // An orphan: the shell exits at once, its sleeping child is ours.
        let (mut parent, _p) =
            spawn(Command::new("/bin/sh").args(["-c", "sleep 0.2 & exit 0"])).expect("spawn");

        assert_eq!(ok.wait().await, ChildExit::Code(3));
        assert_eq!(killed.wait().await, ChildExit::Signal(9));
        assert_eq!(parent.wait().await, ChildExit::Code(0));
        assert!(ok.wait().await == ChildExit::Code(3), "wait repeats");
        assert!(
            wait_childless(Duration::from_secs(10)).await,
            "orphan reaped"
        );
        task.abort();
    }

    #[test]
    fn exits_read_well() {
        assert_eq!(ChildExit::Code(1).to_string(), "exit 1");
        assert_eq!(ChildExit::Signal(15).to_string(), "signal 15 (SIGTERM)");
        assert!(ChildExit::Code(0).success());
    }
}
