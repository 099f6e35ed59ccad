//! Support for tests that run against the real Docker engine: skipping (or, under
//! `CI=true`, failing) when there is no engine, unique labelled names, and
//! guards that remove what a test made even when it panics.
//!
//! Used by the end-to-end tests in `tests/tests/`, by the chaos harness and
//! the benchmark (`src/bin/`), and by the real-engine tests of the supervisor
//! and broker crates (as a dev-dependency). The modules below drive a real
//! `dormoused` ([`broker`]), speak its API ([`client`]), look at the engine
//! ([`engine`]), cut its event stream ([`proxy`]) and play the user inside
//! a desktop ([`guest`], [`markers`], [`browser`]).

// A test-support crate: a failed unwrap is a failed test, said loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod archive;
pub mod broker;
pub mod browser;
pub mod client;
pub mod desk;
pub mod engine;
pub mod frames;
pub mod guest;
pub mod handover;
pub mod hostile;
pub mod latency;
pub mod markers;
pub mod proxy;
pub mod rfb;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Label every container a test makes carries, so `docker rm` can find strays.
pub const TEST_LABEL: &str = "dev.dormouse.test";

/// Image tests run by default.
pub const DEFAULT_IMAGE: &str = "dormouse/desktop:latest";

/// Whether the engine answers. Without it: under `CI=true` this panics (a test
/// that needs Docker must never skip silently there), else it prints a visible
/// message and returns `false` so the caller can return early.
pub fn docker_available(test: &str) -> bool {
    let ok = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{test}: the Docker engine is not reachable and CI=true: failing, not skipping");
        }
        eprintln!("SKIPPED {test}: no Docker engine reachable (set CI=true to make this fail)");
    }
    ok
}

/// The desktop image under test: `$DORMOUSE_TEST_IMAGE` or `dormouse/desktop:latest`.
/// Returns `None` (with a visible message, or a panic under `CI=true`) when absent.
pub fn desktop_image(test: &str) -> Option<String> {
    let image = std::env::var("DORMOUSE_TEST_IMAGE").unwrap_or_else(|_| DEFAULT_IMAGE.into());
    let out = docker(&["image", "inspect", "--format", "{{.Id}}", &image]);
    if out.status.success() {
        return Some(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: image {image} is missing and CI=true: run scripts/build-image first");
    }
    eprintln!("SKIPPED {test}: image {image} missing (run scripts/build-image)");
    None
}

/// The image a real-engine test runs on, or `None` (the test skips, having
/// said why) without an engine or an image: [`docker_available`] then
/// [`desktop_image`].
pub fn test_image(test: &str) -> Option<String> {
    if !docker_available(test) {
        return None;
    }
    desktop_image(test)
}

/// A name unique to this process and call: `<prefix>-<pid>-<n>-<nanos>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{}-{nanos:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// How a harness was asked to stop before its work was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// Ctrl-C (SIGINT).
    Interrupted,
    /// SIGTERM.
    Terminated,
}

impl Termination {
    /// The exit status a shell gives for the signal (128 + its number).
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Interrupted => 130,
            Self::Terminated => 143,
        }
    }
}

impl std::fmt::Display for Termination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Interrupted => "interrupted (SIGINT)",
            Self::Terminated => "terminated (SIGTERM)",
        })
    }
}

/// Resolves on Ctrl-C or SIGTERM; an error when the handlers cannot be
/// installed. A harness races its run against it in `tokio::select!`:
/// dropping the run drops its fixtures, which remove what it made.
pub async fn termination() -> std::io::Result<Termination> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted.map(|()| Termination::Interrupted),
        _ = term.recv() => Ok(Termination::Terminated),
    }
}

/// Runs a benchmark's `run` to its end or to Ctrl-C or SIGTERM, whichever
/// comes first, and gives the process's exit status; errors and signals are
/// printed under `name`. Dropping `run` on a signal drops its fixtures,
/// which remove what it made.
pub async fn run_to_end_or_signal(
    name: &str,
    run: impl std::future::Future<Output = anyhow::Result<()>>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    tokio::select! {
        result = run => match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name}: {e:#}");
                ExitCode::FAILURE
            }
        },
        how = termination() => match how {
            Ok(how) => {
                eprintln!("{name}: {how}; removing its desktops");
                ExitCode::from(how.exit_code())
            }
            Err(e) => {
                eprintln!("{name}: cannot watch the signals: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// The seed given, else the Unix time in seconds (a harness prints it, so
/// the run can be repeated).
pub fn seed_or_now(seed: Option<u64>) -> u64 {
    seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    })
}

/// Runs `docker` with these arguments.
pub fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI can be spawned")
}

/// Runs `docker` and returns trimmed stdout, panicking with stderr on failure.
pub fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Removes a container (and its anonymous volumes) when dropped.
#[derive(Debug)]
pub struct ContainerGuard {
    /// Container name.
    pub name: String,
}

impl ContainerGuard {
    /// Guards a container by name (it need not exist yet).
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", "-v", &self.name]);
    }
}

/// A temporary directory that is removed when dropped, even if files in it
/// belong to uid 1000 from inside a container (we run as root on CI).
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `$TMPDIR/<prefix>-<unique>`.
    pub fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(unique_name(prefix));
        std::fs::create_dir_all(&path).unwrap();
        Self { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes every container with [`TEST_LABEL`] whose name starts with `prefix`;
/// a safety net for runs that were killed before their guards dropped.
pub fn remove_stray_containers(prefix: &str) {
    let ids = docker_ok(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label={TEST_LABEL}"),
        "--filter",
        &format!("name={prefix}"),
    ]);
    for id in ids.lines().filter(|l| !l.is_empty()) {
        let _ = docker(&["rm", "-f", "-v", id]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_seed_is_kept_and_signals_exit_as_a_shell_says() {
        assert_eq!(seed_or_now(Some(7)), 7);
        assert!(seed_or_now(None) > 1_700_000_000);
        assert_eq!(Termination::Interrupted.exit_code(), 130);
        assert_eq!(Termination::Terminated.exit_code(), 143);
        assert_eq!(Termination::Terminated.to_string(), "terminated (SIGTERM)");
    }
}
