//! Engine trouble, misbehaving guests, reconciliation and configuration.

use super::*;

// ---- engine trouble, guests, reconciliation -----------------------------------------

#[tokio::test(start_paused = true)]
async fn a_missing_engine_gives_engine_unavailable_and_the_broker_keeps_serving() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.fake.set_unavailable(true);
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert_eq!(err.http_status(), 503);
    let err = rig.handle.start(id, None).await.unwrap_err();
    assert_eq!(err.code(), "engine_unavailable");
    let s = rig
        .until(id, "unknown", |s| s.container == ContainerState::Unknown)
        .await;
    assert!(!s.resumable);
    assert_eq!(rig.handle.list().await.unwrap().len(), 1);
    rig.fake.set_unavailable(false);
    rig.start(id).await;
}

#[tokio::test(start_paused = true)]
async fn a_misbehaving_guest_degrades_only_its_computer() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let good = rig.create().await.id;
    rig.script.misbehave.store(true, Ordering::SeqCst);
    let bad = rig.handle.create(CreateComputer::default()).await.unwrap();
    let bad = rig
        .until(bad.id, "degraded", |s| s.phase == Some(Phase::Degraded))
        .await;
    assert_eq!(bad.container, ContainerState::Running);
    assert!(!bad.ready);
    assert_eq!(bad.phase, Some(Phase::Degraded));
    assert!(bad.problem.is_some());
    let err = rig.handle.screenshot(bad.id).await.unwrap_err();
    assert_eq!(err.code(), "guest");
    rig.script.misbehave.store(false, Ordering::SeqCst);
    assert!(rig.handle.get(good).await.unwrap().ready);
}

#[tokio::test(start_paused = true)]
async fn a_symlink_planted_at_the_socket_is_refused() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    // The guest (root in its container) plants a symlink to a host socket.
    let decoy_dir = tempfile::tempdir().unwrap();
    let decoy = decoy_dir.path().join("host.sock");
    let _listener = UnixListener::bind(&decoy).unwrap();
    let socket = rig.paths().socket(id);
    rig.fake.on_start(move |_| {
        let _ = std::fs::remove_file(&socket);
        std::os::unix::fs::symlink(&decoy, &socket).unwrap();
    });
    rig.handle.start(id, None).await.unwrap();
    let s = rig.until(id, "refused", |s| s.problem.is_some()).await;
    assert!(!s.ready);
    assert!(
        s.problem.as_deref().is_some_and(|p| p.contains("symlink")),
        "{s:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_guest_that_never_gets_ready_is_reported_after_the_deadline() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.script.never_ready.store(true, Ordering::SeqCst);
    rig.handle.start(id, None).await.unwrap();
    let s = rig
        .until(id, "the readiness deadline", |s| {
            s.problem
                .as_deref()
                .is_some_and(|p| p.contains("not ready within"))
        })
        .await;
    assert_eq!(s.container, ContainerState::Running);
    assert!(!s.ready);
}

#[tokio::test(start_paused = true)]
async fn an_unconfirmed_stop_is_finished_on_start_up() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    // As if the broker died after persisting the intent, before the engine stop.
    let stops = StopReasonStore::new(&rig.paths());
    stops
        .save(
            &stop_key(id),
            &StopRecord::intent(StopReason::Idle, Utc::now()),
        )
        .unwrap();
    let rig = rig.restart(Duration::from_secs(3600)).await;
    let s = rig
        .until(id, "finished stop", |s| {
            s.container == ContainerState::Stopped
        })
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Idle));
    assert_eq!(mutations_of(&rig.fake, "stop"), 1);
    assert_eq!(rig.fake.container(&name).unwrap().state, RunState::Exited);
}

#[tokio::test(start_paused = true)]
async fn a_stop_reported_under_way_is_on_disk_and_survives_a_broker_crash() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    // The stop's first engine call hangs; the broker dies meanwhile.
    rig.fake
        .delay_next(Verb::Inspect, Duration::from_secs(1000));
    let mut events = rig.handle.subscribe();
    let handle = rig.handle.clone();
    let stopping = tokio::spawn(async move { handle.stop(id, None).await });
    let under_way = loop {
        match events.recv().await.unwrap() {
            BrokerEvent::Status { computer } if computer.phase == Some(Phase::Stopping) => {
                break computer
            }
            _ => {}
        }
    };
    assert_eq!(under_way.container, ContainerState::Running);
    let stops = StopReasonStore::new(&rig.paths());
    let intent = stops.load(&stop_key(id)).unwrap().unwrap();
    assert_eq!(intent.reason, StopReason::Manual);
    assert!(!intent.confirmed);
    drop(events);
    let rig = rig.crash_and_restart().await;
    assert!(
        stopping.await.unwrap().is_err(),
        "the old broker never answered"
    );
    let s = rig
        .until(id, "finished stop", |s| {
            s.container == ContainerState::Stopped
        })
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Manual));
    assert_eq!(
        mutations_of(&rig.fake, "stop"),
        1,
        "finished by the new broker"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stop_that_happened_but_was_not_confirmed_is_confirmed() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let stops = StopReasonStore::new(&rig.paths());
    stops
        .save(
            &stop_key(id),
            &StopRecord::intent(StopReason::Manual, Utc::now()),
        )
        .unwrap();
    // The engine stopped it, the broker died before confirming.
    rig.fake.foreign_stop(&Rig::name(id));
    let rig = rig.restart(Duration::from_secs(3600)).await;
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Stopped);
    assert_eq!(s.stop_reason, Some(StopReason::Manual));
    assert_eq!(mutations_of(&rig.fake, "stop"), 0);
    assert!(stops.load(&stop_key(id)).unwrap().unwrap().confirmed);
}

