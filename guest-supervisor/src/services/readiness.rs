//! How the supervisor knows a service is ready: by an event, never a timer.
//!
//! - X server: the display number it writes to `-displayfd` once it listens,
//!   confirmed by a completed X connection setup.
//! - Window manager: `_NET_SUPPORTING_WM_CHECK` on the root window naming a
//!   window that names itself (EWMH; a dead manager's leftover does not
//!   count), awaited as `PropertyNotify` events (the property is checked
//!   after selecting them, so a manager that was quicker is not missed).
//! - VNC server: the `PORT=<n>` line x11vnc prints once it listens,
//!   confirmed by reading the RFB banner on loopback.
//! - Taskbar: the window manager's work area (`_NET_WORKAREA` on the root)
//!   ending above the bottom of the screen, i.e. the taskbar's strut was
//!   honoured; awaited as `PropertyNotify` events like the manager's check;
//!   then its band drawn (not all black).
//!
//! Each future here may be dropped at any time (the service exited, a stop
//! came, the bound passed) and leaves nothing behind: a blocking X wait is
//! woken by shutting its socket down.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::{
    AtomEnum, ChangeWindowAttributesAux, ConnectionExt as _, EventMask, ImageFormat,
};
use x11rb::protocol::Event;
use x11rb::rust_connection::{DefaultStream, RustConnection};

use super::output::LineReader;
use crate::config::Config;
use crate::x_client::{self, WmState};

/// Why a service did not get ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// Its output ended before it said it was ready.
    #[error("output closed before the readiness line")]
    OutputClosed,
    /// The readiness line made no sense.
    #[error("unexpected readiness line {0:?}")]
    BadLine(String),
    /// Reading its output, or a connection, failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The X display did not answer.
    #[error("x display: {0}")]
    X(String),
    /// The VNC port answered with something that is not RFB.
    #[error("no RFB banner on {0}")]
    NoBanner(String),
}

/// Waits for the X server's `-displayfd` line, then for a completed X
/// connection setup on the display's socket.
pub async fn display<R: AsyncRead + Unpin>(
    config: &Config,
    displayfd: &mut LineReader<R>,
) -> Result<(), NotReady> {
    let line = displayfd.next_line().await?.ok_or(NotReady::OutputClosed)?;
    let number: u32 = line
        .trim()
        .parse()
        .map_err(|_| NotReady::BadLine(line.clone()))?;
    if number != config.display {
        return Err(NotReady::BadLine(format!(
            "display {number}, expected {}",
            config.display
        )));
    }
    let bound = Duration::from_millis(config.service_ready_timeout_ms);
    crate::x_client::with_display(config, bound, |_, _| Ok(()))
        .await
        .map_err(|e| NotReady::X(e.to_string()))
}

/// Shuts a socket down when dropped, waking a thread blocked on it.
struct ShutdownOnDrop(UnixStream);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

/// Runs the blocking X wait `wait` on a connection of its own to the
/// display, off the runtime; dropping the future shuts the connection down,
/// which ends the wait (`what` names it in an abnormal end).
async fn x_wait<T: Send + 'static>(
    config: &Config,
    what: &str,
    wait: fn(&RustConnection) -> Result<T, String>,
) -> Result<T, NotReady> {
    let path = config.x_socket_path();
    let stream = tokio::net::UnixStream::connect(&path).await?.into_std()?;
    let guard = ShutdownOnDrop(stream.try_clone()?);
    let waiter = tokio::task::spawn_blocking(move || {
        let (stream, _) = DefaultStream::from_unix_stream(stream).map_err(|e| e.to_string())?;
        let conn = RustConnection::connect_to_stream(stream, 0).map_err(|e| e.to_string())?;
        wait(&conn)
    });
    let result = waiter
        .await
        .map_err(|e| NotReady::X(format!("{what} wait ended abnormally: {e}")))?;
    drop(guard);
    result.map_err(NotReady::X)
}

/// Waits until a window manager announces itself on the root window.
pub async fn window_manager(config: &Config) -> Result<(), NotReady> {
    x_wait(config, "window-manager", wait_for_wm).await
}

