//! Exec: running commands in the desktop as the desktop user, with a
//! confirmed end.
//!
//! Owns every process an exec or a terminal session starts, from the spawn
//! until each one of them is confirmed gone. It never touches a process it
//! did not start (desktop services, browsers, other execs), never runs
//! anything as root, and never answers while a process of the exec may
//! still run.
//!
//! # One exec
//!
//! [`ExecRunner::run`] starts `argv` (or `/bin/sh -c command`) through
//! [`crate::init::spawn`], so its exit status is routed to it and not reaped
//! blindly. In the child, before `exec`: `setsid` (its own session and
//! process group), `setgroups([tag])`, `setgid`, `setuid` to the desktop
//! user (uid/gid 1000), then `chdir` — after dropping root, so the working
//! directory is resolved with the desktop user's rights. The environment is
//! the desktop's (`HOME`, `USER`, `PATH`, `DISPLAY`, `LANG`, …), then the
//! request's variables, then `DORMOUSE_EXEC=<id>`. stdin is the request's
//! bytes then end of file (or `/dev/null`); stdout and stderr are read up to
//! the cap, and read and discarded after it, so the child never blocks on a
//! full pipe.
//!
//! An exec is one unit: it ends when its main process exits, when its
//! timeout passes, or when it is cancelled, and in each case whatever of it
//! still runs is killed, background jobs included. Something that must
//! outlive the call belongs to the desktop, not to an exec.
//!
//! # Finding every process again
//!
//! Each running exec holds a **tag**: a supplementary group id of its own
//! from a reserved range ([`DEFAULT_TAG_GIDS`]), given to its first process
//! and inherited by every descendant. The tag is what the kill looks for
//! (see [`kill`]): it survives `setsid`, double forks and reparenting to
//! PID 1 (the supervisor, or its subreaper when it is not PID 1), it is
//! readable in `/proc/<pid>/status` by anyone, and an unprivileged process
//! cannot drop it (`setgroups` needs `CAP_SETGID`; the container runs with
//! `no-new-privileges`, so set-uid programs cannot either). Descendants are
//! also found by their parent pid while the parent lives.
//!
//! `DORMOUSE_EXEC=<id>` is set for the programs' information only, and not
//! used to find them: a process can rewrite or drop its environment, and
//! reading another user's `/proc/<pid>/environ` needs `CAP_SYS_PTRACE`,
//! which the supervisor does not have.
//!
//! Limits: processes that other, already running programs start on the
//! exec's behalf are not its descendants and not tagged; they belong to
//! those programs and outlive the exec: a window manager's key binding or
//! menu entry (openbox runs it as its own child), D-Bus activation, a
//! running browser opening a window. `tests/tests/exec_boundary.rs` pins
//! that boundary on a real desktop. A process that regains privileges
//! could drop the tag; inside the container nothing can. The tag range must
//! not be used by any group of the image.
//!
//! # Kill and confirmation
//!
//! On timeout, cancellation or exit: `SIGKILL` to the exec's process group
//! while its leader is not yet reaped (atomic against forks inside the
//! group), then rounds of scan `/proc` → re-verify each member after
//! opening a pidfd for it → `SIGKILL` through the pidfd (a pid reused by a
//! stranger is never signalled), until two scans in a row find no member
//! (zombies count until the reaper collected them), at most
//! [`ExecSettings::kill_bound`]. Past the bound the answer is
//! [`ExecError::Unkillable`] and the tag is retired, never handed out again.
//!
//! Cancellation is a future given to [`ExecRunner::run`] (e.g. "the client
//! hung up"): when it completes, the exec is killed, confirmed gone, and
//! the result (`signal: SIGKILL`) returned. When `run`'s own future is
//! dropped instead, the exec's keeper task, which owns the processes, sees
//! it and kills and confirms in the background, logging the outcome.
//!
//! # Terminal sessions
//!
//! [`ExecRunner::open_pty`] does the same on a pseudo-terminal: the slave is
//! the child's stdin/stdout/stderr and, after `setsid`, its controlling
//! terminal (`TIOCSCTTY`); resizes are `TIOCSWINSZ` on the master. Closing
//! the session (or dropping it) kills and confirms as above.
//!
//! # Busy
//!
//! [`running_execs`] counts execs from their spawn until their processes
//! are confirmed gone; the idle timer counts the desktop busy while it is
//! above 0. [`open_terminals`] counts terminal sessions separately: an open
//! but untouched terminal is not work, but typing into one is use, as X
//! input is ([`terminal_input_idle_ms`]).

