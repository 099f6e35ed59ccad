//! What an activity record keeps of a command line (an exec's argv, a
//! terminal's, the MCP `shell` tool's `sh -c` script): the program name and,
//! as the broker is told (`dormoused --activity-argv`), the argv redacted,
//! as typed, or not at all; in every mode cut to [`MAX_ARGV_BYTES`].
//!
//! [`redact_argv`] is the one redactor. It knows forms, not secrets, and it
//! turns into [`REDACTED`]:
//!
//! - a header's value after `-H`/`--header` (also `-HName: …`, `--header=…`,
//!   and a bare `Name: …` word) when the header is `Authorization`,
//!   `Cookie` or names a token, secret, password, key or auth;
//! - the value of a secret-like flag: `--password X`, `--password=X`,
//!   `--token`, `--secret`, `--api-key`, `--passwd`, `-password`, …;
//! - the password of `-u`/`--user user:password`;
//! - `KEY=VALUE` where `KEY` contains `TOKEN`, `SECRET`, `PASSWORD`,
//!   `PASSWD`, `CREDENTIAL` or `KEY` (any case), alone or inside a URL's
//!   query;
//! - a URL's user-info (`https://user:pass@host` → `https://[redacted]@host`);
//! - a `Bearer …` credential anywhere.
//!
//! An argument that holds a shell script (`sh -c '…'`, or any word with
//! blanks or quotes) is split into the shell's words and redacted word by
//! word, recursively. It never decides what to record; the activity log
//! asks it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Most bytes of argv a record keeps, every argument together.
pub const MAX_ARGV_BYTES: usize = 1024;
/// What a secret becomes.
pub const REDACTED: &str = "[redacted]";
/// How deep scripts inside scripts are redacted.
const MAX_DEPTH: u8 = 4;

/// How much of an argv the activity record keeps (`dormoused
/// --activity-argv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgvRecord {
    /// The program and the argv through [`redact_argv`] (the default).
    #[default]
    Redacted,
    /// The argv as typed (still cut to [`MAX_ARGV_BYTES`]).
    Full,
    /// The program name only.
    None,
}

impl ArgvRecord {
    /// The mode's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Redacted => "redacted",
            Self::Full => "full",
            Self::None => "none",
        }
    }
}

impl fmt::Display for ArgvRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode that is none of the three.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an activity argv mode is redacted, full or none, not {0:?}")]
pub struct BadArgvRecord(pub String);

impl FromStr for ArgvRecord {
    type Err = BadArgvRecord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "redacted" => Ok(Self::Redacted),
            "full" => Ok(Self::Full),
            "none" => Ok(Self::None),
            other => Err(BadArgvRecord(other.to_owned())),
        }
    }
}

/// A command line as a record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Argv {
    /// The program (`argv[0]`), as kept.
    pub program: String,
    /// The whole argv, program first; `None` when not kept.
    pub argv: Option<Vec<String>>,
    /// Whether `argv` (or `program`) was cut to [`MAX_ARGV_BYTES`].
    pub cut: bool,
}

impl Argv {
    /// `argv` as given, before a mode is applied.
    pub fn given(argv: Vec<String>) -> Self {
        Self {
            program: argv.first().cloned().unwrap_or_default(),
            argv: Some(argv),
            cut: false,
        }
    }

    /// What `mode` keeps of it.
    pub fn kept(&self, mode: ArgvRecord) -> Self {
        // What was not kept cannot come back.
        let mode = match (&self.argv, mode) {
            (None, _) => ArgvRecord::None,
            (Some(_), mode) => mode,
        };
        let argv = self
            .argv
            .clone()
            .unwrap_or_else(|| vec![self.program.clone()]);
        let argv = match mode {
            ArgvRecord::Full => argv,
            ArgvRecord::Redacted | ArgvRecord::None => redact_argv(&argv),
        };
        let (argv, cut) = cut_argv(argv, MAX_ARGV_BYTES);
        let program = argv.first().cloned().unwrap_or_default();
        match mode {
            ArgvRecord::None => Self {
                cut: (cut && argv.len() == 1) || (self.argv.is_none() && self.cut),
                program,
                argv: None,
            },
            ArgvRecord::Redacted | ArgvRecord::Full => Self {
                program,
                argv: Some(argv),
                cut: cut || self.cut,
            },
        }
    }

