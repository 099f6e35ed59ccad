//! End-to-end: a broker crash at every step of every operation (issue 27,
//! item 4), against the real engine and the real desktop image.
//!
//! `dormoused-faults` is `dormoused` with crash points (feature
//! `fault-injection`, `dormouse_core::faults`): `DORMOUSE_FAULT=<op>:<N>`
//! makes it abort at the Nth step of `<op>`. For each operation the walk
//! tries N = 1, 2, … until the operation completes without reaching step N:
//! start the faulty broker armed for N, call the operation, see the process
//! end by SIGABRT, start the plain `dormoused` on the same data directory,
//! and check with witnesses that do not go through the broker (docker
//! inspect, the workspace and the records on disk) and with the API that the
//! operation took effect completely or not at all; then the next call of
//! the same operation succeeds. The matrix (operation × step → outcome) is
//! printed.
//!
//! `DORMOUSE_CRASH_STEPS=all` walks every step of every operation (about
//! 8 minutes); without it (CI) the operations that make or stop a desktop
//! at every step (create, remove, resume, stop) crash at every
//! [`CI_STRIDE`]th step only, from the first to past the last, and the cheap
//! ones at all of theirs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dormouse_e2e::archive::{tar, tar_entry};
use dormouse_e2e::broker::{
    broker_binary, containers_mounting, faulty_broker_binary, BrokerOptions, BrokerProcess,
};
use dormouse_e2e::client::{ApiClient, EventStream, Waits as _};
use dormouse_e2e::engine;
use dormouse_e2e::test_image;
use dormouse_protocol::api::{
    ComputerStatus, ContainerState, CreateComputer, LeaseRequest, StopReason,
};
use dormouse_protocol::guest::Phase;
use dormouse_protocol::screen::{CreateScreen, ScreenMode};
use nix::sys::signal::Signal;
use uuid::Uuid;

/// Longest a call may take before the walk gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// No operation has more steps than this; a walk that gets here is broken.
const MAX_STEPS: u32 = 60;
/// The stride of the walk over an expensive operation in CI (1 with
/// `DORMOUSE_CRASH_STEPS=all`).
const CI_STRIDE: usize = 4;
/// How long a desktop may take to be ready.
const READY: Duration = Duration::from_secs(120);

/// What a crash left, as the witnesses see it after the restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Nothing of the operation is left.
    None,
    /// All of it.
    Whole,
}

/// One cell of the matrix.
#[derive(Debug)]
struct Row {
    op: &'static str,
    step: u32,
    label: String,
    outcome: String,
}

/// How an armed run ended.
enum Hit {
    /// The broker aborted at the armed step, with its label.
    Crashed(String),
    /// The operation completed in this many steps, short of the armed one.
    Completed(u32),
}

/// One broker data directory, the two binaries, and the matrix so far.
struct Rig {
    broker: BrokerProcess,
    faulty: PathBuf,
    normal: PathBuf,
    rows: Vec<Row>,
    all: bool,
}

impl Rig {
    async fn new(image: &str) -> Result<Self> {
        let normal = broker_binary()?;
        let faulty = faulty_broker_binary()?;
        let broker = BrokerProcess::start(BrokerOptions::new(image)).await?;
        Ok(Self {
            broker,
            faulty,
            normal,
            rows: Vec::new(),
            all: std::env::var("DORMOUSE_CRASH_STEPS").as_deref() == Ok("all"),
        })
    }

    fn api(&self) -> ApiClient {
        self.broker.client()
    }

    fn log_len(&self) -> usize {
        std::fs::read(self.broker.log_path())
            .map(|b| b.len())
            .unwrap_or(0)
    }

    /// The broker on the faulty binary, armed for `op`:`n`; returns where
    /// its log starts.
    async fn arm(&mut self, op: &str, n: u32) -> Result<usize> {
        self.broker.kill(Signal::SIGKILL).await?;
        let armed = vec![("DORMOUSE_FAULT".to_owned(), format!("{op}:{n}"))];
        self.broker.use_binary(self.faulty.clone(), armed);
        let from = self.log_len();
        self.broker.start_again().await?;
        Ok(from)
    }

