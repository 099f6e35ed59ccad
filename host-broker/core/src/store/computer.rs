//! Computer records: `<data>/computers/<id>/computer.json`.
//!
//! A record is written *before* its container is created, so a crash can
//! leave a record without a container (reported as `missing`) but never a
//! container the broker does not know. The record holds what the computer was
//! created with; resume checks compare the engine's view against it. Only the
//! owner task writes records.

use std::fs;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{
    ensure_dir, read_json, remove_file, remove_tree, write_json, Lease, Paths, StoreError,
};
use crate::engine::{BackendSpec, Origin};

/// Version of the record format.
pub const RECORD_SCHEMA: u32 = 1;

/// Everything the broker keeps about one computer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputerRecord {
    /// Format version.
    pub schema: u32,
    /// The computer's UUID.
    pub id: Uuid,
    /// Human name.
    pub name: String,
    /// Owner key.
    pub owner: String,
    /// Immutable image ID the desktop was created from.
    pub image_id: String,
    /// Fencing generation; only ever grows.
    pub generation: u64,
    /// The current lease, if one was ever granted.
    pub lease: Option<Lease>,
    /// Host path of the workspace.
    pub workspace: PathBuf,
    /// Per-computer idle window override, in milliseconds.
    pub idle_timeout_ms: Option<u64>,
    /// When the record was made.
    pub created_at: DateTime<Utc>,
    /// The settings its backend created it with.
    pub spec: BackendSpec,
    /// The removed computer whose workspace this one adopts. Persisted before
    /// the workspace is moved, so a crash mid-adoption is finished at the next
    /// start-up ([`ComputerStore::finish_adoption`]) instead of leaving a
    /// workspace that no record names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_from: Option<Uuid>,
    /// The desktop's egress policy; a record written before egress existed
    /// has none and reads as the broker's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<dormouse_protocol::egress_policy::EgressPolicy>,
    /// Since when the desktop is wanted running: set when it is created or
    /// started (or seen running), cleared when the broker stops it (for any
    /// reason) or sees it go down while it watches. A desktop found stopped
    /// at start-up with this set went down unwatched, with the host or the
    /// engine, and is started again ([`crate::config::ResumeAfterRestart`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted_running_since: Option<DateTime<Utc>>,
}

impl ComputerRecord {
    /// What its backend made the desktop as, for provisioning and the resume
    /// check.
    pub fn origin(&self) -> Origin<'_> {
        Origin {
            id: self.id,
            owner: &self.owner,
            image_id: &self.image_id,
            spec: &self.spec,
        }
    }
}

/// Reads and writes computer records.
#[derive(Debug, Clone)]
pub struct ComputerStore {
    paths: Paths,
}

impl ComputerStore {
    /// The store under these paths.
    pub fn new(paths: Paths) -> Self {
        Self { paths }
    }

    /// The paths it uses.
    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    /// Persists a record (creating its directory).
    pub fn save(&self, record: &ComputerRecord) -> Result<(), StoreError> {
        ensure_dir(&self.paths.computer_dir(record.id))?;
        write_json(&self.paths.record(record.id), record)
    }

    /// One record; `None` when there is none.
    pub fn load(&self, id: Uuid) -> Result<Option<ComputerRecord>, StoreError> {
        read_json(&self.paths.record(id))
    }

    /// Every record. Directories whose name is not a UUID or that hold no
    /// record (the kept workspace of a removed computer) are skipped; a
    /// record that does not parse is an error for that computer only and is
    /// returned beside the good ones.
    pub fn load_all(&self) -> Result<(Vec<ComputerRecord>, Vec<StoreError>), StoreError> {
        let root = self.paths.computers();
        ensure_dir(&root)?;
        let mut records = Vec::new();
        let mut broken = Vec::new();
        let entries = fs::read_dir(&root).map_err(|e| StoreError::Io {
            op: "list",
            path: root.clone(),
            source: e,
        })?;
        for entry in entries.flatten() {
            let Some(id) = Paths::computer_of(&entry) else {
                continue;
            };
            match self.load(id) {
                Ok(Some(record)) if record.id == id => records.push(record),
                Ok(Some(record)) => broken.push(StoreError::Corrupt {
                    path: self.paths.record(id),
                    message: format!("record names computer {}", record.id),
                }),
                Ok(None) => {}
                Err(e) => broken.push(e),
            }
        }
        records.sort_by_key(|r| r.created_at);
        Ok((records, broken))
    }

