//! `dormouse-bench-scale`: how one broker behaves with many desktops.
//!
//! Under one broker it grows the fleet step by step (`--running 10,25,50
//! --stopped 50,100,200` gives three steps, each with that many running and
//! stopped desktops) and, at each step, measures: memory per idle running
//! desktop (the engine's figure) and the host's available memory; the
//! broker's RSS and CPU at rest; `GET /v1/computers/{id}` and
//! `GET /v1/computers` latency with 20 concurrent clients; the delay of one
//! status change pushed to 50 `/v1/events` clients; resume → ready of one
//! desktop while the others run; the broker SIGKILLed and started again
//! (time until it answers again with every desktop reconciled, and whether
//! every status then agrees with the engine). After the last step, idle
//! stops with staggered windows: how late each fires against the
//! `stops_at` the broker announced.
//!
//! Then (or alone, `--only restart`) the restart part ([`restart`]): the
//! time until all `--restart-desktops` (50) desktops are ready again after
//! the host went down, beside one resume alone.
//!
//! A benchmark, not a test: it prints figures beside the targets and never
//! asserts them. Every container it made is removed when it ends, also on
//! Ctrl-C (the broker guard removes its labelled containers when dropped).

mod restart;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use anyhow::{bail, Context, Result};
use chrono::Utc;
use clap::Parser;
use dormouse_e2e::broker::{cpu_seconds, BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{ApiClient, EventStream, Waits};
use dormouse_e2e::engine::docker_ok;
use dormouse_e2e::latency::{ms, Samples};
use dormouse_protocol::api::{
    BrokerEvent, ContainerState, CreateComputer, PatchComputer, StopReason,
};
use dormouse_protocol::guest::Phase;
use nix::sys::signal::Signal;
use tokio::sync::Barrier;
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const READERS: usize = 20;
const WATCHERS: usize = 50;
const READ_FOR: Duration = Duration::from_secs(5);
const REST_FOR: Duration = Duration::from_secs(5);

/// Targets of the scale benchmark on a 2-core machine (printed, not asserted).
const TARGET_STATUS_P99: Duration = Duration::from_millis(20);
const TARGET_RECONCILE: Duration = Duration::from_secs(3);
const TARGET_IDLE_LATE_P99: Duration = Duration::from_secs(1);
const TARGET_BROKER_RSS_MIB: f64 = 64.0;

#[derive(Debug, Parser)]
#[command(about = "Dormouse with many desktops under one broker, step by step")]
struct Args {
    /// Running desktops at each step (comma-separated, ascending).
    #[arg(long, value_delimiter = ',', default_value = "10,25,50")]
    running: Vec<usize>,
    /// Stopped desktops at each step (comma-separated, ascending, as many steps as --running).
    #[arg(long, value_delimiter = ',', default_value = "50,100,200")]
    stopped: Vec<usize>,
    /// Desktop image (ID or reference); default $DORMOUSE_TEST_IMAGE.
    #[arg(long)]
    image: Option<String>,
    /// Desktops created at once while growing the fleet.
    #[arg(long, default_value_t = 3)]
    parallel: usize,
    /// Run only this part.
    #[arg(long, value_enum)]
    only: Option<Part>,
    /// Desktops of the restart part (0: skip it).
    #[arg(long, default_value_t = 50)]
    restart_desktops: usize,
    /// `--resume-concurrency` of the restart part's broker [default: the broker's own].
    #[arg(long)]
    resume_concurrency: Option<u16>,
}

/// A part of the benchmark that can run alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// The fleet grown step by step, then the idle stops.
    Steps,
    /// The host goes down with every desktop running; the broker brings them back.
    Restart,
}

#[tokio::main]
async fn main() -> ExitCode {
    dormouse_e2e::run_to_end_or_signal("dormouse-bench-scale", run(Args::parse())).await
}

