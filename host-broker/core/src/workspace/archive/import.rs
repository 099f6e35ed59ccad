//! Import: a tar (plain, gzip or zstd) read entry by entry into an empty
//! staging directory held by descriptor, every refusal made before the
//! workspace is touched.
//!
//! It never extracts with the tar crate's own unpacking, never follows a
//! link (parents are opened with `O_NOFOLLOW`, the last component is made
//! with `*at` calls that do not follow it, and an entry whose path passes
//! through an earlier symlink is refused by name), and never writes outside
//! the staging directory.
//!
//! What the archive made so far is asked of the staging directory itself,
//! which only this import writes: a parent that is a symlink is found by
//! the `O_NOFOLLOW` walk, a hard link's target by an `lstat`. So files,
//! links and symlinks cost no memory; only directory times are kept, within
//! the memory budget ([`super::budget`]).

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, futimens, mkdirat, utimensat, Mode, SFlag, UtimensatFlags};
use nix::unistd::{fchownat, linkat, symlinkat, Gid, Uid};
use tar::EntryType as TarType;

use super::budget::{Budget, DirTimes, Metered};
use super::compression::{decode, limit_refusal, read_refusal};
use super::headers::{archive_path, check_global, parse_pax, Mtime, Pax};
use super::{
    refused, ImportLimits, ImportSummary, Refusal, MAX_EXTENSION_BYTES, MAX_TRAILING_BYTES,
};
use crate::workspace::files::{sane_dir_mode, sane_file_mode};
use crate::workspace::path::{kind_of, WorkspacePath};
use crate::workspace::tree::{chown_fd, DIR_FLAGS};
use crate::workspace::{Owner, WorkspaceError};

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

/// Extension headers read for the next member.
#[derive(Debug, Default)]
struct Pending {
    pax: Option<Pax>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.pax.is_none() && self.long_name.is_none() && self.long_link.is_none()
    }
}

/// Reads the archive (plain or compressed) into the empty staged directory
/// `root`.
pub(crate) fn extract(
    root: BorrowedFd<'_>,
    input: impl Read,
    limits: &ImportLimits,
) -> Result<ImportSummary, WorkspaceError> {
    const START: &str = "<start of archive>";
    let started = Instant::now();
    let decoded = decode(input).map_err(|r| refused(START, r))?;
    // Every decompressed byte, and the time since the start, counted
    // between the decompressor and the tar reader.
    let metered = Metered::new(decoded, limits, started);
    let read = metered.counter();
    let mut watch = EofWatch {
        inner: metered,
        eof: false,
    };
    let mut x = Extractor {
        staged: Staged {
            root,
            owner: limits.owner,
            last: None,
            dirs: 0,
        },
        limits,
        summary: ImportSummary::default(),
        dir_times: DirTimes::default(),
        budget: Budget::new(limits.memory_budget),
        read,
        members: 0,
        last_entry: String::from(START),
        buf: vec![0u8; 128 * 1024],
    };
    {
        let mut archive = tar::Archive::new(&mut watch);
        // Raw: extension headers come to us, so their size is bounded and
        // their meaning is ours, not a second parser's.
        let entries = archive
            .entries()
            .map_err(|_| refused(START, Refusal::NotTar("not a tar archive")))?
            .raw(true);
        let mut pending = Pending::default();
        for entry in entries {
            let entry = entry.map_err(|e| x.header_error(&e))?;
            x.member(entry, &mut pending)?;
        }
        if !pending.is_empty() {
            return Err(x.at_end(Refusal::BadExtension(
                "an extension header without its entry",
            )));
        }
    }
    if watch.eof {
        return Err(x.at_end(Refusal::Truncated));
    }
    x.trailing(&mut watch)?;
    x.finish()
}

/// One import's state.
struct Extractor<'a, 'l> {
    staged: Staged<'a>,
    limits: &'l ImportLimits,
    summary: ImportSummary,
    /// Directory times, set last.
    dir_times: DirTimes,
    /// The memory budget of `dir_times`.
    budget: Budget,
    /// Decompressed bytes read so far.
    read: Rc<Cell<u64>>,
    members: u64,
    last_entry: String,
    buf: Vec<u8>,
}

impl Extractor<'_, '_> {
    fn at_end(&self, reason: Refusal) -> WorkspaceError {
        refused(format!("the end after {}", self.last_entry), reason)
    }

    /// A header the tar reader could not read: the very first one means
    /// the stream is no tar at all.
    fn header_error(&self, e: &io::Error) -> WorkspaceError {
        tracing::debug!(error = %e, "an imported archive's header does not parse");
        let reason = if let Some(limit) = limit_refusal(e) {
            limit
        } else if e
            .get_ref()
            .is_some_and(|i| i.is::<super::compression::CorruptStream>())
        {
            read_refusal(e)
        } else if e.kind() == io::ErrorKind::UnexpectedEof {
            Refusal::Truncated
        } else if self.members == 0 {
            Refusal::NotTar("not a tar archive")
        } else {
            Refusal::BadHeader("its checksum or a numeric field is not valid")
        };
        refused(format!("the header after {}", self.last_entry), reason)
    }

