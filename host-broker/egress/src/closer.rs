//! Closing what a guest handed over, never on a runtime worker: a small
//! bounded pool of threads of its own that set `SO_LINGER {1, 0}`, shut
//! the socket down both ways, then close it.
//!
//! A relay that carried both streams to their end closes gracefully
//! instead ([`graceful_close`]: no linger, the write side shut down), so
//! that what is still queued reaches the program.
//!
//! A handed socket's file description is shared with the guest, which may
//! set a long linger on it at any moment; the last close of a lingering
//! socket with unsent bytes waits out the linger. So a close here may
//! stall, and the pool is shaped so that one desktop's stalls cost only
//! that desktop: at most [`PER_DESKTOP`] of its closes run at once (the
//! others wait their turn, desktops taking turns), at most
//! [`MAX_CLOSERS`] threads run in all, a close that takes longer than
//! [`STALLED_AFTER`] is counted ([`crate::Hooks::stalled_close`]), and a
//! desktop with [`MAX_PENDING`] closes not done gets no new connection
//! ([`Closer::refusal`]). Threads start when there is work and end after
//! [`IDLE_EXIT`] without any.
//!
//! It never runs on the runtime and never waits for a close it queued.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dormouse_protocol::splice::CloseOff;
use uuid::Uuid;

/// A close that takes longer than this is counted as stalled.
pub const STALLED_AFTER: Duration = Duration::from_millis(100);
/// Most closer threads at once, for every desktop together.
pub const MAX_CLOSERS: usize = 8;
/// Most closes of one desktop running at once.
pub const PER_DESKTOP: usize = 2;
/// Closes of one desktop not done yet (waiting or running) past which the
/// desktop's new connections are refused.
pub const MAX_PENDING: usize = 64;
/// How long a closer thread waits for work before it ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(10);

/// How a descriptor is closed abortively (the abortive close, or a
/// test's own).
pub type CloseFn = Arc<dyn Fn(OwnedFd) + Send + Sync>;

/// What the pool reports: one stalled close of a desktop.
pub type StallFn = Arc<dyn Fn(Uuid) + Send + Sync>;

/// The broker-wide pool of closer threads.
#[derive(Clone)]
pub struct ClosePool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ClosePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.lock();
        f.debug_struct("ClosePool")
            .field("threads", &st.threads)
            .field("desktops", &st.desks.len())
            .finish_non_exhaustive()
    }
}

struct Inner {
    state: Mutex<State>,
    wake: Condvar,
    close: CloseFn,
    stalled: StallFn,
    idle_exit: Duration,
}

#[derive(Default)]
struct State {
    desks: HashMap<Uuid, DeskCloses>,
    /// Desktops with a waiting close and a free turn, in turn order.
    ready: VecDeque<Uuid>,
    threads: usize,
    idle: usize,
    /// Idle threads woken and not yet up.
    wakeups: usize,
    next_job: u64,
}

#[derive(Default)]
struct DeskCloses {
    /// Descriptors to close, each with whether gracefully.
    waiting: VecDeque<(OwnedFd, bool)>,
    /// Closes running now: their job, since when, and whether the stall
    /// was counted already.
    running: Vec<(u64, Instant, bool)>,
    in_ready: bool,
}

impl DeskCloses {
    fn pending(&self) -> usize {
        self.waiting.len() + self.running.len()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sets `SO_LINGER {1, 0}` so that the close does not wait for unsent
/// bytes, shuts the socket down (which also wakes whoever else in the
/// guest waits on it), and closes it. Neither call matters for what is
/// not a socket: the close is all there is.
pub fn abortive_close(fd: OwnedFd) {
    let _ = rustix::net::sockopt::set_socket_linger(&fd, Some(Duration::ZERO));
    let _ = rustix::net::shutdown(&fd, rustix::net::Shutdown::Both);
    drop(fd);
}

/// The close of a relay that carried both streams to their end: no linger,
/// so that the close returns at once and the kernel still delivers what
/// is queued, then the end of the stream. (A guest that sets a linger
/// again in between stalls this thread only, counted.)
pub fn graceful_close(fd: OwnedFd) {
    let _ = rustix::net::sockopt::set_socket_linger(&fd, None);
    let _ = rustix::net::shutdown(&fd, rustix::net::Shutdown::Write);
    drop(fd);
}

impl ClosePool {
    /// A pool closing with [`abortive_close`], reporting stalls to `stalled`.
    pub fn new(stalled: StallFn) -> Self {
        Self::with_close(Arc::new(abortive_close), stalled, IDLE_EXIT)
    }

    /// A pool closing with `close`, its threads ending after `idle_exit`.
    pub fn with_close(close: CloseFn, stalled: StallFn, idle_exit: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                close,
                stalled,
                idle_exit,
            }),
        }
    }

    /// The closer of computer `id`'s descriptors.
    pub fn closer(&self, id: Uuid) -> Closer {
        Closer {
            pool: self.clone(),
            computer: id,
        }
    }

    /// Closer threads alive now.
    pub fn threads(&self) -> usize {
        self.inner.lock().threads
    }

    fn submit(&self, computer: Uuid, fd: OwnedFd, graceful: bool) {
        let mut st = self.inner.lock();
        let desk = st.desks.entry(computer).or_default();
        desk.waiting.push_back((fd, graceful));
        let turn = !desk.in_ready && desk.running.len() < PER_DESKTOP;
        if turn {
            desk.in_ready = true;
            st.ready.push_back(computer);
            kick(&self.inner, &mut st);
        }
    }

    /// Closes of `computer` not done yet; counts the stalls of every
    /// running close seen past [`STALLED_AFTER`] on the way.
    fn pending(&self, computer: Uuid) -> usize {
        let (pending, stalls) = {
            let mut st = self.inner.lock();
            let mut stalls = Vec::new();
            for (id, desk) in &mut st.desks {
                for (_, since, counted) in &mut desk.running {
                    if !*counted && since.elapsed() >= STALLED_AFTER {
                        *counted = true;
                        stalls.push(*id);
                    }
                }
            }
            let pending = st.desks.get(&computer).map_or(0, DeskCloses::pending);
            (pending, stalls)
        };
        for id in stalls {
            (self.inner.stalled)(id);
        }
        pending
    }
}

