//! The byte pipe of an egress connection between two sockets, moved by
//! `splice(2)` through a kernel pipe per direction: past a connection's
//! first bytes, a download never enters either process, which matters on
//! a relay that carries it three sockets deep (site, broker, supervisor,
//! program).
//!
//! Each direction starts by copying through a small buffer, and moves to
//! its own pipe once it has carried [`SPLICE_AFTER`] bytes: a connection
//! that carries little (most of them, and every one of a flood held open
//! without traffic) costs two descriptors, a download four more. The pipe
//! is filled from one socket as far as the socket has bytes, then drained
//! into the other; readiness comes from the runtime's own registration of
//! each socket, so no descriptor is registered twice. The end of one
//! side's stream shuts down the write side of the other and the other
//! direction goes on; the first error ends both.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::sys::socket::{send, shutdown, MsgFlags, Shutdown};
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// Bytes one splice call asks for; also the size each pipe is set to
/// (the default pipe is kept when the kernel refuses the size, which only
/// costs more calls).
pub const SPLICE_CHUNK: usize = 256 * 1024;
/// Bytes a direction copies through its buffer before it takes a pipe.
pub const SPLICE_AFTER: usize = 256 * 1024;
/// The copy buffer of a direction before it takes a pipe.
const COPY_CHUNK: usize = 16 * 1024;

/// A connected stream socket whose readiness the runtime tracks.
pub trait SpliceSocket: AsFd + Sync {
    /// Waits until the runtime sees the socket ready for `interest`.
    fn ready_for(&self, interest: Interest) -> impl Future<Output = io::Result<()>> + Send;
    /// Runs `f` as the runtime's readiness-clearing I/O for `interest`.
    fn try_io_for<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>)
        -> io::Result<R>;
}

macro_rules! splice_socket {
    ($t:ty) => {
        impl SpliceSocket for $t {
            async fn ready_for(&self, interest: Interest) -> io::Result<()> {
                self.ready(interest).await.map(drop)
            }
            fn try_io_for<R>(
                &self,
                interest: Interest,
                f: impl FnOnce() -> io::Result<R>,
            ) -> io::Result<R> {
                self.try_io(interest, f)
            }
        }
    };
}

splice_socket!(TcpStream);
splice_socket!(UnixStream);

/// Relays bytes both ways between `a` and `b` until both directions ended
/// or one failed, counting each direction as it moves (`a_to_b`, `b_to_a`)
/// so that a watcher sees progress while it runs.
pub async fn relay<A: SpliceSocket, B: SpliceSocket>(
    a: &A,
    b: &B,
    a_to_b: &AtomicU64,
    b_to_a: &AtomicU64,
) -> io::Result<()> {
    tokio::try_join!(one_way(a, b, a_to_b), one_way(b, a, b_to_a)).map(drop)
}

/// One direction, to the end of `from`'s stream.
async fn one_way<F: SpliceSocket, T: SpliceSocket>(
    from: &F,
    to: &T,
    moved: &AtomicU64,
) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut copied = 0;
    while copied < SPLICE_AFTER {
        let got = when_ready(from, Interest::READABLE, || {
            Ok(nix::unistd::read(from.as_fd(), &mut buf)?)
        })
        .await?;
        if got == 0 {
            end_of(to);
            return Ok(());
        }
        let mut sent = 0;
        while sent < got {
            let put = when_ready(to, Interest::WRITABLE, || {
                let fd = to.as_fd().as_raw_fd();
                Ok(send(fd, &buf[sent..got], MsgFlags::MSG_NOSIGNAL)?)
            })
            .await?;
            sent += nonzero(put)?;
            count(moved, put);
        }
        copied += got;
    }
    drop(buf);
    let (out, inp) = pipe()?;
    loop {
        let got = when_ready(from, Interest::READABLE, || {
            Ok(splice(
                from.as_fd(),
                None,
                &inp,
                None,
                SPLICE_CHUNK,
                flags(),
            )?)
        })
        .await?;
        if got == 0 {
            end_of(to);
            return Ok(());
        }
        let mut left = got;
        while left > 0 {
            let put = when_ready(to, Interest::WRITABLE, || {
                Ok(splice(&out, None, to.as_fd(), None, left, flags())?)
            })
            .await?;
            left -= nonzero(put)?;
            count(moved, put);
        }
    }
}

