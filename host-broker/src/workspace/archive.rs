//! Export of a workspace as tar, and import of one: staged beside the
//! workspace, checked entry by entry, then swapped in atomically.
//!
//! **Export** walks the workspace without following links and writes a tar
//! (GNU headers, long names as GNU long-name entries) into any `Write`.
//! It writes only regular files and directories, because that is all the
//! import accepts: symlinks, fifos, sockets and devices are skipped and
//! counted, as are entries whose path the import would refuse. Under
//! `.browser-profiles` only, the browsers' lock files ([`BROWSER_LOCKS`])
//! and cache directories ([`BROWSER_CACHES`]) are left out. If the export
//! fails half-way the writer is poisoned, so no end-of-archive marker is
//! written and the truncated stream cannot pass for a complete archive.
//!
//! **Import** reads a tar from any `Read` into `<workspace>.import`, a
//! sibling of the workspace on the same filesystem, never visible to the
//! guest. It accepts only regular files and directories with clean relative
//! paths (a leading `./` is allowed), within [`ImportLimits`]; anything else
//! (symlink, hard link, device, fifo, sparse file, a global PAX header, a
//! PAX `size` that disagrees with the header, `..`, an absolute path, a
//! duplicate, a missing end-of-archive marker) refuses the whole archive
//! with the offending entry named, and the staging directory is removed:
//! nothing is written to the workspace. Everything staged belongs to
//! `desk` (1000:1000) with set-id, sticky and world-write bits dropped;
//! ownership, xattrs and ACLs in the archive are ignored.
//!
//! **Swap and crash safety.** The staged tree is flushed (`syncfs`), then
//! exchanged with the workspace in one `renameat2(RENAME_EXCHANGE)`; the old
//! tree, now at the staging name, is removed afterwards. Where the
//! filesystem has no exchange, the workspace is renamed to
//! `<workspace>.previous`, the staged tree into place, and the previous one
//! removed. Every rename is followed by an fsync of the parent. [`recover`]
//! makes any crash point whole again:
//!
//! | found after a crash | meaning | recovery |
//! |---|---|---|
//! | `workspace` + `.import` | staging unfinished, or exchanged and the old one not yet removed | remove `.import` (the workspace is complete either way) |
//! | `.previous` + `.import`, no `workspace` | crash between the two fallback renames | rename `.previous` back to `workspace`, remove `.import` |
//! | `workspace` + `.previous` | swap done, old not yet removed | remove `.previous` |
//! | `.previous` only | as above, staging gone | rename `.previous` back |
//! | `.import` only | a create from an archive did not finish | remove `.import` |
//!
//! An import that was not answered with success therefore leaves the old
//! workspace, one that was leaves the new one. Imports, creates and
//! recoveries of one workspace exclude each other with an `flock` on its
//! parent directory. The desktop must be stopped for an import: a running
//! container's bind mount keeps the old directory.
//!
//! This module must never extract an archive with the tar crate's own
//! unpacking (which would honour links and ownership), never write outside
//! the staging directory, and never follow a link while exporting.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{
    openat, renameat, renameat2, AtFlags, Flock, FlockArg, OFlag, RenameFlags, AT_FDCWD,
};
use nix::sys::stat::{fchmod, fstatat, futimens, mkdirat, Mode, SFlag};
use nix::sys::time::TimeSpec;
use serde::Serialize;
use tar::{EntryType as TarType, Header};

use super::files::{sane_dir_mode, sane_file_mode};
use super::path::{kind_of, PathError, WorkspacePath, WorkspaceRoot};
use super::tree::{chown_fd, lstat_at, open_child_dir, open_regular, read_names, DIR_FLAGS};
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
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

/// What an export wrote and left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ExportSummary {
    /// Regular files written.
    pub files: u64,
    /// Directories written.
    pub dirs: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Symlinks left out (the import would refuse them).
    pub skipped_symlinks: u64,
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

/// Limits of an import.
#[derive(Debug, Clone)]
pub struct ImportLimits {
    /// Most bytes of file content (default 10 GiB).
    pub max_total_bytes: u64,
    /// Most entries, files and directories together (default 1,000,000).
    pub max_entries: u64,
    /// Who owns everything imported (default 1000:1000).
    pub owner: Owner,
}

impl Default for ImportLimits {
    fn default() -> Self {
        Self {
            max_total_bytes: 10 << 30,
            max_entries: 1_000_000,
            owner: Owner::DESK,
        }
    }
}

/// What an import wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ImportSummary {
    /// Regular files.
    pub files: u64,
    /// Directories (listed in the archive or implied by a path).
    pub dirs: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Whether the replaced workspace was removed (when `false`, the next
    /// [`recover`] removes it).
    pub old_removed: bool,
}

/// What [`recover`] found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Recovery {
    /// A staging directory was removed.
    pub removed_staging: bool,
    /// The set-aside workspace was renamed back into place.
    pub restored_previous: bool,
    /// The set-aside workspace of a finished swap was removed.
    pub removed_previous: bool,
}

