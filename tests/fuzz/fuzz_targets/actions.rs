//! The action batch parser with the key-name parser
//! (`protocol/src/actions/`): a body as `POST …/actions` reads it, in the
//! batch's own dialect or the OpenAI one (`openai.rs`, translated), then
//! validated as the broker does (no screen) and as the supervisor does
//! (against a screen), with the time bounds both compute.
//!
//! Invariants: what validates maps every coordinate and region onto the
//! screen; every `key`/`hold_key` text and every modifier text of an
//! accepted batch parses to keysyms; a translated batch names for each of
//! its actions a dialect action, in order; the bounds are finite.
#![no_main]

use std::time::Duration;

use dormouse_protocol::actions::openai::{self, OpenAiBatch};
use dormouse_protocol::actions::{
    guest_wait, parse_combo, parse_key_text, run_bound, typable, validate, Action, ActionBatch,
    Size,
};
use libfuzzer_sys::fuzz_target;

const SCREENS: [Size; 3] = [
    Size {
        width: 1280,
        height: 800,
    },
    Size {
        width: 1,
        height: 1,
    },
    Size {
        width: 7680,
        height: 4320,
    },
];

/// The key names of any string, as the batch and the dialect parse them.
fn keys(text: &str) {
    let _ = parse_key_text(text);
    let _ = parse_combo(text);
    if let Ok(name) = openai::key_name(text) {
        // A dialect key name is one the batch's parser knows.
        assert!(
            parse_combo(&name).is_ok(),
            "key_name({text:?}) gave {name:?}, which parse_combo refuses"
        );
    }
    let _ = text.chars().all(typable);
}

fn check(batch: &ActionBatch) {
    let broker = validate(batch, None);
    for action in &batch.actions {
        match action {
            Action::Key { text } | Action::HoldKey { text, .. } => keys(text),
            Action::Type { text } | Action::ClipboardSet { text } => {
                let _ = text.chars().all(typable);
            }
            _ => {}
        }
        if let Some(text) = action.modifiers() {
            keys(text);
        }
    }
    if broker.is_err() {
        return;
    }
    let bound = run_bound(batch, Duration::from_secs(1));
    let wait = guest_wait(batch, Duration::from_secs(1));
    assert!(
        bound < Duration::from_secs(24 * 3600),
        "run bound {bound:?}"
    );
    assert!(wait < Duration::from_secs(24 * 3600), "guest wait {wait:?}");
    for screen in SCREENS {
        let Ok(space) = validate(batch, Some(screen)) else {
            continue;
        };
        for action in &batch.actions {
            match action {
                Action::Key { text } | Action::HoldKey { text, .. } => {
                    assert!(parse_key_text(text).is_ok(), "accepted key {text:?}");
                }
                _ => {}
            }
            if let Some(text) = action.modifiers() {
                assert!(parse_key_text(text).is_ok(), "accepted modifiers {text:?}");
            }
            let mut points = Vec::new();
            match action {
                Action::MouseMove { coordinate, .. } => points.push(*coordinate),
                Action::LeftClickDrag {
                    start_coordinate,
                    coordinate,
                    ..
                } => points.extend([*start_coordinate, *coordinate]),
                Action::LeftMouseDown { coordinate, .. }
                | Action::LeftMouseUp { coordinate, .. }
                | Action::LeftClick { coordinate, .. }
                | Action::RightClick { coordinate, .. }
                | Action::MiddleClick { coordinate, .. }
                | Action::DoubleClick { coordinate, .. }
                | Action::TripleClick { coordinate, .. }
                | Action::Scroll { coordinate, .. } => points.extend(*coordinate),
                Action::Zoom { region, .. } => {
                    let [x0, y0] = space.edge_to_screen([region[0], region[1]]);
                    let [x1, y1] = space.edge_to_screen([region[2], region[3]]);
                    assert!(
                        x0 < x1 && x1 <= screen.width,
                        "zoom {region:?} → {x0}..{x1}"
                    );
                    assert!(
                        y0 < y1 && y1 <= screen.height,
                        "zoom {region:?} → {y0}..{y1}"
                    );
                }
                _ => {}
            }
            for point in points {
                let [x, y] = space.to_screen(point);
                assert!(
                    x < screen.width && y < screen.height,
                    "{point:?} in {space:?} went to {x},{y}"
                );
                // The way back lands inside the caller's space.
                let [cx, cy] = space.to_caller([i64::from(x), i64::from(y)]);
                assert!(cx >= 0 && cy >= 0);
                assert!(cx < i64::from(space.caller.width) && cy < i64::from(space.caller.height));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // As the route reads the body.
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if value.get("openai_actions").is_none() {
        if let Ok(batch) = serde_json::from_value::<ActionBatch>(value) {
            check(&batch);
        }
        return;
    }
    let Ok(dialect) = serde_json::from_value::<OpenAiBatch>(value) else {
        return;
    };
    let Ok(translated) = dialect.translate() else {
        return;
    };
    let batch = &translated.batch;
    assert_eq!(translated.origin.len(), batch.actions.len());
    assert!(translated.origin.windows(2).all(|w| w[0] <= w[1]));
    assert!(translated
        .origin
        .iter()
        .all(|i| *i < dialect.openai_actions.len()));
    if let Err(e) = validate(batch, None) {
        let _ = translated.rename(e).to_string();
    }
    check(batch);
});
