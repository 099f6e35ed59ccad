//! `dormouse-chaos` (run through `scripts/chaos`): kills a desktop at random
//! moments (while it boots, prepares, starts its services and probes, when
//! it is ready, and during a graceful stop), sometimes kills the broker too,
//! resumes through the API every time and checks that the desktop becomes
//! ready and that every file written and fsynced before a kill is intact.
//!
//! Prints one summary line on stdout:
//! `cycles=N failures=F lost_files=L resume_p50_ms=… resume_p95_ms=… resume_max_ms=…`
//! and exits non-zero on any failure. Progress goes to stderr. Everything it
//! creates (broker, container, data directory) is removed on exit, also on
//! Ctrl-C or SIGTERM.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{start_retrying, ApiClient, EventStream, Waits as _};
use dormouse_e2e::engine::{self, EngineEventRecorder, Killed};
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_e2e::latency::{ms, Samples};
use dormouse_protocol::api::{ComputerStatus, ContainerState, CreateComputer};
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use uuid::Uuid;

mod moments;

use moments::{check_reason, milestone, BrokerKill, Moment, MOMENTS};

const READY_TIMEOUT: Duration = Duration::from_secs(90);
const STOPPED_TIMEOUT: Duration = Duration::from_secs(60);
/// Where guest-written files go (the container's own layer).
const GUEST_DIR: &str = "/home/desk/chaos";

#[derive(Debug, Parser)]
#[command(about = "Kill Dormouse desktops at random moments and check every resume")]
struct Args {
    /// Kill-and-resume cycles.
    #[arg(long, default_value_t = 10)]
    cycles: usize,
    /// Seed of the random choices; a run is repeatable by its seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Desktop image; default $DORMOUSE_TEST_IMAGE or dormouse/desktop:latest.
    #[arg(long)]
    image: Option<String>,
    /// Percent of cycles in which the broker is killed (SIGKILL) too.
    #[arg(long, default_value_t = 25)]
    broker_kill_percent: u32,
    /// Kill only at these moments (comma-separated: boot, prepare, probe,
    /// ready, stop); all of them by default.
    #[arg(long, value_delimiter = ',')]
    moments: Vec<Moment>,
    /// Print a timeline of every action and every pushed status.
    #[arg(long)]
    verbose: bool,
}

/// A file written and fsynced before a kill, and what it must hold.
#[derive(Debug, Clone)]
struct Written {
    /// Guest path, or host path when `on_host`.
    path: PathBuf,
    contents: String,
    on_host: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // Dropping `run` on a signal drops the broker fixture, which removes the
    // container and the data directory.
    tokio::select! {
        code = run(args) => code,
        how = dormouse_e2e::termination() => match how {
            Ok(how) => { eprintln!("dormouse-chaos: {how}"); ExitCode::from(how.exit_code()) }
            Err(e) => { eprintln!("dormouse-chaos: cannot watch the signals: {e}"); ExitCode::FAILURE }
        },
    }
}

async fn run(args: Args) -> ExitCode {
    let seed = dormouse_e2e::seed_or_now(args.seed);
    eprintln!("dormouse-chaos: {} cycles, seed {seed}", args.cycles);
    let mut chaos = match Chaos::set_up(&args, seed).await {
        Ok(chaos) => chaos,
        Err(e) => {
            eprintln!("dormouse-chaos: setting up failed: {e:#}");
            println!(
                "cycles=0 failures=1 lost_files=0 resume_p50_ms=- resume_p95_ms=- resume_max_ms=-"
            );
            return ExitCode::FAILURE;
        }
    };
    let outcome = chaos.run(args.cycles, &args.moments).await;
    chaos.finish(outcome).await
}

/// One chaos run: its broker, its desktop, what it wrote and what it saw.
struct Chaos {
    broker: BrokerProcess,
    api: ApiClient,
    events: EventStream,
    id: Uuid,
    guest: Guest,
    container_id: String,
    recorder: Option<EngineEventRecorder>,
    rng: StdRng,
    broker_kill_percent: u32,
    files: Vec<Written>,
    resumes: Samples,
    /// Container running (as the broker reports it) → ready, per resume.
    guest_boot: Samples,
    /// How long a stop through the API takes, per stop.
    stops: Samples,
    failures: usize,
    lost_files: usize,
    cycles_done: usize,
    /// Timeline origin when `--verbose`.
    trace: Option<Instant>,
    /// How far the guest got before each kill, per intended moment.
    reached_at_kill: BTreeMap<(Moment, String), usize>,
}

