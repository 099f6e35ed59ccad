//! Why the broker stopped a computer: `<data>/stops/<sha256 of key>.json`.
//!
//! Every stop the broker makes is written twice: an *intent* before the engine
//! is asked (so a crash mid-stop is finished on the next start-up), then the
//! *confirmation* with the engine's `FinishedAt`, read by inspect after the
//! stop. A reason is only ever shown while the container is stopped and its
//! `FinishedAt` still equals the recorded one, so a later foreign stop, kill
//! or restart falls back to "reason unknown" (or the engine's own `killed` /
//! `oom`) instead of a wrong reason. The key is hashed so the file name says
//! nothing about the computer and cannot be a path.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use dormouse_protocol::api::StopReason;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{ensure_dir, read_json, remove_file, write_json, Paths, StoreError};
use crate::engine::Desktop;

/// Exit status of a process ended by SIGKILL (128 + 9).
const EXIT_SIGKILL: i64 = 137;

/// The record of one stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopRecord {
    /// Why.
    pub reason: StopReason,
    /// When the broker began the stop.
    pub begun_at: DateTime<Utc>,
    /// The engine's `FinishedAt` after the stop; `None` until confirmed.
    pub finished_at: Option<DateTime<Utc>>,
    /// `false` while only the intent is recorded.
    pub confirmed: bool,
}

impl StopRecord {
    /// An intent, written before the engine is asked to stop.
    pub fn intent(reason: StopReason, now: DateTime<Utc>) -> Self {
        Self {
            reason,
            begun_at: now,
            finished_at: None,
            confirmed: false,
        }
    }

    /// The confirmed record for the engine's `FinishedAt`.
    pub fn confirm(&self, finished_at: Option<DateTime<Utc>>) -> Self {
        Self {
            finished_at,
            confirmed: true,
            ..self.clone()
        }
    }
}

/// The reason to show for a container, given the record (if any).
///
/// - running (or otherwise up): none;
/// - a confirmed record whose `FinishedAt` equals the engine's: its reason;
/// - else what the engine itself knows: `oom` when it says OOMKilled,
///   `killed` for exit status 137; otherwise none.
pub fn effective_reason(record: Option<&StopRecord>, info: &Desktop) -> Option<StopReason> {
    if !info.state.is_down() && info.state != crate::engine::RunState::Dead {
        return None;
    }
    if let (Some(record), Some(finished)) = (record, info.finished_at) {
        if record.confirmed && record.finished_at == Some(finished) {
            return Some(record.reason);
        }
    }
    if info.oom_killed {
        Some(StopReason::Oom)
    } else if info.exit_code == Some(EXIT_SIGKILL) && info.finished_at.is_some() {
        Some(StopReason::Killed)
    } else {
        None
    }
}

/// Reads and writes stop records.
#[derive(Debug, Clone)]
pub struct StopReasonStore {
    dir: PathBuf,
}

impl StopReasonStore {
    /// The store under these paths.
    pub fn new(paths: &Paths) -> Self {
        Self { dir: paths.stops() }
    }

    /// The file for a computer key.
    pub fn path(&self, key: &str) -> PathBuf {
        let digest = Sha256::digest(key.as_bytes());
        self.dir.join(format!("{}.json", hex::encode(digest)))
    }

    /// The record for `key`, if any.
    pub fn load(&self, key: &str) -> Result<Option<StopRecord>, StoreError> {
        read_json(&self.path(key))
    }

    /// Persists the record for `key`.
    pub fn save(&self, key: &str, record: &StopRecord) -> Result<(), StoreError> {
        ensure_dir(&self.dir)?;
        write_json(&self.path(key), record)
    }

    /// Forgets the record for `key` (a start clears the reason).
    pub fn clear(&self, key: &str) -> Result<(), StoreError> {
        remove_file(&self.path(key))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use chrono::Duration;

    use super::*;
    use crate::engine::RunState;

    fn store() -> (tempfile::TempDir, StopReasonStore) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = StopReasonStore::new(&Paths::new(tmp.path()));
        (tmp, store)
    }

