//! The time one batch may take: the one formula the supervisor bounds its
//! run with and the broker derives its wait from, so the two can no longer
//! drift apart.
//!
//! Before this lived here the two sides kept hand-synced copies, and they
//! disagreed on `hold_key`: the supervisor gave it no time for its keys. A
//! `hold_key` presses its combination, holds it, then releases it and
//! settles, exactly the key work of a `key` action plus its duration, so it
//! is counted like `key` and `type` here.

use std::time::Duration;

use super::limits::MAX_BATCH_DURATION_SECS;
use super::types::{Action, ActionBatch};

/// What every batch is granted before its actions are counted: connecting
/// to X, reading the keymap, and the answer.
pub const RUN_BOUND_BASE: Duration = Duration::from_secs(10);
/// Granted per byte of a `type`, `key` or `hold_key` text.
pub const TEXT_BYTE_ALLOWANCE: Duration = Duration::from_millis(5);
/// Granted per `type`, `key` or `hold_key` action for its settle: the
/// supervisor waits for the focused client after sending keys (100 ms for a
/// client it cannot ping), twice.
pub const KEY_ACTION_ALLOWANCE: Duration = Duration::from_millis(200);
/// Granted per `clipboard_get` or `clipboard_set`: the supervisor gives each
/// xclip it runs 5 s, and `clipboard_set` runs two (CLIPBOARD, PRIMARY).
pub const CLIPBOARD_ALLOWANCE: Duration = Duration::from_secs(10);

/// The longest one batch may run on the display once it has its turn: the
/// base, the durations of its `wait` and `hold_key` actions (as validation
/// bounds them), the key work of its text actions, [`CLIPBOARD_ALLOWANCE`]
/// for each clipboard action, and `per_image` for each `screenshot` or
/// `zoom`. The supervisor's hang guard; a batch that breaks
/// it is ended and answered `timeout`.
pub fn run_bound(batch: &ActionBatch, per_image: Duration) -> Duration {
    let mut durations = 0.0;
    let mut bound = RUN_BOUND_BASE;
    for action in &batch.actions {
        let d = action.duration();
        if d.is_finite() && d > 0.0 {
            durations += d;
        }
        match action {
            Action::Type { text } | Action::Key { text } | Action::HoldKey { text, .. } => {
                let bytes = u32::try_from(text.len()).unwrap_or(u32::MAX);
                bound = bound
                    .saturating_add(TEXT_BYTE_ALLOWANCE.saturating_mul(bytes))
                    .saturating_add(KEY_ACTION_ALLOWANCE);
            }
            Action::Screenshot { .. } | Action::Zoom { .. } => {
                bound = bound.saturating_add(per_image);
            }
            Action::ClipboardGet {} | Action::ClipboardSet { .. } => {
                bound = bound.saturating_add(CLIPBOARD_ALLOWANCE);
            }
            _ => {}
        }
    }
    bound.saturating_add(Duration::from_secs_f64(
        durations.clamp(0.0, MAX_BATCH_DURATION_SECS),
    ))
}

/// How long the supervisor waits for a batch to end, its turn included:
/// twice [`run_bound`], once for a batch that may run ahead of it (batches
/// take the display one at a time) and once for itself. A client waits at
/// least this long, plus its own margin, before it gives up on the answer.
pub fn guest_wait(batch: &ActionBatch, per_image: Duration) -> Duration {
    run_bound(batch, per_image).saturating_mul(2)
}
