//! The `computer` tool: the input schema of the vendor's `computer_20251124`
//! tool ([`input_schema`], every action and field of it, plus the optional
//! `desktop` every tool here takes), one call turned into a batch of the
//! API's own actions ([`batch_of`]: the names are the batch's, so nothing is
//! mapped twice) and the batch's answer turned into MCP content
//! ([`content_of`]).

use dormouse_protocol::actions::{Action, ActionBatch, ActionResults, Scale};
use dormouse_protocol::image::ImageEncoding;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use serde_json::{json, Value};

use crate::ToolError;

/// Every action of the tool, in the vendor's order.
pub const ACTIONS: [&str; 17] = [
    "key",
    "hold_key",
    "type",
    "cursor_position",
    "mouse_move",
    "left_mouse_down",
    "left_mouse_up",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "triple_click",
    "scroll",
    "wait",
    "screenshot",
    "zoom",
];

/// The tool's description (the model reads it).
pub const DESCRIPTION: &str =
    "Use a mouse and keyboard to interact with a Linux desktop, and take \
screenshots. The screen is in the coordinate space this server declares (a screenshot's size); \
every coordinate you send is in that space. Take a screenshot first to see the screen. Click \
the centre of elements. After an action that changes the screen, the answer includes a \
screenshot of its result. `zoom` shows a region [x0, y0, x1, y1] at the screen's full \
resolution. Pass `desktop` (an id or name) unless the server is bound to one.";

