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

use super::{ensure_dir, read_json, remove_file, write_json, Lease, Paths, StoreError};
use crate::engine::ContainerSpec;

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
    /// Immutable image ID the container was created from.
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
    /// The container settings it was created with.
    pub spec: ContainerSpec,
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
            let Some(id) = entry
                .file_name()
                .to_str()
                .and_then(|n| Uuid::parse_str(n).ok())
            else {
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
    /// `workspace_from` and only the record and run directory are removed.
    pub fn delete(&self, id: Uuid, purge: bool) -> Result<(), StoreError> {
        let dir = self.paths.computer_dir(id);
        if purge {
            match fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(StoreError::Io {
                        op: "remove",
                        path: dir,
                        source: e,
                    })
                }
            }
            return super::sync_dir(&self.paths.computers());
        }
        remove_file(&self.paths.record(id))?;
        let run = self.paths.run_dir(id);
        match fs::remove_dir_all(&run) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::Io {
                op: "remove",
                path: run,
                source: e,
            }),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::{Hardening, Limits};

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
            spec: ContainerSpec {
                name: format!("dormouse-{id}"),
                image: "sha256:abc".into(),
                hostname: "desk".into(),
                labels: Default::default(),
                mounts: vec![],
                hardening: Hardening {
                    network_mode: "none".into(),
                    cap_add: vec![],
                    cap_drop: vec!["ALL".into()],
                    security_opt: vec![],
                    ipc_mode: "private".into(),
                    cgroupns_mode: "private".into(),
                    privileged: false,
                    publish_all_ports: false,
                    restart_policy: "no".into(),
                    init: false,
                },
                limits: Limits {
                    nano_cpus: 1,
                    memory: 2,
                    memory_swap: 2,
                    pids_limit: 3,
                },
                command: vec![],
            },
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
}
