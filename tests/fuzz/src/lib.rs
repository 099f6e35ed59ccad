//! Helpers shared by the fuzz targets in `fuzz_targets/`: one tokio
//! runtime per process, a reader that hands its bytes out in the chunks the
//! input asks for, and the splitting of one input into parts.

use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// A current-thread runtime with time, built once per process.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap_or_else(|e| panic!("a tokio runtime: {e}"))
    })
}

/// Splits `data` at the first `sep`: the part before and the rest after
/// it (all of `data` and nothing when `sep` is absent).
pub fn split_at_byte(data: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == sep) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Chunk sizes (1 to 256) from `seed`'s bytes, cycled; one chunk of
/// everything when `seed` is empty.
pub fn chunks<'a>(data: &'a [u8], seed: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    let mut i = 0;
    while !rest.is_empty() {
        let size = if seed.is_empty() {
            rest.len()
        } else {
            usize::from(seed[i % seed.len()]) + 1
        };
        let (head, tail) = rest.split_at(size.min(rest.len()));
        out.push(head);
        rest = tail;
        i += 1;
    }
    out
}

/// An async reader that returns its bytes in the given chunks (one read
/// never crosses a chunk), then end of stream.
#[derive(Debug)]
pub struct ChunkedReader<'a> {
    chunks: Vec<&'a [u8]>,
    next: usize,
    at: usize,
}

impl<'a> ChunkedReader<'a> {
    /// Reads `data` in chunks whose sizes come from `seed`.
    pub fn new(data: &'a [u8], seed: &[u8]) -> Self {
        Self {
            chunks: chunks(data, seed),
            next: 0,
            at: 0,
        }
    }
}

impl AsyncRead for ChunkedReader<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        while let Some(chunk) = this.chunks.get(this.next) {
            let left = &chunk[this.at..];
            if left.is_empty() {
                this.next += 1;
                this.at = 0;
                continue;
            }
            let n = left.len().min(buf.remaining());
            buf.put_slice(&left[..n]);
            this.at += n;
            break;
        }
        Poll::Ready(Ok(()))
    }
}
