//! The engine as the harness sees it, through the `docker` CLI and without
//! the broker: what a container is now, what the engine did to it, and the
//! blunt instruments (`docker kill -s KILL`) used behind the broker's back.
//!
//! Async (tokio processes) so a test can keep a request to the broker in
//! flight while it asks the engine. It never creates or removes containers
//! of the broker; removal belongs to the guards in [`crate::broker`].

use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

/// Runs `docker` with these arguments.
pub async fn docker(args: &[&str]) -> Result<Output> {
    Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("spawning docker {args:?}"))
}

/// Runs `docker` and returns its trimmed stdout; a failure carries stderr.
pub async fn docker_ok(args: &[&str]) -> Result<String> {
    let out = docker(args).await?;
    if !out.status.success() {
        bail!(
            "docker {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The image a harness runs on, as an image ID: `image` when given, else
/// `$DORMOUSE_TEST_IMAGE`, else [`crate::DEFAULT_IMAGE`]; an error naming
/// `scripts/build-image` when the engine has no such image.
pub async fn resolve_image(image: Option<&str>) -> Result<String> {
    let image = image
        .map(str::to_owned)
        .or_else(|| std::env::var("DORMOUSE_TEST_IMAGE").ok())
        .unwrap_or_else(|| crate::DEFAULT_IMAGE.to_owned());
    docker_ok(&["image", "inspect", "--format", "{{.Id}}", &image])
        .await
        .with_context(|| format!("image {image} (run scripts/build-image)"))
}

/// What `docker inspect` says of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerFacts {
    /// Full container ID; a recreate would change it.
    pub id: String,
    /// `running`, `exited`, `created`, ...
    pub status: String,
    /// Exit code of the last run.
    pub exit_code: i64,
    /// Whether the kernel's OOM killer ended the last run.
    pub oom_killed: bool,
    /// The engine's `FinishedAt` of the last run.
    pub finished_at: String,
    /// The engine's `StartedAt` of the current or last run.
    pub started_at: String,
}

/// Inspects a container; `None` when the engine has no such container.
pub async fn inspect(name: &str) -> Result<Option<ContainerFacts>> {
    let format = "{{.Id}}|{{.State.Status}}|{{.State.ExitCode}}|{{.State.OOMKilled}}|{{.State.FinishedAt}}|{{.State.StartedAt}}";
    let out = docker(&["container", "inspect", "--format", format, name]).await?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Docker says "No such container", Podman "no such container".
        if stderr.to_ascii_lowercase().contains("no such") {
            return Ok(None);
        }
        bail!("docker inspect {name}: {}", stderr.trim());
    }
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let fields: Vec<&str> = line.split('|').collect();
    let [id, status, exit_code, oom, finished_at, started_at] = fields[..] else {
        bail!("docker inspect {name}: unexpected output {line:?}");
    };
    Ok(Some(ContainerFacts {
        id: id.to_owned(),
        status: status.to_owned(),
        exit_code: exit_code
            .parse()
            .with_context(|| format!("exit code {exit_code:?}"))?,
        oom_killed: oom == "true",
        finished_at: finished_at.to_owned(),
        started_at: started_at.to_owned(),
    }))
}

/// `docker kill -s KILL`: the container dies without any chance to clean up.
pub async fn kill(name: &str) -> Result<()> {
    docker_ok(&["kill", "-s", "KILL", name]).await.map(drop)
}

/// Whether the engine behind the `docker` CLI is Podman's compatible
/// service (its version report lists a `Podman Engine` component).
pub async fn is_podman() -> Result<bool> {
    let out = docker_ok(&[
        "version",
        "--format",
        "{{range .Server.Components}}{{.Name}};{{end}}",
    ])
    .await?;
    Ok(out.to_ascii_lowercase().contains("podman"))
}

/// The host pid of a running container's init (its PID 1).
pub async fn init_pid(name: &str) -> Result<i32> {
    let pid = docker_ok(&["inspect", "--format", "{{.State.Pid}}", name]).await?;
    let pid: i32 = pid
        .parse()
        .with_context(|| format!("pid of {name}: {pid:?}"))?;
    ensure!(pid > 0, "{name} has no running init (pid {pid})");
    Ok(pid)
}

/// `podman kill -s KILL` with Podman's own CLI (no API service involved).
pub async fn podman_kill(name: &str) -> Result<()> {
    let out = Command::new("podman")
        .args(["kill", "-s", "KILL", name])
        .stdin(Stdio::null())
        .output()
        .await
        .context("spawning podman kill")?;
    ensure!(
        out.status.success(),
        "podman kill {name}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// The engine's unix socket: `$DOCKER_HOST` when it is `unix://…`, else the
/// default path.
pub fn engine_socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
        .unwrap_or_else(|| "/var/run/docker.sock".to_owned())
}

/// `POST path` (no body) straight to the engine's API socket, without the
/// CLI's process start: for timing (the floor) and for kills that must land
/// at a precise moment. Returns the HTTP status and the body.
pub async fn api_post(path: &str) -> Result<(u16, String)> {
    api_request("POST", path).await
}

/// `GET path` on the engine's API socket; status and body.
pub async fn api_get(path: &str) -> Result<(u16, String)> {
    api_request("GET", path).await
}

async fn api_request(method: &str, path: &str) -> Result<(u16, String)> {
    let socket = engine_socket();
    let mut stream = UnixStream::connect(&socket)
        .await
        .with_context(|| format!("connecting to {socket}"))?;
    // HTTP/1.0: the engine answers without chunked encoding and closes.
    let request = format!("{method} {path} HTTP/1.0\r\nHost: docker\r\nContent-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("{method} {path}: not an HTTP answer: {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Polls the engine API (every 2 ms, no CLI) until container `name` runs
/// with a `StartedAt` other than `previous`: the moment a start took effect,
/// as precisely as the engine tells it.
pub async fn wait_running(name: &str, previous: &str, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let (status, body) = api_get(&format!("/containers/{name}/json")).await?;
        ensure!(status == 200, "inspect {name} answered {status}");
        let state: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("inspect {name}: not JSON"))?;
        let running = state["State"]["Running"].as_bool() == Some(true);
        let started = state["State"]["StartedAt"].as_str().unwrap_or_default();
        if running && started != previous {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{name} did not start within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// What [`kill_now`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    /// The container was running and got SIGKILL.
    Killed,
    /// It was not running (any more).
    NotRunning,
}

/// SIGKILL through the engine API, as fast as the engine can deliver it.
pub async fn kill_now(name: &str) -> Result<Killed> {
    let (status, body) = api_post(&format!("/containers/{name}/kill?signal=KILL")).await?;
    match status {
        204 => Ok(Killed::Killed),
        409 if body.contains("is not running") => Ok(Killed::NotRunning),
        // Podman's compatible API: a 500 saying the container is stopped.
        500 if body.contains("container state improper") => Ok(Killed::NotRunning),
        _ => bail!("engine kill of {name} answered {status}: {}", body.trim()),
    }
}

/// When the engine says `name` last started (`State.StartedAt`).
fn last_started(name: &str) -> Option<SystemTime> {
    let out = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{.State.StartedAt}}", name])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let at = chrono::DateTime::parse_from_rfc3339(text.trim()).ok()?;
    let nanos = u64::try_from(at.timestamp_nanos_opt()?).ok()?;
    Some(UNIX_EPOCH + Duration::from_nanos(nanos))
}

/// A time as `docker events --since` takes it: Unix seconds with nanoseconds.
pub fn engine_timestamp(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    format!("{}.{:09}", since.as_secs(), since.subsec_nanos())
}

/// Records what the engine does to one container (by name) from the moment
/// it is made until [`EngineEventRecorder::finish`]: a live `docker events`
/// stream, started with `--since` a moment in the past so nothing between
/// the call and the stream's connection is missed. Live, because the
/// engine's replay buffer is small and shared with every other container.
#[derive(Debug)]
pub struct EngineEventRecorder {
    child: Child,
    actions: Arc<Mutex<Vec<String>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl EngineEventRecorder {
    /// Starts recording the container events of `name`.
    pub fn start(name: &str) -> Result<Self> {
        // Half a second back, but never before the container's last start:
        // a desktop that got ready within that half second must not have its
        // own `create` counted as a rebuild.
        let mut from = SystemTime::now() - Duration::from_millis(500);
        if let Some(started) = last_started(name) {
            from = from.max(started + Duration::from_millis(1));
        }
        let since = engine_timestamp(from);
        let mut child = Command::new("docker")
            .args([
                "events",
                "--since",
                &since,
                "--filter",
                "type=container",
                "--filter",
                &format!("container={name}"),
                "--format",
                "{{.Action}}",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("spawning docker events")?;
        let stdout = child.stdout.take().context("docker events has no stdout")?;
        let actions = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&actions);
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(mut actions) = sink.lock() {
                    actions.push(line);
                }
            }
        });
        Ok(Self {
            child,
            actions,
            reader,
        })
    }

    /// The actions seen so far (`start`, `kill`, `die`, `stop`, `exec_create: ...`).
    pub fn actions(&self) -> Vec<String> {
        self.actions.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// Stops recording after giving the stream a moment to deliver what the
    /// engine already emitted, and returns every action in order.
    pub async fn finish(mut self) -> Vec<String> {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        let _ = (&mut self.reader).await;
        self.actions()
    }
}

/// The verb of an engine action: `exec_create: sh -c ...` is `exec_create`.
pub fn action_verb(action: &str) -> &str {
    action.split(':').next().unwrap_or(action).trim()
}

/// Fails when the engine created, destroyed, renamed or removed the container
/// in this window: stopping and resuming must never rebuild.
pub fn ensure_never_rebuilt(actions: &[String]) -> Result<()> {
    const REBUILD: [&str; 4] = ["create", "destroy", "rename", "remove"];
    let rebuilt: Vec<&String> = actions
        .iter()
        .filter(|a| REBUILD.contains(&action_verb(a)))
        .collect();
    if !rebuilt.is_empty() {
        bail!("the engine rebuilt the container: {rebuilt:?} (all actions: {actions:?})");
    }
    Ok(())
}

/// Fails unless `verb` is among the actions.
///
/// Podman's Docker-compatible event stream reports no `stop`: a stop is a
/// `died` (shown as `die`) followed by its own `cleanup`, an action Docker
/// never reports; on such a stream that pair stands for `stop`.
pub fn ensure_action(actions: &[String], verb: &str) -> Result<()> {
    let seen = |v: &str| actions.iter().any(|a| action_verb(a) == v);
    let podman_stop = verb == "stop" && seen("cleanup") && (seen("die") || seen("died"));
    if !seen(verb) && !podman_stop {
        bail!("the engine never reported `{verb}`; actions: {actions:?}");
    }
    Ok(())
}

/// The lifecycle actions only (no `exec_*`, `attach`, ...), for messages.
pub fn lifecycle_actions(actions: &[String]) -> Vec<&str> {
    actions
        .iter()
        .map(|a| action_verb(a))
        .filter(|v| !v.starts_with("exec_") && *v != "attach" && *v != "top")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_drop_the_command_of_exec_events() {
        assert_eq!(action_verb("exec_create: sh -c true"), "exec_create");
        assert_eq!(action_verb("start"), "start");
    }

    #[test]
    fn a_create_or_destroy_is_a_rebuild() {
        let fine: Vec<String> = ["kill", "die", "stop", "start", "exec_start: sh -c x"]
            .map(String::from)
            .to_vec();
        assert!(ensure_never_rebuilt(&fine).is_ok());
        assert!(ensure_action(&fine, "stop").is_ok());
        assert!(ensure_action(&fine, "create").is_err());
        let rebuilt = vec!["die".to_owned(), "destroy".to_owned(), "create".to_owned()];
        assert!(ensure_never_rebuilt(&rebuilt).is_err());
        assert_eq!(lifecycle_actions(&fine), ["kill", "die", "stop", "start"]);
    }

    #[test]
    fn engine_timestamps_carry_nanoseconds() {
        let at = UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(engine_timestamp(at), "1700000000.000000005");
    }
}
