//! Starting again the browsers a held quiesce closed (`quiesce_hold`, which
//! an export of a running desktop sends): the holds that are open, what
//! they closed, and relaunching the browsers the desktop user had started
//! themselves (the autostarted browser service is the service runner's to
//! start again, [`crate::services::Services::reopen`]).
//!
//! A browser the user started is remembered before it is closed
//! ([`Relaunch::capture`]: its command line, environment and working
//! directory from procfs) and started again the same way — as the desktop
//! user, in a process group of its own, output discarded, in the desktop's
//! environment ([`crate::services::desktop_env`]) with what could be read
//! of its own over it (Chromium makes itself undumpable, so its
//! `environ` is closed to a supervisor without `CAP_SYS_PTRACE`) — once
//! the last hold is released. Chromium gets `--restore-last-session`, so its windows
//! and tabs come back. A browser that did not exit is never started twice,
//! and nothing here ever runs as anyone but the desktop user.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::config::Config;
use crate::init;
use crate::procfs::Stat;

/// Most browsers one hold relaunches.
pub const MAX_RELAUNCHES: usize = 8;

/// Largest command line or environment read from procfs.
const MAX_PROC_TEXT: u64 = 256 * 1024;

/// Field 22 of `/proc/<pid>/stat`: start time after boot, in clock ticks.
const START_TIME: usize = 22;

/// Command names (`/proc/<pid>/comm`) of the Chromium family, which take
/// `--restore-last-session`.
const CHROMIUM_COMMS: &[&str] = &["chromium", "chrome", "google-chrome"];

/// How to start again one browser the desktop user had started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relaunch {
    /// Its pid and start time when captured (to tell whether it still runs).
    pid: u32,
    start_time: u64,
    /// `/proc/<pid>/comm`.
    pub comm: String,
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
}

impl Relaunch {
    /// Reads what it takes to start process `pid` again; `None` when it is
    /// gone or its command line is empty or unreadable.
    pub fn capture(proc_root: &Path, pid: u32) -> Option<Self> {
        let dir = proc_root.join(pid.to_string());
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        let stat = Stat::parse(&stat)?;
        let start_time = stat.number(START_TIME)?;
        let comm = stat.comm().to_owned();
        let argv: Vec<OsString> = nul_separated(&read_bounded(&dir.join("cmdline"))?)
            .into_iter()
            .map(OsString::from_vec)
            .collect();
        if argv.first().is_none_or(|a| a.is_empty()) {
            return None;
        }
        let env = nul_separated(&read_bounded(&dir.join("environ")).unwrap_or_default())
            .into_iter()
            .filter_map(|item| {
                let eq = item.iter().position(|b| *b == b'=')?;
                let (key, value) = item.split_at(eq);
                (!key.is_empty()).then(|| {
                    (
                        OsString::from_vec(key.to_vec()),
                        OsString::from_vec(value[1..].to_vec()),
                    )
                })
            })
            .collect();
        let cwd = std::fs::read_link(dir.join("cwd")).ok();
        Some(Self {
            pid,
            start_time,
            comm,
            argv,
            env,
            cwd,
        })
    }

    /// Whether the captured process still runs (same pid, same start time).
    pub fn still_runs(&self, proc_root: &Path) -> bool {
        let stat = proc_root.join(self.pid.to_string()).join("stat");
        std::fs::read_to_string(stat).is_ok_and(|text| {
            Stat::parse(&text).is_some_and(|s| {
                s.is_live() && s.number::<u64>(START_TIME) == Some(self.start_time)
            })
        })
    }

    /// The command line it is started with again.
    pub fn command_line(&self) -> Vec<OsString> {
        let mut argv = self.argv.clone();
        let restore = OsString::from("--restore-last-session");
        if CHROMIUM_COMMS.contains(&self.comm.as_str()) && !argv.contains(&restore) {
            argv.push(restore);
        }
        argv
    }

    /// Starts it again as the desktop user, in its own process group, in
    /// its old working directory (the home when that is gone); returns the
    /// new pid. The supervisor's reaper reaps it when it ends.
    pub fn spawn(&self, config: &Config) -> std::io::Result<u32> {
        let argv = self.command_line();
        let Some((program, args)) = argv.split_first() else {
            return Err(std::io::Error::other("empty command line"));
        };
        let cwd = self
            .cwd
            .as_deref()
            .filter(|d| d.is_dir())
            .unwrap_or(&config.home);
        let mut cmd = crate::services::desktop_command(config, program);
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let (child, _pipes) = init::spawn(&mut cmd)?;
        Ok(child.pid())
    }
}

/// Up to [`MAX_PROC_TEXT`] bytes of a procfs file.
fn read_bounded(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_PROC_TEXT)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// The NUL-terminated items of `bytes` (a missing last NUL is tolerated).
fn nul_separated(bytes: &[u8]) -> Vec<Vec<u8>> {
    let trimmed = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if trimmed.is_empty() {
        return Vec::new();
    }
    trimmed.split(|b| *b == 0).map(<[u8]>::to_vec).collect()
}

