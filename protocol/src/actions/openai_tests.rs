//! Tests of the OpenAI dialect's translation.

use super::*;
use crate::actions::{validate, Size};

fn batch(json: &str) -> OpenAiBatch {
    serde_json::from_str(json).unwrap()
}

#[test]
fn every_action_translates() {
    let b = batch(
        r#"{"openai_actions": [
            {"type": "click", "button": "left", "x": 10, "y": 20},
            {"type": "click", "button": "wheel", "x": 1, "y": 2, "keys": null},
            {"type": "click", "button": "back", "x": 1, "y": 2},
            {"type": "double_click", "x": 5, "y": 6},
            {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 5, "y": 5}, {"x": 9, "y": 9}]},
            {"type": "keypress", "keys": ["CTRL", "A"]},
            {"type": "move", "x": 3, "y": 4},
            {"type": "screenshot"},
            {"type": "scroll", "x": 7, "y": 8, "scroll_x": 0, "scroll_y": -250},
            {"type": "type", "text": "Grüße"},
            {"type": "wait"}
        ], "scale": {"width": 1024, "height": 640}}"#,
    );
    let t = b.translate().unwrap();
    let a = &t.batch.actions;
    assert_eq!(
        a[0],
        Action::LeftClick {
            coordinate: Some([10, 20]),
            text: None
        }
    );
    assert_eq!(a[1].name(), ActionName::MiddleClick);
    assert_eq!(a[2].name(), ActionName::MouseMove);
    assert_eq!(
        a[3],
        Action::Key {
            text: "XF86Back".into()
        }
    );
    assert_eq!(a[4].name(), ActionName::DoubleClick);
    assert_eq!(a[5].name(), ActionName::LeftMouseDown);
    assert_eq!(a[6].name(), ActionName::MouseMove);
    assert_eq!(a[7].name(), ActionName::MouseMove);
    assert_eq!(
        a[8],
        Action::LeftMouseUp {
            coordinate: Some([9, 9]),
            text: None
        }
    );
    assert_eq!(
        a[9],
        Action::Key {
            text: "ctrl+a".into()
        }
    );
    assert_eq!(
        a[11],
        Action::Screenshot {
            format: None,
            quality: None
        }
    );
    assert_eq!(
        a[12],
        Action::Scroll {
            coordinate: Some([7, 8]),
            scroll_direction: ScrollDirection::Up,
            scroll_amount: 3,
            text: None
        }
    );
    assert_eq!(
        a[14],
        Action::Wait {
            duration: OPENAI_WAIT_SECS
        }
    );
    assert_eq!(t.origin, vec![0, 1, 2, 2, 3, 4, 4, 4, 4, 5, 6, 7, 8, 9, 10]);
    assert_eq!(t.batch.scale, b.scale);
    let screen = Size {
        width: 1280,
        height: 800,
    };
    validate(&t.batch, Some(screen)).unwrap();
}

#[test]
fn key_names_map() {
    for (k, want) in [
        ("ENTER", "Return"),
        ("ARROWLEFT", "Left"),
        ("ctrl", "ctrl"),
        ("A", "a"),
        ("/", "/"),
        ("F5", "F5"),
        ("Page_Down", "Page_Down"),
    ] {
        assert_eq!(key_name(k).unwrap(), want, "{k}");
    }
    assert!(key_name("NOPE").is_err());
    assert!(key_name("").is_err());
}

#[test]
fn a_key_named_with_a_plus_stays_one_key() {
    // Found by schemathesis: 16 keys named `U+0041` were joined with `+`
    // into 32 names and refused as "more than 16 keys".
    assert_eq!(key_name("U+00E9").unwrap(), "0xe9");
    let click = |n: usize| OpenAiBatch {
        openai_actions: vec![OpenAiAction::Click {
            button: OpenAiButton::Back,
            x: 0,
            y: 0,
            keys: Some((0..n).map(|_| "U+0041".to_owned()).collect()),
        }],
        scale: None,
        cursor: false,
    };
    let t = click(15).translate().unwrap();
    let screen = Size {
        width: 100,
        height: 100,
    };
    validate(&t.batch, Some(screen)).unwrap();
    // The back button is a key of the same combination: 16 held keys
    // would make 17, refused by the dialect's own check, which names it.
    let e = click(16).translate().unwrap_err().to_string();
    assert!(e.contains("16 keys, at most 15 around a click"), "{e}");
}

