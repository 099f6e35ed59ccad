//! Counters the core updates and `GET /metrics` renders (Prometheus text).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use dormouse_protocol::egress_policy::EgressDecision;

/// Upper bounds (ms) of the resume-latency histogram buckets.
pub const RESUME_BUCKETS_MS: &[u64] = &[250, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000, 30000];

/// Process-wide broker metrics; cheap to update from any task.
#[derive(Debug, Default)]
pub struct Metrics {
    resume_buckets: [AtomicU64; 10],
    resume_count: AtomicU64,
    resume_sum_ms: AtomicU64,
    idle_stops: AtomicU64,
    fencing_rejections: AtomicU64,
    divergences: AtomicU64,
    /// 1 when the start-up probe saw the engine's events arrive, else 0.
    events_verified: AtomicU64,
    /// Egress connections by decision: allowed, refused, failed.
    egress: [AtomicU64; 3],
    /// 1 while the container engine is lost, else 0.
    engine_unavailable: AtomicU64,
    /// How often the engine was lost.
    engine_losses: AtomicU64,
    /// Closes of guest-handed sockets that took longer than the stall bound.
    egress_stalled_closes: AtomicU64,
}

impl Metrics {
    /// Records one resume → ready latency.
    pub fn observe_resume(&self, ms: u64) {
        for (bucket, bound) in self.resume_buckets.iter().zip(RESUME_BUCKETS_MS) {
            if ms <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.resume_count.fetch_add(1, Ordering::Relaxed);
        self.resume_sum_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Counts a stop made by the idle timer.
    pub fn idle_stop(&self) {
        self.idle_stops.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call refused for a stale or missing generation.
    pub fn fencing_rejection(&self) {
        self.fencing_rejections.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a desktop whose engine state differed from what the broker
    /// believed, found by the resync or by the guest channel without an
    /// engine event.
    pub fn divergence(&self) {
        self.divergences.fetch_add(1, Ordering::Relaxed);
    }

    /// Divergences counted so far.
    pub fn divergences(&self) -> u64 {
        self.divergences.load(Ordering::Relaxed)
    }

    /// Counts one egress connection by its decision.
    pub fn egress_decision(&self, decision: EgressDecision) {
        self.egress[egress_index(decision)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one close of a guest-handed egress socket that stalled.
    pub fn egress_stalled_close(&self) {
        self.egress_stalled_closes.fetch_add(1, Ordering::Relaxed);
    }

    /// Records whether the start-up probe saw the engine's events arrive.
    pub fn events_verified(&self, verified: bool) {
        self.events_verified
            .store(u64::from(verified), Ordering::Relaxed);
    }

    /// The container engine was lost.
    pub fn engine_lost(&self) {
        self.engine_unavailable.store(1, Ordering::Relaxed);
        self.engine_losses.fetch_add(1, Ordering::Relaxed);
    }

    /// The container engine answers again.
    pub fn engine_back(&self) {
        self.engine_unavailable.store(0, Ordering::Relaxed);
    }

    /// Prometheus text exposition; `by_state` is (container state, count).
    pub fn render(&self, by_state: &[(&str, u64)]) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP dormouse_desktops Desktops by container state.");
        let _ = writeln!(out, "# TYPE dormouse_desktops gauge");
        for (state, n) in by_state {
            let _ = writeln!(out, "dormouse_desktops{{state=\"{state}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP dormouse_resume_seconds Resume to ready latency."
        );
        let _ = writeln!(out, "# TYPE dormouse_resume_seconds histogram");
        for (bucket, bound) in self.resume_buckets.iter().zip(RESUME_BUCKETS_MS) {
            let _ = writeln!(
                out,
                "dormouse_resume_seconds_bucket{{le=\"{}\"}} {}",
                *bound as f64 / 1000.0,
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.resume_count.load(Ordering::Relaxed);
        let _ = writeln!(out, "dormouse_resume_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "dormouse_resume_seconds_sum {}",
            self.resume_sum_ms.load(Ordering::Relaxed) as f64 / 1000.0
        );
        let _ = writeln!(out, "dormouse_resume_seconds_count {count}");
        let _ = writeln!(
            out,
            "# HELP dormouse_idle_stops_total Desktops stopped by the idle timer."
        );
        let _ = writeln!(out, "# TYPE dormouse_idle_stops_total counter");
        let _ = writeln!(
            out,
            "dormouse_idle_stops_total {}",
            self.idle_stops.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP dormouse_fencing_rejections_total Calls refused for a stale or missing generation.");
        let _ = writeln!(out, "# TYPE dormouse_fencing_rejections_total counter");
        let _ = writeln!(
            out,
            "dormouse_fencing_rejections_total {}",
            self.fencing_rejections.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP dormouse_state_divergence_total Desktops whose engine state differed from the broker's belief (an event the engine did not deliver).");
        let _ = writeln!(out, "# TYPE dormouse_state_divergence_total counter");
        let _ = writeln!(
            out,
            "dormouse_state_divergence_total {}",
            self.divergences.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP dormouse_engine_events_verified Whether the start-up probe saw the engine's event stream deliver (1) or not (0).");
        let _ = writeln!(out, "# TYPE dormouse_engine_events_verified gauge");
        let _ = writeln!(
            out,
            "dormouse_engine_events_verified {}",
            self.events_verified.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP dormouse_engine_unavailable Whether the container engine is lost now (1) or answers (0).");
        let _ = writeln!(out, "# TYPE dormouse_engine_unavailable gauge");
        let _ = writeln!(
            out,
            "dormouse_engine_unavailable {}",
            self.engine_unavailable.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP dormouse_engine_losses_total Times the container engine was lost."
        );
        let _ = writeln!(out, "# TYPE dormouse_engine_losses_total counter");
        let _ = writeln!(
            out,
            "dormouse_engine_losses_total {}",
            self.engine_losses.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP dormouse_egress_connections_total Egress connections of desktops by decision."
        );
        let _ = writeln!(out, "# TYPE dormouse_egress_connections_total counter");
        for d in [
            EgressDecision::Allowed,
            EgressDecision::Refused,
            EgressDecision::Failed,
        ] {
            let _ = writeln!(
                out,
                "dormouse_egress_connections_total{{decision=\"{}\"}} {}",
                d.as_str(),
                self.egress[egress_index(d)].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP dormouse_egress_stalled_closes_total Closes of sockets a guest handed over that took over 100 ms (the guest set a linger on them)."
        );
        let _ = writeln!(out, "# TYPE dormouse_egress_stalled_closes_total counter");
        let _ = writeln!(
            out,
            "dormouse_egress_stalled_closes_total {}",
            self.egress_stalled_closes.load(Ordering::Relaxed)
        );
        out
    }
}

fn egress_index(d: EgressDecision) -> usize {
    match d {
        EgressDecision::Allowed => 0,
        EgressDecision::Refused => 1,
        EgressDecision::Failed => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.observe_resume(300);
        m.observe_resume(1200);
        let text = m.render(&[("running", 1)]);
        assert!(text.contains("dormouse_resume_seconds_bucket{le=\"0.25\"} 0"));
        assert!(text.contains("dormouse_resume_seconds_bucket{le=\"0.5\"} 1"));
        assert!(text.contains("dormouse_resume_seconds_bucket{le=\"1.5\"} 2"));
        assert!(text.contains("dormouse_resume_seconds_count 2"));
        assert!(text.contains("dormouse_desktops{state=\"running\"} 1"));
        m.egress_decision(EgressDecision::Refused);
        let text = m.render(&[]);
        assert!(text.contains("dormouse_egress_connections_total{decision=\"refused\"} 1"));
        assert!(text.contains("dormouse_egress_connections_total{decision=\"allowed\"} 0"));
        assert!(text.contains("dormouse_egress_stalled_closes_total 0\n"));
        m.egress_stalled_close();
        assert!(m
            .render(&[])
            .contains("dormouse_egress_stalled_closes_total 1\n"));
    }

    #[test]
    fn divergences_are_counted() {
        let m = Metrics::default();
        assert!(m
            .render(&[])
            .contains("dormouse_state_divergence_total 0\n"));
        m.divergence();
        m.divergence();
        assert!(m
            .render(&[])
            .contains("dormouse_state_divergence_total 2\n"));
        m.events_verified(true);
        assert!(m
            .render(&[])
            .contains("dormouse_engine_events_verified 1\n"));
        m.engine_lost();
        let text = m.render(&[]);
        assert!(text.contains("dormouse_engine_unavailable 1\n"));
        assert!(text.contains("dormouse_engine_losses_total 1\n"));
        m.engine_back();
        assert!(m.render(&[]).contains("dormouse_engine_unavailable 0\n"));
    }
}
