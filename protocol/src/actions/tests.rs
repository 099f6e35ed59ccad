//! The actions' tests: shape, limits, key parsing and scaling.

use super::*;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Duration;

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
    let err =
        serde_json::from_value::<ActionBatch>(many(MAX_ACTIONS + 1)).expect_err("over the limit");
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
        text_lens: vec![],
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

#[test]
fn the_time_bound_counts_every_key_action_and_image() {
    let per_image = Duration::from_secs(5);
    let one = |v: serde_json::Value| run_bound(&batch(json!({ "actions": [v] })), per_image);
    let click = one(json!({"action": "left_click", "coordinate": [1, 1]}));
    assert_eq!(click, RUN_BOUND_BASE);
    // `hold_key` presses and releases its keys like `key`, on top of its
    // duration; the supervisor's old copy gave it only the duration.
    let key = one(json!({"action": "key", "text": "ctrl+a"}));
    let hold = one(json!({"action": "hold_key", "text": "ctrl+a", "duration": 2.0}));
    let key_work = TEXT_BYTE_ALLOWANCE * 6 + KEY_ACTION_ALLOWANCE;
    assert_eq!(key, RUN_BOUND_BASE + key_work);
    assert_eq!(hold, RUN_BOUND_BASE + key_work + Duration::from_secs(2));
    let shot = one(json!({"action": "screenshot"}));
    assert_eq!(shot, RUN_BOUND_BASE + per_image);
    let b = batch(json!({"actions": [
        {"action": "type", "text": "hi"},
        {"action": "wait", "duration": 1.5},
        {"action": "zoom", "region": [0, 0, 10, 10]}
    ]}));
    assert_eq!(
        guest_wait(&b, per_image),
        run_bound(&b, per_image).saturating_mul(2)
    );
    assert_eq!(
        run_bound(&b, per_image),
        RUN_BOUND_BASE
            + TEXT_BYTE_ALLOWANCE * 2
            + KEY_ACTION_ALLOWANCE
            + Duration::from_millis(1500)
            + per_image
    );
}

#[test]
fn clipboard_actions_parse_and_are_bounded() {
    let b = batch(json!({"actions": [
        {"action": "clipboard_set", "text": "Grüße ✓"},
        {"action": "clipboard_get"}]}));
    assert_eq!(
        b.actions,
        vec![
            Action::ClipboardSet {
                text: "Grüße ✓".into()
            },
            Action::ClipboardGet {}
        ]
    );
    assert_eq!(b.actions[0].name().as_str(), "clipboard_set");
    assert_eq!(b.actions[1].name().as_str(), "clipboard_get");
    assert!(validate(&b, Some(SCREEN)).is_ok());
    // Control characters and newlines are clipboard text like any other.
    let b = batch(json!({"actions": [{"action": "clipboard_set", "text": "a\u{0}\n\t"}]}));
    assert!(validate(&b, None).is_ok());
    let long = "x".repeat(MAX_CLIPBOARD_BYTES + 1);
    let b = batch(json!({"actions": [{"action": "clipboard_set", "text": long}]}));
    assert!(matches!(
        validate(&b, None),
        Err(BatchError::Action {
            field: "text",
            problem: Problem::ClipboardTooLong(n),
            ..
        }) if n == MAX_CLIPBOARD_BYTES + 1
    ));
    let b = batch(json!({"actions": [{"action": "clipboard_get"}, {"action": "clipboard_get"}]}));
    assert_eq!(validate(&b, None), Err(BatchError::TooManyClipboardGets(2)));
    // Sets count toward the batch's text.
    let piece = "y".repeat(MAX_CLIPBOARD_BYTES);
    let sets: Vec<_> = (0..4)
        .map(|_| json!({"action": "clipboard_set", "text": piece}))
        .collect();
    let b = batch(json!({ "actions": sets }));
    assert_eq!(
        validate(&b, None),
        Err(BatchError::TooMuchText(4 * MAX_CLIPBOARD_BYTES))
    );
    assert!(
        serde_json::from_value::<ActionBatch>(
            json!({"actions": [{"action": "clipboard_get", "text": "x"}]})
        )
        .is_err(),
        "clipboard_get takes no field"
    );
    // Each clipboard action is granted its xclip time in the shared bound.
    let b = batch(json!({"actions": [{"action": "clipboard_get"}]}));
    assert_eq!(
        run_bound(&b, Duration::ZERO),
        RUN_BOUND_BASE + CLIPBOARD_ALLOWANCE
    );
    // The worst-case answer fits one guest message, escaped six to one.
    assert!(6 * MAX_CLIPBOARD_BYTES * MAX_CLIPBOARD_GETS < crate::MAX_HEADER_LEN as usize / 2 * 2);
}

#[test]
fn guest_clipboard_texts_come_from_the_payload_after_the_images() {
    let shot = ActionResult {
        image: Some(ActionImage {
            media_type: "image/png".into(),
            data: String::new(),
        }),
        size: Some([1, 1]),
        ..ActionResult::ok(ActionName::Screenshot)
    };
    let answer = GuestActionResults {
        results: vec![
            ActionResult::ok(ActionName::ClipboardSet),
            shot,
            ActionResult::ok(ActionName::ClipboardGet),
        ],
        image_lens: vec![3],
        text_lens: vec![5],
    };
    // Control characters survive: the payload is bytes, never tamed.
    let api = answer.clone().into_api(b"PNGa\nb\x1b\xff").unwrap();
    assert_eq!(api.results[1].image.as_ref().unwrap().data, base64(b"PNG"));
    assert_eq!(api.results[2].text.as_deref(), Some("a\nb\u{1b}\u{fffd}"));
    assert_eq!(api.results[0].text, None);
    let json = serde_json::to_value(&api.results[2]).unwrap();
    assert_eq!(
        json,
        json!({"action": "clipboard_get", "ok": true, "text": "a\nb\u{1b}\u{fffd}"})
    );
    assert!(answer.clone().into_api(b"PNGa\nb\x1b").is_err(), "short");
    let mut missing = answer;
    missing.text_lens.clear();
    assert!(
        missing.into_api(b"PNG").is_err(),
        "a text without its length"
    );
}
