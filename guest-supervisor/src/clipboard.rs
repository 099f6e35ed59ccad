//! The desktop's clipboard for the `clipboard_get` and `clipboard_set`
//! actions, through `xclip` run as the desktop user on the desktop's
//! display.
//!
//! Owns running xclip, bounded in time and in bytes. `set` feeds the text
//! to `xclip -i` for CLIPBOARD and for PRIMARY: each forks a child that
//! owns its selection and answers requests for it, and the parent exits.
//! The parent exits with the ownership request still unsent in the child's
//! buffer (the child sends it when it first waits for an event), so `set`
//! returns only once the X server names a new owner of each selection: a
//! `clipboard_get` right after reads the new text. The child exits when another client takes
//! the selection (the next `set`, a copy in an application), and is reaped
//! as an orphan by [`crate::init`], so calls never pile up processes.
//! `get` answers `""` when the X server names no owner of CLIPBOARD, else
//! reads `xclip -o` up to [`MAX_CLIPBOARD_BYTES`]; an xclip that fails is
//! an error with its status and the first line of its stderr (xclip's
//! own message: `-o` never writes the text there). Every process is
//! spawned through [`crate::init::spawn`] and waited on without `waitpid`;
//! one that outlives its bound is killed with its process group. It never
//! logs the text.

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dormouse_protocol::actions::MAX_CLIPBOARD_BYTES;
use nix::sys::signal::Signal;
use x11rb::protocol::xproto::{AtomEnum, ConnectionExt as _};
use x11rb::rust_connection::RustConnection;

use crate::config::Config;
use crate::init::{self, OwnedChild};
use crate::services::desktop_command;
use crate::x_client::{self, XError};

/// How long one xclip may take.
pub const XCLIP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the clipboard could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ClipboardError {
    /// xclip could not be started or fed.
    #[error("xclip: {0}")]
    Spawn(#[from] std::io::Error),
    /// xclip did not finish within [`XCLIP_TIMEOUT`].
    #[error("xclip did not finish within {0:?}")]
    Timeout(Duration),
    /// xclip failed: its status, and for a read the first line of its
    /// stderr (a set's stderr is not passed on).
    #[error("xclip failed ({0})")]
    Failed(String),
    /// The selection holds more than [`MAX_CLIPBOARD_BYTES`].
    #[error("the clipboard holds more than {MAX_CLIPBOARD_BYTES} bytes")]
    TooLarge,
    /// The X server could not be asked who owns a selection.
    #[error(transparent)]
    X(#[from] XError),
}

impl ClipboardError {
    /// The action's error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::TooLarge => "clipboard_too_large",
            Self::Timeout(_) => "timeout",
            Self::Spawn(_) | Self::Failed(_) => "clipboard_failed",
            Self::X(_) => "x_error",
        }
    }
}

/// xclip as the desktop user, in a process group of its own, so a
/// timeout's kill reaches the forked owner too.
fn xclip(config: &Config, args: &[&str]) -> Command {
    let mut cmd = desktop_command(config, "xclip");
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    cmd
}

