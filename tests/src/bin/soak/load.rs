//! The workloads a soak cycle runs on its desktops while the fault lands:
//! the file write loop, typing into the witness, a view and a control
//! screen, an exec streaming output, an export and an import. Each runs as
//! a task until the cycle's stop signal (or its own end) and reports what
//! the API acknowledged, which is what the oracle then holds it to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use dormouse_client::Upload;
use dormouse_e2e::archive::{tar, tar_entry};
use dormouse_e2e::client::ApiClient;
use dormouse_e2e::guest::Guest;
use dormouse_e2e::rfb::{set_encodings, set_pixel_format_bgrx, update_request, RfbViewer, TokenIn};
use dormouse_protocol::actions::{Action, ActionBatch};
use dormouse_protocol::screen::{CreateScreen, ScreenMode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::plan::Activity;
use crate::witness;

/// Marker in the command line of every exec the soak starts, so leftovers
/// are found by it.
pub(crate) const EXEC_MARK: &str = "soak-exec-";

/// What a desktop's load needs.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) api: ApiClient,
    pub(crate) id: Uuid,
    pub(crate) guest: Guest,
    /// `ws://host:port` of the broker.
    pub(crate) ws_base: String,
    /// Unique per cycle and desktop, e.g. `c12d3`.
    pub(crate) tag: String,
    pub(crate) seed: u64,
}

/// An archive imported (or tried), and whether the API acknowledged it.
#[derive(Debug, Clone)]
pub(crate) struct ImportOutcome {
    pub(crate) acked: bool,
    pub(crate) error: Option<String>,
    /// Workspace-relative path and contents, the manifest last.
    pub(crate) entries: Vec<(String, Vec<u8>)>,
}

/// How an export ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExportOutcome {
    /// The API answered the whole stream: its size and whether it ends as
    /// a tar must (a multiple of 512 bytes, two zero blocks at the end).
    Acked { bytes: u64, well_formed: bool },
    /// It broke off with an error (fair under a fault).
    Broken(String),
    /// The cycle's stop came first.
    Abandoned,
}

/// What one load saw acknowledged.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Workspace-relative paths whose write the API acknowledged.
    pub(crate) files: Vec<(String, Vec<u8>)>,
    /// Typed tokens acknowledged and seen saved by the witness.
    pub(crate) typed_saved: Vec<String>,
    /// Typed tokens acknowledged but not (yet) seen saved.
    pub(crate) typed_unconfirmed: Vec<String>,
    pub(crate) import: Option<ImportOutcome>,
    pub(crate) export: Option<ExportOutcome>,
    /// Screen updates received on the view screen.
    pub(crate) frames: u64,
    /// Output messages of the exec.
    pub(crate) exec_chunks: u64,
    /// Why it ended early, when it did (for the log).
    pub(crate) note: Option<String>,
}

/// A load running as a task.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) activity: Activity,
    /// Acknowledged steps so far (writes, batches, frames, output
    /// messages, bytes).
    pub(crate) progress: Arc<AtomicU64>,
    /// The progress at which the fault may land.
    pub(crate) threshold: u64,
    pub(crate) task: JoinHandle<Report>,
}

impl Running {
    /// Whether the load is in flight and far enough for the fault.
    pub(crate) fn reached(&self) -> bool {
        self.task.is_finished() || self.progress.load(Ordering::Relaxed) >= self.threshold
    }
}

/// Starts `activity` on a desktop.
pub(crate) fn spawn(activity: Activity, ctx: Ctx, stop: watch::Receiver<bool>) -> Running {
    let progress = Arc::new(AtomicU64::new(0));
    let p = Arc::clone(&progress);
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let (threshold, task) = match activity {
        Activity::FileWrites => (3, tokio::spawn(file_writes(ctx, stop, p))),
        Activity::Typing => (1, tokio::spawn(typing(ctx, stop, p))),
        Activity::Screen => (2, tokio::spawn(screen(ctx, stop, p))),
        Activity::Exec => (3, tokio::spawn(exec(ctx, stop, p))),
        Activity::Export => (1, tokio::spawn(export(ctx, stop, p))),
        Activity::Import => {
            let entries = archive(&mut rng, &ctx.tag);
            let body = tar(&entries
                .iter()
                .map(|(name, data)| tar_entry(name, b'0', data, ""))
                .collect::<Vec<_>>());
            let total = u64::try_from(body.len()).unwrap_or(u64::MAX);
            let at = rng.gen_range(total / 20..total);
            (at, tokio::spawn(import(ctx, p, entries, body)))
        }
    };
    Running {
        activity,
        progress,
        threshold,
        task,
    }
}

