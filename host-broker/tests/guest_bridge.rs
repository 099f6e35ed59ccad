//! The guest channel over the engine's exec (`dormouse-supervisor bridge`),
//! against the real engine and image: a broker that reaches its guests only
//! through the bridge gets a desktop ready (hello, then `watch` pushing the
//! ready status), takes screenshots, and the engine's own event log shows the
//! bridge execs. The live screen goes the same way: a screen capability is
//! admitted and its VNC stream (`dormouse-supervisor bridge-vnc`) speaks
//! RFB with the desktop's own screen size. A hostile stream on the same
//! path (a flood, an immediate close) ends the connection with an error,
//! quickly and bounded.
//!
//! Tests skip visibly without an engine or image, and fail under `CI=true`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod engine_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dormouse_broker::api::screen_host::OwnerScreenHost;
use dormouse_broker::docker::{
    Dialect, DockerBackend, DockerConfig, DockerEngine, Engine, GuestChannel,
};
use dormouse_broker::guest::{GuestError, GuestRelay, GuestSocket};
use dormouse_broker::metrics::Metrics;
use dormouse_broker::owner;
use dormouse_broker::screen::ScreenHost;
use dormouse_broker::store::Paths;
use dormouse_e2e::{desktop_image, docker_available, TempDir};
use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::screen::ScreenMode;
use engine_support::{broker_config, engine_events, engine_now, log, wait_ready, RunGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const READY_LIMIT: Duration = Duration::from_secs(90);

/// A relay that runs any command in the container instead of the bridge:
/// the hostile guest of these tests.
#[derive(Debug)]
struct Command {
    engine: Arc<dyn Engine>,
    container: String,
    argv: Vec<&'static str>,
}

impl GuestRelay for Command {
    fn open(
        &self,
    ) -> futures_util::future::BoxFuture<'_, Result<tokio::net::UnixStream, GuestError>> {
        Box::pin(async move {
            self.engine
                .exec_stream(&self.container, &self.argv)
                .await
                .map_err(|e| GuestError::Connect(std::io::Error::other(e.to_string())))
        })
    }
}

#[tokio::test]
// Over 100 lines on purpose: one real-engine test told in order (set up,
// act, witness, clean up); its steps share the desktop and the witnesses,
// and apart the order a reader must check would be spread over helpers.
async fn a_broker_reaches_its_desktops_only_through_the_bridge() {
    let test = "a_broker_reaches_its_desktops_only_through_the_bridge";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    log();
    let guard = RunGuard::new("dm-bridge");
    let data = TempDir::new("dm-bridge");
    let engine: Arc<dyn Engine> = Arc::new(DockerEngine::connect().await.unwrap());
    let config = broker_config(data.path(), &image, &guard);
    let since = engine_now();
    let backend = DockerBackend::new(
        engine.clone(),
        DockerConfig {
            dialect: Dialect::Docker,
            guest_channel: GuestChannel::Bridge,
            ..DockerConfig::from_broker(&config)
        },
        Paths::new(&config.data_dir),
    );
    let (broker, _core) =
        owner::spawn_backend(config, Arc::new(backend), Arc::new(Metrics::default()))
            .await
            .unwrap();

    let t = Instant::now();
    let created = broker.create(CreateComputer::default()).await.unwrap();
    let ready = wait_ready(&broker, created.id, READY_LIMIT).await;
    eprintln!(
        "create → ready through the bridge: {} ms",
        t.elapsed().as_millis()
    );
    assert!(ready.ready);
    let health = ready.health.expect("the guest's report came through");
    assert!(!health.checks.is_empty());

    let png = broker.screenshot(created.id).await.unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(png.len() > 1000, "{} bytes", png.len());

    // The live screen through the bridge: admitted, then RFB up to the
    // server's init, whose size is the screenshot's.
    let host = OwnerScreenHost::new(broker.clone());
    host.admit(created.id, ScreenMode::View, None)
        .await
        .unwrap();
    let vnc = host.connect_vnc(created.id).await.unwrap();
    let (width, height) = tokio::time::timeout(Duration::from_secs(30), rfb_size(vnc))
        .await
        .expect("the VNC stream answers in time");
    let png_size = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((u32::from(width), u32::from(height)), png_size);

    // The engine saw the bridges being run (its exec events name the command).
    let until = engine_now();
    let execs: Vec<String> = engine_events(&guard, &since, &until)
        .into_iter()
        .filter(|(action, _)| action.starts_with("exec_start"))
        .map(|(action, rest)| format!("{action} {rest}"))
        .collect();
    assert!(
        execs
            .iter()
            .any(|e| e.contains("dormouse-supervisor bridge")),
        "no bridge exec among {execs:?}"
    );
    assert!(
        execs
            .iter()
            .any(|e| e.contains("dormouse-supervisor bridge-vnc")),
        "no VNC bridge exec among {execs:?}"
    );

    // Hostile streams on the same path: a flood of noise, and a close.
    let container = format!("dormouse-{}", created.id);
    for (argv, what) in [
        (
            vec!["sh", "-c", "head -c 200000000 /dev/urandom"],
            "a flood",
        ),
        (vec!["true"], "an immediate close"),
        (vec!["sh", "-c", "sleep 60"], "silence"),
    ] {
        let hostile =
            GuestSocket::new(data.path().join("unused.sock")).through(Arc::new(Command {
                engine: engine.clone(),
                container: container.clone(),
                argv,
            }));
        let t = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(30), async {
            let mut conn = hostile.connect().await?;
            conn.hello().await
        })
        .await
        .expect("a hostile stream must not hang the broker");
        let err = result.expect_err("no hello from a hostile stream");
        eprintln!("{what}: {err} after {} ms", t.elapsed().as_millis());
    }

    // The real bridge still works afterwards.
    assert!(broker.screenshot(created.id).await.is_ok());
}

/// RFB 3.8 without authentication up to the server's init: its framebuffer
/// size.
async fn rfb_size(mut vnc: tokio::net::UnixStream) -> (u16, u16) {
    let mut banner = [0u8; 12];
    vnc.read_exact(&mut banner).await.unwrap();
    assert!(banner.starts_with(b"RFB 003."), "{banner:?}");
    vnc.write_all(b"RFB 003.008\n").await.unwrap();
    let count = vnc.read_u8().await.unwrap();
    assert!(count > 0, "the server refused the handshake");
    let mut types = vec![0u8; usize::from(count)];
    vnc.read_exact(&mut types).await.unwrap();
    assert!(types.contains(&1), "no security type None among {types:?}");
    vnc.write_all(&[1]).await.unwrap();
    assert_eq!(vnc.read_u32().await.unwrap(), 0, "security result");
    vnc.write_all(&[1]).await.unwrap(); // shared
    let width = vnc.read_u16().await.unwrap();
    let height = vnc.read_u16().await.unwrap();
    (width, height)
}
