//! What one import or export may spend on the way: the memory of its
//! per-entry bookkeeping ([`Budget`], [`ImportLimits::memory_budget`]), and,
//! for an import, every decompressed byte and the wall-clock time of the
//! whole import ([`Metered`]).
//!
//! The bookkeeping kept here is the only memory that grows with the number
//! of entries: an import's directory times ([`DirTimes`], front-coded in
//! fixed chunks), an export's first names of multiply-linked files
//! ([`FirstNames`], dropped once every name was met) and its directory
//! listings. Everything is charged before (or as) it is allocated, so past
//! the budget the archive is refused and the memory never taken.
//!
//! Nothing here touches the disk; nothing here may keep a path without
//! charging it.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, Read};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::headers::Mtime;
use super::{ImportLimits, Refusal};

/// What the memory budget charges for one name of a directory listing
/// besides its bytes: its `OsString`, the allocator's header and rounding.
pub(crate) const ITEM_OVERHEAD: u64 = 48;

/// Size of one chunk of a [`DirTimes`]: the unit it is charged in.
const CHUNK: usize = 1 << 20;

/// Bytes of a [`DirTimes`] record before its suffix: prefix length,
/// suffix length, seconds, nanoseconds.
const RECORD_HEAD: usize = 2 + 2 + 8 + 4;

/// The bookkeeping would take more memory than the budget allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the archive's bookkeeping needs more than {0} bytes of memory (the archive memory budget)"
)]
pub(crate) struct OverBudget(pub(crate) u64);

/// Bytes charged against a limit.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    used: u64,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Self {
        Self { limit, used: 0 }
    }

    /// Charges `bytes`, or refuses (charging nothing) when they do not fit.
    pub(crate) fn charge(&mut self, bytes: u64) -> Result<(), OverBudget> {
        match self.used.checked_add(bytes) {
            Some(total) if total <= self.limit => {
                self.used = total;
                Ok(())
            }
            _ => Err(OverBudget(self.limit)),
        }
    }

    /// Gives back what an earlier [`Budget::charge`] took.
    pub(crate) fn release(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }

    /// What is left.
    pub(crate) fn left(&self) -> u64 {
        self.limit - self.used.min(self.limit)
    }

    /// The limit.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}

fn len64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Directory times an import sets last, in the order met: each path stored
/// as the bytes it does not share with the one before (archives list a
/// tree in walk order, so a directory costs about its own name), in chunks
/// of [`CHUNK`] bytes charged as they are allocated.
#[derive(Debug, Default)]
pub(crate) struct DirTimes {
    chunks: Vec<Vec<u8>>,
    /// The path pushed last, whole.
    last: Vec<u8>,
    /// Where its record starts in the last chunk.
    last_at: usize,
}

impl DirTimes {
    /// Appends `path` with `mtime`; the same path again right after only
    /// changes its time (its last time wins).
    pub(crate) fn push(
        &mut self,
        path: &[u8],
        mtime: Mtime,
        budget: &mut Budget,
    ) -> Result<(), OverBudget> {
        if self.last == path {
            if let Some(chunk) = self.chunks.last_mut() {
                let at = self.last_at;
                write_time(&mut chunk[at + 4..at + RECORD_HEAD], mtime);
                return Ok(());
            }
        }
        let shared = self
            .last
            .iter()
            .zip(path)
            .take_while(|(a, b)| a == b)
            .count();
        let suffix = &path[shared..];
        let (Ok(prefix16), Ok(suffix16)) = (u16::try_from(shared), u16::try_from(suffix.len()))
        else {
            // Paths are at most 4096 bytes: this cannot happen.
            return Err(OverBudget(budget.limit()));
        };
        let need = RECORD_HEAD + suffix.len();
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| c.capacity() - c.len() >= need);
        if !fits {
            budget.charge(len64(CHUNK))?;
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let Some(chunk) = self.chunks.last_mut() else {
            return Err(OverBudget(budget.limit()));
        };
        self.last_at = chunk.len();
        chunk.extend_from_slice(&prefix16.to_le_bytes());
        chunk.extend_from_slice(&suffix16.to_le_bytes());
        let mut time = [0u8; RECORD_HEAD - 4];
        write_time(&mut time, mtime);
        chunk.extend_from_slice(&time);
        chunk.extend_from_slice(suffix);
        self.last.truncate(shared);
        self.last.extend_from_slice(suffix);
        Ok(())
    }

