//! The supervisor's configuration file: a flat TOML table.
//!
//! Owns parsing the subset of TOML the file uses — `key = value` lines with
//! basic or literal strings, integers, floats and booleans, and comments —
//! into JSON values that serde turns into a [`crate::Config`]. Anything
//! beyond that (tables, arrays, dates, multi-line strings) is a clear error,
//! never silently misread. A full TOML parser would cost the 4 MiB
//! supervisor more resident memory than the rest of its configuration code.

use serde_json::{Map, Number, Value};

/// A line that is not flat TOML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct FileError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses a flat TOML document into key → value.
pub fn parse(text: &str) -> Result<Map<String, Value>, FileError> {
    let mut table = Map::new();
    for (idx, raw) in text.lines().enumerate() {
        let line = idx + 1;
        let fail = |message: String| FileError { line, message };
        let rest = raw.trim_start();
        if rest.is_empty() || rest.starts_with('#') {
            continue;
        }
        if rest.starts_with('[') {
            return Err(fail(
                "tables are not supported: the file is one flat table".into(),
            ));
        }
        let (key, rest) = parse_key(rest).map_err(fail)?;
        let rest = rest.trim_start();
        let rest = rest
            .strip_prefix('=')
            .ok_or_else(|| fail(format!("expected `=` after {key:?}")))?
            .trim_start();
        let (value, rest) = parse_value(rest).map_err(fail)?;
        let rest = rest.trim_start();
        if !(rest.is_empty() || rest.starts_with('#')) {
            return Err(fail(format!(
                "unexpected {rest:?} after the value of {key:?}"
            )));
        }
        if table.insert(key.clone(), value).is_some() {
            return Err(fail(format!("{key:?} is set twice")));
        }
    }
    Ok(table)
}

fn parse_key(s: &str) -> Result<(String, &str), String> {
    if let Some(quoted) = s.strip_prefix('"') {
        return basic_string(quoted);
    }
    if let Some(quoted) = s.strip_prefix('\'') {
        return literal_string(quoted);
    }
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(s.len());
    if end == 0 {
        return Err(format!("expected a key, found {s:?}"));
    }
    if s[end..].trim_start().starts_with('.') {
        return Err("dotted keys are not supported: the file is one flat table".into());
    }
    Ok((s[..end].to_owned(), &s[end..]))
}

fn parse_value(s: &str) -> Result<(Value, &str), String> {
    if s.starts_with("\"\"\"") || s.starts_with("'''") {
        return Err("multi-line strings are not supported".into());
    }
    if let Some(quoted) = s.strip_prefix('"') {
        return basic_string(quoted).map(|(v, rest)| (Value::String(v), rest));
    }
    if let Some(quoted) = s.strip_prefix('\'') {
        return literal_string(quoted).map(|(v, rest)| (Value::String(v), rest));
    }
    if s.starts_with('[') || s.starts_with('{') {
        return Err("arrays and inline tables are not supported".into());
    }
    let end = s
        .find(|c: char| c.is_whitespace() || c == '#')
        .unwrap_or(s.len());
    let (token, rest) = s.split_at(end);
    let value = match token {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        "" => return Err("missing value".into()),
        _ => Value::Number(number(token)?),
    };
    Ok((value, rest))
}

fn number(token: &str) -> Result<Number, String> {
    let bad = || format!("{token:?} is not a string, number or boolean");
    // TOML allows `_` between digits only.
    let digits = token.trim_start_matches(['+', '-']);
    if digits.starts_with('_') || digits.ends_with('_') || token.contains("__") {
        return Err(bad());
    }
    let plain = token.replace('_', "");
    if !plain.contains(['.', 'e', 'E']) {
        if let Ok(n) = plain.parse::<i64>() {
            return Ok(Number::from(n));
        }
        return plain.parse::<u64>().map(Number::from).map_err(|_| bad());
    }
    let has_digit = |s: &str| s.chars().any(|c| c.is_ascii_digit());
    if !has_digit(&plain) || plain.contains("inf") || plain.contains("nan") {
        return Err(bad());
    }
    plain
        .parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .ok_or_else(bad)
}

/// A basic string after its opening quote: the value and what follows the
/// closing quote.
fn basic_string(s: &str) -> Result<(String, &str), String> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &s[i + 1..])),
            '\\' => {
                let (_, esc) = chars.next().ok_or("unfinished escape")?;
                match esc {
                    '"' => out.push('"'),
                    '\\' => out.push('\\'),
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    'b' => out.push('\u{8}'),
                    'f' => out.push('\u{c}'),
                    'u' | 'U' => {
                        let len = if esc == 'u' { 4 } else { 8 };
                        let hex: String = chars.by_ref().take(len).map(|(_, c)| c).collect();
                        let code = u32::from_str_radix(&hex, 16)
                            .ok()
                            .filter(|_| hex.len() == len)
                            .and_then(char::from_u32)
                            .ok_or_else(|| format!("bad unicode escape \\{esc}{hex}"))?;
                        out.push(code);
                    }
                    other => return Err(format!("unknown escape \\{other}")),
                }
            }
            c if c.is_control() && c != '\t' => return Err("control character in a string".into()),
            c => out.push(c),
        }
    }
    Err("unterminated string".into())
}

fn literal_string(s: &str) -> Result<(String, &str), String> {
    let end = s.find('\'').ok_or("unterminated string")?;
    Ok((s[..end].to_owned(), &s[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_tables_parse() {
        let table = parse(
            r#"
# a comment
home = "/home/desk"   # trailing comment
'tmp_dir' = '/tmp#not-a-comment'
width = 1_920
busy_cpu_percent = 12.5
neg = -3
flag = true
escaped = "a\"b\\c\u00e9"
"#,
        )
        .expect("parse");
        assert_eq!(table["home"], "/home/desk");
        assert_eq!(table["tmp_dir"], "/tmp#not-a-comment");
        assert_eq!(table["width"], 1920);
        assert_eq!(table["busy_cpu_percent"], 12.5);
        assert_eq!(table["neg"], -3);
        assert_eq!(table["flag"], true);
        assert_eq!(table["escaped"], "a\"b\\cé");
    }

    #[test]
    fn anything_else_is_an_error_with_its_line() {
        for (text, line) in [
            ("[desktop]\nwidth = 1", 1),
            ("a = 1\nb = [1, 2]", 2),
            ("a = { x = 1 }", 1),
            ("a.b = 1", 1),
            ("a = 1\na = 2", 2),
            ("a = \"open", 1),
            ("a = 1 2", 1),
            ("a = nan", 1),
            ("a = 1__0", 1),
            ("a = \"\"\"x\"\"\"", 1),
            ("a = 2024-01-01", 1),
            ("= 1", 1),
            ("a 1", 1),
        ] {
            let err = parse(text).expect_err(text);
            assert_eq!(err.line, line, "{text}: {err}");
        }
    }
}
