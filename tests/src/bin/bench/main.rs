//! `dormouse-bench` (run through `scripts/bench`): resume-to-ready, graceful
//! stop and memory of a Dormouse desktop, side by side in one run with the
//! floor (`docker start` of a trivial container) and with the classic shell
//! entrypoint (`tests/baseline/entrypoint.sh`) on the same image.
//!
//! Dormouse's readiness is the broker's: the time from `POST .../start` until
//! `/v1/events` pushes `ready: true`. The shell's readiness is found the way
//! frontends find it: `docker exec` polling (X answers and VNC accepts) every
//! 50 ms and every 2000 ms. Everything it creates is removed on exit, also on
//! Ctrl-C.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{ApiClient, EventStream, Waits as _};
use dormouse_e2e::engine::{self, docker_ok};
use dormouse_e2e::guest::Guest;
use dormouse_e2e::latency::Samples;
use dormouse_e2e::{unique_name, ContainerGuard, TempDir, TEST_LABEL};
use dormouse_protocol::api::{ContainerState, CreateComputer};
use dormouse_protocol::StartPhases;
use tokio::time::Instant;
use uuid::Uuid;

mod report;

use report::print_report;

/// The shell baseline, copied into a temporary file and bind-mounted.
const BASELINE_ENTRYPOINT: &str = include_str!("../../../baseline/entrypoint.sh");

/// What the baseline's frontend polls: X answers and VNC accepts a connection
/// (the same services Dormouse's `ready` covers, less the screenshot).
const BASELINE_READY: &str = "xdpyinfo -display :1 >/dev/null 2>&1 && \
    perl -MIO::Socket::INET -e 'exit !IO::Socket::INET->new(PeerAddr => q(127.0.0.1:5900))'";

const READY_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, Parser)]
#[command(about = "Dormouse resume, stop and memory beside a shell entrypoint, in one run")]
struct Args {
    /// Desktop image (ID or reference); default $DORMOUSE_TEST_IMAGE or dormouse/desktop:latest.
    #[arg(long)]
    image: Option<String>,
    /// Resume measurements per kind (Dormouse after stop, after kill; shell with 50 ms polling; floor).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Shell resumes found by 2000 ms polling (each takes seconds).
    #[arg(long, default_value_t = 4)]
    slow_poll_runs: usize,
    /// Graceful stops measured per desktop (the shell's each take the engine's full timeout).
    #[arg(long, default_value_t = 3)]
    stop_runs: usize,
    /// Seconds a desktop sits idle before its memory is read.
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    /// Measure only these parts (comma-separated); the table shows `-` for the others.
    #[arg(long, value_delimiter = ',', default_value = "floor,dormouse,shell")]
    parts: Vec<Part>,
}

/// A part of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// `docker start` of a trivial container.
    Floor,
    /// The Dormouse desktop through the broker.
    Dormouse,
    /// The shell entrypoint baseline.
    Shell,
}

#[tokio::main]
async fn main() -> ExitCode {
    dormouse_e2e::run_to_end_or_signal("dormouse-bench", run(Args::parse())).await
}

/// Memory of one idle desktop.
#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    pid1_rss_kib: u64,
    processes_rss_kib: u64,
    cgroup_kib: Option<u64>,
}

async fn run(args: Args) -> Result<()> {
    let image = dormouse_e2e::engine::resolve_image(args.image.as_deref()).await?;
    eprintln!("dormouse-bench: image {image}, {} runs", args.runs);
    let scratch = TempDir::new("dormouse-bench");

    let (mut floor_cli, mut floor_api) = (Samples::new(), Samples::new());
    if args.parts.contains(&Part::Floor) {
        eprintln!("== floor: docker start of a trivial container");
        (floor_cli, floor_api) = floor(&image, args.runs).await?;
    }
    let mut dormouse_numbers = DesktopNumbers::default();
    if args.parts.contains(&Part::Dormouse) {
        eprintln!("== dormouse");
        dormouse_numbers = dormouse(&image, &args).await?;
    }
    let mut shell_numbers = DesktopNumbers::default();
    if args.parts.contains(&Part::Shell) {
        eprintln!("== shell entrypoint baseline");
        shell_numbers = shell(&image, &args, scratch.path()).await?;
    }

    print_report(
        &image,
        &args,
        &floor_cli,
        &floor_api,
        &dormouse_numbers,
        &shell_numbers,
    );
    Ok(())
}