/// Waits (blocking, polling the reaper's answer) until `child` ended.
fn wait(child: &mut OwnedChild, until: Instant) -> Result<init::ChildExit, ClipboardError> {
    loop {
        if let Some(exit) = child.exited() {
            return Ok(exit);
        }
        if Instant::now() >= until {
            child.signal_group(Signal::SIGKILL);
            return Err(ClipboardError::Timeout(XCLIP_TIMEOUT));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Makes the desktop user's xclip own CLIPBOARD and PRIMARY with `text`,
/// and returns once the X server (asked on `conn`) names the new owners.
/// Blocking; at most [`XCLIP_TIMEOUT`] per selection.
pub fn set(config: &Config, conn: &RustConnection, text: &str) -> Result<(), ClipboardError> {
    let clipboard = x_client::atom(conn, b"CLIPBOARD")?;
    for (selection, atom) in [
        ("clipboard", clipboard),
        ("primary", AtomEnum::PRIMARY.into()),
    ] {
        let before = owner(conn, atom)?;
        let mut cmd = xclip(config, &["-selection", selection, "-i"]);
        cmd.stdin(Stdio::piped());
        let (mut owned, mut child) = init::spawn(&mut cmd)?;
        let until = Instant::now() + XCLIP_TIMEOUT;
        if let Some(mut stdin) = child.stdin.take() {
            // A pipe holds 64 KiB; more waits for xclip to read, which it
            // does at once (a stuck one is killed below, ending the write).
            let fed = stdin.write_all(text.as_bytes());
            drop(stdin);
            if let Err(e) = fed {
                owned.signal_group(Signal::SIGKILL);
                return Err(e.into());
            }
        }
        let exit = wait(&mut owned, until)?;
        if !exit.success() {
            return Err(ClipboardError::Failed(exit.to_string()));
        }
        // xclip makes a window of its own for each run: a new owner is it.
        loop {
            let now = owner(conn, atom)?;
            if now != before && now != x11rb::NONE {
                break;
            }
            if Instant::now() >= until {
                return Err(ClipboardError::Timeout(XCLIP_TIMEOUT));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(())
}

/// The window that owns `selection` now (`NONE` when none does).
fn owner(conn: &RustConnection, selection: u32) -> Result<u32, XError> {
    Ok(conn.get_selection_owner(selection)?.reply()?.owner)
}

/// Most bytes of a failed xclip's stderr read for its reason.
const MAX_REASON_BYTES: u64 = 4096;
/// Longest reason passed on, in characters.
const MAX_REASON_CHARS: usize = 200;

/// The text of CLIPBOARD, empty when the X server (asked on `conn`) names
/// no owner of it. Blocking; at most [`XCLIP_TIMEOUT`].
pub fn get(config: &Config, conn: &RustConnection) -> Result<String, ClipboardError> {
    let clipboard = x_client::atom(conn, b"CLIPBOARD")?;
    if owner(conn, clipboard)? == x11rb::NONE {
        return Ok(String::new());
    }
    let mut cmd = xclip(config, &["-o", "-selection", "clipboard"]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut owned, mut child) = init::spawn(&mut cmd)?;
    let until = Instant::now() + XCLIP_TIMEOUT;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        owned.signal_group(Signal::SIGKILL);
        return Err(ClipboardError::Failed("no stdout or stderr".into()));
    };
    // Its reason, should it fail: read beside stdout, so neither pipe
    // fills while the other is read.
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.take(MAX_REASON_BYTES).read_to_end(&mut bytes);
        let _ = err_tx.send(bytes);
    });
    // Read on a thread of its own, so a stuck xclip is killed on time (the
    // kill closes the pipe and ends the read).
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let limit = u64::try_from(MAX_CLIPBOARD_BYTES).unwrap_or(u64::MAX) + 1;
        let read = stdout.take(limit).read_to_end(&mut bytes).map(|_| bytes);
        let _ = tx.send(read);
    });
    let left = until.saturating_duration_since(Instant::now());
    let bytes = match rx.recv_timeout(left) {
        Ok(read) => read?,
        Err(_) => {
            owned.signal_group(Signal::SIGKILL);
            return Err(ClipboardError::Timeout(XCLIP_TIMEOUT));
        }
    };
    if bytes.len() > MAX_CLIPBOARD_BYTES {
        owned.signal_group(Signal::SIGKILL);
        return Err(ClipboardError::TooLarge);
    }
    let exit = wait(&mut owned, until)?;
    if !exit.success() {
        let left = until.saturating_duration_since(Instant::now());
        let stderr = err_rx.recv_timeout(left).unwrap_or_default();
        return Err(failed(&exit, &stderr));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A failed xclip as an error: its status and the first line of its
/// stderr, control characters as `?`, cut to [`MAX_REASON_CHARS`].
fn failed(exit: &init::ChildExit, stderr: &[u8]) -> ClipboardError {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty());
    match line {
        Some(line) => {
            let mut reason: String = line
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .take(MAX_REASON_CHARS)
                .collect();
            if line.chars().count() > MAX_REASON_CHARS {
                reason.push('…');
            }
            ClipboardError::Failed(format!("{exit}: {reason}"))
        }
        None => ClipboardError::Failed(format!("{exit}, nothing on stderr")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_says_why() {
        let e = failed(
            &init::ChildExit::Code(1),
            b"\nError: target STRING not available\nmore\n",
        );
        assert_eq!(e.code(), "clipboard_failed");
        assert_eq!(
            e.to_string(),
            "xclip failed (exit 1: Error: target STRING not available)"
        );
        let e = failed(&init::ChildExit::Signal(9), b"");
        assert_eq!(
            e.to_string(),
            "xclip failed (signal 9 (SIGKILL), nothing on stderr)"
        );
        let long = format!("Error: \x1b[31m{}", "x".repeat(500));
        let e = failed(&init::ChildExit::Code(1), long.as_bytes()).to_string();
        assert!(!e.contains('\x1b') && e.ends_with("…)"), "{e}");
        assert!(e.chars().count() < MAX_REASON_CHARS + 40);
    }
}
