//! The request-body deadline as the handlers see it: the marker a handler
//! sets to count the deadline per frame, and the error a late body reports.
//! The server ([`crate::daemon::serve`]) enforces the deadline; this module
//! only names it, so the handlers need nothing from the daemon. And the one
//! way a response body is produced by blocking code ([`stream_from`]), in
//! bounded chunks.

use std::sync::atomic::{AtomicBool, Ordering};

use dormouse_core::workspace::stream::{ChannelWriter, Chunk, DEFAULT_CHUNK};
use std::sync::Arc;
use std::time::Duration;

/// Put into every request's extensions. A handler that streams a large
/// body (a file or a workspace upload) calls [`BodyDeadline::per_frame`]:
/// from then on the body deadline counts from the last frame received, so a
/// long upload that keeps moving is never cut, and one that stalls is.
#[derive(Debug, Clone, Default)]
pub struct BodyDeadline(Arc<AtomicBool>);

impl BodyDeadline {
    /// Counts the body deadline from the last frame instead of the head.
    pub fn per_frame(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the deadline counts from the last frame.
    pub fn counts_per_frame(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The error a request body reports when it did not arrive in time; the JSON
/// extractor answers it with 408.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// Chunks in flight between a blocking producer and a response body.
const STREAM_DEPTH: usize = 8;

/// A response body fed by `produce` writing on the blocking pool, through a
/// channel of [`STREAM_DEPTH`] chunks: a client that reads slowly holds
/// the producer back, never the broker's memory. An error ends the body
/// with an error (the client sees a broken transfer, never a short file,
/// archive or answer that looks whole).
pub(crate) fn stream_from(
    produce: impl FnOnce(&mut ChannelWriter) -> std::io::Result<()> + Send + 'static,
) -> axum::body::Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(STREAM_DEPTH);
    tokio::task::spawn_blocking(move || {
        let mut writer = ChannelWriter::new(tx, DEFAULT_CHUNK);
        match produce(&mut writer) {
            Ok(()) => {
                let _ = writer.finish();
            }
            Err(e) => writer.fail(e),
        }
    });
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (chunk.map(axum::body::Bytes::from), rx))
    });
    axum::body::Body::from_stream(chunks)
}
