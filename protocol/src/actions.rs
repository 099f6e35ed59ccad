//! Computer-use actions: the batch a client sends, what each action
//! returned, and the validation both the broker and the supervisor run
//! before anything is executed.
//!
//! The names are those of the Anthropic computer-use tool `computer_20250124`
//! plus `zoom`, so an agent loop forwards its tool calls unchanged:
//!
//! ```json
//! {"actions": [{"action": "left_click", "coordinate": [640, 400]},
//!              {"action": "type", "text": "hello"},
//!              {"action": "key", "text": "ctrl+l"}],
//!  "scale": {"width": 1024, "height": 768}}
//! ```
//!
//! This module owns the *shape* and the *limits* ([`MAX_ACTIONS`],
//! [`MAX_TEXT_BYTES`], [`MAX_DURATION_SECS`], [`MAX_SCROLL_AMOUNT`], …) and the
//! scaling rule between the caller's space and the screen ([`Space`]). It
//! never executes anything and never talks to X.
//!
//! # The scaling rule
//!
//! With `scale` `{width: sw, height: sh}` on a `W`×`H` screen, the caller's
//! space is the screen shrunk to fit inside `sw`×`sh` with its aspect kept,
//! never enlarged ([`Space::fit`]): 1280×800 into 1024×768 is 1024×640. Every
//! coordinate of every action is in that space, and every screenshot and
//! `cursor_position` answer is too. A point `x` of the caller's space means
//! the screen pixel under the centre of the scaled pixel,
//! `floor((x + ½)·W/w)`; a screen point goes back to the nearest scaled
//! point, halves rounding down, so `mouse_move` then `cursor_position`
//! answers the point that was sent.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

pub mod keysym;
mod keysym_table;

/// Most actions in one batch.
pub const MAX_ACTIONS: usize = 100;
/// Longest `text` of one action, in bytes of UTF-8.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Longest `duration` of one `wait` or `hold_key`, in seconds.
pub const MAX_DURATION_SECS: f64 = 30.0;
/// Longest sum of the durations of one batch, in seconds: a batch must end
/// well within a client's patience and the broker's request bound.
pub const MAX_BATCH_DURATION_SECS: f64 = 60.0;
/// Most bytes of text of one batch, all its `text` fields together: the
/// batch must fit one guest-socket message ([`crate::MAX_HEADER_LEN`])
/// whatever its escaping, and its typing must end within the bounds.
pub const MAX_BATCH_TEXT_BYTES: usize = 96 * 1024;
/// Most `screenshot` and `zoom` actions of one batch: their images are held
/// together until the batch answers.
pub const MAX_IMAGES: usize = 10;
/// Most wheel clicks of one `scroll`.
pub const MAX_SCROLL_AMOUNT: u32 = 100;
/// Most keys of one combination (`ctrl+shift+alt+t` is 4) and most
/// combinations of one `key` text (`ctrl+a Delete` is 2).
pub const MAX_KEYS: usize = 16;
/// Largest width or height of `scale` (and of any screen this code maps).
pub const MAX_SIDE: u32 = 16_384;

/// A point `[x, y]` in the caller's space.
pub type Coordinate = [i64; 2];

/// An ordered batch of actions, executed in order, stopping at the first
/// failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionBatch {
    /// The actions, in order. At most [`MAX_ACTIONS`]; refused while parsing
    /// beyond that, each parse error naming its action's index.
    #[serde(deserialize_with = "actions_in_order")]
    pub actions: Vec<Action>,
    /// The size of the caller's space (see the module's scaling rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<Scale>,
    /// Whether `screenshot` and `zoom` images show the pointer (off unless
    /// asked: the tool's screenshots have none).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cursor: bool,
}

// A batch is compared whole, as the guest `Request` holding it is: its only
// floats are durations, which JSON cannot make NaN and validation refuses
// unless finite, so equality is an equivalence on every batch that exists.
impl Eq for ActionBatch {}
impl Eq for Action {}

/// The box the caller's space must fit in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    /// Most pixels across.
    pub width: u32,
    /// Most pixels down.
    pub height: u32,
}

/// Which way a `scroll` turns the wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScrollDirection {
    /// Wheel up (button 4).
    Up,
    /// Wheel down (button 5).
    Down,
    /// Wheel left (button 6).
    Left,
    /// Wheel right (button 7).
    Right,
}

