//! Where the proxy's clients meet the broker's parked connections: a queue
//! of parked `egress_accept` connections, oldest first, each waiting for
//! one [`Handoff`]. Owns the cap on parked connections and the ids of
//! egress connections; it never reads or writes a socket itself.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit};
use tokio::time::{timeout_at, Instant};

use dormouse_protocol::egress::EgressOpen;

/// Most `egress_accept` connections parked at once; the broker keeps a few.
pub const MAX_PARKED: usize = 64;

/// One accepted, validated client, handed to a parked connection.
#[derive(Debug)]
pub struct Handoff {
    /// The guest program's connection.
    pub client: TcpStream,
    /// What it asked for.
    pub open: EgressOpen,
    /// The bytes to send upstream first.
    pub payload: Vec<u8>,
    /// Its place among the proxy's clients, held until the relay ends.
    pub permit: OwnedSemaphorePermit,
}

/// Why a connection could not be parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParkError {
    /// The proxy is not serving (its port was taken, or it has not started).
    #[error("the egress proxy is not serving")]
    NotServing,
    /// [`MAX_PARKED`] connections are parked already.
    #[error("{MAX_PARKED} egress connections are parked already")]
    Full,
}

impl ParkError {
    /// The stable code of the `error` response.
    pub fn code(self) -> &'static str {
        match self {
            Self::NotServing => "egress_unavailable",
            Self::Full => "busy",
        }
    }
}

/// The shared queue; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Hub {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    parked: Mutex<VecDeque<oneshot::Sender<Handoff>>>,
    arrived: Notify,
    next_id: AtomicU64,
    serving: AtomicBool,
}

impl Hub {
    /// A hub whose proxy is not serving yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the proxy as serving (or not): parking is refused while not.
    pub fn set_serving(&self, serving: bool) {
        self.inner.serving.store(serving, Ordering::SeqCst);
    }

    /// The next connection id.
    pub fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Parks one connection at the back of the queue; the receiver gets
    /// its client.
    pub fn park(&self) -> Result<oneshot::Receiver<Handoff>, ParkError> {
        if !self.inner.serving.load(Ordering::SeqCst) {
            return Err(ParkError::NotServing);
        }
        let mut parked = self.lock();
        parked.retain(|tx| !tx.is_closed());
        if parked.len() >= MAX_PARKED {
            return Err(ParkError::Full);
        }
        let (tx, rx) = oneshot::channel();
        parked.push_back(tx);
        drop(parked);
        self.inner.arrived.notify_one();
        Ok(rx)
    }

    /// How many connections are parked (some may have gone meanwhile).
    pub fn parked(&self) -> usize {
        self.lock().len()
    }

    /// Hands `handoff` to the oldest parked connection still there, waiting
    /// up to `wait` for one; gives it back when none came.
    pub async fn hand_off(&self, mut handoff: Handoff, wait: Duration) -> Result<(), Handoff> {
        let deadline = Instant::now() + wait;
        loop {
            let arrived = self.inner.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            loop {
                let next = self.lock().pop_front();
                let Some(tx) = next else { break };
                match tx.send(handoff) {
                    Ok(()) => return Ok(()),
                    Err(back) => handoff = back,
                }
            }
            if timeout_at(deadline, arrived).await.is_err() {
                return Err(handoff);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<oneshot::Sender<Handoff>>> {
        // A panic while holding it leaves only a queue of senders, still
        // consistent.
        self.inner
            .parked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
