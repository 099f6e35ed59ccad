//! Messages on the guest socket (`/run/dormouse/supervisor.sock`).
//!
//! The broker (or any host tool) connects, sends one [`Request`] per frame and
//! reads one [`Response`] per request, in order. `watch` turns the connection
//! into a stream: the supervisor then pushes a [`Response::Status`] on every
//! change until the client hangs up.
//!
//! This file is the one declaration of the protocol: the message contents
//! below and the [`guest_protocol!`](crate::guest_protocol) table at its end,
//! which yields [`Request`], [`Response`], their kinds, one typed [`call`]
//! per request with its connection mode, and the service the supervisor
//! implements ([`GuestService`], dispatched by [`serve`]). It holds no I/O
//! and no policy.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::health::HealthReport;
use crate::image::{ImageEncoding, ImageFormat};

/// What identifies one start of one container.
///
/// It changes on every `docker start` (also after a kill, also when a new
/// container reuses the same home, and under `--pid=host`) and stays the same
/// while one container runs, however often the supervisor re-prepares.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ContainerStartIdentity {
    /// `/proc/sys/kernel/random/boot_id`: changes on host reboot.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/pid`: a new one for every container start.
    pub pid_ns_inode: u64,
    /// Field 22 of `/proc/1/stat` (clock ticks after boot): PID 1's start time.
    pub pid1_start_time: u64,
}

impl ContainerStartIdentity {
    /// A compact, stable string form, e.g. for files and logs.
    pub fn fingerprint(&self) -> String {
        format!(
            "{}:{}:{}",
            self.boot_id, self.pid_ns_inode, self.pid1_start_time
        )
    }
}

/// The answer to `hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`crate::PROTOCOL_VERSION`] of the supervisor.
    pub protocol_version: u32,
    /// The supervisor's crate version.
    pub supervisor_version: String,
    /// This container start.
    pub identity: ContainerStartIdentity,
}

/// Where the desktop is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Identity, home, profile links and stale locks are being prepared.
    Preparing,
    /// Services are starting or the self-probe has not passed yet.
    Starting,
    /// The self-probe passed after this container start.
    Ready,
    /// Usable only in part, or a service is crash-looping; `problem` says why.
    Degraded,
    /// A graceful stop is under way.
    Stopping,
}

/// Run state of one supervised service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceRunState {
    /// Not started yet (waiting for the services before it).
    Pending,
    /// Spawned, not yet ready.
    Starting,
    /// Ready by its readiness event.
    Running,
    /// Exited; waiting out the restart backoff.
    Backoff,
    /// Gave up after repeated failures.
    Failed,
    /// Stopped on purpose.
    Stopped,
}

/// One supervised service, e.g. `xvfb`, `openbox`, `vnc`, `browser`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceState {
    /// Service name.
    pub name: String,
    /// Run state.
    pub state: ServiceRunState,
    /// Process id inside the guest while it runs.
    pub pid: Option<u32>,
    /// How often it was restarted after this container start.
    pub restarts: u32,
    /// How it last ended, e.g. `exit 1`, `signal 9`, with the classified cause.
    pub last_exit: Option<String>,
    /// Since when it has been ready.
    pub ready_since: Option<DateTime<Utc>>,
}

/// The answer to `status`, and every item of a `watch` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStatus {
    /// Where the desktop is in its life.
    pub phase: Phase,
    /// `true` only once the self-probe passed after this container start.
    pub ready: bool,
    /// When it became ready.
    pub ready_since: Option<DateTime<Utc>>,
    /// This container start.
    pub identity: ContainerStartIdentity,
    /// Supervised services, in start order.
    pub services: Vec<ServiceState>,
    /// The latest self-probe report, if one ran.
    pub health: Option<HealthReport>,
    /// Why the desktop is degraded or not ready, for people.
    pub problem: Option<String>,
    /// Height in desktop pixels of the band the taskbar keeps for itself at
    /// the bottom of the screen (the window manager's work area ends above
    /// it), while the taskbar runs; `None` without one (and from older
    /// supervisors).
    #[serde(default)]
    pub taskbar_height: Option<u32>,
    /// When each step of this container start finished, in milliseconds
    /// after the supervisor started; empty from older supervisors.
    /// (Boxed: it is read rarely, and every answer on the socket carries
    /// the size of the largest.)
    #[serde(default)]
    pub start_phases: Box<StartPhases>,
}