/// One action. `text` on click, mouse-button and scroll actions names
/// modifier keys held around it (`"shift"`, `"ctrl+alt"`), as in the tool;
/// an absent `coordinate` there means where the pointer is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Press and release key combinations in xdotool spelling: `+` joins
    /// keys pressed together, spaces separate combinations
    /// (`"ctrl+a Delete"`).
    Key {
        /// The combinations.
        text: String,
    },
    /// Hold a key combination for `duration` seconds.
    HoldKey {
        /// The combination.
        text: String,
        /// Seconds, `0..=MAX_DURATION_SECS`.
        duration: f64,
    },
    /// Type text exactly, under whatever keyboard layout is active.
    Type {
        /// The text; `\n` is Return, `\t` is Tab.
        text: String,
    },
    /// Answer where the pointer is.
    CursorPosition {},
    /// Move the pointer.
    MouseMove {
        /// Where to.
        coordinate: Coordinate,
        /// Modifiers held while moving.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Press the left button (and keep it pressed).
    LeftMouseDown {
        /// Where, or where the pointer is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinate: Option<Coordinate>,
        /// Modifiers held while pressing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Release the left button.
    LeftMouseUp {
        /// Where, or where the pointer is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinate: Option<Coordinate>,
        /// Modifiers held while releasing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Click the left button.
    LeftClick {
        /// Where, or where the pointer is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinate: Option<Coordinate>,
        /// Modifiers held around the click.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Press the left button at `start_coordinate`, move to `coordinate`,
    /// release.
    LeftClickDrag {
        /// Where the drag starts.
        start_coordinate: Coordinate,
        /// Where it ends.
        coordinate: Coordinate,
        /// Modifiers held throughout.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Click the right button.
    RightClick {
        /// Where, or where the pointer is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinate: Option<Coordinate>,
        /// Modifiers held around the click.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Click the middle button.
    MiddleClick {
        /// Where, or where the pointer is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinate: Option<Coordinate>,
        /// Modifiers held around the click.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Click the left button twice.
    DoubleClick {
        /// Where, or where the pointer is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinate: Option<Coordinate>,
        /// Modifiers held around the clicks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Click the left button three times.
    TripleClick {
        /// Where, or where the pointer is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinate: Option<Coordinate>,
        /// Modifiers held around the clicks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Turn the wheel.
    Scroll {
        /// Where, or where the pointer is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinate: Option<Coordinate>,
        /// Which way.
        scroll_direction: ScrollDirection,
        /// How many clicks, `1..=MAX_SCROLL_AMOUNT`.
        scroll_amount: u32,
        /// Modifiers held while scrolling.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Do nothing for `duration` seconds.
    Wait {
        /// Seconds, `0..=MAX_DURATION_SECS`.
        duration: f64,
    },
    /// Answer a PNG of the screen (in the caller's space).
    Screenshot {},
    /// Answer a PNG of a region `[x0, y0, x1, y1]` (caller's space; `x1`,
    /// `y1` exclusive) at the screen's native resolution.
    Zoom {
        /// The region.
        region: [i64; 4],
    },
}

/// The name of an action, as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ActionName {
    Key,
    HoldKey,
    Type,
    CursorPosition,
    MouseMove,
    LeftMouseDown,
    LeftMouseUp,
    LeftClick,
    LeftClickDrag,
    RightClick,
    MiddleClick,
    DoubleClick,
    TripleClick,
    Scroll,
    Wait,
    Screenshot,
    Zoom,
}

impl ActionName {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::HoldKey => "hold_key",
            Self::Type => "type",
            Self::CursorPosition => "cursor_position",
            Self::MouseMove => "mouse_move",
            Self::LeftMouseDown => "left_mouse_down",
            Self::LeftMouseUp => "left_mouse_up",
            Self::LeftClick => "left_click",
            Self::LeftClickDrag => "left_click_drag",
            Self::RightClick => "right_click",
            Self::MiddleClick => "middle_click",
            Self::DoubleClick => "double_click",
            Self::TripleClick => "triple_click",
            Self::Scroll => "scroll",
            Self::Wait => "wait",
            Self::Screenshot => "screenshot",
            Self::Zoom => "zoom",
        }
    }
}

impl std::fmt::Display for ActionName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Action {
    /// This action's name.
    pub fn name(&self) -> ActionName {
        match self {
            Self::Key { .. } => ActionName::Key,
            Self::HoldKey { .. } => ActionName::HoldKey,
            Self::Type { .. } => ActionName::Type,
            Self::CursorPosition {} => ActionName::CursorPosition,
            Self::MouseMove { .. } => ActionName::MouseMove,
            Self::LeftMouseDown { .. } => ActionName::LeftMouseDown,
            Self::LeftMouseUp { .. } => ActionName::LeftMouseUp,
            Self::LeftClick { .. } => ActionName::LeftClick,
            Self::LeftClickDrag { .. } => ActionName::LeftClickDrag,
            Self::RightClick { .. } => ActionName::RightClick,
            Self::MiddleClick { .. } => ActionName::MiddleClick,
            Self::DoubleClick { .. } => ActionName::DoubleClick,
            Self::TripleClick { .. } => ActionName::TripleClick,
            Self::Scroll { .. } => ActionName::Scroll,
            Self::Wait { .. } => ActionName::Wait,
            Self::Screenshot {} => ActionName::Screenshot,
            Self::Zoom { .. } => ActionName::Zoom,
        }
    }

    /// Seconds this action waits or holds by itself.
    pub fn duration(&self) -> f64 {
        match self {
            Self::HoldKey { duration, .. } | Self::Wait { duration } => *duration,
            _ => 0.0,
        }
    }

    /// The modifier keys held around a pointer action (`text` there).
    pub fn modifiers(&self) -> Option<&str> {
        match self {
            Self::MouseMove { text, .. }
            | Self::LeftMouseDown { text, .. }
            | Self::LeftMouseUp { text, .. }
            | Self::LeftClick { text, .. }
            | Self::LeftClickDrag { text, .. }
            | Self::RightClick { text, .. }
            | Self::MiddleClick { text, .. }
            | Self::DoubleClick { text, .. }
            | Self::TripleClick { text, .. }
            | Self::Scroll { text, .. } => text.as_deref(),
            _ => None,
        }
    }
}

/// The PNG an action returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionImage {
    /// Always `image/png`.
    pub media_type: String,
    /// The PNG, base64 (standard alphabet, padded).
    pub data: String,
}

/// Why an action failed while running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionErrorBody {
    /// Stable machine-readable code (`x_error`, `no_spare_keycode`,
    /// `modifiers_active`, `screenshot_failed`, `timeout`, …).
    pub code: String,
    /// For people.
    pub message: String,
}

/// What one action did. A batch's answer lists one per action that ran, in
/// order; the last is the failing one if the batch stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionResult {
    /// The action's name.
    pub action: ActionName,
    /// Whether it did what it was asked.
    pub ok: bool,
    /// `cursor_position`: where the pointer is, in the caller's space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinate: Option<[i64; 2]>,
    /// `screenshot`, `zoom`: the PNG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ActionImage>,
    /// `screenshot`, `zoom`: the PNG's size `[width, height]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<[u32; 2]>,
    /// When `ok` is false: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ActionErrorBody>,
}

impl ActionResult {
    /// A success with nothing to return.
    pub fn ok(action: ActionName) -> Self {
        Self {
            action,
            ok: true,
            coordinate: None,
            image: None,
            size: None,
            error: None,
        }
    }

    /// A failure.
    pub fn failed(action: ActionName, code: &str, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(ActionErrorBody {
                code: code.to_owned(),
                message: message.into(),
            }),
            ..Self::ok(action)
        }
    }
}

/// The answer to a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionResults {
    /// One per action that ran, in order.
    pub results: Vec<ActionResult>,
}

/// How the guest answers a batch: the results with every image's `data`
/// left empty, the images' bytes one after the other in the frame's binary
/// payload, in result order, `image_lens[i]` bytes for the `i`-th image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestActionResults {
    /// One per action that ran, in order.
    pub results: Vec<ActionResult>,
    /// Length of each image in the payload.
    pub image_lens: Vec<u64>,
}

