//! Exec and terminal sessions through the guest socket on the host, as the
//! broker speaks to it: the production accept loop with a runner for uid
//! 1000; stdin as the request's payload and output as the answer's; the
//! connection's end cancelling (every process confirmed gone, checked in
//! `/proc` independently); the connection reused after an exec; the
//! desktop busy while an exec runs; large frames only for exec kinds; a
//! terminal session's frames both ways.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod exec_support;

use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::exec::{ExecRequest, PtyEvent, PtyInput, PtyOpen};
use dormouse_protocol::frame::{frame_unchecked, Frame};
use dormouse_protocol::stream::{read_frame, write_frame, ReadLimits};
use dormouse_protocol::{ContainerStartIdentity, Request, Response};
use dormouse_supervisor::config::Config;
use dormouse_supervisor::socket;
use dormouse_supervisor::status::StatusCell;
use exec_support::{init, runner, token, wait_for, with_arg, Workspace};
use tokio::io::AsyncWriteExt as _;
use tokio::net::UnixStream;

const WAIT: Duration = Duration::from_secs(20);

struct Guest {
    _dir: tempfile::TempDir,
    _ws: Workspace,
    config: Arc<Config>,
    _server: tokio::task::JoinHandle<()>,
}

fn start() -> Guest {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = Workspace::new();
    let config = Arc::new(Config {
        run_dir: dir.path().join("run"),
        tmp_dir: dir.path().join("tmp"),
        busy_sample_ms: 5,
        probe_timeout_ms: 500,
        ..Config::default()
    });
    let cell = StatusCell::new(ContainerStartIdentity {
        boot_id: "boot".into(),
        pid_ns_inode: 1,
        pid1_start_time: 1,
    });
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let bound = socket::bind(&config).expect("bind");
    let exec = runner(&ws);
    let server = tokio::spawn({
        let config = Arc::clone(&config);
        async move {
            socket::accept_loop(
                &bound.listener,
                config,
                cell,
                tx,
                exec,
                dormouse_supervisor::egress::Hub::new(),
            )
            .await
        }
    });
    Guest {
        _dir: dir,
        _ws: ws,
        config,
        _server: server,
    }
}

async fn connect(guest: &Guest) -> UnixStream {
    UnixStream::connect(guest.config.socket_path())
        .await
        .expect("connect")
}

async fn send(c: &mut UnixStream, request: &Request, payload: &[u8]) {
    write_frame(c, request, payload, WAIT).await.expect("send");
}

async fn recv(c: &mut UnixStream) -> Frame<Response> {
    read_frame(c, &ReadLimits::new(Some(WAIT), WAIT))
        .await
        .expect("an answer")
}

fn result_of(frame: Frame<Response>) -> dormouse_protocol::exec::ExecResult {
    match frame.message {
        Response::ExecResult(head) => head.join(frame.payload).expect("payload fits"),
        other => panic!("not an exec result: {other:?}"),
    }
}

#[tokio::test]
async fn exec_carries_stdin_and_output_as_payloads_and_the_connection_goes_on() {
    if !init() {
        return;
    }
    let guest = start();
    let mut c = connect(&guest).await;
    let (head, stdin) = {
        let mut r = ExecRequest::shell("cat; echo err >&2; id -u >&2");
        r.stdin = Some(b"\x00\xffbytes".to_vec());
        r.into_frame()
    };
    send(&mut c, &Request::Exec(head), &stdin).await;
    let r = result_of(recv(&mut c).await);
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout, b"\x00\xffbytes");
    assert_eq!(r.stderr, b"err\n1000\n");
    // The same connection serves the next request.
    send(&mut c, &Request::Hello, &[]).await;
    assert!(matches!(recv(&mut c).await.message, Response::Hello(_)));
    // A refusal is an error answer, and the connection stays.
    send(&mut c, &Request::Exec(ExecRequest::argv(["/no/such"])), &[]).await;
    match recv(&mut c).await.message {
        Response::Error { code, .. } => assert_eq!(code, "not_found"),
        other => panic!("{other:?}"),
    }
    send(&mut c, &Request::Hello, &[]).await;
    assert!(matches!(recv(&mut c).await.message, Response::Hello(_)));
}

