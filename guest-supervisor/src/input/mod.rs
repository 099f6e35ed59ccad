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
//! refuses for this screen, never spawn a process (no xdotool), and never
//! leave a key or button pressed that the batch did not ask to keep pressed.

pub mod keymap;

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

use self::keymap::{KeyAt, Keymap};
use crate::config::Config;
use crate::screenshot::{self, CaptureSpec, Rect, ScreenshotError};
use crate::x_client::{self, XError};

/// `Return` and `Tab`.
const RETURN: u32 = 0xff0d;
const TAB: u32 = 0xff09;

/// Keysyms that make a combination a shortcut: Control, Meta, Alt, Super,
/// Hyper (left and right).
const SHORTCUT_MODIFIERS: &[u32] = &[
    0xffe3, 0xffe4, 0xffe7, 0xffe8, 0xffe9, 0xffea, 0xffeb, 0xffec, 0xffed, 0xffee,
];

/// The keycode (evdev numbering, which Xvfb and every current X server
/// use) of an ASCII letter or digit on a US keyboard, and whether it is the
/// shifted one.
fn us_position(sym: u32) -> Option<(Keycode, bool)> {
    const ROWS: &[(&[u8], u8)] = &[
        (b"1234567890", 10),
        (b"qwertyuiop", 24),
        (b"asdfghjkl", 38),
        (b"zxcvbnm", 52),
    ];
    let c = u8::try_from(sym).ok()?;
    let (lower, shift) = if c.is_ascii_uppercase() {
        (c.to_ascii_lowercase(), true)
    } else {
        (c, false)
    };
    ROWS.iter().find_map(|(row, first)| {
        let i = row.iter().position(|r| *r == lower)?;
        let i = u8::try_from(i).ok()?;
        Some((first + i, shift))
    })
}

/// Longest wait for the focused client's answer to a ping.
const PING_BOUND: Duration = Duration::from_secs(10);

/// Extra settle per key sent, for clients that cannot be pinged.
const SETTLE_PER_KEY: Duration = Duration::from_micros(250);
/// Longest settle for clients that cannot be pinged.
const SETTLE_MAX: Duration = Duration::from_secs(3);

/// Longest wait for the server's pointer to reach the last point sent.
/// While a client holds a synchronous grab (openbox's click-to-focus grab
/// on every managed window), the server freezes the pointer on a press and
/// queues the events behind it until that client lets them go, so a
/// position asked for right after a click can be the click's, not the
/// later move's. Openbox lets go within milliseconds, except right after a
/// keyboard mapping change (a layout switch, or the bindings typing
/// makes), which it handles first: 100–300 ms seen on a quiet host, over
/// 3 s with the whole test suite running beside it. A pointer someone else
/// moves meanwhile (a person on a control screen) makes the wait run out.
const POINTER_BOUND: Duration = Duration::from_secs(10);

/// Pause between the clicks of a double or triple click. A toolkit counts
/// a click as a repeat only when its press carries a later server
/// timestamp than the previous one (Chromium ignores equal ones as one
/// native event), and clicks sent back to back share a millisecond.
const MULTI_CLICK_GAP: Duration = Duration::from_millis(20);

/// Steps of the pointer's path between the ends of a drag: applications
/// start a drag only after motion with the button held.
const DRAG_STEPS: i64 = 8;

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
    /// nothing ran) or `x_error`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => BatchError::CODE,
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
    /// The images, to be written one after the other as the payload.
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
    // Before connecting: a batch refused for the configured screen size
    // costs no X connection (the real size is checked again below).
    actions::validate(
        &batch,
        Some(actions::Size {
            width: config.width,
            height: config.height,
        }),
    )?;
    let bound = batch_bound(config, &batch);
    let runtime = tokio::runtime::Handle::current();
    let probe_timeout = Duration::from_millis(config.probe_timeout_ms);
    x_client::with_display(config, bound, move |conn, screen| {
        Ok(run_batch(conn, screen, &batch, options, &|| {
            acquire_capture_slot(&runtime, probe_timeout)
        }))
    })
    .await?
}

