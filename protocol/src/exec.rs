//! Wire types of exec: running one command in the desktop as the desktop
//! user, and interactive sessions on a pseudo-terminal.
//!
//! Owns the *shape* and the *bounds* of an exec request, its result and the
//! frames of a terminal session, for both the broker's HTTP API
//! (`POST /v1/computers/{id}/exec`, `GET …/exec/ws`) and the guest socket.
//! Every request is hostile until [`ExecRequest::validate`] or
//! [`PtyOpen::validate`] accepted it; nothing here runs anything.
//!
//! Bytes (stdin, output, terminal data) are base64 strings in JSON. On the
//! guest socket, whose JSON part is bounded by [`crate::MAX_HEADER_LEN`],
//! the large byte fields travel as the frame's binary payload instead:
//! [`ExecRequest::into_frame`] / [`ExecRequest::from_frame`] and
//! [`ExecResult::into_frame`] / [`ExecResultHead::join`] move them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::frame::Message;

mod body;

pub use body::{ExecResultBody, OutputEncoding, StreamedBody};

/// Timeout when the request names none.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Longest timeout a request may ask for (one hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// Output kept per stream when the request names no cap (1 MiB).
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1024 * 1024;
/// Largest output cap per stream a request may ask for (8 MiB): both
/// streams together stay well inside one frame payload
/// ([`crate::MAX_PAYLOAD_LEN`]).
pub const MAX_OUTPUT_BYTES_LIMIT: u64 = 8 * 1024 * 1024;
/// Largest stdin of one request (8 MiB).
pub const MAX_STDIN_BYTES: usize = 8 * 1024 * 1024;
/// Most items in `argv`.
pub const MAX_ARGV_ITEMS: usize = 4096;
/// Most bytes of `argv` (all items together) or of `command`.
pub const MAX_COMMAND_BYTES: usize = 128 * 1024;
/// Most variables in `env`.
pub const MAX_ENV_VARS: usize = 256;
/// Most bytes of `env` (keys and values together).
pub const MAX_ENV_BYTES: usize = 64 * 1024;
/// Longest variable name in `env`.
pub const MAX_ENV_KEY_LEN: usize = 256;
/// Longest `cwd` (Linux `PATH_MAX`).
pub const MAX_CWD_BYTES: usize = 4096;
/// Variable the guest sets in every exec'd process to the exec's id. It is
/// the guest's to set: a request may not name it.
pub const EXEC_MARKER_ENV: &str = "DORMOUSE_EXEC";
/// The shell that runs `command` (as `sh -c <command>`).
pub const SHELL: &str = "/bin/sh";
/// Most bytes of terminal data in one frame.
pub const MAX_PTY_DATA: usize = 64 * 1024;
/// Most rows or columns of a terminal.
pub const MAX_PTY_DIMENSION: u16 = 1000;

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

fn default_max_output_bytes() -> u64 {
    DEFAULT_MAX_OUTPUT_BYTES
}