impl Chaos {
    async fn set_up(args: &Args, seed: u64) -> Result<Self> {
        let image = engine::resolve_image(args.image.as_deref()).await?;
        let mut options = BrokerOptions::new(&image);
        // Every resume after a kill is the harness's own, to be timed: a
        // broker started again must not start the desktop by itself.
        options.extra_args = vec!["--resume-after-restart".into(), "none".into()];
        let broker = BrokerProcess::start(options).await?;
        let api = broker.client();
        let mut events = EventStream::open(&api).await?;
        let created = api
            .create(&CreateComputer {
                name: Some("chaos".into()),
                ..CreateComputer::default()
            })
            .await?;
        let id = created.id;
        api.wait_ready(&mut events, id, READY_TIMEOUT)
            .await
            .with_context(|| format!("first start; broker log:\n{}", broker.log_tail(3000)))?;
        let guest = Guest::for_computer(id);
        let container_id = engine::inspect(guest.container())
            .await?
            .context("the new desktop has no container")?
            .id;
        let recorder = Some(EngineEventRecorder::start(guest.container())?);
        guest
            .sh_ok(GuestUser::Desk, &format!("mkdir -p {GUEST_DIR}"))
            .await?;
        eprintln!("dormouse-chaos: computer {id}, image {image}");
        let mut chaos = Self {
            broker,
            api,
            events,
            id,
            guest,
            container_id,
            recorder,
            rng: StdRng::seed_from_u64(seed),
            broker_kill_percent: args.broker_kill_percent,
            files: Vec::new(),
            resumes: Samples::new(),
            guest_boot: Samples::new(),
            stops: Samples::new(),
            failures: 0,
            lost_files: 0,
            cycles_done: 0,
            reached_at_kill: BTreeMap::new(),
            trace: args.verbose.then(Instant::now),
        };
        if let Some(epoch) = chaos.trace {
            chaos.events.trace_since(epoch);
        }
        Ok(chaos)
    }

