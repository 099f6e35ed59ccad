//! `dormouse-bench-load` (run through `scripts/bench-load`): limits under
//! load, measured.
//!
//! Three desktops under one broker: the measured one, a busy one (running,
//! its workspace holding `--size-mib` of files) and an import target
//! (stopped). On the measured desktop it times the round trip of a
//! `mouse_move` through `POST /v1/computers/{id}/actions` and the live
//! screen's first frame (WebSocket open to the last byte of the first
//! whole-screen update, ZRLE as noVNC asks; [`dormouse_e2e::frames`]),
//! first with everything else idle, then while `--clients` clients hammer
//! the broker (a third each: status reads, `/v1/events` streams opened,
//! read and dropped, screenshots of the busy desktop) and, over and over,
//! the busy desktop's workspace is exported and a tar of the same size is
//! imported into the stopped one. Both phases print side by side, with the
//! load that ran and the targets (p99 < 50 ms, first frame < 300 ms). The
//! load has a runtime and a client of its own, as another agent's would:
//! the timed requests never wait behind its tasks. `--busy-cpu-shares`
//! lowers the busy desktop's CPU weight through the engine first; `--kinds`
//! and `--clients 0` take the load apart.
//!
//! A benchmark, not a test: it prints figures beside the targets and never
//! asserts them. Its containers are removed when it ends.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use dormouse_client::Upload;
use dormouse_e2e::archive::tar_entry;
use dormouse_e2e::broker::{cpu_seconds, memory_kib, BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream, Waits as _};
use dormouse_e2e::engine::docker_ok;
use dormouse_e2e::frames::{first_frame, ZRLE};
use dormouse_e2e::latency::{ms, Samples};
use dormouse_e2e::TempDir;
use dormouse_protocol::actions::ActionBatch;
use dormouse_protocol::screen::{CreateScreen, ScreenGrant, ScreenMode};
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

const TARGET_ACTION_P99: Duration = Duration::from_millis(50);
const TARGET_FIRST_FRAME: Duration = Duration::from_millis(300);
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// Size of each file in the archive.
const FILE_MIB: usize = 64;
/// How long the load runs before the measured desktop is timed.
const WARM_UP: Duration = Duration::from_secs(3);

#[derive(Debug, Parser)]
#[command(about = "A desktop's action round trip and first frame, idle and under load, in one run")]
struct Args {
    /// Desktop image (ID or reference); default $DORMOUSE_TEST_IMAGE.
    #[arg(long)]
    image: Option<String>,
    /// Clients hammering the broker.
    #[arg(long, default_value_t = 20)]
    clients: usize,
    /// MiB of the export and of the import.
    #[arg(long, default_value_t = 1024)]
    size_mib: usize,
    /// Action round trips timed per phase.
    #[arg(long, default_value_t = 300)]
    actions: usize,
    /// First frames timed per phase.
    #[arg(long, default_value_t = 15)]
    frames: usize,
    /// The busy desktop's CPU weight, set through the engine (`docker
    /// update --cpu-shares`) once it runs: what holding its work below the
    /// measured desktop's would give. Default: the engine's (1024).
    #[arg(long)]
    busy_cpu_shares: Option<u32>,
    /// What the clients do, shared among them in turn (to take the load
    /// apart).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "status,events,screenshots"
    )]
    kinds: Vec<ClientKind>,
}

/// One kind of client work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ClientKind {
    /// Status reads of the busy and the measured desktop, by turns.
    Status = 0,
    /// `/v1/events` streams opened, read for half a second and dropped.
    Events = 1,
    /// Screenshots of the busy desktop.
    Screenshots = 2,
}

#[tokio::main]
async fn main() -> ExitCode {
    dormouse_e2e::run_to_end_or_signal("dormouse-bench-load", run(Args::parse())).await
}

/// What the measured desktop showed in one phase.
#[derive(Debug, Default)]
struct Phase {
    actions: Samples,
    frames: Samples,
}

/// Where the load runs and what it shares: its runtime and client (apart
/// from the timed requests'), the flag that ends it and its counters.
struct Spawner {
    runtime: tokio::runtime::Handle,
    api: ApiClient,
    stop: Arc<AtomicBool>,
    load: Arc<Load>,
}