mod capture;
pub mod kill;
mod pty;
mod spawn;
mod tag;

use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::exec::{ExecRequest, ExecRequestError, ExecResult, EXEC_MARKER_ENV};
use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt as _;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::Config;
use crate::init::{self, ChildExit, OwnedChild};

pub use kill::{KillError, KillReport};
pub use pty::{PtyEnded, PtySession};
pub use spawn::Stage;
pub use tag::DEFAULT_TAG_GIDS;

use capture::{capture, Captured};
use spawn::Launch;
use tag::{Tag, TagPool};

/// Execs whose processes are not yet confirmed gone, in this process.
static RUNNING_EXECS: AtomicUsize = AtomicUsize::new(0);
/// Open terminal sessions, in this process.
static OPEN_TERMINALS: AtomicUsize = AtomicUsize::new(0);

/// How many execs run now (from the spawn until every process of them is
/// confirmed gone). Above 0, the desktop is busy for the idle timer.
pub fn running_execs() -> usize {
    RUNNING_EXECS.load(Ordering::Relaxed)
}

/// How many terminal sessions are open now.
pub fn open_terminals() -> usize {
    OPEN_TERMINALS.load(Ordering::Relaxed)
}

/// When a terminal session last got input (keystrokes or a resize), in
/// milliseconds since [`INPUT_EPOCH`]; `u64::MAX` while none ever did.
static TERMINAL_INPUT_AT: AtomicU64 = AtomicU64::new(u64::MAX);
static INPUT_EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// Records input into a terminal session now.
pub fn note_terminal_input() {
    let now = crate::millis(INPUT_EPOCH.elapsed());
    TERMINAL_INPUT_AT.store(now, Ordering::Relaxed);
}

/// Milliseconds since a terminal session last got input, if one ever did
/// in this process: the idle timer counts it like X input.
pub fn terminal_input_idle_ms() -> Option<u64> {
    let at = TERMINAL_INPUT_AT.load(Ordering::Relaxed);
    (at != u64::MAX).then(|| crate::millis(INPUT_EPOCH.elapsed()).saturating_sub(at))
}

/// Counts one exec or session for as long as it lives.
#[derive(Debug)]
struct Running(&'static AtomicUsize);

impl Running {
    fn new(counter: &'static AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What exec needs to know about the desktop.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecSettings {
    /// procfs root the kill scans (`/proc`).
    pub proc_root: PathBuf,
    /// Working directory when a request names none; base of relative ones.
    pub workspace: PathBuf,
    /// The desktop user.
    pub uid: u32,
    /// The desktop user's group.
    pub gid: u32,
    /// The desktop environment every exec starts from.
    pub env: Vec<(String, String)>,
    /// What a terminal session runs when it names no program.
    pub login_shell: Vec<String>,
    /// `TERM` of terminal sessions (a request may override it).
    pub term: String,
    /// Tag gids, one per running exec or session; their number bounds how
    /// many run at once.
    pub tag_gids: std::ops::Range<u32>,
    /// Most execs and sessions at once (below the number of tags).
    pub max_running: usize,
    /// Bound for killing an exec's processes and confirming them gone.
    pub kill_bound: Duration,
    /// Bound for reading what is left in the output pipes once every
    /// process is gone (a pipe end passed to an unrelated process).
    pub drain_bound: Duration,
}

impl Default for ExecSettings {
    fn default() -> Self {
        Self::from_config(&Config::default())
    }
}

impl ExecSettings {
    /// The settings of the desktop `config` describes.
    pub fn from_config(config: &Config) -> Self {
        Self {
            proc_root: config.proc_root.clone(),
            workspace: config.workspace.clone(),
            uid: config.uid,
            gid: config.gid,
            env: crate::services::desktop_env(config),
            login_shell: vec!["/bin/bash".into(), "-l".into()],
            term: "xterm-256color".into(),
            tag_gids: DEFAULT_TAG_GIDS,
            max_running: 32,
            kill_bound: Duration::from_secs(5),
            drain_bound: Duration::from_secs(1),
        }
    }
}

/// Why an exec or a session could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The request is malformed or over a bound.
    #[error("invalid request: {0}")]
    Invalid(#[from] ExecRequestError),
    /// Too many execs and sessions run already.
    #[error("{running} execs and terminal sessions run already (the limit)")]
    Busy {
        /// How many run.
        running: usize,
    },
    /// The program could not be executed (missing, not executable).
    #[error("cannot execute {program:?}: {source}")]
    Program {
        /// `argv[0]`.
        program: String,
        /// Why, from `execve`.
        source: std::io::Error,
    },
    /// The working directory is not one the desktop user can enter.
    #[error("cannot enter the working directory {}: {source}", cwd.display())]
    Cwd {
        /// The directory.
        cwd: PathBuf,
        /// Why, from `chdir` as the desktop user.
        source: std::io::Error,
    },
    /// The child's setup failed before `exec` (not the request's fault).
    #[error("exec setup failed at {}: {source}", stage.as_str())]
    Setup {
        /// Which step.
        stage: Stage,
        /// Why.
        source: std::io::Error,
    },
    /// The terminal could not be set up.
    #[error("pseudo-terminal: {0}")]
    Pty(#[from] nix::Error),
    /// Some processes of the exec could not be confirmed gone.
    #[error("exec not confirmed gone: {0}")]
    Kill(#[from] KillError),
    /// The task that kept the exec ended without an answer (a panic).
    #[error("the exec's keeper ended without an answer")]
    Lost,
}

impl ExecError {
    /// Stable code for the guest protocol's error response.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "bad_request",
            Self::Busy { .. } => "busy",
            Self::Program { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                "not_found"
            }
            Self::Program { .. } => "not_executable",
            Self::Cwd { .. } => "bad_cwd",
            Self::Setup { .. } | Self::Pty(_) | Self::Lost => "exec_failed",
            Self::Kill(_) => "unkillable",
        }
    }
}

/// How an exec came to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its main process exited (what was left of it was killed).
    Exited,
    /// The timeout passed.
    TimedOut,
    /// The caller cancelled it.
    Cancelled,
}

/// A finished exec: the answer, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecFinished {
    /// The guest's answer.
    pub result: ExecResult,
    /// What ended it.
    pub ended: Ended,
    /// What the kill did (processes killed: 0 for a command that left
    /// nothing behind).
    pub kill: KillReport,
}

