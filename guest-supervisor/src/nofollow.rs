//! Filesystem steps that never follow a symlink.
//!
//! The supervisor runs as root and works in directories the desktop user
//! owns (the home, the workspace, `/tmp`), where that user may have planted
//! symlinks to anywhere, `/` included. Everything here works on directory
//! file descriptors: a path is opened component by component with
//! `O_NOFOLLOW | O_DIRECTORY` below a trusted, root-owned anchor, and every
//! later step (`lstat`, `unlink`, `chown`, `mkdir`, copy) is an `*at` call on
//! a name inside a held directory, so no step can be redirected by a link.
//! This module must never resolve a user-controlled path with a plain path
//! call.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmod, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{fchown, fchownat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

/// Deepest tree [`HeldDir::copy_into`] and [`HeldDir::remove_tree`] walk;
/// deeper trees are an error rather than a stack overflow.
const MAX_DEPTH: usize = 128;

/// What a directory entry is, seen without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A real directory.
    Dir,
    /// A symlink (never followed).
    Symlink,
    /// A regular file.
    File,
    /// A socket, fifo or device.
    Other,
}

/// An entry's kind with its owner and permission bits.
#[derive(Debug, Clone, Copy)]
pub struct EntryStat {
    /// Kind.
    pub kind: EntryKind,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Permission bits (`0o7777`).
    pub mode: u32,
}

impl From<FileStat> for EntryStat {
    fn from(st: FileStat) -> Self {
        let fmt = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        let kind = if fmt == SFlag::S_IFDIR {
            EntryKind::Dir
        } else if fmt == SFlag::S_IFLNK {
            EntryKind::Symlink
        } else if fmt == SFlag::S_IFREG {
            EntryKind::File
        } else {
            EntryKind::Other
        };
        Self {
            kind,
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode & 0o7777,
        }
    }
}

/// Who new and migrated entries belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
}

fn errno(e: Errno) -> io::Error {
    io::Error::from(e)
}

/// Gives the open file or directory `fd` to `owner`.
fn fchown_to(fd: impl AsFd, owner: Owner) -> io::Result<()> {
    fchown(
        fd,
        Some(Uid::from_raw(owner.uid)),
        Some(Gid::from_raw(owner.gid)),
    )
    .map_err(errno)
}

/// `path` relative to `anchor`; an error when it does not lie below it.
fn below<'p>(anchor: &Path, path: &'p Path) -> io::Result<&'p Path> {
    path.strip_prefix(anchor).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not below {}", path.display(), anchor.display()),
        )
    })
}