/// The end of the stream read: shuts down the write side of `to` (gone
/// already is as good as shut down).
fn end_of<T: SpliceSocket>(to: &T) {
    let _ = shutdown(to.as_fd().as_raw_fd(), Shutdown::Write);
}

fn count(moved: &AtomicU64, n: usize) {
    moved.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// A write that took nothing is an error, not a reason to spin.
fn nonzero(put: usize) -> io::Result<usize> {
    if put == 0 {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "the socket took no bytes",
        ));
    }
    Ok(put)
}

/// Runs `call` once `socket` is ready for `interest`, again after each
/// spurious wake-up.
async fn when_ready<S: SpliceSocket>(
    socket: &S,
    interest: Interest,
    mut call: impl FnMut() -> io::Result<usize>,
) -> io::Result<usize> {
    loop {
        socket.ready_for(interest).await?;
        match socket.try_io_for(interest, &mut call) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            done => return done,
        }
    }
}

/// The pipe never blocks: the socket's readiness is what is waited on, and
/// the pipe is always drained before it is filled again.
fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
}

/// A non-blocking pipe of [`SPLICE_CHUNK`] where the kernel allows it:
/// (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (out, inp) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
    let size = i32::try_from(SPLICE_CHUNK).unwrap_or(i32::MAX);
    // Refused past the user's pipe budget: the default size still works.
    let _ = fcntl(&inp, FcntlArg::F_SETPIPE_SZ(size));
    Ok((out, inp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A TCP pair on loopback: (connecting end, accepted end).
    async fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    #[tokio::test]
    async fn carries_both_ways_in_order_and_half_closes() {
        // program ⇄ (tcp) relay ⇄ (unix) far end; the download goes past
        // SPLICE_AFTER (copied, then spliced), the request stays copied.
        let (mut program, near) = tcp_pair().await;
        let (relay_far, mut far) = UnixStream::pair().unwrap();
        let up = AtomicU64::new(0);
        let down = AtomicU64::new(0);
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let feeder = tokio::spawn(async move {
            far.write_all(&sent).await.unwrap();
            far.shutdown().await.unwrap();
            let mut back = Vec::new();
            far.read_to_end(&mut back).await.unwrap();
            back
        });
        let relayed = async {
            relay(&near, &relay_far, &up, &down).await.unwrap();
        };
        let program_side = async {
            program.write_all(b"hello from the program").await.unwrap();
            program.shutdown().await.unwrap();
            let mut got = Vec::new();
            program.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::join!(relayed, program_side);
        assert_eq!(got, big, "the download arrives whole and in order");
        assert_eq!(feeder.await.unwrap(), b"hello from the program");
        assert_eq!(up.load(Ordering::Relaxed), 22);
        assert_eq!(down.load(Ordering::Relaxed), 3_000_000);
    }

    #[tokio::test]
    async fn a_far_end_gone_ends_the_relay_with_an_error() {
        let (mut program, near) = tcp_pair().await;
        let (relay_far, far) = UnixStream::pair().unwrap();
        drop(far);
        let up = AtomicU64::new(0);
        let down = AtomicU64::new(0);
        program.write_all(b"into nowhere").await.unwrap();
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            relay(&near, &relay_far, &up, &down),
        )
        .await
        .expect("the relay ends");
        let e = r.expect_err("writing to a closed peer fails");
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
        assert_eq!(up.load(Ordering::Relaxed), 0);
    }
}
