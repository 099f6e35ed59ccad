//! The broker's client of the guest supervisor socket
//! (`<data>/computers/<id>/run/supervisor.sock`, bind-mounted from the guest's
//! `/run/dormouse`).
//!
//! Everything from the guest is hostile input. The guest's root controls
//! the entries of the run directory and can swap the socket for a symlink
//! at any moment, so the socket is never reached by path: the run directory
//! is opened once per connect, the socket is opened beneath it with
//! `O_PATH | O_NOFOLLOW`, `fstat`ed (a socket, not a symlink, owned by root
//! or by the broker's own uid), and the connect goes to that very inode
//! through `/proc/self/fd/N` ([`RunDir::connect`]). After connecting, the
//! peer's credentials are checked the same way. Every read and write has a
//! deadline, every frame is bounded *before* anything is allocated
//! ([`stream::read_frame`]), every message is schema-checked, and every
//! string and list in it is escaped and capped on arrival
//! ([`Taming::GUEST`]). A misbehaving guest yields a [`GuestError`] that
//! degrades its own computer; nothing here may panic or block the broker.

use std::ffi::OsString;
use std::future::Future;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dormouse_protocol::frame::{self, Frame, Taming};
use dormouse_protocol::stream::{self, ReadLimits, StreamError};
use dormouse_protocol::{
    call, Answer, Call, FrameError, GuestStatus, Hello, Quiesced, Request, Response,
    PROTOCOL_VERSION,
};
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};
use tokio::net::UnixStream;
use tokio::time::{timeout, Instant};

pub mod egress;
pub mod exec;

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

    fn from_stream(e: StreamError) -> Self {
        match e {
            StreamError::Frame(e) => Self::Frame(e),
            StreamError::Idle(wait) => Self::Timeout(wait, "answer"),
            StreamError::Stalled(_) => Self::Timeout(FRAME_BODY_TIMEOUT, "rest of a frame"),
            StreamError::WriteStalled(wait) => Self::Timeout(wait, "write"),
            StreamError::UnexpectedPayload { kind, len } => Self::Frame(FrameError::Malformed(
                format!("unexpected {len}-byte payload on {kind}"),
            )),
        }
    }
}

/// Guest-controlled text, escaped (control and format characters written
/// out, never passed through) and shortened before it reaches logs or the
/// API. Messages are tamed like this on arrival already; this is for text
/// the broker composes around them.
pub fn sanitize(text: &str) -> String {
    frame::escape_text(text, Taming::GUEST.max_bytes)
}

/// A directory whose entries a guest controls (the run directory), and who
/// may own the sockets in it.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
    allowed_uids: Vec<u32>,
}

impl RunDir {
    /// The directory at `path`; its sockets may be owned by root or by this
    /// process's effective uid.
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

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the socket `name` beneath the directory without following a
    /// link (`O_PATH | O_NOFOLLOW` on the directory and the entry) and checks
    /// it by `fstat`: a socket with an expected owner. The returned
    /// descriptor is that inode, whatever the guest renames afterwards.
    pub fn open_socket(
        &self,
        name: &str,
    ) -> Result<(OwnedFd, nix::sys::stat::FileStat), GuestError> {
        let shown = self.path.join(name);
        let io = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
        let dir = nix::fcntl::open(
            &self.path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            nix::errno::Errno::ENOENT => GuestError::Missing(shown.clone()),
            e => GuestError::Connect(io(e)),
        })?;
        let fd = nix::fcntl::openat(
            &dir,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            nix::errno::Errno::ENOENT => GuestError::Missing(shown.clone()),
            e => GuestError::Connect(io(e)),
        })?;
        let meta = nix::sys::stat::fstat(&fd).map_err(|e| GuestError::Connect(io(e)))?;
        let kind = SFlag::from_bits_truncate(meta.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFLNK {
            return Err(GuestError::Symlink(shown));
        }
        if kind != SFlag::S_IFSOCK {
            return Err(GuestError::NotASocket(shown));
        }
        if !self.allowed_uids.contains(&meta.st_uid) {
            return Err(GuestError::WrongOwner {
                what: shown.display().to_string(),
                uid: meta.st_uid,
                expected: self.allowed_uids.clone(),
            });
        }
        Ok((fd, meta))
    }

    /// Connects to the socket `name` beneath the directory, race-free: to
    /// the inode [`RunDir::open_socket`] opened and checked, through
    /// `/proc/self/fd/N`, so a link swapped in at any moment is never
    /// followed. Then checks the peer's uid. Bounded by [`CONNECT_TIMEOUT`].
    pub async fn connect(&self, name: &str) -> Result<UnixStream, GuestError> {
        let (fd, _) = self.open_socket(name)?;
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let stream = timeout(CONNECT_TIMEOUT, UnixStream::connect(&by_fd))
            .await
            .map_err(|_| GuestError::Timeout(CONNECT_TIMEOUT, "connect"))?
            .map_err(GuestError::Connect)?;
        drop(fd);
        let peer = stream.peer_cred().map_err(GuestError::Connect)?;
        if !self.allowed_uids.contains(&peer.uid()) {
            return Err(GuestError::WrongOwner {
                what: "the socket's peer".into(),
                uid: peer.uid(),
                expected: self.allowed_uids.clone(),
            });
        }
        Ok(stream)
    }
}