/// Why an exec request or a terminal frame was refused. Messages name the
/// offending field, never echo more than a short prefix of hostile input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecRequestError {
    /// Neither `argv` nor `command` was given.
    #[error("one of \"argv\" or \"command\" is required")]
    NoCommand,
    /// Both `argv` and `command` were given.
    #[error("\"argv\" and \"command\" are exclusive")]
    BothCommands,
    /// `argv` is empty, or its program (`argv[0]`) or `command` is empty.
    #[error("{0} is empty")]
    Empty(&'static str),
    /// A string holds a NUL byte, which no C string can carry.
    #[error("{0} contains a NUL byte")]
    Nul(&'static str),
    /// A field is over its size bound.
    #[error("{field} is {len} long, the limit is {max}")]
    TooLarge {
        /// Which field.
        field: &'static str,
        /// Its size (bytes or items).
        len: usize,
        /// The bound.
        max: usize,
    },
    /// An `env` name is not `[A-Za-z_][A-Za-z0-9_]*`.
    #[error("environment variable name {0:?} is not valid")]
    BadEnvName(String),
    /// An `env` name is the guest's own ([`EXEC_MARKER_ENV`]).
    #[error("environment variable {0} is reserved")]
    ReservedEnvName(&'static str),
    /// `timeout_ms` is 0 or over [`MAX_TIMEOUT_MS`].
    #[error("timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, got {0}")]
    Timeout(u64),
    /// `max_output_bytes` is over [`MAX_OUTPUT_BYTES_LIMIT`].
    #[error("max_output_bytes must be at most {MAX_OUTPUT_BYTES_LIMIT}, got {0}")]
    OutputLimit(u64),
    /// Terminal rows or columns are 0 or over [`MAX_PTY_DIMENSION`].
    #[error("terminal size {rows}x{cols} is out of range 1..={MAX_PTY_DIMENSION}")]
    TerminalSize {
        /// Rows asked for.
        rows: u16,
        /// Columns asked for.
        cols: u16,
    },
    /// stdin came both in the JSON and as the frame payload.
    #[error("stdin given twice (in the message and as the payload)")]
    StdinTwice,
}

/// `POST /v1/computers/{id}/exec`, and the guest's `exec` request.
///
/// Exactly one of `argv` (executed directly, `argv[0]` looked up in the
/// `PATH` of the environment) and `command` (run as `/bin/sh -c <command>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Shell command text, for `sh -c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Working directory: absolute, or relative to the workspace; the
    /// workspace when absent. Resolved with the desktop user's rights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables set on top of the desktop's environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Bytes written to the command's stdin, which is then closed; stdin is
    /// `/dev/null` when absent. Base64 in JSON.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "base64_opt")]
    pub stdin: Option<Vec<u8>>,
    /// Upper bound on the run; the command is killed when it passes.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Output kept per stream; the rest is read and discarded.
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: u64,
}

impl ExecRequest {
    /// A request for `argv` with every default.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            command: None,
            cwd: None,
            env: BTreeMap::new(),
            stdin: None,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }

    /// A request for `sh -c <command>` with every default.
    pub fn shell(command: impl Into<String>) -> Self {
        Self {
            argv: None,
            command: Some(command.into()),
            ..Self::argv(Vec::<String>::new())
        }
    }

    /// Checks every bound and returns the argv to execute (`command`
    /// becomes `["/bin/sh", "-c", command]`).
    pub fn validate(&self) -> Result<Vec<String>, ExecRequestError> {
        let argv = resolve_argv(self.argv.as_deref(), self.command.as_deref())?;
        check_cwd(self.cwd.as_deref())?;
        check_env(&self.env)?;
        if let Some(stdin) = &self.stdin {
            bounded("stdin", stdin.len(), MAX_STDIN_BYTES)?;
        }
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT_MS {
            return Err(ExecRequestError::Timeout(self.timeout_ms));
        }
        if self.max_output_bytes > MAX_OUTPUT_BYTES_LIMIT {
            return Err(ExecRequestError::OutputLimit(self.max_output_bytes));
        }
        Ok(argv)
    }

    /// Splits off stdin to send it as the frame payload on the guest socket.
    pub fn into_frame(mut self) -> (Self, Vec<u8>) {
        let stdin = self.stdin.take().unwrap_or_default();
        (self, stdin)
    }

    /// Puts a frame payload back as stdin (an empty payload is no stdin).
    pub fn from_frame(mut self, payload: Vec<u8>) -> Result<Self, ExecRequestError> {
        if payload.is_empty() {
            return Ok(self);
        }
        if self.stdin.is_some() {
            return Err(ExecRequestError::StdinTwice);
        }
        bounded("stdin", payload.len(), MAX_STDIN_BYTES)?;
        self.stdin = Some(payload);
        Ok(self)
    }
}

/// What an exec came to: the guest's answer, bytes intact.
///
/// Base64 bytes in JSON; the broker renders the HTTP body with
/// [`ExecResult::to_body`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// The exit code when the command exited; `null` when a signal ended it.
    pub exit_code: Option<i32>,
    /// The signal that ended it, e.g. `SIGTERM`, `SIGKILL` (after a timeout).
    pub signal: Option<String>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Standard output, at most `max_output_bytes`.
    #[serde(with = "base64_bytes")]
    pub stdout: Vec<u8>,
    /// Standard error, at most `max_output_bytes`.
    #[serde(with = "base64_bytes")]
    pub stderr: Vec<u8>,
    /// Whether stdout had more than was kept.
    pub stdout_truncated: bool,
    /// Whether stderr had more than was kept.
    pub stderr_truncated: bool,
    /// From the spawn until every process of the exec was confirmed gone.
    pub duration_ms: u64,
}

/// An [`ExecResult`] without its bytes, for the JSON part of a guest frame;
/// stdout then stderr are the frame's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResultHead {
    /// See [`ExecResult::exit_code`].
    pub exit_code: Option<i32>,
    /// See [`ExecResult::signal`].
    pub signal: Option<String>,
    /// See [`ExecResult::timed_out`].
    pub timed_out: bool,
    /// Bytes of stdout at the start of the payload; stderr is the rest.
    pub stdout_len: u64,
    /// See [`ExecResult::stdout_truncated`].
    pub stdout_truncated: bool,
    /// See [`ExecResult::stderr_truncated`].
    pub stderr_truncated: bool,
    /// See [`ExecResult::duration_ms`].
    pub duration_ms: u64,
}