    /// The argv (or the program alone) joined by blanks, for a summary.
    pub fn line(&self) -> String {
        match &self.argv {
            Some(argv) => argv.join(" "),
            None => self.program.clone(),
        }
    }
}

/// `argv` cut to `max` bytes, every argument together (the one that
/// crosses is cut on a character boundary and ends in `…`; the rest are
/// dropped), and whether anything was cut.
pub fn cut_argv(argv: Vec<String>, max: usize) -> (Vec<String>, bool) {
    let mut left = max;
    let mut out = Vec::with_capacity(argv.len());
    for arg in argv {
        if arg.len() <= left {
            left -= arg.len();
            out.push(arg);
            continue;
        }
        let mut end = left.saturating_sub('…'.len_utf8());
        while !arg.is_char_boundary(end) {
            end -= 1;
        }
        let mut cut = arg[..end].to_owned();
        cut.push('…');
        out.push(cut);
        return (out, true);
    }
    (out, false)
}

/// `argv` with every secret of a form this module knows as [`REDACTED`].
pub fn redact_argv(argv: &[String]) -> Vec<String> {
    let mut pending = Pending::None;
    argv.iter()
        .map(|arg| {
            let word = redact_word(arg, &mut pending, 0).unwrap_or_else(|| arg.clone());
            redact_text(&word)
        })
        .collect()
}

/// What the previous word asks of the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    None,
    /// It is a secret flag's value.
    Secret,
    /// It is a header (`-H`).
    Header,
    /// It is `user:password` (`-u`).
    UserPass,
    /// It is part of a secret header's value (after a bare `Cookie:`),
    /// as is every word up to the next operator.
    HeaderValue,
}

/// One word (an argument, or a word of a script) redacted: `Some` when it
/// changed. `pending` carries what a flag asks of the word after it.
fn redact_word(word: &str, pending: &mut Pending, depth: u8) -> Option<String> {
    let asked = std::mem::replace(pending, Pending::None);
    match asked {
        Pending::Secret if !word.starts_with('-') => return Some(REDACTED.to_owned()),
        Pending::Header => {
            return match secret_header_value(word) {
                Some(_) if bare_header(word) => {
                    *pending = Pending::HeaderValue;
                    None
                }
                Some(h) => (h != word).then_some(h),
                None => redact_generic(word, depth),
            }
        }
        Pending::UserPass => return redact_user_pass(word),
        Pending::HeaderValue => {
            *pending = Pending::HeaderValue;
            return (word != REDACTED).then(|| REDACTED.to_owned());
        }
        Pending::Secret | Pending::None => {}
    }
    if let Some(flag) = word.strip_prefix("--") {
        return redact_long_flag(word, flag, pending, depth);
    }
    if let Some(flag) = word.strip_prefix('-') {
        if let Some(out) = redact_short_flag(flag, pending) {
            return out;
        }
        if flag.len() > 1 {
            // `-password X`, `-token=X`: single-dash long flags.
            return redact_long_flag(word, flag, pending, depth);
        }
        return None;
    }
    if let Some(h) = secret_header_value(word) {
        if bare_header(word) {
            *pending = Pending::HeaderValue;
            return None;
        }
        return (h != word).then_some(h);
    }
    // A word with quotes is shell syntax (`TOKEN="…" make`); one with
    // blanks only may be a value with blanks (`PASSPHRASE=a b c`).
    if word.contains(['\'', '"']) {
        if let Some(out) = redact_generic(word, depth) {
            return Some(out);
        }
    }
    redact_assignment(word, depth).or_else(|| redact_generic(word, depth))
}

