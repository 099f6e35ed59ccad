//! Why a service failed, what fixes it, and when to try again.
//!
//! Pure policy with no I/O: [`classify`] reads an exit and the last lines a
//! service wrote; [`RestartTracker`] turns failures into a backoff delay or a
//! crash-loop verdict. Time is `tokio::time::Instant`, so tests run it under
//! `tokio::time::pause()`. This module must never sleep, spawn or delete;
//! the service runner applies what it decides.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::ServiceKind;
use crate::config::Config;
use crate::init::ChildExit;

/// Why a service ended or failed to become ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureCause {
    /// The X server found the lock of a previous server (`Server is already
    /// active for display`): the lock is stale, since the supervisor owns
    /// the display.
    StaleDisplayLock,
    /// The X server could not create its listening socket (a stale socket
    /// file, or a bad `/tmp/.X11-unix`).
    DisplaySocketInUse,
    /// A client could not reach the X display (it went away or is not up).
    DisplayUnreachable,
    /// A browser refused its profile as in use by another (stale) instance.
    ProfileInUse,
    /// The VNC port is taken.
    PortInUse,
    /// The program could not be started at all.
    SpawnFailed(String),
    /// It did not become ready within the bound.
    NotReady,
    /// A signal ended it.
    Killed(i32),
    /// It exited with this code for a reason not recognised.
    Exited(i32),
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StaleDisplayLock => f.write_str("stale X display lock"),
            Self::DisplaySocketInUse => f.write_str("X socket cannot be created"),
            Self::DisplayUnreachable => f.write_str("X display unreachable"),
            Self::ProfileInUse => f.write_str("browser profile locked"),
            Self::PortInUse => f.write_str("port in use"),
            Self::SpawnFailed(why) => write!(f, "cannot start: {why}"),
            Self::NotReady => f.write_str("not ready in time"),
            Self::Killed(sig) => write!(f, "killed by {}", ChildExit::Signal(*sig)),
            Self::Exited(code) => write!(f, "exit {code}"),
        }
    }
}

/// What to do about a failure before retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remedy {
    /// Remove the X lock file and socket, then retry at once.
    ClearDisplayLocks,
    /// Remove this browser family's profile locks, then retry at once.
    ClearProfileLocks,
    /// Nothing to fix here; wait out the backoff (and the display).
    Backoff,
}

impl FailureCause {
    /// The fix for this cause.
    pub fn remedy(&self) -> Remedy {
        match self {
            Self::StaleDisplayLock | Self::DisplaySocketInUse => Remedy::ClearDisplayLocks,
            Self::ProfileInUse => Remedy::ClearProfileLocks,
            _ => Remedy::Backoff,
        }
    }
}

/// Classifies a failure from what the service said last (`tail`, oldest
/// first) and how it ended (`exit` is `None` when it still ran, e.g. it was
/// not ready in time and had to be killed).
pub fn classify(kind: ServiceKind, exit: Option<ChildExit>, tail: &[String]) -> FailureCause {
    let said = |needles: &[&str]| {
        tail.iter()
            .any(|line| needles.iter().any(|n| line.contains(n)))
    };
    match kind {
        ServiceKind::Display => {
            if said(&["Server is already active for display", "remove /tmp/.X"]) {
                return FailureCause::StaleDisplayLock;
            }
            if said(&[
                "Cannot establish any listening sockets",
                "SocketCreateListener() failed",
                "_XSERVTransMakeAllCOTSServerListeners",
            ]) {
                return FailureCause::DisplaySocketInUse;
            }
        }
        ServiceKind::Browser(_) => {
            if said(&[
                "The profile appears to be in use",
                "profile is locked",
                "ProcessSingleton",
                "is already running, but is not responding",
            ]) {
                return FailureCause::ProfileInUse;
            }
        }
        ServiceKind::Vnc => {
            if said(&["Address already in use", "listen_tcp: could not"]) {
                return FailureCause::PortInUse;
            }
        }
        ServiceKind::WindowManager | ServiceKind::Taskbar => {}
    }
    if kind != ServiceKind::Display
        && said(&[
            "Can't open display",
            "cannot open display",
            "Failed to open display",
            "Failed to open the display",
            "Missing X server or $DISPLAY",
            "unable to open display",
            "XIO:  fatal IO error",
            "Gtk-WARNING **: cannot open display",
        ])
    {
        return FailureCause::DisplayUnreachable;
    }
    match exit {
        None => FailureCause::NotReady,
        Some(ChildExit::Signal(sig)) => FailureCause::Killed(sig),
        Some(ChildExit::Code(code)) => FailureCause::Exited(code),
    }
}

