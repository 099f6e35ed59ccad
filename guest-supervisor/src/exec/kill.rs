//! Finding every process of one exec and killing it, confirmed.
//!
//! Owns the scan of `/proc` for an exec's processes, the kill of each one
//! through a pidfd, and the confirmation that none is left. It signals only
//! processes it has just re-verified as the exec's own (by tag or by
//! parent); it never signals by name, by uid or by a pid it read earlier
//! without checking it again.
//!
//! A process belongs to the exec of tag gid `T` when
//! - its `Groups:` line in `/proc/<pid>/status` holds `T` (every process of
//!   the exec inherits it; an unprivileged process cannot drop a
//!   supplementary group, and the container's `no-new-privileges` keeps
//!   set-uid programs from doing it for them), or
//! - its parent (`PPid:`) belongs to the exec (a descendant that lost the
//!   tag through a privileged program is still found while its parent
//!   lives).
//!
//! Zombies count as not yet gone: the reaper (PID 1, or the subreaper)
//! collects them, and the confirmation waits for that.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use tokio::time::Instant;

use crate::pidfd::Pidfd;
use crate::procfs;

/// Most pids named in an [`KillError::Unkillable`].
const MAX_NAMED: usize = 16;

/// Why the processes of an exec could not be confirmed gone.
#[derive(Debug, thiserror::Error)]
pub enum KillError {
    /// Some of them were still there when the bound passed (stuck in an
    /// uninterruptible sleep, or forking faster than they are killed).
    #[error("processes still present after {waited_ms} ms: {pids:?}")]
    Unkillable {
        /// Some of the pids left (at most 16).
        pids: Vec<u32>,
        /// How long the kill went on.
        waited_ms: u64,
    },
    /// `/proc` could not be listed.
    #[error("cannot scan {}: {source}", root.display())]
    Proc {
        /// The proc root.
        root: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

/// What a kill came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KillReport {
    /// Live processes of the exec that were killed (by the group kill or
    /// one by one): 0 for a command that left nothing behind.
    pub killed: usize,
    /// Scans of `/proc` it took.
    pub scans: usize,
}

/// One process as the scan saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    pid: u32,
    ppid: u32,
    zombie: bool,
    tagged: bool,
}

/// The fields of `/proc/<pid>/status` the scan needs.
fn read_status(dir: &Path, pid: u32, tag_gid: u32) -> Option<Seen> {
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let mut ppid = None;
    let mut zombie = false;
    let mut tagged = false;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("State:") {
            zombie = matches!(rest.trim_start().as_bytes().first(), Some(b'Z' | b'X'));
        } else if let Some(rest) = line.strip_prefix("PPid:") {
            ppid = rest.trim().parse().ok();
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            tagged = rest
                .split_whitespace()
                .any(|g| g.parse::<u32>().ok() == Some(tag_gid));
        }
    }
    Some(Seen {
        pid,
        ppid: ppid?,
        zombie,
        tagged,
    })
}

/// Every process of the exec of `tag_gid`: the tagged ones and their
/// descendants. Processes that vanish while being read are skipped.
fn members(proc_root: &Path, tag_gid: u32) -> Result<Vec<Seen>, KillError> {
    let all: Vec<Seen> = procfs::pid_dirs(proc_root)
        .map_err(|source| KillError::Proc {
            root: proc_root.to_owned(),
            source,
        })?
        .filter_map(|(pid, dir)| read_status(&dir, pid, tag_gid))
        .collect();
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, seen) in all.iter().enumerate() {
        children.entry(seen.ppid).or_default().push(i);
    }
    let mut member: HashSet<u32> = HashSet::new();
    let mut queue: Vec<u32> = all.iter().filter(|s| s.tagged).map(|s| s.pid).collect();
    while let Some(pid) = queue.pop() {
        if !member.insert(pid) {
            continue;
        }
        if let Some(kids) = children.get(&pid) {
            queue.extend(kids.iter().filter_map(|&i| all.get(i)).map(|s| s.pid));
        }
    }
    Ok(all
        .into_iter()
        .filter(|s| member.contains(&s.pid))
        .collect())
}

/// Whether this kernel (and seccomp profile) gives pidfds, so kills cannot
/// hit a reused pid. Without them the kill falls back to check-then-kill by
/// pid (see `kill_verified`); worth a line in the start log.
pub fn pidfds_available() -> bool {
    crate::pidfd::available()
}

/// Kills `seen` if, after its pidfd is open, it still belongs to the exec:
/// the pidfd pins the process, so a pid reused between the scan and the
/// check is caught by the check, and one reused after the check is never
/// reached. `true` when a signal was sent.
fn kill_verified(proc_root: &Path, seen: Seen, tag_gid: u32, members: &HashSet<u32>) -> bool {
    let still_ours = || {
        read_status(&proc_root.join(seen.pid.to_string()), seen.pid, tag_gid)
            .is_some_and(|now| now.tagged || (now.ppid == seen.ppid && members.contains(&now.ppid)))
    };
    match Pidfd::open(seen.pid) {
        Ok(fd) => still_ours() && fd.signal(nix::sys::signal::Signal::SIGKILL).is_ok(),
        Err(Errno::ESRCH) => false,
        // No pidfds (a kernel before 5.3, or a seccomp profile without
        // them): check, then kill by pid. The window between the two is
        // the pid-reuse race pidfds close; it needs the pid space to wrap
        // within microseconds.
        Err(_) => {
            let Ok(pid) = i32::try_from(seen.pid) else {
                return false;
            };
            still_ours()
                && nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .is_ok()
        }
    }
}

