//! The guest socket's tests: run directory, framing, limits and every
//! request against a real socket on a temp directory.

use super::*;
use dormouse_protocol::frame::{self, frame_unchecked, Frame, HEADER_LEN};
use dormouse_protocol::FrameHeader;
use dormouse_protocol::{
    ContainerStartIdentity, Phase, Quiesced, Request, Response, ServiceRunState, ServiceState,
    MAX_HEADER_LEN, PROTOCOL_VERSION,
};
use std::os::unix::fs::symlink;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncReadExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::UnixStream;
use tokio::task::JoinSet;
use tokio::time::timeout;
use tokio::time::Instant;

/// A hang guard for reads in tests; not a speed assertion.
const GUARD: Duration = Duration::from_secs(20);

struct Guest {
    _dir: tempfile::TempDir,
    config: Arc<Config>,
    cell: StatusCell,
    quiesce_rx: Option<mpsc::Receiver<QuiesceRequest>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn identity() -> ContainerStartIdentity {
    ContainerStartIdentity {
        boot_id: "0b5e7a4c-boot".into(),
        pid_ns_inode: 4026532000,
        pid1_start_time: 123456,
    }
}

fn start_with(adjust: impl FnOnce(&mut Config)) -> Guest {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config {
        run_dir: dir.path().join("run"),
        tmp_dir: dir.path().join("tmp"),
        proc_root: dir.path().join("proc"),
        busy_sample_ms: 5,
        probe_timeout_ms: 1000,
        ..Config::default()
    };
    std::fs::create_dir_all(&config.proc_root).expect("proc");
    adjust(&mut config);
    let config = Arc::new(config);
    let cell = StatusCell::new(identity());
    let (tx, rx) = mpsc::channel(4);
    let bound = bind(&config).expect("bind");
    let server = tokio::spawn({
        let config = Arc::clone(&config);
        let cell = cell.clone();
        let exec = ExecRunner::new(crate::exec::ExecSettings::from_config(&config));
        async move {
            accept_loop(
                &bound.listener,
                config,
                cell,
                tx,
                exec,
                crate::egress::Hub::new(),
            )
            .await
        }
    });
    Guest {
        _dir: dir,
        config,
        cell,
        quiesce_rx: Some(rx),
        server,
    }
}

fn start() -> Guest {
    start_with(|_| {})
}

async fn connect(guest: &Guest) -> UnixStream {
    UnixStream::connect(guest.config.socket_path())
        .await
        .expect("connect")
}

async fn send(stream: &mut UnixStream, request: &Request) {
    let bytes = frame::encode(request, &[]).expect("encode");
    stream.write_all(&bytes).await.expect("send");
}

/// Reads one response; `None` on a clean close.
async fn recv(stream: &mut UnixStream) -> Option<Frame<Response>> {
    let read = async {
        let mut head = [0u8; HEADER_LEN];
        match stream.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("read: {e}"),
        }
        let header = FrameHeader::parse(head).expect("server header");
        let mut rest = vec![0u8; (header.message_len + header.payload_len) as usize];
        stream.read_exact(&mut rest).await.expect("frame body");
        let mut whole = head.to_vec();
        whole.extend_from_slice(&rest);
        let (frame, _) = frame::decode::<Response>(&whole)
            .expect("decode")
            .expect("whole frame");
        Some(frame)
    };
    timeout(GUARD, read).await.expect("server answered")
}

async fn ask(stream: &mut UnixStream, request: &Request) -> Response {
    send(stream, request).await;
    recv(stream).await.expect("an answer").message
}

fn error_code(response: &Response) -> &str {
    match response {
        Response::Error { code, .. } => code,
        other => panic!("expected an error, got {other:?}"),
    }
}

async fn assert_closed(stream: &mut UnixStream) {
    assert!(recv(stream).await.is_none(), "connection must be closed");
}

