//! `dormouse`: the command-line client of the broker's public API.
//!
//! It speaks only HTTP and the `/v1/events` WebSocket, through
//! `dormouse-client`, exactly as any other frontend would; it never reads the
//! broker's state files (only the token). Everything it prints that came
//! from the broker is escaped ([`escape`]): a guest chooses some of that text.
//! Exit codes: 0 success, 1 failure (the broker said no, could not be
//! reached, or no desktop matches), 2 usage (clap's, and an id prefix that
//! matches several desktops).

pub mod actions;
pub mod escape;
pub mod exec;
pub mod files;
mod screen;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use dormouse_client::token::{default_token_files, read_token_file, TokenFileError, TOKEN_FILE};
use dormouse_client::{Client, Endpoint, EventStream, EventsError, StatusCode};
use dormouse_protocol::api::{
    BrokerEvent, ComputerStatus, ContainerState, CreateComputer, LeaseRequest, StopReason,
    GENERATION_HEADER,
};
use uuid::Uuid;

use escape::{safe_json, Safe};

/// Bound of one HTTP request (a start or stop may wait on the engine).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(180);

/// Bound of connecting to the broker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Flags of `dormouse`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "dormouse",
    version,
    about = "Command-line client of the Dormouse broker (dormoused)"
)]
pub struct CliArgs {
    /// The broker's URL: http://HOST:PORT, or unix:/PATH for a broker
    /// listening on a unix socket.
    #[arg(
        long,
        global = true,
        env = "DORMOUSE_URL",
        default_value = "http://127.0.0.1:7480"
    )]
    pub url: String,
    /// The broker's data directory, to read its token from <DIR>/token
    /// [default: DORMOUSE_TOKEN, then the default data directory, then /var/lib/dormouse].
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// A file holding the token (instead of <data-dir>/token).
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Print JSON (the API's objects) instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Fencing generation to send with mutating calls (from `dormouse lease`).
    #[arg(long, global = true, value_name = "N")]
    pub generation: Option<u64>,
    /// What to do.
    #[command(subcommand)]
    pub command: CliCommand,
}