    /// Whether the armed broker aborted at step `n` of `op`.
    async fn hit(&mut self, op: &str, n: u32, from: usize, call_ok: bool) -> Result<Hit> {
        let wait = if call_ok { 1 } else { 15 };
        let exited = self.broker.wait_exit(Duration::from_secs(wait)).await?;
        let log = std::fs::read(self.broker.log_path())?;
        let log = String::from_utf8_lossy(&log[from.min(log.len())..]).into_owned();
        let prefix = format!("dormouse-fault: {op} step ");
        let taken = log
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|rest| rest.split(':').next()?.parse::<u32>().ok())
            .max()
            .unwrap_or(0);
        match exited {
            Some(status) => {
                ensure!(
                    status.signal() == Some(Signal::SIGABRT as i32),
                    "{op}:{n}: the broker ended by {status}, not by the armed abort"
                );
                let marker = format!("dormouse-fault: aborting at {op} step {n}: ");
                let label = log
                    .lines()
                    .find_map(|l| l.strip_prefix(&marker))
                    .with_context(|| format!("{op}:{n}: aborted without saying where"))?;
                Ok(Hit::Crashed(label.to_owned()))
            }
            None => {
                ensure!(call_ok, "{op}:{n}: the call failed but the broker runs on");
                ensure!(taken < n, "{op}:{n}: step {taken} passed without a crash");
                Ok(Hit::Completed(taken))
            }
        }
    }

    /// The plain `dormoused` again, on the same data directory.
    async fn recover(&mut self) -> Result<()> {
        if self.broker.pid().is_some() {
            self.broker.kill(Signal::SIGKILL).await?;
        }
        self.broker.use_binary(self.normal.clone(), Vec::new());
        self.broker.start_again().await
    }

    /// Waits until no stop is under way (a restart finishes a stop a crash
    /// cut short before it serves the desktop's other calls), then answers
    /// whether the engine says the container runs, and the broker's status.
    async fn settled(&self, id: Uuid) -> Result<(bool, ComputerStatus)> {
        let api = self.api();
        let mut events = EventStream::open(&api).await?;
        api.wait_for(&mut events, id, "no stop under way", READY, |s| {
            s.phase != Some(Phase::Stopping)
        })
        .await?;
        let facts = engine::inspect(&format!("dormouse-{id}"))
            .await?
            .context("the container is gone")?;
        Ok((facts.status == "running", api.get(id).await?))
    }

    async fn ready(&self, id: Uuid) -> Result<()> {
        let api = self.api();
        let mut events = EventStream::open(&api).await?;
        api.wait_ready(&mut events, id, READY).await?;
        Ok(())
    }

    /// A new desktop, answered once it runs (ready too when `ready`).
    async fn desktop(&self, name: &str, ready: bool) -> Result<Uuid> {
        let api = self.api();
        let made = api
            .create(&CreateComputer {
                name: Some(name.to_owned()),
                ..Default::default()
            })
            .await?;
        if ready {
            self.ready(made.id).await?;
        }
        Ok(made.id)
    }

    /// Running and ready, started if it was stopped.
    async fn running(&self, id: Uuid) -> Result<()> {
        if self.api().get(id).await?.container != ContainerState::Running {
            self.api().start(id).await?;
        }
        self.ready(id).await
    }

    /// Stopped, stopped if it ran.
    async fn stopped(&self, id: Uuid) -> Result<()> {
        if self.api().get(id).await?.container == ContainerState::Running {
            self.api().stop(id).await?;
        }
        Ok(())
    }

    fn print(&self, title: &str) {
        eprintln!("\ncrash-step matrix: {title}");
        eprintln!("| operation | step | crashed at | after the restart |");
        eprintln!("|---|---|---|---|");
        for r in &self.rows {
            eprintln!("| {} | {} | {} | {} |", r.op, r.step, r.label, r.outcome);
        }
    }
}

