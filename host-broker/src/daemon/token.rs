//! The API token file `<data-dir>/token`: 32 random bytes as hex, mode 0600,
//! created on first start and never rewritten by the broker (except an empty
//! one, see [`load_or_create`]).
//!
//! It owns creating and reading that one file. It must never log the token,
//! never accept a file others can read or that belongs to someone else, never
//! follow a symbolic link to find it, and never let a crash leave a name
//! `token` that holds less than a whole token: the token is written to a
//! temporary file, synced, and only then linked under its name.

use std::fs::{self, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use rand::RngCore as _;

use dormouse_protocol::local::{parse_token, MIN_TOKEN_LEN};

/// File name of the token inside the data directory (one definition, shared
/// with the clients that read it).
pub use dormouse_protocol::local::TOKEN_FILE;

/// Prefix of the temporary files a token is written to before it is linked
/// under [`TOKEN_FILE`]; one left by a crash is removed at the next start.
const TEMP_PREFIX: &str = ".token.";

/// Longest token file read; a token is 64 characters.
const MAX_TOKEN_FILE: u64 = 4096;

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
    /// A symbolic link, a directory, a FIFO...: anything but a regular file.
    #[error(
        "token file {path} is {kind}, not a regular file; the broker never follows a link \
         to its token (replace it with the file itself, or delete it to get a new token)"
    )]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// Owned by another user than the broker's.
    #[error(
        "token file {path} belongs to uid {owner}, not to the broker's uid {broker}; \
         a token someone else can rewrite is no token (chown it, or delete it)"
    )]
    Owner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The broker's effective uid.
        broker: u32,
    },
    /// Too short or not printable ASCII.
    #[error(
        "token file {path} does not hold a usable token (at least {MIN_TOKEN_LEN} printable \
         characters, no spaces); fix it, or delete it to get a new token"
    )]
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
///
/// A token file that exists but is empty (or only whitespace) is replaced by
/// a new token, atomically: no client can hold a token from it, and it is
/// what an interrupted first start of an older broker left behind, which
/// would otherwise block every start. A file with something else unusable in
/// it is refused: that is a token an operator wrote, and replacing it would
/// silently lock out whoever uses it.
pub fn load_or_create(data_dir: &Path) -> Result<String, TokenError> {
    let path = data_dir.join(TOKEN_FILE);
    remove_stale_temporaries(data_dir);
    match read_file_checked(&path) {
        Ok(text) if text.trim().is_empty() => {
            let token = write_new(data_dir, &path, Install::Replace).map_err(io_err(&path))?;
            tracing::warn!(path = %path.display(), "the token file was empty; wrote a new API token");
            Ok(token)
        }
        Ok(text) => parse(&text, &path),
        Err(TokenError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            match write_new(data_dir, &path, Install::New) {
                Ok(token) => {
                    tracing::info!(path = %path.display(), "created a new API token");
                    Ok(token)
                }
                // Another broker on this directory won the race: use its token.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read_checked(&path),
                Err(e) => Err(io_err(&path)(e)),
            }
        }
        Err(e) => Err(e),
    }
}

/// How a freshly written token takes the name `token`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Install {
    /// Only if nothing is there (a hard link never replaces).
    New,
    /// Over the empty file found there (a rename replaces atomically).
    Replace,
}

/// Writes a new token to a temporary file, syncs it, gives it its name and
/// syncs the directory: at every instant `token` is absent, the old file, or
/// the whole new token.
fn write_new(data_dir: &Path, path: &Path, install: Install) -> io::Result<String> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token = hex::encode(bytes);
    let mut suffix = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut suffix);
    let temp = data_dir.join(format!("{TEMP_PREFIX}{}.tmp", hex::encode(suffix)));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&temp)?;
        file.write_all(format!("{token}\n").as_bytes())?;
        file.sync_all()?;
        match install {
            Install::New => fs::hard_link(&temp, path),
            Install::Replace => fs::rename(&temp, path),
        }
    })();
    // After a link the temporary name is a second name of the token; after a
    // failure it is garbage. Either way it goes.
    let _ = fs::remove_file(&temp);
    written?;
    fs::File::open(data_dir)?.sync_all()?;
    Ok(token)
}

/// Removes temporary token files a crash left behind. Best effort: one that
/// cannot be removed is harmless (mode 0600, never read).
fn remove_stale_temporaries(data_dir: &Path) {
    let Ok(entries) = fs::read_dir(data_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(TEMP_PREFIX) && name.ends_with(".tmp") {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// SIGHUP: re-read the token file, so a token can be rotated without a
/// restart. Every other setting is a flag and needs a restart (which never
/// stops a desktop).
pub fn reload(data_dir: &Path, token: &dormouse_http::ApiToken) {
    super::systemd::reloading(false);
    match read_checked(&data_dir.join(TOKEN_FILE)) {
        Ok(new) => {
            token.replace(&new);
            tracing::info!("SIGHUP: token re-read");
        }
        Err(e) => tracing::error!(error = %e, "SIGHUP: keeping the current token"),
    }
    super::systemd::reloading(true);
}

/// Reads an existing token file as the broker must: not through a symbolic
/// link, a regular file, owned by the broker's user, readable by it alone.
pub fn read_checked(path: &Path) -> Result<String, TokenError> {
    let text = read_file_checked(path)?;
    parse(&text, path)
}

/// Opens `path` without following a link (and without blocking on a FIFO),
/// checks what was opened, and reads it.
fn read_file_checked(path: &Path) -> Result<String, TokenError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path);
    let file = match file {
        Ok(file) => file,
        // O_NOFOLLOW on a symbolic link.
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(TokenError::NotRegular {
                path: path.to_owned(),
                kind: "a symbolic link",
            })
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    // The checks are on the open file, so nothing can be swapped in between.
    let meta = file.metadata().map_err(io_err(path))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let kind = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(TokenError::NotRegular {
            path: path.to_owned(),
            kind,
        });
    }
    let broker = nix::unistd::geteuid().as_raw();
    if meta.uid() != broker {
        return Err(TokenError::Owner {
            path: path.to_owned(),
            owner: meta.uid(),
            broker,
        });
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    let mut text = String::new();
    file.take(MAX_TOKEN_FILE)
        .read_to_string(&mut text)
        .map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData => TokenError::Malformed {
                path: path.to_owned(),
            },
            _ => io_err(path)(e),
        })?;
    Ok(text)
}