/// Restart tunables (from the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Delay after the first failure; doubles with each failure in a row.
    pub base: Duration,
    /// Longest delay.
    pub max: Duration,
    /// A run at least this long resets the doubling.
    pub stable_after: Duration,
    /// Failures within `window` that make a crash loop.
    pub crash_limit: u32,
    /// Window for counting failures.
    pub window: Duration,
    /// Rest after a crash loop before the next try.
    pub cooldown: Duration,
}

impl RestartPolicy {
    /// The policy the configuration asks for.
    pub fn from_config(config: &Config) -> Self {
        Self {
            base: Duration::from_millis(config.restart_base_ms),
            max: Duration::from_millis(config.restart_max_ms),
            stable_after: Duration::from_millis(config.restart_stable_ms),
            crash_limit: config.crash_loop_failures,
            window: Duration::from_millis(config.crash_loop_window_ms),
            cooldown: Duration::from_millis(config.crash_loop_cooldown_ms),
        }
    }
}

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartDecision {
    /// Try again after this delay (zero after a fixed cause).
    RetryAfter(Duration),
    /// Too many failures in the window: mark the service failed, rest for
    /// `cooldown`, then start afresh.
    CrashLoop {
        /// Failures seen within the window.
        failures: u32,
        /// Rest before the next try.
        cooldown: Duration,
    },
}

/// Failure history of one service.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    policy: RestartPolicy,
    /// When recent failures happened, oldest first (within the window).
    recent: VecDeque<Instant>,
    /// Failures in a row without a stable run between them.
    in_a_row: u32,
}

impl RestartTracker {
    /// No failures yet.
    pub fn new(policy: RestartPolicy) -> Self {
        Self {
            policy,
            recent: VecDeque::new(),
            in_a_row: 0,
        }
    }