fn wait_for_wm(conn: &RustConnection) -> Result<(), String> {
    let root = x_client::root_window(conn, 0).map_err(|e| e.to_string())?;
    let atom = x_client::atom(conn, b"_NET_SUPPORTING_WM_CHECK").map_err(|e| e.to_string())?;
    let watch = |window: u32| {
        conn.change_window_attributes(
            window,
            &ChangeWindowAttributesAux::new().event_mask(EventMask::PROPERTY_CHANGE),
        )
        .map_err(|e| e.to_string())
        .map(|cookie| cookie.check())
    };
    // Select first, then look: a property set in between is seen either way.
    watch(root)?.map_err(|e| e.to_string())?;
    // The root may still name the check window of a manager that died (it
    // cannot clean up after a SIGKILL): only a window that names itself
    // counts, as EWMH defines it. A live manager writes the root first and
    // its own window next, so a named window is watched too.
    let mut watched = None;
    loop {
        match x_client::wm_state(conn, root, atom).map_err(|e| e.to_string())? {
            WmState::Present { .. } => break,
            WmState::Stale { window } if watched != Some(window) => {
                watched = Some(window);
                // BadWindow: the named window is gone; only the root can
                // change now, and it is watched already.
                if watch(window)?.is_ok() {
                    continue;
                }
            }
            WmState::Stale { .. } | WmState::Missing => {}
        }
        loop {
            match conn.wait_for_event().map_err(|e| e.to_string())? {
                Event::PropertyNotify(e) if e.atom == atom => break,
                _ => {}
            }
        }
    }
    wait_for_desktops(conn, root)?;
    paint_root_background(conn, root);
    Ok(())
}

/// How long a manager that announced itself may take to name its desktops
/// and work area before it counts as ready anyway (a manager that never
/// sets them still runs).
const DESKTOPS_GRACE: Duration = Duration::from_millis(500);

