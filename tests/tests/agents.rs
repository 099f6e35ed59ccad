//! End-to-end: clients nobody here wrote against a real broker and desktop.
//! The official MCP Python SDK over streamable HTTP (`/mcp`) and over
//! `dormouse mcp` stdio, the official `openai` package's own action types
//! through the `openai_actions` dialect, and the two example loops
//! replaying recorded transcripts through their own dispatch code.
//!
//! The Python checks live in `tests/agents/*.py`; they witness through the
//! guest itself (`xdotool getwindowname` on the page's window and `docker
//! inspect` of a stopped desktop, both through `docker exec`/the engine,
//! never through Dormouse). The interpreter is `$DORMOUSE_PYTHON` or
//! `target/pyenv/bin/python` (made by `scripts/test`); without it the test
//! skips visibly, and fails under `CI=true`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{EventStream, Waits as _};
use dormouse_e2e::desk::{self, page_state};
use dormouse_e2e::guest::Guest;
use dormouse_e2e::{desktop_image, docker_available};
use dormouse_protocol::api::{CreateComputer, LeaseRequest};
use serde_json::json;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_owned()
}

/// The interpreter with `mcp`, `openai` and `anthropic` installed.
fn python(test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("DORMOUSE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/pyenv/bin/python"));
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: no Python with the vendors' SDKs at {} (scripts/test makes it)",
        path.display()
    );
    eprintln!(
        "SKIP {test}: no Python with the vendors' SDKs at {} (run scripts/test)",
        path.display()
    );
    None
}

/// The `dormouse` CLI: `$DORMOUSE_BIN_DIR/dormouse`, or built next to this
/// test's own target directory.
fn cli_binary() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DORMOUSE_BIN_DIR") {
        let path = PathBuf::from(dir).join("dormouse");
        ensure!(path.is_file(), "{} does not exist", path.display());
        return Ok(path);
    }
    let exe = std::env::current_exe()?;
    let mut profile = exe.parent().context("exe dir")?;
    if profile.ends_with("deps") {
        profile = profile.parent().context("deps parent")?;
    }
    let target = profile.parent().context("target dir")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "dormouse-cli",
            "--bin",
            "dormouse",
        ])
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target)
        .args(if profile.ends_with("release") {
            &["--release"][..]
        } else {
            &[][..]
        })
        .stdin(Stdio::null())
        .status()?;
    ensure!(status.success(), "building the dormouse CLI failed");
    Ok(profile.join("dormouse"))
}

/// Runs one Python check with `env`; its output is shown either way.
async fn run_check(py: &Path, script: &str, args: &[&str], env: &[(&str, String)]) -> Result<()> {
    let dir = workspace_root().join("tests/agents");
    let mut cmd = tokio::process::Command::new(py);
    cmd.arg(dir.join(script))
        .args(args)
        .current_dir(&dir)
        .env("PYTHONPATH", workspace_root().join("docs/examples"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(600), cmd.output())
        .await
        .context("the check did not end within 10 minutes")??;
    eprintln!(
        "--- {script} {args:?} ---\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("{script} {args:?} failed ({})", out.status);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vendor_clients_drive_a_real_desktop() -> Result<()> {
    let test = "vendor_clients_drive_a_real_desktop";
    if !docker_available(test) {
        return Ok(());
    }
    let Some(image) = desktop_image(test) else {
        return Ok(());
    };
    let Some(py) = python(test) else {
        return Ok(());
    };
    let cli = cli_binary()?;
    let broker = BrokerProcess::start(BrokerOptions::new(&image)).await?;
    let result = scenario(&broker, &py, &cli).await;
    if result.is_err() {
        eprintln!("--- dormoused log ---\n{}", broker.log_tail(6000));
    }
    result
}

async fn scenario(broker: &BrokerProcess, py: &Path, cli: &Path) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = api
        .create(&CreateComputer {
            name: Some("agents".into()),
            ..CreateComputer::default()
        })
        .await?
        .id;
    let stopped = api
        .create(&CreateComputer {
            name: Some("parked".into()),
            ..CreateComputer::default()
        })
        .await?
        .id;
    api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
    api.wait_ready(&mut events, stopped, READY_TIMEOUT).await?;
    api.stop(stopped).await?;
    api.wait_stopped(&mut events, stopped, READY_TIMEOUT)
        .await?;
    let guest = Guest::for_computer(id);
    desk::open_page(&guest, &broker.workspace(id), "agents.html", desk::PAGE).await?;

    // Where the page's viewport is on the screen: move until it sees motion.
    let mut origin = None;
    for i in 0..40 {
        let x = 500 + (i % 2) * 40;
        api.actions(
            id,
            &serde_json::from_value(
                json!({"actions": [{"action": "mouse_move", "coordinate": [x, 380]}]}),
            )?,
        )
        .await?;
        let state = page_state(&guest).await?;
        if let Some(o) = state["o"].as_array() {
            origin = Some((o[0].as_i64().unwrap_or(0), o[1].as_i64().unwrap_or(0)));
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (ox, oy) = origin.context("the page never saw the pointer")?;

    // A lease: every mutating call from here on is fenced.
    let generation = api
        .lease(
            id,
            &LeaseRequest {
                holder: "agent".into(),
                ttl_ms: 600_000,
            },
        )
        .await?
        .generation;
    ensure!(generation > 0, "a lease has a generation above 0");
    let first = generation - 1;

    let env = vec![
        ("DORMOUSE_URL", format!("http://{}", broker.addr())),
        ("DORMOUSE_TOKEN", broker.token().to_owned()),
        ("DESK", id.to_string()),
        ("CONTAINER", guest.container().to_owned()),
        ("STOPPED", stopped.to_string()),
        ("STOPPED_CONTAINER", format!("dormouse-{stopped}")),
        ("GEN", generation.to_string()),
        ("STALE_GEN", first.to_string()),
        ("ORIGIN", format!("{ox},{oy}")),
        ("DORMOUSE_CLI", cli.display().to_string()),
    ];
    let mut failed = Vec::new();
    for (script, args) in [
        ("mcp_check.py", &["http"][..]),
        ("mcp_check.py", &["stdio"][..]),
        ("openai_check.py", &[][..]),
        ("replay_check.py", &[][..]),
    ] {
        if let Err(e) = run_check(py, script, args, &env).await {
            failed.push(format!("{e:#}"));
        }
    }
    ensure!(failed.is_empty(), "{failed:?}");
    Ok(())
}
