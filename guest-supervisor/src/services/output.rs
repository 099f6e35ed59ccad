//! What services write: bounded lines into the log, and a short tail kept
//! for classifying a failure.
//!
//! Owns reading a service's stdout/stderr pipes line by line with a bound on
//! line length (a service that writes one endless line must not grow the
//! supervisor), forwarding each line to `tracing`, and keeping the last few
//! lines. It never interprets them; [`super::restart::classify`] does.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt as _};

/// Longest line kept; the rest of a longer line is dropped.
pub const MAX_LINE: usize = 1024;

/// Lines kept for classification.
const TAIL_LINES: usize = 40;

/// Reads lines of at most [`MAX_LINE`] bytes.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    /// Dropping the rest of an overlong line until its newline.
    skipping: bool,
    eof: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// Wraps a pipe.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: Vec::with_capacity(256),
            start: 0,
            skipping: false,
            eof: false,
        }
    }

    /// The next line without its newline (lossy UTF-8), or `None` at end of
    /// stream. Cancel-safe: bytes read stay buffered.
    pub async fn next_line(&mut self) -> std::io::Result<Option<String>> {
        loop {
            if let Some(pos) = self.buf[self.start..].iter().position(|&b| b == b'\n') {
                let end = self.start + pos;
                let line = if self.skipping {
                    self.skipping = false;
                    None
                } else {
                    Some(String::from_utf8_lossy(&self.buf[self.start..end]).into_owned())
                };
                self.start = end + 1;
                if let Some(line) = line {
                    return Ok(Some(line));
                }
                continue;
            }
            // No newline in what is buffered.
            let pending = self.buf.len() - self.start;
            if pending >= MAX_LINE && !self.skipping {
                let line = String::from_utf8_lossy(&self.buf[self.start..self.start + MAX_LINE])
                    .into_owned();
                self.buf.clear();
                self.start = 0;
                self.skipping = true;
                return Ok(Some(line));
            }
            if self.skipping {
                self.buf.clear();
                self.start = 0;
            } else if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            if self.eof {
                if self.buf.is_empty() || self.skipping {
                    return Ok(None);
                }
                let line = String::from_utf8_lossy(&self.buf).into_owned();
                self.buf.clear();
                return Ok(Some(line));
            }
            let mut chunk = [0u8; 512];
            let n = self.inner.read(&mut chunk).await?;
            if n == 0 {
                self.eof = true;
            } else {
                self.buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

/// The last lines a service wrote, shared between its forwarders and its
/// supervisor.
#[derive(Debug, Clone, Default)]
pub struct Tail(Arc<Mutex<VecDeque<String>>>);

impl Tail {
    /// Keeps `line`, dropping the oldest beyond the limit.
    pub fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// Forwards every line of `reader` to the log as `service` output and into
/// `tail`, until the pipe closes (when the service and all its children
/// that inherited it are gone).
pub async fn forward<R: AsyncRead + Unpin>(
    service: &'static str,
    mut reader: LineReader<R>,
    tail: Tail,
) {
    loop {
        match reader.next_line().await {
            Ok(Some(line)) => {
                if !line.trim().is_empty() {
                    tracing::info!(target: "service", service, "{line}");
                }
                tail.push(line);
            }
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(service, error = %e, "output pipe failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_and_bounded() {
        let mut input = b"first\nsecond\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 3000));
        input.extend(b"\nlast without newline");
        let mut reader = LineReader::new(&input[..]);
        assert_eq!(
            reader.next_line().await.expect("read").as_deref(),
            Some("first")
        );
        assert_eq!(
            reader.next_line().await.expect("read").as_deref(),
            Some("second")
        );
        let long = reader.next_line().await.expect("read").expect("line");
        assert_eq!(long.len(), MAX_LINE);
        assert_eq!(
            reader.next_line().await.expect("read").as_deref(),
            Some("last without newline")
        );
        assert_eq!(reader.next_line().await.expect("read"), None);
    }

    #[test]
    fn tail_keeps_the_newest() {
        let tail = Tail::default();
        for n in 0..100 {
            tail.push(n.to_string());
        }
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines.last().map(String::as_str), Some("99"));
    }
}