impl Recovery {
    /// Whether anything was left over.
    pub fn acted(&self) -> bool {
        self.removed_staging || self.restored_previous || self.removed_previous
    }
}

/// Why an archive was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A symlink.
    #[error("symlinks are not accepted")]
    Symlink,
    /// A hard link.
    #[error("hard links are not accepted")]
    HardLink,
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
    #[error("entry type {0:?} is not accepted (only regular files and directories)")]
    Unsupported(char),
    /// The path is refused.
    #[error("{0}")]
    Path(PathError),
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
    /// More content than [`ImportLimits::max_total_bytes`].
    #[error("more than {0} bytes of content")]
    TooLarge(u64),
    /// A global PAX header (its settings would apply to every later entry).
    #[error("global pax headers are not accepted")]
    PaxGlobal,
    /// A PAX `size` that is not the header's size.
    #[error("the pax size {pax} disagrees with the header size {header}")]
    PaxSize {
        /// PAX value.
        pax: u64,
        /// Header value.
        header: u64,
    },
    /// PAX GNU sparse keys or a PAX key that cannot be honoured.
    #[error("pax key {0:?} is not accepted")]
    PaxKey(String),
    /// A malformed extension: two in a row, one without a member, too long.
    #[error("malformed extension header: {0}")]
    BadExtension(&'static str),
    /// A header the tar reader cannot parse.
    #[error("malformed header: {0}")]
    BadHeader(String),
    /// The stream ended before the end-of-archive marker or inside an entry.
    #[error("the archive is truncated")]
    Truncated,
}

impl Refusal {
    /// `413` for the limits, `400` for the rest.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::TooManyEntries(_) | Self::TooLarge(_) => ErrorClass::TooLarge,
            _ => ErrorClass::BadRequest,
        }
    }
}

fn refused(entry: impl Into<String>, reason: Refusal) -> WorkspaceError {
    WorkspaceError::Refused {
        entry: entry.into(),
        reason,
    }
}

// ---------------------------------------------------------------- export

/// A writer that refuses everything once poisoned, so a failed export
/// cannot end with the tar builder's end-of-archive marker.
struct Poisonable<W> {
    inner: W,
    poisoned: bool,
}

impl<W: Write> Write for Poisonable<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.poisoned {
            return Err(io::Error::other("the export failed"));
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.poisoned {
            return Err(io::Error::other("the export failed"));
        }
        self.inner.flush()
    }
}

/// Reads exactly `size` bytes of `file`: zeros after an early end (the file
/// shrank), nothing past `size` (it grew).
struct ExactReader {
    file: io::Take<File>,
    left: u64,
    padded: bool,
}

impl Read for ExactReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.file.read(&mut buf[..want])?;
        let n = if n == 0 {
            self.padded = true;
            buf[..want].fill(0);
            want
        } else {
            n
        };
        self.left -= u64::try_from(n).unwrap_or(0);
        Ok(n)
    }
}

/// Writes a tar of the workspace into `out` (see the module documentation
/// for what is left out). On error the stream is left without its
/// end-of-archive marker.
pub fn export_tar<W: Write>(root: &WorkspaceRoot, out: W) -> Result<ExportSummary, WorkspaceError> {
    let mut builder = tar::Builder::new(Poisonable {
        inner: out,
        poisoned: false,
    });
    builder.mode(tar::HeaderMode::Complete);
    let mut summary = ExportSummary::default();
    let top = root.open_dir(&WorkspacePath::root())?;
    if let Err(e) = export_dir(
        &mut builder,
        top.as_fd(),
        &WorkspacePath::root(),
        root.dev(),
        &mut summary,
    ) {
        // Dropping the builder would write the end-of-archive marker.
        builder.get_mut().poisoned = true;
        return Err(e);
    }
    builder
        .into_inner()
        .and_then(|mut w| w.flush())
        .map_err(|e| WorkspaceError::io("write the archive of", root.path().display(), e))?;
    Ok(summary)
}