    /// Handles one raw member: an extension header is kept for the next
    /// member, anything else is checked and made.
    fn member(
        &mut self,
        mut entry: tar::Entry<'_, impl Read>,
        pending: &mut Pending,
    ) -> Result<(), WorkspaceError> {
        let kind = entry.header().entry_type();
        match kind {
            TarType::GNULongName | TarType::GNULongLink | TarType::XHeader => {
                return self.extension(&mut entry, kind, pending)
            }
            TarType::XGlobalHeader => {
                let data = self.extension_data(&mut entry, "global pax header")?;
                let name = String::from_utf8_lossy(&entry.header().path_bytes()).into_owned();
                return check_global(&data).map_err(|r| refused(name, r));
            }
            _ => {}
        }
        let pax = pending.pax.take().unwrap_or_default();
        let header_name = String::from_utf8_lossy(&entry.header().path_bytes()).into_owned();
        let raw_name = match (pax.path.clone(), pending.long_name.take()) {
            (Some(_), Some(_)) => {
                return Err(refused(
                    header_name,
                    Refusal::BadExtension("both a pax path and a long name"),
                ))
            }
            (Some(p), None) | (None, Some(p)) => p,
            (None, None) => entry.header().path_bytes().into_owned(),
        };
        let long_link = pending.long_link.take();
        let name = String::from_utf8_lossy(&raw_name).into_owned();
        let meta = self.meta(&entry, kind, &pax, &name)?;
        let link = match (pax.linkpath, long_link) {
            (Some(l), _) | (None, Some(l)) => Some(l),
            (None, None) => entry.header().link_name_bytes().map(|l| l.into_owned()),
        };
        let is_dir = kind == TarType::Directory;
        let path = archive_path(&raw_name, is_dir).map_err(|r| refused(name.clone(), r))?;
        if self.summary.symlinks > 0 {
            // Once a symlink exists, a path through one is refused before
            // anything else is said of the entry: its parent is opened now
            // (and kept open for the entry itself).
            if let Some((parent, _)) = path.as_ref().and_then(WorkspacePath::split_last) {
                self.staged.dir(&parent, &name)?;
            }
        }
        match kind {
            TarType::Directory => self.directory(path, meta, &name)?,
            TarType::Regular => self.file(path, &mut entry, meta, &name)?,
            TarType::Symlink => self.symlink(path, link, meta, &name)?,
            _ => self.hard_link(path, link, &name)?,
        }
        self.last_entry = name;
        Ok(())
    }

    /// Checks the member's type, count, size and mode, and returns them.
    fn meta(
        &mut self,
        entry: &tar::Entry<'_, impl Read>,
        kind: TarType,
        pax: &Pax,
        name: &str,
    ) -> Result<Meta, WorkspaceError> {
        self.members += 1;
        if self.members > self.limits.max_entries {
            return Err(refused(
                name,
                Refusal::TooManyEntries(self.limits.max_entries),
            ));
        }
        let reason = match kind {
            TarType::Regular | TarType::Directory | TarType::Symlink | TarType::Link => None,
            TarType::Char | TarType::Block => Some(Refusal::Device),
            TarType::Fifo => Some(Refusal::Fifo),
            TarType::GNUSparse => Some(Refusal::Sparse),
            other => Some(Refusal::Unsupported(char::from(other.as_byte()))),
        };
        if let Some(reason) = reason {
            return Err(refused(name, reason));
        }
        let size = entry.size();
        if let Some(pax_size) = pax.size {
            if pax_size != size {
                return Err(refused(
                    name,
                    Refusal::PaxSize {
                        pax: pax_size,
                        header: size,
                    },
                ));
            }
        }
        // Refused before a byte of it is read: every byte of the archive
        // read so far, this header included, counts.
        if size > self.limits.max_total_bytes.saturating_sub(self.read.get()) {
            return Err(refused(
                name,
                Refusal::TooLarge(self.limits.max_total_bytes),
            ));
        }
        let mode = entry
            .header()
            .mode()
            .map_err(|_| refused(name, Refusal::BadHeader("the mode is not a number")))?;
        let mtime = match pax.mtime {
            Some(t) => t,
            None => Mtime {
                secs: entry
                    .header()
                    .mtime()
                    .ok()
                    .and_then(|t| i64::try_from(t).ok())
                    .unwrap_or(0),
                nanos: 0,
            },
        };
        Ok(Meta { size, mode, mtime })
    }

