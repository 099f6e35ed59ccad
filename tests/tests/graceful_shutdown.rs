//! End-to-end: a broker stopped with SIGTERM while a desktop is ready (and
//! its egress pool runs) lets its core finish: it exits 0 without waiting
//! out the core's grace, and the desktop keeps running.
//!
//! Found by `scripts/soak`: every graceful broker restart logged "the broker
//! core did not finish within 5s; leaving it" and aborted the core. The
//! egress supervisor was aborted before it could fence its pools, and each
//! pool held a broker handle, so the owner never saw its last handle go.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::ready_desktop;
use dormouse_e2e::engine;
use dormouse_e2e::guest::Guest;
use nix::sys::signal::Signal;

/// The daemon's own grace for its core (`CORE_GRACE`).
const CORE_GRACE: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_ready_desktop_lets_the_core_finish() -> Result<()> {
    let Some(image) = dormouse_e2e::test_image("sigterm_with_a_ready_desktop_lets_the_core_finish")
    else {
        return Ok(());
    };
    let (mut broker, _api, id) = ready_desktop(&image, "graceful").await?;
    // The egress pool starts once the desktop is ready; wait for it, so
    // the stop meets a running pool.
    let started = Instant::now();
    while !broker.log_tail(1 << 20).contains("egress pool started") {
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "no egress pool started; log:\n{}",
            broker.log_tail(3000)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let asked = Instant::now();
    let status = broker.kill(Signal::SIGTERM).await?;
    let took = asked.elapsed();
    let log = broker.log_tail(4000);
    ensure!(status.success(), "exit {status}; log:\n{log}");
    ensure!(
        !log.contains("did not finish"),
        "the core was left unfinished after {took:?}; log:\n{log}"
    );
    ensure!(
        took < CORE_GRACE,
        "the stop took {took:?}, the core's whole grace; log:\n{log}"
    );
    // Desktops keep running across a broker stop (the engine's word).
    let facts = engine::inspect(Guest::for_computer(id).container())
        .await?
        .context("the desktop's container is gone")?;
    ensure!(facts.status == "running", "{facts:?}");
    eprintln!("SIGTERM to exit: {took:?}, the desktop still running");
    Ok(())
}