fn export_dir<W: Write>(
    builder: &mut tar::Builder<Poisonable<W>>,
    dir: BorrowedFd<'_>,
    rel: &WorkspacePath,
    dev: u64,
    summary: &mut ExportSummary,
) -> Result<(), WorkspaceError> {
    let (mut names, _) =
        read_names(dir, usize::MAX).map_err(|e| WorkspaceError::io("list", rel, e))?;
    names.sort();
    let in_profiles = rel.first() == Some(OsStr::new(BROWSER_PROFILES));
    for name in names {
        let child = rel.join_unchecked(&name);
        let Some(st) = lstat_at(dir, &name).map_err(|e| WorkspaceError::io("stat", &child, e))?
        else {
            summary.changed_while_reading += 1;
            continue;
        };
        let kind = kind_of(st.st_mode);
        let name_str = name.to_str();
        if in_profiles && name_str.is_some_and(|n| BROWSER_LOCKS.contains(&n)) {
            summary.skipped_browser_state += 1;
            continue;
        }
        if kind == SFlag::S_IFLNK {
            tracing::debug!(path = %child, "export leaves out a symlink");
            summary.skipped_symlinks += 1;
            continue;
        }
        if kind != SFlag::S_IFREG && kind != SFlag::S_IFDIR {
            summary.skipped_special += 1;
            continue;
        }
        if kind == SFlag::S_IFDIR
            && in_profiles
            && name_str.is_some_and(|n| BROWSER_CACHES.contains(&n))
        {
            summary.skipped_browser_state += 1;
            continue;
        }
        if WorkspacePath::parse(child.as_bytes()).is_err() || st.st_dev != dev {
            tracing::warn!(path = %child, "export leaves out an entry the import would refuse (path too long or deep, or another filesystem)");
            summary.skipped_unimportable += 1;
            continue;
        }
        let mut header = Header::new_gnu();
        header.set_mode(st.st_mode & 0o777);
        header.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
        header.set_uid(u64::from(st.st_uid));
        header.set_gid(u64::from(st.st_gid));
        if kind == SFlag::S_IFDIR {
            header.set_entry_type(TarType::Directory);
            header.set_size(0);
            builder
                .append_data(&mut header, child.as_path(), io::empty())
                .map_err(|e| WorkspaceError::io("write the archive entry of", &child, e))?;
            summary.dirs += 1;
            let sub = match open_child_dir(dir, &name) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(Errno::ENOENT as i32) => {
                    summary.changed_while_reading += 1;
                    continue;
                }
                Err(e) => return Err(WorkspaceError::io("open", &child, e)),
            };
            export_dir(builder, sub.as_fd(), &child, dev, summary)?;
        } else {
            let opened = match open_regular(dir, &name, Some(&st)) {
                Ok(Some(pair)) => pair,
                Ok(None) => {
                    summary.changed_while_reading += 1;
                    continue;
                }
                Err(e) if e.raw_os_error() == Some(Errno::ENOENT as i32) => {
                    summary.changed_while_reading += 1;
                    continue;
                }
                Err(e) => return Err(WorkspaceError::io("open", &child, e)),
            };
            let (file, st) = opened;
            let size = u64::try_from(st.st_size).unwrap_or(0);
            header.set_entry_type(TarType::Regular);
            header.set_size(size);
            let mut reader = ExactReader {
                file: file.take(size),
                left: size,
                padded: false,
            };
            builder
                .append_data(&mut header, child.as_path(), &mut reader)
                .map_err(|e| WorkspaceError::io("write the archive entry of", &child, e))?;
            if reader.padded {
                summary.changed_while_reading += 1;
            }
            summary.files += 1;
            summary.bytes += size;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- import

/// Remembers whether the input ever reported its end: a complete archive is
/// read up to its end-of-archive block and never past it, so an end seen
/// means the stream was cut.
struct EofWatch<R> {
    inner: R,
    eof: bool,
}

impl<R: Read> Read for EofWatch<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.eof = true;
        }
        Ok(n)
    }
}

/// The directory holding a workspace, locked, with the names of the
/// workspace, its staging directory and its set-aside copy.
struct Site {
    dir: Flock<OwnedFd>,
    parent: PathBuf,
    name: OsString,
    staging: OsString,
    previous: OsString,
}

impl Site {
    fn lock(workspace: &Path) -> Result<Self, WorkspaceError> {
        let host = workspace.display().to_string();
        let name = workspace
            .file_name()
            .ok_or_else(|| {
                WorkspaceError::io(
                    "lock",
                    &host,
                    io::Error::other("the workspace path has no name"),
                )
            })?
            .to_owned();
        let parent = match workspace.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        // The parent is the broker's own directory, not the guest's.
        let fd = openat(AT_FDCWD, &parent, DIR_FLAGS, Mode::empty())
            .map_err(|e| WorkspaceError::io("open the directory of", &host, e.into()))?;
        let dir = Flock::lock(fd, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
            Errno::EWOULDBLOCK => WorkspaceError::Busy,
            e => WorkspaceError::io("lock the directory of", &host, e.into()),
        })?;
        let with = |suffix: &str| {
            let mut n = name.clone();
            n.push(suffix);
            n
        };
        Ok(Self {
            staging: with(".import"),
            previous: with(".previous"),
            dir,
            parent,
            name,
        })
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    fn host(&self, name: &OsStr) -> String {
        self.parent.join(name).display().to_string()
    }

