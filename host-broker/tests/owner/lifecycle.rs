//! Create, start, stop and remove over the fake engine, and the stop
//! reasons the owner reports.

use super::*;

// ---- lifecycle --------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn create_ready_stop_start_ready() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let answered = rig.handle.create(CreateComputer::default()).await.unwrap();
    assert_eq!(
        answered.container,
        ContainerState::Running,
        "answered once running"
    );
    let created = rig.until(answered.id, "ready", |s| s.ready).await;
    assert_eq!(created.image_id, IMAGE);
    assert_eq!(created.phase, Some(Phase::Ready));
    let id = created.id;
    let name = Rig::name(id);
    assert_eq!(
        rig.fake.mutations(),
        vec![format!("create {name}"), format!("start {name}")]
    );
    assert!(rig.paths().record(id).exists(), "record persisted");

    let stopped = rig.handle.stop(id, None).await.unwrap();
    assert_eq!(stopped.container, ContainerState::Stopped);
    assert_eq!(stopped.stop_reason, Some(StopReason::Manual));
    assert!(!stopped.ready);
    let finished = rig.fake.container(&name).unwrap().finished_at;
    assert_eq!(stopped.stopped_at, finished);
    assert!(stopped.resumable, "{:?}", stopped.resumable_problem);

    let started = rig.start(id).await;
    assert_eq!(started.stop_reason, None, "a start clears the reason");
    assert_eq!(started.stopped_at, None);
    assert_eq!(
        rig.fake.mutations(),
        vec![
            format!("create {name}"),
            format!("start {name}"),
            format!("stop {name}"),
            format!("start {name}"),
        ],
        "a resume is a start of the same container: no create, no remove"
    );
    let rendered = rig.metrics.render(&[]);
    assert!(
        rendered.contains("dormouse_resume_seconds_count 1"),
        "{rendered}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_created_container_is_hardened_and_labelled() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let spec = rig
        .fake
        .calls()
        .into_iter()
        .find_map(|c| match c {
            dormouse_docker::fake::Call::Create(spec) => Some(spec),
            _ => None,
        })
        .unwrap();
    assert_eq!(spec.image, IMAGE, "created by immutable ID, not by tag");
    assert_eq!(spec.hardening.network_mode, "none");
    assert_eq!(spec.hardening.cap_drop, vec!["ALL".to_string()]);
    assert_eq!(spec.labels.get(LABEL_COMPUTER), Some(&id.to_string()));
    let sources: Vec<_> = spec.mounts.iter().map(|m| m.source.clone()).collect();
    assert_eq!(
        sources,
        vec![rig.paths().workspace(id), rig.paths().run_dir(id)]
    );
    let record = ComputerStore::new(rig.paths()).load(id).unwrap().unwrap();
    assert_eq!(
        record.spec,
        dormouse_docker::spec::to_backend(&spec),
        "the record keeps the settings it was created with"
    );
}

#[tokio::test(start_paused = true)]
async fn an_image_without_a_compatible_protocol_is_refused() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    rig.fake
        .add_image("sha256:feed", Some("dormouse/desktop:latest"), &[]);
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Image(_)), "{err}");
    rig.fake.add_image(
        "sha256:beef",
        Some("dormouse/desktop:latest"),
        &[(LABEL_PROTOCOL, "99")],
    );
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Image(_)), "{err}");
    assert!(rig.fake.mutations().is_empty());
    assert!(rig.handle.list().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn wrong_states_and_unknown_ids_are_refused() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    assert!(matches!(
        rig.handle.start(id, None).await,
        Err(BrokerError::WrongState(_))
    ));
    rig.handle.stop(id, None).await.unwrap();
    assert!(matches!(
        rig.handle.stop(id, None).await,
        Err(BrokerError::WrongState(_))
    ));
    let nobody = Uuid::new_v4();
    assert_eq!(
        rig.handle.get(nobody).await,
        Err(BrokerError::NotFound(nobody))
    );
    assert!(matches!(
        rig.handle.start(nobody, None).await,
        Err(BrokerError::NotFound(_))
    ));
    assert!(matches!(
        rig.handle.screenshot(id).await,
        Err(BrokerError::WrongState(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn screenshots_come_from_the_guest() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let png = rig.handle.screenshot(id).await.unwrap();
    assert!(png.starts_with(b"\x89PNG"));
}

#[tokio::test(start_paused = true)]
async fn resume_fails_closed_when_the_container_changed() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    let name = Rig::name(id);
    rig.fake.mutate(&name, |c| {
        c.hardening.cap_add.push("CAP_SYS_ADMIN".into());
    });
    rig.fake.emit("update", &name);
    let status = rig.until(id, "not resumable", |s| !s.resumable).await;
    assert!(
        status
            .resumable_problem
            .as_deref()
            .is_some_and(|p| p.contains("cap_add")),
        "{status:?}"
    );
    let err = rig.handle.start(id, None).await.unwrap_err();
    assert!(matches!(err, BrokerError::NotResumable(_)), "{err}");
    assert_eq!(
        mutations_of(&rig.fake, "start"),
        1,
        "no start was attempted"
    );
}

#[tokio::test(start_paused = true)]
async fn resume_fails_closed_when_the_image_is_gone() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.fake.remove_image(IMAGE);
    let err = rig.handle.start(id, None).await.unwrap_err();
    assert!(
        matches!(&err, BrokerError::NotResumable(p) if p.contains("no longer present")),
        "{err}"
    );
    let status = rig.handle.get(id).await.unwrap();
    assert!(!status.resumable);
}

#[tokio::test(start_paused = true)]
async fn resume_is_never_counted_against_capacity() {
    let rig = Rig::with_max(Duration::from_secs(3600), 1).await;
    let a = rig.create().await.id;
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, BrokerError::Capacity { running: 1, max: 1 }),
        "{err}"
    );
    assert_eq!(err.code(), "capacity");
    rig.handle.stop(a, None).await.unwrap();
    let b = rig.create().await.id;
    // At capacity: a create is refused while a resume succeeds.
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Capacity { .. }));
    rig.start(a).await;
    assert_eq!(mutations_of(&rig.fake, "create"), 2);
    assert!(rig.handle.get(b).await.unwrap().ready);
}

