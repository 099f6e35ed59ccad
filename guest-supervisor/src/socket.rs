//! The guest socket `/run/dormouse/supervisor.sock`: the only channel between
//! the host and a network-less guest.
//!
//! Owns the run directory (made a real, root-owned 0700 directory, once, by
//! file descriptor, never following a link), the socket file in it (whatever
//! sits at its name when the supervisor starts is removed without being
//! followed, and a fresh socket is bound: the run directory is the
//! supervisor's own, so every start recovers from what a previous one, or a
//! hostile guest root, left there), accepting connections, reading bounded
//! frames and answering requests (`hello`, `status`, `watch`, `screenshot`,
//! `quiesce`, `quiesce_hold`, `activity`, `actions`; `exec` and `pty_open`
//! are served on their connection by [`crate::exec_socket`]). Everything a client sends is hostile until
//! parsed: the 8-byte header is bounds-checked before anything is allocated,
//! every read and write has a deadline (the shared
//! [`dormouse_protocol::stream`] reader and writer), connections are capped,
//! and a bad frame closes only its own connection. This module never changes
//! the status (it reads the [`StatusCell`]) and never stops services itself
//! (a `quiesce`, and the end of a `quiesce_hold`, are handed to the service
//! runner).

use std::ffi::OsStr;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::frame::{self, FrameError, FrameHeader, HEADER_LEN};
use dormouse_protocol::stream::{self, ReadLimits, StreamError};
use dormouse_protocol::{
    Answer, Hello, Quiesced, Request, Response, ScreenshotInfo, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{timeout_at, Instant};

use crate::config::Config;
use crate::exec::ExecRunner;
use crate::exec_socket::{ExecService, Reservation, MAX_EXEC_MESSAGE, MAX_EXEC_PAYLOAD};
use crate::nofollow::{EntryKind, HeldDir, Owner};
use crate::state::{QuiesceRequest, StatusCell};

/// Largest request message the supervisor reads. Requests are a few dozen
/// bytes; the protocol's general limit ([`dormouse_protocol::MAX_HEADER_LEN`])
/// would let 64 clients pin 16 MiB of a 4 MiB supervisor. Only `exec`,
/// `pty_open` and `actions` (a batch carries up to
/// [`dormouse_protocol::actions::MAX_BATCH_TEXT_BYTES`] of text) may be larger (up to [`MAX_EXEC_MESSAGE`], stdin up to
/// [`MAX_EXEC_PAYLOAD`]), and only within the exec budget, reserved from
/// the frame's header before its body is read.
pub const MAX_REQUEST_LEN: u32 = 4 * 1024;

/// Mode of the run directory: only root in the guest may enter it.
pub const RUN_DIR_MODE: u32 = 0o700;
/// Mode of the socket file.
pub const SOCKET_MODE: u32 = 0o600;

/// Extra time granted to the service runner's quiesce answer beyond the
/// bound it was given, so an answer sent right at the bound is not lost.
const QUIESCE_GRACE: Duration = Duration::from_millis(250);

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The run directory could not be made or secured.
    #[error("preparing the run directory {path}: {source}")]
    RunDir {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The run directory is not a real directory (a link or a file was
    /// planted in its place; a mount point is always a directory).
    #[error("{path}: the run directory is not a real directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Something other than a socket sits where the socket goes.
    #[error("{path} exists and is a {kind}, not a socket: refusing to replace it")]
    Occupied {
        /// The path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// What sat at the socket path could not be removed.
    #[error("removing the stale socket {path}: {source}")]
    RemoveStale {
        /// The path.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// `bind` failed.
    #[error("binding {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The socket's mode could not be set.
    #[error("setting the mode of {path}: {source}")]
    Permissions {
        /// The path.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// Binds the socket and serves it until the returned future is dropped
/// (which also ends every connection and removes the socket file).
pub async fn serve(
    config: Arc<Config>,
    cell: StatusCell,
    quiesce: mpsc::Sender<QuiesceRequest>,
    exec: ExecRunner,
) -> Result<(), SocketError> {
    let bound = bind(&config)?;
    tracing::info!(path = %bound.path.display(), "guest socket listening");
    accept_loop(&bound.listener, config, cell, quiesce, exec).await;
    Ok(())
}

/// A bound listener; dropping it unlinks the socket file if it is still the
/// one this process made.
#[derive(Debug)]
pub struct BoundSocket {
    /// The listener.
    pub listener: UnixListener,
    dir: HeldDir,
    path: PathBuf,
    name: &'static str,
    dev_ino: (u64, u64),
}

impl BoundSocket {
    /// Where the socket is, for messages.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let name = OsStr::new(self.name);
        if let Ok(st) = nix::sys::stat::fstatat(
            self.dir.fd(),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            if (st.st_dev, st.st_ino) == self.dev_ino {
                let _ = self.dir.unlink(name);
            }
        }
    }
}

/// Makes the run directory shared with the host a real directory owned by
/// the supervisor's user (root) with mode 0700, so only root in the guest
/// (and the host) can reach the supervisor socket. Works by descriptor
/// only: the parent is trusted, the run directory itself is opened without
/// following a link, and its mode and owner are set through that
/// descriptor. Returns the held directory, in which the socket is bound.
pub fn secure_run_dir(config: &Config) -> Result<HeldDir, SocketError> {
    let io = |source| SocketError::RunDir {
        path: config.run_dir.clone(),
        source,
    };
    let (Some(parent), Some(name)) = (config.run_dir.parent(), config.run_dir.file_name()) else {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the run directory needs a parent",
        )));
    };
    if !parent.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .create(parent)
            .map_err(io)?;
    }
    let parent = HeldDir::open_trusted(parent).map_err(io)?;
    let me = Owner {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    };
    if let Some(st) = parent.stat(name).map_err(io)? {
        if st.kind != EntryKind::Dir {
            return Err(SocketError::NotADirectory {
                path: config.run_dir.clone(),
            });
        }
    }
    let dir = parent.ensure_dir(name, RUN_DIR_MODE, me).map_err(io)?;
    let st = dir.stat_self().map_err(io)?;
    // Mode before owner: once it belongs to someone else, a chmod would need
    // CAP_FOWNER. The broker's host directory may arrive owned by a host uid
    // that is the desktop user's uid in here; root must own it so the
    // desktop user cannot replace the socket.
    if st.mode != RUN_DIR_MODE {
        dir.chmod(RUN_DIR_MODE).map_err(io)?;
    }
    if (st.uid, st.gid) != (me.uid, me.gid) {
        dir.chown(me).map_err(io)?;
    }
    Ok(dir)
}

/// What sits at a name, for messages.
fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::Dir => "directory",
        EntryKind::Symlink => "symbolic link",
        EntryKind::File => "regular file",
        EntryKind::Other => "special file",
    }
}

