//! Swapping a staged import in place of a workspace, and making every
//! crash point whole again.
//!
//! The staged tree is flushed (`syncfs`), then
//! exchanged with the workspace in one `renameat2(RENAME_EXCHANGE)`; the old
//! tree, now at the staging name, is removed afterwards. Where the
//! filesystem has no exchange, the workspace is renamed to
//! `<workspace>.previous`, the staged tree into place, and the previous one
//! removed. Every rename is followed by an fsync of the parent. [`recover`]
//! makes any crash point whole again:
//!
//! | found after a crash | meaning | recovery |
//! |---|---|---|
//! | `workspace` + `.import` | staging unfinished, or exchanged and the old one not yet removed | remove `.import` (the workspace is complete either way) |
//! | `.previous` + `.import`, no `workspace` | crash between the two fallback renames | rename `.previous` back to `workspace`, remove `.import` |
//! | `workspace` + `.previous` | swap done, old not yet removed | remove `.previous` |
//! | `.previous` only | as above, staging gone | rename `.previous` back |
//! | `.import` only | a create from an archive did not finish | remove `.import` |
//!
//! An import that was not answered with success therefore leaves the old
//! workspace, one that was leaves the new one. Imports, creates and
//! recoveries of one workspace exclude each other with an `flock` on its
//! parent directory. The desktop must be stopped for an import: a running
//! container's bind mount keeps the old directory.
//!
//! It must never remove or rename anything but the workspace, its staging
//! directory and its set-aside copy, and never follow a link while
//! removing one of its own trees.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, renameat2, AtFlags, Flock, FlockArg, RenameFlags, AT_FDCWD};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode, SFlag};
use serde::Serialize;

use super::import::extract;
use super::{ImportLimits, ImportSummary};
use crate::faults;
use crate::workspace::path::kind_of;
use crate::workspace::tree::{chown_fd, open_child_dir, DIR_FLAGS};
use crate::workspace::{Owner, WorkspaceError};

/// What [`recover`] found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Recovery {
    /// A staging directory was removed.
    pub removed_staging: bool,
    /// The set-aside workspace was renamed back into place.
    pub restored_previous: bool,
    /// The set-aside workspace of a finished swap was removed.
    pub removed_previous: bool,
}

impl Recovery {
    /// Whether anything was left over.
    pub fn acted(&self) -> bool {
        self.removed_staging || self.restored_previous || self.removed_previous
    }
}

/// The directory holding a workspace, locked, with the names of the
/// workspace, its staging directory and its set-aside copy.
struct Site {
    dir: Flock<OwnedFd>,
    parent: PathBuf,
    name: OsString,
    staging: OsString,
    previous: OsString,
}

impl Site {
    fn lock(workspace: &Path) -> Result<Self, WorkspaceError> {
        let host = workspace.display().to_string();
        let name = workspace
            .file_name()
            .ok_or_else(|| {
                WorkspaceError::io(
                    "lock",
                    &host,
                    io::Error::other("the workspace path has no name"),
                )
            })?
            .to_owned();
        let parent = match workspace.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        // The parent is the broker's own directory, not the guest's.
        let fd = openat(AT_FDCWD, &parent, DIR_FLAGS, Mode::empty())
            .map_err(|e| WorkspaceError::io("open the directory of", &host, e.into()))?;
        let dir = Flock::lock(fd, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
            Errno::EWOULDBLOCK => WorkspaceError::Busy,
            e => WorkspaceError::io("lock the directory of", &host, e.into()),
        })?;
        let with = |suffix: &str| {
            let mut n = name.clone();
            n.push(suffix);
            n
        };
        Ok(Self {
            staging: with(".import"),
            previous: with(".previous"),
            dir,
            parent,
            name,
        })
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    fn host(&self, name: &OsStr) -> String {
        self.parent.join(name).display().to_string()
    }

    /// `lstat` of one of the three names; anything but a directory there is
    /// an error (the broker never puts anything else there).
    fn stat_dir(&self, name: &OsStr) -> Result<Option<nix::sys::stat::FileStat>, WorkspaceError> {
        match fstatat(self.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if kind_of(st.st_mode) == SFlag::S_IFDIR => Ok(Some(st)),
            Ok(_) => Err(WorkspaceError::NotADirectory {
                path: self.host(name),
            }),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(WorkspaceError::io("stat", self.host(name), e.into())),
        }
    }

