//! Reading, listing, writing and deleting entries of a workspace from the
//! host, whether the desktop runs or not.
//!
//! Directories on the way are opened through [`WorkspaceRoot`] (no symlink
//! anywhere, never out of the root); the last component is then handled by
//! a `*at` call on its parent's descriptor that never follows it: a symlink
//! there is refused for reading and writing, and removed itself (never its
//! target) by a delete. Writes are atomic: a temp file in the same directory
//! opened by descriptor, capped, fsynced, owned by `desk`, renamed into
//! place, the directory fsynced. This module must never follow a link and
//! never write through an existing file's inode (a hard link to it stays
//! untouched by a write).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write as _};
use std::os::fd::{AsFd, OwnedFd};

use chrono::{DateTime, Utc};
pub use dormouse_protocol::workspace::{
    Deleted as DeleteOutcome, DirEntry, EntryType, Listing, Written as WriteOutcome,
};
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{fchmod, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::journal;
use super::path::{kind_of, resolve_error, PathError, WorkspacePath, WorkspaceRoot};
use super::tree::{self, chown_fd, lstat_at, open_child_dir, open_regular, read_names};
use super::{Owner, WorkspaceError};
use crate::faults;

/// Limits and ownership for file operations.
#[derive(Debug, Clone)]
pub struct FilesConfig {
    /// Largest file a read serves (default 4 GiB).
    pub max_read_bytes: u64,
    /// Largest body a write accepts (default 1 GiB).
    pub max_write_bytes: u64,
    /// Most entries a listing returns (default 10,000; `truncated` beyond).
    pub max_list_entries: usize,
    /// Most entries a recursive delete removes (default 100,000; refused
    /// beyond, before anything is removed).
    pub max_delete_entries: u64,
    /// Who owns written files and created directories (default 1000:1000).
    pub owner: Owner,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            max_read_bytes: 4 << 30,
            max_write_bytes: 1 << 30,
            max_list_entries: 10_000,
            max_delete_entries: 100_000,
            owner: Owner::DESK,
        }
    }
}

/// What an entry is, seen without following it.
pub(crate) fn entry_type(st: &FileStat) -> EntryType {
    let k = kind_of(st.st_mode);
    if k == SFlag::S_IFREG {
        EntryType::File
    } else if k == SFlag::S_IFDIR {
        EntryType::Dir
    } else if k == SFlag::S_IFLNK {
        EntryType::Symlink
    } else {
        EntryType::Other
    }
}

/// An open regular file to stream.
#[derive(Debug)]
pub struct FileRead {
    /// The file, opened without following a link.
    pub file: File,
    /// Its size when opened; stream exactly this much.
    pub size: u64,
    /// Its modification time when opened.
    pub mtime: DateTime<Utc>,
}

impl FileRead {
    /// A reader of at most [`Self::size`] bytes (a file growing while it is
    /// served is cut at the size announced).
    pub fn into_reader(self) -> io::Take<File> {
        let size = self.size;
        self.file.take(size)
    }
}

/// What a path opened to.
#[derive(Debug)]
pub enum Opened {
    /// A regular file, ready to stream.
    File(FileRead),
    /// A directory, listed.
    Dir(Listing),
}

/// Options of a write.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOptions {
    /// Create missing parent directories (0755, owned like the file).
    pub create_parents: bool,
    /// Permission bits of a new file (default 0644); set-id bits and
    /// world-write are dropped. An existing file keeps its bits.
    pub mode: Option<u32>,
}

/// Opens `rel`: a regular file to stream, or a directory's listing. A
/// symlink, fifo, socket or device is refused.
pub fn open(
    root: &WorkspaceRoot,
    rel: &WorkspacePath,
    cfg: &FilesConfig,
) -> Result<Opened, WorkspaceError> {
    if rel.is_root() {
        return list_dir(root, rel, cfg).map(Opened::Dir);
    }
    let (parent, name) = root.open_parent(rel)?;
    let st = lstat_at(parent.as_fd(), name)
        .map_err(|e| WorkspaceError::io("stat", rel, e))?
        .ok_or_else(|| WorkspaceError::NotFound {
            path: rel.to_string(),
        })?;
    match entry_type(&st) {
        EntryType::Dir => {
            let dir = open_child_dir(parent.as_fd(), name).map_err(|e| io_to_resolve(e, rel))?;
            list_fd(dir, cfg)
                .map_err(|e| WorkspaceError::io("list", rel, e))
                .map(Opened::Dir)
        }
        EntryType::File => open_file_at(parent, name, &st, rel, cfg).map(Opened::File),
        EntryType::Symlink => Err(WorkspaceError::Symlink {
            path: rel.to_string(),
        }),
        EntryType::Other => Err(WorkspaceError::NotAFile {
            path: rel.to_string(),
        }),
    }
}

