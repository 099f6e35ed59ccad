//! The egress proxy in a real, network-less desktop container, with the
//! test playing the broker: it parks `egress_accept` connections on the
//! guest socket, `curl` runs inside the container as uid 1000 (`docker
//! exec`), the test receives `egress_open`, dials a server of its own on
//! the host's loopback, answers the verdict and relays. The server records
//! what it was sent (the witness). Refusals (403) and failures (502) come
//! back to curl with their reason; the proxy variables are in an exec's and
//! in a service's environment (`/proc/<pid>/environ`).
//!
//! The test's own "broker" maps every name to the host server; it holds no
//! policy (the broker's is tested beside it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dormouse_e2e::docker;
use dormouse_protocol::egress::{self, EgressForm, EgressOpen, EgressVerdict};
use dormouse_protocol::exec::ExecRequest;
use dormouse_protocol::{splice, Request, Response};
use support::{Client, Desktop};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

const GUARD: Duration = Duration::from_secs(30);

/// A plain-HTTP server on the host's loopback that answers every request
/// with a page naming its path, and records each request head.
struct Site {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Site {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or("?").to_owned();
                    log.lock().unwrap().push(head);
                    let body = format!("egress witness page for {path}\n");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self { port, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// What the test's broker does with the next `egress_open`.
#[derive(Debug, Clone)]
enum Play {
    /// Dial the site and relay.
    Connect(u16),
    /// Refuse with this reason.
    Refuse(String),
    /// Fail with this reason.
    Fail(String),
}

/// Parks one `egress_accept` and serves what comes on it; returns the
/// `egress_open` it received.
async fn broker(desktop: &Desktop, play: Play) -> tokio::task::JoinHandle<EgressOpen> {
    let mut client = Client::connect(&desktop.socket()).await;
    client.send(&Request::EgressAccept).await;
    tokio::spawn(async move {
        let frame = tokio::time::timeout(Duration::from_secs(60), client.recv())
            .await
            .expect("an egress_open in time")
            .expect("the supervisor keeps the connection");
        let Response::EgressOpen(open) = frame.message else {
            panic!("egress_accept answered {:?}", frame.message);
        };
        open.validate().expect("a valid open");
        let mut guest = client.stream;
        match play {
            Play::Connect(port) => {
                let mut upstream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                upstream.write_all(&frame.payload).await.unwrap();
                egress::write_verdict(&mut guest, &EgressVerdict::Connected, GUARD)
                    .await
                    .unwrap();
                let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
                let _ = splice::relay(&guest, &upstream, &up, &down).await;
            }
            Play::Refuse(reason) => {
                egress::write_verdict(&mut guest, &EgressVerdict::Refused { reason }, GUARD)
                    .await
                    .unwrap();
            }
            Play::Fail(reason) => {
                egress::write_verdict(&mut guest, &EgressVerdict::Failed { reason }, GUARD)
                    .await
                    .unwrap();
            }
        }
        open
    })
}

/// `docker exec -u 1000 <desktop> argv…` off the runtime: (exit code,
/// stdout, stderr).
async fn exec_in(desktop: &Desktop, argv: &[&str]) -> (i32, String, String) {
    let mut args = vec!["exec", "-u", "1000", desktop.name()];
    args.extend_from_slice(argv);
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&argv)
    })
    .await
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn curl_in_the_desktop_reaches_a_host_site_through_the_parked_connection() {
    let Some(desktop) = Desktop::create("egress_curl_through_the_proxy") else {
        return;
    };
    let mut status = desktop.start().await;
    status.watch_until_ready(&desktop).await;
    let site = Site::start().await;
    let port = site.port.to_string();

    // Plain HTTP, absolute-form, by a name only the broker knows.
    let served = broker(&desktop, Play::Connect(site.port)).await;
    let url = format!("http://testsite.invalid:{port}/plain");
    let (code, out, err) = exec_in(&desktop, &["curl", "-sS", "--max-time", "20", &url]).await;
    assert_eq!(code, 0, "curl: {err}\n{}", desktop.logs());
    assert_eq!(out, "egress witness page for /plain\n");
    let open = served.await.unwrap();
    assert_eq!(open.host, "testsite.invalid");
    assert_eq!(open.port, site.port);
    assert_eq!(
        open.form,
        EgressForm::Http {
            method: "GET".into()
        }
    );
    let seen = site.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].starts_with("GET /plain HTTP/1.1\r\n"), "{seen:?}");
    assert!(
        seen[0].contains(&format!("Host: testsite.invalid:{port}\r\n")),
        "{seen:?}"
    );
    assert!(!seen[0].to_ascii_lowercase().contains("proxy-"), "{seen:?}");

    // The same through CONNECT (curl's --proxytunnel).
    let served = broker(&desktop, Play::Connect(site.port)).await;
    let url = format!("http://testsite.invalid:{port}/tunnel");
    let (code, out, err) =
        exec_in(&desktop, &["curl", "-sS", "-p", "--max-time", "20", &url]).await;
    assert_eq!(code, 0, "curl: {err}");
    assert_eq!(out, "egress witness page for /tunnel\n");
    let open = served.await.unwrap();
    assert_eq!(open.form, EgressForm::Connect);
    assert_eq!(
        (open.host.as_str(), open.port),
        ("testsite.invalid", site.port)
    );
    assert!(site.seen()[1].starts_with("GET /tunnel HTTP/1.1\r\n"));

    // Refused: plain HTTP gets the page, CONNECT the status and header.
    let reason = "denied: denied.invalid:80 not in the allow list";
    let served = broker(&desktop, Play::Refuse(reason.into())).await;
    let (code, out, _) = exec_in(
        &desktop,
        &[
            "curl",
            "-sS",
            "-w",
            "\n%{http_code}",
            "--max-time",
            "20",
            "http://denied.invalid/",
        ],
    )
    .await;
    assert_eq!(code, 0);
    assert!(out.contains(reason) && out.contains("<html>"), "{out}");
    assert!(out.ends_with("\n403"), "{out}");
    assert_eq!(served.await.unwrap().host, "denied.invalid");
    let reason = "denied: pypi.example:443 not in the allow list";
    let served = broker(&desktop, Play::Refuse(reason.into())).await;
    let (code, _, err) = exec_in(
        &desktop,
        &[
            "curl",
            "-sS",
            "-v",
            "--max-time",
            "20",
            "https://pypi.example/",
        ],
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("HTTP/1.1 403 Forbidden"), "{err}");
    assert!(err.contains(reason), "{err}");
    assert_eq!(served.await.unwrap().port, 443);

    // Failed: 502 with the cause.
    let cause = "connection refused by 127.0.0.1:9";
    let served = broker(&desktop, Play::Fail(cause.into())).await;
    let (code, out, _) = exec_in(
        &desktop,
        &[
            "curl",
            "-sS",
            "-w",
            "\n%{http_code}",
            "--max-time",
            "20",
            "http://down.invalid:9/",
        ],
    )
    .await;
    assert_eq!(code, 0);
    assert!(out.contains(cause) && out.ends_with("\n502"), "{out}");
    served.await.unwrap();
    assert_eq!(site.seen().len(), 2, "refusals never reached the site");

    // Hostile requests are answered by the guest alone.
    let raw = "exec 3<>/dev/tcp/127.0.0.1/3128; printf 'CONNECT a.invalid:70000 HTTP/1.1\\r\\n\\r\\n' >&3; cat <&3";
    let (code, out, err) = exec_in(&desktop, &["bash", "-c", raw]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(out.contains("invalid port \"70000\""), "{out}");

    // The proxy's health check, and the variables for services and execs.
    drop(status);
    let report = Client::connect(&desktop.socket())
        .await
        .ask(&Request::Status)
        .await;
    let Response::Status(s) = report.message else {
        panic!("{:?}", report.message)
    };
    let check = s
        .health
        .unwrap()
        .checks
        .into_iter()
        .find(|c| c.name == "egress_proxy");
    let check = check.expect("an egress_proxy check");
    assert_eq!(
        check.status,
        dormouse_protocol::CheckStatus::Ok,
        "{check:?}"
    );
    let mut exec = Client::connect(&desktop.socket()).await;
    let answer = exec.ask(&Request::Exec(ExecRequest::shell("env"))).await;
    let Response::ExecResult(head) = answer.message else {
        panic!("{:?}", answer.message)
    };
    let env = String::from_utf8(head.join(answer.payload).unwrap().stdout).unwrap();
    assert_proxy_env(&env, "an exec");
    let (code, environ, err) = exec_in(
        &desktop,
        &[
            "sh",
            "-c",
            "tr '\\0' '\\n' < /proc/$(pgrep -o -x openbox)/environ",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_proxy_env(&environ, "the openbox service");

    // Chromium through its managed policy alone (no variable, no flag
    // naming the proxy). Last: it may open more connections than the one
    // page (the leftovers stay parked until the container goes).
    let mut parked = Vec::new();
    for _ in 0..8 {
        parked.push(broker(&desktop, Play::Connect(site.port)).await);
    }
    let url = format!("http://testsite.invalid:{port}/chromium");
    let (code, out, err) = exec_in(
        &desktop,
        &[
            "env",
            "-u",
            "http_proxy",
            "-u",
            "HTTP_PROXY",
            "-u",
            "https_proxy",
            "-u",
            "HTTPS_PROXY",
            "timeout",
            "60",
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--user-data-dir=/tmp/egress-chromium",
            "--dump-dom",
            &url,
        ],
    )
    .await;
    assert_eq!(code, 0, "chromium: {err}");
    assert!(
        out.contains("egress witness page for /chromium"),
        "{out}\n{err}"
    );
    assert!(
        site.seen()
            .iter()
            .any(|h| h.starts_with("GET /chromium HTTP/1.1\r\n")),
        "{:?}",
        site.seen()
    );
    drop(parked);
}

fn assert_proxy_env(env: &str, whose: &str) {
    for line in [
        "http_proxy=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "HTTP_PROXY=http://127.0.0.1:3128",
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "no_proxy=localhost,127.0.0.1,::1",
        "NO_PROXY=localhost,127.0.0.1,::1",
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{whose} lacks {line}:\n{env}"
        );
    }
}
