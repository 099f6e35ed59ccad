//! Tests of the guest client against fake supervisors on temp sockets:
//! hostile sockets, frames and answers.

use std::os::unix::fs::symlink;

use dormouse_protocol::guest::ClipboardText;
use dormouse_protocol::{Activity, ContainerStartIdentity, FrameHeader, Phase};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixListener;

use super::*;

pub(crate) fn identity() -> ContainerStartIdentity {
    ContainerStartIdentity {
        boot_id: "b".into(),
        pid_ns_inode: 1,
        pid1_start_time: 2,
    }
}

pub(crate) fn status(ready: bool) -> GuestStatus {
    GuestStatus {
        phase: if ready { Phase::Ready } else { Phase::Starting },
        ready,
        ready_since: None,
        identity: identity(),
        services: vec![],
        health: None,
        problem: None,
        taskbar_height: None,
        start_phases: Default::default(),
    }
}

/// Accepts one connection and answers with `script(request)` raw bytes.
async fn serve_once(listener: UnixListener, script: impl Fn(&Request) -> Vec<u8> + Send + 'static) {
    let (mut stream, _) = listener.accept().await.expect("accept");
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.expect("read");
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Some((frame, used)) = frame::decode::<Request>(&buf).expect("decode") {
            buf.drain(..used);
            let reply = script(&frame.message);
            if stream.write_all(&reply).await.is_err() {
                return;
            }
        }
    }
}

fn hello_frame() -> Vec<u8> {
    frame::encode(
        &Response::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            supervisor_version: "t".into(),
            identity: identity(),
        }),
        &[],
    )
    .expect("encode")
}

#[tokio::test]
async fn a_well_behaved_guest_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    tokio::spawn(serve_once(listener, |req| match req {
        Request::Hello => hello_frame(),
        Request::Activity => frame::encode(
            &Response::Activity(Activity {
                input_idle_ms: Some(5),
                busy: false,
                busy_processes: vec![],
            }),
            &[],
        )
        .expect("encode"),
        _ => frame::encode(&Response::error("nope", "no"), &[]).expect("encode"),
    }));
    let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
    assert_eq!(
        conn.hello().await.expect("hello").protocol_version,
        PROTOCOL_VERSION
    );
    assert_eq!(
        conn.call(call::Activity)
            .await
            .expect("activity")
            .message
            .input_idle_ms,
        Some(5)
    );
    assert!(matches!(
        conn.call(call::Status).await,
        Err(GuestError::Refused { .. })
    ));
}

#[tokio::test]
async fn the_clipboard_is_its_text_and_bad_text_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let answers: [(bool, &'static [u8]); 3] = [
        (true, "copié".as_bytes()),
        (false, b""),
        (true, b"\xff\xfe"),
    ];
    for (i, (has_text, payload)) in answers.into_iter().enumerate() {
        let path = dir.path().join(format!("s{i}.sock"));
        let listener = UnixListener::bind(&path).expect("bind");
        tokio::spawn(serve_once(listener, move |req| {
            assert_eq!(req, &Request::ClipboardGet);
            let answer = Response::Clipboard {
                has_text,
                truncated: false,
            };
            frame::encode(&answer, payload).expect("encode")
        }));
        let got = GuestSocket::new(&path).call(call::ClipboardGet).await;
        let text = |answer: Frame<ClipboardText>| {
            answer
                .message
                .text(&answer.payload)
                .expect("checked")
                .map(str::to_owned)
        };
        match i {
            0 => assert_eq!(got.map(text).expect("text"), Some("copié".to_owned())),
            1 => assert_eq!(got.map(text).expect("no text"), None),
            _ => assert!(matches!(got, Err(GuestError::Frame(_))), "{got:?}"),
        }
    }
}

#[tokio::test]
async fn a_symlink_at_the_socket_path_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().join("real.sock");
    let _listener = UnixListener::bind(&real).expect("bind");
    let path = dir.path().join("supervisor.sock");
    symlink(&real, &path).expect("symlink");
    let err = GuestSocket::new(&path)
        .connect()
        .await
        .expect_err("refused");
    assert!(matches!(err, GuestError::Symlink(_)), "{err}");
    assert!(!err.is_not_up_yet());
}

#[tokio::test]
async fn a_regular_file_at_the_socket_path_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    std::fs::write(&path, "x").expect("write");
    let err = GuestSocket::new(&path)
        .connect()
        .await
        .expect_err("refused");
    assert!(matches!(err, GuestError::NotASocket(_)), "{err}");
}

#[tokio::test]
async fn a_socket_of_another_user_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    let _listener = UnixListener::bind(&path).expect("bind");
    let socket = GuestSocket {
        dir: RunDir {
            path: dir.path().to_owned(),
            allowed_uids: vec![4242],
        },
        ..GuestSocket::new(&path)
    };
    let err = socket.connect().await.expect_err("refused");
    assert!(matches!(err, GuestError::WrongOwner { uid, .. } if uid != 4242));
}

