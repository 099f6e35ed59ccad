//! Blocking ends of a tokio channel, so the blocking export and import can
//! be joined to an async HTTP body: the export writes into a
//! [`ChannelWriter`] on a blocking thread while the handler streams the
//! receiver as the response body; the handler feeds the request body into
//! a sender while the import reads a [`ChannelReader`].
//!
//! Both ends must only be used on a blocking thread (`spawn_blocking`),
//! never on an async task: they block it.

use std::io::{self, Read, Write};

use tokio::sync::mpsc;

/// A chunk of a stream, or the error that ends it.
pub type Chunk = Result<Vec<u8>, io::Error>;

/// Default chunk size of a [`ChannelWriter`].
pub const DEFAULT_CHUNK: usize = 256 * 1024;

/// A `Write` that sends what it is given in chunks on a channel. When the
/// receiver is gone (the client went away) writes fail with `BrokenPipe`,
/// which stops the export.
#[derive(Debug)]
pub struct ChannelWriter {
    tx: mpsc::Sender<Chunk>,
    buf: Vec<u8>,
    chunk: usize,
}

impl ChannelWriter {
    /// Sends chunks of about `chunk` bytes (at least 1) on `tx`.
    pub fn new(tx: mpsc::Sender<Chunk>, chunk: usize) -> Self {
        let chunk = chunk.max(1);
        Self {
            tx,
            buf: Vec::with_capacity(chunk),
            chunk,
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(self.chunk));
        self.tx
            .blocking_send(Ok(full))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the receiver is gone"))
    }

    /// Sends what is buffered; the stream then ends cleanly when `self`
    /// is dropped.
    pub fn finish(mut self) -> io::Result<()> {
        self.send()
    }

    /// Ends the stream with `error` instead of a clean end, so the body is
    /// aborted and the client sees a broken transfer, not a short archive.
    pub fn fail(self, error: io::Error) {
        // What is buffered is dropped: the stream is broken anyway.
        let _ = self.tx.blocking_send(Err(error));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = self.chunk - self.buf.len().min(self.chunk);
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= self.chunk {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// A `Read` over chunks received from a channel. The stream ends when every
/// sender is gone; an `Err` chunk is returned as the read's error (a broken
/// upload makes the import refuse the archive as truncated).
#[derive(Debug)]
pub struct ChannelReader {
    rx: mpsc::Receiver<Chunk>,
    cur: Vec<u8>,
    pos: usize,
}

impl ChannelReader {
    /// Reads what arrives on `rx`.
    pub fn new(rx: mpsc::Receiver<Chunk>) -> Self {
        Self {
            rx,
            cur: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        while self.pos >= self.cur.len() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.cur = chunk;
                    self.pos = 0;
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = (self.cur.len() - self.pos).min(out.len());
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pass_through_in_chunks_and_errors_end_the_stream() {
        let (tx, rx) = mpsc::channel(4);
        let writer = std::thread::spawn(move || {
            let mut w = ChannelWriter::new(tx, 1000);
            for i in 0..100u8 {
                w.write_all(&[i; 333]).unwrap();
            }
            w.finish().unwrap();
        });
        let mut got = Vec::new();
        ChannelReader::new(rx).read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got.len(), 33_300);
        assert!(got
            .chunks(333)
            .enumerate()
            .all(|(i, c)| c.iter().all(|b| usize::from(*b) == i)));

        let (tx, rx) = mpsc::channel(4);
        std::thread::spawn(move || {
            let mut w = ChannelWriter::new(tx, 10);
            w.write_all(b"0123456789abc").unwrap();
            w.fail(io::Error::other("disk gone"));
        });
        let mut got = Vec::new();
        let err = ChannelReader::new(rx).read_to_end(&mut got).unwrap_err();
        assert_eq!(err.to_string(), "disk gone");
    }

    #[test]
    fn a_gone_receiver_breaks_the_writer() {
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let mut w = ChannelWriter::new(tx, 4);
        let err = w.write_all(b"12345678").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
