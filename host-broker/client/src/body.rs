//! Reading an answer's body into memory with a bound: chunk by chunk as it
//! arrives, stopping at the first byte past the bound (and before any byte
//! when the `Content-Length` already says more), so no answer, whatever
//! its size (a workspace file a guest left, say), is ever held whole past
//! what its caller can take.
//!
//! It owns that one loop and the bounds of the client's buffered answers;
//! it never decides what an answer means. Bodies that may be any size are
//! streamed into a writer instead ([`crate::Client::fetch_into`]).

use reqwest::Method;

use crate::{transport, Error};

/// Most bytes of a successful answer the client holds in memory (JSON,
/// a screenshot, an action batch's images, an exec result): above the
/// largest any route sends (the guest's frames are bounded at 32 MiB, an
/// exec result at twice 8 MiB of output, escaped), far below what would
/// hurt the process.
pub const MAX_ANSWER_BYTES: u64 = 256 * 1024 * 1024;

/// Most bytes of an error answer's body read (the API's errors are a few
/// hundred bytes; the rest of a longer one is left unread).
pub(crate) const MAX_ERROR_BODY: u64 = 64 * 1024;

/// A body read up to a bound.
#[derive(Debug)]
pub(crate) enum Bounded {
    /// The whole body, at most the bound.
    Whole(Vec<u8>),
    /// The body is longer than the bound: what was read of it (at most the
    /// bound and one chunk); the rest was never read.
    Over(Vec<u8>),
}

impl Bounded {
    /// The whole body, or [`Error::TooLarge`] for `method path` past `limit`.
    pub(crate) fn whole(self, method: &Method, path: &str, limit: u64) -> Result<Vec<u8>, Error> {
        match self {
            Self::Whole(bytes) => Ok(bytes),
            Self::Over(_) => Err(Error::TooLarge {
                method: method.clone(),
                path: path.to_owned(),
                limit,
            }),
        }
    }

    /// What was read, whole or not (for an error's message).
    pub(crate) fn into_prefix(self) -> Vec<u8> {
        match self {
            Self::Whole(bytes) | Self::Over(bytes) => bytes,
        }
    }
}

/// Reads `response`'s body, at most `limit` bytes: [`Bounded::Over`] as
/// soon as a byte past `limit` arrives, or before reading anything when the
/// `Content-Length` is over `limit`. Dropping the response then closes the
/// connection, so the sender stops too.
pub(crate) async fn read_bounded(
    response: &mut reqwest::Response,
    limit: u64,
    method: &Method,
    path: &str,
) -> Result<Bounded, Error> {
    if response.content_length().is_some_and(|len| len > limit) {
        return Ok(Bounded::Over(Vec::new()));
    }
    let mut out = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| transport(method, path, e))?
    {
        let room = limit.saturating_sub(u64::try_from(out.len()).unwrap_or(u64::MAX));
        let len = u64::try_from(chunk.len()).unwrap_or(u64::MAX);
        if len > room {
            // Keep exactly `limit + 1` bytes at most: the proof it is over.
            let keep = usize::try_from(room.saturating_add(1)).unwrap_or(usize::MAX);
            out.extend_from_slice(&chunk[..keep.min(chunk.len())]);
            return Ok(Bounded::Over(out));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bounded::Whole(out))
}

/// A successful answer's body, whole, within [`MAX_ANSWER_BYTES`].
pub(crate) async fn answer_body(
    response: &mut reqwest::Response,
    method: &Method,
    path: &str,
) -> Result<Vec<u8>, Error> {
    read_bounded(response, MAX_ANSWER_BYTES, method, path)
        .await?
        .whole(method, path, MAX_ANSWER_BYTES)
}

/// The error an answer that is not a 2xx means, from at most
/// [`MAX_ERROR_BODY`] bytes of its body.
pub(crate) async fn error_of(
    mut response: reqwest::Response,
    method: &Method,
    path: &str,
) -> Error {
    let status = response.status();
    match read_bounded(&mut response, MAX_ERROR_BODY, method, path).await {
        Ok(body) => crate::answer_error(method.clone(), path, status, &body.into_prefix()),
        Err(e) => e,
    }
}