/// Opens the regular file `rel` to stream; at most
/// [`FilesConfig::max_read_bytes`].
pub fn read_file(
    root: &WorkspaceRoot,
    rel: &WorkspacePath,
    cfg: &FilesConfig,
) -> Result<FileRead, WorkspaceError> {
    match open(root, rel, cfg)? {
        Opened::File(f) => Ok(f),
        Opened::Dir(_) => Err(WorkspaceError::IsADirectory {
            path: rel.to_string(),
        }),
    }
}

fn open_file_at(
    parent: OwnedFd,
    name: &OsStr,
    st: &FileStat,
    rel: &WorkspacePath,
    cfg: &FilesConfig,
) -> Result<FileRead, WorkspaceError> {
    let (file, st) = open_regular(parent.as_fd(), name, Some(st))
        .map_err(|e| io_to_resolve(e, rel))?
        // Swapped for something else between the two looks.
        .ok_or_else(|| WorkspaceError::NotAFile {
            path: rel.to_string(),
        })?;
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > cfg.max_read_bytes {
        return Err(WorkspaceError::TooLarge {
            path: rel.to_string(),
            limit: cfg.max_read_bytes,
        });
    }
    Ok(FileRead {
        file,
        size,
        mtime: mtime_of(&st),
    })
}

/// Lists the directory `rel` (the root when empty), sorted by name, at most
/// [`FilesConfig::max_list_entries`] entries.
pub fn list_dir(
    root: &WorkspaceRoot,
    rel: &WorkspacePath,
    cfg: &FilesConfig,
) -> Result<Listing, WorkspaceError> {
    let dir = root.open_dir(rel)?;
    list_fd(dir, cfg).map_err(|e| WorkspaceError::io("list", rel, e))
}

