//! `dormouse-bench-actions` (run through `scripts/bench-actions`): the cost
//! of computer-use actions on one real desktop, side by side in one run
//! with the way other systems do it, `docker exec … xdotool`.
//!
//! Measured: one `left_click` through the API, as an MCP `computer` call
//! on `/mcp` (with its screenshot and with `?screenshot=false`) and on the
//! guest socket directly; screenshots in PNG, JPEG and WebP (the still
//! route, a full and a 1024x640 `screenshot` action: latency and bytes);
//! typing 1000 characters mixing ASCII and non-ASCII
//! into a Chromium text area: characters per second sent (until the action
//! answered, which is after the focused client answered a ping queued
//! behind the keys) and until the page holds them (Chromium's own pace
//! of handling keys on this host), and how many arrived as sent, counted
//! by the page itself in its window title, read with `xprop`; and the same
//! click and typing done with xdotool through `docker exec` (default delay
//! and `--delay 12`), timed the same two ways.
//! Targets are printed, never asserted. Everything it creates is removed
//! on exit.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{EventStream, Waits as _};
use dormouse_e2e::desk::{self, page_state_when};
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_e2e::latency::{ms, Samples};
use dormouse_protocol::actions::ActionBatch;
use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::image::{ImageEncoding, ImageFormat};
use dormouse_protocol::{Request, Response};
use serde_json::json;
use tokio::time::Instant;

const TARGET_CLICK_P50: Duration = Duration::from_millis(30);
const TARGET_CHARS_PER_S: f64 = 2000.0;
const TARGET_CLICK_RATIO: f64 = 0.2;

