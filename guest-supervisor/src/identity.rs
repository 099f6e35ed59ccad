//! The container-start identity, and the record of the last preparation.
//!
//! Owns reading `boot_id`, the pid-namespace inode and the start time of the
//! container's init from procfs (always under `config.proc_root`, so tests
//! use fake files), and the small file in `config.state_dir` that remembers
//! which start the home was last prepared for. It must never decide what to
//! do about a changed identity: that is the preparation's job.
//!
//! The start time is that of PID 1 when PID 1 belongs to this container
//! (the normal case: a private pid namespace, PID 1 being the supervisor or a
//! tiny init before it). When the pid namespace is shared (`--pid=host`),
//! PID 1 is the host's init and never changes, so the topmost ancestor of
//! this process that still shares its mount namespace is used instead: the
//! process the engine started for this container.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use dormouse_protocol::ContainerStartIdentity;

use crate::config::Config;
use crate::procfs::Stat;

/// Why the identity could not be read or recorded.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A procfs or state file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// A procfs file did not have the expected shape.
    #[error("{path}: {what}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What was missing.
        what: &'static str,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + '_ {
    move |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads this container start's identity from `config.proc_root`.
pub fn read(config: &Config) -> Result<ContainerStartIdentity, IdentityError> {
    let proc_root = &config.proc_root;
    let boot_path = proc_root.join("sys/kernel/random/boot_id");
    let boot_id = std::fs::read_to_string(&boot_path)
        .map_err(io(&boot_path))?
        .trim()
        .to_owned();
    if boot_id.is_empty() {
        return Err(IdentityError::Malformed {
            path: boot_path,
            what: "empty boot id",
        });
    }
    // `stat`, not `lstat`: the magic link resolves to the nsfs inode.
    let ns_path = proc_root.join("self/ns/pid");
    let pid_ns_inode = std::fs::metadata(&ns_path).map_err(io(&ns_path))?.ino();
    let init = container_init(proc_root)?;
    let pid1_start_time = start_time(&proc_root.join(init).join("stat"))?;
    Ok(ContainerStartIdentity {
        boot_id,
        pid_ns_inode,
        pid1_start_time,
    })
}

/// The `/proc` entry name of this container's init: `1`, unless PID 1 lives
/// in another mount namespace (a shared pid namespace).
fn container_init(proc_root: &Path) -> Result<String, IdentityError> {
    let mnt = |pid: &str| std::fs::read_link(proc_root.join(pid).join("ns/mnt")).ok();
    let Some(own_mnt) = mnt("self") else {
        // Cannot tell; PID 1 is the documented source.
        return Ok("1".into());
    };
    if mnt("1").as_ref() == Some(&own_mnt) {
        return Ok("1".into());
    }
    let self_link = proc_root.join("self");
    let mut pid = std::fs::read_link(&self_link)
        .map_err(io(&self_link))?
        .to_string_lossy()
        .into_owned();
    // Walk up while the parent shares our mount namespace; a parent whose
    // namespace we cannot read (another container, the host) ends the walk.
    for _ in 0..64 {
        let stat_path = proc_root.join(&pid).join("stat");
        let ppid = stat_field(&stat_path, Stat::PPID)?;
        if ppid == 0 {
            break;
        }
        let parent = ppid.to_string();
        if mnt(&parent).as_ref() != Some(&own_mnt) {
            break;
        }
        pid = parent;
    }
    Ok(pid)
}

/// Field 22 of a `stat` file: start time in clock ticks after boot.
pub fn start_time(stat_path: &Path) -> Result<u64, IdentityError> {
    stat_field(stat_path, Stat::START_TIME)
}

/// Field `n` (1-based, as in proc(5)) of a `/proc/<pid>/stat` file, as a
/// number.
fn stat_field(stat_path: &Path, n: usize) -> Result<u64, IdentityError> {
    let text = std::fs::read_to_string(stat_path).map_err(io(stat_path))?;
    let malformed = |what| IdentityError::Malformed {
        path: stat_path.to_owned(),
        what,
    };
    Stat::parse(&text)
        .ok_or_else(|| malformed("no command name"))?
        .field(n)
        .ok_or_else(|| malformed("too few fields"))?
        .parse()
        .map_err(|_| malformed("field is not a number"))
}

/// The identity the home was last prepared for, if any was recorded. An
/// unreadable or garbled record counts as none: the safe answer is "a new
/// start", which clears locks that cannot belong to a live process.
pub fn last_prepared(config: &Config) -> Option<ContainerStartIdentity> {
    let path = config.identity_record_path();
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str(&text) {
        Ok(identity) => Some(identity),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring a garbled identity record");
            None
        }
    }
}

