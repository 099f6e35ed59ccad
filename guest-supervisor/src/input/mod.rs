//! Computer-use actions on the desktop's X display: pointer, buttons, wheel,
//! keys and exact typing through XTEST, screenshots and zoom through
//! [`crate::screenshot`].
//!
//! Owns executing one validated [`ActionBatch`] in order on one connection,
//! stopping at the first failure, and the results of what ran. Input goes
//! through the XTEST extension (`FakeInput`), so the X server counts it as
//! user input (the idle timer of [`crate::activity`] sees it). Typing binds
//! characters the layout lacks to spare keycodes for as long as it needs
//! them ([`keymap`]) and restores the mapping before the batch answers.
//!
//! Exactness against clients: a client reads a changed mapping when it
//! handles the change's notice, possibly after keys queued before the next
//! change. So a binding is used, and undone or replaced, only once the
//! focused client has handled everything before: it answers a
//! `_NET_WM_PING` queued behind them (Chromium, Firefox, GTK and Qt apps do);
//! a client without that protocol (xterm) gets a settle time that grows with
//! the keys it was sent. Characters the layout has need no binding and go
//! as fast as the server takes them.
//!
//! It must never run a batch that [`dormouse_protocol::actions::validate`]
//! refuses for this screen, never spawn a process for input (no xdotool;
//! the clipboard actions are [`crate::clipboard`]'s, which runs xclip), and
//! never leave a key or button pressed that the batch did not ask to keep
//! pressed.

mod capture;
mod keyboard;
pub mod keymap;
mod pointer;

pub use keyboard::typed_keysyms;

use std::time::Duration;

use dormouse_protocol::actions::{
    self, keysym, Action, ActionBatch, ActionImage, ActionName, ActionResult, BatchError,
    GuestActionResults, ScrollDirection, Space,
};
use x11rb::connection::{Connection as _, RequestConnection as _};
use x11rb::protocol::xproto::{self, ConnectionExt as _, KeyButMask, Keycode};
use x11rb::protocol::xtest::{self, ConnectionExt as _};
use x11rb::protocol::Event;
use x11rb::rust_connection::RustConnection;

use self::capture::acquire_capture_slot;
use self::keymap::{KeyAt, Keymap};
use self::pointer::{presses_a_button, DRAG_STEPS};
use crate::clipboard::{self, ClipboardError};
use crate::config::Config;
use crate::screenshot::{self, CaptureSpec, Rect, ScreenshotError};
use crate::x_client::{self, XError};

/// How typing is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputOptions {
    /// Pause after each typed character; zero (the default) types as fast
    /// as the X server takes the events (each chunk ends with a round trip).
    pub char_delay: Duration,
    /// How long new bindings are given to reach the clients before their
    /// keys are pressed, and stay after their last key before they are
    /// undone or replaced: clients read a changed mapping when they handle
    /// its notice, which may be after keys already queued (Chromium does).
    pub settle: Duration,
}

impl Default for InputOptions {
    fn default() -> Self {
        Self {
            char_delay: Duration::ZERO,
            settle: Duration::from_millis(100),
        }
    }
}

/// Why a batch did not run at all.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    /// Refused by validation; nothing ran.
    #[error(transparent)]
    Invalid(#[from] BatchError),
    /// The display could not be used (no action ran, or the connection
    /// broke under the batch: the hang guard is [`batch_bound`]).
    #[error(transparent)]
    X(#[from] XError),
}

impl ExecuteError {
    /// The error code for the guest's answer: `invalid_actions` (refused,
    /// nothing ran), `timeout` (the batch broke its hang guard,
    /// [`batch_bound`]) or `x_error`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => BatchError::CODE,
            Self::X(XError::Timeout(_)) => "timeout",
            Self::X(_) => "x_error",
        }
    }
}

/// What a batch did: the guest answer's header and the images for its
/// payload, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Results (images' `data` empty) and image lengths.
    pub answer: GuestActionResults,
    /// The images, then the clipboard texts, to be written one after the
    /// other as the payload.
    pub images: Vec<Vec<u8>>,
}