/// A way to reach a supervisor other than its socket in a host directory:
/// the near end of a stream the backend joined to the guest socket (e.g.
/// `dormouse-supervisor bridge` over the engine's exec). Everything on it is
/// as hostile as the socket, and read with the same bounds.
pub trait GuestRelay: Send + Sync + std::fmt::Debug {
    /// Opens one stream to the supervisor.
    fn open(&self) -> futures_util::future::BoxFuture<'_, Result<UnixStream, GuestError>>;

    /// Opens one stream to the desktop's VNC server (the live screen's RFB),
    /// the same way. A relay that cannot carries no screen.
    fn open_vnc(&self) -> futures_util::future::BoxFuture<'_, Result<UnixStream, GuestError>> {
        Box::pin(async {
            Err(GuestError::Connect(std::io::Error::other(
                "this guest channel carries no screen",
            )))
        })
    }
}

/// The supervisor socket of one computer and who may own it.
#[derive(Debug, Clone)]
pub struct GuestSocket {
    path: PathBuf,
    dir: RunDir,
    name: OsString,
    /// When set, connections go through it instead of the run directory.
    relay: Option<std::sync::Arc<dyn GuestRelay>>,
}

impl GuestSocket {
    /// The socket at `path`, which may be owned by root or by this process's
    /// effective uid.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().map(OsString::from).unwrap_or_default();
        Self {
            dir: RunDir::new(dir),
            name,
            path,
            relay: None,
        }
    }

    /// The same guest, reached through `relay` instead of the run directory.
    pub fn through(mut self, relay: std::sync::Arc<dyn GuestRelay>) -> Self {
        self.relay = Some(relay);
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn name(&self) -> Result<&str, GuestError> {
        self.name
            .to_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| GuestError::NotASocket(self.path.clone()))
    }

    /// Opens the socket without following links and checks it: a socket,
    /// not a symlink, with an expected owner. Returns (device, inode).
    pub fn check(&self) -> Result<(u64, u64), GuestError> {
        let (_, meta) = self.dir.open_socket(self.name()?)?;
        Ok((meta.st_dev, meta.st_ino))
    }

    /// Connects race-free (see [`RunDir::connect`]), or through the relay.
    pub async fn connect(&self) -> Result<GuestConnection, GuestError> {
        let stream = match &self.relay {
            Some(relay) => timeout(CONNECT_TIMEOUT, relay.open())
                .await
                .map_err(|_| GuestError::Timeout(CONNECT_TIMEOUT, "connect"))??,
            None => self.dir.connect(self.name()?).await?,
        };
        Ok(GuestConnection {
            stream,
            direct: self.relay.is_none(),
        })
    }

    /// One connection's worth of request: connect, send `request`, wait up
    /// to [`REQUEST_TIMEOUT`] for its checked answer
    /// ([`GuestConnection::call`]), hang up.
    pub async fn call<C: Call>(&self, request: C) -> Result<Frame<C::Answer>, GuestError> {
        self.connect().await?.call(request).await
    }

    /// [`GuestSocket::call`], waiting up to `wait` for the answer.
    pub async fn call_within<C: Call>(
        &self,
        request: C,
        wait: Duration,
    ) -> Result<Frame<C::Answer>, GuestError> {
        self.connect().await?.call_within(request, wait).await
    }

    /// A raw stream to the desktop's VNC socket (`vnc.sock` beside the
    /// supervisor socket), opened by the same rules: race-free and
    /// owner-checked in the run directory, or through the relay.
    pub async fn connect_vnc(&self) -> Result<UnixStream, GuestError> {
        match &self.relay {
            Some(relay) => timeout(CONNECT_TIMEOUT, relay.open_vnc())
                .await
                .map_err(|_| GuestError::Timeout(CONNECT_TIMEOUT, "connect"))?,
            None => {
                self.dir
                    .connect(dormouse_protocol::screen::VNC_SOCKET_FILE_NAME)
                    .await
            }
        }
    }
}

