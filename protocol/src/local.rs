//! Where a local broker keeps what its local clients need: the default data
//! directory, the token file's name in it, and what a usable token looks
//! like. The broker (which writes the token) and every client (which reads
//! it) take these from here, so they cannot drift apart.
//!
//! Pure functions only: it reads environment variables, never a file, and
//! never decides who may read the token (the broker's token module does).

use std::path::PathBuf;

/// File name of the API token inside the broker's data directory.
pub const TOKEN_FILE: &str = "token";

/// The data directory of a broker installed system-wide (`scripts/install`,
/// the systemd unit's `--data-dir`).
pub const SYSTEM_DATA_DIR: &str = "/var/lib/dormouse";

/// Shortest token accepted from a file (the hex of 16 bytes).
pub const MIN_TOKEN_LEN: usize = 32;

/// `$XDG_STATE_HOME/dormouse`, else `~/.local/state/dormouse`; `None` when
/// neither variable holds an absolute path.
pub fn default_data_dir() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").and_then(absolute) {
        return Some(state.join("dormouse"));
    }
    std::env::var_os("HOME")
        .and_then(absolute)
        .map(|home| home.join(".local/state/dormouse"))
}

/// The token a token file's text holds: the text without surrounding
/// whitespace, when that is at least [`MIN_TOKEN_LEN`] printable ASCII
/// characters (no spaces); `None` otherwise.
pub fn parse_token(text: &str) -> Option<&str> {
    let token = text.trim();
    (token.len() >= MIN_TOKEN_LEN && token.bytes().all(|b| b.is_ascii_graphic())).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_checked() {
        let good = "a".repeat(64);
        assert_eq!(parse_token(&format!("{good}\n")), Some(good.as_str()));
        for bad in [
            "",
            "\n",
            "short\n",
            "has space in the middle of it, long enough\n",
        ] {
            assert_eq!(parse_token(bad), None, "{bad:?}");
        }
    }
}
