//! Benchmark (not a test) of the broker's egress relay: a large download by
//! `curl` in a desktop through the relay from a host loopback server beside
//! the same transfer by `curl` directly on the host's loopback, in the same
//! run; the connection-setup time of small requests through the proxy
//! against direct (p50/p99 of curl's `time_total`); the broker's CPU per GiB
//! from `/proc/<pid>/stat` (utime + stime); and another desktop's status
//! latency (p50/p99 of `GET /v1/computers/{id}`) while nothing else runs
//! beside the same while a hostile program in the first desktop floods its
//! proxy ([`dormouse_e2e::hostile::EGRESS_ATTACK_PY`]).

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::ApiClient;
use dormouse_e2e::client::{create_ready, is_ready, EventStream};
use dormouse_e2e::hostile::EGRESS_ATTACK_PY;
use dormouse_e2e::latency::Samples;
use dormouse_protocol::egress_policy::{EgressMode, EgressPolicy};
use dormouse_protocol::exec::ExecRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Serves `/big` (`size` bytes) and anything else as two bytes.
async fn server(size: u64) -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let port = l.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|x| x == b"\r\n\r\n") && head.len() < 65536 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let big = head.windows(5).any(|x| x == b" /big");
                let len = if big { size } else { 2 };
                let h = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                if s.write_all(h.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![0x5au8; 1 << 20];
                let mut left = len;
                while left > 0 {
                    let n = usize::try_from(left.min(1 << 20)).unwrap_or(1 << 20);
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            });
        }
    });
    Ok(port)
}

fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    let out = Command::new("getconf").arg("CLK_TCK").output()?;
    let hz: f64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    Ok(ticks / hz)
}

fn percentile(v: &mut [f64], p: usize) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() * p / 100).min(v.len() - 1)]
}

fn times(text: &str) -> Vec<f64> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

