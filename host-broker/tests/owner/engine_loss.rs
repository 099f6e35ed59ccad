//! The engine lost and back, over the fake (`set_unavailable`, which also
//! breaks the open event stream as a stopped engine does), under paused
//! time: every desktop `unknown` with a problem naming the engine, calls
//! that need the engine refused with `engine_unavailable`, nothing revoked,
//! a bounded backoff, and on the return every desktop reconciled.

use dormouse_core::relay::Purpose;
use dormouse_docker::fake::Call;
use dormouse_protocol::screen::ScreenMode;

use super::*;

fn lists(fake: &FakeEngine) -> usize {
    fake.calls()
        .iter()
        .filter(|c| matches!(c, Call::List))
        .count()
}

fn view_screen(rig: &Rig, id: Uuid) -> Uuid {
    let screens = rig.handle.screens();
    let epoch = screens.epoch(id);
    screens
        .mint(id, ScreenMode::View, 3_600_000, 0, epoch, None)
        .unwrap()
        .screen_id
}

/// Lets `d` pass in small steps, every task running between them (one
/// `advance` of the whole would fire each timer once only).
async fn pass(d: Duration) {
    let step = Duration::from_millis(50);
    for _ in 0..(d.as_millis() / step.as_millis()) {
        advance(step).await;
        settle().await;
    }
}

fn live(rig: &Rig, id: Uuid) -> usize {
    rig.handle.screens().list(id).len()
}

#[tokio::test(start_paused = true)]
async fn a_lost_engine_leaves_every_desktop_unknown_and_its_return_reconciles_each() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let stays = rig.create().await.id;
    let dies = rig.create().await.id;
    let stopped = rig.create().await.id;
    rig.handle.stop(stopped, None).await.unwrap();
    view_screen(&rig, stays);
    view_screen(&rig, dies);
    assert_eq!(rig.handle.engine_availability().lost, None);

    rig.fake.set_unavailable(true);
    let lost_at = Instant::now();
    let before = lists(&rig.fake);
    for id in [stays, dies, stopped] {
        let s = rig
            .settled(id, "unknown once the engine went", |s| {
                s.container == ContainerState::Unknown
            })
            .await;
        let problem = s.problem.clone().unwrap_or_default();
        assert!(
            problem.starts_with("container engine: unavailable since"),
            "{s:?}"
        );
        assert!(!s.ready && !s.resumable, "{s:?}");
    }
    let a = rig.handle.engine_availability();
    assert!(a.lost.is_some() && a.losses == 1, "{a:?}");

    // Calls that need the engine's truth say why they cannot be made.
    let code = |r: Result<ComputerStatus, BrokerError>| r.unwrap_err().code();
    assert_eq!(
        code(rig.handle.start(stopped, None).await),
        "engine_unavailable"
    );
    assert_eq!(
        code(rig.handle.stop(stays, None).await),
        "engine_unavailable"
    );
    let exec = rig.handle.admit_guest(stays, None, Purpose::Exec).await;
    assert_eq!(exec.unwrap_err().code(), "engine_unavailable");
    let screen = rig
        .handle
        .admit_guest(stays, None, Purpose::Screen(ScreenMode::View))
        .await;
    assert_eq!(screen.unwrap_err().code(), "engine_unavailable");
    // The desktop's own web access goes on.
    let egress = rig.handle.admit_guest(stays, None, Purpose::Egress).await;
    assert!(egress.is_ok(), "{egress:?}");
    assert!(
        rig.handle.list().await.unwrap().len() == 3,
        "the broker serves"
    );
    // The stop refused wrote no intent to finish later.
    assert!(rig.handle.get(stays).await.unwrap().stop_reason.is_none());

    // One desktop dies while nobody can see it; the engine stays away 10 s.
    rig.fake.silent_kill(&Rig::name(dies));
    pass(Duration::from_secs(10)).await;
    let tries = lists(&rig.fake) - before;
    // 100 ms doubling to 5 s (±20 %): 0.1+0.2+0.4+0.8+1.6+3.2 = 6.3 s, then
    // one more by 11.3 s: 6 or 7 tries in 10 s, never a tight loop.
    assert!((5..=8).contains(&tries), "{tries} tries in 10 s");
    assert_eq!(
        live(&rig, stays),
        1,
        "nothing revoked while the engine is away"
    );
    assert_eq!(live(&rig, dies), 1, "not revoked before the engine says so");

    rig.fake.set_unavailable(false);
    // The next try comes within the longest pause.
    pass(RETRY_MAX.mul_f64(1.0 + RETRY_JITTER)).await;
    let s = rig
        .settled(stays, "ready again", |s| {
            s.ready && s.container == ContainerState::Running
        })
        .await;
    assert_eq!(s.problem, None, "{s:?}");
    let s = rig
        .settled(dies, "stopped/killed", |s| {
            s.container == ContainerState::Stopped
        })
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Killed), "{s:?}");
    assert!(s.resumable, "{s:?}");
    let s = rig
        .settled(stopped, "stopped again", |s| {
            s.container == ContainerState::Stopped
        })
        .await;
    assert!(s.resumable && s.problem.is_none(), "{s:?}");
    assert_eq!(live(&rig, stays), 1, "the running desktop keeps its screen");
    assert_eq!(live(&rig, dies), 0, "the dead desktop's screen is revoked");

    let a = rig.handle.engine_availability();
    assert_eq!(a.lost, None);
    let back = a.last_return.clone().expect("a return is recorded");
    assert_eq!(back.desktops, 3);
    assert!(back.reconciled_in.is_some(), "{back:?}");
    assert!(back.away >= Duration::from_secs(10) && lost_at.elapsed() >= back.away);
    assert!(a.health_lines()[0].contains("3 desktops reconciled"));

    rig.start(dies).await;
    rig.start(stopped).await;
}

#[tokio::test(start_paused = true)]
async fn a_start_in_flight_when_the_engine_goes_fails_clearly_and_leaves_a_resumable_desktop() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.fake.delay_next(Verb::Start, Duration::from_secs(1));
    let handle = rig.handle.clone();
    let start = tokio::spawn(async move { handle.start(id, None).await });
    settle().await;
    rig.fake.set_unavailable(true);
    pass(Duration::from_secs(2)).await;
    let err = start.await.unwrap().unwrap_err();
    assert_eq!(err.code(), "engine_unavailable");
    rig.fake.set_unavailable(false);
    pass(RETRY_MAX.mul_f64(1.0 + RETRY_JITTER)).await;
    let s = rig
        .settled(id, "stopped and resumable", |s| {
            s.container == ContainerState::Stopped && s.resumable
        })
        .await;
    assert_eq!(
        s.problem, None,
        "the engine's absence is no lasting problem"
    );
    rig.start(id).await;
}

#[tokio::test(start_paused = true)]
async fn the_backoff_starts_afresh_after_a_return() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    for round in 0..2 {
        rig.fake.set_unavailable(true);
        settle().await;
        let before = lists(&rig.fake);
        pass(Duration::from_millis(350)).await;
        // 100 ms then 200 ms (±20 %): the first two tries come quickly.
        let tries = lists(&rig.fake) - before;
        assert!((1..=3).contains(&tries), "round {round}: {tries}");
        rig.fake.set_unavailable(false);
        pass(RETRY_MAX.mul_f64(1.0 + RETRY_JITTER)).await;
        assert_eq!(rig.handle.engine_availability().lost, None);
        // The stream has to live a while for the link to count as working.
        pass(Duration::from_secs(6)).await;
    }
    assert_eq!(rig.handle.engine_availability().losses, 2);
}
