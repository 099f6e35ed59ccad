//! Leases, generations and takeovers.

use super::*;

// ---- fencing ------------------------------------------------------------------

fn lease_req(holder: &str, ttl_ms: u64) -> LeaseRequest {
    LeaseRequest {
        holder: holder.into(),
        ttl_ms,
    }
}

#[tokio::test(start_paused = true)]
async fn leases_fence_mutating_calls() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let grant = rig.handle.lease(id, lease_req("a", 60_000)).await.unwrap();
    assert_eq!(grant.generation, 1);
    let on_disk = ComputerStore::new(rig.paths()).load(id).unwrap().unwrap();
    assert_eq!(on_disk.generation, 1, "persisted before it was returned");

    let err = rig.handle.stop(id, None).await.unwrap_err();
    assert_eq!(err.code(), "lease_held");
    let err = rig.handle.stop(id, Some(0)).await.unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    assert_eq!(err.http_status(), 409);
    let err = rig.handle.touch(id, Some(7)).await.unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    assert!(rig
        .metrics
        .render(&[])
        .contains("dormouse_fencing_rejections_total 3"));
    assert_eq!(
        mutations_of(&rig.fake, "stop"),
        0,
        "refusals change nothing"
    );

    let err = rig
        .handle
        .lease(id, lease_req("b", 1000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "lease_held");
    let renewed = rig.handle.lease(id, lease_req("a", 60_000)).await.unwrap();
    assert_eq!(renewed.generation, 1, "a renewal keeps the generation");

    rig.handle.stop(id, Some(1)).await.unwrap();
    // Reads need no generation.
    rig.handle.get(id).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn generations_only_grow_across_restarts() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    assert_eq!(
        rig.handle
            .lease(id, lease_req("a", 1))
            .await
            .unwrap()
            .generation,
        1
    );
    // Leases expire by the wall clock.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        rig.handle
            .lease(id, lease_req("b", 1))
            .await
            .unwrap()
            .generation,
        2
    );
    let rig = rig.restart(Duration::from_secs(3600)).await;
    std::thread::sleep(Duration::from_millis(5));
    let grant = rig.handle.lease(id, lease_req("c", 60_000)).await.unwrap();
    assert_eq!(grant.generation, 3);
    let err = rig.handle.touch(id, Some(2)).await.unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    assert_eq!(rig.handle.get(id).await.unwrap().generation, 3);
}

#[tokio::test(start_paused = true)]
async fn a_takeover_waits_for_the_operation_in_flight() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.lease(id, lease_req("a", 1)).await.unwrap();
    rig.fake.delay(Verb::Stop, Duration::from_secs(3));
    let stopping = {
        let handle = rig.handle.clone();
        tokio::spawn(async move { handle.stop(id, Some(1)).await })
    };
    settle().await;
    std::thread::sleep(Duration::from_millis(5));
    let taking = {
        let handle = rig.handle.clone();
        tokio::spawn(async move { handle.lease(id, lease_req("b", 60_000)).await })
    };
    settle().await;
    assert!(!taking.is_finished(), "granted only once the stop is done");
    // Mutating calls wait for the takeover too.
    let err = rig.handle.touch(id, Some(1)).await.unwrap_err();
    assert!(matches!(err, BrokerError::WrongState(_)));
    let stopped = stopping.await.unwrap().unwrap();
    assert_eq!(stopped.container, ContainerState::Stopped);
    let grant = taking.await.unwrap().unwrap();
    assert_eq!(grant.generation, 2);
    assert_eq!(grant.holder, "b");
}

#[tokio::test(start_paused = true)]
async fn a_hung_operation_is_fenced_by_a_takeover() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.handle.lease(id, lease_req("a", 1)).await.unwrap();
    rig.fake.delay(Verb::Start, Duration::from_secs(10_000));
    let starting = {
        let handle = rig.handle.clone();
        tokio::spawn(async move { handle.start(id, Some(1)).await })
    };
    settle().await;
    std::thread::sleep(Duration::from_millis(5));
    let grant = rig.handle.lease(id, lease_req("b", 60_000)).await.unwrap();
    assert_eq!(grant.generation, 2);
    let err = starting.await.unwrap().unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Stopped);
    assert_eq!(s.generation, 2);
}