    async fn run(&mut self, cycles: usize, moments: &[Moment]) -> Result<()> {
        let moments = if moments.is_empty() {
            &MOMENTS[..]
        } else {
            moments
        };
        let mut plan = Vec::new();
        while plan.len() < cycles {
            // Every moment equally often: shuffled blocks of all of them.
            let mut block = moments.to_vec();
            block.shuffle(&mut self.rng);
            plan.extend(block);
        }
        plan.truncate(cycles);
        for (n, moment) in plan.into_iter().enumerate() {
            let broker_kill = if self.rng.gen_range(0..100) < self.broker_kill_percent {
                if self.rng.gen_bool(0.5) {
                    BrokerKill::Before
                } else {
                    BrokerKill::After
                }
            } else {
                BrokerKill::Spared
            };
            let started = Instant::now();
            let result = self.cycle(n + 1, moment, broker_kill).await;
            self.cycles_done += 1;
            match result {
                Ok(line) => eprintln!(
                    "cycle {}/{cycles} moment={moment} broker={broker_kill} {line} ({} ms)",
                    n + 1,
                    started.elapsed().as_millis()
                ),
                Err(e) => {
                    self.failures += 1;
                    eprintln!(
                        "cycle {}/{cycles} moment={moment} broker={broker_kill} FAILED: {e:#}",
                        n + 1
                    );
                    if let Err(e) = self.recover().await {
                        eprintln!(
                            "dormouse-chaos: cannot bring the desktop back, giving up: {e:#}"
                        );
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// With `--verbose`: one line of the timeline.
    fn note(&self, what: &str) {
        if let Some(epoch) = self.trace {
            eprintln!("  {:>7} ms  {what}", epoch.elapsed().as_millis());
        }
    }

    /// New event stream (after a broker restart), traced when verbose.
    async fn reconnect(&mut self) -> Result<()> {
        self.api = self.broker.client();
        self.events = EventStream::open(&self.api).await?;
        if let Some(epoch) = self.trace {
            self.events.trace_since(epoch);
        }
        Ok(())
    }

    /// One kill and resume; returns a line for the log.
    async fn cycle(&mut self, n: usize, moment: Moment, broker_kill: BrokerKill) -> Result<String> {
        self.note(&format!("cycle {n}: {moment}, broker {broker_kill}"));
        self.write_files(n).await?;
        let killed = match moment {
            Moment::Boot | Moment::Prepare | Moment::Probe => {
                self.stop_through_api().await?;
                let previous = engine::inspect(self.guest.container())
                    .await?
                    .context("the container is gone")?
                    .started_at;
                // POST start answers once the desktop is ready, so it stays in
                // flight while the kill lands. The moment is taken from the
                // engine itself, polled without the CLI.
                self.note("POST start (in flight)");
                let starting = self.spawn_start(false);
                engine::wait_running(self.guest.container(), &previous, STOPPED_TIMEOUT).await?;
                let running = Instant::now();
                let delay = self.kill_delay(moment);
                self.note(&format!("running; kill in {} ms", delay.as_millis()));
                tokio::time::sleep_until(running + delay).await;
                let killed = self.kill(broker_kill, false).await?;
                // The start fails (the container died before it was ready)
                // or, had it been ready already, succeeds; either is fair.
                let _ = starting.await;
                killed
            }
            Moment::Ready => {
                let delay = self.rng.gen_range(0..500);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                self.kill(broker_kill, false).await?
            }
            Moment::Stop => {
                let api = self.api.clone();
                let id = self.id;
                let stopping = tokio::spawn(async move { api.stop(id).await });
                // Somewhere inside the stop, as long as stops took so far.
                let typical = self
                    .stops
                    .p50()
                    .unwrap_or(Duration::from_millis(200))
                    .as_secs_f64();
                // The answer comes a little after the engine's stop ended.
                let delay = Duration::from_secs_f64(typical * self.rng.gen_range(0.0..0.6));
                self.note(&format!(
                    "POST stop (in flight); kill in {} ms",
                    delay.as_millis()
                ));
                tokio::time::sleep(delay).await;
                let killed = self.kill(broker_kill, true).await?;
                // The stop may fail (the container died under it, or the
                // broker did); only the resume that follows must succeed.
                let _ = stopping.await;
                killed
            }
        };

        let stopped = self
            .api
            .wait_stopped(&mut self.events, self.id, STOPPED_TIMEOUT)
            .await
            .context("the broker never reported the killed container stopped")?
            .status;
        // Where the guest really was, by its own log of the run that died.
        let reached = if killed == Killed::NotRunning {
            "stopped-before-kill".to_owned()
        } else {
            self.reached_before_kill().await
        };
        *self
            .reached_at_kill
            .entry((moment, reached.clone()))
            .or_default() += 1;
        if let Err(e) = check_reason(moment, &stopped) {
            let facts = engine::inspect(self.guest.container()).await.ok().flatten();
            return Err(e.context(format!("engine: {facts:?}")));
        }

        let took = self.resume().await?;
        self.resumes.push(took);
        self.verify_files().await?;
        let now = engine::inspect(self.guest.container())
            .await?
            .context("the container is gone")?;
        ensure!(
            now.id == self.container_id,
            "the container was replaced: {} is now {}",
            self.container_id,
            now.id
        );
        Ok(format!(
            "guest_reached={reached} reason={} resume_ms={} files={} ok",
            stopped
                .stop_reason
                .map(|r| format!("{r:?}").to_lowercase())
                .unwrap_or_else(|| "null".into()),
            took.as_millis(),
            self.files.len()
        ))
    }

    /// How long after the engine reported the container running the kill is
    /// sent: at once (boot), within the first tens of milliseconds
    /// (preparation), or late in the guest's typical time from running to
    /// ready, measured on every resume of this run (services ending, probe).
    fn kill_delay(&mut self, moment: Moment) -> Duration {
        let boot = self
            .guest_boot
            .p50()
            .unwrap_or(Duration::from_millis(400))
            .as_secs_f64();
        match moment {
            Moment::Boot => Duration::ZERO,
            // Preparation takes tens of milliseconds on a small home.
            Moment::Prepare => Duration::from_millis(self.rng.gen_range(0..40)),
            // The probe is the last stretch before ready.
            _ => Duration::from_secs_f64(boot * self.rng.gen_range(0.6..1.0)),
        }
    }

    /// The furthest milestone the supervisor logged in the run that was just
    /// killed (the container has not been started again yet).
    async fn reached_before_kill(&self) -> String {
        let name = self.guest.container();
        let Ok(Some(facts)) = engine::inspect(name).await else {
            return "unknown".into();
        };
        match engine::docker(&["logs", "--since", &facts.started_at, name]).await {
            Ok(out) => {
                let mut logs = String::from_utf8_lossy(&out.stdout).into_owned();
                logs.push_str(&String::from_utf8_lossy(&out.stderr));
                milestone(&logs).to_owned()
            }
            Err(_) => "unknown".into(),
        }
    }
    /// Writes one file from inside the guest and one into the workspace on
    /// the host, both fsynced, and remembers them.
    async fn write_files(&mut self, n: usize) -> Result<()> {
        let token = Uuid::new_v4().simple().to_string();
        let guest_path = format!("{GUEST_DIR}/cycle-{n}");
        self.guest
            .write_synced(GuestUser::Desk, &guest_path, &token)
            .await
            .context("writing a file in the guest")?;
        self.files.push(Written {
            path: guest_path.into(),
            contents: token.clone(),
            on_host: false,
        });
        let dir = self.broker.workspace(self.id).join("chaos");
        let host_path = dir.join(format!("cycle-{n}"));
        write_synced_on_host(&dir, &host_path, &token)?;
        self.files.push(Written {
            path: host_path,
            contents: token,
            on_host: true,
        });
        Ok(())
    }

    async fn verify_files(&mut self) -> Result<()> {
        let listing = self
            .guest
            .sh_ok(
                GuestUser::Desk,
                &format!(
                    "cd {GUEST_DIR} && for f in *; do [ -f \"$f\" ] && printf '%s %s\\n' \"$f\" \"$(cat \"$f\")\"; done; true"
                ),
            )
            .await
            .context("listing the guest's files")?;
        let in_guest: BTreeMap<&str, &str> =
            listing.lines().filter_map(|l| l.split_once(' ')).collect();
        let mut lost = Vec::new();
        self.files.retain(|file| {
            let found = if file.on_host {
                std::fs::read_to_string(&file.path).ok()
            } else {
                let name = file.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                in_guest.get(name).map(|c| (*c).to_owned())
            };
            let intact = found.as_deref() == Some(file.contents.as_str());
            if !intact {
                lost.push(format!(
                    "{} ({})",
                    file.path.display(),
                    if file.on_host { "host" } else { "guest" }
                ));
            }
            // A lost file is counted once, then forgotten.
            intact
        });
        if !lost.is_empty() {
            self.lost_files += lost.len();
            bail!("files lost: {}", lost.join(", "));
        }
        Ok(())
    }

    async fn stop_through_api(&mut self) -> Result<()> {
        self.note("POST stop");
        let asked = Instant::now();
        self.api.stop(self.id).await?;
        self.stops.push(asked.elapsed());
        self.note("POST stop answered");
        self.api
            .wait_stopped(&mut self.events, self.id, STOPPED_TIMEOUT)
            .await?;
        Ok(())
    }

    /// `POST start` in the background (it answers once the desktop is ready).
    /// `retry`: retry while the broker is still settling a stop; never for a
    /// start that is about to be killed, whose failure is the point.
    fn spawn_start(&self, retry: bool) -> tokio::task::JoinHandle<Result<ComputerStatus>> {
        let api = self.api.clone();
        let id = self.id;
        tokio::spawn(async move {
            if retry {
                start_retrying(&api, id).await
            } else {
                Ok(api.start(id).await?)
            }
        })
    }

    /// POST start → ready pushed; the resume latency. Also learns how long
    /// the guest takes from a running container to ready.
    async fn resume(&mut self) -> Result<Duration> {
        self.note("resume: POST start");
        let asked = Instant::now();
        let starting = self.spawn_start(true);
        let running = self
            .api
            .wait_for(
                &mut self.events,
                self.id,
                "the container runs",
                READY_TIMEOUT,
                |s| s.container == ContainerState::Running,
            )
            .await?;
        let ready = self
            .api
            .wait_ready(&mut self.events, self.id, READY_TIMEOUT)
            .await
            .with_context(|| format!("resume; broker log:\n{}", self.broker.log_tail(2000)))?;
        starting
            .await
            .context("start task")?
            .context("POST start after the kill")?;
        if !running.status.ready && ready.at > running.at {
            self.guest_boot.push(ready.at.duration_since(running.at));
        }
        Ok(ready.at.duration_since(asked))
    }

    /// Kills the container (SIGKILL through the engine API, so it lands
    /// when meant), and the broker before or after it as planned, then
    /// starts the broker again on the same data directory. A container that
    /// is not running is an error unless a stop was racing the kill.
    async fn kill(&mut self, broker_kill: BrokerKill, racing_stop: bool) -> Result<Killed> {
        if broker_kill == BrokerKill::Before {
            self.broker.kill(Signal::SIGKILL).await?;
            self.note("broker killed");
        }
        let killed = engine::kill_now(self.guest.container()).await?;
        self.note(&format!("container kill: {killed:?}"));
        ensure!(
            killed == Killed::Killed || racing_stop,
            "the container was not running when it was to be killed"
        );
        if broker_kill == BrokerKill::After {
            self.broker.kill(Signal::SIGKILL).await?;
            self.note("broker killed");
        }
        if broker_kill != BrokerKill::Spared {
            self.broker.start_again().await?;
            self.note("broker started again");
            self.reconnect().await?;
        }
        Ok(killed)
    }

    /// After a failed cycle: a running broker and a ready desktop again.
    async fn recover(&mut self) -> Result<()> {
        if self.broker.pid().is_none() || !self.api.healthy().await {
            self.broker.restart().await?;
        }
        self.reconnect().await?;
        let status = self.api.get(self.id).await?;
        if status.container != ContainerState::Running {
            start_retrying(&self.api, self.id).await?;
        }
        self.api
            .wait_ready(&mut self.events, self.id, READY_TIMEOUT)
            .await?;
        Ok(())
    }

    async fn finish(mut self, outcome: Result<()>) -> ExitCode {
        if outcome.is_err() {
            // Giving up is a failure of its own: the remaining cycles never ran
            // (`cycles=` in the summary says how many did).
            self.failures += 1;
        }
        if let Some(recorder) = self.recorder.take() {
            let actions = recorder.finish().await;
            if let Err(e) = engine::ensure_never_rebuilt(&actions) {
                self.failures += 1;
                eprintln!("dormouse-chaos: {e:#}");
            }
        }
        eprintln!("dormouse-chaos: how far the guest got before the kill (its own log), per intended moment:");
        for ((moment, phase), count) in &self.reached_at_kill {
            eprintln!("  {moment:<8} {phase:<22} {count}");
        }
        if self.failures > 0 {
            eprintln!(
                "dormouse-chaos: broker log tail:\n{}",
                self.broker.log_tail(4000)
            );
        }
        println!(
            "cycles={} failures={} lost_files={} resume_p50_ms={} resume_p95_ms={} resume_max_ms={}",
            self.cycles_done,
            self.failures,
            self.lost_files,
            ms(self.resumes.p50()),
            ms(self.resumes.p95()),
            ms(self.resumes.max())
        );
        let _ = std::io::stdout().flush();
        if self.failures == 0 && self.lost_files == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

/// Writes `contents` to `path` on the host (temp file, fsync, rename, fsync
/// the directory) owned by the desktop user, as a host-side tool would.
fn write_synced_on_host(dir: &Path, path: &Path, contents: &str) -> Result<()> {
    use std::fs::{self, File};
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()?;
    let desk = Some(nix::unistd::Uid::from_raw(1000));
    let desk_group = Some(nix::unistd::Gid::from_raw(1000));
    nix::unistd::chown(dir, desk, desk_group).context("chown to the desktop user")?;
    nix::unistd::chown(path, desk, desk_group).context("chown to the desktop user")?;
    Ok(())
}