/// Why one action failed while running.
#[derive(Debug, thiserror::Error)]
enum ActionError {
    #[error(transparent)]
    X(#[from] XError),
    #[error("the X server has no XTEST extension")]
    NoXtest,
    #[error("the keyboard mapping has no spare keycode to bind {0:?} to")]
    NoSpareKeycode(String),
    #[error("modifiers are held ({0:#x}); typing now would send shortcuts")]
    ModifiersActive(u16),
    #[error("no keycode gives the modifier {0}")]
    NoModifierKey(&'static str),
    #[error(transparent)]
    Screenshot(#[from] ScreenshotError),
    #[error("the images of this batch exceed {0} bytes")]
    TooLarge(u32),
    #[error(transparent)]
    Clipboard(#[from] ClipboardError),
}

impl ActionError {
    fn code(&self) -> &'static str {
        match self {
            Self::X(_) => "x_error",
            Self::NoXtest => "no_xtest",
            Self::NoSpareKeycode(_) => "no_spare_keycode",
            Self::ModifiersActive(_) => "modifiers_active",
            Self::NoModifierKey(_) => "no_modifier_key",
            Self::Screenshot(_) => "screenshot_failed",
            Self::TooLarge(_) => "too_large",
            Self::Clipboard(e) => e.code(),
        }
    }
}

/// Upper bound of a whole batch on the display: the hang guard of
/// [`execute`], the protocol's one formula ([`actions::run_bound`]) with
/// the probe's screenshot bound per image action.
pub fn batch_bound(config: &Config, batch: &ActionBatch) -> Duration {
    actions::run_bound(batch, Duration::from_millis(config.probe_timeout_ms))
}

/// Executes `batch` on the configured display: validates it against the
/// real screen (refusing it whole, [`ExecuteError::Invalid`], before
/// anything runs), then runs its actions in order on one connection,
/// stopping at the first failure. The socket handler answers the
/// [`BatchOutcome`]'s `answer` as the header and its `images` as the payload.
pub async fn execute(
    config: &Config,
    batch: ActionBatch,
    options: InputOptions,
) -> Result<BatchOutcome, ExecuteError> {
    // Validated once here, against the real screen, in `run_batch` (the
    // broker validated it once on its side, without a screen): the bound
    // below holds for any batch, valid or not.
    let bound = batch_bound(config, &batch);
    let runtime = tokio::runtime::Handle::current();
    let probe_timeout = Duration::from_millis(config.probe_timeout_ms);
    let desktop = config.clone();
    x_client::with_display(config, bound, move |conn, screen| {
        Ok(run_batch(
            conn,
            screen,
            &batch,
            options,
            Some(&desktop),
            &|| acquire_capture_slot(&runtime, probe_timeout),
        ))
    })
    .await?
}

/// A capture-slot source: the socket path blocks on the runtime; tests on
/// a plain thread take it directly.
type SlotFn<'a> = dyn Fn() -> Result<tokio::sync::SemaphorePermit<'static>, XError> + 'a;

/// Runs a batch on an open connection (blocking): validation against the
/// root window of `screen`, then the actions in order. Errors of single
/// actions end the batch and are in its results. Without the supervisor's
/// configuration (and its reaper) the clipboard actions fail
/// `clipboard_failed`.
pub fn run_batch_blocking(
    conn: &RustConnection,
    screen: usize,
    batch: &ActionBatch,
    options: InputOptions,
) -> Result<BatchOutcome, ExecuteError> {
    run_batch(conn, screen, batch, options, None, &|| {
        screenshot::CAPTURE_SLOT
            .try_acquire()
            .map_err(|e| XError::Unexpected(format!("capture slot: {e}")))
    })
}

fn run_batch(
    conn: &RustConnection,
    screen: usize,
    batch: &ActionBatch,
    options: InputOptions,
    desktop: Option<&Config>,
    slot: &SlotFn<'_>,
) -> Result<BatchOutcome, ExecuteError> {
    let (width, height, _) = x_client::root_geometry(conn, screen)?;
    let space = actions::validate(batch, Some(actions::Size { width, height }))?;
    let root = x_client::root_window(conn, screen)?;
    let mut run = Runner {
        conn,
        screen,
        root,
        space,
        cursor: batch.cursor,
        options,
        keymap: None,
        images: Vec::new(),
        texts: Vec::new(),
        image_bytes: 0,
        ping_atoms: None,
        pings: 0,
        keys_since_settle: 0,
        pointer: None,
        xtest: conn
            .extension_information(xtest::X11_EXTENSION_NAME)
            .map_err(XError::from)?
            .is_some(),
        slot,
        desktop,
    };
    let mut results = Vec::with_capacity(batch.actions.len());
    let mut clicked = false;
    for action in &batch.actions {
        let name = action.name();
        let keys = matches!(
            name,
            ActionName::Key | ActionName::HoldKey | ActionName::Type
        );
        let handed = if keys && clicked {
            run.hand_over_click()
        } else {
            Ok(())
        };
        clicked = presses_a_button(name) || (clicked && !keys && name == ActionName::Wait);
        let outcome = handed.and_then(|()| run.one(action)).and_then(|r| {
            run.sync()?;
            Ok(r)
        });
        match outcome {
            Ok(result) => results.push(result),
            Err(e) => {
                results.push(ActionResult::failed(name, e.code(), e.to_string()));
                break;
            }
        }
    }
    // Undo bindings whatever happened, once the focused client has handled
    // their keys; a failure here is the last result's.
    let restored = match run.keymap.as_ref().map(Keymap::has_bindings) {
        Some(true) => run.settle().and_then(|()| {
            run.keymap
                .as_mut()
                .map_or(Ok(()), |k| k.restore(conn))
                .map_err(ActionError::from)
        }),
        _ => Ok(()),
    };
    if let Err(e) = restored {
        if let Some(last) = results.last_mut() {
            *last = ActionResult::failed(last.action, e.code(), e.to_string());
        }
    }
    let image_lens = run
        .images
        .iter()
        .map(|i| u64::try_from(i.len()).unwrap_or(u64::MAX))
        .collect();
    let text_lens = run
        .texts
        .iter()
        .map(|t| u64::try_from(t.len()).unwrap_or(u64::MAX))
        .collect();
    let mut payload = run.images;
    payload.append(&mut run.texts);
    Ok(BatchOutcome {
        answer: GuestActionResults {
            results,
            image_lens,
            text_lens,
        },
        images: payload,
    })
}

struct Runner<'a> {
    conn: &'a RustConnection,
    screen: usize,
    root: xproto::Window,
    space: Space,
    cursor: bool,
    options: InputOptions,
    keymap: Option<Keymap>,
    images: Vec<Vec<u8>>,
    /// The texts `clipboard_get` read, in order.
    texts: Vec<Vec<u8>>,
    image_bytes: usize,
    xtest: bool,
    slot: &'a SlotFn<'a>,
    /// The desktop user and display, for the clipboard actions.
    desktop: Option<&'a Config>,
    /// `WM_PROTOCOLS` and `_NET_WM_PING`, once interned.
    ping_atoms: Option<(u32, u32)>,
    pings: u32,
    /// Keys pressed since the last [`Runner::settle`].
    keys_since_settle: u32,
    /// The last point the pointer was sent to, on the screen.
    pointer: Option<(i16, i16)>,
}

impl Runner<'_> {
    /// Runs one action.
    // Over 100 lines on purpose: one arm per action of the protocol's
    // exhaustive `Action` enum, each a few calls into `pointer`,
    // `keyboard` or `capture`; the match is the table of what each does.
    fn one(&mut self, action: &Action) -> Result<ActionResult, ActionError> {
        let name = action.name();
        let needs_xtest = !matches!(
            action,
            Action::CursorPosition {}
                | Action::Screenshot { .. }
                | Action::Zoom { .. }
                | Action::Wait { .. }
                | Action::ClipboardGet {}
                | Action::ClipboardSet { .. }
        );
        if needs_xtest && !self.xtest {
            return Err(ActionError::NoXtest);
        }
        let modifiers = match action.modifiers().map(str::trim).filter(|m| !m.is_empty()) {
            Some(m) => self.combo(m)?,
            None => Vec::new(),
        };
        match action {
            Action::Key { text } => {
                let combos = actions::parse_key_text(text).map_err(|p| invalid(name, p))?;
                for combo in combos {
                    let keys = self.resolve(&combo, text)?;
                    self.press_all(&keys)?;
                    self.release_all(&keys)?;
                }
            }
            Action::HoldKey { text, duration } => {
                let combo = actions::parse_combo(text.trim()).map_err(|p| invalid(name, p))?;
                let keys = self.resolve(&combo, text)?;
                self.press_all(&keys)?;
                self.sync()?;
                std::thread::sleep(Duration::from_secs_f64(*duration));
                self.release_all(&keys)?;
            }
            Action::Type { text } => self.type_text(text)?,
            Action::CursorPosition {} => {
                let (x, y) = self.pointer_settled()?;
                let at = self.space.to_caller([i64::from(x), i64::from(y)]);
                return Ok(ActionResult {
                    coordinate: Some(at),
                    ..ActionResult::ok(name)
                });
            }
            Action::MouseMove { coordinate, .. } => {
                self.with_held(&modifiers, |r| r.move_to(*coordinate))?;
            }
            Action::LeftMouseDown { coordinate, .. } => {
                self.with_held(&modifiers, |r| {
                    r.move_opt(*coordinate)?;
                    r.button(1, true)
                })?;
            }
            Action::LeftMouseUp { coordinate, .. } => {
                self.with_held(&modifiers, |r| {
                    r.move_opt(*coordinate)?;
                    r.button(1, false)?;
                    r.buttons_released()
                })?;
            }
            Action::LeftClick { coordinate, .. } => self.click(&modifiers, *coordinate, 1, 1)?,
            Action::RightClick { coordinate, .. } => self.click(&modifiers, *coordinate, 3, 1)?,
            Action::MiddleClick { coordinate, .. } => self.click(&modifiers, *coordinate, 2, 1)?,
            Action::DoubleClick { coordinate, .. } => self.click(&modifiers, *coordinate, 1, 2)?,
            Action::TripleClick { coordinate, .. } => self.click(&modifiers, *coordinate, 1, 3)?,
            Action::LeftClickDrag {
                start_coordinate,
                coordinate,
                ..
            } => {
                let (from, to) = (*start_coordinate, *coordinate);
                self.with_held(&modifiers, |r| {
                    r.move_to(from)?;
                    r.button(1, true)?;
                    r.sync()?;
                    // The path in the caller's space, mapped point by point.
                    for step in 1..=DRAG_STEPS {
                        let at = [
                            from[0] + (to[0] - from[0]) * step / DRAG_STEPS,
                            from[1] + (to[1] - from[1]) * step / DRAG_STEPS,
                        ];
                        r.move_to(at)?;
                        r.sync()?;
                    }
                    r.button(1, false)?;
                    r.buttons_released()
                })?;
            }
            Action::Scroll {
                coordinate,
                scroll_direction,
                scroll_amount,
                ..
            } => {
                let button = match scroll_direction {
                    ScrollDirection::Up => 4,
                    ScrollDirection::Down => 5,
                    ScrollDirection::Left => 6,
                    ScrollDirection::Right => 7,
                };
                self.with_held(&modifiers, |r| {
                    r.move_opt(*coordinate)?;
                    for _ in 0..*scroll_amount {
                        r.button(button, true)?;
                        r.button(button, false)?;
                    }
                    Ok(())
                })?;
            }
            Action::Wait { duration } => std::thread::sleep(Duration::from_secs_f64(*duration)),
            Action::ClipboardGet {} => {
                // In the payload, after the images: a guest's strings are
                // escaped and cut on arrival, the payload's bytes are not.
                let text = clipboard::get(self.desktop()?, self.conn)?;
                self.texts.push(text.into_bytes());
            }
            Action::ClipboardSet { text } => clipboard::set(self.desktop()?, self.conn, text)?,
            Action::Screenshot { .. } => {
                let spec = CaptureSpec {
                    region: None,
                    size: (!self.space.is_native())
                        .then_some((self.space.caller.width, self.space.caller.height)),
                    cursor: self.cursor,
                    encoding: action.encoding().unwrap_or_default(),
                };
                return self.capture(name, &spec);
            }
            Action::Zoom { region, .. } => {
                let [x0, y0] = self.space.edge_to_screen([region[0], region[1]]);
                let [x1, y1] = self.space.edge_to_screen([region[2], region[3]]);
                let spec = CaptureSpec {
                    region: Some(Rect {
                        x: x0,
                        y: y0,
                        width: x1.saturating_sub(x0).max(1),
                        height: y1.saturating_sub(y0).max(1),
                    }),
                    size: None,
                    cursor: self.cursor,
                    encoding: action.encoding().unwrap_or_default(),
                };
                return self.capture(name, &spec);
            }
        }
        Ok(ActionResult::ok(name))
    }

    /// The desktop's configuration, which the clipboard actions need.
    fn desktop(&self) -> Result<&Config, ActionError> {
        self.desktop
            .ok_or(ActionError::Clipboard(ClipboardError::Failed(
                "no desktop configuration".into(),
            )))
    }

    /// One round trip: the server has processed everything sent; an error
    /// it reported for an unchecked request fails the action.
    fn sync(&mut self) -> Result<(), ActionError> {
        self.conn
            .get_input_focus()
            .map_err(XError::from)?
            .reply()
            .map_err(XError::from)?;
        while let Some(event) = self.conn.poll_for_event().map_err(XError::from)? {
            if let Event::Error(e) = event {
                return Err(XError::Unexpected(format!("x error: {e:?}")).into());
            }
        }
        Ok(())
    }
}

fn invalid(name: ActionName, problem: actions::Problem) -> ActionError {
    // Validation ran before; reaching this means the batch changed under
    // it, which cannot happen. Report it as what it is anyway.
    ActionError::X(XError::Unexpected(format!("{name}: {problem}")))
}

#[cfg(test)]
mod tests {
    use super::keyboard::{us_position, RETURN, TAB};
    use super::*;

