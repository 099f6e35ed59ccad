//! A guest that fills the disk under the data directory: the broker keeps
//! answering, a stop still stops the desktop (and says which record it
//! could not save), no record is lost or left half-written, and start works
//! again once the space is freed. The status also says, on this tmpfs, that
//! the workspace has no size limit and why.
//!
//! The data directory is a small tmpfs mounted by the test (root only), so
//! "full" is real and affects nothing else on the host; the desktop fills it
//! through its workspace bind mount with `dd`, as any guest process could.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod engine_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dormouse_broker::docker::{DockerBackend, DockerEngine, Engine};
use dormouse_broker::metrics::Metrics;
use dormouse_broker::owner;
use dormouse_e2e::{desktop_image, docker, docker_available, TempDir};
use dormouse_protocol::api::{ContainerState, CreateComputer, PatchComputer};
use engine_support::{broker_config, log, wait_ready, wait_until, RunGuard};

/// A bound on hangs, not a speed claim.
const READY_LIMIT: Duration = Duration::from_secs(180);

/// Size of the data directory's filesystem.
const TMPFS_SIZE: &str = "48m";

/// Unmounts the tmpfs when dropped (after the containers using it are gone).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount_tmpfs(path: &Path) -> Mounted {
    std::fs::create_dir_all(path).unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={TMPFS_SIZE},mode=0700"))
        .arg("tmpfs")
        .arg(path)
        .status()
        .expect("mount runs");
    assert!(status.success(), "mount a tmpfs at {}", path.display());
    Mounted(path.to_owned())
}

/// Free bytes of the filesystem at `path`.
fn free_bytes(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    s.blocks_available() * s.fragment_size()
}

