//! The owner under hostile guests and clients: status floods, guests that
//! report busy forever, deletes of desktops full of files, and crashes in
//! the middle of adopting a workspace.

use std::sync::atomic::Ordering;
use std::time::Duration;

use dormouse_protocol::api::{BrokerEvent, ContainerState, CreateComputer, StopReason};
use tokio::time::advance;

use super::{mutations_of, settle, Rig};
use dormouse_core::store::ComputerStore;

#[tokio::test(start_paused = true)]
async fn a_status_flood_is_coalesced_into_a_bounded_number_of_broadcasts() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let flood = 2000;
    rig.script.flood.store(flood, Ordering::SeqCst);
    let mut events = rig.handle.subscribe();
    let id = rig.create().await.id;
    // Let the whole flood arrive, one simulated second.
    for _ in 0..100 {
        settle().await;
        advance(Duration::from_millis(10)).await;
    }
    let latest = format!("flood {}", flood - 1);
    let status = rig
        .until(id, "the latest status", |s| {
            s.problem.as_deref() == Some(&*latest)
        })
        .await;
    assert!(status.ready);
    let mut broadcasts = 0;
    let mut last = None;
    while let Ok(event) = events.try_recv() {
        if let BrokerEvent::Status { computer } = event {
            broadcasts += 1;
            last = computer.problem.clone();
        }
    }
    println!("{flood} guest statuses in ~1 s gave {broadcasts} broadcasts");
    assert!(
        broadcasts <= 20,
        "{flood} statuses must not become {broadcasts} queued broadcasts"
    );
    assert!(events.len() <= dormouse_core::owner::EVENT_QUEUE);
    // Coalesced, not lost: the latest status is what was told last.
    advance(Duration::from_secs(1)).await;
    settle().await;
    while let Ok(event) = events.try_recv() {
        if let BrokerEvent::Status { computer } = event {
            last = computer.problem.clone();
        }
    }
    assert_eq!(last.as_deref(), Some(&*latest));
}

#[tokio::test(start_paused = true)]
async fn the_running_limit_stops_a_desktop_whose_guest_says_busy_forever() {
    let rig = Rig::with_config(Duration::from_secs(2), 4, |c| {
        c.max_run = Some(Duration::from_secs(30));
    })
    .await;
    rig.script.set_busy(true);
    let id = rig.create().await.id;
    // Busy for far longer than the idle window: the idle timer never stops it.
    advance(Duration::from_secs(20)).await;
    settle().await;
    let running = rig.handle.get(id).await.unwrap();
    assert_eq!(running.container, ContainerState::Running);
    // Touching it does not extend the limit either.
    rig.handle.touch(id, None).await.unwrap();
    advance(Duration::from_secs(11)).await;
    let stopped = rig
        .until(id, "stopped by the running limit", |s| {
            s.container == ContainerState::Stopped
        })
        .await;
    assert_eq!(stopped.stop_reason, Some(StopReason::Idle));
}

#[tokio::test(start_paused = true)]
async fn without_a_running_limit_a_busy_desktop_keeps_running() {
    let rig = Rig::new(Duration::from_secs(2)).await;
    rig.script.set_busy(true);
    let id = rig.create().await.id;
    advance(Duration::from_secs(120)).await;
    settle().await;
    assert_eq!(
        rig.handle.get(id).await.unwrap().container,
        ContainerState::Running
    );
}

#[tokio::test(start_paused = true)]
async fn bad_running_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = super::config(dir.path(), Duration::from_secs(60), 2);
    c.max_run = Some(Duration::from_millis(10));
    let fake = std::sync::Arc::new(dormouse_docker::fake::FakeEngine::new());
    let metrics = std::sync::Arc::new(dormouse_core::metrics::Metrics::default());
    assert!(super::spawn(c, fake, metrics).await.is_err());
}

