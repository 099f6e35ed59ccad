//! Workspace-relative paths, checked before they touch the disk, and their
//! resolution below a workspace root that never follows a symlink anywhere
//! on the way and never leaves the root.
//!
//! A [`WorkspacePath`] is a lexically clean relative path: no leading `/`,
//! no `..` or `.` component, no empty component, no NUL, at most
//! [`MAX_PATH_BYTES`] bytes, [`MAX_COMPONENTS`] components and
//! [`MAX_NAME_BYTES`] bytes per component. A [`WorkspaceRoot`] holds the
//! workspace directory open and resolves such paths below it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)`; where the kernel has no `openat2` (`ENOSYS`) it walks
//! component by component with `O_NOFOLLOW | O_DIRECTORY` on held
//! descriptors. Both refuse a symlink at any position, including a symlink
//! planted while we resolve. This module must never resolve a guest path
//! with a plain path call.

use std::ffi::OsStr;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag, AT_FDCWD};
use nix::sys::stat::{fstatat, Mode, SFlag};

use super::WorkspaceError;

/// Longest path accepted, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most components a path may have.
pub const MAX_COMPONENTS: usize = 256;
/// Longest component, in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Starts with `/`.
    #[error("the path is absolute")]
    Absolute,
    /// Has a `..` component.
    #[error("the path has a `..` component")]
    ParentDir,
    /// Has a `.` component.
    #[error("the path has a `.` component")]
    CurDir,
    /// Has an empty component (`a//b`, a trailing `/`).
    #[error("the path has an empty component")]
    EmptyComponent,
    /// Has a NUL byte.
    #[error("the path has a NUL byte")]
    Nul,
    /// Longer than [`MAX_PATH_BYTES`].
    #[error("the path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    /// A component longer than [`MAX_NAME_BYTES`].
    #[error("a path component is longer than {MAX_NAME_BYTES} bytes")]
    NameTooLong,
    /// More than [`MAX_COMPONENTS`] components.
    #[error("the path has more than {MAX_COMPONENTS} components")]
    TooDeep,
    /// Names the workspace itself where an entry in it is needed.
    #[error("the path names the workspace itself")]
    Root,
}

/// A checked workspace-relative path; empty means the workspace itself.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WorkspacePath {
    bytes: Vec<u8>,
}

impl WorkspacePath {
    /// The workspace itself.
    pub fn root() -> Self {
        Self::default()
    }

    /// Checks `bytes` (as found after percent-decoding a URL path, or in an
    /// archive): `""` is the root, `a/b` an entry; everything else in
    /// [`PathError`] is refused.
    pub fn parse(bytes: &[u8]) -> Result<Self, PathError> {
        if bytes.is_empty() {
            return Ok(Self::root());
        }
        if bytes.contains(&0) {
            return Err(PathError::Nul);
        }
        if bytes[0] == b'/' {
            return Err(PathError::Absolute);
        }
        if bytes.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong);
        }
        let mut count = 0usize;
        for name in bytes.split(|b| *b == b'/') {
            count += 1;
            match name {
                b"" => return Err(PathError::EmptyComponent),
                b"." => return Err(PathError::CurDir),
                b".." => return Err(PathError::ParentDir),
                n if n.len() > MAX_NAME_BYTES => return Err(PathError::NameTooLong),
                _ => {}
            }
        }
        if count > MAX_COMPONENTS {
            return Err(PathError::TooDeep);
        }
        Ok(Self {
            bytes: bytes.to_vec(),
        })
    }

    /// Whether this is the workspace itself.
    pub fn is_root(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes, `a/b/c`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// As a relative [`Path`].
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.bytes))
    }

    /// The components, outermost first.
    pub fn components(&self) -> impl Iterator<Item = &OsStr> {
        self.bytes
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .map(OsStr::from_bytes)
    }

    /// How many components.
    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// The parent and the last component; `None` for the root.
    pub fn split_last(&self) -> Option<(WorkspacePath, &OsStr)> {
        if self.is_root() {
            return None;
        }
        Some(match self.bytes.iter().rposition(|b| *b == b'/') {
            Some(i) => (
                Self {
                    bytes: self.bytes[..i].to_vec(),
                },
                OsStr::from_bytes(&self.bytes[i + 1..]),
            ),
            None => (Self::root(), OsStr::from_bytes(&self.bytes)),
        })
    }

    /// This path with `name` (one component, already a valid name) appended.
    /// Not checked against the limits: for walking what already exists.
    pub(crate) fn join_unchecked(&self, name: &OsStr) -> Self {
        let mut bytes = self.bytes.clone();
        if !bytes.is_empty() {
            bytes.push(b'/');
        }
        bytes.extend_from_slice(name.as_bytes());
        Self { bytes }
    }

    /// The first component, if any.
    pub fn first(&self) -> Option<&OsStr> {
        self.components().next()
    }
}

impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            f.write_str(".")
        } else {
            f.write_str(&String::from_utf8_lossy(&self.bytes))
        }
    }
}

impl fmt::Debug for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl std::str::FromStr for WorkspacePath {
    type Err = PathError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s.as_bytes())
    }
}

/// How paths are resolved below the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
    /// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`; falls back to
    /// [`Resolution::Walk`] when the kernel answers `ENOSYS`.
    Openat2,
    /// One `openat(O_NOFOLLOW | O_DIRECTORY)` per component on held
    /// descriptors, refusing a change of device on the way.
    Walk,
}

/// 0: not probed yet, 1: `openat2` works, 2: it does not (`ENOSYS`).
static OPENAT2_STATE: AtomicU8 = AtomicU8::new(0);

/// An open workspace directory that paths are resolved below.
#[derive(Debug)]
pub struct WorkspaceRoot {
    fd: OwnedFd,
    path: PathBuf,
    dev: u64,
    resolution: Resolution,
}

impl WorkspaceRoot {
    /// Opens the workspace directory at `path` (a host path the broker
    /// made; its last component must not be a symlink) and resolves with
    /// `openat2` where the kernel has it.
    pub fn open(path: &Path) -> Result<Self, WorkspaceError> {
        let resolution = match OPENAT2_STATE.load(Ordering::Relaxed) {
            2 => Resolution::Walk,
            _ => Resolution::Openat2,
        };
        Self::open_with(path, resolution)
    }

    /// Like [`Self::open`] with a chosen resolution (tests run every case
    /// through both).
    pub fn open_with(path: &Path, resolution: Resolution) -> Result<Self, WorkspaceError> {
        let display = path.display();
        let fd = openat(
            AT_FDCWD,
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ENOENT => WorkspaceError::NotFound {
                path: display.to_string(),
            },
            Errno::ELOOP => WorkspaceError::Symlink {
                path: display.to_string(),
            },
            e => WorkspaceError::io("open workspace", display, e.into()),
        })?;
        let st = nix::sys::stat::fstat(&fd)
            .map_err(|e| WorkspaceError::io("stat workspace", path.display(), e.into()))?;
        Ok(Self {
            fd,
            path: path.to_owned(),
            dev: st.st_dev,
            resolution,
        })
    }

    /// The host path the root was opened by (for messages and siblings).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The device the workspace lives on.
    pub(crate) fn dev(&self) -> u64 {
        self.dev
    }

    /// How this root resolves paths.
    pub fn resolution(&self) -> Resolution {
        self.resolution
    }

    /// Opens the directory `rel` (the root itself when empty) without
    /// following any symlink on the way.
    pub fn open_dir(&self, rel: &WorkspacePath) -> Result<OwnedFd, WorkspaceError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if rel.is_root() {
            return openat(&self.fd, ".", flags, Mode::empty())
                .map_err(|e| resolve_error(e, rel, "open directory"));
        }
        if self.resolution == Resolution::Openat2 && OPENAT2_STATE.load(Ordering::Relaxed) != 2 {
            let how = OpenHow::new().flags(flags).resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
            // EAGAIN: a rename raced the resolution; the kernel asks us to
            // try again rather than risk a wrong answer.
            for _ in 0..8 {
                match openat2(&self.fd, rel.as_path(), how) {
                    Ok(fd) => {
                        OPENAT2_STATE.store(1, Ordering::Relaxed);
                        return Ok(fd);
                    }
                    Err(Errno::EAGAIN) => continue,
                    Err(Errno::ENOSYS) => {
                        OPENAT2_STATE.store(2, Ordering::Relaxed);
                        tracing::info!("openat2 is not available; resolving workspace paths component by component");
                        return self.walk(rel, flags);
                    }
                    Err(e) => return Err(self.explain(e, rel)),
                }
            }
            return Err(resolve_error(Errno::EAGAIN, rel, "open directory"));
        }
        self.walk(rel, flags)
    }

    /// The directory holding `rel` and `rel`'s last component; refuses the
    /// root itself.
    pub fn open_parent<'p>(
        &self,
        rel: &'p WorkspacePath,
    ) -> Result<(OwnedFd, &'p OsStr), WorkspaceError> {
        let (parent, name) = rel.split_last().ok_or(PathError::Root)?;
        Ok((self.open_dir(&parent)?, name))
    }

    fn walk(&self, rel: &WorkspacePath, flags: OFlag) -> Result<OwnedFd, WorkspaceError> {
        let mut dir = openat(&self.fd, ".", flags, Mode::empty())
            .map_err(|e| resolve_error(e, rel, "open directory"))?;
        let mut so_far = WorkspacePath::root();
        for name in rel.components() {
            so_far = so_far.join_unchecked(name);
            let next = match openat(&dir, name, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(e) => return Err(explain_at(dir.as_fd(), name, e, &so_far)),
            };
            let st = nix::sys::stat::fstat(&next)
                .map_err(|e| resolve_error(e, &so_far, "stat directory"))?;
            if st.st_dev != self.dev {
                return Err(WorkspaceError::Escape {
                    path: so_far.to_string(),
                });
            }
            dir = next;
        }
        Ok(dir)
    }

    /// Turns an `openat2` failure into the error the caller deserves: an
    /// `ENOTDIR` may hide a symlink (`O_DIRECTORY` is checked on it), so the
    /// failing component is found with a nofollow walk.
    fn explain(&self, e: Errno, rel: &WorkspacePath) -> WorkspaceError {
        match e {
            Errno::ENOTDIR | Errno::ELOOP | Errno::ENOENT => {
                match self.walk(
                    rel,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                ) {
                    Err(walked) => walked,
                    // It changed between the two looks; report what openat2 saw.
                    Ok(_) => resolve_error(e, rel, "open directory"),
                }
            }
            e => resolve_error(e, rel, "open directory"),
        }
    }
}

