//! Keysym names and characters: the xdotool spelling agents emit, resolved
//! without an X server.
//!
//! Owns the name table ([`keysym_table`](super::keysym_table), generated
//! from X11's `keysymdef.h`), the aliases agents use (`ctrl`, `super`,
//! `enter`, …), and the character ↔ keysym rules of the X protocol
//! (Latin-1 keysyms equal their code point; any other character `c` is
//! keysym `0x01000000 + c`). It must never guess: a name it does not know is
//! `None`, and the caller names it in an error.

use super::keysym_table::KEYSYMS;

/// First keysym of the Unicode range: keysym `UNICODE_BASE + cp` is the
/// character with code point `cp`.
pub const UNICODE_BASE: u32 = 0x0100_0000;

/// Aliases of the xdotool spelling and of what models commonly write,
/// matched case-insensitively, to the keysym name they stand for.
const ALIASES: &[(&str, &str)] = &[
    ("alt", "Alt_L"),
    ("altgr", "ISO_Level3_Shift"),
    ("backspace", "BackSpace"),
    ("cmd", "Super_L"),
    ("control", "Control_L"),
    ("ctrl", "Control_L"),
    ("del", "Delete"),
    ("down", "Down"),
    ("enter", "Return"),
    ("esc", "Escape"),
    ("hyper", "Hyper_L"),
    ("ins", "Insert"),
    ("left", "Left"),
    ("meta", "Meta_L"),
    ("option", "Alt_L"),
    ("pagedown", "Page_Down"),
    ("pageup", "Page_Up"),
    ("pgdn", "Page_Down"),
    ("pgup", "Page_Up"),
    ("return", "Return"),
    ("right", "Right"),
    ("shift", "Shift_L"),
    ("space", "space"),
    ("super", "Super_L"),
    ("up", "Up"),
    ("win", "Super_L"),
    ("windows", "Super_L"),
];

/// The keysym of one key name: a keysym name (`Return`, `KP_Enter`, `a`,
/// `F5`), an alias (`ctrl`, `super`, `enter`, any case), a single character
/// (`é`, `世`), or a Unicode spelling (`U+20AC`, `U20AC`) or a hex keysym
/// (`0xff0d`).
pub fn keysym_from_name(name: &str) -> Option<u32> {
    if name.is_empty() {
        return None;
    }
    if let Ok(i) = KEYSYMS.binary_search_by(|(n, _, _)| n.as_bytes().cmp(name.as_bytes())) {
        return KEYSYMS.get(i).map(|(_, sym, _)| *sym);
    }
    let mut chars = name.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        // A control character (C0, DEL, C1) names no key; `U+0084` still
        // reaches its keysym on purpose.
        return (!c.is_control()).then(|| keysym_of_char(c));
    }
    if let Some((_, target)) = ALIASES.iter().find(|(a, _)| a.eq_ignore_ascii_case(name)) {
        return keysym_from_name(target);
    }
    if let Some(hex) = name
        .strip_prefix("U+")
        .or_else(|| name.strip_prefix('U'))
        .filter(|h| (4..=6).contains(&h.len()))
    {
        let cp = u32::from_str_radix(hex, 16).ok()?;
        return char::from_u32(cp).map(keysym_of_char);
    }
    if let Some(hex) = name
        .strip_prefix("0x")
        .filter(|h| (1..=8).contains(&h.len()))
    {
        return u32::from_str_radix(hex, 16).ok().filter(|s| *s != 0);
    }
    // Last: a keysym name in another case (`page_down`, `RETURN`), if only
    // one name matches that way.
    let mut found = KEYSYMS
        .iter()
        .filter(|(n, _, _)| n.len() > 1 && n.eq_ignore_ascii_case(name));
    match (found.next(), found.next()) {
        (Some((_, sym, _)), None) => Some(*sym),
        _ => None,
    }
}

/// The keysym that stands for `c` by the protocol's rule: Latin-1 printable
/// characters are their own keysym, every other character is in the
/// Unicode range.
pub fn keysym_of_char(c: char) -> u32 {
    let cp = u32::from(c);
    if (0x20..=0x7e).contains(&cp) || (0xa0..=0xff).contains(&cp) {
        cp
    } else {
        UNICODE_BASE + cp
    }
}

