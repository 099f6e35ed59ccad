//! The broker's state on disk, under the data directory.
//!
//! ```text
//! <data>/computers/<id>/computer.json   ComputerRecord (with its lease and generation)
//! <data>/computers/<id>/intent.json     Intent: a create or remove under way
//! <data>/computers/<id>/workspace/      the desktop's workspace (uid 1000), kept on remove
//! <data>/computers/<id>/run/            bind-mounted to /run/dormouse (supervisor.sock)
//! <data>/computers/<id>/last-screen.webp LastScreen: the screen before the last stop
//! <data>/stops/<sha256(key)>.json       StopRecord: why the broker stopped it
//! ```
//!
//! Errors carry host paths: they go to the log, and reach a client only
//! as "the state directory could not be read or written".
//!
//! Files are 0600, directories 0700, and every write is atomic: a temp file
//! in the same directory, fsync, rename over the target, fsync of the
//! directory. A crash leaves either the old or the new file, never a torn one.
//! This module owns file formats and paths; it never talks to the engine.

pub mod computer;
pub mod intent;
pub mod last_screen;
pub mod lease;
pub mod stop_reason;

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

use crate::faults;
pub use crate::paths::Paths;
pub use computer::{ComputerRecord, ComputerStore};
pub use last_screen::LastScreen;
pub use lease::Lease;
pub use stop_reason::{StopReasonStore, StopRecord};

/// Largest state file the broker reads; its own files are a few KiB.
const MAX_STATE_FILE: u64 = 1024 * 1024;

/// What can go wrong with the state directory.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A state file does not parse.
    #[error("{path} is not valid: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// File-system work on the blocking pool did not finish (it panicked or
    /// the runtime is shutting down).
    #[error("blocking file-system task: {0}")]
    Task(String),
}

impl StoreError {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_owned(),
            source,
        }
    }
}

/// Creates `path` and its missing parents with mode 0700, and makes sure the
/// leaf is 0700 even if it existed with a wider mode.
pub fn ensure_dir(path: &Path) -> Result<(), StoreError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| StoreError::io("create directory", path, e))?;
    let meta = fs::symlink_metadata(path).map_err(|e| StoreError::io("stat", path, e))?;
    if !meta.is_dir() {
        return Err(StoreError::io(
            "create directory",
            path,
            std::io::Error::other("exists and is not a directory"),
        ));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))
            .map_err(|e| StoreError::io("chmod 0700", path, e))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically: a 0600 temp file beside it, fsync,
/// rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().ok_or_else(|| {
        StoreError::io("write", path, std::io::Error::other("path has no parent"))
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", Uuid::new_v4().simple()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| StoreError::io("create", &tmp, e))?;
        file.write_all(bytes)
            .map_err(|e| StoreError::io("write", &tmp, e))?;
        faults::step("store: temp file written");
        file.sync_all()
            .map_err(|e| StoreError::io("fsync", &tmp, e))?;
        faults::step("store: temp file fsynced");
        fs::rename(&tmp, path).map_err(|e| StoreError::io("rename", path, e))?;
        faults::step("store: renamed into place");
        sync_dir(dir)?;
        faults::step("store: directory fsynced");
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes the temp files of atomic writes ([`write_atomic`]) that a crash
/// cut short, in every computer directory and among the stop records;
/// returns how many. Only at start-up, before anything writes. Blocking.
pub fn remove_stale_temps(paths: &Paths) -> usize {
    let mut dirs = vec![paths.stops(), paths.data().to_owned()];
    if let Ok(entries) = fs::read_dir(paths.computers()) {
        dirs.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    let mut removed = 0;
    for dir in dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let ours = name.starts_with('.') && name.ends_with(".tmp");
            if ours && entry.file_type().is_ok_and(|t| t.is_file()) {
                match fs::remove_file(entry.path()) {
                    Ok(()) => removed += 1,
                    Err(e) => {
                        tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove a stale temp file");
                    }
                }
            }
        }
    }
    removed
}

/// fsyncs a directory so a rename or unlink in it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io("fsync directory", dir, e))
}

/// Serialises `value` as pretty JSON and writes it atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StoreError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| StoreError::Corrupt {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

/// Reads a JSON state file; `Ok(None)` when it does not exist. Refuses
/// symlinks and files larger than a state file can be.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StoreError> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("open", path, e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_STATE_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| StoreError::io("read", path, e))?;
    if bytes.len() as u64 > MAX_STATE_FILE {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            message: format!("larger than {MAX_STATE_FILE} bytes"),
        });
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::Corrupt {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// Removes a file and makes the removal durable; a missing file is fine.
pub fn remove_file(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("remove", path, e)),
    }
    faults::step("store: file removed");
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    faults::step("store: removal fsynced");
    Ok(())
}

/// Removes a directory tree (never following links out of it); a missing
/// one is fine. This can take long (a guest may have made many files): call
/// it on the blocking pool, never on the owner task.
pub fn remove_tree(op: &'static str, path: &Path) -> Result<(), StoreError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io(op, path, e)),
    }
}

/// `O_NOFOLLOW`: a state file that is a symlink is refused, not followed.
pub(crate) fn libc_o_nofollow() -> i32 {
    nix::fcntl::OFlag::O_NOFOLLOW.bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_are_0600_in_0700_dirs_and_leave_no_temp_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/b");
        ensure_dir(&dir).expect("dir");
        let file = dir.join("x.json");
        write_json(&file, &serde_json::json!({"n": 1})).expect("write");
        write_json(&file, &serde_json::json!({"n": 2})).expect("overwrite");
        let meta = fs::metadata(&file).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(&dir).expect("meta").permissions().mode() & 0o777,
            0o700
        );
        let value: serde_json::Value = read_json(&file).expect("read").expect("exists");
        assert_eq!(value["n"], 2);
        let names: Vec<_> = fs::read_dir(&dir)
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.json")]);
    }

    #[test]
    fn wider_existing_dirs_are_tightened() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("d");
        fs::create_dir(&dir).expect("mkdir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure_dir(&dir).expect("ensure");
        assert_eq!(
            fs::metadata(&dir).expect("meta").permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn missing_files_read_as_none_and_symlinks_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing: Option<serde_json::Value> =
            read_json(&tmp.path().join("nope.json")).expect("read");
        assert!(missing.is_none());
        let target = tmp.path().join("t.json");
        fs::write(&target, "{}").expect("write");
        let link = tmp.path().join("l.json");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(read_json::<serde_json::Value>(&link).is_err());
    }
}
