//! Preparation of a container start, before any desktop process runs.
//!
//! Owns, in this order: the workspace root
//! (owned by the desktop user), the profile links into the workspace, the
//! X socket directory (root, 1777), and — only when the container-start identity differs
//! from the one recorded at the last preparation — removal of stale locks
//! and Chromium's crash flag, after which the new identity is recorded.
//! With an unchanged identity it never touches a lock: a lock may belong to
//! a live process then. It must never follow a symlink in a directory the
//! desktop user can write, and never rewrite `/etc/hostname`.

pub mod profiles;

use std::path::PathBuf;

use dormouse_protocol::ContainerStartIdentity;

use crate::config::Config;
use crate::nofollow::Owner;
use crate::{identity, locks};

/// Why a preparation step failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// A filesystem step failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// The step, e.g. `linking`.
        what: &'static str,
        /// The path it worked on.
        path: PathBuf,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// A path is not what it must be and cannot safely be fixed.
    #[error("{path}: {why}")]
    Unsafe {
        /// The path.
        path: PathBuf,
        /// Why it is refused.
        why: &'static str,
    },
    /// The identity could not be recorded.
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
}

/// What a preparation did, and what it could not do.
#[derive(Debug, Default)]
pub struct Prepared {
    /// Steps that failed; the others still ran (a desktop that cannot be
    /// fully prepared still starts, and says why it is degraded).
    pub problems: Vec<PrepareError>,
    /// The identity differed from the recorded one (a new container start).
    pub new_start: bool,
    /// Locks removed (only on a new start).
    pub locks_removed: Vec<PathBuf>,
    /// Chromium preferences marked as exited cleanly (only on a new start).
    pub preferences_fixed: Vec<PathBuf>,
    /// Profile links created or repaired.
    pub links_changed: usize,
}

/// Prepares this container start; see the module documentation. Every
/// step runs even when an earlier one failed; failures are collected in
/// [`Prepared::problems`].
pub fn prepare(config: &Config, identity: &ContainerStartIdentity) -> Prepared {
    let mut prepared = Prepared::default();
    if let Err(e) = secure_workspace_root(config) {
        prepared.problems.push(e);
    }
    for (_, outcome) in profiles::ensure_links(config) {
        match outcome {
            Ok(profiles::LinkOutcome::AlreadyLinked) => {}
            Ok(_) => prepared.links_changed += 1,
            Err(e) => prepared.problems.push(e),
        }
    }

    // Before the locks: once the socket directory is root's, removing a
    // socket the desktop user left in it needs no CAP_FOWNER.
    if let Err(source) = locks::ensure_x_socket_dir(config) {
        prepared.problems.push(PrepareError::Io {
            what: "preparing .X11-unix in",
            path: config.tmp_dir.clone(),
            source,
        });
    }

    let last = identity::last_prepared(config);
    prepared.new_start = last.as_ref() != Some(identity);
    let mut cleared = true;
    if prepared.new_start {
        tracing::info!(
            identity = %identity.fingerprint(),
            last = %last.as_ref().map(|l| l.fingerprint()).unwrap_or_else(|| "none".into()),
            "new container start: clearing stale locks"
        );
        let mut step = |what, path: PathBuf, result: std::io::Result<Vec<PathBuf>>| match result {
            Ok(paths) => paths,
            Err(source) => {
                cleared = false;
                prepared
                    .problems
                    .push(PrepareError::Io { what, path, source });
                Vec::new()
            }
        };
        let mut removed = step(
            "clearing X locks in",
            config.tmp_dir.clone(),
            locks::clear_x_locks(config),
        );
        removed.extend(step(
            "clearing profile locks in",
            config.profiles_root(),
            locks::clear_profile_locks(config, None),
        ));
        let fixed = step(
            "marking clean exit in",
            config.profiles_root(),
            locks::mark_chromium_exited_cleanly(config),
        );
        for path in &removed {
            tracing::info!(path = %path.display(), "removed stale lock");
        }
        for path in &fixed {
            tracing::info!(path = %path.display(), "marked profile as exited cleanly");
        }
        prepared.locks_removed = removed;
        prepared.preferences_fixed = fixed;
    } else {
        tracing::info!(identity = %identity.fingerprint(), "same container start: locks untouched");
    }
    // Last, and only after a complete cleanup: a kill before this point, or
    // a failed step, repeats the (idempotent) cleanup at the next start.
    if prepared.new_start && cleared {
        if let Err(e) = identity::record_prepared(config, identity) {
            prepared.problems.push(e.into());
        }
    }
    for problem in &prepared.problems {
        tracing::error!(error = %problem, "preparation step failed");
    }
    prepared
}