/// Figures of one step.
#[derive(Debug, Default)]
struct Step {
    running: usize,
    stopped: usize,
    desktop_mem_mib: Option<f64>,
    host_available_mib: Option<f64>,
    broker_rss_mib: Option<f64>,
    broker_cpu_percent: Option<f64>,
    get_one: Samples,
    get_all: Samples,
    push: Samples,
    resume: Option<Duration>,
    reconcile: Option<Duration>,
    statuses_right: Option<(usize, usize)>,
}

async fn run(args: Args) -> Result<()> {
    let image = match args.image.clone() {
        Some(i) => i,
        None => std::env::var("DORMOUSE_TEST_IMAGE")
            .context("give --image or set DORMOUSE_TEST_IMAGE (scripts/bench-scale does)")?,
    };
    if args.only != Some(Part::Restart) {
        run_steps(&args, &image).await?;
    }
    if args.only != Some(Part::Steps) && args.restart_desktops > 0 {
        let figures = restart::measure(
            &image,
            args.restart_desktops,
            args.parallel,
            args.resume_concurrency,
        )
        .await?;
        figures.print();
    }
    Ok(())
}

async fn run_steps(args: &Args, image: &str) -> Result<()> {
    if args.running.len() != args.stopped.len() || args.running.is_empty() {
        bail!("--running and --stopped need the same number of steps");
    }
    let most_running = args.running.iter().copied().max().unwrap_or(0);
    let mut options = BrokerOptions::new(image);
    // Room for the running desktops plus the batch being created (and
    // stopped again) while the fleet grows.
    options.max_instances =
        Some(u32::try_from(most_running + args.parallel.max(1)).context("too many")?);
    let mut broker = BrokerProcess::start(options).await?;
    eprintln!(
        "dormouse-bench-scale: image {image}, steps {:?} running / {:?} stopped",
        args.running, args.stopped
    );

    let mut running: Vec<Uuid> = Vec::new();
    let mut stopped: Vec<Uuid> = Vec::new();
    let mut steps = Vec::new();
    for (&want_running, &want_stopped) in args.running.iter().zip(&args.stopped) {
        let api = broker.client();
        grow(&api, &mut stopped, want_stopped, true, args.parallel).await?;
        grow(&api, &mut running, want_running, false, args.parallel).await?;
        eprintln!("== step: {want_running} running, {want_stopped} stopped");
        let mut step = Step {
            running: running.len(),
            stopped: stopped.len(),
            ..Step::default()
        };
        measure(&mut broker, &running, &stopped, &mut step).await?;
        steps.push(step);
    }
    let lateness = idle_lateness(&broker.client(), &running).await?;
    print_report(&steps, &lateness);
    Ok(())
}

/// Creates desktops until `ids` holds `want`, `parallel` at a time; with
/// `stop`, each is stopped once it was ready.
async fn grow(
    api: &ApiClient,
    ids: &mut Vec<Uuid>,
    want: usize,
    stop: bool,
    parallel: usize,
) -> Result<()> {
    while ids.len() < want {
        let batch = (want - ids.len()).min(parallel.max(1));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..batch {
            let api = api.clone();
            tasks.spawn(async move {
                let created = api
                    .create(&CreateComputer {
                        name: Some(format!(
                            "scale-{}",
                            &Uuid::new_v4().simple().to_string()[..8]
                        )),
                        ..CreateComputer::default()
                    })
                    .await?;
                let mut events = EventStream::open(&api).await?;
                api.wait_ready(&mut events, created.id, READY_TIMEOUT)
                    .await?;
                if stop {
                    api.stop(created.id).await?;
                    api.wait_stopped(&mut events, created.id, READY_TIMEOUT)
                        .await?;
                }
                anyhow::Ok(created.id)
            });
        }
        while let Some(done) = tasks.join_next().await {
            ids.push(done.context("create task")??);
        }
        eprintln!(
            "   {} {} desktops",
            ids.len(),
            if stop { "stopped" } else { "running" }
        );
    }
    Ok(())
}

