//! Export of a workspace as tar, and import of one: staged beside the
//! workspace, checked entry by entry, then swapped in atomically.
//!
//! **Export** ([`export`]) walks the workspace without following links and
//! writes a POSIX tar (ustar headers, PAX records where a value does not
//! fit: long names and link targets, sub-second times, sizes of 8 GiB and
//! more) into any `Write`, plain or compressed with gzip or zstd. Regular
//! files, directories and symlinks (their targets byte for byte) are
//! written; the second and later names of a file are hard-link entries.
//! Fifos, sockets and devices are skipped and counted, as are entries whose
//! path the import would refuse. Under `.browser-profiles` only, the
//! browsers' lock files ([`BROWSER_LOCKS`]) and cache directories
//! ([`BROWSER_CACHES`]) are left out. If the export fails half-way the
//! writer is poisoned, so no end-of-archive marker (and no compressor
//! trailer) is written and the truncated stream cannot pass for a complete
//! archive.
//!
//! **Import** ([`import`]) reads a tar, plain or compressed (gzip or zstd,
//! recognised by the stream's first bytes), from any `Read` into
//! `<workspace>.import`, a sibling of the workspace on the same filesystem,
//! never visible to the guest. It accepts regular files, directories,
//! symlinks (made with `symlinkat` under the staging directory's
//! descriptor, whatever their target) and hard links to an earlier file of
//! the same archive, with clean relative paths (a leading `./` is allowed),
//! within [`ImportLimits`]. PAX `path`, `linkpath`, `size` and `mtime` (with
//! its fraction) and GNU long names and long link names are honoured. It
//! never follows a link: an entry whose path passes through an earlier
//! symlink refuses the archive. Anything else (a device, fifo, sparse file,
//! a global PAX header that would change later entries, a PAX `size` that
//! disagrees with the header, `..`, an absolute path, a duplicate, a hard
//! link to anything not extracted before it, a missing end-of-archive
//! marker, a corrupt or truncated compressed stream, a stream that is no
//! tar at all) refuses the whole archive with the offending entry named,
//! and the staging directory is removed: nothing is written to the
//! workspace. Everything staged belongs to `desk` (1000:1000) with set-id,
//! sticky and world-write bits dropped; ownership, xattrs and ACLs in the
//! archive are ignored. Directory times are set after their contents.
//!
//! **Budget** ([`budget`]): what grows with the number of entries (an
//! import's directory times, an export's first names of multiply-linked
//! files and its directory listings) is charged against one memory budget
//! ([`ImportLimits::memory_budget`]); past it the archive is refused
//! (`413`). An import counts every decompressed byte, headers and extension
//! records included, against [`ImportLimits::max_total_bytes`], and the
//! whole import, not each frame of its upload, is bounded in time
//! ([`ImportLimits::max_duration`]).
//!
//! **Swap and crash safety** ([`recovery`]): the staged tree is flushed and
//! exchanged with the workspace in one `renameat2(RENAME_EXCHANGE)`, and
//! every crash point is made whole by [`recover`].
//!
//! This module must never extract an archive with the tar crate's own
//! unpacking (which would honour ownership and follow links), never write
//! outside the staging directory, and never follow a link, exporting or
//! importing.

mod budget;
mod compression;
pub mod export;
mod headers;
pub mod import;
pub mod recovery;

pub use dormouse_protocol::workspace::{Compression, Imported as ImportSummary};
pub use export::{export_archive, export_check, export_tar};
pub use recovery::{create_from_tar, recover, replace_from_tar, Recovery};

use std::time::Duration;

use serde::Serialize;

use super::path::PathError;
use super::{ErrorClass, Owner, WorkspaceError};

/// Under `.browser-profiles`, entries with these names are locks of a
/// running browser and are left out of an export: Chromium's
/// `SingletonLock`, `SingletonSocket`, `SingletonCookie`, Firefox's
/// `.parentlock` and `lock`.
pub const BROWSER_LOCKS: &[&str] = &[
    "SingletonLock",
    "SingletonSocket",
    "SingletonCookie",
    ".parentlock",
    "lock",
];

