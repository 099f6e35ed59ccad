//! The readiness health report the supervisor produces about itself.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Schema version of [`HealthReport`]; a string so it can grow to "1.1" without
/// breaking parsers that compare for equality on the major part.
pub const HEALTH_SCHEMA_VERSION: &str = "1";

/// Outcome of one check, ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    /// The check passed.
    Ok,
    /// Usable, but something is not as it should be.
    Degraded,
    /// The desktop is not usable for this reason.
    Fail,
}

/// One named check with its outcome and a human-readable detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Stable name, e.g. `x_display`, `screenshot`.
    pub name: String,
    /// Outcome.
    pub status: CheckStatus,
    /// What was seen, for people.
    pub detail: String,
}

impl Check {
    /// A check with the given outcome.
    pub fn new(name: impl Into<String>, status: CheckStatus, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status,
            detail: detail.into(),
        }
    }
}

/// The report of one self-probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReport {
    /// Always [`HEALTH_SCHEMA_VERSION`] for reports made by this crate.
    pub schema_version: String,
    /// Every check that ran.
    pub checks: Vec<Check>,
    /// The worst status among `checks` (`fail` when there are none).
    pub overall: CheckStatus,
    /// When the probe finished.
    pub probed_at: DateTime<Utc>,
}

impl HealthReport {
    /// Builds a report whose `overall` is derived from the checks, so it can
    /// never disagree with them.
    pub fn from_checks(checks: Vec<Check>, probed_at: DateTime<Utc>) -> Self {
        let overall = checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(CheckStatus::Fail);
        Self {
            schema_version: HEALTH_SCHEMA_VERSION.to_owned(),
            checks,
            overall,
            probed_at,
        }
    }

    /// The check with this name, if it ran.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).expect("valid timestamp")
    }

    #[test]
    fn overall_is_the_worst_check() {
        let ok = Check::new("a", CheckStatus::Ok, "");
        let degraded = Check::new("b", CheckStatus::Degraded, "");
        let fail = Check::new("c", CheckStatus::Fail, "");
        assert_eq!(
            HealthReport::from_checks(vec![ok.clone()], at()).overall,
            CheckStatus::Ok
        );
        assert_eq!(
            HealthReport::from_checks(vec![ok.clone(), degraded.clone()], at()).overall,
            CheckStatus::Degraded
        );
        assert_eq!(
            HealthReport::from_checks(vec![fail, ok, degraded], at()).overall,
            CheckStatus::Fail
        );
    }

    #[test]
    fn an_empty_report_is_not_ok() {
        assert_eq!(
            HealthReport::from_checks(vec![], at()).overall,
            CheckStatus::Fail
        );
    }

    #[test]
    fn serialises_schema_version_as_string() {
        let json = serde_json::to_value(HealthReport::from_checks(vec![], at())).expect("json");
        assert_eq!(json["schema_version"], "1");
        assert_eq!(json["overall"], "fail");
    }
}