    #[test]
    fn the_protocols_key_allowance_covers_two_settles() {
        // The shared bound grants each key action two settles of the
        // default options; a longer settle here would outgrow it.
        assert!(InputOptions::default().settle * 2 <= actions::KEY_ACTION_ALLOWANCE);
    }

    #[test]
    fn a_batch_past_its_hang_guard_is_a_timeout_not_an_x_error() {
        let late = ExecuteError::X(XError::Timeout(Duration::from_secs(10)));
        assert_eq!(late.code(), "timeout");
        let refused = ExecuteError::X(XError::Unexpected("no root".into()));
        assert_eq!(refused.code(), "x_error");
    }

    #[test]
    fn us_positions_follow_evdev() {
        assert_eq!(us_position(u32::from(b'a')), Some((38, false)));
        assert_eq!(us_position(u32::from(b'L')), Some((46, true)));
        assert_eq!(us_position(u32::from(b'1')), Some((10, false)));
        assert_eq!(us_position(u32::from(b'0')), Some((19, false)));
        assert_eq!(us_position(u32::from(b'm')), Some((58, false)));
        assert_eq!(us_position(0xff0d), None);
    }

    #[test]
    fn text_becomes_one_keysym_per_character() {
        let syms = typed_keysyms("aé—\r\n\r\t世");
        assert_eq!(
            syms,
            vec![
                (0x61, None),
                (0xe9, None),
                (0x0100_2014, Some(0xaa9)),
                (RETURN, None),
                (RETURN, None),
                (TAB, None),
                (0x0100_4e16, None),
            ]
        );
    }
}
