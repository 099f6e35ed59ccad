//! The readiness self-probe: proves to the supervisor itself that a person or
//! an agent can use the desktop now.
//!
//! Owns the health checks (`x_display`, `window_manager`, `vnc`, `screenshot`,
//! `browser_profiles`, `workspace`, `identity`, `services` when the
//! service table is known, and `egress_proxy` where the proxy runs) and the loop that re-probes whenever the service
//! set changes. It only *reports*: it writes the report into the
//! [`StatusCell`] (which alone derives `ready`), and it never restarts,
//! signals or repairs anything it finds broken — that is the service
//! runner's and the preparation's job.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use dormouse_protocol::{
    Check, CheckStatus, ContainerStartIdentity, HealthReport, Phase, ServiceRunState, ServiceState,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use x11rb::rust_connection::RustConnection;

use crate::config::Config;
use crate::screenshot::{self, CaptureStats, CountingWriter};
use crate::status::StatusCell;
use crate::x_client::{self, WmState, XError};

/// Check names, stable for clients.
pub mod checks {
    /// The X display answers with the configured root geometry.
    pub const X_DISPLAY: &str = "x_display";
    /// A window manager announced itself on the root window.
    pub const WINDOW_MANAGER: &str = "window_manager";
    /// The VNC server speaks RFB on loopback.
    pub const VNC: &str = "vnc";
    /// A complete capture of the whole screen could be made.
    pub const SCREENSHOT: &str = "screenshot";
    /// The browser profile links point into the workspace.
    pub const BROWSER_PROFILES: &str = "browser_profiles";
    /// The workspace is writable, persistent and has room.
    pub const WORKSPACE: &str = "workspace";
    /// The container-start identity is known and current.
    pub const IDENTITY: &str = "identity";
    /// Every supervised service runs (only when the table is known).
    pub const SERVICES: &str = "services";
    /// The egress proxy serves its loopback port (only where it runs).
    pub const EGRESS_PROXY: &str = crate::egress::CHECK_NAME;
}

/// Service names the service runner may give the window manager.
const WM_SERVICE_NAMES: &[&str] = &["openbox", "wm", "window_manager", "window-manager"];

/// First retry after a failed probe; doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(25);
/// Longest wait between retries of a failing probe.
const RETRY_MAX: Duration = Duration::from_secs(1);
/// Longest wait between retries of a degraded probe when periodic
/// re-probing is off.
const DEGRADED_RETRY_MAX: Duration = Duration::from_secs(60);

/// Runs every check once and builds the report. `services` is the service
/// table when the caller knows it (empty from the `probe` subcommand).
pub async fn probe_once(config: &Config, services: &[ServiceState]) -> HealthReport {
    probe_with(config, services, None).await
}

/// Like [`probe_once`], and the identity check also compares the identity
/// the supervisor reports with a fresh reading.
pub async fn probe_with(
    config: &Config,
    services: &[ServiceState],
    reported: Option<&ContainerStartIdentity>,
) -> HealthReport {
    let files_config = config.clone();
    let files = tokio::task::spawn_blocking(move || {
        (
            browser_profiles_check(&files_config),
            workspace_check(&files_config),
        )
    });
    let (x, vnc, files) = tokio::join!(x_checks(config, services), vnc_check(config), files);
    let (profiles, workspace) = files.unwrap_or_else(|e| {
        let detail = format!("file checks did not finish: {e}");
        (
            Check::new(checks::BROWSER_PROFILES, CheckStatus::Fail, detail.clone()),
            Check::new(checks::WORKSPACE, CheckStatus::Fail, detail),
        )
    });
    let [x_display, window_manager, screenshot] = x;
    let mut all = vec![
        x_display,
        window_manager,
        vnc,
        screenshot,
        profiles,
        workspace,
        identity_check(config, reported),
    ];
    if !services.is_empty() {
        all.push(services_check(services));
    }
    all.extend(crate::egress::health_check());
    HealthReport::from_checks(all, Utc::now())
}

