//! Shared set-up of the exec tests: this test process as the subreaper with
//! the supervisor's own reaper, a runner for uid 1000 on a temp workspace,
//! and an independent look at `/proc`.
//!
//! The tests run the production exec code on the host, as root (they skip
//! with a message otherwise). Escaped orphans must come back to this
//! process, as they come to the supervisor when it is PID 1 or a subreaper:
//! [`init`] makes it a child subreaper and runs `init::Reaper` on a thread
//! of its own for as long as the process lives.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use dormouse_supervisor::exec::{ExecRunner, ExecSettings};
use dormouse_supervisor::init;

/// The desktop user of the tests.
pub const UID: u32 = 1000;

/// Makes this process a subreaper and starts the reaper, once. `false`
/// (with a message) when not root: the tests then skip.
pub fn init() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: the exec tests need root (to run commands as uid {UID})");
        return false;
    }
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        init::adopt_orphans().expect("subreaper");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let reaper = init::Reaper::install().expect("sigchld");
                tx.send(()).expect("ready");
                reaper.run().await;
            });
        });
        rx.recv().expect("reaper started");
    });
    true
}

/// A workspace owned by the desktop user, removed on drop.
#[derive(Debug)]
pub struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("dormouse-exec-")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        nix::unistd::chown(
            dir.path(),
            Some(nix::unistd::Uid::from_raw(UID)),
            Some(nix::unistd::Gid::from_raw(UID)),
        )
        .expect("chown");
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A runner for uid/gid 1000 on `workspace`, with tag gids of this test
/// process's own (test processes run in parallel; each needs its own
/// tags, as each container has).
pub fn runner(workspace: &Workspace) -> ExecRunner {
    let base = 3_000_000 + std::process::id() * 64;
    ExecRunner::new(ExecSettings {
        workspace: workspace.path().to_owned(),
        uid: UID,
        gid: UID,
        tag_gids: base..base + 64,
        kill_bound: Duration::from_secs(10),
        ..ExecSettings::default()
    })
}

/// A string unique to one test, to find its processes by their command
/// line (e.g. as a `sleep` duration: `sleep 600.<n>`).
pub fn token() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "600.{}{:03}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Live processes (not zombies) with `arg` as one of their arguments, read
/// from `/proc` directly, not through the exec module.
pub fn with_arg(arg: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("proc") {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let dir: PathBuf = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        if cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// The real uid, session id and groups of a process, from `/proc`.
pub fn status_of(pid: u32) -> Option<(u32, u32, Vec<u32>)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::to_owned)
    };
    let uid = field("Uid:")?.split_whitespace().next()?.parse().ok()?;
    let sid = field("NSsid:")?.trim().parse().ok()?;
    let groups = field("Groups:")?
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    Some((uid, sid, groups))
}

/// Waits until `arg` has at least `n` live processes, at most 10 s.
pub async fn wait_for(arg: &str, n: usize) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = with_arg(arg);
        if found.len() >= n {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{arg}: {} of {n} processes after 10 s",
            found.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
