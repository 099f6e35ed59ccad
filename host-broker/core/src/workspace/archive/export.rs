//! Export: the workspace walked by descriptor, never following a link,
//! written as a POSIX tar (ustar headers, PAX records for what does not
//! fit), plain or compressed.
//!
//! It must never follow a link, never read outside the workspace's
//! filesystem, and never end a failed export with an end-of-archive marker
//! or a compressor's trailer. What it keeps per entry (the first name of a
//! file with several, the listing of each directory on the way down) is
//! charged against the memory budget ([`super::budget`]).

use std::cell::Cell;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::readlinkat;
use nix::sys::stat::{FileStat, SFlag};
use tar::{EntryType as TarType, Header};

use super::budget::{Budget, FirstNames, ITEM_OVERHEAD};
use super::compression::Encoder;
use super::{
    Compression, ExportSummary, ImportLimits, BROWSER_CACHES, BROWSER_LOCKS, BROWSER_PROFILES,
};
use crate::workspace::path::{kind_of, WorkspacePath, WorkspaceRoot};
use crate::workspace::tree::{lstat_at, open_child_dir, open_regular, read_names};
use crate::workspace::WorkspaceError;

/// Largest size an ustar header holds in octal (8 GiB - 1).
const USTAR_MAX_SIZE: u64 = (1 << 33) - 1;
/// Largest time an ustar header holds in octal.
const USTAR_MAX_TIME: i64 = (1 << 33) - 1;
/// A tar block.
const BLOCK: u64 = 512;
/// The end-of-archive marker: two zero blocks.
const END_MARKER: u64 = 2 * BLOCK;

/// A writer that refuses everything once poisoned, so a failed export
/// cannot end with the tar builder's end-of-archive marker or the
/// compressor's trailer. The flag is shared with the export, which sets it.
struct Poisonable<W> {
    inner: W,
    poisoned: Rc<Cell<bool>>,
}

impl<W: Write> Write for Poisonable<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.poisoned.get() {
            return Err(io::Error::other("the export failed"));
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.poisoned.get() {
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

type Builder<W> = tar::Builder<Encoder<Poisonable<W>>>;

/// Writes a plain tar of the workspace into `out` (see
/// [`export_archive`]), within the default import limits.
pub fn export_tar<W: Write>(root: &WorkspaceRoot, out: W) -> Result<ExportSummary, WorkspaceError> {
    export_archive(root, out, Compression::None, &ImportLimits::default())
}

/// Writes a tar of the workspace into `out`, compressed as `compression`
/// says (see the module documentation for what is left out). On error the
/// stream is left without its end-of-archive marker and trailer.
///
/// The archive is bounded by what the import accepts (`limits`): an
/// archive of more than [`ImportLimits::max_total_bytes`] (every byte of
/// the tar counted, as the import counts it; a sparse file counts at its
/// full size: the import takes no holes) or more entries than
/// [`ImportLimits::max_entries`] ends it with
/// [`WorkspaceError::ExportTooLarge`] the moment the entry that crosses the
/// line comes up, before a byte of that entry is read; bookkeeping past
/// [`ImportLimits::memory_budget`] ends it with
/// [`WorkspaceError::ExportOverBudget`]. Call [`export_check`] first to
/// refuse such a workspace before answering.
pub fn export_archive<W: Write>(
    root: &WorkspaceRoot,
    out: W,
    compression: Compression,
    limits: &ImportLimits,
) -> Result<ExportSummary, WorkspaceError> {
    let poisoned = Rc::new(Cell::new(false));
    let sink = Poisonable {
        inner: out,
        poisoned: poisoned.clone(),
    };
    let write_err = |e| WorkspaceError::io("write the archive of", root.path().display(), e);
    let builder = tar::Builder::new(Encoder::new(sink, compression).map_err(write_err)?);
    let mut walk = Walk::new(builder, root, limits, false);
    let top = root.open_dir(&WorkspacePath::root())?;
    if let Err(e) = walk.dir(top.as_fd(), &WorkspacePath::root()) {
        // Dropping the builder would write the end-of-archive marker.
        poisoned.set(true);
        return Err(e);
    }
    let summary = walk.summary;
    walk.builder
        .into_inner()
        .and_then(Encoder::finish)
        .and_then(|mut w| w.flush())
        .map_err(write_err)?;
    Ok(summary)
}

/// What an export of the workspace would hold now, walked as the export
/// walks it (the same entries left out) but reading no file: the
/// [`WorkspaceError::ExportTooLarge`] an export would end with, before any
/// of it is sent. Only `lstat`s: cheap beside the export itself.
pub fn export_check(
    root: &WorkspaceRoot,
    limits: &ImportLimits,
) -> Result<ExportSummary, WorkspaceError> {
    let write_err = |e| WorkspaceError::io("measure the archive of", root.path().display(), e);
    let builder = tar::Builder::new(
        Encoder::new(
            Poisonable {
                inner: io::sink(),
                poisoned: Rc::new(Cell::new(false)),
            },
            Compression::None,
        )
        .map_err(write_err)?,
    );
    let mut walk = Walk::new(builder, root, limits, true);
    let top = root.open_dir(&WorkspacePath::root())?;
    walk.dir(top.as_fd(), &WorkspacePath::root())?;
    Ok(walk.summary)
}

/// One export's walk.
struct Walk<'l, W: Write> {
    builder: Builder<W>,
    dev: u64,
    summary: ExportSummary,
    /// Files with more than one name, by inode: the path of the name
    /// written first, until the last name was met.
    seen: FirstNames,
    /// The memory budget of `seen` and of the listings on the way down.
    budget: Budget,
    /// What the import accepts, which bounds what is written.
    limits: &'l ImportLimits,
    /// Entries written so far (every type).
    entries: u64,
    /// Bytes of the archive so far, as the import counts them.
    archived: u64,
    /// Measure only ([`export_check`]): no file is opened, nothing written.
    dry: bool,
}

impl<'l, W: Write> Walk<'l, W> {
    fn new(builder: Builder<W>, root: &WorkspaceRoot, limits: &'l ImportLimits, dry: bool) -> Self {
        Self {
            builder,
            dev: root.dev(),
            summary: ExportSummary::default(),
            seen: FirstNames::default(),
            budget: Budget::new(limits.memory_budget),
            limits,
            entries: 0,
            archived: 0,
            dry,
        }
    }