/// The payload does not fit the head it came with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("exec result announces {stdout_len} bytes of stdout in a payload of {payload_len}")]
pub struct ExecPayloadError {
    /// What the head announced.
    pub stdout_len: u64,
    /// What came.
    pub payload_len: usize,
}

impl ExecResult {
    /// Splits the bytes off for the guest frame's payload.
    pub fn into_frame(self) -> (ExecResultHead, Vec<u8>) {
        let head = ExecResultHead {
            exit_code: self.exit_code,
            signal: self.signal,
            timed_out: self.timed_out,
            stdout_len: self.stdout.len() as u64,
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            duration_ms: self.duration_ms,
        };
        let mut payload = self.stdout;
        payload.extend_from_slice(&self.stderr);
        (head, payload)
    }
}

impl ExecResultHead {
    /// Joins the head with its frame payload.
    pub fn join(self, mut payload: Vec<u8>) -> Result<ExecResult, ExecPayloadError> {
        let split = usize::try_from(self.stdout_len)
            .ok()
            .filter(|n| *n <= payload.len())
            .ok_or(ExecPayloadError {
                stdout_len: self.stdout_len,
                payload_len: payload.len(),
            })?;
        let stderr = payload.split_off(split);
        Ok(ExecResult {
            exit_code: self.exit_code,
            signal: self.signal,
            timed_out: self.timed_out,
            stdout: payload,
            stderr,
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            duration_ms: self.duration_ms,
        })
    }
}

/// Opens an interactive session: a process on a pseudo-terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyOpen {
    /// Program and arguments; the desktop user's login shell when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Working directory, as for [`ExecRequest::cwd`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables set on top of the desktop's environment (and `TERM`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Terminal rows.
    pub rows: u16,
    /// Terminal columns.
    pub cols: u16,
}

impl PtyOpen {
    /// Checks every bound; returns the argv when one was given.
    pub fn validate(&self) -> Result<Option<Vec<String>>, ExecRequestError> {
        let argv = match &self.argv {
            Some(argv) => Some(resolve_argv(Some(argv), None)?),
            None => None,
        };
        check_cwd(self.cwd.as_deref())?;
        check_env(&self.env)?;
        check_size(self.rows, self.cols)?;
        Ok(argv)
    }
}

/// What the client sends on an open terminal session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PtyInput {
    /// Keystrokes (bytes for the terminal's input).
    PtyData {
        /// At most [`MAX_PTY_DATA`] bytes; base64 in JSON.
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
    },
    /// The terminal changed size.
    PtyResize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// End the session: its processes are killed and confirmed gone, then
    /// [`PtyEvent::PtyExit`] comes.
    PtyClose,
}

impl PtyInput {
    /// Checks the bounds of the frame.
    pub fn validate(&self) -> Result<(), ExecRequestError> {
        match self {
            Self::PtyData { data } => bounded("data", data.len(), MAX_PTY_DATA),
            Self::PtyResize { rows, cols } => check_size(*rows, *cols),
            Self::PtyClose => Ok(()),
        }
    }
}

impl Message for PtyInput {
    const KINDS: &'static [&'static str] = &["pty_data", "pty_resize", "pty_close"];
    fn payload_allowed(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match self {
            Self::PtyData { .. } => "pty_data",
            Self::PtyResize { .. } => "pty_resize",
            Self::PtyClose => "pty_close",
        }
    }
}

/// What the guest sends on an open terminal session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PtyEvent {
    /// Terminal output, at most [`MAX_PTY_DATA`] bytes; base64 in JSON.
    PtyOutput {
        /// The bytes.
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
    },
    /// The session ended and every process of it is confirmed gone; the
    /// last event of a session.
    PtyExit {
        /// Exit code of the session's process; `null` when a signal ended it.
        exit_code: Option<i32>,
        /// The signal that ended it, e.g. `SIGHUP`, `SIGKILL`.
        signal: Option<String>,
        /// How long the session lasted.
        duration_ms: u64,
    },
}

impl Message for PtyEvent {
    const KINDS: &'static [&'static str] = &["pty_output", "pty_exit"];
    fn payload_allowed(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match self {
            Self::PtyOutput { .. } => "pty_output",
            Self::PtyExit { .. } => "pty_exit",
        }
    }
}

