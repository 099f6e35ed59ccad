//! End-to-end: a hostile supervisor cannot block the broker through the
//! egress hand-over. Against a real `dormoused`, the real engine and the
//! real desktop image, a guest root's server in front of the real
//! supervisor ([`dormouse_e2e::handover`]) answers the broker's parked
//! egress sessions with an allowed host loopback upstream and hands over
//! `2 × cores + 2` sockets whose duplicates it keeps: it clears their
//! `O_NONBLOCK` again and again, sets an hour's linger, reads what the
//! program sends before the broker can, and never reads the upstream's
//! 1 GiB. Meanwhile `/healthz`, another desktop's status, its actions, its
//! screenshot and its live screen keep answering; the broker drops the
//! hostile connections within the egress idle bound (each audited as
//! `idle`), and its thread and descriptor counts come back. The figures
//! are printed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream};
use dormouse_e2e::handover::{self, threads_and_fds, Hostile};
use dormouse_e2e::rfb::{set_encodings, set_pixel_format_bgrx, update_request, RfbViewer, TokenIn};
use dormouse_e2e::{docker_available, test_image};
use dormouse_protocol::egress_policy::{EgressEnd, EgressMode, EgressPolicy};
use dormouse_protocol::screen::{CreateScreen, ScreenMode};
use dormouse_protocol::SOCKET_FILE_NAME;
use tokio::net::UnixListener;
use tokio::time::Instant;
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The egress idle bound the broker runs with here.
const IDLE: Duration = Duration::from_secs(5);
/// What the upstream would send each connection.
const UPSTREAM_BYTES: u64 = 1 << 30;
/// The bystander's status p99 asserted during the attack.
const P99_BOUND: Duration = Duration::from_millis(50);

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted
        .get((sorted.len() * p / 100).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// One full update of the live screen, within 5 s.
async fn frame(v: &mut RfbViewer, w: u16, h: u16) -> Result<()> {
    v.send(&update_request(false, 0, 0, w, h)).await?;
    tokio::time::timeout(Duration::from_secs(5), v.read_update())
        .await
        .context("no screen update in 5 s")??;
    Ok(())
}

async fn ready(api: &ApiClient, name: &str) -> Result<Uuid> {
    let mut events = EventStream::open(api).await?;
    create_ready(api, &mut events, name, READY_TIMEOUT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_hand_over_never_blocks_the_broker() -> Result<()> {
    let test = "a_hostile_hand_over_never_blocks_the_broker";
    if !docker_available(test) {
        return Ok(());
    }
    let Some(image) = test_image(test) else {
        return Ok(());
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {test}: replacing a socket in a guest's run directory needs root, as the guest's root has");
        return Ok(());
    }
    let (port, upstream) = handover::upstream(UPSTREAM_BYTES).await?;
    let dir = tempfile::tempdir()?;
    let hosts = dir.path().join("egress-hosts");
    std::fs::write(&hosts, "127.0.0.1 up.test\n")?;
    let mut options = BrokerOptions::new(image);
    options.extra_args = vec![
        "--egress-hosts".into(),
        hosts.display().to_string(),
        "--egress-idle-timeout".into(),
        format!("{}s", IDLE.as_secs()),
    ];
    let mut broker = BrokerProcess::start(options).await?;
    let result = attack(&mut broker, port, &upstream).await;
    broker.log_on_failure(result)
}

// Over 100 lines on purpose: one real-engine test told in order (set up,
// act, witness); its steps share the desktops and the witnesses.
async fn attack(
    broker: &mut BrokerProcess,
    port: u16,
    upstream: &Arc<(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    )>,
) -> Result<()> {
    let api = broker.client();
    let target = ready(&api, "handover-hostile").await?;
    let other = ready(&api, "handover-bystander").await?;
    api.set_egress(
        target,
        &EgressPolicy {
            mode: EgressMode::Allowlist,
            allow: vec![format!("127.0.0.1/32:{port}").parse()?],
            deny: Vec::new(),
        },
    )
    .await?;
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let n = 2 * cores + 2;

    // Guest root's move: the real socket put aside, a server of its own in
    // front of it. A broker restart makes every follower connect again.
    let run = broker
        .data_dir()
        .join("computers")
        .join(target.to_string())
        .join("run");
    let socket = run.join(SOCKET_FILE_NAME);
    // Shorter than the name the fake binds, so within a socket path's room.
    let real = run.join("real.sock");
    std::fs::rename(&socket, &real)?;
    let listener = UnixListener::bind(&socket)?;
    let hostile = Arc::new(Hostile::default());
    let fake = tokio::spawn(handover::serve(
        listener,
        real,
        "up.test".into(),
        port,
        n,
        Arc::clone(&hostile),
    ));
    broker.restart().await?;
    let api = broker.client();
    let pid = broker.pid().context("the broker's pid")?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let (t, o) = (api.get(target).await?, api.get(other).await?);
        if t.ready && o.ready {
            break;
        }
        ensure!(Instant::now() < deadline, "not ready again: {t:?} / {o:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The bystander's live screen, open all along.
    let grant = api
        .create_screen(
            other,
            &CreateScreen {
                mode: ScreenMode::View,
                ttl_ms: Some(600_000),
                reason: None,
            },
        )
        .await?;
    let url = format!("ws://{}{}", broker.addr(), grant.websocket);
    let mut viewer = RfbViewer::connect(&url, &grant.token, TokenIn::Subprotocol).await?;
    let init = viewer.handshake().await?;
    viewer.send(&set_pixel_format_bgrx()).await?;
    viewer.send(&set_encodings(&[16, 0])).await?;
    let (w, h) = (init.width, init.height);
    frame(&mut viewer, w, h).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = threads_and_fds(pid)?;

    // The attack, with the bystander served all along.
    let begun = Instant::now();
    hostile.go.store(true, Ordering::SeqCst);
    let mut status_times = Vec::new();
    let mut other_times = Vec::new();
    let mut peak = before;
    let mut handed_at = None;
    let mut dropped_at = None;
    let mut last_round = Instant::now() - Duration::from_secs(1);
    while dropped_at.is_none() {
        ensure!(
            begun.elapsed() < IDLE * 2 + Duration::from_secs(60),
            "not dropped: {} handed, {} upstream connections, {} ended",
            hostile.handed.load(Ordering::SeqCst),
            upstream.0.load(Ordering::SeqCst),
            upstream.1.load(Ordering::SeqCst)
        );
        let t = Instant::now();
        let s = api.get(other).await?;
        status_times.push(t.elapsed());
        ensure!(s.ready, "the bystander stays ready: {s:?}");
        if last_round.elapsed() >= Duration::from_millis(500) {
            last_round = Instant::now();
            let t = Instant::now();
            api.healthz().await?;
            api.actions(
                other,
                &serde_json::from_value(serde_json::json!(
                    {"actions": [{"action": "mouse_move", "coordinate": [100 + status_times.len() % 50, 100]}]}
                ))?,
            )
            .await?;
            let png = api.screenshot(other).await?;
            ensure!(png.starts_with(b"\x89PNG"), "a screenshot");
            frame(&mut viewer, w, h).await?;
            other_times.push(t.elapsed());
        }
        let now = threads_and_fds(pid)?;
        peak = (peak.0.max(now.0), peak.1.max(now.1));
        if handed_at.is_none() && hostile.handed.load(Ordering::SeqCst) >= n {
            handed_at = Some(Instant::now());
        }
        if handed_at.is_some() && upstream.1.load(Ordering::SeqCst) >= n {
            dropped_at = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (Some(handed_at), Some(dropped_at)) = (handed_at, dropped_at) else {
        bail!("unreachable: the loop ends dropped");
    };
    let to_drop = dropped_at - handed_at;
    let stolen = hostile.stolen.load(Ordering::Relaxed);

    // Witnesses: the audit says idle, the broker's counts come back.
    let log = api.egress_log(target, None).await?;
    let idle = log
        .entries
        .iter()
        .filter(|e| e.end == EgressEnd::Idle)
        .count();
    hostile.release();
    fake.abort();
    // Closer and blocking threads end after 10 s without work.
    tokio::time::sleep(Duration::from_secs(13)).await;
    let after = threads_and_fds(pid)?;
    let metrics = api.metrics().await?;
    let stalled = metrics
        .lines()
        .find(|l| l.starts_with("dormouse_egress_stalled_closes_total"))
        .unwrap_or("dormouse_egress_stalled_closes_total (absent)")
        .to_owned();

    status_times.sort();
    other_times.sort();
    let (p50, p99) = (percentile(&status_times, 50), percentile(&status_times, 99));
    println!(
        "hostile hand-over: {n} sockets handed ({cores} cores), {} upstream connections, {stolen} bytes read by the guest itself",
        upstream.0.load(Ordering::SeqCst)
    );
    for e in &log.entries {
        println!(
            "audit: {} {:?} up {} down {} {:?} after {} ms",
            e.host, e.decision, e.bytes_up, e.bytes_down, e.end, e.duration_ms
        );
    }
    println!(
        "bystander status: {} polls, p50 {p50:?}, p99 {p99:?} (bound {P99_BOUND:?}); healthz+action+screenshot+live frame: {} rounds, p50 {:?}, max {:?}",
        status_times.len(),
        other_times.len(),
        percentile(&other_times, 50),
        other_times.last().copied().unwrap_or_default()
    );
    println!(
        "dropped {n} connections {to_drop:?} after the last hand-over (idle bound {IDLE:?}); audit: {idle} ended idle; {stalled}"
    );
    println!(
        "broker threads before/peak/after: {}/{}/{}; fds: {}/{}/{}",
        before.0, peak.0, after.0, before.1, peak.1, after.1
    );
    ensure!(stolen > 0, "the guest read the program's bytes itself");
    ensure!(
        idle >= n,
        "{idle} of {n} connections audited as idle: {log:?}"
    );
    ensure!(
        to_drop <= IDLE + Duration::from_secs(5),
        "dropped after {to_drop:?}"
    );
    ensure!(p99 < P99_BOUND, "the bystander's status p99 {p99:?}");
    ensure!(
        after.0 <= before.0 + 2,
        "threads {} -> {}",
        before.0,
        after.0
    );
    ensure!(after.1 <= before.1 + 4, "fds {} -> {}", before.1, after.1);
    viewer.close().await;
    Ok(())
}