    /// Every path with its time, in the order pushed.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&[u8], Mtime)) {
        let mut path = Vec::new();
        for chunk in &self.chunks {
            let mut at = 0;
            while at + RECORD_HEAD <= chunk.len() {
                let prefix = usize::from(u16::from_le_bytes([chunk[at], chunk[at + 1]]));
                let suffix = usize::from(u16::from_le_bytes([chunk[at + 2], chunk[at + 3]]));
                let mtime = read_time(&chunk[at + 4..at + RECORD_HEAD]);
                let start = at + RECORD_HEAD;
                path.truncate(prefix);
                path.extend_from_slice(&chunk[start..start + suffix]);
                f(&path, mtime);
                at = start + suffix;
            }
        }
    }
}

fn write_time(out: &mut [u8], mtime: Mtime) {
    out[..8].copy_from_slice(&mtime.secs.to_le_bytes());
    let nanos = u32::try_from(mtime.nanos).unwrap_or(0);
    out[8..12].copy_from_slice(&nanos.to_le_bytes());
}

fn read_time(data: &[u8]) -> Mtime {
    let mut secs = [0u8; 8];
    secs.copy_from_slice(&data[..8]);
    let mut nanos = [0u8; 4];
    nanos.copy_from_slice(&data[8..12]);
    Mtime {
        secs: i64::from_le_bytes(secs),
        nanos: i64::from(u32::from_le_bytes(nanos)),
    }
}

/// An export's files with more than one name, by inode (the export never
/// leaves the workspace's filesystem, so the inode alone names one): the
/// name written first, and how many names are still to come. An entry is
/// dropped (and its name's bytes given back) when its last name was met.
/// The hash table is charged by its capacity, old and new table together
/// while it grows.
#[derive(Debug, Default)]
pub(crate) struct FirstNames {
    names: HashMap<u64, (Box<[u8]>, u32)>,
    /// What the table is charged for now.
    table: u64,
}

impl FirstNames {
    /// What one kept name costs on the heap: its bytes rounded up to the
    /// allocator's 16, and the allocator's header.
    fn cost(path: &[u8]) -> u64 {
        len64(path.len()).div_ceil(16) * 16 + 16
    }

    /// What a table of `capacity` entries takes: buckets of an entry and a
    /// control byte each, at most 7/8 of them used.
    fn table_bytes(capacity: usize) -> u64 {
        let entry = std::mem::size_of::<(u64, (Box<[u8]>, u32))>() + 1;
        let buckets = (capacity.saturating_mul(8) / 7).max(1).next_power_of_two();
        len64(buckets.saturating_mul(entry))
    }

    /// Keeps `path` as the first of the `links` names of inode `ino`.
    pub(crate) fn insert(
        &mut self,
        ino: u64,
        path: &[u8],
        links: impl Into<u64>,
        budget: &mut Budget,
    ) -> Result<(), OverBudget> {
        if self.names.len() == self.names.capacity() {
            // Grown by hand, so the new table is charged before it exists
            // (the old one is freed only once the new one is filled).
            let want = self.names.capacity().saturating_mul(2).max(1024);
            let next = Self::table_bytes(want);
            budget.charge(next)?;
            self.names.reserve(want - self.names.len());
            budget.release(self.table);
            self.table = next;
        }
        budget.charge(Self::cost(path))?;
        let left = u32::try_from(links.into().saturating_sub(1)).unwrap_or(u32::MAX);
        if let Some((old, _)) = self.names.insert(ino, (path.into(), left)) {
            budget.release(Self::cost(&old));
        }
        Ok(())
    }

    /// The first name of `ino`, if one was kept.
    pub(crate) fn first(&self, ino: u64) -> Option<&[u8]> {
        self.names.get(&ino).map(|(path, _)| &path[..])
    }

    /// Counts one more name of `ino` as met; after its last the entry is
    /// dropped and its name's bytes given back.
    pub(crate) fn met(&mut self, ino: u64, budget: &mut Budget) {
        let Some((_, left)) = self.names.get_mut(&ino) else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left == 0 {
            if let Some((path, _)) = self.names.remove(&ino) {
                budget.release(Self::cost(&path));
            }
        }
    }
}

/// Why a [`Metered`] read failed: the refusal it carries.
#[derive(Debug)]
pub(crate) struct Exceeded(pub(crate) Refusal);

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Exceeded {}

/// The decompressed stream as the tar reader sees it: every byte counted
/// (headers, extension records, padding, what follows the end marker),
/// and every read refused past [`ImportLimits::max_total_bytes`] or past
/// the import's deadline ([`ImportLimits::max_duration`], counted from its
/// start, never restarted).
pub(crate) struct Metered<R> {
    inner: R,
    read: Rc<Cell<u64>>,
    max: u64,
    deadline: Option<Instant>,
    duration: Duration,
}

