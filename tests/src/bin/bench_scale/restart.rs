//! The restart part of `dormouse-bench-scale`: coming back after a host
//! restart, measured.
//!
//! Under a broker of its own it brings `--restart-desktops` desktops up
//! (all running), times one resume alone (stop, start, ready) while the
//! others run, then plays the host going down: the broker is SIGKILLed and
//! every container `docker kill`ed. The broker is started again with its
//! defaults (`--resume-after-restart running`, `--resume-concurrency` the
//! number of CPUs unless given) and the clock runs from its spawn until
//! every desktop is ready again, each readiness taken from the pushed
//! statuses (a list every second as a safety net). The engine is the
//! witness that each container was started again (a new `StartedAt`, the
//! same container ID).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::is_ready;
use dormouse_e2e::engine::{docker_ok, inspect};
use dormouse_e2e::latency::{ms, Samples};
use dormouse_protocol::api::BrokerEvent;
use nix::sys::signal::Signal;
use tokio::time::Instant;
use uuid::Uuid;

use super::{grow, mean, meminfo_available_mib, parse_mib, proc_rss_mib, resume_one};

/// How long all the desktops may take to be ready again.
const ALL_READY_TIMEOUT: Duration = Duration::from_secs(900);

/// What the restart part measured.
#[derive(Debug, Default)]
pub struct Figures {
    desktops: usize,
    concurrency: String,
    one_resume: Option<Duration>,
    broker_answering: Option<Duration>,
    ready: Samples,
    all_ready: Option<Duration>,
    restarted_by_engine: usize,
    available_before_mib: Option<f64>,
    available_running_mib: Option<f64>,
    desktop_mem_mib: Option<f64>,
    broker_rss_mib: Option<f64>,
}

/// Runs the restart part with `desktops` desktops, created `parallel` at a
/// time; `concurrency` is passed as `--resume-concurrency` when given.
pub async fn measure(
    image: &str,
    desktops: usize,
    parallel: usize,
    concurrency: Option<u16>,
) -> Result<Figures> {
    eprintln!("== restart: {desktops} running desktops, the host goes down, the broker comes back");
    let mut options = BrokerOptions::new(image);
    options.max_instances = Some(u32::try_from(desktops + parallel.max(1))?.min(64));
    if let Some(n) = concurrency {
        options.extra_args = vec!["--resume-concurrency".into(), n.to_string()];
    }
    let mut figures = Figures {
        desktops,
        concurrency: concurrency.map_or_else(
            || {
                format!(
                    "{} (CPUs)",
                    std::thread::available_parallelism().map_or(1, |n| n.get())
                )
            },
            |n| n.to_string(),
        ),
        available_before_mib: meminfo_available_mib(),
        ..Figures::default()
    };
    let mut broker = BrokerProcess::start(options).await?;
    let api = broker.client();
    let mut ids = Vec::new();
    grow(&api, &mut ids, desktops, false, parallel).await?;
    figures.available_running_mib = meminfo_available_mib();
    figures.desktop_mem_mib = desktop_memory(&ids).await?;

    // One resume alone, while the others run.
    let one = *ids.last().context("no desktop")?;
    figures.one_resume = Some(resume_one(&api, one).await?);

    // The host goes down: the broker first, then every container.
    let before = started_at(&ids).await?;
    broker.kill(Signal::SIGKILL).await?;
    let names: Vec<String> = ids.iter().map(|id| format!("dormouse-{id}")).collect();
    let mut kill = vec!["kill", "-s", "KILL"];
    kill.extend(names.iter().map(String::as_str));
    docker_ok(&kill).await?;
    for name in &names {
        let facts = inspect(name).await?.context("container gone")?;
        ensure!(facts.status == "exited", "{name} still runs: {facts:?}");
    }

    let spawned = Instant::now();
    broker.start_again().await?;
    figures.broker_answering = Some(spawned.elapsed());
    let api = broker.client();
    let mut stream = api.events().await?;
    let mut waiting: BTreeSet<Uuid> = ids.iter().copied().collect();
    let deadline = spawned + ALL_READY_TIMEOUT;
    let mut next_list = Instant::now();
    while !waiting.is_empty() && Instant::now() < deadline {
        if Instant::now() >= next_list {
            for status in api.list().await? {
                if is_ready(&status) && waiting.remove(&status.id) {
                    figures.ready.push(spawned.elapsed());
                }
            }
            next_list = Instant::now() + Duration::from_secs(1);
        }
        let Ok(event) = tokio::time::timeout(Duration::from_millis(200), stream.next()).await
        else {
            continue;
        };
        if let Some(BrokerEvent::Status { computer }) = event? {
            if is_ready(&computer) && waiting.remove(&computer.id) {
                figures.ready.push(spawned.elapsed());
            }
        }
    }
    if waiting.is_empty() {
        figures.all_ready = figures.ready.max();
    } else {
        eprintln!(
            "   {} desktops not ready within {ALL_READY_TIMEOUT:?}",
            waiting.len()
        );
    }
    figures.broker_rss_mib = broker.pid().and_then(proc_rss_mib);
    let after = started_at(&ids).await?;
    figures.restarted_by_engine = before
        .iter()
        .zip(&after)
        .filter(|((id_before, t_before), (id_after, t_after))| {
            id_before == id_after && t_before != t_after
        })
        .count();
    Ok(figures)
}