    /// Counts one more entry against the import's limits: its bytes in the
    /// archive (extension records, header, content and its padding), with
    /// room kept for the end-of-archive marker.
    fn admit(&mut self, child: &WorkspacePath, entry: &Entry<'_>) -> Result<(), WorkspaceError> {
        self.entries += 1;
        let bytes = entry.archive_bytes();
        let total = self
            .archived
            .saturating_add(bytes)
            .saturating_add(END_MARKER);
        if self.entries > self.limits.max_entries || total > self.limits.max_total_bytes {
            return Err(WorkspaceError::ExportTooLarge {
                path: child.to_string(),
                size: entry.size,
                max_bytes: self.limits.max_total_bytes,
                max_entries: self.limits.max_entries,
            });
        }
        self.archived += bytes;
        Ok(())
    }

    fn over_budget(&self, child: &WorkspacePath) -> WorkspaceError {
        WorkspaceError::ExportOverBudget {
            path: child.to_string(),
            budget: self.budget.limit(),
        }
    }
}

impl<W: Write> Walk<'_, W> {
    fn dir(&mut self, dir: BorrowedFd<'_>, rel: &WorkspacePath) -> Result<(), WorkspaceError> {
        // The listing is held while the walk goes down: at most what the
        // budget has left, each name charged.
        let most = usize::try_from(self.budget.left() / ITEM_OVERHEAD).unwrap_or(usize::MAX);
        let (mut names, cut) =
            read_names(dir, most).map_err(|e| WorkspaceError::io("list", rel, e))?;
        let listing: u64 = names
            .iter()
            .map(|n| u64::try_from(n.len()).unwrap_or(u64::MAX) + ITEM_OVERHEAD)
            .sum();
        if cut || self.budget.charge(listing).is_err() {
            return Err(self.over_budget(rel));
        }
        let walked = self.dir_names(dir, rel, &mut names);
        self.budget.release(listing);
        walked
    }