async fn measure(
    broker: &mut BrokerProcess,
    running: &[Uuid],
    stopped: &[Uuid],
    step: &mut Step,
) -> Result<()> {
    let api = broker.client();
    // Memory: the engine's figure per running desktop, and the host's.
    let mut mem = Vec::new();
    for id in running {
        let usage = docker_ok(&[
            "stats",
            "--no-stream",
            "--format",
            "{{.MemUsage}}",
            &format!("dormouse-{id}"),
        ])
        .await?;
        if let Some(mib) = usage.split('/').next().and_then(parse_mib) {
            mem.push(mib);
        }
    }
    step.desktop_mem_mib = mean(&mem);
    step.host_available_mib = meminfo_available_mib();

    // The broker at rest.
    let pid = broker.pid().context("broker pid")?;
    let cpu_before = cpu_seconds(pid)?;
    let rest_started = Instant::now();
    tokio::time::sleep(REST_FOR).await;
    let cpu = (cpu_seconds(pid)? - cpu_before).max(0.0);
    step.broker_cpu_percent = Some(cpu / rest_started.elapsed().as_secs_f64() * 100.0);
    step.broker_rss_mib = proc_rss_mib(pid);

    // Reads with 20 concurrent clients.
    let all: Vec<Uuid> = running.iter().chain(stopped).copied().collect();
    step.get_one = concurrent_reads(&api, &all, false).await?;
    step.get_all = concurrent_reads(&api, &all, true).await?;

    // One status change pushed to 50 event clients.
    step.push = push_delay(&api, running[0]).await?;

    // Resume of one desktop while the others run.
    let one = *running.last().context("no running desktop")?;
    step.resume = Some(resume_one(&api, one).await?);

    // SIGKILL the broker, start it again: it answers only once reconciled.
    broker.kill(Signal::SIGKILL).await?;
    let restarted = Instant::now();
    broker.start_again().await?;
    step.reconcile = Some(restarted.elapsed());
    step.statuses_right = Some(statuses_agree(&broker.client(), running, stopped).await?);
    Ok(())
}

/// `READERS` clients read for [`READ_FOR`]: one computer each (round robin)
/// or the whole list.
async fn concurrent_reads(api: &ApiClient, ids: &[Uuid], list: bool) -> Result<Samples> {
    let barrier = Arc::new(Barrier::new(READERS));
    let ids = Arc::new(ids.to_vec());
    let mut tasks = tokio::task::JoinSet::new();
    for reader in 0..READERS {
        let api = api.clone();
        let barrier = barrier.clone();
        let ids = ids.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            let until = Instant::now() + READ_FOR;
            let mut took = Vec::new();
            let mut n = reader;
            while Instant::now() < until {
                let started = Instant::now();
                if list {
                    api.list().await?;
                } else {
                    api.get(ids[n % ids.len()]).await?;
                }
                took.push(started.elapsed());
                n += READERS;
            }
            anyhow::Ok(took)
        });
    }
    let mut samples = Samples::new();
    while let Some(done) = tasks.join_next().await {
        for t in done.context("reader")?? {
            samples.push(t);
        }
    }
    Ok(samples)
}

/// Opens [`WATCHERS`] event streams, changes one computer's idle window and
/// measures, per stream, the delay until the changed status arrives.
async fn push_delay(api: &ApiClient, id: Uuid) -> Result<Samples> {
    let mut streams = Vec::new();
    for _ in 0..WATCHERS {
        streams.push(api.events().await?);
    }
    // Let each stream's snapshot on connect arrive and be discarded.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for s in &mut streams {
        while s.next_buffered()?.is_some() {}
    }
    let window_ms = 86_400_000 - u64::from(rand::random::<u16>());
    let asked = Instant::now();
    api.patch(
        id,
        &PatchComputer {
            idle_timeout_ms: Some(window_ms),
        },
    )
    .await?;
    let mut tasks = tokio::task::JoinSet::new();
    for mut s in streams {
        tasks.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let event = tokio::time::timeout_at(deadline, s.next())
                    .await
                    .context("no push within 10 s")??;
                if let Some(BrokerEvent::Status { computer }) = event {
                    if computer.id == id
                        && computer.idle.as_ref().map(|i| i.timeout_ms) == Some(window_ms)
                    {
                        return anyhow::Ok(asked.elapsed());
                    }
                }
            }
        });
    }
    let mut samples = Samples::new();
    while let Some(done) = tasks.join_next().await {
        samples.push(done.context("watcher")??);
    }
    Ok(samples)
}

