//! The screen gateway against the real VNC server of the desktop image:
//! x11vnc with the supervisor's flags on a real Xvfb, in a network-less
//! container, without the supervisor: each VNC connection of the gateway is
//! carried to the guest's loopback by a small bridge run with
//! `docker exec -i` (the engine's exec stream, as the design's fallback
//! channel does). The whole path through the supervisor's `vnc.sock` and a
//! real broker is `tests/tests/screen.rs`. The witness of what reaches the desktop is
//! `xdotool getmouselocation` in the guest, not the gateway.
//!
//! Needs Docker and the desktop image (`DORMOUSE_TEST_IMAGE`); skips with a
//! visible message without them (fails under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use dormouse_broker::api::screen_routes;
use dormouse_broker::screen::{Refusal, ScreenGateway, ScreenHost};
use dormouse_e2e::rfb::{pointer_event, set_encodings, update_request, RfbViewer, TokenIn};
use dormouse_e2e::{desktop_image, docker_available, docker_ok, unique_name, ContainerGuard};
use dormouse_protocol::screen::{ScreenGrant, ScreenMode};
use futures_util::future::BoxFuture;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Splices stdin/stdout to 127.0.0.1:5900 in the guest.
const BRIDGE: &str = r#"use IO::Socket::INET; use IO::Select;
my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1", PeerPort => 5900) or die "connect: $!";
binmode STDIN; binmode STDOUT;
my $sel = IO::Select->new(\*STDIN, $s);
while (1) { for my $fh ($sel->can_read) {
  my $n = sysread($fh, my $buf, 65536); exit 0 unless $n;
  if (fileno($fh) == fileno($s)) { syswrite(STDOUT, $buf) } else { syswrite($s, $buf) } } }"#;

struct BridgedHost {
    socket: PathBuf,
}

impl ScreenHost for BridgedHost {
    fn exists(&self, _computer: Uuid) -> BoxFuture<'_, Result<(), Refusal>> {
        Box::pin(async { Ok(()) })
    }
    fn admit(
        &self,
        _computer: Uuid,
        _mode: ScreenMode,
        _generation: Option<u64>,
    ) -> BoxFuture<'_, Result<u64, Refusal>> {
        Box::pin(async { Ok(0) })
    }
    fn connect_vnc(&self, _computer: Uuid) -> BoxFuture<'_, Result<UnixStream, Refusal>> {
        Box::pin(async move {
            UnixStream::connect(&self.socket)
                .await
                .map_err(|e| Refusal::unavailable(e.to_string()))
        })
    }
}

/// A unix socket whose every connection is bridged into the container.
fn serve_bridge(listener: UnixListener, container: String) {
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let container = container.clone();
            tokio::spawn(async move {
                let mut child = tokio::process::Command::new("docker")
                    .args(["exec", "-i", &container, "perl", "-e", BRIDGE])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap();
                let mut stdin = child.stdin.take().unwrap();
                let mut stdout = child.stdout.take().unwrap();
                let (mut rd, mut wr) = stream.into_split();
                tokio::select! {
                    _ = tokio::io::copy(&mut rd, &mut stdin) => {}
                    _ = tokio::io::copy(&mut stdout, &mut wr) => {}
                }
                let _ = child.kill().await;
            });
        }
    });
}

fn mouse(container: &str) -> String {
    docker_ok(&[
        "exec",
        "-e",
        "DISPLAY=:1",
        container,
        "xdotool",
        "getmouselocation",
    ])
}

async fn viewer(ws: &str, grant: &ScreenGrant) -> RfbViewer {
    let mut v = RfbViewer::connect(
        &format!("{ws}{}", grant.websocket),
        &grant.token,
        TokenIn::Subprotocol,
    )
    .await
    .unwrap();
    let init = v.handshake().await.unwrap();
    assert_eq!((init.width, init.height), (1280, 800), "{init:?}");
    v
}

