//! The host side of a computer's workspace: its files, its disk usage, and
//! its export and import as tar, all done from the host without waking the
//! desktop.
//!
//! The workspace (`<data>/computers/<id>/workspace`, bind-mounted at
//! `/home/desk/workspace`) is written by the guest, so everything in it is
//! hostile: any entry may be a symlink to `/` or to another computer's
//! workspace, a fifo, or swapped for one while we look. This module resolves
//! every path below a directory file descriptor of the workspace root with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` (or an `O_NOFOLLOW` walk where `openat2` is missing) and
//! acts on the last component only with `*at` calls that never follow it.
//! It must never open a guest-controlled path with a plain path call, never
//! follow a symlink, and never write outside the workspace, its staging
//! directory and its set-aside copy.
//!
//! Every function here blocks: the API runs them in `spawn_blocking`. None of
//! them talks to the engine or the guest, so none of them starts a container
//! or renews an idle timer.
//!
//! - [`path`]: workspace-relative paths and their resolution;
//! - [`files`]: read, list, atomic write, delete;
//! - [`journal`]: the writes in progress, so a crash leaves no temp file;
//! - [`disk`]: disk usage measured on request, bounded in time;
//! - [`archive`]: export as tar (plain, gzip, zstd), import (staged, then
//!   swapped), recovery;
//! - [`stream`]: blocking `Read`/`Write` ends of a tokio channel, to pipe an
//!   export into an HTTP body or an HTTP body into an import.

pub mod archive;
pub mod disk;
pub mod files;
pub mod journal;
pub mod path;
pub mod stream;
mod tree;

use std::fmt;
use std::io;

pub use archive::{
    create_from_tar, export_archive, export_check, export_tar, recover, replace_from_tar,
    Compression, ExportSummary, ImportLimits, ImportSummary, Recovery, Refusal,
    DEFAULT_MAX_DURATION, DEFAULT_MEMORY_BUDGET,
};
pub use disk::{disk_usage, DiskUsage, DEFAULT_DISK_DEADLINE};
pub use files::{
    delete, list_dir, make_dir, open, read_file, write_file, DeleteOutcome, DirEntry, EntryType,
    FileRead, FilesConfig, Listing, Opened, WriteOptions, WriteOutcome,
};
pub use path::{PathError, Resolution, WorkspacePath, WorkspaceRoot};
pub use stream::{ChannelReader, ChannelWriter};

/// Who owns what the host writes into a workspace: the desktop user `desk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
}

impl Owner {
    /// `desk`, uid and gid 1000, the user everything in the guest runs as.
    pub const DESK: Owner = Owner {
        uid: 1000,
        gid: 1000,
    };
}

impl Default for Owner {
    fn default() -> Self {
        Self::DESK
    }
}

/// What an error means to a client, so the API can pick a status without
/// looking inside: bad input `400`, missing `404`, too slow `408`, state
/// conflict `409`, over a limit `413`, our fault `500`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request names something the workspace will not do (`400`).
    BadRequest,
    /// Nothing at that path (`404`).
    NotFound,
    /// The workspace's state forbids it now (`409`).
    Conflict,
    /// Over a size or count limit, or the memory budget (`413`).
    TooLarge,
    /// Over a time bound (`408`).
    TimedOut,
    /// An I/O failure on the host (`500`).
    Internal,
}

