//! The engine's truth from more than its event stream: the guest channel
//! as a second witness, the periodic resync, a start that observes before
//! it refuses, and events judged on their labels (an engine that matches a
//! bare-key label filter against nothing still reaches the owner).

use super::*;
use dormouse_protocol::api::StopReason;

fn stopped(s: &ComputerStatus) -> bool {
    s.container == ContainerState::Stopped
}

/// The engine's record says the run ended; nothing else happens (no event,
/// the guest still answers).
fn exit_behind_everyone(fake: &FakeEngine, name: &str) {
    fake.mutate(name, |c| {
        c.state = RunState::Exited;
        c.exit_code = Some(137);
        c.finished_at = Some(chrono::Utc::now());
    });
}

#[tokio::test(start_paused = true)]
async fn a_kill_no_event_reports_is_seen_through_the_guest_within_a_second() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    let before = rig.metrics.divergences();

    let killed_at = Instant::now();
    rig.fake.silent_kill(&name);
    let s = rig.until(id, "stopped after a silent kill", stopped).await;
    let after = killed_at.elapsed();
    assert!(after <= Duration::from_secs(1), "seen after {after:?}");
    assert_eq!(s.stop_reason, Some(StopReason::Killed), "{s:?}");
    assert!(s.resumable, "{s:?}");

    // Resumed at once; no event ever said it had stopped: once the grace
    // has passed, that counts.
    rig.start(id).await;
    assert_eq!(rig.metrics.divergences(), before, "not before the grace");
    advance(EVENT_GRACE_FOR_TESTS + Duration::from_millis(200)).await;
    settle().await;
    assert_eq!(rig.metrics.divergences(), before + 1);
    assert!(rig
        .metrics
        .render(&[])
        .contains(&format!("dormouse_state_divergence_total {}", before + 1)));
}

#[tokio::test(start_paused = true)]
async fn a_kill_while_the_engine_is_away_is_seen_as_soon_as_it_answers() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.fake.set_unavailable(true);
    rig.fake.silent_kill(&Rig::name(id));
    advance(Duration::from_secs(5)).await;
    settle().await;
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Unknown, "{s:?}");

    rig.fake.set_unavailable(false);
    let back = Instant::now();
    let s = rig
        .until(id, "stopped once the engine answers", stopped)
        .await;
    assert!(
        back.elapsed() <= Duration::from_millis(500),
        "{:?}",
        back.elapsed()
    );
    assert_eq!(s.stop_reason, Some(StopReason::Killed), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_kill_the_events_report_is_no_divergence() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.fake.foreign_kill(&Rig::name(id));
    let s = rig.until(id, "stopped after a kill", stopped).await;
    assert_eq!(s.stop_reason, Some(StopReason::Killed));
    advance(Duration::from_secs(20)).await;
    settle().await;
    assert_eq!(rig.metrics.divergences(), 0, "the event told it");
}

#[tokio::test(start_paused = true)]
async fn the_resync_corrects_a_stop_nobody_reported() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    exit_behind_everyone(&rig.fake, &name);
    // Neither an event nor the guest says anything: the belief stands
    // until the next resync.
    advance(Duration::from_secs(5)).await;
    settle().await;
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Running, "{s:?}");
    assert_eq!(rig.metrics.divergences(), 0);

    advance(dormouse_core::config::DEFAULT_RESYNC_INTERVAL).await;
    let s = rig.settled(id, "the resync saw the stop", stopped).await;
    assert_eq!(s.stop_reason, Some(StopReason::Killed), "{s:?}");
    assert_eq!(rig.metrics.divergences(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_start_on_a_stale_belief_resumes() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    exit_behind_everyone(&rig.fake, &name);
    assert_eq!(
        rig.handle.get(id).await.unwrap().container,
        ContainerState::Running,
        "the broker still believes it runs"
    );
    rig.start(id).await;
    assert_eq!(
        mutations_of(&rig.fake, "start"),
        2,
        "{:?}",
        rig.fake.mutations()
    );

    // Where the engine confirms the belief, the start is refused and that
    // is no problem of the desktop's.
    let refused = rig.handle.start(id, None).await.unwrap_err();
    assert!(matches!(refused, BrokerError::WrongState(_)), "{refused:?}");
    let s = rig.settled(id, "still ready", |s| s.ready).await;
    assert_eq!(s.problem, None, "{s:?}");
    assert_eq!(mutations_of(&rig.fake, "start"), 2);
}

#[tokio::test(start_paused = true)]
async fn events_arrive_from_an_engine_blind_to_bare_label_filters() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    rig.fake.blind_to_bare_labels(true);
    // The broker's subscription is made afresh on this engine.
    rig.fake.set_unavailable(true);
    advance(Duration::from_secs(1)).await;
    settle().await;
    rig.fake.set_unavailable(false);
    advance(Duration::from_secs(11)).await;
    settle().await;

    let id = rig.create().await.id;
    let name = Rig::name(id);
    let before = rig.metrics.divergences();
    let at = Instant::now();
    exit_behind_everyone(&rig.fake, &name);
    rig.fake.emit("die", &name);
    rig.until(id, "stopped on the event alone", stopped).await;
    assert!(at.elapsed() < Duration::from_secs(1), "{:?}", at.elapsed());
    assert_eq!(rig.metrics.divergences(), before);
}

#[tokio::test(start_paused = true)]
async fn a_start_the_engine_failed_after_a_kill_shows_the_kill_not_the_stop_before() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    let before = rig.handle.stop(id, None).await.unwrap();
    assert_eq!(before.stop_reason, Some(StopReason::Manual), "{before:?}");

    // The container starts, is killed at once, and the engine answers the
    // start with an error (as Podman does); its inspect is slow to come.
    let fake = Arc::downgrade(&rig.fake);
    let once = AtomicBool::new(true);
    rig.fake.on_start(move |info| {
        if let (true, Some(fake)) = (once.swap(false, Ordering::SeqCst), fake.upgrade()) {
            fake.foreign_kill(&info.name);
            fake.delay_next(Verb::Inspect, Duration::from_millis(100));
        }
    });
    rig.fake
        .fail_next_start_after_acting(EngineError::Failed("container is not running".into()));
    let failed = rig.handle.start(id, None).await.unwrap_err();
    assert!(matches!(failed, BrokerError::Engine(_)), "{failed:?}");

    // Never the stop before, as if the start had not happened.
    let s = rig.handle.get(id).await.unwrap();
    assert!(
        s.stop_reason != Some(StopReason::Manual) && s.stopped_at != before.stopped_at,
        "the run before is shown: {s:?}"
    );
    let s = rig.until(id, "the kill seen", stopped).await;
    assert_eq!(s.stop_reason, Some(StopReason::Killed), "{s:?}");
    assert_eq!(
        s.stopped_at,
        rig.fake.container(&name).and_then(|c| c.finished_at),
        "{s:?}"
    );
    assert!(s.resumable, "{s:?}");
}

/// The witness's grace for the engine's own event.
const EVENT_GRACE_FOR_TESTS: Duration = dormouse_core::owner::EVENT_GRACE;