    /// `lstat` of one of the three names; anything but a directory there is
    /// an error (the broker never puts anything else there).
    fn stat_dir(&self, name: &OsStr) -> Result<Option<nix::sys::stat::FileStat>, WorkspaceError> {
        match fstatat(self.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if kind_of(st.st_mode) == SFlag::S_IFDIR => Ok(Some(st)),
            Ok(_) => Err(WorkspaceError::NotADirectory {
                path: self.host(name),
            }),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(WorkspaceError::io("stat", self.host(name), e.into())),
        }
    }

    fn sync(&self) -> Result<(), WorkspaceError> {
        nix::unistd::fsync(self.fd())
            .map_err(|e| WorkspaceError::io("fsync", self.parent.display(), e.into()))
    }

    fn rename(&self, from: &OsStr, to: &OsStr) -> Result<(), WorkspaceError> {
        renameat(self.fd(), from, self.fd(), to)
            .map_err(|e| WorkspaceError::io("rename", self.host(from), e.into()))?;
        self.sync()
    }

    /// Removes a tree of ours (staging or set-aside); links in it are
    /// removed, never followed (std's `remove_dir_all` works by descriptor).
    fn remove(&self, name: &OsStr) -> Result<(), WorkspaceError> {
        let path = self.parent.join(name);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(WorkspaceError::io("remove", path.display(), e)),
        }
        self.sync()
    }

    fn recover(&self) -> Result<Recovery, WorkspaceError> {
        let mut done = Recovery::default();
        let mut workspace = self.stat_dir(&self.name)?.is_some();
        let staging = self.stat_dir(&self.staging)?.is_some();
        let previous = self.stat_dir(&self.previous)?.is_some();
        if !workspace && previous {
            self.rename(&self.previous, &self.name)?;
            done.restored_previous = true;
            workspace = true;
        }
        if staging {
            self.remove(&self.staging)?;
            done.removed_staging = true;
        }
        if workspace && previous && !done.restored_previous {
            self.remove(&self.previous)?;
            done.removed_previous = true;
        }
        if done.acted() {
            tracing::warn!(workspace = %self.host(&self.name), ?done, "recovered a workspace left by an interrupted import");
        }
        Ok(done)
    }

    /// Extracts `input` into a fresh staging directory whose root gets
    /// `root_mode` and `root_owner`, and flushes it; on any error the
    /// staging directory is removed.
    fn stage(
        &self,
        input: impl Read,
        limits: &ImportLimits,
        root_mode: u32,
        root_owner: Owner,
    ) -> Result<ImportSummary, WorkspaceError> {
        mkdirat(
            self.fd(),
            self.staging.as_os_str(),
            Mode::from_bits_truncate(0o700),
        )
        .map_err(|e| WorkspaceError::io("create", self.host(&self.staging), e.into()))?;
        let result = (|| {
            let staged = open_child_dir(self.fd(), &self.staging)
                .map_err(|e| WorkspaceError::io("open", self.host(&self.staging), e))?;
            let summary = extract(staged.as_fd(), input, limits)?;
            let host = self.host(&self.staging);
            fchmod(&staged, Mode::from_bits_truncate(root_mode & 0o777))
                .map_err(|e| WorkspaceError::io("chmod", &host, e.into()))?;
            chown_fd(&staged, root_owner).map_err(|e| WorkspaceError::io("chown", &host, e))?;
            // One flush of the filesystem instead of an fsync per file.
            nix::unistd::syncfs(&staged)
                .map_err(|e| WorkspaceError::io("syncfs", &host, e.into()))?;
            Ok(summary)
        })();
        if result.is_err() {
            if let Err(e) = self.remove(&self.staging) {
                tracing::error!(error = %e, "removing a refused import's staging directory failed; the next recovery removes it");
            }
        }
        result
    }
}

/// Makes a workspace whole after a crash during an import or a create from
/// an archive (see the module documentation for each case). Run it for
/// every computer when the broker starts; imports run it themselves first.
pub fn recover(workspace: &Path) -> Result<Recovery, WorkspaceError> {
    Site::lock(workspace)?.recover()
}

/// Replaces the existing workspace at `workspace` (a host path; the
/// desktop must be stopped) with the archive read from `input`. Either the
/// whole archive is accepted and swapped in, or nothing changes.
pub fn replace_from_tar(
    workspace: &Path,
    input: impl Read,
    limits: &ImportLimits,
) -> Result<ImportSummary, WorkspaceError> {
    let site = Site::lock(workspace)?;
    site.recover()?;
    let old = site
        .stat_dir(&site.name)?
        .ok_or_else(|| WorkspaceError::NotFound {
            path: site.host(&site.name),
        })?;
    let owner = Owner {
        uid: old.st_uid,
        gid: old.st_gid,
    };
    let mut summary = site.stage(input, limits, old.st_mode, owner)?;
    summary.old_removed = swap_in(&site, true)?;
    Ok(summary)
}

