//! The broker's policies against the real engine and the real desktop image:
//! an idle window of about two seconds stops the desktop and the engine saw
//! only a stop; the reason survives a new broker on the same data directory
//! (a restart) and a start clears it; a stale generation is refused; at
//! capacity a create is refused while a resume succeeds.
//!
//! Tests skip visibly without an engine or image, and fail under `CI=true`.

#![allow(clippy::unwrap_used)]

mod engine_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dormouse_broker::api::ApiStatus as _;
use dormouse_broker::docker::{DockerBackend, DockerEngine, Engine};
use dormouse_broker::metrics::Metrics;
use dormouse_broker::{owner, BrokerError};
use dormouse_e2e::{desktop_image, docker_available, TempDir};
use dormouse_protocol::api::{ContainerState, CreateComputer, LeaseRequest, StopReason};
use engine_support::{broker_config, engine_events, engine_now, log, wait_ready, RunGuard};

/// How long a real desktop may take to get ready on a busy test machine.
const READY_LIMIT: Duration = Duration::from_secs(90);

async fn engine() -> Arc<dyn Engine> {
    Arc::new(DockerEngine::connect().await.unwrap())
}

#[tokio::test]
async fn an_idle_desktop_is_only_stopped_and_the_reason_outlives_the_broker() {
    let test = "an_idle_desktop_is_only_stopped_and_the_reason_outlives_the_broker";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    log();
    let guard = RunGuard::new("dm-idle");
    let data = TempDir::new("dm-idle");
    let mut config = broker_config(data.path(), &image, &guard);
    config.idle_timeout = Duration::from_secs(2);
    let metrics = Arc::new(Metrics::default());
    let backend = Arc::new(DockerBackend::for_broker(engine().await, &config));
    let (broker, core) = owner::spawn_backend(config.clone(), backend, metrics.clone())
        .await
        .unwrap();
    let id = broker.create(CreateComputer::default()).await.unwrap().id;
    wait_ready(&broker, id, READY_LIMIT).await;
    let since = engine_now();
    let t = Instant::now();
    let stopped = loop {
        let status = broker.get(id).await.unwrap();
        if status.container == ContainerState::Stopped {
            break status;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no idle stop: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let until = engine_now();
    eprintln!(
        "idle stop after {} ms (window 2 s)",
        t.elapsed().as_millis()
    );
    assert_eq!(stopped.stop_reason, Some(StopReason::Idle));
    assert!(metrics.render(&[]).contains("dormouse_idle_stops_total 1"));
    let actions: Vec<String> = engine_events(&guard, &since, &until)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert!(actions.iter().any(|a| a == "stop"), "{actions:?}");
    for action in &actions {
        assert!(
            ["kill", "die", "stop"].contains(&action.as_str()),
            "the engine saw only a stop, not {action}: {actions:?}"
        );
    }

    // A broker restart: the reason is still there.
    drop(broker);
    core.await.unwrap();
    config.idle_timeout = Duration::from_secs(3600);
    let backend = Arc::new(DockerBackend::for_broker(engine().await, &config));
    let (broker, _core) = owner::spawn_backend(config, backend, metrics)
        .await
        .unwrap();
    let status = broker.get(id).await.unwrap();
    assert_eq!(status.stop_reason, Some(StopReason::Idle));
    broker.start(id, None).await.unwrap();
    let resumed = wait_ready(&broker, id, READY_LIMIT).await;
    assert_eq!(resumed.stop_reason, None);
    drop(guard);
}

#[tokio::test]
async fn stale_generations_are_refused_and_resume_ignores_capacity() {
    let test = "stale_generations_are_refused_and_resume_ignores_capacity";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    log();
    let guard = RunGuard::new("dm-fence");
    let data = TempDir::new("dm-fence");
    let mut config = broker_config(data.path(), &image, &guard);
    config.max_instances = 1;
    let metrics = Arc::new(Metrics::default());
    let backend = Arc::new(DockerBackend::for_broker(engine().await, &config));
    let (broker, _core) = owner::spawn_backend(config, backend, metrics.clone())
        .await
        .unwrap();
    let a = broker.create(CreateComputer::default()).await.unwrap().id;
    wait_ready(&broker, a, READY_LIMIT).await;

    let grant = broker
        .lease(
            a,
            LeaseRequest {
                holder: "controller-1".into(),
                ttl_ms: 60_000,
            },
        )
        .await
        .unwrap();
    assert_eq!(grant.generation, 1);
    let err = broker.stop(a, Some(0)).await.unwrap_err();
    assert!(
        matches!(err, BrokerError::StaleGeneration { current: 1, .. }),
        "{err}"
    );
    assert_eq!(err.http_status(), 409);
    assert!(metrics
        .render(&[])
        .contains("dormouse_fencing_rejections_total 1"));
    assert_eq!(
        broker.get(a).await.unwrap().container,
        ContainerState::Running
    );
    broker.stop(a, Some(1)).await.unwrap();

    // One slot: b takes it; a create is refused while the resume of a succeeds.
    let b = broker.create(CreateComputer::default()).await.unwrap().id;
    let err = broker.create(CreateComputer::default()).await.unwrap_err();
    assert_eq!(err.code(), "capacity");
    broker.start(a, Some(1)).await.unwrap();
    wait_ready(&broker, a, READY_LIMIT).await;
    assert_eq!(
        broker.get(b).await.unwrap().container,
        ContainerState::Running
    );
    drop(guard);
}
