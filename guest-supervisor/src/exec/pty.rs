//! Interactive exec sessions on a pseudo-terminal.
//!
//! Owns one terminal: its master side (read, write, resize) and the keeper
//! task of the process on its slave side. Closing or dropping the session
//! kills every process of it and confirms them gone, as for an exec. It
//! never interprets what goes through the terminal.

use std::os::fd::{AsFd as _, OwnedFd};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::exec::PtyEvent;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::libc;
use nix::pty::PtyMaster;
use nix::sys::stat::Mode;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::spawn::{self, Launch};
use super::{exit_fields, millis, ExecError, ExecRunner, ExecSettings, Hold, Keeper, KillReport};
use super::{Running, OPEN_TERMINALS};
use crate::init::ChildExit;

nix::ioctl_write_ptr_bad!(set_window_size, libc::TIOCSWINSZ, libc::winsize);

/// How a terminal session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtyEnded {
    /// How its process ended.
    pub exit: ChildExit,
    /// From the spawn until every process was confirmed gone.
    pub duration: Duration,
    /// What the kill did.
    pub kill: KillReport,
}

impl PtyEnded {
    /// The last event of the session.
    pub fn to_event(&self) -> PtyEvent {
        let (exit_code, signal) = exit_fields(self.exit);
        PtyEvent::PtyExit {
            exit_code,
            signal,
            duration_ms: millis(self.duration),
        }
    }
}

/// An open terminal session.
///
/// `read` and `write` take `&self`, so one task can pump both directions
/// at once (a child that does not read its input while its output is not
/// read would otherwise deadlock the two). Once [`PtySession::read`]
/// returns 0 the session's process is gone; [`PtySession::close`] then
/// gives its exit. Dropping the session kills it in the background.
#[derive(Debug)]
pub struct PtySession {
    id: u64,
    pid: u32,
    master: AsyncFd<PtyMaster>,
    close: Option<oneshot::Sender<()>>,
    keeper: JoinHandle<Result<PtyEnded, ExecError>>,
}

fn set_size(fd: &impl std::os::fd::AsRawFd, rows: u16, cols: u16) -> Result<(), Errno> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: `fd` is an open terminal descriptor we hold, and `size` is a
    // valid `winsize` that outlives the call; TIOCSWINSZ only reads it.
    unsafe { set_window_size(fd.as_raw_fd(), &size) }.map(drop)
}

/// Opens the terminal and starts `launch` on it.
pub(super) fn open(
    settings: Arc<ExecSettings>,
    launch: Launch,
    mut hold: Hold,
    rows: u16,
    cols: u16,
) -> Result<PtySession, ExecError> {
    // Close-on-exec from the start: another thread's spawn must never
    // inherit this terminal (it would keep it open after the session).
    let master = nix::pty::posix_openpt(
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
    )?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let name = nix::pty::ptsname_r(&master)?;
    let slave: OwnedFd = nix::fcntl::open(
        name.as_str(),
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // The desktop user's terminal: programs that reopen it by name (`tty`,
    // `ssh`, `script`) may.
    if let Err(e) = nix::unistd::fchown(
        slave.as_fd(),
        Some(nix::unistd::Uid::from_raw(launch.uid)),
        None,
    ) {
        tracing::debug!(terminal = %name, error = %e, "cannot give the terminal to the desktop user");
    }
    set_size(&master, rows, cols)?;

    let running = Running::new(&OPEN_TERMINALS);
    let mut cmd = spawn::command(&launch).map_err(|source| ExecError::Setup {
        stage: super::Stage::Exec,
        source,
    })?;
    let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
    let io_err = |e: std::io::Error| ExecError::Setup {
        stage: super::Stage::Exec,
        source: e,
    };
    cmd.stdin(stdio(&slave).map_err(io_err)?)
        .stdout(stdio(&slave).map_err(io_err)?)
        .stderr(Stdio::from(slave));
    let started = Instant::now();
    let spawned = ExecRunner::spawn(&launch, &mut cmd);
    // The command holds our copies of the slave: only the child may keep
    // the terminal open, so its end is seen as the end of the output.
    drop(cmd);
    let (child, _io) = spawned?;
    hold.armed = true;
    let pid = child.pid();
    let id = hold.id;
    tracing::debug!(session = id, pid, "terminal session started");

    // SAFETY: `PtyMaster` owns its descriptor: it stays open and the same
    // for as long as the `AsyncFd` holds it, and `as_raw_fd` always returns
    // it.
    let master = unsafe { AsyncFd::register(master) }.map_err(|e| ExecError::Setup {
        stage: super::Stage::Exec,
        source: std::io::Error::from(e),
    });
    let keeper = Keeper {
        settings,
        child,
        hold,
        started,
        _running: running,
    };
    let (close_tx, close_rx) = oneshot::channel();
    let keeper = tokio::spawn(keeper.run_session(close_rx));
    // Only now can a failure be handled by the keeper: it kills what was
    // started.
    let master = master?;
    Ok(PtySession {
        id,
        pid,
        master,
        close: Some(close_tx),
        keeper,
    })
}

impl Keeper {
    async fn run_session(
        mut self,
        mut close: oneshot::Receiver<()>,
    ) -> Result<PtyEnded, ExecError> {
        let id = self.hold.id;
        tokio::select! {
            _ = self.child.wait() => {}
            // A close or a dropped session.
            _ = &mut close => {}
        }
        let (exit, kill, duration) = self.finish().await?;
        tracing::info!(session = id, exit = %exit, killed = kill.killed, duration_ms = millis(duration), "terminal session ended");
        Ok(PtyEnded {
            exit,
            duration,
            kill,
        })
    }
}

impl PtySession {
    /// The session's id (its `DORMOUSE_EXEC`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Pid of the session's process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Reads terminal output; 0 once every process on the terminal is gone
    /// (the kernel says `EIO` when the last slave descriptor closed).
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut ready = self.master.readable().await?;
            match ready
                .try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(std::io::Error::from))
            {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes terminal input; returns how much the terminal took.
    pub async fn write(&self, data: &[u8]) -> std::io::Result<usize> {
        loop {
            let mut ready = self.master.writable().await?;
            match ready
                .try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from))
            {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data`, waiting while the terminal's input is full.
    /// Input into a terminal is use of the desktop ([`super::note_terminal_input`]).
    pub async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        super::note_terminal_input();
        while !data.is_empty() {
            let n = self.write(data).await?;
            data = data.get(n..).unwrap_or_default();
        }
        Ok(())
    }

    /// Changes the terminal's size; the foreground process gets `SIGWINCH`.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), ExecError> {
        dormouse_protocol::exec::PtyInput::PtyResize { rows, cols }.validate()?;
        super::note_terminal_input();
        set_size(self.master.get_ref(), rows, cols)?;
        Ok(())
    }

    /// Ends the session: kills every process of it (if any still runs),
    /// confirms them gone, and returns how it ended.
    pub async fn close(mut self) -> Result<PtyEnded, ExecError> {
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
        (&mut self.keeper).await.unwrap_or(Err(ExecError::Lost))
    }
}
