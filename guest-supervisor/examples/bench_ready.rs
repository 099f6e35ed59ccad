//! Benchmark, not a test: `docker start` → `ready` seen on the guest socket,
//! over repeated stop/start and kill/start cycles, beside the bare `docker
//! start` of a trivial container (same image, same flags, a shell that
//! writes a marker into the run directory and sleeps) measured in the same
//! run, interleaved so both see the same load. Both are observed the same
//! way: from the host, through the bind-mounted run directory, with inotify.
//!
//! Run through `scripts/bench-ready [--cycles N]`. Uses the image of the
//! real-engine tests (`DORMOUSE_TEST_IMAGE`, default `dormouse/desktop:latest`;
//! `DORMOUSE_SUPERVISOR_BIN` bind-mounts another supervisor build).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use chrono::{DateTime, Utc};
use dormouse_e2e::docker_ok;
use dormouse_protocol::{Request, Response};
use support::{Desktop, RunDirWatch};
use tokio::time::Instant;

/// How one desktop cycle went.
#[derive(Debug, Clone, Copy)]
struct Cycle {
    /// `docker start` invoked → `ready` pushed on the socket.
    ready: Duration,
    /// `docker start` invoked → the CLI returned.
    cli: Duration,
    /// `docker start` invoked → the socket accepted a connection.
    socket: Duration,
    /// The engine's `StartedAt` → the last service ready (as the guest
    /// reports it).
    services: Duration,
    /// The last service ready → `ready_since` (the self-probe's share).
    probe: Duration,
    /// CPU time of the container's storage daemon when `ready` came, where
    /// the engine serves the root filesystem from a userspace daemon
    /// (fuse-overlayfs, one per running container): every file operation of
    /// the guest's start passes through its single thread.
    storage_cpu: Option<Duration>,
}

#[tokio::main(flavor = "current_thread")]
// Over 100 lines on purpose: the benchmark's measurements in the order
// they run, each beside its baseline in the same run; apart, that order
// (which the figures depend on) would be spread over helpers.
async fn main() {
    let cycles = parse_cycles();
    let Some(desktop) = Desktop::create("bench-ready") else {
        std::process::exit(2);
    };
    let Some(trivial) = Desktop::create_trivial("bench-ready") else {
        std::process::exit(2);
    };
    eprintln!(
        "[bench-ready] {cycles} stop/start and {cycles} kill/start cycles of {}, floor from {}",
        desktop.name(),
        trivial.name()
    );

    // The first start warms caches (page cache, fonts); it is not counted.
    let warm = start_until_ready(&desktop).await;
    eprintln!(
        "[bench-ready] first start (not counted): {}",
        ms(warm.ready)
    );
    let mut floor = Vec::new();
    let mut stop_start = Vec::new();
    let mut kill_start = Vec::new();
    for i in 0..cycles {
        floor.push(bare_start(&trivial).await);
        docker_ok(&["stop", desktop.name()]);
        let c = start_until_ready(&desktop).await;
        eprintln!("[bench-ready] stop/start {i}: {}", c.summary());
        stop_start.push(c);

        floor.push(bare_start(&trivial).await);
        docker_ok(&["kill", "-s", "KILL", desktop.name()]);
        docker_ok(&["wait", desktop.name()]);
        let c = start_until_ready(&desktop).await;
        eprintln!("[bench-ready] kill/start {i}: {}", c.summary());
        kill_start.push(c);
    }

    let (shot_ms, shot_bytes) = screenshot(&desktop).await;
    let rss = docker_ok(&[
        "exec",
        desktop.name(),
        "sh",
        "-c",
        "grep -E '^(VmRSS|VmHWM)' /proc/1/status | tr -s ' \\t' ' ' | tr '\\n' ' '",
    ]);

    println!();
    println!("docker start -> ready on the guest socket ({cycles} cycles each)");
    println!("engine: {}", engine());
    println!("{:<40} {:>8} {:>8} {:>8}", "", "p50", "p95", "max");
    row(
        "floor: trivial container ran",
        &floor.iter().map(|f| f.ran).collect::<Vec<_>>(),
    );
    row(
        "floor: its docker start CLI returned",
        &floor.iter().map(|f| f.cli).collect::<Vec<_>>(),
    );
    let all: Vec<Cycle> = stop_start.iter().chain(&kill_start).copied().collect();
    row(
        "stop/start: ready",
        &stop_start.iter().map(|c| c.ready).collect::<Vec<_>>(),
    );
    row(
        "kill/start: ready",
        &kill_start.iter().map(|c| c.ready).collect::<Vec<_>>(),
    );
    row(
        "all: docker start CLI returned",
        &all.iter().map(|c| c.cli).collect::<Vec<_>>(),
    );
    row(
        "all: socket accepting",
        &all.iter().map(|c| c.socket).collect::<Vec<_>>(),
    );
    row(
        "all: ready",
        &all.iter().map(|c| c.ready).collect::<Vec<_>>(),
    );
    println!("where it goes (guest clock):");
    row(
        "  StartedAt -> last service ready",
        &all.iter().map(|c| c.services).collect::<Vec<_>>(),
    );
    row(
        "  last service ready -> ready (probe)",
        &all.iter().map(|c| c.probe).collect::<Vec<_>>(),
    );
    let storage: Vec<Duration> = all.iter().filter_map(|c| c.storage_cpu).collect();
    if storage.len() == all.len() {
        row("  storage daemon CPU, start -> ready", &storage);
    }
    let p50_ready = percentile(&all.iter().map(|c| c.ready).collect::<Vec<_>>(), 50);
    let p50_floor = percentile(&floor.iter().map(|f| f.ran).collect::<Vec<_>>(), 50);
    println!(
        "p50 ready - p50 floor = {} (target: at most 250 ms)",
        ms(p50_ready.saturating_sub(p50_floor))
    );
    println!("screenshot over the socket: {shot_ms} ms, {shot_bytes} B PNG");
    println!("supervisor (PID 1) memory: {rss}");
}

