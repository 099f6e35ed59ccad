//! `dormouse-bench-exec`: the round trip of `true` in a desktop, three ways
//! in the same run, interleaved: through the broker's API
//! (`POST /v1/computers/{id}/exec`), through the guest socket directly (the
//! supervisor's `exec` request, no broker), and `docker exec <c> true`.
//! Then the workspace's export and import throughput through the API, plain
//! and gzip (with `dormouse-client`, the import streamed from a file)
//! beside GNU tar (`-c`/`-x`, and `-z` for gzip) on the
//! same tree and archive in the same run: a workspace of a few large files
//! and many small ones (`--workspace-mib`, 200 by default), written into the
//! host's workspace directory while the desktop is stopped.
//!
//! A benchmark, not a test: it prints p50/p95/min and the ratio of the API
//! to `docker exec` beside the target (≤ 0.3), and the throughputs side by
//! side, and never asserts them. The desktop it makes is removed when it
//! ends (the broker guard removes its labelled containers when dropped).

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
use dormouse_protocol::workspace::Compression;
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
    /// Size of the workspace whose export and import are measured (0: skip).
    #[arg(long, default_value_t = 200)]
    workspace_mib: u64,
    /// Rounds of export, import and their tar baselines.
    #[arg(long, default_value_t = 3)]
    workspace_rounds: usize,
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
    if args.workspace_mib > 0 {
        api.stop(id).await?;
        api.wait_stopped(&mut events, id, READY_TIMEOUT).await?;
        workspace_throughput(&broker, &api, id, args.workspace_mib, args.workspace_rounds).await?;
    }
    drop(broker);
    Ok(())
}

/// Bytes of one MiB.
const MIB: u64 = 1 << 20;

/// A deterministic filler (xorshift), so files are not runs of zeros.
fn filler(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Fills `ws` with `mib` MiB like a desktop's workspace: four large files
/// (80 % of it: a video, a disk image, datasets) and many small ones of
/// 1–16 KiB in 64 directories (sources, documents, a browser profile's
/// little files); returns (files, bytes).
fn populate(ws: &std::path::Path, mib: u64) -> Result<(u64, u64)> {
    let total = mib * MIB;
    let large_each = usize::try_from(total / 5)?;
    let (mut files, mut bytes) = (0u64, 0u64);
    let big = filler(7, large_each);
    for (i, name) in [
        "media/talk.webm",
        "vm/disk.img",
        "data/a.parquet",
        "data/b.parquet",
    ]
    .iter()
    .enumerate()
    {
        let path = ws.join(name);
        std::fs::create_dir_all(path.parent().context("parent")?)?;
        let mut data = big.clone();
        data[0] = u8::try_from(i)?;
        std::fs::write(&path, &data)?;
        files += 1;
        bytes += u64::try_from(data.len())?;
    }
    let small = filler(11, 16 * 1024);
    let mut n = 0u64;
    while bytes < total {
        let size = usize::try_from(1024 + (n * 2654435761) % (15 * 1024))?;
        let size = size.min(usize::try_from(total - bytes)?);
        let path = ws.join(format!("src/d{:02}/f{n:05}.txt", n % 64));
        if n < 64 {
            std::fs::create_dir_all(path.parent().context("parent")?)?;
        }
        std::fs::write(&path, &small[..size])?;
        files += 1;
        bytes += u64::try_from(size)?;
        n += 1;
    }
    Ok((files, bytes))
}

/// A writer that counts and drops (the client's `/dev/null`).
struct Count(u64);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += u64::try_from(buf.len()).unwrap_or(0);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `sh -c script`; its wall time.
async fn timed_sh(script: &str) -> Result<Duration> {
    let t = Instant::now();
    let out = tokio::process::Command::new("sh")
        .args(["-c", script])
        .output()
        .await?;
    let took = t.elapsed();
    ensure!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(took)
}

fn mib_per_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / MIB as f64 / took.as_secs_f64()
}

/// One compression's samples: the API's export and import, and GNU tar's
/// `-c` and `-x` of the same tree and archive.
struct Rows {
    compression: Compression,
    archive: std::path::PathBuf,
    export: Samples,
    tar_c: Samples,
    import: Samples,
    tar_x: Samples,
}

/// What GNU tar is told for a compression.
fn tar_flag(c: Compression) -> &'static str {
    match c {
        Compression::None => "",
        Compression::Gzip => "-z",
        Compression::Zstd => "--zstd",
    }
}