#[test]
fn bad_input_is_refused_with_the_dialect_index() {
    let keys: Vec<String> = (0..1000).map(|_| "A".to_owned()).collect();
    let b = OpenAiBatch {
        openai_actions: vec![
            OpenAiAction::Screenshot {
                format: None,
                quality: None,
            },
            OpenAiAction::Keypress { keys },
        ],
        scale: None,
        cursor: false,
    };
    let e = b.translate().unwrap_err().to_string();
    assert!(
        e.starts_with("openai_actions[1] (keypress): keys: 1000 keys"),
        "{e}"
    );

    let e = batch(r#"{"openai_actions": [{"type": "keypress", "keys": ["NOPE"]}]}"#)
        .translate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown key \"NOPE\""), "{e}");

    let e = batch(r#"{"openai_actions": [{"type": "drag", "path": [{"x": 1, "y": 1}]}]}"#)
        .translate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least two points"), "{e}");

    let e = batch(
        r#"{"openai_actions": [{"type": "scroll", "x": 1, "y": 1, "scroll_x": 0, "scroll_y": 1000000}]}"#,
    )
    .translate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("wheel clicks"), "{e}");

    // Off the declared space: found by validate, named by the dialect.
    let b = batch(
        r#"{"openai_actions": [{"type": "wait"}, {"type": "click", "button": "left", "x": 1024, "y": 5}],
            "scale": {"width": 1024, "height": 640}}"#,
    );
    let t = b.translate().unwrap();
    let screen = Size {
        width: 1280,
        height: 800,
    };
    let e = t.rename(validate(&t.batch, Some(screen)).unwrap_err());
    assert_eq!(
        e.to_string(),
        "openai_actions[1] (click): x, y: [1024, 5] is outside the 1024x640 space"
    );

    assert!(
        serde_json::from_str::<OpenAiBatch>(r#"{"openai_actions": [{"type": "fly"}]}"#).is_err()
    );
    assert_eq!(
        batch(r#"{"openai_actions": []}"#).translate(),
        Err(OpenAiError::Empty)
    );
}

#[test]
fn guest_messages_are_renamed() {
    let t = batch(r#"{"openai_actions": [{"type": "wait"}, {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 9, "y": 9}]}]}"#)
        .translate()
        .unwrap();
    assert_eq!(
        t.rename_message("actions[2] (mouse_move): coordinate: [9, 9] is outside"),
        "openai_actions[1] (drag): coordinate: [9, 9] is outside"
    );
    assert_eq!(t.rename_message("other"), "other");
}

#[test]
fn wheel_ratio() {
    assert_eq!(wheel_clicks(1).unwrap(), 1);
    assert_eq!(wheel_clicks(-149).unwrap(), 1);
    assert_eq!(wheel_clicks(150).unwrap(), 2);
    assert_eq!(wheel_clicks(10_000).unwrap(), 100);
    assert!(wheel_clicks(10_050).is_err());
}

#[test]
fn screenshots_carry_the_output() {
    let t =
        batch(r#"{"openai_actions": [{"type": "move", "x": 1, "y": 1}, {"type": "screenshot"}]}"#)
            .translate()
            .unwrap();
    let mut shot = crate::actions::ActionResult::ok(ActionName::Screenshot);
    shot.image = Some(crate::actions::ActionImage {
        media_type: "image/png".into(),
        data: "iVBO".into(),
    });
    let answer = t.answer(ActionResults {
        results: vec![
            crate::actions::ActionResult::ok(ActionName::MouseMove),
            shot,
        ],
    });
    let v = serde_json::to_value(&answer).unwrap();
    assert_eq!(v["results"][1]["openai_index"], 1);
    assert_eq!(
        v["results"][1]["output"],
        serde_json::json!({"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBO"})
    );
    assert!(v["results"][0].get("output").is_none());
}
