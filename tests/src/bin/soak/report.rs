//! What a soak run counts ([`Stats`]), the process measurements it takes
//! ([`Metrics`]) and the table it prints at the end, also when it stops on
//! its time limit or a signal.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};
use dormouse_e2e::broker::memory_kib;
use dormouse_e2e::latency::{ms, Samples};

/// Resident memory and open descriptors at one cycle.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    pub(crate) cycle: usize,
    pub(crate) broker_rss_kib: u64,
    pub(crate) broker_fds: usize,
    /// The cycle after which the measured broker process started.
    pub(crate) broker_since: usize,
    /// The largest supervisor (a desktop's PID 1) resident set.
    pub(crate) supervisor_rss_kib: u64,
    /// The cycle after which that supervisor's container last started.
    pub(crate) supervisor_since: usize,
    /// Every desktop's supervisor: (cycle its container started after,
    /// RSS KiB), `None` when it could not be measured.
    pub(crate) supervisors: Vec<Option<(usize, u64)>>,
}

/// One process's life as sampled after each cycle: the cycle after which
/// it started, and its first and last samples (cycle, RSS KiB). A broker
/// or supervisor restarted by a fault starts a new life, so a leak shows
/// as growth within a long life, not between the cycles 100 and N.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Life {
    pub(crate) since: usize,
    pub(crate) first: (usize, u64),
    pub(crate) last: (usize, u64),
}

impl Life {
    fn cycles(&self) -> usize {
        self.last.0 - self.first.0
    }

    fn show(life: &Option<Life>) -> String {
        match life {
            Some(l) => format!(
                "{} → {} KiB over cycles {}→{}",
                l.first.1, l.last.1, l.first.0, l.last.0
            ),
            None => "-".into(),
        }
    }
}

/// Adds a sample of a process that started after cycle `since`.
fn observe(now: &mut Option<Life>, best: &mut Option<Life>, since: usize, sample: (usize, u64)) {
    match now {
        Some(life) if life.since == since => life.last = sample,
        _ => {
            *now = Some(Life {
                since,
                first: sample,
                last: sample,
            });
        }
    }
    if let Some(life) = now {
        if best.as_ref().is_none_or(|b| life.cycles() >= b.cycles()) {
            *best = Some(life.clone());
        }
    }
}

/// The resident set (KiB) and open descriptors of host process `pid`.
pub(crate) fn measure(pid: u32) -> Result<(u64, usize)> {
    let (rss, _) = memory_kib(pid)?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("/proc/{pid}/fd"))?
        .count();
    Ok((rss, fds))
}

/// Everything a run counts.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) seed: u64,
    pub(crate) planned: usize,
    pub(crate) desktops: usize,
    pub(crate) cycles: usize,
    pub(crate) failures: usize,
    pub(crate) files_acked: usize,
    pub(crate) lost_files: usize,
    pub(crate) imports_acked: usize,
    /// Imports the API did not acknowledge, found whole / absent.
    pub(crate) imports_cut_whole: usize,
    pub(crate) imports_cut_absent: usize,
    /// Acknowledged imports not whole, and any import found half done.
    pub(crate) lost_imports: usize,
    pub(crate) typed_acked: usize,
    /// Typed text the witness had saved before the fault, missing after.
    pub(crate) lost_typed: usize,
    /// Typed text the API acknowledged that the witness had not saved
    /// when the fault landed and never saved (see `witness`).
    pub(crate) typed_acked_unsaved: usize,
    pub(crate) exports_acked: usize,
    pub(crate) exports_bad: usize,
    pub(crate) leftover_execs: usize,
    pub(crate) zombies: usize,
    /// Import staging or set-aside trees left on the host.
    pub(crate) staging_leftovers: usize,
    pub(crate) resumes: Samples,
    /// Per fault: cycles and failed cycles.
    pub(crate) per_fault: BTreeMap<String, (usize, usize)>,
    /// Per moment: cycles and how often the activity was still in flight
    /// when the fault landed.
    pub(crate) in_flight: BTreeMap<String, (usize, usize)>,
    pub(crate) at_100: Option<Metrics>,
    pub(crate) last: Option<Metrics>,
    pub(crate) max_broker_fds: usize,
    pub(crate) ended: String,
    pub(crate) broker_life: Option<Life>,
    /// The longest-lived broker process.
    pub(crate) broker_longest: Option<Life>,
    pub(crate) supervisor_lives: Vec<Option<Life>>,
    /// The longest-lived supervisor.
    pub(crate) supervisor_longest: Option<Life>,
}

