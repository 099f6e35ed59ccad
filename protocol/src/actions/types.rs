//! The shape of a batch and of its answer: [`ActionBatch`], [`Action`] and
//! the results, as the API and the guest socket carry them. Only shape and
//! serde here; the limits are checked in [`super::validate()`].

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::limits::MAX_ACTIONS;
use crate::image::{ImageEncoding, ImageFormat};

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
    /// Answer an image of the screen (in the caller's space), a PNG unless
    /// `format` names another.
    Screenshot {
        /// `png` (when absent), `jpeg` or `webp`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<ImageFormat>,
        /// 1..=100, for `jpeg` and `webp` only ([`crate::image`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quality: Option<u8>,
    },
    /// Answer an image of a region `[x0, y0, x1, y1]` (caller's space; `x1`,
    /// `y1` exclusive) at the screen's native resolution.
    Zoom {
        /// The region.
        region: [i64; 4],
        /// `png` (when absent), `jpeg` or `webp`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<ImageFormat>,
        /// 1..=100, for `jpeg` and `webp` only ([`crate::image`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quality: Option<u8>,
    },
    /// Answer the text of the desktop's CLIPBOARD selection (empty when
    /// nobody owns it), at most [`super::MAX_CLIPBOARD_BYTES`].
    ClipboardGet {},
    /// Make the desktop own CLIPBOARD and PRIMARY with `text`, as a copy in
    /// an application would.
    ClipboardSet {
        /// The text, at most [`super::MAX_CLIPBOARD_BYTES`] of UTF-8.
        text: String,
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
    ClipboardGet,
    ClipboardSet,
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
            Self::ClipboardGet => "clipboard_get",
            Self::ClipboardSet => "clipboard_set",
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
            Self::Screenshot { .. } => ActionName::Screenshot,
            Self::Zoom { .. } => ActionName::Zoom,
            Self::ClipboardGet {} => ActionName::ClipboardGet,
            Self::ClipboardSet { .. } => ActionName::ClipboardSet,
        }
    }

    /// Seconds this action waits or holds by itself.
    pub fn duration(&self) -> f64 {
        match self {
            Self::HoldKey { duration, .. } | Self::Wait { duration } => *duration,
            _ => 0.0,
        }
    }

    /// The encoding a `screenshot` or `zoom` asked for, unchecked (`None`
    /// for every other action).
    pub fn encoding(&self) -> Option<ImageEncoding> {
        match self {
            Self::Screenshot { format, quality }
            | Self::Zoom {
                format, quality, ..
            } => Some(ImageEncoding {
                format: format.unwrap_or_default(),
                quality: *quality,
            }),
            _ => None,
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

/// The image an action returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionImage {
    /// `image/png`, `image/jpeg` or `image/webp`: the format the action
    /// asked for.
    pub media_type: String,
    /// The image, base64 (standard alphabet, padded).
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
    /// `screenshot`, `zoom`: the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ActionImage>,
    /// `screenshot`, `zoom`: the image's size `[width, height]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<[u32; 2]>,
    /// `clipboard_get`: the clipboard's text (in a guest's answer it is in
    /// the payload instead, [`GuestActionResults::text_lens`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// When `ok` is false: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ActionErrorBody>,
    /// In an `openai_actions` batch: the index of the dialect action this
    /// result belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openai_index: Option<usize>,
    /// In an `openai_actions` batch, on `screenshot` and `zoom`: the image as
    /// a `computer_call_output`'s `output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<ComputerScreenshot>,
}

/// The `computer_call_output` screenshot: `{"type": "computer_screenshot",
/// "image_url": "data:image/png;base64,…"}` (or `image/jpeg`, `image/webp`,
/// as the action asked), ready to send back as the
/// call's `output`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputerScreenshot {
    /// Always `computer_screenshot`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A `data:` URL of the image.
    pub image_url: String,
}

impl ComputerScreenshot {
    /// The output for an image of `media_type` whose base64 is `data`.
    pub fn new(media_type: &str, data: &str) -> Self {
        Self {
            kind: "computer_screenshot".to_owned(),
            image_url: format!("data:{media_type};base64,{data}"),
        }
    }
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
            text: None,
            error: None,
            openai_index: None,
            output: None,
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
    /// Length of each `clipboard_get` text in the payload, after the
    /// images, in result order: clipboard text travels as bytes, since
    /// every string of a guest's message is escaped and cut on arrival.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub text_lens: Vec<u64>,
}

/// A guest answer whose images do not match its payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the answer names {images} images and {texts} texts of {named} bytes in all; the payload has {payload} bytes"
)]
pub struct PayloadMismatch {
    /// Results carrying an image.
    pub images: usize,
    /// Successful `clipboard_get` results.
    pub texts: usize,
    /// Sum of `image_lens` (saturating).
    pub named: u64,
    /// Bytes in the payload.
    pub payload: usize,
}

impl GuestActionResults {
    /// The API answer: each image's bytes from `payload`, base64-encoded
    /// into its `data`, then each successful `clipboard_get`'s text into
    /// its `text` (invalid UTF-8 replaced). Every image result and every
    /// such text must have its length and the lengths must add up to the
    /// payload exactly.
    pub fn into_api(self, payload: &[u8]) -> Result<ActionResults, PayloadMismatch> {
        let images = self.results.iter().filter(|r| r.image.is_some()).count();
        let reads_text = |r: &ActionResult| r.action == ActionName::ClipboardGet && r.ok;
        let texts = self.results.iter().filter(|r| reads_text(r)).count();
        let named = self
            .image_lens
            .iter()
            .chain(&self.text_lens)
            .fold(0u64, |a, b| a.saturating_add(*b));
        let mismatch = PayloadMismatch {
            images,
            texts,
            named,
            payload: payload.len(),
        };
        if images != self.image_lens.len()
            || texts != self.text_lens.len()
            || u64::try_from(payload.len()).ok() != Some(named)
        {
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
        let mut lens = self.text_lens.iter();
        for result in results.iter_mut().filter(|r| reads_text(r)) {
            let len = lens
                .next()
                .and_then(|l| usize::try_from(*l).ok())
                .ok_or_else(|| mismatch.clone())?;
            let (bytes, tail) = rest.split_at_checked(len).ok_or_else(|| mismatch.clone())?;
            result.text = Some(String::from_utf8_lossy(bytes).into_owned());
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