/// How many statuses agree with what the engine says (running/stopped),
/// out of all.
async fn statuses_agree(
    api: &ApiClient,
    running: &[Uuid],
    stopped: &[Uuid],
) -> Result<(usize, usize)> {
    let listed: BTreeMap<Uuid, ContainerState> = api
        .list()
        .await?
        .into_iter()
        .map(|s| (s.id, s.container))
        .collect();
    let mut right = 0;
    let all = running.len() + stopped.len();
    for id in running.iter().chain(stopped) {
        let engine = docker_ok(&[
            "inspect",
            "--format",
            "{{.State.Running}}",
            &format!("dormouse-{id}"),
        ])
        .await?;
        let want = if engine == "true" {
            ContainerState::Running
        } else {
            ContainerState::Stopped
        };
        if listed.get(id) == Some(&want) {
            right += 1;
        }
    }
    Ok((right, all))
}

/// Gives each running desktop a short idle window, staggered, and measures
/// how late each idle stop fires against the `stops_at` the broker shows.
async fn idle_lateness(api: &ApiClient, running: &[Uuid]) -> Result<Lateness> {
    eprintln!(
        "== idle stops with staggered windows ({} desktops)",
        running.len()
    );
    let mut events = api.events().await?;
    let mut due = BTreeMap::new();
    for (i, id) in running.iter().enumerate() {
        let window = 10_000 + 250 * u64::try_from(i).context("index")?;
        let status = api
            .patch(
                *id,
                &PatchComputer {
                    idle_timeout_ms: Some(window),
                },
            )
            .await?;
        let at = status
            .idle
            .and_then(|i| i.stops_at)
            .context("no stops_at after the idle window was set")?;
        due.insert(*id, at);
    }
    let mut lateness = Lateness {
        fired: Samples::new(),
        stopped: Samples::new(),
    };
    let mut unfired = due.clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !due.is_empty() && Instant::now() < deadline {
        let Ok(event) = tokio::time::timeout(Duration::from_secs(5), events.next()).await else {
            continue;
        };
        if let Some(BrokerEvent::Status { computer }) = event? {
            let seen = Utc::now();
            let stopped = computer.container == ContainerState::Stopped
                && computer.stop_reason == Some(StopReason::Idle);
            // Fired: the first status that shows the stop under way (or
            // done, when both fell into one coalesced broadcast).
            if stopped || computer.phase == Some(Phase::Stopping) {
                if let Some(at) = unfired.remove(&computer.id) {
                    lateness
                        .fired
                        .push((seen - at).to_std().unwrap_or(Duration::ZERO));
                }
            }
            if stopped {
                if let Some(at) = due.remove(&computer.id) {
                    lateness
                        .stopped
                        .push((seen - at).to_std().unwrap_or(Duration::ZERO));
                }
            }
        }
    }
    if !due.is_empty() {
        eprintln!("   {} idle stops did not end within 120 s", due.len());
    }
    Ok(lateness)
}

/// How late idle stops were against their `stops_at`: when each fired (the
/// first status showing it stopping) and when the container had stopped.
struct Lateness {
    fired: Samples,
    stopped: Samples,
}