impl Stats {
    /// Takes the sample after cycle `n`: kept at cycle 100 and as the
    /// last, the largest descriptor count, and the processes' lives.
    pub(crate) fn sample(&mut self, m: Metrics) {
        self.max_broker_fds = self.max_broker_fds.max(m.broker_fds);
        observe(
            &mut self.broker_life,
            &mut self.broker_longest,
            m.broker_since,
            (m.cycle, m.broker_rss_kib),
        );
        if self.supervisor_lives.len() < m.supervisors.len() {
            self.supervisor_lives.resize(m.supervisors.len(), None);
        }
        for (i, sample) in m.supervisors.iter().enumerate() {
            let Some((since, rss)) = sample else {
                continue;
            };
            observe(
                &mut self.supervisor_lives[i],
                &mut self.supervisor_longest,
                *since,
                (m.cycle, *rss),
            );
        }
        if m.cycle == 100 {
            self.at_100 = Some(m.clone());
        }
        self.last = Some(m);
    }

    /// Losses of acknowledged data of any kind.
    pub(crate) fn lost(&self) -> usize {
        self.lost_files + self.lost_imports + self.lost_typed
    }

    /// The run's table, as markdown.
    pub(crate) fn table(&self) -> String {
        let mut t = String::new();
        let p = |q: f64| ms(self.resumes.percentile(q));
        let metric = |m: &Option<Metrics>, f: &dyn Fn(&Metrics) -> String| {
            m.as_ref().map(f).unwrap_or_else(|| "-".into())
        };
        let rows: Vec<(&str, String)> = vec![
            ("seed", self.seed.to_string()),
            ("desktops", self.desktops.to_string()),
            (
                "cycles (planned)",
                format!("{} ({})", self.cycles, self.planned),
            ),
            ("ended by", self.ended.clone()),
            ("failed cycles", self.failures.to_string()),
            (
                "lost acknowledged writes (files / imports / typed)",
                format!(
                    "{} / {} / {}",
                    self.lost_files, self.lost_imports, self.lost_typed
                ),
            ),
            ("file writes acknowledged", self.files_acked.to_string()),
            (
                "imports acknowledged / cut and whole / cut and absent",
                format!(
                    "{} / {} / {}",
                    self.imports_acked, self.imports_cut_whole, self.imports_cut_absent
                ),
            ),
            ("typed batches acknowledged", self.typed_acked.to_string()),
            (
                "typed: acknowledged, never saved by the witness",
                self.typed_acked_unsaved.to_string(),
            ),
            (
                "exports acknowledged / malformed",
                format!("{} / {}", self.exports_acked, self.exports_bad),
            ),
            (
                "resume p50 / p95 / p99 / max (ms)",
                format!(
                    "{} / {} / {} / {}",
                    p(50.0),
                    p(95.0),
                    p(99.0),
                    ms(self.resumes.max())
                ),
            ),
            ("resumes measured", self.resumes.len().to_string()),
            (
                "broker RSS KiB at cycle 100 / at end",
                format!(
                    "{} / {}",
                    metric(&self.at_100, &rss_broker),
                    metric(&self.last, &rss_broker)
                ),
            ),
            (
                "largest supervisor RSS KiB at cycle 100 / at end",
                format!(
                    "{} / {}",
                    metric(&self.at_100, &rss_supervisor),
                    metric(&self.last, &rss_supervisor)
                ),
            ),
            (
                "longest-lived broker process, RSS first → last sample",
                Life::show(&self.broker_longest),
            ),
            (
                "longest-lived supervisor, RSS first → last sample",
                Life::show(&self.supervisor_longest),
            ),
            (
                "broker open fds at cycle 100 / at end / max",
                format!(
                    "{} / {} / {}",
                    metric(&self.at_100, &|m| m.broker_fds.to_string()),
                    metric(&self.last, &|m| m.broker_fds.to_string()),
                    self.max_broker_fds
                ),
            ),
            (
                "leftover processes in guests (exec / zombies)",
                format!("{} / {}", self.leftover_execs, self.zombies),
            ),
            (
                "import leftovers on the host (staging / set-aside trees)",
                self.staging_leftovers.to_string(),
            ),
        ];
        let _ = writeln!(t, "| measure | value |\n|---|---|");
        for (k, v) in rows {
            let _ = writeln!(t, "| {k} | {v} |");
        }
        let _ = writeln!(t, "\n| fault | cycles | failed |\n|---|---|---|");
        for (fault, (n, failed)) in &self.per_fault {
            let _ = writeln!(t, "| {fault} | {n} | {failed} |");
        }
        let _ = writeln!(
            t,
            "\n| moment | cycles | activity still in flight at the fault |\n|---|---|---|"
        );
        for (moment, (n, hit)) in &self.in_flight {
            let _ = writeln!(t, "| {moment} | {n} | {hit} |");
        }
        t
    }

