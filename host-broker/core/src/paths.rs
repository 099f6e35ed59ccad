//! Every path under the data directory, in one place: the layout the
//! store keeps its records in and the backend keeps its host directories
//! in.
//!
//! ```text
//! <data>/computers/<id>/computer.json   the computer's record
//! <data>/computers/<id>/workspace/      its workspace (a host-directory backend's)
//! <data>/computers/<id>/run/            its run directory (a host-directory backend's)
//! <data>/computers/<id>/last-screen.webp its screen before the broker's last stop
//! <data>/computers/<id>/activity.jsonl  its activity record, one entry a line
//! <data>/computers/<id>/activity.seq    the first sequence number not yet handed out
//! <data>/stops/<sha256(key)>.json       why the broker stopped it
//! ```
//!
//! Only the store and a backend that keeps host directories build paths
//! from it; everyone else asks the backend ([`crate::engine::Backend::workspace`],
//! [`crate::engine::Backend::guest`]). It never touches the disk.

use std::path::{Path, PathBuf};

use uuid::Uuid;

/// Every path under the data directory, in one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    data: PathBuf,
}

impl Paths {
    /// Paths under `data`.
    pub fn new(data: impl Into<PathBuf>) -> Self {
        Self { data: data.into() }
    }

    /// The data directory.
    pub fn data(&self) -> &Path {
        &self.data
    }

    /// `<data>/computers`.
    pub fn computers(&self) -> PathBuf {
        self.data.join("computers")
    }

    /// The computer an entry of [`Self::computers`] is the directory of,
    /// if its name is an id.
    pub fn computer_of(entry: &std::fs::DirEntry) -> Option<Uuid> {
        entry
            .file_name()
            .to_str()
            .and_then(|n| Uuid::parse_str(n).ok())
    }

    /// `<data>/computers/<id>`.
    pub fn computer_dir(&self, id: Uuid) -> PathBuf {
        self.computers().join(id.to_string())
    }

    /// `<data>/computers/<id>/computer.json`.
    pub fn record(&self, id: Uuid) -> PathBuf {
        self.computer_dir(id).join("computer.json")
    }

    /// `<data>/computers/<id>/intent.json`: a create or remove under way.
    pub fn intent(&self, id: Uuid) -> PathBuf {
        self.computer_dir(id).join("intent.json")
    }

    /// `<data>/computers/<id>/workspace`.
    pub fn workspace(&self, id: Uuid) -> PathBuf {
        self.computer_dir(id).join("workspace")
    }

    /// `<data>/computers/<id>/run`.
    pub fn run_dir(&self, id: Uuid) -> PathBuf {
        self.computer_dir(id).join("run")
    }

    /// `<data>/computers/<id>/run/supervisor.sock`.
    pub fn socket(&self, id: Uuid) -> PathBuf {
        self.run_dir(id).join(dormouse_protocol::SOCKET_FILE_NAME)
    }

    /// `<data>/computers/<id>/last-screen.webp`.
    pub fn last_screen(&self, id: Uuid) -> PathBuf {
        self.computer_dir(id).join("last-screen.webp")
    }

    /// `<data>/computers/<id>/activity.jsonl`.
    pub fn activity(&self, id: Uuid) -> PathBuf {
        self.computer_dir(id).join("activity.jsonl")
    }

    /// `<data>/computers/<id>/activity.seq`.
    pub fn activity_seq(&self, id: Uuid) -> PathBuf {
        self.computer_dir(id).join("activity.seq")
    }

    /// `<data>/stops`.
    pub fn stops(&self) -> PathBuf {
        self.data.join("stops")
    }
}