/// Under `.browser-profiles`, directories with these names are caches the
/// browsers rebuild and are left out of an export: Chromium's `Cache`,
/// `Code Cache`, `GPUCache`, `ShaderCache`, `GrShaderCache`,
/// `GraphiteDawnCache`, `DawnCache`, `DawnGraphiteCache`, `DawnWebGPUCache`;
/// Firefox's `cache2`, `startupCache`, `shader-cache`.
pub const BROWSER_CACHES: &[&str] = &[
    "Cache",
    "Code Cache",
    "GPUCache",
    "ShaderCache",
    "GrShaderCache",
    "GraphiteDawnCache",
    "DawnCache",
    "DawnGraphiteCache",
    "DawnWebGPUCache",
    "cache2",
    "startupCache",
    "shader-cache",
];

/// The top-level directory whose locks and caches an export leaves out.
pub const BROWSER_PROFILES: &str = ".browser-profiles";

/// Largest GNU long-name or PAX extension entry read (into memory).
pub(crate) const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

/// Most bytes accepted after the end-of-archive marker (tar writers pad
/// to their record size, 10 KiB for GNU tar, up to 1 MiB with big
/// blocking factors). A stream that goes on beyond is refused with `413`:
/// this is what stops a compression bomb of zeros.
pub const MAX_TRAILING_BYTES: u64 = 4 << 20;

/// What an export wrote and left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ExportSummary {
    /// Regular files written (a file with several names counts once).
    pub files: u64,
    /// Directories written.
    pub dirs: u64,
    /// Symlinks written.
    pub symlinks: u64,
    /// Hard-link entries written (second and later names of a file).
    pub hard_links: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Fifos, sockets and devices left out.
    pub skipped_special: u64,
    /// Browser locks and cache directories left out (a directory counts once).
    pub skipped_browser_state: u64,
    /// Entries whose path the import would refuse (too long or too deep).
    pub skipped_unimportable: u64,
    /// Files that shrank while being read (padded with zeros to the size
    /// their header announced) or vanished before they could be opened.
    pub changed_while_reading: u64,
}

/// Limits of an import (and of an export, which must make nothing the
/// import refuses).
#[derive(Debug, Clone)]
pub struct ImportLimits {
    /// Most bytes of the archive, decompressed: file content, headers,
    /// extension records, padding and what follows the end-of-archive
    /// marker, every byte counted (default 10 GiB).
    pub max_total_bytes: u64,
    /// Most entries, of every type together (default 1,000,000).
    pub max_entries: u64,
    /// Most bytes of memory the per-entry bookkeeping of one import or
    /// export may take: an import's directory times, an export's first
    /// names of multiply-linked files and its directory listings (default
    /// 64 MiB).
    pub memory_budget: u64,
    /// Longest an import may take, from its first byte read to its last,
    /// however the upload trickles (default 1 hour).
    pub max_duration: Duration,
    /// Who owns everything imported (default 1000:1000).
    pub owner: Owner,
}

/// Default of [`ImportLimits::memory_budget`].
pub const DEFAULT_MEMORY_BUDGET: u64 = 64 << 20;

/// Default of [`ImportLimits::max_duration`].
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(3600);

impl Default for ImportLimits {
    fn default() -> Self {
        Self {
            max_total_bytes: 10 << 30,
            max_entries: 1_000_000,
            memory_budget: DEFAULT_MEMORY_BUDGET,
            max_duration: DEFAULT_MAX_DURATION,
            owner: Owner::DESK,
        }
    }
}