/// `docker start` of the image with `sleep` as its entrypoint, through the
/// CLI (as the issue defines the floor) and straight through the engine API
/// (the stricter floor: no CLI process start).
async fn floor(image: &str, runs: usize) -> Result<(Samples, Samples)> {
    let name = unique_name("dormouse-bench-floor");
    let _guard = ContainerGuard::new(&name);
    docker_ok(&[
        "create",
        "--name",
        &name,
        "--label",
        &format!("{TEST_LABEL}=1"),
        "--network",
        "none",
        // The desktops' explicit limits (an engine's defaults may be more
        // than a container may set: Podman's are).
        "--ulimit",
        "nofile=16384:16384",
        "--ulimit",
        "nproc=8192:8192",
        "--entrypoint",
        "/bin/sleep",
        image,
        "infinity",
    ])
    .await?;
    let mut cli = Samples::new();
    let mut api = Samples::new();
    for i in 0..runs * 2 {
        let started = Instant::now();
        if i % 2 == 0 {
            docker_ok(&["start", &name]).await?;
            cli.push(started.elapsed());
        } else {
            api.push(engine_api_start(&name).await?);
        }
        // `sleep` as PID 1 ignores SIGTERM: kill it rather than wait.
        engine::kill(&name).await?;
        wait_not_running(&name).await?;
    }
    Ok((cli, api))
}

/// `POST /containers/{name}/start` on the engine's unix socket; the time
/// from connect to the answer.
async fn engine_api_start(name: &str) -> Result<Duration> {
    let started = Instant::now();
    let (status, body) = engine::api_post(&format!("/containers/{name}/start")).await?;
    let elapsed = started.elapsed();
    ensure!(
        status == 204,
        "engine start of {name} answered {status}: {body}"
    );
    Ok(elapsed)
}

async fn wait_not_running(name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let facts = engine::inspect(name).await?.context("container vanished")?;
        if facts.status != "running" {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{name} does not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, Default)]
struct DesktopNumbers {
    resume_after_stop: Samples,
    resume_after_kill: Samples,
    slow_poll_resume: Samples,
    graceful_stop: Samples,
    api_stop: Samples,
    exit_codes: BTreeMap<i64, usize>,
    first_ready: Option<Duration>,
    memory: Option<Memory>,
    notes: Vec<String>,
    /// Of each resume: POST start → the broker reports the container running.
    engine_part: Samples,
    /// Of each resume: container running → ready.
    guest_part: Samples,
    /// Of each resume: when each start phase ended, by the supervisor's own
    /// clock (milliseconds after it started), by phase name.
    phases: BTreeMap<&'static str, Samples>,
}

impl DesktopNumbers {
    fn record_parts(&mut self, resumed: &Resume) {
        if let Some(engine) = resumed.engine {
            self.engine_part.push(engine);
            self.guest_part.push(resumed.total.saturating_sub(engine));
        }
        if let Some(p) = resumed.phases {
            for (name, at) in [
                ("prepared", p.prepared_ms),
                ("x", p.x_ms),
                ("window_manager", p.window_manager_ms),
                ("vnc", p.vnc_ms),
                ("proxy", p.proxy_ms),
                ("ready", p.ready_ms),
                ("taskbar", p.taskbar_ms),
            ] {
                if let Some(ms) = at {
                    self.phases
                        .entry(name)
                        .or_default()
                        .push(Duration::from_millis(ms));
                }
            }
        }
    }
}

