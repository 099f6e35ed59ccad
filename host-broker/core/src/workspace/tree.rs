//! Small descriptor-based steps shared by files, disk and archive: list a
//! held directory, `lstat` a name in it, open a child directory or file
//! without following it, remove a tree without following links.
//! Nothing here takes a path with more than one component.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};

use super::path::kind_of;
use super::Owner;

/// Flags for opening a directory below a held one.
pub(crate) const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// The names in a held directory, without `.` and `..`, unsorted. At most
/// `limit` names are returned; the flag says whether more were there.
pub(crate) fn read_names(dir: BorrowedFd<'_>, limit: usize) -> io::Result<(Vec<OsString>, bool)> {
    // A fresh descriptor: the listing moves its offset, the caller's stays put.
    let fd = openat(dir, ".", DIR_FLAGS, Mode::empty())?;
    let mut listing = nix::dir::Dir::from_fd(fd)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if names.len() >= limit {
            return Ok((names, true));
        }
        names.push(OsStr::from_bytes(name).to_owned());
    }
    Ok((names, false))
}

/// `lstat` of `name` in `dir`; `None` when it is gone.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<FileStat>> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Opens the child directory `name` without following it.
pub(crate) fn open_child_dir(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(openat(dir, name, DIR_FLAGS, Mode::empty())?)
}

/// Opens the regular file `name` for reading without following it, and
/// checks it is the regular file `expected` said (same inode): a fifo or a
/// swapped entry is refused with `None`. `O_NONBLOCK` so a fifo planted in
/// its place cannot block the open.
pub(crate) fn open_regular(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    expected: Option<&FileStat>,
) -> io::Result<Option<(File, FileStat)>> {
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY,
        Mode::empty(),
    )?;
    let st = nix::sys::stat::fstat(&fd)?;
    if kind_of(st.st_mode) != SFlag::S_IFREG {
        return Ok(None);
    }
    if let Some(want) = expected {
        if want.st_ino != st.st_ino || want.st_dev != st.st_dev {
            return Ok(None);
        }
    }
    Ok(Some((File::from(fd), st)))
}

/// Gives `fd` to `owner`.
pub(crate) fn chown_fd(fd: impl AsFd, owner: Owner) -> io::Result<()> {
    Ok(fchown(
        fd,
        Some(Uid::from_raw(owner.uid)),
        Some(Gid::from_raw(owner.gid)),
    )?)
}

/// Counts the entries below the directory `dir` (not `dir` itself) without
/// following links, stopping with `Err(limit)`-like `None` once more than
/// `limit` are seen or the tree is deeper than `max_depth`.
pub(crate) fn count_bounded(
    dir: BorrowedFd<'_>,
    limit: u64,
    max_depth: usize,
) -> io::Result<Option<u64>> {
    let mut seen = 0u64;
    if count_into(dir, limit, max_depth, &mut seen)? {
        Ok(Some(seen))
    } else {
        Ok(None)
    }
}