/// Puts the staged tree in the workspace's place: one exchange where the
/// filesystem has it (`exchange`), two renames otherwise. Returns whether
/// the old tree was removed afterwards.
fn swap_in(site: &Site, exchange: bool) -> Result<bool, WorkspaceError> {
    if exchange {
        match renameat2(
            site.fd(),
            site.staging.as_os_str(),
            site.fd(),
            site.name.as_os_str(),
            RenameFlags::RENAME_EXCHANGE,
        ) {
            Ok(()) => {
                site.sync()?;
                // The old tree is at the staging name now.
                return Ok(remove_logged(site, &site.staging));
            }
            Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {}
            Err(e) => {
                let _ = site.remove(&site.staging);
                return Err(WorkspaceError::io(
                    "swap in",
                    site.host(&site.staging),
                    e.into(),
                ));
            }
        }
    }
    site.rename(&site.name, &site.previous)?;
    if let Err(e) = site.rename(&site.staging, &site.name) {
        // Put the old one back before answering.
        site.rename(&site.previous, &site.name)?;
        let _ = site.remove(&site.staging);
        return Err(e);
    }
    Ok(remove_logged(site, &site.previous))
}

fn remove_logged(site: &Site, name: &OsStr) -> bool {
    match site.remove(name) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "removing the replaced workspace failed; the next recovery removes it");
            false
        }
    }
}

/// Creates the workspace at `workspace` (which must not exist; its parent
/// must) from the archive read from `input`: staged, then renamed into
/// place. Its root is 0700 and belongs to [`ImportLimits::owner`].
pub fn create_from_tar(
    workspace: &Path,
    input: impl Read,
    limits: &ImportLimits,
) -> Result<ImportSummary, WorkspaceError> {
    let site = Site::lock(workspace)?;
    site.recover()?;
    if site.stat_dir(&site.name)?.is_some() {
        return Err(WorkspaceError::Exists {
            path: site.host(&site.name),
        });
    }
    let summary = site.stage(input, limits, 0o700, limits.owner)?;
    let placed = match renameat2(
        site.fd(),
        site.staging.as_os_str(),
        site.fd(),
        site.name.as_os_str(),
        RenameFlags::RENAME_NOREPLACE,
    ) {
        // Without NOREPLACE the lock and the check above stand in for it.
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => renameat(
            site.fd(),
            site.staging.as_os_str(),
            site.fd(),
            site.name.as_os_str(),
        ),
        other => other,
    };
    if let Err(e) = placed {
        let _ = site.remove(&site.staging);
        return Err(match e {
            Errno::EEXIST | Errno::ENOTEMPTY => WorkspaceError::Exists {
                path: site.host(&site.name),
            },
            e => WorkspaceError::io("rename into place", site.host(&site.name), e.into()),
        });
    }
    site.sync()?;
    Ok(summary)
}

/// A pending PAX extension for the next member.
#[derive(Default)]
struct Pax {
    path: Option<Vec<u8>>,
    size: Option<u64>,
}

fn parse_pax(data: &[u8]) -> Result<Pax, Refusal> {
    let mut pax = Pax::default();
    for record in tar::PaxExtensions::new(data) {
        let record = record.map_err(|_| Refusal::BadExtension("unparsable pax record"))?;
        let key = record.key_bytes();
        let value = record.value_bytes();
        match key {
            b"path" if pax.path.is_some() => {
                return Err(Refusal::BadExtension("pax path given twice"))
            }
            b"path" => pax.path = Some(value.to_vec()),
            b"size" => {
                let size = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(Refusal::BadExtension("pax size is not a number"))?;
                if pax.size.replace(size).is_some() {
                    return Err(Refusal::BadExtension("pax size given twice"));
                }
            }
            b"linkpath" => return Err(Refusal::PaxKey("linkpath".into())),
            k if k.starts_with(b"GNU.sparse") => {
                return Err(Refusal::PaxKey(String::from_utf8_lossy(k).into_owned()))
            }
            // Times, owners, names, charsets, comments, xattrs and ACLs:
            // ignored, never applied.
            _ => {}
        }
    }
    Ok(pax)
}

/// The workspace path of an archive name: a leading `./` is dropped, a
/// trailing `/` allowed on a directory; `None` is the root itself.
fn archive_path(raw: &[u8], is_dir: bool) -> Result<Option<WorkspacePath>, Refusal> {
    let mut p = raw;
    if p == b"." {
        return if is_dir {
            Ok(None)
        } else {
            Err(Refusal::FileIsRoot)
        };
    }
    if let Some(rest) = p.strip_prefix(b"./") {
        p = rest;
    }
    if let Some(rest) = p.strip_suffix(b"/") {
        if !is_dir {
            return Err(Refusal::FileWithSlash);
        }
        p = rest;
    }
    if p.is_empty() {
        return if raw.is_empty() {
            Err(Refusal::Path(PathError::EmptyComponent))
        } else if is_dir {
            Ok(None)
        } else {
            Err(Refusal::FileIsRoot)
        };
    }
    WorkspacePath::parse(p).map(Some).map_err(Refusal::Path)
}

