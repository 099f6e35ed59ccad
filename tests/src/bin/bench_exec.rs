//! `dormouse-bench-exec`: the round trip of `true` in a desktop, three ways
//! in the same run, interleaved: through the broker's API
//! (`POST /v1/computers/{id}/exec`), through the guest socket directly (the
//! supervisor's `exec` request, no broker), and `docker exec <c> true`.
//!
//! A benchmark, not a test: it prints p50/p95/min and the ratio of the API
//! to `docker exec` beside the target (≤ 0.3) and never asserts them. The
//! desktop it makes is removed when it ends (the broker guard removes its
//! labelled containers when dropped).

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{EventStream, Waits as _};
use dormouse_e2e::latency::{ms, Samples};
use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::exec::ExecRequest;
use dormouse_protocol::frame::{self, Frame, FrameHeader, HEADER_LEN};
use dormouse_protocol::{Request, Response};
use tokio::time::Instant;

/// Target of the API's round trip against `docker exec` (printed, not
/// asserted).
const TARGET_RATIO: f64 = 0.3;
const READY_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Debug, Parser)]
#[command(about = "Round trip of `true` in a desktop: API, guest socket, docker exec")]
struct Args {
    /// Rounds of each (after 5 of each to warm up).
    #[arg(long, default_value_t = 50)]
    rounds: usize,
}

/// One `exec` of `true` straight on the guest socket.
fn guest_true(socket: &PathBuf) -> Result<()> {
    let mut conn = UnixStream::connect(socket).context("connecting to the guest socket")?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let bytes = frame::encode(&Request::Exec(ExecRequest::argv(["true"])), &[])?;
    conn.write_all(&bytes)?;
    let mut head = [0u8; HEADER_LEN];
    conn.read_exact(&mut head)?;
    let header = FrameHeader::parse(head)?;
    let len = usize::try_from(header.message_len)? + usize::try_from(header.payload_len)?;
    let mut rest = vec![0u8; len];
    conn.read_exact(&mut rest)?;
    let mut whole = head.to_vec();
    whole.extend_from_slice(&rest);
    match frame::decode::<Response>(&whole)? {
        Some((
            Frame {
                message: Response::ExecResult(head),
                ..
            },
            _,
        )) => {
            ensure!(
                head.exit_code == Some(0),
                "true exited {:?}",
                head.exit_code
            );
            Ok(())
        }
        other => bail!("unexpected answer {other:?}"),
    }
}

async fn run(args: Args) -> Result<()> {
    let image =
        std::env::var("DORMOUSE_TEST_IMAGE").unwrap_or_else(|_| "dormouse/desktop:latest".into());
    let broker = BrokerProcess::start(BrokerOptions::new(&image)).await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let created = api
        .create(&CreateComputer {
            name: Some("bench-exec".into()),
            ..CreateComputer::default()
        })
        .await?;
    let id = created.id;
    api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
    let container = format!("dormouse-{id}");
    let socket = broker
        .data_dir()
        .join("computers")
        .join(id.to_string())
        .join("run")
        .join(dormouse_protocol::SOCKET_FILE_NAME);
    let request = ExecRequest::argv(["true"]);

    let (mut through_api, mut through_socket, mut through_docker) =
        (Samples::new(), Samples::new(), Samples::new());
    for round in 0..args.rounds + 5 {
        let warm = round >= 5;
        let t = Instant::now();
        let r = api.exec(id, &request, false).await?;
        ensure!(r.exit_code == Some(0), "{r:?}");
        if warm {
            through_api.push(t.elapsed());
        }
        let t = Instant::now();
        let path = socket.clone();
        tokio::task::spawn_blocking(move || guest_true(&path)).await??;
        if warm {
            through_socket.push(t.elapsed());
        }
        let t = Instant::now();
        let out = tokio::process::Command::new("docker")
            .args(["exec", &container, "true"])
            .output()
            .await?;
        ensure!(out.status.success(), "docker exec failed");
        if warm {
            through_docker.push(t.elapsed());
        }
    }
    println!(
        "round trip of `true`, {} rounds each, interleaved",
        args.rounds
    );
    println!("{:<22} {:>10} {:>10} {:>10}", "", "p50", "p95", "min");
    for (name, s) in [
        ("API (POST …/exec)", &through_api),
        ("guest socket", &through_socket),
        ("docker exec", &through_docker),
    ] {
        println!(
            "{name:<22} {:>10} {:>10} {:>10}",
            ms(s.p50()),
            ms(s.p95()),
            ms(s.min())
        );
    }
    if let (Some(a), Some(d)) = (through_api.p50(), through_docker.p50()) {
        let ratio = a.as_secs_f64() / d.as_secs_f64();
        println!(
            "API / docker exec (p50): {ratio:.3} (target ≤ {TARGET_RATIO}: {})",
            if ratio <= TARGET_RATIO {
                "met"
            } else {
                "missed"
            }
        );
    }
    if let (Some(g), Some(d)) = (through_socket.p50(), through_docker.p50()) {
        println!(
            "guest socket / docker exec (p50): {:.3}",
            g.as_secs_f64() / d.as_secs_f64()
        );
    }
    drop(broker);
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dormouse-bench-exec: {e:#}");
            ExitCode::FAILURE
        }
    }
}
