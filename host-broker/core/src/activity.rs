//! Every desktop's activity record: a ring of its last [`RING`] entries in
//! memory, kept across broker restarts in the computer's directory
//! (`activity.jsonl`, one entry a line, appended as entries arrive and
//! compacted to the ring when it holds twice as many lines; a torn last
//! line is skipped), and each new entry pushed on `/v1/events`.
//!
//! Recording never touches the disk on the caller's task: [`ActivityLog::record`]
//! takes a short lock, hands the line to one writer task (which does its
//! file work on the blocking pool, in order) and broadcasts the entry, so
//! the owner records without waiting on a disk. A writer that falls
//! [`QUEUE`] lines behind drops the file's copy of the newest ones, never
//! the memory's or the event.
//!
//! Sequence numbers never repeat, across restarts too: `activity.seq`
//! holds a number no entry has reached yet, written ahead (a block at a
//! time, by the writer before the lines it covers) and at every start-up
//! before anything is recorded; a start-up goes on from there.
//!
//! It records what it is told, by whom; it never decides what is worth
//! recording (the owner and the relay of guest calls do, on each
//! operation's outcome).

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{SubsecRound as _, Utc};
use dormouse_protocol::activity::argv::ArgvRecord;
use dormouse_protocol::activity::{ActivityEntry, Actor, Happened, MAX_ACTIVITY_LIMIT};
use dormouse_protocol::api::BrokerEvent;
use tokio::sync::{broadcast, mpsc, oneshot};
use uuid::Uuid;

use crate::paths::Paths;
use crate::store::{write_atomic, Lease};

/// Entries kept per desktop.
pub const RING: usize = MAX_ACTIVITY_LIMIT;
/// Lines the writer may fall behind before it drops the file's copy.
pub const QUEUE: usize = 4096;
/// Largest tail of a file read back at start-up.
const MAX_READ: u64 = 4 << 20;
/// Sequence numbers reserved on disk at a time.
const SEQ_BLOCK: u64 = 1024;

/// Who made a call that carried `fence`: the lease's holder when it
/// carried the generation that holder holds, else the token's caller.
pub fn actor_of(lease: Option<&Lease>, fence: Option<u64>) -> Actor {
    match (lease, fence) {
        (Some(lease), Some(given)) if lease.generation == given => {
            Actor::Lease(lease.holder.clone())
        }
        _ => Actor::Api,
    }
}

/// One desktop's ring.
#[derive(Debug)]
struct Ring {
    entries: VecDeque<ActivityEntry>,
    next_seq: u64,
    /// The first number the disk does not yet promise is unused.
    reserved: u64,
}

/// What the writer is asked to do, in order.
#[derive(Debug)]
enum Write {
    /// Promise on disk that no entry reached `upto` yet.
    Reserve { id: Uuid, upto: u64 },
    /// One encoded entry.
    Append { id: Uuid, line: Vec<u8> },
    /// The desktop is gone: its files go too.
    Delete { id: Uuid },
    /// Answer once everything before is on disk.
    Flush(oneshot::Sender<()>),
}

#[derive(Debug)]
struct Shared {
    rings: Mutex<HashMap<Uuid, Ring>>,
    ring_len: usize,
    /// What an entry keeps of a command line (`--activity-argv`).
    argv: ArgvRecord,
    writes: Option<mpsc::Sender<Write>>,
    events: broadcast::Sender<BrokerEvent>,
}

/// Every desktop's activity record. Cheap to clone (one shared state).
#[derive(Debug, Clone)]
pub struct ActivityLog {
    shared: Arc<Shared>,
}

impl ActivityLog {
    /// A record kept only in memory (handles built by tests), pushing on
    /// `events`.
    pub fn in_memory(events: broadcast::Sender<BrokerEvent>) -> Self {
        Self {
            shared: Arc::new(Shared {
                rings: Mutex::new(HashMap::new()),
                ring_len: RING,
                argv: ArgvRecord::default(),
                writes: None,
                events,
            }),
        }
    }

    /// The records of computers `ids` under `paths`, read back from their
    /// files (at start-up, before anything is recorded), with the writer
    /// task started. Needs a Tokio runtime.
    pub fn open(
        paths: &Paths,
        ids: impl IntoIterator<Item = Uuid>,
        events: broadcast::Sender<BrokerEvent>,
    ) -> Self {
        Self::open_with(paths, ids, events, RING, ArgvRecord::default())
    }

    /// [`ActivityLog::open`] with a ring of `ring_len` (tests use small ones).
    pub fn open_with_ring(
        paths: &Paths,
        ids: impl IntoIterator<Item = Uuid>,
        events: broadcast::Sender<BrokerEvent>,
        ring_len: usize,
    ) -> Self {
        Self::open_with(paths, ids, events, ring_len, ArgvRecord::default())
    }

