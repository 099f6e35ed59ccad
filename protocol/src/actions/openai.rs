//! The OpenAI Responses `computer` action dialect: the action objects of a
//! `computer_call` ([`OpenAiAction`]), their translation into the batch's
//! own actions ([`OpenAiBatch::translate`]), and the
//! `computer_call_output`-shaped screenshot a result carries back
//! ([`ComputerScreenshot`]).
//!
//! A translated batch is an ordinary [`ActionBatch`]: the same scaling, the
//! same [`validate()`](super::validate()) and the same fencing. Errors name
//! the dialect's own index (`openai_actions[3] (keypress): …`).
//!
//! The mapping:
//!
//! | dialect | batch |
//! |---|---|
//! | `click {x, y, button}` | `left_click` / `right_click` / `middle_click` (`wheel`); `back` and `forward` are `mouse_move` then the key `XF86Back` / `XF86Forward` |
//! | `double_click {x, y}` | `double_click` |
//! | `drag {path}` | `left_mouse_down` at the first point, `mouse_move` through the others, `left_mouse_up` at the last |
//! | `keypress {keys}` | one `key` combination (`CTRL`, `ENTER`, `ARROWLEFT`, … and single characters, lower-cased) |
//! | `move {x, y}` | `mouse_move` |
//! | `screenshot {}` | `screenshot` (with this API's own `format` and `quality` when given) |
//! | `scroll {x, y, scroll_x, scroll_y}` | `scroll` at `(x, y)`, [`SCROLL_PIXELS_PER_CLICK`] pixels a wheel click |
//! | `type {text}` | `type` |
//! | `wait {}` | `wait` of [`OPENAI_WAIT_SECS`] |
//!
//! `keys` on a pointer action (newer models send it) are held around it,
//! as `text` is on the batch's own pointer actions.

use serde::{Deserialize, Serialize};

use crate::image::ImageFormat;

use super::limits::{MAX_ACTIONS, MAX_KEYS, MAX_SCROLL_AMOUNT};
use super::types::{
    Action, ActionBatch, ActionName, ActionResults, ComputerScreenshot, Coordinate, Scale,
    ScrollDirection,
};
use super::validate::{BatchError, Problem};

/// Pixels of `scroll_x` / `scroll_y` one wheel click stands for: the
/// distance a browser under X11 scrolls for one click (Chromium about 53,
/// Firefox three lines of about 19 to 33), rounded up so a page the model
/// asked to scroll by a screenful does not scroll two. Any non-zero amount
/// is at least one click; more than [`MAX_SCROLL_AMOUNT`] clicks is refused.
pub const SCROLL_PIXELS_PER_CLICK: i64 = 100;

/// Seconds a `wait {}` waits (the dialect's action has no duration).
pub const OPENAI_WAIT_SECS: f64 = 1.0;

/// A point `{x, y}` of a `drag` path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathPoint {
    /// Across.
    pub x: i64,
    /// Down.
    pub y: i64,
}

/// The mouse button of a `click`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiButton {
    /// Button 1.
    Left,
    /// Button 3.
    Right,
    /// Button 2 (the wheel pressed).
    Wheel,
    /// Browser back.
    Back,
    /// Browser forward.
    Forward,
}