    #[test]
    fn the_reason_shows_while_finished_at_matches() {
        let (_tmp, store) = store();
        let t = Utc::now();
        let rec = StopRecord::intent(StopReason::Idle, t).confirm(Some(t));
        store.save("k", &rec).expect("save");
        let loaded = store.load("k").expect("load");
        assert_eq!(
            effective_reason(loaded.as_ref(), &Desktop::test_stopped(Some(t), 0)),
            Some(StopReason::Idle)
        );
    }

    #[test]
    fn a_different_key_has_no_reason() {
        let (_tmp, store) = store();
        let t = Utc::now();
        store
            .save(
                "k",
                &StopRecord::intent(StopReason::Idle, t).confirm(Some(t)),
            )
            .expect("save");
        let other = store.load("other").expect("load");
        assert_eq!(other, None);
        assert_eq!(
            effective_reason(other.as_ref(), &Desktop::test_stopped(Some(t), 0)),
            None
        );
    }

    #[test]
    fn a_changed_timestamp_has_no_reason() {
        let t = Utc::now();
        let rec = StopRecord::intent(StopReason::Manual, t).confirm(Some(t));
        let later = Desktop::test_stopped(Some(t + Duration::seconds(5)), 0);
        assert_eq!(effective_reason(Some(&rec), &later), None);
    }

    #[test]
    fn a_running_container_has_no_reason() {
        let t = Utc::now();
        let rec = StopRecord::intent(StopReason::Idle, t).confirm(Some(t));
        let mut running = Desktop::test_stopped(Some(t), 0);
        running.state = RunState::Running;
        assert_eq!(effective_reason(Some(&rec), &running), None);
    }

    #[test]
    fn a_missing_timestamp_has_no_reason() {
        let t = Utc::now();
        let confirmed_without_time = StopRecord::intent(StopReason::Idle, t).confirm(None);
        assert_eq!(
            effective_reason(
                Some(&confirmed_without_time),
                &Desktop::test_stopped(None, 0)
            ),
            None
        );
        let rec = StopRecord::intent(StopReason::Idle, t).confirm(Some(t));
        assert_eq!(
            effective_reason(Some(&rec), &Desktop::test_stopped(None, 0)),
            None
        );
    }

    #[test]
    fn an_unconfirmed_intent_has_no_reason() {
        let t = Utc::now();
        let intent = StopRecord::intent(StopReason::Idle, t);
        assert_eq!(
            effective_reason(Some(&intent), &Desktop::test_stopped(Some(t), 0)),
            None
        );
    }

    #[test]
    fn the_engine_says_killed_or_oom() {
        let t = Utc::now();
        assert_eq!(
            effective_reason(None, &Desktop::test_stopped(Some(t), 137)),
            Some(StopReason::Killed)
        );
        let mut oom = Desktop::test_stopped(Some(t), 137);
        oom.oom_killed = true;
        assert_eq!(effective_reason(None, &oom), Some(StopReason::Oom));
        // A foreign kill after our stop: the timestamp moved on.
        let rec = StopRecord::intent(StopReason::Idle, t).confirm(Some(t));
        assert_eq!(
            effective_reason(
                Some(&rec),
                &Desktop::test_stopped(Some(t + Duration::seconds(1)), 137)
            ),
            Some(StopReason::Killed)
        );
        // Our own stop that had to kill after the timeout keeps our reason.
        assert_eq!(
            effective_reason(Some(&rec), &Desktop::test_stopped(Some(t), 137)),
            Some(StopReason::Idle)
        );
    }

    #[test]
    fn files_are_hashed_0600_and_clear_removes_them() {
        let (tmp, store) = store();
        let t = Utc::now();
        store
            .save("../../etc/passwd", &StopRecord::intent(StopReason::Idle, t))
            .expect("save");
        let path = store.path("../../etc/passwd");
        assert!(path.starts_with(tmp.path().join("stops")));
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert_eq!(name.len(), 64 + ".json".len());
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        store.clear("../../etc/passwd").expect("clear");
        assert!(store.load("../../etc/passwd").expect("load").is_none());
        store
            .clear("never-there")
            .expect("clearing nothing is fine");
    }
}
