//! The `dormouse` CLI against the API router over a scripted core, on a real
//! loopback socket: output, `--wait` progress and failures, id resolution,
//! and exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use std::sync::Arc;
use std::time::Duration;

use api_support::{Harness, TOKEN};
use clap::Parser as _;
use dormouse_cli::{run, CliArgs, CliError};
use serde_json::Value;

struct Cli {
    url: String,
    token_file: tempfile::NamedTempFile,
}

impl Cli {
    async fn serve(h: &Harness) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let router = h.router();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        let token_file = tempfile::NamedTempFile::new().expect("token file");
        std::fs::write(token_file.path(), format!("{TOKEN}\n")).expect("write token");
        Self { url, token_file }
    }

    /// Runs `dormouse ARGS...`; returns its stdout or its error.
    async fn run(&self, args: &[&str]) -> Result<String, CliError> {
        let token_file = self.token_file.path().to_str().expect("utf-8 path");
        let mut argv = vec!["dormouse", "--url", &self.url, "--token-file", token_file];
        argv.extend_from_slice(args);
        let parsed = CliArgs::try_parse_from(argv).expect("valid command line");
        let mut out = Vec::new();
        run(parsed, &mut out).await?;
        Ok(String::from_utf8(out).expect("utf-8 output"))
    }
}

#[tokio::test]
async fn ls_status_and_json() {
    let h = Harness::new();
    let id = h.add("alpha", false);
    let cli = Cli::serve(&h).await;
    let table = cli.run(&["ls"]).await.expect("ls");
    assert!(
        table.contains("alpha") && table.contains("stopped because idle"),
        "{table}"
    );
    let json: Value =
        serde_json::from_str(&cli.run(&["--json", "ls"]).await.expect("ls --json")).expect("JSON");
    assert_eq!(json[0]["id"], id.to_string());
    // By name, by prefix, in full.
    for given in [
        "alpha".to_owned(),
        id.to_string()[..6].to_owned(),
        id.to_string(),
    ] {
        let text = cli.run(&["status", &given]).await.expect("status");
        assert!(text.contains(&id.to_string()), "{text}");
    }
}

#[tokio::test]
async fn start_wait_shows_progress_until_ready() {
    let h = Harness::new();
    h.lock().boot_time = Duration::from_millis(200);
    h.add("beta", false);
    let cli = Cli::serve(&h).await;
    let out = cli
        .run(&["start", "beta", "--wait"])
        .await
        .expect("start --wait");
    assert!(out.contains("running, starting"), "{out}");
    assert!(out.contains("ready after"), "{out}");
    let calls = h.calls();
    assert_eq!(calls.iter().filter(|c| c.starts_with("start")).count(), 1);
}

#[tokio::test]
async fn start_wait_reports_a_clear_failure() {
    let h = Harness::new();
    {
        let mut s = h.lock();
        s.boot_time = Duration::from_millis(100);
        s.fail_boot = Some("the X display did not come up".into());
    }
    h.add("gamma", false);
    let cli = Cli::serve(&h).await;
    let err = cli
        .run(&["start", "gamma", "--wait"])
        .await
        .expect_err("a failed boot fails");
    assert_eq!(err.exit_code(), 1);
    assert!(
        err.to_string().contains("the X display did not come up"),
        "{err}"
    );
}

#[tokio::test]
async fn create_wait_and_remove() {
    let h = Harness::new();
    let cli = Cli::serve(&h).await;
    let out = cli
        .run(&[
            "--json", "create", "--name", "delta", "--owner", "team", "--wait",
        ])
        .await
        .expect("create");
    let status: Value = serde_json::from_str(&out).expect("JSON status");
    assert_eq!(status["name"], "delta");
    assert_eq!(status["ready"], true);
    let out = cli.run(&["rm", "delta"]).await.expect("rm");
    assert!(out.contains("workspace kept"), "{out}");
    assert!(h.computers().is_empty());
}

