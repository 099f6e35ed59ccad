//! Logging of the daemon: tracing to stderr, as text (journald adds its own
//! timestamps, so none are printed under it) or as one JSON object a line.
//!
//! It owns the log's integrity as well: one event is one line. Whatever text
//! an event carries (a guest's words, a path, an error), a line break,
//! another control character or a bidi/format character inside it is
//! written escaped, so nothing logged can forge a second line or hide or
//! reorder what a reader sees. It never drops or rewrites anything else.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log shippers).
    Json,
}

/// Installs the global subscriber. `level` is an `EnvFilter` directive such
/// as `info` or `info,dormouse::access=warn`.
pub fn init(format: LogFormat, level: &str) -> Result<(), String> {
    let filter =
        EnvFilter::try_new(level).map_err(|e| format!("bad --log-level {level:?}: {e}"))?;
    // journald sets JOURNAL_STREAM for a service's stderr; it timestamps lines itself.
    let under_journald = std::env::var_os("JOURNAL_STREAM").is_some();
    // Colours only for a person at a terminal, never in files or the journal.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || OneLine {
            inner: std::io::stderr(),
            colour,
        })
        .with_ansi(colour);
    let result = match (format, under_journald) {
        (LogFormat::Json, _) => builder.json().flatten_event(true).try_init(),
        (LogFormat::Text, true) => builder.without_time().try_init(),
        (LogFormat::Text, false) => builder.try_init(),
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))
}

/// A writer that receives one formatted event per `write` (the formatter
/// writes each event's whole buffer at once) and escapes in it everything
/// that could make it more, or other, than one line.
struct OneLine<W> {
    inner: W,
    /// Whether the formatter's own colour codes (ESC) must pass.
    colour: bool,
}

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.inner
            .write_all(one_line(&text, self.colour).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `event` with every line break but a final one, every other control
/// character but tab (and ESC when `colour`), and every Unicode format
/// character (bidi controls, zero-width characters) written as an escape.
pub fn one_line(event: &str, colour: bool) -> std::borrow::Cow<'_, str> {
    let body = event.strip_suffix('\n').unwrap_or(event);
    // The protocol's one check (controls and format characters), less what
    // a log line may keep: its tabs, and its colours when asked for.
    let hazardous = |c: char| {
        dormouse_protocol::frame::is_hazardous(c) && c != '\t' && !(colour && c == '\u{1b}')
    };
    if !body.chars().any(hazardous) {
        return std::borrow::Cow::Borrowed(event);
    }
    let mut out = String::with_capacity(event.len() + 16);
    for c in body.chars() {
        if hazardous(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if body.len() != event.len() {
        out.push('\n');
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn an_event_stays_one_line() {
        assert_eq!(one_line("plain line\n", false), "plain line\n");
        assert_eq!(
            one_line("a problem=x\n2026 INFO dormouse::access: forged\n", false),
            "a problem=x\\n2026 INFO dormouse::access: forged\n"
        );
        assert_eq!(one_line("cr\rbell\u{7}\n", false), "cr\\rbell\\u{7}\n");
        assert_eq!(one_line("bidi a\u{202e}b\n", false), "bidi a\\u{202e}b\n");
        assert_eq!(one_line("\u{1b}[2J\n", false), "\\u{1b}[2J\n");
        assert_eq!(
            one_line("\u{1b}[32mINFO\u{1b}[0m\n", true),
            "\u{1b}[32mINFO\u{1b}[0m\n"
        );
        assert_eq!(one_line("tab\tstays\n", false), "tab\tstays\n");
    }
}