/// Directories of the staged tree, opened by descriptor, with the last
/// parent kept open (archives list a directory's files together).
struct Staged<'a> {
    root: BorrowedFd<'a>,
    owner: Owner,
    last: Option<(WorkspacePath, OwnedFd)>,
    dirs: u64,
}

impl Staged<'_> {
    /// The directory `rel`, made (0755) with its missing parents.
    fn dir(&mut self, rel: &WorkspacePath, entry: &str) -> Result<BorrowedFd<'_>, WorkspaceError> {
        let hit = matches!(&self.last, Some((p, _)) if p == rel);
        if !hit {
            let mut cur: Option<OwnedFd> = None;
            let mut so_far = WorkspacePath::root();
            for name in rel.components() {
                so_far = so_far.join_unchecked(name);
                let at = cur.as_ref().map_or(self.root, |fd| fd.as_fd());
                let made = match mkdirat(at, name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) => true,
                    Err(Errno::EEXIST) => false,
                    Err(e) => return Err(WorkspaceError::io("mkdir", &so_far, e.into())),
                };
                let fd = match openat(at, name, DIR_FLAGS, Mode::empty()) {
                    Ok(fd) => fd,
                    Err(Errno::ENOTDIR | Errno::ELOOP) => {
                        return Err(refused(entry, Refusal::ParentNotDir))
                    }
                    Err(e) => return Err(WorkspaceError::io("open", &so_far, e.into())),
                };
                if made {
                    fchmod(&fd, Mode::from_bits_truncate(0o755))
                        .map_err(|e| WorkspaceError::io("chmod", &so_far, e.into()))?;
                    chown_fd(&fd, self.owner)
                        .map_err(|e| WorkspaceError::io("chown", &so_far, e))?;
                    self.dirs += 1;
                }
                cur = Some(fd);
            }
            let fd = match cur {
                Some(fd) => fd,
                None => openat(self.root, ".", DIR_FLAGS, Mode::empty())
                    .map_err(|e| WorkspaceError::io("open", "staging", e.into()))?,
            };
            self.last = Some((rel.clone(), fd));
        }
        match &self.last {
            Some((_, fd)) => Ok(fd.as_fd()),
            None => Err(WorkspaceError::io(
                "open",
                rel,
                io::Error::other("no directory"),
            )),
        }
    }
}

