//! The broker's client of the guest supervisor socket
//! (`<data>/computers/<id>/run/supervisor.sock`, bind-mounted from the guest's
//! `/run/dormouse`).
//!
//! Everything from the guest is hostile input. Before connecting, the socket
//! path is `lstat`ed: it must be a socket, not a symlink, owned by root or by
//! the broker's own uid (a guest could otherwise point the broker at any
//! socket on the host). After connecting, the peer's credentials are checked
//! the same way. Every read and write has a deadline, every frame is bounded
//! by [`FrameHeader::parse`] *before* anything is allocated, and every message
//! is schema-checked ([`frame::decode_message`]). A misbehaving guest yields a
//! [`GuestError`] that degrades its own computer; nothing here may panic or
//! block the broker.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dormouse_protocol::frame::{self, Frame, HEADER_LEN};
use dormouse_protocol::{
    Activity, FrameError, FrameHeader, GuestStatus, Hello, Quiesced, Request, Response,
    PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::time::{timeout, Instant};

/// Deadline for connecting to the socket.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline for an ordinary request/response round trip.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline for a screenshot (the guest encodes a PNG).
pub const SCREENSHOT_TIMEOUT: Duration = Duration::from_secs(15);
/// Deadline for the rest of a frame once its header arrived.
pub const FRAME_BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// What went wrong with the guest.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The socket does not exist (yet).
    #[error("no supervisor socket at {0}")]
    Missing(PathBuf),
    /// Something other than a socket sits at the socket path.
    #[error("{0} is a symlink, refused")]
    Symlink(PathBuf),
    /// Something other than a socket sits at the socket path.
    #[error("{0} is not a socket, refused")]
    NotASocket(PathBuf),
    /// The socket (or its peer) belongs to an unexpected user.
    #[error("{what} is owned by uid {uid}, expected one of {expected:?}, refused")]
    WrongOwner {
        /// The socket path or "peer".
        what: String,
        /// Its owner.
        uid: u32,
        /// Who may own it.
        expected: Vec<u32>,
    },
    /// The socket was replaced between the check and the connect.
    #[error("{0} changed while connecting, refused")]
    Replaced(PathBuf),
    /// Connecting failed (refused: nobody listens yet).
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// A deadline passed.
    #[error("no answer within {0:?} ({1})")]
    Timeout(Duration, &'static str),
    /// A frame was malformed, oversized, truncated or of a newer protocol.
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    /// A well-formed answer of the wrong kind.
    #[error("unexpected answer {got} to {to}")]
    Unexpected {
        /// The request.
        to: &'static str,
        /// What came back.
        got: String,
    },
    /// The supervisor answered with an error.
    #[error("supervisor refused: {code}: {message}")]
    Refused {
        /// Its code.
        code: String,
        /// Its message (guest-controlled; shortened).
        message: String,
    },
    /// The supervisor speaks a protocol this broker does not.
    #[error("supervisor speaks protocol {0}, this broker speaks {PROTOCOL_VERSION}")]
    Incompatible(u32),
}

impl GuestError {
    /// Whether this is the normal state of a guest that is still booting
    /// (no socket yet, or the previous run's socket that nobody listens on).
    pub fn is_not_up_yet(&self) -> bool {
        match self {
            Self::Missing(_) => true,
            Self::Connect(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            ),
            _ => false,
        }
    }
}

/// Guest-controlled text, shortened and stripped of control characters
/// before it reaches logs or the API.
pub fn sanitize(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(300).collect()
}

/// The supervisor socket of one computer and who may own it.
#[derive(Debug, Clone)]
pub struct GuestSocket {
    path: PathBuf,
    allowed_uids: Vec<u32>,
}

impl GuestSocket {
    /// The socket at `path`, which may be owned by root or by this process's
    /// effective uid.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let mut allowed_uids = vec![0];
        let me = nix::unistd::geteuid().as_raw();
        if me != 0 {
            allowed_uids.push(me);
        }
        Self {
            path: path.into(),
            allowed_uids,
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `lstat`s the path: a socket, not a symlink, with an expected owner.
    /// Returns (device, inode) to compare after connecting.
    pub fn check(&self) -> Result<(u64, u64), GuestError> {
        let meta = match std::fs::symlink_metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(GuestError::Missing(self.path.clone()))
            }
            Err(e) => return Err(GuestError::Connect(e)),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(GuestError::Symlink(self.path.clone()));
        }
        if !kind.is_socket() {
            return Err(GuestError::NotASocket(self.path.clone()));
        }
        if !self.allowed_uids.contains(&meta.uid()) {
            return Err(GuestError::WrongOwner {
                what: self.path.display().to_string(),
                uid: meta.uid(),
                expected: self.allowed_uids.clone(),
            });
        }
        Ok((meta.dev(), meta.ino()))
    }

    /// Checks the path, connects with a deadline, then checks that the path
    /// still is the socket it was and that the peer has an expected uid.
    pub async fn connect(&self) -> Result<GuestConnection, GuestError> {
        let before = self.check()?;
        let stream = timeout(CONNECT_TIMEOUT, UnixStream::connect(&self.path))
            .await
            .map_err(|_| GuestError::Timeout(CONNECT_TIMEOUT, "connect"))?
            .map_err(GuestError::Connect)?;
        if self.check()? != before {
            return Err(GuestError::Replaced(self.path.clone()));
        }
        let peer = stream.peer_cred().map_err(GuestError::Connect)?;
        if !self.allowed_uids.contains(&peer.uid()) {
            return Err(GuestError::WrongOwner {
                what: "the socket's peer".into(),
                uid: peer.uid(),
                expected: self.allowed_uids.clone(),
            });
        }
        Ok(GuestConnection { stream })
    }
}