/// What the load did while it ran.
#[derive(Debug, Default)]
struct Load {
    requests: [AtomicU64; 3],
    errors: AtomicU64,
    exports: AtomicU64,
    imports: AtomicU64,
    transfer_errors: AtomicU64,
    export_ms: AtomicU64,
    import_ms: AtomicU64,
}

async fn run(args: Args) -> Result<()> {
    let image = match args.image.clone() {
        Some(i) => i,
        None => std::env::var("DORMOUSE_TEST_IMAGE")
            .context("give --image or set DORMOUSE_TEST_IMAGE (scripts/bench-load does)")?,
    };
    let mut options = BrokerOptions::new(&image);
    options.max_instances = Some(3);
    let broker = BrokerProcess::start(options).await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let scratch = TempDir::new("dormouse-bench-load");
    let archive = scratch.path().join("workspace.tar");
    let bytes = write_archive(&archive, args.size_mib)?;
    eprintln!(
        "dormouse-bench-load: archive of {} MiB written",
        bytes >> 20
    );

    // The import target, stopped; the busy desktop, filled through an
    // import while stopped, then started; the measured desktop.
    let target = create_ready(&api, &mut events, "load-import", READY_TIMEOUT).await?;
    api.stop(target).await?;
    api.wait_stopped(&mut events, target, READY_TIMEOUT).await?;
    let busy = create_ready(&api, &mut events, "load-busy", READY_TIMEOUT).await?;
    api.stop(busy).await?;
    api.wait_stopped(&mut events, busy, READY_TIMEOUT).await?;
    let filled = Instant::now();
    api.import(busy, Upload::file(&archive).await?).await?;
    eprintln!(
        "   busy desktop filled by an import of {} MiB in {} ms (nothing else running)",
        bytes >> 20,
        filled.elapsed().as_millis()
    );
    api.start(busy).await?;
    api.wait_ready(&mut events, busy, READY_TIMEOUT).await?;
    if let Some(shares) = args.busy_cpu_shares {
        weigh(busy, shares).await?;
    }
    let measured = create_ready(&api, &mut events, "load-measured", READY_TIMEOUT).await?;
    // Let the first paints settle before anything is timed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let view = mint(&api, measured).await?;

    eprintln!("== idle");
    let idle = measure(&broker, &api, measured, &view, &args).await?;

    eprintln!(
        "== under load: {} clients, export and import of {} MiB",
        args.clients,
        bytes >> 20
    );
    // The load runs on a runtime of its own, with a client of its own: the
    // timed requests stand for another agent's, which never waits in the
    // load's task queue (when both shared one runtime, that queue was part
    // of every figure under load).
    let load_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-load")
        .enable_all()
        .build()?;
    let on = Spawner {
        runtime: load_runtime.handle().clone(),
        api: broker.client(),
        stop: Arc::new(AtomicBool::new(false)),
        load: Arc::new(Load::default()),
    };
    let mut tasks = JoinSet::new();
    spawn_transfers(&mut tasks, &on, busy, target, &archive);
    if !args.kinds.is_empty() {
        for n in 0..args.clients {
            let kind = args.kinds[n % args.kinds.len()];
            spawn_client(&mut tasks, &on, kind, [busy, measured]);
        }
    }
    let pid = broker.pid().context("broker pid")?;
    let load_began = Instant::now();
    let cpu_began = cpu_seconds(pid)?;
    tokio::time::sleep(WARM_UP).await;
    let loaded = measure(&broker, &api, measured, &view, &args).await?;
    let measured_for = load_began.elapsed();
    let broker_cpu = (cpu_seconds(pid)? - cpu_began) / measured_for.as_secs_f64();
    on.stop.store(true, Ordering::SeqCst);
    while tasks.join_next().await.is_some() {}
    load_runtime.shutdown_background();
    let (_, broker_peak_kib) = memory_kib(pid)?;
    let host = Host {
        broker_cpu,
        broker_peak_kib,
        load_average: load_average(),
    };
    print_report(&args, bytes, &idle, &loaded, &on.load, measured_for, &host);
    Ok(())
}

