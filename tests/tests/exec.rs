//! End-to-end: commands in a desktop through a real `dormoused`, the real
//! engine and the real image, driven only through the broker's API
//! (`POST /v1/computers/{id}/exec`, the terminal WebSocket), with
//! `docker exec … ps` and the workspace on the host as independent
//! witnesses that what should be gone is gone and what should not have run
//! did not.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use dormouse_client::TerminalEvent;
use dormouse_e2e::broker::{memory_kib, ready_desktop, BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{ApiClient, ClientError, EventStream, Waits as _};
use dormouse_e2e::engine;
use dormouse_e2e::test_image;
use dormouse_protocol::api::{ContainerState, CreateComputer, LeaseRequest, StopReason};
use dormouse_protocol::exec::{ExecRequest, ExecResultBody};
use tokio::io::AsyncWriteExt as _;
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

fn container(id: Uuid) -> String {
    format!("dormouse-{id}")
}

/// Every process's command line in the guest, as `ps` sees it.
async fn guest_ps(id: Uuid) -> Result<String> {
    engine::docker_ok(&["exec", &container(id), "ps", "-eo", "pid,user,args"]).await
}

/// Waits (at most 10 s) until no process in the guest has `needle` in its
/// command line; fails with the process list.
async fn wait_gone(id: Uuid, needle: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ps = guest_ps(id).await?;
        if !ps.lines().any(|l| l.contains(needle)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{needle:?} still runs in the guest:\n{ps}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_running(id: Uuid, needle: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ps = guest_ps(id).await?;
        if ps.lines().any(|l| l.contains(needle)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{needle:?} never showed up in the guest:\n{ps}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn sh(command: &str) -> ExecRequest {
    ExecRequest::shell(command)
}

fn api_code(e: &ClientError) -> Option<(u16, &str)> {
    match e {
        ClientError::Api { status, code, .. } => Some((status.as_u16(), code.as_str())),
        _ => None,
    }
}

async fn exec(api: &ApiClient, id: Uuid, request: &ExecRequest) -> Result<ExecResultBody> {
    Ok(api.exec(id, request, false).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Over 100 lines on purpose: one real-engine test told in order (set up,
// act, witness, clean up); its steps share the desktop and the witnesses,
// and apart the order a reader must check would be spread over helpers.
async fn exec_runs_as_the_desktop_user_and_ends_confirmed() -> Result<()> {
    let Some(image) = test_image("exec_runs_as_the_desktop_user_and_ends_confirmed") else {
        return Ok(());
    };
    let (broker, api, id) = ready_desktop(&image, "exec-api").await?;
    let result = async {
        // Who, where, exit codes, signals.
        let r = exec(&api, id, &ExecRequest::argv(["id", "-u"])).await?;
        ensure!(r.stdout == "1000\n" && r.exit_code == Some(0), "{r:?}");
        let r = exec(&api, id, &sh("pwd; echo $DISPLAY")).await?;
        ensure!(r.stdout == "/home/desk/workspace\n:1\n", "{r:?}");
        let r = exec(&api, id, &sh("echo oops >&2; exit 3")).await?;
        ensure!(r.exit_code == Some(3) && r.stderr == "oops\n" && r.signal.is_none(), "{r:?}");
        let r = exec(&api, id, &sh("kill -TERM $$")).await?;
        ensure!(r.exit_code.is_none() && r.signal.as_deref() == Some("SIGTERM"), "{r:?}");

        // stdin, non-UTF-8 output (lossy and base64), output over the cap.
        let mut cat = ExecRequest::argv(["cat"]);
        cat.stdin = Some(b"line one\nline two\n".to_vec());
        let r = exec(&api, id, &cat).await?;
        ensure!(r.stdout == "line one\nline two\n", "{r:?}");
        let bytes = sh(r"printf 'ok\377\376'");
        let r = exec(&api, id, &bytes).await?;
        ensure!(r.stdout == "ok\u{fffd}\u{fffd}", "lossy: {r:?}");
        let r = api.exec(id, &bytes, true).await?;
        let raw = base64::engine::general_purpose::STANDARD.decode(&r.stdout)?;
        ensure!(raw == b"ok\xff\xfe", "base64: {r:?}");
        let mut big = sh("head -c 5000 /dev/zero; head -c 10 /dev/zero >&2");
        big.max_output_bytes = 1000;
        let r = exec(&api, id, &big).await?;
        ensure!(
            r.stdout.len() == 1000 && r.stdout_truncated && !r.stderr_truncated && r.stderr.len() == 10,
            "truncation: out {} {} err {} {}",
            r.stdout.len(),
            r.stdout_truncated,
            r.stderr.len(),
            r.stderr_truncated
        );

        // A timeout kills the grandchild too; `ps` in the guest is the witness.
        let mut slow = sh("sleep 600 & sleep 600");
        slow.timeout_ms = 1000;
        let started = std::time::Instant::now();
        let r = exec(&api, id, &slow).await?;
        ensure!(r.timed_out && r.signal.as_deref() == Some("SIGKILL"), "{r:?}");
        ensure!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
        let ps = guest_ps(id).await?;
        ensure!(!ps.contains("sleep 600"), "after the timeout:\n{ps}");

        // A caller that goes away mid-command: the HTTP connection is
        // dropped, the command and what it started are killed.
        let body = serde_json::to_vec(&sh("sleep 601 & sleep 602"))?;
        let mut conn = tokio::net::TcpStream::connect(broker.addr()).await?;
        let head = format!(
            "POST /v1/computers/{id}/exec HTTP/1.1\r\nHost: dormouse\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            broker.token(),
            body.len()
        );
        conn.write_all(head.as_bytes()).await?;
        conn.write_all(&body).await?;
        wait_running(id, "sleep 602").await?;
        drop(conn);
        wait_gone(id, "sleep 60").await?;

        // Bad requests change nothing: 400; unknown computer 404.
        let bad = ExecRequest {
            argv: Some(vec!["true".into()]),
            ..sh("touch /home/desk/workspace/never-both")
        };
        let e = api.exec(id, &bad, false).await.expect_err("both forms");
        ensure!(api_code(&e) == Some((400, "bad_request")), "{e}");
        let e = api.exec(Uuid::new_v4(), &sh("true"), false).await.expect_err("unknown");
        ensure!(api_code(&e) == Some((404, "not_found")), "{e}");
        let e = api
            .exec(id, &ExecRequest::argv(["/no/such/program"]), false)
            .await
            .expect_err("missing program");
        ensure!(api_code(&e) == Some((400, "bad_request")), "{e}");

        // The fence: under a live lease, a call without the generation or
        // with a stale one is refused and runs nothing.
        let grant = api
            .lease(
                id,
                &LeaseRequest {
                    holder: "exec-test".into(),
                    ttl_ms: 60_000,
                },
            )
            .await?;
        let marker = "/home/desk/workspace/fenced-marker";
        let touch = sh(&format!("touch {marker}"));
        // Without one the live lease answers, as for every mutating call.
        let e = api.exec(id, &touch, false).await.expect_err("no generation");
        ensure!(api_code(&e) == Some((409, "lease_held")), "{e}");
        let stale = api.with_generation(Some(grant.generation + 7));
        let e = stale.exec(id, &touch, false).await.expect_err("stale generation");
        ensure!(api_code(&e) == Some((409, "stale_generation")), "{e}");
        let host_marker = broker.workspace(id).join("fenced-marker");
        ensure!(!host_marker.exists(), "a fenced exec ran");
        let witness = engine::docker(&["exec", &container(id), "test", "-e", marker]).await?;
        ensure!(!witness.status.success(), "a fenced exec ran (guest witness)");
        let current = api.with_generation(Some(grant.generation));
        let r = current.exec(id, &touch, false).await?;
        ensure!(r.exit_code == Some(0), "{r:?}");
        ensure!(host_marker.exists(), "the current generation's exec did not run");

        // Not running: 409 wrong_state.
        current.stop(id).await?;
        let e = current.exec(id, &sh("true"), false).await.expect_err("stopped");
        ensure!(api_code(&e) == Some((409, "wrong_state")), "{e}");
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("--- dormoused log ---\n{}", broker.log_tail(6000));
    }
    result
}

/// Reads terminal output until `needle` shows up (10 s at most).
async fn read_until(
    output: &mut dormouse_client::TerminalOutput,
    seen: &mut Vec<u8>,
    needle: &str,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(seen).contains(needle) {
        let event = tokio::time::timeout_at(deadline, output.next())
            .await
            .with_context(|| {
                format!(
                    "no {needle:?} within 10 s; output: {:?}",
                    String::from_utf8_lossy(seen)
                )
            })??;
        match event {
            Some(TerminalEvent::Output(bytes)) => seen.extend_from_slice(&bytes),
            other => bail!("the terminal ended before {needle:?}: {other:?}"),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_websocket_echoes_resizes_and_kills_on_close() -> Result<()> {
    let Some(image) = test_image("the_terminal_websocket_echoes_resizes_and_kills_on_close") else {
        return Ok(());
    };
    let (broker, api, id) = ready_desktop(&image, "exec-ws").await?;
    let result = async {
        let argv = vec!["/bin/sh".to_owned()];
        let terminal = api.exec_ws(id, 24, 80, &argv).await?;
        let (mut input, mut output) = (terminal.input, terminal.output);
        let mut seen = Vec::new();
        input.send(b"echo ready-$((40+2))\r").await?;
        read_until(&mut output, &mut seen, "ready-42").await?;
        input.send(b"id -u\r").await?;
        read_until(&mut output, &mut seen, "1000").await?;
        input.resize(50, 132).await?;
        input.send(b"stty size\r").await?;
        read_until(&mut output, &mut seen, "50 132").await?;

        // A session's processes go when the socket closes.
        input.send(b"sleep 701 & sleep 702\r").await?;
        wait_running(id, "sleep 702").await?;
        drop(input);
        drop(output);
        wait_gone(id, "sleep 70").await?;

        // The process's own exit ends the session with its status.
        let terminal = api.exec_ws(id, 24, 80, &argv).await?;
        let (mut input, mut output) = (terminal.input, terminal.output);
        input.send(b"exit 5\r").await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, output.next()).await?? {
                Some(TerminalEvent::Output(_)) => {}
                Some(TerminalEvent::Exit { exit_code, .. }) => {
                    ensure!(exit_code == Some(5), "exit {exit_code:?}");
                    break;
                }
                other => bail!("unexpected {other:?}"),
            }
        }

        // Unknown computer: refused at the handshake.
        let e = api
            .exec_ws(Uuid::new_v4(), 24, 80, &argv)
            .await
            .expect_err("unknown");
        ensure!(api_code(&e) == Some((404, "not_found")), "{e}");
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("--- dormoused log ---\n{}", broker.log_tail(6000));
    }
    result
}

/// The engine's word on whether the desktop's container runs.
async fn engine_status(id: Uuid) -> Result<String> {
    Ok(engine::inspect(&container(id))
        .await?
        .map_or_else(|| "missing".to_owned(), |f| f.status))
}

/// A person typing into the terminal WebSocket is using the desktop: with a
/// 20 s idle window, two and a half windows of keystrokes (and nothing on
/// the X display) never get it stopped; the same terminal left open and
/// untouched does not hold it, and the idle stop comes within a window.
/// The engine (`docker inspect`) is the witness of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_into_a_terminal_keeps_the_desktop_from_idling() -> Result<()> {
    let Some(image) = test_image("typing_into_a_terminal_keeps_the_desktop_from_idling") else {
        return Ok(());
    };
    const WINDOW: Duration = Duration::from_secs(20);
    let broker = BrokerProcess::start(BrokerOptions {
        idle_timeout: Some("20s".into()),
        ..BrokerOptions::new(&image)
    })
    .await?;
    let api = broker.client();
    let result = async {
        let mut events = EventStream::open(&api).await?;
        let id = api
            .create(&CreateComputer {
                name: Some("typing".into()),
                ..CreateComputer::default()
            })
            .await?
            .id;
        api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
        let terminal = api.exec_ws(id, 24, 80, &["/bin/sh".to_owned()]).await?;
        let (mut input, mut output) = (terminal.input, terminal.output);
        let mut seen = Vec::new();
        let typing = tokio::time::Instant::now();
        let mut n = 0u32;
        while typing.elapsed() < WINDOW * 5 / 2 {
            n += 1;
            // A shell builtin: no process, no CPU, only keystrokes.
            input.send(format!("echo tick-{n}\r").as_bytes()).await?;
            read_until(&mut output, &mut seen, &format!("tick-{n}")).await?;
            let status = engine_status(id).await?;
            ensure!(
                status == "running",
                "stopped after {:?} of typing: the engine says {status}",
                typing.elapsed()
            );
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        eprintln!("{n} lines typed over {:?}: still running", typing.elapsed());

        // Open but untouched: the idle stop comes.
        let quiet = tokio::time::Instant::now();
        let stopped = api
            .wait_for(&mut events, id, "the idle stop", WINDOW * 3, |s| {
                s.container == ContainerState::Stopped && s.stop_reason.is_some()
            })
            .await?;
        ensure!(
            stopped.status.stop_reason == Some(StopReason::Idle),
            "{:?}",
            stopped.status
        );
        let status = engine_status(id).await?;
        ensure!(status != "running", "the engine says {status}");
        eprintln!("idle stop {:?} after the last keystroke", quiet.elapsed());
        drop(input);
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("--- dormoused log ---\n{}", broker.log_tail(6000));
    }
    result
}

/// The broker's resident set now and its high-water mark, in MiB.
fn broker_rss_mib(broker: &BrokerProcess) -> Result<(u64, u64)> {
    let (rss, hwm) = memory_kib(broker.pid().context("the broker's pid")?)?;
    Ok((rss / 1024, hwm / 1024))
}

/// The bound the broker's peak resident set stays under while four execs
/// stream 1 GiB of NULs each to both stdout and stderr, 8 MiB kept of
/// each stream (before the answer was streamed and exec output budgeted,
/// the same load took it to 500 MB and more).
const EXEC_FLOOD_PEAK_MIB: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_output_floods_cost_the_broker_bounded_memory() -> Result<()> {
    let Some(image) = test_image("exec_output_floods_cost_the_broker_bounded_memory") else {
        return Ok(());
    };
    let (broker, api, id) = ready_desktop(&image, "exec-flood").await?;
    let result = async {
        let (rss_before, peak_before) = broker_rss_mib(&broker)?;
        let mut flood = sh("head -c 1073741824 /dev/zero & head -c 1073741824 /dev/zero >&2; wait");
        flood.max_output_bytes = 8 << 20;
        flood.timeout_ms = 300_000;
        let started = tokio::time::Instant::now();
        let runs: Vec<_> = (0..4)
            .map(|_| {
                let (api, flood) = (api.clone(), flood.clone());
                tokio::spawn(async move { api.exec(id, &flood, false).await })
            })
            .collect();
        for run in runs {
            let r = run.await??;
            ensure!(
                r.exit_code == Some(0) && r.stdout_truncated && r.stderr_truncated,
                "{:?} {:?}",
                r.exit_code,
                r.signal
            );
            ensure!(
                r.stdout.len() == 8 << 20 && r.stdout.bytes().all(|b| b == 0),
                "stdout of {} bytes",
                r.stdout.len()
            );
            ensure!(
                r.stderr.len() == 8 << 20,
                "stderr of {} bytes",
                r.stderr.len()
            );
        }
        let took = started.elapsed();
        let (rss_after, peak) = broker_rss_mib(&broker)?;
        eprintln!(
            "4 execs x 2 x 1 GiB in {took:?}: broker RSS {rss_before} MiB before \
             (peak {peak_before}), {rss_after} MiB after, peak {peak} MiB \
             (bound {EXEC_FLOOD_PEAK_MIB} MiB)"
        );
        ensure!(
            peak < EXEC_FLOOD_PEAK_MIB,
            "the broker's peak RSS reached {peak} MiB"
        );
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("--- dormoused log ---\n{}\n---", broker.log_tail(8000));
    }
    result
}
