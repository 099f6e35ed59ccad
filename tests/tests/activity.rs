//! End-to-end: a real desktop's activity record. An action batch that types
//! a secret and a command run through `exec` appear in `GET …/activity`
//! and on `/v1/events` as they happen, by kind, count and argv, while the
//! typed text appears nowhere in either. The command's own output is the
//! witness that it ran.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{with_broker, BrokerProcess, READY_TIMEOUT};
use dormouse_e2e::client::{create_ready, EventStream};
use dormouse_protocol::activity::{ActivityEntry, ActivityKind};
use dormouse_protocol::api::BrokerEvent;
use dormouse_protocol::exec::ExecRequest;
use serde_json::{json, Value};

const SECRET: &str = "typed-secret-4c1d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_and_commands_are_recorded_without_what_was_typed() -> Result<()> {
    with_broker(
        "actions_and_commands_are_recorded_without_what_was_typed",
        scenario,
    )
    .await
}

async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "activity", READY_TIMEOUT).await?;
    let mut pushed = api.events().await?;

    let batch = json!({"actions": [
        {"action": "mouse_move", "coordinate": [300, 300]},
        {"action": "type", "text": SECRET},
        {"action": "key", "text": "Return"},
    ]});
    let answer: Value = api
        .call(
            dormouse_client::Method::POST,
            &format!("/v1/computers/{id}/actions"),
            Some(&batch),
        )
        .await?;
    ensure!(
        answer["results"].as_array().map(Vec::len) == Some(3),
        "{answer}"
    );
    let request: ExecRequest =
        serde_json::from_value(json!({"argv": ["sh", "-c", "echo activity-$((6*7))"]}))?;
    let ran = api.exec(id, &request, false).await?;
    let ran = serde_json::to_value(&ran)?;
    ensure!(ran["stdout"] == "activity-42\n", "{ran}");

    // Both are pushed, each once, for this desktop.
    let mut seen: Vec<ActivityEntry> = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(has(&seen, ActivityKind::Actions) && has(&seen, ActivityKind::Exec)) {
        let event = tokio::time::timeout_at(until, pushed.next())
            .await
            .context("no activity pushed in 10 s")??
            .context("the event stream ended")?;
        if let BrokerEvent::Activity { id: of, entry } = event {
            ensure!(of == id, "activity of {of}");
            let text = serde_json::to_string(&entry)?;
            ensure!(!text.contains(SECRET), "the typed text was pushed: {text}");
            seen.push(*entry);
        }
    }

    let page = api.activity(id, 50).await?;
    let whole = serde_json::to_string(&page)?;
    ensure!(!whole.contains(SECRET), "the typed text is in the record");
    let actions = page
        .entries
        .iter()
        .find(|e| e.kind == ActivityKind::Actions)
        .context("no actions entry")?;
    ensure!(actions.detail["count"] == 3, "{}", actions.detail);
    ensure!(actions.detail["names"]["type"] == 1, "{}", actions.detail);
    ensure!(actions.detail["ok"] == true, "{}", actions.detail);
    let exec = page
        .entries
        .iter()
        .find(|e| e.kind == ActivityKind::Exec)
        .context("no exec entry")?;
    ensure!(
        exec.detail["argv"] == json!(["sh", "-c", "echo activity-$((6*7))"]),
        "{}",
        exec.detail
    );
    ensure!(exec.detail["exit_code"] == 0, "{}", exec.detail);
    // Newest first, numbers increasing with time, the pushed ones among them.
    let seqs: Vec<u64> = page.entries.iter().map(|e| e.seq).collect();
    ensure!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
    for entry in &seen {
        ensure!(
            page.entries.contains(entry),
            "pushed but not listed: {entry:?}"
        );
    }
    ensure!(
        page.entries.iter().any(|e| e.kind == ActivityKind::Started),
        "the create's start is recorded"
    );
    Ok(())
}

fn has(seen: &[ActivityEntry], kind: ActivityKind) -> bool {
    seen.iter().any(|e| e.kind == kind)
}
