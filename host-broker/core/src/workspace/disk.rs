//! Disk usage of a workspace, measured on request from the host: never on a
//! status poll, never through the guest, so it never starts a container or
//! renews an idle timer.
//!
//! The walk never follows a link, counts every inode once (hard links
//! included), and stops at a deadline: the answer then says
//! `complete: false` and its figures are lower bounds. `workspace_bytes` is
//! the space allocated (`st_blocks × 512`, what `du -sB1` prints and what
//! counts against the filesystem), `apparent_bytes` the sum of sizes (what
//! `du -sb` prints); both include the workspace directory itself, as `du`
//! does. `workspace_files` counts the inodes below the root (what
//! `du -s --inodes` prints, minus one for the root). `free_bytes` is what
//! an unprivileged writer may still use on the workspace's filesystem
//! (`f_bavail × f_frsize`, `df`'s "Avail").

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use chrono::Utc;
use nix::sys::stat::{FileStat, SFlag};

use super::path::{kind_of, WorkspaceRoot, MAX_COMPONENTS};
use super::tree::{lstat_at, open_child_dir, read_names};
use super::WorkspaceError;

/// How long a measurement may walk by default before it answers with what
/// it has.
pub const DEFAULT_DISK_DEADLINE: Duration = Duration::from_secs(10);

/// Deepest directory the walk enters; deeper ones make it incomplete.
const MAX_WALK_DEPTH: usize = 4 * MAX_COMPONENTS;

/// A workspace's disk usage (the body of `GET /v1/computers/{id}/disk`).
pub use dormouse_protocol::workspace::DiskUsage;

struct Walk {
    deadline: Instant,
    allocated: u64,
    apparent: u64,
    inodes: u64,
    linked: HashSet<(u64, u64)>,
    complete: bool,
}

impl Walk {
    /// Adds one inode; `false` when it was counted already (a hard link).
    fn add(&mut self, st: &FileStat) {
        if kind_of(st.st_mode) != SFlag::S_IFDIR
            && st.st_nlink > 1
            && !self.linked.insert((st.st_dev, st.st_ino))
        {
            return;
        }
        self.allocated = self
            .allocated
            .saturating_add(u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512));
        self.apparent = self
            .apparent
            .saturating_add(u64::try_from(st.st_size).unwrap_or(0));
        self.inodes += 1;
    }

    fn dir(&mut self, dir: BorrowedFd<'_>, depth: usize) {
        let names = match read_names(dir, usize::MAX) {
            Ok((names, _)) => names,
            Err(e) => {
                tracing::debug!(error = %e, "unreadable directory in a workspace");
                self.complete = false;
                return;
            }
        };
        for name in names {
            if Instant::now() >= self.deadline {
                self.complete = false;
                return;
            }
            let st = match lstat_at(dir, &name) {
                Ok(Some(st)) => st,
                Ok(None) => continue,
                Err(_) => {
                    self.complete = false;
                    continue;
                }
            };
            self.add(&st);
            if kind_of(st.st_mode) == SFlag::S_IFDIR {
                if depth >= MAX_WALK_DEPTH {
                    self.complete = false;
                    continue;
                }
                match open_child_dir(dir, &name) {
                    Ok(child) => self.dir(child.as_fd(), depth + 1),
                    Err(_) => self.complete = false,
                }
                if !self.complete && Instant::now() >= self.deadline {
                    return;
                }
            }
        }
    }
}

/// Measures the workspace, walking at most `deadline`. `layer_bytes` is
/// left `None` for the caller to fill from the engine.
pub fn disk_usage(root: &WorkspaceRoot, deadline: Duration) -> Result<DiskUsage, WorkspaceError> {
    let measured_at = Utc::now();
    let started = Instant::now();
    let host = root.path().display().to_string();
    let vfs = nix::sys::statvfs::fstatvfs(root.fd())
        .map_err(|e| WorkspaceError::io("statvfs", &host, e.into()))?;
    let free_bytes = vfs.blocks_available().saturating_mul(vfs.fragment_size());
    let root_st = nix::sys::stat::fstat(root.fd())
        .map_err(|e| WorkspaceError::io("stat", &host, e.into()))?;
    let mut walk = Walk {
        deadline: started + deadline,
        allocated: 0,
        apparent: 0,
        inodes: 0,
        linked: HashSet::new(),
        complete: true,
    };
    walk.add(&root_st);
    let top = root.open_dir(&super::WorkspacePath::root())?;
    walk.dir(top.as_fd(), 0);
    Ok(DiskUsage {
        workspace_bytes: walk.allocated,
        apparent_bytes: walk.apparent,
        workspace_files: walk.inodes.saturating_sub(1),
        layer_bytes: None,
        free_bytes,
        measured_at,
        complete: walk.complete,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}