    /// Records a failure at `now` after a run of `ran_for`; `fixed` says the
    /// cause was removed (a stale lock), so waiting would not help.
    pub fn record_failure(
        &mut self,
        now: Instant,
        ran_for: Duration,
        fixed: bool,
    ) -> RestartDecision {
        if ran_for >= self.policy.stable_after {
            self.in_a_row = 0;
        }
        self.in_a_row = self.in_a_row.saturating_add(1);
        self.recent.push_back(now);
        while let Some(&oldest) = self.recent.front() {
            if now.duration_since(oldest) > self.policy.window {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        let failures = u32::try_from(self.recent.len()).unwrap_or(u32::MAX);
        if failures >= self.policy.crash_limit {
            self.recent.clear();
            self.in_a_row = 0;
            return RestartDecision::CrashLoop {
                failures,
                cooldown: self.policy.cooldown,
            };
        }
        if fixed {
            return RestartDecision::RetryAfter(Duration::ZERO);
        }
        RestartDecision::RetryAfter(backoff(self.policy, self.in_a_row))
    }
}

/// Delay before retry number `n` (1-based): `base * 2^(n-1)`, at most `max`.
pub fn backoff(policy: RestartPolicy, n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(31);
    policy
        .base
        .checked_mul(1u32 << doublings)
        .unwrap_or(policy.max)
        .min(policy.max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::Browser;

    fn lines(text: &[&str]) -> Vec<String> {
        text.iter().map(|s| (*s).to_owned()).collect()
    }

    fn policy() -> RestartPolicy {
        RestartPolicy {
            base: Duration::from_millis(250),
            max: Duration::from_secs(8),
            stable_after: Duration::from_secs(30),
            crash_limit: 5,
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(60),
        }
    }

    #[test]
    fn x_server_failures_are_recognised() {
        let stale = lines(&[
            "Fatal server error:",
            "(EE) Server is already active for display 1",
            "\tIf this server is no longer running, remove /tmp/.X1-lock",
        ]);
        let cause = classify(ServiceKind::Display, Some(ChildExit::Code(1)), &stale);
        assert_eq!(cause, FailureCause::StaleDisplayLock);
        assert_eq!(cause.remedy(), Remedy::ClearDisplayLocks);

        let socket = lines(&[
            "_XSERVTransSocketUNIXCreateListener: ...SocketCreateListener() failed",
            "(EE) Cannot establish any listening sockets - Make sure an X server isn't already running",
        ]);
        assert_eq!(
            classify(ServiceKind::Display, Some(ChildExit::Code(1)), &socket),
            FailureCause::DisplaySocketInUse
        );
    }

    #[test]
    fn clients_and_browsers_are_recognised() {
        let no_display =
            lines(&["openbox: Failed to open the display from the DISPLAY environment variable."]);
        assert_eq!(
            classify(
                ServiceKind::WindowManager,
                Some(ChildExit::Code(1)),
                &no_display
            ),
            FailureCause::DisplayUnreachable
        );
        assert_eq!(
            classify(
                ServiceKind::WindowManager,
                Some(ChildExit::Code(1)),
                &lines(&["bye"])
            ),
            FailureCause::Exited(1),
            "an unrecognised line is a plain exit"
        );
        let vnc = lines(&[
            "XOpenDisplay(\":1\") failed.",
            "x11vnc: unable to open display :1",
        ]);
        assert_eq!(
            classify(ServiceKind::Vnc, Some(ChildExit::Code(1)), &vnc),
            FailureCause::DisplayUnreachable
        );
        let chromium = lines(&[
            "[12:12:0101/000000.000:ERROR:process_singleton_posix.cc(353)] The profile appears to be in use by another Chromium process (42) on another computer (old).",
        ]);
        let cause = classify(
            ServiceKind::Browser(Browser::Chromium),
            Some(ChildExit::Code(21)),
            &chromium,
        );
        assert_eq!(cause, FailureCause::ProfileInUse);
        assert_eq!(cause.remedy(), Remedy::ClearProfileLocks);
        let firefox = lines(&["Firefox is already running, but is not responding."]);
        assert_eq!(
            classify(
                ServiceKind::Browser(Browser::Firefox),
                Some(ChildExit::Code(1)),
                &firefox
            ),
            FailureCause::ProfileInUse
        );
    }

    #[test]
    fn plain_exits_and_signals() {
        assert_eq!(
            classify(ServiceKind::Vnc, Some(ChildExit::Signal(11)), &[]),
            FailureCause::Killed(11)
        );
        assert_eq!(
            classify(ServiceKind::Display, Some(ChildExit::Code(2)), &[]),
            FailureCause::Exited(2)
        );
        assert_eq!(
            classify(ServiceKind::Display, None, &[]),
            FailureCause::NotReady
        );
        assert_eq!(FailureCause::Exited(2).remedy(), Remedy::Backoff);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = policy();
        let delays: Vec<_> = (1..=8).map(|n| backoff(p, n)).collect();
        assert_eq!(delays[0], Duration::from_millis(250));
        assert_eq!(delays[1], Duration::from_millis(500));
        assert_eq!(delays[2], Duration::from_secs(1));
        assert_eq!(delays[5], Duration::from_secs(8));
        assert_eq!(delays[7], Duration::from_secs(8));
        assert_eq!(backoff(p, u32::MAX), Duration::from_secs(8));
    }

    #[tokio::test(start_paused = true)]
    async fn five_quick_failures_are_a_crash_loop() {
        let mut tracker = RestartTracker::new(policy());
        let mut decisions = Vec::new();
        for _ in 0..5 {
            decisions.push(tracker.record_failure(
                Instant::now(),
                Duration::from_millis(10),
                false,
            ));
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(
            decisions[0],
            RestartDecision::RetryAfter(Duration::from_millis(250))
        );
        assert_eq!(
            decisions[3],
            RestartDecision::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(
            decisions[4],
            RestartDecision::CrashLoop {
                failures: 5,
                cooldown: Duration::from_secs(60)
            }
        );
        // After the verdict the history starts afresh.
        assert_eq!(
            tracker.record_failure(Instant::now(), Duration::ZERO, false),
            RestartDecision::RetryAfter(Duration::from_millis(250))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_spread_beyond_the_window_are_no_loop() {
        let mut tracker = RestartTracker::new(policy());
        for _ in 0..20 {
            let decision = tracker.record_failure(Instant::now(), Duration::from_millis(10), false);
            assert!(
                matches!(decision, RestartDecision::RetryAfter(_)),
                "{decision:?}"
            );
            tokio::time::advance(Duration::from_secs(16)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stable_run_resets_the_doubling_and_a_fixed_cause_retries_at_once() {
        let mut tracker = RestartTracker::new(policy());
        tracker.record_failure(Instant::now(), Duration::ZERO, false);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            tracker.record_failure(Instant::now(), Duration::ZERO, false),
            RestartDecision::RetryAfter(Duration::from_millis(500))
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            tracker.record_failure(Instant::now(), Duration::from_secs(45), false),
            RestartDecision::RetryAfter(Duration::from_millis(250)),
            "ran long enough to count as stable"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            tracker.record_failure(Instant::now(), Duration::ZERO, true),
            RestartDecision::RetryAfter(Duration::ZERO)
        );
        // Fixed causes still count: a lock that keeps coming back loops.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(matches!(
            tracker.record_failure(Instant::now(), Duration::ZERO, true),
            RestartDecision::CrashLoop { .. }
        ));
    }
}