/// The engine's memory figure per running desktop, the mean (one
/// `docker stats` for all).
async fn desktop_memory(ids: &[Uuid]) -> Result<Option<f64>> {
    let names: Vec<String> = ids.iter().map(|id| format!("dormouse-{id}")).collect();
    let mut stats = vec!["stats", "--no-stream", "--format", "{{.MemUsage}}"];
    stats.extend(names.iter().map(String::as_str));
    let out = docker_ok(&stats).await?;
    let mib: Vec<f64> = out
        .lines()
        .filter_map(|l| l.split('/').next().and_then(parse_mib))
        .collect();
    Ok(mean(&mib))
}

/// Each desktop's container ID and `StartedAt`, as the engine says.
async fn started_at(ids: &[Uuid]) -> Result<Vec<(String, String)>> {
    let mut all = Vec::new();
    for id in ids {
        let name = format!("dormouse-{id}");
        let facts = inspect(&name).await?.context("container gone")?;
        all.push((facts.id, facts.started_at));
    }
    Ok(all)
}

impl Figures {
    pub fn print(&self) {
        println!(
            "\nrestart after a host restart ({} desktops; broker SIGKILLed, every container killed, broker started again; --resume-concurrency {}):",
            self.desktops, self.concurrency
        );
        println!(
            "  one resume alone (others running): {} ms",
            ms(self.one_resume)
        );
        println!(
            "  broker answering /healthz (reconciled): {} ms after its spawn",
            ms(self.broker_answering)
        );
        println!(
            "  ready again: {}/{} (engine: {} started again, same containers); first {} p50 {} last {} ms after the broker's spawn",
            self.ready.len(),
            self.desktops,
            self.restarted_by_engine,
            ms(self.ready.min()),
            ms(self.ready.p50()),
            ms(self.all_ready)
        );
        if let Some(all) = self.all_ready {
            let per = all.as_secs_f64() * 1000.0 / self.desktops.max(1) as f64;
            println!(
                "  all {} ready in {} ms ({per:.0} ms per desktop)",
                self.desktops,
                all.as_millis()
            );
        }
        let mib = |m: Option<f64>| m.map_or("-".into(), |m| format!("{m:.0}"));
        println!(
            "  memory per running desktop (engine's figure, mean) {} MiB; host MemAvailable {} MiB before, {} MiB with every desktop running; broker RSS after {} MiB",
            self.desktop_mem_mib.map_or("-".into(), |m| format!("{m:.1}")),
            mib(self.available_before_mib),
            mib(self.available_running_mib),
            self.broker_rss_mib.map_or("-".into(), |m| format!("{m:.1}"))
        );
    }
}