    fn dir_names(
        &mut self,
        dir: BorrowedFd<'_>,
        rel: &WorkspacePath,
        names: &mut [std::ffi::OsString],
    ) -> Result<(), WorkspaceError> {
        names.sort();
        let in_profiles = rel.first() == Some(OsStr::new(BROWSER_PROFILES));
        for name in names.iter() {
            let name = name.as_os_str();
            let child = rel.join_unchecked(name);
            let Some(st) =
                lstat_at(dir, name).map_err(|e| WorkspaceError::io("stat", &child, e))?
            else {
                self.summary.changed_while_reading += 1;
                continue;
            };
            let kind = kind_of(st.st_mode);
            let name_str = name.to_str();
            if in_profiles && name_str.is_some_and(|n| BROWSER_LOCKS.contains(&n)) {
                self.summary.skipped_browser_state += 1;
                continue;
            }
            if kind != SFlag::S_IFREG && kind != SFlag::S_IFDIR && kind != SFlag::S_IFLNK {
                self.summary.skipped_special += 1;
                continue;
            }
            if kind == SFlag::S_IFDIR
                && in_profiles
                && name_str.is_some_and(|n| BROWSER_CACHES.contains(&n))
            {
                self.summary.skipped_browser_state += 1;
                continue;
            }
            if WorkspacePath::parse(child.as_bytes()).is_err() || st.st_dev != self.dev {
                tracing::warn!(path = %child, "export leaves out an entry the import would refuse (path too long or deep, or another filesystem)");
                self.summary.skipped_unimportable += 1;
                continue;
            }
            if kind == SFlag::S_IFDIR {
                self.subdir(dir, name, &child, &st)?;
            } else if kind == SFlag::S_IFLNK {
                self.symlink(dir, name, &child, &st)?;
            } else {
                self.file(dir, name, &child, &st)?;
            }
        }
        Ok(())
    }