impl<R: Read> Metered<R> {
    pub(crate) fn new(inner: R, limits: &ImportLimits, started: Instant) -> Self {
        Self {
            inner,
            read: Rc::new(Cell::new(0)),
            max: limits.max_total_bytes,
            deadline: started.checked_add(limits.max_duration),
            duration: limits.max_duration,
        }
    }

    /// The count of bytes read so far, shared.
    pub(crate) fn counter(&self) -> Rc<Cell<u64>> {
        self.read.clone()
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.deadline.is_some_and(|d| Instant::now() > d) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                Exceeded(Refusal::TooSlow(self.duration)),
            ));
        }
        let n = self.inner.read(buf)?;
        let total = self.read.get().saturating_add(len64(n));
        self.read.set(total);
        if total > self.max {
            return Err(io::Error::other(Exceeded(Refusal::TooLarge(self.max))));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64, nanos: i64) -> Mtime {
        Mtime { secs, nanos }
    }

    #[test]
    fn dir_times_keep_every_path_and_its_last_time() {
        let mut budget = Budget::new(64 << 20);
        let mut times = DirTimes::default();
        for (p, s) in [
            ("a", 1),
            ("a/b", 2),
            ("a/b", 3),
            ("a/c", 4),
            ("d", 5),
            ("a", 6),
        ] {
            times.push(p.as_bytes(), t(s, 7), &mut budget).unwrap();
        }
        let mut seen = Vec::new();
        times.for_each(|p, m| seen.push((String::from_utf8_lossy(p).into_owned(), m.secs)));
        let want: Vec<_> = [("a", 1), ("a/b", 3), ("a/c", 4), ("d", 5), ("a", 6)]
            .iter()
            .map(|(p, s)| ((*p).to_owned(), *s))
            .collect();
        assert_eq!(seen, want);
        assert_eq!(budget.left(), (64 << 20) - (1 << 20));
    }

    #[test]
    fn dir_times_past_the_budget_are_refused() {
        let mut budget = Budget::new(2 << 20);
        let mut times = DirTimes::default();
        let long = |i: u32| format!("{i:04}/{}", "x".repeat(4000));
        let mut pushed = 0u32;
        let err = loop {
            match times.push(long(pushed).as_bytes(), t(0, 0), &mut budget) {
                Ok(()) => pushed += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(err, OverBudget(2 << 20));
        // Two chunks of about 255 paths of 4 KiB each.
        assert!((400..600).contains(&pushed), "{pushed}");
    }

    #[test]
    fn first_names_are_given_back_when_every_name_was_met() {
        let mut budget = Budget::new(1 << 20);
        let mut names = FirstNames::default();
        names.insert(7, b"a/one", 3u64, &mut budget).unwrap();
        let table = FirstNames::table_bytes(1024);
        assert_eq!(budget.left(), (1 << 20) - table - 32);
        assert_eq!(names.first(7), Some(&b"a/one"[..]));
        names.met(7, &mut budget);
        assert_eq!(budget.left(), (1 << 20) - table - 32);
        names.met(7, &mut budget);
        assert_eq!(budget.left(), (1 << 20) - table);
        assert_eq!(names.first(7), None);
        let big = vec![b'x'; 1 << 20];
        assert_eq!(
            names.insert(8, &big, 2u64, &mut budget),
            Err(OverBudget(1 << 20))
        );
    }

    #[test]
    fn metered_counts_every_byte_and_stops_past_the_limit() {
        let limits = ImportLimits {
            max_total_bytes: 10,
            ..ImportLimits::default()
        };
        let mut m = Metered::new(&[1u8; 12][..], &limits, Instant::now());
        let counter = m.counter();
        let mut buf = [0u8; 8];
        assert_eq!(m.read(&mut buf).unwrap(), 8);
        let err = m.read(&mut buf).unwrap_err();
        let inner = err.get_ref().and_then(|e| e.downcast_ref::<Exceeded>());
        assert!(matches!(inner, Some(Exceeded(Refusal::TooLarge(10)))));
        assert_eq!(counter.get(), 12);
        let late = ImportLimits {
            max_duration: Duration::ZERO,
            ..ImportLimits::default()
        };
        let started = Instant::now() - Duration::from_millis(5);
        let mut m = Metered::new(&[1u8; 12][..], &late, started);
        let err = m.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
