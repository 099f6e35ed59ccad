use std::collections::BTreeMap;

use dormouse_protocol::activity::ActivityKind;

use super::*;

fn events() -> broadcast::Sender<BrokerEvent> {
    broadcast::channel(1024).0
}

fn paths_with(id: Uuid) -> (tempfile::TempDir, Paths) {
    let dir = tempfile::tempdir().expect("dir");
    let paths = Paths::new(dir.path());
    std::fs::create_dir_all(paths.computer_dir(id)).expect("computer dir");
    (dir, paths)
}

fn wrote(i: u64) -> Happened {
    Happened::FileWrite {
        path: format!("f{i}.txt"),
        bytes: i,
    }
}

fn lines(paths: &Paths, id: Uuid) -> usize {
    std::fs::read_to_string(paths.activity(id))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[tokio::test]
async fn the_ring_and_the_file_stay_bounded_and_survive_a_restart() {
    let id = Uuid::new_v4();
    let (_dir, paths) = paths_with(id);
    {
        let log = ActivityLog::open_with_ring(&paths, [id], events(), 10);
        for i in 1..=35 {
            let e = log.record(id, Actor::Api, &wrote(i)).expect("recorded");
            assert_eq!(e.seq, i);
        }
        assert_eq!(log.recent(id, 500).expect("known").len(), 10, "ring bound");
        log.flush().await;
        let n = lines(&paths, id);
        assert!((10..20).contains(&n), "compacted to the ring: {n} lines");
    }
    let log = ActivityLog::open_with_ring(&paths, [id], events(), 10);
    let back = log.recent(id, 500).expect("known");
    assert_eq!(back.len(), 10);
    assert_eq!(back[0].seq, 35, "newest first");
    assert_eq!(back[9].seq, 26);
    assert_eq!(back[0].detail["path"], "f35.txt");
    assert_eq!(log.recent(id, 3).expect("known").len(), 3);
    let next = log
        .record(id, Actor::Broker, &Happened::Started)
        .expect("recorded");
    assert!(next.seq > 35, "numbers go on after a restart: {}", next.seq);
}

#[tokio::test]
async fn numbers_never_repeat_even_when_the_lines_were_lost() {
    let id = Uuid::new_v4();
    let (_dir, paths) = paths_with(id);
    let first = {
        let log = ActivityLog::open(&paths, [id], events());
        log.record(id, Actor::Api, &wrote(1));
        let e = log.record(id, Actor::Api, &wrote(2)).expect("recorded");
        log.flush().await;
        e.seq
    };
    // A crash that lost every line (the reservation stays).
    std::fs::remove_file(paths.activity(id)).expect("lose the lines");
    let log = ActivityLog::open(&paths, [id], events());
    assert!(log.recent(id, 10).expect("known").is_empty());
    let e = log.record(id, Actor::Api, &wrote(3)).expect("recorded");
    assert!(e.seq > first, "{} after {first}", e.seq);
    let again = {
        log.flush().await;
        drop(log);
        let log = ActivityLog::open(&paths, [id], events());
        log.record(id, Actor::Api, &wrote(4)).expect("recorded").seq
    };
    assert!(again > e.seq);
}

#[tokio::test]
async fn a_torn_last_line_is_skipped_and_the_next_line_is_whole() {
    let id = Uuid::new_v4();
    let (_dir, paths) = paths_with(id);
    {
        let log = ActivityLog::open(&paths, [id], events());
        log.record(id, Actor::Api, &wrote(1));
        log.flush().await;
    }
    let mut f = OpenOptions::new()
        .append(true)
        .open(paths.activity(id))
        .expect("append");
    f.write_all(b"{\"seq\":2,\"at\":\"20").expect("torn");
    drop(f);
    {
        let log = ActivityLog::open(&paths, [id], events());
        assert_eq!(log.recent(id, 10).expect("known").len(), 1);
        log.record(id, Actor::Api, &wrote(5));
        log.flush().await;
    }
    let log = ActivityLog::open(&paths, [id], events());
    let back = log.recent(id, 10).expect("known");
    assert_eq!(back.len(), 2, "the line after the torn one reads back");
    assert_eq!(back[0].detail["path"], "f5.txt");
}

#[tokio::test]
async fn entries_are_pushed_in_order_and_a_removed_record_is_gone() {
    let id = Uuid::new_v4();
    let (_dir, paths) = paths_with(id);
    let events = events();
    let mut rx = events.subscribe();
    let log = ActivityLog::open(&paths, [id], events);
    let mut names = BTreeMap::new();
    names.insert("type".to_owned(), 1);
    log.record(
        id,
        Actor::Lease("me".into()),
        &Happened::Actions { names, ok: true },
    );
    log.record(id, Actor::Api, &wrote(1));
    for want in [1, 2] {
        match rx.recv().await.expect("event") {
            BrokerEvent::Activity { id: got, entry } => {
                assert_eq!(got, id);
                assert_eq!(entry.seq, want);
            }
            other => panic!("not an activity event: {other:?}"),
        }
    }
    let page = log.recent(id, 10).expect("known");
    assert_eq!(page[1].kind, ActivityKind::Actions);
    assert_eq!(page[1].actor, Actor::Lease("me".into()));
    log.flush().await;
    assert!(paths.activity(id).exists());
    log.remove(id);
    log.flush().await;
    assert!(!paths.activity(id).exists(), "removed with the desktop");
    assert!(!paths.activity_seq(id).exists());
    assert!(log.recent(id, 10).is_none());
    assert!(log.record(id, Actor::Api, &wrote(2)).is_none());
    let other = Uuid::new_v4();
    assert!(log.recent(other, 10).is_none(), "unknown computer");
}

#[test]
fn the_actor_is_the_holder_of_the_generation_carried() {
    let lease = Lease {
        holder: "agent".into(),
        expires_at: Utc::now(),
        generation: 4,
    };
    assert_eq!(
        actor_of(Some(&lease), Some(4)),
        Actor::Lease("agent".into())
    );
    assert_eq!(actor_of(Some(&lease), None), Actor::Api);
    assert_eq!(actor_of(Some(&lease), Some(3)), Actor::Api);
    assert_eq!(actor_of(None, Some(4)), Actor::Api);
}

fn exec_with_secret() -> Happened {
    Happened::Exec {
        argv: dormouse_protocol::activity::argv::Argv::given(
            [
                "curl",
                "-H",
                "Authorization: Bearer tok-0123456789",
                "https://bot:pw-0123456789@example.com/",
            ]
            .map(String::from)
            .to_vec(),
        ),
        exit_code: Some(0),
        timed_out: false,
        stdout_bytes: 42,
        stderr_bytes: 0,
    }
}

#[tokio::test]
async fn a_command_line_is_kept_as_the_mode_says_in_memory_on_disk_and_on_the_stream() {
    let id = Uuid::new_v4();
    let (_dir, paths) = paths_with(id);
    let secrets = ["tok-0123456789", "pw-0123456789"];
    {
        let log = ActivityLog::open_with(&paths, [id], events(), 10, ArgvRecord::Full);
        log.record(id, Actor::Api, &exec_with_secret());
        log.flush().await;
    }
    let on_disk = std::fs::read_to_string(paths.activity(id)).expect("record");
    assert!(on_disk.contains(secrets[0]), "full keeps the argv as typed");

    // Opened again under `redacted`: what was kept in full is redacted,
    // in memory and in the file.
    let tx = events();
    let mut stream = tx.subscribe();
    let log = ActivityLog::open_with(&paths, [id], tx, 10, ArgvRecord::Redacted);
    let back = log.recent(id, 10).expect("known");
    let text = serde_json::to_string(&back).expect("json");
    let on_disk = std::fs::read_to_string(paths.activity(id)).expect("record");
    for secret in secrets {
        assert!(!text.contains(secret), "{text}");
        assert!(!on_disk.contains(secret), "{on_disk}");
    }
    assert_eq!(back[0].detail["stdout_bytes"], 42);

    let entry = log
        .record(id, Actor::Api, &exec_with_secret())
        .expect("recorded");
    let event = serde_json::to_string(&stream.recv().await.expect("event")).expect("json");
    log.flush().await;
    let on_disk = std::fs::read_to_string(paths.activity(id)).expect("record");
    for secret in secrets {
        assert!(!event.contains(secret), "{event}");
        assert!(!on_disk.contains(secret), "{on_disk}");
        assert!(!entry.summary.contains(secret));
    }
    assert_eq!(entry.detail["program"], "curl");
    assert_eq!(entry.detail["argv"][2], "Authorization: [redacted]");
    assert_eq!(entry.detail["exit_code"], 0);

    let log = ActivityLog::open_with(&paths, [id], events(), 10, ArgvRecord::None);
    let newest = &log.recent(id, 1).expect("known")[0];
    assert_eq!(newest.detail["argv"], serde_json::Value::Null);
    assert_eq!(newest.summary, "exec curl: exit 0");
}
