//! The guest socket against a real supervisor in a real container, through
//! the bind-mounted run directory, as the broker sees it (issue 4).
//!
//! Every container runs hardened as the broker creates them: `--network
//! none`, `--cap-drop ALL` plus `dormouse_supervisor::REQUIRED_CAPABILITIES`,
//! `no-new-privileges`, with a host temp dir mounted at `/run/dormouse`.
//!
//! The image is `desktop_image()` (`dormouse/desktop:latest` unless
//! `DORMOUSE_TEST_IMAGE` names another). For quick iteration,
//! `DORMOUSE_SUPERVISOR_BIN=/path/to/dormouse-supervisor` bind-mounts that
//! binary over the image's (e.g. into `dormouse/desktop-packages:prewarm`).
//!
//! Waiting is event-driven (see `support`); its deadlines are hang guards,
//! not speed assertions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use dormouse_e2e::docker_ok;
use dormouse_protocol::frame::{frame_unchecked, HEADER_LEN};
use dormouse_protocol::{CheckStatus, FrameHeader, Phase, Request, Response, MAX_HEADER_LEN};
use support::{error_code, Client, Desktop, HEIGHT, WIDTH};
use tokio::io::AsyncWriteExt as _;

#[tokio::test]
async fn hello_identity_changes_with_every_start_and_holds_while_running() {
    let Some(desktop) = Desktop::create("hello_identity_changes_with_every_start") else {
        return;
    };
    let mut client = desktop.start().await;
    let first = client.identity().await;
    client.watch_until_ready(&desktop).await;
    // The same container start: a new connection, after readiness, says
    // the same.
    let mut again = Client::connect(&desktop.socket()).await;
    assert_eq!(
        again.identity().await,
        first,
        "identity moved while running"
    );
    drop((client, again));

    docker_ok(&["stop", desktop.name()]);
    let mut client = desktop.start().await;
    let after_stop = client.identity().await;
    assert_ne!(after_stop, first, "docker stop/start kept the identity");
    assert_eq!(after_stop.boot_id, first.boot_id, "same host boot");
    client.watch_until_ready(&desktop).await;
    drop(client);

    docker_ok(&["kill", "-s", "KILL", desktop.name()]);
    docker_ok(&["wait", desktop.name()]);
    let mut client = desktop.start().await;
    let after_kill = client.identity().await;
    assert_ne!(after_kill, after_stop, "kill/start kept the identity");
    assert_ne!(after_kill, first);
    let statuses = client.watch_until_ready(&desktop).await;
    assert_eq!(statuses.last().map(|s| &s.identity), Some(&after_kill));
}