#[derive(Debug, Parser)]
#[command(about = "Dormouse actions beside docker exec xdotool, on one desktop, in one run")]
struct Args {
    /// Desktop image (ID or reference); default $DORMOUSE_TEST_IMAGE or dormouse/desktop:latest.
    #[arg(long)]
    image: Option<String>,
    /// Clicks measured per way.
    #[arg(long, default_value_t = 40)]
    clicks: usize,
    /// Screenshots measured per kind.
    #[arg(long, default_value_t = 8)]
    shots: usize,
    /// Characters typed per typing run.
    #[arg(long, default_value_t = 1000)]
    chars: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench-actions: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-actions: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One typing run: how long until the page held every character, and how
/// many of them arrived as sent.
struct Typed {
    elapsed: Duration,
    matching: u64,
    length: u64,
}

impl Typed {
    fn rate(&self, chars: usize) -> f64 {
        chars as f64 / self.elapsed.as_secs_f64()
    }
}

// Over 100 lines on purpose: the benchmark's measurements in the order
// they run, each beside its baseline in the same run; apart, that order
// (which the figures depend on) would be spread over helpers.
async fn run(args: Args) -> Result<()> {
    let image = args
        .image
        .clone()
        .or_else(|| std::env::var("DORMOUSE_TEST_IMAGE").ok())
        .unwrap_or_else(|| dormouse_e2e::DEFAULT_IMAGE.into());
    let broker = BrokerProcess::start(BrokerOptions::new(&image)).await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = api
        .create(&CreateComputer {
            name: Some("bench-actions".into()),
            ..CreateComputer::default()
        })
        .await?
        .id;
    api.wait_ready(&mut events, id, Duration::from_secs(120))
        .await?;
    let guest = Guest::for_computer(id);
    let socket = broker
        .data_dir()
        .join("computers")
        .join(id.to_string())
        .join("run")
        .join(dormouse_protocol::SOCKET_FILE_NAME);
    let unit = "Grüße, 世界 ✓ — ¿qué? «ok» Привет abc XYZ 0123 @€{}|~ ";
    let text: String = unit.chars().cycle().take(args.chars).collect();
    let non_ascii = text.chars().filter(|c| !c.is_ascii()).count();
    desk::open_page(
        &guest,
        &broker.workspace(id),
        "bench.html",
        &desk::page_expecting(&text),
    )
    .await?;
    let batch = |v: serde_json::Value| -> Result<ActionBatch> { Ok(serde_json::from_value(v)?) };
    let mut state = desk::page_state(&guest).await?;
    for i in 0..40 {
        let x = 500 + (i % 2) * 40;
        let step = batch(json!({"actions": [{"action": "mouse_move", "coordinate": [x, 400]}]}))?;
        api.actions(id, &step).await?;
        state = page_state_when(&guest, Duration::from_millis(500), |s| s["o"].is_array()).await?;
        if state["o"].is_array() {
            break;
        }
    }
    let (ox, oy) = (
        state["o"][0].as_i64().context("origin")?,
        state["o"][1].as_i64().context("origin")?,
    );
    // Clicks land on the drag area, which does nothing with them.
    let (cx, cy) = (ox + 640, oy + 560);
    let click = batch(json!({"actions": [{"action": "left_click", "coordinate": [cx, cy]}]}))?;

    let mut via_api = Samples::new();
    for _ in 0..args.clicks {
        let started = Instant::now();
        let r = api.actions(id, &click).await?;
        via_api.push(started.elapsed());
        ensure!(r.results.iter().all(|r| r.ok), "{r:?}");
    }
    // The same click with its screenshot after it, as the MCP `computer`
    // tool answers one: through the API as one batch, and as an MCP
    // `tools/call` on `/mcp` (JSON-RPC over streamable HTTP, one
    // connection per call, as a stateless client makes them).
    let click_shot = batch(json!({"actions": [
        {"action": "left_click", "coordinate": [cx, cy]}, {"action": "screenshot"}]}))?;
    let mut via_api_shot = Samples::new();
    for _ in 0..args.clicks {
        let started = Instant::now();
        let r = api.actions(id, &click_shot).await?;
        via_api_shot.push(started.elapsed());
        ensure!(r.results.iter().all(|r| r.ok), "{r:?}");
    }
    // The MCP click with its screenshot (the default) and without
    // (`/mcp?screenshot=false`).
    let mut via_mcp = Samples::new();
    let mut via_mcp_bare = Samples::new();
    for i in 0..args.clicks * 2 {
        let call = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "name": "computer", "arguments": {"action": "left_click", "coordinate": [cx, cy]},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                      "io.modelcontextprotocol/clientCapabilities": {}}}});
        let bare = i % 2 == 1;
        let query = if bare { "&screenshot=false" } else { "" };
        let started = Instant::now();
        let answer = mcp_post(broker.addr(), broker.token(), id, query, &call).await?;
        let took = started.elapsed();
        ensure!(
            answer.contains("\"image\"") != bare && !answer.contains("\"isError\":true"),
            "{}",
            &answer[..answer.len().min(300)]
        );
        if bare {
            via_mcp_bare.push(took);
        } else {
            via_mcp.push(took);
        }
    }
    let mut via_socket = Samples::new();
    for _ in 0..args.clicks {
        let started = Instant::now();
        let answer = desk::guest_call(
            &socket,
            &Request::Actions {
                batch: click.clone(),
            },
        )
        .await?;
        via_socket.push(started.elapsed());
        ensure!(
            matches!(answer.message, Response::ActionResults(_)),
            "{:?}",
            answer.message
        );
    }
    let container = guest.container().to_owned();
    let mut via_xdotool = Samples::new();
    let (xs, ys) = (cx.to_string(), cy.to_string());
    for _ in 0..args.clicks.min(20) {
        let started = Instant::now();
        dormouse_e2e::engine::docker_ok(&[
            "exec",
            "-u",
            "1000:1000",
            "-e",
            "DISPLAY=:1",
            &container,
            "xdotool",
            "mousemove",
            &xs,
            &ys,
            "click",
            "1",
        ])
        .await?;
        via_xdotool.push(started.elapsed());
    }

    let mut shots = Vec::new();
    for format in ImageFormat::ALL {
        shots.push(shot_figures(&api, id, format, args.shots).await?);
    }

    // Typing: clear the text area, then send; done when the page holds
    // every character in place (or has stopped changing for 5 s).
    let clear = batch(json!({"actions": [
        {"action": "left_click", "coordinate": [ox + 200, oy + 100]},
        {"action": "key", "text": "ctrl+a BackSpace"}]}))?;
    let chars = args.chars as u64;
    let wait_typed = |started: Instant| {
        let guest = guest.clone();
        async move {
            let mut last = (u64::MAX, Instant::now());
            loop {
                let s = desk::page_state(&guest).await?;
                let (m, n) = (s["m"].as_u64().unwrap_or(0), s["n"].as_u64().unwrap_or(0));
                if m == chars && n == chars {
                    return Ok::<_, anyhow::Error>(Typed {
                        elapsed: started.elapsed(),
                        matching: m,
                        length: n,
                    });
                }
                if n != last.0 {
                    last = (n, Instant::now());
                } else if last.1.elapsed() > Duration::from_secs(5) {
                    return Ok(Typed {
                        elapsed: last.1.duration_since(started),
                        matching: m,
                        length: n,
                    });
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let cleared = |guest: Guest| async move {
        page_state_when(&guest, Duration::from_secs(10), |s| s["n"] == 0).await
    };
    api.actions(id, &clear).await?;
    cleared(guest.clone()).await?;
    let started = Instant::now();
    let typed = api
        .actions(
            id,
            &batch(json!({"actions": [{"action": "type", "text": text}]}))?,
        )
        .await?;
    let answered = started.elapsed();
    ensure!(typed.results[0].ok, "{:?}", typed.results);
    let ours = wait_typed(started).await?;

    let mut xdotool_runs = Vec::new();
    for delay in [None, Some("12")] {
        api.actions(id, &clear).await?;
        cleared(guest.clone()).await?;
        let mut cmd = vec![
            "exec",
            "-u",
            "1000:1000",
            "-e",
            "DISPLAY=:1",
            &container,
            "xdotool",
            "type",
        ];
        if let Some(d) = delay {
            cmd.extend(["--delay", d]);
        }
        cmd.extend(["--", &text]);
        let started = Instant::now();
        dormouse_e2e::engine::docker_ok(&cmd).await?;
        let sent = started.elapsed();
        let run = wait_typed(started).await?;
        xdotool_runs.push((delay, sent, run));
    }
    let _ = guest.sh(GuestUser::Desk, "true").await;

    let p50 = |s: &Samples| s.p50().unwrap_or_default();
    println!();
    println!("Dormouse actions on one desktop (1280x800), {} clicks, {} shots, {} chars ({non_ascii} non-ASCII)", args.clicks, args.shots, args.chars);
    println!();
    println!("{:<44} {:>9} {:>9} {:>9}", "", "p50", "p95", "max");
    let row = |name: &str, s: &Samples| {
        println!(
            "{name:<44} {:>9} {:>9} {:>9}",
            ms(s.p50()),
            ms(s.p95()),
            ms(s.max())
        );
    };
    row("left_click through the API", &via_api);
    row("left_click + screenshot through the API", &via_api_shot);
    row("MCP computer left_click (+ screenshot)", &via_mcp);
    println!(
        "{:<44} {:>9}",
        "  MCP left_click (+ screenshot) p99",
        ms(via_mcp.percentile(99.0))
    );
    row("MCP computer left_click, ?screenshot=false", &via_mcp_bare);
    println!(
        "{:<44} {:>9}",
        "  MCP left_click, ?screenshot=false p99",
        ms(via_mcp_bare.percentile(99.0))
    );
    row("left_click on the guest socket", &via_socket);
    row("docker exec xdotool mousemove+click", &via_xdotool);
    for f in &shots {
        for (way, samples, bytes) in [
            ("GET /screenshot", &f.still, f.still_bytes),
            ("screenshot action, full", &f.full, f.full_bytes),
            ("screenshot action, 1024x640", &f.scaled, f.scaled_bytes),
        ] {
            row(
                &format!("{way} {} ({} KB)", f.format, bytes / 1000),
                samples,
            );
        }
    }
    println!();
    // "sent": until the action (or docker exec) returned, every key with
    // the X server and, for the action, the focused client's answer to a
    // ping queued behind them; "page": until Chromium's page held them all.
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "typing", "sent", "chars/s", "page", "chars/s", "exact"
    );
    let trow = |name: &str, sent: Duration, t: &Typed| {
        println!(
            "{name:<44} {:>7.0}ms {:>9.0} {:>7.0}ms {:>9.0} {:>6}/{} (length {})",
            sent.as_secs_f64() * 1000.0,
            args.chars as f64 / sent.as_secs_f64(),
            t.elapsed.as_secs_f64() * 1000.0,
            t.rate(args.chars),
            t.matching,
            args.chars,
            t.length
        );
    };
    trow("type action", answered, &ours);
    for (delay, sent, run) in &xdotool_runs {
        let name = match delay {
            None => "docker exec xdotool type (default delay)".to_owned(),
            Some(d) => format!("docker exec xdotool type --delay {d}"),
        };
        trow(&name, *sent, run);
    }
    println!();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let click = p50(&via_api);
    println!(
        "target: click p50 through the API <= {} ms: {} ms, {}",
        TARGET_CLICK_P50.as_millis(),
        click.as_millis(),
        verdict(click <= TARGET_CLICK_P50)
    );
    let exact = ours.matching == chars && ours.length == chars;
    let sent_rate = args.chars as f64 / answered.as_secs_f64();
    println!(
        "target: typing >= {TARGET_CHARS_PER_S:.0} chars/s, exact: {sent_rate:.0} chars/s sent, {}/{} exact, {} \
         (the page held them at {:.0} chars/s: Chromium's own pace here)",
        ours.matching,
        args.chars,
        verdict(exact && sent_rate >= TARGET_CHARS_PER_S),
        ours.rate(args.chars),
    );
    let ratio = click.as_secs_f64() / p50(&via_xdotool).as_secs_f64().max(1e-9);
    println!(
        "target: click ratio API / docker exec xdotool <= {TARGET_CLICK_RATIO}: {ratio:.3}, {}",
        verdict(ratio <= TARGET_CLICK_RATIO)
    );
    Ok(())
}

/// The screenshots of one format: the still route, and the action at full
/// size and at 1024x640, each with the bytes of its last image.
struct ShotFigures {
    format: ImageFormat,
    still: Samples,
    still_bytes: usize,
    full: Samples,
    full_bytes: usize,
    scaled: Samples,
    scaled_bytes: usize,
}

/// `shots` of each way in `format` (its default quality).
async fn shot_figures(
    api: &dormouse_client::Client,
    id: uuid::Uuid,
    format: ImageFormat,
    shots: usize,
) -> Result<ShotFigures> {
    let encoding = ImageEncoding::new(Some(format), None)?;
    let full = serde_json::from_value::<ActionBatch>(
        json!({"actions": [{"action": "screenshot", "format": format}]}),
    )?;
    let scaled = serde_json::from_value::<ActionBatch>(json!({
        "actions": [{"action": "screenshot", "format": format}],
        "scale": {"width": 1024, "height": 640}}))?;
    let mut f = ShotFigures {
        format,
        still: Samples::new(),
        still_bytes: 0,
        full: Samples::new(),
        full_bytes: 0,
        scaled: Samples::new(),
        scaled_bytes: 0,
    };
    let image_bytes = |r: &dormouse_protocol::actions::ActionResults| -> Result<usize> {
        let image = r.results[0].image.as_ref().context("an image")?;
        ensure!(
            image.media_type == format.media_type(),
            "{}",
            image.media_type
        );
        Ok(image.data.len() * 3 / 4)
    };
    for _ in 0..shots {
        let started = Instant::now();
        let (bytes, media_type) = api.screenshot_as(id, encoding).await?;
        f.still.push(started.elapsed());
        ensure!(media_type == format.media_type(), "{media_type}");
        f.still_bytes = bytes.len();
        let started = Instant::now();
        let r = api.actions(id, &full).await?;
        f.full.push(started.elapsed());
        f.full_bytes = image_bytes(&r)?;
        let started = Instant::now();
        let r = api.actions(id, &scaled).await?;
        f.scaled.push(started.elapsed());
        f.scaled_bytes = image_bytes(&r)?;
    }
    Ok(f)
}

/// One MCP JSON-RPC request to `/mcp?desktop=ID` and `query` (`&k=v…`),
/// its answer's body.
async fn mcp_post(
    addr: std::net::SocketAddr,
    token: &str,
    id: uuid::Uuid,
    query: &str,
    body: &serde_json::Value,
) -> Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = body.to_string();
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "POST /mcp?desktop={id}{query} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: computer\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        addr.port(),
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    ensure!(
        answer.starts_with("HTTP/1.1 200"),
        "{}",
        &answer[..answer.len().min(300)]
    );
    Ok(answer)
}
