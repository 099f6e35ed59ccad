//! `dormouse act`, `dormouse type`, `dormouse key` and the scaled
//! `dormouse screenshot --scale`: computer-use actions from the command
//! line, as one batch through the API.
//!
//! It turns words into one action (`left_click 640 400`,
//! `scroll 640 400 down 3`) and leaves every check to the broker, which
//! refuses a bad batch before anything runs. Everything it prints that came
//! from the broker is escaped; images are written to files, never printed.

use std::io::Write;
use std::path::{Path, PathBuf};

use dormouse_client::Client;
use dormouse_protocol::actions::{ActionBatch, ActionResult, ActionResults, Scale};
use dormouse_protocol::image::ImageEncoding;
use serde_json::{json, Map, Value};

use crate::escape::Safe;
use crate::{print_json, resolve, stdout, CliError};

/// `dormouse act ID ACTION [ARGS...]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ActArgs {
    /// Id, unique id prefix, or name.
    pub id: String,
    /// The action: key, hold_key, type, cursor_position, mouse_move,
    /// left_mouse_down, left_mouse_up, left_click, left_click_drag,
    /// right_click, middle_click, double_click, triple_click, scroll, wait,
    /// screenshot, zoom, clipboard_get, clipboard_set.
    pub action: String,
    /// Its arguments: `X Y` for pointer actions, `X0 Y0 X1 Y1` for
    /// left_click_drag and zoom, `[X Y] DIRECTION AMOUNT` for scroll,
    /// `TEXT` for key, type and clipboard_set, `TEXT SECONDS` for hold_key,
    /// `SECONDS` for wait.
    #[arg(allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Modifiers held around a click, move or scroll (`shift`, `ctrl+alt`).
    #[arg(long, value_name = "KEYS")]
    pub hold: Option<String>,
    /// The caller's space, e.g. 1024x768: coordinates and images in it.
    #[arg(long, value_name = "WxH", value_parser = parse_scale)]
    pub scale: Option<Scale>,
    /// Draw the pointer into screenshot and zoom images.
    #[arg(long)]
    pub cursor: bool,
    /// Where to save the image of a screenshot or zoom.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `dormouse type ID TEXT`.
#[derive(Debug, Clone, clap::Args)]
pub struct TypeArgs {
    /// Id, unique id prefix, or name.
    pub id: String,
    /// The text, typed exactly under any keyboard layout (`\n` is Return).
    #[arg(allow_hyphen_values = true)]
    pub text: String,
}

/// `dormouse key ID KEYS`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyArgs {
    /// Id, unique id prefix, or name.
    pub id: String,
    /// Key combinations in xdotool spelling (`ctrl+l`, `ctrl+a Delete`).
    #[arg(allow_hyphen_values = true, num_args = 1..)]
    pub keys: Vec<String>,
}

/// `WxH` as a scale.
pub fn parse_scale(s: &str) -> Result<Scale, String> {
    let (w, h) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("{s:?}: expected WIDTHxHEIGHT, e.g. 1024x768"))?;
    let side = |v: &str| {
        v.trim()
            .parse::<u32>()
            .map_err(|_| format!("{s:?}: expected WIDTHxHEIGHT, e.g. 1024x768"))
    };
    Ok(Scale {
        width: side(w)?,
        height: side(h)?,
    })
}