/// `--name[=value]` (`flag` without its dashes).
fn redact_long_flag(word: &str, flag: &str, pending: &mut Pending, depth: u8) -> Option<String> {
    let dashes = &word[..word.len() - flag.len()];
    let (name, value) = match flag.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (flag, None),
    };
    let kind = flag_kind(name);
    let Some(value) = value else {
        *pending = kind;
        return None;
    };
    let redacted = match kind {
        Pending::Secret => Some(REDACTED.to_owned()),
        Pending::Header | Pending::HeaderValue => redact_header(value),
        Pending::UserPass => redact_user_pass(value),
        Pending::None => redact_assignment(value, depth).or_else(|| redact_generic(value, depth)),
    }?;
    Some(format!("{dashes}{name}={redacted}"))
}

/// `-H`, `-sSH`, `-HName: value`, `-u`, `-uuser:pass` (`flag` without its
/// dash): `Some` when the word is one of these (with its redaction).
fn redact_short_flag(flag: &str, pending: &mut Pending) -> Option<Option<String>> {
    let letters = flag.chars().all(|c| c.is_ascii_alphabetic());
    if letters && flag.ends_with('H') && flag.len() <= 4 {
        *pending = Pending::Header;
        return Some(None);
    }
    if flag == "u" {
        *pending = Pending::UserPass;
        return Some(None);
    }
    if let Some(header) = flag.strip_prefix('H') {
        return Some(redact_header(header).map(|h| format!("-H{h}")));
    }
    if let Some(user) = flag.strip_prefix('u') {
        if user.contains(':') {
            return Some(redact_user_pass(user).map(|u| format!("-u{u}")));
        }
    }
    None
}

/// What a flag named `name` (no dashes, no value) asks of its value.
fn flag_kind(name: &str) -> Pending {
    let name = name.to_ascii_lowercase().replace('_', "-");
    if name == "header" || name == "proxy-header" {
        return Pending::Header;
    }
    if name == "user" || name == "proxy-user" {
        return Pending::UserPass;
    }
    if name.starts_with("no-") {
        return Pending::None;
    }
    let segments: Vec<&str> = name.split('-').collect();
    if let Some(last) = segments.last() {
        // `--password-stdin` takes no value; `--password-file` names a path.
        if segments.len() > 1
            && ["stdin", "file", "fd", "type", "prompt", "env", "path"].contains(last)
        {
            return Pending::None;
        }
    }
    let secret_segment = segments.iter().any(|s| {
        [
            "pass", "pwd", "key", "auth", "bearer", "cookie", "passin", "passout",
        ]
        .contains(s)
    });
    let squashed = name.replace('-', "");
    let secret_word = [
        "password",
        "passwd",
        "passphrase",
        "token",
        "secret",
        "apikey",
        "credential",
        "privatekey",
        "accesskey",
    ]
    .iter()
    .any(|w| squashed.contains(w));
    if secret_segment || secret_word {
        Pending::Secret
    } else {
        Pending::None
    }
}

/// Whether a `KEY` of `KEY=VALUE` names a secret.
fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_uppercase();
    ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY"]
        .iter()
        .any(|w| key.contains(w))
}

/// `KEY=VALUE` with a secret `KEY`: `KEY=[redacted]`; another `KEY` keeps
/// its value, redacted as a word of its own.
fn redact_assignment(word: &str, depth: u8) -> Option<String> {
    let (key, value) = word.split_once('=')?;
    let mut chars = key.chars();
    let first = chars.next()?;
    let is_key = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if !is_key {
        return None;
    }
    if secret_key(key) {
        return (value != REDACTED).then(|| format!("{key}={REDACTED}"));
    }
    let mut pending = Pending::None;
    redact_word(value, &mut pending, depth).map(|v| format!("{key}={v}"))
}

/// Whether a header named `name` carries a credential.
fn secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["auth", "cookie", "token", "secret", "password", "key"]
        .iter()
        .any(|w| name.contains(w))
}

/// `Name: value` (or `Name:value`) with a secret header name:
/// `Name: [redacted]` (`Some` also when it already was).
fn secret_header_value(word: &str) -> Option<String> {
    let (name, _) = word.split_once(':')?;
    let name_trimmed = name.trim();
    let is_name = !name_trimmed.is_empty()
        && name_trimmed
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    (is_name && secret_header(name_trimmed)).then(|| format!("{name}: {REDACTED}"))
}