async fn dormouse(image: &str, args: &Args) -> Result<DesktopNumbers> {
    let broker = BrokerProcess::start(BrokerOptions::new(image)).await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let mut numbers = DesktopNumbers::default();
    let started = Instant::now();
    let created = api
        .create(&CreateComputer {
            name: Some("bench".into()),
            ..CreateComputer::default()
        })
        .await?;
    let id = created.id;
    api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
    numbers.first_ready = Some(started.elapsed());
    let guest = Guest::for_computer(id);

    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    numbers.memory = Some(memory(guest.container()).await?);

    let mut polled = 0;
    for _ in 0..args.runs {
        api.stop(id).await?;
        api.wait_stopped(&mut events, id, READY_TIMEOUT).await?;
        let resumed = resume(&api, &mut events, id).await?;
        polled += usize::from(!resumed.pushed);
        numbers.resume_after_stop.push(resumed.total);
        numbers.record_parts(&resumed);
    }
    for _ in 0..args.runs {
        engine::kill(guest.container()).await?;
        api.wait_stopped(&mut events, id, READY_TIMEOUT).await?;
        let resumed = resume(&api, &mut events, id).await?;
        polled += usize::from(!resumed.pushed);
        numbers.resume_after_kill.push(resumed.total);
        numbers.record_parts(&resumed);
    }
    for _ in 0..args.stop_runs {
        // The engine's own graceful stop (SIGTERM to the supervisor).
        let (took, code) = docker_stop(guest.container()).await?;
        numbers.graceful_stop.push(took);
        *numbers.exit_codes.entry(code).or_default() += 1;
        api.wait_stopped(&mut events, id, READY_TIMEOUT).await?;
        resume(&api, &mut events, id).await?;
        // The broker's stop: quiesce through the supervisor, then the engine.
        let asked = Instant::now();
        api.stop(id).await?;
        let seen = api.wait_stopped(&mut events, id, READY_TIMEOUT).await?;
        numbers.api_stop.push(seen.at.duration_since(asked));
        resume(&api, &mut events, id).await?;
    }
    if polled > 0 {
        numbers.notes.push(format!(
            "{polled} Dormouse readiness values came from the fallback GET, not the push"
        ));
    }
    Ok(numbers)
}

/// One resume as the broker reported it.
#[derive(Debug, Clone, Copy)]
struct Resume {
    /// `POST start` sent → `ready: true` seen.
    total: Duration,
    /// `POST start` sent → the broker reports the container running.
    engine: Option<Duration>,
    /// Both moments were pushed (not found by the fallback GET).
    pushed: bool,
    /// The start phases the guest reported for this start.
    phases: Option<StartPhases>,
}

