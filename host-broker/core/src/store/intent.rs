//! The intent of a create or a remove, on disk for as long as nobody has
//! been told how it ended, so a broker that dies in the middle of one
//! settles it at its next start-up instead of leaving it half done.
//!
//! ```text
//! <data>/computers/<id>/intent.json   Intent: "create" or {"remove": {"purge": bool}}
//! ```
//!
//! A create saves its intent before anything else of the computer exists
//! (directories, record, adopted workspace, desktop); a remove saves it
//! before it stops or destroys anything. The owner clears it once the
//! operation has ended and its caller is answered, whatever the result.
//! At start-up (`owner::startup`) an intent left behind means:
//!
//! | intent | record | desktop | settled by |
//! |---|---|---|---|
//! | create | none | none | removing the directories ([`settle_without_record`]) |
//! | create | yes | missing | undoing the create: the adopted workspace goes back, the directory goes |
//! | create | yes | present | keeping the computer, started if the crash came between the engine's create and start; the intent goes |
//! | remove | none | none | finishing the removal of the run directory and the last screen |
//! | remove | yes | any | finishing the remove: desktop stopped and destroyed, record deleted |
//!
//! It never decides anything about the engine itself: the owner asks the
//! backend and calls [`clear`] or the store's delete.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{ensure_dir, read_json, remove_file, remove_tree, sync_dir, write_json};
use super::{Paths, StoreError};

/// A create or a remove under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    /// A new computer is being made.
    Create,
    /// The computer is being removed.
    Remove {
        /// Its workspace goes too.
        purge: bool,
    },
}

/// Saves `intent` for computer `id` (atomically, fsynced), making the
/// computer's directory if it has none yet.
pub fn save(paths: &Paths, id: Uuid, intent: Intent) -> Result<(), StoreError> {
    ensure_dir(&paths.computer_dir(id))?;
    write_json(&paths.intent(id), &intent)
}

/// The intent left for computer `id`, if any.
pub fn load(paths: &Paths, id: Uuid) -> Result<Option<Intent>, StoreError> {
    read_json(&paths.intent(id))
}

/// The operation ended and its caller knows: forget the intent.
pub fn clear(paths: &Paths, id: Uuid) -> Result<(), StoreError> {
    remove_file(&paths.intent(id))
}

/// Settles the intents of computer directories that hold no record (a
/// create cut short before its record, a remove cut short after deleting
/// it). Blocking; run it at start-up, before anything asks for a workspace.
pub fn settle_without_record(paths: &Paths) -> Vec<(Uuid, Intent)> {
    let mut settled = Vec::new();
    let Ok(entries) = std::fs::read_dir(paths.computers()) else {
        return settled;
    };
    for entry in entries.flatten() {
        let Some(id) = Paths::computer_of(&entry) else {
            continue;
        };
        if paths.record(id).exists() {
            continue;
        }
        let intent = match load(paths, id) {
            Ok(Some(intent)) => intent,
            Ok(None) => continue,
            Err(e) => {
                tracing::error!(computer = %id, error = %e, "unreadable intent; left as it is");
                continue;
            }
        };
        let done = match intent {
            // Nothing was adopted before the record: the directories are
            // the create's own, and empty.
            Intent::Create | Intent::Remove { purge: true } => {
                remove_tree("remove", &paths.computer_dir(id))
                    .and_then(|()| sync_dir(&paths.computers()))
            }
            Intent::Remove { purge: false } => super::last_screen::forget(paths, id)
                .and_then(|()| remove_tree("remove", &paths.run_dir(id)))
                .and_then(|()| clear(paths, id)),
        };
        match done {
            Ok(()) => settled.push((id, intent)),
            Err(e) => {
                tracing::error!(computer = %id, error = %e, ?intent, "cannot settle an interrupted operation");
            }
        }
    }
    settled
}

/// Undoes a create whose desktop was never made: the workspace it adopted
/// goes back to the removed computer it came from, then the computer's
/// directory (record, run directory, fresh workspace) goes.
pub fn undo_create(paths: &Paths, id: Uuid, adopted: Option<Uuid>) -> Result<(), StoreError> {
    if let Some(from) = adopted {
        let workspace = paths.workspace(id);
        if workspace.is_dir() {
            ensure_dir(&paths.computer_dir(from))?;
            std::fs::rename(&workspace, paths.workspace(from)).map_err(|e| StoreError::Io {
                op: "give back the adopted workspace",
                path: workspace.clone(),
                source: e,
            })?;
            sync_dir(&paths.computer_dir(from))?;
            sync_dir(&paths.computer_dir(id))?;
        }
    }
    remove_tree("remove", &paths.computer_dir(id))?;
    sync_dir(&paths.computers())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_round_trip_and_orphaned_ones_are_settled() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(tmp.path());
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        save(&paths, a, Intent::Create).expect("save");
        ensure_dir(&paths.run_dir(a)).expect("run");
        save(&paths, b, Intent::Remove { purge: false }).expect("save");
        ensure_dir(&paths.run_dir(b)).expect("run");
        ensure_dir(&paths.workspace(b)).expect("workspace");
        std::fs::write(paths.workspace(b).join("kept"), "x").expect("write");
        save(&paths, c, Intent::Remove { purge: true }).expect("save");
        std::fs::write(paths.record(c), "{}").expect("record");
        assert_eq!(
            load(&paths, c).expect("load"),
            Some(Intent::Remove { purge: true })
        );
        let mut settled = settle_without_record(&paths);
        settled.sort_by_key(|(id, _)| *id == b);
        assert_eq!(settled.len(), 2);
        assert!(!paths.computer_dir(a).exists());
        assert!(paths.workspace(b).join("kept").exists());
        assert!(!paths.run_dir(b).exists());
        assert_eq!(load(&paths, b).expect("load"), None);
        // A computer with a record is the owner's to settle.
        assert!(paths.intent(c).exists());
    }

    #[test]
    fn an_undone_create_gives_its_adopted_workspace_back() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(tmp.path());
        let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
        ensure_dir(&paths.computer_dir(new)).expect("dir");
        ensure_dir(&paths.workspace(new)).expect("workspace");
        std::fs::write(paths.workspace(new).join("kept"), "x").expect("write");
        undo_create(&paths, new, Some(old)).expect("undo");
        assert!(paths.workspace(old).join("kept").exists());
        assert!(!paths.computer_dir(new).exists());
    }
}
