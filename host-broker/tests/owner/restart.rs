//! Coming back after a host restart: a desktop that went down while no
//! broker watched (the owner ended, its container killed behind it, a new
//! owner on the same data directory) is started again after the reconcile
//! through the ordinary resume, at most `resume_concurrency` at a time; one
//! the broker or a user stopped, or one the broker watched go down, is not;
//! with `ResumeAfterRestart::None` nothing is.

use dormouse_core::config::ResumeAfterRestart;
use dormouse_protocol::activity::{ActivityKind, Actor};

use super::*;

fn stopped(s: &ComputerStatus) -> bool {
    s.container == ContainerState::Stopped
}

/// Whether the record on disk says the desktop is wanted running.
fn wanted(rig: &Rig, id: Uuid) -> bool {
    ComputerStore::new(rig.paths())
        .load(id)
        .unwrap()
        .unwrap()
        .wanted_running_since
        .is_some()
}

/// The owner ends (the broker is down); `killed` die behind its back, as
/// when the host goes down; a new owner starts with `change` applied.
async fn host_down(rig: Rig, killed: &[Uuid], change: impl FnOnce(&mut BrokerConfig)) -> Rig {
    let meanwhile = |fake: &FakeEngine| {
        for id in killed {
            fake.silent_kill(&Rig::name(*id));
        }
    };
    rig.restart_with(Duration::from_secs(3600), meanwhile, change)
        .await
}

#[tokio::test(start_paused = true)]
async fn what_ran_when_the_host_went_down_comes_back_and_nothing_else() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let a = rig.create().await.id;
    let b = rig.create().await.id;
    let stopped_by_user = rig.create().await.id;
    let killed_while_watched = rig.create().await.id;
    rig.handle.stop(stopped_by_user, None).await.unwrap();
    rig.fake.foreign_kill(&Rig::name(killed_while_watched));
    rig.until(killed_while_watched, "seen killed", stopped)
        .await;
    assert!(wanted(&rig, a) && wanted(&rig, b));
    assert!(!wanted(&rig, stopped_by_user), "a user's stop clears it");
    assert!(
        !wanted(&rig, killed_while_watched),
        "a watched kill clears it"
    );
    let starts_before = mutations_of(&rig.fake, "start");

    let all = [a, b, stopped_by_user, killed_while_watched];
    let rig = host_down(rig, &all, |_| {}).await;
    for id in [a, b] {
        let s = rig.until(id, "back and ready", |s| s.ready).await;
        assert_eq!(s.container, ContainerState::Running);
        let entries = rig.handle.activity(id, 10).unwrap();
        let last: Vec<_> = entries.iter().take(2).map(|e| e.kind).collect();
        assert_eq!(
            last,
            [ActivityKind::Started, ActivityKind::Stopped],
            "{entries:#?}"
        );
        assert_eq!(entries[1].detail["reason"], "host_restart");
        assert!(entries.iter().take(2).all(|e| e.actor == Actor::Broker));
    }
    for id in [stopped_by_user, killed_while_watched] {
        let s = rig.handle.get(id).await.unwrap();
        assert!(stopped(&s), "stays stopped: {s:?}");
    }
    assert_eq!(mutations_of(&rig.fake, "start") - starts_before, 2);
    assert_eq!(mutations_of(&rig.fake, "create"), 4, "nothing recreated");
    assert_eq!(mutations_of(&rig.fake, "remove"), 0, "nothing removed");
}

#[tokio::test(start_paused = true)]
async fn with_none_nothing_starts_and_a_later_restart_does_not_revive_them() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let starts_before = mutations_of(&rig.fake, "start");
    let rig = host_down(rig, &[id], |c| {
        c.resume_after_restart = ResumeAfterRestart::None;
    })
    .await;
    let s = rig.until(id, "reconciled", stopped).await;
    advance(Duration::from_secs(10)).await;
    settle().await;
    assert!(stopped(&rig.handle.get(id).await.unwrap()), "{s:?}");
    assert!(
        !wanted(&rig, id),
        "left stopped: as if the broker stopped it"
    );
    let entries = rig.handle.activity(id, 1).unwrap();
    assert_eq!(entries[0].detail["reason"], "host_restart");

    let rig = host_down(rig, &[], |_| {}).await;
    rig.until(id, "reconciled", stopped).await;
    advance(Duration::from_secs(10)).await;
    settle().await;
    assert!(stopped(&rig.handle.get(id).await.unwrap()));
    assert_eq!(mutations_of(&rig.fake, "start"), starts_before);
}

#[tokio::test(start_paused = true)]
async fn at_most_the_concurrency_boot_at_once() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let ids = [
        rig.create().await.id,
        rig.create().await.id,
        rig.create().await.id,
    ];
    let starts_before = mutations_of(&rig.fake, "start");
    // The guests never get ready: each start holds its slot until its
    // ready wait (5 s here) runs out.
    rig.script.never_ready.store(true, Ordering::SeqCst);
    let rig = host_down(rig, &ids, |c| c.resume_concurrency = 1).await;
    settle().await;
    advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(
        mutations_of(&rig.fake, "start") - starts_before,
        1,
        "one at a time"
    );
    for (n, _) in ids.iter().enumerate().skip(1) {
        advance(Duration::from_secs(6)).await;
        settle().await;
        assert_eq!(mutations_of(&rig.fake, "start") - starts_before, n + 1);
    }
    for id in ids {
        let s = rig.handle.get(id).await.unwrap();
        assert_eq!(s.container, ContainerState::Running, "{s:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_stop_while_the_engine_was_away_happened_unwatched() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.fake.set_unavailable(true);
    rig.fake.silent_kill(&Rig::name(id));
    advance(Duration::from_secs(5)).await;
    settle().await;
    rig.fake.set_unavailable(false);
    rig.until(id, "seen stopped once the engine answers", stopped)
        .await;
    assert!(
        wanted(&rig, id),
        "a stop the broker could not watch keeps it"
    );
    let rig = host_down(rig, &[], |_| {}).await;
    rig.until(id, "back after the restart", |s| s.ready).await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_stop_is_not_undone_by_a_restart() {
    let rig = Rig::new(Duration::from_secs(60)).await;
    let id = rig.create().await.id;
    advance(Duration::from_secs(61)).await;
    let s = rig.until(id, "idle stop", stopped).await;
    assert_eq!(s.stop_reason, Some(StopReason::Idle));
    assert!(!wanted(&rig, id));
    let starts_before = mutations_of(&rig.fake, "start");
    let rig = host_down(rig, &[], |_| {}).await;
    rig.until(id, "reconciled", stopped).await;
    advance(Duration::from_secs(10)).await;
    settle().await;
    assert!(stopped(&rig.handle.get(id).await.unwrap()));
    assert_eq!(mutations_of(&rig.fake, "start"), starts_before);
}