/// One action object of a `computer_call`, as the Responses API defines it.
/// `null` optional fields (a serialised model with its unset fields) are
/// accepted; unknown fields are not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OpenAiAction {
    /// Click a button at a point.
    Click {
        /// The button.
        button: OpenAiButton,
        /// Across.
        x: i64,
        /// Down.
        y: i64,
        /// Keys held around the click.
        #[serde(default)]
        keys: Option<Vec<String>>,
    },
    /// Double-click the left button at a point.
    DoubleClick {
        /// Across.
        x: i64,
        /// Down.
        y: i64,
        /// Keys held around the clicks.
        #[serde(default)]
        keys: Option<Vec<String>>,
    },
    /// Press at the first point, move through the path, release at the last.
    Drag {
        /// At least two points.
        path: Vec<PathPoint>,
        /// Keys held throughout.
        #[serde(default)]
        keys: Option<Vec<String>>,
    },
    /// Press keys together and release them.
    Keypress {
        /// Key names (`CTRL`, `A`, `ENTER`, `ARROWLEFT`).
        keys: Vec<String>,
    },
    /// Move the pointer.
    Move {
        /// Across.
        x: i64,
        /// Down.
        y: i64,
        /// Keys held while moving.
        #[serde(default)]
        keys: Option<Vec<String>>,
    },
    /// Take a screenshot. `format` and `quality` are this API's own
    /// additions (the dialect sends neither): as on the batch's
    /// `screenshot`, PNG when absent.
    Screenshot {
        /// `png`, `jpeg` or `webp`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<ImageFormat>,
        /// 1..=100, for `jpeg` and `webp`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quality: Option<u8>,
    },
    /// Scroll at a point by pixels.
    Scroll {
        /// Across.
        x: i64,
        /// Down.
        y: i64,
        /// Pixels right (negative: left).
        scroll_x: i64,
        /// Pixels down (negative: up).
        scroll_y: i64,
        /// Keys held while scrolling.
        #[serde(default)]
        keys: Option<Vec<String>>,
    },
    /// Type text.
    Type {
        /// The text.
        text: String,
    },
    /// Wait a moment.
    Wait {},
}

impl OpenAiAction {
    /// The dialect's name of this action.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Click { .. } => "click",
            Self::DoubleClick { .. } => "double_click",
            Self::Drag { .. } => "drag",
            Self::Keypress { .. } => "keypress",
            Self::Move { .. } => "move",
            Self::Screenshot { .. } => "screenshot",
            Self::Scroll { .. } => "scroll",
            Self::Type { .. } => "type",
            Self::Wait {} => "wait",
        }
    }
}

/// `{"openai_actions": [...], "scale": …, "cursor": …}`: a batch in the
/// dialect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiBatch {
    /// The actions of one or more `computer_call`s, in order.
    pub openai_actions: Vec<OpenAiAction>,
    /// The size of the caller's space, as on [`ActionBatch`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<Scale>,
    /// Whether screenshots show the pointer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cursor: bool,
}

/// Why a dialect batch was refused before anything ran.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpenAiError {
    /// No actions.
    #[error("a batch needs at least one action")]
    Empty,
    /// More batch actions than [`MAX_ACTIONS`] after translation.
    #[error("the batch translates to {0} actions, at most {MAX_ACTIONS}")]
    TooMany(usize),
    /// One dialect action is invalid.
    #[error("openai_actions[{index}] ({kind}): {field}: {problem}")]
    Action {
        /// Its index among `openai_actions`.
        index: usize,
        /// Its dialect name.
        kind: &'static str,
        /// The offending field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A refusal of the whole translated batch (durations, text, images).
    #[error(transparent)]
    Batch(BatchError),
}

impl OpenAiError {
    /// The API error code of every refusal.
    pub const CODE: &'static str = BatchError::CODE;
}

/// A translated batch and, for each of its actions, the index of the
/// dialect action it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    /// The batch to run.
    pub batch: ActionBatch,
    /// `origin[i]`: the dialect index of `batch.actions[i]`.
    pub origin: Vec<usize>,
    /// The dialect name of each dialect action.
    pub kind: Vec<&'static str>,
}

impl Translated {
    /// A validation error of the translated batch, with its index turned
    /// back into the dialect's.
    pub fn rename(&self, error: BatchError) -> OpenAiError {
        match error {
            BatchError::Action {
                index,
                field,
                problem,
                ..
            } => {
                let index = self.origin.get(index).copied().unwrap_or(index);
                OpenAiError::Action {
                    index,
                    kind: self.kind.get(index).copied().unwrap_or("?"),
                    field: dialect_field(field),
                    problem: problem.to_string(),
                }
            }
            other => OpenAiError::Batch(other),
        }
    }
}