/// A guest answer whose images do not match its payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the answer names {images} images of {named} bytes in all; the payload has {payload} bytes"
)]
pub struct PayloadMismatch {
    /// Results carrying an image.
    pub images: usize,
    /// Sum of `image_lens` (saturating).
    pub named: u64,
    /// Bytes in the payload.
    pub payload: usize,
}

impl GuestActionResults {
    /// The API answer: each image's bytes from `payload`, base64-encoded
    /// into its `data`. Every image result must have its length and the
    /// lengths must add up to the payload exactly.
    pub fn into_api(self, payload: &[u8]) -> Result<ActionResults, PayloadMismatch> {
        let images = self.results.iter().filter(|r| r.image.is_some()).count();
        let named = self
            .image_lens
            .iter()
            .fold(0u64, |a, b| a.saturating_add(*b));
        let mismatch = PayloadMismatch {
            images,
            named,
            payload: payload.len(),
        };
        if images != self.image_lens.len() || u64::try_from(payload.len()).ok() != Some(named) {
            return Err(mismatch);
        }
        let mut rest = payload;
        let mut lens = self.image_lens.iter();
        let mut results = self.results;
        for image in results.iter_mut().filter_map(|r| r.image.as_mut()) {
            let len = lens
                .next()
                .and_then(|l| usize::try_from(*l).ok())
                .ok_or_else(|| mismatch.clone())?;
            let (bytes, tail) = rest.split_at_checked(len).ok_or_else(|| mismatch.clone())?;
            image.data = base64(bytes);
            rest = tail;
        }
        Ok(ActionResults { results })
    }
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A size in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Size {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
}

/// The caller's space on a screen: its size and the mapping of points
/// between it and the screen (see the module's scaling rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// The screen.
    pub screen: Size,
    /// The caller's space (equal to `screen` without `scale`).
    pub caller: Size,
}

impl Space {
    /// The caller's space for `scale` on `screen`: `screen` shrunk to fit
    /// inside `scale` with its aspect kept (each side at least 1), never
    /// enlarged; `screen` itself without `scale`.
    pub fn fit(screen: Size, scale: Option<Scale>) -> Self {
        let Some(scale) = scale else {
            return Self {
                screen,
                caller: screen,
            };
        };
        let (sw, sh) = (u64::from(screen.width), u64::from(screen.height));
        let (bw, bh) = (u64::from(scale.width), u64::from(scale.height));
        if sw == 0 || sh == 0 || (bw >= sw && bh >= sh) {
            return Self {
                screen,
                caller: screen,
            };
        }
        // Width limits when bw/sw <= bh/sh.
        let (w, h) = if bw * sh <= bh * sw {
            (bw, (sh * bw + sw / 2) / sw)
        } else {
            ((sw * bh + sh / 2) / sh, bh)
        };
        let side = |v: u64, max: u32| u32::try_from(v.clamp(1, u64::from(max))).unwrap_or(max);
        Self {
            screen,
            caller: Size {
                width: side(w, screen.width),
                height: side(h, screen.height),
            },
        }
    }

    /// Whether the caller's space is the screen itself.
    pub fn is_native(&self) -> bool {
        self.screen == self.caller
    }

    /// A caller's point on the screen (the caller's point must be inside
    /// its space; the result is clamped to the screen either way).
    pub fn to_screen(&self, [x, y]: Coordinate) -> [u32; 2] {
        [
            to_native(x, self.caller.width, self.screen.width),
            to_native(y, self.caller.height, self.screen.height),
        ]
    }

    /// A region's corner on the screen: exclusive ends map to exclusive
    /// ends, so a region covering the caller's whole space covers the
    /// whole screen.
    pub fn edge_to_screen(&self, [x, y]: Coordinate) -> [u32; 2] {
        [
            edge_to_native(x, self.caller.width, self.screen.width),
            edge_to_native(y, self.caller.height, self.screen.height),
        ]
    }

    /// A screen point in the caller's space.
    pub fn to_caller(&self, [x, y]: [i64; 2]) -> [i64; 2] {
        [
            to_scaled(x, self.screen.width, self.caller.width),
            to_scaled(y, self.screen.height, self.caller.height),
        ]
    }
}

/// `floor((v + ½)·native/scaled)`, clamped to the screen.
fn to_native(v: i64, scaled: u32, native: u32) -> u32 {
    if scaled == 0 || native == 0 {
        return 0;
    }
    let v = v.clamp(0, i64::from(scaled) - 1);
    let n = (2 * v + 1) * i64::from(native) / (2 * i64::from(scaled));
    u32::try_from(n.clamp(0, i64::from(native) - 1)).unwrap_or(0)
}

/// `round(v·native/scaled)` for region edges, clamped to `0..=native`.
fn edge_to_native(v: i64, scaled: u32, native: u32) -> u32 {
    if scaled == 0 {
        return 0;
    }
    let v = v.clamp(0, i64::from(scaled));
    let n = (2 * v * i64::from(native) + i64::from(scaled)) / (2 * i64::from(scaled));
    u32::try_from(n.clamp(0, i64::from(native))).unwrap_or(0)
}

