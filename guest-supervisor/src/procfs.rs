//! Reading processes from procfs: the numeric entries of a proc root, the
//! fields of `/proc/<pid>/stat` and the real uid in `/proc/<pid>/status`.
//!
//! Owns the parsing of those files, once, for identity, activity and stop,
//! and listing the live processes ([`processes`]).
//! Callers always pass the root (`config.proc_root`), so tests run this code
//! on fake files. It only reads: it must never signal or otherwise touch a
//! process, and it decides nothing about what it reads.

use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The process entries of `proc_root`: `(pid, /proc/<pid>)` for every entry
/// whose name is a number. Entries that cannot be read are skipped; a
/// process may still vanish before its files are read, so callers skip
/// what they cannot read too. Only an unreadable `proc_root` is an error.
pub fn pid_dirs(proc_root: &Path) -> std::io::Result<impl Iterator<Item = (u32, PathBuf)>> {
    Ok(std::fs::read_dir(proc_root)?.filter_map(|entry| {
        let entry = entry.ok()?;
        let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
        Some((pid, entry.path()))
    }))
}

/// The real uid of the process in `dir` (`/proc/<pid>`): the first number of
/// the `Uid:` line of its `status`. `None` when the process is gone or the
/// file has no such line.
pub fn real_uid(dir: &Path) -> Option<u32> {
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One process as seen in procfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Parent's id.
    pub ppid: u32,
    /// Process group id.
    pub pgid: u32,
    /// Real uid.
    pub uid: u32,
    /// Command name.
    pub comm: String,
}

/// Every live (not zombie) process in `proc_root`, by pid.
pub fn processes(proc_root: &Path) -> std::io::Result<Vec<ProcessInfo>> {
    // A process may vanish between readdir and read: skip it.
    let mut all: Vec<ProcessInfo> = pid_dirs(proc_root)?
        .filter_map(|(pid, dir)| read_process(&dir, pid))
        .collect();
    all.sort_by_key(|p| p.pid);
    Ok(all)
}

fn read_process(dir: &Path, pid: u32) -> Option<ProcessInfo> {
    let text = std::fs::read_to_string(dir.join("stat")).ok()?;
    let stat = Stat::parse(&text)?;
    if !stat.is_live() {
        return None;
    }
    Some(ProcessInfo {
        pid,
        ppid: stat.number(Stat::PPID)?,
        pgid: stat.number(Stat::PGRP)?,
        uid: real_uid(dir)?,
        comm: stat.comm().to_owned(),
    })
}

/// The contents of one `/proc/<pid>/stat`, split at the command name.
///
/// The command name (field 2) sits in parentheses and may itself hold spaces
/// and `)`, so it runs from the first `(` to the *last* `)`, and the other
/// fields are counted after that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat<'a> {
    comm: &'a str,
    rest: &'a str,
}

impl<'a> Stat<'a> {
    /// Field 3: the state letter (`R`, `S`, `Z`, …).
    pub const STATE: usize = 3;
    /// Field 4: the parent's pid.
    pub const PPID: usize = 4;
    /// Field 5: the process group id.
    pub const PGRP: usize = 5;
    /// Field 14: user-mode CPU time in clock ticks.
    pub const UTIME: usize = 14;
    /// Field 15: kernel-mode CPU time in clock ticks.
    pub const STIME: usize = 15;
    /// Field 22: start time in clock ticks after boot.
    pub const START_TIME: usize = 22;

    /// Splits `text`; `None` when it has no parenthesised command name.
    pub fn parse(text: &'a str) -> Option<Self> {
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        Some(Stat {
            comm: text.get(open + 1..close)?,
            rest: text.get(close + 1..)?,
        })
    }

    /// The command name (field 2), without its parentheses.
    pub fn comm(&self) -> &'a str {
        self.comm
    }

    /// Field `n`, 1-based as in proc(5), for `n` of 3 and up; `None` when
    /// the file has fewer fields.
    pub fn field(&self, n: usize) -> Option<&'a str> {
        self.rest
            .split_whitespace()
            .nth(n.checked_sub(Self::STATE)?)
    }

    /// Field `n` as a number; `None` when missing or not a number.
    pub fn number<T: FromStr>(&self, n: usize) -> Option<T> {
        self.field(n)?.parse().ok()
    }

    /// The state letter (field 3).
    pub fn state(&self) -> Option<&'a str> {
        self.field(Self::STATE)
    }

    /// Whether the process has exited and only awaits its reaping: a zombie
    /// (`Z`) or dead (`X`).
    pub fn has_exited(&self) -> bool {
        matches!(self.state(), Some("Z" | "X"))
    }

    /// Whether the process is alive: it has a state and has not exited.
    pub fn is_live(&self) -> bool {
        self.state().is_some() && !self.has_exited()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let text = "42 (my (odd) name) S 7 42 42 0 -1 0 0 0 0 0 11 22 0 0 20 0 1 0 12345 1 1\n";
        let stat = Stat::parse(text).expect("parses");
        assert_eq!(stat.comm(), "my (odd) name");
        assert_eq!(stat.state(), Some("S"));
        assert_eq!(stat.number::<u32>(Stat::PPID), Some(7));
        assert_eq!(stat.number::<u32>(Stat::PGRP), Some(42));
        assert_eq!(stat.number::<u64>(Stat::UTIME), Some(11));
        assert_eq!(stat.number::<u64>(Stat::STIME), Some(22));
        assert_eq!(stat.number::<u64>(Stat::START_TIME), Some(12345));
        assert_eq!(stat.field(99), None);
        assert_eq!(stat.field(2), None, "the name is not a counted field");
        assert!(stat.is_live());
        assert!(!stat.has_exited());
    }

    #[test]
    fn zombies_and_garbage() {
        let zombie = Stat::parse("9 (sleep) Z 1 9 9").expect("parses");
        assert!(zombie.has_exited());
        assert!(!zombie.is_live());
        let cut = Stat::parse("9 (sleep)").expect("parses");
        assert!(!cut.has_exited());
        assert!(!cut.is_live());
        assert_eq!(Stat::parse("no name here"), None);
    }

    #[test]
    fn pid_dirs_lists_only_numeric_entries_and_uids_come_from_status() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("12")).expect("mkdir");
        std::fs::create_dir_all(root.join("3")).expect("mkdir");
        std::fs::create_dir_all(root.join("sys/kernel")).expect("mkdir");
        std::fs::write(root.join("uptime"), "1.0 1.0\n").expect("uptime");
        std::fs::write(root.join("12/status"), "Name:\tx\nUid:\t1000\t0\t0\t0\n").expect("status");
        let mut pids: Vec<(u32, PathBuf)> = pid_dirs(root).expect("list").collect();
        pids.sort();
        assert_eq!(pids, [(3, root.join("3")), (12, root.join("12"))]);
        assert_eq!(real_uid(&root.join("12")), Some(1000));
        assert_eq!(real_uid(&root.join("3")), None, "vanished");
        assert!(pid_dirs(&root.join("missing")).is_err());
    }
}
