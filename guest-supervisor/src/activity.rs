//! Guest activity for the broker's idle timer: input idle time and busy
//! processes.
//!
//! Owns reading the X server's input idle time (MIT-SCREEN-SAVER `QueryInfo`)
//! and sampling the CPU use of the desktop user's processes from
//! `config.proc_root`. It only reads: it must never signal, renice or
//! otherwise touch the processes it looks at.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use dormouse_protocol::{Activity, BusyProcess};
use x11rb::protocol::screensaver::ConnectionExt as _;

use crate::config::Config;
use crate::procfs::{self, Stat};
use crate::x_client::{self, XError};

/// Clock ticks per second of the times in `/proc/<pid>/stat` (`USER_HZ`).
/// The kernel reports in this unit whatever its internal `HZ`; it is 100 on
/// every architecture a container of this image runs on.
pub const USER_HZ: u64 = 100;

/// Most busy processes listed in one answer, busiest first.
pub const MAX_LISTED: usize = 16;

/// CPU time of one process at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTime {
    /// Command name.
    pub comm: String,
    /// `utime + stime` in [`USER_HZ`] ticks (all threads of the process).
    pub ticks: u64,
}

/// CPU times of every process of one uid, by pid.
pub type CpuSnapshot = HashMap<u32, CpuTime>;

/// Reads the CPU time of every process whose real uid is `uid`. Processes
/// that vanish while being read are skipped; only an unreadable `proc_root`
/// is an error.
pub fn cpu_snapshot(proc_root: &Path, uid: u32) -> std::io::Result<CpuSnapshot> {
    let mut out = CpuSnapshot::new();
    for (pid, dir) in procfs::pid_dirs(proc_root)? {
        // The uid first: other users' processes need no `stat` read.
        if procfs::real_uid(&dir) != Some(uid) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        if let Some(time) = Stat::parse(&stat).and_then(|s| cpu_time(&s)) {
            out.insert(pid, time);
        }
    }
    Ok(out)
}

/// Command name and `utime + stime` of one process.
fn cpu_time(stat: &Stat<'_>) -> Option<CpuTime> {
    let utime: u64 = stat.number(Stat::UTIME)?;
    let stime: u64 = stat.number(Stat::STIME)?;
    Some(CpuTime {
        comm: stat.comm().to_owned(),
        ticks: utime.saturating_add(stime),
    })
}

/// The processes of `after` that used more than `threshold_percent` of one
/// core over `elapsed`, busiest first, at most [`MAX_LISTED`].
///
/// A pid absent from `before` started during the interval (or right at its
/// start), so all of its CPU time counts: a burst of short compiler runs is
/// work, not idleness. A pid whose name changed was reused and counts anew.
pub fn busy_between(
    before: &CpuSnapshot,
    after: &CpuSnapshot,
    elapsed: Duration,
    threshold_percent: f64,
) -> Vec<BusyProcess> {
    let seconds = elapsed.as_secs_f64();
    if seconds <= 0.0 {
        return Vec::new();
    }
    let mut busy: Vec<BusyProcess> = after
        .iter()
        .filter_map(|(pid, now)| {
            let used = match before.get(pid) {
                Some(then) if then.comm == now.comm => now.ticks.saturating_sub(then.ticks),
                _ => now.ticks,
            };
            let cpu_percent = used as f64 / USER_HZ as f64 / seconds * 100.0;
            (cpu_percent > threshold_percent).then(|| BusyProcess {
                pid: *pid,
                comm: now.comm.clone(),
                cpu_percent: (cpu_percent * 10.0).round() / 10.0,
            })
        })
        .collect();
    busy.sort_by(|a, b| {
        b.cpu_percent
            .total_cmp(&a.cpu_percent)
            .then(a.pid.cmp(&b.pid))
    });
    busy.truncate(MAX_LISTED);
    busy
}

/// Samples the desktop user's processes over `config.busy_sample_ms`.
pub async fn sample_busy(config: &Config) -> std::io::Result<Vec<BusyProcess>> {
    let proc_root = config.proc_root.clone();
    let uid = config.uid;
    let first = {
        let proc_root = proc_root.clone();
        tokio::task::spawn_blocking(move || cpu_snapshot(&proc_root, uid))
            .await
            .map_err(std::io::Error::other)??
    };
    // tokio's clock, so the interval is the one the sleep measured (and a
    // paused test clock is honoured).
    let started = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(config.busy_sample_ms)).await;
    let second = tokio::task::spawn_blocking(move || cpu_snapshot(&proc_root, uid))
        .await
        .map_err(std::io::Error::other)??;
    let elapsed = started.elapsed();
    Ok(busy_between(
        &first,
        &second,
        elapsed,
        config.busy_cpu_percent,
    ))
}

/// Milliseconds since the last keyboard or pointer input on the display.
pub async fn input_idle_ms(config: &Config) -> Result<u64, XError> {
    let bound = Duration::from_millis(config.probe_timeout_ms);
    x_client::with_display(config, bound, |conn, screen| {
        let root = x_client::root_window(conn, screen)?;
        let info = conn.screensaver_query_info(root)?.reply()?;
        Ok(u64::from(info.ms_since_user_input))
    })
    .await
}

/// The more recent of two inputs (idle times in ms; `None`: no such input).
fn latest_input(x_idle_ms: Option<u64>, terminal_idle_ms: Option<u64>) -> Option<u64> {
    match (x_idle_ms, terminal_idle_ms) {
        (Some(x), Some(t)) => Some(x.min(t)),
        (x, t) => x.or(t),
    }
}

