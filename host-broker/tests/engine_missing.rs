//! A broker whose engine is not there: it starts, serves, reports
//! `container: unknown`, answers commands with `engine_unavailable` (503)
//! and keeps serving. Its own test binary, because it points `DOCKER_HOST`
//! (process-wide) at a socket nobody listens on.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use dormouse_broker::api::ApiStatus as _;
use dormouse_broker::docker::{DockerBackend, DockerEngine};
use dormouse_broker::metrics::Metrics;
use dormouse_broker::{owner, BrokerConfig};
use dormouse_e2e::TempDir;
use dormouse_protocol::api::CreateComputer;

#[tokio::test]
async fn without_an_engine_the_broker_serves_and_answers_503() {
    let data = TempDir::new("dm-noengine");
    let socket = data.path().join("no-engine.sock");
    std::env::set_var("DOCKER_HOST", format!("unix://{}", socket.display()));
    let engine = DockerEngine::connect()
        .await
        .expect("an absent engine is not a connect error");
    let config = BrokerConfig::new(data.path().join("state"));
    let backend = Arc::new(DockerBackend::for_broker(Arc::new(engine), &config));
    let (broker, core) = owner::spawn_backend(config, backend, Arc::new(Metrics::default()))
        .await
        .expect("the core starts without an engine");
    let err = broker.create(CreateComputer::default()).await.unwrap_err();
    assert_eq!(err.code(), "engine_unavailable");
    assert_eq!(err.http_status(), 503);
    // Still serving.
    assert!(broker.list().await.unwrap().is_empty());
    let err = broker.create(CreateComputer::default()).await.unwrap_err();
    assert_eq!(err.http_status(), 503);
    drop(broker);
    core.await.unwrap();
}
