//! The soak's broker and desktops, the faults applied to them and the
//! resume after each: one [`Fleet`] per run.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{start_retrying, ApiClient, EventStream, Waits as _};
use dormouse_e2e::engine::{self, Killed};
use dormouse_e2e::guest::Guest;
use dormouse_protocol::api::{
    ComputerStatus, ContainerState, CreateComputer, PatchComputer, StopReason,
};
use nix::sys::signal::Signal;
use tokio::time::Instant;
use uuid::Uuid;

use crate::oracle::Expected;
use crate::plan::Fault;
use crate::report::{measure, Metrics};
use crate::witness;

pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOPPED_TIMEOUT: Duration = Duration::from_secs(90);
/// The idle window an idle-stop fault sets (the API's floor is 1 s).
const SHORT_IDLE_MS: u64 = 2_000;
/// The window every desktop has otherwise, as the broker was started with.
const LONG_IDLE_MS: u64 = 24 * 3600 * 1000;

/// The ballast file of every workspace.
const BALLAST: &str = "soak/ballast";

/// 16 MiB that do not compress, different per desktop.
fn ballast(id: Uuid) -> Vec<u8> {
    use rand::{Rng as _, SeedableRng as _};
    let mut data = vec![0u8; 16 << 20];
    rand::rngs::StdRng::seed_from_u64(id.as_u64_pair().0).fill(&mut data[..]);
    data
}

/// One desktop of the run.
#[derive(Debug)]
pub(crate) struct Desk {
    pub(crate) id: Uuid,
    pub(crate) guest: Guest,
    pub(crate) expected: Expected,
    /// The cycle after which its container last started.
    pub(crate) since: usize,
}

/// The broker, its client and the desktops.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(crate) broker: BrokerProcess,
    pub(crate) api: ApiClient,
    pub(crate) events: EventStream,
    pub(crate) desks: Vec<Desk>,
    /// The cycle after which the broker process last started.
    pub(crate) broker_since: usize,
}

impl Fleet {
    /// A broker and `count` ready desktops, each with its typing witness.
    pub(crate) async fn set_up(image: &str, count: usize) -> Result<Self> {
        let mut options = BrokerOptions::new(image);
        options.max_instances = Some(u32::try_from(count)?);
        let broker = BrokerProcess::start(options).await?;
        let api = broker.client();
        let mut events = EventStream::open(&api).await?;
        let mut ids = Vec::new();
        for n in 0..count {
            let created = api
                .create(&CreateComputer {
                    name: Some(format!("soak-{n}")),
                    ..CreateComputer::default()
                })
                .await?;
            ids.push(created.id);
        }
        let mut desks = Vec::new();
        for id in ids {
            api.wait_ready(&mut events, id, READY_TIMEOUT)
                .await
                .with_context(|| format!("first start; broker log:\n{}", broker.log_tail(3000)))?;
            let guest = Guest::for_computer(id);
            witness::ensure(&guest).await?;
            // Ballast, so an export lasts long enough for a fault to land
            // in it; held to the oracle like every acknowledged write.
            let mut expected = Expected::default();
            let ballast = ballast(id);
            api.write_file(id, BALLAST, ballast.clone(), true).await?;
            expected.files.insert(BALLAST.to_owned(), ballast);
            desks.push(Desk {
                id,
                guest,
                expected,
                since: 0,
            });
        }
        Ok(Self {
            broker,
            api,
            events,
            desks,
            broker_since: 0,
        })
    }

    /// `ws://host:port` of the broker as it listens now.
    pub(crate) fn ws_base(&self) -> String {
        format!("ws://{}", self.broker.addr())
    }

    async fn reconnect(&mut self) -> Result<()> {
        self.api = self.broker.client();
        self.events = EventStream::open(&self.api).await?;
        Ok(())
    }

    /// A graceful stop through the API, waited for (not a fault: the
    /// import needs a stopped desktop).
    pub(crate) async fn stop(&mut self, desk: usize) -> Result<()> {
        let id = self.desks[desk].id;
        self.api.stop(id).await?;
        self.api
            .wait_stopped(&mut self.events, id, STOPPED_TIMEOUT)
            .await?;
        Ok(())
    }

