//! The idle timer of one computer: when a running desktop has been quiet for
//! a full window, the broker stops it (stop only: never remove, never
//! recreate).
//!
//! The timer is a pure state machine over [`tokio::time::Instant`]; the owner
//! task asks [`IdleTimer::wake_at`] when to look next, asks the guest for its
//! activity at that moment and feeds the answer to [`IdleTimer::observe`],
//! which says whether to stop. Rules:
//!
//! - it stops only after a full quiet window since the last activity;
//! - `touch` and mutating calls renew it ([`IdleTimer::renew`]); reading a
//!   status or a screenshot never does;
//! - guest input (`input_idle_ms`) counts as activity;
//! - while the guest is busy it never stops and re-checks every tenth of a
//!   window; the first quiet moment after busy starts a full new window;
//! - a stop (manual or any other) disarms it;
//! - a changed window is measured from the last activity, not from now;
//! - a failed stop backs off `window × 2^(failures−1)`, at most an hour and
//!   at least one window.
//!
//! It never touches the engine or the guest itself.

use std::time::Duration;

use dormouse_protocol::Activity;
use tokio::time::Instant;

/// The shortest idle window.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// The longest idle window (keeps `Instant` arithmetic far from overflow).
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);
/// The longest back-off after failed stops (unless the window is longer).
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// What the timer says after looking at the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Quiet for a full window: stop the desktop now.
    Stop,
    /// Not yet; look again at [`IdleTimer::wake_at`].
    Wait,
}

/// The idle timer of one computer.
#[derive(Debug, Clone)]
pub struct IdleTimer {
    window: Duration,
    armed: bool,
    last_activity: Instant,
    busy: bool,
    busy_checked_at: Instant,
    failures: u32,
    retry_at: Option<Instant>,
}

/// The back-off after `failures` failed stops.
pub fn backoff(window: Duration, failures: u32) -> Duration {
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u32::MAX);
    window
        .checked_mul(factor)
        .unwrap_or(MAX_BACKOFF)
        .min(MAX_BACKOFF)
        .max(window)
}

/// Clamps a window into [`MIN_WINDOW`, `MAX_WINDOW`].
pub fn clamp_window(window: Duration) -> Duration {
    window.clamp(MIN_WINDOW, MAX_WINDOW)
}

impl IdleTimer {
    /// A disarmed timer (the desktop is not running).
    pub fn new(window: Duration, now: Instant) -> Self {
        Self {
            window: clamp_window(window),
            armed: false,
            last_activity: now,
            busy: false,
            busy_checked_at: now,
            failures: 0,
            retry_at: None,
        }
    }

    /// The quiet window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Whether the guest said it was busy at the last look.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Failed stops since it was armed.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The desktop started: a full window from now.
    pub fn arm(&mut self, now: Instant) {
        self.armed = true;
        self.last_activity = now;
        self.busy = false;
        self.failures = 0;
        self.retry_at = None;
    }

    /// The desktop stopped (for any reason): nothing more to do.
    pub fn disarm(&mut self) {
        self.armed = false;
        self.busy = false;
        self.failures = 0;
        self.retry_at = None;
    }

    /// Activity now (`touch`, a mutating call).
    pub fn renew(&mut self, now: Instant) {
        if now > self.last_activity {
            self.last_activity = now;
        }
    }

    /// A new window, measured from the last activity.
    pub fn set_window(&mut self, window: Duration) {
        self.window = clamp_window(window);
    }

    fn quiet_deadline(&self) -> Instant {
        self.last_activity + self.window
    }

    /// When the owner should look next; `None` while disarmed.
    pub fn wake_at(&self) -> Option<Instant> {
        if !self.armed {
            return None;
        }
        if self.busy {
            return Some(self.busy_checked_at + self.window / 10);
        }
        let quiet = self.quiet_deadline();
        Some(match self.retry_at {
            Some(retry) if retry > quiet => retry,
            _ => quiet,
        })
    }