/// The nearest scaled point, halves rounding down: `ceil(n·s/N − ½)`,
/// clamped to the caller's space.
fn to_scaled(n: i64, native: u32, scaled: u32) -> i64 {
    if native == 0 || scaled == 0 {
        return 0;
    }
    let (native, scaled) = (i64::from(native), i64::from(scaled));
    let q = 2 * n.clamp(0, native - 1) * scaled - native;
    let v = if q <= 0 {
        0
    } else {
        (q + 2 * native - 1) / (2 * native)
    };
    v.clamp(0, scaled - 1)
}

/// Why a batch was refused before anything ran.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchError {
    /// No actions.
    #[error("a batch needs at least one action")]
    Empty,
    /// More than [`MAX_ACTIONS`].
    #[error("a batch holds at most {MAX_ACTIONS} actions, this one {0}")]
    TooMany(usize),
    /// `scale` with a side of 0 or above [`MAX_SIDE`].
    #[error("scale {width}x{height}: each side must be 1..={MAX_SIDE}")]
    BadScale {
        /// Asked width.
        width: u32,
        /// Asked height.
        height: u32,
    },
    /// The durations add up to more than [`MAX_BATCH_DURATION_SECS`].
    #[error("the durations of the batch add up to {0} s, at most {MAX_BATCH_DURATION_SECS} s")]
    TooLong(f64),
    /// The `text` fields add up to more than [`MAX_BATCH_TEXT_BYTES`].
    #[error("the texts of the batch add up to {0} bytes, at most {MAX_BATCH_TEXT_BYTES}")]
    TooMuchText(usize),
    /// More than [`MAX_IMAGES`] `screenshot` and `zoom` actions.
    #[error("a batch takes at most {MAX_IMAGES} screenshots and zooms, this one {0}")]
    TooManyImages(usize),
    /// One action is invalid.
    #[error("actions[{index}] ({action}): {field}: {problem}")]
    Action {
        /// Its index in the batch.
        index: usize,
        /// Its name.
        action: ActionName,
        /// The offending field (`text`, `coordinate`, `duration`, …).
        field: &'static str,
        /// What is wrong with it.
        problem: Problem,
    },
}

impl BatchError {
    /// The API error code of every refusal.
    pub const CODE: &'static str = "invalid_actions";
}

/// What is wrong with one field of an action.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    /// A key name no table or rule knows.
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    /// An empty key name or combination (`"ctrl+"`, `""`).
    #[error("empty key in {0:?}")]
    EmptyKey(String),
    /// More than [`MAX_KEYS`] keys or combinations.
    #[error("more than {MAX_KEYS} keys")]
    TooManyKeys,
    /// Longer than [`MAX_TEXT_BYTES`].
    #[error("{0} bytes of text, at most {MAX_TEXT_BYTES}")]
    TextTooLong(usize),
    /// A duration that is negative, not a number, or too long.
    #[error("duration {0} s is not within 0..={MAX_DURATION_SECS} s")]
    Duration(f64),
    /// A scroll amount of 0 or above [`MAX_SCROLL_AMOUNT`].
    #[error("scroll amount {0} is not within 1..={MAX_SCROLL_AMOUNT}")]
    ScrollAmount(u32),
    /// A point outside the caller's space.
    #[error("[{x}, {y}] is outside the {width}x{height} space")]
    OffScreen {
        /// The point.
        x: i64,
        /// The point.
        y: i64,
        /// The caller's space.
        width: u32,
        /// The caller's space.
        height: u32,
    },
    /// A control character no key types.
    #[error("{0:?} cannot be typed (control characters other than tab and newline)")]
    Untypable(char),
    /// A region that is empty or reaches outside the caller's space.
    #[error(
        "region {0:?} is empty or outside the {1}x{2} space (x0 < x1 <= width, y0 < y1 <= height)"
    )]
    Region([i64; 4], u32, u32),
}

/// Whether `type` can type `c`: every character but the control
/// characters other than tab, newline and carriage return (`\r\n` and a
/// lone `\r` are typed as Return).
pub fn typable(c: char) -> bool {
    !c.is_control() || matches!(c, '\t' | '\n' | '\r')
}

/// Parses one key combination (`ctrl+shift+t`, `KP_Enter`, `ctrl++`) into
/// keysyms, in press order.
pub fn parse_combo(combo: &str) -> Result<Vec<u32>, Problem> {
    if combo.is_empty() {
        return Err(Problem::EmptyKey(combo.to_owned()));
    }
    let mut names: Vec<&str> = Vec::new();
    // `+` alone or last after a `+` is the plus key itself.
    let mut rest = combo;
    loop {
        if rest == "+" {
            names.push("plus");
            break;
        }
        match rest.split_once('+') {
            Some((name, tail)) => {
                if name.is_empty() {
                    return Err(Problem::EmptyKey(combo.to_owned()));
                }
                names.push(name);
                if tail.is_empty() {
                    return Err(Problem::EmptyKey(combo.to_owned()));
                }
                rest = tail;
            }
            None => {
                names.push(rest);
                break;
            }
        }
        if names.len() > MAX_KEYS {
            return Err(Problem::TooManyKeys);
        }
    }
    if names.len() > MAX_KEYS {
        return Err(Problem::TooManyKeys);
    }
    names
        .into_iter()
        .map(|n| keysym::keysym_from_name(n).ok_or_else(|| Problem::UnknownKey(n.to_owned())))
        .collect()
}