    fn sync(&self) -> Result<(), WorkspaceError> {
        nix::unistd::fsync(self.fd())
            .map_err(|e| WorkspaceError::io("fsync", self.parent.display(), e.into()))
    }

    fn rename(&self, from: &OsStr, to: &OsStr) -> Result<(), WorkspaceError> {
        renameat(self.fd(), from, self.fd(), to)
            .map_err(|e| WorkspaceError::io("rename", self.host(from), e.into()))?;
        self.sync()
    }

    /// Removes a tree of ours (staging or set-aside); links in it are
    /// removed, never followed (std's `remove_dir_all` works by descriptor).
    fn remove(&self, name: &OsStr) -> Result<(), WorkspaceError> {
        let path = self.parent.join(name);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(WorkspaceError::io("remove", path.display(), e)),
        }
        self.sync()
    }

    fn recover(&self) -> Result<Recovery, WorkspaceError> {
        let mut done = Recovery::default();
        let mut workspace = self.stat_dir(&self.name)?.is_some();
        let staging = self.stat_dir(&self.staging)?.is_some();
        let previous = self.stat_dir(&self.previous)?.is_some();
        if !workspace && previous {
            self.rename(&self.previous, &self.name)?;
            done.restored_previous = true;
            workspace = true;
        }
        if staging {
            self.remove(&self.staging)?;
            done.removed_staging = true;
        }
        if workspace && previous && !done.restored_previous {
            self.remove(&self.previous)?;
            done.removed_previous = true;
        }
        if done.acted() {
            tracing::warn!(workspace = %self.host(&self.name), ?done, "recovered a workspace left by an interrupted import");
        }
        Ok(done)
    }

    /// Extracts `input` into a fresh staging directory whose root gets
    /// `root_mode` and `root_owner`, and flushes it; on any error the
    /// staging directory is removed.
    fn stage(
        &self,
        input: impl Read,
        limits: &ImportLimits,
        root_mode: u32,
        root_owner: Owner,
    ) -> Result<ImportSummary, WorkspaceError> {
        mkdirat(
            self.fd(),
            self.staging.as_os_str(),
            Mode::from_bits_truncate(0o700),
        )
        .map_err(|e| WorkspaceError::io("create", self.host(&self.staging), e.into()))?;
        let result = (|| {
            let staged = open_child_dir(self.fd(), &self.staging)
                .map_err(|e| WorkspaceError::io("open", self.host(&self.staging), e))?;
            faults::step("import: staging directory made");
            let summary = extract(staged.as_fd(), input, limits)?;
            faults::step("import: archive extracted");
            let host = self.host(&self.staging);
            fchmod(&staged, Mode::from_bits_truncate(root_mode & 0o777))
                .map_err(|e| WorkspaceError::io("chmod", &host, e.into()))?;
            chown_fd(&staged, root_owner).map_err(|e| WorkspaceError::io("chown", &host, e))?;
            // One flush of the filesystem instead of an fsync per file.
            nix::unistd::syncfs(&staged)
                .map_err(|e| WorkspaceError::io("syncfs", &host, e.into()))?;
            faults::step("import: staged tree flushed");
            Ok(summary)
        })();
        if result.is_err() {
            if let Err(e) = self.remove(&self.staging) {
                tracing::error!(error = %e, "removing a refused import's staging directory failed; the next recovery removes it");
            }
        }
        result
    }
}

/// Makes a workspace whole after a crash during an import or a create from
/// an archive (see the module documentation for each case). Run it for
/// every computer when the broker starts; imports run it themselves first.
pub fn recover(workspace: &Path) -> Result<Recovery, WorkspaceError> {
    Site::lock(workspace)?.recover()
}