/// A text message of the broker's terminal WebSocket
/// (`GET /v1/computers/{id}/exec/ws`); binary messages are the terminal's
/// bytes (keystrokes in, output out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TerminalMessage {
    /// Client → broker: the terminal changed size.
    Resize {
        /// Rows, 1 to [`MAX_PTY_DIMENSION`].
        rows: u16,
        /// Columns, 1 to [`MAX_PTY_DIMENSION`].
        cols: u16,
    },
    /// Client → broker: end the session (its processes are killed; `exit`
    /// follows).
    Close,
    /// Broker → client: the session ended and every process of it is
    /// confirmed gone; the last message before the close.
    Exit {
        /// Exit code of the session's process; `null` when a signal ended it.
        exit_code: Option<i32>,
        /// The signal that ended it, e.g. `SIGKILL`.
        signal: Option<String>,
        /// How long the session lasted.
        duration_ms: u64,
    },
    /// Broker → client: the session failed; the socket closes after it.
    Error {
        /// Stable code.
        code: String,
        /// For people.
        message: String,
    },
}

fn bounded(field: &'static str, len: usize, max: usize) -> Result<(), ExecRequestError> {
    if len > max {
        return Err(ExecRequestError::TooLarge { field, len, max });
    }
    Ok(())
}

fn no_nul(field: &'static str, text: &str) -> Result<(), ExecRequestError> {
    if text.contains('\0') {
        return Err(ExecRequestError::Nul(field));
    }
    Ok(())
}

fn resolve_argv(
    argv: Option<&[String]>,
    command: Option<&str>,
) -> Result<Vec<String>, ExecRequestError> {
    match (argv, command) {
        (None, None) => Err(ExecRequestError::NoCommand),
        (Some(_), Some(_)) => Err(ExecRequestError::BothCommands),
        (Some(argv), None) => {
            bounded("argv", argv.len(), MAX_ARGV_ITEMS)?;
            let total = argv.iter().map(String::len).sum();
            bounded("argv", total, MAX_COMMAND_BYTES)?;
            match argv.first() {
                None => return Err(ExecRequestError::Empty("argv")),
                Some(program) if program.is_empty() => {
                    return Err(ExecRequestError::Empty("argv[0]"))
                }
                Some(_) => {}
            }
            for arg in argv {
                no_nul("argv", arg)?;
            }
            Ok(argv.to_vec())
        }
        (None, Some(command)) => {
            bounded("command", command.len(), MAX_COMMAND_BYTES)?;
            if command.is_empty() {
                return Err(ExecRequestError::Empty("command"));
            }
            no_nul("command", command)?;
            Ok(vec![SHELL.into(), "-c".into(), command.into()])
        }
    }
}

fn check_cwd(cwd: Option<&str>) -> Result<(), ExecRequestError> {
    if let Some(cwd) = cwd {
        bounded("cwd", cwd.len(), MAX_CWD_BYTES)?;
        if cwd.is_empty() {
            return Err(ExecRequestError::Empty("cwd"));
        }
        no_nul("cwd", cwd)?;
    }
    Ok(())
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), ExecRequestError> {
    bounded("env", env.len(), MAX_ENV_VARS)?;
    let total = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    bounded("env", total, MAX_ENV_BYTES)?;
    for (name, value) in env {
        if !valid_env_name(name) {
            return Err(ExecRequestError::BadEnvName(
                name.chars().take(64).collect(),
            ));
        }
        if name == EXEC_MARKER_ENV {
            return Err(ExecRequestError::ReservedEnvName(EXEC_MARKER_ENV));
        }
        no_nul("env", value)?;
    }
    Ok(())
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_ENV_KEY_LEN`] long: what a shell
/// can name, and never `=` or NUL.
fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    first_ok
        && name.len() <= MAX_ENV_KEY_LEN
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn check_size(rows: u16, cols: u16) -> Result<(), ExecRequestError> {
    let ok = |n: u16| (1..=MAX_PTY_DIMENSION).contains(&n);
    if !ok(rows) || !ok(cols) {
        return Err(ExecRequestError::TerminalSize { rows, cols });
    }
    Ok(())
}

/// Bytes as one standard base64 string.
mod base64_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn encode(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))
    }
}

/// Optional bytes as a standard base64 string or `null`.
mod base64_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    // serde's `with` hands `&Option<Vec<u8>>` to serialize.
    #[allow(clippy::ref_option)]
    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => super::base64_bytes::serialize(bytes, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::base64_bytes")] Vec<u8>);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
    }
}

#[cfg(test)]
mod tests;
