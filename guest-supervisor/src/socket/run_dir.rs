//! The run directory and the sockets bound in it: made a real, root-owned
//! 0700 directory by descriptor, never following a link; whatever sits at a
//! socket's name is removed unfollowed and a fresh 0600 socket is bound
//! beneath the held directory. It never reads or writes a connection.

use std::ffi::OsStr;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;

use tokio::net::UnixListener;

use crate::config::Config;
use crate::nofollow::{EntryKind, HeldDir, Owner};

/// Mode of the run directory: only root in the guest may enter it.
pub const RUN_DIR_MODE: u32 = 0o700;
/// Mode of the socket file.
pub const SOCKET_MODE: u32 = 0o600;

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The run directory could not be made or secured.
    #[error("preparing the run directory {path}: {source}")]
    RunDir {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The run directory is not a real directory (a link or a file was
    /// planted in its place; a mount point is always a directory).
    #[error("{path}: the run directory is not a real directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Something other than a socket sits where the socket goes.
    #[error("{path} exists and is a {kind}, not a socket: refusing to replace it")]
    Occupied {
        /// The path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// What sat at the socket path could not be removed.
    #[error("removing the stale socket {path}: {source}")]
    RemoveStale {
        /// The path.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// `bind` failed.
    #[error("binding {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The socket's mode could not be set.
    #[error("setting the mode of {path}: {source}")]
    Permissions {
        /// The path.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// A bound listener; dropping it unlinks the socket file if it is still the
/// one this process made.
#[derive(Debug)]
pub struct BoundSocket {
    /// The listener.
    pub listener: UnixListener,
    dir: HeldDir,
    path: PathBuf,
    name: &'static str,
    dev_ino: (u64, u64),
}

impl BoundSocket {
    /// Where the socket is, for messages.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let name = OsStr::new(self.name);
        if let Ok(st) = nix::sys::stat::fstatat(
            self.dir.fd(),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            if (st.st_dev, st.st_ino) == self.dev_ino {
                let _ = self.dir.unlink(name);
            }
        }
    }
}

/// Makes the run directory shared with the host a real directory owned by
/// the supervisor's user (root) with mode 0700, so only root in the guest
/// (and the host) can reach the supervisor socket. Works by descriptor
/// only: the parent is trusted, the run directory itself is opened without
/// following a link, and its mode and owner are set through that
/// descriptor. Returns the held directory, in which the socket is bound.
pub fn secure_run_dir(config: &Config) -> Result<HeldDir, SocketError> {
    let io = |source| SocketError::RunDir {
        path: config.run_dir.clone(),
        source,
    };
    let (Some(parent), Some(name)) = (config.run_dir.parent(), config.run_dir.file_name()) else {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the run directory needs a parent",
        )));
    };
    if !parent.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .create(parent)
            .map_err(io)?;
    }
    let parent = HeldDir::open_trusted(parent).map_err(io)?;
    let me = Owner {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    };
    if let Some(st) = parent.stat(name).map_err(io)? {
        if st.kind != EntryKind::Dir {
            return Err(SocketError::NotADirectory {
                path: config.run_dir.clone(),
            });
        }
    }
    let dir = parent.ensure_dir(name, RUN_DIR_MODE, me).map_err(io)?;
    let st = dir.stat_self().map_err(io)?;
    // Mode before owner: once it belongs to someone else, a chmod would need
    // CAP_FOWNER. The broker's host directory may arrive owned by a host uid
    // that is the desktop user's uid in here; root must own it so the
    // desktop user cannot replace the socket.
    if st.mode != RUN_DIR_MODE {
        dir.chmod(RUN_DIR_MODE).map_err(io)?;
    }
    if (st.uid, st.gid) != (me.uid, me.gid) {
        dir.chown(me).map_err(io)?;
    }
    Ok(dir)
}

/// What sits at a name, for messages.
fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::Dir => "directory",
        EntryKind::Symlink => "symbolic link",
        EntryKind::File => "regular file",
        EntryKind::Other => "special file",
    }
}

/// Secures the run directory (root-owned, 0700), removes whatever sits at
/// the socket's name (a stale socket, a link, a file, a directory: never
/// followed), binds a fresh socket beneath the held directory and sets it to
/// 0600.
pub fn bind(config: &Config) -> Result<BoundSocket, SocketError> {
    bind_named(config, dormouse_protocol::SOCKET_FILE_NAME)
}

/// [`bind`] for another socket of the run directory (`vnc.sock`), with the
/// same rules.
pub fn bind_named(config: &Config, file_name: &'static str) -> Result<BoundSocket, SocketError> {
    let dir = secure_run_dir(config)?;
    let path = config.run_dir.join(file_name);
    let name = OsStr::new(file_name);
    if let Some(st) = dir.stat(name).map_err(|source| SocketError::RemoveStale {
        path: path.clone(),
        source,
    })? {
        if st.kind != EntryKind::Other {
            tracing::warn!(path = %path.display(), kind = kind_name(st.kind),
                "removing what sits at the socket path (not followed)");
        }
        dir.remove_tree(name)
            .map_err(|source| SocketError::RemoveStale {
                path: path.clone(),
                source,
            })?;
    }
    // Bound beneath the held directory: the path through its descriptor
    // names that very directory, whatever was renamed meanwhile.
    let beneath = PathBuf::from(format!("/proc/self/fd/{}", dir.fd().as_raw_fd())).join(name);
    let listener = UnixListener::bind(&beneath).map_err(|source| SocketError::Bind {
        path: path.clone(),
        source,
    })?;
    // The directory is 0700 and root's, so the moment between bind and
    // chmod exposes nothing, and nobody but root can swap the entry.
    let socket = nix::fcntl::openat(
        dir.fd(),
        name,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| SocketError::Bind {
        path: path.clone(),
        source: e.into(),
    })?;
    let meta = nix::sys::stat::fstat(&socket).map_err(|e| SocketError::Bind {
        path: path.clone(),
        source: e.into(),
    })?;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", socket.as_raw_fd()));
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&by_fd, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(
            |source| SocketError::Permissions {
                path: path.clone(),
                source,
            },
        )?;
    }
    Ok(BoundSocket {
        listener,
        dir,
        path,
        name: file_name,
        dev_ino: (meta.st_dev, meta.st_ino),
    })
}