/// A crash between persisting the adopting record and moving the workspace:
/// the next start-up finishes the move; a crash after it changes nothing.
#[tokio::test(start_paused = true)]
async fn an_adoption_cut_short_by_a_crash_is_finished_at_start_up() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let old = rig.create().await.id;
    std::fs::write(rig.paths().workspace(old).join("kept"), "x").unwrap();
    rig.handle.remove(old, false, None).await.unwrap();
    let other = rig.create().await.id;
    let store = ComputerStore::new(rig.paths());
    // What the broker had written when it was killed: the new computer's
    // record naming the workspace it adopts, its directories, and no move.
    let mut record = store.load(other).unwrap().unwrap();
    let new = uuid::Uuid::new_v4();
    record.id = new;
    record.workspace = rig.paths().workspace(new);
    record.workspace_from = Some(old);
    dormouse_core::lifecycle::create::prepare_dirs(&rig.paths(), new, None).unwrap();
    store.save(&record).unwrap();
    let rig = rig.crash_and_restart().await;
    assert!(rig.paths().workspace(new).join("kept").exists());
    assert!(!rig.paths().workspace(old).exists());
    let adopted = rig.handle.get(new).await.unwrap();
    assert_eq!(adopted.container, ContainerState::Missing);
    // The old workspace cannot be adopted twice.
    let again = CreateComputer {
        workspace_from: Some(old),
        ..Default::default()
    };
    assert!(rig.handle.create(again).await.is_err());
    // A restart after the move leaves everything where it is.
    let rig = rig.crash_and_restart().await;
    assert!(rig.paths().workspace(new).join("kept").exists());
}

/// A crash before the record was persisted leaves the kept workspace where
/// it was, still adoptable.
#[tokio::test(start_paused = true)]
async fn an_adoption_killed_before_its_record_leaves_the_workspace_adoptable() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let old = rig.create().await.id;
    std::fs::write(rig.paths().workspace(old).join("kept"), "x").unwrap();
    rig.handle.remove(old, false, None).await.unwrap();
    let rig = rig.crash_and_restart().await;
    let adopted = rig
        .handle
        .create(CreateComputer {
            workspace_from: Some(old),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(rig.paths().workspace(adopted.id).join("kept").exists());
    let record = ComputerStore::new(rig.paths())
        .load(adopted.id)
        .unwrap()
        .unwrap();
    assert_eq!(record.workspace_from, Some(old));
}

/// Deleting a desktop whose run directory and workspace a guest filled with
/// files never stalls the owner: another desktop's status stays quick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_desktop_full_of_files_never_stalls_the_owner() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let full = rig.create().await.id;
    let other = rig.create().await.id;
    let files: usize = std::env::var("DORMOUSE_DELETE_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40_000);
    for dir in [rig.paths().run_dir(full), rig.paths().workspace(full)] {
        let dir = dir.join("junk");
        std::fs::create_dir(&dir).unwrap();
        for i in 0..files / 2 {
            std::fs::write(dir.join(i.to_string()), b"").unwrap();
        }
    }
    let handle = rig.handle.clone();
    let begun = std::time::Instant::now();
    let delete = tokio::spawn(async move { handle.remove(full, true, None).await });
    let mut reads = Vec::new();
    while !delete.is_finished() {
        let t = std::time::Instant::now();
        rig.handle.get(other).await.unwrap();
        reads.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = begun.elapsed();
    delete.await.unwrap().unwrap();
    assert!(!rig.paths().computer_dir(full).exists());
    reads.sort();
    let p99 = reads[(reads.len() * 99 / 100).min(reads.len() - 1)];
    let max = reads.last().copied().unwrap_or_default();
    println!(
        "delete of {files} files took {took:?}; {} reads of another desktop: p99 {p99:?}, max {max:?}",
        reads.len()
    );
    assert!(
        max < Duration::from_millis(150),
        "a read waited {max:?} while the delete took {took:?}"
    );
}

/// A guest that plants a symlink at its socket sees the refusal in the
/// status, without the host's paths.
#[tokio::test(start_paused = true)]
async fn guest_channel_problems_in_the_status_carry_no_host_paths() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    let decoy_dir = tempfile::tempdir().unwrap();
    let decoy = decoy_dir.path().join("host.sock");
    let _listener = tokio::net::UnixListener::bind(&decoy).unwrap();
    let socket = rig.paths().socket(id);
    rig.fake.on_start(move |_| {
        let _ = std::fs::remove_file(&socket);
        std::os::unix::fs::symlink(&decoy, &socket).unwrap();
    });
    rig.handle.start(id, None).await.unwrap();
    let s = rig.until(id, "refused", |s| s.problem.is_some()).await;
    let problem = s.problem.unwrap_or_default();
    assert!(problem.contains("symlink"), "{problem}");
    let data = rig.paths().data().display().to_string();
    assert!(!problem.contains(&data), "{problem}");
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_drops_a_hardening_setting_gets_no_desktop() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    // A compatible API that accepts `--network none` and attaches a bridge.
    rig.fake.on_create(|info| {
        info.hardening.network_mode = "bridge".into();
        info.networks = vec!["bridge".into()];
    });
    let refused = rig
        .handle
        .create(CreateComputer::default())
        .await
        .expect_err("a container whose hardening did not take must not start");
    let message = refused.to_string();
    assert!(!message.contains('/'), "no host path: {message}");
    // Nothing was started, and the refused container is gone.
    let mutations = rig.fake.mutations();
    assert!(
        mutations.iter().all(|m| !m.starts_with("start")),
        "{mutations:?}"
    );
    assert!(
        mutations.iter().any(|m| m.starts_with("remove")),
        "{mutations:?}"
    );
}

/// Every computer's status says whether its workspace is limited, as the
/// quota decision for its workspace says (here: a temporary directory, so
/// most likely "not enforced" and why), from its create and again after a
/// broker restart; the change reaches the event stream too.
#[tokio::test(start_paused = true)]
async fn the_status_carries_the_workspace_limit_from_create_and_after_a_restart() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let mut events = rig.handle.subscribe();
    let id = rig.create().await.id;
    let status = rig
        .until(id, "the workspace limit", |s| s.workspace_limit.is_some())
        .await;
    let limit = status.workspace_limit.unwrap();
    let expected = dormouse_core::quota::apply_workspace_limit(
        id,
        &rig.paths().workspace(id),
        dormouse_core::quota::WorkspaceQuota::default(),
    )
    .await;
    println!("workspace limit: {limit:?}");
    assert_eq!(limit, expected);
    if !limit.enforced {
        let reason = limit.reason.as_deref().unwrap();
        assert!(!reason.is_empty());
        let data = rig.paths().data().display().to_string();
        assert!(!reason.contains(&data), "no host path: {reason}");
        assert_eq!((limit.bytes, limit.inodes), (None, None));
    }
    let mut told = false;
    while let Ok(event) = events.try_recv() {
        if let BrokerEvent::Status { computer } = event {
            told |= computer.id == id && computer.workspace_limit.as_ref() == Some(&limit);
        }
    }
    assert!(told, "the limit is broadcast");

    let rig = rig.crash_and_restart().await;
    let again = rig
        .until(id, "the workspace limit after a restart", |s| {
            s.workspace_limit.is_some()
        })
        .await;
    assert_eq!(again.workspace_limit, Some(limit));
}

