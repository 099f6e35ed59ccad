//! `dormouse-soak` (run through `scripts/soak`): many fault-and-resume
//! cycles over several desktops that are busy while the fault lands.
//!
//! Each cycle draws, by seed, a fault (`docker kill -s KILL`, a stop
//! through the API, an idle stop, a broker SIGKILL, a graceful broker
//! restart) and the activity it is timed against (typing into a witness,
//! a view and a control screen, an exec streaming output, the file write
//! loop, an export, an import into another, stopped desktop). Every
//! desktop writes files all the time and runs one more activity. After the
//! resume the data oracle ([`oracle`]) checks every acknowledged write,
//! import and typed text, and the guests for leftover processes.
//!
//! Bounded: `--cycles` and `--time-limit`; the table ([`report`]) is printed
//! on stdout when it ends, also on the time limit, Ctrl-C or SIGTERM, and
//! everything it made (broker, containers, data directory) is removed.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use dormouse_e2e::engine;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

mod cycle;
mod fleet;
mod load;
mod oracle;
mod plan;
mod report;
mod witness;

use fleet::Fleet;
use report::Stats;

#[derive(Debug, Parser)]
#[command(about = "Fault-and-resume cycles over busy Dormouse desktops, with a data oracle")]
struct Args {
    /// Fault-and-resume cycles.
    #[arg(long, default_value_t = 1000)]
    cycles: usize,
    /// Desktops, all busy in every cycle.
    #[arg(long, default_value_t = 4)]
    desktops: usize,
    /// Seed of every random choice; a run is repeatable by its seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop starting cycles after this long (e.g. `90m`, `2h`); the
    /// table is printed all the same.
    #[arg(long, value_parser = plan::parse_duration, default_value = "12h")]
    time_limit: Duration,
    /// Desktop image; default $DORMOUSE_TEST_IMAGE or dormouse/desktop:latest.
    #[arg(long)]
    image: Option<String>,
}

type Shared = Arc<Mutex<Stats>>;

fn lock(stats: &Shared) -> std::sync::MutexGuard<'_, Stats> {
    stats.lock().unwrap_or_else(PoisonError::into_inner)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let seed = dormouse_e2e::seed_or_now(args.seed);
    let stats: Shared = Arc::new(Mutex::new(Stats {
        seed,
        planned: args.cycles,
        desktops: args.desktops,
        ended: "not started".into(),
        ..Stats::default()
    }));
    eprintln!(
        "dormouse-soak: {} cycles over {} desktops, seed {seed}, time limit {:?}",
        args.cycles, args.desktops, args.time_limit
    );
    // Dropping `run` on a signal drops the fleet, whose broker fixture
    // removes the containers and the data directory.
    let ended = tokio::select! {
        ended = run(&args, seed, Arc::clone(&stats)) => ended,
        how = dormouse_e2e::termination() => match how {
            Ok(how) => how.to_string(),
            Err(e) => format!("cannot watch the signals: {e}"),
        },
    };
    let mut stats = lock(&stats);
    stats.ended = ended;
    println!("{}", stats.table());
    println!("{}", stats.summary());
    let clean = stats.ended.starts_with("completed") || stats.ended.starts_with("time limit");
    if clean && stats.failures == 0 && stats.lost() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The whole run; returns how it ended.
async fn run(args: &Args, seed: u64, stats: Shared) -> String {
    let deadline = Instant::now() + args.time_limit;
    let mut fleet = match set_up(args).await {
        Ok(fleet) => fleet,
        Err(e) => {
            eprintln!("dormouse-soak: setting up failed: {e:#}");
            lock(&stats).failures += 1;
            return "set-up failed".into();
        }
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let steps = plan::plan(&mut rng, args.cycles, args.desktops);
    let mut ended = format!("completed {} cycles", steps.len());
    for (i, step) in steps.into_iter().enumerate() {
        let n = i + 1;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            ended = format!("time limit after {} cycles", n - 1);
            break;
        }
        let cycle_seed = rng.gen::<u64>();
        let started = Instant::now();
        let outcome =
            tokio::time::timeout(left, cycle::run(&mut fleet, n, step, cycle_seed, &stats)).await;
        let result = match outcome {
            Ok(result) => result,
            Err(_) => {
                ended = format!("time limit during cycle {n}");
                break;
            }
        };
        let fault = step.fault.to_string();
        {
            let mut s = lock(&stats);
            s.cycles = n;
            let entry = s.per_fault.entry(fault.clone()).or_default();
            entry.0 += 1;
            if result.is_err() {
                entry.1 += 1;
                s.failures += 1;
            }
        }
        match result {
            Ok(line) => eprintln!(
                "cycle {n}/{} fault={fault} moment={} {line} ({} ms)",
                args.cycles,
                step.moment,
                started.elapsed().as_millis()
            ),
            Err(e) => {
                eprintln!(
                    "cycle {n}/{} fault={fault} moment={} FAILED: {e:#}",
                    args.cycles, step.moment
                );
                if let Err(e) = fleet.recover(n).await {
                    eprintln!("dormouse-soak: cannot bring the desktops back, giving up: {e:#}");
                    lock(&stats).failures += 1;
                    ended = format!("gave up after cycle {n}");
                    break;
                }
            }
        }
        if let Err(e) = sample(&fleet, n, &stats).await {
            eprintln!("dormouse-soak: measuring after cycle {n}: {e:#}");
        }
    }
    let failed = lock(&stats).failures > 0;
    if failed {
        eprintln!(
            "dormouse-soak: broker log tail:\n{}",
            fleet.broker.log_tail(6000)
        );
    }
    ended
}

async fn set_up(args: &Args) -> Result<Fleet> {
    anyhow::ensure!(args.desktops >= 1, "--desktops must be at least 1");
    let image = engine::resolve_image(args.image.as_deref()).await?;
    let fleet = Fleet::set_up(&image, args.desktops)
        .await
        .context("starting the broker and the desktops")?;
    eprintln!(
        "dormouse-soak: broker on {}, desktops {:?}, image {image}",
        fleet.broker.addr(),
        fleet.desks.iter().map(|d| d.id).collect::<Vec<_>>()
    );
    Ok(fleet)
}

/// Memory and descriptors after cycle `n`, into the stats.
async fn sample(fleet: &Fleet, n: usize, stats: &Shared) -> Result<()> {
    let m = fleet.metrics(n).await?;
    lock(stats).sample(m);
    Ok(())
}