#[tokio::test(start_paused = true)]
async fn containers_labelled_ours_without_a_record_are_reported_never_removed() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let mut stray = rig.fake.container(&Rig::name(id)).unwrap();
    let stray_id = Uuid::new_v4();
    stray.name = Rig::name(stray_id);
    stray.id = "stray".into();
    stray
        .labels
        .insert(LABEL_COMPUTER.into(), stray_id.to_string());
    rig.fake.insert_container(stray);
    let rig = rig.restart(Duration::from_secs(3600)).await;
    let orphans = rig.handle.orphans().await.unwrap();
    assert_eq!(orphans.len(), 1);
    assert_eq!(orphans[0].computer, stray_id.to_string());
    assert_eq!(mutations_of(&rig.fake, "remove"), 0);
    assert!(rig.fake.container(&Rig::name(stray_id)).is_some());
    assert_eq!(rig.handle.list().await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn every_change_is_broadcast() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let mut events = rig.handle.subscribe();
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    let mut seen = Vec::new();
    // Activity entries ride the same stream; only statuses count here.
    while let Ok(event) = events.try_recv() {
        if let BrokerEvent::Status { computer } = event {
            seen.push((computer.container, computer.ready));
        }
    }
    assert!(seen.contains(&(ContainerState::Running, false)), "{seen:?}");
    assert!(seen.contains(&(ContainerState::Running, true)), "{seen:?}");
    assert_eq!(seen.last(), Some(&(ContainerState::Stopped, false)));
}

#[tokio::test]
async fn bad_configuration_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeEngine::new());
    let metrics = Arc::new(Metrics::default());
    let mut c = config(dir.path(), Duration::from_secs(1), 0);
    assert!(spawn(c.clone(), fake.clone(), metrics.clone())
        .await
        .is_err());
    c.max_instances = 65;
    assert!(spawn(c.clone(), fake.clone(), metrics.clone())
        .await
        .is_err());
    c.max_instances = 2;
    c.idle_timeout = Duration::from_millis(999);
    assert!(spawn(c, fake, metrics).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_failed_guest_call_degrades_the_status_until_the_guest_answers_again() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    // The guest replaces its socket with a link to it: the status stream,
    // opened before, goes on; every new connection is refused.
    let socket = rig.paths().socket(id);
    let moved = socket.with_extension("moved");
    std::fs::rename(&socket, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &socket).unwrap();
    let err = rig.handle.screenshot(id).await.unwrap_err();
    assert_eq!(err.code(), "guest", "{err:?}");
    let s = rig.settled(id, "degraded", |s| !s.ready).await;
    assert_eq!(s.container, ContainerState::Running);
    assert_eq!(s.phase, Some(Phase::Degraded), "{s:?}");
    assert!(
        s.problem.as_deref().is_some_and(|p| p.contains("symlink")),
        "{s:?}"
    );
    assert!(
        !s.problem
            .as_deref()
            .unwrap()
            .contains(rig.dir.path().to_str().unwrap()),
        "no host path in the status: {s:?}"
    );
    // While the channel stays broken the status stays degraded: the probe
    // keeps failing, and the stream's statuses do not clear it.
    advance(Duration::from_secs(20)).await;
    let s = rig.handle.get(id).await.unwrap();
    assert!(!s.ready && s.phase == Some(Phase::Degraded), "{s:?}");
    let err = rig.handle.screenshot(id).await.unwrap_err();
    assert_eq!(err.code(), "guest");
    // The guest puts its socket back: the probe finds it answering.
    std::fs::remove_file(&socket).unwrap();
    std::fs::rename(&moved, &socket).unwrap();
    let s = rig
        .until(id, "ready again", |s| s.ready && s.problem.is_none())
        .await;
    assert_eq!(s.phase, Some(Phase::Ready), "{s:?}");
    assert!(rig.handle.screenshot(id).await.is_ok());
}
