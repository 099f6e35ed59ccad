//! The audit of one desktop's connections: a ring of the last
//! [`RING`] entries in memory, kept across broker restarts in one file per
//! desktop (`<dir>/<id>.jsonl`, one JSON entry per line), appended to as
//! entries arrive and compacted (rewritten to the ring, through a temporary
//! file and a rename) when it holds twice the ring.
//!
//! Memory and disk stay bounded whatever a guest does: the ring drops its
//! oldest entry, the file is compacted, and a file larger than the bound
//! is read from its tail only. A line that does not parse (a torn last
//! write) is skipped.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dormouse_protocol::egress_policy::{EgressLogEntry, EgressLogPage, LogSince};
use uuid::Uuid;

/// Entries kept per desktop.
pub const RING: usize = 10_000;
/// Most entries in one page of the log.
pub const PAGE: usize = 1000;
/// Largest file read back at start (its tail).
const MAX_READ: u64 = 32 << 20;

/// The audit file cannot be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The file system failed.
    #[error("egress audit file: {0}")]
    Io(#[from] std::io::Error),
    /// An entry cannot be encoded.
    #[error("egress audit entry: {0}")]
    Encode(#[from] serde_json::Error),
}

#[derive(Debug)]
struct Inner {
    ring: VecDeque<EgressLogEntry>,
    next_seq: u64,
    file: Option<File>,
    lines: usize,
}

/// One desktop's audit log.
#[derive(Debug)]
pub struct AuditLog {
    computer: Uuid,
    path: Option<PathBuf>,
    ring_len: usize,
    inner: Mutex<Inner>,
}

impl AuditLog {
    /// A log kept only in memory (for tests, or when the data dir is unusable).
    pub fn in_memory(computer: Uuid) -> Self {
        Self {
            computer,
            path: None,
            ring_len: RING,
            inner: Mutex::new(Inner {
                ring: VecDeque::new(),
                next_seq: 1,
                file: None,
                lines: 0,
            }),
        }
    }

    /// The log of `computer` in `dir`, read back from its file.
    pub fn open(dir: &Path, computer: Uuid) -> Result<Self, AuditError> {
        Self::open_with_ring(dir, computer, RING)
    }

    /// [`AuditLog::open`] with a ring of `ring_len` (tests use small ones).
    pub fn open_with_ring(dir: &Path, computer: Uuid, ring_len: usize) -> Result<Self, AuditError> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{computer}.jsonl"));
        let mut ring = VecDeque::new();
        let mut lines = 0;
        if let Ok(mut f) = File::open(&path) {
            let len = f.metadata()?.len();
            if len > MAX_READ {
                f.seek(SeekFrom::Start(len - MAX_READ))?;
            }
            let reader = BufReader::new(f.take(MAX_READ));
            for line in reader.split(b'\n') {
                let line = line?;
                lines += 1;
                if let Ok(entry) = serde_json::from_slice::<EgressLogEntry>(&line) {
                    ring.push_back(entry);
                    if ring.len() > ring_len {
                        ring.pop_front();
                    }
                }
            }
        }
        let next_seq = ring.back().map_or(1, |e| e.seq + 1);
        let log = Self {
            computer,
            path: Some(path),
            ring_len,
            inner: Mutex::new(Inner {
                ring,
                next_seq,
                file: None,
                lines,
            }),
        };
        {
            let mut inner = log.lock();
            log.compact(&mut inner)?;
        }
        Ok(log)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Rewrites the file to the ring and reopens it for appending.
    fn compact(&self, inner: &mut Inner) -> Result<(), AuditError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let tmp = path.with_extension("jsonl.tmp");
        {
            let mut w = std::io::BufWriter::new(File::create(&tmp)?);
            for e in &inner.ring {
                serde_json::to_writer(&mut w, e)?;
                w.write_all(b"\n")?;
            }
            w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        inner.file = Some(OpenOptions::new().append(true).open(path)?);
        inner.lines = inner.ring.len();
        Ok(())
    }

    /// Records `entry` (its `seq` and `computer` are set here) and returns
    /// it as recorded.
    pub fn record(&self, mut entry: EgressLogEntry) -> EgressLogEntry {
        let mut inner = self.lock();
        entry.seq = inner.next_seq;
        entry.computer = self.computer;
        inner.next_seq += 1;
        inner.ring.push_back(entry.clone());
        if inner.ring.len() > self.ring_len {
            inner.ring.pop_front();
        }
        if let Err(e) = self.append(&mut inner, &entry) {
            tracing::warn!(computer = %self.computer, error = %e, "cannot write the egress audit");
        }
        entry
    }

    fn append(&self, inner: &mut Inner, entry: &EgressLogEntry) -> Result<(), AuditError> {
        if inner.lines >= self.ring_len * 2 {
            self.compact(inner)?;
            return Ok(());
        }
        if let Some(f) = inner.file.as_mut() {
            let mut line = serde_json::to_vec(entry)?;
            line.push(b'\n');
            f.write_all(&line)?;
            inner.lines += 1;
        }
        Ok(())
    }

    /// Entries after `since`, oldest first, at most [`PAGE`] (or `limit`).
    pub fn page(&self, since: Option<LogSince>, limit: Option<usize>) -> EgressLogPage {
        let limit = limit.unwrap_or(PAGE).clamp(1, PAGE);
        let inner = self.lock();
        let mut matching = inner.ring.iter().filter(|e| match since {
            None => true,
            Some(LogSince::Seq(s)) => e.seq > s,
            Some(LogSince::Time(t)) => e.time >= t,
        });
        let entries: Vec<EgressLogEntry> = matching.by_ref().take(limit).cloned().collect();
        let more = matching.next().is_some();
        let next = entries.last().map_or(
            match since {
                Some(LogSince::Seq(s)) => s,
                _ => inner.next_seq - 1,
            },
            |e| e.seq,
        );
        EgressLogPage {
            entries,
            next,
            more,
        }
    }

    /// The last `n` refused entries, newest first (for the panel).
    pub fn last_refused(&self, n: usize) -> Vec<EgressLogEntry> {
        let inner = self.lock();
        inner
            .ring
            .iter()
            .rev()
            .filter(|e| e.decision != dormouse_protocol::egress_policy::EgressDecision::Allowed)
            .take(n)
            .cloned()
            .collect()
    }

    /// Removes the file (the desktop was removed).
    pub fn delete(&self) {
        let mut inner = self.lock();
        inner.file = None;
        inner.ring.clear();
        if let Some(path) = &self.path {
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(computer = %self.computer, error = %e, "cannot remove the egress audit");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dormouse_protocol::egress_policy::{EgressDecision, EgressEnd, EgressKind};

    fn entry(host: &str, decision: EgressDecision) -> EgressLogEntry {
        EgressLogEntry {
            seq: 0,
            time: chrono::Utc::now(),
            computer: Uuid::nil(),
            host: host.into(),
            port: 443,
            kind: EgressKind::Connect,
            address: None,
            decision,
            rule: None,
            reason: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            end: EgressEnd::NotOpened,
        }
    }

    #[test]
    fn the_ring_survives_a_reopen_and_stays_bounded() {
        let dir = tempfile::tempdir().expect("dir");
        let id = Uuid::new_v4();
        {
            let log = AuditLog::open_with_ring(dir.path(), id, 10).expect("open");
            for i in 0..35 {
                let d = if i % 2 == 0 {
                    EgressDecision::Allowed
                } else {
                    EgressDecision::Refused
                };
                log.record(entry(&format!("h{i}.test"), d));
            }
            let lines = std::fs::read_to_string(dir.path().join(format!("{id}.jsonl")))
                .expect("file")
                .lines()
                .count();
            assert!(lines <= 20, "compacted: {lines}");
        }
        let log = AuditLog::open_with_ring(dir.path(), id, 10).expect("reopen");
        let page = log.page(None, None);
        assert_eq!(page.entries.len(), 10);
        assert_eq!(page.entries[0].seq, 26);
        assert_eq!(page.next, 35);
        assert_eq!(page.entries[9].host, "h34.test");
        assert_eq!(page.entries[9].computer, id);
        let e = log.record(entry("after.test", EgressDecision::Refused));
        assert_eq!(e.seq, 36, "seq goes on across restarts");
        let page = log.page(Some(LogSince::Seq(34)), None);
        assert_eq!(
            page.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![35, 36]
        );
        let refused = log.last_refused(2);
        assert_eq!(refused[0].host, "after.test");
        assert_eq!(refused[1].host, "h33.test");
    }

    #[test]
    fn a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().expect("dir");
        let id = Uuid::new_v4();
        {
            let log = AuditLog::open(dir.path(), id).expect("open");
            log.record(entry("a.test", EgressDecision::Allowed));
        }
        let path = dir.path().join(format!("{id}.jsonl"));
        let mut f = OpenOptions::new().append(true).open(&path).expect("append");
        f.write_all(b"{\"seq\":2,\"ti").expect("torn");
        drop(f);
        let log = AuditLog::open(dir.path(), id).expect("reopen");
        assert_eq!(log.page(None, None).entries.len(), 1);
        assert_eq!(log.record(entry("b.test", EgressDecision::Allowed)).seq, 2);
    }

    #[test]
    fn pages_are_bounded_and_say_more() {
        let log = AuditLog::in_memory(Uuid::nil());
        for i in 0..5 {
            log.record(entry(&format!("h{i}"), EgressDecision::Allowed));
        }
        let p = log.page(Some(LogSince::Seq(1)), Some(2));
        assert_eq!(p.entries.len(), 2);
        assert!(p.more);
        assert_eq!(p.next, 3);
        let p = log.page(Some(LogSince::Seq(p.next)), Some(10));
        assert_eq!(p.entries.len(), 2);
        assert!(!p.more);
        let p = log.page(Some(LogSince::Seq(99)), None);
        assert!(p.entries.is_empty());
        assert_eq!(p.next, 99);
    }
}
