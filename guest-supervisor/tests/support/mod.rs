//! A desktop container with its run directory on the host, and a guest
//! socket client as small as the broker's: shared by the real-engine tests
//! (`tests/socket.rs`) and the readiness benchmark (`examples/bench_ready.rs`).
//!
//! Waiting is event-driven: the socket's appearance is seen with inotify on
//! the run directory, readiness through `watch`. The deadlines here are hang
//! guards, not speed assertions.

#![allow(clippy::unwrap_used, dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use dormouse_e2e::{
    desktop_image, docker, docker_available, docker_ok, unique_name, ContainerGuard, TempDir,
    TEST_LABEL,
};
use dormouse_protocol::frame::{self, Frame, HEADER_LEN};
use dormouse_protocol::{ContainerStartIdentity, FrameHeader, GuestStatus, Request, Response};
use dormouse_supervisor::REQUIRED_CAPABILITIES;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::time::{timeout, timeout_at, Instant};

/// Hang guard for a desktop to come up (cold caches on a loaded machine).
pub const UP_GUARD: Duration = Duration::from_secs(90);
/// Hang guard for one answer.
pub const ANSWER_GUARD: Duration = Duration::from_secs(30);
/// Screen size the tests configure, unlike the default, so the screenshot
/// proves the configured size is honoured.
pub const WIDTH: u32 = 1024;
pub const HEIGHT: u32 = 640;

/// One desktop container with its run directory on the host.
pub struct Desktop {
    /// Removes the container when dropped.
    pub guard: ContainerGuard,
    /// Mounted at `/run/dormouse`.
    pub run_dir: TempDir,
}

impl Desktop {
    /// Creates (not starts) a hardened desktop; `None` when the test must
    /// skip (no engine or image, reported visibly by the helpers).
    pub fn create(test: &str) -> Option<Self> {
        Self::create_as(test, Entrypoint::Supervisor)
    }

    /// Creates a container of the same image with the same flags whose
    /// process only marks that it ran ([`Desktop::ran_marker`]) and sleeps:
    /// what a start costs the engine alone.
    pub fn create_trivial(test: &str) -> Option<Self> {
        Self::create_as(test, Entrypoint::Trivial)
    }

    fn create_as(test: &str, entrypoint: Entrypoint) -> Option<Self> {
        if !docker_available(test) {
            return None;
        }
        let image = desktop_image(test)?;
        let name = unique_name("dormouse-sock");
        let run_dir = TempDir::new("dormouse-sock-run");
        let mut args: Vec<String> = vec!["create".into(), "--name".into(), name.clone()];
        args.extend(hardening_args());
        args.extend([
            "-e".to_owned(),
            format!("DORMOUSE_WIDTH={WIDTH}"),
            "-e".to_owned(),
            format!("DORMOUSE_HEIGHT={HEIGHT}"),
            "-v".to_owned(),
            format!("{}:/run/dormouse", run_dir.path().display()),
        ]);
        match (entrypoint, std::env::var("DORMOUSE_SUPERVISOR_BIN")) {
            (Entrypoint::Trivial, _) => {
                args.extend([
                    "--entrypoint".into(),
                    "/bin/sh".into(),
                    image,
                    "-c".into(),
                    format!("echo > /run/dormouse/{RAN_MARKER} && exec sleep infinity"),
                ]);
            }
            (Entrypoint::Supervisor, Ok(bin)) => args.extend([
                "-v".to_owned(),
                format!("{bin}:/usr/local/bin/dormouse-supervisor:ro"),
                "--entrypoint".to_owned(),
                "/usr/local/bin/dormouse-supervisor".to_owned(),
                image,
                "run".to_owned(),
            ]),
            (Entrypoint::Supervisor, Err(_)) => args.push(image),
        }
        let guard = ContainerGuard::new(name);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        docker_ok(&argv);
        Some(Self { guard, run_dir })
    }

    /// The container's name.
    pub fn name(&self) -> &str {
        &self.guard.name
    }

    /// The trivial container's marker on the host.
    pub fn ran_marker(&self) -> PathBuf {
        self.run_dir.path().join(RAN_MARKER)
    }

    /// The socket on the host.
    pub fn socket(&self) -> PathBuf {
        self.run_dir
            .path()
            .join(dormouse_protocol::SOCKET_FILE_NAME)
    }

    /// `docker start`, then a connection as soon as the supervisor listens.
    pub async fn start(&self) -> Client {
        let waiter = RunDirWatch::new(self.run_dir.path());
        docker_ok(&["start", self.name()]);
        waiter.connect(&self.socket(), self).await
    }