/// One connection to a supervisor.
#[derive(Debug)]
pub struct GuestConnection {
    stream: UnixStream,
    /// On the guest's socket itself, not through a [`GuestRelay`]: only
    /// then can a descriptor cross (an egress hand-over).
    direct: bool,
}

impl GuestConnection {
    async fn send(&mut self, request: &Request) -> Result<(), GuestError> {
        stream::write_frame(&mut self.stream, request, &[], REQUEST_TIMEOUT)
            .await
            .map_err(GuestError::from_stream)
    }

    /// Reads one frame, tamed. `wait` bounds the wait for its first byte
    /// (`None`: wait as long as it takes, for `watch`); the rest of the
    /// frame always has [`FRAME_BODY_TIMEOUT`]. A payload is accepted only
    /// on a response that may carry one.
    async fn receive(&mut self, wait: Option<Duration>) -> Result<Frame<Response>, GuestError> {
        self.receive_bounded(wait, dormouse_protocol::MAX_PAYLOAD_LEN)
            .await
    }

    /// [`Self::receive`] of a frame whose payload may be at most
    /// `max_payload` bytes (refused before it is allocated).
    async fn receive_bounded(
        &mut self,
        wait: Option<Duration>,
        max_payload: u32,
    ) -> Result<Frame<Response>, GuestError> {
        let limits = ReadLimits {
            taming: Some(Taming::GUEST),
            max_payload: max_payload.min(dormouse_protocol::MAX_PAYLOAD_LEN),
            ..ReadLimits::new(wait, FRAME_BODY_TIMEOUT)
        };
        stream::read_frame(&mut self.stream, &limits)
            .await
            .map_err(GuestError::from_stream)
    }

    /// Sends `request` and waits up to [`REQUEST_TIMEOUT`] for its answer.
    pub async fn call<C: Call>(&mut self, request: C) -> Result<Frame<C::Answer>, GuestError> {
        self.call_within(request, REQUEST_TIMEOUT).await
    }

    /// Sends `request` and waits up to `wait` for its answer: of the kind
    /// the declaration gives it ([`Call::Answer`]), with a payload its
    /// [`Answer::check`] accepts; an error answer is
    /// [`GuestError::Refused`], any other kind [`GuestError::Unexpected`],
    /// a payload the answer refuses [`GuestError::Frame`].
    pub async fn call_within<C: Call>(
        &mut self,
        request: C,
        wait: Duration,
    ) -> Result<Frame<C::Answer>, GuestError> {
        self.send(&request.into()).await?;
        let answer = self.receive(Some(wait)).await?;
        checked::<C::Answer>(C::KIND, answer)
    }

    /// Versions and container-start identity; refuses a newer protocol.
    pub async fn hello(&mut self) -> Result<Hello, GuestError> {
        let hello = self.call(call::Hello).await?.message;
        if hello.protocol_version == 0 || hello.protocol_version > PROTOCOL_VERSION {
            return Err(GuestError::Incompatible(hello.protocol_version));
        }
        Ok(hello)
    }

    /// Asks the guest to close browsers cleanly, within `limit`.
    pub async fn quiesce(&mut self, limit: Duration) -> Result<Quiesced, GuestError> {
        let timeout_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        // The guest keeps to `limit`; allow it a little to answer after that.
        let wait = limit + Duration::from_secs(1);
        Ok(self
            .call_within(call::Quiesce { timeout_ms }, wait)
            .await?
            .message)
    }

    /// Asks the guest to close browsers cleanly within `limit` and keep
    /// them closed while the returned hold lives: dropping it closes the
    /// connection, and the guest starts again what this quiesce closed
    /// once no other hold is open. An older guest refuses it as
    /// `unknown_kind`.
    pub async fn quiesce_hold(
        mut self,
        limit: Duration,
    ) -> Result<(Quiesced, QuiesceHold), GuestError> {
        let timeout_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        let wait = limit + Duration::from_secs(1);
        let done = self
            .call_within(call::QuiesceHold { timeout_ms }, wait)
            .await?
            .message;
        Ok((done, QuiesceHold { _conn: self }))
    }

