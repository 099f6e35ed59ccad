//! Wire types of the workspace routes: directory listings, file writes and
//! deletes, disk usage, and import summaries
//! (`/v1/computers/{id}/files/…`, `/disk`, `/workspace`).
//!
//! Shapes only: what a path may be and what is refused is the broker's.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Query parameter of `POST /v1/computers` that makes the body a tar of the
/// new desktop's workspace (name and owner then come as query parameters).
pub const WORKSPACE_TAR_QUERY: &str = "workspace_tar";

/// Content type of a workspace archive.
pub const TAR_CONTENT_TYPE: &str = "application/x-tar";

/// What an entry of a workspace is, seen without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink (listed, never followed).
    Symlink,
    /// A fifo, socket or device.
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The name (invalid UTF-8 replaced).
    pub name: String,
    /// What it is.
    #[serde(rename = "type")]
    pub kind: EntryType,
    /// `st_size` in bytes.
    pub size: u64,
    /// Last modification.
    pub mtime: DateTime<Utc>,
}

/// `GET /v1/computers/{id}/files/{dir}`: a directory's entries by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// The entries.
    pub entries: Vec<DirEntry>,
    /// The directory had more entries than listed.
    pub truncated: bool,
}

/// `PUT /v1/computers/{id}/files/{path}`: what was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    /// Bytes written.
    pub bytes: u64,
    /// The file did not exist before.
    pub created: bool,
}

/// `DELETE /v1/computers/{id}/files/{path}`: what was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    /// Entries removed, the entry itself included.
    pub removed: u64,
}

/// `GET /v1/computers/{id}/disk`: measured on request, never waking the
/// desktop or renewing its idle timer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// Bytes allocated to the workspace (`du -sB1`).
    pub workspace_bytes: u64,
    /// Sum of the sizes (`du -sb`).
    pub apparent_bytes: u64,
    /// Inodes below the workspace root, hard links counted once.
    pub workspace_files: u64,
    /// The container's writable layer as the engine reports it (`null`:
    /// no container, or the engine did not answer in time).
    pub layer_bytes: Option<u64>,
    /// Bytes still available on the workspace's filesystem.
    pub free_bytes: u64,
    /// When the measurement started.
    pub measured_at: DateTime<Utc>,
    /// The walk saw everything; `false`: the figures are lower bounds.
    pub complete: bool,
    /// How long the walk took.
    pub elapsed_ms: u64,
}

/// `PUT /v1/computers/{id}/workspace`: what the import wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imported {
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// The replaced tree was removed (else the next start-up removes it).
    #[serde(default)]
    pub old_removed: bool,
}