/// One round of one compression: export, `tar -c`, import, `tar -x`.
async fn round(
    api: &dormouse_e2e::client::ApiClient,
    id: uuid::Uuid,
    ws: &std::path::Path,
    untar: &std::path::Path,
    bytes: u64,
    rows: &mut Rows,
) -> Result<()> {
    let (ws_q, archive_q, untar_q) = (
        shell_quote(ws),
        shell_quote(&rows.archive),
        shell_quote(untar),
    );
    let flag = tar_flag(rows.compression);
    let t = Instant::now();
    let mut sink = Count(0);
    api.export_compressed(id, true, rows.compression, &mut sink)
        .await?;
    rows.export.push(t.elapsed());
    ensure!(sink.0 > 0, "an empty export");
    // GNU tar skips reading the files when it writes to /dev/null
    // itself: the archive goes through a pipe.
    rows.tar_c
        .push(timed_sh(&format!("tar -C {ws_q} {flag} -cf - . | cat > /dev/null")).await?);
    let t = Instant::now();
    let upload = dormouse_client::Upload::file(&rows.archive)
        .await?
        .compressed_as(rows.compression);
    let summary = api.import(id, upload).await?;
    rows.import.push(t.elapsed());
    ensure!(
        summary.bytes == bytes,
        "imported {summary:?}, wrote {bytes} bytes"
    );
    rows.tar_x.push(
        timed_sh(&format!(
            "rm -rf {untar_q} && mkdir {untar_q} && tar -C {untar_q} {flag} -xf {archive_q}"
        ))
        .await?,
    );
    timed_sh(&format!("rm -rf {untar_q}")).await?;
    Ok(())
}

/// Export and import of a `mib` MiB workspace through the API, plain and
/// gzip, each round beside `tar -c` of the same directory and `tar -x` of
/// the same archive into a fresh directory on the same filesystem. Rates
/// are of the uncompressed archive's size, so the rows compare.
async fn workspace_throughput(
    broker: &BrokerProcess,
    api: &dormouse_e2e::client::ApiClient,
    id: uuid::Uuid,
    mib: u64,
    rounds: usize,
) -> Result<()> {
    let ws = broker.workspace(id);
    let (files, bytes) = {
        let ws = ws.clone();
        tokio::task::spawn_blocking(move || populate(&ws, mib)).await??
    };
    let mut all = Vec::new();
    let mut tar_bytes = 0;
    for (compression, name) in [
        (Compression::None, "bench-workspace.tar"),
        (Compression::Gzip, "bench-workspace.tar.gz"),
    ] {
        let archive = broker.data_dir().join(name);
        let mut file = std::fs::File::create(&archive)?;
        let n = api
            .export_compressed(id, true, compression, &mut file)
            .await?;
        file.sync_all()?;
        if compression == Compression::None {
            tar_bytes = n;
        }
        all.push(Rows {
            compression,
            archive,
            export: Samples::new(),
            tar_c: Samples::new(),
            import: Samples::new(),
            tar_x: Samples::new(),
        });
    }
    let untar = broker.data_dir().join("bench-untar");
    for _ in 0..rounds {
        for rows in &mut all {
            round(api, id, &ws, &untar, bytes, rows).await?;
        }
    }
    let peak = broker.pid().and_then(peak_rss_kib);
    println!();
    println!(
        "workspace of {} MiB in {files} files ({} MiB archive), {rounds} rounds each, interleaved",
        bytes / MIB,
        tar_bytes / MIB
    );
    println!("{:<52} {:>12} {:>12}", "", "MiB/s (p50)", "best");
    let rate = |s: &Samples, which: fn(&Samples) -> Option<Duration>| {
        which(s).map_or_else(
            || "-".to_owned(),
            |d| format!("{:.0}", mib_per_s(tar_bytes, d)),
        )
    };
    for rows in &all {
        let c = rows.compression.name();
        let flag = tar_flag(rows.compression);
        for (name, s) in [
            (
                format!("export ({c}): GET …/workspace (client, stopped)"),
                &rows.export,
            ),
            (
                format!("  baseline: tar {flag} -c | cat > /dev/null"),
                &rows.tar_c,
            ),
            (
                format!("import ({c}): PUT …/workspace (client, file)"),
                &rows.import,
            ),
            (
                format!("  baseline: tar {flag} -x into a fresh directory"),
                &rows.tar_x,
            ),
        ] {
            println!(
                "{name:<52} {:>12} {:>12}",
                rate(s, Samples::p50),
                rate(s, Samples::min)
            );
        }
        std::fs::remove_file(&rows.archive)?;
    }
    // Streaming both ways, the broker never holds an archive: its peak RSS
    // stays far below the archive's size.
    if let Some(kib) = peak {
        println!(
            "broker peak RSS over the whole run (VmHWM): {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
    Ok(())
}

/// A process's peak resident set (`VmHWM` of `/proc/<pid>/status`), KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `path` quoted for `sh`.
fn shell_quote(path: &std::path::Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
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
