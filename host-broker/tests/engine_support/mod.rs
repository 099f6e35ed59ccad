//! Shared support of the broker's real-engine tests: a unique run label on
//! every container a test's broker makes, a guard that removes them all even
//! when the test panics, broker configurations on a private data directory,
//! and the engine's own event log.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use dormouse_broker::{BrokerConfig, BrokerHandle};
use dormouse_e2e::{docker, docker_ok, unique_name, TEST_LABEL};
use dormouse_protocol::api::{BrokerEvent, ComputerStatus};
use uuid::Uuid;

/// Label that ties every container of one test run together.
pub const RUN_LABEL: &str = "dev.dormouse.test.run";

/// Removes every container of a test run when dropped.
#[derive(Debug)]
pub struct RunGuard {
    /// The run label's value.
    pub run: String,
}

impl RunGuard {
    /// A fresh run.
    pub fn new(prefix: &str) -> Self {
        Self {
            run: unique_name(prefix),
        }
    }

    /// `--filter` value selecting this run's containers.
    pub fn filter(&self) -> String {
        format!("label={RUN_LABEL}={}", self.run)
    }

    /// Labels for the broker's containers.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (TEST_LABEL.to_string(), "1".to_string()),
            (RUN_LABEL.to_string(), self.run.clone()),
        ])
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let out = docker(&["ps", "-aq", "--filter", &self.filter()]);
        for id in String::from_utf8_lossy(&out.stdout).lines() {
            if !id.trim().is_empty() {
                let _ = docker(&["rm", "-f", "-v", id.trim()]);
            }
        }
    }
}

/// A broker configuration for real-engine tests.
pub fn broker_config(data: &Path, image: &str, guard: &RunGuard) -> BrokerConfig {
    let mut config = BrokerConfig::new(data.to_owned());
    config.image = image.to_owned();
    config.container_labels = guard.labels();
    config.limits.cpus = 1.0;
    config.limits.memory_bytes = 1024 * 1024 * 1024;
    config.limits.pids = 1024;
    config.quiesce_timeout = Duration::from_secs(5);
    config.stop_timeout = Duration::from_secs(10);
    config.ready_timeout = Duration::from_secs(90);
    config
}

/// The engine's clock now, as `docker events --since/--until` take it.
pub fn engine_now() -> String {
    let now = chrono::Utc::now();
    format!("{}.{:09}", now.timestamp(), now.timestamp_subsec_nanos())
}

/// `(action, container name)` of every container event of this run between
/// `since` and `until` (engine timestamps).
pub fn engine_events(guard: &RunGuard, since: &str, until: &str) -> Vec<(String, String)> {
    let out = docker_ok(&[
        "events",
        "--since",
        since,
        "--until",
        until,
        "--filter",
        "type=container",
        "--filter",
        &guard.filter(),
        "--format",
        "{{.Action}} {{.Actor.Attributes.name}}",
    ]);
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(a, n)| (a.to_owned(), n.to_owned()))
        .collect()
}

/// Logs to the test output (once per process).
pub fn log() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "dormouse_broker=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Waits (on the event stream, with a read first) until the computer is
/// ready; panics with the last status after `limit`.
pub async fn wait_ready(broker: &BrokerHandle, id: Uuid, limit: Duration) -> ComputerStatus {
    wait_until(broker, id, limit, "ready", |s| s.ready).await
}

/// Waits (on the event stream, with a read first) until `pred` holds.
pub async fn wait_until(
    broker: &BrokerHandle,
    id: Uuid,
    limit: Duration,
    what: &str,
    pred: impl Fn(&ComputerStatus) -> bool,
) -> ComputerStatus {
    let mut events = broker.subscribe();
    let now = broker.get(id).await.unwrap();
    if pred(&now) {
        return now;
    }
    let wait = async {
        loop {
            match events.recv().await {
                Ok(BrokerEvent::Status { computer }) if computer.id == id && pred(&computer) => {
                    return *computer;
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let now = broker.get(id).await.unwrap();
                    if pred(&now) {
                        return now;
                    }
                }
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    };
    match tokio::time::timeout(limit, wait).await {
        Ok(status) => status,
        Err(_) => panic!("not {what} within {limit:?}: {:?}", broker.get(id).await),
    }
}
