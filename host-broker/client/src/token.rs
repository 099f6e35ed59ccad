//! Reading the broker's API token from a file, as a local client does.
//!
//! The file's name, the default data directory and what makes a token
//! usable are defined once in [`dormouse_protocol::local`]; this module only
//! reads. It never checks the file's mode (a client may be handed a copy)
//! and never puts the token into an error.

use std::path::{Path, PathBuf};

pub use dormouse_protocol::local::{default_data_dir, SYSTEM_DATA_DIR, TOKEN_FILE};
use dormouse_protocol::local::{parse_token, MIN_TOKEN_LEN};

/// Why a token file gave no token.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// Reading failed.
    #[error("token file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Empty, too short or not printable ASCII.
    #[error("token file {path} does not hold a usable token (at least {MIN_TOKEN_LEN} printable characters)")]
    Malformed {
        /// The file.
        path: PathBuf,
    },
}

/// The token in `path`.
pub fn read_token_file(path: &Path) -> Result<String, TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_token(&text)
        .map(str::to_owned)
        .ok_or_else(|| TokenFileError::Malformed {
            path: path.to_owned(),
        })
}

/// The token files a local client looks at when told nothing: the default
/// data directory's, then the system-wide broker's.
pub fn default_token_files() -> Vec<PathBuf> {
    default_data_dir()
        .into_iter()
        .chain([PathBuf::from(SYSTEM_DATA_DIR)])
        .map(|dir| dir.join(TOKEN_FILE))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_token_and_refuses_garbage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(TOKEN_FILE);
        std::fs::write(&path, format!("{}\n", "f".repeat(64))).expect("write");
        assert_eq!(read_token_file(&path).expect("token"), "f".repeat(64));
        std::fs::write(&path, "short").expect("write");
        assert!(matches!(
            read_token_file(&path),
            Err(TokenFileError::Malformed { .. })
        ));
        assert!(matches!(
            read_token_file(&dir.path().join("absent")),
            Err(TokenFileError::Io { .. })
        ));
    }
}
