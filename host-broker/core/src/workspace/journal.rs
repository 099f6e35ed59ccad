//! The journal of file writes in progress, so a broker that dies in the
//! middle of one leaves no temp file in the workspace.
//!
//! A write ([`super::files::write_file`]) fills a temp file beside its
//! target and renames it into place. Before the temp file exists, one
//! entry is made durable in `<workspace>.writes/` (beside the workspace, the
//! broker's own, never the guest's): its name is the write's id, its content
//! the workspace-relative directory the temp file goes in. The entry goes
//! once the write has ended either way. [`recover`], run at start-up for
//! every workspace, removes the temp file of each entry left behind (only a
//! regular file of exactly that name, found without following a link), then
//! the entry.
//!
//! It must never remove anything in the workspace but a temp file whose
//! name carries the id of one of its entries.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::{unlinkat, UnlinkatFlags};

use super::path::{kind_of, WorkspacePath, WorkspaceRoot};
use super::tree::lstat_at;
use super::WorkspaceError;

/// Longest entry read back (a workspace path is bounded well below this).
const MAX_ENTRY: u64 = 64 * 1024;

/// The temp file's name of write `id`.
pub fn temp_name(id: &str) -> String {
    format!(".dormouse-write-{id}.tmp")
}

/// Where the entries of the workspace at `workspace` live.
fn dir_of(workspace: &Path) -> Option<PathBuf> {
    let mut name = workspace.file_name()?.to_owned();
    name.push(".writes");
    Some(workspace.with_file_name(name))
}

/// A write's durable entry; [`Entry::done`] removes it.
#[derive(Debug)]
pub struct Entry(PathBuf);

/// Records, durably, that write `id` is about to put a temp file in `dir`
/// (workspace-relative) of `root`.
pub fn begin(root: &WorkspaceRoot, dir: &WorkspacePath, id: &str) -> Result<Entry, WorkspaceError> {
    let journal = dir_of(root.path()).ok_or_else(|| {
        WorkspaceError::io(
            "journal a write of",
            root.path().display(),
            std::io::Error::other("the workspace has no name"),
        )
    })?;
    let err = |op: &'static str, path: &Path| {
        let path = path.display().to_string();
        move |e: std::io::Error| WorkspaceError::io(op, path, e)
    };
    fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&journal)
        .map_err(err("create", &journal))?;
    let entry = journal.join(id);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&entry)
        .map_err(err("create", &entry))?;
    file.write_all(dir.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(err("write", &entry))?;
    File::open(&journal)
        .and_then(|d| d.sync_all())
        .map_err(err("fsync", &journal))?;
    Ok(Entry(entry))
}

impl Entry {
    /// The write ended (its temp file renamed or removed): forget it. Not
    /// fsynced: an entry that comes back after a crash finds no temp file.
    pub fn done(self) {
        if let Err(e) = fs::remove_file(&self.0) {
            tracing::warn!(entry = %self.0.display(), error = %e, "cannot remove a write's journal entry; the next start-up does");
        }
    }
}

/// Removes the temp files of writes cut short by a crash in the workspace
/// at `workspace`, and their entries; returns how many temp files went.
/// Blocking.
pub fn recover(workspace: &Path) -> Result<usize, WorkspaceError> {
    let Some(journal) = dir_of(workspace) else {
        return Ok(0);
    };
    let entries = match fs::read_dir(&journal) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(WorkspaceError::io("list", journal.display(), e)),
    };
    let root = WorkspaceRoot::open(workspace).ok();
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let id = name.to_string_lossy();
        let valid = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
        if valid {
            if let Some(root) = &root {
                if remove_temp(root, &path, &id)? {
                    removed += 1;
                }
            }
        }
        fs::remove_file(&path).map_err(|e| WorkspaceError::io("remove", path.display(), e))?;
    }
    let _ = fs::remove_dir(&journal);
    if removed > 0 {
        tracing::warn!(workspace = %workspace.display(), removed, "removed the temp files of writes cut short by a crash");
    }
    Ok(removed)
}

/// Removes the temp file entry `path` names, if it is there and a regular
/// file.
fn remove_temp(root: &WorkspaceRoot, path: &Path, id: &str) -> Result<bool, WorkspaceError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|f| f.take(MAX_ENTRY).read_to_end(&mut bytes))
        .map_err(|e| WorkspaceError::io("read", path.display(), e))?;
    let Ok(dir) = WorkspacePath::parse(&bytes) else {
        return Ok(false);
    };
    // A directory the guest removed or swapped for a link since: nothing
    // of ours can be in it.
    let Ok(dir) = root.open_dir(&dir) else {
        return Ok(false);
    };
    let temp = temp_name(id);
    let temp = OsStr::new(&temp);
    match lstat_at(dir.as_fd(), temp) {
        Ok(Some(st)) if kind_of(st.st_mode) == nix::sys::stat::SFlag::S_IFREG => {}
        _ => return Ok(false),
    }
    match unlinkat(&dir, temp, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => {
            let _ = nix::unistd::fsync(&dir);
            Ok(true)
        }
        Err(nix::errno::Errno::ENOENT) => Ok(false),
        Err(e) => Err(WorkspaceError::io(
            "remove",
            temp.to_string_lossy(),
            e.into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_cut_short_leaves_nothing_after_recovery() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("workspace");
        fs::create_dir_all(ws.join("notes")).unwrap();
        fs::write(ws.join("notes/keep.txt"), "kept").unwrap();
        let root = WorkspaceRoot::open(&ws).unwrap();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = WorkspacePath::parse(b"notes").unwrap();
        let _entry = begin(&root, &dir, &id).unwrap();
        // The crash: the temp file is there, the entry is never done.
        fs::write(ws.join("notes").join(temp_name(&id)), "half").unwrap();
        assert_eq!(recover(&ws).unwrap(), 1);
        let names: Vec<_> = fs::read_dir(ws.join("notes"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("keep.txt")]);
        assert!(!tmp.path().join("workspace.writes").exists());
        // Nothing journaled: nothing to do.
        assert_eq!(recover(&ws).unwrap(), 0);
    }

    #[test]
    fn a_finished_write_leaves_no_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("workspace");
        fs::create_dir_all(&ws).unwrap();
        let root = WorkspaceRoot::open(&ws).unwrap();
        let id = uuid::Uuid::new_v4().simple().to_string();
        begin(&root, &WorkspacePath::root(), &id).unwrap().done();
        let left: Vec<_> = fs::read_dir(tmp.path().join("workspace.writes"))
            .unwrap()
            .collect();
        assert!(left.is_empty());
    }
}
