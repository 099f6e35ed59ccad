//! End-to-end: a desktop with no network interface reaches sites on the
//! host's loopback through the broker, under its policy, by name
//! (`dormoused --egress-hosts`), driven only through the broker's API
//! (`PUT /v1/computers/{id}/egress`, exec of `curl` as uid 1000), with the
//! site itself as the independent witness of what reached it and when a
//! connection was cut.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream};
use dormouse_e2e::{desktop_image, docker_available};
use dormouse_protocol::egress_policy::{EgressDecision, EgressMode, EgressPolicy};
use dormouse_protocol::exec::ExecRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// What the host site saw.
#[derive(Debug, Default)]
struct Witness {
    /// `(Host header, path)` of every request.
    requests: Vec<(String, String)>,
    /// When a streaming response's write first failed (the client was cut).
    cut_at: Option<Instant>,
    /// Streaming responses begun.
    streams: usize,
}

/// A small HTTP site on 127.0.0.1: `/hello` answers a line, `/slow` streams
/// 1 KiB every 20 ms for at most 60 s.
async fn site() -> (SocketAddr, Arc<Mutex<Witness>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let witness = Arc::new(Mutex::new(Witness::default()));
    let w = witness.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let w = w.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|x| x == b"\r\n\r\n") && head.len() < 65536 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let path = text.split_whitespace().nth(1).unwrap_or("").to_owned();
                let host = text
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("Host: ")
                            .or_else(|| l.strip_prefix("host: "))
                    })
                    .unwrap_or("")
                    .to_owned();
                w.lock().unwrap().requests.push((host, path.clone()));
                if path == "/slow" {
                    w.lock().unwrap().streams += 1;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 3072000\r\nConnection: close\r\n\r\n")
                        .await;
                    let chunk = vec![b'x'; 1024];
                    let end = Instant::now() + Duration::from_secs(60);
                    while Instant::now() < end {
                        if s.write_all(&chunk).await.is_err() {
                            let mut w = w.lock().unwrap();
                            w.cut_at.get_or_insert(Instant::now());
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                } else {
                    let body = "hello from the host\n";
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(answer.as_bytes()).await;
                }
            });
        }
    });
    (addr, witness)
}

fn policy(mode: EgressMode, allow: &[String], deny: &[&str]) -> EgressPolicy {
    EgressPolicy {
        mode,
        allow: allow.iter().map(|r| r.parse().unwrap()).collect(),
        deny: deny.iter().map(|r| r.parse().unwrap()).collect(),
    }
}

/// `curl` in the desktop as uid 1000 through the proxy it is given: the
/// HTTP status and the body.
async fn curl(api: &ApiClient, id: Uuid, args: &str) -> Result<(String, String)> {
    let mut r = ExecRequest::shell(format!(
        "curl -sS --max-time 20 -o /tmp/body -w '%{{http_code}}' {args}; echo; cat /tmp/body"
    ));
    r.timeout_ms = 30_000;
    let out = api.exec(id, &r, false).await?;
    let (code, body) = out.stdout.split_once('\n').unwrap_or((&out.stdout, ""));
    Ok((code.trim().to_owned(), format!("{body}{}", out.stderr)))
}

/// Starts a download of `/slow` in the desktop; resolves when curl ends.
fn download(api: &ApiClient, id: Uuid, url: String) -> tokio::task::JoinHandle<Result<String>> {
    let api = api.clone();
    tokio::spawn(async move {
        let mut r = ExecRequest::shell(format!(
            "curl -sS --max-time 60 -o /dev/null {url}; echo rc=$?"
        ));
        r.timeout_ms = 90_000;
        let out = api.exec(id, &r, false).await?;
        Ok(format!("{}{}", out.stdout, out.stderr))
    })
}