#[tokio::test]
async fn hello_and_status() {
    let guest = start();
    let mut c = connect(&guest).await;
    match ask(&mut c, &Request::Hello).await {
        Response::Hello(h) => {
            assert_eq!(h.protocol_version, PROTOCOL_VERSION);
            assert_eq!(h.supervisor_version, env!("CARGO_PKG_VERSION"));
            assert_eq!(h.identity, identity());
        }
        other => panic!("{other:?}"),
    }
    // Several requests on one connection, in order.
    match ask(&mut c, &Request::Status).await {
        Response::Status(s) => {
            assert_eq!(s.phase, Phase::Preparing);
            assert!(!s.ready);
            assert_eq!(s.identity, identity());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn socket_and_run_dir_are_private() {
    let guest = start();
    let dir = std::fs::metadata(&guest.config.run_dir).expect("run dir");
    assert_eq!(dir.permissions().mode() & 0o777, RUN_DIR_MODE);
    let sock = std::fs::symlink_metadata(guest.config.socket_path()).expect("socket");
    assert!(sock.file_type().is_socket());
    assert_eq!(sock.permissions().mode() & 0o777, SOCKET_MODE);
    if nix::unistd::geteuid().is_root() {
        assert_eq!((dir.uid(), dir.gid()), (0, 0));
    }
}

#[tokio::test]
async fn whatever_sits_at_the_socket_path_is_replaced_without_being_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config {
        run_dir: dir.path().join("run"),
        ..Config::default()
    };
    std::fs::create_dir_all(&config.run_dir).expect("mkdir");
    // A socket left by a killed supervisor.
    drop(std::os::unix::net::UnixListener::bind(config.socket_path()).expect("stale"));
    let bound = bind(&config).expect("stale socket replaced");
    drop(bound);
    assert!(
        std::fs::symlink_metadata(config.socket_path()).is_err(),
        "dropping the server removes its socket"
    );

    // A symlink (to a file, to a directory, to another live socket), a
    // regular file, a directory with contents: each is removed, never
    // followed, and a fresh socket is served in its place.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep").expect("victim");
    let victim_dir = dir.path().join("victim-dir");
    std::fs::create_dir(&victim_dir).expect("victim dir");
    std::fs::write(victim_dir.join("inside"), "keep").expect("inside");
    let other = dir.path().join("other.sock");
    let _other = std::os::unix::net::UnixListener::bind(&other).expect("other");
    type Plant<'a> = Box<dyn Fn(&Path) + 'a>;
    let plant: Vec<(&str, Plant)> = vec![
        (
            "link to a file",
            Box::new(|p| symlink(&victim, p).expect("link")),
        ),
        (
            "link to a dir",
            Box::new(|p| symlink(&victim_dir, p).expect("link")),
        ),
        (
            "link to a socket",
            Box::new(|p| symlink(&other, p).expect("link")),
        ),
        (
            "regular file",
            Box::new(|p| std::fs::write(p, "a file").expect("file")),
        ),
        (
            "directory",
            Box::new(|p| {
                std::fs::create_dir(p).expect("dir");
                std::fs::write(p.join("x"), "x").expect("inside");
            }),
        ),
    ];
    for (what, plant) in plant {
        plant(&config.socket_path());
        let bound = bind(&config).unwrap_or_else(|e| panic!("{what}: {e}"));
        let meta = std::fs::symlink_metadata(config.socket_path()).expect("socket");
        assert!(meta.file_type().is_socket(), "{what}: a fresh socket");
        assert_eq!(meta.permissions().mode() & 0o777, SOCKET_MODE, "{what}");
        let client = std::os::unix::net::UnixStream::connect(config.socket_path())
            .unwrap_or_else(|e| panic!("{what}: connect: {e}"));
        drop(client);
        assert!(
            bound.listener.accept().await.is_ok(),
            "{what}: served by the fresh socket"
        );
        drop(bound);
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep");
        assert_eq!(
            std::fs::read_to_string(victim_dir.join("inside")).expect("inside"),
            "keep"
        );
        assert!(std::fs::symlink_metadata(&other)
            .expect("other socket")
            .file_type()
            .is_socket());
    }
}

#[test]
fn run_dir_is_root_only_and_a_planted_link_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = crate::config::test_support::test_config(dir.path());
    std::fs::create_dir_all(&config.run_dir).expect("mkdir");
    std::fs::set_permissions(&config.run_dir, std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    secure_run_dir(&config).expect("secure");
    let meta = std::fs::metadata(&config.run_dir).expect("stat");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);

    std::fs::remove_dir(&config.run_dir).expect("rmdir");
    symlink(dir.path(), &config.run_dir).expect("link");
    assert!(matches!(
        secure_run_dir(&config),
        Err(SocketError::NotADirectory { .. })
    ));
    assert!(matches!(
        bind(&config),
        Err(SocketError::NotADirectory { .. })
    ));
}

#[tokio::test]
async fn watch_pushes_every_change_without_polling() {
    let guest = start();
    let mut w = connect(&guest).await;
    send(&mut w, &Request::Watch).await;
    let first = recv(&mut w).await.expect("current status");
    assert!(matches!(&first.message, Response::Status(s) if s.phase == Phase::Preparing));

    // Nothing is sent until something changes...
    let quiet = timeout(Duration::from_millis(100), w.read_u8()).await;
    assert!(quiet.is_err(), "watch sent without a change");

    // ...and each change arrives by itself.
    guest.cell.set_prepared();
    let pushed = recv(&mut w).await.expect("pushed");
    assert!(matches!(&pushed.message, Response::Status(s) if s.phase == Phase::Starting));
    let service = ServiceState {
        name: "xvfb".into(),
        state: ServiceRunState::Running,
        pid: Some(7),
        restarts: 0,
        last_exit: None,
        ready_since: None,
    };
    guest.cell.set_services(vec![service], None);
    guest.cell.set_health(
        guest.cell.services_epoch(),
        dormouse_protocol::HealthReport::from_checks(
            vec![dormouse_protocol::Check::new(
                "x",
                dormouse_protocol::CheckStatus::Ok,
                "",
            )],
            chrono::Utc::now(),
        ),
    );
    // The watcher may see the intermediate state or only the latest; it
    // always ends on ready.
    loop {
        let next = recv(&mut w).await.expect("pushed");
        match next.message {
            Response::Status(s) if s.ready => {
                assert_eq!(s.phase, Phase::Ready);
                break;
            }
            Response::Status(_) => continue,
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn bad_frames_close_only_their_connection() {
    let guest = start();
    let mut bystander = connect(&guest).await;
    assert!(matches!(
        ask(&mut bystander, &Request::Hello).await,
        Response::Hello(_)
    ));

    let raw = |json: &str| frame_unchecked(json.as_bytes(), &[]);
    let oversized = FrameHeader {
        message_len: MAX_HEADER_LEN + 1,
        payload_len: 0,
    }
    .to_bytes()
    .to_vec();
    // A whole frame over the limit, of a kind that is never large.
    let over_request_limit = {
        let pad = "x".repeat(usize::try_from(MAX_REQUEST_LEN).expect("small"));
        raw(&format!(r#"{{"v":1,"kind":"status","pad":"{pad}"}}"#))
    };
    // Announces a 1 MiB payload it never sends: refused on the header.
    let with_payload = {
        let json = br#"{"v":1,"kind":"hello"}"#;
        let mut b = FrameHeader {
            message_len: u32::try_from(json.len()).expect("small"),
            payload_len: 1 << 20,
        }
        .to_bytes()
        .to_vec();
        b.extend_from_slice(json);
        b
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "http garbage",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            "message_too_large",
        ),
        ("json garbage", raw("this is not json"), "bad_frame"),
        ("empty message", vec![0; 8], "bad_frame"),
        ("oversized header", oversized, "message_too_large"),
        (
            "over the request limit",
            over_request_limit,
            "message_too_large",
        ),
        ("payload on a request", with_payload, "payload_too_large"),
        (
            "unknown kind",
            raw(r#"{"v":1,"kind":"format_disk"}"#),
            "unknown_kind",
        ),
        (
            "newer version",
            raw(r#"{"v":99,"kind":"hello"}"#),
            "unsupported_version",
        ),
    ];
    for (what, bytes, code) in cases {
        let mut c = connect(&guest).await;
        c.write_all(&bytes).await.expect(what);
        let answer = recv(&mut c)
            .await
            .unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(error_code(&answer.message), code, "{what}");
        assert_closed(&mut c).await;
        assert!(
            matches!(
                ask(&mut bystander, &Request::Status).await,
                Response::Status(_)
            ),
            "{what}: bystander still served"
        );
    }

    // Truncated: the header promises more than ever arrives.
    let mut c = connect(&guest).await;
    let full = raw(r#"{"v":1,"kind":"status"}"#);
    c.write_all(&full[..12]).await.expect("partial");
    c.shutdown().await.expect("half-close");
    let answer = recv(&mut c).await.expect("an answer");
    assert_eq!(error_code(&answer.message), "truncated");
    assert_closed(&mut c).await;
    assert!(matches!(
        ask(&mut bystander, &Request::Hello).await,
        Response::Hello(_)
    ));
}

#[tokio::test]
async fn fifty_concurrent_clients_are_served() {
    let guest = start();
    let path = guest.config.socket_path();
    let mut clients = JoinSet::new();
    for i in 0..50 {
        let path = path.clone();
        clients.spawn(async move {
            let mut c = UnixStream::connect(&path).await.expect("connect");
            for _ in 0..3 {
                let request = if i % 2 == 0 {
                    Request::Hello
                } else {
                    Request::Status
                };
                let response = ask(&mut c, &request).await;
                assert!(matches!(response, Response::Hello(_) | Response::Status(_)));
            }
        });
    }
    let mut served = 0;
    while let Some(done) = clients.join_next().await {
        done.expect("client task");
        served += 1;
    }
    assert_eq!(served, 50);
}

#[tokio::test]
async fn clients_over_the_limit_are_refused_with_a_reason() {
    let guest = start_with(|c| c.socket_max_connections = 2);
    let mut a = connect(&guest).await;
    let mut b = connect(&guest).await;
    // Make sure both are accepted and hold their slots.
    assert!(matches!(
        ask(&mut a, &Request::Hello).await,
        Response::Hello(_)
    ));
    assert!(matches!(
        ask(&mut b, &Request::Hello).await,
        Response::Hello(_)
    ));
    let mut c = connect(&guest).await;
    let refused = recv(&mut c).await.expect("a reason");
    assert_eq!(error_code(&refused.message), "busy");
    assert_closed(&mut c).await;
    // A slot frees when a client leaves (once the server has seen it go).
    drop(a);
    let deadline = Instant::now() + GUARD;
    let mut d = None;
    while d.is_none() && Instant::now() < deadline {
        let mut try_d = connect(&guest).await;
        // A refused client may find the connection closed already.
        let hello = frame::encode(&Request::Hello, &[]).expect("encode");
        let _ = try_d.write_all(&hello).await;
        if let Some(Frame {
            message: Response::Hello(_),
            ..
        }) = recv(&mut try_d).await
        {
            d = Some(try_d);
        }
    }
    assert!(d.is_some(), "a freed slot is reused");
    assert!(matches!(
        ask(&mut b, &Request::Status).await,
        Response::Status(_)
    ));
}

#[tokio::test]
async fn a_silent_or_trickling_client_blocks_nobody() {
    let guest = start();
    // Silent: connected, sends nothing.
    let _silent = connect(&guest).await;
    // Trickling: half a header, then nothing.
    let mut trickle = connect(&guest).await;
    trickle.write_all(&[0, 0, 0]).await.expect("partial header");
    // A watcher that never reads while the status changes many times.
    let mut deaf = connect(&guest).await;
    send(&mut deaf, &Request::Watch).await;
    for _ in 0..200 {
        guest.cell.set_prepared();
        guest.cell.set_stopping();
    }
    let mut c = connect(&guest).await;
    for _ in 0..10 {
        assert!(matches!(
            ask(&mut c, &Request::Hello).await,
            Response::Hello(_)
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn idle_and_trickling_clients_are_dropped_at_their_deadlines() {
    let guest = start();
    let mut silent = connect(&guest).await;
    let mut trickle = connect(&guest).await;
    trickle.write_all(&[0, 0, 0]).await.expect("partial header");
    // Time passes only on the paused clock: the idle bound closes the
    // silent one without a word, the frame bound answers the trickler.
    assert_closed(&mut silent).await;
    let answer = recv(&mut trickle).await.expect("timeout reason");
    assert_eq!(error_code(&answer.message), "timeout");
    assert_closed(&mut trickle).await;
}

#[tokio::test]
async fn quiesce_is_handed_to_the_service_runner() {
    let mut guest = start();
    let mut rx = guest.quiesce_rx.take().expect("receiver");
    let runner = tokio::spawn(async move {
        let Some(QuiesceRequest::Close {
            timeout,
            hold: false,
            reply,
        }) = rx.recv().await
        else {
            panic!("a quiesce");
        };
        assert_eq!(timeout, Duration::from_millis(3000));
        let _ = reply.send(Quiesced {
            closed: vec!["browser".into()],
            complete: true,
            elapsed_ms: 12,
        });
        rx
    });
    let mut c = connect(&guest).await;
    match ask(&mut c, &Request::Quiesce { timeout_ms: 3000 }).await {
        Response::Quiesced(q) => {
            assert!(q.complete);
            assert_eq!(q.closed, vec!["browser".to_owned()]);
        }
        other => panic!("{other:?}"),
    }
    let _rx = runner.await.expect("runner");
}

#[tokio::test(start_paused = true)]
async fn a_quiesce_past_its_bound_is_incomplete() {
    let mut guest = start_with(|c| c.quiesce_max_ms = 2000);
    let mut rx = guest.quiesce_rx.take().expect("receiver");
    // A runner that takes the request and never answers in time.
    let runner = tokio::spawn(async move {
        let request = rx.recv().await.expect("a quiesce");
        // Asked for an hour, clamped to quiesce_max_ms.
        let QuiesceRequest::Close { timeout, .. } = &request else {
            panic!("{request:?}");
        };
        assert_eq!(*timeout, Duration::from_millis(2000));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(request);
    });
    let mut c = connect(&guest).await;
    match ask(
        &mut c,
        &Request::Quiesce {
            timeout_ms: 3_600_000,
        },
    )
    .await
    {
        Response::Quiesced(q) => assert!(!q.complete),
        other => panic!("{other:?}"),
    }
    runner.abort();
}

#[tokio::test]
async fn a_held_quiesce_is_released_once_its_connection_ends() {
    let mut guest = start();
    let mut rx = guest.quiesce_rx.take().expect("receiver");
    let mut c = connect(&guest).await;
    send(&mut c, &Request::QuiesceHold { timeout_ms: 3000 }).await;
    let Some(QuiesceRequest::Close {
        hold: true, reply, ..
    }) = timeout(GUARD, rx.recv()).await.expect("in time")
    else {
        panic!("a held quiesce");
    };
    let _ = reply.send(Quiesced {
        closed: vec!["browser".into()],
        complete: true,
        elapsed_ms: 3,
    });
    match recv(&mut c).await.expect("an answer").message {
        Response::Quiesced(q) => assert_eq!(q.closed, vec!["browser".to_owned()]),
        other => panic!("{other:?}"),
    }
    // Held while the connection stays open: nothing is released.
    assert!(
        timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "released while the hold was still open"
    );
    drop(c);
    match timeout(GUARD, rx.recv()).await.expect("in time") {
        Some(QuiesceRequest::Release) => {}
        other => panic!("expected the release, got {other:?}"),
    }
}

#[tokio::test]
async fn quiesce_without_a_runner_says_so() {
    let mut guest = start();
    drop(guest.quiesce_rx.take());
    let mut c = connect(&guest).await;
    let answer = ask(&mut c, &Request::Quiesce { timeout_ms: 100 }).await;
    assert_eq!(error_code(&answer), "quiesce_unavailable");
}

#[tokio::test]
async fn screenshot_and_activity_without_a_display_answer_anyway() {
    let guest = start();
    let mut c = connect(&guest).await;
    let shot = ask(
        &mut c,
        &Request::Screenshot {
            encoding: Default::default(),
        },
    )
    .await;
    assert_eq!(error_code(&shot), "screenshot_failed");
    match ask(&mut c, &Request::Activity).await {
        Response::Activity(a) => {
            assert_eq!(a.input_idle_ms, None);
            assert!(!a.busy);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn clipboard_without_a_display_is_refused_with_a_reason() {
    let guest = start();
    let mut c = connect(&guest).await;
    let answer = ask(&mut c, &Request::ClipboardGet).await;
    assert_eq!(error_code(&answer), "clipboard_failed");
    // The connection goes on serving.
    assert!(matches!(
        ask(&mut c, &Request::Hello).await,
        Response::Hello(_)
    ));
}