    /// The container's last log lines, for failure messages.
    pub fn logs(&self) -> String {
        let out = docker(&["logs", "--tail", "60", self.name()]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

/// What a container runs.
#[derive(Debug, Clone, Copy)]
enum Entrypoint {
    /// The image's supervisor (or `DORMOUSE_SUPERVISOR_BIN` over it).
    Supervisor,
    /// A shell that creates the run marker and sleeps.
    Trivial,
}

/// What a trivial container creates in its run directory once it runs.
pub const RAN_MARKER: &str = "ran";

/// The flags the broker creates desktops with: no network, every
/// capability dropped but the supervisor's, no privilege gain, private IPC.
pub fn hardening_args() -> Vec<String> {
    let mut args: Vec<String> = [
        "--label",
        &format!("{TEST_LABEL}=1"),
        "--network",
        "none",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--ipc",
        "private",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for cap in REQUIRED_CAPABILITIES {
        args.extend(["--cap-add".to_owned(), (*cap).to_owned()]);
    }
    args
}

/// Sees the socket appear through inotify on the run directory (set up
/// before the start, so no creation is missed).
pub struct RunDirWatch {
    inotify: AsyncFd<inotify::Inotify>,
}

impl RunDirWatch {
    pub fn new(dir: &Path) -> Self {
        let inotify = inotify::Inotify::init().unwrap();
        inotify
            .watches()
            .add(
                dir,
                inotify::WatchMask::CREATE
                    | inotify::WatchMask::MOVED_TO
                    | inotify::WatchMask::ATTRIB,
            )
            .unwrap();
        // SAFETY: the `Inotify` owns a valid descriptor, and it is neither
        // closed nor replaced while the `AsyncFd` holds it.
        let inotify = unsafe { AsyncFd::register(inotify) }.unwrap();
        Self { inotify }
    }

    /// Connects; while nothing listens (no file yet, or a stale one left by
    /// a kill), waits for the next change in the directory.
    pub async fn connect(mut self, path: &Path, desktop: &Desktop) -> Client {
        let deadline = Instant::now() + UP_GUARD;
        loop {
            if let Ok(stream) = UnixStream::connect(path).await {
                return Client { stream };
            }
            self.next_change(deadline, desktop, path).await;
        }
    }

    /// Waits until `path` exists.
    pub async fn file_appears(mut self, path: &Path, desktop: &Desktop) {
        let deadline = Instant::now() + UP_GUARD;
        while std::fs::symlink_metadata(path).is_err() {
            self.next_change(deadline, desktop, path).await;
        }
    }

    async fn next_change(&mut self, deadline: Instant, desktop: &Desktop, path: &Path) {
        let changed = timeout_at(deadline, async {
            let mut guard = self.inotify.readable_mut().await.unwrap();
            let mut buf = [0u8; 1024];
            // Drain; only "something changed" matters.
            let _ = guard.try_io(|fd| fd.get_mut().read_events(&mut buf).map(|_| ()));
        })
        .await;
        assert!(
            changed.is_ok(),
            "{}: {} never appeared; logs:\n{}",
            desktop.name(),
            path.display(),
            desktop.logs()
        );
    }
}

/// A guest socket client, as small as the broker's.
pub struct Client {
    /// The connection.
    pub stream: UnixStream,
}

impl Client {
    pub async fn connect(path: &Path) -> Self {
        Self {
            stream: UnixStream::connect(path).await.unwrap(),
        }
    }

    pub async fn send(&mut self, request: &Request) {
        let bytes = frame::encode(request, &[]).unwrap();
        self.stream.write_all(&bytes).await.unwrap();
    }

    /// One response, or `None` when the supervisor closed the connection.
    pub async fn recv(&mut self) -> Option<Frame<Response>> {
        timeout(ANSWER_GUARD, async {
            let mut head = [0u8; HEADER_LEN];
            if let Err(e) = self.stream.read_exact(&mut head).await {
                assert!(
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                    ),
                    "read: {e}"
                );
                return None;
            }
            let header = FrameHeader::parse(head).unwrap();
            let mut whole = head.to_vec();
            whole.resize(
                HEADER_LEN + (header.message_len + header.payload_len) as usize,
                0,
            );
            self.stream
                .read_exact(&mut whole[HEADER_LEN..])
                .await
                .unwrap();
            let (frame, _) = frame::decode::<Response>(&whole).unwrap().unwrap();
            Some(frame)
        })
        .await
        .expect("the supervisor answers")
    }

    pub async fn ask(&mut self, request: &Request) -> Frame<Response> {
        self.send(request).await;
        self.recv().await.expect("an answer")
    }

    pub async fn identity(&mut self) -> ContainerStartIdentity {
        match self.ask(&Request::Hello).await.message {
            Response::Hello(h) => {
                assert_eq!(h.protocol_version, dormouse_protocol::PROTOCOL_VERSION);
                assert!(!h.supervisor_version.is_empty());
                h.identity
            }
            other => panic!("hello answered {other:?}"),
        }
    }

    /// Sends `watch` and reads pushed statuses until one is ready.
    pub async fn watch_until_ready(&mut self, desktop: &Desktop) -> Vec<GuestStatus> {
        self.send(&Request::Watch).await;
        let deadline = Instant::now() + UP_GUARD;
        let mut seen = Vec::new();
        loop {
            let next = timeout_at(deadline, self.recv()).await;
            let Ok(Some(frame)) = next else {
                panic!(
                    "{} not ready; statuses seen: {:#?}\nlogs:\n{}",
                    desktop.name(),
                    seen.last(),
                    desktop.logs()
                );
            };
            let Response::Status(status) = frame.message else {
                panic!("watch pushed {:?}", frame.message);
            };
            let ready = status.ready;
            seen.push(status);
            if ready {
                return seen;
            }
        }
    }
}

/// The code of an error response.
pub fn error_code(response: &Response) -> &str {
    match response {
        Response::Error { code, .. } => code,
        other => panic!("expected an error, got {other:?}"),
    }
}