/// The answer to `activity`: input idle time (X input when X answers, and
/// keystrokes into terminal sessions) and busy processes, sampled
/// concurrently.
pub async fn sample(config: &Config) -> Activity {
    let (idle, busy) = tokio::join!(input_idle_ms(config), sample_busy(config));
    let x_idle_ms = idle
        .map_err(|e| tracing::debug!(error = %e, "input idle time unavailable"))
        .ok();
    let input_idle_ms = latest_input(x_idle_ms, crate::exec::terminal_input_idle_ms());
    let busy_processes = busy.unwrap_or_else(|e| {
        tracing::warn!(error = %e, proc_root = %config.proc_root.display(), "cannot sample processes");
        Vec::new()
    });
    Activity {
        input_idle_ms,
        // A running exec is work, however little CPU it takes.
        busy: !busy_processes.is_empty() || crate::exec::running_execs() > 0,
        busy_processes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Writes a fake `/proc/<pid>` with the given uid and CPU ticks.
    fn fake_process(root: &Path, pid: u32, uid: u32, comm: &str, utime: u64, stime: u64) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("status"),
            format!("Name:\t{comm}\nState:\tR (running)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .expect("status");
        // Fields 3..=22 with utime (14) and stime (15) filled in.
        std::fs::write(
            dir.join("stat"),
            format!("{pid} ({comm}) R 1 {pid} {pid} 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 1 0 12345 1000000 100\n"),
        )
        .expect("stat");
    }

    #[test]
    fn terminal_input_counts_like_x_input() {
        assert_eq!(latest_input(Some(5000), Some(20)), Some(20));
        assert_eq!(latest_input(Some(10), Some(20_000)), Some(10));
        assert_eq!(latest_input(None, Some(20)), Some(20));
        assert_eq!(latest_input(Some(7), None), Some(7));
        assert_eq!(latest_input(None, None), None);
    }

    fn proc_dir() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("proc");
        std::fs::create_dir_all(&root).expect("mkdir");
        // Noise that is not a process.
        std::fs::create_dir_all(root.join("sys/kernel")).expect("mkdir");
        std::fs::write(root.join("uptime"), "1.0 1.0\n").expect("uptime");
        (dir, root)
    }

    #[test]
    fn snapshot_reads_only_the_uid_and_survives_odd_names() {
        let (_dir, root) = proc_dir();
        fake_process(&root, 10, 1000, "chromium", 50, 25);
        fake_process(&root, 11, 0, "Xvfb-root", 999, 999);
        fake_process(&root, 12, 1000, "my (odd) name", 1, 2);
        // A process that vanished between readdir and read.
        std::fs::create_dir_all(root.join("13")).expect("mkdir");
        let snap = cpu_snapshot(&root, 1000).expect("snapshot");
        assert_eq!(snap.len(), 2);
        assert_eq!(
            snap[&10],
            CpuTime {
                comm: "chromium".into(),
                ticks: 75
            }
        );
        assert_eq!(snap[&12].comm, "my (odd) name");
        assert_eq!(snap[&12].ticks, 3);
    }

    #[test]
    fn busy_processes_are_those_over_the_threshold() {
        let (_dir, root) = proc_dir();
        fake_process(&root, 10, 1000, "cc1", 100, 0);
        fake_process(&root, 11, 1000, "sleepy", 100, 0);
        fake_process(&root, 12, 1000, "reused", 500, 0);
        let before = cpu_snapshot(&root, 1000).expect("before");
        // Over 200 ms: cc1 used 18 ticks (90 %), sleepy 1 tick (5 %), pid 12
        // is a new process that used 10 ticks (50 %), and pid 14 appeared.
        fake_process(&root, 10, 1000, "cc1", 110, 8);
        fake_process(&root, 11, 1000, "sleepy", 101, 0);
        fake_process(&root, 12, 1000, "make", 6, 4);
        fake_process(&root, 14, 1000, "ld", 2, 0);
        let after = cpu_snapshot(&root, 1000).expect("after");
        let busy = busy_between(&before, &after, Duration::from_millis(200), 20.0);
        let summary: Vec<(u32, &str, f64)> = busy
            .iter()
            .map(|b| (b.pid, b.comm.as_str(), b.cpu_percent))
            .collect();
        assert_eq!(summary, vec![(10, "cc1", 90.0), (12, "make", 50.0)]);
        // Pid 14 used 2 ticks = 10 %: under the threshold.
        assert!(
            busy_between(&before, &after, Duration::from_millis(200), 5.0)
                .iter()
                .any(|b| b.pid == 14)
        );
    }

    #[test]
    fn a_zero_interval_is_never_busy() {
        let mut after = CpuSnapshot::new();
        after.insert(
            1,
            CpuTime {
                comm: "x".into(),
                ticks: 1000,
            },
        );
        assert!(busy_between(&CpuSnapshot::new(), &after, Duration::ZERO, 1.0).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn activity_without_x_reports_idle_unknown_and_samples_proc() {
        let (dir, root) = proc_dir();
        fake_process(&root, 10, 1000, "idle-shell", 5, 5);
        let config = Config {
            proc_root: root,
            tmp_dir: dir.path().join("tmp"),
            ..Config::default()
        };
        let activity = sample(&config).await;
        assert_eq!(activity.input_idle_ms, None);
        assert!(!activity.busy);
        assert!(activity.busy_processes.is_empty());
    }

    #[tokio::test]
    async fn a_missing_proc_root_is_an_error_not_a_panic() {
        let config = Config {
            proc_root: "/nonexistent/proc".into(),
            busy_sample_ms: 1,
            ..Config::default()
        };
        assert!(sample_busy(&config).await.is_err());
    }
}