/// The input schema: the vendor's `computer_20251124`, with `desktop`.
pub fn input_schema() -> JsonObject {
    let schema = json!({
        "type": "object",
        "properties": {
            "action": {
                "description": "The action to perform. The available actions are:\n\
    * `key`: Press a key or key-combination on the keyboard.\n\
    - This supports xdotool's `key` syntax.\n\
    - Examples: \"a\", \"Return\", \"alt+Tab\", \"ctrl+s\", \"Up\", \"KP_0\" (for the numpad 0 key).\n\
    * `hold_key`: Hold down a key or multiple keys for a specified duration (in seconds). Supports the same syntax as `key`.\n\
    * `type`: Type a string of text on the keyboard.\n\
    * `cursor_position`: Get the current (x, y) pixel coordinate of the cursor on the screen.\n\
    * `mouse_move`: Move the cursor to a specified (x, y) pixel coordinate on the screen.\n\
    * `left_mouse_down`: Press the left mouse button.\n\
    * `left_mouse_up`: Release the left mouse button.\n\
    * `left_click`: Click the left mouse button at the specified (x, y) pixel coordinate on the screen. You can also include a key combination to hold down while clicking using the `text` parameter.\n\
    * `left_click_drag`: Click and drag the cursor from `start_coordinate` to a specified (x, y) pixel coordinate on the screen.\n\
    * `right_click`: Click the right mouse button at the specified (x, y) pixel coordinate on the screen.\n\
    * `middle_click`: Click the middle mouse button at the specified (x, y) pixel coordinate on the screen.\n\
    * `double_click`: Double-click the left mouse button at the specified (x, y) pixel coordinate on the screen.\n\
    * `triple_click`: Triple-click the left mouse button at the specified (x, y) pixel coordinate on the screen.\n\
    * `scroll`: Scroll the screen in a specified direction by a specified amount of clicks of the scroll wheel, at the specified (x, y) pixel coordinate. DO NOT use PageUp/PageDown to scroll.\n\
    * `wait`: Wait for a specified duration (in seconds).\n\
    * `screenshot`: Take a screenshot of the screen.\n\
    * `zoom`: Take a screenshot of a region of the screen at full resolution.",
                "enum": ACTIONS,
                "type": "string"
            },
            "coordinate": {
                "description": "(x, y): The x (pixels from the left edge) and y (pixels from the top edge) coordinates to move the mouse to. Required only by `action=mouse_move` and `action=left_click_drag`.",
                "type": "array"
            },
            "duration": {
                "description": "The duration to hold the key down for. Required only by `action=hold_key` and `action=wait`.",
                "type": "integer"
            },
            "region": {
                "description": "(x0, y0, x1, y1): The region of the screen to zoom into, from the top-left corner (x0, y0) to the bottom-right corner (x1, y1). Required only by `action=zoom`.",
                "type": "array"
            },
            "scroll_amount": {
                "description": "The number of 'clicks' to scroll. Required only by `action=scroll`.",
                "type": "integer"
            },
            "scroll_direction": {
                "description": "The direction to scroll the screen. Required only by `action=scroll`.",
                "enum": ["up", "down", "left", "right"],
                "type": "string"
            },
            "start_coordinate": {
                "description": "(x, y): The x (pixels from the left edge) and y (pixels from the top edge) coordinates to start the drag from. Required only by `action=left_click_drag`.",
                "type": "array"
            },
            "text": {
                "description": "Required only by `action=type`, `action=key`, and `action=hold_key`. Can also be used by click or scroll actions to hold down keys while clicking or scrolling.",
                "type": "string"
            },
            "desktop": {
                "description": "The desktop (id or name); optional when the server is bound to one.",
                "type": "string"
            }
        },
        "required": ["action"]
    });
    match schema {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// The images a call answers: their encoding, and whether an action that
/// changes the screen is followed by a screenshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Images {
    /// The encoding of every image (`screenshot`, `zoom`, the one after).
    pub encoding: ImageEncoding,
    /// Whether a screenshot follows an action that changes the screen.
    pub after: bool,
}

/// Whether an action changes the screen (and so answers a screenshot too).
fn changes_screen(action: &Action) -> bool {
    !matches!(
        action,
        Action::Screenshot { .. } | Action::Zoom { .. } | Action::CursorPosition {}
    )
}

/// One call of the tool as a batch in `space`: its action (the arguments
/// without `desktop`, read by the batch's own parser) and, when it changes
/// the screen and `images.after`, a screenshot; every image in
/// `images.encoding`.
pub fn batch_of(
    mut args: JsonObject,
    space: Scale,
    images: Images,
) -> Result<ActionBatch, ToolError> {
    args.remove("desktop");
    // The vendor's `duration` is an integer on `hold_key`; `wait` takes it
    // as well. Both are the batch's seconds.
    let mut action: Action = serde_json::from_value(Value::Object(args))
        .map_err(|e| ToolError::Invalid(format!("invalid computer action: {e}")))?;
    // The default encoding is left unnamed, as a batch that names none
    // (which a supervisor older than the formats also takes).
    let format = (!images.encoding.is_default()).then_some(images.encoding.format);
    let quality = images.encoding.quality;
    if let Action::Screenshot {
        format: f,
        quality: q,
    }
    | Action::Zoom {
        format: f,
        quality: q,
        ..
    } = &mut action
    {
        if f.is_none() && q.is_none() {
            (*f, *q) = (format, quality);
        }
    }
    let after = images.after && changes_screen(&action);
    let mut actions = vec![action];
    if after {
        actions.push(Action::Screenshot { format, quality });
    }
    Ok(ActionBatch {
        actions,
        scale: Some(space),
        cursor: false,
    })
}

/// The answer as the tool's content: images for `screenshot` and `zoom`,
/// `X=…,Y=…` for `cursor_position`, a line for the rest; a failed action is
/// a tool error with its message.
pub fn content_of(results: ActionResults) -> CallToolResult {
    let mut content = Vec::new();
    for result in results.results {
        if !result.ok {
            let message = result
                .error
                .map(|e| format!("{} failed: {} ({})", result.action, e.message, e.code))
                .unwrap_or_else(|| format!("{} failed", result.action));
            content.push(ContentBlock::text(message));
            return CallToolResult::error(content);
        }
        if let Some(image) = result.image {
            content.push(ContentBlock::image(image.data, image.media_type));
        } else if let Some([x, y]) = result.coordinate {
            content.push(ContentBlock::text(format!("X={x},Y={y}")));
        } else {
            content.push(ContentBlock::text(format!("{}: done", result.action)));
        }
    }
    CallToolResult::success(content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dormouse_protocol::image::ImageFormat;

    fn args(v: Value) -> JsonObject {
        match v {
            Value::Object(m) => m,
            _ => JsonObject::new(),
        }
    }

    const SPACE: Scale = Scale {
        width: 1024,
        height: 640,
    };

    const PNG_AFTER: Images = Images {
        encoding: ImageEncoding {
            format: ImageFormat::Png,
            quality: None,
        },
        after: true,
    };

    #[test]
    fn the_schema_lists_every_action_and_field() {
        let s = input_schema();
        let props = s["properties"].as_object().unwrap();
        for field in [
            "action",
            "coordinate",
            "start_coordinate",
            "text",
            "duration",
            "scroll_direction",
            "scroll_amount",
            "region",
        ] {
            assert!(props.contains_key(field), "{field}");
        }
        let listed: Vec<&str> = props["action"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(listed, ACTIONS);
    }

    #[test]
    fn every_action_parses_as_the_batch_action() {
        for a in ACTIONS {
            let v = match a {
                "key" | "type" => json!({"action": a, "text": "a"}),
                "hold_key" => json!({"action": a, "text": "a", "duration": 1}),
                "wait" => json!({"action": a, "duration": 1}),
                "mouse_move" => json!({"action": a, "coordinate": [1, 2]}),
                "left_click_drag" => {
                    json!({"action": a, "start_coordinate": [1, 2], "coordinate": [3, 4]})
                }
                "scroll" => {
                    json!({"action": a, "coordinate": [1, 2], "scroll_direction": "down", "scroll_amount": 3})
                }
                "zoom" => json!({"action": a, "region": [0, 0, 10, 10]}),
                _ => json!({"action": a, "desktop": "d"}),
            };
            let b = batch_of(args(v), SPACE, PNG_AFTER).unwrap();
            assert_eq!(b.actions[0].name().as_str(), a);
            assert_eq!(b.scale, Some(SPACE));
            let shot = !matches!(a, "screenshot" | "zoom" | "cursor_position");
            assert_eq!(b.actions.len(), if shot { 2 } else { 1 }, "{a}");
            // PNG, the default, goes unnamed.
            let json = serde_json::to_value(&b.actions).unwrap();
            assert!(json
                .as_array()
                .unwrap()
                .iter()
                .all(|a| a.get("format").is_none()));
        }
        let off = Images {
            after: false,
            ..PNG_AFTER
        };
        let b = batch_of(args(json!({"action": "left_click"})), SPACE, off).unwrap();
        assert_eq!(b.actions.len(), 1);
    }

    #[test]
    fn every_image_is_in_the_encoding_asked_for() {
        let jpeg = ImageEncoding {
            format: ImageFormat::Jpeg,
            quality: Some(40),
        };
        let images = Images {
            encoding: jpeg,
            after: true,
        };
        let b = batch_of(args(json!({"action": "left_click"})), SPACE, images).unwrap();
        assert_eq!(b.actions[1].encoding(), Some(jpeg));
        for a in [
            json!({"action": "screenshot"}),
            json!({"action": "zoom", "region": [0, 0, 10, 10]}),
        ] {
            let b = batch_of(args(a), SPACE, images).unwrap();
            assert_eq!(b.actions.len(), 1);
            assert_eq!(b.actions[0].encoding(), Some(jpeg));
        }
    }

    #[test]
    fn unknown_actions_are_refused() {
        let e = batch_of(args(json!({"action": "fly"})), SPACE, PNG_AFTER).unwrap_err();
        assert!(e.to_string().contains("unknown variant `fly`"), "{e}");
    }

    #[test]
    fn results_become_content() {
        use dormouse_protocol::actions::{ActionImage, ActionName, ActionResult};
        let mut pos = ActionResult::ok(ActionName::CursorPosition);
        pos.coordinate = Some([5, 6]);
        let r = content_of(ActionResults { results: vec![pos] });
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["content"][0]["text"], "X=5,Y=6");
        let mut shot = ActionResult::ok(ActionName::Screenshot);
        shot.image = Some(ActionImage {
            media_type: "image/webp".into(),
            data: "UklGR".into(),
        });
        let r = content_of(ActionResults {
            results: vec![shot],
        });
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["content"][0]["type"], "image");
        assert_eq!(v["content"][0]["mimeType"], "image/webp");
        assert_eq!(v["content"][0]["data"], "UklGR");
        let failed = ActionResult::failed(ActionName::Type, "x_error", "gone");
        let r = content_of(ActionResults {
            results: vec![failed],
        });
        assert_eq!(r.is_error, Some(true));
    }
}
