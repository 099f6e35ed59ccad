//! `dormouse exec` and `dormouse shell`: commands in a desktop.
//!
//! `exec` is the one place where the CLI prints bytes a desktop chose as
//! they are, unescaped: the command's stdout and stderr go to this
//! process's stdout and stderr, and its exit code becomes ours (128 + the
//! signal number when a signal ended it, 124 after a timeout). `shell` puts
//! the local terminal in raw mode for the session, forwards its size
//! changes, and restores it on every way out.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Read as _, Write};
use std::os::fd::AsFd as _;
use std::time::Duration;

use dormouse_client::{Client, TerminalEvent};
use dormouse_protocol::exec::{ExecRequest, DEFAULT_MAX_OUTPUT_BYTES, MAX_STDIN_BYTES};
use nix::sys::termios::{self, SetArg, Termios};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use uuid::Uuid;

use crate::escape::Safe;
use crate::CliError;

nix::ioctl_read_bad!(window_size, nix::libc::TIOCGWINSZ, nix::libc::winsize);

/// Exit code after a command's timeout (as `timeout(1)` says).
pub const TIMED_OUT_EXIT: u8 = 124;

/// What `dormouse exec` was asked.
#[derive(Debug, Clone)]
pub struct ExecArgs {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory in the desktop.
    pub cwd: Option<String>,
    /// `NAME=VALUE` pairs.
    pub env: Vec<String>,
    /// Send this process's stdin to the command.
    pub stdin: bool,
    /// The command's timeout.
    pub timeout: Duration,
}

/// Runs `args` in desktop `id`; answers the exit code to leave with.
pub async fn exec(
    client: &Client,
    id: Uuid,
    args: ExecArgs,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<u8, CliError> {
    let mut env = BTreeMap::new();
    for pair in &args.env {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("--env {pair:?} is not NAME=VALUE")))?;
        env.insert(name.to_owned(), value.to_owned());
    }
    let stdin = if args.stdin {
        let mut bytes = Vec::new();
        let limit = u64::try_from(MAX_STDIN_BYTES).unwrap_or(u64::MAX) + 1;
        std::io::stdin()
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(|e| CliError::Failed(format!("reading stdin: {e}")))?;
        if bytes.len() > MAX_STDIN_BYTES {
            return Err(CliError::Usage(format!(
                "stdin is longer than {MAX_STDIN_BYTES} bytes"
            )));
        }
        Some(bytes)
    } else {
        None
    };
    let request = ExecRequest {
        argv: Some(args.argv),
        command: None,
        cwd: args.cwd,
        env,
        stdin,
        timeout_ms: u64::try_from(args.timeout.as_millis()).unwrap_or(u64::MAX),
        max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
    };
    let result = client.exec(id, &request, !json).await?;
    if json {
        crate::print_json(out, &result)?;
        return Ok(0);
    }
    let decode = |text: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| CliError::Failed("the broker sent output that is not base64".into()))
    };
    // The one place raw bytes from a desktop are meant to reach the terminal.
    out.write_all(&decode(&result.stdout)?)
        .map_err(crate::stdout)?;
    out.flush().map_err(crate::stdout)?;
    let mut err = std::io::stderr();
    let _ = err.write_all(&decode(&result.stderr)?);
    for (truncated, which) in [
        (result.stdout_truncated, "stdout"),
        (result.stderr_truncated, "stderr"),
    ] {
        if truncated {
            let _ = writeln!(
                err,
                "dormouse: {which} was cut at {DEFAULT_MAX_OUTPUT_BYTES} bytes"
            );
        }
    }
    if result.timed_out {
        let _ = writeln!(err, "dormouse: the command timed out and was killed");
        return Ok(TIMED_OUT_EXIT);
    }
    Ok(exit_status(result.exit_code, result.signal.as_deref()))
}

/// A shell's convention: the exit code, or 128 + the signal's number.
fn exit_status(code: Option<i32>, signal: Option<&str>) -> u8 {
    if let Some(code) = code {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    let number = signal
        .and_then(|name| name.parse::<nix::sys::signal::Signal>().ok())
        .map_or(0, |s| s as i32);
    u8::try_from(128 + number).unwrap_or(1)
}

/// The local terminal's size, when stdout is one.
fn terminal_size() -> Option<(u16, u16)> {
    let mut size = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&std::io::stdout());
    // SAFETY: `fd` is this process's stdout, open for the whole call, and
    // `size` is a valid `winsize` TIOCGWINSZ writes into and nothing else.
    unsafe { window_size(fd, &mut size) }.ok()?;
    (size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
}

/// The local terminal in raw mode until dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> Option<Self> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).ok()?;
        Some(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

/// An interactive session in desktop `id`; answers the exit code to leave
/// with.
pub async fn shell(client: &Client, id: Uuid, argv: &[String]) -> Result<u8, CliError> {
    let (rows, cols) = terminal_size().unwrap_or((24, 80));
    let terminal = client.exec_ws(id, rows, cols, argv).await?;
    let (mut input, mut output) = (terminal.input, terminal.output);
    let mut winch =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            .map_err(|e| CliError::Failed(format!("cannot watch the terminal size: {e}")))?;
    let raw = RawMode::enter();
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let mut buf = vec![0u8; 16 * 1024];
    let mut stdin_open = true;
    let end = loop {
        tokio::select! {
            read = stdin.read(&mut buf), if stdin_open => match read {
                Ok(0) | Err(_) => {
                    stdin_open = false;
                    let _ = input.close().await;
                }
                Ok(n) => {
                    if input.send(buf.get(..n).unwrap_or_default()).await.is_err() {
                        break Err("the connection to the broker broke".to_owned());
                    }
                }
            },
            _ = winch.recv() => {
                if let Some((rows, cols)) = terminal_size() {
                    let _ = input.resize(rows, cols).await;
                }
            }
            event = output.next() => match event {
                Ok(Some(TerminalEvent::Output(bytes))) => {
                    // The terminal's own bytes, as a terminal program shows them.
                    let _ = stdout.write_all(&bytes).await;
                    let _ = stdout.flush().await;
                }
                Ok(Some(TerminalEvent::Exit { exit_code, signal, .. })) => {
                    break Ok(exit_status(exit_code, signal.as_deref()));
                }
                Ok(Some(TerminalEvent::Error { code, message })) => {
                    break Err(format!("{code}: {message}"));
                }
                Ok(None) => break Err("the session ended without an exit status".to_owned()),
                Err(e) => break Err(format!("the connection to the broker broke: {e}")),
            }
        }
    };
    drop(raw);
    end.map_err(|e| CliError::Failed(Safe(&e).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_follow_the_shell() {
        assert_eq!(exit_status(Some(0), None), 0);
        assert_eq!(exit_status(Some(3), None), 3);
        assert_eq!(exit_status(None, Some("SIGKILL")), 137);
        assert_eq!(exit_status(None, Some("SIGTERM")), 143);
        assert_eq!(exit_status(None, Some("SIGWHAT")), 128);
    }
}