/// What one quiesce closed: the supervised browser services, and the
/// browsers the desktop user had started (those that could be captured).
#[derive(Debug, Default)]
pub struct Closed {
    /// Browser services it stopped.
    pub services: Vec<&'static str>,
    /// Browsers of the user's own, to start again.
    pub user: Vec<Relaunch>,
}

/// The open holds and what they closed, kept by the service runner.
#[derive(Debug, Default)]
pub struct Holds {
    open: usize,
    services: BTreeSet<&'static str>,
    user: Vec<Relaunch>,
}

impl Holds {
    /// A hold began; its quiesce closed `closed`.
    pub fn take(&mut self, closed: Closed) {
        self.open = self.open.saturating_add(1);
        self.services.extend(closed.services);
        for r in closed.user {
            if self.user.len() < MAX_RELAUNCHES && !self.user.contains(&r) {
                self.user.push(r);
            }
        }
    }

    /// A hold ended. When it was the last one, everything the holds closed
    /// is handed back to be started again (and forgotten here).
    pub fn release(&mut self) -> Option<Closed> {
        self.open = self.open.saturating_sub(1);
        if self.open > 0 {
            return None;
        }
        Some(Closed {
            services: std::mem::take(&mut self.services).into_iter().collect(),
            user: std::mem::take(&mut self.user),
        })
    }

    /// How many holds are open.
    pub fn open(&self) -> usize {
        self.open
    }
}

/// Starts again the user's browsers of `closed` that no longer run; returns
/// a description of each one started.
pub fn relaunch(config: &Config, user: &[Relaunch]) -> Vec<String> {
    let mut started = Vec::new();
    for r in user {
        if r.still_runs(&config.proc_root) {
            tracing::info!(comm = %r.comm, pid = r.pid, "browser still runs; not started again");
            continue;
        }
        match r.spawn(config) {
            Ok(pid) => {
                tracing::info!(comm = %r.comm, old_pid = r.pid, pid, "browser started again");
                started.push(format!("{} ({pid})", r.comm));
            }
            Err(e) => tracing::warn!(comm = %r.comm, error = %e, "cannot start a browser again"),
        }
    }
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(root: &Path, pid: u32, comm: &str, start: u64, cmdline: &[u8], environ: &[u8]) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("stat"),
            format!(
                "{pid} ({comm}) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 10\n"
            ),
        )
        .expect("stat");
        std::fs::write(dir.join("cmdline"), cmdline).expect("cmdline");
        std::fs::write(dir.join("environ"), environ).expect("environ");
    }

    #[test]
    fn a_capture_keeps_the_command_line_and_environment_and_knows_its_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fake(
            root,
            42,
            "chromium",
            777,
            b"/usr/lib/chromium/chromium\0--no-sandbox\0http://a b/\0",
            b"DISPLAY=:1\0HOME=/home/desk\0=junk\0EQ=a=b\0",
        );
        let r = Relaunch::capture(root, 42).expect("captured");
        assert_eq!(r.comm, "chromium");
        assert_eq!(
            r.command_line(),
            [
                "/usr/lib/chromium/chromium",
                "--no-sandbox",
                "http://a b/",
                "--restore-last-session"
            ]
            .map(OsString::from)
        );
        assert_eq!(
            r.env,
            [("DISPLAY", ":1"), ("HOME", "/home/desk"), ("EQ", "a=b")]
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        );
        assert!(r.still_runs(root));
        // The pid now names another process (another start time): not it.
        fake(root, 42, "chromium", 778, b"x\0", b"");
        assert!(!r.still_runs(root));
        std::fs::remove_dir_all(root.join("42")).expect("rm");
        assert!(!r.still_runs(root));
        // Nothing to start from: an empty command line (a kernel thread).
        fake(root, 43, "kworker", 1, b"", b"");
        assert_eq!(Relaunch::capture(root, 43), None);
        assert_eq!(Relaunch::capture(root, 44), None);
    }

    #[test]
    fn firefox_is_started_with_its_own_command_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        fake(dir.path(), 7, "firefox-esr", 5, b"firefox-esr\0-P\0x", b"");
        let r = Relaunch::capture(dir.path(), 7).expect("captured");
        assert_eq!(
            r.command_line(),
            ["firefox-esr", "-P", "x"].map(OsString::from)
        );
    }

    #[test]
    fn what_holds_closed_comes_back_only_with_the_last_release() {
        let dir = tempfile::tempdir().expect("tempdir");
        fake(dir.path(), 9, "firefox-esr", 5, b"firefox-esr\0", b"");
        let firefox = Relaunch::capture(dir.path(), 9).expect("captured");
        let mut holds = Holds::default();
        holds.take(Closed {
            services: vec!["browser"],
            user: vec![firefox.clone()],
        });
        // A second export while the first one reads: its quiesce found
        // everything closed already.
        holds.take(Closed {
            services: vec!["browser"],
            user: vec![],
        });
        assert_eq!(holds.open(), 2);
        assert!(holds.release().is_none(), "one hold is still open");
        let back = holds.release().expect("the last release");
        assert_eq!(back.services, ["browser"]);
        assert_eq!(back.user, [firefox]);
        assert_eq!(holds.open(), 0);
        // Forgotten once handed back.
        holds.take(Closed::default());
        let again = holds.release().expect("released");
        assert!(again.services.is_empty() && again.user.is_empty());
    }
}