/// Sends `SIGKILL` to every live member of `found`; returns the pids of
/// those it reached.
fn kill_members(proc_root: &Path, tag_gid: u32, found: &[Seen]) -> Vec<u32> {
    let pids: HashSet<u32> = found.iter().map(|s| s.pid).collect();
    found
        .iter()
        .filter(|s| !s.zombie)
        .filter(|s| kill_verified(proc_root, **s, tag_gid, &pids))
        .map(|s| s.pid)
        .collect()
}

async fn blocking<T: Send + 'static>(
    proc_root: &Path,
    f: impl FnOnce(PathBuf) -> Result<T, KillError> + Send + 'static,
) -> Result<T, KillError> {
    let root = proc_root.to_owned();
    tokio::task::spawn_blocking(move || f(root))
        .await
        .map_err(|e| KillError::Proc {
            root: proc_root.to_owned(),
            source: std::io::Error::other(e),
        })?
}

/// Kills every process of the exec of `tag_gid` and returns once a scan
/// finds none of them, twice in a row, at most `bound` after it started.
///
/// `group_kill` runs once, after the first scan and before the first
/// individual kill: the caller's chance to kill the exec's process group
/// at once (atomic against forks inside the group) while its leader is
/// surely its own. The first scan's members count as killed either way.
///
/// Twice, because one scan of `/proc` is not atomic: a member that forks
/// while the scan passes may have its child at a lower pid (after the pid
/// space wrapped) than the scan's position, and the second scan sees it.
pub async fn kill_all(
    proc_root: &Path,
    tag_gid: u32,
    bound: Duration,
    group_kill: impl FnOnce(),
) -> Result<KillReport, KillError> {
    let started = Instant::now();
    let deadline = started + bound;
    let mut killed: HashSet<u32> = HashSet::new();
    let mut scans = 1;
    let first = blocking(proc_root, move |root| members(&root, tag_gid)).await?;
    group_kill();
    let mut found = first.clone();
    killed.extend(first.iter().filter(|s| !s.zombie).map(|s| s.pid));
    killed.extend(
        blocking(proc_root, move |root| {
            Ok(kill_members(&root, tag_gid, &first))
        })
        .await?,
    );
    let mut empty_scans = 0;
    let mut pause = Duration::from_millis(1);
    loop {
        if found.is_empty() {
            empty_scans += 1;
            if empty_scans == 2 {
                return Ok(KillReport {
                    killed: killed.len(),
                    scans,
                });
            }
        } else {
            empty_scans = 0;
            if Instant::now() >= deadline {
                return Err(KillError::Unkillable {
                    pids: found.iter().map(|s| s.pid).take(MAX_NAMED).collect(),
                    waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                });
            }
            // Killed processes need a moment to exit and be reaped.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        let (seen, reached) = blocking(proc_root, move |root| {
            let seen = members(&root, tag_gid)?;
            let reached = kill_members(&root, tag_gid, &seen);
            Ok((seen, reached))
        })
        .await?;
        scans += 1;
        killed.extend(reached);
        found = seen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(root: &Path, pid: u32, ppid: u32, state: &str, groups: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("status"),
            format!(
                "Name:\tx\nState:\t{state}\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t{ppid}\n\
                 Uid:\t1000\t1000\t1000\t1000\nGroups:\t{groups}\nNSsid:\t{pid}\n"
            ),
        )
        .expect("status");
    }

    #[test]
    fn members_are_the_tagged_and_their_descendants() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fake(root, 1, 0, "S (sleeping)", "");
        fake(root, 10, 1, "S (sleeping)", "65000 ");
        fake(root, 11, 10, "R (running)", "65000");
        // Lost the tag (a privileged program), still a child of a member.
        fake(root, 12, 11, "S (sleeping)", "");
        fake(root, 13, 12, "Z (zombie)", "");
        // Another exec, and a desktop service of the same uid.
        fake(root, 20, 1, "S (sleeping)", "65001");
        fake(root, 30, 1, "S (sleeping)", "1000");
        // A gid that merely starts with the tag's digits.
        fake(root, 31, 1, "S (sleeping)", "650001");
        std::fs::create_dir_all(root.join("40")).expect("vanished");
        let mut found = members(root, 65000).expect("scan");
        found.sort_by_key(|s| s.pid);
        let pids: Vec<(u32, bool, bool)> =
            found.iter().map(|s| (s.pid, s.tagged, s.zombie)).collect();
        assert_eq!(
            pids,
            [
                (10, true, false),
                (11, true, false),
                (12, false, false),
                (13, false, true)
            ]
        );
        assert!(members(&root.join("missing"), 65000).is_err());
    }
}