    /// Start and wait until ready; the time from the request to ready.
    pub(crate) async fn start(&mut self, desk: usize, cycle: usize) -> Result<Duration> {
        let id = self.desks[desk].id;
        let asked = Instant::now();
        let api = self.api.clone();
        let starting = tokio::spawn(async move { start_retrying(&api, id).await });
        let ready = self
            .api
            .wait_ready(&mut self.events, id, READY_TIMEOUT)
            .await
            .with_context(|| format!("resume; broker log:\n{}", self.broker.log_tail(2000)))?;
        starting.await.context("start task")??;
        self.desks[desk].since = cycle;
        Ok(ready.at.duration_since(asked))
    }

    /// Lands `fault` (on desktop `target` unless it hits the broker).
    /// Idle stops are [`Self::idle_stop`]; a broker fault leaves the
    /// broker down until [`Self::resume`].
    pub(crate) async fn land(&mut self, fault: Fault, target: usize) -> Result<()> {
        let desk = &self.desks[target];
        match fault {
            Fault::DockerKill => {
                let killed = engine::kill_now(desk.guest.container()).await?;
                ensure!(killed == Killed::Killed, "the target was not running");
            }
            Fault::GracefulStop => {
                self.api.stop(desk.id).await.context("POST stop")?;
            }
            Fault::IdleStop => bail!("an idle stop is waited for, not landed"),
            Fault::BrokerKill => {
                self.broker.kill(Signal::SIGKILL).await?;
            }
            Fault::BrokerRestart => {
                let status = self.broker.kill(Signal::SIGTERM).await?;
                ensure!(status.success(), "the broker's SIGTERM exit was {status}");
            }
        }
        Ok(())
    }

    /// A short idle window on `target`, the broker's idle stop waited for,
    /// and the long window back.
    pub(crate) async fn idle_stop(&mut self, target: usize) -> Result<()> {
        let id = self.desks[target].id;
        let patch = |ms| PatchComputer {
            idle_timeout_ms: Some(ms),
        };
        self.api.patch(id, &patch(SHORT_IDLE_MS)).await?;
        let stopped = self
            .api
            .wait_for(
                &mut self.events,
                id,
                "stopped, the stop settled",
                STOPPED_TIMEOUT,
                settled,
            )
            .await
            .context("the idle stop never came")?;
        self.api.patch(id, &patch(LONG_IDLE_MS)).await?;
        ensure!(
            stopped.status.stop_reason == Some(StopReason::Idle),
            "an idle stop shows {:?}",
            stopped.status.stop_reason
        );
        Ok(())
    }

    /// Brings everything back after `fault`: the broker (and every
    /// desktop ready under it) or the target desktop. The resume time: from
    /// the broker's new start, or from `POST start`, until ready.
    pub(crate) async fn resume(
        &mut self,
        fault: Fault,
        target: usize,
        skip: Option<usize>,
        cycle: usize,
    ) -> Result<Duration> {
        if fault.hits_broker() {
            let asked = Instant::now();
            self.broker.start_again().await?;
            self.broker_since = cycle;
            self.reconnect().await?;
            let mut took = asked.elapsed();
            for (i, desk) in self.desks.iter().enumerate() {
                if Some(i) == skip {
                    continue;
                }
                let ready = self
                    .api
                    .wait_ready(&mut self.events, desk.id, READY_TIMEOUT)
                    .await
                    .with_context(|| {
                        format!(
                            "after the broker's restart; its log:\n{}",
                            self.broker.log_tail(2000)
                        )
                    })?;
                took = took.max(ready.at.duration_since(asked));
            }
            return Ok(took);
        }
        let id = self.desks[target].id;
        // The broker shows the reason of its own stop once the engine has
        // confirmed it; a kill is the engine's doing and shows at once.
        let stopped = if fault == Fault::DockerKill {
            self.api
                .wait_stopped(&mut self.events, id, STOPPED_TIMEOUT)
                .await
        } else {
            self.api
                .wait_for(
                    &mut self.events,
                    id,
                    "stopped, the stop settled",
                    STOPPED_TIMEOUT,
                    settled,
                )
                .await
        }
        .context("the target never showed stopped")?;
        check_stop_reason(fault, &stopped.status)?;
        self.start(target, cycle).await
    }