fn print_report(steps: &[Step], lateness: &Lateness) {
    println!("\ndormouse bench-scale: one broker, {} steps", steps.len());
    println!(
        "{:>7} {:>7} | {:>9} {:>10} | {:>8} {:>6} | {:>15} {:>15} | {:>15} | {:>7} | {:>9} {:>9}",
        "running",
        "stopped",
        "desk MiB",
        "host avail",
        "brk RSS",
        "CPU %",
        "GET one p50/p99",
        "GET all p50/p99",
        "push50 p50/max",
        "resume",
        "reconcile",
        "statuses"
    );
    for s in steps {
        println!(
            "{:>7} {:>7} | {:>9} {:>10} | {:>8} {:>6} | {:>15} {:>15} | {:>15} | {:>7} | {:>9} {:>9}",
            s.running,
            s.stopped,
            s.desktop_mem_mib.map_or("-".into(), |m| format!("{m:.1}")),
            s.host_available_mib.map_or("-".into(), |m| format!("{m:.0}")),
            s.broker_rss_mib.map_or("-".into(), |m| format!("{m:.1}")),
            s.broker_cpu_percent.map_or("-".into(), |c| format!("{c:.1}")),
            format!("{}/{}", ms(s.get_one.p50()), ms(s.get_one.percentile(99.0))),
            format!("{}/{}", ms(s.get_all.p50()), ms(s.get_all.percentile(99.0))),
            format!("{}/{}", ms(s.push.p50()), ms(s.push.max())),
            ms(s.resume),
            ms(s.reconcile),
            s.statuses_right
                .map_or("-".into(), |(r, a)| format!("{r}/{a}")),
        );
    }
    for (what, s) in [
        ("fired (stopping shown)", &lateness.fired),
        ("container stopped", &lateness.stopped),
    ] {
        println!(
            "idle stops, {what}: n {} late p50 {} p99 {} max {} ms",
            s.len(),
            ms(s.p50()),
            ms(s.percentile(99.0)),
            ms(s.max())
        );
    }
    println!("\ntimes in ms; memory in MiB (desk: engine figure per idle running desktop, mean)");
    if let Some(last) = steps.last() {
        let check = |ok: bool| if ok { "met" } else { "MISSED" };
        let p99 = last.get_one.percentile(99.0);
        println!(
            "targets at {} running + {} stopped:",
            last.running, last.stopped
        );
        println!(
            "  status p99 with {READERS} clients {} ms (target <= {} ms): {}",
            ms(p99),
            TARGET_STATUS_P99.as_millis(),
            check(p99.is_some_and(|p| p <= TARGET_STATUS_P99))
        );
        println!(
            "  reconcile after SIGKILL {} ms (target <= {} ms): {}",
            ms(last.reconcile),
            TARGET_RECONCILE.as_millis(),
            check(last.reconcile.is_some_and(|r| r <= TARGET_RECONCILE))
        );
        let late = lateness.fired.percentile(99.0);
        println!(
            "  idle lateness p99, fired {} ms (target <= {} ms): {}",
            ms(late),
            TARGET_IDLE_LATE_P99.as_millis(),
            check(late.is_some_and(|l| l <= TARGET_IDLE_LATE_P99))
        );
        println!(
            "  broker RSS {} MiB (target <= {TARGET_BROKER_RSS_MIB} MiB): {}",
            last.broker_rss_mib
                .map_or("-".into(), |m| format!("{m:.1}")),
            check(
                last.broker_rss_mib
                    .is_some_and(|m| m <= TARGET_BROKER_RSS_MIB)
            )
        );
    }
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// `56.1MiB`, `1.2GiB`, `900KiB` → MiB.
fn parse_mib(text: &str) -> Option<f64> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = t.split_at(split);
    let n: f64 = num.trim().parse().ok()?;
    Some(match unit {
        "B" => n / 1_048_576.0,
        "KiB" | "kB" => n / 1024.0,
        "MiB" | "MB" => n,
        "GiB" | "GB" => n * 1024.0,
        _ => return None,
    })
}

fn meminfo_available_mib() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn proc_rss_mib(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Stops `id`, then times its resume from the request to the pushed ready.
async fn resume_one(api: &ApiClient, id: Uuid) -> Result<Duration> {
    let mut events = EventStream::open(api).await?;
    api.stop(id).await?;
    api.wait_stopped(&mut events, id, READY_TIMEOUT).await?;
    let asked = Instant::now();
    api.start(id).await?;
    let ready = api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
    Ok(ready.at.duration_since(asked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_memory_figures_parse() {
        assert_eq!(parse_mib("56.1MiB"), Some(56.1));
        assert_eq!(parse_mib("1GiB"), Some(1024.0));
        assert_eq!(parse_mib("512KiB"), Some(0.5));
        assert_eq!(parse_mib("lots"), None);
    }
}