/// Sleeps `d` unless the stop comes first; `true` when stopped.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        _ = stop.changed() => true,
        () = tokio::time::sleep(d) => *stop.borrow(),
    }
}

async fn file_writes(ctx: Ctx, mut stop: watch::Receiver<bool>, p: Arc<AtomicU64>) -> Report {
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0xf11e);
    let mut report = Report::default();
    for n in 0..10_000u32 {
        let len = rng.gen_range(1..4096);
        let mut data = vec![0u8; len];
        rng.fill(&mut data[..]);
        let path = format!("soak/{}-{n}", ctx.tag);
        if ctx
            .api
            .write_file(ctx.id, &path, Upload::bytes(data.clone()), true)
            .await
            .is_ok()
        {
            report.files.push((path, data));
            p.fetch_add(1, Ordering::Relaxed);
        }
        if pause(&mut stop, Duration::from_millis(rng.gen_range(20..120))).await {
            break;
        }
    }
    report
}

async fn typing(ctx: Ctx, mut stop: watch::Receiver<bool>, p: Arc<AtomicU64>) -> Report {
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x7e7);
    let mut report = Report::default();
    if let Err(e) = witness::focus(&ctx.guest).await {
        report.note = Some(format!("{e:#}"));
        return report;
    }
    for n in 0..1000u32 {
        let word: String = (0..6)
            .map(|_| char::from(b'a' + rng.gen_range(0..26u8)))
            .collect();
        // Dots around each token: one cut short by a fault cannot run
        // into the next.
        let token = format!("{}n{n}{word}", ctx.tag);
        let batch = ActionBatch {
            actions: vec![Action::Type {
                text: format!(".{token}."),
            }],
            scale: None,
            cursor: false,
        };
        if ctx.api.actions(ctx.id, &batch).await.is_ok() {
            if witness::wait_saved(&ctx.guest, &token, Duration::from_secs(3)).await {
                report.typed_saved.push(token);
                p.fetch_add(1, Ordering::Relaxed);
            } else {
                report.typed_unconfirmed.push(token);
            }
        }
        if pause(&mut stop, Duration::from_millis(50)).await {
            break;
        }
    }
    report
}

async fn screen(ctx: Ctx, mut stop: watch::Receiver<bool>, p: Arc<AtomicU64>) -> Report {
    let mut report = Report::default();
    let mut minted = Vec::new();
    if let Err(e) = watch_screen(&ctx, &mut stop, &p, &mut minted).await {
        report.note = Some(format!("{e:#}"));
    }
    report.frames = p.load(Ordering::Relaxed);
    // Capabilities are counted per desktop: give them back.
    for screen_id in minted {
        let _ = ctx.api.revoke_screen(screen_id).await;
    }
    report
}

async fn open_screen(ctx: &Ctx, mode: ScreenMode, minted: &mut Vec<Uuid>) -> Result<RfbViewer> {
    let grant = ctx
        .api
        .create_screen(
            ctx.id,
            &CreateScreen {
                mode,
                ttl_ms: Some(600_000),
                reason: None,
            },
        )
        .await?;
    minted.push(grant.screen_id);
    let url = format!("{}{}", ctx.ws_base, grant.websocket);
    let mut viewer = RfbViewer::connect(&url, &grant.token, TokenIn::Subprotocol).await?;
    viewer.handshake().await?;
    Ok(viewer)
}

async fn watch_screen(
    ctx: &Ctx,
    stop: &mut watch::Receiver<bool>,
    p: &AtomicU64,
    minted: &mut Vec<Uuid>,
) -> Result<()> {
    let mut view = open_screen(ctx, ScreenMode::View, minted).await?;
    // Open and quiet: a control screen sends no input here (the typing
    // witness must keep the focus), it only holds its connection.
    let control = open_screen(ctx, ScreenMode::Control, minted).await?;
    view.send(&set_pixel_format_bgrx()).await?;
    view.send(&set_encodings(&[16, 0])).await?;
    view.send(&update_request(false, 0, 0, 1280, 800)).await?;
    for _ in 0..100_000u32 {
        tokio::select! {
            _ = stop.changed() => break,
            update = view.read_update() => {
                update.context("view screen")?;
                p.fetch_add(1, Ordering::Relaxed);
                view.send(&update_request(true, 0, 0, 1280, 800)).await?;
            }
        }
    }
    view.close().await;
    control.close().await;
    Ok(())
}

