//! End-to-end: deletes racing other work on the same desktop, against a
//! real `dormoused`, the real engine and the real desktop image.
//!
//! - A recursive `DELETE …/files/t` while the guest swaps a directory in
//!   that tree for a link (to a host directory the guest cannot see) and
//!   back answers success or `409` with the reason, never `500`, and the
//!   link's target on the host is never touched.
//! - A `DELETE` of the computer while a stop, a start or an import of it is
//!   in flight answers `409 wrong_state` naming that operation and changes
//!   nothing; the engine (`docker inspect`) is the witness that the
//!   container is still there in the state the other operation left.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_client::Upload;
use dormouse_e2e::archive::{tar, tar_entry};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{
    create_ready, ApiClient, ClientError, EventStream, StatusCode, Waits as _,
};
use dormouse_e2e::engine;
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_e2e::test_image;
use dormouse_protocol::api::ContainerState;
use dormouse_protocol::Phase;
use tokio::io::AsyncWriteExt as _;
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOPPED_TIMEOUT: Duration = Duration::from_secs(60);

/// A refusal's status and its `code: message` text.
fn refused<T: std::fmt::Debug>(result: Result<T, ClientError>) -> Result<(StatusCode, String)> {
    match result {
        Ok(v) => anyhow::bail!("expected a refusal, got {v:?}"),
        Err(e) => Ok((
            e.status()
                .with_context(|| format!("no HTTP status: {e:#}"))?,
            format!("{}: {e:#}", e.code().unwrap_or("")),
        )),
    }
}