/// When each step of one container start finished, in milliseconds after
/// the supervisor started (its monotonic clock), the first time it did;
/// `None` until then. A restarted service keeps its first figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartPhases {
    /// Preparation (identity, home, profile links, stale locks) done.
    #[serde(default)]
    pub prepared_ms: Option<u64>,
    /// The X server answered.
    #[serde(default)]
    pub x_ms: Option<u64>,
    /// The window manager announced itself.
    #[serde(default)]
    pub window_manager_ms: Option<u64>,
    /// The VNC server answered with its banner.
    #[serde(default)]
    pub vnc_ms: Option<u64>,
    /// The egress proxy listened on guest loopback.
    #[serde(default)]
    pub proxy_ms: Option<u64>,
    /// The self-probe passed, with its full-screen screenshot: ready.
    #[serde(default)]
    pub ready_ms: Option<u64>,
    /// The taskbar's band was kept free by the window manager (it may
    /// come after ready; screenshots wait for it).
    #[serde(default)]
    pub taskbar_ms: Option<u64>,
}

/// One uid-1000 process using CPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BusyProcess {
    /// Process id inside the guest.
    pub pid: u32,
    /// Command name (`/proc/<pid>/comm`).
    pub comm: String,
    /// CPU use over the sampling interval, percent of one core.
    pub cpu_percent: f64,
}

/// The answer to `activity`: what the broker's idle timer counts as use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Activity {
    /// Milliseconds since the last input: an X keyboard or pointer event
    /// (when X answers) or a keystroke into a terminal session, whichever
    /// came last; `None` when neither is known.
    pub input_idle_ms: Option<u64>,
    /// Whether any uid-1000 process is above the CPU threshold.
    pub busy: bool,
    /// The processes that made it busy.
    pub busy_processes: Vec<BusyProcess>,
}

/// The answer to `quiesce`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quiesced {
    /// Services that were closed cleanly (browsers first).
    pub closed: Vec<String>,
    /// `false` when the deadline passed before everything closed.
    pub complete: bool,
    /// How long it took.
    pub elapsed_ms: u64,
}

/// Most bytes of clipboard text a `clipboard_get` answer carries; longer
/// text is cut (at a character boundary) and marked `truncated`.
pub const MAX_CLIPBOARD_BYTES: usize = 1024 * 1024;