/// Wakes an idle thread, or starts one within [`MAX_CLOSERS`], for a
/// desktop just put in turn.
fn kick(inner: &Arc<Inner>, st: &mut State) {
    if st.idle > st.wakeups {
        st.wakeups += 1;
        inner.wake.notify_one();
    } else if st.threads < MAX_CLOSERS {
        let worker = Arc::clone(inner);
        let spawned = std::thread::Builder::new()
            .name("egress-close".into())
            .stack_size(128 * 1024)
            .spawn(move || work(&worker));
        match spawned {
            Ok(_) => st.threads += 1,
            // The close waits for the next thread that starts.
            Err(e) => tracing::warn!(error = %e, "no closer thread for a handed socket"),
        }
    }
}

/// One closer thread: takes turns among the desktops until there is no
/// work for [`IDLE_EXIT`].
fn work(inner: &Arc<Inner>) {
    let mut st = inner.lock();
    loop {
        if let Some((computer, job, (fd, graceful), again)) = take(&mut st) {
            if again {
                kick(inner, &mut st);
            }
            drop(st);
            let started = Instant::now();
            if graceful {
                graceful_close(fd);
            } else {
                (inner.close)(fd);
            }
            let took = started.elapsed();
            st = inner.lock();
            let counted = finish(&mut st, computer, job);
            if took >= STALLED_AFTER && !counted {
                drop(st);
                tracing::info!(%computer, ?took, "closing a handed-over socket stalled");
                (inner.stalled)(computer);
                st = inner.lock();
            }
            continue;
        }
        st.idle += 1;
        let (guard, waited) = inner
            .wake
            .wait_timeout(st, inner.idle_exit)
            .unwrap_or_else(PoisonError::into_inner);
        st = guard;
        st.idle -= 1;
        st.wakeups = st.wakeups.saturating_sub(1);
        if waited.timed_out() && st.ready.is_empty() {
            st.threads -= 1;
            return;
        }
    }
}

/// The next close in turn: (computer, job, descriptor, whether the
/// desktop was put in turn again).
fn take(st: &mut State) -> Option<(Uuid, u64, (OwnedFd, bool), bool)> {
    while let Some(computer) = st.ready.pop_front() {
        let job = st.next_job;
        let Some(desk) = st.desks.get_mut(&computer) else {
            continue;
        };
        desk.in_ready = false;
        let Some(fd) = desk.waiting.pop_front() else {
            continue;
        };
        desk.running.push((job, Instant::now(), false));
        let again = !desk.waiting.is_empty() && desk.running.len() < PER_DESKTOP;
        if again {
            desk.in_ready = true;
            st.ready.push_back(computer);
        }
        st.next_job = job.wrapping_add(1);
        return Some((computer, job, fd, again));
    }
    None
}

/// A close done: its turn goes back; whether its stall was counted.
fn finish(st: &mut State, computer: Uuid, job: u64) -> bool {
    let Some(desk) = st.desks.get_mut(&computer) else {
        return false;
    };
    let mut counted = false;
    desk.running.retain(|(j, _, c)| {
        if *j == job {
            counted = *c;
        }
        *j != job
    });
    if desk.pending() == 0 {
        st.desks.remove(&computer);
    } else if !desk.in_ready && !desk.waiting.is_empty() && desk.running.len() < PER_DESKTOP {
        desk.in_ready = true;
        st.ready.push_back(computer);
    }
    counted
}

/// Closes one computer's handed descriptors on the pool.
#[derive(Debug, Clone)]
pub struct Closer {
    pool: ClosePool,
    computer: Uuid,
}

impl Closer {
    /// Queues `fd` to be closed abortively; never waits.
    pub fn close(&self, fd: OwnedFd) {
        self.pool.submit(self.computer, fd, false);
    }

    /// Queues `fd` to be closed gracefully ([`graceful_close`]); never waits.
    pub fn close_gracefully(&self, fd: OwnedFd) {
        self.pool.submit(self.computer, fd, true);
    }

    /// This computer's closes not done yet.
    pub fn pending(&self) -> usize {
        self.pool.pending(self.computer)
    }

    /// The reason a new connection is refused, while too many closes of
    /// this computer are not done.
    pub fn refusal(&self) -> Option<String> {
        let pending = self.pending();
        (pending >= MAX_PENDING).then(|| {
            format!(
                "refused: {pending} connections of this desktop are still being closed \
                 (the most is {MAX_PENDING}); its guest holds them open"
            )
        })
    }
}

impl CloseOff for Closer {
    fn close_off(&self, fd: OwnedFd) {
        self.close(fd);
    }
    fn close_off_gracefully(&self, fd: OwnedFd) {
        self.close_gracefully(fd);
    }
}

#[cfg(test)]
#[path = "closer_tests.rs"]
mod tests;