/// Reads the archive into the empty staged directory `root`.
fn extract(
    root: BorrowedFd<'_>,
    input: impl Read,
    limits: &ImportLimits,
) -> Result<ImportSummary, WorkspaceError> {
    let mut watch = EofWatch {
        inner: input,
        eof: false,
    };
    let mut archive = tar::Archive::new(&mut watch);
    let mut summary = ImportSummary::default();
    let mut staged = Staged {
        root,
        owner: limits.owner,
        last: None,
        dirs: 0,
    };
    let mut dir_times: Vec<(WorkspacePath, u64)> = Vec::new();
    let mut long_name: Option<Vec<u8>> = None;
    let mut pax: Option<Pax> = None;
    let mut members = 0u64;
    let mut last_entry = String::from("<start of archive>");
    let mut buf = vec![0u8; 128 * 1024];
    let entries = archive
        .entries()
        .map_err(|e| refused(last_entry.clone(), Refusal::BadHeader(e.to_string())))?
        // Raw: extension headers come to us, so their size is bounded and
        // their meaning is ours, not a second parser's.
        .raw(true);
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            refused(
                format!("the header after {last_entry}"),
                match e.kind() {
                    io::ErrorKind::UnexpectedEof => Refusal::Truncated,
                    _ => Refusal::BadHeader(e.to_string()),
                },
            )
        })?;
        let kind = entry.header().entry_type();
        let header_name = String::from_utf8_lossy(&entry.header().path_bytes()).into_owned();
        match kind {
            TarType::GNULongName | TarType::XHeader => {
                let what = if kind == TarType::XHeader {
                    "pax header"
                } else {
                    "long-name entry"
                };
                if entry.size() > MAX_EXTENSION_BYTES {
                    return Err(refused(
                        format!("the {what} after {last_entry}"),
                        Refusal::BadExtension("too long"),
                    ));
                }
                let mut data = Vec::new();
                entry.read_to_end(&mut data).map_err(|_| {
                    refused(format!("the {what} after {last_entry}"), Refusal::Truncated)
                })?;
                if kind == TarType::XHeader {
                    let parsed = parse_pax(&data)
                        .map_err(|r| refused(format!("the pax header after {last_entry}"), r))?;
                    if pax.replace(parsed).is_some() {
                        return Err(refused(
                            format!("the pax header after {last_entry}"),
                            Refusal::BadExtension("two pax headers for one entry"),
                        ));
                    }
                } else {
                    while data.last() == Some(&0) {
                        data.pop();
                    }
                    if long_name.replace(data).is_some() {
                        return Err(refused(
                            format!("the long-name entry after {last_entry}"),
                            Refusal::BadExtension("two long names for one entry"),
                        ));
                    }
                }
                continue;
            }
            TarType::XGlobalHeader => return Err(refused(header_name, Refusal::PaxGlobal)),
            _ => {}
        }
        let pending_pax = pax.take().unwrap_or_default();
        let pending_long = long_name.take();
        let raw_name = match (pending_pax.path, pending_long) {
            (Some(_), Some(_)) => {
                return Err(refused(
                    header_name,
                    Refusal::BadExtension("both a pax path and a long name"),
                ))
            }
            (Some(p), None) | (None, Some(p)) => p,
            (None, None) => entry.header().path_bytes().into_owned(),
        };
        let name = String::from_utf8_lossy(&raw_name).into_owned();
        members += 1;
        if members > limits.max_entries {
            return Err(refused(name, Refusal::TooManyEntries(limits.max_entries)));
        }
        let reason = match kind {
            TarType::Regular | TarType::Directory => None,
            TarType::Symlink => Some(Refusal::Symlink),
            TarType::Link | TarType::GNULongLink => Some(Refusal::HardLink),
            TarType::Char | TarType::Block => Some(Refusal::Device),
            TarType::Fifo => Some(Refusal::Fifo),
            TarType::GNUSparse => Some(Refusal::Sparse),
            other => Some(Refusal::Unsupported(char::from(other.as_byte()))),
        };
        if let Some(reason) = reason {
            return Err(refused(name, reason));
        }
        if let Some(size) = pending_pax.size {
            if size != entry.size() {
                return Err(refused(
                    name,
                    Refusal::PaxSize {
                        pax: size,
                        header: entry.size(),
                    },
                ));
            }
        }
        let is_dir = kind == TarType::Directory;
        let path = archive_path(&raw_name, is_dir).map_err(|r| refused(name.clone(), r))?;
        let mode = entry
            .header()
            .mode()
            .map_err(|e| refused(name.clone(), Refusal::BadHeader(e.to_string())))?;
        let mtime = entry.header().mtime().unwrap_or(0);
        if is_dir {
            if entry.size() != 0 {
                return Err(refused(
                    name,
                    Refusal::BadHeader("a directory with content".into()),
                ));
            }
            if let Some(path) = path {
                import_dir(&mut staged, &path, mode, &name)?;
                // A directory listed again: its last time wins.
                match dir_times.last_mut() {
                    Some((last, t)) if *last == path => *t = mtime,
                    _ => dir_times.push((path, mtime)),
                }
            }
        } else {
            let Some(path) = path else {
                return Err(refused(name, Refusal::FileIsRoot));
            };
            let size = entry.size();
            if size > limits.max_total_bytes.saturating_sub(summary.bytes) {
                return Err(refused(name, Refusal::TooLarge(limits.max_total_bytes)));
            }
            import_file(
                &mut staged,
                &path,
                &mut entry,
                Meta { size, mode, mtime },
                &name,
                &mut buf,
            )?;
            summary.files += 1;
            summary.bytes += size;
        }
        last_entry = name;
    }
    if pax.is_some() || long_name.is_some() {
        return Err(refused(
            format!("the end after {last_entry}"),
            Refusal::BadExtension("an extension header without its entry"),
        ));
    }
    if watch.eof {
        return Err(refused(
            format!("the end after {last_entry}"),
            Refusal::Truncated,
        ));
    }
    // Directory times last: creating their entries changed them.
    for (path, mtime) in dir_times.iter().rev() {
        if let Ok(fd) = staged.dir(path, "") {
            let t = TimeSpec::new(i64::try_from(*mtime).unwrap_or(0), 0);
            let _ = futimens(fd, &t, &t);
        }
    }
    summary.dirs = staged.dirs;
    Ok(summary)
}

fn import_dir(
    staged: &mut Staged<'_>,
    path: &WorkspacePath,
    mode: u32,
    name: &str,
) -> Result<(), WorkspaceError> {
    let Some((parent, last)) = path.split_last() else {
        return Ok(());
    };
    let owner = staged.owner;
    let at = staged.dir(&parent, name)?;
    let made = match mkdirat(at, last, Mode::from_bits_truncate(0o700)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(WorkspaceError::io("mkdir", path, e.into())),
    };
    let fd = match openat(at, last, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOTDIR | Errno::ELOOP) => return Err(refused(name, Refusal::Duplicate)),
        Err(e) => return Err(WorkspaceError::io("open", path, e.into())),
    };
    fchmod(&fd, Mode::from_bits_truncate(sane_dir_mode(mode)))
        .map_err(|e| WorkspaceError::io("chmod", path, e.into()))?;
    chown_fd(&fd, owner).map_err(|e| WorkspaceError::io("chown", path, e))?;
    if made {
        staged.dirs += 1;
    }
    Ok(())
}

