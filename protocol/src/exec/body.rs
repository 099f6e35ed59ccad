//! The HTTP body of `POST /v1/computers/{id}/exec`: its shape
//! ([`ExecResultBody`]) and a rendering of it that streams
//! ([`StreamedBody`]).
//!
//! Output is at most 8 MiB a stream, but its JSON can be six times that (a
//! NUL is `\u0000`) and building it whole means holding it beside the bytes
//! it came from. [`StreamedBody`] serializes the same JSON with the output
//! escaped (or base64-encoded) piece by piece as it is written, so what a
//! writer holds is bounded by its own buffer, not by the output. It never
//! changes the shape: a client reads it as an [`ExecResultBody`].

use std::fmt::{self, Write as _};

use serde::ser::{SerializeStruct as _, Serializer};
use serde::{Deserialize, Serialize};

use super::ExecResult;

/// How the HTTP body carries output bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputEncoding {
    /// UTF-8, invalid sequences replaced by U+FFFD.
    #[default]
    Utf8,
    /// Standard base64 of the raw bytes.
    Base64,
}

/// `200` answer of `POST /v1/computers/{id}/exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResultBody {
    /// See [`ExecResult::exit_code`].
    pub exit_code: Option<i32>,
    /// See [`ExecResult::signal`].
    pub signal: Option<String>,
    /// See [`ExecResult::timed_out`].
    pub timed_out: bool,
    /// Standard output in the asked [`OutputEncoding`].
    pub stdout: String,
    /// Standard error in the asked [`OutputEncoding`].
    pub stderr: String,
    /// See [`ExecResult::stdout_truncated`].
    pub stdout_truncated: bool,
    /// See [`ExecResult::stderr_truncated`].
    pub stderr_truncated: bool,
    /// See [`ExecResult::duration_ms`].
    pub duration_ms: u64,
}

impl ExecResult {
    /// The HTTP body, built whole: output as UTF-8 with invalid bytes
    /// replaced, or as base64 (`?encoding=base64`).
    pub fn to_body(&self, encoding: OutputEncoding) -> ExecResultBody {
        let render = |bytes: &[u8]| Rendered { bytes, encoding }.to_string();
        ExecResultBody {
            exit_code: self.exit_code,
            signal: self.signal.clone(),
            timed_out: self.timed_out,
            stdout: render(&self.stdout),
            stderr: render(&self.stderr),
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            duration_ms: self.duration_ms,
        }
    }

    /// The same body as [`Self::to_body`], serialized as it is written
    /// (`serde_json::to_writer`): the output is escaped piece by piece,
    /// never held rendered.
    pub fn streamed_body(&self, encoding: OutputEncoding) -> StreamedBody<'_> {
        StreamedBody {
            result: self,
            encoding,
        }
    }
}

/// [`ExecResultBody`]'s JSON rendered from an [`ExecResult`] while it is
/// written ([`ExecResult::streamed_body`]).
#[derive(Debug, Clone, Copy)]
pub struct StreamedBody<'a> {
    result: &'a ExecResult,
    encoding: OutputEncoding,
}

impl Serialize for StreamedBody<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.result;
        let out = |bytes| Rendered {
            bytes,
            encoding: self.encoding,
        };
        let mut body = s.serialize_struct("ExecResultBody", 8)?;
        body.serialize_field("exit_code", &r.exit_code)?;
        body.serialize_field("signal", &r.signal)?;
        body.serialize_field("timed_out", &r.timed_out)?;
        body.serialize_field("stdout", &out(&r.stdout))?;
        body.serialize_field("stderr", &out(&r.stderr))?;
        body.serialize_field("stdout_truncated", &r.stdout_truncated)?;
        body.serialize_field("stderr_truncated", &r.stderr_truncated)?;
        body.serialize_field("duration_ms", &r.duration_ms)?;
        body.end()
    }
}

/// Output bytes as the text the body carries, written in pieces.
struct Rendered<'a> {
    bytes: &'a [u8],
    encoding: OutputEncoding,
}

/// Bytes base64-encoded per piece (a multiple of 3, so the pieces join into
/// one standard encoding).
const BASE64_PIECE: usize = 3 * 4096;

impl fmt::Display for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.encoding {
            // What `String::from_utf8_lossy` makes: each invalid sequence
            // one U+FFFD.
            OutputEncoding::Utf8 => {
                for chunk in self.bytes.utf8_chunks() {
                    f.write_str(chunk.valid())?;
                    if !chunk.invalid().is_empty() {
                        f.write_char(char::REPLACEMENT_CHARACTER)?;
                    }
                }
                Ok(())
            }
            OutputEncoding::Base64 => {
                use base64::Engine as _;
                let mut piece = String::with_capacity(BASE64_PIECE / 3 * 4);
                for chunk in self.bytes.chunks(BASE64_PIECE) {
                    piece.clear();
                    base64::engine::general_purpose::STANDARD.encode_string(chunk, &mut piece);
                    f.write_str(&piece)?;
                }
                Ok(())
            }
        }
    }
}

impl Serialize for Rendered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // serde_json escapes what `collect_str` is given as it comes.
        s.collect_str(self)
    }
}