/// Secures the run directory (root-owned, 0700), removes whatever sits at
/// the socket's name (a stale socket, a link, a file, a directory: never
/// followed), binds a fresh socket beneath the held directory and sets it to
/// 0600.
pub fn bind(config: &Config) -> Result<BoundSocket, SocketError> {
    bind_named(config, dormouse_protocol::SOCKET_FILE_NAME)
}

/// [`bind`] for another socket of the run directory (`vnc.sock`), with the
/// same rules.
pub fn bind_named(config: &Config, file_name: &'static str) -> Result<BoundSocket, SocketError> {
    let dir = secure_run_dir(config)?;
    let path = config.run_dir.join(file_name);
    let name = OsStr::new(file_name);
    if let Some(st) = dir.stat(name).map_err(|source| SocketError::RemoveStale {
        path: path.clone(),
        source,
    })? {
        if st.kind != EntryKind::Other {
            tracing::warn!(path = %path.display(), kind = kind_name(st.kind),
                "removing what sits at the socket path (not followed)");
        }
        dir.remove_tree(name)
            .map_err(|source| SocketError::RemoveStale {
                path: path.clone(),
                source,
            })?;
    }
    // Bound beneath the held directory: the path through its descriptor
    // names that very directory, whatever was renamed meanwhile.
    let beneath = PathBuf::from(format!("/proc/self/fd/{}", dir.fd().as_raw_fd())).join(name);
    let listener = UnixListener::bind(&beneath).map_err(|source| SocketError::Bind {
        path: path.clone(),
        source,
    })?;
    // The directory is 0700 and root's, so the moment between bind and
    // chmod exposes nothing, and nobody but root can swap the entry.
    let socket = nix::fcntl::openat(
        dir.fd(),
        name,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| SocketError::Bind {
        path: path.clone(),
        source: e.into(),
    })?;
    let meta = nix::sys::stat::fstat(&socket).map_err(|e| SocketError::Bind {
        path: path.clone(),
        source: e.into(),
    })?;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", socket.as_raw_fd()));
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&by_fd, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(
            |source| SocketError::Permissions {
                path: path.clone(),
                source,
            },
        )?;
    }
    Ok(BoundSocket {
        listener,
        dir,
        path,
        name: file_name,
        dev_ino: (meta.st_dev, meta.st_ino),
    })
}

/// What every connection shares.
#[derive(Debug)]
struct Shared {
    config: Arc<Config>,
    cell: StatusCell,
    quiesce: mpsc::Sender<QuiesceRequest>,
    exec: ExecService,
}

/// Accepts until dropped. Connections live in a [`JoinSet`] owned here, so
/// dropping this future ends them all.
pub async fn accept_loop(
    listener: &UnixListener,
    config: Arc<Config>,
    cell: StatusCell,
    quiesce: mpsc::Sender<QuiesceRequest>,
    exec: ExecRunner,
) {
    let config_max = config.socket_max_connections;
    let shared = Arc::new(Shared {
        config,
        cell,
        quiesce,
        exec: ExecService::new(exec),
    });
    accept_capped(
        listener,
        config_max,
        "guest socket",
        move |stream| {
            let shared = Arc::clone(&shared);
            async move { serve_connection(stream, &shared).await }
        },
        refuse_busy,
    )
    .await;
}

/// Accepts on `listener` until dropped, serving at most `max` connections
/// at once with `serve`, each in a [`JoinSet`] owned here (dropping this
/// future ends them all). An over-limit client is given to `refuse`, then
/// closed; a failed accept (EMFILE and friends) backs off briefly instead
/// of spinning, as the condition clears when connections end.
pub async fn accept_capped<F, Fut>(
    listener: &UnixListener,
    max: usize,
    what: &'static str,
    serve: F,
    refuse: impl Fn(&UnixStream),
) where
    F: Fn(UnixStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max.max(1)));
    let mut connections = JoinSet::new();
    let mut accept_errors = 0u32;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_errors = 0;
                    match Arc::clone(&slots).try_acquire_owned() {
                        Ok(permit) => {
                            let served = serve(stream);
                            connections.spawn(async move {
                                served.await;
                                drop(permit);
                            });
                        }
                        Err(_) => {
                            tracing::warn!(socket = what, "connection limit reached; refusing a client");
                            refuse(&stream);
                        }
                    }
                }
                Err(e) => {
                    accept_errors = accept_errors.saturating_add(1);
                    let pause = Duration::from_millis(10u64 << accept_errors.min(6));
                    tracing::warn!(socket = what, error = %e, ?pause, "accept failed");
                    tokio::time::sleep(pause).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Tells an over-limit client why it is closed, without ever waiting on it.
fn refuse_busy(stream: &UnixStream) {
    if let Ok(bytes) = frame::encode(
        &Response::error("busy", "too many connections; try again"),
        &[],
    ) {
        // A fresh socket's send buffer is empty, so this either writes the
        // whole small frame or nothing; never blocks.
        let _ = stream.try_write(&bytes);
    }
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("requests carry no payload, this one announced {0} bytes")]
    UnexpectedPayload(u32),
    #[error("the rest of the frame did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("the memory for running commands is in use; try again")]
    Busy,
}

