//! A real `dormoused` on a private data directory and a free loopback port,
//! for the end-to-end suite, the chaos harness and the benchmark.
//!
//! [`BrokerProcess`] owns the process and everything the broker made for its
//! data directory: dropping it (also while a test panics) kills the broker,
//! removes every container of a computer of this data directory, and deletes
//! the directory. It never touches containers of any other data directory,
//! so tests with their own brokers run in parallel.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::Instant;
use uuid::Uuid;

use dormouse_client::Endpoint;

use crate::client::ApiClient;
use crate::{TempDir, TEST_LABEL};

/// How long a starting broker may take to answer `/healthz`; it reconciles
/// its records with the engine first.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a broker may take to exit after SIGTERM before it gets SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(30);

/// Longest a single API request of a test may take; a stop quiesces the
/// guest and waits out the engine's stop timeout, so this is generous.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Label the broker puts on every container it makes.
pub const COMPUTER_LABEL: &str = "dev.dormouse.computer";

/// Label of the broker's start-up probe of the engine's events; its value
/// is the broker's data directory.
pub const PROBE_LABEL: &str = "dev.dormouse.probe";

/// How a broker is started.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// `--image`: the image ID (or reference) for new computers.
    pub image: String,
    /// `--idle-timeout`, e.g. `8h`; the broker's default when `None`.
    pub idle_timeout: Option<String>,
    /// `--max-instances`; the broker's default when `None`.
    pub max_instances: Option<u32>,
    /// Further flags, passed as they are.
    pub extra_args: Vec<String>,
}

impl BrokerOptions {
    /// Defaults around an image. The idle timer is pushed far out: a test
    /// that wants idle stops says so, and no other test is surprised by one.
    pub fn new(image: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            idle_timeout: Some("24h".into()),
            max_instances: None,
            extra_args: Vec::new(),
        }
    }
}

/// A running (or deliberately killed) `dormoused` and its data directory.
#[derive(Debug)]
pub struct BrokerProcess {
    options: BrokerOptions,
    binary: PathBuf,
    addr: SocketAddr,
    token: String,
    data_dir: PathBuf,
    log_path: PathBuf,
    /// Set on the broker's environment at its next start (`DORMOUSE_FAULT`
    /// for the crash test's faulty binary).
    env: Vec<(String, String)>,
    child: Option<Child>,
    // Declared last: dropped after `Drop::drop` has removed the containers.
    root: TempDir,
}

/// Runs `scenario` against a broker of its own on the test image, and
/// prints the broker's log when it fails. Without an engine or an image it
/// returns `Ok` at once, having said why (see [`crate::docker_available`]).
pub async fn with_broker(
    test: &str,
    scenario: impl AsyncFnOnce(&BrokerProcess) -> Result<()>,
) -> Result<()> {
    let Some(image) = crate::test_image(test) else {
        return Ok(());
    };
    let broker = BrokerProcess::start(BrokerOptions::new(&image)).await?;
    let result = scenario(&broker).await;
    broker.log_on_failure(result)
}

/// How long [`ready_desktop`] waits for a new desktop.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A broker of its own on `image` with one new desktop named `name`,
/// ready: the broker, its client and the desktop's id.
pub async fn ready_desktop(image: &str, name: &str) -> Result<(BrokerProcess, ApiClient, Uuid)> {
    let broker = BrokerProcess::start(BrokerOptions::new(image)).await?;
    let api = broker.client();
    let mut events = crate::client::EventStream::open(&api).await?;
    let id = crate::client::create_ready(&api, &mut events, name, READY_TIMEOUT)
        .await
        .with_context(|| format!("new desktop; broker log:\n{}", broker.log_tail(3000)))?;
    Ok((broker, api, id))
}

/// The resident set of process `pid` now and its high-water mark, in KiB
/// (`VmRSS`, `VmHWM` of `/proc/<pid>/status`).
pub fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("{name} in /proc/{pid}/status"))?;
        line.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{line:?}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The CPU time process `pid` has used so far (user + system), in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which may hold spaces and parentheses.
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; `rest` starts at field 3.
    let utime: u64 = fields.get(11).context("utime")?.parse()?;
    let stime: u64 = fields.get(12).context("stime")?.parse()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64);
    Ok((utime + stime) as f64 / hz)
}