/// One capture at a time, also from inside a batch (which runs on a
/// blocking thread, so it waits for the slot by blocking on the runtime).
fn acquire_capture_slot(
    runtime: &tokio::runtime::Handle,
    bound: Duration,
) -> Result<tokio::sync::SemaphorePermit<'static>, XError> {
    runtime.block_on(async {
        tokio::time::timeout(bound, screenshot::CAPTURE_SLOT.acquire())
            .await
            .map_err(|_| XError::Timeout(bound))?
            .map_err(|e| XError::Join(e.to_string()))
    })
}

/// A capture-slot source: the socket path blocks on the runtime; tests on
/// a plain thread take it directly.
type SlotFn<'a> = dyn Fn() -> Result<tokio::sync::SemaphorePermit<'static>, XError> + 'a;

/// Runs a batch on an open connection (blocking): validation against the
/// root window of `screen`, then the actions in order. Errors of single
/// actions end the batch and are in its results.
pub fn run_batch_blocking(
    conn: &RustConnection,
    screen: usize,
    batch: &ActionBatch,
    options: InputOptions,
) -> Result<BatchOutcome, ExecuteError> {
    run_batch(conn, screen, batch, options, &|| {
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
    Ok(BatchOutcome {
        answer: GuestActionResults {
            results,
            image_lens,
        },
        images: run.images,
    })
}

/// Whether the action presses a mouse button (the wheel aside).
fn presses_a_button(name: ActionName) -> bool {
    matches!(
        name,
        ActionName::LeftMouseDown
            | ActionName::LeftClick
            | ActionName::LeftClickDrag
            | ActionName::RightClick
            | ActionName::MiddleClick
            | ActionName::DoubleClick
            | ActionName::TripleClick
    )
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
    image_bytes: usize,
    xtest: bool,
    slot: &'a SlotFn<'a>,
    /// `WM_PROTOCOLS` and `_NET_WM_PING`, once interned.
    ping_atoms: Option<(u32, u32)>,
    pings: u32,
    /// Keys pressed since the last [`Runner::settle`].
    keys_since_settle: u32,
    /// The last point the pointer was sent to, on the screen.
    pointer: Option<(i16, i16)>,
}

impl Runner<'_> {
    fn one(&mut self, action: &Action) -> Result<ActionResult, ActionError> {
        let name = action.name();
        let needs_xtest = !matches!(
            action,
            Action::CursorPosition {}
                | Action::Screenshot {}
                | Action::Zoom { .. }
                | Action::Wait { .. }
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
            Action::Screenshot {} => {
                let spec = CaptureSpec {
                    region: None,
                    size: (!self.space.is_native())
                        .then_some((self.space.caller.width, self.space.caller.height)),
                    cursor: self.cursor,
                };
                return self.capture(name, &spec);
            }
            Action::Zoom { region } => {
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
                };
                return self.capture(name, &spec);
            }
        }
        Ok(ActionResult::ok(name))
    }

    fn capture(
        &mut self,
        name: ActionName,
        spec: &CaptureSpec,
    ) -> Result<ActionResult, ActionError> {
        let limit = dormouse_protocol::MAX_PAYLOAD_LEN;
        let room = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(self.image_bytes);
        let _slot = (self.slot)()?;
        let mut png = screenshot::BoundedVec::new(room);
        let stats = screenshot::encode(self.conn, self.screen, spec, &mut png).map_err(|e| {
            if screenshot::is_too_large(&e) {
                ActionError::TooLarge(limit)
            } else {
                ActionError::Screenshot(e)
            }
        })?;
        let png = png.into_inner();
        self.image_bytes += png.len();
        self.images.push(png);
        Ok(ActionResult {
            image: Some(ActionImage {
                media_type: "image/png".into(),
                data: String::new(),
            }),
            size: Some([stats.width, stats.height]),
            ..ActionResult::ok(name)
        })
    }

    fn keymap(&mut self) -> Result<&mut Keymap, ActionError> {
        if self.keymap.is_none() {
            self.keymap = Some(Keymap::load(self.conn)?);
        }
        self.keymap
            .as_mut()
            .ok_or_else(|| ActionError::X(XError::Unexpected("keymap".into())))
    }

    /// The keycodes of a modifier combination, bound where needed.
    fn combo(&mut self, text: &str) -> Result<Vec<KeyAt>, ActionError> {
        let combo = actions::parse_combo(text).map_err(|p| invalid(ActionName::Key, p))?;
        self.resolve(&combo, text)
    }

    /// Keysyms to keys: those of the layout (level 1, or level 2 with
    /// Shift as xdotool does), the others bound to spare keycodes.
    fn resolve(&mut self, combo: &[u32], text: &str) -> Result<Vec<KeyAt>, ActionError> {
        let conn = self.conn;
        let keymap = self.keymap()?;
        let shortcut = combo.iter().any(|s| SHORTCUT_MODIFIERS.contains(s));
        let mut keys = Vec::with_capacity(combo.len());
        for sym in combo {
            let at = match keymap.find(*sym, true) {
                Some(at) => at,
                // A shortcut with a Latin letter or digit the layout lacks
                // (ctrl+a under a Cyrillic layout): the key at that
                // character's place on a US keyboard, as a person presses
                // it; applications match shortcuts by that place.
                None => {
                    match us_position(*sym).filter(|(k, _)| shortcut && !keymap.is_modifier(*k)) {
                        Some((keycode, shift)) => KeyAt { keycode, shift },
                        None => keymap
                            .bind(*sym, false)
                            .ok_or_else(|| ActionError::NoSpareKeycode(text.to_owned()))?,
                    }
                }
            };
            keys.push(at);
        }
        if keymap.flush(conn)? {
            self.settle()?;
        }
        Ok(keys)
    }

    fn shift_keycode(&mut self) -> Result<Keycode, ActionError> {
        self.keymap()?
            .modifier_keycode(0)
            .ok_or(ActionError::NoModifierKey("Shift"))
    }

    fn press_all(&mut self, keys: &[KeyAt]) -> Result<(), ActionError> {
        let shift = if keys.iter().any(|k| k.shift) {
            Some(self.shift_keycode()?)
        } else {
            None
        };
        for k in keys {
            if k.shift {
                if let Some(s) = shift.filter(|s| !keys.iter().any(|o| o.keycode == *s)) {
                    self.key(s, true)?;
                }
            }
            self.key(k.keycode, true)?;
            self.keys_since_settle = self.keys_since_settle.saturating_add(1);
        }
        Ok(())
    }

    fn release_all(&mut self, keys: &[KeyAt]) -> Result<(), ActionError> {
        let shift = if keys.iter().any(|k| k.shift) {
            Some(self.shift_keycode()?)
        } else {
            None
        };
        for k in keys.iter().rev() {
            self.key(k.keycode, false)?;
        }
        if let Some(s) = shift.filter(|s| !keys.iter().any(|o| o.keycode == *s)) {
            self.key(s, false)?;
        }
        Ok(())
    }

    /// Runs `f` with `held` pressed, releasing them even when `f` fails.
    fn with_held(
        &mut self,
        held: &[KeyAt],
        f: impl FnOnce(&mut Self) -> Result<(), ActionError>,
    ) -> Result<(), ActionError> {
        self.press_all(held)?;
        let done = f(self);
        let released = self.release_all(held);
        done.and(released)
    }

    fn click(
        &mut self,
        held: &[KeyAt],
        at: Option<actions::Coordinate>,
        button: u8,
        times: u32,
    ) -> Result<(), ActionError> {
        self.with_held(held, |r| {
            r.move_opt(at)?;
            for i in 0..times {
                if i > 0 {
                    r.sync()?;
                    std::thread::sleep(MULTI_CLICK_GAP);
                }
                r.button(button, true)?;
                r.button(button, false)?;
            }
            r.buttons_released()
        })
    }

    /// Waits until the server has processed the button releases sent: while
    /// the window manager's click-to-focus grab holds the pointer frozen,
    /// pointer events queue but key events do not, so modifiers released
    /// (or keys pressed) right after a click would reach the client before
    /// the click itself (a shift-click arriving without Shift). Bounded by
    /// [`POINTER_BOUND`].
    fn buttons_released(&mut self) -> Result<(), ActionError> {
        const BUTTONS: u16 = 0x1f00;
        self.pointer_until(|p| u16::from(p.mask) & BUTTONS == 0)
            .map(drop)
    }

    /// Asks the server for the pointer until `done` holds or
    /// [`POINTER_BOUND`] passed; answers the last reply.
    fn pointer_until(
        &mut self,
        done: impl Fn(&xproto::QueryPointerReply) -> bool,
    ) -> Result<xproto::QueryPointerReply, ActionError> {
        let deadline = std::time::Instant::now() + POINTER_BOUND;
        loop {
            let p = self
                .conn
                .query_pointer(self.root)
                .map_err(XError::from)?
                .reply()
                .map_err(XError::from)?;
            if done(&p) || std::time::Instant::now() >= deadline {
                return Ok(p);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn move_opt(&mut self, at: Option<actions::Coordinate>) -> Result<(), ActionError> {
        match at {
            Some(at) => self.move_to(at),
            None => Ok(()),
        }
    }

    fn move_to(&mut self, at: actions::Coordinate) -> Result<(), ActionError> {
        let [x, y] = self.space.to_screen(at);
        let x = i16::try_from(x).map_err(|_| XError::Unexpected(format!("x {x}")))?;
        let y = i16::try_from(y).map_err(|_| XError::Unexpected(format!("y {y}")))?;
        self.conn
            .xtest_fake_input(xproto::MOTION_NOTIFY_EVENT, 0, 0, self.root, x, y, 0)
            .map_err(XError::from)?;
        self.pointer = Some((x, y));
        Ok(())
    }

    /// Where the server has the pointer, once it is where it was last sent
    /// (or [`POINTER_BOUND`] passed: then where it is, frozen or moved by
    /// someone else).
    fn pointer_settled(&mut self) -> Result<(i16, i16), ActionError> {
        let sent = self.pointer;
        let p = self.pointer_until(|p| sent.is_none_or(|s| s == (p.root_x, p.root_y)))?;
        Ok((p.root_x, p.root_y))
    }

    fn button(&mut self, button: u8, press: bool) -> Result<(), ActionError> {
        let kind = if press {
            xproto::BUTTON_PRESS_EVENT
        } else {
            xproto::BUTTON_RELEASE_EVENT
        };
        self.conn
            .xtest_fake_input(kind, button, 0, self.root, 0, 0, 0)
            .map_err(XError::from)?;
        Ok(())
    }

    fn key(&mut self, keycode: Keycode, press: bool) -> Result<(), ActionError> {
        let kind = if press {
            xproto::KEY_PRESS_EVENT
        } else {
            xproto::KEY_RELEASE_EVENT
        };
        self.conn
            .xtest_fake_input(kind, keycode, 0, self.root, 0, 0, 0)
            .map_err(XError::from)?;
        Ok(())
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

    /// Before keys that follow a click in the same batch: a click moves the
    /// keyboard focus (between windows, or inside a page) only once the
    /// client has handled it, and keys sent before that go where the focus
    /// was (Chromium sent keys typed right after a click into the element
    /// focused before it, 4 times in 6). Waits until the focused client
    /// answered a ping queued behind the click (0 in 8 misplaced), or
    /// `options.settle` for a client that cannot be pinged.
    fn hand_over_click(&mut self) -> Result<(), ActionError> {
        self.sync()?;
        if !self.ping_focus()? {
            std::thread::sleep(self.options.settle);
        }
        Ok(())
    }

    /// Waits until the client with the keyboard focus has handled all input
    /// and mapping changes sent so far: a `_NET_WM_PING` sent now is queued
    /// behind them, so its answer says so (bounded by [`PING_BOUND`]). A
    /// client without the ping protocol (or without an answer) gets
    /// `options.settle` plus [`SETTLE_PER_KEY`] for every key pressed since
    /// the last settle: a client that lags behind lags in proportion to
    /// what it was sent (capped at [`SETTLE_MAX`]).
    fn settle(&mut self) -> Result<(), ActionError> {
        let backlog = std::mem::take(&mut self.keys_since_settle);
        if !self.ping_focus()? {
            let extra = SETTLE_PER_KEY.saturating_mul(backlog);
            std::thread::sleep((self.options.settle + extra).min(SETTLE_MAX));
        }
        Ok(())
    }

    fn ping_focus(&mut self) -> Result<bool, ActionError> {
        let conn = self.conn;
        let (protocols, ping) = match self.ping_atoms {
            Some(atoms) => atoms,
            None => {
                let atoms = (
                    x_client::atom(conn, b"WM_PROTOCOLS")?,
                    x_client::atom(conn, b"_NET_WM_PING")?,
                );
                // Answers go to the root window, to those who listen there.
                conn.change_window_attributes(
                    self.root,
                    &xproto::ChangeWindowAttributesAux::new()
                        .event_mask(xproto::EventMask::SUBSTRUCTURE_NOTIFY),
                )
                .map_err(XError::from)?;
                self.ping_atoms = Some(atoms);
                atoms
            }
        };
        let Some(target) = self.ping_target(protocols, ping)? else {
            return Ok(false);
        };
        self.pings = self.pings.wrapping_add(1);
        // A timestamp of its own, so another client's answers do not count.
        let stamp = 0x444d_0000 | (self.pings & 0xffff);
        let message =
            xproto::ClientMessageEvent::new(32, target, protocols, [ping, stamp, target, 0, 0]);
        conn.send_event(false, target, xproto::EventMask::NO_EVENT, message)
            .map_err(XError::from)?;
        conn.flush().map_err(XError::from)?;
        let deadline = std::time::Instant::now() + PING_BOUND;
        loop {
            match conn.poll_for_event().map_err(XError::from)? {
                Some(Event::ClientMessage(m)) if m.type_ == protocols => {
                    let data = m.data.as_data32();
                    if data[0] == ping && data[1] == stamp {
                        return Ok(true);
                    }
                }
                Some(_) => {}
                None if std::time::Instant::now() >= deadline => return Ok(false),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    /// The window that takes the keyboard now and speaks `_NET_WM_PING`:
    /// the focus window or one of its ancestors; with the focus following
    /// the pointer, the windows under the pointer.
    fn ping_target(&self, protocols: u32, ping: u32) -> Result<Option<u32>, ActionError> {
        let conn = self.conn;
        let speaks_ping = |w: u32| -> Result<bool, ActionError> {
            let reply = conn
                .get_property(false, w, protocols, xproto::AtomEnum::ATOM, 0, 64)
                .map_err(XError::from)?
                .reply();
            Ok(match reply {
                Ok(r) => r.value32().is_some_and(|mut v| v.any(|a| a == ping)),
                // The window went away meanwhile.
                Err(_) => false,
            })
        };
        let focus = conn
            .get_input_focus()
            .map_err(XError::from)?
            .reply()
            .map_err(XError::from)?
            .focus;
        let mut candidates = Vec::new();
        if focus > 1 && focus != self.root {
            // Up from the focus window.
            let mut w = focus;
            for _ in 0..32 {
                if w == 0 || w == self.root {
                    break;
                }
                candidates.push(w);
                w = match conn.query_tree(w).map_err(XError::from)?.reply() {
                    Ok(t) => t.parent,
                    Err(_) => break,
                };
            }
        } else {
            // Down along the pointer.
            let mut w = self.root;
            for _ in 0..32 {
                let child = match conn.query_pointer(w).map_err(XError::from)?.reply() {
                    Ok(p) => p.child,
                    Err(_) => break,
                };
                if child == 0 {
                    break;
                }
                candidates.push(child);
                w = child;
            }
        }
        for w in candidates {
            if speaks_ping(w)? {
                return Ok(Some(w));
            }
        }
        Ok(None)
    }

    /// Types `text` exactly: each character from the layout where it has
    /// it at level 1 or 2, otherwise bound to a spare keycode; as many
    /// characters per chunk as there are spare keycodes, each chunk bound
    /// in one go and confirmed by a round trip before its keys are sent.
    fn type_text(&mut self, text: &str) -> Result<(), ActionError> {
        let pointer = self
            .conn
            .query_pointer(self.root)
            .map_err(XError::from)?
            .reply()
            .map_err(XError::from)?;
        let mask = u16::from(pointer.mask);
        let shortcut = u16::from(KeyButMask::CONTROL | KeyButMask::MOD1 | KeyButMask::MOD4);
        if mask & shortcut != 0 {
            return Err(ActionError::ModifiersActive(mask & shortcut));
        }
        // Shift, Caps Lock, a level-3 or level-5 latch or another group
        // change what the layout's keys type: then every character goes
        // through a binding, which types the same whatever is held.
        let level_changers =
            u16::from(KeyButMask::SHIFT | KeyButMask::LOCK | KeyButMask::MOD3 | KeyButMask::MOD5)
                | 0x6000;
        let plain = mask & level_changers == 0;
        let chars = typed_keysyms(text);
        let shift = self.keymap()?.modifier_keycode(0);
        let mut i = 0;
        while i < chars.len() {
            let mut chunk: Vec<KeyAt> = Vec::new();
            {
                let keymap = self.keymap()?;
                while let Some((primary, legacy)) = chars.get(i).copied() {
                    let found = if plain {
                        keymap
                            .find(primary, shift.is_some())
                            .or_else(|| legacy.and_then(|l| keymap.find(l, shift.is_some())))
                    } else {
                        None
                    };
                    // Two keysyms per spare keycode when Shift types
                    // as the layout says (nothing else is held).
                    let two_levels = plain && shift.is_some();
                    match found.or_else(|| keymap.bind(primary, two_levels)) {
                        Some(at) => chunk.push(at),
                        None => break,
                    }
                    i += 1;
                }
            }
            if chunk.is_empty() {
                let c = keysym::char_of_keysym(chars.get(i).map_or(0, |c| c.0));
                return Err(ActionError::NoSpareKeycode(
                    c.map(String::from).unwrap_or_default(),
                ));
            }
            let conn = self.conn;
            if self.keymap()?.flush(conn)? {
                self.settle()?;
            }
            for at in &chunk {
                let keys = [*at];
                self.press_all(&keys)?;
                self.release_all(&keys)?;
                if !self.options.char_delay.is_zero() {
                    self.sync()?;
                    std::thread::sleep(self.options.char_delay);
                }
            }
            self.sync()?;
            if i < chars.len() {
                self.settle()?;
                self.keymap()?.restore(conn)?;
            }
        }
        Ok(())
    }
}

/// The keysyms that type `text`, one per character: the Unicode-rule
/// keysym and the legacy one a layout may carry instead. `\n` (and `\r\n`,
/// and a lone `\r`) is Return, `\t` is Tab.
pub fn typed_keysyms(text: &str) -> Vec<(u32, Option<u32>)> {
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                (RETURN, None)
            }
            '\n' => (RETURN, None),
            '\t' => (TAB, None),
            c => (keysym::keysym_of_char(c), keysym::legacy_keysym_of_char(c)),
        });
    }
    out
}

fn invalid(name: ActionName, problem: actions::Problem) -> ActionError {
    // Validation ran before; reaching this means the batch changed under
    // it, which cannot happen. Report it as what it is anyway.
    ActionError::X(XError::Unexpected(format!("{name}: {problem}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocols_key_allowance_covers_two_settles() {
        // The shared bound grants each key action two settles of the
        // default options; a longer settle here would outgrow it.
        assert!(InputOptions::default().settle * 2 <= actions::KEY_ACTION_ALLOWANCE);
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