    fn subdir(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        child: &WorkspacePath,
        st: &FileStat,
    ) -> Result<(), WorkspaceError> {
        let mut path = child.as_bytes().to_vec();
        path.push(b'/');
        let entry = Entry::new(TarType::Directory, &path, st);
        self.admit(child, &entry)?;
        self.append(entry, io::empty(), child)?;
        self.summary.dirs += 1;
        let sub = match open_child_dir(dir, name) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(Errno::ENOENT as i32) => {
                self.summary.changed_while_reading += 1;
                return Ok(());
            }
            Err(e) => return Err(WorkspaceError::io("open", child, e)),
        };
        self.dir(sub.as_fd(), child)
    }

    fn symlink(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        child: &WorkspacePath,
        st: &FileStat,
    ) -> Result<(), WorkspaceError> {
        let target = match readlinkat(dir, name) {
            Ok(t) => t,
            Err(Errno::ENOENT | Errno::EINVAL) => {
                self.summary.changed_while_reading += 1;
                return Ok(());
            }
            Err(e) => return Err(WorkspaceError::io("read the link", child, e.into())),
        };
        let mut entry = Entry::new(TarType::Symlink, child.as_bytes(), st);
        entry.link = Some(target.as_bytes());
        self.admit(child, &entry)?;
        self.append(entry, io::empty(), child)?;
        self.summary.symlinks += 1;
        Ok(())
    }

    fn file(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        child: &WorkspacePath,
        st: &FileStat,
    ) -> Result<(), WorkspaceError> {
        // Every name is on the workspace's filesystem (others are left
        // out), so the inode alone names the file.
        let ino = st.st_ino;
        let links = st.st_nlink;
        if links > 1 {
            if let Some(first) = self.seen.first(ino).map(<[u8]>::to_vec) {
                let mut entry = Entry::new(TarType::Link, child.as_bytes(), st);
                entry.link = Some(&first);
                self.admit(child, &entry)?;
                self.append(entry, io::empty(), child)?;
                self.seen.met(ino, &mut self.budget);
                self.summary.hard_links += 1;
                return Ok(());
            }
        }
        let listed = u64::try_from(st.st_size).unwrap_or(0);
        let mut entry = Entry::new(TarType::Regular, child.as_bytes(), st);
        entry.size = listed;
        self.admit(child, &entry)?;
        if self.dry {
            if links > 1 {
                self.keep_first_name(ino, child, links)?;
            }
            self.summary.files += 1;
            self.summary.bytes += listed;
            return Ok(());
        }
        let opened = match open_regular(dir, name, Some(st)) {
            Ok(Some(pair)) => pair,
            Ok(None) => {
                self.summary.changed_while_reading += 1;
                return Ok(());
            }
            Err(e) if e.raw_os_error() == Some(Errno::ENOENT as i32) => {
                self.summary.changed_while_reading += 1;
                return Ok(());
            }
            Err(e) => return Err(WorkspaceError::io("open", child, e)),
        };
        let (file, st) = opened;
        // The size admitted: a file grown since its `lstat` is cut there
        // (as one growing while it is read is), so the bound holds.
        let size = u64::try_from(st.st_size).unwrap_or(0).min(listed);
        let mut entry = Entry::new(TarType::Regular, child.as_bytes(), &st);
        entry.size = size;
        let mut reader = ExactReader {
            file: file.take(size),
            left: size,
            padded: false,
        };
        self.append(entry, &mut reader, child)?;
        if reader.padded {
            self.summary.changed_while_reading += 1;
        }
        if st.st_nlink > 1 {
            self.keep_first_name(ino, child, st.st_nlink)?;
        }
        self.summary.files += 1;
        self.summary.bytes += size;
        Ok(())
    }

    /// Keeps `child` as the name the other `links - 1` names link to.
    fn keep_first_name(
        &mut self,
        ino: u64,
        child: &WorkspacePath,
        links: impl Into<u64>,
    ) -> Result<(), WorkspaceError> {
        self.seen
            .insert(ino, child.as_bytes(), links, &mut self.budget)
            .map_err(|_| self.over_budget(child))
    }

    /// Writes `entry`'s PAX records (when it needs any), its header and
    /// its data.
    fn append(
        &mut self,
        entry: Entry<'_>,
        data: impl Read,
        child: &WorkspacePath,
    ) -> Result<(), WorkspaceError> {
        if self.dry {
            return Ok(());
        }
        let fail = |e| WorkspaceError::io("write the archive entry of", child, e);
        let (header, records) = entry.header();
        if !records.is_empty() {
            let mut pax = Header::new_ustar();
            pax.set_entry_type(TarType::XHeader);
            let base = child
                .as_bytes()
                .rsplit(|b| *b == b'/')
                .next()
                .unwrap_or(b"");
            let mut name = b"PaxHeaders/".to_vec();
            name.extend_from_slice(&base[..base.len().min(80)]);
            set_name_field(&mut pax, &name);
            pax.set_mode(0o644);
            pax.set_size(u64::try_from(records.len()).unwrap_or(u64::MAX));
            pax.set_mtime(header.mtime().unwrap_or(0));
            pax.set_cksum();
            self.builder.append(&pax, &records[..]).map_err(fail)?;
        }
        self.builder.append(&header, data).map_err(fail)
    }
}

/// What one archive entry is made of.
struct Entry<'a> {
    kind: TarType,
    path: &'a [u8],
    link: Option<&'a [u8]>,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
}

impl<'a> Entry<'a> {
    fn new(kind: TarType, path: &'a [u8], st: &FileStat) -> Self {
        Self {
            kind,
            path,
            link: None,
            size: 0,
            mode: st.st_mode & 0o777,
            uid: st.st_uid,
            gid: st.st_gid,
            mtime: (st.st_mtime, st.st_mtime_nsec),
        }
    }

    /// Bytes this entry takes in the archive: its extension header and
    /// records (padded), its header, and its content (padded).
    fn archive_bytes(&self) -> u64 {
        let padded = |n: u64| n.div_ceil(BLOCK).saturating_mul(BLOCK);
        let (_, records) = self.header();
        let records = u64::try_from(records.len()).unwrap_or(u64::MAX);
        let pax = if records == 0 {
            0
        } else {
            BLOCK + padded(records)
        };
        pax + BLOCK + padded(self.size)
    }