impl ReadError {
    /// The stable code sent in [`Response::Error`].
    fn code(&self) -> &'static str {
        match self {
            Self::Frame(FrameError::MessageTooLarge { .. }) => "message_too_large",
            Self::Frame(FrameError::PayloadTooLarge { .. }) | Self::UnexpectedPayload(_) => {
                "payload_too_large"
            }
            Self::Frame(FrameError::UnsupportedVersion { .. }) => "unsupported_version",
            Self::Frame(FrameError::UnknownKind(_)) => "unknown_kind",
            Self::Frame(FrameError::Truncated { .. }) => "truncated",
            Self::Timeout(_) => "timeout",
            Self::Busy => "busy",
            Self::Frame(_) => "bad_frame",
        }
    }
}

/// One request as read: the message, its payload, and the budget held for
/// a large frame.
type Incoming = (Request, Vec<u8>, Option<Reservation>);

/// Reads one request. `Ok(None)`: the client hung up between frames or was
/// silent for the whole idle timeout.
///
/// The header is read first: a frame over [`MAX_REQUEST_LEN`] or with a
/// payload is read only within the exec budget (refused `busy` when it is
/// spent), and must then turn out to be `exec`, `pty_open` or `actions`.
async fn read_request<R: AsyncRead + Unpin>(
    r: &mut R,
    idle: Duration,
    io: Duration,
    exec: &ExecService,
) -> Result<Option<Incoming>, ReadError> {
    let mut head = [0u8; HEADER_LEN];
    let first = match tokio::time::timeout(idle, r.read(&mut head)).await {
        Err(_) | Ok(Ok(0)) => return Ok(None),
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Err(FrameError::Io(e).into()),
    };
    // From the first byte on, the whole frame has one deadline: a client
    // cannot trickle bytes to hold the connection.
    let deadline = Instant::now() + io;
    if let Some(rest) = head.get_mut(first..) {
        match timeout_at(deadline, r.read_exact(rest)).await {
            Err(_) => return Err(ReadError::Timeout(io)),
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(FrameError::Truncated {
                    expected: HEADER_LEN,
                    got: first,
                }
                .into())
            }
            Ok(Err(e)) => return Err(FrameError::Io(e).into()),
        }
    }
    let header = FrameHeader::parse(head)?;
    let large = header.message_len > MAX_REQUEST_LEN || header.payload_len > 0;
    let hold = if large {
        if header.message_len > MAX_EXEC_MESSAGE {
            return Err(FrameError::MessageTooLarge {
                len: header.message_len,
                max: MAX_EXEC_MESSAGE,
            }
            .into());
        }
        if header.payload_len > MAX_EXEC_PAYLOAD {
            return Err(ReadError::UnexpectedPayload(header.payload_len));
        }
        let bytes = u64::from(header.message_len) + u64::from(header.payload_len);
        Some(exec.reserve(bytes).ok_or(ReadError::Busy)?)
    } else {
        None
    };
    let limits = ReadLimits {
        max_message: if large {
            MAX_EXEC_MESSAGE
        } else {
            MAX_REQUEST_LEN
        },
        max_payload: if large { MAX_EXEC_PAYLOAD } else { 0 },
        ..ReadLimits::new(Some(io), deadline.saturating_duration_since(Instant::now()))
    };
    let mut whole = (&head[..]).chain(&mut *r);
    match stream::read_frame::<Request, _>(&mut whole, &limits).await {
        Ok(frame) => {
            let may_be_large = matches!(
                frame.message,
                Request::Exec(_) | Request::PtyOpen(_) | Request::Actions { .. }
            );
            if header.message_len > MAX_REQUEST_LEN && !may_be_large {
                return Err(FrameError::MessageTooLarge {
                    len: header.message_len,
                    max: MAX_REQUEST_LEN,
                }
                .into());
            }
            Ok(Some((frame.message, frame.payload, hold)))
        }
        Err(StreamError::Idle(_) | StreamError::Frame(FrameError::Closed)) => Ok(None),
        Err(StreamError::Frame(e)) => Err(e.into()),
        Err(StreamError::Stalled(_) | StreamError::WriteStalled(_)) => Err(ReadError::Timeout(io)),
        Err(StreamError::UnexpectedPayload { len, .. }) => Err(ReadError::UnexpectedPayload(len)),
    }
}

/// Writes one response within the I/O bound (the payload after the
/// message, never copied into one buffer with it: a screenshot is the
/// largest thing the supervisor ever holds).
async fn write_response<W: AsyncWrite + Unpin>(
    w: &mut W,
    response: &Response,
    payload: &[u8],
    io: Duration,
) -> Result<(), FrameError> {
    match stream::write_frame(w, response, payload, io).await {
        Ok(()) => Ok(()),
        Err(StreamError::Frame(e)) => Err(e),
        Err(_) => Err(FrameError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "client did not read in time",
        ))),
    }
}