#[tokio::test]
// Over 100 lines on purpose: one real-engine test told in order (set up,
// act, witness, clean up); its steps share the desktop and the witnesses,
// and apart the order a reader must check would be spread over helpers.
async fn view_input_never_reaches_x11vnc_and_control_input_does() {
    let test = "screen_x11vnc";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    let name = unique_name("dormouse-screen-x11vnc");
    let _guard = ContainerGuard::new(&name);
    // The supervisor's x11vnc flags (guest-supervisor/src/services/mod.rs).
    docker_ok(&[
        "run", "-d", "--name", &name, "--label", "dev.dormouse.test=screen", "--network", "none",
        "--entrypoint", "/bin/bash", &image, "-c",
        "Xvfb :1 -screen 0 1280x800x24 -nolisten tcp & \
         for i in $(seq 100); do [ -e /tmp/.X11-unix/X1 ] && break; sleep 0.1; done; \
         x11vnc -display :1 -localhost -rfbport 5900 -forever -shared -nopw -noipv6 -threads -repeat -quiet & \
         wait",
    ]);
    // Wait for the VNC server and put the pointer somewhere known.
    let mut up = false;
    for _ in 0..100 {
        let out = dormouse_e2e::docker(&[
            "exec",
            &name,
            "perl",
            "-MIO::Socket::INET",
            "-e",
            "IO::Socket::INET->new(PeerAddr=>q{127.0.0.1},PeerPort=>5900) or exit 1",
        ]);
        if out.status.success() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "x11vnc did not come up");
    docker_ok(&[
        "exec",
        "-e",
        "DISPLAY=:1",
        &name,
        "xdotool",
        "mousemove",
        "10",
        "10",
    ]);
    let before = mouse(&name);
    assert!(before.starts_with("x:10 y:10"), "{before}");

    let dir = dormouse_e2e::TempDir::new("dormouse-screen-x11vnc");
    let socket = dir.path().join("vnc.sock");
    serve_bridge(UnixListener::bind(&socket).unwrap(), name.clone());
    let gateway = ScreenGateway::new(Arc::new(BridgedHost { socket }), CancellationToken::new());
    let computer = Uuid::new_v4();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ws = format!("ws://{}", listener.local_addr().unwrap());
    let registry = gateway.registry.clone();
    tokio::spawn(async move {
        axum::serve(listener, screen_routes::router(gateway))
            .await
            .unwrap();
    });

    // View: a whole framebuffer update comes; pointer events do not move
    // the guest's pointer.
    let epoch = registry.epoch(computer);
    let view = registry
        .mint(computer, ScreenMode::View, 60_000, 0, epoch, None)
        .unwrap();
    let mut v = viewer(&ws, &view).await;
    v.send(&dormouse_e2e::rfb::set_pixel_format_bgrx())
        .await
        .unwrap();
    v.send(&set_encodings(&[0])).await.unwrap();
    v.send(&update_request(false, 0, 0, 1280, 800))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let rects = v.read_update().await.unwrap();
    let pixels: usize = rects.iter().map(|r| r.pixels.len() / 4).sum();
    eprintln!(
        "view: first full update of {} rects, {pixels} pixels, {:?} after the request",
        rects.len(),
        started.elapsed()
    );
    assert_eq!(pixels, 1280 * 800);
    for (x, y) in [(600u16, 400u16), (700, 500), (800, 600)] {
        v.send(&pointer_event(0, x, y)).await.unwrap();
    }
    v.send(&update_request(true, 0, 0, 1280, 800))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_view = mouse(&name);
    assert!(
        after_view.starts_with("x:10 y:10"),
        "a view capability moved the pointer: {after_view}"
    );

    // Control: the same events move it.
    let control = registry
        .mint(
            computer,
            ScreenMode::Control,
            60_000,
            0,
            registry.epoch(computer),
            None,
        )
        .unwrap();
    let mut c = viewer(&ws, &control).await;
    c.send(&pointer_event(0, 700, 500)).await.unwrap();
    let mut moved = String::new();
    for _ in 0..50 {
        moved = mouse(&name);
        if moved.starts_with("x:700 y:500") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        moved.starts_with("x:700 y:500"),
        "a control capability did not move the pointer: {moved}"
    );
    eprintln!("xdotool: before {before:?}, after view input {after_view:?}, after control input {moved:?}");
    v.close().await;
    c.close().await;
}