/// A directory held open by a file descriptor, with the path it was reached
/// by (for messages only; the path is never used to act).
#[derive(Debug)]
pub struct HeldDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl HeldDir {
    /// Opens a directory the supervisor trusts (root-owned, not writable by
    /// the desktop user), following links as any system path would.
    pub fn open_trusted(path: &Path) -> io::Result<Self> {
        let fd = openat(
            AT_FDCWD,
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        Ok(Self {
            fd,
            path: path.to_owned(),
        })
    }

    /// Opens `path`, which must lie below `anchor`: the anchor is trusted,
    /// every component below it is opened with `O_NOFOLLOW`, so a symlink
    /// anywhere on the way fails with `ELOOP` or `ENOTDIR`.
    pub fn open_beneath(anchor: &Path, path: &Path) -> io::Result<Self> {
        let rel = below(anchor, path)?;
        let mut dir = Self::open_trusted(anchor)?;
        for component in rel.components() {
            match component {
                Component::Normal(name) => dir = dir.open_dir(name)?,
                Component::CurDir => {}
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{} has an unexpected component", path.display()),
                    ))
                }
            }
        }
        Ok(dir)
    }

    /// Like [`Self::open_beneath`], creating missing directories (mode
    /// `mode`, owned by `owner`) on the way.
    pub fn ensure_beneath(anchor: &Path, path: &Path, mode: u32, owner: Owner) -> io::Result<Self> {
        let rel = below(anchor, path)?;
        let mut dir = Self::open_trusted(anchor)?;
        for component in rel.components() {
            if let Component::Normal(name) = component {
                dir = dir.ensure_dir(name, mode, owner)?;
            }
        }
        Ok(dir)
    }

    /// The path this directory was reached by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of an entry, for messages.
    pub fn display(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// The descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// This directory's own kind, owner and mode.
    pub fn stat_self(&self) -> io::Result<EntryStat> {
        nix::sys::stat::fstat(&self.fd)
            .map(EntryStat::from)
            .map_err(errno)
    }

    /// Opens a subdirectory without following a link.
    pub fn open_dir(&self, name: &OsStr) -> io::Result<Self> {
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        Ok(Self {
            fd,
            path: self.path.join(name),
        })
    }

    /// `lstat` of an entry; `None` when it does not exist.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<EntryStat>> {
        match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st.into())),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// Opens `name` as a directory, creating it (mode `mode`, owned by
    /// `owner`) when missing. A link or a file in its place is an error
    /// (`ENOTDIR`/`ELOOP`): the caller decides what to do with it.
    pub fn ensure_dir(&self, name: &OsStr, mode: u32, owner: Owner) -> io::Result<Self> {
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)) {
            Ok(()) => {
                let dir = self.open_dir(name)?;
                // mkdir is subject to the umask; say what we mean. Mode
                // before owner: once it belongs to someone else, a chmod
                // would need CAP_FOWNER.
                dir.chmod(mode)?;
                dir.chown(owner)?;
                Ok(dir)
            }
            Err(Errno::EEXIST) => self.open_dir(name),
            Err(e) => Err(errno(e)),
        }
    }

    /// Names in this directory, without `.` and `..`.
    pub fn entries(&self) -> io::Result<Vec<OsString>> {
        let fd = openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        let mut listing = nix::dir::Dir::from_fd(fd).map_err(errno)?;
        let mut names = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(errno)?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_owned());
            }
        }
        Ok(names)
    }

    /// Whether the directory has no entries.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.entries()?.is_empty())
    }

    /// Removes a non-directory entry (a link is removed, never its target).
    pub fn unlink(&self, name: &OsStr) -> io::Result<()> {
        unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir).map_err(errno)
    }

    /// Removes an entry of any kind, a directory with everything below it.
    /// Links inside are removed, never followed.
    pub fn remove_tree(&self, name: &OsStr) -> io::Result<()> {
        self.remove_tree_at(name, 0)
    }

    fn remove_tree_at(&self, name: &OsStr, depth: usize) -> io::Result<()> {
        match self.stat(name)? {
            None => Ok(()),
            Some(st) if st.kind == EntryKind::Dir => {
                if depth >= MAX_DEPTH {
                    return Err(too_deep(&self.display(name)));
                }
                let dir = self.open_dir(name)?;
                for child in dir.entries()? {
                    dir.remove_tree_at(&child, depth + 1)?;
                }
                unlinkat(&self.fd, name, UnlinkatFlags::RemoveDir).map_err(errno)
            }
            Some(_) => self.unlink(name),
        }
    }

    /// Creates the link `name` → `target` owned by `owner`.
    pub fn symlink(&self, name: &OsStr, target: &Path, owner: Owner) -> io::Result<()> {
        symlinkat(target, &self.fd, name).map_err(errno)?;
        self.chown_entry(name, owner)
    }

    /// The target of the link `name`.
    pub fn read_link(&self, name: &OsStr) -> io::Result<PathBuf> {
        nix::fcntl::readlinkat(&self.fd, name)
            .map(PathBuf::from)
            .map_err(errno)
    }

    /// Renames `from` in this directory to `to` in `dest`.
    pub fn rename(&self, from: &OsStr, dest: &HeldDir, to: &OsStr) -> io::Result<()> {
        nix::fcntl::renameat(&self.fd, from, &dest.fd, to).map_err(errno)
    }

    /// Changes the owner of this directory.
    pub fn chown(&self, owner: Owner) -> io::Result<()> {
        fchown_to(&self.fd, owner)
    }

    /// Changes the permission bits of this directory.
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        fchmod(&self.fd, Mode::from_bits_truncate(mode)).map_err(errno)
    }

    /// Changes the owner of an entry, of the link itself for a link.
    pub fn chown_entry(&self, name: &OsStr, owner: Owner) -> io::Result<()> {
        fchownat(
            &self.fd,
            name,
            Some(Uid::from_raw(owner.uid)),
            Some(Gid::from_raw(owner.gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(errno)
    }

    /// Opens a regular file for reading without following a link.
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .map_err(errno)?;
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", self.display(name).display()),
            ));
        }
        Ok(file)
    }

    /// Creates a new regular file (it must not exist) owned by `owner`.
    pub fn create_file(&self, name: &OsStr, mode: u32, owner: Owner) -> io::Result<File> {
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(errno)?;
        // Subject to the umask on creation; say what we mean (before the
        // owner changes, so no CAP_FOWNER is needed).
        fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(errno)?;
        fchown_to(&fd, owner)?;
        Ok(File::from(fd))
    }

    /// Replaces the content of the regular file `name` atomically: a new
    /// file beside it, fsync, rename over it. Owner and mode as given.
    pub fn replace_file(
        &self,
        name: &OsStr,
        content: &[u8],
        mode: u32,
        owner: Owner,
    ) -> io::Result<()> {
        use std::io::Write as _;
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(".dormouse-tmp");
        let _ = self.unlink(&tmp_name);
        let mut file = self.create_file(&tmp_name, mode, owner)?;
        let written = file.write_all(content).and_then(|()| file.sync_all());
        if let Err(e) = written.and_then(|()| self.rename(&tmp_name, self, name)) {
            let _ = self.unlink(&tmp_name);
            return Err(e);
        }
        Ok(())
    }

    /// Copies everything in this directory into `dest` (which should be
    /// empty): directories, regular files with their permission bits (no
    /// set-id bits), links as links. Sockets, fifos and devices are skipped.
    /// Every copy belongs to `owner`.
    pub fn copy_into(&self, dest: &HeldDir, owner: Owner) -> io::Result<()> {
        self.copy_into_at(dest, owner, 0)
    }

    fn copy_into_at(&self, dest: &HeldDir, owner: Owner, depth: usize) -> io::Result<()> {
        if depth >= MAX_DEPTH {
            return Err(too_deep(self.path()));
        }
        for name in self.entries()? {
            let Some(st) = self.stat(&name)? else {
                continue; // vanished meanwhile
            };
            let mode = st.mode & 0o1777;
            match st.kind {
                EntryKind::Dir => {
                    let to = dest.ensure_dir(&name, mode | 0o700, owner)?;
                    self.open_dir(&name)?.copy_into_at(&to, owner, depth + 1)?;
                }
                EntryKind::File => {
                    let mut from = self.open_file(&name)?;
                    let mut to = dest.create_file(&name, mode, owner)?;
                    io::copy(&mut from, &mut to)?;
                }
                EntryKind::Symlink => {
                    let target = self.read_link(&name)?;
                    dest.symlink(&name, &target, owner)?;
                }
                EntryKind::Other => {
                    tracing::debug!(path = %self.display(&name).display(), "not copying a special file");
                }
            }
        }
        Ok(())
    }
}