/// One action from its name and words, as the API's JSON.
pub fn action_from_words(
    name: &str,
    args: &[String],
    hold: Option<&str>,
) -> Result<Value, CliError> {
    let usage = |what: &str| CliError::Usage(format!("{name}: {what}"));
    let int = |s: &String| -> Result<i64, CliError> {
        s.parse::<i64>()
            .map_err(|_| usage(&format!("{s:?} is not a whole number")))
    };
    let secs = |s: &String| -> Result<f64, CliError> {
        s.parse::<f64>()
            .map_err(|_| usage(&format!("{s:?} is not a number of seconds")))
    };
    let mut action = Map::new();
    action.insert("action".into(), json!(name));
    let point = |a: &[String]| -> Result<Value, CliError> { Ok(json!([int(&a[0])?, int(&a[1])?])) };
    match name {
        "key" | "type" | "clipboard_set" => {
            if args.is_empty() {
                return Err(usage("needs TEXT"));
            }
            action.insert("text".into(), json!(args.join(" ")));
        }
        "hold_key" => {
            let [text, d] = args else {
                return Err(usage("needs KEYS SECONDS"));
            };
            action.insert("text".into(), json!(text));
            action.insert("duration".into(), json!(secs(d)?));
        }
        "wait" => {
            let [d] = args else {
                return Err(usage("needs SECONDS"));
            };
            action.insert("duration".into(), json!(secs(d)?));
        }
        "left_click_drag" | "zoom" => {
            if args.len() != 4 {
                return Err(usage("needs X0 Y0 X1 Y1"));
            }
            if name == "zoom" {
                let v: Result<Vec<i64>, CliError> = args.iter().map(int).collect();
                action.insert("region".into(), json!(v?));
            } else {
                action.insert("start_coordinate".into(), point(&args[0..2])?);
                action.insert("coordinate".into(), point(&args[2..4])?);
            }
        }
        "scroll" => {
            let (at, rest) = match args.len() {
                2 => (None, args),
                4 => (Some(point(&args[0..2])?), &args[2..]),
                _ => return Err(usage("needs [X Y] DIRECTION AMOUNT")),
            };
            if let Some(at) = at {
                action.insert("coordinate".into(), at);
            }
            action.insert("scroll_direction".into(), json!(rest[0]));
            action.insert("scroll_amount".into(), json!(int(&rest[1])?));
        }
        "cursor_position" | "screenshot" | "clipboard_get" => {
            if !args.is_empty() {
                return Err(usage("takes no arguments"));
            }
        }
        // Pointer actions: an optional point.
        _ => match args.len() {
            0 => {}
            2 => {
                action.insert("coordinate".into(), point(args)?);
            }
            _ => return Err(usage("needs X Y (or nothing: where the pointer is)")),
        },
    }
    if let Some(keys) = hold {
        action.insert("text".into(), json!(keys));
    }
    Ok(Value::Object(action))
}

/// Sends one batch of one action and prints its result.
async fn send(
    client: &Client,
    id: &str,
    action: Value,
    scale: Option<Scale>,
    cursor: bool,
) -> Result<ActionResults, CliError> {
    let id = resolve(client, id).await?;
    let mut batch = json!({ "actions": [action] });
    if let Some(s) = scale {
        batch["scale"] = json!({"width": s.width, "height": s.height});
    }
    if cursor {
        batch["cursor"] = json!(true);
    }
    let batch: ActionBatch = serde_json::from_value(batch)
        .map_err(|e| CliError::Usage(format!("not an action: {e}")))?;
    Ok(client.actions(id, &batch).await?)
}

/// `dormouse act`.
pub async fn act(
    client: &Client,
    args: ActArgs,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let action = action_from_words(&args.action, &args.args, args.hold.as_deref())?;
    let results = send(client, &args.id, action, args.scale, args.cursor).await?;
    report(results, args.output.as_deref(), json, out)
}

/// `dormouse type`.
pub async fn type_text(
    client: &Client,
    args: TypeArgs,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let action = json!({"action": "type", "text": args.text});
    let results = send(client, &args.id, action, None, false).await?;
    report(results, None, json, out)
}

/// `dormouse key`.
pub async fn key(
    client: &Client,
    args: KeyArgs,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let action = json!({"action": "key", "text": args.keys.join(" ")});
    let results = send(client, &args.id, action, None, false).await?;
    report(results, None, json, out)
}

/// `dormouse screenshot ID -o FILE --scale WxH [--format F]`: a
/// `screenshot` action.
pub async fn scaled_screenshot(
    client: &Client,
    id: &str,
    scale: Scale,
    encoding: ImageEncoding,
    output: &Path,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let mut action = json!({"action": "screenshot", "format": encoding.format});
    if let Some(q) = encoding.quality {
        action["quality"] = json!(q);
    }
    let results = send(client, id, action, Some(scale), false).await?;
    report(results, Some(output), json, out)
}

