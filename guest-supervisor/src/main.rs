//! Thin entry point; the logic lives in the library.
//!
//! `run` (the default) is PID 1 of a desktop container; `probe` runs the
//! self-probe once and prints its report (exit 0 only when it is ok);
//! `protocol-version` prints the guest protocol version (the image build
//! labels the image with it).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use dormouse_protocol::CheckStatus;
use dormouse_supervisor::config::{Config, DEFAULT_CONFIG_PATH};

/// PID 1 of a Dormouse desktop container.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Configuration file (TOML). A missing default file means defaults.
    #[arg(long, env = "DORMOUSE_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Overrides one configuration key, e.g. `--set width=1920`; wins over
    /// the file and `DORMOUSE_*` variables. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value, global = true)]
    overrides: Vec<(String, String)>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Prepare the home, run the desktop, stop gracefully on SIGTERM.
    Run,
    /// Run the self-probe once, print the report as JSON; exit 0 iff ok.
    Probe,
    /// Print the guest protocol version.
    ProtocolVersion,
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    Ok((key.trim().to_owned(), value.to_owned()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Cmd::Run);
    if let Cmd::ProtocolVersion = command {
        println!("{}", dormouse_protocol::PROTOCOL_VERSION);
        return ExitCode::SUCCESS;
    }
    match start(cli.config, &cli.overrides, command) {
        Ok(code) => code,
        Err(e) => {
            // Logging may not be up yet; stderr always is.
            eprintln!("dormouse-supervisor: {e:#}");
            tracing::error!(error = format!("{e:#}"), "fatal");
            ExitCode::FAILURE
        }
    }
}

fn start(
    file: Option<PathBuf>,
    overrides: &[(String, String)],
    command: Cmd,
) -> anyhow::Result<ExitCode> {
    let required = file.is_some();
    let file = file.unwrap_or_else(|| DEFAULT_CONFIG_PATH.into());
    let (config, notes) = Config::load(&file, required, std::env::vars(), overrides)
        .context("loading the configuration")?;
    init_logging(&config);
    for note in notes {
        tracing::info!("{note}");
    }
    // One thread: the supervisor waits on events, it never computes. The
    // few blocking X calls get a small pool of their own.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()
        .context("building the runtime")?;
    let config = Arc::new(config);
    let code = match command {
        Cmd::Run => {
            let stopped = runtime
                .block_on(dormouse_supervisor::run::run(config))
                .context("running the desktop")?;
            tracing::info!(?stopped, "exiting");
            ExitCode::SUCCESS
        }
        Cmd::Probe => {
            let report = runtime.block_on(dormouse_supervisor::probe::probe_once(&config, &[]));
            println!(
                "{}",
                serde_json::to_string_pretty(&report).context("encoding the report")?
            );
            if report.overall == CheckStatus::Ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Cmd::ProtocolVersion => ExitCode::SUCCESS,
    };
    // Never hang the exit on a blocking X call stuck on a dead server.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    Ok(code)
}

fn init_logging(config: &Config) {
    let level = config
        .log_level
        .parse::<tracing::Level>()
        .unwrap_or(tracing::Level::INFO);
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_ansi(false)
        .with_target(false);
    if config.log_format == "json" {
        builder.json().init();
    } else {
        builder.compact().init();
    }
}