/// `Name:` with nothing after it: its value is the words that follow.
fn bare_header(word: &str) -> bool {
    word.split_once(':')
        .is_some_and(|(_, v)| v.trim().is_empty())
}

/// [`secret_header_value`], `Some` only when that changes the word.
fn redact_header(word: &str) -> Option<String> {
    secret_header_value(word).filter(|h| h != word)
}

/// `user:password`: `user:[redacted]`.
fn redact_user_pass(word: &str) -> Option<String> {
    let (user, password) = word.split_once(':')?;
    (password != REDACTED).then(|| format!("{user}:{REDACTED}"))
}

/// A word that is none of the forms above: a script when it has blanks or
/// quotes, else URLs in it.
fn redact_generic(word: &str, depth: u8) -> Option<String> {
    if depth < MAX_DEPTH && word.contains(|c: char| c.is_whitespace() || "'\";`".contains(c)) {
        let script = redact_script(word, depth + 1);
        return (script != word).then_some(script);
    }
    let text = redact_text(word);
    (text != word).then_some(text)
}

/// One word of a script: where it is in the script and what the shell
/// makes of it; `None` for an operator (`;`, `|`, `&`, …), which ends
/// what a flag asked of the next word.
struct ShellWord {
    start: usize,
    end: usize,
    value: Option<String>,
}

/// `script` split as the shell splits it (quotes, backslashes, operators;
/// an unclosed quote runs to the end).
fn shell_words(script: &str) -> Vec<ShellWord> {
    let mut words = Vec::new();
    let mut chars = script.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() && c != '\n' {
            chars.next();
            continue;
        }
        if "\n;|&()<>`".contains(c) {
            chars.next();
            words.push(ShellWord {
                start,
                end: start + c.len_utf8(),
                value: None,
            });
            continue;
        }
        let mut value = String::new();
        let mut end = start;
        while let Some(&(i, c)) = chars.peek() {
            if c.is_whitespace() || "\n;|&()<>`".contains(c) {
                break;
            }
            chars.next();
            end = i + c.len_utf8();
            match c {
                '\'' => {
                    for (i, c) in chars.by_ref() {
                        end = i + c.len_utf8();
                        if c == '\'' {
                            break;
                        }
                        value.push(c);
                    }
                }
                '"' => {
                    while let Some((i, c)) = chars.next() {
                        end = i + c.len_utf8();
                        match c {
                            '"' => break,
                            '\\' => {
                                if let Some((i, c)) = chars.next() {
                                    end = i + c.len_utf8();
                                    value.push(c);
                                }
                            }
                            c => value.push(c),
                        }
                    }
                }
                '\\' => {
                    if let Some((i, c)) = chars.next() {
                        end = i + c.len_utf8();
                        value.push(c);
                    }
                }
                c => value.push(c),
            }
        }
        words.push(ShellWord {
            start,
            end,
            value: Some(value),
        });
    }
    words
}

/// `script` with each word redacted in place (a changed word written back
/// quoted where the shell would need it).
fn redact_script(script: &str, depth: u8) -> String {
    let mut out = String::with_capacity(script.len());
    let mut at = 0;
    let mut pending = Pending::None;
    for word in shell_words(script) {
        let Some(value) = &word.value else {
            pending = Pending::None;
            continue;
        };
        if let Some(new) = redact_word(value, &mut pending, depth) {
            out.push_str(&script[at..word.start]);
            out.push_str(&quoted(&new));
            at = word.end;
        }
    }
    out.push_str(&script[at..]);
    out
}

/// `word` as the shell would read it back.
fn quoted(word: &str) -> String {
    if word.is_empty()
        || word.contains(|c: char| c.is_whitespace() || "'\"\\;|&()<>`$*?".contains(c))
    {
        format!("'{}'", word.replace('\'', "'\\''"))
    } else {
        word.to_owned()
    }
}

