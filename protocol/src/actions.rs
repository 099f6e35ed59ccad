//! Computer-use actions: the batch a client sends, what each action
//! returned, and the validation both the broker and the supervisor run
//! before anything is executed.
//!
//! The names are those of the Anthropic computer-use tool `computer_20250124`
//! plus `zoom`, `clipboard_get` and `clipboard_set`, so an agent loop
//! forwards its tool calls unchanged:
//!
//! ```json
//! {"actions": [{"action": "left_click", "coordinate": [640, 400]},
//!              {"action": "type", "text": "hello"},
//!              {"action": "key", "text": "ctrl+l"}],
//!  "scale": {"width": 1024, "height": 768}}
//! ```
//!
//! This module owns the *shape* ([`types`](self::ActionBatch)), the *limits*
//! ([`MAX_ACTIONS`], [`MAX_TEXT_BYTES`], [`MAX_DURATION_SECS`],
//! [`MAX_SCROLL_AMOUNT`], …) and their one check ([`validate`]), the time a
//! batch may take ([`run_bound`], the one formula the broker and the
//! supervisor share) and the scaling rule between the caller's space and the
//! screen ([`Space`]). It never executes anything and never talks to X.
//!
//! Its parts form a chain with no way back: `limits` ← `types` ← `scale` ←
//! `validate` (with `keysym`) and `bound`; [`openai`] translates the OpenAI
//! Responses dialect into `types` and leans on `validate`.
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

mod bound;
pub mod keysym;
mod keysym_table;
mod limits;
pub mod openai;
mod scale;
mod types;
mod validate;

pub use bound::{
    guest_wait, run_bound, CLIPBOARD_ALLOWANCE, KEY_ACTION_ALLOWANCE, RUN_BOUND_BASE,
    TEXT_BYTE_ALLOWANCE,
};
pub use limits::*;
pub use scale::{Size, Space};
pub use types::*;
pub use validate::{parse_combo, parse_key_text, typable, validate, BatchError, Problem};

#[cfg(test)]
mod tests;