#[tokio::test(start_paused = true)]
async fn remove_keeps_the_workspace_unless_purged_and_it_can_be_adopted() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let mut events = rig.handle.subscribe();
    let a = rig.create().await.id;
    std::fs::write(rig.paths().workspace(a).join("notes.txt"), "kept").unwrap();
    rig.handle.remove(a, false, None).await.unwrap();
    assert_eq!(
        rig.fake.mutations().last().map(String::as_str),
        Some(format!("remove {}", Rig::name(a)).as_str())
    );
    assert!(
        rig.fake
            .mutations()
            .contains(&format!("stop {}", Rig::name(a))),
        "a running desktop is stopped gracefully before removal"
    );
    assert!(rig.paths().workspace(a).join("notes.txt").exists());
    assert!(!rig.paths().record(a).exists());
    assert!(matches!(
        rig.handle.get(a).await,
        Err(BrokerError::NotFound(_))
    ));
    let mut saw_removed = false;
    while let Ok(event) = events.try_recv() {
        saw_removed |= event == BrokerEvent::Removed { id: a };
    }
    assert!(saw_removed);

    let b = rig
        .handle
        .create(CreateComputer {
            workspace_from: Some(a),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    assert_eq!(
        std::fs::read_to_string(rig.paths().workspace(b).join("notes.txt")).unwrap(),
        "kept"
    );
    rig.handle.remove(b, true, None).await.unwrap();
    assert!(!rig.paths().computer_dir(b).exists());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_broker_leaves_desktops_running_and_reasons_survive() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let running = rig.create().await.id;
    let stopped = rig.create().await.id;
    rig.handle.stop(stopped, None).await.unwrap();
    let before = rig.fake.mutations();
    let rig = rig.restart(Duration::from_secs(3600)).await;
    assert_eq!(
        rig.fake.mutations(),
        before,
        "a restart touches no container"
    );
    assert_eq!(
        rig.fake.container(&Rig::name(running)).unwrap().state,
        RunState::Running
    );
    let status = rig.until(running, "ready again", |s| s.ready).await;
    assert_eq!(status.container, ContainerState::Running);
    let status = rig.handle.get(stopped).await.unwrap();
    assert_eq!(status.stop_reason, Some(StopReason::Manual));
}

#[tokio::test(start_paused = true)]
async fn a_slow_inspect_from_before_an_operation_never_overrides_it() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    rig.handle.stop(id, None).await.unwrap();
    settle().await;
    // An event makes the owner inspect; the engine's answer (stopped) is slow
    // and arrives after the start below finished.
    rig.fake.delay_next(Verb::Inspect, Duration::from_secs(3));
    rig.fake.emit("die", &name);
    settle().await;
    rig.start(id).await;
    advance(Duration::from_secs(4)).await;
    settle().await;
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Running, "{s:?}");
    assert!(s.ready);
    // A kill afterwards shows the engine's own reason, not our old one.
    rig.fake.foreign_kill(&name);
    let s = rig
        .until(id, "killed", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Killed));
}

// ---- stop reasons -------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn foreign_stops_and_kills_never_show_our_reason() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    rig.handle.stop(id, None).await.unwrap();
    rig.start(id).await;

    rig.fake.foreign_stop(&name);
    let s = rig
        .until(id, "stopped", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, None, "a foreign stop has no reason");

    rig.start(id).await;
    rig.fake.foreign_kill(&name);
    let s = rig
        .until(id, "killed", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Killed));

    rig.start(id).await;
    rig.fake.oom_kill(&name);
    let s = rig
        .until(id, "oom", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Oom));

    // Our stop, then a foreign start and stop: the timestamp moved on.
    rig.start(id).await;
    rig.handle.stop(id, None).await.unwrap();
    rig.fake.foreign_start(&name);
    rig.until(id, "running", |s| s.container == ContainerState::Running)
        .await;
    rig.fake.foreign_stop(&name);
    let s = rig
        .until(id, "stopped", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, None);
}