    /// After a failed cycle: a running broker and every desktop ready, with
    /// its witness, and no short idle window left behind.
    pub(crate) async fn recover(&mut self, cycle: usize) -> Result<()> {
        if self.broker.pid().is_none() || !self.api.healthy().await {
            self.broker.restart().await?;
            self.broker_since = cycle;
        }
        self.reconnect().await?;
        for i in 0..self.desks.len() {
            let id = self.desks[i].id;
            let _ = self
                .api
                .patch(
                    id,
                    &PatchComputer {
                        idle_timeout_ms: Some(LONG_IDLE_MS),
                    },
                )
                .await;
            let status = self.api.get(id).await?;
            if status.container == ContainerState::Running && !status.ready {
                // Running but not ready (a wedged service, say): a stop and
                // a start through the API, as a user would.
                eprintln!(
                    "dormouse-soak: desktop {i} runs but is not ready ({:?}); stopping and starting it",
                    status.problem
                );
                self.stop(i).await?;
            }
            let status = self.api.get(id).await?;
            if !(status.ready && status.container == ContainerState::Running) {
                self.start(i, cycle).await?;
            }
            witness::ensure(&self.desks[i].guest).await?;
        }
        Ok(())
    }

    /// Memory and descriptors now.
    pub(crate) async fn metrics(&self, cycle: usize) -> Result<Metrics> {
        let pid = self.broker.pid().context("the broker is not running")?;
        let (broker_rss_kib, broker_fds) = measure(pid)?;
        let mut m = Metrics {
            cycle,
            broker_rss_kib,
            broker_fds,
            broker_since: self.broker_since,
            ..Metrics::default()
        };
        for desk in &self.desks {
            let Ok(init) = engine::init_pid(desk.guest.container()).await else {
                m.supervisors.push(None);
                continue;
            };
            let (rss, _) = measure(u32::try_from(init)?)?;
            m.supervisors.push(Some((desk.since, rss)));
            if rss > m.supervisor_rss_kib {
                m.supervisor_rss_kib = rss;
                m.supervisor_since = desk.since;
            }
        }
        Ok(m)
    }
}

/// Stopped, and no operation of the broker in progress on it (while its
/// own stop runs, a stopped container shows `resumable: false` "stop is in
/// progress" and no reason until the engine has confirmed the stop).
fn settled(status: &ComputerStatus) -> bool {
    status.container == ContainerState::Stopped && status.resumable
}

/// The reason a desktop shows after a fault must be the fault's: `killed`
/// (or none, when the broker cannot be sure) after a kill, `manual` after
/// a stop through the API, `idle` after an idle stop.
pub(crate) fn check_stop_reason(fault: Fault, status: &ComputerStatus) -> Result<()> {
    let fine = match fault {
        Fault::DockerKill => matches!(status.stop_reason, None | Some(StopReason::Killed)),
        Fault::GracefulStop => status.stop_reason == Some(StopReason::Manual),
        Fault::IdleStop => status.stop_reason == Some(StopReason::Idle),
        Fault::BrokerKill | Fault::BrokerRestart => true,
    };
    ensure!(
        fine,
        "after {fault} the desktop shows stop_reason {:?}",
        status.stop_reason
    );
    ensure!(
        status.resumable,
        "after {fault} the desktop is not resumable: {:?}",
        status.resumable_problem
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(reason: Option<StopReason>, resumable: bool) -> ComputerStatus {
        serde_json::from_value(serde_json::json!({
            "id": Uuid::nil(), "name": "x", "owner": "o", "container": "stopped",
            "ready": false, "phase": null, "problem": null, "stop_reason": reason,
            "stopped_at": null, "resumable": resumable,
            "resumable_problem": if resumable { None } else { Some("stop is in progress") },
            "generation": 1, "health": null, "image_id": "sha256:x", "idle": null
        }))
        .expect("a status")
    }

    #[test]
    fn a_stop_still_running_is_not_settled() {
        assert!(!settled(&stopped(None, false)));
        assert!(settled(&stopped(Some(StopReason::Idle), true)));
    }

    #[test]
    fn each_fault_shows_its_own_reason() {
        let idle = stopped(Some(StopReason::Idle), true);
        let manual = stopped(Some(StopReason::Manual), true);
        let killed = stopped(Some(StopReason::Killed), true);
        let unknown = stopped(None, true);
        assert!(check_stop_reason(Fault::IdleStop, &idle).is_ok());
        assert!(check_stop_reason(Fault::IdleStop, &unknown).is_err());
        assert!(check_stop_reason(Fault::GracefulStop, &manual).is_ok());
        assert!(check_stop_reason(Fault::GracefulStop, &idle).is_err());
        assert!(check_stop_reason(Fault::DockerKill, &killed).is_ok());
        assert!(check_stop_reason(Fault::DockerKill, &unknown).is_ok());
        assert!(check_stop_reason(Fault::DockerKill, &manual).is_err());
        assert!(check_stop_reason(Fault::DockerKill, &stopped(None, false)).is_err());
    }
}