    /// When it will stop the desktop if nothing happens; `None` while busy
    /// or disarmed.
    pub fn stops_at(&self) -> Option<Instant> {
        if self.busy {
            None
        } else {
            self.wake_at()
        }
    }

    /// How long it has been quiet (zero while busy or disarmed).
    pub fn idle_for(&self, now: Instant) -> Duration {
        if !self.armed || self.busy {
            Duration::ZERO
        } else {
            now.saturating_duration_since(self.last_activity)
        }
    }

    /// Feeds what the guest says at `now` (`None`: the guest did not answer,
    /// which is no evidence of activity) and decides.
    pub fn observe(&mut self, activity: Option<&Activity>, now: Instant) -> Verdict {
        if !self.armed {
            return Verdict::Wait;
        }
        let busy_now = activity.is_some_and(|a| a.busy);
        if let Some(input_at) = activity
            .and_then(|a| a.input_idle_ms)
            .and_then(|ms| now.checked_sub(Duration::from_millis(ms)))
        {
            self.renew(input_at);
        }
        if busy_now {
            self.busy = true;
            self.busy_checked_at = now;
            return Verdict::Wait;
        }
        if self.busy {
            // The first quiet moment after busy starts a full new window.
            self.busy = false;
            self.renew(now);
            return Verdict::Wait;
        }
        let retry_due = self.retry_at.is_none_or(|r| now >= r);
        if now >= self.quiet_deadline() && retry_due {
            Verdict::Stop
        } else {
            Verdict::Wait
        }
    }