/// The dialect's name of a batch field: points are `x`/`y` or `path`,
/// modifiers and keys are `keys`.
fn dialect_field(field: &'static str) -> &'static str {
    match field {
        "coordinate" => "x, y",
        "start_coordinate" => "path",
        "text" => "keys or text",
        "scroll_amount" => "scroll_x, scroll_y",
        other => other,
    }
}

impl OpenAiBatch {
    /// The batch's own actions for the dialect's, in order (see the module's
    /// table). Checks only what the translation needs (key names, a path of
    /// two points or more, scroll amounts); the result still goes through
    /// [`validate()`](super::validate()), whose errors [`Translated::rename`]
    /// turns back into the dialect's indices.
    pub fn translate(&self) -> Result<Translated, OpenAiError> {
        if self.openai_actions.is_empty() {
            return Err(OpenAiError::Empty);
        }
        let mut actions = Vec::new();
        let mut origin = Vec::new();
        for (index, action) in self.openai_actions.iter().enumerate() {
            let fail = |field: &'static str, problem: String| OpenAiError::Action {
                index,
                kind: action.kind(),
                field,
                problem,
            };
            let out = translate_one(action).map_err(|(f, p)| fail(f, p))?;
            origin.extend(std::iter::repeat_n(index, out.len()));
            actions.extend(out);
            if actions.len() > MAX_ACTIONS {
                return Err(OpenAiError::TooMany(actions.len()));
            }
        }
        Ok(Translated {
            batch: ActionBatch {
                actions,
                scale: self.scale,
                cursor: self.cursor,
            },
            origin,
            kind: self.openai_actions.iter().map(OpenAiAction::kind).collect(),
        })
    }
}