/// A tar of `mib` MiB of file content in files of [`FILE_MIB`], written to
/// `path`; returns the content bytes. The bytes are varied so no layer on
/// the way can store them as holes.
fn write_archive(path: &Path, mib: usize) -> Result<u64> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let files = mib.div_ceil(FILE_MIB).max(1);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut total = 0u64;
    for i in 0..files {
        let mut data = vec![0u8; FILE_MIB << 20];
        for chunk in data.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        total += u64::try_from(data.len())?;
        out.write_all(&tar_entry(
            &format!("load/file-{i:03}.bin"),
            b'0',
            &data,
            "",
        ))?;
    }
    out.write_all(&[0u8; 1024])?;
    out.flush()?;
    Ok(total)
}

/// Sets the CPU weight of computer `id`'s container and reads it back.
async fn weigh(id: Uuid, shares: u32) -> Result<()> {
    let container = format!("dormouse-{id}");
    let shares = shares.to_string();
    docker_ok(&["update", "--cpu-shares", &shares, &container]).await?;
    let now = docker_ok(&["inspect", "-f", "{{.HostConfig.CpuShares}}", &container]).await?;
    anyhow::ensure!(
        now == shares,
        "the busy desktop's CPU weight reads {now:?}, not {shares}"
    );
    eprintln!("   busy desktop's CPU weight set to {shares} (the engine's default is 1024)");
    Ok(())
}

async fn mint(api: &ApiClient, id: Uuid) -> Result<ScreenGrant> {
    Ok(api
        .create_screen(
            id,
            &CreateScreen {
                mode: ScreenMode::View,
                ttl_ms: Some(3_600_000),
                reason: None,
            },
        )
        .await?)
}

