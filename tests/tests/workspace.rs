//! End-to-end: the workspace routes against a real `dormoused`, the real
//! engine and the real desktop image. Files and disk usage of a stopped
//! desktop never start it (the engine's own event stream is the witness)
//! and never follow a link the guest planted; hostile archives change
//! nothing; an export of a running desktop carries its browser login into a
//! new desktop and, through `PUT`, into a stopped one, and the browser its
//! quiesce closed runs again once the archive is read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_client::Fetched;
use dormouse_e2e::archive::{tar, tar_entry};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{
    create_ready, ApiClient, ClientError, EventStream, StatusCode, Waits as _,
};
use dormouse_e2e::engine::{self, EngineEventRecorder};
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_e2e::markers::{Markers, WORKSPACE_MARKER, WORKSPACE_MARKER_NAME};
use dormouse_e2e::test_image;
use dormouse_protocol::api::{ContainerState, LeaseRequest};
use dormouse_protocol::workspace::{Compression, EntryType};
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOPPED_TIMEOUT: Duration = Duration::from_secs(60);
/// The import limit of the hostile-archive broker.
const IMPORT_LIMIT: u64 = 1 << 20;

async fn ready_desktop(
    broker: &BrokerProcess,
    name: &str,
) -> Result<(ApiClient, EventStream, Uuid)> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, name, READY_TIMEOUT)
        .await
        .with_context(|| format!("new desktop; broker log:\n{}", broker.log_tail(3000)))?;
    Ok((api, events, id))
}

/// The status and code of a refused call.
fn refusal<T: std::fmt::Debug>(result: Result<T, ClientError>) -> Result<(StatusCode, String)> {
    match result {
        Ok(v) => anyhow::bail!("expected a refusal, got {v:?}"),
        Err(e) => {
            let status = e
                .status()
                .with_context(|| format!("no HTTP status: {e:#}"))?;
            Ok((status, format!("{e:#}")))
        }
    }
}

/// Every path below `root` with its content (files) or kind, never
/// following links: a snapshot to prove nothing changed.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let what = if meta.file_type().is_symlink() {
                format!("link -> {:?}", std::fs::read_link(&path).ok())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else {
                format!("file {:?}", std::fs::read(&path).ok())
            };
            out.insert(rel, what);
        }
    }
    out
}