/// A stop whose records cannot be written (here the stop-record directory
/// is a file; on a host, a full disk) still stops the desktop, answers with
/// the stopped status and says plainly what was not saved; once the
/// directory is back, a start works and the next stop is recorded.
#[tokio::test(start_paused = true)]
async fn a_stop_whose_record_cannot_be_written_still_stops() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let stops = rig.paths().stops();
    std::fs::remove_dir_all(&stops).unwrap();
    std::fs::write(&stops, b"not a directory").unwrap();
    let before = mutations_of(&rig.fake, "stop");
    let stopped = rig.handle.stop(id, None).await.unwrap();
    assert_eq!(stopped.container, ContainerState::Stopped);
    assert_eq!(
        mutations_of(&rig.fake, "stop"),
        before + 1,
        "the engine stopped it"
    );
    assert_eq!(stopped.stop_reason, Some(StopReason::Manual));
    let problem = stopped.problem.unwrap();
    assert!(problem.contains("could not be saved"), "{problem}");
    let data = rig.paths().data().display().to_string();
    assert!(!problem.contains(&data), "no host path: {problem}");
    assert_eq!(std::fs::read(&stops).unwrap(), b"not a directory");

    std::fs::remove_file(&stops).unwrap();
    std::fs::create_dir(&stops).unwrap();
    let started = rig.start(id).await;
    assert_eq!(started.problem, None);
    let stopped = rig.handle.stop(id, None).await.unwrap();
    assert_eq!(stopped.problem, None);
    let record = dormouse_core::store::StopReasonStore::new(&rig.paths())
        .load(&dormouse_core::lifecycle::stop_key(id))
        .unwrap()
        .unwrap();
    assert!(record.confirmed);
}