/// The forms found anywhere in a text, whatever surrounds them: URL
/// user-info and secret query values, `Authorization:`/`Cookie:` header
/// text, `Bearer` credentials. The last pass over every argument.
fn redact_text(text: &str) -> String {
    let text = redact_urls(text);
    let text = redact_header_text(&text);
    redact_bearer(&text)
}

/// Ends of a URL's authority, and of a header's value in running text.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || "/?#'\"`<>\\".contains(c)
}

/// Every `scheme://user-info@host` as `scheme://[redacted]@host`, and every
/// secret `KEY=VALUE` of a query as `KEY=[redacted]`.
fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_len = tail.find(ends_url).unwrap_or(tail.len());
        let authority = &tail[..authority_len];
        match authority.rfind('@') {
            Some(user_end) if &authority[..user_end] != REDACTED => {
                out.push_str(REDACTED);
                out.push_str(&authority[user_end..]);
            }
            _ => out.push_str(authority),
        }
        let tail = &tail[authority_len..];
        let url_len = tail
            .find(|c: char| c.is_whitespace() || "'\"`<>".contains(c))
            .unwrap_or(tail.len());
        let (url, after) = tail.split_at(url_len);
        out.push_str(&redact_query(url));
        rest = after;
    }
    out.push_str(rest);
    out
}

/// A URL's path, query and fragment with secret query values redacted.
fn redact_query(url: &str) -> String {
    let Some((path, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if secret_key(key) => format!("{key}={REDACTED}"),
            _ => pair.to_owned(),
        })
        .collect();
    let mut out = format!("{path}?{}", pairs.join("&"));
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// `Authorization: …`, `Cookie: …` (any case) in running text: the value,
/// up to a quote or the line's end, as [`REDACTED`].
fn redact_header_text(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    let mut search = 0;
    // Where each name is next (`Some(None)`: nowhere after), found again
    // only once passed, so a long text is read a bounded number of times.
    let names = ["authorization", "cookie"];
    let mut next: [Option<Option<usize>>; 2] = [None; 2];
    loop {
        for (name, place) in names.iter().zip(next.iter_mut()) {
            let stale = match *place {
                None => true,
                Some(Some(at)) => at < search,
                Some(None) => false,
            };
            if stale {
                *place = Some(lower[search..].find(name).map(|at| search + at));
            }
        }
        let Some((start, len)) = names
            .iter()
            .zip(next)
            .filter_map(|(name, at)| at.flatten().map(|at| (at, name.len())))
            .min()
        else {
            break;
        };
        let after_name = start + len;
        search = after_name;
        let rest = &text[after_name..];
        let colon = rest.len() - rest.trim_start_matches([' ', '\t']).len();
        if !rest[colon..].starts_with(':') {
            continue;
        }
        let value_start = after_name + colon + 1;
        let value_len = text[value_start..]
            .find(|c: char| "'\"\n\r`".contains(c))
            .unwrap_or(text.len() - value_start);
        let value_end = value_start + value_len;
        if text[value_start..value_end].trim() != REDACTED {
            out.push_str(&text[at..value_start]);
            out.push(' ');
            out.push_str(REDACTED);
            at = value_end;
        }
        search = value_end.max(search);
    }
    out.push_str(&text[at..]);
    out
}

/// `Bearer <credential>` (any case) as `Bearer [redacted]`.
fn redact_bearer(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    let mut search = 0;
    while let Some(i) = lower[search..].find("bearer") {
        let after = search + i + "bearer".len();
        search = after;
        let blanks = text[after..].len() - text[after..].trim_start_matches([' ', '\t']).len();
        if blanks == 0 {
            continue;
        }
        let start = after + blanks;
        let len = text[start..]
            .find(|c: char| c.is_whitespace() || "'\"`".contains(c))
            .unwrap_or(text.len() - start);
        let credential = &text[start..start + len];
        if len > 0 && credential != REDACTED {
            out.push_str(&text[at..start]);
            out.push_str(REDACTED);
            at = start + len;
        }
        search = start + len;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests;