/// Probes whenever the service set changes and every service runs, and
/// writes each report with the epoch it was made against. A failing probe is
/// retried after a short, doubling delay (at most [`RETRY_MAX`]) or at once
/// when the services change; a degraded one likewise, with the delay growing
/// up to the regular interval; a passing one is repeated every
/// `config.reprobe_interval_ms`. Returns when the status cell is gone.
pub async fn run_probe_loop(config: Arc<Config>, cell: StatusCell) {
    let mut rx = cell.subscribe();
    let mut retry = RETRY_FIRST;
    let mut last_epoch = None;
    loop {
        // Status first, then epoch: a change between the two is seen again
        // by `changed()`, so nothing is missed.
        let status = rx.borrow_and_update().clone();
        let epoch = cell.services_epoch();
        let services = cell.needed(&status.services);
        if !probe_due(status.phase, &services) {
            if rx.changed().await.is_err() {
                return;
            }
            continue;
        }
        if last_epoch != Some(epoch) {
            retry = RETRY_FIRST;
            last_epoch = Some(epoch);
        }
        let started = Instant::now();
        let report = probe_with(&config, &services, Some(cell.identity())).await;
        let overall = report.overall;
        tracing::info!(
            epoch,
            overall = ?report.overall,
            elapsed_ms = crate::millis(started.elapsed()),
            failing = %failing_checks(&report),
            "self-probe"
        );
        cell.set_health(epoch, report);
        let interval = (config.reprobe_interval_ms > 0)
            .then(|| Duration::from_millis(config.reprobe_interval_ms));
        let next = match overall {
            CheckStatus::Ok => {
                retry = RETRY_FIRST;
                interval
            }
            // Usable, but often only for a moment (a window manager that
            // has not announced itself yet): look again soon, then ever
            // less often, up to the regular interval.
            CheckStatus::Degraded => {
                let wait = retry;
                retry = (retry * 2).min(interval.unwrap_or(DEGRADED_RETRY_MAX));
                Some(wait)
            }
            CheckStatus::Fail => {
                let wait = retry.min(RETRY_MAX);
                retry = (retry * 2).min(RETRY_MAX);
                Some(wait)
            }
        };
        if !wait_for_reprobe(&mut rx, &cell, epoch, next).await {
            return;
        }
    }
}

/// Whether the status asks for a probe: the services readiness waits for
/// all running, not preparing or stopping.
fn probe_due(phase: Phase, services: &[ServiceState]) -> bool {
    !matches!(phase, Phase::Preparing | Phase::Stopping)
        && !services.is_empty()
        && services.iter().all(|s| s.state == ServiceRunState::Running)
}

/// Waits until the service set leaves `epoch`, the status no longer asks for
/// a probe, or `after` passes. Changes that keep the epoch (such as the
/// report just written) do not end the wait. `false` when the cell is gone.
async fn wait_for_reprobe(
    rx: &mut tokio::sync::watch::Receiver<dormouse_protocol::GuestStatus>,
    cell: &StatusCell,
    epoch: u64,
    after: Option<Duration>,
) -> bool {
    let deadline = after.map(|d| tokio::time::Instant::now() + d);
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return false;
                }
                // The borrow ends before the cell's lock is taken (the cell
                // takes its lock, then the channel's).
                let (phase, services) = {
                    let status = rx.borrow();
                    (status.phase, status.services.clone())
                };
                let due = probe_due(phase, &cell.needed(&services));
                if cell.services_epoch() != epoch || !due {
                    return true;
                }
                // The report we wrote ourselves, or another change that keeps
                // the services as probed (`changed` marked it seen): wait on.
            }
            () = sleep_until(deadline) => return true,
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn failing_checks(report: &HealthReport) -> String {
    report
        .checks
        .iter()
        .filter(|c| c.status != CheckStatus::Ok)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect::<Vec<_>>()
        .join("; ")
}

// ---- X: display, window manager, screenshot -------------------------------

/// What one X session found.
#[derive(Debug)]
struct XFindings {
    geometry: (u32, u32, u8),
    wm: Result<WmState, String>,
    screenshot: Option<Result<(CaptureStats, Duration), String>>,
}