    /// Deletes a record. With `purge` the whole computer directory goes
    /// (workspace included); without it the workspace is kept for
    /// `workspace_from` and only the record, the last screen and the run
    /// directory are removed.
    /// Blocking and possibly long: call it on the blocking pool.
    pub fn delete(&self, id: Uuid, purge: bool) -> Result<(), StoreError> {
        if purge {
            remove_tree("remove", &self.paths.computer_dir(id))?;
            return super::sync_dir(&self.paths.computers());
        }
        remove_file(&self.paths.record(id))?;
        // After the record: an intent without a record is settled at
        // start-up, a record without its remove intent would not be.
        super::intent::clear(&self.paths, id)?;
        super::last_screen::forget(&self.paths, id)?;
        crate::faults::step("store: last screen forgotten");
        remove_tree("remove", &self.paths.run_dir(id))?;
        crate::faults::step("store: run directory removed");
        Ok(())
    }

    /// Moves the workspace a record adopts into place when a crash came
    /// between persisting the record and the move; a no-op otherwise.
    pub fn finish_adoption(&self, record: &ComputerRecord) -> Result<bool, StoreError> {
        let Some(from) = record.workspace_from else {
            return Ok(false);
        };
        let workspace = self.paths.workspace(record.id);
        let old = self.paths.workspace(from);
        if fs::symlink_metadata(&workspace).is_ok() || !old.is_dir() {
            return Ok(false);
        }
        adopt_workspace(&self.paths, &old, record.id)?;
        Ok(true)
    }
}

