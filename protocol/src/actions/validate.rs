//! The one check of a batch against its limits and its screen, and the key
//! parsing it needs ([`parse_key_text`]). Nothing here runs an action.

use super::keysym;
use super::limits::{
    MAX_ACTIONS, MAX_BATCH_DURATION_SECS, MAX_BATCH_TEXT_BYTES, MAX_CLIPBOARD_BYTES,
    MAX_CLIPBOARD_GETS, MAX_DURATION_SECS, MAX_IMAGES, MAX_KEYS, MAX_SCROLL_AMOUNT, MAX_SIDE,
    MAX_TEXT_BYTES,
};
use super::scale::{Size, Space};
use super::types::{Action, ActionBatch, ActionName, Coordinate};
use crate::image::EncodingError;

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
    /// More than [`MAX_CLIPBOARD_GETS`] `clipboard_get` actions.
    #[error("a batch reads the clipboard at most {MAX_CLIPBOARD_GETS} times, this one {0}")]
    TooManyClipboardGets(usize),
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
    /// A clipboard text longer than [`MAX_CLIPBOARD_BYTES`].
    #[error("{0} bytes of clipboard text, at most {MAX_CLIPBOARD_BYTES}")]
    ClipboardTooLong(usize),
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
    /// An image encoding that cannot be made (a quality out of range or on
    /// PNG).
    #[error(transparent)]
    Encoding(EncodingError),
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
    let (mut text, mut images, mut clipboard_gets) = (0usize, 0usize, 0usize);
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
            | Action::Type { text: t }
            | Action::ClipboardSet { text: t } => {
                text = text.saturating_add(t.len());
            }
            Action::Screenshot { .. } | Action::Zoom { .. } => images += 1,
            Action::ClipboardGet {} => clipboard_gets += 1,
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
    if clipboard_gets > MAX_CLIPBOARD_GETS {
        return Err(BatchError::TooManyClipboardGets(clipboard_gets));
    }
    Ok(space)
}

/// The checks of one action's own fields (its points, region, text and
/// amounts) against `space`: the first problem, with the field it is in.
// Over 100 lines on purpose: one arm per action of the exhaustive `Action`
// enum, so a new action cannot go unchecked.
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
        Action::ClipboardSet { text } if text.len() > MAX_CLIPBOARD_BYTES => {
            return Err(("text", Problem::ClipboardTooLong(text.len())));
        }
        Action::ClipboardSet { .. } | Action::ClipboardGet {} => {}
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
        Action::Zoom { region, .. } => {
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
        Action::CursorPosition {} | Action::Screenshot { .. } => {}
    }
    if let Some(encoding) = action.encoding() {
        // The format parsed already; what is left to refuse is the quality.
        encoding
            .check()
            .map_err(|e| ("quality", Problem::Encoding(e)))?;
    }
    Ok(())
}