/// Everything that can go wrong in this module. Paths in messages are
/// workspace-relative and printed with escapes, because they come from the
/// guest.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The path was refused before touching the disk.
    #[error("bad path: {0}")]
    Path(#[from] PathError),
    /// Nothing at this path.
    #[error("{path:?} not found")]
    NotFound {
        /// Workspace-relative path.
        path: String,
    },
    /// The path is, or passes through, a symlink; symlinks are never followed.
    #[error("{path:?} is or passes through a symlink, which is never followed")]
    Symlink {
        /// Workspace-relative path.
        path: String,
    },
    /// Resolution would leave the workspace (or cross a mount point).
    #[error("{path:?} leads out of the workspace")]
    Escape {
        /// Workspace-relative path.
        path: String,
    },
    /// A directory was needed.
    #[error("{path:?} is not a directory")]
    NotADirectory {
        /// Workspace-relative path.
        path: String,
    },
    /// A file was needed, a directory was found.
    #[error("{path:?} is a directory")]
    IsADirectory {
        /// Workspace-relative path.
        path: String,
    },
    /// A regular file was needed, a fifo, socket or device was found.
    #[error("{path:?} is not a regular file")]
    NotAFile {
        /// Workspace-relative path.
        path: String,
    },
    /// A non-recursive delete of a directory that has entries.
    #[error("{path:?} is a directory that is not empty")]
    NotEmpty {
        /// Workspace-relative path.
        path: String,
    },
    /// More bytes than allowed.
    #[error("{path:?} is larger than the limit of {limit} bytes")]
    TooLarge {
        /// Workspace-relative path.
        path: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// More entries than allowed.
    #[error("{path:?} has more than {limit} entries")]
    TooManyEntries {
        /// Workspace-relative path.
        path: String,
        /// The limit.
        limit: u64,
    },
    /// An export would hold more than the import accepts (its file content
    /// or its entries), so it is refused (or, past its first byte, ended
    /// without an end-of-archive marker) at the entry that crosses the line.
    #[error("the workspace's archive would be larger than an import accepts ({max_bytes} bytes decompressed, headers included, {max_entries} entries; a sparse file counts at its full size): refused at {path:?} ({size} bytes)")]
    ExportTooLarge {
        /// The entry that crosses the line, workspace-relative.
        path: String,
        /// Its size (what its `lstat` says, holes included).
        size: u64,
        /// The import's limit on the archive's decompressed bytes.
        max_bytes: u64,
        /// The import's limit on entries.
        max_entries: u64,
    },
    /// An export's bookkeeping (first names of multiply-linked files,
    /// directory listings) would take more memory than its budget.
    #[error("the workspace's archive needs more than {budget} bytes of memory for its bookkeeping (the archive memory budget: names of files with several links, directory listings): refused at {path:?}")]
    ExportOverBudget {
        /// Where the walk was, workspace-relative.
        path: String,
        /// [`ImportLimits::memory_budget`].
        budget: u64,
    },
    /// An archive was refused; nothing was written to the workspace.
    #[error("archive refused at entry {entry:?}: {reason}")]
    Refused {
        /// The offending entry's name as the archive gives it (or a
        /// description of where in the archive, when it has none).
        entry: String,
        /// Why.
        reason: Refusal,
    },
    /// The guest changed the tree under a recursive delete (swapped an entry
    /// for a link or a directory, or added entries faster than they were
    /// removed): what was removed stays removed, nothing outside was touched.
    #[error("{path:?} changed while it was being deleted (an entry was swapped or added); part of it may be gone, nothing outside it was touched; delete it again")]
    Changed {
        /// Workspace-relative path.
        path: String,
    },
    /// Another import, swap or recovery of this workspace holds its lock.
    #[error("another import or recovery of this workspace is under way")]
    Busy,
    /// The workspace to create already exists.
    #[error("the workspace {path:?} already exists")]
    Exists {
        /// Host path.
        path: String,
    },
    /// An I/O failure on the host.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Workspace-relative or host path.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl WorkspaceError {
    /// The kind of answer this error deserves.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Path(_)
            | Self::Symlink { .. }
            | Self::Escape { .. }
            | Self::NotADirectory { .. }
            | Self::IsADirectory { .. }
            | Self::NotAFile { .. } => ErrorClass::BadRequest,
            Self::Refused { reason, .. } => reason.class(),
            Self::NotFound { .. } => ErrorClass::NotFound,
            Self::NotEmpty { .. } | Self::Changed { .. } | Self::Busy | Self::Exists { .. } => {
                ErrorClass::Conflict
            }
            Self::TooLarge { .. }
            | Self::TooManyEntries { .. }
            | Self::ExportTooLarge { .. }
            | Self::ExportOverBudget { .. } => ErrorClass::TooLarge,
            Self::Io { .. } => ErrorClass::Internal,
        }
    }

    /// An I/O error while doing `op` on `path`.
    pub(crate) fn io(op: &'static str, path: impl fmt::Display, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_string(),
            source,
        }
    }
}
