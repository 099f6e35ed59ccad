//! The supervisor's own client connections to the X display it runs.
//!
//! Owns connecting to display `:<N>` through the socket file under
//! `config.tmp_dir/.X11-unix` (never `$DISPLAY`, never TCP) and bounding
//! every use in time. x11rb's blocking connection waits in `poll(2)` without a
//! timeout, so the work runs on a blocking thread and a watchdog shuts the
//! socket down when the bound passes, which wakes that `poll` and ends the
//! thread. This module must never leave a thread stuck on a hung X server, nor
//! keep a connection open between uses (an idle connection is memory and a
//! file descriptor the 4 MiB supervisor does not need). Closing windows the
//! way a title bar's close button does (`WM_DELETE_WINDOW`) lives here too:
//! it is X client work, whoever asks for it (a stop, a service restart).

use std::collections::BTreeSet;
use std::net::Shutdown;
use std::time::Duration;

use x11rb::connection::Connection as _;
use x11rb::errors::{ConnectError, ConnectionError, ReplyError};
use x11rb::protocol::xproto::{self, AtomEnum, ClientMessageEvent, ConnectionExt as _, EventMask};
use x11rb::rust_connection::{DefaultStream, RustConnection};

use crate::config::Config;

/// Why the X display could not be used.
#[derive(Debug, thiserror::Error)]
pub enum XError {
    /// The display's socket file does not accept connections.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket file.
        path: String,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The X connection setup failed (refused, bad reply).
    #[error("x connection setup failed: {0}")]
    Setup(#[from] ConnectError),
    /// A request failed or the connection broke.
    #[error("x request failed: {0}")]
    Request(#[from] ReplyError),
    /// The connection broke while sending.
    #[error("x connection failed: {0}")]
    Connection(#[from] ConnectionError),
    /// The display did not answer within the bound.
    #[error("x display did not answer within {0:?}")]
    Timeout(Duration),
    /// The work thread panicked or was cancelled.
    #[error("x work thread ended abnormally: {0}")]
    Join(String),
    /// The server answered with something this code cannot use.
    #[error("{0}")]
    Unexpected(String),
}

/// Connects to the configured display, runs `work` on a blocking thread with
/// the connection and the screen number, and closes the connection.
///
/// The whole of it — connect, setup, `work` — is bounded by `bound`.
pub async fn with_display<T, F>(config: &Config, bound: Duration, work: F) -> Result<T, XError>
where
    T: Send + 'static,
    F: FnOnce(&RustConnection, usize) -> Result<T, XError> + Send + 'static,
{
    let path = config.x_socket_path();
    let connect = tokio::net::UnixStream::connect(&path);
    let stream = match tokio::time::timeout(bound, connect).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(source)) => {
            return Err(XError::Connect {
                path: path.display().to_string(),
                source,
            })
        }
        Err(_) => return Err(XError::Timeout(bound)),
    };
    let stream = stream.into_std().map_err(|source| XError::Connect {
        path: path.display().to_string(),
        source,
    })?;
    // A second handle on the same socket: shutting it down wakes the blocked
    // thread however deep in x11rb it waits.
    let watchdog = stream.try_clone().map_err(|source| XError::Connect {
        path: path.display().to_string(),
        source,
    })?;
    let mut work_thread = tokio::task::spawn_blocking(move || {
        let (stream, _peer) =
            DefaultStream::from_unix_stream(stream).map_err(ConnectError::from)?;
        // Xvfb is started without an authority file: its socket sits in a
        // directory only the container can reach, and the guest has no
        // network. So the setup carries no cookie.
        let conn = RustConnection::connect_to_stream(stream, 0)?;
        work(&conn, 0)
    });
    match tokio::time::timeout(bound, &mut work_thread).await {
        Ok(joined) => joined.map_err(|e| XError::Join(e.to_string()))?,
        Err(_) => {
            let _ = watchdog.shutdown(Shutdown::Both);
            // The thread now fails fast; wait so it never outlives the call.
            let _ = work_thread.await;
            Err(XError::Timeout(bound))
        }
    }
}

/// Screen `screen` of the display: its root window, size and depth. The
/// one lookup of a root window in the supervisor.
pub fn screen(conn: &RustConnection, screen: usize) -> Result<&xproto::Screen, XError> {
    conn.setup()
        .roots
        .get(screen)
        .ok_or_else(|| XError::Unexpected(format!("the server has no screen {screen}")))
}

/// The root window of `screen`.
pub fn root_window(conn: &RustConnection, screen: usize) -> Result<xproto::Window, XError> {
    self::screen(conn, screen).map(|s| s.root)
}

/// Size and depth of the root window of `screen`.
pub fn root_geometry(conn: &RustConnection, screen: usize) -> Result<(u32, u32, u8), XError> {
    let root = self::screen(conn, screen)?;
    Ok((
        u32::from(root.width_in_pixels),
        u32::from(root.height_in_pixels),
        root.root_depth,
    ))
}

/// What the root window says about the window manager.
#[derive(Debug, PartialEq, Eq)]
pub enum WmState {
    /// `_NET_SUPPORTING_WM_CHECK` names a live window that names itself.
    Present { window: u32, name: Option<String> },
    /// No property on the root window.
    Missing,
    /// The property names a window that no longer exists or does not point
    /// back (the window manager died without cleaning up).
    Stale { window: u32 },
}

/// Interns an atom (one round trip).
pub fn atom(conn: &RustConnection, name: &[u8]) -> Result<u32, XError> {
    Ok(conn.intern_atom(false, name)?.reply()?.atom)
}

/// Reads `_NET_SUPPORTING_WM_CHECK` (the atom `check`, interned by the
/// caller, who may look many times) as EWMH defines it: the root names a
/// child window, and that window names itself with the same property.
pub fn wm_state(conn: &RustConnection, root: u32, check: u32) -> Result<WmState, XError> {
    let window_of = |w: u32| -> Result<Option<u32>, XError> {
        let reply = conn
            .get_property(false, w, check, AtomEnum::WINDOW, 0, 1)?
            .reply()?;
        Ok(reply.value32().and_then(|mut v| v.next()))
    };
    let Some(window) = window_of(root)? else {
        return Ok(WmState::Missing);
    };
    // A BadWindow here means the window manager died and left the property.
    match window_of(window) {
        Ok(Some(back)) if back == window => {}
        Ok(_) | Err(XError::Request(x11rb::errors::ReplyError::X11Error(_))) => {
            return Ok(WmState::Stale { window })
        }
        Err(e) => return Err(e),
    }
    let name = (|| -> Result<Option<String>, XError> {
        let utf8 = atom(conn, b"UTF8_STRING")?;
        let net_wm_name = atom(conn, b"_NET_WM_NAME")?;
        let reply = conn
            .get_property(false, window, net_wm_name, utf8, 0, 16)?
            .reply()?;
        Ok((!reply.value.is_empty()).then(|| String::from_utf8_lossy(&reply.value).into_owned()))
    })()
    .unwrap_or(None);
    Ok(WmState::Present { window, name })
}

/// Sends `WM_DELETE_WINDOW` to every top-level window whose `_NET_WM_PID`
/// is one of `pids`, as the close button of a title bar does. Returns how
/// many windows were asked (0 also when X does not answer within `bound`).
pub async fn close_windows_of(config: &Config, pids: &[u32], bound: Duration) -> usize {
    let pids: BTreeSet<u32> = pids.iter().copied().collect();
    match with_display(config, bound, move |conn, screen| {
        ask_to_close(conn, screen, &pids)
    })
    .await
    {
        Ok(asked) => asked,
        Err(e) => {
            tracing::debug!(error = %e, "cannot close windows through X");
            0
        }
    }
}

fn ask_to_close(
    conn: &RustConnection,
    screen: usize,
    pids: &BTreeSet<u32>,
) -> Result<usize, XError> {
    let root = root_window(conn, screen)?;
    let client_list = atom(conn, b"_NET_CLIENT_LIST")?;
    let wm_pid = atom(conn, b"_NET_WM_PID")?;
    let protocols = atom(conn, b"WM_PROTOCOLS")?;
    let delete = atom(conn, b"WM_DELETE_WINDOW")?;
    // The window manager's list of managed windows; without one, the
    // children of the root are the top-level windows.
    let listed = conn
        .get_property(false, root, client_list, AtomEnum::WINDOW, 0, 4096)?
        .reply()?;
    let mut windows: Vec<u32> = listed.value32().map(Iterator::collect).unwrap_or_default();
    if windows.is_empty() {
        windows = conn.query_tree(root)?.reply()?.children;
    }
    let mut asked = 0;
    for window in windows {
        // A window may vanish meanwhile (BadWindow): skip it.
        let Ok(reply) = conn
            .get_property(false, window, wm_pid, AtomEnum::CARDINAL, 0, 1)?
            .reply()
        else {
            continue;
        };
        let Some(pid) = reply.value32().and_then(|mut v| v.next()) else {
            continue;
        };
        if !pids.contains(&pid) {
            continue;
        }
        let event = ClientMessageEvent::new(
            32,
            window,
            protocols,
            [delete, x11rb::CURRENT_TIME, 0, 0, 0],
        );
        conn.send_event(false, window, EventMask::NO_EVENT, event)?;
        asked += 1;
    }
    // A round trip: every event is delivered before the connection closes.
    conn.get_input_focus()?.reply()?;
    Ok(asked)
}

/// The X `CLIPBOARD` selection's text: asks its owner to convert it to
/// `UTF8_STRING` on a hidden window of ours and reads the property back, at
/// most `max` bytes (cut at a character boundary). `None` when nobody owns
/// the selection or the owner has no text form of it; `(text, true)` when
/// it was longer than `max` (also when the owner would send it
/// incrementally, `INCR`, which is not followed: the text is then empty).
/// The wait for the owner's answer is bounded by [`with_display`]'s bound.
pub fn clipboard_text(
    conn: &RustConnection,
    screen: usize,
    max: usize,
) -> Result<Option<(String, bool)>, XError> {
    let clipboard = atom(conn, b"CLIPBOARD")?;
    if conn.get_selection_owner(clipboard)?.reply()?.owner == x11rb::NONE {
        return Ok(None);
    }
    let utf8 = atom(conn, b"UTF8_STRING")?;
    let incr = atom(conn, b"INCR")?;
    let property = atom(conn, b"DORMOUSE_CLIPBOARD")?;
    let window = conn
        .generate_id()
        .map_err(|e| XError::Unexpected(format!("no window id: {e}")))?;
    conn.create_window(
        x11rb::COPY_DEPTH_FROM_PARENT,
        window,
        root_window(conn, screen)?,
        0,
        0,
        1,
        1,
        0,
        xproto::WindowClass::INPUT_ONLY,
        x11rb::COPY_FROM_PARENT,
        &xproto::CreateWindowAux::new(),
    )?;
    conn.convert_selection(window, clipboard, utf8, property, x11rb::CURRENT_TIME)?;
    conn.flush()?;
    let converted = loop {
        if let x11rb::protocol::Event::SelectionNotify(e) = conn.wait_for_event()? {
            if e.requestor == window {
                break e.property != x11rb::NONE;
            }
        }
    };
    if !converted {
        return Ok(None);
    }
    let words = u32::try_from(max.div_ceil(4)).unwrap_or(u32::MAX);
    let reply = conn
        .get_property(true, window, property, AtomEnum::ANY, 0, words)?
        .reply()?;
    let _ = conn.destroy_window(window);
    if reply.type_ == incr {
        return Ok(Some((String::new(), true)));
    }
    let mut text = String::from_utf8_lossy(&reply.value).into_owned();
    let mut truncated = reply.bytes_after > 0;
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        truncated = true;
    }
    Ok(Some((text, truncated)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_display_is_a_connect_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config {
            tmp_dir: dir.path().into(),
            ..Config::default()
        };
        let err = with_display(&config, Duration::from_secs(1), |_, _| Ok(()))
            .await
            .expect_err("no display");
        assert!(matches!(err, XError::Connect { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_silent_display_times_out_and_frees_the_thread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config {
            tmp_dir: dir.path().into(),
            ..Config::default()
        };
        std::fs::create_dir_all(dir.path().join(".X11-unix")).expect("mkdir");
        // A listener that accepts and never answers the X setup.
        let listener =
            tokio::net::UnixListener::bind(config.x_socket_path()).expect("bind fake display");
        let hold = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stream);
        });
        let err = with_display(&config, Duration::from_millis(200), |_, _| Ok(()))
            .await
            .expect_err("silent display");
        assert!(matches!(err, XError::Timeout(_)), "{err}");
        hold.abort();
    }
}