/// What an `openat(dir, name, O_NOFOLLOW | O_DIRECTORY)` failure means,
/// looking at `name` without following it.
fn explain_at(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    e: Errno,
    so_far: &WorkspacePath,
) -> WorkspaceError {
    if matches!(e, Errno::ELOOP | Errno::ENOTDIR) {
        if let Ok(st) = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            if kind_of(st.st_mode) == SFlag::S_IFLNK {
                return WorkspaceError::Symlink {
                    path: so_far.to_string(),
                };
            }
        }
    }
    resolve_error(e, so_far, "open directory")
}

/// The file-type bits of a mode.
pub(crate) fn kind_of(mode: u32) -> SFlag {
    SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits())
}

/// The typed error for a resolution or open failure at `rel`.
pub(crate) fn resolve_error(e: Errno, rel: &WorkspacePath, op: &'static str) -> WorkspaceError {
    let path = rel.to_string();
    match e {
        Errno::ENOENT => WorkspaceError::NotFound { path },
        Errno::ELOOP => WorkspaceError::Symlink { path },
        Errno::EXDEV => WorkspaceError::Escape { path },
        Errno::ENOTDIR => WorkspaceError::NotADirectory { path },
        Errno::EISDIR => WorkspaceError::IsADirectory { path },
        Errno::ENAMETOOLONG => WorkspaceError::Path(PathError::TooLong),
        e => WorkspaceError::io(op, path, e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths_parse_and_hostile_ones_are_refused() {
        assert!(WorkspacePath::parse(b"").unwrap().is_root());
        let p = WorkspacePath::parse(b"a/b c/d.txt").unwrap();
        assert_eq!(p.depth(), 3);
        let (parent, name) = p.split_last().unwrap();
        assert_eq!(parent.as_bytes(), b"a/b c");
        assert_eq!(name, "d.txt");
        let cases: &[(&[u8], PathError)] = &[
            (b"/etc/passwd", PathError::Absolute),
            (b"../x", PathError::ParentDir),
            (b"a/../../x", PathError::ParentDir),
            (b"a/./b", PathError::CurDir),
            (b".", PathError::CurDir),
            (b"a//b", PathError::EmptyComponent),
            (b"a/", PathError::EmptyComponent),
            (b"a\0b", PathError::Nul),
        ];
        for (bytes, want) in cases {
            assert_eq!(
                WorkspacePath::parse(bytes).err().as_ref(),
                Some(want),
                "{bytes:?}"
            );
        }
        let long = vec![b'x'; MAX_NAME_BYTES + 1];
        assert_eq!(
            WorkspacePath::parse(&long).err(),
            Some(PathError::NameTooLong)
        );
        let deep = vec!["d"; MAX_COMPONENTS + 1].join("/");
        assert_eq!(
            WorkspacePath::parse(deep.as_bytes()).err(),
            Some(PathError::TooDeep)
        );
        let huge = vec!["n".repeat(200); 21].join("/");
        assert_eq!(
            WorkspacePath::parse(huge.as_bytes()).err(),
            Some(PathError::TooLong)
        );
        // A name that merely starts with dots is a name.
        assert!(WorkspacePath::parse(b"...").is_ok());
        assert!(WorkspacePath::parse(b".hidden/..x").is_ok());
    }
}