fn too_deep(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is nested deeper than {MAX_DEPTH} levels",
            path.display()
        ),
    )
}

/// Whether an error means "a link or non-directory stood where a directory
/// was expected" (what `O_NOFOLLOW | O_DIRECTORY` reports).
pub fn is_not_a_real_dir(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::ELOOP | Errno::ENOTDIR)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn me() -> Owner {
        Owner {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        }
    }

    #[test]
    fn open_beneath_refuses_a_link_on_the_way() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path();
        std::fs::create_dir_all(base.join("home/real/deeper")).expect("mkdir");
        symlink(base.join("home/real"), base.join("home/link")).expect("link");
        HeldDir::open_beneath(base, &base.join("home/real/deeper")).expect("real path");
        let err = HeldDir::open_beneath(base, &base.join("home/link/deeper")).expect_err("link");
        assert!(is_not_a_real_dir(&err), "{err}");
    }

    #[test]
    fn remove_tree_never_follows_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path();
        std::fs::create_dir_all(base.join("victim")).expect("mkdir");
        std::fs::write(base.join("victim/precious"), "x").expect("write");
        std::fs::create_dir_all(base.join("tree/sub")).expect("mkdir");
        symlink(base.join("victim"), base.join("tree/sub/to-victim")).expect("link");
        let held = HeldDir::open_trusted(base).expect("open");
        held.remove_tree(OsStr::new("tree")).expect("remove");
        assert!(!base.join("tree").exists());
        assert!(base.join("victim/precious").exists());
    }

    #[test]
    fn copy_keeps_links_as_links_and_files_as_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path();
        std::fs::create_dir_all(base.join("from/sub")).expect("mkdir");
        std::fs::write(base.join("from/sub/file"), "data").expect("write");
        symlink("/", base.join("from/root-link")).expect("link");
        std::fs::create_dir_all(base.join("to")).expect("mkdir");
        let from = HeldDir::open_trusted(&base.join("from")).expect("open");
        let to = HeldDir::open_trusted(&base.join("to")).expect("open");
        from.copy_into(&to, me()).expect("copy");
        assert_eq!(
            std::fs::read_to_string(base.join("to/sub/file")).expect("read"),
            "data"
        );
        let meta = std::fs::symlink_metadata(base.join("to/root-link")).expect("lstat");
        assert!(meta.file_type().is_symlink());
    }
}