    /// Runs a batch of actions, waiting up to `wait` for its answer: the
    /// results and the payload holding their images. The results may be
    /// as many as a batch has actions (more than [`Taming::GUEST`] keeps of
    /// a list); whether they fit the batch is the caller's to check.
    pub async fn actions(
        &mut self,
        batch: dormouse_protocol::actions::ActionBatch,
        wait: Duration,
    ) -> Result<Frame<dormouse_protocol::actions::GuestActionResults>, GuestError> {
        type Answer = dormouse_protocol::actions::GuestActionResults;
        self.send(&call::Actions { batch }.into()).await?;
        let limits = ReadLimits {
            taming: Some(Taming {
                max_items: dormouse_protocol::actions::MAX_ACTIONS,
                ..Taming::GUEST
            }),
            ..ReadLimits::new(Some(wait), FRAME_BODY_TIMEOUT)
        };
        let answer: Frame<Response> = stream::read_frame(&mut self.stream, &limits)
            .await
            .map_err(GuestError::from_stream)?;
        checked::<Answer>(<call::Actions as Call>::KIND, answer)
    }

    /// Turns the connection into a `watch` stream.
    pub async fn watch(mut self) -> Result<GuestWatch, GuestError> {
        self.send(&call::Watch.into()).await?;
        Ok(GuestWatch { conn: self })
    }
}

/// A held quiesce ([`GuestConnection::quiesce_hold`]): the guest keeps the
/// browsers it closed closed while this lives, and reopens them once it is
/// dropped (and no other hold is open). Nothing is ever read or written on
/// it after the answer.
#[derive(Debug)]
pub struct QuiesceHold {
    _conn: GuestConnection,
}

/// The answer `A` to the request of kind `to`, or why `response` is not one.
fn typed<A: Answer>(to: &'static str, response: Response) -> Result<A, GuestError> {
    match A::from_response(response) {
        Ok(answer) => Ok(answer),
        Err(Response::Error { code, message }) => Err(GuestError::Refused {
            code: sanitize(&code),
            message: sanitize(&message),
        }),
        Err(other) => Err(GuestError::Unexpected {
            to,
            got: other.kind().into(),
        }),
    }
}

/// The answer `A` to the request of kind `to` and its payload, checked by
/// [`Answer::check`], or why `frame` is not one.
fn checked<A: Answer>(to: &'static str, frame: Frame<Response>) -> Result<Frame<A>, GuestError> {
    let message = typed::<A>(to, frame.message)?;
    message
        .check(&frame.payload)
        .map_err(|why| GuestError::Frame(FrameError::Malformed(why.into())))?;
    Ok(Frame {
        message,
        payload: frame.payload,
    })
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
        Ok(checked::<<call::Watch as Call>::Answer>(<call::Watch as Call>::KIND, answer)?.message)
    }
}

/// Connect and quiesce within `limit`.
pub async fn quiesce(socket: &GuestSocket, limit: Duration) -> Result<Quiesced, GuestError> {
    socket.connect().await?.quiesce(limit).await
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

/// The pause before reconnecting after the `n`-th trouble in a row (a
/// protocol error, or a clean close that brought no status): 200 ms, then
/// doubling up to 5 s, so a guest that keeps breaking or hanging up cannot
/// make the broker spin.
fn retry_pause(n: u32) -> Duration {
    Duration::from_millis(100)
        .saturating_mul(1u32 << n.min(6))
        .min(Duration::from_secs(5))
}

/// Follows one running container's supervisor: connects (retrying while the
/// guest boots, for at most `connect_within`), greets, then streams every
/// status the guest pushes to `emit`. When the connection breaks it reports
/// the reason and starts over; after a clean close that brought no status
/// (a guest that hangs up right after `watch`) it pauses first, longer each
/// time in a row. Ends when `emit` returns `false` or when the guest cannot
/// be reached within `connect_within` of a (re)connect attempt. The owner
/// aborts it when the container stops.
pub async fn follow<F, Fut>(socket: GuestSocket, connect_within: Duration, mut emit: F)
where
    F: FnMut(GuestUpdate) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut failures: u32 = 0;
    let mut quiet_closes: u32 = 0;
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
        let mut statuses = 0u32;
        let outcome: Result<(), GuestError> = async {
            let hello = conn.hello().await?;
            if !emit(GuestUpdate::Connected(hello)).await {
                return Ok(());
            }
            let mut watch = conn.watch().await?;
            loop {
                let status = watch.next().await?;
                failures = 0;
                quiet_closes = 0;
                statuses = statuses.saturating_add(1);
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
                if statuses == 0 {
                    quiet_closes = quiet_closes.saturating_add(1);
                    tokio::time::sleep(retry_pause(quiet_closes)).await;
                }
            }
            Err(e) => {
                if !emit(GuestUpdate::Lost(e.to_string())).await {
                    return;
                }
                failures = failures.saturating_add(1);
                tokio::time::sleep(retry_pause(failures)).await;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