type Refusal = (&'static str, String);

fn translate_one(action: &OpenAiAction) -> Result<Vec<Action>, Refusal> {
    let at = |x: i64, y: i64| -> Coordinate { [x, y] };
    Ok(match action {
        OpenAiAction::Click { button, x, y, keys } => {
            let coordinate = Some(at(*x, *y));
            // Back and forward are keys themselves, pressed in the same
            // combination: one fewer held key for every button, as the
            // document says.
            let held = keys.as_ref().map_or(0, Vec::len);
            if held >= MAX_KEYS {
                return Err((
                    "keys",
                    format!("{held} keys, at most {} around a click", MAX_KEYS - 1),
                ));
            }
            let text = modifiers(keys.as_deref())?;
            match button {
                OpenAiButton::Left => vec![Action::LeftClick { coordinate, text }],
                OpenAiButton::Right => vec![Action::RightClick { coordinate, text }],
                OpenAiButton::Wheel => vec![Action::MiddleClick { coordinate, text }],
                OpenAiButton::Back | OpenAiButton::Forward => {
                    let key = if *button == OpenAiButton::Back {
                        "XF86Back"
                    } else {
                        "XF86Forward"
                    };
                    vec![
                        Action::MouseMove {
                            coordinate: at(*x, *y),
                            text: None,
                        },
                        Action::Key {
                            text: match text {
                                Some(mods) => format!("{mods}+{key}"),
                                None => key.to_owned(),
                            },
                        },
                    ]
                }
            }
        }
        OpenAiAction::DoubleClick { x, y, keys } => vec![Action::DoubleClick {
            coordinate: Some(at(*x, *y)),
            text: modifiers(keys.as_deref())?,
        }],
        OpenAiAction::Drag { path, keys } => {
            let text = modifiers(keys.as_deref())?;
            let (Some(first), Some(last)) = (path.first(), path.last()) else {
                return Err(("path", "a drag needs at least two points".into()));
            };
            if path.len() < 2 {
                return Err(("path", "a drag needs at least two points".into()));
            }
            if path.len() > MAX_ACTIONS {
                return Err(("path", format!("at most {MAX_ACTIONS} points")));
            }
            let mut out = vec![Action::LeftMouseDown {
                coordinate: Some(at(first.x, first.y)),
                text: text.clone(),
            }];
            for p in path.iter().skip(1) {
                out.push(Action::MouseMove {
                    coordinate: at(p.x, p.y),
                    text: text.clone(),
                });
            }
            out.push(Action::LeftMouseUp {
                coordinate: Some(at(last.x, last.y)),
                text,
            });
            out
        }
        OpenAiAction::Keypress { keys } => {
            let combo = combo(keys)?.ok_or(("keys", "no keys".to_owned()))?;
            vec![Action::Key { text: combo }]
        }
        OpenAiAction::Move { x, y, keys } => vec![Action::MouseMove {
            coordinate: at(*x, *y),
            text: modifiers(keys.as_deref())?,
        }],
        OpenAiAction::Screenshot { format, quality } => vec![Action::Screenshot {
            format: *format,
            quality: *quality,
        }],
        OpenAiAction::Scroll {
            x,
            y,
            scroll_x,
            scroll_y,
            keys,
        } => {
            let text = modifiers(keys.as_deref())?;
            let mut out = Vec::new();
            for (pixels, negative, positive) in [
                (*scroll_y, ScrollDirection::Up, ScrollDirection::Down),
                (*scroll_x, ScrollDirection::Left, ScrollDirection::Right),
            ] {
                if pixels == 0 {
                    continue;
                }
                out.push(Action::Scroll {
                    coordinate: Some(at(*x, *y)),
                    scroll_direction: if pixels < 0 { negative } else { positive },
                    scroll_amount: wheel_clicks(pixels)?,
                    text: text.clone(),
                });
            }
            if out.is_empty() {
                // Nothing to scroll: still move there, as a scroll would.
                out.push(Action::MouseMove {
                    coordinate: at(*x, *y),
                    text,
                });
            }
            out
        }
        OpenAiAction::Type { text } => vec![Action::Type { text: text.clone() }],
        OpenAiAction::Wait {} => vec![Action::Wait {
            duration: OPENAI_WAIT_SECS,
        }],
    })
}

/// Wheel clicks for `pixels` of scrolling: rounded to the nearest click, at
/// least one.
pub fn wheel_clicks(pixels: i64) -> Result<u32, Refusal> {
    let abs = pixels.unsigned_abs();
    let per = SCROLL_PIXELS_PER_CLICK.unsigned_abs();
    let clicks = ((abs + per / 2) / per).max(1);
    u32::try_from(clicks)
        .ok()
        .filter(|c| *c <= MAX_SCROLL_AMOUNT)
        .ok_or((
            "scroll_x, scroll_y",
            format!(
                "{pixels} pixels is more than {MAX_SCROLL_AMOUNT} wheel clicks of \
                 {SCROLL_PIXELS_PER_CLICK} pixels"
            ),
        ))
}

/// Modifier keys held around a pointer action, as one combination.
fn modifiers(keys: Option<&[String]>) -> Result<Option<String>, Refusal> {
    match keys {
        None => Ok(None),
        Some(keys) => combo(keys),
    }
}

/// The dialect's key names as one xdotool combination (`CTRL`, `A` is
/// `ctrl+a`).
fn combo(keys: &[String]) -> Result<Option<String>, Refusal> {
    if keys.len() > MAX_KEYS {
        return Err(("keys", format!("{} keys, at most {MAX_KEYS}", keys.len())));
    }
    if keys.is_empty() {
        return Ok(None);
    }
    let names = keys
        .iter()
        .map(|k| key_name(k))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(names.join("+")))
}