#[tokio::test]
async fn watch_pushes_ready_and_the_screenshot_is_a_full_png_and_restarts_re_probe() {
    let Some(desktop) = Desktop::create("watch_pushes_ready_and_the_screenshot_is_a_full_png")
    else {
        return;
    };
    let mut watcher = desktop.start().await;
    // One request, then only pushes: no polling on this side, and the
    // supervisor pushes on change (its unit tests show nothing is sent
    // without one).
    let statuses = watcher.watch_until_ready(&desktop).await;
    let ready = statuses.last().unwrap();
    assert!(matches!(ready.phase, Phase::Ready | Phase::Degraded));
    assert!(ready.ready_since.is_some());
    let health = ready.health.as_ref().expect("a health report when ready");
    assert_eq!(health.schema_version, "1");
    assert_ne!(health.overall, CheckStatus::Fail);
    for name in [
        "x_display",
        "window_manager",
        "vnc",
        "screenshot",
        "browser_profiles",
        "workspace",
        "identity",
    ] {
        let check = health
            .check(name)
            .unwrap_or_else(|| panic!("no {name} check in {health:#?}"));
        assert_ne!(check.status, CheckStatus::Fail, "{name}: {}", check.detail);
    }
    assert!(
        health
            .check("x_display")
            .unwrap()
            .detail
            .contains(&format!("{WIDTH}x{HEIGHT}")),
        "{:?}",
        health.check("x_display")
    );

    let mut client = Client::connect(&desktop.socket()).await;
    let shot = client
        .ask(&Request::Screenshot {
            encoding: Default::default(),
        })
        .await;
    let Response::Screenshot { width, height, .. } = shot.message else {
        panic!("screenshot answered {:?}", shot.message);
    };
    assert_eq!((width, height), (WIDTH, HEIGHT));
    let decoder = png::Decoder::new(std::io::Cursor::new(&shot.payload));
    let mut reader = decoder.read_info().expect("a PNG header");
    let mut pixels = vec![0u8; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).expect("complete PNG data");
    assert_eq!((info.width, info.height), (WIDTH, HEIGHT));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.buffer_size(), (WIDTH * HEIGHT * 3) as usize);

    // Activity answers too (X input idle time comes from the server).
    match client.ask(&Request::Activity).await.message {
        Response::Activity(a) => {
            assert!(a.input_idle_ms.is_some(), "{a:?}");
        }
        other => panic!("activity answered {other:?}"),
    }

    // The status on a second connection agrees with the pushed one.
    match client.ask(&Request::Status).await.message {
        Response::Status(s) => {
            assert!(s.ready);
            assert_eq!(s.identity, ready.identity);
        }
        other => panic!("status answered {other:?}"),
    }

    // A service restart takes readiness away until a new probe passes; the
    // watcher (still the first connection) is told both, unasked.
    let wm_pid = |s: &dormouse_protocol::GuestStatus| {
        s.services
            .iter()
            .find(|s| s.name == "openbox")
            .and_then(|s| s.pid)
    };
    let before = wm_pid(ready).expect("openbox runs");
    docker_ok(&["exec", desktop.name(), "kill", "-KILL", &before.to_string()]);
    let mut lost_readiness = false;
    loop {
        let Some(frame) = watcher.recv().await else {
            panic!("watch ended; logs:\n{}", desktop.logs());
        };
        let Response::Status(s) = frame.message else {
            panic!("watch pushed {:?}", frame.message);
        };
        lost_readiness |= !s.ready;
        if s.ready && wm_pid(&s).is_some_and(|pid| pid != before) {
            assert!(lost_readiness, "ready never dropped during the restart");
            let probed = s.health.as_ref().map(|h| h.probed_at);
            assert!(probed > health_probed_at(ready), "not re-probed");
            break;
        }
    }
}

fn health_probed_at(s: &dormouse_protocol::GuestStatus) -> Option<chrono::DateTime<chrono::Utc>> {
    s.health.as_ref().map(|h| h.probed_at)
}

#[tokio::test]
async fn bad_frames_close_only_their_connection_and_fifty_clients_are_served() {
    let Some(desktop) = Desktop::create("bad_frames_close_only_their_connection") else {
        return;
    };
    let mut bystander = desktop.start().await;
    let id = bystander.identity().await;
    let path = desktop.socket();

    let raw = |json: &str| frame_unchecked(json.as_bytes(), &[]);
    let oversized = FrameHeader {
        message_len: MAX_HEADER_LEN + 1,
        payload_len: 0,
    }
    .to_bytes()
    .to_vec();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage".to_vec(),
            "message_too_large",
        ),
        ("not json", raw("{{{{"), "bad_frame"),
        ("oversized", oversized, "message_too_large"),
        (
            "unknown kind",
            raw(r#"{"v":1,"kind":"rm_rf"}"#),
            "unknown_kind",
        ),
    ];
    for (what, bytes, code) in cases {
        let mut c = Client::connect(&path).await;
        c.stream.write_all(&bytes).await.unwrap();
        let answer = c
            .recv()
            .await
            .unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(error_code(&answer.message), code, "{what}");
        assert!(c.recv().await.is_none(), "{what}: connection left open");
        assert_eq!(bystander.identity().await, id, "{what}: bystander affected");
    }
    // Truncated: the frame ends early and the client half-closes.
    let mut c = Client::connect(&path).await;
    let whole = raw(r#"{"v":1,"kind":"status"}"#);
    c.stream.write_all(&whole[..HEADER_LEN + 5]).await.unwrap();
    c.stream.shutdown().await.unwrap();
    let answer = c.recv().await.expect("an answer to a truncated frame");
    assert_eq!(error_code(&answer.message), "truncated");
    assert!(c.recv().await.is_none());
    assert_eq!(bystander.identity().await, id);

    // Fifty at once, each asking a few times.
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..50 {
        let path = path.clone();
        clients.spawn(async move {
            let mut c = Client::connect(&path).await;
            for _ in 0..3 {
                let request = if i % 2 == 0 {
                    Request::Hello
                } else {
                    Request::Status
                };
                let answer = c.ask(&request).await;
                assert!(
                    matches!(answer.message, Response::Hello(_) | Response::Status(_)),
                    "{:?}",
                    answer.message
                );
            }
        });
    }
    let mut served = 0;
    while let Some(done) = clients.join_next().await {
        done.unwrap();
        served += 1;
    }
    assert_eq!(served, 50);
    assert_eq!(bystander.identity().await, id);
}

