//! Batches of actions: admitted, fenced, validated, relayed, renewed.

use dormouse_protocol::actions::ActionBatch;

use super::*;

fn batch(v: serde_json::Value) -> ActionBatch {
    serde_json::from_value(v).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_relayed_and_its_images_come_back_in_base64() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let results = rig
        .handle
        .actions(
            id,
            None,
            batch(serde_json::json!({"actions": [
                {"action": "left_click", "coordinate": [3, 4]},
                {"action": "cursor_position"},
                {"action": "screenshot"}]})),
        )
        .await
        .unwrap();
    let v = serde_json::to_value(&results).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"results": [
            {"action": "left_click", "ok": true},
            {"action": "cursor_position", "ok": true, "coordinate": [1, 2]},
            {"action": "screenshot", "ok": true, "size": [1, 1],
             "image": {"media_type": "image/png", "data": "iVBORw0KGgpmYWtl"}}]})
    );
}

#[tokio::test(start_paused = true)]
async fn batches_are_refused_before_anything_runs() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let click = || batch(serde_json::json!({"actions": [{"action": "left_click"}]}));
    let err = rig
        .handle
        .actions(Uuid::new_v4(), None, click())
        .await
        .unwrap_err();
    assert_eq!(err.http_status(), 404);
    let id = rig.create().await.id;
    let err = rig
        .handle
        .actions(
            id,
            None,
            batch(serde_json::json!({"actions": [
                {"action": "key", "text": "a"}, {"action": "key", "text": "ctrl+Nope"}]})),
        )
        .await
        .unwrap_err();
    assert_eq!((err.http_status(), err.code()), (400, "invalid_actions"));
    assert!(err.to_string().contains("actions[1]"), "{err}");
    assert!(err.to_string().contains("Nope"), "{err}");
    let grant = rig
        .handle
        .lease(
            id,
            LeaseRequest {
                holder: "a".into(),
                ttl_ms: 60_000,
            },
        )
        .await
        .unwrap();
    let err = rig.handle.actions(id, Some(0), click()).await.unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    let err = rig.handle.actions(id, None, click()).await.unwrap_err();
    assert_eq!(err.code(), "lease_held");
    rig.handle
        .actions(id, Some(grant.generation), click())
        .await
        .unwrap();
    rig.handle.stop(id, Some(grant.generation)).await.unwrap();
    let err = rig
        .handle
        .actions(id, Some(grant.generation), click())
        .await
        .unwrap_err();
    assert_eq!((err.http_status(), err.code()), (409, "wrong_state"));
}

#[tokio::test(start_paused = true)]
async fn a_batch_renews_the_idle_timer_past_its_waits() {
    let rig = Rig::new(Duration::from_secs(10)).await;
    let id = rig.create().await.id;
    advance(Duration::from_secs(8)).await;
    rig.handle
        .actions(
            id,
            None,
            batch(serde_json::json!({"actions": [{"action": "wait", "duration": 5}]})),
        )
        .await
        .unwrap();
    // The window starts after the batch's own 5 s: 14 s from now it still runs.
    advance(Duration::from_secs(14)).await;
    settle().await;
    let status = rig.handle.get(id).await.unwrap();
    assert_eq!(status.container, ContainerState::Running, "{status:?}");
}

#[tokio::test(start_paused = true)]
async fn a_lease_taken_while_a_batch_runs_revokes_it_and_closes_its_guest_connection() {
    use std::sync::atomic::Ordering;
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.script.hold_actions.store(true, Ordering::SeqCst);
    let handle = rig.handle.clone();
    let call = tokio::spawn(async move {
        let click = batch(serde_json::json!({"actions": [{"action": "left_click"}]}));
        handle.actions(id, None, click).await
    });
    while rig.script.held_actions.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let grant = rig
        .handle
        .lease(
            id,
            LeaseRequest {
                holder: "b".into(),
                ttl_ms: 60_000,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        grant.generation, 1,
        "taking the lease moved the generation on"
    );
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code(), "wrong_state");
    assert!(err.to_string().contains("fenced off"), "{err}");
    // The guest sees its connection end (it would stop the batch there).
    tokio::time::timeout(Duration::from_secs(5), async {
        while rig.script.held_actions.load(Ordering::SeqCst) != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the guest connection closed");
    // A batch admitted under the new generation is not revoked.
    rig.script.hold_actions.store(false, Ordering::SeqCst);
    let click = batch(serde_json::json!({"actions": [{"action": "left_click"}]}));
    rig.handle.actions(id, Some(1), click).await.unwrap();
}
