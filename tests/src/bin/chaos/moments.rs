//! The moments a chaos cycle kills at ([`Moment`], and whether the broker
//! dies too, [`BrokerKill`]), how far a killed run got by the supervisor's
//! log ([`milestone`]) and what a killed desktop must show afterwards
//! ([`check_reason`]). Pure: it starts and kills nothing.

use std::fmt;

use anyhow::{ensure, Result};
use dormouse_protocol::api::{ComputerStatus, StopReason};

/// When in a desktop's life the kill lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Moment {
    /// Right after the engine started the container.
    Boot,
    /// While the supervisor prepares the home, profiles and locks.
    Prepare,
    /// While services start and the self-probe runs.
    Probe,
    /// Once it is ready.
    Ready,
    /// During a graceful stop through the broker.
    Stop,
}

pub(crate) const MOMENTS: [Moment; 5] = [
    Moment::Boot,
    Moment::Prepare,
    Moment::Probe,
    Moment::Ready,
    Moment::Stop,
];

impl fmt::Display for Moment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Boot => "boot",
            Self::Prepare => "prepare",
            Self::Probe => "probe",
            Self::Ready => "ready",
            Self::Stop => "stop",
        })
    }
}

/// Whether, and when, the broker dies in a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BrokerKill {
    Spared,
    /// Killed just before the container: it must learn of the kill by
    /// reconciling after its restart.
    Before,
    /// Killed just after the container.
    After,
}

impl fmt::Display for BrokerKill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Spared => "spared",
            Self::Before => "killed-before",
            Self::After => "killed-after",
        })
    }
}

/// The furthest milestone in the supervisor's log of one run: `boot` (no
/// word yet), `prepare`, `services`, `probe`, `ready`, then, for a stop,
/// `quiesced` (browsers closed) and `sigterm` (the engine's stop arrived).
/// Diagnostic only: it reads the supervisor's human log lines.
pub(crate) fn milestone(logs: &str) -> &'static str {
    let milestones = [
        ("stopping signal=", "sigterm"),
        ("browsers closed", "quiesced"),
        ("self-probe", "ready"),
        ("service ready service=\"vnc\"", "probe"),
        ("prepared", "services"),
        ("supervisor starting", "prepare"),
    ];
    for (needle, name) in milestones {
        let found = logs.lines().any(|line| {
            line.contains(needle) && (needle != "self-probe" || line.contains("overall=Ok"))
        });
        if found {
            return name;
        }
    }
    "boot"
}

/// The reason a killed desktop shows must be one the broker can stand by:
/// never `idle`, and `manual` only when a manual stop was under way.
pub(crate) fn check_reason(moment: Moment, status: &ComputerStatus) -> Result<()> {
    let fine = match status.stop_reason {
        None | Some(StopReason::Killed) => true,
        Some(StopReason::Manual) => moment == Moment::Stop,
        Some(_) => false,
    };
    ensure!(
        fine,
        "a kill at {moment} shows stop_reason {:?}: {status:?}",
        status.stop_reason
    );
    ensure!(
        status.resumable,
        "a killed desktop must be resumable: {:?}",
        status.resumable_problem
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    #[test]
    fn milestones_follow_the_supervisor_log() {
        assert_eq!(milestone(""), "boot");
        assert_eq!(milestone("INFO supervisor starting version=1"), "prepare");
        assert_eq!(milestone("x\nINFO prepared new_start=true"), "services");
        assert_eq!(
            milestone("INFO service ready service=\"vnc\" pid=14"),
            "probe"
        );
        assert_eq!(milestone("INFO self-probe epoch=1 overall=Fail"), "boot");
        assert_eq!(milestone("INFO self-probe epoch=7 overall=Ok"), "ready");
        assert_eq!(milestone("INFO browsers closed closed=[]"), "quiesced");
        assert_eq!(milestone("INFO stopping signal=SIGTERM"), "sigterm");
    }

    #[test]
    fn a_kill_never_shows_idle_and_shows_manual_only_mid_stop() {
        let mut status: ComputerStatus = serde_json::from_value(serde_json::json!({
            "id": Uuid::nil(), "name": "x", "owner": "o", "container": "stopped",
            "ready": false, "phase": null, "problem": null, "stop_reason": null,
            "stopped_at": null, "resumable": true, "resumable_problem": null,
            "generation": 1, "health": null, "image_id": "sha256:x", "idle": null
        }))
        .expect("a status");
        assert!(check_reason(Moment::Ready, &status).is_ok());
        status.stop_reason = Some(StopReason::Killed);
        assert!(check_reason(Moment::Boot, &status).is_ok());
        status.stop_reason = Some(StopReason::Manual);
        assert!(check_reason(Moment::Ready, &status).is_err());
        assert!(check_reason(Moment::Stop, &status).is_ok());
        status.stop_reason = Some(StopReason::Idle);
        assert!(check_reason(Moment::Stop, &status).is_err());
        status.stop_reason = None;
        status.resumable = false;
        assert!(check_reason(Moment::Ready, &status).is_err());
    }
}