/// Renames a kept workspace into computer `id`'s directory, durably (both
/// directories fsynced).
pub fn adopt_workspace(paths: &Paths, old: &std::path::Path, id: Uuid) -> Result<(), StoreError> {
    let workspace = paths.workspace(id);
    fs::rename(old, &workspace).map_err(|e| StoreError::Io {
        op: "adopt workspace",
        path: old.to_owned(),
        source: e,
    })?;
    super::sync_dir(&paths.computer_dir(id))?;
    if let Some(parent) = old.parent() {
        super::sync_dir(parent)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(id: Uuid, paths: &Paths) -> ComputerRecord {
        ComputerRecord {
            schema: RECORD_SCHEMA,
            id,
            name: "n".into(),
            owner: "o".into(),
            image_id: "sha256:abc".into(),
            generation: 0,
            lease: None,
            workspace: paths.workspace(id),
            idle_timeout_ms: None,
            created_at: Utc::now(),
            workspace_from: None,
            egress: None,
            wanted_running_since: None,
            spec: BackendSpec::encode(&serde_json::json!({
                "name": format!("dormouse-{id}"),
                "image": "sha256:abc",
                "hostname": "desk",
                "labels": {},
                "mounts": [],
                "hardening": {
                    "network_mode": "none", "cap_add": [], "cap_drop": ["ALL"],
                    "security_opt": [], "ipc_mode": "private",
                    "cgroupns_mode": "private", "privileged": false,
                    "publish_all_ports": false, "restart_policy": "no", "init": false
                },
                "limits": {"nano_cpus": 1, "memory": 2, "memory_swap": 2, "pids_limit": 3},
                "command": []
            }))
            .expect("spec"),
        }
    }

    #[test]
    fn records_round_trip_and_delete_keeps_the_workspace() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(tmp.path());
        let store = ComputerStore::new(paths.clone());
        let id = Uuid::new_v4();
        let rec = record(id, &paths);
        store.save(&rec).expect("save");
        fs::create_dir_all(paths.workspace(id)).expect("ws");
        fs::write(paths.workspace(id).join("marker"), "x").expect("marker");
        fs::create_dir_all(paths.run_dir(id)).expect("run");
        fs::create_dir_all(tmp.path().join("computers/not-a-uuid")).expect("junk");
        let (all, broken) = store.load_all().expect("load");
        assert_eq!(all, vec![rec]);
        assert!(broken.is_empty());
        store.delete(id, false).expect("delete");
        assert!(store.load(id).expect("load").is_none());
        assert!(paths.workspace(id).join("marker").exists());
        assert!(!paths.run_dir(id).exists());
        let (all, _) = store.load_all().expect("load");
        assert!(all.is_empty());
        store.delete(id, true).expect("purge");
        assert!(!paths.computer_dir(id).exists());
    }

    #[test]
    fn a_corrupt_record_does_not_hide_the_others() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(tmp.path());
        let store = ComputerStore::new(paths.clone());
        let good = record(Uuid::new_v4(), &paths);
        store.save(&good).expect("save");
        let bad = Uuid::new_v4();
        fs::create_dir_all(paths.computer_dir(bad)).expect("dir");
        fs::write(paths.record(bad), "{not json").expect("write");
        let (all, broken) = store.load_all().expect("load");
        assert_eq!(all.len(), 1);
        assert_eq!(broken.len(), 1);
    }

    /// A record as the broker wrote it before backends were named (no
    /// `workspace_from`, no process, none of the newer hardening fields).
    const OLD_RECORD: &str = r#"{
  "schema": 1,
  "id": "0123abcd-4567-89ab-cdef-0123456789ab",
  "name": "n",
  "owner": "o",
  "image_id": "sha256:abc",
  "generation": 3,
  "lease": null,
  "workspace": "/data/computers/0123abcd-4567-89ab-cdef-0123456789ab/workspace",
  "idle_timeout_ms": null,
  "created_at": "2026-11-30T10:00:00Z",
  "spec": {
    "name": "dormouse-0123abcd-4567-89ab-cdef-0123456789ab",
    "image": "sha256:abc",
    "hostname": "desk-0123abcd",
    "labels": {"dev.dormouse.computer": "0123abcd-4567-89ab-cdef-0123456789ab"},
    "mounts": [{"source": "/data/w", "target": "/home/desk/workspace", "read_only": false}],
    "hardening": {
      "network_mode": "none", "cap_add": ["CHOWN"], "cap_drop": ["ALL"],
      "security_opt": ["no-new-privileges"], "ipc_mode": "private",
      "cgroupns_mode": "private", "privileged": false, "publish_all_ports": false,
      "restart_policy": "no", "init": false
    },
    "limits": {"nano_cpus": 1, "memory": 2, "memory_swap": 2, "pids_limit": 3}
  }
}"#;

    #[test]
    fn records_written_by_earlier_versions_still_load_and_round_trip() {
        let record: ComputerRecord = serde_json::from_str(OLD_RECORD).expect("old record loads");
        assert_eq!(record.generation, 3);
        assert_eq!(record.workspace_from, None);
        // The spec stays the backend's: kept as it was written (the Docker
        // backend's own test decodes this same record's spec).
        let spec = record.spec.as_json();
        assert_eq!(spec["hardening"]["cap_add"], serde_json::json!(["CHOWN"]));
        assert!(spec["hardening"].get("ulimits").is_none() && spec.get("process").is_none());
        assert_eq!(
            record.spec.describe(),
            "container dormouse-0123abcd-4567-89ab-cdef-0123456789ab"
        );
        let again: ComputerRecord =
            serde_json::from_str(&serde_json::to_string(&record).expect("ser")).expect("de");
        assert_eq!(again, record);
        // Nothing new is written for what an old record does not have.
        let written = serde_json::to_value(&record).expect("ser");
        assert!(written.get("workspace_from").is_none());
        assert!(written["spec"].get("process").is_none());
        assert!(written["spec"]["hardening"].get("ulimits").is_none());
    }

    #[test]
    fn an_adoption_cut_short_by_a_crash_is_finished() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(tmp.path());
        let store = ComputerStore::new(paths.clone());
        let old = Uuid::new_v4();
        fs::create_dir_all(paths.workspace(old)).expect("ws");
        fs::write(paths.workspace(old).join("kept"), "x").expect("kept");
        let new = Uuid::new_v4();
        let mut rec = record(new, &paths);
        rec.workspace_from = Some(old);
        // The crash came after the record was persisted, before the move.
        store.save(&rec).expect("save");
        assert!(store.finish_adoption(&rec).expect("finish"));
        assert!(paths.workspace(new).join("kept").exists());
        assert!(!paths.workspace(old).exists());
        // After the move (or a second start-up) there is nothing to do.
        assert!(!store.finish_adoption(&rec).expect("again"));
        assert!(paths.workspace(new).join("kept").exists());
    }
}
