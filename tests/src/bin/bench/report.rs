//! The report of `dormouse-bench`: the table of times, the memory table,
//! and every ratio beside the target it is checked against (printed, never
//! asserted). Prints only; it measures nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use dormouse_e2e::latency::{ms, Samples};

use super::{Args, DesktopNumbers, Memory};

/// Targets from the issue, checked and printed (never asserted).
const TARGET_RESUME_RATIO: f64 = 0.7;
const TARGET_OVER_FLOOR: Duration = Duration::from_millis(250);
const TARGET_STOP_RATIO: f64 = 0.1;
const TARGET_SUPERVISOR_RSS_KIB: u64 = 4 * 1024;

/// One row of the table.
#[derive(Debug)]
struct Row {
    label: String,
    samples: Samples,
    note: String,
}

impl Row {
    fn new(label: &str, samples: Samples, note: impl Into<String>) -> Self {
        Self {
            label: label.to_owned(),
            samples,
            note: note.into(),
        }
    }
}

/// One figure of [`Memory`], for a table row.
type PickMemory = fn(&Memory) -> Option<u64>;

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn ratio(a: Option<Duration>, b: Option<Duration>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if !b.is_zero() => Some(a.as_secs_f64() / b.as_secs_f64()),
        _ => None,
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn codes(map: &BTreeMap<i64, usize>) -> String {
    map.iter()
        .map(|(code, n)| format!("{code}×{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prints the whole report: the times, the memory, the targets, the notes.
pub(crate) fn print_report(
    image: &str,
    args: &Args,
    floor_cli: &Samples,
    floor_api: &Samples,
    d: &DesktopNumbers,
    s: &DesktopNumbers,
) {
    print_times(image, args, floor_cli, floor_api, d, s);
    print_memory(d, s);
    print_targets(floor_cli, floor_api, d, s);
    for note in d.notes.iter().chain(&s.notes) {
        println!("  note: {note}");
    }
}

/// The table of times: the floors, Dormouse's and the shell's.
fn print_times(
    image: &str,
    args: &Args,
    floor_cli: &Samples,
    floor_api: &Samples,
    d: &DesktopNumbers,
    s: &DesktopNumbers,
) {
    let mut rows = vec![
        Row::new(
            "floor: docker start (CLI), trivial container",
            floor_cli.clone(),
            "",
        ),
        Row::new(
            "floor: engine API start, trivial container",
            floor_api.clone(),
            "",
        ),
        Row::new(
            "dormouse: resume after stop -> ready (pushed)",
            d.resume_after_stop.clone(),
            "",
        ),
        Row::new(
            "dormouse: resume after kill -> ready (pushed)",
            d.resume_after_kill.clone(),
            "",
        ),
        Row::new(
            "  of which: POST start -> container running",
            d.engine_part.clone(),
            "broker checks + engine start",
        ),
        Row::new(
            "  of which: container running -> ready",
            d.guest_part.clone(),
            "supervisor: prepare, services, probe",
        ),
    ];
    // The supervisor's own clock: when each phase of a start ended, in the
    // order a start takes them.
    let in_order = [
        "prepared",
        "proxy",
        "x",
        "vnc",
        "window_manager",
        "ready",
        "taskbar",
    ];
    for (name, samples) in in_order
        .iter()
        .filter_map(|name| d.phases.get(name).map(|s| (name, s)))
    {
        rows.push(Row::new(
            &format!("    supervisor: {name} done"),
            samples.clone(),
            "ms after the supervisor started (its own clock)",
        ));
    }
    rows.extend([
        Row::new(
            "shell: start after stop -> ready (50 ms poll)",
            s.resume_after_stop.clone(),
            "",
        ),
        Row::new(
            "shell: start after kill -> ready (50 ms poll)",
            s.resume_after_kill.clone(),
            "",
        ),
        Row::new(
            "shell: start after kill -> ready (2000 ms poll)",
            s.slow_poll_resume.clone(),
            "",
        ),
        Row::new(
            "dormouse: graceful stop (docker stop)",
            d.graceful_stop.clone(),
            format!("exit {}", codes(&d.exit_codes)),
        ),
        Row::new(
            "dormouse: stop through the API (quiesce + stop)",
            d.api_stop.clone(),
            "",
        ),
        Row::new(
            "shell: graceful stop (docker stop)",
            s.graceful_stop.clone(),
            format!("exit {}", codes(&s.exit_codes)),
        ),
    ]);
    println!();
    println!("dormouse bench: image {image}");
    println!(
        "runs: {} resumes per kind, {} slow-poll, {} stops; times in ms",
        args.runs, args.slow_poll_runs, args.stop_runs
    );
    println!();
    println!(
        "{:<50} {:>4} {:>7} {:>7} {:>7} {:>7}  note",
        "measurement", "n", "min", "p50", "p95", "max"
    );
    for row in &rows {
        println!(
            "{:<50} {:>4} {:>7} {:>7} {:>7} {:>7}  {}",
            row.label,
            row.samples.len(),
            ms(row.samples.min()),
            ms(row.samples.p50()),
            ms(row.samples.p95()),
            ms(row.samples.max()),
            row.note
        );
    }
}

/// The memory of each desktop at idle, and its first start.
fn print_memory(d: &DesktopNumbers, s: &DesktopNumbers) {
    println!();
    println!(
        "{:<50} {:>14} {:>14}",
        "memory at idle", "dormouse", "shell"
    );
    let memory_rows: [(&str, PickMemory); 3] = [
        ("PID 1 RSS (supervisor / sleep)", |m| Some(m.pid1_rss_kib)),
        ("desktop, sum of process RSS", |m| Some(m.processes_rss_kib)),
        ("desktop, engine memory usage (docker stats)", |m| {
            m.cgroup_kib
        }),
    ];
    for (label, pick) in memory_rows {
        let column = |m: &Option<Memory>| {
            m.as_ref()
                .and_then(pick)
                .map(mib)
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{:<50} {:>14} {:>14}",
            label,
            column(&d.memory),
            column(&s.memory)
        );
    }
    println!(
        "{:<50} {:>14} {:>14}",
        "first start -> ready (cold)",
        format!("{} ms", ms(d.first_ready)),
        format!("{} ms", ms(s.first_ready))
    );
}

/// Every ratio beside the target it is checked against.
fn print_targets(floor_cli: &Samples, floor_api: &Samples, d: &DesktopNumbers, s: &DesktopNumbers) {
    println!();
    println!("ratios (dormouse / shell) and targets");
    for (label, dormouse_p50, shell_fast) in [
        (
            "resume after stop",
            d.resume_after_stop.p50(),
            s.resume_after_stop.p50(),
        ),
        (
            "resume after kill",
            d.resume_after_kill.p50(),
            s.resume_after_kill.p50(),
        ),
    ] {
        match ratio(dormouse_p50, shell_fast) {
            Some(r) => println!(
                "  {label}: p50 {} ms / shell 50 ms-poll p50 {} ms = {r:.2} (target <= {TARGET_RESUME_RATIO}): {}",
                ms(dormouse_p50),
                ms(shell_fast),
                verdict(r <= TARGET_RESUME_RATIO)
            ),
            None => println!("  {label}: no ratio (missing samples)"),
        }
        for (floor_label, floor) in [
            ("CLI floor", floor_cli.p50()),
            ("engine API floor", floor_api.p50()),
        ] {
            if let (Some(p50), Some(floor)) = (dormouse_p50, floor) {
                let over = p50.saturating_sub(floor);
                println!(
                    "  {label}: p50 {} ms = {floor_label} {} ms + {} ms (target <= +{} ms): {}",
                    p50.as_millis(),
                    floor.as_millis(),
                    over.as_millis(),
                    TARGET_OVER_FLOOR.as_millis(),
                    verdict(over <= TARGET_OVER_FLOOR)
                );
            }
        }
    }
    if let Some(r) = ratio(d.resume_after_kill.p50(), s.slow_poll_resume.p50()) {
        println!("  resume after kill vs the shell with 2000 ms polling: {r:.2}");
    }
    match ratio(d.graceful_stop.p50(), s.graceful_stop.p50()) {
        Some(r) => println!(
            "  graceful stop: p50 {} ms / {} ms = {r:.3} (target <= {TARGET_STOP_RATIO}): {}",
            ms(d.graceful_stop.p50()),
            ms(s.graceful_stop.p50()),
            verdict(r <= TARGET_STOP_RATIO)
        ),
        None => println!("  graceful stop: no ratio (missing samples)"),
    }
    if let Some(memory) = &d.memory {
        println!(
            "  supervisor RSS: {} (target <= 4 MiB): {}",
            mib(memory.pid1_rss_kib),
            verdict(memory.pid1_rss_kib <= TARGET_SUPERVISOR_RSS_KIB)
        );
    }
    let figure = |m: &Option<Memory>| m.as_ref().and_then(|m| m.cgroup_kib);
    if let (Some(dm), Some(sm)) = (figure(&d.memory), figure(&s.memory)) {
        if sm > 0 {
            println!(
                "  desktop memory at idle (engine figure): {:.2}",
                dm as f64 / sm as f64
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_need_both_sides() {
        let a = Some(Duration::from_millis(300));
        let b = Some(Duration::from_millis(1200));
        assert_eq!(ratio(a, b), Some(0.25));
        assert_eq!(ratio(a, None), None);
        assert_eq!(ratio(a, Some(Duration::ZERO)), None);
    }
}