crate::guest_protocol! {
    requests {
        /// Versions and container-start identity.
        "hello" => Hello -> Hello, answer hello;
        /// Phase, services, health report.
        "status" => Status -> GuestStatus, answer status;
        /// Push the status now and on every change until the client hangs up.
        "watch" => Watch -> GuestStatus, stream watch;
        /// An image of the whole screen, as the frame's binary payload: a
        /// PNG unless `encoding` names another format ([`crate::image`]).
        "screenshot" => Screenshot {
            /// The format and quality; PNG when absent.
            #[serde(default, skip_serializing_if = "ImageEncoding::is_default")]
            encoding: ImageEncoding,
        } -> ScreenshotInfo, answer screenshot;
        /// Close browsers cleanly so their profiles flush; answer when done.
        "quiesce" => Quiesce {
            /// Upper bound the supervisor keeps to.
            timeout_ms: u64,
        } -> Quiesced, answer quiesce;
        /// `quiesce`, held: the browsers close the same way and the answer
        /// is the same, then they stay closed while this connection stays
        /// open. When it ends (or any byte arrives) the supervisor starts
        /// again the browsers this quiesce closed, once no other hold is
        /// open (an export of a running desktop holds one while it reads).
        "quiesce_hold" => QuiesceHold {
            /// Upper bound the supervisor keeps to for the closing.
            timeout_ms: u64,
        } -> Quiesced, held quiesce_hold;
        /// Input idle time and busy processes.
        "activity" => Activity -> Activity, answer activity;
        /// Run one command as the desktop user ([`crate::exec`]); its stdin
        /// is the frame's payload. While it runs, the connection's end (or
        /// any byte) cancels it.
        "exec" => Exec(crate::exec::ExecRequest) -> crate::exec::ExecResultHead, held exec, payload;
        /// Start a process on a pseudo-terminal; after `pty_opened` the
        /// connection carries `PtyInput` and `PtyEvent` frames until
        /// `pty_exit`.
        "pty_open" => PtyOpen(crate::exec::PtyOpen) -> PtyOpened, session pty_open;
        /// Run a batch of computer-use actions in order, stopping at the
        /// first failure ([`crate::actions`]).
        "actions" => Actions {
            /// The batch, validated again by the supervisor.
            batch: crate::actions::ActionBatch,
        } -> crate::actions::GuestActionResults, answer actions;
        /// The X `CLIPBOARD` selection's text, as UTF-8, at most
        /// [`MAX_CLIPBOARD_BYTES`].
        "clipboard_get" => ClipboardGet -> ClipboardText, answer clipboard_get;
        /// Park this connection for the desktop's egress proxy
        /// ([`crate::egress`]): when a guest program's request through the
        /// proxy has been read and validated, the oldest parked connection
        /// gets its `egress_open`; the broker answers one
        /// [`crate::egress::EgressVerdict`] frame, and after
        /// `egress_connected` the connection is a raw byte pipe both ways.
        "egress_accept" => EgressAccept -> crate::egress::EgressOpen, session egress_accept;
    }
    responses {
        /// Answer to [`Request::Hello`].
        "hello" => Hello(Hello);
        /// Answer to [`Request::Status`] and each item of [`Request::Watch`].
        "status" => Status(GuestStatus);
        /// Answer to [`Request::Screenshot`]; the image is the frame's
        /// payload.
        "screenshot" => Screenshot {
            /// Width in pixels.
            width: u32,
            /// Height in pixels.
            height: u32,
            /// The payload's format (PNG when absent).
            #[serde(default)]
            format: ImageFormat,
        } as ScreenshotInfo, payload checked;
        /// Answer to [`Request::Quiesce`].
        "quiesced" => Quiesced(Quiesced);
        /// Answer to [`Request::Activity`].
        "activity" => Activity(Activity);
        /// Answer to [`Request::Exec`]; stdout then stderr are the payload.
        "exec_result" => ExecResult(crate::exec::ExecResultHead), payload;
        /// Answer to [`Request::PtyOpen`]: the session runs.
        "pty_opened" => PtyOpened {
            /// The session's id (its `DORMOUSE_EXEC`).
            id: u64,
            /// Pid of its process in the guest.
            pid: u32,
        } as PtyOpened;
        /// Answer to [`Request::Actions`]: the results, their images one
        /// after the other as the frame's payload.
        "action_results" => ActionResults(crate::actions::GuestActionResults), payload;
        /// Answer to [`Request::ClipboardGet`]: the text is the frame's
        /// payload (UTF-8; empty without `has_text`).
        "clipboard" => Clipboard {
            /// Whether the selection had text: an owner that converted it
            /// to UTF-8 (`false` when nobody owns it or it has no text form).
            has_text: bool,
            /// Whether the text was longer than [`MAX_CLIPBOARD_BYTES`].
            truncated: bool,
        } as ClipboardText, payload checked;
        /// Answer to [`Request::EgressAccept`]: what a guest program asked
        /// for; the payload is written upstream first.
        "egress_open" => EgressOpen(crate::egress::EgressOpen), payload;
    }
}

impl ScreenshotInfo {
    /// The payload is an image of the declared format (by its signature).
    fn check_payload(&self, payload: &[u8]) -> Result<(), &'static str> {
        if self.format.is_signature_of(payload) {
            Ok(())
        } else {
            Err(match self.format {
                ImageFormat::Png => "screenshot payload is not a PNG",
                ImageFormat::Jpeg => "screenshot payload is not a JPEG",
                ImageFormat::Webp => "screenshot payload is not a WebP",
            })
        }
    }
}