async fn exec(ctx: Ctx, mut stop: watch::Receiver<bool>, p: Arc<AtomicU64>) -> Report {
    let mut report = Report::default();
    let script = format!(
        "i=0; while [ $i -lt 6000 ]; do echo {EXEC_MARK}{} $i; i=$((i+1)); sleep 0.05; done",
        ctx.tag
    );
    let argv = ["sh".to_owned(), "-c".to_owned(), script];
    let mut term = match ctx.api.exec_ws(ctx.id, 24, 80, &argv).await {
        Ok(term) => term,
        Err(e) => {
            report.note = Some(format!("exec/ws: {e}"));
            return report;
        }
    };
    for _ in 0..100_000u32 {
        tokio::select! {
            _ = stop.changed() => break,
            event = term.output.next() => match event {
                Ok(Some(dormouse_client::TerminalEvent::Output(_))) => {
                    p.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Some(dormouse_client::TerminalEvent::Exit { .. })) | Ok(None) => break,
                Ok(Some(dormouse_client::TerminalEvent::Error { code, message })) => {
                    report.note = Some(format!("exec: {code}: {message}"));
                    break;
                }
                Err(e) => {
                    report.note = Some(format!("exec: {e}"));
                    break;
                }
            }
        }
    }
    let _ = term.input.close().await;
    report.exec_chunks = p.load(Ordering::Relaxed);
    report
}

/// A `Write` that counts what it is given into `progress`, keeps the last
/// 1024 bytes, and goes slowly enough for a fault to land mid-stream.
struct Sink {
    progress: Arc<AtomicU64>,
    total: u64,
    tail: Vec<u8>,
}

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.total += u64::try_from(buf.len()).unwrap_or(0);
        self.progress.store(self.total, Ordering::Relaxed);
        self.tail.extend_from_slice(buf);
        if self.tail.len() > 1024 {
            self.tail.drain(..self.tail.len() - 1024);
        }
        std::thread::sleep(Duration::from_millis(1));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn export(ctx: Ctx, mut stop: watch::Receiver<bool>, p: Arc<AtomicU64>) -> Report {
    let quiesce = ctx.seed % 2 == 0;
    let api = ctx.api.clone();
    let mut streaming = tokio::spawn(async move {
        let mut sink = Sink {
            progress: p,
            total: 0,
            tail: Vec::new(),
        };
        let answer = api.export(ctx.id, quiesce, &mut sink).await;
        (answer, sink)
    });
    let outcome = tokio::select! {
        _ = stop.changed() => {
            streaming.abort();
            ExportOutcome::Abandoned
        }
        done = &mut streaming => match done {
            Ok((Ok(bytes), sink)) => ExportOutcome::Acked {
                bytes,
                well_formed: bytes == sink.total
                    && bytes % 512 == 0
                    && sink.tail.len() == 1024
                    && sink.tail.iter().all(|b| *b == 0),
            },
            Ok((Err(e), _)) => ExportOutcome::Broken(e.to_string()),
            Err(e) => ExportOutcome::Broken(format!("export task: {e}")),
        },
    };
    Report {
        export: Some(outcome),
        ..Report::default()
    }
}

/// The archive of an import: eight files of 512 KiB under
/// `soak-import/<tag>/`, then its `MANIFEST` (names and sizes), last, so a
/// manifest without every file before it is a half import.
fn archive(rng: &mut StdRng, tag: &str) -> Vec<(String, Vec<u8>)> {
    let mut entries = Vec::new();
    let mut manifest = String::new();
    for i in 0..8 {
        let mut data = vec![0u8; 512 * 1024];
        rng.fill(&mut data[..]);
        let name = format!("soak-import/{tag}/f{i}");
        manifest.push_str(&format!("{name} {}\n", data.len()));
        entries.push((name, data));
    }
    entries.push((format!("soak-import/{tag}/MANIFEST"), manifest.into_bytes()));
    entries
}

async fn import(
    ctx: Ctx,
    p: Arc<AtomicU64>,
    entries: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
) -> Report {
    let (mut tx, rx) = tokio::io::duplex(64 * 1024);
    let feeder = tokio::spawn(async move {
        for chunk in body.chunks(16 * 1024) {
            if tx.write_all(chunk).await.is_err() {
                return;
            }
            p.fetch_add(u64::try_from(chunk.len()).unwrap_or(0), Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let _ = tx.shutdown().await;
    });
    let answer = ctx.api.import(ctx.id, Upload::reader(rx)).await;
    feeder.abort();
    Report {
        import: Some(ImportOutcome {
            acked: answer.is_ok(),
            error: answer.err().map(|e| e.to_string()),
            entries,
        }),
        ..Report::default()
    }
}