#[tokio::test]
async fn screenshot_touch_lease_and_fencing() {
    let h = Harness::new();
    let id = h.add("eps", true);
    let cli = Cli::serve(&h).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("shot.png");
    cli.run(&["screenshot", "eps", "-o", file.to_str().expect("utf-8")])
        .await
        .expect("screenshot");
    assert_eq!(std::fs::read(&file).expect("png"), api_support::PNG);
    cli.run(&["touch", "eps"]).await.expect("touch");
    let grant: Value = serde_json::from_str(
        &cli.run(&["--json", "lease", "eps", "--holder", "ctl", "--ttl", "30s"])
            .await
            .expect("lease"),
    )
    .expect("JSON grant");
    assert_eq!(grant["generation"], 2);
    let err = cli
        .run(&["--generation", "1", "stop", "eps"])
        .await
        .expect_err("stale generation");
    match err {
        CliError::Api { code, .. } => assert_eq!(code, "stale_generation"),
        other => panic!("expected an API error, got {other:?}"),
    }
    cli.run(&["--generation", "2", "stop", "eps"])
        .await
        .expect("fenced stop");
    assert_eq!(
        h.computers()[&id].container,
        dormouse_protocol::api::ContainerState::Stopped
    );
}

#[tokio::test]
async fn exit_codes_mean_something() {
    let h = Harness::new();
    let cli = Cli::serve(&h).await;
    // Unknown desktop: a failure.
    let err = cli
        .run(&["stop", "no-such-desktop"])
        .await
        .expect_err("unknown");
    assert_eq!(err.exit_code(), 1);
    let err = cli
        .run(&["stop", "67e55044-10b1-426f-9247-bb680e5fe0c8"])
        .await
        .expect_err("404");
    assert_eq!(err.exit_code(), 1);
    // Usage: clap's own errors exit 2.
    for bad in [
        &["dormouse", "start"][..],
        &["dormouse", "frobnicate"],
        &["dormouse", "lease", "x", "--holder", "h", "--ttl", "soon"],
    ] {
        let err = CliArgs::try_parse_from(bad).expect_err("usage error");
        assert_eq!(err.exit_code(), 2, "{bad:?}");
    }
    // A broker that is not there: a failure, with the reason.
    let parsed = CliArgs::try_parse_from([
        "dormouse",
        "--url",
        "http://127.0.0.1:9",
        "--token-file",
        cli.token_file.path().to_str().expect("utf-8"),
        "ls",
    ])
    .expect("valid");
    let err = run(parsed, &mut Vec::new()).await.expect_err("unreachable");
    assert_eq!(err.exit_code(), 1);
}