/// `POST start` → `ready: true` pushed by the broker, with the moment the
/// broker reported the container running in between (the engine's part).
async fn resume(api: &ApiClient, events: &mut EventStream, id: Uuid) -> Result<Resume> {
    let asked = Instant::now();
    // POST start answers once the desktop is ready; keep it in flight and
    // watch the pushes meanwhile.
    let starting = {
        let api = api.clone();
        tokio::spawn(async move { api.start(id).await })
    };
    let running = api
        .wait_for(events, id, "the container runs", READY_TIMEOUT, |s| {
            s.container == ContainerState::Running
        })
        .await?;
    let ready = api.wait_ready(events, id, READY_TIMEOUT).await?;
    starting.await.context("start task")??;
    let engine = (!running.status.ready).then(|| running.at.duration_since(asked));
    let total = ready.at.duration_since(asked);
    // The taskbar may come up after ready: its phase is read once it is in.
    let deadline = Instant::now() + Duration::from_secs(5);
    let phases = loop {
        let phases = api.get(id).await?.start_phases;
        let taskbar_in = phases.is_some_and(|p| p.taskbar_ms.is_some());
        if taskbar_in || Instant::now() >= deadline {
            break phases;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Ok(Resume {
        total,
        engine,
        pushed: ready.pushed && running.pushed,
        phases,
    })
}

/// `docker stop` with the engine's default timeout: (time, exit code).
async fn docker_stop(name: &str) -> Result<(Duration, i64)> {
    let started = Instant::now();
    docker_ok(&["stop", name]).await?;
    let took = started.elapsed();
    let facts = engine::inspect(name).await?.context("container vanished")?;
    Ok((took, facts.exit_code))
}

async fn shell(image: &str, args: &Args, scratch: &Path) -> Result<DesktopNumbers> {
    let script = scratch.join("entrypoint.sh");
    std::fs::write(&script, BASELINE_ENTRYPOINT)?;
    let name = unique_name("dormouse-bench-shell");
    let _guard = ContainerGuard::new(&name);
    docker_ok(&[
        "create",
        "--name",
        &name,
        "--label",
        &format!("{TEST_LABEL}=1"),
        "--network",
        "none",
        "--ulimit",
        "nofile=16384:16384",
        "--ulimit",
        "nproc=8192:8192",
        "-v",
        &format!("{}:/dormouse-baseline.sh:ro", script.display()),
        "--entrypoint",
        "/bin/bash",
        image,
        "/dormouse-baseline.sh",
    ])
    .await?;
    let guest = Guest::named(&name);
    let mut numbers = DesktopNumbers {
        first_ready: Some(start_and_poll(&guest, Duration::from_millis(50)).await?),
        ..DesktopNumbers::default()
    };

    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    numbers.memory = Some(memory(&name).await?);

    for _ in 0..args.stop_runs {
        let (took, code) = docker_stop(&name).await?;
        numbers.graceful_stop.push(took);
        *numbers.exit_codes.entry(code).or_default() += 1;
        numbers
            .resume_after_stop
            .push(start_and_poll(&guest, Duration::from_millis(50)).await?);
    }
    for _ in 0..args.runs {
        engine::kill(&name).await?;
        wait_not_running(&name).await?;
        numbers
            .resume_after_kill
            .push(start_and_poll(&guest, Duration::from_millis(50)).await?);
    }
    for _ in 0..args.slow_poll_runs {
        engine::kill(&name).await?;
        wait_not_running(&name).await?;
        numbers
            .slow_poll_resume
            .push(start_and_poll(&guest, Duration::from_millis(2000)).await?);
    }
    Ok(numbers)
}

/// `docker start`, then `docker exec` of [`BASELINE_READY`] every `every`
/// until it succeeds; the time from the start command to that success.
async fn start_and_poll(guest: &Guest, every: Duration) -> Result<Duration> {
    let started = Instant::now();
    docker_ok(&["start", guest.container()]).await?;
    loop {
        let out = engine::docker(&[
            "exec",
            "-u",
            "1000:1000",
            guest.container(),
            "sh",
            "-c",
            BASELINE_READY,
        ])
        .await?;
        if out.status.success() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!(
                "the shell baseline was not ready after {READY_TIMEOUT:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        tokio::time::sleep(every).await;
    }
}

/// PID 1's VmRSS, the sum of the RSS of every process (from the host, so no
/// exec process is counted) and the engine's memory figure (usage without
/// page cache, as `docker stats` shows it).
async fn memory(name: &str) -> Result<Memory> {
    let status = engine::docker(&["exec", name, "cat", "/proc/1/status"]).await?;
    let status = String::from_utf8_lossy(&status.stdout);
    let pid1_rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS for PID 1")?;
    let top = docker_ok(&["top", name, "-o", "pid,rss"]).await?;
    let processes_rss_kib = top
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    let stats = docker_ok(&["stats", "--no-stream", "--format", "{{.MemUsage}}", name]).await?;
    let cgroup_kib = stats.split('/').next().and_then(parse_size_kib);
    Ok(Memory {
        pid1_rss_kib,
        processes_rss_kib,
        cgroup_kib,
    })
}

/// `123.4MiB` → KiB.
fn parse_size_kib(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match unit {
        "B" => 1.0 / 1024.0,
        "KiB" | "kB" => 1.0,
        "MiB" | "MB" => 1024.0,
        "GiB" | "GB" => 1024.0 * 1024.0,
        _ => return None,
    };
    // Rounded KiB through its decimal form: a negative or non-finite figure
    // is no size, and no float is cast.
    format!("{:.0}", number * factor).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_stats_sizes_parse() {
        assert_eq!(parse_size_kib("123.5MiB"), Some(126_464));
        assert_eq!(parse_size_kib(" 2GiB "), Some(2 * 1024 * 1024));
        assert_eq!(parse_size_kib("512KiB"), Some(512));
        assert_eq!(parse_size_kib("lots"), None);
    }
}