    /// A stop it asked for failed at `now`: back off before the next try.
    pub fn stop_failed(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(now + backoff(self.window, self.failures));
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::advance;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn quiet() -> Activity {
        Activity {
            input_idle_ms: Some(u64::MAX / 4),
            busy: false,
            busy_processes: vec![],
        }
    }

    fn busy() -> Activity {
        Activity {
            busy: true,
            ..quiet()
        }
    }

    fn input(ago_ms: u64) -> Activity {
        Activity {
            input_idle_ms: Some(ago_ms),
            ..quiet()
        }
    }

    fn armed(window: Duration) -> (IdleTimer, Instant) {
        let t0 = Instant::now();
        let mut timer = IdleTimer::new(window, t0);
        timer.arm(t0);
        (timer, t0)
    }

    #[tokio::test(start_paused = true)]
    async fn stops_only_after_a_full_quiet_window() {
        let (mut timer, t0) = armed(Duration::from_secs(1));
        assert_eq!(timer.wake_at(), Some(t0 + 1000 * MS));
        advance(999 * MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Wait);
        assert_eq!(timer.idle_for(Instant::now()), 999 * MS);
        advance(MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Stop);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswering_guest_does_not_keep_it_awake() {
        let (mut timer, _) = armed(Duration::from_secs(1));
        advance(1000 * MS).await;
        assert_eq!(timer.observe(None, Instant::now()), Verdict::Stop);
    }

    #[tokio::test(start_paused = true)]
    async fn touch_renews_the_full_window() {
        let (mut timer, t0) = armed(Duration::from_secs(1));
        advance(600 * MS).await;
        timer.renew(Instant::now());
        advance(400 * MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Wait);
        assert_eq!(timer.wake_at(), Some(t0 + 1600 * MS));
        advance(599 * MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Wait);
        advance(MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Stop);
    }

    #[tokio::test(start_paused = true)]
    async fn guest_input_counts_as_activity() {
        let (mut timer, t0) = armed(Duration::from_secs(1));
        advance(1000 * MS).await;
        // The user typed 300 ms ago: quiet since t0 + 700 ms.
        assert_eq!(
            timer.observe(Some(&input(300)), Instant::now()),
            Verdict::Wait
        );
        assert_eq!(timer.wake_at(), Some(t0 + 1700 * MS));
        advance(700 * MS).await;
        // Still no input since then (1000 ms ago at t0 + 1700 ms).
        assert_eq!(
            timer.observe(Some(&input(1000)), Instant::now()),
            Verdict::Stop
        );
    }

    #[tokio::test(start_paused = true)]
    async fn busy_never_stops_rechecks_every_tenth_and_then_starts_a_new_window() {
        let (mut timer, t0) = armed(Duration::from_secs(1));
        advance(1000 * MS).await;
        assert_eq!(timer.observe(Some(&busy()), Instant::now()), Verdict::Wait);
        assert!(timer.is_busy());
        assert_eq!(timer.stops_at(), None, "no stop time while busy");
        assert_eq!(timer.wake_at(), Some(t0 + 1100 * MS));
        for _ in 0..30 {
            advance(100 * MS).await;
            assert_eq!(timer.observe(Some(&busy()), Instant::now()), Verdict::Wait);
        }
        // 4.1 s: the first quiet moment starts a full new window.
        let quiet_at = t0 + 4100 * MS;
        advance(100 * MS).await;
        assert_eq!(Instant::now(), quiet_at);
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Wait);
        assert_eq!(timer.wake_at(), Some(quiet_at + 1000 * MS));
        advance(999 * MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Wait);
        advance(MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Stop);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_disarms_it() {
        let (mut timer, _) = armed(Duration::from_secs(1));
        advance(500 * MS).await;
        timer.disarm();
        assert_eq!(timer.wake_at(), None);
        advance(5000 * MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Wait);
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_window_counts_from_the_last_activity() {
        let (mut timer, t0) = armed(Duration::from_secs(10));
        advance(3000 * MS).await;
        timer.set_window(Duration::from_secs(5));
        assert_eq!(timer.wake_at(), Some(t0 + 5000 * MS));
        timer.set_window(Duration::from_secs(2));
        assert_eq!(timer.wake_at(), Some(t0 + 2000 * MS));
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Stop);
        timer.set_window(Duration::from_secs(20));
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Wait);
        assert_eq!(timer.wake_at(), Some(t0 + 20_000 * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_stops_back_off() {
        let window = Duration::from_secs(60);
        let (mut timer, _) = armed(window);
        advance(window).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Stop);
        timer.stop_failed(Instant::now());
        let first = Instant::now();
        assert_eq!(timer.wake_at(), Some(first + window));
        advance(window - MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Wait);
        advance(MS).await;
        assert_eq!(timer.observe(Some(&quiet()), Instant::now()), Verdict::Stop);
        timer.stop_failed(Instant::now());
        assert_eq!(timer.wake_at(), Some(Instant::now() + 2 * window));
        timer.stop_failed(Instant::now());
        assert_eq!(timer.wake_at(), Some(Instant::now() + 4 * window));
        assert_eq!(timer.failures(), 3);
        // A restart resets the count.
        timer.arm(Instant::now());
        assert_eq!(timer.failures(), 0);
    }

    #[test]
    fn backoff_is_capped_at_an_hour_and_at_least_one_window() {
        let s = Duration::from_secs;
        assert_eq!(backoff(s(1), 1), s(1));
        assert_eq!(backoff(s(1), 2), s(2));
        assert_eq!(backoff(s(1), 3), s(4));
        assert_eq!(backoff(s(1), 13), s(3600));
        assert_eq!(backoff(s(1), 200), s(3600));
        assert_eq!(backoff(s(1800), 3), s(3600));
        assert_eq!(backoff(s(8 * 3600), 1), s(8 * 3600));
        assert_eq!(backoff(s(8 * 3600), 5), s(8 * 3600));
    }

    #[test]
    fn windows_are_clamped() {
        let t = Instant::now();
        assert_eq!(IdleTimer::new(Duration::ZERO, t).window(), MIN_WINDOW);
        assert_eq!(IdleTimer::new(Duration::MAX, t).window(), MAX_WINDOW);
    }
}