fn parse_cycles() -> usize {
    let mut args = std::env::args().skip(1);
    let mut cycles = 10;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--cycles" => {
                cycles = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| usage());
            }
            _ => usage(),
        }
    }
    cycles
}

fn usage() -> ! {
    eprintln!("usage: bench-ready [--cycles N]");
    std::process::exit(64)
}

/// Starts the desktop and waits, without polling, until `ready` is pushed.
async fn start_until_ready(desktop: &Desktop) -> Cycle {
    let waiter = RunDirWatch::new(desktop.run_dir.path());
    let started = Instant::now();
    let mut cli = tokio::process::Command::new("docker")
        .args(["start", desktop.name()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let cli_done = tokio::spawn(async move {
        let status = cli.wait().await.unwrap();
        assert!(status.success(), "docker start failed");
        started.elapsed()
    });
    let mut client = waiter.connect(&desktop.socket(), desktop).await;
    let socket = started.elapsed();
    let statuses = client.watch_until_ready(desktop).await;
    let ready = started.elapsed();
    let storage_cpu = storage_daemon_cpu(desktop);
    let status = statuses.last().unwrap();
    let engine_started: DateTime<Utc> = docker_ok(&[
        "inspect",
        "--format",
        "{{.State.StartedAt}}",
        desktop.name(),
    ])
    .parse()
    .unwrap();
    let last_service = status
        .services
        .iter()
        .filter_map(|s| s.ready_since)
        .max()
        .unwrap();
    let ready_since = status.ready_since.unwrap();
    let span = |from: DateTime<Utc>, to: DateTime<Utc>| (to - from).to_std().unwrap_or_default();
    Cycle {
        ready,
        cli: cli_done.await.unwrap(),
        socket,
        services: span(engine_started, last_service),
        probe: span(last_service, ready_since),
        storage_cpu,
    }
}

/// The engine's version and storage driver, for the table's header.
fn engine() -> String {
    docker_ok(&[
        "info",
        "--format",
        "Docker {{.ServerVersion}}, storage driver {{.Driver}}",
    ])
}

/// CPU time so far of the fuse-overlayfs process serving `desktop`'s root
/// filesystem (found by its mount point, the last word of its command
/// line); `None` for other storage drivers or a remote engine.
fn storage_daemon_cpu(desktop: &Desktop) -> Option<Duration> {
    let merged = docker_ok(&[
        "inspect",
        "--format",
        "{{.GraphDriver.Name}} {{index .GraphDriver.Data \"MergedDir\"}}",
        desktop.name(),
    ]);
    let merged = merged.strip_prefix("fuse-overlayfs ")?;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let mut words = cmdline.split(|b| *b == 0).filter(|w| !w.is_empty());
            let first = words.next()?;
            let last = words.next_back()?;
            if !first.ends_with(b"fuse-overlayfs") || last != merged.as_bytes() {
                return None;
            }
            // schedstat: time on the CPU, in nanoseconds, first.
            let schedstat = std::fs::read_to_string(entry.path().join("schedstat")).ok()?;
            let ns: u64 = schedstat.split_whitespace().next()?.parse().ok()?;
            Some(Duration::from_nanos(ns))
        })
}

impl Cycle {
    fn summary(&self) -> String {
        let storage = self
            .storage_cpu
            .map(|d| format!(", storage daemon CPU {}", ms(d)))
            .unwrap_or_default();
        format!(
            "ready {} (cli {}, services {}, probe {}{storage})",
            ms(self.ready),
            ms(self.cli),
            ms(self.services),
            ms(self.probe)
        )
    }
}

/// The trivial container's floor.
#[derive(Debug, Clone, Copy)]
struct Floor {
    /// `docker start` invoked → the CLI returned.
    cli: Duration,
    /// `docker start` invoked → its marker seen on the host.
    ran: Duration,
}

/// `docker start` of the trivial container: the engine's own floor.
async fn bare_start(trivial: &Desktop) -> Floor {
    let marker = trivial.ran_marker();
    let _ = std::fs::remove_file(&marker);
    let watch = RunDirWatch::new(trivial.run_dir.path());
    let started = Instant::now();
    let mut cli = tokio::process::Command::new("docker")
        .args(["start", trivial.name()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let cli_done = tokio::spawn(async move {
        assert!(cli.wait().await.unwrap().success(), "docker start failed");
        started.elapsed()
    });
    watch.file_appears(&marker, trivial).await;
    let ran = started.elapsed();
    let cli = cli_done.await.unwrap();
    docker_ok(&["kill", trivial.name()]);
    docker_ok(&["wait", trivial.name()]);
    Floor { cli, ran }
}

async fn screenshot(desktop: &Desktop) -> (u128, usize) {
    let mut client = support::Client::connect(&desktop.socket()).await;
    let started = Instant::now();
    let frame = client
        .ask(&Request::Screenshot {
            encoding: Default::default(),
        })
        .await;
    let took = started.elapsed().as_millis();
    match frame.message {
        Response::Screenshot { .. } => (took, frame.payload.len()),
        other => panic!("screenshot answered {other:?}"),
    }
}

fn percentile(values: &[Duration], p: usize) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    // Nearest rank.
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

fn row(label: &str, values: &[Duration]) {
    println!(
        "{label:<40} {:>8} {:>8} {:>8}",
        ms(percentile(values, 50)),
        ms(percentile(values, 95)),
        ms(values.iter().copied().max().unwrap_or_default())
    );
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}