/// One connection to a supervisor.
#[derive(Debug)]
pub struct GuestConnection {
    stream: UnixStream,
}

impl GuestConnection {
    async fn send(&mut self, request: &Request) -> Result<(), GuestError> {
        let bytes = frame::encode(request, &[])?;
        timeout(REQUEST_TIMEOUT, self.stream.write_all(&bytes))
            .await
            .map_err(|_| GuestError::Timeout(REQUEST_TIMEOUT, "write"))?
            .map_err(|e| GuestError::Frame(FrameError::Io(e)))
    }

    /// Reads one frame. `wait` bounds the wait for its first byte (`None`:
    /// wait as long as it takes, for `watch`); the rest of the frame always
    /// has [`FRAME_BODY_TIMEOUT`]. A payload is accepted only on screenshots.
    async fn receive(&mut self, wait: Option<Duration>) -> Result<Frame<Response>, GuestError> {
        let mut head = [0u8; HEADER_LEN];
        let first = match wait {
            Some(limit) => timeout(limit, self.stream.read(&mut head))
                .await
                .map_err(|_| GuestError::Timeout(limit, "answer"))?,
            None => self.stream.read(&mut head).await,
        }
        .map_err(|e| GuestError::Frame(FrameError::Io(e)))?;
        if first == 0 {
            return Err(GuestError::Frame(FrameError::Closed));
        }
        let deadline = Instant::now() + FRAME_BODY_TIMEOUT;
        self.fill(&mut head[first..], deadline, HEADER_LEN).await?;
        let header = FrameHeader::parse(head)?;
        let mut json = vec![0u8; header.message_len as usize];
        self.fill(&mut json, deadline, header.message_len as usize)
            .await?;
        let message: Response = frame::decode_message(&json)?;
        if header.payload_len > 0 && !matches!(message, Response::Screenshot { .. }) {
            return Err(GuestError::Frame(FrameError::Malformed(format!(
                "unexpected {}-byte payload",
                header.payload_len
            ))));
        }
        let mut payload = vec![0u8; header.payload_len as usize];
        self.fill(&mut payload, deadline, header.payload_len as usize)
            .await?;
        Ok(Frame { message, payload })
    }

