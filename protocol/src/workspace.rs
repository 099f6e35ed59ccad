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

/// Query parameter of `GET /v1/computers/{id}/workspace` that picks the
/// export's compression (`gzip`, `zstd` or `none`).
pub const COMPRESSION_QUERY: &str = "compression";

/// How a workspace archive is compressed. An import recognises it by the
/// stream's first bytes; an export writes what was asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// A plain tar.
    #[default]
    None,
    /// gzip (RFC 1952), one member or several.
    Gzip,
    /// Zstandard frames (RFC 8878).
    Zstd,
}

impl Compression {
    /// The compression a name says: `gzip`/`gz`, `zstd`/`zst`,
    /// `none`/`identity`/`tar`; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "none" | "identity" | "tar" => Some(Self::None),
            "gzip" | "gz" | "x-gzip" => Some(Self::Gzip),
            "zstd" | "zst" => Some(Self::Zstd),
            _ => None,
        }
    }

    /// Its name as a query value.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Zstd => "zstd",
        }
    }

    /// The `Content-Encoding` of a stream compressed this way (`None` for
    /// a plain tar).
    pub fn content_encoding(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Gzip => Some("gzip"),
            Self::Zstd => Some("zstd"),
        }
    }

    /// The `Content-Type` of an archive compressed this way.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::None => TAR_CONTENT_TYPE,
            Self::Gzip => "application/gzip",
            Self::Zstd => "application/zstd",
        }
    }

    /// What a file name's ending says: `.tar.gz` and `.tgz` are gzip,
    /// `.tar.zst`, `.tzst` and `.tar.zstd` are zstd, anything else plain.
    pub fn of_file_name(name: &str) -> Self {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
            Self::Gzip
        } else if lower.ends_with(".tar.zst")
            || lower.ends_with(".tzst")
            || lower.ends_with(".tar.zstd")
        {
            Self::Zstd
        } else {
            Self::None
        }
    }
}

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imported {
    /// Regular files (a file with several names counts once).
    pub files: u64,
    /// Directories (listed in the archive or implied by a path).
    pub dirs: u64,
    /// Symlinks, made with their targets as given, never followed.
    #[serde(default)]
    pub symlinks: u64,
    /// Second and later names of a file (hard links).
    #[serde(default)]
    pub hard_links: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// The replaced tree was removed (else the next start-up removes it).
    #[serde(default)]
    pub old_removed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressions_are_known_by_name_and_by_file_name() {
        assert_eq!(Compression::parse("GZIP"), Some(Compression::Gzip));
        assert_eq!(Compression::parse("zst"), Some(Compression::Zstd));
        assert_eq!(Compression::parse("identity"), Some(Compression::None));
        assert_eq!(Compression::parse("xz"), None);
        assert_eq!(Compression::of_file_name("ws.tar.gz"), Compression::Gzip);
        assert_eq!(Compression::of_file_name("WS.TGZ"), Compression::Gzip);
        assert_eq!(Compression::of_file_name("ws.tar.zst"), Compression::Zstd);
        assert_eq!(Compression::of_file_name("ws.tar"), Compression::None);
        assert_eq!(Compression::of_file_name("notes.gz"), Compression::None);
        assert_eq!(Compression::Zstd.content_encoding(), Some("zstd"));
        assert_eq!(Compression::None.content_type(), TAR_CONTENT_TYPE);
    }

    #[test]
    fn an_import_summary_without_link_counts_still_reads() {
        let old = r#"{"files":1,"dirs":2,"bytes":3,"old_removed":true}"#;
        let s: Imported = serde_json::from_str(old).unwrap();
        assert_eq!((s.files, s.dirs, s.symlinks, s.hard_links), (1, 2, 0, 0));
    }
}
