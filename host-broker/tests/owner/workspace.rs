//! Workspace requests over the fake engine: an import is the computer's
//! operation (refused while the desktop runs; while it runs, starts,
//! removes, writes and exports are refused), the owner hands out the
//! workspace only for computers it knows, and an export of a running
//! desktop holds its quiesce for as long as its grant lives.

use super::*;
use dormouse_core::owner::workspace::WorkspaceAccess;
use dormouse_core::workspace::ChannelReader;

fn one_file_tar(name: &str, data: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(u64::try_from(data.len()).unwrap());
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    builder.append_data(&mut header, name, data).unwrap();
    builder.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_is_the_computers_operation() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;

    // Running: its mount holds the old directory.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    drop(tx);
    let err = rig
        .handle
        .import(id, None, ChannelReader::new(rx))
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::WrongState(_)), "{err:?}");

    rig.handle.stop(id, None).await.unwrap();
    let ws = rig.paths().workspace(id);
    std::fs::write(ws.join("old.txt"), "old").unwrap();

    // The upload is held open: the import waits on it.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let handle = rig.handle.clone();
    let import = tokio::spawn(async move { handle.import(id, None, ChannelReader::new(rx)).await });
    let mut in_flight = false;
    for _ in 0..400 {
        match rig.handle.workspace(id, WorkspaceAccess::Write(None)).await {
            Err(BrokerError::WrongState(m)) if m.contains("import") => {
                in_flight = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    assert!(
        in_flight,
        "the import never became the computer's operation"
    );
    for refused in [
        rig.handle.start(id, None).await.map(drop),
        rig.handle.remove(id, false, None).await,
        rig.handle
            .workspace(id, WorkspaceAccess::Export { quiesce: true })
            .await
            .map(drop),
    ] {
        assert!(
            matches!(refused, Err(BrokerError::WrongState(_))),
            "{refused:?}"
        );
    }
    // Reading goes on.
    rig.handle
        .workspace(id, WorkspaceAccess::Read)
        .await
        .unwrap();

    tx.send(Ok(one_file_tar("new.txt", b"new"))).await.unwrap();
    drop(tx);
    let summary = import.await.unwrap().unwrap();
    assert_eq!((summary.files, summary.bytes), (1, 3));
    assert_eq!(std::fs::read(ws.join("new.txt")).unwrap(), b"new");
    assert!(!ws.join("old.txt").exists(), "the old tree was replaced");
    assert_eq!(
        mutations_of(&rig.fake, "start"),
        1,
        "the import never started it"
    );

    // Done: the desktop starts again.
    rig.start(id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_archive_leaves_the_old_workspace_and_no_operation() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    let ws = rig.paths().workspace(id);
    std::fs::write(ws.join("old.txt"), "old").unwrap();
    let mut archive = one_file_tar("fine.txt", b"ok");
    archive.truncate(archive.len() - 1024); // no end-of-archive marker
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(Ok(archive)).await.unwrap();
    drop(tx);
    let err = rig
        .handle
        .import(id, None, ChannelReader::new(rx))
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Workspace(_)), "{err:?}");
    assert_eq!(std::fs::read(ws.join("old.txt")).unwrap(), b"old");
    assert!(!ws.join("fine.txt").exists());
    rig.start(id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_computers_get_no_workspace() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let nobody = Uuid::new_v4();
    for access in [
        WorkspaceAccess::Read,
        WorkspaceAccess::Write(None),
        WorkspaceAccess::Export { quiesce: false },
    ] {
        let err = rig.handle.workspace(nobody, access).await.unwrap_err();
        assert!(matches!(err, BrokerError::NotFound(_)), "{err:?}");
    }
    assert!(matches!(
        rig.handle.disk(nobody).await,
        Err(BrokerError::NotFound(_))
    ));
}

/// Waits (bounded) until the scripted guest has `n` quiesce holds open.
async fn holds_become(rig: &Rig, n: usize) -> bool {
    for _ in 0..400 {
        if rig.script.holds.load(Ordering::SeqCst) == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_holds_the_quiesce_until_its_grant_is_dropped() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let export = WorkspaceAccess::Export { quiesce: true };
    let first = rig.handle.workspace(id, export).await.unwrap();
    assert!(first.quiesced && first.hold.is_some(), "{first:?}");
    let second = rig.handle.workspace(id, export).await.unwrap();
    assert!(holds_become(&rig, 2).await, "two exports, two holds");
    drop(first);
    assert!(holds_become(&rig, 1).await, "the first export's hold ended");
    drop(second);
    assert!(holds_become(&rig, 0).await, "no hold is left");
    // Without a quiesce, nothing is held.
    let plain = rig
        .handle
        .workspace(id, WorkspaceAccess::Export { quiesce: false })
        .await
        .unwrap();
    assert!(!plain.quiesced && plain.hold.is_none(), "{plain:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_without_holds_gets_the_plain_quiesce() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.script.no_hold.store(true, Ordering::SeqCst);
    let grant = rig
        .handle
        .workspace(id, WorkspaceAccess::Export { quiesce: true })
        .await
        .unwrap();
    assert!(grant.quiesced, "the plain quiesce closed the browsers");
    assert!(grant.hold.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_does_not_answer_the_hold_leaves_the_export_unquiesced() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.script.silent_hold.store(true, Ordering::SeqCst);
    let grant = tokio::time::timeout(
        Duration::from_secs(30),
        rig.handle
            .workspace(id, WorkspaceAccess::Export { quiesce: true }),
    )
    .await
    .expect("the grant comes within the quiesce's bound")
    .unwrap();
    assert!(!grant.quiesced && grant.hold.is_none(), "{grant:?}");
}
