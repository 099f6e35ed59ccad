//! The supervisor's side of the guest protocol: [`Service`] implements the
//! table's generated [`GuestService`], one method per request, each calling
//! the module that does the work. It owns what a request's connection means
//! while it is served (a `watch` stream, a held quiesce) and the one-batch-
//! at-a-time rule of the display. It never reads a frame itself (that is
//! [`super::listener`]'s) and never stops a service itself (quiesces are
//! handed to the service runner).

use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::frame::FrameError;
use dormouse_protocol::guest::{ClipboardText, MAX_CLIPBOARD_BYTES};
use dormouse_protocol::stream::{self, StreamError};
use dormouse_protocol::{
    call, After, GuestService, GuestStatus, Hello, Quiesced, Refusal, Reply, Response,
    ScreenshotInfo, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout_at, Instant};

use crate::config::Config;
use crate::exec_socket::{ExecService, Reservation};
use crate::status::{QuiesceRequest, StatusCell};

/// Extra time granted to the service runner's quiesce answer beyond the
/// bound it was given, so an answer sent right at the bound is not lost.
const QUIESCE_GRACE: Duration = Duration::from_millis(250);
/// Longest a screenshot or an action batch waits for a service that comes
/// up after ready (the taskbar) to finish coming up, so that the first
/// screenshot after ready shows it: a few hundred milliseconds on a resume,
/// over a second on a container's first start (cold caches). Well inside
/// a batch's own bound (`RUN_BOUND_BASE` is 10 s).
const SETTLE_BOUND: Duration = Duration::from_secs(3);

/// The supervisor's service: what every connection shares.
#[derive(Debug)]
pub struct Service {
    pub(super) config: Arc<Config>,
    pub(super) cell: StatusCell,
    pub(super) quiesce: mpsc::Sender<QuiesceRequest>,
    pub(super) exec: ExecService,
    pub(super) egress: crate::egress::Hub,
}