/// Parses a `key` text: combinations separated by whitespace.
pub fn parse_key_text(text: &str) -> Result<Vec<Vec<u32>>, Problem> {
    let combos: Vec<&str> = text.split_whitespace().collect();
    if combos.is_empty() {
        return Err(Problem::EmptyKey(text.to_owned()));
    }
    if combos.len() > MAX_KEYS {
        return Err(Problem::TooManyKeys);
    }
    combos.into_iter().map(parse_combo).collect()
}

/// Checks a batch before anything runs: a non-empty batch of at most
/// [`MAX_ACTIONS`], a sane `scale`, known keys, texts of at most
/// [`MAX_TEXT_BYTES`], durations within bounds (each and summed), scroll
/// amounts within bounds, and every coordinate and region inside the
/// caller's space.
///
/// `screen` is the screen's size when the caller knows it (the supervisor
/// always does); without it, and without `scale`, coordinates are only
/// checked to be non-negative and within [`MAX_SIDE`]. Returns the caller's
/// space (with the screen unknown, the screen is taken as [`MAX_SIDE`]
/// square). The first problem found is returned, naming the action's index
/// and the field.
pub fn validate(batch: &ActionBatch, screen: Option<Size>) -> Result<Space, BatchError> {
    if batch.actions.is_empty() {
        return Err(BatchError::Empty);
    }
    if batch.actions.len() > MAX_ACTIONS {
        return Err(BatchError::TooMany(batch.actions.len()));
    }
    if let Some(s) = batch.scale {
        if !(1..=MAX_SIDE).contains(&s.width) || !(1..=MAX_SIDE).contains(&s.height) {
            return Err(BatchError::BadScale {
                width: s.width,
                height: s.height,
            });
        }
    }
    let space = match screen {
        Some(screen) => Space::fit(screen, batch.scale),
        None => {
            let caller = batch.scale.map_or(
                Size {
                    width: MAX_SIDE,
                    height: MAX_SIDE,
                },
                |s| Size {
                    width: s.width,
                    height: s.height,
                },
            );
            Space {
                screen: caller,
                caller,
            }
        }
    };
    let mut total = 0.0;
    let (mut text, mut images) = (0usize, 0usize);
    for (index, action) in batch.actions.iter().enumerate() {
        let fail = |field: &'static str, problem: Problem| BatchError::Action {
            index,
            action: action.name(),
            field,
            problem,
        };
        check_action(action, space.caller).map_err(|(f, p)| fail(f, p))?;
        total += action.duration();
        text = text.saturating_add(action.modifiers().map_or(0, str::len));
        match action {
            Action::Key { text: t }
            | Action::HoldKey { text: t, .. }
            | Action::Type { text: t } => {
                text = text.saturating_add(t.len());
            }
            Action::Screenshot {} | Action::Zoom { .. } => images += 1,
            _ => {}
        }
    }
    if total > MAX_BATCH_DURATION_SECS {
        return Err(BatchError::TooLong(total));
    }
    if text > MAX_BATCH_TEXT_BYTES {
        return Err(BatchError::TooMuchText(text));
    }
    if images > MAX_IMAGES {
        return Err(BatchError::TooManyImages(images));
    }
    Ok(space)
}

fn check_action(action: &Action, space: Size) -> Result<(), (&'static str, Problem)> {
    let point = |field: &'static str, c: &Coordinate| -> Result<(), (&'static str, Problem)> {
        let [x, y] = *c;
        if x < 0 || y < 0 || x >= i64::from(space.width) || y >= i64::from(space.height) {
            return Err((
                field,
                Problem::OffScreen {
                    x,
                    y,
                    width: space.width,
                    height: space.height,
                },
            ));
        }
        Ok(())
    };
    let duration = |d: f64| -> Result<(), (&'static str, Problem)> {
        if !(d.is_finite() && (0.0..=MAX_DURATION_SECS).contains(&d)) {
            return Err(("duration", Problem::Duration(d)));
        }
        Ok(())
    };
    let text_len = |t: &str| -> Result<(), (&'static str, Problem)> {
        if t.len() > MAX_TEXT_BYTES {
            return Err(("text", Problem::TextTooLong(t.len())));
        }
        Ok(())
    };
    if let Some(mods) = action.modifiers() {
        text_len(mods)?;
        // Modifiers are one combination; an empty text holds none.
        if !mods.trim().is_empty() {
            parse_combo(mods.trim()).map_err(|p| ("text", p))?;
        }
    }
    match action {
        Action::Key { text } => {
            text_len(text)?;
            parse_key_text(text).map_err(|p| ("text", p))?;
        }
        Action::HoldKey { text, duration: d } => {
            text_len(text)?;
            parse_combo(text.trim()).map_err(|p| ("text", p))?;
            duration(*d)?;
        }
        Action::Type { text } => {
            text_len(text)?;
            if let Some(c) = text.chars().find(|c| !typable(*c)) {
                return Err(("text", Problem::Untypable(c)));
            }
        }
        Action::Wait { duration: d } => duration(*d)?,
        Action::MouseMove { coordinate, .. } => point("coordinate", coordinate)?,
        Action::LeftMouseDown { coordinate, .. }
        | Action::LeftMouseUp { coordinate, .. }
        | Action::LeftClick { coordinate, .. }
        | Action::RightClick { coordinate, .. }
        | Action::MiddleClick { coordinate, .. }
        | Action::DoubleClick { coordinate, .. }
        | Action::TripleClick { coordinate, .. } => {
            if let Some(c) = coordinate {
                point("coordinate", c)?;
            }
        }
        Action::LeftClickDrag {
            start_coordinate,
            coordinate,
            ..
        } => {
            point("start_coordinate", start_coordinate)?;
            point("coordinate", coordinate)?;
        }
        Action::Scroll {
            coordinate,
            scroll_amount,
            ..
        } => {
            if let Some(c) = coordinate {
                point("coordinate", c)?;
            }
            if !(1..=MAX_SCROLL_AMOUNT).contains(scroll_amount) {
                return Err(("scroll_amount", Problem::ScrollAmount(*scroll_amount)));
            }
        }
        Action::Zoom { region } => {
            let [x0, y0, x1, y1] = *region;
            if x0 < 0
                || y0 < 0
                || x0 >= x1
                || y0 >= y1
                || x1 > i64::from(space.width)
                || y1 > i64::from(space.height)
            {
                return Err((
                    "region",
                    Problem::Region(*region, space.width, space.height),
                ));
            }
        }
        Action::CursorPosition {} | Action::Screenshot {} => {}
    }
    Ok(())
}