/// Runs a host command and returns its stdout.
fn host(cmd: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{cmd} {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// ---------------------------------------------------------------- tests

/// Files, disk usage and hostile archives on a stopped desktop: list,
/// read, write, delete; symlinks to `/` and to another computer's
/// workspace never followed; bad paths 400; disk figures equal `du` and
/// `df`; every hostile archive refused naming its entry with nothing
/// written; and the engine never saw a `start`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_desktop_files_disk_and_hostile_archives() -> Result<()> {
    let Some(image) = test_image("stopped_desktop_files_disk_and_hostile_archives") else {
        return Ok(());
    };
    let mut options = BrokerOptions::new(&image);
    options.extra_args = vec![
        "--import-max-bytes".into(),
        IMPORT_LIMIT.to_string(),
        "--file-max-bytes".into(),
        "65536".into(),
    ];
    let broker = BrokerProcess::start(options).await?;
    let result = stopped_scenario(&broker).await;
    broker.log_on_failure(result)
}

// Over 100 lines on purpose: one scenario on one desktop, its steps in
// order, each checking the state the step before it left; apart, the story
// a reader follows would be spread over helpers that each need it all.
async fn stopped_scenario(broker: &BrokerProcess) -> Result<()> {
    let (api, mut events, id) = ready_desktop(broker, "files").await?;
    let guest = Guest::for_computer(id);
    let ws = broker.workspace(id);

    // Another computer's workspace (kept after a remove), with a secret.
    let other = broker
        .data_dir()
        .join("computers")
        .join(Uuid::new_v4().to_string())
        .join("workspace");
    std::fs::create_dir_all(&other)?;
    std::fs::write(other.join("secret"), "other computer's secret")?;

    // The guest plants links while it runs.
    guest
        .sh_ok(
            GuestUser::Desk,
            &format!(
                "cd /home/desk/workspace && mkdir -p notes && printf hello > notes/a.txt && \
                 ln -s / to-root && ln -s {} to-other && ln -s /etc/passwd passwd-link && sync",
                other.display()
            ),
        )
        .await?;
    api.stop(id).await?;
    api.wait_stopped(&mut events, id, STOPPED_TIMEOUT).await?;
    let before = api.get(id).await?;
    ensure!(before.container == ContainerState::Stopped, "{before:?}");

    let recorder = EngineEventRecorder::start(guest.container())?;

    // List, read, write, delete.
    let Fetched::Dir(root) = api.fetch(id, "").await? else {
        anyhow::bail!("the root is a directory");
    };
    let kinds: BTreeMap<_, _> = root
        .entries
        .iter()
        .map(|e| (e.name.clone(), e.kind))
        .collect();
    ensure!(kinds.get("notes") == Some(&EntryType::Dir), "{kinds:?}");
    ensure!(
        kinds.get("to-root") == Some(&EntryType::Symlink),
        "{kinds:?}"
    );
    ensure!(
        kinds.get("to-other") == Some(&EntryType::Symlink),
        "{kinds:?}"
    );
    ensure!(
        api.fetch(id, "notes/a.txt").await? == Fetched::File(b"hello".to_vec()),
        "read notes/a.txt"
    );
    let written = api
        .write_file(id, "new dir/b.txt", b"written from the host".to_vec(), true)
        .await?;
    ensure!(written.created && written.bytes == 21, "{written:?}");
    let meta = std::fs::metadata(ws.join("new dir/b.txt"))?;
    ensure!(
        meta.uid() == 1000 && meta.gid() == 1000,
        "owned by 1000:1000, not {}:{}",
        meta.uid(),
        meta.gid()
    );
    ensure!(std::fs::read(ws.join("new dir/b.txt"))? == b"written from the host");
    let deleted = api.delete_file(id, "notes/a.txt", false).await?;
    ensure!(deleted.removed == 1 && !ws.join("notes/a.txt").exists());
    // Over the file cap: 413, nothing written.
    let (status, _) = refusal(
        api.write_file(id, "big.bin", vec![0u8; 70_000], false)
            .await,
    )?;
    ensure!(status == StatusCode::PAYLOAD_TOO_LARGE, "{status}");
    ensure!(!ws.join("big.bin").exists());

    // Links are never followed, for reading or writing.
    let secret_before = std::fs::read(other.join("secret"))?;
    for path in [
        "to-root",
        "to-root/etc/passwd",
        "passwd-link",
        "to-other",
        "to-other/secret",
    ] {
        let (status, msg) = refusal(api.fetch(id, path).await)?;
        ensure!(
            status == StatusCode::BAD_REQUEST,
            "read {path}: {status} {msg}"
        );
        let (status, msg) = refusal(api.write_file(id, path, b"x".to_vec(), false).await)?;
        ensure!(
            status == StatusCode::BAD_REQUEST,
            "write {path}: {status} {msg}"
        );
    }
    let (status, _) = refusal(
        api.write_file(id, "to-other/new", b"x".to_vec(), true)
            .await,
    )?;
    ensure!(status == StatusCode::BAD_REQUEST);
    ensure!(std::fs::read(other.join("secret"))? == secret_before);
    ensure!(!other.join("new").exists() && !Path::new("/x").exists());
    ensure!(std::fs::symlink_metadata(ws.join("to-root"))?
        .file_type()
        .is_symlink());

    // Bad paths: absolute, `..`, NUL, too long.
    let long = "a/".repeat(2100) + "b";
    for path in [
        "/etc/passwd",
        "a/../b",
        "../x",
        "a\0b",
        "a//b",
        long.as_str(),
    ] {
        let (status, msg) = refusal(api.fetch(id, path).await)?;
        ensure!(
            status == StatusCode::BAD_REQUEST,
            "{path:?}: {status} {msg}"
        );
    }

    // Disk usage against du and df, taken independently. The engine's
    // layer size is bounded by the walk's deadline; on a loaded host it may
    // miss it once (then `null`), so ask again a few times.
    let mut usage = api.disk(id).await?;
    for _ in 0..3 {
        if usage.layer_bytes.is_some() {
            break;
        }
        eprintln!("layer_bytes missed its deadline; asking again");
        usage = api.disk(id).await?;
    }
    let ws_text = ws.display().to_string();
    let du: u64 = host("du", &["-sB1", &ws_text])
        .split_whitespace()
        .next()
        .unwrap()
        .parse()?;
    let inodes: u64 = host("du", &["-s", "--inodes", &ws_text])
        .split_whitespace()
        .next()
        .unwrap()
        .parse()?;
    let avail: u64 = host("df", &["-B1", "--output=avail", &ws_text])
        .lines()
        .last()
        .unwrap()
        .trim()
        .parse()?;
    ensure!(usage.complete, "{usage:?}");
    ensure!(
        usage.workspace_bytes == du,
        "workspace_bytes {} vs du -sB1 {du}",
        usage.workspace_bytes
    );
    ensure!(
        usage.workspace_files + 1 == inodes,
        "workspace_files {} vs du --inodes {inodes}",
        usage.workspace_files
    );
    // Other processes write to this disk meanwhile.
    ensure!(
        usage.free_bytes.abs_diff(avail) < 512 << 20,
        "free_bytes {} vs df avail {avail}",
        usage.free_bytes
    );
    let size_rw: u64 = engine::docker_ok(&[
        "inspect",
        "--size",
        "--format",
        "{{.SizeRw}}",
        guest.container(),
    ])
    .await?
    .trim()
    .parse()?;
    ensure!(
        usage.layer_bytes == Some(size_rw),
        "layer_bytes {:?} vs SizeRw {size_rw}",
        usage.layer_bytes
    );
    eprintln!("disk: {usage:?}");

    // Hostile archives through the API: each refused naming its entry,
    // nothing written, the old workspace intact.
    let intact = snapshot(&ws);
    let ok = tar_entry("ok.txt", b'0', b"fine", "");
    let cases: Vec<(&str, Vec<u8>, StatusCode)> = vec![
        (
            "../x",
            tar_entry("../x", b'0', b"x", ""),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/etc/x",
            tar_entry("/etc/x", b'0', b"x", ""),
            StatusCode::BAD_REQUEST,
        ),
        // A symlink is kept, but never written through.
        (
            "link/passwd",
            [
                tar_entry("link", b'2', b"", "/etc"),
                tar_entry("link/passwd", b'0', b"root::0:0::/:/bin/sh\n", ""),
            ]
            .concat(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "dev",
            tar_entry("dev", b'3', b"", ""),
            StatusCode::BAD_REQUEST,
        ),
        (
            "hard",
            tar_entry("hard", b'1', b"", "/etc/passwd"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "huge.bin",
            tar_entry(
                "huge.bin",
                b'0',
                &vec![0u8; usize::try_from(IMPORT_LIMIT).unwrap() + 1],
                "",
            ),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    // The first 64 KiB of a gzip of 10 GiB of zeros (about 64 MiB once
    // decompressed): refused at the limit after the end-of-archive block.
    let bomb = {
        use std::io::Read as _;
        let mut z = flate2::read::GzEncoder::new(
            std::io::repeat(0).take(10 << 30),
            flate2::Compression::best(),
        );
        let mut head = vec![0u8; 64 << 10];
        z.read_exact(&mut head)?;
        head
    };
    for (entry, archive, expect) in [
        ("the end after", bomb, StatusCode::PAYLOAD_TOO_LARGE),
        (
            "start of archive",
            b"PK\x03\x04 a zip".repeat(40),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (status, msg) = refusal(api.import(id, archive).await)?;
        ensure!(
            status == expect && msg.contains(entry),
            "{entry}: {status} {msg}"
        );
        ensure!(
            !msg.contains("/tmp") && !msg.contains(&broker.data_dir().display().to_string()),
            "{msg}"
        );
        ensure!(snapshot(&ws) == intact, "{entry}: the workspace changed");
    }
    for (entry, bad, expect) in &cases {
        let archive = tar(&[ok.clone(), bad.clone()]);
        let (status, msg) = refusal(api.import(id, archive.clone()).await)?;
        ensure!(status == *expect, "{entry}: {status} {msg}");
        ensure!(
            msg.contains(entry),
            "{entry}: the refusal names the entry: {msg}"
        );
        ensure!(snapshot(&ws) == intact, "{entry}: the workspace changed");
        ensure!(!ws.join("ok.txt").exists());
        // The broker's write journal stays beside it, empty once writes end.
        let busy = std::fs::read_dir(ws.with_file_name("workspace.writes"))
            .is_ok_and(|mut d| d.next().is_some());
        let leftovers: Vec<_> = std::fs::read_dir(ws.parent().unwrap())?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("workspace.") && (n != "workspace.writes" || busy))
            .collect();
        ensure!(leftovers.is_empty(), "{entry}: left behind: {leftovers:?}");
    }
    // A create from a hostile archive creates nothing.
    let computers_before = api.list().await?.len();
    let dirs_before = std::fs::read_dir(broker.data_dir().join("computers"))?.count();
    let (status, msg) = refusal(
        api.create_from_tar(
            Some("hostile"),
            None,
            tar(&[ok.clone(), cases[0].1.clone()]),
        )
        .await,
    )?;
    ensure!(
        status == StatusCode::BAD_REQUEST && msg.contains("../x"),
        "{status} {msg}"
    );
    ensure!(api.list().await?.len() == computers_before);
    ensure!(std::fs::read_dir(broker.data_dir().join("computers"))?.count() == dirs_before);

    // Writes are fenced by a live lease like every mutating call.
    let grant = api
        .lease(
            id,
            &LeaseRequest {
                holder: "controller".into(),
                ttl_ms: 60_000,
            },
        )
        .await?;
    // Without the generation (`lease_held`) and with a wrong one
    // (`stale_generation`): 409, nothing changes.
    let stale = api.with_generation(Some(grant.generation + 1));
    for (caller, code) in [(&api, "lease_held"), (&stale, "stale_generation")] {
        let (status, msg) = refusal(
            caller
                .write_file(id, "fenced.txt", b"x".to_vec(), false)
                .await,
        )?;
        ensure!(
            status == StatusCode::CONFLICT && msg.contains(code),
            "{status} {msg}"
        );
        let (status, msg) = refusal(caller.delete_file(id, "new dir", true).await)?;
        ensure!(
            status == StatusCode::CONFLICT && msg.contains(code),
            "{status} {msg}"
        );
    }
    ensure!(!ws.join("fenced.txt").exists() && ws.join("new dir").exists());
    let holder = api.with_generation(Some(grant.generation));
    holder
        .write_file(id, "fenced.txt", b"x".to_vec(), false)
        .await?;
    holder.delete_file(id, "new dir", true).await?;
    ensure!(ws.join("fenced.txt").exists() && !ws.join("new dir").exists());

    // Still stopped, never started, idle state untouched.
    let actions = recorder.finish().await;
    ensure!(
        !actions.iter().any(|a| engine::action_verb(a) == "start"),
        "the engine saw a start: {actions:?}"
    );
    let after = api.get(id).await?;
    ensure!(after.container == ContainerState::Stopped, "{after:?}");
    ensure!(
        after.idle == before.idle,
        "idle changed: {:?} -> {:?}",
        before.idle,
        after.idle
    );
    eprintln!("engine actions while stopped: {actions:?}");
    Ok(())
}

/// An export of a running desktop whose Chromium holds a login cookie and
/// whose Firefox has a profile: a new desktop created from the archive has
/// both, and so has a stopped desktop whose workspace is replaced with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_import_carries_browser_logins() -> Result<()> {
    let Some(image) = test_image("export_import_carries_browser_logins") else {
        return Ok(());
    };
    let broker = BrokerProcess::start(BrokerOptions::new(&image)).await?;
    let result = export_scenario(&broker).await;
    broker.log_on_failure(result)
}

async fn export_scenario(broker: &BrokerProcess) -> Result<()> {
    let (api, mut events, a) = ready_desktop(broker, "source").await?;
    let guest_a = Guest::for_computer(a);
    let markers = Markers::new();
    guest_a
        .write_synced(GuestUser::Desk, WORKSPACE_MARKER, markers.token())
        .await?;
    markers.write_browser_profiles(&guest_a).await?;
    // A browser opened from the desktop's menu, on the desktop's own
    // profile: the export's quiesce closes it, and it must come back.
    let before = open_chromium(&guest_a).await?;

    let started = std::time::Instant::now();
    let mut archive = Vec::new();
    let bytes = api.export(a, true, &mut archive).await?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "exported {bytes} bytes from a running desktop in {secs:.2} s ({:.1} MiB/s)",
        bytes as f64 / (1 << 20) as f64 / secs
    );
    ensure!(bytes > 0 && archive.len() as u64 == bytes);
    let status = api.get(a).await?;
    ensure!(status.container == ContainerState::Running, "{status:?}");
    let after = chromium_back(&guest_a, before).await?;
    eprintln!("chromium {before} closed by the export's quiesce, running again as {after}");
    // Done with the source: free its slot for the new desktops.
    api.stop(a).await?;
    api.wait_stopped(&mut events, a, STOPPED_TIMEOUT).await?;

    // A new desktop from the archive.
    let started = std::time::Instant::now();
    let b = api
        .create_from_tar(Some("restored"), None, archive.clone())
        .await?;
    eprintln!(
        "create from the archive answered in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    api.wait_ready(&mut events, b.id, READY_TIMEOUT).await?;
    let guest_b = Guest::for_computer(b.id);
    markers
        .verify_workspace(&guest_b, &broker.workspace(b.id))
        .await?;
    markers.verify_browser_profiles(&guest_b).await?;

    // Into a stopped desktop with PUT: replace what it has.
    api.stop(b.id).await?;
    api.wait_stopped(&mut events, b.id, STOPPED_TIMEOUT).await?;
    api.write_file(b.id, "junk.txt", b"to be replaced".to_vec(), false)
        .await?;
    std::fs::remove_file(broker.workspace(b.id).join(WORKSPACE_MARKER_NAME))?;
    // Refused while running is covered by the state check; here it is stopped.
    let started = std::time::Instant::now();
    let imported = api.import(b.id, archive).await?;
    eprintln!(
        "imported {imported:?} into a stopped desktop in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    ensure!(!broker.workspace(b.id).join("junk.txt").exists());
    api.start(b.id).await?;
    api.wait_ready(&mut events, b.id, READY_TIMEOUT).await?;
    markers
        .verify_workspace(&guest_b, &broker.workspace(b.id))
        .await?;
    markers.verify_browser_profiles(&guest_b).await?;

    // A running desktop's workspace cannot be replaced.
    let (status, _) = refusal(api.import(b.id, tar(&[])).await)?;
    ensure!(status == StatusCode::CONFLICT, "{status}");
    Ok(())
}

/// Chromium's main process in the guest: the oldest `chromium` of `desk`
/// (`pgrep`), if one runs.
async fn chromium_main(guest: &Guest) -> Result<Option<u32>> {
    let out = guest
        .sh(GuestUser::Root, "pgrep -o -u desk -x chromium")
        .await?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse().ok())
}

/// Whether a Chromium window is mapped on the guest's display (`xdotool`).
async fn chromium_window(guest: &Guest) -> Result<bool> {
    let out = guest
        .sh(
            GuestUser::Desk,
            "xdotool search --onlyvisible --class chromium",
        )
        .await?;
    Ok(out.status.success() && !out.stdout.is_empty())
}

/// Opens Chromium as a person would, from the desktop's menu (a right
/// click on the desktop, then its second item), on the desktop's own
/// profile, and waits for its window; its main pid. It runs in the window
/// manager's process group, as everything started from the menu does.
async fn open_chromium(guest: &Guest) -> Result<u32> {
    guest
        .sh_ok(
            GuestUser::Desk,
            "xdotool mousemove 640 400 click 3 && sleep 0.5 && xdotool key Down Down Return",
        )
        .await?;
    let started = std::time::Instant::now();
    loop {
        if let (Some(pid), true) = (chromium_main(guest).await?, chromium_window(guest).await?) {
            return Ok(pid);
        }
        ensure!(
            started.elapsed() < Duration::from_secs(90),
            "chromium never showed a window"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until Chromium runs again after the export — a new main process
/// (not `before`, which the quiesce closed) with a window on the display,
/// started with `--restore-last-session` — and returns its pid.
async fn chromium_back(guest: &Guest, before: u32) -> Result<u32> {
    let started = std::time::Instant::now();
    loop {
        let main = chromium_main(guest).await?;
        if let Some(pid) = main.filter(|p| *p != before) {
            if chromium_window(guest).await? {
                let args = guest
                    .sh_ok(GuestUser::Root, &format!("ps -o args= -p {pid}"))
                    .await?;
                ensure!(
                    args.contains("--restore-last-session"),
                    "chromium came back without restoring its session: {args}"
                );
                return Ok(pid);
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            let log = std::process::Command::new("docker")
                .args(["logs", "--tail", "40", guest.container()])
                .output()
                .map(|o| String::from_utf8_lossy(&[o.stdout, o.stderr].concat()).into_owned())
                .unwrap_or_default();
            anyhow::bail!(
                "chromium did not run again after the export (main process now: {main:?}, \
                 before: {before}); the supervisor's log ends:\n{log}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The desktop image with its browser autostarted (`DORMOUSE_BROWSER`), as
/// an image of its own made for this test; removed when dropped.
struct AutostartImage(String);

impl AutostartImage {
    fn build(image: &str) -> Result<Self> {
        use std::io::Write as _;
        let mut child = std::process::Command::new("docker")
            .args(["build", "-q", "--label", "dev.dormouse.test=autostart", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("docker build")?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(format!("FROM {image}\nENV DORMOUSE_BROWSER=chromium\n").as_bytes())?;
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "docker build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Self(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
    }
}

impl Drop for AutostartImage {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["image", "rm", "-f", &self.0])
            .output();
    }
}

/// A desktop whose Chromium is the supervisor's autostarted service: the
/// export's quiesce stops the service, and once the archive is read the
/// service runs again (a new main process, its window mapped, its session
/// restored), while the archive is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_starts_the_autostarted_browser_again() -> Result<()> {
    let Some(image) = test_image("an_export_starts_the_autostarted_browser_again") else {
        return Ok(());
    };
    let autostart = AutostartImage::build(&image)?;
    let broker = BrokerProcess::start(BrokerOptions::new(&autostart.0)).await?;
    let result = async {
        let (api, _events, id) = ready_desktop(&broker, "autostart").await?;
        let guest = Guest::for_computer(id);
        let started = std::time::Instant::now();
        let before = loop {
            if let (Some(pid), true) = (chromium_main(&guest).await?, chromium_window(&guest).await?)
            {
                break pid;
            }
            ensure!(
                started.elapsed() < Duration::from_secs(90),
                "the autostarted chromium never showed a window"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let mut archive = Vec::new();
        let bytes = api.export(id, true, &mut archive).await?;
        ensure!(bytes > 0 && archive.len() as u64 == bytes);
        let after = chromium_back(&guest, before).await?;
        eprintln!("autostarted chromium {before} stopped by the export's quiesce, running again as {after}");
        Ok(())
    }
    .await;
    let result = broker.log_on_failure(result);
    drop(broker);
    drop(autostart);
    result
}

/// A real virtualenv (`python3 -m venv`), a `node_modules/.bin` link, a
/// relative link and a hard-linked pair made in a live desktop's
/// workspace: exported (zstd), imported into a new desktop, where the
/// venv's python runs and every link and time is as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtualenv_and_links_survive_export_and_import() -> Result<()> {
    let Some(image) = test_image("a_virtualenv_and_links_survive_export_and_import") else {
        return Ok(());
    };
    let broker = BrokerProcess::start(BrokerOptions::new(&image)).await?;
    let result = venv_scenario(&broker).await;
    broker.log_on_failure(result)
}

/// Type, link target, mtime in nanoseconds and the first path of its
/// hard-link group, for everything below `root` but its top-level
/// directories the supervisor manages.
fn links_and_times(root: &Path) -> BTreeMap<String, (char, String, i128, String)> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, String> = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .flatten()
            .map(|e| e.path())
            .collect();
        names.sort();
        for path in names {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel.starts_with('.') {
                continue;
            }
            let m = std::fs::symlink_metadata(&path).expect("lstat");
            let (kind, link) = if m.file_type().is_symlink() {
                (
                    'l',
                    std::fs::read_link(&path)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                )
            } else if m.is_dir() {
                stack.push(path.clone());
                ('d', String::new())
            } else {
                ('-', String::new())
            };
            let group = if m.nlink() > 1 && !m.is_dir() {
                inodes.entry(m.ino()).or_insert_with(|| rel.clone()).clone()
            } else {
                String::new()
            };
            let t = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
            out.insert(rel, (kind, link, t, group));
        }
    }
    out
}

async fn venv_scenario(broker: &BrokerProcess) -> Result<()> {
    let (api, mut events, a) = ready_desktop(broker, "venv-source").await?;
    let guest_a = Guest::for_computer(a);
    // The image has python3 but not Debian's ensurepip (python3-venv), so
    // the venv is made without pip; its links are what a venv's are.
    guest_a
        .sh_ok(
            GuestUser::Desk,
            "cd /home/desk/workspace && python3 -m venv --without-pip venv && \
             mkdir -p proj/node_modules/tool/bin proj/node_modules/.bin proj/docs && \
             printf '#!/bin/sh\\necho tool ran\\n' > proj/node_modules/tool/bin/cli.js && \
             chmod 755 proj/node_modules/tool/bin/cli.js && \
             ln -s ../tool/bin/cli.js proj/node_modules/.bin/tool && \
             echo readme > proj/docs/README.md && ln -s docs/README.md proj/README && \
             echo pair > pair-a && ln pair-a pair-b && \
             touch -h -d @1700000000.25 proj/README pair-a venv/bin/python && sync",
        )
        .await?;
    api.stop(a).await?;
    api.wait_stopped(&mut events, a, STOPPED_TIMEOUT).await?;
    let before = links_and_times(&broker.workspace(a));
    ensure!(
        before.get("venv/bin/python3").map(|e| e.1.as_str()) == Some("/usr/bin/python3"),
        "{before:?}"
    );
    ensure!(before["pair-b"].3 == "pair-a", "{before:?}");

    let mut archive = Vec::new();
    api.export_compressed(a, true, Compression::Zstd, &mut archive)
        .await?;
    ensure!(
        archive.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]),
        "a zstd frame"
    );
    // GNU tar, the witness, sees the links as links.
    let file = std::env::temp_dir().join(format!("dormouse-venv-{}.tar.zst", Uuid::new_v4()));
    std::fs::write(&file, &archive)?;
    let listing = host("tar", &["--zstd", "-tvf", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    for want in [
        "venv/bin/python -> python3",
        "venv/bin/python3 -> /usr/bin/python3",
        "proj/node_modules/.bin/tool -> ../tool/bin/cli.js",
        "proj/README -> docs/README.md",
        "pair-b link to pair-a",
    ] {
        ensure!(listing.contains(want), "{want} not in:\n{listing}");
    }

    let b = api
        .create_from_tar(
            Some("venv-restored"),
            None,
            dormouse_client::Upload::bytes(archive).compressed_as(Compression::Zstd),
        )
        .await?;
    api.wait_ready(&mut events, b.id, READY_TIMEOUT).await?;
    let after = links_and_times(&broker.workspace(b.id));
    ensure!(after == before, "before {before:?}\nafter {after:?}");
    let guest_b = Guest::for_computer(b.id);
    let prefix = guest_b
        .sh_ok(
            GuestUser::Desk,
            "cd /home/desk/workspace && venv/bin/python -c 'import sys; print(sys.prefix)'",
        )
        .await?;
    ensure!(prefix.trim() == "/home/desk/workspace/venv", "{prefix}");
    let tool = guest_b
        .sh_ok(
            GuestUser::Desk,
            "/home/desk/workspace/proj/node_modules/.bin/tool",
        )
        .await?;
    ensure!(tool.trim() == "tool ran", "{tool}");
    let inodes = guest_b
        .sh_ok(
            GuestUser::Desk,
            "stat -c %i /home/desk/workspace/pair-a /home/desk/workspace/pair-b",
        )
        .await?;
    let inodes: Vec<_> = inodes.lines().collect();
    ensure!(inodes.len() == 2 && inodes[0] == inodes[1], "{inodes:?}");

    // The CLI: an export named .tar.gz is gzip; a plain tar imported with
    // --compress zstd goes compressed, and the workspace is as it was.
    api.stop(b.id).await?;
    api.wait_stopped(&mut events, b.id, STOPPED_TIMEOUT).await?;
    let dir = std::env::temp_dir().join(format!("dormouse-venv-cli-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let result = cli_round_trip(broker, b.id, &dir, &before).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `dormouse ARGS...` against `broker`, through the CLI's library.
async fn cli(broker: &BrokerProcess, args: &[&str]) -> Result<String> {
    use clap::Parser as _;
    let url = format!("http://{}", broker.addr());
    let data_dir = broker.data_dir().to_string_lossy().into_owned();
    let mut argv = vec!["dormouse", "--url", &url, "--data-dir", &data_dir];
    argv.extend_from_slice(args);
    let parsed = dormouse_cli::CliArgs::try_parse_from(argv)?;
    let mut out = Vec::new();
    dormouse_cli::run(parsed, &mut out)
        .await
        .map_err(|e| anyhow::anyhow!("dormouse {args:?}: {e}"))?;
    Ok(String::from_utf8(out)?)
}

async fn cli_round_trip(
    broker: &BrokerProcess,
    id: Uuid,
    dir: &Path,
    before: &BTreeMap<String, (char, String, i128, String)>,
) -> Result<()> {
    let gz = dir.join("ws.tar.gz");
    let id_text = id.to_string();
    cli(broker, &["export", &id_text, "-o", gz.to_str().unwrap()]).await?;
    ensure!(
        std::fs::read(&gz)?.starts_with(&[0x1f, 0x8b]),
        "a gzip file"
    );
    let plain = dir.join("ws.tar");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "gzip -dc {} > {}",
            gz.to_str().unwrap(),
            plain.to_str().unwrap()
        ))
        .status()?;
    ensure!(out.success());
    std::fs::remove_dir_all(broker.workspace(id).join("proj"))?;
    let said = cli(
        broker,
        &[
            "import",
            &id_text,
            "-i",
            plain.to_str().unwrap(),
            "--compress",
            "zstd",
        ],
    )
    .await?;
    ensure!(said.contains("imported"), "{said}");
    let after = links_and_times(&broker.workspace(id));
    ensure!(&after == before, "before {before:?}\nafter {after:?}");
    Ok(())
}