async fn serve_connection(stream: UnixStream, shared: &Shared) {
    let idle = Duration::from_millis(shared.config.socket_idle_timeout_ms);
    let io = Duration::from_millis(shared.config.socket_io_timeout_ms);
    let (mut rd, mut wr) = stream.into_split();
    loop {
        let (request, payload, hold) = match read_request(&mut rd, idle, io, &shared.exec).await {
            Ok(Some(incoming)) => incoming,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "closing a guest socket client after a bad frame");
                let reply = Response::error(e.code(), e.to_string());
                let _ = write_response(&mut wr, &reply, &[], io).await;
                return;
            }
        };
        let request = match request {
            Request::Watch => {
                watch(&mut rd, &mut wr, shared, io).await;
                return;
            }
            // Served on the connection, which then means "the caller is
            // still there"; no idle bound applies while they run.
            Request::Exec(exec) => {
                let exec = shared.exec.exec(exec, payload, hold, &mut rd, &mut wr, io);
                if exec.await {
                    continue;
                }
                return;
            }
            Request::PtyOpen(open) => {
                drop(hold);
                shared.exec.pty(open, &mut rd, &mut wr, io).await;
                return;
            }
            // The connection is the hold: served here, then closed.
            Request::QuiesceHold { timeout_ms } => {
                quiesce_hold(timeout_ms, &mut rd, &mut wr, shared, io).await;
                return;
            }
            other => other,
        };
        let (response, payload) = answer(request, shared).await;
        match write_response(&mut wr, &response, &payload, io).await {
            Ok(()) => {}
            // Refused before a byte was written: the client can still be told.
            Err(e @ (FrameError::MessageTooLarge { .. } | FrameError::PayloadTooLarge { .. })) => {
                tracing::warn!(error = %e, "response too large for a frame");
                let reply = Response::error("response_too_large", e.to_string());
                if write_response(&mut wr, &reply, &[], io).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "guest socket client gone");
                return;
            }
        }
    }
}

/// A typed answer as a response without a payload.
fn reply(answer: impl Answer) -> (Response, Vec<u8>) {
    (answer.into_response(), Vec::new())
}

/// Serves one request other than `watch`: the supervisor's handler of each
/// request of the declaration ([`dormouse_protocol::guest`]); a new request
/// is a new arm here, answering with the type the declaration names.
async fn answer(request: Request, shared: &Shared) -> (Response, Vec<u8>) {
    match request {
        Request::Hello => reply(Hello {
            protocol_version: PROTOCOL_VERSION,
            supervisor_version: env!("CARGO_PKG_VERSION").to_owned(),
            identity: shared.cell.identity().clone(),
        }),
        Request::Status | Request::Watch => reply(shared.cell.snapshot()),
        Request::Screenshot => match crate::screenshot::capture(&shared.config).await {
            Ok(shot) => {
                tracing::debug!(
                    width = shot.width,
                    height = shot.height,
                    bytes = shot.png.len(),
                    elapsed_ms = crate::millis(shot.elapsed),
                    "screenshot"
                );
                let info = ScreenshotInfo {
                    width: shot.width,
                    height: shot.height,
                };
                (info.into_response(), shot.png)
            }
            Err(e) => (
                Response::error("screenshot_failed", e.to_string()),
                Vec::new(),
            ),
        },
        Request::Quiesce { timeout_ms } => (quiesce(timeout_ms, false, shared).await.0, Vec::new()),
        Request::Activity => reply(crate::activity::sample(&shared.config).await),
        // Served by `serve_connection` on their connection.
        Request::Exec(_) | Request::PtyOpen(_) | Request::QuiesceHold { .. } => (
            Response::error("bad_request", "served on its own connection"),
            Vec::new(),
        ),
        Request::Actions { batch } => actions(batch, &shared.config).await,
    }
}

/// One batch at a time on the display: two clients' actions never
/// interleave.
static ACTION_BATCH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs a batch of actions ([`crate::input::execute`], bounded by
/// [`dormouse_protocol::actions::guest_wait`]: its own bound and the wait for
/// the batch before it):
/// the results as the answer, the images one after the other as the
/// payload. A batch validation refuses is `invalid_actions` and ran not at
/// all; the images are bounded by validation
/// ([`dormouse_protocol::actions::MAX_IMAGES`]) and while encoding
/// ([`dormouse_protocol::MAX_PAYLOAD_LEN`] together).
async fn actions(
    batch: dormouse_protocol::actions::ActionBatch,
    config: &Config,
) -> (Response, Vec<u8>) {
    let bound = dormouse_protocol::actions::guest_wait(
        &batch,
        Duration::from_millis(config.probe_timeout_ms),
    );
    let started = Instant::now();
    let run = async {
        let _turn = ACTION_BATCH.lock().await;
        crate::input::execute(config, batch, crate::input::InputOptions::default()).await
    };
    // The protocol's wait: once for a batch ahead of it, once for itself
    // (whose hang guard is `batch_bound`).
    let outcome = match tokio::time::timeout(bound, run).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => return (Response::error(e.code(), e.to_string()), Vec::new()),
        Err(_) => {
            let message = format!("the batch did not end within {bound:?}");
            return (Response::error("timeout", message), Vec::new());
        }
    };
    let total = outcome.images.iter().map(Vec::len).sum();
    let mut payload = Vec::with_capacity(total);
    for image in outcome.images {
        payload.extend_from_slice(&image);
    }
    tracing::debug!(
        actions = outcome.answer.results.len(),
        image_bytes = total,
        elapsed_ms = crate::millis(started.elapsed()),
        "actions"
    );
    (outcome.answer.into_response(), payload)
}

