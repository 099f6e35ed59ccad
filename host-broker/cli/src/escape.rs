//! Making text from the broker safe to print on a terminal.
//!
//! Names, problems, check names and details may come from a hostile guest:
//! a raw ESC or BEL lets it set the window title, clear the screen or write
//! the clipboard (OSC 52), a newline lets it forge output lines, and a bidi
//! control makes what is shown differ from what is there. Everything the CLI
//! prints that the broker sent goes through here. It must never drop a
//! character silently: each one it replaces is shown as its escape.

use std::fmt;

/// Whether `c` must not reach a terminal as it is: the one definition the
/// broker also tames guest text with (controls, newline and tab included,
/// DEL, C1, bidi and zero-width format characters, line and paragraph
/// separators).
pub fn is_unsafe(c: char) -> bool {
    dormouse_protocol::frame::is_hazardous(c)
}

/// Displays a string with every [unsafe](is_unsafe) character written as an
/// escape: `\x1b` for the ASCII ones, `\u{202e}` for the others.
#[derive(Debug, Clone, Copy)]
pub struct Safe<'a>(pub &'a str);

impl fmt::Display for Safe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        if !text.chars().any(is_unsafe) {
            // Keeps width and alignment flags (`{:<20}`) working.
            return f.pad(text);
        }
        let mut escaped = String::with_capacity(text.len() + 8);
        for c in text.chars() {
            push_escaped(&mut escaped, c);
        }
        f.pad(&escaped)
    }
}

/// `text` with every unsafe character escaped.
pub fn safe(text: &str) -> String {
    Safe(text).to_string()
}

fn push_escaped(out: &mut String, c: char) {
    use std::fmt::Write as _;
    if !is_unsafe(c) {
        out.push(c);
    } else if c.is_ascii() {
        let _ = write!(out, "\\x{:02x}", u32::from(c));
    } else {
        let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
    }
}

/// JSON text made terminal-safe without changing its value: JSON encoders
/// escape C0 controls already; DEL, C1 and bidi controls (which can only
/// occur inside strings) become `\uXXXX` escapes.
pub fn safe_json(json: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if is_unsafe(c) && c != '\n' {
            // Every unsafe character is in the Basic Multilingual Plane,
            // so one `\uXXXX` escape is its whole JSON form.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_sequences_are_shown_not_sent() {
        let osc_title = "\u{1b}]0;pwned\u{7}";
        let csi_clear = "\u{1b}[2J";
        let osc_clip = "\u{1b}]52;c;ZXZpbA==\u{7}";
        let text = format!("x{osc_title}{csi_clear}{osc_clip}\u{9b}31m\nforged\u{202e}evil");
        let shown = safe(&text);
        assert_eq!(
            shown,
            "x\\x1b]0;pwned\\x07\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07\\u{009b}31m\\x0aforged\\u{202e}evil"
        );
        assert!(!shown.chars().any(is_unsafe));
        assert_eq!(safe("plain name-1 ünïcode"), "plain name-1 ünïcode");
        assert_eq!(format!("[{:<6}]", Safe("ab")), "[ab    ]");
    }

    #[test]
    fn json_stays_the_same_value() {
        let value = serde_json::json!({ "name": "a\u{1b}[2J\u{9b}\u{202e}\u{7f}b" });
        let text = serde_json::to_string_pretty(&value).expect("json");
        let shown = safe_json(&text);
        assert!(!shown.chars().any(|c| is_unsafe(c) && c != '\n'), "{shown}");
        let back: serde_json::Value = serde_json::from_str(&shown).expect("still JSON");
        assert_eq!(back, value);
    }
}