#[tokio::test]
async fn a_vanished_client_kills_the_exec_and_the_desktop_is_busy_meanwhile() {
    if !init() {
        return;
    }
    let guest = start();
    let t = token();
    let mut c = connect(&guest).await;
    let command = format!("sleep {t} & setsid sleep {t} & sleep {t}");
    send(&mut c, &Request::Exec(ExecRequest::shell(command)), &[]).await;
    wait_for(&t, 3).await;
    // While it runs the desktop is busy, whatever its CPU use.
    let mut other = connect(&guest).await;
    send(&mut other, &Request::Activity, &[]).await;
    match recv(&mut other).await.message {
        Response::Activity(a) => assert!(a.busy, "an exec runs: busy"),
        other => panic!("{other:?}"),
    }
    drop(c);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !with_arg(&t).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running after the client left: {:?}",
            with_arg(&t)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn large_frames_are_for_exec_kinds_only() {
    if !init() {
        return;
    }
    let guest = start();
    // A large exec request (a long command) is read and run.
    let mut c = connect(&guest).await;
    let long = format!("echo {}", "x".repeat(100_000));
    send(&mut c, &Request::Exec(ExecRequest::shell(long)), &[]).await;
    let r = result_of(recv(&mut c).await);
    assert_eq!(r.stdout.len(), 100_001);
    // The same size for another kind is refused, and the connection closed.
    let mut c = connect(&guest).await;
    let pad = "x".repeat(100_000);
    let json = format!(r#"{{"v":1,"kind":"hello","pad":"{pad}"}}"#);
    c.write_all(&frame_unchecked(json.as_bytes(), &[]))
        .await
        .expect("write");
    match recv(&mut c).await.message {
        Response::Error { code, .. } => assert_eq!(code, "message_too_large"),
        other => panic!("{other:?}"),
    }
    // A payload only on exec: on `status` it is refused.
    let mut c = connect(&guest).await;
    c.write_all(&frame_unchecked(br#"{"v":1,"kind":"status"}"#, b"abc"))
        .await
        .expect("write");
    match recv(&mut c).await.message {
        Response::Error { code, .. } => assert_eq!(code, "payload_too_large"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_terminal_session_moves_frames_both_ways_and_ends_with_its_exit() {
    if !init() {
        return;
    }
    let guest = start();
    let mut c = connect(&guest).await;
    let open = PtyOpen {
        argv: Some(vec!["/bin/sh".into()]),
        cwd: None,
        env: [("PS1".to_owned(), "$ ".to_owned())].into(),
        rows: 24,
        cols: 80,
    };
    send(&mut c, &Request::PtyOpen(open), &[]).await;
    match recv(&mut c).await.message {
        Response::PtyOpened { pid, .. } => assert!(pid > 0),
        other => panic!("{other:?}"),
    }
    for frame in [
        PtyInput::PtyResize { rows: 33, cols: 99 },
        PtyInput::PtyData {
            data: b"stty size; exit 7\r".to_vec(),
        },
    ] {
        write_frame(&mut c, &frame, &[], WAIT).await.expect("input");
    }
    let mut seen = Vec::new();
    let limits = ReadLimits {
        max_message: 256 * 1024,
        ..ReadLimits::new(Some(WAIT), WAIT)
    };
    loop {
        let event: Frame<PtyEvent> = read_frame(&mut c, &limits).await.expect("event");
        match event.message {
            PtyEvent::PtyOutput { data } => seen.extend_from_slice(&data),
            PtyEvent::PtyExit { exit_code, .. } => {
                assert_eq!(exit_code, Some(7));
                break;
            }
        }
    }
    assert!(
        String::from_utf8_lossy(&seen).contains("33 99"),
        "{:?}",
        String::from_utf8_lossy(&seen)
    );
}