/// Records `identity` as prepared: temp file, fsync, rename, fsync of the
/// directory, so a kill at any point leaves the old or the new record.
pub fn record_prepared(
    config: &Config,
    identity: &ContainerStartIdentity,
) -> Result<(), IdentityError> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};

    let dir = &config.state_dir;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    let path = config.identity_record_path();
    let tmp = path.with_extension("json.tmp");
    let json = serde_json::to_vec(identity).map_err(|e| io(&path)(std::io::Error::other(e)))?;
    let write = || -> std::io::Result<()> {
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(&json)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(io(&path))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake procfs: boot id, the pid-namespace file, PID 1's stat, and
    /// `self` pointing at PID 1 in the same mount namespace.
    pub(crate) struct FakeProc {
        pub root: PathBuf,
    }

    impl FakeProc {
        pub(crate) fn new(base: &Path) -> Self {
            let root = base.join("proc");
            let fake = Self { root };
            fake.set_boot_id("0f3b9c1e-boot");
            fake.add_process("1", 0, 4242, "mnt:[4026531841]");
            fake.set_self("1");
            fake.set_pid_ns("ns-a");
            fake
        }

        pub(crate) fn set_boot_id(&self, id: &str) {
            let dir = self.root.join("sys/kernel/random");
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("boot_id"), format!("{id}\n")).expect("boot_id");
        }

        /// Replaces the pid-namespace "file": a new file is a new inode.
        pub(crate) fn set_pid_ns(&self, content: &str) {
            let ns = self.root.join("ns-files");
            std::fs::create_dir_all(&ns).expect("mkdir");
            let file = ns.join(content);
            std::fs::write(&file, content).expect("ns file");
            let dir = self.root.join("self-dir/ns");
            std::fs::create_dir_all(&dir).expect("mkdir");
            let link = dir.join("pid");
            let _ = std::fs::remove_file(&link);
            symlink(&file, &link).expect("ns link");
        }

        pub(crate) fn add_process(&self, pid: &str, ppid: u32, start: u64, mnt: &str) {
            let dir = self.root.join(pid);
            std::fs::create_dir_all(dir.join("ns")).expect("mkdir");
            // A command name with a space and a parenthesis, as proc(5) allows.
            std::fs::write(
                dir.join("stat"),
                format!(
                    "{pid} (odd) name) S {ppid} 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 10 18446744073709551615\n"
                ),
            )
            .expect("stat");
            let link = dir.join("ns/mnt");
            let _ = std::fs::remove_file(&link);
            symlink(mnt, &link).expect("mnt link");
        }

        /// `self` is a link to the pid directory, like the real one; its
        /// `ns/pid` comes from `self-dir`.
        pub(crate) fn set_self(&self, pid: &str) {
            let link = self.root.join("self");
            let _ = std::fs::remove_file(&link);
            symlink(pid, &link).expect("self link");
            let ns = self.root.join(pid).join("ns/pid");
            let _ = std::fs::remove_file(&ns);
            symlink(self.root.join("self-dir/ns/pid"), &ns).expect("ns/pid link");
        }
    }

    fn config(base: &Path, proc: &FakeProc) -> Config {
        Config {
            proc_root: proc.root.clone(),
            state_dir: base.join("state"),
            ..Config::default()
        }
    }

    #[test]
    fn reads_boot_id_namespace_and_start_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = FakeProc::new(dir.path());
        let config = config(dir.path(), &proc);
        let id = read(&config).expect("identity");
        assert_eq!(id.boot_id, "0f3b9c1e-boot");
        assert_eq!(id.pid1_start_time, 4242);
        assert_ne!(id.pid_ns_inode, 0);
    }

    #[test]
    fn every_part_changes_the_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = FakeProc::new(dir.path());
        let config = config(dir.path(), &proc);
        let first = read(&config).expect("identity");
        assert_eq!(read(&config).expect("again"), first, "stable while running");

        proc.add_process("1", 0, 5000, "mnt:[4026531841]");
        let restarted = read(&config).expect("identity");
        assert_ne!(restarted, first);

        proc.set_boot_id("another-boot");
        let rebooted = read(&config).expect("identity");
        assert_ne!(rebooted, restarted);

        proc.set_pid_ns("ns-b");
        let new_ns = read(&config).expect("identity");
        assert_ne!(new_ns.pid_ns_inode, rebooted.pid_ns_inode);
    }

    #[test]
    fn shared_pid_namespace_uses_the_containers_own_init() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = FakeProc::new(dir.path());
        // PID 1 is the host's init, in the host's mount namespace; the
        // engine's shim (400) too; our init is 500, we are 501.
        proc.add_process("1", 0, 7, "mnt:[1]");
        proc.add_process("400", 1, 90, "mnt:[1]");
        proc.add_process("500", 400, 1234, "mnt:[99]");
        proc.add_process("501", 500, 1300, "mnt:[99]");
        proc.set_self("501");
        let config = config(dir.path(), &proc);
        assert_eq!(read(&config).expect("identity").pid1_start_time, 1234);
    }

    #[test]
    fn record_round_trips_and_garbage_counts_as_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = FakeProc::new(dir.path());
        let config = config(dir.path(), &proc);
        assert_eq!(last_prepared(&config), None);
        let id = read(&config).expect("identity");
        record_prepared(&config, &id).expect("record");
        assert_eq!(last_prepared(&config), Some(id));
        std::fs::write(config.identity_record_path(), "{garbage").expect("write");
        assert_eq!(last_prepared(&config), None);
    }

    #[test]
    fn malformed_stat_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = FakeProc::new(dir.path());
        std::fs::write(proc.root.join("1/stat"), "1 (init) S 0").expect("write");
        let config = config(dir.path(), &proc);
        assert!(matches!(
            read(&config),
            Err(IdentityError::Malformed { .. })
        ));
    }
}