/// Hands a quiesce to the service runner and waits for its answer within
/// the bound (clamped to `quiesce_max_ms`). Past the bound the answer is
/// `complete: false`; the broker stops the container either way. The flag
/// says whether the runner took the request (a taken hold must be
/// released).
async fn quiesce(timeout_ms: u64, hold: bool, shared: &Shared) -> (Response, bool) {
    let bound = Duration::from_millis(timeout_ms.min(shared.config.quiesce_max_ms));
    let started = Instant::now();
    let deadline = started + bound;
    let incomplete = |started: Instant| {
        Response::Quiesced(Quiesced {
            closed: Vec::new(),
            complete: false,
            elapsed_ms: crate::millis(started.elapsed()),
        })
    };
    let (reply, answer) = oneshot::channel();
    let request = QuiesceRequest::Close {
        timeout: bound,
        hold,
        reply,
    };
    match timeout_at(deadline, shared.quiesce.send(request)).await {
        Err(_) => return (incomplete(started), false),
        Ok(Err(_)) => {
            let refused = Response::error(
                "quiesce_unavailable",
                "the service runner is not taking quiesce requests",
            );
            return (refused, false);
        }
        Ok(Ok(())) => {}
    }
    match timeout_at(deadline + QUIESCE_GRACE, answer).await {
        Ok(Ok(done)) => (Response::Quiesced(done), true),
        Ok(Err(_)) | Err(_) => (incomplete(started), true),
    }
}

/// Serves `quiesce_hold`: the quiesce and its answer, then the hold for as
/// long as the connection stays open (end of stream, an error or any byte
/// ends it; no idle bound applies), then the release, so the runner
/// reopens what the hold closed once no other hold is open.
async fn quiesce_hold<R, W>(timeout_ms: u64, rd: &mut R, wr: &mut W, shared: &Shared, io: Duration)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (response, taken) = quiesce(timeout_ms, true, shared).await;
    if write_response(wr, &response, &[], io).await.is_ok() && taken {
        let mut scratch = [0u8; 64];
        let _ = rd.read(&mut scratch).await;
    }
    if taken {
        // Waits only while the runner is busy with another request; it
        // never stops taking them before the supervisor ends.
        let _ = shared.quiesce.send(QuiesceRequest::Release).await;
    }
}