/// `[x_display, window_manager, screenshot]`, from one X connection.
async fn x_checks(config: &Config, services: &[ServiceState]) -> [Check; 3] {
    let bound = Duration::from_millis(config.probe_timeout_ms);
    let display = config.display_name();
    let (width, height) = (config.width, config.height);
    // The capture slot bounds memory: never two screens in flight at once.
    let slot = tokio::time::timeout(bound, screenshot::CAPTURE_SLOT.acquire()).await;
    let findings = match slot {
        Ok(Ok(_permit)) => {
            x_client::with_display(config, bound, move |conn, screen| {
                let geometry = x_client::root_geometry(conn, screen)?;
                let root = conn_root(conn, screen)?;
                let wm = x_client::atom(conn, b"_NET_SUPPORTING_WM_CHECK")
                    .and_then(|check| x_client::wm_state(conn, root, check))
                    .map_err(|e| e.to_string());
                let screenshot = (geometry.0 == width && geometry.1 == height).then(|| {
                    let started = Instant::now();
                    let sink = CountingWriter {
                        inner: std::io::sink(),
                        count: 0,
                    };
                    screenshot::encode_root(conn, screen, sink)
                        .map(|stats| (stats, started.elapsed()))
                        .map_err(|e| e.to_string())
                });
                Ok(XFindings {
                    geometry,
                    wm,
                    screenshot,
                })
            })
            .await
        }
        _ => Err(XError::Timeout(bound)),
    };
    let findings = match findings {
        Ok(f) => f,
        Err(e) => {
            let why = format!("display {display} unusable: {e}");
            return [
                Check::new(checks::X_DISPLAY, CheckStatus::Fail, why.clone()),
                Check::new(checks::WINDOW_MANAGER, CheckStatus::Fail, why.clone()),
                Check::new(checks::SCREENSHOT, CheckStatus::Fail, why),
            ];
        }
    };
    let (w, h, depth) = findings.geometry;
    let x_display = if (w, h) == (width, height) {
        Check::new(
            checks::X_DISPLAY,
            CheckStatus::Ok,
            format!("display {display} answers, root {w}x{h} depth {depth}"),
        )
    } else {
        Check::new(
            checks::X_DISPLAY,
            CheckStatus::Fail,
            format!("display {display} root is {w}x{h}, configured {width}x{height}"),
        )
    };
    let window_manager = wm_check(findings.wm, services);
    let screenshot = match findings.screenshot {
        None => Check::new(
            checks::SCREENSHOT,
            CheckStatus::Fail,
            format!("screen is {w}x{h}, not the configured {width}x{height}"),
        ),
        Some(Err(e)) => Check::new(checks::SCREENSHOT, CheckStatus::Fail, e),
        Some(Ok((stats, took))) => Check::new(
            checks::SCREENSHOT,
            CheckStatus::Ok,
            format!(
                "complete {}x{} capture in {} strips, {} B png, {} ms",
                stats.width,
                stats.height,
                stats.strips,
                stats.bytes,
                took.as_millis()
            ),
        ),
    };
    [x_display, window_manager, screenshot]
}

fn conn_root(conn: &RustConnection, screen: usize) -> Result<u32, XError> {
    x_client::root_window(conn, screen)
}

fn wm_check(wm: Result<WmState, String>, services: &[ServiceState]) -> Check {
    let running_wm = services.iter().find(|s| {
        WM_SERVICE_NAMES.contains(&s.name.as_str()) && s.state == ServiceRunState::Running
    });
    let fallback = |why: String| match running_wm {
        Some(s) => Check::new(
            checks::WINDOW_MANAGER,
            CheckStatus::Degraded,
            format!(
                "{why}; {} runs (pid {})",
                s.name,
                s.pid.map_or_else(|| "?".into(), |p| p.to_string())
            ),
        ),
        None => Check::new(checks::WINDOW_MANAGER, CheckStatus::Fail, why),
    };
    match wm {
        Ok(WmState::Present { window, name }) => Check::new(
            checks::WINDOW_MANAGER,
            CheckStatus::Ok,
            format!(
                "{} announced on window {window:#x}",
                name.as_deref().unwrap_or("a window manager")
            ),
        ),
        Ok(WmState::Missing) => fallback("no _NET_SUPPORTING_WM_CHECK on the root window".into()),
        Ok(WmState::Stale { window }) => fallback(format!(
            "_NET_SUPPORTING_WM_CHECK names window {window:#x}, which does not answer"
        )),
        Err(e) => fallback(format!("cannot read the root window: {e}")),
    }
}

// ---- VNC --------------------------------------------------------------------

