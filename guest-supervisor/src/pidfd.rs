//! Process file descriptors: the one place the supervisor makes the raw
//! `pidfd_open(2)` and `pidfd_send_signal(2)` system calls (libc has no
//! wrappers for them) and watches a pidfd for its process's exit.
//!
//! A [`Pidfd`] names one process for as long as it is held: a signal sent
//! through it reaches that process or nothing, never a process that took
//! over its number after it ended. Callers keep their own fallback by pid
//! for kernels or seccomp profiles without pidfds; this module never falls
//! back itself and never decides whom to signal. Like youki's `Syscall`
//! seam, the `unsafe` of these calls lives here and nowhere else.

use std::os::fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use tokio::io::unix::AsyncFd;

/// A descriptor for one process (`pidfd_open(2)`).
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// Opens a pidfd for `pid`: `ESRCH` when no such process exists, another
    /// error when the kernel (or a seccomp profile) gives no pidfds.
    pub fn open(pid: u32) -> Result<Self, Errno> {
        let pid = nix::libc::pid_t::try_from(pid).map_err(|_| Errno::ESRCH)?;
        // SAFETY: pidfd_open(2) takes a pid and a flags word and returns a
        // new descriptor or -1; no memory of ours is passed.
        let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(Errno::last());
        }
        let fd = i32::try_from(fd).map_err(|_| Errno::EBADF)?;
        // SAFETY: the kernel just returned this descriptor; nothing else
        // owns it.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends `signal` to exactly this process (`pidfd_send_signal(2)`);
    /// `ESRCH` once it has ended.
    pub fn signal(&self, signal: Signal) -> Result<(), Errno> {
        // SAFETY: the descriptor is open (borrowed for the call), the signal
        // is a valid number, a null siginfo means "as kill(2) would", and
        // the flags are 0.
        let rc = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal as nix::libc::c_int,
                std::ptr::null::<nix::libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            return Err(Errno::last());
        }
        Ok(())
    }

    /// Whether the process has ended: its pidfd polls readable. `Err` when
    /// the poll itself failed (the caller asks procfs instead).
    pub fn has_exited(&self) -> Result<bool, Errno> {
        let mut poll = [nix::poll::PollFd::new(
            self.0.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        nix::poll::poll(&mut poll, nix::poll::PollTimeout::ZERO).map(|n| n > 0)
    }

    /// Waits until the process has ended (its pidfd becomes readable).
    /// `Err` when the pidfd cannot be watched; the caller then waits some
    /// other way.
    pub async fn exited(&self) -> std::io::Result<()> {
        let fd = self.0.try_clone()?;
        // SAFETY: the AsyncFd owns the cloned OwnedFd, so the descriptor
        // stays open and the same for the AsyncFd's life.
        let watched =
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }?;
        let _ = watched.readable().await?;
        Ok(())
    }
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Whether this kernel (and seccomp profile) gives pidfds, so kills cannot
/// hit a reused pid.
pub fn available() -> bool {
    Pidfd::open(std::process::id()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pidfd_signals_its_process_and_sees_it_end() {
        if !available() {
            eprintln!("skipping: this kernel gives no pidfds");
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let fd = Pidfd::open(child.id()).expect("pidfd");
        assert_eq!(fd.has_exited(), Ok(false));
        fd.signal(Signal::SIGTERM).expect("signal");
        tokio::time::timeout(std::time::Duration::from_secs(10), fd.exited())
            .await
            .expect("ended in time")
            .expect("watchable");
        assert_eq!(fd.has_exited(), Ok(true));
        let _ = child.wait();
        // Reaped: the pidfd still names the ended process, never another.
        assert_eq!(fd.signal(Signal::SIGTERM), Err(Errno::ESRCH));
    }
}