/// The workspace root must be a real directory the desktop user owns (the
/// host may have created the mount point as root). Only the root itself is
/// changed, never anything in it.
fn secure_workspace_root(config: &Config) -> Result<(), PrepareError> {
    let io = |source| PrepareError::Io {
        what: "securing",
        path: config.workspace.clone(),
        source,
    };
    let anchor = config.anchor_for(&config.workspace);
    let owner = Owner {
        uid: config.uid,
        gid: config.gid,
    };
    let dir = profiles::ensure_real_dir(anchor, &config.workspace, 0o755, owner).map_err(io)?;
    let st = dir.stat_self().map_err(io)?;
    if (st.uid, st.gid) != (owner.uid, owner.gid) {
        dir.chown(owner).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::tests::FakeProc;
    use std::os::unix::fs::symlink;

    fn plant_locks(config: &Config) -> Vec<PathBuf> {
        let chromium = config.profiles_root().join("chromium");
        std::fs::create_dir_all(&chromium).expect("mkdir");
        std::fs::create_dir_all(config.x_socket_dir()).expect("mkdir");
        let planted = vec![
            chromium.join("SingletonLock"),
            config.x_lock_path(),
            config.x_socket_path(),
        ];
        let _ = std::fs::remove_file(&planted[0]);
        symlink("host-77", &planted[0]).expect("link");
        std::fs::write(&planted[1], "77").expect("write");
        std::fs::write(&planted[2], "").expect("write");
        planted
    }

    fn exists(path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok()
    }
    use std::path::Path;

    #[test]
    fn locks_go_once_per_container_start_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = FakeProc::new(dir.path());
        let config = Config {
            proc_root: proc.root.clone(),
            ..crate::config::test_support::test_config(dir.path())
        };
        let id = identity::read(&config).expect("identity");
        let planted = plant_locks(&config);
        let first = prepare(&config, &id);
        assert!(first.problems.is_empty(), "{:?}", first.problems);
        assert!(first.new_start);
        assert!(planted.iter().all(|p| !exists(p)), "stale locks removed");

        // Same start: live locks (of a running browser or X) stay.
        let planted = plant_locks(&config);
        let again = prepare(&config, &id);
        assert!(!again.new_start);
        assert!(planted.iter().all(|p| exists(p)), "live locks untouched");
    }

    #[test]
    fn every_identity_change_clears_locks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = FakeProc::new(dir.path());
        let config = Config {
            proc_root: proc.root.clone(),
            ..crate::config::test_support::test_config(dir.path())
        };
        let id = identity::read(&config).expect("identity");
        assert!(prepare(&config, &id).problems.is_empty());

        let changes: [&dyn Fn(); 3] = [
            &|| proc.add_process("1", 0, 99_999, "mnt:[4026531841]"),
            &|| proc.set_boot_id("rebooted"),
            &|| proc.set_pid_ns("another-namespace"),
        ];
        for change in changes {
            let planted = plant_locks(&config);
            change();
            let id = identity::read(&config).expect("identity");
            let prepared = prepare(&config, &id);
            assert!(prepared.problems.is_empty(), "{:?}", prepared.problems);
            assert!(prepared.new_start);
            assert!(planted.iter().all(|p| !exists(p)));
        }
    }
}