    async fn fill(
        &mut self,
        buf: &mut [u8],
        deadline: Instant,
        expected: usize,
    ) -> Result<(), GuestError> {
        let already = expected - buf.len();
        match tokio::time::timeout_at(deadline, self.stream.read_exact(buf)).await {
            Err(_) => Err(GuestError::Timeout(FRAME_BODY_TIMEOUT, "rest of a frame")),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(GuestError::Frame(FrameError::Truncated {
                    expected,
                    got: already,
                }))
            }
            Ok(Err(e)) => Err(GuestError::Frame(FrameError::Io(e))),
            Ok(Ok(_)) => Ok(()),
        }
    }

    async fn ask(
        &mut self,
        request: &Request,
        wait: Duration,
    ) -> Result<Frame<Response>, GuestError> {
        self.send(request).await?;
        let answer = self.receive(Some(wait)).await?;
        if let Response::Error { code, message } = &answer.message {
            return Err(GuestError::Refused {
                code: sanitize(code),
                message: sanitize(message),
            });
        }
        Ok(answer)
    }

    /// Versions and container-start identity; refuses a newer protocol.
    pub async fn hello(&mut self) -> Result<Hello, GuestError> {
        match self.ask(&Request::Hello, REQUEST_TIMEOUT).await?.message {
            Response::Hello(hello) => {
                if hello.protocol_version == 0 || hello.protocol_version > PROTOCOL_VERSION {
                    return Err(GuestError::Incompatible(hello.protocol_version));
                }
                Ok(hello)
            }
            other => Err(unexpected("hello", &other)),
        }
    }

    /// The guest's status now.
    pub async fn status(&mut self) -> Result<GuestStatus, GuestError> {
        match self.ask(&Request::Status, REQUEST_TIMEOUT).await?.message {
            Response::Status(status) => Ok(status),
            other => Err(unexpected("status", &other)),
        }
    }

    /// Input idle time and busy processes.
    pub async fn activity(&mut self) -> Result<Activity, GuestError> {
        match self.ask(&Request::Activity, REQUEST_TIMEOUT).await?.message {
            Response::Activity(activity) => Ok(activity),
            other => Err(unexpected("activity", &other)),
        }
    }

    /// Asks the guest to close browsers cleanly, within `limit`.
    pub async fn quiesce(&mut self, limit: Duration) -> Result<Quiesced, GuestError> {
        let timeout_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        // The guest keeps to `limit`; allow it a little to answer after that.
        let wait = limit + Duration::from_secs(1);
        match self
            .ask(&Request::Quiesce { timeout_ms }, wait)
            .await?
            .message
        {
            Response::Quiesced(done) => Ok(done),
            other => Err(unexpected("quiesce", &other)),
        }
    }

    /// A PNG of the whole screen.
    pub async fn screenshot(&mut self) -> Result<Vec<u8>, GuestError> {
        let answer = self.ask(&Request::Screenshot, SCREENSHOT_TIMEOUT).await?;
        match answer.message {
            Response::Screenshot { .. } if answer.payload.starts_with(b"\x89PNG\r\n\x1a\n") => {
                Ok(answer.payload)
            }
            Response::Screenshot { .. } => Err(GuestError::Frame(FrameError::Malformed(
                "screenshot payload is not a PNG".into(),
            ))),
            other => Err(unexpected("screenshot", &other)),
        }
    }

    /// Turns the connection into a `watch` stream.
    pub async fn watch(mut self) -> Result<GuestWatch, GuestError> {
        self.send(&Request::Watch).await?;
        Ok(GuestWatch { conn: self })
    }
}

fn unexpected(to: &'static str, got: &Response) -> GuestError {
    let got = match got {
        Response::Hello(_) => "hello",
        Response::Status(_) => "status",
        Response::Screenshot { .. } => "screenshot",
        Response::Quiesced(_) => "quiesced",
        Response::Activity(_) => "activity",
        Response::Error { .. } => "error",
    };
    GuestError::Unexpected {
        to,
        got: got.into(),
    }
}

/// A `watch` stream: every status change the supervisor pushes.
#[derive(Debug)]
pub struct GuestWatch {
    conn: GuestConnection,
}

impl GuestWatch {
    /// The next status; waits as long as the guest is quiet.
    pub async fn next(&mut self) -> Result<GuestStatus, GuestError> {
        let answer = self.conn.receive(None).await?;
        match answer.message {
            Response::Status(status) => Ok(status),
            Response::Error { code, message } => Err(GuestError::Refused {
                code: sanitize(&code),
                message: sanitize(&message),
            }),
            other => Err(unexpected("watch", &other)),
        }
    }
}

/// One connection's worth of request: connect, ask, hang up.
pub async fn activity(socket: &GuestSocket) -> Result<Activity, GuestError> {
    socket.connect().await?.activity().await
}

/// Connect and quiesce within `limit`.
pub async fn quiesce(socket: &GuestSocket, limit: Duration) -> Result<Quiesced, GuestError> {
    socket.connect().await?.quiesce(limit).await
}

/// Connect and take a screenshot.
pub async fn screenshot(socket: &GuestSocket) -> Result<Vec<u8>, GuestError> {
    socket.connect().await?.screenshot().await
}

/// What a follower reports about the guest.
#[derive(Debug, Clone)]
pub enum GuestUpdate {
    /// Connected and greeted.
    Connected(Hello),
    /// A status, pushed by the guest.
    Status(GuestStatus),
    /// The guest closed the stream cleanly (it is stopping, or restarting
    /// its socket); the follower reconnects.
    Closed,
    /// The connection failed or the guest misbehaved; the follower retries.
    Lost(String),
    /// The guest could not be reached within the connect window; the
    /// follower has stopped.
    GaveUp(String),
}

