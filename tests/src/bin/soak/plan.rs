//! What a soak cycle does: the fault ([`Fault`]) and the activity it is
//! timed against ([`Activity`]), drawn by seed so a run is repeatable. Pure:
//! it starts and kills nothing.

use std::fmt;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// How a desktop (or the broker) is brought down in a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Fault {
    /// `docker kill -s KILL` of one desktop, behind the broker's back.
    DockerKill,
    /// `POST /v1/computers/{id}/stop` of one desktop.
    GracefulStop,
    /// A short idle window set with `PATCH`, and waiting for the broker's
    /// idle stop.
    IdleStop,
    /// SIGKILL of the broker (every desktop keeps running).
    BrokerKill,
    /// SIGTERM of the broker and a new one on the same data directory.
    BrokerRestart,
}

pub(crate) const FAULTS: [Fault; 5] = [
    Fault::DockerKill,
    Fault::GracefulStop,
    Fault::IdleStop,
    Fault::BrokerKill,
    Fault::BrokerRestart,
];

impl Fault {
    /// Whether the fault takes the broker down (else one desktop).
    pub(crate) fn hits_broker(self) -> bool {
        matches!(self, Self::BrokerKill | Self::BrokerRestart)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::DockerKill => "docker-kill",
            Self::GracefulStop => "graceful-stop",
            Self::IdleStop => "idle-stop",
            Self::BrokerKill => "broker-sigkill",
            Self::BrokerRestart => "broker-restart",
        })
    }
}

/// What runs on a desktop while the fault lands; the cycle's target runs
/// the one the fault is timed against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Activity {
    /// Action batches typing into the witness terminal.
    Typing,
    /// An open view screen receiving frames and an open control screen.
    Screen,
    /// `exec/ws` streaming a command's output.
    Exec,
    /// The file write loop (it runs on every desktop in every cycle; as the
    /// moment, the fault lands after a few acknowledged writes).
    FileWrites,
    /// `GET …/workspace` streaming an export.
    Export,
    /// `PUT …/workspace` into another, stopped desktop.
    Import,
}

pub(crate) const ACTIVITIES: [Activity; 6] = [
    Activity::Typing,
    Activity::Screen,
    Activity::Exec,
    Activity::FileWrites,
    Activity::Export,
    Activity::Import,
];

/// What the desktops other than the target run beside the file writes.
pub(crate) const BACKGROUND: [Activity; 4] = [
    Activity::Typing,
    Activity::Screen,
    Activity::Exec,
    Activity::Export,
];

impl fmt::Display for Activity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Typing => "typing",
            Self::Screen => "screen",
            Self::Exec => "exec",
            Self::FileWrites => "file-writes",
            Self::Export => "export",
            Self::Import => "import",
        })
    }
}

/// One cycle's draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) fault: Fault,
    pub(crate) moment: Activity,
}

/// `cycles` steps: shuffled blocks of every (fault, moment) pair, so each
/// pair comes equally often. An import needs a second desktop to stop, so
/// with one desktop the import moment is left out.
pub(crate) fn plan(rng: &mut StdRng, cycles: usize, desktops: usize) -> Vec<Step> {
    let mut pairs = Vec::new();
    for fault in FAULTS {
        for moment in ACTIVITIES {
            if moment == Activity::Import && desktops < 2 {
                continue;
            }
            pairs.push(Step { fault, moment });
        }
    }
    let mut steps = Vec::with_capacity(cycles + pairs.len());
    while steps.len() < cycles {
        let mut block = pairs.clone();
        block.shuffle(rng);
        steps.extend(block);
    }
    steps.truncate(cycles);
    steps
}

/// `90`, `90s`, `45m`, `2h` as a duration.
pub(crate) fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .with_context(|| format!("a duration like 90s, 45m or 2h, not {text:?}"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => bail!("a duration like 90s, 45m or 2h, not {text:?}"),
    };
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::SeedableRng;

    use super::*;

    #[test]
    fn every_pair_comes_equally_often_and_a_seed_repeats() {
        let mut rng = StdRng::seed_from_u64(7);
        let steps = plan(&mut rng, 60, 4);
        let mut count: BTreeMap<(Fault, Activity), usize> = BTreeMap::new();
        for s in &steps {
            *count.entry((s.fault, s.moment)).or_default() += 1;
        }
        assert_eq!(count.len(), 30);
        assert!(count.values().all(|&c| c == 2), "{count:?}");
        let again = plan(&mut StdRng::seed_from_u64(7), 60, 4);
        assert_eq!(steps, again);
    }

    #[test]
    fn one_desktop_has_no_import() {
        let steps = plan(&mut StdRng::seed_from_u64(1), 50, 1);
        assert_eq!(steps.len(), 50);
        assert!(steps.iter().all(|s| s.moment != Activity::Import));
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("45m").unwrap(), Duration::from_secs(2700));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_duration("2d").is_err());
        assert!(parse_duration("m").is_err());
    }
}
