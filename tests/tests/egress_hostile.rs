//! End-to-end: a hostile program inside a desktop attacks its egress proxy
//! (a flood of connections, a slowloris head, an oversized request line,
//! control characters in a name, ports out of range) while the host polls
//! another desktop's status. The proxy answers each with its status code,
//! the broker stays up with a bounded count of open descriptors (read from
//! `/proc/<pid>/fd`), and the other desktop's status keeps being served
//! (its p50/p99 latency is printed beside the 20 ms target).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{create_ready, EventStream};
use dormouse_e2e::hostile::EGRESS_ATTACK_PY;
use dormouse_e2e::{desktop_image, docker_available};
use dormouse_protocol::egress_policy::{EgressMode, EgressPolicy};
use dormouse_protocol::exec::ExecRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_desktop_cannot_hurt_the_broker_through_egress() -> Result<()> {
    let test = "a_hostile_desktop_cannot_hurt_the_broker_through_egress";
    if !docker_available(test) {
        return Ok(());
    }
    let Some(image) = desktop_image(test) else {
        return Ok(());
    };
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let port = l.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let dir = tempfile::tempdir()?;
    let hosts = dir.path().join("egress-hosts");
    std::fs::write(&hosts, "127.0.0.1 echo.test\n")?;
    let mut options = BrokerOptions::new(&image);
    options.extra_args = vec!["--egress-hosts".into(), hosts.display().to_string()];
    let broker = BrokerProcess::start(options).await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let hostile = create_ready(&api, &mut events, "egress-hostile", READY_TIMEOUT)
        .await
        .with_context(|| broker.log_tail(3000))?;
    let other = create_ready(&api, &mut events, "egress-bystander", READY_TIMEOUT)
        .await
        .with_context(|| broker.log_tail(3000))?;
    let pid = broker.pid().context("broker pid")?;
    let fds = move || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let result = async {
        api.set_egress(
            hostile,
            &EgressPolicy {
                mode: EgressMode::Allowlist,
                allow: vec![format!("127.0.0.1/32:{port}").parse().unwrap()],
                deny: Vec::new(),
            },
        )
        .await?;
        let baseline_fds = fds();
        let mut r = ExecRequest::shell(format!("python3 - {port} <<'EOF'\n{EGRESS_ATTACK_PY}EOF"));
        r.timeout_ms = 120_000;
        let exec_api = api.clone();
        let attack = tokio::spawn(async move { exec_api.exec(hostile, &r, false).await });
        let mut times = Vec::new();
        let mut max_fds = 0;
        let started = Instant::now();
        while !attack.is_finished() && started.elapsed() < Duration::from_secs(110) {
            let t = Instant::now();
            let s = api.get(other).await?;
            times.push(t.elapsed());
            ensure!(dormouse_e2e::client::is_ready(&s), "{s:?}");
            max_fds = max_fds.max(fds());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = attack.await??;
        let text = format!("{}{}", out.stdout, out.stderr);
        println!("{text}");
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or("")
                .to_owned()
        };
        ensure!(get("long_line").starts_with("400") || get("long_line").starts_with("431"), "{text}");
        ensure!(get("control") == "400", "{text}");
        ensure!(get("port0") == "400", "{text}");
        ensure!(get("port70000") == "400", "{text}");
        let slow = get("slowloris");
        ensure!(slow.starts_with("408"), "{text}");
        let after: f64 = slow.rsplit("after=").next().unwrap_or("0").parse()?;
        ensure!((9.5..15.0).contains(&after), "408 after {after} s");
        let codes = get("codes");
        ensure!(codes.contains("503:") || text.contains("connect_failed=") && !text.contains("connect_failed=0"), "no refusal in the flood: {text}");
        ensure!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid)?), None).is_ok(), "the broker died");
        ensure!(max_fds < baseline_fds + 600, "broker fds {baseline_fds} -> {max_fds}");
        times.sort();
        ensure!(times.len() >= 20, "{} polls", times.len());
        let p99 = times[times.len() * 99 / 100];
        let p50 = times[times.len() / 2];
        println!("bystander status: {} polls, p50 {p50:?}, p99 {p99:?}; broker fds {baseline_fds} -> max {max_fds}", times.len());
        // The 20 ms target for p99 is a speed figure, measured and printed
        // here; the test asserts only that the bystander is never starved.
        println!("bystander p99 {p99:?} (target 20 ms)");
        ensure!(p99 < Duration::from_secs(1), "the bystander starved: p99 {p99:?}");
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("broker log:\n{}", broker.log_tail(6000));
    }
    result
}
