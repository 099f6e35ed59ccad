//! Capturing one output stream of an exec, up to a cap.
//!
//! Owns the read loop of a pipe: it keeps what fits under the cap and reads
//! and discards the rest, so the writer never blocks on a full pipe however
//! much it writes. It never writes to the pipe and never decides when the
//! exec ends; its owner stops it.

use std::os::fd::OwnedFd;

use tokio::io::AsyncReadExt as _;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// Size of one read.
const CHUNK: usize = 64 * 1024;

/// What one stream gave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Captured {
    /// The first bytes, at most the cap.
    pub(crate) bytes: Vec<u8>,
    /// Whether more came than the cap.
    pub(crate) truncated: bool,
}

/// Reads `fd` (the read end of a pipe) until its end or until `stop`
/// fires (or is dropped), keeping at most `cap` bytes.
pub(crate) async fn capture(
    fd: OwnedFd,
    cap: usize,
    mut stop: oneshot::Receiver<()>,
) -> std::io::Result<Captured> {
    let mut pipe = pipe::Receiver::from_owned_fd(fd)?;
    let mut out = Captured::default();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = tokio::select! {
            // The stop first: a writer that never pauses must not keep the
            // stop from being seen.
            biased;
            _ = &mut stop => return Ok(out),
            read = pipe.read(&mut buf) => read?,
        };
        if n == 0 {
            return Ok(out);
        }
        let room = cap.saturating_sub(out.bytes.len());
        let keep = n.min(room);
        out.bytes
            .extend_from_slice(buf.get(..keep).unwrap_or_default());
        if keep < n {
            out.truncated = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[tokio::test]
    async fn keeps_the_cap_reads_the_rest_and_stops_on_request() {
        let (rx, tx) = std::io::pipe().expect("pipe");
        let writer = std::thread::spawn(move || {
            let mut tx = tx;
            // Far more than a pipe buffer: the writer finishes only if the
            // reader keeps reading past the cap.
            for _ in 0..64 {
                tx.write_all(&[7u8; 16 * 1024]).expect("write");
            }
        });
        let (_keep, stop) = oneshot::channel();
        let got = capture(OwnedFd::from(rx), 1000, stop).await.expect("read");
        writer.join().expect("writer");
        assert_eq!(got.bytes, vec![7u8; 1000]);
        assert!(got.truncated);

        let (rx, tx) = std::io::pipe().expect("pipe");
        let (stop_tx, stop) = oneshot::channel();
        let task = tokio::spawn(capture(OwnedFd::from(rx), 10, stop));
        (&tx).write_all(b"abc").expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        stop_tx.send(()).expect("send");
        let got = task.await.expect("join").expect("read");
        assert_eq!(got.bytes, b"abc");
        assert!(!got.truncated);
        drop(tx);
    }
}
