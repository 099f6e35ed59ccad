//! End-to-end: no guest-controlled size is buffered whole.
//!
//! - A 4 GiB sparse file in a stopped desktop's workspace (made on the
//!   host side, as a guest could have left it) is read with the MCP
//!   `read_file` tool through the broker's `/mcp` and through `dormouse mcp`
//!   on stdio: both refuse it as over the limit, and the broker's peak RSS
//!   (`VmHWM`, reset through `/proc/PID/clear_refs`, and `VmRSS` sampled
//!   meanwhile) grows by less than 32 MiB. The same file read whole through
//!   the files API (streamed) is measured beside them. The figures are
//!   printed.
//! - The terminal WebSocket refuses a frame past its 64 KiB bound as its
//!   header arrives: a header announcing 1 MiB, with no payload sent, closes
//!   the socket at once (before, the broker waited to buffer it, up to
//!   axum's 64 MiB).

use std::io::Write;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dormouse_client::Saved;
use dormouse_e2e::broker::{memory_kib, with_broker, BrokerProcess};
use dormouse_e2e::client::{create_ready, EventStream};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The sparse file's length.
const HUGE: u64 = 4 << 30;
/// Most the broker's peak RSS may grow by during a refused MCP read.
const RSS_BOUND_KIB: u64 = 32 * 1024;
/// A bound on hangs, not a speed claim.
const PATIENCE: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4_gib_file_is_refused_by_read_file_without_growing_the_broker() -> Result<()> {
    with_broker(
        "a_4_gib_file_is_refused_by_read_file_without_growing_the_broker",
        scenario,
    )
    .await
}

async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let name = dormouse_e2e::unique_name("bounded");
    let id = create_ready(&api, &mut events, &name, READY_TIMEOUT).await?;
    let pid = broker.pid().context("the broker runs")?;

    terminal_frame_past_the_bound_closes_at_its_header(broker, id).await?;

    // The files API and read_file work on a stopped desktop's host-side
    // workspace: no guest needed for the reads.
    api.stop(id).await?;
    let workspace = broker.workspace(id);
    let owner = std::fs::metadata(&workspace)?;
    let path = workspace.join("huge.img");
    std::fs::File::create(&path)?.set_len(HUGE)?;
    std::os::unix::fs::chown(
        &path,
        Some(std::os::unix::fs::MetadataExt::uid(&owner)),
        Some(std::os::unix::fs::MetadataExt::gid(&owner)),
    )?;
    // The witness: 4 GiB long, (next to) no disk spent.
    let meta = std::fs::metadata(&path)?;
    ensure!(meta.len() == HUGE, "{meta:?}");
    ensure!(
        std::os::unix::fs::MetadataExt::blocks(&meta) * 512 < 1 << 20,
        "not sparse"
    );

    let call = read_file_call(id);
    let (http, http_mem) = measured(pid, mcp_http(broker, &call)).await?;
    let refusal = |answer: &str, via: &str| -> Result<()> {
        ensure!(
            answer.contains("\"isError\":true") && answer.contains("is over the limit"),
            "{via}: read_file of 4 GiB is not refused as over the limit: {}",
            &answer[..answer.len().min(600)]
        );
        Ok(())
    };
    refusal(&http, "/mcp")?;

    // list_files of the same file: no byte of it is wanted, none is read.
    let mut listing = call.clone();
    listing["params"]["name"] = "list_files".into();
    let (listed, list_mem) = measured(pid, mcp_http(broker, &listing)).await?;
    ensure!(
        listed.contains("\"isError\":true") && listed.contains("is a file"),
        "list_files of a file: {}",
        &listed[..listed.len().min(600)]
    );

    let cli = cli_binary()?;
    let ((stdio, cli_hwm), stdio_mem) = measured(pid, mcp_stdio(broker, &cli, &call)).await?;
    refusal(&stdio, "dormouse mcp")?;

    let mut sink = Counted::default();
    let (saved, files_mem) = measured(pid, async {
        api.fetch_into(id, "huge.img", &mut sink)
            .await
            .map_err(anyhow::Error::from)
    })
    .await?;
    ensure!(saved == Saved::File(HUGE), "{saved:?}");
    ensure!(sink.0 == HUGE);

    eprintln!("broker memory during one read of a 4 GiB sparse file (KiB):");
    for (via, m) in [
        ("MCP read_file over /mcp", &http_mem),
        ("MCP list_files of it over /mcp", &list_mem),
        ("MCP read_file over dormouse mcp", &stdio_mem),
        ("files API, streamed whole", &files_mem),
    ] {
        eprintln!(
            "  {via:34} rss before {:>7}  peak (VmHWM) {:>7}  sampled peak VmRSS {:>7}  \
             growth {:>7}  in {:?}",
            m.before,
            m.hwm,
            m.sampled_peak,
            m.growth(),
            m.took
        );
    }
    eprintln!("  dormouse mcp (the CLI's own) peak VmHWM {cli_hwm} KiB");
    for (via, m) in [
        ("/mcp", &http_mem),
        ("list_files", &list_mem),
        ("dormouse mcp", &stdio_mem),
    ] {
        ensure!(
            m.growth() < RSS_BOUND_KIB,
            "{via}: the broker's peak RSS grew by {} KiB (bound {RSS_BOUND_KIB} KiB)",
            m.growth()
        );
    }
    ensure!(
        cli_hwm < 64 * 1024,
        "dormouse mcp itself peaked at {cli_hwm} KiB"
    );
    std::fs::remove_file(&path)?;
    Ok(())
}

/// The broker's memory around one operation, in KiB.
#[derive(Debug)]
struct Memory {
    before: u64,
    hwm: u64,
    sampled_peak: u64,
    took: Duration,
}