/// One client connection as the service serves it: its two halves, its
/// I/O bound, and the exec budget held for the frame just read (if it was
/// a large one).
#[derive(Debug)]
pub struct Conn {
    pub(super) rd: OwnedReadHalf,
    pub(super) wr: OwnedWriteHalf,
    pub(super) io: Duration,
    pub(super) reservation: Option<Reservation>,
    /// Its place among the socket's capped connections.
    pub(super) slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Writes one response within the I/O bound (the payload after the
/// message, never copied into one buffer with it: a screenshot is the
/// largest thing the supervisor ever holds).
pub(super) async fn write_response<W: AsyncWrite + Unpin>(
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

/// The supervisor's handler of each request of the table
/// ([`dormouse_protocol::guest`]); a new request is a new method here (the
/// compiler names the missing one), answering with the type the table
/// names.
impl GuestService for Service {
    type Conn = Conn;

    async fn hello(&self, _: call::Hello) -> Result<Reply<Hello>, Refusal> {
        Ok(Hello {
            protocol_version: PROTOCOL_VERSION,
            supervisor_version: env!("CARGO_PKG_VERSION").to_owned(),
            identity: self.cell.identity().clone(),
        }
        .into())
    }

    async fn status(&self, _: call::Status) -> Result<Reply<GuestStatus>, Refusal> {
        Ok(self.cell.snapshot().into())
    }

    async fn watch(&self, _: call::Watch, _: Vec<u8>, conn: &mut Conn) -> After {
        watch(&mut conn.rd, &mut conn.wr, &self.cell, conn.io).await;
        After::Close
    }

    async fn screenshot(&self, s: call::Screenshot) -> Result<Reply<ScreenshotInfo>, Refusal> {
        // The broker checked it too; a peer that did not gets a refusal.
        s.encoding
            .check()
            .map_err(|e| Refusal::new("invalid_encoding", e.to_string()))?;
        self.cell.settled(SETTLE_BOUND).await;
        match crate::screenshot::capture(&self.config, s.encoding).await {
            Ok(shot) => {
                tracing::debug!(
                    width = shot.width,
                    height = shot.height,
                    format = shot.format.as_str(),
                    bytes = shot.image.len(),
                    elapsed_ms = crate::millis(shot.elapsed),
                    "screenshot"
                );
                let info = ScreenshotInfo {
                    width: shot.width,
                    height: shot.height,
                    format: shot.format,
                };
                Ok(Reply::with_payload(info, shot.image))
            }
            Err(e) => Err(Refusal::new("screenshot_failed", e.to_string())),
        }
    }

    async fn quiesce(&self, q: call::Quiesce) -> Result<Reply<Quiesced>, Refusal> {
        quiesce(q.timeout_ms, false, self).await.0.map(Reply::from)
    }

    // The connection is the hold: served here, then closed.
    async fn quiesce_hold(&self, q: call::QuiesceHold, _: Vec<u8>, conn: &mut Conn) -> After {
        quiesce_hold(q.timeout_ms, conn, self).await;
        After::Close
    }

    async fn activity(
        &self,
        _: call::Activity,
    ) -> Result<Reply<dormouse_protocol::Activity>, Refusal> {
        Ok(crate::activity::sample(&self.config).await.into())
    }

    // Served on the connection, which then means "the caller is still
    // there"; no idle bound applies while it runs.
    async fn exec(&self, e: call::Exec, payload: Vec<u8>, conn: &mut Conn) -> After {
        let hold = conn.reservation.take();
        let exec = self
            .exec
            .exec(e.0, payload, hold, &mut conn.rd, &mut conn.wr, conn.io);
        if exec.await {
            After::Continue
        } else {
            After::Close
        }
    }

    async fn pty_open(&self, open: call::PtyOpen, _: Vec<u8>, conn: &mut Conn) -> After {
        drop(conn.reservation.take());
        self.exec
            .pty(open.0, &mut conn.rd, &mut conn.wr, conn.io)
            .await;
        After::Close
    }

    async fn actions(
        &self,
        a: call::Actions,
    ) -> Result<Reply<dormouse_protocol::actions::GuestActionResults>, Refusal> {
        self.cell.settled(SETTLE_BOUND).await;
        actions(a.batch, &self.config).await
    }

    async fn clipboard_get(&self, _: call::ClipboardGet) -> Result<Reply<ClipboardText>, Refusal> {
        let bound = Duration::from_millis(self.config.probe_timeout_ms);
        let read = crate::x_client::with_display(&self.config, bound, |conn, screen| {
            crate::x_client::clipboard_text(conn, screen, MAX_CLIPBOARD_BYTES)
        });
        match read.await {
            Ok(Some((text, truncated))) => {
                let answer = ClipboardText {
                    has_text: true,
                    truncated,
                };
                Ok(Reply::with_payload(answer, text.into_bytes()))
            }
            Ok(None) => Ok(ClipboardText {
                has_text: false,
                truncated: false,
            }
            .into()),
            Err(e) => Err(Refusal::new("clipboard_failed", e.to_string())),
        }
    }

    // The connection is parked for the egress proxy, then relays one
    // client's bytes; it never serves another request.
    async fn egress_accept(&self, _: call::EgressAccept, _: Vec<u8>, conn: &mut Conn) -> After {
        drop(conn.reservation.take());
        let slot = &mut conn.slot;
        let release = || drop(slot.take());
        crate::egress::session::serve(&self.egress, &mut conn.rd, &mut conn.wr, conn.io, release)
            .await;
        After::Close
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
) -> Result<Reply<dormouse_protocol::actions::GuestActionResults>, Refusal> {
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
        Ok(Err(e)) => return Err(Refusal::new(e.code(), e.to_string())),
        Err(_) => {
            let message = format!("the batch did not end within {bound:?}");
            return Err(Refusal::new("timeout", message));
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
    Ok(Reply::with_payload(outcome.answer, payload))
}

/// Hands a quiesce to the service runner and waits for its answer within
/// the bound (clamped to `quiesce_max_ms`). Past the bound the answer is
/// `complete: false`; the broker stops the container either way. The flag
/// says whether the runner took the request (a taken hold must be
/// released).
async fn quiesce(
    timeout_ms: u64,
    hold: bool,
    shared: &Service,
) -> (Result<Quiesced, Refusal>, bool) {
    let bound = Duration::from_millis(timeout_ms.min(shared.config.quiesce_max_ms));
    let started = Instant::now();
    let deadline = started + bound;
    let incomplete = |started: Instant| {
        Ok(Quiesced {
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
            let refused = Refusal::new(
                "quiesce_unavailable",
                "the service runner is not taking quiesce requests",
            );
            return (Err(refused), false);
        }
        Ok(Ok(())) => {}
    }
    match timeout_at(deadline + QUIESCE_GRACE, answer).await {
        Ok(Ok(done)) => (Ok(done), true),
        Ok(Err(_)) | Err(_) => (incomplete(started), true),
    }
}

/// Serves `quiesce_hold`: the quiesce and its answer, then the hold for as
/// long as the connection stays open (end of stream, an error or any byte
/// ends it; no idle bound applies), then the release, so the runner
/// reopens what the hold closed once no other hold is open.
async fn quiesce_hold(timeout_ms: u64, conn: &mut Conn, shared: &Service) {
    let (answer, taken) = quiesce(timeout_ms, true, shared).await;
    let response = match answer {
        Ok(done) => Response::Quiesced(done),
        Err(refusal) => Response::error(refusal.code, refusal.message),
    };
    if write_response(&mut conn.wr, &response, &[], conn.io)
        .await
        .is_ok()
        && taken
    {
        let mut scratch = [0u8; 64];
        let _ = conn.rd.read(&mut scratch).await;
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
async fn watch<R, W>(rd: &mut R, wr: &mut W, cell: &StatusCell, io: Duration)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut rx = cell.subscribe();
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