/// What a member's header says about it.
#[derive(Clone, Copy)]
struct Meta {
    size: u64,
    mode: u32,
    mtime: u64,
}

fn import_file(
    staged: &mut Staged<'_>,
    path: &WorkspacePath,
    data: &mut impl Read,
    meta: Meta,
    name: &str,
    buf: &mut [u8],
) -> Result<(), WorkspaceError> {
    let Meta { size, mode, mtime } = meta;
    let Some((parent, last)) = path.split_last() else {
        return Err(refused(name, Refusal::FileIsRoot));
    };
    let owner = staged.owner;
    let at = staged.dir(&parent, name)?;
    let fd = openat(
        at,
        last,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| match e {
        Errno::EEXIST | Errno::EISDIR => refused(name, Refusal::Duplicate),
        Errno::ENOTDIR => refused(name, Refusal::ParentNotDir),
        e => WorkspaceError::io("create", path, e.into()),
    })?;
    let mut file = File::from(fd);
    let mut written = 0u64;
    loop {
        let n = match data.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(refused(name, Refusal::Truncated)),
        };
        file.write_all(&buf[..n])
            .map_err(|e| WorkspaceError::io("write", path, e))?;
        written += u64::try_from(n).unwrap_or(0);
    }
    if written != size {
        return Err(refused(name, Refusal::Truncated));
    }
    fchmod(&file, Mode::from_bits_truncate(sane_file_mode(mode)))
        .map_err(|e| WorkspaceError::io("chmod", path, e.into()))?;
    chown_fd(&file, owner).map_err(|e| WorkspaceError::io("chown", path, e))?;
    let t = TimeSpec::new(i64::try_from(mtime).unwrap_or(0), 0);
    futimens(&file, &t, &t).map_err(|e| WorkspaceError::io("set times of", path, e.into()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_swaps_put_the_staged_tree_in_place_and_remove_the_old() {
        for exchange in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let ws = dir.path().join("workspace");
            std::fs::create_dir(&ws).unwrap();
            std::fs::write(ws.join("which"), "old").unwrap();
            std::fs::create_dir(dir.path().join("workspace.import")).unwrap();
            std::fs::write(dir.path().join("workspace.import/which"), "new").unwrap();
            let site = Site::lock(&ws).unwrap();
            assert!(swap_in(&site, exchange).unwrap());
            assert_eq!(std::fs::read_to_string(ws.join("which")).unwrap(), "new");
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                names,
                vec![OsString::from("workspace")],
                "exchange: {exchange}"
            );
        }
    }

    #[test]
    fn archive_names_are_cleaned_or_refused() {
        let ok = |raw: &[u8], dir| archive_path(raw, dir).map(|p| p.map(|p| p.to_string()));
        assert_eq!(ok(b"./", true), Ok(None));
        assert_eq!(ok(b".", true), Ok(None));
        assert_eq!(ok(b"./a/b", false), Ok(Some("a/b".into())));
        assert_eq!(ok(b"a/", true), Ok(Some("a".into())));
        assert_eq!(ok(b"a/", false), Err(Refusal::FileWithSlash));
        assert_eq!(ok(b"../x", false), Err(Refusal::Path(PathError::ParentDir)));
        assert_eq!(
            ok(b"/etc/x", false),
            Err(Refusal::Path(PathError::Absolute))
        );
        assert_eq!(
            ok(b".//etc/x", false),
            Err(Refusal::Path(PathError::Absolute))
        );
        assert_eq!(
            ok(b"a/../../x", false),
            Err(Refusal::Path(PathError::ParentDir))
        );
        assert_eq!(
            ok(b"", false),
            Err(Refusal::Path(PathError::EmptyComponent))
        );
        assert_eq!(ok(b"./", false), Err(Refusal::FileIsRoot));
    }

    #[test]
    fn pax_records_are_read_and_tricks_refused() {
        let rec = |k: &str, v: &str| {
            let body = format!(" {k}={v}\n");
            let mut len = body.len() + 1;
            while body.len() + len.to_string().len() != len {
                len = body.len() + len.to_string().len();
            }
            format!("{len}{body}")
        };
        let data = format!("{}{}", rec("path", "a/b"), rec("size", "12"));
        let pax = parse_pax(data.as_bytes()).unwrap();
        assert_eq!(pax.path.as_deref(), Some(&b"a/b"[..]));
        assert_eq!(pax.size, Some(12));
        let twice = format!("{}{}", rec("path", "a"), rec("path", "b"));
        assert!(parse_pax(twice.as_bytes()).is_err());
        assert!(matches!(
            parse_pax(rec("GNU.sparse.map", "0,1").as_bytes()),
            Err(Refusal::PaxKey(_))
        ));
        assert!(matches!(
            parse_pax(rec("linkpath", "/etc").as_bytes()),
            Err(Refusal::PaxKey(_))
        ));
    }
}
