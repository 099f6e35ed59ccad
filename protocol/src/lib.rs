//! Wire types spoken between the Dormouse guest supervisor, the host broker and
//! the broker's clients, and the framing used on the guest socket.
//!
//! This crate owns the *shape* of every message and nothing else: no policy.
//! By default it has no I/O runtime, so small clients can use it; the
//! feature `tokio` adds the one async frame reader and writer
//! ([`stream`]) that the supervisor and the broker share.

#![forbid(unsafe_code)]

pub mod actions;
pub mod activity;
pub mod api;
pub mod declare;
pub mod egress;
pub mod egress_policy;
pub mod exec;
pub mod frame;
pub mod guest;
pub mod health;
pub mod image;
pub mod local;
pub mod screen;
#[cfg(any(feature = "tokio", test))]
pub mod splice;
#[cfg(any(feature = "tokio", test))]
pub mod stream;
pub mod workspace;

pub use declare::{After, Answer, Call, Mode, Refusal, Reply, Served};
pub use frame::{FrameError, FrameHeader, MAX_HEADER_LEN, MAX_PAYLOAD_LEN};
pub use guest::{
    call, serve, Activity, BusyProcess, ContainerStartIdentity, GuestService, GuestStatus, Hello,
    Phase, Quiesced, Request, Response, ScreenshotInfo, ServiceRunState, ServiceState, StartPhases,
};
pub use health::{Check, CheckStatus, HealthReport, HEALTH_SCHEMA_VERSION};

/// Version of the guest protocol. Bumped on any change a peer of the previous
/// version could misread. Frames carry it in their `v` field; a peer refuses
/// frames of a newer version with [`FrameError::UnsupportedVersion`].
pub const PROTOCOL_VERSION: u32 = 1;

/// Image label carrying the guest protocol version the image's supervisor speaks.
pub const LABEL_PROTOCOL: &str = "dev.dormouse.protocol";
/// Image label carrying the content hash of the image recipe and supervisor binary.
pub const LABEL_RECIPE: &str = "dev.dormouse.recipe";
/// Container label carrying the computer's UUID.
pub const LABEL_COMPUTER: &str = "dev.dormouse.computer";
/// Container label carrying the computer's owner key.
pub const LABEL_OWNER: &str = "dev.dormouse.owner";

/// Capabilities a desktop container keeps after `--cap-drop ALL`: what the
/// guest supervisor needs as PID 1, and nothing more. The broker grants
/// exactly these; the supervisor's tests run under exactly these.
///
/// - `CHOWN`: the run directory to root; the workspace root, migrated
///   profiles and new directories to uid 1000.
/// - `DAC_OVERRIDE`: reading and writing the desktop user's files (profiles,
///   the workspace) as root.
/// - `SETUID`, `SETGID`: starting services as uid/gid 1000 (and dropping
///   supplementary groups).
/// - `KILL`: signalling the desktop user's processes on quiesce and stop.
///
/// Not `FOWNER`: modes are set before ownership is given away, and the
/// sticky directories the supervisor works in (`/tmp`, `/tmp/.X11-unix`)
/// are root's.
pub const GUEST_CAPABILITIES: &[&str] = &["CHOWN", "DAC_OVERRIDE", "SETUID", "SETGID", "KILL"];

/// Path of the supervisor socket inside the guest.
pub const GUEST_SOCKET_PATH: &str = "/run/dormouse/supervisor.sock";
/// File name of the supervisor socket inside the run directory.
pub const SOCKET_FILE_NAME: &str = "supervisor.sock";