/// Deserializes the actions one by one, so a parse error names its index
/// and a hostile batch stops at [`MAX_ACTIONS`] + 1 instead of being read
/// whole.
fn actions_in_order<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Action>, D::Error> {
    struct InOrder;
    impl<'de> Visitor<'de> for InOrder {
        type Value = Vec<Action>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_ACTIONS} actions")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            loop {
                let index = out.len();
                if index == MAX_ACTIONS {
                    // One more element means too many; read no further.
                    return match seq.next_element::<de::IgnoredAny>()? {
                        None => Ok(out),
                        Some(_) => Err(de::Error::custom(format!(
                            "a batch holds at most {MAX_ACTIONS} actions"
                        ))),
                    };
                }
                match seq.next_element::<Action>() {
                    Ok(Some(action)) => out.push(action),
                    Ok(None) => return Ok(out),
                    Err(e) => return Err(de::Error::custom(format!("actions[{index}]: {e}"))),
                }
            }
        }
    }
    d.deserialize_seq(InOrder)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn batch(v: serde_json::Value) -> ActionBatch {
        serde_json::from_value(v).expect("a valid batch")
    }

    const SCREEN: Size = Size {
        width: 1280,
        height: 800,
    };

    #[test]
    fn the_contract_example_parses() {
        let b = batch(json!({"actions": [
            {"action": "left_click", "coordinate": [640, 400]},
            {"action": "type", "text": "Grüße"},
            {"action": "key", "text": "ctrl+l"},
            {"action": "scroll", "coordinate": [10, 20], "scroll_direction": "down", "scroll_amount": 3},
            {"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [3, 4]},
            {"action": "mouse_move", "coordinate": [5, 6]},
            {"action": "cursor_position"},
            {"action": "screenshot"},
            {"action": "zoom", "region": [0, 0, 100, 50]},
            {"action": "wait", "duration": 0.5},
            {"action": "hold_key", "text": "shift", "duration": 1},
            {"action": "left_mouse_down"},
            {"action": "left_mouse_up"},
            {"action": "right_click", "coordinate": [7, 8]},
            {"action": "middle_click"},
            {"action": "double_click", "coordinate": [9, 9], "text": "ctrl"},
            {"action": "triple_click", "coordinate": [9, 9]},
            {"action": "left_click", "coordinate": [1, 1], "text": "shift"},
        ], "scale": {"width": 1024, "height": 768}}));
        assert_eq!(b.actions.len(), 18);
        assert_eq!(
            b.actions[0],
            Action::LeftClick {
                coordinate: Some([640, 400]),
                text: None
            }
        );
        assert_eq!(
            b.actions[3],
            Action::Scroll {
                coordinate: Some([10, 20]),
                scroll_direction: ScrollDirection::Down,
                scroll_amount: 3,
                text: None
            }
        );
        assert_eq!(
            b.scale,
            Some(Scale {
                width: 1024,
                height: 768
            })
        );
        let space = validate(&b, Some(SCREEN)).expect("valid");
        assert_eq!(
            space.caller,
            Size {
                width: 1024,
                height: 640
            }
        );
        // Every action name round-trips through its wire name.
        for a in &b.actions {
            let v = serde_json::to_value(a).expect("serialize");
            assert_eq!(v["action"], a.name().as_str());
            assert_eq!(&serde_json::from_value::<Action>(v).expect("parse"), a);
        }
    }

    #[test]
    fn the_results_have_the_contract_shape() {
        let results = ActionResults {
            results: vec![
                ActionResult {
                    coordinate: Some([3, 4]),
                    ..ActionResult::ok(ActionName::CursorPosition)
                },
                ActionResult {
                    image: Some(ActionImage {
                        media_type: "image/png".into(),
                        data: "iVBO".into(),
                    }),
                    size: Some([1024, 640]),
                    ..ActionResult::ok(ActionName::Screenshot)
                },
                ActionResult::failed(ActionName::Type, "x_error", "gone"),
            ],
        };
        let v = serde_json::to_value(&results).expect("serialize");
        assert_eq!(
            v,
            json!({"results": [
                {"action": "cursor_position", "ok": true, "coordinate": [3, 4]},
                {"action": "screenshot", "ok": true, "image": {"media_type": "image/png", "data": "iVBO"}, "size": [1024, 640]},
                {"action": "type", "ok": false, "error": {"code": "x_error", "message": "gone"}},
            ]})
        );
        assert_eq!(
            serde_json::from_value::<ActionResults>(v).expect("parse"),
            results
        );
    }

    #[test]
    fn parse_errors_name_the_action_index() {
        let err = serde_json::from_value::<ActionBatch>(json!({"actions": [
            {"action": "screenshot"}, {"action": "fly"}
        ]}))
        .expect_err("unknown action");
        assert!(err.to_string().contains("actions[1]"), "{err}");
        assert!(err.to_string().contains("fly"), "{err}");
        let err = serde_json::from_value::<ActionBatch>(json!({"actions": [
            {"action": "left_click", "coordinates": [1, 2]}
        ]}))
        .expect_err("misspelt field");
        assert!(err.to_string().contains("coordinates"), "{err}");
        let err = serde_json::from_value::<ActionBatch>(json!({"actions": [
            {"action": "scroll", "scroll_direction": "sideways", "scroll_amount": 1}
        ]}))
        .expect_err("bad direction");
        assert!(err.to_string().contains("actions[0]"), "{err}");
    }

    #[test]
    fn more_than_the_limit_is_refused_while_parsing() {
        let many = |n: usize| json!({"actions": vec![json!({"action": "cursor_position"}); n]});
        let b: ActionBatch = serde_json::from_value(many(MAX_ACTIONS)).expect("at the limit");
        assert_eq!(b.actions.len(), MAX_ACTIONS);
        let err = serde_json::from_value::<ActionBatch>(many(MAX_ACTIONS + 1))
            .expect_err("over the limit");
        assert!(err.to_string().contains("at most 100"), "{err}");
        // Built by hand, validation refuses it too.
        let b = ActionBatch {
            actions: vec![Action::CursorPosition {}; MAX_ACTIONS + 1],
            scale: None,
            cursor: false,
        };
        assert_eq!(validate(&b, None), Err(BatchError::TooMany(101)));
        let empty = ActionBatch {
            actions: vec![],
            scale: None,
            cursor: false,
        };
        assert_eq!(validate(&empty, None), Err(BatchError::Empty));
    }

    fn refusal(v: serde_json::Value) -> BatchError {
        validate(&batch(v), Some(SCREEN)).expect_err("refused")
    }

    #[test]
    fn validation_names_index_field_and_key() {
        let e = refusal(json!({"actions": [
            {"action": "key", "text": "ctrl+l"},
            {"action": "key", "text": "ctrl+shift+Nope"}
        ]}));
        assert_eq!(
            e,
            BatchError::Action {
                index: 1,
                action: ActionName::Key,
                field: "text",
                problem: Problem::UnknownKey("Nope".into())
            }
        );
        assert!(e.to_string().contains("\"Nope\""), "{e}");
        let e = refusal(
            json!({"actions": [{"action": "left_click", "coordinate": [1, 1], "text": "hyperduper"}]}),
        );
        assert!(
            matches!(e, BatchError::Action { field: "text", problem: Problem::UnknownKey(ref k), .. } if k == "hyperduper"),
            "{e}"
        );
        let e = refusal(json!({"actions": [{"action": "key", "text": "ctrl+"}]}));
        assert!(
            matches!(
                e,
                BatchError::Action {
                    problem: Problem::EmptyKey(_),
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn validation_bounds_text_durations_scroll_and_points() {
        let long = "a".repeat(MAX_TEXT_BYTES + 1);
        let e = refusal(json!({"actions": [{"action": "type", "text": long}]}));
        assert!(matches!(
            e,
            BatchError::Action {
                index: 0,
                field: "text",
                problem: Problem::TextTooLong(65537),
                ..
            }
        ));
        let ok = "a".repeat(MAX_TEXT_BYTES);
        assert!(validate(
            &batch(json!({"actions": [{"action": "type", "text": ok}]})),
            Some(SCREEN)
        )
        .is_ok());
        let e = refusal(json!({"actions": [{"action": "type", "text": "a\u{7}b"}]}));
        assert!(matches!(
            e,
            BatchError::Action {
                problem: Problem::Untypable('\u{7}'),
                ..
            }
        ));
        let e = refusal(json!({"actions": [{"action": "wait", "duration": -0.1}]}));
        assert!(matches!(
            e,
            BatchError::Action {
                field: "duration",
                ..
            }
        ));
        let e = refusal(json!({"actions": [{"action": "hold_key", "text": "a", "duration": 31}]}));
        assert!(matches!(
            e,
            BatchError::Action {
                field: "duration",
                ..
            }
        ));
        let e = refusal(json!({"actions": [
            {"action": "wait", "duration": 30}, {"action": "wait", "duration": 30}, {"action": "wait", "duration": 1}
        ]}));
        assert!(matches!(e, BatchError::TooLong(_)), "{e}");
        let e = refusal(
            json!({"actions": [{"action": "scroll", "scroll_direction": "up", "scroll_amount": 0}]}),
        );
        assert!(matches!(
            e,
            BatchError::Action {
                field: "scroll_amount",
                ..
            }
        ));
        let e = refusal(json!({"actions": [{"action": "mouse_move", "coordinate": [1280, 10]}]}));
        assert!(matches!(
            e,
            BatchError::Action {
                field: "coordinate",
                problem: Problem::OffScreen { .. },
                ..
            }
        ));
        let e = refusal(
            json!({"actions": [{"action": "left_click_drag", "start_coordinate": [-1, 0], "coordinate": [1, 1]}]}),
        );
        assert!(matches!(
            e,
            BatchError::Action {
                field: "start_coordinate",
                ..
            }
        ));
        // In the scaled space 1024x640, x = 1100 is off screen although the
        // screen is 1280 wide.
        let e = refusal(
            json!({"actions": [{"action": "left_click", "coordinate": [1100, 10]}],
                               "scale": {"width": 1024, "height": 768}}),
        );
        assert!(e.to_string().contains("outside the 1024x640 space"), "{e}");
        let e = refusal(json!({"actions": [{"action": "zoom", "region": [10, 10, 10, 20]}]}));
        assert!(matches!(
            e,
            BatchError::Action {
                field: "region",
                ..
            }
        ));
        let e = refusal(
            json!({"actions": [{"action": "screenshot"}], "scale": {"width": 0, "height": 10}}),
        );
        assert!(matches!(e, BatchError::BadScale { .. }));
    }

    #[test]
    fn validation_bounds_the_whole_batch_text_and_images() {
        let half = "a".repeat(MAX_BATCH_TEXT_BYTES / 2);
        let e = refusal(json!({"actions": [
            {"action": "type", "text": half}, {"action": "type", "text": half},
            {"action": "key", "text": "a"}]}));
        assert_eq!(e, BatchError::TooMuchText(MAX_BATCH_TEXT_BYTES + 1));
        let shots = |n: usize| json!({"actions": vec![json!({"action": "screenshot"}); n]});
        assert!(validate(&batch(shots(MAX_IMAGES)), Some(SCREEN)).is_ok());
        assert_eq!(
            refusal(shots(MAX_IMAGES + 1)),
            BatchError::TooManyImages(11)
        );
    }

    #[test]
    fn the_scaled_space_keeps_the_aspect_and_never_enlarges() {
        let fit = |w, h, sw, sh| {
            Space::fit(
                Size {
                    width: w,
                    height: h,
                },
                Some(Scale {
                    width: sw,
                    height: sh,
                }),
            )
            .caller
        };
        assert_eq!(
            fit(1280, 800, 1024, 768),
            Size {
                width: 1024,
                height: 640
            }
        );
        assert_eq!(
            fit(1280, 800, 2000, 400),
            Size {
                width: 640,
                height: 400
            }
        );
        assert_eq!(
            fit(1280, 800, 4000, 4000),
            Size {
                width: 1280,
                height: 800
            }
        );
        assert_eq!(
            fit(1280, 800, 1, 1),
            Size {
                width: 1,
                height: 1
            }
        );
    }

    #[test]
    fn scaled_points_round_trip_through_the_screen() {
        for (w, h, sw, sh) in [
            (1280, 800, 1024, 768),
            (1920, 1080, 1366, 768),
            (1280, 800, 640, 400),
            (1024, 640, 1024, 640),
            (1280, 800, 333, 333),
        ] {
            let space = Space::fit(
                Size {
                    width: w,
                    height: h,
                },
                Some(Scale {
                    width: sw,
                    height: sh,
                }),
            );
            for x in 0..i64::from(space.caller.width) {
                let [nx, _] = space.to_screen([x, 0]);
                assert!(nx < w);
                assert_eq!(space.to_caller([i64::from(nx), 0])[0], x, "{w}->{sw} x={x}");
            }
            for y in 0..i64::from(space.caller.height) {
                let [_, ny] = space.to_screen([0, y]);
                assert_eq!(space.to_caller([0, i64::from(ny)])[1], y);
            }
        }
        let space = Space::fit(
            SCREEN,
            Some(Scale {
                width: 1024,
                height: 768,
            }),
        );
        // The centre of scaled pixel 512 is at 512.5 * 1.25 = 640.6.
        assert_eq!(space.to_screen([512, 320]), [640, 400]);
        assert_eq!(space.edge_to_screen([1024, 640]), [1280, 800]);
        assert_eq!(space.edge_to_screen([0, 0]), [0, 0]);
    }

    #[test]
    fn a_batch_and_its_answer_fit_a_kind_tagged_guest_message() {
        // The shape the guest request and answer take: a newtype variant of
        // an enum tagged by `kind`, as `Request` and `Response` are.
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        enum Message {
            Actions(ActionBatch),
            ActionResults(GuestActionResults),
        }
        let wire = json!({"kind": "actions", "actions": [{"action": "cursor_position"}],
                          "scale": {"width": 1024, "height": 768}});
        let m: Message = serde_json::from_value(wire.clone()).expect("parse");
        assert!(matches!(&m, Message::Actions(b) if b.actions.len() == 1 && b.scale.is_some()));
        assert_eq!(serde_json::to_value(&m).expect("serialize"), wire);
        let answer = json!({"kind": "action_results", "results": [
            {"action": "screenshot", "ok": true, "image": {"media_type": "image/png", "data": ""}, "size": [2, 1]}],
            "image_lens": [67]});
        let m: Message = serde_json::from_value(answer.clone()).expect("parse");
        assert_eq!(serde_json::to_value(&m).expect("serialize"), answer);
        assert!(serde_json::from_value::<Message>(
            json!({"kind": "actions", "actions": [], "bogus": 1})
        )
        .is_err());
    }

    #[test]
    fn base64_is_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(&[0xfb, 0xff, 0xfe]), "+//+");
    }

    #[test]
    fn guest_images_come_from_the_payload_in_order() {
        let shot = |a| ActionResult {
            image: Some(ActionImage {
                media_type: "image/png".into(),
                data: String::new(),
            }),
            size: Some([1, 1]),
            ..ActionResult::ok(a)
        };
        let guest = GuestActionResults {
            results: vec![
                shot(ActionName::Screenshot),
                ActionResult::ok(ActionName::Wait),
                shot(ActionName::Zoom),
            ],
            image_lens: vec![3, 1],
        };
        let api = guest.clone().into_api(b"foof").expect("matches");
        let data: Vec<_> = api
            .results
            .iter()
            .filter_map(|r| r.image.as_ref().map(|i| i.data.as_str()))
            .collect();
        assert_eq!(data, ["Zm9v", "Zg=="]);
        assert!(guest.clone().into_api(b"foo").is_err());
        let mut short = guest;
        short.image_lens.pop();
        assert!(short.into_api(b"foo").is_err());
    }

    #[test]
    fn combos_parse_in_press_order() {
        assert_eq!(parse_combo("ctrl+shift+t"), Ok(vec![0xffe3, 0xffe1, 0x74]));
        assert_eq!(parse_combo("ctrl++"), Ok(vec![0xffe3, 0x2b]));
        assert_eq!(parse_combo("+"), Ok(vec![0x2b]));
        assert_eq!(parse_combo("KP_Enter"), Ok(vec![0xff8d]));
        assert_eq!(
            parse_key_text("ctrl+a Delete"),
            Ok(vec![vec![0xffe3, 0x61], vec![0xffff]])
        );
        assert!(matches!(
            parse_combo("a+b+c+d+e+f+g+h+i+j+k+l+m+n+o+p+q"),
            Err(Problem::TooManyKeys)
        ));
    }
}