/// One operation under the walk.
trait Operation {
    /// Its `DORMOUSE_FAULT` name.
    const NAME: &'static str;
    /// Its name in the matrix.
    const TITLE: &'static str = Self::NAME;
    /// Walked to the end in CI too (each step is a restart or two).
    const CHEAP: bool = false;
    /// Whether it changes nothing that outlives the broker (export, a
    /// screen capability): then "not at all" is also its complete outcome.
    const LEAVES_NOTHING: bool = false;
    /// Its precondition, on the plain broker.
    async fn before(&mut self, rig: &Rig, n: u32) -> Result<()>;
    /// On the armed broker, before the call (a guest call waits until the
    /// restarted broker sees the desktop ready).
    async fn armed(&mut self, _rig: &Rig) -> Result<()> {
        Ok(())
    }
    /// The call, on the armed broker.
    async fn call(&mut self, api: &ApiClient, n: u32) -> Result<()>;
    /// After the restart: what is left, by the witnesses; an error for
    /// anything half done.
    async fn check(&mut self, rig: &Rig, n: u32) -> Result<Effect>;
    /// What the last check saw, for the matrix (e.g. whether a create left
    /// the desktop running or stopped).
    fn note(&self) -> Option<String> {
        None
    }
    /// After a crash: the next call of the same operation succeeds.
    async fn again(&mut self, rig: &Rig, n: u32, effect: Effect) -> Result<()>;
}

/// Walks `op` over its steps; returns how many it has.
async fn walk<O: Operation>(rig: &mut Rig, op: &mut O) -> Result<u32> {
    let stride = if rig.all || O::CHEAP { 1 } else { CI_STRIDE };
    for n in (1..=MAX_STEPS).step_by(stride) {
        op.before(rig, n)
            .await
            .with_context(|| format!("{}:{n}: before", O::NAME))?;
        let from = rig.arm(O::NAME, n).await?;
        op.armed(rig)
            .await
            .with_context(|| format!("{}:{n}: armed", O::NAME))?;
        let api = rig.api();
        let called = tokio::time::timeout(CALL_TIMEOUT, op.call(&api, n)).await;
        let call_ok = matches!(called, Ok(Ok(())));
        let hit = rig.hit(O::NAME, n, from, call_ok).await?;
        rig.recover().await?;
        let effect = op
            .check(rig, n)
            .await
            .with_context(|| format!("{}:{n}: after the restart", O::NAME))?;
        match hit {
            Hit::Crashed(label) => {
                op.again(rig, n, effect)
                    .await
                    .with_context(|| format!("{}:{n}: the next call", O::NAME))?;
                let outcome = match (effect, op.note()) {
                    (Effect::None, _) if O::LEAVES_NOTHING => "nothing left".to_owned(),
                    (Effect::None, _) => "not at all".to_owned(),
                    (Effect::Whole, None) => "completely".to_owned(),
                    (Effect::Whole, Some(note)) => format!("completely ({note})"),
                };
                let outcome = format!("{outcome}; next call ok");
                rig.rows.push(Row {
                    op: O::TITLE,
                    step: n,
                    label,
                    outcome,
                });
            }
            Hit::Completed(steps) => {
                ensure!(
                    effect == Effect::Whole || O::LEAVES_NOTHING,
                    "{}: completed but the witnesses disagree",
                    O::NAME
                );
                rig.rows.push(Row {
                    op: O::TITLE,
                    step: n,
                    label: format!("(none: completed in {steps} steps)"),
                    outcome: "completed".into(),
                });
                return Ok(steps);
            }
        }
    }
    bail!("{}: more than {MAX_STEPS} steps", O::NAME)
}

#[path = "crash_steps/ops.rs"]
mod ops;

use ops::*;