/// Connects to the VNC server on loopback and reads its RFB banner.
async fn vnc_check(config: &Config) -> Check {
    let bound = Duration::from_millis(config.probe_timeout_ms);
    let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, config.vnc_port));
    let banner = tokio::time::timeout(bound, async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        // Speak first: libvncserver waits up to 100 ms for a client's first
        // bytes to tell WebSocket from RFB before it sends its banner. Our
        // own version string ends that wait at once, and a server that
        // follows the protocol reads it as the answer to its banner.
        stream.write_all(CLIENT_VERSION).await?;
        let mut banner = [0u8; 12];
        stream.read_exact(&mut banner).await?;
        Ok::<_, std::io::Error>(banner)
    })
    .await;
    match banner {
        Ok(Ok(banner)) if is_rfb_banner(&banner) => Check::new(
            checks::VNC,
            CheckStatus::Ok,
            format!("{} on {addr}", String::from_utf8_lossy(&banner[..11])),
        ),
        Ok(Ok(banner)) => Check::new(
            checks::VNC,
            CheckStatus::Fail,
            format!(
                "{addr} answered {:?}, not an RFB banner",
                String::from_utf8_lossy(&banner)
            ),
        ),
        Ok(Err(e)) => Check::new(checks::VNC, CheckStatus::Fail, format!("{addr}: {e}")),
        Err(_) => Check::new(
            checks::VNC,
            CheckStatus::Fail,
            format!("{addr} sent no banner within {bound:?}"),
        ),
    }
}

/// The protocol version the VNC check announces.
const CLIENT_VERSION: &[u8; 12] = b"RFB 003.008\n";

/// `RFB xxx.yyy\n` with three digits on each side.
fn is_rfb_banner(b: &[u8; 12]) -> bool {
    b.starts_with(b"RFB ")
        && b[4..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'.'
        && b[8..11].iter().all(u8::is_ascii_digit)
        && b[11] == b'\n'
}

// ---- Files: profile links, workspace ----------------------------------------

/// The links the preparation makes, and where each must point.
pub fn expected_links(config: &Config) -> Vec<(PathBuf, PathBuf)> {
    crate::prepare::profiles::links(config)
        .into_iter()
        .map(|l| (l.link, l.target))
        .collect()
}

/// Every profile link is a symlink to its place in the workspace, and that
/// place is a real directory (a symlink there could lead out of the
/// workspace). Nothing is followed but the one link read.
fn browser_profiles_check(config: &Config) -> Check {
    let mut worst = CheckStatus::Ok;
    let mut problems = Vec::new();
    let links = expected_links(config);
    for (link, want) in &links {
        let (status, problem) = link_status(link, want);
        worst = worst.max(status);
        if let Some(p) = problem {
            problems.push(p);
        }
    }
    let detail = if problems.is_empty() {
        format!("{} links into {}", links.len(), config.workspace.display())
    } else {
        problems.join("; ")
    };
    Check::new(checks::BROWSER_PROFILES, worst, detail)
}

fn link_status(link: &Path, want: &Path) -> (CheckStatus, Option<String>) {
    let shown = link.display();
    match std::fs::symlink_metadata(link) {
        Ok(m) if m.file_type().is_symlink() => {}
        Ok(_) => return (CheckStatus::Fail, Some(format!("{shown} is not a link"))),
        Err(e) => return (CheckStatus::Fail, Some(format!("{shown}: {e}"))),
    }
    let target = match std::fs::read_link(link) {
        Ok(t) => t,
        Err(e) => return (CheckStatus::Fail, Some(format!("{shown}: {e}"))),
    };
    let resolved = if target.is_absolute() {
        normalize(&target)
    } else {
        normalize(&link.parent().unwrap_or(Path::new("/")).join(&target))
    };
    if resolved != normalize(want) {
        return (
            CheckStatus::Fail,
            Some(format!(
                "{shown} points to {}, expected {}",
                target.display(),
                want.display()
            )),
        );
    }
    match std::fs::symlink_metadata(want) {
        Ok(m) if m.is_dir() => (CheckStatus::Ok, None),
        Ok(_) => (
            CheckStatus::Fail,
            Some(format!("{} is not a directory", want.display())),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
            CheckStatus::Degraded,
            Some(format!("{} does not exist yet", want.display())),
        ),
        Err(e) => (CheckStatus::Fail, Some(format!("{}: {e}", want.display()))),
    }
}

/// Lexical normalisation (`.` and `..`), without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Writable (create, fsync, remove a probe file), persistent (not a tmpfs),
/// with at least `workspace_min_free_mib` free, owned by the desktop user.
fn workspace_check(config: &Config) -> Check {
    let ws = &config.workspace;
    let shown = ws.display();
    match std::fs::symlink_metadata(ws) {
        Ok(m) if m.is_dir() => {
            if let Err(e) = write_probe_file(ws) {
                return Check::new(
                    checks::WORKSPACE,
                    CheckStatus::Fail,
                    format!("{shown} is not writable: {e}"),
                );
            }
            let mut status = CheckStatus::Ok;
            let mut notes = Vec::new();
            {
                use std::os::unix::fs::MetadataExt as _;
                if m.uid() != config.uid {
                    status = status.max(CheckStatus::Degraded);
                    notes.push(format!("owned by uid {}, not {}", m.uid(), config.uid));
                }
            }
            match nix::sys::statfs::statfs(ws.as_path()) {
                Ok(fs) => {
                    // tmpfs contents vanish when the container stops.
                    if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC {
                        status = status.max(CheckStatus::Degraded);
                        notes.push("is a tmpfs: its contents are lost at stop".into());
                    }
                    let free_mib = fs
                        .blocks_available()
                        .saturating_mul(u64::try_from(fs.block_size()).unwrap_or(0))
                        / (1024 * 1024);
                    if free_mib < config.workspace_min_free_mib {
                        status = status.max(CheckStatus::Degraded);
                        notes.push(format!(
                            "{free_mib} MiB free, below the floor of {} MiB",
                            config.workspace_min_free_mib
                        ));
                    } else {
                        notes.push(format!("writable, {free_mib} MiB free"));
                    }
                }
                Err(e) => {
                    status = status.max(CheckStatus::Degraded);
                    notes.push(format!("statfs failed: {e}"));
                }
            }
            Check::new(
                checks::WORKSPACE,
                status,
                format!("{shown}: {}", notes.join(", ")),
            )
        }
        Ok(_) => Check::new(
            checks::WORKSPACE,
            CheckStatus::Fail,
            format!("{shown} is not a directory"),
        ),
        Err(e) => Check::new(
            checks::WORKSPACE,
            CheckStatus::Fail,
            format!("{shown}: {e}"),
        ),
    }
}

/// Creates a probe file (never following a link, never reusing a file), syncs
/// it and removes it.
fn write_probe_file(dir: &Path) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(format!(".dormouse-probe-{}", std::process::id()));
    // A leftover of a killed probe with our pid: unlink never follows links.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)?;
    let written = file
        .write_all(b"dormouse probe\n")
        .and_then(|()| file.sync_all());
    let removed = std::fs::remove_file(&path);
    written.and(removed)
}