    /// [`ActivityLog::open`] with a ring of `ring_len`, keeping of each
    /// command line what `argv` says (entries read back are kept so too).
    pub fn open_with(
        paths: &Paths,
        ids: impl IntoIterator<Item = Uuid>,
        events: broadcast::Sender<BrokerEvent>,
        ring_len: usize,
        argv: ArgvRecord,
    ) -> Self {
        let ring_len = ring_len.max(1);
        let mut rings = HashMap::new();
        let mut files = HashMap::new();
        for id in ids {
            let (ring, file) = read_back(paths, id, ring_len, argv);
            rings.insert(id, ring);
            files.insert(id, file);
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer = Writer {
            paths: paths.clone(),
            ring_len,
            files,
        };
        tokio::spawn(write_loop(rx, writer));
        Self {
            shared: Arc::new(Shared {
                rings: Mutex::new(rings),
                ring_len,
                argv,
                writes: Some(tx),
                events,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Ring>> {
        // Whole entries are pushed under the lock: a panic leaves a ring
        // that is still consistent.
        self.shared
            .rings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Hands `write` to the writer without waiting; `false` when it is too
    /// far behind (or gone).
    fn send(&self, write: Write) -> bool {
        match &self.shared.writes {
            Some(tx) => tx.try_send(write).is_ok(),
            None => true,
        }
    }

    /// Starts an empty record for a new computer.
    pub fn add(&self, id: Uuid) {
        self.lock().entry(id).or_insert(Ring {
            entries: VecDeque::new(),
            next_seq: 1,
            reserved: 1,
        });
    }

    /// Records `what`, done by `actor`, for computer `id`, and pushes it
    /// on the event stream; `None` when the computer has no record (it
    /// was removed meanwhile).
    pub fn record(&self, id: Uuid, actor: Actor, what: &Happened) -> Option<ActivityEntry> {
        let mut rings = self.lock();
        let ring = rings.get_mut(&id)?;
        let seq = ring.next_seq;
        if seq.saturating_add(SEQ_BLOCK / 2) >= ring.reserved {
            let upto = seq.max(ring.reserved).saturating_add(SEQ_BLOCK);
            if self.send(Write::Reserve { id, upto }) {
                ring.reserved = upto;
            }
        }
        ring.next_seq = seq.saturating_add(1);
        let what = what.kept(self.shared.argv);
        let entry = ActivityEntry {
            seq,
            // Kept as the wire has it, so a record read back equals it.
            at: Utc::now().trunc_subsecs(3),
            actor,
            kind: what.kind(),
            summary: what.summary(),
            detail: what.detail(),
        };
        ring.entries.push_back(entry.clone());
        while ring.entries.len() > self.shared.ring_len {
            ring.entries.pop_front();
        }
        match serde_json::to_vec(&entry) {
            Ok(line) => {
                if !self.send(Write::Append { id, line }) {
                    tracing::warn!(computer = %id, seq, "activity writer behind; entry kept in memory only");
                }
            }
            Err(e) => tracing::warn!(computer = %id, error = %e, "cannot encode an activity entry"),
        }
        // Sent under the lock, so the stream carries a desktop's entries in
        // the order of their numbers.
        let _ = self.shared.events.send(BrokerEvent::Activity {
            id,
            entry: Box::new(entry.clone()),
        });
        Some(entry)
    }

    /// The last `limit` entries of computer `id`, newest first; `None`
    /// when it has no record.
    pub fn recent(&self, id: Uuid, limit: usize) -> Option<Vec<ActivityEntry>> {
        let limit = limit.clamp(1, MAX_ACTIVITY_LIMIT);
        let rings = self.lock();
        let ring = rings.get(&id)?;
        Some(ring.entries.iter().rev().take(limit).cloned().collect())
    }

    /// Forgets computer `id` (it was removed); its files go after every
    /// line already queued.
    pub fn remove(&self, id: Uuid) {
        self.lock().remove(&id);
        if let Some(tx) = &self.shared.writes {
            if let Err(mpsc::error::TrySendError::Full(write)) = tx.try_send(Write::Delete { id }) {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(write).await;
                });
            }
        }
    }

    /// Waits until everything recorded so far is on disk (tests; a clean
    /// shut-down).
    pub async fn flush(&self) {
        if let Some(tx) = &self.shared.writes {
            let (done, wait) = oneshot::channel();
            if tx.send(Write::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        }
    }
}

/// What the writer keeps of one file.
#[derive(Debug, Default)]
struct FileState {
    /// The last ring's lines, to compact from.
    tail: VecDeque<Vec<u8>>,
    /// Lines in the file.
    lines: usize,
    /// Open for appending.
    file: Option<File>,
    /// Written since the last sync.
    dirty: bool,
}

/// Reads one computer's file back: its ring, and the writer's view of the
/// file. A torn or oversized file is compacted at once, and the next
/// numbers are reserved on disk, before anything is recorded.
///
/// An entry recorded under another `--activity-argv` (or before there was
/// one) is kept as `argv` says, and the file rewritten without what it
/// no longer keeps.
fn read_back(paths: &Paths, id: Uuid, ring_len: usize, argv: ArgvRecord) -> (Ring, FileState) {
    let path = paths.activity(id);
    let mut entries = VecDeque::new();
    let mut state = FileState::default();
    let mut last_seq = 0;
    let mut compact = false;
    if let Ok(mut f) = File::open(&path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len > MAX_READ {
            compact = true;
            if f.seek(SeekFrom::Start(len - MAX_READ)).is_err() {
                tracing::warn!(computer = %id, "cannot read the activity record back");
            }
        }
        let mut bytes = Vec::new();
        if let Err(e) = f.take(MAX_READ).read_to_end(&mut bytes) {
            tracing::warn!(computer = %id, error = %e, "cannot read the activity record back");
        }
        compact |= !bytes.is_empty() && bytes.last() != Some(&b'\n');
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            state.lines += 1;
            let Ok(mut entry) = serde_json::from_slice::<ActivityEntry>(line) else {
                continue;
            };
            last_seq = last_seq.max(entry.seq);
            let mut line = line.to_vec();
            if let Some(kept) = entry.kept(argv) {
                match serde_json::to_vec(&kept) {
                    Ok(again) => {
                        entry = kept;
                        line = again;
                        compact = true;
                    }
                    Err(e) => {
                        tracing::warn!(computer = %id, error = %e, "cannot encode an activity entry");
                        continue;
                    }
                }
            }
            entries.push_back(entry);
            state.tail.push_back(line);
            if entries.len() > ring_len {
                entries.pop_front();
                state.tail.pop_front();
            }
        }
    }
    compact |= state.lines >= ring_len * 2;
    if compact {
        if let Err(e) = write_atomic(&path, &joined(&state.tail)) {
            tracing::warn!(computer = %id, error = %e, "cannot compact the activity record");
        }
        state.lines = state.tail.len();
    }
    let promised = std::fs::read_to_string(paths.activity_seq(id))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let next_seq = promised.max(last_seq.saturating_add(1)).max(1);
    let reserved = match write_atomic(
        &paths.activity_seq(id),
        next_seq.saturating_add(SEQ_BLOCK).to_string().as_bytes(),
    ) {
        Ok(()) => next_seq.saturating_add(SEQ_BLOCK),
        Err(e) => {
            tracing::debug!(computer = %id, error = %e, "cannot reserve activity numbers");
            next_seq
        }
    };
    let ring = Ring {
        entries,
        next_seq,
        reserved,
    };
    (ring, state)
}

fn joined(lines: &VecDeque<Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for line in lines {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out
}

/// The one writer: every computer's files, in the order they were asked for.
#[derive(Debug)]
struct Writer {
    paths: Paths,
    ring_len: usize,
    files: HashMap<Uuid, FileState>,
}

async fn write_loop(mut rx: mpsc::Receiver<Write>, mut writer: Writer) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        let writes = std::mem::take(&mut batch);
        let mut w = writer;
        writer = match tokio::task::spawn_blocking(move || {
            w.apply(writes);
            w
        })
        .await
        {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "the activity writer failed; entries stay in memory");
                return;
            }
        };
    }
}

impl Writer {
    fn apply(&mut self, writes: Vec<Write>) {
        let mut flushed = Vec::new();
        for write in writes {
            match write {
                Write::Reserve { id, upto } => {
                    if let Err(e) =
                        write_atomic(&self.paths.activity_seq(id), upto.to_string().as_bytes())
                    {
                        tracing::debug!(computer = %id, error = %e, "cannot reserve activity numbers");
                    }
                }
                Write::Append { id, line } => {
                    if let Err(e) = self.append(id, line) {
                        tracing::warn!(computer = %id, error = %e, "cannot write the activity record");
                    }
                }
                Write::Delete { id } => {
                    self.files.remove(&id);
                    for path in [self.paths.activity(id), self.paths.activity_seq(id)] {
                        if let Err(e) = crate::store::remove_file(&path) {
                            tracing::warn!(computer = %id, error = %e, "cannot remove the activity record");
                        }
                    }
                }
                Write::Flush(done) => {
                    self.sync();
                    flushed.push(done);
                }
            }
        }
        self.sync();
        for done in flushed {
            let _ = done.send(());
        }
    }

    fn append(&mut self, id: Uuid, line: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
        let ring_len = self.ring_len;
        let path = self.paths.activity(id);
        let state = self.files.entry(id).or_default();
        state.tail.push_back(line.clone());
        while state.tail.len() > ring_len {
            state.tail.pop_front();
        }
        if state.lines + 1 >= ring_len * 2 {
            state.file = None;
            state.dirty = false;
            write_atomic(&path, &joined(&state.tail))?;
            state.lines = state.tail.len();
            return Ok(());
        }
        let file = match &mut state.file {
            Some(file) => file,
            None => state.file.insert(
                OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .open(&path)?,
            ),
        };
        let mut bytes = line;
        bytes.push(b'\n');
        file.write_all(&bytes)?;
        state.lines += 1;
        state.dirty = true;
        Ok(())
    }

    fn sync(&mut self) {
        for (id, state) in &mut self.files {
            if !state.dirty {
                continue;
            }
            state.dirty = false;
            if let Some(file) = &state.file {
                if let Err(e) = file.sync_data() {
                    tracing::warn!(computer = %id, error = %e, "cannot sync the activity record");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
