//! The last whole screen the socket's `screenshot` encoded, answered again
//! while nothing has been drawn since: an agent or a panel that asks a
//! hundred times a second for a screen that does not change costs one
//! encoding, not a hundred, and leaves the cores to the desktops in use.
//!
//! Owns a connection of its own to the display with a DAMAGE object on the
//! root window, which the server tells of drawing in every window below
//! the root. Sound by order: before a kept image is answered, a round trip
//! on that connection (`GetInputFocus`) makes the server send every
//! `DamageNotify` caused by a request it handled before; a fresh capture
//! re-arms the damage (`DamageSubtract`) before its first `GetImage`, so
//! drawing during the capture makes the next call capture again. Anything
//! that fails drops the connection and the image: the next capture is
//! fresh, so an error here can cost time, never a stale screen.

use std::os::unix::net::UnixStream;
use std::path::Path;

use dormouse_protocol::image::ImageEncoding;
use x11rb::connection::Connection as _;
use x11rb::protocol::damage::{self, ConnectionExt as _};
use x11rb::protocol::xproto::ConnectionExt as _;
use x11rb::protocol::Event;
use x11rb::rust_connection::{DefaultStream, RustConnection};

use super::CaptureStats;

/// The largest image kept (a desktop's PNG is 25-80 KiB; the supervisor
/// keeps to a 4 MiB budget); a larger one is encoded again each time.
pub const MAX_KEPT_BYTES: usize = 256 << 10;

/// The watch on the screen and the image kept under it.
pub struct Unchanged {
    watch: Option<Watch>,
    kept: Option<Kept>,
}

struct Watch {
    conn: RustConnection,
    damage: damage::Damage,
}

struct Kept {
    encoding: ImageEncoding,
    stats: CaptureStats,
    image: Vec<u8>,
}

type Failed = Box<dyn std::error::Error>;

/// A second handle on the watch's socket: shutting it down wakes a thread
/// blocked in a round trip on it ([`interrupt`]).
static SOCKET: std::sync::Mutex<Option<UnixStream>> = std::sync::Mutex::new(None);

/// Ends the watch's connection from outside, for a capture past its bound:
/// the work blocked on it fails at once, and the next capture opens a new
/// watch.
pub fn interrupt() {
    if let Some(socket) = SOCKET.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = socket.shutdown(std::net::Shutdown::Both);
    }
}

impl Unchanged {
    /// No watch and no image yet.
    pub const fn new() -> Self {
        Self {
            watch: None,
            kept: None,
        }
    }

    /// The kept image in `encoding` when nothing has been drawn since its
    /// capture began. Otherwise `None`, the watch armed for the capture
    /// the caller makes next (on the display at `x_socket`).
    pub fn reuse(
        &mut self,
        x_socket: &Path,
        encoding: ImageEncoding,
    ) -> Option<(CaptureStats, Vec<u8>)> {
        let Some(watch) = &self.watch else {
            self.kept = None;
            match Watch::open(x_socket) {
                Ok(watch) => self.watch = Some(watch),
                Err(e) => tracing::debug!("no damage watch on the screen: {e}"),
            }
            return None;
        };
        match watch.drawn_since() {
            Ok(false) => self
                .kept
                .as_ref()
                .filter(|k| k.encoding == encoding)
                .map(|k| (k.stats, k.image.clone())),
            Ok(true) => {
                self.kept = None;
                None
            }
            Err(e) => {
                tracing::debug!("damage watch lost: {e}");
                self.watch = None;
                self.kept = None;
                None
            }
        }
    }

    /// Keeps `image`, captured in `encoding` after [`Unchanged::reuse`]
    /// answered `None`, when a watch is up and it is small enough.
    pub fn keep(&mut self, encoding: ImageEncoding, stats: CaptureStats, image: &[u8]) {
        self.kept = (self.watch.is_some() && image.len() <= MAX_KEPT_BYTES).then(|| Kept {
            encoding,
            stats,
            image: image.to_vec(),
        });
    }
}

impl Watch {
    /// A connection with a damage object on the root of screen 0; the
    /// screen counts as drawn until the first capture under it.
    fn open(x_socket: &Path) -> Result<Self, Failed> {
        let stream = UnixStream::connect(x_socket)?;
        *SOCKET.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream.try_clone()?);
        let (stream, _) = DefaultStream::from_unix_stream(stream)?;
        let conn = RustConnection::connect_to_stream(stream, 0)?;
        conn.damage_query_version(1, 1)?.reply()?;
        let root = conn.setup().roots.first().ok_or("no screen")?.root;
        let damage = conn.generate_id()?;
        conn.damage_create(damage, root, damage::ReportLevel::NON_EMPTY)?
            .check()?;
        Ok(Self { conn, damage })
    }

    /// Whether anything was drawn since the last call; when so, the damage
    /// is emptied again (before the caller's capture).
    fn drawn_since(&self) -> Result<bool, Failed> {
        // The round trip: every notice of drawing the server handled
        // before it is in the queue once its answer is.
        self.conn.get_input_focus()?.reply()?;
        let mut drawn = false;
        while let Some(event) = self.conn.poll_for_event()? {
            drawn |= matches!(event, Event::DamageNotify(_));
        }
        if drawn {
            self.conn
                .damage_subtract(self.damage, x11rb::NONE, x11rb::NONE)?;
            self.conn.flush()?;
        }
        Ok(drawn)
    }
}