async fn run() -> Result<()> {
    let mib: u64 = std::env::var("DORMOUSE_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let size = mib << 20;
    let image =
        std::env::var("DORMOUSE_TEST_IMAGE").unwrap_or_else(|_| "dormouse/desktop:latest".into());
    let port = server(size).await?;
    let hosts = std::env::temp_dir().join(format!(
        "dormouse-bench-egress-{}.hosts",
        std::process::id()
    ));
    std::fs::write(&hosts, "127.0.0.1 bench.test echo.test\n")?;
    let mut options = BrokerOptions::new(&image);
    options.extra_args = vec!["--egress-hosts".into(), hosts.display().to_string()];
    let broker = BrokerProcess::start(options).await;
    let _ = std::fs::remove_file(&hosts);
    let broker = broker?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "bench-egress", READY_TIMEOUT).await?;
    let pid = broker.pid().context("broker pid")?;
    api.set_egress(
        id,
        &EgressPolicy {
            mode: EgressMode::Allowlist,
            allow: vec![format!("127.0.0.1/32:{port}").parse()?],
            deny: Vec::new(),
        },
    )
    .await?;
    let exec = |script: String| {
        let api = api.clone();
        async move {
            let mut r = ExecRequest::shell(script);
            r.timeout_ms = 600_000;
            let out = api.exec(id, &r, false).await?;
            ensure!(out.exit_code == Some(0), "{}{}", out.stdout, out.stderr);
            Ok::<_, anyhow::Error>(out.stdout)
        }
    };
    let big = format!("curl -sS -o /dev/null -w '%{{time_total}}\\n' http://bench.test:{port}/big");
    let cpu0 = cpu_seconds(pid)?;
    let relay = times(&exec(big.clone()).await?);
    let cpu = cpu_seconds(pid)? - cpu0;
    let direct_out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "curl -sS -o /dev/null -w '%{{time_total}}\\n' http://127.0.0.1:{port}/big"
        ))
        .output()?;
    let direct = times(&String::from_utf8_lossy(&direct_out.stdout));
    ensure!(
        relay.len() == 1 && direct.len() == 1,
        "{relay:?} {direct:?}"
    );
    let small = |url: String| {
        format!("for i in $(seq 200); do curl -sS -o /dev/null -w '%{{time_total}}\\n' {url}; done")
    };
    let mut via = times(&exec(small(format!("http://bench.test:{port}/small"))).await?);
    let d = Command::new("sh")
        .arg("-c")
        .arg(small(format!("http://127.0.0.1:{port}/small")))
        .output()?;
    let mut dir_t = times(&String::from_utf8_lossy(&d.stdout));
    ensure!(
        via.len() == 200 && dir_t.len() == 200,
        "{} {}",
        via.len(),
        dir_t.len()
    );
    let gib = size as f64 / f64::from(1u32 << 30);
    let mibs = |t: f64| size as f64 / f64::from(1u32 << 20) / t;
    let (r, dr) = (mibs(relay[0]), mibs(direct[0]));
    println!("| measure | through the relay | direct on loopback | target |");
    println!("|---|---|---|---|");
    println!(
        "| {mib} MiB download | {r:.0} MiB/s | {dr:.0} MiB/s | relay >= half ({:.2}) |",
        r / dr
    );
    let (vp50, vp99) = (
        percentile(&mut via, 50) * 1e3,
        percentile(&mut via, 99) * 1e3,
    );
    let (dp50, dp99) = (
        percentile(&mut dir_t, 50) * 1e3,
        percentile(&mut dir_t, 99) * 1e3,
    );
    println!(
        "| small request p50 | {vp50:.2} ms | {dp50:.2} ms | added <= 5 ms ({:.2}) |",
        vp50 - dp50
    );
    println!(
        "| small request p99 | {vp99:.2} ms | {dp99:.2} ms | added {:.2} ms |",
        vp99 - dp99
    );
    println!("| broker CPU | {:.2} s per GiB | - | - |", cpu / gib);
    let other = create_ready(&api, &mut events, "bench-egress-bystander", READY_TIMEOUT).await?;
    let quiet = poll_status(&api, other, || false, BYSTANDER_QUIET).await?;
    let attack = tokio::spawn(exec(format!(
        "python3 - {port} <<'EOF'\n{EGRESS_ATTACK_PY}EOF"
    )));
    let flooded = poll_status(&api, other, || attack.is_finished(), BYSTANDER_MAX).await?;
    let report = attack.await??;
    ensure!(
        report.contains("codes="),
        "the attack did not finish: {report}"
    );
    let ms = |s: &Samples, p: f64| s.percentile(p).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    println!();
    println!("| another desktop's status | quiet | during a hostile flood | target |");
    println!("|---|---|---|---|");
    println!(
        "| p50 ({} / {} polls) | {:.2} ms | {:.2} ms | - |",
        quiet.len(),
        flooded.len(),
        ms(&quiet, 50.0),
        ms(&flooded, 50.0)
    );
    println!(
        "| p99 | {:.2} ms | {:.2} ms | under 20 ms |",
        ms(&quiet, 99.0),
        ms(&flooded, 99.0)
    );
    Ok(())
}

/// How long the bystander is polled with nothing else running.
const BYSTANDER_QUIET: Duration = Duration::from_secs(10);
/// The longest the bystander is polled during the attack.
const BYSTANDER_MAX: Duration = Duration::from_secs(120);

/// Polls `id`'s status every 20 ms until `done` or `max`; every answer
/// must say ready.
async fn poll_status(
    api: &ApiClient,
    id: uuid::Uuid,
    done: impl Fn() -> bool,
    max: Duration,
) -> Result<Samples> {
    let mut samples = Samples::new();
    let started = Instant::now();
    while !done() && started.elapsed() < max {
        let t = Instant::now();
        let s = api.get(id).await?;
        samples.push(t.elapsed());
        ensure!(is_ready(&s), "the bystander is not ready: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ensure!(samples.len() >= 20, "{} polls", samples.len());
    Ok(samples)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dormouse-bench-egress: {e:#}");
            ExitCode::FAILURE
        }
    }
}