#[tokio::test]
async fn status_watch_follows_changes_until_removed() {
    let h = Harness::new();
    let id = h.add("zeta", true);
    let cli = Arc::new(Cli::serve(&h).await);
    let watcher = {
        let cli = cli.clone();
        let id = id.to_string();
        tokio::spawn(async move { cli.run(&["status", &id, "--watch"]).await })
    };
    // The event stream subscribes, then lists for its snapshot: once the
    // core saw that list, every later change reaches the watcher.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !h.calls().iter().any(|c| c.starts_with("list")) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watcher never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = reqwest::Client::new();
    let base = cli.url.clone();
    for path in [
        format!("/v1/computers/{id}/stop"),
        format!("/v1/computers/{id}/start"),
    ] {
        let answer = client
            .post(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("request");
        assert_eq!(answer.status(), 200);
    }
    let answer = client
        .delete(format!("{base}/v1/computers/{id}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("remove");
    assert_eq!(answer.status(), 204);
    let out = tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("the watch ends when the desktop is removed")
        .expect("task")
        .expect("watch");
    assert!(out.contains("stopped manually"), "{out}");
    assert!(out.trim_end().ends_with("removed"), "{out}");
}

/// What a hostile guest might put into its status: an OSC 0 window title, a
/// CSI clear-screen, an OSC 52 clipboard write, a C1 CSI, a forged line and
/// a bidi override.
const HOSTILE: &str =
    "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}\u{9b}31m\nforged line\u{202e}evil";

/// `HOSTILE` as the CLI must show it.
const HOSTILE_SHOWN: &str =
    "\\x1b]0;pwned\\x07\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07\\u{009b}31m\\x0aforged line\\u{202e}evil";

/// No byte a terminal would act on: C0 (except the CLI's own newlines), DEL,
/// C1, bidi controls.
fn assert_inert(out: &str) {
    for c in out.chars() {
        assert!(
            c == '\n' || !dormouse_cli::escape::is_unsafe(c),
            "raw {c:?} reached the output: {out:?}"
        );
    }
}

#[tokio::test]
async fn text_from_the_broker_is_escaped() {
    use dormouse_protocol::{Check, CheckStatus, HealthReport};
    let h = Harness::new();
    let id = h.add("plain", true);
    {
        let mut s = h.lock();
        let c = s.computers.get_mut(&id).expect("the computer");
        c.name = format!("desk{HOSTILE}");
        c.owner = format!("team{HOSTILE}");
        c.problem = Some(format!("problem{HOSTILE}"));
        c.resumable_problem = Some(format!("resumable{HOSTILE}"));
        c.health = Some(HealthReport::from_checks(
            vec![Check::new(
                format!("check{HOSTILE}"),
                CheckStatus::Fail,
                format!("detail{HOSTILE}"),
            )],
            chrono::Utc::now(),
        ));
    }
    let cli = Cli::serve(&h).await;
    let id = id.to_string();

    let status = cli.run(&["status", &id]).await.expect("status");
    assert_inert(&status);
    for field in ["desk", "team", "problem", "resumable", "check", "detail"] {
        assert!(
            status.contains(&format!("{field}{HOSTILE_SHOWN}")),
            "{field} not shown escaped in:\n{status}"
        );
    }

    let table = cli.run(&["ls"]).await.expect("ls");
    assert_inert(&table);
    assert!(table.contains(&format!("desk{HOSTILE_SHOWN}")), "{table}");
    assert!(
        table.contains(&format!("problem{HOSTILE_SHOWN}")),
        "{table}"
    );

    // JSON: still the same value, but no raw control reaches the terminal.
    let json = cli.run(&["--json", "status", &id]).await.expect("json");
    assert_inert(&json);
    let value: Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(value["name"], format!("desk{HOSTILE}"));
    let json = cli.run(&["--json", "ls"]).await.expect("json ls");
    assert_inert(&json);

    // An error message that carries the broker's words is escaped where it
    // is printed (main), and keeps them as they are in the error itself.
    h.lock().fail_with = Some(dormouse_broker::error::BrokerError::WrongState(format!(
        "refused{HOSTILE}"
    )));
    let err = cli.run(&["stop", &id]).await.expect_err("refused");
    let shown = dormouse_cli::escape::safe(&err.to_string());
    assert_inert(&shown);
    assert!(
        shown.contains(&format!("refused{HOSTILE_SHOWN}")),
        "{shown}"
    );
}

#[tokio::test]
async fn status_says_whether_the_workspace_is_limited_and_why_not() {
    use dormouse_protocol::api::WorkspaceLimit;
    let h = Harness::new();
    let limited = h.add("limited", true);
    let open = h.add("open", true);
    {
        let mut s = h.lock();
        s.computers
            .get_mut(&limited)
            .expect("limited")
            .workspace_limit = Some(WorkspaceLimit {
            enforced: true,
            bytes: Some(10 << 30),
            inodes: Some(1_000_000),
            reason: None,
        });
        s.computers.get_mut(&open).expect("open").workspace_limit = Some(WorkspaceLimit {
            enforced: false,
            bytes: None,
            inodes: None,
            reason: Some(format!("no prjquota{HOSTILE}")),
        });
    }
    let cli = Cli::serve(&h).await;
    let text = cli.run(&["status", &limited.to_string()]).await.unwrap();
    assert!(
        text.contains("workspace   limited to 10240 MiB and 1000000 files"),
        "{text}"
    );
    let text = cli.run(&["status", &open.to_string()]).await.unwrap();
    assert_inert(&text);
    assert!(
        text.contains(&format!(
            "workspace   no size limit (no prjquota{HOSTILE_SHOWN})"
        )),
        "{text}"
    );
    let json = cli
        .run(&["--json", "status", &open.to_string()])
        .await
        .unwrap();
    let value: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["workspace_limit"]["enforced"], false);
}