/// The subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum CliCommand {
    /// Create (and start) a new desktop.
    Create {
        /// Human name.
        #[arg(long)]
        name: Option<String>,
        /// Owner key.
        #[arg(long)]
        owner: Option<String>,
        /// Wait until it is ready.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long.
        #[arg(long, value_name = "DURATION", default_value = "2min", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// List desktops.
    Ls,
    /// Show a desktop's status.
    Status {
        /// Id, unique id prefix, or name.
        id: String,
        /// Keep printing every change until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Resume a stopped desktop.
    Start {
        /// Id, unique id prefix, or name.
        id: String,
        /// Show progress until it is ready or fails.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long.
        #[arg(long, value_name = "DURATION", default_value = "2min", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Stop a desktop (nothing is lost; `start` resumes it).
    Stop {
        /// Id, unique id prefix, or name.
        id: String,
    },
    /// Remove a desktop; its workspace is kept unless --purge.
    Rm {
        /// Id, unique id prefix, or name.
        id: String,
        /// Delete the workspace too.
        #[arg(long)]
        purge: bool,
    },
    /// Save a PNG of a desktop's screen.
    Screenshot {
        /// Id, unique id prefix, or name.
        id: String,
        /// Output file.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// Scaled to fit WxH (aspect kept), through a `screenshot` action.
        #[arg(long, value_name = "WxH", value_parser = actions::parse_scale)]
        scale: Option<dormouse_protocol::actions::Scale>,
    },
    /// Run one computer-use action, e.g. `act ID left_click 640 400`.
    Act(actions::ActArgs),
    /// Type text exactly, under any keyboard layout.
    Type(actions::TypeArgs),
    /// Press key combinations, e.g. `key ID ctrl+l`.
    Key(actions::KeyArgs),
    /// Renew a desktop's idle timer.
    Touch {
        /// Id, unique id prefix, or name.
        id: String,
    },
    /// Take or renew the fencing lease of a desktop.
    Lease {
        /// Id, unique id prefix, or name.
        id: String,
        /// Who holds it, e.g. this controller's instance name.
        #[arg(long)]
        holder: String,
        /// How long it lives unless renewed, e.g. 30s.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        ttl: Duration,
    },
    /// Run a command in a desktop: its stdout and stderr are printed as
    /// they are, its exit code is dormouse's (`dormouse exec ID -- CMD ARGS`).
    Exec {
        /// Id, unique id prefix, or name.
        id: String,
        /// Working directory in the desktop (default: the workspace).
        #[arg(long)]
        cwd: Option<String>,
        /// An environment variable for the command (repeatable).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Send this process's stdin to the command.
        #[arg(long)]
        stdin: bool,
        /// Kill the command after this long.
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// An interactive shell (or the given program) on a terminal in a desktop.
    Shell {
        /// Id, unique id prefix, or name.
        id: String,
        /// The program and its arguments (default: the login shell).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// The workspace: cp, files, disk, export, import.
    #[command(flatten)]
    Files(files::FilesCommand),
    /// Print a link to watch a desktop live (or, with --control, take it over).
    Screen {
        /// Id, unique id prefix, or name.
        id: String,
        /// A control capability (fenced: pass --generation under a lease).
        #[arg(long)]
        control: bool,
        /// How long the link works, e.g. 10m.
        #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
        ttl: Duration,
    },
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line names nothing usable (exit 2).
    #[error("{0}")]
    Usage(String),
    /// No token could be found.
    #[error(
        "no API token: set DORMOUSE_TOKEN, pass --token-file, or --data-dir of the broker \
         (tried {tried})"
    )]
    NoToken {
        /// The files looked at.
        tried: String,
    },
    /// A token file exists but is unusable.
    #[error(transparent)]
    Token(#[from] TokenFileError),
    /// The broker answered with an error.
    #[error("{code}: {message}")]
    Api {
        /// HTTP status.
        status: StatusCode,
        /// The API's error code (the status number when the answer was not
        /// the API's error object).
        code: String,
        /// Its message.
        message: String,
    },
    /// The broker could not be reached or answered outside the contract.
    #[error("{}", http_words(.0))]
    Http(dormouse_client::Error),
    /// The event stream failed.
    #[error("event stream: {}", events_words(.0))]
    Events(EventsError),
    /// Waiting ended without success.
    #[error("{0}")]
    Failed(String),
    /// A command in the desktop ended with this exit code (not a failure
    /// of dormouse: nothing is printed).
    #[error("the command exited with {0}")]
    Exited(u8),
    /// A local file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl CliError {
    /// The exit code this error means.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            Self::Exited(code) => *code,
            _ => 1,
        }
    }
}

impl From<dormouse_client::Error> for CliError {
    fn from(e: dormouse_client::Error) -> Self {
        match e {
            dormouse_client::Error::Api {
                status,
                code,
                message,
                ..
            } => Self::Api {
                status,
                code,
                message,
            },
            dormouse_client::Error::UnexpectedStatus { status, body, .. } => Self::Api {
                status,
                code: status.as_u16().to_string(),
                message: body.trim().to_owned(),
            },
            dormouse_client::Error::Events(e) => Self::Events(e),
            other => Self::Http(other),
        }
    }
}

impl From<EventsError> for CliError {
    fn from(e: EventsError) -> Self {
        Self::Events(e)
    }
}

/// A transport or contract failure as a person reads it: the cause and its
/// causes, without the method and path the command implies.
fn http_words(e: &dormouse_client::Error) -> String {
    match e {
        dormouse_client::Error::Transport { source, .. } => chain(source),
        dormouse_client::Error::Decode { source, .. } => {
            format!("unexpected answer from the broker: {source}")
        }
        other => chain(other),
    }
}

/// An event-stream failure: the WebSocket's own words, else the chain.
fn events_words(e: &EventsError) -> String {
    match e {
        EventsError::WebSocket(ws) => ws.to_string(),
        other => chain(other),
    }
}

/// `e: cause: cause...`.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The whole of `dormouse`: parse, run, exit code.
pub fn main() -> ExitCode {
    let args = CliArgs::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dormouse: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    match runtime.block_on(run(args, &mut out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Exited(code)) => {
            let _ = out.flush();
            ExitCode::from(code)
        }
        Err(e) => {
            let _ = out.flush();
            // Messages carry the broker's words, which a guest may choose.
            eprintln!("dormouse: {}", Safe(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs one command, printing to `out`.
pub async fn run(args: CliArgs, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
    let token = find_token(&args)?;
    let client = connect(&args.url, token, args.generation)?;
    let json = args.json;
    match args.command {
        CliCommand::Files(command) => files::run(&client, command, json, out).await,
        CliCommand::Create {
            name,
            owner,
            wait,
            timeout,
        } => {
            let request = CreateComputer {
                name,
                owner,
                workspace_from: None,
            };
            let mut events = if wait {
                Some(client.events().await?)
            } else {
                None
            };
            let status = client.create(&request).await?;
            if let Some(events) = events.as_mut() {
                if !json {
                    writeln!(out, "created {} ({})", status.id, Safe(&status.name))
                        .map_err(stdout)?;
                }
                let status = wait_ready(&client, events, status, timeout, json, out).await?;
                print_status(out, &status, json)
            } else {
                print_status(out, &status, json)
            }
        }
        CliCommand::Ls => {
            let list = client.list().await?;
            if json {
                print_json(out, &list)
            } else {
                print_table(out, &list)
            }
        }
        CliCommand::Status { id, watch } => {
            let id = resolve(&client, &id).await?;
            if watch {
                watch_status(&client, id, json, out).await
            } else {
                let status = client.get(id).await?;
                print_status(out, &status, json)
            }
        }
        CliCommand::Start { id, wait, timeout } => {
            let id = resolve(&client, &id).await?;
            // Subscribe before asking, so no change between the two is missed.
            let mut events = if wait {
                Some(client.events().await?)
            } else {
                None
            };
            let started = Instant::now();
            let status = client.start(id).await?;
            match events.as_mut() {
                Some(events) => {
                    let status = wait_ready(&client, events, status, timeout, json, out).await?;
                    if !json {
                        writeln!(out, "ready after {:.2} s", started.elapsed().as_secs_f64())
                            .map_err(stdout)?;
                    }
                    if json {
                        print_json(out, &status)?;
                    }
                    Ok(())
                }
                None => print_status(out, &status, json),
            }
        }
        CliCommand::Stop { id } => {
            let id = resolve(&client, &id).await?;
            let status = client.stop(id).await?;
            print_status(out, &status, json)
        }
        CliCommand::Touch { id } => {
            let id = resolve(&client, &id).await?;
            let status = client.touch(id).await?;
            print_status(out, &status, json)
        }
        CliCommand::Rm { id, purge } => {
            let id = resolve(&client, &id).await?;
            client.remove(id, purge).await?;
            if json {
                print_json(out, &serde_json::json!({ "removed": id, "purged": purge }))
            } else {
                writeln!(
                    out,
                    "removed {id}{}",
                    if purge {
                        " and its workspace"
                    } else {
                        " (workspace kept)"
                    }
                )
                .map_err(stdout)
            }
        }
        CliCommand::Act(a) => actions::act(&client, a, json, out).await,
        CliCommand::Type(a) => actions::type_text(&client, a, json, out).await,
        CliCommand::Key(a) => actions::key(&client, a, json, out).await,
        CliCommand::Screenshot {
            id,
            output,
            scale: Some(scale),
        } => actions::scaled_screenshot(&client, &id, scale, &output, json, out).await,
        CliCommand::Screenshot {
            id,
            output,
            scale: None,
        } => {
            let id = resolve(&client, &id).await?;
            let png = client.screenshot(id).await?;
            std::fs::write(&output, &png).map_err(|source| CliError::Io {
                path: output.clone(),
                source,
            })?;
            if json {
                print_json(
                    out,
                    &serde_json::json!({ "id": id, "file": output, "bytes": png.len() }),
                )
            } else {
                writeln!(out, "saved {} ({} bytes)", output.display(), png.len()).map_err(stdout)
            }
        }
        CliCommand::Screen { id, control, ttl } => {
            screen::screen(&client, &id, control, ttl, json, out).await
        }
        CliCommand::Lease { id, holder, ttl } => {
            let id = resolve(&client, &id).await?;
            let request = LeaseRequest {
                holder,
                ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            };
            let grant = client.lease(id, &request).await?;
            if json {
                print_json(out, &grant)
            } else {
                writeln!(
                    out,
                    "generation {} for {} until {} (send it as --generation {} or {GENERATION_HEADER})",
                    grant.generation,
                    Safe(&grant.holder),
                    grant.expires_at.to_rfc3339(),
                    grant.generation
                )
                .map_err(stdout)
            }
        }
        CliCommand::Exec {
            id,
            cwd,
            env,
            stdin,
            timeout,
            argv,
        } => {
            let id = resolve(&client, &id).await?;
            let args = exec::ExecArgs {
                argv,
                cwd,
                env,
                stdin,
                timeout,
            };
            match exec::exec(&client, id, args, json, out).await? {
                0 => Ok(()),
                code => Err(CliError::Exited(code)),
            }
        }
        CliCommand::Shell { id, argv } => {
            let id = resolve(&client, &id).await?;
            match exec::shell(&client, id, &argv).await? {
                0 => Ok(()),
                code => Err(CliError::Exited(code)),
            }
        }
    }
}

/// The token: `--token-file`, `--data-dir`/token, `DORMOUSE_TOKEN`, the
/// default data directory, then the system one of `scripts/install`.
fn find_token(args: &CliArgs) -> Result<String, CliError> {
    if let Some(file) = &args.token_file {
        return Ok(read_token_file(file)?);
    }
    if let Some(dir) = &args.data_dir {
        return Ok(read_token_file(&dir.join(TOKEN_FILE))?);
    }
    if let Ok(token) = std::env::var("DORMOUSE_TOKEN") {
        let token = token.trim().to_owned();
        if !token.is_empty() {
            return Ok(token);
        }
    }
    let candidates = default_token_files();
    for path in &candidates {
        if path.exists() {
            return Ok(read_token_file(path)?);
        }
    }
    Err(CliError::NoToken {
        tried: candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// The API client for `--url`, with the token and the fencing generation.
fn connect(url: &str, token: String, generation: Option<u64>) -> Result<Client, CliError> {
    let endpoint: Endpoint = url
        .parse()
        .map_err(|e| CliError::Usage(format!("--url: {e}")))?;
    Client::builder(endpoint)
        .token(token)
        .generation(generation)
        .connect_timeout(CONNECT_TIMEOUT)
        .request_timeout(REQUEST_TIMEOUT)
        .user_agent(concat!("dormouse/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| match e {
            dormouse_client::SetupError::InvalidToken => {
                CliError::Usage("the token is not a valid header value".into())
            }
            other => CliError::Http(other.into()),
        })
}

/// A UUID as is; otherwise an exact name or a unique id prefix.
async fn resolve(client: &Client, given: &str) -> Result<Uuid, CliError> {
    if let Ok(id) = Uuid::try_parse(given) {
        return Ok(id);
    }
    let list = client.list().await?;
    let by_name: Vec<Uuid> = list
        .iter()
        .filter(|c| c.name == given)
        .map(|c| c.id)
        .collect();
    let matches = if by_name.is_empty() {
        let prefix = given.to_ascii_lowercase();
        list.iter()
            .filter(|c| !prefix.is_empty() && c.id.to_string().starts_with(&prefix))
            .map(|c| c.id)
            .collect()
    } else {
        by_name
    };
    match matches.as_slice() {
        [id] => Ok(*id),
        [] => Err(CliError::Failed(format!(
            "no desktop named {given:?} or with an id starting so"
        ))),
        _ => Err(CliError::Usage(format!(
            "{given:?} matches {} desktops; give more of the id",
            matches.len()
        ))),
    }
}

/// Follows `status` until ready, printing each change of phase; fails when
/// the container stops or vanishes, or at the deadline.
async fn wait_ready(
    client: &Client,
    events: &mut EventStream,
    initial: ComputerStatus,
    timeout: Duration,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<ComputerStatus, CliError> {
    let id = initial.id;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = initial;
    let mut shown = String::new();
    loop {
        let line = progress_line(&last);
        if line != shown && !json {
            writeln!(out, "  {line}").map_err(stdout)?;
            shown = line;
        }
        if last.ready {
            return Ok(last);
        }
        if matches!(
            last.container,
            ContainerState::Stopped | ContainerState::Missing
        ) {
            // The stream's first messages are a snapshot that may predate the
            // start; only a fresh read can say the start really failed.
            let fresh = client.get(id).await?;
            if !matches!(
                fresh.container,
                ContainerState::Stopped | ContainerState::Missing
            ) {
                last = fresh;
                continue;
            }
            let why = fresh
                .problem
                .clone()
                .or_else(|| fresh.resumable_problem.clone())
                .unwrap_or_else(|| format!("the container is {}", container_word(fresh.container)));
            return Err(CliError::Failed(format!(
                "{id} did not become ready: {why}"
            )));
        }
        let event = match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => {
                return Err(CliError::Failed(format!(
                    "{id} not ready after {}: {}",
                    humantime::format_duration(timeout),
                    last.problem.as_deref().unwrap_or("no problem reported")
                )))
            }
            Ok(event) => event?,
        };
        match event {
            Some(BrokerEvent::Status { computer }) if computer.id == id => last = *computer,
            Some(BrokerEvent::Removed { id: gone }) if gone == id => {
                return Err(CliError::Failed(format!("{id} was removed while starting")));
            }
            Some(_) => {}
            None => {
                // The stream ended (broker restart); one last look.
                last = client.get(id).await?;
                if !last.ready {
                    return Err(CliError::Failed(
                        "event stream: the broker closed the event stream".into(),
                    ));
                }
            }
        }
    }
}

async fn watch_status(
    client: &Client,
    id: Uuid,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let mut events = client.events().await?;
    while let Some(event) = events.next().await? {
        match event {
            BrokerEvent::Status { computer } if computer.id == id => {
                if json {
                    print_json(out, &computer)?;
                } else {
                    writeln!(
                        out,
                        "{}  {}",
                        chrono::Local::now().format("%H:%M:%S"),
                        progress_line(&computer)
                    )
                    .map_err(stdout)?;
                }
                out.flush().map_err(stdout)?;
            }
            BrokerEvent::Removed { id: gone } if gone == id => {
                if json {
                    print_json(out, &BrokerEvent::Removed { id })?;
                } else {
                    writeln!(out, "removed").map_err(stdout)?;
                }
                return Ok(());
            }
            _ => {}
        }
    }
    Err(CliError::Failed(
        "event stream: the broker closed the event stream".into(),
    ))
}

fn container_word(state: ContainerState) -> &'static str {
    match state {
        ContainerState::Running => "running",
        ContainerState::Stopped => "stopped",
        ContainerState::Missing => "missing",
        ContainerState::Unknown => "unknown",
    }
}

/// What a person wants to know of a state, in one line.
fn progress_line(s: &ComputerStatus) -> String {
    let mut line = match (s.container, s.ready) {
        (ContainerState::Running, true) => "ready".to_owned(),
        (ContainerState::Running, false) => match s.phase {
            Some(phase) => format!("running, {}", serde_plain(&phase)),
            None => "running, not ready".to_owned(),
        },
        (ContainerState::Stopped, _) => stop_words(s.stop_reason),
        (other, _) => format!("container {}", container_word(other)),
    };
    if let Some(problem) = &s.problem {
        line.push_str(&format!(" ({})", Safe(problem)));
    }
    line
}

/// The stop reason as the panel says it; a neutral "stopped" when unknown.
fn stop_words(reason: Option<StopReason>) -> String {
    match reason {
        Some(StopReason::Idle) => "stopped because idle",
        Some(StopReason::Manual) => "stopped manually",
        Some(StopReason::Shutdown) => "stopped because the host shut down",
        Some(StopReason::Fenced) => "stopped because another controller took over",
        Some(StopReason::Killed) => "stopped because it was killed",
        Some(StopReason::Oom) => "stopped because it ran out of memory",
        None => "stopped",
    }
    .to_owned()
}

/// A unit enum's serde name (`Phase::Starting` → `starting`).
fn serde_plain<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn print_json<T: serde::Serialize + ?Sized>(
    out: &mut (dyn Write + Send),
    value: &T,
) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::Failed(format!("cannot print JSON: {e}")))?;
    writeln!(out, "{}", safe_json(&text)).map_err(stdout)
}

fn print_status(
    out: &mut (dyn Write + Send),
    s: &ComputerStatus,
    json: bool,
) -> Result<(), CliError> {
    if json {
        return print_json(out, s);
    }
    let mut text = format!(
        "id          {}\nname        {}\nowner       {}\nstate       {}\ncontainer   {}\nready       {}\n",
        s.id,
        Safe(&s.name),
        Safe(&s.owner),
        progress_line(s),
        container_word(s.container),
        s.ready
    );
    if let Some(at) = s.stopped_at {
        text.push_str(&format!("stopped at  {}\n", at.to_rfc3339()));
    }
    text.push_str(&format!(
        "resumable   {}{}\n",
        s.resumable,
        s.resumable_problem
            .as_deref()
            .map(|p| format!(" ({})", Safe(p)))
            .unwrap_or_default()
    ));
    if let Some(idle) = &s.idle {
        text.push_str(&format!("idle        {}\n", idle_words(idle)));
    }
    text.push_str(&format!(
        "generation  {}\nimage       {}\n",
        s.generation,
        Safe(&s.image_id)
    ));
    if let Some(limit) = &s.workspace_limit {
        text.push_str(&format!("workspace   {}\n", limit_words(limit)));
    }
    if let Some(health) = &s.health {
        text.push_str(&format!("health      {}\n", serde_plain(&health.overall)));
        for check in &health.checks {
            text.push_str(&format!(
                "  {:<18} {:<8} {}\n",
                Safe(&check.name),
                serde_plain(&check.status),
                Safe(&check.detail)
            ));
        }
    }
    out.write_all(text.as_bytes()).map_err(stdout)
}

/// The workspace limit in words: its sizes, or that there is none and why.
fn limit_words(limit: &dormouse_protocol::api::WorkspaceLimit) -> String {
    if limit.enforced {
        let bytes = limit
            .bytes
            .map_or_else(|| "?".to_owned(), |b| format!("{} MiB", b >> 20));
        let inodes = limit
            .inodes
            .map_or_else(|| "?".to_owned(), |i| i.to_string());
        format!("limited to {bytes} and {inodes} files")
    } else {
        format!(
            "no size limit ({})",
            Safe(limit.reason.as_deref().unwrap_or("not enforced"))
        )
    }
}

fn idle_words(idle: &dormouse_protocol::api::IdleStatus) -> String {
    let window = humantime::format_duration(Duration::from_secs(idle.timeout_ms / 1000));
    match idle.stops_at {
        Some(at) => {
            let left = u64::try_from((at - chrono::Utc::now()).num_seconds()).unwrap_or(0);
            format!(
                "stops in {} (window {window})",
                humantime::format_duration(Duration::from_secs(left))
            )
        }
        None => format!("timer paused (window {window})"),
    }
}

fn print_table(out: &mut (dyn Write + Send), list: &[ComputerStatus]) -> Result<(), CliError> {
    if list.is_empty() {
        return writeln!(out, "no desktops (create one with `dormouse create`)").map_err(stdout);
    }
    let mut text = format!(
        "{:<10} {:<20} {:<10} {:<6} {}\n",
        "ID", "NAME", "CONTAINER", "READY", "STATE"
    );
    for s in list {
        let short = &s.id.to_string()[..8];
        text.push_str(&format!(
            "{:<10} {:<20} {:<10} {:<6} {}\n",
            short,
            Safe(&s.name),
            container_word(s.container),
            if s.ready { "yes" } else { "no" },
            progress_line(s)
        ));
    }
    out.write_all(text.as_bytes()).map_err(stdout)
}

fn stdout(source: std::io::Error) -> CliError {
    CliError::Io {
        path: Path::new("<stdout>").to_owned(),
        source,
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (e.g. 30s, 5min)"))
}
