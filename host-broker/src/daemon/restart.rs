//! The flags of coming back after a host restart: which desktops the
//! broker starts again once its start-up reconcile is done, and how many at
//! once (`--resume-after-restart`, `--resume-concurrency`).
//!
//! It only parses and fills [`BrokerConfig`]; the decision (which desktops
//! were running when the host went down) and the starts are the owner's
//! (`dormouse_core::owner`, its `restart` module).

use dormouse_core::config::{BrokerConfig, ResumeAfterRestart};

/// Which desktops are started again after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResumeMode {
    /// Those that were running when the host (or the engine) went down.
    Running,
    /// None: every desktop stays as the reconcile found it.
    None,
}

/// The flags, flattened into `dormoused`'s.
#[derive(Debug, Clone, clap::Args)]
pub struct RestartArgs {
    /// After the start-up reconcile, start again the desktops that were
    /// running when the host or the engine went down (`running`), or none.
    #[arg(long, value_enum, value_name = "WHICH", default_value_t = ResumeMode::Running)]
    pub resume_after_restart: ResumeMode,
    /// How many of those start (and boot until ready) at once (1-64)
    /// [default: the number of CPUs].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub resume_concurrency: Option<u16>,
}

impl RestartArgs {
    /// Fills the broker core's configuration.
    pub fn apply(&self, config: &mut BrokerConfig) {
        config.resume_after_restart = match self.resume_after_restart {
            ResumeMode::Running => ResumeAfterRestart::Running,
            ResumeMode::None => ResumeAfterRestart::None,
        };
        config.resume_concurrency = self
            .resume_concurrency
            .map_or_else(default_concurrency, usize::from);
    }
}

/// The number of CPUs this process may use (1 when unknown), at most 64.
fn default_concurrency() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(64)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::Parser as _;

    use super::*;
    use crate::daemon::DaemonArgs;

    fn config(args: &[&str]) -> BrokerConfig {
        DaemonArgs::try_parse_from(args)
            .expect("flags parse")
            .broker_config(PathBuf::from("/nonexistent"))
    }

    #[test]
    fn by_default_running_desktops_come_back_one_per_cpu_at_a_time() {
        let config = config(&["dormoused"]);
        assert_eq!(config.resume_after_restart, ResumeAfterRestart::Running);
        assert_eq!(config.resume_concurrency, default_concurrency());
        assert!(config.resume_concurrency >= 1);
    }

    #[test]
    fn the_flags_set_the_policy_and_the_concurrency() {
        let config = config(&[
            "dormoused",
            "--resume-after-restart",
            "none",
            "--resume-concurrency",
            "7",
        ]);
        assert_eq!(config.resume_after_restart, ResumeAfterRestart::None);
        assert_eq!(config.resume_concurrency, 7);
    }

    #[test]
    fn out_of_range_values_are_usage_errors() {
        for bad in [
            &["dormoused", "--resume-after-restart", "all"][..],
            &["dormoused", "--resume-concurrency", "0"],
            &["dormoused", "--resume-concurrency", "65"],
        ] {
            let err = DaemonArgs::try_parse_from(bad).expect_err("refused");
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }
}