impl Memory {
    /// How far the peak went above the resident set before.
    fn growth(&self) -> u64 {
        self.hwm.max(self.sampled_peak).saturating_sub(self.before)
    }
}

/// Runs `op` while watching broker `pid`: its peak RSS is reset first
/// (`5` into `clear_refs`, so `VmHWM` is this operation's), and `VmRSS` is
/// sampled every 2 ms meanwhile as a second witness.
async fn measured<T>(
    pid: u32,
    op: impl std::future::Future<Output = Result<T>>,
) -> Result<(T, Memory)> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .context("resetting the broker's VmHWM")?;
    let (before, _) = memory_kib(pid)?;
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = {
        let (done, peak) = (done.clone(), peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Ok((rss, _)) = memory_kib(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let started = Instant::now();
    let result = tokio::time::timeout(PATIENCE, op).await;
    let took = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let value = result.context("the read did not end")??;
    let (_, hwm) = memory_kib(pid)?;
    Ok((
        value,
        Memory {
            before,
            hwm,
            sampled_peak: peak.load(Ordering::Relaxed),
            took,
        },
    ))
}

/// A writer that only counts.
#[derive(Debug, Default)]
struct Counted(u64);

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += u64::try_from(buf.len()).unwrap_or(u64::MAX);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn read_file_call(id: Uuid) -> serde_json::Value {
    serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "read_file", "arguments": {"path": "huge.img", "desktop": id.to_string()},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientInfo": {"name": "bounded-reads", "version": "1"},
                  "io.modelcontextprotocol/clientCapabilities": {}}}})
}

/// One `tools/call` POSTed to `/mcp` (stateless, one connection), its
/// answer's body.
async fn mcp_http(broker: &BrokerProcess, call: &serde_json::Value) -> Result<String> {
    let addr = broker.addr();
    let body = call.to_string();
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        addr.port(),
        broker.token(),
        call["params"]["name"].as_str().unwrap_or_default(),
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

/// The same call through `dormouse mcp` on stdio: its answer line, and the
/// CLI's own peak RSS (KiB) once it answered.
async fn mcp_stdio(
    broker: &BrokerProcess,
    cli: &std::path::Path,
    call: &serde_json::Value,
) -> Result<(String, u64)> {
    let url = format!("http://{}", broker.addr());
    let mut child = tokio::process::Command::new(cli)
        .args(["--url", &url, "mcp"])
        .env("DORMOUSE_TOKEN", broker.token())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting dormouse mcp")?;
    let cli_pid = child.id().context("dormouse mcp runs")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "bounded-reads", "version": "1"}}});
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let mut call = call.clone();
    if let Some(params) = call["params"].as_object_mut() {
        params.remove("_meta");
    }
    for line in [&init, &initialized, &call] {
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
    }
    stdin.flush().await?;
    let answer = loop {
        let line = lines
            .next_line()
            .await?
            .context("dormouse mcp closed its stdout before answering")?;
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("not JSON-RPC: {line}"))?;
        if v["id"] == 2 {
            break v.to_string();
        }
    };
    let (_, cli_hwm) = memory_kib(cli_pid)?;
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    if status.is_err() {
        let _ = child.kill().await;
    }
    Ok((answer, cli_hwm))
}

/// Opens the terminal WebSocket by hand and sends only the header of a
/// binary frame announcing 1 MiB (above the 64 KiB bound, below axum's
/// defaults): the broker must close the socket without waiting for the
/// payload.
async fn terminal_frame_past_the_bound_closes_at_its_header(
    broker: &BrokerProcess,
    id: Uuid,
) -> Result<()> {
    let addr = broker.addr();
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "GET /v1/computers/{id}/exec/ws?argv=/bin/cat HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
         Authorization: Bearer {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        addr.port(),
        broker.token()
    );
    conn.write_all(head.as_bytes()).await?;
    let mut response = Vec::new();
    let mut byte = [0u8; 1];
    while !response.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut byte))
            .await
            .context("no handshake answer")??;
        if n == 0 {
            bail!(
                "closed during the handshake: {}",
                String::from_utf8_lossy(&response)
            );
        }
        response.push(byte[0]);
    }
    let response = String::from_utf8_lossy(&response);
    ensure!(response.starts_with("HTTP/1.1 101"), "{response}");
    // FIN + binary; masked, 64-bit length of 1 MiB; a zero mask key.
    let mut frame = vec![0x82, 0x80 | 127];
    frame.extend_from_slice(&(1u64 << 20).to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    conn.write_all(&frame).await?;
    let started = Instant::now();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut rest)).await;
    let took = started.elapsed();
    ensure!(
        closed.is_ok(),
        "the broker kept the socket open, waiting for a 1 MiB frame past the 64 KiB bound"
    );
    eprintln!(
        "terminal: a frame header announcing 1 MiB closed the socket in {took:?} \
         ({} bytes answered, no payload sent)",
        rest.len()
    );
    Ok(())
}

/// The `dormouse` CLI: `$DORMOUSE_BIN_DIR/dormouse`, or built next to this
/// test's own target directory.
fn cli_binary() -> Result<std::path::PathBuf> {
    if let Some(dir) = std::env::var_os("DORMOUSE_BIN_DIR") {
        let path = std::path::PathBuf::from(dir).join("dormouse");
        ensure!(path.is_file(), "{} does not exist", path.display());
        return Ok(path);
    }
    let exe = std::env::current_exe()?;
    let mut profile = exe.parent().context("exe dir")?;
    if profile.ends_with("deps") {
        profile = profile.parent().context("deps parent")?;
    }
    let target = profile.parent().context("target dir")?;
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?
        .join("Cargo.toml");
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
        .arg(manifest)
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