    /// Reads an extension header into `pending`.
    fn extension(
        &mut self,
        entry: &mut tar::Entry<'_, impl Read>,
        kind: TarType,
        pending: &mut Pending,
    ) -> Result<(), WorkspaceError> {
        let (what, slot_taken) = match kind {
            TarType::XHeader => ("pax header", pending.pax.is_some()),
            TarType::GNULongName => ("long-name entry", pending.long_name.is_some()),
            _ => ("long-link entry", pending.long_link.is_some()),
        };
        let mut data = self.extension_data(entry, what)?;
        let here = || format!("the {what} after {}", self.last_entry);
        if slot_taken {
            return Err(refused(
                here(),
                Refusal::BadExtension("two of one kind for one entry"),
            ));
        }
        if kind == TarType::XHeader {
            pending.pax = Some(parse_pax(&data).map_err(|r| refused(here(), r))?);
        } else {
            while data.last() == Some(&0) {
                data.pop();
            }
            if kind == TarType::GNULongName {
                pending.long_name = Some(data);
            } else {
                pending.long_link = Some(data);
            }
        }
        Ok(())
    }

    fn extension_data(
        &self,
        entry: &mut tar::Entry<'_, impl Read>,
        what: &str,
    ) -> Result<Vec<u8>, WorkspaceError> {
        let here = || format!("the {what} after {}", self.last_entry);
        if entry.size() > MAX_EXTENSION_BYTES {
            return Err(refused(here(), Refusal::BadExtension("too long")));
        }
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .map_err(|e| refused(here(), read_refusal(&e)))?;
        Ok(data)
    }

    fn directory(
        &mut self,
        path: Option<WorkspacePath>,
        meta: Meta,
        name: &str,
    ) -> Result<(), WorkspaceError> {
        if meta.size != 0 {
            return Err(refused(
                name,
                Refusal::BadHeader("a directory with content"),
            ));
        }
        let Some(path) = path else {
            return Ok(());
        };
        import_dir(&mut self.staged, &path, meta.mode, name)?;
        self.dir_times
            .push(path.as_bytes(), meta.mtime, &mut self.budget)
            .map_err(|e| refused(name, Refusal::OverBudget(e.0)))
    }

    fn file(
        &mut self,
        path: Option<WorkspacePath>,
        data: &mut impl Read,
        meta: Meta,
        name: &str,
    ) -> Result<(), WorkspaceError> {
        let Some(path) = path else {
            return Err(refused(name, Refusal::FileIsRoot));
        };
        import_file(&mut self.staged, &path, data, meta, name, &mut self.buf)?;
        self.summary.files += 1;
        self.summary.bytes += meta.size;
        Ok(())
    }

