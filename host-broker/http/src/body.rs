//! The request-body deadline as the handlers see it: the marker a handler
//! sets to count the deadline per frame, and the error a late body reports.
//! The server ([`crate::daemon::serve`]) enforces the deadline; this module
//! only names it, so the handlers need nothing from the daemon.

use std::sync::atomic::{AtomicBool, Ordering};
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
