//! Thin entry point; the logic lives in the library.
//!
//! `run` (the default) is PID 1 of a desktop container; `probe` runs the
//! self-probe once and prints its report (exit 0 only when it is ok);
//! `protocol-version` prints the guest protocol version (the image build
//! labels the image with it).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use dormouse_protocol::CheckStatus;
use dormouse_supervisor::bridge::Target;
use dormouse_supervisor::config::{Config, DEFAULT_CONFIG_PATH};

const USAGE: &str = "\
PID 1 of a Dormouse desktop container.

Usage: dormouse-supervisor [OPTIONS] [COMMAND]

Commands:
  run               Prepare the home, run the desktop, stop gracefully on SIGTERM (default)
  probe             Run the self-probe once, print the report as JSON; exit 0 iff ok
  bridge            Relay stdin/stdout to the supervisor socket (the guest channel
                    over an engine's exec stream, where no directory is mounted)
  bridge-vnc        Relay stdin/stdout to the VNC socket (the live screen over
                    the same exec stream)
  protocol-version  Print the guest protocol version

Options:
  --config <FILE>      Configuration file (TOML) [env: DORMOUSE_CONFIG]
                       [default: /etc/dormouse/supervisor.toml; missing means defaults]
  --set <KEY=VALUE>    Override one configuration key; wins over the file and
                       DORMOUSE_* variables. Repeatable.
  -h, --help           Print help
  -V, --version        Print version
";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Cli {
    /// Run a command.
    Command {
        config: Option<PathBuf>,
        overrides: Vec<(String, String)>,
        command: Cmd,
    },
    /// Print the usage.
    Help,
    /// Print the version.
    Version,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    Run,
    Probe,
    Bridge(Target),
    ProtocolVersion,
}

/// Parses the arguments (without the program name). Hand-written rather
/// than with a parser crate: three words and two options do not earn the
/// resident memory of one in a 4 MiB PID 1.
fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Cli, String> {
    let mut config = None;
    let mut overrides = Vec::new();
    let mut command = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("argument {a:?} is not UTF-8"))?;
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or_else(|| format!("{name} needs a value")),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Cli::Help),
            "-V" | "--version" => return Ok(Cli::Version),
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--set" => overrides.push(parse_key_value(&value("--set")?)?),
            word if !word.starts_with('-') && command.is_none() => {
                command = Some(match word {
                    "run" => Cmd::Run,
                    "probe" => Cmd::Probe,
                    "bridge" => Cmd::Bridge(Target::Supervisor),
                    "bridge-vnc" => Cmd::Bridge(Target::Vnc),
                    "protocol-version" => Cmd::ProtocolVersion,
                    other => return Err(format!("unknown command {other:?}")),
                });
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok(Cli::Command {
        config,
        overrides,
        command: command.unwrap_or(Cmd::Run),
    })
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    Ok((key.trim().to_owned(), value.to_owned()))
}

fn main() -> ExitCode {
    let (config, overrides, command) = match parse_args(std::env::args_os().skip(1)) {
        Ok(Cli::Command {
            config,
            overrides,
            command,
        }) => (config, overrides, command),
        Ok(Cli::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Cli::Version) => {
            println!("dormouse-supervisor {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("dormouse-supervisor: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if command == Cmd::ProtocolVersion {
        println!("{}", dormouse_protocol::PROTOCOL_VERSION);
        return ExitCode::SUCCESS;
    }
    let config = config.or_else(|| std::env::var_os("DORMOUSE_CONFIG").map(PathBuf::from));
    match start(config, &overrides, command) {
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
    dormouse_supervisor::init::tune_allocator();
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
                .block_on(dormouse_supervisor::supervise::run(config))
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
        Cmd::Bridge(target) => {
            match runtime.block_on(dormouse_supervisor::bridge::run(&config.run_dir, target)) {
                Ok(relayed) => {
                    tracing::debug!(?relayed, "bridge closed");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    tracing::error!(error = %e, "bridge failed");
                    ExitCode::FAILURE
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        parse_args(args.iter().map(OsString::from))
    }

    #[test]
    fn commands_and_options() {
        assert_eq!(
            parse(&[]),
            Ok(Cli::Command {
                config: None,
                overrides: vec![],
                command: Cmd::Run
            })
        );
        assert_eq!(
            parse(&[
                "--config",
                "/c.toml",
                "--set",
                "width=1920",
                "--set=browser=none",
                "probe"
            ]),
            Ok(Cli::Command {
                config: Some("/c.toml".into()),
                overrides: vec![
                    ("width".into(), "1920".into()),
                    ("browser".into(), "none".into())
                ],
                command: Cmd::Probe
            })
        );
        assert_eq!(
            parse(&["protocol-version"]),
            Ok(Cli::Command {
                config: None,
                overrides: vec![],
                command: Cmd::ProtocolVersion
            })
        );
        assert_eq!(
            parse(&["bridge"]),
            Ok(Cli::Command {
                config: None,
                overrides: vec![],
                command: Cmd::Bridge(Target::Supervisor)
            })
        );
        assert_eq!(
            parse(&["bridge-vnc"]),
            Ok(Cli::Command {
                config: None,
                overrides: vec![],
                command: Cmd::Bridge(Target::Vnc)
            })
        );
        assert_eq!(parse(&["--help"]), Ok(Cli::Help));
        assert_eq!(parse(&["-V"]), Ok(Cli::Version));
    }

    #[test]
    fn mistakes_are_errors() {
        assert!(parse(&["walk"]).is_err());
        assert!(parse(&["run", "probe"]).is_err());
        assert!(parse(&["--config"]).is_err());
        assert!(parse(&["--set", "novalue"]).is_err());
        assert!(parse(&["--frobnicate"]).is_err());
    }
}