    fn symlink(
        &mut self,
        path: Option<WorkspacePath>,
        target: Option<Vec<u8>>,
        meta: Meta,
        name: &str,
    ) -> Result<(), WorkspaceError> {
        let Some(path) = path else {
            return Err(refused(name, Refusal::Duplicate));
        };
        let target = target
            .filter(|t| !t.is_empty())
            .ok_or_else(|| refused(name, Refusal::BadLinkTarget("empty")))?;
        let Some((parent, last)) = path.split_last() else {
            return Err(refused(name, Refusal::Duplicate));
        };
        let owner = self.staged.owner;
        let at = self.staged.dir(&parent, name)?;
        symlinkat(target.as_slice(), at, last).map_err(|e| match e {
            Errno::EEXIST => refused(name, Refusal::Duplicate),
            Errno::ENAMETOOLONG => refused(name, Refusal::BadLinkTarget("too long")),
            e => WorkspaceError::io("make the link", &path, e.into()),
        })?;
        fchownat(
            at,
            last,
            Some(Uid::from_raw(owner.uid)),
            Some(Gid::from_raw(owner.gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| WorkspaceError::io("chown", &path, e.into()))?;
        let t = meta.mtime.spec();
        utimensat(at, last, &t, &t, UtimensatFlags::NoFollowSymlink)
            .map_err(|e| WorkspaceError::io("set times of", &path, e.into()))?;
        self.summary.symlinks += 1;
        Ok(())
    }

    fn hard_link(
        &mut self,
        path: Option<WorkspacePath>,
        target: Option<Vec<u8>>,
        name: &str,
    ) -> Result<(), WorkspaceError> {
        let Some(path) = path else {
            return Err(refused(name, Refusal::Duplicate));
        };
        let target = target
            .filter(|t| !t.is_empty())
            .ok_or_else(|| refused(name, Refusal::BadLinkTarget("empty")))?;
        let to = match archive_path(&target, false) {
            Ok(Some(p)) => p,
            Ok(None) | Err(Refusal::FileIsRoot | Refusal::FileWithSlash) => {
                let shown = String::from_utf8_lossy(&target).into_owned();
                return Err(refused(name, Refusal::LinkTargetUnknown(shown)));
            }
            Err(Refusal::Path(e)) => return Err(refused(name, Refusal::LinkTargetPath(e))),
            Err(r) => return Err(refused(name, r)),
        };
        let unknown = || refused(name, Refusal::LinkTargetUnknown(to.to_string()));
        let (Some((from_parent, from_last)), Some((parent, last))) =
            (to.split_last(), path.split_last())
        else {
            return Err(refused(name, Refusal::Duplicate));
        };
        // Only this import writes the staging directory: a file or symlink
        // there was made by an earlier entry, and nothing else may be named.
        let from_dir = self.staged.open_existing(&from_parent, &to, name)?;
        match fstatat(&from_dir, from_last, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if matches!(kind_of(st.st_mode), SFlag::S_IFREG | SFlag::S_IFLNK) => {}
            Ok(_) | Err(Errno::ENOENT | Errno::ENOTDIR) => return Err(unknown()),
            Err(e) => return Err(WorkspaceError::io("stat", &to, e.into())),
        }
        let at = self.staged.dir(&parent, name)?;
        // No AT_SYMLINK_FOLLOW: a link to a symlink names the symlink.
        linkat(&from_dir, from_last, at, last, AtFlags::empty()).map_err(|e| match e {
            Errno::EEXIST => refused(name, Refusal::Duplicate),
            e => WorkspaceError::io("link", &path, e.into()),
        })?;
        self.summary.hard_links += 1;
        Ok(())
    }

    /// Reads what follows the end-of-archive marker, up to
    /// [`MAX_TRAILING_BYTES`], so a compressed stream is checked to its
    /// end and a stream that goes on is refused.
    fn trailing(&mut self, input: &mut impl Read) -> Result<(), WorkspaceError> {
        let mut rest = input.take(MAX_TRAILING_BYTES + 1);
        let mut seen = 0u64;
        loop {
            let n = match rest.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.at_end(read_refusal(&e))),
            };
            seen += u64::try_from(n).unwrap_or(u64::MAX);
        }
        if seen > MAX_TRAILING_BYTES {
            return Err(self.at_end(Refusal::TrailingData(MAX_TRAILING_BYTES)));
        }
        Ok(())
    }

    /// Sets directory times, last: making their entries changed them. In
    /// the order listed, so a directory listed twice keeps its last time.
    fn finish(mut self) -> Result<ImportSummary, WorkspaceError> {
        let times = std::mem::take(&mut self.dir_times);
        times.for_each(|path, mtime| {
            let Ok(path) = WorkspacePath::parse(path) else {
                return;
            };
            if let Ok(fd) = self.staged.dir(&path, "") {
                let t = mtime.spec();
                let _ = futimens(fd, &t, &t);
            }
        });
        self.summary.dirs = self.staged.dirs;
        Ok(self.summary)
    }
}

/// Directories of the staged tree, opened by descriptor, with the last
/// parent kept open (archives list a directory's files together).
struct Staged<'a> {
    root: BorrowedFd<'a>,
    owner: Owner,
    last: Option<(WorkspacePath, OwnedFd)>,
    /// Directories made so far, listed or implied.
    dirs: u64,
}

impl Staged<'_> {
    /// Opens the existing directory `rel`, the parent of the hard link
    /// target `target`, without making anything.
    fn open_existing(
        &self,
        rel: &WorkspacePath,
        target: &WorkspacePath,
        entry: &str,
    ) -> Result<OwnedFd, WorkspaceError> {
        let mut cur = openat(self.root, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| WorkspaceError::io("open", "staging", e.into()))?;
        for name in rel.components() {
            cur = openat(&cur, name, DIR_FLAGS, Mode::empty()).map_err(|e| match e {
                Errno::ENOTDIR | Errno::ELOOP | Errno::ENOENT => {
                    refused(entry, Refusal::LinkTargetUnknown(target.to_string()))
                }
                e => WorkspaceError::io("open", rel, e.into()),
            })?;
        }
        Ok(cur)
    }

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
                        // A symlink an earlier entry made, or a file.
                        let through = fstatat(at, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                            .is_ok_and(|st| kind_of(st.st_mode) == SFlag::S_IFLNK);
                        let reason = if through {
                            Refusal::ThroughSymlink(so_far.to_string())
                        } else {
                            Refusal::ParentNotDir
                        };
                        return Err(refused(entry, reason));
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
    mtime: Mtime,
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
            Err(e) => return Err(refused(name, read_refusal(&e))),
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
    let t = mtime.spec();
    futimens(&file, &t, &t).map_err(|e| WorkspaceError::io("set times of", path, e.into()))?;
    Ok(())
}