/// Pushes the status now and after every change until the client hangs up.
/// Only the latest status is ever sent: a slow reader skips intermediate
/// states instead of making anything queue, and one that stops reading is
/// dropped at the write bound.
async fn watch<R, W>(rd: &mut R, wr: &mut W, shared: &Shared, io: Duration)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut rx = shared.cell.subscribe();
    let mut scratch = [0u8; 64];
    loop {
        let status = rx.borrow_and_update().clone();
        if write_response(wr, &Response::Status(status), &[], io)
            .await
            .is_err()
        {
            return;
        }
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return; // the supervisor is shutting down
                }
            }
            // A watch connection is one-way: end of stream, an error or any
            // further bytes end it.
            _ = rd.read(&mut scratch) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dormouse_protocol::frame::HEADER_LEN;
    use dormouse_protocol::frame::{frame_unchecked, Frame};
    use dormouse_protocol::FrameHeader;
    use dormouse_protocol::{
        ContainerStartIdentity, Phase, ServiceRunState, ServiceState, MAX_HEADER_LEN,
    };
    use std::os::unix::fs::symlink;
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
    use std::path::Path;
    use tokio::io::AsyncWriteExt as _;
    use tokio::time::timeout;

    /// A hang guard for reads in tests; not a speed assertion.
    const GUARD: Duration = Duration::from_secs(20);

    struct Guest {
        _dir: tempfile::TempDir,
        config: Arc<Config>,
        cell: StatusCell,
        quiesce_rx: Option<mpsc::Receiver<QuiesceRequest>>,
        server: tokio::task::JoinHandle<()>,
    }

    impl Drop for Guest {
        fn drop(&mut self) {
            self.server.abort();
        }
    }

    fn identity() -> ContainerStartIdentity {
        ContainerStartIdentity {
            boot_id: "0b5e7a4c-boot".into(),
            pid_ns_inode: 4026532000,
            pid1_start_time: 123456,
        }
    }

    fn start_with(adjust: impl FnOnce(&mut Config)) -> Guest {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config {
            run_dir: dir.path().join("run"),
            tmp_dir: dir.path().join("tmp"),
            proc_root: dir.path().join("proc"),
            busy_sample_ms: 5,
            probe_timeout_ms: 1000,
            ..Config::default()
        };
        std::fs::create_dir_all(&config.proc_root).expect("proc");
        adjust(&mut config);
        let config = Arc::new(config);
        let cell = StatusCell::new(identity());
        let (tx, rx) = mpsc::channel(4);
        let bound = bind(&config).expect("bind");
        let server = tokio::spawn({
            let config = Arc::clone(&config);
            let cell = cell.clone();
            let exec = ExecRunner::new(crate::exec::ExecSettings::from_config(&config));
            async move { accept_loop(&bound.listener, config, cell, tx, exec).await }
        });
        Guest {
            _dir: dir,
            config,
            cell,
            quiesce_rx: Some(rx),
            server,
        }
    }

    fn start() -> Guest {
        start_with(|_| {})
    }

    async fn connect(guest: &Guest) -> UnixStream {
        UnixStream::connect(guest.config.socket_path())
            .await
            .expect("connect")
    }

    async fn send(stream: &mut UnixStream, request: &Request) {
        let bytes = frame::encode(request, &[]).expect("encode");
        stream.write_all(&bytes).await.expect("send");
    }

    /// Reads one response; `None` on a clean close.
    async fn recv(stream: &mut UnixStream) -> Option<Frame<Response>> {
        let read = async {
            let mut head = [0u8; HEADER_LEN];
            match stream.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read: {e}"),
            }
            let header = FrameHeader::parse(head).expect("server header");
            let mut rest = vec![0u8; (header.message_len + header.payload_len) as usize];
            stream.read_exact(&mut rest).await.expect("frame body");
            let mut whole = head.to_vec();
            whole.extend_from_slice(&rest);
            let (frame, _) = frame::decode::<Response>(&whole)
                .expect("decode")
                .expect("whole frame");
            Some(frame)
        };
        timeout(GUARD, read).await.expect("server answered")
    }

    async fn ask(stream: &mut UnixStream, request: &Request) -> Response {
        send(stream, request).await;
        recv(stream).await.expect("an answer").message
    }

    fn error_code(response: &Response) -> &str {
        match response {
            Response::Error { code, .. } => code,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    async fn assert_closed(stream: &mut UnixStream) {
        assert!(recv(stream).await.is_none(), "connection must be closed");
    }

    #[tokio::test]
    async fn hello_and_status() {
        let guest = start();
        let mut c = connect(&guest).await;
        match ask(&mut c, &Request::Hello).await {
            Response::Hello(h) => {
                assert_eq!(h.protocol_version, PROTOCOL_VERSION);
                assert_eq!(h.supervisor_version, env!("CARGO_PKG_VERSION"));
                assert_eq!(h.identity, identity());
            }
            other => panic!("{other:?}"),
        }
        // Several requests on one connection, in order.
        match ask(&mut c, &Request::Status).await {
            Response::Status(s) => {
                assert_eq!(s.phase, Phase::Preparing);
                assert!(!s.ready);
                assert_eq!(s.identity, identity());
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn socket_and_run_dir_are_private() {
        let guest = start();
        let dir = std::fs::metadata(&guest.config.run_dir).expect("run dir");
        assert_eq!(dir.permissions().mode() & 0o777, RUN_DIR_MODE);
        let sock = std::fs::symlink_metadata(guest.config.socket_path()).expect("socket");
        assert!(sock.file_type().is_socket());
        assert_eq!(sock.permissions().mode() & 0o777, SOCKET_MODE);
        if nix::unistd::geteuid().is_root() {
            assert_eq!((dir.uid(), dir.gid()), (0, 0));
        }
    }

    #[tokio::test]
    async fn whatever_sits_at_the_socket_path_is_replaced_without_being_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config {
            run_dir: dir.path().join("run"),
            ..Config::default()
        };
        std::fs::create_dir_all(&config.run_dir).expect("mkdir");
        // A socket left by a killed supervisor.
        drop(std::os::unix::net::UnixListener::bind(config.socket_path()).expect("stale"));
        let bound = bind(&config).expect("stale socket replaced");
        drop(bound);
        assert!(
            std::fs::symlink_metadata(config.socket_path()).is_err(),
            "dropping the server removes its socket"
        );

        // A symlink (to a file, to a directory, to another live socket), a
        // regular file, a directory with contents: each is removed, never
        // followed, and a fresh socket is served in its place.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").expect("victim");
        let victim_dir = dir.path().join("victim-dir");
        std::fs::create_dir(&victim_dir).expect("victim dir");
        std::fs::write(victim_dir.join("inside"), "keep").expect("inside");
        let other = dir.path().join("other.sock");
        let _other = std::os::unix::net::UnixListener::bind(&other).expect("other");
        type Plant<'a> = Box<dyn Fn(&Path) + 'a>;
        let plant: Vec<(&str, Plant)> = vec![
            (
                "link to a file",
                Box::new(|p| symlink(&victim, p).expect("link")),
            ),
            (
                "link to a dir",
                Box::new(|p| symlink(&victim_dir, p).expect("link")),
            ),
            (
                "link to a socket",
                Box::new(|p| symlink(&other, p).expect("link")),
            ),
            (
                "regular file",
                Box::new(|p| std::fs::write(p, "a file").expect("file")),
            ),
            (
                "directory",
                Box::new(|p| {
                    std::fs::create_dir(p).expect("dir");
                    std::fs::write(p.join("x"), "x").expect("inside");
                }),
            ),
        ];
        for (what, plant) in plant {
            plant(&config.socket_path());
            let bound = bind(&config).unwrap_or_else(|e| panic!("{what}: {e}"));
            let meta = std::fs::symlink_metadata(config.socket_path()).expect("socket");
            assert!(meta.file_type().is_socket(), "{what}: a fresh socket");
            assert_eq!(meta.permissions().mode() & 0o777, SOCKET_MODE, "{what}");
            let client = std::os::unix::net::UnixStream::connect(config.socket_path())
                .unwrap_or_else(|e| panic!("{what}: connect: {e}"));
            drop(client);
            assert!(
                bound.listener.accept().await.is_ok(),
                "{what}: served by the fresh socket"
            );
            drop(bound);
            assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep");
            assert_eq!(
                std::fs::read_to_string(victim_dir.join("inside")).expect("inside"),
                "keep"
            );
            assert!(std::fs::symlink_metadata(&other)
                .expect("other socket")
                .file_type()
                .is_socket());
        }
    }

    #[test]
    fn run_dir_is_root_only_and_a_planted_link_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = crate::config::test_support::test_config(dir.path());
        std::fs::create_dir_all(&config.run_dir).expect("mkdir");
        std::fs::set_permissions(&config.run_dir, std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        secure_run_dir(&config).expect("secure");
        let meta = std::fs::metadata(&config.run_dir).expect("stat");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o700);

        std::fs::remove_dir(&config.run_dir).expect("rmdir");
        symlink(dir.path(), &config.run_dir).expect("link");
        assert!(matches!(
            secure_run_dir(&config),
            Err(SocketError::NotADirectory { .. })
        ));
        assert!(matches!(
            bind(&config),
            Err(SocketError::NotADirectory { .. })
        ));
    }

    #[tokio::test]
    async fn watch_pushes_every_change_without_polling() {
        let guest = start();
        let mut w = connect(&guest).await;
        send(&mut w, &Request::Watch).await;
        let first = recv(&mut w).await.expect("current status");
        assert!(matches!(&first.message, Response::Status(s) if s.phase == Phase::Preparing));

        // Nothing is sent until something changes...
        let quiet = timeout(Duration::from_millis(100), w.read_u8()).await;
        assert!(quiet.is_err(), "watch sent without a change");

        // ...and each change arrives by itself.
        guest.cell.set_prepared();
        let pushed = recv(&mut w).await.expect("pushed");
        assert!(matches!(&pushed.message, Response::Status(s) if s.phase == Phase::Starting));
        let service = ServiceState {
            name: "xvfb".into(),
            state: ServiceRunState::Running,
            pid: Some(7),
            restarts: 0,
            last_exit: None,
            ready_since: None,
        };
        guest.cell.set_services(vec![service], None);
        guest.cell.set_health(
            guest.cell.services_epoch(),
            dormouse_protocol::HealthReport::from_checks(
                vec![dormouse_protocol::Check::new(
                    "x",
                    dormouse_protocol::CheckStatus::Ok,
                    "",
                )],
                chrono::Utc::now(),
            ),
        );
        // The watcher may see the intermediate state or only the latest; it
        // always ends on ready.
        loop {
            let next = recv(&mut w).await.expect("pushed");
            match next.message {
                Response::Status(s) if s.ready => {
                    assert_eq!(s.phase, Phase::Ready);
                    break;
                }
                Response::Status(_) => continue,
                other => panic!("{other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn bad_frames_close_only_their_connection() {
        let guest = start();
        let mut bystander = connect(&guest).await;
        assert!(matches!(
            ask(&mut bystander, &Request::Hello).await,
            Response::Hello(_)
        ));

        let raw = |json: &str| frame_unchecked(json.as_bytes(), &[]);
        let oversized = FrameHeader {
            message_len: MAX_HEADER_LEN + 1,
            payload_len: 0,
        }
        .to_bytes()
        .to_vec();
        // A whole frame over the limit, of a kind that is never large.
        let over_request_limit = {
            let pad = "x".repeat(usize::try_from(MAX_REQUEST_LEN).expect("small"));
            raw(&format!(r#"{{"v":1,"kind":"status","pad":"{pad}"}}"#))
        };
        // Announces a 1 MiB payload it never sends: refused on the header.
        let with_payload = {
            let json = br#"{"v":1,"kind":"hello"}"#;
            let mut b = FrameHeader {
                message_len: u32::try_from(json.len()).expect("small"),
                payload_len: 1 << 20,
            }
            .to_bytes()
            .to_vec();
            b.extend_from_slice(json);
            b
        };
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "http garbage",
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
                "message_too_large",
            ),
            ("json garbage", raw("this is not json"), "bad_frame"),
            ("empty message", vec![0; 8], "bad_frame"),
            ("oversized header", oversized, "message_too_large"),
            (
                "over the request limit",
                over_request_limit,
                "message_too_large",
            ),
            ("payload on a request", with_payload, "payload_too_large"),
            (
                "unknown kind",
                raw(r#"{"v":1,"kind":"format_disk"}"#),
                "unknown_kind",
            ),
            (
                "newer version",
                raw(r#"{"v":99,"kind":"hello"}"#),
                "unsupported_version",
            ),
        ];
        for (what, bytes, code) in cases {
            let mut c = connect(&guest).await;
            c.write_all(&bytes).await.expect(what);
            let answer = recv(&mut c)
                .await
                .unwrap_or_else(|| panic!("{what}: no answer"));
            assert_eq!(error_code(&answer.message), code, "{what}");
            assert_closed(&mut c).await;
            assert!(
                matches!(
                    ask(&mut bystander, &Request::Status).await,
                    Response::Status(_)
                ),
                "{what}: bystander still served"
            );
        }

        // Truncated: the header promises more than ever arrives.
        let mut c = connect(&guest).await;
        let full = raw(r#"{"v":1,"kind":"status"}"#);
        c.write_all(&full[..12]).await.expect("partial");
        c.shutdown().await.expect("half-close");
        let answer = recv(&mut c).await.expect("an answer");
        assert_eq!(error_code(&answer.message), "truncated");
        assert_closed(&mut c).await;
        assert!(matches!(
            ask(&mut bystander, &Request::Hello).await,
            Response::Hello(_)
        ));
    }

    #[tokio::test]
    async fn fifty_concurrent_clients_are_served() {
        let guest = start();
        let path = guest.config.socket_path();
        let mut clients = JoinSet::new();
        for i in 0..50 {
            let path = path.clone();
            clients.spawn(async move {
                let mut c = UnixStream::connect(&path).await.expect("connect");
                for _ in 0..3 {
                    let request = if i % 2 == 0 {
                        Request::Hello
                    } else {
                        Request::Status
                    };
                    let response = ask(&mut c, &request).await;
                    assert!(matches!(response, Response::Hello(_) | Response::Status(_)));
                }
            });
        }
        let mut served = 0;
        while let Some(done) = clients.join_next().await {
            done.expect("client task");
            served += 1;
        }
        assert_eq!(served, 50);
    }

    #[tokio::test]
    async fn clients_over_the_limit_are_refused_with_a_reason() {
        let guest = start_with(|c| c.socket_max_connections = 2);
        let mut a = connect(&guest).await;
        let mut b = connect(&guest).await;
        // Make sure both are accepted and hold their slots.
        assert!(matches!(
            ask(&mut a, &Request::Hello).await,
            Response::Hello(_)
        ));
        assert!(matches!(
            ask(&mut b, &Request::Hello).await,
            Response::Hello(_)
        ));
        let mut c = connect(&guest).await;
        let refused = recv(&mut c).await.expect("a reason");
        assert_eq!(error_code(&refused.message), "busy");
        assert_closed(&mut c).await;
        // A slot frees when a client leaves (once the server has seen it go).
        drop(a);
        let deadline = Instant::now() + GUARD;
        let mut d = None;
        while d.is_none() && Instant::now() < deadline {
            let mut try_d = connect(&guest).await;
            // A refused client may find the connection closed already.
            let hello = frame::encode(&Request::Hello, &[]).expect("encode");
            let _ = try_d.write_all(&hello).await;
            if let Some(Frame {
                message: Response::Hello(_),
                ..
            }) = recv(&mut try_d).await
            {
                d = Some(try_d);
            }
        }
        assert!(d.is_some(), "a freed slot is reused");
        assert!(matches!(
            ask(&mut b, &Request::Status).await,
            Response::Status(_)
        ));
    }

    #[tokio::test]
    async fn a_silent_or_trickling_client_blocks_nobody() {
        let guest = start();
        // Silent: connected, sends nothing.
        let _silent = connect(&guest).await;
        // Trickling: half a header, then nothing.
        let mut trickle = connect(&guest).await;
        trickle.write_all(&[0, 0, 0]).await.expect("partial header");
        // A watcher that never reads while the status changes many times.
        let mut deaf = connect(&guest).await;
        send(&mut deaf, &Request::Watch).await;
        for _ in 0..200 {
            guest.cell.set_prepared();
            guest.cell.set_stopping();
        }
        let mut c = connect(&guest).await;
        for _ in 0..10 {
            assert!(matches!(
                ask(&mut c, &Request::Hello).await,
                Response::Hello(_)
            ));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_and_trickling_clients_are_dropped_at_their_deadlines() {
        let guest = start();
        let mut silent = connect(&guest).await;
        let mut trickle = connect(&guest).await;
        trickle.write_all(&[0, 0, 0]).await.expect("partial header");
        // Time passes only on the paused clock: the idle bound closes the
        // silent one without a word, the frame bound answers the trickler.
        assert_closed(&mut silent).await;
        let answer = recv(&mut trickle).await.expect("timeout reason");
        assert_eq!(error_code(&answer.message), "timeout");
        assert_closed(&mut trickle).await;
    }

    #[tokio::test]
    async fn quiesce_is_handed_to_the_service_runner() {
        let mut guest = start();
        let mut rx = guest.quiesce_rx.take().expect("receiver");
        let runner = tokio::spawn(async move {
            let Some(QuiesceRequest::Close {
                timeout,
                hold: false,
                reply,
            }) = rx.recv().await
            else {
                panic!("a quiesce");
            };
            assert_eq!(timeout, Duration::from_millis(3000));
            let _ = reply.send(Quiesced {
                closed: vec!["browser".into()],
                complete: true,
                elapsed_ms: 12,
            });
            rx
        });
        let mut c = connect(&guest).await;
        match ask(&mut c, &Request::Quiesce { timeout_ms: 3000 }).await {
            Response::Quiesced(q) => {
                assert!(q.complete);
                assert_eq!(q.closed, vec!["browser".to_owned()]);
            }
            other => panic!("{other:?}"),
        }
        let _rx = runner.await.expect("runner");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiesce_past_its_bound_is_incomplete() {
        let mut guest = start_with(|c| c.quiesce_max_ms = 2000);
        let mut rx = guest.quiesce_rx.take().expect("receiver");
        // A runner that takes the request and never answers in time.
        let runner = tokio::spawn(async move {
            let request = rx.recv().await.expect("a quiesce");
            // Asked for an hour, clamped to quiesce_max_ms.
            let QuiesceRequest::Close { timeout, .. } = &request else {
                panic!("{request:?}");
            };
            assert_eq!(*timeout, Duration::from_millis(2000));
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(request);
        });
        let mut c = connect(&guest).await;
        match ask(
            &mut c,
            &Request::Quiesce {
                timeout_ms: 3_600_000,
            },
        )
        .await
        {
            Response::Quiesced(q) => assert!(!q.complete),
            other => panic!("{other:?}"),
        }
        runner.abort();
    }

    #[tokio::test]
    async fn a_held_quiesce_is_released_once_its_connection_ends() {
        let mut guest = start();
        let mut rx = guest.quiesce_rx.take().expect("receiver");
        let mut c = connect(&guest).await;
        send(&mut c, &Request::QuiesceHold { timeout_ms: 3000 }).await;
        let Some(QuiesceRequest::Close {
            hold: true, reply, ..
        }) = timeout(GUARD, rx.recv()).await.expect("in time")
        else {
            panic!("a held quiesce");
        };
        let _ = reply.send(Quiesced {
            closed: vec!["browser".into()],
            complete: true,
            elapsed_ms: 3,
        });
        match recv(&mut c).await.expect("an answer").message {
            Response::Quiesced(q) => assert_eq!(q.closed, vec!["browser".to_owned()]),
            other => panic!("{other:?}"),
        }
        // Held while the connection stays open: nothing is released.
        assert!(
            timeout(Duration::from_millis(300), rx.recv())
                .await
                .is_err(),
            "released while the hold was still open"
        );
        drop(c);
        match timeout(GUARD, rx.recv()).await.expect("in time") {
            Some(QuiesceRequest::Release) => {}
            other => panic!("expected the release, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn quiesce_without_a_runner_says_so() {
        let mut guest = start();
        drop(guest.quiesce_rx.take());
        let mut c = connect(&guest).await;
        let answer = ask(&mut c, &Request::Quiesce { timeout_ms: 100 }).await;
        assert_eq!(error_code(&answer), "quiesce_unavailable");
    }

    #[tokio::test]
    async fn screenshot_and_activity_without_a_display_answer_anyway() {
        let guest = start();
        let mut c = connect(&guest).await;
        let shot = ask(&mut c, &Request::Screenshot).await;
        assert_eq!(error_code(&shot), "screenshot_failed");
        match ask(&mut c, &Request::Activity).await {
            Response::Activity(a) => {
                assert_eq!(a.input_idle_ms, None);
                assert!(!a.busy);
            }
            other => panic!("{other:?}"),
        }
    }
}