/// The older, non-Unicode keysym a layout may use for `c` instead
/// (`emdash` for `—`, `Cyrillic_a` for `а`), if the table knows one.
pub fn legacy_keysym_of_char(c: char) -> Option<u32> {
    let cp = u32::from(c);
    if cp <= 0xff {
        return None;
    }
    KEYSYMS
        .iter()
        .find(|(_, sym, uni)| *uni == cp && *sym < UNICODE_BASE)
        .map(|(_, sym, _)| *sym)
}

/// The character a keysym types, if it types one. Return, Tab and the
/// keypad's characters count as `\n`, `\t` and their digits and signs, as
/// Xlib's lookup gives them.
pub fn char_of_keysym(sym: u32) -> Option<char> {
    match sym {
        0x20..=0x7e | 0xa0..=0xff => char::from_u32(sym),
        0xff0d | 0xff8d => Some('\n'),
        0xff09 | 0xff89 => Some('\t'),
        0xff80 => Some(' '),
        0xffaa..=0xffb9 | 0xffbd => char::from_u32(sym - 0xff80),
        s if s > UNICODE_BASE && s <= UNICODE_BASE + 0x10_ffff => char::from_u32(s - UNICODE_BASE),
        s => KEYSYMS
            .iter()
            .find(|(_, k, uni)| *k == s && *uni != 0)
            .and_then(|(_, _, uni)| char::from_u32(*uni)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_for_binary_search() {
        assert!(KEYSYMS
            .windows(2)
            .all(|w| w[0].0.as_bytes() < w[1].0.as_bytes()));
    }

    #[test]
    fn a_control_character_alone_is_no_key() {
        // Found by schemathesis: a scroll's modifier text "\u{84}" was
        // accepted while the document (and the key grammar) refuse it.
        for c in ['\u{0}', '\u{1b}', '\u{7f}', '\u{84}', '\u{9f}'] {
            assert_eq!(keysym_from_name(&c.to_string()), None, "{c:?}");
        }
        assert_eq!(keysym_from_name("U+0084"), Some(0x0100_0084));
        assert_eq!(keysym_from_name("\u{a0}"), Some(0xa0));
    }

    #[test]
    fn names_aliases_and_characters_resolve() {
        assert_eq!(keysym_from_name("Return"), Some(0xff0d));
        assert_eq!(keysym_from_name("KP_Enter"), Some(0xff8d));
        assert_eq!(keysym_from_name("super"), Some(0xffeb));
        assert_eq!(keysym_from_name("ctrl"), Some(0xffe3));
        assert_eq!(keysym_from_name("CTRL"), Some(0xffe3));
        assert_eq!(keysym_from_name("enter"), Some(0xff0d));
        assert_eq!(keysym_from_name("Page_Down"), Some(0xff56));
        assert_eq!(keysym_from_name("page_down"), Some(0xff56));
        assert_eq!(keysym_from_name("F12"), Some(0xffc9));
        assert_eq!(keysym_from_name("t"), Some(0x74));
        assert_eq!(keysym_from_name("T"), Some(0x54));
        assert_eq!(keysym_from_name("plus"), Some(0x2b));
        assert_eq!(keysym_from_name("é"), Some(0xe9));
        assert_eq!(keysym_from_name("世"), Some(0x0100_4e16));
        assert_eq!(keysym_from_name("U+20AC"), Some(0x0100_20ac));
        assert_eq!(keysym_from_name("0xff0d"), Some(0xff0d));
        assert_eq!(keysym_from_name("XF86AudioMute"), Some(0x1008_ff12));
        assert_eq!(keysym_from_name("NoSuchKey"), None);
        assert_eq!(keysym_from_name(""), None);
        assert_eq!(keysym_from_name("0x"), None);
    }

    #[test]
    fn characters_and_keysyms_round_trip() {
        for c in "Grüße, 世界 ✓ — ¿qué? «ok»".chars() {
            assert_eq!(char_of_keysym(keysym_of_char(c)), Some(c), "{c}");
            if let Some(legacy) = legacy_keysym_of_char(c) {
                assert_eq!(char_of_keysym(legacy), Some(c), "{c} legacy");
            }
        }
        assert_eq!(legacy_keysym_of_char('—'), Some(0xaa9));
        assert_eq!(legacy_keysym_of_char('а'), Some(0x6c1));
        assert_eq!(char_of_keysym(0xff0d), Some('\n'));
        assert_eq!(char_of_keysym(0xff09), Some('\t'));
        assert_eq!(char_of_keysym(0xffe1), None);
    }
}