/// Why an archive was refused. Messages are words, never bytes of the
/// archive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A character or block device.
    #[error("devices are not accepted")]
    Device,
    /// A fifo.
    #[error("fifos are not accepted")]
    Fifo,
    /// A GNU sparse file.
    #[error("sparse files are not accepted")]
    Sparse,
    /// Any other entry type.
    #[error("entry type {0:?} is not accepted (only files, directories, symlinks and hard links)")]
    Unsupported(char),
    /// The path is refused.
    #[error("{0}")]
    Path(PathError),
    /// The path passes through a symlink made by an earlier entry.
    #[error(
        "its path passes through the symlink {0:?} of an earlier entry, which is never followed"
    )]
    ThroughSymlink(String),
    /// A hard link's target path is refused.
    #[error("the hard link's target is refused: {0}")]
    LinkTargetPath(PathError),
    /// A hard link to something no earlier entry of the archive made.
    #[error("the hard link's target {0:?} is not a file or link earlier in the archive")]
    LinkTargetUnknown(String),
    /// A link without a target, or with one the filesystem refuses.
    #[error("the link target is {0}")]
    BadLinkTarget(&'static str),
    /// A regular file whose name ends in `/`.
    #[error("a regular file's name ends in `/`")]
    FileWithSlash,
    /// A regular file for the workspace itself.
    #[error("a regular file names the workspace itself")]
    FileIsRoot,
    /// The same file twice, or a file where a directory is, or the reverse.
    #[error("the entry collides with an earlier one")]
    Duplicate,
    /// A path passes through a file.
    #[error("a parent of the entry is not a directory")]
    ParentNotDir,
    /// More entries than [`ImportLimits::max_entries`].
    #[error("more than {0} entries")]
    TooManyEntries(u64),
    /// More decompressed bytes than [`ImportLimits::max_total_bytes`].
    #[error("more than {0} bytes decompressed (content, headers and extension records)")]
    TooLarge(u64),
    /// The bookkeeping of the archive's entries would take more than
    /// [`ImportLimits::memory_budget`].
    #[error("the bookkeeping of its entries needs more than {0} bytes of memory (the archive memory budget)")]
    OverBudget(u64),
    /// The import took longer than [`ImportLimits::max_duration`].
    #[error("the import took longer than {} s (the time bound of a whole import)", .0.as_secs())]
    TooSlow(Duration),
    /// More than [`MAX_TRAILING_BYTES`] after the end-of-archive marker.
    #[error("more than {0} bytes follow the end of the archive")]
    TrailingData(u64),
    /// A global PAX header with keys that would apply to every later entry.
    #[error("global pax headers are not accepted (only one holding a comment)")]
    PaxGlobal,
    /// A PAX `size` that is not the header's size.
    #[error("the pax size {pax} disagrees with the header size {header}")]
    PaxSize {
        /// PAX value.
        pax: u64,
        /// Header value.
        header: u64,
    },
    /// PAX GNU sparse keys.
    #[error("pax key {0:?} is not accepted")]
    PaxKey(String),
    /// A malformed extension: two in a row, one without a member, too long.
    #[error("malformed extension header: {0}")]
    BadExtension(&'static str),
    /// A header the tar reader cannot parse.
    #[error("malformed header: {0}")]
    BadHeader(&'static str),
    /// The stream is not a tar (or a compression of one) at all.
    #[error("{0}")]
    NotTar(&'static str),
    /// The compressed stream is corrupt or cut short.
    #[error("the {0} stream is corrupt or truncated")]
    Corrupt(&'static str),
    /// The stream ended before the end-of-archive marker or inside an entry.
    #[error("the archive is truncated")]
    Truncated,
}

impl Refusal {
    /// `413` for the limits, `408` for the time bound, `400` for the rest.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::TooManyEntries(_)
            | Self::TooLarge(_)
            | Self::TrailingData(_)
            | Self::OverBudget(_) => ErrorClass::TooLarge,
            Self::TooSlow(_) => ErrorClass::TimedOut,
            _ => ErrorClass::BadRequest,
        }
    }
}

pub(crate) fn refused(entry: impl Into<String>, reason: Refusal) -> WorkspaceError {
    WorkspaceError::Refused {
        entry: entry.into(),
        reason,
    }
}