/// The engine's state of the computer's container (`None`: there is none).
async fn engine_state(id: Uuid) -> Result<Option<String>> {
    Ok(engine::inspect(&format!("dormouse-{id}"))
        .await?
        .map(|c| c.status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_racing_other_work_answer_409_and_change_nothing() -> Result<()> {
    let Some(image) = test_image("deletes_racing_other_work_answer_409_and_change_nothing") else {
        return Ok(());
    };
    let broker = BrokerProcess::start(BrokerOptions::new(&image)).await?;
    let result = scenario(&broker).await;
    broker.log_on_failure(result)
}

async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "races", READY_TIMEOUT).await?;
    file_delete_race(&api, id).await?;
    remove_races(&api, &mut events, id).await
}

/// The guest swaps `t/d` for a link to a host directory and back while the
/// host deletes `t` recursively, 200 times.
async fn file_delete_race(api: &ApiClient, id: Uuid) -> Result<()> {
    let host_dir = tempfile::tempdir()?;
    std::fs::write(host_dir.path().join("precious"), b"host")?;
    let target = host_dir.path().display().to_string();
    let guest = Guest::for_computer(id);
    let flipper = format!(
        "cd /home/desk/workspace && while [ ! -e stop-flipping ]; do \
         mkdir -p t/d/e; echo f > t/d/e/f; mv t/d t/d.real 2>/dev/null; \
         ln -s {target} t/d 2>/dev/null; rm -f t/d; mv t/d.real t/d 2>/dev/null; done"
    );
    guest.sh_detached(GuestUser::Desk, &flipper).await?;
    let (mut done, mut conflict, mut gone) = (0, 0, 0);
    let mut wrong = Vec::new();
    for _ in 0..200 {
        let _ = api
            .write_file(id, "t/x", Upload::bytes(b"x".to_vec()), true)
            .await;
        match api.delete_file(id, "t", true).await {
            Ok(_) => done += 1,
            Err(e) => match (e.status(), e.code()) {
                (Some(StatusCode::CONFLICT), Some("wrong_state")) => conflict += 1,
                (Some(StatusCode::NOT_FOUND), _) => gone += 1,
                (Some(s), _) if s.is_client_error() => {}
                _ => wrong.push(format!("{e:#}")),
            },
        }
    }
    api.write_file(id, "stop-flipping", Upload::bytes(Vec::new()), false)
        .await?;
    eprintln!("recursive deletes under a link swap: {done} removed, {conflict} 409, {gone} 404");
    ensure!(
        wrong.is_empty(),
        "{} of 200 answered a server error, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
    ensure!(done > 0, "no delete succeeded ({conflict} 409, {gone} 404)");
    ensure!(
        std::fs::read(host_dir.path().join("precious"))? == b"host",
        "the link's target on the host was touched"
    );
    // The flipper has stopped: the tree goes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    match api.delete_file(id, "t", true).await {
        Ok(_) => {}
        Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => {}
        Err(e) => return Err(e).context("the tree once the guest stopped"),
    }
    api.delete_file(id, "stop-flipping", false).await?;
    Ok(())
}

/// `DELETE` of the computer during its stop, its start and its import.
async fn remove_races(api: &ApiClient, events: &mut EventStream, id: Uuid) -> Result<()> {
    // Malformed: 400, nothing changes.
    let (status, text) = refused(
        api.call_bytes(
            dormouse_client::Method::DELETE,
            &format!("/v1/computers/{id}?purge=maybe"),
            None::<&()>,
        )
        .await,
    )?;
    ensure!(status == StatusCode::BAD_REQUEST, "{status} {text}");
    ensure!(engine_state(id).await?.as_deref() == Some("running"));

    // During the stop: seen as phase `stopping`, then the DELETE.
    let stopper = {
        let api = api.clone();
        tokio::spawn(async move { api.stop(id).await })
    };
    let deadline = tokio::time::Instant::now() + STOPPED_TIMEOUT;
    loop {
        let s = api.get(id).await?;
        if s.phase == Some(Phase::Stopping) {
            break;
        }
        ensure!(
            s.container == ContainerState::Running && tokio::time::Instant::now() < deadline,
            "never saw the stop in flight: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, text) = refused(api.remove(id, true).await)?;
    ensure!(
        status == StatusCode::CONFLICT && text.contains("wrong_state") && text.contains("stop"),
        "a remove during the stop: {status} {text}"
    );
    stopper.await??;
    api.wait_stopped(events, id, STOPPED_TIMEOUT).await?;
    ensure!(
        engine_state(id).await?.as_deref() == Some("exited"),
        "the stop, not the remove, decided the container's state"
    );

    // During the start: both sent at once. Whichever the owner takes first
    // runs and the other is refused with 409 naming it; a start that ended
    // before the DELETE arrived lets the remove run after it. Either way
    // the engine agrees with the answers.
    let starter = {
        let api = api.clone();
        tokio::spawn(async move { api.start(id).await })
    };
    let removal = api.remove(id, false).await;
    let started = starter.await?;
    for outcome in [started.as_ref().err(), removal.as_ref().err()]
        .into_iter()
        .flatten()
    {
        ensure!(
            outcome.status() == Some(StatusCode::CONFLICT) && outcome.code() == Some("wrong_state"),
            "a start racing a remove: {outcome:#}"
        );
    }
    if removal.is_ok() {
        ensure!(
            engine_state(id).await?.is_none(),
            "the remove answered 204 but the container is still there"
        );
        eprintln!(
            "the remove ran (the start {}); the import race needs a new desktop",
            match &started {
                Ok(_) => "ended before it".to_owned(),
                Err(e) => format!("was refused: {e:#}"),
            }
        );
        let id = create_ready(api, events, "races-2", READY_TIMEOUT).await?;
        api.stop(id).await?;
        api.wait_stopped(events, id, STOPPED_TIMEOUT).await?;
        return import_race(api, id).await;
    }
    ensure!(started.is_ok(), "neither the start nor the remove ran");
    if let Err(e) = &removal {
        eprintln!("the start ran, the remove during it was refused: {e:#}");
    }
    api.wait_ready(events, id, READY_TIMEOUT).await?;
    ensure!(engine_state(id).await?.as_deref() == Some("running"));
    api.stop(id).await?;
    api.wait_stopped(events, id, STOPPED_TIMEOUT).await?;
    import_race(api, id).await
}

/// `DELETE` while an import of the stopped desktop waits on its upload.
async fn import_race(api: &ApiClient, id: Uuid) -> Result<()> {
    let archive = tar(&[tar_entry("imported.txt", b'0', b"whole", "")]);
    let (mut writer, reader) = tokio::io::duplex(64 * 1024);
    let importer = {
        let api = api.clone();
        tokio::spawn(async move { api.import(id, Upload::reader(reader)).await })
    };
    writer.write_all(&archive[..512]).await?;
    // The import is the computer's operation once a write is refused for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match api
            .write_file(id, "probe", Upload::bytes(b"p".to_vec()), false)
            .await
        {
            Err(e)
                if e.status() == Some(StatusCode::CONFLICT)
                    && format!("{e:#}").contains("import") =>
            {
                break
            }
            _ => {}
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the import never began"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, text) = refused(api.remove(id, true).await)?;
    ensure!(
        status == StatusCode::CONFLICT && text.contains("wrong_state") && text.contains("import"),
        "a remove during the import: {status} {text}"
    );
    writer.write_all(&archive[512..]).await?;
    writer.shutdown().await?;
    drop(writer);
    let imported = importer.await??;
    ensure!(imported.files == 1, "{imported:?}");
    let fetched = api.fetch(id, "imported.txt").await?;
    ensure!(
        fetched == dormouse_client::Fetched::File(b"whole".to_vec()),
        "the import finished whole after the refused remove: {fetched:?}"
    );
    ensure!(engine_state(id).await?.as_deref() == Some("exited"));
    // Nothing in flight: the remove runs, and the engine agrees.
    api.remove(id, true).await?;
    ensure!(
        engine_state(id).await?.is_none(),
        "removed, the container is gone"
    );
    Ok(())
}