/// Reads a token file as a client does (no mode or owner check, links
/// followed: a client may be handed a copy or a link to one).
pub fn read(path: &Path) -> Result<String, TokenError> {
    let mut text = String::new();
    fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_FILE).read_to_string(&mut text))
        .map_err(io_err(path))?;
    parse(&text, path)
}

/// The token in a file's text, refusing text that is no usable token.
fn parse(text: &str, path: &Path) -> Result<String, TokenError> {
    parse_token(text)
        .map(str::to_owned)
        .ok_or_else(|| TokenError::Malformed {
            path: path.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn created_once_then_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = load_or_create(dir.path()).expect("create");
        assert_eq!(first.len(), 64);
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(mode(&dir.path().join(TOKEN_FILE)), 0o600);
        assert_eq!(load_or_create(dir.path()).expect("read"), first);
        // Nothing but the token is left in the directory.
        assert_eq!(names(dir.path()), vec![TOKEN_FILE.to_owned()]);
        let meta = fs::metadata(dir.path().join(TOKEN_FILE)).expect("meta");
        assert_eq!(meta.nlink(), 1, "the temporary name is gone");
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
    fn short_or_malformed_tokens_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(TOKEN_FILE);
        for text in ["short\n", "has space in the middle of it, long enough\n"] {
            fs::write(&path, text).expect("write");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
            assert!(
                matches!(read_checked(&path), Err(TokenError::Malformed { .. })),
                "{text:?}"
            );
            assert!(
                matches!(
                    load_or_create(dir.path()),
                    Err(TokenError::Malformed { .. })
                ),
                "an operator's token is never replaced: {text:?}"
            );
            assert_eq!(fs::read_to_string(&path).expect("read"), text);
        }
    }

    /// What an interrupted first start of an older broker left: an empty
    /// file. It is replaced, not a reason to refuse to start.
    #[test]
    fn an_empty_token_file_is_replaced() {
        for text in ["", "\n", "  \n\n"] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join(TOKEN_FILE);
            fs::write(&path, text).expect("write");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
            let token = load_or_create(dir.path()).expect("replaced");
            assert_eq!(token.len(), 64);
            assert_eq!(fs::read_to_string(&path).expect("read").trim(), token);
            assert_eq!(mode(&path), 0o600);
            assert_eq!(names(dir.path()), vec![TOKEN_FILE.to_owned()]);
        }
    }

    #[test]
    fn a_temporary_left_by_a_crash_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stale = dir.path().join(".token.0123456789abcdef.tmp");
        fs::write(&stale, "half").expect("write");
        let token = load_or_create(dir.path()).expect("create");
        assert_eq!(token.len(), 64);
        assert_eq!(names(dir.path()), vec![TOKEN_FILE.to_owned()]);
    }

    #[test]
    fn a_symbolic_link_is_never_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("elsewhere");
        fs::write(&real, "b".repeat(64)).expect("write");
        fs::set_permissions(&real, fs::Permissions::from_mode(0o600)).expect("chmod");
        let path = dir.path().join(TOKEN_FILE);
        std::os::unix::fs::symlink(&real, &path).expect("symlink");
        let err = load_or_create(dir.path()).expect_err("refused");
        assert!(
            matches!(
                err,
                TokenError::NotRegular {
                    kind: "a symbolic link",
                    ..
                }
            ),
            "{err}"
        );
        assert!(matches!(
            read_checked(&path),
            Err(TokenError::NotRegular { .. })
        ));
        // A dangling link is refused too, never created through.
        fs::remove_file(&real).expect("rm");
        assert!(matches!(
            load_or_create(dir.path()),
            Err(TokenError::NotRegular { .. })
        ));
        assert!(!real.exists(), "nothing was written through the link");
    }

    #[test]
    fn a_fifo_or_directory_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(TOKEN_FILE);
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        assert!(matches!(
            load_or_create(dir.path()),
            Err(TokenError::NotRegular { kind: "a FIFO", .. })
        ));
        fs::remove_file(&path).expect("rm");
        fs::create_dir(&path).expect("mkdir");
        assert!(matches!(
            load_or_create(dir.path()),
            Err(TokenError::NotRegular {
                kind: "a directory",
                ..
            })
        ));
    }

    #[test]
    fn a_file_of_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root to give a file away");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(TOKEN_FILE);
        fs::write(&path, "c".repeat(64)).expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::chown(&path, Some(65534), None).expect("chown");
        assert!(matches!(
            load_or_create(dir.path()),
            Err(TokenError::Owner { owner: 65534, .. })
        ));
    }
}