/// Waits, within [`DESKTOPS_GRACE`], until the root has the manager's
/// `_NET_NUMBER_OF_DESKTOPS` and `_NET_WORKAREA`: openbox writes them just
/// after its check window, and a panel started in between (tint2) finds no
/// desktops and sleeps a whole second before it looks again. The root's
/// property changes are selected already.
fn wait_for_desktops(conn: &RustConnection, root: u32) -> Result<(), String> {
    let names: [&[u8]; 2] = [b"_NET_NUMBER_OF_DESKTOPS", b"_NET_WORKAREA"];
    let mut atoms = Vec::with_capacity(names.len());
    for name in names {
        atoms.push(x_client::atom(conn, name).map_err(|e| e.to_string())?);
    }
    let deadline = std::time::Instant::now() + DESKTOPS_GRACE;
    loop {
        let mut all = true;
        for &atom in &atoms {
            let reply = conn
                .get_property(false, root, atom, AtomEnum::ANY, 0, 1)
                .map_err(|e| e.to_string())?
                .reply()
                .map_err(|e| e.to_string())?;
            all &= reply.type_ != u32::from(AtomEnum::NONE);
        }
        if all || std::time::Instant::now() >= deadline {
            return Ok(());
        }
        // Drain what came (a property change is the cue to look again),
        // then give the manager a moment.
        while conn.poll_for_event().map_err(|e| e.to_string())?.is_some() {}
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the window manager keeps a band free at the bottom of the
/// screen for the taskbar, and returns its height in pixels.
pub async fn taskbar(config: &Config) -> Result<u32, NotReady> {
    x_wait(config, "taskbar", wait_for_band).await
}

fn wait_for_band(conn: &RustConnection) -> Result<u32, String> {
    let (root, height) = {
        let screen = x_client::screen(conn, 0).map_err(|e| e.to_string())?;
        (screen.root, u32::from(screen.height_in_pixels))
    };
    let atom = x_client::atom(conn, b"_NET_WORKAREA").map_err(|e| e.to_string())?;
    // Select first, then look: a work area set in between is seen either way.
    conn.change_window_attributes(
        root,
        &ChangeWindowAttributesAux::new().event_mask(EventMask::PROPERTY_CHANGE),
    )
    .map_err(|e| e.to_string())?
    .check()
    .map_err(|e| e.to_string())?;
    loop {
        let reply = conn
            .get_property(false, root, atom, AtomEnum::CARDINAL, 0, 4)
            .map_err(|e| e.to_string())?
            .reply()
            .map_err(|e| e.to_string())?;
        let area: Vec<u32> = reply.value32().map(Iterator::collect).unwrap_or_default();
        if let Some(band) = band_below(&area, height).filter(|b| *b > 0) {
            // The taskbar's start can leave the root without its colour
            // (black wherever the root is next exposed): paint it again.
            paint_root_background(conn, root);
            wait_for_paint(conn, root, height.saturating_sub(band / 2));
            return Ok(band);
        }
        loop {
            match conn.wait_for_event().map_err(|e| e.to_string())? {
                Event::PropertyNotify(e) if e.atom == atom => break,
                _ => {}
            }
        }
    }
}

/// How long a taskbar whose band is kept may take to draw itself before it
/// counts as ready anyway (a blank panel still works).
const PAINT_GRACE: Duration = Duration::from_millis(1500);

/// Waits, within [`PAINT_GRACE`], until row `y` of the screen is no longer
/// all black: the taskbar has drawn itself into its band (its window is
/// mapped before it is painted, and a screenshot in between shows a black
/// band).
fn wait_for_paint(conn: &RustConnection, root: u32, y: u32) {
    let Ok(screen) = x_client::screen(conn, 0) else {
        return;
    };
    let (width, Ok(y)) = (screen.width_in_pixels, i16::try_from(y)) else {
        return;
    };
    let deadline = std::time::Instant::now() + PAINT_GRACE;
    loop {
        let drawn = conn
            .get_image(ImageFormat::Z_PIXMAP, root, 0, y, width, 1, u32::MAX)
            .ok()
            .and_then(|cookie| cookie.reply().ok())
            .is_none_or(|image| image.data.iter().any(|b| *b != 0));
        if drawn || std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The rows between the bottom of the first desktop's work area (`x, y,
/// width, height` of `_NET_WORKAREA`) and the bottom of a screen
/// `screen_height` rows high; `None` when there is no work area.
pub fn band_below(area: &[u32], screen_height: u32) -> Option<u32> {
    let [_, y, _, h, ..] = *area else {
        return None;
    };
    Some(screen_height.saturating_sub(y.saturating_add(h)))
}

/// Gives the bare desktop a calm solid colour instead of X's black, so a
/// person looking at a preview can tell a live, empty desktop from a dead
/// screen. Cosmetic: a failure is logged as a warning (a black desktop's
/// log then says why) and ignored.
fn paint_root_background(conn: &RustConnection, root: u32) {
    const DESKTOP_RGB: u32 = 0x3b_5b_7a;
    let Ok(screen) = x_client::screen(conn, 0) else {
        return;
    };
    if screen.root_depth != 24 {
        return;
    }
    let painted = (|| -> Result<(), x11rb::errors::ReplyError> {
        conn.change_window_attributes(
            root,
            &ChangeWindowAttributesAux::new().background_pixel(DESKTOP_RGB),
        )?
        .check()?;
        conn.clear_area(false, root, 0, 0, 0, 0)?;
        conn.flush()?;
        Ok(())
    })();
    if let Err(e) = painted {
        tracing::warn!(target: "service", "root background not painted: {e}");
    }
}

/// Waits for x11vnc's `PORT=<n>` line, then reads the RFB banner there.
pub async fn vnc<R: AsyncRead + Unpin>(
    config: &Config,
    stdout: &mut LineReader<R>,
) -> Result<(), NotReady> {
    let port = loop {
        let line = stdout.next_line().await?.ok_or(NotReady::OutputClosed)?;
        if let Some(rest) = line.trim().strip_prefix("PORT=") {
            break rest
                .parse::<u16>()
                .map_err(|_| NotReady::BadLine(line.clone()))?;
        }
        if !line.trim().is_empty() {
            tracing::info!(target: "service", service = "vnc", "{line}");
        }
    };
    if port != config.vnc_port {
        return Err(NotReady::BadLine(format!(
            "port {port}, expected {}",
            config.vnc_port
        )));
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    // Speaking first spares the server's wait for a silent client's version
    // (about 100 ms in x11vnc); the banner is still read and checked.
    conn.write_all(b"RFB 003.008\n").await?;
    let mut banner = [0u8; 12];
    conn.read_exact(&mut banner).await?;
    if banner.starts_with(b"RFB ") {
        Ok(())
    } else {
        Err(NotReady::NoBanner(addr.to_string()))
    }
}