/// Saves the first image to `output`, prints the results (JSON without
/// the image data), and fails when an action failed.
fn report(
    mut results: ActionResults,
    output: Option<&Path>,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let mut saved = None;
    for r in &mut results.results {
        if let Some(image) = r.image.as_mut() {
            let bytes = base64_decode(&image.data).ok_or_else(|| {
                CliError::Failed("the broker sent an image that is not base64".into())
            })?;
            if let (Some(path), None) = (output, &saved) {
                std::fs::write(path, &bytes).map_err(|source| CliError::Io {
                    path: path.to_owned(),
                    source,
                })?;
                saved = Some((path.to_owned(), bytes.len()));
            }
            image.data = format!("<{} bytes>", bytes.len());
        }
    }
    if json {
        print_json(out, &results)?;
    } else {
        for r in &results.results {
            writeln!(out, "{}", line(r)).map_err(stdout)?;
        }
        if let Some((path, len)) = &saved {
            writeln!(out, "saved {} ({len} bytes)", path.display()).map_err(stdout)?;
        }
    }
    match results.results.iter().find(|r| !r.ok) {
        Some(failed) => Err(CliError::Failed(format!(
            "{} failed",
            failed.action.as_str()
        ))),
        None => Ok(()),
    }
}

/// `left_click ok`, `cursor_position ok 640 400`, `screenshot ok 1024x640`,
/// `clipboard_get ok the text` (escaped: the guest's text is hostile),
/// `type failed x_error: ...`.
fn line(r: &ActionResult) -> String {
    let mut text = format!("{} {}", r.action, if r.ok { "ok" } else { "failed" });
    if let Some([x, y]) = r.coordinate {
        text.push_str(&format!(" {x} {y}"));
    }
    if let Some([w, h]) = r.size {
        text.push_str(&format!(" {w}x{h}"));
    }
    if let Some(clip) = &r.text {
        text.push_str(&format!(" {}", Safe(clip)));
    }
    if let Some(e) = &r.error {
        text.push_str(&format!(" {}: {}", Safe(&e.code), Safe(&e.message)));
    }
    text
}

/// Standard base64 (padding optional); `None` on anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    LENIENT.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_become_actions() {
        let w = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            action_from_words("clipboard_set", &w(&["copied", "text"]), None).ok(),
            Some(json!({"action": "clipboard_set", "text": "copied text"}))
        );
        assert_eq!(
            action_from_words("clipboard_get", &[], None).ok(),
            Some(json!({"action": "clipboard_get"}))
        );
        let got = ActionResult {
            text: Some("a\u{1b}[2J\nb".into()),
            ..ActionResult::ok(dormouse_protocol::actions::ActionName::ClipboardGet)
        };
        assert_eq!(line(&got), "clipboard_get ok a\\x1b[2J\\x0ab");
        assert_eq!(
            action_from_words("left_click", &w(&["640", "400"]), Some("shift")).ok(),
            Some(json!({"action": "left_click", "coordinate": [640, 400], "text": "shift"}))
        );
        assert_eq!(
            action_from_words("scroll", &w(&["1", "2", "down", "3"]), None).ok(),
            Some(json!({"action": "scroll", "coordinate": [1, 2],
                        "scroll_direction": "down", "scroll_amount": 3}))
        );
        assert_eq!(
            action_from_words("zoom", &w(&["0", "0", "10", "20"]), None).ok(),
            Some(json!({"action": "zoom", "region": [0, 0, 10, 20]}))
        );
        assert!(action_from_words("left_click", &w(&["1"]), None).is_err());
        assert!(action_from_words("wait", &w(&["soon"]), None).is_err());
        assert_eq!(
            parse_scale("1024x768"),
            Ok(Scale {
                width: 1024,
                height: 768
            })
        );
        assert!(parse_scale("1024").is_err());
    }

    #[test]
    fn base64_round_trips() {
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"\x89PNG\r\n\x1a\n",
            &[0xfb, 0xff, 0xfe],
        ] {
            let text = dormouse_protocol::actions::base64(data);
            assert_eq!(base64_decode(&text).as_deref(), Some(data), "{text}");
        }
        assert_eq!(base64_decode("a"), None);
        assert_eq!(base64_decode("a$=="), None);
    }
}