/// Name of a signal, e.g. `SIGTERM`, or `SIG<n>` for one nix does not know.
pub fn signal_name(n: i32) -> String {
    Signal::try_from(n).map_or_else(|_| format!("SIG{n}"), |s| s.as_str().to_owned())
}

/// `exit_code` and `signal` of a result.
fn exit_fields(exit: ChildExit) -> (Option<i32>, Option<String>) {
    match exit {
        ChildExit::Code(code) => (Some(code), None),
        ChildExit::Signal(n) => (None, Some(signal_name(n))),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs execs and terminal sessions. Cheap to clone; clones share the tags.
#[derive(Debug, Clone)]
pub struct ExecRunner {
    settings: Arc<ExecSettings>,
    tags: Arc<TagPool>,
    next_id: Arc<AtomicU64>,
}

/// What a prepared exec holds until it is confirmed gone.
#[derive(Debug)]
struct Hold {
    id: u64,
    tag: Tag,
    /// Set once processes exist; cleared once they are confirmed gone. A
    /// hold dropped while armed (its keeper panicked, or the runtime went
    /// away) retires its tag: processes of it may still run.
    armed: bool,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.armed {
            self.tag.retire();
        }
    }
}

impl ExecRunner {
    /// A runner for `settings`.
    pub fn new(settings: ExecSettings) -> Self {
        Self {
            tags: TagPool::new(settings.tag_gids.clone()),
            settings: Arc::new(settings),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &ExecSettings {
        &self.settings
    }

    /// Reserves a tag and an id, and decides the child's launch.
    fn prepare(
        &self,
        argv: Vec<String>,
        cwd: Option<&str>,
        env: &BTreeMap<String, String>,
        terminal: bool,
    ) -> Result<(Launch, Hold), ExecError> {
        let running = self.tags.in_use();
        if running >= self.settings.max_running {
            return Err(ExecError::Busy { running });
        }
        let tag = self.tags.take().ok_or(ExecError::Busy { running })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut full_env = self.settings.env.clone();
        if terminal {
            full_env.push(("TERM".into(), self.settings.term.clone()));
        }
        full_env.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
        full_env.push((EXEC_MARKER_ENV.into(), id.to_string()));
        let launch = Launch {
            argv,
            env: full_env,
            cwd: spawn::resolve_cwd(&self.settings.workspace, cwd),
            uid: self.settings.uid,
            gid: self.settings.gid,
            tag_gid: tag.gid(),
            controlling_tty: terminal,
        };
        Ok((
            launch,
            Hold {
                id,
                tag,
                armed: false,
            },
        ))
    }

    /// Spawns a prepared launch whose stdio is set.
    fn spawn(
        launch: &Launch,
        cmd: &mut std::process::Command,
    ) -> Result<(OwnedChild, std::process::Child), ExecError> {
        init::spawn(cmd).map_err(|e| match spawn::classify(e) {
            (Stage::Cwd, source) => ExecError::Cwd {
                cwd: launch.cwd.clone(),
                source,
            },
            (Stage::Exec, source) => ExecError::Program {
                program: launch.argv.first().cloned().unwrap_or_default(),
                source,
            },
            (stage, source) => ExecError::Setup { stage, source },
        })
    }

    /// Runs one exec to its confirmed end.
    ///
    /// `cancel` completing (the caller went away) kills the exec; the result
    /// then comes once every process of it is confirmed gone. Dropping this
    /// future kills it too, in the background.
    pub async fn run<C>(&self, request: ExecRequest, cancel: C) -> Result<ExecFinished, ExecError>
    where
        C: Future<Output = ()>,
    {
        let argv = request.validate()?;
        let (launch, mut hold) = self.prepare(argv, request.cwd.as_deref(), &request.env, false)?;
        let running = Running::new(&RUNNING_EXECS);
        let mut cmd = spawn::command(&launch).map_err(|source| ExecError::Setup {
            stage: Stage::Exec,
            source,
        })?;
        cmd.stdin(if request.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let started = Instant::now();
        let (child, mut io) = Self::spawn(&launch, &mut cmd)?;
        hold.armed = true;
        drop(cmd);
        tracing::debug!(exec = hold.id, pid = child.pid(), program = %launch.argv.first().map_or("", String::as_str), "exec started");

        let keeper = Keeper {
            settings: self.settings.clone(),
            child,
            hold,
            started,
            _running: running,
        };
        let stdin = io.stdin.take().map(OwnedFd::from).zip(request.stdin);
        let stdout = io.stdout.take().map(OwnedFd::from);
        let stderr = io.stderr.take().map(OwnedFd::from);
        let cap = usize::try_from(request.max_output_bytes).unwrap_or(usize::MAX);
        let timeout = Duration::from_millis(request.timeout_ms);
        let (cancel_tx, cancel_rx) = oneshot::channel();
        let mut task =
            tokio::spawn(keeper.run_exec(stdin, stdout, stderr, cap, timeout, cancel_rx));

        tokio::pin!(cancel);
        let mut cancel_tx = Some(cancel_tx);
        loop {
            tokio::select! {
                done = &mut task => return done.unwrap_or(Err(ExecError::Lost)),
                () = &mut cancel, if cancel_tx.is_some() => {
                    if let Some(tx) = cancel_tx.take() {
                        // The keeper may have finished meanwhile.
                        let _ = tx.send(());
                    }
                }
            }
        }
    }

    /// Opens a terminal session; see [`PtySession`].
    pub async fn open_pty(
        &self,
        open: &dormouse_protocol::exec::PtyOpen,
    ) -> Result<PtySession, ExecError> {
        let argv = open
            .validate()?
            .unwrap_or_else(|| self.settings.login_shell.clone());
        let (launch, hold) = self.prepare(argv, open.cwd.as_deref(), &open.env, true)?;
        pty::open(self.settings.clone(), launch, hold, open.rows, open.cols)
    }
}

/// The task that owns an exec's processes until they are confirmed gone.
#[derive(Debug)]
struct Keeper {
    settings: Arc<ExecSettings>,
    child: OwnedChild,
    hold: Hold,
    started: Instant,
    _running: Running,
}

impl Keeper {
    /// Kills whatever is left of the exec, confirms it gone, and collects
    /// the main process's status. The tag goes back to the pool only when
    /// everything is confirmed gone.
    async fn finish(self) -> Result<(ChildExit, KillReport, Duration), ExecError> {
        let Keeper {
            settings,
            mut child,
            mut hold,
            started,
            _running,
        } = self;
        // The whole group at once while its leader (so the group id) is
        // surely ours (`signal_group` does nothing once it is reaped); the
        // scans catch what left the group.
        let group_kill = || child.signal_group(Signal::SIGKILL);
        let killed = kill::kill_all(
            &settings.proc_root,
            hold.tag.gid(),
            settings.kill_bound,
            group_kill,
        )
        .await;
        let report = match killed {
            Ok(report) => report,
            Err(e) => {
                tracing::error!(exec = hold.id, tag = hold.tag.gid(), error = %e, "exec processes not confirmed gone; tag retired");
                // Still armed: dropping the hold retires the tag.
                return Err(e.into());
            }
        };
        // Confirmed gone means reaped, so the status has been routed; the
        // bound only guards against a reaper that does not run.
        let exit = tokio::time::timeout(settings.kill_bound, child.wait())
            .await
            .unwrap_or(ChildExit::Signal(Signal::SIGKILL as i32));
        hold.armed = false;
        drop(hold);
        Ok((exit, report, started.elapsed()))
    }

    async fn run_exec(
        mut self,
        stdin: Option<(OwnedFd, Vec<u8>)>,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
        cap: usize,
        timeout: Duration,
        mut cancel: oneshot::Receiver<()>,
    ) -> Result<ExecFinished, ExecError> {
        let id = self.hold.id;
        let writer = stdin.map(|(fd, bytes)| {
            tokio::spawn(async move {
                let mut pipe = pipe::Sender::from_owned_fd(fd)?;
                // A child that exits or closes stdin early makes this fail
                // with EPIPE; that is its right.
                pipe.write_all(&bytes).await?;
                Ok::<(), std::io::Error>(())
                // Dropping the pipe closes it: the child sees end of file.
            })
        });
        let out = Stream::start(stdout, cap);
        let err = Stream::start(stderr, cap);

        let deadline = self.started + timeout;
        let ended = tokio::select! {
            _ = self.child.wait() => Ended::Exited,
            () = tokio::time::sleep_until(deadline) => Ended::TimedOut,
            // A send or a dropped sender (the caller's future was dropped).
            _ = &mut cancel => Ended::Cancelled,
        };
        let drain = self.settings.drain_bound;
        let finished = self.finish().await;
        if let Some(writer) = writer {
            writer.abort();
        }
        let (out, err) = tokio::join!(out.collect(drain), err.collect(drain));
        let (exit, kill, duration) = finished?;
        let (exit_code, signal) = exit_fields(exit);
        let result = ExecResult {
            exit_code,
            signal,
            timed_out: ended == Ended::TimedOut,
            stdout: out.bytes,
            stderr: err.bytes,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            duration_ms: millis(duration),
        };
        tracing::info!(
            exec = id,
            ?ended,
            exit = %exit,
            killed = kill.killed,
            duration_ms = result.duration_ms,
            "exec ended"
        );
        Ok(ExecFinished {
            result,
            ended,
            kill,
        })
    }
}

/// One output stream being captured.
#[derive(Debug)]
struct Stream {
    task: Option<(JoinHandle<std::io::Result<Captured>>, oneshot::Sender<()>)>,
}

impl Stream {
    fn start(fd: Option<OwnedFd>, cap: usize) -> Self {
        Self {
            task: fd.map(|fd| {
                let (stop_tx, stop_rx) = oneshot::channel();
                (tokio::spawn(capture(fd, cap, stop_rx)), stop_tx)
            }),
        }
    }

    /// What was captured, once the pipe ends or at most `bound` from now.
    async fn collect(self, bound: Duration) -> Captured {
        let Some((mut task, stop)) = self.task else {
            return Captured::default();
        };
        let joined = match tokio::time::timeout(bound, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                // Someone outside the exec holds the write end; keep what
                // came.
                let _ = stop.send(());
                task.await
            }
        };
        match joined {
            Ok(Ok(captured)) => captured,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading exec output failed");
                Captured::default()
            }
            Err(e) => {
                tracing::warn!(error = %e, "exec output task failed");
                Captured::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(200), "SIG200");
        assert_eq!(exit_fields(ChildExit::Code(3)), (Some(3), None));
        assert_eq!(
            exit_fields(ChildExit::Signal(1)),
            (None, Some("SIGHUP".into()))
        );
    }

    #[test]
    fn settings_follow_the_config() {
        let s = ExecSettings::default();
        assert_eq!(s.uid, 1000);
        assert_eq!(s.workspace, PathBuf::from("/home/desk/workspace"));
        assert!(s.env.iter().any(|(k, v)| k == "DISPLAY" && v == ":1"));
        assert!(s.max_running < s.tag_gids.len());
    }
}