/// Follows one running container's supervisor: connects (retrying while the
/// guest boots, for at most `connect_within`), greets, then streams every
/// status the guest pushes to `emit`. When the connection breaks it reports
/// the reason and starts over. Ends when `emit` returns `false` or when the
/// guest cannot be reached within `connect_within` of a (re)connect attempt.
/// The owner aborts it when the container stops.
pub async fn follow<F, Fut>(socket: GuestSocket, connect_within: Duration, mut emit: F)
where
    F: FnMut(GuestUpdate) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut failures: u32 = 0;
    loop {
        let begun = Instant::now();
        let deadline = begun + connect_within;
        let mut pause = Duration::from_millis(5);
        let conn = loop {
            match socket.connect().await {
                Ok(conn) => break Some(conn),
                Err(e) => {
                    if !e.is_not_up_yet() && !emit(GuestUpdate::Lost(e.to_string())).await {
                        return;
                    }
                    if Instant::now() + pause > deadline {
                        let _ = emit(GuestUpdate::GaveUp(e.to_string())).await;
                        break None;
                    }
                    tokio::time::sleep(pause).await;
                    // Every lost millisecond is resume latency: poll briskly
                    // while a desktop boots, then relax.
                    let cap = if begun.elapsed() < Duration::from_secs(5) {
                        Duration::from_millis(20)
                    } else {
                        Duration::from_millis(250)
                    };
                    pause = (pause * 2).min(cap);
                }
            }
        };
        let Some(mut conn) = conn else { return };
        let outcome: Result<(), GuestError> = async {
            let hello = conn.hello().await?;
            if !emit(GuestUpdate::Connected(hello)).await {
                return Ok(());
            }
            let mut watch = conn.watch().await?;
            loop {
                let status = watch.next().await?;
                failures = 0;
                if !emit(GuestUpdate::Status(status)).await {
                    return Ok(());
                }
            }
        }
        .await;
        match outcome {
            Ok(()) => return,
            Err(GuestError::Frame(FrameError::Closed)) => {
                if !emit(GuestUpdate::Closed).await {
                    return;
                }
            }
            Err(e) => {
                if !emit(GuestUpdate::Lost(e.to_string())).await {
                    return;
                }
                // A guest that keeps breaking the protocol is retried ever
                // more slowly, so it cannot make the broker spin.
                failures = failures.saturating_add(1);
                let wait = Duration::from_millis(100)
                    .saturating_mul(1u32 << failures.min(6))
                    .min(Duration::from_secs(5));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::unix::fs::symlink;

    use dormouse_protocol::{ContainerStartIdentity, Phase};
    use tokio::net::UnixListener;

    use super::*;

    pub(crate) fn identity() -> ContainerStartIdentity {
        ContainerStartIdentity {
            boot_id: "b".into(),
            pid_ns_inode: 1,
            pid1_start_time: 2,
        }
    }

    pub(crate) fn status(ready: bool) -> GuestStatus {
        GuestStatus {
            phase: if ready { Phase::Ready } else { Phase::Starting },
            ready,
            ready_since: None,
            identity: identity(),
            services: vec![],
            health: None,
            problem: None,
        }
    }

    /// Accepts one connection and answers with `script(request)` raw bytes.
    async fn serve_once(
        listener: UnixListener,
        script: impl Fn(&Request) -> Vec<u8> + Send + 'static,
    ) {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.expect("read");
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while let Some((frame, used)) = frame::decode::<Request>(&buf).expect("decode") {
                buf.drain(..used);
                let reply = script(&frame.message);
                if stream.write_all(&reply).await.is_err() {
                    return;
                }
            }
        }
    }

    fn hello_frame() -> Vec<u8> {
        frame::encode(
            &Response::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                supervisor_version: "t".into(),
                identity: identity(),
            }),
            &[],
        )
        .expect("encode")
    }

    #[tokio::test]
    async fn a_well_behaved_guest_answers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("supervisor.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        tokio::spawn(serve_once(listener, |req| match req {
            Request::Hello => hello_frame(),
            Request::Activity => frame::encode(
                &Response::Activity(Activity {
                    input_idle_ms: Some(5),
                    busy: false,
                    busy_processes: vec![],
                }),
                &[],
            )
            .expect("encode"),
            _ => frame::encode(&Response::error("nope", "no"), &[]).expect("encode"),
        }));
        let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
        assert_eq!(
            conn.hello().await.expect("hello").protocol_version,
            PROTOCOL_VERSION
        );
        assert_eq!(
            conn.activity().await.expect("activity").input_idle_ms,
            Some(5)
        );
        assert!(matches!(
            conn.status().await,
            Err(GuestError::Refused { .. })
        ));
    }

    #[tokio::test]
    async fn a_symlink_at_the_socket_path_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real.sock");
        let _listener = UnixListener::bind(&real).expect("bind");
        let path = dir.path().join("supervisor.sock");
        symlink(&real, &path).expect("symlink");
        let err = GuestSocket::new(&path)
            .connect()
            .await
            .expect_err("refused");
        assert!(matches!(err, GuestError::Symlink(_)), "{err}");
        assert!(!err.is_not_up_yet());
    }

    #[tokio::test]
    async fn a_regular_file_at_the_socket_path_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("supervisor.sock");
        std::fs::write(&path, "x").expect("write");
        let err = GuestSocket::new(&path)
            .connect()
            .await
            .expect_err("refused");
        assert!(matches!(err, GuestError::NotASocket(_)), "{err}");
    }

    #[tokio::test]
    async fn a_socket_of_another_user_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("supervisor.sock");
        let _listener = UnixListener::bind(&path).expect("bind");
        let socket = GuestSocket {
            path: path.clone(),
            allowed_uids: vec![4242],
        };
        let err = socket.connect().await.expect_err("refused");
        assert!(matches!(err, GuestError::WrongOwner { uid, .. } if uid != 4242));
    }

    #[tokio::test]
    async fn a_missing_socket_is_not_up_yet() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = GuestSocket::new(dir.path().join("supervisor.sock"))
            .connect()
            .await
            .expect_err("missing");
        assert!(err.is_not_up_yet());
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_before_allocating() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("supervisor.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        tokio::spawn(serve_once(listener, |_| {
            // Announces 4 GiB of JSON.
            vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]
        }));
        let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
        let err = conn.hello().await.expect_err("oversized");
        assert!(
            matches!(err, GuestError::Frame(FrameError::MessageTooLarge { .. })),
            "{err}"
        );
    }

    #[tokio::test]
    async fn garbage_and_wrong_kinds_and_payloads_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("supervisor.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        tokio::spawn(serve_once(listener, |req| match req {
            Request::Hello => frame::frame_unchecked(br#"{"v":1,"kind":"launch_missiles"}"#, &[]),
            Request::Status => hello_frame(),
            _ => frame::encode(
                &Response::Activity(Activity {
                    input_idle_ms: None,
                    busy: false,
                    busy_processes: vec![],
                }),
                b"sneaky",
            )
            .expect("encode"),
        }));
        let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
        assert!(matches!(
            conn.hello().await,
            Err(GuestError::Frame(FrameError::UnknownKind(_)))
        ));
        assert!(matches!(
            conn.status().await,
            Err(GuestError::Unexpected { .. })
        ));
        assert!(matches!(
            conn.activity().await,
            Err(GuestError::Frame(FrameError::Malformed(_)))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_frame_times_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("supervisor.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        tokio::spawn(serve_once(listener, |_| {
            // A header announcing 100 bytes, then nothing.
            FrameHeader {
                message_len: 100,
                payload_len: 0,
            }
            .to_bytes()
            .to_vec()
        }));
        let mut conn = GuestSocket::new(&path).connect().await.expect("connect");
        let err = conn.hello().await.expect_err("stalls");
        assert!(matches!(err, GuestError::Timeout(..)), "{err}");
    }

    #[tokio::test]
    async fn the_follower_streams_statuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("supervisor.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        tokio::spawn(serve_once(listener, |req| match req {
            Request::Hello => hello_frame(),
            Request::Watch => {
                let mut out = frame::encode(&Response::Status(status(false)), &[]).expect("e");
                out.extend(frame::encode(&Response::Status(status(true)), &[]).expect("e"));
                out
            }
            _ => Vec::new(),
        }));
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let follower = tokio::spawn(follow(
            GuestSocket::new(&path),
            Duration::from_secs(5),
            move |u| {
                let tx = tx.clone();
                async move { tx.send(u).await.is_ok() }
            },
        ));
        assert!(matches!(rx.recv().await, Some(GuestUpdate::Connected(_))));
        assert!(matches!(rx.recv().await, Some(GuestUpdate::Status(s)) if !s.ready));
        assert!(matches!(rx.recv().await, Some(GuestUpdate::Status(s)) if s.ready));
        follower.abort();
    }
}