fn count_into(
    dir: BorrowedFd<'_>,
    limit: u64,
    depth_left: usize,
    seen: &mut u64,
) -> io::Result<bool> {
    let room = usize::try_from(limit.saturating_sub(*seen)).unwrap_or(usize::MAX);
    let (names, more) = read_names(dir, room)?;
    *seen += u64::try_from(names.len()).unwrap_or(u64::MAX);
    if more {
        return Ok(false);
    }
    for name in names {
        let Some(st) = lstat_at(dir, &name)? else {
            continue;
        };
        if kind_of(st.st_mode) == SFlag::S_IFDIR {
            if depth_left == 0 {
                return Ok(false);
            }
            let child = match openat(dir, name.as_os_str(), DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                // Gone, or swapped for a link or a file since the `lstat`:
                // nothing below it to count (the removal looks again).
                Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => continue,
                Err(e) => return Err(e.into()),
            };
            if !count_into(child.as_fd(), limit, depth_left - 1, seen)? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Why [`remove_tree`] stopped.
#[derive(Debug)]
pub(crate) enum RemoveError {
    /// The tree kept changing under the removal (an entry swapped for a
    /// link or a directory, or entries added faster than removed) beyond
    /// what it retries: what was removed stays removed, nothing outside the
    /// tree was touched.
    Changed,
    /// An I/O failure that is no such race.
    Io(io::Error),
}

impl From<Errno> for RemoveError {
    fn from(e: Errno) -> Self {
        match e {
            // What a guest swapping or filling the tree makes the host see.
            Errno::ELOOP | Errno::ENOTDIR | Errno::EISDIR | Errno::ENOTEMPTY | Errno::EEXIST => {
                Self::Changed
            }
            e => Self::Io(e.into()),
        }
    }
}

impl From<io::Error> for RemoveError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) => Errno::from_raw(n).into(),
            None => Self::Io(e),
        }
    }
}

/// How often one entry is looked at again when it changed type between the
/// `lstat` and the removal (a guest swapping a directory and a link).
const REMOVE_ATTEMPTS: usize = 4;

/// Removes `name` in `dir` with everything below it; links are removed,
/// never followed, and an entry already gone counts as removed. Deeper than
/// `max_depth` is an error (`ELOOP`-free recursion needs a bound). Each
/// removed entry takes one from `budget`; with none left (a guest adding
/// entries as fast as they go) it is [`RemoveError::Changed`], so the
/// removal always ends. An entry that changed type under it is looked at
/// again, [`REMOVE_ATTEMPTS`] times at most, at its own level only (a
/// parent never retries what a child gave up on, so the work stays linear).
pub(crate) fn remove_tree(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    max_depth: usize,
    budget: &mut u64,
) -> Result<(), RemoveError> {
    for _ in 0..REMOVE_ATTEMPTS {
        match remove_once(dir, name, max_depth, budget) {
            Err(Step::Swapped) => continue,
            Err(Step::Failed(e)) => return Err(e),
            Ok(()) => return Ok(()),
        }
    }
    Err(RemoveError::Changed)
}

/// Why one try of [`remove_tree`] did not finish.
enum Step {
    /// `name` itself is no longer what its `lstat` said: look again.
    Swapped,
    /// Give up (a child's removal gave up, or a real failure).
    Failed(RemoveError),
}

impl From<Errno> for Step {
    fn from(e: Errno) -> Self {
        match RemoveError::from(e) {
            RemoveError::Changed => Self::Swapped,
            e => Self::Failed(e),
        }
    }
}

fn remove_once(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    max_depth: usize,
    budget: &mut u64,
) -> Result<(), Step> {
    let st = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(Step::Failed(RemoveError::Io(e.into()))),
    };
    if *budget == 0 {
        return Err(Step::Failed(RemoveError::Changed));
    }
    if kind_of(st.st_mode) != SFlag::S_IFDIR {
        return match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => {
                *budget -= 1;
                Ok(())
            }
            Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    if max_depth == 0 {
        return Err(Step::Failed(RemoveError::Io(io::Error::other(
            "the tree is nested too deep to remove",
        ))));
    }
    let child = match openat(dir, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    loop {
        // Re-list until empty: entries may be added while we remove (the
        // budget ends a guest that never stops adding them).
        let (names, _) =
            read_names(child.as_fd(), 4096).map_err(|e| Step::Failed(RemoveError::from(e)))?;
        if names.is_empty() {
            break;
        }
        for n in names {
            remove_tree(child.as_fd(), &n, max_depth - 1, budget).map_err(Step::Failed)?;
        }
    }
    match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
        Ok(()) => {
            *budget = budget.saturating_sub(1);
            Ok(())
        }
        Err(Errno::ENOENT) => Ok(()),
        // Entries added after the last listing: this level lists again.
        Err(e) => Err(e.into()),
    }
}
