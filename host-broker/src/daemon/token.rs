//! The API token file `<data-dir>/token`: 32 random bytes as hex, mode 0600,
//! created on first start and never rewritten by the broker.
//!
//! It owns creating and reading that one file. It must never log the token,
//! and never accept a file others can read: a token that leaked is no token.

use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use rand::RngCore as _;

use dormouse_protocol::local::{parse_token, MIN_TOKEN_LEN};

/// File name of the token inside the data directory (one definition, shared
/// with the clients that read it).
pub use dormouse_protocol::local::TOKEN_FILE;

/// What can go wrong with the token file.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Reading, creating or syncing the file failed.
    #[error("token file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Group or others may read or write it.
    #[error(
        "token file {path} has mode {mode:04o}; it must be readable by its owner only \
         (chmod 600 it, or delete it to get a new token)"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Empty, too short or not printable ASCII.
    #[error("token file {path} does not hold a usable token (at least {MIN_TOKEN_LEN} printable characters)")]
    Malformed {
        /// The file.
        path: PathBuf,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> TokenError + '_ {
    move |source| TokenError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads the token of `<data_dir>/token`, creating it first when absent.
pub fn load_or_create(data_dir: &Path) -> Result<String, TokenError> {
    let path = data_dir.join(TOKEN_FILE);
    match create(&path) {
        Ok(token) => {
            tracing::info!(path = %path.display(), "created a new API token");
            Ok(token)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read_checked(&path),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Creates the file exclusively (never overwrites) and makes it durable.
fn create(path: &Path) -> io::Result<String> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token = hex::encode(bytes);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let written = file
        .write_all(format!("{token}\n").as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        // A half-written token would be read back as garbage next start.
        let _ = fs::remove_file(path);
        return Err(e);
    }
    if let Some(dir) = path.parent() {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(token)
}

/// Reads an existing token file, refusing one that others can access.
pub fn read_checked(path: &Path) -> Result<String, TokenError> {
    let meta = fs::metadata(path).map_err(io_err(path))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    read(path)
}

/// Reads a token file's contents, refusing text that is no usable token.
fn read(path: &Path) -> Result<String, TokenError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    parse_token(&text)
        .map(str::to_owned)
        .ok_or_else(|| TokenError::Malformed {
            path: path.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = load_or_create(dir.path()).expect("create");
        assert_eq!(first.len(), 64);
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = fs::metadata(dir.path().join(TOKEN_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create(dir.path()).expect("read"), first);
    }

    #[test]
    fn readable_by_others_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(TOKEN_FILE);
        fs::write(&path, "a".repeat(64)).expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(
            load_or_create(dir.path()),
            Err(TokenError::Permissions { mode: 0o644, .. })
        ));
    }

    #[test]
    fn short_or_empty_tokens_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(TOKEN_FILE);
        for text in [
            "",
            "\n",
            "short\n",
            "has space in the middle of it, long enough\n",
        ] {
            fs::write(&path, text).expect("write");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
            assert!(
                matches!(read_checked(&path), Err(TokenError::Malformed { .. })),
                "{text:?}"
            );
        }
    }
}
