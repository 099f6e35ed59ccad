//! Terminal sessions on the host, through the production code: the echo
//! round trip, the terminal as controlling terminal, resizes seen by
//! `stty size`, the exit status, and closing or dropping a session killing
//! every process of it (checked in `/proc` independently).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod exec_support;

use std::time::Duration;

use dormouse_protocol::exec::{PtyEvent, PtyOpen};
use dormouse_supervisor::exec::{self, PtySession};
use dormouse_supervisor::init::ChildExit;
use exec_support::{init, runner, status_of, token, wait_for, with_arg, Workspace, UID};

fn open_sh(rows: u16, cols: u16) -> PtyOpen {
    PtyOpen {
        argv: Some(vec!["/bin/sh".into()]),
        cwd: None,
        env: [("PS1".to_owned(), "$ ".to_owned())].into(),
        rows,
        cols,
    }
}

/// Reads until `needle` shows up in the output (kept in `seen`), at most
/// 10 s. `false` when the terminal closed first.
async fn read_until(session: &PtySession, seen: &mut Vec<u8>, needle: &str) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    loop {
        if String::from_utf8_lossy(seen).contains(needle) {
            return true;
        }
        let n = tokio::time::timeout_at(deadline, session.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {needle:?} after 10 s; output: {:?}",
                    String::from_utf8_lossy(seen)
                )
            })
            .expect("read");
        if n == 0 {
            return false;
        }
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Reads until the terminal closes (every process on it gone).
async fn read_to_end(session: &PtySession) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), session.read(&mut buf))
            .await
            .expect("terminal closes")
            .expect("read");
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn echo_round_trip_resize_and_exit() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let session = runner.open_pty(&open_sh(24, 80)).await.expect("opens");
    assert!(exec::open_terminals() >= 1);

    // The shell leads its own session and the terminal is its controlling
    // terminal (field 7 of stat, tty_nr, is set).
    let pid = session.pid();
    let (uid, sid, _) = status_of(pid).expect("shell runs");
    assert_eq!(uid, UID);
    assert_eq!(sid, pid, "session leader");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let tty_nr: i64 = after_comm
        .split_whitespace()
        .nth(4)
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(tty_nr, 0, "a controlling terminal");

    let mut seen = Vec::new();
    session
        .write_all(b"stty size; echo uid=$(id -u); test -O \"$(tty)\" && echo owned\n")
        .await
        .unwrap();
    assert!(read_until(&session, &mut seen, "24 80").await);
    assert!(read_until(&session, &mut seen, "uid=1000").await);
    assert!(
        read_until(&session, &mut seen, "owned\r\n").await,
        "the terminal belongs to the desktop user"
    );

    session.resize(50, 120).expect("resize");
    seen.clear();
    session.write_all(b"stty size\n").await.unwrap();
    assert!(read_until(&session, &mut seen, "50 120").await);
    assert!(session.resize(0, 10).is_err(), "bounded");

    // Echo: the input comes back as typed, the output as computed.
    seen.clear();
    session.write_all(b"echo round-$((40+2))\n").await.unwrap();
    assert!(read_until(&session, &mut seen, "echo round-$((40+2))").await);
    assert!(read_until(&session, &mut seen, "round-42").await);

    session.write_all(b"exit 5\n").await.unwrap();
    read_to_end(&session).await;
    let ended = session.close().await.expect("confirmed");
    assert_eq!(ended.exit, ChildExit::Code(5));
    assert_eq!(
        ended.to_event(),
        PtyEvent::PtyExit {
            exit_code: Some(5),
            signal: None,
            duration_ms: u64::try_from(ended.duration.as_millis()).unwrap()
        }
    );
}

#[tokio::test]
async fn closing_kills_every_process_of_the_session() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let session = runner.open_pty(&open_sh(24, 80)).await.expect("opens");
    let (a, b) = (token(), token());
    session
        .write_all(format!("sleep {a} & setsid sleep {b} &\n").as_bytes())
        .await
        .unwrap();
    wait_for(&a, 1).await;
    wait_for(&b, 1).await;
    let ended = session.close().await.expect("confirmed");
    assert!(
        ended.kill.killed >= 3,
        "shell and both sleeps: {:?}",
        ended.kill
    );
    assert_eq!(ended.exit, ChildExit::Signal(9));
    assert_eq!(with_arg(&a), Vec::<u32>::new());
    assert_eq!(with_arg(&b), Vec::<u32>::new());
}

#[tokio::test]
async fn a_shell_that_exits_takes_its_background_jobs_with_it() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let session = runner.open_pty(&open_sh(24, 80)).await.expect("opens");
    let a = token();
    session
        .write_all(format!("setsid sleep {a} </dev/null >/dev/null 2>&1 &\n").as_bytes())
        .await
        .unwrap();
    wait_for(&a, 1).await;
    session.write_all(b"exit\n").await.unwrap();
    read_to_end(&session).await;
    let ended = session.close().await.expect("confirmed");
    assert_eq!(ended.exit, ChildExit::Code(0));
    assert!(ended.kill.killed >= 1);
    assert_eq!(with_arg(&a), Vec::<u32>::new());
}

#[tokio::test]
async fn dropping_a_session_kills_it_in_the_background() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let session = runner.open_pty(&open_sh(24, 80)).await.expect("opens");
    let a = token();
    session
        .write_all(format!("setsid sleep {a} &\n").as_bytes())
        .await
        .unwrap();
    wait_for(&a, 1).await;
    drop(session);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !with_arg(&a).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "not killed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_default_program_is_a_login_shell() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let open = PtyOpen {
        argv: None,
        ..open_sh(24, 80)
    };
    let session = runner.open_pty(&open).await.expect("opens");
    let mut seen = Vec::new();
    session
        .write_all(b"echo \"term=$TERM shell=$0\"; pwd\n")
        .await
        .unwrap();
    assert!(read_until(&session, &mut seen, "term=xterm-256color shell=/bin/bash").await);
    assert!(read_until(&session, &mut seen, ws.path().to_str().unwrap()).await);
    session.close().await.expect("confirmed");
}
