//! The idle timer as the owner drives it.

use super::*;

// ---- idle ---------------------------------------------------------------------

/// A running, ready desktop whose idle window starts exactly now.
async fn idle_rig(window: Duration) -> (Rig, Uuid) {
    let rig = Rig::new(window).await;
    let id = rig.create().await.id;
    rig.handle.touch(id, None).await.unwrap();
    (rig, id)
}

#[tokio::test(start_paused = true)]
async fn idle_stops_after_exactly_one_quiet_window_and_only_stops() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    advance(999 * MS).await;
    settle().await;
    assert_eq!(
        mutations_of(&rig.fake, "stop"),
        0,
        "999 ms into a 1 s window: nothing"
    );
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Running);
    assert!(s.idle.as_ref().unwrap().stops_at.is_some());
    advance(MS).await;
    let s = rig
        .until(id, "idle stop", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Idle));
    assert_eq!(s.idle.unwrap().stops_at, None);
    let name = Rig::name(id);
    assert_eq!(
        rig.fake.mutations(),
        vec![
            format!("create {name}"),
            format!("start {name}"),
            format!("stop {name}")
        ],
        "idle issues stop only: never remove, never recreate"
    );
    assert!(rig
        .metrics
        .render(&[])
        .contains("dormouse_idle_stops_total 1"));
}

#[tokio::test(start_paused = true)]
async fn touch_renews_and_reads_do_not() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    advance(600 * MS).await;
    rig.handle.touch(id, None).await.unwrap();
    // Reads do not renew: status, list, screenshot, events.
    let _events = rig.handle.subscribe();
    advance(300 * MS).await;
    rig.handle.get(id).await.unwrap();
    rig.handle.list().await.unwrap();
    rig.handle.screenshot(id).await.unwrap();
    advance(699 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0, "renewed at 600 ms");
    advance(MS).await;
    rig.until(id, "idle stop at 1.6 s", |s| {
        s.container == ContainerState::Stopped
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_busy_guest_is_never_stopped_and_quiet_starts_a_new_window() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    rig.script.set_busy(true);
    for _ in 0..50 {
        advance(100 * MS).await;
        settle().await;
    }
    assert_eq!(mutations_of(&rig.fake, "stop"), 0, "busy never stops");
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.idle.unwrap().stops_at, None, "no stop time while busy");
    rig.script.set_busy(false);
    // The next re-check (a tenth of the window) sees the quiet moment and
    // starts a full new window from there.
    advance(100 * MS).await;
    settle().await;
    let s = rig.handle.get(id).await.unwrap();
    assert!(s.idle.unwrap().stops_at.is_some());
    advance(999 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0, "a full new window");
    advance(MS).await;
    rig.until(id, "idle stop", |s| s.container == ContainerState::Stopped)
        .await;
}

#[tokio::test(start_paused = true)]
async fn guest_input_counts_as_activity() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    rig.script.activity.lock().unwrap().input_idle_ms = Some(400);
    advance(1000 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0, "input 400 ms ago");
    rig.script.activity.lock().unwrap().input_idle_ms = Some(10_000);
    advance(399 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0);
    advance(MS).await;
    rig.until(id, "idle stop", |s| s.container == ContainerState::Stopped)
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_manual_stop_cancels_the_idle_timer() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    advance(500 * MS).await;
    let s = rig.handle.stop(id, None).await.unwrap();
    assert_eq!(s.stop_reason, Some(StopReason::Manual));
    advance(5000 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 1);
    assert_eq!(
        rig.handle.get(id).await.unwrap().stop_reason,
        Some(StopReason::Manual)
    );
}

#[tokio::test(start_paused = true)]
async fn a_changed_window_counts_from_the_last_activity() {
    let (rig, id) = idle_rig(Duration::from_secs(10)).await;
    advance(3000 * MS).await;
    let err = rig
        .handle
        .patch(
            id,
            PatchComputer {
                idle_timeout_ms: Some(999),
            },
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::BadRequest(_)));
    let s = rig
        .handle
        .patch(
            id,
            PatchComputer {
                idle_timeout_ms: Some(5000),
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(s.idle.as_ref().unwrap().timeout_ms, 5000);
    advance(1999 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0);
    advance(MS).await;
    rig.until(id, "stop at 5 s", |s| {
        s.container == ContainerState::Stopped
    })
    .await;
    let record = ComputerStore::new(rig.paths()).load(id).unwrap().unwrap();
    assert_eq!(
        record.idle_timeout_ms,
        Some(5000),
        "the override is persisted"
    );
}

#[tokio::test(start_paused = true)]
async fn failed_idle_stops_back_off() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    rig.fake
        .fail_next(Verb::Stop, EngineError::Failed("busy engine".into()));
    rig.fake
        .fail_next(Verb::Stop, EngineError::Failed("busy engine".into()));
    advance(1000 * MS).await;
    rig.settled(id, "first failure", |s| {
        s.problem
            .as_deref()
            .is_some_and(|p| p.contains("idle stop failed"))
    })
    .await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 1);
    // First failure: back off one window.
    advance(999 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 1);
    advance(MS).await;
    rig.settled(id, "second failure", |s| {
        s.problem
            .as_deref()
            .is_some_and(|p| p.contains("(2 so far)"))
    })
    .await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 2);
    // Second failure: two windows.
    advance(1999 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 2);
    advance(MS).await;
    let s = rig
        .until(id, "stopped", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Idle));
    assert_eq!(mutations_of(&rig.fake, "stop"), 3);
}