/// A guest root (or anything) leaves a symlink, then a regular file, then a
/// directory at the socket path while the desktop is stopped: each next
/// start removes it without following it, binds a fresh socket and becomes
/// ready. Before, the supervisor refused to replace it and ran without a
/// socket, and the desktop stayed unreachable for good.
#[tokio::test]
async fn whatever_is_left_at_the_socket_path_does_not_outlive_a_restart() {
    let Some(desktop) = Desktop::create("whatever_is_left_at_the_socket_path") else {
        return;
    };
    let mut client = desktop.start().await;
    client.watch_until_ready(&desktop).await;
    drop(client);
    let victim = tempfile::tempdir().expect("victim dir");
    let kept = victim.path().join("kept");
    std::fs::write(&kept, "keep").expect("victim file");
    let socket = desktop.socket();
    type Plant = Box<dyn Fn(&std::path::Path)>;
    let plants: Vec<(&str, Plant)> = vec![
        ("a symlink", {
            let kept = kept.clone();
            Box::new(move |p| std::os::unix::fs::symlink(&kept, p).expect("link"))
        }),
        (
            "a regular file",
            Box::new(|p| std::fs::write(p, "planted").expect("file")),
        ),
        (
            "a directory",
            Box::new(|p| {
                std::fs::create_dir(p).expect("dir");
                std::fs::write(p.join("inside"), "x").expect("inside");
            }),
        ),
    ];
    for (what, plant) in plants {
        docker_ok(&["stop", desktop.name()]);
        match std::fs::symlink_metadata(&socket) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&socket).expect("rm"),
            Ok(_) => std::fs::remove_file(&socket).expect("rm"),
            Err(_) => {}
        }
        plant(&socket);
        let mut client = desktop.start().await;
        let statuses = client.watch_until_ready(&desktop).await;
        assert!(
            statuses.last().is_some_and(|s| s.ready),
            "{what}: not ready; logs:\n{}",
            desktop.logs()
        );
        use std::os::unix::fs::FileTypeExt as _;
        assert!(
            std::fs::symlink_metadata(&socket)
                .expect("socket")
                .file_type()
                .is_socket(),
            "{what}: a fresh socket in its place"
        );
        assert_eq!(
            std::fs::read_to_string(&kept).expect("victim"),
            "keep",
            "{what}: never followed"
        );
    }
}

#[tokio::test]
async fn clipboard_get_reads_what_an_x_client_put_on_the_clipboard() {
    let Some(desktop) = Desktop::create("clipboard_get_reads_what_an_x_client_put") else {
        return;
    };
    let mut watcher = desktop.start().await;
    watcher.watch_until_ready(&desktop).await;
    let mut client = Client::connect(&desktop.socket()).await;
    // Nobody owns the clipboard on a fresh desktop.
    match client.ask(&Request::ClipboardGet).await.message {
        Response::Clipboard { has_text, .. } => assert!(!has_text),
        other => panic!("clipboard_get answered {other:?}"),
    }
    // An independent X client (xterm, told by OSC 52) takes the clipboard.
    let text = "dormouse clipboard ✓";
    let b64 = dormouse_protocol::actions::base64(text.as_bytes());
    let script = format!("printf '\\033]52;c;{b64}\\007'; sleep 60");
    docker_ok(&[
        "exec",
        "-d",
        "-u",
        "1000",
        "-e",
        "DISPLAY=:1",
        desktop.name(),
        "xterm",
        "-xrm",
        "XTerm*allowWindowOps: true",
        "-e",
        "sh",
        "-c",
        &script,
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let answer = client.ask(&Request::ClipboardGet).await;
        match answer.message {
            Response::Clipboard {
                has_text: true,
                truncated,
            } => {
                assert!(!truncated);
                assert_eq!(String::from_utf8(answer.payload).unwrap(), text);
                break;
            }
            Response::Clipboard { .. } => {}
            other => panic!("clipboard_get answered {other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the clipboard never held the text; logs:\n{}",
            desktop.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
