//! One soak cycle: loads on every desktop, the fault timed against the
//! target's activity, the resume, and the oracle over what the API
//! acknowledged.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::fleet::{Desk, Fleet};
use crate::load::{self, Ctx, ExportOutcome, Report, Running};
use crate::oracle::{self, ImportState};
use crate::plan::{Activity, Fault, Step, BACKGROUND};
use crate::{lock, witness, Shared};

/// Longest wait for the target's activity to reach its moment.
const MOMENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a load may take to end after the cycle's stop.
const LOAD_END_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs cycle `n`; a line for the log, or why it failed.
pub(crate) async fn run(
    fleet: &mut Fleet,
    n: usize,
    step: Step,
    seed: u64,
    stats: &Shared,
) -> Result<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let count = fleet.desks.len();
    let target = rng.gen_range(0..count);
    let import_desk = (step.moment == Activity::Import)
        .then(|| (target + 1 + rng.gen_range(0..count - 1)) % count);
    if let Some(i) = import_desk {
        fleet
            .stop(i)
            .await
            .context("stopping the import's desktop")?;
    }

    // ---- loads ----------------------------------------------------------
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut loads: Vec<(usize, Running)> = Vec::new();
    let mut timing = None;
    for i in 0..count {
        let ctx = |kind: &str, seed: u64| Ctx {
            api: fleet.api.clone(),
            id: fleet.desks[i].id,
            guest: fleet.desks[i].guest.clone(),
            ws_base: fleet.ws_base(),
            tag: format!("c{n}d{i}{kind}"),
            seed,
        };
        if Some(i) == import_desk {
            timing = Some(loads.len());
            let import = load::spawn(Activity::Import, ctx("i", rng.gen()), stop_rx.clone());
            loads.push((i, import));
            continue;
        }
        if i == target && step.moment == Activity::FileWrites {
            timing = Some(loads.len());
        }
        let writes = load::spawn(Activity::FileWrites, ctx("w", rng.gen()), stop_rx.clone());
        loads.push((i, writes));
        let moment_here =
            i == target && !matches!(step.moment, Activity::FileWrites | Activity::Import);
        let activity = if moment_here {
            timing = Some(loads.len());
            step.moment
        } else {
            BACKGROUND[rng.gen_range(0..BACKGROUND.len())]
        };
        loads.push((
            i,
            load::spawn(activity, ctx("a", rng.gen()), stop_rx.clone()),
        ));
    }
    let timing = timing.context("no load times the fault")?;

    // ---- the moment and the fault ----------------------------------------
    let waited = Instant::now();
    while !loads[timing].1.reached() && waited.elapsed() < MOMENT_TIMEOUT {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(rng.gen_range(0..300))).await;
    // An idle stop needs every activity ended first (that is what idle
    // means), so its moment is "just after", never in flight.
    let in_flight = step.fault != Fault::IdleStop && !loads[timing].1.task.is_finished();
    let reports = if step.fault == Fault::IdleStop {
        let reports = end_loads(&stop_tx, loads).await;
        fleet.idle_stop(target).await?;
        reports
    } else {
        let landed = fleet.land(step.fault, target).await;
        // In-flight calls meet the fault before the loads are told to end.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let reports = end_loads(&stop_tx, loads).await;
        landed.with_context(|| format!("landing {}", step.fault))?;
        reports
    };
    {
        let mut s = lock(stats);
        let e = s.in_flight.entry(step.moment.to_string()).or_default();
        e.0 += 1;
        e.1 += usize::from(in_flight);
    }

    // ---- the resume -----------------------------------------------------
    let took = fleet.resume(step.fault, target, import_desk, n).await?;
    lock(stats).resumes.push(took);

    // ---- the oracle -----------------------------------------------------
    let mut problems = Vec::new();
    let mut line = format!(
        "target={target} in_flight={in_flight} resume_ms={}",
        took.as_millis()
    );
    let mut per_desk: Vec<Vec<Report>> = (0..count).map(|_| Vec::new()).collect();
    for (i, report) in reports {
        per_desk[i].push(report);
    }
    if let Some(i) = import_desk {
        for report in &per_desk[i] {
            if let Some(outcome) = &report.import {
                let workspace = fleet.broker.workspace(fleet.desks[i].id);
                let state = oracle::import_state(&workspace, outcome);
                let _ = write!(line, " import(acked={} {state:?})", outcome.acked);
                let mut s = lock(stats);
                match (&state, outcome.acked) {
                    (ImportState::Whole, true) => s.imports_acked += 1,
                    (ImportState::Whole, false) => s.imports_cut_whole += 1,
                    (ImportState::Absent, false) => s.imports_cut_absent += 1,
                    _ => {
                        s.lost_imports += 1;
                        problems.push(format!(
                            "import into desktop {i} (acked {}, error {:?}) is {state:?}",
                            outcome.acked, outcome.error
                        ));
                    }
                }
                drop(s);
                oracle::settle_import(&mut fleet.desks[i].expected, outcome, &state);
            }
        }
        fleet
            .start(i, n)
            .await
            .context("starting the import's desktop")?;
    }
    for (i, reports) in per_desk.into_iter().enumerate() {
        witness::ensure(&fleet.desks[i].guest).await?;
        let unconfirmed = absorb(
            i,
            reports,
            &mut fleet.desks[i],
            stats,
            &mut line,
            &mut problems,
        );
        let workspace = fleet.broker.workspace(fleet.desks[i].id);
        let desk = &mut fleet.desks[i];
        let lost = oracle::lost_files(&workspace, &mut desk.expected);
        let typed = oracle::check_typed(&desk.guest, &mut desk.expected, unconfirmed).await?;
        let (execs, zombies) = oracle::leftovers(&desk.guest).await?;
        let staging = oracle::staging_leftovers(&workspace);
        let mut s = lock(stats);
        s.lost_files += lost.len();
        s.lost_typed += typed.lost.len();
        s.typed_acked_unsaved += typed.unsaved;
        s.leftover_execs += execs;
        s.zombies += zombies;
        s.staging_leftovers += staging.len();
        drop(s);
        if !lost.is_empty() {
            problems.push(format!("desktop {i}: acknowledged files lost: {lost:?}"));
        }
        if !typed.lost.is_empty() {
            problems.push(format!(
                "desktop {i}: saved typed text lost: {:?}",
                typed.lost
            ));
        }
        if typed.unsaved > 0 {
            let _ = write!(line, " d{i}:typed_acked_unsaved={}", typed.unsaved);
        }
        if !staging.is_empty() {
            problems.push(format!(
                "desktop {i}: import leftovers on the host: {staging:?}"
            ));
        }
        if execs > 0 || zombies > 0 {
            problems.push(format!(
                "desktop {i}: {execs} exec leftovers, {zombies} zombies"
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(line)
}

/// Adds what desktop `i`'s loads saw acknowledged to what it must hold and
/// to the counts; returns the typed tokens not yet seen saved.
fn absorb(
    i: usize,
    reports: Vec<Report>,
    desk: &mut Desk,
    stats: &Shared,
    line: &mut String,
    problems: &mut Vec<String>,
) -> Vec<String> {
    let mut unconfirmed = Vec::new();
    let mut s = lock(stats);
    for r in reports {
        s.files_acked += r.files.len();
        s.typed_acked += r.typed_saved.len() + r.typed_unconfirmed.len();
        if let Some(note) = &r.note {
            let _ = write!(line, " d{i}:[{note}]");
        }
        if r.frames > 0 || r.exec_chunks > 0 {
            let _ = write!(line, " d{i}:frames={},exec={}", r.frames, r.exec_chunks);
        }
        if !r.files.is_empty() || !r.typed_saved.is_empty() || !r.typed_unconfirmed.is_empty() {
            let _ = write!(
                line,
                " d{i}:files={},typed={}+{}",
                r.files.len(),
                r.typed_saved.len(),
                r.typed_unconfirmed.len()
            );
        }
        match r.export {
            Some(ExportOutcome::Acked { bytes, well_formed }) => {
                s.exports_acked += 1;
                if !well_formed {
                    s.exports_bad += 1;
                    problems.push(format!(
                        "desktop {i}: an acknowledged export of {bytes} bytes is no whole tar"
                    ));
                }
            }
            Some(other) => {
                let _ = write!(line, " d{i}:export={other:?}");
            }
            None => {}
        }
        desk.expected.files.extend(r.files);
        desk.expected.typed.extend(r.typed_saved);
        unconfirmed.extend(r.typed_unconfirmed);
    }
    unconfirmed
}

/// Tells every load to end and collects what each saw acknowledged; a load
/// that does not end in time is aborted (and reports nothing, so nothing
/// of it is held against the oracle).
async fn end_loads(
    stop: &watch::Sender<bool>,
    loads: Vec<(usize, Running)>,
) -> Vec<(usize, Report)> {
    let _ = stop.send(true);
    let mut reports = Vec::new();
    for (i, running) in loads {
        let activity = running.activity;
        let mut task = running.task;
        match tokio::time::timeout(LOAD_END_TIMEOUT, &mut task).await {
            Ok(Ok(report)) => reports.push((i, report)),
            Ok(Err(e)) => eprintln!("dormouse-soak: {activity} load on desktop {i} panicked: {e}"),
            Err(_) => {
                task.abort();
                eprintln!("dormouse-soak: {activity} load on desktop {i} did not end; aborted");
            }
        }
    }
    reports
}