impl ClipboardText {
    /// The text `payload` carries: `None` without `has_text`; refused when
    /// it is longer than [`MAX_CLIPBOARD_BYTES`] or not UTF-8. The text is
    /// the guest's and hostile: escape it before it reaches a log or a
    /// terminal.
    ///
    /// # Errors
    /// Why the payload is not the text this answer says it is.
    pub fn text<'a>(&self, payload: &'a [u8]) -> Result<Option<&'a str>, &'static str> {
        if !self.has_text {
            return Ok(None);
        }
        if payload.len() > MAX_CLIPBOARD_BYTES {
            return Err("clipboard text over its bound");
        }
        std::str::from_utf8(payload)
            .map(Some)
            .map_err(|_| "clipboard text is not UTF-8")
    }

    fn check_payload(&self, payload: &[u8]) -> Result<(), &'static str> {
        self.text(payload).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{After, Answer, Call, Mode, Refusal, Reply, Served};

    #[test]
    fn kinds_follow_the_declaration_in_order() {
        assert_eq!(
            Request::KINDS,
            &[
                "hello",
                "status",
                "watch",
                "screenshot",
                "quiesce",
                "quiesce_hold",
                "activity",
                "exec",
                "pty_open",
                "actions",
                "clipboard_get",
                "egress_accept"
            ]
        );
        assert_eq!(
            Response::KINDS,
            &[
                "hello",
                "status",
                "screenshot",
                "quiesced",
                "activity",
                "exec_result",
                "pty_opened",
                "action_results",
                "clipboard",
                "egress_open",
                "error"
            ]
        );
        assert_eq!(Request::Quiesce { timeout_ms: 1 }.kind(), "quiesce");
        assert_eq!(Response::error("a", "b").kind(), "error");
        assert!(Response::Screenshot {
            width: 1,
            height: 1,
            format: ImageFormat::Png,
        }
        .payload_allowed());
        assert!(!Response::error("a", "b").payload_allowed());
        assert!(!Request::Hello.payload_allowed());
    }

    #[test]
    fn each_call_names_its_request_and_its_answer() {
        assert_eq!(Request::from(call::Hello), Request::Hello);
        assert_eq!(
            Request::from(call::Quiesce { timeout_ms: 5 }),
            Request::Quiesce { timeout_ms: 5 }
        );
        assert_eq!(<call::Quiesce as Call>::KIND, "quiesce");
        assert_eq!(
            <<call::QuiesceHold as Call>::Answer as Answer>::KIND,
            "quiesced"
        );
        assert_eq!(
            <<call::Quiesce as Call>::Answer as Answer>::KIND,
            "quiesced"
        );
        assert_eq!(<<call::Watch as Call>::Answer as Answer>::KIND, "status");
        assert_eq!(<call::Hello as Call>::MODE, Mode::Answer);
        assert_eq!(<call::Watch as Call>::MODE, Mode::Stream);
        assert_eq!(<call::QuiesceHold as Call>::MODE, Mode::Held);
        assert_eq!(<call::PtyOpen as Call>::MODE, Mode::Session);
        assert_eq!(<call::EgressAccept as Call>::MODE, Mode::Session);
        assert_eq!(
            <<call::EgressAccept as Call>::Answer as Answer>::KIND,
            "egress_open"
        );
        assert_eq!(Request::Quiesce { timeout_ms: 1 }.mode(), Mode::Answer);
        assert_eq!(
            <<call::Screenshot as Call>::Answer as Answer>::KIND,
            "screenshot"
        );
        let shot = ScreenshotInfo {
            width: 4,
            height: 3,
            format: ImageFormat::Jpeg,
        };
        let response = shot.clone().into_response();
        assert_eq!(
            response,
            Response::Screenshot {
                width: 4,
                height: 3,
                format: ImageFormat::Jpeg,
            }
        );
        assert_eq!(ScreenshotInfo::from_response(response), Ok(shot));
        // A wrong-kind answer is handed back, not misread.
        let other = Response::error("x", "y");
        assert_eq!(Quiesced::from_response(other.clone()), Err(other));
    }

    #[test]
    fn a_checked_answer_refuses_a_payload_that_breaks_it() {
        let png = b"\x89PNG\r\n\x1a\nrest".as_slice();
        let jpeg = b"\xff\xd8\xff\xdbrest".as_slice();
        let webp = b"RIFF\x04\0\0\0WEBPVP8L".as_slice();
        for (format, good) in [
            (ImageFormat::Png, png),
            (ImageFormat::Jpeg, jpeg),
            (ImageFormat::Webp, webp),
        ] {
            let shot = ScreenshotInfo {
                width: 1,
                height: 1,
                format,
            };
            assert_eq!(shot.check(good), Ok(()), "{format}");
            assert!(shot.check(b"GIF89a").is_err(), "{format}");
            // Another format's bytes do not pass for the declared one.
            for other in [png, jpeg, webp].into_iter().filter(|b| *b != good) {
                assert!(shot.check(other).is_err(), "{format}");
            }
        }
        // An answer from a supervisor that names no format is a PNG.
        let old: Response =
            serde_json::from_str(r#"{"kind":"screenshot","width":2,"height":2}"#).unwrap();
        let old = ScreenshotInfo::from_response(old).unwrap();
        assert_eq!(old.format, ImageFormat::Png);
        assert!(old.check(png).is_ok() && old.check(jpeg).is_err());
        let text = ClipboardText {
            has_text: true,
            truncated: false,
        };
        assert_eq!(text.text("copié".as_bytes()), Ok(Some("copié")));
        assert!(text.check(b"\xff\xfe").is_err());
        assert!(text.check(&vec![b'a'; MAX_CLIPBOARD_BYTES + 1]).is_err());
        let none = ClipboardText {
            has_text: false,
            truncated: false,
        };
        assert_eq!(none.text(b"ignored"), Ok(None));
        // An answer declared without `checked` takes any payload.
        let quiet = Quiesced {
            closed: vec![],
            complete: true,
            elapsed_ms: 0,
        };
        assert_eq!(quiet.check(b"anything"), Ok(()));
    }

    /// A service that answers from fixed values and records what the
    /// connection-mode requests were handed.
    struct Fixed;

    impl GuestService for Fixed {
        type Conn = Vec<String>;
        async fn hello(&self, _: call::Hello) -> Result<Reply<Hello>, Refusal> {
            Err(Refusal::new("nope", "refused"))
        }
        async fn status(&self, _: call::Status) -> Result<Reply<GuestStatus>, Refusal> {
            Err(Refusal::new("nope", "no status"))
        }
        async fn watch(&self, _: call::Watch, _: Vec<u8>, conn: &mut Vec<String>) -> After {
            conn.push("watch".into());
            After::Close
        }
        async fn screenshot(&self, s: call::Screenshot) -> Result<Reply<ScreenshotInfo>, Refusal> {
            let info = ScreenshotInfo {
                width: 2,
                height: 1,
                format: s.encoding.format,
            };
            Ok(Reply::with_payload(info, b"png".to_vec()))
        }
        async fn quiesce(&self, q: call::Quiesce) -> Result<Reply<Quiesced>, Refusal> {
            Ok(Quiesced {
                closed: vec![q.timeout_ms.to_string()],
                complete: true,
                elapsed_ms: 0,
            }
            .into())
        }
        async fn quiesce_hold(
            &self,
            q: call::QuiesceHold,
            _: Vec<u8>,
            conn: &mut Vec<String>,
        ) -> After {
            conn.push(format!("hold {}", q.timeout_ms));
            After::Close
        }
        async fn activity(&self, _: call::Activity) -> Result<Reply<Activity>, Refusal> {
            Err(Refusal::new("nope", "no activity"))
        }
        async fn exec(&self, e: call::Exec, payload: Vec<u8>, conn: &mut Vec<String>) -> After {
            conn.push(format!("exec {:?} {}", e.0.argv, payload.len()));
            After::Continue
        }
        async fn pty_open(&self, _: call::PtyOpen, _: Vec<u8>, conn: &mut Vec<String>) -> After {
            conn.push("pty".into());
            After::Close
        }
        async fn actions(
            &self,
            _: call::Actions,
        ) -> Result<Reply<crate::actions::GuestActionResults>, Refusal> {
            Err(Refusal::new("nope", "no actions"))
        }
        async fn clipboard_get(
            &self,
            _: call::ClipboardGet,
        ) -> Result<Reply<ClipboardText>, Refusal> {
            Err(Refusal::new("nope", "no clipboard"))
        }
        async fn egress_accept(
            &self,
            _: call::EgressAccept,
            _: Vec<u8>,
            conn: &mut Vec<String>,
        ) -> After {
            conn.push("egress".into());
            After::Close
        }
    }

    #[tokio::test]
    async fn serve_dispatches_each_request_to_its_method_by_mode() {
        let mut conn = Vec::new();
        let encoding = ImageEncoding {
            format: ImageFormat::Webp,
            quality: Some(30),
        };
        let served = serve(
            &Fixed,
            Request::Screenshot { encoding },
            Vec::new(),
            &mut conn,
        )
        .await;
        assert_eq!(
            served,
            Served::Answer(
                Response::Screenshot {
                    width: 2,
                    height: 1,
                    format: ImageFormat::Webp,
                },
                b"png".to_vec()
            )
        );
        let served = serve(
            &Fixed,
            Request::Quiesce { timeout_ms: 9 },
            Vec::new(),
            &mut conn,
        )
        .await;
        assert!(
            matches!(served, Served::Answer(Response::Quiesced(q), p) if q.closed == ["9"] && p.is_empty())
        );
        // A refusal is the error response.
        let served = serve(&Fixed, Request::Hello, Vec::new(), &mut conn).await;
        assert_eq!(
            served,
            Served::Answer(Response::error("nope", "refused"), Vec::new())
        );
        assert!(
            conn.is_empty(),
            "answer requests never touch the connection"
        );
        // The others are served on the connection, with their payload.
        let exec = crate::exec::ExecRequest::argv(["true"]);
        let served = serve(&Fixed, Request::Exec(exec), b"stdin".to_vec(), &mut conn).await;
        assert_eq!(served, Served::Done(After::Continue));
        let served = serve(
            &Fixed,
            Request::QuiesceHold { timeout_ms: 4 },
            Vec::new(),
            &mut conn,
        )
        .await;
        assert_eq!(served, Served::Done(After::Close));
        let served = serve(&Fixed, Request::Watch, Vec::new(), &mut conn).await;
        assert_eq!(served, Served::Done(After::Close));
        assert_eq!(conn, ["exec Some([\"true\"]) 5", "hold 4", "watch"]);
    }
}