// ---- identity, services -------------------------------------------------------

/// The identity is present, and equals a fresh reading when one can be made
/// (a different reading means this process reports another container start).
fn identity_check(config: &Config, reported: Option<&ContainerStartIdentity>) -> Check {
    let complete = |id: &ContainerStartIdentity| {
        !id.boot_id.trim().is_empty() && id.pid_ns_inode != 0 && id.pid1_start_time != 0
    };
    let check = |status, detail: String| Check::new(checks::IDENTITY, status, detail);
    match (reported, fresh_identity(config)) {
        (Some(r), Ok(f)) if *r != f => check(
            CheckStatus::Fail,
            format!(
                "reported start {} differs from the current {}",
                r.fingerprint(),
                f.fingerprint()
            ),
        ),
        // Here the reported identity, if any, equals the fresh one.
        (_, Ok(id)) if complete(&id) => check(
            CheckStatus::Ok,
            format!("container start {}", id.fingerprint()),
        ),
        (_, Ok(id)) => check(
            CheckStatus::Fail,
            format!("incomplete identity {}", id.fingerprint()),
        ),
        (Some(r), Err(e)) if complete(r) => check(
            CheckStatus::Degraded,
            format!(
                "container start {}; fresh reading failed: {e}",
                r.fingerprint()
            ),
        ),
        (_, Err(e)) => check(
            CheckStatus::Fail,
            format!("cannot read the container-start identity: {e}"),
        ),
    }
}

/// A fresh reading of the container-start identity, exactly as the
/// supervisor made the one it reports (also under `--pid=host`).
fn fresh_identity(config: &Config) -> Result<ContainerStartIdentity, String> {
    crate::identity::read(config).map_err(|e| e.to_string())
}

fn services_check(services: &[ServiceState]) -> Check {
    let not_running: Vec<String> = services
        .iter()
        .filter(|s| s.state != ServiceRunState::Running)
        .map(|s| format!("{} {:?}", s.name, s.state).to_lowercase())
        .collect();
    if not_running.is_empty() {
        let names: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
        Check::new(
            checks::SERVICES,
            CheckStatus::Ok,
            format!("running: {}", names.join(", ")),
        )
    } else {
        Check::new(checks::SERVICES, CheckStatus::Fail, not_running.join(", "))
    }
}

#[cfg(test)]
mod tests;
