//! End-to-end: a sparse file made in a running desktop (`truncate -s
//! 100G`, no disk spent) cannot make its export unbounded. The broker
//! answers `413 payload_too_large` naming the file before it sends a byte.
//! Once the file is gone the export is whole, and it imports into a new
//! desktop.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dormouse_client::Fetched;
use dormouse_e2e::broker::{with_broker, BrokerProcess};
use dormouse_e2e::client::{create_ready, EventStream, StatusCode};
use dormouse_e2e::guest::{Guest, GuestUser};

const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_sparse_file_makes_the_export_413_not_unbounded() -> Result<()> {
    with_broker(
        "a_huge_sparse_file_makes_the_export_413_not_unbounded",
        scenario,
    )
    .await
}

async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "sparse", READY_TIMEOUT).await?;
    let guest = Guest::for_computer(id);
    guest
        .sh_ok(
            GuestUser::Desk,
            "cd /home/desk/workspace && echo kept > kept.txt && truncate -s 100G big.img",
        )
        .await?;
    // The witness: the file is 100 GiB long and costs (next to) no disk.
    let on_host = std::fs::metadata(broker.workspace(id).join("big.img"))?;
    ensure!(on_host.len() == 100 << 30, "{on_host:?}");
    ensure!(
        std::os::unix::fs::MetadataExt::blocks(&on_host) * 512 < 1 << 20,
        "not sparse"
    );

    let started = Instant::now();
    let mut sink = Vec::new();
    let refused = api.export(id, true, &mut sink).await;
    let took = started.elapsed();
    let err = refused
        .err()
        .context("an export of 100 GiB was not refused")?;
    ensure!(
        err.status() == Some(StatusCode::PAYLOAD_TOO_LARGE),
        "{err:#}"
    );
    let message = format!("{err:#}");
    ensure!(
        message.contains("big.img") && message.contains("sparse"),
        "the refusal names the file and says why: {message}"
    );
    ensure!(
        sink.is_empty(),
        "{} bytes sent before the refusal",
        sink.len()
    );
    eprintln!("refused in {took:?}: {message}");
    ensure!(took < Duration::from_secs(30), "the refusal took {took:?}");

    api.delete_file(id, "big.img", false).await?;
    let mut archive = Vec::new();
    let bytes = api.export(id, true, &mut archive).await?;
    ensure!(bytes > 0 && u64::try_from(archive.len())? == bytes);
    let copy = api
        .create_from_tar(Some("sparse-copy"), None, archive.clone())
        .await?;
    let fetched = api.fetch(copy.id, "kept.txt").await?;
    ensure!(
        fetched == Fetched::File(b"kept\n".to_vec()),
        "the export after the refusal is whole: {fetched:?}"
    );
    api.remove(copy.id, true).await?;
    api.remove(id, true).await?;
    Ok(())
}
