//! The daemon's side of systemd's protocol: `READY=1` once the broker core
//! has reconciled and the API serves, `STATUS=` lines, `STOPPING=1`, and
//! watchdog pings when the unit sets `WatchdogSec`.
//!
//! Every call is a no-op when the process was not started by systemd
//! (`NOTIFY_SOCKET` unset), so the daemon behaves the same by hand.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

/// Tells systemd the service is ready.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells systemd the service is stopping.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// Tells systemd a re-read of the configuration began or ended.
pub fn reloading(done: bool) {
    if done {
        send(&[NotifyState::Ready, NotifyState::Status("serving")]);
        return;
    }
    // systemd 253 and newer insist on the monotonic time with RELOADING=1.
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(e) => tracing::warn!(error = %e, "cannot read the monotonic clock for systemd"),
    }
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// The watchdog interval systemd asks for, if any.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0;
    sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec))
}

/// Pings the watchdog at half its interval until `stop` is cancelled.
///
/// The pings come from a task on the daemon's runtime, so a wedged runtime
/// stops them and systemd restarts the broker. The death of the broker core is
/// noticed separately (the daemon exits with an error), not by withholding
/// pings: a core busy with a long engine call is not dead.
pub async fn watchdog(interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval / 2);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => send(&[NotifyState::Watchdog]),
        }
    }
}