/// Every broker record under `data` (the workspaces aside, they are the
/// guest's): each `*.json` parses, and no temporary file is left behind.
fn check_records(data: &Path) -> usize {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                if entry.file_name() != "workspace" && entry.file_name() != "run" {
                    walk(&path, found);
                }
            } else {
                found.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(data, &mut files);
    let mut records = 0;
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            !name.ends_with(".tmp"),
            "a temporary file was left behind: {}",
            file.display()
        );
        if name.ends_with(".json") {
            let bytes = std::fs::read(&file).unwrap();
            assert!(!bytes.is_empty(), "{} is empty", file.display());
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{} does not parse: {e}: {:?}",
                    file.display(),
                    String::from_utf8_lossy(&bytes)
                )
            });
            records += 1;
        }
    }
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Over 100 lines on purpose: one real-engine test told in order (set up,
// act, witness, clean up); its steps share the desktop and the witnesses,
// and apart the order a reader must check would be spread over helpers.
async fn a_guest_that_fills_the_disk_loses_no_broker_state() {
    let test = "a_guest_that_fills_the_disk_loses_no_broker_state";
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {test}: mounting the tmpfs needs root");
        return;
    }
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    log();
    let base = TempDir::new("dm-full");
    let data = base.path().join("state");
    // Dropped last: the containers (guard) and the broker go first.
    let _mounted = mount_tmpfs(&data);
    let guard = RunGuard::new("dm-full");
    let engine: Arc<dyn Engine> = Arc::new(DockerEngine::connect().await.unwrap());
    let config = broker_config(&data, &image, &guard);
    let backend = Arc::new(DockerBackend::for_broker(engine.clone(), &config));
    let (broker, core) =
        owner::spawn_backend(config.clone(), backend, Arc::new(Metrics::default()))
            .await
            .unwrap();

    let created = broker.create(CreateComputer::default()).await.unwrap();
    let id = created.id;
    let ready = wait_ready(&broker, id, READY_LIMIT).await;
    let generation = ready.generation;
    let records_before = check_records(&data);
    assert!(records_before >= 1, "the computer has a record");
    eprintln!(
        "ready; {} records; {} KiB free on the data directory",
        records_before,
        free_bytes(&data) / 1024
    );

    // No project quota on a tmpfs: the status says so rather than pretend,
    // and the engine-independent witness (`stat -f`) agrees on why.
    let limited = wait_until(&broker, id, READY_LIMIT, "the workspace limit", |s| {
        s.workspace_limit.is_some()
    })
    .await;
    let limit = limited.workspace_limit.unwrap();
    let fs = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&data)
        .output()
        .unwrap();
    let fs = String::from_utf8_lossy(&fs.stdout).trim().to_owned();
    eprintln!("workspace limit on {fs}: {limit:?}");
    assert_eq!(fs, "tmpfs");
    assert!(!limit.enforced);
    assert_eq!((limit.bytes, limit.inodes), (None, None));
    assert!(
        limit.reason.as_deref().is_some_and(|r| r.contains("tmpfs")),
        "{limit:?}"
    );

    // The guest fills the filesystem through its workspace.
    let name = format!("dormouse-{id}");
    let filled = docker(&[
        "exec",
        &name,
        "dd",
        "if=/dev/zero",
        "of=/home/desk/workspace/fill",
        "bs=1M",
    ]);
    let dd = String::from_utf8_lossy(&filled.stderr);
    assert!(!filled.status.success(), "dd stops at a full disk: {dd}");
    assert!(dd.contains("No space left"), "{dd}");
    let free = free_bytes(&data);
    eprintln!("after dd: {free} bytes free");
    assert!(
        free < 64 * 1024,
        "the data directory is full: {free} bytes free"
    );

    // The broker keeps answering, reads and writes alike.
    let t = Instant::now();
    for _ in 0..50 {
        let all = tokio::time::timeout(Duration::from_secs(5), broker.list())
            .await
            .expect("list answers while the disk is full")
            .unwrap();
        assert!(all.iter().any(|c| c.id == id));
        tokio::time::timeout(Duration::from_secs(5), broker.get(id))
            .await
            .expect("get answers while the disk is full")
            .unwrap();
    }
    eprintln!("100 reads on a full disk in {} ms", t.elapsed().as_millis());
    let patched = tokio::time::timeout(
        Duration::from_secs(10),
        broker.patch(
            id,
            PatchComputer {
                idle_timeout_ms: Some(3_600_000),
            },
            None,
        ),
    )
    .await
    .expect("patch answers while the disk is full");
    eprintln!(
        "patch on a full disk: {}",
        match &patched {
            Ok(_) => "accepted".to_owned(),
            Err(e) => format!("refused: {e}"),
        }
    );
    // A stop on the full disk: neither its intent nor its confirmation can
    // be written, and the desktop stops all the same.
    let free = free_bytes(&data);
    assert_eq!(free, 0, "nothing can be written when the stop begins");
    let stopped = tokio::time::timeout(Duration::from_secs(60), broker.stop(id, None))
        .await
        .expect("stop answers while the disk is full")
        .expect("a full disk does not refuse a stop");
    eprintln!(
        "stop on a full disk: {:?}, problem {:?}",
        stopped.container, stopped.problem
    );
    assert_eq!(stopped.container, ContainerState::Stopped);
    let problem = stopped.problem.clone().unwrap_or_default();
    assert!(
        problem.contains("could not be saved") && problem.contains("No space left on device"),
        "the failure is reported clearly: {problem:?}"
    );
    assert!(!problem.contains(&*data.to_string_lossy()), "{problem}");
    // The engine's own view, not the broker's.
    let running = docker(&["inspect", "-f", "{{.State.Running}}", &name]);
    let running = String::from_utf8_lossy(&running.stdout).trim().to_owned();
    eprintln!("docker inspect after the stop: running={running}");
    assert_eq!(running, "false", "the container is stopped");
    assert!(check_records(&data) >= records_before, "no record was lost");
    assert_eq!(
        broker.get(id).await.unwrap().container,
        ContainerState::Stopped
    );

    // Space freed: the desktop starts again.
    std::fs::remove_file(
        data.join("computers")
            .join(id.to_string())
            .join("workspace/fill"),
    )
    .unwrap();
    eprintln!("freed; {} KiB free", free_bytes(&data) / 1024);
    broker.start(id, None).await.unwrap();
    let again = wait_ready(&broker, id, READY_LIMIT).await;
    assert!(
        again.generation >= generation,
        "the generation never goes back"
    );
    let records_after = check_records(&data);

    // A new broker core on the same directory reads every record back.
    drop(broker);
    let _ = tokio::time::timeout(Duration::from_secs(15), core).await;
    let backend = Arc::new(DockerBackend::for_broker(engine, &config));
    let (broker, core) = owner::spawn_backend(config, backend, Arc::new(Metrics::default()))
        .await
        .unwrap();
    let reread = broker.get(id).await.unwrap();
    assert_eq!(reread.generation, again.generation);
    assert_eq!(reread.container, ContainerState::Running);
    eprintln!(
        "records parse: {records_after}; generation {} → {}; a new broker core reads them back",
        generation, reread.generation
    );
    drop(broker);
    let _ = tokio::time::timeout(Duration::from_secs(15), core).await;
    drop(guard);
}