/// The shipped `dormoused` carries no crash point: the string that arms
/// one is only in `dormoused-faults`, and arming the plain binary does
/// nothing (a create runs through).
#[tokio::test]
async fn the_shipped_broker_has_no_crash_points() -> Result<()> {
    let shipped = std::fs::read(broker_binary()?)?;
    let faulty = std::fs::read(faulty_broker_binary()?)?;
    let needle = b"DORMOUSE_FAULT";
    let has = |bin: &[u8]| bin.windows(needle.len()).any(|w| w == needle);
    ensure!(
        has(&faulty),
        "dormoused-faults does not read DORMOUSE_FAULT"
    );
    ensure!(
        !has(&shipped),
        "the shipped dormoused mentions DORMOUSE_FAULT"
    );
    let Some(image) = test_image("the_shipped_broker_has_no_crash_points") else {
        return Ok(());
    };
    let mut rig = Rig::new(&image).await?;
    rig.broker.kill(Signal::SIGKILL).await?;
    let armed = vec![("DORMOUSE_FAULT".to_owned(), "create:1".to_owned())];
    rig.broker.use_binary(rig.normal.clone(), armed);
    rig.broker.start_again().await?;
    let id = rig.desktop("armed-but-shipped", false).await?;
    ensure!(rig
        .broker
        .wait_exit(Duration::from_secs(1))
        .await?
        .is_none());
    ensure!(engine::inspect(&format!("dormouse-{id}")).await?.is_some());
    Ok(())
}

#[tokio::test]
async fn a_crash_at_every_step_of_create() -> Result<()> {
    let Some(image) = test_image("a_crash_at_every_step_of_create") else {
        return Ok(());
    };
    let mut rig = Rig::new(&image).await?;
    let result = walk(&mut rig, &mut Create::default()).await;
    rig.print("create");
    rig.broker.log_on_failure(result).map(drop)
}

#[tokio::test]
async fn a_crash_at_every_step_of_remove() -> Result<()> {
    let Some(image) = test_image("a_crash_at_every_step_of_remove") else {
        return Ok(());
    };
    let mut rig = Rig::new(&image).await?;
    let result = walk(&mut rig, &mut Remove::default()).await;
    rig.print("remove");
    rig.broker.log_on_failure(result).map(drop)
}

/// Resume, stop, screen mint and the export of a running desktop (its
/// browsers quiesced while the archive is read) share one desktop.
#[tokio::test]
async fn a_crash_at_every_step_of_resume_stop_and_screen_mint() -> Result<()> {
    let Some(image) = test_image("a_crash_at_every_step_of_resume_stop") else {
        return Ok(());
    };
    let mut rig = Rig::new(&image).await?;
    let result = async {
        let id = rig.desktop("crash-desk", true).await?;
        walk(&mut rig, &mut Resume { id }).await?;
        walk(&mut rig, &mut Stop { id }).await?;
        walk(&mut rig, &mut ScreenMint { id }).await?;
        walk(&mut rig, &mut ExportRunning { id }).await
    }
    .await;
    rig.print("resume, stop, screen mint, export of a running desktop");
    rig.broker.log_on_failure(result).map(drop)
}

/// Import, export, file write and lease takeover share one stopped desktop.
#[tokio::test]
async fn a_crash_at_every_step_of_the_workspace_and_the_lease() -> Result<()> {
    let Some(image) = test_image("a_crash_at_every_step_of_the_workspace") else {
        return Ok(());
    };
    let mut rig = Rig::new(&image).await?;
    let result = async {
        let id = rig.desktop("crash-files", false).await?;
        rig.stopped(id).await?;
        walk(&mut rig, &mut Import { id, last: None }).await?;
        walk(&mut rig, &mut Export { id }).await?;
        walk(&mut rig, &mut FileWrite { id, last: None }).await?;
        walk(&mut rig, &mut LeaseTakeover { id, before: 0 }).await
    }
    .await;
    rig.print("import, export, file write, lease takeover");
    rig.broker.log_on_failure(result).map(drop)
}

/// A tar of one file `name` holding `data`.
fn one_file_tar(name: &str, data: &[u8]) -> Vec<u8> {
    tar(&[tar_entry(name, b'0', data, "")])
}

/// The names of the containers of this data directory.
fn containers(rig: &Rig) -> Vec<String> {
    containers_mounting(rig.broker.data_dir())
}
