//! The activity record through the API, over the real owner on the
//! recording fake engine: each kind recorded once with its actor, pushed on
//! `/v1/events`, kept across a broker restart, removed with the desktop.

use dormouse_broker::api::{self, ApiState, ApiToken};
use dormouse_client::{Client, Endpoint, StatusCode};
use dormouse_protocol::activity::{ActivityEntry, ActivityKind, Actor};

use super::*;

const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Serves the API over `rig`'s owner on a fresh loopback port.
async fn serve(rig: &Rig) -> (Client, std::net::SocketAddr) {
    let state = ApiState::new(
        rig.handle.clone(),
        rig.metrics.clone(),
        ApiToken::new(TOKEN),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = api::router(state);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (Client::new(Endpoint::tcp(addr), TOKEN).unwrap(), addr)
}

fn kinds(entries: &[ActivityEntry]) -> Vec<ActivityKind> {
    entries.iter().rev().map(|e| e.kind).collect()
}

fn only(entries: &[ActivityEntry], kind: ActivityKind) -> &ActivityEntry {
    let found: Vec<_> = entries.iter().filter(|e| e.kind == kind).collect();
    assert_eq!(found.len(), 1, "one {kind:?}: {entries:#?}");
    found[0]
}

#[tokio::test]
async fn each_kind_is_recorded_once_with_its_actor_and_pushed() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let (api, addr) = serve(&rig).await;
    let mut events = api.events().await.unwrap();
    let id = rig.create().await.id;
    let grant = api
        .lease(
            id,
            &LeaseRequest {
                holder: "agent-7".into(),
                ttl_ms: 60_000,
            },
        )
        .await
        .unwrap();
    let held = api.with_generation(Some(grant.generation));
    let secret = "hunter2-typed-secret";
    let batch = serde_json::from_value(serde_json::json!({"actions": [
        {"action": "left_click", "coordinate": [3, 4]},
        {"action": "left_click", "coordinate": [5, 6]},
        {"action": "type", "text": secret},
        {"action": "key", "text": "ctrl+a"}]}))
    .unwrap();
    let _ = held.actions(id, &batch).await;
    // The scripted guest refuses commands: recorded on that outcome too.
    let exec = dormouse_protocol::exec::ExecRequest {
        argv: Some(vec!["ls".into(), "-l".into()]),
        ..serde_json::from_value(serde_json::json!({})).unwrap()
    };
    assert!(held.exec(id, &exec, false).await.is_err());
    held.write_file(id, "notes/a.txt", b"hello".to_vec(), true)
        .await
        .unwrap();
    held.release_lease(id).await.unwrap();
    api.stop(id).await.unwrap();

    let page = api.activity(id, 100).await.unwrap();
    let e = &page.entries;
    assert_eq!(
        kinds(e),
        vec![
            ActivityKind::Started,
            ActivityKind::LeaseAcquired,
            ActivityKind::Actions,
            ActivityKind::Exec,
            ActivityKind::FileWrite,
            ActivityKind::LeaseReleased,
            ActivityKind::Stopped,
        ],
        "{e:#?}"
    );
    assert!(e.windows(2).all(|w| w[0].seq > w[1].seq), "newest first");
    let lease = Actor::Lease("agent-7".into());
    let actions = only(e, ActivityKind::Actions);
    assert_eq!(actions.actor, lease);
    assert_eq!(
        actions.detail,
        serde_json::json!({"count": 4, "names": {"left_click": 2, "type": 1, "key": 1}, "ok": true})
    );
    assert_eq!(actions.summary, "4 actions: key, left_click ×2, type");
    let exec = only(e, ActivityKind::Exec);
    assert_eq!(exec.actor, lease);
    assert_eq!(exec.detail["argv"], serde_json::json!(["ls", "-l"]));
    assert!(exec.detail["exit_code"].is_null());
    let file = only(e, ActivityKind::FileWrite);
    assert_eq!(
        (file.actor.clone(), file.detail["bytes"].clone()),
        (lease.clone(), 5.into())
    );
    assert_eq!(file.detail["path"], "notes/a.txt");
    let acquired = only(e, ActivityKind::LeaseAcquired);
    assert_eq!(acquired.detail["generation"], grant.generation);
    let stopped = only(e, ActivityKind::Stopped);
    assert_eq!(
        (stopped.actor.clone(), stopped.detail["reason"].clone()),
        (Actor::Api, "manual".into())
    );
    assert_eq!(only(e, ActivityKind::Started).actor, Actor::Api);
    let whole = serde_json::to_string(&page).unwrap();
    assert!(
        !whole.contains(secret) && !whole.contains("secretkey"),
        "{whole}"
    );

    // Every entry was pushed, in order, as it was recorded.
    let mut pushed = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pushed.len() < e.len() {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("activity is pushed")
            .unwrap()
            .unwrap();
        if let BrokerEvent::Activity { id: of, entry } = event {
            assert_eq!(of, id);
            pushed.push(*entry);
        }
    }
    pushed.reverse();
    assert_eq!(&pushed, e);
    assert_eq!(api.activity(id, 2).await.unwrap().entries, e[..2].to_vec());

    // Bad limits and unknown computers are refused as every route's.
    for bad in ["0", "501", "x"] {
        let raw = raw_status(addr, &format!("/v1/computers/{id}/activity?limit={bad}")).await;
        assert_eq!(raw, 400, "limit={bad}");
    }
    let err = api.activity(Uuid::new_v4(), 10).await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::NOT_FOUND));
}

