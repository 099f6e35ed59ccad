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
mod activity;
mod cp;
mod create;
mod egress;
pub mod escape;
pub mod exec;
mod export;
pub mod files;
mod import;
mod lease;
mod ls;
mod mcp;
mod output;
mod rm;
mod screen;
mod screenshot;
mod start;
mod status;
mod stop;
mod touch;
mod wait;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use dormouse_client::token::{default_token_files, read_token_file, TokenFileError, TOKEN_FILE};
use dormouse_client::{Client, Endpoint, EventsError, StatusCode};
use uuid::Uuid;

use escape::Safe;
use output::print_json;

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
    /// Save an image of a desktop's screen (PNG unless --format says).
    Screenshot {
        /// Id, unique id prefix, or name.
        id: String,
        /// Output file.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// Scaled to fit WxH (aspect kept), through a `screenshot` action.
        #[arg(long, value_name = "WxH", value_parser = actions::parse_scale)]
        scale: Option<dormouse_protocol::actions::Scale>,
        /// png (default), jpeg or webp.
        #[arg(long)]
        format: Option<dormouse_protocol::image::ImageFormat>,
        /// 1..=100, for jpeg and webp (default 80).
        #[arg(long)]
        quality: Option<u8>,
        /// The screen kept at the broker's last stop (a WebP), without
        /// starting the desktop.
        #[arg(long, conflicts_with_all = ["scale", "format", "quality"])]
        last: bool,
    },
    /// Run one computer-use action, e.g. `act ID left_click 640 400`.
    Act(actions::ActArgs),
    /// Type text exactly, under any keyboard layout.
    Type(actions::TypeArgs),
    /// Press key combinations, e.g. `key ID ctrl+l`.
    Key(actions::KeyArgs),
    /// Show or change a desktop's egress policy, or print its audit.
    Egress {
        /// Id, unique id prefix, or name.
        id: String,
        /// What to do; prints the policy when absent.
        #[command(subcommand)]
        action: Option<egress::EgressAction>,
    },
    /// Print what was done to a desktop and by whom, newest first.
    Activity {
        /// Id, unique id prefix, or name.
        id: String,
        /// How many entries (1 to 500).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=500))]
        limit: u16,
    },
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
    /// Serve the MCP tools (computer, shell, files, desktops) over stdio.
    Mcp(mcp::McpArgs),
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
        /// What the person is asked to do, shown on the desktop's card in
        /// the panel while the link works.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
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

    /// Whether it is only the reader of our output having gone (`EPIPE`
    /// on stdout, as after `| head -n1`): the end of output, not a
    /// failure. A broken pipe to the broker is not this.
    pub fn is_closed_output(&self) -> bool {
        let source = match self {
            Self::Io { path, source } if path == Path::new(STDOUT) => source,
            // The client's local writes go to our `out` (stdout, or a file).
            Self::Http(dormouse_client::Error::Io { source, .. }) => source,
            _ => return false,
        };
        source.kind() == std::io::ErrorKind::BrokenPipe
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
        // Whoever read our output has all they wanted: stop quietly.
        Err(e) if e.is_closed_output() => ExitCode::SUCCESS,
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
    let c = &client;
    match args.command {
        CliCommand::Files(command) => files::run(c, command, json, out).await,
        CliCommand::Mcp(args) => mcp::run(c, args).await,
        CliCommand::Create {
            name,
            owner,
            wait,
            timeout,
        } => create::run(c, name, owner, wait.then_some(timeout), json, out).await,
        CliCommand::Ls => ls::run(c, json, out).await,
        CliCommand::Status { id, watch } => status::run(c, &id, watch, json, out).await,
        CliCommand::Start { id, wait, timeout } => {
            start::run(c, &id, wait.then_some(timeout), json, out).await
        }
        CliCommand::Stop { id } => stop::run(c, &id, json, out).await,
        CliCommand::Touch { id } => touch::run(c, &id, json, out).await,
        CliCommand::Activity { id, limit } => activity::run(c, &id, limit.into(), json, out).await,
        CliCommand::Egress { id, action } => egress::run(c, &id, action, json, out).await,
        CliCommand::Rm { id, purge } => rm::run(c, &id, purge, json, out).await,
        CliCommand::Act(a) => actions::act(c, a, json, out).await,
        CliCommand::Type(a) => actions::type_text(c, a, json, out).await,
        CliCommand::Key(a) => actions::key(c, a, json, out).await,
        CliCommand::Screenshot {
            id,
            output,
            last: true,
            ..
        } => screenshot::last(c, &id, &output, json, out).await,
        CliCommand::Screenshot {
            id,
            output,
            scale,
            format,
            quality,
            last: false,
        } => {
            let encoding = dormouse_protocol::image::ImageEncoding::new(format, quality)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            match scale {
                Some(scale) => {
                    actions::scaled_screenshot(c, &id, scale, encoding, &output, json, out).await
                }
                None => screenshot::run(c, &id, encoding, &output, json, out).await,
            }
        }
        CliCommand::Screen {
            id,
            control,
            ttl,
            reason,
        } => screen::screen(c, &id, control, ttl, reason, json, out).await,
        CliCommand::Lease { id, holder, ttl } => lease::run(c, &id, holder, ttl, json, out).await,
        CliCommand::Exec {
            id,
            cwd,
            env,
            stdin,
            timeout,
            argv,
        } => {
            let id = resolve(c, &id).await?;
            let args = exec::ExecArgs {
                argv,
                cwd,
                env,
                stdin,
                timeout,
            };
            match exec::exec(c, id, args, json, out).await? {
                0 => Ok(()),
                code => Err(CliError::Exited(code)),
            }
        }
        CliCommand::Shell { id, argv } => {
            let id = resolve(c, &id).await?;
            match exec::shell(c, id, &argv).await? {
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

/// How a failed write to stdout names its "file".
const STDOUT: &str = "<stdout>";

fn stdout(source: std::io::Error) -> CliError {
    CliError::Io {
        path: Path::new(STDOUT).to_owned(),
        source,
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (e.g. 30s, 5min)"))
}