/// Waits until the site streams to one more client than `before`.
async fn wait_streaming(w: &Arc<Mutex<Witness>>, before: usize) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(20);
    while w.lock().unwrap().streams <= before {
        ensure!(Instant::now() < end, "the download never reached the site");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let bytes flow a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

async fn wait_cut(w: &Arc<Mutex<Witness>>, within: Duration) -> Result<Instant> {
    let end = Instant::now() + within + Duration::from_secs(5);
    loop {
        if let Some(at) = w.lock().unwrap().cut_at {
            return Ok(at);
        }
        ensure!(Instant::now() < end, "the site still streams");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desktop_reaches_host_sites_by_name_under_its_policy() -> Result<()> {
    let test = "a_desktop_reaches_host_sites_by_name_under_its_policy";
    if !docker_available(test) {
        return Ok(());
    }
    let Some(image) = desktop_image(test) else {
        return Ok(());
    };
    let (addr, witness) = site().await;
    let port = addr.port();
    // A second site no CIDR rule names: reachable only through the name
    // rule, which the loopback range refuses.
    let (addr2, witness2) = site().await;
    let port2 = addr2.port();
    let dir = tempfile::tempdir()?;
    let hosts = dir.path().join("egress-hosts");
    std::fs::write(&hosts, "127.0.0.1 site.test other.test local.test\n")?;
    let mut options = BrokerOptions::new(&image);
    options.extra_args = vec!["--egress-hosts".into(), hosts.display().to_string()];
    let mut broker = BrokerProcess::start(options).await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "egress", READY_TIMEOUT)
        .await
        .with_context(|| format!("broker log:\n{}", broker.log_tail(3000)))?;
    let result = async {
        // The default is off, with the reason.
        ensure!(api.egress(id).await?.mode == EgressMode::Off);
        let (code, body) = curl(&api, id, &format!("http://site.test:{port}/hello")).await?;
        ensure!(
            code == "403" && body.contains("denied: egress is off for this desktop"),
            "off: {code} {body} {:#?}",
            api.egress_log(id, None).await?.entries
        );

        // Allowed by an explicit CIDR rule, reached by name, plain and CONNECT.
        let site_rule = format!("127.0.0.1/32:{port}");
        let allow = vec![site_rule.clone(), "local.test".to_owned()];
        api.set_egress(id, &policy(EgressMode::Allowlist, &allow, &["other.test"]))
            .await?;
        let (code, body) = curl(&api, id, &format!("http://site.test:{port}/hello")).await?;
        ensure!(
            code == "200" && body.contains("hello from the host"),
            "{code} {body}\n{}",
            broker.log_tail(2000)
        );
        let (code, body) = curl(&api, id, &format!("-p http://site.test:{port}/tunnel")).await?;
        ensure!(
            code == "200" && body.contains("hello from the host"),
            "CONNECT: {code} {body}"
        );
        {
            let w = witness.lock().unwrap();
            ensure!(
                w.requests
                    .contains(&(format!("site.test:{port}"), "/hello".into())),
                "{:?}",
                w.requests
            );
            ensure!(
                w.requests.iter().any(|(_, p)| p == "/tunnel"),
                "{:?}",
                w.requests
            );
        }

        // A denied name, and an allowed name mapped only to loopback.
        let seen = witness.lock().unwrap().requests.len();
        let (code, body) = curl(&api, id, &format!("http://other.test:{port}/hello")).await?;
        ensure!(
            code == "403" && body.contains("matches deny rule other.test"),
            "{code} {body}"
        );
        let (code, body) = curl(&api, id, &format!("-p http://local.test:{port2}/hello")).await?;
        ensure!(code != "200", "loopback by name: {code} {body}");
        ensure!(
            witness2.lock().unwrap().requests.is_empty(),
            "the loopback site was reached"
        );
        ensure!(
            witness.lock().unwrap().requests.len() == seen,
            "a refused request reached the site"
        );
        // The broker's own API, even with loopback allowed on every port.
        let api_port = broker.addr().port();
        api.set_egress(
            id,
            &policy(EgressMode::Allowlist, &["127.0.0.1/32".into()], &[]),
        )
        .await?;
        let (code, body) = curl(
            &api,
            id,
            &format!("--noproxy '' -p http://127.0.0.1:{api_port}/healthz"),
        )
        .await?;
        ensure!(
            code != "200",
            "the broker's API was reachable: {code} {body}"
        );

        let log = api.egress_log(id, None).await?;
        let refused: Vec<_> = log
            .entries
            .iter()
            .filter(|e| e.decision == EgressDecision::Refused)
            .collect();
        ensure!(
            refused.iter().any(|e| e.host == "local.test"
                && e.rule.as_deref() == Some("local.test")
                && e.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("127.0.0.1 is loopback"))),
            "{:#?}",
            log.entries
        );
        ensure!(
            refused
                .iter()
                .any(|e| e.host == "other.test" && e.rule.as_deref() == Some("other.test")),
            "{:#?}",
            log.entries
        );
        ensure!(
            refused.iter().any(|e| e
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("broker's own API"))),
            "{:#?}",
            log.entries
        );
        ensure!(
            log.entries
                .iter()
                .any(|e| e.decision == EgressDecision::Allowed
                    && e.rule.as_deref() == Some(site_rule.as_str())
                    && e.bytes_down > 0),
            "{:#?}",
            log.entries
        );
        // The last refusals, newest first, as the panel reads them: the
        // newest refused entries of the full log, in reverse.
        let last = api.egress_refused(id, 3).await?.entries;
        let newest: Vec<u64> = log
            .entries
            .iter()
            .rev()
            .filter(|e| e.decision != EgressDecision::Allowed)
            .take(3)
            .map(|e| e.seq)
            .collect();
        ensure!(
            last.iter().map(|e| e.seq).collect::<Vec<_>>() == newest && newest.len() == 3,
            "refusals {last:#?} against the log {newest:?}"
        );

        // A policy change cuts a live download within a second.
        api.set_egress(id, &policy(EgressMode::Allowlist, &allow, &[]))
            .await?;
        let before = witness.lock().unwrap().streams;
        let dl = download(&api, id, format!("http://site.test:{port}/slow"));
        wait_streaming(&witness, before).await?;
        let asked = Instant::now();
        api.set_egress(id, &policy(EgressMode::Allowlist, &allow, &["site.test"]))
            .await?;
        let cut = wait_cut(&witness, Duration::from_secs(1)).await?;
        let took = cut.saturating_duration_since(asked);
        ensure!(took < Duration::from_secs(1), "cut after {took:?}");
        println!("policy change cut the download after {took:?}");
        let out = dl.await??;
        ensure!(!out.contains("rc=0"), "{out}");

        // After a broker restart the policy and the log are still there.
        let kept = api.egress_log(id, None).await?.entries.len();
        broker.restart().await?;
        let api = broker.client();
        let p = api.egress(id).await?;
        ensure!(p.deny.iter().any(|r| r.to_string() == "site.test"), "{p:?}");
        let log = api.egress_log(id, None).await?;
        ensure!(log.entries.len() >= kept, "{} < {kept}", log.entries.len());

        // A stop cuts a live download too.
        api.set_egress(id, &policy(EgressMode::Allowlist, &allow, &[]))
            .await?;
        witness.lock().unwrap().cut_at = None;
        let before = witness.lock().unwrap().streams;
        let mut attempts = 0;
        // The pool starts again once the restarted broker sees the desktop ready.
        let dl = loop {
            let dl = download(&api, id, format!("http://site.test:{port}/slow"));
            if wait_streaming(&witness, before).await.is_ok() {
                break dl;
            }
            attempts += 1;
            ensure!(
                attempts < 3,
                "no download after the restart:\n{}",
                broker.log_tail(3000)
            );
        };
        let asked = Instant::now();
        api.stop(id).await?;
        let cut = wait_cut(&witness, Duration::from_secs(15)).await?;
        println!(
            "a stop cut the download after {:?}",
            cut.saturating_duration_since(asked)
        );
        let _ = dl.await;
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("broker log:\n{}", broker.log_tail(6000));
    }
    result
}