fn list_fd(dir: OwnedFd, cfg: &FilesConfig) -> io::Result<Listing> {
    let (names, truncated) = read_names(dir.as_fd(), cfg.max_list_entries)?;
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        // Gone meanwhile: not listed.
        let Some(st) = lstat_at(dir.as_fd(), &name)? else {
            continue;
        };
        entries.push(DirEntry {
            name: name.to_string_lossy().into_owned(),
            kind: entry_type(&st),
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime: mtime_of(&st),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Listing { entries, truncated })
}

/// Writes `body` to `rel` atomically: readers see the old content or the
/// whole new one, never a part. At most [`FilesConfig::max_write_bytes`];
/// the file belongs to [`FilesConfig::owner`]. A symlink, directory or
/// special file at `rel` is refused, never written through.
pub fn write_file(
    root: &WorkspaceRoot,
    rel: &WorkspacePath,
    body: impl Read,
    opts: WriteOptions,
    cfg: &FilesConfig,
) -> Result<WriteOutcome, WorkspaceError> {
    let (parent_rel, name) = rel.split_last().ok_or(PathError::Root)?;
    let parent = if opts.create_parents {
        ensure_dirs(root, &parent_rel, cfg.owner)?
    } else {
        root.open_dir(&parent_rel)?
    };
    let existing =
        lstat_at(parent.as_fd(), name).map_err(|e| WorkspaceError::io("stat", rel, e))?;
    let mode = match &existing {
        None => sane_file_mode(opts.mode.unwrap_or(0o644)),
        Some(st) => match entry_type(st) {
            EntryType::File => st.st_mode & 0o777,
            EntryType::Dir => {
                return Err(WorkspaceError::IsADirectory {
                    path: rel.to_string(),
                })
            }
            EntryType::Symlink => {
                return Err(WorkspaceError::Symlink {
                    path: rel.to_string(),
                })
            }
            EntryType::Other => {
                return Err(WorkspaceError::NotAFile {
                    path: rel.to_string(),
                })
            }
        },
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let tmp = journal::temp_name(&id);
    // Durable before the temp file exists, so a crash cannot leave it.
    let entry = journal::begin(root, &parent_rel, &id)?;
    faults::step("write: journaled");
    let fd = match openat(
        &parent,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            entry.done();
            return Err(WorkspaceError::io(
                "create temp file in",
                &parent_rel,
                e.into(),
            ));
        }
    };
    let target = Target {
        parent: &parent,
        tmp: &tmp,
        name,
        rel,
    };
    let result = fill_and_rename(&target, fd, body, mode, cfg);
    if result.is_err() {
        let _ = unlinkat(&parent, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    entry.done();
    let bytes = result?;
    Ok(WriteOutcome {
        bytes,
        created: existing.is_none(),
    })
}

/// Makes the directory `rel` (0755, owned by [`FilesConfig::owner`]); with
/// `parents`, the missing directories on the way too. An existing
/// directory is no error (`created` false); a file, link or special file
/// at `rel` is refused, and no link is ever followed.
pub fn make_dir(
    root: &WorkspaceRoot,
    rel: &WorkspacePath,
    parents: bool,
    cfg: &FilesConfig,
) -> Result<WriteOutcome, WorkspaceError> {
    let (parent_rel, name) = rel.split_last().ok_or(PathError::Root)?;
    let parent = if parents {
        ensure_dirs(root, &parent_rel, cfg.owner)?
    } else {
        root.open_dir(&parent_rel)?
    };
    let existing =
        lstat_at(parent.as_fd(), name).map_err(|e| WorkspaceError::io("stat", rel, e))?;
    match existing.as_ref().map(entry_type) {
        None | Some(EntryType::Dir) => {}
        Some(EntryType::Symlink) => {
            return Err(WorkspaceError::Symlink {
                path: rel.to_string(),
            })
        }
        Some(EntryType::File | EntryType::Other) => {
            return Err(WorkspaceError::NotADirectory {
                path: rel.to_string(),
            })
        }
    }
    ensure_dirs(root, rel, cfg.owner)?;
    Ok(WriteOutcome {
        bytes: 0,
        created: existing.is_none(),
    })
}

/// Where a write lands: its directory, its temp name and its final name.
struct Target<'a> {
    parent: &'a OwnedFd,
    tmp: &'a str,
    name: &'a OsStr,
    rel: &'a WorkspacePath,
}

fn fill_and_rename(
    target: &Target<'_>,
    fd: OwnedFd,
    body: impl Read,
    mode: u32,
    cfg: &FilesConfig,
) -> Result<u64, WorkspaceError> {
    let Target {
        parent,
        tmp,
        name,
        rel,
    } = *target;
    let io = |op| move |e: io::Error| WorkspaceError::io(op, rel, e);
    let mut file = File::from(fd);
    let bytes = io::copy(
        &mut body.take(cfg.max_write_bytes.saturating_add(1)),
        &mut file,
    )
    .map_err(io("write"))?;
    if bytes > cfg.max_write_bytes {
        return Err(WorkspaceError::TooLarge {
            path: rel.to_string(),
            limit: cfg.max_write_bytes,
        });
    }
    file.flush().map_err(io("write"))?;
    faults::step("write: temp file written");
    // Mode before owner: once it belongs to someone else a chmod would need
    // CAP_FOWNER.
    fchmod(&file, Mode::from_bits_truncate(mode)).map_err(|e| io("chmod")(e.into()))?;
    chown_fd(&file, cfg.owner).map_err(io("chown"))?;
    file.sync_all().map_err(io("fsync"))?;
    faults::step("write: temp file fsynced");
    // rename replaces the name: a symlink planted there meanwhile is
    // replaced, not followed; a directory makes it fail.
    renameat(parent, tmp, parent, name).map_err(|e| match e {
        Errno::EISDIR | Errno::ENOTEMPTY | Errno::EEXIST => WorkspaceError::IsADirectory {
            path: rel.to_string(),
        },
        e => WorkspaceError::io("rename into place", rel, e.into()),
    })?;
    faults::step("write: renamed into place");
    nix::unistd::fsync(parent).map_err(|e| io("fsync directory of")(e.into()))?;
    faults::step("write: directory fsynced");
    Ok(bytes)
}

/// Opens `rel` as a directory, making missing components (0755, owned by
/// `owner`) on the way; never follows a link.
fn ensure_dirs(
    root: &WorkspaceRoot,
    rel: &WorkspacePath,
    owner: Owner,
) -> Result<OwnedFd, WorkspaceError> {
    match root.open_dir(rel) {
        Err(WorkspaceError::NotFound { .. }) => {}
        other => return other,
    }
    let mut dir = root.open_dir(&WorkspacePath::root())?;
    let mut so_far = WorkspacePath::root();
    for name in rel.components() {
        so_far = so_far.join_unchecked(name);
        match mkdirat(&dir, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) => {
                let child =
                    open_child_dir(dir.as_fd(), name).map_err(|e| io_to_resolve(e, &so_far))?;
                fchmod(&child, Mode::from_bits_truncate(0o755))
                    .map_err(|e| WorkspaceError::io("chmod", &so_far, e.into()))?;
                chown_fd(&child, owner).map_err(|e| WorkspaceError::io("chown", &so_far, e))?;
                nix::unistd::fsync(&dir)
                    .map_err(|e| WorkspaceError::io("fsync", &so_far, e.into()))?;
                dir = child;
            }
            Err(Errno::EEXIST) => {
                dir = root.open_dir(&so_far)?;
            }
            Err(e) => return Err(resolve_error(e, &so_far, "mkdir")),
        }
    }
    Ok(dir)
}

/// Deletes `rel`: a file, symlink (the link itself) or special file; an
/// empty directory; with `recursive`, a directory and everything below it,
/// refused before anything is removed when it holds more than
/// [`FilesConfig::max_delete_entries`]. A tree the guest keeps changing
/// under the removal is [`WorkspaceError::Changed`] (what was removed stays
/// removed; nothing outside the tree is touched).
pub fn delete(
    root: &WorkspaceRoot,
    rel: &WorkspacePath,
    recursive: bool,
    cfg: &FilesConfig,
) -> Result<DeleteOutcome, WorkspaceError> {
    let (parent, name) = root.open_parent(rel)?;
    let st = lstat_at(parent.as_fd(), name)
        .map_err(|e| WorkspaceError::io("stat", rel, e))?
        .ok_or_else(|| WorkspaceError::NotFound {
            path: rel.to_string(),
        })?;
    let removed = if entry_type(&st) != EntryType::Dir {
        unlinkat(&parent, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| resolve_error(e, rel, "delete"))?;
        1
    } else if !recursive {
        unlinkat(&parent, name, UnlinkatFlags::RemoveDir).map_err(|e| match e {
            Errno::ENOTEMPTY | Errno::EEXIST => WorkspaceError::NotEmpty {
                path: rel.to_string(),
            },
            e => resolve_error(e, rel, "delete"),
        })?;
        1
    } else {
        let dir = open_child_dir(parent.as_fd(), name).map_err(|e| io_to_resolve(e, rel))?;
        let depth = super::path::MAX_COMPONENTS;
        let counted = tree::count_bounded(dir.as_fd(), cfg.max_delete_entries, depth)
            .map_err(|e| removal_error(e.into(), rel))?;
        if counted.is_none() {
            return Err(WorkspaceError::TooManyEntries {
                path: rel.to_string(),
                limit: cfg.max_delete_entries,
            });
        }
        drop(dir);
        // Room for what the guest adds while the tree goes, and no more: a
        // guest that adds entries as fast as they go gets `Changed`.
        let budget = cfg.max_delete_entries.saturating_mul(2).saturating_add(1);
        let mut left = budget;
        let removed = tree::remove_tree(parent.as_fd(), name, depth + 1, &mut left);
        removed.map_err(|e| removal_error(e, rel))?;
        budget - left
    };
    nix::unistd::fsync(&parent)
        .map_err(|e| WorkspaceError::io("fsync directory of", rel, e.into()))?;
    Ok(DeleteOutcome { removed })
}

/// Permission bits allowed on a file the host creates: no set-id, no
/// sticky, no world-write.
pub(crate) fn sane_file_mode(mode: u32) -> u32 {
    mode & 0o775
}

/// Permission bits allowed on a directory the host creates: as a file's,
/// and always usable by its owner.
pub(crate) fn sane_dir_mode(mode: u32) -> u32 {
    (mode & 0o775) | 0o700
}

/// `st_mtime` as a UTC time (the epoch when out of range).
pub(crate) fn mtime_of(st: &FileStat) -> DateTime<Utc> {
    let nanos = u32::try_from(st.st_mtime_nsec).unwrap_or(0);
    DateTime::from_timestamp(st.st_mtime, nanos).unwrap_or_default()
}

/// A failed recursive removal: a race with the guest (an entry swapped for
/// a link or a directory, entries added faster than removed) is
/// [`WorkspaceError::Changed`], anything else an I/O failure.
fn removal_error(e: tree::RemoveError, rel: &WorkspacePath) -> WorkspaceError {
    match e {
        tree::RemoveError::Changed => WorkspaceError::Changed {
            path: rel.to_string(),
        },
        tree::RemoveError::Io(e) => WorkspaceError::io("delete", rel, e),
    }
}

/// An `io::Error` from an `*at` step on a last component, typed like a
/// resolution failure.
fn io_to_resolve(e: io::Error, rel: &WorkspacePath) -> WorkspaceError {
    match e.raw_os_error() {
        Some(n) => resolve_error(Errno::from_raw(n), rel, "open"),
        None => WorkspaceError::io("open", rel, e),
    }
}
