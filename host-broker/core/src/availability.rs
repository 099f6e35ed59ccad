//! Whether the container engine answers, as the owner last learnt it: one
//! shared, lock-guarded value the owner writes when the engine is lost and
//! when it answers again, and that anyone holding a [`BrokerHandle`]
//! (`/healthz`, `/metrics`) reads without asking the owner task.
//!
//! It holds only what may be shown without a token: when the engine was
//! lost and a reason in fixed words ([`LossReason`]), never the engine's own
//! text (which may name host paths).
//!
//! [`BrokerHandle`]: crate::command::BrokerHandle

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Why the engine counts as lost, in words any caller may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// Its socket refused or a request could not be made.
    Unreachable,
    /// Its event stream ended (the service went away).
    StreamEnded,
    /// Its event stream failed with an error of the engine's own.
    StreamFailed,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unreachable => "not reachable",
            Self::StreamEnded => "its event stream ended",
            Self::StreamFailed => "its event stream failed",
        })
    }
}

/// The engine as the owner last knew it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineAvailability {
    /// Since when it has been lost, and why; `None` while it answers.
    pub lost: Option<(DateTime<Utc>, LossReason)>,
    /// How often it was lost since the broker started.
    pub losses: u64,
    /// The last return: when, after how long away, and how long the
    /// reconciliation of every desktop took (`None` while it runs).
    pub last_return: Option<Return>,
}

/// One return of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    /// When the engine answered again.
    pub at: DateTime<Utc>,
    /// How long it had been lost.
    pub away: Duration,
    /// How many desktops were observed afresh.
    pub desktops: usize,
    /// How long observing every desktop took, once done.
    pub reconciled_in: Option<Duration>,
}

impl EngineAvailability {
    /// The `/healthz` lines about the engine's availability (none while it
    /// answers and never went away).
    pub fn health_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some((since, why)) = &self.lost {
            lines.push(format!(
                "engine: unavailable since {}: {why}",
                since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            ));
        } else if let Some(back) = &self.last_return {
            let reconciled = match back.reconciled_in {
                Some(d) => format!(
                    "{} desktops reconciled in {} ms",
                    back.desktops,
                    d.as_millis()
                ),
                None => format!("reconciling {} desktops", back.desktops),
            };
            lines.push(format!(
                "engine: available again since {} after {} ms away; {reconciled}",
                back.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                back.away.as_millis()
            ));
        }
        lines
    }
}

/// The shared cell; cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct AvailabilityCell(Arc<Mutex<EngineAvailability>>);

impl AvailabilityCell {
    /// What is known now.
    pub fn get(&self) -> EngineAvailability {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Changes it (the owner only).
    pub fn update(&self, change: impl FnOnce(&mut EngineAvailability)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_lines_say_since_when_and_why_in_fixed_words() {
        let mut a = EngineAvailability::default();
        assert!(a.health_lines().is_empty());
        let t = DateTime::parse_from_rfc3339("2026-12-03T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        a.lost = Some((t, LossReason::Unreachable));
        assert_eq!(
            a.health_lines(),
            vec!["engine: unavailable since 2026-12-03T10:00:00.000Z: not reachable"]
        );
        a.lost = None;
        a.last_return = Some(Return {
            at: t,
            away: Duration::from_millis(10_250),
            desktops: 3,
            reconciled_in: Some(Duration::from_millis(42)),
        });
        assert_eq!(
            a.health_lines(),
            vec!["engine: available again since 2026-12-03T10:00:00.000Z after 10250 ms away; 3 desktops reconciled in 42 ms"]
        );
    }
}
