//! The per-desktop caps of egress: open connections at once, and new
//! connections per second (a token bucket over [`tokio::time::Instant`]),
//! and the timeouts of one connection. Beyond a cap a connection is
//! refused with a one-line reason; nothing waits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// The caps and timeouts of one desktop's egress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Most connections open at once.
    pub max_open: usize,
    /// Most new connections per second (also the burst).
    pub per_second: u32,
    /// How long a dial may take.
    pub connect_timeout: Duration,
    /// How long a connection may move no byte either way.
    pub idle_timeout: Duration,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            max_open: 256,
            per_second: 100,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// One desktop's counters against its [`Caps`].
#[derive(Debug)]
pub struct Limiter {
    caps: Caps,
    open: Arc<AtomicUsize>,
    bucket: Mutex<Bucket>,
}

/// A slot among a desktop's open connections, given back on drop.
#[derive(Debug)]
pub struct Slot {
    open: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Limiter {
    /// Counters for `caps`, the bucket full.
    pub fn new(caps: Caps) -> Self {
        Self {
            caps,
            open: Arc::new(AtomicUsize::new(0)),
            bucket: Mutex::new(Bucket {
                tokens: f64::from(caps.per_second),
                at: Instant::now(),
            }),
        }
    }

    /// The caps.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// How many connections are open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// A slot for one new connection, or the reason there is none.
    pub fn admit(&self) -> Result<Slot, String> {
        {
            let mut b = self
                .bucket
                .lock()
                .map_err(|_| "refused: the rate limiter failed".to_owned())?;
            let now = Instant::now();
            let rate = f64::from(self.caps.per_second);
            let refill = now.duration_since(b.at).as_secs_f64() * rate;
            b.tokens = (b.tokens + refill).min(rate);
            b.at = now;
            if b.tokens < 1.0 {
                return Err(format!(
                    "refused: more than {} new connections per second from this desktop",
                    self.caps.per_second
                ));
            }
            b.tokens -= 1.0;
        }
        let max = self.caps.max_open;
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| Slot {
                open: Arc::clone(&self.open),
            })
            .map_err(|_| {
                format!("refused: {max} connections are open from this desktop, the most it may")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(max_open: usize, per_second: u32) -> Caps {
        Caps {
            max_open,
            per_second,
            ..Caps::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_open_cap_holds_and_slots_come_back() {
        let l = Limiter::new(caps(3, 1000));
        let slots: Vec<Slot> = (0..3).map(|_| l.admit().expect("slot")).collect();
        let e = l.admit().expect_err("cap");
        assert_eq!(
            e,
            "refused: 3 connections are open from this desktop, the most it may"
        );
        assert_eq!(l.open(), 3);
        drop(slots);
        assert_eq!(l.open(), 0);
        assert!(l.admit().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_cap_refills_over_time() {
        let l = Limiter::new(caps(10_000, 100));
        let mut held = Vec::new();
        for _ in 0..100 {
            held.push(l.admit().expect("burst"));
        }
        let e = l.admit().expect_err("rate");
        assert_eq!(
            e,
            "refused: more than 100 new connections per second from this desktop"
        );
        tokio::time::advance(Duration::from_millis(50)).await;
        for _ in 0..5 {
            held.push(l.admit().expect("refilled"));
        }
        assert!(l.admit().is_err());
        tokio::time::advance(Duration::from_secs(10)).await;
        for _ in 0..100 {
            held.push(l.admit().expect("full again"));
        }
        assert!(
            l.admit().is_err(),
            "the burst is at most one second's worth"
        );
    }
}
