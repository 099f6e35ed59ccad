//! Logging of the daemon: tracing to stderr, as text (journald adds its own
//! timestamps, so none are printed under it) or as one JSON object a line.

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
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let result = match (format, under_journald) {
        (LogFormat::Json, _) => builder.json().flatten_event(true).try_init(),
        (LogFormat::Text, true) => builder.without_time().try_init(),
        (LogFormat::Text, false) => builder.try_init(),
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))
}