/// One key name of the dialect in xdotool spelling. Single letters are the
/// key, not the capital (`A` in `["CTRL", "A"]` is the `a` key); known
/// names are mapped; anything else must be a keysym name the batch knows.
pub fn key_name(key: &str) -> Result<String, Refusal> {
    const NAMES: &[(&str, &str)] = &[
        ("ARROWLEFT", "Left"),
        ("ARROWRIGHT", "Right"),
        ("ARROWUP", "Up"),
        ("ARROWDOWN", "Down"),
        ("LEFT", "Left"),
        ("RIGHT", "Right"),
        ("UP", "Up"),
        ("DOWN", "Down"),
        ("ENTER", "Return"),
        ("RETURN", "Return"),
        ("ESC", "Escape"),
        ("ESCAPE", "Escape"),
        ("SPACE", "space"),
        ("BACKSPACE", "BackSpace"),
        ("TAB", "Tab"),
        ("DELETE", "Delete"),
        ("DEL", "Delete"),
        ("INSERT", "Insert"),
        ("HOME", "Home"),
        ("END", "End"),
        ("PAGEUP", "Page_Up"),
        ("PAGEDOWN", "Page_Down"),
        ("CTRL", "ctrl"),
        ("CONTROL", "ctrl"),
        ("SHIFT", "shift"),
        ("ALT", "alt"),
        ("OPTION", "alt"),
        ("META", "super"),
        ("SUPER", "super"),
        ("CMD", "super"),
        ("COMMAND", "super"),
        ("WIN", "super"),
        ("CAPSLOCK", "Caps_Lock"),
        ("PRINTSCREEN", "Print"),
        ("SCROLLLOCK", "Scroll_Lock"),
        ("NUMLOCK", "Num_Lock"),
        ("PAUSE", "Pause"),
        ("MENU", "Menu"),
        ("PLUS", "plus"),
        ("MINUS", "minus"),
    ];
    let trimmed = key.trim();
    if trimmed.is_empty() {
        return Err(("keys", Problem::EmptyKey(key.to_owned()).to_string()));
    }
    if let Some((_, name)) = NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(trimmed)) {
        return Ok((*name).to_owned());
    }
    let mut chars = trimmed.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        let c = c.to_ascii_lowercase();
        return Ok(match c {
            '+' => "plus".to_owned(),
            ' ' => "space".to_owned(),
            c => c.to_string(),
        });
    }
    if let Some(sym) = super::keysym::keysym_from_name(trimmed) {
        // The names are joined with `+`: one that holds a `+` itself
        // (`U+00E9`) goes as its keysym, or it would split in two.
        return Ok(if trimmed.contains('+') {
            format!("0x{sym:x}")
        } else {
            trimmed.to_owned()
        });
    }
    Err(("keys", Problem::UnknownKey(trimmed.to_owned()).to_string()))
}

/// Whether a batch action is a screenshot whose result gets a
/// [`ComputerScreenshot`].
pub fn carries_output(name: ActionName) -> bool {
    matches!(name, ActionName::Screenshot | ActionName::Zoom)
}

impl Translated {
    /// A refusal message of the translated batch (`actions[4] (mouse_move):
    /// …`, as the broker's and the guest's checks word it) with its prefix
    /// turned into the dialect's (`openai_actions[2] (drag): …`); other
    /// messages unchanged.
    pub fn rename_message(&self, message: &str) -> String {
        let renamed = message
            .strip_prefix("actions[")
            .and_then(|rest| rest.split_once(']'))
            .and_then(|(n, rest)| {
                let i: usize = n.parse().ok()?;
                let index = *self.origin.get(i)?;
                let (_, tail) = rest.trim_start().strip_prefix('(')?.split_once(')')?;
                let kind = self.kind.get(index)?;
                Some(format!("openai_actions[{index}] ({kind}){tail}"))
            });
        renamed.unwrap_or_else(|| message.to_owned())
    }

    /// The answer in the dialect: each result names the dialect action it
    /// came from, and every image carries its [`ComputerScreenshot`].
    pub fn answer(&self, mut results: ActionResults) -> ActionResults {
        for (i, result) in results.results.iter_mut().enumerate() {
            result.openai_index = self.origin.get(i).copied();
            if carries_output(result.action) {
                result.output = result
                    .image
                    .as_ref()
                    .map(|image| ComputerScreenshot::new(&image.media_type, &image.data));
            }
        }
        results
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