/// Replaces the existing workspace at `workspace` (a host path; the
/// desktop must be stopped) with the archive read from `input`. Either the
/// whole archive is accepted and swapped in, or nothing changes.
pub fn replace_from_tar(
    workspace: &Path,
    input: impl Read,
    limits: &ImportLimits,
) -> Result<ImportSummary, WorkspaceError> {
    let site = Site::lock(workspace)?;
    site.recover()?;
    let old = site
        .stat_dir(&site.name)?
        .ok_or_else(|| WorkspaceError::NotFound {
            path: site.host(&site.name),
        })?;
    let owner = Owner {
        uid: old.st_uid,
        gid: old.st_gid,
    };
    let mut summary = site.stage(input, limits, old.st_mode, owner)?;
    summary.old_removed = swap_in(&site, true)?;
    Ok(summary)
}

/// Puts the staged tree in the workspace's place: one exchange where the
/// filesystem has it (`exchange`), two renames otherwise. Returns whether
/// the old tree was removed afterwards.
fn swap_in(site: &Site, exchange: bool) -> Result<bool, WorkspaceError> {
    if exchange {
        match renameat2(
            site.fd(),
            site.staging.as_os_str(),
            site.fd(),
            site.name.as_os_str(),
            RenameFlags::RENAME_EXCHANGE,
        ) {
            Ok(()) => {
                faults::step("import: trees exchanged");
                site.sync()?;
                faults::step("import: exchange fsynced");
                // The old tree is at the staging name now.
                let removed = remove_logged(site, &site.staging);
                faults::step("import: old tree removed");
                return Ok(removed);
            }
            Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {}
            Err(e) => {
                let _ = site.remove(&site.staging);
                return Err(WorkspaceError::io(
                    "swap in",
                    site.host(&site.staging),
                    e.into(),
                ));
            }
        }
    }
    site.rename(&site.name, &site.previous)?;
    faults::step("import: old tree set aside");
    if let Err(e) = site.rename(&site.staging, &site.name) {
        // Put the old one back before answering.
        site.rename(&site.previous, &site.name)?;
        let _ = site.remove(&site.staging);
        return Err(e);
    }
    Ok(remove_logged(site, &site.previous))
}

fn remove_logged(site: &Site, name: &OsStr) -> bool {
    match site.remove(name) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "removing the replaced workspace failed; the next recovery removes it");
            false
        }
    }
}

/// Creates the workspace at `workspace` (which must not exist; its parent
/// must) from the archive read from `input`: staged, then renamed into
/// place. Its root is 0700 and belongs to [`ImportLimits::owner`].
pub fn create_from_tar(
    workspace: &Path,
    input: impl Read,
    limits: &ImportLimits,
) -> Result<ImportSummary, WorkspaceError> {
    let site = Site::lock(workspace)?;
    site.recover()?;
    if site.stat_dir(&site.name)?.is_some() {
        return Err(WorkspaceError::Exists {
            path: site.host(&site.name),
        });
    }
    let summary = site.stage(input, limits, 0o700, limits.owner)?;
    let placed = match renameat2(
        site.fd(),
        site.staging.as_os_str(),
        site.fd(),
        site.name.as_os_str(),
        RenameFlags::RENAME_NOREPLACE,
    ) {
        // Without NOREPLACE the lock and the check above stand in for it.
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => renameat(
            site.fd(),
            site.staging.as_os_str(),
            site.fd(),
            site.name.as_os_str(),
        ),
        other => other,
    };
    if let Err(e) = placed {
        let _ = site.remove(&site.staging);
        return Err(match e {
            Errno::EEXIST | Errno::ENOTEMPTY => WorkspaceError::Exists {
                path: site.host(&site.name),
            },
            e => WorkspaceError::io("rename into place", site.host(&site.name), e.into()),
        });
    }
    site.sync()?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_swaps_put_the_staged_tree_in_place_and_remove_the_old() {
        for exchange in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let ws = dir.path().join("workspace");
            std::fs::create_dir(&ws).unwrap();
            std::fs::write(ws.join("which"), "old").unwrap();
            std::fs::create_dir(dir.path().join("workspace.import")).unwrap();
            std::fs::write(dir.path().join("workspace.import/which"), "new").unwrap();
            let site = Site::lock(&ws).unwrap();
            assert!(swap_in(&site, exchange).unwrap());
            assert_eq!(std::fs::read_to_string(ws.join("which")).unwrap(), "new");
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                names,
                vec![OsString::from("workspace")],
                "exchange: {exchange}"
            );
        }
    }
}