/// The status of a raw `GET` (a query the typed client would not send).
async fn raw_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    let head = String::from_utf8_lossy(&answer);
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn the_record_outlives_a_restart_and_goes_with_the_desktop() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    let before = rig.handle.activity(id, 500).unwrap();
    assert_eq!(
        kinds(&before),
        vec![ActivityKind::Started, ActivityKind::Stopped]
    );
    rig.handle.activity_log().flush().await;
    let rig = rig.restart(Duration::from_secs(3600)).await;
    assert_eq!(rig.handle.activity(id, 500).unwrap(), before, "read back");
    rig.start(id).await;
    let after = rig.handle.activity(id, 500).unwrap();
    assert_eq!(after.len(), 3);
    assert!(after[0].seq > before[0].seq, "numbers go on");
    let paths = rig.paths();
    rig.handle.activity_log().flush().await;
    assert!(paths.activity(id).exists());
    rig.handle.stop(id, None).await.unwrap();
    rig.handle.remove(id, false, None).await.unwrap();
    rig.handle.activity_log().flush().await;
    assert!(!paths.activity(id).exists(), "removed with the desktop");
    assert!(paths.workspace(id).exists(), "the kept workspace stays");
    assert!(rig.handle.activity(id, 10).is_err());
}

/// Every file under `dir`, with its bytes.
fn files_under(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                todo.push(path);
            } else if kind.is_file() {
                out.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
            }
        }
    }
    out
}

#[tokio::test]
async fn a_command_line_s_secrets_reach_neither_the_record_the_stream_nor_the_panel() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let (api, _) = serve(&rig).await;
    let mut events = api.events().await.unwrap();
    let id = rig.create().await.id;
    let s = "Sekr1t-0123456789";
    // Every form, as an exec's argv and as the MCP `shell` tool's `sh -c`.
    let argvs: Vec<Vec<String>> = [
        vec![
            "curl",
            "-H",
            &format!("Authorization: Bearer {s}"),
            "https://h/",
        ],
        vec!["curl", "--header", &format!("Cookie: sid={s}")],
        vec!["curl", &format!("-HAuthorization: {s}")],
        vec!["curl", &format!("--header=Authorization: {s}")],
        vec!["tool", "--password", s],
        vec!["tool", &format!("--password={s}")],
        vec!["tool", "--api-key", s],
        vec!["tool", &format!("--token={s}")],
        vec!["env", &format!("GITHUB_TOKEN={s}"), "make"],
        vec!["env", &format!("DB_PASSWORD={s}"), "make"],
        vec![
            "git",
            "clone",
            &format!("https://bot:{s}@example.com/r.git"),
        ],
    ]
    .into_iter()
    .map(|a| a.into_iter().map(String::from).collect())
    .collect();
    let scripts = [
        format!("curl -fsS -H 'Authorization: Bearer {s}' https://h/"),
        format!("curl \"-HCookie: a={s}\" https://h/"),
        format!("deploy --secret {s} && echo ok"),
        format!("AWS_SECRET_ACCESS_KEY={s} aws s3 ls"),
        format!("git push https://bot:{s}@example.com/r.git"),
    ];
    let mut requests: Vec<dormouse_protocol::exec::ExecRequest> = Vec::new();
    for argv in argvs {
        requests.push(serde_json::from_value(serde_json::json!({ "argv": argv })).unwrap());
    }
    for command in &scripts {
        requests.push(serde_json::from_value(serde_json::json!({ "command": command })).unwrap());
    }
    for request in &requests {
        // The scripted guest refuses commands: recorded on that outcome.
        assert!(api.exec(id, request, false).await.is_err());
    }

    // What the panel's activity tab reads (GET …/activity).
    let page = api.activity(id, 500).await.unwrap();
    let execs: Vec<_> = page
        .entries
        .iter()
        .filter(|e| e.kind == ActivityKind::Exec)
        .collect();
    assert_eq!(execs.len(), requests.len(), "{:#?}", page.entries);
    let whole = serde_json::to_string(&page).unwrap();
    assert!(!whole.contains(s), "{whole}");
    assert!(
        execs.iter().all(|e| e.summary.contains("[redacted]")),
        "{whole}"
    );
    let script = execs.iter().find(|e| e.detail["program"] == "sh").unwrap();
    assert_eq!(script.detail["argv"][1], "-c");

    // What /v1/events pushed.
    let mut pushed = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pushed < requests.len() {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("activity is pushed")
            .unwrap()
            .unwrap();
        let text = serde_json::to_string(&event).unwrap();
        assert!(!text.contains(s), "{text}");
        if matches!(&event, BrokerEvent::Activity { entry, .. } if entry.kind == ActivityKind::Exec)
        {
            pushed += 1;
        }
    }

    // What is on disk, anywhere under the data directory.
    rig.handle.activity_log().flush().await;
    let files = files_under(rig.dir.path());
    assert!(
        files.iter().any(|(p, _)| p.ends_with("activity.jsonl")),
        "{files:?}"
    );
    for (path, bytes) in files {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(s),
            "{} holds the secret",
            path.display()
        );
    }
}