impl BrokerProcess {
    /// `result`, after printing the broker's log when it is an error.
    pub fn log_on_failure<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            eprintln!("--- dormoused log ---\n{}\n---", self.log_tail(8000));
        }
        result
    }

    /// Starts a broker with a fresh data directory and waits until it
    /// answers `/healthz` and has written its token.
    pub async fn start(options: BrokerOptions) -> Result<Self> {
        let binary = broker_binary()?;
        let root = TempDir::new("dormouse-e2e");
        let data_dir = root.path().join("data");
        let log_path = root.path().join("dormoused.log");
        let mut broker = Self {
            options,
            binary,
            addr: free_loopback_addr()?,
            token: String::new(),
            data_dir,
            log_path,
            env: Vec::new(),
            child: None,
            root,
        };
        broker.launch().await?;
        Ok(broker)
    }

    /// The broker's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The host directory mounted as the guest's workspace for computer `id`.
    pub fn workspace(&self, id: Uuid) -> PathBuf {
        self.data_dir
            .join("computers")
            .join(id.to_string())
            .join("workspace")
    }

    /// `host:port` the broker listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bearer token from `<data-dir>/token`.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Where the broker's stdout and stderr go (every run appended).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `max` bytes of the broker's log, for failure messages.
    pub fn log_tail(&self, max: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        crate::guest::tail(&text, max).to_owned()
    }

    /// A fresh API client for the broker as it listens now.
    pub fn client(&self) -> ApiClient {
        api_client(self.addr, Some(&self.token))
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` to the broker and waits until it has exited (SIGKILL
    /// after [`TERM_GRACE`] if a gentler signal is not enough).
    pub async fn kill(&mut self, signal: Signal) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("dormoused is not running");
        };
        let pid = Pid::from_raw(i32::try_from(child.id()).context("pid out of range")?);
        kill(pid, signal).with_context(|| format!("kill -{signal} dormoused"))?;
        let deadline = Instant::now() + TERM_GRACE;
        loop {
            if let Some(status) = child.try_wait().context("waiting for dormoused")? {
                self.note(&format!("dormoused ended by {signal}: {status}"));
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let status = child.wait().context("reaping dormoused")?;
                bail!("dormoused ignored {signal} for {TERM_GRACE:?}; killed ({status})");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Starts the broker again on the same data directory (and the same
    /// port when it is still free), after [`Self::kill`].
    pub async fn start_again(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("dormoused is still running; kill it first");
        }
        if TcpListener::bind(self.addr).is_err() {
            self.addr = free_loopback_addr()?;
        }
        self.launch().await
    }

    /// Which binary (and extra environment) the next [`Self::start_again`]
    /// runs: the crash test swaps between `dormoused-faults` armed with a
    /// fault and the plain `dormoused` on the same data directory.
    pub fn use_binary(&mut self, binary: PathBuf, env: Vec<(String, String)>) {
        self.binary = binary;
        self.env = env;
    }

    /// Waits until the broker exits by itself (a crash), at most `timeout`;
    /// `Ok(None)` if it still runs then.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(child) = self.child.as_mut() else {
                bail!("dormoused is not running");
            };
            if let Some(status) = child.try_wait().context("waiting for dormoused")? {
                self.child = None;
                self.note(&format!("dormoused exited by itself: {status}"));
                return Ok(Some(status));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL, then start again on the same data directory.
    pub async fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            self.kill(Signal::SIGKILL).await?;
        }
        self.start_again().await
    }

    /// Every computer id that has a directory in the data directory.
    pub fn computer_ids(&self) -> Vec<Uuid> {
        let Ok(entries) = std::fs::read_dir(self.data_dir.join("computers")) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(|n| Uuid::parse_str(n).ok()))
            .collect()
    }

    /// A value unique to this broker's data directory.
    pub fn run_label(&self) -> String {
        self.root
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("dormouse-e2e")
            .to_owned()
    }

    fn note(&self, line: &str) {
        if let Ok(mut log) = File::options().append(true).open(&self.log_path) {
            let _ = writeln!(log, "=== {} {line}", chrono::Utc::now().to_rfc3339());
        }
    }

    fn spawn(&mut self) -> Result<()> {
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("opening {}", self.log_path.display()))?;
        writeln!(
            log,
            "=== {} starting dormoused on {}",
            chrono::Utc::now().to_rfc3339(),
            self.addr
        )?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen")
            .arg(self.addr.to_string())
            .arg("--image")
            .arg(&self.options.image);
        if let Some(idle) = &self.options.idle_timeout {
            cmd.arg("--idle-timeout").arg(idle);
        }
        if let Some(max) = self.options.max_instances {
            cmd.arg("--max-instances").arg(max.to_string());
        }
        // No labels of the harness's own: the broker runs as a user would
        // run it, and must tell its containers apart by its own labels.
        cmd.args(&self.options.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(
                "RUST_LOG",
                std::env::var("DORMOUSE_E2E_BROKER_LOG")
                    .unwrap_or_else(|_| "info,dormouse::access=warn".into()),
            )
            // Plain text in the log file, not terminal colours.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Spawns and waits for `/healthz` and the token; one retry on a fresh
    /// port if the chosen one was taken in the meantime.
    async fn launch(&mut self) -> Result<()> {
        self.spawn()?;
        if let Err(first) = self.wait_healthy().await {
            if self.child.is_some() || !self.log_tail(4000).contains("in use") {
                return Err(first);
            }
            self.addr = free_loopback_addr()?;
            self.spawn()?;
            self.wait_healthy().await?;
        }
        self.token = self.read_token().await?;
        Ok(())
    }

    async fn wait_healthy(&mut self) -> Result<()> {
        let probe = api_client(self.addr, None);
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().context("polling dormoused")? {
                    self.child = None;
                    bail!(
                        "dormoused exited ({status}) before answering /healthz; its log:\n{}",
                        self.log_tail(4000)
                    );
                }
            }
            if probe.healthy().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "dormoused did not answer /healthz on {} within {HEALTHY_TIMEOUT:?}; its log:\n{}",
                    self.addr,
                    self.log_tail(4000)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn read_token(&self) -> Result<String> {
        let path = self.data_dir.join("token");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path) {
                let token = text.trim();
                if !token.is_empty() {
                    return Ok(token.to_owned());
                }
            }
            if Instant::now() > deadline {
                bail!("no token in {} after /healthz answered", path.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Removes every container that belongs to a computer of this data
    /// directory: by name (`dormouse-<id>` for each computer directory), by
    /// the broker's label and mounts from this data directory, by the test
    /// label with this broker's value (an older harness set it), and the
    /// broker's event probe should it have been killed mid-probe.
    pub fn remove_containers(&self) {
        let mut names: BTreeSet<String> = self
            .computer_ids()
            .into_iter()
            .map(|id| format!("dormouse-{id}"))
            .collect();
        names.extend(containers_labelled(&format!(
            "{TEST_LABEL}={}",
            self.run_label()
        )));
        names.extend(labelled_containers_mounting(&self.data_dir));
        names.extend(containers_labelled(&format!(
            "{PROBE_LABEL}={}",
            self.data_dir.display()
        )));
        if names.is_empty() {
            return;
        }
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&names)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.remove_containers();
        if std::env::var_os("DORMOUSE_E2E_KEEP_LOGS").is_some() || std::thread::panicking() {
            // Keep the broker's log next to the test output for a post-mortem.
            let kept = std::env::temp_dir().join(format!(
                "dormoused-{}.log",
                self.root
                    .path()
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("run")
            ));
            if std::fs::copy(&self.log_path, &kept).is_ok() {
                eprintln!("dormoused log kept at {}", kept.display());
            }
        }
    }
}

/// IDs of containers carrying `label` (`KEY` or `KEY=VALUE`).
fn containers_labelled(label: &str) -> Vec<String> {
    let Ok(out) = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label={label}")])
        .stdin(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Names of containers with the broker's label that mount something from
/// under `data_dir`: every container of that broker's computers.
pub fn containers_mounting(data_dir: &Path) -> Vec<String> {
    labelled_containers_mounting(data_dir)
}

fn labelled_containers_mounting(data_dir: &Path) -> Vec<String> {
    let ids = containers_labelled(COMPUTER_LABEL);
    if ids.is_empty() {
        return Vec::new();
    }
    let Ok(out) = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{.Name}}|{{range .Mounts}}{{.Source}}|{{end}}",
        ])
        .args(&ids)
        .stdin(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let data_dir = data_dir.to_string_lossy().into_owned();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('|');
            let name = fields.next()?.trim_start_matches('/');
            fields
                .any(|source| source.starts_with(&data_dir))
                .then(|| name.to_owned())
        })
        .collect()
}

/// A loopback address with a port nobody listens on right now.
fn free_loopback_addr() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    listener.local_addr().context("reading the bound port")
}

/// The `dormoused` binary under test.
///
/// `$DORMOUSE_BIN_DIR/dormoused` when that is set (the scripts build once
/// and set it). Otherwise the binary is built, once per process, into the
/// same target directory and profile as the running test or harness, so a
/// test never runs a stale broker.
pub fn broker_binary() -> Result<PathBuf> {
    static BINARY: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| locate_or_build("dormoused", None).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// `dormoused-faults`, the broker with crash points (feature
/// `fault-injection`), found or built like [`broker_binary`], in a cargo
/// invocation of its own so the feature never reaches `dormoused`.
pub fn faulty_broker_binary() -> Result<PathBuf> {
    static BINARY: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            locate_or_build("dormoused-faults", Some("fault-injection"))
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

fn locate_or_build(name: &str, feature: Option<&str>) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DORMOUSE_BIN_DIR") {
        let path = PathBuf::from(dir).join(name);
        if !path.is_file() {
            bail!(
                "DORMOUSE_BIN_DIR is set but {} does not exist",
                path.display()
            );
        }
        return Ok(path);
    }
    let exe = std::env::current_exe().context("locating the running executable")?;
    let mut profile_dir = exe.parent().context("executable without a directory")?;
    if profile_dir.ends_with("deps") {
        profile_dir = profile_dir.parent().context("deps without a parent")?;
    }
    let target_dir = profile_dir
        .parent()
        .context("profile directory without a target directory")?;
    let release = profile_dir.ends_with("release");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the tests crate lives in the workspace")?
        .join("Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "dormouse-broker", "--bin", name])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null());
    if release {
        cmd.arg("--release");
    }
    if let Some(feature) = feature {
        cmd.args(["--features", feature]);
    }
    let status = cmd.status().context("running cargo build for dormoused")?;
    if !status.success() {
        bail!("cargo build -p dormouse-broker --bin {name} failed ({status})");
    }
    let path = profile_dir.join(name);
    if !path.is_file() {
        bail!("cargo built {name} but {} is missing", path.display());
    }
    Ok(path)
}

/// A client of the broker on `addr`, with its token (none: `/healthz` only).
fn api_client(addr: SocketAddr, token: Option<&str>) -> ApiClient {
    let mut builder = ApiClient::builder(Endpoint::tcp(addr))
        .request_timeout(REQUEST_TIMEOUT)
        .user_agent("dormouse-e2e");
    if let Some(token) = token {
        builder = builder.token(token);
    }
    builder
        .build()
        .expect("a client of a loopback address with a token read from its file always builds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_grows_with_work() {
        let before = cpu_seconds(std::process::id()).expect("own stat");
        let started = std::time::Instant::now();
        let mut x: u64 = 1;
        while started.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
        let after = cpu_seconds(std::process::id()).expect("own stat");
        // 200 ms of CPU is 20 ticks at USER_HZ 100; allow for a busy machine.
        assert!(after > before, "cpu {before} -> {after}");
    }
}