    /// The ustar header and the PAX records for what it cannot hold: a
    /// long path or link target, a sub-second or out-of-range time, a size
    /// of 8 GiB or more.
    fn header(&self) -> (Header, Vec<u8>) {
        let mut h = Header::new_ustar();
        let mut records = Vec::new();
        h.set_entry_type(self.kind);
        if !set_ustar_path(&mut h, self.path) {
            records.extend(pax_record("path", self.path));
            set_name_field(&mut h, &self.path[..self.path.len().min(100)]);
        }
        if let Some(link) = self.link {
            if link.len() > 100 || h.set_link_name_literal(link).is_err() {
                records.extend(pax_record("linkpath", link));
                let _ = h.set_link_name_literal(&link[..link.len().min(100)]);
            }
        }
        let (secs, nanos) = self.mtime;
        h.set_mtime(u64::try_from(secs.clamp(0, USTAR_MAX_TIME)).unwrap_or(0));
        if nanos != 0 || !(0..=USTAR_MAX_TIME).contains(&secs) {
            records.extend(pax_record("mtime", pax_time(secs, nanos).as_bytes()));
        }
        h.set_size(self.size);
        if self.size > USTAR_MAX_SIZE {
            records.extend(pax_record("size", self.size.to_string().as_bytes()));
        }
        h.set_mode(self.mode);
        h.set_uid(u64::from(self.uid));
        h.set_gid(u64::from(self.gid));
        h.set_cksum();
        (h, records)
    }
}

/// Puts `path` in the ustar name and prefix fields; `false` when it does
/// not fit (then a PAX `path` record carries it).
fn set_ustar_path(h: &mut Header, path: &[u8]) -> bool {
    let Some(ustar) = h.as_ustar_mut() else {
        return false;
    };
    if path.len() <= 100 {
        ustar.name = [0; 100];
        ustar.name[..path.len()].copy_from_slice(path);
        return true;
    }
    // Split at a `/` so that the prefix has at most 155 bytes and the
    // name at most 100 (and neither is empty).
    let split = path
        .iter()
        .enumerate()
        .filter(|(i, b)| **b == b'/' && *i <= 155 && path.len() - i - 1 <= 100 && *i > 0)
        .map(|(i, _)| i)
        .next_back();
    let Some(i) = split else {
        return false;
    };
    if i + 1 == path.len() {
        return false;
    }
    ustar.prefix = [0; 155];
    ustar.prefix[..i].copy_from_slice(&path[..i]);
    ustar.name = [0; 100];
    ustar.name[..path.len() - i - 1].copy_from_slice(&path[i + 1..]);
    true
}

fn set_name_field(h: &mut Header, name: &[u8]) {
    let old = h.as_old_mut();
    old.name = [0; 100];
    let n = name.len().min(100);
    old.name[..n].copy_from_slice(&name[..n]);
}

/// A PAX time: seconds, and a fraction without trailing zeros.
fn pax_time(secs: i64, nanos: i64) -> String {
    if nanos == 0 {
        return secs.to_string();
    }
    // A negative time with a fraction: -1.25 is 1.25 s before the epoch.
    let (sign, whole, frac) = if secs < 0 {
        ("-", -(secs + 1), 1_000_000_000 - nanos)
    } else {
        ("", secs, nanos)
    };
    let frac = format!("{frac:09}");
    format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
}

/// One PAX record, `"<len> <key>=<value>\n"`, its length counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while body + len.to_string().len() != len {
        len = body + len.to_string().len();
    }
    let mut out = format!("{len} {key}=").into_bytes();
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_and_times_are_spelled_as_posix_says() {
        assert_eq!(pax_record("path", b"ab"), b"11 path=ab\n".to_vec());
        let long = vec![b'x'; 95];
        let rec = pax_record("path", &long);
        assert_eq!(rec.len().to_string(), String::from_utf8_lossy(&rec[..3]));
        assert_eq!(pax_time(5, 0), "5");
        assert_eq!(pax_time(1_700_000_000, 123_000_000), "1700000000.123");
        assert_eq!(pax_time(-2, 750_000_000), "-1.25");
    }

    #[test]
    fn long_paths_split_into_prefix_and_name_or_need_a_record() {
        let mut h = Header::new_ustar();
        let path = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        assert!(set_ustar_path(&mut h, path.as_bytes()));
        assert_eq!(h.path_bytes().as_ref(), path.as_bytes());
        let too_long = format!("{}/{}", "d".repeat(120), "f".repeat(150));
        assert!(!set_ustar_path(&mut h, too_long.as_bytes()));
    }
}