/// The measured desktop's action round trips, then its first frames.
async fn measure(
    broker: &BrokerProcess,
    api: &ApiClient,
    id: Uuid,
    view: &ScreenGrant,
    args: &Args,
) -> Result<Phase> {
    let mut phase = Phase::default();
    for i in 0..args.actions {
        let x = 400 + (i % 2) * 40;
        let batch: ActionBatch = serde_json::from_value(
            json!({"actions": [{"action": "mouse_move", "coordinate": [x, 300]}]}),
        )?;
        let started = Instant::now();
        api.actions(id, &batch).await?;
        phase.actions.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..args.frames {
        let (took, _) = first_frame(broker, view, ZRLE).await?;
        phase.frames.push(took);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(phase)
}

/// Over and over until `stop`: the busy desktop's workspace exported (to
/// nowhere) while the archive is imported into the stopped target.
fn spawn_transfers(
    tasks: &mut JoinSet<()>,
    on: &Spawner,
    busy: Uuid,
    target: Uuid,
    archive: &Path,
) {
    let (api2, stop2, load2) = (on.api.clone(), on.stop.clone(), on.load.clone());
    let (api, stop, load) = (on.api.clone(), on.stop.clone(), on.load.clone());
    tasks.spawn_on(
        async move {
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let mut sink = std::io::sink();
                match api.export(busy, false, &mut sink).await {
                    Ok(_) => {
                        load.exports.fetch_add(1, Ordering::SeqCst);
                        load.export_ms.fetch_add(millis(started), Ordering::SeqCst);
                    }
                    Err(e) => {
                        eprintln!("   export failed: {e}");
                        load.transfer_errors.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        },
        &on.runtime,
    );
    let archive: PathBuf = archive.to_owned();
    tasks.spawn_on(
        async move {
            while !stop2.load(Ordering::SeqCst) {
                let started = Instant::now();
                let result = match Upload::file(&archive).await {
                    Ok(upload) => api2
                        .import(target, upload)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match result {
                    Ok(()) => {
                        load2.imports.fetch_add(1, Ordering::SeqCst);
                        load2.import_ms.fetch_add(millis(started), Ordering::SeqCst);
                    }
                    Err(e) => {
                        eprintln!("   import failed: {e}");
                        load2.transfer_errors.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        },
        &on.runtime,
    );
}

fn millis(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A client that does `kind` over and over until `stop`.
fn spawn_client(
    tasks: &mut JoinSet<()>,
    on: &Spawner,
    kind: ClientKind,
    [busy, measured]: [Uuid; 2],
) {
    let (api, stop, load) = (on.api.clone(), on.stop.clone(), on.load.clone());
    tasks.spawn_on(
        async move {
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let ok = match kind {
                    ClientKind::Status => api
                        .get(if i % 2 == 0 { busy } else { measured })
                        .await
                        .is_ok(),
                    ClientKind::Events => match api.events().await {
                        Ok(mut stream) => {
                            let until = Instant::now() + Duration::from_millis(500);
                            while let Ok(Ok(Some(_))) =
                                tokio::time::timeout_at(until, stream.next()).await
                            {
                            }
                            true
                        }
                        Err(_) => false,
                    },
                    ClientKind::Screenshots => api.screenshot(busy).await.is_ok(),
                };
                load.requests[kind as usize].fetch_add(1, Ordering::SeqCst);
                if !ok {
                    load.errors.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                i += 1;
            }
        },
        &on.runtime,
    );
}

/// The broker and the host while the load ran.
struct Host {
    /// CPU time per wall second (1.0: one core busy).
    broker_cpu: f64,
    broker_peak_kib: u64,
    /// The host's 1-minute load average at the end.
    load_average: Option<String>,
}

fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next().map(str::to_owned)
}

fn print_report(
    args: &Args,
    bytes: u64,
    idle: &Phase,
    loaded: &Phase,
    load: &Load,
    window: Duration,
    host: &Host,
) {
    let trio = |s: &Samples| format!("{}/{}/{}", ms(s.p50()), ms(s.percentile(99.0)), ms(s.max()));
    let check = |ok: bool| if ok { "met" } else { "MISSED" };
    println!("\ndormouse bench-load: one desktop idle, then beside a loaded broker (times in ms, p50/p99/max)");
    if let Some(shares) = args.busy_cpu_shares {
        println!("the busy desktop's CPU weight: {shares} (the engine's default: 1024)");
    }
    println!("{:<58} {:>16} {:>16}", "", "idle", "under load");
    println!(
        "{:<58} {:>16} {:>16}",
        format!(
            "action round trip (mouse_move, POST …/actions), n={}",
            args.actions
        ),
        trio(&idle.actions),
        trio(&loaded.actions)
    );
    println!(
        "{:<58} {:>16} {:>16}",
        format!(
            "first frame (WebSocket open -> whole screen, ZRLE), n={}",
            args.frames
        ),
        trio(&idle.frames),
        trio(&loaded.frames)
    );
    let p99 = loaded.actions.percentile(99.0);
    let frame = loaded.frames.max();
    println!(
        "targets under load: action p99 {} ms (< {} ms): {}; first frame max {} ms (< {} ms): {}",
        ms(p99),
        TARGET_ACTION_P99.as_millis(),
        check(p99.is_some_and(|p| p < TARGET_ACTION_P99)),
        ms(frame),
        TARGET_FIRST_FRAME.as_millis(),
        check(frame.is_some_and(|f| f < TARGET_FIRST_FRAME))
    );
    let secs = window.as_secs_f64();
    let [status, events, shots] = &load.requests;
    let count = |a: &AtomicU64| a.load(Ordering::SeqCst);
    println!(
        "load over {secs:.1} s: {} clients: {} status reads ({:.0}/s), {} event streams opened and read ({:.0}/s), {} screenshots of the busy desktop ({:.0}/s), {} errors",
        args.clients,
        count(status),
        count(status) as f64 / secs,
        count(events),
        count(events) as f64 / secs,
        count(shots),
        count(shots) as f64 / secs,
        count(&load.errors)
    );
    let rate = |n: u64, total_ms: u64| {
        if n == 0 || total_ms == 0 {
            "-".to_owned()
        } else {
            format!(
                "{:.0} MB/s",
                (bytes * n) as f64 / 1e6 / (total_ms as f64 / 1000.0)
            )
        }
    };
    println!(
        "transfers of {} MiB each: {} exports of the busy desktop ({}), {} imports into the stopped one ({}), {} failed; broker CPU {:.0} % of one core, peak RSS {:.0} MiB; host load average {} on {} CPUs",
        bytes >> 20,
        count(&load.exports),
        rate(count(&load.exports), count(&load.export_ms)),
        count(&load.imports),
        rate(count(&load.imports), count(&load.import_ms)),
        count(&load.transfer_errors),
        host.broker_cpu * 100.0,
        host.broker_peak_kib as f64 / 1024.0,
        host.load_average.as_deref().unwrap_or("-"),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
}