#[tokio::test]
async fn a_missing_socket_is_not_up_yet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = GuestSocket::new(dir.path().join("supervisor.sock"))
        .connect()
        .await
        .expect_err("missing");
    assert!(err.is_not_up_yet());
}

#[tokio::test]
async fn an_oversized_frame_is_refused_before_allocating() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    tokio::spawn(serve_once(listener, |_| {
        // Announces 4 GiB of JSON.
        vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]
    }));
    let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
    let err = conn.hello().await.expect_err("oversized");
    assert!(
        matches!(err, GuestError::Frame(FrameError::MessageTooLarge { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn garbage_and_wrong_kinds_and_payloads_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    tokio::spawn(serve_once(listener, |req| match req {
        Request::Hello => frame::frame_unchecked(br#"{"v":1,"kind":"launch_missiles"}"#, &[]),
        Request::Status => hello_frame(),
        _ => frame::encode(
            &Response::Activity(Activity {
                input_idle_ms: None,
                busy: false,
                busy_processes: vec![],
            }),
            b"sneaky",
        )
        .expect("encode"),
    }));
    let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
    assert!(matches!(
        conn.hello().await,
        Err(GuestError::Frame(FrameError::UnknownKind(_)))
    ));
    assert!(matches!(
        conn.call(call::Status).await,
        Err(GuestError::Unexpected { .. })
    ));
    assert!(matches!(
        conn.call(call::Activity).await,
        Err(GuestError::Frame(FrameError::Malformed(_)))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stalled_frame_times_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    tokio::spawn(serve_once(listener, |_| {
        // A header announcing 100 bytes, then nothing.
        FrameHeader {
            message_len: 100,
            payload_len: 0,
        }
        .to_bytes()
        .to_vec()
    }));
    let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
    let err = conn.hello().await.expect_err("stalls");
    assert!(matches!(err, GuestError::Timeout(..)), "{err}");
}

#[tokio::test]
async fn the_follower_streams_statuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    tokio::spawn(serve_once(listener, |req| match req {
        Request::Hello => hello_frame(),
        Request::Watch => {
            let mut out = frame::encode(&Response::Status(status(false)), &[]).expect("e");
            out.extend(frame::encode(&Response::Status(status(true)), &[]).expect("e"));
            out
        }
        _ => Vec::new(),
    }));
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let follower = tokio::spawn(follow(
        GuestSocket::new(&path),
        Duration::from_secs(5),
        move |u| {
            let tx = tx.clone();
            async move { tx.send(u).await.is_ok() }
        },
    ));
    assert!(matches!(rx.recv().await, Some(GuestUpdate::Connected(_))));
    assert!(matches!(rx.recv().await, Some(GuestUpdate::Status(s)) if !s.ready));
    assert!(matches!(rx.recv().await, Some(GuestUpdate::Status(s)) if s.ready));
    follower.abort();
}

#[tokio::test]
async fn guest_text_is_escaped_and_capped_on_arrival() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let evil = "\u{1b}]0;owned\u{7}\u{1b}[2J\u{202e}x\n2026 INFO dormouse::access: forged \
                😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈\
                😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈😈";
    let mut hostile = status(false);
    hostile.problem = Some(format!("{evil}{}", "y".repeat(10_000)));
    hostile.identity.boot_id = evil.into();
    hostile.services = (0..80)
        .map(|i| dormouse_protocol::ServiceState {
            name: format!("{evil}{i}"),
            state: dormouse_protocol::ServiceRunState::Failed,
            pid: None,
            restarts: 0,
            last_exit: Some(evil.into()),
            ready_since: None,
        })
        .collect();
    hostile.health = Some(dormouse_protocol::HealthReport::from_checks(
        (0..80)
            .map(|_| {
                dormouse_protocol::Check::new(evil, dormouse_protocol::CheckStatus::Fail, evil)
            })
            .collect(),
        chrono::Utc::now(),
    ));
    let reply = frame::encode(&Response::Status(hostile), &[]).expect("encode");
    let sent = reply.len();
    assert!(sent < dormouse_protocol::MAX_HEADER_LEN as usize, "{sent}");
    tokio::spawn(serve_once(listener, move |req| match req {
        Request::Status => reply.clone(),
        _ => frame::encode(&Response::error(evil, evil), &[]).expect("encode"),
    }));
    let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
    let got = conn.call(call::Status).await.expect("status").message;
    let clean = |s: &str| {
        assert!(
            !s.chars().any(frame::is_hazardous),
            "a hazardous character survived: {s:?}"
        );
        assert!(s.len() <= 300, "{} bytes", s.len());
    };
    clean(got.problem.as_deref().expect("problem"));
    clean(&got.identity.boot_id);
    assert!(got.services.len() <= 32, "{} services", got.services.len());
    for service in &got.services {
        clean(&service.name);
        clean(service.last_exit.as_deref().expect("last exit"));
    }
    let health = got.health.as_ref().expect("health");
    assert!(health.checks.len() <= 32, "{} checks", health.checks.len());
    for check in &health.checks {
        clean(&check.name);
        clean(&check.detail);
    }
    let stored = serde_json::to_vec(&got).expect("json").len();
    println!("a hostile status of {sent} bytes is kept as {stored} bytes");
    assert!(stored < 48 * 1024, "{stored} bytes kept");
    match conn.hello().await {
        Err(GuestError::Refused { code, message }) => {
            clean(&code);
            clean(&message);
        }
        other => panic!("{other:?}"),
    }
}

/// A guest root swaps its socket with a symlink to a trap socket as
/// fast as it can while the broker connects: no connection may reach the
/// trap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_swapped_for_a_link_never_leads_to_the_link() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&run).expect("run");
    std::fs::create_dir(&elsewhere).expect("elsewhere");
    let path = run.join("supervisor.sock");
    let real = UnixListener::bind(&path).expect("bind");
    let trap = UnixListener::bind(elsewhere.join("trap.sock")).expect("trap");
    symlink(elsewhere.join("trap.sock"), run.join("link")).expect("link");
    let counter = |listener: UnixListener| {
        let count = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&count);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                seen.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        count
    };
    let real_count = counter(real);
    let trap_count = counter(trap);

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = std::thread::spawn({
        let stop = Arc::clone(&stop);
        let run = std::fs::File::open(&run).expect("run dir");
        move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::SeqCst) {
                nix::fcntl::renameat2(
                    &run,
                    "supervisor.sock",
                    &run,
                    "link",
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                )
                .expect("exchange");
                swaps += 1;
            }
            swaps
        }
    });
    let socket = GuestSocket::new(&path);
    let (mut connected, mut refused, mut other, mut attempts) = (0, 0, 0, 0);
    // Hundreds of connects, until both outcomes were seen often enough
    // (the scheduler decides how the two threads interleave).
    while attempts < 500 || ((connected < 50 || refused < 50) && attempts < 20_000) {
        attempts += 1;
        match socket.connect().await {
            Ok(conn) => {
                connected += 1;
                drop(conn);
            }
            Err(GuestError::Symlink(_)) => refused += 1,
            Err(e) => {
                other += 1;
                eprintln!("other outcome: {e}");
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let swaps = swapper.join().expect("swapper");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let trapped = trap_count.load(Ordering::SeqCst);
    println!(
        "{attempts} connects during {swaps} swaps: {connected} to the socket, {refused} \
         refused as a link, {other} other errors, {trapped} through the link"
    );
    assert_eq!(trapped, 0, "connections reached the trap through the link");
    assert!(
        connected > 0 && refused > 0,
        "the race was not exercised: {connected} connected, {refused} refused"
    );
    assert_eq!(other, 0, "no other outcome");
    let served = Instant::now() + Duration::from_secs(5);
    while real_count.load(Ordering::SeqCst) < connected && Instant::now() < served {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(real_count.load(Ordering::SeqCst), connected);
}

/// A guest that hangs up right after `watch`, every time: the follower
/// pauses, longer each time, instead of reconnecting at once.
#[tokio::test(start_paused = true)]
async fn the_follower_backs_off_from_a_guest_that_hangs_up_without_a_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("supervisor.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let (times_tx, mut times_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = times_tx.send(Instant::now());
            let mut buf = Vec::new();
            'conn: loop {
                let mut chunk = [0u8; 512];
                let Ok(n) = stream.read(&mut chunk).await else {
                    break;
                };
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some((frame, used)) = frame::decode::<Request>(&buf).expect("decode") {
                    buf.drain(..used);
                    match frame.message {
                        Request::Hello => {
                            stream.write_all(&hello_frame()).await.expect("hello");
                        }
                        _ => break 'conn, // watch: hang up at once
                    }
                }
            }
        }
    });
    let follower = tokio::spawn(follow(
        GuestSocket::new(&path),
        Duration::from_secs(5),
        |_| async { true },
    ));
    let mut times = Vec::new();
    while times.len() < 8 {
        times.push(times_rx.recv().await.expect("a connection"));
    }
    follower.abort();
    let span = times[7] - times[0];
    let gaps: Vec<_> = times.windows(2).map(|w| w[1] - w[0]).collect();
    println!("8 connections over {span:?}: gaps {gaps:?}");
    assert!(
        span >= Duration::from_secs(10),
        "reconnected 7 times within {span:?}"
    );
    assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
}