    /// One line, for scripts (`scripts/test` greps it).
    pub(crate) fn summary(&self) -> String {
        format!(
            "cycles={} failures={} lost_files={} lost_imports={} lost_typed={} typed_acked_unsaved={} \
             leftover_execs={} zombies={} resume_p50_ms={} resume_p95_ms={} resume_p99_ms={} resume_max_ms={}",
            self.cycles,
            self.failures,
            self.lost_files,
            self.lost_imports,
            self.lost_typed,
            self.typed_acked_unsaved,
            self.leftover_execs,
            self.zombies,
            ms(self.resumes.p50()),
            ms(self.resumes.p95()),
            ms(self.resumes.percentile(99.0)),
            ms(self.resumes.max()),
        )
    }
}

fn rss_broker(m: &Metrics) -> String {
    format!(
        "{} (cycle {}, process since cycle {})",
        m.broker_rss_kib, m.cycle, m.broker_since
    )
}

fn rss_supervisor(m: &Metrics) -> String {
    format!(
        "{} (cycle {}, container since cycle {})",
        m.supervisor_rss_kib, m.cycle, m.supervisor_since
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_table_names_every_measure_and_the_summary_parses() {
        let mut stats = Stats {
            cycles: 3,
            lost_files: 1,
            ..Stats::default()
        };
        stats.resumes.push(Duration::from_millis(900));
        stats.per_fault.insert("docker-kill".into(), (3, 1));
        let table = stats.table();
        assert!(table.contains("| resume p50 / p95 / p99 / max (ms) | 900 / 900 / 900 / 900 |"));
        assert!(table.contains("| docker-kill | 3 | 1 |"));
        assert!(
            table.contains("| lost acknowledged writes (files / imports / typed) | 1 / 0 / 0 |")
        );
        assert_eq!(stats.lost(), 1);
        assert!(stats
            .summary()
            .starts_with("cycles=3 failures=0 lost_files=1 "));
    }

    #[test]
    fn a_restart_starts_a_new_life_and_the_longest_is_kept() {
        let mut stats = Stats::default();
        let m = |cycle, since, rss| Metrics {
            cycle,
            broker_since: since,
            broker_rss_kib: rss,
            supervisors: vec![Some((0, rss / 10))],
            ..Metrics::default()
        };
        for (cycle, since, rss) in [
            (1, 0, 100),
            (2, 0, 110),
            (3, 0, 120),
            (4, 3, 90),
            (5, 3, 95),
        ] {
            stats.sample(m(cycle, since, rss));
        }
        let longest = stats.broker_longest.clone().unwrap();
        assert_eq!((longest.first, longest.last), ((1, 100), (3, 120)));
        assert_eq!(stats.supervisor_longest.unwrap().first, (1, 10));
        assert_eq!(stats.last.unwrap().cycle, 5);
    }

    #[test]
    fn this_process_can_be_measured() {
        let (rss, fds) = measure(std::process::id()).unwrap();
        assert!(rss > 0 && fds > 0);
    }
}
